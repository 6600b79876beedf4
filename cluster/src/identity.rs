//! A member's SWIM identity: who it is, where it listens, which incarnation of its process.

use core::net::SocketAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use topology::NodeId;

use crate::spec::SpecFingerprint;

/// What a member gossips about itself. Two identities with the same `node_id` are the same node
/// in different lives; the higher `generation` wins.
///
/// The identity deliberately carries only fixed-size facts (plus the name): it rides in every
/// SWIM packet header. The spec travels as a fingerprint, so a member of another cluster shape
/// can be told apart without shipping the whole spec.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The operator-visible name; the member's ring tokens derive from it.
    #[serde(with = "node_id_serde")]
    pub node_id: NodeId,
    /// The QUIC address the member listens on.
    pub addr: SocketAddr,
    /// Bumped on every process start (persisted) and on every renewal after being declared
    /// down, so a new life always wins over the old one.
    pub generation: u64,
    /// The fingerprint of the member's cluster spec.
    pub spec: SpecFingerprint,
    /// The member's software and protocol version.
    pub meta: NodeMeta,
}

/// Small facts about a member's software, carried in membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeMeta {
    /// The wire protocol version the member speaks ([`crate::wire::WIRE_VERSION`]).
    pub protocol: u16,
    /// The member's storage (created with its data dir): with the node id, what a shard's
    /// config names (a wiped node is a new member).
    pub storage: crate::replica::StorageId,
    /// The member is being decommissioned (`node leave`): placement leaves it out, so every
    /// replica it holds moves to the others, and it leaves once it holds none.
    pub draining: bool,
}

impl NodeMeta {
    /// This software's meta for a node whose data dir holds `storage`.
    pub fn new(storage: crate::replica::StorageId) -> Self {
        NodeMeta {
            protocol: crate::wire::WIRE_VERSION,
            storage,
            draining: false,
        }
    }
}

impl Default for NodeMeta {
    fn default() -> Self {
        NodeMeta::new(crate::replica::StorageId(0))
    }
}

impl foca::Identity for Identity {
    /// The node id: a restarted node (new generation, maybe a new address) replaces its old
    /// identity instead of conflicting with it.
    type Addr = NodeId;

    fn renew(&self) -> Option<Self> {
        Some(Identity {
            generation: self.generation + 1,
            ..self.clone()
        })
    }

    fn addr(&self) -> NodeId {
        self.node_id.clone()
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.generation, self.addr) > (adversary.generation, adversary.addr)
    }
}

/// Serde for [`NodeId`]: a string, validated when decoded so peer bytes can never make an
/// invalid name.
pub(crate) mod node_id_serde {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(id: &NodeId, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(id.as_str())
    }

    /// Parses the name in place (no copy of it first), so that a name [`NodeId::new`] made
    /// recently costs no allocation at all.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<NodeId, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = NodeId;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a node id")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<NodeId, E> {
                NodeId::new(name).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Name)
    }
}
