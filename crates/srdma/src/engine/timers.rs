//! Timers: the QPs' retransmission, RNR and pacing deadlines, and the GSO path probes'.
//!
//! Every QP with a deadline has one entry in a set ordered by it ([`TimerSet`]), kept up to
//! date whenever the QP was handled ([`note_timer`]); firing timers takes the due entries
//! off its front. The cost of timers follows the QPs that have one, not all QPs (ten
//! thousand idle QPs cost nothing; they used to be walked whenever any timer fired).

use std::collections::BTreeSet;
use std::time::Duration;

use srdma_proto::Ctx;

use super::{QpSlot, Shared, State};

/// The QPs' deadlines: `(deadline in ns since the epoch, QPN)`, one entry per QP that has
/// one (the slot remembers which: `QpSlot::timer_at`); and the earliest timer an
/// application's poll must run, the GSO probes' too.
#[derive(Debug)]
pub(super) struct TimerSet {
    set: BTreeSet<(u64, u32)>,
    /// The QPs whose timers fire now (kept to reuse its allocation).
    due: Vec<u32>,
    /// The earliest timer, in ns since the epoch (u64::MAX: none): at or before the first
    /// entry of `set` and every probe's deadline (run early, timers find nothing due).
    next: u64,
}

impl TimerSet {
    /// No deadlines.
    pub(super) fn new() -> TimerSet {
        TimerSet {
            set: BTreeSet::new(),
            due: Vec::with_capacity(64),
            next: u64::MAX,
        }
    }

    /// When (ns since the epoch) the earliest timer fires (u64::MAX: none): an application's
    /// poll runs the timers from then on.
    pub(super) fn next(&self) -> u64 {
        self.next
    }

    /// A deadline at `t` (ns since the epoch): the next timer fires no later.
    pub(super) fn expect(&mut self, t: u64) {
        self.next = self.next.min(t);
    }

    /// Puts QP `qpn`'s entry at its slot's current deadline (none: no entry).
    fn arm(&mut self, qpn: u32, slot: &mut QpSlot) -> u64 {
        let t = slot
            .qp
            .poll_timeout()
            .map_or(u64::MAX, |t| t.as_nanos() as u64);
        if t != slot.timer_at {
            if slot.timer_at != u64::MAX {
                self.set.remove(&(slot.timer_at, qpn));
            }
            if t != u64::MAX {
                self.set.insert((t, qpn));
            }
            slot.timer_at = t;
        }
        t
    }

    /// Takes QP `qpn`'s entry out (the QP is destroyed).
    pub(super) fn disarm(&mut self, qpn: u32, slot: &QpSlot) {
        if slot.timer_at != u64::MAX {
            self.set.remove(&(slot.timer_at, qpn));
        }
    }

    /// The QPs whose deadline is at or before `now`, taken out, into `due`.
    fn take_due(&mut self, now: u64, due: &mut Vec<u32>) {
        while let Some(&(t, qpn)) = self.set.first() {
            if t > now {
                break;
            }
            self.set.pop_first();
            due.push(qpn);
        }
    }

    /// The earliest deadline and its QP.
    fn first(&self) -> Option<(u64, u32)> {
        self.set.first().copied()
    }
}

impl Shared {
    /// Runs due timers; returns the time until the next one (also kept: `TimerSet::next`).
    pub(super) fn run_timers(&self, st: &mut State) -> Option<Duration> {
        let now = self.now();
        let now_ns = now.as_nanos() as u64;
        let mut due = std::mem::take(&mut st.timers.due);
        due.clear();
        st.timers.take_due(now_ns, &mut due);
        for &qpn in &due {
            let State {
                mrs,
                mem,
                qps,
                srqs,
                ..
            } = &mut *st;
            if let Some(slot) = qps.get_mut(&qpn) {
                // Out of the set now: `queue_out` puts it back at its next deadline.
                slot.timer_at = u64::MAX;
                let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
                let mut ctx = Ctx { now, mrs, mem, srq };
                slot.qp.handle_timeout(&mut ctx);
            }
            self.queue_out(st, qpn);
        }
        st.timers.due = due;
        self.send_queued(st);
        let mut next = st
            .timers
            .first()
            .map(|(t, _)| Duration::from_nanos(t).saturating_sub(now));
        // A pacing deadline first: the sleep towards it is kept to the microsecond.
        st.timing.pace.set(match st.timers.first() {
            Some((t, qpn))
                if st
                    .qps
                    .get(&qpn)
                    .and_then(|s| s.qp.pace_deadline())
                    .is_some_and(|p| p.as_nanos() as u64 == t) =>
            {
                Some(t)
            }
            _ => None,
        });
        // Probes at their deadline decide; those still waiting keep the timer.
        self.probe_answered(st, u32::MAX, now);
        for deadline in st.probes.deadlines() {
            let d = Duration::from_nanos(deadline).saturating_sub(now);
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        st.timers.next = next.map_or(u64::MAX, |d| (now + d).as_nanos() as u64);
        next
    }
}

/// Puts QP `qpn`'s deadline in the set and keeps `TimerSet::next` (the earliest timer an
/// application's poll must run) at or before it, so a timer armed by a post or a packet
/// fires while an application polls.
pub(super) fn note_timer(st: &mut State, qpn: u32) {
    let State { qps, timers, .. } = st;
    if let Some(slot) = qps.get_mut(&qpn) {
        let t = timers.arm(qpn, slot);
        timers.expect(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_entries_come_off_the_front_in_order() {
        let mut t = TimerSet::new();
        for (at, qpn) in [(30, 3), (10, 1), (20, 2), (40, 4)] {
            t.set.insert((at, qpn));
        }
        let mut due = Vec::new();
        t.take_due(25, &mut due);
        assert_eq!(due, [1, 2]);
        assert_eq!(t.first(), Some((30, 3)));
        assert_eq!(t.set.len(), 2);
    }
}
