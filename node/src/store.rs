//! Durable shard storage: every shard replica's [`Durable`] state in one redb database,
//! `<data-dir>/shards.redb`, fed by a write-ahead log, `<data-dir>/shards.wal/` ([`wal`]).
//!
//! [`Store::open`] creates or opens the database, creates or checks its format version and the
//! node-wide [`StorageId`], folds what the write-ahead log holds beyond the database, and loads
//! every shard. [`Store::commit`] makes a whole [`HostPersist`] durable (R0) by appending it to
//! the log: one record and one `fdatasync`, whatever the number of shards and keys it touches.
//! [`Store::fold`] later applies many such batches to the shard tables in one redb transaction,
//! each [`Change`] exactly as [`Durable::apply_change`] does in memory, and records the first
//! sequence number not folded (`next_unfolded`) in the same transaction; the log's segments
//! before it are then deleted. So a group commit costs a sequential append and an fsync, and
//! the random B-tree pages of the shard tables are rewritten once per fold instead of once per
//! commit.
//!
//! [`StoreWorker::spawn`] runs commits and folds on two threads of their own, off the
//! event loop, so a fold (tens of milliseconds) never delays a commit; durable batch ids come
//! back in order through a [`StoreHandle`].
//!
//! A fold also compacts each shard it touches up to the shard's applied index (log compaction
//! after apply): the kv table holds what applied entries did, so the log table keeps only the
//! entries not applied yet, usually none, and entries appended and applied between two folds
//! never reach it. At full load on 3 nodes this cut the disk writes per node from 20–21 to
//! 16.5–17 MB/s. The replica's in-memory log keeps its entries for followers until its own
//! compaction; only a reloaded replica starts from the compacted log.
//!
//! Every state the disk can be in is "the shard tables as of some fold, plus the log's records
//! from `next_unfolded` on", and opening folds the latter. A large fold commits in parts, a
//! range of shards each, a pause apart, so that its write-out does not stall the log's
//! `fdatasync`s for tens of milliseconds at a time (BENCHMARKS.md, issue 5, session 23): each
//! part but the last records, per shard it holds, the first sequence number not folded into
//! that shard (`folded`), and a fold applies to a shard only the batches from there on. So a
//! crash between parts loses nothing and applies nothing twice.
//!
//! A [`ShardView`] reads the shard tables, so it sees the state as of the last fold; call
//! [`Store::fold`] first for the latest. A [`SnapshotReader`] thread holds the views of snapshot
//! transfers ([`views`]).
//!
//! The log thread writes every group commit submitted while a flush runs as its own record,
//! then flushes them together: the next `fdatasync` starts as soon as one ends, without a
//! round trip through the event loop.
//!
//! What it does not do: merge group commits into one record, retry a failed
//! commit or fold (after a failed fsync the disk's state is unknown: the node aborts, R0),
//! shrink the file, or lock the data dir (the data dir's lock does; redb also refuses a second
//! open of the same file).
//!
//! # Tables
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | `"format"`, `"storage_id"`, `"next_unfolded"` | `u32` / `u128` / `u64`, little endian |
//! | `shards` | shard `u16` | postcard of [`ShardRow`]: promised, base, applied, tombstone |
//! | `log` | `(shard, index)` | postcard of an [`Entry`] |
//! | `kv` | `(shard, key)` | value |
//! | `folded` | shard `u16` | `u64`: the first sequence number not folded into it (fold parts) |
//!
//! A shard's log rows are keyed by position: the `i`-th entry after the base (from 1) sits at
//! `base.pos.index + i`, so the rows of a shard are always exactly `base + 1 ..= base + len`,
//! which [`Store::open`] checks. After a fold a shard's base is its applied index (unless the
//! shard is tombstoned), so the `shards` and `kv` rows read in one transaction are a snapshot
//! at a recorded log position.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use self::wal::Wal;
use anyhow::{Context, Result, anyhow, bail};
use cluster::replica::{
    Ballot, Base, Change, Config, Durable, Entry, HostBatchId, HostPersist, ImageBuilder, KvState,
    Op, Pos, StorageId, Tombstone,
};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition, TableHandle,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc as tokio_mpsc;

/// The on-disk format this build writes. Version 1 had no write-ahead log; version 2's log
/// repeated every applied write in a `Change::AppliedWrites`, where version 3 names the entry
/// (`Change::Applied`). This build opens both, and records version 3, which older builds
/// refuse (version 1 builds would ignore the log, version 2 builds cannot decode its records).
pub(crate) const FORMAT_VERSION: u32 = 3;
const FIRST_FORMAT_VERSION: u32 = 1;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const SHARDS: TableDefinition<u16, &[u8]> = TableDefinition::new("shards");
const LOG: TableDefinition<(u16, u64), &[u8]> = TableDefinition::new("log");
const KV: TableDefinition<(u16, &[u8]), &[u8]> = TableDefinition::new("kv");
/// Per shard, the first log sequence number not folded into it, where that is past the store's
/// `next_unfolded`: written by the parts of a fold before its last (see [`Folder::fold`]).
const FOLDED: TableDefinition<u16, u64> = TableDefinition::new("folded");

const FORMAT_KEY: &str = "format";
const STORAGE_ID_KEY: &str = "storage_id";
const NEXT_UNFOLDED_KEY: &str = "next_unfolded";

/// A shard's durable state except its log and key-value pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ShardRow {
    promised: Option<Ballot>,
    base_pos: Pos,
    base_config: Config,
    applied: u64,
    tombstone: Option<TombstoneRow>,
}

/// [`Tombstone`], in serde form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct TombstoneRow {
    promised: Option<Ballot>,
    last: Pos,
    config: Config,
}

impl ShardRow {
    fn of(durable: &Durable) -> Self {
        ShardRow {
            promised: durable.promised.clone(),
            base_pos: durable.base.pos.clone(),
            base_config: durable.base.config.clone(),
            applied: durable.applied,
            tombstone: durable.tombstone.as_ref().map(|tombstone| TombstoneRow {
                promised: tombstone.promised.clone(),
                last: tombstone.last.clone(),
                config: tombstone.config.clone(),
            }),
        }
    }

    fn into_durable(self, log: Vec<Entry>, kv: KvState) -> Durable {
        Durable {
            promised: self.promised,
            base: Base {
                pos: self.base_pos,
                config: self.base_config,
            },
            log,
            kv,
            applied: self.applied,
            tombstone: self.tombstone.map(|tombstone| Tombstone {
                promised: tombstone.promised,
                last: tombstone.last,
                config: tombstone.config,
            }),
        }
    }
}

/// What [`Store::open`] found.
#[derive(Debug)]
pub(crate) struct Opened {
    /// The store, ready for commits.
    pub(crate) store: Store,
    /// The node-wide storage id, created with the database.
    pub(crate) storage_id: StorageId,
    /// Every shard's durable state.
    pub(crate) shards: BTreeMap<u16, Durable>,
}

