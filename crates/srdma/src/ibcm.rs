//! The IB Communication Manager over RoCEv2, as kernel rdma_cm speaks it: CM MADs
//! ([`srdma_wire::cm`]) on the GSI QP (QP1), so that srdma connects to and accepts
//! connections from kernel rxe's rdma_cm (rping, perftest `-R`) — where [`crate::cm`] speaks
//! its own TCP exchange between srdma peers.
//!
//! ```text
//!   active ([`connect`])                       passive ([`IbListener`])
//!   REQ {comm id, service id, QPN, PSN, GIDs, cma_hdr} ─▶   matches service ID and address
//!                          ◀─ REP {comm ids, QPN, PSN}       QP INIT→RTR→RTS
//!   QP INIT→RTR→RTS; RTU  ─▶                                 established
//!   DREQ ─▶ ◀─ DREP                                          (either side)
//! ```
//!
//! The REQ's StartingPSN is the PSN the active side expects first (the passive side sends
//! from it), the REP's the one the passive side expects: each side sends from the PSN the
//! other announced, as in kernel rdma_cm's own captures. A REQ or REP without an answer is
//! sent again every [`RESEND`], at most [`MAX_SENDS`] times; a duplicate REQ is answered with
//! the same REP; an MRA for a REQ stops its resends for the time the MRA names, as in ib_cm.
//!
//! One [`Gsi`] per device holds QP1. On a UDP port shared by several processes, the kernel
//! steers each MAD to the process it concerns (see `portshare`): REQs by the service IDs
//! the processes listen on, the rest by communication ID, whose top byte is the slot of the
//! process that picked it.
//!
//! MADs are taken in by the thread that received them (the progress thread, or an
//! application's poll), right after it released the device lock (the CQ's hook), and wake
//! only the threads waiting for them: a REQ's listener, a connect's or accept's thread, a
//! connection's. The first REQ of a connect and the first REP of an accept leave from the
//! caller's thread ([`start_connect`], [`IbRequest::start_accept`]). An established
//! connection can instead be watched ([`IbConnection::watch`]): the device's GSI thread
//! then answers its DREQ, resends its own DREQ until the DREP comes and answers a resent
//! REP with the RTU again, so that ten thousand connections need no thread each.

mod backlog;
mod seen;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use srdma_proto::{AccessFlags, QpCaps, QpType, RecvWr, SendOp, SendWr, SgeList, UdDest};
use srdma_wire::cm::{self as wire, CmMsg, CmaHdr, MadHdr};
use srdma_wire::{Psn, Qpn};

use crate::cm::{CmError, CmEvent, ConnectOptions, reason, to_error};
use crate::device::{Device, Mr, Pd};
use crate::qp::{Ece, Qp, QpInit, RemoteQp, ah};
use crate::types::Gid;
use crate::{Cq, Error};

/// How long a REQ or REP waits for its answer before it is sent again.
pub const RESEND: Duration = Duration::from_millis(500);
/// How many times a REQ or REP is sent before the exchange times out.
pub const MAX_SENDS: u32 = 15;
/// The longest an MRA makes a REQ wait for its REP (kernel rdma_cm's passive side asks for
/// 4.096 µs × 2^24, 69 s).
pub const MRA_WAIT_MAX: Duration = Duration::from_secs(70);
/// Receive buffers of the GSI QP (600 KB with [`RECV_LEN`]). A MAD that finds none is
/// dropped, as on any UD QP, and waits for its sender's resend ([`RESEND`]): ten thousand
/// DREQs sent in one burst (`cmtime -c 10000`) overran 512 (the kernel MAD layer's default)
/// and half of the disconnect phases took one resend longer (0.6–0.8 s against 0.25–0.33).
const RECV_SLOTS: usize = 2048;
/// GRH + MAD.
const RECV_LEN: usize = 40 + wire::MAD_LEN;
/// Send buffers.
const SEND_SLOTS: usize = 32;
/// The GSI thread wakes on the CQ's events, and at least this often.
const PUMP_EVERY: Duration = Duration::from_millis(100);
/// Most messages kept for later askers; a flood pushes the oldest out.
pub const BACKLOG: usize = 4096;
/// The service timeout of the MRA a resent REQ gets while its request waits for the
/// application: 4.096 µs × 2^24, 69 s (kernel rdma_cm's `CMA_CM_MRA_SETTING`).
const MRA_SERVICE_TIMEOUT: u8 = 24;
/// wr_id of sends (receives use their slot index).
const SEND_WR: u64 = u64::MAX;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A CM message that arrived, with where from.
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The MAD header.
    pub hdr: MadHdr,
    /// The message.
    pub msg: CmMsg,
    /// The sender's GID (from the GRH).
    pub from: Gid,
}

/// The GSI QP of a device: sends and receives CM MADs.
#[derive(Clone)]
pub struct Gsi {
    inner: Arc<GsiInner>,
}

impl std::fmt::Debug for Gsi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gsi").finish_non_exhaustive()
    }
}

struct GsiInner {
    dev: Device,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    state: Mutex<GsiState>,
    /// Threads waiting for a MAD, each on an eventfd of its own. The CQ's hook takes the
    /// MADs in as they complete (on the thread that received them) and wakes the waiters
    /// they are for, so a MAD reaches the thread that wants it without another in between.
    waiters: Arc<Waiters>,
    /// Wakes the GSI thread: a watched connection's MAD to handle (see
    /// [`IbConnection::watch`]).
    wake: Arc<std::os::fd::OwnedFd>,
}

/// Which MADs wake a waiter: the service ID of a REQ or SIDR_REQ, the communication ID a
/// reply names as its recipient's (a SIDR_REP's request ID), or the sender's communication
/// ID of a REQ (an accept waits for duplicates of the REQ it answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// Every MAD.
    Any,
    Service(u64),
    Comm(u32),
    PeerReq(u32),
}

/// The keys of the waiters `msg` wakes.
fn keys_of(msg: &CmMsg) -> [Option<Key>; 2] {
    match msg {
        CmMsg::Req(r) => [
            Some(Key::Service(r.service_id)),
            Some(Key::PeerReq(r.local_comm_id)),
        ],
        CmMsg::SidrReq(r) => [Some(Key::Service(r.service_id)), None],
        CmMsg::SidrRep(r) => [Some(Key::Comm(r.request_id)), None],
        CmMsg::Mra(m) => [Some(Key::Comm(m.remote_comm_id)), None],
        CmMsg::Rej(m) => [Some(Key::Comm(m.remote_comm_id)), None],
        CmMsg::Rep(m) => [Some(Key::Comm(m.remote_comm_id)), None],
        CmMsg::Rtu(m) => [Some(Key::Comm(m.remote_comm_id)), None],
        CmMsg::Dreq(m) => [Some(Key::Comm(m.remote_comm_id)), None],
        CmMsg::Drep(m) => [Some(Key::Comm(m.remote_comm_id)), None],
    }
}

/// The threads in [`Gsi::recv`]: an eventfd each, under the keys of the MADs they want
/// (ten thousand connections wait at once: a MAD wakes its own, found by key).
#[derive(Default)]
struct Waiters(Mutex<WaiterMap>);

#[derive(Default)]
struct WaiterMap {
    next: u64,
    by_key: HashMap<Key, Vec<(u64, Arc<std::os::fd::OwnedFd>)>>,
}

impl Waiters {
    /// Wakes the waiters of a MAD kept under `keys`.
    fn wake(&self, keys: &[Option<Key>; 2]) {
        let m = lock(&self.0);
        for k in keys.iter().flatten().chain([&Key::Any]) {
            for (_, fd) in m.by_key.get(k).into_iter().flatten() {
                crate::sys::signal(fd);
            }
        }
    }

    /// Whether a thread waits for the MADs of `key`.
    fn any_for(&self, key: Key) -> bool {
        lock(&self.0).by_key.contains_key(&key)
    }
}

/// A registered waiter: its eventfd, unregistered on drop.
struct Waiter {
    all: Arc<Waiters>,
    id: u64,
    keys: Vec<Key>,
    fd: Arc<std::os::fd::OwnedFd>,
}

impl Waiter {
    fn new(all: &Arc<Waiters>, keys: &[Key]) -> Result<Waiter, Error> {
        let fd = Arc::new(crate::sys::eventfd().map_err(|e| Error::Io {
            context: "eventfd for a QP1 waiter".into(),
            source: e,
        })?);
        let mut m = lock(&all.0);
        let id = m.next;
        m.next += 1;
        for k in keys {
            m.by_key.entry(*k).or_default().push((id, fd.clone()));
        }
        Ok(Waiter {
            all: all.clone(),
            id,
            keys: keys.to_vec(),
            fd,
        })
    }

    /// Sleeps until woken or `until`; then the wake-up is spent.
    fn wait(&self, until: Instant) {
        sleep_on(&self.fd, until);
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut m = lock(&self.all.0);
        for k in &self.keys {
            if let Some(v) = m.by_key.get_mut(k) {
                v.retain(|(id, _)| *id != self.id);
                if v.is_empty() {
                    m.by_key.remove(k);
                }
            }
        }
    }
}

/// Sleeps until `fd` (an eventfd) is signalled or `until`; then the wake-up is spent.
fn sleep_on(fd: &std::os::fd::OwnedFd, until: Instant) {
    use std::os::fd::AsRawFd;
    let t = until.saturating_duration_since(Instant::now());
    if crate::sys::poll_readable([fd.as_raw_fd()], Some(t)).is_err() {
        std::thread::sleep(t.min(Duration::from_millis(1)));
    }
    crate::sys::drain(fd);
}

