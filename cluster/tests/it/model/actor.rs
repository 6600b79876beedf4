//! The stateright actors: a thin adapter over the real [`ShardReplica`], and a client.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Once};
use std::time::Duration;

use cluster::replica::{
    Ballot, BatchId, Change, ClientOp, ClientReply, ClientRoute, Config, Durable, Entry, Member,
    Message, Mutations, Op, Outgoing, Persist, ReplicaConfig, RequestTag, ShardReplica, StorageId,
    Timer,
};
use stateright::actor::{Actor, Id, Out, model_timeout};

use crate::net::name;

/// The one key the clients use.
pub(crate) const KEY: &[u8] = b"k";
const SHARD: u16 = 7;
/// `T_elect`. Every handler runs at `now = 0` except `Prepare`, which runs at `now = T_ELECT`:
/// a follower then never holds a `Prepare` off as sticky (the last `Append` it heard, at 0, is
/// `T_elect` old), and a leader's check-quorum never fires (`now - since` is 0). Time is not
/// modeled; safety must hold whatever the clocks say.
const T_ELECT: Duration = Duration::from_secs(1);

/// Replica `index` as created (`wipes = 0`), or after its `wipes`-th wipe: a new `StorageId`.
pub(crate) fn member_of(index: usize, wipes: u8) -> Member {
    Member {
        node: name(index),
        storage: StorageId(100 + index as u128 + 10 * u128::from(wipes)),
    }
}

/// Replica `index` as created.
pub(crate) fn member(index: usize) -> Member {
    member_of(index, 0)
}

/// The replica on `node` (names are `n<index>`).
pub(crate) fn index_of(node: &topology::NodeId) -> usize {
    node.as_str()
        .strip_prefix('n')
        .and_then(|i| i.parse().ok())
        .expect("a replica of the model")
}

/// The models of PROTOCOL.md §3: who the replicas are, how they start, and which placement
/// targets the environment hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scenario {
    /// M1 failover: 3 voters, `n0` established at `1.n0`.
    M1,
    /// M2 reconfiguration: M1 plus a spare `n3`; `n0` and `n1` (only) get the target
    /// `[n1, n2, n3]`: learner `n3`, promote it, hand off to `n1`, remove `n0`.
    M2,
    /// M3 handoff and reads: M1 where `n0` and `n1` get the target `[n1, n0, n2]`, so `n0`
    /// hands off to `n1` (R7).
    M3,
    /// M4 amnesia and removal: M1 where `n0` gets the target `[n0, n1]` (so `n2` is removed
    /// and tombstoned) and a replica may be wiped: it restarts with a new `StorageId` and an
    /// empty log, bootstrapped with the first config (what a careless shell would do).
    M4,
    /// Raft's single-server change bug (Ongaro, raft-dev 2015), hand-built: voters
    /// `n0..n3` committed `EpochStart(1.n0)`; `n0` then appended `Config(n0..n4)` that only
    /// `n0` and `n4` hold, and stepped down. `n1` gets the target `[n1, n2, n3]`.
    Config2015,
    /// Raft's Figure 8, hand-built ([`figure_8`]): 3 voters; `n0` holds a write `X` of
    /// ballot `1.n0` at index 2 that no other replica has, `n2` holds a conflicting
    /// `EpochStart(1.n2)` at index 2, `n1` promised `1.n2` and holds neither. `n0` can lead
    /// `2.n0` and put `X` on a majority (with `n1`), after which `n2` can win `2.n2` with
    /// `n1`'s promise and overwrite `X`.
    Figure8,
}

impl Scenario {
    /// How many replicas (actors `0..replicas`; clients follow, then the environment).
    pub(crate) fn replicas(self) -> usize {
        match self {
            Scenario::M1 | Scenario::M3 | Scenario::M4 | Scenario::Figure8 => 3,
            Scenario::M2 => 4,
            Scenario::Config2015 => 5,
        }
    }

    /// The first config's voters: replicas `0..voters`.
    pub(crate) fn voters(self) -> usize {
        match self {
            Scenario::Config2015 => 4,
            _ => 3,
        }
    }

