//! [`ShardReplica`]: one replica of one shard running the replication protocol of
//! `docs/protocol.md` (ballots, ranked candidates, log adoption, commit, ReadIndex,
//! check-quorum), sans-IO.
//!
//! Logs are compacted after applying (`ReplicaConfig::compact_after`), and a replica that needs
//! compacted entries receives a snapshot (R6): a view of the leader's durable state that its
//! shell reads off the disk (`snapshot.rs`), streamed in digest-checked chunks and installed in
//! one change.
//!
//! Reads use ReadIndex, or R9's leases where `ReplicaConfig::lease_reads` says so.
//!
//! A learner that tails the log without catching up makes its leader pause new writes now and
//! then, briefly (R6's "r ≤ w", `ReplicaConfig::catchup_patience`), and after `t_catchup` its
//! leader stops keeping the log for it.
//!
//! What it does not do (yet): `(client, req)` deduplication.

mod bytes;
mod host;
mod image;
mod shard_map;
mod snapshot;
mod state;
mod types;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use core::time::Duration;

use topology::NodeId;

pub use self::host::{
    FRAME_BUDGET, HostBatchId, HostPersist, MAX_COMMITS_IN_FLIGHT, MoveChange, PeerBatch, ShardHost,
};
pub use self::image::{ImageBuilder, ImagePairs, OutOfOrder, StateImage};
pub use self::snapshot::{MemoryViews, Pairs, SnapshotRead, SnapshotReadReply, ViewId};
pub use self::state::{KvState, Pairs as KvPairs, StateDigest};
pub use self::types::{
    Ballot, COUNTER_LIMIT, ClientOp, ClientReply, ClientRoute, Config, Entry, Member, Message,
    NackReason, Op, PairHasher, Pos, PreVerdict, RejectReason, RequestTag, StorageId,
    VerifyOutcome, copy_checksums, snapshot_digest,
};

/// The first multiple of `grid` at or after `at` (`at` itself for a zero grid).
fn align_up(at: Duration, grid: Duration) -> Duration {
    let grid_nanos = grid.as_nanos();
    if grid_nanos == 0 {
        return at;
    }
    let steps = at.as_nanos().div_ceil(grid_nanos);
    u64::try_from(steps * grid_nanos).map_or(at, Duration::from_nanos)
}

/// The answer to an undecided write (attempt `tag`, appended under ballot `b`) once `entry`
/// committed at its index. Committed entries are unique per index: ours (`Ok`), or ours can
/// never commit (`Superseded`, not `Moved`: its entry was appended, and a refused attempt is
/// one that never was; the model checks both "refused attempts never appended" and
/// "superseded attempts never applied").
fn decided_reply(entry: &Entry, tag: RequestTag, b: &Ballot) -> ClientReply {
    if entry.tag == Some(tag) && &entry.ballot == b {
        ClientReply::Ok { value: None }
    } else {
        ClientReply::Superseded
    }
}

/// Timing and size knobs of a replica. Durations are on the caller's clock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReplicaConfig {
    /// How long without leader contact before the first-ranked voter stands, and the
    /// stickiness and check-quorum window. At least two heartbeats. Default 300 ms.
    pub t_elect: Duration,
    /// The extra wait per rank, so the next replica stands first. Default 150 ms.
    pub t_step: Duration,
    /// The random extra wait, `U(0, jitter)`, that breaks duels. Default 100 ms.
    pub jitter: Duration,
    /// How often the leader sends a heartbeat round. Default 100 ms.
    pub heartbeat: Duration,
    /// A leader whose oldest unpersisted batch is older than this steps down (a stuck disk).
    /// Default 2 s.
    pub t_disk: Duration,
    /// The most entries a promise carries for adoption. Default 1024.
    pub max_adopt: usize,
    /// The most entries in one `Append`. Default 256.
    pub max_append: usize,
    /// Compact the log once this many applied entries sit after its base (R6): the base moves
    /// up to the applied index, less the last quarter of this many entries (the disk, where
    /// snapshots are read, may lag the applied index by a fold). A leader keeps the entries
    /// that followers heard from within `t_elect` still need, unless its log holds more than
    /// `4 × compact_after` entries. At least 1. Default 200: the log is kept in memory, every
    /// shard's, and with 10,000 a node of 1,024 shards holding 100-byte values grew by ~300
    /// bytes per write it saw, towards ~2.5 GB (BENCHMARKS.md, issue 5, session 18). With
    /// 1,000, ×16 writes took 50–55 µs of node CPU each against 48–49 µs with 200, and a node
    /// held 290–320 MB against 190–210 MB (session 40): fresh log memory is page faults, and a
    /// larger log is more cache misses. 200 still lets a follower that was down for 20 s at 10
    /// writes a second per shard catch up by `Append`s; one down longer gets a snapshot, about
    /// 110 KB a shard at 1,000,000 keys of 100 bytes.
    pub compact_after: u64,
    /// The target size of a snapshot chunk in key and value bytes (a single larger pair
    /// travels alone). Up to `SNAPSHOT_WINDOW` (2) chunks per replica are in flight, and
    /// frames are at most 4 MiB, so keep it at or under 1 MiB. Default 1 MiB.
    pub snapshot_chunk_bytes: usize,
    /// The fewest voters a leader keeps while the target names fewer members (the replication
    /// factor): a voter that is down is not removed until a replacement has been added, so a
    /// short outage never moves data. Default 3.
    pub min_voters: usize,
    /// How often an idle leader heartbeats (R11's rounds slow down when nothing happens: no
    /// write or read for this long, every member caught up). Followers of an idle leader wait
    /// `t_elect` more than this before standing, unless SWIM holds the leader down, in which
    /// case they stand at once (ranked). At least `heartbeat`. Default 1 s.
    pub idle_heartbeat: Duration,
    /// The most shards one node's leaders move at once (`ShardHost`): a target that changes a
    /// leader's voters is handed over only while fewer shards it leads are moving, the others
    /// wait in shard order, so a join or a leave never floods the disks and the network that
    /// foreground traffic needs. At least 1. Default 4: on 2 cores running 4 nodes, a join
    /// of 757k keys took 11.3 s, 7.6 s and 5.5 s with 2, 4 and 8, while a 2,000 writes/s
    /// foreground p99 went from 6–12 ms idle to 35–38 ms, 55–58 ms and 113–133 ms
    /// (BENCHMARKS.md, issue 6, session 16).
    pub max_moves: usize,
    /// The most snapshot bytes (keys and values) one node's leaders read for their moves per
    /// second, all moves together (`ShardHost`); 0 is no limit. A chunk is read only while
    /// the node's budget is positive, and its size is then charged, so the rate holds over
    /// any second with a burst of at most a quarter second's worth (or one chunk). Catching
    /// up by `Append`s is not counted. Default 0. On 2 cores running 4 nodes, a join of 757k
    /// keys with `max_moves` 8 took 12.8 s, 13.1 s and 15.6 s unlimited, at 4 MiB/s and at
    /// 2 MiB/s per node, while a 2,000 writes/s foreground p99 was 223, 158 and 80 ms
    /// (BENCHMARKS.md, issue 6).
    pub move_bytes_per_sec: u64,
    /// R9's opt-in leases (`--danger-lease-reads`): a leader answers a read from its own state,
    /// without a heartbeat round, while a majority acknowledged one of its rounds less than
    /// `t_elect·(1−ρ)` ago (ρ = 1%, the clock drift allowed), and followers promise no other
    /// ballot for `t_elect` after each acknowledgement and after a restart. Linearizable only
    /// while clocks advance at rates within ρ of each other and the shell's clock keeps counting
    /// through a suspend (the node feeds `CLOCK_BOOTTIME`); a GET costs no network round then.
    /// Failover after SWIM's verdict waits for the dead leader's lease too. Default off.
    pub lease_reads: bool,
    /// How long a restarted replica that had promised a ballot promises no other, to a
    /// candidate or to itself (handoffs of the promised ballot excepted): before the restart it
    /// may have acknowledged a round that gave its leader a lease (R9), and it no longer knows
    /// when. With `lease_reads` it is at least `t_elect`. The node sets `t_elect` with or
    /// without leases, so a node restarted with leases turned off still keeps the promise it
    /// may have made. Default zero.
    pub restart_silence: Duration,
    /// Verify each member a leader promotes from learner to voter (a moved copy): compare
    /// [`copy_checksums`] of its state with the leader's at one applied index, and remove a
    /// copy that differs (placement adds it again as a learner, which starts over from a
    /// snapshot). Default on.
    pub verify_copies: bool,
    /// How long the key-value state of a removed (tombstoned) replica stays on the disk, as a
    /// retired copy no one reads, before [`Change::DropRetired`] deletes it (counted from the
    /// removal, or from a restart). Zero: in the same batch as the tombstone. Default 1 hour.
    pub retired_grace: Duration,
    /// How long a replica that is no voter (a learner) waits without hearing a leader before
    /// it sends [`Message::Probe`] to its config's voters, and again after each probe: a
    /// learner removed while it was away, by a leader that lost its leadership before it
    /// could say so, would otherwise keep its copy for good (it never stands, so no later
    /// leader hears of it). Zero: never. Default 5 s.
    pub learner_probe: Duration,
    /// A periodic heartbeat round (no read waiting for it, leases off) skips the followers
    /// that were sent an `Append` less than this long before: that message already kept them
    /// from standing, and their acknowledgements of it already feed check-quorum. A follower
    /// skipped hears the round's number with its next `Append`. Under load most shards send
    /// entries between two rounds, and the rounds were nearly half the messages between
    /// nodes. At most half a heartbeat, so a follower hears its leader at least every
    /// 1.5 heartbeats plus a grid step (a quarter heartbeat), within `t_elect`. Zero: every
    /// round goes to every follower. Default 50 ms.
    pub heartbeat_skip_recent: Duration,
    /// R3's pre-vote: a voter whose election timer fires first asks its config's voters
    /// whether they would promise the ballot it would open ([`Message::PreVote`]), and stands
    /// only once a majority would (itself included), or once one answers that its config is
    /// stale. A follower that merely missed heartbeats then finds the others still hearing
    /// the leader, and neither raises its own promise nor deposes that leader. Handoffs
    /// (`TimeoutNow`) stand at once. Default on.
    pub pre_vote: bool,
    /// R6's "r ≤ w": a live learner that has tailed the log (no snapshot in flight) this long
    /// without catching up makes its leader hold new writes, unappended, until the learner is
    /// promoted (or removed) or `catchup_pause` has passed. A shard pauses at most once per
    /// `catchup_pause` plus this, however many learners lag. Under a
    /// write rate the learner cannot match, its lag never reaches zero (a learner is promoted
    /// only once it holds everything committed), and the move would never end. Zero: never
    /// pause. Default 1 s.
    pub catchup_patience: Duration,
    /// The longest such pause of a shard's writes; its end is noticed at the next heartbeat
    /// round, so a pause lasts at most this plus a heartbeat. Writes held when the leader
    /// steps down are answered `Moved` (they were never appended). A learner whose round trip
    /// and fsync take longer than this is not rescued by a pause; `t_catchup` bounds what it
    /// costs. Default 100 ms: a caught-up learner needs a round trip and an fsync.
    pub catchup_pause: Duration,
    /// R6's `T_catchup`: after tailing this long without catching up, a learner no longer
    /// holds back the leader's compaction and no longer pauses writes. Once its log is
    /// compacted past it, it receives a snapshot again and starts over; one that lags too
    /// little for that is tried again after another `t_catchup`. (A log past
    /// `4 × compact_after` entries is compacted sooner anyway.) Default 30 s.
    pub t_catchup: Duration,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            t_elect: Duration::from_millis(300),
            t_step: Duration::from_millis(150),
            jitter: Duration::from_millis(100),
            heartbeat: Duration::from_millis(100),
            t_disk: Duration::from_secs(2),
            max_adopt: 1024,
            max_append: 256,
            compact_after: 200,
            snapshot_chunk_bytes: 1 << 20,
            min_voters: 3,
            idle_heartbeat: Duration::from_secs(1),
            max_moves: 4,
            move_bytes_per_sec: 0,
            lease_reads: false,
            restart_silence: Duration::ZERO,
            verify_copies: true,
            retired_grace: Duration::from_secs(3600),
            learner_probe: Duration::from_secs(5),
            heartbeat_skip_recent: Duration::from_millis(50),
            pre_vote: true,
            catchup_patience: Duration::from_secs(1),
            catchup_pause: Duration::from_millis(100),
            t_catchup: Duration::from_secs(30),
        }
    }
}

/// What a replica keeps on disk (R0). Changes reach the disk as [`Persist`] batches; this is
/// the state those batches build, kept in memory as well.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Durable {
    /// The highest ballot promised.
    pub promised: Option<Ballot>,
    /// The position and config the log starts after.
    pub base: Base,
    /// Entries `base.pos.index + 1 ..`.
    pub log: Vec<Entry>,
    /// The key-value state at `applied`.
    pub kv: KvState,
    /// The last applied index.
    pub applied: u64,
    /// Set once this replica was removed from the shard (R8): it never stands or promises
    /// again, and its log and state are gone.
    pub tombstone: Option<Tombstone>,
}

/// What a removed replica keeps (R8).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Tombstone {
    /// Its promise when removed.
    pub promised: Option<Ballot>,
    /// Its last position when removed.
    pub last: Pos,
    /// The config that removed it.
    pub config: Config,
}

/// Where a log starts: a position and the config in force there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Base {
    /// The position.
    pub pos: Pos,
    /// The config at `pos`.
    pub config: Config,
}

impl Durable {
    /// A new shard's state on one of its first voters: empty, with `config`.
    pub fn bootstrap(config: Config) -> Self {
        Durable {
            promised: None,
            base: Base {
                pos: Pos::ORIGIN,
                config,
            },
            log: Vec::new(),
            kv: KvState::new(),
            applied: 0,
            tombstone: None,
        }
    }

    /// A learner's state before its first `Append`: empty, in no config. Only a leader's
    /// messages create one (the host decides).
    pub fn empty() -> Self {
        Durable::bootstrap(Config::default())
    }

    /// The position of the last entry (or the base).
    pub fn last(&self) -> Pos {
        self.log
            .last()
            .map_or_else(|| self.base.pos.clone(), Entry::pos)
    }

    /// The entry at `index`, if the log holds it.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let first = self.base.pos.index + 1;
        if index < first {
            return None;
        }
        self.log.get(usize::try_from(index - first).ok()?)
    }

    /// Applies the write of entry `index` to the state (a `Put` or a `Del`; other ops write
    /// nothing), leaving `applied` alone (see [`KvState::insert`] for what an overwrite
    /// keeps). Returns false, changing
    /// nothing, when the log does not hold the entry.
    pub fn apply_entry(&mut self, index: u64) -> bool {
        let first = self.base.pos.index + 1;
        let Some(entry) = index
            .checked_sub(first)
            .and_then(|at| usize::try_from(at).ok())
            .and_then(|at| self.log.get(at))
        else {
            return false;
        };
        match &entry.op {
            Op::Put { key, value } => self.kv.insert(key, value),
            Op::Del { key } => {
                self.kv.remove(key);
            }
            Op::EpochStart | Op::Config(_) => {}
        }
        true
    }

    /// The position at `index`: the base's, or an entry's.
    pub fn pos_at(&self, index: u64) -> Option<Pos> {
        if index == self.base.pos.index {
            return Some(self.base.pos.clone());
        }
        self.entry(index).map(Entry::pos)
    }

    /// The last `Config` in the log, committed or not, else the base's (R2 `active`).
    pub fn active_config(&self) -> &Config {
        self.config_at(self.last().index)
    }

    /// How an in-memory disk image applies one change of a [`Persist`] batch; the redb store
    /// does the same, a whole batch in one transaction.
    pub fn apply_change(&mut self, change: &Change) {
        match change {
            Change::Promised(b) => self.promised = Some(b.clone()),
            Change::Truncate { from } => {
                let keep = from.saturating_sub(1).saturating_sub(self.base.pos.index);
                self.log
                    .truncate(usize::try_from(keep).unwrap_or(usize::MAX));
            }
            Change::Append(entries) => self.log.extend(entries.iter().cloned()),
            Change::Applied { index } => {
                self.apply_entry(*index);
                self.applied = *index;
            }
            Change::AppliedWrites { index, writes } => {
                for (key, value) in writes {
                    match value {
                        Some(value) => self.kv.insert(key, value),
                        None => self.kv.remove(key),
                    };
                }
                self.applied = *index;
            }
            Change::Tombstone(tombstone) => {
                self.log.clear();
                self.kv.clear();
                self.tombstone = Some(tombstone.clone());
            }
            // Only the disk still held it.
            Change::DropRetired => {}
            Change::Compact { base } if base.pos.index <= self.base.pos.index => {
                // Compacted this far already (a store may compact further than the replica
                // asked, see `Change::Compact`): nothing to drop, and the base stays.
            }
            Change::Compact { base } => {
                let drop = base.pos.index - self.base.pos.index;
                let drop = usize::try_from(drop)
                    .unwrap_or(usize::MAX)
                    .min(self.log.len());
                self.log.drain(..drop);
                self.base = base.clone();
            }
            Change::InstallSnapshot { base, kv } => {
                self.log.clear();
                self.kv = KvState::from_image(kv.clone());
                self.applied = base.pos.index;
                self.base = base.clone();
                self.tombstone = None;
            }
        }
    }

    /// The config in force at `index` (the last `Config` entry at or before it, else the
    /// base's), for `index` at or after the base.
    pub fn config_at(&self, index: u64) -> &Config {
        let upto = usize::try_from(index.saturating_sub(self.base.pos.index))
            .unwrap_or(usize::MAX)
            .min(self.log.len());
        self.log[..upto]
            .iter()
            .rev()
            .find_map(|entry| match &entry.op {
                Op::Config(config) => Some(config),
                _ => None,
            })
            .unwrap_or(&self.base.config)
    }

    /// The entries after `index`.
    pub fn entries_after(&self, index: u64) -> &[Entry] {
        let first = self.base.pos.index + 1;
        let skip = usize::try_from(index.saturating_add(1).saturating_sub(first))
            .unwrap_or(usize::MAX)
            .min(self.log.len());
        &self.log[skip..]
    }
}

