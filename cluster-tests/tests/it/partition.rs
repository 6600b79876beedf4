//! Issue 5: a shard's leader cut off from its peers while clients still reach it stops
//! acknowledging within its check-quorum timeout, the majority side elects another replica,
//! and after healing every acknowledged write is present.
//!
//! The cluster runs in a network namespace of the test's own ([`Netns`]); the cut is one
//! nftables table there that drops UDP between the leader's port and its peers' ports, both
//! ways. Each node has a single UDP socket, its QUIC endpoint, which serves and also makes the
//! node's own connections to peers (`transport::Endpoint::bind`), so every packet between two
//! nodes goes from one node port to another; a CLI's packets come from an ephemeral port and
//! still reach every node, the cut-off leader included.
//!
//! The writers through the cut-off leader run their CLI processes in group [`CONFINED_GID`],
//! and the cut also drops their packets to the other nodes (marked on output with `meta
//! skgid`, dropped on input): whatever such a writer is told during the cut, the old leader
//! told it. (A stepped-down leader's `shard-for` names placement's leader, which may be another
//! node; without the mark a writer could be sent on to the new leader and its ack could not be
//! told apart.)

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use shardtable::ShardCount;

use crate::configs::{
    CONFIGS_SETTLE_WITHIN, own_config, settled_config, shard_of, wait_configs_match_target,
};
use crate::harness::{CONVERGE_WITHIN, Cluster, members, wait_check_passes, wait_until};
use crate::netns::Netns;
use crate::workload::{
    Attempt, History, OP_TIMEOUT, RECOVER_WITHIN, Rng, Workload, assert_every_key_acknowledged,
    check_histories, finish, write_loop,
};

/// How many shards the cluster has (as in [`crate::kv`]: few shards keep two cores idle enough).
const SHARDS: u16 = 16;
/// The daemon flags of every node.
const FLAGS: &[&str] = &["--shards", "16"];
/// How soon after the cut the old leader must have stopped acknowledging: check-quorum steps
/// it down once a majority has not acknowledged within `t_elect` (300 ms), checked every
/// heartbeat (100 ms); the rest is margin for debug builds on two loaded cores.
const STOP_ACKING_WITHIN: Duration = Duration::from_secs(2);
/// How long the majority side may take to elect a leader (the poll's deadline; the time taken
/// is printed).
const ELECT_WITHIN: Duration = Duration::from_secs(10);
/// How soon after the cut a write through one of the majority's nodes, started after the cut,
/// must have been acknowledged: the election (about half a second) plus a client's retries
/// (backoffs of at most 200 ms, each asking its node again where the shard leads), with margin.
const MAJORITY_ACKS_WITHIN: Duration = Duration::from_secs(4);
/// The group of the CLI processes of the writers through the cut-off leader. Any gid no other
/// process of the namespace runs with; it need not exist in /etc/group.
const CONFINED_GID: u32 = 47_474;
/// The packet mark of a confined writer's packet to a node other than the cut-off leader.
const CONFINED_MARK: u32 = 0x5107;
/// The nftables table of the cut, in the test's namespace only.
const CUT_TABLE: &str = "slotring_partition";
/// `--timeout` of the writes through the cut-off leader, in seconds: short, so that several
/// attempts start after the cut plus [`STOP_ACKING_WITHIN`] and finish before the heal.
const CONFINED_TIMEOUT: &str = "2";
/// Writers through the cut-off leader; each owns [`KEYS_PER_WRITER`] keys of the shard.
const CONFINED_WRITERS: usize = 2;
/// Keys each writer owns and writes in turn.
const KEYS_PER_WRITER: usize = 2;
/// Keys of the writer of other shards (each of another shard).
const OTHER_KEYS: usize = 4;

/// The rules of the cut: UDP between `leader_port` and `peer_ports` dropped both ways, and the
/// confined writers' packets to the peers too. Every drop counts its packets.
fn cut_rules(leader_port: u16, peer_ports: &[u16]) -> String {
    let peers = peer_ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "table inet {CUT_TABLE} {{
            chain output {{
                type filter hook output priority 0; policy accept;
                meta skgid {CONFINED_GID} udp dport {{ {peers} }} meta mark set {CONFINED_MARK}
            }}
            chain input {{
                type filter hook input priority 0; policy accept;
                udp sport {leader_port} udp dport {{ {peers} }} counter drop comment \"leader to peers\"
                udp sport {{ {peers} }} udp dport {leader_port} counter drop comment \"peers to leader\"
                meta mark {CONFINED_MARK} counter drop comment \"confined clients to peers\"
            }}
        }}\n"
    )
}

