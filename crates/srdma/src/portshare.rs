//! Several processes on one address and UDP port, as processes share one kernel rxe device.
//!
//! RoCEv2 peers send every packet to UDP 4791, so the processes of a host that use one
//! address must share that port, and each packet must reach the process that owns its
//! destination QP. The kernel does the steering:
//!
//! - every process's socket is a member of one `SO_REUSEPORT` group on ADDRESS:PORT;
//! - a classic BPF program attached to the group (`SO_ATTACH_REUSEPORT_CBPF`, no privilege
//!   needed) reads the destination QPN from the BTH (bytes 5..8 of the UDP payload) and
//!   returns `QPN >> 16`, an index into the group's socket array;
//! - a process owns the QPNs `slot << 16 | n`: slot `k` is the `k`-th socket of the group.
//!
//! The kernel's array shifts when a member other than the last closes, so one process must
//! create, hold and never close the sockets while any user lives: a small per-address port
//! keeper, forked on demand by the first process that opens the address. It listens on the
//! abstract Unix socket `@srdma-port-ADDRESS-PORT`, hands each process a duplicate of one
//! socket (its slot) with `SCM_RIGHTS`, takes the slot back when the process's connection
//! closes (it drains the socket before handing it out again), keeps slot 0 (QPNs below
//! 0x10000, QP1 among them) for itself, and exits once it has had no user for a few seconds.
//!
//! Packets then go straight from the kernel to the owning process: the sharing costs nothing
//! per packet. A QPN whose slot has no socket falls back to the kernel's hash and is dropped
//! as an unknown QP by whichever process gets it, which is what a NIC does with it.
//!
//! QP1 is host-wide, so its packets (IB CM MADs) need steering by their contents. The same
//! BPF program does it (see `steering_program`): a REQ or SIDR_REQ goes to the process that
//! registered a listen for its service ID ([`register_listen`]; the keeper rebuilds the
//! program on every change), any other CM message to the process named by its remote
//! communication ID, whose top byte is the slot of the process that chose it
//! ([`comm_id_prefix`]). So a MAD, like a data packet, goes straight to its process: no
//! extra hop, no extra process woken (under qemu's TCG, where the lab measures connection
//! setup, that hop cost a process switch per MAD). What no process claims — a REQ for a
//! service nobody listens on, a REQ that arrived before the program named its new listen —
//! reaches the keeper on slot 0: it answers the first with a REJ, as a kernel CM does, and
//! forwards the second over the process's connection ([`FWD_HDR`] bytes of source address,
//! then the UDP payload), which the process handles as if its own socket had received it
//! (same addresses, same ICRC).
//!
//! A process that dies without `exit` leaves its rdma_cm connections behind; the kernel
//! answers that by sending a DREQ for each, so the peer learns of it at once. The keeper
//! does the same: a process keeps its established connections in a [`ConnTable`], memory it
//! shares with the keeper (a sealed memfd sent over its connection on first use: a
//! connection costs a table entry under a process-local lock, no message, no syscall); when
//! a process's connection to the keeper closes, the keeper reads the table and sends a DREQ
//! from QP1 for every connection still in it (and again a few times over 1.5 s, as a CM
//! resends a DREQ whose DREP does not come: see [`DREQ_RESENDS`]).

use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The slots, 1..=MAX_SLOT, one process each (slot 0 is the keeper's).
const MAX_SLOT: u8 = 255;
/// How long the keeper stays without users before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(3);

/// When the keeper sends a dead process's DREQ again, after the first: DREQ and DREP are
/// datagrams, and a kernel CM resends its DREQ until the DREP comes. The keeper does not
/// watch for DREPs (they go to the dead process's slot); a peer answers every copy (a
/// connection already gone gets a DREP too), so a few copies cost a few MADs.
const DREQ_RESENDS: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(500),
    Duration::from_millis(1500),
];

/// The DREQs a keeper still has to send again: pure bookkeeping on a caller's clock.
#[derive(Default)]
struct DreqResends {
    /// (when first sent, the connection, its MAD's transaction ID, copies sent again).
    pending: Vec<(Instant, CmConn, u64, usize)>,
}

impl DreqResends {
    /// Records a DREQ first sent at `at` with transaction ID `tid`.
    fn sent(&mut self, at: Instant, c: CmConn, tid: u64) {
        self.pending.push((at, c, tid, 0));
    }

    /// The DREQs due again at `now` (each returned once per entry of [`DREQ_RESENDS`]).
    fn due(&mut self, now: Instant) -> Vec<(CmConn, u64)> {
        let mut out = Vec::new();
        for (at, c, tid, n) in &mut self.pending {
            if now >= *at + DREQ_RESENDS[*n] {
                out.push((*c, *tid));
                *n += 1;
            }
        }
        self.pending.retain(|&(_, _, _, n)| n < DREQ_RESENDS.len());
        out
    }

    /// When the next copy is due, if any.
    fn next(&self) -> Option<Instant> {
        self.pending
            .iter()
            .map(|(at, _, _, n)| *at + DREQ_RESENDS[*n])
            .min()
    }
}

/// Bytes before a forwarded datagram: address family (4 or 6), port (big-endian), address
/// (16 bytes; IPv4 in the last 4).
pub(crate) const FWD_HDR: usize = 19;

/// The top byte of communication IDs a process with `slot` picks (0 when unshared: any).
pub(crate) fn comm_id_prefix(slot: u8) -> u32 {
    u32::from(slot) << 24
}

/// Asks the keeper on `conn` to forward REQs for `service_id` to this process.
pub(crate) fn register_listen(conn: &OwnedFd, service_id: u64) -> io::Result<()> {
    let mut m = [0u8; 9];
    m[0] = b'L';
    m[1..].copy_from_slice(&service_id.to_be_bytes());
    tell(conn, &m)
}

