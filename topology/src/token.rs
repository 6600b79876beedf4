//! [`Token`]: a position on the 64-bit ring, and [`VnodeCount`].

use std::fmt;
use std::num::NonZeroU32;

use crate::error::Error;
use crate::node_id::{MAX_NODE_ID_LEN, NodeId};

/// A position on the 64-bit token ring. Positions grow clockwise and wrap from `u64::MAX` to 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Token(u64);

impl Token {
    /// The token at `position`.
    pub const fn new(position: u64) -> Self {
        Token(position)
    }

    /// The position as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token of `node`'s vnode number `vnode`:
    /// `u64_le(blake3(utf8(node_id) ‖ u32_le(vnode))[0..8])`, as DESIGN.md defines it.
    pub fn of_vnode(node: &NodeId, vnode: u32) -> Token {
        let name = node.as_bytes();
        let mut input = [0u8; MAX_NODE_ID_LEN + 4];
        input[..name.len()].copy_from_slice(name);
        input[name.len()..name.len() + 4].copy_from_slice(&vnode.to_le_bytes());
        Token::of_bytes(&input[..name.len() + 4])
    }

    /// `u64_le(blake3(bytes)[0..8])`: how every position on the ring is derived.
    pub fn of_bytes(bytes: &[u8]) -> Token {
        let hash = blake3::hash(bytes);
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&hash.as_bytes()[..8]);
        Token(u64::from_le_bytes(prefix))
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

/// How many vnodes each member puts on the ring: `1..=`[`VnodeCount::MAX`], default 256.
///
/// More vnodes spread each member's share more evenly and make ring operations proportionally
/// slower; 256 is plenty with the bounded-load placement of `shardtable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VnodeCount(NonZeroU32);

impl VnodeCount {
    /// The default, 256 vnodes per member.
    pub const DEFAULT: VnodeCount = VnodeCount(NonZeroU32::new(256).unwrap());
    /// The largest count accepted.
    pub const MAX: u32 = 4096;

    /// Validates a vnode count.
    pub fn new(count: u32) -> Result<Self, Error> {
        match NonZeroU32::new(count) {
            Some(count) if count.get() <= Self::MAX => Ok(VnodeCount(count)),
            _ => Err(Error::InvalidVnodeCount {
                given: count.to_string(),
                max: Self::MAX,
            }),
        }
    }

    /// The count as a number.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

impl Default for VnodeCount {
    fn default() -> Self {
        VnodeCount::DEFAULT
    }
}

impl fmt::Display for VnodeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for VnodeCount {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidVnodeCount {
            given: text.to_owned(),
            max: Self::MAX,
        };
        let count: u32 = text.trim().parse().map_err(|_| invalid())?;
        VnodeCount::new(count).map_err(|_| invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_the_blake3_prefix_of_name_and_vnode() {
        let node = NodeId::new("node-0").unwrap();
        let mut input = b"node-0".to_vec();
        input.extend_from_slice(&7u32.to_le_bytes());
        let hash = blake3::hash(&input);
        let expected = u64::from_le_bytes(hash.as_bytes()[..8].try_into().unwrap());
        assert_eq!(Token::of_vnode(&node, 7).get(), expected);
    }

    #[test]
    fn longest_name_fits_the_hash_input() {
        let node = NodeId::new(&"z".repeat(MAX_NODE_ID_LEN)).unwrap();
        assert_ne!(Token::of_vnode(&node, 0), Token::of_vnode(&node, 1));
    }

    #[test]
    fn vnode_count_bounds() {
        assert!(VnodeCount::new(0).is_err());
        assert!(VnodeCount::new(VnodeCount::MAX + 1).is_err());
        assert_eq!(VnodeCount::new(1).unwrap().get(), 1);
        assert_eq!("256".parse::<VnodeCount>().unwrap(), VnodeCount::DEFAULT);
        assert!("-1".parse::<VnodeCount>().is_err());
        assert!("99999999999".parse::<VnodeCount>().is_err());
    }
}
