//! Protection domains and memory regions: `ibv_alloc_pd`, `ibv_reg_mr` and its forms,
//! `ibv_rereg_mr`, `ibv_dereg_mr`.

use super::*;

/// An `ibv_pd`.
#[repr(C)]
pub(crate) struct Pd {
    pub(super) c: ibv_pd,
    pub(super) pd: srdma::Pd,
    /// MRs, QPs, SRQs and AHs created in it: ibv_dealloc_pd refuses (EBUSY) while any lives.
    pub(super) users: std::sync::atomic::AtomicUsize,
}

/// Counts one more (`+1`) or one fewer (`-1`) object in the PD `pd` (if it is live).
pub(super) fn pd_users(pd: *mut ibv_pd, delta: isize) {
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
pub(super) struct Mr {
    pub(super) c: ibv_mr,
    pub(super) mr: srdma::Mr,
}

/// The srdma access flags of `access` (IBV_ACCESS_* have srdma's numbering); EINVAL for bits
/// srdma does not know, EOPNOTSUPP for on-demand paging.
pub(super) fn access_flags(access: c_int) -> Result<AccessFlags, c_int> {
    let a = access as u32;
    if a & IBV_ACCESS_ON_DEMAND as u32 != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // The optional range (relaxed ordering and later hints) is what a device may ignore, as
    // the kernel's ib_check_mr_access lets it through and rxe ignores it; srdma ignores it.
    let a = a & !(IBV_ACCESS_OPTIONAL_RANGE as u32);
    AccessFlags::from_bits(a).ok_or(libc::EINVAL)
}

pub(super) fn reg_mr(
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
