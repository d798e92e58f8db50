//! `libsrdma_rspreload.so`: what `srdma exec --rsockets PROGRAM` preloads so that an
//! unmodified program's TCP sockets run on srdma's rsockets.
//!
//! This library is only the C library's socket functions under their own names: each one
//! looks at the descriptor it is called for and hands the call either to the C library
//! (found with `dlsym(RTLD_NEXT)`) or, for descriptors srdma marked as its own (an rsocket,
//! an epoll set holding rsockets), to srdma's library, where the sockets live (crate
//! srdma-verbs, module `preload`; the table between the two is `preload/abi.rs` there,
//! compiled into both). srdma's library is loaded on the program's first TCP socket
//! (`socket(AF_INET or AF_INET6, SOCK_STREAM, ...)`), from `$SRDMA_RSPRELOAD_LIB` (which
//! `srdma exec` sets) or as `libibverbs.so.1`; a program that never makes one never loads
//! it. Without srdma's library every call goes to the C library.
//!
//! Why two files: srdma's library is also the program's `libibverbs.so.1` and
//! `librdmacm.so.1`, which must not export `socket` or `read` to every verbs program, and
//! one copy of srdma per process keeps one set of devices, QPs and threads.
//!
//! srdma's own descriptors (its devices' sockets, eventfds, shared-memory rings) live at
//! the top of the descriptor table: a descriptor made by one of srdma's threads, or by a
//! program's thread while it runs srdma's code, is moved to a number from
//! [`relocation_base`] up, so that the program's own descriptors are numbered exactly as
//! without srdma (the lowest free number, where the kernel would have put them).
//!
//! The fortified entry points programs built with `_FORTIFY_SOURCE` call (`__read_chk`,
//! `__recv_chk`, `__recvfrom_chk`, `__poll_chk`, `__ppoll_chk`) check their buffer as the C
//! library does, then go the same way. `fcntl`/`fcntl64` and `ioctl` are variadic in C; their
//! one argument arrives as a named one would (x86-64 and aarch64 Linux), as the C
//! library's own wrappers read it.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_int, c_ulong, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

use libc::{
    epoll_event, fd_set, msghdr, nfds_t, pollfd, sigset_t, sockaddr, socklen_t, timespec, timeval,
};

#[path = "../../srdma-verbs/src/preload/abi.rs"]
mod abi;

use abi::{Hooks, MARK_EPOLL, MARK_RSOCKET, MARKS, Real};

/// The C library's functions this library passes calls to.
struct Pass {
    real: Real,
    accept: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    recv: unsafe extern "C" fn(c_int, *mut c_void, usize, c_int) -> isize,
    send: unsafe extern "C" fn(c_int, *const c_void, usize, c_int) -> isize,
    poll: unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int,
    select:
        unsafe extern "C" fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int,
    pselect: unsafe extern "C" fn(
        c_int,
        *mut fd_set,
        *mut fd_set,
        *mut fd_set,
        *const timespec,
        *const sigset_t,
    ) -> c_int,
    epoll_wait: unsafe extern "C" fn(c_int, *mut epoll_event, c_int, c_int) -> c_int,
    epoll_pwait2: Option<
        unsafe extern "C" fn(
            c_int,
            *mut epoll_event,
            c_int,
            *const timespec,
            *const sigset_t,
        ) -> c_int,
    >,
    fcntl64: unsafe extern "C" fn(c_int, c_int, ...) -> c_int,
    chk_fail: Option<unsafe extern "C" fn() -> !>,
    socketpair: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_int) -> c_int,
    eventfd: unsafe extern "C" fn(libc::c_uint, c_int) -> c_int,
    memfd_create: unsafe extern "C" fn(*const c_char, libc::c_uint) -> c_int,
    pipe: unsafe extern "C" fn(*mut c_int) -> c_int,
    pipe2: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    epoll_create: unsafe extern "C" fn(c_int) -> c_int,
    epoll_create1: unsafe extern "C" fn(c_int) -> c_int,
    open: unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int,
    open64: unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int,
    openat: unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int,
    openat64: unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int,
}

