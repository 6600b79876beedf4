//! The write-ahead log: every group commit, appended to a plain file and made durable with one
//! `fdatasync`, before the fold thread writes it into the shard tables at leisure.
//!
//! The log is a directory (`<data-dir>/shards.wal/`) of segment files named by the sequence
//! number of their first record (`00000000000000000042.wal`). A segment starts with a header,
//! `SLRWAL01` and the store's [`StorageId`] (16 bytes, little endian), so a log never replays
//! into another store (a `shards.redb` deleted without its log is a new member). Then records:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | payload length, little endian |
//! | 8 | sequence number, little endian |
//! | 16 | the first 16 bytes of blake3(sequence number ‖ payload) |
//! | length | payload: the postcard of one group commit |
//!
//! Opening reads every segment in order. A record that is cut short or fails its digest ends
//! the log if it is in the newest segment (a crash mid-append: that commit was never reported
//! durable) and the file is truncated there; anywhere else it is corruption and opening fails.
//! Appends always go to a new segment after an open, and to a new one each 64 MiB. A segment is
//! deleted once every record in it is folded (its successor starts at or below the first
//! unfolded sequence number).
//!
//! What it does not do: share a file between processes (the data dir's lock prevents that),
//! compress, or preallocate.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cluster::replica::StorageId;

const MAGIC: &[u8; 8] = b"SLRWAL01";
const HEADER_BYTES: u64 = 8 + 16;
const RECORD_HEAD_BYTES: usize = 4 + 8 + 16;
/// A segment this long is closed and a new one started.
const SEGMENT_BYTES: u64 = 64 << 20;
/// No record is longer: a longer length field is corruption, not a reason to allocate.
const MAX_RECORD_BYTES: usize = 1 << 30;

/// A record: its sequence number and payload.
pub(crate) type Record = (u64, Vec<u8>);

/// The open log; appends go to the newest segment.
#[derive(Debug)]
pub(crate) struct Wal {
    dir: PathBuf,
    storage: StorageId,
    file: File,
    file_len: u64,
    /// `(first sequence number, path)`, oldest first; the last one is `file`.
    segments: VecDeque<(u64, PathBuf)>,
    next_seq: u64,
}

