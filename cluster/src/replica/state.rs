//! [`KvState`]: a replica's key-value state in memory, as a sorted image and the writes since.
//!
//! A map with an allocation per key and per value cost about 250 bytes of memory for a pair of
//! 16 and 100 bytes, and a joining node paid for each of them in fresh pages the kernel zeroes
//! (BENCHMARKS.md, issue 6, session 32). Here most pairs live in one [`StateImage`] per shard,
//! with an index of where each pair starts. The writes since the image was made wait on top of
//! it in two layers:
//! - the latest ones, unsorted, in one buffer, in the order they were made. A write looks its
//!   key up (to keep the count of keys) and appends its key and value there: it neither
//!   hashes nor allocates (searching a map of writes for each write, allocating its key and
//!   value, and hashing it and the pair it replaced, was about a fifth of a node's event loop
//!   under ×16 writes; BENCHMARKS.md, issue 5, session 52);
//! - once that buffer holds [`RECENT_MAX_WRITES`] writes (or [`RECENT_MAX_BYTES`]), its latest
//!   write of each key either goes into a sorted map on top of the image or, when the map and
//!   those writes together are half as many keys as the image (at least
//!   [`MERGE_AT_LEAST`]), or the image holds at most [`MERGE_PAIRS_PER_WRITE`] pairs per
//!   write settled, everything is merged into a new image in one pass.
//!
//! In a shard of a few hundred keys the map is never used: every [`RECENT_MAX_WRITES`] writes
//! are sorted and merged with the image at once. An installed snapshot's image becomes the state
//! as it is, shared with the change that stores it.
//!
//! It is not a general-purpose map: keys and values are copied in and read back as slices,
//! nothing is borrowed mutably, a read looks through up to [`RECENT_MAX_WRITES`] unsorted writes
//! before it searches, and a merge copies the whole shard (amortized, a few pairs per write).
//!
//! A state keeps its [`StateDigest`] as it changes: each write that leaves the unsorted buffer
//! adds its pair's hash and takes away the hash of the pair it replaced, so comparing replicas
//! (`node check`) reads a number per shard instead of hashing every pair of every node at once
//! (and looks up the few writes still in the buffer).

use std::collections::{BTreeMap, btree_map};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::iter::Peekable;
use std::ops::Bound;

use super::image::{ImageBuilder, ImagePairs, StateImage, pair_size, split_bytes};

/// Writes on top of an image are merged into it once they are this many, or half the image's
/// pairs if that is more.
const MERGE_AT_LEAST: usize = 64;
/// The unsorted writes are merged with the image at once (not sorted into the map) while the
/// image holds at most this many pairs per write merged: copying a pair costs a small part of
/// searching for a key and allocating it in the map.
const MERGE_PAIRS_PER_WRITE: usize = 4;
/// The most writes the unsorted buffer holds before they are sorted into the map or merged.
const RECENT_MAX_WRITES: usize = 64;
/// The most key and value bytes the unsorted buffer holds before the same happens (so a run
/// of large values settles sooner).
const RECENT_MAX_BYTES: usize = 32 << 10;
/// A buffer that grew past this (large values went through it) is freed once it settles,
/// instead of being kept for the next writes: every shard of a node keeps its buffer, so
/// what each keeps is bounded (64 writes of 100-byte values take 8 KiB).
const RECENT_KEEP_BYTES: usize = 16 << 10;

/// A key-value state: an image and the writes made since. Equal states compare and hash equal
/// however their pairs are split between the layers.
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
    /// Sorted writes since `base`: a value, or `None` for a key deleted from `base`. A key
    /// absent from `base` is never `None` here.
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The latest writes, after `writes`, in the order made; their keys and values are in
    /// `recent_bytes`. A key may appear more than once (the last one counts), and a deletion
    /// of a key held nowhere may appear.
    recent: Vec<RecentWrite>,
    /// The keys and values of `recent`, back to back.
    recent_bytes: Vec<u8>,
    /// How many keys it holds, `recent`'s writes counted as they are made (a status counts
    /// every shard's keys, often: a count that looked the buffer's writes up each time cost
    /// the event loops tens of milliseconds a status during a join).
    len: usize,
    /// The digest of the pairs of `base` and `writes` (not counting `recent`).
    digest: StateDigest,
}

