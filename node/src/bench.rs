//! `node bench`: a load generator in the manner of `redis-benchmark`.
//!
//! It runs `clients × pipeline` concurrent operation loops over one client endpoint and one
//! shared routing cache ([`KvClient`] clones), each loop doing one operation at a time on a key
//! drawn uniformly from `key:0 .. key:<keys-1>`: a `get` with probability `--read-ratio`, else
//! a `put` of `--value-size` bytes. It reports operations per second, latency percentiles of
//! the successful operations (from a fixed-size log-linear histogram, at most 1/64 above the
//! true value), and counts of ok / unavailable / indeterminate / other outcomes, for writes and
//! reads separately; then how many operations needed more than one attempt (the client library
//! follows `moved` and retries what was never appended), their latency, and why.
//!
//! What it deliberately does not do: no connection per client (every loop shares the
//! endpoint's one QUIC connection per node, with one stream per request, so `--clients` and
//! `--pipeline` only set how many operations are in flight), no coordinated-omission
//! correction (a loop waits for its operation before starting the next, as redis-benchmark
//! does), no key distribution other than uniform, and no retry of an indeterminate write (the
//! client library reports it and the loop moves on).

use std::io::IsTerminal as _;
use std::num::{NonZeroU32, NonZeroU64};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;
use cluster::replica::ClientOp;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use serde_json::{Value, json};

use crate::client::{KvClient, KvError, Retries};
use crate::{Output, QueryArgs};

/// The largest value the bench writes; the node's own limit is 1 MiB.
const MAX_VALUE_SIZE: usize = 1 << 20;

/// `node bench`'s flags.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// How many distinct keys (`key:0` .. `key:<N-1>`) operations pick from, uniformly.
    #[arg(long, env = "SLOTRING_KEYS", default_value_t = 100_000)]
    pub(crate) keys: u64,
    /// Bytes per written value.
    #[arg(long, env = "SLOTRING_VALUE_SIZE", default_value_t = 100)]
    pub(crate) value_size: usize,
    /// Concurrent clients (at least 1).
    #[arg(long, env = "SLOTRING_CLIENTS", default_value_t = 50)]
    pub(crate) clients: u32,
    /// Operations in flight per client (at least 1); `clients × pipeline` loops run at once.
    #[arg(long, env = "SLOTRING_PIPELINE", default_value_t = 1)]
    pub(crate) pipeline: u32,
    /// The share of reads, 0.0 (writes only) to 1.0 (reads only).
    #[arg(long, env = "SLOTRING_READ_RATIO", default_value_t = 0.0)]
    pub(crate) read_ratio: f64,
    /// Run for this many seconds (default 10 when `--requests` is not given).
    #[arg(long, env = "SLOTRING_DURATION", conflicts_with = "requests")]
    pub(crate) duration: Option<f64>,
    /// Run this many operations in all, then stop.
    #[arg(long, env = "SLOTRING_REQUESTS")]
    pub(crate) requests: Option<u64>,
    /// Operation `k` uses key `k mod --keys` instead of a random one, so `--requests N` with
    /// `--keys N` and a read ratio of 0 writes every key exactly once (a fill).
    #[arg(long, env = "SLOTRING_SEQUENTIAL")]
    pub(crate) sequential: bool,
    /// Seeds the key choice (default: random), for a run that repeats its key sequence.
    #[arg(long, env = "SLOTRING_SEED")]
    pub(crate) seed: Option<u64>,
    /// Start operations at this many per second in all, on a fixed schedule (operation `k` is
    /// due at `k / rate` s), and count each one's latency from when it was due, so time spent
    /// waiting for a free loop shows in the percentiles (no coordinated omission). Default: as
    /// fast as the loops go.
    #[arg(long, env = "SLOTRING_RATE")]
    pub(crate) rate: Option<f64>,
    /// Threads the load generator runs on (1 to 64). One, like `redis-benchmark`'s default, is
    /// usually the fastest: it spares cross-thread wake-ups, and a single thread keeps up with
    /// a local cluster; more help against a cluster elsewhere.
    #[arg(long, env = "SLOTRING_BENCH_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) threads: u16,
    /// `-a`, `-o`, `--certs-dir`, and `--timeout` (seconds per operation, retries included).
    #[command(flatten)]
    pub(crate) query: QueryArgs,
}

