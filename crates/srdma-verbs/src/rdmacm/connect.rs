//! Connections: `rdma_connect`, `rdma_accept` (with and without a QP), `rdma_reject`,
//! `rdma_disconnect`, `rdma_init_qp_attr`, `rdma_establish` and the ECE calls.

use super::event::{event, with_conn, with_ud};
use super::thread::{cm_errno, failure, run_connection, run_job};
use super::*;

/// Connection options from the application's `rdma_conn_param` and `me`'s options.
fn options(
    me: &Id,
    param: *const rdma_conn_param,
    max_private: usize,
    peer: Option<PeerParams>,
) -> Result<ConnectOptions, c_int> {
    let (ack, ece) = {
        let st = lock(&me.sh.st);
        (st.ack_timeout, st.local_ece)
    };
    let mut o = options_ack(ack, param, max_private, peer)?;
    o.ece = ece;
    o.port_space = me.wire_ps();
    Ok(o)
}

/// Connection options from the application's `rdma_conn_param`, with the QP's ACK timeout
/// `ack` if the application set one (`RDMA_OPTION_ID_ACK_TIMEOUT`).
fn options_ack(
    ack: Option<u8>,
    param: *const rdma_conn_param,
    max_private: usize,
    peer: Option<PeerParams>,
) -> Result<ConnectOptions, c_int> {
    let mut o = ConnectOptions {
        timeout: CONNECT_TIMEOUT,
        // What kernel rdma_cm puts in a RoCE REQ as the local ACK timeout (the packet
        // lifetime it assumes for RoCE, 18, plus one: 19, 2.1 s; the REQ in
        // shared/pcaps/rdma_cm_rping.pcap). A passive rxe derives its QP's retransmission
        // timeout from it: with 14 (67 ms) a guest starved that long retransmitted a SEND
        // whose ACK was already waiting for it (dropin-send-lat-R-server, once in a CI run).
        ack_timeout: 19,
        // A client whose server is about to listen again (perftest -R's second connection;
        // Debian's perftest cannot retry it) is not lost to the race: our connect can be
        // faster than a kernel's, and faster than a server in a slow VM.
        unlisted_retry: Duration::from_secs(1),
        ..ConnectOptions::default()
    };
    if let Some(p) = peer {
        o.retry_cnt = p.retry_count.min(7);
    }
    if let Some(a) = ack {
        o.ack_timeout = a;
    }
    if param.is_null() {
        return Ok(o);
    }
    // SAFETY: the caller passes NULL or a valid rdma_conn_param.
    let p = unsafe { &*param };
    let n = usize::from(p.private_data_len);
    if n > max_private {
        return Err(libc::EINVAL);
    }
    if n > 0 {
        if p.private_data.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the application's private data, `n` bytes.
        o.private_data =
            unsafe { std::slice::from_raw_parts(p.private_data.cast::<u8>(), n) }.to_vec();
    }
    if p.responder_resources != RDMA_MAX_RESP_RES {
        o.responder_resources = p.responder_resources;
    }
    if p.initiator_depth != RDMA_MAX_INIT_DEPTH {
        o.initiator_depth = p.initiator_depth;
    }
    if peer.is_none() {
        o.retry_cnt = p.retry_count.min(7);
    }
    o.rnr_retry = p.rnr_retry_count.min(7);
    Ok(o)
}

