//! The one error type of the `cluster` crate.

use topology::NodeId;

/// What went wrong in the cluster core. Unless a variant says otherwise, nothing changed: the
/// input was dropped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A frame or datagram did not decode.
    #[error("malformed message: {0}")]
    Decode(String),
    /// A frame carried another wire version.
    #[error("peer speaks wire version {theirs}, this node speaks {ours}")]
    WireVersion {
        /// The peer's version.
        theirs: u16,
        /// Ours.
        ours: u16,
    },
    /// A frame had bytes after its message.
    #[error("{count} trailing bytes after the message")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// A datagram's tag byte is unknown.
    #[error("unknown datagram tag {0}")]
    UnknownDatagram(u8),
    /// A peer's packet claims another node id than its certificate names.
    #[error("certificate names {certificate} but the packet claims to come from {claimed}")]
    IdentityMismatch {
        /// The certificate's node id.
        certificate: NodeId,
        /// The node id in the packet.
        claimed: NodeId,
    },
    /// A packet came from a member of a cluster with another spec.
    #[error("packet from {node}, a member with another cluster spec")]
    ForeignSpec {
        /// The sender.
        node: NodeId,
    },
    /// foca refused the input; SWIM state may have changed as foca documents for the error.
    #[error("swim: {0}")]
    Swim(String),
    /// A cluster spec is malformed.
    #[error("invalid cluster spec: {problem}")]
    InvalidSpec {
        /// What is wrong.
        problem: String,
    },
    /// A client's key is longer than the limit.
    #[error("key is {len} bytes; the limit is {max}")]
    KeyTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A client's value is longer than the limit.
    #[error("value is {len} bytes; the limit is {max}")]
    ValueTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
}
