//! Issue 5: the key-value store through `node put|get|del`, healthy and under real faults
//! (`kill -9` of shard leaders, of the whole cluster, SIGSTOP of a shard's majority, a join
//! during writes).
//!
//! Every cluster here runs with `--shards 16`: each shard's leader heartbeats every 100 ms,
//! and 1024 shards per node would keep two cores busy on their own.
//!
//! The safety check ([`check_histories`]) is per key, each key written by one writer with
//! increasing values: the value read at the end must be the last acknowledged one or one
//! attempted after it whose outcome is unknown; never an older acknowledged value, never one
//! the cluster answered `unavailable`/`refused` for (those were never appended), never a value
//! nobody wrote.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::harness::{CONVERGE_WITHIN, Client, Cluster, string_field, wait_until};

/// How many shards the clusters here have.
const SHARDS: u16 = 16;
/// The daemon flags of every node here.
const FLAGS: &[&str] = &["--shards", "16"];
/// `--timeout` of a put or get in the workloads, in seconds.
const OP_TIMEOUT: &str = "5";
/// How long the replica sets may take to reach placement's targets (learners added, caught up
/// and promoted, old voters removed).
const CONFIGS_SETTLE_WITHIN: Duration = Duration::from_secs(60);
/// How often [`wait_configs_match_target`] starts a probe.
const SETTLE_PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long the cluster may take to make progress again after a fault.
const RECOVER_WITHIN: Duration = Duration::from_secs(30);
/// Concurrent writers in the workloads; each owns [`KEYS_PER_WRITER`] keys.
const WRITERS: usize = 3;
/// Keys each writer owns and writes in turn.
const KEYS_PER_WRITER: usize = 2;

/// What one `put`/`get`/`del` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Acknowledged; for a get, the value (`None` for `(nil)`).
    Ok(Option<String>),
    /// `unavailable: ...`: never appended.
    Unavailable(String),
    /// `refused: ...`: nothing changed.
    Refused(String),
    /// Anything else (`indeterminate`, a node that could not be reached, a hung CLI): a write
    /// may or may not have been applied.
    Unknown(String),
}

impl Outcome {
    /// Whether a write with this outcome may have been applied.
    fn maybe_applied(&self) -> bool {
        matches!(self, Outcome::Ok(_) | Outcome::Unknown(_))
    }
}

/// Runs `node ARGS --timeout TIMEOUT -o json` against node `index` and classifies the answer.
fn kv(client: &Client, index: usize, args: &[&str], timeout: &str) -> Outcome {
    let mut full = args.to_vec();
    full.extend_from_slice(&["--timeout", timeout]);
    let output = match client.cli(index, &full, "json") {
        Ok(output) => output,
        Err(error) => return Outcome::Unknown(error),
    };
    let answer: Value = match serde_json::from_str(&output.stdout) {
        Ok(answer) => answer,
        Err(_) => {
            return Outcome::Unknown(format!(
                "exit {}, stdout {:?}, stderr {:?}",
                output.status,
                output.stdout.trim(),
                output.stderr.trim()
            ));
        }
    };
    match (answer["ok"].as_bool(), output.status.success()) {
        (Some(true), true) => Outcome::Ok(answer["value"].as_str().map(str::to_owned)),
        (Some(false), false) => {
            let error = answer["error"].as_str().unwrap_or_default().to_owned();
            if error.starts_with("unavailable:") {
                Outcome::Unavailable(error)
            } else if error.starts_with("refused:") {
                Outcome::Refused(error)
            } else {
                Outcome::Unknown(error)
            }
        }
        _ => Outcome::Unknown(format!("exit {} with {answer}", output.status)),
    }
}

/// A tiny xorshift generator: which node a writer asks next. Seeded from the clock, and the
/// seed is printed, so a failing schedule can be told apart (not replayed: the faults are
/// real).
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn new(stream: u64) -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| u64::from(elapsed.subsec_nanos()));
        Rng((nanos ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % u64::try_from(bound).expect("a small bound"))
            .expect("below a usize bound")
    }
}

/// Every write one writer attempted on one key, in order.
#[derive(Debug, Clone)]
struct History {
    key: String,
    attempts: Vec<(String, Outcome)>,
}

