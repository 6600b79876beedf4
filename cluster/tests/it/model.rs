//! Model checking of the real [`ShardReplica`](cluster::replica::ShardReplica) with stateright
//! 0.31.0 (PROTOCOL.md §3).
//!
//! A thin adapter ([`actor`]) makes each replica a stateright actor: the actor state is the
//! replica (plus its disk image, which the `Persist` batches build), `Actor::Storage` is that
//! disk image, saved in the same step as the sends that wait for it (R0). Timers fire
//! nondeterministically: `Election` on every replica that does not lead, `Heartbeat` on a
//! leader (off unless `SLOTRING_MODEL_HEARTBEAT=1`: a read asks for its own round either way).
//! Time is not modeled (see `actor::T_ELECT`): stickiness and check-quorum never hold anything
//! off, so safety is checked without them.
//!
//! The models (PROTOCOL.md §3; `actor::Scenario`), each started from a state driven through
//! the real code (`n0` established at `1.n0`) unless said otherwise:
//! - M1 failover: 3 voters; client `c0` puts `a` through `n0` and reads through `n0`, client
//!   `c1` puts `b` through `n1` and reads through `n0` (a stale route: `n0` may have been
//!   deposed without knowing); each follows `Moved` at most twice. One crash.
//! - M2 reconfiguration: M1 plus a spare `n3`; the environment gives the target
//!   `[n1, n2, n3]` to `n0` and `n1` only (divergent views): learner `n3` is added, caught up
//!   and promoted (two configs at most); one client puts and gets through `n0`.
//! - M3 handoff and reads: `n0` and `n1` get the target `[n1, n0, n2]`, so `n0` hands off to
//!   `n1` (R7) while M1's two clients write and read, `c1` reading through `n0`.
//! - M4 amnesia and removal: `n0` gets the target `[n0, n1]`, so `n2` is removed and
//!   tombstoned (or misses `Removed`); any replica may be wiped once: it restarts with a new
//!   `StorageId` and an empty log bootstrapped with the first config (the worst a shell could
//!   do). One client.
//! - Config2015, hand-built (Ongaro's single-server change bug): voters `n0..n3` committed
//!   `EpochStart(1.n0)`; `n0` appended `Config(n0..n4)` that only `n0` and `n4` hold; `n1`
//!   gets the target `[n1, n2, n3]`. No clients, no crashes.
//! - Figure8, hand-built (Raft's Figure 8; `actor::figure_8` says how the real protocol
//!   reaches each disk): 3 voters hold `EpochStart(1.n0)` at 1, committed; `n0` holds a
//!   write `X` of ballot `1.n0` at index 2 that no other replica has; `n2`, which won `1.n2`
//!   with `n1`'s promise, holds its conflicting `EpochStart(1.n2)` at 2 alone. One entry
//!   per `Append` (with whole-suffix `Append`s an acknowledgement of `X` always covers the new
//!   leader's `EpochStart` too). No clients; ballots `n ≤ 2` and no crash in the exhaustive
//!   run (the walks: `n ≤ 3`, one crash-restart).
//!
//! Bounds: ballots `n ≤ 3`, logs `≤ 4` entries, `≤ 2` configs per log, heartbeat rounds `≤ 3`,
//! one crash-restart, one wipe (M4); Figure8 as said above.
//!
//! The network is unordered and never duplicates. It is not lossy: for safety a lost message
//! is the same as one never delivered (any message may stay in flight forever), and
//! stateright's `Drop` only adds states (`SLOTRING_MODEL_LOSSY=1` adds them).
//!
//! Scale: no full model fits CI's budget (even M1 without any election passes 6 M states: a
//! dozen messages in flight in any order). So each model is checked twice:
//! - exhaustively up to a depth (every behaviour of at most `DEPTH - 2` steps; stateright
//!   generates, but never checks, the last level), within [`MAX_STATES`] states: M1 to depth
//!   11, M2–M4 to 10, Config2015 to 8, Figure8 to 12 (see BENCHMARKS.md for counts and
//!   times);
//! - by seeded random walks 40 to 100 steps deep (stateright's simulation checker), weighted
//!   towards delivering messages, which must reach every `Sometimes` property too. A walk
//!   crashes a replica with the `Restart` timer (down and up again in one step): stateright
//!   cannot replay a walk through a delivery to a crashed actor, and a replica that is down,
//!   receiving nothing and firing no timer, is one the model already allows to be up and idle.
//!
//! The mutation tests (one per row of PROTOCOL.md's table) walk until the checker reports the
//! expected violation, except Figure 8's: it searches its hand-built scenario exhaustively
//! (breadth first, to depth 12: its counterexample is 10 steps long), which finds the
//! violation whatever order the actions come in (~89 k states, a few seconds).
//! `SLOTRING_MODEL_EXTENDED=1` walks ten times longer (M1 also with ballots up to 4);
//! `SLOTRING_MODEL_DEPTH=N` changes the exhaustive depth (M1 at 12: ~5 M states, ~20 GB).
//!
//! Run: `cargo test -p cluster --test it model -- --test-threads=1 --nocapture`. A test that
//! finds a violation prints it: each step up to the first violating state, the replicas and
//! the clients' history, and the encoded path; `SLOTRING_MODEL_REPLAY='<test>=<path>'` with
//! the `model_replay` test prints every state along that path.