/// When a fold is due: after this many commits or bytes of log records, whichever comes first
/// ([`Store::fold_if_due`]), and, in the [`StoreWorker`], also once the oldest unfolded commit
/// is `delay` old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FoldPolicy {
    /// Commits.
    pub(crate) batches: usize,
    /// Bytes of encoded log records.
    pub(crate) bytes: usize,
    /// The longest a commit waits to be folded while the worker is running.
    pub(crate) delay: std::time::Duration,
}

impl Default for FoldPolicy {
    /// 4,096 commits, 64 MiB or 2 s (jittered): a fold rewrites every B-tree page it touches,
    /// and with keys spread over a shard's whole table a short fold touches nearly as many
    /// pages as a long one, so rare folds write far less. Measured on 3 nodes sharing 2 cores
    /// and one disk: 200 ms folds cost 165 µs of CPU per replicated write, 2 s folds 130 µs.
    /// The bound keeps what an open must replay, and what waits in memory, to seconds.
    fn default() -> Self {
        FoldPolicy {
            batches: 4096,
            bytes: 64 << 20,
            delay: std::time::Duration::from_millis(2000),
        }
    }
}

/// One group commit's changes, by shard, in order: a log record's payload.
type WalBatch = Vec<(u16, Vec<Change>)>;
/// One shard's changes in one log record, with the record's sequence number.
type SeqChanges<'a> = (u64, &'a [Change]);

/// The shard database. One per node; not shared between threads (see [`StoreWorker`]).
#[derive(Debug)]
pub(crate) struct Store {
    wal: Wal,
    folder: Folder,
}

/// The shard tables' writer: committed batches wait here until folded.
#[derive(Debug)]
struct Folder {
    /// Shared with the [`StoreHandle`], whose snapshots read while the worker writes.
    db: Arc<Database>,
    path: PathBuf,
    policy: FoldPolicy,
    /// The sequence number of the first committed batch not in the shard tables.
    next_unfolded: u64,
    /// Committed batches from `next_unfolded` on, in order.
    unfolded: Vec<WalBatch>,
    unfolded_bytes: usize,
    /// About how many bytes of log records one part of a fold carries ([`FOLD_PART_BYTES`]).
    part_bytes: usize,
    /// The pause between two parts: [`FOLD_PART_PAUSE`] on the worker's fold thread, none
    /// while [`Store::open`] folds.
    part_pause: std::time::Duration,
    /// Tests: the fold fails (as a crash would stop it) after committing this many parts.
    #[cfg(test)]
    fail_after_parts: Option<usize>,
}

/// About how many bytes of log records one transaction of a fold applies. In a large table
/// each key written dirties a page of its own, so a part writes far more than its records:
/// 64 KiB of records (~400 writes of 100 B) are ~1.6 MB of 4 KiB pages, which reach the disk
/// at the part's commit, where a group commit's `fdatasync` on the same disk waits behind
/// them. Parts this small keep that wait short: writes paced at 2,000/s on 3 nodes holding
/// 1M keys had a p99 of 8.4-8.6 ms against 11.4-21.2 ms with 512 KiB parts (BENCHMARKS.md,
/// issue 6, session 37). At full load a 2 s fold carries ~10 MB and still commits in
/// [`FOLD_PARTS_MAX`] parts.
const FOLD_PART_BYTES: usize = 64 << 10;
/// The most parts a fold is split into.
const FOLD_PARTS_MAX: usize = 16;
/// The fold thread's pause between two parts of a fold: time for the disk to write one part
/// out before the next adds to it.
const FOLD_PART_PAUSE: std::time::Duration = std::time::Duration::from_millis(30);

/// Where the write-ahead log of the store at `db_path` lives.
fn wal_dir(db_path: &Path) -> PathBuf {
    db_path.with_file_name("shards.wal")
}

impl Store {
    /// Opens or creates the database at `path` (`<data-dir>/shards.redb`) and its log, folds
    /// what only the log holds, and loads every shard. A new database gets a new random
    /// [`StorageId`], so a wiped or recreated database is a new member (PROTOCOL.md I5).
    pub(crate) fn open(path: &Path, cache_bytes: usize) -> Result<Opened> {
        let shown = path.display();
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .with_context(|| format!("opening the shard store {shown} (is it a redb database?)"))?;
        let Meta {
            storage_id,
            next_unfolded,
            created,
        } = init_meta(&db).with_context(|| format!("reading the shard store {shown}"))?;
        let wal_dir = wal_dir(path);
        if created {
            // A log left by a deleted database belongs to a store that no longer exists.
            match std::fs::remove_dir_all(&wal_dir) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(error).with_context(|| {
                        format!("removing the old write-ahead log {}", wal_dir.display())
                    });
                }
                _ => {}
            }
        }
        let (wal, records) = Wal::open(&wal_dir, storage_id, next_unfolded)
            .with_context(|| format!("opening the write-ahead log of {shown}"))?;
        let mut store = Store {
            wal,
            folder: Folder {
                db: Arc::new(db),
                path: path.to_owned(),
                policy: FoldPolicy::default(),
                next_unfolded,
                unfolded: Vec::new(),
                unfolded_bytes: 0,
                part_bytes: FOLD_PART_BYTES,
                // Opening folds at once: nothing commits meanwhile. The worker paces its folds.
                part_pause: std::time::Duration::ZERO,
                #[cfg(test)]
                fail_after_parts: None,
            },
        };
        for (seq, payload) in records {
            let batch: WalBatch = postcard::from_bytes(&payload)
                .with_context(|| format!("decoding write-ahead record {seq} of {shown}"))?;
            store.folder.push(seq, batch, payload.len())?;
        }
        store
            .fold()
            .with_context(|| format!("folding the write-ahead log of {shown}"))?;
        let shards =
            load(&store.folder.db).with_context(|| format!("loading the shards of {shown}"))?;
        Ok(Opened {
            store,
            storage_id,
            shards,
        })
    }

    /// Folds after other numbers of commits or bytes than [`FoldPolicy::default`] (tests:
    /// the daemon keeps the default).
    #[cfg(test)]
    pub(crate) fn set_fold_policy(&mut self, policy: FoldPolicy) {
        self.folder.policy = policy;
    }

    /// Writes whole shard states, replacing what the store holds for them, in one durable
    /// transaction: for a bootstrap, whose initial config ([`Durable::bootstrap`]) reaches the
    /// disk through no [`Change`]. A shard the store does not hold starts from
    /// [`Durable::empty`] at its first commit. Tests only: the daemon bootstraps through an
    /// `InstallSnapshot` change like any other.
    #[cfg(test)]
    pub(crate) fn create_shards<'a>(
        &mut self,
        shards: impl IntoIterator<Item = (u16, &'a Durable)>,
    ) -> Result<()> {
        // Committed changes go first, or a later fold would apply them over the new states.
        self.fold()?;
        let txn = self.folder.begin_write()?;
        {
            let mut tables = Tables::open(&txn)?;
            for (shard, durable) in shards {
                tables
                    .put_shard(shard, durable)
                    .with_context(|| format!("writing shard {shard}"))?;
            }
        }
        txn.commit()
            .with_context(|| format!("committing new shards to {}", self.folder.path.display()))
    }

    /// Makes `persist` durable: one record appended to the write-ahead log and fsynced (tests;
    /// the [`StoreWorker`] does the same on its own thread). On an error the log's tail is
    /// unknown to the caller: the node must abort (R0).
    #[cfg(test)]
    pub(crate) fn commit(&mut self, persist: &HostPersist) -> Result<()> {
        let (seq, batch, bytes) = append_batch(&mut self.wal, persist.clone())?;
        self.folder.push(seq, batch, bytes)
    }

    /// Tests: folds split into parts of about `part_bytes` of records, without pauses, and the
    /// next fold stopped after `fail_after_parts` parts as a crash would stop it.
    #[cfg(test)]
    pub(crate) fn split_folds(&mut self, part_bytes: usize, fail_after_parts: Option<usize>) {
        self.folder.part_bytes = part_bytes;
        self.folder.part_pause = std::time::Duration::ZERO;
        self.folder.fail_after_parts = fail_after_parts;
    }

    /// [`fold`](Self::fold)s once the [`FoldPolicy`]'s count or size says so.
    #[cfg(test)]
    pub(crate) fn fold_if_due(&mut self) -> Result<()> {
        if self.folder.is_due() {
            self.fold()?;
        }
        Ok(())
    }

    /// Applies every committed batch not yet in the shard tables, in order, in durable
    /// transactions ([`Folder::fold`]), then deletes the log segments that only held folded
    /// batches.
    pub(crate) fn fold(&mut self) -> Result<()> {
        self.folder.fold()?;
        self.wal.release(self.folder.next_unfolded)
    }

    /// A consistent view of one shard's applied state (a redb read transaction) as of the
    /// last fold: what a leader streams to a learner (R6). Later commits do not change it.
    #[cfg(test)]
    pub(crate) fn view(&self, shard: u16) -> Result<Option<ShardView>> {
        ShardView::open(&self.folder.db, shard)
    }
}

