//! [`NodeId`]: the validated, stable name of a cluster member.

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, InvalidNodeId};

/// The longest [`NodeId`], in bytes of UTF-8.
pub const MAX_NODE_ID_LEN: usize = 64;

/// The stable, operator-visible name of a cluster member, such as `n0` or `db-7.eu`.
///
/// Valid names are 1 to [`MAX_NODE_ID_LEN`] bytes of printable UTF-8 with no whitespace:
/// control characters and invisible formatting characters (zero-width spaces, bidirectional
/// overrides, byte-order marks) are refused, because an operator could not tell two such names
/// apart. A member's vnode tokens derive from its name, so a node that keeps its name keeps its
/// ring positions across restarts.
///
/// Names order bytewise; that order breaks ties between equal tokens. Cloning is cheap (a
/// reference count).
///
/// [`NodeId::new`] hands out the same allocation for a name it made recently on the same
/// thread (a per-thread memo of up to [`RECENT_IDS`] names), so the ids parsed from a peer's
/// every message, and compared at every ballot and member, are usually one pointer apart from
/// the ones a node already holds: equality and ordering check that first. The memo changes no
/// result, only how much an id costs to make and compare.
#[derive(Clone)]
pub struct NodeId(Arc<str>);

/// The most names each thread's memo of [`NodeId::new`] keeps: more than a node's peers,
/// and a bound on what a stream of made-up names can make it hold. A full memo starts over.
const RECENT_IDS: usize = 1024;

/// The memo's set, hashed with fixed keys: no ambient randomness in this crate.
type Memo = std::collections::HashSet<
    NodeId,
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
>;

thread_local! {
    /// The ids [`NodeId::new`] made on this thread since its memo last started over.
    static RECENT: std::cell::RefCell<Memo> = std::cell::RefCell::new(Memo::default());
}

impl PartialEq for NodeId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for NodeId {}

impl std::hash::Hash for NodeId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialOrd for NodeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NodeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl NodeId {
    /// Validates `name` and makes it a `NodeId`: the one made recently on this thread for
    /// the same name if there is one (see the type's doc).
    pub fn new(name: &str) -> Result<Self, Error> {
        if let Some(known) = RECENT.with_borrow(|recent| recent.get(name).cloned()) {
            return Ok(known);
        }
        validate(name).map_err(|problem| Error::InvalidNodeId {
            shown: shown(name),
            problem,
        })?;
        let id = NodeId(Arc::from(name));
        RECENT.with_borrow_mut(|recent| {
            if recent.len() >= RECENT_IDS {
                recent.clear();
            }
            recent.insert(id.clone());
        });
        Ok(id)
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as bytes, exactly as hashed into tokens.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

fn validate(name: &str) -> Result<(), InvalidNodeId> {
    if name.is_empty() {
        return Err(InvalidNodeId::Empty);
    }
    if name.len() > MAX_NODE_ID_LEN {
        return Err(InvalidNodeId::TooLong { len: name.len() });
    }
    for (at, c) in name.char_indices() {
        if c.is_whitespace() {
            return Err(InvalidNodeId::Whitespace { at });
        }
        if c.is_control() || is_invisible_format(c) {
            return Err(InvalidNodeId::NotPrintable { at });
        }
    }
    Ok(())
}

/// Format characters that render as nothing or reorder text, so two names would look alike.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

/// The rejected input for an error message: escaped, and cut so that a megabyte of garbage
/// does not become a megabyte of log line.
fn shown(name: &str) -> String {
    const SHOWN_CHARS: usize = 80;
    let mut cut: String = name.chars().take(SHOWN_CHARS).collect();
    if cut.len() < name.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

impl FromStr for NodeId {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self, Error> {
        NodeId::new(name)
    }
}

impl TryFrom<&str> for NodeId {
    type Error = Error;

    fn try_from(name: &str) -> Result<Self, Error> {
        NodeId::new(name)
    }
}

impl TryFrom<String> for NodeId {
    type Error = Error;

    fn try_from(name: String) -> Result<Self, Error> {
        NodeId::new(&name)
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodeId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({:?})", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_made_again_is_the_same_allocation_and_compares_as_before() {
        let a = NodeId::new("n-shared").unwrap();
        let b = NodeId::new("n-shared").unwrap();
        assert!(Arc::ptr_eq(&a.0, &b.0), "the memo hands out the recent id");
        // Ids of equal names from different allocations still compare equal, and order by
        // their bytes.
        let apart = NodeId(Arc::from("n-shared"));
        assert!(!Arc::ptr_eq(&a.0, &apart.0));
        assert_eq!(a, apart);
        assert_eq!(a.cmp(&apart), std::cmp::Ordering::Equal);
        let later = NodeId::new("n-sharee").unwrap();
        assert!(a < later && apart < later);
        // More names than the memo keeps: each is still valid and equal to itself.
        let many: Vec<NodeId> = (0..RECENT_IDS * 2)
            .map(|i| NodeId::new(&format!("m{i}")).unwrap())
            .collect();
        for (i, id) in many.iter().enumerate() {
            assert_eq!(id.as_str(), format!("m{i}"));
            assert_eq!(*id, NodeId::new(&format!("m{i}")).unwrap());
        }
        // A bad name is refused even right after good ones.
        assert!(NodeId::new("bad name").is_err());
    }

    #[test]
    fn accepts_ordinary_and_unicode_names() {
        for name in ["n0", "db-7.eu", "ñodo_1", "x".repeat(64).as_str(), "節点"] {
            assert_eq!(NodeId::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn refuses_bad_names_with_the_reason() {
        let cases: &[(&str, InvalidNodeId)] = &[
            ("", InvalidNodeId::Empty),
            (&"x".repeat(65), InvalidNodeId::TooLong { len: 65 }),
            ("a b", InvalidNodeId::Whitespace { at: 1 }),
            ("a\u{3000}", InvalidNodeId::Whitespace { at: 1 }),
            ("tab\t", InvalidNodeId::Whitespace { at: 3 }),
            ("nul\0", InvalidNodeId::NotPrintable { at: 3 }),
            ("esc\u{1b}[0m", InvalidNodeId::NotPrintable { at: 3 }),
            ("zw\u{200B}j", InvalidNodeId::NotPrintable { at: 2 }),
            ("\u{202E}evil", InvalidNodeId::NotPrintable { at: 0 }),
        ];
        for (name, problem) in cases {
            match NodeId::new(name) {
                Err(Error::InvalidNodeId { problem: got, .. }) => assert_eq!(got, *problem),
                other => panic!("{name:?}: expected {problem:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn error_message_is_clear_and_bounded() {
        let err = NodeId::new("a b").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid node id "a b": it contains whitespace at byte 1"#
        );
        let huge = "y".repeat(1 << 20);
        let message = NodeId::new(&huge).unwrap_err().to_string();
        assert!(message.len() < 200, "{message}");
        assert!(message.contains("1048576 bytes long, at most 64"));
    }

    #[test]
    fn four_byte_characters_count_as_bytes() {
        // 16 four-byte characters are exactly 64 bytes; 17 are too many.
        assert!(NodeId::new(&"🦀".repeat(16)).is_ok());
        assert!(matches!(
            NodeId::new(&"🦀".repeat(17)),
            Err(Error::InvalidNodeId {
                problem: InvalidNodeId::TooLong { len: 68 },
                ..
            })
        ));
    }
}
