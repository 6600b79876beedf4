//! The shards a node holds, driven from membership: [`Cluster`]'s side of the replication
//! protocol. Placement (the table) becomes each held shard's *target*; the replicas' messages
//! travel as [`Transmit::Replicate`](crate::Transmit::Replicate); their persists and client
//! answers are polled here.
//!
//! What it deliberately does not do: it never creates shard state from placement alone. A
//! shard exists on a node because this node bootstrapped the cluster
//! ([`Cluster::bootstrap_shards`]), because the disk held it ([`Cluster::open_shards`]), or
//! because a leader sent it entries or a snapshot (PROTOCOL.md R6).

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};

use shardtable::ShardId;
use topology::NodeId;

use crate::Error;
use crate::core::Cluster;
use crate::replica::{
    ClientOp, ClientReply, ClientRoute, Config, Durable, HostBatchId, HostPersist, Member,
    RequestTag, ShardHost, ShardReplica, SnapshotRead, SnapshotReadReply, StorageId,
};
use crate::wire::{DigestRole, HeldView, MAX_KEY_LEN, ShardDigest};

impl Cluster {
    /// Restarts the shards this node's disk holds.
    pub fn open_shards(&mut self, now: Duration, shards: BTreeMap<u16, Durable>) {
        for (shard, durable) in shards {
            self.host.open_shard(now, shard, durable);
        }
        self.refresh_targets(now);
    }

    /// A new cluster's first node: creates every shard with itself as the only voter (later
    /// members join each shard as learners, through its leader). The next
    /// [`poll_persist`](Self::poll_persist) holds them all.
    pub fn bootstrap_shards(&mut self, now: Duration) {
        let me = self.me();
        for shard in 0..self.spec().table.shards.get() {
            let Ok(shard) = u16::try_from(shard) else {
                break;
            };
            if self.host.replica(shard).is_none() {
                let config = Config {
                    voters: vec![me.clone()],
                    learners: Vec::new(),
                };
                self.host.bootstrap_shard(now, shard, config);
            }
        }
        self.refresh_targets(now);
    }

    /// This node as a shard member.
    fn me(&self) -> Member {
        let identity = self.identity();
        Member {
            node: identity.node_id.clone(),
            storage: identity.meta.storage,
        }
    }

    /// Hands placement's replica set of every held shard to its replica (only an established
    /// leader acts on it), and the members held down to every replica (for ranking).
    pub(crate) fn refresh_targets(&mut self, now: Duration) {
        let (storage, dead) = self.placement_members();
        self.host.handle_view(now, &dead);
        let shards: Vec<u16> = self.host.replicas().map(|(shard, _)| shard).collect();
        for shard in shards {
            self.give_target(now, shard, &storage);
        }
    }

    /// [`Cluster::refresh_targets`] for the given shards only: replicas a leader just created
    /// here. (Refreshing every shard for each one made a join quadratic: a joiner receiving
    /// 776 shards spent a sixth of its event loop recomputing targets that had not changed.)
    pub(crate) fn refresh_targets_of(&mut self, now: Duration, shards: &[u16]) {
        let (storage, dead) = self.placement_members();
        for &shard in shards {
            self.host.handle_view_of(now, shard, &dead);
            self.give_target(now, shard, &storage);
        }
    }

    /// The storage of every active member (this node's included), and the members held down
    /// that are not active under another generation.
    fn placement_members(&self) -> (BTreeMap<NodeId, StorageId>, BTreeSet<NodeId>) {
        let mut storage: BTreeMap<NodeId, StorageId> = BTreeMap::new();
        for identity in self.active_identities() {
            storage.insert(identity.node_id.clone(), identity.meta.storage);
        }
        let me = self.me();
        storage.insert(me.node.clone(), me.storage);
        let dead: BTreeSet<NodeId> = self
            .down_members()
            .into_iter()
            .filter(|node| !storage.contains_key(node))
            .collect();
        (storage, dead)
    }

    /// Hands `shard` placement's replica set, each member with its storage; nothing when a
    /// member's storage is unknown yet.
    fn give_target(&mut self, now: Duration, shard: u16, storage: &BTreeMap<NodeId, StorageId>) {
        let Ok(info) = self.table().shard_info(ShardId::new(shard)) else {
            return;
        };
        let target: Option<Vec<Member>> = info
            .replicas()
            .map(|node| {
                storage.get(node).map(|storage| Member {
                    node: node.clone(),
                    storage: *storage,
                })
            })
            .collect();
        if let Some(target) = target
            && !target.is_empty()
        {
            self.host.handle_target(now, shard, target);
        }
    }

