//! What the verbs do to a QP's slot: create it, modify it, post to it, and ring the
//! doorbell. `qp.rs` checks the caller's arguments and calls these with the device locked;
//! the slot's fields (the ACK-ride bookkeeping, the state the application saw) stay the
//! engine's.

use std::sync::atomic::Ordering;

use srdma_proto::{AttrMask, DeviceLimits, QpAttr, QpState, RecvWr, SendWr};

use super::{QpSlot, Shared, State, deliver_completions};
use crate::cq::Cq;
use crate::error::{Error, Result};
use crate::sys;

impl QpSlot {
    /// The slot of a new QP, with the CQs its completions go to and its SRQ (by id).
    pub(crate) fn new(qp: srdma_proto::Qp, send_cq: Cq, recv_cq: Cq, srq: Option<u32>) -> QpSlot {
        QpSlot {
            path: crate::Path::None,
            state_seen: qp.state(),
            qp,
            send_cq,
            recv_cq,
            srq,
            ride: super::timing::AckRide::new(),
            posted_recv: false,
            ece: None,
            timer_at: u64::MAX,
            touched: false,
            shm_blocked: false,
            posts_held: false,
            sharing: None,
            flight: 0,
            waits: false,
        }
    }
}

impl Shared {
    /// Sends every packet QP `qpn` has ready, from the caller's thread (the "doorbell"), and
    /// wakes the progress thread if the QP now has a timer earlier than the one it sleeps on.
    pub(crate) fn doorbell(&self, st: &mut State, qpn: u32) {
        self.flush(st, qpn);
        if let Some(t) = st.slot(qpn).and_then(|s| s.qp.poll_timeout()) {
            if (t.as_nanos() as u64) < self.sleep_until.load(Ordering::Acquire) {
                sys::signal(&self.wake);
            }
        }
    }

    /// Sends what a receive held back for QP `qpn`'s application (see `State::deferred`),
    /// if anything.
    pub(crate) fn flush_if_deferred(&self, st: &mut State, qpn: u32) {
        if st.undefer(qpn) {
            self.flush(st, qpn);
        }
    }

    /// Before QP `qpn` goes (destroyed, or its process exits): what a receive held back
    /// leaves, then the QP's last ACK once more in a datagram of its own, not coalesced with
    /// the first into one GSO message (see `srdma_proto::Qp::ack_once_more`: a peer whose
    /// last message's ACK was lost would retry into a QP that is gone).
    pub(crate) fn last_words(&self, st: &mut State, qpn: u32) {
        self.flush_if_deferred(st, qpn);
        self.send_queued(st);
        if st.slot_mut(qpn).is_some_and(|s| s.qp.ack_once_more()) {
            self.flush(st, qpn);
        }
    }

