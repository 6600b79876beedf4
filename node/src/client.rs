//! The client library the CLI (and `node bench`) use: one key operation at a time, sent to
//! the leader of the key's shard.
//!
//! Routing: the shard and its placement leader come from any node (`shard-for`), then every
//! `moved` answer is followed to the leader it names. After an `unavailable` answer (or a
//! `moved` that names no leader) the next attempt goes wherever the seed then says the shard
//! leads: the node asked may have lost its leadership, cut off from a majority that has
//! elected another leader it cannot name. Retries: an attempt the cluster answered with
//! `moved` or `unavailable` was never appended (PROTOCOL.md R10), one answered `superseded` was
//! appended but replaced at its index by another leader's entry, so it never applies, and a
//! request that never left this process was never seen, so all three are retried until the
//! deadline. A write that may
//! have reached a leader without a definite answer (a timeout, a closed connection, or
//! `indeterminate`) is *not* retried: it is reported as indeterminate, because it may yet
//! commit. Reads are always safe to retry.
//!
//! An attempt waits for its answer as long as the node shows it is alive: each attempt timeout
//! (one second for the CLI and the bench) that passes without the answer, it is given up unless
//! the node answered another request of this client meanwhile (a saturated leader, or one
//! holding a write through a handoff, gives its definite answer late; a write given up on is
//! indeterminate), and never past the operation's deadline.
//!
//! After a leader dies: a node that did not answer is *silent* for [`SILENT_FOR`]: no connection
//! could be made to it, or a request to it timed out and it answered no request in the attempt
//! timeout before (a node that answers others is alive, only slow with this one). The connection to
//! a node that timed out that way is closed, so the next request makes a new one and fails as "not
//! sent" rather than timing out again; a slow node's connection is kept, because closing it would
//! fail every other request in flight on it. The surviving replicas keep naming a dead leader until
//! they elect another, so while a node is silent the client does not send to it: it asks the
//! shard's other replicas in turn (from the seed's `shard-info`: replicas and target),
//! [`FAILOVER_POLL`] apart, and follows the first one that names a live leader or leads itself.
//! Meanwhile a liveness check (a `shard-for` of the empty key) is kept going to the silent node in
//! the background: a node that was only stalled is heard again as soon as it answers, one that is
//! dead stays silent.
//!
//! Clones share one routing cache (node addresses, the last leader seen for each shard, and,
//! once [`KvClient::learn_shard_count`] ran, the cluster's shard count, so a key's shard is
//! computed locally and a cached leader is asked directly, without a `shard-for` round trip
//! to the seed first). Without the shard count every operation asks the seed where its key
//! lives, as a single CLI call does.
//!
//! What it deliberately does not do: no connection pooling beyond the endpoint's cache, no
//! pipelining (a caller runs many operations concurrently with many clients), no
//! deduplication of retried writes (none is ever retried while it may still apply).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cluster::replica::{ClientOp, ClientReply, ClientRoute};
use cluster::wire::{self, Request, Response};
use shardtable::ShardCount;
use topology::NodeId;
use transport::Endpoint;

/// How long a node that did not answer a request is passed over in favour of the other
/// replicas of its shard: about the longest a failover takes (SWIM declares a dead member down
/// within about 0.8 s; a shard with traffic elects within `t_elect` plus a rank step and jitter,
/// about 0.5 s). A leader that was only slow is avoided for this long at most.
pub(crate) const SILENT_FOR: Duration = Duration::from_secs(1);

/// How long to wait before asking the next replica, while the replicas asked still name a
/// silent node as the leader: the granularity with which a new leader is found.
pub(crate) const FAILOVER_POLL: Duration = Duration::from_millis(20);

