//! [`TokenRing`]: the sorted vnode tokens of the live members, and walks around it.

use std::fmt;

use crate::node_id::NodeId;
use crate::token::{Token, VnodeCount};
use crate::token_batch::vnode_tokens;

/// A member's position in [`TokenRing::members`], which is sorted by [`NodeId`].
///
/// Indices are only meaningful for the ring that produced them: inserting or removing a member
/// renumbers the members after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberIndex(u32);

impl MemberIndex {
    /// The index of the `index`-th member of some ring's [`TokenRing::members`], for tables
    /// that keep a copy of that member list.
    pub const fn new(index: u32) -> Self {
        MemberIndex(index)
    }

    /// The index as a `usize`, for indexing a slice parallel to [`TokenRing::members`].
    pub const fn get(self) -> usize {
        self.0 as usize
    }
}

/// The vnode tokens of the live members, sorted clockwise.
///
/// Each member owns [`VnodeCount`] tokens at [`Token::of_vnode`]. Entries are ordered by token,
/// and equal tokens by [`NodeId`], so the ring is a pure function of the member *set*: inserting
/// the same members in any order, or building them all at once with
/// [`TokenRing::from_members`], gives equal rings.
///
/// Inserting a member hashes only that member's tokens and merges them in; removing one hashes
/// nothing. Each vnode costs 12 bytes (an 8-byte token and a 4-byte owner index in two parallel
/// arrays).
///
/// The ring holds no opinion on liveness: callers insert the members they consider alive. It
/// does not place shards or replicas (that is `shardtable`), and it never allocates per walk.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenRing {
    vnodes: VnodeCount,
    /// Members, sorted and distinct. `MemberIndex(i)` names `members[i]`.
    members: Vec<NodeId>,
    /// All vnode tokens, sorted by `(token, owner)`.
    tokens: Vec<u64>,
    /// `owners[i]` is the member index owning `tokens[i]`.
    owners: Vec<u32>,
}

impl TokenRing {
    /// An empty ring whose members will each own `vnodes` tokens.
    pub fn new(vnodes: VnodeCount) -> Self {
        TokenRing {
            vnodes,
            members: Vec::new(),
            tokens: Vec::new(),
            owners: Vec::new(),
        }
    }

    /// A ring of `members`, built in one pass. Duplicates are ignored.
    pub fn from_members(vnodes: VnodeCount, members: impl IntoIterator<Item = NodeId>) -> Self {
        let mut members: Vec<NodeId> = members.into_iter().collect();
        members.sort_unstable();
        members.dedup();
        assert_member_count_fits(members.len(), vnodes);
        let per_member = vnodes.get() as usize;
        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(members.len() * per_member);
        let mut tokens = Vec::with_capacity(per_member);
        for (owner, member) in (0u32..).zip(&members) {
            tokens.clear();
            vnode_tokens(member, vnodes.get(), &mut tokens);
            entries.extend(tokens.iter().map(|&token| (token, owner)));
        }
        sort_uniform(&mut entries);
        let (tokens, owners) = entries.into_iter().unzip();
        TokenRing {
            vnodes,
            members,
            tokens,
            owners,
        }
    }

    /// Adds `member` with all its vnodes. Returns `false`, changing nothing, if it is already a
    /// member.
    ///
    /// Costs `V` hashes plus one pass over the ring; the other members' tokens are not
    /// recomputed.
    pub fn insert(&mut self, member: NodeId) -> bool {
        let Err(at) = self.members.binary_search(&member) else {
            return false;
        };
        assert_member_count_fits(self.members.len() + 1, self.vnodes);
        let mut fresh = Vec::with_capacity(self.vnodes.get() as usize);
        vnode_tokens(&member, self.vnodes.get(), &mut fresh);
        fresh.sort_unstable();
        // `at` fits in u32: the member count is checked above.
        merge_member(&mut self.tokens, &mut self.owners, &fresh, at as u32);
        self.members.insert(at, member);
        true
    }

    /// Removes `member` and its vnodes. Returns `false`, changing nothing, if it is not a member.
    ///
    /// Costs one pass over the ring and no hashing.
    pub fn remove(&mut self, member: &NodeId) -> bool {
        let Ok(at) = self.members.binary_search(member) else {
            return false;
        };
        let at = at as u32;
        let mut write = 0;
        for read in 0..self.tokens.len() {
            let owner = self.owners[read];
            if owner == at {
                continue;
            }
            self.tokens[write] = self.tokens[read];
            self.owners[write] = if owner > at { owner - 1 } else { owner };
            write += 1;
        }
        self.tokens.truncate(write);
        self.owners.truncate(write);
        self.members.remove(at as usize);
        true
    }

    /// How many vnodes each member owns.
    pub fn vnodes(&self) -> VnodeCount {
        self.vnodes
    }

    /// The members, sorted by [`NodeId`]; `MemberIndex(i)` names the `i`-th.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// The member an index names. Panics if the index is not from this ring.
    pub fn member(&self, index: MemberIndex) -> &NodeId {
        &self.members[index.get()]
    }

