//! Several `ShardHost`s on a virtual clock: fsyncs take 4 ms, the network 0.2–1 ms, nodes can
//! crash and restart from what they persisted, links can be cut. The harness behind the
//! liveness figures; every failure prints its seed and the command that replays it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use cluster::replica::{
    ClientOp, ClientReply, ClientRoute, Config, Durable, HostBatchId, HostPersist, Member,
    MemoryViews, PeerBatch, ReplicaConfig, RequestTag, ShardHost, StorageId,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use topology::NodeId;

use crate::net::{mangle_bytes, name, seeds};

const FSYNC: Duration = Duration::from_millis(4);

pub(crate) fn member(index: usize) -> Member {
    Member {
        node: name(index),
        storage: StorageId(500 + index as u128),
    }
}

/// `value` replaced by an extreme or a near one: 0, 2^64 − 1 or 2^64 − 2, or off by a little.
fn extreme(value: &mut u64, rng: &mut StdRng) {
    *value = match rng.random_range(0..6) {
        0 => 0,
        1 => u64::MAX,
        2 => u64::MAX - 1,
        3 => value.wrapping_add(1),
        4 => value.wrapping_sub(1),
        _ => value.wrapping_add(rng.random_range(2..100)),
    };
}

/// A third of `batch`'s messages with one counter (a ballot number, an index, a round, a
/// chunk number) set by [`extreme`], values a frame's bytes rarely turn into; a snapshot
/// chunk may instead get its pairs out of order or repeated, or its `last` flipped, under a
/// digest that matches.
fn mangle_fields(batch: &mut PeerBatch, rng: &mut StdRng) {
    use cluster::replica::Message as M;
    for (_, _, m) in &mut batch.messages {
        if rng.random_range(0..3) != 0 {
            continue;
        }
        match m {
            M::Prepare {
                b, last, commit, ..
            } => match rng.random_range(0..3) {
                0 => extreme(&mut b.n, rng),
                1 => extreme(&mut last.index, rng),
                _ => extreme(commit, rng),
            },
            M::Promise { b, last, .. } => match rng.random_range(0..2) {
                0 => extreme(&mut b.n, rng),
                _ => extreme(&mut last.index, rng),
            },
            M::Reject { b, .. } => extreme(&mut b.n, rng),
            M::Append {
                b,
                prev,
                commit,
                hb_seq,
                ..
            } => match rng.random_range(0..4) {
                0 => extreme(&mut b.n, rng),
                1 => extreme(&mut prev.index, rng),
                2 => extreme(commit, rng),
                _ => extreme(hb_seq, rng),
            },
            M::AppendOk {
                b, matched, hb_seq, ..
            } => match rng.random_range(0..3) {
                0 => extreme(&mut b.n, rng),
                1 => extreme(matched, rng),
                _ => extreme(hb_seq, rng),
            },
            M::AppendNack { b, reason } => match rng.random_range(0..2) {
                0 => extreme(&mut b.n, rng),
                _ => {
                    let cluster::replica::NackReason::Conflict { last } = reason else {
                        continue;
                    };
                    extreme(last, rng);
                }
            },
            M::Verify { b, index } => match rng.random_range(0..2) {
                0 => extreme(&mut b.n, rng),
                _ => extreme(index, rng),
            },
            M::VerifyOk { b, index, .. } => match rng.random_range(0..2) {
                0 => extreme(&mut b.n, rng),
                _ => extreme(index, rng),
            },
            M::TimeoutNow { b } => extreme(&mut b.n, rng),
            M::Removed {
                b,
                config_pos,
                matched,
                ..
            } => match rng.random_range(0..3) {
                0 => extreme(&mut b.n, rng),
                1 => extreme(&mut config_pos.index, rng),
                _ => extreme(matched, rng),
            },
            M::RemovedOk { b } => extreme(&mut b.n, rng),
            M::Snapshot {
                b,
                base,
                config,
                seq,
                pairs,
                last,
                digest,
            } => {
                match rng.random_range(0..6) {
                    0 => extreme(&mut b.n, rng),
                    1 => extreme(seq, rng),
                    2 => extreme(&mut base.index, rng),
                    3 if pairs.len() >= 2 => {
                        let end = pairs.len() - 1;
                        pairs.swap(0, end);
                    }
                    4 if !pairs.is_empty() => pairs.push(pairs[0].clone()),
                    _ => *last = !*last,
                }
                // Half the time the digest matches the changed chunk, as a buggy leader's
                // would: its pairs out of order or repeated must not panic the installer.
                if rng.random_range(0..2) == 0 {
                    *digest =
                        cluster::replica::snapshot_digest(b, base, config, *seq, pairs, *last);
                }
            }
            M::SnapshotOk { b, base, next, .. } => match rng.random_range(0..3) {
                0 => extreme(&mut b.n, rng),
                1 => extreme(&mut base.index, rng),
                _ => extreme(next, rng),
            },
            M::PreVote { b, last } => match rng.random_range(0..2) {
                0 => extreme(&mut b.n, rng),
                _ => extreme(&mut last.index, rng),
            },
            _ => {}
        }
    }
}

/// `batch` as a corrupted frame brings it, half the time with a few of its encoded bytes
/// changed ([`mangle_bytes`]) and decoded again as the receiving node decodes it (`None` when
/// it no longer decodes; what does decode differs in a ballot, an index, a shard, a member, a
/// key or a value, or a length that still fits), half the time with counters set to extremes
/// ([`mangle_fields`]).
fn mangle(batch: &PeerBatch, rng: &mut StdRng) -> Option<PeerBatch> {
    if rng.random_range(0..2) == 0 {
        let mut batch = batch.clone();
        mangle_fields(&mut batch, rng);
        return Some(batch);
    }
    let mut bytes = cluster::wire::encode(batch);
    mangle_bytes(&mut bytes, rng);
    cluster::wire::decode(&bytes).ok()
}

