//! Helper threads: listens, connects, accepts, and the life of a connection (the CM
//! workers, the listeners and their lingering ports, the connections by QPN).

use super::event::{event, with_conn, with_ud};
use super::id::new_id;
use super::*;

pub(super) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), c_int> {
    srdma::threads::spawn(name, f)
        .map(|_| ())
        .map_err(|_| libc::EAGAIN)
}

/// A job for a CM worker.
type Job = Box<dyn FnOnce() + Send>;

/// Idle CM workers, each waiting on its own channel for the next connect or accept.
static IDLE: Mutex<Vec<std::sync::mpsc::Sender<Job>>> = Mutex::new(Vec::new());

/// Idle workers kept at most (more exit when their job is done). A worker is busy only for
/// a connect's or accept's exchange (the connection then needs no thread), so a burst of
/// connections reuses a few dozen threads: `cmtime -c 10000` connected in 1.24–1.51 s with
/// 64 (4 runs) against 1.95–2.23 s with 4 (5 runs just before), which started and ended a
/// thread per connection.
const MAX_IDLE: usize = 64;

/// Runs `f` on an idle CM worker thread, or a new one: connects and accepts do not create a
/// thread on their way (workers wait for the next job instead of exiting, and the first id
/// prepares two). With this and QP1 opened at route resolution, `rdma_connect` returns in
/// 15 µs instead of 0.43 ms (rping on loopback), and in 6–8 ms instead of 11–20 ms under
/// qemu TCG.
pub(super) fn run_job(f: impl FnOnce() + Send + 'static) -> Result<(), c_int> {
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
pub(super) fn prepare_workers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for _ in 0..2 {
            let _ = new_worker(None);
        }
    });
}

/// The errno of a connect or accept that failed before its first MAD left (bad options,
/// a QP that cannot be connected, a full send queue).
pub(super) fn cm_errno(e: &CmError) -> c_int {
    match e {
        CmError::Verbs(v) => crate::errno_of(v),
        CmError::PrivateDataTooLong(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// The event for a failed connect or accept, as kernel rdma_cm reports it.
pub(super) fn failure(id: usize, e: &CmError, ud: bool) -> Box<Event> {
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
/// connection made without a QP gets none after `rdma_establish`), and DISCONNECTED once
/// either side disconnects — reported by the device's GSI thread, which answers the peer's
/// DREQ and sends ours again until its DREP comes (`IbConnection::watch`): a connection
/// keeps no thread of its own, and the CM worker that ran the connect or accept is free.
pub(super) fn run_connection(sh: Arc<Shared>, conn: IbConnection, established: Option<Box<Event>>) {
    let conn = Arc::new(conn);
    on_exit_disconnect(&conn);
    if let Some(qp) = conn.try_qp() {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| crate::verbs::on_qp_destroyed(qp_destroyed));
        lock(&CONNS).insert(qp.qpn().value(), Arc::downgrade(&conn));
    }
    let want_disconnect = {
        let mut st = lock(&sh.st);
        st.conn = Some(conn.clone());
        st.want_disconnect
    };
    if let Some(ev) = established {
        sh.push(ev);
    }
    let weak = Arc::downgrade(&sh);
    conn.watch(move || {
        if let Some(sh) = weak.upgrade() {
            sh.report_disconnected();
        }
    });
    // `rdma_disconnect` before the connection was handed over here.
    if want_disconnect {
        let _ = conn.start_disconnect();
    }
}

/// Every connection of the process, for [`disconnect_at_exit`].
static LIVE: Mutex<LiveList> = Mutex::new(LiveList {
    list: Vec::new(),
    left: 0,
});
/// The process that registered [`disconnect_at_exit`] (a forked child's exit is not its).
static LIVE_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Keeps `conn` for [`disconnect_at_exit`], registered with `atexit` on the first connection.
fn on_exit_disconnect(conn: &Arc<IbConnection>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: getpid has no preconditions; atexit takes a function that lives as long as
        // the program (this library is never unloaded: `srdma exec` preloads it by name).
        unsafe {
            LIVE_PID.store(libc::getpid(), Ordering::Relaxed);
            libc::atexit(disconnect_at_exit);
        }
    });
    lock(&LIVE).push(Arc::downgrade(conn));
}

/// When to drop the entries of connections that are gone from [`LIVE`] and [`CONNS`]: once
/// they hold twice what the last pruning left, so that each connection costs O(1) (a walk
/// of all at each one costs ten thousand connections 10^8 steps).
fn prune_due(len: usize, left: usize) -> bool {
    len >= 2 * left.max(32)
}

/// Weak handles of the live connections, for [`disconnect_at_exit`].
struct LiveList {
    list: Vec<std::sync::Weak<IbConnection>>,
    /// Entries the last pruning left.
    left: usize,
}

impl LiveList {
    fn push(&mut self, c: std::sync::Weak<IbConnection>) {
        if prune_due(self.list.len(), self.left) {
            self.list.retain(|w| w.strong_count() > 0);
            self.left = self.list.len();
        }
        self.list.push(c);
    }
}

/// The connections by the QPN of their QP, for [`qp_destroyed`].
struct ConnMap {
    map: std::collections::BTreeMap<u32, std::sync::Weak<IbConnection>>,
    /// Entries the last pruning left.
    left: usize,
}

impl ConnMap {
    fn insert(&mut self, qpn: u32, c: std::sync::Weak<IbConnection>) {
        if prune_due(self.map.len(), self.left) {
            self.map.retain(|_, w| w.strong_count() > 0);
            self.left = self.map.len();
        }
        self.map.insert(qpn, c);
    }
}

/// At `exit`, a DREQ for every connection still up, as the kernel sends one for each
/// rdma_cm id of a process whose last descriptor of the rdma_cm device closes: the peer learns
/// at once that the connection is gone (libiscsi's tools exit without disconnecting their
/// iSER connection: tgtd on kernel rxe otherwise kept it and resent its next message to the
/// dead QP for good). The DREQs leave at once; no DREP is waited for. A process that ends
/// without `exit` (a crash, `_exit`) sends none, where the kernel would.
extern "C" fn disconnect_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: getpid has no preconditions.
        if unsafe { libc::getpid() } != LIVE_PID.load(Ordering::Relaxed) {
            return;
        }
        let conns: Vec<_> = lock(&LIVE)
            .list
            .iter()
            .filter_map(|w| w.upgrade())
            .collect();
        for c in conns {
            if !c.is_disconnected() {
                let _ = c.start_disconnect();
            }
        }
    });
}

