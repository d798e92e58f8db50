//! The few Linux calls std does not expose, shared by the engine and the UDP driver: raw
//! socket options, socket addresses, a socket's queued bytes, eventfd, poll and epoll; the
//! interface MTU. The UDP socket itself, its options and batches are `udp`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `setsockopt` with an int as the value.
pub(crate) fn setsockopt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    setsockopt_struct(fd, level, name, &value)
}

/// `getsockopt` of an int.
pub(crate) fn getsockopt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes through the pointer, which points to a
    // live int of that size, and `len` to a live socklen_t.
    if unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &mut len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// The bytes of the first datagram queued on UDP socket `fd` (`FIONREAD`): 0 when none is
/// (or the first is empty).
pub(crate) fn bytes_queued(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points to a live int.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// A non-blocking eventfd: the wake-up line of the progress thread and of completion channels.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An epoll instance: one descriptor that polls readable while any descriptor added to it
/// ([`epoll_add`]) is (level-triggered). A descriptor leaves it when it is closed.
pub(crate) fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with a constant flag.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by epoll_create1 and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to epoll instance `ep`, watched for input.
pub(crate) fn epoll_add(ep: &OwnedFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: `ev` is a live epoll_event; the kernel validates both descriptors.
    let r = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The descriptors of epoll instance `ep` that are ready now (added with [`epoll_add`]),
/// at most `out.len()`; returns how many it wrote.
pub(crate) fn epoll_ready(ep: &OwnedFd, out: &mut [RawFd]) -> usize {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let max = out.len().min(evs.len()) as libc::c_int;
    // SAFETY: `evs` holds at least `max` live epoll_event structs; no wait.
    let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), max, 0) };
    let n = n.max(0) as usize;
    for (o, e) in out.iter_mut().zip(&evs[..n]) {
        *o = e.u64 as RawFd;
    }
    n
}

/// A blocking eventfd, for a completion channel whose descriptor the application owns in
/// effect: it may poll it or set O_NONBLOCK itself, and `ibv_get_cq_event` must then
/// follow that mode, so the descriptor starts in blocking mode as rdma-core's does.
pub(crate) fn eventfd_blocking() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clears an eventfd that may be in blocking mode: reads it only if `poll` says it is
/// readable (another reader between the two can only make the read find 0, never block,
/// because the descriptor's readers all go through here).
pub(crate) fn drain_polled(fd: &OwnedFd) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from an eventfd we own.
        let _ = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

