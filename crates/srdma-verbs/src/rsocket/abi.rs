//! The C exports of rsockets (librdmacm's `rsocket`, `rbind`, … `riowrite`, `rpoll`,
//! `rselect`): thin wrappers over [`super`]'s `c_*` functions, each behind the panic
//! boundary, -1 with errno on error.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;

use libc::{sockaddr, sockaddr_storage, socklen_t};

use crate::rdmacm::{err, leave_data_path, read_addr, write_addr};
use crate::{guard, set_errno};

/// `rpoll`: `poll(2)` over rsockets (their readiness from their completions, see
/// `rsocket::c_poll`) and ordinary descriptors.
///
/// # Safety
/// As `poll(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    guard(err(libc::EIO), || {
        if nfds == 0 {
            // SAFETY: a poll of nothing: a sleep.
            return unsafe { libc::poll(fds, 0, timeout) };
        }
        if fds.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: per the contract, `nfds` pollfds.
        let all = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
        if !all.iter().any(|p| crate::rsocket::lookup(p.fd).is_some()) {
            // SAFETY: per the contract.
            return unsafe { libc::poll(fds, nfds, timeout) };
        }
        match crate::rsocket::c_poll(all, timeout) {
            Ok(n) => n,
            Err(e) => err(e),
        }
    })
}

/// `rselect`: `select(2)`; with rsockets among the descriptors, as rsocket.c does it: the
/// sets become an `rpoll` and its answer the sets.
///
/// # Safety
/// As `select(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    guard(err(libc::EIO), || {
        let n = nfds.clamp(0, libc::FD_SETSIZE as c_int);
        // SAFETY: each set NULL or valid, per the contract.
        let isset =
            |set: *mut libc::fd_set, fd| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
        let mut fds = Vec::new();
        let mut any_rsocket = false;
        for fd in 0..n {
            let mut events = 0;
            if isset(readfds, fd) {
                events |= libc::POLLIN;
            }
            if isset(writefds, fd) {
                events |= libc::POLLOUT;
            }
            if isset(exceptfds, fd) {
                events |= libc::POLLPRI;
            }
            if events != 0 {
                any_rsocket |= crate::rsocket::lookup(fd).is_some();
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
        if !any_rsocket {
            // SAFETY: per the contract.
            return unsafe { libc::select(nfds, readfds, writefds, exceptfds, timeout) };
        }
        let ms = if timeout.is_null() {
            -1
        } else {
            // SAFETY: non-NULL, valid per the contract.
            let t = unsafe { *timeout };
            (t.tv_sec.max(0).saturating_mul(1000) + t.tv_usec.max(0) / 1000).min(c_int::MAX.into())
                as c_int
        };
        if let Err(e) = crate::rsocket::c_poll(&mut fds, ms) {
            return err(e);
        }
        let mut count = 0;
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                // SAFETY: valid per the contract.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        for p in &fds {
            let hit = |set: *mut libc::fd_set, mask: i16| {
                if !set.is_null() && p.revents & mask != 0 {
                    // SAFETY: valid per the contract; `p.fd` < FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    1
                } else {
                    0
                }
            };
            count += hit(readfds, libc::POLLIN | libc::POLLHUP | libc::POLLERR);
            count += hit(writefds, libc::POLLOUT | libc::POLLERR);
            count += hit(exceptfds, libc::POLLPRI);
        }
        count
    })
}

// rsockets: the stream sockets of crate::rsocket; -1 with errno on error.

fn rs_ret(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

fn rs_len(r: Result<usize, c_int>) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Writes `a` to `addr`/`addrlen` as `getsockname` does (truncated to the caller's room).
///
/// # Safety
/// `addr` NULL or valid for `*addrlen` bytes; `addrlen` NULL or valid.
unsafe fn put_addr(a: SocketAddr, addr: *mut sockaddr, addrlen: *mut socklen_t) {
    if addr.is_null() || addrlen.is_null() {
        return;
    }
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is valid.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = write_addr(&mut ss, a);
    // SAFETY: per the contract.
    let room = unsafe { *addrlen } as usize;
    // SAFETY: `addr` has `room` bytes; `ss` at least `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&raw const ss).cast::<u8>(),
            addr.cast::<u8>(),
            room.min(n as usize),
        );
        *addrlen = n;
    }
}

