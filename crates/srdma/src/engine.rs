//! The engine of a device: its state (QPs, memory, batches), the progress thread, and
//! receive, transmit, timers and completion delivery. The application's threads drive it too
//! (posts send from the caller's thread, polls receive and complete); the progress thread makes
//! sure one-sided operations finish without the application and sleeps when idle.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_proto::{CqSide, Ctx, MrTable, Qp as ProtoQp, RecvMeta, Srq as ProtoSrq};
use srdma_wire::{Encap, IpRepr, Kind, Packet, PacketRepr, pcap};

use crate::cq::Cq;
use crate::device::{DeviceConfig, DeviceCounters, Gid, Gso};
use crate::error::{Result, io_err};
use crate::memory::Store;
use crate::sys;

/// Datagrams queued per `sendmmsg` (runs of them to one peer go out as one UDP GSO message).
const TX_BATCH: usize = 128;
/// Buffers per `recvmmsg` (each may hold a GRO-coalesced run of datagrams).
const RX_BATCH: usize = 32;
/// Receive batches handled before timers and the stop flag are looked at again: a flood of
/// datagrams must not starve retransmissions or block the device's drop.
const RX_BUDGET: usize = 8;
/// An application poll this soon after a receive that left the socket empty (a batch not
/// full) does not look at the socket again (once): it comes to collect what that receive
/// completed, and the application's next step (a post, in a ping-pong) should not wait for
/// a system call that finds nothing. Loopback, 8 B SEND ping-pong: the client's poll
/// between its receive and its next send cost ~0.9 µs of the round trip (see
/// benchmarks/README.md). A `post_send` in between cancels the rest: what it sent may
/// already have been answered (a QP of this device answers at once).
const RX_REST: Duration = Duration::from_micros(3);
/// How long the progress thread keeps looking at the socket (without sleeping) after it
/// answered a one-sided request (READ, atomic) that came alone in its receive batch: the
/// peer's next one waits on this thread alone — no application here polls for it — and a
/// wake-up from `poll` costs more than the round trip (loopback: `ib_read_lat -s 8` 24–38 µs
/// typical while the thread slept between requests, 10–12 µs with it looking on). Requests
/// that come several to a batch are a stream that keeps the thread busy anyway; looking on
/// there took a core from the requester (`ib_read_bw -e -s 4096` −20 % on 2 cores).
const ONE_SIDED_SPIN: Duration = Duration::from_micros(50);
/// Datagrams taken from one multicast group's socket per receive pass.
const GROUP_BUDGET: usize = 64;
/// Multicast groups a device joins at most (rxe's `RXE_MAX_MCAST_GRP`).
pub const MAX_MCAST_GRP: u32 = 8192;
/// QPs attached to one multicast group at most (rxe's `RXE_MAX_MCAST_QP_ATTACH`).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;
/// How long after an application's last poll the progress thread keeps out of the way:
/// while an application polls, its polls drive the device (no thread hand-off on the hot
/// path); when it stops, the thread takes over within this time.
const APP_GRACE: Duration = Duration::from_millis(1);
/// While WRITEs without immediate arrive (see `Shared::silent_writes_until`), a gap this
/// long since an application's last poll means it stopped polling before its grace ran
/// out — it spins on its memory for the peer's next WRITE, as perftest's `ib_write_lat`
/// does after its send completes — and the progress thread takes over at once.
const POLL_GAP: Duration = Duration::from_micros(20);
/// The progress thread's first look, while it stands aside, at whether the application
/// still polls; each look after that waits twice as long, up to the grace.
const FIRST_LOOK: Duration = Duration::from_micros(25);
/// How long after the last WRITE without immediate the progress thread keeps looking.
const SILENT_WRITES_HOLD: Duration = Duration::from_millis(100);
/// How often an application's polls refresh the device's published statistics at most.
const STATS_EVERY: Duration = Duration::from_millis(250);

pub(crate) struct QpSlot {
    pub(crate) qp: ProtoQp,
    /// The state the application last saw or set: a move to ERR the engine makes on its
    /// own raises `QpFatal`.
    pub(crate) state_seen: srdma_proto::QpState,
    pub(crate) send_cq: Cq,
    pub(crate) recv_cq: Cq,
    pub(crate) srq: Option<u32>,
    /// Learned: how many times in a row the application posted a send while what a receive
    /// brought was held back for it (an ACK, or nothing to send yet), or right after its
    /// `post_recv` or poll sent a held-back ACK (a SEND or WRITE ping-pong). From
    /// [`ACK_RIDES_AFTER`] on, an ACK held back by a receive (the progress thread's too:
    /// [`Hold::Riding`]) waits past `post_recv` and polls (for [`ACK_RIDE_WINDOW`]) for that
    /// send and leaves right behind it, in the same `sendmmsg`. Cleared when the progress
    /// thread had to send a held-back ACK because the application went elsewhere (a peer
    /// with a short retransmission timer, rxe in a slow VM, retries after a millisecond).
    pub(crate) ack_rides_send: u8,
    /// When (ns since the epoch) `post_recv` or a poll last sent a held-back ACK (0: not
    /// since the last send): a send soon after it counts towards `ack_rides_send`.
    pub(crate) ack_flushed_at: u64,
    /// When (ns since the epoch) a receive last held this QP's packets back (put it in
    /// `State::deferred`).
    pub(crate) deferred_at: u64,
    /// Whether a receive was posted to the QP (see [`QpSlot::ack_tail`]).
    pub(crate) posted_recv: bool,
}

impl QpSlot {
    /// Whether an ACK that rides behind a request (a ping-pong's reply) goes as the short
    /// tail of the request's GSO message, so that both arrive together, instead of as a
    /// datagram of its own one send later (loopback: the pair at 3.9 µs, against the request
    /// at 3.0 µs and the ACK at 6.0 µs).
    ///
    /// Which one the peer's application needs first is its business; this side's own
    /// application is the guess (a ping-pong runs one program at both ends). One whose
    /// replies and send completions reach it through one CQ takes whichever comes first:
    /// the reply alone is sooner. One with a separate send CQ can wait for its send's
    /// completion before it looks for the reply (perftest's `ib_send_lat`), and one that
    /// takes no SENDs learns of the peer's WRITEs from memory and polls its CQ only for its
    /// own completions (`ib_write_lat`): both wait for the ACK, and the pair brings the
    /// peer's next message with it. Figures in benchmarks/README.md ("8 B ping-pong
    /// latency").
    pub(crate) fn ack_tail(&self) -> bool {
        let shares_cq = Arc::ptr_eq(&self.send_cq.inner, &self.recv_cq.inner);
        let receives = self.posted_recv || self.srq.is_some();
        !(shares_cq && receives)
    }

    /// When (ns since the epoch) what a receive held back for this QP has waited
    /// [`ACK_RIDE_WINDOW`] and leaves whatever the application does.
    fn hold_ends(&self) -> u64 {
        self.deferred_at
            .saturating_add(ACK_RIDE_WINDOW.as_nanos() as u64)
    }
}

/// How soon after a `post_recv` that sent a held-back ACK a send must follow for the next
/// ACK to wait for the send instead; also how long such an ACK waits through the
/// application's polls for that send.
pub(crate) const ACK_RIDE_WINDOW: Duration = Duration::from_micros(100);

/// How many quick send-after-`post_recv` in a row make a QP's ACKs wait for its sends (a
/// few hand-shakes in a row must not: perftest's do, then it goes quiet).
pub(crate) const ACK_RIDES_AFTER: u8 = 8;

/// What a receive holds back of the packets (ACKs, responses) of the QPs it touched, for
/// the application's next post (see `State::deferred`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Nothing: everything leaves now.
    Nothing,
    /// Everything but requests: the receive was the application's poll.
    All,
    /// The ACKs of QPs whose application posts a send right after it takes what they
    /// acknowledge (`QpSlot::ack_rides_send`), for at most [`ACK_RIDE_WINDOW`]: the
    /// progress thread's receive for an application that waits on its memory, not its CQ
    /// (perftest's `ib_write_lat`). Sent at once, such an ACK reaches the peer alone; the
    /// peer's application, which polls its send CQ for it, then turns to its memory, and
    /// the reply WRITE that follows lands while nothing polls — the progress thread has to
    /// take over there too, every round.
    Riding,
}

