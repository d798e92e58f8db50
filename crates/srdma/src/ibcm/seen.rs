//! The REQs this CM has taken in, so that a REQ sent again (its answer is late or was lost)
//! does not become a second connection request.
//!
//! The active side sends its REQ again until a REP, REJ or MRA comes (every 500 ms here,
//! every 4.3 s from kernel rdma_cm, up to 15 times). A listener whose application is slow
//! to accept — ten thousand requests at once — would otherwise hand each resend to the
//! application as a new request: it accepts both, the second never gets its RTU, and the
//! application sees errors on ids it never asked for. As kernel ib_cm keys its REQs by the
//! peer's communication ID, a REQ is known by its sender and communication ID (and its
//! transaction ID: a new REQ that reuses an ID is a new request). A REQ is remembered for
//! [`MEMORY`] after it was last seen. SIDR_REQs (`rdma_connect` on a UD id) are kept the
//! same way, by sender and request ID, with the SIDR_REP that answered them (`A`): a resend
//! whose answer was lost gets that answer again. Pure: the caller gives the time.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// How long a REQ is remembered after it was last seen: longer than kernel rdma_cm keeps
/// sending one (15 × 4.3 s).
pub(super) const MEMORY: Duration = Duration::from_secs(70);

/// The most REQs remembered (and twice as many sightings): a flood of REQs with fresh IDs
/// or TIDs forgets the oldest first, rather than taking memory without bound.
pub(super) const MOST: usize = 65_536;

/// What a REQ that arrives is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// Not seen before: a connection request for a listener.
    New,
    /// Seen, and its request is with the application, unanswered (an MRA tells the peer
    /// to wait).
    WhilePending,
    /// Seen and answered (a REP or REJ went out; the accept answers it again).
    Answered,
}

#[derive(Debug)]
struct Entry<A> {
    tid: u64,
    last: Instant,
    answered: bool,
    /// The answer kept to send again, if the caller keeps one.
    answer: Option<A>,
}

/// REQs seen, by key (sender, communication ID), with the answer to each (`A`), if kept.
#[derive(Debug)]
pub(super) struct SeenReqs<K, A = ()> {
    map: HashMap<K, Entry<A>>,
    /// (when, key) as seen: entries expire from the front (an entry seen again since is
    /// found with a later `last` and stays).
    order: VecDeque<(Instant, K)>,
}

