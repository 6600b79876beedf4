//! A network namespace of the test's own, where it may change the network without touching the
//! host's.
//!
//! [`Netns::create`] makes `slotring-part-<pid>-<n>` with only its own `lo` (up, holding
//! 127.0.0.1/8); a cluster launched in it ([`crate::harness::Cluster::launch_in`]) runs its
//! nodes and the test's CLI calls there through `ip netns exec`, and [`Netns::nft`] loads
//! nftables rules into it. Dropping it deletes the namespace, and with it every rule: the
//! cluster that owns it deletes it after killing its nodes, also when the test panics.
//!
//! What it does not do: it never runs a command in the host's namespace other than `ip netns
//! add` and `ip netns del` of its own name, and never names an address outside 127.0.0.0/8. It
//! does not install `ip` or `nft` (`scripts/test.sh` does): without them, or without the
//! privilege to make a namespace, [`Netns::create`] panics saying so, and the test fails rather
//! than passing without a partition.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// A network namespace this process created; deleted on drop.
#[derive(Debug)]
pub(crate) struct Netns {
    name: String,
}

impl Netns {
    /// Creates `slotring-part-<pid>-<n>`, brings its `lo` up and checks that `nft` works in it.
    ///
    /// # Panics
    ///
    /// If any of that fails (not root, no `ip`, no `nft`, no nf_tables in the kernel), with
    /// what failed and how to get it.
    pub(crate) fn create() -> Netns {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "slotring-part-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let added = run_ip(&["netns", "add", &name]);
        assert!(
            added.status.success(),
            "cannot create the network namespace {name}: `ip netns add` {}: {}\n\
             The partition test needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2 and \
             nftables; scripts/test.sh installs the packages.",
            added.status,
            String::from_utf8_lossy(&added.stderr).trim()
        );
        // From here on the namespace is ours: dropping `netns` deletes it, panic or not.
        let netns = Netns { name };
        let up = run_ip(&["-n", &netns.name, "link", "set", "lo", "up"]);
        assert!(
            up.status.success(),
            "cannot bring lo up in {}: {}",
            netns.name,
            String::from_utf8_lossy(&up.stderr).trim()
        );
        netns.nft("list ruleset");
        netns
    }

    /// The namespace's name, for `ip netns exec`.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `nft -f -` with `script` inside the namespace and returns what it printed.
    ///
    /// # Panics
    ///
    /// If `nft` cannot run or rejects the script.
    pub(crate) fn nft(&self, script: &str) -> String {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot run `ip netns exec {} nft`: {error}", self.name)
            });
        child
            .stdin
            .take()
            .expect("a piped stdin")
            .write_all(script.as_bytes())
            .expect("write the nft script");
        let output = child.wait_with_output().expect("wait for nft");
        assert!(
            output.status.success(),
            "`nft -f -` in {} failed with {}: {}\n\
             (is nftables installed? scripts/test.sh installs it)\nscript:\n{script}",
            self.name,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // No panic here: this may run while a failed test unwinds.
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .output();
        match deleted {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!(
                "could not delete the network namespace {} (`ip netns del` {}: {}); delete it \
                 by hand",
                self.name,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            Err(error) => eprintln!(
                "could not run `ip netns del {}` ({error}); delete the namespace by hand",
                self.name
            ),
        }
    }
}

/// Runs `ip ARGS` and waits for it.
///
/// # Panics
///
/// If `ip` cannot run.
fn run_ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run `ip {}`: {error}; the partition test needs iproute2 (scripts/test.sh \
                 installs it)",
                args.join(" ")
            )
        })
}
