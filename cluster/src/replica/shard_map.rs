//! [`ShardMap`]: values keyed by shard number, found by indexing instead of searching; and
//! [`ShardDeadlines`], each shard's next deadline, earliest first.

use core::fmt;
use core::time::Duration;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A map from shard number to `T`: a slot per shard up to the highest one inserted.
///
/// [`ShardHost`](super::ShardHost) looks a replica up for every message, group commit and
/// timer. In a `BTreeMap` of a thousand shards each lookup walks three levels of nodes, and on
/// a loaded node those are cache misses; here it is one index. Iteration is in shard order, as
/// a `BTreeMap`'s is. The slot array never shrinks, and costs `size_of::<Option<T>>()` for
/// every shard below the highest held: box a large `T`.
///
/// Not `PartialEq`: two maps with the same entries may have slot arrays of different lengths.
#[derive(Clone)]
pub(crate) struct ShardMap<T> {
    slots: Vec<Option<T>>,
    len: usize,
}

impl<T> ShardMap<T> {
    /// An empty map.
    pub(crate) fn new() -> Self {
        ShardMap {
            slots: Vec::new(),
            len: 0,
        }
    }

    /// How many shards have a value.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The value of `shard`.
    pub(crate) fn get(&self, shard: u16) -> Option<&T> {
        self.slots.get(usize::from(shard))?.as_ref()
    }

    /// The value of `shard`, to change.
    pub(crate) fn get_mut(&mut self, shard: u16) -> Option<&mut T> {
        self.slots.get_mut(usize::from(shard))?.as_mut()
    }

    /// Whether `shard` has a value.
    pub(crate) fn contains_key(&self, shard: u16) -> bool {
        self.get(shard).is_some()
    }

    /// Sets the value of `shard`, returning the one it replaces.
    pub(crate) fn insert(&mut self, shard: u16, value: T) -> Option<T> {
        let index = usize::from(shard);
        if index >= self.slots.len() {
            self.slots.resize_with(index + 1, || None);
        }
        let old = self.slots[index].replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Takes the value of `shard` out.
    pub(crate) fn remove(&mut self, shard: u16) -> Option<T> {
        let old = self.slots.get_mut(usize::from(shard))?.take();
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Every shard with its value, in shard order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u16, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| Some((shard_of(index), slot.as_ref()?)))
    }

    /// Every shard with a value, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = u16> + '_ {
        self.iter().map(|(shard, _)| shard)
    }
}

/// The shard of a slot index: slots exist only for shards inserted, so every index fits.
fn shard_of(index: usize) -> u16 {
    u16::try_from(index).unwrap_or(u16::MAX)
}

impl<T> Default for ShardMap<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for ShardMap<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Each shard's next deadline (at most one), earliest first; ties in shard order.
///
/// A replica's deadline moves with most messages it handles (a follower's election timer),
/// so changing one must be cheap: the new deadline is pushed onto a heap and the old one is
/// left there, recognised as stale (it no longer matches the shard's current deadline) when
/// it reaches the top, and dropped then. Stale entries never outnumber the live ones by
/// much: the heap is rebuilt from the current deadlines when they would.
#[derive(Debug, Clone)]
pub(crate) struct ShardDeadlines {
    current: ShardMap<Duration>,
    heap: BinaryHeap<Reverse<(Duration, u16)>>,
}

impl ShardDeadlines {
    /// No deadlines.
    pub(crate) fn new() -> Self {
        ShardDeadlines {
            current: ShardMap::new(),
            heap: BinaryHeap::new(),
        }
    }

    /// Sets (or with `None` clears) the deadline of `shard`.
    pub(crate) fn set(&mut self, shard: u16, deadline: Option<Duration>) {
        if self.current.get(shard).copied() == deadline {
            return;
        }
        match deadline {
            Some(at) => {
                self.current.insert(shard, at);
                self.heap.push(Reverse((at, shard)));
            }
            None => {
                self.current.remove(shard);
            }
        }
        if self.heap.len() > 2 * self.current.len() + 64 {
            // In the heap's own buffer: a fresh one grew a doubling at a time at every
            // rebuild (about 4% of a loaded node's CPU in a profile).
            let mut entries = std::mem::take(&mut self.heap).into_vec();
            entries.clear();
            entries.extend(self.current.iter().map(|(shard, at)| Reverse((*at, shard))));
            self.heap = BinaryHeap::from(entries);
        }
        self.drop_stale();
    }

