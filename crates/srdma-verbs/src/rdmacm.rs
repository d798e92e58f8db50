//! `librdmacm.so.1` on srdma: rdma-core 44's rdma_cm C API (Debian bookworm's librdmacm1),
//! speaking InfiniBand CM MADs on QP1 ([`srdma::ibcm`]) as kernel rdma_cm does, so that
//! rping, rdma_server/rdma_client, ucmatose, udaddy and perftest `-R` run on srdma and
//! connect to kernel rxe.
//!
//! The same file serves both libraries: `srdma exec` (and the tests) give it the names
//! `libibverbs.so.1` and `librdmacm.so.1`. The dynamic loader opens it once (it recognises
//! the file), so `id->verbs`, `id->pd` and `id->qp` are objects of this library's verbs, as
//! librdmacm's are libibverbs'. The `RDMACM_1.*` symbol versions come from `symbols.txt`.
//!
//! How the kernel's work is done here:
//! - an event channel is an eventfd in semaphore mode (readable while events wait) and a
//!   queue; `rdma_get_cm_event` honours `O_NONBLOCK` on it;
//! - address and route resolution are local: the source address is the one the kernel's
//!   routing picks (a connected UDP socket), the device is the srdma device with that
//!   address, the path is the port's (MTU, P_Key 0xFFFF, hop limit 64);
//! - listens, connects, accepts and disconnects run on helper threads, which post the
//!   events: REQ/REP/RTU/REJ/DREQ/DREP for connected QPs, SIDR_REQ/SIDR_REP for UD. The
//!   first REQ of `rdma_connect` and the first REP of `rdma_accept` leave from the caller's
//!   thread (an error there is the call's errno); a waiting CM worker takes the rest.
//!
//! # What is implemented
//!
//! - Implemented: `rdma_create_event_channel`, `rdma_destroy_event_channel`,
//!   `rdma_create_id`, `rdma_destroy_id`, `rdma_bind_addr`, `rdma_resolve_addr`,
//!   `rdma_resolve_route`, `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`,
//!   `rdma_reject_ece`, `rdma_disconnect`, `rdma_get_cm_event`, `rdma_ack_cm_event`,
//!   `rdma_event_str`, `rdma_create_qp`, `rdma_create_qp_ex`, `rdma_destroy_qp`,
//!   `rdma_create_srq`, `rdma_destroy_srq`, `rdma_create_ep`, `rdma_destroy_ep`,
//!   `rdma_get_request`, `rdma_migrate_id`, `rdma_set_option` (accepted and ignored: TOS,
//!   REUSEADDR, AFONLY, ACK_TIMEOUT, IB_PATH), `rdma_notify`, `rdma_getaddrinfo`,
//!   `rdma_freeaddrinfo`, `rdma_get_devices`, `rdma_free_devices`, `rdma_get_src_port`,
//!   `rdma_get_dst_port`, `rdma_init_qp_attr` (INIT, RTR, RTS), `rdma_establish`,
//!   `rdma_set_local_ece`, `rdma_get_remote_ece` (no ECE: zeroes); `rpoll` and `rselect` on
//!   ordinary descriptors (what rping, ucmatose and udaddy call them for).
//! - Ids without a QP (UCX's way): `rdma_connect` and `rdma_accept` name
//!   `conn_param->qp_num` in the REQ/REP and leave the QP to the application, which moves
//!   it with `rdma_init_qp_attr`; the active side gets RDMA_CM_EVENT_CONNECT_RESPONSE and
//!   sends the RTU with `rdma_establish` (tests/c/qpless.c, also against kernel rxe in the
//!   lab). Before the peer is known, RTR/RTS attributes are EINVAL (kernel rdma_cm hands
//!   out the INIT ones again).
//! - `rdma_create_srq_ex` for basic SRQs (XRC and tag matching: EOPNOTSUPP).
//! - Multicast, as kernel rdma_cm on a RoCEv2 port: `rdma_join_multicast`,
//!   `rdma_join_multicast_ex` (full and send-only members), `rdma_leave_multicast`, for
//!   IPv4 groups (IPv6: ENOTSUPP, as the kernel); the id's QP is attached with
//!   `ibv_attach_mcast` (the srdma device joins the group on its interface) and
//!   MULTICAST_JOIN carries the kernel's UD parameters; as with librdmacm, the QP the id has
//!   when the application takes that event is attached then. Debian's `mckey` runs on it
//!   and against kernel rxe. Where it differs: `rdma_destroy_qp` detaches the id's groups
//!   first (with rdma-core the QP stays attached, its destroy fails with EBUSY and it
//!   leaks).
//! - rsockets, stream sockets (`crate::rsocket`, its C exports in `rsocket/abi.rs`): `rsocket`, `rbind`, `rlisten`, `raccept`,
//!   `rconnect`, `rshutdown`, `rclose`, `rrecv`/`rrecvfrom`/`rrecvmsg`/`rread`/`rreadv`,
//!   `rsend`/`rsendto`/`rsendmsg`/`rwrite`/`rwritev`, `rpoll`, `rgetpeername`,
//!   `rgetsockname`, `rsetsockopt`/`rgetsockopt` (int options), `rfcntl`, `rselect` (through
//!   `rpoll` when rsockets are among its descriptors), `riomap`/`riounmap`/`riowrite`:
//!   Debian's `rstream`, `rcopy` and `riostream` run on them, `rstream` and `riostream`
//!   against kernel rxe's librdmacm. Datagram rsockets are EOPNOTSUPP, so `udpong` fails;
//!   it fails on kernel rxe too (two lab guests, rdma-core 44: `rconnect: No such file or
//!   directory`): rsocket.c's datagram path makes the address handle to its own QP without
//!   a GRH (`ds_add_qp_dest`), which RoCE refuses (`ibv_create_ah` EINVAL, seen through an
//!   LD_PRELOAD shim), so there is no RoCE peer to build them against. `riowrite` to an
//!   offset the peer has not mapped returns the bytes written before it (0), as rsocket.c
//!   does. Where they differ from rsocket.c: `rconnect` completes before it returns, also
//!   on a non-blocking socket; `rpoll` reports a hang-up once the data before it is read;
//!   a flushed receive (the peer's DREQ, its process gone) ends the stream instead of
//!   leaving a reader waiting; `rclose` of an unknown socket is -1 with EBADF (rsocket.c
//!   returns EBADF itself).
//! - LAP/APR (alternate paths): nothing in librdmacm sends them, and a received one is
//!   dropped (counted as malformed), as kernel ib_cm drops them on RoCE ports ("Alternate
//!   path messages are not supported for RoCE link layer").
//!
//! # Where this differs from kernel rdma_cm, and why
//!
//! - A destroyed listener's port keeps the requests that reach it for 2 s ([`LINGER`]) and
//!   hands them to a new listener on the same port; after that they get REJ "invalid
//!   service ID", as at once from a kernel. perftest -R destroys its listener between its
//!   two connections and listens again, and Debian's perftest cannot retry a rejected
//!   second connection.
//! - `rdma_connect` sends a REQ rejected with "invalid service ID" again every 50 ms for 1 s
//!   before it reports REJECTED ([`srdma::cm::ConnectOptions::unlisted_retry`]): the same
//!   race from the client side, against a server (rxe in a slow VM, say) that listens a few
//!   milliseconds later than our connect is made.
//! - Every rdma_cm call that starts connection work sends the ACKs the application's last
//!   polls held back for its next post ([`srdma::Device::flush_held_back`]): its peer may be
//!   waiting for them before it listens again.