impl History {
    /// The values the key may hold now: the last acknowledged value (or nothing, if none was)
    /// and every value attempted after it that may have been applied.
    fn allowed(&self) -> BTreeSet<Option<String>> {
        let last_ack = self
            .attempts
            .iter()
            .rposition(|(_, outcome)| matches!(outcome, Outcome::Ok(_)));
        let mut allowed = BTreeSet::new();
        let after = match last_ack {
            Some(position) => {
                allowed.insert(Some(self.attempts[position].0.clone()));
                position + 1
            }
            None => {
                allowed.insert(None);
                0
            }
        };
        for (value, outcome) in &self.attempts[after..] {
            if outcome.maybe_applied() {
                allowed.insert(Some(value.clone()));
            }
        }
        allowed
    }

    fn count(&self, which: fn(&Outcome) -> bool) -> usize {
        self.attempts
            .iter()
            .filter(|(_, outcome)| which(outcome))
            .count()
    }
}

/// Which nodes the writers may ask: the test clears a node's flag before killing it and sets
/// it again once it answers.
#[derive(Debug)]
struct Up(Vec<AtomicBool>);

impl Up {
    fn all(count: usize) -> Up {
        Up((0..count).map(|_| AtomicBool::new(true)).collect())
    }

    fn set(&self, index: usize, up: bool) {
        self.0[index].store(up, Ordering::SeqCst);
    }

    /// A random node that is up (node 0 if none is).
    fn pick(&self, rng: &mut Rng) -> usize {
        let up: Vec<usize> = (0..self.0.len())
            .filter(|&index| self.0[index].load(Ordering::SeqCst))
            .collect();
        if up.is_empty() {
            0
        } else {
            up[rng.below(up.len())]
        }
    }
}

/// Shared state of a workload: when to stop, how many writes were acknowledged so far.
#[derive(Debug)]
struct Workload {
    stop: AtomicBool,
    acked: AtomicUsize,
    up: Up,
}

impl Workload {
    fn new(nodes: usize) -> Workload {
        Workload {
            stop: AtomicBool::new(false),
            acked: AtomicUsize::new(0),
            up: Up::all(nodes),
        }
    }

    /// Waits until `more` writes beyond those acknowledged now are acknowledged.
    fn wait_progress(&self, more: usize, within: Duration, what: &str) {
        let from = self.acked.load(Ordering::SeqCst);
        wait_until(within, what, || {
            let now = self.acked.load(Ordering::SeqCst);
            if now >= from + more {
                Ok(())
            } else {
                Err(format!("{} acknowledged since", now - from))
            }
        });
    }
}

/// The key writer `writer` owns as its `slot`th.
fn writer_key(writer: usize, slot: usize) -> String {
    format!("w{writer}-k{slot}")
}

/// One writer: puts `KEY=vN` with increasing N to its keys in turn, each through a random node
/// that is up, until told to stop; returns the histories of its keys.
fn writer(client: &Client, writer: usize, workload: &Workload) -> Vec<History> {
    let mut rng = Rng::new(writer as u64 + 1);
    let mut histories: Vec<History> = (0..KEYS_PER_WRITER)
        .map(|slot| History {
            key: writer_key(writer, slot),
            attempts: Vec::new(),
        })
        .collect();
    let mut turn = 0;
    while !workload.stop.load(Ordering::SeqCst) {
        let history = &mut histories[turn % KEYS_PER_WRITER];
        let value = format!("{}=v{}", history.key, history.attempts.len() + 1);
        let node = workload.up.pick(&mut rng);
        let outcome = kv(client, node, &["put", &history.key, &value], OP_TIMEOUT);
        if matches!(outcome, Outcome::Ok(_)) {
            workload.acked.fetch_add(1, Ordering::SeqCst);
        }
        history.attempts.push((value, outcome));
        turn += 1;
    }
    histories
}

/// Stops the writers, collects their histories, and re-raises a panic of the fault thread.
fn finish(
    workload: &Workload,
    writers: Vec<thread::ScopedJoinHandle<'_, Vec<History>>>,
    faults: thread::Result<()>,
) -> Vec<History> {
    workload.stop.store(true, Ordering::SeqCst);
    let histories = writers
        .into_iter()
        .flat_map(|writer| writer.join().expect("a writer"))
        .collect();
    if let Err(panic) = faults {
        std::panic::resume_unwind(panic);
    }
    histories
}

