//! `node probe`: a write canary in the manner of `redis-cli --latency`.
//!
//! One long-lived [`KvClient`] writes one key every `--interval` ms (optionally one key in each
//! of some other shards too, concurrently, through the same client), each write bounded by
//! `--attempt-timeout` with the client library's own retries inside that bound. It prints one
//! line per change of state, stamped with the wall clock in unix milliseconds: the first
//! acknowledged write, the first failed write of an outage (with its error kind), a change of
//! error kind during an outage, and the first acknowledged write after it (with the outage's
//! length). An outage is timed from the start of its first failed write to the
//! acknowledgement that ends it; the gap between the acknowledgements on either side of it is
//! reported too. At the end (`--duration`, SIGINT or SIGTERM) it prints a summary per key.
//!
//! What it deliberately does not do: no reads, one write in flight per key (a write that
//! outlives the interval delays the next, so there is never a backlog), no retry of a failed
//! write beyond the client library's inside one attempt (the next tick is the retry), and no
//! latency histogram (`node bench` has one; the probe keeps only the slowest acknowledged
//! write).

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use cluster::replica::ClientOp;
use serde_json::{Value, json};
use shardtable::ShardCount;

use crate::client::{KvClient, KvError};
use crate::{Output, QueryArgs};

/// The key written when neither `--key` nor `--shard` is given.
const DEFAULT_KEY: &str = "slotring:probe";
/// The longest `--interval`: one hour.
const MAX_INTERVAL_MS: u64 = 3_600_000;
/// The longest `--attempt-timeout`: one minute.
const MAX_ATTEMPT_TIMEOUT_MS: u64 = 60_000;

/// `node probe`'s flags.
#[derive(Debug, Args)]
pub(crate) struct ProbeArgs {
    /// The key to write (UTF-8 as typed, at most 1 KiB); default `slotring:probe`.
    #[arg(long, env = "SLOTRING_KEY", conflicts_with = "shard")]
    pub(crate) key: Option<String>,
    /// Write a key of this shard instead: the first of `probe:<shard>:0`, `probe:<shard>:1`, ...
    /// that maps to it.
    #[arg(long, env = "SLOTRING_SHARD")]
    pub(crate) shard: Option<u16>,
    /// Also write a key of each of these other shards (comma separated), concurrently,
    /// through the same client: to see whether a failure elsewhere blocks them.
    #[arg(long, env = "SLOTRING_ALSO_SHARD", value_delimiter = ',')]
    pub(crate) also_shard: Vec<u16>,
    /// Milliseconds from the start of one write to the start of the next (a slower write
    /// delays the next; none overlap). 1 to 3600000.
    #[arg(long, env = "SLOTRING_INTERVAL", default_value_t = 10)]
    pub(crate) interval: u64,
    /// Milliseconds one write may take, the client's retries included, before it counts as
    /// failed and is abandoned; also the longest one request to one node may wait. 1 to 60000.
    #[arg(long, env = "SLOTRING_ATTEMPT_TIMEOUT", default_value_t = 200)]
    pub(crate) attempt_timeout: u64,
    /// Stop after this many seconds (default: run until SIGINT or SIGTERM).
    #[arg(long, env = "SLOTRING_DURATION")]
    pub(crate) duration: Option<f64>,
    /// Print every write, not only the changes of state.
    #[arg(long, env = "SLOTRING_VERBOSE")]
    pub(crate) verbose: bool,
    /// `-a`, `-o`, `--certs-dir`, and `--timeout` (seconds for the first lookup of the
    /// cluster's shard count).
    #[command(flatten)]
    pub(crate) query: QueryArgs,
}

/// Which key the probe writes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// This key.
    Key(Vec<u8>),
    /// A key of this shard, picked once the shard count is known.
    Shard(u16),
}

/// A checked `node probe` configuration.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    target: Target,
    /// Other shards to write, distinct, in the order given.
    also: Vec<u16>,
    interval: Duration,
    attempt_timeout: Duration,
    /// `None`: until SIGINT or SIGTERM.
    duration: Option<Duration>,
    verbose: bool,
}

