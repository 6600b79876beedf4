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
//! Model M1 (failover): 3 voters, `n0` already established at `1.n0` (driven there through the
//! real code); client `c0` puts `a` through `n0` and reads through `n0`, client `c1` puts `b`
//! through `n1` and reads through `n0` (a stale route: `n0` may have been deposed without
//! knowing); each follows `Moved` at most twice. One crash (and one recovery). Bounds: ballots
//! `n ≤ 3`, logs `≤ 4` entries, heartbeat rounds `≤ 3`.
//!
//! The network is unordered and never duplicates. It is not lossy: for safety a lost message
//! is the same as one never delivered (any message may stay in flight forever), and
//! stateright's `Drop` only adds states (`SLOTRING_MODEL_LOSSY=1` adds them).
//!
//! Scale, measured: the full M1 space is far beyond CI's budget (even with no election at
//! all it passes 6 M states: a dozen messages in flight in any order). So:
//! - `model_m1_failover_is_safe` is exhaustive up to a depth: every behaviour of at most
//!   `M1_DEPTH - 2` steps (stateright generates, but never checks, depth `M1_DEPTH`). About
//!   1.6 M states, half a minute and 6.5 GB on 2 cores.
//! - `model_m1_random_walks_find_nothing` and the mutation tests walk deeper (40 to 100
//!   steps) with seeded random walks, stateright's simulation checker, weighted towards
//!   delivering messages. A walk crashes a replica with the `Restart` timer (down and up again
//!   in one step): stateright cannot replay a walk through a delivery to a crashed actor, and
//!   a replica that is down, receiving nothing and firing no timer, is one the model already
//!   allows to be up and idle.
//! - `SLOTRING_MODEL_EXTENDED=1` walks ten times longer, also with ballots up to 4;
//!   `SLOTRING_MODEL_DEPTH=12` checks M1 one step deeper (about 5 M states, ~20 GB).
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

use self::actor::{ActorState, ClientPlan, Knobs, ModelActor, ModelMsg, ModelTimer, REPLICAS};
use self::props::{History, Model, State};

const ONE_LEADER: &str = "one leader per ballot";
const LOG_MATCHING: &str = "log matching";
const COMMITTED: &str = "committed prefixes agree";
const ACKED: &str = "acknowledged writes survive";
const REFUSED: &str = "refused attempts never appended";
const LINEARIZABLE: &str = "linearizable";
const ASSERTION: &str = "no failed assertion in the core";
const ACKED_AT_2: &str = "a write acknowledged at n >= 2";
const READ: &str = "a read served";

/// The most unique states a CI model may reach (PROTOCOL.md §3).
const MAX_STATES: usize = 3_000_000;
/// M1's depth in the default run: every behaviour of at most this many steps.
const M1_DEPTH: usize = 11;

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

