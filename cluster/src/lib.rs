//! One node's sans-IO cluster state: SWIM membership through foca, the cluster spec, the live
//! `ShardTable`, and the messages nodes and the CLI exchange.
//!
//! [`Cluster`] follows quinn-proto: inputs are `handle_*(now, ...)`, outputs are polled
//! (`poll_transmit`, `poll_event`, `poll_timeout`). Time is whatever monotonic clock the caller
//! reads, passed in as a [`Duration`](core::time::Duration); randomness comes from a seed.
//!
//! What it deliberately does not do: no sockets, no tokio, no clock, no threads, no files. It
//! does not authenticate peers (the transport does, and passes the certificate's node id in);
//! it does not decide who may write to a shard (that is the replication protocol's job); its
//! table is the placement for the members it currently sees as active.

mod core;
mod error;
pub mod identity;
pub mod replica;
mod shards;
pub mod spec;
mod timers;
pub mod wire;

pub use crate::core::{Cluster, Config, Event, RequestId, Stats, Transmit};
pub use crate::error::Error;
pub use crate::identity::{Identity, NodeMeta};
pub use crate::spec::{ClusterSpec, SpecFingerprint};
