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
/// Fixed-size in and out: the progress thread calls this on every wake.
pub(crate) fn poll_readable<const N: usize>(
    fds: [RawFd; N],
    timeout: Option<Duration>,
) -> io::Result<[bool; N]> {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // Round up so a timer is never polled too early.
    let ms = timeout.map_or(-1, |t| {
        t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int
    });
    // SAFETY: `p` is a live array of `N` pollfd structs.
    let r = unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok([false; N]);
        }
        return Err(e);
    }
    Ok(p.map(|x| x.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0))
}

fn to_sockaddr(addr: std::net::SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
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

fn from_sockaddr(s: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
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

/// A batch of datagrams for `recvmmsg`/`sendmmsg`: fixed buffers allocated once, so the data
/// path allocates nothing per packet and makes one syscall per batch.
pub(crate) struct Batch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    addrs: Vec<libc::sockaddr_storage>,
    addr_lens: Vec<libc::socklen_t>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    n: usize,
}

// SAFETY: the raw pointers inside `iovs`/`hdrs` only ever point into this struct's own
// buffers, are rebuilt right before each syscall, and are never dereferenced elsewhere.
unsafe impl Send for Batch {}

impl Batch {
    /// `count` slots of `size` bytes.
    pub(crate) fn new(count: usize, size: usize) -> Batch {
        // SAFETY: all-zero is a valid value for these plain C structs.
        let zero_addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        Batch {
            bufs: vec![vec![0u8; size]; count],
            lens: vec![0; count],
            addrs: vec![zero_addr; count],
            addr_lens: vec![0; count],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                count
            ],
            hdrs: vec![zero_hdr; count],
            n: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    pub(crate) fn is_full(&self) -> bool {
        self.n == self.bufs.len()
    }

    /// The next free slot's buffer, to fill before [`Batch::commit`].
    pub(crate) fn slot(&mut self) -> &mut [u8] {
        &mut self.bufs[self.n]
    }

    /// Queues the first `len` bytes of the current slot for `dst`.
    pub(crate) fn commit(&mut self, len: usize, dst: std::net::SocketAddr) {
        self.lens[self.n] = len;
        self.addr_lens[self.n] = to_sockaddr(dst, &mut self.addrs[self.n]);
        self.n += 1;
    }

    /// Datagram `i` of the last receive.
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], std::net::SocketAddr)> {
        let addr = from_sockaddr(&self.addrs[i])?;
        Some((&self.bufs[i][..self.lens[i]], addr))
    }

    fn prepare(&mut self, count: usize, recv: bool) {
        for i in 0..count {
            let len = if recv {
                self.bufs[i].len()
            } else {
                self.lens[i]
            };
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: len,
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&raw mut self.addrs[i]).cast();
            h.msg_namelen = if recv {
                size_of::<libc::sockaddr_storage>() as libc::socklen_t
            } else {
                self.addr_lens[i]
            };
            h.msg_iov = &raw mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }

    /// Receives up to a batch without blocking; returns how many datagrams arrived.
    pub(crate) fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let count = self.bufs.len();
        self.prepare(count, true);
        // SAFETY: `hdrs[..count]` are initialised and point into live buffers of this batch
        // (rebuilt by `prepare` just now); the kernel writes at most the given lengths.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            self.n = 0;
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        self.n = r as usize;
        for i in 0..self.n {
            self.lens[i] = self.hdrs[i].msg_len as usize;
        }
        Ok(self.n)
    }

    /// Sends every queued datagram (one `sendmmsg` per kernel-accepted run); returns how many
    /// the kernel refused. The batch is empty afterwards.
    pub(crate) fn send(&mut self, fd: RawFd) -> usize {
        let count = self.n;
        self.prepare(count, false);
        let mut done = 0;
        let mut refused = 0;
        while done < count {
            // SAFETY: `hdrs[done..count]` are initialised by `prepare` and point into this
            // batch's live buffers and addresses.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[done..].as_mut_ptr(),
                    (count - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r <= 0 {
                // Socket buffer full or an error for the datagram at `done`: drop it (the
                // transport retransmits) and go on with the rest.
                refused += 1;
                done += 1;
            } else {
                done += r as usize;
            }
        }
        self.n = 0;
        refused
    }
}
