//! Multi-process tests: real `node` binaries on loopback, real QUIC with mutual TLS, real
//! `kill -9`, SIGTERM and SIGSTOP, and network partitions made with nftables inside a network
//! namespace of the test's own ([`netns`]).
//!
//! Every test starts its own cluster on free ports in its own temporary directory (see
//! [`harness`]) and talks to it only through the `node` command-line client, as an operator
//! would. Build the binary first (`cargo build -p node`); the tests never run cargo. At most two
//! clusters run at once (`SLOTRING_TEST_CLUSTERS`), so two cores are not starved into false
//! failure suspicions.
//!
//! What these tests do not do: they do not test placement itself (the `shardtable` property
//! tests do) nor SWIM timing under loss (the simulator does); they check that the real processes
//! agree with the libraries and with `docs/operator.md`.

mod configs;
mod convergence;
mod failures;
mod harness;
mod kv;
mod leases;
mod moves;
mod netns;
mod partition;
mod refusals;
mod workload;

use shardtable::{Placer, ShardId, ShardTable, TableSpec};
use topology::{NodeId, TokenRing, VnodeCount};

/// The table a cluster with the default spec computes for `members`, by the libraries.
fn expected_table<'a>(members: impl IntoIterator<Item = &'a str>) -> ShardTable {
    let members = members
        .into_iter()
        .map(|id| NodeId::new(id).expect("a valid node id"));
    let ring = TokenRing::from_members(VnodeCount::DEFAULT, members);
    let spec = TableSpec {
        shards: shardtable::ShardCount::new(u32::from(harness::DEFAULT_SHARDS)).expect("a count"),
        ..TableSpec::default()
    };
    Placer::new(spec).place(&ring)
}

/// The leader and the replicas, in order, of `shard` in `table`.
fn expected_owners(table: &ShardTable, shard: u16) -> (Option<String>, Vec<String>) {
    let info = table
        .shard_info(ShardId::new(shard))
        .expect("a shard of the table");
    (
        info.leader().map(ToString::to_string),
        info.replicas().map(ToString::to_string).collect(),
    )
}