/// Reads process `pid`'s memory at the spans `remote` (address, length) into this
/// process's spans `local`, in order (`process_vm_readv`); at most 1024 spans a side.
/// Returns the bytes read: fewer than asked when a remote span is not mapped (the read
/// stops there).
///
/// # Safety
/// Every local span is writable memory of this process that nothing else reads or writes
/// until the call returns.
pub(crate) unsafe fn pull(
    pid: i32,
    local: &[(u64, u64)],
    remote: &[(u64, u64)],
) -> io::Result<usize> {
    const MAX: usize = 1024;
    if local.len() > MAX || remote.len() > MAX {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let iov = |&(a, n): &(u64, u64)| libc::iovec {
        iov_base: a as usize as *mut libc::c_void,
        iov_len: n as usize,
    };
    let l: Vec<libc::iovec> = local.iter().map(iov).collect();
    let r: Vec<libc::iovec> = remote.iter().map(iov).collect();
    // SAFETY: the iovec arrays are live for the call and as long as stated. The kernel
    // writes only into the local spans, writable memory the caller vouched for; the remote spans are checked by the kernel against the other process's
    // mappings (EFAULT), never dereferenced here.
    let n = unsafe {
        libc::process_vm_readv(
            pid,
            l.as_ptr(),
            l.len() as libc::c_ulong,
            r.as_ptr(),
            r.len() as libc::c_ulong,
            0,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Has the C library call `f` when the process exits through `exit` (or returns from
/// `main`), as `atexit`. False when it refused (no room).
pub(crate) fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function that lives as long as the program (this library is
    // never unloaded while the process runs: it is linked in, or preloaded by name).
    unsafe { libc::atexit(f) == 0 }
}

/// The CPUs the kernel may bring online (its `num_possible_cpus()`: `_SC_NPROCESSORS_CONF`),
/// at least 1.
pub(crate) fn possible_cpus() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    u32::try_from(n).unwrap_or(1).max(1)
}

/// CPUs online on this host (at least 1).
pub(crate) fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Adds one to an eventfd.
pub(crate) fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; a full counter (EAGAIN) is
    // fine: the reader wakes anyway.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// Reads (and so clears) an eventfd; returns the count, 0 if it was not signalled.
pub(crate) fn drain(fd: &OwnedFd) -> u64 {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
    let r = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    if r == 8 { v } else { 0 }
}

/// Waits until one of `fds` is readable or `timeout` passes. Returns which are readable.
/// Fixed-size in and out: the progress thread calls this on every wake.
pub(crate) fn poll_readable<const N: usize>(
    fds: [RawFd; N],
    timeout: Option<Duration>,
) -> io::Result<[bool; N]> {
    let mut p = pollfds(fds);
    // Round up so a timer is never polled too early.
    let ms = timeout.map_or(-1, |t| {
        t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int
    });
    // SAFETY: `p` is a live array of `N` pollfd structs.
    let r = unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, ms) };
    readable(r, &p)
}

/// [`poll_readable`] to the nanosecond (`ppoll`): for a deadline that must not be rounded
/// up to the next millisecond (a paced QP's next packet).
pub(crate) fn poll_readable_precise<const N: usize>(
    fds: [RawFd; N],
    timeout: Option<Duration>,
) -> io::Result<[bool; N]> {
    let mut p = pollfds(fds);
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` is a live array of `N` pollfd structs; `tsp` is null or points at `ts`,
    // which outlives the call; no signal mask is passed.
    let r = unsafe { libc::ppoll(p.as_mut_ptr(), N as libc::nfds_t, tsp, std::ptr::null()) };
    readable(r, &p)
}

/// `fds` waited on for input.
fn pollfds<const N: usize>(fds: [RawFd; N]) -> [libc::pollfd; N] {
    fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    })
}

/// What a `poll`/`ppoll` that returned `r` says of `p`: which are readable (or in error,
/// which a read reports); none when a signal cut the wait short.
fn readable<const N: usize>(r: libc::c_int, p: &[libc::pollfd; N]) -> io::Result<[bool; N]> {
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok([false; N]);
        }
        return Err(e);
    }
    Ok(p.map(|x| x.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0))
}

/// `setsockopt` with a C struct as the value.
pub(crate) fn setsockopt_struct<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` is a live T and its size is passed; the kernel validates `fd` and reads
    // no more than that.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(crate) fn to_sockaddr(
    addr: std::net::SocketAddr,
    out: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in and sockaddr_in6;
    // the written struct is fully initialised (zeroed first).
    unsafe {
        std::ptr::write_bytes(out as *mut libc::sockaddr_storage, 0, 1);
        match addr {
            std::net::SocketAddr::V4(a) => {
                let sin = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr = libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                };
                size_of::<libc::sockaddr_in>() as libc::socklen_t
            }
            std::net::SocketAddr::V6(a) => {
                let sin6 = &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr = libc::in6_addr {
                    s6_addr: a.ip().octets(),
                };
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_scope_id = a.scope_id();
                size_of::<libc::sockaddr_in6>() as libc::socklen_t
            }
        }
    }
}

pub(crate) fn from_sockaddr(s: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(std::net::SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(std::net::SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The MTU of the interface that holds `addr` — for any loopback address, the loopback
/// interface's (rxe gives a device on `lo` its MTU) — or None if no interface does.
pub(crate) fn interface_mtu(addr: std::net::IpAddr) -> Option<u32> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return None;
    }
    let mut name = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points to a sockaddr of the family it names, at most
            // sockaddr_storage in size; we copy only the bytes that family defines.
            let sa = unsafe {
                let mut st: libc::sockaddr_storage = std::mem::zeroed();
                let len = match (*ifa.ifa_addr).sa_family as libc::c_int {
                    libc::AF_INET => size_of::<libc::sockaddr_in>(),
                    libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
                    _ => 0,
                };
                std::ptr::copy_nonoverlapping(
                    ifa.ifa_addr.cast::<u8>(),
                    (&raw mut st).cast::<u8>(),
                    len,
                );
                from_sockaddr(&st)
            };
            let exact = sa.is_some_and(|a| a.ip() == addr);
            // Every address of 127.0.0.0/8 (and ::1) is the loopback interface's, though
            // it holds only 127.0.0.1: the kernel routes them all there.
            let looped = addr.is_loopback()
                && sa.is_some_and(|a| a.ip().is_loopback() && a.is_ipv4() == addr.is_ipv4());
            if exact || (looped && name.is_none()) {
                // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
                let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                name = Some(n.to_string_lossy().into_owned());
                if exact {
                    break;
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    let name = name?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loopback_address_has_the_loopback_interfaces_mtu() {
        let lo = interface_mtu("127.0.0.1".parse().unwrap());
        assert!(lo.is_some(), "no interface holds 127.0.0.1");
        assert_eq!(interface_mtu("127.0.77.9".parse().unwrap()), lo);
        assert_eq!(
            interface_mtu("192.0.2.77".parse().unwrap()),
            None,
            "TEST-NET-1"
        );
    }
}