/// One write in [`KvState::recent`]: its key is `recent_bytes[start..key_end]`, its value (when
/// it is not a deletion) `recent_bytes[key_end..value_end]`.
#[derive(Clone, Copy, Debug)]
struct RecentWrite {
    /// The key's [`key_prefix`], compared before the key itself.
    prefix: u64,
    start: usize,
    key_end: usize,
    /// `None` for a deletion.
    value_end: Option<usize>,
}

/// A write's key and its value (`None`: deleted).
type Written<'a> = (&'a [u8], Option<&'a [u8]>);

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

    /// The digest after `key` went from `old` to `new` (either may be absent).
    fn replace(&mut self, key: &[u8], old: Option<&[u8]>, new: Option<&[u8]>) {
        if let Some(old) = old {
            self.take(key, old);
        }
        if let Some(new) = new {
            self.add(key, new);
        }
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
            recent: Vec::new(),
            recent_bytes: Vec::new(),
            digest: digest.unwrap_or(computed),
        }
    }

    /// The digest of the pairs it holds (kept as writes change them; the few writes not
    /// sorted yet are looked up here).
    pub fn digest(&self) -> StateDigest {
        let mut digest = self.digest;
        for (key, new) in latest_writes(&self.recent, &self.recent_bytes) {
            digest.replace(key, self.settled_get(key), new);
        }
        digest
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        let prefix = key_prefix(key);
        for write in self.recent.iter().rev() {
            if write.prefix == prefix {
                let (written, value) = write.read(&self.recent_bytes);
                if written == key {
                    return value;
                }
            }
        }
        self.settled_get(key)
    }

    /// Whether it holds `key`.
    pub fn contains_key(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }

    /// Sets `key` to `value`.
    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.push_recent(key, Some(value));
    }

    /// Deletes `key`, if held.
    pub fn remove(&mut self, key: &[u8]) {
        self.push_recent(key, None);
    }

    /// Deletes every key.
    pub fn clear(&mut self) {
        *self = KvState::new();
    }

    /// The pairs in key order.
    pub fn iter(&self) -> Pairs<'_> {
        Pairs {
            layers: Layers {
                base: self.base.iter().peekable(),
                writes: self.writes.range::<[u8], _>(..).peekable(),
                recent: latest_writes(&self.recent, &self.recent_bytes)
                    .into_iter()
                    .peekable(),
            },
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
        let mut recent = latest_writes(&self.recent, &self.recent_bytes);
        recent.retain(|(key, _)| *key > after);
        Pairs {
            layers: Layers {
                base: self.base.pairs_from(index, offset).peekable(),
                writes: self
                    .writes
                    .range::<[u8], _>((Bound::Excluded(after), Bound::Unbounded))
                    .peekable(),
                recent: recent.into_iter().peekable(),
            },
        }
    }

    /// The state as one image: the base itself when nothing was written since (no copy).
    pub fn to_image(&self) -> StateImage {
        let recent = latest_writes(&self.recent, &self.recent_bytes);
        if self.writes.is_empty() && !recent.is_empty() {
            return self.spliced(&recent).base;
        }
        self.merged(&recent).0
    }

    /// The state with `recent` (the latest write of each key, sorted) merged into the base,
    /// for a state whose sorted map is empty: each write's place is searched for in the base,
    /// and the base's pairs between two writes are copied as one run of bytes, with their
    /// starts and prefixes (a merge that walked the pairs one by one cost twice as much as
    /// keeping the writes in a map).
    fn spliced(&self, recent: &[Written<'_>]) -> KvState {
        debug_assert!(self.writes.is_empty());
        let bytes = self.base.bytes();
        let size = bytes.len()
            + recent
                .iter()
                .map(|(key, value)| value.map_or(0, |value| pair_size(key, value)))
                .sum::<usize>();
        let pairs = self.starts.len() + recent.len();
        let mut builder = ImageBuilder::with_capacity(size);
        let mut starts = Vec::with_capacity(pairs);
        let mut prefixes = Vec::with_capacity(pairs);
        let mut digest = self.digest;
        let mut next = 0;
        for &(key, new) in recent {
            let (at, old) = match self.base_search(key) {
                Ok(at) => (at, self.base_get_at(at)),
                Err(at) => (at, None),
            };
            self.copy_base_run(&mut builder, &mut starts, &mut prefixes, next..at);
            digest.replace(key, old, new);
            if let Some(value) = new {
                starts.push(builder.written_len());
                prefixes.push(key_prefix(key));
                builder.push_in_order(key, value);
            }
            next = if old.is_some() { at + 1 } else { at };
        }
        self.copy_base_run(
            &mut builder,
            &mut starts,
            &mut prefixes,
            next..self.starts.len(),
        );
        KvState {
            len: starts.len(),
            base: builder.finish(),
            starts,
            prefixes,
            writes: BTreeMap::new(),
            recent: Vec::new(),
            recent_bytes: Vec::new(),
            digest,
        }
    }

    /// The image of the base, `writes` and `recent` (the latest write of each key, sorted)
    /// together, and its digest: the state's own with `recent`'s changes; the base itself when
    /// there is nothing on top of it.
    fn merged(&self, recent: &[Written<'_>]) -> (StateImage, StateDigest) {
        if self.writes.is_empty() && recent.is_empty() {
            return (self.base.clone(), self.digest);
        }
        let size = self.base.encoded_len()
            + self
                .writes
                .iter()
                .map(|(key, value)| value.as_ref().map_or(0, |value| pair_size(key, value)))
                .sum::<usize>()
            + recent
                .iter()
                .map(|(key, value)| value.map_or(0, |value| pair_size(key, value)))
                .sum::<usize>();
        let mut builder = ImageBuilder::with_capacity(size);
        let mut digest = self.digest;
        let layers = Layers {
            base: self.base.iter().peekable(),
            writes: self.writes.range::<[u8], _>(..).peekable(),
            recent: recent.iter().copied().peekable(),
        };
        for layer in layers {
            if let Some(new) = layer.recent {
                digest.replace(layer.key, layer.before_recent(), new);
            }
            if let Some(value) = layer.value() {
                // The layers come sorted and unique.
                builder.push_in_order(layer.key, value);
            }
        }
        (builder.finish(), digest)
    }

    /// Copies the base's pairs `run` (by index) to `builder` as one run of bytes, and their
    /// starts in the new image and prefixes to `starts` and `prefixes`.
    fn copy_base_run(
        &self,
        builder: &mut ImageBuilder,
        starts: &mut Vec<usize>,
        prefixes: &mut Vec<u64>,
        run: std::ops::Range<usize>,
    ) {
        let Some(last) = run.end.checked_sub(1).filter(|_| !run.is_empty()) else {
            return;
        };
        let bytes = self.base.bytes();
        let first = self.starts[run.start];
        let end = self.starts.get(run.end).copied().unwrap_or(bytes.len());
        let at = builder.written_len();
        starts.extend(
            self.starts[run.clone()]
                .iter()
                .map(|start| start - first + at),
        );
        prefixes.extend_from_slice(&self.prefixes[run.clone()]);
        builder.push_run(&bytes[first..end], run.len(), self.starts[last] - first);
    }

    /// Appends a write to the unsorted buffer, and settles the buffer once it is full.
    fn push_recent(&mut self, key: &[u8], value: Option<&[u8]>) {
        let held = self.get(key).is_some();
        self.len = self.len + usize::from(value.is_some()) - usize::from(held);
        let start = self.recent_bytes.len();
        self.recent_bytes.extend_from_slice(key);
        let key_end = self.recent_bytes.len();
        let value_end = value.map(|value| {
            self.recent_bytes.extend_from_slice(value);
            self.recent_bytes.len()
        });
        self.recent.push(RecentWrite {
            prefix: key_prefix(key),
            start,
            key_end,
            value_end,
        });
        if self.recent.len() >= RECENT_MAX_WRITES || self.recent_bytes.len() >= RECENT_MAX_BYTES {
            self.settle_recent();
        }
    }

    /// Moves the latest write of each key in the unsorted buffer into the sorted map, or merges
    /// them and the map into a new image when they are many enough; empties the buffer.
    fn settle_recent(&mut self) {
        let mut recent = std::mem::take(&mut self.recent);
        let mut bytes = std::mem::take(&mut self.recent_bytes);
        {
            let latest = latest_writes(&recent, &bytes);
            let many =
                self.writes.len() + latest.len() >= MERGE_AT_LEAST.max(self.starts.len() / 2);
            let cheap = self.starts.len() <= MERGE_PAIRS_PER_WRITE * latest.len();
            if many || cheap {
                *self = if self.writes.is_empty() {
                    self.spliced(&latest)
                } else {
                    let (image, digest) = self.merged(&latest);
                    KvState::index(image, Some(digest))
                };
            } else {
                for (key, value) in latest {
                    self.write_sorted(key, value);
                }
            }
        }
        recent.clear();
        self.recent = recent;
        if bytes.capacity() <= RECENT_KEEP_BYTES {
            bytes.clear();
            self.recent_bytes = bytes;
        }
    }

    /// Sets `key` to `value` (`None`: deletes it) in the sorted map, and the digest. An
    /// overwrite keeps the value's allocation when it is not much larger than the new value.
    /// The count of keys is not touched: it counted the write when it was made.
    fn write_sorted(&mut self, key: &[u8], value: Option<&[u8]>) {
        if let Some(written) = self.writes.get_mut(key) {
            self.digest.replace(key, written.as_deref(), value);
            match (written.as_mut(), value) {
                (Some(held), Some(value)) if held.capacity() <= 2 * value.len() + 64 => {
                    held.clear();
                    held.extend_from_slice(value);
                }
                (_, value) => *written = value.map(<[u8]>::to_vec),
            }
            // A deletion the base does not need is nothing left to record.
            if written.is_none() && self.base_search(key).is_err() {
                self.writes.remove(key);
            }
            return;
        }
        let old = self.base_get(key).map(|old| StateDigest::of_pair(key, old));
        if old.is_none() && value.is_none() {
            return;
        }
        if let Some(old) = old {
            self.digest.take_hash(old);
        }
        if let Some(value) = value {
            self.digest.add(key, value);
        }
        self.writes.insert(key.to_vec(), value.map(<[u8]>::to_vec));
        self.merge_if_due();
    }

    /// The value of `key` in the base and the sorted map (not the unsorted buffer).
    fn settled_get(&self, key: &[u8]) -> Option<&[u8]> {
        match self.writes.get(key) {
            Some(written) => written.as_deref(),
            None => self.base_get(key),
        }
    }

    /// The value of `key` in the base.
    fn base_get(&self, key: &[u8]) -> Option<&[u8]> {
        self.base_get_at(self.base_search(key).ok()?)
    }

    /// The value of the base's `at`-th pair.
    fn base_get_at(&self, at: usize) -> Option<&[u8]> {
        let (_, rest) = split_bytes(&self.base.bytes()[*self.starts.get(at)?..])?;
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

    /// Merges the sorted map into a new base once it holds many enough keys.
    fn merge_if_due(&mut self) {
        if self.writes.len() >= MERGE_AT_LEAST.max(self.starts.len() / 2) {
            let (image, digest) = self.merged(&[]);
            let (recent, recent_bytes) = (
                std::mem::take(&mut self.recent),
                std::mem::take(&mut self.recent_bytes),
            );
            let len = self.len;
            *self = KvState::index(image, Some(digest));
            // The count includes the writes still being settled.
            self.len = len;
            self.recent = recent;
            self.recent_bytes = recent_bytes;
        }
    }
}

impl RecentWrite {
    /// The write's key and value, out of the buffer it was written to.
    fn read(self, bytes: &[u8]) -> Written<'_> {
        let key = &bytes[self.start..self.key_end];
        let value = self.value_end.map(|end| &bytes[self.key_end..end]);
        (key, value)
    }
}

/// The latest of `recent`'s writes to each key, in key order.
fn latest_writes<'a>(recent: &[RecentWrite], bytes: &'a [u8]) -> Vec<Written<'a>> {
    if recent.is_empty() {
        return Vec::new();
    }
    // By key, and the latest write first among writes to one key.
    let mut order: Vec<usize> = (0..recent.len()).collect();
    let key = |at: usize| recent[at].read(bytes).0;
    order.sort_unstable_by(|&a, &b| {
        recent[a]
            .prefix
            .cmp(&recent[b].prefix)
            .then_with(|| key(a).cmp(key(b)))
            .then(b.cmp(&a))
    });
    order.dedup_by(|later, kept| key(*later) == key(*kept));
    order.into_iter().map(|at| recent[at].read(bytes)).collect()
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
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for KvState {}