/// Appends `persist` to `wal` as one durable record; returns its sequence number, its changes
/// (for the fold: moved, not copied) and the record's payload size.
#[cfg(test)]
fn append_batch(wal: &mut Wal, persist: HostPersist) -> Result<Committed> {
    let committed = append_unsynced(wal, persist)?;
    wal.sync()?;
    Ok(committed)
}

/// Appends each group commit as its own record, then makes them all durable with one
/// `fdatasync`; returns each one's id and what the fold needs of it, in order.
fn append_group(wal: &mut Wal, group: Vec<HostPersist>) -> Result<Vec<(HostBatchId, Committed)>> {
    let mut committed = Vec::with_capacity(group.len());
    for persist in group {
        let id = persist.batch;
        committed.push((id, append_unsynced(wal, persist)?));
    }
    wal.sync()?;
    Ok(committed)
}

/// Appends one group commit's record without flushing it.
fn append_unsynced(wal: &mut Wal, persist: HostPersist) -> Result<Committed> {
    let id = persist.batch.0;
    let batch: WalBatch = persist
        .shards
        .into_iter()
        .map(|(shard, shard_persist)| (shard, shard_persist.changes))
        .collect();
    let (seq, bytes) = wal
        .append_unsynced_with(|record| encode_onto(&batch, record))
        .with_context(|| format!("committing batch {id}"))?;
    Ok((seq, batch, bytes))
}

impl Folder {
    /// Queues committed batch `seq` for the next fold.
    fn push(&mut self, seq: u64, batch: WalBatch, bytes: usize) -> Result<()> {
        let expected = self.next_unfolded + self.unfolded.len() as u64;
        if seq != expected {
            bail!("write-ahead record {seq} arrived for folding, expected {expected}");
        }
        self.unfolded.push(batch);
        self.unfolded_bytes += bytes;
        Ok(())
    }

    #[cfg(test)]
    fn is_due(&self) -> bool {
        self.unfolded.len() >= self.policy.batches || self.unfolded_bytes >= self.policy.bytes
    }

    /// Applies every queued batch to the shard tables, in order, and advances `next_unfolded`
    /// past them, in transactions with [`Durability::Immediate`]: one for a small fold; for a
    /// larger one a part per range of shards (about `part_bytes` of records each, at most
    /// [`FOLD_PARTS_MAX`]), `part_pause` apart, the last one recording the new
    /// `next_unfolded`. A shard gets only the batches from its `folded` row on (the part of an
    /// interrupted fold that held it applied the rest).
    fn fold(&mut self) -> Result<()> {
        if self.unfolded.is_empty() {
            return Ok(());
        }
        let first = self.next_unfolded;
        let next_unfolded = first + self.unfolded.len() as u64;
        // Shards are independent (every table is keyed by shard), so each shard's changes
        // are applied together, shards in order: a shard's log rows then go in index
        // order and its key-value rows in key order, touching each B-tree page once
        // instead of in the arrival order of random keys.
        let mut by_shard: BTreeMap<u16, Vec<SeqChanges>> = BTreeMap::new();
        for (seq, batch) in (first..).zip(&self.unfolded) {
            for (shard, changes) in batch {
                by_shard.entry(*shard).or_default().push((seq, changes));
            }
        }
        let shards: Vec<(u16, Vec<SeqChanges>)> = by_shard.into_iter().collect();
        let parts = (self.unfolded_bytes / self.part_bytes.max(1)).clamp(1, FOLD_PARTS_MAX);
        let per_part = shards.len().div_ceil(parts).max(1);
        let mut parts: Vec<&[(u16, Vec<SeqChanges>)]> = shards.chunks(per_part).collect();
        if parts.is_empty() {
            parts.push(&[]);
        }
        let count = parts.len();
        for (done, part) in parts.into_iter().enumerate() {
            let last = done + 1 == count;
            if done > 0 {
                std::thread::sleep(self.part_pause);
            }
            #[cfg(test)]
            if self.fail_after_parts == Some(done) {
                bail!("the fold stopped after {done} of {count} parts (a test's crash)");
            }
            let txn = self.begin_write()?;
            {
                let mut tables = Tables::open(&txn)?;
                let mut folded = txn.open_table(FOLDED).context("opening the folded table")?;
                for (shard, batches) in part {
                    let from = folded
                        .get(*shard)
                        .context("reading a shard's folded position")?
                        .map_or(first, |from| from.value().max(first));
                    // A batch may name a shard with no changes: that still stores the shard.
                    let due = batches.iter().filter(|(seq, _)| *seq >= from);
                    if due.clone().next().is_some() {
                        let changes: Vec<&Change> =
                            due.flat_map(|(_, changes)| changes.iter()).collect();
                        tables
                            .apply_all(*shard, &changes)
                            .with_context(|| format!("folding changes into shard {shard}"))?;
                    }
                    if !last {
                        folded
                            .insert(*shard, next_unfolded)
                            .context("recording a shard's folded position")?;
                    }
                }
                if last {
                    txn.open_table(META)
                        .context("opening the meta table")?
                        .insert(NEXT_UNFOLDED_KEY, &next_unfolded.to_le_bytes()[..])
                        .context("recording the folded position")?;
                }
            }
            txn.commit().with_context(|| {
                format!(
                    "folding committed batches into {} (the node must abort)",
                    self.path.display()
                )
            })?;
        }
        self.next_unfolded = next_unfolded;
        self.unfolded.clear();
        self.unfolded_bytes = 0;
        Ok(())
    }

