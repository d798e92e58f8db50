//! The C functions the preload library hands over (see [`super::abi::Hooks`]): each takes
//! what the C library's takes, behind the panic boundary; a descriptor that is not (or no
//! longer) an rsocket goes to the C library's function.

use std::ffi::{c_int, c_ulong, c_void};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libc::{msghdr, sockaddr, sockaddr_storage, socklen_t};

use super::abi::Hooks;
use super::{
    CHILD, ENGINE, Entry, PID, entry, errno, fail, insert, real, release, remove, shown, to_kernel,
};
use crate::guard;
use crate::rdmacm::{read_addr, write_addr};
use crate::rsocket::{self, ConnectMode};

pub(super) fn table() -> Hooks {
    Hooks {
        socket,
        bind,
        listen,
        accept4,
        connect,
        close,
        dup,
        dup3,
        fcntl,
        ioctl,
        getsockopt,
        setsockopt,
        getsockname,
        getpeername,
        shutdown,
        recvfrom,
        sendto,
        recvmsg,
        sendmsg,
        rwv,
        ppoll: super::epoll::ppoll,
        pselect: super::epoll::pselect,
        epoll_ctl: super::epoll::epoll_ctl,
        epoll_pwait2: super::epoll::epoll_pwait2,
        sendfile,
    }
}

/// An entry that is this process's own and still an rsocket; an inherited one (a child
/// of `fork`) is ENOTCONN's business: `Err(())`.
fn live(fd: c_int) -> Option<Result<Arc<Entry>, ()>> {
    let e = entry(fd)?;
    Some(if e.ours() { Ok(e) } else { Err(()) })
}

/// Writes `a` to `addr`/`len` as the kernel does (truncated to the caller's room, the
/// full length in `*len`). EFAULT-free: NULL pointers write nothing.
///
/// # Safety
/// `addr` NULL or valid for `*len` bytes; `len` NULL or valid.
unsafe fn put_addr(a: SocketAddr, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is valid.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = write_addr(&mut ss, a);
    // SAFETY: per the contract.
    let room = unsafe { *len } as usize;
    // SAFETY: `addr` has `room` bytes; `ss` at least `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&raw const ss).cast::<u8>(),
            addr.cast::<u8>(),
            room.min(n as usize),
        );
        *len = n;
    }
}

/// The kernel socket's own address.
fn kernel_name(fd: c_int) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is valid.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: `ss` has `len` bytes.
    let r = unsafe { (real().getsockname)(fd, (&raw mut ss).cast(), &mut len) };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote a sockaddr of the socket's family into `ss`.
    unsafe { read_addr((&raw const ss).cast()) }
}

/// Starts srdma's devices (marked so that children of `fork` know).
fn engine() {
    ENGINE.store(true, Ordering::Release);
}

unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    // SAFETY: the C library's socket, as called.
    let fd = unsafe { (real().socket)(domain, ty, protocol) };
    guard(fd, || {
        let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
        let tcp = (domain == libc::AF_INET || domain == libc::AF_INET6)
            && base == libc::SOCK_STREAM
            && (protocol == 0 || protocol == libc::IPPROTO_TCP);
        if fd < 0 || !tcp || CHILD.load(Ordering::Acquire) || fd as usize >= super::MARKS {
            return fd;
        }
        let e = Arc::new(Entry {
            rs: rsocket::new_unnumbered(ty & libc::SOCK_NONBLOCK != 0),
            family: domain,
            fds: Mutex::new(Vec::new()),
            kernel: Default::default(),
            pid: PID.load(Ordering::Acquire),
        });
        insert(fd, &e);
        fd
    })
}

unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the C library's bind, as called: the kernel socket takes the address.
    let r = unsafe { (real().bind)(fd, addr, len) };
    guard(r, || {
        if r != 0 {
            return r;
        }
        let Some(Ok(e)) = live(fd) else { return r };
        engine();
        let ok = kernel_name(fd).is_some_and(|a| rsocket::bind(&e.rs, a).is_ok());
        if !ok {
            // An address no srdma device has: the kernel's socket.
            to_kernel(&e);
        }
        r
    })
}

unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the C library's listen, as called: the kernel socket listens too.
    let r = unsafe { (real().listen)(fd, backlog) };
    guard(r, || {
        if r != 0 {
            return r;
        }
        let Some(Ok(e)) = live(fd) else { return r };
        engine();
        if rsocket::name(&e.rs, false).is_err() {
            // Not bound: listen bound the kernel socket to a port of its choosing.
            match kernel_name(fd) {
                Some(a) if rsocket::bind(&e.rs, a).is_ok() => {}
                _ => {
                    to_kernel(&e);
                    return r;
                }
            }
        }
        if rsocket::listen(&e.rs).is_err() {
            to_kernel(&e);
        }
        r
    })
}

/// Gives accepted rsocket `n` a kernel socket's number (the lowest free one, as accept's).
///
/// # Safety
/// `addr`/`len` NULL or valid.
unsafe fn adopt(
    e: &Entry,
    n: Arc<rsocket::Rsock>,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let ty = libc::SOCK_STREAM | (flags & (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK));
    // SAFETY: the C library's socket.
    let fd = unsafe { (real().socket)(e.family, ty, 0) };
    if fd < 0 || fd as usize >= super::MARKS {
        let err = if fd < 0 { errno() } else { libc::EMFILE };
        if fd >= 0 {
            // SAFETY: our own fresh descriptor.
            unsafe { (real().close)(fd) };
        }
        rsocket::close(&n, Duration::ZERO, true);
        return fail(err);
    }
    rsocket::set_nonblock(&n, flags & libc::SOCK_NONBLOCK != 0);
    let peer = rsocket::name(&n, true).ok();
    let ne = Arc::new(Entry {
        rs: n,
        family: e.family,
        fds: Mutex::new(Vec::new()),
        kernel: Default::default(),
        pid: PID.load(Ordering::Acquire),
    });
    insert(fd, &ne);
    super::COUNTS.accepted.fetch_add(1, Ordering::Relaxed);
    if let Some(p) = peer {
        // SAFETY: per the contract.
        unsafe { put_addr(shown(e, p), addr, len) };
    }
    fd
}

unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    guard(fail(libc::EIO), || {
        let e = match live(fd) {
            Some(Ok(e)) if rsocket::is_listening(&e.rs) => e,
            // SAFETY: the C library's accept4, as called.
            _ => return unsafe { (real().accept4)(fd, addr, len, flags) },
        };
        if flags & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) != 0 {
            return fail(libc::EINVAL);
        }
        // SAFETY: F_GETFL on our descriptor.
        let nonblock = unsafe { (real().fcntl)(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        let me = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            match rsocket::try_accept(&e.rs) {
                // SAFETY: per the contract.
                Ok(Some(n)) => return unsafe { adopt(&e, n, addr, len, flags) },
                Ok(None) => {}
                Err(err) => return fail(err),
            }
            // A client of the kernel's?
            let mut p = [me];
            // SAFETY: a live pollfd, zero timeout.
            let k = unsafe { (real().ppoll)(p.as_mut_ptr(), 1, &ZERO, std::ptr::null()) };
            if k > 0 && p[0].revents & libc::POLLIN != 0 {
                // SAFETY: the C library's accept4, as called.
                let r = unsafe { (real().accept4)(fd, addr, len, flags) };
                if r >= 0 || (errno() != libc::EAGAIN && errno() != libc::EWOULDBLOCK) {
                    return r;
                }
            }
            if nonblock {
                return fail(libc::EAGAIN);
            }
            let rs = e.rs.clone();
            let r = rsocket::wait::wait_loop(Vec::new, &[me], None, None, |k| {
                if rsocket::readiness(&rs) & libc::POLLIN != 0 {
                    return Ok(true);
                }
                if k {
                    let mut p = [me];
                    // SAFETY: a live pollfd, zero timeout.
                    let n = unsafe { (real().ppoll)(p.as_mut_ptr(), 1, &ZERO, std::ptr::null()) };
                    return Ok(n > 0);
                }
                Ok(false)
            });
            if let Err(libc::EINTR) = r {
                if crate::signals::interrupting_handler_installed() {
                    return fail(libc::EINTR);
                }
            }
        }
    })
}

const ZERO: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: 0,
};

