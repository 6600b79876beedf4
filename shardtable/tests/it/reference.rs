//! The reference vectors of DESIGN.md, so every implementation places shards identically.

use shardtable::{Placement, ShardCount, ShardTable, TableSpec};
use topology::{NodeId, TokenRing, VnodeCount};

/// `Σ_s (s+1)·(a·10007 + b·101 + c)` over every shard's owners `[a, b, c]`, written as the
/// numbers in the names `node-0`..`node-99`.
fn reference_checksum(placement: Placement) -> u64 {
    reference_table(placement)
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

/// The reference setting: nodes `node-0`..`node-99`, 64 vnodes, 1024 shards, RF 3.
fn reference_table(placement: Placement) -> ShardTable {
    let members = (0..100).map(|i| NodeId::new(&format!("node-{i}")).unwrap());
    let ring = TokenRing::from_members(VnodeCount::new(64).unwrap(), members);
    let spec = TableSpec {
        shards: ShardCount::new(1024).unwrap(),
        placement,
        ..TableSpec::default()
    };
    ShardTable::new(&spec, &ring)
}

#[test]
fn plain_walk_matches_design_md() {
    assert_eq!(reference_checksum(Placement::Ring), 270_528_273_793);
}

#[test]
fn bounded_walk_matches_design_md() {
    assert_eq!(reference_checksum(Placement::default()), 262_647_465_535);
}

/// DESIGN.md's leader rule ("the first chosen, if all are at the cap") lets a member lead one
/// shard more than its cap, and the reference table itself does so: a stricter rule would
/// change the pinned checksum. Memberships stay within their cap.
#[test]
fn reference_table_exceeds_only_the_leadership_cap() {
    let table = reference_table(Placement::default());
    let caps = TableSpec::default().load_caps(100).unwrap();
    assert_eq!((caps.memberships, caps.leaderships), (34, 12));
    assert!(table.membership_counts().iter().all(|&held| held <= 34));
    let mut over: Vec<u32> = table
        .leader_counts()
        .into_iter()
        .filter(|&led| led > 12)
        .collect();
    over.sort_unstable();
    assert_eq!(over, [13, 13, 13, 13]);
}
