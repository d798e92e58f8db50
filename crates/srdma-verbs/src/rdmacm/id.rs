//! Identifiers: `rdma_create_id`, `rdma_destroy_id`, `rdma_bind_addr`, address and route
//! resolution, `rdma_listen`, `rdma_migrate_id`, `rdma_set_option`, `rdma_notify`, and the
//! ports of an id.

use super::event::{event, free_event, new_channel, queue_of, rdma_destroy_event_channel};
use super::thread::{
    Holder, adopt_lingering, listen_loop, prepare_workers, spawn, start_lingering,
};
use super::*;

/// A new id on `channel` (NULL: synchronous, with a channel of its own).
pub(super) fn new_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> Result<*mut Id, c_int> {
    let (channel, own) = if channel.is_null() {
        let ch = new_channel()?;
        (ch, ch as usize)
    } else {
        (channel, 0)
    };
    let q = queue_of(channel).ok_or(libc::EINVAL)?;
    // SAFETY: rdma_cm_id is plain C data; all zeroes is valid.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = qp_type;
    c.port_num = 1;
    let id = Box::into_raw(Box::new(Id {
        c,
        sh: Arc::new(Shared {
            id: 0,
            context: context as usize,
            channel: std::sync::atomic::AtomicUsize::new(channel as usize),
            ps,
            qp_type,
            queue: Mutex::new(q),
            sync: AtomicBool::new(own != 0),
            closed: AtomicBool::new(false),
            st: Mutex::new(State::default()),
        }),
        local: Mutex::new(Local {
            qp_init_attr: None,
            path: None,
            own_channel: own,
        }),
    }));
    // SAFETY: just allocated; nobody else holds the Arc yet.
    unsafe {
        Arc::get_mut(&mut (*id).sh).expect("fresh").id = id as usize;
    }
    crate::register(id.cast::<rdma_cm_id>());
    Ok(id)
}

/// `rdma_create_id`: an id in port space `ps` (TCP and IB: RC; UDP and IPoIB: UD) on
/// `channel` (NULL: synchronous).
///
/// # Safety
/// `id` is valid for a write; `channel` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        prepare_workers();
        if id.is_null() || (!channel.is_null() && queue_of(channel).is_none()) {
            return err(libc::EINVAL);
        }
        let qp_type = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
            _ => return err(libc::EINVAL),
        };
        match new_id(channel, context, ps, qp_type) {
            Ok(p) => {
                // SAFETY: writable per the contract.
                unsafe { *id = p.cast() };
                0
            }
            Err(e) => err(e),
        }
    })
}

/// `rdma_destroy_id`: stops its listens, disconnects its connection (a DREQ, as the kernel
/// sends one), and frees it. Its events not yet taken are dropped.
///
/// # Safety
/// `id` is NULL or a live id, destroyed once; its QP destroyed first.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        crate::unregister(id);
        // From here on the id reports nothing (its connection's thread may still be
        // finishing a disconnect), and what it queued goes.
        let q = lock(&me.sh.queue).clone();
        q.forget(id as usize, &me.sh.closed);
        let (conn, req, listeners) = {
            let mut st = lock(&me.sh.st);
            (
                st.conn.take(),
                st.request.take(),
                std::mem::take(&mut st.listeners),
            )
        };
        // Its listeners linger before this returns: a program that listens again on the
        // port right away (perftest -R) adopts them, with what they hold.
        for (d, ps, port, holder) in &listeners {
            start_lingering(holder, *d, *ps, *port);
        }
        if let Some(Pending::Conn(r)) = req {
            // Destroying a request without an answer rejects it, as the kernel does.
            let _ = r.reject(srdma::cm::reason::CONSUMER_DEFINED, &[]);
        }
        if let Some(conn) = conn {
            // A DREQ, as the kernel sends one, and the call returns: the device's GSI thread
            // sends it again until its DREP comes (about 2 s when the peer is gone) and holds
            // the connection meanwhile (`IbConnection::watch`). Should the process exit
            // first, the port keeper (a shared port, the default) sends the DREQ for the
            // connection it still lists.
            let _ = conn.start_disconnect();
        }
        if !me.c.event.is_null() {
            free_event(me.c.event);
        }
        let own = lock(&me.local).own_channel;
        // SAFETY: ids were leaked from a Box<Id>; unregistered above, freed once.
        drop(unsafe { Box::from_raw(id.cast::<Id>()) });
        if own != 0 {
            // SAFETY: the id's private channel, live until now.
            unsafe { rdma_destroy_event_channel(own as *mut rdma_event_channel) };
        }
        0
    })
}

