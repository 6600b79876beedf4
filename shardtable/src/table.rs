//! [`ShardTable`]: every shard's leader and replicas, precomputed for O(1) lookup.

use std::fmt;

use topology::{MemberIndex, NodeId, TokenRing};

use crate::error::Error;
use crate::placement::Placer;
use crate::shard::{ShardCount, ShardId, shard_for};
use crate::spec::{ReplicationFactor, TableSpec};

/// Every shard's owners (leader first) for one member set: the answer to "who leads shard 42,
/// who replicates it", the same on every node that sees the same members.
///
/// A table is immutable; a membership change builds a new one (see [`Placer`]) and
/// [`diff`](crate::diff) says what moved. Lookups index a flat array: [`ShardTable::shard_info`]
/// costs a bounds check and no allocation.
///
/// Each shard has exactly `min(RF, N)` distinct owners for `N` members; with no members every
/// shard is unassigned. Two tables are equal, and have equal [`TableDigest`]s, exactly when
/// their shard count, replication factor, member list and every shard's ordered owners are
/// equal; how the table was computed (placement, vnodes) is not part of it.
#[derive(Clone, PartialEq, Eq)]
pub struct ShardTable {
    shards: ShardCount,
    replication_factor: ReplicationFactor,
    /// The members the table was computed from, sorted by [`NodeId`].
    members: Box<[NodeId]>,
    /// Owners per shard: `min(replication_factor, members.len())`.
    width: usize,
    /// `owners[s * width..(s + 1) * width]` are shard `s`'s owners, leader first, as indices
    /// into `members`.
    owners: Box<[MemberIndex]>,
    /// Derived from the fields above when the table is built.
    digest: TableDigest,
}

impl ShardTable {
    /// The table for the members of `ring`. To build many tables for the same spec, keep a
    /// [`Placer`], which hashes the shard positions only once.
    pub fn new(spec: &TableSpec, ring: &TokenRing) -> Self {
        Placer::new(*spec).place(ring)
    }

    /// The table built by a placement, or by applying a diff. `owners` holds `width` valid
    /// member indices per shard.
    pub(crate) fn from_parts(
        shards: ShardCount,
        replication_factor: ReplicationFactor,
        members: Box<[NodeId]>,
        width: usize,
        owners: Box<[MemberIndex]>,
    ) -> Self {
        debug_assert_eq!(owners.len(), shards.len() * width);
        debug_assert!(owners.iter().all(|owner| owner.get() < members.len()));
        let digest = TableDigest::compute(shards, replication_factor, &members, width, &owners);
        ShardTable {
            shards,
            replication_factor,
            members,
            width,
            owners,
            digest,
        }
    }

    /// How many shards exist.
    pub fn shard_count(&self) -> ShardCount {
        self.shards
    }

    /// The configured replication factor; each shard actually has [`ShardTable::width`] owners.
    pub fn replication_factor(&self) -> ReplicationFactor {
        self.replication_factor
    }

    /// How many owners every shard has: `min(RF, members)`, 0 with no members.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The members the table was computed from, sorted.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// The shard `key` belongs to (independent of membership).
    pub fn shard_for(&self, key: &[u8]) -> ShardId {
        shard_for(key, self.shards)
    }

    /// Who leads and replicates `shard`, or [`Error::ShardOutOfRange`].
    pub fn shard_info(&self, shard: ShardId) -> Result<ShardInfo<'_>, Error> {
        self.shards.check(shard)?;
        let at = shard.index() * self.width;
        Ok(ShardInfo {
            shard,
            members: &self.members,
            owners: &self.owners[at..at + self.width],
        })
    }

    /// Every shard's placement, in id order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = ShardInfo<'_>> + '_ {
        self.shards.ids().map(move |shard| {
            let at = shard.index() * self.width;
            ShardInfo {
                shard,
                members: &self.members,
                owners: &self.owners[at..at + self.width],
            }
        })
    }

    /// How many shards each member leads, parallel to [`ShardTable::members`].
    pub fn leader_counts(&self) -> Vec<u32> {
        let mut counts = vec![0; self.members.len()];
        if self.width > 0 {
            for owners in self.owners.chunks_exact(self.width) {
                counts[owners[0].get()] += 1;
            }
        }
        counts
    }

    /// How many shards each member holds (leading or not), parallel to
    /// [`ShardTable::members`].
    pub fn membership_counts(&self) -> Vec<u32> {
        let mut counts = vec![0; self.members.len()];
        for owner in &self.owners {
            counts[owner.get()] += 1;
        }
        counts
    }

    /// The blake3 digest of the table, for comparing two nodes' views in 32 bytes.
    pub fn digest(&self) -> TableDigest {
        self.digest
    }
}