impl Wal {
    /// Opens (creating if needed) the log in `dir` for the store `storage`, whose shard tables
    /// hold every record before `next_unfolded`. Returns the log and the records from
    /// `next_unfolded` on, in order, as `(sequence number, payload)`.
    pub(crate) fn open(
        dir: &Path,
        storage: StorageId,
        next_unfolded: u64,
    ) -> Result<(Wal, Vec<Record>)> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the write-ahead log {}", dir.display()))?;
        let mut segments = list_segments(dir)?;
        let mut records = Vec::new();
        let mut expected: Option<u64> = None;
        let count = segments.len();
        for (position, (first, path)) in segments.iter().enumerate() {
            let newest = position + 1 == count;
            let read = read_segment(path, storage, newest)
                .with_context(|| format!("reading {}", path.display()))?;
            if let Some((seq, _)) = read.first()
                && *seq != *first
            {
                bail!("{} starts with record {seq}, not {first}", path.display());
            }
            for (seq, payload) in read {
                if expected.is_some_and(|expected| expected != seq) {
                    bail!(
                        "the write-ahead log skips from record {} to {seq} in {}",
                        expected.unwrap_or_default(),
                        path.display()
                    );
                }
                expected = Some(seq + 1);
                if seq >= next_unfolded {
                    records.push((seq, payload));
                }
            }
        }
        if let Some((seq, _)) = records.first()
            && *seq != next_unfolded
        {
            bail!(
                "the write-ahead log in {} lacks records {next_unfolded}..{seq} that were never \
                 folded into the shard tables",
                dir.display()
            );
        }
        let next_seq = expected.unwrap_or(next_unfolded).max(next_unfolded);
        // A segment already named `next_seq` holds no record: it is recreated below.
        segments.retain(|(first, _)| *first != next_seq);
        let (file, path) = create_segment(dir, storage, next_seq)?;
        segments.push_back((next_seq, path));
        let mut wal = Wal {
            dir: dir.to_owned(),
            storage,
            file,
            file_len: HEADER_BYTES,
            segments,
            next_seq,
        };
        wal.release(next_unfolded)?;
        Ok((wal, records))
    }

    /// The sequence number the next [`append`](Self::append) gets.
    #[cfg(test)]
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends `payload` as the next record and makes it durable; returns its sequence number.
    /// After an error the log's tail is unknown: the node must stop (R0).
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<u64> {
        if payload.len() > MAX_RECORD_BYTES {
            bail!(
                "a group commit of {} bytes exceeds the write-ahead log's {MAX_RECORD_BYTES}",
                payload.len()
            );
        }
        if self.file_len >= SEGMENT_BYTES {
            let (file, path) = create_segment(&self.dir, self.storage, self.next_seq)?;
            self.file = file;
            self.file_len = HEADER_BYTES;
            self.segments.push_back((self.next_seq, path));
        }
        let seq = self.next_seq;
        let mut record = Vec::with_capacity(RECORD_HEAD_BYTES + payload.len());
        record.extend_from_slice(
            &u32::try_from(payload.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        record.extend_from_slice(&seq.to_le_bytes());
        record.extend_from_slice(&digest(seq, payload));
        record.extend_from_slice(payload);
        self.file
            .write_all(&record)
            .and_then(|()| self.file.sync_data())
            .with_context(|| {
                format!(
                    "appending record {seq} to the write-ahead log {} (the node must stop)",
                    self.dir.display()
                )
            })?;
        self.file_len += record.len() as u64;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Deletes the segments whose records are all before `next_unfolded` (folded).
    pub(crate) fn release(&mut self, next_unfolded: u64) -> Result<()> {
        while self.segments.len() > 1 && self.segments[1].0 <= next_unfolded {
            if let Some((_, path)) = self.segments.pop_front() {
                std::fs::remove_file(&path)
                    .with_context(|| format!("deleting the folded segment {}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// The first 16 bytes of blake3(seq ‖ payload).
fn digest(seq: u64, payload: &[u8]) -> [u8; 16] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seq.to_le_bytes());
    hasher.update(payload);
    let mut out = [0; 16];
    out.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    out
}

/// The segment files in `dir`, oldest first.
fn list_segments(dir: &Path) -> Result<VecDeque<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        let Some(first) = name.strip_suffix(".wal") else {
            continue;
        };
        let first: u64 = first
            .parse()
            .with_context(|| format!("{}: not a segment name", path.display()))?;
        segments.push((first, path));
    }
    segments.sort();
    Ok(segments.into())
}

/// Creates segment `first` with its header, durably (the file and its directory entry).
fn create_segment(dir: &Path, storage: StorageId, first: u64) -> Result<(File, PathBuf)> {
    let path = dir.join(format!("{first:020}.wal"));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(MAGIC)
        .and_then(|()| file.write_all(&storage.0.to_le_bytes()))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the header of {}", path.display()))?;
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .with_context(|| format!("syncing the directory {}", dir.display()))?;
    Ok((file, path))
}

/// Reads a segment's records. A bad record ends the newest segment (a torn append, cut off
/// here) and is an error in any other.
fn read_segment(path: &Path, storage: StorageId, newest: bool) -> Result<Vec<Record>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let header_ok = bytes.len() >= HEADER_BYTES as usize && &bytes[..8] == MAGIC;
    if !header_ok {
        if newest {
            // Created but its header never reached the disk: nothing in it was durable.
            truncate(path, 0)?;
            return Ok(Vec::new());
        }
        bail!("not a write-ahead log segment (bad header)");
    }
    let owner = u128::from_le_bytes(bytes[8..24].try_into().unwrap_or_default());
    if owner != storage.0 {
        bail!(
            "the segment belongs to store {owner:032x}, not this one ({:032x}): the write-ahead \
             log must be deleted along with shards.redb",
            storage.0
        );
    }
    let mut records = Vec::new();
    let mut at = HEADER_BYTES as usize;
    while at < bytes.len() {
        match parse_record(&bytes[at..]) {
            Some((seq, payload, len)) => {
                records.push((seq, payload.to_vec()));
                at += len;
            }
            None if newest => {
                truncate(path, at as u64)?;
                break;
            }
            None => bail!("a damaged record at byte {at}"),
        }
    }
    Ok(records)
}

/// One whole, intact record at the start of `bytes`: `(seq, payload, bytes used)`.
fn parse_record(bytes: &[u8]) -> Option<(u64, &[u8], usize)> {
    let head = bytes.get(..RECORD_HEAD_BYTES)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    if len > MAX_RECORD_BYTES {
        return None;
    }
    let seq = u64::from_le_bytes(head[4..12].try_into().ok()?);
    let payload = bytes.get(RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + len)?;
    (digest(seq, payload) == head[12..28]).then_some((seq, payload, RECORD_HEAD_BYTES + len))
}

fn truncate(path: &Path, len: u64) -> Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.set_len(len)?;
    file.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "slotring-wal-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    const STORE: StorageId = StorageId(7);

    #[test]
    fn records_come_back_in_order_from_the_first_unfolded() {
        let dir = temp_dir("order");
        let (mut wal, none) = Wal::open(&dir, STORE, 0).unwrap();
        assert!(none.is_empty());
        for i in 0..5u8 {
            assert_eq!(wal.append(&[i; 3]).unwrap(), u64::from(i));
        }
        drop(wal);
        let (wal, records) = Wal::open(&dir, STORE, 2).unwrap();
        assert_eq!(
            records,
            (2..5u8)
                .map(|i| (u64::from(i), vec![i; 3]))
                .collect::<Vec<_>>()
        );
        assert_eq!(wal.next_seq(), 5);
        // The first reopen released nothing (records 2.. live in the first segment); a
        // second reopen at 5 deletes every segment but the new one.
        drop(wal);
        let (wal, records) = Wal::open(&dir, STORE, 5).unwrap();
        assert!(records.is_empty());
        assert_eq!(wal.segments.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_damage_elsewhere_is_refused() {
        let dir = temp_dir("torn");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        wal.append(b"one").unwrap();
        wal.append(b"two").unwrap();
        let path = wal.segments.back().unwrap().1.clone();
        drop(wal);
        // A crash in the middle of the second record's append.
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 2)
            .unwrap();
        let (mut wal, records) = Wal::open(&dir, STORE, 0).unwrap();
        assert_eq!(records, vec![(0, b"one".to_vec())]);
        assert_eq!(wal.append(b"again").unwrap(), 1);
        drop(wal);
        let (wal, records) = Wal::open(&dir, STORE, 0).unwrap();
        assert_eq!(records, vec![(0, b"one".to_vec()), (1, b"again".to_vec())]);
        drop(wal);
        // A flipped byte in an older segment's record is corruption.
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = format!("{:#}", Wal::open(&dir, STORE, 0).unwrap_err());
        assert!(error.contains("damaged record"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn another_stores_log_and_missing_records_are_refused() {
        let dir = temp_dir("foreign");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        wal.append(b"x").unwrap();
        drop(wal);
        let error = format!("{:#}", Wal::open(&dir, StorageId(8), 0).unwrap_err());
        assert!(
            error.contains("must be deleted along with shards.redb"),
            "{error}"
        );
        // Opening with record 0 folded drops the segment that held only it; records that
        // were never folded must be in the log.
        let (mut wal, _) = Wal::open(&dir, STORE, 1).unwrap();
        assert_eq!(list_segments(&dir).unwrap().len(), 1);
        assert_eq!(wal.append(b"z").unwrap(), 1);
        drop(wal);
        let error = format!("{:#}", Wal::open(&dir, STORE, 0).unwrap_err());
        assert!(error.contains("lacks records 0..1"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
