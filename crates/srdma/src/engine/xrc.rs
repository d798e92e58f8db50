//! XRC in the engine: the device's XRC domains' SRQs and target QPs, which SRQ a request to
//! a target receives with and where its completions go (the verbs side, domains and XRC QPs,
//! is `qp::xrc`).

use std::collections::BTreeMap;

use srdma_proto::{PdId, Qp as ProtoQp, XrcRole};

use crate::cq::Cq;

/// The device's XRC bookkeeping (in the engine's state).
#[derive(Debug, Default)]
pub(crate) struct XrcState {
    /// XRC SRQs by number: domain, PD and CQ.
    srqs: BTreeMap<u32, XrcSrq>,
    /// Target QPs by QPN: their domain.
    targets: BTreeMap<u32, u32>,
}

#[derive(Debug)]
struct XrcSrq {
    xrcd: u32,
    pd: PdId,
    cq: Cq,
}

impl XrcState {
    /// Makes QP `qpn` a target of XRC domain `xrcd`.
    pub(crate) fn add_target(&mut self, qpn: u32, xrcd: u32) {
        self.targets.insert(qpn, xrcd);
    }

    /// Makes SRQ `id` an XRC SRQ of domain `xrcd`, receiving with PD `pd`'s keys and
    /// completing to `cq`.
    pub(crate) fn add_srq(&mut self, id: u32, xrcd: u32, pd: PdId, cq: Cq) {
        self.srqs.insert(id, XrcSrq { xrcd, pd, cq });
    }

    /// Forgets SRQ `id` (destroyed).
    pub(super) fn srq_gone(&mut self, id: u32) {
        self.srqs.remove(&id);
    }

    /// Forgets QP `qpn` (destroyed).
    pub(super) fn qp_gone(&mut self, qpn: u32) {
        self.targets.remove(&qpn);
    }

    /// For a request to target QP `qpn` naming SRQ `srqn`: the SRQ to receive with (its
    /// PD set on the QP) and the CQ its completions go to, when it is an XRC SRQ of the
    /// target's domain. `None` for a QP that is no XRC target — and for a target, when the
    /// XRCETH names no SRQ of its domain (the QP then refuses the request).
    pub(super) fn route(
        &self,
        qpn: u32,
        qp: &mut ProtoQp,
        srqn: Option<u32>,
    ) -> Option<Option<(u32, Cq)>> {
        let xrcd = *self.targets.get(&qpn)?;
        let found = srqn
            .and_then(|n| self.srqs.get(&n).map(|s| (n, s)))
            .filter(|(_, s)| s.xrcd == xrcd);
        Some(found.map(|(n, s)| {
            qp.set_xrc_pd(s.pd);
            (n, s.cq.clone())
        }))
    }
}

/// Moves the receive completions `qp` just made to `cq`, the CQ of the XRC SRQ they came
/// from; a full CQ puts the QP in ERR (as rxe for any CQ overrun).
pub(super) fn complete_to(qp: &mut ProtoQp, cq: &Cq) {
    while let Some(wc) = qp.poll_recv_completion() {
        let solicited = wc.solicited;
        if !cq.push(wc, solicited) {
            qp.set_error();
        }
    }
}

/// An XRC target's receive completions made outside a packet's delivery (a receive WQE in
/// progress flushed when the QP goes to ERR) cannot be told which XRC SRQ they came from:
/// they are dropped rather than left to fill the domain's internal CQ.
pub(super) fn drop_orphans(qp: &mut ProtoQp) {
    if qp.xrc() == Some(XrcRole::Target) {
        while qp.poll_recv_completion().is_some() {}
    }
}
