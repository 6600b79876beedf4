//! Property tests of placement, diffs and digests over random member sets and specs.
//!
//! A failure prints the minimal failing input, and proptest saves its seed under
//! `shardtable/tests/proptest-regressions/`, replaying it first on the next run of
//! `cargo test -p shardtable --test it properties::` (commit that file with the fix).
//! `PROPTEST_CASES=5000` runs more cases.

use proptest::prelude::*;
use shardtable::{Epsilon, Placement, ReplicationFactor, ShardCount, ShardTable, TableSpec, diff};
use topology::{NodeId, TokenRing, VnodeCount};

/// Member names from a small space, so that two sets overlap and duplicates happen.
fn members() -> impl Strategy<Value = Vec<NodeId>> {
    proptest::collection::vec(
        (0u8..60).prop_map(|n| NodeId::new(&format!("n{n}")).unwrap()),
        0..24,
    )
}

fn placement() -> impl Strategy<Value = Placement> {
    prop_oneof![
        Just(Placement::Ring),
        prop::sample::select(vec![0u16, 50, 100, 250, 1000]).prop_map(|permille| {
            Placement::Bounded {
                epsilon: Epsilon::from_permille(permille).unwrap(),
            }
        }),
    ]
}

fn spec() -> impl Strategy<Value = TableSpec> {
    (1u32..300, 1u8..=5, placement()).prop_map(|(shards, copies, placement)| TableSpec {
        shards: ShardCount::new(shards).unwrap(),
        replication_factor: ReplicationFactor::new(copies).unwrap(),
        placement,
    })
}

fn vnodes() -> impl Strategy<Value = VnodeCount> {
    (1u32..48).prop_map(|count| VnodeCount::new(count).unwrap())
}

fn table(spec: &TableSpec, vnodes: VnodeCount, members: &[NodeId]) -> ShardTable {
    ShardTable::new(
        spec,
        &TokenRing::from_members(vnodes, members.iter().cloned()),
    )
}

