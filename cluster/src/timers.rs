//! An ordered timer queue: foca requires its timers back in deadline order.

use core::time::Duration;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Timers ordered by deadline, ties by insertion order, so delivery is deterministic.
#[derive(Debug)]
pub(crate) struct TimerQueue<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    next_sequence: u64,
}

#[derive(Debug)]
struct Entry<T> {
    deadline: Duration,
    sequence: u64,
    timer: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.sequence) == (other.deadline, other.sequence)
    }
}

impl<T> Eq for Entry<T> {}

impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.sequence).cmp(&(other.deadline, other.sequence))
    }
}

impl<T> TimerQueue<T> {
    pub(crate) fn new() -> Self {
        TimerQueue {
            heap: BinaryHeap::new(),
            next_sequence: 0,
        }
    }

    pub(crate) fn push(&mut self, deadline: Duration, timer: T) {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.heap.push(Reverse(Entry {
            deadline,
            sequence,
            timer,
        }));
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<Duration> {
        self.heap.peek().map(|Reverse(entry)| entry.deadline)
    }

    /// Removes and returns the earliest timer if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Duration) -> Option<T> {
        if self.next_deadline()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(entry)| entry.timer)
    }

    /// Moves every timer due at `now` to `later`, keeping their relative order.
    pub(crate) fn defer_due(&mut self, now: Duration, later: Duration) {
        let mut due = Vec::new();
        while let Some(timer) = self.pop_due(now) {
            due.push(timer);
        }
        for timer in due {
            self.push(later, timer);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivers_in_deadline_then_insertion_order() {
        let mut queue = TimerQueue::new();
        let ms = Duration::from_millis;
        queue.push(ms(30), "c");
        queue.push(ms(10), "a");
        queue.push(ms(30), "d");
        queue.push(ms(20), "b");
        assert_eq!(queue.pop_due(ms(5)), None);
        let mut fired = Vec::new();
        while let Some(timer) = queue.pop_due(ms(30)) {
            fired.push(timer);
        }
        assert_eq!(fired, ["a", "b", "c", "d"]);
    }

    #[test]
    fn deferring_keeps_order_and_leaves_future_timers() {
        let mut queue = TimerQueue::new();
        let ms = Duration::from_millis;
        queue.push(ms(10), "a");
        queue.push(ms(12), "b");
        queue.push(ms(500), "later");
        queue.defer_due(ms(100), ms(150));
        assert_eq!(queue.next_deadline(), Some(ms(150)));
        assert_eq!(queue.pop_due(ms(150)), Some("a"));
        assert_eq!(queue.pop_due(ms(150)), Some("b"));
        assert_eq!(queue.pop_due(ms(150)), None);
        assert_eq!(queue.len(), 1);
    }
}
