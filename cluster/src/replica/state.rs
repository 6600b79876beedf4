//! [`KvState`]: a replica's key-value state in memory, as a sorted image and the writes since.
//!
//! A map with an allocation per key and per value cost about 250 bytes of memory for a pair of
//! 16 and 100 bytes, and a joining node paid for each of them in fresh pages the kernel zeroes
//! (BENCHMARKS.md, issue 6, session 32). Here most pairs live in one [`StateImage`] per shard,
//! with an index of where each pair starts; only the writes since the image was made live in a
//! small map on top of it, and once that map holds half as many keys as the image, the two are
//! merged into a new image. An installed snapshot's image becomes the state as it is, shared
//! with the change that stores it.
//!
//! It is not a general-purpose map: keys and values are copied in and read back as slices,
//! nothing is borrowed mutably, and a merge copies the whole shard (amortized, a few pairs
//! per write).
//!
//! A state keeps its [`StateDigest`] as it changes: each write adds its pair's hash and takes
//! away the hash of the pair it replaced, so comparing replicas (`node check`) reads a number
//! per shard instead of hashing every pair of every node at once.

use std::cmp::Ordering;
use std::collections::{BTreeMap, btree_map};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::iter::Peekable;
use std::ops::Bound;

use super::image::{ImageBuilder, ImagePairs, StateImage, pair_size, split_bytes};

/// Writes on top of an image are merged into it once they are this many, or half the image's
/// pairs if that is more.
const MERGE_AT_LEAST: usize = 64;

/// A key-value state: an image and the writes made since. Equal states compare and hash equal
/// however their pairs are split between the two.
#[derive(Clone, Default)]
pub struct KvState {
    /// The pairs as of the last merge or install.
    base: StateImage,
    /// Where each of `base`'s pairs starts in its bytes, in key order.
    starts: Vec<usize>,
    /// The [`key_prefix`] of each of `base`'s keys, beside `starts`: a search compares these
    /// first, in one array, and reads a key out of the image only among equal prefixes (with
    /// every comparison reading a key at its own place in the image, a search was a cache
    /// miss per step: a third of what applying a write cost on a loaded node).
    prefixes: Vec<u64>,
    /// Writes since: a value, or `None` for a key deleted from `base`. A key absent from
    /// `base` is never `None` here.
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// How many keys the state holds.
    len: usize,
    /// The digest of the pairs it holds, kept as they change.
    digest: StateDigest,
}

/// A digest of a key-value state that a write updates in constant time: the sum, modulo
/// 2^128, of a 128-bit XXH3 hash of each pair (the value hashed with a seed taken from the
/// key's own hash), so the order in which pairs were written never shows. Equal states have
/// equal digests; two replicas whose states differ by accident (a bug, a corrupted copy) have
/// equal digests with a chance of about 2^-128.
///
/// It is a check of consistency between replicas, not a cryptographic commitment: someone
/// choosing keys and values could make two different states collide. Copies are verified
/// after a move by chunked BLAKE3 checksums ([`copy_checksums`](super::copy_checksums)).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StateDigest(u128);

impl StateDigest {
    /// The digest as 16 bytes, little-endian.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    /// The hash one pair contributes.
    fn of_pair(key: &[u8], value: &[u8]) -> u128 {
        let seed = xxhash_rust::xxh3::xxh3_64(key);
        xxhash_rust::xxh3::xxh3_128_with_seed(value, seed)
    }

    fn add(&mut self, key: &[u8], value: &[u8]) {
        self.0 = self.0.wrapping_add(Self::of_pair(key, value));
    }

    fn take(&mut self, key: &[u8], value: &[u8]) {
        self.take_hash(Self::of_pair(key, value));
    }

    fn take_hash(&mut self, pair: u128) {
        self.0 = self.0.wrapping_sub(pair);
    }
}

impl fmt::Debug for StateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateDigest({:032x})", self.0)
    }
}

impl KvState {
    /// An empty state.
    pub fn new() -> Self {
        KvState::default()
    }

    /// The state `image` holds; it shares the image's bytes. Hashes every pair once, for the
    /// state's [`digest`](Self::digest).
    pub fn from_image(image: StateImage) -> Self {
        KvState::index(image, None)
    }

