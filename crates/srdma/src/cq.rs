//! Completion queues and completion channels.

use std::cell::Cell;
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use srdma_proto::Wc;

use crate::error::{Result, io_err};
use crate::sys;

/// How long a thread's polls find every CQ empty before each further empty poll yields its
/// core (see `Cq::polled`).
const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(50);

thread_local! {
    /// When this thread's polls started finding nothing, on whatever CQ: None after a poll
    /// that found a completion.
    static EMPTY_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// What a CQ and its channel ask of the device whose QPs complete into them: the engine
/// implements it (`engine::Shared`), so that this module needs nothing of the engine's.
pub(crate) trait Progress: Send + Sync {
    /// The most completions a CQ of the device may hold (`DeviceLimits::max_cqe`).
    fn max_cqe(&self) -> u32;
    /// Drives the device from an application's poll that found too little; `polling`: the
    /// caller keeps polling (the progress thread stands aside meanwhile).
    fn drive_from_app(&self, polling: bool);
    /// An application's poll found all it asked for without driving the device: it drives
    /// it all the same when its last drive was a while ago, so that the progress thread
    /// keeps standing aside for a polling application.
    fn app_polls(&self);
    /// The application armed a CQ to sleep on its channel: the progress thread takes over.
    fn app_sleeps(&self);
    /// Waits up to `timeout` for channel descriptor `fd` while watching the device's socket
    /// (receiving what arrives); says which of the two polled readable.
    fn wait_with_socket(&self, fd: RawFd, timeout: Option<Duration>) -> std::io::Result<[bool; 2]>;
    /// Registers a CQ with a completion hook, for the device to run.
    fn add_hooked(&self, cq: Weak<CqInner>);
    /// Some hooked CQ got completions: the device runs the hooks once it releases its lock.
    fn hooks_due(&self);
    /// Sends an async event to the device's event handler.
    fn raise(&self, ev: crate::AsyncEvent);
}

/// The device a CQ belongs to, held weakly (the device holds its CQs).
pub(crate) type Dev = Weak<dyn Progress>;

/// No device (a channel no CQ was made with yet).
fn no_dev() -> Dev {
    Weak::<NoDev>::new()
}

/// The type behind [`no_dev`]: never instantiated.
enum NoDev {}

impl Progress for NoDev {
    fn max_cqe(&self) -> u32 {
        match *self {}
    }
    fn drive_from_app(&self, _: bool) {
        match *self {}
    }
    fn app_polls(&self) {
        match *self {}
    }
    fn app_sleeps(&self) {
        match *self {}
    }
    fn wait_with_socket(&self, _: RawFd, _: Option<Duration>) -> std::io::Result<[bool; 2]> {
        match *self {}
    }
    fn add_hooked(&self, _: Weak<CqInner>) {
        match *self {}
    }
    fn hooks_due(&self) {
        match *self {}
    }
    fn raise(&self, _: crate::AsyncEvent) {
        match *self {}
    }
}

/// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
/// armed CQ gets a completion, so an application can sleep in `poll`/`epoll` (or tokio/mio,
/// through [`AsFd`]) instead of spinning.
///
/// As the kernel's channel, the descriptor is readable exactly while events wait to be taken
/// by [`CompChannel::get_event`]: an application that waits in level-triggered `epoll` and
/// takes one event per wake (tgtd) is not woken again for an event already taken, and then
/// blocked in a `get_event` that has nothing to return; one that polls with a timeout and
/// treats an expiry as an error (libiscsi) is woken for every event.
#[derive(Debug, Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

#[derive(Debug)]
struct ChannelInner {
    /// Readable while `events` holds any: signalled by the push that makes the queue
    /// non-empty, cleared by the pop that empties it, both under the queue's lock.
    fd: OwnedFd,
    events: Mutex<VecDeque<u32>>,
    /// The device of the channel's first CQ: [`CompChannel::get_event`] watches its socket.
    dev: Mutex<Dev>,
}

impl CompChannel {
    /// A new channel.
    pub fn new() -> Result<CompChannel> {
        let fd = sys::eventfd_blocking().map_err(io_err("eventfd for a completion channel"))?;
        Ok(CompChannel {
            inner: Arc::new(ChannelInner {
                fd,
                events: Mutex::new(VecDeque::new()),
                dev: Mutex::new(no_dev()),
            }),
        })
    }

    fn notify(&self, cq: u32) {
        let mut q = lock(&self.inner.events);
        if q.is_empty() {
            sys::signal(&self.inner.fd);
        }
        q.push_back(cq);
    }

    /// The next event, if any; the descriptor stops being readable with the last.
    fn pop(&self) -> Option<u32> {
        let mut q = lock(&self.inner.events);
        let id = q.pop_front()?;
        if q.is_empty() {
            sys::drain_polled(&self.inner.fd);
        }
        Some(id)
    }

    /// `ibv_get_cq_event`: waits up to `timeout` (forever with `None`) for a CQ event and
    /// returns the id of the CQ that fired. Re-arm the CQ with [`Cq::req_notify`] before
    /// polling it empty, as with verbs.
    ///
    /// While it waits, the calling thread also watches the device's socket and receives
    /// what arrives itself (the device's progress thread leaves the socket to it, and for a
    /// millisecond after, expecting it back), so a message wakes the waiting application
    /// directly. A zero `timeout` only looks.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<u32>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(id) = self.pop() {
                return Ok(Some(id));
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let fd = self.inner.fd.as_raw_fd();
            // A look without waiting (an application that waits in epoll and calls this
            // when the fd is readable) leaves the socket to the progress thread.
            let dev = match left {
                Some(Duration::ZERO) => None,
                _ => lock(&self.inner.dev).upgrade(),
            };
            let ready = match dev {
                Some(dev) => dev.wait_with_socket(fd, left),
                None => sys::poll_readable([fd], left).map(|r| [r[0], false]),
            }
            .map_err(io_err("waiting on a completion channel"))?;
            // A readable descriptor means a queued event: the next turn takes it.
            if ready == [false; 2] || left == Some(Duration::ZERO) {
                return Ok(self.pop());
            }
        }
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a CQ lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A completion queue (`ibv_cq`). Cheap to clone: clones share the queue.
#[derive(Debug, Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) id: u32,
    /// Capacity in completions (changed by [`Cq::resize`]).
    cap: AtomicUsize,
    queue: Mutex<VecDeque<Wc>>,
    /// `Some(solicited_only)` while armed.
    armed: Mutex<Option<bool>>,
    overflowed: AtomicBool,
    channel: Option<CompChannel>,
    /// The device whose QPs complete here: a poll that finds too little drives it.
    dev: Dev,
    /// Called soon after completions arrived, by the thread that delivered them once it
    /// released the device lock (see `Shared::run_hooks`): the engine's own users (QP1's
    /// CM) take their completions without a thread of theirs in between.
    hook: std::sync::OnceLock<Hook>,
    /// Completions arrived since the hook last ran.
    hook_due: AtomicBool,
    /// Times the application came for completions and found none, or armed the CQ to sleep
    /// until one comes (see [`Cq::waits`]).
    waits: AtomicU32,
}