    /// The index of `member`, if it is one.
    pub fn index_of(&self, member: &NodeId) -> Option<MemberIndex> {
        self.members
            .binary_search(member)
            .ok()
            .map(|at| MemberIndex(at as u32))
    }

    /// Whether `member` is on the ring.
    pub fn contains(&self, member: &NodeId) -> bool {
        self.index_of(member).is_some()
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the ring has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The number of vnode tokens on the ring: members × vnodes.
    pub fn token_count(&self) -> usize {
        self.tokens.len()
    }

    /// Heap bytes held by the token arrays (what the ring costs per vnode), not counting the
    /// member names.
    pub fn token_heap_bytes(&self) -> usize {
        self.tokens.capacity() * size_of::<u64>() + self.owners.capacity() * size_of::<u32>()
    }

    /// The ring position of the first vnode at or after `position`, wrapping past the top; `None`
    /// on an empty ring.
    pub fn successor(&self, position: Token) -> Option<usize> {
        if self.tokens.is_empty() {
            return None;
        }
        let at = self.tokens.partition_point(|&token| token < position.get());
        Some(if at == self.tokens.len() { 0 } else { at })
    }

    /// Walks one full turn clockwise from `position`, yielding each vnode's token and owner,
    /// starting with the first vnode at or after `position`. Members repeat; see
    /// [`TokenRing::first_distinct`] for distinct ones.
    pub fn walk(&self, position: Token) -> Walk<'_> {
        Walk {
            ring: self,
            next: self.successor(position).unwrap_or(0),
            remaining: self.tokens.len(),
        }
    }

    /// Walks one full turn clockwise from ring position `start` (as returned by
    /// [`TokenRing::successor`]). Panics if `start` is out of range on a non-empty ring.
    pub fn walk_from_index(&self, start: usize) -> Walk<'_> {
        assert!(
            start < self.tokens.len() || self.tokens.is_empty(),
            "ring index {start} out of range"
        );
        Walk {
            ring: self,
            next: start,
            remaining: self.tokens.len(),
        }
    }

    /// The first `k` distinct members clockwise from `position`, in walk order: the plain ring
    /// walk of Dynamo. Fewer than `k` if the ring has fewer members.
    pub fn first_distinct(&self, position: Token, k: usize) -> Vec<&NodeId> {
        let mut found = Vec::new();
        self.first_distinct_indices(position, k, &mut found);
        found.into_iter().map(|index| self.member(index)).collect()
    }

    /// [`TokenRing::first_distinct`] as member indices, written into `found` (cleared first) so
    /// a caller placing many shards reuses one buffer.
    pub fn first_distinct_indices(&self, position: Token, k: usize, found: &mut Vec<MemberIndex>) {
        found.clear();
        let wanted = k.min(self.members.len());
        if wanted == 0 {
            return;
        }
        // Small k (replication factors) checks the few found so far; large k keeps a seen-set.
        let mut seen = if wanted > 16 {
            vec![false; self.members.len()]
        } else {
            Vec::new()
        };
        for (_, owner) in self.walk(position) {
            let duplicate = if seen.is_empty() {
                found.contains(&owner)
            } else {
                std::mem::replace(&mut seen[owner.get()], true)
            };
            if !duplicate {
                found.push(owner);
                if found.len() == wanted {
                    return;
                }
            }
        }
    }

    /// Every vnode in clockwise order from token 0, with its owner.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Token, &NodeId)> + '_ {
        self.tokens
            .iter()
            .zip(&self.owners)
            .map(|(&token, &owner)| (Token::new(token), &self.members[owner as usize]))
    }
}

/// Merges the sorted tokens `fresh` of a new member with index `at` into the ring arrays,
/// renumbering the owners at or after `at`, keeping `(token, owner)` order.
///
/// Merges from the back, so every old entry moves at most once.
fn merge_member(tokens: &mut Vec<u64>, owners: &mut Vec<u32>, fresh: &[u64], at: u32) {
    let renumber = |owner: u32| if owner >= at { owner + 1 } else { owner };
    let old_len = tokens.len();
    tokens.resize(old_len + fresh.len(), 0);
    owners.resize(old_len + fresh.len(), 0);
    let (mut old, mut new, mut write) = (old_len, fresh.len(), old_len + fresh.len());
    while new > 0 {
        write -= 1;
        let take_old =
            old > 0 && (tokens[old - 1], renumber(owners[old - 1])) > (fresh[new - 1], at);
        if take_old {
            old -= 1;
            tokens[write] = tokens[old];
            owners[write] = renumber(owners[old]);
        } else {
            new -= 1;
            tokens[write] = fresh[new];
            owners[write] = at;
        }
    }
    // Entries before the first new token stay in place but still need renumbering.
    for owner in &mut owners[..old] {
        *owner = renumber(*owner);
    }
}

