//! The CM messages nobody has taken yet, indexed by the keys their waiters ask for.
//!
//! Ten thousand connections being set up at once (`cmtime -c 10000`) means ten thousand
//! threads each waiting for the MADs of one communication ID, and a listener for the REQs of
//! one service: a take must cost what the messages under its keys cost, not a walk of every
//! message kept. Messages are numbered as they arrive; each key holds the numbers of its
//! messages in order, and a take walks only those (merged, oldest first). The oldest message
//! is dropped once [`Backlog::push`] exceeds the bound. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

/// Messages `T` under up to two keys `K` each, oldest first, at most `bound`.
#[derive(Debug)]
pub(super) struct Backlog<K, T> {
    bound: usize,
    next: u64,
    all: BTreeMap<u64, ([Option<K>; 2], T)>,
    by_key: HashMap<K, BTreeSet<u64>>,
}

impl<K: Copy + Eq + Hash, T> Backlog<K, T> {
    /// An empty backlog of at most `bound` messages.
    pub(super) fn new(bound: usize) -> Backlog<K, T> {
        Backlog {
            bound,
            next: 0,
            all: BTreeMap::new(),
            by_key: HashMap::new(),
        }
    }

    /// Messages kept.
    pub(super) fn len(&self) -> usize {
        self.all.len()
    }

    /// Keeps `item` under `keys`; returns the oldest message if that went over the bound.
    pub(super) fn push(&mut self, keys: [Option<K>; 2], item: T) -> Option<T> {
        let n = self.next;
        self.next += 1;
        for k in keys.iter().flatten() {
            self.by_key.entry(*k).or_default().insert(n);
        }
        self.all.insert(n, (keys, item));
        if self.all.len() > self.bound {
            let (&oldest, _) = self.all.first_key_value()?;
            return self.remove(oldest);
        }
        None
    }

    /// The oldest message for which `want` holds, among all of them.
    pub(super) fn take_any(&mut self, want: impl Fn(&T) -> bool) -> Option<T> {
        let n = self
            .all
            .iter()
            .find(|(_, (_, t))| want(t))
            .map(|(&n, _)| n)?;
        self.remove(n)
    }

    /// The oldest message kept under one of `keys` for which `want` holds.
    pub(super) fn take(&mut self, keys: &[K], want: impl Fn(&T) -> bool) -> Option<T> {
        let mut heads: Vec<_> = keys
            .iter()
            .filter_map(|k| self.by_key.get(k))
            .map(|s| s.iter().peekable())
            .collect();
        let found = loop {
            // The smallest number at the head of any key's list (a message under two of
            // `keys` is at both heads at once: both advance past it).
            let Some(n) = heads.iter_mut().filter_map(|h| h.peek().copied()).min() else {
                break None;
            };
            let n = *n;
            for h in &mut heads {
                if h.peek() == Some(&&n) {
                    h.next();
                }
            }
            if self.all.get(&n).is_some_and(|(_, t)| want(t)) {
                break Some(n);
            }
        };
        self.remove(found?)
    }

    fn remove(&mut self, n: u64) -> Option<T> {
        let (keys, item) = self.all.remove(&n)?;
        for k in keys.iter().flatten() {
            if let Some(s) = self.by_key.get_mut(k) {
                s.remove(&n);
                if s.is_empty() {
                    self.by_key.remove(k);
                }
            }
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_sees_only_its_keys_oldest_first() {
        let mut b = Backlog::new(100);
        b.push([Some('a'), None], 1);
        b.push([Some('b'), Some('a')], 2);
        b.push([Some('b'), None], 3);
        b.push([Some('c'), None], 4);
        assert_eq!(b.take(&['b'], |_| true), Some(2));
        assert_eq!(b.take(&['a'], |_| true), Some(1));
        assert_eq!(b.take(&['a'], |_| true), None, "2 left under a with b");
        assert_eq!(
            b.take(&['c', 'b'], |_| true),
            Some(3),
            "merged, oldest first"
        );
        assert_eq!(b.take(&['z'], |_| true), None);
        assert_eq!(b.len(), 1);
        assert!(b.by_key.len() == 1, "empty keys are forgotten");
    }

    #[test]
    fn want_skips_messages_that_stay_for_others() {
        let mut b = Backlog::new(100);
        for i in 0..10 {
            b.push([Some(i % 2), None], i);
        }
        assert_eq!(b.take(&[0, 1], |&t| t > 6), Some(7));
        assert_eq!(b.take(&[0], |&t| t > 5), Some(6));
        assert_eq!(b.take_any(|&t| t % 3 == 0), Some(0));
        assert_eq!(b.len(), 7);
        assert_eq!(b.take(&[1], |_| true), Some(1));
    }

    #[test]
    fn the_oldest_goes_once_the_bound_is_passed() {
        let mut b = Backlog::new(3);
        assert_eq!(b.push([Some(1), None], 'a'), None);
        b.push([Some(1), None], 'b');
        b.push([Some(2), None], 'c');
        assert_eq!(b.push([Some(2), None], 'd'), Some('a'));
        assert_eq!(b.len(), 3);
        assert_eq!(b.take(&[1], |_| true), Some('b'));
        assert_eq!(b.take(&[1], |_| true), None);
    }

    #[test]
    fn ten_thousand_keys_each_give_their_own() {
        let mut b = Backlog::new(20_000);
        for i in 0..10_000u32 {
            b.push([Some(i), Some(u32::MAX)], i);
        }
        for i in (0..10_000u32).rev() {
            assert_eq!(b.take(&[i], |_| true), Some(i));
        }
        assert_eq!(b.len(), 0);
        assert!(b.by_key.is_empty());
    }
}