/// The packets the rule commented `comment` in the cut's listing `listing` dropped.
fn dropped(listing: &str, comment: &str) -> u64 {
    let line = listing
        .lines()
        .find(|line| line.contains(&format!("comment \"{comment}\"")))
        .unwrap_or_else(|| panic!("no rule {comment:?} in {listing}"));
    line.split_whitespace()
        .skip_while(|word| *word != "packets")
        .nth(1)
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no packet count in {line:?}"))
}

/// `count` keys `PREFIX-N` of `shard` (`wanted`) or, with `wanted` false, of distinct shards
/// other than `shard`; computed with the library's `shard_for`.
fn keys(prefix: &str, shard: u16, wanted: bool, count: usize) -> Vec<String> {
    let shards = ShardCount::new(u32::from(SHARDS)).expect("a shard count");
    let mut seen = Vec::new();
    let mut keys = Vec::new();
    for number in 0..10_000 {
        if keys.len() == count {
            return keys;
        }
        let key = format!("{prefix}-{number}");
        let of = shardtable::shard_for(key.as_bytes(), shards).get();
        let fits = if wanted {
            of == shard
        } else {
            of != shard && !seen.contains(&of)
        };
        if fits {
            seen.push(of);
            keys.push(key);
        }
    }
    panic!("fewer than {count} keys {prefix}-N fit shard {shard} (wanted: {wanted})");
}

/// Each node's pid is the `node` binary itself (`ip netns exec` execs it, so the harness
/// signals exactly the nodes), and it runs in another network namespace than this test.
fn assert_nodes_run_in_the_namespace(cluster: &Cluster) {
    let binary = fs::canonicalize(cluster.binary()).expect("the node binary's path");
    let own_netns = fs::read_link("/proc/self/ns/net").expect("this process's namespace");
    for node in cluster.nodes() {
        let pid = node.pid();
        let exe = fs::read_link(format!("/proc/{pid}/exe")).expect("a node's executable");
        assert_eq!(
            exe, binary,
            "{}'s pid {pid} is not the node binary",
            node.id
        );
        let netns = fs::read_link(format!("/proc/{pid}/ns/net")).expect("a node's namespace");
        assert_ne!(
            netns, own_netns,
            "{} (pid {pid}) runs in the test's own network namespace",
            node.id
        );
    }
}

/// A signed distance from `from` to `to`, for the report.
fn since(from: Instant, to: Instant) -> String {
    if to >= from {
        format!("+{:?}", to - from)
    } else {
        format!("-{:?}", from - to)
    }
}

/// `attempts`, each with its start and end from `cut`, for a failure message.
fn timeline(attempts: &[&Attempt], cut: Instant) -> Vec<String> {
    attempts
        .iter()
        .map(|attempt| {
            format!(
                "{attempt:?}, {} to {}",
                since(cut, attempt.started),
                since(cut, attempt.ended)
            )
        })
        .collect()
}

/// What the scenario measured, from the fault thread.
#[derive(Debug)]
struct Measured {
    /// The old leader's id.
    leader: String,
    /// The shard.
    shard: u16,
    /// When `nft` returned: the cut is in effect (since a few milliseconds).
    cut: Instant,
    /// When the old leader's `shard-info` first named no leader or another one.
    stepped_down: Duration,
    /// Who the majority elected, and when it first said so.
    elected: (String, Duration),
    /// Just before `nft` deleted the cut.
    heal: Instant,
    /// When every node listed every other as alive again, after the heal.
    converged: Duration,
    /// When every shard's config was its target again, after the heal.
    settled: Duration,
    /// Each node's generation then (1 at start; one more each time the others declared it
    /// down).
    generations: Vec<(String, u64)>,
}