mod actor;
mod props;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

use cluster::replica::{Mutations, Op};
use stateright::actor::{ActorModel, ActorModelAction, LossyNetwork, Network};
use stateright::{Checker, Chooser, Expectation, HasDiscoveries, Model as _, Path};

use self::actor::{ActorState, ClientPlan, Knobs, ModelActor, ModelMsg, ModelTimer, Scenario};
use self::props::{History, Model, State};

const ONE_LEADER: &str = "one leader per ballot";
const LOG_MATCHING: &str = "log matching";
const COMMITTED: &str = "committed prefixes agree";
const ACKED: &str = "acknowledged writes survive";
const REFUSED: &str = "refused attempts never appended";
const SUPERSEDED: &str = "superseded attempts never applied";
const LINEARIZABLE: &str = "linearizable";
const ASSERTION: &str = "no failed assertion in the core";
const MEMBERS: &str = "promises counted only from members";
const ONE_VOTER: &str = "adjacent configs differ by at most one voter";
const ACKED_AT_2: &str = "a write acknowledged at n >= 2";
const READ: &str = "a read served";
const READ_AFTER_HANDOFF: &str = "a read after a handoff";
const PROMOTED: &str = "a learner promoted";
const TOMBSTONE: &str = "a tombstone written";
const DUEL: &str = "two candidates at the same n";
const OLD_ON_MAJORITY: &str = "an older ballot's entry on a majority under a newer leader";

/// Every `Always` property.
const ALWAYS: [&str; 10] = [
    ONE_LEADER,
    LOG_MATCHING,
    COMMITTED,
    ACKED,
    REFUSED,
    SUPERSEDED,
    LINEARIZABLE,
    ASSERTION,
    MEMBERS,
    ONE_VOTER,
];

/// The most unique states a CI model may reach (PROTOCOL.md §3).
const MAX_STATES: usize = 3_000_000;
/// M1's depth in the default run: every behaviour of at most this many steps.
const M1_DEPTH: usize = 11;
/// The other models' depths (measured to stay within [`MAX_STATES`]).
const M2_DEPTH: usize = 10;
const M3_DEPTH: usize = 10;
const M4_DEPTH: usize = 10;
const CONFIG_2015_DEPTH: usize = 8;
const FIGURE_8_DEPTH: usize = 12;

/// The model tests run one at a time (each takes both cores and gigabytes).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn extended() -> bool {
    env("SLOTRING_MODEL_EXTENDED", 0) == 1
}

fn knobs(scenario: Scenario, mutations: Mutations) -> Knobs {
    Knobs {
        scenario,
        mutations,
        max_append: 256,
        max_n: env("SLOTRING_MODEL_N", 3),
        max_log: env("SLOTRING_MODEL_LOG", 4),
        max_hb: 3,
        max_restarts: env("SLOTRING_MODEL_RESTARTS", 1),
        max_wipes: u8::from(scenario == Scenario::M4),
        max_configs: env("SLOTRING_MODEL_CONFIGS", 2),
        heartbeat_timer: env("SLOTRING_MODEL_HEARTBEAT", 0) == 1,
        restart_timer: true,
        deferred_fsync: false,
    }
}

/// M1's two clients.
const TWO_CLIENTS: [ClientPlan; 2] = [
    ClientPlan {
        put_to: 0,
        get_to: 0,
    },
    ClientPlan {
        put_to: 1,
        get_to: 0,
    },
];

/// The second alone: its `Put` may reach a new leader, its `Get` the old one.
const ONE_CLIENT: [ClientPlan; 1] = [ClientPlan {
    put_to: 1,
    get_to: 0,
}];

/// One client that puts and gets through the first leader.
const ONE_CLIENT_AT_N0: [ClientPlan; 1] = [ClientPlan {
    put_to: 0,
    get_to: 0,
}];

/// How replicas crash.
#[derive(Clone, Copy)]
enum Crashes {
    /// stateright's `Crash` and `Recover`, at most one replica down at a time.
    Stateright,
    /// The `Restart` timer: down and up again in one step (random walks need it: stateright's
    /// simulation cannot replay a walk through a delivery to a crashed actor).
    Restart,
}

