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