/// Lets the peer READ, WRITE and do atomics on the QP, as kernel rdma_cm's INIT attributes
/// do when the side offers responder resources.
fn grant_remote_access(qp: *mut ibv_qp, responder_resources: u8) -> Result<(), c_int> {
    let mut flags = AccessFlags::REMOTE_WRITE;
    if responder_resources > 0 {
        flags |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    }
    let attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: flags,
        ..QpAttr::default()
    };
    match crate::verbs::modify_qp(qp, &attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `rdma_connect`: a REQ (SIDR_REQ for UD) to the resolved destination; ESTABLISHED, or
/// REJECTED / UNREACHABLE, follows.
///
/// # Safety
/// `id` NULL or live; `conn_param` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        let (dev, src, dst) = {
            let st = lock(&me.sh.st);
            if st.connecting || st.listening {
                return err(libc::EINVAL);
            }
            (st.dev, st.src, st.route_dst.or(st.dst))
        };
        let (Some(d), Some(src), Some(dst)) = (dev, src, dst) else {
            return err(libc::EINVAL);
        };
        let gsi = match cm_devs()[d].gsi() {
            Ok(g) => g,
            Err(e) => return err(e),
        };
        let idp = me.ptr() as usize;
        let sh = me.sh.clone();
        if me.is_ud() {
            let o = match options(me, conn_param, SIDR_REQ_PRIVATE, None) {
                Ok(o) => o,
                Err(e) => return err(e),
            };
            lock(&me.sh.st).connecting = true;
            let r = run_job(move || {
                let ev = match ibcm::sidr_resolve(&gsi, dst, src.port(), &o) {
                    Ok(rep) => with_ud(
                        event(idp, RDMA_CM_EVENT_ESTABLISHED, 0),
                        Some(rep.gid),
                        rep.qpn.value(),
                        rep.qkey,
                        &rep.private_data,
                    ),
                    Err(e) => failure(idp, &e, true),
                };
                sh.push(ev);
            });
            if let Err(e) = r {
                return err(e);
            }
            return me.complete();
        }
        if me.c.qp.is_null() {
            return connect_unmanaged(me, &gsi, src.port(), dst, conn_param);
        }
        let o = match options(me, conn_param, REQ_PRIVATE, None) {
            Ok(o) => o,
            Err(e) => return err(e),
        };
        let Some((qp, srq)) = crate::verbs::qp_of(me.c.qp) else {
            return err(libc::EINVAL);
        };
        if let Err(e) = grant_remote_access(me.c.qp, o.responder_resources) {
            return err(e);
        }
        // The REQ leaves from this thread; a CM worker waits for the REP.
        let connecting = match ibcm::start_connect(&gsi, &qp, dst, src.port(), srq, &o) {
            Ok(c) => c,
            Err(e) => return err(cm_errno(&e)),
        };
        lock(&me.sh.st).connecting = true;
        let r = run_job(move || {
            let r = connecting.finish();
            // The connection holds the QP until the application destroys it.
            drop(qp);
            match r {
                Ok(conn) => {
                    let ev = with_conn(
                        event(idp, RDMA_CM_EVENT_ESTABLISHED, 0),
                        &conn.peer_params(),
                        &conn.remote_private_data()
                            [..REP_PRIVATE.min(conn.remote_private_data().len())],
                    );
                    run_connection(sh, conn, Some(ev));
                }
                Err(e) => sh.push(failure(idp, &e, false)),
            }
        });
        if let Err(e) = r {
            return err(e);
        }
        me.complete()
    })
}

/// The transport of a connected id's QP.
fn conn_qp_type(me: &Id) -> srdma::QpType {
    if me.c.qp_type == IBV_QPT_UC {
        srdma::QpType::Uc
    } else {
        srdma::QpType::Rc
    }
}

/// `rdma_connect` on an id without a QP: the REQ names `conn_param->qp_num`, the REP brings
/// RDMA_CM_EVENT_CONNECT_RESPONSE (and the attributes for `rdma_init_qp_attr`), and
/// `rdma_establish` sends the RTU, as librdmacm does; the application moves its QP.
fn connect_unmanaged(
    me: &mut Id,
    gsi: &Gsi,
    src_port: u16,
    dst: SocketAddr,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    if conn_param.is_null() {
        return err(libc::EINVAL);
    }
    // SAFETY: valid per the caller's contract.
    let (qpn, srq) = unsafe { ((*conn_param).qp_num, (*conn_param).srq != 0) };
    if qpn == 0 || qpn > 0xFF_FFFF {
        return err(libc::EINVAL);
    }
    let o = match options(me, conn_param, REQ_PRIVATE, None) {
        Ok(o) => o,
        Err(e) => return err(e),
    };
    let qpn = srdma_wire::Qpn::new(qpn);
    let connecting =
        match ibcm::start_connect_unmanaged(gsi, qpn, conn_qp_type(me), dst, src_port, srq, &o) {
            Ok(c) => c,
            Err(e) => return err(cm_errno(&e)),
        };
    lock(&me.sh.st).connecting = true;
    let idp = me.ptr() as usize;
    let sh = me.sh.clone();
    let r = run_job(move || match connecting.wait_response() {
        Ok(resp) => {
            let data = resp.private_data();
            let ev = with_conn(
                event(idp, RDMA_CM_EVENT_CONNECT_RESPONSE, 0),
                &resp.peer_params(),
                &data[..REP_PRIVATE.min(data.len())],
            );
            {
                let mut st = lock(&sh.st);
                st.qp_attrs = Some(resp.qp_attrs());
                st.responded = Some(resp);
            }
            sh.push(ev);
        }
        Err(e) => sh.push(failure(idp, &e, false)),
    });
    if let Err(e) = r {
        return err(e);
    }
    me.complete()
}

