//! The one error type of this crate.

use std::fmt;

/// Everything that can go wrong in `topology`: only ever bad input, rejected before any state
/// changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A string was not a valid [`NodeId`](crate::NodeId). Nothing was created.
    #[error("invalid node id {shown}: {problem}")]
    InvalidNodeId {
        /// The rejected input, quoted and escaped, cut to a readable length.
        shown: String,
        /// What is wrong with it.
        problem: InvalidNodeId,
    },
    /// A vnode count outside `1..=MAX`. Nothing was created.
    #[error("invalid vnode count {given:?}: must be a whole number from 1 to {max}")]
    InvalidVnodeCount {
        /// The rejected input.
        given: String,
        /// The largest count accepted, [`VnodeCount::MAX`](crate::VnodeCount::MAX).
        max: u32,
    },
}

/// Why a string is not a valid [`NodeId`](crate::NodeId).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvalidNodeId {
    /// The string is empty.
    Empty,
    /// The string is longer than [`MAX_NODE_ID_LEN`](crate::MAX_NODE_ID_LEN) bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The string contains whitespace.
    Whitespace {
        /// Byte offset of the first offending character.
        at: usize,
    },
    /// The string contains a control or invisible formatting character.
    NotPrintable {
        /// Byte offset of the first offending character.
        at: usize,
    },
}

impl fmt::Display for InvalidNodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InvalidNodeId::Empty => f.write_str("it is empty"),
            InvalidNodeId::TooLong { len } => write!(
                f,
                "it is {len} bytes long, at most {} are allowed",
                crate::MAX_NODE_ID_LEN
            ),
            InvalidNodeId::Whitespace { at } => write!(f, "it contains whitespace at byte {at}"),
            InvalidNodeId::NotPrintable { at } => {
                write!(f, "it contains a non-printable character at byte {at}")
            }
        }
    }
}