pub(crate) struct State {
    pub(crate) mrs: MrTable,
    pub(crate) mem: Store,
    pub(crate) qps: BTreeMap<u32, QpSlot>,
    pub(crate) srqs: BTreeMap<u32, ProtoSrq>,
    /// XRC domains' SRQs and target QPs (`qp::xrc`).
    pub(crate) xrc: crate::qp::xrc::XrcState,
    /// The QPN range this device owns: `qpn_base | n` (0 unless the port is shared).
    pub(crate) qpn_base: u32,
    pub(crate) next_qpn: u32,
    pub(crate) next_id: u32,
    pub(crate) counters: DeviceCounters,
    pub(crate) capture: Option<pcap::Writer<BufWriter<File>>>,
    pub(crate) tx: crate::udp::TxBatch,
    /// The receive batch; `None` only while a receive pass has it out.
    pub(crate) rx: Option<crate::udp::RxBatch>,
    pub(crate) touched: Vec<u32>,
    /// Buffer for datagrams the port keeper forwards (allocated on first use).
    pub(crate) fwd_buf: Vec<u8>,
    /// QPs whose packets (ACKs, responses) an application-driven receive held back: they go
    /// out with the application's next post to that QP (one send for the ACK and the reply
    /// of a ping-pong) or at its next poll, whichever comes first.
    pub(crate) deferred: Vec<u32>,
    pub(crate) due: Vec<u32>,
    /// Earliest QP timer, in ns since the epoch (u64::MAX: none).
    pub(crate) next_timer: u64,
    /// When (ns since the epoch) a READ or atomic request last arrived (see
    /// [`ONE_SIDED_SPIN`]).
    pub(crate) one_sided_at: u64,
    /// Whether that request came alone in its receive batch (see [`ONE_SIDED_SPIN`]).
    pub(crate) one_sided_lone: bool,
    /// When (ns since the epoch) a receive last left the socket empty (see [`RX_REST`]); taken
    /// (reset) by the next application poll, which skips the socket if it comes within
    /// [`RX_REST`].
    pub(crate) drained_at: u64,
    /// When (ns since the epoch) the published statistics may be refreshed next.
    pub(crate) stats_next: u64,
    pub(crate) stats: Option<crate::stats::Publisher>,
    /// What the GSO path probe (`Shared::probe_path`) learned of each peer address.
    pub(crate) paths: std::collections::HashMap<std::net::IpAddr, PathGso>,
    /// How many of `paths` are [`PathGso::Probing`]: flushes look at them only then.
    pub(crate) probing: usize,
    /// What the receive path keeps from one datagram to the next to check ICRCs faster (see
    /// `handle_datagram`).
    pub(crate) rx_icrc: srdma_wire::icrc::Memo,
    /// The same for the ICRCs the send path computes (see `Shared::flush`).
    pub(crate) tx_icrc: srdma_wire::icrc::Memo,
    /// The multicast groups this device's UD QPs are attached to.
    pub(crate) groups: Vec<Group>,
    /// Receive buffer for the groups' sockets (allocated on first use).
    pub(crate) group_buf: Vec<u8>,
}

/// A multicast group UD QPs of this device are attached to ([`crate::Qp::attach_mcast`]),
/// as rxe keeps one per multicast GID: a socket that is a member of the group on the
/// device's interface and receives its datagrams, and the attached QPs, each of which gets a
/// copy of every datagram sent to QPN 0xFFFFFF (its Q_Key and receive queue decide the rest).
pub(crate) struct Group {
    /// The group's address.
    pub(crate) ip: IpAddr,
    /// Bound to the group's address and the device's port (see `udp::join_group`).
    pub(crate) socket: UdpSocket,
    /// The attached QPs.
    pub(crate) qpns: Vec<u32>,
}