    /// `ibv_modify_qp` of QP `qpn`, checked against the IBTA table by the transport.
    pub(crate) fn modify_qp(
        &self,
        st: &mut State,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
        limits: &DeviceLimits,
    ) -> Result<()> {
        // ACKs and responses held back for the application's next post or poll leave
        // first: moving to ERR (a disconnect) must not swallow the ACK of what was received.
        self.flush_if_deferred(st, qpn);
        let slot = st.slot_mut(qpn).ok_or_else(|| no_qp(qpn))?;
        slot.qp.modify(attr, mask, limits)?;
        // The application's own move to ERR is no fatal event; an SRQ's QP still reports
        // its last WQE.
        if slot.qp.state() == QpState::Err && slot.state_seen != QpState::Err && slot.srq.is_some()
        {
            slot.send_cq
                .raise(crate::AsyncEvent::QpLastWqeReached { qpn: slot.qp.qpn() });
        }
        slot.state_seen = slot.qp.state();
        // Reset forgets the QP's work, and with it its completions not yet polled (flushes of
        // the error state it leaves, typically): as libmlx5 cleans its CQs on RESET, so a QP
        // brought back to RTS does not hand the application stale completions.
        if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
            let qpn = slot.qp.qpn();
            slot.send_cq.forget_qp(qpn);
            slot.recv_cq.forget_qp(qpn);
        }
        // Entering ERR flushes and SQD->RTS resumes work posted while draining: send what
        // the QP has and deliver its completions.
        self.doorbell(st, qpn);
        Ok(())
    }

    /// `ibv_post_send` of `wrs` to QP `qpn`, then the doorbell (`ring`), or not yet
    /// (`Ring::Deferred`, see `Qp::post_send_deferred`). Stops at the first WR that is
    /// refused (an `Err` from the caller's checks, or the transport's): the ones before it
    /// are posted, as with `ibv_post_send`'s `bad_wr`.
    pub(crate) fn post_send(
        &self,
        st: &mut State,
        qpn: u32,
        wrs: impl IntoIterator<Item = Result<SendWr>>,
        ring: Ring,
    ) -> Result<()> {
        let mut res = Ok(());
        {
            let slot = st.slot_mut(qpn).ok_or_else(|| no_qp(qpn))?;
            // The clock only where something needs it (most posts: nothing).
            if slot.ride.awaits_send() {
                slot.ride.send_posted(self.now().as_nanos() as u64);
            }
            slot.note_post();
            for wr in wrs {
                let posted = wr.and_then(|wr| {
                    let signaled = wr.flags.contains(srdma_proto::SendFlags::SIGNALED);
                    slot.qp.post_send(wr).map_err(Error::from)?;
                    slot.ride
                        .set_last_signaled(signaled || slot.qp.signals_all());
                    Ok(())
                });
                if let Err(e) = posted {
                    res = Err(e);
                    break;
                }
            }
        }
        // A post may bring answers soon (at once from a QP of this device): the next poll
        // looks at the socket (see `timing::RX_REST`).
        st.expect_answers();
        if let Some(now) = self.defers(st, qpn, ring) {
            self.hold_posts(st, qpn, now);
            return res;
        }
        // What a receive held back leaves now, behind the request (see `poll_transmit`):
        // one more time the application answered what it received with a send.
        if st.undefer(qpn) {
            if let Some(slot) = st.slot_mut(qpn) {
                slot.ride.answered();
            }
        }
        self.doorbell(st, qpn);
        res
    }

    /// Whether a post to QP `qpn` at `now` leaves its packets for the application's next
    /// poll: asked to (`ring`), while the application polls (one that has not polled for the
    /// grace period may not poll again soon), and where a doorbell costs a system call — not
    /// through the shared-memory rings, where a post is a copy into memory (redis on one
    /// host gained nothing there). Returns the time it asked at (the clock is read only
    /// where the answer may be yes), or `None`.
    fn defers(&self, st: &State, qpn: u32, ring: Ring) -> Option<u64> {
        if ring != Ring::Deferred
            || st
                .slot(qpn)
                .is_none_or(|s| s.path == crate::Path::SharedMemory)
        {
            return None;
        }
        let now = self.now().as_nanos() as u64;
        (self.app_active_until.load(Ordering::Relaxed) > now).then_some(now)
    }

    /// Puts QP `qpn`, whose sends were just posted without the doorbell, on
    /// `State::deferred`: they leave with the application's next poll (with what the other
    /// QPs there hold: one `sendmmsg`, one GSO message per run of equal datagrams to a peer),
    /// its next post to the QP with the doorbell, or — should it do neither — from the
    /// progress thread once the polling grace is over.
    fn hold_posts(&self, st: &mut State, qpn: u32, now: u64) {
        let held = st.is_deferred(qpn);
        let Some(slot) = st.slot_mut(qpn) else {
            return;
        };
        if held {
            // What a receive held back waits for this send: the application answered.
            if !slot.posts_held {
                slot.ride.answered();
            }
        } else {
            slot.ride.held(now);
        }
        slot.posts_held = true;
        if !held {
            st.deferred.push(qpn);
        }
        // The progress thread stands aside while the application polls (nothing to wake);
        // asleep past the hold's window, it would not send the posts in time.
        if super::timing::ride_wakes(now, self.sleep_until.load(Ordering::Acquire)) {
            sys::signal(&self.wake);
        }
    }

    /// `ibv_post_recv` of `wr` to QP `qpn` (`ring`: see `Qp::post_recv_deferred`).
    pub(crate) fn post_recv(&self, st: &mut State, qpn: u32, wr: RecvWr, ring: Ring) -> Result<()> {
        // An ACK held back for the application's next post leaves now, unless this QP's
        // application is known to post a send right after (see `timing::AckRide::rides`):
        // one that replenishes its receives and then does something else may not post or
        // poll again for a long time (perftest -R posts a receive, then makes its next
        // connection, while the peer waits for the ACK of its SEND before listening). Or
        // unless the application asked it to wait for its next poll, and polls.
        let waits = self.defers(st, qpn, ring).is_some();
        let rides = waits || st.slot(qpn).is_some_and(|s| s.ride.rides());
        if !rides && st.is_deferred(qpn) {
            self.flush_if_deferred(st, qpn);
            let now = self.now().as_nanos() as u64;
            if let Some(s) = st.slot_mut(qpn) {
                s.ride.flushed(now);
            }
        }
        let s = st.slot_mut(qpn).ok_or_else(|| no_qp(qpn))?;
        s.qp.post_recv(wr)?;
        s.posted_recv = true;
        deliver_completions(s);
        Ok(())
    }
}

/// Whether a post rings the doorbell (see `Shared::post_send`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ring {
    /// The packets go out now, from the caller's thread.
    Now,
    /// They wait for the application's next poll while it polls (`Qp::post_send_deferred`).
    Deferred,
}

/// A QP number with no slot: only a destroyed QP's (a live `Qp` handle keeps its slot).
fn no_qp(qpn: u32) -> Error {
    Error::InvalidArgument(format!("QP {qpn:#x} does not exist"))
}
