//! A deterministic in-memory network of [`Cluster`] cores on a virtual clock: datagrams take
//! 1–3 ms, requests are answered at once, nodes can crash, pause and resume. With
//! `SLOTRING_TRACE=1` every delivered SWIM packet (message and piggybacked updates) and every
//! `TurnUndead` sent is printed, with the sender's view.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use cluster::replica::{ClientReply, MemoryViews, StorageId};
use cluster::wire::{Request, Response};
use cluster::{Cluster, ClusterSpec, Config, Event, Identity, NodeMeta, Transmit};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use shardtable::TableSpec;
use topology::{NodeId, VnodeCount};

pub(crate) fn spec() -> ClusterSpec {
    ClusterSpec::new(
        "test",
        7,
        TableSpec::default(),
        VnodeCount::new(64).unwrap(),
    )
    .unwrap()
}

pub(crate) fn addr(index: usize) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 7000 + index as u16))
}

pub(crate) fn name(index: usize) -> NodeId {
    NodeId::new(&format!("n{index}")).unwrap()
}

struct InFlight {
    at: Duration,
    sequence: u64,
    from: usize,
    to: SocketAddr,
    payload: Payload,
}

/// What travels between nodes with a delay: SWIM datagrams and replication frames (both
/// one-way; requests with answers are delivered at once).
enum Payload {
    Datagram(Vec<u8>),
    Replicate(cluster::replica::PeerBatch),
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

pub(crate) struct Slot {
    pub(crate) core: Option<Cluster>,
    pub(crate) paused: bool,
    /// Datagrams that arrived while paused.
    pub(crate) held: Vec<(usize, Vec<u8>)>,
    pub(crate) events: Vec<(Duration, Event)>,
    pub(crate) generation: u64,
    /// Client answers, by token (persists are durable at once here).
    pub(crate) replies: Vec<(u64, ClientReply)>,
    /// Open snapshot views of the replicas' disk images (their durable state: persists are
    /// durable at once).
    views: MemoryViews,
}

pub(crate) struct Net {
    pub(crate) now: Duration,
    pub(crate) slots: Vec<Slot>,
    pub(crate) seed: u64,
    rng: StdRng,
    flights: BinaryHeap<Reverse<InFlight>>,
    sequence: u64,
    pub(crate) spec: ClusterSpec,
    /// Datagrams refused by a core, per receiver.
    pub(crate) refused: BTreeMap<usize, usize>,
    /// A partition: the nodes on this side and the others cannot reach each other (datagrams
    /// and requests between the sides are lost).
    pub(crate) cut: Option<Vec<usize>>,
    /// The config every node (re)started from now on gets.
    pub(crate) config: Config,
    /// Each datagram, node-to-node request and replication frame has a few of its bytes
    /// changed with this probability, in per-mille ([`mangle_bytes`]); a request or frame
    /// that no longer decodes is lost, as a node drops it.
    pub(crate) mangle_per_mille: u32,
}

impl Net {
    pub(crate) fn new(seed: u64) -> Self {
        Net {
            now: Duration::ZERO,
            slots: Vec::new(),
            seed,
            rng: StdRng::seed_from_u64(seed),
            flights: BinaryHeap::new(),
            sequence: 0,
            spec: spec(),
            refused: BTreeMap::new(),
            cut: None,
            config: Config::default(),
            mangle_per_mille: 0,
        }
    }

    /// Whether the partition (`cut`) separates nodes `a` and `b`.
    fn separated(&self, a: usize, b: usize) -> bool {
        self.cut
            .as_ref()
            .is_some_and(|side| side.contains(&a) != side.contains(&b))
    }

    fn identity(&self, index: usize, generation: u64, spec: &ClusterSpec) -> Identity {
        Identity {
            node_id: name(index),
            addr: addr(index),
            generation,
            spec: spec.fingerprint(),
            meta: NodeMeta::new(StorageId(1000 + index as u128)),
        }
    }

    /// Starts node `index` (a new slot or a restart with the next generation). With `seed_node`,
    /// it joins through it like the daemon does: a Join request, then `join` with the welcome.
    pub(crate) fn start(&mut self, index: usize, seed_node: Option<usize>) -> Result<(), String> {
        self.start_with_spec(index, seed_node, self.spec.clone())
    }

