//! The cluster spec: what every member must agree on, fixed when the first node bootstraps.

use std::fmt;

use serde::{Deserialize, Serialize};
use shardtable::{Epsilon, Placement, ReplicationFactor, ShardCount, TableSpec};
use topology::VnodeCount;

use crate::Error;

/// Everything the members of one cluster must agree on: the shard table's shape and the ring's
/// vnode count, plus the name and random id that tell clusters apart.
///
/// Fixed by the node that bootstraps the cluster, adopted and persisted by every joiner. A node
/// whose spec differs is refused (see [`ClusterSpec::differences`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterSpec {
    /// Operator-chosen name, shown in refusals.
    pub cluster_name: String,
    /// Chosen at random when the cluster is bootstrapped; two clusters with the same name and
    /// shape still differ here.
    pub cluster_id: u64,
    /// Shard count, replication factor and placement rule.
    pub table: TableSpec,
    /// Vnodes per member on the token ring.
    pub vnodes: VnodeCount,
}

/// The 64-bit fingerprint of a [`ClusterSpec`], carried in every member's SWIM identity so a
/// member with another spec is never placed on the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SpecFingerprint(pub u64);

impl fmt::Display for SpecFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The longest cluster name, in bytes.
pub const MAX_CLUSTER_NAME_LEN: usize = 64;

impl ClusterSpec {
    /// A spec from its parts, checking the name (1–64 bytes, no control characters).
    pub fn new(
        cluster_name: &str,
        cluster_id: u64,
        table: TableSpec,
        vnodes: VnodeCount,
    ) -> Result<Self, Error> {
        if cluster_name.is_empty()
            || cluster_name.len() > MAX_CLUSTER_NAME_LEN
            || cluster_name.chars().any(char::is_control)
        {
            return Err(Error::InvalidSpec {
                problem: format!(
                    "cluster name must be 1 to {MAX_CLUSTER_NAME_LEN} bytes without control characters"
                ),
            });
        }
        Ok(ClusterSpec {
            cluster_name: cluster_name.to_owned(),
            cluster_id,
            table,
            vnodes,
        })
    }

    /// The fingerprint: the first 8 bytes of blake3 over the canonical encoding.
    pub fn fingerprint(&self) -> SpecFingerprint {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"slotring.spec.v1\0");
        hasher.update(&(self.cluster_name.len() as u32).to_le_bytes());
        hasher.update(self.cluster_name.as_bytes());
        hasher.update(&self.cluster_id.to_le_bytes());
        let wire = WireSpec::from(self);
        hasher.update(&wire.shards.to_le_bytes());
        hasher.update(&[wire.replication_factor]);
        hasher.update(&wire.vnodes.to_le_bytes());
        hasher.update(&[u8::from(wire.epsilon_permille.is_some())]);
        hasher.update(&wire.epsilon_permille.unwrap_or(0).to_le_bytes());
        let bytes = hasher.finalize();
        let mut first = [0; 8];
        first.copy_from_slice(&bytes.as_bytes()[..8]);
        SpecFingerprint(u64::from_le_bytes(first))
    }

    /// Each field on which `other` differs from `self`, phrased for an operator, e.g.
    /// `shards: this node has 512, the cluster has 1024`. Empty when the specs are equal.
    pub fn differences(&self, mine: &str, theirs: &str, other: &ClusterSpec) -> Vec<String> {
        let mut found = Vec::new();
        let mut compare = |field: &str, ours: String, other: String| {
            if ours != other {
                found.push(format!("{field}: {mine} has {ours}, {theirs} has {other}"));
            }
        };
        compare(
            "cluster name",
            self.cluster_name.clone(),
            other.cluster_name.clone(),
        );
        compare(
            "cluster id",
            format!("{:016x}", self.cluster_id),
            format!("{:016x}", other.cluster_id),
        );
        compare(
            "shards",
            self.table.shards.to_string(),
            other.table.shards.to_string(),
        );
        compare(
            "replication factor",
            self.table.replication_factor.to_string(),
            other.table.replication_factor.to_string(),
        );
        compare(
            "placement",
            self.table.placement.to_string(),
            other.table.placement.to_string(),
        );
        compare(
            "vnodes",
            self.vnodes.get().to_string(),
            other.vnodes.get().to_string(),
        );
        found
    }
}

impl fmt::Display for ClusterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cluster {} ({:016x}): {} shards, rf {}, {} vnodes, placement {}",
            self.cluster_name,
            self.cluster_id,
            self.table.shards,
            self.table.replication_factor,
            self.vnodes.get(),
            self.table.placement,
        )
    }
}

/// The wire and disk form of a [`ClusterSpec`]: plain numbers, checked when converted back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSpec {
    /// See [`ClusterSpec::cluster_name`].
    pub cluster_name: String,
    /// See [`ClusterSpec::cluster_id`].
    pub cluster_id: u64,
    /// Shard count.
    pub shards: u32,
    /// Replication factor.
    pub replication_factor: u8,
    /// Vnodes per member.
    pub vnodes: u32,
    /// `None` for the plain ring walk, else the bounded walk's ε in per-mille.
    pub epsilon_permille: Option<u16>,
}

impl From<&ClusterSpec> for WireSpec {
    fn from(spec: &ClusterSpec) -> Self {
        WireSpec {
            cluster_name: spec.cluster_name.clone(),
            cluster_id: spec.cluster_id,
            shards: spec.table.shards.get(),
            replication_factor: spec.table.replication_factor.get(),
            vnodes: spec.vnodes.get(),
            epsilon_permille: spec.table.placement.epsilon().map(Epsilon::permille),
        }
    }
}

impl TryFrom<WireSpec> for ClusterSpec {
    type Error = Error;

    fn try_from(wire: WireSpec) -> Result<Self, Error> {
        let invalid = |problem: String| Error::InvalidSpec { problem };
        let shards = ShardCount::new(wire.shards).map_err(|e| invalid(e.to_string()))?;
        let replication_factor =
            ReplicationFactor::new(wire.replication_factor).map_err(|e| invalid(e.to_string()))?;
        let vnodes = VnodeCount::new(wire.vnodes).map_err(|e| invalid(e.to_string()))?;
        let placement = match wire.epsilon_permille {
            None => Placement::Ring,
            Some(permille) => Placement::Bounded {
                epsilon: Epsilon::from_permille(permille).map_err(|e| invalid(e.to_string()))?,
            },
        };
        let table = TableSpec {
            shards,
            replication_factor,
            placement,
        };
        ClusterSpec::new(&wire.cluster_name, wire.cluster_id, table, vnodes)
    }
}

impl Serialize for ClusterSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WireSpec::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ClusterSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireSpec::deserialize(deserializer)?;
        ClusterSpec::try_from(wire).map_err(serde::de::Error::custom)
    }
}
