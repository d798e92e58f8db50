//! Progress: the progress thread, and the device driven from the application's threads
//! (polls, waits on a completion channel), with what receives held back for them.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::timing::{
    BUDGET_LOOK, Hold, Turns, app_grace_until, drives_now, ride_wakes, watch_grace,
};
use super::{Shared, State};
use crate::sys;

/// Receive batches handled before timers and the stop flag are looked at again: a flood of
/// datagrams must not starve retransmissions or block the device's drop.
const RX_BUDGET: usize = 8;

impl Shared {
    /// Called from an application's CQ poll, or its read of registered memory (an application
    /// that spins on its memory for a peer's WRITE polls as one that spins on its CQ): drives
    /// the device from the caller's thread if no one else is (the progress thread keeps out
    /// while polls keep coming). `polling`: the caller keeps polling (the thread stands aside
    /// for a grace period, and while traffic is sparse a look takes one datagram: the peer's
    /// WRITE comes alone from an application that does not wait for its sends' completions,
    /// see `QpSlot::ack_tail`; loopback UDP, 8 B `srdma perf write-lat`: 5.8 → 4.7 µs with
    /// memory reads looking so, veth 6.5 → 5.3).
    pub(crate) fn drive_from_app(&self, polling: bool) {
        let hold = if polling { Hold::Poll } else { Hold::Nothing };
        if self.fatal.load(Ordering::Acquire) {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let until = app_grace_until(now);
        if polling && self.app_active_until.load(Ordering::Relaxed) < until {
            self.app_active_until.store(until, Ordering::Relaxed);
        }
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        if polling {
            self.flush_deferred_polled(&mut st, now);
        } else {
            self.flush_deferred(&mut st);
        }
        // A last look before sleeping (`!polling`: the CQ is armed) holds nothing back:
        // no post or poll would follow to send it, and it always looks.
        let rings_in = st.shm.as_ref().is_some_and(|s| s.has_ins());
        let udp = st.timing.rest.poll_looks(now, polling, rings_in);
        self.receive(
            &mut st,
            RX_BUDGET,
            hold,
            udp,
            Some(Duration::from_nanos(now)),
        );
        if now >= st.timers.next() {
            self.run_timers(&mut st);
        }
        let mut pending = None;
        if st.timing.stats.due(now) {
            pending = publish_stats(&mut st);
        }
        let held = !st.deferred.is_empty();
        drop(st);
        // Held-back ACKs leave with the application's next post or poll; should it make
        // neither, the progress thread sends them once the polling grace is over, or when
        // their window ends. If that thread sleeps in `poll` (not standing aside) past the
        // window, nothing would wake it before the peer's retransmission timer fires: wake
        // it (and only then: a wake-up on every poll that holds an ACK takes a core from a
        // spinning application on a small machine).
        if held && ride_wakes(now, self.sleep_until.load(Ordering::Acquire)) {
            sys::signal(&self.wake);
        }
        self.run_hooks();
        if let Some(p) = pending {
            p.commit_later();
        }
    }

    /// An application's poll found all it asked for, without driving the device: it drives
    /// the device once its last drive is [`FULL_POLL_DRIVE`] old, which keeps the progress
    /// thread standing aside while the polls go on (and what the device has to do waits
    /// that long at most).
    pub(crate) fn app_polls(&self) {
        let now = self.now().as_nanos() as u64;
        if drives_now(now, self.app_active_until.load(Ordering::Relaxed)) {
            self.drive_from_app(true);
        }
    }

    /// The application stops polling (it armed a CQ to sleep on its channel): the progress
    /// thread takes over at once, unless the application waits in `get_event` (now, or
    /// within the grace period: it is coming back to it), watching the socket itself.
    pub(crate) fn app_sleeps(&self) {
        let now = self.now().as_nanos() as u64;
        if self.app_active_until.swap(0, Ordering::Relaxed) > now && !self.app_watches(now) {
            sys::signal(&self.wake);
        }
    }

    /// True while an application thread waits in [`Shared::wait_with_socket`] or woke from
    /// it less than `timing::APP_GRACE` ago.
    fn app_watches(&self, now: u64) -> bool {
        let woke = self.wait_woke_at.load(Ordering::SeqCst);
        self.app_waiters.load(Ordering::SeqCst) > 0 || watch_grace(woke, now).is_some()
    }

    /// Sleeps until `fd` (a completion channel's) or the device's socket (or a multicast
    /// group's) is readable or `timeout` passes; a readable socket is received from on this
    /// thread, which delivers the completions (and channel events) they bring. Returns which
    /// of the two were readable (neither: timeout, or a signal).
    ///
    /// This is what takes the progress thread out of an event-driven application's round
    /// trip: the datagram wakes the application's thread directly, as a blocking `recv`
    /// would, instead of waking the progress thread, which then wakes the application.
    pub(crate) fn wait_with_socket(
        &self,
        fd: std::os::fd::RawFd,
        timeout: Option<Duration>,
    ) -> std::io::Result<[bool; 2]> {
        if self.fatal.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire) {
            return sys::poll_readable([fd], timeout).map(|r| [r[0], false]);
        }
        // Nothing this thread held back waits through its sleep (deferred posts, ACKs).
        {
            let mut st = self.lock();
            if !st.deferred.is_empty() {
                self.flush_deferred(&mut st);
            }
        }
        self.app_waiters.fetch_add(1, Ordering::SeqCst);
        let groups = self.groups_fd.load(Ordering::SeqCst);
        // Peers of this host ring a doorbell for what they put in the rings from now on;
        // what is there already is received at once.
        let [port, ep] = self.shm_fds;
        let shm_waiting = port >= 0 && !self.lock().shm.as_mut().is_none_or(|s| s.arm());
        let timeout = if shm_waiting {
            Some(Duration::ZERO)
        } else {
            timeout
        };
        let r = sys::poll_readable([fd, self.socket.as_raw_fd(), groups, port, ep], timeout);
        let shm_news = r.as_ref().is_ok_and(|r| r[3] || r[4]);
        // Only what polled readable is read: a doorbell costs no look at the UDP socket.
        let udp = r.as_ref().is_ok_and(|r| r[1] || r[2]);
        if port >= 0 {
            let mut st = self.lock();
            if let Some(shm) = st.shm.as_mut() {
                shm.disarm();
                if shm_news {
                    let offer = r.as_ref().is_ok_and(|r| r[3]);
                    shm.service(self.now().as_nanos() as u64, offer);
                    self.shm_ins.store(shm.ins(), Ordering::Relaxed);
                }
            }
        }
        let r = r.map(|[c, s, g, _, _]| [c, s || g || shm_news || shm_waiting]);
        self.app_waiters.fetch_sub(1, Ordering::SeqCst);
        let now = self.now().as_nanos() as u64;
        self.wait_woke_at.store(now.max(1), Ordering::SeqCst);
        // The progress thread went to sleep trusting us with the socket (see `progress`):
        // from now on it must watch it again unless we come back within the grace period.
        if self.sleeps_deep.load(Ordering::SeqCst) {
            sys::signal(&self.wake);
        }
        let ready = r?;
        if ready[1] {
            let mut st = self.lock();
            self.flush_deferred(&mut st);
            self.receive(&mut st, RX_BUDGET, Hold::Nothing, udp, None);
            if now >= st.timers.next() {
                self.run_timers(&mut st);
            }
            drop(st);
            self.run_hooks();
        }
        Ok(ready)
    }

