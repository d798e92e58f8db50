//! Devices and contexts: `ibv_get_device_list`, the contexts `ibv_open_device` (in `verbs`,
//! which fills in the objects' entries) opens with [`Context::open`], the queries, async
//! events.
//!
//! The devices are srdma's (see `srdma::netdev::device_list`): one per address of every
//! interface that is up, named as `srdma devinfo` names them, loopback ones only when no other
//! interface has an address. `SRDMA_DEVICES` (or the file named by
//! `SRDMA_CONFIG`, else `/etc/srdma/devices.conf`) replaces that list: entries
//! `[NAME=]ADDRESS[:PORT]` separated by commas, blanks or lines (`#` starts a comment); a name
//! left out is the interface rule's name for a local address, else `srdma<k>`.
//!
//! A context opens its srdma device (binds UDP 4791 on the address) when the first object
//! that needs it is created, not at `ibv_open_device`: `ibv_devinfo` can query a device that
//! another process is using.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use srdma::{AsyncEvent, Device, DeviceConfig, Mtu};

use crate::abi_core::*;
use crate::{guard, set_errno};

/// `IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_SYS_IMAGE_GUID |
/// IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B`: what
/// `srdma devinfo` reports.
const DEVICE_CAP_FLAGS: u32 = (1 << 1) | (1 << 2) | (1 << 11) | (1 << 12) | (1 << 17) | (1 << 24);
/// What a count srdma does not bound reads as (`INT_MAX`, as `srdma devinfo` prints it).
const UNLIMITED: c_int = c_int::MAX;

/// One device of the list: the C struct handed out, and how to open it.
#[repr(C)]
pub(crate) struct DevEntry {
    /// Must stay first: a `*mut ibv_device` is a `*mut DevEntry`.
    c: ibv_device,
    pub(crate) cfg: DeviceConfig,
}

// SAFETY: the C struct holds only plain bytes and null function pointers; entries are never
// written after the list is built.
unsafe impl Sync for DevEntry {}
// SAFETY: as Sync.
unsafe impl Send for DevEntry {}

/// Built once, never changed afterwards: the entries' addresses are stable.
static DEVICES: OnceLock<Vec<DevEntry>> = OnceLock::new();

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// The devices, read once per process (`srdma::netdev::device_list` of `SRDMA_DEVICES`).
pub(crate) fn devices() -> &'static [DevEntry] {
    DEVICES.get_or_init(|| {
        let list = std::env::var("SRDMA_DEVICES").ok();
        srdma::netdev::device_list(list.as_deref(), false)
            .into_iter()
            .enumerate()
            .map(|(i, cfg)| {
                // SAFETY: ibv_device is plain C data (chars, enums, nullable fn pointers):
                // all zeroes is a valid value.
                let mut c: ibv_device = unsafe { std::mem::zeroed() };
                c.node_type = IBV_NODE_CA;
                c.transport_type = IBV_TRANSPORT_IB;
                copy_cstr(&mut c.name, &cfg.name);
                copy_cstr(&mut c.dev_name, &format!("uverbs{i}"));
                copy_cstr(
                    &mut c.dev_path,
                    &format!("/sys/class/infiniband_verbs/uverbs{i}"),
                );
                copy_cstr(
                    &mut c.ibdev_path,
                    &format!("/sys/class/infiniband/{}", cfg.name),
                );
                DevEntry { c, cfg }
            })
            .collect()
    })
}

/// An open device: the `verbs_context` handed out (its `context` member is the
/// `ibv_context`), the srdma device once opened, and the async event queue.
#[repr(C)]
pub(crate) struct Context {
    /// Must stay first: `ibv_context` pointers are converted back with [`Context::from_c`].
    pub(crate) vctx: verbs_context,
    pub(crate) entry: &'static DevEntry,
    /// `ibv_context.cmd_fd`: a kernel device's is the uverbs command file; srdma has no
    /// commands to send, but programs dup it (to import the context elsewhere, which
    /// `ibv_import_device` then refuses with EOPNOTSUPP), so it is a real descriptor.
    _cmd_fd: OwnedFd,
    dev: Mutex<Option<Device>>,
    /// QP1 of the device, for librdmacm's IB CM (opened on first use).
    gsi: Mutex<Option<srdma::ibcm::Gsi>>,
    pub(crate) sink: Arc<Sink>,
}

