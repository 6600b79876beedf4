//! [`ShardHost`]: every replica one node holds, with their persists group-committed into one
//! batch and their messages batched per peer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use core::time::Duration;

use topology::NodeId;

use super::{
    BatchId, ClientOp, ClientReply, ClientRoute, Config, Durable, Member, Message, Op, Persist,
    RejectReason, ReplicaConfig, RequestTag, ShardReplica, SnapshotRead, SnapshotReadReply,
    StorageId, VerifyOutcome,
    shard_map::{ShardDeadlines, ShardMap},
};

/// About how many bytes of keys and values one [`PeerBatch`] carries at most (a single larger
/// message travels alone): half the transport's 4 MiB frame, leaving room for the rest.
pub const FRAME_BUDGET: usize = 2 << 20;

/// The most group commits a host has outstanding. The shell may write the later ones while
/// the disk flushes the first, and flush them together: a commit submitted during a flush
/// then starts its own as soon as that one ends, without waiting for the event loop to hear
/// of the first and poll again. Beyond this, changes gather in the open batch.
pub const MAX_COMMITS_IN_FLIGHT: usize = 32;

/// The bulk of a message's encoding: its keys and values, plus a small fixed part.
fn payload_bytes(message: &Message) -> usize {
    const FIXED: usize = 64;
    match message {
        Message::Snapshot { pairs, .. } => {
            FIXED
                + pairs
                    .iter()
                    .map(|(key, value)| key.len() + value.len() + 8)
                    .sum::<usize>()
        }
        Message::Append { entries, .. } => {
            FIXED
                + entries
                    .iter()
                    .map(|entry| match &entry.op {
                        Op::Put { key, value } => key.len() + value.len() + 64,
                        Op::Del { key } => key.len() + 64,
                        Op::EpochStart | Op::Config(_) => 256,
                    })
                    .sum::<usize>()
        }
        _ => FIXED,
    }
}

/// Identifies a host-wide persist batch: one transaction for all shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostBatchId(pub u64);

/// One group commit: every shard's changes since the previous one. Make it durable in one
/// transaction, after every batch polled before it (or with them), then call
/// [`ShardHost::handle_persisted`], in the order polled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPersist {
    /// The batch.
    pub batch: HostBatchId,
    /// Each shard's persist, in order.
    pub shards: Vec<(u16, Persist)>,
}

/// Messages for one peer node, sent as one frame (serde: it travels in the `wire` envelope).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct PeerBatch {
    /// The sending replica's member (node and storage).
    pub from: Member,
    /// `(shard, recipient, message)`.
    pub messages: Vec<(u16, Member, Message)>,
}

impl PeerBatch {
    /// About how many bytes the batch's encoding takes: its keys and values plus a fixed
    /// allowance per message and entry (short for very long node names, which every ballot
    /// repeats). For sizing the buffer it is encoded into; never a limit.
    pub fn encoded_len_hint(&self) -> usize {
        self.messages
            .iter()
            .map(|(_, _, message)| payload_bytes(message))
            .sum()
    }
}

/// A move of a shard this node leads (its voters differ from the target it was handed)
/// starting or ending, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MoveChange {
    /// The shard's voters are no longer its target; the leader works towards it.
    Started {
        /// The shard.
        shard: u16,
    },
    /// The shard is no longer moving here: `done` when its voters are the target, else this
    /// node stopped leading it (a handoff, say) and its next leader carries on.
    Ended {
        /// The shard.
        shard: u16,
        /// Whether the voters are the target.
        done: bool,
    },
}