use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use srdma::cm::{CmError, CmEvent, ConnectOptions};
use srdma::ibcm::{self, Gsi, IbConnection, IbListener, IbRequest, PeerParams, SidrRequest};
use srdma::{AccessFlags, AttrMask, Gid, QpAttr, QpState};
use srdma_wire::cm::port_space;

use crate::abi_core::*;
use crate::cma_abi::*;
use crate::context::Context;
use crate::{guard, set_errno};

/// `RDMA_CM_EVENT_*` values the header leaves out of `cma_abi`.
const RDMA_CM_EVENT_ADDR_ERROR: rdma_cm_event_type = 1;
/// `RDMA_PS_IPOIB` and `RDMA_PS_IB`.
const RDMA_PS_IPOIB: rdma_port_space = 0x0002;
const RDMA_PS_IB: rdma_port_space = 0x013F;
/// The Q_Key of rdma_cm's UD QPs.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// "As many as the device allows" in `rdma_conn_param`.
const RDMA_MAX_RESP_RES: u8 = 0xFF;
const RDMA_MAX_INIT_DEPTH: u8 = 0xFF;
/// `rdma_addrinfo` flags.
const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;
const RAI_FAMILY: c_int = 8;
/// Private data after the rdma_cm header: REQ, REP, REJ, SIDR_REQ, SIDR_REP.
const REQ_PRIVATE: usize = 56;
const REP_PRIVATE: usize = 196;
const SIDR_REQ_PRIVATE: usize = 180;
const SIDR_REP_PRIVATE: usize = 136;
/// How long a connect waits for its REP (kernel rdma_cm's CM retries, at our resend pace).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500 * 15);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// librdmacm's error convention: -1 with `errno`.
pub(crate) fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

// ---------------------------------------------------------------------------------------
// Devices: one verbs context per srdma device, opened once, as librdmacm opens them all.

pub(crate) struct CmDev {
    ctx: usize,
    pub(crate) addr: IpAddr,
    /// The device's PD (`id->pd` of ids on it), allocated on first use.
    pd: Mutex<usize>,
}

static CM_DEVS: OnceLock<Vec<CmDev>> = OnceLock::new();

pub(crate) fn cm_devs() -> &'static [CmDev] {
    CM_DEVS.get_or_init(|| {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live local.
        let list = unsafe { crate::context::ibv_get_device_list(&mut n) };
        let entries = crate::context::devices();
        let mut out = Vec::new();
        for (i, entry) in entries.iter().enumerate().take(n.max(0) as usize) {
            // SAFETY: `list` holds `n` device pointers.
            let dev = unsafe { *list.add(i) };
            let ctx = crate::context::ibv_open_device(dev);
            if !ctx.is_null() {
                out.push(CmDev {
                    ctx: ctx as usize,
                    addr: entry.cfg.addr,
                    pd: Mutex::new(0),
                });
            }
        }
        out
    })
}

/// The application is setting up a connection, off its data path: ACKs its last polls held
/// back for its next post leave now, so its peer (often waiting for them before it listens
/// again, as perftest -R does between its two connections) need not wait for the progress
/// thread.
pub(crate) fn leave_data_path() {
    if let Some(devs) = CM_DEVS.get() {
        for d in devs {
            if let Some(dev) = d.context().device_if_open() {
                dev.flush_held_back();
            }
        }
    }
}

impl CmDev {
    fn ctx(&self) -> *mut ibv_context {
        self.ctx as *mut ibv_context
    }

    pub(crate) fn context(&self) -> &'static Context {
        // SAFETY: contexts of CM devices are never closed.
        unsafe { Context::from_c(self.ctx()) }.expect("CM device contexts stay open")
    }

    fn pd(&self) -> Result<*mut ibv_pd, c_int> {
        let mut pd = lock(&self.pd);
        if *pd == 0 {
            // SAFETY: the context is open.
            let p = unsafe { crate::verbs::ibv_alloc_pd(self.ctx()) };
            if p.is_null() {
                return Err(errno());
            }
            *pd = p as usize;
        }
        Ok(*pd as *mut ibv_pd)
    }

    fn gsi(&self) -> Result<Gsi, c_int> {
        self.context().gsi()
    }
}

/// The device with address `ip` (an IPv4-mapped IPv6 address names the IPv4 one).
pub(crate) fn dev_for(ip: IpAddr) -> Option<usize> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    cm_devs().iter().position(|d| d.addr == ip)
}

// ---------------------------------------------------------------------------------------
// Socket addresses.

