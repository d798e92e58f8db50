//! `srdma exec --rsockets`: unmodified socket programs on rsockets.
//!
//! `libsrdma_rspreload.so` (crate srdma-rspreload), preloaded into the program, exports the
//! C library's socket functions and loads this library on the first TCP socket; from then
//! on, calls on the descriptors marked here come to the functions of this module (the
//! table in [`abi`]), every other call goes straight to the C library.
//!
//! # Descriptors
//!
//! A TCP socket (`AF_INET`/`AF_INET6`, `SOCK_STREAM`) is a kernel socket made by the C
//! library, whose number the program gets as it would without srdma (the lowest free one),
//! and an rsocket beside it. The kernel socket is bound and listens as the program asks
//! (so the kernel's rules and errors for addresses and ports hold, `bind` to port 0 gets
//! the kernel's port, and a listener also accepts clients that are not on rsockets) and
//! takes the options the program sets (so `getsockopt` answers as the kernel would); an
//! accepted rsocket gets a fresh kernel socket for its number. Where rsockets cannot carry
//! a socket it stays the kernel's: an address no srdma device has, a connect to a peer
//! that no rsocket listens for (the CM's reject, or no answer within
//! `SRDMA_RS_CONNECT_MS`, default 2000 ms: the kernel socket connects then, so the program
//! sees the kernel's result and errno), and every other family and type (UDP, Unix
//! sockets) from the start. `dup`, `dup2`, `dup3` and `F_DUPFD` share the socket between
//! numbers as the kernel shares a file; it closes with the last.
//!
//! # Blocking and readiness
//!
//! `O_NONBLOCK` (`fcntl`, `ioctl(FIONBIO)`, `SOCK_NONBLOCK`) and `MSG_DONTWAIT` make calls
//! return EAGAIN as the kernel's; a non-blocking `connect` returns EINPROGRESS, the socket
//! polls writable when it is done and `SO_ERROR` tells how it went. `poll`, `ppoll`,
//! `select`, `pselect` and the epoll calls take rsockets and kernel descriptors together:
//! an epoll set holding rsockets keeps them here (level-triggered, `EPOLLET`,
//! `EPOLLONESHOT`) and its kernel descriptors in the kernel's set, and a wait looks at
//! both ([`crate::rsocket::wait`]). `SO_RCVTIMEO`/`SO_SNDTIMEO` bound blocking calls. A
//! send on a connection the peer has closed is EPIPE and raises SIGPIPE unless
//! `MSG_NOSIGNAL`. A signal ends a sleeping `poll`, `select` or `epoll_wait` with EINTR;
//! a blocking receive or send keeps waiting (as under `SA_RESTART`).
//!
//! # fork and exit
//!
//! A child of `fork` inherits descriptors, not connections (the QPs, their memory and the
//! threads that drive them are the parent's): in it the inherited rsockets fail with
//! ENOTCONN and close quietly, and if the parent had opened srdma's devices its new
//! sockets are the kernel's. (Redis's background save child only closes its listeners.) A
//! program that `exec`s another keeps the kernel sockets it did not mark close-on-exec,
//! unconnected. At exit, what the process sent is given up to two seconds to be
//! acknowledged, so that nothing written before `exit` is lost in flight.

pub(crate) mod abi;
mod epoll;
mod hooks;

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::rsocket::{self, Rsock, lock};
use abi::{Hooks, MARK_RSOCKET, MARKS, Real, VERSION};
use srdma::fasthash::FastMap;

/// A TCP socket of the program's that is (also) an rsocket.
pub(crate) struct Entry {
    rs: Arc<Rsock>,
    /// `AF_INET` or `AF_INET6`: how its addresses are shown.
    family: c_int,
    /// Descriptor numbers naming it (`dup`).
    fds: Mutex<Vec<c_int>>,
    /// Handed to the kernel: calls on it go to the kernel socket from now on.
    kernel: AtomicBool,
    /// The process that made it: in a child of `fork` it is the parent's, not to be used.
    pid: u32,
}

impl Entry {
    fn v6(&self) -> bool {
        self.family == libc::AF_INET6
    }

    /// Made by this process (not inherited through `fork`).
    fn ours(&self) -> bool {
        self.pid == PID.load(Ordering::Acquire)
    }
}

/// One byte per descriptor number (see [`abi`]).
static MARK: [AtomicU8; MARKS] = [const { AtomicU8::new(0) }; MARKS];

/// The entries by descriptor number, under a lock that `fork` takes and gives back in both
/// processes (so a child never finds it held by a thread it does not have).
struct Table {
    lock: UnsafeCell<libc::pthread_mutex_t>,
    map: UnsafeCell<Option<FastMap<c_int, Arc<Entry>>>>,
}