/// Sorts entries whose tokens are uniformly spread (they are hash outputs) in linear expected
/// time: a counting pass distributes them into about one bucket per four entries by their top
/// bits, then each small bucket is sorted. Twice as fast as a comparison sort of the whole
/// ring; any distribution still sorts correctly, only slower.
fn sort_uniform(entries: &mut Vec<(u64, u32)>) {
    const PER_BUCKET: usize = 4;
    if entries.len() < 1024 {
        entries.sort_unstable();
        return;
    }
    let bits = (entries.len() / PER_BUCKET).ilog2();
    let bucket = |token: u64| (token >> (64 - bits)) as usize;
    let mut starts = vec![0usize; (1 << bits) + 1];
    for &(token, _) in entries.iter() {
        starts[bucket(token) + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut sorted = vec![(0u64, 0u32); entries.len()];
    let mut next = starts.clone();
    for &entry in entries.iter() {
        let slot = &mut next[bucket(entry.0)];
        sorted[*slot] = entry;
        *slot += 1;
    }
    for range in starts.windows(2) {
        sorted[range[0]..range[1]].sort_unstable();
    }
    *entries = sorted;
}

/// Panics if the ring would outgrow its `u32` owner indices: at 4096 vnodes that is a million
/// members, far beyond any SWIM cluster.
fn assert_member_count_fits(members: usize, vnodes: VnodeCount) {
    let tokens = members as u64 * u64::from(vnodes.get());
    assert!(
        u32::try_from(members).is_ok() && usize::try_from(tokens).is_ok(),
        "token ring of {members} members × {vnodes} vnodes is too large"
    );
}

impl fmt::Debug for TokenRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenRing")
            .field("vnodes", &self.vnodes)
            .field("members", &self.members)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

/// One clockwise turn around a [`TokenRing`]; see [`TokenRing::walk`].
#[derive(Debug, Clone)]
pub struct Walk<'a> {
    ring: &'a TokenRing,
    next: usize,
    remaining: usize,
}

impl Iterator for Walk<'_> {
    type Item = (Token, MemberIndex);

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let at = self.next;
        self.next = if at + 1 == self.ring.tokens.len() {
            0
        } else {
            at + 1
        };
        Some((
            Token::new(self.ring.tokens[at]),
            MemberIndex(self.ring.owners[at]),
        ))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Walk<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeId {
        NodeId::new(name).unwrap()
    }

    fn vnodes(count: u32) -> VnodeCount {
        VnodeCount::new(count).unwrap()
    }

    #[test]
    fn empty_ring_answers_without_panicking() {
        let ring = TokenRing::new(VnodeCount::DEFAULT);
        assert!(ring.is_empty());
        assert_eq!(ring.successor(Token::new(5)), None);
        assert_eq!(ring.walk(Token::new(5)).count(), 0);
        assert!(ring.first_distinct(Token::new(5), 3).is_empty());
    }

    #[test]
    fn insert_and_remove_report_membership_changes() {
        let mut ring = TokenRing::new(vnodes(8));
        assert!(ring.insert(node("a")));
        assert!(
            !ring.insert(node("a")),
            "a duplicate insert changes nothing"
        );
        assert_eq!(ring.token_count(), 8);
        assert!(!ring.remove(&node("b")));
        assert!(ring.remove(&node("a")));
        assert_eq!(ring, TokenRing::new(vnodes(8)));
    }

    #[test]
    fn tokens_are_sorted_and_owned_by_their_hashing_member() {
        let ring = TokenRing::from_members(vnodes(16), ["c", "a", "b"].map(node));
        let entries: Vec<_> = ring.iter().collect();
        assert!(entries.windows(2).all(|w| w[0].0 <= w[1].0));
        for member in ring.members() {
            for vnode in 0..16 {
                let token = Token::of_vnode(member, vnode);
                assert!(entries.contains(&(token, member)));
            }
        }
    }

    #[test]
    fn walk_wraps_past_the_top() {
        let ring = TokenRing::from_members(vnodes(4), ["a", "b"].map(node));
        let last = ring.iter().last().unwrap().0;
        let after_last = Token::new(last.get().wrapping_add(1));
        let first = ring.iter().next().unwrap().0;
        let walked: Vec<_> = ring.walk(after_last).map(|(token, _)| token).collect();
        assert_eq!(walked.len(), 8);
        assert_eq!(
            walked[0], first,
            "past the last token the walk starts over at the first"
        );
    }

    #[test]
    fn bucket_sort_sorts_any_distribution() {
        let spread: Vec<(u64, u32)> = (0..5000u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15), (i % 7) as u32))
            .collect();
        // All in one bucket, and many equal tokens ordered by owner.
        let clustered: Vec<(u64, u32)> = (0..5000u64).map(|i| (i % 13, (i % 5) as u32)).collect();
        for mut entries in [spread, clustered] {
            let mut expected = entries.clone();
            expected.sort_unstable();
            sort_uniform(&mut entries);
            assert_eq!(entries, expected);
        }
    }

    #[test]
    fn merge_orders_equal_tokens_by_member_index() {
        // Equal tokens need a 64-bit hash collision, so exercise the merge on made-up entries:
        // (5, m0) (5, m2) (9, m1), then a new member m1 with a token 5.
        let mut tokens = vec![5, 5, 9];
        let mut owners = vec![0, 2, 1];
        merge_member(&mut tokens, &mut owners, &[5], 1);
        assert_eq!(tokens, [5, 5, 5, 9]);
        assert_eq!(owners, [0, 1, 3, 2]);
    }
}
