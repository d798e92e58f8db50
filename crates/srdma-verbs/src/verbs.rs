//! The verbs objects and the data path: PD, MR, completion channel, CQ, QP, SRQ, AH; the
//! `ibv_context_ops` entries the inline `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` of `verbs.h` call.
//!
//! Each object is a `#[repr(C)]` box whose first field is the C struct handed out, so a C
//! pointer converts back to its box; the rest is the safe srdma object that does the work.
//! Errors follow rdma-core with rxe: functions returning `int` return the errno, those
//! returning a pointer return NULL and set `errno`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use srdma::{AccessFlags, AhAttr, AttrMask, QpAttr, QpCaps, QpInit, QpState, QpType};
use srdma_proto::{RKey, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, UdDest, Wc};
use srdma_wire::{Psn, Qpn};

use crate::abi_core::*;
use crate::context::{Context, is_nonblocking};
use crate::{errno_of, guard, set_errno};

mod atomic_write;
mod mw;
pub(crate) mod xrc;

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

/// Fills the data-path entries of `ibv_context_ops`.
pub(crate) fn fill_ops(ops: &mut ibv_context_ops) {
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops.alloc_mw = Some(mw::alloc_mw);
    ops.bind_mw = Some(mw::bind_mw);
    ops.dealloc_mw = Some(mw::dealloc_mw);
}

// ---------------------------------------------------------------------------------------
// Protection domains and memory regions

/// An `ibv_pd`.
#[repr(C)]
pub(crate) struct Pd {
    c: ibv_pd,
    pd: srdma::Pd,
    /// MRs, QPs, SRQs and AHs created in it: ibv_dealloc_pd refuses (EBUSY) while any lives.
    users: std::sync::atomic::AtomicUsize,
}

/// Counts one more (`+1`) or one fewer (`-1`) object in the PD `pd` (if it is live).
fn pd_users(pd: *mut ibv_pd, delta: isize) {
    // SAFETY: liveness checked by `back`.
    if let Some(p) = unsafe { back::<Pd, _>(pd) } {
        if delta > 0 {
            p.users.fetch_add(1, Ordering::Relaxed);
        } else {
            p.users.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// `ibv_alloc_pd`: a protection domain (opens the srdma device on first use).
///
/// # Safety
/// `context` is NULL or an open context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let dev = match ctx.device() {
            Ok(d) => d,
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        hand_out(Pd {
            c: ibv_pd { context, handle: 0 },
            pd: dev.alloc_pd(),
            users: std::sync::atomic::AtomicUsize::new(0),
        })
    })
}

/// `ibv_dealloc_pd`: 0; EBUSY while MRs, QPs, SRQs or AHs use it; EINVAL for NULL or a
/// PD already deallocated.
///
/// # Safety
/// `pd` is NULL or a live PD, deallocated once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: liveness checked by `back`.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            return libc::EINVAL;
        };
        if p.users.load(Ordering::Relaxed) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: a live Pd handed out by ibv_alloc_pd.
        drop(unsafe { take_back::<Pd, _>(pd) });
        0
    })
}

/// An `ibv_mr` over the application's memory.
#[repr(C)]
struct Mr {
    c: ibv_mr,
    mr: srdma::Mr,
}

/// The srdma access flags of `access` (IBV_ACCESS_* have srdma's numbering); EINVAL for bits
/// srdma does not know, EOPNOTSUPP for on-demand paging.
fn access_flags(access: c_int) -> Result<AccessFlags, c_int> {
    let a = access as u32;
    if a & IBV_ACCESS_ON_DEMAND as u32 != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // The optional range (relaxed ordering and later hints) is what a device may ignore, as
    // the kernel's ib_check_mr_access lets it through and rxe ignores it; srdma ignores it.
    let a = a & !(IBV_ACCESS_OPTIONAL_RANGE as u32);
    AccessFlags::from_bits(a).ok_or(libc::EINVAL)
}

fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: pd is NULL or a live PD per the callers' contract.
    let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let flags = match access_flags(access) {
        Ok(f) => f,
        Err(e) => {
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    if addr.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: the application keeps the range mapped until ibv_dereg_mr (the verbs contract
    // of ibv_reg_mr, which is reg_user_mr's).
    match unsafe { p.pd.reg_user_mr(addr.cast(), length, iova, flags) } {
        Ok(mr) => {
            let c = ibv_mr {
                context: p.c.context,
                pd,
                addr,
                length,
                handle: mr.lkey().0,
                lkey: mr.lkey().0,
                rkey: mr.rkey().map_or(mr.lkey().0, |r| r.0),
            };
            pd_users(pd, 1);
            hand_out(Mr { c, mr })
        }
        Err(e) => {
            set_errno(errno_of(&e));
            std::ptr::null_mut()
        }
    }
}

/// `ibv_reg_mr`: registers `length` bytes at `addr` (iova = the address, as rxe).
///
/// # Safety
/// `pd` is NULL or a live PD; the range stays mapped until `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, addr as u64, access)
    })
}

/// `ibv_reg_mr_iova`: as `ibv_reg_mr`, addressed by peers at `iova`.
///
/// # Safety
/// As [`ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, iova, access)
    })
}

/// `ibv_reg_mr_iova2` (what the `ibv_reg_mr` macro calls for non-constant access flags).
///
/// # Safety
/// As [`ibv_reg_mr`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg_mr(pd, addr, length, iova, access as c_int)
    })
}

/// `ibv_dereg_mr`: 0, or EINVAL for NULL or while memory windows are bound to it (rxe).
/// Work still in flight against it completes with a protection error; the engine never
/// touches the memory afterwards.
///
/// # Safety
/// `mr` is NULL or a live MR, deregistered once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: liveness checked by `back`.
        if unsafe { back::<Mr, _>(mr) }.is_some_and(|m| m.mr.bound_windows() > 0) {
            return libc::EINVAL;
        }
        // SAFETY: live objects came from hand_out::<Mr>.
        let Some(m) = (unsafe { take_back::<Mr, _>(mr) }) else {
            return libc::EINVAL;
        };
        pd_users(m.c.pd, -1);
        0
    })
}