fn distinct(members: &[NodeId]) -> Vec<NodeId> {
    let mut distinct = members.to_vec();
    distinct.sort();
    distinct.dedup();
    distinct
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn same_table_for_any_order_and_duplicates(spec in spec(), vnodes in vnodes(), members in members(), rotate in any::<prop::sample::Index>()) {
        let expected = table(&spec, vnodes, &members);
        let mut reordered = members.clone();
        reordered.reverse();
        if !reordered.is_empty() {
            let by = rotate.index(reordered.len());
            reordered.rotate_left(by);
            reordered.push(reordered[0].clone());
        }
        let mut ring = TokenRing::new(vnodes);
        for member in reordered {
            ring.insert(member);
        }
        prop_assert_eq!(ShardTable::new(&spec, &ring), expected);
    }

    #[test]
    fn every_shard_has_min_rf_n_distinct_members_leader_first(spec in spec(), vnodes in vnodes(), members in members()) {
        let members = distinct(&members);
        let table = table(&spec, vnodes, &members);
        let width = usize::from(spec.replication_factor.get()).min(members.len());
        prop_assert_eq!(table.iter().len(), spec.shards.len());
        for info in table.iter() {
            let owners: Vec<&NodeId> = info.replicas().collect();
            prop_assert_eq!(owners.len(), width);
            prop_assert_eq!(distinct(&owners.iter().map(|&o| o.clone()).collect::<Vec<_>>()).len(), width);
            prop_assert!(owners.iter().all(|owner| members.contains(owner)));
            prop_assert_eq!(info.leader(), owners.first().copied());
            prop_assert_eq!(info.is_assigned(), width > 0);
            if members.len() <= usize::from(spec.replication_factor.get()) {
                prop_assert_eq!(distinct(&owners.iter().map(|&o| o.clone()).collect::<Vec<_>>()), members.clone());
            }
        }
    }

    /// Replays the table in shard order with running counts: a member may go over its
    /// membership cap only when fewer than `width` members were under it (the walk must fall
    /// back to the plain walk), and a leader may go over its leadership cap only when every owner
    /// of that shard was already at it (DESIGN.md's "else the first chosen").
    #[test]
    fn bounded_placement_exceeds_its_caps_only_when_forced(spec in spec(), vnodes in vnodes(), members in members()) {
        let table = table(&spec, vnodes, &members);
        let Some(caps) = spec.load_caps(table.members().len()) else {
            return Ok(());
        };
        let index = |member: &NodeId| table.members().binary_search(member).unwrap();
        let mut held = vec![0u32; table.members().len()];
        let mut led = vec![0u32; table.members().len()];
        for info in table.iter() {
            let under_membership_cap = held.iter().filter(|&&h| h < caps.memberships).count();
            for owner in info.replicas() {
                prop_assert!(
                    held[index(owner)] < caps.memberships || under_membership_cap < table.width(),
                    "{info}: {owner} is over {caps:?} while {under_membership_cap} members are under it"
                );
            }
            let leader = index(info.leader().unwrap());
            prop_assert!(
                led[leader] < caps.leaderships
                    || info.replicas().all(|owner| led[index(owner)] >= caps.leaderships),
                "{info}: the leader is over {caps:?} while another owner is under it"
            );
            led[leader] += 1;
            for owner in info.replicas() {
                held[index(owner)] += 1;
            }
        }
        prop_assert_eq!(held, table.membership_counts());
        prop_assert_eq!(led, table.leader_counts());
    }

    #[test]
    fn plain_walk_join_never_moves_a_shard_between_old_members(spec in spec(), vnodes in vnodes(), members in members(), newcomer in 60u8..90) {
        let spec = TableSpec { placement: Placement::Ring, ..spec };
        let newcomer = NodeId::new(&format!("n{newcomer}")).unwrap();
        let old = table(&spec, vnodes, &members);
        let mut grown = members.clone();
        grown.push(newcomer.clone());
        let new = table(&spec, vnodes, &grown);
        let diff = diff(&old, &new).unwrap();
        prop_assert_eq!(diff.copies_moved_between_old_members(), 0);
        for change in &diff.changes {
            prop_assert!(change.added().all(|member| *member == newcomer), "{change:?}");
            let leader = change.new_leader();
            prop_assert!(leader == change.old_leader() || leader == Some(&newcomer), "{change:?}");
        }
    }

    #[test]
    fn applying_the_diff_gives_the_new_table(spec in spec(), vnodes in vnodes(), a in members(), b in members()) {
        let old = table(&spec, vnodes, &a);
        let new = table(&spec, vnodes, &b);
        let diff = diff(&old, &new).unwrap();
        prop_assert_eq!(diff.is_empty(), old == new);
        prop_assert_eq!(old.apply(&diff).unwrap(), new);
    }

    #[test]
    fn digest_changes_iff_the_table_changes(spec in spec(), vnodes in vnodes(), a in members(), b in members(), tweak in any::<prop::sample::Index>()) {
        let one = table(&spec, vnodes, &a);
        let other = table(&spec, vnodes, &b);
        prop_assert_eq!(one == other, one.digest() == other.digest());
        prop_assert_eq!(table(&spec, vnodes, &a).digest(), one.digest());

        // A single swap of two owners of one shard is a different table with another digest.
        if one.width() >= 2 {
            let shard = spec.shards.ids().nth(tweak.index(spec.shards.len())).unwrap();
            let mut swapped: Vec<NodeId> = one.shard_info(shard).unwrap().replicas().cloned().collect();
            swapped.swap(0, 1);
            let change = shardtable::ShardChange {
                shard,
                before: one.shard_info(shard).unwrap().replicas().cloned().collect(),
                after: swapped,
            };
            let tweaked = one.apply(&shardtable::TableDiff { changes: vec![change], ..Default::default() }).unwrap();
            prop_assert_ne!(&tweaked, &one);
            prop_assert_ne!(tweaked.digest(), one.digest());
        }
    }
}

#[test]
fn no_members_leaves_every_shard_unassigned() {
    let table = table(&TableSpec::default(), VnodeCount::DEFAULT, &[]);
    assert_eq!(table.width(), 0);
    assert!(
        table
            .iter()
            .all(|info| !info.is_assigned() && info.leader().is_none())
    );
    assert_eq!(
        table
            .shard_info(shardtable::ShardId::new(42))
            .unwrap()
            .to_string(),
        "shard 42: unassigned"
    );
    assert!(table.shard_info(shardtable::ShardId::new(1024)).is_err());
}

#[test]
fn one_member_holds_everything() {
    let only = NodeId::new("solo").unwrap();
    let table = table(
        &TableSpec::default(),
        VnodeCount::DEFAULT,
        &[only.clone(), only.clone()],
    );
    assert_eq!(table.members(), std::slice::from_ref(&only));
    assert!(
        table
            .iter()
            .all(|info| info.leader() == Some(&only) && info.replicas().len() == 1)
    );
    assert_eq!(table.leader_counts(), [1024]);
}
