//! rsockets (stream) on srdma: librdmacm's socket-like API over RC QPs, speaking its wire
//! protocol so that an rsocket here talks to librdmacm's on kernel rxe. The same sockets
//! carry `srdma exec --rsockets` (the `preload` module), which gives unmodified socket
//! programs these sockets under their own descriptor numbers.
//!
//! The protocol (rdma-core librdmacm/rsocket.c, version 1): each side registers a receive
//! ring (`rbuf`, 128 KiB by default), a send staging ring (`sbuf`, the same) and a two-entry
//! "target SGL" array the peer may write, and posts 384 zero-length receives. The
//! connection's private data (after rdma_cm's header) is `rs_conn_data`: version 1, flags,
//! the receive credits (the receive queue's size), the target SGL's address and key, and the
//! first half of `rbuf` as the first buffer the peer may write into. Data goes by RDMA WRITE
//! WITH IMMEDIATE into the buffer the peer last gave (immediate: op 0 and the length); as
//! the application reads, the receiver gives the next half of its ring by writing a 16-byte
//! `rs_sge` into the sender's target SGL (immediate: op 4 and the new credit limit, the
//! sequence number up to which the sender may send). Control messages (op 7: disconnect,
//! shutdown) are zero-length writes with immediate. Four control messages may be in flight.
//!
//! How it runs (`conn`, `reactor`, `ring`, `wait`): every connection of a device completes
//! into that device's one CQ; whoever waits takes what completed and hands each completion
//! to its connection ([`reactor::Reactor::progress`]); a waiting call keeps looking for a
//! while ([`reactor::spin_time`], `SRDMA_RS_SPIN_US`) and then sleeps on the CQ's channel
//! (module `reactor`). The rings are memory of the socket's own, registered as an
//! application's buffers are, so copies in and out take no device lock. A buffer grant the
//! peer writes into our target SGL is copied out when its completion comes, never read
//! while the peer may still be writing it.
//!
//! What is here: `SOCK_STREAM` over IPv4 and IPv6, blocking and non-blocking
//! (`O_NONBLOCK`, `MSG_DONTWAIT`, `MSG_WAITALL`, `MSG_PEEK`), `rpoll`/`rselect` over
//! rsockets and ordinary descriptors, the socket options rstream and rcopy set. A
//! non-blocking `rconnect` returns EINPROGRESS and completes in the background (the socket
//! polls writable, `SO_ERROR` tells how it went), as rsocket.c's; a listener accepts in the
//! background, `raccept` takes what it accepted (EAGAIN on a non-blocking listener with
//! none waiting). `riomap`/`riounmap`/`riowrite`: a mapping is a region the peer may RDMA
//! WRITE into at an offset; it goes out as a 32-byte `rs_iomap` written into the peer's
//! iomap table (which follows its target SGL; its size, `RDMA_IOMAPSIZE`, is in the
//! connection data), immediate op 6 and the entry, on the next send or `riowrite`;
//! `riowrite` is then plain RDMA WRITEs from the send ring. Not here: datagram rsockets
//! (`SOCK_DGRAM`: EOPNOTSUPP), keepalive messages (the option is kept).

use std::collections::VecDeque;
use std::ffi::c_int;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

mod abi;
mod conn;
pub(crate) mod reactor;
mod ring;
pub(crate) mod wait;

use conn::{Conn, IoMap};
use reactor::{Reactor, Sleep, news};
use srdma::AccessFlags;
use srdma::cm::ConnectOptions;
use srdma::fasthash::FastMap;
use srdma::ibcm::{self, IbListener, IbRequest};
use srdma_proto::Wc;

const SQ_SIZE: u16 = 384;
const RQ_SIZE: u16 = 384;
const BUF_SIZE: u32 = 1 << 17;
/// Control messages in flight at most (`RS_QP_CTRL_SIZE`).
const CTRL_SIZE: u32 = 4;
/// Entries of the target SGL (`RS_SGL_SIZE`).
const SGL_SIZE: u32 = 2;
/// An `rs_sge` on the wire: address, key, length.
const SGE_LEN: usize = 16;
/// An `rs_iomap` on the wire: the mapping's offset, then its `rs_sge`.
const IOMAP_LEN: usize = 8 + SGE_LEN;
/// Sends wait for this much room in the send ring (`RS_SNDLOWAT`).
const SNDLOWAT: u32 = 2048;
const OLAP_START: u32 = 2048;
const MAX_TRANSFER: u32 = 65536;
/// The preload's sockets: larger transfers (fewer completions and credits per byte; the
/// peer's buffer halves bound them anyway).
const PRELOAD_MAX_TRANSFER: u32 = 1 << 20;
/// `rs_conn_data`: version, flags, credits, 3 reserved, iomap size, two `rs_sge`.
const CONN_DATA_LEN: usize = 8 + 2 * SGE_LEN;
const CONN_FLAG_NET: u8 = 1;
const CONN_FLAG_IOMAP: u8 = 2;

const OP_DATA: u32 = 0;
const OP_WRITE: u32 = 2;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;
const CTRL_DISCONNECT: u32 = 0;
const CTRL_SHUTDOWN: u32 = 2;
const RECV_FLAG: u64 = 1 << 63;

/// `SOL_RDMA` and its options (rdma/rsocket.h).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

/// How long closing a connection waits for what it sent to be acknowledged.
const LINGER: Duration = Duration::from_secs(2);

fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

/// rsocket.c's one-byte encoding of a table size: values up to 128 as they are, larger
/// ones as 128 | value / 256 (`rs_value_to_scale`, 8 bits).
fn value_to_scale(v: u32) -> u8 {
    if v <= 128 {
        v as u8
    } else {
        (128 | (v >> 8)).min(255) as u8
    }
}

/// The inverse of [`value_to_scale`] (`rs_scale_to_value`).
fn scale_to_value(s: u8) -> u32 {
    if s <= 128 {
        u32::from(s)
    } else {
        u32::from(s & 127) << 8
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The sizes a socket's connection gets (set by `rsetsockopt` before it connects).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    sq: u16,
    rq: u16,
    sbuf: u32,
    rbuf: u32,
    /// Entries of our iomap table, the mappings the peer may tell us of (`RDMA_IOMAPSIZE`).
    iomap: u16,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            sq: SQ_SIZE,
            rq: RQ_SIZE,
            sbuf: BUF_SIZE,
            rbuf: BUF_SIZE,
            iomap: 0,
        }
    }
}

impl Sizes {
    /// The preload's sockets: rings of `SRDMA_RS_BUF` bytes each (default 512 KiB), which
    /// keep a stream between two processes of a host moving while each side copies.
    pub(crate) fn preload() -> Sizes {
        static B: OnceLock<u32> = OnceLock::new();
        let buf = *B.get_or_init(|| {
            std::env::var("SRDMA_RS_BUF")
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .map_or(1 << 19, |b| b.clamp(SNDLOWAT * 4, 1 << 28))
        });
        Sizes {
            sbuf: buf,
            rbuf: buf,
            ..Sizes::default()
        }
    }
}

/// An rsocket.
pub(crate) struct Rsock {
    /// The number the rsocket API knows it by (an eventfd, so that it never collides with
    /// an ordinary descriptor); none for the preload's sockets, which the application knows
    /// by a kernel socket's number.
    fd: Option<OwnedFd>,
    st: Mutex<Sock>,
    /// A listener's accepted connections.
    accepted: Mutex<VecDeque<Arc<Rsock>>>,
    /// A listener's threads stop when set.
    stop: Arc<AtomicBool>,
    /// Moves whenever something may have made the socket ready (edge-triggered epoll).
    events: AtomicU64,
}

/// The keys of an epoll set's sockets that changed since its last look, or were ready then.
pub(crate) type ReadyQueue = Mutex<Vec<u64>>;

