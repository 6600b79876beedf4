//! The messages nodes and the CLI exchange over request streams, and the datagram framing.
//!
//! Every stream frame body is an [`Envelope`]: a `u16` wire version, then the postcard-encoded
//! message. Decoding checks the version, uses `take_from_bytes` and rejects trailing bytes;
//! no wire type is recursive, so a hostile frame can cost at most its (transport-capped) size.
//! A datagram is one tag byte ([`DATAGRAM_SWIM`]) followed by a foca packet.

use core::net::SocketAddr;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::Error;
use crate::identity::{Identity, node_id_serde};
use crate::spec::ClusterSpec;
use topology::NodeId;

/// The version every frame starts with; a peer speaking another one is refused with
/// [`Error::WireVersion`].
pub const WIRE_VERSION: u16 = 11;

/// The tag byte of a datagram that carries a SWIM (foca) packet.
pub const DATAGRAM_SWIM: u8 = 1;

/// The longest key `shard-for` accepts, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// A frame body: the version, then the message.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope<T> {
    version: u16,
    message: T,
}

/// Encodes `message` in a versioned envelope.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let envelope = Envelope {
        version: WIRE_VERSION,
        message,
    };
    // Invariant: postcard's Vec serializer only fails on types serde cannot represent, and all
    // wire types are plain data.
    postcard::to_allocvec(&envelope).expect("wire types always serialize")
}

/// Encodes `message` like [`encode`], into a buffer that starts with room for `capacity`
/// bytes: for large messages whose size the caller can estimate (replication frames), which
/// [`encode`] would grow a doubling at a time, copying what it holds each time.
pub fn encode_with_capacity<T: Serialize>(message: &T, capacity: usize) -> Vec<u8> {
    let envelope = Envelope {
        version: WIRE_VERSION,
        message,
    };
    // Invariant: as in `encode`.
    postcard::to_extend(&envelope, Vec::with_capacity(capacity))
        .expect("wire types always serialize")
}

/// Decodes a versioned envelope, rejecting another version and trailing bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let (version, rest) =
        postcard::take_from_bytes::<u16>(bytes).map_err(|e| Error::Decode(e.to_string()))?;
    if version != WIRE_VERSION {
        return Err(Error::WireVersion {
            theirs: version,
            ours: WIRE_VERSION,
        });
    }
    let (message, rest) =
        postcard::take_from_bytes::<T>(rest).map_err(|e| Error::Decode(e.to_string()))?;
    if !rest.is_empty() {
        return Err(Error::TrailingBytes { count: rest.len() });
    }
    Ok(message)
}

/// A SWIM member as gossiped: foca's own record (identity, incarnation, state).
pub type WireMember = foca::Member<Identity>;

/// What one peer asks another (node to node) or the CLI asks a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// A node asks to join: it states who it is and, if it already knows one, its spec.
    Join {
        /// The joiner's node id (its certificate must name the same).
        #[serde(with = "node_id_serde")]
        node_id: NodeId,
        /// The spec the joiner persisted or was given, if any.
        spec: Option<ClusterSpec>,
    },
    /// Anti-entropy, step one: the sender's view in two digests.
    Digest {
        /// The sender's table digest.
        table: [u8; 32],
        /// The sender's membership digest (see [`crate::Cluster::membership_digest`]).
        members: u64,
    },
    /// Anti-entropy, step two (push-pull): the sender's whole membership.
    Sync {
        /// Every member the sender knows, itself included.
        members: Vec<WireMember>,
    },
    /// The sender is leaving the cluster for good (graceful shutdown).
    Leaving {
        /// The identity that leaves.
        identity: Identity,
    },
    /// CLI: where shard `shard` lives.
    ShardInfo {
        /// The shard id as typed; checked against the shard count.
        shard: u32,
    },
    /// CLI: which shard a key maps to.
    ShardFor {
        /// The key, at most [`MAX_KEY_LEN`] bytes.
        key: Vec<u8>,
    },
    /// CLI: the membership list.
    Members,
    /// CLI: the shard replicas the answering node holds after shard `after` (all with
    /// `None`), with a checksum of each one's state, a page at a time (see
    /// [`Response::ShardDigests`]).
    ShardDigests {
        /// Where the previous page ended.
        after: Option<u16>,
    },
    /// A node's replication messages for the answering node (one frame, batched per peer).
    Replicate(crate::replica::PeerBatch),
    /// A client operation on one key; answered with [`Response::Client`] once the shard's
    /// leader decides (the key's shard is computed by the answering node).
    Client {
        /// The operation.
        op: crate::replica::ClientOp,
        /// Why the client asks this node.
        route: crate::replica::ClientRoute,
    },
    /// CLI: per-node load.
    Status,
    /// CLI: per-node ring ownership.
    Ring,
    /// CLI (`node leave`): decommission the answering node. It leaves placement at once (its
    /// replicas move to the others, one voter at a time), then leaves the cluster and exits
    /// once it holds no replica. Refused when the others would be fewer than the replication
    /// factor.
    Decommission,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// The join is accepted: here are the spec and the membership.
    Welcome {
        /// The cluster's spec, to adopt.
        spec: ClusterSpec,
        /// Every member the answering node knows.
        members: Vec<WireMember>,
    },
    /// The request is refused; nothing changed on the answering node.
    Refused {
        /// Why, for an operator.
        reason: String,
    },
    /// The answer to [`Request::Digest`].
    Digest {
        /// The answering node's table digest.
        table: [u8; 32],
        /// The answering node's membership digest.
        members: u64,
    },
    /// The answer to [`Request::Sync`]: the answering node's membership.
    Sync {
        /// Every member the answering node knows.
        members: Vec<WireMember>,
    },
    /// Done; nothing to report.
    Ack,
    /// The answer to [`Request::ShardInfo`].
    ShardInfo(ShardInfoView),
    /// The answer to [`Request::ShardFor`].
    ShardFor(ShardForView),
    /// The answer to [`Request::Members`].
    Members(MembersView),
    /// The answer to [`Request::Status`].
    Status(StatusView),
    /// The answer to [`Request::Ring`].
    Ring(RingView),
    /// The answer to [`Request::Client`].
    Client(crate::replica::ClientReply),
    /// The answer to [`Request::ShardDigests`]: digests in shard order, at most
    /// [`DIGEST_PAGE_SHARDS`] of them, each read off its replica (nothing is hashed to answer).
    ShardDigests {
        /// This page's digests.
        digests: Vec<ShardDigest>,
        /// Ask again with this as `after` for the next page; `None`: that was the last.
        next: Option<u16>,
    },
    /// The answer to [`Request::Decommission`]: the node is draining; this is what it holds
    /// now (it leaves when that is nothing).
    Decommissioning(HeldView),
    /// The answering node has too many client requests waiting: this one was not looked at,
    /// so nothing changed. A client retries after a pause.
    Overloaded {
        /// How many client requests were waiting.
        waiting: u32,
    },
}