// SAFETY: `map` is only touched with `lock` held (`with_table`); the mutex is a pthread
// mutex, made for sharing between threads.
unsafe impl Sync for Table {}

static TABLE: Table = Table {
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    map: UnsafeCell::new(None),
};

/// Runs `f` on the table with its lock held (`f` must not call out of this module).
fn with_table<R>(f: impl FnOnce(&mut FastMap<c_int, Arc<Entry>>) -> R) -> R {
    // SAFETY: a static pthread mutex, locked and unlocked by this thread around `f`.
    unsafe { libc::pthread_mutex_lock(TABLE.lock.get()) };
    // SAFETY: the lock is held: this is the only reference to the map.
    let map = unsafe { &mut *TABLE.map.get() };
    let r = f(map.get_or_insert_with(FastMap::default));
    // SAFETY: as above.
    unsafe { libc::pthread_mutex_unlock(TABLE.lock.get()) };
    r
}

static REAL: OnceLock<&'static Real> = OnceLock::new();

/// The C library's functions.
fn real() -> &'static Real {
    REAL.get().expect("srdma_rspreload_init ran")
}

/// This process's id (set again in a child of `fork`).
static PID: AtomicU32 = AtomicU32::new(0);
/// Whether srdma's devices may be open in this process (set before their first use): its
/// children of `fork` then keep their new sockets in the kernel.
static ENGINE: AtomicBool = AtomicBool::new(false);
/// This is a child of `fork` of a process that had srdma's devices open.
static CHILD: AtomicBool = AtomicBool::new(false);

fn mark(fd: c_int, m: u8) {
    if let Some(x) = usize::try_from(fd).ok().and_then(|i| MARK.get(i)) {
        x.store(m, Ordering::Release);
    }
}

fn marked(fd: c_int) -> u8 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| MARK.get(i))
        .map_or(0, |x| x.load(Ordering::Acquire))
}

/// The rsocket entry behind `fd`, unless it was handed to the kernel.
pub(crate) fn entry(fd: c_int) -> Option<Arc<Entry>> {
    if marked(fd) & MARK_RSOCKET == 0 {
        return None;
    }
    let e = with_table(|m| m.get(&fd).cloned())?;
    (!e.kernel.load(Ordering::Acquire)).then_some(e)
}

fn insert(fd: c_int, e: &Arc<Entry>) {
    lock(&e.fds).push(fd);
    with_table(|m| m.insert(fd, e.clone()));
    mark(fd, marked(fd) | MARK_RSOCKET);
}

/// Takes `fd`'s name off its entry; the entry if that was its last name.
fn remove(fd: c_int) -> Option<Arc<Entry>> {
    mark(fd, marked(fd) & !MARK_RSOCKET);
    let e = with_table(|m| m.remove(&fd))?;
    let mut fds = lock(&e.fds);
    fds.retain(|&f| f != fd);
    let last = fds.is_empty();
    drop(fds);
    last.then_some(e)
}

/// Gives the socket to the kernel: its names go unmarked, its epoll memberships move into
/// the kernel's sets, the rsocket closes.
fn to_kernel(e: &Arc<Entry>) {
    if e.kernel.swap(true, Ordering::AcqRel) {
        return;
    }
    COUNTS.to_kernel.fetch_add(1, Ordering::Relaxed);
    let fds = lock(&e.fds).clone();
    for fd in &fds {
        mark(*fd, marked(*fd) & !MARK_RSOCKET);
    }
    epoll::to_kernel(e);
    with_table(|m| {
        for fd in &fds {
            if m.get(fd).is_some_and(|x| Arc::ptr_eq(x, e)) {
                m.remove(fd);
            }
        }
    });
    rsocket::close(&e.rs, Duration::ZERO, true);
}

/// Lets go of an entry whose last name closed.
fn release(e: Arc<Entry>) {
    if !e.ours() {
        // The parent's connection: nothing of it may be touched here.
        std::mem::forget(e);
        return;
    }
    epoll::forget(&e);
    if !e.kernel.load(Ordering::Acquire) {
        rsocket::close(&e.rs, LINGER, true);
    }
}

/// How long closing a connection waits for what it sent to be acknowledged.
const LINGER: Duration = Duration::from_secs(2);

/// How long a connect tries the CM before it gives the socket to the kernel.
fn connect_timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        Duration::from_millis(
            std::env::var("SRDMA_RS_CONNECT_MS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(2000),
        )
    })
}

