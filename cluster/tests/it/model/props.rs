//! The history the clients record, the properties, and the bounds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cluster::replica::{
    Ballot, ClientOp, ClientReply, Config, Durable, Entry, Message, Op, Pos, RequestTag,
    ShardReplica,
};
use stateright::actor::{ActorModel, ActorModelState, Envelope, Id};
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

use super::actor::{ActorState, Knobs, ModelActor, ModelMsg, ReplicaState};

pub(crate) type Model = ActorModel<ModelActor, Knobs, History>;
pub(crate) type State = ActorModelState<ModelActor, History>;

/// What the clients saw (shared: every state clones it).
#[derive(Clone, Debug, Hash, PartialEq)]
pub(crate) struct History(Arc<Record>);

#[derive(Clone, Debug, Hash, PartialEq)]
pub(crate) struct Record {
    /// One thread per request (`2·client + req`): real-time order comes from the returns
    /// before each invocation.
    pub(crate) tester: LinearizabilityTester<u64, Register<Option<Vec<u8>>>>,
    /// `Put` attempts answered `Ok`.
    pub(crate) acked: BTreeSet<RequestTag>,
    /// Attempts answered `Moved` or `Unavailable` (definite: never appended).
    pub(crate) refused: BTreeSet<RequestTag>,
    /// Attempts answered `Superseded` (definite: never applied).
    pub(crate) superseded: BTreeSet<RequestTag>,
    /// `Get`s answered `Ok`.
    pub(crate) reads: u8,
    /// `Get`s answered `Ok` by another replica than `n0` (the first leader).
    pub(crate) reads_elsewhere: u8,
}

impl std::ops::Deref for History {
    type Target = Record;
    fn deref(&self) -> &Record {
        &self.0
    }
}

impl History {
    pub(crate) fn new() -> Self {
        History(Arc::new(Record {
            tester: LinearizabilityTester::new(Register(None)),
            acked: BTreeSet::new(),
            refused: BTreeSet::new(),
            superseded: BTreeSet::new(),
            reads: 0,
            reads_elsewhere: 0,
        }))
    }
}

fn thread(tag: &RequestTag) -> u64 {
    2 * tag.client + tag.req
}

/// A client sends an attempt: the first attempt of a request invokes it.
pub(crate) fn record_out(
    _: &Knobs,
    history: &History,
    envelope: Envelope<&ModelMsg>,
) -> Option<History> {
    let ModelMsg::Request(tag, op) = envelope.msg else {
        return None;
    };
    if tag.attempt != 0 {
        return None;
    }
    let op = match op {
        ClientOp::Put { value, .. } => RegisterOp::Write(Some(value.clone())),
        ClientOp::Get { .. } => RegisterOp::Read,
        ClientOp::Del { .. } => RegisterOp::Write(None),
    };
    let mut history = history.clone();
    // An error marks the history invalid, which fails linearizability.
    let _ = Arc::make_mut(&mut history.0)
        .tester
        .on_invoke(thread(tag), op);
    Some(history)
}

/// A client receives the answer to the attempt it waits for.
pub(crate) fn record_in(
    _: &Knobs,
    history: &History,
    envelope: Envelope<&ModelMsg>,
) -> Option<History> {
    let ModelMsg::Reply(tag, reply) = envelope.msg else {
        return None;
    };
    let mut history = history.clone();
    let record = Arc::make_mut(&mut history.0);
    match reply {
        ClientReply::Ok { value } => {
            if tag.req == 0 {
                let _ = record.tester.on_return(thread(tag), RegisterRet::WriteOk);
                record.acked.insert(*tag);
            } else {
                let _ = record
                    .tester
                    .on_return(thread(tag), RegisterRet::ReadOk(value.clone()));
                record.reads += 1;
                if envelope.src != Id::from(0) {
                    record.reads_elsewhere += 1;
                }
            }
        }
        ClientReply::Moved { .. } | ClientReply::Unavailable => {
            record.refused.insert(*tag);
        }
        ClientReply::Superseded => {
            record.superseded.insert(*tag);
        }
        ClientReply::Indeterminate => return None,
    }
    Some(history)
}

// ---- views of a state ----