/// `rdma_bind_addr`: the id's source address (and device, unless the address is a
/// wildcard, or a loopback address no device has); port 0 picks one.
///
/// # Safety
/// `id` NULL or live; `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let (Some(me), Some(mut a)) = (unsafe { id_of(id) }, unsafe { read_addr(addr) }) else {
            return err(libc::EINVAL);
        };
        match bind(me, &mut a) {
            Ok(()) => 0,
            Err(e) => err(e),
        }
    })
}

fn bind(me: &mut Id, a: &mut SocketAddr) -> Result<(), c_int> {
    if lock(&me.sh.st).listening || lock(&me.sh.st).connecting {
        return Err(libc::EINVAL);
    }
    if a.port() == 0 {
        a.set_port(any_port());
    }
    if !a.ip().is_unspecified() {
        match dev_for(a.ip()) {
            Some(d) => me.attach(d)?,
            // The kernel takes a loopback address as a wildcard (cma_any_addr): the id stays
            // without a device and listens on every one. srdma keeps a device of its own on
            // 127.0.0.1 (`srdma_lo`) when it is listed; without it, bind as the kernel does.
            // libfabric's verbs provider binds "localhost" so, then lists every device's
            // interface address as the source of its endpoints.
            None if a.ip().is_loopback() => {}
            None => return Err(libc::EADDRNOTAVAIL),
        }
    }
    me.set_src(*a);
    Ok(())
}

/// `rdma_resolve_addr`: binds (to `src_addr`, or the address routing picks toward
/// `dst_addr`) and reports ADDR_RESOLVED, or ADDR_ERROR when no srdma device has the source
/// address.
///
/// # Safety
/// `id` NULL or live; the addresses NULL or valid sockaddrs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        let (Some(me), Some(dst)) = (unsafe { id_of(id) }, unsafe { read_addr(dst_addr) }) else {
            return err(libc::EINVAL);
        };
        // SAFETY: per the contract.
        let src = unsafe { read_addr(src_addr) };
        let bound = lock(&me.sh.st).src;
        let dst = match dst {
            SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some() => SocketAddr::new(
                IpAddr::V4(v6.ip().to_ipv4_mapped().expect("checked")),
                v6.port(),
            ),
            d => d,
        };
        me.set_dst(dst);
        let src_ip = src
            .or(bound)
            .map(|a| a.ip())
            .filter(|ip| !ip.is_unspecified());
        let port = src.or(bound).map_or(0, |a| a.port());
        // A loopback destination when no device is on a loopback address (the default list
        // where other interfaces have addresses), from an id on no device: the kernel's
        // cma_bind_loopback, the first device (every srdma port is active), its own GID the
        // destination, the id's addresses loopback ones. Devices on 127.x addresses (srdma's
        // own, e.g. `SRDMA_DEVICES=127.0.0.2`) reach each other as before.
        let loopback = dst.ip().is_loopback()
            && !cm_devs().iter().any(|d| d.addr.is_loopback())
            && src_ip.is_none_or(|ip| ip.is_loopback());
        // An id bound to a loopback address without a device (a wildcard, see `bind`) picks
        // its device as an unbound one does.
        let src_ip = src_ip.filter(|&ip| !ip.is_loopback() || dev_for(ip).is_some());
        let dev = if loopback {
            (!cm_devs().is_empty()).then_some(0)
        } else {
            match src_ip {
                Some(ip) => dev_for(ip),
                None => source_device(dst.ip()),
            }
        };
        let ev = match dev {
            Some(d) => match me.attach(d) {
                Ok(()) => {
                    let port = if port == 0 { any_port() } else { port };
                    let addr = cm_devs()[d].addr;
                    if loopback {
                        let lo = if dst.is_ipv4() {
                            IpAddr::V4(Ipv4Addr::LOCALHOST)
                        } else {
                            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
                        };
                        me.set_src(SocketAddr::new(lo, port));
                        me.c.route.addr.addr.dgid.raw = me.c.route.addr.addr.sgid.raw;
                        lock(&me.sh.st).route_dst = Some(SocketAddr::new(addr, dst.port()));
                    } else {
                        me.set_src(SocketAddr::new(addr, port));
                    }
                    event(me.ptr() as usize, RDMA_CM_EVENT_ADDR_RESOLVED, 0)
                }
                Err(e) => event(me.ptr() as usize, RDMA_CM_EVENT_ADDR_ERROR, -e),
            },
            None => event(me.ptr() as usize, RDMA_CM_EVENT_ADDR_ERROR, -libc::ENODEV),
        };
        me.sh.push(ev);
        me.complete()
    })
}