/// The C library's `name` (the next definition after this library).
fn next(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_NEXT and a valid name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The C library's `name`, which every Linux C library has, as function pointer type `F`.
///
/// # Safety
/// `F` is the type of the C library's function of that name.
unsafe fn must<F>(name: &str) -> F {
    let p = next(name).unwrap_or_else(|| missing(name));
    // SAFETY: per the contract, `F` is a function pointer of the symbol's type (the same
    // size as the address dlsym gave).
    unsafe { as_fn(p) }
}

/// The address `p` as function pointer type `F`.
///
/// # Safety
/// `F` is a function pointer type, of the function at `p`.
unsafe fn as_fn<F>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: per the contract.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn missing(name: &str) -> ! {
    let msg = format!("srdma-rspreload: the C library has no {name}\n");
    // SAFETY: writes a live buffer to stderr.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort()
}

fn pass() -> &'static Pass {
    static P: OnceLock<Pass> = OnceLock::new();
    // SAFETY: each field's type is the C library's function of the name it is looked up by.
    P.get_or_init(|| unsafe {
        Pass {
            real: Real {
                socket: must("socket"),
                bind: must("bind"),
                listen: must("listen"),
                accept4: must("accept4"),
                connect: must("connect"),
                close: must("close"),
                dup: must("dup"),
                dup2: must("dup2"),
                dup3: must("dup3"),
                fcntl: must("fcntl"),
                ioctl: must("ioctl"),
                getsockopt: must("getsockopt"),
                setsockopt: must("setsockopt"),
                getsockname: must("getsockname"),
                getpeername: must("getpeername"),
                shutdown: must("shutdown"),
                ppoll: must("ppoll"),
                epoll_ctl: must("epoll_ctl"),
                epoll_pwait: must("epoll_pwait"),
                read: must("read"),
                write: must("write"),
                recvfrom: must("recvfrom"),
                sendto: must("sendto"),
                recvmsg: must("recvmsg"),
                sendmsg: must("sendmsg"),
                readv: must("readv"),
                writev: must("writev"),
                sendfile: must("sendfile"),
            },
            accept: must("accept"),
            recv: must("recv"),
            send: must("send"),
            poll: must("poll"),
            select: must("select"),
            pselect: must("pselect"),
            epoll_wait: must("epoll_wait"),
            epoll_pwait2: next("epoll_pwait2").map(|p| as_fn(p)),
            fcntl64: as_fn(
                next("fcntl64")
                    .or_else(|| next("fcntl"))
                    .unwrap_or_else(|| missing("fcntl")),
            ),
            chk_fail: next("__chk_fail").map(|p| as_fn(p)),
            socketpair: must("socketpair"),
            eventfd: must("eventfd"),
            memfd_create: must("memfd_create"),
            pipe: must("pipe"),
            pipe2: must("pipe2"),
            epoll_create: must("epoll_create"),
            epoll_create1: must("epoll_create1"),
            open: must("open"),
            open64: must("open64"),
            openat: must("openat"),
            openat64: must("openat64"),
        }
    })
}

