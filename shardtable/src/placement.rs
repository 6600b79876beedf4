//! The two placements: every shard's owners, computed from a token ring.

use topology::{MemberIndex, Token, TokenRing, Walk};

use crate::shard::ShardId;
use crate::spec::{Epsilon, Placement, TableSpec};
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
            match self.spec.placement {
                Placement::Ring => place_plain(ring, &starts, width, &mut owners),
                Placement::Bounded { epsilon } => {
                    place_bounded(ring, &starts, width, epsilon, &mut owners);
                }
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
///   holding `cap_mem` memberships until `width` distinct members are chosen. If fewer than
///   `width` members are under their cap, the walk takes all of them and fills the rest from the
///   plain walk, ignoring caps.
/// - The leader is the first chosen member holding fewer than `cap_lead` leaderships, or the
///   first chosen if all are at the cap; it moves to the front, the others keep walk order.
fn place_bounded(
    ring: &TokenRing,
    starts: &[usize],
    width: usize,
    epsilon: Epsilon,
    owners: &mut Vec<MemberIndex>,
) {
    let members = ring.len();
    let shards = starts.len();
    let cap_membership = load_cap(shards * width, members, epsilon);
    let cap_leadership = load_cap(shards, members, epsilon);
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
            |member| memberships[member.get()] < cap_membership,
        );
        if chosen.len() < width {
            choose_distinct(ring.walk_from_index(start), &mut chosen, width, |_| true);
        }
        for member in &chosen {
            let held = &mut memberships[member.get()];
            *held += 1;
            if *held == cap_membership {
                under_cap -= 1;
            }
        }
        let leader_at = chosen
            .iter()
            .position(|member| leaderships[member.get()] < cap_leadership)
            .unwrap_or(0);
        leaderships[chosen[leader_at].get()] += 1;
        chosen[..=leader_at].rotate_right(1);
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

/// The most of `total` units one of `members` may hold:
/// `max(ceil((1000 + ε‰) · total / (1000 · members)), ceil(total / members))`, in integers so
/// every node and language computes the same cap.
pub(crate) fn load_cap(total: usize, members: usize, epsilon: Epsilon) -> u32 {
    let (total, members) = (total as u64, members as u64);
    let slack = (1000 + u64::from(epsilon.permille())) * total;
    let cap = slack.div_ceil(1000 * members).max(total.div_ceil(members));
    // total ≤ 2^16 shards × 16 copies, so the cap fits in u32.
    cap as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_match_design_md_at_ten_members() {
        let epsilon = Epsilon::DEFAULT;
        assert_eq!(load_cap(1024, 10, epsilon), 113);
        assert_eq!(load_cap(1024 * 3, 10, epsilon), 338);
        assert_eq!(load_cap(1024 * 3, 100, epsilon), 34);
        // ε = 0 caps at the ceiling of the mean.
        assert_eq!(load_cap(1024, 10, Epsilon::from_permille(0).unwrap()), 103);
    }
}