impl Plan {
    /// Checks the flags; the error is a usage message.
    fn from_args(args: &ProbeArgs) -> Result<Plan, String> {
        let target = match (&args.key, args.shard) {
            (Some(_), Some(_)) => return Err("give --key or --shard, not both".to_owned()),
            (None, Some(shard)) => Target::Shard(shard),
            (Some(key), None) => {
                if key.is_empty() {
                    return Err("--key must not be empty".to_owned());
                }
                if key.len() > cluster::wire::MAX_KEY_LEN {
                    return Err(format!(
                        "--key is {} bytes; the limit is {}",
                        key.len(),
                        cluster::wire::MAX_KEY_LEN
                    ));
                }
                Target::Key(key.clone().into_bytes())
            }
            (None, None) => Target::Key(DEFAULT_KEY.as_bytes().to_vec()),
        };
        if let Target::Shard(shard) = &target
            && args.also_shard.contains(shard)
        {
            return Err(format!(
                "--also-shard must name other shards than --shard {shard}"
            ));
        }
        let mut also: Vec<u16> = Vec::new();
        for shard in &args.also_shard {
            if also.contains(shard) {
                return Err(format!("--also-shard names shard {shard} twice"));
            }
            also.push(*shard);
        }
        if !(1..=MAX_INTERVAL_MS).contains(&args.interval) {
            return Err(format!(
                "--interval must be within 1..={MAX_INTERVAL_MS} ms, not {}",
                args.interval
            ));
        }
        if !(1..=MAX_ATTEMPT_TIMEOUT_MS).contains(&args.attempt_timeout) {
            return Err(format!(
                "--attempt-timeout must be within 1..={MAX_ATTEMPT_TIMEOUT_MS} ms, not {}",
                args.attempt_timeout
            ));
        }
        let duration = match args.duration {
            None => None,
            Some(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
                Some(Duration::from_secs_f64(secs))
            }
            Some(secs) => {
                return Err(format!(
                    "--duration must be within (0, 86400] s, not {secs}"
                ));
            }
        };
        Ok(Plan {
            target,
            also,
            interval: Duration::from_millis(args.interval),
            attempt_timeout: Duration::from_millis(args.attempt_timeout),
            duration,
            verbose: args.verbose,
        })
    }
}

/// The first of `probe:<shard>:0`, `probe:<shard>:1`, ... that maps to `shard` among `count`
/// shards. `shard` must be below `count`.
fn key_in_shard(shard: u16, count: ShardCount) -> Vec<u8> {
    debug_assert!(u32::from(shard) < count.get());
    let mut n = 0u64;
    loop {
        // Keys spread uniformly over the shards, so about `count` candidates are tried; the
        // loop ends because every shard below `count` receives some key.
        let key = format!("probe:{shard}:{n}").into_bytes();
        if shardtable::shard_for(&key, count).get() == shard {
            return key;
        }
        n += 1;
    }
}

/// The wall clock in unix milliseconds (0 before 1970).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

// ---------------------------------------------------------------------------------------------
// Outage tracking: pure, on wall-clock milliseconds the caller passes in.

/// How a write failed: the [`KvError`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No leader with a majority answered in time; not applied.
    Unavailable,
    /// Maybe applied: the leader was lost before it answered.
    Indeterminate,
    /// The leader had too many requests waiting until the deadline; not applied.
    Overloaded,
    /// The node refused the request; not applied.
    Refused,
    /// The node the client asks first could not be reached.
    Unreachable,
}

impl Failure {
    const ALL: [Failure; 5] = [
        Failure::Unavailable,
        Failure::Indeterminate,
        Failure::Overloaded,
        Failure::Refused,
        Failure::Unreachable,
    ];