/// `ibv_rereg_mr`: changes the region's PD (`IBV_REREG_MR_CHANGE_PD`), memory
/// (`_TRANSLATION`: `addr`, `length`, addressed at `addr` as `ibv_reg_mr`) or rights
/// (`_ACCESS`) in place, keeping its keys. 0 on success; `IBV_REREG_MR_ERR_INPUT` (-1) with
/// errno EINVAL for unknown flags, a translation without address or length, `access`
/// without `_ACCESS`, a PD of another context or rights srdma refuses, as rdma-core's checks
/// and rxe's; the region is unchanged then.
///
/// # Safety
/// `mr` is NULL or a live MR, not in use by another thread during the call; `pd` NULL or a
/// live PD; with a translation, `addr..addr + length` stays mapped as for `ibv_reg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    const INPUT: c_int = IBV_REREG_MR_ERR_INPUT;
    guard(INPUT, || {
        let fail = |e| {
            set_errno(e);
            INPUT
        };
        if !crate::is_live(mr) || flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
            return fail(libc::EINVAL);
        }
        let translate = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        let new_pd = flags & IBV_REREG_MR_CHANGE_PD != 0;
        let new_access = flags & IBV_REREG_MR_CHANGE_ACCESS != 0;
        if (translate && (addr.is_null() || length == 0)) || (access != 0 && !new_access) {
            return fail(libc::EINVAL);
        }
        // SAFETY: live (checked above), and the caller does not use it meanwhile: the one
        // reference to it.
        let m = unsafe { &mut *mr.cast::<Mr>() };
        let mut change = srdma::MrChange::default();
        if new_pd {
            // SAFETY: pd is NULL or live per the contract; `back` checks.
            let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
                return fail(libc::EINVAL);
            };
            if p.c.context != m.c.context {
                return fail(libc::EINVAL);
            }
            change.pd = Some(p.pd.clone());
        }
        if new_access {
            match access_flags(access) {
                Ok(f) => change.access = Some(f),
                Err(e) => return fail(e),
            }
        }
        if translate {
            change.translation = Some((addr.cast(), length, addr as u64));
        }
        // SAFETY: the new range stays mapped per the contract (reg_user_mr's).
        if let Err(e) = unsafe { m.mr.rereg(change) } {
            return fail(errno_of(&e));
        }
        if new_pd {
            pd_users(m.c.pd, -1);
            pd_users(pd, 1);
            m.c.pd = pd;
        }
        if translate {
            m.c.addr = addr;
            m.c.length = length;
        }
        m.c.lkey = m.mr.lkey().0;
        m.c.rkey = m.mr.rkey().map_or(m.c.lkey, |r| r.0);
        0
    })
}

// ---------------------------------------------------------------------------------------
// Completion channels and CQs

/// An `ibv_comp_channel`.
#[repr(C)]
struct Channel {
    c: ibv_comp_channel,
    ch: srdma::CompChannel,
    /// The CQs on this channel, by srdma CQ id (what the channel's events name).
    cqs: Mutex<HashMap<u32, usize>>,
}

/// `ibv_create_comp_channel`: a channel whose `fd` is pollable (and may be made
/// non-blocking).
///
/// # Safety
/// `context` is NULL or an open context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        if unsafe { Context::from_c(context) }.is_none() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let ch = match srdma::CompChannel::new() {
            Ok(c) => c,
            Err(e) => {
                set_errno(errno_of(&e));
                return std::ptr::null_mut();
            }
        };
        let c = ibv_comp_channel {
            context,
            fd: ch.as_fd().as_raw_fd(),
            refcnt: 0,
        };
        hand_out(Channel {
            c,
            ch,
            cqs: Mutex::new(HashMap::new()),
        })
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it, as rdma-core.
///
/// # Safety
/// `channel` is NULL or a live channel, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(ch) = (unsafe { back::<Channel, _>(channel) }) else {
            return libc::EINVAL;
        };
        if !lock(&ch.cqs).is_empty() {
            return libc::EBUSY;
        }
        // SAFETY: live objects came from hand_out::<Channel>.
        drop(unsafe { take_back::<Channel, _>(channel) });
        0
    })
}

/// An `ibv_cq`.
#[repr(C)]
struct Cq {
    c: ibv_cq_ex,
    cq: srdma::Cq,
    channel: *mut Channel,
    /// Completions taken from srdma, converted by the next poll.
    scratch: Mutex<Vec<Wc>>,
    /// Events acknowledged (`ibv_ack_cq_events`).
    acked: AtomicU32,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current.
    cur: Mutex<Option<Wc>>,
}

/// `ibv_create_cq`: a CQ of `cqe` entries, optionally on `channel`.
///
/// # Safety
/// `context` NULL or open; `channel` NULL or a live channel of it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match make_cq(ctx, context, cqe, cq_context, channel, comp_vector) {
            Ok(p) => p.cast(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Creates a CQ (`ibv_cq_ex` inside, so it serves both APIs).
fn make_cq(
    ctx: &Context,
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, c_int> {
    let max = ctx.entry.cfg.limits.max_cqe as c_int;
    if !(1..=max).contains(&cqe) || comp_vector != 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: `channel` is NULL or checked live by `back`.
    let ch = unsafe { back::<Channel, _>(channel) };
    if !channel.is_null() && ch.is_none() {
        return Err(libc::EINVAL);
    }
    let dev = ctx.device()?;
    let cq = dev
        .create_cq(cqe as usize, ch.map(|c| &c.ch))
        .map_err(|e| errno_of(&e))?;
    // SAFETY: plain C data; zeroed mutex/cond are the static initialisers on glibc, zeroed
    // function pointers are None.
    let mut c: ibv_cq_ex = unsafe { std::mem::zeroed() };
    c.cq.context = context;
    c.cq.channel = channel;
    c.cq.cq_context = cq_context;
    c.cq.handle = cq.id();
    c.cq.cqe = cqe;
    c.start_poll = Some(cq_start_poll);
    c.next_poll = Some(cq_next_poll);
    c.end_poll = Some(cq_end_poll);
    c.read_opcode = Some(cq_read_opcode);
    c.read_vendor_err = Some(cq_read_vendor_err);
    c.read_byte_len = Some(cq_read_byte_len);
    c.read_imm_data = Some(cq_read_imm_data);
    c.read_qp_num = Some(cq_read_qp_num);
    c.read_src_qp = Some(cq_read_src_qp);
    c.read_wc_flags = Some(cq_read_wc_flags);
    c.read_slid = Some(cq_read_slid);
    c.read_sl = Some(cq_read_sl);
    c.read_dlid_path_bits = Some(cq_read_dlid_path_bits);
    let id = cq.id();
    let boxed: *mut Cq = hand_out(Cq {
        c,
        cq,
        channel: channel.cast(),
        scratch: Mutex::new(Vec::with_capacity(16)),
        acked: AtomicU32::new(0),
        cur: Mutex::new(None),
    });
    lock(&ctx.sink.cqs).insert(id, boxed as usize);
    if let Some(ch) = ch {
        lock(&ch.cqs).insert(id, boxed as usize);
        // SAFETY: `channel` is live; refcnt is informational for the application.
        unsafe { (*channel).refcnt += 1 };
    }
    Ok(boxed)
}

/// `verbs_context.create_cq_ex` (behind the inline `ibv_create_cq_ex`): a CQ with the
/// `ibv_start_poll` API, reporting the standard `IBV_WC_EX_WITH_*` fields; completion
/// timestamps, CVLAN, flow tags and tag matching are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the inline caller passes its context.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: readable per ibv_create_cq_ex's contract.
        let a = unsafe { &*attr };
        if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0
            || a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !IBV_CREATE_CQ_ATTR_KNOWN != 0)
        {
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        let cqe = c_int::try_from(a.cqe).unwrap_or(c_int::MAX);
        match make_cq(
            ctx,
            context,
            cqe,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        ) {
            Ok(p) => p.cast(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// `ibv_destroy_cq`: 0; EBUSY while a QP uses it.
///
/// # Safety
/// `cq` is NULL or a live CQ, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { back::<Cq, _>(cq) }) else {
            return libc::EINVAL;
        };
        // The srdma CQ is shared with the QPs that use it: one clone here, one per QP side.
        if c.cq.users() > 1 {
            return libc::EBUSY;
        }
        // SAFETY: a CQ's context outlives it (verbs rule: objects are destroyed first).
        if let Some(ctx) = unsafe { Context::from_c(c.c.cq.context) } {
            lock(&ctx.sink.cqs).remove(&c.cq.id());
        }
        if !c.channel.is_null() {
            // SAFETY: a CQ keeps its channel alive (destroy_comp_channel refuses while the
            // CQ is registered).
            let ch = unsafe { &*c.channel };
            lock(&ch.cqs).remove(&c.cq.id());
            // SAFETY: as above.
            unsafe { (*c.channel).c.refcnt -= 1 };
        }
        // SAFETY: live objects came from hand_out::<Cq>.
        drop(unsafe { take_back::<Cq, _>(cq) });
        0
    })
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (`cq->cqe` says so); EINVAL
/// outside 1..=max_cqe or below the completions waiting to be polled, as rxe.
///
/// # Safety
/// `cq` is NULL or a live CQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { back::<Cq, _>(cq) }) else {
            return libc::EINVAL;
        };
        let Ok(n) = usize::try_from(cqe) else {
            return libc::EINVAL;
        };
        match c.cq.resize(n) {
            Ok(()) => {
                // SAFETY: `cq` is live (checked above); the application reads `cqe` only
                // after this call returns, as with rdma-core's providers.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

/// `ibv_get_cq_event`: waits for the next event on `channel` (unless its fd is
/// non-blocking: then -1 with EAGAIN) and names the CQ and its context.
///
/// # Safety
/// `channel` is NULL or live; `cq` and `cq_context` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(ch) = (unsafe { back::<Channel, _>(channel) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if cq.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        loop {
            // A blocking channel waits in srdma's own `get_event`, which also watches the
            // device's socket (the message wakes this thread, not the progress thread).
            let blocking = !is_nonblocking(ch.c.fd);
            let id = match ch
                .ch
                .get_event(if blocking { None } else { Some(Duration::ZERO) })
            {
                Ok(Some(id)) => id,
                Ok(None) => {
                    if !blocking {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                    // Only a signal ends a blocking wait without an event: EINTR, as from
                    // the kernel's read(2) (qperf's timer ends its event-mode tests so).
                    if crate::signals::interrupting_handler_installed() {
                        set_errno(libc::EINTR);
                        return -1;
                    }
                    continue;
                }
                Err(e) => {
                    set_errno(errno_of(&e));
                    return -1;
                }
            };
            // An event of a CQ destroyed meanwhile is dropped.
            let Some(&p) = lock(&ch.cqs).get(&id) else {
                continue;
            };
            let p = p as *mut Cq;
            // SAFETY: registered CQs are live (destroy unregisters first); the out-pointers
            // are valid per the contract.
            unsafe {
                *cq = p.cast();
                *cq_context = (*p).c.cq.cq_context;
            }
            return 0;
        }
    })
}