/// The bytes an iovec array names.
///
/// # Safety
/// `iov` NULL or `iovcnt` valid iovecs, each naming `iov_len` valid bytes.
unsafe fn iovecs<'a>(iov: *const libc::iovec, iovcnt: c_int) -> Option<Vec<&'a mut [u8]>> {
    if iovcnt < 0 || (iovcnt > 0 && iov.is_null()) {
        return None;
    }
    let mut v = Vec::with_capacity(iovcnt as usize);
    for i in 0..iovcnt as usize {
        // SAFETY: per the contract.
        let e = unsafe { &*iov.add(i) };
        if e.iov_len == 0 {
            continue;
        }
        if e.iov_base.is_null() {
            return None;
        }
        // SAFETY: per the contract.
        v.push(unsafe { std::slice::from_raw_parts_mut(e.iov_base.cast::<u8>(), e.iov_len) });
    }
    Some(v)
}

/// The bytes at `buf` (empty for a NULL `buf` of length 0).
///
/// # Safety
/// `buf` valid for `len` bytes unless `len` is 0.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    if buf.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    Some(unsafe { std::slice::from_raw_parts_mut(buf.cast_mut().cast::<u8>(), len) })
}

/// `rsocket`: a stream rsocket (AF_INET or AF_INET6, SOCK_STREAM, optionally
/// SOCK_NONBLOCK); datagram rsockets are not implemented (EOPNOTSUPP).
#[unsafe(no_mangle)]
pub extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    guard(err(libc::EIO), || {
        match crate::rsocket::c_socket(domain, ty, protocol) {
            Ok(fd) => fd,
            Err(e) => err(e),
        }
    })
}

/// `rbind`: the local address (an srdma device's, or a wildcard) and port.
///
/// # Safety
/// `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rbind(socket: c_int, addr: *const sockaddr, _len: socklen_t) -> c_int {
    // SAFETY: per the contract.
    guard(err(libc::EIO), || {
        rs_ret(crate::rsocket::c_bind(socket, unsafe { read_addr(addr) }))
    })
}

/// `rlisten`: accepts connections in the background from now on.
#[unsafe(no_mangle)]
pub extern "C" fn rlisten(socket: c_int, _backlog: c_int) -> c_int {
    guard(err(libc::EIO), || rs_ret(crate::rsocket::c_listen(socket)))
}

/// `raccept`: the next accepted connection (EAGAIN on a non-blocking listener with none).
///
/// # Safety
/// `addr`/`addrlen` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn raccept(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    guard(err(libc::EIO), || match crate::rsocket::c_accept(socket) {
        Ok((fd, peer)) => {
            if let Some(p) = peer {
                // SAFETY: per the contract.
                unsafe { put_addr(p, addr, addrlen) };
            }
            fd
        }
        Err(e) => err(e),
    })
}

/// `rconnect`: connects before returning; a non-blocking socket returns EINPROGRESS and
/// connects in the background (`rpoll` reports POLLOUT, `SO_ERROR` the result).
/// ECONNREFUSED when rejected, ETIMEDOUT without an answer.
///
/// # Safety
/// `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rconnect(socket: c_int, addr: *const sockaddr, _len: socklen_t) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        rs_ret(crate::rsocket::c_connect(socket, unsafe {
            read_addr(addr)
        }))
    })
}

/// `rshutdown`.
#[unsafe(no_mangle)]
pub extern "C" fn rshutdown(socket: c_int, how: c_int) -> c_int {
    guard(err(libc::EIO), || {
        rs_ret(crate::rsocket::c_shutdown(socket, how))
    })
}

/// `rclose`: shuts the connection down (a disconnect message, then the CM's DREQ) and frees
/// the socket.
#[unsafe(no_mangle)]
pub extern "C" fn rclose(socket: c_int) -> c_int {
    guard(err(libc::EIO), || rs_ret(crate::rsocket::c_close(socket)))
}

/// `rrecv`: 0 at the end of the peer's data.
///
/// # Safety
/// `buf` valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(b) = (unsafe { bytes(buf, len) }) else {
            return rs_len(Err(libc::EFAULT));
        };
        rs_len(crate::rsocket::c_recv(socket, &mut [b], flags))
    })
}