struct GsiState {
    /// Messages nobody has asked for yet, oldest first (bounded), by the keys of their
    /// waiters.
    backlog: backlog::Backlog<Key, Incoming>,
    next_send: usize,
    /// The service IDs listened on here: a REQ for another one is rejected (reason 8).
    listens: Vec<u64>,
    /// Local communication IDs of the live connections: a DREQ for another one is answered
    /// with a DREP at once, as a kernel CM answers it.
    conns: HashSet<u32>,
    /// The watched connections ([`IbConnection::watch`]), by local communication ID: their
    /// DREQs and DREPs go to the GSI thread, not to a waiter.
    watched: HashMap<u32, std::sync::Weak<IbConnection>>,
    /// Their MADs for the GSI thread to handle (outside this lock).
    handoff: Vec<(Arc<IbConnection>, Incoming)>,
    /// Watched connections whose DREQ waits for its DREP: the GSI thread sends it again,
    /// and keeps the connection until then (its owner may have let go of it, as
    /// `rdma_destroy_id` returns at once: the exchange ends here, not in a `Drop`).
    disconnecting: Vec<Arc<IbConnection>>,
    /// The REQs taken in, by sender and communication ID: a resent one is no new request.
    reqs: seen::SeenReqs<(Gid, u32)>,
    /// The SIDR_REQs taken in, by sender and request ID, with the SIDR_REP that answered
    /// each: a resent one is no new request, and gets that answer again.
    sidrs: seen::SeenReqs<(Gid, u32), CmMsg>,
    counters: CmCounters,
}

/// What a device's CM did with the MADs it received that no connection asked for
/// ([`Gsi::counters`]). Hostile or broken peers show up here, not as errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs received on QP1.
    pub mads_received: u64,
    /// Dropped: not a CM MAD this CM parses (truncated, another management class or class
    /// version, an unknown attribute or method, a receive error).
    pub malformed: u64,
    /// REQs and SIDR_REQs for a service nobody listens on, answered with REJ "invalid
    /// service ID" or SIDR_REP "unsupported".
    pub unknown_service: u64,
    /// DREQs for a connection that does not exist (any more), answered with a DREP.
    pub stray_dreqs: u64,
    /// REQs sent again by their peer: not a new request. One whose request the application
    /// has not answered yet gets an MRA (wait), as kernel rdma_cm answers it; one being
    /// accepted gets its REP again. SIDR_REQs sent again count here too: dropped while the
    /// application decides (as kernel ib_cm drops them), answered with the same SIDR_REP
    /// after.
    pub duplicate_reqs: u64,
    /// Messages nobody asked for, dropped (oldest first) when the backlog was full.
    pub backlog_dropped: u64,
    /// REPs sent again by the peer of an established (watched) connection, whose RTU was
    /// lost: answered with the RTU again, as a kernel CM answers them.
    pub duplicate_reps: u64,
}

