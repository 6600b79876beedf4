//! The protocol's vocabulary: members, ballots, positions, entries, configs, messages.

use serde::{Deserialize, Serialize};
use topology::NodeId;

use crate::identity::node_id_serde;

/// A random id created with a node's data dir: a wiped node is a new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StorageId(pub u128);

/// A replica's identity in a config: the node and the storage it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Member {
    /// The node.
    #[serde(with = "node_id_serde")]
    pub node: NodeId,
    /// Its storage.
    pub storage: StorageId,
}

/// `(n, node)`, ordered lexicographically; only `node` proposes its ballots. Printed `n.node`;
/// DESIGN.md calls it the shard's epoch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Ballot {
    /// The round.
    pub n: u64,
    /// The proposer.
    #[serde(with = "node_id_serde")]
    pub node: NodeId,
}

impl std::fmt::Display for Ballot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.n, self.node)
    }
}

/// A log position `(ballot, index)`, ordered lexicographically: how up to date a log is.
/// `ballot` is `None` only for the empty log's origin.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pos {
    /// The ballot of the entry at `index`.
    pub ballot: Option<Ballot>,
    /// The index.
    pub index: u64,
}

impl Pos {
    /// The position before the first entry.
    pub const ORIGIN: Pos = Pos {
        ballot: None,
        index: 0,
    };
}

/// Which client attempt an entry carries, so its answer can find the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestTag {
    /// The client.
    pub client: u64,
    /// The client's request number.
    pub req: u64,
    /// The attempt (a retry of the same request is a new attempt).
    pub attempt: u32,
}

/// What an entry does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Set `key` to `value`.
    Put {
        /// The key.
        #[serde(with = "super::bytes::vec")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "super::bytes::vec")]
        value: Vec<u8>,
    },
    /// Remove `key`.
    Del {
        /// The key.
        #[serde(with = "super::bytes::vec")]
        key: Vec<u8>,
    },
    /// A new leader's first entry; once committed, the leader is established.
    EpochStart,
    /// A new config, in effect from when it is appended.
    Config(Config),
}

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Entry {
    /// The ballot of the leader that appended it.
    pub ballot: Ballot,
    /// Its index (the first entry has index 1).
    pub index: u64,
    /// What it does.
    pub op: Op,
    /// The client attempt it came from, for writes.
    pub tag: Option<RequestTag>,
}

impl Entry {
    /// The entry's position.
    pub fn pos(&self) -> Pos {
        Pos {
            ballot: Some(self.ballot.clone()),
            index: self.index,
        }
    }
}

/// A shard's replica set: voters (placement target order, leader first) and learners.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Config {
    /// Members whose promises and acknowledgements count.
    pub voters: Vec<Member>,
    /// Members catching up; they never count.
    pub learners: Vec<Member>,
}

impl Config {
    /// Whether a correct replica could have made this config: at least one voter, and no
    /// member named twice. A peer's message holding one that is not is dropped
    /// ([`Message::is_well_formed`]): with no voters there is no majority to count.
    pub fn is_well_formed(&self) -> bool {
        let members: Vec<&Member> = self.voters.iter().chain(&self.learners).collect();
        !self.voters.is_empty()
            && members
                .iter()
                .enumerate()
                .all(|(at, member)| !members[..at].contains(member))
    }

    /// `⌊|voters|/2⌋ + 1`.
    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }

    /// Whether `member` (node and storage) is a voter.
    pub fn is_voter(&self, member: &Member) -> bool {
        self.voters.contains(member)
    }

    /// The voter on `node`, if any.
    pub fn voter_on(&self, node: &NodeId) -> Option<&Member> {
        self.voters.iter().find(|voter| &voter.node == node)
    }
}

/// Why an acceptor refused a `Prepare`; its state did not change.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RejectReason {
    /// It promised a higher (or equal) ballot.
    Higher(Ballot),
    /// It heard from this leader within `T_elect`.
    Sticky(#[serde(with = "node_id_serde")] NodeId),
    /// It has no state for the shard, or another storage.
    NoState,
    /// Its log is more up to date and the candidate is not a voter of its config.
    NotVoter(Pos, Config),
    /// It was removed from the shard (R8): its last position and the config that removed it.
    Tombstone(Pos, Config),
}

