//! The engine of a device: its state (QPs, memory, batches), the progress thread, and
//! receive, transmit, timers and completion delivery. The application's threads drive it too
//! (posts send from the caller's thread, polls receive and complete); the progress thread makes
//! sure one-sided operations finish without the application and sleeps when idle.
//!
//! This file holds the state and `start`; the rest is one file per concern: `tx` (sending
//! through the drivers of `crate::driver`, GSO), `probe` (the GSO path probe), `rx`
//! (receiving from the drivers, multicast groups),
//! `timers`, `complete` (completions, hooks, events), `progress` (the progress thread
//! and the application-driven progress), `timing` (when to spin, rest, sleep, look and
//! hold an ACK back: the heuristics, pure), `xrc` (XRC SRQ routing), `verbs` (what modify,
//! post and the doorbell do to a QP's slot) and `state` (what the rest of the crate does to
//! the state: its fields are the engine's).

mod complete;
mod probe;
mod progress;
mod rx;
mod share;
mod state;
mod timers;
mod timing;
mod tx;
mod verbs;
mod xrc;

pub(crate) use verbs::Ring;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_proto::{MrTable, Qp as ProtoQp, Srq as ProtoSrq};
use srdma_wire::pcap;

use crate::config::DeviceConfig;
use crate::cq::Cq;
use crate::error::{Result, io_err};
use crate::memory::Store;
use crate::sys;
use crate::types::DeviceCounters;

use complete::deliver_completions;
pub(crate) use rx::{MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH};

/// Datagrams queued per `sendmmsg` (runs of them to one peer go out as one UDP GSO message).
const TX_BATCH: usize = 128;
/// Buffers per `recvmmsg` (each may hold a GRO-coalesced run of datagrams).
const RX_BATCH: usize = 32;

/// A QP as the engine keeps it: the transport's state machine, the CQs its completions go
/// to, and the engine's bookkeeping for it (set up by [`QpSlot::new`]).
pub(crate) struct QpSlot {
    pub(crate) qp: ProtoQp,
    /// Which driver carried the QP's last packet.
    pub(crate) path: crate::Path,
    /// The state the application last saw or set: a move to ERR the engine makes on its
    /// own raises `QpFatal`.
    state_seen: srdma_proto::QpState,
    send_cq: Cq,
    recv_cq: Cq,
    srq: Option<u32>,
    /// Whether the QP's ACKs wait for its application's sends, and whether that
    /// application waits for its sends' completions: learned at posts and receives.
    ride: timing::AckRide,
    /// Whether a receive was posted to the QP (see [`QpSlot::ack_tail`]).
    posted_recv: bool,
    /// The ECE options set on the QP (`Qp::set_ece`), if any.
    pub(crate) ece: Option<crate::Ece>,
    /// The deadline (ns since the epoch) of the QP's entry in `State::timers` (u64::MAX:
    /// none).
    timer_at: u64,
    /// The QP is on `RxState::touched` (a receive gave it packets: it is flushed after the
    /// batch), so that a batch with thousands of QPs does not search the list per packet.
    touched: bool,
    /// The QP is on `TxState::shm_blocked` (a full ring held it back).
    shm_blocked: bool,
    /// Sends posted with `Qp::post_send_deferred` wait on `State::deferred` for the
    /// application's next poll (cleared when the QP's packets are built).
    posts_held: bool,
    /// The peer address the QP is counted under in `State::shares` (it has work there).
    sharing: Option<std::net::IpAddr>,
    /// Bytes it is counted as having in flight there over UDP.
    flight: u32,
    /// The QP is on `TxState::waiting` (the budget of its peer held it back).
    waits: bool,
}

