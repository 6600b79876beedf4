//! The daemon: opens the data dir, joins or bootstraps, then runs the one loop that owns the
//! cluster core.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use cluster::replica::VerifyOutcome;
use cluster::wire::{self, CopyProgress, Request, Response, WireMember};
use cluster::{Cluster, ClusterSpec, Event, Identity, NodeMeta, RequestId, Transmit};
use shardtable::{Placement, ReplicationFactor, ShardCount, TableSpec};
use tokio::sync::mpsc;
use topology::{NodeId, VnodeCount};
use tracing::{Instrument, debug, info, warn};
use transport::{Endpoint, Inbound, Limits, NodeTls, PeerIdentity, RequestError};

use crate::DaemonArgs;
use crate::clock::BootClock;
use crate::datadir::DataDir;
use crate::store::{SnapshotReader, Store, StoreHandle, StoreWorker};

/// How long a peer request (sync, leave notice) may take.
const PEER_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a node restarted without `--join` tries the peers it saved before starting alone.
const SAVED_PEERS_PATIENCE: Duration = Duration::from_secs(3);
/// How often a node that is alone asks its saved peers again.
const SAVED_PEERS_RETRY: Duration = Duration::from_secs(5);
/// How often the loop looks at the moves of the shards it leads, to log their start and end.
const MOVES_CHECK_EVERY: Duration = Duration::from_millis(250);
/// How often progress is logged while moves last (also whenever their number changes).
const MOVES_LOG_EVERY: Duration = Duration::from_secs(5);
/// The most inbound messages handled in one turn of the loop (datagrams first).
const INBOUND_BATCH: usize = 256;
/// The most client requests handled in one turn of the loop, after all node traffic.
const CLIENT_SLICE: usize = 64;
/// How many client requests may wait for the loop; beyond it new ones are refused at once
/// as overloaded (nothing applied), so queues never grow without bound and peers' protocol
/// traffic, handled first, never waits behind a client backlog.
const MAX_CLIENT_BACKLOG: usize = 1024;
/// The most client operations handed to the core and not answered yet; the rest wait in the
/// backlog. Every operation inside adds replication messages to the queues between nodes, and
/// acknowledgements wait in the same queues: with 800 pipelined writes in flight on 3 nodes
/// sharing 2 cores, acknowledgements took over `T_elect` (300 ms), leaders failed
/// check-quorum and stepped down, and 9–84 of a million writes ended `indeterminate`; with the
/// same writes waiting at the door instead, none did.
const MAX_CLIENT_OPS_IN_CORE: usize = 128;
/// How long a client request may wait for its shard's answer before it is forgotten.
const CLIENT_ANSWER_PATIENCE: Duration = Duration::from_secs(60);
/// How long a graceful leave waits for its notices to be acknowledged.
const LEAVE_GRACE: Duration = Duration::from_millis(1500);
/// A turn of the loop (one input handled, then everything it caused carried out) longer than
/// this is logged as a warning, at most once a second (with how many there were): while it
/// runs no heartbeat leaves and nothing is read, and a turn near the election timeout (300 ms)
/// costs leaderships.
const SLOW_TURN: Duration = Duration::from_millis(50);
/// The loop's timers running this much after their deadline is logged as a warning, at most
/// once a second: the thread was busy elsewhere (transport tasks share it) or not scheduled,
/// and a node whose heartbeat rounds run 300 ms late finds its shards' followers electing new
/// leaders.
const LATE_WAKE: Duration = Duration::from_millis(100);
/// Timers due this much before the loop gets to them wait for one batch of what arrived
/// meanwhile: a quarter heartbeat (the grid heartbeat rounds fall on), so a loop that merely
/// woke a little late keeps its timers first.
const READ_BEFORE_LATE_TIMERS: Duration = Duration::from_millis(25);

/// A queue with a fixed capacity that refuses, rather than grows, when full.
#[derive(Debug)]
struct Backlog<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Backlog<T> {
    fn new(capacity: usize) -> Self {
        Backlog {
            items: VecDeque::new(),
            capacity,
        }
    }

    /// Queues `item`, or gives it back when `capacity` items already wait.
    fn offer(&mut self, item: T) -> Result<(), T> {
        if self.items.len() >= self.capacity {
            return Err(item);
        }
        self.items.push_back(item);
        Ok(())
    }

