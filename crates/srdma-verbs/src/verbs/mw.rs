//! Memory windows: the `ibv_context_ops` entries behind the inline `ibv_alloc_mw`,
//! `ibv_bind_mw` and `ibv_dealloc_mw` of verbs.h, the `IBV_WR_BIND_MW` member of
//! `ibv_send_wr`, and `ibv_wr_bind_mw` / `ibv_wr_local_inv` / `ibv_wr_send_inv`.
//!
//! As rdma-core's rxe provider: `ibv_bind_mw` (type 1) posts a bind work request under
//! R_Key `ibv_inc_rkey(mw->rkey)` and stores that key in `mw->rkey` at once (the application
//! undoes it if the bind completes in error); type 2 windows are bound by the application's
//! own `IBV_WR_BIND_MW`, and `mw->rkey` keeps the allocation's key.

use srdma::MwType;
use srdma_proto::MwBind;

use super::*;

/// An `ibv_mw`.
#[repr(C)]
pub(super) struct Mw {
    c: ibv_mw,
    _mw: srdma::Mw,
}

/// `ops.alloc_mw`: a type 1 or type 2 window; EINVAL for another type, as rxe.
pub(super) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    guard(std::ptr::null_mut(), || {
        // SAFETY: liveness checked by `back`.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let Some(ty) = MwType::from_u32(mw_type) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match p.pd.alloc_mw(ty) {
            Ok(mw) => {
                let rkey = mw.alloc_rkey().0;
                pd_users(pd, 1);
                hand_out(Mw {
                    c: ibv_mw {
                        context: p.c.context,
                        pd,
                        rkey,
                        handle: rkey >> 8,
                        type_: mw_type,
                    },
                    _mw: mw,
                })
            }
            Err(e) => {
                set_errno(errno_of(&e));
                std::ptr::null_mut()
            }
        }
    })
}

/// `ops.dealloc_mw`: 0, or EINVAL for a window that is not live. Its R_Key stops working.
pub(super) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: live objects came from hand_out::<Mw>.
        let Some(m) = (unsafe { take_back::<Mw, _>(mw) }) else {
            return libc::EINVAL;
        };
        pd_users(m.c.pd, -1);
        0
    })
}

/// The L_Key of the region `mr` (0 for NULL: a bind of length 0 names none), or EINVAL.
fn mr_lkey(mr: *mut ibv_mr) -> Result<u32, c_int> {
    if mr.is_null() {
        return Ok(0);
    }
    // SAFETY: liveness checked by `back`.
    unsafe { back::<Mr, _>(mr) }
        .map(|m| m.c.lkey)
        .ok_or(libc::EINVAL)
}

/// The bind of `info` for window `mw` (its C struct's current R_Key) under `rkey`.
fn bind_of(mw: &ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<SendOp, c_int> {
    Ok(SendOp::BindMw(MwBind {
        mw_rkey: RKey(mw.rkey),
        rkey: RKey(rkey),
        mr_lkey: srdma::LKey(mr_lkey(info.mr)?),
        addr: info.addr,
        len: info.length,
        // Unknown or unsupported rights fail the bind itself (MW_BIND_ERR), as on rxe.
        access: AccessFlags::from_bits_retain(info.mw_access_flags),
    }))
}

/// `ops.bind_mw` (behind the inline `ibv_bind_mw`, which checked the type and the PD):
/// posts the bind and gives the window its next R_Key.
pub(super) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: liveness checked by `back`.
        let (Some(q), Some(m)) = (unsafe { back::<Qp, _>(qp) }, unsafe { back::<Mw, _>(mw) })
        else {
            return libc::EINVAL;
        };
        if mw_bind.is_null() || m.c.type_ != MwType::Type1 as u32 {
            return libc::EINVAL;
        }
        // SAFETY: readable per ibv_bind_mw's contract (checked non-null).
        let b = unsafe { &*mw_bind };
        if b.bind_info.mw_access_flags & AccessFlags::ZERO_BASED.bits() != 0 {
            return libc::EINVAL;
        }
        let rkey = srdma::inc_rkey(RKey(m.c.rkey)).0;
        let op = match bind_of(&m.c, rkey, &b.bind_info) {
            Ok(op) => op,
            Err(e) => return e,
        };
        let Some(flags) = SendFlags::from_bits(b.send_flags & 0x1f) else {
            return libc::EINVAL;
        };
        let mut wr = SendWr::new(b.wr_id, op, SgeList::new()).with_flags(flags);
        if q.sq_sig_all {
            wr.flags |= SendFlags::SIGNALED;
        }
        match q.qp.post_send(wr) {
            Ok(()) => {
                // SAFETY: a live window of ours; the application reads `rkey` only.
                unsafe { (*mw).rkey = rkey };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

/// The operation of an `IBV_WR_BIND_MW` send WR.
pub(super) fn post_bind_op(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: `bind_mw` is the union member IBV_WR_BIND_MW selects; plain data of the size
    // of the space it occupies (checked at compile time in abi_core).
    let b: ibv_send_wr_bind_mw =
        unsafe { std::ptr::read_unaligned(w.bind_mw_or_tso.as_ptr().cast()) };
    // SAFETY: liveness checked by `back`.
    let m = unsafe { back::<Mw, _>(b.mw) }.ok_or(libc::EINVAL)?;
    bind_of(&m.c, b.rkey, &b.bind_info)
}

/// `ibv_wr_bind_mw`.
pub(super) unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: liveness checked by `back`; `info` readable per the ibv_wr_bind_mw contract.
    let m = unsafe { back::<Mw, _>(mw) };
    let op = match (m, unsafe { info.as_ref() }) {
        (Some(m), Some(i)) => bind_of(&m.c, rkey, i).ok(),
        _ => None,
    };
    // A bind of nothing real still takes its place in the batch, and fails as a bind.
    wr_push(
        qpx,
        op.unwrap_or(SendOp::BindMw(MwBind {
            mw_rkey: RKey(0),
            rkey: RKey(rkey),
            mr_lkey: srdma::LKey(0),
            addr: 0,
            len: 0,
            access: AccessFlags::empty(),
        })),
    );
}

/// `ibv_wr_local_inv`.
pub(super) unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    wr_push(
        qpx,
        SendOp::LocalInv {
            rkey: RKey(invalidate_rkey),
        },
    );
}

/// `ibv_wr_send_inv`.
pub(super) unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, invalidate_rkey: u32) {
    wr_push(
        qpx,
        SendOp::SendWithInv {
            rkey: RKey(invalidate_rkey),
        },
    );
}
