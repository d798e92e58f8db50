//! The system side of the shared-memory driver: the rendezvous socket through which a
//! device offers rings to same-host peers, the ring memory (a sealed memfd), and each
//! link's socket pair (doorbells, and the end of the link when either process goes).
//!
//! Every device listens on an abstract Unix datagram socket named after its address, port
//! and port slot (`@srdma-shm1-ADDR-PORT-SLOT`, `u` for an unshared port). Abstract names
//! belong to a network namespace, so only devices of the same namespace find each other —
//! the address a peer claims means the same interface to both. A `HELLO` to that name
//! carries a ring's memfd and one end of a `SOCK_SEQPACKET` pair; the kernel attaches the
//! sender's credentials (`SO_PASSCRED`), which the receiver checks: same user, or no link.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::ring::{self, Mem};
use crate::portshare::{cvt, unix_addr};

/// A message on the rendezvous socket: [`MSG_LEN`] bytes.
const MSG_MAGIC: u64 = u64::from_le_bytes(*b"srdmaShm");
const MSG_LEN: usize = 48;
/// The only message: a ring offered (memfd and link socket attached).
const KIND_HELLO: u8 = 1;
/// What a `HELLO`'s sender keeps at the address it names (bytes 40..48): a receiver that
/// reads it there with `process_vm_readv` may pull payloads from the sender's memory
/// (`crate::pull`). A sender that names address 0 (or an older one, which sends zeros)
/// offers no pulls.
static PULL_PROBE: u64 = u64::from_le_bytes(*b"srdmaPl1");

/// The abstract name of the device at `addr` with port slot `slot` (`None`: unshared port).
pub(crate) fn name_of(addr: SocketAddr, slot: Option<u8>) -> Vec<u8> {
    let slot = slot.map_or("u".to_string(), |s| s.to_string());
    format!("srdma-shm1-{}-{}-{slot}", addr.ip(), addr.port()).into_bytes()
}

fn dgram_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() has no memory arguments; the descriptor is owned below.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A device's rendezvous socket.
pub(crate) struct Port {
    fd: OwnedFd,
    /// An unbound socket made with `fd` (in the device's network namespace, whatever
    /// thread asks later), connected to a name to learn whether it exists.
    probe: OwnedFd,
}

/// A ring offered by a peer, received on the rendezvous socket.
pub(crate) struct Hello {
    /// The peer device's address (its packets' source).
    pub(crate) from: SocketAddr,
    /// The ring, mapped (the memfd is closed again).
    pub(crate) mem: Mem,
    /// This side's end of the link's socket pair.
    pub(crate) link: OwnedFd,
    /// The peer's process (as the kernel names it to this one).
    pub(crate) pid: i32,
    /// This process may read the peer's memory (see [`PULL_PROBE`]).
    pub(crate) may_pull: bool,
}

impl Port {
    /// Binds the rendezvous socket of the device at `addr`, slot `slot`.
    ///
    /// Abstract names are looked up in the network namespace of the socket, which is the
    /// one of the thread that made it: the device's (a device opened from a thread that
    /// entered another namespace is found there, whatever thread sends later).
    pub(crate) fn bind(addr: SocketAddr, slot: Option<u8>) -> io::Result<Port> {
        let fd = dgram_socket()?;
        let probe = dgram_socket()?;
        crate::sys::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PASSCRED, 1)?;
        let (a, len) = unix_addr(&name_of(addr, slot));
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const a).cast(), len) })?;
        Ok(Port { fd, probe })
    }

    /// Whether a device named `name` listens in the device's network namespace.
    pub(crate) fn exists(&self, name: &[u8]) -> bool {
        let (a, len) = unix_addr(name);
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes; connecting an unbound datagram
        // socket again only changes its default destination.
        unsafe { libc::connect(self.probe.as_raw_fd(), (&raw const a).cast(), len) == 0 }
    }

    /// The descriptor to poll: readable when a peer offered a ring.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Offers a ring of `len` bytes to the device named `to`, as the device at `me`:
    /// returns the producer's side and this side's link socket. `Err` when no device of
    /// that name lives in this namespace (or it does not take the offer now).
    pub(crate) fn offer(
        &self,
        to: &[u8],
        me: SocketAddr,
        len: usize,
    ) -> io::Result<(ring::Producer, OwnedFd)> {
        let (a, alen) = unix_addr(to);
        let memfd = memfd(c"srdma-ring", len)?;
        let (mine, theirs) = seqpacket_pair()?;
        let mem = map_sealed(&memfd, len)?;
        let producer = ring::Producer::new(mem)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "ring too small"))?;
        let mut m = [0u8; MSG_LEN];
        m[..8].copy_from_slice(&MSG_MAGIC.to_le_bytes());
        m[8] = KIND_HELLO;
        let (family, ip) = match me.ip() {
            IpAddr::V4(v4) => (4, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (6, v6.octets()),
        };
        m[9] = family;
        m[10..12].copy_from_slice(&me.port().to_be_bytes());
        m[16..32].copy_from_slice(&ip);
        m[32..40].copy_from_slice(&(len as u64).to_le_bytes());
        m[40..48].copy_from_slice(&(&raw const PULL_PROBE as u64).to_le_bytes());
        let mut iov = libc::iovec {
            iov_base: m.as_mut_ptr().cast(),
            iov_len: MSG_LEN,
        };
        let fds = [memfd.as_raw_fd(), theirs.as_raw_fd()];
        let mut cbuf = [0u64; 8];
        // SAFETY: msghdr is plain data; all zeroes is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&raw const a).cast_mut().cast();
        msg.msg_namelen = alen;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is pure arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<[RawFd; 2]>() as u32) } as usize;
        // SAFETY: `cbuf` (64 bytes) holds one SCM_RIGHTS cmsg of two descriptors; the
        // pointers stay inside it.
        unsafe {
            let cm = libc::CMSG_FIRSTHDR(&msg);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(size_of::<[RawFd; 2]>() as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cm),
                size_of::<[RawFd; 2]>(),
            );
        }
        // SAFETY: `msg` points at live buffers of the sizes it states.
        let n = unsafe {
            libc::sendmsg(
                self.fd.as_raw_fd(),
                &msg,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n != MSG_LEN as isize {
            return Err(io::Error::last_os_error());
        }
        Ok((producer, mine))
    }

    /// Takes the next ring a peer offered, if any: `Some(Err(..))` for an offer refused
    /// (another user, a malformed message, a ring that does not check); `None` when nothing
    /// waits.
    /// `pulls`: try whether this process may read the peer's memory (else it is not asked).
    pub(crate) fn accept(&self, pulls: bool) -> Option<Result<Hello, &'static str>> {
        let mut m = [0u8; MSG_LEN + 1];
        let r = recv_msg(self.fd.as_raw_fd(), &mut m, libc::MSG_DONTWAIT);
        let n = usize::try_from(r.n).ok()?;
        let mut hello = hello_of(&m[..n], r.cred, r.fds);
        if let (Ok(h), true, Some(c)) = (hello.as_mut(), pulls, r.cred) {
            let at = u64::from_le_bytes(m[40..48].try_into().expect("8 bytes"));
            h.may_pull = may_pull(c.pid, at);
        }
        Some(hello)
    }
}