    pub(crate) fn start_with_spec(
        &mut self,
        index: usize,
        seed_node: Option<usize>,
        spec: ClusterSpec,
    ) -> Result<(), String> {
        while self.slots.len() <= index {
            self.slots.push(Slot {
                core: None,
                paused: false,
                held: Vec::new(),
                events: Vec::new(),
                generation: 0,
                replies: Vec::new(),
                views: MemoryViews::default(),
            });
        }
        let welcome = match seed_node {
            Some(seed) => {
                let request = Request::Join {
                    node_id: name(index),
                    spec: Some(spec.clone()),
                };
                let now = self.now;
                let seed_core = self.slots[seed].core.as_mut().ok_or("seed is down")?;
                match seed_core.handle_request(now, Some(&name(index)), request) {
                    Response::Welcome { members, .. } => Some(members),
                    Response::Refused { reason } => return Err(reason),
                    other => return Err(format!("{other:?}")),
                }
            }
            None => None,
        };
        self.slots[index].generation += 1;
        let generation = self.slots[index].generation;
        let identity = self.identity(index, generation, &spec);
        let node_seed = self
            .seed
            .wrapping_mul(1000)
            .wrapping_add(index as u64 * 7 + generation);
        let mut core = Cluster::new(self.now, identity, spec, self.config.clone(), node_seed);
        if let Some(members) = welcome {
            core.join(self.now, members);
        }
        let slot = &mut self.slots[index];
        slot.core = Some(core);
        slot.paused = false;
        slot.held.clear();
        self.flush(index);
        Ok(())
    }

    /// Node `index` creates every shard with itself as the only voter (a new cluster).
    pub(crate) fn bootstrap_shards(&mut self, index: usize) {
        let now = self.now;
        if let Some(core) = self.slots[index].core.as_mut() {
            core.bootstrap_shards(now);
        }
        self.flush(index);
    }

    /// A client operation at node `index`, answered in its slot's `replies` with `token`.
    pub(crate) fn client(&mut self, index: usize, token: u64, op: cluster::replica::ClientOp) {
        let now = self.now;
        if let Some(core) = self.slots[index].core.as_mut() {
            core.handle_client(now, token, op, cluster::replica::ClientRoute::Routed)
                .expect("a valid operation");
        }
        self.flush(index);
    }

    pub(crate) fn crash(&mut self, index: usize) {
        self.slots[index].core = None;
        self.slots[index].views = MemoryViews::default();
    }

    pub(crate) fn pause(&mut self, index: usize) {
        self.slots[index].paused = true;
    }

    pub(crate) fn resume(&mut self, index: usize) {
        self.slots[index].paused = false;
        let held = std::mem::take(&mut self.slots[index].held);
        let now = self.now;
        for (from, payload) in held {
            self.deliver(now, from, index, &payload);
        }
        if let Some(core) = self.slots[index].core.as_mut() {
            core.handle_timeout(now);
        }
        self.flush(index);
    }

    pub(crate) fn leave(&mut self, index: usize) {
        let now = self.now;
        if let Some(core) = self.slots[index].core.as_mut() {
            core.leave(now);
        }
        self.flush(index);
        self.slots[index].core = None;
    }

    /// Queues `payload` from node `from` to `to`, delivered 1–3 ms from now.
    fn send_later(&mut self, from: usize, to: SocketAddr, payload: Payload) {
        let delay = Duration::from_micros(self.rng.random_range(1000..3000));
        self.sequence += 1;
        self.flights.push(Reverse(InFlight {
            at: self.now + delay,
            sequence: self.sequence,
            from,
            to,
            payload,
        }));
    }

    fn index_of(&self, to: SocketAddr) -> Option<usize> {
        (0..self.slots.len()).find(|&i| addr(i) == to)
    }

