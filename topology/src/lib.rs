//! Node identities, vnode tokens and the token ring of a slotring cluster.
//!
//! A [`NodeId`] is a member's stable, operator-visible name. Each member puts `V` virtual nodes
//! ("vnodes") on a 64-bit ring at [`Token::of_vnode`]; a [`TokenRing`] keeps the sorted tokens of
//! the live members and answers ring walks: which members follow a position clockwise.
//!
//! What this crate deliberately does not do: it does not decide who is a member (SWIM does, in
//! the `cluster` crate), it knows nothing of shards or replica placement (see `shardtable`), and
//! it performs no IO, reads no clock and draws no randomness. The same members give the same
//! ring on every node, whatever order they were added in.
//!
//! ```
//! use topology::{NodeId, Token, TokenRing, VnodeCount};
//!
//! let mut ring = TokenRing::new(VnodeCount::DEFAULT);
//! for name in ["n0", "n1", "n2"] {
//!     ring.insert(name.parse::<NodeId>()?);
//! }
//! let owners = ring.first_distinct(Token::new(42), 2);
//! assert_eq!(owners.len(), 2);
//! assert_ne!(owners[0], owners[1]);
//! # Ok::<(), topology::Error>(())
//! ```

mod error;
mod node_id;
mod ring;
mod token;
mod token_batch;

pub use crate::error::{Error, InvalidNodeId};
pub use crate::node_id::{MAX_NODE_ID_LEN, NodeId};
pub use crate::ring::{MemberIndex, TokenRing, Walk};
pub use crate::token::{Token, VnodeCount};