/// `rdma_accept` on an id without a QP: the REP names `conn_param->qp_num`, which the
/// application moved to RTR first (`rdma_init_qp_attr`); ESTABLISHED follows the RTU.
fn accept_unmanaged(me: &mut Id, r: IbRequest, conn_param: *mut rdma_conn_param) -> c_int {
    // SAFETY: NULL or valid per the caller's contract.
    let qpn = (!conn_param.is_null()).then(|| unsafe { (*conn_param).qp_num });
    let Some(qpn) = qpn.filter(|&q| q != 0 && q <= 0xFF_FFFF) else {
        lock(&me.sh.st).request = Some(Pending::Conn(r));
        return err(libc::EINVAL);
    };
    let o = match options(me, conn_param, REP_PRIVATE, Some(r.peer_params())) {
        Ok(o) => o,
        Err(e) => {
            lock(&me.sh.st).request = Some(Pending::Conn(r));
            return err(e);
        }
    };
    let attrs = r.qp_attrs(conn_qp_type(me), &o);
    let accepting = match r.start_accept_unmanaged(srdma_wire::Qpn::new(qpn), &o) {
        Ok(a) => a,
        Err(e) => return err(cm_errno(&e)),
    };
    lock(&me.sh.st).qp_attrs = Some(attrs);
    wait_rtu(me, accepting, None)
}

/// The rest of `rdma_accept` once the REP is out: a CM worker waits for the RTU and reports
/// ESTABLISHED (or the failure). `qp`, the id's QP if it has one, is held until then.
fn wait_rtu(me: &mut Id, accepting: ibcm::Accepting, qp: Option<srdma::Qp>) -> c_int {
    lock(&me.sh.st).connecting = true;
    let idp = me.ptr() as usize;
    let sh = me.sh.clone();
    let r = run_job(move || {
        let r = accepting.finish();
        // The connection holds the QP until the application destroys it.
        drop(qp);
        match r {
            Ok(conn) => {
                let ev = event(idp, RDMA_CM_EVENT_ESTABLISHED, 0);
                run_connection(sh, conn, Some(ev));
            }
            Err(e) => sh.push(failure(idp, &e, false)),
        }
    });
    if let Err(e) = r {
        return err(e);
    }
    me.complete()
}

