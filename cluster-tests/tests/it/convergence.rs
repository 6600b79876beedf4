//! A healthy cluster: every node sees the same members and the same table, the one the
//! libraries compute, and `check` says so.

use std::thread;
use std::time::Duration;

use serde_json::Value;

use crate::configs::shard_of;
use crate::harness::{
    CONVERGE_WITHIN, Cluster, digest, members, owners, string_field, wait_check_passes, wait_until,
};
use crate::{expected_owners, expected_table};

/// How many shards the test clusters have.
const SHARDS: u16 = crate::harness::DEFAULT_SHARDS;

/// How many `shard-info` calls run at once: each is a process spawn plus a QUIC handshake,
/// partly waiting; two in flight keep two cores busy without starving concurrent tests.
const CLI_WORKERS: usize = 2;

/// A sample of shards to ask `shard-info` about: every `stride`-th shard from `start`, so
/// different nodes can cover different shards, plus the first, the last and shard 42. Digest
/// comparisons cover whole tables; the samples check that `shard-info` reads that table.
fn sample(start: u16, stride: u16) -> Vec<u16> {
    let mut shards: Vec<u16> = (start..SHARDS).step_by(usize::from(stride)).collect();
    shards.extend([0, 42, SHARDS - 1]);
    shards.sort_unstable();
    shards.dedup();
    shards
}

/// `shard-info SHARD` from node `index` for every shard of `shards`, in order.
fn shard_infos(cluster: &Cluster, index: usize, shards: &[u16]) -> Vec<Value> {
    let chunk = shards.len().div_ceil(CLI_WORKERS).max(1);
    thread::scope(|scope| {
        let workers: Vec<_> = shards
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|shard| cluster.query(index, &["shard-info", &shard.to_string()]))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().expect("a shard-info worker"))
            .collect()
    })
}

/// Five nodes agree on members, digest and every sampled shard's owners.
///
/// Sampling: every `shard-info` is a process spawn (about 10 ms), so `n0` and `n1` are asked
/// about all 1024 shards and `n2`..`n4` about every 20th (about 55 shards each, at different
/// offsets); equal digests prove the rest of their tables equal.
#[test]
fn five_nodes_converge() {
    let cluster = Cluster::launch("converge", 5);
    let ids: Vec<&str> = cluster
        .nodes()
        .iter()
        .map(|node| node.id.as_str())
        .collect();

    // Every node lists every member alive at its address. Polled: the launch waited for
    // that once, but the shards' first moves load the two cores, and a node whose loop
    // stalls for a probe's timeout is suspected until it answers again (it is never down).
    wait_until(
        CONVERGE_WITHIN,
        "every node lists every member alive",
        || {
            for index in 0..5 {
                let members = members(&cluster.try_query(index, &["members"])?)?;
                let seen: Vec<(&str, &str)> = members
                    .iter()
                    .map(|member| (member.id.as_str(), member.state.as_str()))
                    .collect();
                let expected: Vec<(&str, &str)> = ids.iter().map(|&id| (id, "alive")).collect();
                if seen != expected {
                    return Err(format!("{} sees {seen:?}", ids[index]));
                }
                for member in &members {
                    let node = cluster.nodes().iter().find(|node| node.id == member.id);
                    assert_eq!(
                        member.addr,
                        node.unwrap().addr.to_string(),
                        "address of {} seen by {}",
                        member.id,
                        ids[index]
                    );
                }
            }
            Ok(())
        },
    );

    let digests: Vec<String> = (0..5)
        .map(|index| digest(&cluster.query(index, &["status"])).unwrap())
        .collect();
    assert!(
        digests.iter().all(|digest| *digest == digests[0]),
        "digests differ: {digests:?}"
    );

    // What n0 answers is the reference; every other node must answer the same.
    let reference: Vec<(u16, Value)> = {
        let shards = sample(0, 1);
        shards
            .iter()
            .copied()
            .zip(shard_infos(&cluster, 0, &shards))
            .collect()
    };
    for (shard, answer) in &reference {
        assert_eq!(
            answer["shard"].as_u64(),
            Some(u64::from(*shard)),
            "{answer}"
        );
        assert_eq!(digest(answer).unwrap(), digests[0], "shard {shard} from n0");
        let (leader, replicas) = owners(answer).unwrap();
        assert_eq!(replicas.len(), 3, "shard {shard} from n0: {answer}");
        assert_eq!(
            leader.as_ref(),
            replicas.first(),
            "shard {shard} from n0: {answer}"
        );
    }
    for index in 1..5u16 {
        let shards = if index == 1 {
            sample(0, 1)
        } else {
            sample(index, 20)
        };
        let index = usize::from(index);
        for (shard, answer) in shards.iter().zip(shard_infos(&cluster, index, &shards)) {
            let (_, reference) = reference
                .iter()
                .find(|(known, _)| known == shard)
                .expect("n0 was asked about every shard");
            assert_eq!(
                owners(&answer).unwrap(),
                owners(reference).unwrap(),
                "shard {shard}: {} and n0 disagree",
                ids[index]
            );
            assert_eq!(
                digest(&answer).unwrap(),
                digests[0],
                "shard {shard} from {}",
                ids[index]
            );
        }
    }
}