/// A completion hook: runs outside the device lock, on the engine's or a polling
/// application's thread, so it must be quick.
pub(crate) struct Hook(pub(crate) Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl Cq {
    /// Completions a new CQ has room for before its queue first grows.
    const PREALLOC: usize = 1024;

    pub(crate) fn new(id: u32, cap: usize, channel: Option<CompChannel>, dev: Dev) -> Cq {
        if let Some(ch) = &channel {
            let mut d = lock(&ch.inner.dev);
            if d.strong_count() == 0 {
                *d = dev.clone();
            }
        }
        Cq {
            inner: Arc::new(CqInner {
                id,
                cap: AtomicUsize::new(cap),
                // Grows with what it holds: a CQ may be millions of entries deep.
                queue: Mutex::new(VecDeque::with_capacity(cap.min(Self::PREALLOC))),
                armed: Mutex::new(None),
                overflowed: AtomicBool::new(false),
                channel,
                dev,
                hook: std::sync::OnceLock::new(),
                hook_due: AtomicBool::new(false),
                waits: AtomicU32::new(0),
            }),
        }
    }

    /// The CQ's id (what [`CompChannel::get_event`] returns).
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// How many handles share this CQ: this one, its other clones, and two per QP side that
    /// completes here (the QP's own and the engine's). More than one means it is in use.
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Capacity in completions.
    pub fn capacity(&self) -> usize {
        self.inner.cap.load(Ordering::Relaxed)
    }

    /// `ibv_resize_cq`: the CQ holds `cqe` completions from now on. As rxe: `cqe` must be
    /// within 1..=max_cqe and at least the number of completions waiting to be polled
    /// (InvalidArgument otherwise, the CQ unchanged).
    pub fn resize(&self, cqe: usize) -> Result<()> {
        let dev = self.inner.dev.upgrade().ok_or(crate::Error::DeviceFailed)?;
        let max = dev.max_cqe() as usize;
        let q = lock(&self.inner.queue);
        if cqe == 0 || cqe > max || cqe < q.len() {
            return Err(crate::Error::InvalidArgument(format!(
                "cqe {cqe} outside {}..={max} (completions waiting: {})",
                q.len().max(1),
                q.len()
            )));
        }
        // Under the queue's lock: `push` compares with the capacity under it too.
        self.inner.cap.store(cqe, Ordering::Relaxed);
        Ok(())
    }

    /// `ibv_poll_cq`: moves up to `max` completions into `out`, returns how many.
    ///
    /// A poll that finds fewer than `max` also drives the device from the calling thread
    /// (receives, acknowledges, retransmits): an application that polls gets its completions
    /// without waiting for the progress thread, which stays idle meanwhile.
    pub fn poll_into(&self, out: &mut Vec<Wc>, max: usize) -> usize {
        let mut n = self.take(out, max);
        if n < max {
            self.drive();
            n += self.take(out, max - n);
        } else if max > 0 {
            self.note_poll();
        }
        if max > 0 {
            self.polled(n > 0);
        }
        n
    }

    /// After a poll of the application: one that found nothing counts as a wait on this CQ,
    /// and once the calling thread's polls have found nothing on any CQ for
    /// [`SPIN_BEFORE_YIELD`], each further empty poll gives its core away (`sched_yield`).
    /// With more spinning threads than cores (MPI ranks beside their progress threads on two
    /// cores) the peer or the thread that will produce the completion then runs within
    /// microseconds, not at the end of the spinner's time slice; a lone spinner's yield
    /// returns at once. The clock is the thread's, not the CQ's: a program that polls an idle
    /// CQ beside a busy one (UCX polls its UD and RC CQs in one loop) is not waiting.
    fn polled(&self, found: bool) {
        if found {
            EMPTY_SINCE.set(None);
            return;
        }
        self.inner.waits.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        match EMPTY_SINCE.get() {
            None => EMPTY_SINCE.set(Some(now)),
            Some(since) if now.duration_since(since) >= SPIN_BEFORE_YIELD => {
                std::thread::yield_now();
            }
            Some(_) => {}
        }
    }

    /// A counter (it wraps) of the times the application waited on this CQ: polled it and
    /// found nothing, or armed it. The engine compares it between a QP's posts.
    pub(crate) fn waits(&self) -> u32 {
        self.inner.waits.load(Ordering::Relaxed)
    }

    /// Whether completions wait in the CQ, delivered and not polled yet.
    pub(crate) fn holds_any(&self) -> bool {
        !lock(&self.inner.queue).is_empty()
    }

    fn take(&self, out: &mut Vec<Wc>, max: usize) -> usize {
        let mut q = lock(&self.inner.queue);
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        n
    }

    fn drive(&self) {
        if let Some(dev) = self.inner.dev.upgrade() {
            // A poll of an armed CQ is the last look before sleeping on the channel: drive
            // the device, but do not ask the progress thread to stand aside.
            let sleeping = lock(&self.inner.armed).is_some();
            dev.drive_from_app(!sleeping);
        }
    }

    /// A poll that found all it asked for. It need not drive the device, but polls that
    /// never do would leave the device to the progress thread, which drives it only while
    /// no application polls: once completions are always waiting, that thread and the
    /// polling application would share the device's work, two threads where one does
    /// (`ib_write_bw -q 16 -s 65536` over a ring: the thread took a third of a core, half
    /// the throughput).
    fn note_poll(&self) {
        if lock(&self.inner.armed).is_none()
            && let Some(dev) = self.inner.dev.upgrade()
        {
            dev.app_polls();
        }
    }

    /// Up to `max` completions already delivered, for the engine's own users (QP1's CM, fed
    /// by the CQ's hook): the device is not driven.
    pub(crate) fn take_quietly(&self, max: usize) -> Vec<Wc> {
        let mut v = Vec::new();
        self.take(&mut v, max);
        v
    }

    /// Up to `max` completions.
    pub fn poll(&self, max: usize) -> Vec<Wc> {
        let mut v = Vec::new();
        self.poll_into(&mut v, max);
        v
    }

    /// The next completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        let first = lock(&self.inner.queue).pop_front();
        if first.is_some() {
            self.note_poll();
        }
        let wc = first.or_else(|| {
            self.drive();
            lock(&self.inner.queue).pop_front()
        });
        self.polled(wc.is_some());
        wc
    }

    /// `ibv_req_notify_cq`: the next completion (with `solicited_only`, the next receive
    /// completion of a message that carried the solicited-event bit, or any error completion)
    /// fires one event on the CQ's channel.
    pub fn req_notify(&self, solicited_only: bool) {
        *lock(&self.inner.armed) = Some(solicited_only);
        self.inner.waits.fetch_add(1, Ordering::Relaxed);
        // Arming means the application is about to sleep on the channel: hand the device
        // back to the progress thread now instead of after the poll grace period.
        if let Some(dev) = self.inner.dev.upgrade() {
            dev.app_sleeps();
        }
    }

    /// Drops the completions of QP `qpn` not yet polled (its move to RESET).
    pub(crate) fn forget_qp(&self, qpn: srdma_wire::Qpn) {
        lock(&self.inner.queue).retain(|wc| wc.qp_num != qpn);
    }

    /// Sets the CQ's completion hook (once): the device runs it after completions arrive.
    pub(crate) fn set_hook(&self, f: impl Fn() + Send + Sync + 'static) {
        if self.inner.hook.set(Hook(Box::new(f))).is_ok() {
            if let Some(dev) = self.inner.dev.upgrade() {
                dev.add_hooked(Arc::downgrade(&self.inner));
            }
        }
    }

    /// Runs the hook if completions arrived since it last ran; false once the CQ is gone.
    pub(crate) fn run_hook(cq: &Weak<CqInner>) -> bool {
        let Some(inner) = cq.upgrade() else {
            return false;
        };
        if inner.hook_due.swap(false, Ordering::AcqRel) {
            if let Some(h) = inner.hook.get() {
                (h.0)();
            }
        }
        true
    }

    /// True once more completions arrived than the CQ holds (`IBV_EVENT_CQ_ERR`, raised
    /// then): the CQ is in error, drops further completions, and the QPs that completed into
    /// it moved to ERR, as with rxe.
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed.load(Ordering::Relaxed)
    }

    /// Raises an async event on the device this CQ belongs to.
    pub(crate) fn raise(&self, ev: crate::AsyncEvent) {
        if let Some(dev) = self.inner.dev.upgrade() {
            dev.raise(ev);
        }
    }

    /// Called by the engine with the device lock held. False when the CQ is full (or was
    /// overrun before): the completion is dropped, the first time with `IBV_EVENT_CQ_ERR`,
    /// and the caller moves the QP to ERR, as rxe does.
    pub(crate) fn push(&self, wc: Wc, solicited: bool) -> bool {
        let mut q = lock(&self.inner.queue);
        if q.len() >= self.inner.cap.load(Ordering::Relaxed)
            || self.inner.overflowed.load(Ordering::Relaxed)
        {
            drop(q);
            if !self.inner.overflowed.swap(true, Ordering::Relaxed) {
                self.raise(crate::AsyncEvent::CqError { cq: self.inner.id });
                // A sleeper on the channel learns of it through the error completion it
                // will not get: wake it so it polls and sees the CQ in error.
                if let Some(ch) = &self.inner.channel {
                    if lock(&self.inner.armed).take().is_some() {
                        ch.notify(self.inner.id);
                    }
                }
            }
            return false;
        }
        q.push_back(wc);
        drop(q);
        if self.inner.hook.get().is_some() {
            self.inner.hook_due.store(true, Ordering::Release);
            if let Some(dev) = self.inner.dev.upgrade() {
                dev.hooks_due();
            }
        }
        let mut armed = lock(&self.inner.armed);
        let fire = match *armed {
            Some(true) => solicited || !wc.status.is_success(),
            Some(false) => true,
            None => false,
        };
        if fire {
            *armed = None;
            if let Some(ch) = &self.inner.channel {
                ch.notify(self.inner.id);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use srdma_proto::{WcOpcode, WcStatus};
    use srdma_wire::Qpn;

    /// A device that counts what the CQ asks of it.
    #[derive(Default)]
    struct Counting {
        drives: AtomicU32,
        polls: AtomicU32,
    }

    impl Progress for Counting {
        fn max_cqe(&self) -> u32 {
            1 << 16
        }
        fn drive_from_app(&self, _: bool) {
            self.drives.fetch_add(1, Ordering::Relaxed);
        }
        fn app_polls(&self) {
            self.polls.fetch_add(1, Ordering::Relaxed);
        }
        fn app_sleeps(&self) {}
        fn wait_with_socket(&self, _: RawFd, _: Option<Duration>) -> std::io::Result<[bool; 2]> {
            Ok([false; 2])
        }
        fn add_hooked(&self, _: Weak<CqInner>) {}
        fn hooks_due(&self) {}
        fn raise(&self, _: crate::AsyncEvent) {}
    }

    fn wc(i: u64) -> Wc {
        Wc::new(i, WcStatus::Success, WcOpcode::RdmaWrite, Qpn::new(17))
    }

    #[test]
    fn a_poll_that_finds_enough_tells_the_device_the_application_polls() {
        let dev = Arc::new(Counting::default());
        let weak: Weak<dyn Progress> = Arc::downgrade(&(dev.clone() as Arc<dyn Progress>));
        let cq = Cq::new(1, 64, None, weak);
        for i in 0..6 {
            cq.push(wc(i), false);
        }
        let counts = || {
            (
                dev.drives.load(Ordering::Relaxed),
                dev.polls.load(Ordering::Relaxed),
            )
        };
        let mut out = Vec::new();
        // Four of six: all it asked for, no drive, but the device hears of the poll.
        assert_eq!(cq.poll_into(&mut out, 4), 4);
        assert_eq!(counts(), (0, 1));
        // Two of four: too few, the poll drives the device.
        assert_eq!(cq.poll_into(&mut out, 4), 2);
        assert_eq!(counts(), (1, 1));
        // Nothing asked for: neither.
        assert_eq!(cq.poll_into(&mut out, 0), 0);
        assert_eq!(counts(), (1, 1));
        let ids: Vec<u64> = out.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4, 5]);
        // An armed CQ's poll is a last look before sleeping, not a polling application.
        cq.push(wc(6), false);
        cq.req_notify(false);
        assert_eq!(cq.poll_into(&mut out, 1), 1);
        assert_eq!(counts(), (1, 1));
        // `poll_one` (the extended CQ's polls) likewise; the completion disarmed the CQ.
        cq.push(wc(7), false);
        assert_eq!(cq.poll_one().map(|w| w.wr_id), Some(7));
        assert_eq!(counts(), (1, 2));
        assert_eq!(cq.poll_one(), None);
        assert_eq!(counts(), (2, 2));
    }
}
