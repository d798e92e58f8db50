//! XRC on the engine: XRC domains, XRC SRQs (numbered, tied to a domain and a CQ) and the
//! XRC initiator and target QPs.
//!
//! A request reaching a target QP names an SRQ in its XRCETH; the engine hands the QP that
//! SRQ when it belongs to the target's domain (the receive WQE, the L_Keys and the R_Keys
//! are then the SRQ's, of its PD) and moves the receive completion to the SRQ's CQ.

use std::collections::BTreeMap;
use std::sync::Arc;

use srdma_proto::{AccessFlags, PdId, Qp as ProtoQp, QpType, XrcRole};

use super::{Pd, Qp, QpInit, Srq};
use crate::cq::Cq;
use crate::device::Device;
use crate::error::{Error, Result};

/// An XRC domain (`ibv_xrcd`). Cheap to clone; the domain lives while a handle, an XRC SRQ
/// or a target QP of it does.
#[derive(Debug, Clone)]
pub struct Xrcd {
    inner: Arc<XrcdInner>,
}

#[derive(Debug)]
struct XrcdInner {
    dev: Device,
    id: u32,
    /// The PD and CQ the target QPs are created with (`IBV_QPT_XRC_RECV` has neither: its
    /// receives use the SRQ's).
    pd: Pd,
    cq: Cq,
}

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
    /// Forgets SRQ `id` (destroyed).
    pub(crate) fn srq_gone(&mut self, id: u32) {
        self.srqs.remove(&id);
    }

    /// Forgets QP `qpn` (destroyed).
    pub(crate) fn qp_gone(&mut self, qpn: u32) {
        self.targets.remove(&qpn);
    }

    /// For a request to target QP `qpn` naming SRQ `srqn`: the SRQ to receive with (its
    /// PD set on the QP) and the CQ its completions go to, when it is an XRC SRQ of the
    /// target's domain. `None` for a QP that is no XRC target — and for a target, when the
    /// XRCETH names no SRQ of its domain (the QP then refuses the request).
    pub(crate) fn route(
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
pub(crate) fn complete_to(qp: &mut ProtoQp, cq: &Cq) {
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
pub(crate) fn drop_orphans(qp: &mut ProtoQp) {
    if qp.xrc() == Some(XrcRole::Target) {
        while qp.poll_recv_completion().is_some() {}
    }
}

impl Device {
    /// `ibv_open_xrcd`: a new XRC domain.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        self.check_alive()?;
        let id = self.next_id();
        Ok(Xrcd {
            inner: Arc::new(XrcdInner {
                dev: self.clone(),
                id,
                pd: self.alloc_pd(),
                cq: self.create_cq(1, None)?,
            }),
        })
    }
}

impl Xrcd {
    /// The domain's number.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// How many handles share this domain: this one, its clones, one per XRC SRQ and one
    /// per target QP. More than one means it is in use.
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: a target QP in RESET, receiving into the
    /// domain's XRC SRQs, allowing `access` once in INIT (the application's modify sets it).
    pub fn create_target_qp(&self, access: AccessFlags) -> Result<Qp> {
        let x = &self.inner;
        let mut init = QpInit::new(QpType::Rc, &x.cq, &x.cq);
        init.access = access;
        init.caps.max_send_wr = 0;
        init.caps.max_send_sge = 0;
        init.caps.max_recv_wr = 0;
        init.caps.max_recv_sge = 0;
        init.caps.max_inline_data = 0;
        let mut qp = x.pd.create_qp_in(&init, false)?;
        let qpn = qp.qpn().value();
        let mut st = x.dev.lock();
        if let Some(slot) = st.slot_mut(qpn) {
            slot.qp.set_xrc(XrcRole::Target);
        }
        st.xrc_mut().targets.insert(qpn, x.id);
        drop(st);
        // The QP holds the domain as it holds its PD.
        if let Some(inner) = Arc::get_mut(&mut qp.inner) {
            inner._xrcd = Some(self.clone());
        }
        Ok(qp)
    }
}

impl Pd {
    /// `ibv_create_qp` with `IBV_QPT_XRC_SEND`: an initiator QP in RESET; every send names
    /// an XRC SRQ of the target ([`srdma_proto::SendWr::xrc_srqn`]). It has no receive side.
    pub fn create_xrc_send_qp(&self, init: &QpInit) -> Result<Qp> {
        let mut init = init.clone();
        init.qp_type = QpType::Rc;
        init.srq = None;
        init.caps.max_recv_wr = 0;
        init.caps.max_recv_sge = 0;
        let qp = self.create_qp_in(&init, false)?;
        let mut st = self.dev.lock();
        if let Some(slot) = st.slot_mut(qp.qpn().value()) {
            slot.qp.set_xrc(XrcRole::Initiator);
        }
        drop(st);
        Ok(qp)
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an SRQ of domain `xrcd` whose completions
    /// go to `cq`; its number ([`Srq::number`]) is what initiators put in their XRCETH.
    pub fn create_xrc_srq(&self, xrcd: &Xrcd, cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Srq> {
        if !xrcd.inner.dev.same(&self.dev) {
            return Err(Error::WrongDevice);
        }
        let mut srq = self.create_srq(max_wr, max_sge)?;
        let id = srq.number();
        self.dev.lock().xrc_mut().srqs.insert(
            id,
            XrcSrq {
                xrcd: xrcd.inner.id,
                pd: self.id,
                cq: cq.clone(),
            },
        );
        if let Some(inner) = Arc::get_mut(&mut srq.inner) {
            inner._xrcd = Some(xrcd.clone());
        }
        Ok(srq)
    }
}

impl Srq {
    /// The SRQ's number (`ibv_get_srq_num`): unique on the device.
    pub fn number(&self) -> u32 {
        self.inner.id
    }
}

impl Qp {
    /// The XRC role, `None` for RC, UC and UD QPs.
    pub fn xrc_role(&self) -> Option<XrcRole> {
        self.with(|s| s.qp.xrc())
    }
}
