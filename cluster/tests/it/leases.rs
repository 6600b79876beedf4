//! R9's opt-in leases on the deterministic in-memory network of `replica.rs`: a leader under
//! a lease answers reads at once, and a leader cut off from its peers answers no read from
//! its own state once another replica could lead, whatever SWIM says and even if the
//! followers restart.

use std::collections::BTreeSet;
use std::time::Duration;

use cluster::replica::{ClientOp, ClientReply, ReplicaConfig};

use crate::net::{name, seeds};
use crate::replica::{group_with_a_write, member, tag};

fn lease_config() -> ReplicaConfig {
    ReplicaConfig {
        lease_reads: true,
        ..ReplicaConfig::default()
    }
}

/// The knobs of a node started without `--danger-lease-reads`: it may have run with them
/// before, so a restarted replica keeps quiet for `t_elect`.
fn node_without_leases() -> ReplicaConfig {
    let config = ReplicaConfig::default();
    ReplicaConfig {
        restart_silence: config.t_elect,
        ..config
    }
}

fn get() -> ClientOp {
    ClientOp::Get { key: b"k".to_vec() }
}

#[test]
fn under_a_lease_a_read_is_answered_at_once() {
    for seed in seeds(10) {
        let (mut group, leader) = group_with_a_write(seed, lease_config());
        group.client(leader, tag(2), get());
        assert_eq!(
            group.replies.get(&tag(2)),
            Some(&ClientReply::Ok {
                value: Some(b"v".to_vec())
            }),
            "replay: SLOTRING_SEED={seed} cargo test -p cluster --test it leases::"
        );

        // Without leases the same read waits for a heartbeat round.
        let (mut group, leader) = group_with_a_write(seed, ReplicaConfig::default());
        group.client(leader, tag(2), get());
        assert_eq!(group.replies.get(&tag(2)), None);
        group.run(Duration::from_millis(20));
        assert_eq!(
            group.replies.get(&tag(2)),
            Some(&ClientReply::Ok {
                value: Some(b"v".to_vec())
            })
        );
    }
}

/// A leader that told a handoff target to stand gives up its lease for the rest of its
/// ballot: the target may lead as soon as it stands, and voters promise it at once.
#[test]
fn a_leader_handing_off_reads_by_rounds_from_then_on() {
    for seed in seeds(10) {
        let (mut group, leader) = group_with_a_write(seed, lease_config());
        let target: Vec<_> = (1..=3).map(|i| member((leader + i) % 3)).collect();
        let now = group.now;
        let replica = group.replicas[leader].as_mut().unwrap();
        replica.handle_target(now, target);
        group.client(leader, tag(2), get());
        assert_eq!(
            group.replies.get(&tag(2)),
            None,
            "replay: SLOTRING_SEED={seed} cargo test -p cluster --test it leases::"
        );
        group.run(Duration::from_secs(1));
        assert_eq!(
            group.leader(),
            Some((leader + 1) % 3),
            "the handoff is done"
        );
    }
}

/// Only followers that run with leases (and so keep the promise) give the leader one: with
/// one of two such followers it holds a lease, with none it reads by rounds.
#[test]
fn only_followers_with_leases_grant_one() {
    for seed in seeds(10) {
        for without_leases in [1, 2] {
            let (mut group, leader) = group_with_a_write(seed, lease_config());
            for i in (1..=without_leases).map(|step| (leader + step) % 3) {
                group.crash(i);
                group.restart_with(i, node_without_leases());
            }
            group.run(Duration::from_millis(500));
            assert_eq!(group.leader(), Some(leader));
            group.client(leader, tag(2), get());
            let answered = group.replies.contains_key(&tag(2));
            assert_eq!(
                answered,
                without_leases == 1,
                "{without_leases} followers without leases; \
                 replay: SLOTRING_SEED={seed} cargo test -p cluster --test it leases::"
            );
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum AfterTheCut {
    /// Nothing else happens.
    Nothing,
    /// SWIM tells the follower that was in touch that the leader is down (its fast path).
    SwimSaysDown,
    /// The follower that was in touch restarts, forgetting when it last heard the leader.
    FollowerRestarts,
    /// The same, with leases turned off by the restart.
    FollowerRestartsWithoutLeases,
}

/// One follower (the lagging one) has not heard the leader for a second, and keeps standing:
/// the leader's lease rests on the other follower alone, which must then promise nobody,
/// itself included, until the lease is over.
#[test]
fn a_cut_off_leader_answers_reads_from_its_state_only_until_another_could_lead() {
    for seed in seeds(20) {
        for after in [
            AfterTheCut::Nothing,
            AfterTheCut::SwimSaysDown,
            AfterTheCut::FollowerRestarts,
            AfterTheCut::FollowerRestartsWithoutLeases,
        ] {
            let replay = format!(
                "{after:?}; replay: SLOTRING_SEED={seed} cargo test -p cluster --test it leases::"
            );
            let (mut group, old) = group_with_a_write(seed, lease_config());
            let lagging = (old + 1 + (seed as usize % 2)) % 3;
            let in_touch = 3 - old - lagging;
            group.cut.insert((old, lagging));
            // Long enough for the lagging follower to stand (and be refused) a few times; the
            // rest of the span puts the cut at a seed-dependent point of the heartbeat cycle.
            group.run(Duration::from_millis(1_000 + seed % 100));
            group.cut_off(old);
            let cut_at = group.now;
            match after {
                AfterTheCut::FollowerRestarts => {
                    group.crash(in_touch);
                    group.restart(in_touch);
                }
                AfterTheCut::FollowerRestartsWithoutLeases => {
                    group.crash(in_touch);
                    group.restart_with(in_touch, node_without_leases());
                }
                AfterTheCut::Nothing | AfterTheCut::SwimSaysDown => {}
            }
            if matches!(after, AfterTheCut::SwimSaysDown) {
                let now = group.now;
                let replica = group.replicas[in_touch].as_mut().unwrap();
                replica.handle_view(now, BTreeSet::from([name(old)]));
            }
            // A read at the old leader each millisecond: when was the last one answered from
            // its state, and when did another replica first lead?
            let mut last_local_read = None;
            let mut other_leads_at = None;
            for req in 0..3_000 {
                let read = tag(1_000 + req);
                group.client(old, read, get());
                // Not leading any more, it answers `Unavailable` or `Moved`.
                if let Some(reply @ ClientReply::Ok { .. }) = group.replies.get(&read) {
                    assert_eq!(
                        reply,
                        &ClientReply::Ok {
                            value: Some(b"v".to_vec())
                        },
                        "{replay}"
                    );
                    last_local_read = Some(group.now);
                }
                group.run(Duration::from_millis(1));
                let leads = |i: usize| {
                    group.replicas[i]
                        .as_ref()
                        .is_some_and(|r| r.established_ballot().is_some())
                };
                if other_leads_at.is_none() && (leads(lagging) || leads(in_touch)) {
                    other_leads_at = Some(group.now);
                }
            }
            let other_leads_at =
                other_leads_at.unwrap_or_else(|| panic!("no new leader; {replay}"));
            let last_local_read = last_local_read
                .unwrap_or_else(|| panic!("no read under the lease after the cut; {replay}"));
            assert!(
                last_local_read < other_leads_at,
                "the old leader read locally at {last_local_read:?}, a new one led at \
                 {other_leads_at:?} (cut at {cut_at:?}); {replay}"
            );
        }
    }
}