impl Hash for KvState {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.len().hash(state);
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

/// What the three layers of a state hold for one key: the base's value, the sorted map's
/// write and the latest unsorted write, each if any.
struct Layer<'a> {
    key: &'a [u8],
    base: Option<&'a [u8]>,
    written: Option<Option<&'a [u8]>>,
    recent: Option<Option<&'a [u8]>>,
}

impl<'a> Layer<'a> {
    /// The key's value: the latest layer's that has the key.
    fn value(&self) -> Option<&'a [u8]> {
        self.recent.unwrap_or_else(|| self.before_recent())
    }

    /// The key's value without the unsorted write.
    fn before_recent(&self) -> Option<&'a [u8]> {
        self.written.unwrap_or(self.base)
    }
}

/// The three layers of a state walked together in key order, one [`Layer`] per key any of
/// them holds (deleted keys included).
struct Layers<'a, R: Iterator<Item = Written<'a>>> {
    base: Peekable<ImagePairs<'a>>,
    writes: Peekable<btree_map::Range<'a, Vec<u8>, Option<Vec<u8>>>>,
    recent: Peekable<R>,
}

impl<'a, R: Iterator<Item = Written<'a>>> Iterator for Layers<'a, R> {
    type Item = Layer<'a>;

    fn next(&mut self) -> Option<Layer<'a>> {
        let key = [
            self.base.peek().map(|(key, _)| *key),
            self.writes.peek().map(|(key, _)| key.as_slice()),
            self.recent.peek().map(|(key, _)| *key),
        ]
        .into_iter()
        .flatten()
        .min()?;
        let base = self
            .base
            .next_if(|(held, _)| *held == key)
            .map(|(_, value)| value);
        let written = self
            .writes
            .next_if(|(held, _)| held.as_slice() == key)
            .map(|(_, value)| value.as_deref());
        let recent = self
            .recent
            .next_if(|(held, _)| *held == key)
            .map(|(_, value)| value);
        Some(Layer {
            key,
            base,
            written,
            recent,
        })
    }
}

