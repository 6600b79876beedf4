//! Shards driven by membership on the virtual network: a new cluster's first node creates
//! every shard, joiners become learners and voters through each shard's leader, and clients
//! write and read through any node.

use std::time::Duration;

use cluster::ClusterSpec;
use cluster::replica::{ClientOp, ClientReply};
use shardtable::{ShardCount, ShardId, TableSpec};
use topology::VnodeCount;

use crate::net::{Net, name, seeds};

const SHARDS: u32 = 16;

fn small_spec() -> ClusterSpec {
    let table = TableSpec {
        shards: ShardCount::new(SHARDS).unwrap(),
        ..TableSpec::default()
    };
    ClusterSpec::new("test", 7, table, VnodeCount::new(64).unwrap()).unwrap()
}

/// Three nodes: `n0` bootstraps the shards, `n1` and `n2` join.
pub(crate) fn three_nodes(seed: u64) -> Net {
    let mut net = Net::new(seed);
    net.spec = small_spec();
    net.start(0, None).unwrap();
    net.bootstrap_shards(0);
    net.run_until(Duration::from_secs(1));
    net.start(1, Some(0)).unwrap();
    net.start(2, Some(1)).unwrap();
    net.run_until(Duration::from_secs(15));
    net
}

/// `n0` bootstraps the shards alone, then `n1` joins: every shard moves, at most `max_moves`
/// at once.
fn second_node_joining(seed: u64, max_moves: usize) -> Net {
    let mut net = Net::new(seed);
    net.spec = small_spec();
    net.config.replica.max_moves = max_moves;
    net.start(0, None).unwrap();
    net.bootstrap_shards(0);
    net.run_until(Duration::from_secs(1));
    net.start(1, Some(0)).unwrap();
    net
}

/// Runs `op` through node `at`, following `Moved` answers, until it is answered `Ok`.
fn execute(net: &mut Net, mut at: usize, token: u64, op: ClientOp) -> Option<Vec<u8>> {
    for _ in 0..50 {
        net.slots[at].replies.clear();
        net.client(at, token, op.clone());
        let deadline = net.now + Duration::from_secs(2);
        loop {
            if let Some((_, reply)) = net.slots[at].replies.iter().find(|(t, _)| *t == token) {
                match reply.clone() {
                    ClientReply::Ok { value } => return value,
                    ClientReply::Moved {
                        leader: Some(leader),
                        ..
                    } => {
                        at = (0..3).find(|&i| name(i) == leader).expect("a node");
                    }
                    other => {
                        let now = net.now;
                        net.run_until(now + Duration::from_millis(100));
                        eprintln!("retrying after {other:?}");
                    }
                }
                break;
            }
            let now = net.now;
            assert!(now < deadline, "no answer within 2 s");
            net.run_until(now + Duration::from_millis(5));
        }
    }
    panic!("{op:?} never succeeded");
}

#[test]
fn joiners_become_voters_of_every_shard_and_clients_read_their_writes() {
    for seed in seeds(3) {
        let mut net = three_nodes(seed);
        for shard in 0..SHARDS as u16 {
            for index in 0..3 {
                let replica = net
                    .core(index)
                    .shards()
                    .replica(shard)
                    .unwrap_or_else(|| panic!("seed {seed}: n{index} holds no shard {shard}"));
                let voters = &replica.durable().active_config().voters;
                assert_eq!(
                    voters.len(),
                    3,
                    "seed {seed}: shard {shard} on n{index} has voters {voters:?}"
                );
                // Every copy, those a leader's message created on the joiners included
                // (`ShardHost::take_created`), holds placement's replica set as its target.
                let placed: Vec<_> = net
                    .core(index)
                    .table()
                    .shard_info(ShardId::new(shard))
                    .unwrap()
                    .replicas()
                    .cloned()
                    .collect();
                let target: Option<Vec<_>> = replica
                    .target()
                    .map(|target| target.iter().map(|member| member.node.clone()).collect());
                assert_eq!(
                    target,
                    Some(placed),
                    "seed {seed}: shard {shard} on n{index} was given no or another target"
                );
            }
        }
        for key in 0..20u32 {
            let key = format!("key-{key}").into_bytes();
            let value = format!("value-{seed}").into_bytes();
            let at = (key.len() + key[key.len() - 1] as usize) % 3;
            let put = ClientOp::Put {
                key: key.clone(),
                value: value.clone(),
            };
            execute(&mut net, at, 1, put);
            let read = execute(&mut net, (at + 1) % 3, 2, ClientOp::Get { key });
            assert_eq!(read, Some(value), "seed {seed}");
        }
    }
}