/// Every key got at least one acknowledged write (so the history check has teeth).
fn assert_every_key_acknowledged(histories: &[History]) {
    assert!(
        histories
            .iter()
            .all(|history| history.count(|outcome| matches!(outcome, Outcome::Ok(_))) > 0),
        "every key had an acknowledged write: {histories:?}"
    );
}

/// Reads every key of `histories` through rotating nodes of `client` (retrying failed reads,
/// which are safe to retry) and checks each against [`History::allowed`].
fn check_histories(client: &Client, histories: &[History]) {
    let mut violations = Vec::new();
    for (number, history) in histories.iter().enumerate() {
        let node = number % client.len();
        let what = format!("`get {}` answers", history.key);
        let read = wait_until(RECOVER_WITHIN, &what, || {
            match kv(client, node, &["get", &history.key], OP_TIMEOUT) {
                Outcome::Ok(value) => Ok(value),
                other => Err(format!("{other:?}")),
            }
        });
        let allowed = history.allowed();
        eprintln!(
            "{}: {} attempts, {} acknowledged, {} unavailable, {} unknown; read {read:?}",
            history.key,
            history.attempts.len(),
            history.count(|outcome| matches!(outcome, Outcome::Ok(_))),
            history.count(|outcome| matches!(outcome, Outcome::Unavailable(_))),
            history.count(|outcome| matches!(outcome, Outcome::Unknown(_))),
        );
        if !allowed.contains(&read) {
            violations.push(format!(
                "{} reads {read:?}, allowed {allowed:?}; history {:?}",
                history.key, history.attempts
            ));
        }
    }
    assert!(
        violations.is_empty(),
        "lost or invented writes: {violations:#?}"
    );
}

/// The index of the node called `id`.
fn index_of(cluster: &Cluster, id: &str) -> usize {
    cluster
        .nodes()
        .iter()
        .position(|node| node.id == id)
        .unwrap_or_else(|| panic!("no node {id}"))
}

/// A shard's actual config as one of its replicas sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Config {
    /// Its leader hint.
    leader: Option<String>,
    /// Voters (roles `leader` and `follower`), sorted.
    voters: Vec<String>,
    /// Learners, sorted.
    learners: Vec<String>,
    /// What placement wants, in placement order.
    target: Vec<String>,
}

/// `shard-info SHARD` of node `index`, parsed.
fn config(cluster: &Cluster, index: usize, shard: u16) -> Result<Config, String> {
    let answer = cluster.try_query(index, &["shard-info", &shard.to_string()])?;
    let leader = match &answer["leader"] {
        Value::Null => None,
        leader => Some(string_field(leader, "id")?),
    };
    let mut voters = Vec::new();
    let mut learners = Vec::new();
    for replica in answer["replicas"]
        .as_array()
        .ok_or_else(|| format!("no `replicas` in {answer}"))?
    {
        let id = string_field(replica, "id")?;
        match string_field(replica, "role")?.as_str() {
            "leader" | "follower" => voters.push(id),
            "learner" => learners.push(id),
            role => return Err(format!("unknown role {role} in {answer}")),
        }
    }
    voters.sort();
    learners.sort();
    let target = answer["target"]
        .as_array()
        .ok_or_else(|| format!("no `target` in {answer}"))?
        .iter()
        .map(|id| id.as_str().map(str::to_owned).ok_or(format!("{answer}")))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Config {
        leader,
        voters,
        learners,
        target,
    })
}

/// Shard `shard`'s config, as its leader sees it, if each member of the target placement
/// wants (as node `asker` sees it) reports exactly that target as the voters, no learners and
/// the same target, and one of them reports itself as the leader; else what differs. (The
/// followers' leader hints are not compared: they lag a leader change.)
fn settled_config(cluster: &Cluster, asker: usize, shard: u16) -> Result<Config, String> {
    let target = config(cluster, asker, shard)?.target;
    let mut wanted = target.clone();
    wanted.sort();
    let mut leader = None;
    for id in &target {
        let here = config(cluster, index_of(cluster, id), shard)?;
        if here.voters != wanted || !here.learners.is_empty() || here.target != target {
            return Err(format!("shard {shard}: {id} reports {here:?}"));
        }
        if here.leader.as_ref() == Some(id) {
            leader = Some(here);
        }
    }
    leader.ok_or(format!(
        "shard {shard}: no member of {target:?} says it leads"
    ))
}

