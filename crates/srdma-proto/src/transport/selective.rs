//! Selective repeat, between srdma peers that agreed to it ([`super::Reliability`]): the
//! responder keeps request packets that arrive ahead of the expected PSN (a copy of each)
//! instead of dropping them, executes them in order once the gap before them is filled, and
//! reports what it keeps in SACK blocks (`SRDMA_SACK`); the requester resends only what is
//! missing (IRN, Mittal et al., SIGCOMM 2018; TCP SACK, RFC 2018).
//!
//! Pure bookkeeping, both halves: [`Reorder`] (the responder's kept packets: slot `i` holds
//! the packet with PSN `expected + i`; slot 0, the expected PSN itself, is never held: it is
//! executed on arrival) and [`Scoreboard`] (the requester's record of the PSN ranges the
//! responder reported).

use std::collections::VecDeque;

use srdma_wire::Psn;
use srdma_wire::sack::{SACK_BLOCKS, SackRepr};

/// The farthest ahead of the expected PSN a packet is kept: the largest window a requester
/// uses (`congestion::MAX_WINDOW_PSNS`).
pub const REORDER_PSNS: u32 = crate::congestion::MAX_WINDOW_PSNS;

/// The most bytes a QP keeps (a 1024-packet window of 4 KiB packets; a full buffer drops,
/// and the requester resends what was not reported).
pub const REORDER_BYTES: usize = 4 << 20;

/// What [`Reorder::hold`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Kept; `after_gap`: the PSN before it is missing (it starts a new run), so the
    /// requester should hear of the gap now.
    Kept { after_gap: bool },
    /// Already kept: a duplicate.
    Duplicate,
    /// Not kept: too far ahead, or no room.
    Dropped,
}

/// The packets kept ahead of the expected PSN.
#[derive(Debug, Default)]
pub struct Reorder {
    slots: VecDeque<Option<Vec<u8>>>,
    bytes: usize,
    kept: usize,
}

impl Reorder {
    /// Keeps `packet`, `ahead` PSNs after the expected one (`ahead >= 1`).
    pub fn hold(&mut self, ahead: u32, packet: impl FnOnce() -> Vec<u8>) -> Held {
        if ahead == 0 || ahead >= REORDER_PSNS {
            return Held::Dropped;
        }
        let i = ahead as usize;
        if self.slots.get(i).is_some_and(Option::is_some) {
            return Held::Duplicate;
        }
        let bytes = packet();
        if self.bytes + bytes.len() > REORDER_BYTES {
            return Held::Dropped;
        }
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        let after_gap = self.slots[i - 1].is_none();
        self.bytes += bytes.len();
        self.kept += 1;
        self.slots[i] = Some(bytes);
        Held::Kept { after_gap }
    }

    /// The expected PSN moved `by` PSNs on (the packet at it was executed, or a READ took
    /// several): packets now at the expected PSN come out of [`Reorder::take`].
    pub fn advance(&mut self, by: u32) {
        for _ in 0..by {
            let Some(slot) = self.slots.pop_front() else {
                break;
            };
            if let Some(p) = slot {
                // Skipped over (a READ's response PSNs never hold requests): forget it.
                self.bytes -= p.len();
                self.kept -= 1;
            }
        }
    }

    /// The packet kept for the expected PSN, if any (taken out: execute it, then
    /// [`Reorder::advance`]).
    pub fn take(&mut self) -> Option<Vec<u8>> {
        let p = self.slots.front_mut()?.take()?;
        self.bytes -= p.len();
        self.kept -= 1;
        Some(p)
    }

    /// How many packets are kept.
    pub fn len(&self) -> usize {
        self.kept
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.kept == 0
    }

    /// Forgets everything (the requester will resend it: an error, a reset, an RNR NAK).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.bytes = 0;
        self.kept = 0;
    }

    /// The first [`SACK_BLOCKS`] runs of kept packets, as PSN ranges after `expected`.
    pub fn sack(&self, expected: Psn) -> SackRepr {
        let mut r = SackRepr::default();
        let mut n = 0;
        let mut start: Option<usize> = None;
        for i in 0..=self.slots.len() {
            let held = self.slots.get(i).is_some_and(Option::is_some);
            match (held, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    r.blocks[n] = (expected.add(s as u32), expected.add(i as u32));
                    n += 1;
                    start = None;
                    if n == SACK_BLOCKS {
                        break;
                    }
                }
                _ => {}
            }
        }
        r
    }
}

/// The most ranges a scoreboard keeps: SACKs that would split it further (a peer that
/// reports every other packet) are taken in part.
const SCOREBOARD_RANGES: usize = 256;

/// The requester's record of what the responder reported it holds: sorted, disjoint PSN
/// ranges at or after the oldest unacknowledged PSN.
#[derive(Debug, Default, Clone)]
pub struct Scoreboard {
    ranges: Vec<(Psn, Psn)>,
}

impl Scoreboard {
    /// The responder holds `start..end`.
    pub fn insert(&mut self, start: Psn, end: Psn) {
        if !start.before(end) {
            return;
        }
        let (mut s, mut e) = (start, end);
        // Absorb every range that overlaps or touches, then insert in order.
        self.ranges.retain(|&(a, b)| {
            let apart = b.before(s) || e.before(a);
            if !apart {
                if a.before(s) {
                    s = a;
                }
                if b.after(e) {
                    e = b;
                }
            }
            apart
        });
        if self.ranges.len() >= SCOREBOARD_RANGES {
            return;
        }
        let at = self
            .ranges
            .iter()
            .position(|&(a, _)| s.before(a))
            .unwrap_or(self.ranges.len());
        self.ranges.insert(at, (s, e));
    }

