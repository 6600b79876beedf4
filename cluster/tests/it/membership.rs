//! Membership and placement on the virtual network: convergence, failure detection, pauses,
//! leaves, restarts, and refusals.

use std::time::Duration;

use shardtable::Placer;
use topology::{NodeId, TokenRing};

use cluster::wire::{Request, Response};

use crate::net::{Net, name, seeds};

const SECOND: Duration = Duration::from_secs(1);

fn expected_digest(net: &Net, members: &[usize]) -> String {
    let ring = TokenRing::from_members(net.spec.vnodes, members.iter().map(|&i| name(i)));
    Placer::new(net.spec.table)
        .place(&ring)
        .digest()
        .to_string()
}

fn five_nodes(seed: u64) -> Net {
    let mut net = Net::new(seed);
    net.start(0, None).unwrap();
    for index in 1..5 {
        net.start(index, Some(index - 1)).unwrap();
        let now = net.now;
        net.run_until(now + Duration::from_millis(50));
    }
    let now = net.now;
    net.run_until(now + 2 * SECOND);
    net
}

/// The first moment (from `since`) at which every live node's table digest is `digest`.
fn time_to_agree(
    net: &mut Net,
    digest: &str,
    since: Duration,
    limit: Duration,
) -> Option<Duration> {
    let step = Duration::from_millis(10);
    while net.now < since + limit {
        let now = net.now;
        net.run_until(now + step);
        if net
            .live()
            .iter()
            .all(|&i| net.core(i).digest().to_string() == digest)
        {
            return Some(net.now - since);
        }
    }
    None
}

#[test]
fn five_nodes_converge_on_the_same_table() {
    for seed in seeds(10) {
        let net = five_nodes(seed);
        let want = expected_digest(&net, &[0, 1, 2, 3, 4]);
        for index in 0..5 {
            assert_eq!(
                net.listed(index, "alive").len(),
                5,
                "{}",
                net.replay_hint("converge")
            );
            assert_eq!(
                net.core(index).digest().to_string(),
                want,
                "{}",
                net.replay_hint("converge")
            );
            assert!(net.core(index).is_joined() || index == 0);
        }
    }
}

#[test]
fn a_crashed_node_is_replaced_everywhere_within_a_second() {
    let mut times = Vec::new();
    for seed in seeds(30) {
        let mut net = five_nodes(seed);
        let victim = (seed % 5) as usize;
        net.crash(victim);
        let survivors: Vec<usize> = (0..5).filter(|&i| i != victim).collect();
        let want = expected_digest(&net, &survivors);
        let since = net.now;
        let took = time_to_agree(&mut net, &want, since, 5 * SECOND)
            .unwrap_or_else(|| panic!("never converged; {}", net.replay_hint("crashed")));
        times.push(took);
        for &index in &survivors {
            assert_eq!(net.listed(index, "down"), vec![name(victim).to_string()]);
        }
    }
    // Virtual time on a lossless 1–3 ms network: detection plus dissemination.
    times.sort();
    let (median, worst) = (times[times.len() / 2], times[times.len() - 1]);
    eprintln!("time for all survivors to agree after a crash: median {median:?}, worst {worst:?}");
    assert!(
        worst < Duration::from_millis(1500),
        "worst detection {worst:?}"
    );
}

#[test]
fn a_300ms_pause_declares_no_one_down() {
    for seed in seeds(30) {
        let mut net = five_nodes(seed);
        let victim = (seed % 5) as usize;
        let digest = net.core(0).digest();
        // Five pauses of 300 ms, 700 ms apart, as scripts/bench/membership.sh does.
        for _ in 0..5 {
            net.pause(victim);
            let now = net.now;
            net.run_until(now + Duration::from_millis(300));
            net.resume(victim);
            let now = net.now;
            net.run_until(now + Duration::from_millis(700));
        }
        let now = net.now;
        net.run_until(now + 2 * SECOND);
        for index in 0..5 {
            let downs: Vec<_> = net.slots[index]
                .events
                .iter()
                .filter(|(_, e)| matches!(e, cluster::Event::MemberDown(_)))
                .collect();
            assert!(
                downs.is_empty(),
                "node {index} saw {downs:?}; {}",
                net.replay_hint("pause")
            );
            let renewals: Vec<_> = net.slots[index]
                .events
                .iter()
                .filter(|(_, e)| matches!(e, cluster::Event::Renewed { .. }))
                .collect();
            assert!(
                renewals.is_empty(),
                "node {index} renewed: {renewals:?}; {}",
                net.replay_hint("pause")
            );
            assert_eq!(
                net.core(index).digest(),
                digest,
                "{}",
                net.replay_hint("pause")
            );
        }
    }
}