/// Why a follower refused an `Append`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NackReason {
    /// It promised a higher ballot.
    Higher(Ballot),
    /// It does not hold `prev`; the hint is the highest index where its log may still agree.
    Conflict {
        /// The follower's last index, or `prev - 1` if that is lower (it holds another entry
        /// at `prev`).
        last: u64,
    },
}

/// Whether `entries` could be a stretch of one log starting at index `first`: consecutive
/// indexes, ballots that never decrease, and only well-formed configs.
fn is_log_run(entries: &[Entry], first: u64) -> bool {
    let mut expected = Some(first);
    let mut ballot: Option<&Ballot> = None;
    for entry in entries {
        if Some(entry.index) != expected || ballot.is_some_and(|before| *before > entry.ballot) {
            return false;
        }
        if let Op::Config(config) = &entry.op
            && !config.is_well_formed()
        {
            return false;
        }
        expected = entry.index.checked_add(1);
        ballot = Some(&entry.ballot);
    }
    true
}

/// No ballot number, log index, heartbeat round or chunk number a correct replica sends
/// reaches this: each grows by one at a time, and at one a microsecond 2^62 takes 146,000
/// years. A peer's message naming one at or above it is not well formed, so a replica adds
/// one to any of them (the next ballot, the index after an acknowledged one) without
/// overflow.
pub const COUNTER_LIMIT: u64 = 1 << 62;

impl Message {
    /// Whether a correct replica could have sent this message, as far as the message alone
    /// tells: every ballot number, index and round in it is below [`COUNTER_LIMIT`]; an
    /// `Append`'s entries follow `prev` one index at a time, with ballots that never decrease
    /// and none above the leader's; a `Promise`'s suffix is such a run that ends at its
    /// `last`; every config has a voter and names no member twice.
    ///
    /// Peers are authenticated, so a message that is not well formed comes from a bug or a
    /// corrupted frame, not from the protocol's faults. The host drops it before a replica sees
    /// it (the replicas rely on these shapes: an entry out of place would be appended where it
    /// does not belong), and counts it. It does not check what only the receiver's state can
    /// tell (whether a promise's suffix starts where the candidate asked; the candidate does).
    pub fn is_well_formed(&self) -> bool {
        self.counters_below_limit() && self.is_well_shaped()
    }

    /// Whether every ballot number, log index, round and chunk number the message names is
    /// below [`COUNTER_LIMIT`]. An `Append`'s entries and a `Promise`'s suffix are bounded by
    /// its `prev`, ballot and `last` once [well shaped](Self::is_well_shaped).
    fn counters_below_limit(&self) -> bool {
        let below = |n: u64| n < COUNTER_LIMIT;
        let ballot = |b: &Ballot| below(b.n);
        let at = |pos: &Pos| below(pos.index) && pos.ballot.as_ref().is_none_or(ballot);
        match self {
            Message::Prepare {
                b,
                last,
                commit,
                handoff_from,
            } => {
                ballot(b) && at(last) && below(*commit) && handoff_from.as_ref().is_none_or(ballot)
            }
            Message::Promise { b, last, .. } | Message::PreVote { b, last } => {
                ballot(b) && at(last)
            }
            Message::Reject { b, reason } => {
                ballot(b)
                    && match reason {
                        RejectReason::Higher(higher) => ballot(higher),
                        RejectReason::NotVoter(pos, _) | RejectReason::Tombstone(pos, _) => at(pos),
                        RejectReason::Sticky(_) | RejectReason::NoState => true,
                    }
            }
            Message::Append {
                b,
                prev,
                entries,
                commit,
                hb_seq,
                ..
            } => {
                ballot(b)
                    && at(prev)
                    && below(*commit)
                    && below(*hb_seq)
                    && below(prev.index.saturating_add(entries.len() as u64))
            }
            Message::AppendOk {
                b, matched, hb_seq, ..
            } => ballot(b) && below(*matched) && below(*hb_seq),
            Message::AppendNack { b, reason } => {
                ballot(b)
                    && match reason {
                        NackReason::Higher(higher) => ballot(higher),
                        NackReason::Conflict { last } => below(*last),
                    }
            }
            Message::Verify { b, index } | Message::VerifyOk { b, index, .. } => {
                ballot(b) && below(*index)
            }
            Message::Removed {
                b,
                config_pos,
                matched,
                ..
            } => ballot(b) && at(config_pos) && below(*matched),
            Message::Snapshot { b, base, seq, .. } => ballot(b) && at(base) && below(*seq),
            Message::SnapshotOk { b, base, next, .. } => ballot(b) && at(base) && below(*next),
            Message::PreVoteReply { b, verdict } => {
                ballot(b)
                    && match verdict {
                        PreVerdict::Refused { promised } => below(*promised),
                        PreVerdict::Granted | PreVerdict::Stale => true,
                    }
            }
            Message::TimeoutNow { b } | Message::RemovedOk { b } => ballot(b),
            Message::ReadRound { b, round } | Message::ReadRoundOk { b, round } => {
                ballot(b) && below(*round)
            }
            Message::Probe => true,
        }
    }

