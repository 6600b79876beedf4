//! Faults injected with real signals: `kill -9`, SIGTERM, SIGSTOP and SIGCONT.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::{CONVERGE_WITHIN, Cluster, Member, digest, members, owners, wait_until};
use crate::{expected_owners, expected_table};

/// How long survivors may take to see a killed node `down` and move its shards.
const FAILOVER_WITHIN: Duration = Duration::from_secs(10);

/// The state node `index` lists `id` in, `None` when it does not list it.
fn state_of(cluster: &Cluster, index: usize, id: &str) -> Result<Option<Member>, String> {
    let members = members(&cluster.try_query(index, &["members"])?)?;
    Ok(members.into_iter().find(|member| member.id == id))
}

/// Waits until every node of `observers` lists `id` as `state`.
fn wait_state(cluster: &Cluster, observers: &[usize], id: &str, state: &str, within: Duration) {
    let what = format!("{observers:?} list {id} as {state}");
    wait_until(within, &what, || {
        for &index in observers {
            let seen = state_of(cluster, index, id)?;
            if seen.as_ref().map(|member| member.state.as_str()) != Some(state) {
                return Err(format!("{} lists {seen:?}", cluster.node(index).id));
            }
        }
        Ok(())
    });
}

/// Waits until every node of `observers` reports `expected` as its digest.
fn wait_digest(cluster: &Cluster, observers: &[usize], expected: &str, within: Duration) {
    let what = format!("{observers:?} report digest {expected}");
    wait_until(within, &what, || {
        for &index in observers {
            let seen = digest(&cluster.try_query(index, &["status"])?)?;
            if seen != expected {
                return Err(format!("{} reports {seen}", cluster.node(index).id));
            }
        }
        Ok(())
    });
}

/// The ids of the nodes at `indices`.
fn ids(cluster: &Cluster, indices: &[usize]) -> Vec<String> {
    indices
        .iter()
        .map(|&index| cluster.node(index).id.clone())
        .collect()
}

/// Killing shard 42's leader with SIGKILL: every survivor soon names the leader the library
/// computes for the four survivors, and lists the dead node as `down`.
#[test]
fn kill9_leader_promotes_next_replica() {
    let mut cluster = Cluster::launch("kill9", 5);
    let (leader, replicas) = owners(&cluster.query(0, &["shard-info", "42"])).unwrap();
    let leader = leader.expect("shard 42 has a leader");
    let victim = cluster
        .nodes()
        .iter()
        .position(|node| node.id == leader)
        .unwrap();

    cluster.kill9(victim);
    let survivors = cluster.running();
    let survivor_ids = ids(&cluster, &survivors);
    let table = expected_table(survivor_ids.iter().map(String::as_str));
    let (expected_leader, expected_replicas) = expected_owners(&table, 42);
    assert_ne!(expected_leader.as_deref(), Some(leader.as_str()));

    let what = format!(
        "every survivor names {expected_leader:?} leader of shard 42 (was {leader}, replicas {replicas:?})"
    );
    wait_until(FAILOVER_WITHIN, &what, || {
        for &index in &survivors {
            let seen = owners(&cluster.try_query(index, &["shard-info", "42"])?)?;
            if seen.0 != expected_leader {
                return Err(format!("{} answers {seen:?}", cluster.node(index).id));
            }
        }
        Ok(())
    });
    wait_state(&cluster, &survivors, &leader, "down", FAILOVER_WITHIN);
    for &index in &survivors {
        let seen = owners(&cluster.query(index, &["shard-info", "42"])).unwrap();
        assert_eq!(
            seen,
            (expected_leader.clone(), expected_replicas.clone()),
            "shard 42 on {}",
            cluster.node(index).id
        );
    }
    wait_digest(
        &cluster,
        &survivors,
        &table.digest().to_string(),
        FAILOVER_WITHIN,
    );
}