impl Gsi {
    /// Creates QP1 on `dev` and posts its receives.
    pub fn open(dev: &Device) -> Result<Gsi, Error> {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(RECV_SLOTS + SEND_SLOTS + 8, None)?;
        let waiters = Arc::new(Waiters::default());
        let mut init = QpInit::new(QpType::Ud, &cq, &cq);
        init.caps = QpCaps {
            max_send_wr: SEND_SLOTS as u32,
            max_recv_wr: RECV_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd.create_gsi_qp(&init)?;
        qp.activate(Psn::new(0))?;
        let mr = pd.reg_mr(
            RECV_SLOTS * RECV_LEN + SEND_SLOTS * wire::MAD_LEN,
            AccessFlags::LOCAL_WRITE,
        )?;
        for i in 0..RECV_SLOTS {
            qp.post_recv(RecvWr {
                wr_id: i as u64,
                sges: SgeList::one(mr.sge(i * RECV_LEN, RECV_LEN)),
            })?;
        }
        let inner = Arc::new(GsiInner {
            dev: dev.clone(),
            qp,
            cq,
            mr,
            state: Mutex::new(GsiState {
                backlog: backlog::Backlog::new(BACKLOG),
                next_send: 0,
                listens: Vec::new(),
                conns: HashSet::new(),
                watched: HashMap::new(),
                handoff: Vec::new(),
                disconnecting: Vec::new(),
                reqs: seen::SeenReqs::default(),
                sidrs: seen::SeenReqs::default(),
                counters: CmCounters::default(),
            }),
            waiters,
            wake: Arc::new(crate::sys::eventfd().map_err(|e| Error::Io {
                context: "eventfd for the GSI thread".into(),
                source: e,
            })?),
        });
        // The MADs are taken in as they complete, by the thread that received them, once it
        // released the device lock: REQs for services nobody listens on are answered, and
        // the receive ring stays posted, whether or not anyone waits.
        let weak = Arc::downgrade(&inner);
        inner.cq.set_hook(move || {
            if let Some(inner) = weak.upgrade() {
                let g = Gsi { inner };
                let mut st = lock(&g.inner.state);
                g.pump(&mut st);
            }
        });
        // The GSI thread: the watched connections' DREQs and DREPs, their DREQs sent again,
        // and a backstop for completions no receive pass delivered (a receive flushed by a
        // QP in error). It is gone with the last handle.
        let weak = Arc::downgrade(&inner);
        let wake = inner.wake.clone();
        crate::threads::spawn("srdma-gsi", move || {
            while let Some(inner) = weak.upgrade() {
                let g = Gsi { inner };
                let (handoff, disconnecting) = {
                    let mut st = lock(&g.inner.state);
                    g.pump(&mut st);
                    (
                        std::mem::take(&mut st.handoff),
                        std::mem::take(&mut st.disconnecting),
                    )
                };
                for (c, i) in handoff {
                    c.on_watched_mad(i);
                }
                let now = Instant::now();
                let left: Vec<_> = disconnecting
                    .into_iter()
                    .filter(|c| c.dreq_due(now))
                    .collect();
                lock(&g.inner.state).disconnecting.extend(left);
                drop(g);
                sleep_on(&wake, Instant::now() + PUMP_EVERY);
            }
        })
        .map_err(|e| Error::Io {
            context: "starting the GSI thread".into(),
            source: e,
        })?;
        Ok(Gsi { inner })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Sends one CM message to QP1 of the device with GID `to`.
    pub fn send(&self, to: Gid, hdr: &MadHdr, msg: &CmMsg) -> Result<(), Error> {
        let mut st = lock(&self.inner.state);
        self.send_in(&mut st, to, hdr, msg)
    }

    fn send_in(&self, st: &mut GsiState, to: Gid, hdr: &MadHdr, msg: &CmMsg) -> Result<(), Error> {
        let mut mad = [0u8; wire::MAD_LEN];
        msg.emit_mad(hdr, &mut mad)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        st.next_send = (st.next_send + 1) % SEND_SLOTS;
        let slot = st.next_send;
        let off = RECV_SLOTS * RECV_LEN + slot * wire::MAD_LEN;
        self.inner.mr.write(off, &mad)?;
        // Unsignaled: a burst of sends must not fill the CQ (an overrun would move QP1 to ERR).
        let wr = SendWr::new(
            SEND_WR,
            SendOp::Send,
            SgeList::one(self.inner.mr.sge(off, wire::MAD_LEN)),
        )
        .with_flags(srdma_proto::SendFlags::empty())
        .to_ud(UdDest {
            ah: ah(to),
            remote_qpn: Qpn::GSI,
            remote_qkey: srdma_wire::deth::GSI_QKEY,
        });
        self.inner.qp.post_send(wr)
    }

    /// Sends `mad` (any bytes, up to a MAD) to QP1 of `to` as they are: for tests of hostile
    /// or malformed CM traffic.
    #[doc(hidden)]
    pub fn send_raw(&self, to: Gid, mad: &[u8]) -> Result<(), Error> {
        let len = mad.len().min(wire::MAD_LEN);
        let slot = {
            let mut st = lock(&self.inner.state);
            st.next_send = (st.next_send + 1) % SEND_SLOTS;
            st.next_send
        };
        let off = RECV_SLOTS * RECV_LEN + slot * wire::MAD_LEN;
        self.inner.mr.write(off, &mad[..len])?;
        let wr = SendWr::new(
            SEND_WR,
            SendOp::Send,
            SgeList::one(self.inner.mr.sge(off, len)),
        )
        .with_flags(srdma_proto::SendFlags::empty())
        .to_ud(UdDest {
            ah: ah(to),
            remote_qpn: Qpn::GSI,
            remote_qkey: srdma_wire::deth::GSI_QKEY,
        });
        self.inner.qp.post_send(wr)
    }

    /// What this CM did with unrequested, malformed and duplicate MADs.
    pub fn counters(&self) -> CmCounters {
        let mut st = lock(&self.inner.state);
        self.pump(&mut st);
        st.counters
    }

    /// Messages waiting in the backlog (nobody asked for them yet).
    #[doc(hidden)]
    pub fn backlog_len(&self) -> usize {
        let mut st = lock(&self.inner.state);
        self.pump(&mut st);
        st.backlog.len()
    }

    /// Takes what the QP received into the backlog, waking the [`Gsi::recv`] waiters of
    /// each message.
    fn pump(&self, st: &mut GsiState) {
        let wcs = self.inner.cq.take_quietly(64);
        for wc in wcs {
            if wc.wr_id == SEND_WR {
                continue;
            }
            let Ok(slot) = usize::try_from(wc.wr_id) else {
                continue;
            };
            if slot >= RECV_SLOTS {
                continue;
            }
            let mut buf = [0u8; RECV_LEN];
            st.counters.mads_received += 1;
            let parsed = if wc.status.is_success()
                && self
                    .inner
                    .mr
                    .read_quietly(slot * RECV_LEN, &mut buf)
                    .is_ok()
            {
                CmMsg::parse_mad(&buf[40..]).ok()
            } else {
                None
            };
            match parsed {
                None => st.counters.malformed += 1,
                Some((hdr, msg)) => self.take(st, hdr, msg, grh_source(&buf[..40])),
            }
            let _ = self.inner.qp.post_recv(RecvWr {
                wr_id: slot as u64,
                sges: SgeList::one(self.inner.mr.sge(slot * RECV_LEN, RECV_LEN)),
            });
        }
    }

    /// Answers what needs no connection (a REQ for a service nobody listens on, a DREQ for
    /// no connection) and keeps the rest for [`Gsi::recv`].
    fn take(&self, st: &mut GsiState, hdr: MadHdr, msg: CmMsg, from: Gid) {
        let unknown = match &msg {
            CmMsg::Req(r) => !st.listens.contains(&r.service_id),
            CmMsg::SidrReq(r) => !st.listens.contains(&r.service_id),
            _ => false,
        };
        if unknown {
            st.counters.unknown_service += 1;
            self.reject_unknown(st, from, hdr.tid, &msg);
            return;
        }
        if let CmMsg::Req(r) = &msg {
            let key = Key::PeerReq(r.local_comm_id);
            match st
                .reqs
                .arrive((from, r.local_comm_id), hdr.tid, Instant::now())
            {
                seen::Arrival::New => {}
                seen::Arrival::WhilePending => {
                    st.counters.duplicate_reqs += 1;
                    self.mra_req(st, from, hdr.tid, r.local_comm_id);
                    return;
                }
                // For the accept under way (it sends its REP again), never for a listener.
                seen::Arrival::Answered => {
                    st.counters.duplicate_reqs += 1;
                    if self.inner.waiters.any_for(key) {
                        self.keep(st, [Some(key), None], Incoming { hdr, msg, from });
                    }
                    return;
                }
            }
        }
        if let CmMsg::SidrReq(r) = &msg {
            let key = (from, r.request_id);
            match st.sidrs.arrive(key, hdr.tid, Instant::now()) {
                seen::Arrival::New => {}
                seen::Arrival::WhilePending => {
                    st.counters.duplicate_reqs += 1;
                    return;
                }
                seen::Arrival::Answered => {
                    st.counters.duplicate_reqs += 1;
                    if let Some(rep) = st.sidrs.answer(&key).cloned() {
                        let hdr = MadHdr::cm(wire::attr::SIDR_REP, hdr.tid);
                        let _ = self.send_in(st, from, &hdr, &rep);
                    }
                    return;
                }
            }
        }
        if let CmMsg::Dreq(wire::Dreq { remote_comm_id, .. })
        | CmMsg::Drep(wire::Drep { remote_comm_id, .. }) = &msg
            && let Some(c) = st.watched.get(remote_comm_id).and_then(|w| w.upgrade())
        {
            st.handoff.push((c, Incoming { hdr, msg, from }));
            crate::sys::signal(&self.inner.wake);
            return;
        }
        if let CmMsg::Rep(r) = &msg
            && st.watched.contains_key(&r.remote_comm_id)
        {
            // The connection is established (watched only from then on): the passive side
            // did not get our RTU and waits for it; another ends its wait.
            st.counters.duplicate_reps += 1;
            let rtu = CmMsg::Rtu(wire::Rtu {
                local_comm_id: r.remote_comm_id,
                remote_comm_id: r.local_comm_id,
                private_data: [0; 224],
            });
            let _ = self.send_in(st, from, &MadHdr::cm(wire::attr::RTU, hdr.tid), &rtu);
            return;
        }
        if let CmMsg::Dreq(d) = &msg {
            if !st.conns.contains(&d.remote_comm_id) {
                // The connection is gone (its DREP was lost, or it never was): a DREP ends
                // the peer's resends, as a kernel CM answers.
                st.counters.stray_dreqs += 1;
                let drep = CmMsg::Drep(wire::Drep {
                    local_comm_id: d.remote_comm_id,
                    remote_comm_id: d.local_comm_id,
                    private_data: [0; 224],
                });
                let _ = self.send_in(st, from, &MadHdr::cm(wire::attr::DREP, hdr.tid), &drep);
                return;
            }
        }
        self.keep(st, keys_of(&msg), Incoming { hdr, msg, from });
    }

    /// Keeps `i` under `keys` for [`Gsi::recv`] and wakes its waiters.
    fn keep(&self, st: &mut GsiState, keys: [Option<Key>; 2], i: Incoming) {
        self.inner.waiters.wake(&keys);
        if let Some(old) = st.backlog.push(keys, i) {
            st.counters.backlog_dropped += 1;
            // A REQ pushed out before a listener took it was never a request: its resend
            // is a new one, not a duplicate to answer with an MRA.
            match &old.msg {
                CmMsg::Req(r) => st.reqs.forget((old.from, r.local_comm_id), old.hdr.tid),
                CmMsg::SidrReq(r) => st.sidrs.forget((old.from, r.request_id), old.hdr.tid),
                _ => {}
            }
        }
    }

    /// Answers a REQ sent again while the application has not answered its request: an
    /// MRA for the REQ asking the peer to wait (4.096 µs × 2^24, 69 s), as kernel rdma_cm
    /// does for a listener in user space. It names no communication ID of ours (none is
    /// chosen before the accept), as a REJ for an unknown service does not.
    fn mra_req(&self, st: &mut GsiState, to: Gid, tid: u64, peer_comm_id: u32) {
        let mra = CmMsg::Mra(wire::Mra {
            local_comm_id: 0,
            remote_comm_id: peer_comm_id,
            message_mraed: 0,
            service_timeout: MRA_SERVICE_TIMEOUT,
            private_data: [0; 222],
        });
        let _ = self.send_in(st, to, &MadHdr::cm(wire::attr::MRA, tid), &mra);
    }

    /// Answers a REQ for a service nobody listens on: REJ, reason 8 (invalid service ID), as
    /// a kernel's CM does.
    /// A SIDR_REQ for an unknown service gets a SIDR_REP with status 1 (unsupported).
    fn reject_unknown(&self, st: &mut GsiState, to: Gid, tid: u64, msg: &CmMsg) {
        let (attr, answer) = match msg {
            CmMsg::Req(r) => (
                wire::attr::REJ,
                CmMsg::Rej(wire::Rej {
                    local_comm_id: 0,
                    remote_comm_id: r.local_comm_id,
                    message_rejected: 0,
                    rejected_info_length: 0,
                    reason: reason::INVALID_SERVICE_ID,
                    additional_info: [0; 72],
                    private_data: [0; 148],
                }),
            ),
            CmMsg::SidrReq(r) => (
                wire::attr::SIDR_REP,
                CmMsg::SidrRep(wire::SidrRep {
                    request_id: r.request_id,
                    status: SIDR_UNSUPPORTED,
                    additional_info_length: 0,
                    qpn: 0,
                    service_id: r.service_id,
                    qkey: 0,
                    class_port_info: [0; 72],
                    private_data: [0; 136],
                }),
            ),
            _ => return,
        };
        let _ = self.send_in(st, to, &MadHdr::cm(attr, tid), &answer);
    }

    /// The first message for which `want` holds, waiting until `deadline`.
    pub fn recv(&self, deadline: Instant, want: impl Fn(&Incoming) -> bool) -> Option<Incoming> {
        self.recv_keyed(deadline, &[Key::Any], want)
    }

    /// [`Gsi::recv`] woken only by the MADs with one of `keys` (see `Key`): `want` must take
    /// only MADs with one of them.
    fn recv_keyed(
        &self,
        deadline: Instant,
        keys: &[Key],
        want: impl Fn(&Incoming) -> bool,
    ) -> Option<Incoming> {
        // Registered before the first look: a MAD that completes after it wakes this thread.
        let me = Waiter::new(&self.inner.waiters, keys).ok();
        loop {
            {
                let mut st = lock(&self.inner.state);
                self.pump(&mut st);
                let got = if keys.contains(&Key::Any) {
                    st.backlog.take_any(&want)
                } else {
                    st.backlog.take(keys, &want)
                };
                if got.is_some() {
                    return got;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            match &me {
                // Woken by the MADs of its keys (the GSI thread and the engine take MADs in
                // as they complete): no periodic look, so that ten thousand connections
                // waiting for their DREQ cost no CPU.
                Some(w) => w.wait(deadline),
                // No eventfd to be had: look again every millisecond.
                None => std::thread::sleep(
                    (deadline.min(now + PUMP_EVERY) - now).min(Duration::from_millis(1)),
                ),
            }
        }
    }
}

/// The sender of a MAD, from the 40 bytes rxe (and srdma) put before a UD payload: an IPv4
/// header in the last 20, else an IPv6 header.
fn grh_source(grh: &[u8]) -> Gid {
    if grh[20] == 0x45 {
        Gid::from_ip(IpAddr::from([grh[32], grh[33], grh[34], grh[35]]))
    } else {
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[8..24]);
        Gid(g)
    }
}

fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => {
            let mut a = [0u8; 16];
            a[12..].copy_from_slice(&v4.octets());
            a
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn random_u32() -> u32 {
    (crate::random_u64() >> 16) as u32
}

/// The PMTU code (`enum ibv_mtu`) of `m`.
fn mtu_code(m: crate::Mtu) -> u8 {
    m.as_u32() as u8
}

/// What the peer's REQ (passive side) or REP (active side) asked for: the values of
/// `rdma_conn_param` in rdma_cm's events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerParams {
    /// READ/atomic requests the peer accepts in flight.
    pub responder_resources: u8,
    /// READ/atomic requests the peer issues in flight.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (REQ only; 0 in a REP).
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The peer's QP receives from an SRQ.
    pub srq: bool,
    /// The peer's QP.
    pub qpn: u32,
}

impl PeerParams {
    fn of_req(r: &wire::Req) -> PeerParams {
        PeerParams {
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            flow_control: r.end_to_end_flow_control,
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qpn: r.local_qpn,
        }
    }

    fn of_rep(r: &wire::Rep) -> PeerParams {
        PeerParams {
            responder_resources: r.responder_resources,
            initiator_depth: r.initiator_depth,
            flow_control: r.end_to_end_flow_control,
            retry_count: 0,
            rnr_retry_count: r.rnr_retry_count,
            srq: r.srq,
            qpn: r.local_qpn,
        }
    }
}

/// An established IB CM connection.
#[derive(Debug)]
pub struct IbConnection {
    _reg: CommIdReg,
    /// The connected QP, until [`IbConnection::release_qp`].
    qp: Mutex<Option<Qp>>,
    gsi: Gsi,
    peer: Gid,
    remote: RemoteQp,
    local_comm_id: u32,
    remote_comm_id: u32,
    private_data: Vec<u8>,
    peer_params: PeerParams,
    state: Mutex<IbState>,
}

/// What a watched connection calls when it ends ([`IbConnection::watch`]).
type OnEnd = Box<dyn FnOnce() + Send>;

struct IbState {
    events: VecDeque<CmEvent>,
    disconnected: bool,
    /// The transaction ID of the DREQ this side sent.
    dreq_tid: Option<u64>,
    /// The peer's DREP came (taken by whichever thread was waiting on QP1).
    drep: bool,
    /// Called once when the connection ends (watched connections).
    on_end: Option<OnEnd>,
    /// The connection itself, once watched ([`IbConnection::watch`]: the GSI thread
    /// handles its DREQ and DREP, and keeps it in its list of DREQs to resend).
    me: Option<std::sync::Weak<IbConnection>>,
    /// Our DREQ's sends so far, and when the GSI thread sends it again (watched).
    dreq_sends: u32,
    dreq_due: Option<Instant>,
}

impl IbState {
    /// Whether the connection is watched ([`IbConnection::watch`]).
    fn watched(&self) -> bool {
        self.me.is_some()
    }
}

impl std::fmt::Debug for IbState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbState")
            .field("events", &self.events)
            .field("disconnected", &self.disconnected)
            .field("dreq_tid", &self.dreq_tid)
            .field("drep", &self.drep)
            .field("watched", &self.watched())
            .finish_non_exhaustive()
    }
}

impl IbConnection {
    #[allow(clippy::too_many_arguments)]
    fn new(
        reg: CommIdReg,
        qp: Option<Qp>,
        gsi: &Gsi,
        peer: Gid,
        remote: RemoteQp,
        ids: (u32, u32),
        private_data: Vec<u8>,
        peer_params: PeerParams,
    ) -> IbConnection {
        gsi.device().cm_established(&crate::portshare::CmConn {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            remote_qpn: remote.qpn.value(),
            peer: std::net::SocketAddr::new(peer.ip(), remote.port),
        });
        IbConnection {
            _reg: reg,
            qp: Mutex::new(qp),
            gsi: gsi.clone(),
            peer,
            remote,
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            private_data,
            peer_params,
            state: Mutex::new(IbState {
                events: VecDeque::from([CmEvent::Established]),
                disconnected: false,
                dreq_tid: None,
                drep: false,
                on_end: None,
                me: None,
                dreq_sends: 0,
                dreq_due: None,
            }),
        }
    }

