//! The verbs objects of an id: `rdma_create_qp`/`rdma_create_qp_ex`, `rdma_destroy_qp`,
//! the SRQ calls, and the endpoints (`rdma_create_ep`, `rdma_get_request`,
//! `rdma_destroy_ep`).

use super::event::free_event;
use super::id::{new_id, rdma_bind_addr, rdma_destroy_id, rdma_resolve_addr, rdma_resolve_route};
use super::multicast::detach;
use super::*;

/// `rdma_create_qp_ex`: a QP on the id's device (CQs with completion channels of their own
/// when the attributes name none), moved to INIT (UD: to RTS with rdma_cm's Q_Key).
///
/// # Safety
/// `id` NULL or live; `attr` NULL or valid for reading and writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if attr.is_null() || !me.c.qp.is_null() || me.c.verbs.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: valid per the contract.
        let a = unsafe { &mut *attr };
        match create_qp(me, a) {
            Ok(()) => 0,
            Err(e) => err(e),
        }
    })
}

fn create_qp(me: &mut Id, a: &mut ibv_qp_init_attr_ex) -> Result<(), c_int> {
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        a.pd = me.c.pd;
    }
    if a.pd.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the PD is one of ours (checked again by create_qp_ex).
    if crate::is_live(a.pd) && unsafe { (*a.pd).context } != me.c.verbs {
        return Err(libc::EINVAL);
    }
    let own_cqs = create_cqs(
        me,
        if a.send_cq.is_null() {
            a.cap.max_send_wr
        } else {
            0
        },
        if a.recv_cq.is_null() {
            a.cap.max_recv_wr
        } else {
            0
        },
    );
    if let Err(e) = own_cqs {
        destroy_cqs(me);
        return Err(e);
    }
    if a.send_cq.is_null() {
        a.send_cq = me.c.send_cq;
    }
    if a.recv_cq.is_null() {
        a.recv_cq = me.c.recv_cq;
    }
    if a.srq.is_null() {
        a.srq = me.c.srq;
    }
    // SAFETY: the context is open, `a` a valid attribute block.
    let qp = unsafe { crate::verbs::vctx_create_qp_ex(me.c.verbs, a) };
    if qp.is_null() {
        let e = errno();
        destroy_cqs(me);
        return Err(e);
    }
    let mut init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let r = if me.is_ud() {
        init.qkey = RDMA_UDP_QKEY;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        };
        let m = AttrMask::STATE;
        match crate::verbs::modify_qp(
            qp,
            &init,
            m | AttrMask::QKEY | AttrMask::PKEY_INDEX | AttrMask::PORT,
        ) {
            0 => match crate::verbs::modify_qp(qp, &rtr, m) {
                0 => crate::verbs::modify_qp(qp, &rts, m | AttrMask::SQ_PSN),
                e => e,
            },
            e => e,
        }
    } else {
        crate::verbs::modify_qp(
            qp,
            &init,
            AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT,
        )
    };
    if r != 0 {
        // SAFETY: the QP just created.
        unsafe { crate::verbs::ibv_destroy_qp(qp) };
        destroy_cqs(me);
        return Err(r);
    }
    // SAFETY: the QP just created.
    me.c.pd = unsafe { (*qp).pd };
    me.c.qp = qp;
    Ok(())
}

fn create_cqs(me: &mut Id, send: u32, recv: u32) -> Result<(), c_int> {
    let ctx = me.c.verbs;
    let cq_context: *mut c_void = (&raw mut me.c).cast();
    let make = |size: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        // SAFETY: the id's open context.
        let chan = unsafe { crate::verbs::ibv_create_comp_channel(ctx) };
        if chan.is_null() {
            return Err(errno());
        }
        // SAFETY: the open context and the channel just created.
        let cq = unsafe { crate::verbs::ibv_create_cq(ctx, size as c_int, cq_context, chan, 0) };
        if cq.is_null() {
            let e = errno();
            // SAFETY: the channel just created, unused.
            unsafe { crate::verbs::ibv_destroy_comp_channel(chan) };
            return Err(e);
        }
        Ok((chan, cq))
    };
    if recv > 0 {
        (me.c.recv_cq_channel, me.c.recv_cq) = make(recv)?;
    }
    if send > 0 {
        (me.c.send_cq_channel, me.c.send_cq) = make(send)?;
    }
    Ok(())
}