    /// The shape checks of [`is_well_formed`](Self::is_well_formed) beyond the counters' limit.
    fn is_well_shaped(&self) -> bool {
        match self {
            Message::Append {
                b, prev, entries, ..
            } => {
                prev.ballot.as_ref().is_none_or(|ballot| ballot <= b)
                    && prev
                        .index
                        .checked_add(1)
                        .is_some_and(|first| is_log_run(entries, first))
                    // The run's ballots never decrease: its last is its highest.
                    && entries.last().is_none_or(|last| last.ballot <= *b)
                    && entries.first().is_none_or(|first| {
                        prev.ballot
                            .as_ref()
                            .is_none_or(|ballot| *ballot <= first.ballot)
                    })
            }
            Message::Promise {
                last,
                config,
                suffix,
                ..
            } => {
                config.is_well_formed()
                    && suffix.as_deref().is_none_or(|suffix| match suffix {
                        [] => true,
                        [first, ..] => {
                            is_log_run(suffix, first.index)
                                && suffix.last().is_some_and(|end| end.pos() == *last)
                        }
                    })
            }
            Message::Snapshot { config, .. } | Message::Removed { config, .. } => {
                config.is_well_formed()
            }
            _ => true,
        }
    }
}

/// A replica-to-replica message of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Message {
    /// A candidate asks for a promise (R1, R2).
    Prepare {
        /// The candidate's ballot.
        b: Ballot,
        /// Its last position.
        last: Pos,
        /// Its commit index: promises carry the entries after it.
        commit: u64,
        /// The current leader's ballot (which names it) when it asked the candidate to stand
        /// (R7).
        handoff_from: Option<Ballot>,
    },
    /// An acceptor promises `b`.
    Promise {
        /// The ballot promised.
        b: Ballot,
        /// The acceptor's last position.
        last: Pos,
        /// The acceptor's active config.
        config: Config,
        /// Its entries after the candidate's commit, or `None` if too many.
        suffix: Option<Vec<Entry>>,
    },
    /// An acceptor refuses `b`.
    Reject {
        /// The ballot refused.
        b: Ballot,
        /// Why.
        reason: RejectReason,
    },
    /// Entries (or a heartbeat) from the leader of `b` (R4).
    Append {
        /// The leader's ballot.
        b: Ballot,
        /// The position just before `entries`.
        prev: Pos,
        /// The entries.
        entries: Vec<Entry>,
        /// The leader's commit index.
        commit: u64,
        /// The heartbeat round (R9).
        hb_seq: u64,
        /// The leader is idle (nothing to replicate, everyone caught up): its next heartbeat
        /// comes within `idle_heartbeat`, not `heartbeat`, so followers wait that much longer
        /// before standing (unless SWIM holds the leader down).
        idle: bool,
    },
    /// The follower holds the leader's log up to `matched`.
    AppendOk {
        /// The leader's ballot.
        b: Ballot,
        /// The follower's last index matching the leader's log.
        matched: u64,
        /// The round acknowledged.
        hb_seq: u64,
        /// The follower keeps R9's lease promise (it runs with leases): only such
        /// acknowledgements give the leader a lease.
        lease: bool,
    },
    /// The follower refused an `Append`.
    AppendNack {
        /// The ballot refused.
        b: Ballot,
        /// Why.
        reason: NackReason,
    },
    /// The leader of `b` asks a member it just promoted for the checksums of its copy at
    /// applied index `index`, to compare with its own (the copy verification after a move).
    Verify {
        /// The leader's ballot.
        b: Ballot,
        /// The applied index the checksums are taken at.
        index: u64,
    },
    /// The answer to `Verify`: [`copy_checksums`] of the state at `index`, or `None` when
    /// the receiver had applied past `index` already (the leader asks again).
    VerifyOk {
        /// The leader's ballot.
        b: Ballot,
        /// The index asked.
        index: u64,
        /// The checksums, chunk by chunk.
        chunks: Option<Vec<[u8; 16]>>,
    },
    /// The leader of `b` asks the receiver to stand now (R7).
    TimeoutNow {
        /// The sender's ballot.
        b: Ballot,
    },
    /// A committed config at `config_pos` no longer names the receiver (R8).
    Removed {
        /// The leader's ballot.
        b: Ballot,
        /// Where the config that removed it sits.
        config_pos: Pos,
        /// That config.
        config: Config,
        /// How far the receiver's log was known to match the sender's when that config
        /// committed (0: unknown). With the receiver still at ballot `b`, its entries up to
        /// `min(matched, config_pos.index)` are committed: it decides the writes it appended
        /// as a leader there before it tombstones.
        matched: u64,
    },
    /// The receiver of `Removed` has durably tombstoned its copy.
    RemovedOk {
        /// The leader's ballot.
        b: Ballot,
    },
    /// One chunk of the leader's state at `base` (R6), for a replica that needs entries the
    /// leader has compacted. Chunks hold the key-value pairs in key order; `digest` is
    /// [`snapshot_digest`] over every other field, checked before the chunk is used.
    Snapshot {
        /// The leader's ballot.
        b: Ballot,
        /// The position the state is at (an applied, hence committed, index).
        base: Pos,
        /// The config in force at `base`.
        config: Config,
        /// The chunk's number, from 0.
        seq: u64,
        /// Key-value pairs, in key order, after those of chunk `seq - 1`.
        #[serde(with = "super::bytes::pairs")]
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        /// Whether this is the last chunk.
        last: bool,
        /// blake3 over the other fields.
        digest: [u8; 32],
    },
    /// The answer to a `Snapshot` chunk.
    SnapshotOk {
        /// The leader's ballot.
        b: Ballot,
        /// The snapshot's position.
        base: Pos,
        /// The next chunk the receiver expects (0: restart the transfer).
        next: u64,
        /// The receiver durably holds the state at `base` (installed, or already applied):
        /// the leader continues with `Append`s after `base`.
        done: bool,
    },
    /// A replica that is no voter (a learner, or one its own config no longer names) and has
    /// heard no leader for `learner_probe` asks its config's voters whether it is still a
    /// member: an established leader whose committed config does not name it answers
    /// `Removed` (R8). Others ignore it. A voter in that case stands instead.
    Probe,
    /// R3's pre-vote: a voter whose election timer fired asks its config's voters whether
    /// they would promise `b` now, before it promises `b` itself. Its own promise would make
    /// it refuse its leader's `Append`s, and so depose a leader the others still hear (a
    /// follower that missed a few heartbeats). Nothing changes at either end.
    PreVote {
        /// The ballot the sender would open.
        b: Ballot,
        /// Its last position.
        last: Pos,
    },
    /// The answer to a `PreVote`.
    PreVoteReply {
        /// The ballot asked about.
        b: Ballot,
        /// What a `Prepare` of `b` would meet now.
        verdict: PreVerdict,
    },
    /// R9's read round on its own: the leader of `b` asks a voter that acknowledged it before
    /// whether it still holds `b` as its promise, for the reads waiting for round `round`. It
    /// carries no entries and changes nothing at the receiver: no promise, no election timer,
    /// no commit. A receiver that promised a higher ballot answers `AppendNack`; otherwise
    /// one that promised a lower one (it never heard of `b`) or is tombstoned does not
    /// answer, and the leader's periodic rounds settle it.
    ReadRound {
        /// The leader's ballot.
        b: Ballot,
        /// The round.
        round: u64,
    },
    /// The answer to `ReadRound`: the sender's promise was `b` when it answered.
    ReadRoundOk {
        /// The ballot.
        b: Ballot,
        /// The round acknowledged.
        round: u64,
    },
}