/// An epoll set's watch on one of its sockets: the socket puts the watch's key on the set's
/// ready queue when it changes (once, until the set takes it off), so that a wait looks at
/// the sockets that changed or were ready — the kernel's ready list — not at every socket of
/// the set.
pub(crate) struct Watch {
    key: u64,
    queued: AtomicBool,
    /// The set is gone: the socket forgets the watch.
    dead: AtomicBool,
    queue: Arc<ReadyQueue>,
}

impl Watch {
    /// A watch under `key` that queues on `queue`, queued already (the set's first look
    /// looks at it).
    pub(crate) fn new(key: u64, queue: &Arc<ReadyQueue>) -> Arc<Watch> {
        lock(queue).push(key);
        Arc::new(Watch {
            key,
            queued: AtomicBool::new(true),
            dead: AtomicBool::new(false),
            queue: queue.clone(),
        })
    }

    /// Puts the key on the set's queue unless it is there. False once the set is gone.
    pub(crate) fn wake(&self) -> bool {
        if self.queued.load(Ordering::Acquire) {
            return true;
        }
        if self.dead.load(Ordering::Acquire) {
            return false;
        }
        if !self.queued.swap(true, Ordering::AcqRel) {
            lock(&self.queue).push(self.key);
        }
        true
    }

    /// The set took the key off its queue, to look at the socket: a change from now on
    /// queues it again.
    pub(crate) fn taken(&self) {
        self.queued.store(false, Ordering::Release);
    }

    /// The set is gone (or no longer holds the socket).
    pub(crate) fn end(&self) {
        self.dead.store(true, Ordering::Release);
    }
}

/// The state of a socket, locked by [`Rsock::sock`]: letting it go wakes the epoll sets that
/// watch the socket (whatever the holder did may have made it ready).
struct SockGuard<'a> {
    st: MutexGuard<'a, Sock>,
}

impl std::ops::Deref for SockGuard<'_> {
    type Target = Sock;
    fn deref(&self) -> &Sock {
        &self.st
    }
}

impl std::ops::DerefMut for SockGuard<'_> {
    fn deref_mut(&mut self) -> &mut Sock {
        &mut self.st
    }
}

impl Drop for SockGuard<'_> {
    fn drop(&mut self) {
        wake_all(&mut self.st.watches);
    }
}

/// Wakes the epoll sets of `watches`, forgetting those gone.
fn wake_all(watches: &mut Vec<Arc<Watch>>) {
    if !watches.is_empty() {
        watches.retain(|w| w.wake());
    }
}

#[derive(Default)]
struct Sock {
    nonblock: bool,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    sizes: Sizes,
    nodelay: c_int,
    keepalive: c_int,
    keepidle: c_int,
    /// `IPV6_V6ONLY`: a listener on `::` leaves IPv4 devices alone.
    v6only: bool,
    /// `SO_RCVTIMEO`, `SO_SNDTIMEO`.
    rcvtimeo: Option<Duration>,
    sndtimeo: Option<Duration>,
    /// `SO_ERROR`.
    err: c_int,
    /// The epoll sets watching the socket (see [`Watch`]): woken whenever a lock of this
    /// state taken through [`Rsock::sock`] is let go.
    watches: Vec<Arc<Watch>>,
    /// A background connect succeeded and no `connect` call has been told yet: the next
    /// one returns 0 (as the kernel's), later ones EISCONN.
    untold: bool,
    state: State,
}

/// Where a socket is in its life.
#[derive(Default)]
enum State {
    #[default]
    Idle,
    /// A non-blocking connect runs in the background.
    Connecting,
    Connected(Box<Conn>),
    Listening,
    /// Given up: closed, or handed to the kernel by the preload after a failed connect.
    Done,
}

impl Rsock {
    /// Completions of this socket's QP, in order (from the reactor).
    fn deliver(&self, wcs: &[Wc]) {
        let mut st = self.sock();
        let before = (state_readiness(self, &st), received(&st));
        if let State::Connected(c) = &mut st.state {
            for wc in wcs {
                c.on_wc(wc);
            }
        }
        let after = (state_readiness(self, &st), received(&st));
        drop(st);
        // An edge for edge-triggered epoll where the kernel's TCP makes one: data came, or
        // the socket became ready for something it was not (writable again, hung up) — not
        // at every completion (a credit granted, a send completed while still writable).
        if after.1 > before.1 || after.0 & !before.0 != 0 {
            self.events.fetch_add(1, Ordering::Release);
        }
    }

    /// After a run of completions: receives posted again, credits granted.
    fn after_delivery(&self) {
        if let State::Connected(c) = &mut self.sock().state {
            c.after_delivery();
        }
    }

    /// The connection's reactor, if connected (a connection keeps its reactor).
    pub(crate) fn reactor(&self) -> Option<Arc<Reactor>> {
        match &lock(&self.st).state {
            State::Connected(c) => Some(c.reactor().clone()),
            _ => None,
        }
    }

    /// The edge counter (see [`Rsock::events`]).
    pub(crate) fn event_count(&self) -> u64 {
        self.events.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.events.fetch_add(1, Ordering::Release);
        self.notify();
        news();
    }

    /// The socket's state, locked; whatever the caller does with it counts as a change.
    fn sock(&self) -> SockGuard<'_> {
        SockGuard { st: lock(&self.st) }
    }

    /// Wakes the epoll sets that watch the socket (see [`Watch`]). Not with the socket's
    /// state locked.
    fn notify(&self) {
        wake_all(&mut lock(&self.st).watches);
    }

    /// An epoll set watches the socket from now on.
    pub(crate) fn watch(&self, w: Arc<Watch>) {
        lock(&self.st).watches.push(w);
    }

    /// The epoll set of `w` no longer watches the socket.
    pub(crate) fn unwatch(&self, w: &Arc<Watch>) {
        lock(&self.st).watches.retain(|x| !Arc::ptr_eq(x, w));
    }
}

static TABLE: OnceLock<Mutex<FastMap<c_int, Arc<Rsock>>>> = OnceLock::new();

fn table() -> MutexGuard<'static, FastMap<c_int, Arc<Rsock>>> {
    lock(TABLE.get_or_init(|| Mutex::new(FastMap::default())))
}

/// The rsocket numbered `fd`, if there is one.
pub(crate) fn lookup(fd: c_int) -> Option<Arc<Rsock>> {
    TABLE.get().and_then(|t| lock(t).get(&fd).cloned())
}

fn new_sock(sizes: Sizes, nonblock: bool, numbered: bool) -> Result<Arc<Rsock>, c_int> {
    let fd = if numbered {
        // SAFETY: plain syscall with constant flags.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Some(unsafe { OwnedFd::from_raw_fd(fd) })
    } else {
        None
    };
    let rs = Arc::new(Rsock {
        fd,
        st: Mutex::new(Sock {
            sizes,
            nonblock,
            ..Sock::default()
        }),
        accepted: Mutex::new(VecDeque::new()),
        stop: Arc::new(AtomicBool::new(false)),
        events: AtomicU64::new(0),
    });
    if let Some(fd) = &rs.fd {
        table().insert(fd.as_raw_fd(), rs.clone());
    }
    Ok(rs)
}

/// A socket for the preload: not numbered, `nonblock` as asked.
pub(crate) fn new_unnumbered(nonblock: bool) -> Arc<Rsock> {
    new_sock(Sizes::preload(), nonblock, false).expect("an unnumbered socket needs no descriptor")
}

/// The errno of a failed connection setup, as a socket's `connect` reports it.
fn cm_errno(e: &srdma::cm::CmError) -> c_int {
    use srdma::cm::CmError;
    match e {
        CmError::Rejected { .. } => libc::ECONNREFUSED,
        CmError::Timeout => libc::ETIMEDOUT,
        CmError::Unreachable(_) => libc::ENETUNREACH,
        CmError::Verbs(v) => crate::errno_of(v),
        _ => libc::EIO,
    }
}