/// Every replica on one node.
///
/// Same contract as [`ShardReplica`]: `handle_*(now, ...)` inputs, polled outputs, no IO.
/// Changes gather into the next [`HostPersist`] (group commit) until it is polled; up to
/// [`MAX_COMMITS_IN_FLIGHT`] are outstanding at once, made durable in order, and messages
/// that depend on one wait for it.
#[derive(Debug, Clone)]
pub struct ShardHost {
    me: Member,
    config: ReplicaConfig,
    seed: u64,
    replicas: ShardMap<Box<ShardReplica>>,
    deadlines: ShardDeadlines,
    open: Vec<(u16, Persist)>,
    next_batch: u64,
    /// The outstanding group commits, oldest first, each with the replica batches it holds.
    in_flight: VecDeque<(HostBatchId, Vec<(u16, BatchId)>)>,
    batch_of: BTreeMap<(u16, BatchId), HostBatchId>,
    persisted_through: Option<HostBatchId>,
    waiting: VecDeque<(Option<HostBatchId>, NodeId, u16, Member, Message)>,
    /// `waiting`'s previous buffer, empty, kept for its capacity: every group commit passes
    /// the waiting messages from one to the other, and a buffer grown anew each time showed as
    /// a tenth of a loaded node's event loop (reallocations and fresh pages).
    waiting_spare: VecDeque<(Option<HostBatchId>, NodeId, u16, Member, Message)>,
    /// Messages free to leave, per peer; a peer's queue stays, empty, once sent (its buffer
    /// is reused).
    ready: BTreeMap<NodeId, Vec<(u16, Member, Message)>>,
    replies: VecDeque<(u16, RequestTag, ClientReply)>,
    reads: VecDeque<(u16, SnapshotRead)>,
    /// The target each replica was handed last.
    given: ShardMap<Vec<Member>>,
    /// Targets not handed over yet: each would start a move while `max_moves` shards this
    /// node leads are moving. Handed over in shard order as moves finish.
    queued_targets: BTreeMap<u16, Vec<Member>>,
    /// The shards this node leads whose voters are not yet the target they were handed.
    moving: BTreeSet<u16>,
    /// The moving shards whose target names a member that is not a voter yet: a copy is
    /// under way or about to start. (A shard whose only difference is a voter the target
    /// dropped, a dead node kept for `min_voters`, moves no data and may stay so for long.)
    adding: BTreeSet<u16>,
    /// The queued targets that name a member that was not a voter when queued.
    queued_adding: BTreeSet<u16>,
    /// Whether this node's leaders hold their handoffs back (R7; [`ShardReplica::hold_handoff`]):
    /// while shards they lead add members or wait to. A join's new node would otherwise take
    /// over a quarter of the shards one by one while it loads copies, its loop and disk
    /// busy: every client write that follows a `moved` there waited for it (BENCHMARKS.md,
    /// issue 6, session 26).
    handoffs_held: bool,
    /// Moves of shards led here that started or ended, oldest first ([`ShardHost::poll_move`]).
    move_changes: VecDeque<MoveChange>,
    /// Copy verifications decided by replicas leading here, oldest first
    /// ([`ShardHost::poll_verify`]).
    verify_outcomes: VecDeque<(u16, VerifyOutcome)>,
    /// The snapshot reads held back by `move_bytes_per_sec`, in the order asked.
    held_reads: VecDeque<(u16, SnapshotRead)>,
    /// Snapshot bytes the rate limit still allows now (negative: owed), as of `budget_at`.
    move_budget: i64,
    budget_at: Duration,
    /// Shards a leader's message created here since [`ShardHost::take_created`] last ran: they
    /// need their target and view.
    created: Vec<u16>,
    /// Peer messages dropped as not well formed.
    malformed_messages: u64,
}

impl ShardHost {
    /// A host for node `node` whose data dir has `storage`.
    pub fn new(node: NodeId, storage: StorageId, config: ReplicaConfig, seed: u64) -> Self {
        ShardHost {
            me: Member { node, storage },
            config,
            seed,
            replicas: ShardMap::new(),
            deadlines: ShardDeadlines::new(),
            open: Vec::new(),
            next_batch: 0,
            in_flight: VecDeque::new(),
            batch_of: BTreeMap::new(),
            persisted_through: None,
            waiting: VecDeque::new(),
            waiting_spare: VecDeque::new(),
            ready: BTreeMap::new(),
            replies: VecDeque::new(),
            reads: VecDeque::new(),
            given: ShardMap::new(),
            queued_targets: BTreeMap::new(),
            moving: BTreeSet::new(),
            adding: BTreeSet::new(),
            queued_adding: BTreeSet::new(),
            handoffs_held: false,
            move_changes: VecDeque::new(),
            verify_outcomes: VecDeque::new(),
            held_reads: VecDeque::new(),
            move_budget: 0,
            budget_at: Duration::ZERO,
            created: Vec::new(),
            malformed_messages: 0,
        }
    }

