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

const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments the kernel takes in one UDP_SEGMENT send (UDP_MAX_SEGMENTS).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes of one UDP datagram before segmentation (IPv4: 65535 - 20 - 8).
const GSO_MAX_BYTES: usize = 65507;
/// Receive buffer of one (possibly GRO-coalesced) datagram.
pub(crate) const RX_BUF: usize = 65536;

/// Asks the kernel to hand over coalesced runs of same-sized datagrams (UDP_GRO). Returns
/// whether it agreed (older kernels do not know the option).
pub(crate) fn set_gro(fd: RawFd) -> bool {
    setsockopt(fd, SOL_UDP, UDP_GRO, 1).is_ok()
}

/// Control-message space of one message: a cmsghdr plus a u16/int, rounded up (CMSG_SPACE).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Cmsg([u8; 32]);

fn sockaddr_eq(
    a: &libc::sockaddr_storage,
    alen: libc::socklen_t,
    b: &libc::sockaddr_storage,
    blen: libc::socklen_t,
) -> bool {
    if alen != blen {
        return false;
    }
    // SAFETY: both point to at least `alen` initialised bytes (written by `to_sockaddr`).
    unsafe {
        std::slice::from_raw_parts(
            (a as *const libc::sockaddr_storage).cast::<u8>(),
            alen as usize,
        ) == std::slice::from_raw_parts(
            (b as *const libc::sockaddr_storage).cast::<u8>(),
            alen as usize,
        )
    }
}

/// Most pieces (iovecs) one datagram may be sent from.
pub(crate) const MAX_PARTS: usize = 40;
/// Most iovecs in one message (UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// Datagrams to send with `sendmmsg`: fixed buffers allocated once, so the data path allocates
/// nothing per packet. A datagram is its slot's bytes, or pieces: headers in the slot and
/// payload straight from registered memory (zero-copy). Runs of same-sized datagrams to one
/// destination go out as one UDP GSO message (UDP_SEGMENT: the kernel cuts it into the
/// datagrams, one skb through the stack on loopback and veth), when the caller allows it.
pub(crate) struct TxBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    gso_ok: Vec<bool>,
    addrs: Vec<libc::sockaddr_storage>,
    addr_lens: Vec<libc::socklen_t>,
    /// Every queued datagram's pieces, in order; slot `i` owns `parts[first[i]..first[i + 1]]`.
    parts: Vec<libc::iovec>,
    first: Vec<usize>,
    np: usize,
    hdrs: Vec<libc::mmsghdr>,
    /// Datagrams in each prepared message.
    segs: Vec<usize>,
    ctrl: Vec<Cmsg>,
    n: usize,
    /// Cleared when the kernel refuses UDP_SEGMENT; every datagram then goes alone.
    gso: bool,
    /// GSO messages sent (for the counters).
    pub(crate) gso_messages: u64,
}

// SAFETY: the raw pointers inside `parts`/`hdrs` point into this struct's own buffers or into
// registered memory the device keeps alive and locked until the batch is sent (a batch is
// always sent before the device lock is released); they are never dereferenced here.
unsafe impl Send for TxBatch {}