/// When the run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    /// After this long (operations in flight then are still waited for).
    After(Duration),
    /// After this many operations have been started.
    Requests(NonZeroU64),
}

/// A checked `node bench` configuration.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    keys: NonZeroU64,
    value_size: usize,
    clients: NonZeroU32,
    pipeline: NonZeroU32,
    read_ratio: f64,
    stop: Stop,
    timeout: Duration,
    seed: u64,
    /// Keys in operation order rather than random.
    sequential: bool,
    /// Operations per second, when paced.
    rate: Option<f64>,
}

impl Plan {
    /// Checks the flags; the error is a usage message.
    fn from_args(args: &BenchArgs) -> Result<Plan, String> {
        let keys = NonZeroU64::new(args.keys).ok_or("--keys must be at least 1")?;
        let clients = NonZeroU32::new(args.clients).ok_or("--clients must be at least 1")?;
        let pipeline = NonZeroU32::new(args.pipeline).ok_or("--pipeline must be at least 1")?;
        if !(0.0..=1.0).contains(&args.read_ratio) {
            return Err(format!(
                "--read-ratio must be within 0.0..=1.0, not {}",
                args.read_ratio
            ));
        }
        if args.value_size > MAX_VALUE_SIZE {
            return Err(format!(
                "--value-size must be at most {MAX_VALUE_SIZE} bytes"
            ));
        }
        if u64::from(clients.get()) * u64::from(pipeline.get()) > 1_000_000 {
            return Err("--clients × --pipeline must be at most 1000000".to_owned());
        }
        let stop = match (args.duration, args.requests) {
            (Some(_), Some(_)) => return Err("give --duration or --requests, not both".into()),
            (None, Some(n)) => {
                Stop::Requests(NonZeroU64::new(n).ok_or("--requests must be at least 1")?)
            }
            (Some(secs), None) => {
                if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
                    return Err(format!(
                        "--duration must be within (0, 86400] s, not {secs}"
                    ));
                }
                Stop::After(Duration::from_secs_f64(secs))
            }
            (None, None) => Stop::After(Duration::from_secs(10)),
        };
        if let Some(rate) = args.rate
            && !(rate.is_finite() && rate > 0.0 && rate <= 10_000_000.0)
        {
            return Err(format!(
                "--rate must be within (0, 10000000] ops/s, not {rate}"
            ));
        }
        Ok(Plan {
            rate: args.rate,
            keys,
            value_size: args.value_size,
            clients,
            pipeline,
            read_ratio: args.read_ratio,
            stop,
            timeout: args.query.timeout(),
            seed: args.seed.unwrap_or_else(rand::random),
            sequential: args.sequential,
        })
    }

    fn loops(&self) -> u32 {
        // Checked in from_args: at most 10^6.
        self.clients.get() * self.pipeline.get()
    }
}

/// The name of key number `n`.
fn key_name(n: u64) -> Vec<u8> {
    format!("key:{n}").into_bytes()
}

/// A key number drawn uniformly from `0..keys`.
fn pick_key(rng: &mut StdRng, keys: NonZeroU64) -> u64 {
    rng.random_range(0..keys.get())
}

/// Whether the next operation is a read, with probability `read_ratio`.
fn pick_read(rng: &mut StdRng, read_ratio: f64) -> bool {
    // random::<f64>() is in [0, 1): a ratio of 0 never reads, 1 always does.
    read_ratio > 0.0 && rng.random::<f64>() < read_ratio
}

// ---------------------------------------------------------------------------------------------
// Latency histogram.

/// Values below this many microseconds have a bucket each.
const EXACT_BELOW: u64 = 128;
/// log2 of the buckets per power of two above [`EXACT_BELOW`]: 64, so a bucket spans at most
/// 1/64 of its values.
const SUB_BITS: u32 = 6;
/// The largest power of two covered; larger values (over 12 days in µs) land in the last
/// bucket.
const TOP_EXPONENT: u32 = 39;
const BUCKETS: usize =
    EXACT_BELOW as usize + ((TOP_EXPONENT - EXACT_BELOW.trailing_zeros() + 1) << SUB_BITS) as usize;