impl State {
    /// Takes QP `qpn` off the list of QPs whose packets a receive held back; true if it was
    /// on it.
    pub(crate) fn undefer(&mut self, qpn: u32) -> bool {
        match self.deferred.iter().position(|&q| q == qpn) {
            Some(i) => {
                self.deferred.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

/// What a device knows of the path to a peer address for UDP GSO (`Gso::Auto`, IPv4 peers
/// off this host): whether a GSO message cut into datagrams on the way reaches the peer's
/// transport whole (each datagram's ICRC covers the IPv4 ID the cutting gives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathGso {
    /// Not known yet: one datagram per send; a QP to it probes when idle, from `next_try`.
    /// `tries` probes were inconclusive so far, the last `ones` in a row with one answer.
    Unknown { tries: u8, ones: u8, next_try: u64 },
    /// QP `qpn` sent the probe: two copies of a duplicate request in one GSO message.
    Probing {
        qpn: u32,
        /// The QP's `unproductive_acks` and `psn_state` when it sent the probe.
        acks: u64,
        psns: (srdma_wire::Psn, srdma_wire::Psn),
        deadline: u64,
        tries: u8,
        ones: u8,
    },
    /// Both copies drew their ACK.
    Verified,
    /// One did, the other did not: one datagram per send from now on.
    Refused,
}

/// How long a probe's two ACKs may take.
const PROBE_WAIT: Duration = Duration::from_millis(200);
/// Inconclusive probes (lost, or the QP got busy) before the path counts as refused.
const PROBE_TRIES: u8 = 5;
/// Probes in a row with exactly one answer (the QP idle meanwhile) that refuse the path: a
/// path that rejects cut datagrams does so every time, a lossy one rarely twice running.
const PROBE_ONES: u8 = 2;

/// What a probe's answers say: `got` ACKs by the deadline (`None`: before it, as they
/// come), the QP idle all along or not, after `tries` inconclusive probes, the last
/// `ones` of them answered once. `None`: wait for more.
fn probe_verdict(got: u64, idle: bool, due: bool, tries: u8, ones: u8) -> Option<PathGso> {
    if got >= 2 {
        return Some(PathGso::Verified);
    }
    if !due {
        return None;
    }
    let ones = if got == 1 && idle { ones + 1 } else { 0 };
    Some(if ones >= PROBE_ONES || tries + 1 >= PROBE_TRIES {
        PathGso::Refused
    } else {
        PathGso::Unknown {
            tries: tries + 1,
            ones,
            next_try: 0,
        }
    })
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) socket: UdpSocket,
    /// The connection to the port keeper while this device holds a slot of a shared port.
    pub(crate) _keeper: Option<OwnedFd>,
    /// The port is shared through the keeper (this device owns its slot's QPNs only).
    pub(crate) shared_port: bool,
    /// A GSI QP lives here on a shared port: the keeper forwards QP1's MADs, which receive
    /// passes and the progress thread's poll must look at.
    pub(crate) cm_forwarded: AtomicBool,
    /// Where async events go.
    pub(crate) events: Mutex<Option<crate::EventHandler>>,
    /// Set when the progress thread failed: the device is dead.
    pub(crate) fatal: AtomicBool,
    /// Test hook: the progress thread panics at its next turn.
    pub(crate) inject_failure: AtomicBool,
    pub(crate) local: SocketAddr,
    pub(crate) wake: OwnedFd,
    /// The timer the progress thread sleeps towards, in ns since `epoch` (u64::MAX: none).
    /// A post from an application thread that arms an earlier timer wakes it.
    pub(crate) sleep_until: AtomicU64,
    /// Until when (ns since `epoch`) an application's polls drive the device.
    pub(crate) app_active_until: AtomicU64,
    /// Until when (ns since `epoch`) the progress thread, standing aside for an
    /// application's polls, looks often whether they stopped: some QP executed a WRITE
    /// without immediate less than [`SILENT_WRITES_HOLD`] ago, so an application may be
    /// waiting for the next one in its memory instead of on a CQ.
    pub(crate) silent_writes_until: AtomicU64,
    pub(crate) stop: AtomicBool,
    pub(crate) epoch: Instant,
    pub(crate) cfg: DeviceConfig,
    /// The CQs with a completion hook (`Cq::set_hook`).
    pub(crate) hooked: Mutex<Vec<std::sync::Weak<crate::cq::CqInner>>>,
    /// Some hooked CQ got completions: whoever releases the device lock next runs the hooks.
    pub(crate) hooks_due: AtomicBool,
    /// Application threads asleep in [`Shared::wait_with_socket`] (`CompChannel::get_event`),
    /// watching the socket themselves: a datagram wakes the thread that waits for it, with
    /// no hand-off from the progress thread, which leaves the socket to them.
    pub(crate) app_waiters: AtomicUsize,
    /// When (ns since `epoch`) such a thread last woke (0: never): for [`APP_GRACE`] after it,
    /// the progress thread still leaves the socket alone, as the application is expected back.
    pub(crate) wait_woke_at: AtomicU64,
    /// The progress thread sleeps without watching the socket and without a deadline
    /// (applications wait on it): a waiter that wakes must wake it.
    pub(crate) sleeps_deep: AtomicBool,
    /// An epoll instance holding the sockets of `State::groups` (made at the first attach).
    pub(crate) groups_ep: std::sync::OnceLock<OwnedFd>,
    /// `groups_ep`'s descriptor while some group is joined, else -1: the progress thread
    /// always watches it, an application thread waiting on its channel too.
    pub(crate) groups_fd: AtomicI32,
}

/// Keeps the progress thread alive exactly as long as some handle needs the device.
pub(crate) struct DeviceHandle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        // Held-back ACKs go out before the device goes away.
        {
            let mut st = self.shared.lock();
            self.shared.flush_deferred(&mut st);
        }
        self.shared.stop.store(true, Ordering::Release);
        sys::signal(&self.shared.wake);
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(crate) fn encap_to(&self, dst: SocketAddr, sport: u16) -> Option<Encap> {
        let ip = IpRepr::between(self.local.ip(), dst.ip()).ok()?;
        Some(Encap {
            ip,
            src_port: sport,
            dst_port: dst.port(),
        })
    }

    /// Sends everything QP `qpn` has to send, then hands its completions to its CQs.
    pub(crate) fn flush(&self, st: &mut State, qpn: u32) {
        let now = self.now();
        self.probe_path(st, qpn, now);
        let State {
            mrs,
            mem,
            qps,
            srqs,
            counters,
            capture,
            tx,
            paths,
            tx_icrc,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        let ack_tail = slot.ack_tail();
        let fd = self.socket.as_raw_fd();
        // Payload goes to the socket straight from registered memory, except when a capture
        // wants each packet whole.
        let zero_copy = capture.is_none();
        // Whether the last destination may take GSO (one lookup per destination, not per
        // packet: an RC or UC QP sends to one).
        let mut gso_dst: Option<(SocketAddr, bool)> = None;
        loop {
            if tx.is_full() {
                counters.tx_errors += tx.send(fd) as u64;
            }
            let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
            mem.deferring = zero_copy;
            mem.pieces.clear();
            let mut ctx = Ctx { now, mrs, mem, srq };
            let t = slot.qp.poll_transmit(&mut ctx, tx.slot());
            mem.deferring = false;
            let Some(t) = t else {
                break;
            };
            let dst = SocketAddr::new(Gid(t.dest.dgid).ip(), t.dest.udp_dport);
            // The QP names the rxe-style entropy source port, but the socket sends from its
            // bound port, and the ICRC must cover what goes on the wire.
            let Some(encap) = self.encap_to(dst, self.local.port()) else {
                counters.tx_errors += 1;
                continue;
            };
            // A bare ACK is the short tail of a GSO message only where `QpSlot::ack_tail`
            // says so; otherwise it goes as its own datagram.
            let bare_ack = tx.slot()[0] == srdma_wire::Opcode::RcAcknowledge as u8;
            let dst_gso = match gso_dst {
                Some((d, g)) if d == dst => g,
                _ => {
                    let g = self.gso_for(paths, dst);
                    gso_dst = Some((dst, g));
                    g
                }
            };
            let gso = dst_gso && (ack_tail || !bare_ack);
            if !mem.pieces.is_empty() {
                match commit_zero_copy(tx, mem, tx_icrc, &encap, t.len, dst, gso) {
                    ZeroCopy::Queued => {
                        counters.tx_datagrams += 1;
                        continue;
                    }
                    ZeroCopy::Copied => {}
                    ZeroCopy::Failed => {
                        // Never send a packet whose payload is not all there.
                        counters.tx_errors += 1;
                        continue;
                    }
                }
            }
            let pkt = &mut tx.slot()[..t.len];
            if Packet::new_unchecked(&mut *pkt)
                .fill_icrc_with_memo(&encap, tx_icrc)
                .is_err()
            {
                counters.tx_errors += 1;
                continue;
            }
            if let Some(w) = capture.as_mut() {
                let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &encap, pkt);
            }
            tx.commit(t.len, dst, gso);
            counters.tx_datagrams += 1;
        }
        if tx.len() > 0 {
            counters.tx_errors += tx.send(fd) as u64;
        }
        counters.tx_gso_messages = tx.gso_messages;
        deliver_completions(slot);
        note_timer(&mut st.next_timer, slot);
        self.probe_answered(st, qpn, now);
    }

    /// Whether datagrams to `dst` may go as GSO messages.
    pub(crate) fn gso_for(
        &self,
        paths: &std::collections::HashMap<std::net::IpAddr, PathGso>,
        dst: SocketAddr,
    ) -> bool {
        match self.cfg.gso {
            Gso::Never => false,
            Gso::Always => true,
            Gso::Local => self.uncut(dst),
            Gso::Auto => self.uncut(dst) || paths.get(&dst.ip()) == Some(&PathGso::Verified),
        }
    }

    /// True when a GSO message to `dst` is never cut with IPv4 IDs that matter: IPv6 has
    /// none, and this host's addresses are reached over loopback, which does not cut.
    fn uncut(&self, dst: SocketAddr) -> bool {
        dst.is_ipv6() || dst.ip().is_loopback() || dst.ip() == self.local.ip()
    }

    /// The GSO path probe (`Gso::Auto`): when QP `qpn` is an idle RC QP in RTS and the path
    /// to its peer (an IPv4 address off this host) is not known yet, sends two copies of a
    /// duplicate request (`Qp::gso_probe`) as one GSO message. The peer answers each copy
    /// that reaches its transport intact with an ACK: two mean cut datagrams are accepted
    /// ([`PathGso::Verified`]); one, with the QP still idle, means the second datagram of
    /// the cut message was rejected (its ICRC did not match the IPv4 ID it arrived with):
    /// the path is refused and gets one datagram per send. Lost or muddled probes are
    /// tried again, [`PROBE_TRIES`] times in all. Until verified, one datagram per send; the
    /// probe leaves ahead of a QP's first message to the peer, or its first answer.
    fn probe_path(&self, st: &mut State, qpn: u32, now: Duration) {
        if self.cfg.gso != Gso::Auto {
            return;
        }
        let State {
            qps,
            tx,
            paths,
            probing,
            counters,
            next_timer,
            capture,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        // Only once the peer can answer: it sent us something, or the application has a
        // message for it (not at the move to RTS, which may come before the peer's to RTR).
        let a = slot.qp.attr();
        if slot.qp.state() != srdma_proto::QpState::Rts
            || slot.qp.qp_type() != srdma_proto::QpType::Rc
            || !(slot.qp.has_requests_ready() || slot.qp.counters().rcvd_pkts > 0)
        {
            return;
        }
        let dst = SocketAddr::new(Gid(a.ah_attr.dgid).ip(), a.ah_attr.udp_dport);
        if self.uncut(dst) {
            return;
        }
        let ns = now.as_nanos() as u64;
        let entry = paths.entry(dst.ip()).or_insert(PathGso::Unknown {
            tries: 0,
            ones: 0,
            next_try: 0,
        });
        let PathGso::Unknown {
            tries,
            ones,
            next_try,
        } = *entry
        else {
            return;
        };
        if ns < next_try {
            return;
        }
        let Some(encap) = self.encap_to(dst, self.local.port()) else {
            return;
        };
        let (acks, psns) = (slot.qp.unproductive_acks(), slot.qp.psn_state());
        let fd = self.socket.as_raw_fd();
        if tx.len() > 0 {
            counters.tx_errors += tx.send(fd) as u64;
        }
        for _ in 0..2 {
            let Some(t) = slot.qp.gso_probe(tx.slot()) else {
                break;
            };
            let pkt = &mut tx.slot()[..t.len];
            if Packet::new_unchecked(&mut *pkt).fill_icrc(&encap).is_err() {
                break;
            }
            if let Some(w) = capture.as_mut() {
                let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &encap, pkt);
            }
            tx.commit(t.len, dst, true);
        }
        if tx.len() != 2 {
            // Not idle after all (or no room): nothing sent, try at a later flush.
            tx.discard();
            return;
        }
        counters.tx_datagrams += 2;
        counters.tx_errors += tx.send(fd) as u64;
        counters.tx_gso_messages = tx.gso_messages;
        let deadline = ns + PROBE_WAIT.as_nanos() as u64;
        *entry = PathGso::Probing {
            qpn,
            acks,
            psns,
            deadline,
            tries,
            ones,
        };
        *probing += 1;
        *next_timer = (*next_timer).min(deadline);
    }

    /// After QP `qpn` handled what arrived: a probe it sent that both ACKs answered
    /// verifies its path; at the probe's deadline ([`Shared::run_timers`]) the answers so
    /// far decide.
    fn probe_answered(&self, st: &mut State, qpn: u32, now: Duration) {
        if st.probing == 0 {
            return;
        }
        let ns = now.as_nanos() as u64;
        for path in st.paths.values_mut() {
            let PathGso::Probing {
                qpn: q,
                acks,
                psns,
                deadline,
                tries,
                ones,
            } = *path
            else {
                continue;
            };
            if q != qpn && ns < deadline {
                continue;
            }
            let (got, idle) = st.qps.get(&q).map_or((0, false), |s| {
                (
                    s.qp.unproductive_acks().saturating_sub(acks),
                    s.qp.psn_state() == psns,
                )
            });
            let Some(v) = probe_verdict(got, idle, ns >= deadline, tries, ones) else {
                continue;
            };
            st.probing -= 1;
            *path = match v {
                PathGso::Unknown { tries, ones, .. } => PathGso::Unknown {
                    tries,
                    ones,
                    next_try: ns + PROBE_WAIT.as_nanos() as u64,
                },
                v => v,
            };
            match *path {
                PathGso::Verified => st.counters.gso_paths_verified += 1,
                PathGso::Refused => st.counters.gso_paths_refused += 1,
                _ => {}
            }
        }
    }

    /// Registers a CQ whose hook [`Shared::run_hooks`] runs.
    pub(crate) fn add_hooked(&self, cq: std::sync::Weak<crate::cq::CqInner>) {
        self.hooked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(cq);
    }

    /// Runs the hooks of the CQs that got completions, outside the device lock (the hooks
    /// take it): called by whoever received, right after releasing the lock.
    pub(crate) fn run_hooks(&self) {
        thread_local! {
            /// This thread runs a hook: a hook that drives the device (reading an MR does)
            /// must not run hooks again; they run when it returns or on the next pass.
            static IN_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        if !self.hooks_due.load(Ordering::Acquire) || IN_HOOK.with(std::cell::Cell::get) {
            return;
        }
        struct Running;
        impl Drop for Running {
            fn drop(&mut self) {
                IN_HOOK.with(|f| f.set(false));
            }
        }
        IN_HOOK.with(|f| f.set(true));
        let _running = Running;
        // Again while completions came in meanwhile (another thread's receive pass may have
        // found the hooks running here and left them to us).
        while self.hooks_due.swap(false, Ordering::AcqRel) {
            self.run_due_hooks();
        }
    }

    fn run_due_hooks(&self) {
        let cqs = self
            .hooked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut gone = false;
        for cq in &cqs {
            gone |= !crate::cq::Cq::run_hook(cq);
        }
        if gone {
            self.hooked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|w| w.strong_count() > 0);
        }
    }

    /// Called from an application's CQ poll: drives the device from the caller's thread if no
    /// one else is (the progress thread keeps out while polls keep coming).
    /// `polling`: the caller keeps polling (the thread stands aside for a grace period).
    /// Sends `ev` to the device's event handler, if it has one.
    pub(crate) fn raise(&self, ev: crate::AsyncEvent) {
        let h = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(h) = h {
            h(ev);
        }
    }

    /// The progress thread died: the device is dead. Every QP goes to ERR with its work
    /// flushed (error completions, so no waiter hangs), then `DeviceFatal`; later calls fail.
    pub(crate) fn fail(&self) {
        self.fatal.store(true, Ordering::Release);
        let mut st = self.lock();
        for slot in st.qps.values_mut() {
            slot.qp.set_error();
            deliver_completions(slot);
        }
        drop(st);
        self.run_hooks();
        self.raise(crate::AsyncEvent::DeviceFatal);
    }

    pub(crate) fn drive_from_app(&self, polling: bool) {
        if self.fatal.load(Ordering::Acquire) {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let until = now + APP_GRACE.as_nanos() as u64;
        if polling && self.app_active_until.load(Ordering::Relaxed) < until {
            self.app_active_until.store(until, Ordering::Relaxed);
        }
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        if polling {
            self.flush_deferred_polled(&mut st, now);
        } else {
            self.flush_deferred(&mut st);
        }
        // A last look before sleeping (`!polling`: the CQ is armed) holds nothing back:
        // no post or poll would follow to send it, and it always looks.
        let drained = std::mem::take(&mut st.drained_at);
        if !polling || now >= drained + RX_REST.as_nanos() as u64 {
            self.receive(
                &mut st,
                RX_BUDGET,
                if polling { Hold::All } else { Hold::Nothing },
            );
        }
        if now >= st.next_timer {
            self.run_timers(&mut st);
        }
        let mut pending = None;
        if now >= st.stats_next {
            st.stats_next = now + STATS_EVERY.as_nanos() as u64;
            pending = publish_stats(&mut st);
        }
        let held = !st.deferred.is_empty();
        drop(st);
        // Held-back ACKs leave with the application's next post or poll; should it make
        // neither, the progress thread sends them once the polling grace is over, or when
        // their window ends. If that thread sleeps in `poll` (not standing aside) past the
        // window, nothing would wake it before the peer's retransmission timer fires: wake
        // it (and only then: a wake-up on every poll that holds an ACK takes a core from a
        // spinning application on a small machine).
        let window_end = now + ACK_RIDE_WINDOW.as_nanos() as u64;
        if held && self.sleep_until.load(Ordering::Acquire) > window_end {
            sys::signal(&self.wake);
        }
        self.run_hooks();
        if let Some(p) = pending {
            p.commit();
        }
    }

    /// The application stops polling (it armed a CQ to sleep on its channel): the progress
    /// thread takes over at once, unless the application waits in `get_event` (now, or
    /// within the grace period: it is coming back to it), watching the socket itself.
    pub(crate) fn app_sleeps(&self) {
        let now = self.now().as_nanos() as u64;
        if self.app_active_until.swap(0, Ordering::Relaxed) > now && !self.app_watches(now) {
            sys::signal(&self.wake);
        }
    }

    /// True while an application thread waits in [`Shared::wait_with_socket`] or woke from
    /// it less than [`APP_GRACE`] ago.
    fn app_watches(&self, now: u64) -> bool {
        let woke = self.wait_woke_at.load(Ordering::SeqCst);
        self.app_waiters.load(Ordering::SeqCst) > 0
            || (woke != 0 && now < woke + APP_GRACE.as_nanos() as u64)
    }

    /// Sleeps until `fd` (a completion channel's) or the device's socket (or a multicast
    /// group's) is readable or `timeout` passes; a readable socket is received from on this
    /// thread, which delivers the completions (and channel events) they bring. Returns which
    /// of the two were readable (neither: timeout, or a signal).
    ///
    /// This is what takes the progress thread out of an event-driven application's round
    /// trip: the datagram wakes the application's thread directly, as a blocking `recv`
    /// would, instead of waking the progress thread, which then wakes the application.
    pub(crate) fn wait_with_socket(
        &self,
        fd: std::os::fd::RawFd,
        timeout: Option<Duration>,
    ) -> std::io::Result<[bool; 2]> {
        if self.fatal.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire) {
            return sys::poll_readable([fd], timeout).map(|r| [r[0], false]);
        }
        self.app_waiters.fetch_add(1, Ordering::SeqCst);
        let groups = self.groups_fd.load(Ordering::SeqCst);
        let r = sys::poll_readable([fd, self.socket.as_raw_fd(), groups], timeout)
            .map(|[c, s, g]| [c, s || g]);
        self.app_waiters.fetch_sub(1, Ordering::SeqCst);
        let now = self.now().as_nanos() as u64;
        self.wait_woke_at.store(now.max(1), Ordering::SeqCst);
        // The progress thread went to sleep trusting us with the socket (see `progress`):
        // from now on it must watch it again unless we come back within the grace period.
        if self.sleeps_deep.load(Ordering::SeqCst) {
            sys::signal(&self.wake);
        }
        let ready = r?;
        if ready[1] {
            let mut st = self.lock();
            self.flush_deferred(&mut st);
            self.receive(&mut st, RX_BUDGET, Hold::Nothing);
            if now >= st.next_timer {
                self.run_timers(&mut st);
            }
            drop(st);
            self.run_hooks();
        }
        Ok(ready)
    }

    /// What an application's poll sends of what earlier application-driven receives held
    /// back: everything, except the ACKs of a QP whose application posts a send right after
    /// replenishing its receives (`QpSlot::ack_rides_send`), for [`ACK_RIDE_WINDOW`]: they
    /// leave with that send (a SEND ping-pong that polls its send queue in between).
    fn flush_deferred_polled(&self, st: &mut State, now: u64) {
        if st.deferred.is_empty() {
            return;
        }
        let mut deferred = std::mem::take(&mut st.deferred);
        deferred.retain(|&qpn| {
            let Some(slot) = st.qps.get_mut(&qpn) else {
                return false;
            };
            if slot.ack_rides_send >= ACK_RIDES_AFTER && now < slot.hold_ends() {
                return true;
            }
            slot.ack_flushed_at = now.max(1);
            self.flush(st, qpn);
            false
        });
        st.deferred = deferred;
    }

    /// The progress thread's part of what receives held back: packets wait for their
    /// application's next post or poll until [`ACK_RIDE_WINDOW`] after they were held
    /// (sent earlier, an ACK would reach the peer alone: see [`Hold::Riding`]); those that
    /// waited that long leave now, and their QP's application, which neither posted nor
    /// polled in time, is no longer waited for (`QpSlot::ack_rides_send`).
    fn flush_deferred_expired(&self, st: &mut State) {
        if st.deferred.is_empty() {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let mut deferred = std::mem::take(&mut st.deferred);
        deferred.retain(|&qpn| {
            let Some(slot) = st.qps.get_mut(&qpn) else {
                return false;
            };
            if now < slot.hold_ends() {
                return true;
            }
            slot.ack_rides_send = 0;
            self.flush(st, qpn);
            false
        });
        st.deferred = deferred;
    }

    /// When the first window of the held-back ACKs ends (ns since the epoch).
    fn ride_ends(&self, st: &State) -> Option<u64> {
        st.deferred
            .iter()
            .filter_map(|q| st.qps.get(q))
            .map(QpSlot::hold_ends)
            .min()
    }

    /// Sends what earlier application-driven receives held back.
    pub(crate) fn flush_deferred(&self, st: &mut State) {
        let mut deferred = std::mem::take(&mut st.deferred);
        for qpn in deferred.drain(..) {
            self.flush(st, qpn);
        }
        st.deferred = deferred;
    }

    /// Receives and handles up to `budget` batches of datagrams, flushing every QP they
    /// touched, except that `hold` may have a QP complete its work now but hold its packets
    /// back (see `State::deferred`); returns true when the budget ran out with more waiting.
    pub(crate) fn receive(&self, st: &mut State, budget: usize, hold: Hold) -> bool {
        let Some(mut rx) = st.rx.take() else {
            return false;
        };
        let fd = self.socket.as_raw_fd();
        let mut more = false;
        if self.cm_forwarded.load(Ordering::Relaxed) {
            self.receive_forwarded(st);
        }
        if !st.groups.is_empty() {
            self.receive_groups(st);
        }
        for _ in 0..budget {
            let n = rx.recv(fd).unwrap_or(0);
            if n == 0 {
                break;
            }
            let now = self.now();
            for i in 0..n {
                match rx.get(i) {
                    // An empty datagram is one (malformed) packet too.
                    Some((data, from, _)) if data.is_empty() => {
                        self.handle_datagram(st, now, from, data, 0);
                    }
                    Some((data, from, seg)) => {
                        if seg < data.len() {
                            st.counters.rx_gro_buffers += 1;
                        }
                        for (j, pkt) in data.chunks(seg.max(1)).enumerate() {
                            self.handle_datagram(st, now, from, pkt, j as u16);
                        }
                    }
                    None => st.counters.rx_malformed += 1,
                }
            }
            let mut touched = std::mem::take(&mut st.touched);
            for qpn in touched.drain(..) {
                // Requests (a window the ACKs just opened) go now; only ACKs and responses
                // wait for the application's reply.
                let held = st.qps.get(&qpn).is_some_and(|s| {
                    !s.qp.has_requests_ready()
                        && match hold {
                            Hold::Nothing => false,
                            Hold::All => true,
                            Hold::Riding => s.ack_rides_send >= ACK_RIDES_AFTER,
                        }
                });
                if !held {
                    self.flush(st, qpn);
                } else if let Some(slot) = st.qps.get_mut(&qpn) {
                    deliver_completions(slot);
                    note_timer(&mut st.next_timer, slot);
                    if !st.deferred.contains(&qpn) {
                        slot.deferred_at = now.as_nanos() as u64;
                        st.deferred.push(qpn);
                    }
                }
            }
            st.touched = touched;
            more = n == RX_BATCH;
            if !more {
                st.drained_at = now.as_nanos() as u64;
                break;
            }
        }
        st.rx = Some(rx);
        more
    }

    /// Handles the QP1 datagrams the port keeper forwarded (see `portshare`), as if the socket
    /// had received them.
    fn receive_forwarded(&self, st: &mut State) {
        let Some(conn) = self._keeper.as_ref() else {
            return;
        };
        let mut buf = std::mem::take(&mut st.fwd_buf);
        buf.resize(crate::portshare::FWD_HDR + 65536, 0);
        while let Some((from, n)) = crate::portshare::recv_forwarded(conn, &mut buf) {
            self.handle_datagram(st, self.now(), from, &buf[..n], 0);
        }
        let mut touched = std::mem::take(&mut st.touched);
        for qpn in touched.drain(..) {
            self.flush(st, qpn);
        }
        st.touched = touched;
        st.fwd_buf = buf;
    }

    /// Handles what the sockets of the multicast groups received: at most [`GROUP_BUDGET`]
    /// datagrams per group and pass, so that a flood cannot starve the rest.
    fn receive_groups(&self, st: &mut State) {
        let mut buf = std::mem::take(&mut st.group_buf);
        buf.resize(crate::udp::RX_BUF, 0);
        let mut now = None;
        for i in 0..st.groups.len() {
            let to = st.groups[i].ip;
            for _ in 0..GROUP_BUDGET {
                let Ok((n, from)) = st.groups[i].socket.recv_from(&mut buf) else {
                    break;
                };
                let now = *now.get_or_insert_with(|| self.now());
                self.handle_datagram_to(st, now, from, to, &buf[..n], 0);
            }
        }
        let mut touched = std::mem::take(&mut st.touched);
        for qpn in touched.drain(..) {
            self.flush(st, qpn);
        }
        st.touched = touched;
        st.group_buf = buf;
    }

    /// Handles one datagram the device's socket received; `now` is when its receive batch
    /// arrived (one clock read per batch, not per packet); `place`: its place in its GRO
    /// buffer.
    pub(crate) fn handle_datagram(
        &self,
        st: &mut State,
        now: Duration,
        from: SocketAddr,
        data: &[u8],
        place: u16,
    ) {
        self.handle_datagram_to(st, now, from, self.local.ip(), data, place);
    }

    /// Handles one datagram sent to address `to` (the device's, or a multicast group's).
    #[inline]
    fn handle_datagram_to(
        &self,
        st: &mut State,
        now: Duration,
        from: SocketAddr,
        to: IpAddr,
        data: &[u8],
        place: u16,
    ) {
        st.counters.rx_datagrams += 1;
        let Some(encap) = self.encap_between(from, to) else {
            st.counters.rx_malformed += 1;
            return;
        };
        // IPv6: every covered field is known. IPv4: the ID is not (a UDP socket cannot see
        // it); one pass solves for it — srdma peers send 0 (or 0, 1, 2, … across a GSO run,
        // which reaches us uncut over veth: the place in the GRO buffer is the likely ID),
        // rxe and NICs others.
        let ident = match encap.ip {
            IpRepr::V4(_) => {
                srdma_wire::icrc::verify_ipv4_ident_guess(&encap, data, place, &mut st.rx_icrc).ok()
            }
            IpRepr::V6(_) => srdma_wire::icrc::verify_with_memo(&encap, data, &mut st.rx_icrc)
                .ok()
                .map(|()| 0),
        };
        if let Some(w) = st.capture.as_mut() {
            // Captured with the Identification the datagram carried, so its ICRC checks.
            let mut e = encap;
            if let (IpRepr::V4(h), Some(id)) = (&mut e.ip, ident) {
                h.ident = id;
            }
            let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &e, data);
        }
        // rxe's order: the structure first (length, version, opcode, headers), the ICRC last.
        // One parse serves both: the repr is used only once the ICRC has verified.
        let Ok(repr) = PacketRepr::parse_bytes(data) else {
            st.counters.rx_malformed += 1;
            return;
        };
        let verified = match ident {
            Some(0) => true,
            Some(_) => {
                st.counters.rx_icrc_ident_solved += 1;
                true
            }
            None => false,
        };
        if !verified {
            st.counters.rx_bad_icrc += 1;
            return;
        }
        if repr.bth.opcode == srdma_wire::Opcode::Cnp {
            st.counters.rx_cnp += 1;
            return;
        }
        if matches!(
            repr.bth.opcode.kind(),
            Kind::ReadRequest | Kind::CompareSwap | Kind::FetchAdd
        ) {
            // Several in one receive batch (one clock reading): a stream, not a ping-pong.
            let t = now.as_nanos() as u64;
            st.one_sided_lone = st.one_sided_at != t;
            st.one_sided_at = t;
        }
        let qpn = repr.bth.dest_qpn.value();
        if qpn == srdma_wire::Qpn::MULTICAST.value() {
            self.deliver_to_group(st, now, from, to, &repr, encap);
            return;
        }
        let State {
            mrs,
            mem,
            qps,
            srqs,
            xrc,
            counters,
            touched,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            counters.rx_unknown_qp += 1;
            return;
        };
        // rxe check_addr: a connected QP only takes packets from its peer's address.
        if slot.qp.qp_type() != srdma_proto::QpType::Ud
            && Gid(slot.qp.attr().ah_attr.dgid).ip() != from.ip()
        {
            counters.rx_bad_source += 1;
            return;
        }
        // An XRC target receives with the SRQ its request names.
        let xrc_srq = xrc.route(qpn, &mut slot.qp, repr.xrceth);
        let srq = match &xrc_srq {
            Some(found) => found.as_ref().and_then(|(id, _)| srqs.get_mut(id)),
            None => slot.srq.and_then(|id| srqs.get_mut(&id)),
        };
        let mut ctx = Ctx { now, mrs, mem, srq };
        let silent = slot.qp.silent_writes();
        slot.qp.handle_packet(&mut ctx, &repr, &RecvMeta { encap });
        if let Some(Some((_, cq))) = &xrc_srq {
            crate::qp::xrc::complete_to(&mut slot.qp, cq);
        }
        if slot.qp.silent_writes() != silent {
            let until = now + SILENT_WRITES_HOLD;
            self.silent_writes_until
                .store(until.as_nanos() as u64, Ordering::Relaxed);
        }
        if !touched.contains(&qpn) {
            touched.push(qpn);
        }
    }

    /// A datagram to the multicast QPN: a copy for every QP attached to the group it was
    /// sent to (rxe_rcv_mcast_pkt; each QP's type, state and Q_Key checks apply), except
    /// the QP that sent it from this device (rxe does not loop a QP's multicast back to
    /// it). A group this device has not joined (or a datagram to the device's own address)
    /// reaches no QP.
    fn deliver_to_group(
        &self,
        st: &mut State,
        now: Duration,
        from: SocketAddr,
        to: IpAddr,
        repr: &PacketRepr<'_>,
        encap: Encap,
    ) {
        let State {
            mrs,
            mem,
            qps,
            srqs,
            counters,
            touched,
            groups,
            ..
        } = st;
        let Some(g) = groups.iter().find(|g| g.ip == to) else {
            counters.rx_unknown_qp += 1;
            return;
        };
        let sender = repr
            .deth
            .filter(|_| from == self.local)
            .map(|d| d.src_qpn.value());
        for &qpn in &g.qpns {
            if sender == Some(qpn) {
                continue;
            }
            let Some(slot) = qps.get_mut(&qpn) else {
                continue;
            };
            let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
            let mut ctx = Ctx { now, mrs, mem, srq };
            slot.qp.handle_packet(&mut ctx, repr, &RecvMeta { encap });
            if !touched.contains(&qpn) {
                touched.push(qpn);
            }
        }
    }

    /// Attaches UD QP `qpn` to IPv4 multicast group `group`, joining the group on the
    /// device's interface when it is the first of the device's QPs in it. Attaching twice
    /// is no error (rxe).
    pub(crate) fn attach_group(&self, st: &mut State, qpn: u32, group: Ipv4Addr) -> Result<()> {
        let IpAddr::V4(local) = self.local.ip() else {
            return Err(crate::Error::InvalidArgument(
                "multicast needs an IPv4 device".into(),
            ));
        };
        let ip = IpAddr::V4(group);
        if let Some(g) = st.groups.iter_mut().find(|g| g.ip == ip) {
            if !g.qpns.contains(&qpn) {
                if g.qpns.len() >= MAX_MCAST_QP_ATTACH as usize {
                    return Err(crate::Error::Exhausted(
                        "QPs attached to the multicast group",
                    ));
                }
                g.qpns.push(qpn);
            }
            return Ok(());
        }
        if st.groups.len() >= MAX_MCAST_GRP as usize {
            return Err(crate::Error::Exhausted("multicast groups"));
        }
        let socket = crate::udp::join_group(group, local, self.local.port())
            .map_err(io_err(format!("joining multicast group {ip}")))?;
        let ep = match self.groups_ep.get() {
            Some(ep) => ep,
            None => {
                let ep = sys::epoll().map_err(io_err("epoll_create1"))?;
                self.groups_ep.get_or_init(|| ep)
            }
        };
        sys::epoll_add(ep, socket.as_raw_fd()).map_err(io_err("epoll_ctl"))?;
        st.groups.push(Group {
            ip,
            socket,
            qpns: vec![qpn],
        });
        self.groups_fd.store(ep.as_raw_fd(), Ordering::SeqCst);
        // The progress thread may be asleep in a poll that does not watch the groups yet.
        sys::signal(&self.wake);
        Ok(())
    }

    /// Detaches QP `qpn` from group `ip` (every group: `None`), leaving a group no QP of the
    /// device is attached to any more. Returns whether it was attached.
    pub(crate) fn detach_group(&self, st: &mut State, qpn: u32, ip: Option<IpAddr>) -> bool {
        let mut found = false;
        st.groups.retain_mut(|g| {
            if ip.is_none_or(|ip| ip == g.ip) {
                let before = g.qpns.len();
                g.qpns.retain(|&q| q != qpn);
                found |= g.qpns.len() != before;
            }
            // Closing the socket leaves the group (and the epoll set).
            !g.qpns.is_empty()
        });
        if st.groups.is_empty() {
            self.groups_fd.store(-1, Ordering::SeqCst);
        }
        found
    }

    /// Whether QP `qpn` is attached to some multicast group.
    pub(crate) fn in_group(st: &State, qpn: u32) -> bool {
        st.groups.iter().any(|g| g.qpns.contains(&qpn))
    }

    /// The RoCEv2 encapsulation of a datagram from `from` to `to` on the device's port.
    pub(crate) fn encap_between(&self, from: SocketAddr, to: IpAddr) -> Option<Encap> {
        let ip = IpRepr::between(from.ip(), to).ok()?;
        Some(Encap {
            ip,
            src_port: from.port(),
            dst_port: self.local.port(),
        })
    }

    /// Runs due timers; returns the time until the next one (also kept in `next_timer`).
    pub(crate) fn run_timers(&self, st: &mut State) -> Option<Duration> {
        let now = self.now();
        let mut due = std::mem::take(&mut st.due);
        due.clear();
        let mut next: Option<Duration> = None;
        for (&qpn, slot) in &st.qps {
            if let Some(t) = slot.qp.poll_timeout() {
                if t <= now {
                    due.push(qpn);
                } else {
                    next = Some(next.map_or(t - now, |n| n.min(t - now)));
                }
            }
        }
        for &qpn in &due {
            let State {
                mrs,
                mem,
                qps,
                srqs,
                ..
            } = &mut *st;
            if let Some(slot) = qps.get_mut(&qpn) {
                let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
                let mut ctx = Ctx { now, mrs, mem, srq };
                slot.qp.handle_timeout(&mut ctx);
            }
            self.flush(st, qpn);
            if let Some(t) = st.qps.get(&qpn).and_then(|s| s.qp.poll_timeout()) {
                let d = t.saturating_sub(now);
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        st.due = due;
        // Probes at their deadline decide; those still waiting keep the timer.
        self.probe_answered(st, u32::MAX, now);
        if st.probing > 0 {
            for p in st.paths.values() {
                if let PathGso::Probing { deadline, .. } = *p {
                    let d = Duration::from_nanos(deadline).saturating_sub(now);
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
        }
        st.next_timer = next.map_or(u64::MAX, |d| (now + d).as_nanos() as u64);
        next
    }
}

/// What became of a packet built with its payload left in registered memory.
enum ZeroCopy {
    /// Queued, sent from the pieces.
    Queued,
    /// The pieces were copied into the slot: send it as an ordinary packet.
    Copied,
    /// The payload could not be assembled: drop the packet (the transport retransmits).
    Failed,
}

/// Payloads up to this many bytes are copied into the packet rather than sent from the
/// registered memory (see `commit_zero_copy`).
const COPY_BELOW: usize = 512;

/// Most iovecs a packet is sent from without copying its payload (up to four pieces of
/// registered memory, more are copied into the slot); at most [`crate::udp::MAX_PARTS`].
const ZERO_COPY_PARTS: usize = 9;
const _: () = assert!(ZERO_COPY_PARTS <= crate::udp::MAX_PARTS);

/// Queues the packet in the current slot of `tx` — headers and pad there, payload pieces in
/// registered memory (noted by the store while the packet was built) — computing its ICRC
/// across the pieces. When it cannot go out that way (too many pieces), or the payload is
/// at most [`COPY_BELOW`] bytes, the pieces are copied into the slot instead.
fn commit_zero_copy(
    tx: &mut crate::udp::TxBatch,
    mem: &Store,
    memo: &mut srdma_wire::icrc::Memo,
    encap: &Encap,
    len: usize,
    dst: SocketAddr,
    gso: bool,
) -> ZeroCopy {
    const ICRC: usize = srdma_wire::icrc::ICRC_LEN;
    let slot = tx.slot();
    let base = slot.as_ptr() as usize;
    // A small payload is cheaper copied than sent as iovecs of its own (the kernel imports
    // and copies each piece separately).
    if mem.pieces.iter().map(|p| p.len).sum::<usize>() <= COPY_BELOW {
        return materialize(slot, base, mem);
    }
    // A piece and the headers or gap before it, and the tail: few enough for a small array
    // (one per packet: a `MAX_PARTS` array cost a 640-byte `memset` each, 1 % of a sender).
    let mut parts = [(std::ptr::null::<u8>(), 0usize); ZERO_COPY_PARTS];
    let mut n = 0;
    let fits = 2 * mem.pieces.len() < ZERO_COPY_PARTS && len >= srdma_wire::bth::BTH_LEN + ICRC;
    let hasher = fits
        .then(|| srdma_wire::icrc::Hasher::with_memo(encap, len - ICRC, &slot[..len], memo).ok())
        .flatten();
    let Some(mut h) = hasher else {
        return materialize(slot, base, mem);
    };
    let mut at = srdma_wire::bth::BTH_LEN;
    let mut gap = 0;
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        let src = mem.piece(p);
        let (Some(src), true) = (src, off >= at && off + p.len <= len - ICRC) else {
            return materialize(slot, base, mem);
        };
        h.update(&slot[at..off]);
        h.update(src);
        if off > gap {
            parts[n] = (slot[gap..].as_ptr(), off - gap);
            n += 1;
        }
        parts[n] = (src.as_ptr(), src.len());
        n += 1;
        at = off + p.len;
        gap = at;
    }
    h.update(&slot[at..len - ICRC]);
    slot[len - ICRC..len].copy_from_slice(&h.finish().to_le_bytes());
    parts[n] = (slot[gap..].as_ptr(), len - gap);
    n += 1;
    tx.commit_parts(len, dst, gso, parts[..n].iter().copied());
    ZeroCopy::Queued
}

/// Copies noted payload pieces into the packet buffer they stand for.
fn materialize(slot: &mut [u8], base: usize, mem: &Store) -> ZeroCopy {
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        match (mem.piece(p), slot.get_mut(off..off.saturating_add(p.len))) {
            (Some(src), Some(dst)) => dst.copy_from_slice(src),
            _ => return ZeroCopy::Failed,
        }
    }
    ZeroCopy::Copied
}

/// Unix time of the engine's epoch, so captures carry real timestamps.
fn capture_epoch() -> u64 {
    static EPOCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// The device's published statistics to refresh (at most once a second): the caller writes
/// them once it released the device's lock.
fn publish_stats(st: &mut State) -> Option<crate::stats::Pending> {
    st.stats.as_ref()?;
    let mut qp = srdma_proto::Counters::default();
    for s in st.qps.values() {
        qp += *s.qp.counters();
    }
    let dev = st.counters;
    st.stats.as_mut()?.maybe_write(&dev, &qp, Instant::now())
}

/// Keeps `next_timer` (the earliest timer an application's poll must run) at or before the
/// QP's timer, so a timer armed by a post or a packet fires while an application polls.
fn note_timer(next_timer: &mut u64, slot: &QpSlot) {
    if let Some(t) = slot.qp.poll_timeout() {
        *next_timer = (*next_timer).min(t.as_nanos() as u64);
    }
}

pub(crate) fn deliver_completions(slot: &mut QpSlot) {
    crate::qp::xrc::drop_orphans(&mut slot.qp);
    let mut overrun = false;
    while let Some((side, wc)) = slot.qp.poll_completion() {
        let solicited = wc.solicited;
        overrun |= !match side {
            CqSide::Send => slot.send_cq.push(wc, false),
            CqSide::Recv => slot.recv_cq.push(wc, solicited),
        };
    }
    if overrun {
        // As rxe: a QP whose completion found its CQ full goes to ERR; its flushed work
        // requests go where they can (an overrun CQ takes no more).
        slot.qp.set_error();
        while let Some((side, wc)) = slot.qp.poll_completion() {
            let _ = match side {
                CqSide::Send => slot.send_cq.push(wc, false),
                CqSide::Recv => slot.recv_cq.push(wc, false),
            };
        }
    }
    let state = slot.qp.state();
    if state == srdma_proto::QpState::Err && slot.state_seen != state {
        let qpn = slot.qp.qpn();
        slot.send_cq.raise(crate::AsyncEvent::QpFatal { qpn });
        if slot.srq.is_some() {
            slot.send_cq
                .raise(crate::AsyncEvent::QpLastWqeReached { qpn });
        }
    }
    slot.state_seen = state;
}

/// The progress thread: receive, dispatch, acknowledge, retransmit, complete — so one-sided
/// operations finish without the target application's help. Sleeps in `poll` when idle, and
/// keeps out of the way while an application's CQ polls drive the device.
fn progress(shared: &Shared) {
    let mut timeout = None;
    let mut look = FIRST_LOOK;
    while !shared.stop.load(Ordering::Acquire) {
        if shared.inject_failure.load(Ordering::Relaxed) {
            panic!("srdma: injected failure of the progress thread (Device::inject_failure)");
        }
        let now = shared.now().as_nanos() as u64;
        let active = shared.app_active_until.load(Ordering::Relaxed);
        let last_poll = active.saturating_sub(APP_GRACE.as_nanos() as u64);
        let looking = now < shared.silent_writes_until.load(Ordering::Relaxed);
        if now < active && (!looking || now.saturating_sub(last_poll) < POLL_GAP.as_nanos() as u64)
        {
            // Posts need not wake us meanwhile (0: "asleep until the past", so no timer is
            // earlier): the application's polls run the timers, and we run them on return.
            // Nothing tells us when the application stops polling: while it may wait on its
            // memory instead, look again soon (it may be polling only for a WRITE's
            // completion), then less and less often.
            shared.sleep_until.store(0, Ordering::Release);
            let rest = Duration::from_nanos(active - now);
            let _ = sys::poll_readable(
                [shared.wake.as_raw_fd()],
                Some(if looking { rest.min(look) } else { rest }),
            );
            look = (look * 2).min(APP_GRACE);
            sys::drain(&shared.wake);
            timeout = Some(Duration::ZERO);
            continue;
        }
        look = FIRST_LOOK;
        let keeper = match (&shared._keeper, shared.cm_forwarded.load(Ordering::Relaxed)) {
            (Some(k), true) => k.as_raw_fd(),
            _ => -1,
        };
        // An application thread waiting on its completion channel watches the socket (see
        // `Shared::wait_with_socket`): while one does, or woke less than the grace period
        // ago, leave the socket to it, looking again when the grace period ends; once it
        // has waited that long, sleep on timers alone and let it wake us when it wakes.
        let mut sock = shared.socket.as_raw_fd();
        let mut wait = timeout;
        let woke = shared.wait_woke_at.load(Ordering::SeqCst);
        let grace_end = woke + APP_GRACE.as_nanos() as u64;
        if woke != 0 && now < grace_end {
            sock = -1;
            let rest = Duration::from_nanos(grace_end - now);
            wait = Some(wait.map_or(rest, |t| t.min(rest)));
        } else if shared.app_waiters.load(Ordering::SeqCst) > 0 {
            shared.sleeps_deep.store(true, Ordering::SeqCst);
            // Checked again after saying so: a waiter that woke in between either is seen
            // here or sees `sleeps_deep` and wakes us.
            if shared.app_waiters.load(Ordering::SeqCst) > 0
                && shared.wait_woke_at.load(Ordering::SeqCst) == woke
            {
                sock = -1;
            } else {
                shared.sleeps_deep.store(false, Ordering::SeqCst);
            }
        }
        // The multicast groups' sockets are always watched here: an application thread
        // that went to sleep on its channel before an attach does not watch them.
        let groups = shared.groups_fd.load(Ordering::SeqCst);
        let fds = [sock, shared.wake.as_raw_fd(), keeper, groups];
        if sys::poll_readable(fds, wait).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        shared.sleeps_deep.store(false, Ordering::SeqCst);
        sys::drain(&shared.wake);
        let mut st = shared.lock();
        // Held-back packets the application left for this thread to send once their window
        // passed.
        shared.flush_deferred_expired(&mut st);
        let more = shared.receive(&mut st, RX_BUDGET, Hold::Riding);
        timeout = shared.run_timers(&mut st);
        // Come back for the held-back ACKs whose window ends first.
        if let Some(end) = shared.ride_ends(&st) {
            let rest = Duration::from_nanos(end.saturating_sub(shared.now().as_nanos() as u64));
            timeout = Some(timeout.map_or(rest, |t| t.min(rest)));
        }
        // More waiting, or a peer doing one-sided operations: look again without sleeping.
        let spin_until = st
            .one_sided_at
            .saturating_add(ONE_SIDED_SPIN.as_nanos() as u64);
        let spin = sock >= 0 && st.one_sided_lone && (shared.now().as_nanos() as u64) < spin_until;
        if more || spin {
            timeout = Some(Duration::ZERO);
        }
        // Published under the lock: a post that arms an earlier timer after this sees the
        // value and wakes the thread.
        let until = timeout.map_or(u64::MAX, |t| (shared.now() + t).as_nanos() as u64);
        shared.sleep_until.store(until, Ordering::Release);
        if let Some(w) = st.capture.as_mut() {
            let _ = w.flush();
        }
        let pending = publish_stats(&mut st);
        // A rate-limited refresh is pending: come back for it even if nothing else happens.
        if let Some(d) = st.stats.as_ref().and_then(|p| p.due_in(Instant::now())) {
            timeout = Some(timeout.map_or(d, |t| t.min(d)));
        }
        drop(st);
        shared.run_hooks();
        if let Some(p) = pending {
            p.commit();
        }
    }
}

/// Starts the engine of a device on its socket: the state, and the progress thread.
pub(crate) fn start(cfg: DeviceConfig, sock: crate::udp::Socket) -> Result<Arc<DeviceHandle>> {
    let crate::udp::Socket {
        socket,
        local,
        slot,
        keeper,
    } = sock;
    let capture = match &cfg.pcap {
        Some(p) => Some(
            pcap::Writer::new(BufWriter::new(
                File::create(p).map_err(io_err(format!("creating {}", p.display())))?,
            ))
            .map_err(io_err("writing the pcap header"))?,
        ),
        None => None,
    };
    let state = State {
        mrs: MrTable::new(crate::random::random_u64()),
        mem: Store::default(),
        qps: BTreeMap::new(),
        srqs: BTreeMap::new(),
        xrc: Default::default(),
        // rxe numbers QPs from 17 (0x11); 0 and 1 are the special QPs. A shared port's
        // slot k owns k << 16 | n.
        qpn_base: u32::from(slot) << 16,
        next_qpn: 0x11,
        next_id: 1,
        counters: DeviceCounters::default(),
        capture,
        tx: crate::udp::TxBatch::new(TX_BATCH, MAX_PACKET_LEN),
        // Slots large enough for a GRO run; a longer datagram is cut and fails to parse.
        rx: Some(crate::udp::RxBatch::new(RX_BATCH, crate::udp::RX_BUF)),
        touched: Vec::with_capacity(64),
        fwd_buf: Vec::new(),
        deferred: Vec::with_capacity(64),
        paths: std::collections::HashMap::new(),
        probing: 0,
        rx_icrc: Default::default(),
        tx_icrc: Default::default(),
        groups: Vec::new(),
        group_buf: Vec::new(),
        due: Vec::with_capacity(64),
        next_timer: u64::MAX,
        one_sided_at: 0,
        one_sided_lone: false,
        drained_at: 0,
        stats_next: 0,
        stats: crate::stats::Publisher::new(&cfg.name, local),
    };
    let shared = Arc::new(Shared {
        state: Mutex::new(state),
        socket,
        shared_port: keeper.is_some(),
        cm_forwarded: AtomicBool::new(false),
        _keeper: keeper,
        events: Mutex::new(None),
        fatal: AtomicBool::new(false),
        inject_failure: AtomicBool::new(false),
        local,
        wake: sys::eventfd().map_err(io_err("eventfd"))?,
        sleep_until: AtomicU64::new(u64::MAX),
        app_active_until: AtomicU64::new(0),
        silent_writes_until: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        epoch: Instant::now(),
        cfg,
        hooked: Mutex::new(Vec::new()),
        app_waiters: AtomicUsize::new(0),
        wait_woke_at: AtomicU64::new(0),
        sleeps_deep: AtomicBool::new(false),
        hooks_due: AtomicBool::new(false),
        groups_ep: std::sync::OnceLock::new(),
        groups_fd: AtomicI32::new(-1),
    });
    let s2 = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name(format!("srdma-{}", local))
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| progress(&s2));
            if std::panic::catch_unwind(run).is_err() {
                s2.fail();
            }
        })
        .map_err(io_err("starting the progress thread"))?;
    Ok(Arc::new(DeviceHandle {
        shared,
        thread: Mutex::new(Some(thread)),
    }))
}

#[cfg(test)]
mod tests {
    use super::{PROBE_TRIES, PathGso, probe_verdict};