/// The replicas' states (actors `0..`, before the clients).
fn replicas(state: &State) -> impl Iterator<Item = (usize, &ReplicaState)> {
    state
        .actor_states
        .iter()
        .map_while(|actor| match &**actor {
            ActorState::Replica(replica) => Some(&**replica),
            _ => None,
        })
        .enumerate()
}

/// The replicas that run (not crashed).
fn live(state: &State) -> impl Iterator<Item = &ShardReplica> {
    replicas(state)
        .filter(|(i, _)| !state.crashed[*i])
        .map(|(_, r)| &r.replica)
}

/// What each replica holds: its in-memory durable state if it runs, else its disk.
fn current(state: &State) -> impl Iterator<Item = &Durable> {
    replicas(state).map(|(i, r)| {
        if state.crashed[i] {
            &*r.disk
        } else {
            r.replica.durable()
        }
    })
}

fn disks(state: &State) -> impl Iterator<Item = &Durable> {
    replicas(state).map(|(_, r)| &*r.disk)
}

/// Every log: in memory (of running replicas) and on disk.
fn logs(state: &State) -> Vec<&[Entry]> {
    live(state)
        .map(|r| r.durable().log.as_slice())
        .chain(disks(state).map(|d| d.log.as_slice()))
        .collect()
}

/// Entries in flight: in `Append`s and in promises' suffixes.
fn in_flight(state: &State) -> Vec<&Entry> {
    let mut entries = Vec::new();
    for envelope in state.network.iter_deliverable() {
        if let ModelMsg::Replica(message) = envelope.msg {
            match &message.2 {
                Message::Append { entries: e, .. } => entries.extend(e),
                Message::Promise {
                    suffix: Some(e), ..
                } => entries.extend(e),
                _ => {}
            }
        }
    }
    entries
}

fn at(log: &[Entry], index: u64) -> Option<&Entry> {
    let entry = log.get(usize::try_from(index.checked_sub(1)?).ok()?)?;
    assert_eq!(entry.index, index, "the model never compacts a log");
    Some(entry)
}

// ---- Always ----

/// I1: no two running replicas lead one ballot; no `Pos` holds two different entries anywhere
/// (logs, disks, messages in flight); each ballot's `EpochStart` sits at one index. A ballot
/// opened twice (a promise forgotten in a crash) shows as one of the last two.
pub(crate) fn one_leader_per_ballot(_: &Model, state: &State) -> bool {
    let mut leading = BTreeSet::new();
    for replica in live(state) {
        if let Some(b) = replica.leading_ballot()
            && !leading.insert(b.clone())
        {
            return false;
        }
    }
    let mut at_pos: BTreeMap<Pos, &Entry> = BTreeMap::new();
    let mut epochs: BTreeMap<&Ballot, u64> = BTreeMap::new();
    let all = logs(state).into_iter().flatten().chain(in_flight(state));
    for entry in all {
        if *at_pos.entry(entry.pos()).or_insert(entry) != entry {
            return false;
        }
        if entry.op == Op::EpochStart
            && *epochs.entry(&entry.ballot).or_insert(entry.index) != entry.index
        {
            return false;
        }
    }
    true
}

/// I2: two logs holding an entry at the same `Pos` hold the same entries up to it.
pub(crate) fn log_matching(_: &Model, state: &State) -> bool {
    let logs = logs(state);
    for (k, a) in logs.iter().enumerate() {
        for b in &logs[k + 1..] {
            let shared = a
                .iter()
                .zip(b.iter())
                .rposition(|(x, y)| x.pos() == y.pos());
            if let Some(last) = shared
                && a[..=last] != b[..=last]
            {
                return false;
            }
        }
    }
    true
}

/// Committed (or applied) prefixes never disagree: each running replica up to its `commit`,
/// each disk up to its `applied`.
pub(crate) fn committed_prefixes_agree(_: &Model, state: &State) -> bool {
    let mut prefixes: Vec<&[Entry]> = Vec::new();
    for (i, r) in replicas(state) {
        let disk = &*r.disk;
        let upto = usize::try_from(disk.applied).expect("small");
        prefixes.push(&disk.log[..upto.min(disk.log.len())]);
        if !state.crashed[i] {
            let log = &r.replica.durable().log;
            let upto = usize::try_from(r.replica.commit()).expect("small");
            prefixes.push(&log[..upto.min(log.len())]);
        }
    }
    for (k, a) in prefixes.iter().enumerate() {
        for b in &prefixes[k + 1..] {
            let n = a.len().min(b.len());
            if a[..n] != b[..n] {
                return false;
            }
        }
    }
    true
}

