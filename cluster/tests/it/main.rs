//! Integration tests of the cluster core on a deterministic in-memory network.

mod hosts;
mod leases;
mod membership;
mod model;
mod net;
mod replica;
mod shards;
mod wire;