/// An established CM connection of a process, for the DREQ the keeper sends should the
/// process die with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CmConn {
    /// This side's communication ID.
    pub(crate) local_comm_id: u32,
    /// The peer's.
    pub(crate) remote_comm_id: u32,
    /// The peer's QPN.
    pub(crate) remote_qpn: u32,
    /// The peer's address and UDP port.
    pub(crate) peer: SocketAddr,
}

/// Connections a [`ConnTable`] holds at most (more are not recorded: a peer of one of those
/// is left to its own timers should the process die).
const TABLE_RECORDS: usize = 65536;
/// 32-bit words per record: state (1 = live), local and remote communication IDs, the
/// peer's QPN, its UDP port, its address (4 words, IPv4 as IPv4-mapped IPv6).
const RECORD_WORDS: usize = 9;

/// A process's established CM connections, in a memfd shared with its port keeper, which
/// sends their DREQs should the process die. Every word is read and written as an atomic
/// (the other process reads them while this one writes); a record's state is stored last
/// when it is filled and first when it is emptied, so the keeper sees whole records only.
/// Record 0 is the header: word 0 is how many records have ever been used (the keeper reads
/// no further).
pub(crate) struct ConnTable {
    /// The table's words, inside `_mem`.
    words: &'static [AtomicU32],
    /// The shared mapping (unmapped when the table goes).
    _mem: crate::shm::ring::Mem,
    alloc: std::sync::Mutex<TableAlloc>,
}

// SAFETY: the mapping is reached only through `words`, atomics, and `alloc` is a Mutex.
unsafe impl Sync for ConnTable {}

#[derive(Default)]
struct TableAlloc {
    /// Records freed, for reuse.
    free: Vec<u32>,
    /// Records in use, by local communication ID.
    used: std::collections::HashMap<u32, u32>,
}

impl std::fmt::Debug for ConnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnTable")
    }
}

impl ConnTable {
    const BYTES: usize = TABLE_RECORDS * RECORD_WORDS * 4;

    /// A new, empty table and its memfd (sealed against shrinking, for the keeper).
    fn create() -> io::Result<(ConnTable, OwnedFd)> {
        let fd = crate::shm::port::memfd(c"srdma-cm-connections", ConnTable::BYTES)?;
        let mem = crate::shm::port::map_sealed(&fd, ConnTable::BYTES)?;
        Ok((ConnTable::of(mem), fd))
    }

    /// The table in memfd `fd` a process sent (the keeper's view), if it is one: sealed
    /// and long enough, so that no read of it can fault.
    fn map(fd: &OwnedFd) -> Result<ConnTable, &'static str> {
        crate::shm::port::map_checked(fd, ConnTable::BYTES).map(ConnTable::of)
    }

    fn of(mem: crate::shm::ring::Mem) -> ConnTable {
        let (ptr, len) = mem.raw();
        // SAFETY: a live, page-aligned, zero-filled shared mapping of `len` bytes that lives
        // as long as the table (`_mem`); AtomicU32 has u32's layout, and both processes
        // reach the words only atomically.
        let words = unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU32>(), len / 4) };
        ConnTable {
            words,
            _mem: mem,
            alloc: std::sync::Mutex::new(TableAlloc::default()),
        }
    }

    /// Creates a table and hands its memfd to the keeper on `conn`.
    pub(crate) fn share_with(conn: &OwnedFd) -> io::Result<ConnTable> {
        let (t, fd) = ConnTable::create()?;
        send_slot(conn, b'T', fd.as_raw_fd())?;
        Ok(t)
    }

    fn record(&self, i: u32) -> &[AtomicU32] {
        let at = i as usize * RECORD_WORDS;
        &self.words[at..at + RECORD_WORDS]
    }

    /// Records `c` (nothing when the table is full).
    pub(crate) fn insert(&self, c: &CmConn) {
        let mut a = self
            .alloc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = match a.free.pop() {
            Some(i) => i,
            None => {
                let used = self.words[0].load(Ordering::Relaxed).max(1);
                if used as usize >= TABLE_RECORDS {
                    return;
                }
                self.words[0].store(used + 1, Ordering::Release);
                used
            }
        };
        let r = self.record(i);
        let ip = match c.peer.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        }
        .octets();
        let fields = [
            c.local_comm_id,
            c.remote_comm_id,
            c.remote_qpn,
            u32::from(c.peer.port()),
        ];
        for (w, v) in r[1..5].iter().zip(fields) {
            w.store(v, Ordering::Relaxed);
        }
        for (w, b) in r[5..9].iter().zip(ip.chunks_exact(4)) {
            w.store(
                u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                Ordering::Relaxed,
            );
        }
        r[0].store(1, Ordering::Release);
        if let Some(old) = a.used.insert(c.local_comm_id, i) {
            // The same ID twice: the first record goes.
            self.record(old)[0].store(0, Ordering::Release);
            a.free.push(old);
        }
    }

    /// Forgets connection `local_comm_id` (nothing if it is not there).
    pub(crate) fn remove(&self, local_comm_id: u32) {
        let mut a = self
            .alloc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = a.used.remove(&local_comm_id) {
            self.record(i)[0].store(0, Ordering::Release);
            a.free.push(i);
        }
    }

    /// The connections recorded (the keeper's read, after the process died).
    fn live(&self) -> Vec<CmConn> {
        let used = (self.words[0].load(Ordering::Acquire) as usize).min(TABLE_RECORDS);
        (1..used as u32)
            .filter_map(|i| {
                let r = self.record(i);
                if r[0].load(Ordering::Acquire) != 1 {
                    return None;
                }
                let w: Vec<u32> = r.iter().map(|w| w.load(Ordering::Relaxed)).collect();
                let mut ip = [0u8; 16];
                for (b, v) in ip.chunks_exact_mut(4).zip(&w[5..9]) {
                    b.copy_from_slice(&v.to_be_bytes());
                }
                let ip = std::net::Ipv6Addr::from(ip);
                let ip: std::net::IpAddr = ip.to_ipv4_mapped().map_or(ip.into(), Into::into);
                Some(CmConn {
                    local_comm_id: w[1],
                    remote_comm_id: w[2],
                    remote_qpn: w[3],
                    peer: SocketAddr::new(ip, w[4] as u16),
                })
            })
            .collect()
    }
}