/// Destroys the CQs and channels `create_cqs` made (librdmacm's `ucma_destroy_cqs`).
fn destroy_cqs(me: &mut Id) {
    // SAFETY: NULL or objects this id created; each destroyed once and cleared.
    unsafe {
        if !me.c.recv_cq.is_null() {
            crate::verbs::ibv_destroy_cq(me.c.recv_cq);
            if !me.c.send_cq.is_null() && me.c.send_cq != me.c.recv_cq {
                crate::verbs::ibv_destroy_cq(me.c.send_cq);
            }
        } else if !me.c.send_cq.is_null() {
            crate::verbs::ibv_destroy_cq(me.c.send_cq);
        }
        for ch in [me.c.recv_cq_channel, me.c.send_cq_channel] {
            if !ch.is_null() {
                crate::verbs::ibv_destroy_comp_channel(ch);
            }
        }
    }
    me.c.recv_cq = std::ptr::null_mut();
    me.c.send_cq = std::ptr::null_mut();
    me.c.recv_cq_channel = std::ptr::null_mut();
    me.c.send_cq_channel = std::ptr::null_mut();
}

/// `rdma_create_qp`: [`rdma_create_qp_ex`] with `pd` (NULL: the id's); `qp_init_attr`
/// gets the capacities the QP got.
///
/// # Safety
/// `id` NULL or live; `pd` NULL or live; `qp_init_attr` NULL or valid for reading and
/// writing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(err(libc::EIO), || {
        if qp_init_attr.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: ibv_qp_init_attr_ex is plain C data; all zeroes is valid.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: readable per the contract.
        let a = unsafe { &mut *qp_init_attr };
        ex.qp_context = a.qp_context;
        ex.send_cq = a.send_cq;
        ex.recv_cq = a.recv_cq;
        ex.srq = a.srq;
        ex.cap = a.cap;
        ex.qp_type = a.qp_type;
        ex.sq_sig_all = a.sq_sig_all;
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        ex.pd = pd;
        // SAFETY: per the contract.
        let r = unsafe { rdma_create_qp_ex(id, &mut ex) };
        a.send_cq = ex.send_cq;
        a.recv_cq = ex.recv_cq;
        a.srq = ex.srq;
        a.cap = ex.cap;
        r
    })
}

/// `rdma_destroy_qp`: the id's QP, and the CQs `rdma_create_qp` made for it.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return;
        };
        if !me.c.qp.is_null() {
            // The groups the id joined let go of the QP first: rdma-core leaves it attached
            // and its destroy fails (EBUSY), leaking it.
            let joined: Vec<IpAddr> = lock(&me.sh.st)
                .joined
                .iter()
                .filter(|j| !j.send_only)
                .map(|j| j.ip)
                .collect();
            for ip in joined {
                detach(me.c.qp, ip);
            }
            // SAFETY: the id's live QP.
            unsafe { crate::verbs::ibv_destroy_qp(me.c.qp) };
            me.c.qp = std::ptr::null_mut();
        }
        destroy_cqs(me);
    })
}

/// `rdma_create_srq`: an SRQ on the id's PD (or `pd`), used by the QP created next.
///
/// # Safety
/// `id` NULL or live; `pd` NULL or live; `attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if attr.is_null() || !me.c.srq.is_null() {
            return err(libc::EINVAL);
        }
        let pd = if pd.is_null() { me.c.pd } else { pd };
        // SAFETY: per the contract; the PD is checked by ibv_create_srq.
        let srq = unsafe { crate::verbs::ibv_create_srq(pd, attr) };
        if srq.is_null() {
            return -1;
        }
        me.c.srq = srq;
        me.c.pd = pd;
        0
    })
}

/// `rdma_create_srq_ex`: [`rdma_create_srq`] from the extended attributes, for a basic SRQ
/// (the PD from `attr->pd` when `IBV_SRQ_INIT_ATTR_PD` says so, else the id's); XRC and
/// tag-matching SRQs are not supported (EOPNOTSUPP), as `ibv_create_srq_ex` is not.
///
/// # Safety
/// `id` NULL or live; `attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        if attr.is_null() || unsafe { id_of(id) }.is_none() {
            return err(libc::EINVAL);
        }
        // SAFETY: valid per the contract.
        let a = unsafe { &*attr };
        let known = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC)
        {
            return err(libc::EOPNOTSUPP);
        }
        let pd = if a.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        let mut basic = ibv_srq_init_attr {
            srq_context: a.srq_context,
            attr: ibv_srq_attr {
                max_wr: a.attr.max_wr,
                max_sge: a.attr.max_sge,
                srq_limit: a.attr.srq_limit,
            },
        };
        // SAFETY: per the contract; `basic` lives across the call.
        let r = unsafe { rdma_create_srq(id, pd, &raw mut basic) };
        // SAFETY: valid per the contract: the limits ibv_create_srq granted, as there.
        unsafe {
            (*attr).attr.max_wr = basic.attr.max_wr;
            (*attr).attr.max_sge = basic.attr.max_sge;
        }
        r
    })
}

/// `rdma_destroy_srq`.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return;
        };
        if !me.c.srq.is_null() {
            // SAFETY: the id's live SRQ.
            unsafe { crate::verbs::ibv_destroy_srq(me.c.srq) };
            me.c.srq = std::ptr::null_mut();
        }
    })
}