    /// The oldest `at_most` items, in order.
    fn take(&mut self, at_most: usize) -> Vec<T> {
        let count = at_most.min(self.items.len());
        self.items.drain(..count).collect()
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// How many waiting client requests one turn may hand the core while `in_core` operations
/// it was handed are unanswered: a [`CLIENT_SLICE`], up to [`MAX_CLIENT_OPS_IN_CORE`] inside.
fn admissible_clients(in_core: usize) -> usize {
    CLIENT_SLICE.min(MAX_CLIENT_OPS_IN_CORE.saturating_sub(in_core))
}

/// Whether `message` is a request from a client (not a node) identity.
fn is_from_client(message: &Inbound) -> bool {
    matches!(
        message,
        Inbound::Request {
            from: PeerIdentity::Client,
            ..
        }
    )
}

/// Runs the daemon until SIGTERM/SIGINT (exit 0 after a graceful leave) or a fatal error.
pub(crate) async fn run(args: DaemonArgs) -> Result<ExitCode> {
    let Some(listen) = args.listen else {
        eprintln!("error: the daemon needs --listen ADDR (or SLOTRING_LISTEN); see node --help");
        return Ok(ExitCode::from(2));
    };
    let data_dir = DataDir::open(&args.data_dir)?;
    let stored = data_dir.node_id()?;
    let node_id = match (&args.node_id, &stored) {
        (Some(given), Some((stored, _))) if given != stored.as_str() => bail!(
            "the data dir {} belongs to node {stored}, not {given}",
            args.data_dir.display()
        ),
        (Some(given), _) => NodeId::new(given).context("--node-id")?,
        (None, Some((stored, _))) => stored.clone(),
        (None, None) => bail!(
            "no node id: pass --node-id (the data dir {} has none yet)",
            args.data_dir.display()
        ),
    };
    let generation = stored.map_or(1, |(_, generation)| generation + 1);
    data_dir.store_node(&node_id, generation)?;
    let opened = Store::open(
        &args.data_dir.join("shards.redb"),
        usize::try_from(args.store_cache)? << 20,
    )?;

    init_tracing(&node_id);
    let span = tracing::info_span!("node", id = %node_id);
    async move {
        let tls = NodeTls::load(&args.certs_dir, &node_id)?;
        let (endpoint, inbound) = Endpoint::bind(listen, tls, Limits::default())
            .with_context(|| format!("listening on {listen}"))?;
        let listen = endpoint.local_addr();
        let flags = SpecFlags::from(&args);
        let stored_spec = data_dir.spec()?;
        if let Some(spec) = &stored_spec {
            flags.check(spec, "the spec stored in the data dir")?;
        }
        let started = Instant::now();
        let clock = BootClock::start();
        let saved_peers = data_dir.peers()?;
        let rejoin = if args.join.is_empty() && stored_spec.is_some() && !saved_peers.is_empty() {
            // A restart without --join: try the peers this node last saw, briefly; if none
            // answers, start alone and wait to be found.
            let deadline = started + SAVED_PEERS_PATIENCE;
            match join(
                &endpoint,
                &saved_peers,
                &node_id,
                stored_spec.clone(),
                deadline,
            )
            .await
            {
                Ok(welcome) => Some(welcome),
                Err(JoinError::Silent(error)) => {
                    info!(%error, "no saved peer answered; starting alone");
                    None
                }
                Err(JoinError::Fatal(error)) => return Err(error),
            }
        } else {
            None
        };
        let mut bootstrapping = false;
        let (spec, welcome) = if args.join.is_empty() && rejoin.is_none() {
            let spec = match stored_spec {
                Some(spec) => spec,
                None => {
                    let spec = flags.bootstrap()?;
                    info!(%spec, "bootstrapping a new cluster");
                    bootstrapping = opened.shards.is_empty();
                    spec
                }
            };
            (spec, Vec::new())
        } else {
            let (spec, members) = match rejoin {
                Some(welcome) => welcome,
                None => {
                    let deadline = started + Duration::from_secs(args.join_timeout);
                    join(
                        &endpoint,
                        &args.join,
                        &node_id,
                        stored_spec.clone(),
                        deadline,
                    )
                    .await
                    .map_err(JoinError::into_inner)?
                }
            };
            flags.check(&spec, "the cluster")?;
            if let Some(stored) = &stored_spec
                && stored != &spec
            {
                bail!(
                    "refused: this data dir belongs to another cluster: {}",
                    stored
                        .differences("the data dir", "the cluster", &spec)
                        .join("; ")
                );
            }
            (spec, members)
        };
        data_dir.store_spec(&spec)?;
        let identity = Identity {
            node_id: node_id.clone(),
            addr: listen,
            generation,
            spec: spec.fingerprint(),
            meta: NodeMeta::new(opened.storage_id),
        };
        info!(%listen, generation, %spec, "node up");
        let seed = rand::random::<u64>();
        let mut config = cluster::Config::default();
        config.replica.max_moves = args.max_moves as usize;
        config.replica.move_bytes_per_sec = u64::from(args.max_move_rate) << 20;
        config.replica.lease_reads = args.danger_lease_reads;
        // With or without leases: this node may have run with them before this start.
        config.replica.restart_silence = config.replica.t_elect;
        config.replica.retired_grace = Duration::from_secs(args.retired_grace);
        if args.danger_lease_reads {
            warn!("lease reads on: reads are linearizable only while clocks keep rates within 1% of each other");
        }
        let mut core = Cluster::new(clock.now(), identity, spec, config, seed);
        let held = opened.shards.len();
        core.open_shards(clock.now(), opened.shards);
        if bootstrapping {
            core.bootstrap_shards(clock.now());
        }
        info!(held, bootstrapping, "shards opened");
        let store = StoreWorker::spawn(opened.store)?;
        let views = store.snapshot_reader()?;
        let mut node = NodeLoop::new(core, endpoint, clock, data_dir, store, views);
        if !welcome.is_empty() {
            node.core.join(node.now(), welcome);
        }
        node.run(inbound).await
    }
    .instrument(span)
    .await
}

fn init_tracing(node_id: &NodeId) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    debug!(%node_id, "logging");
}

/// The spec flags as given; only the first node uses them to create the spec, joiners check
/// them against the cluster's.
#[derive(Debug)]
struct SpecFlags {
    cluster_name: Option<String>,
    shards: Option<u32>,
    replication_factor: Option<u8>,
    vnodes: Option<u32>,
    placement: Option<Placement>,
}

impl From<&DaemonArgs> for SpecFlags {
    fn from(args: &DaemonArgs) -> Self {
        SpecFlags {
            cluster_name: args.cluster_name.clone(),
            shards: args.shards,
            replication_factor: args.replication_factor,
            vnodes: args.vnodes,
            placement: args.placement,
        }
    }
}

impl SpecFlags {
    fn bootstrap(&self) -> Result<ClusterSpec> {
        let table = TableSpec {
            shards: self
                .shards
                .map(ShardCount::new)
                .transpose()
                .context("--shards")?
                .unwrap_or_default(),
            replication_factor: self
                .replication_factor
                .map(ReplicationFactor::new)
                .transpose()
                .context("--replication-factor")?
                .unwrap_or_default(),
            placement: self.placement.unwrap_or_default(),
        };
        let vnodes = self
            .vnodes
            .map(VnodeCount::new)
            .transpose()
            .context("--vnodes")?
            .unwrap_or_default();
        let name = self.cluster_name.as_deref().unwrap_or("slotring");
        Ok(ClusterSpec::new(name, rand::random(), table, vnodes)?)
    }