/// Waits until every shard's config is settled ([`settled_config`], asked through the first
/// running node) and returns them, by shard.
///
/// Each probe of a shard runs up to four CLI processes, which compete with the nodes for the
/// two cores; so a shard found settled is not asked again until all are, then all are checked
/// once more, and probes start at most every [`SETTLE_PROBE_EVERY`].
fn wait_configs_match_target(cluster: &Cluster, within: Duration) -> Vec<Config> {
    let asker = cluster.running()[0];
    let mut settled: BTreeMap<u16, Config> = BTreeMap::new();
    let mut last_probe: Option<Instant> = None;
    wait_until(within, "every shard's voters are its target", || {
        if let Some(last) = last_probe {
            thread::sleep(SETTLE_PROBE_EVERY.saturating_sub(last.elapsed()));
        }
        last_probe = Some(Instant::now());
        for shard in 0..SHARDS {
            if let std::collections::btree_map::Entry::Vacant(entry) = settled.entry(shard) {
                entry.insert(settled_config(cluster, asker, shard)?);
            }
        }
        let mut configs = Vec::new();
        for shard in 0..SHARDS {
            match settled_config(cluster, asker, shard) {
                Ok(config) => configs.push(config),
                Err(error) => {
                    settled.remove(&shard);
                    return Err(format!("again: {error}"));
                }
            }
        }
        Ok(configs)
    })
}

/// `shard-for KEY` from node `index`: the key's shard.
fn shard_of(cluster: &Cluster, index: usize, key: &str) -> u16 {
    let answer = cluster.query(index, &["shard-for", key]);
    answer["shard"]
        .as_u64()
        .and_then(|shard| u16::try_from(shard).ok())
        .unwrap_or_else(|| panic!("no shard in {answer}"))
}

