//! XRC (IBTA vol. 1 annex A14): an RC connection whose requests name, in an XRCETH, the XRC
//! SRQ at the target that receives them.
//!
//! An XRC QP is an RC QP with a role. The initiator (`IBV_QPT_XRC_SEND`) sends RC requests
//! with the XRC opcode twins (RC + 0xA0) and the XRCETH its work request names; it has no
//! receive side. The target (`IBV_QPT_XRC_RECV`) has no send queue: it executes requests
//! with the receive WQEs and the protection domain of the SRQ the XRCETH names (the engine
//! finds it, within the target's XRC domain, and hands it in [`Ctx::srq`] with
//! [`Qp::set_xrc_pd`]) and answers with the XRC twins of RC's responses. Inside, both run
//! the RC state machines on the RC opcode of each packet.

use srdma_wire::{NakCode, Opcode, PacketRepr, Syndrome, Transport};

use super::{Ctx, Qp};
use crate::limits::DeviceLimits;
use crate::mr::PdId;
use crate::qp::{AttrMask, ModifyError, QpAttr, QpState, QpType, transition_rule};
use crate::wc::WcStatus;

/// The side of an XRC connection a QP is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XrcRole {
    /// `IBV_QPT_XRC_SEND`: sends requests, each naming a remote XRC SRQ.
    Initiator,
    /// `IBV_QPT_XRC_RECV`: receives into the XRC SRQs of its XRC domain.
    Target,
}

impl Qp {
    /// Makes this RC QP an XRC QP of `role` (right after creation, before any traffic).
    pub fn set_xrc(&mut self, role: XrcRole) {
        self.xrc = Some(role);
        // The target's receives always come from an SRQ (the one each request names).
        if role == XrcRole::Target {
            self.cfg.uses_srq = true;
        }
    }

    /// The XRC role, `None` for a plain RC, UC or UD QP.
    pub fn xrc(&self) -> Option<XrcRole> {
        self.xrc
    }

    /// XRC target: the protection domain of the SRQ the next packet names, against which
    /// its R_Keys and the SRQ's L_Keys are checked.
    pub fn set_xrc_pd(&mut self, pd: PdId) {
        self.cfg.pd = pd;
    }

    /// Whether `op` belongs to this QP's transport (rxe `check_type_state`): XRC opcodes
    /// for XRC QPs — requests at the target, responses at the initiator — and `None` when
    /// this is not an XRC QP (the caller's RC/UC/UD rule applies).
    pub(super) fn xrc_accepts(&self, op: Opcode) -> Option<bool> {
        let role = self.xrc?;
        Some(
            op.transport() == Transport::Xrc
                && match role {
                    XrcRole::Initiator => op.is_response(),
                    XrcRole::Target => op.is_request(),
                },
        )
    }

    /// The packet as the RC machinery sees it: the XRC opcode replaced by its RC twin (the
    /// XRCETH stays for the target's checks).
    pub(super) fn xrc_as_rc<'a>(pkt: &PacketRepr<'a>) -> PacketRepr<'a> {
        let mut rc = *pkt;
        if let Some(twin) = pkt.bth.opcode.rc_xrc_twin() {
            rc.bth.opcode = twin;
        }
        rc
    }

    /// XRC target: a request naming no XRC SRQ of the target's domain (the engine found
    /// none) is answered with NAK invalid request, class C (the QP goes to ERR). `true`
    /// when the packet was refused so.
    pub(super) fn xrc_refuse_without_srq(&mut self, ctx: &Ctx<'_>, pkt: &PacketRepr<'_>) -> bool {
        if self.xrc != Some(XrcRole::Target) || ctx.srq.is_some() {
            return false;
        }
        // Only an in-sequence request: duplicates and gaps get the usual answers.
        if pkt.bth.psn != self.epsn {
            return false;
        }
        self.counters.dropped_pkts += 1;
        self.queue_ack(pkt.bth.psn, Syndrome::Nak(NakCode::InvalidRequest));
        self.enter_error(true);
        true
    }

    /// XRC initiator: turns the RC request just built in `repr` into its XRC twin with the
    /// XRCETH of the work request. `Err` for an operation XRC has no opcode for (ATOMIC
    /// WRITE, FLUSH) or a work request that names no SRQ.
    pub(super) fn xrc_request(
        &self,
        repr: &mut PacketRepr<'_>,
        srqn: Option<u32>,
    ) -> Result<(), WcStatus> {
        if self.xrc != Some(XrcRole::Initiator) {
            return Ok(());
        }
        let twin = repr.bth.opcode.rc_xrc_twin().ok_or(WcStatus::LocQpOpErr)?;
        repr.bth.opcode = twin;
        repr.xrceth = Some(srqn.ok_or(WcStatus::LocQpOpErr)? & 0xFF_FFFF);
        Ok(())
    }

    /// XRC target: the response just written at the head of `buf` goes with the XRC twin
    /// of its RC opcode (same layout: responses carry no XRCETH).
    pub(super) fn xrc_response(&self, buf: &mut [u8]) {
        if self.xrc != Some(XrcRole::Target) {
            return;
        }
        if let Some(twin) = Opcode::from_u8(buf[0]).and_then(Opcode::rc_xrc_twin) {
            buf[0] = twin.value();
        }
    }
}

/// `ibv_modify_qp` on an XRC QP: the RC rules of Linux `qp_state_table`, except that an
/// initiator's INIT→RTR does not require MAX_DEST_RD_ATOMIC and MIN_RNR_TIMER (it has no
/// responder) and a target's RTR→RTS requires only TIMEOUT and SQ_PSN (it has no
/// requester); the RC attributes it does not require stay accepted.
pub(super) fn validate_modify(
    role: XrcRole,
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &DeviceLimits,
) -> Result<QpState, ModifyError> {
    let next = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    let Some(rc) = transition_rule(QpType::Rc, cur, next) else {
        return crate::qp::validate_modify(QpType::Rc, cur, attr, mask, limits);
    };
    let required = match (role, cur, next) {
        (XrcRole::Initiator, QpState::Init, QpState::Rtr) => {
            rc.required - AttrMask::MAX_DEST_RD_ATOMIC - AttrMask::MIN_RNR_TIMER
        }
        (XrcRole::Target, QpState::Rtr, QpState::Rts) => AttrMask::TIMEOUT | AttrMask::SQ_PSN,
        _ => rc.required,
    };
    let missing = required - mask;
    if let Some(name) = missing.first_name() {
        return Err(ModifyError::MissingAttribute {
            qp_type: QpType::Rc,
            from: cur,
            to: next,
            attr: name,
            missing,
        });
    }
    // The RC check then sees the RC attributes XRC does not require as given (their values,
    // the application's or zero, are checked; only those in `mask` are applied).
    crate::qp::validate_modify(QpType::Rc, cur, attr, mask | (rc.required - mask), limits)
}