    /// The state `image` holds, whose digest is `digest` when the caller knows it (a merge of
    /// a state into its own image), else computed here.
    fn index(image: StateImage, digest: Option<StateDigest>) -> Self {
        let mut computed = StateDigest::default();
        let mut starts = Vec::with_capacity(image.len());
        let mut prefixes = Vec::with_capacity(image.len());
        let bytes = image.bytes();
        let mut at = 0;
        while starts.len() < image.len() {
            let Some((key, rest)) = split_bytes(&bytes[at..]) else {
                break;
            };
            let Some((value, rest)) = split_bytes(rest) else {
                break;
            };
            starts.push(at);
            prefixes.push(key_prefix(key));
            if digest.is_none() {
                computed.add(key, value);
            }
            at = bytes.len() - rest.len();
        }
        KvState {
            len: starts.len(),
            base: image,
            starts,
            prefixes,
            writes: BTreeMap::new(),
            digest: digest.unwrap_or(computed),
        }
    }

    /// The digest of the pairs it holds (kept as writes change them, not computed here).
    pub fn digest(&self) -> StateDigest {
        self.digest
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        match self.writes.get(key) {
            Some(written) => written.as_deref(),
            None => self.base_get(key),
        }
    }

    /// Whether it holds `key`.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`. An overwrite since the last merge keeps the value's allocation
    /// when it is not much larger than the new value.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.digest.add(key, value);
        if let Some(written) = self.writes.get_mut(key) {
            if let Some(held) = written {
                self.digest.take(key, held);
            }
            match written {
                Some(held) if held.capacity() <= 2 * value.len() + 64 => {
                    held.clear();
                    held.extend_from_slice(value);
                }
                _ => {
                    if written.is_none() {
                        self.len += 1;
                    }
                    *written = Some(value.to_vec());
                }
            }
            return;
        }
        match self
            .base_get(key)
            .map(|held| StateDigest::of_pair(key, held))
        {
            Some(replaced) => self.digest.take_hash(replaced),
            None => self.len += 1,
        }
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        self.merge_if_due();
    }

    /// Deletes `key`, if held.
    pub fn remove(&mut self, key: &[u8]) {
        if let Some(written) = self.writes.get_mut(key) {
            if let Some(held) = written.take() {
                self.digest.take(key, &held);
                self.len -= 1;
            }
            // `None` now: a deletion the base still needs, or nothing left to record.
            if self.base_get(key).is_none() {
                self.writes.remove(key);
            }
            return;
        }
        let Some(removed) = self
            .base_get(key)
            .map(|held| StateDigest::of_pair(key, held))
        else {
            return;
        };
        self.digest.take_hash(removed);
        self.len -= 1;
        self.writes.insert(key.to_vec(), None);
        self.merge_if_due();
    }

    /// Deletes every key.
    pub fn clear(&mut self) {
        *self = KvState::new();
    }

    /// The pairs in key order.
    pub fn iter(&self) -> Pairs<'_> {
        Pairs {
            base: self.base.iter().peekable(),
            writes: self.writes.range::<[u8], _>(..).peekable(),
        }
    }

    /// The pairs after `after` (all of them for `None`), in key order.
    pub fn iter_after(&self, after: Option<&[u8]>) -> Pairs<'_> {
        let Some(after) = after else {
            return self.iter();
        };
        let index = match self.base_search(after) {
            Ok(at) => at + 1,
            Err(at) => at,
        };
        let offset = self
            .starts
            .get(index)
            .copied()
            .unwrap_or(self.base.bytes().len());
        Pairs {
            base: self.base.pairs_from(index, offset).peekable(),
            writes: self
                .writes
                .range::<[u8], _>((Bound::Excluded(after), Bound::Unbounded))
                .peekable(),
        }
    }

    /// The state as one image: the base itself when nothing was written since (no copy).
    pub fn to_image(&self) -> StateImage {
        if self.writes.is_empty() {
            return self.base.clone();
        }
        let size = self.base.encoded_len()
            + self
                .writes
                .iter()
                .map(|(key, value)| value.as_ref().map_or(0, |value| pair_size(key, value)))
                .sum::<usize>();
        let mut builder = ImageBuilder::with_capacity(size);
        for (key, value) in self.iter() {
            // The pairs come sorted and unique, so this never refuses one.
            let _ = builder.push(key, value);
        }
        builder.finish()
    }

    /// The value of `key` in the base.
    fn base_get(&self, key: &[u8]) -> Option<&[u8]> {
        let at = self.base_search(key).ok()?;
        let (_, rest) = split_bytes(&self.base.bytes()[self.starts[at]..])?;
        split_bytes(rest).map(|(value, _)| value)
    }

    /// Where `key` is among the base's keys: `Ok` with its index, or `Err` with the index of
    /// the first key after it.
    fn base_search(&self, key: &[u8]) -> Result<usize, usize> {
        let prefix = key_prefix(key);
        let first = self.prefixes.partition_point(|&other| other < prefix);
        let equal = self.prefixes[first..].partition_point(|&other| other == prefix);
        self.starts[first..first + equal]
            .binary_search_by(|&start| self.key_at(start).cmp(key))
            .map(|at| first + at)
            .map_err(|at| first + at)
    }

    /// The key of the base pair that starts at `start`.
    fn key_at(&self, start: usize) -> &[u8] {
        split_bytes(&self.base.bytes()[start..]).map_or(&[][..], |(key, _)| key)
    }

    /// Merges the writes into a new base once they are many enough.
    fn merge_if_due(&mut self) {
        if self.writes.len() >= MERGE_AT_LEAST.max(self.starts.len() / 2) {
            *self = KvState::index(self.to_image(), Some(self.digest));
        }
    }
}

