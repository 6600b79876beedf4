//! Starts real `node` processes on loopback and queries them through the `node` CLI.
//!
//! A [`Cluster`] owns a temporary directory (certificates, one data dir and one log file per
//! node) and the node processes it started. Dropping it SIGKILLs and reaps exactly those
//! children; after a panic it prints the tail of every node's log and keeps the directory.
//!
//! The harness never runs cargo (a test would deadlock on the build lock): the binary must be
//! built first, see [`node_binary`].
//!
//! A cluster may run inside a network namespace of the test's own ([`Cluster::launch_in`]):
//! its nodes and every CLI call then run under `ip netns exec`, which execs the command, so
//! the pids the harness holds are still the nodes' own.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::Read;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::netns::Netns;

/// How long one CLI call may take before it is killed.
const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// How often [`wait_until`] probes.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// How many log lines of each node a failing test prints.
const LOG_TAIL_LINES: usize = 50;
/// How long [`Cluster::launch`] waits for every node to see every other one alive.
pub(crate) const CONVERGE_WITHIN: Duration = Duration::from_secs(20);
/// How many clusters may run at once in this test binary unless `SLOTRING_TEST_CLUSTERS` says
/// otherwise: tests run in parallel threads, and on two cores more debug-build nodes than this
/// starve each other into false failure suspicions.
const DEFAULT_CONCURRENT_CLUSTERS: usize = 2;

/// The `node` binary under test: `SLOTRING_NODE_BIN`, else `target/debug/node` of this
/// workspace (under `CARGO_TARGET_DIR` when set).
///
/// # Panics
///
/// If the binary does not exist: build it first with `cargo build -p node`.
pub(crate) fn node_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let path = match std::env::var_os("SLOTRING_NODE_BIN") {
                Some(path) => PathBuf::from(path),
                None => {
                    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
                    let target = match std::env::var_os("CARGO_TARGET_DIR") {
                        Some(dir) => workspace.join(dir),
                        None => workspace.join("target"),
                    };
                    target.join("debug").join("node")
                }
            };
            assert!(
                path.is_file(),
                "build the node binary first: cargo build -p node (looked for {})",
                path.display()
            );
            path
        })
        .clone()
}

/// Polls `node check` on `cluster`'s node 0 until it passes (`"ok": true`), for at most
/// `within`.
pub(crate) fn wait_check_passes(cluster: &Cluster, within: Duration) {
    wait_until(within, "`node check` passes", || {
        let answer = cluster.try_query(0, &["check"])?;
        if answer["ok"] == true {
            Ok(())
        } else {
            Err(answer.to_string())
        }
    });
}

/// Polls `probe` every 50 ms until it returns `Ok`, for at most `within`.
///
/// `probe` returns `Err(observation)` while the condition does not hold yet; the last
/// observation is in the panic message when time runs out.
pub(crate) fn wait_until<T>(
    within: Duration,
    what: &str,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let observed = match probe() {
            Ok(value) => return value,
            Err(observed) => observed,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting until {what}; last observed: {observed}");
        }
        thread::sleep(POLL_EVERY);
    }
}

/// What a finished CLI call printed.
#[derive(Debug)]
pub(crate) struct CliOutput {
    /// The exit status.
    pub(crate) status: ExitStatus,
    /// Standard output.
    pub(crate) stdout: String,
    /// Standard error.
    pub(crate) stderr: String,
}

impl CliOutput {
    /// The output as JSON, or why not.
    pub(crate) fn json(&self) -> Result<Value, String> {
        if !self.status.success() {
            return Err(format!(
                "exited with {}: {}",
                self.status,
                self.stderr.trim()
            ));
        }
        serde_json::from_str(&self.stdout)
            .map_err(|error| format!("not JSON ({error}): {:?}", self.stdout))
    }
}

/// How the harness starts a process: directly or inside a network namespace, in the caller's
/// group or in another one (which nftables rules can match with `meta skgid`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Launcher {
    /// `ip netns exec NAME` before the binary, when set.
    netns: Option<String>,
    /// The group id of the process, when set.
    gid: Option<u32>,
}