/// `ibv_ack_cq_events`: counts `nevents` events of `cq` as handled.
///
/// # Safety
/// `cq` is NULL or a live CQ.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    guard((), || {
        // SAFETY: per the contract.
        if let Some(c) = unsafe { back::<Cq, _>(cq) } {
            c.acked.fetch_add(nevents, Ordering::Relaxed);
        }
    })
}

fn wc_to_c(wc: &Wc, out: &mut ibv_wc) {
    out.wr_id = wc.wr_id;
    out.status = wc.status as u32;
    out.opcode = wc.opcode.as_u32();
    out.vendor_err = wc.vendor_err;
    out.byte_len = wc.byte_len;
    out.imm_data = match (wc.imm_data, wc.invalidated_rkey) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(r)) => r.0,
        _ => 0,
    };
    out.qp_num = wc.qp_num.value();
    out.src_qp = wc.src_qp.value();
    out.wc_flags = wc.wc_flags.bits();
    out.pkey_index = wc.pkey_index;
    out.slid = wc.slid;
    out.sl = wc.sl;
    out.dlid_path_bits = wc.dlid_path_bits;
}

/// `ops.poll_cq`: up to `num_entries` completions into `wc`; their number, or -1 for bad
/// arguments.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: the inline ibv_poll_cq passes a CQ of this context.
        let Some(c) = (unsafe { back_fast::<Cq, _>(cq) }) else {
            return -1;
        };
        if num_entries < 0 || (num_entries > 0 && wc.is_null()) {
            return -1;
        }
        let mut s = lock(&c.scratch);
        s.clear();
        let n = c.cq.poll_into(&mut s, num_entries as usize);
        for (i, w) in s.iter().enumerate().take(n) {
            // SAFETY: `wc` holds `num_entries` >= n entries (the verbs contract).
            wc_to_c(w, unsafe { &mut *wc.add(i) });
        }
        n as c_int
    })
}

/// `ops.req_notify_cq`: arms the CQ for one event.
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes a CQ of this context.
        let Some(c) = (unsafe { back_fast::<Cq, _>(cq) }) else {
            return libc::EINVAL;
        };
        c.cq.req_notify(solicited_only != 0);
        0
    })
}

/// The CQ behind an `ibv_cq_ex` of the inline polling API.
///
/// # Safety
/// `cq` is a live CQ of this library (the inline wrappers pass the application's).
unsafe fn cq_ex<'a>(cq: *mut ibv_cq_ex) -> Option<&'a Cq> {
    // SAFETY: per the contract.
    unsafe { back_fast::<Cq, _>(cq) }
}

/// Makes the next completion current: 0, or ENOENT when there is none.
fn cq_advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the inline caller passes its CQ.
    let Some(c) = (unsafe { cq_ex(cq) }) else {
        return libc::EINVAL;
    };
    match c.cq.poll_one() {
        Some(wc) => {
            // SAFETY: the CQ is live; `status` and `wr_id` are read by the inline API.
            unsafe {
                (*cq).status = wc.status as u32;
                (*cq).wr_id = wc.wr_id;
            }
            *lock(&c.cur) = Some(wc);
            0
        }
        None => libc::ENOENT,
    }
}

/// `ibv_start_poll`.
unsafe extern "C" fn cq_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: `attr` is NULL or readable (verbs contract).
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        cq_advance(cq)
    })
}

/// `ibv_next_poll`.
unsafe extern "C" fn cq_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || cq_advance(cq))
}

/// `ibv_end_poll`.
unsafe extern "C" fn cq_end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: the inline caller passes its CQ.
        if let Some(c) = unsafe { cq_ex(cq) } {
            *lock(&c.cur) = None;
        }
    })
}

/// Reads a field of the current completion (0 without one).
fn cq_read<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&Wc) -> T) -> T {
    guard(T::default(), || {
        // SAFETY: the inline caller passes its CQ.
        let Some(c) = (unsafe { cq_ex(cq) }) else {
            return T::default();
        };
        lock(&c.cur).as_ref().map(f).unwrap_or_default()
    })
}