    fn begin_write(&self) -> Result<WriteTransaction> {
        let mut txn = self.db.begin_write().with_context(|| {
            format!(
                "starting a write transaction on {} (an earlier IO error?)",
                self.path.display()
            )
        })?;
        txn.set_durability(Durability::Immediate)
            .context("asking for immediate durability")?;
        Ok(txn)
    }
}

/// A shard's row while a transaction changes it, and how many log entries it has.
#[derive(Debug)]
struct Cursor {
    row: ShardRow,
    len: u64,
}

/// The shard tables, open in one write transaction.
struct Tables<'txn> {
    shards: Table<'txn, u16, &'static [u8]>,
    log: Table<'txn, (u16, u64), &'static [u8]>,
    kv: Table<'txn, (u16, &'static [u8]), &'static [u8]>,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<Self> {
        Ok(Tables {
            shards: txn.open_table(SHARDS).context("opening the shards table")?,
            log: txn.open_table(LOG).context("opening the log table")?,
            kv: txn.open_table(KV).context("opening the kv table")?,
        })
    }

    /// The shard's row and log length; [`Durable::empty`] for a shard not stored yet.
    fn cursor(&self, shard: u16) -> Result<Cursor> {
        let row = match self.shards.get(shard)? {
            Some(bytes) => decode_row(shard, bytes.value())?,
            None => {
                return Ok(Cursor {
                    row: ShardRow::of(&Durable::empty()),
                    len: 0,
                });
            }
        };
        let last = self
            .log
            .range(log_range(shard, 0))?
            .next_back()
            .transpose()?;
        let len = match last {
            Some((key, _)) => key
                .value()
                .1
                .checked_sub(row.base_pos.index)
                .ok_or_else(|| anyhow!("shard {shard}'s log has an entry at or below its base"))?,
            None => 0,
        };
        Ok(Cursor { row, len })
    }

    #[cfg(test)]
    fn put_shard(&mut self, shard: u16, durable: &Durable) -> Result<()> {
        self.clear_log(shard)?;
        self.clear_kv(shard)?;
        let mut cursor = Cursor {
            row: ShardRow::of(durable),
            len: 0,
        };
        self.append(shard, &mut cursor, &durable.log)?;
        for (key, value) in &durable.kv {
            self.kv.insert((shard, key), value)?;
        }
        let row = encode(&cursor.row)?;
        self.shards.insert(shard, row.as_slice())?;
        Ok(())
    }

    /// Applies one shard's `changes`, in order, with the effect of [`Durable::apply_change`]
    /// on each, then compacts the shard's log up to its applied index
    /// ([`Tables::compact_to_applied`]).
    ///
    /// Nothing is written before the end: the key-value writes of `Applied` changes are merged
    /// (the last write of a key wins) and written in key order, and appended entries wait in
    /// `tail` so that those applied within the fold never reach the log table. A `Tombstone`
    /// clears the log (its state stays, as the retired copy); an `InstallSnapshot` or a
    /// `DropRetired` clears the state too, so what was merged before it is dropped.
    fn apply_all(&mut self, shard: u16, changes: &[&Change]) -> Result<()> {
        let mut cursor = self.cursor(shard)?;
        let mut writes: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
        // The entries after the log rows, in order.
        let mut tail: Vec<&Entry> = Vec::new();
        for change in changes {
            match change {
                Change::Applied { index } => {
                    // The entry is in `tail` (appended within this fold) or, near a fold's
                    // edge, in the log table: then what is merged so far goes first.
                    let base = cursor.row.base_pos.index;
                    let in_tail = index
                        .checked_sub(base + cursor.len + 1)
                        .and_then(|at| usize::try_from(at).ok());
                    match in_tail {
                        Some(at) => {
                            let entry = tail.get(at).ok_or_else(|| {
                                anyhow!("shard {shard}: applied entry {index} is past its log")
                            })?;
                            if let Some((key, value)) = entry_write(entry) {
                                writes.insert(key, value);
                            }
                        }
                        None => {
                            for (key, value) in std::mem::take(&mut writes) {
                                self.write_kv(shard, key, value)?;
                            }
                            self.apply_logged_entry(shard, *index)?;
                        }
                    }
                    cursor.row.applied = *index;
                }
                Change::AppliedWrites {
                    index,
                    writes: applied,
                } => {
                    for (key, value) in applied {
                        writes.insert(key.as_slice(), value.as_deref());
                    }
                    cursor.row.applied = *index;
                }
                Change::Append(entries) => tail.extend(entries),
                Change::Truncate { from } => {
                    let keep = from
                        .saturating_sub(1)
                        .saturating_sub(cursor.row.base_pos.index);
                    match keep.checked_sub(cursor.len) {
                        Some(in_tail) => {
                            tail.truncate(usize::try_from(in_tail).unwrap_or(usize::MAX));
                        }
                        None => {
                            tail.clear();
                            self.apply(shard, &mut cursor, change)?;
                        }
                    }
                }
                Change::Compact { base } => {
                    let passed = base.pos.index.saturating_sub(cursor.row.base_pos.index);
                    let in_tail = passed.saturating_sub(cursor.len);
                    tail.drain(
                        ..usize::try_from(in_tail)
                            .unwrap_or(usize::MAX)
                            .min(tail.len()),
                    );
                    self.apply(shard, &mut cursor, change)?;
                }
                Change::Tombstone(_) => {
                    tail.clear();
                    self.apply(shard, &mut cursor, change)?;
                }
                Change::InstallSnapshot { .. } => {
                    writes.clear();
                    tail.clear();
                    self.apply(shard, &mut cursor, change)?;
                }
                Change::DropRetired => {
                    writes.clear();
                    self.apply(shard, &mut cursor, change)?;
                }
                Change::Promised(ballot) => cursor.row.promised = Some(ballot.clone()),
            }
        }
        for (key, value) in writes {
            self.write_kv(shard, key, value)?;
        }
        self.compact_to_applied(shard, &mut cursor, &mut tail)?;
        self.append(shard, &mut cursor, tail)?;
        let row = encode(&cursor.row)?;
        self.shards.insert(shard, row.as_slice())?;
        Ok(())
    }

    /// Moves the shard's base up to its applied index, dropping the log rows and `tail`
    /// entries it passes: the applied state in the kv table holds everything they did, so the
    /// log table holds only what is not applied yet ("log compaction after apply"). The new
    /// base's config is the last config among the passed entries, else the old base's. A
    /// tombstoned shard, or an applied index outside the log, is left as it is.
    ///
    /// This is a compaction the replica did not ask for, which R6 allows at any time: a
    /// reloaded replica sends a snapshot, not entries, to a follower that needs the entries
    /// before its base. Applied entries are committed, so nothing the protocol relies on is
    /// lost; the replica's own later `Compact`s at or below this base change nothing.
    fn compact_to_applied(
        &mut self,
        shard: u16,
        cursor: &mut Cursor,
        tail: &mut Vec<&Entry>,
    ) -> Result<()> {
        let base = cursor.row.base_pos.index;
        let applied = cursor.row.applied;
        let last = base
            .saturating_add(cursor.len)
            .saturating_add(tail.len() as u64);
        if cursor.row.tombstone.is_some() || applied <= base || applied > last {
            return Ok(());
        }
        let from_rows = (applied - base).min(cursor.len);
        let mut passed_rows = Vec::new();
        if from_rows > 0 {
            for row in self
                .log
                .extract_from_if((shard, base + 1)..=(shard, base + from_rows), |_, _| true)?
            {
                let (key, bytes) = row?;
                let entry: Entry = postcard::from_bytes(bytes.value()).with_context(|| {
                    format!("decoding shard {shard}'s log entry {}", key.value().1)
                })?;
                passed_rows.push(entry);
            }
        }
        let from_tail = usize::try_from(applied - base - from_rows).unwrap_or(usize::MAX);
        let passed: Vec<&Entry> = passed_rows.iter().chain(tail.drain(..from_tail)).collect();
        let Some(last_passed) = passed.last() else {
            return Ok(());
        };
        cursor.row.base_pos = last_passed.pos();
        if let Some(config) = passed.iter().rev().find_map(|entry| match &entry.op {
            Op::Config(config) => Some(config),
            _ => None,
        }) {
            cursor.row.base_config = config.clone();
        }
        cursor.len -= from_rows;
        Ok(())
    }

    /// Applies the write of the entry the log table holds at `index` of `shard`.
    fn apply_logged_entry(&mut self, shard: u16, index: u64) -> Result<()> {
        let entry: Entry = {
            let row = self
                .log
                .get((shard, index))?
                .ok_or_else(|| anyhow!("shard {shard}: applied entry {index} is not in its log"))?;
            postcard::from_bytes(row.value())
                .with_context(|| format!("decoding shard {shard}'s log entry {index}"))?
        };
        if let Some((key, value)) = entry_write(&entry) {
            self.write_kv(shard, key, value)?;
        }
        Ok(())
    }

    /// Sets `key` of `shard` to `value`, or removes it (`None`).
    fn write_kv(&mut self, shard: u16, key: &[u8], value: Option<&[u8]>) -> Result<()> {
        match value {
            Some(value) => {
                self.kv.insert((shard, key), value)?;
            }
            None => {
                self.kv.remove((shard, key))?;
            }
        }
        Ok(())
    }

    /// [`Durable::apply_change`], on disk.
    fn apply(&mut self, shard: u16, cursor: &mut Cursor, change: &Change) -> Result<()> {
        let base = cursor.row.base_pos.index;
        match change {
            Change::Promised(ballot) => cursor.row.promised = Some(ballot.clone()),
            Change::Truncate { from } => {
                let keep = from.saturating_sub(1).saturating_sub(base);
                if keep < cursor.len {
                    self.log
                        .retain_in(log_range(shard, base + keep + 1), |_, _| false)?;
                    cursor.len = keep;
                }
            }
            Change::Append(entries) => self.append(shard, cursor, entries)?,
            Change::Applied { index } => {
                if index
                    .checked_sub(base + 1)
                    .is_none_or(|at| at >= cursor.len)
                {
                    bail!("shard {shard}: applied entry {index} is not in its log");
                }
                self.apply_logged_entry(shard, *index)?;
                cursor.row.applied = *index;
            }
            Change::AppliedWrites { index, writes } => {
                for (key, value) in writes {
                    self.write_kv(shard, key, value.as_deref())?;
                }
                cursor.row.applied = *index;
            }
            Change::Tombstone(tombstone) => {
                // The state stays as the retired copy, until `DropRetired`.
                self.clear_log(shard)?;
                cursor.len = 0;
                cursor.row.tombstone = Some(TombstoneRow {
                    promised: tombstone.promised.clone(),
                    last: tombstone.last.clone(),
                    config: tombstone.config.clone(),
                });
            }
            Change::Compact { base: new_base } if new_base.pos.index <= base => {}
            Change::Compact { base: new_base } => {
                let drop = (new_base.pos.index - base).min(cursor.len);
                if drop > 0 {
                    self.log
                        .retain_in((shard, base + 1)..=(shard, base + drop), |_, _| false)?;
                }
                cursor.len -= drop;
                cursor.row.base_pos = new_base.pos.clone();
                cursor.row.base_config = new_base.config.clone();
            }
            Change::InstallSnapshot { base: new_base, kv } => {
                self.clear_log(shard)?;
                self.clear_kv(shard)?;
                for (key, value) in kv {
                    self.kv.insert((shard, key), value)?;
                }
                cursor.len = 0;
                cursor.row.applied = new_base.pos.index;
                cursor.row.base_pos = new_base.pos.clone();
                cursor.row.base_config = new_base.config.clone();
                cursor.row.tombstone = None;
            }
            Change::DropRetired => self.clear_kv(shard)?,
        }
        Ok(())
    }

    fn append<'e>(
        &mut self,
        shard: u16,
        cursor: &mut Cursor,
        entries: impl IntoIterator<Item = &'e Entry>,
    ) -> Result<()> {
        for entry in entries {
            let at = cursor
                .row
                .base_pos
                .index
                .checked_add(cursor.len + 1)
                .ok_or_else(|| anyhow!("shard {shard}'s log would pass index u64::MAX"))?;
            let bytes = encode(entry)?;
            self.log.insert((shard, at), bytes.as_slice())?;
            cursor.len += 1;
        }
        Ok(())
    }

    fn clear_log(&mut self, shard: u16) -> Result<()> {
        self.log.retain_in(log_range(shard, 0), |_, _| false)?;
        Ok(())
    }

    /// Deletes every kv row of `shard`, [`CLEAR_KV_BATCH`] keys at a time.
    ///
    /// Not `retain_in`: redb's (4.1) copies the leaf and the branch pages above it for every
    /// key it deletes, since it must not change the pages its iterator reads, while `remove`
    /// changes a page already copied in this transaction in place. Clearing 25 shards of 1,000
    /// keys (an old node's retired copies after a join of 1M keys) took 180-207 ms that way
    /// and takes 22-25 ms this way (BENCHMARKS.md, issue 6, session 39).
    fn clear_kv(&mut self, shard: u16) -> Result<()> {
        let mut keys: Vec<Vec<u8>> = Vec::new();
        loop {
            keys.clear();
            for row in self.kv.range(kv_range(shard))?.take(CLEAR_KV_BATCH) {
                keys.push(row?.0.value().1.to_vec());
            }
            if keys.is_empty() {
                return Ok(());
            }
            for key in &keys {
                self.kv.remove((shard, key.as_slice()))?;
            }
        }
    }
}