/// Where a context's async events go: shared with the device's event handler, which may
/// outlive the context (objects keep the device open).
pub(crate) struct Sink {
    async_fd: OwnedFd,
    events: Mutex<Events>,
    /// Notified by every `ibv_ack_async_event`: a destroy waits on it for its object's events.
    acked: Condvar,
    /// The CQs and QPs of the context, by srdma id / QPN, for naming them in events.
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    /// The SRQs, by srdma id.
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
    closed: std::sync::atomic::AtomicBool,
}

/// The events waiting for `ibv_get_async_event`, and those taken but not yet acknowledged.
#[derive(Default)]
struct Events {
    queue: VecDeque<ibv_async_event>,
    /// Per object (the QP, CQ or SRQ pointer an event names): events taken by
    /// `ibv_get_async_event` and not yet acknowledged.
    unacked: HashMap<usize, u32>,
}

/// The object an event names (the `element` pointer of a QP, CQ or SRQ event), None for
/// port and device events.
fn object_of(ev: &ibv_async_event) -> Option<usize> {
    // CQ_ERR 0, the QP events 1-7 and 16, SRQ_ERR 14, SRQ_LIMIT_REACHED 15, WQ_FATAL 19.
    // SAFETY: for these types the element is one of its pointer members, all of one size
    // and place; reading it as the QP member reads the pointer's value, nothing behind it.
    matches!(ev.event_type, 0..=7 | 14..=16 | 19).then(|| unsafe { ev.element.qp } as usize)
}

// SAFETY: the raw pointers in queued events name the application's own objects; the library
// never dereferences them, it only hands them back through ibv_get_async_event.
unsafe impl Send for Sink {}
// SAFETY: as Send; every field is behind a Mutex or atomic.
unsafe impl Sync for Sink {}

impl Sink {
    /// Queues an async event for `ibv_get_async_event` and makes `async_fd` readable.
    ///
    /// As the kernel's, `async_fd` is readable exactly while events wait: signalled by the
    /// push that makes the queue non-empty, cleared by the pop that empties it, both under
    /// the queue's lock. (A program that waits in level-triggered epoll and takes one event
    /// per wake, as tgtd, would otherwise be woken again for an event already taken and
    /// block in `ibv_get_async_event` for good.)
    pub(crate) fn push(&self, ev: ibv_async_event) {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let mut q = lock(&self.events);
        if q.queue.is_empty() {
            signal(&self.async_fd);
        }
        q.queue.push_back(ev);
    }

    /// The next event, if any; `async_fd` stops being readable with the last. An event that
    /// names an object counts as unacknowledged on it until [`Sink::ack`].
    fn pop(&self) -> Option<ibv_async_event> {
        let mut q = lock(&self.events);
        let ev = q.queue.pop_front()?;
        if q.queue.is_empty() {
            drain(self.async_fd.as_raw_fd());
        }
        if let Some(obj) = object_of(&ev) {
            *q.unacked.entry(obj).or_default() += 1;
        }
        Some(ev)
    }

    /// `ibv_ack_async_event` of `ev`, an event [`Sink::pop`] returned.
    fn ack(&self, ev: &ibv_async_event) {
        let Some(obj) = object_of(ev) else {
            return;
        };
        let mut q = lock(&self.events);
        if let Some(n) = q.unacked.get_mut(&obj) {
            *n -= 1;
            if *n == 0 {
                q.unacked.remove(&obj);
            }
            self.acked.notify_all();
        }
    }