/// Resolves the C library's functions while the program is still single-threaded.
extern "C" fn preload_init() {
    let _ = pass();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = preload_init;

// ---------------------------------------------------------------------------------------
// srdma's library.

static HOOKS: OnceLock<Hooks> = OnceLock::new();
static MARK: AtomicPtr<AtomicU8> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// This thread is loading srdma's library: its own sockets are the C library's.
    static LOADING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn say(msg: &str) {
    let m = format!("srdma-rspreload: {msg}\n");
    // SAFETY: writes a live buffer to stderr.
    unsafe { libc::write(2, m.as_ptr().cast(), m.len()) };
}

/// Loads srdma's library (once).
fn load() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if LOADING.with(|l| l.get()) {
        return;
    }
    ONCE.call_once(|| {
        LOADING.with(|l| l.set(true));
        let path = std::env::var("SRDMA_RSPRELOAD_LIB").unwrap_or_else(|_| "libibverbs.so.1".into());
        let Ok(c) = CString::new(path.clone()) else {
            return;
        };
        // SAFETY: dlopen of a library path.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        let init = if h.is_null() {
            None
        } else {
            // SAFETY: dlsym on a live handle.
            let p = unsafe { libc::dlsym(h, c"srdma_rspreload_init".as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        match init {
            None => {
                // SAFETY: dlerror returns NULL or a C string.
                let why = unsafe { libc::dlerror() };
                let why = if why.is_null() {
                    String::from("it is not srdma's")
                } else {
                    // SAFETY: a C string from dlerror.
                    unsafe { CStr::from_ptr(why as *const c_char) }
                        .to_string_lossy()
                        .into_owned()
                };
                say(&format!(
                    "cannot use {path} ({why}): sockets stay the kernel's (run the program with `srdma exec --rsockets`)"
                ));
            }
            Some(p) => {
                type Init = unsafe extern "C" fn(u32, *const Real, *mut Hooks) -> *const AtomicU8;
                // SAFETY: srdma's entry has this type (preload/abi.rs, shared).
                let f: Init = unsafe { std::mem::transmute::<*mut c_void, Init>(p) };
                let mut hooks = std::mem::MaybeUninit::<Hooks>::uninit();
                // SAFETY: the real table lives in a static; `hooks` has room for the table.
                let marks = unsafe { f(abi::VERSION, &pass().real, hooks.as_mut_ptr()) };
                if marks.is_null() {
                    say(&format!("{path} is another version of srdma: sockets stay the kernel's"));
                } else {
                    // SAFETY: a non-NULL answer means srdma filled the table.
                    let _ = HOOKS.set(unsafe { hooks.assume_init() });
                    MARK.store(marks.cast_mut(), Ordering::Release);
                }
            }
        }
        LOADING.with(|l| l.set(false));
    });
}

/// The mark srdma gave descriptor `fd` (0: none, or srdma not loaded).
#[inline]
fn marked(fd: c_int) -> u8 {
    let p = MARK.load(Ordering::Acquire);
    if p.is_null() || fd < 0 || fd as usize >= MARKS {
        return 0;
    }
    // SAFETY: srdma's marks are MARKS bytes that live as long as the process.
    unsafe { (*p.add(fd as usize)).load(Ordering::Acquire) }
}

/// srdma's hooks, when `fd` is one of its rsockets.
#[inline]
fn rs(fd: c_int) -> Option<&'static Hooks> {
    if marked(fd) & MARK_RSOCKET != 0 {
        HOOKS.get()
    } else {
        None
    }
}

/// srdma's hooks, when `fd` carries any mark.
#[inline]
fn any(fd: c_int) -> Option<&'static Hooks> {
    if marked(fd) != 0 { HOOKS.get() } else { None }
}

fn chk_fail() -> ! {
    if let Some(f) = pass().chk_fail {
        // SAFETY: glibc's __chk_fail reports the overflow and aborts.
        unsafe { f() }
    }
    std::process::abort()
}

