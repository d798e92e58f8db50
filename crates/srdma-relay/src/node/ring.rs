//! The slot ring of a tree node: which chunk each of its `slots` slots holds and how far that
//! chunk got (arrived, processed, forwards posted and completed), and which chunks are
//! released, strictly in sequence order. Chunk `seq` always lives in slot `seq % slots`.
//!
//! No I/O happens here: the data loop posts the receives, forwards and credits, and tells the
//! ring what happened; the ring says what may happen next (which slot a chunk takes, which
//! chunk may be forwarded, which slots may be released). The binomial pipeline keeps its own
//! ring (chunks arrive out of order there): see `mesh`.

use std::time::Instant;

use super::wire::SEQ_MASK;

/// One slot of the ring.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    /// The chunk it holds (while `busy`).
    pub(super) seq: u64,
    busy: bool,
    processed: bool,
    /// Forwards posted and not yet completed.
    pending: u32,
    /// Bytes of header and payload to forward.
    pub(super) len: usize,
    /// When the chunk arrived (or was framed, at the source).
    pub(super) arrived: Instant,
    /// The slot may not be released before this (a throttle's budget).
    pub(super) ready_at: Instant,
}

/// A chunk arrived into a slot that still holds an earlier one: the sender did not wait for
/// its credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SlotInUse;

/// What one [`SlotRing::release_in_order`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Released {
    /// Slots released.
    pub(super) count: u64,
    /// The next slot in order is complete but its throttle holds it until then.
    pub(super) wake: Option<Instant>,
}

/// The slots of a tree node's ring, and where arrival and release stand.
#[derive(Debug, Clone)]
pub(super) struct SlotRing {
    slots: Vec<Slot>,
    /// The next chunk to arrive (or to be framed, at the source).
    next_in: u64,
    /// Every chunk below this is released.
    next_release: u64,
}

impl SlotRing {
    /// A ring of `slots` free slots (at least one) whose first chunk is `start`.
    pub(super) fn new(slots: usize, start: u64) -> SlotRing {
        let now = Instant::now();
        let free = Slot {
            seq: 0,
            busy: false,
            processed: false,
            pending: 0,
            len: 0,
            arrived: now,
            ready_at: now,
        };
        SlotRing {
            slots: vec![free; slots.max(1)],
            next_in: start,
            next_release: start,
        }
    }

    /// The next chunk to arrive: every chunk below it arrived.
    pub(super) fn next_in(&self) -> u64 {
        self.next_in
    }

    /// Every chunk below this is released.
    pub(super) fn next_release(&self) -> u64 {
        self.next_release
    }

    /// The slot chunk `seq` lives in.
    pub(super) fn slot_of(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }

    /// Whether the slot of the next chunk is free (the source frames it only then).
    pub(super) fn next_is_free(&self) -> bool {
        !self.slots[self.slot_of(self.next_in)].busy
    }

    /// Chunk [`next_in`](Self::next_in) arrived at `at`: it takes its slot, not processed yet.
    /// Returns its sequence number, or [`SlotInUse`] (and changes nothing) when the slot
    /// still holds a chunk that was not released.
    pub(super) fn arrive(&mut self, at: Instant) -> Result<u64, SlotInUse> {
        let seq = self.next_in;
        let s = self.slot_of(seq);
        if self.slots[s].busy {
            return Err(SlotInUse);
        }
        self.slots[s] = Slot {
            seq,
            busy: true,
            processed: false,
            pending: 0,
            len: 0,
            arrived: at,
            ready_at: at,
        };
        self.next_in += 1;
        Ok(seq)
    }

    /// Chunk `seq` was processed: `len` bytes to forward, releasable from `ready_at` on.
    /// Nothing happens when its slot holds another chunk.
    pub(super) fn processed(&mut self, seq: u64, len: usize, ready_at: Instant) {
        let s = self.slot_of(seq);
        let sl = &mut self.slots[s];
        if sl.busy && sl.seq == seq {
            sl.len = len;
            sl.processed = true;
            sl.ready_at = ready_at;
        }
    }

    /// Chunk `seq`'s slot and length, when it is processed and may be forwarded.
    pub(super) fn forwardable(&self, seq: u64) -> Option<(usize, usize)> {
        let s = self.slot_of(seq);
        let sl = &self.slots[s];
        (sl.processed && sl.seq == seq).then_some((s, sl.len))
    }

    /// A forward of chunk `seq` was posted: its slot waits for one more completion.
    pub(super) fn posted(&mut self, seq: u64) {
        let s = self.slot_of(seq);
        self.slots[s].pending += 1;
    }