/// Starts a thread with every asynchronous signal blocked (`srdma::threads::spawn`): the
/// program's signals go to its own threads, as with a kernel socket, which starts none.
pub(crate) fn spawn_quiet(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    srdma::threads::spawn(name, f)
}

// ---------------------------------------------------------------------------------------
// Waiting for a connection.

/// Waits until `test` holds on the connection: without waiting when `nonblock` (EAGAIN),
/// until `deadline` (EAGAIN, as a socket timeout), else spinning, then sleeping on the
/// reactor (module `reactor`). ENOTCONN when the socket is not (or no longer) connected.
fn wait_conn(
    rs: &Rsock,
    nonblock: bool,
    deadline: Option<Instant>,
    test: impl Fn(&Conn) -> bool,
) -> Result<(), c_int> {
    let reactor = loop {
        match rs.reactor() {
            Some(r) => break r,
            None => {
                // A connect under way: wait for it to end.
                if !matches!(lock(&rs.st).state, State::Connecting) {
                    return Err(libc::ENOTCONN);
                }
                if nonblock {
                    return Err(libc::EAGAIN);
                }
                wait::sleep_news(deadline)?;
            }
        }
    };
    let start = Instant::now();
    let spin_until = start + reactor::spin_time();
    let mut sleep: Option<Sleep> = None;
    let mut slept = false;
    loop {
        reactor.progress();
        {
            let st = rs.sock();
            match &st.state {
                State::Connected(c) => {
                    if test(c) {
                        stats::waited(start.elapsed(), slept);
                        return Ok(());
                    }
                }
                _ => return Err(libc::ENOTCONN),
            }
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(libc::EAGAIN);
        }
        if now < spin_until {
            reactor::spin_turn(now - start);
            continue;
        }
        let Some(s) = sleep.as_mut() else {
            // Counted among the sleepers before the next look (the reactor's rule).
            sleep = Some(Sleep::begin());
            continue;
        };
        slept = true;
        if s.may_sleep(std::slice::from_ref(&reactor)) {
            let left = deadline.map_or(reactor::MAX_SLEEP, |d| d.saturating_duration_since(now));
            reactor.sleep(left)?;
        }
        s.again();
    }
}

/// How long waits for a connection took (the preload's report, `SRDMA_RS_REPORT`).
pub(crate) mod stats {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Upper bounds (µs) of the buckets of waits that only spun; the last is open.
    pub(crate) const BOUNDS: [u64; 7] = [2, 5, 10, 20, 50, 100, 200];
    /// Waits that only spun, by duration.
    pub(crate) static SPUN: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
    /// Waits that slept, and their total time (ns).
    pub(crate) static SLEPT: AtomicU64 = AtomicU64::new(0);
    pub(crate) static SLEPT_NS: AtomicU64 = AtomicU64::new(0);

    pub(super) fn waited(d: Duration, slept: bool) {
        if slept {
            SLEPT.fetch_add(1, Ordering::Relaxed);
            SLEPT_NS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        } else {
            let us = d.as_micros() as u64;
            let i = BOUNDS.iter().position(|&b| us < b).unwrap_or(BOUNDS.len());
            SPUN[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `waits=<2:N,<5:N,...,>=200:N slept=N/avg_us`
    pub(crate) fn summary() -> String {
        let mut s = String::from("waits=");
        for (i, c) in SPUN.iter().enumerate() {
            let label = match super::stats::BOUNDS.get(i) {
                Some(b) => format!("<{b}"),
                None => format!(">={}", BOUNDS[BOUNDS.len() - 1]),
            };
            s += &format!("{label}:{},", c.load(Ordering::Relaxed));
        }
        let n = SLEPT.load(Ordering::Relaxed);
        let avg = SLEPT_NS.load(Ordering::Relaxed) / n.max(1) / 1000;
        s += &format!("slept:{n}/{avg}us");
        s
    }
}

// ---------------------------------------------------------------------------------------
// Listening and connecting.

fn listen_loop(
    listener: Arc<Rsock>,
    l: IbListener,
    reactor: Arc<Reactor>,
    port: u16,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) {
        // A closed listener takes nothing more: a REQ for the port stays for the listener
        // the program may open next (iperf3's server listens again after each test; the
        // REQ taken here was accepted and reset, a connection the client saw fail).
        let open = || !stop.load(Ordering::Acquire);
        let req = match l.accept_request_while(Duration::from_millis(200), open) {
            Ok(r) => r,
            Err(_) => continue,
        };
        let (sizes, nonblock, numbered, v6) = {
            let st = listener.sock();
            let v6 = st.local.is_some_and(|a| a.is_ipv6());
            (st.sizes, st.nonblock, listener.fd.is_some(), v6)
        };
        if let Ok(rs) = accept_one(req, &reactor, port, sizes, nonblock, numbered, v6) {
            if stop.load(Ordering::Acquire) {
                close(&rs, Duration::ZERO, false);
                break;
            }
            lock(&listener.accepted).push_back(rs);
            listener.bump();
        }
    }
    l.refuse_waiting();
}

/// An IPv4 address as a socket of the IPv6 family sees it (`::ffff:a.b.c.d`).
fn as_family(a: SocketAddr, v6: bool) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) if v6 => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
        a => a,
    }
}

fn accept_one(
    req: IbRequest,
    reactor: &Arc<Reactor>,
    port: u16,
    sizes: Sizes,
    nonblock: bool,
    numbered: bool,
    v6: bool,
) -> Result<Arc<Rsock>, c_int> {
    let peer_data = req.private_data().to_vec();
    if peer_data.len() < CONN_DATA_LEN || peer_data[0] != 1 {
        let _ = req.reject(srdma::cm::reason::CONSUMER_DEFINED, &[]);
        return Err(libc::EPROTO);
    }
    // The rdma_cm header: the peer's address and port, ours.
    let addrs = req.cma_hdr().map(|h| {
        let ip = |b: [u8; 16]| crate::rdmacm::ip_of(h.ip_version, b);
        (
            as_family(SocketAddr::new(ip(h.src_addr), h.src_port), v6),
            as_family(SocketAddr::new(ip(h.dst_addr), port), v6),
        )
    });
    let parts = match conn::make_parts(reactor, sizes) {
        Ok(p) => p,
        Err(e) => {
            let _ = req.reject(srdma::cm::reason::CONSUMER_DEFINED, &[]);
            return Err(e);
        }
    };
    let opts = ConnectOptions {
        private_data: conn::conn_data(&parts, sizes).to_vec(),
        ack_timeout: 19,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    };
    let qpn = parts.qp.qpn().value();
    let ib = req
        .accept_with(&parts.qp, &opts)
        .map_err(|e| cm_errno(&e))?;
    let conn = Conn::new(parts, ib, sizes, &peer_data).ok_or(libc::EPROTO)?;
    let rs = new_sock(sizes, nonblock, numbered)?;
    {
        let mut st = rs.sock();
        if let Some((peer, local)) = addrs {
            st.peer = Some(peer);
            st.local = Some(local);
        }
        st.state = State::Connected(Box::new(conn));
    }
    reactor.attach(qpn, &rs);
    Ok(rs)
}

/// What a failed background connect calls (see [`ConnectMode::Async`]).
pub(crate) type OnFail = Box<dyn FnOnce(c_int) -> Result<(), c_int> + Send>;

/// How a connect runs.
pub(crate) enum ConnectMode {
    /// Before returning.
    Blocking,
    /// In the background: EINPROGRESS now. If it fails, `on_fail` (if any) runs first with
    /// the errno: Ok means it took the socket over (the preload's fallback to the kernel)
    /// and the socket is done; Err(e) is the error the socket reports instead.
    Async(Option<OnFail>),
}

