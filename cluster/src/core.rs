//! [`Cluster`]: one node's membership (SWIM through foca) and the shard table derived from it.

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::num::{NonZeroU8, NonZeroUsize};

use core::net::SocketAddr;

use foca::{Codec, Foca, Member, Message, NoCustomBroadcast, OwnedNotification, PostcardCodec};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use shardtable::{Placer, ShardId, ShardTable, TableDigest};
use topology::{NodeId, TokenRing};

use crate::Error;
use crate::identity::Identity;
use crate::replica::{ClientReply, MoveChange, PeerBatch, ReplicaConfig, ShardHost, VerifyOutcome};
use crate::spec::{ClusterSpec, SpecFingerprint};
use crate::timers::TimerQueue;
use crate::wire::{
    DATAGRAM_SWIM, HeldView, MAX_KEY_LEN, MemberView, MembersView, MoveView, NodeLoad, NodeRef,
    ReplicaView, Request, Response, RingShare, RingView, ShardForView, ShardInfoView, StatusView,
    WireMember,
};

/// Tuning of failure detection and convergence. Times are durations on the caller's clock.
///
/// The defaults detect a dead member on a LAN in well under a second: a member is probed about
/// every `probe_period`, suspected when neither it nor `num_indirect_probes` helpers answer
/// within the period, and declared down `suspect_to_down_after` later unless it refutes.
#[derive(Debug, Clone)]
pub struct Config {
    /// How often this node probes one member. Lower detects faster and costs more packets
    /// (each probe is a QUIC datagram and its ack, a few microseconds of CPU). Default 100 ms.
    pub probe_period: Duration,
    /// How long a direct probe waits for its ack before asking helpers; must be below
    /// `probe_period`. Default 50 ms (a LAN round trip is well under 1 ms).
    pub probe_rtt: Duration,
    /// How many members help probe an unresponsive one. Default 3.
    pub num_indirect_probes: NonZeroUsize,
    /// How long a suspect has to refute before it is declared down, at full local health
    /// (Lifeguard scales it up when this node itself is slow). Must exceed the longest pause a
    /// healthy member may take (GC, SIGSTOP) plus a gossip round. Default 500 ms.
    pub suspect_to_down_after: Duration,
    /// How many times each membership update is sent. foca's LAN default (4 at n = 10) loses
    /// updates; memberlist-like 10 is the floor here. Default 10.
    pub max_transmissions: NonZeroU8,
    /// How often updates are pushed to `gossip_fanout` random members besides probes.
    /// Default 100 ms.
    pub gossip_interval: Duration,
    /// How many members each gossip round reaches. Default 3.
    pub gossip_fanout: NonZeroUsize,
    /// How often this node compares digests with one random member and pulls the full
    /// membership on mismatch (anti-entropy). Default 1 s.
    pub sync_interval: Duration,
    /// The first retry delay of an unanswered join announcement; doubles up to
    /// `announce_backoff_max`. Default 200 ms.
    pub announce_backoff_min: Duration,
    /// The longest delay between join announcements. Default 5 s.
    pub announce_backoff_max: Duration,
    /// A timer delivered this much past its deadline means this node was stalled (paused,
    /// starved of CPU): its local health worsens, and the due timers wait `stall_grace` so the
    /// network input queued during the stall is handled first. Default 100 ms.
    pub stall_threshold: Duration,
    /// See `stall_threshold`. Default 50 ms.
    pub stall_grace: Duration,
    /// The worst local health score; the suspicion timeout is multiplied by `1 + score`.
    /// Default 4.
    pub max_health_score: u32,
    /// How long a down member is remembered (and listed). Default 1 h.
    pub remove_down_after: Duration,
    /// How often this node announces itself to one member it holds down, so that the two
    /// sides of a healed partition, each holding the other down, find each other again
    /// (nothing else talks to a down member). Default 1 s: one small datagram a second while
    /// any member is down.
    pub announce_to_down_interval: Duration,
    /// The largest SWIM packet; must fit a QUIC datagram (about 1,200 bytes). Default 1,100.
    pub max_packet_size: NonZeroUsize,
    /// The shard replicas' timing and sizes.
    pub replica: ReplicaConfig,
    /// The largest value a client may write. Default 1 MiB.
    pub max_value_len: usize,
}

impl Default for Config {
    fn default() -> Self {
        let nonzero = |n| NonZeroUsize::new(n).expect("constant is not zero");
        Config {
            probe_period: Duration::from_millis(100),
            probe_rtt: Duration::from_millis(50),
            num_indirect_probes: nonzero(3),
            suspect_to_down_after: Duration::from_millis(500),
            max_transmissions: NonZeroU8::new(10).expect("constant is not zero"),
            gossip_interval: Duration::from_millis(100),
            gossip_fanout: nonzero(3),
            sync_interval: Duration::from_secs(1),
            announce_backoff_min: Duration::from_millis(200),
            announce_backoff_max: Duration::from_secs(5),
            stall_threshold: Duration::from_millis(100),
            stall_grace: Duration::from_millis(50),
            max_health_score: 4,
            remove_down_after: Duration::from_secs(3600),
            announce_to_down_interval: Duration::from_secs(1),
            max_packet_size: nonzero(1100),
            replica: ReplicaConfig::default(),
            max_value_len: 1 << 20,
        }
    }
}

impl Config {
    fn foca_config(&self, health_multiplier: u32) -> foca::Config {
        foca::Config {
            probe_period: self.probe_period,
            probe_rtt: self.probe_rtt,
            num_indirect_probes: self.num_indirect_probes,
            max_transmissions: self.max_transmissions,
            suspect_to_down_after: self.suspect_to_down_after * health_multiplier,
            remove_down_after: Some(self.remove_down_after),
            max_packet_size: self.max_packet_size,
            notify_down_members: true,
            periodic_announce: Some(foca::PeriodicParams {
                frequency: Duration::from_secs(10),
                num_members: NonZeroUsize::MIN,
            }),
            periodic_announce_to_down_members: Some(foca::PeriodicParams {
                frequency: self.announce_to_down_interval,
                num_members: NonZeroUsize::MIN,
            }),
            periodic_gossip: Some(foca::PeriodicParams {
                frequency: self.gossip_interval,
                num_members: self.gossip_fanout,
            }),
        }
    }
}