    /// A forward of the chunk whose sequence number's low 40 bits are `seq` (as a work
    /// request id carries it) completed. Returns whether it counted: a completion for a
    /// chunk no longer in its slot (released, or dropped by a rewind) does not.
    pub(super) fn forwarded(&mut self, seq: u64) -> bool {
        let s = self.slot_of(seq);
        let sl = &mut self.slots[s];
        if sl.busy && sl.seq & SEQ_MASK == seq && sl.pending > 0 {
            sl.pending -= 1;
            true
        } else {
            false
        }
    }

    /// Releases slots in sequence order while the next one is processed, every forward from
    /// it completed, it was posted to every child (`posted_to_all`: every child was posted
    /// every chunk below this), and its `ready_at` is not after `now`. `release` is called
    /// with each slot's index and state before the slot is freed (to repost its receive and
    /// return its credit); its error stops the release there, that slot not freed.
    pub(super) fn release_in_order<E>(
        &mut self,
        now: Instant,
        posted_to_all: u64,
        mut release: impl FnMut(usize, &Slot) -> Result<(), E>,
    ) -> Result<Released, E> {
        let mut done = Released::default();
        while self.next_release < self.next_in {
            let s = self.slot_of(self.next_release);
            let sl = self.slots[s];
            if !(sl.busy && sl.processed && sl.pending == 0 && posted_to_all > sl.seq) {
                break;
            }
            if sl.ready_at > now {
                done.wake = Some(sl.ready_at);
                break;
            }
            release(s, &sl)?;
            self.slots[s].busy = false;
            self.slots[s].processed = false;
            self.next_release += 1;
            done.count += 1;
        }
        Ok(done)
    }

