//! Posting tiers beyond [`Qp::post_send`]: a safe tier that moves owned buffer leases into
//! the work request and hands them back with the completion, and an unsafe raw tier with the
//! `ibv_post_send` contract.
//!
//! # The tiers
//!
//! | tier | API | who owns the bytes while the WR is in flight |
//! |---|---|---|
//! | SGE (default) | [`Qp::post_send`], [`Qp::post_recv`] | the application keeps its [`Mr`] |
//! | batch | [`Qp::post_send_batch`] | as above, one doorbell for many WRs |
//! | lease (safe) | [`LeasedQp::post_send`], [`LeasedQp::post_recv`] | the [`LeasedQp`]: the [`Buf`] was moved in |
//! | raw (unsafe) | [`RawPost::post_send_raw`], [`RawPost::post_recv_raw`] | the caller, under the `ibv_post_send` contract |
//!
//! With the SGE tier every access to registered memory happens under the device lock, so it
//! is memory-safe, but nothing stops the application from rewriting a send buffer while the
//! WR is in flight: what goes on the wire (or is retransmitted) can change under a racing
//! writer. The lease tier removes that possibility at compile time.
//!
//! # Leases
//!
//! A [`BufPool`] is a set of fixed-size buffers registered on a device. [`BufPool::lease`]
//! hands out a [`Buf`], which *exclusively owns* one buffer: it derefs to `[u8]`, and
//! [`Buf::as_mut_slice`] is a plain `&mut [u8]` — no device lock, no copy. Posting moves the
//! `Buf` into a [`LeasedQp`]; the application has nothing left to touch, so using a buffer
//! while it is in flight does not compile:
//!
//! ```compile_fail,E0382
//! # fn f(qp: &srdma::lease::LeasedQp, pool: &srdma::lease::BufPool) {
//! let mut buf = pool.lease().unwrap();
//! buf.copy_from(b"hello");
//! qp.post_send(buf, srdma::SendOp::Send).unwrap();
//! buf.as_mut_slice()[0] = b'j'; // error[E0382]: borrow of moved value: `buf`
//! # }
//! ```
//!
//! The completion gives it back: [`LeasedQp::poll`] returns `(Wc, Buf)` pairs, matched by the
//! `wr_id` the wrapper assigns (the one `post_*` returns); the `Buf` of a receive is cut to
//! the received length. A refused post returns the `Buf` with the error, an error or flush
//! completion returns it like a successful one, and dropping the `LeasedQp` destroys its QP
//! first and then releases whatever was in flight back to the pool — nothing leaks, and no
//! buffer returns to the pool while the engine may still touch it. Dropping a `Buf` returns
//! its buffer to the pool.
//!
//! ## Why handing out `&mut [u8]` is sound
//!
//! The engine reads and writes registered memory (under the device lock) only where a work
//! request or a remote key lets it. A pool is therefore built so that the only such requests
//! are the ones made with a `Buf` moved into a `LeasedQp`:
//!
//! * a pool has its own protection domain, which no application handle reaches: its QPs are
//!   [`LeasedQp`]s, which never expose their [`Qp`], and an L_Key forged into a WR on any
//!   other QP fails the engine's PD check (a local protection error, no access);
//! * its buffers are registered with [`AccessFlags::LOCAL_WRITE`] only, so they have no R_Key
//!   and no peer can reach them;
//! * each buffer is its own memory region, so the engine's accesses to an in-flight buffer
//!   never form a reference covering another (leased) buffer.
//!
//! That is why a pool is made with [`BufPool::new`] rather than from an existing
//! [`Mr`]: an application-registered region lives in an application PD and its
//! L_Key is known, so a plain [`Qp::post_recv`] could have the engine write into bytes a
//! `Buf` is lending out as `&mut [u8]`. The cost of one region per buffer is at least a page
//! per buffer (regions are page-aligned) and one MR-table entry each.
//!
//! ## Remote memory
//!
//! The target of an RDMA WRITE, READ or atomic stays a plain [`RemoteMr`](crate::RemoteMr)
//! (or [`RemoteAddr`](crate::typed::RemoteAddr)): it is the peer's memory, whose lifetime
//! and contents are the peer's business, and every access to it is checked by the peer's
//! engine against its R_Key — a stale or wrong target is a remote access error completion
//! (which still returns the local `Buf`), never memory unsafety here. The *local* side of
//! such an operation is the leased `Buf`: its [`len`](Buf::len) bytes are written from, or
//! read into. A region meant as an RDMA target cannot be a pool buffer, since a pool buffer
//! has no remote access by construction. For a `LeasedQp` that peers should reach with
//! one-sided operations, register a plain region in the pool's PD with [`BufPool::reg_mr`]:
//! it is an ordinary [`Mr`] (accessed under the device lock, like any other), and
//! since it is a separate region it never overlaps a buffer.
//!
//! ## Example
//!
//! ```
//! use srdma::lease::{BufPool, LeasedQp};
//! use srdma::{ConnectParams, Device, DeviceConfig, Mtu, QpType, RemoteQp, SendOp, WcStatus};
//! use srdma_wire::Psn;
//!
//! let open = || { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() };
//! let (a, b) = (open(), open());
//! let (pool_a, pool_b) = (BufPool::new(&a, 4, 4096).unwrap(), BufPool::new(&b, 4, 4096).unwrap());
//! let qa = LeasedQp::new(&pool_a, QpType::Rc).unwrap();
//! let qb = LeasedQp::new(&pool_b, QpType::Rc).unwrap();
//! let at = |d: &Device, qp: &LeasedQp, psn| RemoteQp { qpn: qp.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! qa.connect(&at(&b, &qb, 2), &ConnectParams::new(Mtu::Mtu1024, Psn::new(1))).unwrap();
//! qb.connect(&at(&a, &qa, 1), &ConnectParams::new(Mtu::Mtu1024, Psn::new(2))).unwrap();
//!
//! // B lends a buffer to its receive queue; A fills one and sends it.
//! let rx_id = qb.post_recv(pool_b.lease().unwrap()).map_err(|(e, _)| e).unwrap();
//! let mut buf = pool_a.lease().unwrap();
//! buf.copy_from(b"hello");
//! qa.post_send(buf, SendOp::Send).map_err(|(e, _)| e).unwrap();
//! // `buf` is gone until the completion returns it.
//! let (wc, sent) = loop { if let Some(x) = qa.poll() { break x } };
//! assert_eq!(wc.status, WcStatus::Success);
//! assert_eq!(&sent[..], b"hello");
//! let (wc, got) = loop { if let Some(x) = qb.poll() { break x } };
//! assert_eq!((wc.wr_id, wc.status), (rx_id, WcStatus::Success));
//! assert_eq!(&got[..], b"hello");
//! ```
//!
//! # The raw tier
//!
//! [`RawPost`] is the verbs contract spelled as `unsafe`: the caller promises what
//! `ibv_post_send` demands of C code. In srdma today this changes *no* check: the engine
//! re-validates every SGE against the MR table whenever it reads or writes it, and all of
//! that happens under the device lock, so breaking the contract yields wrong data or an error
//! completion, not undefined behaviour. The tier exists so that code written against the
//! contract keeps its meaning on a backend that does DMA straight from application memory
//! (a NIC, or a future zero-copy srdma path), where it is the only place such a promise can be
//! stated; it is not faster than [`Qp::post_send`] today (it clones the WR).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use srdma_proto::{
    AccessFlags, AttrMask, QpAttr, QpCaps, QpState, QpType, RecvWr, SendOp, SendWr, Sge, SgeList,
    UdDest, Wc,
};
use srdma_wire::{Psn, Qpn};

