//! Token ring costs at 1000 members × 256 vnodes: `cargo bench -p topology --bench ring`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use topology::{NodeId, Token, TokenRing, VnodeCount};

const MEMBERS: usize = 1000;

fn members() -> Vec<NodeId> {
    (0..MEMBERS)
        .map(|i| NodeId::new(&format!("node-{i}")).unwrap())
        .collect()
}

fn ring(c: &mut Criterion) {
    let vnodes = VnodeCount::DEFAULT;
    let members = members();
    let full = TokenRing::from_members(vnodes, members.clone());
    let newcomer = NodeId::new("node-joining").unwrap();
    eprintln!(
        "ring memory: {:.2} bytes per vnode ({} vnodes)",
        full.token_heap_bytes() as f64 / full.token_count() as f64,
        full.token_count()
    );

    let mut group = c.benchmark_group("ring_1000x256");
    group.sample_size(30);
    group.bench_function("insert_one_member", |b| {
        b.iter_batched_ref(
            || full.clone(),
            |ring| ring.insert(black_box(newcomer.clone())),
            BatchSize::LargeInput,
        );
    });
    group.bench_function("remove_one_member", |b| {
        b.iter_batched_ref(
            || full.clone(),
            |ring| ring.remove(black_box(&members[MEMBERS / 2])),
            BatchSize::LargeInput,
        );
    });
    group.bench_function("full_rebuild", |b| {
        b.iter(|| TokenRing::from_members(vnodes, black_box(&members).iter().cloned()));
    });
    // The straightforward implementations the targets compare against, measured in the same
    // run: hash every token with the blake3 crate and sort the whole ring; insert by appending
    // and re-sorting.
    group.bench_function("baseline_full_rebuild", |b| {
        b.iter(|| straightforward_build(black_box(&members)));
    });
    let (tokens, _) = straightforward_build(&members);
    group.bench_function("baseline_insert_one_member", |b| {
        b.iter_batched_ref(
            || tokens.clone(),
            |tokens| {
                tokens.extend((0..256).map(|v| (Token::of_vnode(&newcomer, v).get(), u32::MAX)));
                tokens.sort_unstable();
            },
            BatchSize::LargeInput,
        );
    });
    group.bench_function("hash_one_token", |b| {
        b.iter(|| Token::of_vnode(black_box(&newcomer), black_box(17)));
    });
    group.finish();
}

/// Every token hashed one by one, one comparison sort: the ~24 ms design anchor.
fn straightforward_build(members: &[NodeId]) -> (Vec<(u64, u32)>, usize) {
    let mut entries = Vec::with_capacity(members.len() * 256);
    for (owner, member) in (0u32..).zip(members) {
        entries.extend((0..256).map(|v| (Token::of_vnode(member, v).get(), owner)));
    }
    entries.sort_unstable();
    let len = entries.len();
    (entries, len)
}

criterion_group!(benches, ring);
criterion_main!(benches);