    /// The connected QP.
    ///
    /// # Panics
    /// After [`IbConnection::release_qp`], or for a connection made without one
    /// ([`start_connect_unmanaged`], [`IbRequest::start_accept_unmanaged`]).
    pub fn qp(&self) -> Qp {
        lock(&self.qp)
            .clone()
            .expect("this connection has no QP (released, or made without one)")
    }

    /// The connected QP, if the connection has one.
    pub fn try_qp(&self) -> Option<Qp> {
        lock(&self.qp).clone()
    }

    /// Lets go of the QP (its owner destroyed it); the connection can still be
    /// disconnected.
    pub fn release_qp(&self) {
        lock(&self.qp).take();
    }

    fn qp_to_error(&self) -> Result<(), Error> {
        match &*lock(&self.qp) {
            Some(qp) => to_error(qp),
            None => Ok(()),
        }
    }

    /// The peer's QP.
    pub fn remote(&self) -> RemoteQp {
        self.remote
    }

    /// The private data of the peer's REQ (after the rdma_cm header) or REP.
    pub fn remote_private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// What the peer's REQ or REP asked for.
    pub fn peer_params(&self) -> PeerParams {
        self.peer_params
    }

    /// The (local, remote) communication IDs: for tests that play the peer.
    #[doc(hidden)]
    pub fn comm_ids(&self) -> (u32, u32) {
        (self.local_comm_id, self.remote_comm_id)
    }

    /// Whether either side has disconnected.
    pub fn is_disconnected(&self) -> bool {
        lock(&self.state).disconnected
    }

    /// Disconnected, by either side: the port keeper no longer needs to send a DREQ for it.
    /// The watcher's call, for the caller to make once it let go of the state's lock.
    #[must_use]
    fn ended(&self, st: &mut IbState) -> Option<OnEnd> {
        if !st.disconnected {
            st.disconnected = true;
            self.gsi.device().cm_closed(self.local_comm_id);
        }
        st.on_end.take()
    }

    /// From now on the device's GSI thread handles this connection's DREQ and DREP, and
    /// `on_end` is called once, on that thread (or on the thread of a blocking
    /// [`IbConnection::disconnect`]), when the connection ends, whichever side ended it: a
    /// peer's DREQ is answered there (QP to ERR, DREP, again for a resent DREQ), and this
    /// side's DREQ ([`IbConnection::start_disconnect`]) is sent again there until its DREP
    /// comes, as [`IbConnection::disconnect`] would (the connection ends after
    /// `MAX_SENDS.min(4)` sends without one). Ten thousand connections thus need no thread
    /// each; [`IbConnection::poll_event`] returns nothing more for a watched connection.
    pub fn watch(self: &Arc<Self>, on_end: impl FnOnce() + Send + 'static) {
        let now = {
            let mut st = lock(&self.state);
            st.me = Some(Arc::downgrade(self));
            st.events.clear();
            if st.disconnected {
                Some(Box::new(on_end) as OnEnd)
            } else {
                st.on_end = Some(Box::new(on_end));
                None
            }
        };
        if let Some(f) = now {
            f();
            return;
        }
        let early = {
            let mut g = lock(&self.gsi.inner.state);
            g.watched.insert(self.local_comm_id, Arc::downgrade(self));
            // What came before the watch (a DREQ right after the RTU).
            let mut early = Vec::new();
            while let Some(i) = g
                .backlog
                .take(&[Key::Comm(self.local_comm_id)], |i| self.is_ours(i))
            {
                early.push(i);
            }
            early
        };
        for i in early {
            self.on_watched_mad(i);
        }
        // A DREQ sent before the watch is sent again by the GSI thread from now on.
        if lock(&self.state).dreq_due.is_some() {
            lock(&self.gsi.inner.state).disconnecting.push(self.clone());
        }
    }

    /// A DREQ or DREP for this watched connection (on the GSI thread).
    fn on_watched_mad(&self, i: Incoming) {
        let f = match i.msg {
            CmMsg::Dreq(_) => {
                let first = !lock(&self.state).disconnected;
                if first {
                    let _ = self.qp_to_error();
                }
                // A resent DREQ (our DREP was lost) gets another.
                self.drep(i.hdr.tid);
                self.ended(&mut lock(&self.state))
            }
            CmMsg::Drep(_) => {
                let mut st = lock(&self.state);
                st.drep = true;
                if st.dreq_tid.is_none() {
                    return;
                }
                st.dreq_due = None;
                self.ended(&mut st)
            }
            _ => return,
        };
        if let Some(f) = f {
            f();
        }
    }

    /// A watched connection's DREQ waiting for its DREP at `now`: sent again if due, or
    /// the connection ended after the last send. Whether it still waits.
    fn dreq_due(&self, now: Instant) -> bool {
        let (resend, end) = {
            let mut st = lock(&self.state);
            match (st.dreq_due, st.dreq_tid) {
                (Some(due), Some(tid)) if !st.disconnected => {
                    if now < due {
                        (None, None)
                    } else if st.dreq_sends < MAX_SENDS.min(4) {
                        st.dreq_sends += 1;
                        st.dreq_due = Some(now + RESEND);
                        (Some(tid), None)
                    } else {
                        st.dreq_due = None;
                        (None, Some(self.ended(&mut st)))
                    }
                }
                _ => {
                    st.dreq_due = None;
                    return false;
                }
            }
        };
        if let Some(tid) = resend {
            let _ = self.send_dreq(tid);
        }
        match end {
            Some(f) => {
                if let Some(f) = f {
                    f();
                }
                false
            }
            None => true,
        }
    }

    fn is_ours(&self, i: &Incoming) -> bool {
        match &i.msg {
            CmMsg::Dreq(m) => m.remote_comm_id == self.local_comm_id,
            CmMsg::Drep(m) => m.remote_comm_id == self.local_comm_id,
            _ => false,
        }
    }

    fn drep(&self, tid: u64) {
        let msg = CmMsg::Drep(wire::Drep {
            local_comm_id: self.local_comm_id,
            remote_comm_id: self.remote_comm_id,
            private_data: [0; 224],
        });
        let _ = self
            .gsi
            .send(self.peer, &MadHdr::cm(wire::attr::DREP, tid), &msg);
    }

    /// The first half of `rdma_disconnect`, which returns at once: the QP to ERR and one
    /// DREQ to the peer (a second call does nothing). [`IbConnection::disconnect`] then
    /// waits for the DREP; for a watched connection the GSI thread does, sending the DREQ
    /// again, and holds the connection until the exchange ends (the caller may drop it).
    pub fn start_disconnect(&self) -> Result<(), CmError> {
        let tid = {
            let mut st = lock(&self.state);
            if st.disconnected || st.dreq_tid.is_some() {
                return Ok(());
            }
            let tid = crate::random_u64();
            st.dreq_tid = Some(tid);
            st.dreq_sends = 1;
            st.dreq_due = Some(Instant::now() + RESEND);
            if let Some(me) = st.me.as_ref().and_then(|w| w.upgrade()) {
                lock(&self.gsi.inner.state).disconnecting.push(me);
            }
            tid
        };
        let r = self.qp_to_error();
        self.send_dreq(tid)?;
        r.map_err(CmError::from)
    }

    fn send_dreq(&self, tid: u64) -> Result<(), CmError> {
        let msg = CmMsg::Dreq(wire::Dreq {
            local_comm_id: self.local_comm_id,
            remote_comm_id: self.remote_comm_id,
            remote_qpn: self.remote.qpn.value(),
            private_data: [0; 220],
        });
        self.gsi
            .send(self.peer, &MadHdr::cm(wire::attr::DREQ, tid), &msg)?;
        Ok(())
    }

