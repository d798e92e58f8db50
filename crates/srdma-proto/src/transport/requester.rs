//! The requester (rxe `rxe_req.c`): turns send WQEs into request packets.

use srdma_wire::{
    AtomicEthRepr, DethRepr, Kind, Opcode, PacketRepr, Position, RethRepr, Transport,
};

use super::{Ctx, Dest, MAX_PKT_PER_ACK, Qp, Transmit, WqeState, packets, send_wc};
use crate::access::AccessFlags;
use crate::qp::{QpState, QpType};
use crate::wc::{SendFlags, WcStatus};
use crate::wr::{SendOp, Sge};

/// More than a request packet's headers, pad and ICRC take beside its payload (BTH, RETH,
/// immediate or IETH, DETH: 40 bytes at most), for asking the pacer about a packet before it
/// is built.
const MAX_HEADERS: u32 = 64;

impl Qp {
    /// The next request packet, if the send queue has one that may go now.
    pub(super) fn next_request(&mut self, ctx: &mut Ctx<'_>, buf: &mut [u8]) -> Option<Transmit> {
        // Paced, or waiting out an RNR NAK: nothing until `handle_timeout` says the time has
        // come, as `has_requests_ready` (and so `wants_transmit`) says. The pacer, asked again,
        // may allow a packet sooner; the engine schedules by the deadline it was given.
        if self.pace_until.is_some() || self.rnr_deadline.is_some() {
            return None;
        }
        if let Some(p) = self.tlp_probe.take() {
            if self.resend.is_empty() {
                self.resend.push_back(p);
                self.probe_psn = Some(p);
                self.tlp_psn = Some(p);
                self.counters.tlp_probes += 1;
            }
        }
        if !self.resend.is_empty() {
            if let Some(t) = self.next_resend(ctx, buf) {
                return Some(t);
            }
        }
        loop {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.rnr_deadline.is_some() {
                return None;
            }
            let idx = self.req_cursor;
            let wqe = self.sq.get(idx)?;
            if wqe_error(wqe) {
                return None;
            }
            if wqe.wr.op.is_local() {
                // Bind and local invalidate run once every earlier WQE has completed (rxe
                // fences LOCAL_INV so; srdma fences binds too, which keeps completions in
                // order without a done-but-unreported state).
                if idx != 0 || self.state == QpState::Sqd {
                    return None;
                }
                self.local_op(ctx);
                continue;
            }
            match wqe.state {
                WqeState::Pending => {
                    self.req_cursor += 1;
                    continue;
                }
                // SQD finishes the messages in progress and starts no new one.
                WqeState::Posted if self.state == QpState::Sqd => return None,
                WqeState::Posted => {
                    if !self.start_wqe(idx) {
                        return None;
                    }
                }
                WqeState::Active => {}
            }
            // A connected QP whose rate is limited (CNPs) waits for its pacer.
            if ty_connected(self.cfg.qp_type)
                && let Some(t) = self.cc.pace(ctx.now)
            {
                self.pace_until = Some(t);
                return None;
            }
            return match self.build_request(ctx, idx, buf, None) {
                Ok(t) => t,
                Err(status) => {
                    // A UD WQE fails alone and the next one may go at once; on RC/UC the QP
                    // is now in ERR and the loop ends.
                    self.local_error(idx, status);
                    continue;
                }
            };
        }
    }