/// `rdma_resolve_route`: the port's path (no subnet manager on RoCE); ROUTE_RESOLVED.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        let dev = {
            let st = lock(&me.sh.st);
            st.dst.and(st.dev)
        };
        let Some(dev) = dev else {
            return err(libc::EINVAL);
        };
        me.set_path();
        // QP1 now, not in rdma_connect: a kernel's exists before any connect, and opening
        // ours (a CQ, a QP, a region, its receives) is a good part of a connect's time.
        let _ = cm_devs()[dev].gsi();
        let p = me.ptr() as usize;
        me.sh.push(event(p, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
        me.complete()
    })
}

/// `rdma_listen`: REQs (SIDR_REQs for UD ids) for the bound port on the bound device, or
/// on every device of the family for a wildcard address.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard(err(libc::EIO), || {
        leave_data_path();
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        let (src, dev) = {
            let st = lock(&me.sh.st);
            if st.listening {
                return 0;
            }
            (st.src, st.dev)
        };
        let src = match src {
            Some(a) => a,
            None => {
                let mut a = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
                if let Err(e) = bind(me, &mut a) {
                    return err(e);
                }
                a
            }
        };
        let devs: Vec<usize> = match dev {
            Some(d) => vec![d],
            None => (0..cm_devs().len())
                .filter(|&d| src.is_ipv6() || cm_devs()[d].addr.is_ipv4())
                .collect(),
        };
        let ps = me.wire_ps();
        let ud = me.is_ud();
        let mut listening = 0;
        let mut last = libc::ENODEV;
        for d in devs {
            if let Some(holder) = adopt_lingering(d, ps, src.port(), &me.sh) {
                lock(&me.sh.st).listeners.push((d, ps, src.port(), holder));
                listening += 1;
                continue;
            }
            let l = cm_devs()[d]
                .gsi()
                .and_then(|g| IbListener::bind_ps(&g, ps, src.port()).map_err(|_| libc::EIO));
            match l {
                Ok(l) => {
                    let holder: Holder = Arc::new(Mutex::new(Some(me.sh.clone())));
                    let port = src.port();
                    let h = holder.clone();
                    if spawn("srdma-cm-listen", move || {
                        listen_loop(h, d, l, ud, ps, port)
                    })
                    .is_ok()
                    {
                        lock(&me.sh.st).listeners.push((d, ps, port, holder));
                        listening += 1;
                    }
                }
                Err(e) => last = e,
            }
        }
        if listening == 0 {
            return err(last);
        }
        lock(&me.sh.st).listening = true;
        0
    })
}

