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
}

/// The C library's `name` (the next definition after this library).
fn next(name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: dlsym with RTLD_NEXT and a valid name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The C library's `name`, which every Linux C library has.
macro_rules! must {
    ($name:literal) => {{
        match next($name) {
            // SAFETY: the C library's function of that name has the declared type.
            Some(p) => unsafe { std::mem::transmute::<*mut c_void, _>(p) },
            None => missing($name),
        }
    }};
}

fn missing(name: &str) -> ! {
    let msg = format!("srdma-rspreload: the C library has no {name}\n");
    // SAFETY: writes a live buffer to stderr.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort()
}

fn pass() -> &'static Pass {
    static P: OnceLock<Pass> = OnceLock::new();
    P.get_or_init(|| Pass {
        real: Real {
            socket: must!("socket"),
            bind: must!("bind"),
            listen: must!("listen"),
            accept4: must!("accept4"),
            connect: must!("connect"),
            close: must!("close"),
            dup: must!("dup"),
            dup2: must!("dup2"),
            dup3: must!("dup3"),
            fcntl: must!("fcntl"),
            ioctl: must!("ioctl"),
            getsockopt: must!("getsockopt"),
            setsockopt: must!("setsockopt"),
            getsockname: must!("getsockname"),
            getpeername: must!("getpeername"),
            shutdown: must!("shutdown"),
            ppoll: must!("ppoll"),
            epoll_ctl: must!("epoll_ctl"),
            epoll_pwait: must!("epoll_pwait"),
            read: must!("read"),
            write: must!("write"),
            recvfrom: must!("recvfrom"),
            sendto: must!("sendto"),
            recvmsg: must!("recvmsg"),
            sendmsg: must!("sendmsg"),
            readv: must!("readv"),
            writev: must!("writev"),
            sendfile: must!("sendfile"),
        },
        accept: must!("accept"),
        recv: must!("recv"),
        send: must!("send"),
        poll: must!("poll"),
        select: must!("select"),
        pselect: must!("pselect"),
        epoll_wait: must!("epoll_wait"),
        // SAFETY: the C library's function of that name has the declared type.
        epoll_pwait2: next("epoll_pwait2").map(|p| unsafe { std::mem::transmute(p) }),
        fcntl64: next("fcntl64").map_or_else(
            // SAFETY: fcntl has the same type.
            || unsafe {
                std::mem::transmute::<*mut c_void, _>(
                    next("fcntl").unwrap_or_else(|| missing("fcntl")),
                )
            },
            // SAFETY: the C library's function of that name has the declared type.
            |p| unsafe { std::mem::transmute(p) },
        ),
        // SAFETY: the C library's function of that name has the declared type.
        chk_fail: next("__chk_fail").map(|p| unsafe { std::mem::transmute(p) }),
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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    let tcp = (domain == libc::AF_INET || domain == libc::AF_INET6) && base == libc::SOCK_STREAM;
    if tcp && !LOADING.with(|l| l.get()) {
        load();
        if let Some(h) = HOOKS.get() {
            // SAFETY: as called.
            return unsafe { (h.socket)(domain, ty, protocol) };
        }
    }
    // SAFETY: as called.
    unsafe { (pass().real.socket)(domain, ty, protocol) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.bind)(fd, addr, len),
            None => (pass().real.bind)(fd, addr, len),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.listen)(fd, backlog),
            None => (pass().real.listen)(fd, backlog),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.accept4)(fd, addr, len, 0),
            None => (pass().accept)(fd, addr, len),
        }
    }
}

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
            Some(h) => (h.accept4)(fd, addr, len, flags),
            None => (pass().real.accept4)(fd, addr, len, flags),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.connect)(fd, addr, len),
            None => (pass().real.connect)(fd, addr, len),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => (h.close)(fd),
            None => (pass().real.close)(fd),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => (h.dup)(fd),
            None => (pass().real.dup)(fd),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, nfd: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd).or_else(|| any(nfd)) {
            Some(h) => (h.dup3)(fd, nfd, -1),
            None => (pass().real.dup2)(fd, nfd),
        }
    }
}

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
            Some(h) => (h.dup3)(fd, nfd, flags),
            None => (pass().real.dup3)(fd, nfd, flags),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => (h.fcntl)(fd, cmd, arg),
            None => (pass().real.fcntl)(fd, cmd, arg),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as called.
    unsafe {
        match any(fd) {
            Some(h) => (h.fcntl)(fd, cmd, arg),
            None => (pass().fcntl64)(fd, cmd, arg),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.ioctl)(fd, req, arg),
            None => (pass().real.ioctl)(fd, req, arg),
        }
    }
}

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
            Some(h) => (h.getsockopt)(fd, level, name, val, len),
            None => (pass().real.getsockopt)(fd, level, name, val, len),
        }
    }
}

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
            Some(h) => (h.setsockopt)(fd, level, name, val, len),
            None => (pass().real.setsockopt)(fd, level, name, val, len),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.getsockname)(fd, addr, len),
            None => (pass().real.getsockname)(fd, addr, len),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.getpeername)(fd, addr, len),
            None => (pass().real.getpeername)(fd, addr, len),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.shutdown)(fd, how),
            None => (pass().real.shutdown)(fd, how),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.recvfrom)(fd, buf, n, 0, std::ptr::null_mut(), std::ptr::null_mut()),
            None => (pass().real.read)(fd, buf, n),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, buflen: usize) -> isize {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: as called.
    unsafe { read(fd, buf, n) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.sendto)(fd, buf, n, 0, std::ptr::null(), 0),
            None => (pass().real.write)(fd, buf, n),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: usize, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.recvfrom)(
                fd,
                buf,
                n,
                flags,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
            None => (pass().recv)(fd, buf, n, flags),
        }
    }
}

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
            Some(h) => (h.recvfrom)(fd, buf, n, flags, addr, alen),
            None => (pass().real.recvfrom)(fd, buf, n, flags, addr, alen),
        }
    }
}

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: usize, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.sendto)(fd, buf, n, flags, std::ptr::null(), 0),
            None => (pass().send)(fd, buf, n, flags),
        }
    }
}

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
            Some(h) => (h.sendto)(fd, buf, n, flags, addr, alen),
            None => (pass().real.sendto)(fd, buf, n, flags, addr, alen),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.recvmsg)(fd, msg, flags),
            None => (pass().real.recvmsg)(fd, msg, flags),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.sendmsg)(fd, msg, flags),
            None => (pass().real.sendmsg)(fd, msg, flags),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.rwv)(fd, iov, cnt, false),
            None => (pass().real.readv)(fd, iov, cnt),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(fd) {
            Some(h) => (h.rwv)(fd, iov, cnt, true),
            None => (pass().real.writev)(fd, iov, cnt),
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, input: c_int, off: *mut i64, n: usize) -> isize {
    // SAFETY: as called.
    unsafe {
        match rs(out) {
            Some(h) => (h.sendfile)(out, input, off, n),
            None => (pass().real.sendfile)(out, input, off, n),
        }
    }
}

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: as called.
    unsafe {
        if any_poll(fds, n) {
            if let Some(h) = HOOKS.get() {
                let ts = ms_to_ts(timeout);
                return (h.ppoll)(fds, n, ts_ptr(&ts), std::ptr::null());
            }
        }
        (pass().poll)(fds, n, timeout)
    }
}

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
            Some(h) if any_poll(fds, n) => (h.ppoll)(fds, n, ts, mask),
            _ => (pass().real.ppoll)(fds, n, ts, mask),
        }
    }
}

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
                let r = (h.pselect)(n, rd, wr, ex, p, std::ptr::null(), true);
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
                return (h.pselect)(n, rd, wr, ex, p, mask, false);
            }
        }
        (pass().pselect)(n, rd, wr, ex, ts, mask)
    }
}

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
                return (h.epoll_ctl)(epfd, op, fd, ev);
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
                (h.epoll_pwait2)(epfd, ev, max, ts_ptr(&ts), std::ptr::null())
            }
            None => (pass().epoll_wait)(epfd, ev, max, timeout),
        }
    }
}

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
                (h.epoll_pwait2)(epfd, ev, max, ts_ptr(&ts), mask)
            }
            None => (pass().real.epoll_pwait)(epfd, ev, max, timeout, mask),
        }
    }
}

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
            (Some(h), _) => (h.epoll_pwait2)(epfd, ev, max, ts, mask),
            (None, Some(f)) => f(epfd, ev, max, ts, mask),
            (None, None) => {
                *libc::__errno_location() = libc::ENOSYS;
                -1
            }
        }
    }
}