/// The bucket of `micros`.
fn bucket_of(micros: u64) -> usize {
    if micros < EXACT_BELOW {
        return micros as usize;
    }
    let micros = micros.min((1 << (TOP_EXPONENT + 1)) - 1);
    let exponent = 63 - micros.leading_zeros();
    let sub = (micros >> (exponent - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    EXACT_BELOW as usize
        + (((exponent - EXACT_BELOW.trailing_zeros()) as usize) << SUB_BITS)
        + sub as usize
}

/// The largest value that lands in `bucket`.
fn bucket_high(bucket: usize) -> u64 {
    if bucket < EXACT_BELOW as usize {
        return bucket as u64;
    }
    let above = bucket - EXACT_BELOW as usize;
    let exponent = EXACT_BELOW.trailing_zeros() + (above >> SUB_BITS) as u32;
    let sub = (above & ((1 << SUB_BITS) - 1)) as u64;
    let width = 1u64 << (exponent - SUB_BITS);
    (((1 << SUB_BITS) + sub) << (exponent - SUB_BITS)) + width - 1
}

/// A latency histogram many tasks record into at once, in microseconds.
struct Histogram {
    counts: Box<[AtomicU64]>,
    max: AtomicU64,
    sum: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    fn record(&self, micros: u64) {
        self.counts[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(micros, Ordering::Relaxed);
        self.sum.fetch_add(micros, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max: self.max.load(Ordering::Relaxed),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    counts: Vec<u64>,
    max: u64,
    sum: u64,
}

impl Snapshot {
    fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn merge(&self, other: &Snapshot) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .zip(&other.counts)
                .map(|(a, b)| a + b)
                .collect(),
            max: self.max.max(other.max),
            sum: self.sum + other.sum,
        }
    }

    /// The value at quantile `q` (0 < q ≤ 1): the smallest recorded value that at least
    /// `ceil(q · n)` values do not exceed, rounded up to its bucket's top (and to no more than
    /// the maximum recorded). `None` when empty.
    fn quantile(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        // Rounded to the nearest rank first, so 0.99 · 100 is 99 and not 100 (0.99 is not
        // exact in binary).
        let rank = ((q * total as f64 * 1e6).round() / 1e6).ceil() as u64;
        let rank = rank.clamp(1, total);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(bucket_high(bucket).min(self.max));
            }
        }
        Some(self.max)
    }

    fn mean(&self) -> Option<f64> {
        let total = self.total();
        (total > 0).then(|| self.sum as f64 / total as f64)
    }
}

// ---------------------------------------------------------------------------------------------
// Outcomes.

/// The outcomes of one kind of operation (writes or reads).
struct Kind {
    latency: Histogram,
    ok: AtomicU64,
    /// Reads that found no value (counted in `ok` too).
    missing: AtomicU64,
    unavailable: AtomicU64,
    indeterminate: AtomicU64,
    other: AtomicU64,
}

impl Kind {
    fn new() -> Self {
        Kind {
            latency: Histogram::new(),
            ok: AtomicU64::new(0),
            missing: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
            indeterminate: AtomicU64::new(0),
            other: AtomicU64::new(0),
        }
    }

    fn done(&self) -> u64 {
        self.ok.load(Ordering::Relaxed) + self.failed()
    }

    fn failed(&self) -> u64 {
        self.unavailable.load(Ordering::Relaxed)
            + self.indeterminate.load(Ordering::Relaxed)
            + self.other.load(Ordering::Relaxed)
    }
}

/// The operations that took more than one attempt, whatever their outcome.
struct RetryTally {
    /// Their latencies, successful or not.
    latency: Histogram,
    moved: AtomicU64,
    unavailable: AtomicU64,
    overloaded: AtomicU64,
    unsent: AtomicU64,
    superseded: AtomicU64,
}

impl RetryTally {
    fn new() -> Self {
        RetryTally {
            latency: Histogram::new(),
            moved: AtomicU64::new(0),
            unavailable: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            unsent: AtomicU64::new(0),
            superseded: AtomicU64::new(0),
        }
    }

    fn record(&self, retries: Retries, micros: u64) {
        if retries.total() == 0 {
            return;
        }
        self.latency.record(micros);
        for (counter, count) in [
            (&self.moved, retries.moved),
            (&self.unavailable, retries.unavailable),
            (&self.overloaded, retries.overloaded),
            (&self.unsent, retries.unsent),
            (&self.superseded, retries.superseded),
        ] {
            counter.fetch_add(u64::from(count), Ordering::Relaxed);
        }
    }
}

/// Everything the loops count.
struct Tally {
    writes: Kind,
    reads: Kind,
    retried: RetryTally,
    /// The first error seen, for the report.
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn record(&self, read: bool, outcome: Result<Option<Vec<u8>>, KvError>, micros: u64) {
        let kind = if read { &self.reads } else { &self.writes };
        let counter = match outcome {
            Ok(value) => {
                kind.latency.record(micros);
                if value.is_none() && read {
                    kind.missing.fetch_add(1, Ordering::Relaxed);
                }
                &kind.ok
            }
            Err(error) => {
                let counter = match error {
                    KvError::Unavailable { .. } => &kind.unavailable,
                    KvError::Indeterminate { .. } => &kind.indeterminate,
                    KvError::Overloaded { .. } | KvError::Refused(_) | KvError::Unreachable(_) => {
                        &kind.other
                    }
                };
                let mut first = self
                    .first_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if first.is_none() {
                    *first = Some(error.to_string());
                }
                counter
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn done(&self) -> u64 {
        self.writes.done() + self.reads.done()
    }

    fn failed(&self) -> u64 {
        self.writes.failed() + self.reads.failed()
    }
}

/// Hands out the right to start one more operation.
struct Gate {
    stop: Stop,
    start: Instant,
    started: AtomicU64,
    rate: Option<f64>,
}

impl Gate {
    /// The next operation's number and start: when it is due (paced by `--rate`) or now;
    /// `None` once the run is over.
    fn next(&self) -> Option<(u64, Instant)> {
        let number = self.started.fetch_add(1, Ordering::Relaxed);
        let due = match self.rate {
            Some(rate) => self.start + Duration::from_secs_f64(number as f64 / rate),
            None => Instant::now(),
        };
        let more = match self.stop {
            Stop::After(duration) => due.duration_since(self.start) < duration,
            Stop::Requests(n) => number < n.get(),
        };
        more.then_some((number, due))
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// `node bench`.
pub(crate) async fn run(args: &BenchArgs) -> Result<ExitCode> {
    let plan = match Plan::from_args(args) {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(ExitCode::from(2));
        }
    };
    let query = &args.query;
    let endpoint = crate::cli::client(query)?;
    let attempt = plan.timeout.min(Duration::from_secs(1));
    let kv = KvClient::new(endpoint, query.addr, attempt);

    // Warm-up: the shard count, so keys map to shards locally, and every shard's leader.
    let warm = Instant::now();
    let shards = match kv.learn_shard_count(warm + plan.timeout).await {
        Ok(count) => count.get(),
        Err(error) => bail!("asking {} for the cluster spec: {error}", query.addr),
    };
    let next_shard = Arc::new(AtomicU32::new(0));
    let mut warmers = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (kv, next_shard) = (kv.clone(), next_shard.clone());
        let deadline = warm + plan.timeout;
        warmers.spawn(async move {
            loop {
                let shard = next_shard.fetch_add(1, Ordering::Relaxed);
                let Ok(shard) = u16::try_from(shard) else {
                    break;
                };
                if u32::from(shard) >= shards {
                    break;
                }
                // A miss only means the first operation on that shard asks the seed.
                let _ = kv.learn_leader(shard, deadline).await;
            }
        });
    }
    while warmers.join_next().await.is_some() {}
    eprintln!(
        "bench: {shards} shard leaders looked up in {:.2} s; {} loops ({} clients × {} in flight) on {}",
        warm.elapsed().as_secs_f64(),
        plan.loops(),
        plan.clients,
        plan.pipeline,
        query.addr,
    );

    let tally = Arc::new(Tally {
        writes: Kind::new(),
        reads: Kind::new(),
        retried: RetryTally::new(),
        first_error: Mutex::new(None),
    });
    let start = Instant::now();
    let gate = Arc::new(Gate {
        stop: plan.stop,
        start,
        started: AtomicU64::new(0),
        rate: plan.rate,
    });
    let value: Arc<[u8]> = vec![b'x'; plan.value_size].into();
    let mut loops = tokio::task::JoinSet::new();
    for index in 0..plan.loops() {
        let (kv, tally, gate, value) = (kv.clone(), tally.clone(), gate.clone(), value.clone());
        let seed = plan
            .seed
            .wrapping_add(u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (keys, read_ratio, timeout) = (plan.keys, plan.read_ratio, plan.timeout);
        let sequential = plan.sequential;
        loops.spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            while let Some((number, due)) = gate.next() {
                // Tokio's timers tick in whole milliseconds: a sleep until a due time already
                // passed would still cost up to one, on every operation of an unpaced run.
                if due > Instant::now() {
                    tokio::time::sleep_until(due.into()).await;
                }
                let key = key_name(if sequential {
                    number % keys.get()
                } else {
                    pick_key(&mut rng, keys)
                });
                let read = pick_read(&mut rng, read_ratio);
                let op = if read {
                    ClientOp::Get { key }
                } else {
                    ClientOp::Put {
                        key,
                        value: value.to_vec(),
                    }
                };
                // Paced: from when it was due; otherwise `due` is when the loop got to it.
                let mut retries = Retries::default();
                let outcome = kv
                    .execute_counted(op, Instant::now() + timeout, &mut retries)
                    .await;
                let micros = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
                tally.retried.record(retries, micros);
                tally.record(read, outcome, micros);
            }
        });
    }

    let progress = Progress::new(&plan);
    let mut tick = tokio::time::interval(progress.every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last = (start, 0u64);
    loop {
        tokio::select! {
            joined = loops.join_next() => match joined {
                Some(Ok(())) => {}
                Some(Err(error)) => bail!("a bench loop failed: {error}"),
                None => break,
            },
            _ = tick.tick() => {
                let now = Instant::now();
                let done = tally.done();
                let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-9);
                last = (now, done);
                progress.show(start.elapsed(), done, rate, tally.failed());
            }
        }
    }
    let elapsed = start.elapsed();
    progress.finish();

    let report = Report::new(&plan, query, &tally, elapsed);
    match query.output {
        Output::Json => crate::cli::emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report.json()).unwrap_or_default()
        )),
        Output::Table => crate::cli::emit(&report.text()),
    }
    let ok = tally.writes.ok.load(Ordering::Relaxed) + tally.reads.ok.load(Ordering::Relaxed);
    Ok(if ok > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A progress bar on a terminal, else one plain line per second on stderr.
struct Progress {
    bar: Option<ProgressBar>,
    stop: Stop,
}

impl Progress {
    fn new(plan: &Plan) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let (len, template) = match plan.stop {
                Stop::After(duration) => (
                    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
                    "{bar:40} {elapsed}/{duration} {msg}",
                ),
                Stop::Requests(n) => (n.get(), "{bar:40} {pos}/{len} {msg}"),
            };
            let bar = ProgressBar::new(len);
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style);
            }
            bar
        });
        Progress {
            bar,
            stop: plan.stop,
        }
    }

    fn every(&self) -> Duration {
        if self.bar.is_some() {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(1)
        }
    }

    fn show(&self, elapsed: Duration, done: u64, rate: f64, failed: u64) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(match self.stop {
                    Stop::After(_) => u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
                    Stop::Requests(_) => done,
                });
                bar.set_message(format!("{done} ops, {rate:.0} ops/s, {failed} failed"));
            }
            None if elapsed >= Duration::from_millis(500) => eprintln!(
                "bench: {:.0} s: {done} ops, {rate:.0} ops/s, {failed} failed",
                elapsed.as_secs_f64()
            ),
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The report.

