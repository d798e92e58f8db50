//! Queue pairs: create (and `_ex` with the `ibv_wr_*` API), modify, query, destroy,
//! multicast, the send and receive data path, and what librdmacm needs of them.

use super::*;

/// An `ibv_qp`.
#[repr(C)]
pub(super) struct Qp {
    pub(super) c: ibv_qp_ex,
    pub(super) qp: srdma::Qp,
    pub(super) caps: QpCaps,
    pub(super) sq_sig_all: bool,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex` gives the `ibv_wr_*`
    /// API.
    pub(super) ex: bool,
    /// The work requests between `ibv_wr_start` and `ibv_wr_complete`.
    pub(super) batch: Mutex<Vec<SendWr>>,
    /// An `ibv_wr_*` call of this batch had arguments no WR can be made of (they return
    /// nothing): `ibv_wr_complete` refuses the batch with EINVAL.
    pub(super) batch_refused: std::sync::atomic::AtomicBool,
}

impl Qp {
    /// A QP's box, its `ibv_wr_*` batch empty.
    pub(super) fn new(c: ibv_qp_ex, qp: srdma::Qp, caps: QpCaps, sq_sig_all: bool, ex: bool) -> Qp {
        Qp {
            c,
            qp,
            caps,
            sq_sig_all,
            ex,
            batch: Mutex::new(Vec::new()),
            batch_refused: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

pub(super) fn qp_type(t: ibv_qp_type) -> Result<QpType, c_int> {
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

pub(super) fn create_qp(
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
    let boxed: *mut Qp = hand_out(Qp::new(c, qp, got, a.sq_sig_all != 0, ex));
    pd_users(pd, 1);
    // SAFETY: the PD's context is open.
    if let Some(ctx) = unsafe { Context::from_c(p.c.context) } {
        lock(&ctx.sink.qps).insert(qpn, boxed as usize);
    }
    Ok(boxed.cast())
}

pub(super) fn mtu(v: u32) -> Result<srdma::Mtu, c_int> {
    srdma::Mtu::from_u32(v).ok_or(libc::EINVAL)
}

pub(super) fn qp_state(v: u32) -> Result<QpState, c_int> {
    QpState::from_u32(v).ok_or(libc::EINVAL)
}

/// The srdma form of an `ibv_modify_qp` call.
pub(super) fn qp_attr(a: &ibv_qp_attr, mask: u32) -> Result<(QpAttr, AttrMask), c_int> {
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
        // A source GID the port does not hold fails here, as in the kernel, not later on
        // the wire.
        if m.contains(AttrMask::AV) && a.ah_attr.is_global {
            // SAFETY: a live QP's context is open.
            let ctx = unsafe { Context::from_c(q.c.qp_base.context) };
            if let Some(e) =
                ctx.and_then(|c| crate::context::sgid_index_errno(c, a.ah_attr.sgid_index))
            {
                return e;
            }
        }
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
/// attached to a multicast group is not destroyed: EBUSY, as the kernel answers. As in
/// rdma-core, async events naming the QP that were not taken are dropped, and the call
/// waits until those taken are acknowledged (`ibv_ack_async_event`).
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
            ctx.sink.forget(qp as usize);
        }
        pd_users(q.c.qp_base.pd, -1);
        // An rdma_cm connection over this QP lets go of it too.
        qp_destroyed(q.c.qp_base.qp_num);
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
pub(super) unsafe fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
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

pub(super) fn fill_wr_ops(c: &mut ibv_qp_ex) {
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
pub(super) fn with_qpx<T: Default>(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &ibv_qp_ex) -> T) -> T {
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
pub(super) fn wr_push(qpx: *mut ibv_qp_ex, op: SendOp) {
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
pub(super) fn wr_last(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut SendWr)) {
    with_qpx(qpx, |q, _| {
        if let Some(w) = lock(&q.batch).last_mut() {
            f(q, w);
        }
    });
}

pub(super) unsafe extern "C" fn wr_atomic_cmp_swp(
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
pub(super) unsafe extern "C" fn wr_atomic_fetch_add(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    add: u64,
) {
    wr_push(
        qpx,
        SendOp::FetchAdd {
            remote_addr: addr,
            rkey: RKey(rkey),
            add,
        },
    );
}
pub(super) unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    wr_push(
        qpx,
        SendOp::Read {
            remote_addr: addr,
            rkey: RKey(rkey),
        },
    );
}
pub(super) unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    wr_push(
        qpx,
        SendOp::Write {
            remote_addr: addr,
            rkey: RKey(rkey),
        },
    );
}
pub(super) unsafe extern "C" fn wr_rdma_write_imm(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    imm: u32,
) {
    wr_push(
        qpx,
        SendOp::WriteWithImm {
            remote_addr: addr,
            rkey: RKey(rkey),
            imm: u32::from_be(imm),
        },
    );
}
pub(super) unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    wr_push(qpx, SendOp::Send);
}
pub(super) unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    wr_push(
        qpx,
        SendOp::SendWithImm {
            imm: u32::from_be(imm),
        },
    );
}
pub(super) unsafe extern "C" fn wr_set_ud_addr(
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
pub(super) unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    wr_last(qpx, |_, w| {
        w.sges = SgeList::one(Sge {
            addr,
            length,
            lkey: srdma::LKey(lkey),
        });
    });
}
pub(super) unsafe extern "C" fn wr_set_sge_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_sge,
) {
    // SAFETY: the application's `n` entries.
    let sges = unsafe { sge_list(list, c_int::try_from(n).unwrap_or(0)) };
    wr_last(qpx, |_, w| w.sges = sges.map(|s| sge(&s)).collect());
}
/// Copies inline data at once, as `ibv_wr_set_inline_data` requires.
pub(super) fn wr_inline(qpx: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
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
pub(super) unsafe extern "C" fn wr_set_inline_data(
    qpx: *mut ibv_qp_ex,
    addr: *mut c_void,
    length: usize,
) {
    wr_inline(qpx, &[(addr.cast_const().cast(), length)]);
}
pub(super) unsafe extern "C" fn wr_set_inline_data_list(
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
/// Empties the batch (`ibv_wr_start`, `ibv_wr_abort`).
fn wr_reset(qpx: *mut ibv_qp_ex) {
    with_qpx(qpx, |q, _| {
        lock(&q.batch).clear();
        q.batch_refused.store(false, Ordering::Relaxed);
    });
}
pub(super) unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    wr_reset(qpx);
}
pub(super) unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    wr_reset(qpx);
}
/// `ibv_wr_complete`: posts the batch (0, or the errno of the first WR refused).
pub(super) unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    with_qpx(qpx, |q, _| {
        let wrs = std::mem::take(&mut *lock(&q.batch));
        if q.batch_refused.swap(false, Ordering::Relaxed) {
            return libc::EINVAL;
        }
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
pub(super) fn send_wr(q: &Qp, w: &ibv_send_wr) -> Result<SendWr, c_int> {
    if w.num_sge < 0 || (w.num_sge > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the application's `num_sge` entries (checked non-null).
    let list = unsafe { sge_list(w.sg_list, w.num_sge) };
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
        let total: usize = list.clone().map(|s| s.length as usize).sum();
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
        wr.sges = list.map(|s| sge(&s)).collect();
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
pub(super) unsafe extern "C" fn post_send(
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
            // SAFETY: the application's list; nodes readable until `next` is NULL (copied
            // out without assuming alignment).
            let w = &unsafe { cur.read_unaligned() };
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
pub(super) unsafe extern "C" fn post_recv(
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

/// `ibv_query_ece`: the QP's enhanced connection establishment options — srdma's selective
/// repeat offered by an RC QP (vendor 0x025352, option 1), or what `ibv_set_ece` agreed;
/// zeroes for other QP types. 0, or EINVAL (`qp` not a live QP, `ece` NULL).
///
/// # Safety
/// `qp` NULL or live; `ece` NULL or writable for a `struct ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if ece.is_null() {
            return libc::EINVAL;
        }
        let e = q.qp.query_ece();
        // SAFETY: writable per the contract.
        unsafe {
            *ece = ibv_ece {
                vendor_id: e.vendor_id,
                options: e.options,
                comp_mask: 0,
            }
        };
        0
    })
}

/// `ibv_set_ece`: the peer's options (from the CM's REQ or REP), before RTS; `*ece` is
/// rewritten with what is agreed — srdma's selective repeat when both ends offer it,
/// nothing for another vendor's options (never echoed as accepted). 0, or EINVAL (`qp`
/// not a live QP, `ece` NULL, unknown `comp_mask` bits, or the QP already in RTS).
///
/// # Safety
/// `qp` NULL or live; `ece` NULL or a valid, writable `struct ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(q) = (unsafe { back::<Qp, _>(qp) }) else {
            return libc::EINVAL;
        };
        if ece.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: valid per the contract.
        let c = unsafe { &mut *ece };
        if c.comp_mask != 0 {
            return libc::EINVAL;
        }
        let peer = srdma::Ece {
            vendor_id: c.vendor_id,
            options: c.options,
        };
        match q.qp.set_ece(peer) {
            Ok(agreed) => {
                c.vendor_id = agreed.vendor_id;
                c.options = agreed.options;
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

// ---------------------------------------------------------------------------------------
// For librdmacm, which drives QPs it did not create through srdma.

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