impl TxBatch {
    /// `count` slots of `size` bytes.
    pub(crate) fn new(count: usize, size: usize) -> TxBatch {
        // SAFETY: all-zero is a valid value for these plain C structs.
        let zero_addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        let iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        TxBatch {
            bufs: vec![vec![0u8; size]; count],
            lens: vec![0; count],
            gso_ok: vec![false; count],
            addrs: vec![zero_addr; count],
            addr_lens: vec![0; count],
            parts: vec![iov; count * 3 + MAX_PARTS],
            first: vec![0; count + 1],
            np: 0,
            hdrs: vec![zero_hdr; count],
            segs: vec![0; count],
            ctrl: vec![Cmsg([0; 32]); count],
            n: 0,
            gso: true,
            gso_messages: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// True when the next datagram might not fit: send the batch before building another.
    pub(crate) fn is_full(&self) -> bool {
        self.n == self.bufs.len() || self.np + MAX_PARTS > self.parts.len()
    }

    /// The next free slot's buffer, to fill before [`TxBatch::commit`].
    pub(crate) fn slot(&mut self) -> &mut [u8] {
        &mut self.bufs[self.n]
    }

    /// Queues the first `len` bytes of the current slot for `dst`; `gso` allows sending it in
    /// one segmented message with its same-sized neighbours to the same destination.
    pub(crate) fn commit(&mut self, len: usize, dst: std::net::SocketAddr, gso: bool) {
        let base = self.bufs[self.n].as_mut_ptr();
        self.commit_parts(len, dst, gso, [(base.cast_const(), len)]);
    }

    /// Queues the current slot's datagram of `len` bytes for `dst`, sent from `parts` in
    /// order (addresses in the slot or in registered memory; at most [`MAX_PARTS`], lengths
    /// summing to `len`). The memory must stay valid and unchanged until the batch is sent.
    pub(crate) fn commit_parts(
        &mut self,
        len: usize,
        dst: std::net::SocketAddr,
        gso: bool,
        parts: impl IntoIterator<Item = (*const u8, usize)>,
    ) {
        self.first[self.n] = self.np;
        for (ptr, l) in parts.into_iter().take(MAX_PARTS) {
            self.parts[self.np] = libc::iovec {
                iov_base: ptr.cast_mut().cast(),
                iov_len: l,
            };
            self.np += 1;
        }
        self.lens[self.n] = len;
        self.gso_ok[self.n] = gso;
        self.addr_lens[self.n] = to_sockaddr(dst, &mut self.addrs[self.n]);
        self.n += 1;
        self.first[self.n] = self.np;
    }

    /// Groups the queued datagrams into messages; returns the message count.
    fn prepare(&mut self) -> usize {
        let mut m = 0;
        let mut i = 0;
        while i < self.n {
            let seg = self.lens[i];
            let mut k = 1;
            let mut total = seg;
            if self.gso && self.gso_ok[i] {
                while i + k < self.n
                    && k < GSO_MAX_SEGMENTS
                    && self.gso_ok[i + k]
                    && self.lens[i + k - 1] == seg
                    && self.lens[i + k] <= seg
                    && total + self.lens[i + k] <= GSO_MAX_BYTES
                    && self.first[i + k + 1] - self.first[i] <= MAX_IOV
                    && sockaddr_eq(
                        &self.addrs[i],
                        self.addr_lens[i],
                        &self.addrs[i + k],
                        self.addr_lens[i + k],
                    )
                {
                    total += self.lens[i + k];
                    k += 1;
                }
            }
            let h = &mut self.hdrs[m].msg_hdr;
            h.msg_name = (&raw mut self.addrs[i]).cast();
            h.msg_namelen = self.addr_lens[i];
            h.msg_iov = &raw mut self.parts[self.first[i]];
            h.msg_iovlen = self.first[i + k] - self.first[i];
            h.msg_flags = 0;
            if k > 1 {
                let c = &mut self.ctrl[m];
                h.msg_control = c.0.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE is pure arithmetic.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
                // SAFETY: `msg_control` points to 32 writable, 8-aligned bytes, enough for
                // CMSG_SPACE(2) = 24; CMSG_FIRSTHDR returns a pointer inside them.
                unsafe {
                    let cm = libc::CMSG_FIRSTHDR(h);
                    (*cm).cmsg_level = SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(2) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg as u16);
                }
            } else {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
            self.hdrs[m].msg_len = 0;
            self.segs[m] = k;
            m += 1;
            i += k;
        }
        m
    }

    /// Sends every queued datagram; returns how many the kernel refused. The batch is empty
    /// afterwards.
    pub(crate) fn send(&mut self, fd: RawFd) -> usize {
        let count = self.prepare();
        let mut done = 0;
        let mut refused = 0;
        let mut slot = 0;
        while done < count {
            // SAFETY: `hdrs[done..count]` were initialised by `prepare` and point into this
            // batch's live iovecs, control buffers and addresses, and the iovecs into live
            // slots or locked registered memory.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[done..].as_mut_ptr(),
                    (count - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                for m in done..done + r as usize {
                    if self.segs[m] > 1 {
                        self.gso_messages += 1;
                    }
                    slot += self.segs[m];
                }
                done += r as usize;
                continue;
            }
            let e = io::Error::last_os_error().raw_os_error();
            let k = self.segs[done];
            if k > 1
                && matches!(
                    e,
                    Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
                )
            {
                // This path cannot segment: never ask again; resend these datagrams singly.
                self.gso = false;
                refused += self.resend_singly(fd, slot, k);
            } else {
                // Socket buffer full or an error for this message: drop it (the transport
                // retransmits) and go on with the rest.
                refused += k;
            }
            slot += k;
            done += 1;
        }
        self.n = 0;
        self.np = 0;
        refused
    }

    fn resend_singly(&mut self, fd: RawFd, first: usize, k: usize) -> usize {
        let mut refused = 0;
        for j in first..first + k {
            // SAFETY: a plain msghdr over slot `j`'s iovecs and address, all live (see `send`).
            let r = unsafe {
                let mut h: libc::msghdr = std::mem::zeroed();
                h.msg_name = (&raw mut self.addrs[j]).cast();
                h.msg_namelen = self.addr_lens[j];
                h.msg_iov = &raw mut self.parts[self.first[j]];
                h.msg_iovlen = self.first[j + 1] - self.first[j];
                libc::sendmsg(fd, &h, libc::MSG_DONTWAIT)
            };
            if r < 0 {
                refused += 1;
            }
        }
        refused
    }
}

/// Datagrams received with `recvmmsg`, buffers allocated once. With UDP_GRO on the socket a
/// buffer may hold a run of same-sized datagrams; [`RxBatch::get`] says the segment size.
pub(crate) struct RxBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    segs: Vec<usize>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    ctrl: Vec<Cmsg>,
    n: usize,
    /// Whether every message was armed once (later calls re-arm only the used ones).
    armed: bool,
}

// SAFETY: as for TxBatch: pointers into own heap buffers only (they never move), re-armed
// before each syscall that could use them.
unsafe impl Send for RxBatch {}

impl RxBatch {
    /// `count` buffers of `size` bytes.
    pub(crate) fn new(count: usize, size: usize) -> RxBatch {
        // SAFETY: all-zero is a valid value for these plain C structs.
        let zero_addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        RxBatch {
            bufs: vec![vec![0u8; size]; count],
            lens: vec![0; count],
            segs: vec![0; count],
            addrs: vec![zero_addr; count],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                count
            ],
            hdrs: vec![zero_hdr; count],
            ctrl: vec![Cmsg([0; 32]); count],
            n: 0,
            armed: false,
        }
    }

