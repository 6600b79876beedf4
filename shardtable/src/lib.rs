//! Fixed shard ids, key → shard hashing, and replica placement over the token ring.
//!
//! A cluster has a fixed number of shards ([`ShardCount`], default 1024). A key hashes to a
//! [`ShardId`] forever ([`shard_for`]); only the nodes hosting a shard change. A [`ShardTable`]
//! answers, for every shard, which members lead and replicate it, precomputed from a
//! [`TokenRing`](topology::TokenRing) so that a lookup is an array index. Two placements exist
//! ([`Placement`]): the plain ring walk of Dynamo, and the default ring walk with bounded loads,
//! which keeps every member within `1 + ε` of its fair share while moving almost nothing more on
//! a join. [`TableDiff`] lists what a membership change moves; [`TableDigest`] lets two nodes
//! compare their views in 32 bytes.
//!
//! What this crate deliberately does not do: it does not decide who is a member or who may
//! write (the replication protocol in `cluster` does; placement only sets a *target*), it holds
//! no shard data, and it performs no IO, reads no clock and draws no randomness. Everything here
//! is a pure function of its inputs, identical on every node.
//!
//! ```
//! use shardtable::{ShardTable, TableSpec};
//! use topology::{NodeId, TokenRing, VnodeCount};
//!
//! let members = ["n0", "n1", "n2", "n3"].map(|name| name.parse::<NodeId>().unwrap());
//! let ring = TokenRing::from_members(VnodeCount::DEFAULT, members);
//! let table = ShardTable::new(&TableSpec::default(), &ring);
//! let shard = table.shard_for(b"user:42");
//! let info = table.shard_info(shard)?;
//! assert_eq!(info.replicas().len(), 3);
//! assert_eq!(info.replicas().next(), info.leader());
//! # Ok::<(), shardtable::Error>(())
//! ```

mod diff;
mod error;
mod placement;
mod shard;
mod spec;
mod table;

pub use crate::diff::{ShardChange, TableDiff, diff};
pub use crate::error::Error;
pub use crate::placement::Placer;
pub use crate::shard::{ShardCount, ShardId, jump_consistent_hash, shard_for};
pub use crate::spec::{Epsilon, LoadCaps, Placement, ReplicationFactor, TableSpec};
pub use crate::table::{Replicas, ShardInfo, ShardTable, TableDigest};