/// Checks an offer: its sender's credentials (the kernel's, not the sender's word), the
/// message, and the ring.
fn hello_of(
    m: &[u8],
    cred: Option<libc::ucred>,
    mut fds: Vec<OwnedFd>,
) -> Result<Hello, &'static str> {
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    let pid = match cred {
        Some(c) if c.uid == me => c.pid,
        _ => return Err("offer from another user"),
    };
    if m.len() != MSG_LEN || m[..8] != MSG_MAGIC.to_le_bytes() || m[8] != KIND_HELLO {
        return Err("malformed offer");
    }
    if fds.len() != 2 {
        return Err("offer without its descriptors");
    }
    let link = fds.pop().expect("two descriptors");
    let memfd = fds.pop().expect("two descriptors");
    let port = u16::from_be_bytes([m[10], m[11]]);
    let ip6 = Ipv6Addr::from(<[u8; 16]>::try_from(&m[16..32]).expect("16 bytes"));
    let ip = match m[9] {
        4 => IpAddr::V4(ip6.to_ipv4_mapped().ok_or("malformed offer")?),
        6 => IpAddr::V6(ip6),
        _ => return Err("malformed offer"),
    };
    let len = u64::from_le_bytes(m[32..40].try_into().expect("8 bytes"));
    if len < ring::HEADER_LEN as u64 + ring::MIN_CAPACITY
        || len > ring::HEADER_LEN as u64 + ring::MAX_CAPACITY
    {
        return Err("ring of a size not taken");
    }
    let mem = map_checked(&memfd, len as usize)?;
    Ok(Hello {
        from: SocketAddr::new(ip, port),
        mem,
        link,
        pid,
        may_pull: false,
    })
}

/// Whether this process may read process `pid`'s memory: the [`PULL_PROBE`] it names at
/// `at` reads back (same user, and neither Yama, seccomp nor a non-dumpable peer refuses).
fn may_pull(pid: i32, at: u64) -> bool {
    if pid <= 0 || at == 0 {
        return false;
    }
    let mut word = [0u8; 8];
    let local = [(word.as_mut_ptr() as u64, 8)];
    // SAFETY: the local span is `word`, ours for the call.
    let n = unsafe { crate::sys::pull(pid, &local, &[(at, 8)]) };
    matches!(n, Ok(8)) && u64::from_ne_bytes(word) == PULL_PROBE
}

/// Tells the producer of a link that this side pulls payloads from its memory (see
/// [`Hello::may_pull`]).
pub(crate) fn offer_pulls(link: &OwnedFd) {
    let _ = send_byte(link, b'p');
}

/// A message received on a Unix socket, with what came along.
pub(crate) struct Received {
    /// recvmsg's result: the bytes received, 0 at the end, -1 with errno.
    pub(crate) n: isize,
    /// Every descriptor passed with it (owned: closed unless kept).
    pub(crate) fds: Vec<OwnedFd>,
    /// The sender's credentials, if they came (SO_PASSCRED).
    pub(crate) cred: Option<libc::ucred>,
}

