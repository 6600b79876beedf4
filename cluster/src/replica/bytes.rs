//! serde `with` modules that carry keys and values as byte strings.
//!
//! A plain `Vec<u8>` goes through serde as a sequence of `u8`s: postcard writes the same bytes
//! (a varint length, then the bytes), but reads and writes them one element at a time through a
//! visitor, which dominated a loaded node's decoding profile. These modules use
//! `serialize_bytes` and `deserialize_byte_buf` instead, so the encoding is unchanged (postcard
//! frames and the write-ahead log stay compatible) and a key or value moves as one slice.
//!
//! Self-describing formats (JSON) see a byte array, as before.

use std::fmt;

use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// Key-value pairs.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;
/// Keys and their new values (`None`: removed).
type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A borrowed byte string, serialized as bytes.
pub(super) struct Ref<'a>(pub(super) &'a [u8]);

impl Serialize for Ref<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// An owned byte string, deserialized from bytes (or, from formats without them, a sequence).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Buf(Vec<u8>);

impl<'de> Deserialize<'de> for Buf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BufVisitor;
        impl<'de> Visitor<'de> for BufVisitor {
            type Value = Buf;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Buf, E> {
                Ok(Buf(bytes.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Buf, E> {
                Ok(Buf(bytes))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Buf, A::Error> {
                // At most a small preallocation: the length hint comes from the peer.
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(byte) = seq.next_element::<u8>()? {
                    bytes.push(byte);
                }
                Ok(Buf(bytes))
            }
        }
        deserializer.deserialize_byte_buf(BufVisitor)
    }
}

/// `Vec<u8>`.
pub(crate) mod vec {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        Ref(bytes).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        Buf::deserialize(deserializer).map(|buf| buf.0)
    }
}

/// `Option<Vec<u8>>`.
pub(crate) mod option {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        bytes.as_deref().map(Ref).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<Buf>::deserialize(deserializer).map(|buf| buf.map(|buf| buf.0))
    }
}

/// `Vec<(Vec<u8>, Vec<u8>)>`: key-value pairs.
pub(crate) mod pairs {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        pairs: &[(Vec<u8>, Vec<u8>)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(pairs.iter().map(|(key, value)| (Ref(key), Ref(value))))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Pairs, D::Error> {
        Vec::<(Buf, Buf)>::deserialize(deserializer).map(|pairs| {
            pairs
                .into_iter()
                .map(|(key, value)| (key.0, value.0))
                .collect()
        })
    }
}

/// `Vec<(Vec<u8>, Option<Vec<u8>>)>`: keys and their new values (`None`: removed).
pub(crate) mod writes {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        writes: &[(Vec<u8>, Option<Vec<u8>>)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(
            writes
                .iter()
                .map(|(key, value)| (Ref(key), value.as_deref().map(Ref))),
        )
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Writes, D::Error> {
        Vec::<(Buf, Option<Buf>)>::deserialize(deserializer).map(|writes| {
            writes
                .into_iter()
                .map(|(key, value)| (key.0, value.map(|value| value.0)))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Plain {
        key: Vec<u8>,
        value: Option<Vec<u8>>,
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsBytes {
        #[serde(with = "vec")]
        key: Vec<u8>,
        #[serde(with = "option")]
        value: Option<Vec<u8>>,
        #[serde(with = "pairs")]
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        #[serde(with = "writes")]
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    }

    /// Byte strings encode exactly as plain `Vec<u8>`s do in postcard (frames and the
    /// write-ahead log are unchanged) and in JSON, and decode from either.
    #[test]
    fn the_encoding_is_the_plain_one() {
        let key = b"key:1".to_vec();
        let plain = Plain {
            key: key.clone(),
            value: Some(vec![0, 255, 7]),
            pairs: vec![(b"a".to_vec(), vec![]), (b"b".to_vec(), vec![1; 300])],
            writes: vec![(b"x".to_vec(), None), (b"y".to_vec(), Some(vec![9]))],
        };
        let bytes = AsBytes {
            key,
            value: plain.value.clone(),
            pairs: plain.pairs.clone(),
            writes: plain.writes.clone(),
        };
        let encoded = postcard::to_allocvec(&plain).unwrap();
        assert_eq!(postcard::to_allocvec(&bytes).unwrap(), encoded);
        assert_eq!(postcard::from_bytes::<AsBytes>(&encoded).unwrap(), bytes);
        let json = serde_json::to_string(&plain).unwrap();
        assert_eq!(serde_json::to_string(&bytes).unwrap(), json);
        assert_eq!(serde_json::from_str::<AsBytes>(&json).unwrap(), bytes);
    }

    #[test]
    fn a_length_past_the_end_is_an_error() {
        // A varint length of 1000 followed by 3 bytes.
        let frame = [0xe8, 0x07, 1, 2, 3];
        assert!(postcard::from_bytes::<Buf>(&frame).is_err());
    }
}
