//! Completion delivery: a QP's completions to its CQs, the CQs' hooks, async events, and
//! the device's failure.

use std::sync::atomic::Ordering;

use srdma_proto::CqSide;

use super::{QpSlot, Shared};

impl Shared {
    /// Registers a CQ whose hook [`Shared::run_hooks`] runs.
    pub(crate) fn add_hooked(&self, cq: std::sync::Weak<crate::cq::CqInner>) {
        self.hooked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(cq);
    }

    /// Runs the hooks of the CQs that got completions, outside the device lock (the hooks
    /// take it): called by whoever received, right after releasing the lock.
    pub(crate) fn run_hooks(&self) {
        thread_local! {
            /// This thread runs a hook: a hook that drives the device (reading an MR does)
            /// must not run hooks again; they run when it returns or on the next pass.
            static IN_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        if !self.hooks_due.load(Ordering::Acquire) || IN_HOOK.with(std::cell::Cell::get) {
            return;
        }
        struct Running;
        impl Drop for Running {
            fn drop(&mut self) {
                IN_HOOK.with(|f| f.set(false));
            }
        }
        IN_HOOK.with(|f| f.set(true));
        let _running = Running;
        // Again while completions came in meanwhile (another thread's receive pass may have
        // found the hooks running here and left them to us).
        while self.hooks_due.swap(false, Ordering::AcqRel) {
            self.run_due_hooks();
        }
    }

    fn run_due_hooks(&self) {
        let cqs = self
            .hooked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut gone = false;
        for cq in &cqs {
            gone |= !crate::cq::Cq::run_hook(cq);
        }
        if gone {
            self.hooked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|w| w.strong_count() > 0);
        }
    }

    /// Sends `ev` to the device's event handler, if it has one.
    pub(crate) fn raise(&self, ev: crate::AsyncEvent) {
        let h = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(h) = h {
            h(ev);
        }
    }

    /// The progress thread died: the device is dead. Every QP goes to ERR with its work
    /// flushed (error completions, so no waiter hangs), then `DeviceFatal`; later calls fail.
    pub(super) fn fail(&self) {
        self.fatal.store(true, Ordering::Release);
        let mut st = self.lock();
        for slot in st.qps.values_mut() {
            slot.qp.set_error();
            deliver_completions(slot);
        }
        drop(st);
        self.run_hooks();
        self.raise(crate::AsyncEvent::DeviceFatal);
    }
}

/// Moves QP `slot`'s completions to its CQs (a full CQ puts the QP in ERR, as rxe does);
/// returns how many it moved.
pub(crate) fn deliver_completions(slot: &mut QpSlot) -> usize {
    super::xrc::drop_orphans(&mut slot.qp);
    let mut overrun = false;
    let mut delivered = 0;
    while let Some((side, wc)) = slot.qp.poll_completion() {
        delivered += 1;
        let solicited = wc.solicited;
        overrun |= !match side {
            CqSide::Send => slot.send_cq.push(wc, false),
            CqSide::Recv => slot.recv_cq.push(wc, solicited),
        };
    }
    if overrun {
        // As rxe: a QP whose completion found its CQ full goes to ERR; its flushed work
        // requests go where they can (an overrun CQ takes no more).
        slot.qp.set_error();
        while let Some((side, wc)) = slot.qp.poll_completion() {
            let _ = match side {
                CqSide::Send => slot.send_cq.push(wc, false),
                CqSide::Recv => slot.recv_cq.push(wc, false),
            };
        }
    }
    if slot.qp.take_sq_drained() {
        slot.send_cq
            .raise(crate::AsyncEvent::SqDrained { qpn: slot.qp.qpn() });
    }
    let state = slot.qp.state();
    if state == srdma_proto::QpState::Err && slot.state_seen != state {
        let qpn = slot.qp.qpn();
        slot.send_cq.raise(crate::AsyncEvent::QpFatal { qpn });
        if slot.srq.is_some() {
            slot.send_cq
                .raise(crate::AsyncEvent::QpLastWqeReached { qpn });
        }
    }
    slot.state_seen = state;
    delivered
}

/// What the CQs ask of their device (the trait is theirs, so `cq` imports nothing of the
/// engine's).
impl crate::cq::Progress for Shared {
    fn max_cqe(&self) -> u32 {
        self.cfg.limits.max_cqe
    }

    fn drive_from_app(&self, polling: bool) {
        Shared::drive_from_app(self, polling);
    }

    fn app_polls(&self) {
        Shared::app_polls(self);
    }

    fn app_sleeps(&self) {
        Shared::app_sleeps(self);
    }

    fn wait_with_socket(
        &self,
        fd: std::os::fd::RawFd,
        timeout: Option<std::time::Duration>,
    ) -> std::io::Result<[bool; 2]> {
        Shared::wait_with_socket(self, fd, timeout)
    }

    fn add_hooked(&self, cq: std::sync::Weak<crate::cq::CqInner>) {
        Shared::add_hooked(self, cq);
    }

    fn hooks_due(&self) {
        self.hooks_due.store(true, Ordering::Release);
    }

    fn raise(&self, ev: crate::AsyncEvent) {
        Shared::raise(self, ev);
    }
}
