//! Event channels and events: the queue behind a channel, the events the CM threads post,
//! and `rdma_create_event_channel`, `rdma_destroy_event_channel`, `rdma_get_cm_event`,
//! `rdma_ack_cm_event`, `rdma_event_str`.

use super::*;

pub(super) fn event(id: usize, kind: rdma_cm_event_type, status: c_int) -> Box<Event> {
    // SAFETY: rdma_cm_event is plain C data; all zeroes is valid (NULL pointers).
    let mut ev = Box::new(Event {
        c: unsafe { std::mem::zeroed() },
        data: [0; 256],
        attach: None,
    });
    ev.c.id = id as *mut rdma_cm_id;
    ev.c.event = kind;
    ev.c.status = status;
    ev
}

/// Connected-QP parameters and private data.
pub(super) fn with_conn(mut ev: Box<Event>, p: &PeerParams, data: &[u8]) -> Box<Event> {
    let n = data.len().min(255);
    ev.data[..n].copy_from_slice(&data[..n]);
    // SAFETY: writing the `conn` member of the (zeroed) union.
    let c = unsafe { &mut ev.c.param.conn };
    c.private_data = if n > 0 {
        ev.data.as_ptr().cast()
    } else {
        std::ptr::null()
    };
    c.private_data_len = n as u8;
    c.responder_resources = p.responder_resources;
    c.initiator_depth = p.initiator_depth;
    c.flow_control = u8::from(p.flow_control);
    c.retry_count = p.retry_count;
    c.rnr_retry_count = p.rnr_retry_count;
    c.srq = u8::from(p.srq);
    c.qp_num = p.qpn;
    ev
}

/// UD parameters (`ah` toward `gid`, when known) and private data.
pub(super) fn with_ud(
    mut ev: Box<Event>,
    gid: Option<Gid>,
    qpn: u32,
    qkey: u32,
    data: &[u8],
) -> Box<Event> {
    let n = data.len().min(255);
    ev.data[..n].copy_from_slice(&data[..n]);
    let p = ev.data.as_ptr().cast();
    // SAFETY: writing the `ud` member of the (zeroed) union.
    let u = unsafe { &mut ev.c.param.ud };
    u.private_data = if n > 0 { p } else { std::ptr::null() };
    u.private_data_len = n as u8;
    if let Some(g) = gid {
        u.ah_attr.grh.dgid.raw = g.0;
        u.ah_attr.grh.hop_limit = 64;
        u.ah_attr.is_global = 1;
        u.ah_attr.port_num = 1;
    }
    u.qp_num = qpn;
    u.qkey = qkey;
    ev
}

/// The queue behind `channel`, if it is a live one of ours.
pub(super) fn queue_of(channel: *mut rdma_event_channel) -> Option<Arc<Queue>> {
    // SAFETY: live channels are `Channel`s (repr(C), `c` first).
    crate::is_live(channel).then(|| unsafe { (*channel.cast::<Channel>()).q.clone() })
}

pub(super) fn new_channel() -> Result<*mut rdma_event_channel, c_int> {
    let q = Queue::new()?;
    let ch = Box::into_raw(Box::new(Channel {
        c: rdma_event_channel {
            fd: q.fd.as_raw_fd(),
        },
        q,
    }));
    crate::register(ch);
    Ok(ch.cast())
}

/// What happens as the application takes event `ev` (librdmacm's `ucma_process_join`): a
/// full member's MULTICAST_JOIN attaches the id's QP, if it has one by then, to the group;
/// when that fails the event becomes MULTICAST_ERROR with status -errno.
pub(super) fn taken(ev: &mut Event) {
    let Some(gid) = ev.attach.take() else {
        return;
    };
    // SAFETY: the queue forgets a destroyed id's events, so `id` is live or not ours.
    let Some(me) = (unsafe { id_of(ev.c.id) }) else {
        return;
    };
    if me.c.qp.is_null() {
        return;
    }
    let g = ibv_gid { raw: gid.0 };
    // SAFETY: the id's live QP and a live GID.
    let e = unsafe { crate::verbs::ibv_attach_mcast(me.c.qp, &g, 0) };
    if e != 0 {
        ev.c.event = RDMA_CM_EVENT_MULTICAST_ERROR;
        ev.c.status = -e;
    }
}

pub(super) fn free_event(ev: *mut rdma_cm_event) {
    if crate::unregister(ev) {
        // SAFETY: live events were leaked from a Box<Event>; unregistered now, freed once.
        drop(unsafe { Box::from_raw(ev.cast::<Event>()) });
    }
}

/// `rdma_create_event_channel`: a channel whose `fd` polls readable while events wait.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || match new_channel() {
        Ok(c) => c,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// `rdma_destroy_event_channel`. Events still queued are freed.
///
/// # Safety
/// `channel` is NULL or a channel of this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        if !channel.is_null() && crate::unregister(channel) {
            // SAFETY: live channels were leaked from a Box<Channel>; unregistered now.
            drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        }
    })
}

/// `rdma_get_cm_event`: the channel's next event (waits, unless the channel's fd is
/// non-blocking: EAGAIN).
///
/// The wait is a read(2) of the channel's eventfd, as rdma-core's is a read of the kernel's
/// channel, and like it a cancellation point: `pthread_cancel` ends a thread waiting here (see
/// `signals`: the read is made outside the panic boundary, from this frame, which holds
/// nothing to drop).
///
/// # Safety
/// `channel` NULL or live; `event` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    let fd = guard(err(libc::EIO), || {
        crate::signals::without_cancellation(|| {
            let Some(q) = queue_of(channel) else {
                return err(libc::EINVAL);
            };
            if event.is_null() {
                return err(libc::EINVAL);
            }
            q.fd.as_raw_fd()
        })
    });
    if fd < 0 {
        return -1;
    }
    loop {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from the channel's eventfd (the
        // application destroys a channel only after its waits end, as with rdma-core).
        let r = unsafe { crate::signals::cancellable_read(fd, (&raw mut n).cast(), 8) };
        if r != 8 {
            // read(2)'s errno: EAGAIN for a non-blocking channel, EINTR for a signal.
            return -1;
        }
        // 1: the count was stale (the event's id was destroyed meanwhile); wait again.
        let got = guard(err(libc::EIO), || {
            crate::signals::without_cancellation(|| {
                let Some(q) = queue_of(channel) else {
                    return err(libc::EINVAL);
                };
                let Some(mut ev) = q.pop() else {
                    return 1;
                };
                taken(&mut ev);
                let p = Box::into_raw(ev);
                crate::register(p.cast::<rdma_cm_event>());
                // SAFETY: writable per the contract.
                unsafe { *event = p.cast() };
                0
            })
        });
        if got != 1 {
            return got;
        }
    }
}

/// `rdma_ack_cm_event`: frees an event.
///
/// # Safety
/// `event` NULL or an event of this library, acknowledged once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(err(libc::EIO), || {
        if !crate::is_live(event) {
            return err(libc::EINVAL);
        }
        free_event(event);
        0
    })
}

/// `rdma_event_str`: the event's name.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let s: &'static CStr = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}