    /// `rdma_disconnect`: the QP to ERR, a DREQ to the peer (sent again until its DREP comes
    /// or [`MAX_SENDS`] tries pass); then [`CmEvent::Disconnected`].
    pub fn disconnect(&self) -> Result<(), CmError> {
        let sent = {
            let st = lock(&self.state);
            if st.disconnected {
                return Ok(());
            }
            st.dreq_tid
        };
        let r = match sent {
            Some(_) => Ok(()),
            None => self.start_disconnect(),
        };
        let (tid, watched) = {
            let st = lock(&self.state);
            (st.dreq_tid.unwrap_or_default(), st.watched())
        };
        'sends: for i in 0..MAX_SENDS.min(4) {
            // A watched connection's DREQ is sent again by the GSI thread.
            if i > 0 && !watched {
                self.send_dreq(tid)?;
            }
            let until = Instant::now() + RESEND;
            // In slices: another thread of this connection (`poll_event`, the GSI thread)
            // may take the DREP.
            while Instant::now() < until {
                {
                    let st = lock(&self.state);
                    if st.drep || st.disconnected {
                        break 'sends;
                    }
                }
                let slice = (Instant::now() + Duration::from_millis(20)).min(until);
                let got = self
                    .gsi
                    .recv_keyed(slice, &[Key::Comm(self.local_comm_id)], |i| self.is_ours(i));
                match got.map(|i| (i.msg, i.hdr.tid)) {
                    Some((CmMsg::Drep(_), _)) => break 'sends,
                    // Both sides disconnecting at once: answer theirs, ours is answered too.
                    Some((CmMsg::Dreq(_), t)) => {
                        self.drep(t);
                        break 'sends;
                    }
                    _ => {}
                }
            }
        }
        let f = {
            let mut st = lock(&self.state);
            if !st.watched() {
                st.events.push_back(CmEvent::Disconnected);
            }
            self.ended(&mut st)
        };
        if let Some(f) = f {
            f();
        }
        r
    }

