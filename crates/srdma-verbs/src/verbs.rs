//! The verbs objects and the data path: PD, MR, completion channel, CQ, QP, SRQ, AH; the
//! `ibv_context_ops` entries the inline `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` of `verbs.h` call. One file per object kind: `pd` (PDs and MRs), `mw`
//! (memory windows), `cq` (channels and CQs), `srq`, `xrc` (XRC domains and SRQs), `ah`,
//! `qp` (QPs and the data path), `atomic_write`; this file holds what they share, and
//! `ibv_open_device`, which gives a new context the entries these serve.
//!
//! Each object is a `#[repr(C)]` box whose first field is the C struct handed out, so a C
//! pointer converts back to its box; the rest is the safe srdma object that does the work.
//! Errors follow rdma-core with rxe: functions returning `int` return the errno, those
//! returning a pointer return NULL and set `errno`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use srdma::{AccessFlags, AhAttr, AttrMask, QpAttr, QpCaps, QpInit, QpState, QpType};
use srdma_proto::{RKey, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, UdDest, Wc};
use srdma_wire::{Psn, Qpn};

use crate::abi_core::*;
use crate::context::{Context, is_nonblocking};
use crate::{errno_of, guard, set_errno};

mod ah;
mod atomic_write;
mod cq;
mod mw;
mod pd;
mod qp;
mod srq;
pub(crate) mod xrc;

pub(crate) use ah::*;
pub(crate) use cq::*;
pub(crate) use pd::*;
pub(crate) use qp::*;
pub(crate) use srq::*;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Converts a C object pointer back to its box (None for NULL).
///
/// # Safety
/// `p` is NULL or points at the first field of a live `T` created by this library.
unsafe fn back<'a, T, C>(p: *mut C) -> Option<&'a T> {
    // SAFETY: per the contract; T is repr(C) with the C struct first.
    crate::is_live(p).then(|| unsafe { &*p.cast::<T>() })
}

/// As [`back`], without the liveness check: for the data path, which rdma-core does not
/// check either (a stale pointer there is the application's bug, as with any provider).
///
/// # Safety
/// `p` is NULL or points at the first field of a live `T` created by this library.
unsafe fn back_fast<'a, T, C>(p: *mut C) -> Option<&'a T> {
    // SAFETY: per the contract; T is repr(C) with the C struct first.
    (!p.is_null()).then(|| unsafe { &*p.cast::<T>() })
}

/// Hands out a new object: boxed, registered as live.
fn hand_out<T, C>(v: T) -> *mut C {
    let p = Box::into_raw(Box::new(v));
    crate::register(p);
    p.cast()
}

/// Takes an object back for destruction: None (EINVAL for the caller) if `p` is not a live
/// object of ours.
///
/// # Safety
/// If `p` is live, it was handed out by [`hand_out`] as a `T`.
unsafe fn take_back<T, C>(p: *mut C) -> Option<Box<T>> {
    if p.is_null() || !crate::unregister(p) {
        return None;
    }
    // SAFETY: live objects came from hand_out::<T>; unregistered now, so freed once.
    Some(unsafe { Box::from_raw(p.cast::<T>()) })
}

/// `ibv_open_device`: a context on the device (NULL with errno on failure).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || Context::open(device, fill_context))
}

/// Fills the entries of a new context's `verbs_context` that this module serves: the
/// extended constructors, XRC, and the data path of `ibv_context_ops`.
fn fill_context(vctx: &mut verbs_context) {
    vctx.create_cq_ex = Some(vctx_create_cq_ex);
    vctx.create_qp_ex = Some(vctx_create_qp_ex);
    xrc::fill_vctx(vctx);
    fill_ops(&mut vctx.context.ops);
}

/// What is told of every QP `ibv_destroy_qp` destroys (its QPN): librdmacm registers here
/// when it first holds a QP, so that its connections over it let go of it.
static QP_DESTROYED: Mutex<Vec<fn(u32)>> = Mutex::new(Vec::new());

/// Calls `hook` with the QPN of every QP destroyed from now on (register each hook once).
pub(crate) fn on_qp_destroyed(hook: fn(u32)) {
    lock(&QP_DESTROYED).push(hook);
}

/// Tells the hooks of [`on_qp_destroyed`] that QP `qpn` is being destroyed.
fn qp_destroyed(qpn: u32) {
    let hooks = lock(&QP_DESTROYED).clone();
    for hook in hooks {
        hook(qpn);
    }
}

/// Fills the data-path entries of `ibv_context_ops`.
fn fill_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops.alloc_mw = Some(mw::alloc_mw);
    ops.bind_mw = Some(mw::bind_mw);
    ops.dealloc_mw = Some(mw::dealloc_mw);
}
