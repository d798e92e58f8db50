//! One completion queue per device for every rsocket connection on it, and how waiting
//! calls learn of news.
//!
//! A connection's QP completes into its device's [`Reactor`] CQ. Whoever needs news (a
//! receive waiting for data, a send waiting for credits, `rpoll` or the preload's epoll)
//! calls [`Reactor::progress`], which takes what completed, in order, and hands each
//! completion to its connection under that connection's lock. One CQ serves a thousand
//! connections as cheaply as one: an epoll over many sockets drives the device once per
//! look instead of once per socket.
//!
//! Lock order: the reactor's dispatch lock, then a socket's lock. Nothing calls
//! `progress` holding a socket's lock.
//!
//! Sleeping: a waiting call counts itself among the sleepers, reads the news generation,
//! checks its condition, arms the CQ, looks once more (a completion that came before the
//! arming fires no event), and sleeps only if the generation did not move. Whatever makes
//! a socket ready bumps the generation ([`news`]) and, when someone sleeps, rings the
//! process's waker (an eventfd every sleeper also watches): a completion that another
//! thread took from the CQ before this one armed it still wakes it. Sleeps are bounded
//! ([`MAX_SLEEP`]): two threads sleeping on the same channel or waker may take each
//! other's wakeup, and the bound makes that a delay, never a hang.

use std::ffi::c_int;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use srdma::fasthash::FastMap;
use srdma::{CompChannel, Cq, Pd};
use srdma_proto::Wc;

use super::{Rsock, lock};

/// The longest a waiting call sleeps before it looks again.
pub(crate) const MAX_SLEEP: Duration = Duration::from_millis(20);

/// Completions a CQ of the reactor holds: every connection's send and receive queues.
const CQ_SIZE: usize = 1 << 21;

/// Completions taken per look.
const BATCH: usize = 64;

/// A device's shared CQ and the connections completing into it.
pub(crate) struct Reactor {
    /// Kept open while its connections live.
    _dev: srdma::Device,
    pub(super) pd: Pd,
    pub(super) cq: Cq,
    ch: CompChannel,
    armed: AtomicBool,
    disp: Mutex<Dispatch>,
    /// Receive and send queue entries of the connections made on it: a new connection
    /// that would overflow the CQ is refused.
    committed: AtomicUsize,
    /// QPs registered (connections, and those being made).
    qps: AtomicUsize,
}

#[derive(Default)]
struct Dispatch {
    wcs: Vec<Wc>,
    slots: FastMap<u32, Slot>,
    touched: Vec<Arc<Rsock>>,
}

/// What a QP number of the reactor leads to.
enum Slot {
    /// A QP whose socket does not exist yet (a connection being set up): its completions
    /// wait here, in order.
    Pending(Vec<Wc>),
    Live(Weak<Rsock>),
}

static REACTORS: OnceLock<Mutex<FastMap<usize, Arc<Reactor>>>> = OnceLock::new();

impl Reactor {
    /// The reactor of CM device `d` (`rdmacm::cm_devs()[d]`), made on first use.
    pub(crate) fn for_device(d: usize) -> Result<Arc<Reactor>, c_int> {
        let map = REACTORS.get_or_init(|| Mutex::new(FastMap::default()));
        let mut m = lock(map);
        if let Some(r) = m.get(&d) {
            return Ok(r.clone());
        }
        let cm_dev = crate::rdmacm::cm_devs().get(d).ok_or(libc::ENODEV)?;
        let dev = cm_dev.context().device()?;
        let io = |e: srdma::Error| crate::errno_of(&e);
        let ch = CompChannel::new().map_err(io)?;
        let cq = dev.create_cq(CQ_SIZE, Some(&ch)).map_err(io)?;
        let r = Arc::new(Reactor {
            pd: dev.alloc_pd(),
            _dev: dev,
            cq,
            ch,
            armed: AtomicBool::new(false),
            disp: Mutex::new(Dispatch::default()),
            committed: AtomicUsize::new(0),
            qps: AtomicUsize::new(0),
        });
        m.insert(d, r.clone());
        Ok(r)
    }

    /// Reserves room in the CQ for a connection's `entries` (ENOBUFS when full).
    pub(super) fn commit(&self, entries: usize) -> Result<(), c_int> {
        let prev = self.committed.fetch_add(entries, Ordering::AcqRel);
        if prev + entries > CQ_SIZE {
            self.committed.fetch_sub(entries, Ordering::AcqRel);
            return Err(libc::ENOBUFS);
        }
        Ok(())
    }

    /// Gives back what [`Reactor::commit`] reserved.
    pub(super) fn uncommit(&self, entries: usize) {
        self.committed.fetch_sub(entries, Ordering::AcqRel);
    }