/// `put`, `get` and `del` through every node, in table and JSON form; a key over 1 KiB is
/// refused and changes nothing, a key of exactly 1 KiB works.
#[test]
fn put_get_del_through_any_node() {
    let cluster = Cluster::launch_with("kv-basic", 3, FLAGS);
    wait_configs_match_target(&cluster, CONFIGS_SETTLE_WITHIN);
    let client = cluster.client();
    let nodes = cluster.running();

    // Every operation here is idempotent (a put of the same value, a del, a get), so one that
    // came back `unavailable` or `indeterminate` (a leader change on two loaded cores) is run
    // again, and said so; the values read are checked exactly.
    let table = |index: usize, args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&["--timeout", OP_TIMEOUT]);
        let what = format!("`{}` through n{index} answers", args.join(" "));
        wait_until(RECOVER_WITHIN, &what, || {
            let output = cluster.cli(index, &full, "table")?;
            let transient = output.stderr.starts_with("error: unavailable:")
                || output.stderr.starts_with("error: indeterminate:");
            if transient {
                eprintln!("again after: {}", output.stderr.trim());
                Err(output.stderr)
            } else {
                Ok(output)
            }
        })
    };
    let kv = |client: &Client, index: usize, args: &[&str], timeout: &str| {
        let what = format!("`{}` through n{index} answers", args.join(" "));
        wait_until(RECOVER_WITHIN, &what, || {
            match kv(client, index, args, timeout) {
                outcome @ (Outcome::Unavailable(_) | Outcome::Unknown(_)) => {
                    eprintln!("again after: {outcome:?}");
                    Err(format!("{outcome:?}"))
                }
                outcome => Ok(outcome),
            }
        })
    };
    let keep_value = "kept value, with spaces and é";
    let put = table(0, &["put", "keep", keep_value]);
    assert!(put.status.success(), "put keep: {put:?}");
    assert_eq!(put.stdout, "OK\n");

    for &writer in &nodes {
        let key = format!("roundtrip-{writer}");
        let value = format!("value written through n{writer}");
        let put = table(writer, &["put", &key, &value]);
        assert!(put.status.success(), "put {key} through n{writer}: {put:?}");
        assert_eq!(put.stdout, "OK\n", "put {key} through n{writer}");
        for &reader in &nodes {
            let get = table(reader, &["get", &key]);
            assert!(get.status.success(), "get {key} through n{reader}: {get:?}");
            assert_eq!(
                get.stdout,
                format!("{value}\n"),
                "get {key} through n{reader}"
            );
            assert_eq!(
                kv(&client, reader, &["get", &key], OP_TIMEOUT),
                Outcome::Ok(Some(value.clone())),
                "get {key} -o json through n{reader}"
            );
        }
        let deleter = nodes[(writer + 1) % nodes.len()];
        let del = table(deleter, &["del", &key]);
        assert!(
            del.status.success(),
            "del {key} through n{deleter}: {del:?}"
        );
        assert_eq!(del.stdout, "OK\n", "del {key} through n{deleter}");
        for &reader in &nodes {
            let get = table(reader, &["get", &key]);
            assert!(get.status.success(), "get {key} through n{reader}: {get:?}");
            assert_eq!(get.stdout, "(nil)\n", "get deleted {key} through n{reader}");
            assert_eq!(
                kv(&client, reader, &["get", &key], OP_TIMEOUT),
                Outcome::Ok(None),
                "get deleted {key} -o json through n{reader}"
            );
        }
    }

    let longest = "k".repeat(1024);
    assert_eq!(
        kv(&client, 1, &["put", &longest, "fits"], OP_TIMEOUT),
        Outcome::Ok(None),
        "a 1024-byte key is accepted"
    );
    assert_eq!(
        kv(&client, 2, &["get", &longest], OP_TIMEOUT),
        Outcome::Ok(Some("fits".to_owned()))
    );

    let too_long = "k".repeat(1025);
    let put = table(0, &["put", &too_long, "nope"]);
    assert_eq!(
        put.status.code(),
        Some(1),
        "put of a 1025-byte key: {put:?}"
    );
    assert!(
        put.stderr.starts_with("error: refused:"),
        "put of a 1025-byte key: {put:?}"
    );
    assert!(put.stdout.is_empty(), "put of a 1025-byte key: {put:?}");
    for &index in &nodes {
        let json = kv(&client, index, &["put", &too_long, "nope"], OP_TIMEOUT);
        assert!(
            matches!(json, Outcome::Refused(_)),
            "put -o json of a 1025-byte key through n{index}: {json:?}"
        );
        let read = kv(&client, index, &["get", &too_long], OP_TIMEOUT);
        assert!(
            matches!(read, Outcome::Refused(_)),
            "get of a 1025-byte key through n{index}: {read:?}"
        );
        // Nothing changed.
        assert_eq!(
            kv(&client, index, &["get", "keep"], OP_TIMEOUT),
            Outcome::Ok(Some(keep_value.to_owned()))
        );
        assert_eq!(
            kv(&client, index, &["get", &longest], OP_TIMEOUT),
            Outcome::Ok(Some("fits".to_owned()))
        );
    }
}