fn knobs(mutations: Mutations) -> Knobs {
    Knobs {
        mutations,
        max_append: 256,
        max_n: env("SLOTRING_MODEL_N", 3),
        max_log: env("SLOTRING_MODEL_LOG", 4),
        max_hb: 3,
        max_restarts: env("SLOTRING_MODEL_RESTARTS", 1),
        heartbeat_timer: env("SLOTRING_MODEL_HEARTBEAT", 0) == 1,
        restart_timer: true,
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

/// How replicas crash.
#[derive(Clone, Copy)]
enum Crashes {
    /// stateright's `Crash` and `Recover`, at most one replica down at a time.
    Stateright,
    /// The `Restart` timer: down and up again in one step (random walks need it: stateright's
    /// simulation cannot replay a walk through a delivery to a crashed actor).
    Restart,
}

fn model(knobs: Knobs, clients: &[ClientPlan], crashes: Crashes) -> Model {
    let knobs = Knobs {
        restart_timer: matches!(crashes, Crashes::Restart),
        ..knobs
    };
    ActorModel::new(knobs, History::new())
        .actors((0..REPLICAS).map(|index| ModelActor::Replica { index, knobs }))
        .actors(
            clients
                .iter()
                .zip(0..)
                .map(|(plan, client)| ModelActor::Client {
                    client,
                    plan: *plan,
                }),
        )
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
        .property(Expectation::Always, LINEARIZABLE, props::linearizable)
        .property(Expectation::Always, ASSERTION, props::no_failed_assertion)
        .property(Expectation::Sometimes, ACKED_AT_2, props::write_acked_at_n2)
        .property(Expectation::Sometimes, READ, props::read_served)
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn name(id: stateright::actor::Id) -> String {
    let i = usize::from(id);
    if i < REPLICAS {
        format!("n{i}")
    } else {
        format!("c{}", i - REPLICAS)
    }
}

type Action = ActorModelAction<ModelMsg, ModelTimer, ()>;

/// One line per step, then each replica's promise, commit, role and log, and the history.
fn trace(path: &Path<State, Action>) -> String {
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
    for i in 0..REPLICAS {
        let ActorState::Replica(r) = &*last.actor_states[i] else {
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
             (established: {}), log [{}]{}\n",
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

/// M1 without mutations: every `Always` property holds on every behaviour of at most
/// `M1_DEPTH - 2` steps (`SLOTRING_MODEL_DEPTH` sets the depth), and every `Sometimes` one is
/// reached within them.
#[test]
fn model_m1_failover_is_safe() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let depth = env("SLOTRING_MODEL_DEPTH", M1_DEPTH);
    let model = model(
        knobs(Mutations::default()),
        &TWO_CLIENTS,
        Crashes::Stateright,
    );
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads())
        .target_max_depth(depth)
        .spawn_bfs()
        .join();
    println!(
        "M1 (depth {depth}): {} unique states ({} generated), {:.1?}",
        checker.unique_state_count(),
        checker.state_count(),
        started.elapsed(),
    );
    // On a violation this prints the property and the stateright path to it.
    checker.assert_properties();
    if depth <= M1_DEPTH {
        assert!(
            checker.unique_state_count() <= MAX_STATES,
            "M1 outgrew its budget: {} states",
            checker.unique_state_count()
        );
    }
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
/// `SLOTRING_MODEL_EXTENDED=1`) until one of `expected` is violated; prints the
/// counterexample and returns the properties violated.
fn walk(
    test: &str,
    model: Model,
    seed: u64,
    states: usize,
    expected: &[&'static str],
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
            expected.iter().copied().collect::<BTreeSet<_>>(),
        ))
        .target_state_count(env("SLOTRING_MODEL_WALK_STATES", states))
        .spawn_simulation(
            env("SLOTRING_MODEL_SEED", seed),
            Weighted {
                deliver: env("SLOTRING_MODEL_DELIVER_WEIGHT", 10),
            },
        )
        .join();
    let found: Vec<&'static str> = expected
        .iter()
        .copied()
        .filter(|p| checker.discovery(p).is_some())
        .collect();
    println!(
        "{test}: {} states walked, longest walk {} steps, {:.1?}; violated: {found:?}",
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    if let Some(first) = found.first() {
        let path = first_violation(&model, first, checker.discovery(first).expect("found"));
        println!(
            "counterexample for \"{first}\":\n{}replay: SLOTRING_MODEL_REPLAY='{test}={}'",
            trace(&path),
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

fn mutated(test: &str) -> (Knobs, &'static [ClientPlan]) {
    let mut mutations = Mutations::default();
    let mut clients: &'static [ClientPlan] = &TWO_CLIENTS;
    let mut max_append = 256;
    let mut max_n = knobs(mutations).max_n;
    match test {
        "model_m1_failover_is_safe" => {}
        "model_catches_skip_persist_promised" => mutations.skip_persist_promised = true,
        "model_catches_compare_logs_by_length" => mutations.compare_logs_by_length = true,
        "model_catches_commit_old_ballot_entries" => {
            mutations.commit_old_ballot_entries = true;
            max_append = 1;
            max_n = max_n.max(4);
        }
        "model_catches_read_without_round" => {
            mutations.read_without_round = true;
            clients = &ONE_CLIENT;
        }
        other => panic!("unknown test {other}"),
    }
    let knobs = Knobs {
        max_append,
        max_n,
        ..knobs(mutations)
    };
    (knobs, clients)
}

fn mutation_test(test: &str, states: usize, expected: &[&'static str]) {
    let (knobs, clients) = mutated(test);
    let found = walk(
        test,
        model(knobs, clients, Crashes::Restart),
        1,
        states,
        expected,
    );
    assert!(
        !found.is_empty(),
        "{test}: no violation of {expected:?} found"
    );
}

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

/// R2: adopting the longest log instead of the most up-to-date one.
#[test]
fn model_catches_compare_logs_by_length() {
    mutation_test(
        "model_catches_compare_logs_by_length",
        3_000_000,
        &[ACKED, COMMITTED, LOG_MATCHING, LINEARIZABLE, ASSERTION],
    );
}

/// R4 (Raft's Figure 8): committing an older ballot's entry by counting its replicas. Runs with
/// `max_append = 1` and ballots up to `n = 4`. With whole-suffix `Append`s every
/// acknowledgement to a new leader also covers its `EpochStart`, so an older entry never
/// reaches a majority alone and the switch changes nothing. And three voters need four
/// ballots: the entry's, the one that wrote the conflicting entry, the one that commits the
/// old entry, and the one that overwrites it; within `n ≤ 3` the overwriting candidate cannot
/// exist, because a deposed leader has seen `n = 3` and stands at 4.
#[test]
fn model_catches_commit_old_ballot_entries() {
    mutation_test(
        "model_catches_commit_old_ballot_entries",
        6_000_000,
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

/// Prints every state along a path printed by a test:
/// `SLOTRING_MODEL_REPLAY='model_catches_read_without_round=0/1/1/...'`. Does nothing without
/// the variable.
#[test]
fn model_replay() {
    let Ok(spec) = std::env::var("SLOTRING_MODEL_REPLAY") else {
        return;
    };
    let (test, path) = spec.split_once('=').expect("<test>=<path>");
    let (knobs, clients) = mutated(test);
    let crashes = if test == "model_m1_failover_is_safe" {
        Crashes::Stateright
    } else {
        Crashes::Restart
    };
    let model = model(knobs, clients, crashes);
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
/// violation (with ballots up to 4 as well under `SLOTRING_MODEL_EXTENDED=1`).
#[test]
fn model_m1_random_walks_find_nothing() {
    let all = [
        ONE_LEADER,
        LOG_MATCHING,
        COMMITTED,
        ACKED,
        REFUSED,
        LINEARIZABLE,
        ASSERTION,
    ];
    let mut runs = vec![knobs(Mutations::default())];
    if extended() {
        runs.push(Knobs {
            max_n: 4,
            ..knobs(Mutations::default())
        });
    }
    for knobs in runs {
        let model = model(knobs, &TWO_CLIENTS, Crashes::Restart);
        let found = walk(
            "model_m1_random_walks_find_nothing",
            model,
            7,
            2_000_000,
            &all,
        );
        assert!(found.is_empty(), "violated: {found:?}");
    }
}