    /// QP `qpn` completes here: its completions wait until [`Reactor::attach`].
    pub(super) fn register(&self, qpn: u32) {
        lock(&self.disp)
            .slots
            .insert(qpn, Slot::Pending(Vec::new()));
        self.qps.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the preload's posts wait for the program's next poll or wait
    /// (`Qp::post_send_deferred`, `Qp::post_recv_deferred`): with more than one connection
    /// on the device, one turn of the program's event loop may answer several, whose packets
    /// then leave together; a lone connection's would only wait (one host, `sockperf`
    /// ping-pong: 2.2 → 3.0 µs).
    pub(super) fn defers(&self) -> bool {
        self.qps.load(Ordering::Relaxed) > 1
    }

    /// QP `qpn` belongs to `rs` from now on; what completed before is handed over now.
    pub(super) fn attach(&self, qpn: u32, rs: &Arc<Rsock>) {
        let mut d = lock(&self.disp);
        let old = d.slots.insert(qpn, Slot::Live(Arc::downgrade(rs)));
        if let Some(Slot::Pending(wcs)) = old {
            if !wcs.is_empty() {
                rs.deliver(&wcs);
                rs.after_delivery();
                drop(d);
                news();
            }
        }
    }

    /// QP `qpn` is gone: later completions of it are dropped.
    pub(super) fn unregister(&self, qpn: u32) {
        if lock(&self.disp).slots.remove(&qpn).is_some() {
            self.qps.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Takes what completed and hands it to the connections; true if anything came.
    pub(crate) fn progress(&self) -> bool {
        let mut d = lock(&self.disp);
        let mut wcs = std::mem::take(&mut d.wcs);
        wcs.clear();
        if self.cq.poll_into(&mut wcs, BATCH) == 0 {
            d.wcs = wcs;
            return false;
        }
        let mut touched = std::mem::take(&mut d.touched);
        let mut i = 0;
        while i < wcs.len() {
            // A run of one QP's completions goes to its socket under one hold of its lock.
            let qpn = wcs[i].qp_num.value();
            let mut j = i + 1;
            while j < wcs.len() && wcs[j].qp_num.value() == qpn {
                j += 1;
            }
            match d.slots.get_mut(&qpn) {
                Some(Slot::Live(w)) => {
                    if let Some(rs) = w.upgrade() {
                        rs.deliver(&wcs[i..j]);
                        push_once(&mut touched, rs);
                    }
                }
                Some(Slot::Pending(p)) => p.extend_from_slice(&wcs[i..j]),
                None => {}
            }
            i = j;
        }
        for rs in touched.drain(..) {
            rs.after_delivery();
        }
        d.touched = touched;
        d.wcs = wcs;
        drop(d);
        news();
        true
    }

    /// The channel's descriptor, readable once the armed CQ gets a completion.
    pub(crate) fn fd(&self) -> RawFd {
        self.ch.as_fd().as_raw_fd()
    }

    /// Arms the CQ (once until its event is taken).
    pub(crate) fn arm(&self) {
        if !self.armed.swap(true, Ordering::AcqRel) {
            self.cq.req_notify(false);
        }
    }

    /// Takes the channel's events (after its descriptor polled readable).
    pub(crate) fn drain(&self) {
        while let Ok(Some(_)) = self.ch.get_event(Some(Duration::ZERO)) {
            self.armed.store(false, Ordering::Release);
        }
    }

    /// Sleeps on the CQ up to `timeout` (at most [`MAX_SLEEP`]), the calling thread
    /// receiving for the device meanwhile (the fast way back for a message that wakes it).
    /// The caller follows the sleeping rule of the module docs through [`Sleep`].
    pub(crate) fn sleep(&self, timeout: Duration) -> Result<(), c_int> {
        match self.ch.get_event(Some(timeout.min(MAX_SLEEP))) {
            Ok(Some(_)) => {
                self.armed.store(false, Ordering::Release);
                self.drain();
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(crate::errno_of(&e)),
        }
    }
}

fn push_once(v: &mut Vec<Arc<Rsock>>, rs: Arc<Rsock>) {
    if !v.iter().any(|x| Arc::ptr_eq(x, &rs)) {
        v.push(rs);
    }
}

// ---------------------------------------------------------------------------------------
// Staged sends and the flusher.

/// Connections with staged bytes (see `Conn::staged`).
static STAGED: AtomicUsize = AtomicUsize::new(0);

/// A connection got staged bytes (`true`) or has none left.
pub(super) fn staged_changed(some: bool) {
    if some {
        if STAGED.fetch_add(1, Ordering::AcqRel) == 0 {
            start_flusher();
        }
    } else {
        STAGED.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How often the flusher looks.
const FLUSH_EVERY: Duration = Duration::from_millis(1);

/// The flusher: while some connection holds staged bytes and no thread of the program took
/// completions for [`FLUSH_EVERY`] (it went to do something else, or waits in the kernel),
/// it takes them, which posts the staged bytes their credits allow: what a program wrote
/// leaves without its help, as a TCP socket's does.
fn start_flusher() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = super::spawn_quiet("srdma-rs-flush", || {
            let mut seen = generation();
            loop {
                std::thread::sleep(FLUSH_EVERY);
                if STAGED.load(Ordering::Acquire) == 0 {
                    // Idle: look ten times less often.
                    std::thread::sleep(FLUSH_EVERY * 9);
                    seen = generation();
                    continue;
                }
                let now = generation();
                if now == seen {
                    let all: Vec<Arc<Reactor>> = REACTORS
                        .get()
                        .map(|m| lock(m).values().cloned().collect())
                        .unwrap_or_default();
                    for r in all {
                        r.progress();
                    }
                }
                seen = generation();
            }
        });
    });
}

// ---------------------------------------------------------------------------------------
// News and the waker.

struct Waker {
    fd: OwnedFd,
    seq: AtomicU64,
    sleepers: AtomicUsize,
}

fn waker() -> &'static Waker {
    static W: OnceLock<Waker> = OnceLock::new();
    W.get_or_init(|| {
        // SAFETY: plain syscall with constant flags.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(fd >= 0, "eventfd for the rsocket waker");
        Waker {
            // SAFETY: a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            seq: AtomicU64::new(1),
            sleepers: AtomicUsize::new(0),
        }
    })
}

/// Something may have become ready: sleepers look again.
pub(crate) fn news() {
    let w = waker();
    w.seq.fetch_add(1, Ordering::SeqCst);
    if w.sleepers.load(Ordering::SeqCst) > 0 {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
        let _ = unsafe { libc::write(w.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }
}

/// The news generation: it moves whenever [`news`] is called.
pub(crate) fn generation() -> u64 {
    waker().seq.load(Ordering::SeqCst)
}

/// A waiting call's place among the sleepers (the module docs' rule): made before the
/// call checks its condition, dropped when it stops waiting.
pub(crate) struct Sleep {
    seq: u64,
}

impl Sleep {
    /// Counts the caller among the sleepers and reads the generation.
    pub(crate) fn begin() -> Sleep {
        let w = waker();
        w.sleepers.fetch_add(1, Ordering::SeqCst);
        Sleep {
            seq: w.seq.load(Ordering::SeqCst),
        }
    }

    /// Arms `reactors` and looks once more: true if the caller may sleep now (nothing
    /// happened since [`Sleep::begin`] or the last [`Sleep::again`]).
    pub(crate) fn may_sleep(&self, reactors: &[Arc<Reactor>]) -> bool {
        for r in reactors {
            r.arm();
        }
        let mut moved = false;
        for r in reactors {
            moved |= r.progress();
        }
        !moved && generation() == self.seq
    }

    /// The waker's descriptor, for the caller's poll.
    pub(crate) fn fd(&self) -> RawFd {
        waker().fd.as_raw_fd()
    }

    /// After a sleep: takes the waker's count and reads the generation anew.
    pub(crate) fn again(&mut self) {
        let w = waker();
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe { libc::read(w.fd.as_raw_fd(), (&raw mut v).cast(), 8) };
        self.seq = w.seq.load(Ordering::SeqCst);
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        waker().sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One turn of a waiting call's spin, `spun` into it: a pause at first, then a
/// `sched_yield` (after [`YIELD_AFTER`]), so that on a machine with more runnable threads
/// than cores the peer (or the progress thread) this call waits for gets the core.
pub(crate) fn spin_turn(spun: Duration) {
    if spun < yield_after() {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// How long a waiting call spins before it starts yielding its core between looks
/// (`SRDMA_RS_YIELD_US`, default 5 µs: longer than a round trip between two processes of
/// this host that run on two cores; when the scheduler put both on one core, which it does
/// on a busy two-core machine, each yield lets the peer answer).
fn yield_after() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        let us = std::env::var("SRDMA_RS_YIELD_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(5);
        Duration::from_micros(us)
    })
}

/// How long a waiting call keeps looking before it sleeps (`SRDMA_RS_SPIN_US`, default
/// 1000 µs, yielding its core after [`yield_after`]): a peer on this host answers within a
/// few microseconds, and a sleep and its wakeup cost tens of microseconds (the engine's
/// progress thread takes over the device and wakes the sleeper through the CQ's channel),
/// which two processes that both wait would pay on every exchange.
pub(crate) fn spin_time() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        let us = std::env::var("SRDMA_RS_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1000);
        Duration::from_micros(us)
    })
}