/// `rrecvfrom`: `rrecv`, and the peer's address.
///
/// # Safety
/// `buf` valid for `len` bytes; `src_addr`/`addrlen` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src_addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> isize {
    // SAFETY: per the contract.
    let n = unsafe { rrecv(socket, buf, len, flags) };
    guard(-1, || {
        if n >= 0 {
            if let Ok(a) = crate::rsocket::c_name(socket, true) {
                // SAFETY: per the contract.
                unsafe { put_addr(a, src_addr, addrlen) };
            }
        }
        n
    })
}

/// Receives into the iovecs in order.
///
/// # Safety
/// As [`iovecs`].
unsafe fn recvv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int, flags: c_int) -> isize {
    // SAFETY: per the contract.
    let Some(mut parts) = (unsafe { iovecs(iov, iovcnt) }) else {
        return rs_len(Err(libc::EINVAL));
    };
    rs_len(crate::rsocket::c_recv(socket, &mut parts, flags))
}

/// Sends the iovecs in order.
///
/// # Safety
/// As [`iovecs`].
unsafe fn sendv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int, flags: c_int) -> isize {
    // SAFETY: per the contract.
    let Some(parts) = (unsafe { iovecs(iov, iovcnt) }) else {
        return rs_len(Err(libc::EINVAL));
    };
    let parts: Vec<&[u8]> = parts.iter().map(|p| &**p).collect();
    rs_len(crate::rsocket::c_send(socket, &parts, flags))
}

/// `rrecvmsg` (the data only: no control messages, no address).
///
/// # Safety
/// `msg` NULL or a valid msghdr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    guard(-1, || {
        if msg.is_null() {
            return rs_len(Err(libc::EINVAL));
        }
        // SAFETY: per the contract.
        let m = unsafe { &*msg };
        // SAFETY: the msghdr's iovecs, per the contract.
        unsafe { recvv(socket, m.msg_iov, m.msg_iovlen as c_int, flags) }
    })
}

/// `rsend`.
///
/// # Safety
/// `buf` valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsend(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(b) = (unsafe { bytes(buf, len) }) else {
            return rs_len(Err(libc::EFAULT));
        };
        rs_len(crate::rsocket::c_send(socket, &[b], flags))
    })
}

/// `rsendto`: a stream socket ignores the address, as rsockets do.
///
/// # Safety
/// `buf` valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    _dest_addr: *const sockaddr,
    _addrlen: socklen_t,
) -> isize {
    // SAFETY: per the contract.
    unsafe { rsend(socket, buf, len, flags) }
}

/// `rsendmsg` (the data only).
///
/// # Safety
/// `msg` NULL or a valid msghdr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    guard(-1, || {
        if msg.is_null() {
            return rs_len(Err(libc::EINVAL));
        }
        // SAFETY: per the contract.
        let m = unsafe { &*msg };
        // SAFETY: the msghdr's iovecs, per the contract.
        unsafe { sendv(socket, m.msg_iov, m.msg_iovlen as c_int, flags) }
    })
}

/// `rread`: `rrecv` without flags.
///
/// # Safety
/// `buf` valid for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: per the contract.
    unsafe { rrecv(socket, buf, count, 0) }
}

/// `rreadv`.
///
/// # Safety
/// `iov` NULL or `iovcnt` valid iovecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
    // SAFETY: per the contract.
    guard(-1, || unsafe { recvv(socket, iov, iovcnt, 0) })
}

/// `rwrite`: `rsend` without flags.
///
/// # Safety
/// `buf` valid for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
    // SAFETY: per the contract.
    unsafe { rsend(socket, buf, count, 0) }
}

/// `rwritev`.
///
/// # Safety
/// `iov` NULL or `iovcnt` valid iovecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize {
    // SAFETY: per the contract.
    guard(-1, || unsafe { sendv(socket, iov, iovcnt, 0) })
}

/// `rgetpeername` and `rgetsockname`: the peer's or the local address.
///
/// # Safety
/// `addr`/`addrlen` NULL or valid.
unsafe fn name(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t, peer: bool) -> c_int {
    guard(err(libc::EIO), || {
        if addr.is_null() || addrlen.is_null() {
            return err(libc::EFAULT);
        }
        match crate::rsocket::c_name(socket, peer) {
            // SAFETY: per the contract.
            Ok(a) => unsafe {
                put_addr(a, addr, addrlen);
                0
            },
            Err(e) => err(e),
        }
    })
}

/// `rgetpeername`.
///
/// # Safety
/// `addr`/`addrlen` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetpeername(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { name(socket, addr, addrlen, true) }
}