/// Why an operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KvError {
    /// The shard had no reachable leader with a majority before the deadline; the operation
    /// was not applied.
    #[error("unavailable: no quorum for shard {shard}")]
    Unavailable {
        /// The key's shard.
        shard: u16,
    },
    /// A write may or may not have been applied (its leader was lost before it answered).
    #[error("indeterminate: the write may or may not have been applied ({why})")]
    Indeterminate {
        /// What happened.
        why: String,
    },
    /// The shard's leader was overloaded until the deadline; the operation was not applied.
    #[error(
        "overloaded: shard {shard}'s leader had too many requests waiting; nothing was applied"
    )]
    Overloaded {
        /// The key's shard.
        shard: u16,
    },
    /// The node refused the request (a key or value over the limits, ...); nothing changed.
    #[error("refused: {0}")]
    Refused(String),
    /// The node this client asks first could not be reached.
    #[error("{0:#}")]
    Unreachable(anyhow::Error),
}

/// A client of one cluster, reached through `seed`. Clones share the endpoint and the routing
/// cache.
#[derive(Clone)]
pub(crate) struct KvClient {
    endpoint: Endpoint,
    seed: SocketAddr,
    /// The longest one attempt may wait.
    attempt_timeout: Duration,
    /// Shared by every clone; locked only between awaits, never across one.
    routes: Arc<Mutex<Routes>>,
}

/// What a client knows about where things are.
#[derive(Default)]
struct Routes {
    /// Where nodes listen, as the seed last said.
    addrs: HashMap<NodeId, SocketAddr>,
    /// The leader that last answered for each shard.
    leaders: HashMap<u16, SocketAddr>,
    /// The cluster's shard count, once learned: keys are then mapped to shards locally.
    shards: Option<ShardCount>,
    /// Nodes that did not answer a request, and when (see [`SILENT_FOR`]).
    silent: HashMap<SocketAddr, Instant>,
    /// When each node last answered a request.
    heard: HashMap<SocketAddr, Instant>,
    /// Silent nodes whose liveness check is in flight.
    checking: HashSet<SocketAddr>,
}

/// Why one operation was sent more than once: each count is one more attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Retries {
    /// Answered `moved`: another node leads the shard (a handoff, a failover, a stale route).
    pub(crate) moved: u32,
    /// Answered `unavailable`, or `moved` naming no leader (the shard had no leader to name),
    /// or a read whose leader lost its leadership before it answered.
    pub(crate) unavailable: u32,
    /// Answered `overloaded`: the node's backlog of client requests was full.
    pub(crate) overloaded: u32,
    /// Never delivered (no connection, or a read that timed out).
    pub(crate) unsent: u32,
    /// Answered `superseded`: a write appended by a leader that then lost its leadership, and
    /// replaced in the log by another entry, so never applied.
    pub(crate) superseded: u32,
}

impl Retries {
    /// Attempts beyond the first.
    pub(crate) fn total(&self) -> u32 {
        self.moved + self.unavailable + self.overloaded + self.unsent + self.superseded
    }
}

/// Where one operation goes when its leader is silent: the shard's other replicas, in turn.
#[derive(Default)]
struct Detour {
    /// The shard's replicas as the seed named them; `None` until first needed.
    replicas: Option<Vec<SocketAddr>>,
    /// How many times a replica was picked.
    turn: usize,
}

/// One operation's request, encoded at most once for each [`ClientRoute`] it is sent with
/// (the value may be a mebibyte).
struct AttemptBodies {
    request: Request,
    encoded: [Option<Bytes>; 2],
}

impl AttemptBodies {
    fn new(op: ClientOp) -> Self {
        AttemptBodies {
            request: Request::Client {
                op,
                route: ClientRoute::Routed,
            },
            encoded: [None, None],
        }
    }

    /// The request sent with `route`.
    fn get(&mut self, route: ClientRoute) -> Bytes {
        let slot = match route {
            ClientRoute::Routed => 0,
            ClientRoute::LeaderSilent => 1,
        };
        if let Request::Client { route: sent, .. } = &mut self.request {
            *sent = route;
        }
        let request = &self.request;
        self.encoded[slot]
            .get_or_insert_with(|| Bytes::from(wire::encode(request)))
            .clone()
    }
}

impl KvClient {
    pub(crate) fn new(endpoint: Endpoint, seed: SocketAddr, attempt_timeout: Duration) -> Self {
        KvClient {
            endpoint,
            seed,
            attempt_timeout,
            routes: Arc::new(Mutex::new(Routes::default())),
        }
    }