impl Launcher {
    /// A command that runs `binary` as this launcher says, without the caller's `SLOTRING_*`
    /// variables (see [`hermetic`]).
    fn command(&self, binary: &Path) -> Command {
        let mut command = match &self.netns {
            Some(name) => {
                // `ip netns exec` execs `binary` (it forks only with `-b`): same pid.
                let mut command = Command::new("ip");
                command.args(["netns", "exec", name]).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        if let Some(gid) = self.gid {
            command.gid(gid);
        }
        hermetic(&mut command);
        command
    }
}

/// Runs `binary args` as `launcher` says, killing it if it takes more than [`CLI_TIMEOUT`].
///
/// Waits on the child's pipes rather than polling its status, so a 10 ms call is not stretched
/// by a polling period: a process has exited, or is about to, once both pipes reach their end.
fn run(launcher: &Launcher, binary: &Path, args: &[&str]) -> Result<CliOutput, String> {
    let mut command = launcher.command(binary);
    command.args(args);
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("cannot run {} ({launcher:?}): {error}", binary.display()))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + CLI_TIMEOUT;
    let remaining = || deadline.saturating_duration_since(Instant::now());
    let finished = stdout.recv_timeout(remaining()).and_then(|stdout| {
        let stderr = stderr.recv_timeout(remaining())?;
        Ok((stdout, stderr))
    });
    let status = match finished {
        Ok(_) => loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(1)),
                Ok(None) | Err(_) => break None,
            }
        },
        Err(_) => None,
    };
    match (finished, status) {
        (Ok((stdout, stderr)), Some(status)) => Ok(CliOutput {
            status,
            stdout,
            stderr,
        }),
        _ => {
            // Still our unreaped child, so the pid is still its own.
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "`node {}` hung for {CLI_TIMEOUT:?}",
                args.join(" ")
            ))
        }
    }
}

/// Reads a child's pipe to its end on a thread, so a chatty child never blocks on a full pipe;
/// the text arrives on the channel at the end.
fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        let _ = sender.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    receiver
}

/// Removes the `SLOTRING_*` variables of the caller's environment, so only the flags the
/// harness passes count, and asks for plain logs.
fn hermetic(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SLOTRING_") {
            command.env_remove(name);
        }
    }
    command.env("NO_COLOR", "1");
}

/// Where nodes' ports are picked: below Linux's default range of ephemeral ports (32768 to
/// 60999), so no socket bound to port 0 (a client's, in this process or another) is handed one
/// between the pick and the node's own bind. Picked from the ephemeral range, a port was
/// taken that way once and a node exited with "Address already in use".
const NODE_PORTS: std::ops::Range<u16> = 15_000..32_000;

/// `count` distinct free UDP ports on 127.0.0.1 from [`NODE_PORTS`], never handed out before
/// by this process. Each port is free when picked (a socket was bound to it and closed).
fn free_ports(count: usize) -> Vec<u16> {
    // The ports given out, and the next candidate (an offset into `NODE_PORTS`, starting at a
    // place that depends on the process, so test binaries run one after another start apart).
    static GIVEN: Mutex<Option<(HashSet<u16>, u32)>> = Mutex::new(None);
    let span = u32::from(NODE_PORTS.end - NODE_PORTS.start);
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    let (given, next) =
        given.get_or_insert_with(|| (HashSet::new(), std::process::id().wrapping_mul(97) % span));
    // Hold every socket until all are picked.
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..span {
        if ports.len() == count {
            break;
        }
        let port = NODE_PORTS.start + u16::try_from(*next % span).expect("within the range");
        *next = next.wrapping_add(1);
        if given.contains(&port) {
            continue;
        }
        if let Ok(socket) = UdpSocket::bind(("127.0.0.1", port)) {
            given.insert(port);
            ports.push(port);
            held.push(socket);
        }
    }
    assert_eq!(
        ports.len(),
        count,
        "no {count} free UDP ports left in {NODE_PORTS:?}"
    );
    ports
}