/// `rgetsockname`.
///
/// # Safety
/// `addr`/`addrlen` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetsockname(
    socket: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { name(socket, addr, addrlen, false) }
}

/// `rsetsockopt`: int options (SO_REUSEADDR, SO_KEEPALIVE, SO_SNDBUF, SO_RCVBUF,
/// SO_LINGER, TCP_NODELAY, TCP_KEEPIDLE, TCP_MAXSEG, SOL_RDMA's sizes); others EOPNOTSUPP.
///
/// # Safety
/// `optval` NULL or valid for `optlen` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: socklen_t,
) -> c_int {
    guard(err(libc::EIO), || {
        // RDMA_ROUTE carries a path record, SO_LINGER a struct: neither is read.
        let v = if !optval.is_null() && optlen as usize >= std::mem::size_of::<c_int>() {
            // SAFETY: per the contract, at least an int.
            unsafe { optval.cast::<c_int>().read_unaligned() }
        } else if optval.is_null() && optlen > 0 {
            return err(libc::EFAULT);
        } else {
            0
        };
        rs_ret(crate::rsocket::c_setsockopt(socket, level, optname, v))
    })
}

/// `rgetsockopt`: int options, as `rsetsockopt`, and SO_ERROR.
///
/// # Safety
/// `optval`/`optlen` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut socklen_t,
) -> c_int {
    guard(err(libc::EIO), || {
        if optval.is_null() || optlen.is_null() {
            return err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        if (unsafe { *optlen } as usize) < std::mem::size_of::<c_int>() {
            return err(libc::EINVAL);
        }
        match crate::rsocket::c_getsockopt(socket, level, optname) {
            Ok(v) => {
                // SAFETY: per the contract, room for an int.
                unsafe {
                    optval.cast::<c_int>().write_unaligned(v);
                    *optlen = std::mem::size_of::<c_int>() as socklen_t;
                }
                0
            }
            Err(e) => err(e),
        }
    })
}

/// `rfcntl(socket, F_GETFL)` / `rfcntl(socket, F_SETFL, flags)`: only O_NONBLOCK means
/// anything. (Declared variadic in C; its one integer argument arrives as a named one
/// would on x86-64 and aarch64 Linux.)
#[unsafe(no_mangle)]
pub extern "C" fn rfcntl(socket: c_int, cmd: c_int, arg: c_int) -> c_int {
    guard(err(libc::EIO), || {
        match crate::rsocket::c_fcntl(socket, cmd, arg) {
            Ok(v) => v,
            Err(e) => err(e),
        }
    })
}

/// `riomap`: registers `len` bytes at `buf` on a connected rsocket; with `PROT_WRITE` the
/// peer may `riowrite` into them at `offset` (-1: the buffer's address), which is returned.
/// -1 with errno: EBADF, EINVAL (not connected, other protection bits, NULL `buf`),
/// ENOMEM (the peer's iomap table is full or it has none).
///
/// # Safety
/// `buf..buf + len` stays mapped until `riounmap` of it or `rclose` of the socket.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    guard(-1, || {
        if buf.is_null() {
            return libc::off_t::from(err(libc::EINVAL));
        }
        // SAFETY: per the contract.
        match unsafe { crate::rsocket::c_iomap(socket, buf.cast(), len, prot, offset) } {
            Ok(o) => o,
            Err(e) => libc::off_t::from(err(e)),
        }
    })
}

/// `riounmap`: drops the mapping of `len` bytes at `buf` (EINVAL if there is none).
#[unsafe(no_mangle)]
pub extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int {
    guard(-1, || {
        rs_ret(crate::rsocket::c_iounmap(socket, buf.cast(), len))
    })
}

/// `riowrite`: writes `count` bytes at `offset` of the peer's mappings (plain RDMA WRITEs);
/// the bytes written, which stop short at the first offset the peer has not mapped (0 if
/// none is), or -1 with errno (EBADF, ENOTCONN, EFAULT for a NULL `buf`, EAGAIN,
/// ECONNRESET).
///
/// # Safety
/// `buf` valid for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(b) = (unsafe { bytes(buf, count) }) else {
            return rs_len(Err(libc::EFAULT));
        };
        rs_len(crate::rsocket::c_iowrite(socket, b, offset, flags))
    })
}