    /// This node's member.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The replica of `shard`, if this node holds one.
    pub fn replica(&self, shard: u16) -> Option<&ShardReplica> {
        self.replicas.get(shard).map(|replica| &**replica)
    }

    /// How many peer messages were dropped as not [well formed](Message::is_well_formed).
    pub fn malformed_messages(&self) -> u64 {
        self.malformed_messages
    }

    /// The shards a leader's message created here since the last call, in the order created:
    /// the shell hands them their target and view
    /// ([`ShardHost::handle_view_of`], [`ShardHost::handle_target`]).
    pub fn take_created(&mut self) -> Vec<u16> {
        std::mem::take(&mut self.created)
    }

    /// Every replica this node holds.
    pub fn replicas(&self) -> impl Iterator<Item = (u16, &ShardReplica)> {
        self.replicas
            .iter()
            .map(|(shard, replica)| (shard, &**replica))
    }

    /// Starts (or restarts) the replica of `shard` from `durable`: on bootstrap with
    /// [`Durable::bootstrap`], after a restart with what the disk holds.
    pub fn open_shard(&mut self, now: Duration, shard: u16, durable: Durable) {
        let seed = self.seed ^ (u64::from(shard) << 32);
        let replica = ShardReplica::new(
            now,
            shard,
            self.me.clone(),
            durable,
            self.config.clone(),
            seed,
        );
        self.replicas.insert(shard, Box::new(replica));
        if let Some(replica) = self.replicas.get_mut(shard) {
            replica.hold_handoff(now, self.handoffs_held);
        }
        self.drain(now, shard);
    }

    /// Creates `shard` on this node with `config` (a new cluster's first node, with itself as
    /// the only voter) and persists it: the next [`poll_persist`](Self::poll_persist) holds it.
    pub fn bootstrap_shard(&mut self, now: Duration, shard: u16, config: Config) {
        self.open_shard(now, shard, Durable::bootstrap(config));
        if let Some(replica) = self.replicas.get_mut(shard) {
            replica.persist_base(now);
        }
        self.drain(now, shard);
    }

    /// Messages from peer replicas (one frame from one node). A message that is not
    /// [well formed](Message::is_well_formed) is dropped and counted
    /// ([`malformed_messages`](Self::malformed_messages)).
    pub fn handle_peer_batch(&mut self, now: Duration, batch: PeerBatch) {
        for (shard, to, message) in batch.messages {
            if !message.is_well_formed() {
                self.malformed_messages += 1;
                tracing::debug!(shard, from = %batch.from.node, "a malformed replication message dropped");
                continue;
            }
            if !self.replicas.contains_key(shard) {
                match &message {
                    // Only a leader creates shard state on another node (R6).
                    Message::Append { .. } | Message::Snapshot { .. } if to == self.me => {
                        self.open_shard(now, shard, Durable::empty());
                        self.created.push(shard);
                    }
                    Message::Prepare { b, .. } => {
                        let reject = Message::Reject {
                            b: b.clone(),
                            reason: RejectReason::NoState,
                        };
                        self.queue(None, shard, batch.from.clone(), reject);
                        continue;
                    }
                    _ => continue,
                }
            }
            let Some(replica) = self.replicas.get_mut(shard) else {
                continue;
            };
            // R9's read rounds change nothing but the reads they confirm: answered and taken
            // here, without a replica handler's full turn and the host's drain.
            match message {
                Message::ReadRound { b, round } => {
                    if let Some(answer) = replica.answer_read_round(&to, &b, round) {
                        self.queue(None, shard, batch.from.clone(), answer);
                    }
                }
                Message::ReadRoundOk { b, round } => {
                    replica.handle_read_round_ok(&batch.from, &to, &b, round);
                    while let Some((tag, reply)) = replica.poll_reply() {
                        self.replies.push_back((shard, tag, reply));
                    }
                }
                message => {
                    replica.handle_message(now, batch.from.clone(), to, message);
                    self.drain(now, shard);
                }
            }
        }
        self.release_queued_targets(now);
    }