use crate::cq::Cq;
use crate::device::{Device, Mr, Pd};
use crate::error::{Error, Result};
use crate::qp::{ConnectParams, Qp, QpInit, RemoteQp};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data (a free list, a map of leases) stays consistent across a panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A pool of fixed-size registered buffers, handed out as [`Buf`] leases. Cheap to clone:
/// clones share the pool. The memory is freed when the pool and every `Buf` are gone.
#[derive(Debug, Clone)]
pub struct BufPool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    /// The pool's own protection domain: only [`LeasedQp`]s of this pool live in it.
    pd: Pd,
    /// One region per buffer, index = slot number.
    mrs: Vec<Mr>,
    /// Slot numbers not leased out.
    free: Mutex<Vec<u32>>,
    slot_size: usize,
}

impl BufPool {
    /// Registers `count` buffers of `slot_size` bytes each on `dev`, in a protection domain
    /// of their own, with local access only (see the [module docs](self) for why).
    ///
    /// Each buffer is its own page-aligned region, so it takes at least one page.
    pub fn new(dev: &Device, count: usize, slot_size: usize) -> Result<BufPool> {
        if count == 0 || count > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "a pool of {count} buffers: need 1..=u32::MAX"
            )));
        }
        if slot_size == 0 || slot_size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "buffers of {slot_size} bytes: need 1..=u32::MAX (one SGE)"
            )));
        }
        let pd = dev.alloc_pd();
        let mut mrs = Vec::with_capacity(count);
        for _ in 0..count {
            let mr = pd.reg_mr(slot_size, AccessFlags::LOCAL_WRITE)?;
            // `Buf` turns the region's address back into a pointer: make sure it is one.
            let base = mr.with_bytes(|b| b.as_ptr() as u64);
            if base != mr.addr() || mr.rkey().is_some() {
                return Err(Error::InvalidArgument(
                    "registered memory is not addressable in place".into(),
                ));
            }
            mrs.push(mr);
        }
        Ok(BufPool {
            inner: Arc::new(PoolInner {
                pd,
                mrs,
                // Popped from the end: lease slot 0 first.
                free: Mutex::new((0..count as u32).rev().collect()),
                slot_size,
            }),
        })
    }

    /// `ibv_reg_mr` of an ordinary region in the pool's protection domain, so that peers of
    /// this pool's [`LeasedQp`]s can reach it with RDMA (a pool buffer never can). It is a
    /// separate region, read and written under the device lock like any [`Mr`]; the pool's
    /// buffers stay out of its reach.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        self.inner.pd.reg_mr(len, access)
    }

    /// Leases a free buffer (length 0, capacity [`slot_size`](Self::slot_size)), or `None`
    /// when every buffer is out.
    pub fn lease(&self) -> Option<Buf> {
        let index = lock(&self.inner.free).pop()?;
        Some(Buf {
            pool: Arc::clone(&self.inner),
            index,
            len: 0,
        })
    }

    /// Buffers in the pool.
    pub fn count(&self) -> usize {
        self.inner.mrs.len()
    }

    /// Buffers not leased out right now.
    pub fn available(&self) -> usize {
        lock(&self.inner.free).len()
    }

    /// Bytes per buffer.
    pub fn slot_size(&self) -> usize {
        self.inner.slot_size
    }

    /// The device the buffers are registered on.
    pub fn device(&self) -> &Device {
        self.inner.pd.device()
    }
}