/// `ibv_wc_read_opcode`.
unsafe extern "C" fn cq_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode {
    cq_read(cq, |w| w.opcode.as_u32())
}
/// `ibv_wc_read_vendor_err`.
unsafe extern "C" fn cq_read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.vendor_err)
}
/// `ibv_wc_read_byte_len`.
unsafe extern "C" fn cq_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.byte_len)
}
/// `ibv_wc_read_imm_data` (network order; the invalidated R_Key for SEND with invalidate).
unsafe extern "C" fn cq_read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| match (w.imm_data, w.invalidated_rkey) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(r)) => r.0,
        _ => 0,
    })
}
/// `ibv_wc_read_qp_num`.
unsafe extern "C" fn cq_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.qp_num.value())
}
/// `ibv_wc_read_src_qp`.
unsafe extern "C" fn cq_read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| w.src_qp.value())
}
/// `ibv_wc_read_wc_flags`.
unsafe extern "C" fn cq_read_wc_flags(cq: *mut ibv_cq_ex) -> std::ffi::c_uint {
    cq_read(cq, |w| w.wc_flags.bits())
}
/// `ibv_wc_read_slid`.
unsafe extern "C" fn cq_read_slid(cq: *mut ibv_cq_ex) -> u32 {
    cq_read(cq, |w| u32::from(w.slid))
}
/// `ibv_wc_read_sl`.
unsafe extern "C" fn cq_read_sl(cq: *mut ibv_cq_ex) -> u8 {
    cq_read(cq, |w| w.sl)
}
/// `ibv_wc_read_dlid_path_bits`.
unsafe extern "C" fn cq_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    cq_read(cq, |w| w.dlid_path_bits)
}

// ---------------------------------------------------------------------------------------
// Shared receive queues

/// An `ibv_srq`.
#[repr(C)]
struct Srq {
    c: ibv_srq,
    srq: srdma::Srq,
    max_wr: u32,
    max_sge: u32,
    limit: AtomicU32,
}

/// `ibv_create_srq`.
///
/// # Safety
/// `pd` NULL or live; `attr` NULL or valid for reading and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: valid per the contract.
        let a = unsafe { &mut *attr };
        let (max_wr, max_sge) = (a.attr.max_wr, a.attr.max_sge.max(1));
        let srq = match p.pd.create_srq(max_wr, max_sge) {
            Ok(s) => s,
            Err(e) => {
                set_errno(errno_of(&e));
                return std::ptr::null_mut();
            }
        };
        // SAFETY: plain C data; zeroed mutex/cond are the static initialisers on glibc.
        let mut c: ibv_srq = unsafe { std::mem::zeroed() };
        c.context = p.c.context;
        c.srq_context = a.srq_context;
        c.pd = pd;
        a.attr.max_sge = max_sge;
        pd_users(pd, 1);
        hand_out(Srq {
            c,
            srq,
            max_wr,
            max_sge,
            limit: AtomicU32::new(a.attr.srq_limit),
        })
    })
}

/// `ibv_modify_srq`: the limit can be set; a resize is EOPNOTSUPP... unless it asks for the
/// current size.
///
/// # Safety
/// `srq` NULL or live; `attr` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(s) = (unsafe { back::<Srq, _>(srq) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: readable per the contract.
        let a = unsafe { &*attr };
        let mask = attr_mask as u32;
        if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        if mask & IBV_SRQ_MAX_WR != 0 && a.max_wr != s.max_wr {
            return libc::EOPNOTSUPP;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            if a.srq_limit > s.max_wr {
                return libc::EINVAL;
            }
            s.limit.store(a.srq_limit, Ordering::Relaxed);
        }
        0
    })
}

/// `ibv_query_srq`.
///
/// # Safety
/// `srq` NULL or live; `attr` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(s) = (unsafe { back::<Srq, _>(srq) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: valid per the contract.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: s.limit.load(Ordering::Relaxed),
            };
        }
        0
    })
}

/// `ibv_destroy_srq`: EBUSY while a QP uses it.
///
/// # Safety
/// `srq` NULL or live, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(s) = (unsafe { back::<Srq, _>(srq) }) else {
            return libc::EINVAL;
        };
        if s.srq.users() > 1 {
            return libc::EBUSY;
        }
        pd_users(s.c.pd, -1);
        // SAFETY: live objects came from hand_out::<Srq>.
        drop(unsafe { take_back::<Srq, _>(srq) });
        0
    })
}

fn recv_wr(wr: &ibv_recv_wr, max_sge: u32) -> Result<RecvWr, c_int> {
    if wr.num_sge < 0 || wr.num_sge as u32 > max_sge || (wr.num_sge > 0 && wr.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the application's list of `num_sge` entries (checked non-null above).
    let sges = unsafe { sge_slice(wr.sg_list, wr.num_sge) };
    Ok(RecvWr {
        wr_id: wr.wr_id,
        sges: sges.iter().map(sge).collect(),
    })
}

/// # Safety
/// `p` is valid for `n` entries when `n > 0`.
unsafe fn sge_slice<'a>(p: *const ibv_sge, n: c_int) -> &'a [ibv_sge] {
    if n <= 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p, n as usize) }
}

fn sge(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: srdma::LKey(s.lkey),
    }
}

/// Walks a receive WR list, posting each with `post`; on failure points `bad` at the WR.
fn post_recv_list(
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    max_sge: u32,
    mut post: impl FnMut(RecvWr) -> Result<(), c_int>,
) -> c_int {
    while !wr.is_null() {
        // SAFETY: the application's linked list; each node is readable until `next` is NULL.
        let w = unsafe { &*wr };
        if let Err(e) = recv_wr(w, max_sge).and_then(&mut post) {
            if !bad.is_null() {
                // SAFETY: `bad` is valid for a write (verbs contract).
                unsafe { *bad = wr };
            }
            return e;
        }
        wr = w.next;
    }
    0
}

/// `ops.post_srq_recv`.
unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes an SRQ of this context.
        let Some(s) = (unsafe { back_fast::<Srq, _>(srq) }) else {
            return libc::EINVAL;
        };
        post_recv_list(wr, bad, s.max_sge, |r| {
            s.srq.post_recv(r).map_err(|e| errno_of(&e))
        })
    })
}

// ---------------------------------------------------------------------------------------
// Address handles

/// An `ibv_ah`.
#[repr(C)]
struct Ah {
    c: ibv_ah,
    attr: AhAttr,
}

fn ah_attr(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: a.grh.dgid.raw,
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        is_global: a.is_global != 0,
        sl: a.sl,
        port_num: a.port_num,
        ..AhAttr::default()
    }
}

fn ah_attr_to_c(a: &AhAttr, out: &mut ibv_ah_attr) {
    out.grh.dgid.raw = a.dgid;
    out.grh.flow_label = a.flow_label;
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = a.hop_limit;
    out.grh.traffic_class = a.traffic_class;
    out.is_global = u8::from(a.is_global);
    out.sl = a.sl;
    out.port_num = a.port_num;
    out.dlid = 0;
}