    fn routes(&self) -> MutexGuard<'_, Routes> {
        // A panic while holding the lock cannot leave the maps inconsistent (each update is
        // one insert or remove), so a poisoned lock is still usable.
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the seed for the cluster spec and keeps its shard count, so later operations map
    /// keys to shards locally. Returns the shard count.
    pub(crate) async fn learn_shard_count(&self, deadline: Instant) -> Result<ShardCount, KvError> {
        match self.ask_seed(&Request::Status, deadline).await? {
            Response::Status(view) => {
                let count = view.spec.table.shards;
                self.routes().shards = Some(count);
                Ok(count)
            }
            Response::Refused { reason } => Err(KvError::Refused(reason)),
            other => Err(KvError::Unreachable(anyhow::anyhow!(
                "unexpected answer from {}: {other:?}",
                self.seed
            ))),
        }
    }

    /// Asks the seed where `shard` leads and caches the answer (a warm-up for many clients).
    pub(crate) async fn learn_leader(&self, shard: u16, deadline: Instant) -> Result<(), KvError> {
        let request = Request::ShardInfo {
            shard: u32::from(shard),
        };
        let Response::ShardInfo(view) = self.ask_seed(&request, deadline).await? else {
            return Ok(());
        };
        if let Some(leader) = view.leader
            && let Some(addr) = leader.addr
        {
            let mut routes = self.routes();
            routes.addrs.insert(leader.id, addr);
            routes.leaders.entry(shard).or_insert(addr);
        } else if let Some(first) = view.target.first()
            && let Ok(node) = NodeId::new(first)
            && let Some(addr) = self.resolve(&node, deadline).await
        {
            // The seed holds no replica: placement's leader is the best first guess (a wrong
            // one answers `moved`).
            self.routes().leaders.entry(shard).or_insert(addr);
        }
        Ok(())
    }

    /// `addr` answered a request.
    fn answered(&self, addr: SocketAddr) {
        let mut routes = self.routes();
        routes.silent.remove(&addr);
        routes.heard.insert(addr, Instant::now());
    }

    /// A request sent to `addr` at `sent` failed with `error`. If that means the node is silent,
    /// remembers so and, after a timeout, closes the connection to it.
    fn unanswered(&self, addr: SocketAddr, sent: Instant, error: &transport::RequestError) {
        use transport::RequestError;
        let silent = match error {
            RequestError::Connect { .. } => true,
            RequestError::Timeout { .. } => {
                // Silent unless it answered another request since this one was sent.
                self.routes().heard.get(&addr).is_none_or(|at| *at <= sent)
            }
            _ => false,
        };
        if silent {
            self.routes().silent.insert(addr, Instant::now());
            if matches!(error, RequestError::Timeout { .. }) {
                self.endpoint.forget(addr);
            }
        }
    }

    /// Whether `addr` answered a request of this client (any clone) after `since`.
    fn heard_since(&self, addr: SocketAddr, since: Instant) -> bool {
        self.routes().heard.get(&addr).is_some_and(|at| *at > since)
    }

