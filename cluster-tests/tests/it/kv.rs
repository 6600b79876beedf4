//! Issue 5: the key-value store through `node put|get|del`, healthy and under real faults
//! (`kill -9` of shard leaders, of the whole cluster, SIGSTOP of a shard's majority, a join
//! during writes).
//!
//! Every cluster here runs with `--shards 16`: each shard's leader heartbeats every 100 ms,
//! and 1024 shards per node would keep two cores busy on their own.
//!
//! The safety check is [`crate::workload::check_histories`]: per key, each key written by one
//! writer with increasing values.

use std::collections::{BTreeMap, BTreeSet};
use std::thread;
use std::time::{Duration, Instant};

use crate::configs::{
    CONFIGS_SETTLE_WITHIN, Config, SETTLE_PROBE_EVERY, config, own_config, settled_config,
    shard_of, voter_in, wait_configs_match_target,
};
use crate::harness::{CONVERGE_WITHIN, Client, Cluster, wait_until};
use crate::workload::{
    History, OP_TIMEOUT, Outcome, RECOVER_WITHIN, Rng, Workload, assert_every_key_acknowledged,
    check_histories, finish, kv, write_loop,
};

/// How many shards the clusters here have.
const SHARDS: u16 = 16;
/// The daemon flags of every node here.
const FLAGS: &[&str] = &["--shards", "16"];
/// Concurrent writers in the workloads; each owns [`KEYS_PER_WRITER`] keys.
pub(crate) const WRITERS: usize = 3;
/// Keys each writer owns and writes in turn.
const KEYS_PER_WRITER: usize = 2;

/// The key writer `writer` owns as its `slot`th.
fn writer_key(writer: usize, slot: usize) -> String {
    format!("w{writer}-k{slot}")
}

/// One writer: puts `KEY=vN` with increasing N to its keys in turn, each through a random node
/// that is up, until told to stop; returns the histories of its keys.
fn writer(client: &Client, writer: usize, workload: &Workload) -> Vec<History> {
    let mut rng = Rng::new(writer as u64 + 1);
    let keys: Vec<String> = (0..KEYS_PER_WRITER)
        .map(|slot| writer_key(writer, slot))
        .collect();
    write_loop(client, &keys, workload, OP_TIMEOUT, || {
        workload.up.pick(&mut rng)
    })
}

/// Runs `faults` on this thread while [`WRITERS`] writers write through `client`'s nodes (the
/// ones `workload` holds up), then stops the writers and returns their histories. A panic in
/// `faults` is raised again once the writers have stopped.
pub(crate) fn under_writes(
    client: &Client,
    workload: &Workload,
    faults: impl FnOnce(),
) -> Vec<History> {
    thread::scope(|scope| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|number| scope.spawn(move || writer(client, number, workload)))
            .collect();
        let faults = std::panic::catch_unwind(std::panic::AssertUnwindSafe(faults));
        finish(&[workload], writers, faults)
    })
}

