//! The queue pair: one sans-IO state machine per QP, split like rxe into a requester (turns
//! send WQEs into request packets), a completer (turns responses into send completions, runs
//! the retransmission and RNR timers) and a responder (executes incoming requests, answers
//! with ACK/NAK, READ responses and atomic ACKs).
//!
//! The QP owns no memory, socket or clock. Each call gets a [`Ctx`] with the current time,
//! the device's memory-region table and the memory itself; packets come in through
//! [`Qp::handle_packet`] and go out through [`Qp::poll_transmit`]; [`Qp::poll_timeout`] says
//! when [`Qp::handle_timeout`] must be called; completions come out of
//! [`Qp::poll_completion`]. The same code is driven by the UDP engine, the simulator and the
//! tests.

mod completer;
mod requester;
mod responder;
mod selective;
mod xrc;

pub use crate::congestion::MAX_WINDOW_PSNS;
pub use xrc::XrcRole;

use std::collections::VecDeque;
use std::time::Duration;

use srdma_wire::{Encap, PacketRepr, Psn, Qpn, Transport};

use crate::counters::Counters;
use crate::limits::{DeviceLimits, QpCaps};
use crate::memory::Memory;
use crate::mr::{MrTable, PdId};
use crate::qp::{AttrMask, ModifyError, Mtu, QpAttr, QpState, QpType, validate_modify};
use crate::srq::Srq;
use crate::wc::{SendFlags, Wc, WcOpcode, WcStatus};
use crate::wr::{PostError, RecvWr, SendOp, SendWr};

/// The PSNs an RC requester keeps unacknowledged at first (rxe `RXE_MAX_UNACKED_PSNS`,
/// fixed there); the window grows toward a responder that keeps up, up to
/// [`MAX_WINDOW_PSNS`], and shrinks on congestion (see [`crate::congestion`]).
pub const MAX_UNACKED_PSNS: u32 = crate::congestion::INITIAL_WINDOW_PSNS;
/// The requester sets AckReq at least every this many packets (rxe `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKT_PER_ACK: u32 = 64;
/// The fewest response packets one RDMA READ request asks for when a long READ goes as
/// several (see [`read_segment`]).
pub const READ_SEGMENT_PSNS: u32 = 256;

/// How many response packets each RDMA READ request of a READ of `npkts` packets asks for,
/// on a QP with `max_rd_atomic` READs allowed in flight and a path that is a network
/// (`network`; not a same-host peer's ring).
///
/// A READ's responses are not flow-controlled: the responder sends all of them at once,
/// and a long one (a 64 MiB READ is 65,536 packets at MTU 1024) overruns the requester's
/// socket on any path slower than memory — over a veth, 64 MiB READs moved 214 MiB/s where
/// 1 MiB ones moved 1562, and with selective repeat they lost thousands of datagrams to a
/// full receive buffer and timed out. So a long READ goes as several READ requests, each for
/// a segment of its responses: consecutive PSNs, addresses and lengths, each a READ request
/// as any responder (rxe, a NIC) takes it, no more of them in flight than `max_rd_atomic`,
/// and each sent, as any request, once its first PSN is inside the congestion window — what
/// is in flight stays under the window plus one segment. Segments hold the whole window
/// between them (`MAX_WINDOW_PSNS / max_rd_atomic`), never fewer than
/// [`READ_SEGMENT_PSNS`]. Figures (network.sh, "Long READs"): benchmarks/README.md, "Long
/// READs over a network".
pub(crate) fn read_segment(npkts: u32, max_rd_atomic: u8, network: bool) -> u32 {
    if !network {
        return npkts.max(1);
    }
    let seg = (crate::congestion::MAX_WINDOW_PSNS / u32::from(max_rd_atomic.max(1)))
        .max(READ_SEGMENT_PSNS);
    seg.min(npkts.max(1))
}

/// Largest message (IBA: 2^31 bytes; rxe `RXE_PORT_MAX_MSG_SZ`).
pub const MAX_MSG_SIZE: u32 = 1 << 31;
/// Longest RoCEv2 packet srdma emits: the biggest header (BTH + RETH + ImmDt), a 4096-byte
/// payload and the ICRC. A transmit buffer of this size always suffices.
pub const MAX_PACKET_LEN: usize = 32 + 4096 + 4;

/// What one call needs from the device: the time, the memory-region table, the memory, and
/// the QP's shared receive queue if it has one.
pub struct Ctx<'a> {
    /// Current time, from any fixed origin (the engine's start, the simulator's clock).
    pub now: Duration,
    /// The device's memory regions and windows (binds and invalidations change them).
    pub mrs: &'a mut MrTable,
    /// The bytes behind them.
    pub mem: &'a mut dyn Memory,
    /// The shared receive queue this QP was created with, if any.
    pub srq: Option<&'a mut Srq>,
}

/// Where a packet from [`Qp::poll_transmit`] goes. The engine builds the IP/UDP headers from
/// it (and its own address), then fills the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// Destination GID (IPv4-mapped for IPv4).
    pub dgid: [u8; 16],
    /// UDP destination port (4791 unless configured otherwise).
    pub udp_dport: u16,
    /// UDP source port, derived from the QP pair as rxe does.
    pub udp_sport: u16,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

/// A packet ready in the caller's buffer: `buf[..len]`, ICRC bytes zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Packet length, ICRC included.
    pub len: usize,
    /// Where it goes.
    pub dest: Dest,
}