/// Something the node must send or do on the network.
#[derive(Debug, Clone, PartialEq)]
pub enum Transmit {
    /// Send one datagram to a member.
    Datagram {
        /// Its address.
        to: SocketAddr,
        /// The node id its certificate must name.
        node: NodeId,
        /// The bytes, already framed.
        payload: Vec<u8>,
    },
    /// Send a request and hand the answer (or failure) back with [`Cluster::handle_response`].
    Request {
        /// Echo this in [`Cluster::handle_response`].
        id: RequestId,
        /// Where.
        to: SocketAddr,
        /// The node id its certificate must name.
        node: NodeId,
        /// What.
        request: Request,
    },
    /// Open a connection now, so the first probe does not wait for a handshake.
    Connect {
        /// Where.
        to: SocketAddr,
        /// The node id its certificate must name.
        node: NodeId,
    },
    /// Close the connection to a member that went down or left.
    Forget {
        /// Its address.
        to: SocketAddr,
    },
    /// Send shard replication messages to a member, as [`Request::Replicate`]; no answer is
    /// expected (the protocol tolerates loss).
    Replicate {
        /// Its address.
        to: SocketAddr,
        /// The node id its certificate must name.
        node: NodeId,
        /// The messages.
        batch: PeerBatch,
    },
}

/// Identifies a request this core asked the node to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// Something that happened, for logs, metrics and persistence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A member became active.
    MemberUp(Identity),
    /// A member was declared down.
    MemberDown(Identity),
    /// An active member came back as a new life (a restart, a new generation or address)
    /// without having been seen down. When the new life's liveness differs from the old
    /// one's, `MemberUp` or `MemberDown` reports it instead.
    MemberRenewed {
        /// The life it replaced.
        before: Identity,
        /// The new life.
        after: Identity,
    },
    /// A member left gracefully.
    MemberLeft(Identity),
    /// The shard table changed.
    TableChanged {
        /// The new digest.
        digest: TableDigest,
        /// Members on the ring.
        members: usize,
        /// Shards whose leader changed.
        leaders_changed: usize,
    },
    /// This node renewed its identity after the cluster declared it down; persist the
    /// generation so the next start goes higher still.
    Renewed {
        /// The new generation.
        generation: u64,
    },
    /// This node joined: at least one other member is active.
    Joined,
    /// This node is being decommissioned (`Cluster::decommission`): it renewed its identity
    /// to say so; persist the generation.
    Draining {
        /// The new generation.
        generation: u64,
    },
    /// A shard this node leads started moving: its voters are not placement's target.
    MoveStarted {
        /// The shard.
        shard: u16,
        /// Target members its config does not hold as voters yet.
        joining: Vec<NodeId>,
        /// Voters the target no longer names.
        leaving: Vec<NodeId>,
    },
    /// A shard stopped moving here: `done` when its voters are the target, else this node
    /// stopped leading it and the next leader carries the move on.
    MoveEnded {
        /// The shard.
        shard: u16,
        /// Whether the voters are the target.
        done: bool,
    },
    /// A copy this node's leader of `shard` promoted to voter (a moved copy) was compared with
    /// its own ([`VerifyOutcome`]): equal, differing (and removed, to be added again), or
    /// never answered.
    CopyVerified {
        /// The shard.
        shard: u16,
        /// What came of it.
        outcome: VerifyOutcome,
    },
}

/// Counters of dropped or odd input since the node started, for `node status` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    /// Datagrams that did not decode or that foca refused.
    pub bad_datagrams: u64,
    /// Datagrams whose sender did not match its certificate.
    pub identity_mismatches: u64,
    /// Datagrams from members with another spec.
    pub foreign_spec: u64,
    /// `TurnUndead` messages dropped because their target was not down (a foca trap).
    pub turn_undead_dropped: u64,
    /// Times this node found itself stalled.
    pub stalls: u64,
    /// Replication messages dropped for naming a shard the spec does not have.
    pub unknown_shard_messages: u64,
    /// Replication messages dropped as not well formed
    /// ([`Message::is_well_formed`](crate::replica::Message::is_well_formed)).
    pub malformed_replication_messages: u64,
}

#[derive(Debug, Default)]
struct Effects {
    sends: Vec<(Identity, Vec<u8>)>,
    timers: Vec<(foca::Timer<Identity>, Duration)>,
    notifications: Vec<OwnedNotification<Identity>>,
}

impl foca::Runtime<Identity> for Effects {
    fn notify(&mut self, notification: foca::Notification<'_, Identity>) {
        self.notifications.push(notification.to_owned());
    }

    fn send_to(&mut self, to: Identity, data: &[u8]) {
        self.sends.push((to, data.to_vec()));
    }

    fn submit_after(&mut self, event: foca::Timer<Identity>, after: Duration) {
        self.timers.push((event, after));
    }
}

#[derive(Debug)]
enum Pending {
    Digest { peer: Identity },
    Sync,
    Leaving,
}

