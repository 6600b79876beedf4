//! The architecture rule of DESIGN.md: the pure crates never depend on an async runtime, a
//! network stack or any other IO, and never reach for the clock, the environment or threads.
//!
//! Two checks: the resolved dependency graph (through `cargo tree`, normal dependencies, every
//! target platform) holds only crates on a short allow-list, and the sources name no IO or
//! ambient-state module of `std`. Growing the allow-list is an architecture decision.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The crates that must stay pure, each with what it may depend on directly.
const PURE_CRATES: &[(&str, &[&str])] = &[
    ("topology", &["blake3", "thiserror"]),
    ("shardtable", &["topology", "blake3", "thiserror"]),
    (
        "cluster",
        &[
            "topology",
            "shardtable",
            "foca",
            "postcard",
            "serde",
            "rand",
            "bytes",
            "blake3",
            "xxhash-rust",
            "thiserror",
            "tracing",
        ],
    ),
];

/// Everything a pure crate may pull in, directly or not: the workspace's pure crates, hashing
/// (blake3; xxhash-rust's xxh3 for `cluster`'s running state digests),
/// the error derive, and for `cluster` foca with its seeded RNG (`rand` without `getrandom`),
/// serde/postcard and tracing's macros. `libc` comes only through `cpufeatures`, blake3's CPU
/// feature detection on some platforms; a pure crate naming it directly fails its direct list.
const ALLOWED: &[&str] = &[
    "topology",
    "shardtable",
    "cluster",
    "foca",
    "rand",
    "rand_core",
    "chacha20",
    "postcard",
    "cobs",
    "heapless",
    "hash32",
    "byteorder",
    "stable_deref_trait",
    "atomic-polyfill",
    "critical-section",
    "spin",
    "lock_api",
    "scopeguard",
    "once_cell",
    "serde",
    "serde_core",
    "serde_derive",
    "bytes",
    "tracing",
    "tracing-core",
    "tracing-attributes",
    "pin-project-lite",
    "blake3",
    "xxhash-rust",
    "libc",
    "arrayref",
    "arrayvec",
    "cfg-if",
    "constant_time_eq",
    "cpufeatures",
    "thiserror",
    "thiserror-impl",
    "proc-macro2",
    "quote",
    "syn",
    "unicode-ident",
];

/// Crates that would make a pure crate do IO; named so a failure says what went wrong.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "quinn",
    "quinn-proto",
    "quinn-udp",
    "mio",
    "socket2",
    "async-std",
    "smol",
    "futures",
    "rustls",
    "redb",
    "getrandom",
    "tracing-subscriber",
];

/// `std` paths that mean IO, clocks, threads or ambient state.
const FORBIDDEN_STD: &[&str] = &[
    "std::net",
    "std::fs",
    "std::io",
    "std::time",
    "std::thread",
    "std::process",
    "std::env",
    "SystemTime",
    "Instant::now",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The names of `krate` and everything it depends on through `edges` (`cargo tree --edges`),
/// down to `depth` levels, on every target platform.
fn dependencies_of(krate: &str, edges: &str, depth: Option<u32>) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .current_dir(workspace_root())
        .args(["tree", "--locked", "--prefix", "none", "--edges", edges])
        .args(["--target", "all", "--format", "{p}", "--package", krate]);
    if let Some(depth) = depth {
        command.args(["--depth", &depth.to_string()]);
    }
    let output = command.output().expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut names: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The crate names in `names` that `keep` accepts.
fn names_where(names: &[String], keep: impl Fn(&str) -> bool) -> Vec<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|name| keep(name))
        .collect()
}

#[test]
fn pure_crates_depend_only_on_allowed_crates() {
    for &(krate, direct_allowed) in PURE_CRATES {
        let direct = dependencies_of(krate, "normal", Some(1));
        let unexpected = names_where(&direct, |name| {
            name != krate && !direct_allowed.contains(&name)
        });
        assert!(
            unexpected.is_empty(),
            "{krate} depends directly on {unexpected:?}"
        );

        let dependencies = dependencies_of(krate, "normal", None);
        assert!(
            dependencies.iter().any(|name| name == krate),
            "cargo tree listed {dependencies:?}"
        );
        let forbidden = names_where(&dependencies, |name| FORBIDDEN.contains(&name));
        assert!(
            forbidden.is_empty(),
            "{krate} depends on IO crates {forbidden:?}"
        );
        let unexpected = names_where(&dependencies, |name| !ALLOWED.contains(&name));
        assert!(
            unexpected.is_empty(),
            "{krate} depends on {unexpected:?}, which is not on the pure-crate allow-list; \
             if it really does no IO, add it to ALLOWED in {}",
            file!()
        );
    }
}

#[test]
fn pure_crate_sources_use_no_io_from_std() {
    for &(krate, _) in PURE_CRATES {
        let mut offenders = Vec::new();
        visit_rust_files(
            &workspace_root().join(krate).join("src"),
            &mut |path, text| {
                for (number, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap_or_default();
                    for needle in FORBIDDEN_STD {
                        if code.contains(needle) {
                            offenders.push(format!("{}:{}: {needle}", path.display(), number + 1));
                        }
                    }
                }
            },
        );
        assert!(
            offenders.is_empty(),
            "{krate} touches IO or ambient state:\n{}",
            offenders.join("\n")
        );
    }
}

#[test]
fn the_rule_would_catch_a_forbidden_dependency() {
    // The check is only as good as what `cargo tree` reports: the dev-dependencies (proptest,
    // criterion) do pull in forbidden crates, and must be seen when dev edges are included.
    let with_dev = dependencies_of("shardtable", "normal,dev", None);
    assert!(
        with_dev
            .iter()
            .any(|name| FORBIDDEN.contains(&name.as_str())),
        "{with_dev:?}"
    );
}

fn visit_rust_files(dir: &Path, visit: &mut dyn FnMut(&Path, &str)) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            visit_rust_files(&path, visit);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            visit(&path, &std::fs::read_to_string(&path).unwrap());
        }
    }
}