/// Concurrent writers while the leader of a writer's shard is `kill -9`ed and restarted from
/// its data dir, four times: no acknowledged write is lost, nothing unwritten appears.
#[test]
fn acknowledged_writes_survive_leader_kills() {
    const KILLS: usize = 4;
    let mut cluster = Cluster::launch_with("kv-leader-kills", 3, FLAGS);
    wait_configs_match_target(&cluster, CONFIGS_SETTLE_WITHIN);
    let client = cluster.client();
    let workload = Workload::new(client.len());

    let histories: Vec<History> = thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|number| {
                let (client, workload) = (&client, &workload);
                scope.spawn(move || writer(client, number, workload))
            })
            .collect();
        let faults = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            workload.wait_progress(WRITERS * 2, RECOVER_WITHIN, "the writers make progress");
            for round in 0..KILLS {
                let key = writer_key(round % WRITERS, round % KEYS_PER_WRITER);
                let asker = cluster.running()[0];
                let shard = shard_of(&cluster, asker, &key);
                let what = format!("shard {shard} (of {key}) has a leader that runs");
                let leader = wait_until(RECOVER_WITHIN, &what, || {
                    let asker = cluster.running()[0];
                    let hint = config(&cluster, asker, shard)?.leader;
                    let Some(index) = hint.as_ref().map(|id| index_of(&cluster, id)) else {
                        return Err(format!("{} names no leader", cluster.node(asker).id));
                    };
                    if !cluster.node(index).is_running() {
                        return Err(format!("{hint:?} does not run"));
                    }
                    // The hint may be stale: the leader must say so itself.
                    match config(&cluster, index, shard)?.leader {
                        own if own == hint => Ok(index),
                        own => Err(format!("{hint:?} names {own:?}")),
                    }
                });
                eprintln!(
                    "round {round}: kill -9 {} (leader of shard {shard}, key {key})",
                    cluster.node(leader).id
                );
                workload.up.set(leader, false);
                cluster.kill9(leader);
                workload.wait_progress(
                    WRITERS,
                    RECOVER_WITHIN,
                    "writes are acknowledged without the killed leader",
                );
                cluster.restart(leader);
                cluster.wait_answering(leader);
                workload.up.set(leader, true);
                cluster.wait_converged(CONVERGE_WITHIN);
                workload.wait_progress(
                    WRITERS,
                    RECOVER_WITHIN,
                    "writes are acknowledged after the restart",
                );
            }
        }));
        finish(&workload, writers, faults)
    });
    assert_every_key_acknowledged(&histories);
    check_histories(&client, &histories);
}

/// Writes acknowledged before every node is `kill -9`ed are all readable once the nodes are
/// started again (without `--join`, from the peers saved in their data dirs).
#[test]
fn whole_cluster_kill9_and_restart_loses_nothing() {
    const KEYS: usize = 24;
    let mut cluster = Cluster::launch_with("kv-restart-all", 3, FLAGS);
    wait_configs_match_target(&cluster, CONFIGS_SETTLE_WITHIN);
    let client = cluster.client();
    let mut written = BTreeMap::new();
    for number in 0..KEYS {
        let key = format!("durable-{number}");
        let value = format!("{key}=v1");
        let index = number % client.len();
        // Acknowledged writes are what must survive; a put that came back `unavailable` or
        // `indeterminate` (a leader change on two loaded cores) is run again, and said so.
        let what = format!("`put {key}` through n{index} is acknowledged");
        wait_until(RECOVER_WITHIN, &what, || {
            match kv(&client, index, &["put", &key, &value], OP_TIMEOUT) {
                Outcome::Ok(_) => Ok(()),
                Outcome::Refused(reason) => panic!("put {key} refused: {reason}"),
                other => {
                    eprintln!("again after: {other:?}");
                    Err(format!("{other:?}"))
                }
            }
        });
        written.insert(key, value);
    }

    for index in 0..3 {
        cluster.kill9(index);
    }
    for index in 0..3 {
        cluster.start(index);
    }
    for index in 0..3 {
        cluster.wait_answering(index);
    }
    cluster.wait_converged(CONVERGE_WITHIN);

    for (number, (key, value)) in written.iter().enumerate() {
        let index = number % client.len();
        let what = format!("`get {key}` through n{index} answers");
        let read = wait_until(RECOVER_WITHIN, &what, || {
            match kv(&client, index, &["get", key], OP_TIMEOUT) {
                Outcome::Ok(value) => Ok(value),
                other => Err(format!("{other:?}")),
            }
        });
        assert_eq!(
            read.as_deref(),
            Some(value.as_str()),
            "{key} after the restart"
        );
    }
}