impl fmt::Debug for ShardTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardTable")
            .field("shards", &self.shards)
            .field("replication_factor", &self.replication_factor)
            .field("members", &self.members.len())
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

/// One shard's placement, borrowed from a [`ShardTable`].
#[derive(Clone, Copy)]
pub struct ShardInfo<'a> {
    shard: ShardId,
    members: &'a [NodeId],
    owners: &'a [MemberIndex],
}

impl<'a> ShardInfo<'a> {
    /// The shard.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The member that leads the shard; `None` when the table has no members.
    pub fn leader(&self) -> Option<&'a NodeId> {
        self.owners.first().map(|&owner| &self.members[owner.get()])
    }

    /// All owners, leader first, then the followers in promotion order.
    pub fn replicas(&self) -> Replicas<'a> {
        Replicas {
            members: self.members,
            owners: self.owners.iter(),
        }
    }

    /// The owners other than the leader, in promotion order.
    pub fn followers(&self) -> Replicas<'a> {
        Replicas {
            members: self.members,
            owners: self.owners.get(1..).unwrap_or_default().iter(),
        }
    }

    /// Whether `member` is one of the owners.
    pub fn contains(&self, member: &NodeId) -> bool {
        self.replicas().any(|owner| owner == member)
    }

    /// Whether the shard has owners at all.
    pub fn is_assigned(&self) -> bool {
        !self.owners.is_empty()
    }
}

impl fmt::Debug for ShardInfo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardInfo")
            .field("shard", &self.shard)
            .field("leader", &self.leader())
            .field("replicas", &self.replicas().collect::<Vec<_>>())
            .finish()
    }
}

impl fmt::Display for ShardInfo<'_> {
    /// `shard 42: n3 n0 n7` (leader first), or `shard 42: unassigned`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}:", self.shard)?;
        if !self.is_assigned() {
            return f.write_str(" unassigned");
        }
        for owner in self.replicas() {
            write!(f, " {owner}")?;
        }
        Ok(())
    }
}

/// The owners of one shard, in order; see [`ShardInfo::replicas`].
#[derive(Debug, Clone)]
pub struct Replicas<'a> {
    members: &'a [NodeId],
    owners: std::slice::Iter<'a, MemberIndex>,
}

impl<'a> Iterator for Replicas<'a> {
    type Item = &'a NodeId;

    fn next(&mut self) -> Option<&'a NodeId> {
        self.owners.next().map(|owner| &self.members[owner.get()])
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.owners.size_hint()
    }
}

impl DoubleEndedIterator for Replicas<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.owners
            .next_back()
            .map(|owner| &self.members[owner.get()])
    }
}

impl ExactSizeIterator for Replicas<'_> {}

/// A blake3 digest of a [`ShardTable`]: equal digests mean equal tables.
///
/// The hashed encoding is a wire contract between nodes, versioned by its domain string:
/// `"slotring.shardtable.v1\0" ‖ u32_le(shards) ‖ u8(rf) ‖ u32_le(N) ‖ (u8(len) ‖ name)×N ‖
/// u32_le(width) ‖ u32_le(owner index)×(shards·width)`, members sorted by name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableDigest([u8; 32]);

impl TableDigest {
    fn compute(
        shards: ShardCount,
        replication_factor: ReplicationFactor,
        members: &[NodeId],
        width: usize,
        owners: &[MemberIndex],
    ) -> Self {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"slotring.shardtable.v1\0");
        hasher.update(&shards.get().to_le_bytes());
        hasher.update(&[replication_factor.get()]);
        // Member counts and indices fit in u32 (the ring checks), names in 64 bytes.
        hasher.update(&(members.len() as u32).to_le_bytes());
        for member in members {
            hasher.update(&[member.as_bytes().len() as u8]);
            hasher.update(member.as_bytes());
        }
        hasher.update(&(width as u32).to_le_bytes());
        let encoded: Vec<u8> = owners
            .iter()
            .flat_map(|owner| (owner.get() as u32).to_le_bytes())
            .collect();
        hasher.update(&encoded);
        TableDigest(*hasher.finalize().as_bytes())
    }

    /// A digest from its 32 bytes, as received from a peer.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        TableDigest(bytes)
    }

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for TableDigest {
    /// Lowercase hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for TableDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableDigest({self})")
    }
}