/// Receives one message of at most `buf.len()` bytes on Unix socket `fd` (`flags` as
/// recvmsg's), with every descriptor and the credentials that came along.
pub(crate) fn recv_msg(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> Received {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 16]>();
    // SAFETY: `msg` points at live buffers of the sizes it states.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    let mut r = Received {
        n,
        fds: Vec::new(),
        cred: None,
    };
    if n < 0 {
        return r;
    }
    // SAFETY: the kernel filled `msg_controllen` bytes of `cbuf` with well-formed cmsgs;
    // the data of each lies inside `cbuf`, and the descriptors they carry are ours.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(&msg);
        while !cm.is_null() {
            let data = libc::CMSG_DATA(cm);
            let len = (*cm).cmsg_len - (data as usize - cm as usize);
            match ((*cm).cmsg_level, (*cm).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for i in 0..len / size_of::<RawFd>() {
                        let fd = data.cast::<RawFd>().add(i).read_unaligned();
                        r.fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) if len >= size_of::<libc::ucred>() => {
                    r.cred = Some(data.cast::<libc::ucred>().read_unaligned());
                }
                _ => {}
            }
            cm = libc::CMSG_NXTHDR(&msg, cm);
        }
    }
    r
}

/// Maps the first `len` bytes of a memfd another process sent: it must be sealed against
/// shrinking (a mapping past the end of a file faults) and at least `len` bytes long.
pub(crate) fn map_checked(memfd: &OwnedFd, len: usize) -> Result<Mem, &'static str> {
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("shared memory not sealed");
    }
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live stat buffer.
    if unsafe { libc::fstat(memfd.as_raw_fd(), &mut st) } != 0 || (st.st_size as u64) < len as u64 {
        return Err("shared memory shorter than said");
    }
    map_sealed(memfd, len).map_err(|_| "mapping shared memory failed")
}

/// Maps the first `len` bytes of `memfd`, which is at least that long and sealed against
/// shrinking (checked by the caller), shared and writable.
pub(crate) fn map_sealed(memfd: &OwnedFd, len: usize) -> io::Result<Mem> {
    // SAFETY: maps `len` bytes of a file that holds them and cannot shrink (no access can
    // fault); the kernel validates the descriptor.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a live shared mapping of `len` bytes that only the returned `Mem` unmaps.
    Ok(unsafe { Mem::from_mapping(ptr.cast(), len) })
}

/// A memfd of `len` bytes named `name`, sealed so that it cannot shrink (nor be unsealed).
pub(crate) fn memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: the name is NUL-terminated.
    let fd = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain calls on the descriptor we own.
    unsafe {
        cvt(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t))?;
        cvt(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        ))?;
    }
    Ok(fd)
}

/// A connected pair of non-blocking `SOCK_SEQPACKET` sockets: a link's two ends.
fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [-1; 2];
    // SAFETY: `sv` is a live array of two ints.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            sv.as_mut_ptr(),
        )
    })?;
    // SAFETY: two fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) })
}

/// Sends one byte on a link's socket without waiting.
fn send_byte(link: &OwnedFd, b: u8) -> io::Result<()> {
    // SAFETY: sends one byte from a live local on our own socket.
    let n = unsafe {
        libc::send(
            link.as_raw_fd(),
            (&raw const b).cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n == 1 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Rings the doorbell on a link's socket (one byte; a full socket means one is waiting).
pub(crate) fn ring_bell(link: &OwnedFd) -> io::Result<()> {
    match send_byte(link, b'b') {
        Err(e) if e.raw_os_error() != Some(libc::EAGAIN) => Err(e),
        _ => Ok(()),
    }
}

/// What a link's socket says when it polls readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkNews {
    /// Doorbells (or nothing): the link stands.
    Bells,
    /// The other end refused the link (it will not read the ring).
    Refused,
    /// The other end is gone (closed, or its process exited).
    Gone,
    /// The other end may read this process's memory: payloads may stay where they are
    /// (see [`offer_pulls`]).
    Pulls,
}

/// Says no to a link: the other end learns it before the socket closes.
pub(crate) fn refuse(link: &OwnedFd) {
    let _ = send_byte(link, b'r');
}

/// Reads what waits on a link's socket: one message (a doorbell, usually the only one: the
/// producer rings once per nap; more stay readable for the next look).
pub(crate) fn read_link(link: &OwnedFd) -> LinkNews {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a live buffer from our own socket.
    let n = unsafe {
        libc::recv(
            link.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n == 0 {
        return LinkNews::Gone;
    }
    if n < 0 {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => LinkNews::Bells,
            _ => LinkNews::Gone,
        };
    }
    if buf[..n as usize].contains(&b'r') {
        LinkNews::Refused
    } else if buf[..n as usize].contains(&b'p') {
        LinkNews::Pulls
    } else {
        LinkNews::Bells
    }
}