/// What a node's disk holds, per shard.
type Disk = BTreeMap<u16, Durable>;

fn apply(disk: &mut Disk, persist: &HostPersist, initial: &BTreeMap<u16, Durable>) {
    for (shard, persist) in &persist.shards {
        let durable = disk
            .entry(*shard)
            .or_insert_with(|| initial.get(shard).cloned().unwrap_or_else(Durable::empty));
        for change in &persist.changes {
            durable.apply_change(change);
        }
    }
}

pub(crate) struct Cluster {
    pub(crate) now: Duration,
    pub(crate) hosts: Vec<Option<ShardHost>>,
    disks: Vec<Disk>,
    initial: Vec<BTreeMap<u16, Durable>>,
    /// Each node's outstanding group commits, oldest first, with when each is durable: a
    /// commit polled while a flush runs joins the next flush, as the node's log thread does.
    fsync_done: Vec<VecDeque<(Duration, HostPersist)>>,
    /// The most group commits any node had outstanding at once.
    pub(crate) most_in_flight: usize,
    flights: Vec<(Duration, usize, usize, PeerBatch)>,
    cut: BTreeSet<(usize, usize)>,
    /// Each message is lost with this probability, in per-mille.
    pub(crate) loss_per_mille: u32,
    rng: StdRng,
    pub(crate) replies: BTreeMap<RequestTag, ClientReply>,
    pub(crate) seed: u64,
    shards: u16,
    config: ReplicaConfig,
    /// Changes each replication frame just before delivery (corruption in flight).
    pub(crate) tamper: Option<fn(&mut PeerBatch)>,
    /// Each frame has a few of its encoded bytes changed with this probability, in per-mille,
    /// and is decoded again as the receiving node would ([`mangle`]).
    pub(crate) mangle_per_mille: u32,
    /// Mangled frames that still decoded, and were delivered.
    pub(crate) mangled_delivered: usize,
    /// When set, the largest encoded frame sent so far.
    pub(crate) largest_frame: Option<usize>,
    /// Snapshot chunks delivered to each host.
    pub(crate) chunks_to: Vec<usize>,
    /// Each host's open snapshot views of its disk image.
    views: Vec<MemoryViews>,
}

impl Cluster {
    /// `nodes` hosts holding `shards` shards, each replicated on 3 consecutive nodes.
    pub(crate) fn new(nodes: usize, shards: u16, seed: u64) -> Self {
        Self::with_config(nodes, shards, seed, ReplicaConfig::default())
    }

    /// Like [`new`](Self::new), with the replicas' knobs.
    pub(crate) fn with_config(nodes: usize, shards: u16, seed: u64, config: ReplicaConfig) -> Self {
        let mut initial = vec![BTreeMap::new(); nodes];
        for shard in 0..shards {
            let first = shard as usize % nodes;
            let voters: Vec<Member> = (0..3).map(|k| member((first + k) % nodes)).collect();
            let config = Config {
                voters: voters.clone(),
                learners: Vec::new(),
            };
            for voter in &voters {
                let index = (0..nodes).find(|&i| member(i) == *voter).unwrap();
                initial[index].insert(shard, Durable::bootstrap(config.clone()));
            }
        }
        let mut cluster = Cluster {
            now: Duration::ZERO,
            hosts: (0..nodes).map(|_| None).collect(),
            disks: vec![BTreeMap::new(); nodes],
            initial,
            fsync_done: vec![VecDeque::new(); nodes],
            most_in_flight: 0,
            flights: Vec::new(),
            cut: BTreeSet::new(),
            loss_per_mille: 0,
            rng: StdRng::seed_from_u64(seed),
            replies: BTreeMap::new(),
            seed,
            shards,
            config,
            tamper: None,
            mangle_per_mille: 0,
            mangled_delivered: 0,
            largest_frame: None,
            chunks_to: vec![0; nodes],
            views: vec![MemoryViews::default(); nodes],
        };
        for index in 0..nodes {
            cluster.start(index);
        }
        cluster
    }

    pub(crate) fn replay(&self, test: &str) -> String {
        format!(
            "seed {0}: replay with SLOTRING_SEED={0} cargo test -p cluster --test it {test}",
            self.seed
        )
    }

    /// Starts host `index` from its disk (or its bootstrap state).
    pub(crate) fn start(&mut self, index: usize) {
        let seed = self
            .seed
            .wrapping_mul(7919)
            .wrapping_add(index as u64 + self.now.as_nanos() as u64);
        let mut host = ShardHost::new(
            name(index),
            member(index).storage,
            self.config.clone(),
            seed,
        );
        let mut shards: BTreeMap<u16, Durable> = self.initial[index].clone();
        for (shard, durable) in &self.disks[index] {
            shards.insert(*shard, durable.clone());
        }
        for (shard, durable) in shards {
            host.open_shard(self.now, shard, durable);
        }
        self.hosts[index] = Some(host);
        self.fsync_done[index].clear();
        self.pump(index);
    }

    pub(crate) fn crash(&mut self, index: usize) {
        self.hosts[index] = None;
        self.fsync_done[index].clear();
        self.views[index] = MemoryViews::default();
    }

    pub(crate) fn isolate(&mut self, index: usize) {
        for other in 0..self.hosts.len() {
            self.cut.insert((index, other));
            self.cut.insert((other, index));
        }
    }