    /// Before object `obj` (a QP, CQ or SRQ pointer) is destroyed, as the kernel and
    /// rdma-core do: its events not yet taken are dropped (the application never sees an
    /// event naming a destroyed object), and those taken are waited for until acknowledged
    /// (a thread that took one may still read the object). An application that never
    /// acknowledges an event it took blocks here, as with rdma-core.
    pub(crate) fn forget(&self, obj: usize) {
        let mut q = lock(&self.events);
        let before = q.queue.len();
        q.queue.retain(|ev| object_of(ev) != Some(obj));
        if before != 0 && q.queue.is_empty() {
            drain(self.async_fd.as_raw_fd());
        }
        while q.unacked.contains_key(&obj) {
            q = self
                .acked
                .wait(q)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// The verbs form of an srdma event, if the object it names is still there.
    fn deliver(&self, ev: AsyncEvent) {
        // SAFETY: ibv_async_event is plain C data; all zeroes is valid.
        let mut e: ibv_async_event = unsafe { std::mem::zeroed() };
        // The object's map stays locked until the event is queued: a destroy, which removes
        // the object from its map before it drops the object's queued events
        // ([`Sink::forget`]), cannot fall between the two.
        match ev {
            AsyncEvent::CqError { cq } => {
                let cqs = lock(&self.cqs);
                let Some(&p) = cqs.get(&cq) else {
                    return;
                };
                e.element.cq = p as *mut ibv_cq;
                e.event_type = IBV_EVENT_CQ_ERR;
                self.push(e);
            }
            AsyncEvent::QpFatal { qpn }
            | AsyncEvent::QpLastWqeReached { qpn }
            | AsyncEvent::SqDrained { qpn } => {
                let qps = lock(&self.qps);
                let Some(&p) = qps.get(&qpn.value()) else {
                    return;
                };
                e.element.qp = p as *mut ibv_qp;
                e.event_type = match ev {
                    AsyncEvent::QpFatal { .. } => IBV_EVENT_QP_FATAL,
                    AsyncEvent::SqDrained { .. } => IBV_EVENT_SQ_DRAINED,
                    _ => IBV_EVENT_QP_LAST_WQE_REACHED,
                };
                self.push(e);
            }
            AsyncEvent::SrqLimitReached { srq } => {
                let srqs = lock(&self.srqs);
                let Some(&p) = srqs.get(&srq) else {
                    return;
                };
                e.element.srq = p as *mut ibv_srq;
                e.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
                self.push(e);
            }
            AsyncEvent::DeviceFatal => {
                e.element.port_num = 1;
                e.event_type = IBV_EVENT_DEVICE_FATAL;
                self.push(e);
            }
            _ => {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Context {
    /// The context behind `ctx`, or None for NULL.
    ///
    /// # Safety
    /// `ctx` is NULL or came from [`Context::open`] and is not closed.
    pub(crate) unsafe fn from_c<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
        if !crate::is_live(ctx) {
            return None;
        }
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, `ctx` is the `context` member of the `vctx` member (at
        // offset 0) of a live Context.
        Some(unsafe { &*ctx.cast::<u8>().sub(off).cast::<Context>() })
    }

    /// The `ibv_context` pointer of this context.
    pub(crate) fn c(&self) -> *mut ibv_context {
        (&raw const self.vctx.context).cast_mut()
    }

    /// The srdma device if it is open (without opening it).
    pub(crate) fn device_if_open(&self) -> Option<Device> {
        lock(&self.dev).clone()
    }

    /// The srdma device, opened on first use. Errors are errno values, with a message on
    /// stderr that says what to do.
    pub(crate) fn device(&self) -> Result<Device, c_int> {
        let mut d = lock(&self.dev);
        if let Some(dev) = &*d {
            return Ok(dev.clone());
        }
        match Device::open(self.entry.cfg.clone()) {
            Ok(dev) => {
                let sink = Arc::clone(&self.sink);
                dev.set_event_handler(Arc::new(move |ev| sink.deliver(ev)));
                // The port became active for this process: as a kernel device reports it
                // when its link comes up.
                // SAFETY: ibv_async_event is plain C data; all zeroes is valid.
                let mut e: ibv_async_event = unsafe { std::mem::zeroed() };
                e.element.port_num = 1;
                e.event_type = IBV_EVENT_PORT_ACTIVE;
                self.sink.push(e);
                fault_injection(&dev);
                *d = Some(dev.clone());
                Ok(dev)
            }
            Err(e) => {
                let errno = crate::errno_of(&e);
                if errno == libc::EADDRINUSE {
                    eprintln!(
                        "srdma: cannot open device {} on {}:{}: another process uses that address \
                         and port; give each process its own address (for example \
                         SRDMA_DEVICES=127.0.0.2 for the second one)",
                        self.entry.cfg.name, self.entry.cfg.addr, self.entry.cfg.port
                    );
                } else {
                    eprintln!("srdma: cannot open device {}: {e}", self.entry.cfg.name);
                }
                Err(errno)
            }
        }
    }
}

impl Context {
    /// The device's GSI QP (QP1), opened on first use: librdmacm's CM MADs go through it.
    pub(crate) fn gsi(&self) -> Result<srdma::ibcm::Gsi, c_int> {
        let dev = self.device()?;
        let mut g = lock(&self.gsi);
        if let Some(gsi) = &*g {
            return Ok(gsi.clone());
        }
        let gsi = srdma::ibcm::Gsi::open(&dev).map_err(|e| {
            eprintln!("srdma: cannot open QP1 on {}: {e}", self.entry.cfg.name);
            crate::errno_of(&e)
        })?;
        *g = Some(gsi.clone());
        Ok(gsi)
    }
}

/// Test hook: `SRDMA_INJECT_DEVICE_FAILURE_MS=N` makes the device's progress thread fail N ms
/// after it opens (to check that programs see IBV_EVENT_DEVICE_FATAL and error completions
/// instead of hanging).
fn fault_injection(dev: &Device) {
    let Some(ms) = std::env::var("SRDMA_INJECT_DEVICE_FAILURE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let dev = dev.clone();
    let _ = srdma::threads::spawn("srdma-inject", move || {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        dev.inject_failure();
    });
}

fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
    unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// Clears the async eventfd (blocking mode, as the application may want it): reads only
/// when `poll` says it is readable.
fn drain(fd: c_int) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 && p.revents & libc::POLLIN != 0 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64.
        unsafe { libc::read(fd, (&raw mut v).cast(), 8) };
    }
}

/// True when the application made `fd` non-blocking (`O_NONBLOCK`), as rdma-core's
/// event calls then return EAGAIN instead of waiting.
pub(crate) fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor the caller owns has no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// `ibv_get_device_list`: the srdma devices, NULL-terminated; `num_devices` (if not NULL)
/// gets their number.
///
/// # Safety
/// `num_devices` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(std::ptr::null_mut(), || {
        let devs = devices();
        let mut v: Vec<*mut ibv_device> =
            devs.iter().map(|d| (&raw const d.c).cast_mut()).collect();
        if !num_devices.is_null() {
            // SAFETY: non-null and valid for a write per the contract.
            unsafe { *num_devices = v.len() as c_int };
        }
        v.push(std::ptr::null_mut());
        // The array is freed by ibv_free_device_list, which needs its length: keep it in a
        // boxed slice whose first hidden element is the length.
        let mut boxed = Vec::with_capacity(v.len() + 1);
        boxed.push(v.len() as *mut ibv_device);
        boxed.extend(v);
        let raw = Box::into_raw(boxed.into_boxed_slice());
        // SAFETY: the slice has at least two elements; element 1 starts the list.
        unsafe { raw.cast::<*mut ibv_device>().add(1) }
    })
}

/// `ibv_free_device_list`: frees an array from [`ibv_get_device_list`] (the devices stay
/// valid, as with rdma-core, while contexts use them).
///
/// # Safety
/// `list` is NULL or came from `ibv_get_device_list` and is freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if list.is_null() {
            return;
        }
        // SAFETY: the hidden element before `list` holds the length of the rest; together
        // they are the boxed slice ibv_get_device_list leaked.
        unsafe {
            let base = list.sub(1);
            let n = *base as usize;
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                base,
                n + 1,
            )));
        }
    })
}