/// The live table is the one `shardtable` computes for the members: same digest, same leader
/// and replicas in the same order, same leader counts.
#[test]
fn live_placement_matches_shardtable() {
    let cluster = Cluster::launch("placement", 5);
    let ids: Vec<&str> = cluster
        .nodes()
        .iter()
        .map(|node| node.id.as_str())
        .collect();
    let table = expected_table(ids.iter().copied());

    for (index, observer) in ids.iter().enumerate() {
        let status = cluster.query(index, &["status"]);
        assert_eq!(
            digest(&status).unwrap(),
            table.digest().to_string(),
            "digest of {observer} against the library's",
        );
        assert_eq!(
            status["shards"].as_u64(),
            Some(u64::from(SHARDS)),
            "{status}"
        );
        assert_eq!(status["replication_factor"].as_u64(), Some(3), "{status}");
        let leads = table.leader_counts();
        for node in status["nodes"].as_array().expect("a `nodes` array") {
            let id = string_field(node, "id").unwrap();
            let position = table
                .members()
                .iter()
                .position(|member| member.as_str() == id)
                .unwrap_or_else(|| panic!("{id} is not a member: {status}"));
            assert_eq!(
                node["leads"].as_u64(),
                Some(u64::from(leads[position])),
                "shards {id} leads, seen by {observer}",
            );
        }
    }

    for index in 0..5u16 {
        let shards = sample(index, 16);
        let index = usize::from(index);
        for (shard, answer) in shards.iter().zip(shard_infos(&cluster, index, &shards)) {
            assert_eq!(
                owners(&answer).unwrap(),
                expected_owners(&table, *shard),
                "shard {shard} from {} against the library",
                ids[index]
            );
            let replicas = answer["replicas"].as_array().expect("a `replicas` array");
            // `replicas` is the shard's actual config as this node's replica knows it (moves
            // may still be under way): every address right, at most one leader, listed first.
            for (position, replica) in replicas.iter().enumerate() {
                let role = replica["role"].as_str();
                assert!(
                    matches!(role, Some("leader" | "follower" | "learner")),
                    "shard {shard}: {answer}"
                );
                assert!(
                    role != Some("leader") || position == 0,
                    "shard {shard}: {answer}"
                );
                let id = string_field(replica, "id").unwrap();
                let node = cluster.nodes().iter().find(|node| node.id == id).unwrap();
                assert_eq!(
                    replica["addr"].as_str(),
                    Some(node.addr.to_string().as_str()),
                    "shard {shard}: {answer}"
                );
            }
            if replicas.first().is_some_and(|r| r["role"] == "leader") {
                assert_eq!(answer["leader"]["addr"], replicas[0]["addr"], "{answer}");
            }
        }
    }
}