/// While a joiner is being added to a shard, the leader's `shard-info` says `migrating`, with
/// the joiner in `joining` and among the replicas, and its `status` lists the move; once the
/// joiner is a voter, `stable`, and the move is gone. (A learner is promoted as soon as it
/// caught up, so its lag shows while migrating only when it catches up in more than one step,
/// as after a snapshot; here it catches up at once.)
#[test]
fn shard_info_shows_a_join_as_migrating_until_the_joiner_votes() {
    use cluster::wire::{Request, Response, ShardInfoView};
    let ask = |net: &mut Net, shard: u32| -> ShardInfoView {
        let now = net.now;
        let core = net.slots[0].core.as_mut().unwrap();
        match core.handle_request(now, None, Request::ShardInfo { shard }) {
            Response::ShardInfo(view) => view,
            other => panic!("{other:?}"),
        }
    };
    for seed in seeds(5) {
        let mut net = Net::new(seed);
        net.spec = small_spec();
        net.start(0, None).unwrap();
        net.bootstrap_shards(0);
        net.run_until(Duration::from_secs(1));
        assert_eq!(ask(&mut net, 3).state, "stable", "seed {seed}");
        net.start(1, Some(0)).unwrap();
        let mut migrating = None;
        let mut joiner_listed = false;
        let deadline = net.now + Duration::from_secs(15);
        while net.now < deadline {
            let now = net.now;
            net.run_until(now + Duration::from_millis(1));
            let view = ask(&mut net, 3);
            if view.state == "migrating" {
                let joiner = view.replicas.iter().find(|r| r.node.id == name(1));
                joiner_listed |= joiner.is_some();
                // `status` lists the move too: n0 leads it.
                let status = net.slots[0].core.as_ref().unwrap().status();
                let moving = status.moving.iter().find(|moving| moving.shard == 3);
                let moving = moving.unwrap_or_else(|| panic!("{status:?}; seed {seed}"));
                assert_eq!(moving.leader, name(0), "{moving:?}");
                assert_eq!(moving.joining, view.joining, "{moving:?}");
                migrating.get_or_insert(view);
            } else if view.state == "stable" && migrating.is_some() {
                break;
            }
        }
        assert!(joiner_listed, "the leader lists the joiner; seed {seed}");
        let migrating = migrating.unwrap_or_else(|| panic!("never migrating; seed {seed}"));
        assert_eq!(
            migrating.joining,
            vec![name(1).to_string()],
            "{migrating:?}"
        );
        assert!(migrating.leaving.is_empty(), "{migrating:?}");
        let stable = ask(&mut net, 3);
        assert_eq!(stable.state, "stable", "{stable:?}; seed {seed}");
        // Still listed only if its leadership is yet to pass to placement's leader.
        let status = net.slots[0].core.as_ref().unwrap().status();
        assert!(
            status.moving.iter().all(|moving| moving.shard != 3
                || (moving.joining.is_empty()
                    && moving.leaving.is_empty()
                    && moving.handoff_to.is_some())),
            "{status:?}; seed {seed}"
        );
        assert!(
            stable.joining.is_empty() && stable.leaving.is_empty(),
            "{stable:?}"
        );
        assert_eq!(stable.replicas.len(), 2, "{stable:?}; seed {seed}");
    }
}

/// A join moves at most `max_moves` of the shards one node leads at once; the others wait
/// their turn (placement's target is handed to their leader later), and every shard gets
/// there.
#[test]
fn a_join_moves_at_most_max_moves_shards_per_leader_at_once() {
    for seed in seeds(3) {
        let mut net = second_node_joining(seed, 2);
        let (mut most, mut most_queued) = (0, 0);
        let deadline = net.now + Duration::from_secs(30);
        loop {
            let now = net.now;
            net.run_until(now + Duration::from_millis(5));
            let (moving, queued) = net.core(0).shards().moves();
            most = most.max(moving);
            most_queued = most_queued.max(queued);
            let voters_everywhere = (0..SHARDS as u16).all(|shard| {
                net.core(0).shards().replica(shard).is_some_and(|replica| {
                    replica.config().voters.iter().any(|m| m.node == name(1))
                })
            });
            if voters_everywhere && (moving, queued) == (0, 0) {
                break;
            }
            assert!(
                net.now < deadline,
                "seed {seed}: moves not done after 30 s: {moving} moving, {queued} queued"
            );
        }
        assert_eq!(
            most, 2,
            "seed {seed}: at most max_moves at once, and that many"
        );
        assert!(
            most_queued >= SHARDS as usize - 2 - 2,
            "seed {seed}: the others waited: {most_queued}"
        );
    }
}

