//! Snapshot views: what a leader streams to a learner (R6), read from redb, never from the
//! replica's memory.
//!
//! A [`ShardView`] is one redb read transaction of one shard: its applied key-value pairs and
//! the position and config they are at, as of the last fold (a fold compacts a shard's log up
//! to its applied index, so its row then records exactly that position). Later commits and
//! folds do not change it. The [`SnapshotReader`] thread holds the views the core asked for
//! and answers its [`SnapshotRead`]s off the event loop.
//!
//! A view may be up to one fold interval behind the replica's applied index; the leader sends
//! the entries after it. When the leader's log was compacted past the last fold (its `Open`
//! names that base), the view could not be completed from the log: it is refused, and the log
//! thread is asked to fold now ([`FoldRequester`]), so the leader's next try, a heartbeat round
//! later, finds it (the periodic fold is up to 3 s away, and a move waits for it meanwhile).
//!
//! What it does not do: wait for that fold (the thread serves every transfer's chunks), or
//! share one view between transfers of the same shard.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow};
use cluster::replica::{Base, Pairs, SnapshotRead, SnapshotReadReply, ViewId};
use redb::{Database, ReadOnlyTable, ReadableDatabase};
use tokio::sync::mpsc as tokio_mpsc;

use super::{FoldRequester, KV, SHARDS, decode_row, kv_range};

/// The most views one node holds open at once; an `Open` beyond it fails, and its leader
/// tries again a heartbeat round later. Each open view pins the database pages it sees.
const MAX_OPEN_VIEWS: usize = 64;

/// One shard's applied state as of one read transaction, in key order.
pub(crate) struct ShardView {
    shard: u16,
    base: Base,
    kv: ReadOnlyTable<(u16, &'static [u8]), &'static [u8]>,
}

impl std::fmt::Debug for ShardView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardView")
            .field("shard", &self.shard)
            .field("base", &self.base.pos)
            .finish_non_exhaustive()
    }
}

impl ShardView {
    /// A view of `shard` in a new read transaction; `None` when the database holds no state
    /// for it (not folded yet), only a tombstone, or a log not compacted to the applied index
    /// (never after a fold).
    pub(crate) fn open(db: &Database, shard: u16) -> Result<Option<ShardView>> {
        let txn = db.begin_read().context("starting a read transaction")?;
        let shards = txn.open_table(SHARDS).context("opening the shards table")?;
        let Some(row) = shards.get(shard)? else {
            return Ok(None);
        };
        let row = decode_row(shard, row.value())?;
        // A fold compacts every shard it touches up to its applied index, so a folded row's
        // base is the position of its applied state.
        if row.tombstone.is_some() || row.applied != row.base_pos.index {
            return Ok(None);
        }
        let base = Base {
            pos: row.base_pos,
            config: row.base_config,
        };
        let kv = txn.open_table(KV).context("opening the kv table")?;
        Ok(Some(ShardView { shard, base, kv }))
    }

    /// The position and config of the state.
    pub(crate) fn base(&self) -> &Base {
        &self.base
    }

    /// The number of pairs and of key and value bytes.
    pub(crate) fn size(&self) -> Result<(u64, u64)> {
        let mut keys = 0u64;
        let mut bytes = 0u64;
        for row in self.kv.range::<(u16, &[u8])>(kv_range(self.shard))? {
            let (key, value) = row?;
            keys += 1;
            bytes += (key.value().1.len() + value.value().len()) as u64;
        }
        Ok((keys, bytes))
    }

    /// The pairs with keys after `after` (all of them for `None`), in key order, up to about
    /// `max_bytes` of keys and values (at least one pair if any remain), and whether no pair
    /// follows them: one snapshot chunk.
    pub(crate) fn chunk(&self, after: Option<&[u8]>, max_bytes: usize) -> Result<(Pairs, bool)> {
        let start = match after {
            Some(key) => Bound::Excluded((self.shard, key)),
            None => Bound::Included((self.shard, &[][..])),
        };
        let (_, end) = kv_range(self.shard);
        let mut pairs = Vec::new();
        let mut size = 0usize;
        for row in self.kv.range::<(u16, &[u8])>((start, end))? {
            let (key, value) = row?;
            let (key, value) = (key.value().1, value.value());
            let bytes = key.len() + value.len();
            if !pairs.is_empty() && size + bytes > max_bytes {
                return Ok((pairs, false));
            }
            size += bytes;
            pairs.push((key.to_vec(), value.to_vec()));
        }
        Ok((pairs, true))
    }
}