/// The entry behind a device pointer, if it is one of ours.
fn entry_of(device: *mut ibv_device) -> Option<&'static DevEntry> {
    devices()
        .iter()
        .find(|d| std::ptr::eq(&raw const d.c, device))
}

/// `ibv_get_device_name`: the device's name, or NULL (EINVAL) for an unknown device.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || match entry_of(device) {
        Some(e) => e.c.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    })
}

/// `ibv_get_device_guid`: the node GUID in network byte order (0 for an unknown device).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    guard(0, || match entry_of(device) {
        Some(e) => e.cfg.query_on(e.cfg.port).node_guid.to_be(),
        None => 0,
    })
}

/// `ibv_get_device_index`: the device's position in the list, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard(-1, || {
        devices()
            .iter()
            .position(|d| std::ptr::eq(&raw const d.c, device))
            .map_or(-1, |i| i as c_int)
    })
}

impl Context {
    /// A new context on `device` (NULL with errno on failure), for `ibv_open_device`: this
    /// module fills the device's own entries of its `verbs_context` (queries), `fill` the
    /// rest (the objects' constructors and the data path), so that the layer above, which
    /// serves those, need not be named here.
    pub(crate) fn open(
        device: *mut ibv_device,
        fill: impl FnOnce(&mut verbs_context),
    ) -> *mut ibv_context {
        let Some(entry) = entry_of(device) else {
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        };
        let eventfd = || {
            // SAFETY: eventfd has no memory arguments.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            // SAFETY: `fd` is a fresh descriptor we own.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        };
        let (Some(async_fd), Some(cmd_fd)) = (eventfd(), eventfd()) else {
            return std::ptr::null_mut();
        };
        let fd = async_fd.as_raw_fd();
        // SAFETY: verbs_context is plain C data: zeroed pointers are NULL function pointers
        // and a zeroed pthread mutex is PTHREAD_MUTEX_INITIALIZER on glibc.
        let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
        vctx.sz = std::mem::size_of::<verbs_context>();
        vctx.query_port = Some(vctx_query_port);
        vctx.query_device_ex = Some(vctx_query_device_ex);
        vctx.context.device = device;
        vctx.context.cmd_fd = cmd_fd.as_raw_fd();
        vctx.context.async_fd = fd;
        vctx.context.num_comp_vectors = c_int::try_from(entry.cfg.comp_vectors()).unwrap_or(1);
        vctx.context.abi_compat = usize::MAX as *mut c_void;
        fill(&mut vctx);
        let ctx = Box::new(Context {
            vctx,
            entry,
            _cmd_fd: cmd_fd,
            dev: Mutex::new(None),
            gsi: Mutex::new(None),
            sink: Arc::new(Sink {
                async_fd,
                events: Mutex::new(Events::default()),
                acked: Condvar::new(),
                cqs: Mutex::new(HashMap::new()),
                qps: Mutex::new(HashMap::new()),
                srqs: Mutex::new(HashMap::new()),
                closed: std::sync::atomic::AtomicBool::new(false),
            }),
        });
        let ctx = Box::leak(ctx);
        crate::register(ctx.c());
        ctx.c()
    }
}

/// `ibv_close_device`: frees the context (0, or EINVAL for NULL). Objects still open on it
/// keep the srdma device alive until they are destroyed.
///
/// # Safety
/// `context` is NULL or an open context, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            return libc::EINVAL;
        };
        ctx.sink
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        crate::unregister(context);
        // SAFETY: the Context was leaked from a Box in Context::open; closed once.
        drop(unsafe { Box::from_raw(std::ptr::from_ref(ctx).cast_mut()) });
        0
    })
}