/// `rdma_migrate_id`: moves the id's future events to `channel` (NULL: synchronous, on a
/// channel of its own).
///
/// # Safety
/// `id` NULL or live; `channel` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        let sync = channel.is_null();
        if sync && me.sh.sync.load(Ordering::Acquire) {
            return err(libc::EINVAL);
        }
        let channel = if sync {
            match new_channel() {
                Ok(c) => c,
                Err(e) => return err(e),
            }
        } else {
            channel
        };
        let Some(q) = queue_of(channel) else {
            return err(libc::EINVAL);
        };
        let old = std::mem::replace(&mut *lock(&me.sh.queue), q);
        // Events not yet taken move with the id.
        let moved: Vec<EventBox> = {
            let mut ev = lock(&old.events);
            let (mine, rest): (VecDeque<EventBox>, VecDeque<EventBox>) =
                ev.drain(..).partition(|e| e.0.c.id == id);
            *ev = rest;
            mine.into_iter().collect()
        };
        for e in moved {
            me.sh.push(e.0);
        }
        let own = std::mem::replace(
            &mut lock(&me.local).own_channel,
            if sync { channel as usize } else { 0 },
        );
        if !me.c.event.is_null() {
            free_event(me.c.event);
            me.c.event = std::ptr::null_mut();
        }
        me.c.channel = channel;
        me.sh.channel.store(channel as usize, Ordering::Release);
        me.sh.sync.store(sync, Ordering::Release);
        if own != 0 {
            // SAFETY: the id's former private channel.
            unsafe { rdma_destroy_event_channel(own as *mut rdma_event_channel) };
        }
        0
    })
}

/// `rdma_set_option`: TOS, REUSEADDR, AFONLY, ACK_TIMEOUT and IB_PATH are accepted (the
/// path and the rest but ACK_TIMEOUT, which the QP gets at RTS, are srdma's own); anything
/// else is ENOSYS.
///
/// # Safety
/// `id` NULL or live; `optval` NULL or `optlen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard(err(libc::EIO), || {
        if !crate::is_live(id) || optval.is_null() || optlen == 0 {
            return err(libc::EINVAL);
        }
        match (level, optname) {
            // RDMA_OPTION_ID_ACK_TIMEOUT: a u8, kept for the QP's RTS (RC ids only, as in
            // the kernel's rdma_set_ack_timeout).
            (0, 3) => {
                // SAFETY: per the contract, and the id is live.
                let Some(me) = (unsafe { id_of(id) }) else {
                    return err(libc::EINVAL);
                };
                if optlen != 1 || me.is_ud() {
                    return err(libc::EINVAL);
                }
                // SAFETY: `optval` holds `optlen` (1) readable bytes.
                let v = unsafe { *optval.cast::<u8>() };
                lock(&me.sh.st).ack_timeout = Some(v);
                0
            }
            // RDMA_OPTION_ID: TOS, REUSEADDR, AFONLY; RDMA_OPTION_IB: PATH.
            (0, 0..=2) | (1, 1) => 0,
            _ => err(libc::ENOSYS),
        }
    })
}

/// `rdma_notify`: nothing to do (the QP is established when its first packet arrives).
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard(err(libc::EIO), || {
        if crate::is_live(id) {
            0
        } else {
            err(libc::EINVAL)
        }
    })
}

/// `rdma_get_src_port`: the id's source port, network order.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: per the contract.
        unsafe { id_of(id) }
            .and_then(|me| lock(&me.sh.st).src)
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_dst_port`: the id's destination port, network order.
///
/// # Safety
/// `id` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: per the contract.
        unsafe { id_of(id) }
            .and_then(|me| lock(&me.sh.st).dst)
            .map_or(0, |a| a.port().to_be())
    })
}
