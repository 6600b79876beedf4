//! The one error type of this crate.

/// Everything that can go wrong in `shardtable`. Every variant is a rejected input: nothing was
/// created or changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A shard count outside `1..=65536`.
    #[error("invalid shard count {given:?}: must be a whole number from 1 to 65536")]
    InvalidShardCount {
        /// The rejected input.
        given: String,
    },
    /// Text that is not a shard id (a whole number from 0 to 65535).
    #[error("invalid shard id {given:?}: must be a whole number from 0 to 65535")]
    InvalidShardId {
        /// The rejected input.
        given: String,
    },
    /// A shard id at or beyond the table's shard count.
    #[error("shard {shard} does not exist: this cluster has shards 0 to {last}", last = .count - 1)]
    ShardOutOfRange {
        /// The requested shard.
        shard: u16,
        /// How many shards there are.
        count: u32,
    },
    /// A replication factor outside `1..=MAX`.
    #[error("invalid replication factor {given:?}: must be a whole number from 1 to {max}")]
    InvalidReplicationFactor {
        /// The rejected input.
        given: String,
        /// The largest factor accepted.
        max: u8,
    },
    /// A load-bound slack ε that is not a decimal from 0 to 10 with at most three decimals.
    #[error("invalid epsilon {given:?}: must be a decimal from 0 to 10 with at most 3 decimals")]
    InvalidEpsilon {
        /// The rejected input.
        given: String,
    },
    /// A placement name other than `ring` or `bounded`.
    #[error("unknown placement {given:?}: expected \"ring\" or \"bounded\"")]
    UnknownPlacement {
        /// The rejected input.
        given: String,
    },
    /// Two tables of different shard counts or replication factors cannot be compared.
    #[error("tables are not comparable: {reason}")]
    IncompatibleTables {
        /// What differs.
        reason: String,
    },
    /// A [`TableDiff`](crate::TableDiff) that was not made from the table it is applied to.
    #[error("diff does not apply to this table: {reason}")]
    DiffDoesNotApply {
        /// The first mismatch found.
        reason: String,
    },
}