/// Connects `e`'s kernel socket `fd` to `addr` and gives `e` to the kernel: the kernel's
/// result and errno are the program's. (The connect comes first, so that nobody sees the
/// kernel socket in between, unconnected.)
///
/// # Safety
/// `addr` valid for `len` bytes.
unsafe fn kernel_connect(
    e: &Arc<Entry>,
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> c_int {
    // SAFETY: per the contract.
    let r = unsafe { (real().connect)(fd, addr, len) };
    let err = errno();
    super::COUNTS.fallbacks.fetch_add(1, Ordering::Relaxed);
    to_kernel(e);
    crate::set_errno(err);
    r
}

unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    guard(fail(libc::EIO), || {
        let e = match live(fd) {
            Some(Ok(e)) => e,
            Some(Err(())) => return fail(libc::ENOTCONN),
            // SAFETY: the C library's connect, as called.
            None => return unsafe { (real().connect)(fd, addr, len) },
        };
        // SAFETY: `addr` as the caller gave it (NULL checked by read_addr).
        let dst = if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
            None
        } else {
            unsafe { read_addr(addr) }
        };
        let family_ok = dst.is_some_and(|d| d.is_ipv6() == e.v6());
        if rsocket::is_connecting(&e.rs) {
            return fail(libc::EALREADY);
        }
        if rsocket::is_connected(&e.rs) {
            return match rsocket::connect_again(&e.rs) {
                Ok(()) => 0,
                Err(err) => fail(err),
            };
        }
        let Some(dst) = dst.filter(|_| family_ok && !rsocket::is_listening(&e.rs)) else {
            // AF_UNSPEC, another family, a listener: the kernel's answer.
            // SAFETY: as called.
            return unsafe { kernel_connect(&e, fd, addr, len) };
        };
        engine();
        // SAFETY: F_GETFL on our descriptor.
        let nonblock = unsafe { (real().fcntl)(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        if !nonblock {
            return match rsocket::connect(
                &e.rs,
                dst,
                ConnectMode::Blocking,
                super::connect_timeout(),
            ) {
                Ok(()) => 0,
                // No rsocket peer there: the kernel's connection.
                // SAFETY: as called.
                Err(_) => unsafe { kernel_connect(&e, fd, addr, len) },
            };
        }
        // The address, kept for a fallback from the connect's thread.
        // SAFETY: sockaddr_storage is plain bytes.
        let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
        let alen = write_addr(&mut ss, dst);
        let weak = Arc::downgrade(&e);
        let on_fail = move |_err: c_int| -> Result<(), c_int> {
            let Some(e) = weak.upgrade() else {
                return Ok(());
            };
            // Still the socket named `fd`? (The program may have closed it.)
            if entry(fd).is_none_or(|x| !Arc::ptr_eq(&x, &e)) {
                return Ok(());
            }
            // SAFETY: `ss` holds `alen` bytes of a sockaddr.
            let r = unsafe { kernel_connect(&e, fd, (&raw const ss).cast(), alen) };
            if r == 0 || errno() == libc::EINPROGRESS {
                Ok(())
            } else {
                Err(errno())
            }
        };
        match rsocket::connect(
            &e.rs,
            dst,
            ConnectMode::Async(Some(Box::new(on_fail))),
            super::connect_timeout(),
        ) {
            Ok(()) => 0,
            Err(err) => fail(err),
        }
    })
}

unsafe extern "C" fn close(fd: c_int) -> c_int {
    let last = guard(None, || {
        super::epoll::close_set(fd);
        remove(fd)
    });
    // SAFETY: the C library's close, as called.
    let r = unsafe { (real().close)(fd) };
    if let Some(e) = last {
        let err = errno();
        guard((), || release(e));
        crate::set_errno(err);
    }
    r
}

/// `fd`'s entry (if any) gets the name `nfd` too.
fn alias(fd: c_int, nfd: c_int) {
    if nfd < 0 || nfd as usize >= super::MARKS {
        return;
    }
    if let Some(e) = entry(fd) {
        insert(nfd, &e);
    }
    super::epoll::alias_set(fd, nfd);
}

unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the C library's dup, as called.
    let nfd = unsafe { (real().dup)(fd) };
    guard(nfd, || {
        alias(fd, nfd);
        nfd
    })
}

unsafe extern "C" fn dup3(fd: c_int, nfd: c_int, flags: c_int) -> c_int {
    let r = if flags == -1 {
        // SAFETY: the C library's dup2, as called.
        unsafe { (real().dup2)(fd, nfd) }
    } else {
        // SAFETY: the C library's dup3, as called.
        unsafe { (real().dup3)(fd, nfd, flags) }
    };
    guard(r, || {
        if r < 0 || fd == nfd {
            return r;
        }
        // The kernel closed what `nfd` named.
        super::epoll::close_set(nfd);
        if let Some(e) = remove(nfd) {
            let err = errno();
            release(e);
            crate::set_errno(err);
        }
        alias(fd, nfd);
        r
    })
}

unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the C library's fcntl with its one argument, as called.
    let r = unsafe { (real().fcntl)(fd, cmd, arg) };
    guard(r, || {
        if r < 0 {
            return r;
        }
        match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => alias(fd, r),
            libc::F_SETFL => {
                if let Some(Ok(e)) = live(fd) {
                    rsocket::set_nonblock(&e.rs, arg as c_int & libc::O_NONBLOCK != 0);
                }
            }
            _ => {}
        }
        r
    })
}

unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    guard(fail(libc::EIO), || {
        let e = live(fd).and_then(Result::ok);
        if let Some(e) = &e {
            if req == libc::FIONREAD && rsocket::is_connected(&e.rs) {
                if arg.is_null() {
                    return fail(libc::EFAULT);
                }
                let n = rsocket::pending(&e.rs).min(c_int::MAX as usize) as c_int;
                // SAFETY: FIONREAD's argument is an int the caller gave.
                unsafe { arg.cast::<c_int>().write_unaligned(n) };
                return 0;
            }
        }
        // SAFETY: the C library's ioctl, as called.
        let r = unsafe { (real().ioctl)(fd, req, arg) };
        if r == 0 && req == libc::FIONBIO && !arg.is_null() {
            if let Some(e) = &e {
                // SAFETY: FIONBIO's argument is an int the kernel just read.
                let on = unsafe { arg.cast::<c_int>().read_unaligned() } != 0;
                rsocket::set_nonblock(&e.rs, on);
            }
        }
        r
    })
}

unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the C library's getsockopt, as called: the kernel socket holds the options.
    let r = unsafe { (real().getsockopt)(fd, level, name, val, len) };
    guard(r, || {
        if r != 0 || (level, name) != (libc::SOL_SOCKET, libc::SO_ERROR) {
            return r;
        }
        if let Some(Ok(e)) = live(fd) {
            if !val.is_null() && !len.is_null() {
                // SAFETY: the kernel accepted the buffer for an int.
                unsafe {
                    val.cast::<c_int>()
                        .write_unaligned(rsocket::take_error(&e.rs))
                };
            }
        }
        r
    })
}

unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the C library's setsockopt, as called: the kernel's rules and errors.
    let r = unsafe { (real().setsockopt)(fd, level, name, val, len) };
    guard(r, || {
        if r != 0 || val.is_null() {
            return r;
        }
        if let Some(Ok(e)) = live(fd) {
            let timeval = matches!(
                (level, name),
                (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO)
            );
            let (v, tv) = if timeval && len as usize >= std::mem::size_of::<libc::timeval>() {
                // SAFETY: the kernel read a timeval from it.
                let t = unsafe { val.cast::<libc::timeval>().read_unaligned() };
                let d = Duration::from_secs(t.tv_sec.max(0) as u64)
                    + Duration::from_micros(t.tv_usec.max(0) as u64);
                (0, Some(d))
            } else if len as usize >= std::mem::size_of::<c_int>() {
                // SAFETY: the kernel read an int from it.
                (unsafe { val.cast::<c_int>().read_unaligned() }, None)
            } else {
                return r;
            };
            rsocket::note_option(&e.rs, level, name, v, tv);
        }
        r
    })
}

/// `getsockname` (`peer` false) and `getpeername` of a connected rsocket; the kernel's
/// otherwise.
///
/// # Safety
/// As getsockname(2).
unsafe fn names(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, peer: bool) -> c_int {
    guard(fail(libc::EIO), || {
        let e = match live(fd) {
            Some(Ok(e))
                if rsocket::is_connected(&e.rs) || (peer && rsocket::is_connecting(&e.rs)) =>
            {
                e
            }
            Some(Err(())) if peer => return fail(libc::ENOTCONN),
            _ => {
                let f = if peer {
                    real().getpeername
                } else {
                    real().getsockname
                };
                // SAFETY: the C library's function, as called.
                return unsafe { f(fd, addr, len) };
            }
        };
        if addr.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        match rsocket::name(&e.rs, peer) {
            Ok(a) => {
                // SAFETY: per the contract.
                unsafe { put_addr(shown(&e, a), addr, len) };
                0
            }
            Err(err) => fail(err),
        }
    })
}

unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: per the contract.
    unsafe { names(fd, addr, len, false) }
}

unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: per the contract.
    unsafe { names(fd, addr, len, true) }
}

unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    guard(fail(libc::EIO), || match live(fd) {
        Some(Ok(e)) if rsocket::is_connected(&e.rs) => match rsocket::shutdown(&e.rs, how) {
            Ok(()) => 0,
            Err(err) => fail(err),
        },
        Some(Err(())) => fail(libc::ENOTCONN),
        // SAFETY: the C library's shutdown, as called.
        _ => unsafe { (real().shutdown)(fd, how) },
    })
}

/// The connection behind `fd` for a data call: Ok(entry) for an rsocket that is connected
/// or connecting, Err(None) to go to the kernel, Err(Some(errno)) to fail.
fn data(fd: c_int) -> Result<Arc<Entry>, Option<c_int>> {
    match live(fd) {
        Some(Ok(e)) if rsocket::is_connected(&e.rs) || rsocket::is_connecting(&e.rs) => Ok(e),
        Some(Err(())) => Err(Some(libc::ENOTCONN)),
        _ => Err(None),
    }
}

/// A send's result: EPIPE raises SIGPIPE unless `MSG_NOSIGNAL`, as the kernel's.
fn sent(r: Result<usize, c_int>, flags: c_int) -> isize {
    match r {
        Ok(n) => {
            super::COUNTS.sent.fetch_add(n as u64, Ordering::Relaxed);
            n as isize
        }
        Err(libc::EPIPE) => {
            if flags & libc::MSG_NOSIGNAL == 0 {
                // SAFETY: raising a signal on this thread, as the kernel would.
                unsafe { libc::raise(libc::SIGPIPE) };
            }
            fail(libc::EPIPE)
        }
        Err(e) => fail(e),
    }
}

fn received(r: Result<usize, c_int>) -> isize {
    match r {
        Ok(n) => {
            super::COUNTS
                .received
                .fetch_add(n as u64, Ordering::Relaxed);
            n as isize
        }
        Err(e) => fail(e),
    }
}

/// Flags a stream receive or send understands; MSG_OOB is EINVAL (no urgent data).
fn flags_ok(flags: c_int) -> bool {
    flags & libc::MSG_OOB == 0
}

unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    guard(fail(libc::EIO), || {
        let e = match data(fd) {
            Ok(e) => e,
            Err(Some(err)) => return fail(err),
            // SAFETY: the C library's recvfrom, as called.
            Err(None) => return unsafe { (real().recvfrom)(fd, buf, n, flags, addr, alen) },
        };
        if !flags_ok(flags) {
            return fail(libc::EINVAL);
        }
        if n > 0 && buf.is_null() {
            return fail(libc::EFAULT);
        }
        let out: &mut [u8] = if n == 0 {
            &mut []
        } else {
            // SAFETY: the caller's buffer of `n` bytes.
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) }
        };
        let r = rsocket::recv(&e.rs, &mut [out], flags);
        if r.is_ok() && !alen.is_null() {
            // A stream socket returns no address.
            // SAFETY: the caller's length.
            unsafe { *alen = 0 };
        }
        received(r)
    })
}

unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> isize {
    guard(fail(libc::EIO), || {
        let e = match data(fd) {
            Ok(e) => e,
            Err(Some(err)) => return fail(err),
            // SAFETY: the C library's sendto, as called.
            Err(None) => return unsafe { (real().sendto)(fd, buf, n, flags, addr, alen) },
        };
        if !flags_ok(flags) {
            return fail(libc::EOPNOTSUPP);
        }
        if n > 0 && buf.is_null() {
            return fail(libc::EFAULT);
        }
        let src: &[u8] = if n == 0 {
            &[]
        } else {
            // SAFETY: the caller's buffer of `n` bytes.
            unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }
        };
        sent(rsocket::send(&e.rs, &[src], flags), flags)
    })
}

/// The iovecs as slices (EINVAL for a bad count, EFAULT for NULL with a length).
///
/// # Safety
/// `iov` valid for `cnt` iovecs naming valid memory.
unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<Vec<&'a mut [u8]>, c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    let mut v = Vec::with_capacity(cnt as usize);
    for i in 0..cnt as usize {
        // SAFETY: per the contract.
        let e = unsafe { &*iov.add(i) };
        if e.iov_len == 0 {
            continue;
        }
        if e.iov_base.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        v.push(unsafe { std::slice::from_raw_parts_mut(e.iov_base.cast::<u8>(), e.iov_len) });
    }
    Ok(v)
}