/// One row of the report.
struct Row {
    name: &'static str,
    latency: Snapshot,
    ok: u64,
    missing: u64,
    unavailable: u64,
    indeterminate: u64,
    other: u64,
}

impl Row {
    fn of(name: &'static str, kind: &Kind) -> Row {
        Row {
            name,
            latency: kind.latency.snapshot(),
            ok: kind.ok.load(Ordering::Relaxed),
            missing: kind.missing.load(Ordering::Relaxed),
            unavailable: kind.unavailable.load(Ordering::Relaxed),
            indeterminate: kind.indeterminate.load(Ordering::Relaxed),
            other: kind.other.load(Ordering::Relaxed),
        }
    }

    fn sum(name: &'static str, a: &Row, b: &Row) -> Row {
        Row {
            name,
            latency: a.latency.merge(&b.latency),
            ok: a.ok + b.ok,
            missing: a.missing + b.missing,
            unavailable: a.unavailable + b.unavailable,
            indeterminate: a.indeterminate + b.indeterminate,
            other: a.other + b.other,
        }
    }

    fn ops(&self) -> u64 {
        self.ok + self.unavailable + self.indeterminate + self.other
    }

    fn ms(&self, q: f64) -> Option<f64> {
        self.latency.quantile(q).map(|us| us as f64 / 1000.0)
    }