/// The device, reactor and source port a connect to `dst` uses.
fn connect_route(local: Option<SocketAddr>, dst: SocketAddr) -> Result<(usize, SocketAddr), c_int> {
    let d = match local.map(|a| a.ip()).filter(|ip| !ip.is_unspecified()) {
        Some(ip) => crate::rdmacm::dev_for(ip),
        None => crate::rdmacm::source_device(dst.ip()),
    }
    .ok_or(libc::ENETUNREACH)?;
    let addr = crate::rdmacm::cm_devs()[d].addr;
    // A loopback destination from a device that is not on loopback: this host's device, as
    // rdma_cm resolves it on a host without an RDMA device on `lo`.
    let dst = if dst.ip().is_loopback() && !addr.is_loopback() {
        SocketAddr::new(addr, dst.port())
    } else {
        dst
    };
    Ok((d, dst))
}

fn do_connect(
    rs: &Arc<Rsock>,
    d: usize,
    dst: SocketAddr,
    src_port: u16,
    sizes: Sizes,
    timeout: Duration,
) -> Result<(), c_int> {
    let cm_dev = &crate::rdmacm::cm_devs()[d];
    let reactor = Reactor::for_device(d)?;
    let gsi = cm_dev.context().gsi()?;
    let parts = conn::make_parts(&reactor, sizes)?;
    let opts = ConnectOptions {
        private_data: conn::conn_data(&parts, sizes).to_vec(),
        ack_timeout: 19,
        retry_cnt: 7,
        rnr_retry: 7,
        timeout,
        unlisted_retry: if rs.fd.is_some() {
            Duration::from_secs(1)
        } else {
            // The preload falls back to the kernel at once: no rsocket listens there.
            Duration::ZERO
        },
        ..ConnectOptions::default()
    };
    let qpn = parts.qp.qpn().value();
    let ib =
        ibcm::connect_qp(&gsi, &parts.qp, dst, src_port, false, &opts).map_err(|e| cm_errno(&e))?;
    let peer = ib.remote_private_data().to_vec();
    let conn = Conn::new(parts, ib, sizes, &peer).ok_or(libc::EPROTO)?;
    {
        let mut st = rs.sock();
        if !matches!(st.state, State::Idle | State::Connecting) {
            // Closed meanwhile: the connection goes as a closed one's does.
            drop(st);
            reap(Box::new(move || {
                let _ = conn.ib.disconnect();
                drop(conn);
            }));
            return Err(libc::EBADF);
        }
        let v6 = st.peer.is_some_and(|a| a.is_ipv6());
        st.local = Some(as_family(SocketAddr::new(cm_dev.addr, src_port), v6));
        st.untold = matches!(st.state, State::Connecting);
        st.state = State::Connected(Box::new(conn));
    }
    reactor.attach(qpn, rs);
    CONNECTED.fetch_add(1, Ordering::Relaxed);
    rs.bump();
    Ok(())
}

/// Connections this process made (the preload's report).
pub(crate) static CONNECTED: AtomicU64 = AtomicU64::new(0);

/// Connects `rs` to `dst`; `timeout` bounds the CM exchange.
pub(crate) fn connect(
    rs: &Arc<Rsock>,
    dst: SocketAddr,
    mode: ConnectMode,
    timeout: Duration,
) -> Result<(), c_int> {
    // The peer as the caller named it; the connection itself is made to the IPv4 address
    // an IPv4-mapped one stands for.
    let shown = dst;
    let dst = match dst {
        SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some() => {
            SocketAddr::new(v6.ip().to_ipv4_mapped().expect("checked").into(), v6.port())
        }
        d => d,
    };
    let (local, sizes) = {
        let mut st = rs.sock();
        let st = &mut *st;
        match st.state {
            State::Connected(_) if std::mem::take(&mut st.untold) => return Ok(()),
            State::Connected(_) => return Err(libc::EISCONN),
            State::Connecting => return Err(libc::EALREADY),
            State::Listening => return Err(libc::EISCONN),
            State::Done => return Err(libc::EBADF),
            State::Idle => {}
        }
        st.peer = Some(shown);
        st.err = 0;
        (st.local, st.sizes)
    };
    let (d, dst) = match connect_route(local, dst) {
        Ok(r) => r,
        Err(e) => {
            rs.sock().peer = None;
            return Err(e);
        }
    };
    let src_port = local
        .map(|a| a.port())
        .filter(|&p| p != 0)
        .unwrap_or_else(crate::rdmacm::any_port);
    match mode {
        ConnectMode::Blocking => {
            let r = do_connect(rs, d, dst, src_port, sizes, timeout);
            if let Err(e) = r {
                let mut st = rs.sock();
                st.peer = None;
                st.err = e;
            }
            r
        }
        ConnectMode::Async(on_fail) => {
            rs.sock().state = State::Connecting;
            let me = rs.clone();
            let spawned = spawn_quiet("srdma-rs-conn", move || {
                if let Err(mut e) = do_connect(&me, d, dst, src_port, sizes, timeout) {
                    if let Some(f) = on_fail {
                        match f(e) {
                            Ok(()) => {
                                me.sock().state = State::Done;
                                me.bump();
                                return;
                            }
                            Err(e2) => e = e2,
                        }
                    }
                    let mut st = me.sock();
                    if matches!(st.state, State::Connecting) {
                        st.state = State::Idle;
                        st.err = e;
                    }
                    drop(st);
                    me.bump();
                }
            });
            if spawned.is_err() {
                let mut st = rs.sock();
                st.state = State::Idle;
                st.peer = None;
                return Err(libc::EAGAIN);
            }
            Err(libc::EINPROGRESS)
        }
    }
}

/// Listens on the socket's address (port 0: one is picked): a thread per device takes the
/// connection requests.
pub(crate) fn listen(rs: &Arc<Rsock>) -> Result<(), c_int> {
    let (local, v6only) = {
        let st = rs.sock();
        match st.state {
            State::Listening => return Ok(()),
            State::Idle => {}
            _ => return Err(libc::EINVAL),
        }
        (st.local, st.v6only)
    };
    let local = local.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    let port = if local.port() == 0 {
        crate::rdmacm::any_port()
    } else {
        local.port()
    };
    let devs: Vec<usize> = if local.ip().is_unspecified() {
        (0..crate::rdmacm::cm_devs().len())
            .filter(|&d| {
                let a = crate::rdmacm::cm_devs()[d].addr;
                if local.is_ipv6() {
                    !(v6only && a.is_ipv4())
                } else {
                    a.is_ipv4()
                }
            })
            .collect()
    } else {
        vec![crate::rdmacm::dev_for(local.ip()).ok_or(libc::EADDRNOTAVAIL)?]
    };
    let mut started = Vec::new();
    let mut last = libc::ENODEV;
    for d in devs {
        let ctx = crate::rdmacm::cm_devs()[d].context();
        let r = ctx.gsi().and_then(|g| {
            let reactor = Reactor::for_device(d)?;
            let l = IbListener::bind(&g, port).map_err(|_| libc::EADDRINUSE)?;
            Ok((l, reactor))
        });
        match r {
            Ok(x) => started.push(x),
            Err(e) => last = e,
        }
    }
    if started.is_empty() {
        return Err(last);
    }
    {
        let mut st = rs.sock();
        st.state = State::Listening;
        st.local = Some(SocketAddr::new(local.ip(), port));
    }
    for (l, reactor) in started {
        let (me, stop) = (rs.clone(), rs.stop.clone());
        let _ = spawn_quiet("srdma-rs-listen", move || {
            listen_loop(me, l, reactor, port, stop)
        });
    }
    Ok(())
}

/// An accepted connection, if one waits.
pub(crate) fn try_accept(rs: &Rsock) -> Result<Option<Arc<Rsock>>, c_int> {
    if !matches!(lock(&rs.st).state, State::Listening) {
        return Err(libc::EINVAL);
    }
    Ok(lock(&rs.accepted).pop_front())
}

