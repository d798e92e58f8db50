//! The few Linux socket calls std does not expose: path-MTU discovery ("don't fragment", so
//! the kernel sends IPv4 ID 0 from an unconnected socket and the ICRC is predictable), zero
//! UDP checksums on IPv6 receive, eventfd and poll.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn setsockopt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and its size is passed; the kernel validates `fd`.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets DF (IP_PMTUDISC_DO) so Linux sends IPv4 ID 0 from an unconnected socket.
pub(crate) fn set_dont_fragment(fd: RawFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Accepts IPv6 UDP datagrams with checksum 0, which rxe and RoCE NICs send.
pub(crate) fn set_no_check6_rx(fd: RawFd) -> io::Result<()> {
    const UDP_NO_CHECK6_RX: libc::c_int = 102;
    setsockopt(fd, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
}

/// Larger socket buffers: a burst of MTU-sized packets must not overflow the default.
pub(crate) fn set_buffers(fd: RawFd, bytes: libc::c_int) {
    // Best effort: a smaller buffer only costs retransmissions.
    let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes);
    let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes);
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
pub(crate) fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // Round up so a timer is never polled too early.
    let ms = timeout.map_or(-1, |t| {
        t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int
    });
    // SAFETY: `p` is a live array of `p.len()` pollfd structs.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(p.iter()
        .map(|x| x.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
        .collect())
}