/// Sends one message to the keeper on `conn`.
fn tell(conn: &OwnedFd, m: &[u8]) -> io::Result<()> {
    // SAFETY: sends the live message on our own socket.
    let n = unsafe {
        libc::send(
            conn.as_raw_fd(),
            m.as_ptr().cast(),
            m.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if usize::try_from(n) == Ok(m.len()) {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Receives one datagram the keeper forwarded on `conn`, if one is waiting: its source and
/// its bytes (in `buf`).
pub(crate) fn recv_forwarded(conn: &OwnedFd, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
    // SAFETY: receives into a live buffer of its length; non-blocking.
    let n = unsafe {
        libc::recv(
            conn.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    let n = usize::try_from(n).ok()?;
    if n < FWD_HDR {
        return None;
    }
    let port = u16::from_be_bytes([buf[1], buf[2]]);
    let ip: std::net::IpAddr = match buf[0] {
        4 => std::net::Ipv4Addr::new(buf[15], buf[16], buf[17], buf[18]).into(),
        _ => {
            let mut a = [0u8; 16];
            a.copy_from_slice(&buf[3..19]);
            std::net::Ipv6Addr::from(a).into()
        }
    };
    buf.copy_within(FWD_HDR..n, 0);
    Some((SocketAddr::new(ip, port), n - FWD_HDR))
}

/// A process's share of an address and port.
#[derive(Debug)]
pub(crate) struct Share {
    /// Its member of the port's `SO_REUSEPORT` group.
    pub(crate) socket: std::net::UdpSocket,
    /// Its slot: it owns the QPNs `slot << 16 | n`.
    pub(crate) slot: u8,
    /// The connection to the keeper: open for as long as the slot is ours.
    pub(crate) keeper: OwnedFd,
}

/// Whether devices on port 4791 share it (`SRDMA_SHARE_PORT=0` turns it off).
pub(crate) fn enabled() -> bool {
    !matches!(
        std::env::var("SRDMA_SHARE_PORT").as_deref(),
        Ok("0" | "off" | "no")
    )
}

fn name_of(addr: SocketAddr) -> Vec<u8> {
    format!("srdma-port-{}-{}", addr.ip(), addr.port()).into_bytes()
}

/// A libc return value as a result (negative: `errno`).
pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An abstract Unix address for `name` (also the shared-memory driver's rendezvous names).
pub(crate) fn unix_addr(name: &[u8]) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all zeroes is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // Abstract: a leading NUL, then the name (no file, gone with the socket).
    let n = name.len().min(a.sun_path.len() - 1);
    for (d, s) in a.sun_path[1..=n].iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as libc::socklen_t)
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket() has no memory arguments; the descriptor is owned below.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn connect_keeper(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (a, len) = unix_addr(name);
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), (&raw const a).cast(), len) })?;
    Ok(fd)
}

/// Receives the keeper's answer: one byte (the slot, 0 = refused) and a descriptor.
fn recv_slot(conn: &OwnedFd) -> io::Result<(u8, OwnedFd)> {
    let mut byte = [0u8; 1];
    // A keeper that does not answer within the timeout is treated as absent.
    set_timeout(conn.as_raw_fd(), Duration::from_secs(2));
    match recv_with_fd(conn.as_raw_fd(), &mut byte, 0) {
        (1, Some(fd)) => Ok((byte[0], fd)),
        (1, None) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the port keeper sent no socket (answer {})", byte[0]),
        )),
        (0, _) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the port keeper closed",
        )),
        _ => Err(io::Error::last_os_error()),
    }
}