    /// Tells every running host that `dead` are down, as converged SWIM views would.
    pub(crate) fn set_views(&mut self, dead: &BTreeSet<NodeId>) {
        for index in 0..self.hosts.len() {
            if let Some(host) = self.hosts[index].as_mut() {
                host.handle_view(self.now, dead);
                self.pump(index);
            }
        }
    }

    pub(crate) fn heal(&mut self) {
        self.cut.clear();
    }

    pub(crate) fn client(&mut self, node: usize, shard: u16, tag: RequestTag, op: ClientOp) {
        if let Some(host) = self.hosts[node].as_mut() {
            host.handle_client(self.now, shard, tag, op, ClientRoute::Routed);
            self.pump(node);
        }
    }

    /// Writes `k` = the shard's number (one byte) to shards `0..shards` through their
    /// leaders (tags `(1, shard)`), then runs 100 ms.
    pub(crate) fn put_shard_numbers(&mut self, shards: u16) {
        for shard in 0..shards {
            let leader = self.leader_of(shard).unwrap();
            let op = ClientOp::Put {
                key: b"k".to_vec(),
                value: vec![shard as u8],
            };
            self.client(leader, shard, tag(1, u64::from(shard)), op);
        }
        self.run(Duration::from_millis(100));
    }

    pub(crate) fn pump(&mut self, index: usize) {
        let Some(host) = self.hosts[index].as_mut() else {
            return;
        };
        while let Some((shard, read)) = host.poll_snapshot_read() {
            let disk = self.disks[index]
                .get(&shard)
                .or_else(|| self.initial[index].get(&shard));
            if let Some(reply) = self.views[index].answer(shard, disk, read) {
                host.handle_snapshot_read(self.now, shard, reply);
            }
        }
        while let Some(persist) = host.poll_persist() {
            let queue = &mut self.fsync_done[index];
            let at = match (queue.front(), queue.back()) {
                (Some((flushing, _)), Some((next, _))) if next > flushing => *next,
                (Some((flushing, _)), _) => *flushing + FSYNC,
                (None, _) => self.now + FSYNC,
            };
            queue.push_back((at, persist));
            self.most_in_flight = self.most_in_flight.max(queue.len());
        }
        while let Some((peer, batch)) = host.poll_transmit() {
            let Some(to) = (0..self.disks.len()).find(|&i| name(i) == peer) else {
                continue;
            };
            if let Some(largest) = self.largest_frame.as_mut() {
                *largest = (*largest).max(cluster::wire::encode(&batch).len());
            }
            let delay = Duration::from_micros(self.rng.random_range(200..1000));
            self.flights.push((self.now + delay, index, to, batch));
        }
        while let Some((_, tag, reply)) = host.poll_reply() {
            self.replies.insert(tag, reply);
        }
    }

    /// Runs for `span` in steps of 100 µs.
    pub(crate) fn run(&mut self, span: Duration) {
        let until = self.now + span;
        while self.now < until {
            self.now += Duration::from_micros(100);
            let now = self.now;
            for index in 0..self.hosts.len() {
                while let Some((at, _)) = self.fsync_done[index].front()
                    && *at <= now
                {
                    let (_, persist) = self.fsync_done[index].pop_front().unwrap();
                    apply(&mut self.disks[index], &persist, &self.initial[index]);
                    let batch: HostBatchId = persist.batch;
                    if let Some(host) = self.hosts[index].as_mut() {
                        host.handle_persisted(now, batch);
                    }
                    self.pump(index);
                }
            }
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.flights)
                .into_iter()
                .partition(|f| f.0 <= now);
            self.flights = later;
            for (_, from, to, mut batch) in due {
                if self.cut.contains(&(from, to))
                    || self.rng.random_range(0..1000) < self.loss_per_mille
                {
                    continue;
                }
                if let Some(tamper) = self.tamper {
                    tamper(&mut batch);
                }
                if self.rng.random_range(0..1000) < self.mangle_per_mille {
                    match mangle(&batch, &mut self.rng) {
                        Some(mangled) => {
                            batch = mangled;
                            self.mangled_delivered += 1;
                        }
                        // A node counts and drops a frame it cannot decode.
                        None => continue,
                    }
                }
                self.chunks_to[to] += batch
                    .messages
                    .iter()
                    .filter(|(_, _, m)| matches!(m, cluster::replica::Message::Snapshot { .. }))
                    .count();
                if let Some(host) = self.hosts[to].as_mut() {
                    host.handle_peer_batch(now, batch);
                    self.pump(to);
                }
            }
            for index in 0..self.hosts.len() {
                if let Some(host) = self.hosts[index].as_mut()
                    && host.poll_timeout().is_some_and(|at| at <= now)
                {
                    host.handle_timeout(now);
                    self.pump(index);
                }
            }
        }
    }

    /// The node leading `shard` with an established ballot, if exactly one does.
    pub(crate) fn leader_of(&self, shard: u16) -> Option<usize> {
        let leaders: Vec<usize> = (0..self.hosts.len())
            .filter(|&i| {
                self.hosts[i]
                    .as_ref()
                    .and_then(|h| h.replica(shard))
                    .is_some_and(|r| r.established_ballot().is_some())
            })
            .collect();
        (leaders.len() == 1).then(|| leaders[0])
    }

    pub(crate) fn all_led(&self) -> bool {
        (0..self.shards).all(|shard| self.leader_of(shard).is_some())
    }

    /// Safety after every step: at most one established leader per ballot, and Log Matching
    /// between every pair of replicas.
    pub(crate) fn check_invariants(&self) {
        for shard in 0..self.shards {
            let replicas: Vec<_> = self
                .hosts
                .iter()
                .flatten()
                .filter_map(|h| h.replica(shard))
                .collect();
            let mut ballots = BTreeSet::new();
            for replica in &replicas {
                if let Some(b) = replica.leading_ballot() {
                    assert!(
                        ballots.insert(b.clone()),
                        "two leaders of {b}; {}",
                        self.replay("")
                    );
                }
            }
            for replica in &replicas {
                let durable = replica.durable();
                assert!(
                    durable.base.pos.index <= durable.applied || durable.tombstone.is_some(),
                    "the base is applied; {}",
                    self.replay("")
                );
                assert!(
                    durable.applied <= durable.last().index || durable.tombstone.is_some(),
                    "applied entries are held; {}",
                    self.replay("")
                );
            }
            for a in &replicas {
                for b in &replicas {
                    for entry in &a.durable().log {
                        if let Some(other) = b.durable().entry(entry.index)
                            && other.ballot == entry.ballot
                        {
                            assert_eq!(other, entry, "log matching; {}", self.replay(""));
                        }
                    }
                }
            }
        }
    }
}

