//! [`TableDiff`]: what a membership change moves, shard by shard.

use std::collections::HashMap;

use topology::{MemberIndex, NodeId};

use crate::error::Error;
use crate::shard::ShardId;
use crate::table::ShardTable;

/// The differences between two tables of the same spec: members that joined and left, and
/// every shard whose owners or their order changed. This is the input of handoff: each change
/// is a shard to move.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableDiff {
    /// Members of the new table only, sorted.
    pub joined: Vec<NodeId>,
    /// Members of the old table only, sorted.
    pub left: Vec<NodeId>,
    /// The changed shards, in id order.
    pub changes: Vec<ShardChange>,
}

/// One shard whose owners changed; `before` and `after` list them leader first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardChange {
    /// The shard.
    pub shard: ShardId,
    /// The owners in the old table.
    pub before: Vec<NodeId>,
    /// The owners in the new table.
    pub after: Vec<NodeId>,
}

/// What changed from `old` to `new`; see [`TableDiff::between`].
pub fn diff(old: &ShardTable, new: &ShardTable) -> Result<TableDiff, Error> {
    TableDiff::between(old, new)
}

impl TableDiff {
    /// What changed from `old` to `new`. Fails with [`Error::IncompatibleTables`] if their shard
    /// counts or replication factors differ: such tables belong to different clusters.
    pub fn between(old: &ShardTable, new: &ShardTable) -> Result<Self, Error> {
        if old.shard_count() != new.shard_count() {
            return Err(Error::IncompatibleTables {
                reason: format!(
                    "{} shards against {} shards",
                    old.shard_count(),
                    new.shard_count()
                ),
            });
        }
        if old.replication_factor() != new.replication_factor() {
            return Err(Error::IncompatibleTables {
                reason: format!(
                    "replication factor {} against {}",
                    old.replication_factor(),
                    new.replication_factor()
                ),
            });
        }
        let only_in = |these: &[NodeId], those: &[NodeId]| -> Vec<NodeId> {
            these
                .iter()
                .filter(|member| those.binary_search(member).is_err())
                .cloned()
                .collect()
        };
        let changes = old
            .iter()
            .zip(new.iter())
            .filter(|(before, after)| !before.replicas().eq(after.replicas()))
            .map(|(before, after)| ShardChange {
                shard: before.shard(),
                before: before.replicas().cloned().collect(),
                after: after.replicas().cloned().collect(),
            })
            .collect();
        Ok(TableDiff {
            joined: only_in(new.members(), old.members()),
            left: only_in(old.members(), new.members()),
            changes,
        })
    }

    /// Whether the two tables were equal.
    pub fn is_empty(&self) -> bool {
        self.joined.is_empty() && self.left.is_empty() && self.changes.is_empty()
    }

    /// How many shards changed leader.
    pub fn leaders_changed(&self) -> usize {
        self.changes
            .iter()
            .filter(|change| change.leader_changed())
            .count()
    }

    /// How many shards changed which members hold them (ignoring order).
    pub fn replica_sets_changed(&self) -> usize {
        self.changes
            .iter()
            .filter(|change| change.replica_set_changed())
            .count()
    }

    /// How many shard copies a member that was already in the old table gains: copies moved
    /// between two old members rather than to a newcomer.
    pub fn copies_moved_between_old_members(&self) -> usize {
        self.changes
            .iter()
            .flat_map(ShardChange::added)
            .filter(|member| self.joined.binary_search(member).is_err())
            .count()
    }
}

impl ShardChange {
    /// The old leader; `None` if the shard had no owners.
    pub fn old_leader(&self) -> Option<&NodeId> {
        self.before.first()
    }

    /// The new leader; `None` if the shard has no owners.
    pub fn new_leader(&self) -> Option<&NodeId> {
        self.after.first()
    }

    /// Whether the leader changed.
    pub fn leader_changed(&self) -> bool {
        self.old_leader() != self.new_leader()
    }

    /// Owners in `after` but not in `before`: copies to create.
    pub fn added(&self) -> impl Iterator<Item = &NodeId> {
        self.after
            .iter()
            .filter(|member| !self.before.contains(member))
    }

    /// Owners in `before` but not in `after`: copies to retire.
    pub fn removed(&self) -> impl Iterator<Item = &NodeId> {
        self.before
            .iter()
            .filter(|member| !self.after.contains(member))
    }

    /// Whether the set of owners changed, not just their order.
    pub fn replica_set_changed(&self) -> bool {
        self.added().next().is_some() || self.removed().next().is_some()
    }
}