    /// Buffer `i` of the last receive: its bytes, the sender, and the size of the datagrams
    /// it holds back to back (the last may be shorter).
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], std::net::SocketAddr, usize)> {
        let addr = from_sockaddr(&self.addrs[i])?;
        Some((&self.bufs[i][..self.lens[i]], addr, self.segs[i]))
    }

    /// Points message `i` at its buffer, address and control space (all heap storage that
    /// never moves), with the lengths the kernel is allowed to fill.
    fn arm(&mut self, i: usize) {
        self.iovs[i] = libc::iovec {
            iov_base: self.bufs[i].as_mut_ptr().cast(),
            iov_len: self.bufs[i].len(),
        };
        let h = &mut self.hdrs[i].msg_hdr;
        h.msg_name = (&raw mut self.addrs[i]).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &raw mut self.iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = self.ctrl[i].0.as_mut_ptr().cast();
        h.msg_controllen = size_of::<Cmsg>();
        h.msg_flags = 0;
        self.hdrs[i].msg_len = 0;
    }

    /// Receives up to a batch without blocking; returns how many buffers were filled.
    /// Only the messages the previous call filled are re-armed: a poll that finds nothing
    /// costs the syscall alone.
    pub(crate) fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let count = self.bufs.len();
        let rearm = if self.armed { self.n } else { count };
        for i in 0..rearm {
            self.arm(i);
        }
        self.armed = true;
        // SAFETY: `hdrs[..count]` were armed (now or after the call that last used them) and
        // point into live heap buffers, addresses and control buffers of this batch; the
        // kernel writes at most their lengths.
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
            let len = self.hdrs[i].msg_len as usize;
            self.lens[i] = len;
            self.segs[i] = len;
            let h = &self.hdrs[i].msg_hdr;
            // SAFETY: the kernel filled `msg_controllen` bytes of our control buffer with
            // well-formed cmsgs; CMSG_FIRSTHDR/NXTHDR stay inside it.
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(h);
                while !cm.is_null() {
                    if (*cm).cmsg_level == SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                        let seg = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<u16>());
                        if seg > 0 {
                            self.segs[i] = seg as usize;
                        }
                    }
                    cm = libc::CMSG_NXTHDR(h, cm);
                }
            }
        }
        Ok(self.n)
    }
}

/// The MTU of the interface that holds `addr` (None if no interface does).
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
            if sa.is_some_and(|a| a.ip() == addr) {
                // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
                let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                name = Some(n.to_string_lossy().into_owned());
                break;
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