fn accept(rs: &Rsock) -> Result<Arc<Rsock>, c_int> {
    loop {
        let mut s = Sleep::begin();
        if let Some(n) = try_accept(rs)? {
            return Ok(n);
        }
        if rs.sock().nonblock {
            return Err(libc::EAGAIN);
        }
        wait::sleep_on(&mut s, &[], None)?;
    }
}

// ---------------------------------------------------------------------------------------
// Data.

/// The size of the next transfer of `left` bytes: transfers start at 2 KiB and double up to
/// 64 KiB, so that the first bytes leave early and later ones in large writes.
fn next_xfer(olen: &mut u32, left: usize, max: u32) -> u32 {
    if (*olen as usize) < left {
        let x = *olen;
        if *olen < max {
            *olen <<= 1;
        }
        x
    } else {
        left as u32
    }
}

/// The largest transfer of `rs`'s sends.
fn max_transfer(rs: &Rsock) -> u32 {
    if rs.fd.is_none() {
        PRELOAD_MAX_TRANSFER
    } else {
        MAX_TRANSFER
    }
}

/// Whether a call with `flags` must not wait, and its deadline (the socket's timeout).
fn call_mode(rs: &Rsock, flags: c_int, send: bool) -> (bool, Option<Instant>) {
    let st = rs.sock();
    let t = if send { st.sndtimeo } else { st.rcvtimeo };
    (
        st.nonblock || flags & libc::MSG_DONTWAIT != 0,
        t.map(|t| Instant::now() + t),
    )
}

/// Why a send cannot go on: EPIPE once the socket or its peer shut writing down (the
/// preload raises SIGPIPE for it), ECONNRESET after an error, ENOTCONN if never connected.
fn send_error(st: &Sock) -> c_int {
    match &st.state {
        State::Connected(c) if c.error => libc::ECONNRESET,
        State::Connected(_) => libc::EPIPE,
        State::Connecting => libc::EAGAIN,
        _ => libc::ENOTCONN,
    }
}

/// Sends the mappings `riomap` queued into the peer's table (rs_send_iomaps), before any
/// data that follows them.
fn send_iomaps(rs: &Rsock, nonblock: bool, deadline: Option<Instant>) -> Result<(), c_int> {
    loop {
        {
            let mut st = rs.sock();
            let State::Connected(c) = &mut st.state else {
                return Ok(());
            };
            if c.iomap_queue.is_empty() {
                return Ok(());
            }
            if c.writable && c.can_send() {
                if let Err(e) = c.post_iomap() {
                    c.fail();
                    return Err(e);
                }
                continue;
            }
            if !c.writable {
                return Err(send_error(&st));
            }
        }
        wait_conn(rs, nonblock, deadline, |c| c.can_send() || !c.writable)?;
    }
}

/// Sends the bytes of `src` (a gather list) in order: as many as go without waiting on a
/// non-blocking socket (EAGAIN if none), all of them on a blocking one unless the
/// connection ends first (then what went, or the error if nothing did). The preload's
/// sockets copy into the send ring, which posts them as credits allow ([`send_staged`]).
pub(crate) fn send(rs: &Rsock, src: &[&[u8]], flags: c_int) -> Result<usize, c_int> {
    if rs.fd.is_none() {
        return send_staged(rs, src, flags);
    }
    let total: usize = src.iter().map(|s| s.len()).sum();
    let (nonblock, deadline) = call_mode(rs, flags, true);
    send_iomaps(rs, nonblock, deadline)?;
    let mut done = 0usize;
    let mut olen = OLAP_START;
    let max = max_transfer(rs);
    loop {
        {
            let mut st = rs.sock();
            let err = send_error(&st);
            let State::Connected(c) = &mut st.state else {
                return if done > 0 { Ok(done) } else { Err(err) };
            };
            if !c.writable {
                return if done > 0 { Ok(done) } else { Err(err) };
            }
            while done < total && c.can_send() {
                let most = next_xfer(&mut olen, total - done, max);
                match c.send_data(src, done, most) {
                    Ok(n) => done += n as usize,
                    Err(e) => {
                        c.fail();
                        return if done > 0 { Ok(done) } else { Err(e) };
                    }
                }
            }
            if done == total {
                return Ok(done);
            }
        }
        match wait_conn(rs, nonblock, deadline, |c| c.can_send() || !c.writable) {
            Ok(()) => {}
            Err(_) if done > 0 => return Ok(done),
            Err(e) => return Err(e),
        }
    }
}

/// The preload's send: the bytes go into the send ring as far as it has room (a byte
/// buffer, as TCP's: small writes do not each wait for a credit of the peer's) and out as
/// the credits and the peer's buffers allow, now or when they come (`Conn::flush`). Waits
/// (blocking) or returns EAGAIN / what was taken (non-blocking) while the ring is full.
fn send_staged(rs: &Rsock, src: &[&[u8]], flags: c_int) -> Result<usize, c_int> {
    let total: usize = src.iter().map(|s| s.len()).sum();
    let (nonblock, deadline) = call_mode(rs, flags, true);
    let mut done = 0usize;
    // Room worth taking: what is left, at most the low-water mark (no sliver of a write).
    let want = |done: usize| (total - done).clamp(1, SNDLOWAT as usize) as u32;
    loop {
        {
            let mut st = rs.sock();
            let err = send_error(&st);
            let State::Connected(c) = &mut st.state else {
                return if done > 0 { Ok(done) } else { Err(err) };
            };
            if !c.writable {
                return if done > 0 { Ok(done) } else { Err(err) };
            }
            if total == 0 {
                return Ok(0);
            }
            let room = c.stage_room();
            if room >= want(done) {
                let n = (room as usize).min(total - done) as u32;
                c.stage_bytes(src, done, n);
                done += n as usize;
            }
            // Without the doorbell: the bytes leave at the program's next poll or wait, with
            // every other socket's of that turn of its event loop (a server's replies to
            // many clients in one `sendmmsg`).
            c.defer_posts = true;
            let r = c.flush(PRELOAD_MAX_TRANSFER);
            c.defer_posts = false;
            if let Err(e) = r {
                c.fail();
                return if done > 0 { Ok(done) } else { Err(e) };
            }
            if done == total {
                return Ok(done);
            }
        }
        let need = want(done);
        match wait_conn(rs, nonblock, deadline, |c| {
            c.stage_room() >= need || !c.writable
        }) {
            Ok(()) => {}
            Err(_) if done > 0 => return Ok(done),
            Err(e) => return Err(e),
        }
    }
}