impl QpSlot {
    /// Whether an ACK that rides behind a request (a ping-pong's reply) goes as the short
    /// tail of the request's GSO message, so that both arrive together, instead of as a
    /// datagram of its own one send later (loopback: the pair at 3.9 µs, against the request
    /// at 3.0 µs and the ACK at 6.0 µs).
    ///
    /// Which one the peer's application needs first is its business; this side's own
    /// application is the guess (a ping-pong runs one program at both ends). One whose
    /// replies and send completions reach it through one CQ takes whichever comes first:
    /// the reply alone is sooner. One that does not wait for its sends' completions (it
    /// spins on its memory for the peer's WRITE and collects them later, as `srdma perf
    /// write-lat`, or posts unsignaled) needs the reply alone too, which its memory reads
    /// then take one datagram a look (veth, 8 B WRITE ping-pong: 6.5–7.9 µs half round trip
    /// with the pair, 5.2–5.3 with the reply alone). One that polls a separate send CQ
    /// until its send completes before it looks for the reply (perftest's `ib_send_lat`,
    /// `ib_write_lat`) waits for the ACK, and the pair brings the peer's next message with
    /// it. Figures in benchmarks/README.md ("8 B ping-pong latency", "Whether the
    /// application waits for the ACK").
    fn ack_tail(&self) -> bool {
        let shares_cq = Arc::ptr_eq(&self.send_cq.inner, &self.recv_cq.inner);
        let receives = self.posted_recv || self.srq.is_some();
        !(self.ride.unwaited() || shares_cq && receives)
    }

    /// At a post (before its WRs join the send queue): learns whether the application took
    /// the completion of its last send first (see [`timing::AckRide::note_post`]).
    fn note_post(&mut self) {
        let waits = self.send_cq.waits();
        let (qp, cq) = (&self.qp, &self.send_cq);
        self.ride
            .note_post(waits, || qp.send_queue_len() == 0 && !cq.holds_any());
    }
}