/// The address at `sa` (NULL, or an AF_INET / AF_INET6 sockaddr).
///
/// # Safety
/// `sa` is NULL or valid for reading as the sockaddr its family says.
pub(crate) unsafe fn read_addr(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    match c_int::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let s = unsafe { &*sa.cast::<sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let s = unsafe { &*sa.cast::<sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `a` as a sockaddr in `dst` (zeroed first); returns its length.
pub(crate) fn write_addr(dst: &mut sockaddr_storage, a: SocketAddr) -> socklen_t {
    // SAFETY: sockaddr_storage is plain bytes.
    *dst = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            let s = unsafe { &mut *(dst as *mut sockaddr_storage).cast::<sockaddr_in>() };
            s.sin_family = libc::AF_INET as u16;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<sockaddr_in>() as socklen_t
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            let s = unsafe { &mut *(dst as *mut sockaddr_storage).cast::<sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as u16;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_flowinfo = v6.flowinfo();
            s.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<sockaddr_in6>() as socklen_t
        }
    }
}

/// The IP address in the 16 bytes of an rdma_cm header (IPv4 as its last 4 for version 4).
pub(crate) fn ip_of(ip_version: u8, b: [u8; 16]) -> IpAddr {
    if ip_version == 4 {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(b))
    }
}

/// The source address the kernel's routing picks toward `dst`.
fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect((dst, 4791)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// The device an unbound id resolving toward `dst` uses: the one with the address routing
/// picks as the source; else, for a destination of this host, its own device; else, for a
/// loopback destination, a loopback device; else the only device of the family (srdma
/// devices are often a subset of the host's addresses, e.g. `SRDMA_DEVICES=127.0.0.2`).
pub(crate) fn source_device(dst: IpAddr) -> Option<usize> {
    if let Some(d) = route_source(dst).and_then(dev_for) {
        return Some(d);
    }
    if let Some(d) = dev_for(dst) {
        return Some(d);
    }
    let family: Vec<usize> = (0..cm_devs().len())
        .filter(|&d| cm_devs()[d].addr.is_ipv4() == dst.is_ipv4())
        .collect();
    if dst.is_loopback() {
        if let Some(&d) = family.iter().find(|&&d| cm_devs()[d].addr.is_loopback()) {
            return Some(d);
        }
    }
    match family[..] {
        [d] => Some(d),
        _ => None,
    }
}

/// An rdma_cm port for an id bound to port 0, from the kernel's ephemeral range.
pub(crate) fn any_port() -> u16 {
    32768 + (srdma::random_u64() % 28000) as u16
}

// ---------------------------------------------------------------------------------------
// Event channels and events.

/// An event channel's queue: events in arrival order, and an eventfd in semaphore mode
/// whose count is the number queued, so the channel's descriptor polls readable while any
/// waits.
struct Queue {
    fd: OwnedFd,
    events: Mutex<VecDeque<EventBox>>,
}

/// An event on its way to the application.
struct EventBox(Box<Event>);
// SAFETY: the raw pointers inside name ids and private data the library owns; the event
// moves between threads but is only read by the one that takes it.
unsafe impl Send for EventBox {}

impl Queue {
    fn new() -> Result<Arc<Queue>, c_int> {
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(errno());
        }
        Ok(Arc::new(Queue {
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            events: Mutex::new(VecDeque::new()),
        }))
    }

    fn push(&self, ev: Box<Event>) {
        self.push_unless(ev, None);
    }

    /// Queues `ev` unless `closed` (its id's `Shared::closed`) is set, checked under the
    /// queue's lock: `rdma_destroy_id` sets it and forgets the id's events under the same
    /// lock, so no event of a destroyed id (naming freed memory) is queued after.
    fn push_unless(&self, ev: Box<Event>, closed: Option<&AtomicBool>) {
        {
            let mut events = lock(&self.events);
            if closed.is_some_and(|c| c.load(Ordering::Acquire)) {
                return;
            }
            events.push_back(EventBox(ev));
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// The next event: waits for one unless the descriptor is non-blocking (EAGAIN). A
    /// signal handler installed without `SA_RESTART` ends the wait with EINTR, as it ends
    /// rdma-core's read of the kernel's channel (the eventfd's read restarts like that one).
    fn take(&self) -> Result<Box<Event>, c_int> {
        loop {
            let mut n: u64 = 0;
            // SAFETY: reads 8 bytes into a live local from our eventfd.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut n).cast(), 8) };
            if r != 8 {
                return Err(errno());
            }
            // Events of destroyed ids were taken out of the queue: their counts are stale.
            if let Some(EventBox(ev)) = lock(&self.events).pop_front() {
                return Ok(ev);
            }
        }
    }

    /// Marks `id` destroyed (`closed`) and drops its queued events, at once for
    /// [`Queue::push_unless`].
    fn forget(&self, id: usize, closed: &AtomicBool) {
        let mut events = lock(&self.events);
        closed.store(true, Ordering::Release);
        events.retain(|e| e.0.c.id as usize != id);
    }
}

/// A `struct rdma_event_channel`.
#[repr(C)]
struct Channel {
    c: rdma_event_channel,
    q: Arc<Queue>,
}

/// A `struct rdma_cm_event` and the private data it points at.
#[repr(C)]
struct Event {
    c: rdma_cm_event,
    data: [u8; 256],
    /// MULTICAST_JOIN of a full member: the group whose GID the id's QP is attached to when
    /// the application takes the event, as librdmacm attaches it ([`taken`]).
    attach: Option<Gid>,
}

fn event(id: usize, kind: rdma_cm_event_type, status: c_int) -> Box<Event> {
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
fn with_conn(mut ev: Box<Event>, p: &PeerParams, data: &[u8]) -> Box<Event> {
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
fn with_ud(mut ev: Box<Event>, gid: Option<Gid>, qpn: u32, qkey: u32, data: &[u8]) -> Box<Event> {
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

// ---------------------------------------------------------------------------------------
// Identifiers.

/// What an id waits on: a REQ or SIDR_REQ it was created for.
enum Pending {
    Conn(IbRequest),
    Sidr(SidrRequest),
}

/// What an id's helper threads share with it.
struct Shared {
    /// The `rdma_cm_id` (for events).
    id: usize,
    /// `id->context`, for the ids of connection requests.
    context: usize,
    /// `id->channel`, for the ids of connection requests.
    channel: std::sync::atomic::AtomicUsize,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
    /// Where events go (`rdma_migrate_id` changes it).
    queue: Mutex<Arc<Queue>>,
    /// Synchronous mode: calls wait for their own events.
    sync: AtomicBool,
    /// Destroyed: helper threads stop.
    closed: AtomicBool,
    st: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Index into [`cm_devs`].
    dev: Option<usize>,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    listening: bool,
    request: Option<Pending>,
    conn: Option<Arc<IbConnection>>,
    /// A connect or accept is under way or done.
    connecting: bool,
    want_disconnect: bool,
    /// DISCONNECTED was reported.
    disconnected: bool,
    /// `rdma_connect` without a QP: the REP came (CONNECT_RESPONSE), the RTU waits for
    /// `rdma_establish`.
    responded: Option<ibcm::Responded>,
    /// An id without a QP: the RTR and RTS attributes for the application's QP, once the
    /// connection's parameters are known (`rdma_init_qp_attr`).
    qp_attrs: Option<[(QpAttr, AttrMask); 2]>,
    /// The multicast groups joined.
    joined: Vec<Joined>,
}

impl Shared {
    fn push(&self, ev: Box<Event>) {
        let q = lock(&self.queue).clone();
        q.push_unless(ev, Some(&self.closed));
    }

    fn report_disconnected(&self) {
        {
            let mut st = lock(&self.st);
            if st.disconnected {
                return;
            }
            st.disconnected = true;
        }
        self.push(event(self.id, RDMA_CM_EVENT_DISCONNECTED, 0));
    }
}

/// A `struct rdma_cm_id`.
#[repr(C)]
struct Id {
    c: rdma_cm_id,
    sh: Arc<Shared>,
    local: Mutex<Local>,
}

/// What only the application's calls touch.
struct Local {
    /// `rdma_create_ep` on a passive id: the QP each request gets.
    qp_init_attr: Option<ibv_qp_init_attr>,
    path: Option<Box<ibv_sa_path_rec>>,
    /// The private channel of a synchronous id.
    own_channel: usize,
}

// SAFETY: the raw pointers in `Local` name objects this library owns; access is serialised
// by the Mutex.
unsafe impl Send for Local {}

/// The id behind `id`, if it is a live one of ours.
///
/// # Safety
/// `id` is NULL or a pointer the application got from this library.
unsafe fn id_of<'a>(id: *mut rdma_cm_id) -> Option<&'a mut Id> {
    // SAFETY: live ids are `Id`s (repr(C), `c` first), leaked from a Box.
    crate::is_live(id).then(|| unsafe { &mut *id.cast::<Id>() })
}

/// The queue behind `channel`, if it is a live one of ours.
fn queue_of(channel: *mut rdma_event_channel) -> Option<Arc<Queue>> {
    // SAFETY: live channels are `Channel`s (repr(C), `c` first).
    crate::is_live(channel).then(|| unsafe { (*channel.cast::<Channel>()).q.clone() })
}

fn new_channel() -> Result<*mut rdma_event_channel, c_int> {
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

/// A new id on `channel` (NULL: synchronous, with a channel of its own).
fn new_id(
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

impl Id {
    fn ptr(&mut self) -> *mut rdma_cm_id {
        &raw mut self.c
    }

    /// Puts the id on device `d`: `verbs`, `pd`, the source GID.
    fn attach(&mut self, d: usize) -> Result<(), c_int> {
        let dev = &cm_devs()[d];
        let pd = dev.pd()?;
        self.c.verbs = dev.ctx();
        if self.c.pd.is_null() {
            self.c.pd = pd;
        }
        self.c.port_num = 1;
        self.c.route.addr.addr.sgid.raw = Gid::from_ip(dev.addr).0;
        self.c.route.addr.addr.pkey = 0xffff;
        lock(&self.sh.st).dev = Some(d);
        Ok(())
    }

    fn set_src(&mut self, a: SocketAddr) {
        write_addr(&mut self.c.route.addr.src_storage, a);
        lock(&self.sh.st).src = Some(a);
    }

    fn set_dst(&mut self, a: SocketAddr) {
        write_addr(&mut self.c.route.addr.dst_storage, a);
        self.c.route.addr.addr.dgid.raw = Gid::from_ip(a.ip()).0;
        lock(&self.sh.st).dst = Some(a);
    }

    /// The path record of a resolved route: the device's port, P_Key 0xFFFF, hop limit 64.
    fn set_path(&mut self) {
        let dev = lock(&self.sh.st).dev;
        let mtu = dev.map_or(3, |d| cm_devs()[d].context().entry.cfg.mtu.as_u32());
        // SAFETY: ibv_sa_path_rec is plain C data; all zeroes is valid.
        let mut p: Box<ibv_sa_path_rec> = Box::new(unsafe { std::mem::zeroed() });
        p.sgid = ibv_gid {
            raw: self.c.route.addr.addr.sgid.raw,
        };
        p.dgid = ibv_gid {
            raw: self.c.route.addr.addr.dgid.raw,
        };
        p.hop_limit = 64;
        p.pkey = 0xffff_u16.to_be();
        p.reversible = 1;
        p.numb_path = 1;
        p.mtu_selector = 2;
        p.mtu = mtu as u8;
        p.rate_selector = 2;
        p.rate = 3;
        p.packet_life_time_selector = 2;
        p.packet_life_time = 18;
        let mut l = lock(&self.local);
        self.c.route.path_rec = &raw mut *p;
        self.c.route.num_paths = 1;
        l.path = Some(p);
    }

    fn is_ud(&self) -> bool {
        self.c.qp_type == IBV_QPT_UD
    }

    /// The CM port space of the wire (TCP for connected ids, UDP for UD, as kernel
    /// rdma_cm maps them).
    fn wire_ps(&self) -> u16 {
        match self.c.ps {
            RDMA_PS_UDP | RDMA_PS_IPOIB => port_space::UDP,
            RDMA_PS_IB => port_space::IB,
            _ => port_space::TCP,
        }
    }

    /// In synchronous mode: waits for this id's next event, keeps it in `id->event` (the
    /// one before is acknowledged) and turns an error event into -1 with errno.
    fn complete(&mut self) -> c_int {
        if !self.sh.sync.load(Ordering::Acquire) {
            return 0;
        }
        if !self.c.event.is_null() {
            free_event(self.c.event);
            self.c.event = std::ptr::null_mut();
        }
        let q = lock(&self.sh.queue).clone();
        let mut ev = match q.take() {
            Ok(ev) => ev,
            Err(e) => return err(e),
        };
        taken(&mut ev);
        let (kind, status) = (ev.c.event, ev.c.status);
        let p = Box::into_raw(ev);
        crate::register(p.cast::<rdma_cm_event>());
        self.c.event = p.cast();
        if status != 0 {
            if kind == RDMA_CM_EVENT_REJECTED {
                return err(libc::ECONNREFUSED);
            }
            return err(status.abs());
        }
        0
    }
}

/// What happens as the application takes event `ev` (librdmacm's `ucma_process_join`): a
/// full member's MULTICAST_JOIN attaches the id's QP, if it has one by then, to the group;
/// when that fails the event becomes MULTICAST_ERROR with status -errno.
fn taken(ev: &mut Event) {
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

fn free_event(ev: *mut rdma_cm_event) {
    if crate::unregister(ev) {
        // SAFETY: live events were leaked from a Box<Event>; unregistered now, freed once.
        drop(unsafe { Box::from_raw(ev.cast::<Event>()) });
    }
}

// ---------------------------------------------------------------------------------------
// Helper threads: listens, connects, accepts, and the life of a connection.

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), c_int> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(|_| libc::EAGAIN)
}

/// A job for a CM worker.
type Job = Box<dyn FnOnce() + Send>;

/// Idle CM workers, each waiting on its own channel for the next connect or accept.
static IDLE: Mutex<Vec<std::sync::mpsc::Sender<Job>>> = Mutex::new(Vec::new());

/// Idle workers kept at most (more exit when their job is done).
const MAX_IDLE: usize = 4;

/// Runs `f` on an idle CM worker thread, or a new one: connects and accepts do not create a
/// thread on their way (workers wait for the next job instead of exiting, and the first id
/// prepares two). With this and QP1 opened at route resolution, `rdma_connect` returns in
/// 15 µs instead of 0.43 ms (rping on loopback), and in 6–8 ms instead of 11–20 ms under
/// qemu TCG.
fn run_job(f: impl FnOnce() + Send + 'static) -> Result<(), c_int> {
    let mut job: Job = Box::new(f);
    loop {
        let Some(tx) = lock(&IDLE).pop() else { break };
        match tx.send(job) {
            Ok(()) => return Ok(()),
            // That worker is gone: take the job back and try the next.
            Err(std::sync::mpsc::SendError(j)) => job = j,
        }
    }
    new_worker(Some(job))
}

/// A CM worker: runs `first`, then whatever [`run_job`] hands it while it is idle.
fn new_worker(first: Option<Job>) -> Result<(), c_int> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    spawn("srdma-cm-worker", move || {
        if let Some(f) = first {
            f();
        }
        loop {
            {
                let mut idle = lock(&IDLE);
                if idle.len() >= MAX_IDLE {
                    return;
                }
                idle.push(tx.clone());
            }
            match rx.recv() {
                Ok(f) => f(),
                Err(_) => return,
            }
        }
    })
}

/// Two idle CM workers, once per process (before the first connect or accept needs one).
fn prepare_workers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for _ in 0..2 {
            let _ = new_worker(None);
        }
    });
}

/// The errno of a connect or accept that failed before its first MAD left (bad options,
/// a QP that cannot be connected, a full send queue).
fn cm_errno(e: &CmError) -> c_int {
    match e {
        CmError::Verbs(v) => crate::errno_of(v),
        CmError::PrivateDataTooLong(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// The event for a failed connect or accept, as kernel rdma_cm reports it.
fn failure(id: usize, e: &CmError, ud: bool) -> Box<Event> {
    match e {
        CmError::Rejected {
            reason,
            private_data,
        } if ud => with_ud(
            event(id, RDMA_CM_EVENT_UNREACHABLE, c_int::from(*reason)),
            None,
            0,
            0,
            &private_data[..private_data.len().min(SIDR_REP_PRIVATE)],
        ),
        CmError::Rejected {
            reason,
            private_data,
        } => with_conn(
            event(id, RDMA_CM_EVENT_REJECTED, c_int::from(*reason)),
            &PeerParams::default(),
            private_data,
        ),
        CmError::Timeout => event(id, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT),
        _ => event(id, RDMA_CM_EVENT_CONNECT_ERROR, -libc::ECONNRESET),
    }
}

/// An established connection: reports ESTABLISHED (if given: the active side of a
/// connection made without a QP gets none after `rdma_establish`), then watches for the
/// peer's DREQ or the application's `rdma_disconnect`, and reports DISCONNECTED once.
fn run_connection(sh: Arc<Shared>, conn: IbConnection, established: Option<Box<Event>>) {
    let conn = Arc::new(conn);
    if let Some(qp) = conn.try_qp() {
        let mut all = lock(&CONNS);
        all.retain(|(_, w)| w.strong_count() > 0);
        all.push((qp.qpn().value(), Arc::downgrade(&conn)));
    }
    lock(&sh.st).conn = Some(conn.clone());
    if let Some(ev) = established {
        sh.push(ev);
    }
    loop {
        if sh.closed.load(Ordering::Acquire) {
            return;
        }
        if lock(&sh.st).want_disconnect {
            let _ = conn.disconnect();
            sh.report_disconnected();
            return;
        }
        if let Some(CmEvent::Disconnected) = conn.poll_event(Some(Duration::from_millis(20))) {
            sh.report_disconnected();
            return;
        }
    }
}

/// The connections, by the QPN of their QP: `ibv_destroy_qp` makes them let go of it.
static CONNS: Mutex<Vec<(u32, std::sync::Weak<IbConnection>)>> = Mutex::new(Vec::new());

/// The application destroyed QP `qpn`: connections over it release it (so its CQs and PD
/// are free to go).
pub(crate) fn qp_destroyed(qpn: u32) {
    lock(&CONNS).retain(|(q, w)| {
        if *q == qpn {
            if let Some(c) = w.upgrade() {
                c.release_qp();
            }
            return false;
        }
        w.strong_count() > 0
    });
}

/// Recent requests a listener delivered, so that a REQ sent again is not a new one.
struct Seen(VecDeque<(Gid, u32)>);

impl Seen {
    fn first(&mut self, key: (Gid, u32)) -> bool {
        if self.0.contains(&key) {
            return false;
        }
        if self.0.len() >= 1024 {
            self.0.pop_front();
        }
        self.0.push_back(key);
        true
    }
}

/// How long the port of a destroyed listening id keeps the requests that reach it for a new
/// listener on the same port (and device) before they are rejected as for a closed port.
///
/// A program that listens again on the same port right after destroying its listener (as
/// perftest -R does between its two connections) would otherwise lose a request that
/// arrives in between to REJ "invalid service ID". A kernel answers that way too, but its
/// listen is a system call and the race is rarely lost; ours can lose it under CPU load.
const LINGER: Duration = Duration::from_secs(2);

/// Who serves a listener's requests: the listening id, or nobody while it lingers.
type Holder = Arc<Mutex<Option<Arc<Shared>>>>;

/// Listeners whose ids were destroyed, still holding their port: (device, port space, port).
static LINGERING: Mutex<Vec<(usize, u16, u16, Holder)>> = Mutex::new(Vec::new());

/// The lingering listener of (`d`, `ps`, `port`), handed to `sh`: true if there was one.
fn adopt_lingering(d: usize, ps: u16, port: u16, sh: &Arc<Shared>) -> bool {
    let mut l = lock(&LINGERING);
    let Some(i) = l.iter().position(|e| e.0 == d && e.1 == ps && e.2 == port) else {
        return false;
    };
    let (_, _, _, holder) = l.swap_remove(i);
    *lock(&holder) = Some(sh.clone());
    true
}

fn listen_loop(holder: Holder, d: usize, l: IbListener, ud: bool, ps: u16, port: u16) {
    let mut seen = Seen(VecDeque::new());
    let tick = Duration::from_millis(50);
    loop {
        let Some(sh) = lock(&holder).clone() else {
            return;
        };
        if sh.closed.load(Ordering::Acquire) {
            if !linger(&holder, d, ps, port) {
                // Nobody listened again: what waited is refused as for a closed port.
                while let Ok(r) = l.accept_request(Duration::ZERO) {
                    let _ = r.reject(srdma::cm::reason::INVALID_SERVICE_ID, &[]);
                }
                while let Ok(r) = l.accept_sidr(Duration::ZERO) {
                    let _ = r.reject(ibcm::SIDR_UNSUPPORTED, &[]);
                }
                return;
            }
            continue;
        }
        if ud {
            if let Ok(r) = l.accept_sidr(tick) {
                let hdr = r.cma_hdr();
                if seen.first((r.from(), r.request_id())) {
                    on_request(&sh, d, port, hdr, Pending::Sidr(r));
                }
            }
        } else if let Ok(r) = l.accept_request(tick) {
            let hdr = r.cma_hdr();
            if seen.first((r.from(), r.req().local_comm_id)) {
                on_request(&sh, d, port, hdr, Pending::Conn(r));
            }
        }
    }
}

/// Keeps a destroyed id's listener for [`LINGER`]: true if a new id adopted it meanwhile.
fn linger(holder: &Holder, d: usize, ps: u16, port: u16) -> bool {
    *lock(holder) = None;
    lock(&LINGERING).push((d, ps, port, holder.clone()));
    let until = std::time::Instant::now() + LINGER;
    loop {
        std::thread::sleep(Duration::from_millis(5));
        if lock(holder).is_some() {
            return true;
        }
        if std::time::Instant::now() >= until {
            let mut l = lock(&LINGERING);
            // Adopted in the meantime, or ours to end (under the same lock as adoption).
            if lock(holder).is_some() {
                return true;
            }
            l.retain(|e| !Arc::ptr_eq(&e.3, holder));
            return false;
        }
    }
}

/// A REQ or SIDR_REQ for the listening id `sh`: a new id for it, and CONNECT_REQUEST.
fn on_request(sh: &Shared, d: usize, port: u16, hdr: Option<srdma_wire::cm::CmaHdr>, req: Pending) {
    let Some(hdr) = hdr else { return };
    let sync = sh.sync.load(Ordering::Acquire);
    let listen_q = lock(&sh.queue).clone();
    // The listener's channel, or (synchronous listener) a channel of the new id's own.
    let channel = if sync {
        std::ptr::null_mut()
    } else {
        sh.channel.load(Ordering::Acquire) as *mut rdma_event_channel
    };
    let Ok(id) = new_id(channel, sh.context as *mut c_void, sh.ps, sh.qp_type) else {
        return;
    };
    // SAFETY: just created, not yet handed out.
    let new = unsafe { &mut *id };
    if new.attach(d).is_err() {
        return;
    }
    let dev = cm_devs()[d].addr;
    new.set_src(SocketAddr::new(dev, port));
    new.set_dst(SocketAddr::new(
        ip_of(hdr.ip_version, hdr.src_addr),
        hdr.src_port,
    ));
    new.set_path();
    let ev = match &req {
        Pending::Conn(r) => {
            let mut p = r.peer_params();
            // What the requester offers to serve is what this side may issue.
            std::mem::swap(&mut p.responder_resources, &mut p.initiator_depth);
            with_conn(
                event(new.ptr() as usize, RDMA_CM_EVENT_CONNECT_REQUEST, 0),
                &p,
                &r.private_data()[..REQ_PRIVATE],
            )
        }
        Pending::Sidr(r) => with_ud(
            event(new.ptr() as usize, RDMA_CM_EVENT_CONNECT_REQUEST, 0),
            None,
            0,
            0,
            &r.private_data()[..SIDR_REQ_PRIVATE],
        ),
    };
    lock(&new.sh.st).request = Some(req);
    let mut ev = ev;
    ev.c.listen_id = sh.id as *mut rdma_cm_id;
    listen_q.push(ev);
}

// ---------------------------------------------------------------------------------------
// The exported API.

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
        let (conn, req) = {
            let mut st = lock(&me.sh.st);
            (st.conn.take(), st.request.take())
        };
        if let Some(Pending::Conn(r)) = req {
            // Destroying a request without an answer rejects it, as the kernel does.
            let _ = r.reject(srdma::cm::reason::CONSUMER_DEFINED, &[]);
        }
        if let Some(conn) = conn {
            if !conn.is_disconnected() {
                // The kernel keeps resending a DREQ after the process is gone; a library
                // cannot, so the DREQ's exchange finishes here (at once when the peer answers,
                // about 2 s when it is gone). The process often exits right after.
                let _ = conn.disconnect();
            }
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
/// wildcard); port 0 picks one.
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
        let d = dev_for(a.ip()).ok_or(libc::EADDRNOTAVAIL)?;
        me.attach(d)?;
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
        let dev = match src_ip {
            Some(ip) => dev_for(ip),
            None => source_device(dst.ip()),
        };
        let ev = match dev {
            Some(d) => match me.attach(d) {
                Ok(()) => {
                    let port = if port == 0 { any_port() } else { port };
                    me.set_src(SocketAddr::new(cm_devs()[d].addr, port));
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
            if adopt_lingering(d, ps, src.port(), &me.sh) {
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
                    if spawn("srdma-cm-listen", move || {
                        listen_loop(holder, d, l, ud, ps, port)
                    })
                    .is_ok()
                    {
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

/// Connection options from the application's `rdma_conn_param`.
fn options(
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
            (st.dev, st.src, st.dst)
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
            let o = match options(conn_param, SIDR_REQ_PRIVATE, None) {
                Ok(o) => o,
                Err(e) => return err(e),
            };
            lock(&me.sh.st).connecting = true;
            let r = run_job(move || {
                let ev = match ibcm::sidr_resolve(&gsi, dst, src.port(), &o.private_data, o.timeout)
                {
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
        let o = match options(conn_param, REQ_PRIVATE, None) {
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
    let o = match options(conn_param, REQ_PRIVATE, None) {
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
    let o = match options(conn_param, REP_PRIVATE, Some(r.peer_params())) {
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
                let o = match options(conn_param, SIDR_REP_PRIVATE, None) {
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
                let o = match options(conn_param, REP_PRIVATE, Some(r.peer_params())) {
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
        // right after. The helper thread waits for the DREP.
        let conn = lock(&me.sh.st).conn.clone();
        if let Some(conn) = conn {
            let _ = conn.start_disconnect();
        }
        me.complete()
    })
}

/// `rdma_get_cm_event`: the channel's next event (waits, unless the channel's fd is
/// non-blocking: EAGAIN).
///
/// # Safety
/// `channel` NULL or live; `event` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(err(libc::EIO), || {
        let Some(q) = queue_of(channel) else {
            return err(libc::EINVAL);
        };
        if event.is_null() {
            return err(libc::EINVAL);
        }
        match q.take() {
            Ok(mut ev) => {
                taken(&mut ev);
                let p = Box::into_raw(ev);
                crate::register(p.cast::<rdma_cm_event>());
                // SAFETY: writable per the contract.
                unsafe { *event = p.cast() };
                0
            }
            Err(e) => err(e),
        }
    })
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
/// path and the rest are srdma's own); anything else is EINVAL.
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
            // RDMA_OPTION_ID: TOS, REUSEADDR, AFONLY, ACK_TIMEOUT; RDMA_OPTION_IB: PATH.
            (0, 0..=3) | (1, 1) => 0,
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
            let o = options(std::ptr::null(), REP_PRIVATE, Some(r.peer_params()))?;
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

/// `rdma_get_devices`: the contexts librdmacm uses, NULL-terminated (free with
/// [`rdma_free_devices`]).
///
/// # Safety
/// `num_devices` NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        let devs = cm_devs();
        let mut v: Vec<*mut ibv_context> = devs.iter().map(CmDev::ctx).collect();
        v.push(std::ptr::null_mut());
        if !num_devices.is_null() {
            // SAFETY: writable per the contract.
            unsafe { *num_devices = devs.len() as c_int };
        }
        let p = Box::into_raw(v.into_boxed_slice()).cast::<*mut ibv_context>();
        crate::register(p);
        p
    })
}

/// `rdma_free_devices`.
///
/// # Safety
/// `list` NULL or from [`rdma_get_devices`], freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard((), || {
        if list.is_null() || !crate::unregister(list) {
            return;
        }
        let n = cm_devs().len() + 1;
        // SAFETY: allocated as a boxed slice of `n` pointers by rdma_get_devices.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n)) });
    })
}

/// `rdma_set_local_ece`: kept (srdma has no ECE options to negotiate).
///
/// # Safety
/// `id` NULL or live; `ece` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        match unsafe { id_of(id) } {
            Some(me) if me.c.qp.is_null() && !ece.is_null() => 0,
            _ => err(libc::EINVAL),
        }
    })
}

/// `rdma_get_remote_ece`: no ECE from the peer (zeroes).
///
/// # Safety
/// `id` NULL or live; `ece` NULL or valid for a 12-byte `struct ibv_ece`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        match unsafe { id_of(id) } {
            Some(me) if me.c.qp.is_null() && !ece.is_null() => {
                // SAFETY: `struct ibv_ece` is three u32.
                unsafe { std::ptr::write_bytes(ece.cast::<u8>(), 0, 12) };
                0
            }
            _ => err(libc::EINVAL),
        }
    })
}

// ---------------------------------------------------------------------------------------
// rdma_getaddrinfo.

/// `rdma_getaddrinfo`: `getaddrinfo` turned into an `rdma_addrinfo` (the first answer),
/// with librdmacm's hint mapping (RC → stream/TCP, UD → datagram/UDP). Returns 0, or
/// getaddrinfo's error code.
///
/// # Safety
/// `node`/`service` NULL or C strings; `hints` NULL or valid; `res` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(err(libc::EIO), || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return err(libc::EINVAL);
        }
        // SAFETY: rdma_addrinfo is plain C data; calloc zeroes it.
        let rai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if rai.is_null() {
            return err(libc::ENOMEM);
        }
        // SAFETY: just allocated, zeroed.
        let r = unsafe { &mut *rai };
        // SAFETY: NULL or valid per the contract.
        let h = unsafe { hints.as_ref() };
        if !node.is_null() || !service.is_null() {
            // SAFETY: addrinfo is plain C data.
            let mut ai_h: libc::addrinfo = unsafe { std::mem::zeroed() };
            if let Some(h) = h {
                if h.ai_flags & RAI_PASSIVE != 0 {
                    ai_h.ai_flags |= libc::AI_PASSIVE;
                }
                if h.ai_flags & RAI_NUMERICHOST != 0 {
                    ai_h.ai_flags |= libc::AI_NUMERICHOST;
                }
                if h.ai_family == libc::AF_INET || h.ai_family == libc::AF_INET6 {
                    ai_h.ai_family = h.ai_family;
                } else if h.ai_flags & RAI_FAMILY == 0 {
                    ai_h.ai_family = libc::AF_UNSPEC;
                }
                ai_h.ai_socktype = match h.ai_qp_type as ibv_qp_type {
                    IBV_QPT_RC | IBV_QPT_UC => libc::SOCK_STREAM,
                    IBV_QPT_UD => libc::SOCK_DGRAM,
                    _ => 0,
                };
                ai_h.ai_protocol = match h.ai_port_space as rdma_port_space {
                    RDMA_PS_TCP => libc::IPPROTO_TCP,
                    RDMA_PS_UDP => libc::IPPROTO_UDP,
                    _ => 0,
                };
            }
            let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
            // SAFETY: C strings or NULL per the contract; `ai_h` and `ai` live locals.
            let ret = unsafe {
                libc::getaddrinfo(
                    node,
                    service,
                    if h.is_some() { &ai_h } else { std::ptr::null() },
                    &mut ai,
                )
            };
            if ret != 0 {
                // SAFETY: allocated above, nothing else in it yet.
                unsafe { libc::free(rai.cast()) };
                return ret;
            }
            // SAFETY: getaddrinfo succeeded: `ai` is a valid list.
            let a = unsafe { &*ai };
            r.ai_qp_type = match h.map_or(0, |h| h.ai_qp_type) {
                0 if a.ai_socktype == libc::SOCK_DGRAM => IBV_QPT_UD as c_int,
                0 => IBV_QPT_RC as c_int,
                t => t,
            };
            r.ai_port_space = match h.map_or(0, |h| h.ai_port_space) {
                0 if a.ai_protocol == libc::IPPROTO_UDP => RDMA_PS_UDP as c_int,
                0 => RDMA_PS_TCP as c_int,
                p => p,
            };
            r.ai_family = a.ai_family;
            // SAFETY: ai_addr is ai_addrlen readable bytes.
            let copy = unsafe { dup_bytes(a.ai_addr.cast(), a.ai_addrlen as usize) };
            let canon = if a.ai_canonname.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: a C string from getaddrinfo.
                unsafe { libc::strdup(a.ai_canonname) }
            };
            if a.ai_flags & libc::AI_PASSIVE != 0 {
                r.ai_flags = RAI_PASSIVE;
                r.ai_src_addr = copy.cast();
                r.ai_src_len = a.ai_addrlen;
                r.ai_src_canonname = canon;
            } else {
                r.ai_dst_addr = copy.cast();
                r.ai_dst_len = a.ai_addrlen;
                r.ai_dst_canonname = canon;
            }
            // SAFETY: the list getaddrinfo returned, freed once.
            unsafe { libc::freeaddrinfo(ai) };
        } else if let Some(h) = h {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
                // SAFETY: the hint's address, ai_dst_len bytes.
                r.ai_dst_addr =
                    unsafe { dup_bytes(h.ai_dst_addr.cast(), h.ai_dst_len as usize) }.cast();
                r.ai_dst_len = h.ai_dst_len;
            }
        }
        if let Some(h) = h {
            if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
                // SAFETY: the hint's address, ai_src_len bytes.
                r.ai_src_addr =
                    unsafe { dup_bytes(h.ai_src_addr.cast(), h.ai_src_len as usize) }.cast();
                r.ai_src_len = h.ai_src_len;
            }
        }
        // SAFETY: writable per the contract.
        unsafe { *res = rai };
        0
    })
}