    /// The placement targets the environment sends: `(replica, target)`.
    pub(crate) fn targets(self) -> &'static [(usize, &'static [usize])] {
        match self {
            Scenario::M1 | Scenario::Figure8 => &[],
            Scenario::M2 => &[(0, &[1, 2, 3]), (1, &[1, 2, 3])],
            Scenario::M3 => &[(0, &[1, 0, 2]), (1, &[1, 0, 2])],
            Scenario::M4 => &[(0, &[0, 1])],
            Scenario::Config2015 => &[(1, &[1, 2, 3])],
        }
    }

    /// The first config.
    pub(crate) fn first_config(self) -> Config {
        Config {
            voters: (0..self.voters()).map(member).collect(),
            learners: Vec::new(),
        }
    }
}

/// Knobs of one model run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Knobs {
    /// The model.
    pub(crate) scenario: Scenario,
    /// The switches the replicas run with.
    pub(crate) mutations: Mutations,
    /// Entries per `Append` (1 makes a follower acknowledge old entries apart from the
    /// leader's `EpochStart`, which Raft's Figure 8 needs).
    pub(crate) max_append: usize,
    /// Bound: every ballot's `n`.
    pub(crate) max_n: u64,
    /// Bound: every log's length.
    pub(crate) max_log: usize,
    /// Bound: every heartbeat round number.
    pub(crate) max_hb: u64,
    /// Bound: crash-restarts, in all (the `Restart` timer, and stateright's `Recover`).
    pub(crate) max_restarts: u8,
    /// Bound: wipes, in all (the `Wipe` timer).
    pub(crate) max_wipes: u8,
    /// Bound: `Config` entries in any log.
    pub(crate) max_configs: usize,
    /// Whether a leader's `Heartbeat` timer fires by itself (a read asks for its own round
    /// either way).
    pub(crate) heartbeat_timer: bool,
    /// Whether crashes are the `Restart` timer (else stateright's `Crash` and `Recover`).
    pub(crate) restart_timer: bool,
    /// Whether an fsync is a step of its own (the `Fsync` timer) instead of part of the
    /// handler's step: messages that wait for no batch leave at once, the others when their
    /// batch is durable, and a crash in between loses the batch. This is how the model sees a
    /// core that sends before it saves.
    pub(crate) deferred_fsync: bool,
}

/// The model's timers: the replica's two, and a crash-restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ModelTimer {
    /// `Timer::Election`: a replica that does not lead stands.
    Election,
    /// `Timer::Heartbeat`: a leader sends a round.
    Heartbeat,
    /// The replica crashes and restarts from its disk at once (see `model.rs`).
    Restart,
    /// The replica loses its disk and restarts as a new member (M4).
    Wipe,
    /// The replica's unsynced batches become durable (`Knobs::deferred_fsync`).
    Fsync,
}

/// What a replica keeps across a crash: its disk image, and how often it restarted or was
/// wiped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Saved {
    pub(crate) disk: Arc<Durable>,
    pub(crate) boots: u8,
    pub(crate) wipes: u8,
}

fn replica_config(knobs: Knobs) -> ReplicaConfig {
    ReplicaConfig {
        t_elect: T_ELECT,
        t_step: Duration::ZERO,
        jitter: Duration::ZERO,
        heartbeat: Duration::from_millis(100),
        t_disk: Duration::from_secs(3600),
        max_append: knobs.max_append,
        // Placement policy, not protocol: the models remove voters down to two (M4).
        min_voters: 2,
        // Time is not modeled: a leader never turns idle (its flag would only split states).
        idle_heartbeat: Duration::from_secs(3600),
        // Copy verification removes only copies that differ, which the protocol never makes:
        // its messages would only split states.
        verify_copies: false,
        // The retired copy is disk space, not protocol state: gone with the tombstone.
        retired_grace: Duration::ZERO,
        // A removed learner's probe is liveness (its copy lingers, never serving): its timer
        // would only split states.
        learner_probe: Duration::ZERO,
        // Skipping a round's message to a follower that just had one only omits a message,
        // which the model's network may do anyway: a timed rule would only split states.
        heartbeat_skip_recent: Duration::ZERO,
        // The pre-vote changes nothing durable and only ever removes a candidacy: safety is
        // the `Prepare`'s. Its messages would multiply the states (docs/protocol.md).
        pre_vote: false,
        ..ReplicaConfig::default()
    }
}

