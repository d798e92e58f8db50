//! The completer (rxe `rxe_comp.c`): turns ACKs, NAKs, READ responses and atomic ACKs into
//! send completions, and runs the retransmission and RNR timers.

use std::time::Duration;

use srdma_wire::{Kind, NakCode, PacketRepr, Position, Psn, Syndrome};

use super::requester::scatter;

/// Reported PSNs beyond a hole that make it lost (RFC 6675's DupThresh).
const DUP_THRESH: u32 = 3;

/// Early retransmissions in a row double the wait up to this many times (2^3 = 8× the
/// measured RTO): a flow locked out of a full queue must come back while the others are
/// there still, not after they left.
const MAX_RTO_BACKOFF: u32 = 3;
use super::{Ctx, Qp, WqeState, send_wc};
use crate::wc::{SendFlags, WcStatus};
use crate::wr::SendOp;

impl Qp {
    /// A response packet (ACKNOWLEDGE, READ response, ATOMIC ACKNOWLEDGE) for this requester.
    pub(super) fn handle_response(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        if pkt.bth.opcode.kind() == Kind::Sack {
            self.handle_sack(ctx, pkt);
            return;
        }
        // A response for a PSN never sent is a ghost (IBA 9.7.5.1.2): drop it.
        if !psn.before(self.max_sent_psn) {
            self.counters.dropped_pkts += 1;
            if pkt.bth.opcode == srdma_wire::Opcode::RcAcknowledge {
                self.unproductive_acks += 1;
            }
            return;
        }
        self.counters.rcvd_pkts += 1;
        let op = pkt.bth.opcode;
        let before = self.comp_psn;
        match op.kind() {
            Kind::Acknowledge => {
                let Some(aeth) = pkt.aeth else { return };
                // An ACK or NAK for a PSN already acknowledged is stale (a delayed duplicate, or
                // a forgery): it changes nothing (rxe `check_psn`).
                if psn.before(self.comp_psn) {
                    self.unproductive_acks += 1;
                    return;
                }
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        let implied_nak = self.retire_acked(psn.add(1));
                        self.progress(ctx.now, before);
                        if implied_nak {
                            self.start_retry(ctx.now, false);
                        }
                    }
                    Syndrome::RnrNak { timer_code } => {
                        self.counters.rcvd_rnr_err += 1;
                        if self.retire_acked(psn) {
                            self.start_retry(ctx.now, false);
                            return;
                        }
                        self.rnr_retry(ctx.now, psn, timer_code);
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.counters.rcvd_seq_err += 1;
                        // The NAK acknowledges everything before the PSN it carries.
                        self.retire_acked(psn);
                        self.progress(ctx.now, before);
                        self.start_retry(ctx.now, false);
                    }
                    Syndrome::Nak(code) => {
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            // RemoteOperationalError, InvalidRdRequest and reserved codes
                            // (rxe `check_ack`: unknown NAK → REM_OP_ERR).
                            _ => WcStatus::RemOpErr,
                        };
                        self.retire_acked(psn);
                        self.fail_head(status);
                    }
                    Syndrome::Reserved(_) => self.counters.dropped_pkts += 1,
                }
            }
            Kind::ReadResponse => {
                self.read_response(ctx, pkt);
                self.progress(ctx.now, before);
            }
            Kind::AtomicAcknowledge => {
                self.atomic_ack(ctx, pkt);
                self.progress(ctx.now, before);
            }
            _ => self.counters.dropped_pkts += 1,
        }
    }

    /// Selective repeat: a SACK acknowledges everything before its PSN (the responder's
    /// expected one) and reports ranges it holds beyond; the holes below the highest one are
    /// queued to be sent again (once per loss episode: a hole that stays is the timer's).
    /// Only what was sent and not yet acknowledged is believed: a block that claims more is
    /// ignored, so a forged SACK can neither acknowledge what never left nor hide a loss for
    /// longer than one retransmission timeout (the timer forgets every report).
    fn handle_sack(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        let valid = self.reliability == super::Reliability::SelectiveRepeat
            && !psn.after(self.max_sent_psn)
            && !psn.before(self.comp_psn);
        let Some(sack) = pkt.sack.filter(|_| valid) else {
            self.counters.dropped_pkts += 1;
            self.unproductive_acks += 1;
            return;
        };
        self.counters.rcvd_pkts += 1;
        let before = self.comp_psn;
        if self.retire_acked(psn) {
            // A READ or atomic before it went unanswered: its request is resent whole.
            self.progress(ctx.now, before);
            self.start_retry(ctx.now, false);
            return;
        }
        self.progress(ctx.now, before);
        let mut reported = false;
        for (s, e) in sack.ranges() {
            if s.before(e) && !s.before(self.comp_psn) && !e.after(self.max_sent_psn) {
                self.scoreboard.insert(s, e);
                reported = true;
            }
        }
        let Some(high) = self.scoreboard.high().filter(|_| reported) else {
            return;
        };
        // A hole is lost once DUP_THRESH reported PSNs lie beyond it (RFC 6675): one or
        // two reports above it are reordering, with it still on its way. Or once the tail
        // loss probe is reported: what was sent before it and did not arrive first is lost.
        let probed = self
            .tlp_psn
            .filter(|&p| self.scoreboard.contains(p))
            .inspect(|_| self.tlp_psn = None);
        let lost_before = match (self.scoreboard.nth_highest(DUP_THRESH), probed) {
            (Some(a), Some(b)) => Some(if a.after(b) { a } else { b }),
            (a, b) => a.or(b),
        };
        let Some(lost_before) = lost_before.filter(|l| !l.after(high)) else {
            return;
        };
        let mut p = if self.resend_upto.after(self.comp_psn) {
            self.resend_upto
        } else {
            self.comp_psn
        };
        let mut queued = false;
        while p.before(lost_before) {
            if !self.scoreboard.contains(p) {
                self.resend.push_back(p);
                queued = true;
            }
            p = p.add(1);
        }
        if lost_before.after(self.resend_upto) {
            self.resend_upto = lost_before;
        }
        if queued {
            self.counters.rcvd_seq_err += 1;
            self.cc.on_loss(ctx.now, self.max_sent_psn);
        }
    }

    /// Completes, in order, the SEND/WRITE WQEs acknowledged by a response that covers every
    /// PSN before `upto`, and moves `comp_psn` up to `upto` inside a partly acknowledged
    /// SEND/WRITE. Returns true when a READ or atomic before `upto` is still unanswered: its
    /// response was lost (an implied NAK, IBA 9.9.2.1).
    fn retire_acked(&mut self, upto: Psn) -> bool {
        loop {
            let Some(w) = self.sq.front() else {
                return false;
            };
            if w.state == WqeState::Posted || !w.first_psn.before(upto) {
                return false;
            }
            if w.wr.op.is_read_or_atomic() {
                // Only its own response completes a READ or atomic.
                return true;
            }
            // Every PSN of the message acknowledged: it is complete, even if a retry is
            // resending it right now (ACKs only cover PSNs that were sent, see the ghost check).
            if !w.last_psn.before(upto) {
                // Partly acknowledged multi-packet message.
                if upto.after(self.comp_psn) {
                    self.comp_psn = upto;
                }
                return false;
            }
            self.comp_psn = w.last_psn.add(1);
            self.complete_head(WcStatus::Success);
        }
    }

    /// Pops the head WQE with `status`.
    fn complete_head(&mut self, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else { return };
        self.rd_atomic = self.rd_atomic.saturating_sub(w.rd_slots());
        let signaled = w.wr.flags.contains(SendFlags::SIGNALED);
        self.push_send_wc(send_wc(self.cfg.qpn, &w, status), signaled);
        self.req_cursor = self.req_cursor.saturating_sub(1);
        // A WQE that failed locally while earlier ones waited for ACKs is reported now.
        if let Some(status) = self.sq.front().and_then(|w| w.error) {
            self.fail_head(status);
        }
    }

    /// Completes the head WQE in error and moves the QP to ERR, flushing the rest.
    fn fail_head(&mut self, status: WcStatus) {
        if let Some(w) = self.sq.pop_front() {
            self.push_send_wc(send_wc(self.cfg.qpn, &w, status), true);
        }
        self.enter_error(false);
    }

    /// After a response: if `comp_psn` moved past `before`, the peer made progress — fresh
    /// retry budgets (rxe `reset_retry_counters`) and a restarted timer. A response that
    /// acknowledges nothing new (a duplicate ACK) changes neither, or duplicates could keep a
    /// dead exchange retrying forever.
    fn progress(&mut self, now: Duration, before: Psn) {
        if self.comp_psn == before {
            return;
        }
        self.scoreboard.prune(self.comp_psn);
        let newly = self.comp_psn.diff(before).max(0) as u32;
        let outstanding = self.max_sent_psn.diff(self.comp_psn).max(0) as u32;
        self.cc
            .on_ack(now, self.comp_psn, newly, outstanding, self.max_sent_psn);
        self.retry_left = self.attr.retry_cnt;
        self.rnr_retry_left = self.attr.rnr_retry;
        self.retry_started_at = None;
        self.rearm(now);
    }

    fn rearm(&mut self, now: Duration) {
        self.retrans_deadline = if self.comp_psn.before(self.max_sent_psn) {
            crate::timer::ack_timer(self.attr.timeout).map(|t| now + t)
        } else {
            None
        };
        self.rto_backoff = 0;
        self.rto_deadline = None;
        self.tlp_deadline = None;
        self.tlp_sent = false;
        if self.comp_psn.before(self.max_sent_psn) {
            self.arm_rto(now);
        }
    }

    /// Selective repeat: arms the retransmission on measured RTT (RFC 6298's RTO, doubled
    /// for each early retransmission in a row), if it comes before the IBTA timer.
    pub(super) fn arm_rto(&mut self, now: Duration) {
        if self.reliability != super::Reliability::SelectiveRepeat {
            return;
        }
        let rto = self
            .cc
            .rtt()
            .rto()
            .saturating_mul(1 << self.rto_backoff.min(MAX_RTO_BACKOFF));
        let at = now + rto;
        if self.retrans_deadline.is_none_or(|d| at < d) {
            self.rto_deadline = Some(at);
        }
        // The tail loss probe comes first: a lost tail (nothing after it arrives, so no
        // SACK tells of it) is found in two round trips, and costs one packet, where the
        // timeout collapses the window.
        if !self.tlp_sent && self.tlp_deadline.is_none() {
            let pto = self.cc.rtt().pto();
            if pto < rto {
                self.tlp_deadline = Some(now + pto);
            }
        }
    }

    fn read_response(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        if psn.before(self.comp_psn) {
            return; // duplicate
        }
        // Responses implicitly acknowledge every earlier SEND/WRITE.
        if self.retire_acked(psn) {
            let head_psn = self
                .sq
                .front()
                .map(|w| w.first_psn.add(w.read_done / self.pmtu()));
            if head_psn != Some(psn) {
                self.start_retry(ctx.now, false);
                return;
            }
        }
        let pmtu = self.pmtu();
        let Some(w) = self.sq.front() else { return };
        if !matches!(w.wr.op, SendOp::Read { .. }) || w.state == WqeState::Posted {
            self.counters.dropped_pkts += 1;
            return;
        }
        // In order only: a later response means one was lost; the timer or a NAK recovers.
        if psn != self.comp_psn {
            return;
        }
        // Any position is accepted at `comp_psn`: after a retry the responder restarts with
        // FIRST/ONLY (IBA: a new request) or, as rxe's `read_reply` replays, with MIDDLE/LAST
        // of the original READ. The payload must still fit its place in the message.
        let position = pkt.bth.opcode.position();
        if let Some(aeth) = pkt.aeth {
            if !matches!(aeth.syndrome, Syndrome::Ack { .. }) {
                self.fail_head(WcStatus::BadRespErr);
                return;
            }
        }
        let k = psn.diff(w.first_psn) as u32;
        let offset = u64::from(k) * u64::from(pmtu);
        let expect = u64::from(w.len).saturating_sub(offset).min(u64::from(pmtu));
        if pkt.payload.len() as u64 != expect || (w.len > 0 && offset >= u64::from(w.len)) {
            self.fail_head(WcStatus::BadRespErr);
            return;
        }
        if let Err(status) = scatter(ctx, self.cfg.pd, w.wr.sges.as_slice(), offset, pkt.payload) {
            self.fail_head(status);
            return;
        }
        let w = &mut self.sq[0];
        w.read_done = (offset + expect) as u32;
        let ends = matches!(position, Some(Position::Last | Position::Only));
        if !ends && w.read_done == w.len {
            // FIRST/MIDDLE carrying the final bytes: no LAST can follow.
            self.fail_head(WcStatus::BadRespErr);
            return;
        }
        self.comp_psn = psn.add(1);
        if ends {
            if w.read_done == w.len {
                self.complete_head(WcStatus::Success);
            } else if (k + 1) % w.read_seg.max(1) == 0 {
                // The last response of a segment (see `read_segment`): its request is
                // answered, and a slot it held is free.
                if w.extra_reads > 0 {
                    w.extra_reads -= 1;
                    self.rd_atomic = self.rd_atomic.saturating_sub(1);
                }
            } else {
                self.fail_head(WcStatus::BadRespErr);
            }
        }
    }

    fn atomic_ack(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        if psn.before(self.comp_psn) {
            return;
        }
        if self.retire_acked(psn) {
            let head = self.sq.front().map(|w| w.first_psn);
            if head != Some(psn) {
                self.start_retry(ctx.now, false);
                return;
            }
        }
        let Some(w) = self.sq.front() else { return };
        if !w.wr.op.is_atomic() || w.first_psn != psn || w.state == WqeState::Posted {
            self.counters.dropped_pkts += 1;
            return;
        }
        if !matches!(pkt.aeth.map(|a| a.syndrome), Some(Syndrome::Ack { .. })) {
            self.fail_head(WcStatus::BadRespErr);
            return;
        }
        let orig = pkt.atomic_ack_eth.map_or(0, |a| a.orig);
        // The original value lands in the local buffer in host byte order, as rxe writes it.
        if let Err(status) = scatter(
            ctx,
            self.cfg.pd,
            w.wr.sges.as_slice(),
            0,
            &orig.to_ne_bytes(),
        ) {
            self.fail_head(status);
            return;
        }
        self.comp_psn = psn.add(1);
        self.complete_head(WcStatus::Success);
    }

    /// RNR NAK for the request at `psn`: wait the timer it names, then resend from there,
    /// unless `rnr_retry` is spent (7 = retry forever, IBA 9.7.5.2.8).
    fn rnr_retry(&mut self, now: Duration, psn: Psn, timer_code: u8) {
        if self.rnr_retry_left == 0 {
            self.counters.retry_rnr_exceeded_err += 1;
            self.fail_head(WcStatus::RnrRetryExcErr);
            return;
        }
        if self.rnr_retry_left != 7 {
            self.rnr_retry_left -= 1;
        }
        if psn.after(self.comp_psn) {
            self.comp_psn = psn;
        }
        self.rewind();
        self.retrans_deadline = None;
        self.rto_deadline = None;
        self.rnr_deadline = Some(now + crate::timer::rnr_timer(timer_code));
    }

    /// Starts resending from `comp_psn`, charging one retry. NAK- and implied-NAK-triggered
    /// retries of the same PSN are charged once (rxe `started_retry`); timeouts always count.
    fn start_retry(&mut self, now: Duration, timeout: bool) {
        if self.sq.is_empty() || !self.comp_psn.before(self.max_sent_psn) {
            return;
        }
        if !timeout && self.retry_started_at == Some(self.comp_psn) {
            return;
        }
        // IBA: retry_cnt 7 means seven retries. (rxe treats 7 as "forever"; a dead peer would
        // then hang the requester, which srdma does not copy.)
        if self.retry_left == 0 {
            self.counters.retry_exceeded_err += 1;
            self.fail_head(WcStatus::RetryExcErr);
            return;
        }
        self.retry_left -= 1;
        self.counters.completer_retry_err += 1;
        if timeout {
            self.cc.on_timeout(now);
        } else {
            self.cc.on_loss(now, self.max_sent_psn);
        }
        self.retry_started_at = Some(self.comp_psn);
        self.rewind();
        self.rearm(now);
    }

    /// Points the requester back at `comp_psn`: the WQE holding it resumes from that packet
    /// (a partly answered READ is re-requested from the first missing byte, rxe `req_retry`),
    /// every later WQE is resent whole with the PSNs it already had.
    fn rewind(&mut self) {
        let comp = self.comp_psn;
        let mut cursor = None;
        for (i, w) in self.sq.iter_mut().enumerate() {
            if w.state == WqeState::Posted {
                break;
            }
            let from = if w.first_psn.before(comp) && !w.last_psn.before(comp) {
                comp.diff(w.first_psn) as u32
            } else {
                0
            };
            w.next_pkt = if w.wr.op.is_atomic() { 0 } else { from };
            w.state = WqeState::Active;
            // A READ's segments are asked for again from `from`, one slot at a time.
            self.rd_atomic = self.rd_atomic.saturating_sub(w.extra_reads);
            w.extra_reads = 0;
            cursor.get_or_insert(i);
        }
        self.req_cursor = cursor.unwrap_or(self.req_cursor);
        self.noack_pkts = 0;
        // Everything is sent again: no report holds, no hole is queued.
        self.scoreboard.clear();
        self.resend.clear();
        self.resend_upto = comp;
    }

    /// Timers due at `now`.
    pub(super) fn completer_timeout(&mut self, now: Duration) {
        if self.tlp_deadline.is_some_and(|d| now >= d) {
            self.tlp_deadline = None;
            if self.comp_psn.before(self.max_sent_psn)
                && self.rnr_deadline.is_none()
                && self.resend.is_empty()
                && !std::mem::replace(&mut self.tlp_sent, true)
            {
                self.tlp_probe = Some(self.max_sent_psn.sub(1));
            }
        }
        if self.rto_deadline.is_some_and(|d| now >= d) {
            self.rto_deadline = None;
            if self.comp_psn.before(self.max_sent_psn) && self.rnr_deadline.is_none() {
                // Early retransmission: charges no retry (the IBTA timer does that). As a
                // TCP RTO, the window collapses (undone if the next ACK shows the timeout
                // was spurious: F-RTO) and every packet sent and not acknowledged counts as
                // lost (RFC 6675 after a timeout): the first timeout resends what the
                // responder did not report, in the order sent and as the window lets them
                // go; a second in a row trusts no report and goes back to the oldest
                // unacknowledged PSN.
                self.cc.on_early_timeout(now, self.comp_psn);
                if self.rto_backoff == 0 {
                    self.resend.clear();
                    let mut p = self.comp_psn;
                    while p.before(self.max_sent_psn) {
                        if !self.scoreboard.contains(p) {
                            self.resend.push_back(p);
                        }
                        p = p.add(1);
                    }
                    self.resend_upto = self.max_sent_psn;
                } else {
                    self.rewind();
                }
                self.rto_backoff += 1;
                self.arm_rto(now);
            }
        }
        if self.rnr_deadline.is_some_and(|d| now >= d) {
            self.rnr_deadline = None;
            self.rearm(now);
        }
        if self.retrans_deadline.is_some_and(|d| now >= d) {
            self.retrans_deadline = None;
            if self.comp_psn.before(self.max_sent_psn) {
                self.counters.local_ack_timeout_err += 1;
                self.start_retry(now, true);
            }
        }
    }
}