/// `ibv_create_ah`: EINVAL without a GRH (`is_global = 0`), as on any RoCE device.
///
/// # Safety
/// `pd` NULL or live; `attr` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: readable per the contract.
        let a = unsafe { &*attr };
        if a.is_global == 0 || a.port_num != 1 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let c = ibv_ah {
            context: p.c.context,
            pd,
            handle: 0,
        };
        pd_users(pd, 1);
        hand_out(Ah {
            c,
            attr: ah_attr(a),
        })
    })
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` NULL or live, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: live objects came from hand_out::<Ah>.
        let Some(a) = (unsafe { take_back::<Ah, _>(ah) }) else {
            return libc::EINVAL;
        };
        pd_users(a.c.pd, -1);
        0
    })
}

/// `ibv_init_ah_from_wc`: the address handle attributes that answer the sender of a UD
/// receive completion, from the GRH in the first 40 bytes of the receive buffer (an IPv4
/// header in its last 20 bytes for IPv4 peers, as rxe writes it).
///
/// # Safety
/// `context` open; `wc` and `grh` readable; `ah_attr` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let ok = unsafe { Context::from_c(context) }.is_some();
        if !ok || wc.is_null() || grh.is_null() || ah_attr.is_null() || port_num != 1 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: readable per the contract.
        let (w, g) = unsafe { (&*wc, &*grh) };
        if w.wc_flags & IBV_WC_GRH == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the GRH area is 40 readable bytes.
        let bytes: [u8; 40] = unsafe { std::ptr::read_unaligned(grh.cast()) };
        let _ = g;
        let mut a = AhAttr::default();
        // An IPv4 header (version 4, IHL 5) in the last 20 bytes; else an IPv6 header.
        if bytes[20] == 0x45 {
            let mut src = [0u8; 4];
            src.copy_from_slice(&bytes[32..36]);
            a.dgid = std::net::Ipv4Addr::from(src).to_ipv6_mapped().octets();
            a.traffic_class = bytes[21];
            a.hop_limit = 0xff;
        } else {
            a.dgid.copy_from_slice(&bytes[8..24]);
            a.traffic_class = ((bytes[0] & 0x0f) << 4) | (bytes[1] >> 4);
            a.flow_label = u32::from_be_bytes([0, bytes[1] & 0x0f, bytes[2], bytes[3]]);
            a.hop_limit = 0xff;
        }
        a.sl = w.sl;
        a.port_num = port_num;
        a.sgid_index = 0;
        // SAFETY: writable per the contract.
        let out = unsafe { &mut *ah_attr };
        // SAFETY: plain C data; all zeroes is valid.
        *out = unsafe { std::mem::zeroed() };
        ah_attr_to_c(&a, out);
        // The reply leaves from our address: pick the GID index that holds it.
        // SAFETY: context is open (checked above).
        if let Some(ctx) = unsafe { Context::from_c(context) } {
            let local = srdma::Gid::from_ip(ctx.entry.cfg.addr);
            let gids = ctx.entry.cfg.gids_on(ctx.entry.cfg.port);
            out.grh.sgid_index = gids.iter().position(|g| *g == local).unwrap_or(0) as u8;
        }
        0
    })
}

/// `ibv_create_ah_from_wc`: [`ibv_init_ah_from_wc`] then [`ibv_create_ah`].
///
/// # Safety
/// As both.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // SAFETY: plain C data; all zeroes is valid.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: forwarded under the same contract.
        if unsafe { ibv_init_ah_from_wc(p.c.context, port_num, wc, grh, &mut attr) } != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: `attr` is a live local.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}

// ---------------------------------------------------------------------------------------
// Queue pairs

/// An `ibv_qp`.
#[repr(C)]
struct Qp {
    c: ibv_qp_ex,
    qp: srdma::Qp,
    caps: QpCaps,
    sq_sig_all: bool,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex` gives the `ibv_wr_*`
    /// API.
    ex: bool,
    /// The work requests between `ibv_wr_start` and `ibv_wr_complete`.
    batch: Mutex<Vec<SendWr>>,
}

fn qp_type(t: ibv_qp_type) -> Result<QpType, c_int> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV | IBV_QPT_RAW_PACKET | IBV_QPT_DRIVER => {
            Err(libc::EOPNOTSUPP)
        }
        _ => Err(libc::EINVAL),
    }
}

/// `ibv_create_qp`: a QP in RESET. `attr->cap` is updated to what the QP got.
///
/// # Safety
/// `pd` NULL or live; `attr` NULL or valid for reading and writing; its CQs and SRQ live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: valid per the contract.
        let a = unsafe { &mut *attr };
        match create_qp(p, pd, a, false) {
            Ok(q) => q,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

fn create_qp(
    p: &Pd,
    pd: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
    ex: bool,
) -> Result<*mut ibv_qp, c_int> {
    let xrc_send = xrc::is_send(a.qp_type);
    let t = if xrc_send {
        QpType::Rc
    } else {
        qp_type(a.qp_type)?
    };
    // SAFETY: CQ and SRQ pointers are NULL or live per the caller's contract.
    let (scq, rcq, srq) = unsafe {
        let scq = back::<Cq, _>(a.send_cq).ok_or(libc::EINVAL)?;
        (
            scq,
            // An XRC initiator receives nothing: its receive CQ may be NULL.
            back::<Cq, _>(a.recv_cq)
                .or(xrc_send.then_some(scq))
                .ok_or(libc::EINVAL)?,
            back::<Srq, _>(a.srq).filter(|_| !xrc_send),
        )
    };
    let limits = &p.pd.device().config().limits;
    if a.cap.max_send_wr > limits.max_qp_wr
        || a.cap.max_recv_wr > limits.max_qp_wr
        || a.cap.max_inline_data > limits.max_inline_data
    {
        return Err(libc::EINVAL);
    }
    // As rxe: the QP gets at least one SGE per queue, and inline room up to the device's
    // limit whatever was asked (reported back, so ibv_rc_pingpong may send inline).
    let caps = QpCaps {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: if srq.is_some() { 0 } else { a.cap.max_recv_wr },
        max_send_sge: a.cap.max_send_sge.max(1),
        max_recv_sge: if srq.is_some() {
            0
        } else {
            a.cap.max_recv_sge.max(1)
        },
        max_inline_data: limits.max_inline_data,
    };
    let mut init = QpInit::new(t, &scq.cq, &rcq.cq);
    init.caps = caps;
    init.sq_sig_all = a.sq_sig_all != 0;
    init.srq = srq.map(|s| s.srq.clone());
    let qp = if xrc_send {
        xrc::create_send_qp(p, &init)?
    } else {
        p.pd.create_qp_reset(&init).map_err(|e| errno_of(&e))?
    };
    let got = caps;
    a.cap.max_send_sge = got.max_send_sge;
    if srq.is_none() {
        a.cap.max_recv_sge = got.max_recv_sge;
    }
    a.cap.max_inline_data = got.max_inline_data;
    // SAFETY: plain C data; zeroed mutex/cond are the static initialisers on glibc, zeroed
    // function pointers are None.
    let mut c: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut c.qp_base;
    b.context = p.c.context;
    b.qp_context = a.qp_context;
    b.pd = pd;
    b.send_cq = a.send_cq;
    b.recv_cq = a.recv_cq;
    b.srq = a.srq;
    b.handle = qp.qpn().value();
    b.qp_num = qp.qpn().value();
    b.state = IBV_QPS_RESET;
    b.qp_type = a.qp_type;
    let qpn = b.qp_num;
    if ex {
        fill_wr_ops(&mut c);
    }
    let boxed: *mut Qp = hand_out(Qp {
        c,
        qp,
        caps: got,
        sq_sig_all: a.sq_sig_all != 0,
        ex,
        batch: Mutex::new(Vec::new()),
    });
    pd_users(pd, 1);
    // SAFETY: the PD's context is open.
    if let Some(ctx) = unsafe { Context::from_c(p.c.context) } {
        lock(&ctx.sink.qps).insert(qpn, boxed as usize);
    }
    Ok(boxed.cast())
}

fn mtu(v: u32) -> Result<srdma::Mtu, c_int> {
    srdma::Mtu::from_u32(v).ok_or(libc::EINVAL)
}

fn qp_state(v: u32) -> Result<QpState, c_int> {
    QpState::from_u32(v).ok_or(libc::EINVAL)
}

/// The srdma form of an `ibv_modify_qp` call.
fn qp_attr(a: &ibv_qp_attr, mask: u32) -> Result<(QpAttr, AttrMask), c_int> {
    let m = AttrMask::from_bits(mask).ok_or(libc::EINVAL)?;
    let mut q = QpAttr::default();
    if m.contains(AttrMask::STATE) {
        q.qp_state = qp_state(a.qp_state)?;
    }
    if m.contains(AttrMask::CUR_STATE) {
        q.cur_qp_state = qp_state(a.cur_qp_state)?;
    }
    if m.contains(AttrMask::PATH_MTU) {
        q.path_mtu = mtu(a.path_mtu)?;
    }
    if m.contains(AttrMask::ACCESS_FLAGS) {
        q.qp_access_flags = AccessFlags::from_bits(a.qp_access_flags).ok_or(libc::EINVAL)?;
    }
    if m.contains(AttrMask::AV) {
        q.ah_attr = ah_attr(&a.ah_attr);
    }
    q.qkey = a.qkey;
    q.rq_psn = Psn::new(a.rq_psn & 0xFF_FFFF);
    q.sq_psn = Psn::new(a.sq_psn & 0xFF_FFFF);
    q.dest_qp_num = Qpn::new(a.dest_qp_num & 0xFF_FFFF);
    q.pkey_index = a.pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    q.port_num = a.port_num;
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.cap = QpCaps {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    Ok((q, m))
}

/// `ibv_modify_qp`: 0 or the errno (EINVAL for a transition or attribute the QP refuses),
/// also left in `errno`.
///
/// # Safety
/// `qp` NULL or live; `attr` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    // rdma-core's failed write(2) to the kernel leaves the same value in errno, and callers
    // print that (UCX: "error modifying QP to RTR: %m").
    let r = guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: readable per the contract.
        let (a, m) = match qp_attr(unsafe { &*attr }, attr_mask as u32) {
            Ok(v) => v,
            Err(e) => return e,
        };
        let r = q.qp.modify(&a, m);
        // SAFETY: the QP is live; `state` mirrors the srdma state for the application.
        unsafe { (*qp).state = q.qp.state() as u32 };
        match r {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    });
    if r != 0 {
        set_errno(r);
    }
    r
}