/// One change to durable state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Change {
    /// `promised := ballot`.
    Promised(Ballot),
    /// Remove the entries from `from` on.
    Truncate {
        /// The first index removed.
        from: u64,
    },
    /// Append entries.
    Append(Vec<Entry>),
    /// Replace the shard's log with a tombstone; its key-value state stays on the disk as a
    /// retired copy (gone from the replica's state all the same) until `DropRetired`.
    Tombstone(Tombstone),
    /// Entry `index` applied, as written by builds before store format 3 (which carried each
    /// applied write a second time, beside its entry): these keys now hold these values
    /// (`None`: removed), and `applied := index`. Still read from old write-ahead logs; never
    /// made any more (see [`Change::Applied`]).
    AppliedWrites {
        /// The entry applied.
        index: u64,
        /// Its writes.
        #[serde(with = "bytes::writes")]
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    },
    /// Log compaction: drop the entries up to `base.pos.index` (all applied) and start the
    /// log after `base`. The key-value state does not change. A base at or below the current
    /// one changes nothing: a store may keep its log compacted further than the replica's
    /// own (up to the applied index), and compacting is only ever a loss of applied entries.
    Compact {
        /// The new base.
        base: Base,
    },
    /// A received snapshot (R6), in one transaction: the log becomes empty after `base`, the
    /// key-value state becomes `kv`, and `applied` becomes `base.pos.index`.
    InstallSnapshot {
        /// The snapshot's position and config.
        base: Base,
        /// The state at `base`, as one buffer (the replica keeps its own map of it).
        kv: StateImage,
    },
    /// Delete a tombstoned replica's retired copy from the disk (its grace period is over).
    DropRetired,
    /// Apply entry `index`, which the log holds (an earlier `Append`, not yet compacted: only
    /// applied entries are): a `Put` or `Del` changes its key, any other op only moves
    /// `applied`; then `applied := index`. The change names the entry rather than repeating
    /// its write, so a write reaches the write-ahead log once, in its `Append`.
    Applied {
        /// The entry applied.
        index: u64,
    },
}

/// Identifies a persist batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// Changes the shell must make durable, in one transaction, then report with
/// [`ShardReplica::handle_persisted`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Persist {
    /// The batch.
    pub batch: BatchId,
    /// Its changes, in order.
    pub changes: Vec<Change>,
}

/// A message to send once batch `after` (if any) is durable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Outgoing {
    /// The recipient.
    pub to: Member,
    /// The message.
    pub message: Message,
    /// Hold it until this batch is durable.
    pub after: Option<BatchId>,
}

/// Which timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Timer {
    /// Stand for election (a voter without a leader).
    Election,
    /// Send a heartbeat round and check the quorum (a leader).
    Heartbeat,
    /// A tombstoned replica's grace period is over: delete its retired copy.
    DropRetired,
}

/// A replica's role.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// Follows `leader_hint`, or nobody.
    Follower,
    /// Collecting promises for a ballot.
    Candidate(Candidate),
    /// Leads a ballot.
    Leader(Box<Leader>),
}

/// Candidate state (R2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Candidate {
    b: Ballot,
    commit_at_prepare: u64,
    handoff_from: Option<Ballot>,
    promises: BTreeMap<NodeId, ReceivedPromise>,
    asked: BTreeSet<NodeId>,
}

/// A promise as the candidate keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReceivedPromise {
    member: Member,
    last: Pos,
    config: Config,
    suffix: Option<Vec<Entry>>,
}

/// Leader state (R4, R9, R11).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    b: Ballot,
    epoch_index: u64,
    established: bool,
    matched: BTreeMap<NodeId, u64>,
    next: BTreeMap<NodeId, u64>,
    hb_seq: u64,
    hb_acked: BTreeMap<NodeId, u64>,
    last_ack: BTreeMap<NodeId, Duration>,
    /// The newest round sent to each member, in an `Append` or a `ReadRound`: one whose
    /// `hb_acked` is below it has a round outstanding.
    round_sent: BTreeMap<NodeId, u64>,
    since: Duration,
    writes: BTreeMap<u64, RequestTag>,
    reads: Vec<PendingRead>,
    round_wanted: bool,
    /// A handoff in progress (R7).
    transfer: Option<Transfer>,
    /// Writes held during a handoff, never appended.
    held: Vec<(RequestTag, Op)>,
    /// Members a committed config dropped, told `Removed` until they acknowledge (R8).
    removing: BTreeMap<NodeId, Removing>,
    /// The promises counted to open `b` (R2.3), kept to be inspected.
    promisers: Vec<Member>,
    /// Heartbeating slowly (see `ReplicaConfig::idle_heartbeat`).
    idle: bool,
    /// Members added during this ballot: the first heartbeat round whose acknowledgements
    /// count (older ones may be from a previous membership of the same member).
    fresh_from: BTreeMap<NodeId, u64>,
    /// The last client operation or config change.
    last_activity: Duration,
    /// Snapshot transfers in progress (R6), per member.
    snapshots: BTreeMap<NodeId, SnapshotSend>,
    /// When each heartbeat sequence number was taken, oldest first, back to the oldest that
    /// could still hold a lease (R9): an acknowledgement of `hb_seq = s` answers a message
    /// sent at or after `s`'s time.
    seq_times: VecDeque<(u64, Duration)>,
    /// Copies being verified, per member: the index asked, the leader's own checksums there,
    /// when asked, and how many times.
    verifying: BTreeMap<NodeId, Verifying>,
    /// Members whose copy differed from the leader's: removed from the config next.
    evicting: Vec<Member>,
    /// Members removed for a differing copy that have not acknowledged their tombstone yet:
    /// not added again before they have, or they would keep their copy and catch up by the
    /// log alone.
    evicted: Vec<Member>,
    /// The newest round each follower that keeps lease promises acknowledged (R9).
    lease_acked: BTreeMap<NodeId, u64>,
    /// This ballot's leader told a handoff target to stand: the target may lead at any moment
    /// (voters promise it at once), so no lease holds for the rest of the ballot, even if the
    /// handoff times out.
    lease_forfeited: bool,
    /// When each follower was last sent an `Append`, kept only while
    /// `heartbeat_skip_recent` is on: periodic rounds skip the recent ones.
    appended_at: BTreeMap<NodeId, Duration>,
    /// The learners tailing the log (R6): no snapshot in flight to them.
    tailing: BTreeMap<NodeId, Tailing>,
    /// New writes held for a learner that does not catch up (R6's "r ≤ w"), in `held`.
    paused: Option<Pause>,
    /// No pause of this shard's writes before this: one per `catchup_pause +
    /// catchup_patience` at most, however many learners lag.
    no_pause_before: Duration,
}

/// Whether a member that acknowledged `matched` holds everything committed: R5's test for
/// promoting a learner (and R7's for a handoff target), which R6's pause waits for.
fn holds_committed(matched: u64, commit: u64) -> bool {
    matched >= commit && commit > 0
}

/// A learner tailing its leader's log (R6).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Tailing {
    /// When it was first seen tailing (its snapshot installed, or none needed), or when the
    /// leader last stopped giving up on it.
    since: Duration,
    /// Past `t_catchup`: the leader no longer keeps its log for it nor pauses for it, until
    /// its next snapshot or for another `t_catchup`, whichever comes first.
    given_up: bool,
}

/// New writes held so that `learner` catches up (R6).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Pause {
    learner: NodeId,
    until: Duration,
}

/// A member a committed config dropped, told `Removed` until it acknowledges (R8).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Removing {
    member: Member,
    config_pos: Pos,
    config: Config,
    /// Its `matched` when the config committed.
    matched: u64,
}

/// A copy verification in progress at a leader.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Verifying {
    member: Member,
    index: u64,
    own: Vec<[u8; 16]>,
    asked_at: Duration,
    attempts: u32,
}

/// A received `Snapshot` chunk, unpacked.
#[derive(Debug)]
struct SnapshotChunk {
    base: Pos,
    config: Config,
    seq: u64,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    last: bool,
    digest: [u8; 32],
}

/// One snapshot transfer from a leader (R6): a view of the leader's disk, read one chunk at a
/// time as the receiver acknowledges. Only the chunks in flight are held; one sent again is
/// read again, from the key its predecessor ended with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SnapshotSend {
    to: Member,
    view: ViewId,
    /// The view's base and its pairs and bytes, once the shell opened it.
    opened: Option<(Base, u64, u64)>,
    /// For each chunk whose start is known, the key it starts after (`None`: the first).
    afters: Vec<Option<Vec<u8>>>,
    /// Each chunk read so far: its pairs and bytes.
    sizes: Vec<(u64, u64)>,
    /// How many chunks there are, once the last was read.
    total: Option<u64>,
    /// The pairs of chunks `acked..acked + cached.len()`.
    cached: VecDeque<Pairs>,
    /// The chunk whose read is outstanding.
    reading: Option<u64>,
    /// The receiver holds chunks `..acked`.
    acked: u64,
    /// The next chunk to send.
    sent: u64,
    /// Whether `acked` advanced since the previous heartbeat round; a round without progress
    /// resends from `acked` (lost chunks, a restarted receiver).
    progress: bool,
    /// The view failed, or shows a state older than the log's base: dropped at the next
    /// heartbeat round, and started over on a fresh view after it.
    failed: bool,
}

impl SnapshotSend {
    /// Pairs and bytes in chunks `..upto`.
    fn size_of_chunks(&self, upto: u64) -> (u64, u64) {
        let upto = usize::try_from(upto).unwrap_or(usize::MAX);
        self.sizes
            .iter()
            .take(upto)
            .fold((0, 0), |(pairs, bytes), (p, b)| (pairs + p, bytes + b))
    }

    /// The chunk after the cached ones.
    fn next_to_read(&self) -> u64 {
        self.acked + self.cached.len() as u64
    }
}

/// A snapshot being received: volatile, lost on a crash, never served or counted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SnapshotReceive {
    b: Ballot,
    base: Pos,
    config: Config,
    next: u64,
    /// The chunks' pairs in the order received: the leader sends them in key order, so the
    /// install builds its map in one pass with full nodes (a map filled pair by pair is about
    /// half full).
    pairs: Pairs,
    /// A verified chunk that arrived before its predecessor (the network reorders): its
    /// number, pairs and `last` flag.
    ahead: Option<(u64, Pairs, bool)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Transfer {
    to: Member,
    deadline: Duration,
    sent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PendingRead {
    tag: RequestTag,
    key: Vec<u8>,
    read_index: u64,
    round: u64,
}

/// The active config: the log's last `Config` entry at `config_at`, else the base's.
fn active(durable: &Durable, config_at: Option<u64>) -> &Config {
    match config_at.and_then(|index| durable.entry(index)) {
        Some(Entry {
            op: Op::Config(config),
            ..
        }) => config,
        _ => &durable.base.config,
    }
}

/// The index of the last `Config` entry in the log.
fn last_config_index(durable: &Durable) -> Option<u64> {
    durable
        .log
        .iter()
        .rev()
        .find(|entry| matches!(entry.op, Op::Config(_)))
        .map(|entry| entry.index)
}

/// How many `Append`s a leader has outstanding per follower at most, per send.
const APPEND_WINDOW: usize = 4;

/// A member that holds nothing gets a snapshot rather than the log once the leader has this
/// many applied entries after its base (a new learner: its copy is then read from the disk in
/// key order, not rebuilt from every write since the base).
const SNAPSHOT_OVER_REPLAY: u64 = 256;

/// How many snapshot chunks a leader has unacknowledged per receiver at most.
const SNAPSHOT_WINDOW: u64 = 2;

/// A leader ignores its followers' needs and compacts anyway once its log holds this many
/// times `compact_after` entries.
const COMPACT_HARD_CAP: u64 = 4;

/// How many client attempts a standing replica keeps for its leadership (`waiting`); more are
/// answered at once.
const MAX_WAITING_CLIENTS: usize = 1024;

/// How long a replica that stepped down waits for its log to decide the writes it had
/// appended (`undecided`) before answering them `Indeterminate`.
const UNDECIDED_FOR: Duration = Duration::from_secs(2);

/// How long a leader waits for a member's checksums before asking again at a later index.
const VERIFY_PATIENCE: Duration = Duration::from_secs(2);

/// How many times a leader asks a member for its checksums before reporting it unverified.
const VERIFY_ATTEMPTS: u32 = 5;

/// How long a leader waits between two handoffs to the placement target (R3).
const T_STABLE: Duration = Duration::from_secs(10);

/// R9's ρ as a fraction `1 / LEASE_DRIFT_DIVISOR`: how much faster a leader's clock may run
/// than a follower's. A lease lasts `t_elect·(1−ρ)` from the round that renewed it.
const LEASE_DRIFT_DIVISOR: u32 = 100;

/// Switches that break the protocol on purpose, so the model checker can prove it catches
/// each break (PROTOCOL.md's mutation table). All off in real use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mutations {
    /// Promise without persisting `promised`.
    pub skip_persist_promised: bool,
    /// Compare logs by length (index) instead of `Pos`.
    pub compare_logs_by_length: bool,
    /// Count entries of older ballots for commit (Raft's Figure 8).
    pub commit_old_ballot_entries: bool,
    /// Serve reads without a heartbeat round.
    pub read_without_round: bool,
    /// Answer appended writes `Moved` (not `Indeterminate`) when leadership is lost.
    pub moved_for_appended: bool,
    /// Open a ballot with a majority of the placement target instead of `active(L*)`.
    pub open_with_target_majority: bool,
    /// Tell members apart by `NodeId` only, ignoring their `StorageId`.
    pub ignore_storage_id: bool,
    /// Change the config before the leader's `EpochStart` commits (the 2015 bug).
    pub config_before_epoch_start: bool,
    /// Release every message at once, without waiting for the batch it relies on.
    pub send_before_persist: bool,
    /// Promise a ballot with the same `n` as the one promised, from another proposer.
    pub accept_equal_n: bool,
    /// Install the next snapshot with one value changed (a copy gone bad on the way to the
    /// disk), once; copy verification must catch it.
    pub corrupt_next_install: bool,
    /// Answer a `ReadRound` whatever ballot was promised.
    pub read_round_ignores_promise: bool,
}

/// One replica of one shard.
///
/// Inputs are `handle_*(now, ...)`; outputs are polled: [`poll_persist`](Self::poll_persist)
/// (make it durable, then call [`handle_persisted`](Self::handle_persisted)),
/// [`poll_message`](Self::poll_message) (send once its `after` batch is durable),
/// [`poll_reply`](Self::poll_reply) (client answers) and [`poll_timeout`](Self::poll_timeout).
/// No IO, no clock; jitter comes from the seed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardReplica {
    shard: u16,
    me: Member,
    config: ReplicaConfig,
    mutations: Mutations,
    durable: Durable,
    role: Role,
    commit: u64,
    leader_hint: Option<NodeId>,
    /// The target of the handoff this replica made as leader, named to clients until it hears
    /// a leader: the target most likely leads by then, and holds their attempts while it
    /// stands (`waiting`).
    handed_to: Option<NodeId>,
    /// Client attempts that came while this replica stood, and reads that came while it led
    /// without an established ballot (at most [`MAX_WAITING_CLIENTS`]), with when to give up
    /// on them (`t_elect` later): served once it may ([`Self::may_serve`]), redirected once
    /// its leadership is lost or at that instant (a candidate without pre-vote may stand
    /// again and again). Answering them `Unavailable` at once sent each client into a backoff
    /// longer than the election; a handoff's target is asked the moment its old leader steps
    /// down.
    waiting: Vec<(RequestTag, ClientOp, Duration)>,
    /// The leader said it is idle (its heartbeats are slow).
    leader_idle: bool,
    last_heard: Option<Duration>,
    /// A restarted replica that had promised may have acknowledged a round (R9) it no longer
    /// remembers, so it promises no other ballot before this instant
    /// (`ReplicaConfig::restart_silence`).
    restart_bound: Option<Duration>,
    highest_seen: u64,
    dead: BTreeSet<NodeId>,
    election_at: Option<Duration>,
    heartbeat_at: Option<Duration>,
    /// When a tombstoned replica's retired copy is deleted (`ReplicaConfig::retired_grace`).
    retire_at: Option<Duration>,
    /// The index of the log's last `Config` entry (`None`: the base's config is active), so
    /// `active` is O(1). Changed only by [`set_config_at`](Self::set_config_at).
    config_at: Option<u64>,
    /// A copy of the active config (`active(&durable, config_at)`), kept beside the fields
    /// read with it: read out of the log, it was a cache miss in nearly every message
    /// handled (82% of `arm_election`'s own time under ×16 writes).
    active_config: Config,
    target: Option<Vec<Member>>,
    last_handoff: Option<Duration>,
    /// Whether R7's handoff to the target's first voter waits ([`ShardReplica::hold_handoff`]):
    /// the host holds it while shards this node leads add members, so the joiner they copy to
    /// takes over leaderships once it no longer loads copies.
    handoff_held: bool,
    /// A snapshot being received (R6).
    incoming: Option<SnapshotReceive>,
    /// Writes this replica appended as leader that had not committed when it stepped down, by
    /// index: the attempt, the entry's ballot, and when to give up. The log decides them: `Ok`
    /// once that entry is applied (a handoff's target, or the next leader, committed it);
    /// `Indeterminate` once another entry is applied at its index, at the deadline, or when a
    /// snapshot skips the index.
    undecided: BTreeMap<u64, (RequestTag, Ballot, Duration)>,
    /// A leader's `Verify` waiting for this replica to apply its index: who asked, under
    /// which ballot, at which index.
    verify_asked: Option<(Member, Ballot, u64)>,
    /// Copy verifications decided here as leader, for the shell to report.
    verify_outcomes: VecDeque<VerifyOutcome>,
    /// The next view of this replica's disk to ask for (R6 transfers).
    next_view: ViewId,
    /// Reads of this replica's disk for the shell.
    reads: VecDeque<SnapshotRead>,
    rng: u64,
    open_batch: Vec<Change>,
    /// When the oldest change of the open batch was made.
    open_since: Option<Duration>,
    /// Followers lack entries; the `Append`s are built when messages are polled, so a burst
    /// of writes travels as one message per follower.
    appends_wanted: bool,
    next_batch: u64,
    unpersisted: VecDeque<(BatchId, Duration, u64)>,
    durable_last: u64,
    pending_out: Vec<(Member, Message, bool)>,
    outbox: VecDeque<Outgoing>,
    persists: VecDeque<Persist>,
    replies: VecDeque<(RequestTag, ClientReply)>,
    /// The `now` of the latest input, for the `Append`s built when messages are polled;
    /// kept only while `heartbeat_skip_recent` is on (it is all `appended_at` needs).
    input_at: Duration,
    /// A pre-vote in progress (R3): the ballot asked about and the voters that would promise
    /// it (this replica included). Cleared when a leader is heard, a ballot promised, or
    /// this replica stands.
    pre_vote: Option<(Ballot, BTreeSet<NodeId>)>,
}