/// A device's state, behind its lock. The device's objects (memory regions and windows,
/// their memory, QPs, SRQs, XRC), its counters, capture and drivers are used by every file
/// of the engine and live here; what one file alone keeps is a struct of that file's, its
/// invariants documented there: `rx::RxState`, `tx::TxState`, `timers::TimerSet`,
/// `probe::Probes`, `share::Shares`, `state::Ids`, and the timing heuristics'
/// `timing::Timing`.
pub(crate) struct State {
    /// The memory regions and windows and their keys.
    mrs: MrTable,
    /// The memory of the regions, by handle.
    mem: Store,
    /// The QPs, by QPN.
    qps: BTreeMap<u32, QpSlot>,
    /// The SRQs, by identifier.
    srqs: BTreeMap<u32, ProtoSrq>,
    /// XRC domains' SRQs and target QPs (`xrc`; the verbs side is `qp::xrc`).
    xrc: xrc::XrcState,
    /// The QP numbers and identifiers given out (`state`).
    ids: state::Ids,
    /// The device's receive/transmit statistics.
    counters: DeviceCounters,
    /// The packet capture (`DeviceConfig::pcap`), if any.
    capture: Option<pcap::Writer<BufWriter<File>>>,
    /// The UDP driver; `None` only while a receive pass has it out.
    udp: Option<Box<crate::udp::Udp>>,
    /// What the transmit path keeps: the frame packets are built in, the QPs a full ring
    /// held back (`tx`).
    tx: tx::TxState,
    /// What the receive path keeps between datagrams and passes (`rx`).
    rx: rx::RxState,
    /// QPs whose packets (ACKs, responses) an application-driven receive held back: they go
    /// out with the application's next post to that QP (one send for the ACK and the reply
    /// of a ping-pong) or at its next poll, whichever comes first; and QPs with sends
    /// posted without the doorbell (`Qp::post_send_deferred`), which go at the next poll.
    deferred: Vec<u32>,
    /// The QPs' deadlines, earliest first, and the earliest timer of all (`timers`).
    timers: timers::TimerSet,
    /// What the GSO path probe learned of each peer address (`probe`).
    probes: probe::Probes,
    /// The device's published statistics (`stats`), if they are published.
    stats: Option<crate::stats::Publisher>,
    /// What the timing heuristics keep: when polls rest, the progress thread spins,
    /// statistics refresh, and the next pacing deadline (`timing`).
    timing: timing::Timing,
    /// The shared-memory driver (`None`: off, or it could not open); taken out while its
    /// rings are read (boxed: a look moves a pointer, not the driver).
    shm: Option<Box<crate::shm::Shm>>,
    /// QPs with work per peer address: their windows' fair shares (`share`).
    shares: share::Shares,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    socket: UdpSocket,
    /// The connection to the port keeper while this device holds a slot of a shared port.
    pub(crate) _keeper: Option<OwnedFd>,
    /// The port is shared through the keeper (this device owns its slot's QPNs only).
    pub(crate) shared_port: bool,
    /// A GSI QP lives here on a shared port: the keeper forwards QP1's MADs, which receive
    /// passes and the progress thread's poll must look at.
    pub(crate) cm_forwarded: AtomicBool,
    /// The established CM connections, shared with the keeper (made on first use; None on
    /// an unshared port or when it could not be made).
    pub(crate) cm_table: std::sync::OnceLock<Option<crate::portshare::ConnTable>>,
    /// Where async events go.
    pub(crate) events: Mutex<Option<crate::EventHandler>>,
    /// Set when the progress thread failed: the device is dead.
    pub(crate) fatal: AtomicBool,
    /// Test hook: the progress thread panics at its next turn.
    pub(crate) inject_failure: AtomicBool,
    pub(crate) local: SocketAddr,
    pub(crate) wake: OwnedFd,
    /// The timer the progress thread sleeps towards, in ns since `epoch` (u64::MAX: none).
    /// A post from an application thread that arms an earlier timer wakes it.
    pub(crate) sleep_until: AtomicU64,
    /// Until when (ns since `epoch`) an application's polls drive the device.
    app_active_until: AtomicU64,
    /// Until when (ns since `epoch`) the progress thread, standing aside for an
    /// application's polls, looks often whether they stopped: some QP executed a WRITE
    /// without immediate less than `timing::SILENT_WRITES_HOLD` ago, so an application may be
    /// waiting for the next one in its memory instead of on a CQ.
    silent_writes_until: AtomicU64,
    stop: AtomicBool,
    epoch: Instant,
    pub(crate) cfg: DeviceConfig,
    /// The CQs with a completion hook (`Cq::set_hook`).
    hooked: Mutex<Vec<std::sync::Weak<crate::cq::CqInner>>>,
    /// Some hooked CQ got completions: whoever releases the device lock next runs the hooks.
    pub(crate) hooks_due: AtomicBool,
    /// Application threads asleep in [`Shared::wait_with_socket`] (`CompChannel::get_event`),
    /// watching the socket themselves: a datagram wakes the thread that waits for it, with
    /// no hand-off from the progress thread, which leaves the socket to them.
    app_waiters: AtomicUsize,
    /// When (ns since `epoch`) such a thread last woke (0: never): for `timing::APP_GRACE`
    /// after it, the progress thread still leaves the socket alone, as the application is
    /// expected back.
    wait_woke_at: AtomicU64,
    /// The progress thread sleeps without watching the socket and without a deadline
    /// (applications wait on it): a waiter that wakes must wake it.
    sleeps_deep: AtomicBool,
    /// An epoll instance holding the sockets of `State::groups` (made at the first attach).
    groups_ep: std::sync::OnceLock<OwnedFd>,
    /// `groups_ep`'s descriptor while some group is joined, else -1: the progress thread
    /// always watches it, an application thread waiting on its channel too.
    groups_fd: AtomicI32,
    /// The shared-memory driver's descriptors (see `shm::Shm::fds`), -1 without it: the
    /// driver lives in `State` as long as this does.
    shm_fds: [RawFd; 2],
    /// How many links peers of this host produce into (`shm::Shm::ins`, as of the last
    /// `service`): the progress thread arms the rings only when there are some.
    shm_ins: AtomicUsize,
}

