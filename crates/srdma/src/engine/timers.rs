//! Timers: the QPs' retransmission and other timeouts, and the GSO path probes' deadlines.

use std::time::Duration;

use srdma_proto::Ctx;

use super::probe::PathGso;
use super::{QpSlot, Shared, State};

impl Shared {
    /// Runs due timers; returns the time until the next one (also kept in `next_timer`).
    pub(super) fn run_timers(&self, st: &mut State) -> Option<Duration> {
        let now = self.now();
        let mut due = std::mem::take(&mut st.due);
        due.clear();
        let mut next: Option<Duration> = None;
        for (&qpn, slot) in &st.qps {
            if let Some(t) = slot.qp.poll_timeout() {
                if t <= now {
                    due.push(qpn);
                } else {
                    next = Some(next.map_or(t - now, |n| n.min(t - now)));
                }
            }
        }
        for &qpn in &due {
            let State {
                mrs,
                mem,
                qps,
                srqs,
                ..
            } = &mut *st;
            if let Some(slot) = qps.get_mut(&qpn) {
                let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
                let mut ctx = Ctx { now, mrs, mem, srq };
                slot.qp.handle_timeout(&mut ctx);
            }
            self.flush(st, qpn);
            if let Some(t) = st.qps.get(&qpn).and_then(|s| s.qp.poll_timeout()) {
                let d = t.saturating_sub(now);
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        st.due = due;
        // Probes at their deadline decide; those still waiting keep the timer.
        self.probe_answered(st, u32::MAX, now);
        if st.probing > 0 {
            for p in st.paths.values() {
                if let PathGso::Probing { deadline, .. } = *p {
                    let d = Duration::from_nanos(deadline).saturating_sub(now);
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
        }
        st.next_timer = next.map_or(u64::MAX, |d| (now + d).as_nanos() as u64);
        next
    }
}

/// Keeps `next_timer` (the earliest timer an application's poll must run) at or before the
/// QP's timer, so a timer armed by a post or a packet fires while an application polls.
pub(super) fn note_timer(next_timer: &mut u64, slot: &QpSlot) {
    if let Some(t) = slot.qp.poll_timeout() {
        *next_timer = (*next_timer).min(t.as_nanos() as u64);
    }
}