/// What a `Prepare` would meet now, answered to a [`Message::PreVote`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PreVerdict {
    /// A promise.
    Granted,
    /// A refusal: the receiver leads or heard a leader within `T_elect`, a lease it may have
    /// granted binds it, it holds nothing, or the ballot is not above the one it promised
    /// (whose number is `promised`, so the next try asks a higher one).
    Refused {
        /// The number of the ballot the receiver promised (0: none).
        promised: u64,
    },
    /// The receiver is tombstoned, or holds a more up-to-date log whose config does not name
    /// the sender as a voter: only a `Prepare` finds the newer config (R2.3), so the sender
    /// stands.
    Stale,
}

/// blake3 over key-value pairs, each key and value prefixed with its length (`u64`, little
/// endian), fed through a 32 KiB buffer inside the hasher: BLAKE3 hashes many 1 KiB chunks at
/// once (SIMD) only when given large inputs, and four small updates per pair ran it at a tenth
/// of that speed. The buffer is part of the value (on the stack, not the heap): a fresh 64 KiB
/// heap buffer per snapshot chunk landed in freshly faulted memory often enough to be 7% of a
/// joining node's event loop (the kernel zeroing huge pages). The hash is the same however
/// the input is split.
pub struct PairHasher {
    hasher: blake3::Hasher,
    buffer: [u8; Self::BUFFER],
    len: usize,
}