impl ShardReplica {
    /// Feeds `state` what the derived `Hash` does, except four fields by which a model
    /// checker should not tell states apart: `rng` (it advances on every draw, even of a zero
    /// jitter), `next_batch` (a counter of batches), and the election and heartbeat deadlines
    /// (a checker that fires timers whenever it likes never reads them). Right only where
    /// `ReplicaConfig::jitter` is zero; two replicas that hash alike here but differ in those
    /// fields behave alike under such a checker.
    pub fn hash_for_model<H: std::hash::Hasher>(&self, state: &mut H) {
        use std::hash::Hash as _;
        // Every field by name: a new one fails to compile here until it is hashed or left out.
        let ShardReplica {
            shard,
            me,
            config,
            mutations,
            durable,
            role,
            commit,
            leader_hint,
            handed_to,
            waiting,
            leader_idle,
            last_heard,
            restart_bound,
            highest_seen,
            dead,
            election_at: _,
            heartbeat_at: _,
            retire_at,
            config_at,
            active_config: _, // A copy of what `durable` and `config_at` say.
            target,
            last_handoff,
            handoff_held,
            incoming,
            undecided,
            verify_asked,
            verify_outcomes,
            next_view,
            reads,
            rng: _,
            open_batch,
            open_since,
            appends_wanted,
            next_batch: _,
            unpersisted,
            durable_last,
            pending_out,
            outbox,
            persists,
            replies,
            input_at,
            pre_vote,
        } = self;
        shard.hash(state);
        me.hash(state);
        config.hash(state);
        mutations.hash(state);
        durable.hash(state);
        role.hash(state);
        commit.hash(state);
        leader_hint.hash(state);
        handed_to.hash(state);
        waiting.hash(state);
        leader_idle.hash(state);
        last_heard.hash(state);
        restart_bound.hash(state);
        highest_seen.hash(state);
        dead.hash(state);
        retire_at.hash(state);
        config_at.hash(state);
        target.hash(state);
        last_handoff.hash(state);
        handoff_held.hash(state);
        incoming.hash(state);
        undecided.hash(state);
        verify_asked.hash(state);
        verify_outcomes.hash(state);
        next_view.hash(state);
        reads.hash(state);
        open_batch.hash(state);
        open_since.hash(state);
        appends_wanted.hash(state);
        unpersisted.hash(state);
        durable_last.hash(state);
        pending_out.hash(state);
        outbox.hash(state);
        persists.hash(state);
        replies.hash(state);
        input_at.hash(state);
        pre_vote.hash(state);
    }

    /// A replica of `shard` on `me`, restarted from `durable` (or bootstrapped with
    /// [`Durable::bootstrap`]). Volatile state starts empty: a follower without a leader.
    pub fn new(
        now: Duration,
        shard: u16,
        me: Member,
        durable: Durable,
        config: ReplicaConfig,
        seed: u64,
    ) -> Self {
        let durable_last = durable.last().index;
        let mut replica = ShardReplica {
            shard,
            me,
            config,
            mutations: Mutations::default(),
            durable,
            role: Role::Follower,
            commit: 0,
            leader_hint: None,
            handed_to: None,
            waiting: Vec::new(),
            leader_idle: false,
            last_heard: None,
            restart_bound: None,
            highest_seen: 0,
            dead: BTreeSet::new(),
            election_at: None,
            heartbeat_at: None,
            retire_at: None,
            config_at: None,
            active_config: Config::default(),
            target: None,
            last_handoff: None,
            handoff_held: false,
            incoming: None,
            undecided: BTreeMap::new(),
            verify_asked: None,
            verify_outcomes: VecDeque::new(),
            next_view: 0,
            reads: VecDeque::new(),
            rng: seed | 1,
            open_batch: Vec::new(),
            open_since: None,
            appends_wanted: false,
            next_batch: 0,
            unpersisted: VecDeque::new(),
            durable_last,
            pending_out: Vec::new(),
            outbox: VecDeque::new(),
            persists: VecDeque::new(),
            replies: VecDeque::new(),
            input_at: Duration::ZERO,
            pre_vote: None,
        };
        replica.commit = replica.durable.applied;
        replica.set_config_at(last_config_index(&replica.durable));
        if replica.durable.tombstone.is_some() && !replica.config.retired_grace.is_zero() {
            // Whatever is left of its retired copy goes a grace period after this start (with
            // no grace period it went with the tombstone, in the same batch).
            replica.retire_at = Some(now + replica.config.retired_grace);
        }
        let mut silence = replica.config.restart_silence;
        if replica.config.lease_reads {
            silence = silence.max(replica.config.t_elect);
        }
        if !silence.is_zero() && replica.durable.promised.is_some() {
            replica.restart_bound = Some(now + silence);
        }
        replica.arm_election(now);
        replica
    }

    /// Writes the base (config and key-value state) into the open batch as one
    /// `InstallSnapshot`: how a shard created on this node reaches the disk.
    pub fn persist_base(&mut self, now: Duration) {
        self.open_batch.push(Change::InstallSnapshot {
            base: self.durable.base.clone(),
            kv: self.durable.kv.to_image(),
        });
        if self.open_since.is_none() {
            self.open_since = Some(now);
        }
    }

    /// Breaks the protocol on purpose (tests of the model checker only).
    pub fn set_mutations(&mut self, mutations: Mutations) {
        self.mutations = mutations;
    }

    // ---- accessors ----

    /// The shard.
    pub fn shard(&self) -> u16 {
        self.shard
    }

    /// The active config (R2 `active`: the log's last `Config` entry, committed or not, else
    /// the base's), without searching the log.
    pub fn config(&self) -> &Config {
        &self.active_config
    }

    /// This replica's member.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The durable state as the persisted batches build it.
    pub fn durable(&self) -> &Durable {
        &self.durable
    }

    /// The replica set placement last handed this replica ([`ShardReplica::handle_target`]),
    /// leader first; `None` before any.
    pub fn target(&self) -> Option<&[Member]> {
        self.target.as_deref()
    }

    /// The role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The commit index (volatile).
    pub fn commit(&self) -> u64 {
        self.commit
    }

    /// Who this replica believes leads.
    pub fn leader_hint(&self) -> Option<&NodeId> {
        self.leader_hint.as_ref()
    }

    /// The ballot this replica leads, once established (its `EpochStart` committed).
    pub fn established_ballot(&self) -> Option<&Ballot> {
        match &self.role {
            Role::Leader(leader) if leader.established => Some(&leader.b),
            _ => None,
        }
    }

    /// The ballot this replica stands for, as a candidate.
    pub fn candidate_ballot(&self) -> Option<&Ballot> {
        match &self.role {
            Role::Candidate(candidate) => Some(&candidate.b),
            _ => None,
        }
    }

    /// As a leader, the index `node` acknowledged holding; `None` otherwise.
    pub fn matched(&self, node: &NodeId) -> Option<u64> {
        match &self.role {
            Role::Leader(leader) => leader.matched.get(node).copied(),
            _ => None,
        }
    }

    /// As a leader sending `node` a snapshot (R6): the pairs and bytes it acknowledged, of
    /// those in the whole snapshot.
    pub fn snapshot_progress(&self, node: &NodeId) -> Option<crate::wire::CopyProgress> {
        let Role::Leader(leader) = &self.role else {
            return None;
        };
        let send = leader.snapshots.get(node)?;
        let (_, keys_total, bytes_total) = send.opened.as_ref()?;
        let (keys, bytes) = send.size_of_chunks(send.acked);
        Some(crate::wire::CopyProgress {
            keys,
            keys_total: *keys_total,
            bytes,
            bytes_total: *bytes_total,
        })
    }

    /// As a leader holding new writes for a learner to catch up (R6), that learner.
    pub fn writes_paused_for(&self) -> Option<&NodeId> {
        match &self.role {
            Role::Leader(leader) => leader.paused.as_ref().map(|pause| &pause.learner),
            _ => None,
        }
    }

    /// As a leader, the members whose promises opened its ballot (R2.3); else empty.
    pub fn promisers(&self) -> &[Member] {
        match &self.role {
            Role::Leader(leader) => &leader.promisers,
            _ => &[],
        }
    }

    /// The ballot this replica leads, established or not.
    pub fn leading_ballot(&self) -> Option<&Ballot> {
        match &self.role {
            Role::Leader(leader) => Some(&leader.b),
            _ => None,
        }
    }

    // ---- outputs ----

    /// The next batch to make durable.
    ///
    /// Changes gather in an open batch until this is called, so everything handled since the
    /// last call becomes one batch.
    pub fn poll_persist(&mut self) -> Option<Persist> {
        if self.persists.is_empty() && !self.open_batch.is_empty() {
            let batch = BatchId(self.next_batch);
            self.next_batch += 1;
            let changes = std::mem::take(&mut self.open_batch);
            let since = self.open_since.take().unwrap_or_default();
            self.unpersisted
                .push_back((batch, since, self.durable.last().index));
            self.persists.push_back(Persist { batch, changes });
        }
        self.persists.pop_front()
    }

    /// The next message.
    pub fn poll_message(&mut self) -> Option<Outgoing> {
        if self.appends_wanted {
            self.appends_wanted = false;
            self.send_appends(false, None, None);
            self.tag_pending();
        }
        self.outbox.pop_front()
    }

    /// The next client answer.
    pub fn poll_reply(&mut self) -> Option<(RequestTag, ClientReply)> {
        self.replies.pop_front()
    }

    /// The next copy verification this replica decided as leader.
    pub fn poll_verify(&mut self) -> Option<VerifyOutcome> {
        self.verify_outcomes.pop_front()
    }

    /// The next read of this replica's disk, for a snapshot transfer: answer `Open` and
    /// `Chunk` with [`handle_snapshot_read`](Self::handle_snapshot_read), in order.
    pub fn poll_snapshot_read(&mut self) -> Option<SnapshotRead> {
        self.reads.pop_front()
    }

    /// The next timer and when it is due.
    pub fn poll_timeout(&self) -> Option<(Duration, Timer)> {
        let replication = match (self.election_at, self.heartbeat_at) {
            (Some(e), Some(h)) if h <= e => Some((h, Timer::Heartbeat)),
            (Some(e), _) => Some((e, Timer::Election)),
            (None, Some(h)) => Some((h, Timer::Heartbeat)),
            (None, None) => None,
        };
        match (replication, self.retire_at) {
            (Some((at, timer)), Some(retire)) if at <= retire => Some((at, timer)),
            (_, Some(retire)) => Some((retire, Timer::DropRetired)),
            (replication, None) => replication,
        }
    }

    /// Whether this replica is tombstoned and its retired copy is still on the disk.
    pub fn holds_retired_copy(&self) -> bool {
        self.durable.tombstone.is_some() && self.retire_at.is_some()
    }

    // ---- inputs ----

    /// The members this node's view holds down (SWIM): they are skipped when ranking
    /// candidates. Safety never depends on it.
    pub fn handle_view(&mut self, now: Duration, dead: BTreeSet<NodeId>) {
        self.note_input(now);
        self.dead = dead;
        if matches!(self.role, Role::Follower) {
            self.arm_election(now);
        }
    }

    /// The replica set placement wants, in order (leader first). Only an established leader
    /// acts on it, one change at a time (R5), handing off when it is not the target's first.
    pub fn handle_target(&mut self, now: Duration, target: Vec<Member>) {
        self.note_input(now);
        self.target = Some(target);
        if matches!(&self.role, Role::Leader(leader) if leader.established) {
            self.reconfigure(now);
        }
        self.finish(now);
    }

    /// Holds back (`true`) or lets go (`false`) R7's handoff to the target's first voter while
    /// this replica stays in its target. A leader leaving the target hands off regardless: its
    /// move cannot end otherwise. Only scheduling: who may lead is unchanged, and a held
    /// leader keeps serving.
    pub fn hold_handoff(&mut self, now: Duration, held: bool) {
        if self.handoff_held == held {
            return;
        }
        self.note_input(now);
        self.handoff_held = held;
        if !held && matches!(&self.role, Role::Leader(leader) if leader.established) {
            self.reconfigure(now);
        }
        self.finish(now);
    }

    /// Batch `batch` (and every earlier one) is durable.
    pub fn handle_persisted(&mut self, now: Duration, batch: BatchId) {
        self.note_input(now);
        while let Some(&(id, _, last)) = self.unpersisted.front() {
            if id > batch {
                break;
            }
            self.unpersisted.pop_front();
            self.durable_last = self.durable_last.max(last);
        }
        self.durable_last = self.durable_last.min(self.durable.last().index);
        if matches!(self.role, Role::Leader(_)) {
            self.advance_commit(now);
        }
        self.finish(now);
    }

    /// A timer fired (the shell calls this at the deadline from `poll_timeout`; a model may
    /// call it at any time).
    pub fn handle_timeout(&mut self, now: Duration, timer: Timer) {
        self.note_input(now);
        match timer {
            Timer::Election => {
                if self.rank().is_none() {
                    if matches!(self.role, Role::Follower) && self.durable.tombstone.is_none() {
                        self.probe(now);
                    } else {
                        self.election_at = None;
                    }
                } else if !matches!(self.role, Role::Leader(_)) {
                    if self.config.pre_vote {
                        self.pre_stand(now);
                    } else {
                        self.stand(now, None);
                    }
                }
            }
            Timer::Heartbeat => self.heartbeat(now),
            Timer::DropRetired => {
                if self.retire_at.is_some_and(|at| at <= now) {
                    self.drop_retired(now);
                }
            }
        }
        self.finish(now);
    }

    /// A client attempt, which came `route`.
    pub fn handle_client(
        &mut self,
        now: Duration,
        tag: RequestTag,
        op: ClientOp,
        route: ClientRoute,
    ) {
        self.note_input(now);
        if !self.may_serve(&op) {
            let standing = matches!(self.role, Role::Candidate(_) | Role::Leader(_));
            if standing && self.waiting.len() < MAX_WAITING_CLIENTS {
                self.waiting.push((tag, op, now + self.config.t_elect));
                return;
            }
            if route == ClientRoute::LeaderSilent {
                self.client_passed_the_leader(now);
            }
            let reply = self.redirect();
            self.replies.push_back((tag, reply));
            return;
        }
        self.serve_client(now, tag, op);
        self.finish(now);
    }

    /// Whether this replica serves `op` now: an established leader serves everything; a
    /// leader whose `EpochStart` has not committed yet appends writes after it (they commit
    /// with it, one `fdatasync` sooner than if they waited for it to commit first), but reads
    /// wait, as its commit index is not known until then.
    fn may_serve(&self, op: &ClientOp) -> bool {
        match &self.role {
            Role::Leader(leader) => leader.established || !matches!(op, ClientOp::Get { .. }),
            Role::Candidate(_) | Role::Follower => false,
        }
    }

    /// A client operation at a leader that [may serve](Self::may_serve) it.
    fn serve_client(&mut self, now: Duration, tag: RequestTag, op: ClientOp) {
        match op {
            ClientOp::Get { key } => {
                self.wake(now);
                if self.mutations.read_without_round {
                    let value = self.durable.kv.get(&key).map(<[u8]>::to_vec);
                    self.replies.push_back((tag, ClientReply::Ok { value }));
                    return;
                }
                // R9: under a lease the state is read first, and the lease checked at the
                // same instant.
                if self.holds_lease(now) && self.durable.applied >= self.commit {
                    let value = self.durable.kv.get(&key).map(<[u8]>::to_vec);
                    self.replies.push_back((tag, ClientReply::Ok { value }));
                } else if let Role::Leader(leader) = &mut self.role {
                    leader.reads.push(PendingRead {
                        tag,
                        key,
                        read_index: self.commit,
                        round: 0,
                    });
                    leader.round_wanted = true;
                }
            }
            ClientOp::Put { key, value } => self.append_write(now, tag, Op::Put { key, value }),
            ClientOp::Del { key } => self.append_write(now, tag, Op::Del { key }),
        }
    }

    /// The attempts `waiting` for this replica's leadership: served once it [may serve
    /// them](Self::may_serve), redirected once this replica follows or `t_elect` after they
    /// came; kept while it stands (and reads while it establishes).
    fn settle_waiting(&mut self, now: Duration) {
        if self.waiting.is_empty() {
            return;
        }
        let standing = !matches!(self.role, Role::Follower);
        for (tag, op, until) in std::mem::take(&mut self.waiting) {
            if self.may_serve(&op) {
                self.serve_client(now, tag, op);
            } else if standing && now < until {
                self.waiting.push((tag, op, until));
            } else {
                let reply = self.redirect();
                self.replies.push_back((tag, reply));
            }
        }
    }

    /// A client asked this follower because the leader it follows did not answer the client
    /// ([`ClientRoute::LeaderSilent`]), so it may be gone. (A client whose routing is merely
    /// out of date, after a handoff, says so, and ends nothing: its attempt at the new leader
    /// wakes it, but a busy new leader's first heartbeat could come later than this rule
    /// allows, and the follower would depose it.) An idle leader's silence is excused for
    /// `T_elect + idle_heartbeat`; from now on it is not. The election timer moves to
    /// `T_elect` after the leader was last heard, but no sooner than one heartbeat from now
    /// (a live leader the client then reaches wakes up and heartbeats at once, in far less),
    /// plus the rank step and jitter. Without it a dead idle leader's shard waits for SWIM's
    /// verdict (about 700 ms here) before anyone stands, though a client is already waiting.
    fn client_passed_the_leader(&mut self, now: Duration) {
        if !(matches!(self.role, Role::Follower) && self.leader_idle && self.leader_hint.is_some())
        {
            return;
        }
        self.leader_idle = false;
        let silent_since = self.last_heard.unwrap_or(now);
        let earliest = (now + self.config.heartbeat).max(silent_since + self.config.t_elect);
        if let Some(at) = self.ranked_election(earliest) {
            self.election_at = Some(self.election_at.map_or(at, |armed| armed.min(at)));
        }
    }