/// Where the write of attempt `tag` sits: the first log (memory or disk) holding it.
fn find(state: &State, tag: &RequestTag) -> Option<Entry> {
    logs(state)
        .into_iter()
        .flatten()
        .find(|e| e.tag.as_ref() == Some(tag))
        .cloned()
}

/// I3, I4: every acknowledged `Put` is on a majority of disks at one `Pos`, in the log of every
/// established leader of a higher ballot, and in every state applied past it.
pub(crate) fn acked_writes_survive(_: &Model, state: &State) -> bool {
    for tag in &state.history.acked {
        let Some(write) = find(state, tag) else {
            return false;
        };
        let holds = |log: &[Entry]| at(log, write.index) == Some(&write);
        if logs(state)
            .into_iter()
            .flatten()
            .any(|e| e.tag.as_ref() == Some(tag) && *e != write)
        {
            return false;
        }
        // On a majority of the smallest config's disks, less the disks wiped since.
        let wiped: usize = replicas(state).map(|(_, r)| usize::from(r.wipes)).sum();
        let on_disk = disks(state).filter(|d| holds(&d.log)).count();
        if on_disk + wiped < 2 {
            return false;
        }
        for replica in live(state) {
            if let Some(b) = replica.established_ballot()
                && *b > write.ballot
                && !holds(&replica.durable().log)
            {
                return false;
            }
        }
        for durable in current(state).chain(disks(state)) {
            // A tombstone keeps nothing (R8).
            if durable.tombstone.is_none() && durable.applied >= write.index && !holds(&durable.log)
            {
                return false;
            }
        }
    }
    true
}

/// I8 and R10: an attempt answered `Moved` or `Unavailable` is in no log and no message.
pub(crate) fn refused_never_appended(_: &Model, state: &State) -> bool {
    if state.history.refused.is_empty() {
        return true;
    }
    let all = logs(state).into_iter().flatten().chain(in_flight(state));
    for entry in all {
        if let Some(tag) = &entry.tag
            && state.history.refused.contains(tag)
        {
            return false;
        }
    }
    true
}

/// R10: an attempt answered `Superseded` is applied by no replica, in memory or on disk:
/// wherever its entry sits in a log, that replica has not applied up to it (and so, with
/// committed prefixes agreeing, never will, as another entry committed at that index).
pub(crate) fn superseded_never_applied(_: &Model, state: &State) -> bool {
    if state.history.superseded.is_empty() {
        return true;
    }
    let mut durables = live(state).map(ShardReplica::durable).chain(disks(state));
    durables.all(|durable| {
        durable.log.iter().all(|entry| {
            entry.index > durable.applied
                || entry
                    .tag
                    .as_ref()
                    .is_none_or(|tag| !state.history.superseded.contains(tag))
        })
    })
}

/// I7: the clients' history of the one key is linearizable.
pub(crate) fn linearizable(_: &Model, state: &State) -> bool {
    state.history.tester.serialized_history().is_some()
}

/// No assertion of the core failed (e.g. R4's "a committed entry would be truncated").
pub(crate) fn no_failed_assertion(_: &Model, state: &State) -> bool {
    replicas(state).all(|(_, r)| r.panicked.is_none())
}

/// I5: a leader opened its ballot only with promises of members (node and storage) that are
/// voters of a config in its log.
pub(crate) fn promises_from_members(_: &Model, state: &State) -> bool {
    live(state).all(|leader| {
        let durable = leader.durable();
        let configs: Vec<&Config> = std::iter::once(&durable.base.config)
            .chain(durable.log.iter().filter_map(|e| match &e.op {
                Op::Config(config) => Some(config),
                _ => None,
            }))
            .collect();
        leader
            .promisers()
            .iter()
            .all(|promiser| configs.iter().any(|config| config.is_voter(promiser)))
    })
}

