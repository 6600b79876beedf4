//! PROTOCOL.md R9's opt-in leases (`--danger-lease-reads`) with real processes: a shard's
//! leader is frozen with SIGSTOP while one client keeps reading a key through it and another
//! keeps writing that key through the other nodes; the others elect a new leader and take the
//! writes; the old leader is thawed. Three rounds, each freezing whoever leads then. No read,
//! before, during or after, returns a value older than one acknowledged before the read
//! started, or one never written.
//!
//! What this cannot force: that a read reaches the thawed leader before its overdue timers
//! step it down (the race the lease's clock check decides). The deterministic harness
//! (`cluster/tests/it/leases.rs`) forces that race; this test checks what an operator running
//! with leases sees.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

use crate::configs::{CONFIGS_SETTLE_WITHIN, own_config, shard_of, wait_configs_match_target};
use crate::harness::{Cluster, wait_until};
use crate::workload::{OP_TIMEOUT, Outcome, RECOVER_WITHIN, Rng, Workload, finish, kv, write_loop};

/// The daemon flags of every node (16 shards, as in [`crate::kv`]).
const FLAGS: &[&str] = &["--shards", "16", "--danger-lease-reads"];
/// How many shards the cluster has.
const SHARDS: u16 = 16;
/// `--timeout` of a read, in seconds.
const READ_TIMEOUT: &str = "2";
/// How many times a leader is frozen.
const ROUNDS: usize = 3;

/// One acknowledged read.
#[derive(Debug)]
struct Read {
    /// The node asked.
    #[expect(dead_code, reason = "printed in failure messages")]
    through: usize,
    /// The value's number (`KEY=vN`), 0 for none.
    number: u64,
    started: Instant,
    ended: Instant,
}

/// The `N` of a value `KEY=vN` (0 for no value).
fn number(value: Option<&str>) -> u64 {
    value.map_or(0, |value| {
        let (_, n) = value.rsplit_once("=v").expect("a value KEY=vN");
        n.parse().expect("a value KEY=vN")
    })
}

/// The node that says it leads `shard`.
fn leader_of(cluster: &Cluster, shard: u16) -> usize {
    wait_until(RECOVER_WITHIN, "the shard has a leader", || {
        (0..cluster.nodes().len())
            .find(|&index| {
                own_config(cluster, index, shard)
                    .is_ok_and(|config| config.leader.as_ref() == Some(&cluster.node(index).id))
            })
            .ok_or_else(|| "no node says it leads".to_owned())
    })
}

#[test]
fn a_frozen_leader_under_a_lease_never_answers_a_stale_read() {
    let cluster = Cluster::launch_with("lease-freeze", 3, FLAGS);
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
    let key = "lease-key".to_owned();
    let shard = shard_of(&cluster, 0, &key);
    // The node the reader reads through and the writer writes around: the shard's leader.
    let leader = AtomicUsize::new(leader_of(&cluster, shard));

    let client = cluster.client();
    let writes = Workload::new(client.len());
    let reading = Workload::new(client.len());
    let reads = Mutex::new(Vec::new());
    let histories = thread::scope(|scope| {
        let (client, key, leader, reads) = (&client, &key, &leader, &reads);
        let writes_ref = &writes;
        let writer = scope.spawn(move || {
            let mut rng = Rng::new(1);
            let keys = [key.clone()];
            write_loop(client, &keys, writes_ref, OP_TIMEOUT, || {
                (leader.load(Ordering::SeqCst) + 1 + rng.below(2)) % 3
            })
        });
        let reading_ref = &reading;
        let reader = scope.spawn(move || {
            while !reading_ref.stop.load(Ordering::SeqCst) {
                let through = leader.load(Ordering::SeqCst);
                let started = Instant::now();
                let outcome = kv(client, through, &["get", key], READ_TIMEOUT);
                let ended = Instant::now();
                if let Outcome::Ok(value) = outcome {
                    let read = Read {
                        through,
                        number: number(value.as_deref()),
                        started,
                        ended,
                    };
                    reads.lock().expect("the reads").push(read);
                }
            }
            Vec::new()
        });
        let reads_since = |since: Instant| {
            let reads = reads.lock().expect("the reads");
            reads.iter().filter(|read| read.started >= since).count()
        };
        let faults = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for round in 0..ROUNDS {
                // Whoever leads the shard now (the previous round's freeze moved it).
                let frozen = leader_of(&cluster, shard);
                leader.store(frozen, Ordering::SeqCst);
                let id = &cluster.node(frozen).id;
                let since = Instant::now();
                writes.wait_progress(3, RECOVER_WITHIN, "writes are acknowledged");
                wait_until(
                    RECOVER_WITHIN,
                    "reads through the leader answer",
                    || match reads_since(since) {
                        0 => Err("none yet".to_owned()),
                        _ => Ok(()),
                    },
                );
                let froze = Instant::now();
                cluster.sigstop(frozen);
                writes.wait_progress(3, RECOVER_WITHIN, "writes while the leader is frozen");
                eprintln!(
                    "round {round}: {id} led shard {shard}; 3 writes acknowledged {:?} after it froze",
                    froze.elapsed()
                );
                cluster.sigcont(frozen);
                let thawed = Instant::now();
                wait_until(
                    RECOVER_WITHIN,
                    "reads after the thaw answer",
                    || match reads_since(thawed) {
                        count if count >= 3 => Ok(()),
                        count => Err(format!("{count} so far")),
                    },
                );
            }
        }));
        finish(&[&writes, &reading], vec![writer, reader], faults)
    });

    // Every read returned at least the newest value acknowledged before it started, and a
    // value some write had started to put before the read ended.
    let attempts = &histories[0].attempts;
    let reads = reads.into_inner().expect("the reads");
    let mut wrong = Vec::new();
    for read in &reads {
        let acked_before = attempts
            .iter()
            .filter(|attempt| attempt.outcome.is_ok() && attempt.ended < read.started)
            .map(|attempt| number(Some(&attempt.value)))
            .max()
            .unwrap_or(0);
        let attempted = attempts.iter().any(|attempt| {
            attempt.started < read.ended && number(Some(&attempt.value)) == read.number
        });
        if read.number < acked_before || (read.number > 0 && !attempted) {
            wrong.push(format!("{read:?}: v{acked_before} was acknowledged before"));
        }
    }
    eprintln!("{} reads, {} writes", reads.len(), attempts.len());
    assert!(wrong.is_empty(), "stale or unwritten reads: {wrong:?}");
}