/// `riowrite`: writes `data` at `offset` of what the peer mapped with `riomap`, by plain
/// RDMA WRITEs (the peer's application sees the bytes land; nothing is queued for its
/// `rrecv`). Stops at the first byte no mapping of the peer's covers, as rsocket.c does:
/// what was written before it is the result (0 if nothing).
fn iowrite(rs: &Rsock, data: &[u8], mut offset: u64, flags: c_int) -> Result<usize, c_int> {
    let (nonblock, deadline) = call_mode(rs, flags, true);
    send_iomaps(rs, nonblock, deadline)?;
    let mut done = 0usize;
    let mut olen = OLAP_START;
    while done < data.len() {
        {
            let mut st = rs.sock();
            let err = send_error(&st);
            let State::Connected(c) = &mut st.state else {
                return if done > 0 { Ok(done) } else { Err(err) };
            };
            if !c.writable {
                return if done > 0 { Ok(done) } else { Err(err) };
            }
            if c.can_send() {
                let most = next_xfer(&mut olen, data.len() - done, MAX_TRANSFER);
                match c.iowrite_step(&data[done..], offset, most) {
                    None => return Ok(done),
                    Some(Ok(n)) => {
                        done += n as usize;
                        offset += u64::from(n);
                    }
                    Some(Err(e)) => {
                        c.fail();
                        return if done > 0 { Ok(done) } else { Err(e) };
                    }
                }
                continue;
            }
        }
        match wait_conn(rs, nonblock, deadline, |c| c.can_send() || !c.writable) {
            Ok(()) => {}
            Err(_) if done > 0 => return Ok(done),
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Receives into `out` (a scatter list): what has arrived (waiting for something unless
/// non-blocking), all of it with `MSG_WAITALL`; 0 at the end of the peer's data.
pub(crate) fn recv(rs: &Rsock, out: &mut [&mut [u8]], flags: c_int) -> Result<usize, c_int> {
    let total: usize = out.iter().map(|s| s.len()).sum();
    let (nonblock, deadline) = call_mode(rs, flags, false);
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
    let mut done = 0usize;
    loop {
        {
            let mut st = rs.sock();
            match &mut st.state {
                State::Connected(c) => {
                    if c.have_rdata() && total > done {
                        let n = if done == 0 {
                            c.read_into(out, peek)
                        } else {
                            // MSG_WAITALL's later rounds: into what is left of `out`.
                            let mut rest = skip_into(out, done);
                            c.read_into(&mut rest, false)
                        };
                        done += n;
                        if !peek {
                            c.update_credits();
                        }
                    }
                    if total == 0 || done == total || (done > 0 && !waitall) {
                        return Ok(done);
                    }
                    if !c.readable && !c.have_rdata() {
                        return if done > 0 || !c.error {
                            Ok(done)
                        } else {
                            Err(libc::ECONNRESET)
                        };
                    }
                }
                State::Connecting => {}
                _ => return Err(libc::ENOTCONN),
            }
        }
        match wait_conn(rs, nonblock, deadline, |c| c.have_rdata() || !c.readable) {
            Ok(()) => {}
            Err(_) if done > 0 => return Ok(done),
            Err(e) => return Err(e),
        }
    }
}

/// The parts of `out` past its first `skip` bytes.
fn skip_into<'a>(out: &'a mut [&mut [u8]], mut skip: usize) -> Vec<&'a mut [u8]> {
    let mut v = Vec::new();
    for s in out.iter_mut() {
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        v.push(&mut s[skip..]);
        skip = 0;
    }
    v
}

/// Bytes waiting to be read (FIONREAD).
pub(crate) fn pending(rs: &Rsock) -> usize {
    match &rs.sock().state {
        State::Connected(c) => c.rbytes(),
        _ => 0,
    }
}

/// `shutdown`: SHUT_WR sends the shutdown message (the peer reads the end of the stream),
/// SHUT_RDWR the disconnect message; both wait up to [`LINGER`] for what was sent.
pub(crate) fn shutdown(rs: &Rsock, how: c_int) -> Result<(), c_int> {
    let ctrl = {
        let mut st = rs.sock();
        let State::Connected(c) = &mut st.state else {
            return Err(libc::ENOTCONN);
        };
        if !c.connected {
            match how {
                libc::SHUT_RD => None,
                libc::SHUT_WR | libc::SHUT_RDWR => {
                    c.shut_wr = true;
                    None
                }
                _ => return Err(libc::EINVAL),
            }
        } else {
            match how {
                libc::SHUT_RDWR => {
                    c.readable = false;
                    c.writable = false;
                    c.shut_wr = true;
                    Some(CTRL_DISCONNECT)
                }
                libc::SHUT_WR => {
                    c.writable = false;
                    c.shut_wr = true;
                    Some(if c.readable {
                        CTRL_SHUTDOWN
                    } else {
                        CTRL_DISCONNECT
                    })
                }
                libc::SHUT_RD => {
                    c.readable = false;
                    (!c.writable).then_some(CTRL_DISCONNECT)
                }
                _ => return Err(libc::EINVAL),
            }
        }
    };
    rs.bump();
    if let Some(ctrl) = ctrl {
        send_ctrl(rs, ctrl, Instant::now() + LINGER);
    }
    Ok(())
}

/// Sends control message `ctrl` once a control slot is free, then waits for every send to
/// be acknowledged; both up to `deadline`.
fn send_ctrl(rs: &Rsock, ctrl: u32, deadline: Instant) {
    let _ = wait_conn(rs, false, Some(deadline), |c| {
        c.ctrl_avail() || !c.connected
    });
    if let State::Connected(c) = &mut rs.sock().state {
        c.send_ctrl(ctrl);
    }
    let _ = wait_conn(rs, false, Some(deadline), Conn::all_sends_done);
}

/// Closes the socket: a listener stops (and closes what it accepted and nobody took), a
/// connection sends its disconnect message and waits up to `linger` for what it sent; the
/// CM's disconnect and the freeing follow, on a background thread when `background`.
pub(crate) fn close(rs: &Arc<Rsock>, linger: Duration, background: bool) {
    if let Some(fd) = &rs.fd {
        table().remove(&fd.as_raw_fd());
    }
    rs.stop.store(true, Ordering::Release);
    let (listening, live) = {
        let st = rs.sock();
        (
            matches!(st.state, State::Listening),
            matches!(&st.state, State::Connected(c) if c.connected),
        )
    };
    if listening {
        rs.sock().state = State::Done;
        let waiting: Vec<_> = lock(&rs.accepted).drain(..).collect();
        for w in waiting {
            close(&w, Duration::ZERO, background);
        }
    }
    if live && !linger.is_zero() {
        send_ctrl(rs, CTRL_DISCONNECT, Instant::now() + linger);
    }
    let was = std::mem::replace(&mut rs.sock().state, State::Done);
    if let State::Connected(c) = was {
        let finish = move || {
            if !c.ib.is_disconnected() {
                let _ = c.ib.disconnect();
            }
            drop(c);
        };
        if background {
            reap(Box::new(finish));
        } else {
            finish();
        }
    }
    rs.bump();
}

/// Runs `f` on the reaper thread (the CM's disconnect, which may wait for an absent peer).
fn reap(f: Box<dyn FnOnce() + Send>) {
    type Job = Box<dyn FnOnce() + Send>;
    static TX: OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let _ = spawn_quiet("srdma-rs-reap", move || {
            while let Ok(f) = rx.recv() {
                f();
            }
        });
        Mutex::new(tx)
    });
    let _ = lock(tx).send(f);
}

/// Waits up to `limit` for what every connected socket of the process sent to be
/// acknowledged (at exit: nothing a program wrote before it exits is lost in flight).
pub(crate) fn flush_all(socks: &[Arc<Rsock>], limit: Duration) {
    let deadline = Instant::now() + limit;
    for rs in socks {
        let _ = wait_conn(rs, false, Some(deadline), Conn::all_sends_done);
    }
}

// ---------------------------------------------------------------------------------------
// Readiness.

/// The socket's readiness now, as poll(2) bits (without taking completions: the caller
/// runs the reactors first).
pub(crate) fn readiness(rs: &Rsock) -> i16 {
    // A look changes nothing.
    state_readiness(rs, &lock(&rs.st))
}

