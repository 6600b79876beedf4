//! Peer bytes never panic: arbitrary frames and datagrams are errors, and roundtrips hold.

use cluster::wire::{self, Request, Response};
use proptest::prelude::*;

use crate::net::{Net, name};

proptest! {
    #[test]
    fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = wire::decode::<Request>(&bytes);
        let _ = wire::decode::<Response>(&bytes);
    }

    #[test]
    fn arbitrary_datagrams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut net = Net::new(0);
        net.start(0, None).unwrap();
        let core = net.slots[0].core.as_mut().unwrap();
        let mut datagram = vec![wire::DATAGRAM_SWIM];
        datagram.extend_from_slice(&bytes);
        let _ = core.handle_datagram(std::time::Duration::ZERO, &name(1), &datagram);
        let _ = core.handle_datagram(std::time::Duration::ZERO, &name(1), &bytes);
    }

    #[test]
    fn arbitrary_replication_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = wire::decode::<cluster::replica::PeerBatch>(&bytes);
        let _ = wire::decode::<cluster::replica::Message>(&bytes);
    }

    #[test]
    fn a_peer_batch_roundtrips(n in 0u64..1000, index in 0u64..1000, key in proptest::collection::vec(any::<u8>(), 0..32)) {
        use cluster::replica::{Ballot, Entry, Member, Message, Op, PeerBatch, Pos, StorageId};
        let b = Ballot { n, node: name(1) };
        let entry = Entry { ballot: b.clone(), index: index + 1, op: Op::Put { key, value: vec![1] }, tag: None };
        let batch = PeerBatch {
            from: Member { node: name(1), storage: StorageId(7) },
            messages: vec![(42, Member { node: name(2), storage: StorageId(9) }, Message::Append {
                b: b.clone(),
                prev: Pos { ballot: Some(b), index },
                entries: vec![entry],
                commit: index,
                hb_seq: 3,
                idle: false,
            })],
        };
        let bytes = wire::encode(&batch);
        // The same bytes whatever room the buffer starts with, the size hint's included.
        for capacity in [0, 3, batch.encoded_len_hint()] {
            prop_assert_eq!(&wire::encode_with_capacity(&batch, capacity), &bytes);
        }
        prop_assert_eq!(wire::decode::<PeerBatch>(&bytes).unwrap(), batch);
    }

    #[test]
    fn snapshot_messages_roundtrip_and_corrupted_frames_never_panic(
        n in 0u64..1000,
        index in 0u64..1000,
        seq in 0u64..100,
        pairs in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..16), proptest::collection::vec(any::<u8>(), 0..16)),
            0..8,
        ),
        last in any::<bool>(),
        flip in any::<usize>(),
        bit in 0u8..8,
        cut in any::<usize>(),
    ) {
        let batch = snapshot_batch(n, index, seq, pairs, last);
        let bytes = wire::encode(&batch);
        prop_assert_eq!(wire::decode::<cluster::replica::PeerBatch>(&bytes).unwrap(), batch);
        // A flipped bit or a cut frame is an error or another valid frame; a host given
        // whatever decodes never panics.
        let mut flipped = bytes.clone();
        let at = flip % flipped.len();
        flipped[at] ^= 1 << bit;
        let truncated = &bytes[..cut % (bytes.len() + 1)];
        for frame in [flipped.as_slice(), truncated] {
            if let Ok(decoded) = wire::decode::<cluster::replica::PeerBatch>(frame) {
                let mut host = cluster::replica::ShardHost::new(
                    name(2),
                    cluster::replica::StorageId(9),
                    cluster::replica::ReplicaConfig::default(),
                    1,
                );
                host.handle_peer_batch(std::time::Duration::ZERO, decoded);
                while host.poll_transmit().is_some() {}
                while host.poll_persist().is_some() {}
            }
        }
    }

    #[test]
    fn shard_for_roundtrips(key in proptest::collection::vec(any::<u8>(), 0..64)) {
        let request = Request::ShardFor { key };
        let bytes = wire::encode(&request);
        prop_assert_eq!(wire::decode::<Request>(&bytes).unwrap(), request);
    }
}