/// `ibv_query_qp`: the QP's attributes and the creation attributes.
///
/// # Safety
/// `qp` NULL or live; `attr` and `init_attr` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let s = q.qp.query();
        let cap = ibv_qp_cap {
            max_send_wr: q.caps.max_send_wr,
            max_recv_wr: q.caps.max_recv_wr,
            max_send_sge: q.caps.max_send_sge,
            max_recv_sge: q.caps.max_recv_sge,
            max_inline_data: q.caps.max_inline_data,
        };
        // SAFETY: writable per the contract; plain C data, so zeroing first is valid.
        let a = unsafe {
            *attr = std::mem::zeroed();
            &mut *attr
        };
        qp_attr_to_c(&s, a);
        a.cap = cap;
        // SAFETY: writable per the contract.
        let i = unsafe { &mut *init_attr };
        i.qp_context = q.c.qp_base.qp_context;
        i.send_cq = q.c.qp_base.send_cq;
        i.recv_cq = q.c.qp_base.recv_cq;
        i.srq = q.c.qp_base.srq;
        i.cap = cap;
        i.qp_type = q.c.qp_base.qp_type;
        i.sq_sig_all = c_int::from(q.sq_sig_all);
        // SAFETY: the QP is live.
        unsafe { (*qp).state = s.qp_state as u32 };
        0
    })
}

/// Writes `s` into the C attributes `a` (every field `QpAttr` has but the capabilities).
pub(crate) fn qp_attr_to_c(s: &QpAttr, a: &mut ibv_qp_attr) {
    a.qp_state = s.qp_state as u32;
    a.cur_qp_state = s.qp_state as u32;
    a.path_mtu = s.path_mtu.as_u32();
    a.path_mig_state = IBV_MIG_MIGRATED;
    a.qkey = s.qkey;
    a.rq_psn = s.rq_psn.value();
    a.sq_psn = s.sq_psn.value();
    a.dest_qp_num = s.dest_qp_num.value();
    a.qp_access_flags = s.qp_access_flags.bits();
    ah_attr_to_c(&s.ah_attr, &mut a.ah_attr);
    a.pkey_index = s.pkey_index;
    a.en_sqd_async_notify = u8::from(s.en_sqd_async_notify);
    a.sq_draining = u8::from(s.sq_draining);
    a.max_rd_atomic = s.max_rd_atomic;
    a.max_dest_rd_atomic = s.max_dest_rd_atomic;
    a.min_rnr_timer = s.min_rnr_timer;
    a.port_num = s.port_num;
    a.timeout = s.timeout;
    a.retry_cnt = s.retry_cnt;
    a.rnr_retry = s.rnr_retry;
}

/// `ibv_destroy_qp`: outstanding work is dropped with the QP, as with rxe. A QP still
/// attached to a multicast group is not destroyed: EBUSY, as the kernel answers.
///
/// # Safety
/// `qp` NULL or live, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if q.qp.is_attached() {
            return libc::EBUSY;
        }
        // SAFETY: a QP's context outlives it.
        if let Some(ctx) = unsafe { Context::from_c(q.c.qp_base.context) } {
            lock(&ctx.sink.qps).remove(&q.c.qp_base.qp_num);
        }
        pd_users(q.c.qp_base.pd, -1);
        // An rdma_cm connection over this QP lets go of it too.
        crate::rdmacm::qp_destroyed(q.c.qp_base.qp_num);
        // SAFETY: live objects came from hand_out::<Qp>.
        drop(unsafe { take_back::<Qp, _>(qp) });
        0
    })
}

/// `ibv_attach_mcast`: UD QP `qp` receives what is sent to QPN 0xFFFFFF at IPv4 multicast
/// group `gid` (its IPv4-mapped GID, as rdma_cm hands it out on RoCEv2); `lid` is unused on
/// RoCE. The srdma device joins the group on its interface (one socket per group and
/// process). Attaching twice is no error (rxe). Errors: EINVAL for NULL, a QP that is not
/// UD, a GID that is no IPv4 multicast address (IPv6 groups are not supported); ENOMEM
/// beyond rxe's limits (8192 groups, 56 QPs per group).
///
/// # Safety
/// `qp` NULL or live; `gid` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { mcast(qp, gid, true) }
}

/// `ibv_detach_mcast`: undoes `ibv_attach_mcast`; EINVAL when `qp` is not attached to
/// `gid` (or for NULL).
///
/// # Safety
/// `qp` NULL or live; `gid` NULL or valid for reading.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { mcast(qp, gid, false) }
}

