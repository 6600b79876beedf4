//! Key-value workloads through `node put|get|del` and their safety check, shared by the tests
//! of [`crate::kv`] and [`crate::partition`].
//!
//! A writer puts `KEY=vN` with increasing N to keys only it writes, and records every attempt
//! ([`Attempt`]: value, outcome, the node asked, when it started and ended) in a [`History`]
//! per key. The check ([`check_histories`]) is per key: the value read at the end must be the
//! last acknowledged one or one attempted after it whose outcome is unknown; never an older
//! acknowledged value, never one the cluster answered `unavailable`/`refused` for (those were
//! never appended), never a value nobody wrote.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::harness::{Client, wait_until};

/// `--timeout` of a put or get in the workloads, in seconds.
pub(crate) const OP_TIMEOUT: &str = "5";
/// How long the cluster may take to make progress again after a fault.
pub(crate) const RECOVER_WITHIN: Duration = Duration::from_secs(30);

/// What one `put`/`get`/`del` came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Acknowledged; for a get, the value (`None` for `(nil)`).
    Ok(Option<String>),
    /// `unavailable: ...`: never appended.
    Unavailable(String),
    /// `refused: ...`: nothing changed.
    Refused(String),
    /// Anything else (`indeterminate`, a node that could not be reached, a hung CLI): a write
    /// may or may not have been applied.
    Unknown(String),
}

impl Outcome {
    /// Whether a write with this outcome may have been applied.
    pub(crate) fn maybe_applied(&self) -> bool {
        matches!(self, Outcome::Ok(_) | Outcome::Unknown(_))
    }

    /// Whether it was acknowledged.
    pub(crate) fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }
}

/// Runs `node ARGS --timeout TIMEOUT -o json` against node `index` and classifies the answer.
pub(crate) fn kv(client: &Client, index: usize, args: &[&str], timeout: &str) -> Outcome {
    let mut full = args.to_vec();
    full.extend_from_slice(&["--timeout", timeout]);
    let output = match client.cli(index, &full, "json") {
        Ok(output) => output,
        Err(error) => return Outcome::Unknown(error),
    };
    let answer: Value = match serde_json::from_str(&output.stdout) {
        Ok(answer) => answer,
        Err(_) => {
            return Outcome::Unknown(format!(
                "exit {}, stdout {:?}, stderr {:?}",
                output.status,
                output.stdout.trim(),
                output.stderr.trim()
            ));
        }
    };
    match (answer["ok"].as_bool(), output.status.success()) {
        (Some(true), true) => Outcome::Ok(answer["value"].as_str().map(str::to_owned)),
        (Some(false), false) => {
            let error = answer["error"].as_str().unwrap_or_default().to_owned();
            if error.starts_with("unavailable:") {
                Outcome::Unavailable(error)
            } else if error.starts_with("refused:") {
                Outcome::Refused(error)
            } else {
                Outcome::Unknown(error)
            }
        }
        _ => Outcome::Unknown(format!("exit {} with {answer}", output.status)),
    }
}

/// A tiny xorshift generator: which node a writer asks next. Seeded from the clock, and the
/// seed is printed, so a failing schedule can be told apart (not replayed: the faults are
/// real).
#[derive(Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for writer `stream`.
    pub(crate) fn new(stream: u64) -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| u64::from(elapsed.subsec_nanos()));
        Rng((nanos ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    /// A number in `0..bound`.
    pub(crate) fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        usize::try_from(self.0 % u64::try_from(bound).expect("a small bound"))
            .expect("below a usize bound")
    }
}

/// One write a writer attempted.
#[derive(Clone)]
pub(crate) struct Attempt {
    /// The value put.
    pub(crate) value: String,
    /// What the CLI reported.
    pub(crate) outcome: Outcome,
    /// The node the CLI asked (it may have been sent on to the shard's leader).
    pub(crate) node: usize,
    /// When the CLI was started.
    pub(crate) started: Instant,
    /// When it had answered.
    pub(crate) ended: Instant,
}

impl fmt::Debug for Attempt {
    // Instants print as opaque clock readings: only the value, outcome and node.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via n{}: {:?}", self.value, self.node, self.outcome)
    }
}

/// Every write one writer attempted on one key, in order.
#[derive(Debug, Clone)]
pub(crate) struct History {
    /// The key.
    pub(crate) key: String,
    /// Its attempts, oldest first.
    pub(crate) attempts: Vec<Attempt>,
}

impl History {
    /// The values the key may hold now: the last acknowledged value (or nothing, if none was)
    /// and every value attempted after it that may have been applied.
    pub(crate) fn allowed(&self) -> BTreeSet<Option<String>> {
        let last_ack = self
            .attempts
            .iter()
            .rposition(|attempt| attempt.outcome.is_ok());
        let mut allowed = BTreeSet::new();
        let after = match last_ack {
            Some(position) => {
                allowed.insert(Some(self.attempts[position].value.clone()));
                position + 1
            }
            None => {
                allowed.insert(None);
                0
            }
        };
        for attempt in &self.attempts[after..] {
            if attempt.outcome.maybe_applied() {
                allowed.insert(Some(attempt.value.clone()));
            }
        }
        allowed
    }

    /// How many attempts had an outcome `which` accepts.
    pub(crate) fn count(&self, which: fn(&Outcome) -> bool) -> usize {
        self.attempts
            .iter()
            .filter(|attempt| which(&attempt.outcome))
            .count()
    }
}

/// Which nodes the writers may ask: the test clears a node's flag before killing it and sets
/// it again once it answers.
#[derive(Debug)]
pub(crate) struct Up(Vec<AtomicBool>);

