//! The responder (rxe `rxe_resp.c`): checks and executes incoming requests, and sends ACKs,
//! NAKs, READ responses and atomic ACKs.
//!
//! Check order as rxe's pipeline: PSN → opcode sequence → operation allowed by the QP's
//! access flags → resources (receive WQE, RD/atomic resources) → length → R_Key → execute →
//! complete → acknowledge.

use srdma_wire::{
    AethRepr, AtomicAckEthRepr, IpRepr, Kind, NakCode, Opcode, PacketRepr, Position, Psn, Syndrome,
    Transport,
};

use super::requester::scatter;
use super::selective::Held;
use super::{
    Ctx, Inbound, MAX_MSG_SIZE, Qp, RecvMeta, Reliability, Resource, RespOut, Transmit, packets,
};
use crate::access::AccessFlags;
use crate::qp::QpType;
use crate::wc::{Wc, WcFlags, WcOpcode, WcStatus};
use crate::wr::RecvWr;

/// Bytes of GRH at the head of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// Selective repeat: a SACK at least every this many packets kept ahead.
const SACK_EVERY: usize = 16;

/// Why a request was not executed.
enum Refuse {
    /// No receive WQE: RNR NAK (RC) or drop.
    Rnr,
    /// A class C error (RC): NAK with this code; the receive WQE in progress, if any,
    /// completes with the status.
    Nak(NakCode, WcStatus),
}