    /// A client attempt for `shard`, which came `route`; a shard this node does not hold
    /// answers `Unavailable`.
    pub fn handle_client(
        &mut self,
        now: Duration,
        shard: u16,
        tag: RequestTag,
        op: ClientOp,
        route: ClientRoute,
    ) {
        match self.replicas.get_mut(shard) {
            Some(replica) => {
                replica.handle_client(now, tag, op, route);
                self.drain(now, shard);
            }
            None => self
                .replies
                .push_back((shard, tag, ClientReply::Unavailable)),
        }
        self.release_queued_targets(now);
    }

    /// The replica set placement wants for `shard`. A target that would start a move (change
    /// the voters of a shard this node leads) waits while `max_moves` shards are moving here;
    /// while any adds a member or waits, the leaders here hold their handoffs back.
    pub fn handle_target(&mut self, now: Duration, shard: u16, target: Vec<Member>) {
        if !self.replicas.contains_key(shard) {
            return;
        }
        if self.given.get(shard) == Some(&target) {
            self.unqueue_target(shard);
            self.hold_or_release_handoffs(now);
            return;
        }
        let full = self.moving.len() >= self.config.max_moves.max(1);
        if full && !self.moving.contains(&shard) && self.starts_move(shard, &target) {
            let adds = self.adds_member(shard, &target);
            mark(&mut self.queued_adding, shard, adds);
            self.queued_targets.insert(shard, target);
        } else {
            self.give_target(now, shard, target);
        }
        self.hold_or_release_handoffs(now);
    }

    /// The next move of a shard led here that started or ended, oldest first.
    pub fn poll_move(&mut self) -> Option<MoveChange> {
        self.move_changes.pop_front()
    }

    /// The next copy verification a replica leading here decided (after a move).
    pub fn poll_verify(&mut self) -> Option<(u16, VerifyOutcome)> {
        self.verify_outcomes.pop_front()
    }

    /// How many shards this node leads are moving, and how many more wait for their turn.
    pub fn moves(&self) -> (usize, usize) {
        (self.moving.len(), self.queued_targets.len())
    }

    /// Hands `target` to the replica of `shard`.
    fn give_target(&mut self, now: Duration, shard: u16, target: Vec<Member>) {
        self.unqueue_target(shard);
        if self.starts_move(shard, &target) && self.moving.insert(shard) {
            self.move_changes.push_back(MoveChange::Started { shard });
        }
        self.given.insert(shard, target.clone());
        if let Some(replica) = self.replicas.get_mut(shard) {
            replica.handle_target(now, target);
            self.drain(now, shard);
        }
    }

    /// Whether the replica of `shard` leads and its voters are not `target`'s members (or it
    /// has learners): handing it `target` starts, or continues, a move.
    fn starts_move(&self, shard: u16, target: &[Member]) -> bool {
        let Some(replica) = self.replicas.get(shard) else {
            return false;
        };
        if replica.established_ballot().is_none() {
            return false;
        }
        let config = replica.config();
        !config.learners.is_empty()
            || config.voters.len() != target.len()
            || !target.iter().all(|member| config.voters.contains(member))
    }

    /// Hands queued targets over, in shard order, while fewer than `max_moves` shards move.
    fn release_queued_targets(&mut self, now: Duration) {
        while self.moving.len() < self.config.max_moves.max(1)
            && let Some((shard, target)) = self.queued_targets.pop_first()
        {
            self.give_target(now, shard, target);
        }
        self.hold_or_release_handoffs(now);
    }

    /// Whether `target` names a member that is not a voter of the replica of `shard`.
    fn adds_member(&self, shard: u16, target: &[Member]) -> bool {
        self.replicas.get(shard).is_some_and(|replica| {
            let voters = &replica.config().voters;
            target.iter().any(|member| !voters.contains(member))
        })
    }