/// A malloc'ed copy of `len` bytes at `p` (freed by [`rdma_freeaddrinfo`]).
///
/// # Safety
/// `p` is readable for `len` bytes.
unsafe fn dup_bytes(p: *const u8, len: usize) -> *mut u8 {
    // SAFETY: a fresh allocation of `len` bytes.
    let d = unsafe { libc::malloc(len.max(1)) }.cast::<u8>();
    if !d.is_null() {
        // SAFETY: both valid for `len` bytes, distinct.
        unsafe { std::ptr::copy_nonoverlapping(p, d, len) };
    }
    d
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` NULL or from [`rdma_getaddrinfo`], freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list of calloc'ed entries whose members are malloc'ed or NULL.
            unsafe {
                let r = &*p;
                let next = r.ai_next;
                for m in [
                    r.ai_connect,
                    r.ai_route,
                    r.ai_src_canonname.cast(),
                    r.ai_dst_canonname.cast(),
                    r.ai_src_addr.cast(),
                    r.ai_dst_addr.cast(),
                ] {
                    libc::free(m);
                }
                libc::free(p.cast());
                p = next;
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Multicast (RoCEv2, IPv4 groups, as kernel rdma_cm's cma_iboe_join_multicast).

/// A group an id joined.
struct Joined {
    /// The group's address.
    ip: IpAddr,
    /// Joined send-only (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`): the QP is not attached.
    send_only: bool,
}