    fn of(error: &KvError) -> Failure {
        match error {
            KvError::Unavailable { .. } => Failure::Unavailable,
            KvError::Indeterminate { .. } => Failure::Indeterminate,
            KvError::Overloaded { .. } => Failure::Overloaded,
            KvError::Refused(_) => Failure::Refused,
            KvError::Unreachable(_) => Failure::Unreachable,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Failure::Unavailable => "unavailable",
            Failure::Indeterminate => "indeterminate",
            Failure::Overloaded => "overloaded",
            Failure::Refused => "refused",
            Failure::Unreachable => "unreachable",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One finished write, as the tracker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Attempt {
    /// When it was started, unix ms.
    started_ms: u64,
    /// When it was acknowledged or given up, unix ms.
    ended_ms: u64,
    /// How long it took, measured on the monotonic clock.
    latency: Duration,
    /// `None`: acknowledged.
    failure: Option<Failure>,
}

/// A change of state, reported once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// The first acknowledged write of the run.
    Up { at_ms: u64 },
    /// The first failed write of an outage.
    Failing {
        /// When that write started.
        since_ms: u64,
        /// When it failed.
        at_ms: u64,
        /// The acknowledgement before it (`None` at the start of the run).
        last_ok_ms: Option<u64>,
        failure: Failure,
    },
    /// Still failing, now with another error kind.
    Changed {
        since_ms: u64,
        at_ms: u64,
        failure: Failure,
    },
    /// The acknowledgement that ends an outage.
    Recovered {
        since_ms: u64,
        at_ms: u64,
        /// `at_ms - since_ms`.
        outage_ms: u64,
        /// From the acknowledgement before the outage (`None` if there was none).
        ack_gap_ms: Option<u64>,
        /// How many writes failed in it.
        failed: u64,
    },
}

/// Where the tracker is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// Nothing finished yet.
    #[default]
    Starting,
    /// The last write was acknowledged, at `last_ok_ms`.
    Up { last_ok_ms: u64 },
    /// Writes have failed since `since_ms` (the start of the first failed one).
    Down {
        since_ms: u64,
        last_ok_ms: Option<u64>,
        failure: Failure,
        failed: u64,
    },
}

/// Follows one key's writes through ups and outages, and counts them.
#[derive(Debug, Default)]
struct Tracker {
    state: State,
    writes: u64,
    ok: u64,
    failures: [u64; Failure::ALL.len()],
    outages: u64,
    longest_outage_ms: u64,
    /// The slowest acknowledged write.
    max_ok_latency: Duration,
}

impl Tracker {
    /// Takes the next finished write (in order) and returns the change it makes, if any.
    fn record(&mut self, attempt: Attempt) -> Option<Change> {
        self.writes += 1;
        match attempt.failure {
            None => {
                self.ok += 1;
                self.max_ok_latency = self.max_ok_latency.max(attempt.latency);
                let at_ms = attempt.ended_ms;
                let change = match self.state {
                    State::Starting => Some(Change::Up { at_ms }),
                    State::Up { .. } => None,
                    State::Down {
                        since_ms,
                        last_ok_ms,
                        failed,
                        ..
                    } => {
                        let outage_ms = at_ms.saturating_sub(since_ms);
                        self.outages += 1;
                        self.longest_outage_ms = self.longest_outage_ms.max(outage_ms);
                        Some(Change::Recovered {
                            since_ms,
                            at_ms,
                            outage_ms,
                            ack_gap_ms: last_ok_ms.map(|last| at_ms.saturating_sub(last)),
                            failed,
                        })
                    }
                };
                self.state = State::Up { last_ok_ms: at_ms };
                change
            }
            Some(failure) => {
                self.failures[failure.index()] += 1;
                let at_ms = attempt.ended_ms;
                match &mut self.state {
                    State::Down {
                        since_ms,
                        failure: kind,
                        failed,
                        ..
                    } => {
                        *failed += 1;
                        if *kind == failure {
                            return None;
                        }
                        *kind = failure;
                        Some(Change::Changed {
                            since_ms: *since_ms,
                            at_ms,
                            failure,
                        })
                    }
                    state @ (State::Starting | State::Up { .. }) => {
                        let last_ok_ms = match *state {
                            State::Up { last_ok_ms } => Some(last_ok_ms),
                            _ => None,
                        };
                        let since_ms = attempt.started_ms;
                        *state = State::Down {
                            since_ms,
                            last_ok_ms,
                            failure,
                            failed: 1,
                        };
                        Some(Change::Failing {
                            since_ms,
                            at_ms,
                            last_ok_ms,
                            failure,
                        })
                    }
                }
            }
        }
    }

    fn failed(&self) -> u64 {
        self.failures.iter().sum()
    }