/// Messages: between replicas, and client attempts and their answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ModelMsg {
    /// Replica to replica, from and to a member (shared: states clone the network).
    Replica(Arc<(Member, Member, Message)>),
    /// The environment's placement target for a replica.
    Target(Vec<Member>),
    /// Client to replica.
    Request(RequestTag, ClientOp),
    /// Replica to client.
    Reply(RequestTag, ClientReply),
}

// stateright wants `Ord` messages (it sorts actions): by hash, then by the `Debug` text
// (which tells different messages apart), consistent with `Eq`.
impl Ord for ModelMsg {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let hash = |msg: &ModelMsg| {
            let mut hasher = DefaultHasher::new();
            msg.hash(&mut hasher);
            hasher.finish()
        };
        hash(self).cmp(&hash(other)).then_with(|| {
            if self == other {
                return std::cmp::Ordering::Equal;
            }
            format!("{self:?}").cmp(&format!("{other:?}"))
        })
    }
}

impl PartialOrd for ModelMsg {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A replica actor's state: the real replica, and its disk image as the `Persist` batches
/// built it (the same as `replica.durable()` unless a mutation skips a write).
#[derive(Clone)]
pub(crate) struct ReplicaState {
    pub(crate) replica: ShardReplica,
    pub(crate) disk: Arc<Durable>,
    /// Restarts so far.
    pub(crate) boots: u8,
    /// Wipes so far.
    pub(crate) wipes: u8,
    /// The message of an assertion the core failed in a handler (the replica is then frozen).
    pub(crate) panicked: Option<String>,
    /// Batches not yet durable (`Knobs::deferred_fsync`).
    unsynced: Vec<Persist>,
    /// Messages waiting for a batch that is not yet durable.
    held: Vec<Outgoing>,
    /// The last batch made durable since the start.
    synced: Option<BatchId>,
    /// The fingerprint: see [`canon`].
    canon: u64,
}

impl ReplicaState {
    fn new(replica: ShardReplica, disk: Arc<Durable>, boots: u8, wipes: u8) -> Self {
        let mut state = ReplicaState {
            replica,
            disk,
            boots,
            wipes,
            panicked: None,
            unsynced: Vec::new(),
            held: Vec::new(),
            synced: None,
            canon: 0,
        };
        state.canon = canon(&state);
        state
    }
}

impl std::fmt::Debug for ReplicaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("ReplicaState");
        s.field("replica", &self.replica);
        if *self.disk != *self.replica.durable() {
            s.field("disk", &self.disk);
        }
        if let Some(panicked) = &self.panicked {
            s.field("panicked", panicked);
        }
        s.finish()
    }
}

impl PartialEq for ReplicaState {
    fn eq(&self, other: &Self) -> bool {
        self.canon == other.canon
    }
}

impl Hash for ReplicaState {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.canon.hash(state);
    }
}

/// The replica's fingerprint: its [`ShardReplica::hash_for_model`] (every field but the jitter
/// generator, the batch counter and the timer deadlines, which never change its behaviour in
/// the model: it fires timers nondeterministically, with no jitter), the disk image and the
/// failed assertion, if any.
fn canon(state: &ReplicaState) -> u64 {
    let mut hasher = DefaultHasher::new();
    state.replica.hash_for_model(&mut hasher);
    state.disk.hash(&mut hasher);
    state.boots.hash(&mut hasher);
    state.wipes.hash(&mut hasher);
    state.panicked.hash(&mut hasher);
    state.unsynced.hash(&mut hasher);
    state.held.hash(&mut hasher);
    state.synced.hash(&mut hasher);
    hasher.finish()
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, turning a panic (a failed assertion of the core) into an error, without printing
/// it: the model reports it as a property violation with a trace.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string())
    })
}

/// What one client does: a `Put` of its value, then a `Get`, each sent first to its own target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientPlan {
    pub(crate) put_to: usize,
    pub(crate) get_to: usize,
}

/// How many `Moved` answers a client follows, in all.
const MAX_MOVES: u8 = 2;

/// A client's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ClientState {
    /// 0: the `Put`; 1: the `Get`; 2: done.
    req: u64,
    attempt: u32,
    moves: u8,
    target: usize,
}

/// The model's actors.
#[derive(Debug, Clone)]
pub(crate) enum ModelActor {
    Replica {
        index: usize,
        knobs: Knobs,
    },
    Client {
        client: u64,
        plan: ClientPlan,
    },
    /// Sends the scenario's placement targets at start.
    Env {
        scenario: Scenario,
    },
}