fn tag(client: u64, req: u64) -> RequestTag {
    RequestTag {
        client,
        req,
        attempt: 0,
    }
}

#[test]
fn every_shard_gets_a_leader_and_commits_with_group_commit() {
    for seed in seeds(5) {
        let mut cluster = Cluster::new(3, 32, seed);
        cluster.run(Duration::from_secs(1));
        assert!(cluster.all_led(), "{}", cluster.replay("group_commit"));
        cluster.check_invariants();
        for shard in 0..32 {
            let leader = cluster.leader_of(shard).unwrap();
            for req in 0..5 {
                let op = ClientOp::Put {
                    key: vec![req as u8],
                    value: vec![shard as u8],
                };
                cluster.client(leader, shard, tag(u64::from(shard), req), op);
            }
        }
        cluster.run(Duration::from_millis(100));
        let ok = cluster
            .replies
            .values()
            .filter(|r| matches!(r, ClientReply::Ok { .. }))
            .count();
        assert_eq!(ok, 32 * 5, "{}", cluster.replay("group_commit"));
        // Commits polled during a flush went out before it ended, and joined the next one.
        assert!(
            cluster.most_in_flight > 1,
            "{}",
            cluster.replay("group_commit")
        );
        cluster.check_invariants();
    }
}

/// Crashes one node per seed and returns how long each shard it led stayed leaderless.
fn failover_times(seeds: &[u64], loss_per_mille: u32, views: bool, test: &str) -> Vec<Duration> {
    let mut times = Vec::new();
    for &seed in seeds {
        let mut cluster = Cluster::new(5, 16, seed);
        cluster.loss_per_mille = loss_per_mille;
        cluster.run(Duration::from_secs(1));
        assert!(cluster.all_led(), "{}", cluster.replay(test));
        let victim = (seed % 5) as usize;
        let led: Vec<u16> = (0..16)
            .filter(|&s| cluster.leader_of(s) == Some(victim))
            .collect();
        cluster.crash(victim);
        if views {
            cluster.set_views(&BTreeSet::from([name(victim)]));
        }
        let crashed = cluster.now;
        let mut pending: BTreeSet<u16> = led.iter().copied().collect();
        while !pending.is_empty() {
            assert!(
                cluster.now - crashed < Duration::from_secs(10),
                "shards {pending:?} leaderless for 10 s; {}",
                cluster.replay(test)
            );
            cluster.run(Duration::from_millis(5));
            cluster.check_invariants();
            pending.retain(|&shard| {
                let done = cluster.leader_of(shard).is_some();
                if done {
                    times.push(cluster.now - crashed);
                }
                !done
            });
        }
    }
    times.sort();
    times
}

fn p99(times: &[Duration]) -> Duration {
    times[(times.len() * 99 / 100).min(times.len() - 1)]
}

#[test]
fn after_a_leader_crash_every_shard_is_led_again_quickly() {
    // PROTOCOL.md's liveness target: T_elect + 2·T_step + 200 ms at p99 over 1,000 seeds
    // (800 ms with the defaults), with views converged at the crash and without views.
    let config = ReplicaConfig::default();
    let bound = config.t_elect + config.t_step * 2 + Duration::from_millis(200);
    let seeds = seeds(1000);
    for (views, name) in [(true, "views converged"), (false, "no views")] {
        let times = failover_times(&seeds, 0, views, "crash_every_shard");
        eprintln!(
            "re-election after a leader crash, {name}: {} shard failovers, median {:?}, p99 {:?}, max {:?} (bound {bound:?})",
            times.len(),
            times[times.len() / 2],
            p99(&times),
            times[times.len() - 1]
        );
        assert!(
            p99(&times) <= bound,
            "{name}: p99 {:?} over {bound:?}",
            p99(&times)
        );
    }
}

#[test]
fn with_one_percent_loss_no_shard_stays_leaderless() {
    let times = failover_times(&seeds(200), 10, true, "one_percent_loss");
    eprintln!(
        "re-election with 1% message loss: median {:?}, p99 {:?}, max {:?}",
        times[times.len() / 2],
        p99(&times),
        times[times.len() - 1]
    );
}