/// A leader hands shards to a joiner (R7) only once none of the shards it leads is moving or
/// waiting to: the joiner takes its leaderships after it has loaded its copies, not one at a
/// time between them. Meanwhile `status` lists those shards with `handoff_to`, and once they
/// have passed it lists nothing.
#[test]
fn handoffs_wait_until_the_leaders_moves_are_done() {
    for seed in seeds(3) {
        let mut net = second_node_joining(seed, 2);
        let deadline = net.now + Duration::from_secs(30);
        let mut listed_handoff = false;
        loop {
            let now = net.now;
            net.run_until(now + Duration::from_millis(5));
            let (moving, queued) = net.core(0).shards().moves();
            let leads_at = |node: usize, shard: u16| {
                net.core(node)
                    .shards()
                    .replica(shard)
                    .is_some_and(|replica| replica.established_ballot().is_some())
            };
            let joiner_leads = (0..SHARDS as u16).filter(|&s| leads_at(1, s)).count();
            // Copies still to load: shards n0 leads where n1 is not a voter yet.
            let copying = (0..SHARDS as u16)
                .filter(|&s| {
                    leads_at(0, s)
                        && net.core(0).shards().replica(s).is_some_and(|replica| {
                            !replica.config().voters.iter().any(|v| v.node == name(1))
                        })
                })
                .count();
            assert!(
                joiner_leads == 0 || (copying, queued) == (0, 0),
                "seed {seed}: n1 leads {joiner_leads} shards while n0 still copies {copying} \
                 to it ({moving} moving, {queued} queued)"
            );
            listed_handoff |= net
                .core(0)
                .moves_led_here()
                .iter()
                .any(|m| m.handoff_to.as_deref() == Some("n1"));
            let placed_at_n1 = (0..SHARDS as u16)
                .filter(|&s| {
                    let info = net.core(0).table().shard_info(ShardId::new(s)).unwrap();
                    info.leader() == Some(&name(1))
                })
                .count();
            if placed_at_n1 > 0 && joiner_leads == placed_at_n1 {
                break;
            }
            assert!(
                net.now < deadline,
                "seed {seed}: n1 leads {joiner_leads} of its {placed_at_n1} shards after 30 s"
            );
        }
        assert!(
            listed_handoff,
            "seed {seed}: status never named n1 as next leader"
        );
        let now = net.now;
        net.run_until(now + Duration::from_secs(1));
        assert_eq!(net.core(0).moves_led_here(), vec![], "seed {seed}");
    }
}

/// A node that is down and not replaced leaves every shard it held one voter over its target
/// (`min_voters` keeps it): those shards count as moving, and fill `max_moves` (the rest
/// queue), but they move no data, so no leader holds its handoffs back for them, and
/// placement's leader among the survivors leads every shard.
#[test]
fn handoffs_go_on_while_a_dead_voter_is_kept() {
    for seed in seeds(3) {
        let mut net = three_nodes(seed);
        net.crash(2);
        let deadline = net.now + Duration::from_secs(40);
        loop {
            let now = net.now;
            net.run_until(now + Duration::from_millis(100));
            let table = net.core(0).table();
            // Per shard, which survivor placement names its leader (`None`: still n2).
            let placed: Vec<Option<usize>> = (0..SHARDS as u16)
                .map(|shard| {
                    let info = table.shard_info(ShardId::new(shard)).unwrap();
                    (0..2).find(|&i| info.leader() == Some(&name(i)))
                })
                .collect();
            let n2_placed = (0..SHARDS as u16).any(|shard| {
                let info = table.shard_info(ShardId::new(shard)).unwrap();
                info.replicas().any(|node| *node == name(2))
            });
            let astray: Vec<u16> = (0..SHARDS as u16)
                .zip(&placed)
                .filter(|&(shard, &at)| {
                    at.is_none_or(|at| {
                        net.core(at)
                            .shards()
                            .replica(shard)
                            .is_none_or(|replica| replica.established_ballot().is_none())
                    })
                })
                .map(|(shard, _)| shard)
                .collect();
            let held = (0..2).any(|i| net.core(i).shards().handoffs_held());
            if !n2_placed && astray.is_empty() && !held {
                break;
            }
            assert!(
                net.now < deadline,
                "seed {seed}: 40 s after n2 crashed, placement's leader does not lead \
                 {astray:?}, handoffs held: {held}"
            );
        }
    }
}

