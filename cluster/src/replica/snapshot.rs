//! The reads a leader asks of its shell for snapshot transfers (R6), and [`MemoryViews`], the
//! shell side for a disk image kept in memory.
//!
//! A leader never sends a snapshot from its own memory: it asks the shell to open a *view* of
//! the shard's durable state (the node opens a redb read transaction) and to read it in key
//! order, one chunk at a time, as the receiver acknowledges. The view's position is the one
//! the disk records, at or behind the replica's applied index; the entries after it follow as
//! `Append`s. The replica holds at most `SNAPSHOT_WINDOW` chunks of a transfer in memory.

use std::collections::BTreeMap;

use super::{Base, Durable, KvState};

/// Key-value pairs in key order, as a snapshot chunk carries them.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Identifies one view of one replica; never reused by that replica.
pub type ViewId = u64;

/// A read of a shard's durable state that the shell answers with
/// [`ShardReplica::handle_snapshot_read`](super::ShardReplica::handle_snapshot_read), in the
/// order asked, off the event loop if it likes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SnapshotRead {
    /// Take a consistent view of the shard's durable state: its applied key-value pairs and
    /// the position and config they are at. Answer [`SnapshotReadReply::Opened`] with the
    /// view's base and size, or [`SnapshotReadReply::Failed`] (no such state on disk yet, a
    /// tombstone, too many views open, a state older than `at_least`).
    Open {
        /// The view.
        view: ViewId,
        /// The log position the state must be at or past: the leader's log base, since the
        /// entries up to it are compacted and an older state could not be completed from the
        /// log. A shell that keeps older states on disk should bring them forward soon (the
        /// leader asks again after a heartbeat round).
        at_least: u64,
    },
    /// The pairs of `view` with keys after `after` (from the first for `None`), in key order,
    /// up to about `max_bytes` of keys and values (at least one pair if any remain).
    Chunk {
        /// The view.
        view: ViewId,
        /// The chunk's number in the transfer (the first is 0).
        seq: u64,
        /// The last key of the previous chunk.
        after: Option<Vec<u8>>,
        /// The chunk's size budget.
        max_bytes: usize,
    },
    /// `view` is no longer needed: release it (a read transaction pins the pages it sees).
    Close {
        /// The view.
        view: ViewId,
    },
}

/// The shell's answer to an `Open` or `Chunk` [`SnapshotRead`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SnapshotReadReply {
    /// The view is open.
    Opened {
        /// The view.
        view: ViewId,
        /// The position and config of the state it shows.
        base: Base,
        /// Its pairs.
        keys: u64,
        /// Its key and value bytes.
        bytes: u64,
    },
    /// One chunk of the view.
    Chunk {
        /// The view.
        view: ViewId,
        /// The chunk asked for.
        seq: u64,
        /// Its pairs.
        pairs: Pairs,
        /// No pair follows the chunk's last.
        last: bool,
    },
    /// The view could not be opened or read; it is closed. The leader tries again later.
    Failed {
        /// The view.
        view: ViewId,
    },
}

impl Durable {
    /// The base of the applied state: the position and config at `applied`. `None` for a
    /// tombstone, or an applied index the log does not reach.
    pub fn applied_base(&self) -> Option<Base> {
        if self.tombstone.is_some() {
            return None;
        }
        Some(Base {
            pos: self.pos_at(self.applied)?,
            config: self.config_at(self.applied).clone(),
        })
    }
}

/// Views of disk images kept in memory, for shells without a real disk (the simulations and
/// model harnesses): each open view is a copy of the image's applied state. The node answers
/// from redb read transactions instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MemoryViews {
    /// Each open view's copy of the applied state, by shard and view.
    views: BTreeMap<(u16, ViewId), KvState>,
}

impl MemoryViews {
    /// Answers `read` for `shard`, whose disk image is `disk` (`None`: nothing on disk).
    pub fn answer(
        &mut self,
        shard: u16,
        disk: Option<&Durable>,
        read: SnapshotRead,
    ) -> Option<SnapshotReadReply> {
        match read {
            SnapshotRead::Open { view, .. } => {
                let Some((disk, base)) = disk.and_then(|d| Some((d, d.applied_base()?))) else {
                    return Some(SnapshotReadReply::Failed { view });
                };
                let keys = disk.kv.len() as u64;
                let bytes = disk
                    .kv
                    .iter()
                    .map(|(k, v)| (k.len() + v.len()) as u64)
                    .sum();
                self.views.insert((shard, view), disk.kv.clone());
                Some(SnapshotReadReply::Opened {
                    view,
                    base,
                    keys,
                    bytes,
                })
            }
            SnapshotRead::Chunk {
                view,
                seq,
                after,
                max_bytes,
            } => {
                let Some(kv) = self.views.get(&(shard, view)) else {
                    return Some(SnapshotReadReply::Failed { view });
                };
                let (pairs, last) = chunk_after(kv, after.as_deref(), max_bytes);
                Some(SnapshotReadReply::Chunk {
                    view,
                    seq,
                    pairs,
                    last,
                })
            }
            SnapshotRead::Close { view } => {
                self.views.remove(&(shard, view));
                None
            }
        }
    }

    /// How many views are open.
    pub fn open(&self) -> usize {
        self.views.len()
    }
}

/// The pairs of `kv` after `after`, up to about `max_bytes` (at least one), and whether they
/// are the last.
fn chunk_after(kv: &KvState, after: Option<&[u8]>, max_bytes: usize) -> (Pairs, bool) {
    let mut rows = kv.iter_after(after).peekable();
    let mut pairs = Vec::new();
    let mut size = 0usize;
    while let Some((key, value)) = rows.peek() {
        let pair = key.len() + value.len();
        if !pairs.is_empty() && size + pair > max_bytes {
            break;
        }
        size += pair;
        pairs.push((key.to_vec(), value.to_vec()));
        rows.next();
    }
    let last = rows.peek().is_none();
    (pairs, last)
}
