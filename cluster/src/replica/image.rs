//! [`StateImage`]: a shard's whole key-value state as one byte string, for the change that
//! installs it ([`super::Change::InstallSnapshot`]).
//!
//! An installed snapshot lives twice for a while: as the replica's state (a map it serves and
//! updates) and as the change the store writes to its log and later folds. A second map cost a
//! joining node two allocations and about 180 bytes of fresh memory per key; an image is one
//! allocation of the pairs' bytes and a few more (BENCHMARKS.md, issue 6, session 32).
//!
//! It encodes exactly as the `BTreeMap<Vec<u8>, Vec<u8>>` it replaces (postcard's map: a
//! varint count, then each key and value as a varint length and its bytes), so logs written
//! before it read the same. It is not a map: it is built once from one and read back in key
//! order, never looked up or changed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use super::bytes::Ref;

/// A key-value state in key order, keys unique: each pair as a varint key length, the key, a
/// varint value length and the value, one after another in one buffer. Only whole, well-formed
/// images exist (built from a map or from pairs in order, or decoded and checked), so reading
/// one cannot fail. The buffer is shared: a clone costs a reference count, so the replica's
/// state ([`super::KvState`]) and the change that stores it hold the same bytes.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct StateImage {
    /// The encoded pairs.
    bytes: Arc<Vec<u8>>,
    /// How many pairs `bytes` holds.
    len: usize,
}

impl StateImage {
    /// The image of `map`, in one allocation of exactly its size.
    pub fn from_map(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> Self {
        let mut builder =
            ImageBuilder::with_capacity(map.iter().map(|(key, value)| pair_size(key, value)).sum());
        for (key, value) in map {
            builder.push_in_order(key, value);
        }
        builder.finish()
    }

    /// The pairs, in key order.
    pub fn iter(&self) -> ImagePairs<'_> {
        ImagePairs {
            rest: &self.bytes,
            left: self.len,
        }
    }

    /// The encoded pairs.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The pairs from the one whose encoding starts at `offset` in [`Self::bytes`], the
    /// `index`-th; an offset that is not a pair's start ends the iteration early.
    pub(super) fn pairs_from(&self, index: usize, offset: usize) -> ImagePairs<'_> {
        ImagePairs {
            rest: self.bytes.get(offset..).unwrap_or_default(),
            left: self.len.saturating_sub(index),
        }
    }

    /// The encoded size of the pairs, in bytes.
    pub fn encoded_len(&self) -> usize {
        self.bytes.len()
    }

    /// The state as a map (a copy of every key and value).
    pub fn to_map(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.iter()
            .map(|(key, value)| (key.to_vec(), value.to_vec()))
            .collect()
    }

    /// The number of pairs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no pair.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Builds a [`StateImage`] from pairs given in key order.
#[derive(Debug, Default)]
pub struct ImageBuilder {
    bytes: Vec<u8>,
    len: usize,
    /// Where the last key pushed lies in `bytes`.
    last_key: Option<(usize, usize)>,
}

/// A pair given to an [`ImageBuilder`] whose key is not after the previous pair's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfOrder;

impl ImageBuilder {
    /// A builder whose buffer holds `bytes` of encoded pairs before it grows (see
    /// [`pair_size`]).
    pub fn with_capacity(bytes: usize) -> Self {
        ImageBuilder {
            bytes: Vec::with_capacity(bytes),
            ..ImageBuilder::default()
        }
    }