    /// The shell's answer to a [`SnapshotRead`]. Answers for views no longer wanted (the
    /// transfer ended, leadership was lost) are ignored; their views were closed.
    pub fn handle_snapshot_read(&mut self, now: Duration, reply: SnapshotReadReply) {
        self.note_input(now);
        let view = match &reply {
            SnapshotReadReply::Opened { view, .. }
            | SnapshotReadReply::Chunk { view, .. }
            | SnapshotReadReply::Failed { view } => *view,
        };
        let durable_base = self.durable.base.pos.index;
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let Some(send) = leader.snapshots.values_mut().find(|send| send.view == view) else {
            return;
        };
        match reply {
            SnapshotReadReply::Opened {
                base, keys, bytes, ..
            } if send.opened.is_none() => {
                if base.pos.index < durable_base {
                    // The disk is behind the log's base (it has not folded a compaction
                    // yet): the receiver would miss the entries between. Later.
                    tracing::debug!(
                        shard = self.shard,
                        view,
                        disk = base.pos.index,
                        log = durable_base,
                        "snapshot view older than the log's base"
                    );
                    send.failed = true;
                } else {
                    tracing::debug!(shard = self.shard, to = %send.to.node, base = base.pos.index, keys, bytes, "snapshot transfer");
                    send.opened = Some((base, keys, bytes));
                }
            }
            SnapshotReadReply::Chunk {
                seq, pairs, last, ..
            } if send.reading == Some(seq) => {
                send.reading = None;
                if seq == send.next_to_read() {
                    if seq == send.sizes.len() as u64 {
                        let bytes = pairs.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
                        send.sizes.push((pairs.len() as u64, bytes));
                        match pairs.last() {
                            Some((key, _)) if !last => send.afters.push(Some(key.clone())),
                            _ => send.total = Some(seq + 1),
                        }
                    }
                    send.cached.push_back(pairs);
                } // Else the receiver went back meanwhile: the chunk is read again.
            }
            SnapshotReadReply::Failed { .. } => send.failed = true,
            // Unasked: a bug in the shell. The round after starts the transfer over.
            _ => send.failed = true,
        }
        let _ = now;
        self.pump_snapshots(false);
        // The chunks just read leave now, not with this replica's next handler (a heartbeat
        // round away for a shard without traffic).
        self.tag_pending();
    }

    /// A message from replica `from`, addressed to `to`.
    pub fn handle_message(&mut self, now: Duration, from: Member, to: Member, message: Message) {
        self.note_input(now);
        if !self.same_member(&to, &self.me) {
            if let Message::Prepare { b, .. } = message {
                self.send(
                    from,
                    Message::Reject {
                        b,
                        reason: RejectReason::NoState,
                    },
                    false,
                );
            }
            self.finish(now);
            return;
        }
        match message {
            Message::Prepare {
                b,
                last,
                commit,
                handoff_from,
            } => self.on_prepare(now, from, b, last, commit, handoff_from),
            Message::Promise {
                b,
                last,
                config,
                suffix,
            } => self.on_promise(now, from, b, last, config, suffix),
            Message::Reject { b, reason } => self.on_reject(now, b, reason),
            Message::Append {
                b,
                prev,
                entries,
                commit,
                hb_seq,
                idle,
            } => {
                self.leader_idle = idle;
                self.on_append(now, from, b, prev, entries, commit, hb_seq);
            }
            Message::AppendOk {
                b,
                matched,
                hb_seq,
                lease,
            } => {
                self.on_append_ok(now, from, b, matched, hb_seq, lease);
            }
            Message::AppendNack { b, reason } => self.on_append_nack(now, from, b, reason),
            Message::Verify { b, index } => self.on_verify(from, b, index),
            Message::VerifyOk { b, index, chunks } => {
                self.on_verify_ok(now, from, b, index, chunks);
            }
            Message::TimeoutNow { b } => {
                if !matches!(self.role, Role::Leader(_)) {
                    self.stand(now, Some(b));
                }
            }
            Message::Removed {
                b,
                config_pos,
                config,
                matched,
            } => self.on_removed(now, from, b, config_pos, config, matched),
            Message::Probe => {
                if let Some(removed) = self.removed_by_committed_config(&from) {
                    self.send(from, removed, false);
                }
            }
            Message::PreVote { b, last } => self.on_pre_vote(now, from, b, &last),
            Message::ReadRound { b, round } => {
                if let Some(answer) = self.answer_read_round(&to, &b, round) {
                    self.send(from, answer, false);
                }
            }
            Message::ReadRoundOk { b, round } => self.handle_read_round_ok(&from, &to, &b, round),
            Message::PreVoteReply { b, verdict } => {
                self.on_pre_vote_reply(now, &from, &b, verdict);
            }
            Message::RemovedOk { b } => {
                if let Role::Leader(leader) = &mut self.role
                    && leader.b == b
                {
                    leader.removing.remove(&from.node);
                    leader.evicted.retain(|m| m.node != from.node);
                }
            }
            Message::Snapshot {
                b,
                base,
                config,
                seq,
                pairs,
                last,
                digest,
            } => {
                let chunk = SnapshotChunk {
                    base,
                    config,
                    seq,
                    pairs,
                    last,
                    digest,
                };
                self.on_snapshot(now, from, b, chunk);
            }
            Message::SnapshotOk {
                b,
                base,
                next,
                done,
            } => self.on_snapshot_ok(now, from, b, base, next, done),
        }
        self.finish(now);
    }

    // ---- R1: acceptor ----

    fn on_prepare(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        last: Pos,
        commit: u64,
        handoff_from: Option<Ballot>,
    ) {
        self.highest_seen = self.highest_seen.max(b.n);
        if let Some(tombstone) = &self.durable.tombstone {
            let reason = RejectReason::Tombstone(tombstone.last.clone(), tombstone.config.clone());
            self.send(from, Message::Reject { b, reason }, false);
            return;
        }
        if let Some(removed) = self.removed_by_committed_config(&from) {
            self.send(from, removed, false);
            return;
        }
        if self.durable.log.is_empty() && self.durable.base.config.voters.is_empty() {
            self.send(
                from,
                Message::Reject {
                    b,
                    reason: RejectReason::NoState,
                },
                false,
            );
            return;
        }
        if let Some(promised) = &self.durable.promised
            && (b <= *promised && !self.mutations.accept_equal_n
                || self.mutations.accept_equal_n && (b.n < promised.n || b == *promised))
        {
            let reason = RejectReason::Higher(promised.clone());
            self.send(from, Message::Reject { b, reason }, false);
            return;
        }
        if let Some(leader) = self.sticky_leader(now)
            && handoff_from.as_ref().is_none_or(|h| h.node != leader)
        {
            let reason = RejectReason::Sticky(leader);
            self.send(from, Message::Reject { b, reason }, false);
            return;
        }
        if self.lease_binds(now, handoff_from.as_ref()) {
            // A restarted replica that does not know its leader: the candidate retries.
            tracing::debug!(shard = self.shard, b = %b.n, "prepare refused: a lease may hold");
            return;
        }
        let mine = self.durable.last();
        let more_up_to_date = if self.mutations.compare_logs_by_length {
            mine.index > last.index
        } else {
            mine > last
        };
        if more_up_to_date && !self.active_config.is_voter(&from) {
            let reason = RejectReason::NotVoter(mine, self.active_config.clone());
            self.send(from, Message::Reject { b, reason }, false);
            return;
        }
        self.step_down(now);
        self.pre_vote = None;
        self.promise(b.clone());
        // Entries after the candidate's commit that this log compacted cannot be adopted: the
        // candidate asks this replica to lead instead (R2.4).
        let suffix = self.durable.entries_after(commit);
        let suffix = (commit >= self.durable.base.pos.index
            && suffix.len() <= self.config.max_adopt)
            .then(|| suffix.to_vec());
        let promise = Message::Promise {
            b,
            last: mine,
            config: self.active_config.clone(),
            suffix,
        };
        self.send(from, promise, true);
        self.arm_election(now);
    }

    /// R8 for a member that missed its `Removed`: an established leader whose committed
    /// config names neither `member` as a voter nor as a learner tells it `Removed` when it
    /// stands. The config that dropped it may be compacted into this leader's base (a leader
    /// that got a snapshot), where `note_past_removals` cannot see it, and such a copy would
    /// otherwise linger, standing in vain, for good.
    fn removed_by_committed_config(&self, member: &Member) -> Option<Message> {
        let Role::Leader(leader) = &self.role else {
            return None;
        };
        if !leader.established || self.config_at.is_some_and(|at| at > self.commit) {
            return None;
        }
        let config = &self.active_config;
        if member.node == self.me.node || self.is_voter_of(config, member) {
            return None;
        }
        if config.learners.iter().any(|l| self.same_member(l, member)) {
            return None;
        }
        let config_pos = match self.config_at {
            Some(at) => self.durable.pos_at(at)?,
            None => self.durable.base.pos.clone(),
        };
        Some(Message::Removed {
            b: leader.b.clone(),
            config_pos,
            config: config.clone(),
            matched: 0,
        })
    }

    /// The leader heard from within `T_elect` (a leader has heard itself).
    fn sticky_leader(&self, now: Duration) -> Option<NodeId> {
        match &self.role {
            Role::Leader(_) => Some(self.me.node.clone()),
            _ => {
                let heard = self.last_heard?;
                (now.saturating_sub(heard) < self.config.t_elect)
                    .then(|| self.leader_hint.clone())
                    .flatten()
            }
        }
    }

    /// The instant before which this replica promises no other ballot, as it may have
    /// acknowledged a round of the ballot it promised (R9): with leases, `t_elect` after it
    /// last heard its leader; and after a restart, `restart_silence`.
    fn lease_bound(&self) -> Option<Duration> {
        let heard = self
            .last_heard
            .filter(|_| self.config.lease_reads)
            .map(|at| at + self.config.t_elect);
        heard.max(self.restart_bound)
    }

    /// Whether a lease this replica may have granted forbids promising a ballot at `now`. A
    /// handoff from the ballot it promised is allowed: that leader gave up its lease when it
    /// started the handoff.
    fn lease_binds(&self, now: Duration, handoff_from: Option<&Ballot>) -> bool {
        let handoff_of_mine =
            handoff_from.is_some() && handoff_from == self.durable.promised.as_ref();
        self.lease_bound().is_some_and(|bound| now < bound) && !handoff_of_mine
    }

    fn promise(&mut self, b: Ballot) {
        self.durable.promised = Some(b.clone());
        if !self.mutations.skip_persist_promised {
            self.open_batch.push(Change::Promised(b));
        }
    }

    // ---- R2, R3: candidate ----

    fn rank(&self) -> Option<u32> {
        if self.durable.tombstone.is_some() {
            return None;
        }
        // Skipped: voters SWIM holds down, and the leader this replica follows: the election
        // timer only fires once that leader has been silent for `T_elect`, so it will not
        // stand, and its fellow followers need not wait a rank step for it.
        let mut rank = 0;
        for voter in &self.active_config.voters {
            if voter == &self.me {
                return Some(rank);
            }
            let followed = self.leader_hint.as_ref() == Some(&voter.node);
            if !self.dead.contains(&voter.node) && !followed {
                rank += 1;
            }
        }
        None
    }

    fn random_below(&mut self, limit: Duration) -> Duration {
        // xorshift64*: deterministic from the seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let draw = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(if nanos == 0 { 0 } else { draw % nanos })
    }

    fn arm_election(&mut self, now: Duration) {
        let from = self.last_heard.map_or(now, |heard| heard.max(now));
        let leader_down = self
            .leader_hint
            .as_ref()
            .is_some_and(|leader| self.dead.contains(leader) && leader != &self.me.node);
        let voters = &self.active_config.voters;
        let alone = voters.len() == 1 && voters[0] == self.me;
        let wait = if leader_down || alone {
            // SWIM already waited, or no other voter could lead: stand now, in rank order.
            Duration::ZERO
        } else if self.leader_idle {
            self.config.t_elect + self.config.idle_heartbeat
        } else {
            self.config.t_elect
        };
        // A lease this replica granted outlasts SWIM's verdict.
        let earliest = (from + wait).max(self.lease_bound().unwrap_or_default());
        self.election_at = self
            .ranked_election(earliest)
            .or_else(|| self.probe_at(from));
    }

    /// When a replica that never stands (no voter) asks whether it is still a member, if it
    /// hears no leader before: `learner_probe` after `from`; `None` when probing is off or
    /// it is tombstoned.
    fn probe_at(&self, from: Duration) -> Option<Duration> {
        let probe = self.config.learner_probe;
        (!probe.is_zero() && self.durable.tombstone.is_none()).then(|| from + probe)
    }

    /// [`Message::Probe`] to the voters of this replica's config, then again after
    /// `learner_probe` unless a leader is heard meanwhile.
    fn probe(&mut self, now: Duration) {
        let voters: Vec<Member> = self
            .active_config
            .voters
            .iter()
            .filter(|voter| voter.node != self.me.node)
            .cloned()
            .collect();
        tracing::debug!(
            shard = self.shard,
            voters = voters.len(),
            "probing: still a member?"
        );
        for voter in voters {
            self.send(voter, Message::Probe, false);
        }
        self.election_at = self.probe_at(now);
    }

    /// When this replica stands if nobody is heard from before `earliest`: `earliest` plus
    /// its rank's steps and jitter; `None` for a replica that never stands (not a voter).
    fn ranked_election(&mut self, earliest: Duration) -> Option<Duration> {
        let rank = self.rank()?;
        let jitter = self.random_below(self.config.jitter);
        Some(earliest + self.config.t_step * rank + jitter)
    }

    fn stand(&mut self, now: Duration, handoff_from: Option<Ballot>) {
        if self.rank().is_none() {
            self.election_at = None;
            return;
        }
        if self.lease_binds(now, handoff_from.as_ref()) {
            // Promising itself would break a lease this replica may have granted.
            let bound = self.lease_bound().unwrap_or(now);
            self.election_at = self.ranked_election(bound);
            return;
        }
        let b = self.next_ballot();
        self.highest_seen = b.n;
        self.pre_vote = None;
        self.step_down(now);
        self.promise(b.clone());
        let last = self.durable.last();
        let config = self.active_config.clone();
        let own_suffix = Some(self.durable.entries_after(self.commit).to_vec());
        let mut promises = BTreeMap::new();
        promises.insert(
            self.me.node.clone(),
            ReceivedPromise {
                member: self.me.clone(),
                last: last.clone(),
                config: config.clone(),
                suffix: own_suffix,
            },
        );
        let mut asked = BTreeSet::new();
        asked.insert(self.me.node.clone());
        let prepare = Message::Prepare {
            b: b.clone(),
            last,
            commit: self.commit,
            handoff_from: handoff_from.clone(),
        };
        let others: Vec<Member> = config
            .voters
            .iter()
            .filter(|v| v.node != self.me.node)
            .cloned()
            .collect();
        for voter in others {
            asked.insert(voter.node.clone());
            self.send(voter, prepare.clone(), true);
        }
        tracing::debug!(
            shard = self.shard,
            b = %b.n,
            handoff = handoff_from.is_some(),
            voters = ?config.voters.iter().map(|v| v.node.to_string()).collect::<Vec<_>>(),
            "standing"
        );
        self.role = Role::Candidate(Candidate {
            b,
            commit_at_prepare: self.commit,
            handoff_from,
            promises,
            asked,
        });
        let retry = self.random_below(self.config.jitter);
        self.election_at = Some(now + self.config.t_elect + retry);
        self.evaluate_promises(now);
    }

    /// The ballot this replica would open: above every ballot it promised or saw.
    fn next_ballot(&self) -> Ballot {
        let promised_n = self.durable.promised.as_ref().map_or(0, |b| b.n);
        Ballot {
            n: 1 + promised_n.max(self.highest_seen),
            node: self.me.node.clone(),
        }
    }

    /// R3 with a pre-vote: asks the other voters of the active config whether they would
    /// promise the ballot this replica would open, and stands once a majority would
    /// ([`Self::on_pre_vote_reply`]). Asks again when the election timer fires again.
    fn pre_stand(&mut self, now: Duration) {
        if self.rank().is_none() {
            self.election_at = None;
            return;
        }
        if self.lease_binds(now, None) {
            let bound = self.lease_bound().unwrap_or(now);
            self.election_at = self.ranked_election(bound);
            return;
        }
        let config = self.active_config.clone();
        if config.voters.len() < 2 {
            self.stand(now, None);
            return;
        }
        // A candidate whose ballot found no majority asks before it tries another.
        if matches!(self.role, Role::Candidate(_)) {
            self.role = Role::Follower;
        }
        let b = self.next_ballot();
        let message = Message::PreVote {
            b: b.clone(),
            last: self.durable.last(),
        };
        let me = self.me.node.clone();
        for voter in config.voters.into_iter().filter(|v| v.node != me) {
            self.send(voter, message.clone(), false);
        }
        tracing::debug!(shard = self.shard, b = %b.n, "pre-vote");
        self.pre_vote = Some((b, BTreeSet::from([self.me.node.clone()])));
        let retry = self.random_below(self.config.jitter);
        self.election_at = Some(now + self.config.t_elect + retry);
    }

    /// Answers a [`Message::PreVote`] with what a `Prepare` of `b` would meet now (R1),
    /// changing nothing.
    fn on_pre_vote(&mut self, now: Duration, from: Member, b: Ballot, last: &Pos) {
        self.highest_seen = self.highest_seen.max(b.n);
        if let Some(removed) = self.removed_by_committed_config(&from) {
            self.send(from, removed, false);
            return;
        }
        let promised = self.durable.promised.as_ref().map_or(0, |p| p.n);
        let config = &self.active_config;
        let verdict = if self.durable.tombstone.is_some()
            || (self.durable.last() > *last && !config.is_voter(&from))
        {
            PreVerdict::Stale
        } else if (self.durable.log.is_empty() && self.durable.base.config.voters.is_empty())
            || self.durable.promised.as_ref().is_some_and(|p| b <= *p)
            || self.sticky_leader(now).is_some()
            || self.lease_binds(now, None)
        {
            PreVerdict::Refused { promised }
        } else {
            PreVerdict::Granted
        };
        self.send(from, Message::PreVoteReply { b, verdict }, false);
    }

    /// A voter's answer to this replica's pre-vote: it stands once a majority of its active
    /// config's voters would promise, or at once when told its config is stale.
    fn on_pre_vote_reply(&mut self, now: Duration, from: &Member, b: &Ballot, verdict: PreVerdict) {
        if !matches!(self.role, Role::Follower) {
            return;
        }
        if self.pre_vote.as_ref().is_none_or(|(asked, _)| asked != b) {
            return;
        }
        match verdict {
            PreVerdict::Granted => {
                let config = &self.active_config;
                let voter = config.voters.iter().any(|v| self.same_member(v, from));
                let majority = config.majority();
                let Some((_, granted)) = &mut self.pre_vote else {
                    return;
                };
                if voter {
                    granted.insert(from.node.clone());
                }
                if granted.len() >= majority {
                    self.stand(now, None);
                }
            }
            PreVerdict::Refused { promised } => {
                self.highest_seen = self.highest_seen.max(promised);
            }
            PreVerdict::Stale => self.stand(now, None),
        }
    }