/// The leader of a shard cut off from its two peers (nftables in the test's namespace) while
/// writers still reach it: it stops acknowledging within its check-quorum timeout, the two
/// others elect one of them and take writes, and after the heal every acknowledged write is
/// readable and `node check` passes.
#[test]
fn a_cut_off_leader_stops_acknowledging_and_the_majority_takes_over() {
    let netns = Netns::create();
    let cluster = Cluster::launch_in(netns, "partition", 3, FLAGS);
    assert_nodes_run_in_the_namespace(&cluster);
    wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);

    // Shard 0, whichever node leads it; its keys are found with the library's hash.
    let shard = 0;
    let via_leader = keys(
        "via-leader",
        shard,
        true,
        CONFINED_WRITERS * KEYS_PER_WRITER,
    );
    let via_majority = keys("via-majority", shard, true, KEYS_PER_WRITER);
    let other = keys("other", shard, false, OTHER_KEYS);
    assert_eq!(
        shard_of(&cluster, 0, &via_leader[0]),
        shard,
        "the CLI maps {} as the library does",
        via_leader[0]
    );
    let settled = wait_until(RECOVER_WITHIN, "shard 0 is settled", || {
        settled_config(&cluster, 0, shard)
    });
    let leader_id = settled
        .leader
        .clone()
        .expect("a settled shard has a leader");
    let leader = cluster.index_of(&leader_id);
    let majority: Vec<usize> = (0..3).filter(|&index| index != leader).collect();
    let leader_port = cluster.node(leader).addr.port();
    let peer_ports: Vec<u16> = majority
        .iter()
        .map(|&index| cluster.node(index).addr.port())
        .collect();
    eprintln!(
        "shard {shard}: voters {:?}, leader {leader_id} on port {leader_port}; peers on {peer_ports:?}",
        settled.voters
    );

    let client = cluster.client();
    let confined_client = client.in_group(CONFINED_GID);
    let (confined, through_majority, elsewhere) = (
        Workload::new(client.len()),
        Workload::new(client.len()),
        Workload::new(client.len()),
    );

    let mut measured = None;
    let histories: Vec<History> = thread::scope(|scope| {
        let mut writers = Vec::new();
        for keys in via_leader.chunks(KEYS_PER_WRITER) {
            let (client, workload) = (&confined_client, &confined);
            writers
                .push(scope.spawn(move || {
                    write_loop(client, keys, workload, CONFINED_TIMEOUT, || leader)
                }));
        }
        {
            let (client, workload, keys, majority) =
                (&client, &through_majority, &via_majority, &majority);
            writers.push(scope.spawn(move || {
                let mut rng = Rng::new(1);
                write_loop(client, keys, workload, OP_TIMEOUT, || {
                    majority[rng.below(majority.len())]
                })
            }));
        }
        {
            let (client, workload, keys) = (&client, &elsewhere, &other);
            writers.push(scope.spawn(move || {
                let mut rng = Rng::new(2);
                write_loop(client, keys, workload, OP_TIMEOUT, || {
                    workload.up.pick(&mut rng)
                })
            }));
        }
        let faults = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for (workload, who) in [
                (&confined, "through the leader"),
                (&through_majority, "through the majority"),
                (&elsewhere, "to other shards"),
            ] {
                let what = format!("the writers {who} make progress");
                workload.wait_progress(2, RECOVER_WITHIN, &what);
            }
            let netns = cluster.netns().expect("the cluster runs in its namespace");

            let cut_requested = Instant::now();
            netns.nft(&cut_rules(leader_port, &peer_ports));
            // The rules are in effect from here; times below are measured from here.
            let cut = Instant::now();
            eprintln!(
                "cut {leader_id} off from its peers (nft took {:?})",
                cut - cut_requested
            );

            // (a) The old leader, which clients still reach, says when it stepped down; (b) one
            // of the others says it leads.
            let mut stepped_down = None;
            let mut elected = None;
            let what =
                format!("{leader_id} steps down from shard {shard} and one of the others leads it");
            let (stepped_down, elected) = wait_until(ELECT_WITHIN, &what, || {
                if stepped_down.is_none() {
                    let seen = own_config(&cluster, leader, shard)
                        .map_err(|error| format!("{leader_id} does not answer: {error}"))?;
                    if seen.leader.as_ref() != Some(&leader_id) {
                        stepped_down = Some(cut.elapsed());
                    }
                }
                if elected.is_none() {
                    for &index in &majority {
                        let id = &cluster.node(index).id;
                        let seen = own_config(&cluster, index, shard);
                        if seen.is_ok_and(|seen| seen.leader.as_ref() == Some(id)) {
                            elected = Some((id.clone(), cut.elapsed()));
                        }
                    }
                }
                match (stepped_down, &elected) {
                    (Some(down), Some(elected)) => Ok((down, elected.clone())),
                    seen => Err(format!("stepped down, elected: {seen:?}")),
                }
            });
            assert!(
                stepped_down <= STOP_ACKING_WITHIN,
                "{leader_id} still led shard {shard} {stepped_down:?} after the cut"
            );
            through_majority.wait_progress(
                2,
                RECOVER_WITHIN,
                "writes through the majority are acknowledged during the cut",
            );
            let late = cut + STOP_ACKING_WITHIN;
            wait_until(
                RECOVER_WITHIN,
                "two writes through the cut-off leader, started after the cut and the bound, end",
                || match confined.finished_since(late) {
                    count if count >= 2 => Ok(()),
                    count => Err(format!("{count} ended")),
                },
            );

            let listing = netns.nft(&format!("list table inet {CUT_TABLE}"));
            let heal = Instant::now();
            netns.nft(&format!("delete table inet {CUT_TABLE}"));
            eprintln!(
                "healed after {:?}; the cut's counters:\n{listing}",
                heal - cut
            );
            for rule in ["leader to peers", "peers to leader"] {
                assert!(
                    dropped(&listing, rule) > 0,
                    "the rule {rule:?} dropped nothing: {listing}"
                );
            }

            cluster.wait_converged(CONVERGE_WITHIN);
            let converged = heal.elapsed();
            wait_configs_match_target(&cluster, SHARDS, CONFIGS_SETTLE_WITHIN);
            let settled = heal.elapsed();
            let generations = members(&cluster.query(0, &["members"]))
                .expect("a members answer")
                .into_iter()
                .map(|member| (member.id, member.generation))
                .collect();
            for (workload, who) in [
                (&confined, "through the old leader"),
                (&through_majority, "through the majority"),
                (&elsewhere, "to other shards"),
            ] {
                let what = format!("writes {who} are acknowledged after the heal");
                workload.wait_progress(1, RECOVER_WITHIN, &what);
            }
            measured = Some(Measured {
                leader: leader_id.clone(),
                shard,
                cut,
                stepped_down,
                elected,
                heal,
                converged,
                settled,
                generations,
            });
        }));
        finish(&[&confined, &through_majority, &elsewhere], writers, faults)
    });
    let measured = measured.expect("the scenario ran to its end");

    // (a) The old leader's acknowledgements during the cut.
    let during_cut = |prefix: &str| -> Vec<&Attempt> {
        histories
            .iter()
            .filter(|history| history.key.starts_with(prefix))
            .flat_map(|history| &history.attempts)
            .filter(|attempt| attempt.ended < measured.heal)
            .collect()
    };
    let confined_attempts = during_cut("via-leader-");
    let last_ack = confined_attempts
        .iter()
        .filter(|attempt| attempt.outcome.is_ok())
        .map(|attempt| attempt.ended)
        .max()
        .expect("writes through the leader were acknowledged before the cut");
    let late = measured.cut + STOP_ACKING_WITHIN;
    let started_late: Vec<&Attempt> = confined_attempts
        .iter()
        .copied()
        .filter(|attempt| attempt.started >= late)
        .collect();
    let first_majority_ack = during_cut("via-majority-")
        .iter()
        .filter(|attempt| attempt.outcome.is_ok() && attempt.started >= measured.cut)
        .map(|attempt| attempt.ended)
        .min()
        .expect("a write through the majority was acknowledged during the cut");
    eprintln!(
        "partition timings (shard {}, old leader {}): last ack by the old leader {} from the \
         cut; it named no leader by {:?}; {} led by {:?}; first ack of a write started after the \
         cut through the majority {}; {} attempts through the old leader started \
         {STOP_ACKING_WITHIN:?} after the cut or later, {} acknowledged; heal after {:?}; \
         converged {:?} and configs settled {:?} after the heal; generations then {:?}",
        measured.shard,
        measured.leader,
        since(measured.cut, last_ack),
        measured.stepped_down,
        measured.elected.0,
        measured.elected.1,
        since(measured.cut, first_majority_ack),
        started_late.len(),
        started_late
            .iter()
            .filter(|attempt| attempt.outcome.is_ok())
            .count(),
        measured.heal - measured.cut,
        measured.converged,
        measured.settled,
        measured.generations,
    );
    assert!(
        first_majority_ack < measured.cut + MAJORITY_ACKS_WITHIN,
        "the first write through the majority acknowledged after the cut ended {} from it, \
         {} from {}'s election: {:#?}",
        since(measured.cut, first_majority_ack),
        since(measured.cut + measured.elected.1, first_majority_ack),
        measured.elected.0,
        timeline(&during_cut("via-majority-"), measured.cut)
    );
    assert!(
        last_ack < late,
        "the cut-off leader {} acknowledged a write {} after the cut: {:#?}",
        measured.leader,
        since(measured.cut, last_ack),
        timeline(&confined_attempts, measured.cut)
    );
    assert!(
        started_late.len() >= 2 && started_late.iter().all(|attempt| !attempt.outcome.is_ok()),
        "writes through the cut-off leader started {STOP_ACKING_WITHIN:?} after the cut: {:#?}",
        timeline(&started_late, measured.cut)
    );

    // (c) Nothing acknowledged is lost, and the replicas agree.
    assert_every_key_acknowledged(&histories);
    check_histories(&client, &histories);
    wait_check_passes(&cluster, RECOVER_WITHIN);
}