/// Their states.
#[derive(Debug, Clone, PartialEq, Hash)]
pub(crate) enum ActorState {
    Replica(Box<ReplicaState>),
    Client(ClientState),
    Env,
}

pub(crate) fn client_id(knobs: Knobs, client: u64) -> Id {
    Id::from(knobs.scenario.replicas() + usize::try_from(client).expect("small"))
}

pub(crate) fn put_value(client: u64) -> Vec<u8> {
    vec![b'a' + u8::try_from(client).expect("small")]
}

fn client_op(client: u64, req: u64) -> ClientOp {
    match req {
        0 => ClientOp::Put {
            key: KEY.to_vec(),
            value: put_value(client),
        },
        _ => ClientOp::Get { key: KEY.to_vec() },
    }
}

/// Applies a batch to the disk image, as the shell's redb transaction would.
fn apply(disk: &mut Durable, changes: &[Change]) {
    for change in changes {
        disk.apply_change(change);
    }
}

/// Persists every batch at once (saving the disk image, then `handle_persisted`), sends every
/// message and reply, and sets the timers for the new role: all in one step, which is R0.
/// With `Knobs::deferred_fsync`, batches wait for the `Fsync` timer ([`fsync`]) instead, and
/// so do the messages tagged with them.
fn drain(knobs: Knobs, state: &mut ReplicaState, o: &mut Out<ModelActor>) {
    let now = Duration::ZERO;
    let mut saved = false;
    loop {
        let mut progressed = false;
        while let Some(persist) = state.replica.poll_persist() {
            progressed = true;
            if knobs.deferred_fsync {
                state.unsynced.push(persist);
                continue;
            }
            apply(Arc::make_mut(&mut state.disk), &persist.changes);
            saved = true;
            state.synced = Some(persist.batch);
            state.replica.handle_persisted(now, persist.batch);
        }
        while let Some(outgoing) = state.replica.poll_message() {
            progressed = true;
            if outgoing
                .after
                .is_some_and(|batch| state.synced < Some(batch))
            {
                state.held.push(outgoing);
                continue;
            }
            send(state, outgoing, o);
        }
        while let Some((tag, reply)) = state.replica.poll_reply() {
            o.send(client_id(knobs, tag.client), ModelMsg::Reply(tag, reply));
            progressed = true;
        }
        assert!(
            state.replica.poll_snapshot_read().is_none(),
            "the model never compacts a log, so no leader sends a snapshot"
        );
        if !progressed {
            break;
        }
    }
    if saved {
        o.save(saved_of(state));
    }
}

fn send(state: &ReplicaState, outgoing: Outgoing, o: &mut Out<ModelActor>) {
    let from = state.replica.me().clone();
    o.send(
        Id::from(index_of(&outgoing.to.node)),
        ModelMsg::Replica(Arc::new((from, outgoing.to, outgoing.message))),
    );
}

/// The `Fsync` timer: the unsynced batches become durable, in order; the messages they held
/// leave.
fn fsync(knobs: Knobs, state: &mut ReplicaState, o: &mut Out<ModelActor>) {
    let now = Duration::ZERO;
    for persist in std::mem::take(&mut state.unsynced) {
        apply(Arc::make_mut(&mut state.disk), &persist.changes);
        state.synced = Some(persist.batch);
        state.replica.handle_persisted(now, persist.batch);
    }
    o.save(saved_of(state));
    for outgoing in std::mem::take(&mut state.held) {
        if outgoing
            .after
            .is_some_and(|batch| state.synced < Some(batch))
        {
            state.held.push(outgoing);
        } else {
            send(state, outgoing, o);
        }
    }
    drain(knobs, state, o);
}

fn saved_of(state: &ReplicaState) -> Saved {
    Saved {
        disk: Arc::clone(&state.disk),
        boots: state.boots,
        wipes: state.wipes,
    }
}