    fn on_promise(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        last: Pos,
        config: Config,
        suffix: Option<Vec<Entry>>,
    ) {
        let Role::Candidate(candidate) = &mut self.role else {
            return;
        };
        if candidate.b != b {
            return;
        }
        // A suffix holds the acceptor's entries after the commit index the candidate sent,
        // and adopting it appends it there: one that starts elsewhere is not a promise a
        // correct acceptor makes (the shape of the rest the host checked).
        if suffix
            .as_ref()
            .and_then(|suffix| suffix.first())
            .is_some_and(|first| Some(first.index) != candidate.commit_at_prepare.checked_add(1))
        {
            tracing::debug!(from = %from.node, "a promise whose suffix starts out of place dropped");
            return;
        }
        let promise = ReceivedPromise {
            member: from.clone(),
            last,
            config,
            suffix,
        };
        candidate.promises.insert(from.node, promise);
        self.evaluate_promises(now);
    }

    fn evaluate_promises(&mut self, now: Duration) {
        let Role::Candidate(candidate) = &self.role else {
            return;
        };
        let by_length = self.mutations.compare_logs_by_length;
        let Some((owner, best)) = candidate.promises.iter().max_by(|(_, a), (_, b)| {
            if by_length {
                a.last.index.cmp(&b.last.index)
            } else {
                a.last.cmp(&b.last)
            }
        }) else {
            return;
        };
        let owner = owner.clone();
        let mut config = best.config.clone();
        if self.mutations.open_with_target_majority
            && let Some(target) = &self.target
        {
            config = Config {
                voters: target.clone(),
                learners: Vec::new(),
            };
        }
        if !self.is_voter_of(&config, &self.me) {
            self.abandon(now);
            return;
        }
        let counted: Vec<Member> = candidate
            .promises
            .values()
            .filter(|promise| self.is_voter_of(&config, &promise.member))
            .map(|promise| promise.member.clone())
            .collect();
        if counted.len() < config.majority() {
            self.ask_unasked_voters(&config);
            return;
        }
        self.adopt(now, &owner, counted);
    }

    /// Whether `a` and `b` are the same member: node and storage (I5).
    fn same_member(&self, a: &Member, b: &Member) -> bool {
        if self.mutations.ignore_storage_id {
            a.node == b.node
        } else {
            a == b
        }
    }

    /// Whether `member` is a voter of `config` (node and storage, I5).
    fn is_voter_of(&self, config: &Config, member: &Member) -> bool {
        config.voters.iter().any(|v| self.same_member(v, member))
    }

    /// R2.3: sends the candidate's `Prepare` to the voters of `config` not asked yet.
    fn ask_unasked_voters(&mut self, config: &Config) {
        let Role::Candidate(candidate) = &mut self.role else {
            return;
        };
        let prepare = Message::Prepare {
            b: candidate.b.clone(),
            last: self.durable.last(),
            commit: candidate.commit_at_prepare,
            handoff_from: candidate.handoff_from.clone(),
        };
        let mut unasked = Vec::new();
        for voter in &config.voters {
            if candidate.asked.insert(voter.node.clone()) {
                unasked.push(voter.clone());
            }
        }
        for voter in unasked {
            self.send(voter, prepare.clone(), true);
        }
    }

    fn adopt(&mut self, now: Duration, owner: &NodeId, promisers: Vec<Member>) {
        let Role::Candidate(candidate) = std::mem::replace(&mut self.role, Role::Follower) else {
            return;
        };
        let b = candidate.b.clone();
        if owner != &self.me.node {
            let Some(best) = candidate.promises.get(owner) else {
                return;
            };
            let Some(suffix) = best.suffix.clone() else {
                // Too far ahead to adopt: let the owner lead.
                self.send(best.member.clone(), Message::TimeoutNow { b }, false);
                self.arm_election(now);
                return;
            };
            self.truncate_after(candidate.commit_at_prepare);
            self.append(suffix);
        }
        let index = self.durable.last().index + 1;
        self.append(vec![Entry {
            ballot: b.clone(),
            index,
            op: Op::EpochStart,
            tag: None,
        }]);
        let voters = self.active_config.voters.clone();
        let mut leader = Leader {
            b: b.clone(),
            epoch_index: index,
            established: false,
            matched: BTreeMap::new(),
            next: BTreeMap::new(),
            hb_seq: 0,
            hb_acked: BTreeMap::new(),
            last_ack: BTreeMap::new(),
            round_sent: BTreeMap::new(),
            since: now,
            writes: BTreeMap::new(),
            reads: Vec::new(),
            round_wanted: false,
            transfer: None,
            held: Vec::new(),
            removing: BTreeMap::new(),
            promisers,
            idle: false,
            fresh_from: BTreeMap::new(),
            last_activity: now,
            snapshots: BTreeMap::new(),
            seq_times: VecDeque::new(),
            verifying: BTreeMap::new(),
            evicting: Vec::new(),
            evicted: Vec::new(),
            lease_acked: BTreeMap::new(),
            lease_forfeited: false,
            appended_at: BTreeMap::new(),
            tailing: BTreeMap::new(),
            paused: None,
            no_pause_before: now,
        };
        for voter in voters.iter().filter(|v| v.node != self.me.node) {
            leader
                .next
                .insert(voter.node.clone(), candidate.commit_at_prepare + 1);
            leader.matched.insert(voter.node.clone(), 0);
        }
        tracing::debug!(
            shard = self.shard,
            b = %b.n,
            epoch = index,
            adopted_from = %owner,
            voters = ?voters.iter().map(|v| v.node.to_string()).collect::<Vec<_>>(),
            "leading"
        );
        self.role = Role::Leader(Box::new(leader));
        self.leader_hint = Some(self.me.node.clone());
        self.election_at = None;
        if self.mutations.config_before_epoch_start {
            self.reconfigure(now);
        }
        self.heartbeat(now);
    }

    fn abandon(&mut self, now: Duration) {
        self.role = Role::Follower;
        self.arm_election(now);
    }

    fn on_reject(&mut self, now: Duration, b: Ballot, reason: RejectReason) {
        let Role::Candidate(candidate) = &self.role else {
            return;
        };
        if candidate.b != b {
            return;
        }
        match reason {
            RejectReason::Higher(higher) => {
                self.highest_seen = self.highest_seen.max(higher.n);
                self.abandon(now);
            }
            RejectReason::Sticky(leader) => {
                self.leader_hint = Some(leader);
                self.abandon(now);
            }
            RejectReason::NoState => {}
            RejectReason::NotVoter(_, config) | RejectReason::Tombstone(_, config) => {
                // R2.3: a newer config exists; ask its voters too.
                self.ask_unasked_voters(&config);
            }
        }
    }

    // ---- R4: replication ----

    #[allow(clippy::too_many_arguments)]
    fn on_append(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        prev: Pos,
        entries: Vec<Entry>,
        leader_commit: u64,
        hb_seq: u64,
    ) {
        if !self.follow(now, &from, &b) {
            return;
        }
        let (prev, entries) = if prev.index < self.durable.base.pos.index {
            // Everything up to the base was applied, hence committed, and a leader whose
            // ballot is not below the promise holds every committed entry: those match.
            let base = self.durable.base.pos.clone();
            let entries = entries
                .into_iter()
                .filter(|entry| entry.index > base.index)
                .collect();
            (base, entries)
        } else {
            (prev, entries)
        };
        if self.durable.pos_at(prev.index) != Some(prev.clone()) {
            // The logs agree at most up to `prev - 1`: hint that, not just the last index.
            // Pipelined `Append`s move the leader's `next` past the follower's last again
            // before this nack arrives, so a last entry that conflicts (a deposed leader's
            // unreplicated suffix) would be probed forever.
            let reason = NackReason::Conflict {
                last: self.durable.last().index.min(prev.index.saturating_sub(1)),
            };
            self.send(from, Message::AppendNack { b, reason }, true);
            return;
        }
        let mut matched = prev.index;
        let mut missing = Vec::new();
        for entry in entries {
            let index = entry.index;
            match self.durable.entry(index) {
                Some(mine) if mine.ballot == entry.ballot => {}
                Some(_) if index <= self.commit => {
                    // R4 forbids this: an established leader never contradicts a committed
                    // entry. Peer bytes must not panic the node, so the whole message is
                    // dropped unacknowledged and the log stays as it is.
                    tracing::debug!(index, "append contradicts a committed entry");
                    return;
                }
                Some(_) => {
                    self.truncate_after(index - 1);
                    missing.push(entry);
                }
                None => missing.push(entry),
            }
            matched = index;
        }
        if !missing.is_empty() {
            self.append(missing);
        }
        let new_commit = leader_commit.min(matched).max(self.commit);
        if new_commit > self.commit {
            self.commit = new_commit;
            self.apply_committed();
        }
        let lease = self.config.lease_reads;
        let ok = Message::AppendOk {
            b,
            matched,
            hb_seq,
            lease,
        };
        self.send(from, ok, true);
    }