    /// The next event: [`CmEvent::Established`] first, then [`CmEvent::Disconnected`] once
    /// either side disconnects (a peer's DREQ is answered here).
    pub fn poll_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(86400 * 365));
        loop {
            {
                let mut st = lock(&self.state);
                if let Some(ev) = st.events.pop_front() {
                    return Some(ev);
                }
                if st.disconnected || st.watched() {
                    return None;
                }
            }
            // In slices of a second: events another thread of this connection queued.
            let slice = (Instant::now() + Duration::from_secs(1)).min(deadline);
            if let Some(i) = self
                .gsi
                .recv_keyed(slice, &[Key::Comm(self.local_comm_id)], |i| self.is_ours(i))
            {
                match i.msg {
                    CmMsg::Dreq(_) => {
                        let _ = self.qp_to_error();
                        self.drep(i.hdr.tid);
                        let mut st = lock(&self.state);
                        let _ = self.ended(&mut st);
                        return Some(CmEvent::Disconnected);
                    }
                    // The answer to our DREQ: disconnected (`disconnect`, if it waits for
                    // it too, sees the flag).
                    CmMsg::Drep(_) => {
                        let mut st = lock(&self.state);
                        st.drep = true;
                        if st.dreq_tid.is_some() {
                            let _ = self.ended(&mut st);
                            return Some(CmEvent::Disconnected);
                        }
                    }
                    _ => {}
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }
}

impl Drop for IbConnection {
    fn drop(&mut self) {
        let _ = self.disconnect();
    }
}

/// A local communication ID in use, from the first REQ or REP sent with it until its
/// connection is gone: a DREQ for it is the connection's (see [`Gsi`]'s stray DREQs), and
/// no other connection picks it meanwhile.
#[derive(Debug)]
struct CommIdReg {
    gsi: Gsi,
    id: u32,
}

impl CommIdReg {
    /// A local communication ID no live connection of this device uses (ten thousand
    /// connections in the 24 bits a shared port leaves would otherwise share a few), never
    /// 0 (the ID of no connection, in a REJ or MRA sent before one is chosen).
    fn pick(gsi: &Gsi) -> CommIdReg {
        let prefix = gsi.device().comm_id_prefix();
        let mut st = lock(&gsi.inner.state);
        loop {
            let id = prefix | (random_u32() >> 8);
            if id != 0 && st.conns.insert(id) {
                return CommIdReg {
                    gsi: gsi.clone(),
                    id,
                };
            }
        }
    }
}

impl Drop for CommIdReg {
    fn drop(&mut self) {
        let mut st = lock(&self.gsi.inner.state);
        st.conns.remove(&self.id);
        st.watched.remove(&self.id);
    }
}

/// How often a REQ rejected for want of a listener is sent again, within
/// [`ConnectOptions::unlisted_retry`].
const UNLISTED_EVERY: Duration = Duration::from_millis(50);

/// The active side (`rdma_connect` to a kernel rdma_cm peer): a QP from `init` on `pd`, a
/// REQ for `server` (its IP address and rdma_cm TCP-port-space port, e.g. rping's 7174),
/// the QP connected to the REP's, an RTU. `opts.private_data` follows the rdma_cm header (at
/// most 56 bytes).
pub fn connect(
    gsi: &Gsi,
    pd: &Pd,
    server: SocketAddr,
    init: &QpInit,
    opts: &ConnectOptions,
) -> Result<IbConnection, CmError> {
    if !pd.device().same(gsi.device()) {
        return Err(Error::WrongDevice.into());
    }
    let qp = pd.create_qp(init)?;
    let src_port = (random_u32() as u16) | 0x8000;
    connect_qp(gsi, &qp, server, src_port, init.srq.is_some(), opts)
}

/// The first half of [`connect_qp`], which returns at once: sends the REQ (from the calling
/// thread, so it leaves without waiting for another to be scheduled);
/// [`Connecting::finish`] waits for the REP.
pub fn start_connect(
    gsi: &Gsi,
    qp: &Qp,
    server: SocketAddr,
    src_port: u16,
    srq: bool,
    opts: &ConnectOptions,
) -> Result<Connecting, CmError> {
    if !qp.device().same(gsi.device()) {
        return Err(Error::WrongDevice.into());
    }
    let local = (Some(qp.clone()), qp.qpn(), qp.qp_type());
    start(gsi, local, server, src_port, srq, opts)
}

/// [`start_connect`] for a QP the application moves through RTR and RTS itself
/// (`rdma_connect` without a QP on the id): the REQ names QP `qpn` of type `qp_type` (RC or
/// UC); [`Connecting::wait_response`] then returns at the REP, with the attributes for the
/// QP, and [`Responded::establish`] sends the RTU. The CM never touches that QP.
pub fn start_connect_unmanaged(
    gsi: &Gsi,
    qpn: Qpn,
    qp_type: QpType,
    server: SocketAddr,
    src_port: u16,
    srq: bool,
    opts: &ConnectOptions,
) -> Result<Connecting, CmError> {
    if qp_type == QpType::Ud {
        return Err(Error::InvalidArgument("UD has no connection (SIDR)".into()).into());
    }
    start(gsi, (None, qpn, qp_type), server, src_port, srq, opts)
}

fn start(
    gsi: &Gsi,
    (qp, qpn, qp_type): (Option<Qp>, Qpn, QpType),
    server: SocketAddr,
    src_port: u16,
    srq: bool,
    opts: &ConnectOptions,
) -> Result<Connecting, CmError> {
    opts.check()?;
    let dev = gsi.device();
    if opts.private_data.len() > 92 - wire::CMA_HDR_LEN {
        return Err(CmError::PrivateDataTooLong(opts.private_data.len()));
    }
    let local = dev.local_gid();
    let peer = Gid::from_ip(server.ip());
    let mtu = opts.offered_mtu(dev);
    let (responder, initiator) = opts.depths(dev);
    let rq_psn = crate::random_psn();
    let reg = CommIdReg::pick(gsi);
    let comm_id = reg.id;
    let tid = u64::from(random_u32()) << 32 | u64::from(comm_id.swap_bytes());
    let mut private = [0u8; 92];
    CmaHdr {
        cma_version: 0,
        ip_version: if server.ip().is_ipv4() { 4 } else { 6 },
        src_port,
        src_addr: ip16(dev.local_addr().ip()),
        dst_addr: ip16(server.ip()),
    }
    .emit(&mut private);
    private[wire::CMA_HDR_LEN..wire::CMA_HDR_LEN + opts.private_data.len()]
        .copy_from_slice(&opts.private_data);
    // The QP's ECE offer (srdma's selective repeat) rides in the REQ: the vendor in its
    // field, the options in the MAD's attribute modifier.
    let ece = qp.as_ref().map_or(opts.ece, Qp::query_ece);
    let req = CmMsg::Req(wire::Req {
        local_comm_id: comm_id,
        vendor_id: ece.vendor_id & 0xFF_FFFF,
        service_id: wire::service_id(opts.port_space, server.port()),
        local_ca_guid: dev.query().node_guid,
        local_qkey: 0,
        local_qpn: qpn.value(),
        responder_resources: responder,
        local_eecn: 0,
        initiator_depth: initiator,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: if qp_type == QpType::Uc { 1 } else { 0 },
        end_to_end_flow_control: false,
        starting_psn: rq_psn.value(),
        local_cm_response_timeout: 20,
        retry_count: opts.retry_cnt,
        pkey: 0xffff,
        path_mtu: mtu_code(mtu),
        rdc_exists: false,
        rnr_retry_count: opts.rnr_retry,
        max_cm_retries: 15,
        srq,
        extended_transport_type: 0,
        primary_local_lid: 0xffff,
        primary_remote_lid: 0xffff,
        primary_local_gid: local.0,
        primary_remote_gid: peer.0,
        primary_flow_label: 0,
        primary_packet_rate: 0,
        primary_traffic_class: 0,
        primary_hop_limit: opts.hop_limit,
        primary_sl: 0,
        primary_subnet_local: false,
        primary_local_ack_timeout: opts.ack_timeout,
        alternate_path: [0; 44],
        private_data: private,
    });
    let mut hdr = MadHdr::cm(wire::attr::REQ, tid);
    hdr.attr_mod = ece.options;
    gsi.send(peer, &hdr, &req)?;
    Ok(Connecting {
        gsi: gsi.clone(),
        qp,
        qp_type,
        peer,
        hdr,
        req,
        comm_id,
        reg,
        rq_psn,
        mtu,
        depths: (responder, initiator),
        started: Instant::now(),
        opts: opts.clone(),
    })
}

/// An active connection whose REQ is on its way ([`start_connect`]).
pub struct Connecting {
    gsi: Gsi,
    /// The QP the CM connects (`None`: the application does, see [`Responded`]).
    qp: Option<Qp>,
    qp_type: QpType,
    peer: Gid,
    hdr: MadHdr,
    req: CmMsg,
    comm_id: u32,
    reg: CommIdReg,
    rq_psn: Psn,
    mtu: crate::Mtu,
    /// (responder resources, initiator depth) offered.
    depths: (u8, u8),
    started: Instant,
    opts: ConnectOptions,
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting")
            .field("comm_id", &self.comm_id)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Connecting {
    /// Waits for the REP (sending the REQ again while none comes), connects the QP and
    /// sends the RTU. The QP is moved to ERR if the exchange fails.
    pub fn finish(self) -> Result<IbConnection, CmError> {
        self.wait_response()?.establish()
    }

    /// Waits for the REP, sending the REQ again while none comes (`rdma_connect` up to
    /// RDMA_CM_EVENT_CONNECT_RESPONSE). A QP the CM connects is moved to ERR if the exchange
    /// fails.
    pub fn wait_response(self) -> Result<Responded, CmError> {
        let Connecting {
            gsi,
            qp,
            qp_type,
            peer,
            hdr,
            req,
            comm_id,
            reg,
            rq_psn,
            mtu,
            depths: (responder, initiator),
            started,
            opts,
        } = self;
        let fail = |e: CmError| {
            if let Some(qp) = &qp {
                let _ = to_error(qp);
            }
            Err(e)
        };
        // The first REQ is out (`start_connect`).
        let mut sends = 1;
        // Until when an MRA asked us to wait (without sending the REQ again).
        let mut mra_until: Option<Instant> = None;
        let (rep, rep_options) = loop {
            let until = match mra_until {
                Some(t) => t,
                None => (Instant::now() + RESEND).min(started + opts.timeout),
            };
            let answer = gsi.recv_keyed(until, &[Key::Comm(comm_id)], |i| match &i.msg {
                CmMsg::Rep(m) => m.remote_comm_id == comm_id,
                CmMsg::Rej(m) => m.remote_comm_id == comm_id,
                CmMsg::Mra(m) => m.remote_comm_id == comm_id,
                _ => false,
            });
            match answer.map(|i| (i.msg, i.hdr.attr_mod)) {
                Some((CmMsg::Rep(m), options)) => break (m, options),
                Some((CmMsg::Rej(m), _))
                    if m.reason == reason::INVALID_SERVICE_ID
                        && started.elapsed() + UNLISTED_EVERY < opts.unlisted_retry =>
                {
                    // Nobody listens yet: ask again soon (these sends are not the REQ's
                    // resends).
                    std::thread::sleep(UNLISTED_EVERY);
                    sends -= 1;
                }
                Some((CmMsg::Rej(m), _)) => {
                    return fail(CmError::Rejected {
                        reason: m.reason,
                        private_data: m.private_data.to_vec(),
                    });
                }
                // MRA: the peer received the REQ and needs longer to answer (kernel ib_cm
                // sends one for each REQ that arrives again while its application has not
                // accepted yet: tgtd setting up its iSER device under qemu takes seconds).
                // As ib_cm does, wait the service timeout it names (4.096 µs × 2^x, at most
                // [`MRA_WAIT_MAX`]) without sending the REQ again, then time out.
                Some((CmMsg::Mra(m), _)) => {
                    let wait = Duration::from_nanos(4096 << m.service_timeout.min(31));
                    mra_until = Some(Instant::now() + wait.min(MRA_WAIT_MAX) + RESEND);
                    continue;
                }
                _ => {}
            }
            if mra_until.is_some_and(|t| Instant::now() >= t) {
                return fail(CmError::Timeout);
            }
            if mra_until.is_some() {
                continue;
            }
            if sends >= MAX_SENDS || started.elapsed() >= opts.timeout {
                return fail(CmError::Timeout);
            }
            gsi.send(peer, &hdr, &req)?;
            sends += 1;
        };
        let remote = RemoteQp {
            qpn: Qpn::new(rep.local_qpn),
            psn: rq_psn,
            gid: peer,
            port: crate::ROCEV2_PORT,
        };
        let initiator = initiator.min(rep.responder_resources);
        let params = opts.params(mtu, Psn::new(rep.starting_psn), initiator, responder);
        let peer_ece = Ece {
            vendor_id: rep.vendor_id,
            options: rep_options,
        };
        Ok(Responded {
            gsi,
            qp,
            qp_type,
            peer,
            tid: hdr.tid,
            comm_id,
            reg,
            remote,
            params,
            rep,
            peer_ece,
        })
    }
}

/// An active connection whose REP came ([`Connecting::wait_response`]): the RTU is still
/// to be sent ([`Responded::establish`]).
pub struct Responded {
    gsi: Gsi,
    qp: Option<Qp>,
    qp_type: QpType,
    peer: Gid,
    tid: u64,
    comm_id: u32,
    reg: CommIdReg,
    remote: RemoteQp,
    params: crate::ConnectParams,
    rep: wire::Rep,
    /// The ECE options the REP accepted.
    peer_ece: Ece,
}

impl std::fmt::Debug for Responded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responded")
            .field("comm_id", &self.comm_id)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Responded {
    /// What the peer's REP asked for.
    pub fn peer_params(&self) -> PeerParams {
        PeerParams::of_rep(&self.rep)
    }

    /// The private data of the peer's REP.
    pub fn private_data(&self) -> &[u8] {
        &self.rep.private_data
    }

    /// The ECE options the peer's REP accepted (`rdma_get_remote_ece`).
    pub fn peer_ece(&self) -> Ece {
        self.peer_ece
    }

    /// The attributes of the local QP for RTR and RTS, with their masks: what the CM gives
    /// a QP it connects (`rdma_init_qp_attr`).
    pub fn qp_attrs(&self) -> [(crate::QpAttr, crate::AttrMask); 2] {
        crate::connect_attrs(self.qp_type, &self.remote, &self.params)
    }

    /// Connects the QP (if the CM has one) and sends the RTU (`rdma_establish`). The QP is
    /// moved to ERR if it cannot be connected.
    pub fn establish(self) -> Result<IbConnection, CmError> {
        if let Some(qp) = &self.qp {
            // What the REP accepted of the REQ's offer (none from rxe or a NIC: go-back-N).
            let connected = qp
                .set_ece(self.peer_ece)
                .and_then(|_| qp.connect(&self.remote, &self.params));
            if let Err(e) = connected {
                let _ = to_error(qp);
                return Err(e.into());
            }
        }
        let rtu = CmMsg::Rtu(wire::Rtu {
            local_comm_id: self.comm_id,
            remote_comm_id: self.rep.local_comm_id,
            private_data: [0; 224],
        });
        self.gsi
            .send(self.peer, &MadHdr::cm(wire::attr::RTU, self.tid), &rtu)?;
        Ok(IbConnection::new(
            self.reg,
            self.qp,
            &self.gsi,
            self.peer,
            self.remote,
            (self.comm_id, self.rep.local_comm_id),
            self.rep.private_data.to_vec(),
            PeerParams::of_rep(&self.rep),
        ))
    }
}

/// [`connect`] with a QP the caller created (RC or UC, in INIT, receives posted), from rdma_cm
/// port `src_port` (the rdma_cm header's source port); `srq`: the QP receives from an SRQ.
/// The QP is moved to ERR if the exchange fails.
pub fn connect_qp(
    gsi: &Gsi,
    qp: &Qp,
    server: SocketAddr,
    src_port: u16,
    srq: bool,
    opts: &ConnectOptions,
) -> Result<IbConnection, CmError> {
    start_connect(gsi, qp, server, src_port, srq, opts)?.finish()
}

/// The passive side: REQs for one rdma_cm port (TCP port space) on this device's address.
#[derive(Debug)]
pub struct IbListener {
    gsi: Gsi,
    service_id: u64,
}

/// A REQ waiting for [`IbRequest::accept`] or [`IbRequest::reject`]; dropped unanswered,
/// it is rejected (as kernel ib_cm rejects a request whose id is destroyed).
#[derive(Debug)]
pub struct IbRequest {
    /// Accepted or rejected: its resent REQs are answered by the accept (else by an MRA).
    answered: bool,
    gsi: Gsi,
    hdr: MadHdr,
    req: wire::Req,
    from: Gid,
    /// The receive PSN the REP will offer (chosen when the REQ came, so that the attributes
    /// for the QP are known before the accept: `rdma_init_qp_attr`).
    psn: Psn,
}

impl IbListener {
    /// Listens for REQs to rdma_cm port `port` (`rdma_listen`).
    pub fn bind(gsi: &Gsi, port: u16) -> Result<IbListener, Error> {
        IbListener::bind_ps(gsi, wire::port_space::TCP, port)
    }

    /// Listens on `port` of rdma_cm port space `ps`: REQs in the TCP space
    /// ([`IbListener::accept_request`]), SIDR_REQs in the UDP space
    /// ([`IbListener::accept_sidr`]).
    pub fn bind_ps(gsi: &Gsi, ps: u16, port: u16) -> Result<IbListener, Error> {
        let service_id = wire::service_id(ps, port);
        gsi.device().cm_listen(service_id)?;
        lock(&gsi.inner.state).listens.push(service_id);
        Ok(IbListener {
            gsi: gsi.clone(),
            service_id,
        })
    }

    /// The next REQ for this port whose rdma_cm header names this device's address.
    pub fn accept_request(&self, timeout: Duration) -> Result<IbRequest, CmError> {
        self.accept_request_while(timeout, || true)
    }

    /// [`IbListener::accept_request`] for a listener that may be closing: a REQ is taken
    /// only while `open()` holds. One that comes after stays for another listener of the
    /// port (a program that closes its listening socket and listens again, as iperf3's
    /// server does after each test), or for [`IbListener::refuse_waiting`].
    pub fn accept_request_while(
        &self,
        timeout: Duration,
        open: impl Fn() -> bool,
    ) -> Result<IbRequest, CmError> {
        let me = ip16(self.gsi.device().local_addr().ip());
        let sid = self.service_id;
        let got = self
            .gsi
            .recv_keyed(
                Instant::now() + timeout,
                &[Key::Service(sid)],
                |i| match &i.msg {
                    CmMsg::Req(r) => {
                        r.service_id == sid
                            && CmaHdr::parse(&r.private_data).is_ok_and(|h| h.dst_addr == me)
                            && open()
                    }
                    _ => false,
                },
            )
            .ok_or(CmError::Timeout)?;
        match got.msg {
            CmMsg::Req(req) => Ok(IbRequest {
                answered: false,
                gsi: self.gsi.clone(),
                hdr: got.hdr,
                req,
                from: got.from,
                psn: crate::random_psn(),
            }),
            _ => Err(CmError::Protocol("not a REQ".into())),
        }
    }

    /// A closed listener's last act: the REQs that came for its port and nobody took are
    /// rejected (invalid service ID, as for a port nobody listens on), unless another
    /// listener of this device listens on the port now and takes them.
    pub fn refuse_waiting(&self) {
        let twins = lock(&self.gsi.inner.state)
            .listens
            .iter()
            .filter(|&&s| s == self.service_id)
            .count();
        if twins > 1 {
            return;
        }
        while let Ok(r) = self.accept_request(Duration::ZERO) {
            let _ = r.reject(crate::cm::reason::INVALID_SERVICE_ID, &[]);
        }
    }

    /// The next SIDR_REQ for this port whose rdma_cm header names this device's address.
    pub fn accept_sidr(&self, timeout: Duration) -> Result<SidrRequest, CmError> {
        let me = ip16(self.gsi.device().local_addr().ip());
        let sid = self.service_id;
        let got = self
            .gsi
            .recv_keyed(
                Instant::now() + timeout,
                &[Key::Service(sid)],
                |i| match &i.msg {
                    CmMsg::SidrReq(r) => {
                        r.service_id == sid
                            && CmaHdr::parse(&r.private_data).is_ok_and(|h| h.dst_addr == me)
                    }
                    _ => false,
                },
            )
            .ok_or(CmError::Timeout)?;
        match got.msg {
            CmMsg::SidrReq(req) => Ok(SidrRequest {
                gsi: self.gsi.clone(),
                hdr: got.hdr,
                req,
                from: got.from,
                answered: Default::default(),
            }),
            _ => Err(CmError::Protocol("not a SIDR_REQ".into())),
        }
    }
}

impl Drop for IbListener {
    fn drop(&mut self) {
        let mut st = lock(&self.gsi.inner.state);
        if let Some(i) = st.listens.iter().position(|&s| s == self.service_id) {
            st.listens.swap_remove(i);
        }
    }
}

/// A SIDR_REQ (`rdma_connect` on a UD id) waiting for [`SidrRequest::accept`] or
/// [`SidrRequest::reject`]. Dropped unanswered, it is rejected ([`SIDR_REJECT`]), as kernel
/// ib_cm rejects the SIDR_REQ of an id destroyed before it replied.
#[derive(Debug)]
pub struct SidrRequest {
    gsi: Gsi,
    hdr: MadHdr,
    req: wire::SidrReq,
    from: Gid,
    answered: std::sync::atomic::AtomicBool,
}

impl Drop for SidrRequest {
    fn drop(&mut self) {
        if !self.answered.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = self.reply(SIDR_REJECT, 0, 0, &[]);
        }
    }
}

/// SIDR_REP status: the QP is valid.
pub const SIDR_SUCCESS: u8 = 0;
/// SIDR_REP status: nobody serves the service ID.
pub const SIDR_UNSUPPORTED: u8 = 1;
/// SIDR_REP status: the application rejected the request.
pub const SIDR_REJECT: u8 = 2;

impl SidrRequest {
    /// The requester's ID for this resolution (a request sent again carries the same).
    pub fn request_id(&self) -> u32 {
        self.req.request_id
    }

    /// The requester's GID.
    pub fn from(&self) -> Gid {
        self.from
    }

    /// The rdma_cm header (addresses and the requester's port).
    pub fn cma_hdr(&self) -> Option<CmaHdr> {
        CmaHdr::parse(&self.req.private_data).ok()
    }

    /// The application's private data (after the rdma_cm header).
    pub fn private_data(&self) -> &[u8] {
        &self.req.private_data[wire::CMA_HDR_LEN..]
    }

    /// Answers with the UD QP `qpn` and its Q_Key, and private data (at most 136 bytes).
    pub fn accept(&self, qpn: Qpn, qkey: u32, private_data: &[u8]) -> Result<(), CmError> {
        self.reply(SIDR_SUCCESS, qpn.value(), qkey, private_data)
    }

    /// Refuses with `status` ([`SIDR_REJECT`] for the application's own refusal).
    pub fn reject(&self, status: u8, private_data: &[u8]) -> Result<(), CmError> {
        self.reply(status, 0, 0, private_data)
    }

    fn reply(&self, status: u8, qpn: u32, qkey: u32, data: &[u8]) -> Result<(), CmError> {
        let mut private = [0u8; 136];
        if data.len() > private.len() {
            return Err(CmError::PrivateDataTooLong(data.len()));
        }
        private[..data.len()].copy_from_slice(data);
        self.answered
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let rep = CmMsg::SidrRep(wire::SidrRep {
            request_id: self.req.request_id,
            status,
            additional_info_length: 0,
            qpn,
            service_id: self.req.service_id,
            qkey,
            class_port_info: [0; 72],
            private_data: private,
        });
        self.gsi.send(
            self.from,
            &MadHdr::cm(wire::attr::SIDR_REP, self.hdr.tid),
            &rep,
        )?;
        lock(&self.gsi.inner.state)
            .sidrs
            .answered_with((self.from, self.req.request_id), rep);
        Ok(())
    }
}

/// What a SIDR_REP answered.
#[derive(Debug, Clone)]
pub struct SidrReply {
    /// The server's UD QP.
    pub qpn: Qpn,
    /// Its Q_Key.
    pub qkey: u32,
    /// The server's GID.
    pub gid: Gid,
    /// The server's private data.
    pub private_data: Vec<u8>,
}

/// `rdma_connect` on a UD id: a SIDR_REQ for rdma_cm port `server` (the UDP port space, or
/// `opts.port_space` if that is another than TCP: IB) from port `src_port`, with
/// `opts.private_data`, sent again every [`RESEND`] until the SIDR_REP comes or
/// `opts.timeout` passes. A SIDR_REP with a non-zero status is [`CmError::Rejected`] with
/// that status — but "unsupported" (nobody listens on the port yet) within
/// `opts.unlisted_retry` of the first SIDR_REQ, which is asked again every 50 ms, as a REQ
/// rejected for an unknown service is (see [`ConnectOptions::unlisted_retry`]).
pub fn sidr_resolve(
    gsi: &Gsi,
    server: SocketAddr,
    src_port: u16,
    opts: &ConnectOptions,
) -> Result<SidrReply, CmError> {
    let (private_data, timeout) = (&opts.private_data[..], opts.timeout);
    let ps = match opts.port_space {
        wire::port_space::TCP => wire::port_space::UDP,
        other => other,
    };
    let dev = gsi.device();
    let mut private = [0u8; 216];
    if private_data.len() > private.len() - wire::CMA_HDR_LEN {
        return Err(CmError::PrivateDataTooLong(private_data.len()));
    }
    CmaHdr {
        cma_version: 0,
        ip_version: if server.ip().is_ipv4() { 4 } else { 6 },
        src_port,
        src_addr: ip16(dev.local_addr().ip()),
        dst_addr: ip16(server.ip()),
    }
    .emit(&mut private);
    private[wire::CMA_HDR_LEN..wire::CMA_HDR_LEN + private_data.len()]
        .copy_from_slice(private_data);
    let request_id = dev.comm_id_prefix() | (random_u32() >> 8);
    let req = CmMsg::SidrReq(wire::SidrReq {
        request_id,
        pkey: 0xffff,
        service_id: wire::service_id(ps, server.port()),
        private_data: private,
    });
    let peer = Gid::from_ip(server.ip());
    let tid = u64::from(random_u32()) << 32 | u64::from(request_id.swap_bytes());
    let hdr = MadHdr::cm(wire::attr::SIDR_REQ, tid);
    let started = Instant::now();
    let mut sends = 0;
    while sends < MAX_SENDS {
        if started.elapsed() >= timeout {
            break;
        }
        gsi.send(peer, &hdr, &req)?;
        sends += 1;
        let until = (Instant::now() + RESEND).min(started + timeout);
        let got = gsi.recv_keyed(until, &[Key::Comm(request_id)], |i| match &i.msg {
            CmMsg::SidrRep(m) => m.request_id == request_id,
            _ => false,
        });
        if let Some(CmMsg::SidrRep(rep)) = got.map(|i| i.msg) {
            if rep.status == SIDR_UNSUPPORTED
                && started.elapsed() + UNLISTED_EVERY < opts.unlisted_retry
            {
                // Nobody listens yet: ask again soon (not one of the request's resends).
                std::thread::sleep(UNLISTED_EVERY);
                sends -= 1;
                continue;
            }
            if rep.status != SIDR_SUCCESS {
                return Err(CmError::Rejected {
                    reason: u16::from(rep.status),
                    private_data: rep.private_data.to_vec(),
                });
            }
            return Ok(SidrReply {
                qpn: Qpn::new(rep.qpn),
                qkey: rep.qkey,
                gid: peer,
                private_data: rep.private_data.to_vec(),
            });
        }
    }
    Err(CmError::Timeout)
}

/// A passive connection whose REP is on its way ([`IbRequest::start_accept`]).
pub struct Accepting {
    request: IbRequest,
    qp: Option<Qp>,
    hdr: MadHdr,
    rep: CmMsg,
    comm_id: u32,
    reg: CommIdReg,
    remote: RemoteQp,
    started: Instant,
    timeout: Duration,
}

impl std::fmt::Debug for Accepting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepting")
            .field("comm_id", &self.comm_id)
            .field("from", &self.request.from)
            .finish_non_exhaustive()
    }
}