/// The `Sometimes` properties each model must reach.
fn sometimes(scenario: Scenario) -> &'static [&'static str] {
    match scenario {
        Scenario::M1 => &[ACKED_AT_2, READ, DUEL],
        Scenario::M2 => &[PROMOTED, READ],
        Scenario::M3 => &[READ_AFTER_HANDOFF],
        Scenario::M4 => &[TOMBSTONE],
        Scenario::Config2015 => &[],
        Scenario::Figure8 => &[OLD_ON_MAJORITY],
    }
}

fn model(knobs: Knobs, clients: &[ClientPlan], crashes: Crashes) -> Model {
    let knobs = Knobs {
        restart_timer: matches!(crashes, Crashes::Restart),
        ..knobs
    };
    let scenario = knobs.scenario;
    let mut model = ActorModel::new(knobs, History::new())
        .actors((0..scenario.replicas()).map(|index| ModelActor::Replica { index, knobs }))
        .actors(
            clients
                .iter()
                .zip(0..)
                .map(|(plan, client)| ModelActor::Client {
                    client,
                    plan: *plan,
                }),
        )
        .actor(ModelActor::Env { scenario })
        .init_network(Network::new_unordered_nonduplicating([]))
        .lossy_network(if env("SLOTRING_MODEL_LOSSY", 0) == 1 {
            LossyNetwork::Yes
        } else {
            LossyNetwork::No
        })
        .max_crashes(usize::from(matches!(crashes, Crashes::Stateright)))
        .within_boundary(props::within_boundary)
        .record_msg_out(props::record_out)
        .record_msg_in(props::record_in)
        .property(
            Expectation::Always,
            ONE_LEADER,
            props::one_leader_per_ballot,
        )
        .property(Expectation::Always, LOG_MATCHING, props::log_matching)
        .property(
            Expectation::Always,
            COMMITTED,
            props::committed_prefixes_agree,
        )
        .property(Expectation::Always, ACKED, props::acked_writes_survive)
        .property(Expectation::Always, REFUSED, props::refused_never_appended)
        .property(
            Expectation::Always,
            SUPERSEDED,
            props::superseded_never_applied,
        )
        .property(Expectation::Always, LINEARIZABLE, props::linearizable)
        .property(Expectation::Always, ASSERTION, props::no_failed_assertion)
        .property(Expectation::Always, MEMBERS, props::promises_from_members)
        .property(Expectation::Always, ONE_VOTER, props::one_voter_changes);
    for name in sometimes(scenario) {
        let condition = match *name {
            ACKED_AT_2 => props::write_acked_at_n2,
            READ => props::read_served,
            READ_AFTER_HANDOFF => props::read_after_handoff,
            PROMOTED => props::learner_promoted,
            TOMBSTONE => props::tombstone_written,
            DUEL => props::two_candidates_at_same_n,
            OLD_ON_MAJORITY => props::old_entry_on_majority,
            other => unreachable!("no property {other}"),
        };
        model = model.property(Expectation::Sometimes, name, condition);
    }
    model
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn name(model: &Model, id: stateright::actor::Id) -> String {
    use stateright::actor::Actor as _;
    model.actors[usize::from(id)].name()
}

type Action = ActorModelAction<ModelMsg, ModelTimer, ()>;

/// One line per step, then each replica's promise, commit, role and log, and the history.
fn trace(model: &Model, path: &Path<State, Action>) -> String {
    let name = |id| name(model, id);
    let mut out = String::new();
    for (k, (_, action)) in path.clone().into_vec().iter().enumerate() {
        let Some(action) = action else { continue };
        let line = match action {
            ActorModelAction::Deliver { src, dst, msg } => {
                format!("{} -> {}: {msg:?}", name(*src), name(*dst))
            }
            ActorModelAction::Drop(envelope) => format!(
                "drop {} -> {}: {:?}",
                name(envelope.src),
                name(envelope.dst),
                envelope.msg
            ),
            ActorModelAction::Timeout(id, timer) => format!("{} timer {timer:?}", name(*id)),
            ActorModelAction::Crash(id) => format!("{} crashes", name(*id)),
            ActorModelAction::Recover(id) => format!("{} recovers", name(*id)),
            ActorModelAction::SelectRandom { .. } => "random".to_string(),
        };
        out.push_str(&format!("{k:3}. {line}\n"));
    }
    let last = path.last_state();
    for (i, actor) in last.actor_states.iter().enumerate() {
        let ActorState::Replica(r) = &**actor else {
            continue;
        };
        let log: Vec<String> = r
            .replica
            .durable()
            .log
            .iter()
            .map(|e| {
                let what = match &e.op {
                    Op::Put { value, .. } => format!("put {}", String::from_utf8_lossy(value)),
                    op => format!("{op:?}"),
                };
                format!("{}@{} {what}", e.ballot, e.index)
            })
            .collect();
        out.push_str(&format!(
            "n{i}{}: promised {:?} (disk {:?}), commit {}, applied {}, leads {:?} \
             (established: {}), config {:?}, log [{}]{}\n",
            if last.crashed[i] { " (crashed)" } else { "" },
            r.replica
                .durable()
                .promised
                .as_ref()
                .map(ToString::to_string),
            r.disk.promised.as_ref().map(ToString::to_string),
            r.replica.commit(),
            r.replica.durable().applied,
            r.replica.leading_ballot().map(ToString::to_string),
            r.replica.established_ballot().is_some(),
            r.replica
                .durable()
                .active_config()
                .voters
                .iter()
                .map(|m| format!("{}/{}", m.node, m.storage.0))
                .collect::<Vec<_>>(),
            log.join(", "),
            r.panicked
                .as_ref()
                .map(|p| format!(", failed: {p}"))
                .unwrap_or_default(),
        ));
    }
    out.push_str(&format!(
        "acked {:?}\nrefused {:?}\n{:?}\n",
        last.history.acked, last.history.refused, last.history.tester
    ));
    out
}

/// How a test's model is set up: `<test>` is its exhaustive run, `<test>/walk` its random
/// walks.
fn setup(test: &str) -> (Knobs, &'static [ClientPlan], Crashes) {
    let (base, crashes) = match test.strip_suffix("/walk") {
        Some(base) => (base, Crashes::Restart),
        None if test.starts_with("model_catches_") => (test, Crashes::Restart),
        None => (test, Crashes::Stateright),
    };
    let mut mutations = Mutations::default();
    let mut scenario = Scenario::M1;
    let mut clients: &'static [ClientPlan] = &TWO_CLIENTS;
    let mut max_append = 256;
    let mut max_n = env("SLOTRING_MODEL_N", 3);
    let mut max_restarts = env("SLOTRING_MODEL_RESTARTS", 1);
    let mut deferred_fsync = false;
    let walking = test.ends_with("/walk");
    match base {
        "model_m1_failover_is_safe" | "model_m1_random_walks_find_nothing" => {}
        "model_m2_reconfiguration_is_safe" => {
            scenario = Scenario::M2;
            clients = &ONE_CLIENT_AT_N0;
        }
        "model_m3_handoff_and_reads_are_safe" => scenario = Scenario::M3,
        "model_m4_amnesia_and_removal_are_safe" => {
            scenario = Scenario::M4;
            clients = &ONE_CLIENT_AT_N0;
        }
        "model_config_2015_is_safe" => {
            scenario = Scenario::Config2015;
            clients = &[];
            max_restarts = 0;
        }
        "model_catches_skip_persist_promised" => mutations.skip_persist_promised = true,
        "model_catches_send_before_persist" => {
            mutations.send_before_persist = true;
            deferred_fsync = true;
        }
        "model_catches_accept_equal_n" => mutations.accept_equal_n = true,
        "model_catches_compare_logs_by_length" => mutations.compare_logs_by_length = true,
        // The exhaustive runs within the mutation's counterexample's bounds (`n ≤ 2`, no
        // crash); the walks wider (`n ≤ 3`, one crash-restart).
        "model_figure_8_is_safe" => {
            scenario = Scenario::Figure8;
            clients = &[];
            max_append = 1;
            if !walking {
                max_n = env("SLOTRING_MODEL_N", 2);
                max_restarts = 0;
            }
        }
        "model_catches_commit_old_ballot_entries" => {
            mutations.commit_old_ballot_entries = true;
            scenario = Scenario::Figure8;
            clients = &[];
            max_append = 1;
            max_n = env("SLOTRING_MODEL_N", 2);
            max_restarts = 0;
        }
        "model_catches_read_without_round" => {
            mutations.read_without_round = true;
            clients = &ONE_CLIENT;
        }
        "model_catches_read_round_ignores_promise" => {
            mutations.read_round_ignores_promise = true;
            clients = &ONE_CLIENT;
        }
        "model_catches_moved_for_appended" => {
            mutations.moved_for_appended = true;
            scenario = Scenario::M3;
        }
        "model_catches_open_with_target_majority" => {
            mutations.open_with_target_majority = true;
            scenario = Scenario::M2;
            clients = &ONE_CLIENT_AT_N0;
        }
        "model_catches_ignore_storage_id" => {
            mutations.ignore_storage_id = true;
            scenario = Scenario::M4;
            clients = &ONE_CLIENT_AT_N0;
        }
        "model_catches_config_before_epoch_start" => {
            mutations.config_before_epoch_start = true;
            scenario = Scenario::Config2015;
            clients = &[];
            max_restarts = 0;
        }
        other => panic!("unknown test {other}"),
    }
    let knobs = Knobs {
        max_append,
        max_n,
        max_restarts,
        deferred_fsync,
        ..knobs(scenario, mutations)
    };
    (knobs, clients, crashes)
}

fn model_of(test: &str) -> Model {
    let (knobs, clients, crashes) = setup(test);
    model(knobs, clients, crashes)
}

/// Explores every behaviour of `model_of(test)` of at most `depth - 2` steps (stateright
/// generates, but never checks, the last level): no `Always` property may fail, and at most
/// [`MAX_STATES`] states. Returns the `Sometimes` properties reached.
fn exhaustive(test: &str, depth: usize) -> BTreeSet<&'static str> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let depth = env("SLOTRING_MODEL_DEPTH", depth);
    let model = model_of(test);
    let started = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(threads())
        .target_max_depth(depth)
        .spawn_bfs()
        .join();
    println!(
        "{test} (depth {depth}): {} unique states ({} generated), {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        started.elapsed(),
    );
    if let Some(violated) = ALWAYS.iter().find(|p| checker.discovery(p).is_some()) {
        let path = checker.discovery(violated).expect("found");
        panic!(
            "{test}: \"{violated}\" violated:\n{}replay: SLOTRING_MODEL_REPLAY='{test}={}'",
            trace(&model, &path),
            path.encode(&model)
        );
    }
    assert!(
        checker.unique_state_count() <= MAX_STATES,
        "{test} outgrew its budget: {} states",
        checker.unique_state_count()
    );
    sometimes(model.cfg.scenario)
        .iter()
        .copied()
        .filter(|p| checker.discovery(p).is_some())
        .collect()
}