    fn json(&self, secs: f64) -> Value {
        json!({
            "ops": self.ops(),
            "ops_per_s": self.ops() as f64 / secs,
            "ok_per_s": self.ok as f64 / secs,
            "ok": self.ok,
            "missing": self.missing,
            "unavailable": self.unavailable,
            "indeterminate": self.indeterminate,
            "other": self.other,
            "latency_ms": {
                "p50": self.ms(0.5),
                "p99": self.ms(0.99),
                "p999": self.ms(0.999),
                "mean": self.latency.mean().map(|us| us / 1000.0),
                "max": (self.latency.total() > 0).then(|| self.latency.max as f64 / 1000.0),
            },
        })
    }
}

/// The operations that needed more than one attempt (see [`Retries`]).
struct Retried {
    /// Their latencies, successful or not.
    latency: Snapshot,
    moved: u64,
    unavailable: u64,
    overloaded: u64,
    unsent: u64,
    superseded: u64,
}

impl Retried {
    fn of(tally: &RetryTally) -> Retried {
        Retried {
            latency: tally.latency.snapshot(),
            moved: tally.moved.load(Ordering::Relaxed),
            unavailable: tally.unavailable.load(Ordering::Relaxed),
            overloaded: tally.overloaded.load(Ordering::Relaxed),
            unsent: tally.unsent.load(Ordering::Relaxed),
            superseded: tally.superseded.load(Ordering::Relaxed),
        }
    }