#[test]
fn an_isolated_leader_stops_acknowledging_and_the_majority_moves_on() {
    for seed in seeds(5) {
        let mut cluster = Cluster::new(3, 4, seed);
        cluster.run(Duration::from_secs(1));
        let old = cluster.leader_of(0).unwrap();
        cluster.isolate(old);
        cluster.run(Duration::from_secs(2));
        // The old leader stepped down (check-quorum) and the others elected a new one.
        let old_replica = cluster.hosts[old].as_ref().unwrap().replica(0).unwrap();
        assert!(
            old_replica.established_ballot().is_none(),
            "{}",
            cluster.replay("isolated")
        );
        let new = cluster.leader_of(0).expect("the majority elects");
        assert_ne!(new, old);
        cluster.client(
            old,
            0,
            tag(9, 1),
            ClientOp::Put {
                key: b"k".to_vec(),
                value: b"x".to_vec(),
            },
        );
        cluster.client(
            new,
            0,
            tag(9, 2),
            ClientOp::Put {
                key: b"k".to_vec(),
                value: b"y".to_vec(),
            },
        );
        cluster.run(Duration::from_millis(100));
        assert!(!matches!(
            cluster.replies.get(&tag(9, 1)),
            Some(ClientReply::Ok { .. })
        ));
        assert_eq!(
            cluster.replies.get(&tag(9, 2)),
            Some(&ClientReply::Ok { value: None })
        );
        cluster.heal();
        cluster.run(Duration::from_secs(1));
        cluster.check_invariants();
        let value = cluster.hosts[old]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .durable()
            .kv
            .get(b"k".as_slice())
            .map(<[u8]>::to_vec);
        assert_eq!(
            value,
            Some(b"y".to_vec()),
            "the old leader catches up; {}",
            cluster.replay("isolated")
        );
    }
}

#[test]
fn a_restarted_node_recovers_from_its_disk() {
    let mut cluster = Cluster::new(3, 8, 11);
    cluster.run(Duration::from_secs(1));
    cluster.put_shard_numbers(8);
    for index in 0..3 {
        cluster.crash(index);
    }
    cluster.run(Duration::from_millis(10));
    for index in 0..3 {
        cluster.start(index);
    }
    cluster.run(Duration::from_secs(2));
    assert!(cluster.all_led());
    for shard in 0..8 {
        let leader = cluster.leader_of(shard).unwrap();
        cluster.client(
            leader,
            shard,
            tag(2, u64::from(shard)),
            ClientOp::Get { key: b"k".to_vec() },
        );
    }
    cluster.run(Duration::from_millis(100));
    for shard in 0..8u16 {
        assert_eq!(
            cluster.replies.get(&tag(2, u64::from(shard))),
            Some(&ClientReply::Ok {
                value: Some(vec![shard as u8])
            }),
            "every acknowledged write survives a full restart"
        );
    }
}

/// Hands every live host shard 0's target: `leader` first, then the other three of four
/// nodes, so n3 joins as a learner.
fn target_all_four(cluster: &mut Cluster, leader: usize) {
    let mut target: Vec<Member> = vec![member(leader)];
    target.extend((0..4).filter(|&i| i != leader).map(member));
    for index in 0..4 {
        if let Some(host) = cluster.hosts[index].as_mut() {
            host.handle_target(cluster.now, 0, target.clone());
        }
        cluster.pump(index);
    }
}