/// One node's sans-IO cluster state: SWIM membership (foca), the cluster spec, and the
/// [`ShardTable`] recomputed on every membership change.
///
/// # Driving it
///
/// Feed inputs with `handle_*(now, ...)`, where `now` is a monotonic time from the caller's clock
/// (any origin). After every input, drain [`poll_transmit`](Self::poll_transmit) and
/// [`poll_event`](Self::poll_event), then sleep until [`poll_timeout`](Self::poll_timeout) and
/// call [`handle_timeout`](Self::handle_timeout). Request answers come back through
/// [`handle_response`](Self::handle_response); requests from peers go in through
/// [`handle_request`](Self::handle_request), which answers at once.
///
/// # What it deliberately does not do
///
/// No IO, no clock, no ambient randomness: randomness comes from the seed given to
/// [`Cluster::new`]. It does not decide who may write to a shard: the table it keeps is the
/// *placement* (the target); leadership with data is the replication protocol's business.
pub struct Cluster {
    config: Config,
    spec: ClusterSpec,
    fingerprint: SpecFingerprint,
    foca: Foca<Identity, PostcardCodec, StdRng, NoCustomBroadcast>,
    effects: Effects,
    timers: TimerQueue<foca::Timer<Identity>>,
    rng: StdRng,
    placer: Placer,
    ring: TokenRing,
    table: ShardTable,
    digest: TableDigest,
    /// Members that said they leave, with the generation that left.
    left: BTreeMap<NodeId, u64>,
    /// The life of each member SWIM last reported up (`MemberUp`, or a rename of an active
    /// life), until it reports that member down: tells a restart from a return.
    active_lives: BTreeMap<NodeId, Identity>,
    seeds: Vec<Identity>,
    joined: bool,
    next_announce: Option<Duration>,
    announce_backoff: Duration,
    next_sync: Duration,
    next_request: u64,
    pending: BTreeMap<RequestId, Pending>,
    leaving: bool,
    health_score: u32,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: Stats,
    /// Every shard replica this node holds.
    pub(crate) host: ShardHost,
    /// Client answers decided here without the host (`Moved` for a shard held elsewhere).
    pub(crate) client_replies: VecDeque<(u64, ClientReply)>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("identity", self.identity())
            .field("members", &self.ring.members())
            .field("digest", &self.digest)
            .field("joined", &self.joined)
            .field("leaving", &self.leaving)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A node that is alone until it joins (see [`join`](Self::join)). `identity.spec` must be
    /// `spec`'s fingerprint; `seed` drives every random choice.
    pub fn new(
        now: Duration,
        identity: Identity,
        spec: ClusterSpec,
        config: Config,
        seed: u64,
    ) -> Self {
        let fingerprint = spec.fingerprint();
        debug_assert_eq!(identity.spec, fingerprint);
        let foca = Foca::new(
            identity.clone(),
            config.foca_config(1),
            StdRng::seed_from_u64(seed),
            PostcardCodec,
        );
        let replica_config = ReplicaConfig {
            min_voters: usize::from(spec.table.replication_factor.get()),
            ..config.replica.clone()
        };
        let host = ShardHost::new(
            identity.node_id.clone(),
            identity.meta.storage,
            replica_config,
            seed ^ 0x0005_11a2_d000,
        );
        let placer = Placer::new(spec.table);
        let ring = TokenRing::from_members(spec.vnodes, [identity.node_id.clone()]);
        let table = placer.place(&ring);
        let digest = table.digest();
        let mut cluster = Cluster {
            next_sync: now + config.sync_interval,
            announce_backoff: config.announce_backoff_min,
            config,
            spec,
            fingerprint,
            foca,
            effects: Effects::default(),
            timers: TimerQueue::new(),
            rng: StdRng::seed_from_u64(seed ^ 0x5107_5107_5107_5107),
            placer,
            ring,
            table,
            digest,
            left: BTreeMap::new(),
            seeds: Vec::new(),
            active_lives: BTreeMap::new(),
            joined: false,
            next_announce: None,
            next_request: 0,
            pending: BTreeMap::new(),
            leaving: false,
            health_score: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            host,
            client_replies: VecDeque::new(),
        };
        // foca arms its periodic timers on the first input; an empty gossip round is one.
        let _ = cluster.foca.gossip(&mut cluster.effects);
        cluster.drain(now);
        cluster
    }

    /// Joins through `members` (as learned from a seed's welcome): applies them, announces to
    /// each, and keeps re-announcing with backoff until some member answers.
    pub fn join(&mut self, now: Duration, members: Vec<WireMember>) {
        let members: Vec<WireMember> = members
            .into_iter()
            .filter(|member| member.id().spec == self.fingerprint)
            .collect();
        self.seeds = members
            .iter()
            .filter(|member| member.state() != foca::State::Down)
            .map(|member| member.id().clone())
            .filter(|id| id.node_id != self.identity().node_id)
            .collect();
        if let Err(error) = self
            .foca
            .apply_many(members.into_iter(), true, &mut self.effects)
        {
            tracing::debug!(%error, "applying the welcome membership");
        }
        self.announce(now);
        self.drain(now);
    }

    fn announce(&mut self, now: Duration) {
        for seed in self.seeds.clone() {
            if let Err(error) = self.foca.announce(seed, &mut self.effects) {
                tracing::debug!(%error, "announce");
            }
        }
        self.next_announce = Some(now + self.announce_backoff);
        self.announce_backoff = (self.announce_backoff * 2).min(self.config.announce_backoff_max);
    }

    /// A datagram from the member whose certificate names `from`.
    pub fn handle_datagram(
        &mut self,
        now: Duration,
        from: &NodeId,
        datagram: &[u8],
    ) -> Result<(), Error> {
        let result = self.swim_datagram(from, datagram);
        match &result {
            Ok(()) => {}
            Err(Error::IdentityMismatch { .. }) => self.stats.identity_mismatches += 1,
            Err(Error::ForeignSpec { .. }) => self.stats.foreign_spec += 1,
            Err(_) => self.stats.bad_datagrams += 1,
        }
        self.drain(now);
        result
    }

    fn swim_datagram(&mut self, from: &NodeId, datagram: &[u8]) -> Result<(), Error> {
        let (&tag, packet) = datagram
            .split_first()
            .ok_or_else(|| Error::Decode("empty datagram".into()))?;
        if tag != DATAGRAM_SWIM {
            return Err(Error::UnknownDatagram(tag));
        }
        let header: foca::Header<Identity> = PostcardCodec
            .decode_header(packet)
            .map_err(|e| Error::Decode(e.to_string()))?;
        if &header.src.node_id != from {
            return Err(Error::IdentityMismatch {
                certificate: from.clone(),
                claimed: header.src.node_id,
            });
        }
        if header.src.spec != self.fingerprint {
            return Err(Error::ForeignSpec { node: from.clone() });
        }
        self.foca
            .handle_data(packet, &mut self.effects)
            .map_err(|e| Error::Swim(e.to_string()))
    }