/// A unique fresh directory under the system temp dir.
fn fresh_temp_dir(label: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "slotring-it-{label}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).expect("create the test directory");
    dir
}

/// One of the [`DEFAULT_CONCURRENT_CLUSTERS`] places for a running cluster; released on drop.
#[derive(Debug)]
struct ClusterSlot;

static SLOTS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

impl ClusterSlot {
    fn acquire() -> ClusterSlot {
        let limit = std::env::var("SLOTRING_TEST_CLUSTERS")
            .ok()
            .and_then(|text| text.parse::<usize>().ok())
            .filter(|&limit| limit > 0)
            .unwrap_or(DEFAULT_CONCURRENT_CLUSTERS);
        let (running, freed) = &SLOTS;
        let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
        while *running >= limit {
            running = freed.wait(running).unwrap_or_else(PoisonError::into_inner);
        }
        *running += 1;
        ClusterSlot
    }
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        let (running, freed) = &SLOTS;
        *running.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        freed.notify_one();
    }
}

/// One node of a [`Cluster`]: its identity, its files and, while it runs, its process.
#[derive(Debug)]
pub(crate) struct Node {
    /// The node id, `n0`, `n1`, ...
    pub(crate) id: String,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Its `--data-dir`.
    pub(crate) data_dir: PathBuf,
    /// Its `--certs-dir`: the cluster's, unless the test gave it others.
    pub(crate) certs_dir: PathBuf,
    /// Where its stdout and stderr go, appended across restarts.
    pub(crate) log: PathBuf,
    /// Flags added to every start, such as `--shards 512`.
    pub(crate) extra_args: Vec<String>,
    /// The process while it is ours and not yet reaped.
    child: Option<Child>,
}

impl Node {
    /// The pid of the running process.
    ///
    /// # Panics
    ///
    /// If the node is not running (never started, or already reaped).
    pub(crate) fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.id))
            .id()
    }

    /// Whether the harness started this node and has not reaped it yet.
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process we started has exited without being reaped yet (a zombie), read
    /// from `/proc` so that waiting for readiness can fail fast without `&mut`. `false` where
    /// `/proc` is unavailable.
    fn has_exited(&self) -> bool {
        let Some(child) = &self.child else {
            return false;
        };
        fs::read_to_string(format!("/proc/{}/stat", child.id())).is_ok_and(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
        })
    }
}

/// Real node processes on loopback sharing one CA, in one temporary directory.
#[derive(Debug)]
pub(crate) struct Cluster {
    binary: PathBuf,
    dir: PathBuf,
    certs_dir: PathBuf,
    nodes: Vec<Node>,
    /// How nodes and CLI calls start.
    launcher: Launcher,
    /// The namespace the nodes run in, if not the caller's; a field, so it is deleted only
    /// after [`Cluster`]'s `drop` has killed and reaped the nodes in it.
    netns: Option<Netns>,
    _slot: ClusterSlot,
}

/// The shard count of [`Cluster::new`]'s clusters. Every shard replicates and heartbeats, and
/// up to five debug-built nodes share two cores here: with the default 1,024 shards, four nodes
/// joining at once make every shard add them as learners together, and that join burst starved
/// SWIM until members were declared down (moves are not rate-limited yet).
pub(crate) const DEFAULT_SHARDS: u16 = 64;
const DEFAULT_SHARDS_ARG: &str = "64";

impl Cluster {
    /// A cluster of `size` nodes `n0..`, started and converged: `n0` bootstraps, the others join
    /// it, and every node lists every other one as `alive`.
    pub(crate) fn launch(label: &str, size: usize) -> Cluster {
        let mut cluster = Cluster::new(label, size);
        cluster.start(0);
        cluster.wait_answering(0);
        for index in 1..size {
            cluster.start_joining(index, 0);
        }
        cluster.wait_converged(CONVERGE_WITHIN);
        cluster
    }

    /// [`Cluster::launch`] with `extra_args` added to every node's daemon flags, such as
    /// `["--shards", "16"]` (fewer shards heartbeat less, which keeps two cores idle enough).
    pub(crate) fn launch_with(label: &str, size: usize, extra_args: &[&str]) -> Cluster {
        Cluster::new_with(label, size, extra_args).boot()
    }