    fn deliver(&mut self, now: Duration, from: usize, to: usize, payload: &[u8]) {
        let Some(core) = self.slots[to].core.as_mut() else {
            return;
        };
        let before = core.identity().generation;
        if std::env::var("SLOTRING_TRACE").is_ok() {
            use foca::Codec;
            if let Ok(header) =
                Codec::<Identity>::decode_header(&mut foca::PostcardCodec, &payload[1..])
            {
                let header: foca::Header<Identity> = header;
                eprintln!(
                    "{now:?} n{from}->n{to} {:?} src_inc={}",
                    header.message, header.src_incarnation
                );
                let mut rest = &payload[1..];
                let _ = Codec::<Identity>::decode_header(&mut foca::PostcardCodec, &mut rest);
                if rest.len() >= 2 {
                    let count = u16::from_be_bytes([rest[0], rest[1]]);
                    let mut buf = &rest[2..];
                    for _ in 0..count {
                        let member =
                            Codec::<Identity>::decode_member(&mut foca::PostcardCodec, &mut buf);
                        if let Ok(m) = member {
                            eprintln!(
                                "    update {} gen{} inc{} {:?}",
                                m.id().node_id,
                                m.id().generation,
                                m.incarnation(),
                                m.state()
                            );
                        }
                    }
                }
            }
        }
        if core.handle_datagram(now, &name(from), payload).is_err() {
            *self.refused.entry(to).or_default() += 1;
        }
        if self.slots[to]
            .core
            .as_ref()
            .is_some_and(|c| c.identity().generation != before)
        {
            eprintln!("{now:?} n{to} RENEWED after datagram from n{from}");
        }
        self.flush(to);
    }

    /// Carries out everything node `index` wants sent.
    fn flush(&mut self, index: usize) {
        loop {
            let now = self.now;
            let slot = &mut self.slots[index];
            let Some(core) = slot.core.as_mut() else {
                return;
            };
            while let Some(event) = core.poll_event() {
                slot.events.push((now, event));
            }
            while let Some(persist) = core.poll_persist() {
                core.handle_persisted(now, persist.batch);
            }
            while let Some((shard, read)) = core.poll_snapshot_read() {
                let disk = core
                    .shards()
                    .replica(shard)
                    .map(cluster::replica::ShardReplica::durable);
                if let Some(reply) = slot.views.answer(shard, disk, read) {
                    core.handle_snapshot_read(now, shard, reply);
                }
            }
            while let Some(reply) = core.poll_client_reply() {
                slot.replies.push(reply);
            }
            let Some(core) = self.slots[index].core.as_mut() else {
                return;
            };
            let Some(transmit) = core.poll_transmit() else {
                return;
            };
            match transmit {
                Transmit::Datagram { to, payload, .. } => {
                    if self
                        .index_of(to)
                        .is_some_and(|target| self.separated(index, target))
                    {
                        continue;
                    }
                    if std::env::var("SLOTRING_TRACE").is_ok() {
                        use foca::Codec;
                        if let Ok(header) = Codec::<Identity>::decode_header(
                            &mut foca::PostcardCodec,
                            &payload[1..],
                        ) && header.message == foca::Message::TurnUndead
                        {
                            {
                                let core = self.slots[index].core.as_ref().unwrap();
                                eprintln!(
                                    "{now:?} n{index} SENDS TurnUndead to {:?}; view {:?}",
                                    header.dst,
                                    core.members()
                                        .members
                                        .iter()
                                        .map(|m| (
                                            m.id.to_string(),
                                            m.generation,
                                            m.incarnation,
                                            m.state.clone()
                                        ))
                                        .collect::<Vec<_>>()
                                );
                            }
                        }
                    }
                    self.send_later(index, to, Payload::Datagram(payload));
                }
                Transmit::Request {
                    id, to, request, ..
                } => {
                    let request = self.maybe_mangle(request);
                    let answer = match (self.index_of(to), request) {
                        (Some(_), None) => Err("a frame that does not decode".to_owned()),
                        (Some(target), Some(request))
                            if self.slots[target].core.is_some()
                                && !self.slots[target].paused
                                && !self.separated(index, target) =>
                        {
                            let core = self.slots[target].core.as_mut().unwrap();
                            let answer = core.handle_request(now, Some(&name(index)), request);
                            self.flush(target);
                            self.maybe_mangle(answer)
                                .ok_or_else(|| "an answer that does not decode".to_owned())
                        }
                        _ => Err("unreachable".to_owned()),
                    };
                    if let Some(core) = self.slots[index].core.as_mut() {
                        core.handle_response(now, id, answer);
                    }
                }
                Transmit::Replicate { to, batch, .. } => {
                    self.send_later(index, to, Payload::Replicate(batch));
                }
                Transmit::Connect { .. } | Transmit::Forget { .. } => {}
            }
        }
    }