    fn ms(&self, q: f64) -> Option<f64> {
        self.latency.quantile(q).map(|us| us as f64 / 1000.0)
    }

    fn json(&self) -> Value {
        json!({
            "ops": self.latency.total(),
            "attempts": {
                "moved": self.moved,
                "unavailable": self.unavailable,
                "overloaded": self.overloaded,
                "unsent": self.unsent,
                "superseded": self.superseded,
            },
            "latency_ms": {
                "p50": self.ms(0.5),
                "p99": self.ms(0.99),
                "max": (self.latency.total() > 0).then(|| self.latency.max as f64 / 1000.0),
            },
        })
    }

    /// One line for people, or nothing when every operation took one attempt.
    fn text(&self) -> Option<String> {
        let ops = self.latency.total();
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        (ops > 0).then(|| {
            format!(
                "retried: {ops} operations took more than one attempt (p50 {} ms, p99 {} ms); \
                 extra attempts after moved {}, unavailable {}, overloaded {}, unsent {}, \
                 superseded {}\n",
                ms(self.ms(0.5)),
                ms(self.ms(0.99)),
                self.moved,
                self.unavailable,
                self.overloaded,
                self.unsent,
                self.superseded,
            )
        })
    }
}

struct Report {
    plan: Plan,
    addr: std::net::SocketAddr,
    elapsed: Duration,
    rows: Vec<Row>,
    retried: Retried,
    first_error: Option<String>,
}