fn set_timers(state: &ReplicaState, knobs: Knobs, o: &mut Out<ModelActor>) {
    if state.panicked.is_some() {
        o.cancel_timer(ModelTimer::Heartbeat);
        o.cancel_timer(ModelTimer::Election);
        o.cancel_timer(ModelTimer::Restart);
        o.cancel_timer(ModelTimer::Wipe);
        o.cancel_timer(ModelTimer::Fsync);
        return;
    }
    if state.replica.leading_ballot().is_some() {
        if knobs.heartbeat_timer {
            o.set_timer(ModelTimer::Heartbeat, model_timeout());
        }
        o.cancel_timer(ModelTimer::Election);
    } else {
        o.set_timer(ModelTimer::Election, model_timeout());
        o.cancel_timer(ModelTimer::Heartbeat);
    }
    if knobs.restart_timer && state.boots < knobs.max_restarts {
        o.set_timer(ModelTimer::Restart, model_timeout());
    } else {
        o.cancel_timer(ModelTimer::Restart);
    }
    if state.wipes < knobs.max_wipes {
        o.set_timer(ModelTimer::Wipe, model_timeout());
    } else {
        o.cancel_timer(ModelTimer::Wipe);
    }
    if state.unsynced.is_empty() {
        o.cancel_timer(ModelTimer::Fsync);
    } else {
        o.set_timer(ModelTimer::Fsync, model_timeout());
    }
}

/// Runs one input through the replica (catching a failed assertion) and drains it. Always a
/// step, even when nothing changes: a message that changes nothing is consumed, as delivered
/// (stateright would otherwise keep it in flight forever, splitting states by whether it was
/// delivered), and a timer that changes nothing stays set.
fn step(
    state: &mut Cow<ActorState>,
    knobs: Knobs,
    o: &mut Out<ModelActor>,
    input: impl FnOnce(&mut ShardReplica),
) {
    step_state(state, knobs, o, |next, out| {
        input(&mut next.replica);
        drain(knobs, next, out);
    });
}

/// [`step`] with access to the adapter's state too.
fn step_state(
    state: &mut Cow<ActorState>,
    knobs: Knobs,
    o: &mut Out<ModelActor>,
    input: impl FnOnce(&mut ReplicaState, &mut Out<ModelActor>),
) {
    let ActorState::Replica(current) = &**state else {
        unreachable!("a replica")
    };
    let mut next: ReplicaState = (**current).clone();
    if current.panicked.is_none() {
        let result = guarded(|| {
            let mut out = Out::new();
            input(&mut next, &mut out);
            out
        });
        match result {
            Ok(mut out) => {
                if !out.is_empty()
                    || next.replica != current.replica
                    || next.unsynced != current.unsynced
                {
                    next.canon = canon(&next);
                }
                o.append(&mut out);
            }
            Err(message) => {
                // Keep the state before the failed handler, frozen, for the properties.
                next = (**current).clone();
                next.panicked = Some(message);
                next.canon = canon(&next);
            }
        }
    }
    set_timers(&next, knobs, o);
    *state.to_mut() = ActorState::Replica(Box::new(next));
}

/// A replica on `index` starting from `durable`, as member `me`.
fn start(index: usize, me: Member, durable: Durable, knobs: Knobs) -> ShardReplica {
    let mut replica = ShardReplica::new(
        Duration::ZERO,
        SHARD,
        me,
        durable,
        replica_config(knobs),
        index as u64,
    );
    replica.set_mutations(knobs.mutations);
    replica
}

/// A replica restarted from `saved`: only the disk survives.
fn recover(index: usize, knobs: Knobs, saved: &Saved) -> ReplicaState {
    let me = member_of(index, saved.wipes);
    let replica = start(index, me, Durable::clone(&saved.disk), knobs);
    ReplicaState::new(
        replica,
        Arc::clone(&saved.disk),
        saved.boots + 1,
        saved.wipes,
    )
}

/// A replica that lost its disk: a new member, bootstrapped with the first config.
fn wiped(index: usize, knobs: Knobs, current: &ReplicaState) -> ReplicaState {
    let wipes = current.wipes + 1;
    let durable = Durable::bootstrap(knobs.scenario.first_config());
    let replica = start(index, member_of(index, wipes), durable.clone(), knobs);
    ReplicaState::new(replica, Arc::new(durable), current.boots, wipes)
}

/// The replicas' first states.
pub(crate) fn initial(knobs: Knobs) -> Vec<ReplicaState> {
    match knobs.scenario {
        Scenario::Config2015 => config_2015(knobs),
        Scenario::Figure8 => figure_8(knobs),
        _ => elected(knobs),
    }
}