    /// [`Cluster::launch_with`] inside `netns`: the nodes, and every CLI call made through the
    /// cluster or its [`Client`]s, run there. The cluster owns the namespace and deletes it
    /// after killing its nodes.
    pub(crate) fn launch_in(
        netns: Netns,
        label: &str,
        size: usize,
        extra_args: &[&str],
    ) -> Cluster {
        let mut cluster = Cluster::new_with(label, size, extra_args);
        cluster.launcher.netns = Some(netns.name().to_owned());
        cluster.netns = Some(netns);
        cluster.boot()
    }

    /// Starts every node of a new cluster: the first bootstraps, the others join it; waits
    /// until they converge.
    fn boot(mut self) -> Cluster {
        self.start(0);
        self.wait_answering(0);
        for index in 1..self.nodes.len() {
            self.start_joining(index, 0);
        }
        self.wait_converged(CONVERGE_WITHIN);
        self
    }

    /// A cluster of `size` nodes `n0..` with certificates and ports, none started, with
    /// [`DEFAULT_SHARDS`] shards.
    pub(crate) fn new(label: &str, size: usize) -> Cluster {
        Cluster::new_with(label, size, &["--shards", DEFAULT_SHARDS_ARG])
    }

    /// [`Cluster::new`] with `extra_args` added to every node's daemon flags.
    pub(crate) fn new_with(label: &str, size: usize, extra_args: &[&str]) -> Cluster {
        let binary = node_binary();
        let slot = ClusterSlot::acquire();
        let dir = fresh_temp_dir(label);
        let certs_dir = dir.join("certs");
        let mut cluster = Cluster {
            binary,
            dir,
            certs_dir: certs_dir.clone(),
            nodes: Vec::new(),
            launcher: Launcher::default(),
            netns: None,
            _slot: slot,
        };
        cluster.certs(&["init", "--certs-dir", path_str(&certs_dir)]);
        for _ in 0..size {
            let id = format!("n{}", cluster.nodes.len());
            cluster.add_node(&id, None, extra_args);
        }
        cluster
    }

    /// Adds a node, not started. Its certificate is issued by the cluster's CA, unless
    /// `certs_dir` names another directory, which must already hold `ID.crt`.
    pub(crate) fn add_node(
        &mut self,
        id: &str,
        certs_dir: Option<PathBuf>,
        extra_args: &[&str],
    ) -> usize {
        let certs_dir = match certs_dir {
            Some(dir) => dir,
            None => {
                let certs = self.certs_dir.clone();
                self.certs(&["issue", id, "--certs-dir", path_str(&certs)]);
                certs
            }
        };
        let port = free_ports(1)[0];
        let data_dir = self.dir.join(id);
        fs::create_dir_all(&data_dir).expect("create a data dir");
        self.nodes.push(Node {
            id: id.to_owned(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            data_dir,
            certs_dir,
            log: self.dir.join(format!("{id}.log")),
            extra_args: extra_args.iter().map(|&arg| arg.to_owned()).collect(),
            child: None,
        });
        self.nodes.len() - 1
    }

    /// Makes a CA of its own under the cluster's directory, as a second `certs init` would, and
    /// issues `ids` with it; returns the directory.
    pub(crate) fn foreign_certs(&self, name: &str, ids: &[&str]) -> PathBuf {
        let dir = self.dir.join(name);
        self.certs(&["init", "--certs-dir", path_str(&dir)]);
        for id in ids {
            self.certs(&["issue", id, "--certs-dir", path_str(&dir)]);
        }
        dir
    }

    fn certs(&self, args: &[&str]) {
        let mut full = vec!["certs"];
        full.extend_from_slice(args);
        // Certificates are files: made outside any namespace.
        let output = run(&Launcher::default(), &self.binary, &full)
            .unwrap_or_else(|error| panic!("{error}"));
        assert!(
            output.status.success(),
            "`node {}` failed with {}: {}",
            full.join(" "),
            output.status,
            output.stderr
        );
    }

    /// The nodes, started or not.
    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `index`.
    pub(crate) fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

    /// The index of the node called `id`.
    ///
    /// # Panics
    ///
    /// If there is none.
    pub(crate) fn index_of(&self, id: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| node.id == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// The network namespace the nodes run in, if the cluster has one ([`Cluster::launch_in`]).
    pub(crate) fn netns(&self) -> Option<&Netns> {
        self.netns.as_ref()
    }

    /// The `node` binary the cluster runs.
    pub(crate) fn binary(&self) -> &Path {
        &self.binary
    }

    /// Indices of the nodes the harness started and has not reaped.
    pub(crate) fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&index| self.nodes[index].is_running())
            .collect()
    }