/// `rdma_get_request`: the next connection request on a synchronous listening id, with
/// the QP `rdma_create_ep` asked for already created.
///
/// # Safety
/// `listen` NULL or live; `id` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(listen) }) else {
            return err(libc::EINVAL);
        };
        if id.is_null() || !me.sh.sync.load(Ordering::Acquire) {
            return err(libc::EINVAL);
        }
        if !me.c.event.is_null() {
            free_event(me.c.event);
            me.c.event = std::ptr::null_mut();
        }
        let q = lock(&me.sh.queue).clone();
        let ev = match q.take() {
            Ok(ev) => ev,
            Err(e) => return err(e),
        };
        let (kind, status, new) = (ev.c.event, ev.c.status, ev.c.id);
        let p = Box::into_raw(ev);
        crate::register(p.cast::<rdma_cm_event>());
        if kind == RDMA_CM_EVENT_REJECTED {
            me.c.event = p.cast();
            return err(libc::ECONNREFUSED);
        }
        if status != 0 || kind != RDMA_CM_EVENT_CONNECT_REQUEST {
            me.c.event = p.cast();
            return err(if status != 0 {
                status.abs()
            } else {
                libc::EINVAL
            });
        }
        let attr = lock(&me.local).qp_init_attr;
        if let Some(mut attr) = attr {
            // SAFETY: `new` is the request's live id; `attr` a local copy.
            let r = unsafe { rdma_create_qp(new, me.c.pd, &mut attr) };
            if r != 0 {
                me.c.event = p.cast();
                return r;
            }
        }
        // SAFETY: `new` is live (created with the event); `id` writable per the contract.
        unsafe {
            (*new).event = p.cast();
            *id = new;
        }
        0
    })
}

/// `rdma_create_ep`: a synchronous id from `rdma_getaddrinfo`'s result: bound (passive;
/// `qp_init_attr` kept for each request) or resolved with its QP (active).
///
/// # Safety
/// `id` valid for a write; `res` valid; `pd` NULL or live; `qp_init_attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(err(libc::EIO), || {
        if id.is_null() || res.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: valid per the contract.
        let r = unsafe { &*res };
        let ps = if r.ai_port_space == 0 {
            RDMA_PS_TCP
        } else {
            r.ai_port_space as rdma_port_space
        };
        let qp_type = if r.ai_qp_type == 0 {
            IBV_QPT_RC
        } else {
            r.ai_qp_type as ibv_qp_type
        };
        let p = match new_id(std::ptr::null_mut(), std::ptr::null_mut(), ps, qp_type) {
            Ok(p) => p,
            Err(e) => return err(e),
        };
        // SAFETY: just created.
        let cm = unsafe { &mut *p }.ptr();
        // SAFETY: the id just created and the caller's valid arguments.
        let ret = unsafe { create_ep(cm, r, pd, qp_init_attr) };
        if ret != 0 {
            let e = errno();
            // SAFETY: the id just created.
            unsafe { rdma_destroy_ep(cm) };
            return err(e);
        }
        // SAFETY: writable per the contract.
        unsafe { *id = cm };
        0
    })
}

unsafe fn create_ep(
    id: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: per the contract.
        let ret = unsafe { rdma_bind_addr(id, r.ai_src_addr) };
        if ret != 0 {
            return ret;
        }
        // SAFETY: live, created by the caller.
        let me = unsafe { id_of(id) }.expect("live");
        if !pd.is_null() {
            me.c.pd = pd;
        }
        if !qp_init_attr.is_null() {
            // SAFETY: readable per the contract.
            let mut a = unsafe { *qp_init_attr };
            a.qp_type = r.ai_qp_type as ibv_qp_type;
            lock(&me.local).qp_init_attr = Some(a);
        }
        return 0;
    }
    // SAFETY: per the contract.
    let mut ret = unsafe { rdma_resolve_addr(id, r.ai_src_addr, r.ai_dst_addr, 2000) };
    if ret == 0 {
        // SAFETY: live.
        ret = unsafe { rdma_resolve_route(id, 2000) };
    }
    if ret == 0 && !qp_init_attr.is_null() {
        // SAFETY: valid per the contract.
        unsafe { (*qp_init_attr).qp_type = r.ai_qp_type as ibv_qp_type };
        // SAFETY: live id, valid attributes.
        ret = unsafe { rdma_create_qp(id, pd, qp_init_attr) };
    }
    ret
}

/// `rdma_destroy_ep`: the id's QP, SRQ and the id.
///
/// # Safety
/// `id` NULL or live, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: per the contract.
        unsafe {
            rdma_destroy_qp(id);
            rdma_destroy_srq(id);
            rdma_destroy_id(id);
        }
    })
}