    /// Appends a pair whose key is after every key pushed so far; refuses, changing nothing,
    /// one that is not.
    pub fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), OutOfOrder> {
        if let Some((start, end)) = self.last_key
            && self.bytes[start..end] >= *key
        {
            return Err(OutOfOrder);
        }
        self.push_in_order(key, value);
        Ok(())
    }

    /// [`Self::push`] for a caller whose pairs come from something sorted and unique.
    pub(super) fn push_in_order(&mut self, key: &[u8], value: &[u8]) {
        debug_assert!(
            self.last_key
                .is_none_or(|(start, end)| self.bytes[start..end] < *key)
        );
        push_bytes(&mut self.bytes, key);
        let end = self.bytes.len();
        self.last_key = Some((end - key.len(), end));
        push_bytes(&mut self.bytes, value);
        self.len += 1;
    }

    /// How many bytes the pairs pushed so far take.
    pub(super) fn written_len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends `pairs` pairs encoded as an image encodes them (`run`, a part of another image),
    /// for a caller whose pairs come sorted, unique and after every key pushed so far;
    /// `last_start` is where the last of them starts in `run`.
    pub(super) fn push_run(&mut self, run: &[u8], pairs: usize, last_start: usize) {
        if pairs == 0 {
            return;
        }
        let at = self.bytes.len();
        self.bytes.extend_from_slice(run);
        self.len += pairs;
        if let Some((key, rest)) = run.get(last_start..).and_then(split_bytes) {
            let end = at + run.len() - rest.len();
            self.last_key = Some((end - key.len(), end));
        }
    }

    /// The image of the pairs pushed. A buffer that grew well past its pairs is shrunk to
    /// them, since an image lives as long as its state.
    pub fn finish(mut self) -> StateImage {
        if self.bytes.capacity() - self.bytes.len() > self.bytes.len() / 8 {
            self.bytes.shrink_to_fit();
        }
        StateImage {
            bytes: Arc::new(self.bytes),
            len: self.len,
        }
    }
}

/// How many bytes a pair takes in an image.
pub(super) fn pair_size(key: &[u8], value: &[u8]) -> usize {
    varint_len(key.len()) + key.len() + varint_len(value.len()) + value.len()
}

impl From<&BTreeMap<Vec<u8>, Vec<u8>>> for StateImage {
    fn from(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> Self {
        StateImage::from_map(map)
    }
}

impl fmt::Debug for StateImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a StateImage {
    type Item = (&'a [u8], &'a [u8]);
    type IntoIter = ImagePairs<'a>;
    fn into_iter(self) -> ImagePairs<'a> {
        self.iter()
    }
}

/// The pairs of a [`StateImage`], in key order.
#[derive(Debug, Clone)]
pub struct ImagePairs<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for ImagePairs<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        // An image is checked whole when made, so neither read fails; if one did, the
        // iteration would end rather than panic.
        let (key, rest) = split_bytes(self.rest)?;
        let (value, rest) = split_bytes(rest)?;
        self.rest = rest;
        self.left -= 1;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for ImagePairs<'_> {}

/// The length of `n` as a varint (7 bits a byte).
fn varint_len(n: usize) -> usize {
    let bits = usize::BITS - (n | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

/// Appends `bytes` as a varint length and the bytes.
fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut n = bytes.len();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(bytes);
}

/// Splits a varint-length-prefixed byte string off the front of `from`.
pub(super) fn split_bytes(from: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut len: usize = 0;
    let mut shift = 0u32;
    let mut at = 0;
    loop {
        let byte = *from.get(at)?;
        at += 1;
        let bits = usize::from(byte & 0x7f);
        if shift >= usize::BITS || (bits << shift) >> shift != bits {
            return None;
        }
        len |= bits << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let end = at.checked_add(len)?;
    let bytes = from.get(at..end)?;
    Some((bytes, &from[end..]))
}

impl Serialize for StateImage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter().map(|(key, value)| (Ref(key), Ref(value))))
    }
}

impl<'de> Deserialize<'de> for StateImage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ImageVisitor)
    }
}

struct ImageVisitor;

impl<'de> Visitor<'de> for ImageVisitor {
    type Value = StateImage;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of byte strings in key order")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StateImage, A::Error> {
        let mut bytes = Vec::new();
        let mut len = 0usize;
        // Where the previous key starts and ends in `bytes`.
        let mut previous: Option<(usize, usize)> = None;
        while let Some(key) = map.next_key_seed(Append(&mut bytes))? {
            if let Some((start, end)) = previous
                && bytes[start..end] >= bytes[key.0..key.1]
            {
                return Err(de::Error::custom("state image keys out of order"));
            }
            previous = Some(key);
            map.next_value_seed(Append(&mut bytes))?;
            len += 1;
        }
        Ok(StateImage {
            bytes: Arc::new(bytes),
            len,
        })
    }
}