/// `rdma_accept`: for a connection request, the REP (the QP connected first) and, when the
/// RTU comes, ESTABLISHED; for a UD request, the SIDR_REP with the id's QP.
///
/// # Safety
/// `id` NULL or live; `conn_param` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        let req = lock(&me.sh.st).request.take();
        match req {
            Some(Pending::Sidr(r)) => {
                let qpn = if me.c.qp.is_null() {
                    if conn_param.is_null() {
                        return err(libc::EINVAL);
                    }
                    // SAFETY: valid per the contract.
                    unsafe { (*conn_param).qp_num }
                } else {
                    // SAFETY: a live QP of ours.
                    unsafe { (*me.c.qp).qp_num }
                };
                let o = match options(me, conn_param, SIDR_REP_PRIVATE, None) {
                    Ok(o) => o,
                    Err(e) => return err(e),
                };
                match r.accept(srdma_wire::Qpn::new(qpn), RDMA_UDP_QKEY, &o.private_data) {
                    Ok(()) => 0,
                    Err(_) => err(libc::EIO),
                }
            }
            Some(Pending::Conn(r)) => {
                if me.c.qp.is_null() {
                    return accept_unmanaged(me, r, conn_param);
                }
                let o = match options(me, conn_param, REP_PRIVATE, Some(r.peer_params())) {
                    Ok(o) => o,
                    Err(e) => {
                        lock(&me.sh.st).request = Some(Pending::Conn(r));
                        return err(e);
                    }
                };
                let Some((qp, _)) = crate::verbs::qp_of(me.c.qp) else {
                    return err(libc::EINVAL);
                };
                if let Err(e) = grant_remote_access(me.c.qp, o.responder_resources) {
                    return err(e);
                }
                // The REP leaves from this thread; a CM worker waits for the RTU.
                let accepting = match r.start_accept(&qp, &o) {
                    Ok(a) => a,
                    Err(e) => return err(cm_errno(&e)),
                };
                wait_rtu(me, accepting, Some(qp))
            }
            None => err(libc::EINVAL),
        }
    })
}

/// `rdma_reject`: a REJ (consumer defined, reason 28) with private data, or a SIDR_REP
/// with status 2 for UD.
///
/// # Safety
/// `id` NULL or live; `private_data` NULL or `private_data_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { reject(id, private_data, private_data_len, 28) }
}

/// `rdma_reject_ece`: as [`rdma_reject`], reason 35 (vendor option not supported).
///
/// # Safety
/// As [`rdma_reject`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // SAFETY: per the contract.
    unsafe { reject(id, private_data, private_data_len, 35) }
}

unsafe fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        let data = if data.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: `len` readable bytes per the contract.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }
        };
        let req = lock(&me.sh.st).request.take();
        let r = match req {
            Some(Pending::Conn(r)) => r.reject(reason, data),
            Some(Pending::Sidr(r)) => r.reject(ibcm::SIDR_REJECT, data),
            None => return err(libc::EINVAL),
        };
        match r {
            Ok(()) => 0,
            Err(CmError::PrivateDataTooLong(_)) => err(libc::EINVAL),
            Err(_) => err(libc::EIO),
        }
    })
}

/// `rdma_disconnect`: the QP to ERR, a DREQ; DISCONNECTED follows (at once if the peer
/// already disconnected).
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        {
            let mut st = lock(&me.sh.st);
            if !st.connecting {
                return err(libc::EINVAL);
            }
            if st.want_disconnect {
                return 0;
            }
            st.want_disconnect = true;
        }
        if !me.c.qp.is_null() {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            crate::verbs::modify_qp(me.c.qp, &attr, AttrMask::STATE);
        }
        // The DREQ leaves now, as the kernel sends it in the call: the process may exit
        // right after. The device's GSI thread waits for the DREP (and sends the DREQ
        // again).
        let conn = lock(&me.sh.st).conn.clone();
        if let Some(conn) = conn {
            let _ = conn.start_disconnect();
        }
        me.complete()
    })
}

/// `rdma_init_qp_attr`: the attributes kernel rdma_cm gives a QP for INIT, RTR and RTS
/// (RTR/RTS once the peer is known: a request to accept, a REP; EINVAL before, and for
/// other states).
///
/// # Safety
/// `id` NULL or live; `qp_attr` and `qp_attr_mask` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: valid per the contract.
        let a = unsafe { &mut *qp_attr };
        let rtr = a.qp_state == QpState::Rtr as u32;
        if rtr || a.qp_state == QpState::Rts as u32 {
            let (attr, mask) = match later_attrs(me, rtr) {
                Ok(am) => am,
                Err(e) => return err(e),
            };
            crate::verbs::qp_attr_to_c(&attr, a);
            // SAFETY: valid per the contract.
            unsafe { *qp_attr_mask = mask.bits() as c_int };
            return 0;
        }
        if a.qp_state != QpState::Init as u32 {
            return err(libc::EINVAL);
        }
        a.pkey_index = 0;
        a.port_num = 1;
        let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        if me.is_ud() {
            a.qkey = RDMA_UDP_QKEY;
            mask |= AttrMask::QKEY;
        } else {
            a.qp_access_flags =
                (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC)
                    .bits();
            mask |= AttrMask::ACCESS_FLAGS;
        }
        // SAFETY: valid per the contract.
        unsafe { *qp_attr_mask = mask.bits() as c_int };
        0
    })
}