/// `node check` compares the replicas' state digests at equal applied index: a replica whose
/// stored state was changed behind the log's back (its redb file edited while its node was
/// stopped, at the layout `node/src/store.rs` gives the `kv` table) is named, with the shard
/// and the applied index, and no other shard is.
#[test]
fn check_names_replicas_whose_states_differ() {
    let mut cluster = Cluster::launch("check-differs", 3);
    wait_check_passes(&cluster, CONVERGE_WITHIN);
    let put = cluster
        .cli(0, &["put", "check-key", "written"], "table")
        .unwrap();
    assert!(put.status.success(), "put: {put:?}");
    let shard = shard_of(&cluster, 0, "check-key");
    let victim = 2;
    let victim_id = cluster.node(victim).id.clone();
    // The victim must have applied the write before it stops: applied later, from its log,
    // the write would replace the edited value.
    let own_applied = |cluster: &Cluster, index: usize| -> Result<u64, String> {
        let answer = cluster.try_query(index, &["shard-info", &shard.to_string()])?;
        let id = &cluster.node(index).id;
        answer["replicas"]
            .as_array()
            .and_then(|replicas| replicas.iter().find(|r| r["id"] == id.as_str()))
            .and_then(|replica| replica["index"].as_u64())
            .ok_or_else(|| format!("no index of {id}'s own replica: {answer}"))
    };
    wait_until(CONVERGE_WITHIN, "the victim applied the write", || {
        let applied = (0..3)
            .map(|index| own_applied(&cluster, index))
            .collect::<Result<Vec<u64>, String>>()?;
        if applied.iter().all(|&index| index == applied[0]) {
            Ok(())
        } else {
            Err(format!("applied indexes {applied:?}"))
        }
    });
    // SIGTERM: the node folds what it committed into redb before it exits.
    cluster.sigterm(victim);
    let status = cluster.wait_exit(victim, Duration::from_secs(20));
    assert!(status.success(), "{victim_id} exited with {status}");
    {
        const KV: redb::TableDefinition<(u16, &[u8]), &[u8]> = redb::TableDefinition::new("kv");
        let db = redb::Database::open(cluster.node(victim).data_dir.join("shards.redb"))
            .expect("open the victim's store");
        let txn = db.begin_write().expect("a write transaction");
        {
            let mut kv = txn.open_table(KV).expect("the kv table");
            let old = kv
                .insert((shard, &b"check-key"[..]), &b"tampered"[..])
                .expect("edit the value");
            assert_eq!(
                old.map(|value| value.value().to_vec()),
                Some(b"written".to_vec()),
                "the victim's stored value before the edit"
            );
        }
        txn.commit().expect("commit the edit");
    }
    cluster.restart(victim);
    let message = wait_until(
        CONVERGE_WITHIN,
        "`node check` names the edited replica",
        || {
            // A failing check exits 1, with its JSON on stdout.
            let output = cluster.cli(0, &["check"], "json")?;
            let answer: Value = serde_json::from_str(&output.stdout)
                .map_err(|error| format!("not JSON ({error}): {output:?}"))?;
            let failed: Vec<String> = answer["checks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|check| check["ok"] == false)
                .filter_map(|check| check["message"].as_str().map(str::to_owned))
                .collect();
            match failed.iter().find(|message| message.contains("differ at")) {
                Some(_) => Ok(failed),
                None => Err(answer.to_string()),
            }
        },
    );
    let differing: Vec<&String> = message.iter().filter(|m| m.contains("differ at")).collect();
    assert!(
        differing
            .iter()
            .all(|m| m.starts_with(&format!("shard {shard}: ")) && m.contains(&victim_id)),
        "{message:?}"
    );
}

/// `node check` on a new cluster: it fails until every shard has an elected leader whose
/// voters are placement's target (members converging is not enough) and every leadership has
/// passed to placement's leader (a handoff leaves its shard without an elected leader for a
/// moment), then passes on every node: exit 0, only `[OK]` lines; JSON `ok: true`.
#[test]
fn check_reports_ok() {
    let cluster = Cluster::launch("check", 3);
    wait_check_passes(&cluster, CONVERGE_WITHIN);
    for index in 0..3 {
        let table = cluster.cli(index, &["check"], "table").unwrap();
        assert!(table.status.success(), "check failed: {table:?}");
        let lines: Vec<&str> = table
            .stdout
            .lines()
            .filter(|line| !line.trim().is_empty())
            .collect();
        assert!(!lines.is_empty(), "no checks printed: {table:?}");
        assert!(
            lines.iter().all(|line| line.starts_with("[OK]")),
            "not all [OK]: {}",
            table.stdout
        );

        let json = cluster.query(index, &["check"]);
        assert_eq!(json["version"], 1, "{json}");
        assert_eq!(json["ok"], true, "{json}");
        let checks = json["checks"].as_array().expect("a `checks` array");
        assert!(!checks.is_empty(), "{json}");
        assert!(checks.iter().all(|check| check["ok"] == true), "{json}");
    }
}