/// The kernel's ENOTSUPP (not a userspace errno; what `rdma_join_multicast` of an IPv6
/// group on a RoCEv2 port fails with).
const ENOTSUPP: c_int = 524;

/// `rdma_join_multicast`: joins the group at `addr` as a full member (see
/// [`rdma_join_multicast_ex`]).
///
/// # Safety
/// `id` NULL or live; `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let (Some(me), Some(a)) = (unsafe { id_of(id) }, unsafe { read_addr(addr) }) else {
            return err(libc::EINVAL);
        };
        join(me, a.ip(), false, context)
    })
}

/// `rdma_join_multicast_ex`: joins an IPv4 multicast group on the id's device, as kernel
/// rdma_cm does on a RoCEv2 port. The id must have a device (bound to an address or
/// resolved) and be neither listening nor connecting (EINVAL). The group's GID is its
/// IPv4-mapped address. RDMA_CM_EVENT_MULTICAST_JOIN follows, with `param.ud` as the
/// kernel gives it (address handle attributes toward the group, hop limit 64, QPN
/// 0xFFFFFF, Q_Key 0x01234567 in the UDP port space) and `private_data` = `context`; when
/// the application takes it, a full member's QP (`id->qp`, if it has one by then) is
/// attached to the group (`ibv_attach_mcast`: the device joins the group on its
/// interface), a send-only member's is not; a QP that cannot be attached makes the event
/// RDMA_CM_EVENT_MULTICAST_ERROR with status -errno. Errors: a
/// `comp_mask` bit librdmacm does not know: EOPNOTSUPP; no address or join flags, an
/// unknown flag, the zero address, a unicast address: EINVAL; an IPv6 group: ENOTSUPP
/// (524, the kernel's answer on RoCEv2).
///
/// # Safety
/// `id` NULL or live; `mc_join_attr` NULL or valid, its `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if mc_join_attr.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: non-NULL, valid per the contract.
        let m = unsafe { &*mc_join_attr };
        if m.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return err(libc::EOPNOTSUPP);
        }
        if m.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || m.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || m.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        let Some(a) = (unsafe { read_addr(m.addr) }) else {
            return err(libc::EINVAL);
        };
        let send_only = m.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
        join(me, a.ip(), send_only, context)
    })
}