#[test]
fn a_graceful_leave_is_listed_as_left_at_once() {
    for seed in seeds(10) {
        let mut net = five_nodes(seed);
        net.leave(3);
        let now = net.now;
        net.run_until(now + Duration::from_millis(20));
        for index in [0, 1, 2, 4] {
            assert_eq!(
                net.listed(index, "left"),
                vec!["n3".to_owned()],
                "{}",
                net.replay_hint("leave")
            );
            assert_eq!(
                net.core(index).digest().to_string(),
                expected_digest(&net, &[0, 1, 2, 4])
            );
        }
    }
}

#[test]
fn a_restarted_node_rejoins_with_a_new_generation_and_the_table_returns() {
    for seed in seeds(10) {
        let mut net = five_nodes(seed);
        let original = net.core(0).digest();
        net.crash(2);
        let now = net.now;
        net.run_until(now + 3 * SECOND);
        assert_ne!(net.core(0).digest(), original);
        net.start(2, Some(0)).unwrap();
        let now = net.now;
        net.run_until(now + 2 * SECOND);
        for index in 0..5 {
            let view = net.core(index).members();
            let n2 = view.members.iter().find(|m| m.id.as_str() == "n2").unwrap();
            assert_eq!(
                (n2.generation, n2.state.as_str()),
                (2, "alive"),
                "{}",
                net.replay_hint("restarted")
            );
            assert_eq!(
                net.core(index).digest(),
                original,
                "{}",
                net.replay_hint("restarted")
            );
        }
    }
}

#[test]
fn a_node_with_another_spec_is_refused_and_changes_nothing() {
    let mut net = five_nodes(1);
    let digest = net.core(0).digest();
    let mut other = net.spec.clone();
    other.table.shards = shardtable::ShardCount::new(512).unwrap();
    let refusal = net.start_with_spec(5, Some(0), other.clone()).unwrap_err();
    assert!(refusal.contains("shards"), "{refusal}");
    // Even if it gossips anyway (it was never welcomed, but knows an address), nobody adds it.
    net.start_with_spec(5, None, other).unwrap();
    let now = net.now;
    net.run_until(now + 2 * SECOND);
    for index in 0..5 {
        assert_eq!(net.core(index).digest(), digest);
        assert!(
            net.core(index)
                .members()
                .members
                .iter()
                .all(|m| m.id.as_str() != "n5")
        );
    }
}

#[test]
fn a_packet_claiming_another_identity_is_dropped() {
    let mut net = five_nodes(2);
    let now = net.now;
    // A genuine SWIM packet from n1 (its join announcement), replayed by a peer whose
    // certificate says n4.
    let packet = {
        let identity = |index: usize| cluster::Identity {
            node_id: name(index),
            addr: crate::net::addr(index),
            generation: 1,
            spec: net.spec.fingerprint(),
            meta: cluster::NodeMeta::default(),
        };
        let mut core = cluster::Cluster::new(
            now,
            identity(1),
            net.spec.clone(),
            cluster::Config::default(),
            9,
        );
        core.join(now, vec![foca::Member::alive(identity(0))]);
        std::iter::from_fn(|| core.poll_transmit()).find_map(|t| match t {
            cluster::Transmit::Datagram { payload, .. } => Some(payload),
            _ => None,
        })
    };
    let packet = packet.expect("a joining node announces itself");
    {
        let core = net.slots[0].core.as_mut().unwrap();
        let error = core.handle_datagram(now, &name(4), &packet).unwrap_err();
        assert!(
            matches!(error, cluster::Error::IdentityMismatch { .. }),
            "{error}"
        );
        assert_eq!(core.stats().identity_mismatches, 1);
    }
    let core = net.slots[0].core.as_mut().unwrap();
    assert!(core.handle_datagram(now, &name(4), &[]).is_err());
    assert!(core.handle_datagram(now, &name(4), &[9, 1, 2]).is_err());
}