/// `a` as a socket of `e`'s family shows it.
fn shown(e: &Entry, a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) if e.v6() => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
        SocketAddr::V6(v6) if !e.v6() => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        a => a,
    }
}

extern "C" fn at_fork_prepare() {
    // SAFETY: the table's static mutex, given back in both processes below.
    unsafe { libc::pthread_mutex_lock(TABLE.lock.get()) };
}

extern "C" fn at_fork_parent() {
    // SAFETY: taken in at_fork_prepare by this thread.
    unsafe { libc::pthread_mutex_unlock(TABLE.lock.get()) };
}

extern "C" fn at_fork_child() {
    // SAFETY: taken in at_fork_prepare by the thread this one copies.
    unsafe { libc::pthread_mutex_unlock(TABLE.lock.get()) };
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
    if ENGINE.load(Ordering::Acquire) {
        CHILD.store(true, Ordering::Release);
    }
}

/// What the process did, for `SRDMA_RS_REPORT`.
pub(crate) struct Counts {
    pub(crate) accepted: AtomicU64,
    /// Sockets handed to the kernel (an address or family no device has, a listener that
    /// could not listen on rsockets, a connect that fell back).
    pub(crate) to_kernel: AtomicU64,
    /// Connects that fell back to the kernel (no rsocket peer there).
    pub(crate) fallbacks: AtomicU64,
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
}

pub(crate) static COUNTS: Counts = Counts {
    accepted: AtomicU64::new(0),
    to_kernel: AtomicU64::new(0),
    fallbacks: AtomicU64::new(0),
    sent: AtomicU64::new(0),
    received: AtomicU64::new(0),
};

/// `SRDMA_RS_REPORT=FILE` (or `-` for stderr): at exit, one line of what the process did
/// on rsockets (connections made and accepted, connects that fell back to the kernel, all
/// sockets handed to the kernel, bytes), so a test or a user can tell RDMA carried the
/// traffic.
fn report() {
    let Some(to) = std::env::var_os("SRDMA_RS_REPORT").filter(|v| !v.is_empty()) else {
        return;
    };
    let prog = std::env::args().next().unwrap_or_default();
    let c = &COUNTS;
    let line = format!(
        "srdma-rspreload: pid={} prog={} connected={} accepted={} fallbacks={} to_kernel={} sent={} received={} {}\n",
        PID.load(Ordering::Acquire),
        prog,
        rsocket::CONNECTED.load(Ordering::Relaxed),
        c.accepted.load(Ordering::Relaxed),
        c.fallbacks.load(Ordering::Relaxed),
        c.to_kernel.load(Ordering::Relaxed),
        c.sent.load(Ordering::Relaxed),
        c.received.load(Ordering::Relaxed),
        rsocket::stats::summary(),
    );
    if to == "-" {
        eprint!("{line}");
    } else {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&to)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

extern "C" fn at_exit() {
    if CHILD.load(Ordering::Acquire) {
        return;
    }
    report();
    let pid = PID.load(Ordering::Acquire);
    let socks: Vec<Arc<Rsock>> = with_table(|m| {
        m.values()
            .filter(|e| e.pid == pid)
            .map(|e| e.rs.clone())
            .collect()
    });
    rsocket::flush_all(&socks, Duration::from_secs(2));
}

/// Called once by the preload library: takes the C library's functions, fills in the hooks
/// and returns the marks (one byte per descriptor number below [`MARKS`]); NULL when the
/// versions differ.
///
/// # Safety
/// `real_fns` points to a table that lives as long as the process; `hooks` to one to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn srdma_rspreload_init(
    version: u32,
    real_fns: *const Real,
    hooks: *mut Hooks,
) -> *const AtomicU8 {
    crate::guard(std::ptr::null(), || {
        if version != VERSION || real_fns.is_null() || hooks.is_null() {
            return std::ptr::null();
        }
        // SAFETY: per the contract, the table lives as long as the process.
        let r = unsafe { &*real_fns };
        let _ = REAL.set(r);
        rsocket::wait::use_ppoll(r.ppoll);
        // SAFETY: getpid has no preconditions.
        PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
        // SAFETY: per the contract, `hooks` is valid for a write.
        unsafe { hooks.write(hooks::table()) };
        // SAFETY: registering plain extern "C" functions.
        unsafe {
            libc::pthread_atfork(
                Some(at_fork_prepare),
                Some(at_fork_parent),
                Some(at_fork_child),
            );
            libc::atexit(at_exit);
        }
        MARK.as_ptr()
    })
}

/// The calling thread's errno.
fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets errno and returns -1 (as the C functions do).
fn fail<T: From<i8>>(e: c_int) -> T {
    crate::set_errno(e);
    T::from(-1)
}