/// The first eight bytes of `key`, zero-padded, as a big-endian number: keys whose prefixes
/// differ are in the order of their prefixes; keys with equal prefixes need their bytes
/// compared (`a` and `a\0` among them).
fn key_prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let len = key.len().min(8);
    bytes[..len].copy_from_slice(&key[..len]);
    u64::from_be_bytes(bytes)
}

impl From<StateImage> for KvState {
    fn from(image: StateImage) -> Self {
        KvState::from_image(image)
    }
}

impl From<&BTreeMap<Vec<u8>, Vec<u8>>> for KvState {
    fn from(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> Self {
        KvState::from_image(StateImage::from_map(map))
    }
}

impl PartialEq for KvState {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for KvState {}

impl Hash for KvState {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.len.hash(state);
        for pair in self.iter() {
            pair.hash(state);
        }
    }
}

impl fmt::Debug for KvState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a KvState {
    type Item = (&'a [u8], &'a [u8]);
    type IntoIter = Pairs<'a>;
    fn into_iter(self) -> Pairs<'a> {
        self.iter()
    }
}

/// The pairs of a [`KvState`] in key order: its base's and its writes', the writes winning.
pub struct Pairs<'a> {
    base: Peekable<ImagePairs<'a>>,
    writes: Peekable<btree_map::Range<'a, Vec<u8>, Option<Vec<u8>>>>,
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let order = match (self.base.peek(), self.writes.peek()) {
                (None, None) => return None,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((base_key, _)), Some((written_key, _))) => {
                    (*base_key).cmp(written_key.as_slice())
                }
            };
            if order == Ordering::Less {
                return self.base.next();
            }
            if order == Ordering::Equal {
                self.base.next();
            }
            if let Some((key, Some(value))) = self.writes.next() {
                return Some((key, value));
            }
        }
    }
}

