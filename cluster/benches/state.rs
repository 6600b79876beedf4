//! A replica's key-value state alone ([`KvState`]), as a loaded node applies writes: 1,024
//! shards' states holding 100,000 or 1,000,000 keys of 100 bytes in all, written and read at
//! random keys (`node bench`'s `key:N` names and sizes), each key in the shard its hash picks.
//! The figure is the CPU time per write applied (or per read) on one replica. Here the states
//! stay in the CPU's caches far more than in a node, whose event loop touches much else between
//! two writes to one shard: the 1,000,000-key rows are the nearer to a node's.
//!
//! `cargo bench -p cluster --bench state`

use std::hint::black_box;

use cluster::replica::KvState;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const SHARDS: usize = 1024;
/// Operations per iteration, at random keys.
const OPS: usize = 1 << 16;

fn key(k: u64) -> Vec<u8> {
    format!("key:{k}").into_bytes()
}

fn shard_of(key: &[u8]) -> usize {
    (xxhash_rust::xxh3::xxh3_64(key) % SHARDS as u64) as usize
}

/// Every key held, as a state loaded from disk holds it (one image per shard).
fn loaded(keys: u64, value: &[u8]) -> Vec<KvState> {
    let mut states: Vec<KvState> = (0..SHARDS).map(|_| KvState::new()).collect();
    for k in 0..keys {
        let key = key(k);
        states[shard_of(&key)].insert(&key, value);
    }
    states
        .into_iter()
        .map(|state| KvState::from_image(state.to_image()))
        .collect()
}

/// `OPS` random keys with their shards, the same every run (a fixed xorshift sequence).
fn picks(keys: u64) -> Vec<(usize, Vec<u8>)> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..OPS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = key(x % keys);
            (shard_of(&key), key)
        })
        .collect()
}

fn apply_and_read(c: &mut Criterion) {
    let value = vec![b'x'; 100];
    let mut group = c.benchmark_group("state");
    group.throughput(Throughput::Elements(OPS as u64));
    for (keys, name) in [(100_000, "100k"), (1_000_000, "1m")] {
        let picks = picks(keys);
        let mut states = loaded(keys, &value);
        group.bench_function(format!("insert_{name}_keys_1024_shards"), |b| {
            b.iter(|| {
                for (shard, key) in &picks {
                    states[*shard].insert(key, &value);
                }
            });
        });
        group.bench_function(format!("get_{name}_keys_1024_shards"), |b| {
            b.iter(|| {
                for (shard, key) in &picks {
                    black_box(states[*shard].get(key));
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, apply_and_read);
criterion_main!(benches);