/// The devices of this process, for [`flush_at_exit`], and the process that registered it
/// (a forked child's exit is not its).
static LIVE: Mutex<(u32, Vec<std::sync::Weak<Shared>>)> = Mutex::new((0, Vec::new()));

/// Keeps `shared` for [`flush_at_exit`], registered with `atexit` by the first device.
fn keep_for_exit(shared: &Arc<Shared>) {
    let mut live = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let pid = std::process::id();
    if live.0 != pid && sys::at_exit(flush_at_exit) {
        *live = (pid, Vec::new());
    }
    live.1.retain(|w| w.strong_count() > 0);
    live.1.push(Arc::downgrade(shared));
}

/// At `exit`, every device sends what it holds back: the ACKs that wait for the
/// application's next post (`Hold::Riding`), packets queued for the next `sendmmsg`, then
/// the last ACK of each QP once more (`Shared::last_words_all`). A NIC
/// acknowledges at arrival, whatever its process does next; a process that exits right after
/// its last receive (a socket program closing, a test ending) must not leave the peer's last
/// message unacknowledged, or the peer retries into a QP that is gone and fails. A device
/// whose lock stays taken (the process exits from inside a callback that holds it) is
/// skipped.
extern "C" fn flush_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let devices: Vec<Arc<Shared>> = {
            let live = LIVE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if live.0 != std::process::id() {
                return;
            }
            live.1.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for sh in devices {
            let deadline = Instant::now() + Duration::from_millis(50);
            loop {
                match sh.state.try_lock() {
                    Ok(mut st) => {
                        sh.last_words_all(&mut st);
                        break;
                    }
                    Err(std::sync::TryLockError::Poisoned(p)) => {
                        sh.last_words_all(&mut p.into_inner());
                        break;
                    }
                    Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                        std::thread::yield_now();
                    }
                    Err(std::sync::TryLockError::WouldBlock) => break,
                }
            }
        }
    });
}

/// Keeps the progress thread alive exactly as long as some handle needs the device.
pub(crate) struct DeviceHandle {
    pub(crate) shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        // Held-back ACKs go out before the device goes away.
        {
            let mut st = self.shared.lock();
            self.shared.flush_deferred(&mut st);
        }
        self.shared.stop.store(true, Ordering::Release);
        sys::signal(&self.shared.wake);
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }
}