    /// A client operation, answered later through
    /// [`poll_client_reply`](Self::poll_client_reply) with `token`. The key's shard answers if
    /// this node holds it; otherwise the answer is `Moved` to placement's leader (or
    /// `Unavailable`). A key or value over the limits is refused at once, changing nothing.
    /// `route` says why the client asks this node.
    pub fn handle_client(
        &mut self,
        now: Duration,
        token: u64,
        op: ClientOp,
        route: ClientRoute,
    ) -> Result<(), Error> {
        let (key, value_len) = match &op {
            ClientOp::Put { key, value } => (key, value.len()),
            ClientOp::Get { key } | ClientOp::Del { key } => (key, 0),
        };
        if key.len() > MAX_KEY_LEN {
            return Err(Error::KeyTooLong {
                len: key.len(),
                max: MAX_KEY_LEN,
            });
        }
        let max = self.max_value_len();
        if value_len > max {
            return Err(Error::ValueTooLong {
                len: value_len,
                max,
            });
        }
        let shard = self.table().shard_for(key).get();
        if self.host.replica(shard).is_some() {
            let tag = RequestTag {
                client: 0,
                req: token,
                attempt: 0,
            };
            self.host.handle_client(now, shard, tag, op, route);
        } else {
            let me = self.identity().node_id.clone();
            let leader = self
                .table()
                .shard_info(ShardId::new(shard))
                .ok()
                .and_then(|info| info.leader().cloned())
                .filter(|leader| leader != &me);
            let reply = match leader {
                Some(leader) => ClientReply::Moved {
                    b: None,
                    leader: Some(leader),
                },
                None => ClientReply::Unavailable,
            };
            self.client_replies.push_back((token, reply));
        }
        Ok(())
    }

    /// The next client answer, with the token given to [`handle_client`](Self::handle_client).
    pub fn poll_client_reply(&mut self) -> Option<(u64, ClientReply)> {
        if let Some(reply) = self.client_replies.pop_front() {
            return Some(reply);
        }
        self.host
            .poll_reply()
            .map(|(_, tag, reply)| (tag.req, reply))
    }

    /// The next group commit to make durable (one transaction for all shards); report it with
    /// [`handle_persisted`](Self::handle_persisted).
    pub fn poll_persist(&mut self) -> Option<HostPersist> {
        self.host.poll_persist()
    }

    /// Group commit `batch` is durable.
    pub fn handle_persisted(&mut self, now: Duration, batch: HostBatchId) {
        self.host.handle_persisted(now, batch);
    }

    /// The next read of the disk for a snapshot transfer (R6); answer it with
    /// [`handle_snapshot_read`](Self::handle_snapshot_read), each shard's in order.
    pub fn poll_snapshot_read(&mut self) -> Option<(u16, SnapshotRead)> {
        self.host.poll_snapshot_read()
    }

    /// The answer to a [`SnapshotRead`] of `shard`.
    pub fn handle_snapshot_read(&mut self, now: Duration, shard: u16, reply: SnapshotReadReply) {
        self.host.handle_snapshot_read(now, shard, reply);
    }

    /// The replicas this node stores (not tombstoned) and their keys, and the retired copies
    /// waiting for their grace period to end (`status`'s `held`).
    pub fn held(&self) -> HeldView {
        self.host
            .replicas()
            .fold(HeldView::default(), |held, (_, replica)| {
                if replica.durable().tombstone.is_none() {
                    HeldView {
                        shards: held.shards + 1,
                        keys: held.keys + replica.durable().kv.len() as u64,
                        ..held
                    }
                } else {
                    HeldView {
                        retired: held.retired + u32::from(replica.holds_retired_copy()),
                        ..held
                    }
                }
            })
    }

    /// Each held replica's applied index and the digest of its key-value state (tombstoned
    /// replicas are left out), in shard order, for the shards after `after`: at most
    /// `page_shards` of them (at least one), and where the next page starts (`None` when this
    /// one holds the last). A replica keeps its digest as it applies writes
    /// ([`StateDigest`](crate::replica::StateDigest)), so this hashes nothing.
    pub fn shard_digests(
        &self,
        after: Option<u16>,
        page_shards: usize,
    ) -> (Vec<ShardDigest>, Option<u16>) {
        let mut digests: Vec<ShardDigest> = Vec::new();
        let held = self
            .host
            .replicas()
            .filter(|(shard, _)| after.is_none_or(|after| *shard > after))
            .filter(|(_, replica)| replica.durable().tombstone.is_none());
        for (shard, replica) in held {
            if digests.len() >= page_shards.max(1)
                && let Some(last) = digests.last()
            {
                let next = last.shard;
                return (digests, Some(next));
            }
            let durable = replica.durable();
            let role = if replica.established_ballot().is_some() {
                DigestRole::Leader {
                    at_target: self.at_target(shard, replica),
                }
            } else {
                DigestRole::Other
            };
            digests.push(ShardDigest {
                shard,
                applied: durable.applied,
                checksum: durable.kv.digest().to_bytes(),
                role,
            });
        }
        (digests, None)
    }

    /// Whether `replica`'s voters are exactly placement's replica set for `shard` (by node)
    /// and it has no learners.
    fn at_target(&self, shard: u16, replica: &ShardReplica) -> bool {
        let Ok(info) = self.table().shard_info(ShardId::new(shard)) else {
            return false;
        };
        let config = replica.config();
        config.learners.is_empty()
            && config.voters.len() == info.replicas().count()
            && info
                .replicas()
                .all(|node| config.voters.iter().any(|voter| &voter.node == node))
    }

    /// Every shard replica this node holds.
    pub fn shards(&self) -> &ShardHost {
        &self.host
    }
}
