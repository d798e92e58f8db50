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
//! - the kernel disconnects the ids of a process that exits or dies: at `exit` a handler
//!   sends a DREQ for each connection still up, and for a process killed without `exit` the
//!   port keeper of its address sends them (`srdma::ibcm` registers each established
//!   connection with it).
//!
//! One file per concern: `event` (event channels and events), `id` (creating, binding,
//! resolving, listening), `connect` (connect, accept, reject, disconnect and the QP
//! attributes of ids without a QP), `qp` (an id's QP, CQs and SRQ; endpoints), `thread`
//! (the CM workers, listeners and connections), `addrinfo` (`rdma_getaddrinfo`),
//! `multicast`; this file holds what they share: the devices, socket addresses, the
//! event queue and the id types.
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
//!   `rdma_set_local_ece`, `rdma_get_remote_ece` (srdma's ECE, selective repeat, in the REQ
//!   and REP); `rpoll` and `rselect` on ordinary descriptors (what rping, ucmatose and udaddy
//!   call them for).
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
//! - rsockets, stream sockets (the `rsocket` module, its C exports in `rsocket/abi.rs`): `rsocket`, `rbind`, `rlisten`, `raccept`,
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
//!   does. A non-blocking `rconnect` returns EINPROGRESS and completes in the background,
//!   as rsocket.c's. Where they differ from rsocket.c: `rpoll` reports a hang-up once the
//!   data before it is read; a flushed receive (the peer's DREQ, its process gone) ends the
//!   stream instead of leaving a reader waiting; `rclose` of an unknown socket is -1 with EBADF (rsocket.c
//!   returns EBADF itself).
//! - LAP/APR (alternate paths): nothing in librdmacm sends them, and a received one is
//!   dropped (counted as malformed), as kernel ib_cm drops them on RoCE ports ("Alternate
//!   path messages are not supported for RoCE link layer").
//!
//! # Where this differs from kernel rdma_cm, and why
//!
//! - A destroyed listener's port keeps the requests that reach it for 2 s
//!   ([`thread::LINGER`]) and hands them to a new listener on the same port; after that
//!   they get REJ "invalid service ID", as at once from a kernel. perftest -R destroys its
//!   listener between its two connections and listens again, and Debian's perftest cannot
//!   retry a rejected second connection.
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
use srdma::cm::{CmError, ConnectOptions};
use srdma::ibcm::{self, Gsi, IbConnection, IbListener, IbRequest, PeerParams, SidrRequest};
use srdma::{AccessFlags, AttrMask, Gid, QpAttr, QpState};
use srdma_wire::cm::port_space;

use crate::abi_core::*;
use crate::cma_abi::*;
use crate::context::Context;
use crate::{guard, set_errno};

mod addrinfo;
mod connect;
mod event;
mod id;
mod multicast;
mod qp;
mod thread;

use event::{event, free_event, taken};
use multicast::Joined;

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
            let ctx = crate::verbs::ibv_open_device(dev);
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
// Event channels and events (the rest of them in `event`).

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

    /// The first queued event (for a caller that has taken its count off the eventfd).
    fn pop(&self) -> Option<Box<Event>> {
        lock(&self.events).pop_front().map(|EventBox(ev)| ev)
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

// ---------------------------------------------------------------------------------------
// Identifiers (the calls on them in `id`, `connect`, `qp` and `multicast`).

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
    /// Its listeners (device, port space, port, holder), for `rdma_destroy_id`.
    listeners: Vec<(usize, u16, u16, thread::Holder)>,
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
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout from RTS on, as kernel
    /// rdma_cm sets it (`cma_modify_qp_rts`).
    ack_timeout: Option<u8>,
    /// Where the CM's messages go when that is not `dst`: a loopback destination resolved
    /// to the id's own device (see `rdma_resolve_addr`).
    route_dst: Option<SocketAddr>,
    /// `rdma_set_local_ece`: what the REQ or REP offers for a QP the application moves
    /// itself.
    local_ece: srdma::Ece,
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
        let mut st = lock(&self.sh.st);
        st.dst = Some(a);
        st.route_dst = None;
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

// ---------------------------------------------------------------------------------------
// The devices librdmacm uses.

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
