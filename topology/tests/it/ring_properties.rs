//! Property tests: the ring is a pure function of the member set, and walks are correct.

use proptest::prelude::*;
use topology::{NodeId, Token, TokenRing, VnodeCount};

fn node_names() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[a-z0-9.-]{1,12}", 0..12)
}

fn ids(names: &[String]) -> Vec<NodeId> {
    names.iter().map(|name| name.parse().unwrap()).collect()
}

fn vnodes() -> impl Strategy<Value = VnodeCount> {
    (1u32..24).prop_map(|count| VnodeCount::new(count).unwrap())
}

proptest! {
    #[test]
    fn insertion_order_never_matters(names in node_names(), vnodes in vnodes(), seed in any::<u64>()) {
        let members = ids(&names);
        let built = TokenRing::from_members(vnodes, members.clone());
        let mut shuffled = members.clone();
        shuffle(&mut shuffled, seed);
        let mut inserted = TokenRing::new(vnodes);
        for member in shuffled {
            inserted.insert(member);
        }
        prop_assert_eq!(&inserted, &built);
    }

    #[test]
    fn removing_a_member_equals_never_adding_it(names in node_names(), vnodes in vnodes(), pick in any::<prop::sample::Index>()) {
        let members = ids(&names);
        prop_assume!(!members.is_empty());
        let gone = members[pick.index(members.len())].clone();
        let mut ring = TokenRing::from_members(vnodes, members.clone());
        prop_assert!(ring.remove(&gone));
        let without = TokenRing::from_members(vnodes, members.into_iter().filter(|m| *m != gone));
        prop_assert_eq!(ring, without);
    }

    #[test]
    fn first_distinct_is_the_walk_deduplicated(names in node_names(), vnodes in vnodes(), position in any::<u64>(), k in 0usize..20) {
        let ring = TokenRing::from_members(vnodes, ids(&names));
        let found = ring.first_distinct(Token::new(position), k);
        let mut expected: Vec<&NodeId> = Vec::new();
        for (_, owner) in ring.walk(Token::new(position)) {
            let owner = ring.member(owner);
            if expected.len() < k && !expected.contains(&owner) {
                expected.push(owner);
            }
        }
        prop_assert_eq!(found.len(), k.min(ring.len()));
        prop_assert_eq!(found, expected);
    }

    #[test]
    fn walk_starts_at_the_first_token_at_or_after_the_position(names in node_names(), vnodes in vnodes(), position in any::<u64>()) {
        let ring = TokenRing::from_members(vnodes, ids(&names));
        let walked: Vec<Token> = ring.walk(Token::new(position)).map(|(token, _)| token).collect();
        prop_assert_eq!(walked.len(), ring.token_count());
        if let Some(&first) = walked.first() {
            let expected = ring
                .iter()
                .map(|(token, _)| token)
                .find(|token| token.get() >= position)
                .or_else(|| ring.iter().next().map(|(token, _)| token));
            prop_assert_eq!(Some(first), expected);
        }
    }
}

#[test]
fn memory_per_vnode_is_at_most_16_bytes() {
    let vnodes = VnodeCount::DEFAULT;
    let members = (0..1000).map(|i| NodeId::new(&format!("node-{i}")).unwrap());
    let built = TokenRing::from_members(vnodes, members.clone());
    let mut inserted = TokenRing::new(vnodes);
    for member in members {
        inserted.insert(member);
    }
    for ring in [built, inserted] {
        let per_vnode = ring.token_heap_bytes() as f64 / ring.token_count() as f64;
        assert!(per_vnode <= 16.0, "{per_vnode} bytes per vnode");
    }
}

/// A Fisher–Yates shuffle driven by a splitmix64 stream, so the test needs no RNG crate.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        items.swap(i, (z % (i as u64 + 1)) as usize);
    }
}
