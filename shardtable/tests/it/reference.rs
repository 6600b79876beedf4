//! The reference vectors of DESIGN.md, so every implementation places shards identically.

use shardtable::{Placement, ShardCount, ShardTable, TableSpec};
use topology::{NodeId, TokenRing, VnodeCount};

/// `Σ_s (s+1)·(a·10007 + b·101 + c)` over every shard's owners `[a, b, c]`, written as the
/// numbers in the names `node-0`..`node-99`.
fn reference_checksum(placement: Placement) -> u64 {
    let members = (0..100).map(|i| NodeId::new(&format!("node-{i}")).unwrap());
    let ring = TokenRing::from_members(VnodeCount::new(64).unwrap(), members);
    let spec = TableSpec {
        shards: ShardCount::new(1024).unwrap(),
        placement,
        ..TableSpec::default()
    };
    let table = ShardTable::new(&spec, &ring);
    table
        .iter()
        .map(|info| {
            let numbers: Vec<u64> = info
                .replicas()
                .map(|id| id.as_str()["node-".len()..].parse().unwrap())
                .collect();
            let [a, b, c] = numbers[..] else {
                panic!("{info}: expected three owners");
            };
            (u64::from(info.shard().get()) + 1) * (a * 10007 + b * 101 + c)
        })
        .sum()
}

#[test]
fn plain_walk_matches_design_md() {
    assert_eq!(reference_checksum(Placement::Ring), 270_528_273_793);
}

#[test]
fn bounded_walk_matches_design_md() {
    assert_eq!(reference_checksum(Placement::default()), 262_647_465_535);
}
