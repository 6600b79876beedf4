//! The two placements: every shard's owners, computed from a token ring.

use topology::{MemberIndex, Token, TokenRing, Walk};

use crate::shard::ShardId;
use crate::spec::{LoadCaps, TableSpec};
use crate::table::ShardTable;

/// Builds [`ShardTable`]s for one [`TableSpec`], keeping what does not depend on membership
/// (every shard's ring position) so each membership change only walks the ring.
///
/// A node keeps one `Placer` for its cluster spec and calls [`Placer::place`] on every
/// membership change; [`ShardTable::new`] is the one-off shorthand.
#[derive(Debug, Clone)]
pub struct Placer {
    spec: TableSpec,
    /// `positions[s]` is shard `s`'s [`ShardId::position`].
    positions: Box<[Token]>,
}

impl Placer {
    /// A placer for `spec`; hashes every shard's position once.
    pub fn new(spec: TableSpec) -> Self {
        Placer {
            spec,
            positions: spec.shards.ids().map(ShardId::position).collect(),
        }
    }

    /// The spec tables are built for.
    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }

    /// The table for the members of `ring`.
    ///
    /// Every shard gets `min(RF, N)` distinct owners, leader first, then the others in the order
    /// the walk found them; with no members every shard is unassigned.
    pub fn place(&self, ring: &TokenRing) -> ShardTable {
        let width = usize::from(self.spec.replication_factor.get()).min(ring.len());
        let mut owners = Vec::with_capacity(self.positions.len() * width);
        if width > 0 {
            // A ring with members has tokens, so every position has a successor.
            let starts: Vec<usize> = self
                .positions
                .iter()
                .filter_map(|&position| ring.successor(position))
                .collect();
            // Only the bounded placement has caps.
            match self.spec.load_caps(ring.len()) {
                Some(caps) => place_bounded(ring, &starts, width, caps, &mut owners),
                None => place_plain(ring, &starts, width, &mut owners),
            }
        }
        ShardTable::from_parts(
            self.spec.shards,
            self.spec.replication_factor,
            ring.members().into(),
            width,
            owners.into(),
        )
    }
}

/// The plain walk: each shard's first `width` distinct members clockwise.
fn place_plain(ring: &TokenRing, starts: &[usize], width: usize, owners: &mut Vec<MemberIndex>) {
    let mut chosen = Vec::with_capacity(width);
    for &start in starts {
        chosen.clear();
        choose_distinct(ring.walk_from_index(start), &mut chosen, width, |_| true);
        owners.extend_from_slice(&chosen);
    }
}

/// The ring walk with bounded loads, exactly as DESIGN.md specifies it (the reference checksum
/// test pins it):
///
/// - Shards are placed in id order. The walk from a shard's position skips members already
///   holding `caps.memberships` shards until `width` distinct members are chosen. If fewer than
///   `width` members are under their cap, the walk takes all of them and fills the rest from the
///   plain walk, ignoring caps.
/// - The leader is the first chosen member leading fewer than `caps.leaderships` shards, or the
///   first chosen if all are at the cap; it moves to the front, the others keep walk order.
///
/// The leadership cap can thus be exceeded: when every chosen member already leads its cap's
/// worth, the first chosen leads one more. DESIGN.md's reference table (100 members) does this,
/// so the rule cannot change without changing the pinned checksum; see BENCHMARKS.md for how
/// often it happens.
fn place_bounded(
    ring: &TokenRing,
    starts: &[usize],
    width: usize,
    caps: LoadCaps,
    owners: &mut Vec<MemberIndex>,
) {
    let members = ring.len();
    let mut memberships = vec![0u32; members];
    let mut leaderships = vec![0u32; members];
    let mut under_cap = members;
    let mut chosen = Vec::with_capacity(width);
    for &start in starts {
        chosen.clear();
        // Once every member under its cap is found, the rest of the turn finds nothing more.
        let reachable = width.min(under_cap);
        choose_distinct(
            ring.walk_from_index(start),
            &mut chosen,
            reachable,
            |member| memberships[member.get()] < caps.memberships,
        );
        if chosen.len() < width {
            choose_distinct(ring.walk_from_index(start), &mut chosen, width, |_| true);
        }
        let leader_at = chosen
            .iter()
            .position(|member| leaderships[member.get()] < caps.leaderships)
            .unwrap_or(0);
        chosen[..=leader_at].rotate_right(1);
        leaderships[chosen[0].get()] += 1;
        for member in &chosen {
            let held = &mut memberships[member.get()];
            *held += 1;
            if *held == caps.memberships {
                under_cap -= 1;
            }
        }
        owners.extend_from_slice(&chosen);
    }
}

/// Appends to `chosen` the members of `walk` that are not in it yet and that `eligible` accepts,
/// until it holds `wanted` or the walk ends.
fn choose_distinct(
    walk: Walk<'_>,
    chosen: &mut Vec<MemberIndex>,
    wanted: usize,
    eligible: impl Fn(MemberIndex) -> bool,
) {
    if chosen.len() >= wanted {
        return;
    }
    for (_, member) in walk {
        if eligible(member) && !chosen.contains(&member) {
            chosen.push(member);
            if chosen.len() == wanted {
                return;
            }
        }
    }
}
