//! Shard table costs at 1000 members × 256 vnodes, 1024 shards, RF 3:
//! `cargo bench -p shardtable --bench table`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use shardtable::{Placement, Placer, ShardCount, ShardId, ShardTable, TableSpec, diff, shard_for};
use topology::{NodeId, TokenRing, VnodeCount};

fn ring_of(members: usize) -> TokenRing {
    let members = (0..members).map(|i| NodeId::new(&format!("node-{i}")).unwrap());
    TokenRing::from_members(VnodeCount::DEFAULT, members)
}

fn placement(c: &mut Criterion) {
    let ring = ring_of(1000);
    let mut group = c.benchmark_group("place_1024_shards_1000x256");
    for placement in [Placement::default(), Placement::Ring] {
        let placer = Placer::new(TableSpec {
            placement,
            ..TableSpec::default()
        });
        group.bench_function(placement.name(), |b| {
            b.iter(|| placer.place(black_box(&ring)));
        });
    }
    group.finish();

    let spec = TableSpec::default();
    let table = ShardTable::new(&spec, &ring);
    let mut joined = ring.clone();
    joined.insert(NodeId::new("node-joining").unwrap());
    let after_join = ShardTable::new(&spec, &joined);
    c.bench_function("diff_after_join_1000x256", |b| {
        b.iter(|| diff(black_box(&table), black_box(&after_join)));
    });
}

fn lookups(c: &mut Criterion) {
    let table = ShardTable::new(&TableSpec::default(), &ring_of(10));
    let key = *b"user:00000042:ab";
    c.bench_function("shard_for_16_byte_key", |b| {
        b.iter(|| shard_for(black_box(&key), black_box(ShardCount::DEFAULT)));
    });
    let mut shard = 0u16;
    c.bench_function("shard_info", |b| {
        b.iter(|| {
            shard = (shard + 1) & 1023;
            table
                .shard_info(black_box(ShardId::new(shard)))
                .map(|info| info.leader().is_some())
        });
    });
}

criterion_group!(benches, placement, lookups);
criterion_main!(benches);