/// The pairs of a [`KvState`] in key order: its base's, its sorted writes' and its unsorted
/// writes', the latest winning.
pub struct Pairs<'a> {
    layers: Layers<'a, std::vec::IntoIter<Written<'a>>>,
}

impl<'a> Iterator for Pairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let layer = self.layers.next()?;
            if let Some(value) = layer.value() {
                return Some((layer.key, value));
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
        assert!(imaged.writes.is_empty() && imaged.recent.is_empty());
        assert!(!written.recent.is_empty());
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
        assert!(state.recent.len() < RECENT_MAX_WRITES);
        assert!(state.starts.len() > 500);
    }

    /// The unsorted writes of a large shard go into the sorted map, those of a small one are
    /// merged into its image; either way reads, the count and the digest see every write.
    #[test]
    fn unsorted_writes_settle_into_the_map_or_the_image() {
        let pairs = |keys: std::ops::Range<u32>, value: &[u8]| -> BTreeMap<Vec<u8>, Vec<u8>> {
            keys.map(|k| (k.to_be_bytes().to_vec(), value.to_vec()))
                .collect()
        };
        for (held, settles_into_map) in [(1000, true), (100, false)] {
            let mut model = pairs(0..held, b"old");
            let mut state = KvState::from(&model);
            // Overwrites, new keys and deletions (of a held and of an absent key), all of
            // different keys (a key written twice is `a_state_behaves_as_a_map`'s).
            for k in 0..RECENT_MAX_WRITES as u32 - 3 {
                state.insert(&(k * 7).to_be_bytes(), b"new");
                model.insert((k * 7).to_be_bytes().to_vec(), b"new".to_vec());
            }
            state.remove(&5u32.to_be_bytes());
            model.remove(5u32.to_be_bytes().as_slice());
            state.remove(&u32::MAX.to_be_bytes());
            assert_eq!(state.recent.len(), RECENT_MAX_WRITES - 1);
            assert_eq!(state.get(&7u32.to_be_bytes()), Some(&b"new"[..]));
            assert_eq!(state.get(&5u32.to_be_bytes()), None);
            assert_eq!(state.len(), model.len());
            assert_eq!(state.digest(), KvState::from(&model).digest());
            state.insert(&1u32.to_be_bytes(), b"last");
            model.insert(1u32.to_be_bytes().to_vec(), b"last".to_vec());
            assert!(state.recent.is_empty());
            assert_eq!(!state.writes.is_empty(), settles_into_map, "{held} keys");
            assert_eq!(
                state.starts.len() == held as usize,
                settles_into_map,
                "{held} keys"
            );
            assert_eq!(state.len(), model.len());
            assert_eq!(state.digest(), KvState::from(&model).digest());
            assert_eq!(state.to_image().to_map(), model);
            // More writes, until the map and the buffer are merged into a new image together.
            let mut k = 0u32;
            while !state.writes.is_empty() {
                let key = (k * 3 + 1).to_be_bytes();
                if k.is_multiple_of(5) {
                    state.remove(&key);
                    model.remove(key.as_slice());
                } else {
                    state.insert(&key, b"again");
                    model.insert(key.to_vec(), b"again".to_vec());
                }
                k += 1;
                assert!(k < 10 * held, "{held} keys: no merge");
            }
            assert_eq!(state.len(), model.len());
            assert_eq!(state.digest(), KvState::from(&model).digest());
            assert_eq!(state.to_image().to_map(), model);
        }
    }

    /// Large values settle the buffer before it holds many writes, and a buffer a large value
    /// grew is not kept.
    #[test]
    fn large_values_settle_at_once_and_their_buffer_is_freed() {
        let mut state = KvState::new();
        let large = vec![7u8; RECENT_MAX_BYTES.max(RECENT_KEEP_BYTES) + 1];
        state.insert(b"small", b"1");
        state.insert(b"large", &large);
        assert!(state.recent.is_empty());
        assert_eq!(state.recent_bytes.capacity(), 0);
        assert_eq!(state.get(b"large"), Some(&large[..]));
        assert_eq!(state.get(b"small"), Some(&b"1"[..]));
        assert_eq!(state.len(), 2);
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
