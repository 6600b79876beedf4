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
//! A segment's records run from the one its name gives up to the first record that is cut
//! short, fails its digest, or carries another sequence number. In the newest segment that is
//! the end of the log (a crash mid-append: that commit was never reported durable); anywhere
//! else the next segment must start exactly there, or records are missing and opening fails.
//! Appends always go to a new segment after an open, and to a new one each 32 MiB.
//!
//! Segments are recycled. Once every record in a segment is folded (its successor starts at or
//! below the first unfolded sequence number) the file is renamed `<n>.free` and later reused as
//! a new segment: its header is rewritten and records overwrite the old ones in place. The old
//! records left after the new ones carry smaller sequence numbers, so they end the segment like
//! a torn tail. Overwriting blocks a file already has means an append's `fdatasync` flushes
//! only data, never the file system's journal (a growing file's size must go through it), which
//! here halves its latency. Up to [`SPARE_SEGMENTS`] wait to be reused; more are deleted.
//!
//! A segment is zero-filled ahead of its records, [`ZERO_STEP`] at a time (one write and one
//! `fdatasync` per step), so a record's `fdatasync` never grows the file either: on this
//! machine's ext4 a growing file's `fdatasync` also writes its inode, a second I/O. Zeros read
//! as a torn tail (a record of sequence number 0 whose digest is wrong). A record of
//! [`GROWS_FILE_BYTES`] or more (a group commit of installed snapshots, say) that passes the
//! zero-filled end grows the file itself instead: zero-filling ahead of it would write as many
//! bytes again and add an `fdatasync`, against one inode write in its own `fdatasync`. Its end
//! is then the file's end, which reads as the log's end too.
//!
//! What it does not do: share a file between processes (the data dir's lock prevents that),
//! or compress.

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
const SEGMENT_BYTES: u64 = 32 << 20;
/// How far ahead of its records a segment is zero-filled at a time.
const ZERO_STEP: u64 = 1 << 20;
/// A record at least this long grows the segment itself rather than being zero-filled ahead
/// of: a joining node's group commits of installed copies are 0.3–1 MB each, and zero-filling
/// ahead of them doubled what its log wrote and the `fdatasync`s it waited for.
const GROWS_FILE_BYTES: usize = 256 << 10;
/// How many folded segments wait to be reused; more are deleted.
const SPARE_SEGMENTS: usize = 2;
/// The file name suffix of a folded segment waiting to be reused.
const SPARE_SUFFIX: &str = ".free";
/// No record is longer: a longer length field is corruption, not a reason to allocate.
const MAX_RECORD_BYTES: usize = 1 << 30;
/// The record buffer keeps at most this much capacity between appends: an append larger than
/// that (a bulk install, say) allocates its own, which is given back afterwards.
const KEPT_RECORD_CAPACITY: usize = 8 << 20;

/// A record: its sequence number and payload.
pub(crate) type Record = (u64, Vec<u8>);

