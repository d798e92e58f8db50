//! XRC through `verbs_context`: `ibv_open_xrcd`/`ibv_close_xrcd`, `ibv_create_srq_ex` with
//! `IBV_SRQT_XRC`, `ibv_get_srq_num`, `IBV_QPT_XRC_RECV` QPs (`ibv_create_qp_ex` with
//! `IBV_QP_INIT_ATTR_XRCD`), and for `IBV_QPT_XRC_SEND` QPs the remote SRQ number of
//! `ibv_post_send` (`wr.qp_type.xrc.remote_srqn`) and `ibv_wr_set_xrc_srqn`.

use std::ffi::c_int;
use std::sync::Mutex;

use srdma::{AccessFlags, QpCaps, QpInit, QpType};

use super::{
    Cq, Pd, Qp, Srq, back, errno_of, hand_out, lock, pd_users, set_errno, take_back, wr_last,
};
use crate::abi_core::*;
use crate::context::Context;
use crate::guard;

/// An `ibv_xrcd`.
#[repr(C)]
struct Xrcd {
    c: ibv_xrcd,
    xrcd: srdma::Xrcd,
    /// The file (device, inode) it was opened with, if any.
    file: Option<(u64, u64)>,
}

/// A domain opened with a file: its context (address), the file (device, inode), the domain.
type FileDomain = (usize, (u64, u64), srdma::Xrcd);

/// Domains opened with a file: a second open of the same file shares the domain (the
/// kernel's `ibv_open_xrcd` semantics, within this process).
static BY_FILE: Mutex<Vec<FileDomain>> = Mutex::new(Vec::new());

/// Fills the XRC entries of `verbs_context`.
pub(crate) fn fill_vctx(v: &mut verbs_context) {
    v.open_xrcd = Some(open_xrcd);
    v.close_xrcd = Some(close_xrcd);
    v.create_srq_ex = Some(create_srq_ex);
    v.get_srq_num = Some(get_srq_num);
}

/// `verbs_context.open_xrcd`: with `fd` -1 a new domain (`O_CREAT` required); with a file,
/// the domain of that file, created if `O_CREAT` (EEXIST with `O_EXCL` when it exists,
/// ENOENT without `O_CREAT` when it does not).
unsafe extern "C" fn open_xrcd(
    context: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
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
        // SAFETY: readable per ibv_open_xrcd's contract.
        let a = unsafe { &*attr };
        let need = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
        if a.comp_mask & need != need || a.comp_mask & !need != 0 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let creat = a.oflags & libc::O_CREAT != 0;
        let excl = a.oflags & libc::O_EXCL != 0;
        if a.oflags & !(libc::O_CREAT | libc::O_EXCL) != 0 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let dev = match ctx.device() {
            Ok(d) => d,
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        let file = if a.fd == -1 {
            None
        } else {
            // SAFETY: an all-zero stat is a valid out-parameter.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat writes into `st`; a bad fd fails with EBADF.
            if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
                set_errno(libc::EBADF);
                return std::ptr::null_mut();
            }
            Some((st.st_dev, st.st_ino))
        };
        let key = context as usize;
        let mut files = lock(&BY_FILE);
        let existing = file.and_then(|f| {
            files
                .iter()
                .find(|(c, k, _)| *c == key && *k == f)
                .map(|e| e.2.clone())
        });
        let xrcd = match existing {
            Some(_) if excl && creat => {
                set_errno(libc::EEXIST);
                return std::ptr::null_mut();
            }
            Some(x) => x,
            None if !creat => {
                set_errno(if file.is_some() {
                    libc::ENOENT
                } else {
                    libc::EINVAL
                });
                return std::ptr::null_mut();
            }
            None => match dev.open_xrcd() {
                Ok(x) => {
                    if let Some(f) = file {
                        files.push((key, f, x.clone()));
                    }
                    x
                }
                Err(e) => {
                    set_errno(errno_of(&e));
                    return std::ptr::null_mut();
                }
            },
        };
        hand_out(Xrcd {
            c: ibv_xrcd { context },
            xrcd,
            file,
        })
    })
}

/// `verbs_context.close_xrcd`: 0. The SRQs and QPs of the domain keep it alive until they
/// are destroyed.
unsafe extern "C" fn close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: liveness checked by `take_back`; live objects came from hand_out::<Xrcd>.
        let Some(x) = (unsafe { take_back::<Xrcd, _>(xrcd) }) else {
            return libc::EINVAL;
        };
        if let Some(f) = x.file {
            let key = x.c.context as usize;
            let mut files = lock(&BY_FILE);
            // The last handle of this process lets go of the file's domain.
            let last = files
                .iter()
                .find(|(c, k, _)| *c == key && *k == f)
                .is_some_and(|e| e.2.users() <= 2);
            if last {
                files.retain(|(c, k, _)| !(*c == key && *k == f));
            }
        }
        0
    })
}