unsafe extern "C" fn rwv(fd: c_int, iov: *const libc::iovec, cnt: c_int, write: bool) -> isize {
    guard(fail(libc::EIO), || {
        let e = match data(fd) {
            Ok(e) => e,
            Err(Some(err)) => return fail(err),
            Err(None) => {
                let f = if write { real().writev } else { real().readv };
                // SAFETY: the C library's function, as called.
                return unsafe { f(fd, iov, cnt) };
            }
        };
        // SAFETY: per readv/writev's contract.
        let mut parts = match unsafe { iovecs(iov, cnt) } {
            Ok(p) => p,
            Err(err) => return fail(err),
        };
        if write {
            let src: Vec<&[u8]> = parts.iter().map(|p| &**p).collect();
            sent(rsocket::send(&e.rs, &src, 0), 0)
        } else {
            received(rsocket::recv(&e.rs, &mut parts, 0))
        }
    })
}

unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> isize {
    guard(fail(libc::EIO), || {
        let e = match data(fd) {
            Ok(e) => e,
            Err(Some(err)) => return fail(err),
            // SAFETY: the C library's recvmsg, as called.
            Err(None) => return unsafe { (real().recvmsg)(fd, msg, flags) },
        };
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        if !flags_ok(flags) {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's msghdr.
        let m = unsafe { &mut *msg };
        // SAFETY: the msghdr's iovecs.
        let mut parts = match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
            Ok(p) => p,
            Err(err) => return fail(err),
        };
        let r = rsocket::recv(&e.rs, &mut parts, flags);
        if r.is_ok() {
            m.msg_namelen = 0;
            m.msg_controllen = 0;
            m.msg_flags = 0;
        }
        received(r)
    })
}

unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> isize {
    guard(fail(libc::EIO), || {
        let e = match data(fd) {
            Ok(e) => e,
            Err(Some(err)) => return fail(err),
            // SAFETY: the C library's sendmsg, as called.
            Err(None) => return unsafe { (real().sendmsg)(fd, msg, flags) },
        };
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        if !flags_ok(flags) {
            return fail(libc::EOPNOTSUPP);
        }
        // SAFETY: the caller's msghdr.
        let m = unsafe { &*msg };
        // SAFETY: the msghdr's iovecs.
        let parts = match unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) } {
            Ok(p) => p,
            Err(err) => return fail(err),
        };
        let src: Vec<&[u8]> = parts.iter().map(|p| &**p).collect();
        sent(rsocket::send(&e.rs, &src, flags), flags)
    })
}

unsafe extern "C" fn sendfile(out: c_int, input: c_int, off: *mut i64, count: usize) -> isize {
    guard(fail(libc::EIO), || {
        let e = match data(out) {
            Ok(e) => e,
            Err(Some(err)) => return fail(err),
            // SAFETY: the C library's sendfile, as called.
            Err(None) => return unsafe { (real().sendfile)(out, input, off, count) },
        };
        // From the offset given, else the file's own, which moves by what was sent.
        let start = if off.is_null() {
            // SAFETY: lseek on the caller's descriptor.
            let p = unsafe { libc::lseek(input, 0, libc::SEEK_CUR) };
            if p < 0 {
                return fail(errno());
            }
            p
        } else {
            // SAFETY: the caller's offset.
            unsafe { *off }
        };
        let mut buf = vec![0u8; count.min(1 << 20)];
        let mut done = 0usize;
        while done < count {
            let want = (count - done).min(buf.len());
            // SAFETY: `buf` has `want` bytes.
            let n =
                unsafe { libc::pread(input, buf.as_mut_ptr().cast(), want, start + done as i64) };
            if n < 0 {
                if done == 0 {
                    return fail(errno());
                }
                break;
            }
            if n == 0 {
                break;
            }
            match rsocket::send(&e.rs, &[&buf[..n as usize]], 0) {
                Ok(s) => {
                    done += s;
                    if s < n as usize {
                        break;
                    }
                }
                Err(err) if done == 0 => return sent(Err(err), 0),
                Err(_) => break,
            }
        }
        if off.is_null() {
            // SAFETY: lseek on the caller's descriptor.
            unsafe { libc::lseek(input, start + done as i64, libc::SEEK_SET) };
        } else {
            // SAFETY: the caller's offset.
            unsafe { *off = start + done as i64 };
        }
        done as isize
    })
}