impl Accepting {
    /// Waits for the RTU, sending the REP again while it does not come (a duplicate REQ
    /// gets it again too). The QP is moved to ERR if the exchange fails.
    pub fn finish(self) -> Result<IbConnection, CmError> {
        let Accepting {
            request,
            qp,
            hdr,
            rep,
            comm_id,
            reg,
            remote,
            started,
            timeout,
        } = self;
        let req = &request.req;
        let gsi = &request.gsi;
        // The first REP is out (`start_accept`).
        for sent in 1..=MAX_SENDS {
            if sent > 1 {
                if started.elapsed() >= timeout {
                    break;
                }
                gsi.send(request.from, &hdr, &rep)?;
            }
            let keys = [Key::Comm(comm_id), Key::PeerReq(req.local_comm_id)];
            let got = gsi.recv_keyed(Instant::now() + RESEND, &keys, |i| match &i.msg {
                CmMsg::Rtu(m) => m.remote_comm_id == comm_id,
                CmMsg::Req(r) => r.local_comm_id == req.local_comm_id,
                CmMsg::Rej(m) => m.remote_comm_id == comm_id,
                _ => false,
            });
            match got.map(|i| i.msg) {
                Some(CmMsg::Rtu(_)) => {
                    return Ok(IbConnection::new(
                        reg,
                        qp,
                        gsi,
                        request.from,
                        remote,
                        (comm_id, req.local_comm_id),
                        req.private_data[wire::CMA_HDR_LEN..].to_vec(),
                        PeerParams::of_req(req),
                    ));
                }
                Some(CmMsg::Rej(m)) => {
                    if let Some(qp) = &qp {
                        let _ = to_error(qp);
                    }
                    return Err(CmError::Rejected {
                        reason: m.reason,
                        private_data: m.private_data.to_vec(),
                    });
                }
                // A duplicate REQ (our REP was lost; counted where it came in): the loop
                // sends the REP again.
                _ => {}
            }
        }
        if let Some(qp) = &qp {
            let _ = to_error(qp);
        }
        Err(CmError::Timeout)
    }
}