/// A model without mutations: exhaustive to `depth`, then seeded random walks (`states`
/// states in all); no `Always` property fails and every `Sometimes` one is reached.
fn check_safe(test: &str, depth: usize, states: usize) {
    let mut reached = exhaustive(test, depth);
    let walked = format!("{test}/walk");
    let model = model_of(&walked);
    let watch: Vec<&'static str> = ALWAYS
        .iter()
        .chain(sometimes(model.cfg.scenario))
        .copied()
        .collect();
    let found = walk(&walked, model.clone(), 7, states, &ALWAYS, &watch);
    let violated: Vec<_> = found.iter().filter(|p| ALWAYS.contains(p)).collect();
    assert!(violated.is_empty(), "{test}: violated {violated:?}");
    reached.extend(found);
    let missing: Vec<_> = sometimes(model.cfg.scenario)
        .iter()
        .filter(|p| !reached.contains(*p))
        .collect();
    assert!(missing.is_empty(), "{test}: never reached {missing:?}");
}

/// M1 without mutations: every `Always` property holds on every behaviour of at most
/// `M1_DEPTH - 2` steps (`SLOTRING_MODEL_DEPTH` sets the depth), and every `Sometimes` one is
/// reached within them.
#[test]
fn model_m1_failover_is_safe() {
    let test = "model_m1_failover_is_safe";
    let reached = exhaustive(test, M1_DEPTH);
    assert_eq!(
        reached.len(),
        sometimes(Scenario::M1).len(),
        "reached {reached:?}"
    );
}