/// What the meta table says.
struct Meta {
    storage_id: StorageId,
    /// The first write-ahead record not folded yet (0 for a new or version-1 store).
    next_unfolded: u64,
    /// The database was created just now.
    created: bool,
}

/// Creates the meta table of a new database (format version, new storage id), or checks an
/// existing one's format version and reads its storage id and folded position.
/// What applying `entry` writes: its key and new value (`None`: removed), if it is a `Put` or
/// a `Del`.
fn entry_write(entry: &Entry) -> Option<(&[u8], Option<&[u8]>)> {
    match &entry.op {
        Op::Put { key, value } => Some((key, Some(value))),
        Op::Del { key } => Some((key, None)),
        Op::EpochStart | Op::Config(_) => None,
    }
}

fn init_meta(db: &Database) -> Result<Meta> {
    let mut txn = db.begin_write().context("starting a write transaction")?;
    txn.set_durability(Durability::Immediate)
        .context("asking for immediate durability")?;
    let has_meta = txn.list_tables()?.any(|table| table.name() == META.name());
    if !has_meta {
        let others: Vec<String> = txn
            .list_tables()?
            .map(|table| table.name().to_owned())
            .collect();
        if !others.is_empty() {
            bail!(
                "a redb database without a slotring format version (tables: {}): not a shard \
                 store",
                others.join(", ")
            );
        }
    }
    // `changed`: a new store, or one upgraded from an older version.
    let (storage_id, next_unfolded, changed) = {
        let mut meta = txn.open_table(META).context("opening the meta table")?;
        let format = meta.get(FORMAT_KEY)?.map(|bytes| bytes.value().to_vec());
        match format {
            None => {
                let storage_id = StorageId(rand::random());
                meta.insert(FORMAT_KEY, &FORMAT_VERSION.to_le_bytes()[..])?;
                meta.insert(STORAGE_ID_KEY, &storage_id.0.to_le_bytes()[..])?;
                (storage_id, 0, true)
            }
            Some(bytes) => {
                let version = <[u8; 4]>::try_from(bytes.as_slice())
                    .map(u32::from_le_bytes)
                    .map_err(|_| anyhow!("the format version is {} bytes, not 4", bytes.len()))?;
                let upgrade = (FIRST_FORMAT_VERSION..FORMAT_VERSION).contains(&version);
                if version != FORMAT_VERSION && !upgrade {
                    bail!(
                        "unknown shard store format version {version} (this build reads \
                         versions {FIRST_FORMAT_VERSION} to {FORMAT_VERSION})"
                    );
                }
                if upgrade {
                    meta.insert(FORMAT_KEY, &FORMAT_VERSION.to_le_bytes()[..])?;
                }
                let bytes = meta
                    .get(STORAGE_ID_KEY)?
                    .map(|bytes| bytes.value().to_vec())
                    .ok_or_else(|| anyhow!("the meta table has no storage id"))?;
                let id = <[u8; 16]>::try_from(bytes.as_slice())
                    .map(u128::from_le_bytes)
                    .map_err(|_| anyhow!("the storage id is {} bytes, not 16", bytes.len()))?;
                let next_unfolded = match meta.get(NEXT_UNFOLDED_KEY)? {
                    None => 0,
                    Some(bytes) => <[u8; 8]>::try_from(bytes.value())
                        .map(u64::from_le_bytes)
                        .map_err(|_| {
                            anyhow!(
                                "the folded position is {} bytes, not 8",
                                bytes.value().len()
                            )
                        })?,
                };
                (StorageId(id), next_unfolded, upgrade)
            }
        }
    };
    if changed {
        Tables::open(&txn)?;
        txn.commit()
            .context("committing the new store's meta table")?;
    } else {
        txn.abort().context("closing the meta transaction")?;
    }
    Ok(Meta {
        storage_id,
        next_unfolded,
        created: !has_meta,
    })
}