    /// Delivers every timer due at `now`. Call it at [`poll_timeout`](Self::poll_timeout).
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.host.poll_timeout().is_some_and(|at| at <= now) {
            self.host.handle_timeout(now);
        }
        if let Some(first) = self.timers.next_deadline()
            && now.saturating_sub(first) > self.config.stall_threshold
        {
            // This node was stalled: what the network queued meanwhile (acks, refutations)
            // must be heard before the probes that waited for it time out.
            self.stats.stalls += 1;
            self.set_health(self.health_score + 1);
            self.timers.defer_due(now, now + self.config.stall_grace);
            tracing::debug!(late = ?now - first, "stalled; deferring due timers");
            return;
        }
        while let Some(timer) = self.timers.pop_due(now) {
            if matches!(timer, foca::Timer::ProbeRandomMember(_)) && self.health_score > 0 {
                self.set_health(self.health_score - 1);
            }
            if let Err(error) = self.foca.handle_timer(timer, &mut self.effects) {
                tracing::debug!(%error, "swim timer");
            }
            self.drain(now);
        }
        if !self.joined
            && let Some(at) = self.next_announce
            && now >= at
        {
            self.announce(now);
        }
        if now >= self.next_sync {
            self.next_sync = now + self.config.sync_interval;
            self.start_sync();
        }
        self.drain(now);
    }

    fn set_health(&mut self, score: u32) {
        let score = score.min(self.config.max_health_score);
        if score == self.health_score {
            return;
        }
        self.health_score = score;
        if let Err(error) = self.foca.set_config(self.config.foca_config(1 + score)) {
            tracing::debug!(%error, "scaling the suspicion timeout");
        }
    }

    fn start_sync(&mut self) {
        let peers: Vec<Identity> = self.foca.iter_members().map(|m| m.id().clone()).collect();
        if peers.is_empty() || self.leaving {
            return;
        }
        let peer = peers[self.rng.random_range(0..peers.len())].clone();
        let request = Request::Digest {
            table: *self.digest.as_bytes(),
            members: self.membership_digest(),
        };
        self.send_request(peer.clone(), request, Pending::Digest { peer });
    }

    fn send_request(&mut self, peer: Identity, request: Request, pending: Pending) {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        self.pending.insert(id, pending);
        self.transmits.push_back(Transmit::Request {
            id,
            to: peer.addr,
            node: peer.node_id,
            request,
        });
    }

    /// The answer to a request from [`Transmit::Request`], or why it failed.
    pub fn handle_response(
        &mut self,
        now: Duration,
        id: RequestId,
        response: Result<Response, String>,
    ) {
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        match (pending, response) {
            (Pending::Digest { peer }, Ok(Response::Digest { table, members })) => {
                if table != *self.digest.as_bytes() || members != self.membership_digest() {
                    let members = self.membership_snapshot();
                    self.send_request(peer, Request::Sync { members }, Pending::Sync);
                }
            }
            (Pending::Sync, Ok(Response::Sync { members })) => self.apply_members(members),
            (_, Err(error)) => tracing::debug!(%error, "request failed"),
            (_, Ok(_)) => {}
        }
        self.drain(now);
    }

    fn apply_members(&mut self, members: Vec<WireMember>) {
        let fingerprint = self.fingerprint;
        let updates = members
            .into_iter()
            .filter(move |member| member.id().spec == fingerprint);
        if let Err(error) = self.foca.apply_many(updates, true, &mut self.effects) {
            tracing::debug!(%error, "applying a membership sync");
        }
    }

    /// Answers a request from a peer node (`from` is its certificate's node id) or from the CLI
    /// (`from` is `None`).
    pub fn handle_request(
        &mut self,
        now: Duration,
        from: Option<&NodeId>,
        request: Request,
    ) -> Response {
        let response = self.answer(now, from, request);
        self.drain(now);
        response
    }

    fn answer(&mut self, now: Duration, from: Option<&NodeId>, request: Request) -> Response {
        let refuse = |reason: String| Response::Refused { reason };
        match request {
            Request::Join { node_id, spec } => {
                let Some(from) = from else {
                    return refuse("only nodes may join".into());
                };
                if &node_id != from {
                    return refuse(format!(
                        "certificate names {from} but the join claims {node_id}"
                    ));
                }
                if let Some(spec) = spec
                    && spec != self.spec
                {
                    let differences =
                        spec.differences("the joining node", "the cluster", &self.spec);
                    return refuse(format!("cluster spec mismatch: {}", differences.join("; ")));
                }
                Response::Welcome {
                    spec: self.spec.clone(),
                    members: self.membership_snapshot(),
                }
            }
            Request::Digest { .. } => Response::Digest {
                table: *self.digest.as_bytes(),
                members: self.membership_digest(),
            },
            Request::Sync { members } => {
                if from.is_none() {
                    return refuse("only nodes may sync".into());
                }
                self.apply_members(members);
                Response::Sync {
                    members: self.membership_snapshot(),
                }
            }
            Request::Leaving { identity } => {
                if from != Some(&identity.node_id) {
                    return refuse("a node may only announce its own leave".into());
                }
                self.left
                    .insert(identity.node_id.clone(), identity.generation);
                let already_down = self
                    .foca
                    .iter_membership_state()
                    .any(|m| m.id() == &identity && m.state() == foca::State::Down);
                if already_down {
                    // Gossip of its leave arrived first and was reported as down.
                    self.events.push_back(Event::MemberLeft(identity.clone()));
                }
                let down = Member::new(identity.clone(), foca::Incarnation::MAX, foca::State::Down);
                if let Err(error) =
                    self.foca
                        .apply_many([down].into_iter(), true, &mut self.effects)
                {
                    tracing::debug!(%error, "applying a leave");
                }
                Response::Ack
            }
            Request::ShardInfo { shard } => match self.shard_info(shard) {
                Ok(view) => Response::ShardInfo(view),
                Err(reason) => refuse(reason),
            },
            Request::ShardFor { key } => {
                if key.len() > MAX_KEY_LEN {
                    return refuse(format!(
                        "key is {} bytes; the limit is {MAX_KEY_LEN}",
                        key.len()
                    ));
                }
                let shard = self.table.shard_for(&key);
                // The actual leader as this node's replica knows it, else placement's.
                let actual = self
                    .host
                    .replica(shard.get())
                    .and_then(|replica| replica.leader_hint().cloned());
                let leader = actual
                    .or_else(|| {
                        self.table
                            .shard_info(shard)
                            .ok()
                            .and_then(|info| info.leader().cloned())
                    })
                    .map(|id| self.node_ref(&id));
                Response::ShardFor(ShardForView {
                    shard: shard.get(),
                    leader,
                })
            }
            Request::Members => Response::Members(self.members()),
            Request::ShardDigests { after } => {
                let (digests, next) = self.shard_digests(after, crate::wire::DIGEST_PAGE_SHARDS);
                Response::ShardDigests { digests, next }
            }
            Request::Replicate(batch) => {
                if from != Some(&batch.from.node) {
                    return refuse(
                        "replication messages only from the node that sends them".into(),
                    );
                }
                let mut batch = batch;
                let count = self.spec.table.shards.get();
                let before = batch.messages.len();
                // A shard the spec does not have is a corrupted frame's (or a bug's): a
                // leader's message would create its replica here (R6).
                batch
                    .messages
                    .retain(|(shard, _, _)| u32::from(*shard) < count);
                self.stats.unknown_shard_messages += (before - batch.messages.len()) as u64;
                self.host.handle_peer_batch(now, batch);
                let created = self.host.take_created();
                if !created.is_empty() {
                    // A leader created replicas here: give them their targets now.
                    self.refresh_targets_of(now, &created);
                }
                Response::Ack
            }
            Request::Client { .. } => {
                refuse("client operations go through Cluster::handle_client".into())
            }
            Request::Status => Response::Status(self.status()),
            Request::Ring => Response::Ring(self.ring_view()),
            Request::Decommission if from.is_some() => {
                refuse("only an operator (a client certificate) decommissions a node".into())
            }
            Request::Decommission => match self.decommission(now) {
                Ok(held) => Response::Decommissioning(held),
                Err(reason) => refuse(reason),
            },
        }
    }

    /// Starts a graceful leave: tells foca and every active member. Afterwards, drain
    /// transmits, wait (briefly) for the leave requests' answers, then stop.
    pub fn leave(&mut self, now: Duration) {
        if self.leaving {
            return;
        }
        self.leaving = true;
        let me = self.identity().clone();
        let peers: Vec<Identity> = self.foca.iter_members().map(|m| m.id().clone()).collect();
        for peer in peers {
            let request = Request::Leaving {
                identity: me.clone(),
            };
            self.send_request(peer, request, Pending::Leaving);
        }
        if let Err(error) = self.foca.leave_cluster(&mut self.effects) {
            tracing::debug!(%error, "leave");
        }
        self.drain(now);
    }

    /// Starts decommissioning this node (`node leave`): it renews its identity with
    /// `draining` set, so every node's placement leaves it out and the leaders move its
    /// replicas to the others (R5, one voter at a time, at most `max_moves` per leader). The
    /// node goes on serving meanwhile; once [`drained`](Self::drained), the shell calls
    /// [`leave`](Self::leave) and stops. Refused, changing nothing, when the other members
    /// would be fewer than the replication factor (the moves could never finish) or when the
    /// node is leaving already. Asking again while draining only reports progress.
    pub fn decommission(&mut self, now: Duration) -> Result<HeldView, String> {
        if self.leaving {
            return Err("this node is leaving already".into());
        }
        if self.draining() {
            return Ok(self.held());
        }
        let others = self
            .foca
            .iter_members()
            .filter(|member| member.id().spec == self.fingerprint && !member.id().meta.draining)
            .count();
        let factor = usize::from(self.spec.table.replication_factor.get());
        if others < factor {
            return Err(format!(
                "{others} other members would be left for a replication factor of {factor}: \
                 add a node first"
            ));
        }
        let mut draining = self.identity().clone();
        draining.meta.draining = true;
        draining.generation += 1;
        let generation = draining.generation;
        if let Err(error) = self.foca.change_identity(draining, &mut self.effects) {
            return Err(format!("renewing this node's identity: {error}"));
        }
        tracing::info!(
            generation,
            "draining: every replica moves to the other members"
        );
        self.events.push_back(Event::Draining { generation });
        self.refresh_table();
        self.refresh_targets(now);
        self.drain(now);
        Ok(self.held())
    }

    /// Whether this node is being decommissioned.
    pub fn draining(&self) -> bool {
        self.identity().meta.draining
    }

    /// Whether a draining node is done: no replica it holds is in its shard's config any more
    /// (each was removed and tombstoned, R8), so leaving loses nothing.
    pub fn drained(&self) -> bool {
        let me = self.identity().node_id.clone();
        self.draining()
            && self.host.replicas().all(|(_, replica)| {
                let config = replica.config();
                replica.durable().tombstone.is_some()
                    || !config
                        .voters
                        .iter()
                        .chain(&config.learners)
                        .any(|member| member.node == me)
            })
    }

    /// The next moment [`handle_timeout`](Self::handle_timeout) has work.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let mut next = self.next_sync;
        if let Some(timer) = self.timers.next_deadline() {
            next = next.min(timer);
        }
        if !self.joined
            && let Some(announce) = self.next_announce
        {
            next = next.min(announce);
        }
        if let Some(shards) = self.host.poll_timeout() {
            next = next.min(shards);
        }
        Some(next)
    }

    /// The next thing to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(transmit) = self.transmits.pop_front() {
            return Some(transmit);
        }
        while let Some((node, batch)) = self.host.poll_transmit() {
            match self.addr_of(&node) {
                Some(to) => return Some(Transmit::Replicate { to, node, batch }),
                None => tracing::debug!(%node, "replication messages for an unknown node dropped"),
            }
        }
        None
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        if let Some((shard, outcome)) = self.host.poll_verify() {
            return Some(Event::CopyVerified { shard, outcome });
        }
        match self.host.poll_move()? {
            MoveChange::Started { shard } => {
                let (joining, leaving) = match (
                    self.host.replica(shard),
                    self.table.shard_info(ShardId::new(shard)),
                ) {
                    (Some(replica), Ok(info)) => {
                        let target: Vec<NodeId> = info.replicas().cloned().collect();
                        config_change(replica.config(), &target)
                    }
                    _ => (Vec::new(), Vec::new()),
                };
                Some(Event::MoveStarted {
                    shard,
                    joining,
                    leaving,
                })
            }
            MoveChange::Ended { shard, done } => Some(Event::MoveEnded { shard, done }),
        }
    }

    /// This node's current identity.
    pub fn identity(&self) -> &Identity {
        self.foca.identity()
    }

    /// The cluster spec.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The shard table for the members currently active.
    pub fn table(&self) -> &ShardTable {
        &self.table
    }

    /// The table's digest.
    pub fn digest(&self) -> TableDigest {
        self.digest
    }

    /// Counters of dropped input.
    pub fn stats(&self) -> Stats {
        Stats {
            malformed_replication_messages: self.host.malformed_messages(),
            ..self.stats
        }
    }

    /// The local health score (0 is healthy); the suspicion timeout is scaled by `1 + score`.
    pub fn health_score(&self) -> u32 {
        self.health_score
    }

    /// Whether some other member has answered (or this node never had anyone to join).
    pub fn is_joined(&self) -> bool {
        self.joined
    }

    /// A digest of the active members and their generations: equal on two nodes exactly when
    /// they see the same live incarnations of the same members.
    pub fn membership_digest(&self) -> u64 {
        let mut active: Vec<(&NodeId, u64)> = self
            .foca
            .iter_members()
            .map(|m| (&m.id().node_id, m.id().generation))
            .collect();
        let me = self.foca.identity();
        if !self.leaving {
            active.push((&me.node_id, me.generation));
        }
        active.sort();
        let mut hasher = blake3::Hasher::new();
        for (node, generation) in active {
            hasher.update(&[node.as_bytes().len() as u8]);
            hasher.update(node.as_bytes());
            hasher.update(&generation.to_le_bytes());
        }
        let mut first = [0; 8];
        first.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
        u64::from_le_bytes(first)
    }

    fn membership_snapshot(&self) -> Vec<WireMember> {
        let mut members: Vec<WireMember> = self.foca.iter_membership_state().cloned().collect();
        if !self.leaving {
            members.push(Member::alive(self.identity().clone()));
        }
        members
    }

    fn drain(&mut self, now: Duration) {
        for (timer, after) in self.effects.timers.drain(..) {
            self.timers.push(now + after, timer);
        }
        let sends: Vec<(Identity, Vec<u8>)> = self.effects.sends.drain(..).collect();
        for (to, packet) in sends {
            if self.is_needless_turn_undead(&to, &packet) {
                self.stats.turn_undead_dropped += 1;
                continue;
            }
            let mut payload = Vec::with_capacity(packet.len() + 1);
            payload.push(DATAGRAM_SWIM);
            payload.extend_from_slice(&packet);
            self.transmits.push_back(Transmit::Datagram {
                to: to.addr,
                node: to.node_id,
                payload,
            });
        }
        let notifications: Vec<_> = self.effects.notifications.drain(..).collect();
        let changed = !notifications.is_empty();
        for notification in notifications {
            self.notice(notification);
        }
        self.refresh_table();
        if changed {
            self.refresh_targets(now);
        }
    }

    /// foca 2.0.0 sends `TurnUndead` when a suspicion timer expires even if the member refuted
    /// in time (`apply_existing_if` yields `Some` whether or not its condition held), and it
    /// answers a late packet of an old life with `TurnUndead` that reaches the new life at the
    /// same address. Both force a needless renewal: drop a `TurnUndead` whenever a member with
    /// that node id is active in our view. A member we really hold down is not active, so the
    /// message still goes out.
    fn is_needless_turn_undead(&self, to: &Identity, packet: &[u8]) -> bool {
        let Ok(header) = PostcardCodec.decode_header(packet) else {
            return false;
        };
        let header: foca::Header<Identity> = header;
        header.message == Message::TurnUndead
            && self
                .foca
                .iter_members()
                .any(|member| member.id().node_id == to.node_id)
    }

    fn notice(&mut self, notification: OwnedNotification<Identity>) {
        match notification {
            OwnedNotification::MemberUp(member) => {
                self.transmits.push_back(Transmit::Connect {
                    to: member.addr,
                    node: member.node_id.clone(),
                });
                if self.left.get(&member.node_id) >= Some(&member.generation) {
                    // An old announcement of a life that has since left.
                } else {
                    self.left.remove(&member.node_id);
                }
                self.active_lives
                    .insert(member.node_id.clone(), member.clone());
                self.events.push_back(Event::MemberUp(member));
            }
            OwnedNotification::MemberDown(member) => {
                self.active_lives.remove(&member.node_id);
                self.transmits
                    .push_back(Transmit::Forget { to: member.addr });
                if self.left.get(&member.node_id) == Some(&member.generation) {
                    self.events.push_back(Event::MemberLeft(member));
                } else {
                    self.events.push_back(Event::MemberDown(member));
                }
            }
            OwnedNotification::Rename(before, after) => {
                // A new life is a new process: the cached connection (same address or not)
                // belongs to the old one.
                if before.generation != after.generation || before.addr != after.addr {
                    self.transmits
                        .push_back(Transmit::Forget { to: before.addr });
                    self.transmits.push_back(Transmit::Connect {
                        to: after.addr,
                        node: after.node_id.clone(),
                    });
                }
                // foca follows a rename with `MemberUp` or `MemberDown` of the new life when its
                // liveness differs from the old one's. Otherwise both lives are active (a
                // restart nobody saw as down: worth a line of its own) or both are down
                // (nothing to say).
                let was_active = self.active_lives.get(&before.node_id) == Some(&before);
                let is_active = self.foca.iter_members().any(|member| member.id() == &after);
                if was_active && is_active {
                    self.active_lives
                        .insert(after.node_id.clone(), after.clone());
                    self.events
                        .push_back(Event::MemberRenewed { before, after });
                }
            }
            OwnedNotification::Active => {
                if !self.joined {
                    self.joined = true;
                    self.events.push_back(Event::Joined);
                }
            }
            OwnedNotification::Rejoin(me) => {
                self.events.push_back(Event::Renewed {
                    generation: me.generation,
                });
            }
            OwnedNotification::Idle | OwnedNotification::Defunct => {}
        }
    }

    /// Whether the ring's members are the active members [`refresh_table`](Self::refresh_table)
    /// would give it, found without allocating: this runs after every input, and replication
    /// traffic (most inputs) never changes membership. A member listed twice (two lives), or
    /// a ring of over [`Self::QUICK_CHECK_MEMBERS`], answers `false`, and the full comparison
    /// decides.
    fn ring_is_current(&self) -> bool {
        let ring = self.ring.members();
        if ring.len() > Self::QUICK_CHECK_MEMBERS {
            return false;
        }
        // One bit per ring member, set when an active member is it.
        let mut seen = [0u64; Self::QUICK_CHECK_MEMBERS / 64];
        let mut count = 0;
        for id in self.table_members() {
            let Ok(index) = ring.binary_search(&id.node_id) else {
                return false;
            };
            let (word, bit) = (index / 64, 1u64 << (index % 64));
            if seen[word] & bit != 0 {
                return false;
            }
            seen[word] |= bit;
            count += 1;
        }
        count == ring.len()
    }

    /// The largest ring [`ring_is_current`](Self::ring_is_current) checks by itself.
    const QUICK_CHECK_MEMBERS: usize = 1024;

    /// The identities the table is placed over: the active members with this node's spec
    /// (and this node unless it is leaving), draining ones left out unless every member drains
    /// (a table needs members).
    fn table_members(&self) -> impl Iterator<Item = &Identity> {
        let members = || {
            self.foca
                .iter_members()
                .map(Member::id)
                .filter(|id| id.spec == self.fingerprint)
                .chain((!self.leaving).then(|| self.foca.identity()))
        };
        let all_draining = members().all(|id| id.meta.draining);
        members().filter(move |id| all_draining || !id.meta.draining)
    }

    fn refresh_table(&mut self) {
        if self.ring_is_current() {
            return;
        }
        let active: BTreeSet<NodeId> = self.table_members().map(|id| id.node_id.clone()).collect();
        let current: BTreeSet<NodeId> = self.ring.members().iter().cloned().collect();
        if active == current {
            return;
        }
        for gone in current.difference(&active) {
            self.ring.remove(gone);
        }
        for new in active.difference(&current) {
            self.ring.insert(new.clone());
        }
        let table = self.placer.place(&self.ring);
        let leaders_changed = shardtable::diff(&self.table, &table)
            .map(|diff| diff.leaders_changed())
            .unwrap_or(0);
        self.table = table;
        self.digest = self.table.digest();
        self.events.push_back(Event::TableChanged {
            digest: self.digest,
            members: active.len(),
            leaders_changed,
        });
    }

    /// The largest value a client may write.
    pub(crate) fn max_value_len(&self) -> usize {
        self.config.max_value_len
    }

    /// The identities of the members foca holds active (this node excluded).
    pub(crate) fn active_identities(&self) -> Vec<Identity> {
        self.foca.iter_members().map(|m| m.id().clone()).collect()
    }

    /// The members foca holds down.
    pub(crate) fn down_members(&self) -> Vec<NodeId> {
        self.foca
            .iter_membership_state()
            .filter(|m| m.state() == foca::State::Down)
            .map(|m| m.id().node_id.clone())
            .collect()
    }

    fn addr_of(&self, node: &NodeId) -> Option<SocketAddr> {
        let me = self.foca.identity();
        if &me.node_id == node {
            return Some(me.addr);
        }
        self.foca
            .iter_membership_state()
            .filter(|member| &member.id().node_id == node)
            .max_by_key(|member| member.id().generation)
            .map(|member| member.id().addr)
    }

    fn node_ref(&self, node: &NodeId) -> NodeRef {
        NodeRef {
            id: node.clone(),
            addr: self.addr_of(node),
        }
    }

    /// Where `shard` lives; an error text for an operator when it does not exist.
    pub fn shard_info(&self, shard: u32) -> Result<ShardInfoView, String> {
        let count = self.spec.table.shards;
        let id = u16::try_from(shard)
            .ok()
            .map(ShardId::new)
            .filter(|id| count.check(*id).is_ok())
            .ok_or_else(|| {
                format!(
                    "shard {shard} does not exist: this cluster has {count} shards (0 to {})",
                    count.get() - 1
                )
            })?;
        let info = self
            .table
            .shard_info(id)
            .map_err(|error| error.to_string())?;
        // Only a replica knows the shard's actual config; a node without one says so rather
        // than present placement's wish as a leader and followers.
        let mut leader = None;
        let mut replicas: Vec<ReplicaView> = Vec::new();
        let mut state = if info.is_assigned() {
            "elsewhere"
        } else {
            "no-quorum"
        };
        let target: Vec<NodeId> = info.replicas().cloned().collect();
        let (mut epoch, mut commit) = (None, None);
        let (mut joining, mut leaving) = (Vec::new(), Vec::new());
        // A tombstoned replica (removed from the shard, its retired copy kept for the grace
        // period) knows nothing current: the node answers as one that holds no replica.
        let held = self
            .host
            .replica(id.get())
            .filter(|replica| replica.durable().tombstone.is_none());
        if let Some(replica) = held {
            // This node holds the shard: its replica's view of the actual config.
            let config = replica.config();
            let hint = replica.leader_hint();
            let me = &self.identity().node_id;
            let leads = hint == Some(me);
            let last = replica.durable().last().index;
            let view_of = |member: &crate::replica::Member, role: &str| {
                let index = if member.node == *me {
                    Some(replica.durable().applied)
                } else {
                    replica.matched(&member.node)
                };
                let lag = if leads && member.node != *me {
                    index.map(|index| last.saturating_sub(index))
                } else {
                    None
                };
                let copied = replica.snapshot_progress(&member.node);
                ReplicaView {
                    node: self.node_ref(&member.node),
                    role: role.to_owned(),
                    index,
                    lag,
                    copied,
                    pausing_writes: replica.writes_paused_for() == Some(&member.node),
                }
            };
            leader = hint.map(|node| self.node_ref(node));
            replicas = config
                .voters
                .iter()
                .map(|member| {
                    let role = if Some(&member.node) == hint {
                        "leader"
                    } else {
                        "follower"
                    };
                    view_of(member, role)
                })
                .chain(
                    config
                        .learners
                        .iter()
                        .map(|member| view_of(member, "learner")),
                )
                .collect();
            replicas.sort_by_key(|view| view.role != "leader");
            epoch = replica.durable().promised.as_ref().map(ToString::to_string);
            commit = Some(replica.commit());
            let (to, from) = config_change(config, &target);
            joining = to.iter().map(ToString::to_string).collect();
            leaving = from.iter().map(ToString::to_string).collect();
            state = if hint.is_none() {
                "no-quorum"
            } else if joining.is_empty() && leaving.is_empty() {
                "stable"
            } else {
                "migrating"
            };
        }
        Ok(ShardInfoView {
            shard: id.get(),
            state: state.to_owned(),
            leader,
            replicas,
            epoch,
            commit,
            target: target.iter().map(ToString::to_string).collect(),
            joining,
            leaving,
            digest: self.digest.to_string(),
        })
    }

    /// Every member this node knows, itself included, sorted by id.
    pub fn members(&self) -> MembersView {
        let mut latest: BTreeMap<NodeId, (Identity, foca::Incarnation, foca::State)> =
            BTreeMap::new();
        for member in self.foca.iter_membership_state() {
            let id = member.id();
            let newer = latest
                .get(&id.node_id)
                .is_none_or(|(known, _, _)| known.generation < id.generation);
            if newer {
                latest.insert(
                    id.node_id.clone(),
                    (id.clone(), member.incarnation(), member.state()),
                );
            }
        }
        let me = self.foca.identity();
        latest.insert(me.node_id.clone(), (me.clone(), 0, foca::State::Alive));
        let members = latest
            .into_values()
            .map(|(identity, incarnation, state)| {
                let left = if identity.node_id == me.node_id {
                    self.leaving
                } else {
                    self.left.get(&identity.node_id) >= Some(&identity.generation)
                };
                let state = match state {
                    _ if left => "left",
                    foca::State::Alive => "alive",
                    foca::State::Suspect => "suspect",
                    foca::State::Down => "down",
                };
                MemberView {
                    id: identity.node_id,
                    addr: identity.addr,
                    state: state.to_owned(),
                    generation: identity.generation,
                    incarnation,
                    draining: identity.meta.draining,
                }
            })
            .collect();
        MembersView {
            node: me.node_id.clone(),
            members,
        }
    }

    /// Every known member with the shards it leads and holds.
    pub fn status(&self) -> StatusView {
        let leads = self.table.leader_counts();
        let holds = self.table.membership_counts();
        let members = self.table.members();
        let nodes = self
            .members()
            .members
            .into_iter()
            .map(|member| {
                let index = members.binary_search(&member.id).ok();
                NodeLoad {
                    leads: index.map_or(0, |i| leads[i]),
                    replicates: index.map_or(0, |i| holds[i]),
                    member,
                }
            })
            .collect();
        let wanted = usize::from(self.spec.table.replication_factor.get()).min(members.len());
        let mut shards_under_replicated = 0;
        for info in self.table.iter() {
            let distinct: BTreeSet<&NodeId> = info.replicas().collect();
            shards_under_replicated += u32::from(distinct.len() < wanted);
        }
        StatusView {
            node: self.identity().node_id.clone(),
            spec: self.spec.clone(),
            digest: self.digest.to_string(),
            nodes,
            shards_under_replicated,
            moving: self.moves_led_here(),
            held: self.held(),
            stats: self.stats(),
        }
    }

    /// The shards this node leads whose voters are not placement's target, or whose leadership
    /// is still to pass to placement's leader, with how far each joining replica got
    /// (`status`'s `moving`).
    pub fn moves_led_here(&self) -> Vec<MoveView> {
        let me = &self.identity().node_id;
        let mut moves = Vec::new();
        for (shard, replica) in self.host.replicas() {
            if replica.leader_hint() != Some(me) {
                continue;
            }
            let Ok(info) = self.table.shard_info(ShardId::new(shard)) else {
                continue;
            };
            let target: Vec<NodeId> = info.replicas().cloned().collect();
            let (joining, leaving) = config_change(replica.config(), &target);
            let handoff_to = info
                .leader()
                .filter(|leader| *leader != me)
                .filter(|leader| replica.config().voters.iter().any(|v| &v.node == *leader))
                .map(ToString::to_string);
            if joining.is_empty() && leaving.is_empty() && handoff_to.is_none() {
                continue;
            }
            let last = replica.durable().last().index;
            let lag = joining
                .iter()
                .filter_map(|node| replica.matched(node))
                .map(|matched| last.saturating_sub(matched))
                .max();
            let copied = joining
                .iter()
                .filter_map(|node| replica.snapshot_progress(node))
                .reduce(std::ops::Add::add);
            moves.push(MoveView {
                shard,
                leader: me.clone(),
                joining: joining.iter().map(ToString::to_string).collect(),
                leaving: leaving.iter().map(ToString::to_string).collect(),
                lag,
                copied,
                writes_paused: replica.writes_paused_for().is_some(),
                handoff_to,
            });
        }
        moves
    }

    /// The share of the ring each member's tokens own.
    pub fn ring_view(&self) -> RingView {
        let mut shares: BTreeMap<&NodeId, (u32, u128)> = BTreeMap::new();
        let tokens: Vec<_> = self.ring.iter().collect();
        for (index, (token, node)) in tokens.iter().enumerate() {
            // A token owns the arc from its predecessor (exclusive) to itself (inclusive).
            let previous = if index == 0 {
                tokens[tokens.len() - 1].0
            } else {
                tokens[index - 1].0
            };
            let arc = if tokens.len() == 1 {
                1u128 << 64
            } else {
                u128::from(token.get().wrapping_sub(previous.get()))
            };
            let entry = shares.entry(node).or_default();
            entry.0 += 1;
            entry.1 += arc;
        }
        RingView {
            vnodes: self.spec.vnodes.get(),
            nodes: shares
                .into_iter()
                .map(|(node, (tokens, arc))| RingShare {
                    id: node.clone(),
                    tokens,
                    ownership: arc as f64 / (1u128 << 64) as f64 * 100.0,
                })
                .collect(),
        }
    }
}

/// How `config` must change to become `target`: the target members that are not voters yet
/// (joining), and the voters the target does not name (leaving), each in order.
fn config_change(config: &crate::replica::Config, target: &[NodeId]) -> (Vec<NodeId>, Vec<NodeId>) {
    let joining = target
        .iter()
        .filter(|node| !config.voters.iter().any(|voter| voter.node == **node))
        .cloned()
        .collect();
    let leaving = config
        .voters
        .iter()
        .filter(|voter| !target.contains(&voter.node))
        .map(|voter| voter.node.clone())
        .collect();
    (joining, leaving)
}