/// R5: in every log, each `Config` differs from the one before it by at most one voter
/// (voters reordered count as no change).
pub(crate) fn one_voter_changes(_: &Model, state: &State) -> bool {
    let voters = |config: &Config| config.voters.iter().cloned().collect::<BTreeSet<_>>();
    current(state).chain(disks(state)).all(|durable| {
        let mut before = voters(&durable.base.config);
        for entry in &durable.log {
            if let Op::Config(config) = &entry.op {
                let after = voters(config);
                if before.symmetric_difference(&after).count() > 1 && !before.is_empty() {
                    return false;
                }
                before = after;
            }
        }
        true
    })
}

// ---- Sometimes ----

pub(crate) fn write_acked_at_n2(_: &Model, state: &State) -> bool {
    state
        .history
        .acked
        .iter()
        .any(|tag| find(state, tag).is_some_and(|e| e.ballot.n >= 2))
}

pub(crate) fn read_served(_: &Model, state: &State) -> bool {
    state.history.reads > 0
}

/// M3: a read served by the replica the leadership was handed to.
pub(crate) fn read_after_handoff(_: &Model, state: &State) -> bool {
    state.history.reads_elsewhere > 0
}

/// M2: a replica that was not a first voter is a voter of a config in some log.
pub(crate) fn learner_promoted(model: &Model, state: &State) -> bool {
    let first = model.cfg.scenario.voters();
    current(state).any(|durable| {
        durable.log.iter().any(|entry| match &entry.op {
            Op::Config(config) => config
                .voters
                .iter()
                .any(|v| super::actor::index_of(&v.node) >= first),
            _ => false,
        })
    })
}

/// M4: a removed replica tombstoned its copy on disk.
pub(crate) fn tombstone_written(_: &Model, state: &State) -> bool {
    disks(state).any(|disk| disk.tombstone.is_some())
}

/// Figure 8's dangerous step (Figure8): a leader holds, uncommitted, an entry of an older
/// ballot that a majority of disks hold at its position. Counting its replicas would commit
/// it; R4 waits for an entry of the leader's own ballot.
pub(crate) fn old_entry_on_majority(model: &Model, state: &State) -> bool {
    let majority = model.cfg.scenario.first_config().majority();
    live(state).any(|leader| {
        let Some(b) = leader.leading_ballot() else {
            return false;
        };
        leader
            .durable()
            .log
            .iter()
            .filter(|entry| entry.ballot < *b && entry.index > leader.commit())
            .any(|entry| {
                disks(state)
                    .filter(|disk| at(&disk.log, entry.index) == Some(entry))
                    .count()
                    >= majority
            })
    })
}

/// Two candidates stand at the same `n` at once (a duel).
pub(crate) fn two_candidates_at_same_n(_: &Model, state: &State) -> bool {
    let mut seen = BTreeSet::new();
    live(state)
        .filter_map(ShardReplica::candidate_ballot)
        .any(|b| !seen.insert(b.n))
}

// ---- bounds ----

/// Ballots `n ≤ max_n`, logs `≤ max_log` entries, heartbeat rounds `≤ max_hb`, restarts
/// `≤ max_restarts` in all; clients never crash (only replicas do).
pub(crate) fn within_boundary(knobs: &Knobs, state: &State) -> bool {
    let count = knobs.scenario.replicas();
    if state.crashed[count..].iter().any(|&c| c) {
        return false;
    }
    if replicas(state).map(|(_, r)| r.boots).sum::<u8>() > knobs.max_restarts
        || replicas(state).map(|(_, r)| r.wipes).sum::<u8>() > knobs.max_wipes
    {
        return false;
    }
    for (_, r) in replicas(state) {
        for durable in [r.replica.durable(), &*r.disk] {
            let configs = durable
                .log
                .iter()
                .filter(|e| matches!(e.op, Op::Config(_)))
                .count();
            if durable.promised.as_ref().is_some_and(|b| b.n > knobs.max_n)
                || durable.log.len() > knobs.max_log
                || configs > knobs.max_configs
            {
                return false;
            }
        }
    }
    state
        .network
        .iter_deliverable()
        .all(|envelope| match envelope.msg {
            ModelMsg::Replica(message) => match &message.2 {
                Message::Append { hb_seq, .. } => *hb_seq <= knobs.max_hb,
                Message::ReadRound { round, .. } | Message::ReadRoundOk { round, .. } => {
                    *round <= knobs.max_hb
                }
                _ => true,
            },
            _ => true,
        })
}