/// `put`, `get` and `del` through every node, in table and JSON form; a key over 1 KiB is
/// refused and changes nothing, a key of exactly 1 KiB works.
#[test]
fn put_get_del_through_any_node() {
    let cluster = Cluster::launch_with("kv-basic", 3, FLAGS);
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    // The daemon runs without transparent huge pages (node's `use_small_pages`).
    for node in cluster.nodes() {
        let status = std::fs::read_to_string(format!("/proc/{}/status", node.pid()))
            .expect("a node's /proc status");
        assert!(
            status
                .lines()
                .any(|line| line.split_whitespace().eq(["THP_enabled:", "0"])),
            "{} runs with transparent huge pages: {status}",
            node.id
        );
    }
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
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    let client = cluster.client();
    let workload = Workload::new(client.len());

    let histories = under_writes(&client, &workload, || {
        workload.wait_progress(WRITERS * 2, RECOVER_WITHIN, "the writers make progress");
        for round in 0..KILLS {
            let key = writer_key(round % WRITERS, round % KEYS_PER_WRITER);
            let asker = cluster.running()[0];
            let shard = shard_of(&cluster, asker, &key);
            let what = format!("shard {shard} (of {key}) has a leader that runs");
            let leader = wait_until(RECOVER_WITHIN, &what, || {
                let asker = cluster.running()[0];
                let hint = config(&cluster, asker, shard)?.leader;
                let Some(index) = hint.as_ref().map(|id| cluster.index_of(id)) else {
                    return Err(format!("{} names no leader", cluster.node(asker).id));
                };
                if !cluster.node(index).is_running() {
                    return Err(format!("{hint:?} does not run"));
                }
                // The hint may be stale: the leader must say so itself.
                match own_config(&cluster, index, shard)?.leader {
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
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
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
    let leader = cluster.index_of(&leader_id);
    let stopped: Vec<usize> = stopped_config
        .voters
        .iter()
        .filter(|id| **id != leader_id)
        .map(|id| cluster.index_of(id))
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
        || match own_config(&cluster, leader, shard)? {
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
/// `status` then lists no moving shard, and no acknowledged write is lost. The shards that
/// moved are exactly those whose target changed (issue 6: "the shards moved equal the diff"):
/// the leaders' `shard move started` log events during the join name every shard whose
/// replica set changed, and no other. And no write fails: the client library follows
/// `moved` answers itself ("client errors only as retried `moved`").
#[test]
fn a_fourth_node_joins_during_writes() {
    let mut cluster = Cluster::launch_with("kv-join", 3, FLAGS);
    let before = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    let client = cluster.client();
    let workload = Workload::new(client.len());
    let mut after = Vec::new();
    let mut logged_before = Vec::new();

    let histories = under_writes(&client, &workload, || {
        workload.wait_progress(WRITERS * 2, RECOVER_WITHIN, "the writers make progress");
        logged_before = (0..3).map(|index| cluster.log(index).len()).collect();
        let joiner = cluster.add_node("n3", None, FLAGS);
        cluster.start_joining(joiner, 0);
        cluster.wait_answering(joiner);
        cluster.wait_converged(CONVERGE_WITHIN);
        after = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
        let joined = voter_in(&after, "n3");
        eprintln!("n3 is a voter of {joined} of {SHARDS} shards");
        assert!(joined > 0, "n3 is in no shard's target: {after:?}");
        // Every config is its target; each leader then hands the joiner its shards (they
        // wait for that leader's last move), after which `status` (asking every node) lists
        // no move.
        wait_until(
            CONFIGS_SETTLE_WITHIN,
            "status lists no moving shard",
            || {
                let status = cluster.try_query(joiner, &["status"])?;
                let none = serde_json::json!([]);
                if status["moving"] == none && status["moving_unknown_from"] == none {
                    Ok(())
                } else {
                    Err(status.to_string())
                }
            },
        );
        workload.wait_progress(WRITERS, RECOVER_WITHIN, "writes after the join");
    });
    assert_every_key_acknowledged(&histories);
    // Read through all four nodes, the joiner included.
    check_histories(&cluster.client(), &histories);

    let replica_set = |config: &Config| {
        let mut set = config.target.clone();
        set.sort();
        set
    };
    let diff: BTreeSet<u16> = (0..SHARDS)
        .filter(|&shard| {
            replica_set(&before[usize::from(shard)]) != replica_set(&after[usize::from(shard)])
        })
        .collect();
    let moved = moves_logged_since(&cluster, &logged_before);
    eprintln!("the join's diff: {diff:?}; moves logged: {moved:?}");
    assert!(!diff.is_empty(), "a join changes some shard's replica set");
    assert_eq!(
        moved, diff,
        "the shards moved are the diff, all of them and only them"
    );
    // Each moved shard's new copy was compared with its leader's, and found equal.
    wait_until(
        Duration::from_secs(10),
        "every moved shard's copy is verified",
        || {
            let verified = shards_logged_since(&cluster, &logged_before, "shard copy verified");
            if verified == diff {
                Ok(())
            } else {
                Err(format!("verified {verified:?}"))
            }
        },
    );
    let differed = shards_logged_since(&cluster, &logged_before, "shard copy differs");
    assert!(differed.is_empty(), "copies differed: {differed:?}");
    // Each moved shard left one old copy behind, retired (the grace period is an hour).
    let status = cluster.query(0, &["status"]);
    let retired: u64 = status["nodes"]
        .as_array()
        .expect("status lists nodes")
        .iter()
        .map(|node| node["held"]["retired"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(retired, diff.len() as u64, "retired copies: {status}");
    // Correct peers send only well-formed replication messages for the spec's shards: no node
    // dropped one through the join (every node answered, so each reports its counters).
    for node in status["nodes"].as_array().expect("status lists nodes") {
        let dropped = &node["dropped"];
        assert!(
            dropped.is_object(),
            "{} reports what it dropped: {status}",
            node["id"]
        );
        for kind in ["malformed_replication_messages", "unknown_shard_messages"] {
            assert_eq!(
                dropped[kind].as_u64(),
                Some(0),
                "{} dropped {kind}: {status}",
                node["id"]
            );
        }
    }
    let failed = failed_attempts(&histories);
    // The client library follows `moved` itself: a join costs the writers no error at all.
    assert!(
        failed.is_empty(),
        "writes failed during the join (only retried `moved` is allowed): {failed:?}"
    );
}

/// The error of every write attempt in `histories` that was not acknowledged.
pub(crate) fn failed_attempts(histories: &[History]) -> Vec<&str> {
    histories
        .iter()
        .flat_map(|history| &history.attempts)
        .filter_map(|attempt| match &attempt.outcome {
            Outcome::Ok(_) => None,
            Outcome::Unavailable(error) | Outcome::Refused(error) | Outcome::Unknown(error) => {
                Some(error.as_str())
            }
        })
        .collect()
}

/// The shards of the `shard move started` events every node logged after the first
/// `logged_before[i]` bytes of node `i`'s log (a node not listed: from its start).
pub(crate) fn moves_logged_since(cluster: &Cluster, logged_before: &[usize]) -> BTreeSet<u16> {
    shards_logged_since(cluster, logged_before, "shard move started")
}

/// The shards of the lines saying `message` that every node logged after the first
/// `logged_before[i]` bytes of node `i`'s log (a node not listed: from its start).
pub(crate) fn shards_logged_since(
    cluster: &Cluster,
    logged_before: &[usize],
    message: &str,
) -> BTreeSet<u16> {
    let mut shards = BTreeSet::new();
    for index in 0..cluster.nodes().len() {
        let log = cluster.log(index);
        let since = logged_before
            .get(index)
            .copied()
            .unwrap_or(0)
            .min(log.len());
        shards.extend(shards_in(log.get(since..).unwrap_or_default(), message));
    }
    shards
}

/// The shards (`shard=N`) of the lines saying `message` in `log` (a node's log lines).
fn shards_in(log: &str, message: &str) -> BTreeSet<u16> {
    log.lines()
        .filter(|line| line.contains(message))
        .filter_map(|line| {
            let after = &line[line.find("shard=")? + "shard=".len()..];
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Five idle nodes: every shard's voters become its target (learners added and promoted, the
/// first node's surplus voter removed), as issue 5 asks of the join in
/// [`a_fourth_node_joins_during_writes`]; then `shard-info` asked of a node outside a shard
/// answers from one of its replicas.
#[test]
fn five_nodes_settle_every_shard_to_its_target() {
    let cluster = Cluster::launch_with("kv-settle", 5, FLAGS);
    let configs = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    // `shard-info` asked of a node that holds no replica answers from one that does.
    let settled = &configs[0];
    let outsider = (0..cluster.nodes().len())
        .find(|&index| !settled.voters.contains(&cluster.node(index).id))
        .expect("five nodes, three voters");
    let answer = cluster.query(outsider, &["shard-info", "0"]);
    let holders: Vec<String> = settled
        .voters
        .iter()
        .map(|id| cluster.node(cluster.index_of(id)).addr.to_string())
        .collect();
    let answered_by = answer["answered_by"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(holders.contains(&answered_by), "{answer}");
    assert_eq!(answer["state"], "stable", "{answer}");
    assert_eq!(
        answer["replicas"].as_array().map(Vec::len),
        Some(3),
        "{answer}"
    );
}