fn mtu_num(m: Mtu) -> u32 {
    m.as_u32()
}

/// Fills `attr` as `ibv_query_device` does.
fn fill_device_attr(ctx: &Context, attr: &mut ibv_device_attr) {
    let cfg = &ctx.entry.cfg;
    let a = cfg.query_on(cfg.port);
    let l = &cfg.limits;
    // SAFETY: plain C data; all zeroes is valid.
    *attr = unsafe { std::mem::zeroed() };
    copy_cstr(&mut attr.fw_ver, &a.fw_ver);
    attr.node_guid = a.node_guid.to_be();
    attr.sys_image_guid = a.node_guid.to_be();
    attr.max_mr_size = a.max_mr_size;
    attr.page_size_cap = a.page_size_cap;
    attr.vendor_id = a.vendor_id;
    attr.max_qp = a.max_qp as c_int;
    attr.max_qp_wr = a.max_qp_wr as c_int;
    attr.device_cap_flags = DEVICE_CAP_FLAGS;
    attr.max_sge = a.max_sge as c_int;
    attr.max_sge_rd = l.max_sge_rd as c_int;
    attr.max_cq = UNLIMITED;
    attr.max_cqe = a.max_cqe as c_int;
    attr.max_mr = a.max_mr as c_int;
    attr.max_mw = a.max_mw as c_int;
    attr.max_pd = UNLIMITED;
    attr.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
    attr.max_res_rd_atom = a
        .max_qp_rd_atom
        .saturating_mul(a.max_qp)
        .min(UNLIMITED as u32) as c_int;
    attr.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
    attr.atomic_cap = a.atomic_cap;
    attr.max_ah = UNLIMITED;
    attr.max_mcast_grp = a.max_mcast_grp as c_int;
    attr.max_mcast_qp_attach = a.max_mcast_qp_attach as c_int;
    attr.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach as c_int;
    attr.max_srq = UNLIMITED;
    attr.max_srq_wr = a.max_srq_wr as c_int;
    attr.max_srq_sge = a.max_srq_sge as c_int;
    attr.max_pkeys = l.pkey_tbl_len;
    attr.local_ca_ack_delay = l.local_ca_ack_delay;
    attr.phys_port_cnt = a.phys_port_cnt;
}