impl IbRequest {
    /// The REQ.
    pub fn req(&self) -> &wire::Req {
        &self.req
    }

    /// The requester's GID.
    pub fn from(&self) -> Gid {
        self.from
    }

    /// The rdma_cm header (addresses and the requester's port).
    pub fn cma_hdr(&self) -> Option<CmaHdr> {
        CmaHdr::parse(&self.req.private_data).ok()
    }

    /// What the REQ asks for.
    pub fn peer_params(&self) -> PeerParams {
        PeerParams::of_req(&self.req)
    }

    /// The ECE options the REQ offers (`rdma_get_remote_ece`).
    pub fn peer_ece(&self) -> Ece {
        Ece {
            vendor_id: self.req.vendor_id,
            options: self.hdr.attr_mod,
        }
    }

    /// The application's private data (after the rdma_cm header).
    pub fn private_data(&self) -> &[u8] {
        &self.req.private_data[wire::CMA_HDR_LEN..]
    }

    /// `rdma_reject`: a REJ with `reason` and private data.
    pub fn reject(mut self, reason: u16, private_data: &[u8]) -> Result<(), CmError> {
        self.mark_answered();
        let mut pd = [0u8; 148];
        let n = private_data.len().min(148);
        pd[..n].copy_from_slice(&private_data[..n]);
        let rej = CmMsg::Rej(wire::Rej {
            local_comm_id: random_u32(),
            remote_comm_id: self.req.local_comm_id,
            message_rejected: 0,
            rejected_info_length: 0,
            reason,
            additional_info: [0; 72],
            private_data: pd,
        });
        self.gsi
            .send(self.from, &MadHdr::cm(wire::attr::REJ, self.hdr.tid), &rej)?;
        Ok(())
    }

    /// `rdma_accept`: a QP from `init` on `pd`, connected to the REQ's, a REP, and the wait
    /// for the RTU (the REP is sent again while it does not come; a duplicate REQ gets it
    /// again too).
    pub fn accept(
        self,
        pd: &Pd,
        init: &QpInit,
        opts: &ConnectOptions,
    ) -> Result<IbConnection, CmError> {
        let qp = pd.create_qp(init)?;
        self.accept_with(&qp, opts)
    }

    /// [`IbRequest::accept`] with a QP the caller created (in INIT, receives posted).
    pub fn accept_with(self, qp: &Qp, opts: &ConnectOptions) -> Result<IbConnection, CmError> {
        self.start_accept(qp, opts)?.finish()
    }

    /// The first half of [`IbRequest::accept_with`], which returns at once: connects the QP
    /// and sends the REP from the calling thread; [`Accepting::finish`] waits for the RTU.
    /// A QP that cannot be connected gets the REQ rejected (no resources).
    pub fn start_accept(self, qp: &Qp, opts: &ConnectOptions) -> Result<Accepting, CmError> {
        let qpn = qp.qpn();
        self.accept_start(Some(qp.clone()), qpn, opts)
    }

    /// [`IbRequest::start_accept`] for a QP the application moves through RTR and RTS itself
    /// (`rdma_accept` without a QP on the id): the REP names QP `qpn`; the attributes for
    /// that QP come from [`IbRequest::qp_attrs`]. The CM never touches the QP.
    pub fn start_accept_unmanaged(
        self,
        qpn: Qpn,
        opts: &ConnectOptions,
    ) -> Result<Accepting, CmError> {
        self.accept_start(None, qpn, opts)
    }

    /// What accepting with `opts` connects the QP to, and with which parameters.
    fn plan(&self, opts: &ConnectOptions) -> (RemoteQp, crate::ConnectParams, u8, u8) {
        let dev = self.gsi.device();
        let req = &self.req;
        // The REQ's path MTU is the path's, and both ends use it (the REP cannot tell the
        // active side of a smaller one), as kernel IB CM does.
        let mtu = crate::Mtu::from_u32(u32::from(req.path_mtu)).unwrap_or(opts.offered_mtu(dev));
        let (responder, initiator) = opts.depths(dev);
        let remote = RemoteQp {
            qpn: Qpn::new(req.local_qpn),
            psn: self.psn,
            gid: self.from,
            port: crate::ROCEV2_PORT,
        };
        let initiator = initiator.min(req.responder_resources);
        let params = opts.params(mtu, Psn::new(req.starting_psn), initiator, responder);
        (remote, params, responder, initiator)
    }

    /// The attributes for an RC or UC QP of `qp_type` accepting this request with `opts`,
    /// for RTR and RTS, with their masks (`rdma_init_qp_attr` on the passive side).
    pub fn qp_attrs(
        &self,
        qp_type: QpType,
        opts: &ConnectOptions,
    ) -> [(crate::QpAttr, crate::AttrMask); 2] {
        let (remote, params, _, _) = self.plan(opts);
        crate::connect_attrs(qp_type, &remote, &params)
    }

    fn accept_start(
        mut self,
        qp: Option<Qp>,
        qpn: Qpn,
        opts: &ConnectOptions,
    ) -> Result<Accepting, CmError> {
        opts.check()?;
        self.mark_answered();
        let dev = self.gsi.device().clone();
        let (remote, params, responder, initiator) = self.plan(opts);
        let req = &self.req;
        let rq_psn = self.psn;
        let reg = CommIdReg::pick(&self.gsi);
        let comm_id = reg.id;
        // The REP accepts what both ends offer of the REQ's ECE (for a QP the application
        // moves itself, what it set: `rdma_set_local_ece`).
        let mut ece = opts.ece;
        if let Some(qp) = &qp {
            let connected = qp
                .set_ece(self.peer_ece())
                .and_then(|_| qp.connect(&remote, &params));
            if let Err(e) = connected {
                let _ = self.reject_with(reason::NO_RESOURCES);
                return Err(e.into());
            }
            ece = qp.query_ece();
        }
        let mut private = [0u8; 196];
        let n = opts.private_data.len().min(196);
        private[..n].copy_from_slice(&opts.private_data[..n]);
        let rep = CmMsg::Rep(wire::Rep {
            local_comm_id: comm_id,
            vendor_id: ece.vendor_id & 0xFF_FFFF,
            remote_comm_id: req.local_comm_id,
            local_qkey: 0,
            local_qpn: qpn.value(),
            local_eecn: 0,
            starting_psn: rq_psn.value(),
            responder_resources: responder,
            initiator_depth: initiator,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: opts.rnr_retry,
            srq: false,
            local_ca_guid: dev.query().node_guid,
            private_data: private,
        });
        let mut hdr = MadHdr::cm(wire::attr::REP, self.hdr.tid);
        hdr.attr_mod = ece.options;
        self.gsi.send(self.from, &hdr, &rep)?;
        Ok(Accepting {
            request: self,
            qp,
            hdr,
            rep,
            comm_id,
            reg,
            remote,
            started: Instant::now(),
            timeout: opts.timeout,
        })
    }

    /// From now on a resent REQ goes to the accept under way (or is dropped), not an MRA.
    fn mark_answered(&mut self) {
        self.answered = true;
        lock(&self.gsi.inner.state)
            .reqs
            .answered((self.from, self.req.local_comm_id));
    }

    fn reject_with(&self, reason: u16) -> Result<(), CmError> {
        let req = &self.req;
        let rej = CmMsg::Rej(wire::Rej {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message_rejected: 0,
            rejected_info_length: 0,
            reason,
            additional_info: [0; 72],
            private_data: [0; 148],
        });
        self.gsi
            .send(self.from, &MadHdr::cm(wire::attr::REJ, self.hdr.tid), &rej)?;
        Ok(())
    }
}

impl Drop for IbRequest {
    fn drop(&mut self) {
        if !self.answered {
            self.mark_answered();
            let _ = self.reject_with(reason::CONSUMER_DEFINED);
        }
    }
}