/// The thread that holds a node's [`ShardView`]s and answers the core's [`SnapshotRead`]s,
/// each shard's in the order asked.
#[derive(Debug)]
pub(crate) struct SnapshotReader {
    asks: Option<mpsc::Sender<(u16, SnapshotRead)>>,
    answers: tokio_mpsc::UnboundedReceiver<(u16, SnapshotReadReply)>,
    thread: Option<JoinHandle<()>>,
}

impl SnapshotReader {
    /// Starts the `slotring-views` thread on `db`.
    /// `folds` is asked for an early fold when a leader needs a later state than the last
    /// fold wrote.
    pub(crate) fn spawn(db: Arc<Database>, folds: FoldRequester) -> Result<SnapshotReader> {
        let (asks, asked) = mpsc::channel::<(u16, SnapshotRead)>();
        let (answer, answers) = tokio_mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("slotring-views".to_owned())
            .spawn(move || {
                let mut views: BTreeMap<(u16, ViewId), ShardView> = BTreeMap::new();
                while let Ok((shard, read)) = asked.recv() {
                    if let Some(reply) = serve(&db, &folds, &mut views, shard, read)
                        && answer.send((shard, reply)).is_err()
                    {
                        break;
                    }
                }
            })
            .context("starting the snapshot view thread")?;
        Ok(SnapshotReader {
            asks: Some(asks),
            answers,
            thread: Some(thread),
        })
    }

    /// Queues `read` of `shard`; never blocks.
    pub(crate) fn ask(&self, shard: u16, read: SnapshotRead) -> Result<()> {
        self.asks
            .as_ref()
            .and_then(|asks| asks.send((shard, read)).ok())
            .ok_or_else(|| anyhow!("the snapshot view thread has stopped"))
    }

    /// The next answer.
    pub(crate) async fn answer(&mut self) -> Option<(u16, SnapshotReadReply)> {
        self.answers.recv().await
    }
}

impl Drop for SnapshotReader {
    fn drop(&mut self) {
        self.asks = None;
        if let Some(thread) = self.thread.take() {
            // A panic was already printed; there is nothing more to report.
            let _ = thread.join();
        }
    }
}

/// Answers one read. A view that cannot be opened or read is reported `Failed` (and logged):
/// the leader tries again later, and the node keeps serving. So is a view older than the
/// leader's log base, after asking `folds` for a fold (the periodic one may be seconds away).
fn serve(
    db: &Database,
    folds: &FoldRequester,
    views: &mut BTreeMap<(u16, ViewId), ShardView>,
    shard: u16,
    read: SnapshotRead,
) -> Option<SnapshotReadReply> {
    match read {
        SnapshotRead::Open { view, at_least } => {
            if views.len() >= MAX_OPEN_VIEWS {
                tracing::debug!(shard, view, "snapshot view refused: too many open");
                return Some(SnapshotReadReply::Failed { view });
            }
            let opened = ShardView::open(db, shard).and_then(|opened| {
                opened
                    .map(|shard_view| Ok((shard_view.size()?, shard_view)))
                    .transpose()
            });
            match opened {
                Ok(Some((_, shard_view))) if shard_view.base().pos.index < at_least => {
                    tracing::debug!(
                        shard,
                        view,
                        disk = shard_view.base().pos.index,
                        at_least,
                        "snapshot view behind the log's base: folding early"
                    );
                    folds.fold_soon();
                    Some(SnapshotReadReply::Failed { view })
                }
                Ok(Some(((keys, bytes), shard_view))) => {
                    let base = shard_view.base().clone();
                    views.insert((shard, view), shard_view);
                    Some(SnapshotReadReply::Opened {
                        view,
                        base,
                        keys,
                        bytes,
                    })
                }
                Ok(None) => {
                    // Not folded since it was created (or a tombstone, which a fold does not
                    // change).
                    if at_least > 0 {
                        folds.fold_soon();
                    }
                    Some(SnapshotReadReply::Failed { view })
                }
                Err(error) => {
                    tracing::warn!(shard, %error, "snapshot view not opened");
                    Some(SnapshotReadReply::Failed { view })
                }
            }
        }
        SnapshotRead::Chunk {
            view,
            seq,
            after,
            max_bytes,
        } => {
            let read = views
                .get(&(shard, view))
                .map(|shard_view| shard_view.chunk(after.as_deref(), max_bytes));
            match read {
                Some(Ok((pairs, last))) => Some(SnapshotReadReply::Chunk {
                    view,
                    seq,
                    pairs,
                    last,
                }),
                Some(Err(error)) => {
                    tracing::warn!(shard, %error, "snapshot chunk not read");
                    views.remove(&(shard, view));
                    Some(SnapshotReadReply::Failed { view })
                }
                None => Some(SnapshotReadReply::Failed { view }),
            }
        }
        SnapshotRead::Close { view } => {
            views.remove(&(shard, view));
            None
        }
    }
}