/// Every shard's [`Durable`], checking each log's rows are exactly its positions.
fn load(db: &Database) -> Result<BTreeMap<u16, Durable>> {
    let txn = db.begin_read().context("starting a read transaction")?;
    let shards = txn.open_table(SHARDS).context("opening the shards table")?;
    let log = txn.open_table(LOG).context("opening the log table")?;
    let kv = txn.open_table(KV).context("opening the kv table")?;
    let mut loaded = BTreeMap::new();
    for row in shards.iter()? {
        let (shard, bytes) = row?;
        let shard = shard.value();
        let row = decode_row(shard, bytes.value())?;
        let mut entries = Vec::new();
        for log_row in log.range(log_range(shard, 0))? {
            let (key, bytes) = log_row?;
            let index = key.value().1;
            let expected = row.base_pos.index + entries.len() as u64 + 1;
            if index != expected {
                bail!("shard {shard}'s log has an entry at {index}, expected {expected}");
            }
            let entry: Entry = postcard::from_bytes(bytes.value())
                .with_context(|| format!("decoding shard {shard}'s log entry {index}"))?;
            entries.push(entry);
        }
        // The rows come in key order, so they go straight into the state's image.
        let mut pairs = ImageBuilder::default();
        // A tombstoned replica's rows are its retired copy: on the disk, not in its state.
        if row.tombstone.is_none() {
            for pair in kv.range::<(u16, &[u8])>(kv_range(shard))? {
                let (key, value) = pair?;
                pairs
                    .push(key.value().1, value.value())
                    .map_err(|_| anyhow!("shard {shard}'s key-value rows are out of order"))?;
            }
        }
        let kv = KvState::from_image(pairs.finish());
        loaded.insert(shard, row.into_durable(entries, kv));
    }
    Ok(loaded)
}

fn decode_row(shard: u16, bytes: &[u8]) -> Result<ShardRow> {
    postcard::from_bytes(bytes).with_context(|| format!("decoding shard {shard}'s state"))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(value).context("encoding a record")
}

/// Appends the postcard of `value` to `buffer`.
fn encode_onto<T: Serialize>(value: &T, buffer: &mut Vec<u8>) -> Result<()> {
    *buffer = postcard::to_extend(value, std::mem::take(buffer)).context("encoding a record")?;
    Ok(())
}

/// The log rows of `shard` from index `from` on.
fn log_range(shard: u16, from: u64) -> std::ops::RangeInclusive<(u16, u64)> {
    (shard, from)..=(shard, u64::MAX)
}

/// How many keys [`Tables::clear_kv`] reads before it deletes them: bounds its memory (a key
/// is up to 1 KiB) whatever the size of the shard.
const CLEAR_KV_BATCH: usize = 1024;