/// # Safety
/// As `ibv_attach_mcast`.
unsafe fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL, readable per the contract.
        let g = srdma::Gid(unsafe { (*gid).raw });
        let r = if attach {
            q.qp.attach_mcast(g)
        } else {
            q.qp.detach_mcast(g)
        };
        match r {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

/// `ibv_qp_to_qp_ex`: the `ibv_wr_*` API of a QP created by `ibv_create_qp_ex` with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; NULL for others, as rdma-core.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard(std::ptr::null_mut(), || {
        // SAFETY: liveness checked by `back`.
        match unsafe { back::<Qp, _>(qp) } {
            Some(q) if q.ex => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// `verbs_context.create_qp_ex` (behind the inline `ibv_create_qp_ex` when the mask is more
/// than a PD): RC, UC and UD QPs, with the `ibv_wr_*` API when asked for
/// (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, operations as `ibv_post_send`'s). XRC, RSS, TSO and
/// creation flags are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn vctx_create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the inline caller passes its context.
        if unsafe { Context::from_c(context) }.is_none() || attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: readable and writable per ibv_create_qp_ex's contract.
        let a = unsafe { &mut *attr };
        if a.qp_type == IBV_QPT_XRC_RECV {
            return xrc::create_recv_qp(context, a);
        }
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let with_ops = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
            || (with_ops
                && a.send_ops_flags
                    & !(SRDMA_QP_EX_OPS | atomic_write::IBV_QP_EX_WITH_ATOMIC_WRITE)
                    != 0)
            || (with_ops && a.qp_type == IBV_QPT_UD && a.send_ops_flags & SRDMA_QP_EX_MW_OPS != 0)
            || (with_ops
                && a.qp_type != IBV_QPT_RC
                && a.send_ops_flags & atomic_write::IBV_QP_EX_WITH_ATOMIC_WRITE != 0)
        {
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        let pd = a.pd;
        // SAFETY: liveness checked by `back`.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // The legacy attributes are the first fields of the extended ones, same layout.
        // SAFETY: `ibv_qp_init_attr_ex` starts with the fields of `ibv_qp_init_attr`.
        let legacy = unsafe { &mut *std::ptr::from_mut(a).cast::<ibv_qp_init_attr>() };
        match create_qp(p, pd, legacy, with_ops) {
            Ok(q) => q,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

fn fill_wr_ops(c: &mut ibv_qp_ex) {
    c.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    c.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    c.wr_bind_mw = Some(mw::wr_bind_mw);
    c.wr_local_inv = Some(mw::wr_local_inv);
    c.wr_send_inv = Some(mw::wr_send_inv);
    c.wr_rdma_read = Some(wr_rdma_read);
    c.wr_rdma_write = Some(wr_rdma_write);
    c.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    c.wr_send = Some(wr_send);
    c.wr_send_imm = Some(wr_send_imm);
    c.wr_set_ud_addr = Some(wr_set_ud_addr);
    c.wr_set_inline_data = Some(wr_set_inline_data);
    c.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    c.wr_set_sge = Some(wr_set_sge);
    c.wr_set_sge_list = Some(wr_set_sge_list);
    c.wr_start = Some(wr_start);
    c.wr_complete = Some(wr_complete);
    c.wr_abort = Some(wr_abort);
    c.wr_atomic_write = Some(atomic_write::wr_atomic_write);
    c.wr_set_xrc_srqn = Some(xrc::wr_set_xrc_srqn);
}

/// Runs `f` on the QP behind `qpx` (the `ibv_wr_*` functions return nothing: errors surface
/// at `ibv_wr_complete`).
fn with_qpx<T: Default>(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &ibv_qp_ex) -> T) -> T {
    guard(T::default(), || {
        // SAFETY: the inline ibv_wr_* pass the application's qp_ex, a live QP of ours.
        let Some(q) = (unsafe { back_fast::<Qp, _>(qpx) }) else {
            return T::default();
        };
        // SAFETY: as above; the application sets wr_id/wr_flags before each operation.
        f(q, unsafe { &*qpx })
    })
}

/// Starts a new WR of the batch with `op`, the qp_ex's current wr_id and wr_flags.
fn wr_push(qpx: *mut ibv_qp_ex, op: SendOp) {
    with_qpx(qpx, |q, x| {
        let flags = SendFlags::from_bits_truncate(x.wr_flags & 0x17);
        let mut wr = SendWr::new(x.wr_id, op, SgeList::new()).with_flags(flags);
        if q.sq_sig_all {
            wr.flags |= SendFlags::SIGNALED;
        }
        lock(&q.batch).push(wr);
    });
}

/// Applies `f` to the batch's last WR.
fn wr_last(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut SendWr)) {
    with_qpx(qpx, |q, _| {
        if let Some(w) = lock(&q.batch).last_mut() {
            f(q, w);
        }
    });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    wr_push(
        qpx,
        SendOp::CompareSwap {
            remote_addr: addr,
            rkey: RKey(rkey),
            compare,
            swap,
        },
    );
}
unsafe extern "C" fn wr_atomic_fetch_add(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    wr_push(
        qpx,
        SendOp::FetchAdd {
            remote_addr: addr,
            rkey: RKey(rkey),
            add,
        },
    );
}
unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    wr_push(
        qpx,
        SendOp::Read {
            remote_addr: addr,
            rkey: RKey(rkey),
        },
    );
}
unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    wr_push(
        qpx,
        SendOp::Write {
            remote_addr: addr,
            rkey: RKey(rkey),
        },
    );
}
unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    wr_push(
        qpx,
        SendOp::WriteWithImm {
            remote_addr: addr,
            rkey: RKey(rkey),
            imm: u32::from_be(imm),
        },
    );
}
unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    wr_push(qpx, SendOp::Send);
}
unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    wr_push(
        qpx,
        SendOp::SendWithImm {
            imm: u32::from_be(imm),
        },
    );
}
unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: liveness checked by `back`.
    let ah = unsafe { back::<Ah, _>(ah) }.map(|a| a.attr);
    wr_last(qpx, |_, w| {
        if let Some(ah) = ah {
            w.ud = Some(UdDest {
                ah,
                remote_qpn: Qpn::new(remote_qpn & 0xFF_FFFF),
                remote_qkey,
            });
        }
    });
}
unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    wr_last(qpx, |_, w| {
        w.sges = SgeList::one(Sge {
            addr,
            length,
            lkey: srdma::LKey(lkey),
        });
    });
}
unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: the application's `n` entries.
    let sges = unsafe { sge_slice(list, c_int::try_from(n).unwrap_or(0)) };
    wr_last(qpx, |_, w| w.sges = sges.iter().map(sge).collect());
}
/// Copies inline data at once, as `ibv_wr_set_inline_data` requires.
fn wr_inline(qpx: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
    wr_last(qpx, |_, w| {
        let mut data = Vec::new();
        for &(p, len) in bufs {
            if len > 0 && !p.is_null() {
                // SAFETY: the application's buffer of `len` bytes, read now (the verbs contract
                // of inline data).
                data.extend_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
            }
        }
        w.sges = SgeList::new();
        *w = std::mem::replace(w, SendWr::new(0, SendOp::Send, SgeList::new())).with_inline(data);
    });
}
unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    wr_inline(qpx, &[(addr.cast_const().cast(), length)]);
}
unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    if list.is_null() {
        return;
    }
    // SAFETY: the application's `n` buffers.
    let bufs = unsafe { std::slice::from_raw_parts(list, n) };
    let v: Vec<(*const u8, usize)> = bufs
        .iter()
        .map(|b| (b.addr.cast_const().cast(), b.length))
        .collect();
    wr_inline(qpx, &v);
}
unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    with_qpx(qpx, |q, _| lock(&q.batch).clear());
}
unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    with_qpx(qpx, |q, _| lock(&q.batch).clear());
}
/// `ibv_wr_complete`: posts the batch (0, or the errno of the first WR refused).
unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    with_qpx(qpx, |q, _| {
        let wrs = std::mem::take(&mut *lock(&q.batch));
        for w in &wrs {
            if w.inline_data
                .as_ref()
                .is_some_and(|d| d.len() > q.caps.max_inline_data as usize)
            {
                return libc::EINVAL;
            }
            if q.c.qp_base.qp_type == IBV_QPT_UD && w.ud.is_none() {
                return libc::EINVAL;
            }
        }
        match q.qp.post_send_batch(wrs) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

/// `ibv_query_qp_data_in_order`: srdma places data in order for every operation (it
/// copies a packet's payload only after checking its ICRC, packet by packet in PSN order).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG as c_int
}

/// The srdma form of one send WR.
fn send_wr(q: &Qp, w: &ibv_send_wr) -> Result<SendWr, c_int> {
    if w.num_sge < 0 || (w.num_sge > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the application's `num_sge` entries (checked non-null).
    let list = unsafe { sge_slice(w.sg_list, w.num_sge) };
    // SAFETY: reading the union member selected by the opcode; all members are plain data.
    let (rdma, atomic, ud) = unsafe { (w.wr.rdma, w.wr.atomic, w.wr.ud) };
    let imm = u32::from_be(w.imm_data);
    let op = match w.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        IBV_WR_RDMA_WRITE => SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: RKey(rdma.rkey),
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: RKey(rdma.rkey),
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: RKey(rdma.rkey),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: RKey(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: RKey(atomic.rkey),
            add: atomic.compare_add,
        },
        // `invalidate_rkey` shares `imm_data`'s place, in host order.
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            rkey: RKey(w.imm_data),
        },
        IBV_WR_LOCAL_INV => SendOp::LocalInv {
            rkey: RKey(w.imm_data),
        },
        IBV_WR_BIND_MW => mw::post_bind_op(w)?,
        _ => return Err(libc::EINVAL),
    };
    let flags = SendFlags::from_bits(w.send_flags & 0x1f).ok_or(libc::EINVAL)?;
    let mut wr = SendWr::new(w.wr_id, op, SgeList::new()).with_flags(flags);
    if q.sq_sig_all {
        wr.flags |= SendFlags::SIGNALED;
    }
    if op.is_local() {
        // A bind or invalidate moves no data: no SGEs, no inline copy.
    } else if flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic() {
        let total: usize = list.iter().map(|s| s.length as usize).sum();
        if total > q.caps.max_inline_data as usize {
            return Err(libc::EINVAL);
        }
        let mut data = Vec::with_capacity(total);
        for s in list {
            if s.length > 0 {
                // SAFETY: inline data is read from the application's buffers at post time
                // (the verbs contract: they are valid for `length` bytes, no key needed).
                data.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                });
            }
        }
        wr = wr.with_inline(data);
    } else {
        wr.flags = SendFlags::from_bits_truncate(wr.flags.bits() & !SendFlags::INLINE.bits());
        wr.sges = list.iter().map(sge).collect();
    }
    if q.c.qp_base.qp_type == IBV_QPT_UD {
        // SAFETY: the AH pointer is NULL or a live AH (verbs contract).
        let ah = unsafe { back::<Ah, _>(ud.ah) }.ok_or(libc::EINVAL)?;
        wr = wr.to_ud(UdDest {
            ah: ah.attr,
            remote_qpn: Qpn::new(ud.remote_qpn & 0xFF_FFFF),
            remote_qkey: ud.remote_qkey,
        });
    }
    Ok(wr)
}