/// The connections, by the QPN of their QP: `ibv_destroy_qp` makes them let go of it.
static CONNS: Mutex<ConnMap> = Mutex::new(ConnMap {
    map: std::collections::BTreeMap::new(),
    left: 0,
});

/// The application destroyed QP `qpn`: the connection over it releases it (so its CQs and
/// PD are free to go).
fn qp_destroyed(qpn: u32) {
    let c = lock(&CONNS).map.remove(&qpn);
    if let Some(c) = c.and_then(|w| w.upgrade()) {
        c.release_qp();
    }
}

/// How long the port of a destroyed listening id keeps the requests that reach it for a new
/// listener on the same port (and device) before they are rejected as for a closed port.
///
/// A program that listens again on the same port right after destroying its listener (as
/// perftest -R does between its two connections) would otherwise lose a request that
/// arrives in between to REJ "invalid service ID". A kernel answers that way too, but its
/// listen is a system call and the race is rarely lost; ours can lose it under CPU load.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// Who serves a listener's requests: the listening id, or nobody while it lingers.
pub(super) type Holder = Arc<Mutex<Option<Arc<Shared>>>>;

/// Listeners whose ids were destroyed, still holding their port: (device, port space, port).
static LINGERING: Mutex<Vec<(usize, u16, u16, Holder)>> = Mutex::new(Vec::new());

/// The lingering listener of (`d`, `ps`, `port`), handed to `sh`: its holder, if there
/// was one.
pub(super) fn adopt_lingering(d: usize, ps: u16, port: u16, sh: &Arc<Shared>) -> Option<Holder> {
    let mut l = lock(&LINGERING);
    let i = l
        .iter()
        .position(|e| e.0 == d && e.1 == ps && e.2 == port)?;
    let (_, _, _, holder) = l.swap_remove(i);
    *lock(&holder) = Some(sh.clone());
    Some(holder)
}

/// The listening id of `holder` is destroyed: its listener lingers (see [`LINGER`]) from
/// now on, so that an `rdma_listen` on the same port right after adopts it. Called by
/// `rdma_destroy_id` (before it returns: a program that listens again at once must find
/// it) and by the listener's thread; the second call does nothing.
pub(super) fn start_lingering(holder: &Holder, d: usize, ps: u16, port: u16) {
    let mut l = lock(&LINGERING);
    {
        let mut h = lock(holder);
        if h.as_ref()
            .is_some_and(|sh| !sh.closed.load(Ordering::Acquire))
        {
            // Adopted already.
            return;
        }
        *h = None;
    }
    if !l.iter().any(|e| Arc::ptr_eq(&e.3, holder)) {
        l.push((d, ps, port, holder.clone()));
    }
}

pub(super) fn listen_loop(holder: Holder, d: usize, l: IbListener, ud: bool, ps: u16, port: u16) {
    let tick = Duration::from_millis(50);
    // A request taken just as its listening id was destroyed: for the id that listens
    // again (perftest -R destroys its first listener right after its first connection,
    // while the second REQ may already be here), else refused with the rest.
    let mut held: Option<Pending> = None;
    loop {
        let sh = lock(&holder).clone();
        let Some(sh) = sh.filter(|sh| !sh.closed.load(Ordering::Acquire)) else {
            start_lingering(&holder, d, ps, port);
            if !linger(&holder) {
                // Nobody listened again: what waited is refused as for a closed port.
                match held.take() {
                    Some(Pending::Conn(r)) => {
                        let _ = r.reject(srdma::cm::reason::INVALID_SERVICE_ID, &[]);
                    }
                    Some(Pending::Sidr(r)) => {
                        let _ = r.reject(ibcm::SIDR_UNSUPPORTED, &[]);
                    }
                    None => {}
                }
                while let Ok(r) = l.accept_request(Duration::ZERO) {
                    let _ = r.reject(srdma::cm::reason::INVALID_SERVICE_ID, &[]);
                }
                while let Ok(r) = l.accept_sidr(Duration::ZERO) {
                    let _ = r.reject(ibcm::SIDR_UNSUPPORTED, &[]);
                }
                return;
            }
            continue;
        };
        let req = match held.take() {
            Some(r) => Some(r),
            None if ud => l.accept_sidr(tick).ok().map(Pending::Sidr),
            // A REQ or SIDR_REQ sent again never comes here: QP1 answers it (see
            // `srdma::ibcm`).
            None => l.accept_request(tick).ok().map(Pending::Conn),
        };
        let Some(req) = req else { continue };
        if sh.closed.load(Ordering::Acquire) {
            held = Some(req);
            continue;
        }
        let hdr = match &req {
            Pending::Conn(r) => r.cma_hdr(),
            Pending::Sidr(r) => r.cma_hdr(),
        };
        on_request(&sh, d, port, hdr, req);
    }
}

/// Keeps a destroyed id's listener (lingering: [`start_lingering`]) for [`LINGER`]: true if
/// a new id adopted it meanwhile.
fn linger(holder: &Holder) -> bool {
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