/// A bound on `(shard, key)` rows of the kv table.
type KvBound = Bound<(u16, &'static [u8])>;

/// Every kv row of `shard`.
fn kv_range(shard: u16) -> (KvBound, KvBound) {
    let start = Bound::Included((shard, &[][..]));
    let end = match shard.checked_add(1) {
        Some(next) => Bound::Excluded((next, &[][..])),
        None => Bound::Unbounded,
    };
    (start, end)
}

/// A committed batch on its way to the fold thread: sequence number, changes, record bytes.
type Committed = (u64, WalBatch, usize);

/// The most group commits one `fdatasync` of the log thread covers; more wait for the next.
/// The event loop keeps at most [`cluster::replica::MAX_COMMITS_IN_FLIGHT`] outstanding, so
/// this only bounds a flush if that grows.
const MAX_COMMITS_PER_FLUSH: usize = 64;

/// What the log thread is asked to do.
#[derive(Debug)]
enum LogWork {
    /// Append and fsync a group commit.
    Commit(HostPersist),
    /// Hand the committed batches to the fold thread now rather than when the [`FoldPolicy`]
    /// says: a snapshot view needs a later state than the last fold's.
    FoldSoon,
    /// Fold what was committed and end (the [`StoreHandle`] is dropped; a [`FoldRequester`]
    /// may outlive it).
    Stop,
}

/// Asks a [`StoreWorker`]'s log thread for an early fold; held by the [`SnapshotReader`].
#[derive(Debug, Clone)]
pub(crate) struct FoldRequester(mpsc::Sender<LogWork>);

impl FoldRequester {
    /// Asks for a fold of what is committed so far. A stopped worker is not an error here: the
    /// node learns of it through [`StoreHandle::durable`].
    pub(crate) fn fold_soon(&self) {
        let _ = self.0.send(LogWork::FoldSoon);
    }
}

/// The committed batches the log thread collects for the next fold, and when that fold is due
/// by the [`FoldPolicy`]. Handing the fold thread a whole fold at once wakes it once per fold
/// rather than once per commit.
struct PendingFold {
    policy: FoldPolicy,
    batches: Vec<Committed>,
    bytes: usize,
    /// `delay` after the oldest batch here, jittered by ±50% so that nodes started together
    /// do not fold at the same moments; `None` while empty.
    due: Option<std::time::Instant>,
}

impl PendingFold {
    fn new(policy: FoldPolicy) -> Self {
        PendingFold {
            policy,
            batches: Vec::new(),
            bytes: 0,
            due: None,
        }
    }

    /// Adds a batch; true when the fold is due by size.
    fn push(&mut self, committed: Committed) -> bool {
        self.bytes += committed.2;
        self.batches.push(committed);
        let delay = self.policy.delay;
        self.due.get_or_insert_with(|| {
            std::time::Instant::now() + delay.mul_f64(0.5 + rand::random::<f64>())
        });
        self.batches.len() >= self.policy.batches || self.bytes >= self.policy.bytes
    }

    fn take(&mut self) -> Vec<Committed> {
        self.bytes = 0;
        self.due = None;
        std::mem::take(&mut self.batches)
    }
}

/// Group commits slower than [`SlowCommits::THRESHOLD`], logged as a warning at most once a
/// second: followers acknowledge only what is durable, so a leader whose followers' commits
/// take longer than `T_elect` (300 ms) hears no acknowledgement in time and steps down.
#[derive(Debug, Default)]
struct SlowCommits {
    /// Slow commits since the last warning, and the slowest of them with its size.
    count: u64,
    slowest: std::time::Duration,
    slowest_bytes: usize,
    warned: Option<std::time::Instant>,
}

impl SlowCommits {
    const THRESHOLD: std::time::Duration = std::time::Duration::from_millis(100);

    fn note(&mut self, took: std::time::Duration, bytes: usize) {
        if took < Self::THRESHOLD {
            return;
        }
        self.count += 1;
        if took > self.slowest {
            self.slowest = took;
            self.slowest_bytes = bytes;
        }
        if self
            .warned
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1))
        {
            tracing::warn!(
                slow_commits = self.count,
                slowest_ms = u64::try_from(self.slowest.as_millis()).unwrap_or(u64::MAX),
                bytes = self.slowest_bytes,
                "slow group commit (write-ahead log append and fdatasync)"
            );
            *self = SlowCommits {
                warned: Some(std::time::Instant::now()),
                ..SlowCommits::default()
            };
        }
    }
}

/// Runs a [`Store`] on two threads of its own, off the event loop: `slotring-wal` appends and
/// fsyncs each submitted batch, reports it durable, and hands the fold thread each fold's
/// batches once the [`FoldPolicy`] says it is due; `slotring-fold` folds them into the shard
/// tables at the lowest CPU priority and tells the first one which log segments may go.
#[derive(Debug)]
pub(crate) struct StoreWorker;

