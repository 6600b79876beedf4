//! Issue 6: shards moving between nodes, under load and under real faults: a decommission
//! during writes, and `kill -9` of a move's target and of its source while moves are under
//! way.
//!
//! The clusters here run with `--shards 16` (see `kv.rs`).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::configs::{CONFIGS_SETTLE_WITHIN, voter_in, wait_configs_match_target};
use crate::harness::{CONVERGE_WITHIN, Cluster, members, wait_check_passes, wait_until};
use crate::kv::{WRITERS, failed_attempts, moves_logged_since, under_writes};
use crate::workload::{
    History, RECOVER_WITHIN, Workload, assert_every_key_acknowledged, check_histories,
};

/// How many shards the clusters here have.
const SHARDS: u16 = 16;
/// The daemon flags of every node here.
const FLAGS: &[&str] = &["--shards", "16"];

/// Decommission during writes (issue 6): `node leave --wait` against a fourth node moves every
/// replica it holds to the three others and returns once the node left; the node exits 0, the
/// others list it as `left`, no shard's config names it, and every acknowledged write reads
/// back through the three. The shards moved (the leaders' `shard move started` events) are
/// exactly those n3 was a voter of, and no write sent through the three others failed.
#[test]
fn a_node_decommissioned_during_writes_hands_over_and_exits_0() {
    let mut cluster = Cluster::launch_with("kv-leave", 4, FLAGS);
    let before = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    let leaver = cluster.index_of("n3");
    let client = cluster.client();
    let workload = Workload::new(client.len());
    let mut logged_before = Vec::new();

    let histories = under_writes(&client, &workload, || {
        workload.wait_progress(WRITERS * 2, RECOVER_WITHIN, "the writers make progress");
        logged_before = (0..4).map(|index| cluster.log(index).len()).collect();
        let status = cluster.query(leaver, &["status"]);
        let held = status["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|node| node["id"] == "n3"))
            .map(|node| node["held"]["shards"].as_u64().unwrap_or(0));
        assert!(
            held > Some(0),
            "n3 holds replicas before it leaves: {status}"
        );
        let output = cluster
            .cli(
                leaver,
                &["leave", "--wait", "--wait-timeout", "120"],
                "json",
            )
            .expect("node leave runs");
        workload.up.set(leaver, false);
        let answer = output
            .json()
            .unwrap_or_else(|error| panic!("node leave: {error}"));
        assert_eq!(answer["left"], true, "{answer}");
        let exit = cluster.wait_exit(leaver, Duration::from_secs(10));
        assert!(exit.success(), "n3 exits 0 after its leave: {exit}");
        let members = members(&cluster.query(0, &["members"])).expect("members");
        let n3 = members.iter().find(|member| member.id == "n3");
        assert_eq!(
            n3.map(|member| member.state.as_str()),
            Some("left"),
            "{members:?}"
        );
        let configs = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
        for config in &configs {
            assert!(
                !config.voters.iter().any(|id| id == "n3") && config.voters.len() == 3,
                "{config:?}"
            );
        }
        workload.wait_progress(WRITERS, RECOVER_WITHIN, "writes after the leave");
    });
    assert_every_key_acknowledged(&histories);
    check_histories(&cluster.client().without(leaver), &histories);

    let held: BTreeSet<u16> = (0..SHARDS)
        .filter(|&shard| {
            before[usize::from(shard)]
                .voters
                .iter()
                .any(|id| id == "n3")
        })
        .collect();
    let moved = moves_logged_since(&cluster, &logged_before);
    eprintln!("n3 held {held:?}; moves logged: {moved:?}");
    assert_eq!(
        moved, held,
        "the shards moved are the ones n3 held, all and only those"
    );
    // Writes the writers sent through n3 itself fail once it is gone (the CLI has no other
    // seed); those sent through the others never fail.
    let through_others: Vec<History> = histories
        .iter()
        .map(|history| History {
            key: history.key.clone(),
            attempts: history
                .attempts
                .iter()
                .filter(|attempt| attempt.node != leaver)
                .cloned()
                .collect(),
        })
        .collect();
    let failed = failed_attempts(&through_others);
    assert!(
        failed.is_empty(),
        "writes through n0..n2 failed during the leave (only retried `moved` is allowed): {failed:?}"
    );
}

/// One move at a time per leading node, so that a join of a loaded cluster lasts long enough
/// to be caught part way.
const ONE_MOVE_AT_A_TIME: &[&str] = &["--shards", "16", "--max-moves", "1"];

/// Writes `key:0 .. key:<keys-1>`, `value_size` bytes of `x` each, through node 0 (`node
/// bench --sequential`). A run with writes left `indeterminate` (a leader change on two loaded
/// cores) is run again: the writes are idempotent.
fn fill(cluster: &Cluster, keys: u64, value_size: usize) {
    let (keys_arg, size_arg) = (keys.to_string(), value_size.to_string());
    let args = [
        "bench",
        "--sequential",
        "--keys",
        &keys_arg,
        "--requests",
        &keys_arg,
        "--value-size",
        &size_arg,
        "--clients",
        "2",
        "--pipeline",
        "2",
        "--timeout",
        "10",
    ];
    for _ in 0..5 {
        let report = cluster.query(0, &args);
        if report["writes"]["ok"].as_u64() == Some(keys) {
            return;
        }
        eprintln!(
            "the fill again after: {} ({})",
            report["writes"], report["first_error"]
        );
    }
    panic!("five fills of {keys} keys left some unacknowledged");
}

/// `status` through node `asker` until a move whose `joining` names `node` is sending a
/// snapshot (its `copied` is set); returns that move's leader.
fn wait_snapshot_to(cluster: &Cluster, asker: usize, node: &str) -> String {
    let what = format!("a snapshot is on its way to {node}");
    wait_until(CONVERGE_WITHIN, &what, || {
        let status = cluster.try_query(asker, &["status"])?;
        let moving = status["moving"].as_array().cloned().unwrap_or_default();
        moving
            .iter()
            .find(|m| {
                m["joining"]
                    .as_array()
                    .is_some_and(|j| j.iter().any(|id| id == node))
            })
            .and_then(|m| m["leader"].as_str().map(str::to_owned))
            .ok_or_else(|| format!("no move to {node}: {}", status["moving"]))
    })
}

/// Keys held, summed over the nodes `status` lists (each counts its own replicas).
fn keys_held(status: &Value) -> u64 {
    status["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n["held"]["keys"].as_u64())
                .sum()
        })
        .unwrap_or(0)
}