impl Report {
    fn new(plan: &Plan, query: &QueryArgs, tally: &Tally, elapsed: Duration) -> Report {
        let writes = Row::of("writes", &tally.writes);
        let reads = Row::of("reads", &tally.reads);
        let mut rows = Vec::new();
        if writes.ops() > 0 && reads.ops() > 0 {
            let all = Row::sum("all", &writes, &reads);
            rows.extend([writes, reads, all]);
        } else if reads.ops() > 0 {
            rows.push(reads);
        } else {
            rows.push(writes);
        }
        Report {
            plan: plan.clone(),
            addr: query.addr,
            elapsed,
            rows,
            retried: Retried::of(&tally.retried),
            first_error: tally
                .first_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }

    fn json(&self) -> Value {
        let plan = &self.plan;
        let mut answer = json!({
            "version": 1,
            "addr": self.addr.to_string(),
            "keys": plan.keys.get(),
            "value_size": plan.value_size,
            "clients": plan.clients.get(),
            "pipeline": plan.pipeline.get(),
            "read_ratio": plan.read_ratio,
            "timeout_s": plan.timeout.as_secs_f64(),
            "seed": plan.seed,
            "sequential": plan.sequential,
            "rate": plan.rate,
            "elapsed_s": self.secs(),
            "first_error": self.first_error,
            "retried": self.retried.json(),
        });
        match plan.stop {
            Stop::After(d) => answer["duration_s"] = json!(d.as_secs_f64()),
            Stop::Requests(n) => answer["requests"] = json!(n.get()),
        }
        for row in &self.rows {
            answer[row.name] = row.json(self.secs());
        }
        answer
    }

    fn text(&self) -> String {
        let plan = &self.plan;
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        let mut rows = vec![
            [
                "",
                "OPS",
                "OPS/S",
                "P50 MS",
                "P99 MS",
                "P99.9 MS",
                "MAX MS",
                "OK",
                "MISSING",
                "UNAVAILABLE",
                "INDETERMINATE",
                "OTHER",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for row in &self.rows {
            let max = (row.latency.total() > 0).then(|| row.latency.max as f64 / 1000.0);
            rows.push(vec![
                row.name.to_owned(),
                row.ops().to_string(),
                format!("{:.0}", row.ops() as f64 / self.secs()),
                ms(row.ms(0.5)),
                ms(row.ms(0.99)),
                ms(row.ms(0.999)),
                ms(max),
                row.ok.to_string(),
                row.missing.to_string(),
                row.unavailable.to_string(),
                row.indeterminate.to_string(),
                row.other.to_string(),
            ]);
        }
        let paced = plan
            .rate
            .map_or_else(String::new, |rate| format!(", paced at {rate} ops/s"));
        let mut out = format!(
            "{} clients × {} in flight, {} keys{}, {} B values, read ratio {}{paced}, {:.2} s against {}\n",
            plan.clients,
            plan.pipeline,
            plan.keys,
            if plan.sequential { " in order" } else { "" },
            plan.value_size,
            plan.read_ratio,
            self.secs(),
            self.addr,
        );
        out.push_str(&crate::cli::table(&rows));
        if let Some(line) = self.retried.text() {
            out.push_str(&line);
        }
        if let Some(error) = &self.first_error {
            out.push_str(&format!("first error: {error}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(args);
        let wrapper = Wrapper::try_parse_from(argv).map_err(|e| e.to_string())?;
        Plan::from_args(&wrapper.bench)
    }

    #[test]
    fn a_rate_paces_the_schedule_and_bad_rates_are_refused() {
        assert_eq!(plan(&["--seed", "1"]).unwrap().rate, None);
        assert_eq!(plan(&["--rate", "2500"]).unwrap().rate, Some(2500.0));
        for bad in [
            "--rate=0",
            "--rate=-1",
            "--rate=inf",
            "--rate=NaN",
            "--rate=20000000",
        ] {
            let error = plan(&[bad]).unwrap_err();
            assert!(error.contains("--rate must be within"), "{bad}: {error}");
        }
        let start = Instant::now();
        let gate = Gate {
            stop: Stop::After(Duration::from_secs(1)),
            start,
            started: AtomicU64::new(0),
            rate: Some(4.0),
        };
        let started: Vec<(u64, Duration)> = std::iter::from_fn(|| gate.next())
            .map(|(number, at)| (number, at.duration_since(start)))
            .collect();
        let (numbers, due): (Vec<u64>, Vec<Duration>) = started.into_iter().unzip();
        assert_eq!(
            numbers,
            [0, 1, 2, 3],
            "operations are numbered in start order"
        );
        assert_eq!(
            due,
            [0, 250, 500, 750].map(Duration::from_millis).to_vec(),
            "four operations due in the first second, a quarter second apart"
        );
    }

    #[test]
    fn defaults_are_redis_benchmark_like() {
        let plan = plan(&["--seed", "7"]).unwrap();
        assert_eq!(plan.keys.get(), 100_000);
        assert_eq!(plan.value_size, 100);
        assert_eq!(plan.clients.get(), 50);
        assert_eq!(plan.pipeline.get(), 1);
        assert_eq!(plan.read_ratio, 0.0);
        assert_eq!(plan.stop, Stop::After(Duration::from_secs(10)));
        assert_eq!(plan.loops(), 50);
        assert!(!plan.sequential);
        assert!(self::plan(&["--sequential"]).unwrap().sequential);
    }

    #[test]
    fn arguments_are_checked() {
        assert!(plan(&["--clients", "0"]).unwrap_err().contains("--clients"));
        assert!(
            plan(&["--pipeline", "0"])
                .unwrap_err()
                .contains("--pipeline")
        );
        assert!(plan(&["--keys", "0"]).unwrap_err().contains("--keys"));
        assert!(
            plan(&["--read-ratio", "1.5"])
                .unwrap_err()
                .contains("--read-ratio")
        );
        assert!(
            plan(&["--read-ratio=-0.1"])
                .unwrap_err()
                .contains("--read-ratio")
        );
        assert!(plan(&["--read-ratio", "NaN"]).is_err());
        assert!(
            plan(&["--duration", "0"])
                .unwrap_err()
                .contains("--duration")
        );
        assert!(
            plan(&["--requests", "0"])
                .unwrap_err()
                .contains("--requests")
        );
        assert!(plan(&["--duration", "1", "--requests", "5"]).is_err());
        assert!(plan(&["--value-size", "2000000"]).is_err());
        let plan = plan(&[
            "--clients",
            "3",
            "--pipeline",
            "16",
            "--read-ratio",
            "1",
            "--requests",
            "9",
        ])
        .unwrap();
        assert_eq!(plan.loops(), 48);
        assert_eq!(plan.read_ratio, 1.0);
        assert_eq!(plan.stop, Stop::Requests(NonZeroU64::new(9).unwrap()));
    }

    #[test]
    fn keys_are_named_and_drawn_in_range() {
        assert_eq!(key_name(0), b"key:0");
        assert_eq!(key_name(99_999), b"key:99999");
        let mut rng = StdRng::seed_from_u64(1);
        let keys = NonZeroU64::new(10).unwrap();
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[pick_key(&mut rng, keys) as usize] += 1;
        }
        // Uniform: each of the 10 keys about 1000 times.
        assert!(seen.iter().all(|&n| (850..1150).contains(&n)), "{seen:?}");
        let one = NonZeroU64::new(1).unwrap();
        assert!((0..100).all(|_| pick_key(&mut rng, one) == 0));
    }

    #[test]
    fn read_ratio_is_honoured() {
        let mut rng = StdRng::seed_from_u64(2);
        assert!((0..1000).all(|_| !pick_read(&mut rng, 0.0)));
        assert!((0..1000).all(|_| pick_read(&mut rng, 1.0)));
        let reads = (0..10_000).filter(|_| pick_read(&mut rng, 0.25)).count();
        assert!((2300..2700).contains(&reads), "{reads}");
    }

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..5000).chain((5000..10_000_000).step_by(997)) {
            let bucket = bucket_of(v);
            assert!(bucket >= last, "{v}");
            assert!(bucket < BUCKETS);
            last = bucket;
            let high = bucket_high(bucket);
            assert!(high >= v, "{v} -> {high}");
            // At most 1/64 above the value.
            assert!(high - v <= v / 64, "{v} -> {high}");
            if bucket > 0 {
                assert!(bucket_high(bucket - 1) < v, "{v}");
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles() {
        let histogram = Histogram::new();
        assert_eq!(histogram.snapshot().quantile(0.5), None);
        // 1..=100 µs: exact buckets.
        for v in 1..=100 {
            histogram.record(v);
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.quantile(0.5), Some(50));
        assert_eq!(snapshot.quantile(0.99), Some(99));
        assert_eq!(snapshot.quantile(0.999), Some(100));
        assert_eq!(snapshot.quantile(1.0), Some(100));
        assert_eq!(snapshot.mean(), Some(50.5));

        // 1000 values of 1..=1000 ms: within 1/64 above the true value.
        let histogram = Histogram::new();
        for v in 1..=1000u64 {
            histogram.record(v * 1000);
        }
        let snapshot = histogram.snapshot();
        for (q, exact) in [(0.5, 500_000u64), (0.99, 990_000), (0.999, 999_000)] {
            let got = snapshot.quantile(q).unwrap();
            assert!(got >= exact && got - exact <= exact / 64, "{q}: {got}");
        }
        assert_eq!(snapshot.quantile(1.0), Some(1_000_000));

        let merged = snapshot.merge(&Histogram::new().snapshot());
        assert_eq!(merged, snapshot);
    }
}