/// The replicas after the first election: `n0` has won ballot `1.n0`, its `EpochStart` is
/// committed and every message was delivered. Driven through the real code. Replicas past
/// the first config's voters start empty (spares).
fn elected(knobs: Knobs) -> Vec<ReplicaState> {
    let scenario = knobs.scenario;
    let mut states: Vec<ReplicaState> = (0..scenario.replicas())
        .map(|i| {
            let durable = if i < scenario.voters() {
                Durable::bootstrap(scenario.first_config())
            } else {
                Durable::empty()
            };
            let replica = start(i, member(i), durable.clone(), knobs);
            ReplicaState::new(replica, Arc::new(durable), 0, 0)
        })
        .collect();
    let mut queue = std::collections::VecDeque::new();
    // The first election runs with every fsync done at once.
    let at_once = Knobs {
        deferred_fsync: false,
        ..knobs
    };
    let run = |states: &mut Vec<ReplicaState>,
               i: usize,
               queue: &mut std::collections::VecDeque<(Id, ModelMsg)>,
               input: &dyn Fn(&mut ShardReplica)| {
        input(&mut states[i].replica);
        let mut out = Out::new();
        drain(at_once, &mut states[i], &mut out);
        for command in out {
            if let stateright::actor::Command::Send(to, msg) = command {
                queue.push_back((to, msg));
            }
        }
    };
    run(&mut states, 0, &mut queue, &|r| {
        r.handle_timeout(Duration::ZERO, Timer::Election);
    });
    while let Some((to, msg)) = queue.pop_front() {
        let ModelMsg::Replica(message) = msg else {
            unreachable!("no clients yet")
        };
        let (from, to_member, message) = &*message;
        let now = now_for(message);
        run(&mut states, usize::from(to), &mut queue, &|r| {
            r.handle_message(now, from.clone(), to_member.clone(), message.clone());
        });
    }
    assert!(
        states[0].replica.established_ballot().is_some(),
        "n0 leads after the first election"
    );
    for state in &mut states {
        state.canon = canon(state);
    }
    states
}

/// [`Scenario::Config2015`]'s hand-built disks; every replica restarts from its own.
fn config_2015(knobs: Knobs) -> Vec<ReplicaState> {
    let scenario = knobs.scenario;
    let b1 = Ballot {
        n: 1,
        node: name(0),
    };
    let epoch = Entry {
        ballot: b1.clone(),
        index: 1,
        op: Op::EpochStart,
        tag: None,
    };
    let five = Config {
        voters: (0..5).map(member).collect(),
        learners: Vec::new(),
    };
    let change = Entry {
        ballot: b1.clone(),
        index: 2,
        op: Op::Config(five),
        tag: None,
    };
    (0..scenario.replicas())
        .map(|i| {
            let mut durable = Durable::bootstrap(scenario.first_config());
            durable.promised = Some(b1.clone());
            durable.log.push(epoch.clone());
            durable.applied = 1;
            if i == 0 || i == 4 {
                durable.log.push(change.clone());
            }
            let replica = start(i, member(i), durable.clone(), knobs);
            ReplicaState::new(replica, Arc::new(durable), 0, 0)
        })
        .collect()
}