    fn on_append_ok(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        matched: u64,
        hb_seq: u64,
        lease: bool,
    ) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if leader.b != b {
            return;
        }
        let config = &self.active_config;
        let member = |m: &Member| {
            if self.mutations.ignore_storage_id {
                m.node == from.node
            } else {
                *m == from
            }
        };
        if !config.voters.iter().chain(&config.learners).any(member) {
            return; // Not a member (I5): a wiped node, or one removed.
        }
        if leader
            .fresh_from
            .get(&from.node)
            .is_some_and(|fresh| hb_seq < *fresh)
        {
            return; // From before it was (re-)added.
        }
        let node = from.node.clone();
        let known = leader.matched.entry(node.clone()).or_insert(0);
        *known = (*known).max(matched);
        let next = leader.next.entry(node.clone()).or_insert(matched + 1);
        *next = (*next).max(matched + 1);
        let acked = leader.hb_acked.entry(node.clone()).or_insert(0);
        *acked = (*acked).max(hb_seq);
        if lease && self.config.lease_reads {
            let granted = leader.lease_acked.entry(node.clone()).or_insert(0);
            *granted = (*granted).max(hb_seq);
        }
        leader.last_ack.insert(node, now);
        self.advance_commit(now);
        self.serve_reads();
        self.appends_wanted = true;
        self.progress_transfer(now);
        self.continue_move(now, &from);
    }

    /// A learner's progress changed, or that of the voter this leader hands off to: if it
    /// caught up, the move goes on now (R5, R7), rather than at the next commit or heartbeat
    /// round (learners do not count towards commits, and the handoff target's acknowledgement
    /// may come after the majority's, so nothing else would look at once).
    fn continue_move(&mut self, now: Duration, from: &Member) {
        let learner = self
            .active_config
            .learners
            .iter()
            .any(|learner| self.same_member(learner, from));
        let handoff_target = self
            .target
            .as_ref()
            .and_then(|target| target.first())
            .is_some_and(|first| first != &self.me && self.same_member(first, from));
        if (learner || handoff_target) && self.established_ballot().is_some() {
            self.reconfigure(now);
            self.settle_pause(now);
        }
    }

    fn on_append_nack(&mut self, now: Duration, from: Member, b: Ballot, reason: NackReason) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if leader.b != b {
            return;
        }
        match reason {
            NackReason::Higher(higher) => {
                tracing::debug!(
                    shard = self.shard,
                    from = %from.node,
                    higher = higher.n,
                    "a follower promised a higher ballot: stepping down"
                );
                self.highest_seen = self.highest_seen.max(higher.n);
                self.step_down(now);
                self.arm_election(now);
            }
            NackReason::Conflict { last } => {
                // Never below what it acknowledged: a reordered `Append` must not walk a live
                // follower back behind the compacted base.
                let matched = leader.matched.get(&from.node).copied().unwrap_or(0);
                let next = leader.next.entry(from.node.clone()).or_insert(1);
                *next = (*next).saturating_sub(1).min(last + 1).max(matched + 1);
                self.appends_wanted = true;
            }
        }
    }

    fn append_write(&mut self, now: Duration, tag: RequestTag, op: Op) {
        self.wake(now);
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if leader.transfer.is_some() || leader.paused.is_some() {
            // R7: held, never appended; answered `Moved` once the target leads. R6: held
            // until the learner caught up.
            leader.held.push((tag, op));
            return;
        }
        let index = self.durable.last().index + 1;
        let entry = Entry {
            ballot: leader.b.clone(),
            index,
            op,
            tag: Some(tag),
        };
        self.append(vec![entry]);
        if let Role::Leader(leader) = &mut self.role {
            leader.writes.insert(index, tag);
        }
        let _ = now;
        self.appends_wanted = true;
    }

    /// Sends each follower what it lacks; with `round`, a heartbeat round to all but, with
    /// `skip_recent`, those sent an `Append` since that time and, with `only`, those not in it.
    fn send_appends(
        &mut self,
        round: bool,
        skip_recent: Option<Duration>,
        only: Option<&[NodeId]>,
    ) {
        let Role::Leader(leader) = &self.role else {
            return;
        };
        let now = self.input_at;
        let b = leader.b.clone();
        let hb_seq = leader.hb_seq;
        let idle = leader.idle;
        let last = self.durable.last().index;
        let active = &self.active_config;
        let voters: Vec<Member> = active
            .voters
            .iter()
            .chain(&active.learners)
            .cloned()
            .collect();
        let mut sends = Vec::new();
        let mut needs_snapshot = Vec::new();
        for voter in voters.iter().filter(|v| v.node != self.me.node) {
            if leader.snapshots.contains_key(&voter.node) {
                continue;
            }
            // A member this leader never sent to (a learner just added, say) is probed now,
            // not at the next heartbeat round: its answer says whether it needs a snapshot.
            let fresh = !leader.next.contains_key(&voter.node);
            let mut next = leader.next.get(&voter.node).copied().unwrap_or(last + 1);
            // It said it holds no entry (an `AppendNack` lowered `next` to 1) and acknowledged none.
            let empty = next == 1 && leader.matched.get(&voter.node).is_none_or(|m| *m == 0);
            let applied_entries = self.durable.applied - self.durable.base.pos.index;
            if next <= self.durable.base.pos.index
                || (empty && applied_entries >= SNAPSHOT_OVER_REPLAY)
            {
                // The entries it needs are compacted (R6), or it holds nothing and a snapshot
                // of the disk is cheaper than replaying the log from the start.
                needs_snapshot.push(voter.clone());
                continue;
            }
            let round = round
                && only.is_none_or(|only| only.contains(&voter.node))
                && skip_recent.is_none_or(|since| {
                    leader
                        .appended_at
                        .get(&voter.node)
                        .is_none_or(|at| *at < since)
                });
            // Up to a window of messages per follower (pipelining); a round sends at least one.
            for window in 0..APPEND_WINDOW {
                if next > last && !((round || fresh) && window == 0) {
                    break;
                }
                let Some((message, sent_to)) = self.append_from(&b, next, hb_seq, idle) else {
                    break;
                };
                sends.push((voter.clone(), message, sent_to));
                next = sent_to + 1;
            }
        }
        for (voter, message, sent_to) in sends {
            self.send_append(now, voter, message, sent_to, hb_seq);
        }
        self.send_snapshots(&voters, needs_snapshot, round);
    }

    /// An `Append` of the entries from `next` on (at most `max_append`) and the index of its
    /// last one, or `None` when the log no longer holds the entry before `next`.
    fn append_from(
        &self,
        b: &Ballot,
        next: u64,
        hb_seq: u64,
        idle: bool,
    ) -> Option<(Message, u64)> {
        let prev = self.durable.pos_at(next.saturating_sub(1))?;
        let entries: Vec<Entry> = self
            .durable
            .entries_after(prev.index)
            .iter()
            .take(self.config.max_append)
            .cloned()
            .collect();
        let sent_to = prev.index + entries.len() as u64;
        let message = Message::Append {
            b: b.clone(),
            prev,
            entries,
            commit: self.commit,
            hb_seq,
            idle,
        };
        Some((message, sent_to))
    }

    /// Sends an `Append` built by [`append_from`](Self::append_from) and notes it: `next`
    /// moves past it, and the round it carries is outstanding at `to`.
    fn send_append(
        &mut self,
        now: Duration,
        to: Member,
        message: Message,
        sent_to: u64,
        hb_seq: u64,
    ) {
        let note_sends = !self.config.heartbeat_skip_recent.is_zero();
        if let Role::Leader(leader) = &mut self.role {
            leader.next.insert(to.node.clone(), sent_to + 1);
            leader.round_sent.insert(to.node.clone(), hb_seq);
            if note_sends {
                leader.appended_at.insert(to.node.clone(), now);
            }
        }
        self.send(to, message, false);
    }

    /// R6: drops the transfers to non-members and starts one for each member in `start`,
    /// then [`pump_snapshots`](Self::pump_snapshots).
    fn send_snapshots(&mut self, members: &[Member], start: Vec<Member>, round: bool) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let mut closed = Vec::new();
        leader.snapshots.retain(|node, send| {
            let member = members.iter().any(|m| &m.node == node && *m == send.to);
            if !member {
                closed.push(send.view);
            }
            member
        });
        for member in start {
            let view = self.next_view;
            self.next_view += 1;
            self.reads.push_back(SnapshotRead::Open {
                view,
                at_least: self.durable.base.pos.index,
            });
            // The first chunk is asked with the view, not once it is open: the shell answers
            // a view's reads in order, so this saves a round trip to it per transfer.
            self.reads.push_back(SnapshotRead::Chunk {
                view,
                seq: 0,
                after: None,
                max_bytes: self.config.snapshot_chunk_bytes,
            });
            // Its tailing (R6) starts over once this copy is in.
            leader.tailing.remove(&member.node);
            leader.snapshots.insert(
                member.node.clone(),
                SnapshotSend {
                    to: member,
                    view,
                    opened: None,
                    afters: vec![None],
                    sizes: Vec::new(),
                    total: None,
                    cached: VecDeque::new(),
                    reading: Some(0),
                    acked: 0,
                    sent: 0,
                    progress: true,
                    failed: false,
                },
            );
        }
        self.reads
            .extend(closed.into_iter().map(|view| SnapshotRead::Close { view }));
        self.pump_snapshots(round);
    }

    /// R6: for each transfer, asks the shell for its next chunk while fewer than
    /// `SNAPSHOT_WINDOW` are unacknowledged, and sends the chunks read up to the window. A
    /// `round` drops failed transfers (the next `send_appends` starts them over on a fresh
    /// view) and, for a transfer without progress since the previous round, resends from the
    /// last acknowledged chunk.
    fn pump_snapshots(&mut self, round: bool) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if round {
            let failed: Vec<NodeId> = leader
                .snapshots
                .iter()
                .filter(|(_, send)| send.failed)
                .map(|(node, _)| node.clone())
                .collect();
            for node in failed {
                if let Some(send) = leader.snapshots.remove(&node) {
                    self.reads
                        .push_back(SnapshotRead::Close { view: send.view });
                }
            }
        }
        let b = leader.b.clone();
        let mut chunks = Vec::new();
        // Members sent their last chunk just now, with that snapshot's base.
        let mut tails = Vec::new();
        for send in leader.snapshots.values_mut() {
            let Some((base, _, _)) = &send.opened else {
                continue;
            };
            if send.failed {
                continue;
            }
            if round {
                if !send.progress {
                    send.sent = send.acked;
                }
                send.progress = false;
            }
            let read = send.next_to_read();
            let readable = usize::try_from(read)
                .ok()
                .and_then(|seq| send.afters.get(seq))
                .filter(|_| send.total.is_none_or(|total| read < total));
            if let Some(after) = readable
                && send.reading.is_none()
                && read < send.acked + SNAPSHOT_WINDOW
            {
                send.reading = Some(read);
                self.reads.push_back(SnapshotRead::Chunk {
                    view: send.view,
                    seq: read,
                    after: after.clone(),
                    max_bytes: self.config.snapshot_chunk_bytes,
                });
            }
            while send.sent < read {
                let seq = send.sent;
                let offset = usize::try_from(seq - send.acked).unwrap_or(usize::MAX);
                let Some(pairs) = send.cached.get(offset) else {
                    break;
                };
                let last = send.total == Some(seq + 1);
                let digest = snapshot_digest(&b, &base.pos, &base.config, seq, pairs, last);
                let message = Message::Snapshot {
                    b: b.clone(),
                    base: base.pos.clone(),
                    config: base.config.clone(),
                    seq,
                    pairs: pairs.clone(),
                    last,
                    digest,
                };
                chunks.push((send.to.clone(), message));
                send.sent += 1;
                if last {
                    tails.push((send.to.clone(), base.pos.index));
                }
            }
        }
        let (hb_seq, idle) = (leader.hb_seq, leader.idle);
        for (to, message) in chunks {
            self.send(to, message, false);
        }
        // The entries after a snapshot's base follow its last chunk at once (in the same batch
        // to that peer, so they normally arrive after it): the receiver makes both durable
        // together and is caught up one round sooner than if they waited for its
        // `SnapshotOk`. Arriving first, they are refused (`Conflict`), and the entries go
        // after the `SnapshotOk` as before.
        for (to, base) in tails {
            if base >= self.durable.last().index {
                continue;
            }
            if let Some((message, sent_to)) = self.append_from(&b, base + 1, hb_seq, idle) {
                self.send_append(self.input_at, to, message, sent_to, hb_seq);
            }
        }
    }

    /// R6 at the leader: a receiver acknowledged chunks, asked for a restart, or holds the
    /// snapshot's state durably.
    fn on_snapshot_ok(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        base: Pos,
        next: u64,
        done: bool,
    ) {
        let config = &self.active_config;
        if !config
            .voters
            .iter()
            .chain(&config.learners)
            .any(|m| self.same_member(m, &from))
        {
            return; // Not a member (I5).
        }
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if leader.b != b {
            return;
        }
        let node = from.node.clone();
        leader.last_ack.insert(node.clone(), now);
        let ours = leader.snapshots.get(&node).is_some_and(|send| {
            send.opened
                .as_ref()
                .is_some_and(|(view, _, _)| view.pos == base)
        });
        if done {
            let known = leader.matched.entry(node.clone()).or_insert(0);
            *known = (*known).max(base.index);
            let next_index = leader.next.entry(node.clone()).or_insert(base.index + 1);
            *next_index = (*next_index).max(base.index + 1);
            if ours && let Some(send) = leader.snapshots.remove(&node) {
                self.reads
                    .push_back(SnapshotRead::Close { view: send.view });
            }
            self.advance_commit(now);
            self.progress_transfer(now);
            self.continue_move(now, &from);
        } else if ours && let Some(send) = leader.snapshots.get_mut(&node) {
            // Acknowledgements are cumulative. One below `acked` means the receiver lost its
            // partial copy (a bad chunk, a restart) or is an old one arriving late: resend from
            // there (reading those chunks again), and a late one is corrected by the next.
            // Lost chunks are resent by the next round without progress.
            let known = send.sizes.len() as u64;
            if next > send.acked && next <= known {
                let passed = usize::try_from(next - send.acked).unwrap_or(usize::MAX);
                send.cached.drain(..passed.min(send.cached.len()));
                send.acked = next;
                send.progress = true;
                send.sent = send.sent.max(next);
            } else if next < send.acked {
                send.cached.clear();
                send.acked = next;
                send.sent = next;
            }
        }
        self.appends_wanted = true;
    }

    /// R4's ballot rules for a message from the leader of `b` (an `Append` or a snapshot
    /// chunk): refuses a lower ballot (`Nack(Higher)`), else adopts `b` durably, follows its
    /// leader and restarts the election timer. A tombstoned replica goes on only if `b` may
    /// re-add it. Returns whether the message may be handled.
    fn follow(&mut self, now: Duration, from: &Member, b: &Ballot) -> bool {
        self.highest_seen = self.highest_seen.max(b.n);
        if !self.revive_for(now, b) {
            return false; // Removed (R8), and not by a leader that re-added it.
        }
        if let Some(promised) = &self.durable.promised
            && b < promised
        {
            let reason = NackReason::Higher(promised.clone());
            let nack = Message::AppendNack {
                b: b.clone(),
                reason,
            };
            self.send(from.clone(), nack, false);
            return false;
        }
        if self.durable.promised.as_ref() != Some(b) {
            self.promise(b.clone());
        }
        if self.leading_ballot() != Some(b) {
            self.step_down(now);
        }
        self.leader_hint = Some(b.node.clone());
        self.last_heard = Some(now);
        self.pre_vote = None;
        self.arm_election(now);
        true
    }

    /// R8's "returns only as a new learner": a tombstoned replica takes `Append`s or a
    /// snapshot only from a leader of a ballot at least that of the config that removed it
    /// (such a leader holds that config, so a config naming this replica again is a later
    /// one: a re-add). It then starts over empty, keeping its promise, in one durable change.
    /// Returns whether the replica may go on (it is not, or no longer, tombstoned).
    fn revive_for(&mut self, now: Duration, b: &Ballot) -> bool {
        let Some(tombstone) = &self.durable.tombstone else {
            return true;
        };
        let removed_at = tombstone.last.ballot.as_ref();
        let newer = removed_at.is_none_or(|removed| b >= removed)
            && tombstone
                .promised
                .as_ref()
                .is_none_or(|promised| b >= promised);
        if !newer {
            return false;
        }
        let base = Base {
            pos: Pos::ORIGIN,
            config: Config::default(),
        };
        self.durable.promised = self.durable.promised.clone().or(tombstone.promised.clone());
        self.durable.tombstone = None;
        // Its retired copy goes with the empty state installed below.
        self.retire_at = None;
        self.durable.log.clear();
        self.durable.kv.clear();
        self.durable.applied = 0;
        self.durable.base = base.clone();
        self.set_config_at(None);
        self.commit = 0;
        self.durable_last = 0;
        self.open_batch.push(Change::InstallSnapshot {
            base,
            kv: StateImage::default(),
        });
        if self.open_since.is_none() {
            self.open_since = Some(now);
        }
        true
    }

    /// R6 at the receiver: follows R4's ballot rules, checks the chunk's digest, gathers
    /// chunks in order in volatile state, and installs on the last one.
    fn on_snapshot(&mut self, now: Duration, from: Member, b: Ballot, chunk: SnapshotChunk) {
        if !self.follow(now, &from, &b) {
            return;
        }
        let reply = |next: u64, done: bool| Message::SnapshotOk {
            b: b.clone(),
            base: chunk.base.clone(),
            next,
            done,
        };
        let digest = snapshot_digest(
            &b,
            &chunk.base,
            &chunk.config,
            chunk.seq,
            &chunk.pairs,
            chunk.last,
        );
        if digest != chunk.digest {
            tracing::debug!(seq = chunk.seq, "snapshot chunk with a bad digest");
            self.incoming = None;
            let message = reply(0, false);
            self.send(from, message, false);
            return;
        }
        if chunk.base.index <= self.durable.applied {
            // This state, or a newer one, is already here.
            if self
                .incoming
                .as_ref()
                .is_some_and(|incoming| incoming.base.index <= self.durable.applied)
            {
                self.incoming = None;
            }
            let message = reply(0, true);
            self.send(from, message, true);
            return;
        }
        // A first chunk starts the transfer over, even of the same base: the leader sends one
        // only when it starts a transfer, or resends the first because none was acknowledged.
        let fresh = self.incoming.as_ref().is_none_or(|incoming| {
            incoming.b != b || incoming.base != chunk.base || (chunk.seq == 0 && incoming.next > 0)
        });
        if fresh {
            if chunk.seq > 1 {
                let message = reply(0, false);
                self.send(from, message, false);
                return;
            }
            let incoming = self.incoming.insert(SnapshotReceive {
                b: b.clone(),
                base: chunk.base.clone(),
                config: chunk.config.clone(),
                next: 0,
                pairs: Vec::new(),
                ahead: None,
            });
            if chunk.seq == 1 {
                // The second chunk overtook the first (a transfer starts with two in flight):
                // kept for when the first arrives, unanswered, where asking to start over
                // would, once late, rewind a transfer already under way.
                incoming.ahead = Some((chunk.seq, chunk.pairs, chunk.last));
                return;
            }
        }
        let Some(incoming) = self.incoming.as_mut() else {
            return;
        };
        if chunk.config != incoming.config {
            // One leader's chunks of one base all carry its config: a forged or broken
            // transfer; start over.
            self.incoming = None;
            let message = reply(0, false);
            self.send(from, message, false);
            return;
        }
        if chunk.seq != incoming.next {
            if chunk.seq == incoming.next + 1 {
                incoming.ahead = Some((chunk.seq, chunk.pairs, chunk.last));
            }
            // A duplicate or a gap: acknowledge what is here (cumulative).
            let message = reply(incoming.next, false);
            self.send(from, message, false);
            return;
        }
        let mut last = chunk.last;
        incoming.pairs.extend(chunk.pairs);
        incoming.next += 1;
        if !last
            && let Some((seq, pairs, ahead_last)) = incoming.ahead.take()
            && seq == incoming.next
        {
            incoming.pairs.extend(pairs);
            incoming.next += 1;
            last = ahead_last;
        }
        let next = incoming.next;
        if !last {
            let message = reply(next, false);
            self.send(from, message, false);
            return;
        }
        if let Some(incoming) = self.incoming.take() {
            self.install(now, incoming);
        }
        let message = reply(next, true);
        self.send(from, message, true);
    }

    /// Replaces log, state, `applied` and base with a received snapshot, in one change.
    fn install(&mut self, now: Duration, incoming: SnapshotReceive) {
        let base = Base {
            pos: incoming.base,
            config: incoming.config,
        };
        let index = base.pos.index;
        tracing::debug!(
            shard = self.shard,
            base = index,
            pairs = incoming.pairs.len(),
            "snapshot installed"
        );
        let image = self.image_of(incoming.pairs);
        self.durable.log.clear();
        self.durable.kv = KvState::from_image(image.clone());
        self.durable.applied = index;
        self.durable.base = base.clone();
        self.commit = self.commit.max(index);
        self.set_config_at(None);
        self.durable_last = self.durable_last.min(index);
        for (_, _, last) in self.unpersisted.iter_mut() {
            *last = (*last).min(index);
        }
        self.open_batch
            .push(Change::InstallSnapshot { base, kv: image });
        self.answer_verify();
        self.arm_election(now);
    }

    /// The image of a received snapshot's pairs. The leader sends them in key order, so they
    /// go straight into the image; pairs out of order are sorted first, a key sent twice
    /// keeping its last value.
    fn image_of(&mut self, mut pairs: Pairs) -> StateImage {
        if self.mutations.corrupt_next_install
            && let Some((_, value)) = pairs.first_mut()
        {
            self.mutations.corrupt_next_install = false;
            value.push(b'!');
        }
        let size = pairs
            .iter()
            .map(|(key, value)| image::pair_size(key, value))
            .sum();
        let mut builder = ImageBuilder::with_capacity(size);
        for (key, value) in &pairs {
            if builder.push(key, value).is_err() {
                let sorted: BTreeMap<Vec<u8>, Vec<u8>> = pairs.into_iter().collect();
                return StateImage::from_map(&sorted);
            }
        }
        builder.finish()
    }

    /// Log compaction: once `compact_after` applied entries sit after the base, the base moves
    /// up to the applied index less a quarter of `compact_after`; a leader keeps what the
    /// members it heard from within `t_elect` still need (but not learners it gave up on
    /// after `t_catchup`), unless its log is over the hard cap.
    fn maybe_compact(&mut self, now: Duration) {
        let every = self.config.compact_after.max(1);
        let base = self.durable.base.pos.index;
        let applied = self.durable.applied;
        if applied.saturating_sub(base) < every || self.durable.tombstone.is_some() {
            return;
        }
        let over_cap =
            self.durable.last().index.saturating_sub(base) > every.saturating_mul(COMPACT_HARD_CAP);
        // The last quarter stays: a snapshot is read from the disk, whose state lags the
        // applied index by the fold's delay, and is useless below the log's base. Compacted
        // to the applied index, a shard whose move started soon after a compaction waited
        // for the next fold, which under a join's load took 0.1-0.6 s (BENCHMARKS.md, issue
        // 6, session 41).
        let mut upto = if over_cap {
            applied
        } else {
            applied.saturating_sub(every / 4)
        };
        if let Role::Leader(leader) = &self.role
            && !over_cap
        {
            if now.saturating_sub(leader.since) < self.config.t_elect {
                return; // Not heard from every live follower yet.
            }
            let window_start = now.saturating_sub(self.config.t_elect);
            let config = &self.active_config;
            for member in config.voters.iter().chain(&config.learners) {
                let live = leader
                    .last_ack
                    .get(&member.node)
                    .is_some_and(|at| *at >= window_start);
                let given_up = leader
                    .tailing
                    .get(&member.node)
                    .is_some_and(|tailing| tailing.given_up);
                if member.node == self.me.node || !live || given_up {
                    continue;
                }
                // A transfer needs the entries after its view; one still opening, every entry
                // not compacted yet.
                let needs = match leader.snapshots.get(&member.node) {
                    Some(send) => send
                        .opened
                        .as_ref()
                        .map_or(base, |(view, _, _)| view.pos.index),
                    None => leader.matched.get(&member.node).copied().unwrap_or(0),
                };
                upto = upto.min(needs);
            }
        }
        if upto <= base || (upto - base < (every / 2).max(1) && !over_cap) {
            return;
        }
        let Some(pos) = self.durable.pos_at(upto) else {
            return;
        };
        let new_base = Base {
            pos,
            config: self.durable.config_at(upto).clone(),
        };
        let drop = usize::try_from(upto - base)
            .unwrap_or(usize::MAX)
            .min(self.durable.log.len());
        self.durable.log.drain(..drop);
        self.durable.base = new_base.clone();
        if self.config_at.is_some_and(|at| at <= upto) {
            self.set_config_at(None);
        }
        self.open_batch.push(Change::Compact { base: new_base });
    }

    fn advance_commit(&mut self, now: Duration) {
        let Role::Leader(leader) = &self.role else {
            return;
        };
        // The highest index a majority of the active config's voters hold (the leader counts
        // only its durable copy), then Raft's rule: only an entry of this ballot commits by
        // counting (Figure 8); everything before it commits with it.
        let config = &self.active_config;
        let mut held: Vec<u64> = config
            .voters
            .iter()
            .map(|voter| {
                if voter.node == self.me.node {
                    self.durable_last
                } else {
                    leader.matched.get(&voter.node).copied().unwrap_or(0)
                }
            })
            .collect();
        held.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&majority_holds) = held.get(config.majority() - 1) else {
            return;
        };
        let ours = self
            .durable
            .entry(majority_holds)
            .is_some_and(|entry| entry.ballot == leader.b);
        let new_commit = if ours || self.mutations.commit_old_ballot_entries {
            majority_holds.min(self.durable.last().index)
        } else {
            self.commit
        };
        if new_commit > self.commit {
            let before = self.commit;
            self.commit = new_commit;
            self.note_removals(before);
            self.apply_committed();
            let mut newly_established = false;
            if let Role::Leader(leader) = &mut self.role
                && self.commit >= leader.epoch_index
            {
                newly_established = !leader.established;
                leader.established = true;
            }
            if newly_established {
                self.note_past_removals();
            }
            self.serve_reads();
            if self.established_ballot().is_some() {
                self.reconfigure(now);
                self.settle_pause(now);
            }
        }
    }

    /// R8 after a leader change: the members that configs in the log dropped, and that the
    /// active config does not name again, may never have heard `Removed` from the leader that
    /// dropped them (it lost its leadership first), and would keep their copies for good; this
    /// leader tells them too. One that tombstoned already only acknowledges.
    fn note_past_removals(&mut self) {
        self.note_removals(self.durable.base.pos.index);
        let active = self.active_config.clone();
        if let Role::Leader(leader) = &mut self.role {
            leader.removing.retain(|_, removing| {
                !active.voters.contains(&removing.member)
                    && !active.learners.contains(&removing.member)
            });
        }
    }

    /// R8: members dropped by configs committed after `before` are told `Removed`.
    fn note_removals(&mut self, before: u64) {
        let mut removed = Vec::new();
        for index in before + 1..=self.commit {
            let Some(entry) = self.durable.entry(index) else {
                continue;
            };
            let Op::Config(config) = &entry.op else {
                continue;
            };
            let previous = self.durable.config_at(index.saturating_sub(1)).clone();
            for member in previous.voters.iter().chain(&previous.learners) {
                if !config.voters.contains(member) && !config.learners.contains(member) {
                    removed.push((member.clone(), entry.pos(), config.clone()));
                }
            }
        }
        if let Role::Leader(leader) = &mut self.role {
            for (member, config_pos, config) in removed {
                let matched = leader.matched.get(&member.node).copied().unwrap_or(0);
                let removing = Removing {
                    member,
                    config_pos,
                    config,
                    matched,
                };
                leader
                    .removing
                    .insert(removing.member.node.clone(), removing);
            }
        }
    }

    /// R5: one step toward the target, if the last config committed; R7 when this leader is
    /// not the target's first.
    fn reconfigure(&mut self, now: Duration) {
        let Some(target) = &self.target else {
            return;
        };
        let Role::Leader(leader) = &self.role else {
            return;
        };
        // Settled: the config is the target, led by its first voter. Decided here without
        // the copies the steps below make (this runs every heartbeat round).
        let current = &self.active_config;
        if current.voters == *target
            && current.learners.is_empty()
            && leader.evicting.is_empty()
            && target.first() == Some(&self.me)
        {
            return;
        }
        let target = target.clone();
        let early = self.mutations.config_before_epoch_start;
        if !(leader.established || early) || leader.transfer.is_some() {
            return;
        }
        let pending = self
            .durable
            .entries_after(self.commit)
            .iter()
            .any(|entry| matches!(entry.op, Op::Config(_)));
        if pending {
            return;
        }
        let active = self.active_config.clone();
        let caught_up = |member: &Member| {
            holds_committed(
                leader.matched.get(&member.node).copied().unwrap_or(0),
                self.commit,
            )
        };
        let mut next = active.clone();
        let mut promoted = None;
        let mut evicted = None;
        let bad_copy = leader.evicting.iter().find(|m| {
            m.node != self.me.node && (active.voters.contains(m) || active.learners.contains(m))
        });
        if let Some(bad) = bad_copy {
            evicted = Some(bad.clone());
            // Its copy differed from this leader's: out, whatever the target says (R8 then
            // tombstones it; the target adds it again as a learner, which starts over).
            next.voters.retain(|v| v != bad);
            next.learners.retain(|l| l != bad);
        } else if let Some(stale) = active.learners.iter().find(|l| !target.contains(l)) {
            next.learners.retain(|l| l != stale);
        } else if let Some(new) = target.iter().find(|m| {
            !active.voters.contains(m)
                && !active.learners.contains(m)
                && !leader.evicted.contains(m)
        }) {
            next.learners.push(new.clone());
        } else if let Some(ready) = active.learners.iter().find(|l| caught_up(l)) {
            next.learners.retain(|l| l != ready);
            next.voters.push(ready.clone());
            promoted = Some(ready.clone());
        } else if !active.learners.is_empty() {
            return; // Wait for the learners to catch up.
        } else if let Some(old) = active
            .voters
            .iter()
            .find(|v| !target.contains(v) && v.node != self.me.node)
            .filter(|_| active.voters.len() > self.config.min_voters.max(1))
        {
            next.voters.retain(|v| v != old);
        } else if target.first() != Some(&self.me) {
            // R7: hand off to the target's first voter, once caught up, at most every
            // T_stable.
            let Some(first) = target.first().filter(|m| active.voters.contains(m)) else {
                return;
            };
            if self.handoff_held && target.contains(&self.me) {
                return;
            }
            let recently = self
                .last_handoff
                .is_some_and(|at| now.saturating_sub(at) < T_STABLE);
            if recently || !caught_up(first) {
                return;
            }
            self.last_handoff = Some(now);
            tracing::debug!(shard = self.shard, to = %first.node, "handing off");
            let deadline = now + self.config.t_elect;
            if let Role::Leader(leader) = &mut self.role {
                leader.transfer = Some(Transfer {
                    to: first.clone(),
                    deadline,
                    sent: false,
                });
            }
            self.progress_transfer(now);
            return;
        } else {
            let mut ordered: Vec<Member> = target
                .iter()
                .filter(|m| active.voters.contains(m))
                .cloned()
                .collect();
            ordered.extend(
                active
                    .voters
                    .iter()
                    .filter(|v| !target.contains(v))
                    .cloned(),
            );
            if ordered == active.voters {
                return;
            }
            next.voters = ordered;
        }
        if next == active {
            return;
        }
        // A member added (perhaps again, after a removal) starts with no known progress.
        if let Role::Leader(leader) = &mut self.role {
            for added in next
                .learners
                .iter()
                .filter(|l| !active.learners.contains(l) && !active.voters.contains(l))
            {
                // Acknowledgements still in flight from its previous membership (same ballot)
                // must not count: only those of rounds after this one do.
                leader.hb_seq += 1;
                if self.config.lease_reads {
                    leader.seq_times.push_back((leader.hb_seq, now));
                }
                leader.fresh_from.insert(added.node.clone(), leader.hb_seq);
                leader.matched.remove(&added.node);
                // Taken to hold nothing, so it gets the log from the start, or a snapshot
                // once the log is compacted, without a probe's round trip first. A copy it
                // does hold (a member re-added) is replaced, or kept when it is newer.
                leader.next.insert(added.node.clone(), 1);
                leader.hb_acked.remove(&added.node);
                leader.lease_acked.remove(&added.node);
                leader.last_ack.remove(&added.node);
                leader.removing.remove(&added.node);
                leader.tailing.remove(&added.node);
            }
        }
        let Role::Leader(leader) = &self.role else {
            return;
        };
        let entry = Entry {
            ballot: leader.b.clone(),
            index: self.durable.last().index + 1,
            op: Op::Config(next.clone()),
            tag: None,
        };
        tracing::debug!(
            shard = self.shard,
            index = entry.index,
            voters = ?next.voters.iter().map(|v| v.node.as_str()).collect::<Vec<_>>(),
            learners = ?next.learners.iter().map(|l| l.node.as_str()).collect::<Vec<_>>(),
            "config change"
        );
        self.append(vec![entry]);
        self.appends_wanted = true;
        if let Role::Leader(leader) = &mut self.role {
            leader
                .evicting
                .retain(|m| next.voters.contains(m) || next.learners.contains(m));
            leader.evicted.extend(evicted);
        }
        if let Some(member) = promoted
            && self.config.verify_copies
        {
            self.start_verify(now, member, 0);
        }
        self.wake(now);
    }

    // ---- copy verification (after a move) ----

    /// Asks `member` for its copy's checksums at this leader's applied index (everything
    /// committed is applied here, and a caught-up member applies it soon), keeping its own.
    fn start_verify(&mut self, now: Duration, member: Member, attempts: u32) {
        let index = self.durable.applied;
        let own = copy_checksums(&self.durable.kv, self.config.snapshot_chunk_bytes);
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let b = leader.b.clone();
        let verifying = Verifying {
            member: member.clone(),
            index,
            own,
            asked_at: now,
            attempts: attempts + 1,
        };
        leader.verifying.insert(member.node.clone(), verifying);
        self.send(member, Message::Verify { b, index }, false);
    }

    /// A leader's `Verify`: answered once this replica has applied exactly `index`.
    fn on_verify(&mut self, from: Member, b: Ballot, index: u64) {
        if self.durable.promised.as_ref() != Some(&b) || matches!(self.role, Role::Leader(_)) {
            return; // Not from the leader this replica follows.
        }
        self.verify_asked = Some((from, b, index));
        self.answer_verify();
    }

    /// Answers the pending `Verify` if this replica's applied index has reached it.
    fn answer_verify(&mut self) {
        let Some((_, _, index)) = &self.verify_asked else {
            return;
        };
        let chunks = match self.durable.applied.cmp(index) {
            std::cmp::Ordering::Less => return,
            std::cmp::Ordering::Equal => Some(copy_checksums(
                &self.durable.kv,
                self.config.snapshot_chunk_bytes,
            )),
            std::cmp::Ordering::Greater => None,
        };
        let Some((to, b, index)) = self.verify_asked.take() else {
            return;
        };
        self.send(to, Message::VerifyOk { b, index, chunks }, false);
    }

    fn on_verify_ok(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        index: u64,
        chunks: Option<Vec<[u8; 16]>>,
    ) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if leader.b != b {
            return;
        }
        let Some(verifying) = leader.verifying.get(&from.node) else {
            return;
        };
        if verifying.member != from || verifying.index != index {
            return;
        }
        let Some(verifying) = leader.verifying.remove(&from.node) else {
            return;
        };
        let Some(chunks) = chunks else {
            // It had applied past the index: ask again at the current one.
            self.retry_verify(now, verifying);
            return;
        };
        let first_difference = verifying
            .own
            .iter()
            .zip(&chunks)
            .position(|(ours, theirs)| ours != theirs)
            .or_else(|| {
                (verifying.own.len() != chunks.len()).then(|| verifying.own.len().min(chunks.len()))
            });
        match first_difference {
            None => self.verify_outcomes.push_back(VerifyOutcome::Verified {
                member: from,
                index,
                chunks: chunks.len(),
            }),
            Some(first_difference) => {
                tracing::warn!(
                    shard = self.shard,
                    member = %from.node,
                    index,
                    first_difference,
                    "a copy differs from its leader's: removing it, to be added again"
                );
                self.verify_outcomes.push_back(VerifyOutcome::Mismatch {
                    member: from.clone(),
                    index,
                    first_difference,
                });
                leader.evicting.push(from);
                self.reconfigure(now);
            }
        }
    }

    /// Asks again at the current index, or gives up after [`VERIFY_ATTEMPTS`].
    fn retry_verify(&mut self, now: Duration, verifying: Verifying) {
        if verifying.attempts >= VERIFY_ATTEMPTS {
            self.verify_outcomes.push_back(VerifyOutcome::Unverified {
                member: verifying.member,
            });
        } else {
            self.start_verify(now, verifying.member, verifying.attempts);
        }
    }

    /// Verifications that waited [`VERIFY_PATIENCE`]: asked again (the member may have been
    /// down, or the message lost), or given up; those of members no longer in the config end.
    fn expire_verifications(&mut self, now: Duration) {
        if !matches!(&self.role, Role::Leader(leader) if !leader.verifying.is_empty()) {
            return; // Every heartbeat of every shard comes here: nothing to copy then.
        }
        let active = self.active_config.clone();
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        leader.verifying.retain(|_, v| {
            active.voters.contains(&v.member) || active.learners.contains(&v.member)
        });
        let overdue: Vec<NodeId> = leader
            .verifying
            .iter()
            .filter(|(_, v)| now.saturating_sub(v.asked_at) >= VERIFY_PATIENCE)
            .map(|(node, _)| node.clone())
            .collect();
        for node in overdue {
            let Role::Leader(leader) = &mut self.role else {
                return;
            };
            if let Some(verifying) = leader.verifying.remove(&node) {
                self.retry_verify(now, verifying);
            }
        }
    }

    /// R6's "r ≤ w": notes which learners tail the log, pauses new writes for one that has
    /// not caught up within `catchup_patience`, and gives up on one after `t_catchup`.
    /// Called every heartbeat round. A learner that no longer acknowledges within `t_elect`
    /// pauses nothing: the writes would wait for no one.
    fn pace_learners(&mut self, now: Duration) {
        self.settle_pause(now);
        let commit = self.commit;
        let patience = self.config.catchup_patience;
        let pause = self.config.catchup_pause;
        let t_catchup = self.config.t_catchup;
        let window_start = now.saturating_sub(self.config.t_elect);
        let learners = &self.active_config.learners;
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let snapshots = &leader.snapshots;
        leader.tailing.retain(|node, _| {
            !snapshots.contains_key(node) && learners.iter().any(|l| &l.node == node)
        });
        if !leader.established {
            return;
        }
        for learner in learners.iter().filter(|l| l.node != self.me.node) {
            if leader.snapshots.contains_key(&learner.node) {
                continue;
            }
            let tailing = leader
                .tailing
                .entry(learner.node.clone())
                .or_insert_with(|| Tailing {
                    since: now,
                    given_up: false,
                });
            if tailing.given_up {
                // Given up for a `t_catchup`: a learner that lags too little for the log to
                // be compacted past it gets no snapshot, and would otherwise wait for good.
                if now.saturating_sub(tailing.since) >= t_catchup.saturating_mul(2) {
                    tailing.since = now;
                    tailing.given_up = false;
                }
                continue;
            }
            if now.saturating_sub(tailing.since) >= t_catchup {
                tailing.given_up = true;
                tracing::warn!(
                    shard = self.shard,
                    learner = %learner.node,
                    matched = leader.matched.get(&learner.node).copied().unwrap_or(0),
                    commit,
                    "a learner did not catch up within t_catchup: no longer keeping the log for it"
                );
                continue;
            }
            let matched = leader.matched.get(&learner.node).copied().unwrap_or(0);
            let live = leader
                .last_ack
                .get(&learner.node)
                .is_some_and(|at| *at >= window_start);
            if patience.is_zero()
                || !live
                || holds_committed(matched, commit)
                || now.saturating_sub(tailing.since) < patience
                || now < leader.no_pause_before
                || leader.paused.is_some()
                || leader.transfer.is_some()
            {
                continue;
            }
            leader.no_pause_before = now + pause + patience;
            tracing::info!(
                shard = self.shard,
                learner = %learner.node,
                lag = commit.saturating_sub(matched),
                "a learner is not catching up: pausing new writes"
            );
            leader.paused = Some(Pause {
                learner: learner.node.clone(),
                until: now + pause,
            });
        }
    }

    /// Ends a pause of writes (R6) once its learner is no learner any more (promoted, or
    /// removed) or its time is up, and appends the writes it held.
    fn settle_pause(&mut self, now: Duration) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let Some(pause) = &leader.paused else {
            return;
        };
        let learner = &pause.learner;
        let still_learner = self
            .active_config
            .learners
            .iter()
            .any(|l| &l.node == learner);
        if still_learner && now < pause.until {
            return;
        }
        leader.paused = None;
        // A handoff that started meanwhile holds them again (`append_write`).
        let held = std::mem::take(&mut leader.held);
        for (tag, op) in held {
            self.append_write(now, tag, op);
        }
    }

    /// R7 (2): once the target holds everything committed, ask it to stand; (5) give up at
    /// the deadline.
    fn progress_transfer(&mut self, now: Duration) {
        let last = self.durable.last().index;
        let commit = self.commit;
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let Some(transfer) = &mut leader.transfer else {
            return;
        };
        if now > transfer.deadline {
            leader.transfer = None;
            let held = std::mem::take(&mut leader.held);
            for (tag, op) in held {
                self.append_write(now, tag, op);
            }
            return;
        }
        let matched = leader.matched.get(&transfer.to.node).copied().unwrap_or(0);
        if !transfer.sent && matched == last && commit == last {
            transfer.sent = true;
            // Its voters may promise the target from now on (R9).
            leader.lease_forfeited = self.config.lease_reads;
            let to = transfer.to.clone();
            let b = leader.b.clone();
            self.send(to, Message::TimeoutNow { b }, false);
        }
    }

    /// R8 at the removed replica: tombstone durably, acknowledge.
    fn on_removed(
        &mut self,
        now: Duration,
        from: Member,
        b: Ballot,
        config_pos: Pos,
        config: Config,
        matched: u64,
    ) {
        if config.voters.contains(&self.me) || config.learners.contains(&self.me) {
            return;
        }
        if self.durable.tombstone.is_none() {
            // The entries known committed here: up to the removing config if this log holds
            // it (Log Matching), or up to where the remover last saw this log match its own,
            // if no other leader has written here since (still at its ballot).
            let committed = if self.durable.pos_at(config_pos.index) == Some(config_pos.clone()) {
                config_pos.index
            } else if self.durable.promised.as_ref() == Some(&b) {
                matched.min(config_pos.index)
            } else {
                0
            };
            self.decide_undecided_upto(committed);
            let tombstone = Tombstone {
                promised: self.durable.promised.clone(),
                last: self.durable.last().max(config_pos),
                config,
            };
            self.step_down(now);
            self.durable.log.clear();
            self.durable.kv.clear();
            self.set_config_at(None);
            self.durable.tombstone = Some(tombstone.clone());
            self.open_batch.push(Change::Tombstone(tombstone));
            self.election_at = None;
            self.retire(now);
        }
        self.send(from, Message::RemovedOk { b }, true);
    }

    /// Answers the undecided writes at indices up to `committed` (known committed here): `Ok`
    /// where this log holds the write's own entry, `Superseded` where it holds another one,
    /// `Indeterminate` where it holds none (compacted).
    fn decide_undecided_upto(&mut self, committed: u64) {
        let decided: Vec<u64> = self
            .undecided
            .range(..=committed)
            .map(|(i, _)| *i)
            .collect();
        for index in decided {
            let Some((tag, b, _)) = self.undecided.remove(&index) else {
                continue;
            };
            let reply = match self.durable.entry(index) {
                Some(entry) => decided_reply(entry, tag, &b),
                None => ClientReply::Indeterminate,
            };
            self.replies.push_back((tag, reply));
        }
    }

    /// Schedules the deletion of this tombstoned replica's retired copy, or deletes it now
    /// with a zero grace period.
    fn retire(&mut self, now: Duration) {
        if self.config.retired_grace.is_zero() {
            self.drop_retired(now);
        } else {
            self.retire_at = Some(now + self.config.retired_grace);
        }
    }

    fn drop_retired(&mut self, now: Duration) {
        self.retire_at = None;
        if self.durable.tombstone.is_some() {
            tracing::debug!(shard = self.shard, "retired copy deleted");
            self.open_batch.push(Change::DropRetired);
            if self.open_since.is_none() {
                self.open_since = Some(now);
            }
        }
    }

    fn apply_committed(&mut self) {
        while self.durable.applied < self.commit {
            let index = self.durable.applied + 1;
            let Some(entry) = self.durable.entry(index) else {
                break;
            };
            let decided = self
                .undecided
                .remove(&index)
                .map(|(tag, b, _)| (tag, decided_reply(entry, tag, &b)));
            self.durable.apply_entry(index);
            self.durable.applied = index;
            self.open_batch.push(Change::Applied { index });
            if let Role::Leader(leader) = &mut self.role
                && let Some(tag) = leader.writes.remove(&index)
            {
                self.replies
                    .push_back((tag, ClientReply::Ok { value: None }));
            }
            if let Some(decided) = decided {
                self.replies.push_back(decided);
            }
            if self
                .verify_asked
                .as_ref()
                .is_some_and(|(_, _, asked)| *asked == index)
            {
                self.answer_verify();
            }
        }
    }

    // ---- R9: reads ----

    fn serve_reads(&mut self) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if !leader.established {
            return;
        }
        if leader.reads.is_empty() {
            return;
        }
        let config = &self.active_config;
        // The newest round a majority of the voters acknowledged (the leader acknowledges
        // every round): a read's round is confirmed exactly when it is at most this.
        let mut acked: Vec<u64> = config
            .voters
            .iter()
            .map(|voter| {
                if voter.node == self.me.node {
                    u64::MAX
                } else {
                    leader.hb_acked.get(&voter.node).copied().unwrap_or(0)
                }
            })
            .collect();
        acked.sort_unstable_by(|a, b| b.cmp(a));
        let confirmed = config
            .majority()
            .checked_sub(1)
            .and_then(|at| acked.get(at).copied())
            .unwrap_or(0);
        let applied = self.durable.applied;
        let mut served = Vec::new();
        leader.reads.retain(|read| {
            if read.round == 0 || read.round > confirmed || applied < read.read_index {
                return true;
            }
            served.push((read.tag, self.durable.kv.get(&read.key).map(<[u8]>::to_vec)));
            false
        });
        for (tag, value) in served {
            self.replies.push_back((tag, ClientReply::Ok { value }));
        }
    }

    /// R9's lease: an established leader that has not started a handoff this ballot, a
    /// majority of whose voters (itself included) acknowledged a message sent less than
    /// `t_elect·(1−ρ)` ago, each of them keeping lease promises. Those voters promise no other ballot for `t_elect` after they
    /// received it, so no other leader can exist yet.
    fn holds_lease(&self, now: Duration) -> bool {
        let Role::Leader(leader) = &self.role else {
            return false;
        };
        if !self.config.lease_reads || !leader.established || leader.lease_forfeited {
            return false;
        }
        let config = &self.active_config;
        let mut acked: Vec<u64> = config
            .voters
            .iter()
            .filter(|voter| voter.node != self.me.node)
            .map(|voter| leader.lease_acked.get(&voter.node).copied().unwrap_or(0))
            .collect();
        let counts_itself = usize::from(config.voters.iter().any(|v| v.node == self.me.node));
        let Some(needed) = config.majority().checked_sub(counts_itself) else {
            return false;
        };
        if needed == 0 {
            return true; // The only voter.
        }
        acked.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&seq) = acked.get(needed - 1) else {
            return false;
        };
        // The newest sequence number taken at or before `seq` (older ones were dropped only
        // once too old to hold a lease).
        let taken = leader.seq_times.partition_point(|(s, _)| *s <= seq);
        let Some(taken) = taken.checked_sub(1) else {
            return false;
        };
        let (_, sent) = leader.seq_times[taken];
        let lease_span = self.config.t_elect - self.config.t_elect / LEASE_DRIFT_DIVISOR;
        now < sent + lease_span
    }

    // ---- R11: heartbeats and check-quorum ----

    fn heartbeat(&mut self, now: Duration) {
        let Role::Leader(leader) = &mut self.role else {
            self.heartbeat_at = None;
            return;
        };
        // Check-quorum: a majority acknowledged within T_elect (the leader counts itself), or
        // within an idle round and T_elect while idle.
        let config = &self.active_config;
        let window = if leader.idle {
            self.config.t_elect + self.config.idle_heartbeat
        } else {
            self.config.t_elect
        };
        let window_start = now.saturating_sub(window);
        let recent = config
            .voters
            .iter()
            .filter(|voter| {
                voter.node == self.me.node
                    || leader
                        .last_ack
                        .get(&voter.node)
                        .is_some_and(|at| *at >= window_start)
            })
            .count();
        let settled = now.saturating_sub(leader.since) >= self.config.t_elect;
        let disk_stuck = self
            .unpersisted
            .front()
            .is_some_and(|(_, since, _)| now.saturating_sub(*since) > self.config.t_disk);
        // A round more than a heartbeat late means this node was stalled itself (starved of
        // CPU, paused): the acknowledgements sent meanwhile may still wait unread, so the
        // followers are judged at the next round, on time, instead (Lifeguard's local health,
        // for check-quorum). A leader that is cut off steps down a round later.
        let stalled = self
            .heartbeat_at
            .is_some_and(|at| now.saturating_sub(at) > self.config.heartbeat);
        if (settled && !stalled && recent < config.majority()) || disk_stuck {
            tracing::debug!(
                shard = self.shard,
                recent,
                disk_stuck,
                late_ms = self
                    .heartbeat_at
                    .map(|at| now.saturating_sub(at).as_millis()),
                last_ack_ms = leader
                    .last_ack
                    .values()
                    .max()
                    .map(|at| now.saturating_sub(*at).as_millis()),
                "check-quorum failed: stepping down"
            );
            self.step_down(now);
            self.arm_election(now);
            return;
        }
        // A round no read waits for, without leases, skips followers that just had an
        // `Append` (`heartbeat_skip_recent`).
        let for_reads = leader.round_wanted || leader.reads.iter().any(|read| read.round == 0);
        let skip_recent = if for_reads || self.config.lease_reads {
            None
        } else {
            (!self.config.heartbeat_skip_recent.is_zero())
                .then(|| now.checked_sub(self.config.heartbeat_skip_recent))
                .flatten()
        };
        self.number_round(now);
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let removing: Vec<(Member, Message)> = leader
            .removing
            .values()
            // A member SWIM holds down is told once it is back.
            .filter(|removing| !self.dead.contains(&removing.member.node))
            .map(|removing| {
                let message = Message::Removed {
                    b: leader.b.clone(),
                    config_pos: removing.config_pos.clone(),
                    config: removing.config.clone(),
                    matched: removing.matched,
                };
                (removing.member.clone(), message)
            })
            .collect();
        for (member, message) in removing {
            self.send(member, message, false);
        }
        let idle = self.is_idle(now);
        if let Role::Leader(leader) = &mut self.role {
            leader.idle = idle;
        }
        self.send_appends(true, skip_recent, None);
        self.progress_transfer(now);
        self.expire_verifications(now);
        self.reconfigure(now);
        self.pace_learners(now);
        // Rounds fall on a grid (a quarter heartbeat, or a whole one while idle), so a node's
        // many shards heartbeat in the same instants and their messages share frames instead
        // of each round costing its own: with 1,024 idle shards, ~10 frames a second per peer
        // instead of ~700. A round is at most one grid step late.
        let (every, grid) = if self.leader_is_idle() {
            (
                self.config.idle_heartbeat.max(self.config.heartbeat),
                self.config.heartbeat,
            )
        } else {
            (self.config.heartbeat, self.config.heartbeat / 4)
        };
        self.heartbeat_at = Some(align_up(now + every, grid));
    }

    /// Numbers a new heartbeat round (noting when it was sent, under leases) and assigns it
    /// to the reads still waiting for one. The caller sends it.
    fn number_round(&mut self, now: Duration) {
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        leader.hb_seq += 1;
        let round = leader.hb_seq;
        if self.config.lease_reads {
            leader.seq_times.push_back((round, now));
            let lease_span = self.config.t_elect - self.config.t_elect / LEASE_DRIFT_DIVISOR;
            while leader
                .seq_times
                .get(1)
                .is_some_and(|(_, at)| *at + lease_span <= now)
            {
                leader.seq_times.pop_front();
            }
        }
        for read in leader.reads.iter_mut().filter(|read| read.round == 0) {
            read.round = round;
        }
        leader.round_wanted = false;
    }

    /// R9: the round that reads arrived since the last one wait for, sent at once. Only that:
    /// check-quorum, reconfiguration and the periodic rounds' schedule stay with
    /// [`heartbeat`](Self::heartbeat), so a shard read from faster than it heartbeats does not
    /// pay for them on every read, nor push them back.
    ///
    /// A read needs the acknowledgements of a majority only, so the round goes to the fewest
    /// voters that make one with this leader ([`quickest_quorum`](Self::quickest_quorum)):
    /// with three voters, one follower instead of two, half the peer messages per read.
    ///
    /// Without leases the round is a [`Message::ReadRound`] when every voter it goes to
    /// acknowledged this leader before: the receiver only compares its promise, where an
    /// `Append` would also reset its election timer, check its log and apply, and the leader
    /// takes the answer without recounting commits. When one of them has not acknowledged
    /// this leader yet, the round goes as `Append`s, which make it follow. With leases the
    /// round stays an `Append`: its acknowledgements also renew the lease.
    fn read_round(&mut self, now: Duration) {
        self.number_round(now);
        let Some(only) = self.quickest_quorum() else {
            self.send_appends(true, None, None);
            return;
        };
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        let all_heard = only
            .iter()
            .all(|node| leader.hb_acked.get(node).is_some_and(|acked| *acked > 0));
        if self.config.lease_reads || !all_heard {
            self.send_appends(true, None, Some(&only));
            return;
        }
        let round = leader.hb_seq;
        let b = leader.b.clone();
        for node in only {
            let Some(voter) = self.active_config.voter_on(&node).cloned() else {
                continue;
            };
            leader.round_sent.insert(node, round);
            let message = Message::ReadRound {
                b: b.clone(),
                round,
            };
            self.pending_out.push((voter, message, false));
        }
    }

    /// The answer to a leader's [`Message::ReadRound`] of `b` sent `to` this replica:
    /// `ReadRoundOk` while its promise is `b` (it follows `b`'s leader) and it is not
    /// tombstoned; else `AppendNack` when it promised a higher ballot; else nothing (it never
    /// heard of `b`, it is tombstoned, or `to` is another member). Changes nothing, so a host
    /// may answer outside [`handle_message`](Self::handle_message), and send at once: a
    /// promise only goes up, and a higher one is durable before any message others could
    /// count leaves, so a promise of `b` when the answer leaves means no countable promise of
    /// a higher ballot was made here before then; the answer needs nothing durable.
    pub fn answer_read_round(&self, to: &Member, b: &Ballot, round: u64) -> Option<Message> {
        if !self.same_member(to, &self.me) {
            return None;
        }
        let promised = self.durable.promised.as_ref();
        if (promised == Some(b) && self.durable.tombstone.is_none())
            || self.mutations.read_round_ignores_promise
        {
            return Some(Message::ReadRoundOk {
                b: b.clone(),
                round,
            });
        }
        let higher = promised.filter(|promised| b < *promised)?;
        Some(Message::AppendNack {
            b: b.clone(),
            reason: NackReason::Higher(higher.clone()),
        })
    }

    /// A [`Message::ReadRoundOk`]: a voter held this leader's ballot after the reads of
    /// `round` arrived, and they may be served once a majority did
    /// ([`serve_reads`](Self::serve_reads)). Its only outputs are client replies, so a host
    /// may call it outside [`handle_message`](Self::handle_message) and poll just those.
    pub fn handle_read_round_ok(&mut self, from: &Member, to: &Member, b: &Ballot, round: u64) {
        if !self.same_member(to, &self.me) {
            return;
        }
        let voter = self.is_voter_of(&self.active_config, from);
        let Role::Leader(leader) = &mut self.role else {
            return;
        };
        if leader.b != *b || !voter {
            return;
        }
        if leader
            .fresh_from
            .get(&from.node)
            .is_some_and(|fresh| round < *fresh)
        {
            return;
        }
        let acked = leader.hb_acked.entry(from.node.clone()).or_insert(0);
        *acked = (*acked).max(round);
        self.serve_reads();
    }

    /// The fewest voters besides this leader that make a majority with it, each without a
    /// round outstanding (it acknowledged the newest round sent to it), the most recently
    /// heard first; `None`, meaning everyone, when too few are without one: a slow or silent
    /// follower is left out of the next read rounds until it answers.
    fn quickest_quorum(&self) -> Option<Vec<NodeId>> {
        let Role::Leader(leader) = &self.role else {
            return None;
        };
        let config = &self.active_config;
        let counts_itself = config.voters.iter().any(|v| v.node == self.me.node);
        let needed = config.majority() - usize::from(counts_itself);
        if needed == 0 {
            return None;
        }
        let mut ready: Vec<(Option<Duration>, &NodeId)> = config
            .voters
            .iter()
            .filter(|voter| voter.node != self.me.node)
            .filter(|voter| {
                let acked = leader.hb_acked.get(&voter.node).copied().unwrap_or(0);
                let sent = leader.round_sent.get(&voter.node).copied().unwrap_or(0);
                acked >= sent && !leader.snapshots.contains_key(&voter.node)
            })
            .map(|voter| (leader.last_ack.get(&voter.node).copied(), &voter.node))
            .collect();
        if ready.len() < needed {
            return None;
        }
        ready.sort_by_key(|(heard, _)| std::cmp::Reverse(*heard));
        Some(
            ready
                .into_iter()
                .take(needed)
                .map(|(_, node)| node.clone())
                .collect(),
        )
    }

    fn leader_is_idle(&self) -> bool {
        matches!(&self.role, Role::Leader(leader) if leader.idle)
    }

    /// An established leader with nothing in flight: no client operation or config change
    /// for `idle_heartbeat`, everything committed, every member caught up.
    fn is_idle(&self, now: Duration) -> bool {
        let Role::Leader(leader) = &self.role else {
            return false;
        };
        let last = self.durable.last().index;
        let active = &self.active_config;
        leader.established
            && now.saturating_sub(leader.last_activity) >= self.config.idle_heartbeat
            && self.commit == last
            && leader.writes.is_empty()
            && leader.reads.is_empty()
            && leader.held.is_empty()
            && leader.transfer.is_none()
            && leader.removing.is_empty()
            && active.learners.is_empty()
            && active
                .voters
                .iter()
                .filter(|v| v.node != self.me.node)
                .all(|v| leader.matched.get(&v.node) == Some(&last))
    }

    /// A client operation or config change: back to quick heartbeats. Leaving idle restarts
    /// the check-quorum clock (acknowledgements were slow while idle).
    fn wake(&mut self, now: Duration) {
        if let Role::Leader(leader) = &mut self.role {
            leader.last_activity = now;
            if leader.idle {
                leader.idle = false;
                leader.since = now;
                self.heartbeat_at = Some(now);
            }
        }
    }

    // ---- role changes ----

    /// Leaves leadership or candidacy: appended writes wait for the log to decide them
    /// (`undecided`), reads are unavailable.
    fn step_down(&mut self, now: Duration) {
        match std::mem::replace(&mut self.role, Role::Follower) {
            Role::Leader(leader) => {
                let leader = *leader;
                tracing::debug!(shard = self.shard, b = %leader.b.n, "stepping down");
                // Appended writes: their entries may still commit (a handoff target, or the
                // next leader, holds them) or not; the log decides later (`undecided`).
                for (index, tag) in leader.writes {
                    if self.mutations.moved_for_appended {
                        let reply = ClientReply::Moved {
                            b: self.durable.promised.clone(),
                            leader: None,
                        };
                        self.replies.push_back((tag, reply));
                    } else {
                        let until = now + UNDECIDED_FOR;
                        self.undecided.insert(index, (tag, leader.b.clone(), until));
                    }
                }
                // R7 (4): held writes were never appended; the target leads now (or none
                // does: writes held for a learner, R6).
                let moved_to = leader.transfer.as_ref().map(|t| t.to.node.clone());
                let asked_to_stand = leader.transfer.as_ref().filter(|t| t.sent);
                self.handed_to = asked_to_stand.map(|t| t.to.node.clone());
                for (tag, _) in leader.held {
                    let reply = ClientReply::Moved {
                        b: self.durable.promised.clone(),
                        leader: moved_to.clone(),
                    };
                    self.replies.push_back((tag, reply));
                }
                for read in leader.reads {
                    self.replies.push_back((read.tag, ClientReply::Unavailable));
                }
                for send in leader.snapshots.into_values() {
                    self.reads
                        .push_back(SnapshotRead::Close { view: send.view });
                }
                self.leader_hint = None;
                self.heartbeat_at = None;
            }
            Role::Candidate(_) | Role::Follower => {}
        }
    }

    fn redirect(&self) -> ClientReply {
        match self.leader_hint.as_ref().or(self.handed_to.as_ref()) {
            Some(leader) if leader != &self.me.node => ClientReply::Moved {
                b: self.durable.promised.clone(),
                leader: Some(leader.clone()),
            },
            _ => ClientReply::Unavailable,
        }
    }

    // ---- durable changes and sends ----

    fn truncate_after(&mut self, index: u64) {
        if self.durable.last().index <= index {
            return;
        }
        assert!(
            index >= self.durable.applied,
            "R4: an applied entry would be truncated"
        );
        tracing::debug!(
            shard = self.shard,
            after = index,
            last = self.durable.last().index,
            "truncating the log"
        );
        let keep = usize::try_from(index - self.durable.base.pos.index).unwrap_or(usize::MAX);
        self.durable.log.truncate(keep);
        if self.config_at.is_some_and(|at| at > index) {
            self.set_config_at(last_config_index(&self.durable));
        }
        self.open_batch.push(Change::Truncate { from: index + 1 });
        self.durable_last = self.durable_last.min(index);
        for (_, _, last) in self.unpersisted.iter_mut() {
            *last = (*last).min(index);
        }
    }

    /// Points `config_at` at `at` and copies the config active from then on.
    fn set_config_at(&mut self, at: Option<u64>) {
        self.config_at = at;
        self.active_config = active(&self.durable, at).clone();
    }

    fn append(&mut self, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let config_at = entries
            .iter()
            .rev()
            .find(|e| matches!(e.op, Op::Config(_)))
            .map(|entry| entry.index);
        self.durable.log.extend(entries.iter().cloned());
        if config_at.is_some() {
            self.set_config_at(config_at);
        }
        self.open_batch.push(Change::Append(entries));
    }

    fn note_input(&mut self, now: Duration) {
        if !self.config.heartbeat_skip_recent.is_zero() {
            self.input_at = now;
        }
    }

    fn send(&mut self, to: Member, message: Message, needs_durable: bool) {
        self.pending_out.push((to, message, needs_durable));
    }

    /// Closes the handler: the open batch becomes a `Persist`, pending messages are tagged
    /// with the batch they wait for, and a wanted read round goes out.
    fn finish(&mut self, now: Duration) {
        debug_assert_eq!(
            self.active_config,
            *active(&self.durable, self.config_at),
            "the copy of the active config is stale"
        );
        self.settle_waiting(now);
        self.expire_undecided(now);
        if let Role::Leader(leader) = &self.role
            && leader.round_wanted
        {
            self.read_round(now);
        }
        self.maybe_compact(now);
        if !self.open_batch.is_empty() && self.open_since.is_none() {
            self.open_since = Some(now);
        }
        self.tag_pending();
    }

    /// Answers `Indeterminate` to the undecided writes whose deadline passed, whose index a
    /// snapshot skipped, or all of them once this replica is removed: the log will not tell.
    fn expire_undecided(&mut self, now: Duration) {
        if self.undecided.is_empty() {
            return;
        }
        let removed = self.durable.tombstone.is_some();
        let applied = self.durable.applied;
        let expired: Vec<u64> = self
            .undecided
            .iter()
            .filter(|(index, (_, _, until))| removed || **index <= applied || *until <= now)
            .map(|(index, _)| *index)
            .collect();
        for index in expired {
            if let Some((tag, _, _)) = self.undecided.remove(&index) {
                self.replies.push_back((tag, ClientReply::Indeterminate));
            }
        }
    }

    /// Moves the handler's messages to the outbox, each waiting for the batch that holds the
    /// changes made before it (the open one, else the newest unpersisted one).
    fn tag_pending(&mut self) {
        let wait_for = if self.open_batch.is_empty() {
            self.unpersisted.back().map(|(batch, ..)| *batch)
        } else {
            Some(BatchId(self.next_batch))
        };
        let wait = !self.mutations.send_before_persist;
        for (to, message, needs_durable) in self.pending_out.drain(..) {
            self.outbox.push_back(Outgoing {
                to,
                message,
                after: if needs_durable && wait {
                    wait_for
                } else {
                    None
                },
            });
        }
    }
}