impl<K: Copy + Eq + Hash, A> Default for SeenReqs<K, A> {
    fn default() -> Self {
        SeenReqs {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Copy + Eq + Hash, A> SeenReqs<K, A> {
    /// A REQ with `key` and transaction ID `tid` arrives at `now`.
    pub(super) fn arrive(&mut self, key: K, tid: u64, now: Instant) -> Arrival {
        self.expire(now);
        // Bounded: REQs (fresh IDs) and sightings (resends of one, fresh TIDs) alike.
        while (self.map.len() >= MOST && !self.map.contains_key(&key))
            || self.order.len() >= 2 * MOST
        {
            let Some((at, old)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|e| e.last == at) {
                self.map.remove(&old);
            }
        }
        self.order.push_back((now, key));
        match self.map.get_mut(&key) {
            Some(e) if e.tid == tid => {
                e.last = now;
                if e.answered {
                    Arrival::Answered
                } else {
                    Arrival::WhilePending
                }
            }
            _ => {
                self.map.insert(
                    key,
                    Entry {
                        tid,
                        last: now,
                        answered: false,
                        answer: None,
                    },
                );
                Arrival::New
            }
        }
    }

    /// The request of `key` was answered (accepted or rejected).
    pub(super) fn answered(&mut self, key: K) {
        if let Some(e) = self.map.get_mut(&key) {
            e.answered = true;
        }
    }

    /// The request of `key` was answered with `answer`, kept to be sent again.
    pub(super) fn answered_with(&mut self, key: K, answer: A) {
        if let Some(e) = self.map.get_mut(&key) {
            e.answered = true;
            e.answer = Some(answer);
        }
    }

    /// The answer kept for the request of `key`.
    pub(super) fn answer(&self, key: &K) -> Option<&A> {
        self.map.get(key).and_then(|e| e.answer.as_ref())
    }

    /// Forgets the REQ of `key` with transaction ID `tid` (one nobody took: a resend of it
    /// is new).
    pub(super) fn forget(&mut self, key: K, tid: u64) {
        if self
            .map
            .get(&key)
            .is_some_and(|e| e.tid == tid && !e.answered)
        {
            self.map.remove(&key);
        }
    }

    /// REQs remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }

    /// Drops what was last seen [`MEMORY`] ago or more.
    fn expire(&mut self, now: Instant) {
        while let Some(&(at, key)) = self.order.front() {
            if now.saturating_duration_since(at) < MEMORY {
                break;
            }
            self.order.pop_front();
            if self
                .map
                .get(&key)
                .is_some_and(|e| now.saturating_duration_since(e.last) >= MEMORY)
            {
                self.map.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resent_req_is_pending_until_answered_then_answered() {
        let t = Instant::now();
        let mut s = SeenReqs::<_>::default();
        assert_eq!(s.arrive(7, 1, t), Arrival::New);
        assert_eq!(
            s.arrive(7, 1, t + Duration::from_millis(500)),
            Arrival::WhilePending
        );
        assert_eq!(s.arrive(8, 1, t), Arrival::New, "another peer's ID");
        s.answered(7);
        assert_eq!(
            s.arrive(7, 1, t + Duration::from_secs(1)),
            Arrival::Answered
        );
        assert_eq!(
            s.arrive(7, 2, t + Duration::from_secs(2)),
            Arrival::New,
            "new tid"
        );
        assert_eq!(
            s.arrive(7, 2, t + Duration::from_secs(2)),
            Arrival::WhilePending
        );
        s.forget(7, 1);
        assert_eq!(
            s.arrive(7, 2, t),
            Arrival::WhilePending,
            "another tid's: kept"
        );
        s.forget(7, 2);
        assert_eq!(s.arrive(7, 2, t), Arrival::New, "forgotten: new again");
    }

    #[test]
    fn an_answered_request_keeps_its_answer_for_the_resend() {
        let t = Instant::now();
        let mut s: SeenReqs<u32, &str> = SeenReqs::default();
        assert_eq!(s.arrive(7, 1, t), Arrival::New);
        assert_eq!(s.answer(&7), None);
        s.answered_with(7, "rep");
        assert_eq!(s.arrive(7, 1, t), Arrival::Answered);
        assert_eq!(s.answer(&7), Some(&"rep"));
        assert_eq!(s.answer(&8), None);
        assert_eq!(s.arrive(7, 1, t + MEMORY + MEMORY), Arrival::New, "expired");
        assert_eq!(s.answer(&7), None, "a new request has no answer yet");
    }

    #[test]
    fn a_flood_of_fresh_ids_is_bounded() {
        let t = Instant::now();
        let mut s = SeenReqs::<_>::default();
        for k in 0..(MOST as u32 + 1000) {
            assert_eq!(s.arrive(k, 1, t), Arrival::New);
        }
        assert_eq!(s.len(), MOST);
        assert_eq!(s.arrive(0, 1, t), Arrival::New, "the oldest went first");
        assert_eq!(
            s.arrive(MOST as u32 + 999, 1, t),
            Arrival::WhilePending,
            "the newest stay"
        );
        for tid in 0..(3 * MOST as u64) {
            s.arrive(7, tid, t);
        }
        assert!(s.order.len() <= 2 * MOST && s.len() <= MOST);
    }

    #[test]
    fn forgotten_after_the_memory_unless_seen_again() {
        let t = Instant::now();
        let mut s = SeenReqs::<_>::default();
        s.arrive(1, 1, t);
        s.arrive(2, 1, t);
        s.arrive(2, 1, t + MEMORY / 2);
        assert_eq!(s.arrive(3, 1, t + MEMORY), Arrival::New);
        assert_eq!(s.len(), 2, "1 expired, 2 was seen again");
        assert_eq!(s.arrive(2, 1, t + MEMORY), Arrival::WhilePending);
        assert_eq!(s.arrive(1, 1, t + MEMORY), Arrival::New);
        // Long quiet: all go, and the order queue with them.
        s.arrive(9, 1, t + MEMORY * 5);
        assert_eq!(s.len(), 1);
        assert_eq!(s.order.len(), 1);
    }
}
