//! XRC on the engine: XRC domains, XRC SRQs (numbered, tied to a domain and a CQ) and the
//! XRC initiator and target QPs.
//!
//! A request reaching a target QP names an SRQ in its XRCETH; the engine hands the QP that
//! SRQ when it belongs to the target's domain (the receive WQE, the L_Keys and the R_Keys
//! are then the SRQ's, of its PD) and moves the receive completion to the SRQ's CQ (see
//! `engine::xrc`).

use std::sync::Arc;

use srdma_proto::{AccessFlags, QpType, XrcRole};

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
        st.xrc_mut().add_target(qpn, x.id);
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
        self.dev
            .lock()
            .xrc_mut()
            .add_srq(id, xrcd.inner.id, self.id, cq.clone());
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