#[test]
fn a_late_packet_from_an_old_life_does_not_turn_the_new_life_undead() {
    let mut net = five_nodes(3);
    // n2 dies and comes back with generation 2; everyone learns the new life.
    let old_life = {
        let view = net.core(0).members();
        view.members
            .iter()
            .find(|m| m.id.as_str() == "n2")
            .unwrap()
            .generation
    };
    net.crash(2);
    let now = net.now;
    net.run_until(now + 3 * SECOND);
    net.start(2, Some(0)).unwrap();
    let now = net.now;
    net.run_until(now + 2 * SECOND);
    // A packet of the old life (generation 1) arrives late at n0.
    let identity = cluster::Identity {
        node_id: name(2),
        addr: crate::net::addr(2),
        generation: old_life,
        spec: net.spec.fingerprint(),
        meta: cluster::NodeMeta::default(),
    };
    let now = net.now;
    let mut old = cluster::Cluster::new(
        now,
        identity,
        net.spec.clone(),
        cluster::Config::default(),
        5,
    );
    let n0 = net.core(0).identity().clone();
    old.join(now, vec![foca::Member::alive(n0)]);
    let packet = std::iter::from_fn(|| old.poll_transmit())
        .find_map(|t| match t {
            cluster::Transmit::Datagram { payload, .. } => Some(payload),
            _ => None,
        })
        .expect("the old life announces itself");
    let core = net.slots[0].core.as_mut().unwrap();
    let before = core.stats().turn_undead_dropped;
    let _ = core.handle_datagram(now, &name(2), &packet);
    let sent_to_n2: Vec<_> = std::iter::from_fn(|| core.poll_transmit())
        .filter(|t| matches!(t, cluster::Transmit::Datagram { node, .. } if node == &name(2)))
        .collect();
    assert_eq!(
        core.stats().turn_undead_dropped,
        before + 1,
        "{sent_to_n2:?}"
    );
    assert!(sent_to_n2.is_empty(), "{sent_to_n2:?}");
}

#[test]
fn a_joining_node_is_seen_by_every_member_within_a_second() {
    let mut times = Vec::new();
    for seed in seeds(20) {
        let mut net = five_nodes(seed);
        let since = net.now;
        net.start(5, Some((seed % 5) as usize)).unwrap();
        let step = Duration::from_millis(5);
        while (0..5).any(|i| !net.listed(i, "alive").contains(&"n5".to_owned())) {
            assert!(
                net.now - since < 5 * SECOND,
                "never seen; {}",
                net.replay_hint("joining")
            );
            let now = net.now;
            net.run_until(now + step);
        }
        times.push(net.now - since);
    }
    times.sort();
    let worst = times[times.len() - 1];
    eprintln!(
        "join seen by all: median {:?}, worst {worst:?}",
        times[times.len() / 2]
    );
    assert!(worst < SECOND, "worst {worst:?}");
}