/// Deserializes one byte string onto the end of an image's buffer (as a varint length and the
/// bytes, without a buffer of its own) and returns where its bytes lie there.
struct Append<'b>(&'b mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = (usize, usize);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_bytes(self)
    }
}

impl<'de> Visitor<'de> for Append<'_> {
    type Value = (usize, usize);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
        push_bytes(self.0, bytes);
        let end = self.0.len();
        Ok((end - bytes.len(), end))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // Formats without byte strings (JSON) give a sequence of numbers.
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        self.visit_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BTreeMap<Vec<u8>, Vec<u8>> {
        BTreeMap::from([
            (b"".to_vec(), b"empty key".to_vec()),
            (b"a".to_vec(), vec![]),
            (b"b".to_vec(), vec![7; 300]),
            (vec![0xff; 200], vec![1; 20_000]),
        ])
    }

    #[test]
    fn an_image_reads_back_the_map_it_was_made_of() {
        let map = sample();
        let image = StateImage::from_map(&map);
        assert_eq!(image.len(), 4);
        assert_eq!(image.iter().len(), 4);
        assert_eq!(image.to_map(), map);
        let keys: Vec<&[u8]> = image.iter().map(|(key, _)| key).collect();
        let expected: Vec<&[u8]> = map.keys().map(Vec::as_slice).collect();
        assert_eq!(keys, expected);
        assert!(StateImage::from_map(&BTreeMap::new()).is_empty());
        assert_eq!(
            StateImage::from_map(&BTreeMap::new()),
            StateImage::default()
        );
    }

    #[test]
    fn an_image_is_made_in_one_allocation_of_its_size() {
        let image = StateImage::from_map(&sample());
        assert_eq!(image.bytes.capacity(), image.bytes.len());
    }

    #[test]
    fn varint_lengths_match_what_is_pushed() {
        for n in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            2_097_151,
            2_097_152,
            usize::MAX,
        ] {
            let mut out = Vec::new();
            let mut n_left = n;
            while n_left >= 0x80 {
                out.push(0);
                n_left >>= 7;
            }
            out.push(0);
            assert_eq!(varint_len(n), out.len(), "{n}");
        }
    }

    /// The encoding is the map's in postcard (the write-ahead log), both ways.
    #[test]
    fn an_image_encodes_as_the_map_does() {
        let map = sample();
        let image = StateImage::from_map(&map);
        let encoded = postcard::to_allocvec(&map).unwrap();
        assert_eq!(postcard::to_allocvec(&image).unwrap(), encoded);
        assert_eq!(postcard::from_bytes::<StateImage>(&encoded).unwrap(), image);
    }

    #[test]
    fn keys_out_of_order_or_repeated_are_refused() {
        // postcard: 2 pairs, keys "b" then "a".
        let unordered = [2, 1, b'b', 0, 1, b'a', 0];
        assert!(postcard::from_bytes::<StateImage>(&unordered).is_err());
        let repeated = [2, 1, b'a', 0, 1, b'a', 0];
        assert!(postcard::from_bytes::<StateImage>(&repeated).is_err());
        let ordered = [2, 1, b'a', 0, 1, b'b', 1, 9];
        let image = postcard::from_bytes::<StateImage>(&ordered).unwrap();
        assert_eq!(
            image.iter().collect::<Vec<_>>(),
            vec![(&b"a"[..], &b""[..]), (&b"b"[..], &[9][..])]
        );
    }

    #[test]
    fn truncated_or_overlong_input_is_an_error() {
        // A count of 1, a key length of 1000 and three bytes.
        assert!(postcard::from_bytes::<StateImage>(&[1, 0xe8, 0x07, 1, 2, 3]).is_err());
        // A count of 2 and one pair.
        assert!(postcard::from_bytes::<StateImage>(&[2, 1, b'a', 0]).is_err());
        // A varint of more than 64 bits.
        assert!(split_bytes(&[0xff; 11]).is_none());
    }
}