    /// Fails when a given flag contradicts `spec`.
    fn check(&self, spec: &ClusterSpec, whose: &str) -> Result<()> {
        let mut problems = Vec::new();
        if let Some(name) = &self.cluster_name
            && name != &spec.cluster_name
        {
            problems.push(format!(
                "--cluster-name {name}, but {whose} is named {}",
                spec.cluster_name
            ));
        }
        if let Some(shards) = self.shards
            && shards != spec.table.shards.get()
        {
            problems.push(format!(
                "--shards {shards}, but {whose} has {} shards",
                spec.table.shards
            ));
        }
        if let Some(rf) = self.replication_factor
            && rf != spec.table.replication_factor.get()
        {
            problems.push(format!(
                "--replication-factor {rf}, but {whose} has replication factor {}",
                spec.table.replication_factor
            ));
        }
        if let Some(vnodes) = self.vnodes
            && vnodes != spec.vnodes.get()
        {
            problems.push(format!(
                "--vnodes {vnodes}, but {whose} has {} vnodes",
                spec.vnodes.get()
            ));
        }
        if let Some(placement) = self.placement
            && placement != spec.table.placement
        {
            problems.push(format!(
                "--placement {placement}, but {whose} uses {}",
                spec.table.placement
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("refused: cluster spec mismatch: {}", problems.join("; "))
        }
    }
}

/// Why a join failed.
#[derive(Debug)]
enum JoinError {
    /// Refused (another spec, another cluster, another CA) or a malformed answer: final.
    Fatal(anyhow::Error),
    /// No seed answered before the deadline.
    Silent(anyhow::Error),
}

impl JoinError {
    fn into_inner(self) -> anyhow::Error {
        match self {
            JoinError::Fatal(error) | JoinError::Silent(error) => error,
        }
    }
}

impl From<anyhow::Error> for JoinError {
    fn from(error: anyhow::Error) -> Self {
        JoinError::Fatal(error)
    }
}

/// Asks the seeds, in turn and with backoff, to let this node in. A refusal (another spec,
/// another cluster) or a refused handshake (another CA) is final; silence is retried until
/// `deadline`.
async fn join(
    endpoint: &Endpoint,
    seeds: &[std::net::SocketAddr],
    node_id: &NodeId,
    spec: Option<ClusterSpec>,
    deadline: Instant,
) -> Result<(ClusterSpec, Vec<WireMember>), JoinError> {
    let body = Bytes::from(wire::encode(&Request::Join {
        node_id: node_id.clone(),
        spec,
    }));
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut last_error = None;
        for seed in seeds {
            match endpoint
                .request(*seed, None, body.clone(), PEER_REQUEST_TIMEOUT)
                .await
            {
                Ok(answer) => match wire::decode::<Response>(&answer)
                    .map_err(anyhow::Error::from)?
                {
                    Response::Welcome { spec, members } => {
                        info!(%seed, members = members.len(), "welcomed");
                        return Ok((spec, members));
                    }
                    Response::Refused { reason } => {
                        return Err(anyhow::anyhow!("refused by {seed}: {reason}").into());
                    }
                    other => {
                        return Err(
                            anyhow::anyhow!("unexpected answer from {seed}: {other:?}").into()
                        );
                    }
                },
                Err(error @ RequestError::Handshake { .. }) => {
                    let error = anyhow::Error::from(error).context(format!(
                        "joining through {seed}: the seed refused this node's certificate (is it from another cluster's CA?)"
                    ));
                    return Err(error.into());
                }
                Err(error) => {
                    debug!(%seed, %error, "join attempt failed");
                    last_error = Some(format!("{seed}: {error}"));
                }
            }
        }
        if Instant::now() + backoff > deadline {
            return Err(JoinError::Silent(anyhow::anyhow!(
                "could not join through {} before the deadline; last error: {}",
                seeds
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                last_error.unwrap_or_default()
            )));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The loop: the only owner of the [`Cluster`] core.
struct NodeLoop {
    core: Cluster,
    endpoint: Endpoint,
    /// The core's clock.
    clock: BootClock,
    data_dir: DataDir,
    answers_tx: mpsc::UnboundedSender<(RequestId, Result<Response, String>)>,
    answers_rx: mpsc::UnboundedReceiver<(RequestId, Result<Response, String>)>,
    /// Leave notices in flight, during shutdown.
    leaving: Vec<tokio::task::JoinHandle<()>>,
    /// Peers saved in the data dir (kept equal to it by [`NodeLoop::save_peers`]), asked
    /// again while this node is alone: so nodes that all restarted at once, each starting
    /// alone, find each other, and a node that was cut off from the others, which all hold it
    /// down while it holds them down, is let back in.
    saved_peers: Vec<std::net::SocketAddr>,
    welcomes_tx: mpsc::UnboundedSender<Vec<WireMember>>,
    welcomes_rx: mpsc::UnboundedReceiver<Vec<WireMember>>,
    /// The storage thread: group commits go in, durable batch ids come out.
    store: StoreHandle,
    /// The snapshot view thread: leaders' reads of the disk for snapshot transfers (R6).
    views: SnapshotReader,
    /// Client requests waiting for their shard's answer, by token.
    clients: HashMap<u64, (Instant, transport::Responder)>,
    next_token: u64,
    /// Client requests received but not handed to the core yet: each turn of the loop handles
    /// node traffic first, then at most [`CLIENT_SLICE`] of these.
    client_backlog: Backlog<Inbound>,
    /// The moves this node leads, as last logged ([`NodeLoop::log_moves`]).
    moves_logged: MovesLogged,
}

/// What [`NodeLoop::log_moves`] last said.
#[derive(Debug, Default)]
struct MovesLogged {
    /// Shards moving then.
    moving: usize,
    /// When the current run of moves was first seen.
    since: Option<Instant>,
    /// When progress was last logged.
    at: Option<Instant>,
}

impl NodeLoop {
    fn new(
        core: Cluster,
        endpoint: Endpoint,
        clock: BootClock,
        data_dir: DataDir,
        store: StoreHandle,
        views: SnapshotReader,
    ) -> Self {
        let (answers_tx, answers_rx) = mpsc::unbounded_channel();
        let (welcomes_tx, welcomes_rx) = mpsc::unbounded_channel();
        let saved_peers = data_dir.peers().unwrap_or_default();
        NodeLoop {
            core,
            endpoint,
            clock,
            data_dir,
            answers_tx,
            answers_rx,
            leaving: Vec::new(),
            saved_peers,
            welcomes_tx,
            welcomes_rx,
            store,
            views,
            clients: HashMap::new(),
            next_token: 0,
            client_backlog: Backlog::new(MAX_CLIENT_BACKLOG),
            moves_logged: MovesLogged::default(),
        }
    }

    /// Logs the moves of the shards this node leads (the same figures as `node status`) as
    /// structured events: when moves start, every [`MOVES_LOG_EVERY`] while any lasts, and
    /// when the last one is done.
    fn log_moves(&mut self) {
        let moves = self.core.moves_led_here();
        let logged = &mut self.moves_logged;
        let now = Instant::now();
        if moves.is_empty() {
            if let Some(since) = logged.since.take() {
                info!(
                    took_ms = since.elapsed().as_millis() as u64,
                    "shard moves done: every shard this node leads has its target voters"
                );
            }
            logged.moving = 0;
            logged.at = None;
            return;
        }
        let due = logged
            .at
            .is_none_or(|at| now.duration_since(at) >= MOVES_LOG_EVERY);
        if !due && moves.len() == logged.moving {
            return;
        }
        let copied = CopyProgress::total(moves.iter().filter_map(|moving| moving.copied));
        let joining: BTreeSet<&str> = moves
            .iter()
            .flat_map(|moving| moving.joining.iter().map(String::as_str))
            .collect();
        let leaving: BTreeSet<&str> = moves
            .iter()
            .flat_map(|moving| moving.leaving.iter().map(String::as_str))
            .collect();
        info!(
            moving = moves.len(),
            joining = ?joining,
            leaving = ?leaving,
            max_lag = moves.iter().filter_map(|moving| moving.lag).max(),
            handoffs = moves.iter().filter(|moving| moving.handoff_to.is_some()).count(),
            snapshot_keys = copied.keys,
            snapshot_keys_total = copied.keys_total,
            snapshot_bytes = copied.bytes,
            snapshot_bytes_total = copied.bytes_total,
            "shard moves under way (shards this node leads)"
        );
        logged.since.get_or_insert(now);
        logged.moving = moves.len();
        logged.at = Some(now);
    }

    /// While no other member is alive, asks the saved peers to let this node in, in the
    /// background; a welcome comes back through `welcomes_rx`.
    fn retry_saved_peers(&self) {
        let me = self.core.identity().node_id.clone();
        let alone = self
            .core
            .members()
            .members
            .iter()
            .all(|member| member.id == me || member.state != "alive");
        if !alone || self.saved_peers.is_empty() {
            return;
        }
        let endpoint = self.endpoint.clone();
        let peers = self.saved_peers.clone();
        let spec = self.core.spec().clone();
        let welcomes = self.welcomes_tx.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + PEER_REQUEST_TIMEOUT;
            match join(&endpoint, &peers, &me, Some(spec), deadline).await {
                Ok((_, members)) => {
                    let _ = welcomes.send(members);
                }
                Err(error) => debug!(error = %error.into_inner(), "saved peers still silent"),
            }
        });
    }

    fn now(&self) -> Duration {
        self.clock.now()
    }

    async fn run(mut self, mut inbound: mpsc::Receiver<Inbound>) -> Result<ExitCode> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate =
            signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let mut retry = tokio::time::interval(SAVED_PEERS_RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        retry.tick().await;
        let mut moves = tokio::time::interval(MOVES_CHECK_EVERY);
        moves.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The turn in progress: when it started and what it handles; slow turns not yet
        // reported, and when the last report was.
        let mut turn: Option<(Instant, &'static str)> = None;
        let mut slow_turns = 0u64;
        let mut slow_reported: Option<Instant> = None;
        // Timers that fired over LATE_WAKE after their deadline, not yet reported.
        let mut late_wakes = 0u64;
        let mut late_reported: Option<Instant> = None;
        loop {
            // Timers first once they are due: the select below prefers every input to its
            // sleep, so under a steady stream of inbound messages the timers (heartbeat rounds
            // among them) waited 100-250 ms for a turn with nothing else ready, and followers
            // elected new leaders meanwhile.
            let now = self.now();
            if let Some(due) = self.core.poll_timeout().filter(|at| *at <= now) {
                if now.saturating_sub(due) > READ_BEFORE_LATE_TIMERS
                    && let Ok(message) = inbound.try_recv()
                {
                    // The thread was not scheduled, or a turn ran long: what peers sent
                    // meanwhile (acknowledgements, heartbeats) is heard before the timers judge
                    // them silent, or a stalled leader steps down by check-quorum and a
                    // stalled follower stands against a live leader.
                    turn.get_or_insert((Instant::now(), "inbound before late timers"));
                    self.take_inbound(message, &mut inbound);
                }
                let now = self.now();
                if now.saturating_sub(due) > LATE_WAKE {
                    late_wakes += 1;
                    if late_reported.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                        let ms =
                            u64::try_from(now.saturating_sub(due).as_millis()).unwrap_or(u64::MAX);
                        warn!(ms, late_wakes, "event loop ran its timers late");
                        late_reported = Some(Instant::now());
                        late_wakes = 0;
                    }
                }
                self.core.handle_timeout(now);
            }
            self.drain()?;
            if let Some((started, what)) = turn.take()
                && started.elapsed() > SLOW_TURN
            {
                slow_turns += 1;
                if slow_reported.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    warn!(ms, what, slow_turns, "slow event loop turn");
                    slow_reported = Some(Instant::now());
                    slow_turns = 0;
                }
            }
            let wake = self
                .core
                .poll_timeout()
                .map_or(self.now() + Duration::from_secs(1), |at| at);
            let sleep = tokio::time::sleep_until(self.clock.deadline(wake));
            tokio::select! {
                biased;
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
                _ = retry.tick() => {
                    turn = Some((Instant::now(), "retry"));
                    self.retry_saved_peers();
                    self.expire_clients();
                }
                _ = moves.tick() => {
                    turn = Some((Instant::now(), "moves"));
                    self.log_moves();
                    if self.core.drained() {
                        info!("decommissioned: no shard's config names this node any more");
                        break;
                    }
                }
                Some(members) = self.welcomes_rx.recv() => {
                    turn = Some((Instant::now(), "welcome"));
                    info!(members = members.len(), "a saved peer welcomed this node back");
                    let now = self.now();
                    self.core.join(now, members);
                }
                // Before inbound messages: the next group commit starts only once this one is
                // handled, and under a steady inbound stream a branch after it waited turns.
                durable = self.store.durable() => {
                    turn = Some((Instant::now(), "group commit"));
                    // R0: a failed commit aborts the node (its state may be half-written).
                    let batch = durable.context("committing a group of shard changes")?;
                    let now = self.now();
                    self.core.handle_persisted(now, batch);
                    // The others of the same flush, in this turn.
                    while let Some(batch) = self
                        .store
                        .try_durable()
                        .context("committing a group of shard changes")?
                    {
                        self.core.handle_persisted(now, batch);
                    }
                }
                Some(message) = inbound.recv() => {
                    turn = Some((Instant::now(), "inbound"));
                    self.take_inbound(message, &mut inbound);
                }
                Some((id, answer)) = self.answers_rx.recv() => {
                    turn = Some((Instant::now(), "peer answer"));
                    let now = self.now();
                    self.core.handle_response(now, id, answer);
                }
                Some((shard, reply)) = self.views.answer() => {
                    turn = Some((Instant::now(), "snapshot read"));
                    let now = self.now();
                    self.core.handle_snapshot_read(now, shard, reply);
                }
                () = sleep => {
                    // The timers run at the top of the next turn, where one that woke late is
                    // reported.
                    turn = Some((Instant::now(), "timers"));
                }
                () = std::future::ready(()), if self.can_serve_clients() => {
                    turn = Some((Instant::now(), "client backlog"));
                    self.serve_clients();
                }
            }
        }
        info!("leaving the cluster");
        let now = self.now();
        self.core.leave(now);
        self.drain()?;
        let notices = std::mem::take(&mut self.leaving);
        let _ = tokio::time::timeout(LEAVE_GRACE, async {
            for notice in notices {
                let _ = notice.await;
            }
        })
        .await;
        self.endpoint.close();
        let _ = tokio::time::timeout(Duration::from_millis(500), self.endpoint.wait_idle()).await;
        info!("left");
        Ok(ExitCode::SUCCESS)
    }

    /// Handles `first` and everything else that arrived meanwhile (up to [`INBOUND_BATCH`]),
    /// SWIM datagrams first (failure detection must not wait behind replication), then peers'
    /// requests; client requests join the backlog, served in slices after node traffic.
    fn take_inbound(&mut self, first: Inbound, inbound: &mut mpsc::Receiver<Inbound>) {
        let mut queued = vec![first];
        while queued.len() < INBOUND_BATCH
            && let Ok(message) = inbound.try_recv()
        {
            queued.push(message);
        }
        queued.sort_by_key(|message| !matches!(message, Inbound::Datagram { .. }));
        for message in queued {
            if is_from_client(&message) {
                self.queue_client(message);
            } else {
                self.handle_inbound(message);
            }
        }
        self.serve_clients();
    }

    /// Adds a client request to the backlog, or refuses it at once when the backlog is full.
    fn queue_client(&mut self, message: Inbound) {
        let Err(message) = self.client_backlog.offer(message) else {
            return;
        };
        if let Inbound::Request { responder, .. } = message {
            let refusal = Response::Overloaded {
                waiting: u32::try_from(self.client_backlog.len()).unwrap_or(u32::MAX),
            };
            if let Err(error) = responder.respond(Bytes::from(wire::encode(&refusal))) {
                debug!(%error, "overload refusal not sent");
            }
        }
    }

    /// Hands at most [`CLIENT_SLICE`] waiting client requests to the core, while fewer than
    /// [`MAX_CLIENT_OPS_IN_CORE`] wait for their answers there.
    fn serve_clients(&mut self) {
        let admitted = admissible_clients(self.clients.len());
        for message in self.client_backlog.take(admitted) {
            self.handle_inbound(message);
        }
    }

    /// Whether [`NodeLoop::serve_clients`] would hand the core anything now.
    fn can_serve_clients(&self) -> bool {
        !self.client_backlog.is_empty() && admissible_clients(self.clients.len()) > 0
    }

    fn handle_inbound(&mut self, message: Inbound) {
        let now = self.now();
        match message {
            Inbound::Datagram { from, payload, .. } => {
                if let Err(error) = self.core.handle_datagram(now, &from, &payload) {
                    debug!(%from, %error, "datagram dropped");
                }
            }
            Inbound::Message { from, body, .. } => match wire::decode::<Request>(&body) {
                Ok(request @ Request::Replicate(_)) => {
                    if let Response::Refused { reason } =
                        self.core.handle_request(now, Some(&from), request)
                    {
                        debug!(%from, %reason, "replication messages refused");
                    }
                }
                Ok(other) => debug!(%from, ?other, "only replication travels as a message"),
                Err(error) => debug!(%from, %error, "bad message"),
            },
            Inbound::Request {
                from,
                body,
                responder,
                ..
            } => {
                let peer = match &from {
                    PeerIdentity::Node(id) => Some(id),
                    PeerIdentity::Client => None,
                };
                let response = match wire::decode::<Request>(&body) {
                    Ok(Request::Client { op, route }) => {
                        let token = self.next_token;
                        self.next_token += 1;
                        match self.core.handle_client(now, token, op, route) {
                            Ok(()) => {
                                self.clients.insert(token, (Instant::now(), responder));
                                return;
                            }
                            Err(error) => Response::Refused {
                                reason: error.to_string(),
                            },
                        }
                    }
                    Ok(request) => self.core.handle_request(now, peer, request),
                    Err(error) => {
                        debug!(?from, %error, "bad request");
                        Response::Refused {
                            reason: format!("bad request: {error}"),
                        }
                    }
                };
                if let Err(error) = responder.respond(Bytes::from(wire::encode(&response))) {
                    debug!(?from, %error, "answer not sent");
                }
            }
        }
    }

    /// Forgets client requests nobody answered in time (their clients gave up long ago).
    fn expire_clients(&mut self) {
        self.clients
            .retain(|_, (since, _)| since.elapsed() < CLIENT_ANSWER_PATIENCE);
    }

    /// Remembers the live members' addresses, so a restart without `--join` finds them, and so
    /// does [`NodeLoop::retry_saved_peers`] while this node is alone.
    fn save_peers(&mut self) -> Result<()> {
        let me = self.core.identity().node_id.clone();
        let peers: Vec<std::net::SocketAddr> = self
            .core
            .members()
            .members
            .into_iter()
            .filter(|member| member.id != me && member.state == "alive")
            .map(|member| member.addr)
            .collect();
        if peers.is_empty() {
            return Ok(()); // Keep the last known peers: they may come back.
        }
        self.data_dir.store_peers(&peers)?;
        self.saved_peers = peers;
        Ok(())
    }

    /// Carries out everything the core asked for; never awaits a peer.
    fn drain(&mut self) -> Result<()> {
        while let Some(transmit) = self.core.poll_transmit() {
            match transmit {
                Transmit::Datagram { to, node, payload } => {
                    if let Err(error) = self.endpoint.send_datagram(to, &node, Bytes::from(payload))
                    {
                        debug!(%to, %error, "datagram not sent");
                    }
                }
                Transmit::Request {
                    id,
                    to,
                    node,
                    request,
                } => {
                    let endpoint = self.endpoint.clone();
                    let answers = self.answers_tx.clone();
                    let is_leave = matches!(request, Request::Leaving { .. });
                    let body = Bytes::from(wire::encode(&request));
                    let task = tokio::spawn(async move {
                        let answer = match endpoint
                            .request(to, Some(&node), body, PEER_REQUEST_TIMEOUT)
                            .await
                        {
                            Ok(bytes) => {
                                wire::decode::<Response>(&bytes).map_err(|e| e.to_string())
                            }
                            Err(error) => Err(error.to_string()),
                        };
                        let _ = answers.send((id, answer));
                    });
                    if is_leave {
                        self.leaving.push(task);
                    }
                }
                Transmit::Replicate { to, node, batch } => {
                    // One way: the peer's replicas answer with messages of their own.
                    let capacity = batch.encoded_len_hint();
                    let body = Bytes::from(wire::encode_with_capacity(
                        &Request::Replicate(batch),
                        capacity,
                    ));
                    if let Err(error) =
                        self.endpoint
                            .send_message(to, &node, body, PEER_REQUEST_TIMEOUT)
                    {
                        debug!(%node, %error, "replication messages not sent");
                    }
                }
                Transmit::Connect { to, node } => self.endpoint.connect_ahead(to, node),
                Transmit::Forget { to } => self.endpoint.forget(to),
            }
        }
        while let Some(persist) = self.core.poll_persist() {
            self.store.submit(persist)?;
        }
        while let Some((shard, read)) = self.core.poll_snapshot_read() {
            self.views.ask(shard, read)?;
        }
        while let Some((token, reply)) = self.core.poll_client_reply() {
            if let Some((_, responder)) = self.clients.remove(&token) {
                let answer = Bytes::from(wire::encode(&Response::Client(reply)));
                if let Err(error) = responder.respond(answer) {
                    debug!(%error, "client answer not sent");
                }
            }
        }
        while let Some(event) = self.core.poll_event() {
            match event {
                Event::MemberUp(member) => {
                    info!(member = %member.node_id, addr = %member.addr, generation = member.generation, "member up");
                }
                Event::MemberRenewed { before, after } => {
                    info!(member = %after.node_id, addr = %after.addr, generation = after.generation, previous_generation = before.generation, "member restarted");
                }
                Event::MemberDown(member) => {
                    warn!(member = %member.node_id, generation = member.generation, "member down");
                }
                Event::MemberLeft(member) => {
                    info!(member = %member.node_id, generation = member.generation, "member left");
                }
                Event::TableChanged {
                    digest,
                    members,
                    leaders_changed,
                } => {
                    info!(%digest, members, leaders_changed, "shard table changed");
                    self.save_peers()?;
                }
                Event::Renewed { generation } => {
                    warn!(
                        generation,
                        "the cluster declared this node down; rejoining with a new generation"
                    );
                    let node_id = self.core.identity().node_id.clone();
                    self.data_dir.store_node(&node_id, generation)?;
                }
                Event::Joined => info!("joined"),
                Event::Draining { generation } => {
                    info!(
                        generation,
                        "decommissioning: placement leaves this node out; its replicas move to the others, then it leaves"
                    );
                    let node_id = self.core.identity().node_id.clone();
                    self.data_dir.store_node(&node_id, generation)?;
                }
                Event::MoveStarted {
                    shard,
                    joining,
                    leaving,
                } => {
                    let joining: Vec<&str> = joining.iter().map(NodeId::as_str).collect();
                    let leaving: Vec<&str> = leaving.iter().map(NodeId::as_str).collect();
                    info!(shard, ?joining, ?leaving, "shard move started");
                }
                Event::MoveEnded { shard, done: true } => info!(shard, "shard move done"),
                Event::MoveEnded { shard, done: false } => {
                    info!(shard, "shard move left to the shard's next leader");
                }
                Event::CopyVerified { shard, outcome } => match outcome {
                    VerifyOutcome::Verified {
                        member,
                        index,
                        chunks,
                    } => info!(shard, member = %member.node, index, chunks, "shard copy verified"),
                    VerifyOutcome::Mismatch {
                        member,
                        index,
                        first_difference,
                    } => warn!(
                        shard,
                        member = %member.node,
                        index,
                        first_difference,
                        "shard copy differs from its leader's: removed, to be copied again"
                    ),
                    VerifyOutcome::Unverified { member } => {
                        warn!(shard, member = %member.node, "shard copy not verified: no answer");
                    }
                },
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> SpecFlags {
        SpecFlags {
            cluster_name: None,
            shards: None,
            replication_factor: None,
            vnodes: None,
            placement: None,
        }
    }

    #[test]
    fn a_full_backlog_refuses_and_hands_out_in_order() {
        let mut backlog = Backlog::new(3);
        for item in 0..3 {
            assert_eq!(backlog.offer(item), Ok(()));
        }
        assert_eq!(backlog.offer(3), Err(3), "the fourth is refused");
        assert_eq!(backlog.len(), 3);
        assert_eq!(backlog.take(2), vec![0, 1]);
        assert_eq!(backlog.offer(4), Ok(()), "room again after taking");
        assert_eq!(backlog.take(10), vec![2, 4]);
        assert!(backlog.is_empty());
    }

    /// A burst of client requests enters the core a slice per turn and never beyond the cap
    /// while none is answered; the rest wait in the backlog, and the overflow is refused.
    #[test]
    fn client_requests_enter_the_core_in_slices_up_to_the_cap() {
        let mut backlog = Backlog::new(MAX_CLIENT_BACKLOG);
        let burst = MAX_CLIENT_BACKLOG + 100;
        let refused = (0..burst)
            .filter(|request| backlog.offer(*request).is_err())
            .count();
        assert_eq!(refused, 100);
        let mut in_core = Vec::new();
        let mut per_turn = Vec::new();
        for _turn in 0..4 {
            let admitted = backlog.take(admissible_clients(in_core.len()));
            per_turn.push(admitted.len());
            in_core.extend(admitted);
        }
        assert_eq!(per_turn, [CLIENT_SLICE, CLIENT_SLICE, 0, 0]);
        assert_eq!(in_core.len(), MAX_CLIENT_OPS_IN_CORE);
        assert_eq!(
            in_core,
            (0..MAX_CLIENT_OPS_IN_CORE).collect::<Vec<_>>(),
            "in order"
        );
        // Answers make room for exactly as many.
        in_core.drain(..10);
        assert_eq!(admissible_clients(in_core.len()), 10);
        assert_eq!(admissible_clients(usize::MAX), 0);
    }

    #[test]
    fn bootstrap_uses_the_defaults_and_the_given_flags() {
        let spec = SpecFlags {
            shards: Some(512),
            vnodes: Some(64),
            ..flags()
        }
        .bootstrap()
        .unwrap();
        assert_eq!(spec.table.shards.get(), 512);
        assert_eq!(spec.vnodes.get(), 64);
        assert_eq!(spec.table.replication_factor.get(), 3);
        assert_eq!(spec.cluster_name, "slotring");
        assert!(
            SpecFlags {
                shards: Some(0),
                ..flags()
            }
            .bootstrap()
            .is_err()
        );
        assert!(
            SpecFlags {
                vnodes: Some(100_000),
                ..flags()
            }
            .bootstrap()
            .is_err()
        );
    }

    #[test]
    fn a_flag_contradicting_the_cluster_is_named_in_the_refusal() {
        let spec = flags().bootstrap().unwrap();
        assert!(flags().check(&spec, "the cluster").is_ok());
        let error = SpecFlags {
            shards: Some(512),
            replication_factor: Some(2),
            ..flags()
        }
        .check(&spec, "the cluster")
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--shards 512, but the cluster has 1024 shards"),
            "{error}"
        );
        assert!(error.contains("--replication-factor 2"), "{error}");
    }
}