impl std::fmt::Debug for PairHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairHasher")
            .field("hasher", &self.hasher)
            .field("buffered", &self.len)
            .finish()
    }
}

impl PairHasher {
    const BUFFER: usize = 32 << 10;

    /// Continues `hasher` (which may already hold a header).
    pub fn new(hasher: blake3::Hasher) -> Self {
        PairHasher {
            hasher,
            buffer: [0; Self::BUFFER],
            len: 0,
        }
    }

    /// Adds one pair.
    pub fn pair(&mut self, key: &[u8], value: &[u8]) {
        for data in [key, value] {
            self.put(&(data.len() as u64).to_le_bytes());
            self.put(data);
        }
    }

    fn put(&mut self, data: &[u8]) {
        if self.len + data.len() > Self::BUFFER {
            self.hasher.update(&self.buffer[..self.len]);
            self.len = 0;
        }
        if data.len() >= Self::BUFFER {
            self.hasher.update(data);
        } else {
            self.buffer[self.len..self.len + data.len()].copy_from_slice(data);
            self.len += data.len();
        }
    }

    /// The hasher with every pair added.
    pub fn into_hasher(mut self) -> blake3::Hasher {
        self.hasher.update(&self.buffer[..self.len]);
        self.hasher
    }
}

/// Checksums of a copy's key-value state, Vitess VDiff style: the pairs in key order, cut into
/// chunks of about `chunk_bytes` of keys and values, each hashed (blake3 over length-prefixed
/// keys and values, first 16 bytes). Two copies hold the same state exactly when their lists
/// are equal (up to blake3 collisions); the first differing chunk says where they part.
pub fn copy_checksums(kv: &super::KvState, chunk_bytes: usize) -> Vec<[u8; 16]> {
    fn finish(hasher: &blake3::Hasher) -> [u8; 16] {
        let mut out = [0; 16];
        out.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        out
    }
    let mut chunks = Vec::new();
    let mut hasher = PairHasher::new(blake3::Hasher::new());
    let mut size = 0usize;
    for (key, value) in kv {
        hasher.pair(key, value);
        size += key.len() + value.len();
        if size >= chunk_bytes {
            let full = std::mem::replace(&mut hasher, PairHasher::new(blake3::Hasher::new()));
            chunks.push(finish(&full.into_hasher()));
            size = 0;
        }
    }
    if size > 0 || chunks.is_empty() {
        chunks.push(finish(&hasher.into_hasher()));
    }
    chunks
}