/// A node killed with SIGKILL and started again on its data dir comes back with a higher
/// generation, and the table returns to the original five-node table.
#[test]
fn restarted_node_rejoins_with_new_generation() {
    let mut cluster = Cluster::launch("restart", 5);
    let victim = 3;
    let victim_id = cluster.node(victim).id.clone();
    let original = digest(&cluster.query(0, &["status"])).unwrap();
    let before = state_of(&cluster, 0, &victim_id)
        .unwrap()
        .expect("n0 lists the victim")
        .generation;

    cluster.kill9(victim);
    let survivors = cluster.running();
    wait_state(&cluster, &survivors, &victim_id, "down", FAILOVER_WITHIN);

    cluster.restart(victim);
    cluster.wait_answering(victim);
    let everyone = cluster.running();
    let what = format!("every node lists {victim_id} alive with a generation above {before}");
    wait_until(CONVERGE_WITHIN, &what, || {
        for &index in &everyone {
            match state_of(&cluster, index, &victim_id)? {
                Some(member) if member.state == "alive" && member.generation > before => {}
                seen => return Err(format!("{} lists {seen:?}", cluster.node(index).id)),
            }
        }
        Ok(())
    });
    cluster.wait_converged(CONVERGE_WITHIN);
    wait_digest(&cluster, &everyone, &original, CONVERGE_WITHIN);
}

/// SIGTERM: the node says goodbye and exits 0; within two seconds of the signal every other
/// node lists it as `left`, and the table is the survivors'.
#[test]
fn sigterm_leave_seen_as_left_within_2s() {
    let mut cluster = Cluster::launch("sigterm", 4);
    let victim = 2;
    let victim_id = cluster.node(victim).id.clone();
    let others: Vec<usize> = cluster
        .running()
        .into_iter()
        .filter(|&index| index != victim)
        .collect();

    let signalled = Instant::now();
    cluster.sigterm(victim);
    let deadline = signalled + Duration::from_secs(2);
    wait_state(
        &cluster,
        &others,
        &victim_id,
        "left",
        deadline.saturating_duration_since(Instant::now()),
    );
    let status = cluster.wait_exit(victim, Duration::from_secs(10));
    assert!(
        status.success(),
        "{victim_id} exited with {status} after SIGTERM"
    );

    let table = expected_table(ids(&cluster, &others).iter().map(String::as_str));
    wait_digest(
        &cluster,
        &others,
        &table.digest().to_string(),
        FAILOVER_WITHIN,
    );
    // Still `left`, not re-declared `down` later.
    wait_state(&cluster, &others, &victim_id, "left", Duration::ZERO);
}

/// A node frozen for 300 ms is not declared `down` by anyone and the table does not change.
#[test]
fn short_pause_declares_no_one_down() {
    let cluster = Cluster::launch("pause", 4);
    let everyone = cluster.running();
    let original = digest(&cluster.query(0, &["status"])).unwrap();
    let paused = 1;

    cluster.sigstop(paused);
    // The fault itself, not a wait for readiness: the node is frozen this long.
    thread::sleep(Duration::from_millis(300));
    cluster.sigcont(paused);

    let watch_until = Instant::now() + Duration::from_secs(3);
    let mut rounds = 0;
    while Instant::now() < watch_until {
        for &index in &everyone {
            let observer = &cluster.node(index).id;
            let members = members(&cluster.query(index, &["members"])).unwrap();
            let gone: Vec<&Member> = members
                .iter()
                .filter(|member| member.state == "down" || member.state == "left")
                .collect();
            assert!(
                gone.is_empty(),
                "{observer} lists {gone:?} after a 300 ms pause (round {rounds})"
            );
            assert_eq!(
                members.len(),
                everyone.len(),
                "{observer} lists {members:?}"
            );
            let digest = digest(&cluster.query(index, &["status"])).unwrap();
            assert_eq!(
                digest, original,
                "{observer}'s digest changed (round {rounds})"
            );
        }
        rounds += 1;
    }
    cluster.wait_converged(Duration::from_secs(5));
}

/// Every node killed, then all started again without `--join`: each tries the peers it saved
/// in its data dir, and they find each other again (new generations, the original table).
#[test]
fn a_whole_cluster_restarted_without_join_finds_itself_again() {
    let mut cluster = Cluster::launch("restart-all", 3);
    let original = digest(&cluster.query(0, &["status"])).unwrap();
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
    wait_digest(&cluster, &[0, 1, 2], &original, CONVERGE_WITHIN);
}