impl ShardTable {
    /// The table `diff` leads to from this one: `old.apply(&diff(&old, &new)?)` equals `new`.
    ///
    /// Fails with [`Error::DiffDoesNotApply`], changing nothing, if `diff` was made from another
    /// table: a member that joins twice or leaves without being one, a change whose `before`
    /// is not this table's, or owners that are not members of the result.
    pub fn apply(&self, diff: &TableDiff) -> Result<ShardTable, Error> {
        let mismatch = |reason: String| Error::DiffDoesNotApply { reason };
        let mut members: Vec<NodeId> = self.members().to_vec();
        for gone in &diff.left {
            let at = members
                .binary_search(gone)
                .map_err(|_| mismatch(format!("{gone} leaves but is not a member")))?;
            members.remove(at);
        }
        for newcomer in &diff.joined {
            let at = members
                .binary_search(newcomer)
                .err()
                .ok_or_else(|| mismatch(format!("{newcomer} joins but is already a member")))?;
            members.insert(at, newcomer.clone());
        }
        let index_of: HashMap<&NodeId, MemberIndex> = (0u32..)
            .zip(&members)
            .map(|(at, member)| (member, MemberIndex::new(at)))
            .collect();
        let lookup = |member: &NodeId, shard: ShardId| {
            index_of
                .get(member)
                .copied()
                .ok_or_else(|| mismatch(format!("shard {shard}: {member} is not a member")))
        };

        let shards = self.shard_count();
        // Every table gives all shards the same number of owners, so a change of width
        // changes every shard.
        let width = match diff.changes.first() {
            Some(change) if diff.changes.len() == shards.len() => change.after.len(),
            _ => self.width(),
        };
        let mut owners = Vec::with_capacity(shards.len() * width);
        let mut changes = diff.changes.iter().peekable();
        for shard in shards.ids() {
            let start = owners.len();
            match changes.next_if(|change| change.shard == shard) {
                Some(change) => {
                    let before = self.shard_info(shard)?;
                    if !before.replicas().eq(&change.before) {
                        return Err(mismatch(format!(
                            "shard {shard} has other owners than the diff's before"
                        )));
                    }
                    if change.after.len() != width {
                        return Err(mismatch(format!(
                            "shard {shard} gets {} owners, not {width}",
                            change.after.len()
                        )));
                    }
                    for member in &change.after {
                        owners.push(lookup(member, shard)?);
                    }
                }
                None => {
                    for member in self.shard_info(shard)?.replicas() {
                        owners.push(lookup(member, shard)?);
                    }
                }
            }
            let placed = &owners[start..];
            if (1..placed.len()).any(|i| placed[..i].contains(&placed[i])) {
                return Err(mismatch(format!("shard {shard} lists an owner twice")));
            }
        }
        if let Some(change) = changes.next() {
            return Err(mismatch(format!(
                "change of shard {} is out of order or out of range",
                change.shard
            )));
        }
        Ok(ShardTable::from_parts(
            shards,
            self.replication_factor(),
            members.into(),
            width,
            owners.into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use topology::{TokenRing, VnodeCount};

    use super::*;
    use crate::spec::TableSpec;

    fn table(names: &[&str]) -> ShardTable {
        let members = names.iter().map(|name| name.parse::<NodeId>().unwrap());
        let ring = TokenRing::from_members(VnodeCount::new(16).unwrap(), members);
        ShardTable::new(&TableSpec::default(), &ring)
    }

    #[test]
    fn a_diff_lists_leaders_and_copies_moved() {
        let old = table(&["a", "b", "c"]);
        let new = table(&["a", "b", "c", "d"]);
        let diff = diff(&old, &new).unwrap();
        assert_eq!(diff.joined, ["d".parse::<NodeId>().unwrap()]);
        assert!(diff.left.is_empty());
        assert!(!diff.changes.is_empty());
        for change in &diff.changes {
            assert_eq!(
                change.before,
                old.shard_info(change.shard)
                    .unwrap()
                    .replicas()
                    .cloned()
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                change.after,
                new.shard_info(change.shard)
                    .unwrap()
                    .replicas()
                    .cloned()
                    .collect::<Vec<_>>()
            );
            assert_eq!(change.added().count(), change.removed().count());
        }
        assert_eq!(old.apply(&diff).unwrap(), new);
    }

    #[test]
    fn a_diff_from_another_table_does_not_apply() {
        let old = table(&["a", "b", "c"]);
        let new = table(&["a", "b", "c", "d"]);
        let other = table(&["a", "b", "e"]);
        let diff = diff(&old, &new).unwrap();
        assert!(matches!(
            other.apply(&diff),
            Err(Error::DiffDoesNotApply { .. })
        ));
        let mut shuffled = diff.clone();
        shuffled.changes.reverse();
        if shuffled.changes.len() > 1 {
            assert!(matches!(
                old.apply(&shuffled),
                Err(Error::DiffDoesNotApply { .. })
            ));
        }
    }

    #[test]
    fn tables_of_other_specs_are_not_comparable() {
        let members = ["a", "b"].map(|name| name.parse::<NodeId>().unwrap());
        let ring = TokenRing::from_members(VnodeCount::new(16).unwrap(), members);
        let small = TableSpec {
            shards: crate::ShardCount::new(8).unwrap(),
            ..TableSpec::default()
        };
        let err = diff(
            &ShardTable::new(&small, &ring),
            &ShardTable::new(&TableSpec::default(), &ring),
        );
        assert_eq!(
            err.unwrap_err().to_string(),
            "tables are not comparable: 8 shards against 1024 shards"
        );
    }
}