/// Unix time of the engine's epoch, so captures carry real timestamps.
fn capture_epoch() -> u64 {
    static EPOCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// The file a device given capture path `given` writes: `given` itself, unless a device of
/// this process already captures there (every device a program opens with the default
/// configuration gets `$SRDMA_PCAP`), in which case `NAME-2.EXT`, `NAME-3.EXT`, …: a
/// capture never truncates another's. Names are not given out twice in a process's life,
/// so the capture of a closed device stays too. (The drop-in library's devices capture
/// nothing.)
fn capture_path(given: &std::path::Path) -> std::path::PathBuf {
    static TAKEN: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
    // No file name ("/", ".."): creating it fails as before.
    let Some(name) = given.file_name() else {
        return given.to_path_buf();
    };
    // Every candidate lies beside `given`; "x.pcap" and "./x.pcap" are one file: compare
    // with the directory resolved once.
    let dir = given
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let stem = given.file_stem().unwrap_or(name).to_string_lossy();
    let mut file = name.to_os_string();
    let mut taken = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for n in 2.. {
        if !taken.contains(&dir.join(&file)) {
            break;
        }
        file = match given.extension() {
            Some(ext) => format!("{stem}-{n}.{}", ext.to_string_lossy()),
            None => format!("{stem}-{n}"),
        }
        .into();
    }
    taken.push(dir.join(&file));
    given.with_file_name(file)
}

/// Starts the engine of a device on its socket: the state, and the progress thread.
pub(crate) fn start(cfg: DeviceConfig, sock: crate::udp::Socket) -> Result<Arc<DeviceHandle>> {
    let crate::udp::Socket {
        socket,
        local,
        slot,
        keeper,
        gro,
        rcvbuf,
    } = sock;
    let capture = match &cfg.pcap {
        Some(given) => {
            let p = capture_path(given);
            if p != *given {
                eprintln!(
                    "srdma: device {} on {} captures to {}: another device of this process \
                     captures to {}",
                    cfg.name,
                    local,
                    p.display(),
                    given.display()
                );
            }
            Some(
                pcap::Writer::new(BufWriter::new(
                    File::create(&p).map_err(io_err(format!("creating {}", p.display())))?,
                ))
                .map_err(io_err("writing the pcap header"))?,
            )
        }
        None => None,
    };
    // Best effort: without its rendezvous socket the device still works, over UDP alone.
    let shm = cfg
        .shm
        .then(|| crate::shm::Shm::open(local, keeper.is_some().then_some(slot), cfg.shm_pull).ok())
        .flatten()
        .map(Box::new);
    let shm_fds = shm.as_ref().map_or([-1, -1], |s| s.fds());
    let state = State {
        mrs: MrTable::new(crate::random::random_u64()),
        mem: Store::default(),
        qps: BTreeMap::new(),
        srqs: BTreeMap::new(),
        xrc: Default::default(),
        ids: state::Ids::new(slot),
        counters: DeviceCounters::default(),
        capture,
        udp: Some(Box::new(crate::udp::Udp::new(
            socket.as_raw_fd(),
            TX_BATCH,
            RX_BATCH,
            MAX_PACKET_LEN,
            gro,
        ))),
        tx: tx::TxState::new(),
        rx: rx::RxState::new(),
        deferred: Vec::with_capacity(64),
        shm,
        shares: share::Shares::new(rcvbuf),
        timers: timers::TimerSet::new(),
        probes: probe::Probes::default(),
        stats: crate::stats::Publisher::new(&cfg.name, local),
        timing: timing::Timing::default(),
    };
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        socket,
        shared_port: keeper.is_some(),
        cm_forwarded: AtomicBool::new(false),
        cm_table: std::sync::OnceLock::new(),
        _keeper: keeper,
        events: Mutex::new(None),
        fatal: AtomicBool::new(false),
        inject_failure: AtomicBool::new(false),
        local,
        wake: sys::eventfd().map_err(io_err("eventfd"))?,
        sleep_until: AtomicU64::new(u64::MAX),
        app_active_until: AtomicU64::new(0),
        silent_writes_until: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        epoch: Instant::now(),
        cfg,
        hooked: Mutex::new(Vec::new()),
        app_waiters: AtomicUsize::new(0),
        wait_woke_at: AtomicU64::new(0),
        sleeps_deep: AtomicBool::new(false),
        hooks_due: AtomicBool::new(false),
        groups_ep: std::sync::OnceLock::new(),
        groups_fd: AtomicI32::new(-1),
        shm_fds,
        shm_ins: AtomicUsize::new(0),
    });
    keep_for_exit(&shared);
    let s2 = Arc::clone(&shared);
    let thread = crate::threads::spawn(format!("srdma-{}", local), move || {
        // Best effort: a kernel that refuses leaves the thread as it was.
        let _ = crate::threads::wake_promptly();
        let run = std::panic::AssertUnwindSafe(|| progress::progress(&s2));
        if std::panic::catch_unwind(run).is_err() {
            s2.fail();
        }
    })
    .map_err(io_err("starting the progress thread"))?;
    Ok(Arc::new(DeviceHandle {
        shared,
        thread: Mutex::new(Some(thread)),
    }))
}