    /// Selective repeat: the next hole a SACK showed, sent again (a READ or atomic whose
    /// PSNs are in a hole: its request, once).
    fn next_resend(&mut self, ctx: &mut Ctx<'_>, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.rnr_deadline.is_some() {
            return None;
        }
        while let Some(&p) = self.resend.front() {
            if p.before(self.comp_psn)
                || !p.before(self.max_sent_psn)
                || self.scoreboard.contains(p)
            {
                self.resend.pop_front();
                continue;
            }
            // What is in flight (RFC 6675's pipe): sent, not acknowledged, not reported
            // and not waiting here to be sent again. A resend is a packet in flight too: the
            // window holds them back as it holds new ones.
            let outstanding = self.max_sent_psn.diff(self.comp_psn).max(0) as u32;
            let pipe = outstanding
                .saturating_sub(self.scoreboard.count())
                .saturating_sub(self.resend.len() as u32);
            // A probe (the tail loss probe, the first packet after an early timeout) goes
            // whatever the window says, as TCP's: what it probes for is that the window's
            // packets are gone, and held back by them it would wait for the next timeout.
            let probe = self.probe_psn.take_if(|q| *q == p).is_some();
            if pipe >= self.cc.window() && !probe {
                self.cc.held();
                return None;
            }
            self.resend.pop_front();
            let Some(idx) = self.sq.iter().position(|w| {
                w.state != WqeState::Posted && !p.before(w.first_psn) && !p.after(w.last_psn)
            }) else {
                continue;
            };
            let w = &self.sq[idx];
            let k = if w.wr.op.is_read_or_atomic() {
                // The request of the segment `p` is in (the whole READ unless it went as
                // several requests, see `read_segment`; an atomic's one PSN).
                let seg = w.read_seg.max(1);
                let start = p.diff(w.first_psn) as u32 / seg * seg;
                let end = start.saturating_add(seg).min(w.npkts);
                let (first, last) = (w.first_psn.add(start), w.first_psn.add(end - 1));
                self.resend.retain(|q| q.before(first) || q.after(last));
                let done = w.read_done / self.pmtu();
                if self.scoreboard.contains(first) || done >= end {
                    // The request arrived; its responses are the requester's to wait for.
                    continue;
                }
                start.max(done)
            } else {
                p.diff(w.first_psn) as u32
            };
            if let Some(t) = self.cc.pace(ctx.now) {
                self.resend.push_front(p);
                self.pace_until = Some(t);
                return None;
            }
            match self.build_request(ctx, idx, buf, Some(k)) {
                Ok(Some(t)) => return Some(t),
                Ok(None) => {}
                Err(status) => {
                    self.local_error(idx, status);
                    return None;
                }
            }
        }
        None
    }

    /// Assigns PSNs to a posted WQE, unless a fence, the `max_rd_atomic` limit or the PSN
    /// window holds it back.
    fn start_wqe(&mut self, idx: usize) -> bool {
        let pmtu = self.pmtu();
        let rc = self.cfg.qp_type == QpType::Rc;
        let max_rd_atomic = u32::from(self.attr.max_rd_atomic.max(1));
        let wqe = &self.sq[idx];
        // IBA 10.8.3.3: a fenced WQE waits for every earlier READ and atomic to complete.
        if wqe.wr.flags.contains(SendFlags::FENCE) && self.rd_atomic > 0 {
            return false;
        }
        let rd_atomic = wqe.wr.op.is_read_or_atomic();
        if rd_atomic && self.rd_atomic >= max_rd_atomic {
            return false;
        }
        if rc && self.req_psn.diff(self.comp_psn) >= self.cc.window() as i32 {
            self.cc.held();
            return false;
        }
        let npkts = match wqe.wr.op {
            _ if self.cfg.qp_type == QpType::Ud => 1,
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
            SendOp::AtomicWrite { .. } => 1,
            _ => packets(wqe.len, pmtu),
        };
        let first = self.req_psn;
        let network = !self.cc.is_unlimited();
        let wqe = &mut self.sq[idx];
        if matches!(wqe.wr.op, SendOp::Read { .. }) {
            wqe.read_seg = super::read_segment(npkts, self.attr.max_rd_atomic, network);
            wqe.extra_reads = 0;
        }
        wqe.first_psn = first;
        wqe.last_psn = first.add(npkts - 1);
        wqe.npkts = npkts;
        wqe.next_pkt = 0;
        wqe.state = WqeState::Active;
        wqe.has_rd_atomic = rd_atomic;
        self.req_psn = first.add(npkts);
        if rd_atomic {
            self.rd_atomic += 1;
        }
        true
    }

    /// Builds the next packet of WQE `idx` into `buf`. `Ok(None)`: the PSN window is full.
    /// `resend`: instead, packet `k` of the WQE again (selective repeat), which moves
    /// nothing on.
    fn build_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        idx: usize,
        buf: &mut [u8],
        resend: Option<u32>,
    ) -> Result<Option<super::Transmit>, WcStatus> {
        let ty = self.cfg.qp_type;
        let pmtu = self.pmtu();
        let transport = match ty {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        let wqe = &self.sq[idx];
        let k = resend.unwrap_or(wqe.next_pkt);
        let psn = wqe.first_psn.add(k);
        let n = wqe.npkts;
        // A READ request asks for the responses up to the end of its segment (see
        // `read_segment`); as every request, it goes while its first PSN is inside the
        // window, and it needs a `max_rd_atomic` slot of its own unless every earlier
        // response of its READ has come.
        let read = matches!(wqe.wr.op, SendOp::Read { .. });
        let seg = wqe.read_seg.max(1);
        let read_end = (k / seg).saturating_add(1).saturating_mul(seg).min(n);
        let extra_read = read && k > wqe.read_done / pmtu;
        if resend.is_none() && ty == QpType::Rc {
            if psn.diff(self.comp_psn) >= self.cc.window() as i32 {
                self.cc.held();
                return Ok(None);
            }
            if extra_read && self.rd_atomic >= u32::from(self.attr.max_rd_atomic.max(1)) {
                return Ok(None);
            }
        }
        let position = super::position(n, k);
        let end = matches!(position, Position::Last | Position::Only);
        let mut bth = super::bth(Opcode::RcSendOnly, self.attr.dest_qp_num, psn);
        let mut repr;
        let mut dest = self.connected_dest();
        let mut payload: Option<(u64, u32)> = None; // (offset in message, length)
        let mut direct: Option<[u8; 8]> = None; // a payload carried in the WR itself
        let mut request_done = end;
        match wqe.wr.op {
            SendOp::Send
            | SendOp::SendWithImm { .. }
            | SendOp::SendWithInv { .. }
            | SendOp::Write { .. }
            | SendOp::WriteWithImm { .. } => {
                let is_send = wqe.wr.op.is_send();
                let kind = if is_send { Kind::Send } else { Kind::Write };
                let imm = wqe.wr.op.imm().filter(|_| end);
                let offset = u64::from(k) * u64::from(pmtu);
                let plen = if ty == QpType::Ud {
                    wqe.len
                } else {
                    (wqe.len - offset as u32).min(pmtu)
                };
                if ty == QpType::Ud && wqe.len > pmtu {
                    // Larger than the port MTU: complete in error rather than silently drop
                    // (rxe fakes success here; a NIC reports a local length error).
                    return Err(WcStatus::LocLenErr);
                }
                let inv = match wqe.wr.op {
                    SendOp::SendWithInv { rkey } => Some(rkey.0),
                    _ => None,
                };
                bth.opcode = match inv {
                    Some(_) => Opcode::for_send_with_invalidate(transport, position),
                    None => Opcode::for_message(transport, kind, position, imm.is_some()),
                }
                .ok_or(WcStatus::LocQpOpErr)?;
                bth.solicited = end
                    && wqe.wr.flags.contains(SendFlags::SOLICITED)
                    && (is_send || imm.is_some());
                bth.ack_req = ty == QpType::Rc
                    && (end
                        || self.noack_pkts + 1 >= self.cc.ack_every(MAX_PKT_PER_ACK)
                        || (resend.is_some() && self.resend.is_empty())
                        || self.cc.paced_after(ctx.now, plen + MAX_HEADERS));
                repr = PacketRepr::new(bth, &[]);
                repr.imm_dt = imm;
                repr.ieth = inv.filter(|_| end);
                if let SendOp::Write { remote_addr, rkey }
                | SendOp::WriteWithImm {
                    remote_addr, rkey, ..
                } = wqe.wr.op
                {
                    if k == 0 {
                        repr.reth = Some(RethRepr {
                            va: remote_addr,
                            rkey: rkey.0,
                            dma_len: wqe.len,
                        });
                    }
                }
                if let Some(ud) = wqe.wr.ud {
                    let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                        self.attr.qkey
                    } else {
                        ud.remote_qkey
                    };
                    repr.bth.dest_qpn = ud.remote_qpn;
                    repr.deth = Some(DethRepr {
                        qkey,
                        src_qpn: self.cfg.qpn,
                    });
                    dest = Dest {
                        dgid: ud.ah.dgid,
                        udp_dport: ud.ah.udp_dport,
                        udp_sport: srdma_wire::sport::udp_sport(
                            ud.ah.flow_label,
                            self.cfg.qpn.value(),
                            ud.remote_qpn.value(),
                        ),
                        traffic_class: ud.ah.traffic_class,
                        hop_limit: ud.ah.hop_limit,
                        flow_label: ud.ah.flow_label,
                    };
                }
                payload = Some((offset, plen));
            }
            SendOp::Read { remote_addr, rkey } => {
                // Response packets k..read_end: a segment of a long READ, or what a retry
                // asks again from the first response not yet received to its segment's end.
                let offset = u64::from(k) * u64::from(pmtu);
                let end = (u64::from(read_end) * u64::from(pmtu)).min(u64::from(wqe.len));
                bth.opcode = Opcode::RcRdmaReadRequest;
                bth.ack_req = true;
                repr = PacketRepr::new(bth, &[]);
                repr.reth = Some(RethRepr {
                    va: remote_addr.wrapping_add(offset),
                    rkey: rkey.0,
                    dma_len: end.saturating_sub(offset) as u32,
                });
                request_done = read_end == n;
            }
            SendOp::CompareSwap {
                remote_addr, rkey, ..
            }
            | SendOp::FetchAdd {
                remote_addr, rkey, ..
            } => {
                // rxe fills AtomicETH: CMP_AND_SWP swap_add = swap, compare = compare;
                // FETCH_AND_ADD swap_add = add, compare 0.
                let (opcode, swap_add, compare) = match wqe.wr.op {
                    SendOp::CompareSwap { compare, swap, .. } => {
                        (Opcode::RcCompareSwap, swap, compare)
                    }
                    SendOp::FetchAdd { add, .. } => (Opcode::RcFetchAdd, add, 0),
                    _ => unreachable!("matched above"),
                };
                bth.opcode = opcode;
                bth.ack_req = true;
                repr = PacketRepr::new(bth, &[]);
                repr.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey: rkey.0,
                    swap_add,
                    compare,
                });
                request_done = true;
            }
            // Executed by `local_op`, never built into a packet.
            SendOp::LocalInv { .. } | SendOp::BindMw(_) => return Err(WcStatus::LocQpOpErr),
            SendOp::AtomicWrite {
                remote_addr,
                rkey,
                data,
            } => {
                // IBTA 1.5 / rxe: RETH with DMA length 8, then the 8 bytes; ACKed as a WRITE.
                bth.opcode = Opcode::RcAtomicWrite;
                bth.ack_req = true;
                repr = PacketRepr::new(bth, &[]);
                repr.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey: rkey.0,
                    dma_len: 8,
                });
                direct = Some(data);
            }
        }
        self.xrc_request(&mut repr, wqe.wr.xrc_srqn)?;
        let plen = match direct {
            Some(d) => d.len(),
            None => payload.map_or(0, |(_, l)| l as usize),
        };
        let len = repr
            .emit_headers(buf, plen)
            .map_err(|_| WcStatus::LocLenErr)?;
        if let Some((offset, plen)) = payload {
            let hl = repr.bth.opcode.header_len();
            let dst = &mut buf[hl..hl + plen as usize];
            match &wqe.wr.inline_data {
                Some(data) if wqe.wr.flags.contains(SendFlags::INLINE) => {
                    dst.copy_from_slice(&data[offset as usize..offset as usize + plen as usize]);
                }
                _ => gather(ctx, self.cfg.pd, wqe.wr.sges.as_slice(), offset, dst)?,
            }
        }
        if let Some(d) = direct {
            let hl = repr.bth.opcode.header_len();
            buf[hl..hl + d.len()].copy_from_slice(&d);
        }
        let ack_req = repr.bth.ack_req;
        if resend.is_some() {
            self.counters.retransmitted_pkts += 1;
            self.cc.on_resent(ctx.now, psn, len as u32);
            return Ok(Some(super::Transmit { len, dest }));
        }
        let (kind_send, last_psn) = (
            wqe.wr.op.is_send() || matches!(wqe.wr.op, SendOp::WriteWithImm { .. }),
            wqe.last_psn,
        );

        // The packet is built: advance.
        let wqe = &mut self.sq[idx];
        wqe.next_pkt = if read {
            read_end
        } else if request_done && wqe.wr.op.is_atomic() {
            wqe.npkts
        } else {
            k + 1
        };
        if extra_read {
            wqe.extra_reads += 1;
            self.rd_atomic += 1;
        }
        self.noack_pkts = if ack_req { 0 } else { self.noack_pkts + 1 };
        let sent_through = if read {
            wqe.first_psn.add(read_end - 1)
        } else if request_done {
            last_psn
        } else {
            psn
        };
        if psn.before(self.max_sent_psn) {
            self.counters.retransmitted_pkts += 1;
            self.cc.on_resent(ctx.now, psn, len as u32);
        } else {
            self.cc.on_sent(ctx.now, psn, len as u32, ack_req);
        }
        if self.max_sent_psn.diff(sent_through) <= 0 {
            self.max_sent_psn = sent_through.add(1);
        }
        if request_done && kind_send {
            self.counters.rdma_sends += 1;
        }
        if request_done {
            if ty == QpType::Rc {
                self.sq[idx].state = WqeState::Pending;
                self.req_cursor = idx + 1;
            } else {
                // UC and UD complete once the last packet is on the wire (rxe wqe_state_done).
                self.retire_front_unreliable(idx);
            }
        }
        if ty == QpType::Rc && self.retrans_deadline.is_none() {
            self.retrans_deadline = crate::timer::ack_timer(self.attr.timeout).map(|t| ctx.now + t);
        }
        if ty == QpType::Rc && self.rto_deadline.is_none() {
            self.arm_rto(ctx.now);
        }
        Ok(Some(super::Transmit { len, dest }))
    }

    /// Executes the local operation (bind, local invalidate) at the head of the send queue
    /// and completes it (rxe `rxe_do_local_ops`): a failed bind completes with
    /// `MW_BIND_ERR`, a failed invalidate with `LOC_QP_OP_ERR`, and either moves the QP to
    /// ERR.
    fn local_op(&mut self, ctx: &mut Ctx<'_>) {
        let Some(w) = self.sq.front() else { return };
        let (pd, qpn) = (self.cfg.pd, self.cfg.qpn);
        let status = match w.wr.op {
            SendOp::BindMw(bind) => match ctx.mrs.bind_mw(pd, qpn, &bind) {
                Ok(_) => WcStatus::Success,
                Err(_) => WcStatus::MwBindErr,
            },
            SendOp::LocalInv { rkey } => match ctx.mrs.invalidate_rkey(qpn, rkey) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocQpOpErr,
            },
            _ => WcStatus::LocQpOpErr,
        };
        if status.is_success() {
            if let Some(w) = self.sq.pop_front() {
                let signaled = w.wr.flags.contains(SendFlags::SIGNALED);
                self.push_send_wc(send_wc(qpn, &w, status), signaled);
            }
            self.req_cursor = 0;
        } else {
            self.local_error(0, status);
        }
    }

    /// Completes a UC/UD WQE whose last packet was just sent (always the head of the queue).
    fn retire_front_unreliable(&mut self, idx: usize) {
        debug_assert_eq!(idx, 0, "UC/UD requester works on the head WQE");
        if let Some(w) = self.sq.pop_front() {
            let signaled = w.wr.flags.contains(SendFlags::SIGNALED);
            self.push_send_wc(send_wc(self.cfg.qpn, &w, WcStatus::Success), signaled);
        }
        self.req_cursor = 0;
    }

    /// A local error on WQE `idx` (bad L_Key, message too long for UD...): complete it in
    /// error, in order, and move the QP to ERR (IBA 10.7.3.1: error completions are always
    /// reported, signaled or not).
    pub(super) fn local_error(&mut self, idx: usize, status: WcStatus) {
        if idx == 0 {
            if let Some(w) = self.sq.pop_front() {
                self.rd_atomic = self.rd_atomic.saturating_sub(w.rd_slots());
                self.push_send_wc(send_wc(self.cfg.qpn, &w, status), true);
            }
            if self.cfg.qp_type == QpType::Ud {
                // A UD send error does not break the QP: the next WQE goes on.
                self.req_cursor = 0;
                return;
            }
            self.enter_error(false);
        } else if let Some(w) = self.sq.get_mut(idx) {
            // Earlier WQEs still wait for their ACKs; the completer reports this one in order.
            w.error = Some(status);
        }
    }
}