/// `verbs_context.create_srq_ex`: XRC SRQs (`IBV_SRQT_XRC` with a PD, an XRC domain and a
/// CQ); a basic SRQ when that is what is asked; tag matching is EOPNOTSUPP.
unsafe extern "C" fn create_srq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: readable and writable per ibv_create_srq_ex's contract.
        let a = unsafe { &mut *attr };
        let known = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ;
        if a.comp_mask & !known != 0 || a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let srq_type = if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 {
            a.srq_type
        } else {
            IBV_SRQT_BASIC
        };
        match srq_type {
            IBV_SRQT_BASIC => {
                // The legacy attributes are the first fields of the extended ones.
                let legacy = std::ptr::from_mut(a).cast::<ibv_srq_init_attr>();
                // SAFETY: `ibv_srq_init_attr_ex` starts with the fields of `ibv_srq_init_attr`.
                return unsafe { super::ibv_create_srq(a.pd, legacy) };
            }
            IBV_SRQT_XRC => {}
            _ => {
                set_errno(libc::EOPNOTSUPP);
                return std::ptr::null_mut();
            }
        }
        let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
        // SAFETY: liveness checked by `back`.
        let objs = unsafe {
            (
                back::<Pd, _>(a.pd),
                back::<Xrcd, _>(a.xrcd.cast::<ibv_xrcd>()),
                back::<Cq, _>(a.cq),
            )
        };
        let (Some(p), Some(x), Some(cq)) = objs else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if a.comp_mask & need != need || p.c.context != context || x.c.context != context {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let (max_wr, max_sge) = (a.attr.max_wr, a.attr.max_sge.max(1));
        let srq = match p.pd.create_xrc_srq(&x.xrcd, &cq.cq, max_wr, max_sge) {
            Ok(s) => s,
            Err(e) => {
                set_errno(errno_of(&e));
                return std::ptr::null_mut();
            }
        };
        // SAFETY: plain C data; zeroed mutex/cond are the static initialisers on glibc.
        let mut c: ibv_srq = unsafe { std::mem::zeroed() };
        c.context = context;
        c.srq_context = a.srq_context;
        c.pd = a.pd;
        a.attr.max_sge = max_sge;
        pd_users(a.pd, 1);
        super::srq::hand_out_srq(context, c, srq, max_wr, max_sge, a.attr.srq_limit)
    })
}

/// `verbs_context.get_srq_num`: the number initiators put in their XRCETH.
unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, num: *mut u32) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: liveness checked by `back`.
        let Some(s) = (unsafe { back::<Srq, _>(srq) }) else {
            return libc::EINVAL;
        };
        if num.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: writable per ibv_get_srq_num's contract.
        unsafe { *num = s.srq.number() };
        0
    })
}

/// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: a target QP of the XRC domain
/// `attr->xrcd` (`IBV_QP_INIT_ATTR_XRCD`), in RESET, with no PD, CQs or queues of its own.
pub(super) fn create_recv_qp(
    context: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: liveness checked by `back`.
    let x = unsafe { back::<Xrcd, _>(a.xrcd.cast::<ibv_xrcd>()) };
    let Some(x) = x.filter(|x| a.comp_mask & IBV_QP_INIT_ATTR_XRCD != 0 && x.c.context == context)
    else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let access = AccessFlags::empty();
    let qp = match x.xrcd.create_target_qp(access) {
        Ok(q) => q,
        Err(e) => {
            set_errno(errno_of(&e));
            return std::ptr::null_mut();
        }
    };
    a.cap = ibv_qp_cap {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    // SAFETY: plain C data; zeroed mutex/cond are the static initialisers on glibc, zeroed
    // function pointers are None.
    let mut c: ibv_qp_ex = unsafe { std::mem::zeroed() };
    let b = &mut c.qp_base;
    b.context = context;
    b.qp_context = a.qp_context;
    b.handle = qp.qpn().value();
    b.qp_num = qp.qpn().value();
    b.state = IBV_QPS_RESET;
    b.qp_type = IBV_QPT_XRC_RECV;
    let qpn = b.qp_num;
    let caps = QpCaps {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let boxed: *mut Qp = hand_out(Qp::new(c, qp, caps, false, false));
    // SAFETY: checked live above.
    if let Some(ctx) = unsafe { Context::from_c(context) } {
        lock(&ctx.sink.qps).insert(qpn, boxed as usize);
    }
    boxed.cast()
}

/// The QP type srdma runs an `ibv_qp_type` of `ibv_create_qp` as: XRC_SEND is an RC
/// initiator (its receive CQ may be NULL: it receives nothing).
pub(super) fn is_send(t: ibv_qp_type) -> bool {
    t == IBV_QPT_XRC_SEND
}

/// Creates the srdma QP of an `IBV_QPT_XRC_SEND` QP.
pub(super) fn create_send_qp(p: &Pd, init: &QpInit) -> Result<srdma::Qp, c_int> {
    let mut init = init.clone();
    init.qp_type = QpType::Rc;
    p.pd.create_xrc_send_qp(&init).map_err(|e| errno_of(&e))
}

/// The remote XRC SRQ of an `ibv_post_send` work request, for XRC_SEND QPs.
pub(super) fn remote_srqn(q: &Qp, w: &ibv_send_wr) -> Option<u32> {
    is_send(q.c.qp_base.qp_type).then_some(w.qp_type_xrc_remote_srqn)
}

/// `qp_ex->wr_set_xrc_srqn`.
pub(super) unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, remote_srqn: u32) {
    wr_last(qpx, |_, w| w.xrc_srqn = Some(remote_srqn));
}