/// A node named with its address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRef {
    /// The node's id.
    #[serde(with = "node_id_serde")]
    pub id: NodeId,
    /// Where it listens; `None` when the answering node does not know it.
    pub addr: Option<SocketAddr>,
}

/// A replica of a shard and its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaView {
    /// Which node.
    pub node: NodeRef,
    /// `leader`, `follower` or `learner`.
    pub role: String,
    /// How far its log is known to reach: the answering replica's own applied index, or, when
    /// the answering replica leads, the index each follower acknowledged; `None` if unknown.
    pub index: Option<u64>,
    /// When the answering replica leads: how many entries this one lacks behind the leader's
    /// last entry. `None` otherwise, and for the leader itself.
    pub lag: Option<u64>,
    /// When the answering replica leads and is sending this one a snapshot: how much of it
    /// this one has acknowledged.
    pub copied: Option<CopyProgress>,
    /// The answering replica leads and holds new writes until this learner catches up (R6's
    /// pause, for a learner that tails the log without catching up).
    pub pausing_writes: bool,
}

/// A snapshot transfer's progress: what the receiver acknowledged, of the whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyProgress {
    /// Key-value pairs acknowledged.
    pub keys: u64,
    /// Key-value pairs in the snapshot.
    pub keys_total: u64,
    /// Key and value bytes acknowledged.
    pub bytes: u64,
    /// Key and value bytes in the snapshot.
    pub bytes_total: u64,
}

impl CopyProgress {
    /// The progress of all `transfers` together (zero for none).
    pub fn total(transfers: impl IntoIterator<Item = CopyProgress>) -> CopyProgress {
        transfers
            .into_iter()
            .fold(CopyProgress::default(), std::ops::Add::add)
    }
}

impl std::ops::Add for CopyProgress {
    type Output = CopyProgress;

    /// Two transfers' progress together.
    fn add(self, other: CopyProgress) -> CopyProgress {
        CopyProgress {
            keys: self.keys + other.keys,
            keys_total: self.keys_total + other.keys_total,
            bytes: self.bytes + other.bytes,
            bytes_total: self.bytes_total + other.bytes_total,
        }
    }
}

/// The most shards one [`Response::ShardDigests`] page holds: about 30 bytes each, so a page
/// of the default 1,024 shards is one answer of about 30 KB.
pub const DIGEST_PAGE_SHARDS: usize = 1024;

/// One replica's state in brief, for comparing replicas (`node check`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardDigest {
    /// The shard.
    pub shard: u16,
    /// The replica's applied index.
    pub applied: u64,
    /// The [`StateDigest`](crate::replica::StateDigest) of its key-value state at `applied`.
    pub checksum: [u8; 16],
    /// Whether the replica leads, and whether its shard has settled.
    pub role: DigestRole,
}

/// A replica's part in its shard, as [`ShardDigest`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DigestRole {
    /// Not an established leader: a follower, a learner, or a candidate.
    Other,
    /// The shard's leader, with an established ballot.
    Leader {
        /// Its voters are exactly placement's replica set for the shard and it has no
        /// learners: no move is left to make.
        at_target: bool,
    },
}