/// What came of verifying a copy of a shard after a move ([`Message::Verify`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VerifyOutcome {
    /// The member's copy equals the leader's at `index`.
    Verified {
        /// The member verified.
        member: Member,
        /// The applied index compared at.
        index: u64,
        /// How many chunks were compared.
        chunks: usize,
    },
    /// The member's copy differs from the leader's: it is removed from the shard (and
    /// tombstoned, R8); placement then adds it again as a learner, which starts over.
    Mismatch {
        /// The member removed.
        member: Member,
        /// The applied index compared at.
        index: u64,
        /// The first chunk that differs.
        first_difference: usize,
    },
    /// The member never answered in time (down, or always applied past the index asked).
    Unverified {
        /// The member.
        member: Member,
    },
}

/// The digest a [`Message::Snapshot`] chunk carries: blake3 over its ballot, base, config,
/// number, pairs and `last` flag, each length-prefixed.
pub fn snapshot_digest(
    b: &Ballot,
    base: &Pos,
    config: &Config,
    seq: u64,
    pairs: &[(Vec<u8>, Vec<u8>)],
    last: bool,
) -> [u8; 32] {
    fn bytes(hasher: &mut blake3::Hasher, data: &[u8]) {
        hasher.update(&(data.len() as u64).to_le_bytes());
        hasher.update(data);
    }
    fn ballot(hasher: &mut blake3::Hasher, b: &Ballot) {
        hasher.update(&b.n.to_le_bytes());
        bytes(hasher, b.node.as_str().as_bytes());
    }
    fn members(hasher: &mut blake3::Hasher, members: &[Member]) {
        hasher.update(&(members.len() as u64).to_le_bytes());
        for member in members {
            bytes(hasher, member.node.as_str().as_bytes());
            hasher.update(&member.storage.0.to_le_bytes());
        }
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"slotring snapshot chunk v1");
    ballot(&mut hasher, b);
    match &base.ballot {
        Some(base_ballot) => {
            hasher.update(&[1]);
            ballot(&mut hasher, base_ballot);
        }
        None => {
            hasher.update(&[0]);
        }
    }
    hasher.update(&base.index.to_le_bytes());
    members(&mut hasher, &config.voters);
    members(&mut hasher, &config.learners);
    hasher.update(&seq.to_le_bytes());
    hasher.update(&(pairs.len() as u64).to_le_bytes());
    let mut pair_hasher = PairHasher::new(hasher);
    for (key, value) in pairs {
        pair_hasher.pair(key, value);
    }
    let mut hasher = pair_hasher.into_hasher();
    hasher.update(&[u8::from(last)]);
    *hasher.finalize().as_bytes()
}

/// A client operation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClientOp {
    /// Write `value` under `key`.
    Put {
        /// The key.
        #[serde(with = "super::bytes::vec")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "super::bytes::vec")]
        value: Vec<u8>,
    },
    /// Remove `key`.
    Del {
        /// The key.
        #[serde(with = "super::bytes::vec")]
        key: Vec<u8>,
    },
    /// Read `key` (linearizable, through ReadIndex).
    Get {
        /// The key.
        #[serde(with = "super::bytes::vec")]
        key: Vec<u8>,
    },
}

/// How a client came to ask a replica: what it tells a follower about the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClientRoute {
    /// The client's routing names the node asked (perhaps out of date: leadership moves, and
    /// a follower then answers `Moved`).
    Routed,
    /// The node the client took for the shard's leader did not answer it, so it asks another
    /// replica. A follower asked this way stops excusing an idle leader's silence.
    LeaderSilent,
}