    /// Whether the last write was acknowledged.
    fn is_up(&self) -> bool {
        matches!(self.state, State::Up { .. })
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// One key the probe writes.
#[derive(Debug, Clone)]
struct Stream {
    shard: u16,
    key: Vec<u8>,
}

impl Stream {
    fn key_text(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

/// `node probe`.
pub(crate) async fn run(args: &ProbeArgs) -> Result<ExitCode> {
    let plan = match Plan::from_args(args) {
        Ok(plan) => plan,
        Err(message) => return Ok(usage(&message)),
    };
    let query = &args.query;
    let endpoint = crate::cli::client(query)?;
    let kv = KvClient::new(endpoint, query.addr, plan.attempt_timeout);
    let count = match kv.learn_shard_count(Instant::now() + query.timeout()).await {
        Ok(count) => count,
        Err(error) => bail!("asking {} for the cluster spec: {error}", query.addr),
    };
    let in_range = |shard: u16, flag: &str| {
        if u32::from(shard) < count.get() {
            Ok(())
        } else {
            Err(format!(
                "{flag} {shard} is out of range: the cluster has {} shards",
                count.get()
            ))
        }
    };
    let first = match &plan.target {
        Target::Key(key) => Stream {
            shard: shardtable::shard_for(key, count).get(),
            key: key.clone(),
        },
        Target::Shard(shard) => {
            if let Err(message) = in_range(*shard, "--shard") {
                return Ok(usage(&message));
            }
            Stream {
                shard: *shard,
                key: key_in_shard(*shard, count),
            }
        }
    };
    let mut streams = vec![first];
    for &also in &plan.also {
        if let Err(message) = in_range(also, "--also-shard") {
            return Ok(usage(&message));
        }
        if also == streams[0].shard {
            return Ok(usage(&format!(
                "--also-shard {also} is the shard of the probed key; name another"
            )));
        }
        streams.push(Stream {
            shard: also,
            key: key_in_shard(also, count),
        });
    }
    for stream in &streams {
        let at_ms = unix_ms();
        print_line(
            query.output,
            &json!({"version": 1, "event": "start", "at_ms": at_ms, "shard": stream.shard,
                "key": stream.key_text(), "addr": query.addr.to_string(),
                "interval_ms": duration_ms(plan.interval),
                "attempt_timeout_ms": duration_ms(plan.attempt_timeout)}),
            || {
                format!(
                    "{at_ms} shard {} key {:?}: probing through {} every {} ms, {} ms per write",
                    stream.shard,
                    stream.key_text(),
                    query.addr,
                    plan.interval.as_millis(),
                    plan.attempt_timeout.as_millis()
                )
            },
        );
    }

    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for stream in streams {
        let (kv, plan, mut stop) = (kv.clone(), plan.clone(), stop_rx.clone());
        let output = query.output;
        tasks.spawn(async move {
            let tracker = probe_stream(&kv, &plan, &stream, output, &mut stop).await;
            (stream, tracker)
        });
    }
    let stop_after = async {
        match plan.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = stop_after => {}
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let _ = stop_tx.send(true);
    let mut all_up = true;
    let mut finished = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(done) => finished.push(done),
            Err(error) => bail!("a probe loop failed: {error}"),
        }
    }
    finished.sort_by_key(|(stream, _)| stream.shard);
    for (stream, tracker) in &finished {
        all_up &= tracker.is_up();
        print_summary(query.output, stream, tracker);
    }
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn usage(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

/// Writes `stream`'s key every `plan.interval` until `stop` turns true; returns its tracker.
async fn probe_stream(
    kv: &KvClient,
    plan: &Plan,
    stream: &Stream,
    output: Output,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Tracker {
    let mut tracker = Tracker::default();
    let mut tick = tokio::time::interval(plan.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
        let started_ms = unix_ms();
        let began = Instant::now();
        let op = ClientOp::Put {
            key: stream.key.clone(),
            value: format!("probe {started_ms}").into_bytes(),
        };
        let outcome = tokio::select! {
            outcome = kv.execute(op, began + plan.attempt_timeout) => outcome,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let latency = began.elapsed();
        let attempt = Attempt {
            started_ms,
            ended_ms: unix_ms(),
            latency,
            failure: outcome.as_ref().err().map(Failure::of),
        };
        let message = outcome.err().map(|error| error.to_string());
        if plan.verbose {
            print_attempt(output, stream, &attempt, message.as_deref());
        }
        if let Some(change) = tracker.record(attempt) {
            print_change(output, stream, change, latency, message.as_deref());
        }
    }
    tracker
}

fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// One line: `value` as compact JSON, or `text()`.
fn print_line(output: Output, value: &Value, text: impl FnOnce() -> String) {
    let line = match output {
        Output::Json => serde_json::to_string(value).unwrap_or_default(),
        Output::Table => text(),
    };
    crate::cli::emit(&format!("{line}\n"));
}

fn print_attempt(output: Output, stream: &Stream, attempt: &Attempt, message: Option<&str>) {
    let mut value = json!({"version": 1, "event": "write", "shard": stream.shard,
        "started_ms": attempt.started_ms, "at_ms": attempt.ended_ms,
        "latency_ms": duration_ms(attempt.latency), "ok": attempt.failure.is_none()});
    if let Some(failure) = attempt.failure {
        value["error"] = json!(failure.name());
        value["message"] = json!(message);
    }
    print_line(output, &value, || {
        let outcome = match attempt.failure {
            None => "ok".to_owned(),
            Some(_) => format!("error: {}", message.unwrap_or("?")),
        };
        format!(
            "{} shard {}: write started {} took {:.1} ms: {outcome}",
            attempt.ended_ms,
            stream.shard,
            attempt.started_ms,
            duration_ms(attempt.latency)
        )
    });
}

fn print_change(
    output: Output,
    stream: &Stream,
    change: Change,
    latency: Duration,
    message: Option<&str>,
) {
    let shard = stream.shard;
    let key = stream.key_text();
    let latency_ms = duration_ms(latency);
    match change {
        Change::Up { at_ms } => print_line(
            output,
            &json!({"version": 1, "event": "up", "shard": shard, "key": key, "at_ms": at_ms,
                "latency_ms": latency_ms}),
            || format!("{at_ms} shard {shard}: writing (first ack in {latency_ms:.1} ms)"),
        ),
        Change::Failing {
            since_ms,
            at_ms,
            last_ok_ms,
            failure,
        } => print_line(
            output,
            &json!({"version": 1, "event": "failing", "shard": shard, "key": key,
                "at_ms": at_ms, "since_ms": since_ms, "last_ok_ms": last_ok_ms,
                "error": failure.name(), "message": message}),
            || {
                let last = last_ok_ms.map_or_else(
                    || "no ack yet".to_owned(),
                    |last| format!("last ack {last}"),
                );
                format!(
                    "{at_ms} shard {shard}: FAILING since {since_ms} ({last}): {}",
                    message.unwrap_or(failure.name())
                )
            },
        ),
        Change::Changed {
            since_ms,
            at_ms,
            failure,
        } => print_line(
            output,
            &json!({"version": 1, "event": "changed", "shard": shard, "key": key,
                "at_ms": at_ms, "since_ms": since_ms, "error": failure.name(),
                "message": message}),
            || {
                format!(
                    "{at_ms} shard {shard}: still failing ({} ms), now: {}",
                    at_ms.saturating_sub(since_ms),
                    message.unwrap_or(failure.name())
                )
            },
        ),
        Change::Recovered {
            since_ms,
            at_ms,
            outage_ms,
            ack_gap_ms,
            failed,
        } => print_line(
            output,
            &json!({"version": 1, "event": "recovered", "shard": shard, "key": key,
                "at_ms": at_ms, "since_ms": since_ms, "outage_ms": outage_ms,
                "ack_gap_ms": ack_gap_ms, "failed": failed, "latency_ms": latency_ms}),
            || {
                let gap = ack_gap_ms.map_or_else(String::new, |gap| format!(", ack gap {gap} ms"));
                format!(
                    "{at_ms} shard {shard}: ok again after a {outage_ms} ms outage \
                     ({failed} failed writes{gap}; this ack took {latency_ms:.1} ms)"
                )
            },
        ),
    }
}

fn print_summary(output: Output, stream: &Stream, tracker: &Tracker) {
    let failures: serde_json::Map<String, Value> = Failure::ALL
        .iter()
        .map(|f| (f.name().to_owned(), json!(tracker.failures[f.index()])))
        .collect();
    let down_since = match tracker.state {
        State::Down { since_ms, .. } => Some(since_ms),
        State::Starting | State::Up { .. } => None,
    };
    let max_ms = (tracker.ok > 0).then(|| duration_ms(tracker.max_ok_latency));
    print_line(
        output,
        &json!({"version": 1, "event": "summary", "at_ms": unix_ms(), "shard": stream.shard,
            "key": stream.key_text(), "writes": tracker.writes, "ok": tracker.ok,
            "failed": failures, "outages": tracker.outages,
            "longest_outage_ms": tracker.longest_outage_ms, "max_ok_latency_ms": max_ms,
            "failing_since_ms": down_since}),
        || {
            let kinds: Vec<String> = Failure::ALL
                .iter()
                .filter(|f| tracker.failures[f.index()] > 0)
                .map(|f| format!("{} {}", f.name(), tracker.failures[f.index()]))
                .collect();
            let mut line = format!(
                "shard {} key {:?}: {} writes, {} ok, {} failed{}, {} outages (longest {} ms)",
                stream.shard,
                stream.key_text(),
                tracker.writes,
                tracker.ok,
                tracker.failed(),
                if kinds.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", kinds.join(", "))
                },
                tracker.outages,
                tracker.longest_outage_ms,
            );
            if let Some(max) = max_ms {
                line.push_str(&format!(", slowest ack {max:.1} ms"));
            }
            if let Some(since) = down_since {
                line.push_str(&format!(", still failing since {since}"));
            }
            line
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        probe: ProbeArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let mut argv = vec!["probe"];
        argv.extend_from_slice(args);
        let wrapper = Wrapper::try_parse_from(argv).map_err(|e| e.to_string())?;
        Plan::from_args(&wrapper.probe)
    }

    #[test]
    fn defaults() {
        let plan = plan(&[]).unwrap();
        assert_eq!(plan.target, Target::Key(b"slotring:probe".to_vec()));
        assert!(plan.also.is_empty());
        assert_eq!(plan.interval, Duration::from_millis(10));
        assert_eq!(plan.attempt_timeout, Duration::from_millis(200));
        assert_eq!(plan.duration, None);
        assert!(!plan.verbose);
    }

    #[test]
    fn arguments_become_strong_types() {
        let plan = plan(&[
            "--shard",
            "42",
            "--also-shard",
            "7",
            "--interval",
            "25",
            "--attempt-timeout",
            "150",
            "--duration",
            "2.5",
            "--verbose",
        ])
        .unwrap();
        assert_eq!(plan.target, Target::Shard(42));
        assert_eq!(plan.also, vec![7]);
        assert_eq!(plan.interval, Duration::from_millis(25));
        assert_eq!(plan.attempt_timeout, Duration::from_millis(150));
        assert_eq!(plan.duration, Some(Duration::from_millis(2500)));
        assert!(plan.verbose);
        let plan = self::plan(&["--key", "canary"]).unwrap();
        assert_eq!(plan.target, Target::Key(b"canary".to_vec()));
    }

    #[test]
    fn arguments_are_checked() {
        assert!(plan(&["--key", "k", "--shard", "1"]).is_err());
        assert!(plan(&["--key", ""]).unwrap_err().contains("--key"));
        let long = "k".repeat(1025);
        assert!(plan(&["--key", &long]).unwrap_err().contains("1024"));
        assert!(plan(&["--shard", "65536"]).is_err());
        assert!(plan(&["--shard", "-1"]).is_err());
        assert!(
            plan(&["--shard", "3", "--also-shard", "3"])
                .unwrap_err()
                .contains("--also-shard")
        );
        assert!(
            plan(&["--also-shard", "4,5,4"])
                .unwrap_err()
                .contains("twice")
        );
        assert_eq!(
            plan(&["--also-shard", "4,5", "--also-shard", "9"])
                .unwrap()
                .also,
            vec![4, 5, 9]
        );
        assert!(
            plan(&["--interval", "0"])
                .unwrap_err()
                .contains("--interval")
        );
        assert!(
            plan(&["--interval", "3600001"])
                .unwrap_err()
                .contains("--interval")
        );
        assert!(
            plan(&["--attempt-timeout", "0"])
                .unwrap_err()
                .contains("--attempt-timeout")
        );
        assert!(
            plan(&["--attempt-timeout", "60001"])
                .unwrap_err()
                .contains("--attempt-timeout")
        );
        for bad in ["0", "-1", "NaN", "inf", "86401"] {
            assert!(
                plan(&[&format!("--duration={bad}")]).is_err(),
                "--duration {bad}"
            );
        }
    }

    #[test]
    fn keys_are_found_in_their_shard() {
        for count in [1u32, 2, 16, 1024] {
            let shards = ShardCount::new(count).unwrap();
            for shard in [0, count / 2, count - 1] {
                let shard = u16::try_from(shard).unwrap();
                let key = key_in_shard(shard, shards);
                assert_eq!(shardtable::shard_for(&key, shards).get(), shard);
                assert!(key.starts_with(format!("probe:{shard}:").as_bytes()));
            }
        }
        // Stable: the same shard count always picks the same key.
        let shards = ShardCount::new(1024).unwrap();
        assert_eq!(key_in_shard(42, shards), key_in_shard(42, shards));
    }

    fn ok(started_ms: u64, ended_ms: u64) -> Attempt {
        Attempt {
            started_ms,
            ended_ms,
            latency: Duration::from_millis(ended_ms - started_ms),
            failure: None,
        }
    }

    fn fail(started_ms: u64, ended_ms: u64, failure: Failure) -> Attempt {
        Attempt {
            failure: Some(failure),
            ..ok(started_ms, ended_ms)
        }
    }

    #[test]
    fn an_outage_is_reported_once_with_its_length() {
        let mut tracker = Tracker::default();
        assert_eq!(tracker.record(ok(0, 3)), Some(Change::Up { at_ms: 3 }));
        assert_eq!(tracker.record(ok(10, 12)), None);
        assert_eq!(
            tracker.record(fail(20, 220, Failure::Indeterminate)),
            Some(Change::Failing {
                since_ms: 20,
                at_ms: 220,
                last_ok_ms: Some(12),
                failure: Failure::Indeterminate,
            })
        );
        assert_eq!(
            tracker.record(fail(230, 430, Failure::Unavailable)),
            Some(Change::Changed {
                since_ms: 20,
                at_ms: 430,
                failure: Failure::Unavailable,
            })
        );
        assert_eq!(tracker.record(fail(440, 640, Failure::Unavailable)), None);
        assert!(!tracker.is_up());
        assert_eq!(
            tracker.record(ok(650, 655)),
            Some(Change::Recovered {
                since_ms: 20,
                at_ms: 655,
                outage_ms: 635,
                ack_gap_ms: Some(643),
                failed: 3,
            })
        );
        assert!(tracker.is_up());
        assert_eq!(tracker.record(ok(665, 667)), None);
        assert_eq!(tracker.writes, 7);
        assert_eq!(tracker.ok, 4);
        assert_eq!(tracker.failed(), 3);
        assert_eq!(tracker.failures[Failure::Unavailable.index()], 2);
        assert_eq!(tracker.failures[Failure::Indeterminate.index()], 1);
        assert_eq!(tracker.outages, 1);
        assert_eq!(tracker.longest_outage_ms, 635);
        assert_eq!(tracker.max_ok_latency, Duration::from_millis(5));
    }

    #[test]
    fn failing_from_the_start_then_recovering_has_no_ack_gap() {
        let mut tracker = Tracker::default();
        assert_eq!(
            tracker.record(fail(100, 300, Failure::Unreachable)),
            Some(Change::Failing {
                since_ms: 100,
                at_ms: 300,
                last_ok_ms: None,
                failure: Failure::Unreachable,
            })
        );
        assert_eq!(
            tracker.record(ok(310, 320)),
            Some(Change::Recovered {
                since_ms: 100,
                at_ms: 320,
                outage_ms: 220,
                ack_gap_ms: None,
                failed: 1,
            })
        );
    }

    #[test]
    fn separate_outages_are_counted_and_the_longest_kept() {
        let mut tracker = Tracker::default();
        tracker.record(ok(0, 1));
        tracker.record(fail(10, 20, Failure::Unavailable));
        tracker.record(ok(30, 31));
        tracker.record(fail(40, 50, Failure::Unavailable));
        tracker.record(fail(60, 70, Failure::Unavailable));
        tracker.record(ok(80, 500));
        assert_eq!(tracker.outages, 2);
        assert_eq!(tracker.longest_outage_ms, 460);
        assert_eq!(tracker.max_ok_latency, Duration::from_millis(420));
    }

    #[test]
    fn a_clock_stepping_back_never_underflows() {
        let mut tracker = Tracker::default();
        tracker.record(ok(1000, 1001));
        tracker.record(fail(1010, 1020, Failure::Refused));
        assert_eq!(
            tracker.record(Attempt {
                started_ms: 900,
                ended_ms: 905,
                latency: Duration::from_millis(5),
                failure: None,
            }),
            Some(Change::Recovered {
                since_ms: 1010,
                at_ms: 905,
                outage_ms: 0,
                ack_gap_ms: Some(0),
                failed: 1,
            })
        );
    }
}
