//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, `ibv_dealloc_mw`): remote access to part
//! of a region under a key of its own, revocable without deregistering the region.
//!
//! A window is allocated in a [`Pd`] ([`Pd::alloc_mw`]) and bound to a region registered
//! with [`AccessFlags::MW_BIND`]:
//!
//! - a type 1 window with [`Qp::bind_mw`], which posts the bind on a QP and returns the
//!   window's new R_Key (binding again with length 0 unbinds it);
//! - a type 2 window with a [`SendOp::BindMw`] work request of your own, which ties it to
//!   that QP; [`SendOp::LocalInv`] on that QP, or a peer's [`SendOp::SendWithInv`] arriving
//!   at it, invalidates it.
//!
//! Binds and invalidations complete on the send CQ ([`crate::WcOpcode::BindMw`],
//! [`crate::WcOpcode::LocalInv`]) after every work request posted before them. Peers use the
//! window's R_Key in RDMA READ, WRITE and atomics; an access outside the window, beyond its
//! rights, after it was invalidated or deallocated, or (type 2) at another QP is NAKed and
//! completes with [`crate::WcStatus::RemAccessErr`] at the peer.

use srdma_proto::{AccessFlags, MwBind, MwInfo, MwType, RKey, SendFlags, SendOp, SendWr, SgeList};

use crate::device::{Mr, Pd};
use crate::error::{Error, Result};
use crate::qp::Qp;

/// A memory window (`ibv_mw`). Dropping it deallocates it: its R_Key stops working at once.
#[derive(Debug)]
pub struct Mw {
    pd: Pd,
    /// The R_Key it was allocated with (its index stays; binds change the key byte).
    alloc_rkey: RKey,
    ty: MwType,
}

impl Pd {
    /// `ibv_alloc_mw`: a window of type `ty` in this PD (type 1 starts valid and unbound,
    /// type 2 free).
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw> {
        self.dev.check_alive()?;
        let rkey = self.dev.lock().alloc_mw(self.id, ty)?;
        Ok(Mw {
            pd: self.clone(),
            alloc_rkey: rkey,
            ty,
        })
    }
}

impl Mw {
    /// Type 1 or 2.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// The R_Key the window was allocated with (`ibv_mw.rkey` after `ibv_alloc_mw`).
    pub fn alloc_rkey(&self) -> RKey {
        self.alloc_rkey
    }

    /// The window's current R_Key: the allocation's, or the one its last bind gave it.
    pub fn rkey(&self) -> RKey {
        self.info().map_or(self.alloc_rkey, |i| i.rkey)
    }

    /// Its state, binding, rights and (type 2) QP.
    pub fn info(&self) -> Option<MwInfo> {
        self.pd.dev.lock().query_mw(self.alloc_rkey)
    }

    /// The PD it was allocated in.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.pd.dev.lock().dealloc_mw(self.alloc_rkey);
    }
}

impl Mr {
    /// How many memory windows are bound to the region. `ibv_dereg_mr` refuses (EINVAL, as
    /// rxe) while there are any; dropping the [`Mr`] unbinds them.
    pub fn bound_windows(&self) -> usize {
        self.pd_ref().dev.lock().windows_bound(self.lkey())
    }
}

/// What [`Qp::bind_mw`] binds (`struct ibv_mw_bind_info`).
#[derive(Debug, Clone, Copy)]
pub struct MwBindInfo<'a> {
    /// The region (`None`, with `addr` and `len` 0, unbinds).
    pub mr: Option<&'a Mr>,
    /// First byte of the window, as the region is addressed ([`Mr::addr`] based).
    pub addr: u64,
    /// Length in bytes; 0 unbinds.
    pub len: u64,
    /// The window's rights (remote ones, [`AccessFlags::LOCAL_WRITE`] allowed and inert).
    pub access: AccessFlags,
}

impl Qp {
    /// `ibv_bind_mw` for a type 1 window: posts a bind of `info` under R_Key
    /// [`inc_rkey`] of the window's current one, and returns that new R_Key. The bind
    /// completes on the send CQ with `wr_id` (when `flags` has [`SendFlags::SIGNALED`] or
    /// the QP signals every WR); a failed bind completes with
    /// [`crate::WcStatus::MwBindErr`].
    pub fn bind_mw(
        &self,
        mw: &Mw,
        info: &MwBindInfo<'_>,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<RKey> {
        let &MwBindInfo {
            mr,
            addr,
            len,
            access,
        } = info;
        if mw.ty != MwType::Type1 {
            return Err(Error::InvalidArgument(
                "ibv_bind_mw binds type 1 windows; type 2 ones take a bind work request".into(),
            ));
        }
        if mr.is_none() && (addr != 0 || len != 0) {
            return Err(Error::InvalidArgument(
                "a bind without a region must have address and length 0".into(),
            ));
        }
        if access.contains(AccessFlags::ZERO_BASED) {
            return Err(Error::InvalidArgument(
                "zero-based windows are not supported".into(),
            ));
        }
        let current = mw.rkey();
        let rkey = inc_rkey(current);
        let op = SendOp::BindMw(MwBind {
            mw_rkey: current,
            rkey,
            mr_lkey: mr.map_or(srdma_proto::LKey(0), Mr::lkey),
            addr,
            len,
            access,
        });
        self.post_send(SendWr::new(wr_id, op, SgeList::new()).with_flags(flags))?;
        Ok(rkey)
    }
}

/// `ibv_inc_rkey`: the same R_Key with its key byte (low 8 bits) incremented.
pub fn inc_rkey(rkey: RKey) -> RKey {
    RKey((rkey.0 & !0xFF) | (rkey.0.wrapping_add(1) & 0xFF))
}