    /// Sends one attempt, `body`, to `target` at `sent` and waits for its answer while the node
    /// shows it is alive, until `deadline`: an attempt still unanswered after `attempt_timeout`
    /// is given up (a timeout) unless the node answered another request of this client within
    /// that time, and then it waits another `attempt_timeout`, and so on. A leader that is only
    /// slow (saturated, or holding a write through a handoff) thus gives its definite answer
    /// rather than leaving the write indeterminate, while a dead or stalled one is given up on
    /// after one `attempt_timeout`, as the failover needs. Records the node as answering or
    /// silent ([`Self::answered`], [`Self::unanswered`]).
    async fn attempt(
        &self,
        target: SocketAddr,
        body: Bytes,
        sent: Instant,
        deadline: Instant,
    ) -> Result<Bytes, transport::RequestError> {
        let mut window = sent;
        let answer = 'answer: {
            let remaining = deadline.saturating_duration_since(sent);
            if let Err(error) = self
                .endpoint
                .connect(target, None, remaining.min(self.attempt_timeout))
                .await
            {
                break 'answer Err(error);
            }
            let request = self.endpoint.request(
                target,
                None,
                body,
                deadline.saturating_duration_since(Instant::now()),
            );
            tokio::pin!(request);
            loop {
                let check = (window + self.attempt_timeout).min(deadline);
                tokio::select! {
                    answer = &mut request => break answer,
                    () = tokio::time::sleep_until(check.into()) => {
                        if check >= deadline || !self.heard_since(target, window) {
                            break Err(transport::RequestError::Timeout {
                                addr: target,
                                after: check.saturating_duration_since(sent),
                            });
                        }
                        window = check;
                    }
                }
            }
        };
        match &answer {
            Ok(_) => self.answered(target),
            Err(error) => self.unanswered(target, window, error),
        }
        answer
    }

    /// Starts a liveness check of silent `addr` in the background, unless one is in flight.
    fn check_silent(&self, addr: SocketAddr) {
        if !self.routes().checking.insert(addr) {
            return;
        }
        let client = self.clone();
        tokio::spawn(async move {
            let ping = Bytes::from(wire::encode(&Request::ShardFor { key: Vec::new() }));
            let sent = Instant::now();
            let answer = client
                .endpoint
                .request(addr, None, ping, client.attempt_timeout)
                .await;
            client.routes().checking.remove(&addr);
            match answer {
                Ok(_) => client.answered(addr),
                Err(error) => client.unanswered(addr, sent, &error),
            }
        });
    }

    /// Whether `addr` did not answer a request within the last [`SILENT_FOR`].
    fn is_silent(&self, addr: SocketAddr) -> bool {
        self.routes()
            .silent
            .get(&addr)
            .is_some_and(|since| since.elapsed() < SILENT_FOR)
    }

    /// `next`, unless it is silent: then another replica of `shard` that is not, in turn (or
    /// `next` after all, when there is none).
    async fn steer(
        &self,
        shard: u16,
        next: SocketAddr,
        detour: &mut Detour,
        deadline: Instant,
    ) -> SocketAddr {
        if !self.is_silent(next) {
            return next;
        }
        self.check_silent(next);
        if detour.replicas.is_none() {
            detour.replicas = Some(self.replicas(shard, deadline).await);
        }
        let others: Vec<SocketAddr> = detour
            .replicas
            .iter()
            .flatten()
            .copied()
            .filter(|addr| *addr != next && !self.is_silent(*addr))
            .collect();
        if others.is_empty() {
            return next;
        }
        detour.turn += 1;
        others[detour.turn % others.len()]
    }

    /// The key's shard and cached leader, when the shard count is known and a leader cached.
    fn cached_route(&self, key: &[u8]) -> Option<(u16, SocketAddr)> {
        let routes = self.routes();
        let shard = shardtable::shard_for(key, routes.shards?).get();
        routes.leaders.get(&shard).map(|leader| (shard, *leader))
    }

    /// Runs `op` until it succeeds, fails definitely, or `deadline` passes.
    pub(crate) async fn execute(
        &self,
        op: ClientOp,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, KvError> {
        let mut retries = Retries::default();
        self.execute_counted(op, deadline, &mut retries).await
    }

    /// [`KvClient::execute`], counting in `retries` why attempts were repeated.
    pub(crate) async fn execute_counted(
        &self,
        op: ClientOp,
        deadline: Instant,
        retries: &mut Retries,
    ) -> Result<Option<Vec<u8>>, KvError> {
        let key = match &op {
            ClientOp::Put { key, .. } | ClientOp::Get { key } | ClientOp::Del { key } => {
                key.clone()
            }
        };
        let write = !matches!(op, ClientOp::Get { .. });
        let (shard, target) = match self.cached_route(&key) {
            Some(route) => route,
            None => {
                let (shard, placement_leader) = self.route(&key, deadline).await?;
                let cached = self.routes().leaders.get(&shard).copied();
                (shard, cached.or(placement_leader).unwrap_or(self.seed))
            }
        };
        let mut detour = Detour::default();
        let steered = self.steer(shard, target, &mut detour, deadline).await;
        // Why the next attempt goes where it goes: a follower told that the leader did not
        // answer may stand without waiting out an idle leader's silence.
        let mut route = if steered == target {
            ClientRoute::Routed
        } else {
            ClientRoute::LeaderSilent
        };
        let mut target = steered;
        let mut bodies = AttemptBodies::new(op);
        let mut backoff = Duration::from_millis(10);
        let mut moves = 0;
        let mut overloaded = false;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(if overloaded {
                    KvError::Overloaded { shard }
                } else {
                    KvError::Unavailable { shard }
                });
            }
            let answer = self.attempt(target, bodies.get(route), now, deadline).await;
            let reply = match answer {
                Ok(bytes) => match wire::decode::<Response>(&bytes) {
                    Ok(Response::Client(reply)) => reply,
                    Ok(Response::Refused { reason }) => return Err(KvError::Refused(reason)),
                    Ok(Response::Overloaded { .. }) => {
                        // Not looked at: safe to send again, after a pause.
                        overloaded = true;
                        retries.overloaded += 1;
                        tokio::time::sleep(
                            backoff.min(deadline.saturating_duration_since(Instant::now())),
                        )
                        .await;
                        backoff = (backoff * 2).min(Duration::from_millis(200));
                        continue;
                    }
                    Ok(other) => {
                        return Err(KvError::Unreachable(anyhow::anyhow!(
                            "unexpected answer from {target}: {other:?}"
                        )));
                    }
                    Err(error) => {
                        return Err(KvError::Unreachable(
                            anyhow::Error::from(error)
                                .context(format!("decoding {target}'s answer")),
                        ));
                    }
                },
                Err(error) if write && !error.nothing_sent() => {
                    // The leader may be gone: ask again next time (after a timeout with no
                    // other answer from it, on a new connection: see `unanswered`).
                    self.routes().leaders.remove(&shard);
                    return Err(KvError::Indeterminate {
                        why: error.to_string(),
                    });
                }
                Err(error) => {
                    // Never delivered (or a read): ask again where the shard leads.
                    tracing::debug!(%target, %error, "attempt failed");
                    retries.unsent += 1;
                    self.routes().leaders.remove(&shard);
                    tokio::time::sleep(
                        backoff.min(deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                    let next = match self.route(&key, deadline).await {
                        Ok((_, Some(leader))) if leader != target => leader,
                        _ => self.seed,
                    };
                    target = self.steer(shard, next, &mut detour, deadline).await;
                    route = ClientRoute::LeaderSilent;
                    continue;
                }
            };
            match reply {
                ClientReply::Ok { value } => {
                    self.routes().leaders.insert(shard, target);
                    return Ok(value);
                }
                ClientReply::Moved {
                    leader: Some(leader),
                    ..
                } => {
                    moves += 1;
                    retries.moved += 1;
                    let named = self.resolve(&leader, deadline).await;
                    let steered = match named {
                        Some(addr) => Some(self.steer(shard, addr, &mut detour, deadline).await),
                        None => None,
                    };
                    match (named, steered) {
                        (Some(addr), Some(next)) if next != addr => {
                            // The node named did not answer us: most likely it failed and the
                            // replica asked has not seen a successor yet. Ask the next one.
                            tokio::time::sleep(
                                FAILOVER_POLL
                                    .min(deadline.saturating_duration_since(Instant::now())),
                            )
                            .await;
                            target = next;
                            route = ClientRoute::LeaderSilent;
                        }
                        (Some(addr), _) if addr != target && moves <= 3 => {
                            target = addr;
                            route = ClientRoute::Routed;
                        }
                        _ => {
                            // Bouncing between nodes whose views disagree: wait for them.
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_millis(200));
                            moves = 0;
                            if let Some(addr) = self.resolve(&leader, deadline).await {
                                target = addr;
                                route = ClientRoute::Routed;
                            }
                        }
                    }
                }
                never_applied @ (ClientReply::Moved { leader: None, .. }
                | ClientReply::Unavailable
                | ClientReply::Superseded) => {
                    // Never applied: never appended, or (`Superseded`) appended by a leader
                    // that lost its leadership and replaced at its index by the next leader's
                    // entry. The target knows no leader; the seed may know a newer one (a
                    // leader cut off from its peers steps down, and never hears whom the
                    // majority elected), so ask it again rather than the same target until the
                    // deadline.
                    if matches!(never_applied, ClientReply::Superseded) {
                        retries.superseded += 1;
                    } else {
                        retries.unavailable += 1;
                    }
                    self.routes().leaders.remove(&shard);
                    tokio::time::sleep(
                        backoff.min(deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                    if let Ok((_, Some(leader))) = self.route(&key, deadline).await {
                        target = leader;
                        route = ClientRoute::Routed;
                    }
                }
                ClientReply::Indeterminate if !write => retries.unavailable += 1,
                ClientReply::Indeterminate => {
                    return Err(KvError::Indeterminate {
                        why: format!("shard {shard}'s leader lost its leadership"),
                    });
                }
            }
        }
    }

    /// The key's shard and its placement leader's address, from the seed.
    async fn route(
        &self,
        key: &[u8],
        deadline: Instant,
    ) -> Result<(u16, Option<SocketAddr>), KvError> {
        let request = Request::ShardFor { key: key.to_vec() };
        match self.ask_seed(&request, deadline).await? {
            Response::ShardFor(view) => {
                let leader = view.leader.and_then(|leader| {
                    if let Some(addr) = leader.addr {
                        self.routes().addrs.insert(leader.id.clone(), addr);
                    }
                    leader.addr
                });
                Ok((view.shard, leader))
            }
            Response::Refused { reason } => Err(KvError::Refused(reason)),
            other => Err(KvError::Unreachable(anyhow::anyhow!(
                "unexpected answer from {}: {other:?}",
                self.seed
            ))),
        }
    }

    /// The addresses of `shard`'s replicas as the seed knows them: its replica's config when
    /// it holds the shard, else placement's, and in either case placement's target too (a
    /// node may hold a stale replica whose config names only itself); none if it does not
    /// answer.
    async fn replicas(&self, shard: u16, deadline: Instant) -> Vec<SocketAddr> {
        let request = Request::ShardInfo {
            shard: u32::from(shard),
        };
        let Ok(Response::ShardInfo(view)) = self.ask_seed(&request, deadline).await else {
            return Vec::new();
        };
        let mut addrs = Vec::new();
        for replica in view.replicas {
            if let Some(addr) = replica.node.addr {
                self.routes().addrs.insert(replica.node.id, addr);
                addrs.push(addr);
            }
        }
        for id in view.target {
            let Ok(node) = NodeId::new(&id) else {
                continue;
            };
            if let Some(addr) = self.resolve(&node, deadline).await
                && !addrs.contains(&addr)
            {
                addrs.push(addr);
            }
        }
        addrs
    }

    /// Where `node` listens, from the cache or the seed's membership list.
    async fn resolve(&self, node: &NodeId, deadline: Instant) -> Option<SocketAddr> {
        if let Some(addr) = self.routes().addrs.get(node) {
            return Some(*addr);
        }
        if let Ok(Response::Members(view)) = self.ask_seed(&Request::Members, deadline).await {
            let mut routes = self.routes();
            for member in view.members {
                routes.addrs.insert(member.id, member.addr);
            }
        }
        self.routes().addrs.get(node).copied()
    }

    async fn ask_seed(&self, request: &Request, deadline: Instant) -> Result<Response, KvError> {
        let timeout = deadline
            .saturating_duration_since(Instant::now())
            .min(self.attempt_timeout)
            .max(Duration::from_millis(1));
        let answer = self
            .endpoint
            .request(self.seed, None, Bytes::from(wire::encode(request)), timeout)
            .await
            .map_err(|error| {
                KvError::Unreachable(
                    anyhow::Error::from(error).context(format!("asking {}", self.seed)),
                )
            })?;
        self.answered(self.seed);
        wire::decode::<Response>(&answer).map_err(|error| {
            KvError::Unreachable(
                anyhow::Error::from(error).context(format!("decoding {}'s answer", self.seed)),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster::wire::{NodeRef, ShardForView};
    use tokio::sync::mpsc;
    use transport::{ClientTls, Inbound, Limits, NodeTls, pki};

    /// A node that says it leads every key's shard and answers its client operations from a
    /// script, one reply per attempt (then `unavailable`), counting the attempts it saw.
    struct ScriptedLeader {
        addr: SocketAddr,
        attempts: Arc<Mutex<Vec<ClientOp>>>,
        _endpoint: Endpoint,
        certs: tempfile::TempDir,
    }

    impl ScriptedLeader {
        fn start(script: Vec<ClientReply>) -> ScriptedLeader {
            Self::answering_after(Duration::ZERO, script)
        }

        /// A leader whose answers to client operations each take `delay`.
        fn answering_after(delay: Duration, script: Vec<ClientReply>) -> ScriptedLeader {
            let certs = tempfile::Builder::new()
                .prefix("slotring-client-")
                .tempdir()
                .expect("temp dir");
            let id = NodeId::new("n1").expect("node id");
            pki::init_cluster_ca(certs.path()).expect("ca");
            pki::issue_node_cert(certs.path(), &id).expect("node certificate");
            let tls = NodeTls::load(certs.path(), &id).expect("node tls");
            let (endpoint, inbound) = Endpoint::bind(
                SocketAddr::from(([127, 0, 0, 1], 0)),
                tls,
                Limits::default(),
            )
            .expect("bind");
            let addr = endpoint.local_addr();
            let attempts = Arc::new(Mutex::new(Vec::new()));
            tokio::spawn(Self::answer(
                inbound,
                id,
                addr,
                script,
                delay,
                attempts.clone(),
            ));
            ScriptedLeader {
                addr,
                attempts,
                _endpoint: endpoint,
                certs,
            }
        }

        async fn answer(
            mut inbound: mpsc::Receiver<Inbound>,
            id: NodeId,
            addr: SocketAddr,
            script: Vec<ClientReply>,
            delay: Duration,
            attempts: Arc<Mutex<Vec<ClientOp>>>,
        ) {
            let mut script = script.into_iter();
            while let Some(item) = inbound.recv().await {
                let Inbound::Request {
                    body, responder, ..
                } = item
                else {
                    continue;
                };
                let response = match wire::decode::<Request>(&body).expect("a request") {
                    Request::ShardFor { .. } => Response::ShardFor(ShardForView {
                        shard: 7,
                        leader: Some(NodeRef {
                            id: id.clone(),
                            addr: Some(addr),
                        }),
                    }),
                    Request::Client { op, .. } => {
                        attempts.lock().unwrap().push(op);
                        let reply = script.next().unwrap_or(ClientReply::Unavailable);
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            // The client may have given up and closed the connection.
                            let _ = responder
                                .respond(Bytes::from(wire::encode(&Response::Client(reply))));
                        });
                        continue;
                    }
                    other => panic!("unexpected request {other:?}"),
                };
                responder
                    .respond(Bytes::from(wire::encode(&response)))
                    .expect("respond");
            }
        }

        fn client(&self) -> KvClient {
            let tls = ClientTls::load(self.certs.path()).expect("client tls");
            let endpoint = Endpoint::client(tls, Limits::default()).expect("client endpoint");
            KvClient::new(endpoint, self.addr, Duration::from_secs(1))
        }

        fn attempts(&self) -> usize {
            self.attempts.lock().unwrap().len()
        }
    }

    fn put() -> ClientOp {
        ClientOp::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        }
    }

    /// What the client does with each answer: sends again what was never applied, reports
    /// what may have been, and retries reads whatever happened to them.
    #[tokio::test]
    async fn only_answers_that_prove_nothing_applied_make_a_write_go_again() {
        let ok = || ClientReply::Ok { value: None };
        let cases = [
            ("superseded write", put(), ClientReply::Superseded, true),
            ("unavailable write", put(), ClientReply::Unavailable, true),
            (
                "indeterminate write",
                put(),
                ClientReply::Indeterminate,
                false,
            ),
            (
                "indeterminate read",
                ClientOp::Get { key: b"k".to_vec() },
                ClientReply::Indeterminate,
                true,
            ),
        ];
        for (case, op, first, sent_again) in cases {
            let leader = ScriptedLeader::start(vec![first, ok()]);
            let mut retries = Retries::default();
            let deadline = Instant::now() + Duration::from_secs(10);
            let outcome = leader
                .client()
                .execute_counted(op, deadline, &mut retries)
                .await;
            if sent_again {
                assert!(outcome.is_ok(), "{case}: {outcome:?}");
                assert_eq!(leader.attempts(), 2, "{case}");
                assert_eq!(retries.total(), 1, "{case}: {retries:?}");
            } else {
                assert!(
                    matches!(outcome, Err(KvError::Indeterminate { .. })),
                    "{case}: {outcome:?}"
                );
                assert_eq!(leader.attempts(), 1, "{case}: never sent again");
            }
        }
    }

    /// A superseded attempt is counted as such, not as `unavailable`.
    #[tokio::test]
    async fn a_superseded_retry_is_counted_as_superseded() {
        let leader = ScriptedLeader::start(vec![
            ClientReply::Superseded,
            ClientReply::Superseded,
            ClientReply::Ok { value: None },
        ]);
        let mut retries = Retries::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let outcome = leader
            .client()
            .execute_counted(put(), deadline, &mut retries)
            .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(
            retries,
            Retries {
                superseded: 2,
                ..Retries::default()
            }
        );
    }

    /// A write whose leader answers slowly, 2.5 attempt timeouts late, is waited for while
    /// that leader answers other requests (it is alive): its definite answer counts, and it is
    /// sent once. With nothing else answered, the same write is given up after one attempt
    /// timeout and reported indeterminate, as a dead leader's would be.
    #[tokio::test]
    async fn a_slow_leader_that_answers_others_is_waited_for() {
        for others_answered in [true, false] {
            let leader = ScriptedLeader::answering_after(
                Duration::from_millis(2_500),
                vec![ClientReply::Ok { value: None }],
            );
            let client = leader.client();
            let deadline = Instant::now() + Duration::from_secs(10);
            let pings = others_answered.then(|| {
                let client = client.clone();
                tokio::spawn(async move {
                    let ping = Request::ShardFor { key: Vec::new() };
                    loop {
                        let _ = client.ask_seed(&ping, deadline).await;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                })
            });
            let started = Instant::now();
            let mut retries = Retries::default();
            let outcome = client.execute_counted(put(), deadline, &mut retries).await;
            let took = started.elapsed();
            if let Some(pings) = pings {
                pings.abort();
                assert!(outcome.is_ok(), "answering leader: {outcome:?}");
                assert!(took >= Duration::from_millis(2_500), "{took:?}");
            } else {
                assert!(
                    matches!(outcome, Err(KvError::Indeterminate { .. })),
                    "silent leader: {outcome:?}"
                );
                assert!(took < Duration::from_millis(2_000), "{took:?}");
            }
            assert_eq!(leader.attempts(), 1, "others answered: {others_answered}");
            assert_eq!(retries.total(), 0);
        }
    }

    /// Each attempt's request says the route it is sent with, whichever was encoded first.
    #[test]
    fn an_attempt_body_carries_its_route() {
        let op = ClientOp::Put {
            key: b"k".to_vec(),
            value: vec![7; 100],
        };
        let mut bodies = AttemptBodies::new(op.clone());
        for route in [
            ClientRoute::LeaderSilent,
            ClientRoute::Routed,
            ClientRoute::LeaderSilent,
        ] {
            let decoded = wire::decode::<Request>(&bodies.get(route)).unwrap();
            assert_eq!(
                decoded,
                Request::Client {
                    op: op.clone(),
                    route
                }
            );
        }
    }
}