/// What state `st` of socket `rs` makes it ready for (see [`readiness`]).
fn state_readiness(rs: &Rsock, st: &Sock) -> i16 {
    match &st.state {
        State::Listening => {
            if lock(&rs.accepted).is_empty() {
                0
            } else {
                libc::POLLIN
            }
        }
        State::Idle => {
            if st.err != 0 {
                libc::POLLOUT | libc::POLLERR | libc::POLLHUP
            } else {
                libc::POLLOUT | libc::POLLHUP
            }
        }
        State::Connecting => 0,
        State::Done => libc::POLLNVAL,
        State::Connected(c) if rs.fd.is_none() => {
            // The preload's sockets, as a kernel TCP socket polls: the peer's close is the
            // end of the stream (IN, RDHUP) and leaves the socket writable (a write fails
            // with EPIPE at once); HUP once both directions are shut, ERR on an error.
            let mut r = 0;
            if c.have_rdata() || !c.readable {
                r |= libc::POLLIN;
            }
            if c.peer_done {
                r |= libc::POLLRDHUP;
            }
            // Writable also when a write would fail at once (EPIPE), as the kernel says.
            if c.shut_wr || !c.connected || (c.writable && c.stage_room() >= SNDLOWAT) {
                r |= libc::POLLOUT;
            }
            if c.error {
                r |= libc::POLLERR | libc::POLLHUP;
            } else if !c.connected && c.shut_wr && c.peer_done && !c.have_rdata() {
                r |= libc::POLLHUP;
            }
            r
        }
        State::Connected(c) => {
            let mut r = 0;
            if c.have_rdata() || !c.readable {
                r |= libc::POLLIN;
            }
            if c.peer_done {
                r |= libc::POLLRDHUP;
            }
            if c.writable && c.can_send() {
                r |= libc::POLLOUT;
            }
            // A hang-up shows once the data that came before it has been read (as a TCP
            // socket reports its peer's close): rsocket.c reports it at once, and rstream -T
            // a, which stops at POLLHUP, then failed one run in three when the peer's
            // disconnect message arrived right behind its last data.
            if !c.connected && !c.have_rdata() {
                r |= if c.error {
                    libc::POLLERR | libc::POLLHUP
                } else {
                    libc::POLLHUP
                };
            }
            r
        }
    }
}

/// Bytes received and not read yet, on a connected socket.
fn received(st: &Sock) -> usize {
    match &st.state {
        State::Connected(c) => c.rbytes(),
        _ => 0,
    }
}

/// Whether the socket is (still) an rsocket of its own: not idle (a preload socket idle
/// has its kernel socket's readiness) and not handed over.
pub(crate) fn is_active(rs: &Rsock) -> bool {
    !matches!(lock(&rs.st).state, State::Idle | State::Done)
}

/// `connect` on a connected socket: 0 the first time after a background connect
/// succeeded (as the kernel's), EISCONN after that.
pub(crate) fn connect_again(rs: &Rsock) -> Result<(), c_int> {
    let mut st = rs.sock();
    if std::mem::take(&mut st.untold) {
        Ok(())
    } else {
        Err(libc::EISCONN)
    }
}

/// Whether a preload socket is done as an rsocket (closed, or handed to the kernel): its
/// kernel socket answers for it now.
pub(crate) fn handed_over(rs: &Rsock) -> bool {
    rs.fd.is_none() && matches!(lock(&rs.st).state, State::Done)
}

/// Whether a connect runs in the background.
pub(crate) fn is_connecting(rs: &Rsock) -> bool {
    matches!(lock(&rs.st).state, State::Connecting)
}

/// Whether the socket listens.
pub(crate) fn is_listening(rs: &Rsock) -> bool {
    matches!(lock(&rs.st).state, State::Listening)
}

/// Whether the socket is connected (or was: the peer may have gone since).
pub(crate) fn is_connected(rs: &Rsock) -> bool {
    matches!(lock(&rs.st).state, State::Connected(_))
}

/// The reactors of `socks`' connections, once each.
pub(crate) fn reactors_of<'a>(
    socks: impl IntoIterator<Item = &'a Arc<Rsock>>,
) -> Vec<Arc<Reactor>> {
    let mut v: Vec<Arc<Reactor>> = Vec::new();
    for rs in socks {
        if let Some(r) = rs.reactor() {
            if !v.iter().any(|x| Arc::ptr_eq(x, &r)) {
                v.push(r);
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------
// Socket state the preload and the C API share.

/// Sets the socket's local address (`bind`): EADDRNOTAVAIL for an address no device has.
pub(crate) fn bind(rs: &Rsock, a: SocketAddr) -> Result<(), c_int> {
    if !a.ip().is_unspecified() && crate::rdmacm::dev_for(a.ip()).is_none() {
        return Err(libc::EADDRNOTAVAIL);
    }
    let mut st = rs.sock();
    if !matches!(st.state, State::Idle) || st.local.is_some() {
        return Err(libc::EINVAL);
    }
    st.local = Some(a);
    Ok(())
}

/// The socket's local (or the peer's) address.
pub(crate) fn name(rs: &Rsock, peer: bool) -> Result<SocketAddr, c_int> {
    let st = rs.sock();
    if peer && !matches!(st.state, State::Connected(_)) {
        return Err(libc::ENOTCONN);
    }
    let a = if peer { st.peer } else { st.local };
    a.ok_or(if peer { libc::ENOTCONN } else { libc::EINVAL })
}

/// Sets `O_NONBLOCK`.
pub(crate) fn set_nonblock(rs: &Rsock, on: bool) {
    rs.sock().nonblock = on;
}

/// Takes `SO_ERROR`.
pub(crate) fn take_error(rs: &Rsock) -> c_int {
    std::mem::take(&mut rs.sock().err)
}

/// Sets an option the preload passes on after the kernel took it: ring sizes, timeouts,
/// `IPV6_V6ONLY`, `TCP_NODELAY`, `SO_KEEPALIVE` (kept).
pub(crate) fn note_option(rs: &Rsock, level: c_int, name: c_int, v: c_int, tv: Option<Duration>) {
    let mut st = rs.sock();
    let before = matches!(st.state, State::Idle);
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if before => {
            st.sizes.sbuf = (v.max(1) as u32)
                .saturating_mul(2)
                .clamp(SNDLOWAT * 4, 1 << 28);
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if before => {
            st.sizes.rbuf = (v.max(1) as u32)
                .saturating_mul(2)
                .clamp(SNDLOWAT * 4, 1 << 28);
        }
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO) => st.rcvtimeo = tv.filter(|t| !t.is_zero()),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO) => st.sndtimeo = tv.filter(|t| !t.is_zero()),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => st.keepalive = v,
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => st.v6only = v != 0,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.nodelay = v,
        _ => {}
    }
}

/// `riomap` on a connected socket (see [`c_iomap`]).
fn iomap(rs: &Rsock, buf: *mut u8, len: usize, prot: c_int, offset: i64) -> Result<i64, c_int> {
    let mut st = rs.sock();
    let State::Connected(c) = &mut st.state else {
        return Err(libc::EINVAL);
    };
    if prot & !libc::PROT_WRITE != 0 {
        return Err(libc::EINVAL);
    }
    let remote = prot & libc::PROT_WRITE != 0;
    let slot = if remote {
        Some(
            c.iomaps
                .iter()
                .position(Option::is_none)
                .ok_or(libc::ENOMEM)?,
        )
    } else {
        None
    };
    let access = if remote {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
    } else {
        AccessFlags::LOCAL_WRITE
    };
    // SAFETY: the caller keeps the range mapped until riounmap or rclose, which drop the
    // region (c_iomap's contract, riomap's).
    let mr = unsafe { c.pd().reg_user_mr(buf, len, buf as u64, access) }
        .map_err(|e| crate::errno_of(&e))?;
    let offset = if offset == -1 { buf as i64 } else { offset };
    let map = IoMap {
        offset: offset as u64,
        mr,
    };
    match slot {
        Some(i) => {
            c.iomaps[i] = Some(map);
            c.iomap_queue.push_back(i);
        }
        None => c.local_maps.push(map),
    }
    Ok(offset)
}

// ---------------------------------------------------------------------------------------
// The C API (called from the exported functions in `abi.rs`).

/// `rsocket`.
pub(crate) fn c_socket(domain: c_int, ty: c_int, protocol: c_int) -> Result<c_int, c_int> {
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EOPNOTSUPP);
    }
    if base != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
        return Err(libc::EOPNOTSUPP);
    }
    let rs = new_sock(Sizes::default(), ty & libc::SOCK_NONBLOCK != 0, true)?;
    Ok(rs.fd.as_ref().map_or(-1, |f| f.as_raw_fd()))
}

fn get(fd: c_int) -> Result<Arc<Rsock>, c_int> {
    lookup(fd).ok_or(libc::EBADF)
}