/// A fourth node joins three loaded ones (1.25 MB per shard: two snapshot chunks), one move at a
/// time per leader; while a snapshot is on its way to it, it is killed with `kill -9` and
/// restarted, then the leader sending it one is killed and restarted. The moves complete: every shard's voters are its target, `node check`
/// finds every replica pair at equal applied index equal, every key has its three copies, and
/// keys read back.
#[test]
fn moves_complete_after_kill9_of_their_target_and_of_their_source() {
    const KEYS: u64 = 2500;
    const VALUE_SIZE: usize = 8000;
    let mut cluster = Cluster::launch_with("moves-kill", 3, ONE_MOVE_AT_A_TIME);
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    fill(&cluster, KEYS, VALUE_SIZE);
    let joiner = cluster.add_node("n3", None, ONE_MOVE_AT_A_TIME);
    cluster.start_joining(joiner, 0);

    let leader = wait_snapshot_to(&cluster, 0, "n3");
    eprintln!("kill -9 of the target n3 while {leader} sends it a snapshot");
    cluster.kill9(joiner);
    cluster.restart(joiner);

    let leader = wait_snapshot_to(&cluster, 0, "n3");
    let source = cluster.index_of(&leader);
    eprintln!("kill -9 of the source {leader} while it sends n3 a snapshot");
    cluster.kill9(source);
    cluster.restart(source);

    cluster.wait_converged(CONVERGE_WITHIN);
    let configs = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    let joined = voter_in(&configs, "n3");
    assert!(joined > 0, "n3 is in no shard's config: {configs:?}");
    wait_until(RECOVER_WITHIN, "`node check` passes", || {
        let answer = cluster.try_query(0, &["check"])?;
        let status = cluster.try_query(0, &["status"])?;
        if answer["ok"] != true {
            return Err(answer.to_string());
        }
        // Exactly three copies of every key: a copy removed while its node was down or its
        // leader killed is told `Removed` when it stands (`docs/protocol.md`, R8), even by a
        // leader whose base hides the config that dropped it; its copy is then retired.
        let held = keys_held(&status);
        if held != 3 * KEYS {
            return Err(format!("{held} keys held in all, not {}", 3 * KEYS));
        }
        Ok(())
    });
    let value = "x".repeat(VALUE_SIZE);
    for key in (0..KEYS).step_by(251) {
        let key = format!("key:{key}");
        let read = cluster.query(3, &["get", &key]);
        assert_eq!(
            read["value"].as_str(),
            Some(value.as_str()),
            "{key}: {read}"
        );
    }
}

/// Churn (issue 6): under writes, nodes join and leave one after another: a fourth node joins
/// and settles, then leaves with `node leave --wait`, then another, for [`CHURN_ROUNDS`]
/// rounds. Nothing acknowledged is lost, reads see the last acknowledged values, and `node
/// check` passes at the end.
#[test]
fn churn_of_joins_and_leaves_under_writes_loses_nothing() {
    const CHURN_ROUNDS: usize = 3;
    let mut cluster = Cluster::launch_with("moves-churn", 3, FLAGS);
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    // The writers go through the three nodes that stay.
    let client = cluster.client();
    let workload = Workload::new(client.len());

    let histories = under_writes(&client, &workload, || {
        workload.wait_progress(WRITERS * 2, RECOVER_WITHIN, "the writers make progress");
        for round in 0..CHURN_ROUNDS {
            let id = format!("c{round}");
            let index = cluster.add_node(&id, None, FLAGS);
            cluster.start_joining(index, round % 3);
            cluster.wait_answering(index);
            let configs = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
            let joined = voter_in(&configs, &id);
            eprintln!("round {round}: {id} joined {joined} of {SHARDS} shards");
            assert!(joined > 0, "{id} is in no shard's config: {configs:?}");
            let output = cluster
                .cli(index, &["leave", "--wait", "--wait-timeout", "120"], "json")
                .expect("node leave runs");
            let answer = output
                .json()
                .unwrap_or_else(|error| panic!("node leave: {error}"));
            assert_eq!(answer["left"], true, "{answer}");
            let exit = cluster.wait_exit(index, Duration::from_secs(10));
            assert!(exit.success(), "{id} exits 0 after its leave: {exit}");
            workload.wait_progress(WRITERS, RECOVER_WITHIN, "writes after the leave");
        }
        let configs = wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
        assert!(
            configs.iter().all(|config| config.voters.len() == 3
                && config.voters.iter().all(|id| id.starts_with('n'))),
            "only the three first nodes hold shards at the end: {configs:?}"
        );
        wait_check_passes(&cluster, RECOVER_WITHIN);
    });
    assert_every_key_acknowledged(&histories);
    check_histories(&client, &histories);
}
