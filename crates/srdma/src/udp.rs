//! The UDP driver: the socket a device sends and receives RoCEv2 on, shared with this host's
//! other srdma processes on the RoCEv2 port (see `portshare`), with the options the engine
//! relies on (DF, zero IPv6 checksums accepted, large buffers, GRO, non-blocking); the
//! driver the engine sends and receives through ([`Udp`], a [`Driver`]: ICRCs computed here,
//! payloads sent straight from registered memory), with its batches: `sendmmsg` with UDP GSO
//! ([`TxBatch`]), `recvmmsg` with UDP GRO, or one `recvfrom` a busy look while traffic is
//! sparse ([`RxBatch`]); and the socket of each IPv4 multicast group the device's UD QPs are
//! attached to ([`join_group`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use srdma_wire::{Packet, Position};

use crate::driver::{Driver, Frame, GsoJoin, Outgoing, Payload, Received, Via};
use crate::error::{Result, io_err};
use crate::sys::{from_sockaddr, getsockopt, setsockopt, setsockopt_struct, to_sockaddr};

/// A device's socket.
pub(crate) struct Socket {
    /// The socket, bound to the device's address and port.
    pub(crate) socket: UdpSocket,
    /// Where it is bound.
    pub(crate) local: SocketAddr,
    /// The slot of a shared port (the device owns the QPNs `slot << 16 | n`); 0 unshared.
    pub(crate) slot: u8,
    /// The connection to the port keeper while the slot is ours.
    pub(crate) keeper: Option<OwnedFd>,
    /// Whether the kernel took UDP_GRO (see [`RxBatch`]: off again while traffic is sparse).
    pub(crate) gro: bool,
    /// The receive buffer the kernel granted, in the bytes it charges (see [`set_buffers`]).
    pub(crate) rcvbuf: usize,
}

/// Opens a device's socket, bound to `bind`, with what `cfg` says: on the RoCEv2 port,
/// `share_port` shares the address with this host's other srdma processes; `ecn`: what it
/// sends is ECN-capable; `udp_buffer`: the socket buffers asked for.
pub(crate) fn open(bind: SocketAddr, cfg: &crate::DeviceConfig) -> Result<Socket> {
    let crate::DeviceConfig {
        share_port,
        ecn,
        udp_buffer,
        ..
    } = *cfg;
    // On the RoCEv2 port, share the address with this host's other srdma processes
    // (see portshare); the slot numbers our QPs.
    let share = if bind.port() == srdma_wire::ROCEV2_PORT && share_port {
        crate::portshare::acquire(bind).ok()
    } else {
        None
    };
    let (socket, slot, keeper) = match share {
        Some(s) => (s.socket, s.slot, Some(s.keeper)),
        None => (
            UdpSocket::bind(bind).map_err(io_err(format!("binding UDP {bind}")))?,
            0,
            None,
        ),
    };
    let fd = socket.as_raw_fd();
    let v6 = bind.is_ipv6();
    set_dont_fragment(fd, v6).map_err(io_err("setting IP_MTU_DISCOVER"))?;
    if v6 {
        set_no_check6_rx(fd).map_err(io_err("setting UDP_NO_CHECK6_RX"))?;
    }
    let rcvbuf = set_buffers(fd, udp_buffer);
    // Best effort: ECN marks of what arrives are read (a receive that cannot tell answers
    // no CE with a CNP), and what leaves is ECT(0) as from a RoCE NIC.
    let _ = set_ecn(fd, v6, ecn);
    // Multicast (IPv4 only) leaves with the TTL of unicast (64, what rdma_cm's address
    // handles say and rxe puts in the header), not the socket default of 1.
    if !v6 {
        let _ = setsockopt(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 64);
    }
    // Best effort: without GRO every datagram is its own buffer, as before.
    let gro = set_gro(fd, true);
    socket
        .set_nonblocking(true)
        .map_err(io_err("making the socket non-blocking"))?;
    let local = socket
        .local_addr()
        .map_err(io_err("reading the bound address"))?;
    Ok(Socket {
        socket,
        local,
        slot,
        keeper,
        gro,
        rcvbuf,
    })
}

/// Opens a socket that receives IPv4 multicast group `group` on the device at `local`: bound
/// to GROUP:PORT (so it takes that group's datagrams and no one else's; `SO_REUSEADDR`, as
/// every process of the host that joins the group binds the same), a member of the group on
/// the interface of the device's address, non-blocking. Leaving the group is closing it.
pub(crate) fn join_group(group: Ipv4Addr, local: Ipv4Addr, port: u16) -> io::Result<UdpSocket> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let socket = unsafe { UdpSocket::from_raw_fd(fd) };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = to_sockaddr(SocketAddr::new(IpAddr::V4(group), port), &mut ss);
    // SAFETY: `ss` holds a sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, (&raw const ss).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let m = libc::ip_mreqn {
        imr_multiaddr: libc::in_addr {
            s_addr: u32::from(group).to_be(),
        },
        imr_address: libc::in_addr {
            s_addr: u32::from(local).to_be(),
        },
        imr_ifindex: 0,
    };
    setsockopt_struct(fd, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &m)?;
    let _ = set_buffers(fd, 1 << 20);
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The ECN codepoint ECT(0): ECN-capable transport (RFC 3168), what RoCE NICs send.
pub(crate) const ECT0: u8 = 0b10;