impl StoreWorker {
    /// Moves `store` to its threads. After a failed commit or fold the failing thread reports
    /// the error and stops, and the handle refuses further work: the node must then abort
    /// (R0), since what reached the disk is unknown.
    pub(crate) fn spawn(store: Store) -> Result<StoreHandle> {
        let Store {
            mut wal,
            mut folder,
        } = store;
        folder.part_pause = FOLD_PART_PAUSE;
        let db = Arc::clone(&folder.db);
        let policy = folder.policy;
        let (submit, batches) = mpsc::channel::<LogWork>();
        let (to_fold, folds) = mpsc::channel::<Vec<Committed>>();
        let (report, durable) = tokio_mpsc::unbounded_channel();
        let folded = Arc::new(std::sync::atomic::AtomicU64::new(folder.next_unfolded));
        let fold_report = report.clone();
        let folded_by_folder = Arc::clone(&folded);
        let folder_thread = std::thread::Builder::new()
            .name("slotring-fold".to_owned())
            .spawn(move || {
                lower_this_threads_priority();
                // One wake-up per fold: the log thread hands over a whole fold's batches.
                while let Ok(fold) = folds.recv() {
                    // A panic (a bug) is reported like a failed fold, so that the node aborts
                    // instead of waiting on a thread that is gone.
                    let folded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        fold.into_iter()
                            .try_for_each(|(seq, batch, bytes)| folder.push(seq, batch, bytes))
                            .and_then(|()| folder.fold())
                    }))
                    .unwrap_or_else(|_| Err(anyhow!("the fold thread panicked")));
                    if let Err(error) = folded {
                        let _ = fold_report.send(Err(error));
                        break;
                    }
                    folded_by_folder
                        .store(folder.next_unfolded, std::sync::atomic::Ordering::Release);
                }
            })
            .context("starting the fold thread")?;
        let wal_thread = std::thread::Builder::new()
            .name("slotring-wal".to_owned())
            .spawn(move || {
                let mut pending = PendingFold::new(policy);
                let mut slow_commits = SlowCommits::default();
                // Work taken off the channel while gathering a group, handled next.
                let mut deferred: Option<LogWork> = None;
                loop {
                    let received = match (deferred.take(), pending.due) {
                        (Some(work), _) => Ok(work),
                        (None, None) => batches
                            .recv()
                            .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                        (None, Some(due)) => batches
                            .recv_timeout(due.saturating_duration_since(std::time::Instant::now())),
                    };
                    let persist = match received {
                        Ok(LogWork::Commit(persist)) => persist,
                        Ok(LogWork::FoldSoon) => {
                            // Nothing waits for a fold but a snapshot view: folding early only
                            // costs a smaller fold.
                            if !pending.batches.is_empty() && to_fold.send(pending.take()).is_err()
                            {
                                break;
                            }
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            if to_fold.send(pending.take()).is_err() {
                                break;
                            }
                            continue;
                        }
                        Ok(LogWork::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                            // Shutting down: what was committed is folded before the fold
                            // thread ends (the handle's drop waits for it).
                            let _ = to_fold.send(pending.take());
                            break;
                        }
                    };
                    // Every group commit queued behind this one (submitted while the last
                    // flush ran) joins its flush: the next flush starts at once, without a
                    // round trip through the event loop.
                    let mut group = vec![persist];
                    while group.len() < MAX_COMMITS_PER_FLUSH {
                        match batches.try_recv() {
                            Ok(LogWork::Commit(persist)) => group.push(persist),
                            Ok(other) => {
                                deferred = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let started = std::time::Instant::now();
                    let committed = match append_group(&mut wal, group) {
                        Ok(committed) => committed,
                        Err(error) => {
                            let _ = report.send(Err(error));
                            break;
                        }
                    };
                    let bytes = committed.iter().map(|(_, (_, _, bytes))| bytes).sum();
                    slow_commits.note(started.elapsed(), bytes);
                    let mut stopped = false;
                    for (batch, committed) in committed {
                        // Durable: the batch's messages may leave while it waits to be folded.
                        if report.send(Ok(batch)).is_err() {
                            stopped = true;
                            break;
                        }
                        if pending.push(committed) && to_fold.send(pending.take()).is_err() {
                            stopped = true;
                            break;
                        }
                    }
                    if stopped {
                        break;
                    }
                    let next_unfolded = folded.load(std::sync::atomic::Ordering::Acquire);
                    if let Err(error) = wal.release(next_unfolded) {
                        let _ = report.send(Err(error));
                        break;
                    }
                }
            })
            .context("starting the write-ahead log thread")?;
        Ok(StoreHandle {
            db,
            submit: Some(submit),
            durable,
            stopped: false,
            threads: vec![wal_thread, folder_thread],
        })
    }
}

/// Runs the calling thread under `SCHED_IDLE`: a fold is a burst of B-tree work that no
/// client waits for, so it takes the CPU the event loops and the log threads leave idle (on
/// two cores running three nodes it otherwise shows in every commit's latency). What waits
/// for folds waits indirectly: a snapshot view that needs a newer fold asks for one early
/// (`FoldRequester`), and the log's segments are released only once folded.
///
/// Why not a nice value (this thread ran at nice 19 until session 46): a nice value only ranks
/// the threads of one scheduling group, and with the kernel's autogroups each session is a
/// group of its own. Nodes started in sessions of their own (`scripts/cluster.sh`, or services
/// sharing a machine with their clients) then met one node's fold at its group's full weight.
/// A `SCHED_IDLE` thread is preempted by any other thread that wakes on its CPU, in any group,
/// and its CPU counts as idle when the kernel places a waking thread. It still gets a small
/// share under full load (a weight of 3, against 15 at nice 19), so folds never stop and the
/// batches waiting in memory stay bounded: under 35 s of ×16 writes at full speed the folds
/// kept up (BENCHMARKS.md, issue 5, session 46).
///
/// On Linux a thread's scheduling policy is its own (pid 0 names the calling thread). A
/// refusal (a sandbox) only costs latency, so it is logged, not fatal.
#[allow(unsafe_code)]
fn lower_this_threads_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` reads the `sched_param` it is given, a valid local, and
    // changes only the calling thread's scheduling; it has no other effect on memory.
    let refused = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0;
    if refused {
        let error = std::io::Error::last_os_error();
        tracing::debug!(%error, "the fold thread keeps its scheduling policy");
    }
}

/// The event loop's side of a [`StoreWorker`]. Dropping it stops the threads after folding
/// what was committed (the drop waits for that).
#[derive(Debug)]
pub(crate) struct StoreHandle {
    db: Arc<Database>,
    submit: Option<mpsc::Sender<LogWork>>,
    durable: tokio_mpsc::UnboundedReceiver<Result<HostBatchId>>,
    /// A commit or fold failed: nothing more is accepted or reported.
    stopped: bool,
    threads: Vec<JoinHandle<()>>,
}

impl StoreHandle {
    /// Queues a batch for commit; never blocks. Fails once the worker has stopped (after a
    /// failed commit or fold, which [`durable`](Self::durable) reports).
    pub(crate) fn submit(&self, persist: HostPersist) -> Result<()> {
        let batch = persist.batch.0;
        self.submit
            .as_ref()
            .filter(|_| !self.stopped)
            .and_then(|submit| submit.send(LogWork::Commit(persist)).ok())
            .ok_or_else(|| anyhow!("the store thread has stopped; batch {batch} was not queued"))
    }

    /// A [`SnapshotReader`] on this store's database: its views see what the folds wrote.
    pub(crate) fn snapshot_reader(&self) -> Result<SnapshotReader> {
        let submit = self
            .submit
            .clone()
            .ok_or_else(|| anyhow!("the store thread has stopped"))?;
        SnapshotReader::spawn(Arc::clone(&self.db), FoldRequester(submit))
    }

    /// The next batch made durable, in submission order; an error if a commit or fold failed
    /// (the node must abort, R0) or the worker stopped.
    pub(crate) async fn durable(&mut self) -> Result<HostBatchId> {
        if self.stopped {
            return Err(anyhow!("the store thread has stopped"));
        }
        match self.durable.recv().await {
            Some(Ok(batch)) => Ok(batch),
            Some(Err(error)) => {
                self.stopped = true;
                Err(error)
            }
            None => {
                self.stopped = true;
                Err(anyhow!("the store thread has stopped"))
            }
        }
    }

    /// The next batch already reported durable, if any, without waiting (the log thread
    /// reports a flush of several commits at once); errors as [`durable`](Self::durable).
    pub(crate) fn try_durable(&mut self) -> Result<Option<HostBatchId>> {
        if self.stopped {
            return Err(anyhow!("the store thread has stopped"));
        }
        match self.durable.try_recv() {
            Ok(Ok(batch)) => Ok(Some(batch)),
            Ok(Err(error)) => {
                self.stopped = true;
                Err(error)
            }
            Err(tokio_mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(tokio_mpsc::error::TryRecvError::Disconnected) => {
                self.stopped = true;
                Err(anyhow!("the store thread has stopped"))
            }
        }
    }
}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        // Stopping the log thread ends the fold thread's queue.
        if let Some(submit) = self.submit.take() {
            let _ = submit.send(LogWork::Stop);
        }
        for thread in self.threads.drain(..) {
            // A panic in a thread was already printed; there is nothing more to report.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests;
mod views;
mod wal;

#[cfg(test)]
use self::views::ShardView;
pub(crate) use self::views::SnapshotReader;