#[test]
fn trailing_bytes_and_other_versions_are_refused() {
    let mut bytes = wire::encode(&Request::Members);
    assert!(wire::decode::<Request>(&bytes).is_ok());
    bytes.push(0);
    assert!(matches!(
        wire::decode::<Request>(&bytes),
        Err(cluster::Error::TrailingBytes { count: 1 })
    ));
    let mut other_version = wire::encode(&Request::Members);
    // The version is postcard's varint: one byte below 128.
    let theirs = wire::WIRE_VERSION + 1;
    other_version[0] = u8::try_from(theirs).expect("a version below 128");
    assert!(matches!(
        wire::decode::<Request>(&other_version),
        Err(cluster::Error::WireVersion { theirs: t, .. }) if t == theirs
    ));
}

#[test]
fn an_invalid_node_id_in_a_frame_is_an_error() {
    // A Join whose node id has a space: postcard string "a b".
    let mut bytes = wire::encode(&Request::Join {
        node_id: name(1),
        spec: None,
    });
    let at = bytes.iter().position(|&b| b == b'n').unwrap();
    bytes[at] = b' ';
    assert!(wire::decode::<Request>(&bytes).is_err());
}

/// A frame with one `Snapshot` chunk (valid digest) and one `SnapshotOk`.
fn snapshot_batch(
    n: u64,
    index: u64,
    seq: u64,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    last: bool,
) -> cluster::replica::PeerBatch {
    use cluster::replica::{
        Ballot, Config, Member, Message, PeerBatch, Pos, StorageId, snapshot_digest,
    };
    let b = Ballot { n, node: name(1) };
    let base = Pos {
        ballot: Some(b.clone()),
        index,
    };
    let config = Config {
        voters: vec![Member {
            node: name(1),
            storage: StorageId(7),
        }],
        learners: vec![Member {
            node: name(2),
            storage: StorageId(9),
        }],
    };
    let digest = snapshot_digest(&b, &base, &config, seq, &pairs, last);
    let to = Member {
        node: name(2),
        storage: StorageId(9),
    };
    PeerBatch {
        from: Member {
            node: name(1),
            storage: StorageId(7),
        },
        messages: vec![
            (
                3,
                to.clone(),
                Message::Snapshot {
                    b: b.clone(),
                    base: base.clone(),
                    config,
                    seq,
                    pairs,
                    last,
                    digest,
                },
            ),
            (
                3,
                to,
                Message::SnapshotOk {
                    b,
                    base,
                    next: seq,
                    done: last,
                },
            ),
        ],
    }
}