/// Asks for the traffic class of every datagram received (ECN marks: `IP_RECVTOS`,
/// `IPV6_RECVTCLASS`) and, with `mark`, sends ECT(0) (`IP_TOS` / `IPV6_TCLASS` 0x02: the
/// socket is shared with the host's other srdma processes, which all mark alike).
pub(crate) fn set_ecn(fd: RawFd, ipv6: bool, mark: bool) -> io::Result<()> {
    let tc = if mark { libc::c_int::from(ECT0) } else { 0 };
    if ipv6 {
        setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
        setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tc)
    } else {
        setsockopt(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
        setsockopt(fd, libc::IPPROTO_IP, libc::IP_TOS, tc)
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
/// Returns the receive buffer granted, as the kernel counts it (datagrams are charged more
/// than their bytes). The kernel takes at most `net.core.rmem_max` / `wmem_max` of what is
/// asked and doubles what it takes: 8 MiB asked where the limit is 4 MiB (this project's
/// test machines) is 8 MiB granted, on a stock Debian (208 KiB) 416 KiB. When that is less
/// than `bytes`, a process allowed to (CAP_NET_ADMIN: root, as under `srdma exec` in a
/// test) asks for half of it past the limit (`SO_RCVBUFFORCE`), which the kernel doubles.
pub(crate) fn set_buffers(fd: RawFd, bytes: usize) -> usize {
    let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // Best effort: a smaller buffer only costs retransmissions (or throughput: over UDP the
    // engine keeps within half the receive buffer, see `engine::share`).
    for (set, force) in [
        (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
        (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
    ] {
        let _ = setsockopt(fd, libc::SOL_SOCKET, set, bytes);
        if getsockopt(fd, libc::SOL_SOCKET, set).is_ok_and(|got| got < bytes) {
            let _ = setsockopt(fd, libc::SOL_SOCKET, force, bytes / 2);
        }
    }
    getsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)
        .ok()
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(0)
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

/// Asks the kernel to hand over coalesced runs of same-sized datagrams (UDP_GRO), or (`on`
/// false) every datagram alone again. Returns whether it agreed (older kernels do not know
/// the option).
pub(crate) fn set_gro(fd: RawFd, on: bool) -> bool {
    setsockopt(fd, SOL_UDP, UDP_GRO, libc::c_int::from(on)).is_ok()
}

/// Control-message space of one message: a cmsghdr plus a u16/int, rounded up (CMSG_SPACE).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Cmsg([u8; 64]);

/// Most pieces (iovecs) one datagram may be sent from.
pub(crate) const MAX_PARTS: usize = 40;
/// Most iovecs in one message (UIO_MAXIOV).
const MAX_IOV: usize = 1024;

/// How many datagrams that join only their own size ([`GsoJoin::SameSize`]: bare ACKs) wait
/// to go behind the rest of a batch: as many as the engine's batch holds (a receive pass
/// over many QPs acknowledges them all), so that they never make it flush sooner.
const LATE_MAX: usize = 128;

/// Datagrams of [`GsoJoin::SameSize`] (bare ACKs that are no request's tail), kept out of
/// the batch until it is sent and then queued behind the rest, while the engine sends what
/// deferred posts and receives left for a poll (`TxBatch::acks_behind`): interleaved with other
/// datagrams (a server's replies and its ACKs to many QPs after one poll) they break every
/// GSO run; behind them they make runs of their own, in the same `sendmmsg`. Only the order
/// between QPs changes (and an ACK may go behind its own QP's READ responses, which
/// acknowledge as much: the requester takes the ACK as a duplicate).
struct Late {
    /// The datagrams, built whole (ICRC included): frames swapped in from the caller.
    frames: Vec<Frame>,
    lens: [usize; LATE_MAX],
    dsts: [SocketAddr; LATE_MAX],
    n: usize,
}

/// Datagrams to send with `sendmmsg`: fixed buffers allocated once, so the data path allocates
/// nothing per packet. A datagram is its slot's bytes, or pieces: headers in the slot and
/// payload straight from registered memory (zero-copy). Runs of same-sized datagrams to one
/// destination go out as one UDP GSO message (UDP_SEGMENT: the kernel cuts it into the
/// datagrams, one skb through the stack on loopback and veth), when the caller allows it.
pub(crate) struct TxBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    joins: Vec<GsoJoin>,
    /// Every queued datagram's destination; in C form (`addrs`, `addr_lens`) only for the
    /// first datagram of each message, written when the batch is sent.
    dsts: Vec<std::net::SocketAddr>,
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
    /// Bare ACKs that go behind the rest (see [`Late`]).
    late: Late,
    /// Whether bare ACKs go behind the rest now (see [`TxBatch::acks_behind`]).
    acks_behind: bool,
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
            joins: vec![GsoJoin::Alone; count],
            dsts: vec![std::net::SocketAddr::from(([0, 0, 0, 0], 0)); count],
            addrs: vec![zero_addr; count],
            addr_lens: vec![0; count],
            parts: vec![iov; count * 3 + MAX_PARTS],
            first: vec![0; count + 1],
            np: 0,
            hdrs: vec![zero_hdr; count],
            segs: vec![0; count],
            ctrl: vec![Cmsg([0; 64]); count],
            n: 0,
            gso: true,
            gso_messages: 0,
            late: Late {
                frames: Vec::new(),
                lens: [0; LATE_MAX],
                dsts: [std::net::SocketAddr::from(([0, 0, 0, 0], 0)); LATE_MAX],
                n: 0,
            },
            acks_behind: false,
        }
    }

    /// From now on bare ACKs ([`GsoJoin::SameSize`]) wait behind the rest of the batch (see
    /// [`Late`]), or no longer (those waiting still go last at the next send). Only the
    /// flush of what deferred posts and receives left for a poll asks for it: there many
    /// QPs' replies and ACKs meet; elsewhere the order stays as queued.
    pub(crate) fn acks_behind(&mut self, on: bool) {
        self.acks_behind = on;
    }

    /// Datagrams queued (the late ACKs too).
    pub(crate) fn len(&self) -> usize {
        self.n + self.late.n
    }

    /// True when the next datagram might not fit: send the batch before building another.
    pub(crate) fn is_full(&self) -> bool {
        self.slots_full() || self.late.n == LATE_MAX
    }

    fn slots_full(&self) -> bool {
        self.n == self.bufs.len() || self.np + MAX_PARTS > self.parts.len()
    }

    /// Queues the first `len` bytes of `frame` for `dst`; `gso` says whether it may go in one
    /// segmented message with its neighbours to the same destination ([`GsoJoin::SameSize`]:
    /// behind the rest of the batch, see [`Late`]). The frame becomes the next slot; `frame`
    /// gets that slot's free buffer (see [`Frame`]).
    pub(crate) fn commit(
        &mut self,
        frame: &mut Frame,
        len: usize,
        dst: std::net::SocketAddr,
        gso: GsoJoin,
    ) {
        // (A caller that did not flush a full batch gets its ACK in place, not a panic.)
        if gso == GsoJoin::SameSize && self.acks_behind && self.gso && self.late.n < LATE_MAX {
            let late = &mut self.late;
            if late.frames.len() == late.n {
                late.frames.push(vec![0; frame.len()]);
            }
            std::mem::swap(&mut late.frames[late.n], frame);
            late.lens[late.n] = len;
            late.dsts[late.n] = dst;
            late.n += 1;
            return;
        }
        let base = frame.as_ptr();
        self.commit_parts(frame, len, dst, gso, [(base, len)]);
    }

    /// Moves the late ACKs into the batch behind the rest, as many as fit.
    fn admit_late(&mut self) {
        let n = self.late.n;
        let mut i = 0;
        while i < n && !self.slots_full() {
            let (len, dst) = (self.late.lens[i], self.late.dsts[i]);
            let mut frame = std::mem::take(&mut self.late.frames[i]);
            let base = frame.as_ptr();
            self.commit_parts(&mut frame, len, dst, GsoJoin::SameSize, [(base, len)]);
            self.late.frames[i] = frame;
            i += 1;
        }
        // Those that did not fit (a batch full of other datagrams) move to the front.
        self.late.frames[..n].rotate_left(i);
        self.late.lens[..n].rotate_left(i);
        self.late.dsts[..n].rotate_left(i);
        self.late.n = n - i;
    }

    /// Queues the datagram of `len` bytes built in `frame` for `dst`, sent from `parts` in
    /// order (addresses in the frame or in registered memory; at most [`MAX_PARTS`],
    /// lengths summing to `len`). The frame becomes the next slot (its bytes do not move),
    /// `frame` gets that slot's free buffer; the registered memory must stay valid and
    /// unchanged until the batch is sent.
    pub(crate) fn commit_parts(
        &mut self,
        frame: &mut Frame,
        len: usize,
        dst: std::net::SocketAddr,
        gso: GsoJoin,
        parts: impl IntoIterator<Item = (*const u8, usize)>,
    ) {
        std::mem::swap(&mut self.bufs[self.n], frame);
        self.first[self.n] = self.np;
        for (ptr, l) in parts.into_iter().take(MAX_PARTS) {
            self.parts[self.np] = libc::iovec {
                iov_base: ptr.cast_mut().cast(),
                iov_len: l,
            };
            self.np += 1;
        }
        self.lens[self.n] = len;
        self.joins[self.n] = gso;
        self.dsts[self.n] = dst;
        self.n += 1;
        self.first[self.n] = self.np;
    }

    /// Drops the queued datagrams unsent (not the late ACKs, which wait for the next send).
    pub(crate) fn discard(&mut self) {
        self.n = 0;
        self.np = 0;
    }

    /// Groups the queued datagrams into messages; returns the message count.
    fn prepare(&mut self) -> usize {
        let mut m = 0;
        let mut i = 0;
        while i < self.n {
            let seg = self.lens[i];
            let mut k = 1;
            let mut total = seg;
            if self.gso && self.joins[i] != GsoJoin::Alone {
                while i + k < self.n
                    && k < GSO_MAX_SEGMENTS
                    && self.lens[i + k - 1] == seg
                    && match self.joins[i + k] {
                        GsoJoin::Alone => false,
                        GsoJoin::Any => self.lens[i + k] <= seg,
                        GsoJoin::SameSize => self.lens[i + k] == seg,
                    }
                    && total + self.lens[i + k] <= GSO_MAX_BYTES
                    && self.first[i + k + 1] - self.first[i] <= MAX_IOV
                    && self.dsts[i] == self.dsts[i + k]
                {
                    total += self.lens[i + k];
                    k += 1;
                }
            }
            if k > 1 {
                self.number_run(i, k);
            }
            self.addr_lens[i] = to_sockaddr(self.dsts[i], &mut self.addrs[i]);
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

    /// Sends every queued datagram, the late ACKs last (one `sendmmsg` unless they do not
    /// fit in the batch); returns how many the kernel refused. The batch is empty afterwards.
    pub(crate) fn send(&mut self, fd: RawFd) -> usize {
        let mut refused = 0;
        loop {
            self.admit_late();
            refused += self.send_slots(fd);
            if self.late.n == 0 {
                return refused;
            }
        }
    }

    /// Sends the datagrams in the slots; returns how many the kernel refused.
    fn send_slots(&mut self, fd: RawFd) -> usize {
        let count = self.prepare();
        let mut done = 0;
        let mut refused = 0;
        let mut slot = 0;
        while done < count {
            // SAFETY: `hdrs[done..count]` were initialised by `prepare` and point into this
            // batch's live iovecs, control buffers and addresses, and the iovecs into live
            // slots or locked registered memory.
            let r = unsafe {
                if count - done == 1 {
                    // One message (a ping-pong's request or reply): `sendmsg` skips
                    // `sendmmsg`'s per-call bookkeeping.
                    let sent = libc::sendmsg(fd, &self.hdrs[done].msg_hdr, libc::MSG_DONTWAIT);
                    if sent >= 0 { 1 } else { -1 }
                } else {
                    libc::sendmmsg(
                        fd,
                        self.hdrs[done..].as_mut_ptr(),
                        (count - done) as libc::c_uint,
                        libc::MSG_DONTWAIT,
                    )
                }
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

    /// Makes the ICRCs of an IPv4 GSO run of `k` datagrams from `i` match the Identification
    /// each will carry: the kernel cuts the buffer into datagrams numbered 0, 1, 2, … and
    /// datagram `j`'s ICRC must cover ID `j` (it was built for ID 0). Applied twice, it
    /// restores ID 0 (for datagrams resent one by one). IPv6 has no Identification.
    fn number_run(&mut self, i: usize, k: usize) {
        if !self.dsts[i].is_ipv4() {
            return;
        }
        // The segments share one length but the last: one factor per length.
        let mut factor = (0, 0);
        for j in 1..k {
            let d = i + j;
            // The ICRC is the last four bytes of the datagram's last piece, which is in its
            // slot (headers, pad and ICRC are built there; only payload stays in registered
            // memory).
            let last = self.parts[self.first[d + 1] - 1];
            let base = self.bufs[d].as_ptr() as usize;
            let start = last.iov_base as usize;
            let end = start + last.iov_len;
            if last.iov_len < 4 || start < base || end > base + self.bufs[d].len() {
                continue;
            }
            let at = end - base - 4;
            let b = &mut self.bufs[d][at..at + 4];
            let icrc = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if factor.0 != self.lens[d] {
                factor = (
                    self.lens[d],
                    srdma_wire::icrc::ipv4_ident_factor(self.lens[d]),
                );
            }
            let icrc = srdma_wire::icrc::ipv4_icrc_with_ident_factor(icrc, factor.1, j as u16);
            b.copy_from_slice(&icrc.to_le_bytes());
        }
    }

    fn resend_singly(&mut self, fd: RawFd, first: usize, k: usize) -> usize {
        // Each goes alone with ID 0 again: undo the run's numbering.
        self.number_run(first, k);
        let mut refused = 0;
        for j in first..first + k {
            self.addr_lens[j] = to_sockaddr(self.dsts[j], &mut self.addrs[j]);
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

/// Datagrams received, buffers allocated once: with `recvmmsg`, a batch per call, while
/// datagrams come more than one to a look; with UDP_GRO on the socket a buffer may then hold
/// a run of same-sized datagrams ([`RxBatch::get`] says the segment size). While they come
/// at most one to a look (a ping-pong), one `recvfrom` per busy poll with GRO off: veth
/// MTU 1500, 8 B SEND ping-pong, the half round trip 5.8 → 5.35 µs (a `recvmmsg` that finds
/// nothing costs ~400 ns here, a `recvfrom` ~270; one that finds a datagram goes on to look
/// for the next, and a look of its own comes after it anyway). See [`Look`].
pub(crate) struct RxBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    segs: Vec<usize>,
    /// The ECN codepoint each buffer's datagrams arrived with (GRO coalesces only datagrams
    /// with the same traffic class); 0 where unknown (`recvfrom`).
    ecn: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    ctrl: Vec<Cmsg>,
    n: usize,
    /// Whether every message was armed once (later calls re-arm only the used ones).
    armed: bool,
    /// Messages the last `recvmmsg` filled (to re-arm).
    filled: usize,
    /// How the next look receives.
    look: Look,
    /// Busy looks since the last that took something of a stream (in [`Look::Batch`], see
    /// [`RxBatch::bulk`]); looks that took a datagram (in [`Look::Single`]).
    run: u32,
    /// Whether the socket takes UDP_GRO (it was on when the socket opened).
    gro: bool,
}

/// How [`RxBatch::recv`] looks at the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// `recvmmsg` of up to a batch, GRO on (if the kernel has it). After [`SINGLE_AFTER`]
    /// busy looks with none in between that took something of a stream (see
    /// [`RxBatch::bulk`]): GRO off and, if nothing is queued then, [`Look::Single`].
    Batch,
    /// GRO off: an application's busy poll (of a CQ, or a read of registered memory) takes
    /// one datagram with `recvfrom` (it looks again soon); other looks (the progress
    /// thread's, a wait on a completion channel, which sleeps after it) and one in
    /// [`PROBE_EVERY`] busy looks still take all there is with `recvmmsg`. When a look finds
    /// a stream: [`Look::Batch`], then GRO on.
    Single,
}

/// Busy looks without a stream before the socket is read one datagram at a time (a few
/// milliseconds of busy polling: a ping-pong of large messages, which looks that often
/// between them, keeps its GRO).
const SINGLE_AFTER: u32 = 4096;
/// Without GRO, every this many busy looks that took a datagram one is a `recvmmsg`, which
/// sees whether datagrams wait several at a time (a stream of single-packet messages).
const PROBE_EVERY: u32 = 16;

// SAFETY: as for TxBatch: pointers into own heap buffers only (they never move), re-armed
// before each syscall that could use them.
unsafe impl Send for RxBatch {}

impl RxBatch {
    /// `count` buffers of `size` bytes; `gro`: UDP_GRO is on.
    pub(crate) fn new(count: usize, size: usize, gro: bool) -> RxBatch {
        // SAFETY: all-zero is a valid value for these plain C structs.
        let zero_addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_hdr: libc::mmsghdr = unsafe { std::mem::zeroed() };
        RxBatch {
            bufs: vec![vec![0u8; size]; count],
            lens: vec![0; count],
            segs: vec![0; count],
            ecn: vec![0; count],
            addrs: vec![zero_addr; count],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                count
            ],
            hdrs: vec![zero_hdr; count],
            ctrl: vec![Cmsg([0; 64]); count],
            n: 0,
            armed: false,
            filled: 0,
            look: Look::Batch,
            run: 0,
            gro,
        }
    }

    /// Buffer `i` of the last receive: its bytes, the sender, and the size of the datagrams
    /// it holds back to back (the last may be shorter).
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], std::net::SocketAddr, usize)> {
        let addr = from_sockaddr(&self.addrs[i])?;
        Some((&self.bufs[i][..self.lens[i]], addr, self.segs[i]))
    }

    /// The ECN codepoint buffer `i` of the last receive arrived with.
    pub(crate) fn ecn(&self, i: usize) -> u8 {
        self.ecn[i]
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

    /// Receives without blocking, up to a batch, or (`busy`: an application's busy poll of
    /// a CQ or of its memory, which looks again soon) one datagram when GRO is off (see
    /// [`Look`]); returns how many buffers were filled.
    pub(crate) fn recv(&mut self, fd: RawFd, busy: bool) -> io::Result<usize> {
        // Every PROBE_EVERY-th datagram-taking busy look without GRO is a batch, so that a
        // stream of single-packet messages shows as one (see `bulk`).
        let one = busy && self.look == Look::Single && self.run % PROBE_EVERY != PROBE_EVERY - 1;
        let r = if one {
            self.recv_one(fd)
        } else {
            self.recv_batch(fd)
        };
        let n = *r.as_ref().unwrap_or(&0);
        let bulk = self.bulk();
        match self.look {
            Look::Single if bulk => {
                // Batches again, ready for coalesced buffers before GRO is back.
                self.run = 0;
                self.look = Look::Batch;
                if self.gro {
                    self.gro = set_gro(fd, true);
                }
            }
            Look::Single => self.run = self.run.wrapping_add(u32::from(n > 0)),
            Look::Batch => {
                // Only busy looks count: where nothing polls (the progress thread's looks),
                // one datagram a look would serve no one.
                if bulk {
                    self.run = 0;
                } else if busy {
                    self.run += 1;
                }
                if self.run >= SINGLE_AFTER {
                    self.run = 0;
                    if self.gro_off(fd) {
                        self.look = Look::Single;
                    }
                }
            }
        }
        r
    }

    /// Turns GRO off for [`Look::Single`]; false (GRO on again) when something is queued
    /// by then. Once GRO is off the kernel cuts what it queues into datagrams, but it gives
    /// the segment size of a buffer coalesced before only while GRO is on: such a buffer,
    /// read without it, would be taken for one packet, fail its ICRC check and be dropped.
    /// Hence the switch only with the socket empty after GRO went off. (What is left: a
    /// buffer another CPU was queueing at that very moment, which passed the kernel's check
    /// before GRO went off and joined the queue after this one found it empty — a peer's
    /// burst right when its traffic had been sparse for [`SINGLE_AFTER`] looks, with that
    /// CPU held up inside a few hundred nanoseconds of the kernel's receive path. It would
    /// fail its ICRC check, be dropped and counted as a corrupt packet, and RC retransmits
    /// it.)
    fn gro_off(&mut self, fd: RawFd) -> bool {
        if !self.gro {
            return true;
        }
        if !set_gro(fd, false) {
            return false;
        }
        if crate::sys::bytes_queued(fd).is_ok_and(|n| n == 0) {
            return true;
        }
        self.gro = set_gro(fd, true);
        false
    }

    /// Whether the last receive looked like a stream: more than three datagrams (a
    /// ping-pong's reply comes with ACKs, which a late look finds together), a coalesced
    /// buffer, or a packet that is not the last of its message (the rest of a multi-packet
    /// message follows).
    fn bulk(&self) -> bool {
        self.n > 3
            || (0..self.n).any(|i| {
                let first = self.bufs[i][..self.lens[i]].first().copied();
                self.segs[i] < self.lens[i]
                    || first
                        .and_then(srdma_wire::Opcode::from_u8)
                        .is_some_and(|o| {
                            matches!(o.position(), Some(Position::First | Position::Middle))
                        })
            })
    }

    /// One datagram, with `recvfrom` (GRO off: it is one packet).
    fn recv_one(&mut self, fd: RawFd) -> io::Result<usize> {
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: buffer 0 and address 0 are live heap storage of this batch; the kernel
        // writes at most their lengths.
        let r = unsafe {
            libc::recvfrom(
                fd,
                self.bufs[0].as_mut_ptr().cast(),
                self.bufs[0].len(),
                libc::MSG_DONTWAIT,
                (&raw mut self.addrs[0]).cast(),
                &mut len,
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
        self.n = 1;
        self.lens[0] = r as usize;
        self.segs[0] = r as usize;
        self.ecn[0] = 0;
        Ok(1)
    }

    /// Up to a batch with `recvmmsg`. Only the messages the previous call filled are
    /// re-armed: a poll that finds nothing costs the syscall alone.
    fn recv_batch(&mut self, fd: RawFd) -> io::Result<usize> {
        let count = self.bufs.len();
        let rearm = if self.armed { self.filled } else { count };
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
            self.filled = 0;
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        self.n = r as usize;
        self.filled = self.n;
        for i in 0..self.n {
            let len = self.hdrs[i].msg_len as usize;
            self.lens[i] = len;
            self.segs[i] = len;
            self.ecn[i] = 0;
            let h = &self.hdrs[i].msg_hdr;
            // SAFETY: the kernel filled `msg_controllen` bytes of our control buffer with
            // well-formed cmsgs; CMSG_FIRSTHDR/NXTHDR stay inside it.
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(h);
                while !cm.is_null() {
                    let (level, ty) = ((*cm).cmsg_level, (*cm).cmsg_type);
                    if level == SOL_UDP && ty == UDP_GRO {
                        let seg = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<u16>());
                        if seg > 0 {
                            self.segs[i] = seg as usize;
                        }
                    } else if level == libc::IPPROTO_IP && ty == libc::IP_TOS {
                        self.ecn[i] = *libc::CMSG_DATA(cm) & 3;
                    } else if level == libc::IPPROTO_IPV6 && ty == libc::IPV6_TCLASS {
                        let tc = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<i32>());
                        self.ecn[i] = (tc & 3) as u8;
                    }
                    cm = libc::CMSG_NXTHDR(h, cm);
                }
            }
        }
        Ok(self.n)
    }
}

/// The UDP driver: the device's socket with its send and receive batches. The engine keeps
/// the socket itself (its progress thread polls it without the device lock) and hands the
/// driver its descriptor, valid as long as the driver (both live as long as the device).
pub(crate) struct Udp {
    fd: RawFd,
    tx: TxBatch,
    rx: RxBatch,
    /// What the ICRCs this driver computes keep from one packet to the next.
    icrc: srdma_wire::icrc::Memo,
    /// Receive buffers that held a GRO run of more than one datagram.
    gro_buffers: u64,
    /// The next receive is an application's busy poll: one datagram is enough (see
    /// [`RxBatch::recv`]).
    pub(crate) busy_look: bool,
}

impl Udp {
    /// The driver of socket `fd`: sends in batches of `tx` datagrams of at most `size`
    /// bytes, receives in batches of `rx` buffers of [`RX_BUF`] bytes (large enough for a GRO
    /// run; a longer datagram is cut and fails to parse); `gro`: UDP_GRO is on.
    pub(crate) fn new(fd: RawFd, tx: usize, rx: usize, size: usize, gro: bool) -> Udp {
        Udp {
            fd,
            tx: TxBatch::new(tx, size),
            rx: RxBatch::new(rx, RX_BUF, gro),
            icrc: Default::default(),
            gro_buffers: 0,
            busy_look: false,
        }
    }

    /// Datagrams queued and not yet sent.
    pub(crate) fn queued(&self) -> usize {
        self.tx.len()
    }

    /// Drops the datagrams of the batch unsent (not the ACKs waiting behind it).
    pub(crate) fn discard(&mut self) {
        self.tx.discard();
    }

    /// Whether bare ACKs wait behind the rest of the batch (see [`TxBatch::acks_behind`]).
    pub(crate) fn acks_behind(&mut self, on: bool) {
        self.tx.acks_behind(on);
    }
}

impl Driver for Udp {
    /// UDP carries packets to every destination.
    type Link = ();

    fn route(&mut self, _: SocketAddr, _: u32, _: u64) -> Option<()> {
        Some(())
    }

    fn is_full(&self) -> bool {
        self.tx.is_full()
    }

    /// Queues the packet on the batch: with payload pieces, sent from them where it pays
    /// (see [`commit_zero_copy`]), the ICRC computed across them; whole, from the frame.
    fn queue(
        &mut self,
        (): (),
        pkt: &Outgoing<'_>,
        frame: &mut Frame,
        payload: &impl Payload,
    ) -> bool {
        if payload.count() > 0 {
            match commit_zero_copy(&mut self.tx, frame, payload, &mut self.icrc, pkt) {
                ZeroCopy::Queued => return true,
                ZeroCopy::Copied => {}
                // Never send a packet whose payload is not all there.
                ZeroCopy::Failed => return false,
            }
        }
        if Packet::new_unchecked(&mut frame[..pkt.len])
            .fill_icrc_with_memo(pkt.encap, &mut self.icrc)
            .is_err()
        {
            return false;
        }
        self.tx.commit(frame, pkt.len, pkt.dst, pkt.gso);
        true
    }

    fn flush(&mut self) -> usize {
        if self.tx.len() == 0 {
            return 0;
        }
        self.tx.send(self.fd)
    }

    /// One `recvmmsg`; each buffer's datagrams (a GRO run) one by one, with their place in
    /// it (an empty datagram is one, malformed, packet too).
    fn recv(&mut self, mut f: impl FnMut(SocketAddr, &[u8], Via<'_>)) -> Received {
        let n = self.rx.recv(self.fd, self.busy_look).unwrap_or(0);
        let mut unreadable = 0;
        for i in 0..n {
            let ecn = self.rx.ecn(i);
            match self.rx.get(i) {
                Some((data, from, _)) if data.is_empty() => {
                    f(from, data, Via::Udp { place: 0, ecn });
                }
                Some((data, from, seg)) => {
                    if seg < data.len() {
                        self.gro_buffers += 1;
                    }
                    for (j, pkt) in data.chunks(seg.max(1)).enumerate() {
                        let place = j as u16;
                        f(from, pkt, Via::Udp { place, ecn });
                    }
                }
                None => unreadable += 1,
            }
        }
        Received {
            taken: n,
            full: n == self.rx.bufs.len(),
            unreadable,
        }
    }

    fn count_into(&self, c: &mut crate::types::DeviceCounters) {
        c.tx_gso_messages = self.tx.gso_messages;
        c.rx_gro_buffers = self.gro_buffers;
    }
}

/// What became of a packet built with its payload left in registered memory.
enum ZeroCopy {
    /// Queued, sent from the pieces.
    Queued,
    /// The pieces were copied into the frame: send it as an ordinary packet.
    Copied,
    /// The payload could not be assembled: drop the packet (the transport retransmits).
    Failed,
}

/// Payloads up to this many bytes are copied into the packet rather than sent from the
/// registered memory (see [`commit_zero_copy`]).
const COPY_BELOW: usize = 512;

/// Most iovecs a packet is sent from without copying its payload (up to four pieces of
/// registered memory, more are copied into the frame); at most [`MAX_PARTS`].
const ZERO_COPY_PARTS: usize = 9;
const _: () = assert!(ZERO_COPY_PARTS <= MAX_PARTS);

/// Queues `pkt` on `tx` — headers and pad in `frame`, payload pieces in registered memory
/// (noted by the store while the packet was built) — computing its ICRC across the pieces.
/// When it cannot go out that way (too many pieces), or the payload is at most
/// [`COPY_BELOW`] bytes, the pieces are copied into the frame instead.
fn commit_zero_copy(
    tx: &mut TxBatch,
    frame: &mut Frame,
    payload: &impl Payload,
    memo: &mut srdma_wire::icrc::Memo,
    pkt: &Outgoing<'_>,
) -> ZeroCopy {
    const ICRC: usize = srdma_wire::icrc::ICRC_LEN;
    let len = pkt.len;
    let base = frame.as_ptr() as usize;
    let count = payload.count();
    // A small payload is cheaper copied than sent as iovecs of its own (the kernel imports
    // and copies each piece separately).
    if (0..count).map(|i| payload.place(i).1).sum::<usize>() <= COPY_BELOW {
        return materialize(frame, base, payload);
    }
    // A piece and the headers or gap before it, and the tail: few enough for a small array
    // (one per packet: a `MAX_PARTS` array cost a 640-byte `memset` each, 1 % of a sender).
    let mut parts = [(std::ptr::null::<u8>(), 0usize); ZERO_COPY_PARTS];
    let mut n = 0;
    let fits = 2 * count < ZERO_COPY_PARTS && len >= srdma_wire::bth::BTH_LEN + ICRC;
    let hasher = fits
        .then(|| {
            srdma_wire::icrc::Hasher::with_memo(pkt.encap, len - ICRC, &frame[..len], memo).ok()
        })
        .flatten();
    let Some(mut h) = hasher else {
        return materialize(frame, base, payload);
    };
    let mut at = srdma_wire::bth::BTH_LEN;
    let mut gap = 0;
    for i in 0..count {
        let (dst, plen) = payload.place(i);
        let off = dst.wrapping_sub(base);
        let src = payload.bytes(i);
        let (Some(src), true) = (src, off >= at && off + plen <= len - ICRC) else {
            return materialize(frame, base, payload);
        };
        h.update(&frame[at..off]);
        h.update(src);
        if off > gap {
            parts[n] = (frame[gap..].as_ptr(), off - gap);
            n += 1;
        }
        parts[n] = (src.as_ptr(), src.len());
        n += 1;
        at = off + plen;
        gap = at;
    }
    h.update(&frame[at..len - ICRC]);
    frame[len - ICRC..len].copy_from_slice(&h.finish().to_le_bytes());
    parts[n] = (frame[gap..].as_ptr(), len - gap);
    n += 1;
    tx.commit_parts(frame, len, pkt.dst, pkt.gso, parts[..n].iter().copied());
    ZeroCopy::Queued
}

/// Copies the payload pieces into the frame they stand for (whose address is `base`).
fn materialize(frame: &mut [u8], base: usize, payload: &impl Payload) -> ZeroCopy {
    for i in 0..payload.count() {
        let (dst, len) = payload.place(i);
        let off = dst.wrapping_sub(base);
        match (
            payload.bytes(i),
            frame.get_mut(off..off.saturating_add(len)),
        ) {
            (Some(src), Some(dst)) => dst.copy_from_slice(src),
            _ => return ZeroCopy::Failed,
        }
    }
    ZeroCopy::Copied
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Receives every datagram waiting on `s` (non-GRO socket: one per segment).
    fn drain(s: &UdpSocket) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = s.recv(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    #[test]
    fn a_gso_run_never_spans_two_destinations() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
        }
        let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut tx = TxBatch::new(8, 256);
        // Three same-sized datagrams: two to A, then one to B, each allowed into a GSO run.
        let mut frame = vec![0u8; 256];
        for (dst, fill) in [(&a, 1u8), (&a, 2), (&b, 3)] {
            frame[..100].fill(fill);
            tx.commit(&mut frame, 100, dst.local_addr().unwrap(), GsoJoin::Any);
        }
        assert_eq!(tx.send(tx_sock.as_raw_fd()), 0, "nothing refused");
        let (got_a, got_b) = (drain(&a), drain(&b));
        // IPv4 GSO renumbers the last four bytes (the ICRC) of the run's second datagram.
        let heads = |v: &[Vec<u8>]| {
            v.iter()
                .map(|d| (d.len(), d[..96].to_vec()))
                .collect::<Vec<_>>()
        };
        assert_eq!(heads(&got_a), vec![(100, vec![1; 96]), (100, vec![2; 96])]);
        assert_eq!(heads(&got_b), vec![(100, vec![3; 96])]);
        // The two to A went as one segmented message (where the kernel takes UDP_SEGMENT);
        // B's never joined it.
        assert!(tx.gso_messages <= 1);
    }

    #[test]
    fn a_same_size_datagram_joins_runs_of_its_size_only() {
        let dst: std::net::SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let mut frame = vec![0u8; 256];
        // The message sizes `prepare` forms from datagrams of (length, join), and the
        // datagrams' lengths in the order they go; `behind`: ACKs go behind the rest.
        let mut messages = |behind: bool, queued: &[(usize, GsoJoin)]| {
            let mut tx = TxBatch::new(8, 256);
            tx.acks_behind(behind);
            for &(len, join) in queued {
                tx.commit(&mut frame, len, dst, join);
            }
            tx.admit_late();
            let m = tx.prepare();
            (tx.segs[..m].to_vec(), tx.lens[..tx.n].to_vec())
        };
        use GsoJoin::{Alone, Any, SameSize};
        for behind in [false, true] {
            // A request and a bare ACK that must not be its tail: two messages.
            assert_eq!(messages(behind, &[(100, Any), (20, SameSize)]).0, [1, 1]);
            // The same ACK allowed to be the tail: one.
            assert_eq!(messages(behind, &[(100, Any), (20, Any)]).0, [2]);
        }
        // In place: several QPs' ACKs to one peer in one message, a shorter request may
        // end it; a run of ACKs stops at a larger datagram and at one that goes alone.
        let acks_then_request = [(20, SameSize), (20, SameSize), (20, SameSize), (16, Any)];
        assert_eq!(messages(false, &acks_then_request).0, [4]);
        let acks_then_larger = [(20, SameSize), (20, SameSize), (100, Any), (100, Alone)];
        assert_eq!(messages(false, &acks_then_larger).0, [2, 1, 1]);
        // Behind: the ACKs go after the rest, in one message.
        assert_eq!(
            messages(true, &acks_then_request),
            (vec![1, 3], vec![16, 20, 20, 20])
        );
        assert_eq!(
            messages(true, &acks_then_larger),
            (vec![1, 1, 2], vec![100, 100, 20, 20])
        );
        // A server's replies and ACKs to four QPs, queued QP by QP: eight messages in place,
        // two runs with the ACKs behind.
        let pairs = [(52, Any), (20, SameSize)].repeat(4);
        assert_eq!(messages(false, &pairs).0, [1; 8]);
        assert_eq!(
            messages(true, &pairs),
            (vec![4, 4], vec![52, 52, 52, 52, 20, 20, 20, 20])
        );
    }

    #[test]
    fn late_acks_that_do_not_fit_go_in_the_next_round_of_the_same_send() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let tx_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = rx.local_addr().unwrap();
        // Four slots: three requests and six ACKs (three wait for the second round).
        let mut tx = TxBatch::new(4, 256);
        tx.acks_behind(true);
        let mut frame = vec![0u8; 256];
        for i in 0..3u8 {
            frame[..100].fill(i);
            tx.commit(&mut frame, 100, dst, GsoJoin::Alone);
            for j in 0..2u8 {
                frame[..20].fill(10 + 2 * i + j);
                tx.commit(&mut frame, 20, dst, GsoJoin::SameSize);
            }
        }
        assert_eq!(tx.len(), 9);
        assert_eq!(tx.send(tx_sock.as_raw_fd()), 0, "nothing refused");
        assert_eq!(tx.len(), 0);
        let got: Vec<(usize, u8)> = drain(&rx).iter().map(|d| (d.len(), d[0])).collect();
        // The requests first, then the ACKs in their order (GSO renumbers only the ICRC).
        assert_eq!(
            got,
            [
                (100, 0),
                (100, 1),
                (100, 2),
                (20, 10),
                (20, 11),
                (20, 12),
                (20, 13),
                (20, 14),
                (20, 15)
            ]
        );
    }

    /// A receiving socket with GRO on (as the device's), its batch, and a sender.
    fn rx_pair() -> (UdpSocket, RxBatch, UdpSocket, TxBatch) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gro = set_gro(rx.as_raw_fd(), true);
        let batch = RxBatch::new(8, RX_BUF, gro);
        (
            rx,
            batch,
            UdpSocket::bind("127.0.0.1:0").unwrap(),
            TxBatch::new(64, 256),
        )
    }

    /// Queues `count` datagrams of `len` bytes starting with `opcode` for `to` and sends them
    /// (as one GSO message where the kernel takes it).
    fn send_run(
        tx: &mut TxBatch,
        from: &UdpSocket,
        to: &UdpSocket,
        opcode: u8,
        len: usize,
        count: usize,
    ) {
        let mut frame = vec![0u8; 256];
        for i in 0..count {
            frame[..len].fill(i as u8);
            frame[0] = opcode;
            tx.commit(&mut frame, len, to.local_addr().unwrap(), GsoJoin::Any);
        }
        assert_eq!(tx.send(from.as_raw_fd()), 0);
    }

    /// Busy looks until one takes something (the datagrams are on loopback: at once).
    fn look(batch: &mut RxBatch, fd: RawFd, busy: bool) -> usize {
        for _ in 0..1000 {
            let n = batch.recv(fd, busy).unwrap();
            if n > 0 {
                return n;
            }
        }
        panic!("nothing arrived");
    }

    /// The sizes of the next `count` datagrams, each buffer cut at its segment size.
    fn datagram_sizes(batch: &mut RxBatch, fd: RawFd, count: usize) -> Vec<usize> {
        let mut sizes = Vec::new();
        while sizes.len() < count {
            let n = look(batch, fd, true);
            for i in 0..n {
                let (data, _, seg) = batch.get(i).unwrap();
                sizes.extend(data.chunks(seg).map(<[u8]>::len));
            }
        }
        sizes
    }

    /// Empty looks until the batch reads one datagram at a time.
    fn go_single(batch: &mut RxBatch, fd: RawFd) {
        for _ in 0..SINGLE_AFTER {
            assert_eq!(batch.recv(fd, true).unwrap(), 0);
        }
        assert_eq!(
            batch.look,
            Look::Single,
            "sparse traffic: one datagram a look"
        );
    }

    #[test]
    fn sparse_traffic_is_read_one_datagram_a_busy_look_and_a_stream_in_batches_again() {
        let (rx, mut batch, from, mut tx) = rx_pair();
        let fd = rx.as_raw_fd();
        go_single(&mut batch, fd);
        // Three SEND_ONLYs (0x04): a busy look takes one, another look the rest.
        send_run(&mut tx, &from, &rx, 0x04, 40, 3);
        assert_eq!(look(&mut batch, fd, true), 1);
        assert_eq!(batch.get(0).unwrap().0.len(), 40);
        assert_eq!(
            look(&mut batch, fd, false),
            2,
            "a look that is no busy poll takes all"
        );
        assert_eq!(batch.look, Look::Single, "two at a time is no stream");
        // A stream of single-packet messages: a probe look every PROBE_EVERY busy looks
        // sees many waiting, and batches (with GRO) are back.
        send_run(&mut tx, &from, &rx, 0x04, 40, 40);
        let mut taken = 0;
        while batch.look == Look::Single {
            taken += look(&mut batch, fd, true);
            assert!(taken <= 40, "still one at a time after the whole stream");
        }
        assert!(taken <= PROBE_EVERY as usize + 8);
    }

    #[test]
    fn a_multi_packet_message_brings_batches_and_gro_back() {
        let (rx, mut batch, from, mut tx) = rx_pair();
        let fd = rx.as_raw_fd();
        go_single(&mut batch, fd);
        // A GSO run of WRITE_MIDDLEs (0x07) sent while GRO is off arrives cut: the first
        // look takes one datagram of its size and switches.
        send_run(&mut tx, &from, &rx, 0x07, 100, 4);
        assert_eq!(look(&mut batch, fd, true), 1);
        assert_eq!(batch.get(0).unwrap().0.len(), 100);
        assert_eq!(batch.look, Look::Batch);
        assert_eq!(look(&mut batch, fd, true), 3, "the rest in one batch");
        // With GRO back, the next run comes as one buffer that says its segment size (the
        // kernel keeps a GSO message whole on loopback).
        send_run(&mut tx, &from, &rx, 0x07, 100, 4);
        if batch.gro && tx.gso_messages > 0 {
            assert_eq!(look(&mut batch, fd, true), 1);
            let (data, _, seg) = batch.get(0).unwrap();
            assert_eq!((data.len(), seg), (400, 100));
            return;
        }
        assert_eq!(datagram_sizes(&mut batch, fd, 4), [100; 4]);
    }

    #[test]
    fn gro_stays_on_while_something_is_queued() {
        let (rx, mut batch, from, mut tx) = rx_pair();
        if !batch.gro {
            return; // a kernel without UDP_GRO: nothing coalesced to keep apart
        }
        let fd = rx.as_raw_fd();
        for _ in 0..SINGLE_AFTER - 1 {
            assert_eq!(batch.recv(fd, true).unwrap(), 0);
        }
        // Queued before GRO would go off (and coalesced where the kernel does): the switch
        // waits, and the run is read with its segment size.
        send_run(&mut tx, &from, &rx, 0x04, 60, 3);
        std::thread::sleep(Duration::from_millis(10));
        assert!(!batch.gro_off(fd), "not with a datagram queued");
        assert!(batch.gro, "GRO is on again");
        assert_eq!(datagram_sizes(&mut batch, fd, 3), [60; 3]);
    }
}
