//! Decoding and encoding the replication frames a loaded node exchanges: a [`PeerBatch`] of
//! `Append`s, one 100-byte put each, as a leader sends a follower under unpipelined load
//! (one write per shard in flight). The figure is per message, so a change in what each
//! message costs to parse (its ballots and members name their nodes) shows directly.
//!
//! `cargo bench -p cluster --bench wire`

use std::hint::black_box;

use cluster::replica::{Ballot, Entry, Member, Message, Op, PeerBatch, Pos, RequestTag, StorageId};
use cluster::wire;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use topology::NodeId;

const MESSAGES: usize = 64;

fn member(index: u128) -> Member {
    Member {
        node: NodeId::new(&format!("n{index}")).expect("valid"),
        storage: StorageId(index + 1),
    }
}

fn batch() -> PeerBatch {
    let leader = member(0);
    let b = Ballot {
        n: 7,
        node: leader.node.clone(),
    };
    let messages = (0..MESSAGES)
        .map(|i| {
            let index = 1_000 + i as u64;
            let entry = Entry {
                ballot: b.clone(),
                index,
                op: Op::Put {
                    key: format!("key:{i:012}").into_bytes(),
                    value: vec![b'v'; 100],
                },
                tag: Some(RequestTag {
                    client: 42,
                    req: i as u64,
                    attempt: 0,
                }),
            };
            let message = Message::Append {
                b: b.clone(),
                prev: Pos {
                    ballot: Some(b.clone()),
                    index: index - 1,
                },
                entries: vec![entry],
                commit: index - 1,
                hb_seq: 3,
                idle: false,
            };
            (i as u16, member(1), message)
        })
        .collect();
    PeerBatch {
        from: leader,
        messages,
    }
}

fn frames(c: &mut Criterion) {
    let batch = batch();
    let bytes = wire::encode(&batch);
    let mut group = c.benchmark_group("peer_batch");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group.bench_function("decode 64 appends", |b| {
        b.iter(|| wire::decode::<PeerBatch>(black_box(&bytes)).expect("decodes"));
    });
    group.bench_function("encode 64 appends", |b| {
        b.iter(|| wire::encode(black_box(&batch)));
    });
    group.finish();
}

criterion_group!(benches, frames);
criterion_main!(benches);