/// Grows shard 0 (on n0 n1 n2) to n3 with a small `compact_after` and small chunks, so n3
/// gets a snapshot of many chunks, under fsync delay and 1% loss, invariants checked every
/// millisecond; n3 crashes mid-transfer on odd seeds, and frames are corrupted for a while
/// on seeds divisible by 3.
#[test]
fn a_fourth_replica_joins_through_a_snapshot_with_loss_and_crashes() {
    fn flip_chunk(batch: &mut PeerBatch) {
        for (_, _, message) in &mut batch.messages {
            if let cluster::replica::Message::Snapshot { pairs, digest, .. } = message {
                match pairs.last_mut() {
                    Some((key, _)) if !key.is_empty() => key[0] ^= 4,
                    _ => digest[0] ^= 4,
                }
            }
        }
    }
    let config = ReplicaConfig {
        compact_after: 8,
        snapshot_chunk_bytes: 200,
        ..ReplicaConfig::default()
    };
    for seed in seeds(8) {
        let test = "a_fourth_replica_joins_through_a_snapshot";
        let mut cluster = Cluster::with_config(4, 1, seed, config.clone());
        cluster.loss_per_mille = 10;
        cluster.run(Duration::from_secs(1));
        let leader = cluster.leader_of(0).expect("a leader");
        let mut writes = Vec::new();
        for req in 0..120u64 {
            let op = ClientOp::Put {
                key: format!("key-{req:04}").into_bytes(),
                value: vec![req as u8; 20],
            };
            cluster.client(leader, 0, tag(1, req), op);
            writes.push(req);
            cluster.run(Duration::from_millis(1));
            cluster.check_invariants();
        }
        cluster.run(Duration::from_millis(200));
        let acked: Vec<u64> = writes
            .into_iter()
            .filter(|req| {
                matches!(
                    cluster.replies.get(&tag(1, *req)),
                    Some(ClientReply::Ok { .. })
                )
            })
            .collect();
        assert!(acked.len() > 100, "{}", cluster.replay(test));
        let leader = cluster.leader_of(0).expect("a leader");
        let base = cluster.hosts[leader]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .durable()
            .base
            .pos
            .index;
        assert!(base > 8, "compacted; {}", cluster.replay(test));
        target_all_four(&mut cluster, leader);
        if seed % 3 == 0 {
            cluster.tamper = Some(flip_chunk);
        }
        let mut crash_at_chunks = None;
        let mut crashed_at = None;
        for step in 0..4000 {
            cluster.run(Duration::from_millis(1));
            cluster.check_invariants();
            if step == 300 {
                cluster.tamper = None;
            }
            if step < 300 && seed % 3 == 0 {
                let n3 = cluster.hosts[3].as_ref().and_then(|h| h.replica(0));
                assert!(
                    n3.is_none_or(|r| r.durable().kv.is_empty()),
                    "a corrupted snapshot was installed; {}",
                    cluster.replay(test)
                );
            }
            if step == 300 || (step == 0 && seed % 3 != 0) {
                // Odd seeds crash n3 once it took 6 (clean) chunks of about 30.
                crash_at_chunks = Some(cluster.chunks_to[3] + 6);
            }
            if seed % 2 == 1
                && crashed_at.is_none()
                && crash_at_chunks.is_some_and(|at| cluster.chunks_to[3] >= at)
            {
                let n3 = cluster.hosts[3].as_ref().and_then(|h| h.replica(0));
                assert!(
                    n3.is_some_and(|r| r.durable().kv.is_empty()),
                    "mid-transfer: nothing installed yet; {}",
                    cluster.replay(test)
                );
                cluster.crash(3);
                crashed_at = Some(step);
            }
            if crashed_at.is_some_and(|at| step == at + 50) {
                cluster.start(3);
            }
        }
        assert_eq!(
            crashed_at.is_some(),
            seed % 2 == 1,
            "n3 crashed mid-transfer on odd seeds; {}",
            cluster.replay(test)
        );
        let leader = cluster.leader_of(0).expect("a leader");
        let leader_durable = cluster.hosts[leader]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .durable()
            .clone();
        assert!(
            leader_durable.active_config().voters.contains(&member(3)),
            "n3 promoted: {:?}; {}",
            leader_durable.active_config(),
            cluster.replay(test)
        );
        let n3 = cluster.hosts[3]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .durable();
        assert_eq!(n3.kv, leader_durable.kv, "{}", cluster.replay(test));
        // Read back as a client would: a read answered `unavailable` (the shard is between
        // leaders; under loss a follower that missed heartbeats may stand) is asked again of
        // the leader then, for up to 3 s.
        for attempt in 0..10 {
            let Some(leader) = cluster.leader_of(0) else {
                cluster.run(Duration::from_millis(300));
                continue;
            };
            for req in &acked {
                let answered = matches!(
                    cluster.replies.get(&tag(2, *req)),
                    Some(ClientReply::Ok { .. })
                );
                if attempt == 0 || !answered {
                    cluster.client(
                        leader,
                        0,
                        tag(2, *req),
                        ClientOp::Get {
                            key: format!("key-{req:04}").into_bytes(),
                        },
                    );
                }
            }
            cluster.run(Duration::from_millis(300));
        }
        for req in &acked {
            assert_eq!(
                cluster.replies.get(&tag(2, *req)),
                Some(&ClientReply::Ok {
                    value: Some(vec![*req as u8; 20])
                }),
                "acknowledged write {req}; {}",
                cluster.replay(test)
            );
        }
    }
}

/// Snapshot chunks of one 2.5 MiB pair each, for three shards, from one leader to one
/// learner: every frame stays under the transport's 4 MiB (without the host's frame budget,
/// the two chunks in flight per shard travel in one 5 MiB frame).
#[test]
fn snapshot_frames_stay_under_four_mebibytes() {
    let config = ReplicaConfig {
        compact_after: 2,
        ..ReplicaConfig::default()
    };
    // Shards 0, 4 and 8 all live on n0 n1 n2 (led by n0); n3 joins each.
    let shards = [0u16, 4, 8];
    let mut cluster = Cluster::with_config(4, 9, 5, config);
    cluster.largest_frame = Some(0);
    cluster.run(Duration::from_secs(1));
    for shard in shards {
        let leader = cluster.leader_of(shard).expect("a leader");
        for req in 0..4u64 {
            let op = ClientOp::Put {
                key: vec![req as u8],
                value: vec![7; 2500 << 10],
            };
            cluster.client(leader, shard, tag(u64::from(shard), req), op);
            cluster.run(Duration::from_millis(5));
        }
    }
    cluster.run(Duration::from_millis(200));
    for shard in shards {
        let leader = cluster.leader_of(shard).expect("a leader");
        let mut target = vec![member(leader)];
        target.extend((0..4).filter(|&i| i != leader).map(member));
        cluster.hosts[leader]
            .as_mut()
            .unwrap()
            .handle_target(cluster.now, shard, target);
        cluster.pump(leader);
    }
    cluster.run(Duration::from_secs(3));
    for shard in shards {
        let leader = cluster.leader_of(shard).expect("a leader");
        let kv = |i: usize| {
            cluster.hosts[i]
                .as_ref()
                .unwrap()
                .replica(shard)
                .unwrap()
                .durable()
                .kv
                .clone()
        };
        assert_eq!(kv(3).len(), 4, "shard {shard}");
        assert_eq!(kv(3), kv(leader), "shard {shard}");
    }
    let largest = cluster.largest_frame.unwrap();
    assert!(largest > 2 << 20, "snapshot chunks travelled: {largest}");
    assert!(largest <= 4 << 20, "largest frame {largest} bytes");
}