fn join(me: &mut Id, ip: IpAddr, send_only: bool, context: *mut c_void) -> c_int {
    let dev = {
        let st = lock(&me.sh.st);
        if st.listening || st.connecting {
            return err(libc::EINVAL);
        }
        st.dev
    };
    let Some(d) = dev else {
        return err(libc::EINVAL);
    };
    let v4 = match ip {
        IpAddr::V6(_) => return err(ENOTSUPP),
        IpAddr::V4(v4) => v4,
    };
    if !v4.is_multicast() || !cm_devs()[d].addr.is_ipv4() {
        return err(libc::EINVAL);
    }
    let gid = Gid::from_ip(ip);
    let qkey = if me.c.ps == RDMA_PS_UDP {
        RDMA_UDP_QKEY
    } else {
        0
    };
    let mut ev = with_ud(
        event(me.ptr() as usize, RDMA_CM_EVENT_MULTICAST_JOIN, 0),
        Some(gid),
        srdma_wire::Qpn::MULTICAST.value(),
        qkey,
        &[],
    );
    // librdmacm hands the join's context back as the event's private data.
    ev.c.param.ud.private_data = context.cast_const();
    if !send_only {
        ev.attach = Some(gid);
    }
    lock(&me.sh.st).joined.push(Joined { ip, send_only });
    me.sh.push(ev);
    me.complete()
}

/// `rdma_leave_multicast`: leaves a group the id joined, detaching its QP (a full member's).
/// EADDRNOTAVAIL when the id did not join `addr`; EINVAL for NULL.
///
/// # Safety
/// `id` NULL or live; `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let (Some(me), Some(a)) = (unsafe { id_of(id) }, unsafe { read_addr(addr) }) else {
            return err(libc::EINVAL);
        };
        let left = {
            let mut st = lock(&me.sh.st);
            match st.joined.iter().position(|j| j.ip == a.ip()) {
                Some(i) => st.joined.remove(i),
                None => return err(libc::EADDRNOTAVAIL),
            }
        };
        if !left.send_only && !me.c.qp.is_null() {
            detach(me.c.qp, left.ip);
        }
        0
    })
}

/// Detaches `qp` from group `ip` (an error, a QP not attached, changes nothing).
fn detach(qp: *mut ibv_qp, ip: IpAddr) {
    let g = ibv_gid {
        raw: Gid::from_ip(ip).0,
    };
    // SAFETY: a live QP of an id and a live GID.
    unsafe { crate::verbs::ibv_detach_mcast(qp, &g, 0) };
}