/// Where a shard lives, as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfoView {
    /// The shard.
    pub shard: u16,
    /// As the answering node sees it: `stable` (its replica knows a leader and its voters are
    /// the target), `migrating` (it knows a leader, and `joining` or `leaving` is not empty),
    /// `no-quorum` (its replica knows no leader, or the cluster has no members), or
    /// `elsewhere` (it holds no replica of the shard, or only the retired copy of one it was
    /// removed from: ask a member of `target`).
    pub state: String,
    /// The leader the answering replica knows; `None` when it knows none or holds no replica.
    pub leader: Option<NodeRef>,
    /// The answering replica's view of the shard's actual config: leader first, then
    /// followers and learners; empty when it holds no replica.
    pub replicas: Vec<ReplicaView>,
    /// The replica set placement wants, leader first.
    pub target: Vec<String>,
    /// Members of `target` the answering replica's config does not hold as voters yet: the
    /// shard is moving to them (state `migrating`).
    pub joining: Vec<String>,
    /// Voters of the answering replica's config that `target` no longer names: the shard is
    /// moving away from them (state `migrating`).
    pub leaving: Vec<String>,
    /// The answering node's table digest, hex.
    pub digest: String,
    /// The ballot (`n.node`) the answering replica has promised: the shard's epoch. `None` when
    /// the answering node holds no replica of the shard.
    pub epoch: Option<String>,
    /// The answering replica's commit index, when it holds one.
    pub commit: Option<u64>,
}

/// Which shard a key maps to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardForView {
    /// The shard.
    pub shard: u16,
    /// The shard's leader; `None` with no members.
    pub leader: Option<NodeRef>,
}

/// One member as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    /// The member's id.
    #[serde(with = "node_id_serde")]
    pub id: NodeId,
    /// Where it listens.
    pub addr: SocketAddr,
    /// `alive`, `suspect`, `down` or `left`.
    pub state: String,
    /// The member's generation.
    pub generation: u64,
    /// The member's SWIM incarnation.
    pub incarnation: u16,
    /// The member is being decommissioned: placement leaves it out while its replicas move
    /// away (`node leave`).
    pub draining: bool,
}

/// The membership list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembersView {
    /// The answering node.
    #[serde(with = "node_id_serde")]
    pub node: NodeId,
    /// Every member it knows, itself included, sorted by id.
    pub members: Vec<MemberView>,
}

/// One node's load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLoad {
    /// The member.
    pub member: MemberView,
    /// Shards it leads.
    pub leads: u32,
    /// Shards it holds, leading or not.
    pub replicates: u32,
}

/// The node-by-node load summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusView {
    /// The answering node.
    #[serde(with = "node_id_serde")]
    pub node: NodeId,
    /// The cluster spec.
    pub spec: ClusterSpec,
    /// The answering node's table digest, hex.
    pub digest: String,
    /// Every known member with its load (zero for members off the ring).
    pub nodes: Vec<NodeLoad>,
    /// Shards with fewer than `min(RF, members)` distinct replicas.
    pub shards_under_replicated: u32,
    /// The shards the answering node leads whose voters are not yet placement's target, in
    /// shard order. Every leader reports its own: `node status` asks every live member.
    pub moving: Vec<MoveView>,
    /// What the answering node stores.
    pub held: HeldView,
    /// The input the answering node dropped since it started, by kind.
    pub stats: crate::Stats,
}

/// The data one node stores: its replicas that are not tombstoned, and their keys at each
/// one's applied index (a learner's partial snapshot is not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HeldView {
    /// Shards.
    pub shards: u32,
    /// Keys, summed over those shards.
    pub keys: u64,
    /// Copies of shards this node no longer holds, still on its disk until their grace period
    /// (`--retired-grace`) ends.
    pub retired: u32,
}

/// A shard moving between nodes, as its leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveView {
    /// The shard.
    pub shard: u16,
    /// Its leader (the answering node), which sends the copies.
    #[serde(with = "node_id_serde")]
    pub leader: NodeId,
    /// Target members that are not voters yet.
    pub joining: Vec<String>,
    /// Voters the target no longer names.
    pub leaving: Vec<String>,
    /// The most entries a joining replica lacks behind the leader's last one; `None` if none
    /// has answered yet.
    pub lag: Option<u64>,
    /// Snapshot transfers to joining replicas, summed; `None` when none is under way.
    pub copied: Option<CopyProgress>,
    /// The leader holds new writes to the shard until a joining replica catches up (R6).
    pub writes_paused: bool,
    /// Placement's leader for the shard when that is another of its voters: leadership passes
    /// to it (R7's handoff) once nobody joins or leaves and, while shards this node leads are
    /// adding members, once they are done. A shard with nobody joining or leaving is listed
    /// for this alone.
    pub handoff_to: Option<String>,
}

/// One member's share of the ring.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingShare {
    /// The member.
    #[serde(with = "node_id_serde")]
    pub id: NodeId,
    /// Its vnode tokens.
    pub tokens: u32,
    /// The percent of the 64-bit ring its tokens own.
    pub ownership: f64,
}

/// Ring ownership per member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingView {
    /// Vnodes per member.
    pub vnodes: u32,
    /// One entry per member on the ring, sorted by id.
    pub nodes: Vec<RingShare>,
}