#[test]
fn queries_check_their_limits() {
    let mut net = Net::new(0);
    net.start(0, None).unwrap();
    let core = net.slots[0].core.as_mut().unwrap();
    let ask =
        |core: &mut cluster::Cluster, request| core.handle_request(Duration::ZERO, None, request);
    let long_key = vec![b'k'; cluster::wire::MAX_KEY_LEN + 1];
    match ask(core, Request::ShardFor { key: long_key }) {
        Response::Refused { reason } => assert!(reason.contains("limit is 1024"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let longest = vec![b'k'; cluster::wire::MAX_KEY_LEN];
    assert!(matches!(
        ask(core, Request::ShardFor { key: longest }),
        Response::ShardFor(_)
    ));
    match ask(core, Request::ShardInfo { shard: 1024 }) {
        Response::Refused { reason } => assert!(reason.contains("0 to 1023"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Before its replicas exist, the node says it holds none instead of presenting
    // placement's wish as the shard's config.
    match ask(core, Request::ShardInfo { shard: 1023 }) {
        Response::ShardInfo(view) => {
            assert_eq!(view.state, "elsewhere", "{view:?}");
            assert_eq!(view.leader, None, "{view:?}");
            assert!(view.replicas.is_empty(), "{view:?}");
            assert_eq!(view.target, vec![name(0).to_string()], "{view:?}");
        }
        other => panic!("{other:?}"),
    }
    let core = net.slots[0].core.as_mut().unwrap();
    core.bootstrap_shards(Duration::ZERO);
    net.run_until(2 * SECOND);
    let core = net.slots[0].core.as_mut().unwrap();
    match ask(core, Request::ShardInfo { shard: 1023 }) {
        Response::ShardInfo(view) => {
            assert_eq!(view.state, "stable", "{view:?}");
            assert_eq!(
                view.leader.as_ref().map(|leader| leader.id.clone()),
                Some(name(0)),
                "{view:?}"
            );
            let roles: Vec<(NodeId, &str)> = view
                .replicas
                .iter()
                .map(|replica| (replica.node.id.clone(), replica.role.as_str()))
                .collect();
            assert_eq!(roles, vec![(name(0), "leader")], "{view:?}");
        }
        other => panic!("{other:?}"),
    }
    // A client may not join, sync or announce a leave.
    for request in [
        Request::Join {
            node_id: name(1),
            spec: None,
        },
        Request::Sync {
            members: Vec::new(),
        },
        Request::Leaving {
            identity: net_identity(1),
        },
    ] {
        assert!(matches!(ask(core, request), Response::Refused { .. }));
    }
}

fn net_identity(index: usize) -> cluster::Identity {
    cluster::Identity {
        node_id: name(index),
        addr: crate::net::addr(index),
        generation: 1,
        spec: crate::net::spec().fingerprint(),
        meta: cluster::NodeMeta::default(),
    }
}

/// A node that restarts before anyone declares it down is reported once, as a restart
/// (`MemberRenewed`), never as a second `MemberUp` of a member already up; one declared down
/// first is reported down, then up. Either way the reports alternate and end with the new
/// life up.
#[test]
fn a_restart_is_reported_once_as_a_restart_or_as_down_then_up() {
    for seed in seeds(10) {
        for (case, gap) in [("quick", Duration::ZERO), ("slow", 3 * SECOND)] {
            let mut net = five_nodes(seed);
            let marks: Vec<usize> = net.slots.iter().map(|slot| slot.events.len()).collect();
            net.crash(2);
            let now = net.now;
            net.run_until(now + gap);
            net.start(2, Some(0)).unwrap();
            let now = net.now;
            net.run_until(now + 3 * SECOND);
            for index in [0, 1, 3, 4] {
                let reports: Vec<(bool, u64)> = net.slots[index].events[marks[index]..]
                    .iter()
                    .filter_map(|(_, event)| match event {
                        cluster::Event::MemberUp(who) if who.node_id.as_str() == "n2" => {
                            Some((true, who.generation))
                        }
                        cluster::Event::MemberRenewed { after, .. }
                            if after.node_id.as_str() == "n2" =>
                        {
                            Some((true, after.generation))
                        }
                        cluster::Event::MemberDown(who) if who.node_id.as_str() == "n2" => {
                            Some((false, who.generation))
                        }
                        _ => None,
                    })
                    .collect();
                let hint = net.replay_hint("a_restart_is_reported");
                let expected: &[&[(bool, u64)]] = &[&[(true, 2)], &[(false, 1), (true, 2)]];
                assert!(
                    expected.contains(&reports.as_slice()),
                    "{case}: node {index} reported {reports:?}; {hint}"
                );
                if case == "slow" {
                    assert_eq!(reports, vec![(false, 1), (true, 2)], "{hint}");
                }
            }
        }
    }
}

/// A partition where neither side is alone (2 | 3) heals without anyone restarting: each side
/// holds the other down, and nothing but the periodic announcement to down members talks
/// across (`Config::announce_to_down_interval`, 1 s; it was 30 s). Within a few seconds of
/// the heal every node lists every other alive.
#[test]
fn a_healed_split_with_no_lonely_side_rejoins_within_seconds() {
    for seed in seeds(10) {
        let mut net = five_nodes(seed);
        net.cut = Some(vec![0, 1]);
        let now = net.now;
        net.run_until(now + 5 * SECOND);
        let hint = net.replay_hint("healed_split");
        assert!(
            net.listed(0, "down").iter().any(|name| name == "n3"),
            "the split was seen: {:?}; {hint}",
            net.core(0).members()
        );
        net.cut = None;
        let healed = net.now;
        let all_alive = |net: &Net| (0..5).all(|index| net.listed(index, "alive").len() == 5);
        while !all_alive(&net) && net.now - healed < 30 * SECOND {
            let now = net.now;
            net.run_until(now + Duration::from_millis(50));
        }
        let took = net.now - healed;
        assert!(
            all_alive(&net) && took <= 4 * SECOND,
            "every node lists every other alive {took:?} after the heal; {hint}"
        );
    }
}