/// The open log; appends go to the newest segment.
#[derive(Debug)]
pub(crate) struct Wal {
    dir: PathBuf,
    storage: StorageId,
    file: File,
    /// Where the next record goes in `file`.
    file_len: u64,
    /// How long `file` is: written (records, or zeros ahead of them) up to here.
    file_size: u64,
    /// Oldest first; the last one is `file`.
    segments: Segments,
    /// Folded segments waiting to be reused, at most [`SPARE_SEGMENTS`].
    spares: Vec<PathBuf>,
    next_seq: u64,
    /// The record being appended, kept between appends for its capacity: a fresh buffer of
    /// a group commit's size per append came from new pages each time (the kernel zeroing
    /// transparent huge pages was a third of this thread's CPU under load).
    record: Vec<u8>,
    /// Every record before this sequence number is durable (flushed by [`sync`]); those from
    /// here to `next_seq` were written by [`append_unsynced_with`] and wait for the next one.
    ///
    /// [`sync`]: Wal::sync
    ///
    /// [`append_unsynced_with`]: Wal::append_unsynced_with
    flushed_to: u64,
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
        let (mut segments, spares) = list_segments(dir)?;
        let mut records = Vec::new();
        let mut expected: Option<u64> = None;
        let count = segments.len();
        for (position, (first, path)) in segments.iter().enumerate() {
            let newest = position + 1 == count;
            if let Some(expected) = expected
                && expected != *first
            {
                bail!(
                    "the write-ahead log's records {expected}..{first} are missing or damaged \
                     (before {})",
                    path.display()
                );
            }
            let read = read_segment(path, storage, *first, newest)
                .with_context(|| format!("reading {}", path.display()))?;
            expected = Some(first + read.len() as u64);
            records.extend(read.into_iter().filter(|(seq, _)| *seq >= next_unfolded));
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
        // A segment already named `next_seq` holds no record: it is replaced below.
        segments.retain(|(first, _)| *first != next_seq);
        let mut spares = spares;
        let (file, file_size, path) = start_segment(dir, storage, next_seq, spares.pop())?;
        segments.push_back((next_seq, path));
        let mut wal = Wal {
            dir: dir.to_owned(),
            storage,
            file,
            file_len: HEADER_BYTES,
            file_size,
            segments,
            spares,
            next_seq,
            record: Vec::new(),
            flushed_to: next_seq,
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
    #[cfg(test)]
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<u64> {
        self.append_with(|record| {
            record.extend_from_slice(payload);
            Ok(())
        })
        .map(|(seq, _)| seq)
    }

    /// Appends a record and makes it durable (tests: [`append_unsynced_with`] then
    /// [`sync`]).
    ///
    /// [`append_unsynced_with`]: Self::append_unsynced_with
    /// [`sync`]: Self::sync
    #[cfg(test)]
    pub(crate) fn append_with(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<(u64, usize)> {
        let appended = self.append_unsynced_with(encode)?;
        self.sync()?;
        Ok(appended)
    }

    /// Appends the payload `encode` writes at the end of the buffer it is given (which holds
    /// the record's head; `encode` must only append) as the next record; returns its sequence
    /// number and the payload's length. The buffer is the log's own, reused from one append
    /// to the next. The record is durable only after the next [`sync`](Self::sync), which
    /// covers every record appended since the last one (several group commits, one flush). A
    /// crash before it may keep any prefix of them, but never one after a lost one: reading
    /// stops at the first record that is missing or torn. After an error the log's tail is
    /// unknown: the node must stop (R0).
    pub(crate) fn append_unsynced_with(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<(u64, usize)> {
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        record.resize(RECORD_HEAD_BYTES, 0);
        encode(&mut record)?;
        let written = self.write_record(&mut record);
        if record.capacity() > KEPT_RECORD_CAPACITY {
            record = Vec::new();
        }
        self.record = record;
        written
    }

    /// Makes every record appended so far durable (one `fdatasync`, none if there is
    /// nothing new). After an error the log's tail is unknown: the node must stop (R0).
    pub(crate) fn sync(&mut self) -> Result<()> {
        if self.flushed_to == self.next_seq {
            return Ok(());
        }
        self.file.sync_data().with_context(|| {
            format!(
                "flushing the write-ahead log {} (the node must stop)",
                self.dir.display()
            )
        })?;
        self.flushed_to = self.next_seq;
        Ok(())
    }

    /// Fills in the head of `record` (its payload follows the head) and writes it after the
    /// last record, unsynced.
    fn write_record(&mut self, record: &mut [u8]) -> Result<(u64, usize)> {
        let Some(payload_len) = record.len().checked_sub(RECORD_HEAD_BYTES) else {
            bail!("a write-ahead record lost its head while being encoded");
        };
        if payload_len > MAX_RECORD_BYTES {
            bail!(
                "a group commit of {payload_len} bytes exceeds the write-ahead log's \
                 {MAX_RECORD_BYTES}"
            );
        }
        if self.file_len >= SEGMENT_BYTES {
            // The full segment's unsynced records first: the next sync covers only the new
            // segment's file.
            self.sync()?;
            let spare = self.spares.pop();
            let (file, file_size, path) =
                start_segment(&self.dir, self.storage, self.next_seq, spare)?;
            self.file = file;
            self.file_len = HEADER_BYTES;
            self.file_size = file_size;
            self.segments.push_back((self.next_seq, path));
        }
        let seq = self.next_seq;
        let (head, payload) = record.split_at_mut(RECORD_HEAD_BYTES);
        let len = u32::try_from(payload_len).unwrap_or(u32::MAX);
        head[..4].copy_from_slice(&len.to_le_bytes());
        head[4..12].copy_from_slice(&seq.to_le_bytes());
        head[12..].copy_from_slice(&digest(seq, payload));
        let end = self.file_len + record.len() as u64;
        if end > self.file_size && record.len() < GROWS_FILE_BYTES {
            self.zero_fill_to(end)?;
        }
        self.file.write_all(record).with_context(|| {
            format!(
                "appending record {seq} to the write-ahead log {} (the node must stop)",
                self.dir.display()
            )
        })?;
        self.file_len = end;
        self.file_size = self.file_size.max(end);
        self.next_seq += 1;
        Ok((seq, payload_len))
    }

    /// Zero-fills the current segment from its end to at least `end`, in [`ZERO_STEP`]s, and
    /// makes that durable (size and blocks), so appends up to there only overwrite.
    fn zero_fill_to(&mut self, end: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let to = end.div_ceil(ZERO_STEP) * ZERO_STEP;
        let zeros = vec![0u8; usize::try_from(to - self.file_size).unwrap_or(usize::MAX)];
        self.file
            .write_all_at(&zeros, self.file_size)
            .and_then(|()| self.file.sync_data())
            .with_context(|| {
                format!(
                    "zero-filling the write-ahead log {} ahead (the node must stop)",
                    self.dir.display()
                )
            })?;
        self.file_size = to;
        Ok(())
    }

    /// Keeps for reuse, or deletes, the segments whose records are all before
    /// `next_unfolded` (folded).
    pub(crate) fn release(&mut self, next_unfolded: u64) -> Result<()> {
        while self.segments.len() > 1 && self.segments[1].0 <= next_unfolded {
            let Some((first, path)) = self.segments.pop_front() else {
                break;
            };
            if self.spares.len() < SPARE_SEGMENTS {
                let spare = self.dir.join(format!("{first:020}{SPARE_SUFFIX}"));
                std::fs::rename(&path, &spare).with_context(|| {
                    format!("keeping the folded segment {} for reuse", path.display())
                })?;
                self.spares.push(spare);
            } else {
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

/// `(first sequence number, path)` of each segment, oldest first.
type Segments = VecDeque<(u64, PathBuf)>;

/// The segment files in `dir`, oldest first, and the folded ones kept for reuse.
fn list_segments(dir: &Path) -> Result<(Segments, Vec<PathBuf>)> {
    let mut segments = Vec::new();
    let mut spares = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        if name.ends_with(SPARE_SUFFIX) {
            if spares.len() < SPARE_SEGMENTS {
                spares.push(path);
            } else {
                std::fs::remove_file(&path)
                    .with_context(|| format!("deleting the spare segment {}", path.display()))?;
            }
            continue;
        }
        let Some(first) = name.strip_suffix(".wal") else {
            continue;
        };
        let first: u64 = first
            .parse()
            .with_context(|| format!("{}: not a segment name", path.display()))?;
        segments.push((first, path));
    }
    segments.sort();
    Ok((segments.into(), spares))
}

/// Starts segment `first`: reuses `spare` (a folded segment) if given, else creates a file;
/// writes the header and makes it durable, the directory entry too. Appends then go right after
/// the header. Returns the file, its size and its path.
fn start_segment(
    dir: &Path,
    storage: StorageId,
    first: u64,
    spare: Option<PathBuf>,
) -> Result<(File, u64, PathBuf)> {
    let path = dir.join(format!("{first:020}.wal"));
    let mut file = match spare {
        Some(spare) => {
            std::fs::rename(&spare, &path)
                .with_context(|| format!("reusing {} as {}", spare.display(), path.display()))?;
            OpenOptions::new()
                .write(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?
        }
        None => OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?,
    };
    file.write_all(MAGIC)
        .and_then(|()| file.write_all(&storage.0.to_le_bytes()))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the header of {}", path.display()))?;
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .with_context(|| format!("syncing the directory {}", dir.display()))?;
    let size = file
        .metadata()
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    Ok((file, size, path))
}

/// Reads segment `first`'s records: from `first` on, up to the first record that is cut
/// short, damaged, or carries another sequence number (the end of what was appended, or a
/// reused segment's old records). A header that never reached the disk is an empty segment if
/// it is the newest and an error otherwise.
fn read_segment(path: &Path, storage: StorageId, first: u64, newest: bool) -> Result<Vec<Record>> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let header_ok = bytes.len() >= HEADER_BYTES as usize && &bytes[..8] == MAGIC;
    if !header_ok {
        if newest {
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
    let mut expected = first;
    while let Some((seq, payload, len)) = parse_record(&bytes[at..]) {
        if seq != expected {
            break;
        }
        records.push((seq, payload.to_vec()));
        expected += 1;
        at += len;
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
    fn the_record_buffer_is_reused_and_a_large_one_given_back() {
        let dir = temp_dir("buffer");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        let large = vec![7u8; KEPT_RECORD_CAPACITY + 1];
        let payloads: [&[u8]; 4] = [b"one", &large, b"three", b""];
        for (seq, payload) in (0..).zip(payloads) {
            let appended = wal.append_with(|record| {
                // The buffer holds just the head: nothing of the previous record.
                assert_eq!(record.len(), RECORD_HEAD_BYTES);
                record.extend_from_slice(payload);
                Ok(())
            });
            assert_eq!(appended.unwrap(), (seq, payload.len()));
            assert!(wal.record.capacity() <= KEPT_RECORD_CAPACITY);
        }
        // A failed encoding appends nothing.
        let failed = wal.append_with(|record| {
            record.extend_from_slice(b"half");
            bail!("cannot encode")
        });
        assert!(failed.is_err());
        assert_eq!(wal.next_seq(), 4);
        drop(wal);
        let (_, records) = Wal::open(&dir, STORE, 0).unwrap();
        let expected: Vec<Record> = (0..).zip(payloads.map(<[u8]>::to_vec)).collect();
        assert_eq!(records, expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_tail_ends_the_log_and_damage_elsewhere_is_refused() {
        let dir = temp_dir("torn");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        wal.append(b"one").unwrap();
        wal.append(b"two").unwrap();
        let path = wal.segments.back().unwrap().1.clone();
        let len = wal.file_len;
        drop(wal);
        // A crash in the middle of the second record's append (zeros follow).
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
        // A flipped byte in an older segment's record is corruption: the next segment does
        // not start where that one's records now end.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES as usize + RECORD_HEAD_BYTES] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = format!("{:#}", Wal::open(&dir, STORE, 0).unwrap_err());
        assert!(
            error.contains("records 0..1 are missing or damaged"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn segments_are_zero_filled_ahead_so_appends_never_grow_them() {
        let dir = temp_dir("zeros");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        let path = wal.segments.back().unwrap().1.clone();
        wal.append(b"one").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), ZERO_STEP);
        // A record shorter than GROWS_FILE_BYTES across the zero-filled end extends the fill
        // by whole steps.
        let long = vec![9u8; GROWS_FILE_BYTES - RECORD_HEAD_BYTES - 1];
        let mut records = 1;
        while std::fs::metadata(&path).unwrap().len() == ZERO_STEP {
            wal.append(&long).unwrap();
            records += 1;
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * ZERO_STEP);
        wal.append(b"last").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * ZERO_STEP);
        drop(wal);
        // The zeros after the records read as the log's end.
        let (mut wal, read) = Wal::open(&dir, STORE, 0).unwrap();
        assert_eq!(read.len(), records + 1);
        assert_eq!(read[0], (0, b"one".to_vec()));
        assert!(read[1..records].iter().all(|(_, payload)| *payload == long));
        assert_eq!(read[records], (records as u64, b"last".to_vec()));
        assert_eq!(wal.append(b"after").unwrap(), records as u64 + 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_long_record_grows_the_segment_itself_and_its_end_reads_as_the_logs() {
        let dir = temp_dir("grows");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        let path = wal.segments.back().unwrap().1.clone();
        wal.append(b"one").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), ZERO_STEP);
        // Longer than what is left of the zero-filled step: no zeros ahead of it, the file
        // ends where it does.
        let long = vec![9u8; ZERO_STEP as usize];
        wal.append(&long).unwrap();
        let grown = HEADER_BYTES + (RECORD_HEAD_BYTES * 2 + 3) as u64 + ZERO_STEP;
        assert_eq!(std::fs::metadata(&path).unwrap().len(), grown);
        // A short record after it is zero-filled ahead of again, from the file's end.
        wal.append(b"three").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * ZERO_STEP);
        drop(wal);
        let (mut wal, records) = Wal::open(&dir, STORE, 0).unwrap();
        assert_eq!(
            records,
            vec![
                (0, b"one".to_vec()),
                (1, long.clone()),
                (2, b"three".to_vec())
            ]
        );
        assert_eq!(wal.append(b"four").unwrap(), 3);
        drop(wal);
        // A log whose last record ends at the file's end (a crash before anything followed it)
        // reads to there.
        let dir2 = temp_dir("grows-end");
        let (mut wal, _) = Wal::open(&dir2, STORE, 0).unwrap();
        let path = wal.segments.back().unwrap().1.clone();
        wal.append(&long).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            HEADER_BYTES + (RECORD_HEAD_BYTES as u64) + ZERO_STEP
        );
        drop(wal);
        let (_, records) = Wal::open(&dir2, STORE, 0).unwrap();
        assert_eq!(records, vec![(0, long)]);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&dir2);
    }

    #[test]
    fn records_appended_unsynced_are_flushed_together_even_across_segments() {
        let dir = temp_dir("group");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        let push = |wal: &mut Wal, payload: &[u8]| {
            wal.append_unsynced_with(|record| {
                record.extend_from_slice(payload);
                Ok(())
            })
            .unwrap()
        };
        wal.sync().unwrap(); // Nothing to flush.
        assert_eq!(push(&mut wal, b"one"), (0, 3));
        assert_eq!(push(&mut wal, b"two"), (1, 3));
        assert_eq!(wal.flushed_to, 0, "appended, not flushed");
        wal.sync().unwrap();
        assert_eq!(wal.flushed_to, 2);
        // A group that fills the segment: the full one is flushed before the next starts
        // (the group's last flush covers only the new segment's file).
        let big = vec![9u8; (SEGMENT_BYTES / 2) as usize];
        push(&mut wal, &big);
        push(&mut wal, &big);
        assert_eq!(wal.segments.len(), 1);
        assert_eq!(wal.flushed_to, 2);
        push(&mut wal, b"three");
        assert_eq!(wal.segments.len(), 2);
        assert_eq!(
            wal.flushed_to, 4,
            "the full segment was flushed before the switch"
        );
        wal.sync().unwrap();
        assert_eq!(wal.flushed_to, 5);
        drop(wal);
        let (_, records) = Wal::open(&dir, STORE, 0).unwrap();
        let seqs: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
        assert_eq!(records[4].1, b"three".to_vec());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn folded_segments_are_reused_and_their_old_records_never_come_back() {
        let dir = temp_dir("reuse");
        let (mut wal, _) = Wal::open(&dir, STORE, 0).unwrap();
        // Long records fill a segment in a few appends.
        let big = vec![7u8; (SEGMENT_BYTES / 3) as usize];
        for _ in 0..4 {
            wal.append(&big).unwrap();
        }
        assert_eq!(wal.segments.len(), 2);
        let first_segment = wal.segments[0].1.clone();
        wal.release(3).unwrap();
        assert_eq!(wal.spares.len(), 1, "the folded segment is kept");
        assert!(!first_segment.exists());
        // Filling the second segment starts the third in the spare, over its old records.
        for _ in 0..3 {
            wal.append(&big).unwrap();
        }
        assert!(wal.spares.is_empty());
        assert_eq!(wal.segments.len(), 2);
        let reused = wal.segments.back().unwrap().clone();
        assert_eq!(reused.0, 6);
        assert!(std::fs::metadata(&reused.1).unwrap().len() > SEGMENT_BYTES / 2);
        wal.append(b"short").unwrap();
        drop(wal);
        let reused_bytes = std::fs::read(&reused.1).unwrap();
        // The reused file still holds old records 1 and 2 after the new ones: they end it.
        let (wal, records) = Wal::open(&dir, STORE, 3).unwrap();
        let seqs: Vec<u64> = records.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, vec![3, 4, 5, 6, 7]);
        assert_eq!(records.last().unwrap().1, b"short".to_vec());
        assert_eq!(wal.next_seq(), 8);
        drop(wal);
        // A crash right after a spare became segment 8, before anything was appended to it:
        // it holds only old records (6 and 7 here), which are not its own.
        let (wal, _) = Wal::open(&dir, STORE, 8).unwrap();
        let newest = wal.segments.back().unwrap().clone();
        assert_eq!(newest.0, 8);
        drop(wal);
        std::fs::write(&newest.1, &reused_bytes).unwrap();
        let (mut wal, records) = Wal::open(&dir, STORE, 8).unwrap();
        assert!(records.is_empty());
        assert_eq!(wal.append(b"new").unwrap(), 8);
        drop(wal);
        let (_, records) = Wal::open(&dir, STORE, 8).unwrap();
        assert_eq!(records, vec![(8, b"new".to_vec())]);
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
        assert_eq!(list_segments(&dir).unwrap().0.len(), 1);
        assert_eq!(wal.append(b"z").unwrap(), 1);
        drop(wal);
        let error = format!("{:#}", Wal::open(&dir, STORE, 0).unwrap_err());
        assert!(error.contains("lacks records 0..1"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