/// M2 without mutations: the target `[n1, n2, n3]` reaches `n0` and `n1` only; `n3` is
/// added as a learner and promoted (two configs at most) while a client writes and reads.
#[test]
fn model_m2_reconfiguration_is_safe() {
    check_safe("model_m2_reconfiguration_is_safe", M2_DEPTH, 2_000_000);
}

/// M3 without mutations: `n0` hands off to `n1` while two clients write and read, one of
/// them still routing to `n0`.
#[test]
fn model_m3_handoff_and_reads_are_safe() {
    check_safe("model_m3_handoff_and_reads_are_safe", M3_DEPTH, 2_000_000);
}

/// M4 without mutations: `n2` is removed and tombstoned; any replica may be wiped once.
#[test]
fn model_m4_amnesia_and_removal_are_safe() {
    check_safe("model_m4_amnesia_and_removal_are_safe", M4_DEPTH, 2_000_000);
}

/// The hand-built state of Raft's single-server change bug, without the mutation: safe.
#[test]
fn model_config_2015_is_safe() {
    check_safe("model_config_2015_is_safe", CONFIG_2015_DEPTH, 1_000_000);
}

/// The hand-built state of Raft's Figure 8, without the mutation: every behaviour of up to 10
/// steps within the mutation test's bounds (`n ≤ 2`, no crash; the mutation's counterexample
/// is one of them) is safe, and so are random walks with `n ≤ 3` and one crash-restart. Both
/// reach the dangerous state: `X` of `1.n0` on a majority, uncommitted, under `n0` leading
/// `2.n0`.
#[test]
fn model_figure_8_is_safe() {
    check_safe("model_figure_8_is_safe", FIGURE_8_DEPTH, 1_000_000);
}