    /// Whether the responder reported `psn`.
    pub fn contains(&self, psn: Psn) -> bool {
        self.ranges
            .iter()
            .any(|&(a, b)| !psn.before(a) && psn.before(b))
    }

    /// Everything before `acked_to` is acknowledged: forget it.
    pub fn prune(&mut self, acked_to: Psn) {
        self.ranges.retain(|&(_, b)| b.after(acked_to));
        if let Some(first) = self.ranges.first_mut() {
            if first.0.before(acked_to) {
                first.0 = acked_to;
            }
        }
    }

    /// The `n`th highest PSN reported (1: the highest), if `n` are: the PSNs before it have
    /// at least `n` reported beyond them.
    pub fn nth_highest(&self, n: u32) -> Option<Psn> {
        let mut above = 0u32;
        for &(a, b) in self.ranges.iter().rev() {
            let len = b.diff(a).max(0) as u32;
            if above + len >= n {
                return Some(b.sub(n - above));
            }
            above += len;
        }
        None
    }

    /// The end of the highest range reported.
    pub fn high(&self) -> Option<Psn> {
        self.ranges.last().map(|&(_, b)| b)
    }

    /// Forgets every report (after a timeout: a responder may have dropped what it said it
    /// held, or lied; RFC 2018's reneging).
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// How many PSNs are reported.
    pub fn count(&self) -> u32 {
        self.ranges
            .iter()
            .map(|&(a, b)| b.diff(a).max(0) as u32)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkt(n: u8) -> impl FnOnce() -> Vec<u8> {
        move || vec![n; 100]
    }

    #[test]
    fn keeps_reports_and_hands_back_in_order() {
        let mut r = Reorder::default();
        let e = Psn::new(0xFF_FFFE);
        assert_eq!(r.hold(2, pkt(2)), Held::Kept { after_gap: true });
        assert_eq!(r.hold(3, pkt(3)), Held::Kept { after_gap: false });
        assert_eq!(r.hold(3, pkt(9)), Held::Duplicate);
        assert_eq!(r.hold(6, pkt(6)), Held::Kept { after_gap: true });
        assert_eq!(r.len(), 3);
        let s = r.sack(e);
        assert_eq!(
            s.blocks[0],
            (Psn::new(0), Psn::new(2)),
            "2..4 across the wrap"
        );
        assert_eq!(s.blocks[1], (Psn::new(4), Psn::new(5)));
        assert_eq!(s.ranges().count(), 2);
        // The expected packet executes; the one after is missing still.
        assert_eq!(r.take(), None);
        r.advance(1);
        assert_eq!(r.take(), None);
        r.advance(1);
        assert_eq!(r.take(), Some(vec![2; 100]));
        r.advance(1);
        assert_eq!(r.take(), Some(vec![3; 100]));
        r.advance(1);
        assert_eq!(r.take(), None);
        assert_eq!(r.len(), 1);
        r.clear();
        assert!(r.is_empty());
        assert_eq!(r.sack(e).ranges().count(), 0);
    }

    #[test]
    fn bounded_in_distance_and_bytes() {
        let mut r = Reorder::default();
        assert_eq!(r.hold(0, pkt(0)), Held::Dropped);
        assert_eq!(r.hold(REORDER_PSNS, pkt(0)), Held::Dropped);
        let big = || vec![0u8; REORDER_BYTES / 2];
        assert!(matches!(r.hold(1, big), Held::Kept { .. }));
        assert!(matches!(r.hold(2, big), Held::Kept { .. }));
        assert_eq!(r.hold(3, || vec![0]), Held::Dropped);
        // Advancing past kept packets (a READ's PSNs) forgets them.
        r.advance(3);
        assert!(r.is_empty());
        assert!(matches!(r.hold(1, || vec![0]), Held::Kept { .. }));
    }

    #[test]
    fn scoreboard_merges_prunes_and_wraps() {
        let p = Psn::new;
        let mut s = Scoreboard::default();
        s.insert(p(10), p(12));
        s.insert(p(20), p(25));
        s.insert(p(12), p(14));
        s.insert(p(5), p(5));
        assert_eq!(s.ranges, [(p(10), p(14)), (p(20), p(25))]);
        s.insert(p(13), p(21));
        assert_eq!(s.ranges, [(p(10), p(25))]);
        assert!(s.contains(p(10)) && s.contains(p(24)) && !s.contains(p(25)));
        assert_eq!(s.count(), 15);
        s.insert(p(30), p(32));
        assert_eq!(s.nth_highest(1), Some(p(31)));
        assert_eq!(s.nth_highest(3), Some(p(24)));
        assert_eq!(s.nth_highest(17), Some(p(10)));
        assert_eq!(s.nth_highest(18), None);
        s.clear();
        s.insert(p(10), p(25));
        s.prune(p(15));
        assert_eq!(s.ranges, [(p(15), p(25))]);
        s.prune(p(30));
        assert_eq!(s.count(), 0);
        s.insert(p(0xFF_FFF0), p(4));
        assert!(s.contains(p(1)) && s.contains(p(0xFF_FFFF)));
        assert_eq!(s.high(), Some(p(4)));
        for i in 0..1000 {
            s.insert(p(100 + 2 * i), p(101 + 2 * i));
        }
        assert_eq!(s.ranges.len(), SCOREBOARD_RANGES);
        s.clear();
        assert_eq!(s.high(), None);
    }

    #[test]
    fn at_most_four_blocks() {
        let mut r = Reorder::default();
        for i in 0..10 {
            r.hold(2 * i + 1, pkt(0));
        }
        let s = r.sack(Psn::new(100));
        assert_eq!(s.ranges().count(), SACK_BLOCKS);
        assert_eq!(s.blocks[3], (Psn::new(107), Psn::new(108)));
    }
}