/// `ibv_query_device`.
///
/// # Safety
/// `context` is an open context or NULL; `attr` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-null and valid for a write per the contract.
        fill_device_attr(ctx, unsafe { &mut *attr });
        0
    })
}

/// `verbs_context.query_device_ex`: the legacy attributes plus the extended ones srdma has
/// (none beyond the legacy set, so they read as a device without the features).
unsafe extern "C" fn vctx_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes its context.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: `input` is NULL or readable, per ibv_query_device_ex.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        let need = std::mem::offset_of!(ibv_device_attr_ex, orig_attr)
            + std::mem::size_of::<ibv_device_attr>();
        if attr.is_null() || attr_size < need {
            return libc::EINVAL;
        }
        // SAFETY: plain C data; all zeroes is valid.
        let mut full: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        fill_device_attr(ctx, &mut full.orig_attr);
        full.device_cap_flags_ex = u64::from(DEVICE_CAP_FLAGS);
        full.phys_port_cnt_ex = u32::from(full.orig_attr.phys_port_cnt);
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: `attr` is valid for `attr_size` bytes (the caller's struct), and we copy
        // at most that many from a live local.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            std::ptr::copy_nonoverlapping((&raw const full).cast::<u8>(), attr.cast::<u8>(), n);
        }
        0
    })
}

fn fill_port_attr(ctx: &Context) -> ibv_port_attr {
    let pa = match &*lock(&ctx.dev) {
        Some(d) => d.query_port(),
        None => ctx.entry.cfg.query_port(),
    };
    // SAFETY: plain C data; all zeroes is valid.
    let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
    a.state = pa.state;
    a.max_mtu = mtu_num(pa.max_mtu);
    a.active_mtu = mtu_num(pa.active_mtu);
    a.gid_tbl_len = pa.gid_tbl_len as c_int;
    a.max_msg_sz = pa.max_msg_sz.min(u64::from(u32::MAX)) as u32;
    a.bad_pkey_cntr = pa.bad_pkey_cntr.min(u64::from(u32::MAX)) as u32;
    a.qkey_viol_cntr = pa.qkey_viol_cntr.min(u64::from(u32::MAX)) as u32;
    a.pkey_tbl_len = pa.pkey_tbl_len;
    a.max_vl_num = 1;
    a.active_width = 1;
    a.active_speed = 1;
    a.phys_state = 5;
    a.link_layer = IBV_LINK_LAYER_ETHERNET as u8;
    a
}

/// `verbs_context.query_port`: what the inline `ibv_query_port` calls.
unsafe extern "C" fn vctx_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the inline caller passes its context.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            return libc::EINVAL;
        };
        if port_num != 1 || port_attr.is_null() {
            return libc::EINVAL;
        }
        let a = fill_port_attr(ctx);
        let n = port_attr_len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's struct is `port_attr_len` bytes; we write at most that.
        unsafe {
            std::ptr::write_bytes(port_attr.cast::<u8>(), 0, port_attr_len);
            std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), port_attr.cast::<u8>(), n);
        }
        0
    })
}