fn set_timeout(fd: RawFd, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

/// Joins the processes sharing `addr`, starting the keeper if there is none.
pub(crate) fn acquire(addr: SocketAddr) -> io::Result<Share> {
    let name = name_of(addr);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut spawned = false;
    loop {
        match connect_keeper(&name) {
            Ok(conn) => {
                let (slot, fd) = match recv_slot(&conn) {
                    Ok(v) => v,
                    // The keeper was exiting (idle) as we connected: start another.
                    Err(e)
                        if e.kind() == io::ErrorKind::UnexpectedEof
                            && Instant::now() < deadline =>
                    {
                        spawned = false;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if slot == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("all {MAX_SLOT} processes slots of {addr} are taken"),
                    ));
                }
                // SAFETY: the keeper sent a UDP socket; we own this duplicate.
                let socket = unsafe { std::net::UdpSocket::from_raw_fd(fd.into_raw_fd_owned()) };
                return Ok(Share {
                    socket,
                    slot,
                    keeper: conn,
                });
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ECONNREFUSED | libc::ENOENT | libc::EAGAIN)
                ) && Instant::now() < deadline =>
            {
                if !spawned {
                    spawn_keeper(addr, &name)?;
                    spawned = true;
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

trait IntoRawOwned {
    fn into_raw_fd_owned(self) -> RawFd;
}

impl IntoRawOwned for OwnedFd {
    fn into_raw_fd_owned(self) -> RawFd {
        std::os::fd::IntoRawFd::into_raw_fd(self)
    }
}

/// A UDP socket bound to `addr` as a member of its `SO_REUSEPORT` group.
fn reuseport_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: socket() has no memory arguments; the descriptor is owned below.
    let fd = cvt(unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: a valid int option.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = crate::sys::to_sockaddr(addr, &mut sa);
    // SAFETY: `sa` is a sockaddr_storage holding `len` valid bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) })?;
    // DF, so the kernel gives what the keeper sends on slot 0 (REJs, DREQs) the IPv4 ID its
    // ICRC was computed with (0): rxe and NICs drop a packet whose ICRC does not match.
    crate::udp::set_dont_fragment(fd.as_raw_fd(), addr.is_ipv6())?;
    Ok(fd)
}

/// Listens the steering program names; REQs for more reach the keeper, which forwards them.
const STEERED_LISTENS: usize = 800;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The classic BPF program that picks a datagram's socket in the port's `SO_REUSEPORT`
/// group (its return value is the socket's index, which is the slot; an index beyond the
/// group falls back to the kernel's hash). Offsets are in the UDP payload:
///
/// - a data packet goes to the slot of its destination QPN (`QPN >> 16`);
/// - a CM MAD on QP1 goes where the keeper would forward it, without the keeper: a REQ or
///   SIDR_REQ to the slot listening on its service ID (`listens`), a SIDR_REP to the top
///   byte of its request ID, any other CM message to the top byte of its remote
///   communication ID; what no process claims (slot 0, an unknown service, another
///   management class, a datagram too short to load from) goes to the keeper's socket.
fn steering_program(listens: &[(u64, usize)]) -> Vec<libc::sock_filter> {
    // BPF_LD|BPF_W|BPF_ABS, BPF_LD|BPF_H|BPF_ABS, BPF_LD|BPF_B|BPF_ABS.
    const LDW: u16 = 0x20;
    const LDH: u16 = 0x28;
    const LDB: u16 = 0x30;
    // BPF_ALU|BPF_AND|BPF_K, BPF_ALU|BPF_RSH|BPF_K, BPF_JMP|BPF_JEQ|BPF_K.
    const AND: u16 = 0x54;
    const RSH: u16 = 0x74;
    const JEQ: u16 = 0x15;
    // BPF_RET|BPF_A, BPF_RET|BPF_K.
    const RET_A: u16 = 0x16;
    const RET_K: u16 = 0x06;
    // BTH (12) + DETH (8): the MAD; its class at 1, attribute at 16, message at 24.
    const MAD: u32 = 20;
    use srdma_wire::cm::{MGMT_CLASS_CM, attr};
    let mut p = vec![
        insn(LDW, 0, 0, 4),
        insn(AND, 0, 0, 0x00FF_FFFF),
        insn(JEQ, 2, 0, 1), // QP1: 5
        insn(RSH, 0, 0, 16),
        insn(RET_A, 0, 0, 0),
        insn(LDB, 0, 0, MAD + 1),
        insn(JEQ, 0, 8, u32::from(MGMT_CLASS_CM)), // not CM: 15
        insn(LDH, 0, 0, MAD + 16),
        insn(JEQ, 7, 0, u32::from(attr::REQ)),      // 16
        insn(JEQ, 6, 0, u32::from(attr::SIDR_REQ)), // 16
        insn(JEQ, 0, 2, u32::from(attr::SIDR_REP)), // else 13
        insn(LDB, 0, 0, MAD + 24),                  // request ID's top byte
        insn(RET_A, 0, 0, 0),
        insn(LDB, 0, 0, MAD + 24 + 4), // remote communication ID's top byte
        insn(RET_A, 0, 0, 0),
        insn(RET_K, 0, 0, 0),
    ];
    // 16: the service ID (message bytes 8..16) against each listen.
    for &(sid, slot) in listens.iter().take(STEERED_LISTENS) {
        p.extend([
            insn(LDW, 0, 0, MAD + 24 + 8),
            insn(JEQ, 0, 3, (sid >> 32) as u32),
            insn(LDW, 0, 0, MAD + 24 + 12),
            insn(JEQ, 0, 1, sid as u32),
            insn(RET_K, 0, 0, slot as u32),
        ]);
    }
    p.push(insn(RET_K, 0, 0, 0));
    p
}

/// Attaches [`steering_program`] to the port's group (through any member socket; a new
/// program replaces the old one at once).
fn attach_steering(fd: RawFd, listens: &[(u64, usize)]) -> io::Result<()> {
    let mut prog = steering_program(listens);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: a valid sock_fprog pointing at `prog`, which outlives the call.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&raw const fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Forks the keeper for `addr` (detached: a grandchild in its own session) and waits until it
/// listens or says why it cannot.
fn spawn_keeper(addr: SocketAddr, name: &[u8]) -> io::Result<()> {
    let mut p = [0 as libc::c_int; 2];
    // SAFETY: `p` has room for two descriptors.
    cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptors we own.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    // SAFETY: fork has no memory arguments. The child only calls async-signal-safe functions
    // and the keeper below, which allocates (glibc's malloc is usable after fork) and makes
    // system calls; it never returns into the parent's code.
    let pid = cvt(unsafe { libc::fork() })?;
    if pid == 0 {
        // SAFETY: in the child: a new session, then a grandchild so the keeper is not our
        // caller's child (no zombie, no SIGCHLD for the application).
        unsafe {
            libc::setsid();
            if libc::fork() != 0 {
                libc::_exit(0);
            }
        }
        // The keeper is srdma's own daemon: it takes none of the signal mask of the thread
        // that forked it (one of srdma's threads blocks all, an application's may block
        // SIGTERM), so that it can be stopped as any process can.
        // SAFETY: an empty set, set as this (only) thread's mask.
        unsafe {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        }
        let code = keeper(addr, name, wr.as_raw_fd());
        // SAFETY: ends the keeper process without running the parent's atexit handlers.
        unsafe { libc::_exit(code) }
    }
    drop(wr);
    let mut st = 0;
    // SAFETY: reaps the intermediate child, which exits at once.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let mut answer = [0u8; 4];
    set_timeout(rd.as_raw_fd(), Duration::from_secs(3));
    // SAFETY: reads at most 4 bytes into a live buffer.
    let n = unsafe { libc::read(rd.as_raw_fd(), answer.as_mut_ptr().cast(), 4) };
    match n {
        // 0: listening; another keeper already listening is as good.
        4 => match i32::from_ne_bytes(answer) {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        },
        _ => Err(io::Error::other("the port keeper did not start")),
    }
}

/// The keeper's life: returns its exit code.
fn keeper(addr: SocketAddr, name: &[u8], ready: RawFd) -> i32 {
    let say = |e: i32| {
        let b = e.to_ne_bytes();
        // SAFETY: writes 4 bytes from a live buffer to the pipe.
        unsafe { libc::write(ready, b.as_ptr().cast(), 4) };
    };
    // Keep nothing of the application's: its sockets must close when it exits, and whoever
    // reads its output must not wait for the keeper to end.
    // SAFETY: replacing stdio with /dev/null and closing descriptors we abandon; `ready` is
    // kept.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
        }
        for fd in 3..ready {
            libc::close(fd);
        }
        libc::close_range(ready as u32 + 1, u32::MAX, 0);
    }
    let listener = match seqpacket() {
        Ok(l) => l,
        Err(e) => {
            say(e.raw_os_error().unwrap_or(libc::EIO));
            return 1;
        }
    };
    let (ua, len) = unix_addr(name);
    // SAFETY: a valid sockaddr_un of `len` bytes.
    if unsafe { libc::bind(listener.as_raw_fd(), (&raw const ua).cast(), len) } < 0 {
        // Another keeper won the race: the caller connects to it.
        say(0);
        return 0;
    }
    let mut sockets = Vec::new();
    match reuseport_socket(addr).and_then(|s| attach_steering(s.as_raw_fd(), &[]).map(|()| s)) {
        Ok(s) => sockets.push(s),
        Err(e) => {
            say(e.raw_os_error().unwrap_or(libc::EIO));
            return 1;
        }
    }
    // SAFETY: listen on our own socket.
    if unsafe { libc::listen(listener.as_raw_fd(), 64) } < 0 {
        say(libc::EIO);
        return 1;
    }
    say(0);
    // SAFETY: the pipe's write end is ours; the parent saw the answer.
    unsafe { libc::close(ready) };
    // users[slot] = the connection of the process holding that slot.
    let mut users: Vec<Option<OwnedFd>> = (0..=MAX_SLOT).map(|_| None).collect();
    // (service ID, slot) of the CM listens the processes registered.
    let mut listens: Vec<(u64, usize)> = Vec::new();
    // tables[slot] = the CM connections of the process holding that slot.
    let mut tables: Vec<Option<ConnTable>> = (0..=MAX_SLOT).map(|_| None).collect();
    let mut idle_since = Some(Instant::now());
    let mut resends = DreqResends::default();
    loop {
        if idle_since.is_some_and(|t| t.elapsed() >= IDLE_EXIT) && resends.next().is_none() {
            return 0;
        }
        let now = Instant::now();
        for (c, tid) in resends.due(now) {
            send_dreq(sockets[0].as_raw_fd(), addr.ip(), &c, tid);
        }
        let wait = resends.next().map_or(500, |t| {
            t.saturating_duration_since(now).as_millis().min(500) as i32
        });
        let mut fds = vec![
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sockets[0].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let slots: Vec<usize> = (1..users.len()).filter(|&i| users[i].is_some()).collect();
        for &i in &slots {
            fds.push(libc::pollfd {
                fd: users[i].as_ref().map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a live array of its stated length.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if r <= 0 {
            continue;
        }
        let mut relisted = false;
        for (k, &i) in slots.iter().enumerate() {
            if fds[2 + k].revents == 0 {
                continue;
            }
            // Every message waiting.
            loop {
                let mut m = [0u8; 16];
                let fd = users[i].as_ref().map_or(-1, |f| f.as_raw_fd());
                let (n, passed) = recv_with_fd(fd, &mut m, libc::MSG_DONTWAIT);
                let msg = &m[..usize::try_from(n).unwrap_or(0)];
                if msg.len() == 9 && msg[0] == b'L' {
                    let sid = u64::from_be_bytes(m[1..9].try_into().unwrap_or([0; 8]));
                    listens.retain(|&(s, _)| s != sid);
                    listens.push((sid, i));
                    relisted = true;
                } else if msg == b"T" {
                    tables[i] = passed.and_then(|f| ConnTable::map(&f).ok());
                } else if n == 0
                    || (n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock)
                {
                    // The process closed its connection (exited): the slot is free again,
                    // its listens go, and its peers hear of the connections it left.
                    users[i] = None;
                    let before = listens.len();
                    listens.retain(|&(_, slot)| slot != i);
                    relisted |= listens.len() != before;
                    for c in tables[i].take().map(|t| t.live()).unwrap_or_default() {
                        let tid = crate::random_u64();
                        send_dreq(sockets[0].as_raw_fd(), addr.ip(), &c, tid);
                        resends.sent(Instant::now(), c, tid);
                    }
                    break;
                } else if n < 0 {
                    break; // nothing more waiting
                }
            }
        }
        if relisted {
            // REQs for the listens go straight to their processes from now on. (Should
            // the kernel refuse the program, the old one stays: REQs then reach the keeper,
            // which forwards them.)
            let _ = attach_steering(sockets[0].as_raw_fd(), &listens);
        }
        // After the registrations: a listen registered just before its first REQ arrived
        // must not see that REQ rejected.
        if fds[1].revents != 0 {
            forward_qp1(sockets[0].as_raw_fd(), &users, &listens);
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // SAFETY: accept on our listener; no address wanted.
            let c = unsafe {
                libc::accept4(
                    listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if c >= 0 {
                // SAFETY: a fresh descriptor we own.
                let conn = unsafe { OwnedFd::from_raw_fd(c) };
                let slot = (1..users.len()).find(|&i| users[i].is_none());
                let given = slot.and_then(|i| {
                    // Sockets are created in slot order and never closed while users live,
                    // so the kernel's array index of sockets[i] is i.
                    while sockets.len() <= i {
                        match reuseport_socket(addr) {
                            Ok(s) => sockets.push(s),
                            Err(_) => return None,
                        }
                    }
                    drain(sockets[i].as_raw_fd());
                    send_slot(&conn, i as u8, sockets[i].as_raw_fd()).ok()?;
                    Some(i)
                });
                match given {
                    Some(i) => users[i] = Some(conn),
                    None => {
                        let _ = send_slot(&conn, 0, sockets[0].as_raw_fd());
                    }
                }
            }
        }
        idle_since = if users.iter().any(Option::is_some) {
            None
        } else {
            idle_since.or_else(|| Some(Instant::now()))
        };
    }
}

/// Receives what slot 0's socket got (QPNs below 0x10000) and forwards the CM MADs on QP1 to
/// the process they concern (see the module doc); drops the rest, as a NIC drops packets for
/// QPs that do not exist.
fn forward_qp1(fd: RawFd, users: &[Option<OwnedFd>], listens: &[(u64, usize)]) {
    let mut buf = vec![0u8; FWD_HDR + 65536];
    loop {
        // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
        let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut salen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: receives into the live buffer after the header room; `sa` is large enough
        // for any address.
        let n = unsafe {
            libc::recvfrom(
                fd,
                buf[FWD_HDR..].as_mut_ptr().cast(),
                buf.len() - FWD_HDR,
                libc::MSG_DONTWAIT,
                (&raw mut sa).cast(),
                &mut salen,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return;
        };
        let Some(from) = crate::sys::from_sockaddr(&sa) else {
            continue;
        };
        let pkt = &buf[FWD_HDR..FWD_HDR + n];
        let Some(slot) = cm_destination(pkt, listens) else {
            reject_unknown_service(fd, pkt, from);
            continue;
        };
        let Some(conn) = users.get(slot).and_then(Option::as_ref) else {
            continue;
        };
        let (fam, ip) = match from.ip() {
            std::net::IpAddr::V4(v4) => {
                let mut a = [0u8; 16];
                a[12..].copy_from_slice(&v4.octets());
                (4u8, a)
            }
            std::net::IpAddr::V6(v6) => (6u8, v6.octets()),
        };
        buf[0] = fam;
        buf[1..3].copy_from_slice(&from.port().to_be_bytes());
        buf[3..19].copy_from_slice(&ip);
        // SAFETY: sends the live header + datagram; a full connection drops it (MADs are
        // retried by their sender).
        unsafe {
            libc::send(
                conn.as_raw_fd(),
                buf.as_ptr().cast(),
                FWD_HDR + n,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
    }
}

/// Answers a REQ for a service nobody on this address listens on with a REJ, reason 8
/// (invalid service ID), from QP1, as a kernel's CM does; anything else is dropped.
fn reject_unknown_service(fd: RawFd, pkt: &[u8], from: SocketAddr) {
    use srdma_wire::cm::{self as wire, CmMsg, MadHdr};
    use srdma_wire::{PacketRepr, Qpn};
    let Ok(p) = PacketRepr::parse_bytes(pkt) else {
        return;
    };
    if p.bth.dest_qpn != Qpn::GSI || p.payload.len() < wire::MAD_LEN {
        return;
    }
    let Ok((hdr, CmMsg::Req(req))) = CmMsg::parse_mad(p.payload) else {
        return;
    };
    let rej = CmMsg::Rej(wire::Rej {
        local_comm_id: 0,
        remote_comm_id: req.local_comm_id,
        message_rejected: 0,
        rejected_info_length: 0,
        reason: 8,
        additional_info: [0; 72],
        private_data: [0; 148],
    });
    let mut mad = [0u8; wire::MAD_LEN];
    if rej
        .emit_mad(&MadHdr::cm(wire::attr::REJ, hdr.tid), &mut mad)
        .is_err()
    {
        return;
    }
    // Our address is the REQ's destination: the GID it names as the remote one.
    let local = std::net::Ipv6Addr::from(req.primary_remote_gid);
    let local: std::net::IpAddr = local.to_ipv4_mapped().map_or(local.into(), Into::into);
    send_mad(
        fd,
        local,
        SocketAddr::new(from.ip(), srdma_wire::ROCEV2_PORT),
        &mad,
    );
}

/// Sends the DREQ of connection `c`, whose process ended without disconnecting it, from
/// QP1 of `local`, as the kernel's CM does for the ids of a process that exits. The peer
/// answers with a DREP to the dead process's slot, which the keeper drains.
fn send_dreq(fd: RawFd, local: std::net::IpAddr, c: &CmConn, tid: u64) {
    use srdma_wire::cm::{self as wire, CmMsg, MadHdr};
    let dreq = CmMsg::Dreq(wire::Dreq {
        local_comm_id: c.local_comm_id,
        remote_comm_id: c.remote_comm_id,
        remote_qpn: c.remote_qpn,
        private_data: [0; 220],
    });
    let mut mad = [0u8; wire::MAD_LEN];
    if dreq
        .emit_mad(&MadHdr::cm(wire::attr::DREQ, tid), &mut mad)
        .is_ok()
    {
        send_mad(fd, local, c.peer, &mad);
    }
}

/// Sends `mad` from QP1 of `local` to QP1 at `to`, on the keeper's socket `fd`.
fn send_mad(fd: RawFd, local: std::net::IpAddr, to: SocketAddr, mad: &[u8]) {
    use srdma_wire::{BthRepr, DethRepr, Encap, IpRepr, Opcode, PacketRepr, Psn, Qpn};
    let Ok(ip) = IpRepr::between(local, to.ip()) else {
        return;
    };
    let encap = Encap {
        ip,
        src_port: srdma_wire::ROCEV2_PORT,
        dst_port: to.port(),
    };
    let mut out = PacketRepr::new(
        BthRepr {
            opcode: Opcode::UdSendOnly,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: Qpn::GSI,
            ack_req: false,
            psn: Psn::new(0),
        },
        mad,
    );
    out.deth = Some(DethRepr {
        qkey: srdma_wire::deth::GSI_QKEY,
        src_qpn: Qpn::GSI,
    });
    let mut buf = [0u8; 400];
    let Ok(n) = out.emit_with_icrc(&mut buf, &encap) else {
        return;
    };
    // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
    let mut sa: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = crate::sys::to_sockaddr(to, &mut sa);
    // SAFETY: sends `n` live bytes to a valid address.
    unsafe { libc::sendto(fd, buf.as_ptr().cast(), n, 0, (&raw const sa).cast(), len) };
}

/// The slot a datagram for QP1 goes to: a REQ's or SIDR_REQ's listener, else the slot in
/// the top byte of the remote communication ID (the request ID of a SIDR_REP).
fn cm_destination(pkt: &[u8], listens: &[(u64, usize)]) -> Option<usize> {
    // BTH (12) + DETH (8) + MAD header (24) + the first 16 bytes of the message.
    const MAD: usize = 20;
    if pkt.len() < MAD + 24 + 16 || u32::from_be_bytes([0, pkt[5], pkt[6], pkt[7]]) != 1 {
        return None;
    }
    let mad = &pkt[MAD..];
    if mad[1] != srdma_wire::cm::MGMT_CLASS_CM {
        return None;
    }
    let attr = u16::from_be_bytes([mad[16], mad[17]]);
    let msg = &mad[24..];
    let id_at = |at: usize| u32::from_be_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]]);
    use srdma_wire::cm::attr;
    match attr {
        attr::REQ | attr::SIDR_REQ => {
            let sid = u64::from_be_bytes(msg[8..16].try_into().ok()?);
            listens.iter().find(|l| l.0 == sid).map(|l| l.1)
        }
        attr::SIDR_REP => Some((id_at(0) >> 24) as usize),
        _ => Some((id_at(4) >> 24) as usize).filter(|&s| s != 0),
    }
}

/// Discards what a socket has queued (packets for a slot's previous owner).
fn drain(fd: RawFd) {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: receives into a live buffer; non-blocking.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return;
        }
    }
}

/// Receives one message of at most `buf.len()` bytes on `fd` (`flags` as recvmsg's), and the
/// first descriptor it carried, if any (any other is closed): recvmsg's result and the
/// descriptor.
fn recv_with_fd(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> (isize, Option<OwnedFd>) {
    let r = crate::shm::port::recv_msg(fd, buf, flags);
    (r.n, r.fds.into_iter().next())
}

fn send_slot(conn: &OwnedFd, slot: u8, fd: RawFd) -> io::Result<()> {
    let byte = [slot];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr().cast_mut().cast(),
        iov_len: 1,
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    // SAFETY: the control buffer is large enough for one SCM_RIGHTS cmsg with one fd.
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(&msg);
        (*cm).cmsg_level = libc::SOL_SOCKET;
        (*cm).cmsg_type = libc::SCM_RIGHTS;
        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<RawFd>(), fd);
    }
    // SAFETY: `msg` points at live buffers.
    let n = unsafe { libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n == 1 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use srdma_wire::cm::{self as wire, CmMsg, MadHdr};

    #[test]
    fn a_dead_processs_dreq_goes_again_on_schedule_then_stops() {
        let c = CmConn {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: 3,
            peer: "10.1.2.3:4791".parse().unwrap(),
        };
        let t0 = Instant::now();
        let mut r = DreqResends::default();
        assert_eq!(r.next(), None);
        r.sent(t0, c, 77);
        assert_eq!(r.next(), Some(t0 + DREQ_RESENDS[0]));
        assert!(r.due(t0).is_empty(), "the first copy was just sent");
        assert_eq!(
            r.due(t0 + DREQ_RESENDS[0]),
            vec![(c, 77)],
            "same transaction"
        );
        assert!(r.due(t0 + DREQ_RESENDS[0]).is_empty(), "once per step");
        // A late wake sends one copy, not every step it slept through.
        assert_eq!(r.due(t0 + Duration::from_secs(60)).len(), 1);
        assert_eq!(r.due(t0 + Duration::from_secs(60)).len(), 1);
        assert_eq!(r.next(), None, "done after {} copies", DREQ_RESENDS.len());
        assert!(r.due(t0 + Duration::from_secs(120)).is_empty());
    }

    #[test]
    fn the_keepers_view_of_a_table_holds_the_live_connections() {
        let (t, fd) = ConnTable::create().unwrap();
        let keeper = ConnTable::map(&fd).unwrap();
        assert!(keeper.live().is_empty());
        let conn = |id: u32, peer: &str| CmConn {
            local_comm_id: id,
            remote_comm_id: !id,
            remote_qpn: 0x01_0011 + id,
            peer: peer.parse().unwrap(),
        };
        let (a, b, c) = (
            conn(0x0301_0001, "10.1.2.3:4791"),
            conn(0x0301_0002, "[fd00::7]:4791"),
            conn(0x0301_0003, "127.0.0.1:18515"),
        );
        for x in [&a, &b, &c] {
            t.insert(x);
        }
        t.remove(b.local_comm_id);
        t.remove(0x0301_0009); // not there: nothing
        assert_eq!(keeper.live(), vec![a, c]);
        // A freed record is reused; the same ID twice keeps the newer.
        let d = conn(0x0301_0004, "10.9.9.9:4791");
        t.insert(&d);
        let c2 = CmConn { remote_qpn: 7, ..c };
        t.insert(&c2);
        let mut live = keeper.live();
        live.sort_by_key(|x| x.local_comm_id);
        assert_eq!(live, vec![a, c2, d]);
        assert_eq!(
            keeper.words[0].load(Ordering::Relaxed),
            5,
            "header + 4 records used"
        );
    }

    #[test]
    fn the_keeper_refuses_a_table_that_could_fault() {
        // Sealed but shorter than a table: reading it would fault past the end.
        let short = crate::shm::port::memfd(c"short", 4096).unwrap();
        assert!(ConnTable::map(&short).is_err());
        // Long enough but not sealed: the sender could shrink it under the keeper.
        // SAFETY: a NUL-terminated name; the descriptor returned is ours.
        let fd = unsafe {
            OwnedFd::from_raw_fd(libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC))
        };
        // SAFETY: sizing our own memfd.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), ConnTable::BYTES as libc::off_t) },
            0
        );
        assert!(ConnTable::map(&fd).is_err());
    }

    /// Runs a classic BPF program of the instructions `steering_program` uses, as the kernel
    /// does: an out-of-bounds load ends it with 0.
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        let load = |at: u32, n: usize| -> Option<u32> {
            let b = pkt.get(at as usize..at as usize + n)?;
            Some(b.iter().fold(0u32, |v, &x| v << 8 | u32::from(x)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                0x20 | 0x28 | 0x30 => {
                    let n = [4, 2, 1][usize::from((i.code - 0x20) / 8)];
                    match load(i.k, n) {
                        Some(v) => a = v,
                        None => return 0,
                    }
                }
                0x54 => a &= i.k,
                0x74 => a >>= i.k,
                0x15 => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                0x16 => return a,
                0x06 => return i.k,
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    /// A UD SEND to `qpn` carrying `mad` (BTH + DETH + MAD; no ICRC needed here).
    fn packet(qpn: u32, mad: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 20];
        p[0] = 0x64;
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p.extend_from_slice(mad);
        p
    }

    fn mad_packet(qpn: u32, msg: &CmMsg) -> Vec<u8> {
        let mut mad = [0u8; wire::MAD_LEN];
        msg.emit_mad(&MadHdr::cm(msg.attr_id(), 7), &mut mad)
            .unwrap();
        packet(qpn, &mad)
    }

    /// A REQ's MAD with only what steering reads: its sender's comm ID and service ID.
    fn req_packet(service_id: u64) -> Vec<u8> {
        let mut mad = [0u8; wire::MAD_LEN];
        MadHdr::cm(wire::attr::REQ, 7).emit(&mut mad);
        mad[24..28].copy_from_slice(&0x0400_0001u32.to_be_bytes());
        mad[32..40].copy_from_slice(&service_id.to_be_bytes());
        packet(1, &mad)
    }

    #[test]
    fn the_steering_program_picks_the_slot_the_keeper_would_forward_to() {
        let sid = wire::service_id(wire::port_space::TCP, 7471);
        let other = wire::service_id(wire::port_space::TCP, 7472);
        let listens = [(other, 9), (sid, 3)];
        let prog = steering_program(&listens);
        // Data packets: the slot of the destination QPN.
        let mut data = vec![0u8; 16];
        data[5..8].copy_from_slice(&[0x05, 0x00, 0x11]);
        assert_eq!(run(&prog, &data), 5);
        // REQs: the listener's slot; the keeper for a service nobody listens on.
        assert_eq!(run(&prog, &req_packet(sid)), 3);
        assert_eq!(run(&prog, &req_packet(other)), 9);
        let unknown = req_packet(wire::service_id(wire::port_space::TCP, 1));
        assert_eq!(cm_destination(&unknown, &listens), None);
        assert_eq!(run(&prog, &unknown), 0);
        // Every other CM message: where `cm_destination` sends it; 0 (the keeper) where it
        // sends nothing.
        let rtu = wire::Rtu {
            local_comm_id: 1,
            remote_comm_id: 0x0700_0002,
            private_data: [0; 224],
        };
        let cases = [
            CmMsg::Rtu(rtu),
            CmMsg::Rtu(wire::Rtu {
                remote_comm_id: 0x22,
                ..rtu
            }),
            CmMsg::SidrReq(wire::SidrReq {
                request_id: 0x0500_0000,
                pkey: 0xffff,
                service_id: other,
                private_data: [0; 216],
            }),
            CmMsg::SidrRep(wire::SidrRep {
                request_id: 0x0600_0001,
                status: 0,
                additional_info_length: 0,
                qpn: 0,
                service_id: sid,
                qkey: 0,
                class_port_info: [0; 72],
                private_data: [0; 136],
            }),
        ];
        for msg in &cases {
            let pkt = mad_packet(1, msg);
            let want = cm_destination(&pkt, &listens).unwrap_or(0) as u32;
            assert_eq!(run(&prog, &pkt), want, "{msg:?}");
        }
        assert_eq!(run(&prog, &mad_packet(1, &cases[0])), 7);
        assert_eq!(run(&prog, &mad_packet(1, &cases[1])), 0);
        assert_eq!(run(&prog, &mad_packet(1, &cases[2])), 9);
        assert_eq!(run(&prog, &mad_packet(1, &cases[3])), 6);
        // Another management class, or a datagram cut short: the keeper.
        let mut pkt = req_packet(sid);
        pkt[21] = 0x81;
        assert_eq!(run(&prog, &pkt), 0);
        assert_eq!(run(&prog, &req_packet(sid)[..50]), 0);
        assert_eq!(run(&prog, &[0u8; 3]), 0);
        // No listens: REQs go to the keeper; the program never grows past the kernel's
        // limit of 4096 instructions.
        assert_eq!(run(&steering_program(&[]), &req_packet(sid)), 0);
        let many: Vec<(u64, usize)> = (0..5000).map(|p| (u64::from(p as u32), 1)).collect();
        assert!(steering_program(&many).len() <= 4096);
    }
}