    #[test]
    fn a_probe_verifies_on_two_answers_and_refuses_on_one_twice_running() {
        // Two answers verify at once, before the deadline too.
        assert_eq!(
            probe_verdict(2, false, false, 0, 0),
            Some(PathGso::Verified)
        );
        // Before the deadline, fewer wait.
        assert_eq!(probe_verdict(1, true, false, 0, 0), None);
        // One answer with the QP idle: once is not enough (a lossy path), twice refuses.
        let once = probe_verdict(1, true, true, 0, 0);
        assert!(matches!(
            once,
            Some(PathGso::Unknown {
                tries: 1,
                ones: 1,
                ..
            })
        ));
        assert_eq!(probe_verdict(1, true, true, 1, 1), Some(PathGso::Refused));
        // One answer while the QP was busy (the answer may have acknowledged something),
        // or none: inconclusive, and the run of single answers starts over.
        let busy = probe_verdict(1, false, true, 1, 1);
        assert!(matches!(
            busy,
            Some(PathGso::Unknown {
                tries: 2,
                ones: 0,
                ..
            })
        ));
        let none = probe_verdict(0, true, true, 0, 0);
        assert!(matches!(
            none,
            Some(PathGso::Unknown {
                tries: 1,
                ones: 0,
                ..
            })
        ));
        // A path that never answers is refused after the last try.
        assert_eq!(
            probe_verdict(0, true, true, PROBE_TRIES - 1, 0),
            Some(PathGso::Refused)
        );
    }
}
