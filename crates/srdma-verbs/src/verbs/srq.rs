//! Shared receive queues.

use super::*;

/// An `ibv_srq`.
#[repr(C)]
pub(super) struct Srq {
    pub(super) c: ibv_srq,
    pub(super) srq: srdma::Srq,
    pub(super) max_wr: u32,
    pub(super) max_sge: u32,
}

/// Hands out a new SRQ of `context` with its limit armed from the create attributes (as
/// rxe) and registers it for its async events.
pub(super) fn hand_out_srq(
    context: *mut ibv_context,
    c: ibv_srq,
    srq: srdma::Srq,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
) -> *mut ibv_srq {
    if limit != 0 {
        // A limit above the SRQ's size is refused by modify; here it is left unarmed.
        let _ = srq.set_limit(limit);
    }
    let id = srq.id();
    let p: *mut ibv_srq = hand_out(Srq {
        c,
        srq,
        max_wr,
        max_sge,
    });
    // SAFETY: an SRQ's context is open while it lives (verbs rule).
    if let Some(ctx) = unsafe { Context::from_c(context) } {
        lock(&ctx.sink.srqs).insert(id, p as usize);
    }
    p
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
        hand_out_srq(p.c.context, c, srq, max_wr, max_sge, a.attr.srq_limit)
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
            if let Err(e) = s.srq.set_limit(a.srq_limit) {
                return errno_of(&e);
            }
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
                srq_limit: s.srq.limit(),
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
        // SAFETY: an SRQ's context outlives it (verbs rule).
        if let Some(ctx) = unsafe { Context::from_c(s.c.context) } {
            lock(&ctx.sink.srqs).remove(&s.srq.id());
            ctx.sink.forget(srq as usize);
        }
        pd_users(s.c.pd, -1);
        // SAFETY: live objects came from hand_out::<Srq>.
        drop(unsafe { take_back::<Srq, _>(srq) });
        0
    })
}

pub(super) fn recv_wr(wr: &ibv_recv_wr, max_sge: u32) -> Result<RecvWr, c_int> {
    if wr.num_sge < 0 || wr.num_sge as u32 > max_sge || (wr.num_sge > 0 && wr.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the application's list of `num_sge` entries (checked non-null above).
    let sges = unsafe { sge_list(wr.sg_list, wr.num_sge) };
    Ok(RecvWr {
        wr_id: wr.wr_id,
        sges: sges.map(|s| sge(&s)).collect(),
    })
}

/// The application's `n` scatter/gather entries at `p`, read one by one without assuming
/// alignment: programs keep them in packed structures (libiscsi's iSER receive descriptors
/// put one at an offset of 4 mod 8), which C reads fine on the machines verbs run on.
///
/// # Safety
/// `p` is valid for `n` entries when `n > 0`, for as long as the iterator is used.
pub(super) unsafe fn sge_list(
    p: *const ibv_sge,
    n: c_int,
) -> impl Iterator<Item = ibv_sge> + Clone {
    let n = if n <= 0 || p.is_null() { 0 } else { n as usize };
    // SAFETY: per the contract, entries 0..n are readable; read_unaligned needs no alignment.
    (0..n).map(move |i| unsafe { p.add(i).read_unaligned() })
}

pub(super) fn sge(s: &ibv_sge) -> Sge {
    Sge {
        addr: s.addr,
        length: s.length,
        lkey: srdma::LKey(s.lkey),
    }
}

/// Walks a receive WR list, posting each with `post`; on failure points `bad` at the WR.
pub(super) fn post_recv_list(
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    max_sge: u32,
    mut post: impl FnMut(RecvWr) -> Result<(), c_int>,
) -> c_int {
    while !wr.is_null() {
        // SAFETY: the application's linked list; each node is readable until `next` is NULL
        // (copied out without assuming alignment, as its entries).
        let w = unsafe { wr.read_unaligned() };
        if let Err(e) = recv_wr(&w, max_sge).and_then(&mut post) {
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
pub(super) unsafe extern "C" fn post_srq_recv(
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