    /// The earliest deadline and its shard.
    pub(crate) fn first(&self) -> Option<(Duration, u16)> {
        self.heap.peek().map(|Reverse(first)| *first)
    }

    /// Removes the earliest deadline (the shard has none afterwards).
    pub(crate) fn pop_first(&mut self) -> Option<(Duration, u16)> {
        let Reverse((at, shard)) = self.heap.pop()?;
        self.current.remove(shard);
        self.drop_stale();
        Some((at, shard))
    }

    /// Pops stale entries off the top, so the top is always a shard's current deadline.
    fn drop_stale(&mut self) {
        while let Some(Reverse((at, shard))) = self.heap.peek() {
            if self.current.get(*shard) == Some(at) {
                break;
            }
            self.heap.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::{ShardDeadlines, ShardMap};
    use core::time::Duration;
    use std::collections::BTreeSet;

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u16, u32),
        Remove(u16),
    }

    fn step() -> impl Strategy<Value = Step> {
        // Mostly small shard numbers, so steps meet the same shards; now and then the largest.
        let shard = prop_oneof![8 => 0u16..64, 1 => Just(u16::MAX), 1 => any::<u16>()];
        prop_oneof![
            (shard.clone(), any::<u32>()).prop_map(|(s, v)| Step::Insert(s, v)),
            shard.prop_map(Step::Remove),
        ]
    }

    proptest! {
        /// After any steps, the map answers every question as a `BTreeMap` given the same
        /// steps does.
        #[test]
        fn behaves_as_a_btreemap(steps in proptest::collection::vec(step(), 0..200)) {
            let mut map = ShardMap::new();
            let mut model = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Insert(shard, value) => {
                        prop_assert_eq!(map.insert(shard, value), model.insert(shard, value));
                    }
                    Step::Remove(shard) => {
                        prop_assert_eq!(map.remove(shard), model.remove(&shard));
                    }
                }
                prop_assert_eq!(map.len(), model.len());
            }
            let listed: Vec<(u16, u32)> = map.iter().map(|(s, v)| (s, *v)).collect();
            let expected: Vec<(u16, u32)> = model.iter().map(|(s, v)| (*s, *v)).collect();
            prop_assert_eq!(listed, expected);
            for shard in [0, 1, 63, 64, u16::MAX] {
                prop_assert_eq!(map.get(shard), model.get(&shard));
                prop_assert_eq!(map.contains_key(shard), model.contains_key(&shard));
            }
        }
    }

    proptest! {
        /// Deadlines set, cleared and popped in any order come out as a `BTreeSet` of
        /// `(deadline, shard)` holding each shard's current deadline gives them, also when
        /// a shard's deadline returns to an earlier value or the heap is rebuilt.
        #[test]
        fn deadlines_come_out_in_order(
            steps in proptest::collection::vec((0u16..40, proptest::option::of(0u64..50), any::<bool>()), 0..400)
        ) {
            let mut deadlines = ShardDeadlines::new();
            let mut model: BTreeSet<(Duration, u16)> = BTreeSet::new();
            for (shard, at, pop) in steps {
                if pop {
                    prop_assert_eq!(deadlines.pop_first(), model.pop_first());
                } else {
                    let at = at.map(Duration::from_millis);
                    model.retain(|(_, s)| *s != shard);
                    if let Some(at) = at {
                        model.insert((at, shard));
                    }
                    deadlines.set(shard, at);
                }
                prop_assert_eq!(deadlines.first(), model.first().copied());
            }
            while let Some(first) = model.pop_first() {
                prop_assert_eq!(deadlines.pop_first(), Some(first));
            }
            prop_assert_eq!(deadlines.pop_first(), None);
        }
    }
}