/// `ibv_query_port` (the exported one, called with the pre-v1.x layout that ends after
/// `link_layer`; the inline wrapper of current headers calls `verbs_context.query_port`).
///
/// # Safety
/// `context` is an open context or NULL; `port_attr` NULL or valid for the old layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // The compat layout is ibv_port_attr up to and including link_layer, plus a pad byte.
    let len = std::mem::offset_of!(ibv_port_attr, link_layer) + 2;
    // SAFETY: forwarded under the same contract, with the compat length.
    unsafe { vctx_query_port(context, port_num, port_attr, len) }
}

fn gid_table(ctx: &Context) -> Vec<srdma::Gid> {
    let cfg = &ctx.entry.cfg;
    cfg.gids_on(cfg.port)
}

/// What the kernel answers an address vector whose source GID is table entry `index`
/// (`rdma_get_gid_attr`): EINVAL past the table, ENODATA for an empty entry; None when the
/// entry holds a GID.
pub(crate) fn sgid_index_errno(ctx: &Context, index: u8) -> Option<c_int> {
    if u32::from(index) >= ctx.entry.cfg.limits.gid_tbl_len {
        Some(libc::EINVAL)
    } else if usize::from(index) >= gid_table(ctx).len() {
        Some(libc::ENODATA)
    } else {
        None
    }
}

/// `ibv_query_gid`: GID table entry `index` of port 1 (EINVAL past the table; empty slots
/// read as zero, as on rxe).
///
/// # Safety
/// `context` is an open context or NULL; `gid` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let len = ctx.entry.cfg.limits.gid_tbl_len as c_int;
        if port_num != 1 || gid.is_null() || index < 0 || index >= len {
            set_errno(libc::EINVAL);
            return -1;
        }
        let raw = gid_table(ctx)
            .get(index as usize)
            .map_or([0u8; 16], |g| g.0);
        // SAFETY: non-null, valid for a write per the contract.
        unsafe { (*gid).raw = raw };
        0
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by ibv_devinfo): every srdma GID is
/// RoCE v2, which this private call numbers `IBV_GID_TYPE_SYSFS_ROCE_V2` (1), not
/// `IBV_GID_TYPE_ROCE_V2` (2) as `ibv_query_gid_ex` does.
///
/// # Safety
/// `type_` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    type_: *mut u32,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if port_num != 1 || type_.is_null() || index >= ctx.entry.cfg.limits.gid_tbl_len {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: non-null and valid per the contract.
        unsafe { *type_ = IBV_GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}

fn gid_entry(ctx: &Context, index: u32) -> Option<ibv_gid_entry> {
    let gids = gid_table(ctx);
    let g = gids.get(index as usize)?;
    // SAFETY: plain C data; all zeroes is valid.
    let mut e: ibv_gid_entry = unsafe { std::mem::zeroed() };
    e.gid.raw = g.0;
    e.gid_index = index;
    e.port_num = 1;
    e.gid_type = IBV_GID_TYPE_ROCE_V2;
    e.ndev_ifindex = ifindex_of(ctx.entry.cfg.addr);
    Some(e)
}

fn ifindex_of(addr: IpAddr) -> u32 {
    let Some(dev) = srdma::netdev::local_device(addr) else {
        return 0;
    };
    let base = dev.ifname.split(':').next().unwrap_or("").to_string();
    let Ok(name) = std::ffi::CString::new(base) else {
        return 0;
    };
    // SAFETY: a valid NUL-terminated string.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): one GID entry with its type;
/// ENODATA for an empty slot, EINVAL past the table.
///
/// # Safety
/// `entry` is NULL or valid for `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            return libc::EINVAL;
        };
        if port_num != 1 || flags != 0 || entry.is_null() {
            return libc::EINVAL;
        }
        if entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        if gid_index >= ctx.entry.cfg.limits.gid_tbl_len {
            return libc::EINVAL;
        }
        match gid_entry(ctx, gid_index) {
            Some(e) => {
                // SAFETY: valid for at least one ibv_gid_entry per the size check.
                unsafe { *entry = e };
                0
            }
            None => libc::ENODATA,
        }
    })
}