/// `decommission` (`node leave`): placement leaves the draining node out, the leaders move
/// every replica it holds to the others (its own shards by handoff first), it is `drained`,
/// and after its leave the others list it as `left`, with every shard on the three others.
/// With only the replication factor's number of others it is refused and nothing changes.
#[test]
fn a_decommissioned_node_hands_every_replica_over_then_leaves() {
    use cluster::wire::{Request, Response};
    for seed in seeds(3) {
        let mut net = three_nodes(seed);
        let now = net.now;
        let refused =
            net.slots[2]
                .core
                .as_mut()
                .unwrap()
                .handle_request(now, None, Request::Decommission);
        assert!(
            matches!(&refused, Response::Refused { reason } if reason.contains("replication factor")),
            "seed {seed}: {refused:?}"
        );
        assert!(
            !net.core(2).draining(),
            "seed {seed}: a refusal changes nothing"
        );
        net.start(3, Some(0)).unwrap();
        net.run_until(net.now + Duration::from_secs(15));
        let held = net.core(3).held();
        assert!(
            held.shards > 0,
            "seed {seed}: n3 holds shards after joining"
        );
        let now = net.now;
        let from_peer = net.slots[3].core.as_mut().unwrap().handle_request(
            now,
            Some(&name(0)),
            Request::Decommission,
        );
        assert!(matches!(from_peer, Response::Refused { .. }), "seed {seed}");
        let answer =
            net.slots[3]
                .core
                .as_mut()
                .unwrap()
                .handle_request(now, None, Request::Decommission);
        assert!(
            matches!(answer, Response::Decommissioning(_)),
            "seed {seed}: {answer:?}"
        );
        assert!(net.core(3).draining(), "seed {seed}");
        let deadline = net.now + Duration::from_secs(30);
        while !net.core(3).drained() {
            assert!(
                net.now < deadline,
                "seed {seed}: n3 still holds {:?}",
                net.core(3).held()
            );
            net.run_until(net.now + Duration::from_millis(10));
        }
        assert!(
            net.core(0)
                .members()
                .members
                .iter()
                .any(|m| m.id == name(3) && m.draining),
            "seed {seed}: peers see n3 draining"
        );
        net.leave(3);
        net.run_until(net.now + Duration::from_secs(5));
        for index in 0..3 {
            assert_eq!(
                net.listed(index, "left"),
                vec!["n3"],
                "seed {seed}: n{index}"
            );
            for shard in 0..SHARDS as u16 {
                let replica = net.core(index).shards().replica(shard).unwrap();
                let voters: Vec<_> = replica
                    .config()
                    .voters
                    .iter()
                    .map(|m| m.node.clone())
                    .collect();
                assert_eq!(
                    voters.len(),
                    3,
                    "seed {seed}: shard {shard} on n{index}: {voters:?}"
                );
                assert!(
                    !voters.contains(&name(3)),
                    "seed {seed}: shard {shard}: {voters:?}"
                );
            }
        }
    }
}

/// `node check`'s digests come a page at a time: the pages, asked in turn, hold every held
/// shard once, in order, with the digests of one whole answer, at most a page's count each.
#[test]
fn shard_digests_page_through_every_shard_once() {
    for seed in seeds(2) {
        let mut net = three_nodes(seed);
        for key in 0..40u32 {
            let put = ClientOp::Put {
                key: format!("key-{key}").into_bytes(),
                value: vec![b'v'; 100],
            };
            execute(&mut net, 0, 1, put);
        }
        net.run_until(net.now + Duration::from_millis(200));
        let (whole, next) = net.core(0).shard_digests(None, usize::MAX);
        assert_eq!(next, None, "seed {seed}");
        assert_eq!(whole.len(), SHARDS as usize, "seed {seed}");
        let budget = 7;
        let mut paged = Vec::new();
        let mut after = None;
        let mut pages = 0;
        loop {
            let (page, next) = net.core(0).shard_digests(after, budget);
            assert!(!page.is_empty() && page.len() <= budget, "seed {seed}");
            pages += 1;
            paged.extend(page);
            match next {
                Some(next) => {
                    assert!(after.is_none_or(|after| next > after), "seed {seed}");
                    after = Some(next);
                }
                None => break,
            }
        }
        assert_eq!(paged, whole, "seed {seed}");
        assert_eq!(pages, (SHARDS as usize).div_ceil(budget), "seed {seed}");
    }
}

