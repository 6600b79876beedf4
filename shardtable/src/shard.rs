//! [`ShardId`], [`ShardCount`], and hashing keys to shards.

use std::fmt;
use std::str::FromStr;

use topology::Token;

use crate::error::Error;

/// A shard's permanent number, `0..count`. A key maps to the same shard forever; only the nodes
/// hosting it change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(u16);

impl ShardId {
    /// The shard numbered `id`. Whether it exists depends on the [`ShardCount`]; see
    /// [`ShardCount::check`].
    pub const fn new(id: u16) -> Self {
        ShardId(id)
    }

    /// The number.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// The number as an index into per-shard arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// Where the shard sits on the token ring: `u64_le(blake3(u32_le(shard))[0..8])`. Its
    /// replicas are found by walking clockwise from here.
    pub fn position(self) -> Token {
        Token::of_bytes(&u32::from(self.0).to_le_bytes())
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ShardId {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        text.trim()
            .parse()
            .map(ShardId)
            .map_err(|_| Error::InvalidShardId {
                given: text.to_owned(),
            })
    }
}

/// How many shards the cluster has: `1..=65536`, fixed when the cluster is created, default
/// 1024.
///
/// Choose generously: it caps how many nodes can lead a shard, and changing it later moves
/// data (jump hashing keeps that move to the theoretical minimum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardCount(u32);

impl ShardCount {
    /// 1024 shards.
    pub const DEFAULT: ShardCount = ShardCount(1024);
    /// The largest count, one per `u16` shard id.
    pub const MAX: u32 = 1 << 16;

    /// Validates a shard count.
    pub fn new(count: u32) -> Result<Self, Error> {
        if (1..=Self::MAX).contains(&count) {
            Ok(ShardCount(count))
        } else {
            Err(Error::InvalidShardCount {
                given: count.to_string(),
            })
        }
    }

    /// The count as a number.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The count as a length of per-shard arrays.
    pub const fn len(self) -> usize {
        self.0 as usize
    }

    /// Always `false`: a shard count is at least 1. Present because `len` is.
    pub const fn is_empty(self) -> bool {
        false
    }

    /// Every shard id, in order.
    pub fn ids(self) -> impl ExactSizeIterator<Item = ShardId> + DoubleEndedIterator + Clone {
        // Every id below a count of at most 2^16 fits in u16.
        (0..self.0).map(|id| ShardId(id as u16))
    }

    /// Whether `shard` exists in a cluster of this many shards.
    pub const fn contains(self, shard: ShardId) -> bool {
        (shard.0 as u32) < self.0
    }

    /// `shard` if it exists, else [`Error::ShardOutOfRange`].
    pub fn check(self, shard: ShardId) -> Result<ShardId, Error> {
        if self.contains(shard) {
            Ok(shard)
        } else {
            Err(Error::ShardOutOfRange {
                shard: shard.0,
                count: self.0,
            })
        }
    }
}

impl Default for ShardCount {
    fn default() -> Self {
        ShardCount::DEFAULT
    }
}

impl fmt::Display for ShardCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ShardCount {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidShardCount {
            given: text.to_owned(),
        };
        let count: u32 = text.trim().parse().map_err(|_| invalid())?;
        ShardCount::new(count).map_err(|_| invalid())
    }
}

/// The shard a key belongs to, forever: `jump_consistent_hash(u64_le(blake3(key)[0..8]), count)`.
pub fn shard_for(key: &[u8], count: ShardCount) -> ShardId {
    let hash = Token::of_bytes(key).get();
    // The bucket is below count ≤ 2^16, so it fits in u16.
    ShardId(jump_consistent_hash(hash, count.get()) as u16)
}

/// Jump consistent hash (Lamping & Veach, 2014): maps `key` to a bucket in `0..buckets` so that
/// growing `buckets` from `n` to `n + 1` moves only `1/(n + 1)` of the keys. Returns 0 when
/// `buckets` is 0.
///
/// Uses the paper's floating-point step, which IEEE 754 makes identical on every platform.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets);
    let (mut bucket, mut next) = (-1i64, 0i64);
    while next < buckets {
        bucket = next;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        let scale = (1u64 << 31) as f64 / ((key >> 33) + 1) as f64;
        next = ((bucket + 1) as f64 * scale) as i64;
    }
    bucket.max(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_hash_stays_in_range_and_moves_keys_only_to_the_new_bucket() {
        assert_eq!(jump_consistent_hash(12345, 0), 0);
        assert_eq!(jump_consistent_hash(12345, 1), 0);
        for key in 0..2000u64 {
            let key = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for buckets in 1..64 {
                let before = jump_consistent_hash(key, buckets);
                let after = jump_consistent_hash(key, buckets + 1);
                assert!(before < buckets);
                assert!(after == before || after == buckets);
            }
        }
    }

    #[test]
    fn jump_hash_moves_about_one_in_n_plus_one_keys() {
        let keys = 100_000u64;
        let moved = (0..keys)
            .map(|key| key.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .filter(|&key| jump_consistent_hash(key, 9) != jump_consistent_hash(key, 10))
            .count();
        // Expected 10,000; allow ±5 standard deviations (±475).
        assert!((9_500..10_500).contains(&moved), "{moved}");
    }

    #[test]
    fn shard_count_bounds() {
        assert!(ShardCount::new(0).is_err());
        assert!(ShardCount::new(65537).is_err());
        assert_eq!(
            ShardCount::new(65536).unwrap().ids().last(),
            Some(ShardId(65535))
        );
        assert_eq!(ShardCount::new(1).unwrap().ids().count(), 1);
        assert!("abc".parse::<ShardCount>().is_err());
        assert_eq!("1024".parse::<ShardCount>().unwrap(), ShardCount::DEFAULT);
    }

    #[test]
    fn out_of_range_shard_is_a_clear_error() {
        let err = ShardCount::DEFAULT.check(ShardId(1024)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shard 1024 does not exist: this cluster has shards 0 to 1023"
        );
        assert!(ShardCount::DEFAULT.check(ShardId(1023)).is_ok());
        assert!("65536".parse::<ShardId>().is_err());
        assert_eq!("42".parse::<ShardId>().unwrap(), ShardId(42));
    }

    #[test]
    fn keys_spread_over_all_shards() {
        let count = ShardCount::new(64).unwrap();
        let mut hits = [0u32; 64];
        for i in 0..64_000u32 {
            hits[shard_for(&i.to_le_bytes(), count).index()] += 1;
        }
        // 1000 expected per shard; 6 standard deviations is about ±190.
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
    }
}