/// `move_bytes_per_sec`: a learner's snapshot arrives no faster than the node's rate limit
/// allows (one burst of a quarter second's worth, or one chunk, then the rate), and it still
/// arrives whole. Without a limit the same transfer is done far sooner.
#[test]
fn snapshot_reads_keep_to_the_move_rate() {
    let test = "snapshot_reads_keep_to_the_move_rate";
    // 12.8 kB of keys and values in chunks of about 500 bytes: at 4,000 bytes/s, seconds more
    // than unlimited (2.0 to 2.3 s more with these seeds: part of the state arrives as log
    // entries, which the limit does not count).
    let run = |seed: u64, rate: u64| -> (Duration, Cluster) {
        let config = ReplicaConfig {
            compact_after: 8,
            snapshot_chunk_bytes: 500,
            move_bytes_per_sec: rate,
            ..ReplicaConfig::default()
        };
        let mut cluster = Cluster::with_config(4, 1, seed, config);
        cluster.run(Duration::from_secs(1));
        let leader = cluster.leader_of(0).expect("a leader");
        for req in 0..200u64 {
            let op = ClientOp::Put {
                key: format!("key-{req:04}").into_bytes(),
                value: vec![req as u8; 56],
            };
            cluster.client(leader, 0, tag(1, req), op);
            cluster.run(Duration::from_millis(1));
        }
        cluster.run(Duration::from_millis(300));
        target_all_four(&mut cluster, leader);
        let started = cluster.now;
        for _ in 0..20_000 {
            cluster.run(Duration::from_millis(1));
            let leader = cluster.leader_of(0).expect("a leader");
            let voters = cluster.hosts[leader]
                .as_ref()
                .unwrap()
                .replica(0)
                .unwrap()
                .config()
                .voters
                .clone();
            if voters.contains(&member(3)) {
                return (cluster.now - started, cluster);
            }
        }
        panic!(
            "seed {seed}, rate {rate}: n3 never promoted; {}",
            cluster.replay(test)
        );
    };
    for seed in seeds(3) {
        let (unlimited, _) = run(seed, 0);
        let (limited, cluster) = run(seed, 4_000);
        eprintln!("seed {seed}: unlimited {unlimited:?}, at 4,000 bytes/s {limited:?}");
        assert!(
            limited >= unlimited + Duration::from_millis(1500),
            "seed {seed}: 13 kB at 4,000 bytes/s took {limited:?}, unlimited {unlimited:?}; {}",
            cluster.replay(test)
        );
        assert!(
            limited <= unlimited + Duration::from_secs(6),
            "seed {seed}: the limit slowed it more than the rate explains: {limited:?}; {}",
            cluster.replay(test)
        );
        let leader = cluster.leader_of(0).expect("a leader");
        let leader_kv = &cluster.hosts[leader]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .durable()
            .kv;
        let n3_kv = &cluster.hosts[3]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .durable()
            .kv;
        assert_eq!(
            n3_kv,
            leader_kv,
            "seed {seed}: whole; {}",
            cluster.replay(test)
        );
        assert_eq!(n3_kv.len(), 200, "seed {seed}");
    }
}

/// A leader's first message for a shard this node does not hold creates its replica, and the
/// host reports it once ([`ShardHost::take_created`]: the cluster hands just those shards
/// their target and view); messages that create nothing report nothing.
#[test]
fn a_replica_a_leader_creates_is_reported_once() {
    use cluster::replica::{Ballot, Message, Pos};
    let mut host = ShardHost::new(name(1), member(1).storage, ReplicaConfig::default(), 7);
    let b = Ballot {
        n: 1,
        node: name(0),
    };
    let append = |b: &Ballot| Message::Append {
        b: b.clone(),
        prev: Pos {
            ballot: None,
            index: 0,
        },
        entries: Vec::new(),
        commit: 0,
        hb_seq: 1,
        idle: false,
    };
    let prepare = Message::Prepare {
        b: b.clone(),
        last: Pos {
            ballot: None,
            index: 0,
        },
        commit: 0,
        handoff_from: None,
    };
    let batch = PeerBatch {
        from: member(0),
        messages: vec![
            (9, member(1), append(&b)),
            (4, member(1), append(&b)),
            (9, member(1), append(&b)),
            // Addressed to another node, or not from a leader: no state.
            (5, member(2), append(&b)),
            (6, member(1), prepare),
        ],
    };
    host.handle_peer_batch(Duration::ZERO, batch.clone());
    assert_eq!(host.take_created(), vec![9, 4]);
    assert!(host.take_created().is_empty());
    assert!(host.replica(5).is_none() && host.replica(6).is_none());
    // Held already: nothing new.
    host.handle_peer_batch(Duration::from_millis(1), batch);
    assert!(host.take_created().is_empty());
}