impl fmt::Debug for Pairs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pairs").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u8, Vec<u8>),
        Remove(u8),
        Clear,
        Reimage,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            10 => (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(|(key, value)| Step::Insert(key, value)),
            6 => any::<u8>().prop_map(Step::Remove),
            1 => Just(Step::Clear),
            1 => Just(Step::Reimage),
        ]
    }

    /// Keys of one to three bytes, so orders and prefixes both occur; keys longer than the
    /// eight bytes of a search prefix that share one; and keys that differ from a one-byte key
    /// only by zero bytes, which pad a short key's prefix.
    fn key(k: u8) -> Vec<u8> {
        let mut short = vec![k % 7];
        short.extend(std::iter::repeat_n(k, usize::from(k % 3)));
        match k % 4 {
            0 => [&b"a shared prefix:"[..], &short].concat(),
            1 => vec![k % 7, 0],
            2 => vec![k % 7, 0, 0, 0, 0, 0, 0, 0, k],
            _ => short,
        }
    }

    proptest! {
        /// A state behaves as a `BTreeMap` under any writes, merges and installs.
        #[test]
        fn a_state_behaves_as_a_map(steps in proptest::collection::vec(step(), 0..600)) {
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut state = KvState::new();
            for step in steps {
                match step {
                    Step::Insert(k, value) => {
                        model.insert(key(k), value.clone());
                        state.insert(&key(k), &value);
                    }
                    Step::Remove(k) => {
                        model.remove(&key(k));
                        state.remove(&key(k));
                    }
                    Step::Clear => {
                        model.clear();
                        state.clear();
                    }
                    Step::Reimage => state = KvState::from_image(state.to_image()),
                }
                prop_assert_eq!(state.len(), model.len());
                for k in 0..=u8::MAX {
                    prop_assert_eq!(state.get(&key(k)), model.get(&key(k)).map(Vec::as_slice));
                }
                let pairs: Vec<(&[u8], &[u8])> = state.iter().collect();
                let expected: Vec<(&[u8], &[u8])> =
                    model.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
                prop_assert_eq!(&pairs, &expected);
                for k in 0..=u8::MAX {
                    let after: Vec<(&[u8], &[u8])> = state.iter_after(Some(&key(k))).collect();
                    let expected: Vec<(&[u8], &[u8])> = model
                        .range::<[u8], _>((Bound::Excluded(key(k).as_slice()), Bound::Unbounded))
                        .map(|(k, v)| (k.as_slice(), v.as_slice()))
                        .collect();
                    prop_assert_eq!(after, expected);
                }
                prop_assert_eq!(state.to_image().to_map(), model.clone());
                prop_assert_eq!(&state, &KvState::from(&model));
                // Kept write by write (and through merges), it is the digest of the pairs.
                prop_assert_eq!(state.digest(), KvState::from(&model).digest());
            }
        }
    }

    #[test]
    fn equal_states_hash_equal_however_they_are_split() {
        use std::hash::DefaultHasher;
        let hash = |state: &KvState| {
            let mut hasher = DefaultHasher::new();
            state.hash(&mut hasher);
            hasher.finish()
        };
        let mut written = KvState::new();
        for k in 0..10u8 {
            written.insert(&[k], &[k; 3]);
        }
        let imaged = KvState::from_image(written.to_image());
        assert!(imaged.writes.is_empty());
        assert!(!written.writes.is_empty());
        assert_eq!(written, imaged);
        assert_eq!(hash(&written), hash(&imaged));
    }

    #[test]
    fn the_digest_is_of_the_pairs_not_of_their_order_or_history() {
        let mut forward = KvState::new();
        let mut backward = KvState::new();
        for k in 0..200u32 {
            forward.insert(&k.to_be_bytes(), b"value");
            backward.insert(&(199 - k).to_be_bytes(), b"value");
        }
        assert_ne!(forward.digest(), StateDigest::default());
        assert_eq!(forward.digest(), backward.digest());
        // A value changed and changed back, a key added and removed: the same pairs again.
        let before = forward.digest();
        forward.insert(&7u32.to_be_bytes(), b"other");
        assert_ne!(forward.digest(), before);
        forward.insert(&7u32.to_be_bytes(), b"value");
        forward.insert(b"extra", b"");
        assert_ne!(forward.digest(), before);
        forward.remove(b"extra");
        assert_eq!(forward.digest(), before);
        // A pair is not its key and value split elsewhere.
        let mut one = KvState::new();
        one.insert(b"ab", b"c");
        let mut other = KvState::new();
        other.insert(b"a", b"bc");
        assert_ne!(one.digest(), other.digest());
        forward.clear();
        assert_eq!(forward.digest(), StateDigest::default());
    }

    #[test]
    fn writes_are_merged_into_the_image_once_they_are_many() {
        let mut state = KvState::new();
        for k in 0..1000u32 {
            state.insert(&k.to_be_bytes(), b"value");
        }
        assert_eq!(state.len(), 1000);
        assert!(state.writes.len() < 1000 / 2 + MERGE_AT_LEAST);
        assert!(state.starts.len() > 500);
    }

    #[test]
    fn an_image_becomes_the_state_without_a_copy() {
        let map = BTreeMap::from([(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), vec![])]);
        let image = StateImage::from_map(&map);
        let state = KvState::from_image(image.clone());
        assert!(std::ptr::eq(
            state.to_image().bytes().as_ptr(),
            image.bytes().as_ptr()
        ));
        assert_eq!(state.get(b"b"), Some(&b""[..]));
        assert_eq!(state.get(b"c"), None);
    }
}