thread_local! {
    /// Calls into srdma's library under way on this thread.
    static IN_SRDMA: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Whether this thread is one of srdma's (named `srdma...`), once asked.
    static SRDMA_THREAD: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f`, a call into srdma's library: descriptors made meanwhile are srdma's.
#[inline]
fn enter<R>(f: impl FnOnce() -> R) -> R {
    IN_SRDMA.with(|c| c.set(c.get() + 1));
    let r = f();
    IN_SRDMA.with(|c| c.set(c.get() - 1));
    r
}

/// Whether a descriptor made now is srdma's own.
fn srdma_made() -> bool {
    if HOOKS.get().is_none() {
        return false;
    }
    if IN_SRDMA.with(|c| c.get()) > 0 {
        return true;
    }
    SRDMA_THREAD.with(|t| {
        if let Some(v) = t.get() {
            return v;
        }
        let mut name = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes into a live buffer.
        let ok = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) } == 0;
        let v = ok && name.starts_with(b"srdma");
        t.set(Some(v));
        v
    })
}

/// Where srdma's descriptors go: 256 below the soft limit on open files (at most 8192,
/// so that the kernel's descriptor table stays small), at least 64.
fn relocation_base() -> c_int {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a live struct.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur.min(8192) as c_int
    } else {
        1024
    };
    (cur - 256).max(cur / 2).max(64)
}

/// Moves srdma's new descriptor `fd` to the top of the table (see the crate docs); the
/// program's stay where the kernel put them.
fn relocate(fd: c_int) -> c_int {
    if fd < 0 || !srdma_made() {
        return fd;
    }
    let p = pass();
    // SAFETY: fcntl and close on the descriptor just made.
    unsafe {
        let cloexec = (p.real.fcntl)(fd, libc::F_GETFD) & libc::FD_CLOEXEC != 0;
        let cmd = if cloexec {
            libc::F_DUPFD_CLOEXEC
        } else {
            libc::F_DUPFD
        };
        let nfd = (p.real.fcntl)(fd, cmd, relocation_base());
        if nfd < 0 {
            return fd;
        }
        (p.real.close)(fd);
        nfd
    }
}

fn ms_to_ts(ms: c_int) -> Option<timespec> {
    (ms >= 0).then(|| timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    })
}

fn ts_ptr(t: &Option<timespec>) -> *const timespec {
    t.as_ref().map_or(std::ptr::null(), |t| t as *const _)
}

// ---------------------------------------------------------------------------------------
// The C library's socket functions.

/// The C library's `socket`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    let tcp = (domain == libc::AF_INET || domain == libc::AF_INET6) && base == libc::SOCK_STREAM;
    if tcp && !LOADING.with(|l| l.get()) && IN_SRDMA.with(|c| c.get()) == 0 {
        load();
        if let Some(h) = HOOKS.get() {
            // SAFETY: as called.
            return enter(|| unsafe { (h.socket)(domain, ty, protocol) });
        }
    }
    // SAFETY: as called.
    relocate(unsafe { (pass().real.socket)(domain, ty, protocol) })
}

/// The C library's `bind`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.bind)(fd, addr, len)),
            None => (pass().real.bind)(fd, addr, len),
        }
    }
}

/// The C library's `listen`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.listen)(fd, backlog)),
            None => (pass().real.listen)(fd, backlog),
        }
    }
}

/// The C library's `accept`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.accept4)(fd, addr, len, 0)),
            None => relocate((pass().accept)(fd, addr, len)),
        }
    }
}

/// The C library's `accept4`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.accept4)(fd, addr, len, flags)),
            None => relocate((pass().real.accept4)(fd, addr, len, flags)),
        }
    }
}

/// The C library's `connect`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.connect)(fd, addr, len)),
            None => (pass().real.connect)(fd, addr, len),
        }
    }
}

/// The C library's `close`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => enter(|| (h.close)(fd)),
            None => (pass().real.close)(fd),
        }
    }
}

/// The C library's `dup`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => enter(|| (h.dup)(fd)),
            None => (pass().real.dup)(fd),
        }
    }
}

/// The C library's `dup2`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, nfd: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd).or_else(|| any(nfd)) {
            Some(h) => enter(|| (h.dup3)(fd, nfd, -1)),
            None => (pass().real.dup2)(fd, nfd),
        }
    }
}

/// The C library's `dup3`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, nfd: c_int, flags: c_int) -> c_int {
    if flags == -1 {
        // Not a flag value dup3 takes (and our hook's dup2 signal).
        // SAFETY: errno slot of this thread.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return -1;
    }
    // SAFETY: as called.
    unsafe {
        match any(fd).or_else(|| any(nfd)) {
            Some(h) => enter(|| (h.dup3)(fd, nfd, flags)),
            None => (pass().real.dup3)(fd, nfd, flags),
        }
    }
}

/// The C library's `fcntl`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => enter(|| (h.fcntl)(fd, cmd, arg)),
            None => (pass().real.fcntl)(fd, cmd, arg),
        }
    }
}

/// The C library's `fcntl64`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => enter(|| (h.fcntl)(fd, cmd, arg)),
            None => (pass().fcntl64)(fd, cmd, arg),
        }
    }
}

/// The C library's `ioctl`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.ioctl)(fd, req, arg)),
            None => (pass().real.ioctl)(fd, req, arg),
        }
    }
}

/// The C library's `getsockopt`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.getsockopt)(fd, level, name, val, len)),
            None => (pass().real.getsockopt)(fd, level, name, val, len),
        }
    }
}

/// The C library's `setsockopt`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.setsockopt)(fd, level, name, val, len)),
            None => (pass().real.setsockopt)(fd, level, name, val, len),
        }
    }
}

/// The C library's `getsockname`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.getsockname)(fd, addr, len)),
            None => (pass().real.getsockname)(fd, addr, len),
        }
    }
}

/// The C library's `getpeername`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.getpeername)(fd, addr, len)),
            None => (pass().real.getpeername)(fd, addr, len),
        }
    }
}

/// The C library's `shutdown`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.shutdown)(fd, how)),
            None => (pass().real.shutdown)(fd, how),
        }
    }
}

/// The C library's `read`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => {
                enter(|| (h.recvfrom)(fd, buf, n, 0, std::ptr::null_mut(), std::ptr::null_mut()))
            }
            None => (pass().real.read)(fd, buf, n),
        }
    }
}

/// The C library's `__read_chk`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, buflen: usize) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as called.
    unsafe { read(fd, buf, n) }
}

/// The C library's `write`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.sendto)(fd, buf, n, 0, std::ptr::null(), 0)),
            None => (pass().real.write)(fd, buf, n),
        }
    }
}

/// The C library's `recv`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| {
                (h.recvfrom)(
                    fd,
                    buf,
                    n,
                    flags,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            }),
            None => (pass().recv)(fd, buf, n, flags),
        }
    }
}

/// The C library's `__recv_chk`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    buflen: usize,
    flags: c_int,
) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as called.
    unsafe { recv(fd, buf, n, flags) }
}

/// The C library's `recvfrom`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.recvfrom)(fd, buf, n, flags, addr, alen)),
            None => (pass().real.recvfrom)(fd, buf, n, flags, addr, alen),
        }
    }
}

/// The C library's `__recvfrom_chk`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    buflen: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as called.
    unsafe { recvfrom(fd, buf, n, flags, addr, alen) }
}

/// The C library's `send`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.sendto)(fd, buf, n, flags, std::ptr::null(), 0)),
            None => (pass().send)(fd, buf, n, flags),
        }
    }
}

/// The C library's `sendto`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.sendto)(fd, buf, n, flags, addr, alen)),
            None => (pass().real.sendto)(fd, buf, n, flags, addr, alen),
        }
    }
}

/// The C library's `recvmsg`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.recvmsg)(fd, msg, flags)),
            None => {
                let n = (pass().real.recvmsg)(fd, msg, flags);
                if n >= 0 && !msg.is_null() && srdma_made() {
                    relocate_rights(msg);
                }
                n
            }
        }
    }
}

/// Moves the descriptors a message brought (`SCM_RIGHTS`) as [`relocate`] does.
///
/// # Safety
/// `msg` is a msghdr recvmsg just filled.
unsafe fn relocate_rights(msg: *mut msghdr) {
    // SAFETY: walking the control messages recvmsg wrote, with the C library's macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let n = ((*c).cmsg_len as usize - (data as usize - c as usize))
                    / std::mem::size_of::<c_int>();
                for i in 0..n {
                    let fd = data.add(i).read_unaligned();
                    data.add(i).write_unaligned(relocate(fd));
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
}

/// The C library's `sendmsg`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.sendmsg)(fd, msg, flags)),
            None => (pass().real.sendmsg)(fd, msg, flags),
        }
    }
}

/// The C library's `readv`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.rwv)(fd, iov, cnt, false)),
            None => (pass().real.readv)(fd, iov, cnt),
        }
    }
}

/// The C library's `writev`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => enter(|| (h.rwv)(fd, iov, cnt, true)),
            None => (pass().real.writev)(fd, iov, cnt),
        }
    }
}

/// The C library's `sendfile`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, input: c_int, off: *mut i64, n: usize) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(out) {
            Some(h) => enter(|| (h.sendfile)(out, input, off, n)),
            None => (pass().real.sendfile)(out, input, off, n),
        }
    }
}

/// The C library's `sendfile64`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(out: c_int, input: c_int, off: *mut i64, n: usize) -> isize {
    // SAFETY: as called (off_t is off64_t on 64-bit Linux).
    unsafe { sendfile(out, input, off, n) }
}

/// Whether any descriptor of `fds` is srdma's.
///
/// # Safety
/// `fds` NULL or valid for `n` pollfds.
unsafe fn any_poll(fds: *const pollfd, n: nfds_t) -> bool {
    if fds.is_null() || MARK.load(Ordering::Relaxed).is_null() {
        return false;
    }
    // SAFETY: per the contract.
    let all = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    all.iter().any(|p| marked(p.fd) != 0)
}

/// The C library's `poll`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        if any_poll(fds, n) {
            if let Some(h) = HOOKS.get() {
                let ts = ms_to_ts(timeout);
                return enter(|| (h.ppoll)(fds, n, ts_ptr(&ts), std::ptr::null()));
            }
        }
        (pass().poll)(fds, n, timeout)
    }
}

/// The C library's `__poll_chk`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: usize,
) -> c_int {
    if fdslen / std::mem::size_of::<pollfd>() < n as usize {
        chk_fail();
    }
    // SAFETY: as called.
    unsafe { poll(fds, n, timeout) }
}

/// The C library's `ppoll`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match HOOKS.get() {
            Some(h) if any_poll(fds, n) => enter(|| (h.ppoll)(fds, n, ts, mask)),
            _ => (pass().real.ppoll)(fds, n, ts, mask),
        }
    }
}

/// The C library's `__ppoll_chk`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
    fdslen: usize,
) -> c_int {
    if fdslen / std::mem::size_of::<pollfd>() < n as usize {
        chk_fail();
    }
    // SAFETY: as called.
    unsafe { ppoll(fds, n, ts, mask) }
}

/// Whether any descriptor in the sets is srdma's.
///
/// # Safety
/// Each set NULL or valid.
unsafe fn any_select(n: c_int, sets: [*mut fd_set; 3]) -> bool {
    if MARK.load(Ordering::Relaxed).is_null() {
        return false;
    }
    (0..n.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
        marked(fd) != 0
            // SAFETY: per the contract.
            && sets.iter().any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) })
    })
}

/// The C library's `select`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn select(
    n: c_int,
    rd: *mut fd_set,
    wr: *mut fd_set,
    ex: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        if any_select(n, [rd, wr, ex]) {
            if let Some(h) = HOOKS.get() {
                let mut ts = (!tv.is_null()).then(|| {
                    let t = tv.read_unaligned();
                    timespec {
                        tv_sec: t.tv_sec,
                        tv_nsec: (t.tv_usec * 1000) as libc::c_long,
                    }
                });
                let p = ts.as_mut().map_or(std::ptr::null_mut(), |t| t as *mut _);
                let r = enter(|| (h.pselect)(n, rd, wr, ex, p, std::ptr::null(), true));
                if let Some(t) = ts {
                    tv.write_unaligned(timeval {
                        tv_sec: t.tv_sec,
                        tv_usec: (t.tv_nsec / 1000) as libc::suseconds_t,
                    });
                }
                return r;
            }
        }
        (pass().select)(n, rd, wr, ex, tv)
    }
}

/// The C library's `pselect`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pselect(
    n: c_int,
    rd: *mut fd_set,
    wr: *mut fd_set,
    ex: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        if any_select(n, [rd, wr, ex]) {
            if let Some(h) = HOOKS.get() {
                let mut t = (!ts.is_null()).then(|| ts.read_unaligned());
                let p = t.as_mut().map_or(std::ptr::null_mut(), |t| t as *mut _);
                return enter(|| (h.pselect)(n, rd, wr, ex, p, mask, false));
            }
        }
        (pass().pselect)(n, rd, wr, ex, ts, mask)
    }
}

/// The C library's `epoll_ctl`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        if marked(fd) & MARK_RSOCKET != 0 || marked(epfd) & MARK_EPOLL != 0 {
            if let Some(h) = HOOKS.get() {
                return enter(|| (h.epoll_ctl)(epfd, op, fd, ev));
            }
        }
        (pass().real.epoll_ctl)(epfd, op, fd, ev)
    }
}

/// srdma's hooks, when `epfd` is an epoll set holding rsockets.
fn epoll_set(epfd: c_int) -> Option<&'static Hooks> {
    if marked(epfd) & MARK_EPOLL != 0 {
        HOOKS.get()
    } else {
        None
    }
}

/// The C library's `epoll_wait`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match epoll_set(epfd) {
            Some(h) => {
                let ts = ms_to_ts(timeout);
                enter(|| (h.epoll_pwait2)(epfd, ev, max, ts_ptr(&ts), std::ptr::null()))
            }
            None => (pass().epoll_wait)(epfd, ev, max, timeout),
        }
    }
}

/// The C library's `epoll_pwait`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match epoll_set(epfd) {
            Some(h) => {
                let ts = ms_to_ts(timeout);
                enter(|| (h.epoll_pwait2)(epfd, ev, max, ts_ptr(&ts), mask))
            }
            None => (pass().real.epoll_pwait)(epfd, ev, max, timeout, mask),
        }
    }
}

/// The C library's `epoll_pwait2`: srdma's for its descriptors, the C library's for the rest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: as called.
    unsafe {
        match (epoll_set(epfd), pass().epoll_pwait2) {
            (Some(h), _) => enter(|| (h.epoll_pwait2)(epfd, ev, max, ts, mask)),
            (None, Some(f)) => f(epfd, ev, max, ts, mask),
            (None, None) => {
                *libc::__errno_location() = libc::ENOSYS;
                -1
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// What makes descriptors: srdma's go to the top of the table (see the crate docs).

/// `socketpair(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socketpair(d: c_int, t: c_int, p: c_int, sv: *mut c_int) -> c_int {
    // SAFETY: as called.
    let r = unsafe { (pass().socketpair)(d, t, p, sv) };
    if r == 0 && !sv.is_null() {
        // SAFETY: the two descriptors socketpair wrote.
        unsafe {
            *sv = relocate(*sv);
            *sv.add(1) = relocate(*sv.add(1));
        }
    }
    r
}

/// `eventfd(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eventfd(init: libc::c_uint, flags: c_int) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().eventfd)(init, flags) })
}

/// `memfd_create(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memfd_create(name: *const c_char, flags: libc::c_uint) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().memfd_create)(name, flags) })
}