/// `node check` counts a shard covered only when a replica reports itself its established
/// leader, settled when that leader's voters are placement's replica set: a new cluster's
/// first node reports no leader before its election, then leads every shard with itself alone
/// (its target then); once two more nodes joined, every shard has exactly one leader, at its
/// target, and the other copies report no leadership.
#[test]
fn shard_digests_say_who_leads_and_whether_the_shard_settled() {
    use cluster::wire::DigestRole;
    for seed in seeds(2) {
        let mut net = Net::new(seed);
        net.spec = small_spec();
        net.start(0, None).unwrap();
        net.bootstrap_shards(0);
        let (digests, _) = net.core(0).shard_digests(None, usize::MAX);
        assert_eq!(digests.len(), SHARDS as usize, "seed {seed}");
        assert!(
            digests.iter().all(|d| d.role == DigestRole::Other),
            "nobody leads before the first election; seed {seed}: {digests:?}"
        );
        net.run_until(Duration::from_secs(1));
        let (digests, _) = net.core(0).shard_digests(None, usize::MAX);
        assert!(
            digests
                .iter()
                .all(|d| d.role == DigestRole::Leader { at_target: true }),
            "seed {seed}: {digests:?}"
        );
        net.start(1, Some(0)).unwrap();
        net.start(2, Some(1)).unwrap();
        net.run_until(Duration::from_secs(15));
        for shard in 0..SHARDS as u16 {
            let roles: Vec<DigestRole> = (0..3)
                .flat_map(|index| net.core(index).shard_digests(None, usize::MAX).0)
                .filter(|d| d.shard == shard)
                .map(|d| d.role)
                .collect();
            assert_eq!(roles.len(), 3, "seed {seed}: shard {shard}");
            let leaders: Vec<&DigestRole> = roles
                .iter()
                .filter(|role| **role != DigestRole::Other)
                .collect();
            assert_eq!(
                leaders,
                [&DigestRole::Leader { at_target: true }],
                "seed {seed}: shard {shard}: {roles:?}"
            );
        }
    }
}

/// A node removed from a shard keeps its retired copy for the grace period, and its
/// `shard-info` then says `elsewhere` (ask the target), never the stale view of that copy.
#[test]
fn shard_info_of_a_retired_copy_says_elsewhere() {
    use cluster::wire::{Request, Response};
    for seed in seeds(2) {
        let mut net = three_nodes(seed);
        net.start(3, Some(0)).unwrap();
        net.run_until(net.now + Duration::from_secs(20));
        let mut retired = 0;
        for index in 0..4 {
            for shard in 0..SHARDS as u16 {
                let holds_retired_copy = net
                    .core(index)
                    .shards()
                    .replica(shard)
                    .is_some_and(cluster::replica::ShardReplica::holds_retired_copy);
                if !holds_retired_copy {
                    continue;
                }
                retired += 1;
                let now = net.now;
                let core = net.slots[index].core.as_mut().unwrap();
                let ask = Request::ShardInfo {
                    shard: u32::from(shard),
                };
                match core.handle_request(now, None, ask) {
                    Response::ShardInfo(view) => {
                        assert_eq!(view.state, "elsewhere", "seed {seed}: n{index}: {view:?}");
                        assert_eq!(view.leader, None, "seed {seed}: n{index}: {view:?}");
                        assert!(view.replicas.is_empty(), "seed {seed}: n{index}: {view:?}");
                        assert!(
                            !view.target.contains(&name(index).to_string()),
                            "seed {seed}: n{index}: {view:?}"
                        );
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        assert!(
            retired > 0,
            "seed {seed}: the fourth node's join left no retired copy"
        );
    }
}