/// [`Scenario::Figure8`]'s hand-built disks (Raft's Figure 8, in this protocol's ballots);
/// every replica restarts from its own. Each is a state the real protocol reaches with
/// messages lost and every replica restarted afterwards (which forgets `highest_seen`,
/// `commit` and roles):
///
/// 1. `n0` stands at `1.n0`; `n1` promises (the `Prepare` to `n2`, and everything else `n0`
///    sends `n2`, is lost). `n0` appends `EpochStart(1.n0)` at 1, `n1` acknowledges it, it
///    commits, and a heartbeat carries `commit = 1` to `n1`: both applied 1.
/// 2. A client puts `k = a` through `n0`, which appends it at `2` in ballot `1.n0` (that is
///    `X`); its `Append`s are lost, the client gets no answer. Disk of `n0`: promised `1.n0`,
///    `[E(1.n0)@1, X@2]`, applied 1.
/// 3. `n2` (whose view holds `n0` down) stands at `1 + max(promised 0, seen 0) = 1.n2`,
///    above `1.n0`. `n1` promises: `1.n2 > 1.n0`, and `n2` is a voter of `n1`'s config, so
///    R1.4 does not refuse it although `n1`'s log is more up-to-date. `L*` is `n1`'s log
///    (`n2`'s is empty): `n2` adopts `E(1.n0)@1` (not knowing it committed) and appends
///    `EpochStart(1.n2)` at 2 (that is `Y`); its `Append`s are lost. Disk of `n1`: promised
///    `1.n2`, `[E(1.n0)@1]`, applied 1. Disk of `n2`: promised `1.n2`,
///    `[E(1.n0)@1, Y@2]`, applied 0.
///
/// From here Figure 8 takes four ballots, two of each of the two owners, which this
/// protocol's ballot order `(n, node)` fits into `n ≤ 2`: `n0` stands at `2.n0 > 1.n2`
/// (from its promise `1.n0`), `n1` promises, `n0` adopts its own log (`(1.n0, 2)` beats
/// `n1`'s `(1.n0, 1)`), appends `EpochStart(2.n0)` at 3 and sends `X` alone (one entry per
/// `Append`); `n1` acknowledges index 2, so `X` is on a majority at an older ballot. Then
/// `n2` stands at `2.n2 > 2.n0` (from its promise `1.n2`), `n1` promises (`(1.n0, 2)` is not
/// more up-to-date than `n2`'s `(1.n2, 2)`), and `n2` adopts its own log and overwrites `X`
/// on `n1` with `Y`. Counting `X`'s replicas commits it at `2.n0`; R4 waits for
/// `EpochStart(2.n0)` on a majority, which `n1` then holds, so that `n2`'s candidacy adopts
/// `n1`'s log (`(2.n0, 3)` beats `(1.n2, 2)`) or, if `n1` promised `2.n2` first, `n1` refuses
/// the `Append`.
fn figure_8(knobs: Knobs) -> Vec<ReplicaState> {
    let scenario = knobs.scenario;
    let b1 = Ballot {
        n: 1,
        node: name(0),
    };
    let b2 = Ballot {
        n: 1,
        node: name(2),
    };
    let epoch = Entry {
        ballot: b1.clone(),
        index: 1,
        op: Op::EpochStart,
        tag: None,
    };
    let x = Entry {
        ballot: b1.clone(),
        index: 2,
        op: Op::Put {
            key: KEY.to_vec(),
            value: put_value(0),
        },
        // A client outside the model (this scenario runs none).
        tag: Some(RequestTag {
            client: 0,
            req: 0,
            attempt: 0,
        }),
    };
    let y = Entry {
        ballot: b2.clone(),
        index: 2,
        op: Op::EpochStart,
        tag: None,
    };
    let disks = [
        (b1, vec![epoch.clone(), x], 1),
        (b2.clone(), vec![epoch.clone()], 1),
        (b2, vec![epoch, y], 0),
    ];
    disks
        .into_iter()
        .enumerate()
        .map(|(i, (promised, log, applied))| {
            let mut durable = Durable::bootstrap(scenario.first_config());
            durable.promised = Some(promised);
            durable.log = log;
            durable.applied = applied;
            let replica = start(i, member(i), durable.clone(), knobs);
            ReplicaState::new(replica, Arc::new(durable), 0, 0)
        })
        .collect()
}

fn now_for(message: &Message) -> Duration {
    match message {
        Message::Prepare { .. } => T_ELECT,
        _ => Duration::ZERO,
    }
}

impl Actor for ModelActor {
    type Msg = ModelMsg;
    type State = ActorState;
    type Timer = ModelTimer;
    type Storage = Saved;
    type Random = ();

    fn on_start(&self, _: Id, storage: &Option<Saved>, o: &mut Out<Self>) -> ActorState {
        match self {
            ModelActor::Replica { index, knobs } => {
                let state = match storage {
                    // stateright's `Recover` after a `Crash`.
                    Some(saved) => recover(*index, *knobs, saved),
                    None => initial(*knobs).swap_remove(*index),
                };
                o.save(saved_of(&state));
                set_timers(&state, *knobs, o);
                ActorState::Replica(Box::new(state))
            }
            ModelActor::Client { client, plan } => {
                let tag = RequestTag {
                    client: *client,
                    req: 0,
                    attempt: 0,
                };
                o.send(
                    Id::from(plan.put_to),
                    ModelMsg::Request(tag, client_op(*client, 0)),
                );
                ActorState::Client(ClientState {
                    req: 0,
                    attempt: 0,
                    moves: 0,
                    target: plan.put_to,
                })
            }
            ModelActor::Env { scenario } => {
                for (replica, target) in scenario.targets() {
                    let target = target.iter().map(|&i| member(i)).collect();
                    o.send(Id::from(*replica), ModelMsg::Target(target));
                }
                ActorState::Env
            }
        }
    }