/// What `Message::is_well_formed` turns away: entries out of place in an `Append`, a ballot
/// above the leader's, a counter at the limit, a promise whose suffix does not end at its
/// `last`, a config without voters or naming a member twice; and what it lets through: the
/// messages a replica sends.
#[test]
fn malformed_replication_messages_are_told_apart() {
    use cluster::replica::{Ballot, Config, Entry, Member, Message, Op, Pos, StorageId};
    let ballot = |n| Ballot { n, node: name(1) };
    let entry = |n, index| Entry {
        ballot: ballot(n),
        index,
        op: Op::Put {
            key: vec![1],
            value: vec![2],
        },
        tag: None,
    };
    let member = |i| Member {
        node: name(i),
        storage: StorageId(i as u128),
    };
    let append = |prev: Pos, entries: Vec<Entry>| Message::Append {
        b: ballot(3),
        prev,
        entries,
        commit: 0,
        hb_seq: 0,
        idle: false,
    };
    let at = |n, index| Pos {
        ballot: Some(ballot(n)),
        index,
    };
    assert!(append(at(2, 7), vec![entry(2, 8), entry(3, 9)]).is_well_formed());
    assert!(append(Pos::ORIGIN, vec![entry(1, 1)]).is_well_formed());
    assert!(append(at(3, 7), vec![]).is_well_formed());
    // An entry out of place, a gap, a ballot going back, one above the leader's.
    assert!(!append(at(2, 7), vec![entry(2, 0)]).is_well_formed());
    assert!(!append(at(2, 7), vec![entry(2, 8), entry(2, 10)]).is_well_formed());
    assert!(!append(at(2, 7), vec![entry(3, 8), entry(2, 9)]).is_well_formed());
    assert!(!append(at(2, 7), vec![entry(4, 8)]).is_well_formed());
    assert!(!append(at(4, 7), vec![]).is_well_formed());
    assert!(!append(at(2, u64::MAX), vec![entry(2, 0)]).is_well_formed());

    let config = |voters: Vec<Member>, learners: Vec<Member>| Config { voters, learners };
    let good = config(vec![member(1), member(2)], vec![member(3)]);
    assert!(good.is_well_formed());
    assert!(!config(vec![], vec![member(3)]).is_well_formed());
    assert!(!config(vec![member(1), member(1)], vec![]).is_well_formed());
    assert!(!config(vec![member(1)], vec![member(1)]).is_well_formed());
    let mut bad_config = entry(2, 8);
    bad_config.op = Op::Config(config(vec![], vec![]));
    assert!(!append(at(2, 7), vec![bad_config]).is_well_formed());

    // Counters at or above the limit: the next ballot, or the index after one, would
    // overflow.
    let limit = cluster::replica::COUNTER_LIMIT;
    assert!(!Message::TimeoutNow { b: ballot(limit) }.is_well_formed());
    assert!(
        Message::TimeoutNow {
            b: ballot(limit - 1)
        }
        .is_well_formed()
    );
    let ack = |matched| Message::AppendOk {
        b: ballot(3),
        matched,
        hb_seq: 1,
        lease: false,
    };
    assert!(ack(limit - 1).is_well_formed());
    assert!(!ack(u64::MAX).is_well_formed());
    assert!(!append(at(2, limit - 1), vec![entry(2, limit)]).is_well_formed());

    let promise = |last: Pos, suffix: Option<Vec<Entry>>| Message::Promise {
        b: ballot(3),
        last,
        config: good.clone(),
        suffix,
    };
    assert!(promise(at(2, 9), Some(vec![entry(2, 8), entry(2, 9)])).is_well_formed());
    assert!(promise(at(2, 9), Some(vec![])).is_well_formed());
    assert!(promise(at(2, 9), None).is_well_formed());
    assert!(!promise(at(2, 10), Some(vec![entry(2, 8), entry(2, 9)])).is_well_formed());
    assert!(!promise(at(2, 9), Some(vec![entry(2, 9), entry(2, 9)])).is_well_formed());
}

/// Peer and client bytes never panic a node's core: requests of every kind a node or the CLI
/// sends, each with a few bytes changed and decoded as a node decodes a frame, handed to a
/// node of a running three-node cluster as from a peer and as from a client; client
/// operations the same way. What decodes is answered or refused; nothing panics.
#[test]
fn mangled_requests_never_panic_a_node() {
    use cluster::replica::{ClientOp, ClientRoute};
    use rand::SeedableRng;
    use std::time::Duration;
    let test = "mangled_requests_never_panic_a_node";
    for seed in crate::net::seeds(4) {
        let mut net = crate::shards::three_nodes(seed);
        let core = net.core(0);
        let templates = [
            Request::Join {
                node_id: name(1),
                spec: Some(crate::net::spec()),
            },
            Request::Digest {
                table: [7; 32],
                members: 3,
            },
            Request::Leaving {
                identity: core.identity().clone(),
            },
            Request::ShardInfo { shard: 42 },
            Request::ShardFor {
                key: b"user:1000".to_vec(),
            },
            Request::Members,
            Request::ShardDigests { after: Some(3) },
            Request::Status,
            Request::Ring,
            Request::Client {
                op: ClientOp::Put {
                    key: b"user:1000".to_vec(),
                    value: vec![9; 40],
                },
                route: ClientRoute::Routed,
            },
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (mut decoded, mut token) = (0, 0);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for round in 0..400 {
                for template in &templates {
                    let mut bytes = wire::encode(template);
                    crate::net::mangle_bytes(&mut bytes, &mut rng);
                    let Ok(request) = wire::decode::<Request>(&bytes) else {
                        continue;
                    };
                    decoded += 1;
                    let index = round % 3;
                    let now = net.now;
                    let Some(core) = net.slots[index].core.as_mut() else {
                        continue;
                    };
                    match request {
                        Request::Client { op, route } => {
                            token += 1;
                            let _ = core.handle_client(now, token, op, route);
                        }
                        request => {
                            let from = (round % 2 == 0).then(|| name((index + 1) % 3));
                            let _ = core.handle_request(now, from.as_ref(), request);
                        }
                    }
                }
                let until = net.now + Duration::from_millis(5);
                net.run_until(until);
            }
        }));
        assert!(
            run.is_ok(),
            "a node panicked on a mangled request; seed {seed}: replay with \
             SLOTRING_SEED={seed} cargo test -p cluster --test it {test}"
        );
        // Most mangled requests still decode: the test reaches the handlers.
        assert!(decoded > 400, "only {decoded} mangled requests decoded");
    }
}