    /// Forgets the queued target of `shard`, if any.
    fn unqueue_target(&mut self, shard: u16) {
        self.queued_targets.remove(&shard);
        self.queued_adding.remove(&shard);
    }

    /// Whether the leaders here hold their handoffs back (R7): while shards they lead add
    /// members or wait to.
    pub fn handoffs_held(&self) -> bool {
        self.handoffs_held
    }

    /// Holds every leader's handoff back while shards led here add members or wait to,
    /// and lets them all go once none does. Runs after every input; walks the replicas only
    /// when the answer changes.
    fn hold_or_release_handoffs(&mut self, now: Duration) {
        let hold = !self.adding.is_empty() || !self.queued_adding.is_empty();
        if hold == self.handoffs_held {
            return;
        }
        self.handoffs_held = hold;
        let shards: Vec<u16> = self.replicas.keys().collect();
        for shard in shards {
            if let Some(replica) = self.replicas.get_mut(shard) {
                replica.hold_handoff(now, hold);
            }
            self.drain(now, shard);
        }
    }

    /// Members this node's view holds down.
    pub fn handle_view(&mut self, now: Duration, dead: &BTreeSet<NodeId>) {
        let shards: Vec<u16> = self.replicas.keys().collect();
        for shard in shards {
            self.view_one(now, shard, dead);
        }
        self.release_queued_targets(now);
    }

    /// Members this node's view holds down, for the replica of `shard` alone (one just
    /// created; the others already have the view).
    pub fn handle_view_of(&mut self, now: Duration, shard: u16, dead: &BTreeSet<NodeId>) {
        self.view_one(now, shard, dead);
        self.release_queued_targets(now);
    }

    fn view_one(&mut self, now: Duration, shard: u16, dead: &BTreeSet<NodeId>) {
        if let Some(replica) = self.replicas.get_mut(shard) {
            replica.handle_view(now, dead.clone());
        }
        self.drain(now, shard);
    }

    /// The oldest outstanding [`HostPersist`] is durable (any other `batch` is ignored:
    /// batches become durable in the order polled).
    pub fn handle_persisted(&mut self, now: Duration, batch: HostBatchId) {
        if self.in_flight.front().map(|(oldest, _)| *oldest) != Some(batch) {
            return;
        }
        let Some((_, items)) = self.in_flight.pop_front() else {
            return;
        };
        self.persisted_through = Some(batch);
        for (shard, replica_batch) in items {
            self.batch_of.remove(&(shard, replica_batch));
            if let Some(replica) = self.replicas.get_mut(shard) {
                replica.handle_persisted(now, replica_batch);
            }
            self.drain(now, shard);
        }
        self.release();
        self.release_queued_targets(now);
    }