    fn on_msg(&self, _: Id, state: &mut Cow<ActorState>, _: Id, msg: ModelMsg, o: &mut Out<Self>) {
        match self {
            ModelActor::Replica { knobs, .. } => {
                let knobs = *knobs;
                match msg {
                    ModelMsg::Replica(message) => {
                        let (_, _, inner) = &*message;
                        let now = now_for(inner);
                        step(state, knobs, o, |replica| {
                            let (from, to, message) = Arc::unwrap_or_clone(message);
                            replica.handle_message(now, from, to, message);
                        });
                    }
                    ModelMsg::Request(tag, op) => {
                        step(state, knobs, o, |replica| {
                            replica.handle_client(Duration::ZERO, tag, op, ClientRoute::Routed);
                        });
                    }
                    ModelMsg::Target(target) => {
                        step(state, knobs, o, |replica| {
                            replica.handle_target(Duration::ZERO, target);
                        });
                    }
                    ModelMsg::Reply(..) => {}
                }
            }
            ModelActor::Client { client, plan } => {
                let ModelMsg::Reply(tag, reply) = msg else {
                    return;
                };
                let ActorState::Client(current) = &**state else {
                    unreachable!("a client")
                };
                if tag.req != current.req || tag.attempt != current.attempt {
                    // Not the attempt it waits for: consumed, ignored.
                    *state.to_mut() = ActorState::Client(current.clone());
                    return;
                }
                let mut next = current.clone();
                match reply {
                    ClientReply::Moved {
                        leader: Some(leader),
                        ..
                    } if next.moves < MAX_MOVES => {
                        next.moves += 1;
                        next.attempt += 1;
                        next.target = index_of(&leader);
                    }
                    // Ok, or an answer it does not retry: on to the next request.
                    _ => {
                        next.req += 1;
                        next.attempt = 0;
                        next.target = plan.get_to;
                    }
                }
                if next.req <= 1 {
                    let tag = RequestTag {
                        client: *client,
                        req: next.req,
                        attempt: next.attempt,
                    };
                    o.send(
                        Id::from(next.target),
                        ModelMsg::Request(tag, client_op(*client, next.req)),
                    );
                }
                *state.to_mut() = ActorState::Client(next);
            }
            ModelActor::Env { .. } => {}
        }
    }

    fn on_timeout(
        &self,
        _: Id,
        state: &mut Cow<ActorState>,
        timer: &ModelTimer,
        o: &mut Out<Self>,
    ) {
        let ModelActor::Replica { index, knobs } = self else {
            return;
        };
        let timer = match timer {
            ModelTimer::Election => Timer::Election,
            ModelTimer::Heartbeat => Timer::Heartbeat,
            ModelTimer::Fsync => {
                step_state(state, *knobs, o, |next, out| fsync(*knobs, next, out));
                return;
            }
            ModelTimer::Restart | ModelTimer::Wipe => {
                let ActorState::Replica(current) = &**state else {
                    unreachable!("a replica")
                };
                let next = if *timer == ModelTimer::Wipe {
                    wiped(*index, *knobs, current)
                } else {
                    recover(*index, *knobs, &saved_of(current))
                };
                o.save(saved_of(&next));
                o.cancel_timer(ModelTimer::Heartbeat);
                o.cancel_timer(ModelTimer::Fsync);
                set_timers(&next, *knobs, o);
                *state.to_mut() = ActorState::Replica(Box::new(next));
                return;
            }
        };
        step(state, *knobs, o, |replica| {
            replica.handle_timeout(Duration::ZERO, timer);
        });
    }

    fn name(&self) -> String {
        match self {
            ModelActor::Replica { index, .. } => format!("n{index}"),
            ModelActor::Client { client, .. } => format!("c{client}"),
            ModelActor::Env { .. } => "env".to_string(),
        }
    }
}