impl Qp {
    pub(super) fn handle_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &PacketRepr<'_>,
        meta: &RecvMeta,
    ) {
        match self.cfg.qp_type {
            QpType::Rc => self.rc_request(ctx, pkt),
            QpType::Uc => self.uc_request(ctx, pkt),
            QpType::Ud => self.ud_request(ctx, pkt, meta),
        }
    }

    fn rc_request(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        let d = psn.diff(self.epsn);
        if d > 0 {
            if self.reliability == Reliability::SelectiveRepeat {
                self.hold_ahead(pkt, d as u32);
                return;
            }
            // One PSN-sequence NAK per gap, carrying the expected PSN (IBA 9.7.5.1.3).
            if !self.nak_sent {
                // rxe counts out_of_seq_request once per gap, when it sends the NAK.
                self.counters.out_of_seq_request += 1;
                self.nak_sent = true;
                self.queue_ack(self.epsn, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        if d < 0 {
            self.counters.duplicate_request += 1;
            self.duplicate(ctx, pkt);
            return;
        }
        self.nak_sent = false;
        self.execute_in_order(ctx, pkt);
        if !self.reorder.is_empty() {
            self.replay_held(ctx);
        }
    }

    /// Executes the request at the expected PSN, answering a refusal (RNR NAK, or a NAK
    /// that moves the QP to ERR); the packets kept ahead move with the expected PSN.
    fn execute_in_order(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        let before = self.epsn;
        match self.execute(ctx, pkt) {
            Ok(()) => {}
            Err(Refuse::Rnr) => {
                self.counters.send_rnr_err += 1;
                self.queue_ack(
                    psn,
                    Syndrome::RnrNak {
                        timer_code: self.attr.min_rnr_timer,
                    },
                );
            }
            Err(Refuse::Nak(code, status)) => {
                self.queue_ack(psn, Syndrome::Nak(code));
                self.fail_inbound(status);
                self.enter_error(true);
            }
        }
        self.reorder.advance(self.epsn.diff(before).max(0) as u32);
    }

    /// Selective repeat: keeps a request that came `ahead` PSNs early, and tells the
    /// requester what is missing when a new gap shows (and on every AckReq, and every
    /// [`SACK_EVERY`] packets kept, so that a lost SACK costs little).
    fn hold_ahead(&mut self, pkt: &PacketRepr<'_>, ahead: u32) {
        let held = self.reorder.hold(ahead, || {
            let mut copy = vec![0; pkt.buffer_len()];
            let n = pkt.emit(&mut copy).unwrap_or(0);
            copy.truncate(n);
            copy
        });
        let sack = match held {
            Held::Kept { after_gap } => {
                if after_gap {
                    self.counters.out_of_seq_request += 1;
                }
                after_gap || pkt.bth.ack_req || self.reorder.len() % SACK_EVERY == 0
            }
            Held::Duplicate => {
                self.counters.duplicate_request += 1;
                pkt.bth.ack_req
            }
            Held::Dropped => {
                self.counters.dropped_pkts += 1;
                false
            }
        };
        if sack {
            self.queue_sack();
        }
    }

    /// Executes the packets kept ahead that the expected PSN has reached, in order; then
    /// acknowledges (everything kept went in) or reports the next gap.
    fn replay_held(&mut self, ctx: &mut Ctx<'_>) {
        let mut replayed = false;
        while let Some(bytes) = self.reorder.take() {
            let Ok(pkt) = PacketRepr::parse_bytes(&bytes) else {
                self.reorder.advance(1);
                continue;
            };
            replayed = true;
            let before = self.epsn;
            self.execute_in_order(ctx, &pkt);
            if self.epsn == before {
                // Refused (RNR NAK, error): the requester resends from there.
                self.reorder.clear();
                return;
            }
        }
        if !replayed {
            return;
        }
        if !self.reorder.is_empty() {
            self.queue_sack();
        } else if self.ack_psn == self.epsn {
            self.queue_ack(self.epsn.sub(1), Syndrome::ACK);
        }
    }

    /// Queues a SACK (one: a SACK still waiting at the tail is built when it leaves, from
    /// what is kept then).
    fn queue_sack(&mut self) {
        if !matches!(self.resp_out.back(), Some(RespOut::Sack)) {
            self.resp_out.push_back(RespOut::Sack);
        }
    }

    /// UC: no ACKs; a PSN gap or any error drops the rest of the message and reception
    /// resumes at the next FIRST/ONLY (IBA 9.7.5.1.3, rxe `check_psn` / class D errors).
    fn uc_request(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let op = pkt.bth.opcode;
        if self.uc_drop || pkt.bth.psn != self.epsn {
            if !op.is_start() {
                self.uc_drop = true;
                self.abandon_inbound(ctx);
                return;
            }
            self.abandon_inbound(ctx);
            self.uc_drop = false;
            self.epsn = pkt.bth.psn;
        }
        if self.execute(ctx, pkt).is_err() {
            self.uc_drop = true;
            self.abandon_inbound(ctx);
            self.epsn = pkt.bth.psn.add(1);
        }
    }

    /// UD: one packet per message, Q_Key checked, the GRH written ahead of the payload.
    fn ud_request(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>, meta: &RecvMeta) {
        let Some(deth) = pkt.deth else { return };
        if deth.qkey != self.attr.qkey {
            self.counters.qkey_violations += 1;
            self.counters.dropped_pkts += 1;
            return;
        }
        if pkt.payload.len() > self.pmtu() as usize {
            self.counters.dropped_pkts += 1;
            return;
        }
        let Some(wqe) = self.take_recv(ctx) else {
            // No receive WQE: a UD message is dropped (no RNR on UD).
            self.counters.dropped_pkts += 1;
            return;
        };
        let qpn = self.cfg.qpn;
        let grh = grh_bytes(&meta.encap.ip, pkt.buffer_len());
        let total = GRH_LEN + pkt.payload.len();
        let fits = wqe.sges.total_len().is_some_and(|l| l as usize >= total);
        let status = if !fits {
            WcStatus::LocLenErr
        } else {
            match scatter(ctx, self.cfg.pd, wqe.sges.as_slice(), 0, &grh).and_then(|()| {
                scatter(
                    ctx,
                    self.cfg.pd,
                    wqe.sges.as_slice(),
                    GRH_LEN as u64,
                    pkt.payload,
                )
            }) {
                Ok(()) => WcStatus::Success,
                Err(s) => s,
            }
        };
        let mut wc = Wc::new(wqe.wr_id, status, WcOpcode::Recv, qpn)
            .with_src_qp(deth.src_qpn)
            .with_flags(WcFlags::GRH);
        wc.sl = roce_pkt_type(&meta.encap.ip);
        if status.is_success() {
            wc = wc.with_byte_len(total as u32);
            if let Some(imm) = pkt.imm_dt {
                wc = wc.with_imm(imm);
            }
            self.counters.rdma_recvs += 1;
        }
        self.recv_cq.push_back(wc);
    }

    /// Executes an in-sequence RC/UC request.
    fn execute(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Result<(), Refuse> {
        let op = pkt.bth.opcode;
        let psn = pkt.bth.psn;
        let pmtu = self.pmtu();
        let inv = |status| Refuse::Nak(NakCode::InvalidRequest, status);

        // Opcode sequence: MIDDLE/LAST only continue a message of the same kind.
        let continues = matches!(op.position(), Some(Position::Middle | Position::Last));
        let in_kind = match self.inbound {
            Inbound::Idle => None,
            Inbound::Send { .. } => Some(Kind::Send),
            Inbound::Write { .. } => Some(Kind::Write),
        };
        if continues != in_kind.is_some() || (continues && in_kind != Some(op.kind())) {
            return Err(inv(WcStatus::RemInvReqErr));
        }

        // The operation must be enabled on the QP.
        let need = match op.kind() {
            Kind::Write | Kind::AtomicWrite => AccessFlags::REMOTE_WRITE,
            Kind::ReadRequest => AccessFlags::REMOTE_READ,
            Kind::CompareSwap | Kind::FetchAdd => AccessFlags::REMOTE_ATOMIC,
            Kind::Send => AccessFlags::empty(),
            // FLUSH is not implemented.
            _ => return Err(inv(WcStatus::RemInvReqErr)),
        };
        if !self.attr.qp_access_flags.contains(need) {
            return Err(inv(WcStatus::RemInvReqErr));
        }

        // Length rules of the opcode at this path MTU.
        if op
            .check_payload_len(pkt.payload.len(), pmtu as usize)
            .is_err()
        {
            return Err(inv(WcStatus::RemInvReqErr));
        }
        if pkt.reth.is_some_and(|r| r.dma_len > MAX_MSG_SIZE) {
            return Err(inv(WcStatus::RemInvReqErr));
        }

        match op.kind() {
            Kind::Send => self.execute_send(ctx, pkt)?,
            Kind::Write => self.execute_write(ctx, pkt)?,
            Kind::ReadRequest => {
                if self.attr.max_dest_rd_atomic == 0 {
                    return Err(inv(WcStatus::RemInvReqErr));
                }
                let reth = pkt.reth.unwrap_or_default();
                ctx.mrs
                    .check_remote_at(
                        self.cfg.pd,
                        self.cfg.qpn,
                        crate::mr::RKey(reth.rkey),
                        reth.va,
                        u64::from(reth.dma_len),
                        AccessFlags::REMOTE_READ,
                    )
                    .map_err(|e| Refuse::Nak(e.remote_nak(), WcStatus::RemAccessErr))?;
                let n = packets(reth.dma_len, pmtu);
                let last = psn.add(n - 1);
                self.push_resource(Resource::Read {
                    first_psn: psn,
                    last_psn: last,
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                });
                self.resp_out.push_back(RespOut::Read {
                    first: psn,
                    next: psn,
                    last,
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.dma_len,
                });
                self.msn = self.msn.wrapping_add(1);
                self.epsn = last.add(1);
                return Ok(());
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                if self.attr.max_dest_rd_atomic == 0 {
                    return Err(inv(WcStatus::RemInvReqErr));
                }
                let a = pkt.atomic_eth.unwrap_or_default();
                let grant = ctx
                    .mrs
                    .check_atomic_at(self.cfg.pd, self.cfg.qpn, crate::mr::RKey(a.rkey), a.va)
                    .map_err(|e| Refuse::Nak(e.remote_nak(), WcStatus::RemAccessErr))?;
                let orig = if op.kind() == Kind::CompareSwap {
                    ctx.mem
                        .compare_swap(grant.handle(), grant.offset(), a.compare, a.swap_add)
                } else {
                    ctx.mem
                        .fetch_add(grant.handle(), grant.offset(), a.swap_add)
                }
                .map_err(|_| Refuse::Nak(NakCode::RemoteOperationalError, WcStatus::RemOpErr))?;
                self.push_resource(Resource::Atomic { psn, orig });
                self.resp_out.push_back(RespOut::Atomic { psn, orig });
                self.msn = self.msn.wrapping_add(1);
            }
            Kind::AtomicWrite => {
                self.execute_atomic_write(ctx, pkt)?;
                self.msn = self.msn.wrapping_add(1);
            }
            _ => unreachable!("filtered above"),
        }
        self.epsn = psn.add(1);
        let write_like = matches!(op.kind(), Kind::Send | Kind::Write | Kind::AtomicWrite);
        if write_like {
            self.ack_psn = self.epsn;
        }
        if pkt.bth.ack_req && write_like && self.cfg.qp_type == QpType::Rc {
            self.queue_ack(psn, Syndrome::ACK);
        }
        Ok(())
    }

    fn execute_send(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Result<(), Refuse> {
        let op = pkt.bth.opcode;
        if op.is_start() {
            let wqe = self.take_recv(ctx).ok_or(Refuse::Rnr)?;
            self.inbound = Inbound::Send { wqe, placed: 0 };
        }
        let pd = self.cfg.pd;
        let Inbound::Send { wqe, placed } = &mut self.inbound else {
            return Err(Refuse::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr));
        };
        let room = wqe.sges.total_len().unwrap_or(u32::MAX);
        if u64::from(*placed) + pkt.payload.len() as u64 > u64::from(room) {
            // Receive buffer too small: NAK invalid request; the receiver sees a local
            // length error (IBA 9.9.3.1.2; the status NICs report).
            return Err(Refuse::Nak(NakCode::InvalidRequest, WcStatus::LocLenErr));
        }
        scatter(
            ctx,
            pd,
            wqe.sges.as_slice(),
            u64::from(*placed),
            pkt.payload,
        )
        .map_err(|s| Refuse::Nak(NakCode::RemoteOperationalError, s))?;
        *placed += pkt.payload.len() as u32;
        if op.is_end() {
            // SEND with invalidate: the R_Key is invalidated before the completion (rxe
            // `invalidate_rkey`); one that cannot be is an invalid request (rxe class J).
            if let Some(rkey) = pkt.ieth {
                ctx.mrs
                    .invalidate_rkey(self.cfg.qpn, crate::mr::RKey(rkey))
                    .map_err(|_| Refuse::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr))?;
            }
            let Inbound::Send { wqe, placed } = std::mem::replace(&mut self.inbound, Inbound::Idle)
            else {
                unreachable!()
            };
            let mut wc = Wc::new(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, self.cfg.qpn)
                .with_byte_len(placed);
            if let Some(imm) = pkt.imm_dt {
                wc = wc.with_imm(imm);
            }
            if let Some(rkey) = pkt.ieth {
                wc = wc.with_invalidated_rkey(crate::mr::RKey(rkey));
            }
            wc.solicited = pkt.bth.solicited;
            self.recv_cq.push_back(wc);
            self.msn = self.msn.wrapping_add(1);
            self.counters.rdma_recvs += 1;
        }
        Ok(())
    }

    fn execute_write(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) -> Result<(), Refuse> {
        let op = pkt.bth.opcode;
        let pmtu = self.pmtu() as usize;
        fn access<E>(_: E) -> Refuse {
            Refuse::Nak(NakCode::RemoteAccessError, WcStatus::RemAccessErr)
        }
        // Where this packet goes, from its RETH (FIRST/ONLY) or the message in progress.
        // Nothing is committed until every check passed: an RNR NAK must leave the QP as if
        // the packet never came, so its retransmission is accepted (rxe `check_resource`).
        let (grant, placed, remaining, dma_len) = if op.is_start() {
            let reth = pkt.reth.unwrap_or_default();
            let grant = ctx
                .mrs
                .check_remote_at(
                    self.cfg.pd,
                    self.cfg.qpn,
                    crate::mr::RKey(reth.rkey),
                    reth.va,
                    u64::from(reth.dma_len),
                    AccessFlags::REMOTE_WRITE,
                )
                .map_err(access)?;
            (grant, 0, reth.dma_len, reth.dma_len)
        } else {
            let Inbound::Write {
                grant,
                placed,
                remaining,
                dma_len,
            } = self.inbound
            else {
                return Err(Refuse::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr));
            };
            (grant, placed, remaining, dma_len)
        };
        // rxe check_rkey: while more than a PMTU remains the packet is exactly one PMTU,
        // then exactly the rest.
        let len = pkt.payload.len();
        let ok = if remaining as usize > pmtu {
            len == pmtu && !op.is_end()
        } else {
            len == remaining as usize && op.is_end()
        };
        if !ok {
            return Err(Refuse::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr));
        }
        // WRITE with immediate consumes a receive WQE.
        if op.consumes_recv_wqe() && !self.recv_available(ctx) {
            return Err(Refuse::Rnr);
        }
        if len > 0 {
            let g = grant
                .and_then(|g| g.slice(placed, len as u64))
                .ok_or(Refuse::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr))?;
            // The MR may have been deregistered since the FIRST packet.
            ctx.mrs.revalidate(&g).map_err(access)?;
            ctx.mem
                .write(g.handle(), g.offset(), pkt.payload)
                .map_err(access)?;
        }
        if op.is_end() {
            self.inbound = Inbound::Idle;
            self.msn = self.msn.wrapping_add(1);
            if let Some(imm) = pkt.imm_dt {
                let wqe = self.take_recv(ctx).ok_or(Refuse::Rnr)?;
                let wc = Wc::new(
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    self.cfg.qpn,
                )
                .with_byte_len(dma_len)
                .with_imm(imm);
                let wc = Wc {
                    solicited: pkt.bth.solicited,
                    ..wc
                };
                self.recv_cq.push_back(wc);
                self.counters.rdma_recvs += 1;
            } else {
                self.silent_writes = self.silent_writes.wrapping_add(1);
            }
        } else {
            self.inbound = Inbound::Write {
                grant,
                placed: placed + len as u64,
                remaining: remaining - len as u32,
                dma_len,
            };
        }
        Ok(())
    }

    /// ATOMIC WRITE (rxe `atomic_write_reply`): a responder resource (`max_dest_rd_atomic`
    /// above 0), R_Key with REMOTE_WRITE over the 8 bytes, an 8-byte DMA length, an 8-byte
    /// aligned address (else NAK invalid request, as rxe's misaligned-atomic error), then one
    /// indivisible 8-byte store.
    fn execute_atomic_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        pkt: &PacketRepr<'_>,
    ) -> Result<(), Refuse> {
        let inv = || Refuse::Nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
        // As rxe: it takes a responder resource, like READs and atomics.
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(inv());
        }
        let reth = pkt.reth.unwrap_or_default();
        let data: [u8; 8] = pkt.payload.try_into().map_err(|_| inv())?;
        if reth.dma_len != 8 {
            return Err(inv());
        }
        let grant = ctx
            .mrs
            .check_remote_at(
                self.cfg.pd,
                self.cfg.qpn,
                crate::mr::RKey(reth.rkey),
                reth.va,
                8,
                AccessFlags::REMOTE_WRITE,
            )
            .map_err(|e| Refuse::Nak(e.remote_nak(), WcStatus::RemAccessErr))?;
        if reth.va % 8 != 0 {
            return Err(inv());
        }
        let Some(g) = grant else { return Err(inv()) };
        ctx.mem
            .atomic_store(g.handle(), g.offset(), data)
            .map_err(|e| match e {
                crate::memory::MemoryError::Misaligned { .. } => inv(),
                _ => Refuse::Nak(NakCode::RemoteAccessError, WcStatus::RemAccessErr),
            })?;
        self.silent_writes = self.silent_writes.wrapping_add(1);
        Ok(())
    }

    /// A request with a PSN already executed: never execute it again (IBA 9.7.5.1.4).
    fn duplicate(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>) {
        let psn = pkt.bth.psn;
        match pkt.bth.opcode.kind() {
            // C9-105: re-ACK with the PSN of the last SEND/WRITE executed (rxe `ack_psn`).
            // Not ePSN-1: that may be a READ's PSN, and an ACK past a READ whose responses
            // are still on their way reads as an implied NAK.
            // Each duplicate that starts a message gets its own ACK, as from rxe
            // (`duplicate_request`), not one merged with the previous: a requester may count
            // them (the UDP GSO path probe, `Qp::gso_probe`).
            Kind::Send | Kind::Write | Kind::AtomicWrite
                if matches!(
                    pkt.bth.opcode.position(),
                    Some(Position::First | Position::Only)
                ) =>
            {
                self.resp_out.push_back(RespOut::DupAck {
                    psn: self.ack_psn.sub(1),
                });
            }
            Kind::Send | Kind::Write => self.queue_ack(self.ack_psn.sub(1), Syndrome::ACK),
            Kind::ReadRequest => {
                let Some(reth) = pkt.reth else { return };
                let found = self.resources.iter().find_map(|r| match *r {
                    Resource::Read {
                        first_psn,
                        last_psn,
                        va,
                        rkey,
                        len,
                    } if !psn.before(first_psn) && !psn.after(last_psn) => {
                        Some((last_psn, va, rkey, len))
                    }
                    _ => None,
                });
                // Not found, or not a subset of the original READ: drop (class D).
                let Some((last, va, rkey, len)) = found else {
                    return;
                };
                let end = u128::from(va) + u128::from(len);
                let inside = reth.rkey == rkey
                    && reth.va >= va
                    && u128::from(reth.va) + u128::from(reth.dma_len) <= end;
                if !inside {
                    return;
                }
                if self.paces_reads() {
                    self.read_pace.repeated(ctx.now);
                }
                self.resp_out.push_back(RespOut::Read {
                    first: psn,
                    next: psn,
                    last,
                    va: reth.va,
                    rkey,
                    len: reth.dma_len,
                });
            }
            Kind::CompareSwap | Kind::FetchAdd => {
                // The replay cache: answer with the saved original value, never re-execute.
                let orig = self.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = orig {
                    self.resp_out.push_back(RespOut::Atomic { psn, orig });
                }
            }
            _ => {}
        }
    }

    /// The responder resources hold the last `max_dest_rd_atomic` READs and atomics.
    fn push_resource(&mut self, r: Resource) {
        let cap = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resources.len() >= cap {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    /// Queues an ACK or NAK; a positive ACK replaces a positive ACK still waiting at the tail
    /// (ACKs are cumulative, so only the newest matters).
    pub(super) fn queue_ack(&mut self, psn: Psn, syndrome: Syndrome) {
        if let (
            Syndrome::Ack { .. },
            Some(RespOut::Ack {
                psn: p,
                syndrome: Syndrome::Ack { .. },
            }),
        ) = (syndrome, self.resp_out.back_mut())
        {
            *p = psn;
            return;
        }
        self.resp_out.push_back(RespOut::Ack { psn, syndrome });
    }

    fn recv_available(&self, ctx: &Ctx<'_>) -> bool {
        if self.cfg.uses_srq {
            ctx.srq.as_ref().is_some_and(|s| !s.is_empty())
        } else {
            !self.rq.is_empty()
        }
    }

    fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWr> {
        if self.cfg.uses_srq {
            ctx.srq.as_deref_mut()?.pop()
        } else {
            self.rq.pop_front()
        }
    }

    /// UC drops a partial message; its receive WQE goes back to the head of the queue to be
    /// reused by the next message (rxe class D1).
    fn abandon_inbound(&mut self, ctx: &mut Ctx<'_>) {
        if let Inbound::Send { wqe, .. } = std::mem::replace(&mut self.inbound, Inbound::Idle) {
            // Back where it came from: a QP with an SRQ never reads its own receive queue.
            match ctx.srq.as_deref_mut() {
                Some(srq) if self.cfg.uses_srq => srq.push_front(wqe),
                _ => self.rq.push_front(wqe),
            }
        }
    }

    /// Completes the receive WQE of a message in progress with `status` (class C errors).
    fn fail_inbound(&mut self, status: WcStatus) {
        if let Inbound::Send { wqe, .. } = std::mem::replace(&mut self.inbound, Inbound::Idle) {
            self.recv_cq
                .push_back(Wc::new(wqe.wr_id, status, WcOpcode::Recv, self.cfg.qpn));
        }
    }

    /// The next ACK, NAK, READ response or atomic ACK.
    pub(super) fn next_response(&mut self, ctx: &mut Ctx<'_>, buf: &mut [u8]) -> Option<Transmit> {
        loop {
            let out = *self.resp_out.front()?;
            let mut bth = super::bth(Opcode::RcAcknowledge, self.attr.dest_qp_num, Psn::new(0));
            let aeth = |syndrome| {
                Some(AethRepr {
                    syndrome,
                    msn: self.msn & 0xFF_FFFF,
                })
            };
            let dest = self.connected_dest();
            match out {
                RespOut::Ack { psn, .. } | RespOut::DupAck { psn } => {
                    let syndrome = match out {
                        RespOut::Ack { syndrome, .. } => syndrome,
                        _ => Syndrome::ACK,
                    };
                    bth.psn = psn;
                    let mut r = PacketRepr::new(bth, &[]);
                    r.aeth = aeth(syndrome);
                    self.resp_out.pop_front();
                    let len = r.emit(buf).ok()?;
                    return Some(Transmit { len, dest });
                }
                RespOut::Sack => {
                    bth.opcode = Opcode::SrdmaSack;
                    bth.psn = self.epsn;
                    let mut r = PacketRepr::new(bth, &[]);
                    r.sack = Some(self.reorder.sack(self.epsn));
                    self.resp_out.pop_front();
                    let len = r.emit(buf).ok()?;
                    return Some(Transmit { len, dest });
                }
                RespOut::Cnp => {
                    // As ConnectX sends it: BECN set, PSN 0, 16 reserved zero bytes.
                    bth.opcode = Opcode::Cnp;
                    bth.becn = true;
                    let r = PacketRepr::new(bth, &[]);
                    self.resp_out.pop_front();
                    let len = r.emit(buf).ok()?;
                    self.counters.np_cnp_sent += 1;
                    return Some(Transmit { len, dest });
                }
                RespOut::Atomic { psn, orig } => {
                    bth.opcode = Opcode::RcAtomicAcknowledge;
                    bth.psn = psn;
                    let mut r = PacketRepr::new(bth, &[]);
                    r.aeth = aeth(Syndrome::ACK);
                    r.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                    self.resp_out.pop_front();
                    let len = r.emit(buf).ok()?;
                    return Some(Transmit { len, dest });
                }
                RespOut::Read {
                    first,
                    next,
                    last,
                    va,
                    rkey,
                    len,
                } => {
                    // Responses go in PSN order: a paced READ holds back what follows it.
                    if self.read_pace_until.is_some() {
                        return None;
                    }
                    if self.paces_reads()
                        && let Some(t) = self.read_pace.delay(ctx.now)
                    {
                        self.read_pace_until = Some(t);
                        return None;
                    }
                    let pmtu = self.pmtu();
                    let n = last.diff(first) as u32 + 1;
                    let k = next.diff(first) as u32;
                    let offset = u64::from(k) * u64::from(pmtu);
                    let plen = u64::from(len).saturating_sub(offset).min(u64::from(pmtu)) as usize;
                    let position = super::position(n, k);
                    bth.opcode =
                        Opcode::for_message(Transport::Rc, Kind::ReadResponse, position, false)
                            .expect("RC READ responses exist at every position");
                    bth.psn = next;
                    let mut r = PacketRepr::new(bth, &[]);
                    if position != Position::Middle {
                        r.aeth = aeth(Syndrome::ACK);
                    }
                    let Ok(plen_total) = r.emit_headers(buf, plen) else {
                        return None;
                    };
                    if plen > 0 {
                        // Re-checked for every packet: the MR may be gone (rxe `rxe_recheck_mr`).
                        let src = va.wrapping_add(offset);
                        let read = ctx
                            .mrs
                            .check_remote_at(
                                self.cfg.pd,
                                self.cfg.qpn,
                                crate::mr::RKey(rkey),
                                src,
                                plen as u64,
                                AccessFlags::REMOTE_READ,
                            )
                            .ok()
                            .flatten()
                            .and_then(|g| {
                                let hl = r.bth.opcode.header_len();
                                ctx.mem
                                    .read_for_transmit(
                                        g.handle(),
                                        g.offset(),
                                        &mut buf[hl..hl + plen],
                                    )
                                    .ok()
                            });
                        if read.is_none() {
                            self.resp_out.pop_front();
                            self.queue_ack(next, Syndrome::Nak(NakCode::RemoteAccessError));
                            self.enter_error(true);
                            continue;
                        }
                    }
                    if self.paces_reads() {
                        self.read_pace.sent(ctx.now, plen_total as u32);
                    }
                    if k + 1 >= n {
                        self.resp_out.pop_front();
                    } else if let Some(RespOut::Read { next, .. }) = self.resp_out.front_mut() {
                        *next = next.add(1);
                    }
                    return Some(Transmit {
                        len: plen_total,
                        dest,
                    });
                }
            }
        }
    }
}

/// What a UD receive on RoCE reports in `sl`: the packet's network header type, as mlx5 does
/// (its CQE's L3 header type: 1 = IPv6, 2 = IPv4; 0 would be a RoCEv1 GRH). rxe leaves `sl`
/// 0, but UCX's UD transport reads `sl` this way on an Ethernet port to find the destination
/// address in the GRH area (`uct_ud_iface_check_grh`), and drops every packet when it says 0
/// for IPv4. RoCE has no service level to report otherwise.
fn roce_pkt_type(ip: &IpRepr) -> u8 {
    match ip {
        IpRepr::V4(_) => 2,
        IpRepr::V6(_) => 1,
    }
}

/// The 40 bytes rxe writes at the head of a UD receive buffer: the IPv6 header, or for IPv4
/// 20 zero bytes then the IPv4 header (`union rdma_network_hdr`).
fn grh_bytes(ip: &IpRepr, roce_len: usize) -> [u8; GRH_LEN] {
    let mut grh = [0u8; GRH_LEN];
    let payload = srdma_wire::ip::UDP_LEN + roce_len;
    let _ = match ip {
        IpRepr::V4(_) => ip.emit(&mut grh[20..], payload),
        IpRepr::V6(_) => ip.emit(&mut grh, payload),
    };
    grh
}