/// Random walks that deliver a message ten times as often as they fire a given timer, so
/// that elections and crashes do not crowd out the message exchanges between them.
#[derive(Clone)]
struct Weighted {
    deliver: u64,
}

impl Chooser<Model> for Weighted {
    type State = u64;

    fn new_state(&self, seed: u64) -> u64 {
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
    }

    fn choose_initial_state(&self, _: &mut u64, _: &[State]) -> usize {
        0
    }

    fn choose_action(&self, rng: &mut u64, _: &State, actions: &[Action]) -> usize {
        let weight = |action: &Action| match action {
            ActorModelAction::Deliver { .. } => self.deliver,
            _ => 1,
        };
        let total: u64 = actions.iter().map(weight).sum();
        // xorshift64*
        *rng ^= *rng >> 12;
        *rng ^= *rng << 25;
        *rng ^= *rng >> 27;
        let mut pick = rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % total;
        for (i, action) in actions.iter().enumerate() {
            let w = weight(action);
            if pick < w {
                return i;
            }
            pick -= w;
        }
        actions.len() - 1
    }
}

/// Walks `model` (seeded random walks, up to `states` states in all, or ten times that with
/// `SLOTRING_MODEL_EXTENDED=1`) until one of `stop_on` is violated; prints the
/// counterexample and returns the properties of `watch` with a discovery.
fn walk(
    test: &str,
    model: Model,
    seed: u64,
    states: usize,
    stop_on: &[&'static str],
    watch: &[&'static str],
) -> Vec<&'static str> {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let started = Instant::now();
    let states = if extended() { 10 * states } else { states };
    let checker = model
        .clone()
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf(
            stop_on.iter().copied().collect::<BTreeSet<_>>(),
        ))
        .target_state_count(env("SLOTRING_MODEL_WALK_STATES", states))
        .spawn_simulation(
            env("SLOTRING_MODEL_SEED", seed),
            Weighted {
                deliver: env("SLOTRING_MODEL_DELIVER_WEIGHT", 10),
            },
        )
        .join();
    let found: Vec<&'static str> = watch
        .iter()
        .copied()
        .filter(|p| checker.discovery(p).is_some())
        .collect();
    println!(
        "{test}: {} states walked, longest walk {} steps, {:.1?}; found: {found:?}",
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    if let Some(first) = found.iter().find(|p| stop_on.contains(p)) {
        let path = first_violation(&model, first, checker.discovery(first).expect("found"));
        println!(
            "counterexample for \"{first}\":\n{}replay: SLOTRING_MODEL_REPLAY='{test}={}'",
            trace(&model, &path),
            path.encode(&model)
        );
    }
    found
}

/// The path cut at its first state that violates `property` (a walk goes on past it).
fn first_violation(
    model: &Model,
    property: &str,
    path: Path<State, Action>,
) -> Path<State, Action> {
    let condition = model
        .properties()
        .into_iter()
        .find(|p| p.name == property)
        .expect("a property")
        .condition;
    let steps = path.clone().into_vec();
    let Some(cut) = steps.iter().position(|(state, _)| !condition(model, state)) else {
        return path;
    };
    let actions: Vec<Action> = steps[..cut]
        .iter()
        .filter_map(|(_, action)| action.clone())
        .collect();
    Path::from_actions(model, steps[0].0.clone(), &actions).unwrap_or(path)
}

/// Walks with seeds 1, 2, ... (up to [`MUTATION_SEEDS`], `states` states each) until one of
/// `expected` is violated. The walks are a random search: which seed finds a deep violation
/// first changes whenever the model's actions are reordered (they are sorted by message hash).
fn mutation_test(test: &str, states: usize, expected: &[&'static str]) {
    for seed in 1..=MUTATION_SEEDS {
        if !walk(test, model_of(test), seed, states, expected, expected).is_empty() {
            return;
        }
    }
    panic!("{test}: no violation of {expected:?} found with seeds 1 to {MUTATION_SEEDS}");
}

/// A mutation test by exhaustive search: explores every behaviour of `model_of(test)` of at
/// most `depth - 2` steps, breadth first, until one of `expected` is violated, and prints the
/// counterexample. Deterministic, unlike [`mutation_test`]'s walks: a violation within the
/// depth is found whatever order the actions come in (the state count at which it is found
/// varies a little with how the threads share the work).
fn mutation_exhaustive(test: &str, depth: usize, expected: &[&'static str]) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let depth = env("SLOTRING_MODEL_DEPTH", depth);
    let model = model_of(test);
    let started = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(threads())
        .target_max_depth(depth)
        .finish_when(HasDiscoveries::AnyOf(
            expected.iter().copied().collect::<BTreeSet<_>>(),
        ))
        .spawn_bfs()
        .join();
    let found: Vec<&'static str> = expected
        .iter()
        .copied()
        .filter(|p| checker.discovery(p).is_some())
        .collect();
    println!(
        "{test} (depth {depth}): {} unique states ({} generated), {:.1?}; found: {found:?}",
        checker.unique_state_count(),
        checker.state_count(),
        started.elapsed(),
    );
    let Some(first) = found.first() else {
        panic!("{test}: no violation of {expected:?} within depth {depth}");
    };
    let path = checker.discovery(first).expect("found");
    println!(
        "counterexample for \"{first}\":\n{}replay: SLOTRING_MODEL_REPLAY='{test}={}'",
        trace(&model, &path),
        path.encode(&model)
    );
    assert!(
        checker.unique_state_count() <= MAX_STATES,
        "{test} outgrew its budget: {} states",
        checker.unique_state_count()
    );
}

/// How many seeds a mutation test tries.
const MUTATION_SEEDS: u64 = 4;

/// R0/I1: a promise sent before `promised` is durable is forgotten in a crash-restart.
#[test]
fn model_catches_skip_persist_promised() {
    mutation_test(
        "model_catches_skip_persist_promised",
        3_000_000,
        &[
            ONE_LEADER,
            ACKED,
            COMMITTED,
            LOG_MATCHING,
            LINEARIZABLE,
            ASSERTION,
        ],
    );
}

/// R0: messages released before the batch they rely on is durable (the model runs with
/// `deferred_fsync`, so a crash can fall between the send and the fsync).
#[test]
fn model_catches_send_before_persist() {
    mutation_test(
        "model_catches_send_before_persist",
        3_000_000,
        &[
            ONE_LEADER,
            ACKED,
            COMMITTED,
            LOG_MATCHING,
            LINEARIZABLE,
            ASSERTION,
        ],
    );
}

/// R1.2/I1: an acceptor that promises a ballot of the same `n` from another proposer (a lower
/// ballot after a higher one) lets two leaders commit at the same index.
#[test]
fn model_catches_accept_equal_n() {
    mutation_test(
        "model_catches_accept_equal_n",
        3_000_000,
        &[COMMITTED, ACKED, LOG_MATCHING, LINEARIZABLE, ASSERTION],
    );
}

/// R2: adopting the longest log instead of the most up-to-date one.
#[test]
fn model_catches_compare_logs_by_length() {
    mutation_test(
        "model_catches_compare_logs_by_length",
        3_000_000,
        &[ACKED, COMMITTED, LOG_MATCHING, LINEARIZABLE, ASSERTION],
    );
}

/// R4 (Raft's Figure 8): committing an older ballot's entry by counting its replicas, from the
/// hand-built Figure8 state (`actor::figure_8`), searched exhaustively to depth 12 (every
/// behaviour of up to 10 steps; ~89 k states, a few seconds). The shortest counterexample is
/// 10 steps: `n0` stands at `2.n0`, `n1` promises, `n0` adopts its own log (with `X` of
/// `1.n0` at 2), appends `EpochStart(2.n0)` at 3 and sends `X` alone; `n1` acknowledges index
/// 2, and the mutated `n0` commits and applies `X` (on `n0` and `n1`: a majority, at an older
/// ballot). Then `n2` stands at `2.n2`, `n1` promises (its `(1.n0, 2)` is behind `n2`'s
/// `(1.n2, 2)`), `n2` adopts its own log and sends `Y = EpochStart(1.n2)` at 2, `n1` replaces
/// `X` with it and acknowledges, and `n2` commits `Y` at index 2: "committed prefixes agree"
/// fails (`n0` applied `X` there). Without the mutation, `n0` waits for `EpochStart(2.n0)` on
/// `n1`, after which `n2` adopts `n1`'s log (`X` included) or `n1` refuses `n2`'s `Append`
/// (`model_figure_8_is_safe`).
///
/// Why a hand-built state: the violation needs two ballots from each of two replicas, the
/// first holding an entry the other never saw, and an `Append` carrying that entry without
/// the new `EpochStart`. Seeded walks of M1 with one entry per `Append` and `n ≤ 4` found it at
/// ~372 k states until a change of the `Append` message (its `idle` field, issue 5) reordered
/// the model's actions, after which seeds 1-10 with 1-6 M states each did not.
#[test]
fn model_catches_commit_old_ballot_entries() {
    mutation_exhaustive(
        "model_catches_commit_old_ballot_entries",
        FIGURE_8_DEPTH,
        &[COMMITTED, ACKED, LOG_MATCHING, LINEARIZABLE, ASSERTION],
    );
}

/// R9/I7: a deposed leader that serves a read without a heartbeat round answers from stale
/// state. One client: its `Put` reaches the new leader `n1`, its `Get` the old one, `n0`.
#[test]
fn model_catches_read_without_round() {
    mutation_test(
        "model_catches_read_without_round",
        3_000_000,
        &[LINEARIZABLE],
    );
}

/// R9/I7: a follower that answers a leader's `ReadRound` though it promised a higher ballot
/// confirms a deposed leader, which then serves a stale read. One client, as above.
#[test]
fn model_catches_read_round_ignores_promise() {
    mutation_test(
        "model_catches_read_round_ignores_promise",
        3_000_000,
        &[LINEARIZABLE],
    );
}

/// R10/I8 (M3): a leader that loses leadership answers its appended writes `Moved`, which
/// claims they never committed; the next leader commits them.
#[test]
fn model_catches_moved_for_appended() {
    mutation_test(
        "model_catches_moved_for_appended",
        3_000_000,
        &[REFUSED, LINEARIZABLE],
    );
}

/// R2.3 (M2): a candidate that counts a majority of the placement target instead of
/// `active(L*)` opens a ballot without the replicas holding the acknowledged write.
#[test]
fn model_catches_open_with_target_majority() {
    mutation_test(
        "model_catches_open_with_target_majority",
        6_000_000,
        &[ACKED, COMMITTED, LOG_MATCHING, LINEARIZABLE, ASSERTION],
    );
}

/// I5 (M4): members told apart by node only, so a wiped replica's empty promise counts.
#[test]
fn model_catches_ignore_storage_id() {
    mutation_test(
        "model_catches_ignore_storage_id",
        3_000_000,
        &[ACKED, COMMITTED, LOG_MATCHING, LINEARIZABLE, ASSERTION],
    );
}

/// R5(a), the 2015 bug, from its hand-built state: `n1` removes `n0` before its
/// `EpochStart` commits, commits that under `{n1, n2, n3}`, and `n0` then wins with
/// `{n0, n3, n4}` of its uncommitted five-voter config, overwriting it.
#[test]
fn model_catches_config_before_epoch_start() {
    mutation_test(
        "model_catches_config_before_epoch_start",
        3_000_000,
        &[COMMITTED, ACKED, LOG_MATCHING, ASSERTION],
    );
}

/// Prints every state along a path printed by a test:
/// `SLOTRING_MODEL_REPLAY='model_catches_read_without_round=0/1/1/...'`. Does nothing without
/// the variable.
#[test]
fn model_replay() {
    let Ok(spec) = std::env::var("SLOTRING_MODEL_REPLAY") else {
        return;
    };
    let (test, path) = spec.split_once('=').expect("<test>=<path>");
    let model = model_of(test);
    let mut indices = path
        .split('/')
        .map(|i| i.parse::<usize>().expect("an index"));
    let init = indices.next().expect("the init index");
    let mut state = model.init_states().swap_remove(init);
    for (step, index) in indices.enumerate() {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        let action = actions.swap_remove(index);
        println!("== step {step}: {}", model.format_action(&action));
        if let Some(text) = model.format_step(&state, action.clone()) {
            println!("{text}");
        }
        state = model
            .next_state(&state, action)
            .expect("a step of the path");
    }
    for property in model.properties() {
        println!(
            "{}: {}",
            property.name,
            (property.condition)(&model, &state)
        );
    }
}

/// M1 without mutations, deeper than the exhaustive run: seeded random walks find no
/// violation, also when an fsync is a step of its own (so the core's `after` tags are what
/// keeps a crash from losing what a message promised), and with ballots up to 4 as well under
/// `SLOTRING_MODEL_EXTENDED=1`.
#[test]
fn model_m1_random_walks_find_nothing() {
    let test = "model_m1_random_walks_find_nothing/walk";
    let (knobs, clients, crashes) = setup(test);
    let mut runs = vec![
        knobs,
        Knobs {
            deferred_fsync: true,
            ..knobs
        },
    ];
    if extended() {
        runs.push(Knobs { max_n: 4, ..knobs });
    }
    for knobs in runs {
        let found = walk(
            test,
            model(knobs, clients, crashes),
            7,
            2_000_000,
            &ALWAYS,
            &ALWAYS,
        );
        assert!(found.is_empty(), "violated: {found:?}");
    }
}