    /// What an application's poll sends of what earlier application-driven receives and
    /// deferred posts held back: everything, except the ACKs of a QP whose application posts
    /// a send right after replenishing its receives (`AckRide::rides`), for
    /// `timing::ACK_RIDE_WINDOW`: they leave with that send (a SEND ping-pong that polls its
    /// send queue in between).
    fn flush_deferred_polled(&self, st: &mut State, now: u64) {
        if st.deferred.is_empty() {
            return;
        }
        let mut deferred = std::mem::take(&mut st.deferred);
        // Many QPs' answers and ACKs meet here: the ACKs go behind (see `udp::Late`).
        if let Some(udp) = st.udp.as_deref_mut() {
            udp.acks_behind(true);
        }
        deferred.retain(|&qpn| {
            let Some(slot) = st.qps.get_mut(&qpn) else {
                return false;
            };
            if slot.posts_held {
                self.queue_out(st, qpn);
                return false;
            }
            if slot.ride.keeps_holding(now) {
                return true;
            }
            slot.ride.flushed(now);
            self.queue_out(st, qpn);
            false
        });
        st.deferred = deferred;
        self.send_queued(st);
        if let Some(udp) = st.udp.as_deref_mut() {
            udp.acks_behind(false);
        }
    }

    /// The progress thread's part of what receives held back: packets wait for their
    /// application's next post or poll until `timing::ACK_RIDE_WINDOW` after they were held
    /// (sent earlier, an ACK would reach the peer alone: see [`Hold::Riding`]); those that
    /// waited that long leave now, and their QP's application, which neither posted nor
    /// polled in time, is no longer waited for (`AckRide::hold_expired`). Deferred posts
    /// (with what their QP holds) wait while the application polls, and leave once it
    /// stopped.
    fn flush_deferred_expired(&self, st: &mut State) {
        if st.deferred.is_empty() {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let polling = self.app_active_until.load(Ordering::Relaxed) > now;
        let mut deferred = std::mem::take(&mut st.deferred);
        deferred.retain(|&qpn| {
            let Some(slot) = st.qps.get_mut(&qpn) else {
                return false;
            };
            let waits = if slot.posts_held {
                polling
            } else {
                !slot.ride.hold_expired(now, slot.qp.wants_transmit())
            };
            if waits {
                return true;
            }
            self.queue_out(st, qpn);
            false
        });
        st.deferred = deferred;
        self.send_queued(st);
    }

    /// When the first window of the held-back ACKs ends (ns since the epoch).
    fn ride_ends(&self, st: &State) -> Option<u64> {
        st.deferred
            .iter()
            .filter_map(|q| st.qps.get(q))
            .map(|s| s.ride.hold_ends())
            .min()
    }

    /// Sends what earlier application-driven receives held back.
    pub(crate) fn flush_deferred(&self, st: &mut State) {
        let deferred = std::mem::take(&mut st.deferred);
        self.flush_each(st, &deferred);
        st.deferred = deferred;
        st.deferred.clear();
    }

    /// [`Shared::last_words`] of every QP, as the process exits with them alive.
    pub(crate) fn last_words_all(&self, st: &mut State) {
        self.flush_deferred(st);
        self.send_queued(st);
        let again: Vec<u32> = st
            .qps
            .iter_mut()
            .filter_map(|(&qpn, s)| s.qp.ack_once_more().then_some(qpn))
            .collect();
        self.flush_each(st, &again);
    }
}

/// The device's published statistics to refresh (at most once a second): the caller writes
/// them once it released the device's lock.
fn publish_stats(st: &mut State) -> Option<crate::stats::Pending> {
    let now = Instant::now();
    if st.stats.as_mut()?.throttled(&st.counters, now) {
        return None;
    }
    let mut qp = srdma_proto::Counters::default();
    let mut lines = Vec::new();
    for (&qpn, s) in &st.qps {
        qp += *s.qp.counters();
        // Connected QPs with sends outstanding: where their congestion control stands.
        if s.qp.qp_type() != srdma_proto::QpType::Ud && s.qp.send_queue_len() > 0 {
            let c = s.qp.congestion();
            lines.push(crate::stats::QpLine {
                qpn,
                window_psns: c.window_psns,
                rate: c.rate,
                srtt_us: c.srtt.map(|d| d.as_micros() as u64),
                timeouts: c.timeouts,
                cnps: c.cnps,
                selective_repeat: s.qp.reliability()
                    == srdma_proto::transport::Reliability::SelectiveRepeat,
            });
        }
    }
    let dev = st.counters;
    st.stats.as_mut()?.maybe_write(&dev, &qp, &lines, now)
}

/// Takes in what the shared-memory driver's descriptors say (new links, ended ones).
fn service_shm(shared: &Shared) {
    let now = shared.now().as_nanos() as u64;
    let mut st = shared.lock();
    if let Some(shm) = st.shm.as_mut() {
        shm.service(now, true);
        shared.shm_ins.store(shm.ins(), Ordering::Relaxed);
    }
    // A link taken in here may hold packets already, and a thread asleep on the rings (armed
    // before the link existed) hears nothing of them: their producer rang no doorbell, as
    // nobody slept on that ring yet. Take them now.
    shared.receive(&mut st, RX_BUDGET, Hold::Nothing, false, None);
    drop(st);
    shared.run_hooks();
}

/// The progress thread: receive, dispatch, acknowledge, retransmit, complete — so one-sided
/// operations finish without the target application's help. Sleeps in `poll` when idle, and
/// keeps out of the way while an application's CQ polls drive the device.
pub(super) fn progress(shared: &Shared) {
    let mut timeout = None;
    // How often it looks while standing aside, when it may take the rings alone.
    let mut turns = Turns::default();
    // The next sleep ends at a pacing deadline (see `timing::Pace`).
    let mut precise = false;
    while !shared.stop.load(Ordering::Acquire) {
        if shared.inject_failure.load(Ordering::Relaxed) {
            panic!("srdma: injected failure of the progress thread (Device::inject_failure)");
        }
        let now = shared.now().as_nanos() as u64;
        let active = shared.app_active_until.load(Ordering::Relaxed);
        let silent_until = shared.silent_writes_until.load(Ordering::Relaxed);
        if let Some(sleep) = turns.stand_aside(now, active, silent_until) {
            // Posts need not wake us meanwhile (0: "asleep until the past", so no timer is
            // earlier): the application's polls run the timers, and we run them on return.
            // Nothing tells us when the application stops polling: while it may wait on its
            // memory instead, look again soon (it may be polling only for a WRITE's
            // completion), then less and less often.
            shared.sleep_until.store(0, Ordering::Release);
            // The application's polls read the rings; a new link is for this thread to
            // take in. (Doorbells, and links that ended, wait for a thread that sleeps on
            // the rings: see `Shm::service`.)
            let [port, _] = shared.shm_fds;
            let r = sys::poll_readable_precise([shared.wake.as_raw_fd(), port], Some(sleep));
            if r.is_ok_and(|[_, p]| p) {
                service_shm(shared);
            }
            sys::drain(&shared.wake);
            timeout = Some(Duration::ZERO);
            continue;
        }
        let keeper = match (&shared._keeper, shared.cm_forwarded.load(Ordering::Relaxed)) {
            (Some(k), true) => k.as_raw_fd(),
            _ => -1,
        };
        // An application thread waiting on its completion channel watches the socket (see
        // `Shared::wait_with_socket`): while one does, or woke less than the grace period
        // ago, leave the socket to it, looking again when the grace period ends; once it
        // has waited that long, sleep on timers alone and let it wake us when it wakes.
        let mut sock = shared.socket.as_raw_fd();
        let mut wait = timeout;
        let woke = shared.wait_woke_at.load(Ordering::SeqCst);
        if let Some(rest) = watch_grace(woke, now) {
            sock = -1;
            wait = Some(wait.map_or(rest, |t| t.min(rest)));
        } else if shared.app_waiters.load(Ordering::SeqCst) > 0 {
            shared.sleeps_deep.store(true, Ordering::SeqCst);
            // Checked again after saying so: a waiter that woke in between either is seen
            // here or sees `sleeps_deep` and wakes us.
            if shared.app_waiters.load(Ordering::SeqCst) > 0
                && shared.wait_woke_at.load(Ordering::SeqCst) == woke
            {
                sock = -1;
            } else {
                shared.sleeps_deep.store(false, Ordering::SeqCst);
            }
        }
        // The multicast groups' sockets are always watched here: an application thread
        // that went to sleep on its channel before an attach does not watch them.
        let groups = shared.groups_fd.load(Ordering::SeqCst);
        // The shared-memory driver's rings go with the socket: watched (doorbells asked
        // for) where the socket is.
        let [port, ep] = if sock >= 0 { shared.shm_fds } else { [-1, -1] };
        // Doorbells only for a thread that may sleep (not for a look without waiting), and
        // only where some peer produces into this device (no lock taken otherwise).
        let armed =
            port >= 0 && wait != Some(Duration::ZERO) && shared.shm_ins.load(Ordering::Relaxed) > 0;
        if armed && !shared.lock().shm.as_mut().is_none_or(|s| s.arm()) {
            wait = Some(Duration::ZERO);
        }
        let rings_only = turns.rings_only(now, wait);
        let ready = if rings_only {
            Ok([false; 6])
        } else {
            let fds = [sock, shared.wake.as_raw_fd(), keeper, groups, port, ep];
            // A paced QP's next packet is kept to the microsecond; every other sleep rounds
            // up to the millisecond (the IBTA timers then fire no earlier than a kernel
            // rxe's, which count jiffies).
            let ready = if precise {
                sys::poll_readable_precise(fds, wait)
            } else {
                sys::poll_readable(fds, wait)
            };
            if ready.is_err() {
                std::thread::sleep(Duration::from_millis(1));
            }
            sys::drain(&shared.wake);
            ready
        };
        shared.sleeps_deep.store(false, Ordering::SeqCst);
        let mut st = shared.lock();
        if port >= 0
            && let Some(shm) = st.shm.as_mut()
        {
            if armed {
                shm.disarm();
            }
            if let Ok([.., p, e]) = ready
                && (p || e)
            {
                shm.service(shared.now().as_nanos() as u64, p);
                shared.shm_ins.store(shm.ins(), Ordering::Relaxed);
            }
        }
        // Held-back packets the application left for this thread to send once their window
        // passed.
        shared.flush_deferred_expired(&mut st);
        let more = shared.receive(&mut st, RX_BUDGET, Hold::Riding, !rings_only, None);
        timeout = shared.run_timers(&mut st);
        // Come back for the held-back ACKs whose window ends first.
        if let Some(end) = shared.ride_ends(&st) {
            let rest = Duration::from_nanos(end.saturating_sub(shared.now().as_nanos() as u64));
            timeout = Some(timeout.map_or(rest, |t| t.min(rest)));
        }
        // More waiting, a peer doing one-sided operations or streaming through the rings,
        // QPs a full ring holds back: look again without sleeping, or soon.
        let now = shared.now().as_nanos() as u64;
        let blocked = st.tx.blocked();
        timeout = turns.after_pass(now, timeout, more, sock >= 0, blocked, &st.timing);
        // QPs waiting for their peer's budget get it back from ACKs (a receive gives them
        // their turn); should their peer's flight leave otherwise (QPs destroyed), a look
        // now and then.
        if st.tx.waiting() {
            timeout = Some(timeout.map_or(BUDGET_LOOK, |t| t.min(BUDGET_LOOK)));
        }
        // Published under the lock: a post that arms an earlier timer after this sees the
        // value and wakes the thread.
        let until = timeout.map_or(u64::MAX, |t| (shared.now() + t).as_nanos() as u64);
        shared.sleep_until.store(until, Ordering::Release);
        precise = st.timing.pace.precise(until);
        if let Some(w) = st.capture.as_mut() {
            let _ = w.flush();
        }
        let pending = publish_stats(&mut st);
        // A rate-limited refresh is pending: come back for it even if nothing else happens.
        if let Some(d) = st.stats.as_ref().and_then(|p| p.due_in(Instant::now())) {
            timeout = Some(timeout.map_or(d, |t| t.min(d)));
        }
        drop(st);
        shared.run_hooks();
        if let Some(p) = pending {
            p.commit_later();
        }
    }
}