/// SIGSTOP of two of a shard's three voters (its followers): its leader steps down, and then
/// a put to that shard fails within its timeout as `unavailable: no quorum for shard S`, and
/// so does a get; a shard with at most one stopped voter still takes writes; after SIGCONT of
/// one stopped voter the shard takes writes again.
#[test]
fn two_of_three_replicas_stopped_make_only_that_shard_unavailable() {
    let cluster = Cluster::launch_with("kv-no-quorum", 5, FLAGS);
    let client = cluster.client();

    // A key of every shard.
    let mut key_of: BTreeMap<u16, String> = BTreeMap::new();
    for number in 0.. {
        if key_of.len() == usize::from(SHARDS) {
            break;
        }
        assert!(number < 1000, "no key for some shard among {number} keys");
        let key = format!("probe-{number}");
        key_of.entry(shard_of(&cluster, 0, &key)).or_insert(key);
    }

    // Two shards whose configs are their targets, led by the target's first member: S, whose
    // two followers are stopped, and T, whose leader is not stopped and whose other voters
    // keep a majority (one of them stopped, if such a shard is settled). Only these two need
    // to have settled (see `five_nodes_settle_every_shard_to_its_target` for why not every shard may).
    let mut last_probe: Option<Instant> = None;
    let (shard, stopped_config, other, other_config) =
        wait_until(CONFIGS_SETTLE_WITHIN, "two suitable shards settle", || {
            if let Some(last) = last_probe {
                thread::sleep(SETTLE_PROBE_EVERY.saturating_sub(last.elapsed()));
            }
            last_probe = Some(Instant::now());
            let mut unsettled = Vec::new();
            let mut settled = BTreeMap::new();
            for shard in 0..SHARDS {
                match settled_config(&cluster, 0, shard) {
                    Ok(config) if config.leader.as_ref() == config.target.first() => {
                        settled.insert(shard, config);
                    }
                    Ok(config) => unsettled.push(format!("shard {shard}: {config:?}")),
                    Err(error) => unsettled.push(error),
                }
            }
            for (&shard, config) in &settled {
                let leader = config.leader.clone().expect("a settled leader");
                let stopped: Vec<&String> =
                    config.voters.iter().filter(|id| **id != leader).collect();
                let stopped_among = |other: &Config| {
                    other
                        .voters
                        .iter()
                        .filter(|id| stopped.contains(id))
                        .count()
                };
                let candidates = settled.iter().filter(|(_, other)| {
                    let leader = other.leader.as_ref().expect("a settled leader");
                    !stopped.contains(&leader) && 2 * stopped_among(other) < other.voters.len()
                });
                if let Some((&other, other_config)) = candidates
                    .clone()
                    .find(|(_, other)| stopped_among(other) == 1)
                    .or_else(|| candidates.clone().next())
                {
                    return Ok((shard, config.clone(), other, other_config.clone()));
                }
            }
            Err(format!(
                "settled {:?}; unsettled {unsettled:?}",
                settled.keys().collect::<Vec<_>>()
            ))
        });
    let leader_id = stopped_config.leader.clone().expect("a leader");
    let leader = index_of(&cluster, &leader_id);
    let stopped: Vec<usize> = stopped_config
        .voters
        .iter()
        .filter(|id| **id != leader_id)
        .map(|id| index_of(&cluster, id))
        .collect();
    assert_eq!(stopped.len(), 2, "shard {shard}: {stopped_config:?}");
    let stopped_ids: Vec<String> = stopped
        .iter()
        .map(|&index| cluster.node(index).id.clone())
        .collect();
    // Ask through a node that is not a voter of the stopped shard, if there is one.
    let asker = (0..cluster.nodes().len())
        .find(|&index| {
            !stopped_config
                .voters
                .iter()
                .any(|id| *id == cluster.node(index).id)
        })
        .expect("five nodes, three voters");
    eprintln!(
        "stopping {stopped_ids:?} (followers of shard {shard}, led by {leader_id}); \
         shard {other} has voters {:?}; asking through n{asker}",
        other_config.voters
    );

    let stopped_at = Instant::now();
    for &index in &stopped {
        cluster.sigstop(index);
    }
    // Check-quorum: the leader steps down about 300 ms after it last heard a majority.
    wait_until(
        Duration::from_secs(5),
        &format!("{leader_id} steps down from shard {shard}"),
        || match config(&cluster, leader, shard)? {
            Config { leader: None, .. } => Ok(()),
            seen => Err(format!("{seen:?}")),
        },
    );

    let key = &key_of[&shard];
    let started = Instant::now();
    let outcome = kv(&client, asker, &["put", key, "never"], "3");
    let took = started.elapsed();
    assert_eq!(
        outcome,
        Outcome::Unavailable(format!("unavailable: no quorum for shard {shard}")),
        "put {key} (shard {shard}) with two of its three voters stopped"
    );
    assert!(
        took < Duration::from_secs(5),
        "the put took {took:?} with --timeout 3"
    );
    let outcome = kv(&client, leader, &["get", key], "3");
    assert_eq!(
        outcome,
        Outcome::Unavailable(format!("unavailable: no quorum for shard {shard}")),
        "get {key} (shard {shard}) with two of its three voters stopped"
    );

    let other_key = &key_of[&other];
    let started = stopped_at.elapsed();
    let outcome = kv(&client, asker, &["put", other_key, "still"], OP_TIMEOUT);
    if outcome != Outcome::Ok(None) {
        let views: Vec<String> = (0..cluster.nodes().len())
            .filter(|index| !stopped.contains(index))
            .map(|index| {
                let shard_for = cluster.try_query(index, &["shard-for", other_key]);
                format!(
                    "n{index}: {:?}; shard-for {:?}",
                    config(&cluster, index, other),
                    shard_for.map(|answer| answer["leader"]["id"].clone())
                )
            })
            .collect();
        panic!(
            "put {other_key} (shard {other}, at most one voter stopped) through n{asker}, \
             {started:?} to {:?} after SIGSTOP: {outcome:?}; now {views:#?}",
            stopped_at.elapsed()
        );
    }
    assert_eq!(
        kv(&client, asker, &["get", other_key], OP_TIMEOUT),
        Outcome::Ok(Some("still".to_owned())),
    );

    cluster.sigcont(stopped[0]);
    let mut attempts = 0;
    let what = format!(
        "a put to shard {shard} succeeds after SIGCONT of {}",
        stopped_ids[0]
    );
    let written = wait_until(RECOVER_WITHIN, &what, || {
        attempts += 1;
        let value = format!("again-{attempts}");
        match kv(&client, asker, &["put", key, &value], "3") {
            Outcome::Ok(_) => Ok(value),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        kv(&client, leader, &["get", key], OP_TIMEOUT),
        Outcome::Ok(Some(written)),
        "{key} after the shard came back"
    );
    cluster.sigcont(stopped[1]);
}

/// A fourth node joins while writers run: every shard's voters become the four-node target,
/// and no acknowledged write is lost.
#[test]
fn a_fourth_node_joins_during_writes() {
    let mut cluster = Cluster::launch_with("kv-join", 3, FLAGS);
    wait_configs_match_target(&cluster, CONFIGS_SETTLE_WITHIN);
    let client = cluster.client();
    let workload = Workload::new(client.len());

    let histories: Vec<History> = thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|number| {
                let (client, workload) = (&client, &workload);
                scope.spawn(move || writer(client, number, workload))
            })
            .collect();
        let join = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            workload.wait_progress(WRITERS * 2, RECOVER_WITHIN, "the writers make progress");
            let joiner = cluster.add_node("n3", None, FLAGS);
            cluster.start_joining(joiner, 0);
            cluster.wait_answering(joiner);
            cluster.wait_converged(CONVERGE_WITHIN);
            let configs = wait_configs_match_target(&cluster, CONFIGS_SETTLE_WITHIN);
            let joined = configs
                .iter()
                .filter(|config| config.voters.iter().any(|id| id == "n3"))
                .count();
            eprintln!("n3 is a voter of {joined} of {SHARDS} shards");
            assert!(joined > 0, "n3 is in no shard's target: {configs:?}");
            workload.wait_progress(WRITERS, RECOVER_WITHIN, "writes after the join");
        }));
        finish(&workload, writers, join)
    });
    assert_every_key_acknowledged(&histories);
    // Read through all four nodes, the joiner included.
    check_histories(&cluster.client(), &histories);
}

/// Five idle nodes: every shard's voters become its target (learners added and promoted, the
/// first node's surplus voter removed), as issue 5 asks of the join in
/// [`a_fourth_node_joins_during_writes`].
#[test]
fn five_nodes_settle_every_shard_to_its_target() {
    let cluster = Cluster::launch_with("kv-settle", 5, FLAGS);
    wait_configs_match_target(&cluster, CONFIGS_SETTLE_WITHIN);
}