/// `pipe(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    // SAFETY: as called.
    let r = unsafe { (pass().pipe)(fds) };
    if r == 0 && !fds.is_null() {
        // SAFETY: the two descriptors pipe wrote.
        unsafe {
            *fds = relocate(*fds);
            *fds.add(1) = relocate(*fds.add(1));
        }
    }
    r
}

/// `pipe2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    // SAFETY: as called.
    let r = unsafe { (pass().pipe2)(fds, flags) };
    if r == 0 && !fds.is_null() {
        // SAFETY: the two descriptors pipe2 wrote.
        unsafe {
            *fds = relocate(*fds);
            *fds.add(1) = relocate(*fds.add(1));
        }
    }
    r
}

/// `epoll_create(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().epoll_create)(size) })
}

/// `epoll_create1(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().epoll_create1)(flags) })
}

/// `open(2)` (its mode arrives as a named argument would).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::c_uint) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().open)(path, flags, mode) })
}

/// `open64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::c_uint) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().open64)(path, flags, mode) })
}

/// `openat(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::c_uint,
) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().openat)(dir, path, flags, mode) })
}

/// `openat64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::c_uint,
) -> c_int {
    // SAFETY: as called.
    relocate(unsafe { (pass().openat64)(dir, path, flags, mode) })
}