/// A leased buffer: exclusive ownership of one pool buffer, with a length (the bytes that
/// count: what a send sends, what a receive got) up to its capacity.
///
/// Derefs to the first [`len`](Self::len) bytes. Dropping it returns the buffer to its pool;
/// posting it on a [`LeasedQp`] moves it into the work request until the completion.
#[derive(Debug)]
pub struct Buf {
    pool: Arc<PoolInner>,
    index: u32,
    len: usize,
}

impl Buf {
    fn mr(&self) -> &Mr {
        &self.pool.mrs[self.index as usize]
    }

    fn ptr(&self) -> *mut u8 {
        // The region's address is its allocation's base pointer cast to an integer (checked
        // in `BufPool::new`), which exposed that pointer's provenance.
        std::ptr::with_exposed_provenance_mut(self.mr().addr() as usize)
    }

    /// Bytes the buffer holds at most.
    pub fn capacity(&self) -> usize {
        self.pool.slot_size
    }

    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no byte is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the bytes in use (the buffer's bytes are always initialised: zero or old data).
    ///
    /// # Panics
    /// If `len` is above the [`capacity`](Self::capacity).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity(),
            "length {len} above a {}-byte buffer",
            self.capacity()
        );
        self.len = len;
    }

    /// Copies `data` to the start of the buffer and makes it the content.
    ///
    /// # Panics
    /// If `data` is longer than the [`capacity`](Self::capacity).
    pub fn copy_from(&mut self, data: &[u8]) {
        self.set_len(data.len());
        self.as_mut_slice().copy_from_slice(data);
    }

    /// The bytes in use.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the pointer is the base of this slot's live allocation (the pool, kept
        // alive by `self.pool`, owns the `Mr`), valid for `capacity() >= len` initialised
        // bytes. The engine touches the slot only for a WR posted with this `Buf` moved into a
        // `LeasedQp` (own PD, no R_Key: see the module docs), which cannot be the case while
        // `self` is borrowed here; the last such access happened-before this via the device
        // lock and the CQ lock the completion passed through.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes in use, writable — in place, without the device lock.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference, since a `Buf`
        // is the only owner of its slot (the free list hands each slot out once).
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// The whole buffer (all [`capacity`](Self::capacity) bytes), writable; pair with
    /// [`set_len`](Self::set_len).
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_mut_slice`, for the whole slot.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.capacity()) }
    }

    fn sge(&self, len: usize) -> Sge {
        self.mr().sge(0, len)
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        lock(&self.pool.free).push(self.index);
    }
}

/// A queue pair whose work requests own their buffers: post a [`Buf`], get it back with the
/// completion from [`poll`](Self::poll).
///
/// It owns its QP (never exposed, so no other code can post on it) and two completion
/// queues of its own. Shareable between threads: every method takes `&self`.
#[derive(Debug)]
pub struct LeasedQp {
    // Field order is drop order: the QP is destroyed (its slot leaves the device, under the
    // device lock) before the in-flight leases go back to the pool, so a buffer is never
    // reused while the engine could still reach it.
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    pool: BufPool,
    flight: Mutex<InFlight>,
}

#[derive(Debug, Default)]
struct InFlight {
    next_id: u64,
    bufs: HashMap<u64, Buf>,
}

impl LeasedQp {
    /// A QP of `qp_type` for buffers of `pool`, with [`QpInit::new`]'s queue sizes.
    pub fn new(pool: &BufPool, qp_type: QpType) -> Result<LeasedQp> {
        let cq = pool.device().create_cq(1, None)?;
        let caps = QpInit::new(qp_type, &cq, &cq).caps;
        LeasedQp::with_caps(pool, qp_type, caps)
    }

    /// A QP of `qp_type` for buffers of `pool` with queue capacities `caps`. Every send is
    /// signaled (a lease comes back only with a completion); the CQs hold a full queue each.
    /// A UD QP gets [`QpInit::new`]'s Q_Key.
    pub fn with_caps(pool: &BufPool, qp_type: QpType, caps: QpCaps) -> Result<LeasedQp> {
        let dev = pool.device();
        let send_cq = dev.create_cq(caps.max_send_wr.max(1) as usize, None)?;
        let recv_cq = dev.create_cq(caps.max_recv_wr.max(1) as usize, None)?;
        let mut init = QpInit::new(qp_type, &send_cq, &recv_cq);
        init.caps = caps;
        init.sq_sig_all = true;
        let qp = pool.inner.pd.create_qp(&init)?;
        Ok(LeasedQp {
            qp,
            send_cq,
            recv_cq,
            pool: pool.clone(),
            flight: Mutex::new(InFlight::default()),
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.qp.qpn()
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.qp.qp_type()
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.qp.state()
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        self.qp.query()
    }

    /// The QP's transport counters.
    pub fn counters(&self) -> srdma_proto::Counters {
        self.qp.counters()
    }

    /// `ibv_modify_qp` (see [`Qp::modify`]); moving to ERR flushes the in-flight leases back
    /// through [`poll`](Self::poll).
    ///
    /// Moving to RESET is refused: it discards the queues without completions, which would
    /// strand their leases until the `LeasedQp` is dropped. Go to ERR and poll instead.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Reset {
            return Err(Error::InvalidArgument(
                "a LeasedQp does not go to RESET (it would drop its leases' WQEs): use ERR".into(),
            ));
        }
        self.qp.modify(attr, mask)
    }

    /// RC/UC: INIT → RTR → RTS towards `remote` (see [`Qp::connect`]).
    pub fn connect(&self, remote: &RemoteQp, p: &ConnectParams) -> Result<()> {
        self.qp.connect(remote, p)
    }

    /// UD: INIT → RTR → RTS (see [`Qp::activate`]).
    pub fn activate(&self, sq_psn: Psn) -> Result<()> {
        self.qp.activate(sq_psn)
    }

    /// The pool its buffers come from.
    pub fn pool(&self) -> &BufPool {
        &self.pool
    }

    /// Leases posted and not yet returned by [`poll`](Self::poll).
    pub fn in_flight(&self) -> usize {
        lock(&self.flight).bufs.len()
    }

    /// Posts `op` with `buf` as its local buffer: the [`len`](Buf::len) bytes sent or
    /// written, the place a READ's data or an atomic's original value lands (set the length
    /// first: 8 for an atomic). The remote side of a WRITE/READ/atomic is in `op` (see the
    /// [module docs](self#remote-memory)).
    ///
    /// Returns the `wr_id` its completion will carry; on a refused post, the error and `buf`.
    pub fn post_send(&self, buf: Buf, op: SendOp) -> std::result::Result<u64, (Error, Buf)> {
        self.post_send_inner(buf, op, None)
    }

    /// UD: posts `op` (a SEND) with `buf` to `dest`; otherwise like
    /// [`post_send`](Self::post_send).
    pub fn post_send_to(
        &self,
        buf: Buf,
        op: SendOp,
        dest: UdDest,
    ) -> std::result::Result<u64, (Error, Buf)> {
        self.post_send_inner(buf, op, Some(dest))
    }

    fn post_send_inner(
        &self,
        buf: Buf,
        op: SendOp,
        ud: Option<UdDest>,
    ) -> std::result::Result<u64, (Error, Buf)> {
        let sge = buf.sge(buf.len());
        self.post(buf, |id| {
            let mut wr = SendWr::new(id, op, SgeList::one(sge));
            wr.ud = ud;
            self.qp.post_send(wr)
        })
    }

    /// Lends `buf` (its whole capacity) to the receive queue. Its completion returns it with
    /// the length set to the bytes received (for UD, including the 40-byte GRH area).
    ///
    /// Returns the `wr_id` its completion will carry; on a refused post, the error and `buf`.
    pub fn post_recv(&self, buf: Buf) -> std::result::Result<u64, (Error, Buf)> {
        let sge = buf.sge(buf.capacity());
        self.post(buf, |wr_id| {
            self.qp.post_recv(RecvWr {
                wr_id,
                sges: SgeList::one(sge),
            })
        })
    }

    /// Files `buf` under a fresh wr_id, then posts; takes it back if the post is refused.
    fn post(
        &self,
        buf: Buf,
        post: impl FnOnce(u64) -> Result<()>,
    ) -> std::result::Result<u64, (Error, Buf)> {
        if !Arc::ptr_eq(&buf.pool, &self.pool.inner) {
            return Err((
                Error::InvalidArgument("the buffer belongs to another pool".into()),
                buf,
            ));
        }
        // In the map before the post: another thread may poll the completion before `post`
        // returns.
        let id = {
            let mut f = lock(&self.flight);
            let mut id = f.next_id;
            while f.bufs.contains_key(&id) {
                id = id.wrapping_add(1);
            }
            f.next_id = id.wrapping_add(1);
            f.bufs.insert(id, buf);
            id
        };
        match post(id) {
            Ok(()) => Ok(id),
            Err(e) => {
                // A refused WR produces no completion, so the lease is still in the map.
                let buf = lock(&self.flight)
                    .bufs
                    .remove(&id)
                    .expect("a refused WR's lease stays filed");
                Err((e, buf))
            }
        }
    }

    /// The next send completion, then the next receive completion, with its buffer.
    pub fn poll(&self) -> Option<(Wc, Buf)> {
        self.poll_send().or_else(|| self.poll_recv())
    }

    /// The next send completion with its buffer.
    pub fn poll_send(&self) -> Option<(Wc, Buf)> {
        self.take(&self.send_cq, false)
    }

    /// The next receive completion with its buffer, its length set to the bytes received
    /// (0 for an error or flush).
    pub fn poll_recv(&self) -> Option<(Wc, Buf)> {
        self.take(&self.recv_cq, true)
    }

    fn take(&self, cq: &Cq, recv: bool) -> Option<(Wc, Buf)> {
        loop {
            let wc = cq.poll_one()?;
            // Every WR on this QP was posted by `post`, so its id is filed; skip anything else.
            let Some(mut buf) = lock(&self.flight).bufs.remove(&wc.wr_id) else {
                continue;
            };
            if recv {
                let got = if wc.is_success() {
                    wc.byte_len as usize
                } else {
                    0
                };
                buf.len = got.min(buf.capacity());
            }
            return Some((wc, buf));
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Qp {}
}

/// The raw posting tier: `ibv_post_send`/`ibv_post_recv` with their C contract.
///
/// What it changes in srdma today is the contract, not the checks: the engine validates
/// every SGE against the MR table (key, PD, rights, bounds) whenever it touches memory, under
/// the device lock, so a broken promise gives wrong data or an error completion rather than
/// undefined behaviour. Code written against this trait stays correct on a backend that
/// reads and writes application memory directly (a NIC, a zero-copy path), where the promise
/// is what soundness rests on. It is not faster than [`Qp::post_send`] today: it clones the
/// WR. Implemented for [`Qp`] only (sealed).
pub trait RawPost: sealed::Sealed {
    /// `ibv_post_send` of one WR, then the doorbell.
    ///
    /// # Safety
    /// Until the WR's completion has been polled (for an unsignaled WR: a later signaled
    /// completion on the same send queue), the caller guarantees that the memory every SGE
    /// names stays registered (its [`Mr`] is not dropped) and is neither written
    /// (for a SEND/WRITE source) nor read or written (for a READ/atomic destination) by
    /// anything but the device.
    unsafe fn post_send_raw(&self, wr: &SendWr) -> Result<()>;

    /// `ibv_post_recv` of one WR.
    ///
    /// # Safety
    /// Until the WR's completion has been polled (or the QP destroyed), the caller guarantees
    /// that the memory every SGE names stays registered and is neither read nor written by
    /// anything but the device.
    unsafe fn post_recv_raw(&self, wr: &RecvWr) -> Result<()>;
}

impl RawPost for Qp {
    unsafe fn post_send_raw(&self, wr: &SendWr) -> Result<()> {
        // No unsafe operation here: the engine re-checks every SGE at use (see the trait).
        self.post_send(wr.clone())
    }

    unsafe fn post_recv_raw(&self, wr: &RecvWr) -> Result<()> {
        self.post_recv(wr.clone())
    }
}