/// What the receiving engine knows about a packet beyond its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// The IP and UDP headers it arrived in (fills the GRH of UD receive buffers; the
    /// traffic class carries the ECN bits the packet arrived with).
    pub encap: Encap,
}

impl RecvMeta {
    /// Whether the packet arrived marked "congestion experienced" (ECN CE, both bits set).
    pub fn ecn_ce(&self) -> bool {
        let tc = match self.encap.ip {
            srdma_wire::IpRepr::V4(h) => h.tos,
            srdma_wire::IpRepr::V6(h) => h.traffic_class,
        };
        tc & 3 == 3
    }
}

/// Which completion queue a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqSide {
    /// The send CQ.
    Send,
    /// The receive CQ.
    Recv,
}

/// How an RC QP recovers lost packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reliability {
    /// The IBTA's: the responder NAKs the first missing PSN and drops what follows, the
    /// requester resends from there; retransmission on the QP's `timeout` alone. What rxe and
    /// RoCE NICs speak, and the default.
    #[default]
    GoBackN,
    /// srdma's, agreed by both ends at connection time (ECE): besides go-back-N, the
    /// requester also retransmits on its measured RTT, well before the IBTA timer, which
    /// still decides when retries are used up (`retry_cnt` × `timeout` keeps its meaning).
    SelectiveRepeat,
}

/// How a QP is created (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// QP number.
    pub qpn: Qpn,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// Queue capacities.
    pub caps: QpCaps,
    /// Every send WR generates a completion (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Receives come from a shared receive queue.
    pub uses_srq: bool,
    /// The port's active MTU: the largest UD payload.
    pub port_mtu: Mtu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WqeState {
    /// Posted; no PSN assigned yet.
    Posted,
    /// PSNs assigned, request packets being sent.
    Active,
    /// Every request packet sent; waiting for the ACK or response (RC).
    Pending,
}

#[derive(Debug)]
struct SendWqe {
    wr: SendWr,
    /// Message length.
    len: u32,
    state: WqeState,
    first_psn: Psn,
    last_psn: Psn,
    /// PSNs the message uses: packets for SEND/WRITE, response packets for READ, 1 for atomics.
    npkts: u32,
    /// Next request packet to send, as an index from `first_psn` (READ: the response packet
    /// index the next READ request starts at).
    next_pkt: u32,
    /// READ: bytes of response data placed so far.
    read_done: u32,
    /// READ: the response packets one READ request on the wire asks for at most (see
    /// [`READ_SEGMENT_PSNS`]); requests start at multiples of it from `first_psn`.
    read_seg: u32,
    /// Holds one of the `max_rd_atomic` slots.
    has_rd_atomic: bool,
    /// READ: further `max_rd_atomic` slots held, one per segment requested beyond the first
    /// that is still being answered.
    extra_reads: u32,
    /// A local error found while sending; reported when the WQE reaches the head.
    error: Option<WcStatus>,
}

impl SendWqe {
    /// The `max_rd_atomic` slots this WQE holds.
    fn rd_slots(&self) -> u32 {
        u32::from(self.has_rd_atomic) + self.extra_reads
    }

    fn wc_opcode(&self) -> WcOpcode {
        self.wr.op.wr_opcode().wc_opcode().unwrap_or(WcOpcode::Send)
    }
}

/// A multi-packet SEND or WRITE being received.
#[derive(Debug)]
enum Inbound {
    /// No message in progress.
    Idle,
    /// A SEND: the receive WQE it fills and the bytes placed so far.
    Send { wqe: RecvWr, placed: u32 },
    /// An RDMA WRITE: where it goes and the bytes still expected.
    Write {
        grant: Option<crate::mr::MrGrant>,
        placed: u64,
        remaining: u32,
        dma_len: u32,
    },
}

