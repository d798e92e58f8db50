//! rsockets (stream) on srdma: librdmacm's socket-like API over RC QPs, speaking its wire
//! protocol so that an rsocket here talks to librdmacm's on kernel rxe.
//!
//! The protocol (rdma-core librdmacm/rsocket.c, version 1): each side registers a receive
//! ring (`rbuf`, 128 KiB), a send staging ring (`sbuf`, 128 KiB) and a two-entry "target
//! SGL" array the peer may write, and posts 384 zero-length receives. The connection's
//! private data (after rdma_cm's header) is `rs_conn_data`: version 1, flags, the receive
//! credits (the receive queue's size), the target SGL's address and key, and the first half
//! of `rbuf` as the first buffer the peer may write into. Data goes by RDMA WRITE WITH
//! IMMEDIATE into the buffer the peer last gave (immediate: op 0 and the length); as the
//! application reads, the receiver gives the next half of its ring by writing a 16-byte
//! `rs_sge` into the sender's target SGL (immediate: op 4 and the new credit limit, the
//! sequence number up to which the sender may send). Control messages (op 7: disconnect,
//! shutdown) are zero-length writes with immediate. Four control messages may be in flight.
//!
//! What is here: `SOCK_STREAM` over IPv4 and IPv6, blocking and non-blocking
//! (`O_NONBLOCK`, `MSG_DONTWAIT`, `MSG_WAITALL`, `MSG_PEEK`), `rpoll`/`rselect` over
//! rsockets and ordinary descriptors, the socket options rstream and rcopy set. Connecting
//! completes before `rconnect` returns, also on a non-blocking socket (0, not EINPROGRESS);
//! a listener accepts in the background, `raccept` takes what it accepted (EAGAIN on a
//! non-blocking listener with none waiting). `riomap`/`riounmap`/`riowrite`: a mapping is a
//! region the peer may RDMA WRITE into at an offset; it goes out as a 32-byte `rs_iomap`
//! written into the peer's iomap table (which follows its target SGL; its size,
//! `RDMA_IOMAPSIZE`, is in the connection data), immediate op 6 and the entry, on the next
//! send or `riowrite`; `riowrite` is then plain RDMA WRITEs from the send ring. Not here:
//! datagram rsockets (`SOCK_DGRAM`: EOPNOTSUPP), keepalive messages (the option is kept).

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

mod abi;

use srdma::cm::ConnectOptions;
use srdma::ibcm::{self, IbConnection, IbListener, IbRequest};
use srdma::{AccessFlags, CompChannel, Cq, Mr, Pd, Qp, QpInit, QpType};
use srdma_proto::{QpCaps, RKey, RecvWr, SendOp, SendWr, SgeList, WcStatus};

const SQ_SIZE: u16 = 384;
const RQ_SIZE: u16 = 384;
const BUF_SIZE: u32 = 1 << 17;
/// Control messages in flight at most (`RS_QP_CTRL_SIZE`).
const CTRL_SIZE: u32 = 4;
/// Entries of the target SGL (`RS_SGL_SIZE`).
const SGL_SIZE: u32 = 2;
/// An `rs_sge` on the wire: address, key, length.
const SGE_LEN: usize = 16;
/// An `rs_iomap` on the wire: the mapping's offset, then its `rs_sge`.
const IOMAP_LEN: usize = 8 + SGE_LEN;
/// Sends wait for this much room in the send ring (`RS_SNDLOWAT`).
const SNDLOWAT: u32 = 2048;
const OLAP_START: u32 = 2048;
const MAX_TRANSFER: u32 = 65536;
/// `rs_conn_data`: version, flags, credits, 3 reserved, iomap size, two `rs_sge`.
const CONN_DATA_LEN: usize = 8 + 2 * SGE_LEN;
const CONN_FLAG_NET: u8 = 1;
const CONN_FLAG_IOMAP: u8 = 2;

const OP_DATA: u32 = 0;
const OP_WRITE: u32 = 2;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;
const CTRL_DISCONNECT: u32 = 0;
const CTRL_SHUTDOWN: u32 = 2;
const RECV_FLAG: u64 = 1 << 63;

/// `SOL_RDMA` and its options (rdma/rsocket.h).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

/// rsocket.c's one-byte encoding of a table size: values up to 128 as they are, larger
/// ones as 128 | value / 256 (`rs_value_to_scale`, 8 bits).
fn value_to_scale(v: u32) -> u8 {
    if v <= 128 {
        v as u8
    } else {
        (128 | (v >> 8)).min(255) as u8
    }
}