/// The answer to a client attempt (R10). `Moved` and `Unavailable` are definite: the attempt
/// was never appended and never will be. `Superseded` is definite too: appended, and never
/// applied.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClientReply {
    /// Committed (writes) or read at a linearizable point (reads; `value` is the value).
    Ok {
        /// The value read, for `Get`.
        #[serde(with = "super::bytes::option")]
        value: Option<Vec<u8>>,
    },
    /// Not the leader; try the hinted one.
    Moved {
        /// The durable ballot of this replica.
        b: Option<Ballot>,
        /// Who it believes leads.
        #[serde(with = "option_node_id")]
        leader: Option<NodeId>,
    },
    /// No established leader here and none known, or the leader lost its quorum.
    Unavailable,
    /// Appended but not known to be committed when leadership was lost.
    Indeterminate,
    /// Appended by a leader that lost its leadership, and another leader's entry committed at
    /// its index: it was never applied and never will be (an entry has one index), so sending
    /// the operation again is safe.
    Superseded,
}

mod option_node_id {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use topology::NodeId;

    pub(crate) fn serialize<S: Serializer>(
        id: &Option<NodeId>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        id.as_ref().map(NodeId::as_str).serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<NodeId>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| NodeId::new(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`snapshot_digest`] as defined: every field hashed in order, each pair's key and value
    /// length-prefixed, one update each.
    fn reference_digest(
        b: &Ballot,
        base: &Pos,
        config: &Config,
        seq: u64,
        pairs: &[(Vec<u8>, Vec<u8>)],
        last: bool,
    ) -> [u8; 32] {
        let empty = snapshot_digest(b, base, config, seq, &[], last);
        let mut hasher = blake3::Hasher::new();
        // Rebuild the prefix the same way the digest does, then the pairs one update at a time.
        hasher.update(b"slotring snapshot chunk v1");
        hasher.update(&b.n.to_le_bytes());
        hasher.update(&(b.node.as_str().len() as u64).to_le_bytes());
        hasher.update(b.node.as_str().as_bytes());
        hasher.update(&[0]);
        hasher.update(&base.index.to_le_bytes());
        hasher.update(&0u64.to_le_bytes());
        hasher.update(&0u64.to_le_bytes());
        hasher.update(&seq.to_le_bytes());
        let mut without_pairs = hasher.clone();
        without_pairs.update(&0u64.to_le_bytes());
        without_pairs.update(&[u8::from(last)]);
        assert_eq!(
            *without_pairs.finalize().as_bytes(),
            empty,
            "the prefix as defined"
        );
        hasher.update(&(pairs.len() as u64).to_le_bytes());
        for (key, value) in pairs {
            hasher.update(&(key.len() as u64).to_le_bytes());
            hasher.update(key);
            hasher.update(&(value.len() as u64).to_le_bytes());
            hasher.update(value);
        }
        hasher.update(&[u8::from(last)]);
        *hasher.finalize().as_bytes()
    }

    #[test]
    fn the_buffered_snapshot_digest_is_the_defined_one() {
        let b = Ballot {
            n: 7,
            node: NodeId::new("n1").unwrap(),
        };
        let base = Pos {
            ballot: None,
            index: 42,
        };
        let config = Config::default();
        let small: Vec<(Vec<u8>, Vec<u8>)> = (0..5000u32)
            .map(|i| (i.to_le_bytes().to_vec(), vec![b'x'; (i % 200) as usize]))
            .collect();
        let mut mixed = small[..100].to_vec();
        mixed.push((b"big".to_vec(), vec![7; 200_000]));
        mixed.push((vec![1; 70_000], Vec::new()));
        // At the buffer's size and just under it, with and without the length prefix.
        for len in [
            PairHasher::BUFFER - 9,
            PairHasher::BUFFER - 8,
            PairHasher::BUFFER,
        ] {
            mixed.push((vec![2; 3], vec![3; len]));
        }
        mixed.extend(small[100..300].iter().cloned());
        for pairs in [Vec::new(), small, mixed] {
            for last in [false, true] {
                assert_eq!(
                    snapshot_digest(&b, &base, &config, 3, &pairs, last),
                    reference_digest(&b, &base, &config, 3, &pairs, last),
                    "{} pairs",
                    pairs.len()
                );
            }
        }
    }
}
