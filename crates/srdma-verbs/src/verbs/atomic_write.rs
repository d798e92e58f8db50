//! `ibv_wr_atomic_write` (`IBV_QP_EX_WITH_ATOMIC_WRITE`): the IBTA 1.5 RDMA ATOMIC WRITE of
//! the `ibv_wr_*` API, which kernel rxe before 6.2 does not have.

use std::ffi::c_void;

use srdma_proto::{RKey, SendOp};

use std::sync::atomic::Ordering;

use super::{with_qpx, wr_push};
use crate::abi_core::ibv_qp_ex;

/// `IBV_QP_EX_WITH_ATOMIC_WRITE`.
pub(crate) const IBV_QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

/// `qp_ex->wr_atomic_write`: stores the 8 bytes at `atomic_wr` (read now, as the verbs
/// contract says) at `remote_addr` of `rkey`, in one indivisible access. A NULL `atomic_wr`
/// makes `ibv_wr_complete` fail with EINVAL.
pub(super) unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    let mut data = [0u8; 8];
    if !atomic_wr.is_null() {
        // SAFETY: the application's 8 bytes at `atomic_wr` (`ibv_wr_atomic_write`'s contract);
        // read unaligned, as any byte pointer may be.
        data = unsafe { atomic_wr.cast::<[u8; 8]>().read_unaligned() };
    }
    wr_push(
        qpx,
        SendOp::AtomicWrite {
            remote_addr,
            rkey: RKey(rkey),
            data,
        },
    );
    if atomic_wr.is_null() {
        with_qpx(qpx, |q, _| q.batch_refused.store(true, Ordering::Relaxed));
    }
}