/// Peer bytes never panic a host. A third of all replication frames are corrupted in flight
/// ([`mangle`]): bytes changed and the frame decoded again as a node would (most no longer
/// decode and are dropped; the rest arrive with a ballot, index, shard, member, key or value
/// changed), or counters set to extremes, or snapshot chunks changed under a digest that
/// matches (a buggy leader's: pairs out of order or repeated). Odd seeds corrupt from the
/// start (the first elections' `Prepare`s and `Promise`s), even seeds once every shard is led;
/// every third seed serves reads under leases, odd seeds run five hosts. Meanwhile clients
/// write to and read
/// from every shard, a fourth node joins shard 0 through a snapshot of small chunks, and a
/// node crashes and restarts. Only panics are checked: a peer that sends wrong messages is
/// outside the protocol's fault model (its certificate vouches for it), so safety and liveness
/// are not asserted here. 6,000 seeds passed when it was written (`seeds(6000)`, 2.5 min), and
/// 3,000 with the snapshot changes.
#[test]
fn mangled_replication_frames_never_panic_a_host() {
    let test = "mangled_replication_frames_never_panic_a_host";
    let (mut delivered, mut malformed) = (0, 0);
    for seed in seeds(24) {
        let config = ReplicaConfig {
            compact_after: 8 + seed % 50,
            snapshot_chunk_bytes: 200,
            lease_reads: seed % 3 == 0,
            ..ReplicaConfig::default()
        };
        let run = std::panic::catch_unwind(|| {
            let mut cluster =
                Cluster::with_config(4 + (seed % 2) as usize, 4, seed, config.clone());
            if seed % 2 == 1 {
                cluster.mangle_per_mille = 333;
            }
            cluster.run(Duration::from_secs(1));
            cluster.mangle_per_mille = 333;
            for step in 0..400u64 {
                for shard in 0..4u16 {
                    let to = cluster.leader_of(shard).unwrap_or(step as usize % 4);
                    let key = format!("key-{}", step % 40).into_bytes();
                    let op = if step % 5 == 4 {
                        ClientOp::Get { key }
                    } else {
                        ClientOp::Put {
                            key,
                            value: vec![step as u8; 20],
                        }
                    };
                    cluster.client(to, shard, tag(u64::from(shard), step), op);
                }
                match step {
                    100 => {
                        let leader = cluster.leader_of(0).unwrap_or(0);
                        target_all_four(&mut cluster, leader);
                    }
                    200 => cluster.crash((seed % 4) as usize),
                    250 => cluster.start((seed % 4) as usize),
                    _ => {}
                }
                cluster.run(Duration::from_millis(10));
            }
            let malformed: u64 = cluster
                .hosts
                .iter()
                .flatten()
                .map(ShardHost::malformed_messages)
                .sum();
            (cluster.mangled_delivered, malformed)
        });
        let Ok((seed_delivered, seed_malformed)) = run else {
            panic!(
                "a host panicked on a mangled frame; seed {seed}: replay with \
                 SLOTRING_SEED={seed} cargo test -p cluster --test it {test}"
            );
        };
        delivered += seed_delivered;
        malformed += seed_malformed;
    }
    eprintln!("mangled frames delivered: {delivered}; messages dropped as malformed: {malformed}");
    // The mangling reached the replicas, and the hosts' checks turned some of it away.
    assert!(delivered > 0 && malformed > 0);
}

#[test]
fn reads_are_confirmed_by_read_rounds_the_followers_hosts_answer() {
    use cluster::replica::{Ballot, Message, NackReason};
    for seed in seeds(5) {
        let test = "reads_are_confirmed_by_read_rounds";
        let mut cluster = Cluster::new(3, 8, seed);
        cluster.run(Duration::from_secs(1));
        assert!(cluster.all_led(), "{}", cluster.replay(test));
        cluster.put_shard_numbers(8);

        // Every follower acknowledged its leader by now: a read's round is a `ReadRound` to one
        // of them, unless both have a periodic round outstanding (then it goes to both as an
        // `Append`). The reads are served with the value written.
        let mut by_read_round = BTreeSet::new();
        for shard in 0..8u16 {
            let leader = cluster.leader_of(shard).unwrap();
            let before = cluster.flights.len();
            let get = ClientOp::Get { key: b"k".to_vec() };
            cluster.client(leader, shard, tag(2, u64::from(shard)), get);
            let rounds = cluster.flights[before..]
                .iter()
                .flat_map(|(_, _, _, batch)| &batch.messages)
                .filter(|(s, _, m)| *s == shard && matches!(m, Message::ReadRound { .. }))
                .count();
            assert!(rounds <= 1, "one follower asked; {}", cluster.replay(test));
            if rounds == 1 {
                by_read_round.insert(shard);
            }
        }
        assert!(
            by_read_round.len() >= 4,
            "{by_read_round:?} by ReadRound; {}",
            cluster.replay(test)
        );
        // A `ReadRound`'s round trip takes at most 2 ms here (an `Append`'s answer may also
        // wait for the follower's fsync, 4 ms).
        cluster.run(Duration::from_millis(3));
        for shard in by_read_round {
            assert!(
                cluster.replies.contains_key(&tag(2, u64::from(shard))),
                "shard {shard}'s read is served; {}",
                cluster.replay(test)
            );
        }
        cluster.run(Duration::from_millis(20));
        for shard in 0..8u16 {
            assert_eq!(
                cluster.replies.get(&tag(2, u64::from(shard))),
                Some(&ClientReply::Ok {
                    value: Some(vec![shard as u8])
                }),
                "{}",
                cluster.replay(test)
            );
        }

        // What a follower answers: `ReadRoundOk` for the ballot it holds, `AppendNack` for a
        // lower one, nothing for a higher one it never heard of or a round meant for another
        // storage.
        let leader = cluster.leader_of(0).unwrap();
        let b = cluster.hosts[leader]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap()
            .established_ballot()
            .unwrap()
            .clone();
        let follower = (0..3).find(|&i| i != leader).unwrap();
        let replica = cluster.hosts[follower]
            .as_ref()
            .unwrap()
            .replica(0)
            .unwrap();
        let me = member(follower);
        assert_eq!(
            replica.answer_read_round(&me, &b, 7),
            Some(Message::ReadRoundOk {
                b: b.clone(),
                round: 7
            }),
            "{}",
            cluster.replay(test)
        );
        let lower = Ballot {
            n: b.n - 1,
            node: b.node.clone(),
        };
        assert_eq!(
            replica.answer_read_round(&me, &lower, 7),
            Some(Message::AppendNack {
                b: lower,
                reason: NackReason::Higher(b.clone())
            }),
            "{}",
            cluster.replay(test)
        );
        let higher = Ballot {
            n: b.n + 1,
            node: b.node.clone(),
        };
        assert_eq!(
            replica.answer_read_round(&me, &higher, 7),
            None,
            "{}",
            cluster.replay(test)
        );
        let elsewhere = Member {
            node: me.node.clone(),
            storage: StorageId(1),
        };
        assert_eq!(
            replica.answer_read_round(&elsewhere, &b, 7),
            None,
            "{}",
            cluster.replay(test)
        );
    }
}