/// A peer's replication frame is screened before the shards see it: a message for a shard the
/// spec does not have (which, as a leader's `Append`, would create that replica here) and a
/// malformed one are dropped and counted; the frame is still acknowledged.
#[test]
fn replication_messages_for_no_shard_or_malformed_are_dropped_and_counted() {
    use cluster::replica::{Ballot, Entry, Member, Message, Op, PeerBatch, Pos, StorageId};
    let mut net = Net::new(0);
    net.start(0, None).unwrap();
    net.bootstrap_shards(0);
    let now = net.now;
    let core = net.slots[0].core.as_mut().unwrap();
    let me = Member {
        node: name(0),
        storage: core.identity().meta.storage,
    };
    let b = Ballot {
        n: 9,
        node: name(1),
    };
    let append = |index| Message::Append {
        b: b.clone(),
        prev: Pos {
            ballot: Some(b.clone()),
            index: 4,
        },
        entries: vec![Entry {
            ballot: b.clone(),
            index,
            op: Op::Put {
                key: vec![1],
                value: vec![2],
            },
            tag: None,
        }],
        commit: 4,
        hb_seq: 1,
        idle: false,
    };
    let batch = PeerBatch {
        from: Member {
            node: name(1),
            storage: StorageId(11),
        },
        messages: vec![(60_000, me.clone(), append(5)), (3, me.clone(), append(0))],
    };
    let before = core.stats();
    let answer = core.handle_request(now, Some(&name(1)), Request::Replicate(batch));
    assert_eq!(answer, Response::Ack);
    let after = core.stats();
    assert_eq!(
        after.unknown_shard_messages - before.unknown_shard_messages,
        1
    );
    assert_eq!(
        after.malformed_replication_messages - before.malformed_replication_messages,
        1
    );
    // `node status` reports the same counters.
    assert_eq!(core.status().stats, after);
}

/// Peer bytes never panic a cluster: five nodes start, join, take their shards and take
/// client writes while a fifth of every datagram, node-to-node request and answer, and
/// replication frame has a few bytes changed in flight (what still decodes is delivered);
/// one node crashes and restarts, another leaves. Only panics are checked.
#[test]
fn a_cluster_under_mangled_traffic_never_panics() {
    use cluster::replica::ClientOp;
    use std::time::Duration;
    let test = "a_cluster_under_mangled_traffic_never_panics";
    for seed in crate::net::seeds(6) {
        let run = std::panic::catch_unwind(|| {
            let mut net = Net::new(seed);
            net.mangle_per_mille = 200;
            net.start(0, None).unwrap();
            net.bootstrap_shards(0);
            net.run_until(Duration::from_secs(1));
            for index in 1..5 {
                net.start(index, Some(index - 1)).unwrap();
            }
            for step in 0..300u64 {
                let index = (step % 5) as usize;
                if net.slots[index].core.is_some() {
                    let op = ClientOp::Put {
                        key: format!("key-{step}").into_bytes(),
                        value: vec![step as u8; 16],
                    };
                    net.client(index, step, op);
                }
                match step {
                    100 => net.crash(2),
                    150 => net.start(2, Some(0)).unwrap(),
                    200 => net.leave(4),
                    _ => {}
                }
                let until = net.now + Duration::from_millis(50);
                net.run_until(until);
            }
        });
        assert!(
            run.is_ok(),
            "a node panicked on mangled traffic; seed {seed}: replay with SLOTRING_SEED={seed} \
             cargo test -p cluster --test it {test}"
        );
    }
}