/// `ops.post_send`: posts the list; on failure `*bad_wr` names the first WR not posted.
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes a QP of this context.
        let Some(q) = (unsafe { back_fast::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        let set_bad = |p: *mut ibv_send_wr| {
            if !bad_wr.is_null() {
                // SAFETY: writable per the verbs contract.
                unsafe { *bad_wr = p };
            }
        };
        let mut ptrs = Vec::new();
        let mut wrs = Vec::new();
        let mut conv_err = None;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the application's list; nodes readable until `next` is NULL.
            let w = unsafe { &*cur };
            match send_wr(q, w) {
                Ok(mut s) => {
                    s.xrc_srqn = xrc::remote_srqn(q, w);
                    wrs.push(s);
                    ptrs.push(cur);
                }
                Err(e) => {
                    conv_err = Some((cur, e));
                    break;
                }
            }
            cur = w.next;
        }
        let mut taken = 0usize;
        let r =
            q.qp.post_send_batch(wrs.into_iter().inspect(|_| taken += 1));
        if let Err(e) = r {
            set_bad(ptrs.get(taken.saturating_sub(1)).copied().unwrap_or(wr));
            return errno_of(&e);
        }
        if let Some((p, e)) = conv_err {
            set_bad(p);
            return e;
        }
        0
    })
}

/// `ops.post_recv`.
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes a QP of this context.
        let Some(q) = (unsafe { back_fast::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if !q.c.qp_base.srq.is_null() {
            if !bad_wr.is_null() {
                // SAFETY: writable per the verbs contract.
                unsafe { *bad_wr = wr };
            }
            return libc::EINVAL;
        }
        let max = q.caps.max_recv_sge;
        post_recv_list(wr, bad_wr, max, |r| {
            q.qp.post_recv(r).map_err(|e| errno_of(&e))
        })
    })
}

/// Handles `ibv_ack_async_event` for an event this library raised (nothing to release).
pub(crate) fn ack_async(_ev: &ibv_async_event) {}

// ---------------------------------------------------------------------------------------
// For librdmacm (`crate::rdmacm`), which drives QPs it did not create through srdma.

/// The srdma QP behind a live `ibv_qp`, and whether it receives from an SRQ.
pub(crate) fn qp_of(qp: *mut ibv_qp) -> Option<(srdma::Qp, bool)> {
    // SAFETY: liveness checked by `back`.
    let q = unsafe { back::<Qp, _>(qp) }?;
    // SAFETY: live, checked above.
    let srq = unsafe { !(*qp).srq.is_null() };
    Some((q.qp.clone(), srq))
}

/// `ibv_modify_qp` with srdma's attributes, on a live `ibv_qp` (EINVAL if it is not).
pub(crate) fn modify_qp(qp: *mut ibv_qp, attr: &QpAttr, mask: AttrMask) -> c_int {
    // SAFETY: liveness checked by `back`.
    let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
        return libc::EINVAL;
    };
    let r = q.qp.modify(attr, mask);
    // SAFETY: the QP is live; `state` mirrors the srdma state for the application.
    unsafe { (*qp).state = q.qp.state() as u32 };
    match r {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
