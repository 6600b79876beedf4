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
            })],
        };
        let bytes = wire::encode(&batch);
        prop_assert_eq!(wire::decode::<PeerBatch>(&bytes).unwrap(), batch);
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
    other_version[0] = 2;
    assert!(matches!(
        wire::decode::<Request>(&other_version),
        Err(cluster::Error::WireVersion { theirs: 2, .. })
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