    /// The connections were set up again and the transfer goes on from chunk `to`: every slot
    /// is free (forwards still in flight no longer count), the next chunk to arrive and to
    /// release is `to`.
    pub(super) fn rewind(&mut self, to: u64) {
        for sl in &mut self.slots {
            sl.busy = false;
            sl.processed = false;
            sl.pending = 0;
        }
        self.next_in = to;
        self.next_release = to;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Releases what may go at `now`, with every chunk posted to every child; returns the
    /// sequence numbers released.
    fn release_all(r: &mut SlotRing, now: Instant) -> Vec<u64> {
        let mut out = Vec::new();
        r.release_in_order(now, u64::MAX, |_, sl| {
            out.push(sl.seq);
            Ok::<(), ()>(())
        })
        .unwrap();
        out
    }

    /// Arrives and processes the next chunk (`len` bytes).
    fn take(r: &mut SlotRing, len: usize) -> u64 {
        let now = Instant::now();
        let seq = r.arrive(now).unwrap();
        r.processed(seq, len, now);
        seq
    }

    #[test]
    fn chunks_take_their_slots_and_release_in_order() {
        let mut r = SlotRing::new(4, 0);
        assert!(r.next_is_free());
        for want in 0..4 {
            assert_eq!(take(&mut r, 100 + want as usize), want);
        }
        assert_eq!(r.next_in(), 4);
        // The ring is full: chunk 4 would land on chunk 0's slot.
        assert!(!r.next_is_free());
        assert_eq!(r.slot_of(4), 0);
        assert_eq!(r.forwardable(2), Some((2, 102)));
        assert_eq!(release_all(&mut r, Instant::now()), vec![0, 1, 2, 3]);
        assert_eq!(r.next_release(), 4);
        assert!(r.next_is_free());
        assert_eq!(take(&mut r, 7), 4);
        assert_eq!(r.forwardable(4), Some((0, 7)));
        // Chunk 0 is gone from its slot.
        assert_eq!(r.forwardable(0), None);
    }

    #[test]
    fn a_duplicate_arrival_into_a_busy_slot_is_refused() {
        let mut r = SlotRing::new(2, 0);
        take(&mut r, 10);
        take(&mut r, 10);
        // Chunk 2 arrives before chunk 0 was released: its sender ignored the credits.
        assert_eq!(r.arrive(Instant::now()), Err(SlotInUse));
        // Nothing changed: chunk 0 is still there, chunk 2 is still the next.
        assert_eq!(r.next_in(), 2);
        assert_eq!(r.forwardable(0), Some((0, 10)));
        assert_eq!(release_all(&mut r, Instant::now()), vec![0, 1]);
        assert_eq!(r.arrive(Instant::now()), Ok(2));
    }

    #[test]
    fn an_unprocessed_chunk_holds_back_the_ones_after_it() {
        let mut r = SlotRing::new(4, 0);
        let now = Instant::now();
        assert_eq!(r.arrive(now), Ok(0));
        take(&mut r, 10);
        assert_eq!(r.forwardable(0), None, "not processed yet");
        assert!(release_all(&mut r, now).is_empty());
        r.processed(0, 10, now);
        assert_eq!(release_all(&mut r, Instant::now()), vec![0, 1]);
    }

    #[test]
    fn forwards_in_flight_and_unposted_children_hold_a_release() {
        let mut r = SlotRing::new(4, 0);
        for _ in 0..3 {
            take(&mut r, 10);
        }
        // Chunk 0 went to two children, chunk 1 to one; chunk 1's forward completes first.
        r.posted(0);
        r.posted(0);
        r.posted(1);
        assert!(r.forwarded(1));
        assert!(r.forwarded(0));
        let now = Instant::now();
        assert!(
            release_all(&mut r, now).is_empty(),
            "chunk 0 still in flight"
        );
        assert!(r.forwarded(0));
        assert!(!r.forwarded(0), "one completion more than was posted");
        // Every child was posted chunks 0 and 1, not yet chunk 2.
        let mut out = Vec::new();
        let done = r
            .release_in_order(now, 2, |s, sl| {
                out.push((s, sl.seq));
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(done.count, 2);
        assert_eq!(out, vec![(0, 0), (1, 1)]);
        assert_eq!(release_all(&mut r, now), vec![2]);
    }

    #[test]
    fn a_throttled_slot_is_released_at_its_time() {
        let mut r = SlotRing::new(4, 0);
        let now = Instant::now();
        let later = now + Duration::from_millis(50);
        let seq = r.arrive(now).unwrap();
        r.processed(seq, 10, later);
        take(&mut r, 10);
        let done = r
            .release_in_order(now, u64::MAX, |_, _| Ok::<(), ()>(()))
            .unwrap();
        assert_eq!(
            done,
            Released {
                count: 0,
                wake: Some(later)
            }
        );
        assert_eq!(release_all(&mut r, later), vec![0, 1]);
    }

    #[test]
    fn a_failed_release_leaves_the_slot_busy() {
        let mut r = SlotRing::new(4, 0);
        take(&mut r, 10);
        take(&mut r, 10);
        let mut calls = 0;
        let res = r.release_in_order(Instant::now(), u64::MAX, |_, sl| {
            calls += 1;
            if sl.seq == 1 {
                Err("credit lost")
            } else {
                Ok(())
            }
        });
        assert_eq!(res, Err("credit lost"));
        assert_eq!(calls, 2);
        assert_eq!(r.next_release(), 1);
        assert_eq!(r.forwardable(1), Some((1, 10)));
    }

    #[test]
    fn a_rewind_frees_every_slot_and_drops_forwards_in_flight() {
        let mut r = SlotRing::new(4, 0);
        for _ in 0..4 {
            take(&mut r, 10);
        }
        r.posted(2);
        assert_eq!(release_all(&mut r, Instant::now()), vec![0, 1]);
        // A heal: the transfer goes on from chunk 1, which this node already released.
        r.rewind(1);
        assert_eq!((r.next_in(), r.next_release()), (1, 1));
        assert!(r.next_is_free());
        assert_eq!(r.forwardable(2), None);
        // The forward of chunk 2 posted before the rewind completes late: it does not count.
        assert!(!r.forwarded(2));
        // Chunks 1.. arrive again, into their slots, and go through as before.
        for want in 1..5 {
            assert_eq!(take(&mut r, 20), want);
        }
        assert_eq!(release_all(&mut r, Instant::now()), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_rewind_forward_skips_what_never_came() {
        let mut r = SlotRing::new(4, 5);
        assert_eq!(r.slot_of(5), 1);
        assert_eq!(take(&mut r, 10), 5);
        r.rewind(9);
        assert_eq!(take(&mut r, 10), 9);
        assert_eq!(r.forwardable(9), Some((1, 10)));
        assert_eq!(release_all(&mut r, Instant::now()), vec![9]);
    }

    #[test]
    fn completions_carry_the_low_40_bits_of_a_sequence_number() {
        let big = (1u64 << 40) + 3;
        let mut r = SlotRing::new(1, big);
        take(&mut r, 10);
        r.posted(big);
        assert!(r.forwarded(big & SEQ_MASK));
        assert_eq!(release_all(&mut r, Instant::now()), vec![big]);
    }
}