    /// `message` as the receiver decodes it after a few of its bytes changed in flight, with
    /// probability `mangle_per_mille`; `None` when it no longer decodes.
    fn maybe_mangle<T: serde::Serialize + serde::de::DeserializeOwned>(
        &mut self,
        message: T,
    ) -> Option<T> {
        // No draw without mangling: the other tests' seeds keep their runs.
        if self.mangle_per_mille == 0 || self.rng.random_range(0..1000) >= self.mangle_per_mille {
            return Some(message);
        }
        let mut bytes = cluster::wire::encode(&message);
        mangle_bytes(&mut bytes, &mut self.rng);
        cluster::wire::decode(&bytes).ok()
    }

    /// Runs the network until `until` (virtual time).
    pub(crate) fn run_until(&mut self, until: Duration) {
        loop {
            let next_flight = self.flights.peek().map(|Reverse(f)| f.at);
            let next_timer = self
                .slots
                .iter()
                .filter(|slot| !slot.paused)
                .filter_map(|slot| slot.core.as_ref()?.poll_timeout())
                .min();
            let next = match (next_flight, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => until,
            };
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            let now = self.now;
            // Network input first, then timers, like the node's biased loop.
            while self.flights.peek().is_some_and(|Reverse(f)| f.at <= now) {
                let Reverse(flight) = self.flights.pop().unwrap();
                let Some(to) = self.index_of(flight.to) else {
                    continue;
                };
                match flight.payload {
                    Payload::Datagram(payload) if self.slots[to].paused => {
                        self.slots[to].held.push((flight.from, payload));
                    }
                    Payload::Datagram(mut payload) => {
                        if self.mangle_per_mille > 0
                            && self.rng.random_range(0..1000) < self.mangle_per_mille
                        {
                            mangle_bytes(&mut payload, &mut self.rng);
                        }
                        self.deliver(now, flight.from, to, &payload);
                    }
                    // A frame to a paused or cut-off node is lost (its stream would break).
                    Payload::Replicate(batch) => {
                        let Some(batch) = self.maybe_mangle(batch) else {
                            continue;
                        };
                        if !self.slots[to].paused
                            && !self.separated(flight.from, to)
                            && let Some(core) = self.slots[to].core.as_mut()
                        {
                            core.handle_request(
                                now,
                                Some(&name(flight.from)),
                                Request::Replicate(batch),
                            );
                            self.flush(to);
                        }
                    }
                }
            }
            for index in 0..self.slots.len() {
                if self.slots[index].paused {
                    continue;
                }
                let Some(core) = self.slots[index].core.as_mut() else {
                    continue;
                };
                if core.poll_timeout().is_some_and(|at| at <= now) {
                    core.handle_timeout(now);
                    self.flush(index);
                }
            }
        }
    }

    pub(crate) fn core(&self, index: usize) -> &Cluster {
        self.slots[index].core.as_ref().expect("node is running")
    }

    pub(crate) fn live(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].core.is_some())
            .collect()
    }

    /// Members node `index` lists in `state`.
    pub(crate) fn listed(&self, index: usize, state: &str) -> Vec<String> {
        self.core(index)
            .members()
            .members
            .into_iter()
            .filter(|m| m.state == state)
            .map(|m| m.id.to_string())
            .collect()
    }

    pub(crate) fn replay_hint(&self, test: &str) -> String {
        format!(
            "seed {}: replay with SLOTRING_SEED={} cargo test -p cluster --test it {test}",
            self.seed, self.seed
        )
    }
}

/// The seeds a test runs: `SLOTRING_SEED` alone if set, else `0..count`.
/// Changes one to three of `bytes` (a bit flipped, or the byte set to 0, 0xff or a random
/// value): a frame corrupted in a way its length still allows, for tests that peer bytes never
/// panic a node.
pub(crate) fn mangle_bytes(bytes: &mut [u8], rng: &mut StdRng) {
    if bytes.is_empty() {
        return;
    }
    for _ in 0..rng.random_range(1..=3) {
        let at = rng.random_range(0..bytes.len());
        bytes[at] = match rng.random_range(0..4) {
            0 => bytes[at] ^ (1 << rng.random_range(0..8)),
            1 => 0,
            2 => 0xff,
            _ => rng.random(),
        };
    }
}

pub(crate) fn seeds(count: u64) -> Vec<u64> {
    match std::env::var("SLOTRING_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (0..count).collect(),
    }
}