/// A responder resource (rxe `resp_res`): what a duplicate READ or atomic is answered from.
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read {
        first_psn: Psn,
        last_psn: Psn,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A response the responder still has to send.
#[derive(Debug, Clone, Copy)]
enum RespOut {
    /// ACKNOWLEDGE with this syndrome and PSN (MSN taken when sent).
    Ack {
        psn: Psn,
        syndrome: srdma_wire::Syndrome,
    },
    /// READ response packets `next..=last` of a READ of `len` bytes at `va`, starting at `first`.
    Read {
        first: Psn,
        next: Psn,
        last: Psn,
        va: u64,
        rkey: u32,
        len: u32,
    },
    /// ATOMIC ACKNOWLEDGE.
    Atomic { psn: Psn, orig: u64 },
    /// The positive ACK of one duplicate request: sent as it is, never merged with the ACKs
    /// around it (the requester may be counting them, see [`Qp::gso_probe`]).
    DupAck { psn: Psn },
    /// A congestion notification packet to the peer's QP: a request came marked CE.
    Cnp,
    /// Selective repeat: what the responder keeps ahead of the expected PSN (built when it
    /// leaves).
    Sack,
}

/// One queue pair.
#[derive(Debug)]
pub struct Qp {
    cfg: QpConfig,
    state: QpState,
    attr: QpAttr,
    counters: Counters,

    sq: VecDeque<SendWqe>,
    rq: VecDeque<RecvWr>,
    send_cq: VecDeque<Wc>,
    recv_cq: VecDeque<Wc>,

    // Requester.
    req_cursor: usize,
    req_psn: Psn,
    max_sent_psn: Psn,
    noack_pkts: u32,
    rd_atomic: u32,
    /// The congestion controller: the PSN window and the pacing rate.
    cc: crate::congestion::Controller,
    /// Pacing holds the next request back until then (see [`Qp::poll_timeout`]).
    pace_until: Option<Duration>,
    /// How often CE-marked packets are answered with a CNP.
    cnp_gate: crate::congestion::CnpGate,
    /// The rate of READ responses toward a go-back-N requester (see
    /// [`crate::congestion::responses`]).
    read_pace: crate::congestion::responses::ResponsePacer,
    /// That rate holds the READ response at the head of the responses back until then.
    read_pace_until: Option<Duration>,

    // Completer.
    comp_psn: Psn,
    retry_left: u8,
    rnr_retry_left: u8,
    retry_started_at: Option<Psn>,
    retrans_deadline: Option<Duration>,
    rnr_deadline: Option<Duration>,
    /// How the QP recovers losses: the IBTA's go-back-N, or selective repeat with an srdma
    /// peer that agreed to it.
    reliability: Reliability,
    /// Selective repeat: a retransmission on measured RTT, earlier than the IBTA timer,
    /// which it leaves alone (see [`Qp::set_reliability`]).
    rto_deadline: Option<Duration>,
    /// Early retransmissions in a row without progress: each doubles the next wait.
    rto_backoff: u32,
    /// Selective repeat: the tail loss probe's deadline (RFC 8985's PTO, two RTTs without
    /// an ACK), before the early retransmission.
    tlp_deadline: Option<Duration>,
    /// Selective repeat: the probe to send (the last PSN sent, again), once per stall.
    tlp_probe: Option<Psn>,
    /// The probe of this stall went (rearmed by progress).
    tlp_sent: bool,
    /// Selective repeat: the PSN at the head of `resend` that goes even if the window is
    /// full (a tail loss probe, or the oldest unacknowledged after an early timeout).
    probe_psn: Option<Psn>,
    /// The PSN the last probe carried, until a SACK reports it: the holes below it are lost
    /// then (on a path that keeps order, whatever was sent before the probe and was still
    /// on its way would have arrived before it).
    tlp_psn: Option<Psn>,
    /// Selective repeat, requester: what the responder reported it holds.
    scoreboard: selective::Scoreboard,
    /// Selective repeat, requester: PSNs to send again (holes the SACKs showed).
    resend: VecDeque<Psn>,
    /// Selective repeat, requester: the holes below this PSN are queued already.
    resend_upto: Psn,

    // Responder.
    epsn: Psn,
    /// One past the last SEND/WRITE packet executed: duplicates are re-ACKed with the PSN
    /// before it.
    ack_psn: Psn,
    msn: u32,
    /// RDMA WRITE messages executed without an immediate (see [`Qp::silent_writes`]).
    silent_writes: u64,
    nak_sent: bool,
    /// Selective repeat, responder: requests kept ahead of the expected PSN.
    reorder: selective::Reorder,
    uc_drop: bool,
    inbound: Inbound,
    resources: VecDeque<Resource>,
    resp_out: VecDeque<RespOut>,
    /// The lone positive ACK in `resp_out` let a request message go first (see
    /// [`Qp::poll_transmit`]), whose last packet went: it goes next.
    ack_yielded: bool,
    /// Request packets that went ahead of the lone positive ACK so far.
    ack_waited: u32,
    /// ACKs received that acknowledged nothing new (ghosts and stale ones).
    unproductive_acks: u64,
    /// XRC initiator or target (`xrc` module); `None` for every other QP.
    xrc: Option<XrcRole>,
}

impl Qp {
    /// Creates a QP in RESET.
    pub fn new(cfg: QpConfig, limits: &DeviceLimits) -> Result<Qp, crate::limits::CapsError> {
        cfg.caps.validate(limits, cfg.uses_srq)?;
        Ok(Qp::build(cfg))
    }

    fn build(cfg: QpConfig) -> Qp {
        // UD has no path MTU attribute: the port's MTU bounds its messages from the start
        // (a receive-only UD QP may stay in RTR).
        let path_mtu = match cfg.qp_type {
            QpType::Ud => cfg.port_mtu,
            _ => QpAttr::default().path_mtu,
        };
        let attr = QpAttr {
            qp_state: QpState::Reset,
            cap: cfg.caps,
            path_mtu,
            ..QpAttr::default()
        };
        Qp {
            cfg,
            state: QpState::Reset,
            attr,
            counters: Counters::default(),
            silent_writes: 0,
            sq: VecDeque::with_capacity(cfg.caps.max_send_wr as usize),
            rq: VecDeque::with_capacity(cfg.caps.max_recv_wr as usize),
            send_cq: VecDeque::with_capacity(cfg.caps.max_send_wr as usize),
            recv_cq: VecDeque::with_capacity(cfg.caps.max_recv_wr as usize),
            req_cursor: 0,
            req_psn: Psn::new(0),
            max_sent_psn: Psn::new(0),
            noack_pkts: 0,
            rd_atomic: 0,
            cc: crate::congestion::Controller::default(),
            pace_until: None,
            cnp_gate: crate::congestion::CnpGate::default(),
            read_pace: Default::default(),
            read_pace_until: None,
            comp_psn: Psn::new(0),
            retry_left: 0,
            rnr_retry_left: 0,
            retry_started_at: None,
            retrans_deadline: None,
            rnr_deadline: None,
            reliability: Reliability::GoBackN,
            rto_deadline: None,
            rto_backoff: 0,
            tlp_deadline: None,
            tlp_probe: None,
            probe_psn: None,
            tlp_sent: false,
            tlp_psn: None,
            scoreboard: selective::Scoreboard::default(),
            resend: VecDeque::new(),
            resend_upto: Psn::new(0),
            epsn: Psn::new(0),
            ack_psn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            reorder: selective::Reorder::default(),
            uc_drop: false,
            ack_yielded: false,
            ack_waited: 0,
            unproductive_acks: 0,
            xrc: None,
            inbound: Inbound::Idle,
            resources: VecDeque::new(),
            resp_out: VecDeque::new(),
        }
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.cfg.qpn
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.cfg.qp_type
    }

    /// Whether every send WR completes, signaled or not (`sq_sig_all`).
    pub fn signals_all(&self) -> bool {
        self.cfg.sq_sig_all
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Current attributes (`ibv_query_qp`).
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }

    /// True once when an SQD QP's drain ends: every message it had started is complete
    /// (`IBV_EVENT_SQ_DRAINED`; `ibv_query_qp`'s `sq_draining` is false from then on, and
    /// the QP may leave SQD for RTS). rxe raises the event whether or not the modify asked
    /// for it with `EN_SQD_ASYNC_NOTIFY`, and so does this.
    pub fn take_sq_drained(&mut self) -> bool {
        if self.attr.sq_draining
            && self.state == QpState::Sqd
            && self.sq.iter().all(|w| w.state == WqeState::Posted)
        {
            self.attr.sq_draining = false;
            true
        } else {
            false
        }
    }

    /// Statistics.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// How many RDMA WRITE messages without an immediate this QP executed as a responder:
    /// no completion tells the target application of them, it learns of them by reading its
    /// memory (perftest's `ib_write_lat` spins on the last byte), so an engine must place
    /// them without waiting for a poll.
    pub fn silent_writes(&self) -> u64 {
        self.silent_writes
    }

    /// The path to the responder holds a whole window of the largest size without loss (an
    /// engine on the same host reached through a shared-memory ring larger than
    /// [`MAX_WINDOW_PSNS`] packets): the PSN window opens that far at once instead of
    /// growing from rxe's 128 on evidence. A loss still closes it (see `window`).
    pub fn path_holds_window(&mut self) {
        self.cc.unlimited();
    }

    /// Chooses how the QP recovers losses: [`Reliability::SelectiveRepeat`] only with a peer
    /// that agreed to it (both ends must set it).
    pub fn set_reliability(&mut self, r: Reliability) {
        self.reliability = r;
        if r == Reliability::SelectiveRepeat {
            self.cc.selective_peer();
        }
    }

    /// How the QP recovers losses.
    pub fn reliability(&self) -> Reliability {
        self.reliability
    }

    /// Caps the QP's window at `psns` PSNs in flight (`u32::MAX`: no cap): an engine's fair
    /// share of a destination that many QPs send to (see `congestion::Controller::set_cap`).
    pub fn set_window_cap(&mut self, psns: u32) {
        self.cc.set_cap(psns);
    }

    /// Holds the QP at `psns` PSNs in flight (`None`: no hold), below any floor: an engine
    /// whose budget for the destination (shared by all its QPs there) is spent lets the QP
    /// resend what it has in flight ([`Qp::outstanding_psns`]) and send nothing new (see
    /// `congestion::Controller::set_hold`).
    pub fn hold_window(&mut self, psns: Option<u32>) {
        self.cc.set_hold(psns);
    }

    /// PSNs sent and not yet acknowledged (an RC requester's; 0 for the others).
    pub fn outstanding_psns(&self) -> u32 {
        if self.cfg.qp_type != QpType::Rc {
            return 0;
        }
        self.max_sent_psn.diff(self.comp_psn).max(0) as u32
    }

    /// Where the QP's congestion control stands (window, rate, RTT, what it reacted to).
    pub fn congestion(&self) -> crate::congestion::CcStats {
        crate::congestion::CcStats {
            read_rate: self.read_pace.rate(),
            read_cuts: self.read_pace.cuts(),
            ..self.cc.stats()
        }
    }

    /// Whether this QP's READ responses are paced when the requester asks for them again:
    /// an RC QP that recovers by go-back-N (toward rxe and NICs) on a network path. A
    /// selective-repeat requester's window covers the responses it asks for; a same-host
    /// path is memory.
    fn paces_reads(&self) -> bool {
        self.cfg.qp_type == QpType::Rc
            && self.reliability == Reliability::GoBackN
            && !self.cc.is_unlimited()
    }

    /// Send WQEs posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    /// Receive WQEs posted and not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }

    /// `ibv_modify_qp`: checks the transition and its attributes against the IBTA table, then
    /// applies them. Entering ERR flushes every outstanding WQE with `WR_FLUSH_ERR`; entering
    /// RESET discards everything.
    pub fn modify(
        &mut self,
        attr: &QpAttr,
        mask: AttrMask,
        limits: &DeviceLimits,
    ) -> Result<(), ModifyError> {
        let next = match self.xrc {
            Some(role) => xrc::validate_modify(role, self.state, attr, mask, limits)?,
            None => validate_modify(self.cfg.qp_type, self.state, attr, mask, limits)?,
        };
        crate::qp::check_sq_drain(self.state, attr, mask, self.attr.sq_draining)?;
        let prev = self.state;
        let a = &mut self.attr;
        macro_rules! take {
            ($($bit:ident => $field:ident),* $(,)?) => {
                $( if mask.contains(AttrMask::$bit) { a.$field = attr.$field; } )*
            };
        }
        take!(
            ACCESS_FLAGS => qp_access_flags,
            PKEY_INDEX => pkey_index,
            PORT => port_num,
            QKEY => qkey,
            AV => ah_attr,
            PATH_MTU => path_mtu,
            TIMEOUT => timeout,
            RETRY_CNT => retry_cnt,
            RNR_RETRY => rnr_retry,
            RQ_PSN => rq_psn,
            MAX_QP_RD_ATOMIC => max_rd_atomic,
            MIN_RNR_TIMER => min_rnr_timer,
            SQ_PSN => sq_psn,
            MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
            DEST_QPN => dest_qp_num,
        );
        if mask.contains(AttrMask::RQ_PSN) {
            self.epsn = attr.rq_psn;
            self.ack_psn = attr.rq_psn;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.req_psn = attr.sq_psn;
            self.comp_psn = attr.sq_psn;
            self.max_sent_psn = attr.sq_psn;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            self.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            self.rnr_retry_left = attr.rnr_retry;
        }
        self.state = next;
        self.attr.qp_state = next;
        self.attr.cur_qp_state = next;
        // RTS→SQD starts the drain: the messages in progress finish, no new one starts, and
        // [`Qp::take_sq_drained`] says when they are done (rxe's QP_STATE_DRAIN).
        self.attr.sq_draining =
            next == QpState::Sqd && (prev != QpState::Sqd || self.attr.sq_draining);
        match next {
            QpState::Reset if prev != QpState::Reset => self.reset(),
            QpState::Err if prev != QpState::Err => self.enter_error(false),
            _ => {}
        }
        Ok(())
    }

    /// Moves the QP to ERR outside `ibv_modify_qp` (the device's own decision, e.g. a CQ
    /// overrun or a device failure), flushing every outstanding WQE as modify would.
    pub fn set_error(&mut self) {
        if self.state != QpState::Err {
            self.enter_error(false);
        }
    }

    /// The engine could not place payload bytes of READ responses this QP accepted since
    /// its completions were last polled (they stayed in the responder's memory, which could
    /// not be read: its process went, or the region with it), as a NIC whose DMA read
    /// faults. Every READ that completed since then completes with `status` instead of
    /// success (or, when none did, the READ in progress at the head of the send queue), and
    /// the QP enters ERR, flushing the rest: no READ's bytes are reported placed that were
    /// not.
    pub fn fail_placement(&mut self, status: WcStatus) {
        let mut failed = false;
        for wc in self.send_cq.iter_mut() {
            if wc.opcode == WcOpcode::RdmaRead && wc.status.is_success() {
                wc.status = status;
                self.counters.send_err += 1;
                failed = true;
            }
        }
        let head_reads = self
            .sq
            .front()
            .is_some_and(|w| matches!(w.wr.op, SendOp::Read { .. }));
        if !failed && head_reads {
            if let Some(w) = self.sq.pop_front() {
                self.push_send_wc(send_wc(self.cfg.qpn, &w, status), true);
            }
        }
        self.set_error();
    }

    /// Back to the freshly created state: every queue emptied without completions (verbs
    /// semantics of RESET). Counters survive.
    fn reset(&mut self) {
        let counters = self.counters;
        *self = Qp::build(self.cfg);
        self.counters = counters;
    }

    /// Moves to ERR and flushes every outstanding send and receive WQE with `WR_FLUSH_ERR`
    /// (IBA 10.3.1; rxe `rxe_drain_resp_pkts`). `keep_responses` keeps the responder's last
    /// NAK queued so the peer learns why (class C errors).
    fn enter_error(&mut self, keep_responses: bool) {
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.attr.cur_qp_state = QpState::Err;
        let qpn = self.cfg.qpn;
        while let Some(w) = self.sq.pop_front() {
            self.counters.send_err += 1;
            self.send_cq
                .push_back(Wc::flushed(w.wr.wr_id, w.wc_opcode(), qpn));
        }
        if let Inbound::Send { wqe, .. } = std::mem::replace(&mut self.inbound, Inbound::Idle) {
            self.recv_cq
                .push_back(Wc::flushed(wqe.wr_id, WcOpcode::Recv, qpn));
        }
        while let Some(r) = self.rq.pop_front() {
            self.recv_cq
                .push_back(Wc::flushed(r.wr_id, WcOpcode::Recv, qpn));
        }
        self.req_cursor = 0;
        self.rd_atomic = 0;
        self.retrans_deadline = None;
        self.rnr_deadline = None;
        self.rto_deadline = None;
        self.tlp_deadline = None;
        self.tlp_probe = None;
        self.probe_psn = None;
        self.reorder.clear();
        self.resend.clear();
        self.scoreboard.clear();
        if keep_responses {
            self.resp_out.retain(|r| matches!(r, RespOut::Ack { .. }));
        } else {
            self.resp_out.clear();
        }
        self.read_pace_until = None;
    }

    /// `ibv_post_send`. Fails without side effects when the QP state, the queue depth or the
    /// request itself is wrong (the errno cases of verbs); in ERR the request is accepted and
    /// completes at once with `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        let qpn = self.cfg.qpn;
        let ty = self.cfg.qp_type;
        match self.state {
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => {}
            state => {
                return Err(PostError::InvalidState {
                    qpn,
                    state,
                    queue: "send",
                });
            }
        }
        if self.sq.len() >= self.cfg.caps.max_send_wr as usize {
            return Err(PostError::QueueFull {
                queue: "send",
                max: self.cfg.caps.max_send_wr,
            });
        }
        let unsupported = match ty {
            QpType::Rc => false,
            // UC has no SEND with invalidate opcode (IBA 9.4.1.1), nor ATOMIC WRITE.
            QpType::Uc => {
                wr.op.is_read_or_atomic()
                    || matches!(
                        wr.op,
                        SendOp::SendWithInv { .. } | SendOp::AtomicWrite { .. }
                    )
            }
            QpType::Ud => !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }),
        };
        if unsupported {
            return Err(PostError::UnsupportedOp {
                op: wr.op.wr_opcode(),
                qp_type: ty.name(),
            });
        }
        if (ty == QpType::Ud) != wr.ud.is_some() {
            return Err(PostError::BadDestination);
        }
        match self.xrc {
            // The target has no send queue; the initiator names an SRQ in every request.
            Some(XrcRole::Target) => {
                return Err(PostError::UnsupportedOp {
                    op: wr.op.wr_opcode(),
                    qp_type: "XRC_RECV",
                });
            }
            // XRC has no opcode for ATOMIC WRITE (nor FLUSH).
            Some(XrcRole::Initiator) if matches!(wr.op, SendOp::AtomicWrite { .. }) => {
                return Err(PostError::UnsupportedOp {
                    op: wr.op.wr_opcode(),
                    qp_type: "XRC_SEND",
                });
            }
            Some(XrcRole::Initiator) if wr.xrc_srqn.is_none() => {
                return Err(PostError::BadDestination);
            }
            _ => {}
        }
        let inline = wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        let len = if wr.op.is_local() {
            // Binds and invalidates move no data: their SGEs are ignored.
            0
        } else if inline {
            let data = wr.inline_data.as_deref().unwrap_or(&[]);
            if data.len() > self.cfg.caps.max_inline_data as usize {
                return Err(PostError::InlineTooLong {
                    len: data.len(),
                    max: self.cfg.caps.max_inline_data,
                });
            }
            data.len() as u32
        } else {
            if wr.sges.len() > self.cfg.caps.max_send_sge as usize {
                return Err(PostError::TooManySges {
                    num: wr.sges.len(),
                    max: self.cfg.caps.max_send_sge,
                });
            }
            wr.sges.total_len().ok_or(PostError::MessageTooLong)?
        };
        if len > MAX_MSG_SIZE {
            return Err(PostError::MessageTooLong);
        }
        // ATOMIC WRITE carries its 8 bytes in the WR; SGEs and inline data are ignored.
        let len = if matches!(wr.op, SendOp::AtomicWrite { .. }) {
            8
        } else {
            len
        };
        if let SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } =
            wr.op
        {
            // rxe validate_send_wr: one 8-byte SGE, aligned remote address.
            if len != 8 || remote_addr % 8 != 0 {
                return Err(PostError::BadAtomic);
            }
        }
        let wqe = SendWqe {
            wr,
            len,
            state: WqeState::Posted,
            first_psn: Psn::new(0),
            last_psn: Psn::new(0),
            npkts: 0,
            next_pkt: 0,
            read_done: 0,
            read_seg: u32::MAX,
            has_rd_atomic: false,
            extra_reads: 0,
            error: None,
        };
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            self.counters.send_err += 1;
            self.send_cq
                .push_back(Wc::flushed(wqe.wr.wr_id, wqe.wc_opcode(), qpn));
            return Ok(());
        }
        self.sq.push_back(wqe);
        Ok(())
    }

    /// `ibv_post_recv`. Allowed from INIT on; in ERR the WQE completes at once with
    /// `WR_FLUSH_ERR`.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        let qpn = self.cfg.qpn;
        if self.cfg.uses_srq {
            return Err(PostError::UsesSrq);
        }
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState {
                qpn,
                state: self.state,
                queue: "receive",
            });
        }
        if wr.sges.len() > self.cfg.caps.max_recv_sge as usize {
            return Err(PostError::TooManySges {
                num: wr.sges.len(),
                max: self.cfg.caps.max_recv_sge,
            });
        }
        if self.rq.len() >= self.cfg.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull {
                queue: "receive",
                max: self.cfg.caps.max_recv_wr,
            });
        }
        if self.state == QpState::Err {
            self.recv_cq
                .push_back(Wc::flushed(wr.wr_id, WcOpcode::Recv, qpn));
            return Ok(());
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// The next completion, send side first.
    pub fn poll_completion(&mut self) -> Option<(CqSide, Wc)> {
        if let Some(wc) = self.send_cq.pop_front() {
            return Some((CqSide::Send, wc));
        }
        self.recv_cq.pop_front().map(|wc| (CqSide::Recv, wc))
    }

    /// The next send completion.
    pub fn poll_send_completion(&mut self) -> Option<Wc> {
        self.send_cq.pop_front()
    }

    /// The next receive completion.
    pub fn poll_recv_completion(&mut self) -> Option<Wc> {
        self.recv_cq.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Duration> {
        [
            self.retrans_deadline,
            self.rnr_deadline,
            self.pace_until,
            self.read_pace_until,
            self.rto_deadline,
            self.tlp_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When pacing lets the next request go, if it holds one back (part of
    /// [`Qp::poll_timeout`]): an engine keeps this deadline to the microsecond, where the
    /// transport's other timers may round up.
    pub fn pace_deadline(&self) -> Option<Duration> {
        match (self.pace_until, self.read_pace_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        if self.pace_until.is_some_and(|t| ctx.now >= t) {
            self.pace_until = None;
        }
        if self.read_pace_until.is_some_and(|t| ctx.now >= t) {
            self.read_pace_until = None;
        }
        self.completer_timeout(ctx.now);
    }

    /// Feeds one received packet (already checked by [`PacketRepr::parse`]; the ICRC already
    /// verified by the engine) into the QP. Packets the receive checks reject are dropped and
    /// counted, as rxe drops them: silently.
    pub fn handle_packet(&mut self, ctx: &mut Ctx<'_>, pkt: &PacketRepr<'_>, meta: &RecvMeta) {
        let op = pkt.bth.opcode;
        if op == srdma_wire::Opcode::Cnp {
            self.handle_cnp(ctx.now);
            return;
        }
        // rxe_recv.c hdr_check / check_type_state / check_keys.
        let class_ok = self.xrc_accepts(op).unwrap_or(matches!(
            (op.transport(), self.cfg.qp_type),
            (Transport::Rc, QpType::Rc) | (Transport::Uc, QpType::Uc) | (Transport::Ud, QpType::Ud)
        ));
        if !class_ok {
            self.counters.dropped_pkts += 1;
            return;
        }
        let rc;
        let pkt = if self.xrc.is_some() {
            rc = Self::xrc_as_rc(pkt);
            &rc
        } else {
            pkt
        };
        if !pkey_match(pkt.bth.pkey, srdma_wire::bth::DEFAULT_PKEY) {
            self.counters.bad_pkey += 1;
            self.counters.dropped_pkts += 1;
            return;
        }
        if meta.ecn_ce() {
            self.ecn_marked(ctx.now);
        }
        if op.is_request() {
            if !matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) {
                self.counters.dropped_pkts += 1;
                return;
            }
            self.counters.rcvd_pkts += 1;
            if self.xrc_refuse_without_srq(ctx, pkt) {
                return;
            }
            self.handle_request(ctx, pkt, meta);
        } else {
            if !matches!(self.state, QpState::Rts | QpState::Sqd) {
                self.counters.dropped_pkts += 1;
                return;
            }
            self.handle_response(ctx, pkt);
        }
    }

    /// A CNP for this QP (the notification point of its peer saw our packets marked CE):
    /// DCQCN cuts the sending rate. Only a connected QP that sends has a rate to cut (a CNP
    /// for anything else is counted and ignored, as a NIC ignores it).
    fn handle_cnp(&mut self, now: Duration) {
        if self.cfg.qp_type == QpType::Ud || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.counters.dropped_pkts += 1;
            return;
        }
        self.counters.rp_cnp_handled += 1;
        self.cc.on_cnp(now);
    }

    /// A packet for this QP came marked CE (a queue on the path is filling): answer with a
    /// CNP to the peer's QP, at most one per [`crate::congestion::CNP_INTERVAL`], as RoCE
    /// NICs do (DCQCN's notification point). UD has no peer QP to tell.
    fn ecn_marked(&mut self, now: Duration) {
        self.counters.np_ecn_marked_roce_packets += 1;
        if self.cfg.qp_type != QpType::Ud
            && matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            && self.cnp_gate.marked(now)
        {
            self.resp_out.push_back(RespOut::Cnp);
        }
    }

    /// Writes the next packet into `buf` (at least [`MAX_PACKET_LEN`] bytes): responses
    /// before requests, as a responder must not starve behind its own sends, except that a
    /// lone positive ACK lets the request message in progress go first, to its last packet
    /// (as far as the window lets it, [`MAX_PKT_PER_ACK`] packets at most). The peer is
    /// waiting for that request (in a ping-pong it is the reply) more than for the ACK,
    /// which is cumulative and leaves right behind it (the engine sends both in one
    /// `sendmmsg`): a peer that polls its CQ for the ACK and then spins on its memory for
    /// the reply (perftest's `ib_write_lat`) finds the whole reply placed by the poll that
    /// took the ACK, where an ACK after the reply's first packet completed its WRITE before
    /// the rest had come.
    pub fn poll_transmit(&mut self, ctx: &mut Ctx<'_>, buf: &mut [u8]) -> Option<Transmit> {
        let lone_ack = self.resp_out.len() == 1
            && matches!(
                self.resp_out.front(),
                Some(RespOut::Ack {
                    syndrome: srdma_wire::Syndrome::Ack { .. },
                    ..
                })
            );
        if lone_ack && !self.ack_yielded {
            if let Some(t) = self.next_request(ctx, buf) {
                self.ack_waited += 1;
                self.ack_yielded = self.ack_waited >= MAX_PKT_PER_ACK
                    || srdma_wire::Opcode::try_from(buf[0]).map_or(true, |op| op.is_end());
                self.counters.sent_pkts += 1;
                return Some(t);
            }
        }
        self.ack_yielded = false;
        self.ack_waited = 0;
        let t = self
            .next_response(ctx, buf)
            .or_else(|| self.next_request(ctx, buf))?;
        self.xrc_response(buf);
        self.counters.sent_pkts += 1;
        Some(t)
    }

    /// A probe of the path to the peer for UDP GSO: writes into `buf` a SEND_ONLY without
    /// payload whose PSN the peer has already seen (the one before the oldest it has not
    /// acknowledged), so the peer's responder answers it with an ACK that acknowledges
    /// nothing new (IBA C9-105; rxe `duplicate_request` ACKs every duplicate that starts a
    /// message) and executes nothing. Sent twice in one GSO message, two such ACKs back
    /// ([`Qp::unproductive_acks`]) mean both datagrams the message was cut into reached
    /// the peer's transport with a valid ICRC. `None` unless this is an RC QP in RTS with
    /// nothing unacknowledged (an ACK to the probe could otherwise acknowledge something).
    pub fn gso_probe(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        if self.cfg.qp_type != QpType::Rc
            || self.xrc.is_some()
            || self.state != QpState::Rts
            || self.req_psn != self.comp_psn
        {
            return None;
        }
        let mut bth = bth(
            srdma_wire::Opcode::RcSendOnly,
            self.attr.dest_qp_num,
            self.comp_psn.sub(1),
        );
        bth.ack_req = true;
        let len = PacketRepr::new(bth, &[]).emit(buf).ok()?;
        self.counters.sent_pkts += 1;
        Some(Transmit {
            len,
            dest: self.connected_dest(),
        })
    }

    /// Before the QP goes away: queues its last positive ACK once more, when the last
    /// request it executed was a SEND or WRITE (an RC QP, not XRC, connected: RTR to SQE,
    /// nothing kept out of order). Returns whether it queued one.
    ///
    /// A requester learns that its last message arrived only from that ACK. Lost on a lossy
    /// path after this side's QP is destroyed (its process exits right after its last
    /// receive), the peer retries into a QP that is gone: until `retry_cnt` runs out, and
    /// for ever on rxe, which takes 7 as "retry for ever". A duplicate ACK is harmless (the
    /// requester finds it acknowledges nothing new, IBA 9.7.5.1.2, as the ACKs of
    /// duplicate requests); two make a lost last ACK the loss of both.
    pub fn ack_once_more(&mut self) -> bool {
        let connected = matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        );
        if self.cfg.qp_type != QpType::Rc
            || self.xrc.is_some()
            || !connected
            || !self.reorder.is_empty()
            || self.ack_psn != self.epsn
            || self.ack_psn == self.attr.rq_psn
        {
            return false;
        }
        self.resp_out.push_back(RespOut::DupAck {
            psn: self.ack_psn.sub(1),
        });
        true
    }

    /// ACKs received that acknowledged nothing new: for a PSN not sent yet (ghosts) or
    /// already acknowledged (duplicates, and the answers to [`Qp::gso_probe`]).
    pub fn unproductive_acks(&self) -> u64 {
        self.unproductive_acks
    }

    /// The PSNs this requester is at: (next to send, oldest unacknowledged). Unchanged
    /// across a probe, the QP sent and completed nothing meanwhile.
    pub fn psn_state(&self) -> (Psn, Psn) {
        (self.req_psn, self.comp_psn)
    }

    /// True when the requester has request packets ready to send right now (responses and
    /// acknowledgements aside).
    pub fn has_requests_ready(&self) -> bool {
        self.rnr_deadline.is_none()
            && self.pace_until.is_none()
            && (self.req_cursor < self.sq.len()
                || !self.resend.is_empty()
                || self.tlp_probe.is_some())
    }

    /// True when the next response this QP sends is a READ response.
    pub fn sending_read_responses(&self) -> bool {
        matches!(self.resp_out.front(), Some(RespOut::Read { .. }))
    }

    /// True when the QP has something to send right now.
    pub fn wants_transmit(&self) -> bool {
        (!self.resp_out.is_empty() && self.read_pace_until.is_none()) || self.has_requests_ready()
    }

    fn connected_dest(&self) -> Dest {
        let ah = &self.attr.ah_attr;
        Dest {
            dgid: ah.dgid,
            udp_dport: ah.udp_dport,
            udp_sport: srdma_wire::sport::udp_sport(
                ah.flow_label,
                self.cfg.qpn.value(),
                self.attr.dest_qp_num.value(),
            ),
            traffic_class: ah.traffic_class,
            hop_limit: ah.hop_limit,
            flow_label: ah.flow_label,
        }
    }

    fn pmtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    fn push_send_wc(&mut self, wc: Wc, signaled: bool) {
        if !wc.status.is_success() {
            self.counters.send_err += 1;
        }
        if signaled || self.cfg.sq_sig_all || !wc.status.is_success() {
            self.send_cq.push_back(wc);
        }
    }
}

/// Where packet `k` of an `n`-packet message sits.
fn position(n: u32, k: u32) -> srdma_wire::Position {
    use srdma_wire::Position;
    match (n, k) {
        (1, _) => Position::Only,
        (_, 0) => Position::First,
        (n, k) if k + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

/// A BTH with srdma's fixed fields (default P_Key, no SE/MigReq/ECN, AckReq off): the
/// template every packet starts from.
fn bth(opcode: srdma_wire::Opcode, dest_qpn: Qpn, psn: Psn) -> srdma_wire::BthRepr {
    srdma_wire::BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: srdma_wire::bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req: false,
        psn,
    }
}

/// rxe `pkey_match`: the low 15 bits equal and non-zero, and one of the two a full member.
fn pkey_match(a: u16, b: u16) -> bool {
    (a & 0x7FFF) != 0 && (a & 0x7FFF) == (b & 0x7FFF) && ((a | b) & 0x8000) != 0
}

/// A completion for a send WQE.
fn send_wc(qpn: Qpn, wqe: &SendWqe, status: WcStatus) -> Wc {
    let mut wc = Wc::new(wqe.wr.wr_id, status, wqe.wc_opcode(), qpn);
    if status.is_success() {
        wc = wc.with_byte_len(wqe.len);
    }
    wc
}

/// Number of packets a message of `len` bytes takes at `pmtu` (at least one).
fn packets(len: u32, pmtu: u32) -> u32 {
    len.div_ceil(pmtu).max(1)
}