    /// Fires every replica timer due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        while let Some((at, shard)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(replica) = self.replicas.get_mut(shard)
                && let Some((due, timer)) = replica.poll_timeout()
                && due <= now
            {
                replica.handle_timeout(now, timer);
            }
            self.drain(now, shard);
        }
        self.release_reads(now);
        self.release_queued_targets(now);
    }

    /// The next group commit, if there is something to write and fewer than
    /// [`MAX_COMMITS_IN_FLIGHT`] are outstanding.
    pub fn poll_persist(&mut self) -> Option<HostPersist> {
        if self.in_flight.len() >= MAX_COMMITS_IN_FLIGHT || self.open.is_empty() {
            return None;
        }
        let batch = HostBatchId(self.next_batch);
        self.next_batch += 1;
        let shards = std::mem::take(&mut self.open);
        let items = shards
            .iter()
            .map(|(shard, persist)| (*shard, persist.batch))
            .collect();
        self.in_flight.push_back((batch, items));
        for (shard, persist) in &shards {
            self.batch_of.insert((*shard, persist.batch), batch);
        }
        Some(HostPersist { batch, shards })
    }

    /// The next frame to send: released messages for one peer, in order, up to about
    /// [`FRAME_BUDGET`] bytes of keys and values (at least one message), so snapshot chunks
    /// of several shards never make a frame exceed the transport's 4 MiB.
    pub fn poll_transmit(&mut self) -> Option<(NodeId, PeerBatch)> {
        let (peer, queued) = self
            .ready
            .iter_mut()
            .find(|(_, queued)| !queued.is_empty())?;
        let peer = peer.clone();
        let mut size = 0usize;
        let mut take = 0usize;
        for (_, _, message) in queued.iter() {
            let bytes = payload_bytes(message);
            if take > 0 && size + bytes > FRAME_BUDGET {
                break;
            }
            size += bytes;
            take += 1;
        }
        // The frame gets a buffer of its own size; the peer's queue keeps its buffer, so
        // bursts (a heartbeat round of every shard) stop reallocating it once it has grown.
        let messages: Vec<_> = queued.drain(..take).collect();
        Some((
            peer,
            PeerBatch {
                from: self.me.clone(),
                messages,
            },
        ))
    }

    /// The next client answer.
    pub fn poll_reply(&mut self) -> Option<(u16, RequestTag, ClientReply)> {
        self.replies.pop_front()
    }

    /// The next read of this node's disk for a snapshot transfer (R6): answer `Open` and
    /// `Chunk` with [`handle_snapshot_read`](Self::handle_snapshot_read), each shard's in order.
    pub fn poll_snapshot_read(&mut self) -> Option<(u16, SnapshotRead)> {
        self.reads.pop_front()
    }

    /// The answer to a [`SnapshotRead`] of `shard`.
    pub fn handle_snapshot_read(&mut self, now: Duration, shard: u16, reply: SnapshotReadReply) {
        if let SnapshotReadReply::Chunk { pairs, .. } = &reply
            && self.config.move_bytes_per_sec > 0
        {
            let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
            self.refill(now);
            self.move_budget = self
                .move_budget
                .saturating_sub(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        if let Some(replica) = self.replicas.get_mut(shard) {
            replica.handle_snapshot_read(now, reply);
            self.drain(now, shard);
        }
        self.release_queued_targets(now);
    }

    /// When [`handle_timeout`](Self::handle_timeout) next has work: a replica's timer, or
    /// the moment the rate limit lets a held snapshot read go.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let replica = self.deadlines.first().map(|(at, _)| at);
        let read = (!self.held_reads.is_empty()).then(|| {
            let rate = self.config.move_bytes_per_sec.max(1);
            // Reads are held only while the budget is at most 0: wait until it is 1 byte.
            let owed = u64::try_from(1 - self.move_budget.min(0)).unwrap_or(u64::MAX);
            let nanos = (u128::from(owed) * 1_000_000_000).div_ceil(u128::from(rate));
            self.budget_at + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        });
        match (replica, read) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Adds what the rate limit allowed since `budget_at`, up to a burst of a quarter
    /// second's worth (at least one chunk).
    fn refill(&mut self, now: Duration) {
        let rate = self.config.move_bytes_per_sec;
        if rate == 0 || now <= self.budget_at {
            return;
        }
        let nanos = (now - self.budget_at).as_nanos();
        let earned = i64::try_from(u128::from(rate) * nanos / 1_000_000_000).unwrap_or(i64::MAX);
        let chunk = u64::try_from(self.config.snapshot_chunk_bytes).unwrap_or(u64::MAX);
        let burst = i64::try_from((rate / 4).max(chunk)).unwrap_or(i64::MAX);
        self.move_budget = self.move_budget.saturating_add(earned).min(burst);
        self.budget_at = now;
    }

    /// Hands the held snapshot reads to the shell while the budget allows: a chunk only with
    /// budget left, an open or a close as soon as it reaches the head (so each shard's reads
    /// keep the order asked).
    fn release_reads(&mut self, now: Duration) {
        if self.held_reads.is_empty() {
            return;
        }
        self.refill(now);
        while let Some((_, read)) = self.held_reads.front() {
            if matches!(read, SnapshotRead::Chunk { .. }) && self.move_budget <= 0 {
                break;
            }
            if let Some(read) = self.held_reads.pop_front() {
                self.reads.push_back(read);
            }
        }
    }

    /// Collects one replica's outputs.
    fn drain(&mut self, now: Duration, shard: u16) {
        let Some(replica) = self.replicas.get_mut(shard) else {
            return;
        };
        while let Some(persist) = replica.poll_persist() {
            self.open.push((shard, persist));
        }
        let mut outgoing = Vec::new();
        while let Some(message) = replica.poll_message() {
            outgoing.push(message);
        }
        while let Some((tag, reply)) = replica.poll_reply() {
            self.replies.push_back((shard, tag, reply));
        }
        while let Some(outcome) = replica.poll_verify() {
            self.verify_outcomes.push_back((shard, outcome));
        }
        while let Some(read) = replica.poll_snapshot_read() {
            // With a rate limit every read queues behind the held ones: the shell answers in
            // the order asked.
            if self.config.move_bytes_per_sec > 0 {
                self.held_reads.push_back((shard, read));
            } else {
                self.reads.push_back((shard, read));
            }
        }
        // A move ends when the voters are the target; one also starts without a handout when
        // a replica holding its target becomes leader, and it counts from then on.
        if self
            .given
            .get(shard)
            .is_some_and(|target| self.starts_move(shard, target))
        {
            if self.moving.insert(shard) {
                self.move_changes.push_back(MoveChange::Started { shard });
            }
        } else if self.moving.remove(&shard) {
            let done = self
                .replicas
                .get(shard)
                .is_some_and(|replica| replica.established_ballot().is_some());
            self.move_changes
                .push_back(MoveChange::Ended { shard, done });
        }
        let adds = self.moving.contains(&shard)
            && self
                .given
                .get(shard)
                .is_some_and(|target| self.adds_member(shard, target));
        mark(&mut self.adding, shard, adds);
        let Some(replica) = self.replicas.get_mut(shard) else {
            return;
        };
        let deadline = replica.poll_timeout().map(|(at, _)| at);
        self.deadlines.set(shard, deadline);
        for message in outgoing {
            // A replica batch is either still open (it joins the next group commit) or in
            // flight; either way it maps to the host batch that will carry it.
            let after = message.after.map(|batch| {
                self.batch_of
                    .get(&(shard, batch))
                    .copied()
                    .unwrap_or(HostBatchId(self.next_batch))
            });
            self.queue(after, shard, message.to, message.message);
        }
        self.release_reads(now);
    }

    /// Whether messages tagged `after` may leave: untagged ones at once, the others once
    /// their group commit is durable.
    fn is_durable(&self, after: Option<HostBatchId>) -> bool {
        match after {
            None => true,
            Some(batch) => self.persisted_through.is_some_and(|done| batch <= done),
        }
    }

    /// A message goes to its peer's frame at once if it may leave, else waits for its batch.
    /// Messages may overtake waiting ones: frames travel on independent streams anyway, and
    /// the protocol tolerates reordering (the model's network is unordered).
    fn queue(&mut self, after: Option<HostBatchId>, shard: u16, to: Member, message: Message) {
        let peer = to.node.clone();
        if self.is_durable(after) {
            self.ready
                .entry(peer)
                .or_default()
                .push((shard, to, message));
        } else {
            self.waiting.push_back((after, peer, shard, to, message));
        }
    }

    /// Moves messages whose batch is now durable to the per-peer frames, keeping their order.
    /// Runs once per group commit, so it costs one pass over the waiting messages per fsync.
    fn release(&mut self) {
        let spare = std::mem::take(&mut self.waiting_spare);
        let mut passed = std::mem::replace(&mut self.waiting, spare);
        for (after, _, shard, to, message) in passed.drain(..) {
            // Still waiting: back in `waiting`, in order.
            self.queue(after, shard, to, message);
        }
        self.waiting_spare = passed;
    }
}

/// Puts `shard` in `set` or takes it out.
fn mark(set: &mut BTreeSet<u16>, shard: u16, member: bool) {
    if member {
        set.insert(shard);
    } else {
        set.remove(&shard);
    }
}