/// The RTR (`rtr`) or RTS attributes of `me`'s connection, for `rdma_init_qp_attr`: UD's
/// as librdmacm sets them (the state; the send PSN 0 for RTS); a connected id's once its
/// peer is known (a request being accepted, a REP received), EINVAL before.
fn later_attrs(me: &Id, rtr: bool) -> Result<(QpAttr, AttrMask), c_int> {
    let i = if rtr { 0 } else { 1 };
    if me.is_ud() {
        let attr = QpAttr {
            qp_state: if rtr { QpState::Rtr } else { QpState::Rts },
            ..QpAttr::default()
        };
        let mask = if rtr {
            AttrMask::STATE
        } else {
            AttrMask::STATE | AttrMask::SQ_PSN
        };
        return Ok((attr, mask));
    }
    let st = lock(&me.sh.st);
    if let Some(a) = &st.qp_attrs {
        return Ok(a[i]);
    }
    match &st.request {
        Some(Pending::Conn(r)) => {
            let o = options_ack(
                st.ack_timeout,
                std::ptr::null(),
                REP_PRIVATE,
                Some(r.peer_params()),
            )?;
            Ok(r.qp_attrs(conn_qp_type(me), &o)[i])
        }
        _ => Err(libc::EINVAL),
    }
}

/// `rdma_establish`: after CONNECT_RESPONSE on an id without a QP (the application moved
/// its QP to RTR and RTS), the RTU; the passive side then reports ESTABLISHED. EINVAL on an
/// id with a QP or without a response.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if !me.c.qp.is_null() {
            return err(libc::EINVAL);
        }
        let Some(resp) = lock(&me.sh.st).responded.take() else {
            return err(libc::EINVAL);
        };
        let conn = match resp.establish() {
            Ok(c) => c,
            Err(e) => return err(cm_errno(&e)),
        };
        let sh = me.sh.clone();
        match run_job(move || run_connection(sh, conn, None)) {
            Ok(()) => 0,
            Err(e) => err(e),
        }
    })
}

/// `rdma_set_local_ece`: the ECE options the REQ offers or the REP accepts for a QP the
/// application moves itself (an id with a QP offers the QP's own). 0, or -1 with EINVAL
/// (`id` not live or with a QP, `ece` NULL, unknown `comp_mask` bits).
///
/// # Safety
/// `id` NULL or live; `ece` NULL or a valid `struct ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if !me.c.qp.is_null() || ece.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: valid per the contract.
        let e = unsafe { &*ece };
        if e.comp_mask != 0 {
            return err(libc::EINVAL);
        }
        lock(&me.sh.st).local_ece = srdma::Ece {
            vendor_id: e.vendor_id,
            options: e.options,
        };
        0
    })
}

/// `rdma_get_remote_ece`: the ECE options of the peer's REQ (a connection request's id) or
/// REP (an active id whose REP came); zeroes before either. 0, or -1 with EINVAL (`id` not
/// live or with a QP, `ece` NULL).
///
/// # Safety
/// `id` NULL or live; `ece` NULL or writable for a `struct ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if !me.c.qp.is_null() || ece.is_null() {
            return err(libc::EINVAL);
        }
        let remote = {
            let st = lock(&me.sh.st);
            match (&st.request, &st.responded) {
                (Some(Pending::Conn(r)), _) => r.peer_ece(),
                (_, Some(r)) => r.peer_ece(),
                _ => srdma::Ece::default(),
            }
        };
        // SAFETY: writable per the contract.
        unsafe {
            *ece = ibv_ece {
                vendor_id: remote.vendor_id,
                options: remote.options,
                comp_mask: 0,
            }
        };
        0
    })
}