/// `rbind`.
pub(crate) fn c_bind(fd: c_int, addr: Option<SocketAddr>) -> Result<(), c_int> {
    bind(&*get(fd)?, addr.ok_or(libc::EINVAL)?)
}

/// `rlisten`.
pub(crate) fn c_listen(fd: c_int) -> Result<(), c_int> {
    listen(&get(fd)?)
}

/// `raccept`: the new socket and its peer's address.
pub(crate) fn c_accept(fd: c_int) -> Result<(c_int, Option<SocketAddr>), c_int> {
    let n = accept(&*get(fd)?)?;
    let peer = n.sock().peer;
    Ok((n.fd.as_ref().map_or(-1, |f| f.as_raw_fd()), peer))
}

/// `rconnect`: a blocking socket connects before returning; a non-blocking one returns
/// EINPROGRESS and connects in the background (rsocket.c's behaviour).
pub(crate) fn c_connect(fd: c_int, addr: Option<SocketAddr>) -> Result<(), c_int> {
    let rs = get(fd)?;
    let dst = addr.ok_or(libc::EINVAL)?;
    let mode = if rs.sock().nonblock {
        ConnectMode::Async(None)
    } else {
        ConnectMode::Blocking
    };
    connect(&rs, dst, mode, Duration::from_secs(5))
}

/// `rsend` and friends.
pub(crate) fn c_send(fd: c_int, data: &[&[u8]], flags: c_int) -> Result<usize, c_int> {
    send(&*get(fd)?, data, flags)
}

/// `riowrite`.
pub(crate) fn c_iowrite(fd: c_int, data: &[u8], offset: i64, flags: c_int) -> Result<usize, c_int> {
    let rs = get(fd)?;
    let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
    iowrite(&rs, data, offset, flags)
}

/// `riomap`: registers `len` bytes at `buf` on the connection. With `PROT_WRITE` the peer
/// may `riowrite` into them at `offset` (`-1`: the buffer's address) once the mapping has
/// gone out, which happens on this socket's next send or `riowrite` (as rsocket.c does);
/// with `PROT_NONE` the region is only registered. Not connected, or other protection
/// bits: EINVAL; the peer's table full (or it has none): ENOMEM.
///
/// # Safety
/// `buf..buf + len` stays mapped until `riounmap` of it or `rclose` of the socket.
pub(crate) unsafe fn c_iomap(
    fd: c_int,
    buf: *mut u8,
    len: usize,
    prot: c_int,
    offset: i64,
) -> Result<i64, c_int> {
    iomap(&*get(fd)?, buf, len, prot, offset)
}

/// `riounmap`: drops the mapping of exactly `len` bytes at `buf` (EINVAL if there is none).
/// The peer is not told; its later writes there fail the connection, as with rsocket.c.
pub(crate) fn c_iounmap(fd: c_int, buf: *mut u8, len: usize) -> Result<(), c_int> {
    let rs = get(fd)?;
    let mut st = rs.sock();
    let State::Connected(c) = &mut st.state else {
        return Err(libc::EINVAL);
    };
    let is = |m: &IoMap| m.mr.addr() == buf as u64 && m.mr.len() == len;
    if let Some(i) = c.iomaps.iter().position(|m| m.as_ref().is_some_and(is)) {
        c.iomaps[i] = None;
        c.iomap_queue.retain(|&q| q != i);
        return Ok(());
    }
    let n = c.local_maps.len();
    c.local_maps.retain(|m| !is(m));
    if c.local_maps.len() == n {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// `rrecv` and friends.
pub(crate) fn c_recv(fd: c_int, out: &mut [&mut [u8]], flags: c_int) -> Result<usize, c_int> {
    recv(&*get(fd)?, out, flags)
}

/// `rshutdown`.
pub(crate) fn c_shutdown(fd: c_int, how: c_int) -> Result<(), c_int> {
    shutdown(&*get(fd)?, how)
}

/// `rclose`.
pub(crate) fn c_close(fd: c_int) -> Result<(), c_int> {
    close(&get(fd)?, Duration::from_secs(5), false);
    Ok(())
}

/// `rgetpeername` (peer) and `rgetsockname`.
pub(crate) fn c_name(fd: c_int, peer: bool) -> Result<SocketAddr, c_int> {
    name(&*get(fd)?, peer)
}

/// `rsetsockopt` with an int value (`None`: the option is not one rsockets knows).
pub(crate) fn c_setsockopt(fd: c_int, level: c_int, name: c_int, v: c_int) -> Result<(), c_int> {
    let rs = get(fd)?;
    let mut st = rs.sock();
    // A listener's sizes are its connections' (rsocket.c takes them until the rings exist).
    let before_connect = matches!(st.state, State::Idle | State::Listening);
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) | (libc::SOL_SOCKET, libc::SO_LINGER) => {}
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => st.keepalive = v,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if before_connect => {
            st.sizes.sbuf = (v.max(1) as u32).saturating_mul(2).max(SNDLOWAT * 2);
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if before_connect => {
            st.sizes.rbuf = (v.max(1) as u32).saturating_mul(2).max(SNDLOWAT * 2);
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF | libc::SO_RCVBUF) => {}
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.nodelay = v,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => st.keepidle = v,
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {}
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => st.v6only = v != 0,
        (SOL_RDMA, RDMA_SQSIZE) if before_connect => {
            st.sizes.sq = v.clamp(16, 0xFFFE) as u16;
        }
        (SOL_RDMA, RDMA_RQSIZE) if before_connect => {
            st.sizes.rq = v.clamp(16, 0xFFFE) as u16;
        }
        (SOL_RDMA, RDMA_IOMAPSIZE) if before_connect => {
            // As rsocket.c: through its one-byte encoding (so 300 becomes 256).
            st.sizes.iomap = scale_to_value(value_to_scale(v.max(0) as u32)) as u16;
        }
        (SOL_RDMA, RDMA_INLINE | RDMA_ROUTE) if before_connect => {}
        (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE | RDMA_ROUTE) => {
            return Err(libc::EINVAL);
        }
        _ => return Err(libc::EOPNOTSUPP),
    }
    Ok(())
}

/// `rgetsockopt` of an int option.
pub(crate) fn c_getsockopt(fd: c_int, level: c_int, name: c_int) -> Result<c_int, c_int> {
    let rs = get(fd)?;
    let mut st = rs.sock();
    Ok(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut st.err),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => st.keepalive,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => st.sizes.sbuf as c_int,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => st.sizes.rbuf as c_int,
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => 1,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.nodelay,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => st.keepidle,
        (SOL_RDMA, RDMA_SQSIZE) => c_int::from(st.sizes.sq),
        (SOL_RDMA, RDMA_RQSIZE) => c_int::from(st.sizes.rq),
        (SOL_RDMA, RDMA_INLINE) => 0,
        (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(st.sizes.iomap),
        _ => return Err(libc::EOPNOTSUPP),
    })
}

/// `rfcntl` F_GETFL / F_SETFL (only `O_NONBLOCK` means anything).
pub(crate) fn c_fcntl(fd: c_int, cmd: c_int, arg: c_int) -> Result<c_int, c_int> {
    let rs = get(fd)?;
    let mut st = rs.sock();
    match cmd {
        libc::F_GETFL => Ok(libc::O_RDWR | if st.nonblock { libc::O_NONBLOCK } else { 0 }),
        libc::F_SETFL => {
            st.nonblock = arg & libc::O_NONBLOCK != 0;
            Ok(0)
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// `rpoll`: rsockets and ordinary descriptors together (see [`wait::poll`]).
pub(crate) fn c_poll(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int, c_int> {
    let srcs: Vec<wait::Src> = fds
        .iter()
        .map(|p| lookup(p.fd).map_or(wait::Src::Kernel, wait::Src::Rs))
        .collect();
    let t = (timeout >= 0).then(|| Duration::from_millis(timeout as u64));
    wait::poll(fds, &srcs, t, None)
}