    /// Starts node `index` as the bootstrapping node.
    pub(crate) fn start(&mut self, index: usize) {
        self.spawn(index, None);
    }

    /// Starts node `index`, joining through node `seed`.
    pub(crate) fn start_joining(&mut self, index: usize, seed: usize) {
        let seed = self.nodes[seed].addr;
        self.spawn(index, Some(seed));
    }

    /// Starts node `index` again with its data dir and flags, joining through the first other
    /// running node.
    pub(crate) fn restart(&mut self, index: usize) {
        assert!(
            !self.nodes[index].is_running(),
            "{} still runs",
            self.nodes[index].id
        );
        let seed = self
            .running()
            .into_iter()
            .find(|&other| other != index)
            .expect("another running node to join through");
        self.start_joining(index, seed);
    }

    fn spawn(&mut self, index: usize, join: Option<SocketAddr>) {
        let binary = self.binary.clone();
        let node = &mut self.nodes[index];
        assert!(!node.is_running(), "{} already runs", node.id);
        let addr = node.addr.to_string();
        let mut args: Vec<String> = vec![
            "--listen".into(),
            addr,
            "--node-id".into(),
            node.id.clone(),
            "--data-dir".into(),
            path_str(&node.data_dir).into(),
            "--certs-dir".into(),
            path_str(&node.certs_dir).into(),
        ];
        if let Some(seed) = join {
            args.push("--join".into());
            args.push(seed.to_string());
        }
        args.extend(node.extra_args.iter().cloned());
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("open the node's log");
        let log_err = log.try_clone().expect("clone the log handle");
        let mut command = self.launcher.command(&binary);
        command.args(&args);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start {} ({:?}): {error}",
                    binary.display(),
                    self.launcher
                )
            });
        node.child = Some(child);
    }

    /// Runs `node ARGS -a ADDR -o json --certs-dir DIR` against node `index`.
    pub(crate) fn try_query(&self, index: usize, args: &[&str]) -> Result<Value, String> {
        self.cli(index, args, "json")?.json()
    }

    /// [`Cluster::try_query`], panicking on failure.
    pub(crate) fn query(&self, index: usize, args: &[&str]) -> Value {
        self.try_query(index, args).unwrap_or_else(|error| {
            panic!(
                "`node {}` against {}: {error}",
                args.join(" "),
                self.nodes[index].id
            )
        })
    }

    /// Runs `node ARGS -a ADDR -o OUTPUT --certs-dir DIR` against node `index`.
    pub(crate) fn cli(
        &self,
        index: usize,
        args: &[&str],
        output: &str,
    ) -> Result<CliOutput, String> {
        cli_against(
            &self.launcher,
            &self.binary,
            &self.certs_dir,
            self.nodes[index].addr,
            args,
            output,
        )
    }

    /// A handle that runs CLI calls against the nodes as they are now (their addresses do not
    /// change across restarts), usable from other threads while the test kills and restarts
    /// nodes through the cluster.
    pub(crate) fn client(&self) -> Client {
        Client {
            launcher: self.launcher.clone(),
            binary: self.binary.clone(),
            certs_dir: self.certs_dir.clone(),
            addrs: self.nodes.iter().map(|node| node.addr).collect(),
        }
    }

    /// Waits until node `index` answers `members`.
    pub(crate) fn wait_answering(&self, index: usize) {
        let what = format!("{} answers `members`", self.nodes[index].id);
        wait_until(CONVERGE_WITHIN, &what, || {
            self.assert_none_exited();
            self.try_query(index, &["members"]).map(drop)
        });
    }

    /// Waits until every running node lists exactly the running nodes, all `alive`.
    pub(crate) fn wait_converged(&self, within: Duration) {
        let running = self.running();
        let mut expected: Vec<String> = running
            .iter()
            .map(|&index| self.nodes[index].id.clone())
            .collect();
        expected.sort();
        let what = format!("every running node lists {expected:?} as alive");
        wait_until(within, &what, || {
            self.assert_none_exited();
            for &index in &running {
                let members = members(&self.try_query(index, &["members"])?)?;
                let alive: Vec<&str> = members
                    .iter()
                    .filter(|member| member.state == "alive")
                    .map(|member| member.id.as_str())
                    .collect();
                if alive != expected || members.len() != expected.len() {
                    return Err(format!("{} lists {members:?}", self.nodes[index].id));
                }
            }
            Ok(())
        });
    }

    /// Panics if a node the harness started has exited on its own.
    pub(crate) fn assert_none_exited(&self) {
        for node in &self.nodes {
            assert!(!node.has_exited(), "{} exited unexpectedly", node.id);
        }
    }

    /// SIGKILLs node `index` and reaps it.
    pub(crate) fn kill9(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let mut child = node
            .child
            .take()
            .unwrap_or_else(|| panic!("{} is not running", node.id));
        child.kill().expect("SIGKILL a node");
        child.wait().expect("reap a killed node");
    }

    /// Sends SIGTERM to node `index`; it keeps running (unreaped) until [`Cluster::wait_exit`].
    pub(crate) fn sigterm(&self, index: usize) {
        self.signal(index, "TERM");
    }

    /// Sends SIGSTOP to node `index`.
    pub(crate) fn sigstop(&self, index: usize) {
        self.signal(index, "STOP");
    }

    /// Sends SIGCONT to node `index`.
    pub(crate) fn sigcont(&self, index: usize) {
        self.signal(index, "CONT");
    }

    /// Sends `signal` with `kill(1)` to our child, which is not reaped yet, so its pid cannot
    /// have been reused.
    fn signal(&self, index: usize, signal: &str) {
        let pid = self.nodes[index].pid().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill -{signal} {pid} failed: {status}");
    }

    /// Waits at most `within` for node `index` to exit, reaps it and returns its status.
    pub(crate) fn wait_exit(&mut self, index: usize, within: Duration) -> ExitStatus {
        let node = &mut self.nodes[index];
        let what = format!("{} exits", node.id);
        let child = node
            .child
            .as_mut()
            .unwrap_or_else(|| panic!("{} is not running", node.id));
        let status = wait_until(within, &what, || match child.try_wait() {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err("still running".to_owned()),
            Err(error) => panic!("cannot wait for a node: {error}"),
        });
        node.child = None;
        status
    }

    /// The whole log of node `index` so far.
    pub(crate) fn log(&self, index: usize) -> String {
        fs::read(&self.nodes[index].log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// The last [`LOG_TAIL_LINES`] lines of every node's log.
    fn log_tails(&self) -> String {
        let mut text = String::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let log = self.log(index);
            let lines: Vec<&str> = log.lines().collect();
            let from = lines.len().saturating_sub(LOG_TAIL_LINES);
            let _ = writeln!(
                text,
                "----- {} ({}), last {} lines of {}",
                node.id,
                node.addr,
                lines.len() - from,
                node.log.display()
            );
            for line in &lines[from..] {
                let _ = writeln!(text, "{line}");
            }
        }
        text
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                // Our own unreaped child: SIGKILL reaches exactly it, stopped or not.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if thread::panicking() {
            eprintln!(
                "{}===== test failed; its cluster's files are kept in {}",
                self.log_tails(),
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs `node ARGS -a ADDR -o OUTPUT --certs-dir DIR` as `launcher` says.
fn cli_against(
    launcher: &Launcher,
    binary: &Path,
    certs_dir: &Path,
    addr: SocketAddr,
    args: &[&str],
    output: &str,
) -> Result<CliOutput, String> {
    let addr = addr.to_string();
    let mut full = args.to_vec();
    full.extend_from_slice(&[
        "-a",
        &addr,
        "-o",
        output,
        "--certs-dir",
        path_str(certs_dir),
    ]);
    run(launcher, binary, &full)
}

/// CLI calls against the nodes of a [`Cluster`], from any thread; see [`Cluster::client`].
#[derive(Debug, Clone)]
pub(crate) struct Client {
    launcher: Launcher,
    binary: PathBuf,
    certs_dir: PathBuf,
    addrs: Vec<SocketAddr>,
}

impl Client {
    /// How many nodes the cluster had when this handle was made.
    pub(crate) fn len(&self) -> usize {
        self.addrs.len()
    }

    /// This handle without node `index` (one that left the cluster for good); the nodes after
    /// it move down one index.
    pub(crate) fn without(&self, index: usize) -> Client {
        let mut client = self.clone();
        client.addrs.remove(index);
        client
    }

    /// This handle, with its CLI processes run in group `gid`, which nftables rules can tell
    /// apart from the others' (`meta skgid`).
    pub(crate) fn in_group(&self, gid: u32) -> Client {
        let mut client = self.clone();
        client.launcher.gid = Some(gid);
        client
    }

    /// Runs `node ARGS -a ADDR -o OUTPUT --certs-dir DIR` against node `index`.
    pub(crate) fn cli(
        &self,
        index: usize,
        args: &[&str],
        output: &str,
    ) -> Result<CliOutput, String> {
        cli_against(
            &self.launcher,
            &self.binary,
            &self.certs_dir,
            self.addrs[index],
            args,
            output,
        )
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// One entry of `members`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The node id.
    pub(crate) id: String,
    /// Its address.
    pub(crate) addr: String,
    /// `alive`, `suspect`, `down` or `left`.
    pub(crate) state: String,
    /// Its incarnation across restarts.
    pub(crate) generation: u64,
}

/// The members of a `members -o json` answer, sorted by id.
pub(crate) fn members(answer: &Value) -> Result<Vec<Member>, String> {
    check_version(answer)?;
    let list = answer["members"]
        .as_array()
        .ok_or_else(|| format!("no `members` array in {answer}"))?;
    let mut members = list
        .iter()
        .map(|member| {
            Ok(Member {
                id: string_field(member, "id")?,
                addr: string_field(member, "addr")?,
                state: string_field(member, "state")?,
                generation: member["generation"]
                    .as_u64()
                    .ok_or_else(|| format!("no numeric `generation` in {member}"))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    members.sort_by(|left, right| left.id.cmp(&right.id));
    Ok(members)
}

/// The `digest` of a `status` or `shard-info` answer.
pub(crate) fn digest(answer: &Value) -> Result<String, String> {
    check_version(answer)?;
    string_field(answer, "digest")
}

/// Placement's leader and replicas, in order, of a `shard-info -o json` answer (its `target`;
/// `leader` and `replicas` are the shard's actual config, which follows the target).
pub(crate) fn owners(answer: &Value) -> Result<(Option<String>, Vec<String>), String> {
    check_version(answer)?;
    let target = answer["target"]
        .as_array()
        .ok_or_else(|| format!("no `target` array in {answer}"))?
        .iter()
        .map(|id| {
            id.as_str()
                .map(ToOwned::to_owned)
                .ok_or_else(|| format!("a target that is not a string in {answer}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((target.first().cloned(), target))
}

/// The string field `name` of `object`.
pub(crate) fn string_field(object: &Value, name: &str) -> Result<String, String> {
    object[name]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no string `{name}` in {object}"))
}

fn check_version(answer: &Value) -> Result<(), String> {
    match answer["version"].as_u64() {
        Some(1) => Ok(()),
        _ => Err(format!("not `\"version\": 1`: {answer}")),
    }
}
