//! A connected rsocket's QP, rings and protocol state (the names are rsocket.c's), and what
//! a completion does to them.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::Arc;

use srdma::ibcm::IbConnection;
use srdma::{AccessFlags, Mr, Qp, QpInit, QpType};
use srdma_proto::{QpCaps, RKey, RecvWr, SendOp, SendWr, SgeList, Wc, WcStatus};

use super::reactor::Reactor;
use super::ring::Ring;
use super::*;

/// A QP's place in its reactor: given back when dropped (with the connection, or with
/// parts that never became one).
pub(super) struct Registration {
    pub(super) reactor: Arc<Reactor>,
    qpn: u32,
    entries: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.reactor.unregister(self.qpn);
        self.reactor.uncommit(self.entries);
    }
}

/// A QP on a reactor's CQ, the three rings (the target SGL followed by the iomap table in
/// one), receives posted; registered with the reactor (its completions wait for the socket).
pub(super) struct Parts {
    pub(super) reg: Registration,
    pub(super) qp: Qp,
    rbuf: Ring,
    sbuf: Ring,
    target: Ring,
}

pub(super) fn make_parts(reactor: &Arc<Reactor>, sizes: Sizes) -> Result<Parts, c_int> {
    let io = |e: srdma::Error| crate::errno_of(&e);
    let entries = usize::from(sizes.sq) + usize::from(sizes.rq);
    reactor.commit(entries)?;
    let mut init = QpInit::new(QpType::Rc, &reactor.cq, &reactor.cq);
    init.caps = QpCaps {
        max_send_wr: u32::from(sizes.sq),
        max_recv_wr: u32::from(sizes.rq),
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    init.sq_sig_all = true;
    init.access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = match reactor.pd.create_qp(&init) {
        Ok(qp) => qp,
        Err(e) => {
            reactor.uncommit(entries);
            return Err(io(e));
        }
    };
    reactor.register(qp.qpn().value());
    let reg = Registration {
        reactor: reactor.clone(),
        qpn: qp.qpn().value(),
        entries,
    };
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ctrl = (CTRL_SIZE as usize) * SGE_LEN;
    let table = SGL_SIZE as usize * SGE_LEN + usize::from(sizes.iomap) * IOMAP_LEN;
    let p = Parts {
        rbuf: Ring::new(&reactor.pd, sizes.rbuf as usize, remote)?,
        sbuf: Ring::new(
            &reactor.pd,
            sizes.sbuf as usize + ctrl,
            AccessFlags::LOCAL_WRITE,
        )?,
        target: Ring::new(&reactor.pd, table, remote)?,
        reg,
        qp,
    };
    for _ in 0..sizes.rq {
        p.qp.post_recv(RecvWr {
            wr_id: RECV_FLAG,
            sges: SgeList::new(),
        })
        .map_err(io)?;
    }
    Ok(p)
}

/// Our `rs_conn_data` (big-endian fields, as rsocket.c formats it).
pub(super) fn conn_data(p: &Parts, sizes: Sizes) -> [u8; CONN_DATA_LEN] {
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
    d[16..20].copy_from_slice(&p.target.rkey().to_be_bytes());
    d[20..24].copy_from_slice(&SGL_SIZE.to_be_bytes());
    d[24..32].copy_from_slice(&p.rbuf.addr().to_be_bytes());
    d[32..36].copy_from_slice(&p.rbuf.rkey().to_be_bytes());
    d[36..40].copy_from_slice(&(sizes.rbuf >> 1).to_be_bytes());
    d
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// A region `riomap` registered, known to the peer by `offset`.
pub(super) struct IoMap {
    pub(super) offset: u64,
    pub(super) mr: Mr,
}

/// An entry of a target SGL: address, key, length.
type Sgl = (u64, u32, u32);

pub(super) struct Conn {
    pub(super) ib: IbConnection,
    pub(super) qp: Qp,
    rbuf: Ring,
    sbuf: Ring,
    target: Ring,
    /// Last: the QP is gone from the reactor only after the rest.
    reg: Registration,
    pub(super) sizes: Sizes,
    pub(super) readable: bool,
    pub(super) writable: bool,
    pub(super) connected: bool,
    pub(super) error: bool,
    /// The peer stopped sending (its shutdown or disconnect message came).
    pub(super) peer_done: bool,
    /// This side shut its writing down (`shutdown` SHUT_WR or SHUT_RDWR).
    pub(super) shut_wr: bool,
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
    remote_sgl: Sgl,
    /// The buffers the peer gave us (our target SGL as it wrote it, copied out when its
    /// grant completed), the one we write into next, and the entry its next grant fills.
    target_sgl: [Sgl; SGL_SIZE as usize],
    target_sge: usize,
    sgl_fill: usize,
    rmsg: VecDeque<u32>,
    /// Bytes in `rmsg` (what FIONREAD reports).
    rbytes: usize,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    sbuf_pos: u32,
    sbuf_bytes_avail: u32,
    sqe_avail: u32,
    /// Receives completed and not yet posted again.
    recv_used: u32,
    /// Bytes copied into the send ring and not posted yet (the preload's sends: a byte
    /// buffer, as TCP's, not a message per call); they are the last ones before
    /// `sbuf_pos`, and go out as credits and the peer's buffer allow ([`Conn::flush`]).
    pub(super) staged: u32,
    /// The peer's iomap table: address, key, entries (0: it has none).
    remote_iomap: Sgl,
    /// Our mappings the peer may write (`riomap` with `PROT_WRITE`), by their entry in its
    /// table.
    pub(super) iomaps: Vec<Option<IoMap>>,
    /// Entries of `iomaps` not yet written into the peer's table.
    pub(super) iomap_queue: VecDeque<usize>,
    /// Mappings without remote access (`PROT_NONE`): registered, never announced.
    pub(super) local_maps: Vec<IoMap>,
    /// Posts go without the doorbell, at the application's next poll
    /// (`Qp::post_send_deferred`) where the reactor defers (`Reactor::defers`): set while
    /// the preload's `send` posts what it staged.
    pub(super) defer_posts: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.staged > 0 {
            super::reactor::staged_changed(false);
        }
    }
}

impl Conn {
    /// A connection from its parts and the peer's `rs_conn_data` (None: not an rsocket).
    pub(super) fn new(p: Parts, ib: IbConnection, sizes: Sizes, peer: &[u8]) -> Option<Conn> {
        if peer.len() < CONN_DATA_LEN || peer[0] != 1 {
            return None;
        }
        let remote_sgl = (be64(peer, 8), be32(peer, 16), be32(peer, 20));
        if remote_sgl.2 == 0 {
            return None;
        }
        let peer_net = peer[1] & CONN_FLAG_NET != 0;
        let mut c = Conn {
            defer_posts: false,
            ib,
            qp: p.qp,
            rbuf: p.rbuf,
            sbuf: p.sbuf,
            target: p.target,
            reg: p.reg,
            sizes,
            readable: true,
            writable: true,
            connected: true,
            error: false,
            peer_done: false,
            shut_wr: false,
            swap: peer_net != cfg!(target_endian = "big"),
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: u16::from_be_bytes([peer[2], peer[3]]),
            rseq_no: 0,
            rseq_comp: sizes.rq >> 1,
            remote_sge: 1,
            remote_sgl,
            // The first buffer the peer gives is in its connection data.
            target_sgl: [(be64(peer, 24), be32(peer, 32), be32(peer, 36)), (0, 0, 0)],
            target_sge: 0,
            sgl_fill: 1 % SGL_SIZE as usize,
            rmsg: VecDeque::new(),
            rbytes: 0,
            rbuf_offset: 0,
            rbuf_bytes_avail: sizes.rbuf >> 1,
            rbuf_free_offset: sizes.rbuf >> 1,
            sbuf_pos: 0,
            sbuf_bytes_avail: sizes.sbuf,
            sqe_avail: u32::from(sizes.sq) - CTRL_SIZE,
            recv_used: 0,
            staged: 0,
            remote_iomap: (0, 0, 0),
            iomaps: Vec::new(),
            iomap_queue: VecDeque::new(),
            local_maps: Vec::new(),
        };
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
        Some(c)
    }

    /// The PD the connection's memory is registered in (for `riomap`).
    pub(super) fn pd(&self) -> &srdma::Pd {
        &self.reg.reactor.pd
    }

    /// The reactor the connection completes into.
    pub(super) fn reactor(&self) -> &Arc<Reactor> {
        &self.reg.reactor
    }

    /// Entry `i` of our target SGL as the peer wrote it into memory.
    fn read_target(&self, i: usize) -> Sgl {
        let mut b = [0u8; SGE_LEN];
        self.target.get(i * SGE_LEN, &mut b);
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

    /// An `rs_sge` as it lies in memory: host order, swapped for a peer of the other
    /// byte order.
    fn sge_bytes(&self, (a, k, l): Sgl) -> [u8; SGE_LEN] {
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

    /// Copies `len` bytes from `src` (a gather list, starting `skip` bytes in) into the send
    /// ring at its current position, wrapping at its end, and gives the (one or two) SGEs
    /// that hold them. The caller has checked the room.
    fn stage(&mut self, src: &[&[u8]], skip: usize, len: u32) -> SgeList {
        let pos = self.sbuf_pos;
        let first = len.min(self.sizes.sbuf - pos);
        let mut at = pos as usize;
        let mut left = len as usize;
        let mut skip = skip;
        for s in src {
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            let part = &s[skip..];
            skip = 0;
            let n = part.len().min(left);
            // Up to the ring's end, then from its start.
            let room = self.sizes.sbuf as usize - at;
            if n <= room {
                self.sbuf.put(at, &part[..n]);
                at += n;
            } else {
                self.sbuf.put(at, &part[..room]);
                self.sbuf.put(0, &part[room..n]);
                at = n - room;
            }
            if at == self.sizes.sbuf as usize {
                at = 0;
            }
            left -= n;
            if left == 0 {
                break;
            }
        }
        let mut sges = SgeList::one(self.sbuf.sge(pos as usize, first as usize));
        if first < len {
            sges.push(self.sbuf.sge(0, (len - first) as usize));
        }
        self.sbuf_pos = at as u32;
        sges
    }

    /// The peer's mapping that holds `offset`, from our iomap table as it wrote it:
    /// (mapping's offset, address, key, length).
    pub(super) fn find_iomap(&self, offset: u64) -> Option<(u64, u64, u32, u32)> {
        let base = SGL_SIZE as usize * SGE_LEN;
        (0..usize::from(self.sizes.iomap)).find_map(|i| {
            let mut b = [0u8; IOMAP_LEN];
            self.target.get(base + i * IOMAP_LEN, &mut b);
            let mut o = u64::from_ne_bytes(b[0..8].try_into().expect("8"));
            let mut a = u64::from_ne_bytes(b[8..16].try_into().expect("8"));
            let mut k = u32::from_ne_bytes(b[16..20].try_into().expect("4"));
            let mut l = u32::from_ne_bytes(b[20..24].try_into().expect("4"));
            if self.swap {
                (o, a, k, l) = (
                    o.swap_bytes(),
                    a.swap_bytes(),
                    k.swap_bytes(),
                    l.swap_bytes(),
                );
            }
            (offset >= o && offset - o < u64::from(l)).then_some((o, a, k, l))
        })
    }

    /// Writes the next queued mapping into its entry of the peer's table (rs_write_iomap):
    /// a 32-byte `rs_iomap` with immediate op 6 and the entry, which uses a credit.
    pub(super) fn post_iomap(&mut self) -> Result<(), c_int> {
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
        let rkey = m.mr.rkey().map_or(0, |k| k.0);
        b[8..].copy_from_slice(&self.sge_bytes((m.mr.addr(), rkey, m.mr.len() as u32)));
        let sges = self.stage(&[&b], 0, IOMAP_LEN as u32);
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
        let wr = SendWr::new(wr_id, op, sges);
        if self.defer_posts && self.reg.reactor.defers() {
            self.qp.post_send_deferred(wr)
        } else {
            self.qp.post_send(wr)
        }
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

    pub(super) fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// Sends control message `ctrl` (disconnect, shutdown) if a control slot is free; false
    /// if none is.
    pub(super) fn send_ctrl(&mut self, ctrl: u32) -> bool {
        // After the data staged before it, never ahead of it.
        if !self.connected || !self.ctrl_avail() || self.staged > 0 {
            return false;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        if self.post_msg(msg(OP_CTRL, ctrl)).is_err() {
            self.fail();
        }
        true
    }

    pub(super) fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT.min(self.sizes.sbuf)
            && self.sseq_no != self.sseq_comp
            && self.target_sgl[self.target_sge].2 != 0
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.sizes.rbuf >> 1
            || (self.rseq_no as i16).wrapping_sub(self.rseq_comp as i16) >= 0)
            && self.ctrl_avail()
            && self.connected
    }

    pub(super) fn update_credits(&mut self) {
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
                self.rbuf.rkey(),
                half,
            ));
            let slot = self.sizes.sbuf as usize + (self.ctrl_seqno % CTRL_SIZE) as usize * SGE_LEN;
            self.sbuf.put(slot, &b);
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

    pub(super) fn fail(&mut self) {
        if self.staged > 0 {
            self.staged = 0;
            super::reactor::staged_changed(false);
        }
        if self.connected {
            self.connected = false;
            self.readable = false;
            self.writable = false;
            self.error = true;
        }
    }

    fn disconnected(&mut self) {
        if self.staged > 0 {
            self.staged = 0;
            super::reactor::staged_changed(false);
        }
        self.connected = false;
        self.readable = false;
        self.writable = false;
        self.peer_done = true;
    }

    /// Takes one completion (a step of rs_poll_cq): data and control messages, credits,
    /// the send ring's room.
    pub(super) fn on_wc(&mut self, wc: &Wc) {
        if wc.wr_id & RECV_FLAG != 0 {
            if wc.status != WcStatus::Success {
                // Flushed: the connection is gone (the peer's DREQ, or its process
                // died). rsocket.c ignores these and a reader would wait forever; here
                // the reader sees the end of the stream.
                if self.connected {
                    self.disconnected();
                }
                return;
            }
            self.recv_used += 1;
            let Some(m) = wc.imm_data else { return };
            match m >> 29 {
                OP_SGL => {
                    self.sseq_comp = (m & 0x1FFF_FFFF) as u16;
                    // A grant that carried a buffer: it lies in the next entry now.
                    if wc.byte_len as usize == SGE_LEN {
                        self.target_sgl[self.sgl_fill] = self.read_target(self.sgl_fill);
                        self.sgl_fill = (self.sgl_fill + 1) % SGL_SIZE as usize;
                    }
                }
                OP_IOMAP_SGL | OP_WRITE => {}
                OP_CTRL => match m & 0x1FFF_FFFF {
                    CTRL_DISCONNECT => self.disconnected(),
                    CTRL_SHUTDOWN => {
                        self.peer_done = true;
                        if self.writable {
                            self.readable = false;
                        } else {
                            self.disconnected();
                        }
                    }
                    _ => {}
                },
                _ => {
                    self.rbytes += (m & 0x1FFF_FFFF) as usize;
                    self.rmsg.push_back(m);
                }
            }
        } else {
            let m = wc.wr_id as u32;
            match m >> 29 {
                OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                OP_CTRL => {
                    self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                    if m & 0x1FFF_FFFF == CTRL_DISCONNECT {
                        self.connected = false;
                        self.readable = false;
                        self.writable = false;
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

    /// After a run of completions: posts the receives they used again, grants credits and
    /// sends what was staged as far as the credits that came allow.
    pub(super) fn after_delivery(&mut self) {
        if self.staged > 0 && self.flush(PRELOAD_MAX_TRANSFER).is_err() {
            self.fail();
        }
        if self.connected {
            let n = std::mem::take(&mut self.recv_used);
            // The ACKs of what came wait for the program's next poll (or its answer), with
            // every other connection's (see `Qp::post_recv_deferred`).
            let defer = self.reg.reactor.defers();
            for _ in 0..n {
                let wr = RecvWr {
                    wr_id: RECV_FLAG,
                    sges: SgeList::new(),
                };
                let r = if defer {
                    self.qp.post_recv_deferred(wr)
                } else {
                    self.qp.post_recv(wr)
                };
                if r.is_err() {
                    self.fail();
                    break;
                }
            }
        } else {
            self.recv_used = 0;
        }
        self.update_credits();
    }

    pub(super) fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    /// Bytes received and not read yet.
    pub(super) fn rbytes(&self) -> usize {
        self.rbytes
    }

    pub(super) fn all_sends_done(&self) -> bool {
        (self.staged == 0
            && self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) + self.sqe_avail
                == u32::from(self.sizes.sq))
            || !self.connected
    }

    /// Bytes the send ring can take now.
    pub(super) fn stage_room(&self) -> u32 {
        self.sbuf_bytes_avail
    }

    /// Copies `n` bytes of `src` (from `skip`) into the send ring, to go out with the next
    /// [`Conn::flush`]. The caller has checked the room.
    pub(super) fn stage_bytes(&mut self, src: &[&[u8]], skip: usize, n: u32) {
        if n == 0 {
            return;
        }
        let _ = self.stage(src, skip, n);
        self.sbuf_bytes_avail -= n;
        if self.staged == 0 {
            super::reactor::staged_changed(true);
        }
        self.staged += n;
    }

    /// Posts what is staged, as far as the credits, the send queue and the buffers the peer
    /// gave allow, in transfers of at most `max` bytes.
    pub(super) fn flush(&mut self, max: u32) -> Result<(), c_int> {
        let had = self.staged > 0;
        let r = self.flush_some(max);
        if had && self.staged == 0 {
            super::reactor::staged_changed(false);
        }
        r
    }

    fn flush_some(&mut self, max: u32) -> Result<(), c_int> {
        if !self.connected {
            // Nothing goes any more: the bytes are dropped, as a reset connection's.
            self.staged = 0;
            return Ok(());
        }
        while self.staged > 0 && self.sqe_avail > 0 && self.sseq_no != self.sseq_comp {
            let (_, _, tlen) = self.target_sgl[self.target_sge];
            if tlen == 0 {
                break;
            }
            let ring = self.sizes.sbuf;
            let xfer = self.staged.min(tlen).min(max);
            let start = (self.sbuf_pos + ring - self.staged) % ring;
            let first = xfer.min(ring - start);
            let mut sges = SgeList::one(self.sbuf.sge(start as usize, first as usize));
            if first < xfer {
                sges.push(self.sbuf.sge(0, (xfer - first) as usize));
            }
            self.staged -= xfer;
            self.write_data(xfer, sges)?;
        }
        Ok(())
    }

    /// Posts `sges` (`xfer` bytes, staged in the send buffer) as one RDMA WRITE with
    /// immediate into the buffer the peer gave last, which moves on before the write leaves
    /// (rs_write_data).
    fn write_data(&mut self, xfer: u32, sges: SgeList) -> Result<(), c_int> {
        let (taddr, tkey, tlen) = self.target_sgl[self.target_sge];
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        let i = self.target_sge;
        self.target_sgl[i] = (taddr.wrapping_add(u64::from(xfer)), tkey, tlen - xfer);
        if tlen == xfer {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE as usize;
        }
        let m = msg(OP_DATA, xfer);
        let op = SendOp::WriteWithImm {
            remote_addr: taddr,
            rkey: RKey(tkey),
            imm: m,
        };
        self.post(u64::from(m), op, sges)
    }

    /// Stages and posts one data transfer of at most `most` bytes of `src` (from `skip`),
    /// into the buffer the peer gave last (rs_write_data); the bytes sent. The caller has
    /// checked [`Conn::can_send`].
    pub(super) fn send_data(
        &mut self,
        src: &[&[u8]],
        skip: usize,
        most: u32,
    ) -> Result<u32, c_int> {
        let (_, _, tlen) = self.target_sgl[self.target_sge];
        let xfer = most.min(tlen).min(self.sbuf_bytes_avail);
        let sges = self.stage(src, skip, xfer);
        self.sbuf_bytes_avail -= xfer;
        self.write_data(xfer, sges).map(|()| xfer)
    }

    /// `riowrite`'s step: one plain RDMA WRITE of at most `most` bytes of `data` at
    /// `offset` of the peer's mappings; `None` when no mapping holds `offset`.
    pub(super) fn iowrite_step(
        &mut self,
        data: &[u8],
        offset: u64,
        most: u32,
    ) -> Option<Result<u32, c_int>> {
        let (moff, addr, key, mlen) = self.find_iomap(offset)?;
        // find_iomap checked moff <= offset < moff + mlen; no sum of the peer's values here.
        let room = mlen - (offset - moff) as u32;
        let xfer = most
            .min(room)
            .min(data.len() as u32)
            .min(self.sbuf_bytes_avail);
        let sges = self.stage(&[data], 0, xfer);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= xfer;
        let op = SendOp::Write {
            remote_addr: addr.wrapping_add(offset - moff),
            rkey: RKey(key),
        };
        Some(
            self.post(u64::from(msg(OP_WRITE, xfer)), op, sges)
                .map(|()| xfer),
        )
    }

    /// Copies received bytes into `out` (a scatter list) from the oldest message on, as far
    /// as they go; `peek` leaves them. The bytes copied.
    pub(super) fn read_into(&mut self, out: &mut [&mut [u8]], peek: bool) -> usize {
        let mut offset = self.rbuf_offset;
        let mut done = 0usize;
        let mut oi = 0usize;
        let mut opos = 0usize;
        let mut mi = 0usize;
        while mi < self.rmsg.len() {
            while oi < out.len() && opos == out[oi].len() {
                oi += 1;
                opos = 0;
            }
            if oi == out.len() {
                break;
            }
            let len = self.rmsg[mi] & 0x1FFF_FFFF;
            let mut left = len;
            // One message into as many output pieces as it takes.
            while left > 0 && oi < out.len() {
                let room = out[oi].len() - opos;
                let n = (left as usize).min(room);
                let mut copied = 0;
                while copied < n {
                    let end = (self.sizes.rbuf - offset) as usize;
                    let k = (n - copied).min(end);
                    self.rbuf.get(
                        offset as usize,
                        &mut out[oi][opos + copied..opos + copied + k],
                    );
                    copied += k;
                    offset = if k == end { 0 } else { offset + k as u32 };
                }
                opos += n;
                done += n;
                left -= n as u32;
                if opos == out[oi].len() {
                    oi += 1;
                    opos = 0;
                }
            }
            let take = len - left;
            if peek {
                if left > 0 {
                    break;
                }
                mi += 1;
                continue;
            }
            // Saturating: a hostile peer may claim more than the ring holds.
            self.rbuf_bytes_avail = self.rbuf_bytes_avail.saturating_add(take);
            self.rbytes = self.rbytes.saturating_sub(take as usize);
            if left == 0 {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            } else {
                self.rmsg[0] = msg(OP_DATA, left);
            }
            self.rbuf_offset = offset;
            if left > 0 {
                break;
            }
        }
        done
    }
}