impl Up {
    /// Every one of `count` nodes is up.
    pub(crate) fn all(count: usize) -> Up {
        Up((0..count).map(|_| AtomicBool::new(true)).collect())
    }

    /// Marks node `index` up or down.
    pub(crate) fn set(&self, index: usize, up: bool) {
        self.0[index].store(up, Ordering::SeqCst);
    }

    /// A random node that is up (node 0 if none is).
    pub(crate) fn pick(&self, rng: &mut Rng) -> usize {
        let up: Vec<usize> = (0..self.0.len())
            .filter(|&index| self.0[index].load(Ordering::SeqCst))
            .collect();
        if up.is_empty() {
            0
        } else {
            up[rng.below(up.len())]
        }
    }
}

/// Shared state of a group of writers: when to stop, what they achieved so far.
#[derive(Debug)]
pub(crate) struct Workload {
    /// Set to make the writers return.
    pub(crate) stop: AtomicBool,
    /// Writes acknowledged so far.
    pub(crate) acked: AtomicUsize,
    /// The nodes the writers may ask.
    pub(crate) up: Up,
    /// When each finished attempt had started, in the order they finished.
    finished: Mutex<Vec<Instant>>,
}

impl Workload {
    /// A workload over a cluster of `nodes` nodes, all up.
    pub(crate) fn new(nodes: usize) -> Workload {
        Workload {
            stop: AtomicBool::new(false),
            acked: AtomicUsize::new(0),
            up: Up::all(nodes),
            finished: Mutex::new(Vec::new()),
        }
    }

    /// Waits until `more` writes beyond those acknowledged now are acknowledged.
    pub(crate) fn wait_progress(&self, more: usize, within: Duration, what: &str) {
        let from = self.acked.load(Ordering::SeqCst);
        wait_until(within, what, || {
            let now = self.acked.load(Ordering::SeqCst);
            if now >= from + more {
                Ok(())
            } else {
                Err(format!("{} acknowledged since", now - from))
            }
        });
    }

    /// How many finished attempts started at or after `since`.
    pub(crate) fn finished_since(&self, since: Instant) -> usize {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|&&started| started >= since)
            .count()
    }
}

/// One writer: puts `KEY=vN` with increasing N to `keys` in turn, each through the node `node`
/// picks, with `--timeout timeout`, until `workload.stop`; returns the histories of its keys.
pub(crate) fn write_loop(
    client: &Client,
    keys: &[String],
    workload: &Workload,
    timeout: &str,
    mut node: impl FnMut() -> usize,
) -> Vec<History> {
    let mut histories: Vec<History> = keys
        .iter()
        .map(|key| History {
            key: key.clone(),
            attempts: Vec::new(),
        })
        .collect();
    let mut turn = 0;
    while !workload.stop.load(Ordering::SeqCst) {
        let history = &mut histories[turn % keys.len()];
        let value = format!("{}=v{}", history.key, history.attempts.len() + 1);
        let node = node();
        let started = Instant::now();
        let outcome = kv(client, node, &["put", &history.key, &value], timeout);
        let ended = Instant::now();
        if outcome.is_ok() {
            workload.acked.fetch_add(1, Ordering::SeqCst);
        }
        workload
            .finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(started);
        history.attempts.push(Attempt {
            value,
            outcome,
            node,
            started,
            ended,
        });
        turn += 1;
    }
    histories
}

/// Stops the writers of every workload, collects their histories, and re-raises a panic of the
/// fault thread.
pub(crate) fn finish(
    workloads: &[&Workload],
    writers: Vec<thread::ScopedJoinHandle<'_, Vec<History>>>,
    faults: thread::Result<()>,
) -> Vec<History> {
    for workload in workloads {
        workload.stop.store(true, Ordering::SeqCst);
    }
    let histories = writers
        .into_iter()
        .flat_map(|writer| writer.join().expect("a writer"))
        .collect();
    if let Err(panic) = faults {
        std::panic::resume_unwind(panic);
    }
    histories
}

/// Every key got at least one acknowledged write (so the history check has teeth).
pub(crate) fn assert_every_key_acknowledged(histories: &[History]) {
    assert!(
        histories
            .iter()
            .all(|history| history.count(Outcome::is_ok) > 0),
        "every key had an acknowledged write: {histories:?}"
    );
}

/// Reads every key of `histories` through rotating nodes of `client` (retrying failed reads,
/// which are safe to retry) and checks each against [`History::allowed`].
pub(crate) fn check_histories(client: &Client, histories: &[History]) {
    let mut violations = Vec::new();
    for (number, history) in histories.iter().enumerate() {
        let node = number % client.len();
        let what = format!("`get {}` answers", history.key);
        let read = wait_until(RECOVER_WITHIN, &what, || {
            match kv(client, node, &["get", &history.key], OP_TIMEOUT) {
                Outcome::Ok(value) => Ok(value),
                other => Err(format!("{other:?}")),
            }
        });
        let allowed = history.allowed();
        eprintln!(
            "{}: {} attempts, {} acknowledged, {} unavailable, {} unknown; read {read:?}",
            history.key,
            history.attempts.len(),
            history.count(Outcome::is_ok),
            history.count(|outcome| matches!(outcome, Outcome::Unavailable(_))),
            history.count(|outcome| matches!(outcome, Outcome::Unknown(_))),
        );
        if !allowed.contains(&read) {
            violations.push(format!(
                "{} reads {read:?}, allowed {allowed:?}; history {:?}",
                history.key, history.attempts
            ));
        }
    }
    assert!(
        violations.is_empty(),
        "lost or invented writes: {violations:#?}"
    );
}