/// The inverse of [`value_to_scale`] (`rs_scale_to_value`).
fn scale_to_value(s: u8) -> u32 {
    if s <= 128 {
        u32::from(s)
    } else {
        u32::from(s & 127) << 8
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The sizes a socket's connection gets (set by `rsetsockopt` before it connects).
#[derive(Clone, Copy)]
struct Sizes {
    sq: u16,
    rq: u16,
    sbuf: u32,
    rbuf: u32,
    /// Entries of our iomap table, the mappings the peer may tell us of (`RDMA_IOMAPSIZE`).
    iomap: u16,
}

impl Default for Sizes {
    fn default() -> Self {
        Sizes {
            sq: SQ_SIZE,
            rq: RQ_SIZE,
            sbuf: BUF_SIZE,
            rbuf: BUF_SIZE,
            iomap: 0,
        }
    }
}

/// An rsocket. Its number is `fd`'s, an eventfd (so it never collides with an ordinary
/// descriptor): a listener's counts the connections waiting for `raccept`.
pub(crate) struct Rsock {
    fd: OwnedFd,
    st: Mutex<Sock>,
    /// A listener's accepted connections.
    accepted: Mutex<VecDeque<Arc<Rsock>>>,
    /// A listener's threads stop when set.
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct Sock {
    nonblock: bool,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    sizes: Sizes,
    nodelay: c_int,
    keepalive: c_int,
    keepidle: c_int,
    /// `SO_ERROR`.
    err: c_int,
    listening: bool,
    conn: Option<Box<Conn>>,
}

/// A connected rsocket's QP, rings and protocol state (the names are rsocket.c's).
struct Conn {
    ib: IbConnection,
    qp: Qp,
    cq: Cq,
    ch: Arc<CompChannel>,
    armed: bool,
    _pd: Pd,
    rbuf: Mr,
    sbuf: Mr,
    target: Mr,
    sizes: Sizes,
    readable: bool,
    writable: bool,
    connected: bool,
    error: bool,
    /// The peer is big-endian (or we are and it is not): `rs_sge`s in band are swapped.
    swap: bool,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    /// Where in the peer's target SGL our next buffer grant goes.
    remote_sge: u32,
    remote_sgl: (u64, u32, u32),
    /// Which entry of our target SGL we write data into next.
    target_sge: usize,
    rmsg: VecDeque<u32>,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    sbuf_pos: u32,
    sbuf_bytes_avail: u32,
    sqe_avail: u32,
    /// The peer's iomap table: address, key, entries (0: it has none).
    remote_iomap: (u64, u32, u32),
    /// Our mappings the peer may write (`riomap` with `PROT_WRITE`), by their entry in its
    /// table.
    iomaps: Vec<Option<IoMap>>,
    /// Entries of `iomaps` not yet written into the peer's table.
    iomap_queue: VecDeque<usize>,
    /// Mappings without remote access (`PROT_NONE`): registered, never announced.
    local_maps: Vec<IoMap>,
}

/// A region `riomap` registered, known to the peer by `offset`.
struct IoMap {
    offset: u64,
    mr: Mr,
}

static TABLE: OnceLock<Mutex<HashMap<c_int, Arc<Rsock>>>> = OnceLock::new();

fn table() -> MutexGuard<'static, HashMap<c_int, Arc<Rsock>>> {
    lock(TABLE.get_or_init(|| Mutex::new(HashMap::new())))
}

/// The rsocket numbered `fd`, if there is one.
pub(crate) fn lookup(fd: c_int) -> Option<Arc<Rsock>> {
    TABLE.get().and_then(|t| lock(t).get(&fd).cloned())
}

fn new_sock(sizes: Sizes, nonblock: bool) -> Result<Arc<Rsock>, c_int> {
    // SAFETY: plain syscall with constant flags.
    let fd = unsafe {
        libc::eventfd(
            0,
            libc::EFD_CLOEXEC | libc::EFD_NONBLOCK | libc::EFD_SEMAPHORE,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let rs = Arc::new(Rsock {
        fd,
        st: Mutex::new(Sock {
            sizes,
            nonblock,
            ..Sock::default()
        }),
        accepted: Mutex::new(VecDeque::new()),
        stop: Arc::new(AtomicBool::new(false)),
    });
    table().insert(rs.fd.as_raw_fd(), rs.clone());
    Ok(rs)
}

/// The errno of a failed connection setup, as a socket's `connect` reports it.
fn cm_errno(e: &srdma::cm::CmError) -> c_int {
    use srdma::cm::CmError;
    match e {
        CmError::Rejected { .. } => libc::ECONNREFUSED,
        CmError::Timeout => libc::ETIMEDOUT,
        CmError::Unreachable(_) => libc::ENETUNREACH,
        CmError::Verbs(v) => crate::errno_of(v),
        _ => libc::EIO,
    }
}

/// Waits up to `ms` for `fd` to be readable.
fn poll_in(fd: RawFd, ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn signal(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to our own eventfd.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// Takes one from a socket's (semaphore) eventfd.
fn unsignal(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live u64 from our own (non-blocking) eventfd.
    let _ = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
}

// ---------------------------------------------------------------------------------------
// Setting up a connection.

/// A QP, its CQ on a channel of its own, the three rings (the target SGL followed by the
/// iomap table in one region), receives posted.
struct Parts {
    pd: Pd,
    qp: Qp,
    cq: Cq,
    ch: Arc<CompChannel>,
    rbuf: Mr,
    sbuf: Mr,
    target: Mr,
}

fn make_parts(dev: &srdma::Device, sizes: Sizes) -> Result<Parts, c_int> {
    let io = |e: srdma::Error| crate::errno_of(&e);
    let pd = dev.alloc_pd();
    let ch = Arc::new(CompChannel::new().map_err(io)?);
    let cq = dev
        .create_cq(usize::from(sizes.sq) + usize::from(sizes.rq), Some(&ch))
        .map_err(io)?;
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.caps = QpCaps {
        max_send_wr: u32::from(sizes.sq),
        max_recv_wr: u32::from(sizes.rq),
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    init.sq_sig_all = true;
    init.access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = pd.create_qp(&init).map_err(io)?;
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let rbuf = pd.reg_mr(sizes.rbuf as usize, remote).map_err(io)?;
    let ctrl = (CTRL_SIZE as usize) * SGE_LEN;
    let sbuf = pd
        .reg_mr(sizes.sbuf as usize + ctrl, AccessFlags::LOCAL_WRITE)
        .map_err(io)?;
    let table = SGL_SIZE as usize * SGE_LEN + usize::from(sizes.iomap) * IOMAP_LEN;
    let target = pd.reg_mr(table, remote).map_err(io)?;
    for _ in 0..sizes.rq {
        qp.post_recv(RecvWr {
            wr_id: RECV_FLAG,
            sges: SgeList::new(),
        })
        .map_err(io)?;
    }
    Ok(Parts {
        pd,
        qp,
        cq,
        ch,
        rbuf,
        sbuf,
        target,
    })
}

/// Copies `dst.len()` bytes at `offset` out of `mr` (always in range here). Not
/// `Mr::read`, which first runs the device's receive path as a polling application would:
/// every completion this module waits for has already been taken from its CQ, and
/// `can_send` looks at the target SGL on every check.
fn copy_out(mr: &Mr, offset: usize, dst: &mut [u8]) {
    mr.with_bytes_mut(|b| dst.copy_from_slice(&b[offset..offset + dst.len()]));
}

fn rkey(mr: &Mr) -> u32 {
    mr.rkey().map_or(0, |k| k.0)
}

/// Our `rs_conn_data` (big-endian fields, as rsocket.c formats it).
fn conn_data(p: &Parts, sizes: Sizes) -> [u8; CONN_DATA_LEN] {
    let mut d = [0u8; CONN_DATA_LEN];
    d[0] = 1;
    d[1] = CONN_FLAG_IOMAP
        | if cfg!(target_endian = "big") {
            CONN_FLAG_NET
        } else {
            0
        };
    d[2..4].copy_from_slice(&sizes.rq.to_be_bytes());
    // reserved[3], then the size of our iomap table.
    d[7] = value_to_scale(u32::from(sizes.iomap));
    d[8..16].copy_from_slice(&p.target.addr().to_be_bytes());
    d[16..20].copy_from_slice(&rkey(&p.target).to_be_bytes());
    d[20..24].copy_from_slice(&SGL_SIZE.to_be_bytes());
    d[24..32].copy_from_slice(&p.rbuf.addr().to_be_bytes());
    d[32..36].copy_from_slice(&rkey(&p.rbuf).to_be_bytes());
    d[36..40].copy_from_slice(&(sizes.rbuf >> 1).to_be_bytes());
    d
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl Conn {
    /// A connection from its parts and the peer's `rs_conn_data` (None: not an rsocket).
    fn new(p: Parts, ib: IbConnection, sizes: Sizes, peer: &[u8]) -> Option<Conn> {
        if peer.len() < CONN_DATA_LEN || peer[0] != 1 {
            return None;
        }
        let peer_net = peer[1] & CONN_FLAG_NET != 0;
        let mut c = Conn {
            ib,
            qp: p.qp,
            cq: p.cq,
            ch: p.ch,
            armed: false,
            _pd: p.pd,
            rbuf: p.rbuf,
            sbuf: p.sbuf,
            target: p.target,
            sizes,
            readable: true,
            writable: true,
            connected: true,
            error: false,
            swap: peer_net != cfg!(target_endian = "big"),
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: u16::from_be_bytes([peer[2], peer[3]]),
            rseq_no: 0,
            rseq_comp: sizes.rq >> 1,
            remote_sge: 1,
            remote_sgl: (be64(peer, 8), be32(peer, 16), be32(peer, 20)),
            target_sge: 0,
            rmsg: VecDeque::new(),
            rbuf_offset: 0,
            rbuf_bytes_avail: sizes.rbuf >> 1,
            rbuf_free_offset: sizes.rbuf >> 1,
            sbuf_pos: 0,
            sbuf_bytes_avail: sizes.sbuf,
            sqe_avail: u32::from(sizes.sq) - CTRL_SIZE,
            remote_iomap: (0, 0, 0),
            iomaps: Vec::new(),
            iomap_queue: VecDeque::new(),
            local_maps: Vec::new(),
        };
        if c.remote_sgl.2 == 0 {
            return None;
        }
        // The peer's iomap table follows its target SGL, under the same key.
        if peer[1] & CONN_FLAG_IOMAP != 0 {
            let (addr, key, n) = c.remote_sgl;
            let entries = scale_to_value(peer[7]);
            c.remote_iomap = (
                addr.wrapping_add(u64::from(n).wrapping_mul(SGE_LEN as u64)),
                key,
                entries,
            );
            c.iomaps = (0..entries).map(|_| None).collect();
        }
        // The first buffer the peer gives is in its connection data.
        c.set_target(0, (be64(peer, 24), be32(peer, 32), be32(peer, 36)));
        Some(c)
    }

    /// Entry `i` of our target SGL: (address, key, length), as the peer wrote it.
    fn target_entry(&self, i: usize) -> (u64, u32, u32) {
        let mut b = [0u8; SGE_LEN];
        copy_out(&self.target, i * SGE_LEN, &mut b);
        let (a, k, l) = (
            u64::from_ne_bytes(b[0..8].try_into().expect("8")),
            u32::from_ne_bytes(b[8..12].try_into().expect("4")),
            u32::from_ne_bytes(b[12..16].try_into().expect("4")),
        );
        if self.swap {
            (a.swap_bytes(), k.swap_bytes(), l.swap_bytes())
        } else {
            (a, k, l)
        }
    }

    fn set_target(&self, i: usize, sge: (u64, u32, u32)) {
        let _ = self.target.write(i * SGE_LEN, &self.sge_bytes(sge));
    }

    /// An `rs_sge` as it lies in memory: host order, swapped for a peer of the other
    /// byte order.
    fn sge_bytes(&self, (a, k, l): (u64, u32, u32)) -> [u8; SGE_LEN] {
        let (a, k, l) = if self.swap {
            (a.swap_bytes(), k.swap_bytes(), l.swap_bytes())
        } else {
            (a, k, l)
        };
        let mut b = [0u8; SGE_LEN];
        b[0..8].copy_from_slice(&a.to_ne_bytes());
        b[8..12].copy_from_slice(&k.to_ne_bytes());
        b[12..16].copy_from_slice(&l.to_ne_bytes());
        b
    }

    /// Copies `bytes` into the send ring at its current position, wrapping at its end, and
    /// gives the (one or two) SGEs that hold them. The caller has checked the room.
    fn stage(&mut self, bytes: &[u8]) -> SgeList {
        let len = bytes.len() as u32;
        let pos = self.sbuf_pos;
        let first = len.min(self.sizes.sbuf - pos);
        let _ = self.sbuf.write(pos as usize, &bytes[..first as usize]);
        let mut sges = SgeList::one(self.sbuf.sge(pos as usize, first as usize));
        if first < len {
            let _ = self.sbuf.write(0, &bytes[first as usize..]);
            sges.push(self.sbuf.sge(0, (len - first) as usize));
            self.sbuf_pos = len - first;
        } else {
            self.sbuf_pos = if pos + len == self.sizes.sbuf {
                0
            } else {
                pos + len
            };
        }
        sges
    }

    /// The peer's mapping that holds `offset`, from our iomap table as it wrote it:
    /// (mapping's offset, address, key, length).
    fn find_iomap(&self, offset: u64) -> Option<(u64, u64, u32, u32)> {
        let base = SGL_SIZE as usize * SGE_LEN;
        let n = usize::from(self.sizes.iomap);
        let swap = self.swap;
        // One pass over the table under one hold of the device lock.
        self.target.with_bytes_mut(|t| {
            t[base..base + n * IOMAP_LEN]
                .chunks_exact(IOMAP_LEN)
                .find_map(|b| {
                    let mut o = u64::from_ne_bytes(b[0..8].try_into().expect("8"));
                    let mut a = u64::from_ne_bytes(b[8..16].try_into().expect("8"));
                    let mut k = u32::from_ne_bytes(b[16..20].try_into().expect("4"));
                    let mut l = u32::from_ne_bytes(b[20..24].try_into().expect("4"));
                    if swap {
                        (o, a, k, l) = (
                            o.swap_bytes(),
                            a.swap_bytes(),
                            k.swap_bytes(),
                            l.swap_bytes(),
                        );
                    }
                    (offset >= o && offset - o < u64::from(l)).then_some((o, a, k, l))
                })
        })
    }

    /// Writes the next queued mapping into its entry of the peer's table (rs_write_iomap):
    /// a 32-byte `rs_iomap` with immediate op 6 and the entry, which uses a credit.
    fn post_iomap(&mut self) -> Result<(), c_int> {
        let Some(i) = self.iomap_queue.pop_front() else {
            return Ok(());
        };
        let Some(m) = self.iomaps.get(i).and_then(Option::as_ref) else {
            return Ok(());
        };
        let mut b = [0u8; IOMAP_LEN];
        let o = if self.swap {
            m.offset.swap_bytes()
        } else {
            m.offset
        };
        b[0..8].copy_from_slice(&o.to_ne_bytes());
        b[8..].copy_from_slice(&self.sge_bytes((m.mr.addr(), rkey(&m.mr), m.mr.len() as u32)));
        let sges = self.stage(&b);
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= IOMAP_LEN as u32;
        let m = msg(OP_IOMAP_SGL, i as u32);
        let op = SendOp::WriteWithImm {
            remote_addr: self.remote_iomap.0.wrapping_add((i * IOMAP_LEN) as u64),
            rkey: RKey(self.remote_iomap.1),
            imm: m,
        };
        self.post(u64::from(m), op, sges)
    }

    fn post(&mut self, wr_id: u64, op: SendOp, sges: SgeList) -> Result<(), c_int> {
        self.qp
            .post_send(SendWr::new(wr_id, op, sges))
            .map_err(|e| crate::errno_of(&e))
    }

    /// A zero-length write with immediate `m` (a control message or a bare credit grant).
    fn post_msg(&mut self, m: u32) -> Result<(), c_int> {
        let op = SendOp::WriteWithImm {
            remote_addr: 0,
            rkey: RKey(0),
            imm: m,
        };
        self.post(u64::from(m), op, SgeList::new())
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target_entry(self.target_sge).2 != 0
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.sizes.rbuf >> 1
            || (self.rseq_no as i16).wrapping_sub(self.rseq_comp as i16) >= 0)
            && self.ctrl_avail()
            && self.connected
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    /// Grants credits and, when half the ring is free, that half (rs_send_credits).
    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        let half = self.sizes.rbuf >> 1;
        self.rseq_comp = self.rseq_no.wrapping_add(self.sizes.rq >> 1);
        let m = msg(OP_SGL, u32::from(self.rseq_no.wrapping_add(self.sizes.rq)));
        if self.rbuf_bytes_avail >= half {
            let b = self.sge_bytes((
                self.rbuf.addr() + u64::from(self.rbuf_free_offset),
                rkey(&self.rbuf),
                half,
            ));
            let slot = self.sizes.sbuf as usize + (self.ctrl_seqno % CTRL_SIZE) as usize * SGE_LEN;
            let _ = self.sbuf.write(slot, &b);
            let op = SendOp::WriteWithImm {
                remote_addr: self
                    .remote_sgl
                    .0
                    .wrapping_add(u64::from(self.remote_sge) * SGE_LEN as u64),
                rkey: RKey(self.remote_sgl.1),
                imm: m,
            };
            let sge = self.sbuf.sge(slot, SGE_LEN);
            if self.post(u64::from(m), op, SgeList::one(sge)).is_err() {
                self.fail();
            }
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.sizes.rbuf {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge == self.remote_sgl.2 {
                self.remote_sge = 0;
            }
        } else if self.post_msg(m).is_err() {
            self.fail();
        }
    }

    fn fail(&mut self) {
        if self.connected {
            self.connected = false;
            self.readable = false;
            self.writable = false;
            self.error = true;
        }
    }

    fn disconnected(&mut self) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
    }

    /// Takes every completion (rs_poll_cq): data and control messages, credits, the send
    /// ring's room; reposts the receives used.
    fn poll_cq(&mut self) {
        let mut used = 0;
        while let Some(wc) = self.cq.poll_one() {
            if wc.wr_id & RECV_FLAG != 0 {
                if wc.status != WcStatus::Success {
                    // Flushed: the connection is gone (the peer's DREQ, or its process
                    // died). rsocket.c ignores these and a reader would wait forever;
                    // here the reader sees the end of the stream.
                    if self.connected {
                        self.disconnected();
                    }
                    continue;
                }
                used += 1;
                let Some(m) = wc.imm_data else { continue };
                match m >> 29 {
                    OP_SGL => self.sseq_comp = (m & 0x1FFF_FFFF) as u16,
                    OP_IOMAP_SGL | OP_WRITE => {}
                    OP_CTRL => match m & 0x1FFF_FFFF {
                        CTRL_DISCONNECT => self.disconnected(),
                        CTRL_SHUTDOWN => {
                            if self.writable {
                                self.readable = false;
                            } else {
                                self.disconnected();
                            }
                        }
                        _ => {}
                    },
                    _ => self.rmsg.push_back(m),
                }
            } else {
                let m = wc.wr_id as u32;
                match m >> 29 {
                    OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                    OP_CTRL => {
                        self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                        if m & 0x1FFF_FFFF == CTRL_DISCONNECT {
                            self.disconnected();
                        }
                    }
                    OP_IOMAP_SGL => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += IOMAP_LEN as u32;
                    }
                    _ => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail += m & 0x1FFF_FFFF;
                    }
                }
                if wc.status != WcStatus::Success && self.connected {
                    self.fail();
                }
            }
        }
        if self.connected {
            for _ in 0..used {
                let r = self.qp.post_recv(RecvWr {
                    wr_id: RECV_FLAG,
                    sges: SgeList::new(),
                });
                if r.is_err() {
                    self.fail();
                    break;
                }
            }
        }
    }

    fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    fn all_sends_done(&self) -> bool {
        self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) + self.sqe_avail
            == u32::from(self.sizes.sq)
            || !self.connected
    }
}

/// Runs the CQ until `test` holds (rs_process_cq): without waiting when `nonblock`
/// (EWOULDBLOCK), else sleeping on the connection's channel between looks.
fn process(rs: &Rsock, nonblock: bool, test: fn(&Conn) -> bool) -> Result<(), c_int> {
    loop {
        let mut st = lock(&rs.st);
        let Some(c) = st.conn.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        c.update_credits();
        c.poll_cq();
        c.update_credits();
        if test(c) {
            return Ok(());
        }
        if nonblock {
            return Err(libc::EWOULDBLOCK);
        }
        if !c.armed {
            c.cq.req_notify(false);
            c.armed = true;
            continue;
        }
        let ch = c.ch.clone();
        drop(st);
        // A bounded wait: another thread of the application may take the event.
        let r = ch.get_event(Some(Duration::from_millis(100)));
        if let Some(c) = lock(&rs.st).conn.as_mut() {
            if matches!(r, Ok(Some(_))) {
                c.armed = false;
            }
        }
        if let Err(e) = r {
            return Err(crate::errno_of(&e));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Listening and connecting.

fn listen_loop(
    listener: Arc<Rsock>,
    l: IbListener,
    dev: srdma::Device,
    port: u16,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Acquire) {
        let req = match l.accept_request(Duration::from_millis(200)) {
            Ok(r) => r,
            Err(_) => continue,
        };
        let (sizes, nonblock) = {
            let st = lock(&listener.st);
            (st.sizes, st.nonblock)
        };
        if let Ok(rs) = accept_one(req, &dev, port, sizes, nonblock) {
            if stop.load(Ordering::Acquire) {
                let _ = close(&rs);
                break;
            }
            lock(&listener.accepted).push_back(rs);
            signal(&listener.fd);
        }
    }
}

fn accept_one(
    req: IbRequest,
    dev: &srdma::Device,
    port: u16,
    sizes: Sizes,
    nonblock: bool,
) -> Result<Arc<Rsock>, c_int> {
    let peer_data = req.private_data().to_vec();
    if peer_data.len() < CONN_DATA_LEN || peer_data[0] != 1 {
        let _ = req.reject(srdma::cm::reason::CONSUMER_DEFINED, &[]);
        return Err(libc::EPROTO);
    }
    // The rdma_cm header: the peer's address and port, ours.
    let addrs = req.cma_hdr().map(|h| {
        let ip = |b: [u8; 16]| crate::rdmacm::ip_of(h.ip_version, b);
        (
            SocketAddr::new(ip(h.src_addr), h.src_port),
            SocketAddr::new(ip(h.dst_addr), port),
        )
    });
    let parts = make_parts(dev, sizes)?;
    let opts = ConnectOptions {
        private_data: conn_data(&parts, sizes).to_vec(),
        ack_timeout: 19,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    };
    let ib = req
        .accept_with(&parts.qp, &opts)
        .map_err(|e| cm_errno(&e))?;
    let conn = Conn::new(parts, ib, sizes, &peer_data).ok_or(libc::EPROTO)?;
    let rs = new_sock(sizes, nonblock)?;
    {
        let mut st = lock(&rs.st);
        if let Some((peer, local)) = addrs {
            st.peer = Some(peer);
            st.local = Some(local);
        }
        st.conn = Some(Box::new(conn));
    }
    Ok(rs)
}

fn connect(rs: &Rsock, dst: SocketAddr) -> Result<(), c_int> {
    let (local, sizes) = {
        let st = lock(&rs.st);
        if st.conn.is_some() {
            return Err(libc::EISCONN);
        }
        if st.listening {
            return Err(libc::EINVAL);
        }
        (st.local, st.sizes)
    };
    let d = match local.map(|a| a.ip()).filter(|ip| !ip.is_unspecified()) {
        Some(ip) => crate::rdmacm::dev_for(ip),
        None => crate::rdmacm::source_device(dst.ip()),
    }
    .ok_or(libc::ENODEV)?;
    let cm_dev = &crate::rdmacm::cm_devs()[d];
    let dev = cm_dev.context().device()?;
    let gsi = cm_dev.context().gsi()?;
    let src_port = local
        .map(|a| a.port())
        .filter(|&p| p != 0)
        .unwrap_or_else(crate::rdmacm::any_port);
    let parts = make_parts(&dev, sizes)?;
    let opts = ConnectOptions {
        private_data: conn_data(&parts, sizes).to_vec(),
        ack_timeout: 19,
        retry_cnt: 7,
        rnr_retry: 7,
        unlisted_retry: Duration::from_secs(1),
        ..ConnectOptions::default()
    };
    let ib =
        ibcm::connect_qp(&gsi, &parts.qp, dst, src_port, false, &opts).map_err(|e| cm_errno(&e))?;
    let peer = ib.remote_private_data().to_vec();
    let conn = Conn::new(parts, ib, sizes, &peer).ok_or(libc::EPROTO)?;
    let mut st = lock(&rs.st);
    st.local = Some(SocketAddr::new(cm_dev.addr, src_port));
    st.peer = Some(dst);
    st.conn = Some(Box::new(conn));
    Ok(())
}

fn listen(rs: &Arc<Rsock>) -> Result<(), c_int> {
    let local = {
        let st = lock(&rs.st);
        if st.listening {
            return Ok(());
        }
        if st.conn.is_some() {
            return Err(libc::EINVAL);
        }
        st.local
    };
    let local = local.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
    let port = if local.port() == 0 {
        crate::rdmacm::any_port()
    } else {
        local.port()
    };
    let devs: Vec<usize> = if local.ip().is_unspecified() {
        (0..crate::rdmacm::cm_devs().len())
            .filter(|&d| local.is_ipv6() || crate::rdmacm::cm_devs()[d].addr.is_ipv4())
            .collect()
    } else {
        vec![crate::rdmacm::dev_for(local.ip()).ok_or(libc::EADDRNOTAVAIL)?]
    };
    let mut n = 0;
    let mut last = libc::ENODEV;
    for d in devs {
        let ctx = crate::rdmacm::cm_devs()[d].context();
        let r = ctx.gsi().and_then(|g| {
            let dev = ctx.device()?;
            let l = IbListener::bind(&g, port).map_err(|_| libc::EADDRINUSE)?;
            Ok((l, dev))
        });
        match r {
            Ok((l, dev)) => {
                let (me, stop) = (rs.clone(), rs.stop.clone());
                let spawned = srdma::threads::spawn("srdma-rs-listen", move || {
                    listen_loop(me, l, dev, port, stop)
                });
                if spawned.is_ok() {
                    n += 1;
                }
            }
            Err(e) => last = e,
        }
    }
    if n == 0 {
        return Err(last);
    }
    let mut st = lock(&rs.st);
    st.listening = true;
    st.local = Some(SocketAddr::new(local.ip(), port));
    Ok(())
}

fn accept(rs: &Rsock) -> Result<Arc<Rsock>, c_int> {
    loop {
        let (listening, nonblock) = {
            let st = lock(&rs.st);
            (st.listening, st.nonblock)
        };
        if !listening {
            return Err(libc::EINVAL);
        }
        if let Some(n) = lock(&rs.accepted).pop_front() {
            unsignal(&rs.fd);
            return Ok(n);
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        let _ = poll_in(rs.fd.as_raw_fd(), 200);
    }
}

// ---------------------------------------------------------------------------------------
// Data.

/// Waits until the connection may send (rs_can_send) and gives it locked; `None` when the
/// caller should stop and report the `done` bytes it has already sent.
fn sendable(
    rs: &Rsock,
    nonblock: bool,
    done: usize,
) -> Result<Option<MutexGuard<'_, Sock>>, c_int> {
    loop {
        let ready = lock(&rs.st).conn.as_ref().ok_or(libc::ENOTCONN)?.can_send();
        if !ready {
            if let Err(e) = process(rs, nonblock, |c| c.can_send() || !c.writable) {
                return if done > 0 { Ok(None) } else { Err(e) };
            }
        }
        let st = lock(&rs.st);
        let c = st.conn.as_ref().ok_or(libc::ENOTCONN)?;
        if !c.writable {
            return if done > 0 {
                Ok(None)
            } else {
                Err(if c.error { libc::EIO } else { libc::ECONNRESET })
            };
        }
        if c.can_send() {
            return Ok(Some(st));
        }
    }
}

/// The size of the next transfer of `left` bytes: transfers start at 2 KiB and double up to
/// 64 KiB, so that the first bytes leave early and later ones in large writes.
fn next_xfer(olen: &mut u32, left: usize) -> u32 {
    if (*olen as usize) < left {
        let x = *olen;
        if *olen < MAX_TRANSFER {
            *olen <<= 1;
        }
        x
    } else {
        left as u32
    }
}

fn nonblocking(rs: &Rsock, flags: c_int) -> bool {
    lock(&rs.st).nonblock || flags & libc::MSG_DONTWAIT != 0
}

/// Writes the mappings `riomap` queued into the peer's table (rs_send_iomaps), before any
/// data that follows them.
fn send_iomaps(rs: &Rsock, nonblock: bool) -> Result<(), c_int> {
    loop {
        if lock(&rs.st)
            .conn
            .as_ref()
            .is_none_or(|c| c.iomap_queue.is_empty())
        {
            return Ok(());
        }
        let Some(mut st) = sendable(rs, nonblock, 0)? else {
            return Ok(());
        };
        let c = st.conn.as_mut().ok_or(libc::ENOTCONN)?;
        if let Err(e) = c.post_iomap() {
            c.fail();
            return Err(e);
        }
    }
}

/// The loop `rsend` and `riowrite` share: sends the queued mappings first, then, while
/// bytes are left and the connection may send, lets `step` stage and post one transfer of
/// the bytes left, at most the given size; `step` gives how many it sent (`None`: stop here,
/// as for a `riowrite` past the peer's mappings).
fn send_loop(
    rs: &Rsock,
    data: &[u8],
    flags: c_int,
    mut step: impl FnMut(&mut Conn, &[u8], u32) -> Option<Result<u32, c_int>>,
) -> Result<usize, c_int> {
    let nonblock = nonblocking(rs, flags);
    send_iomaps(rs, nonblock)?;
    let mut done = 0usize;
    let mut olen = OLAP_START;
    while done < data.len() {
        let Some(mut st) = sendable(rs, nonblock, done)? else {
            break;
        };
        let c = st.conn.as_mut().ok_or(libc::ENOTCONN)?;
        let most = next_xfer(&mut olen, data.len() - done).min(c.sbuf_bytes_avail);
        match step(c, &data[done..], most) {
            None => break,
            Some(Ok(n)) => done += n as usize,
            Some(Err(e)) => {
                c.fail();
                if done > 0 {
                    break;
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

fn send(rs: &Rsock, data: &[u8], flags: c_int) -> Result<usize, c_int> {
    send_loop(rs, data, flags, |c, left, most| {
        let (taddr, tkey, tlen) = c.target_entry(c.target_sge);
        let xfer = most.min(tlen);
        let sges = c.stage(&left[..xfer as usize]);
        // rs_write_data: the target entry moves on before the write leaves.
        c.sseq_no = c.sseq_no.wrapping_add(1);
        c.sqe_avail -= 1;
        c.sbuf_bytes_avail -= xfer;
        let i = c.target_sge;
        c.set_target(i, (taddr.wrapping_add(u64::from(xfer)), tkey, tlen - xfer));
        if tlen == xfer {
            c.target_sge = (c.target_sge + 1) % SGL_SIZE as usize;
        }
        let m = msg(OP_DATA, xfer);
        let op = SendOp::WriteWithImm {
            remote_addr: taddr,
            rkey: RKey(tkey),
            imm: m,
        };
        Some(c.post(u64::from(m), op, sges).map(|()| xfer))
    })
}

/// `riowrite`: writes `data` at `offset` of what the peer mapped with `riomap`, by plain
/// RDMA WRITEs (the peer's application sees the bytes land; nothing is queued for its
/// `rrecv`). Stops at the first byte no mapping of the peer's covers, as rsocket.c does:
/// what was written before it is the result (0 if nothing).
fn iowrite(rs: &Rsock, data: &[u8], mut offset: u64, flags: c_int) -> Result<usize, c_int> {
    send_loop(rs, data, flags, |c, left, most| {
        let (moff, addr, key, mlen) = c.find_iomap(offset)?;
        // find_iomap checked moff <= offset < moff + mlen; no sum of the peer's values here.
        let room = mlen - (offset - moff) as u32;
        let xfer = most.min(room);
        let sges = c.stage(&left[..xfer as usize]);
        c.sqe_avail -= 1;
        c.sbuf_bytes_avail -= xfer;
        let op = SendOp::Write {
            remote_addr: addr.wrapping_add(offset - moff),
            rkey: RKey(key),
        };
        let r = c.post(u64::from(msg(OP_WRITE, xfer)), op, sges);
        offset += u64::from(xfer);
        Some(r.map(|()| xfer))
    })
}

fn recv(rs: &Rsock, out: &mut [u8], flags: c_int) -> Result<usize, c_int> {
    let nonblock = nonblocking(rs, flags);
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0;
    let mut done = 0usize;
    loop {
        let have = {
            let st = lock(&rs.st);
            st.conn.as_ref().ok_or(libc::ENOTCONN)?.have_rdata()
        };
        if !have {
            if let Err(e) = process(rs, nonblock, |c| c.have_rdata() || !c.readable) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
        }
        let mut st = lock(&rs.st);
        let c = st.conn.as_mut().ok_or(libc::ENOTCONN)?;
        let mut offset = c.rbuf_offset;
        let mut i = 0;
        while done < out.len() && i < c.rmsg.len() {
            let len = c.rmsg[i] & 0x1FFF_FFFF;
            let take = len.min((out.len() - done) as u32);
            let mut left = take;
            while left > 0 {
                let end = c.sizes.rbuf - offset;
                let n = left.min(end);
                copy_out(&c.rbuf, offset as usize, &mut out[done..done + n as usize]);
                done += n as usize;
                left -= n;
                offset = if n == end { 0 } else { offset + n };
            }
            if peek {
                i += 1;
                continue;
            }
            // Saturating: a hostile peer may claim more than the ring holds.
            c.rbuf_bytes_avail = c.rbuf_bytes_avail.saturating_add(take);
            if take == len {
                c.rmsg.pop_front();
                c.rseq_no = c.rseq_no.wrapping_add(1);
            } else {
                c.rmsg[0] = msg(OP_DATA, len - take);
            }
            c.rbuf_offset = offset;
        }
        c.update_credits();
        let readable = c.readable;
        drop(st);
        if peek || !waitall || done == out.len() || !readable {
            return Ok(done);
        }
    }
}

fn shutdown(rs: &Rsock, how: c_int) -> Result<(), c_int> {
    let ctrl = {
        let mut st = lock(&rs.st);
        let Some(c) = st.conn.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        if !c.connected {
            None
        } else {
            match how {
                libc::SHUT_RDWR => {
                    c.readable = false;
                    c.writable = false;
                    Some(CTRL_DISCONNECT)
                }
                libc::SHUT_WR => {
                    c.writable = false;
                    Some(if c.readable {
                        CTRL_SHUTDOWN
                    } else {
                        CTRL_DISCONNECT
                    })
                }
                libc::SHUT_RD => {
                    c.readable = false;
                    (!c.writable).then_some(CTRL_DISCONNECT)
                }
                _ => return Err(libc::EINVAL),
            }
        }
    };
    if let Some(ctrl) = ctrl {
        let _ = process(rs, false, |c| c.ctrl_avail() || !c.connected);
        let mut st = lock(&rs.st);
        if let Some(c) = st.conn.as_mut() {
            if c.connected && c.ctrl_avail() {
                c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
                if c.post_msg(msg(OP_CTRL, ctrl)).is_err() {
                    c.fail();
                }
            }
        }
    }
    let _ = process(rs, false, Conn::all_sends_done);
    Ok(())
}

fn close(rs: &Arc<Rsock>) -> Result<(), c_int> {
    table().remove(&rs.fd.as_raw_fd());
    rs.stop.store(true, Ordering::Release);
    // A thread blocked in `raccept` on this socket returns (EINVAL) instead of waiting on.
    lock(&rs.st).listening = false;
    let connected = lock(&rs.st).conn.as_ref().is_some_and(|c| c.connected);
    if connected {
        let _ = shutdown(rs, libc::SHUT_RDWR);
    }
    let conn = lock(&rs.st).conn.take();
    if let Some(c) = conn {
        if !c.ib.is_disconnected() {
            let _ = c.ib.disconnect();
        }
    }
    // Connections accepted but never taken.
    let waiting: Vec<_> = lock(&rs.accepted).drain(..).collect();
    for w in waiting {
        let _ = close(&w);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Readiness (rpoll).

/// The events of `events` ready on `rs` now (after taking its completions), and the
/// descriptor to sleep on until that may change.
pub(crate) fn poll_rs(rs: &Rsock, events: i16) -> (i16, RawFd) {
    let mut st = lock(&rs.st);
    if st.listening {
        let ready = !lock(&rs.accepted).is_empty();
        let r = if ready { events & libc::POLLIN } else { 0 };
        return (r, rs.fd.as_raw_fd());
    }
    let Some(c) = st.conn.as_mut() else {
        // Neither listening nor connected: writable (a connect would not block) only.
        return (events & libc::POLLOUT, -1);
    };
    c.update_credits();
    c.poll_cq();
    c.update_credits();
    let mut r = 0;
    if events & libc::POLLIN != 0 && (c.have_rdata() || !c.readable) {
        r |= libc::POLLIN;
    }
    if events & libc::POLLOUT != 0 && c.can_send() {
        r |= libc::POLLOUT;
    }
    // A hang-up shows once the data that came before it has been read (as a TCP socket
    // reports its peer's close): rsocket.c reports it at once, and rstream -T a, which
    // stops at POLLHUP, then failed one run in three when the peer's disconnect message
    // arrived right behind its last data.
    if !c.connected && !c.have_rdata() {
        r |= if c.error {
            libc::POLLERR
        } else {
            libc::POLLHUP
        };
    }
    if r == 0 && !c.armed {
        c.cq.req_notify(false);
        c.armed = true;
        // A completion may have come between the poll and the arming.
        return (0, -2);
    }
    (r, c.ch.as_fd().as_raw_fd())
}

/// After a sleep on `rs`'s channel: takes its event so the next arming counts.
pub(crate) fn woke(rs: &Rsock) {
    let mut st = lock(&rs.st);
    if let Some(c) = st.conn.as_mut() {
        if c.armed {
            if let Ok(Some(_)) = c.ch.get_event(Some(Duration::ZERO)) {
                c.armed = false;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The C API (called from the exported functions in `abi.rs`).

/// `rsocket`.
pub(crate) fn c_socket(domain: c_int, ty: c_int, protocol: c_int) -> Result<c_int, c_int> {
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EOPNOTSUPP);
    }
    if base != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
        return Err(libc::EOPNOTSUPP);
    }
    let rs = new_sock(Sizes::default(), ty & libc::SOCK_NONBLOCK != 0)?;
    Ok(rs.fd.as_raw_fd())
}

fn get(fd: c_int) -> Result<Arc<Rsock>, c_int> {
    lookup(fd).ok_or(libc::EBADF)
}

/// `rbind`.
pub(crate) fn c_bind(fd: c_int, addr: Option<SocketAddr>) -> Result<(), c_int> {
    let rs = get(fd)?;
    let a = addr.ok_or(libc::EINVAL)?;
    if !a.ip().is_unspecified() && crate::rdmacm::dev_for(a.ip()).is_none() {
        return Err(libc::EADDRNOTAVAIL);
    }
    let mut st = lock(&rs.st);
    if st.listening || st.conn.is_some() || st.local.is_some() {
        return Err(libc::EINVAL);
    }
    st.local = Some(a);
    Ok(())
}

/// `rlisten`.
pub(crate) fn c_listen(fd: c_int) -> Result<(), c_int> {
    listen(&get(fd)?)
}

/// `raccept`: the new socket and its peer's address.
pub(crate) fn c_accept(fd: c_int) -> Result<(c_int, Option<SocketAddr>), c_int> {
    let n = accept(&*get(fd)?)?;
    let peer = lock(&n.st).peer;
    Ok((n.fd.as_raw_fd(), peer))
}

/// `rconnect`.
pub(crate) fn c_connect(fd: c_int, addr: Option<SocketAddr>) -> Result<(), c_int> {
    let rs = get(fd)?;
    let dst = addr.ok_or(libc::EINVAL)?;
    let dst = match dst {
        SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some() => {
            SocketAddr::new(v6.ip().to_ipv4_mapped().expect("checked").into(), v6.port())
        }
        d => d,
    };
    let r = connect(&rs, dst);
    if let Err(e) = r {
        lock(&rs.st).err = e;
    }
    r
}

/// `rsend` and friends.
pub(crate) fn c_send(fd: c_int, data: &[u8], flags: c_int) -> Result<usize, c_int> {
    send(&*get(fd)?, data, flags)
}

/// `riowrite`.
pub(crate) fn c_iowrite(fd: c_int, data: &[u8], offset: i64, flags: c_int) -> Result<usize, c_int> {
    let rs = get(fd)?;
    let offset = u64::try_from(offset).map_err(|_| libc::EINVAL)?;
    iowrite(&rs, data, offset, flags)
}

/// `riomap`: registers `len` bytes at `buf` on the connection. With `PROT_WRITE` the peer
/// may `riowrite` into them at `offset` (`-1`: the buffer's address) once the mapping has
/// gone out, which happens on this socket's next send or `riowrite` (as rsocket.c does);
/// with `PROT_NONE` the region is only registered. Not connected, or other protection
/// bits: EINVAL; the peer's table full (or it has none): ENOMEM.
///
/// # Safety
/// `buf..buf + len` stays mapped until `riounmap` of it or `rclose` of the socket.
pub(crate) unsafe fn c_iomap(
    fd: c_int,
    buf: *mut u8,
    len: usize,
    prot: c_int,
    offset: i64,
) -> Result<i64, c_int> {
    let rs = get(fd)?;
    let mut st = lock(&rs.st);
    let c = st.conn.as_mut().ok_or(libc::EINVAL)?;
    if prot & !libc::PROT_WRITE != 0 {
        return Err(libc::EINVAL);
    }
    let remote = prot & libc::PROT_WRITE != 0;
    let slot = if remote {
        Some(
            c.iomaps
                .iter()
                .position(Option::is_none)
                .ok_or(libc::ENOMEM)?,
        )
    } else {
        None
    };
    let access = if remote {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
    } else {
        AccessFlags::LOCAL_WRITE
    };
    // SAFETY: the caller keeps the range mapped until riounmap or rclose, which drop the
    // region (this function's contract, riomap's).
    let mr = unsafe { c._pd.reg_user_mr(buf, len, buf as u64, access) }
        .map_err(|e| crate::errno_of(&e))?;
    let offset = if offset == -1 { buf as i64 } else { offset };
    let map = IoMap {
        offset: offset as u64,
        mr,
    };
    match slot {
        Some(i) => {
            c.iomaps[i] = Some(map);
            c.iomap_queue.push_back(i);
        }
        None => c.local_maps.push(map),
    }
    Ok(offset)
}

/// `riounmap`: drops the mapping of exactly `len` bytes at `buf` (EINVAL if there is none).
/// The peer is not told; its later writes there fail the connection, as with rsocket.c.
pub(crate) fn c_iounmap(fd: c_int, buf: *mut u8, len: usize) -> Result<(), c_int> {
    let rs = get(fd)?;
    let mut st = lock(&rs.st);
    let c = st.conn.as_mut().ok_or(libc::EINVAL)?;
    let is = |m: &IoMap| m.mr.addr() == buf as u64 && m.mr.len() == len;
    if let Some(i) = c.iomaps.iter().position(|m| m.as_ref().is_some_and(is)) {
        c.iomaps[i] = None;
        c.iomap_queue.retain(|&q| q != i);
        return Ok(());
    }
    let n = c.local_maps.len();
    c.local_maps.retain(|m| !is(m));
    if c.local_maps.len() == n {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// `rrecv` and friends.
pub(crate) fn c_recv(fd: c_int, out: &mut [u8], flags: c_int) -> Result<usize, c_int> {
    recv(&*get(fd)?, out, flags)
}

/// `rshutdown`.
pub(crate) fn c_shutdown(fd: c_int, how: c_int) -> Result<(), c_int> {
    shutdown(&*get(fd)?, how)
}

/// `rclose`.
pub(crate) fn c_close(fd: c_int) -> Result<(), c_int> {
    close(&get(fd)?)
}

/// `rgetpeername` (peer) and `rgetsockname`.
pub(crate) fn c_name(fd: c_int, peer: bool) -> Result<SocketAddr, c_int> {
    let rs = get(fd)?;
    let st = lock(&rs.st);
    let a = if peer { st.peer } else { st.local };
    a.ok_or(if peer { libc::ENOTCONN } else { libc::EINVAL })
}

/// `rsetsockopt` with an int value (`None`: the option is not one rsockets knows).
pub(crate) fn c_setsockopt(fd: c_int, level: c_int, name: c_int, v: c_int) -> Result<(), c_int> {
    let rs = get(fd)?;
    let mut st = lock(&rs.st);
    // A listener's sizes are its connections' (rsocket.c takes them until the rings exist).
    let before_connect = st.conn.is_none();
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) | (libc::SOL_SOCKET, libc::SO_LINGER) => {}
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => st.keepalive = v,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if before_connect => {
            st.sizes.sbuf = (v.max(1) as u32).saturating_mul(2).max(SNDLOWAT * 2);
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if before_connect => {
            st.sizes.rbuf = (v.max(1) as u32).saturating_mul(2).max(SNDLOWAT * 2);
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF | libc::SO_RCVBUF) => {}
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.nodelay = v,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => st.keepidle = v,
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {}
        (SOL_RDMA, RDMA_SQSIZE) if before_connect => {
            st.sizes.sq = v.clamp(16, 0xFFFE) as u16;
        }
        (SOL_RDMA, RDMA_RQSIZE) if before_connect => {
            st.sizes.rq = v.clamp(16, 0xFFFE) as u16;
        }
        (SOL_RDMA, RDMA_IOMAPSIZE) if before_connect => {
            // As rsocket.c: through its one-byte encoding (so 300 becomes 256).
            st.sizes.iomap = scale_to_value(value_to_scale(v.max(0) as u32)) as u16;
        }
        (SOL_RDMA, RDMA_INLINE | RDMA_ROUTE) if before_connect => {}
        (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE | RDMA_ROUTE) => {
            return Err(libc::EINVAL);
        }
        _ => return Err(libc::EOPNOTSUPP),
    }
    Ok(())
}

/// `rgetsockopt` of an int option.
pub(crate) fn c_getsockopt(fd: c_int, level: c_int, name: c_int) -> Result<c_int, c_int> {
    let rs = get(fd)?;
    let mut st = lock(&rs.st);
    Ok(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut st.err),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => st.keepalive,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => st.sizes.sbuf as c_int,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => st.sizes.rbuf as c_int,
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => 1,
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => st.nodelay,
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => st.keepidle,
        (SOL_RDMA, RDMA_SQSIZE) => c_int::from(st.sizes.sq),
        (SOL_RDMA, RDMA_RQSIZE) => c_int::from(st.sizes.rq),
        (SOL_RDMA, RDMA_INLINE) => 0,
        (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(st.sizes.iomap),
        _ => return Err(libc::EOPNOTSUPP),
    })
}

/// `rfcntl` F_GETFL / F_SETFL (only `O_NONBLOCK` means anything).
pub(crate) fn c_fcntl(fd: c_int, cmd: c_int, arg: c_int) -> Result<c_int, c_int> {
    let rs = get(fd)?;
    let mut st = lock(&rs.st);
    match cmd {
        libc::F_GETFL => Ok(libc::O_RDWR | if st.nonblock { libc::O_NONBLOCK } else { 0 }),
        libc::F_SETFL => {
            st.nonblock = arg & libc::O_NONBLOCK != 0;
            Ok(0)
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// `rpoll`: rsockets and ordinary descriptors together. An rsocket's readiness comes from
/// its completions (taken here); between looks this sleeps on its completion channel (a
/// listener: on its accept queue's descriptor) beside the ordinary descriptors.
pub(crate) fn c_poll(fds: &mut [libc::pollfd], timeout: c_int) -> Result<c_int, c_int> {
    let deadline =
        (timeout >= 0).then(|| std::time::Instant::now() + Duration::from_millis(timeout as u64));
    let socks: Vec<Option<Arc<Rsock>>> = fds.iter().map(|p| lookup(p.fd)).collect();
    loop {
        let mut sleep: Vec<libc::pollfd> = Vec::with_capacity(fds.len());
        let mut ready = 0;
        for (p, rs) in fds.iter_mut().zip(&socks) {
            p.revents = 0;
            match rs {
                Some(rs) => {
                    let (mut r, mut wfd) = poll_rs(rs, p.events);
                    if wfd == -2 {
                        (r, wfd) = poll_rs(rs, p.events);
                    }
                    p.revents = r;
                    if r != 0 {
                        ready += 1;
                    }
                    sleep.push(libc::pollfd {
                        fd: wfd.max(-1),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
                None => sleep.push(libc::pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                }),
            }
        }
        let wait_ms = if ready > 0 {
            0
        } else {
            match deadline {
                Some(d) => d
                    .saturating_duration_since(std::time::Instant::now())
                    .as_millis()
                    .min(c_int::MAX as u128) as c_int,
                None => -1,
            }
        };
        // The rsockets' own readiness is already known when some are ready: look at the
        // ordinary descriptors only.
        if ready > 0 {
            for (s, rs) in sleep.iter_mut().zip(&socks) {
                if rs.is_some() {
                    s.fd = -1;
                }
            }
        }
        // SAFETY: `sleep` is a live array of its length.
        let n = unsafe { libc::poll(sleep.as_mut_ptr(), sleep.len() as libc::nfds_t, wait_ms) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        for ((p, s), rs) in fds.iter_mut().zip(&sleep).zip(&socks) {
            match rs {
                None => {
                    p.revents = s.revents;
                    if s.revents != 0 {
                        ready += 1;
                    }
                }
                Some(rs) => {
                    if s.revents != 0 {
                        woke(rs);
                    }
                }
            }
        }
        if ready > 0 {
            return Ok(ready);
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Ok(0);
        }
    }
}