/// `_ibv_query_gid_table`: the valid GID entries; returns how many, or a negative errno.
///
/// # Safety
/// `entries` is valid for `max_entries` entries of `entry_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        // SAFETY: per the contract.
        let Some(ctx) = (unsafe { Context::from_c(context) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        let n = gid_table(ctx).len();
        if n > max_entries || (n > 0 && entries.is_null()) {
            return -(libc::EINVAL as isize);
        }
        for i in 0..n {
            if let Some(e) = gid_entry(ctx, i as u32) {
                // SAFETY: i < max_entries entries of `entry_size` bytes each.
                unsafe {
                    *entries
                        .cast::<u8>()
                        .add(i * entry_size)
                        .cast::<ibv_gid_entry>() = e;
                }
            }
        }
        n as isize
    })
}

/// `ibv_query_pkey`: the one P_Key, 0xFFFF (network order), at index 0.
///
/// # Safety
/// `pkey` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let ok = unsafe { Context::from_c(context) }.is_some();
        if !ok || port_num != 1 || index != 0 || pkey.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: non-null, valid per the contract.
        unsafe { *pkey = 0xFFFFu16.to_be() };
        0
    })
}

/// `ibv_get_pkey_index`: index 0 for the default P_Key (0xFFFF or 0x7FFF, network order),
/// else -1 with ENOENT.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_pkey_index(context: *mut ibv_context, port_num: u8, pkey: u16) -> c_int {
    guard(-1, || {
        // SAFETY: the pointer is only compared and converted if it is one of ours.
        let ok = unsafe { Context::from_c(context) }.is_some();
        let p = u16::from_be(pkey) & 0x7FFF;
        if ok && port_num == 1 && p == 0x7FFF {
            0
        } else {
            set_errno(libc::ENOENT);
            -1
        }
    })
}

/// `ibv_get_async_event`: the next async event; blocks unless `async_fd` is non-blocking
/// (then -1 with EAGAIN). The wait is a poll(2) of `async_fd`, made in this frame outside
/// the panic boundary: a cancellation point, as rdma-core's read(2) of the kernel's file
/// (see `signals`).
///
/// # Safety
/// `event` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    loop {
        // (0, _): an event; (-1, _): an error; (1, fd): wait for `fd`.
        let (rc, fd) = guard((-1, -1), || {
            crate::signals::without_cancellation(|| {
                // SAFETY: per the contract.
                let Some(ctx) = (unsafe { Context::from_c(context) }) else {
                    set_errno(libc::EINVAL);
                    return (-1, -1);
                };
                if event.is_null() {
                    set_errno(libc::EINVAL);
                    return (-1, -1);
                }
                if let Some(ev) = ctx.sink.pop() {
                    // SAFETY: non-null, valid per the contract.
                    unsafe { *event = ev };
                    return (0, -1);
                }
                let fd = ctx.vctx.context.async_fd;
                if is_nonblocking(fd) {
                    set_errno(libc::EAGAIN);
                    return (-1, -1);
                }
                (1, fd)
            })
        });
        if rc != 1 {
            return rc;
        }
        // Readable means an event is queued: the next turn takes it.
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a cancellation point, this frame holds nothing to drop.
        let r = unsafe { crate::signals::cancellable_poll(&mut p, 1, -1) };
        // SAFETY: errno is thread-local and always readable.
        if r < 0 && unsafe { *libc::__errno_location() } != libc::EINTR {
            return -1;
        }
    }
}

/// `ibv_ack_async_event`: the event is handled. Destroying the QP, CQ or SRQ it names waits
/// for this, as in rdma-core.
///
/// # Safety
/// `event` is NULL or an event from `ibv_get_async_event`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        if event.is_null() {
            return;
        }
        // SAFETY: `event` is readable per the contract.
        let ev = unsafe { &*event };
        let Some(obj) = object_of(ev) else {
            return;
        };
        // SAFETY: the event came from ibv_get_async_event and is not acknowledged yet, so the
        // QP, CQ or SRQ it names is live (destroying it waits for this call); each of those
        // structs begins with its `ibv_context` pointer.
        let ctx = unsafe { *(obj as *const *mut ibv_context) };
        // SAFETY: a live object's context is open.
        if let Some(ctx) = unsafe { Context::from_c(ctx) } {
            ctx.sink.ack(ev);
        }
    })
}

/// `ibv_fork_init`: nothing to do (memory is reached by address, not DMA): 0.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing to do: 0.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: nothing to do: 0.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