fn wqe_error(w: &super::SendWqe) -> bool {
    w.error.is_some()
}

/// Copies `dst.len()` bytes of the message described by `sges`, starting `offset` bytes in,
/// out of registered memory (rxe `copy_data` from the SGEs). Every piece is checked against
/// the MR table at the moment of the copy, so an MR deregistered while the WQE is in flight
/// gives `LOC_PROT_ERR`, never a read of freed memory.
pub(super) fn gather(
    ctx: &mut Ctx<'_>,
    pd: crate::mr::PdId,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), WcStatus> {
    walk(
        ctx,
        pd,
        sges,
        offset,
        dst.len(),
        AccessFlags::empty(),
        |ctx, grant, at, n| {
            ctx.mem
                .read_for_transmit(grant.handle(), grant.offset(), &mut dst[at..at + n])
                .map_err(|_| WcStatus::LocProtErr)
        },
    )
}

/// Copies `src` into the buffer described by `sges`, starting `offset` bytes in (READ
/// responses, atomic results, received SENDs). Needs LOCAL_WRITE; a buffer too small for
/// the data gives `LOC_LEN_ERR`.
pub(super) fn scatter(
    ctx: &mut Ctx<'_>,
    pd: crate::mr::PdId,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), WcStatus> {
    walk(
        ctx,
        pd,
        sges,
        offset,
        src.len(),
        AccessFlags::LOCAL_WRITE,
        |ctx, grant, at, n| {
            ctx.mem
                .write(grant.handle(), grant.offset(), &src[at..at + n])
                .map_err(|_| WcStatus::LocProtErr)
        },
    )
}

fn walk(
    ctx: &mut Ctx<'_>,
    pd: crate::mr::PdId,
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    need: AccessFlags,
    mut f: impl FnMut(&mut Ctx<'_>, crate::mr::MrGrant, usize, usize) -> Result<(), WcStatus>,
) -> Result<(), WcStatus> {
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let l = u64::from(sge.length);
        if offset >= l {
            offset -= l;
            continue;
        }
        let n = (l - offset).min((len - done) as u64);
        let addr = sge.addr.checked_add(offset).ok_or(WcStatus::LocProtErr)?;
        let grant = ctx
            .mrs
            .check_local(pd, sge.lkey, addr, n, need)
            .map_err(|e| e.local_wc_status())?;
        if let Some(g) = grant {
            f(ctx, g, done, n as usize)?;
        }
        done += n as usize;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

/// RC and UC QPs send to one peer QP, whose CNPs may limit their rate.
fn ty_connected(ty: QpType) -> bool {
    matches!(ty, QpType::Rc | QpType::Uc)
}
