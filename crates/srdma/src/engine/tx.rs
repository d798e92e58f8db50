//! Transmit: a QP's packets to the drivers (payloads left in registered memory for them to
//! send or copy from), and whether a destination takes UDP GSO.

use std::fs::File;
use std::io::BufWriter;
use std::net::SocketAddr;

use srdma_proto::Ctx;
use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_wire::{Encap, IpRepr, Packet, pcap};

use super::timers::note_timer;
use super::{Shared, State, capture_epoch, deliver_completions};
use crate::driver::{Driver, Frame, GsoJoin, Outgoing};
use crate::types::{Gid, Gso};

/// What the transmit path keeps (in the engine's `State`).
pub(super) struct TxState {
    /// The buffer the next outgoing packet is built in (see [`Frame`]: the UDP driver swaps
    /// it for a free one of its batch when it keeps the packet); always
    /// [`MAX_PACKET_LEN`] long.
    pub(super) frame: Frame,
    /// QPs a full shared-memory ring held back, each once (`QpSlot::shm_blocked` says which
    /// are on it): [`Shared::flush_blocked`] tries them again.
    shm_blocked: Vec<u32>,
    /// QPs with work that the spent budget of their peer held back (see `share`), each once
    /// (`QpSlot::waits`): [`Shared::flush_waiting`] gives them their turn.
    waiting: super::share::Waiting,
    /// [`Shared::flush_waiting`] is giving the waiting QPs their turn.
    turn: bool,
}

impl TxState {
    /// A frame of the largest packet's length, and no QP held back.
    pub(super) fn new() -> TxState {
        TxState {
            frame: vec![0; MAX_PACKET_LEN],
            shm_blocked: Vec::new(),
            waiting: Default::default(),
            turn: false,
        }
    }

    /// Whether a full ring holds some QP back (the progress thread then looks again soon).
    pub(super) fn blocked(&self) -> bool {
        !self.shm_blocked.is_empty()
    }

    /// Whether some QP waits for its peer's budget (see [`Shared::flush_waiting`]).
    pub(super) fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }
}

impl Shared {
    pub(super) fn encap_to(&self, dst: SocketAddr, sport: u16) -> Option<Encap> {
        let ip = IpRepr::between(self.local.ip(), dst.ip()).ok()?;
        Some(Encap {
            ip,
            src_port: sport,
            dst_port: dst.port(),
        })
    }

    /// Sends everything QP `qpn` has to send, then hands its completions to its CQs.
    pub(crate) fn flush(&self, st: &mut State, qpn: u32) {
        self.queue_out(st, qpn);
        self.send_queued(st);
    }

    /// [`Shared::flush`] of several QPs, their packets sent together: one `sendmmsg` (and
    /// one round of doorbells) for all, not one per QP — thousands of QPs that each have a
    /// packet or two after a receive batch (their ACKs came) cost a system call or two.
    pub(crate) fn flush_each(&self, st: &mut State, qpns: &[u32]) {
        for &qpn in qpns {
            self.queue_out(st, qpn);
        }
        self.send_queued(st);
    }

    /// Sends what the drivers hold queued (`sendmmsg`, doorbells) and counts.
    pub(crate) fn send_queued(&self, st: &mut State) {
        let State {
            counters, udp, shm, ..
        } = st;
        if let Some(udp) = udp.as_deref_mut() {
            counters.tx_errors += udp.flush() as u64;
            udp.count_into(counters);
        }
        if let Some(shm) = shm.as_mut() {
            shm.flush();
            shm.count_into(counters);
        }
    }

    /// Builds and queues everything QP `qpn` has to send (the drivers send it at the next
    /// [`Shared::send_queued`], or when their batch fills), then hands its completions to
    /// its CQs.
    ///
    /// Each packet is built in `TxState::frame` (its payload left in registered memory
    /// unless a capture wants it whole), then goes to the first driver that routes it:
    /// shared memory, else UDP.
    pub(super) fn queue_out(&self, st: &mut State, qpn: u32) {
        let mut now = self.now();
        self.probe_path(st, qpn, now);
        let State {
            mrs,
            mem,
            qps,
            srqs,
            counters,
            capture,
            udp,
            tx: TxState { frame, turn, .. },
            probes,
            shm,
            shares,
            ..
        } = st;
        let (Some(slot), Some(udp)) = (qps.get_mut(&qpn), udp.as_deref_mut()) else {
            return;
        };
        slot.posts_held = false;
        let now_ns = now.as_nanos() as u64;
        // A connected QP whose peer is a device of this host: the ring it goes through, to
        // ask for room before each packet is built (a full ring holds the QP back, see
        // `shm`).
        let ring = match shm.as_mut() {
            Some(shm) if slot.qp.qp_type() != srdma_proto::QpType::Ud => {
                let attr = slot.qp.attr();
                let dst = SocketAddr::new(Gid(attr.ah_attr.dgid).ip(), attr.ah_attr.udp_dport);
                shm.route(dst, attr.dest_qp_num.value(), now_ns)
            }
            _ => None,
        };
        // Over UDP, the QPs to one peer keep within its budget together (see `share`):
        // held, a QP may resend what it has in flight, and sends nothing new.
        let budget_peer = (ring.is_none() && slot.qp.qp_type() == srdma_proto::QpType::Rc)
            .then(|| Gid(slot.qp.attr().ah_attr.dgid).ip());
        // Counted (and capped) before it sends, when it was not: the first burst after it
        // was idle keeps within its share too.
        if slot.sharing.is_none() {
            count_share(shares, slot);
        }
        let held = budget_peer.is_some_and(|ip| shares.holds(ip, *turn));
        slot.qp
            .hold_window(held.then(|| slot.qp.outstanding_psns()));
        let mut blocked = false;
        let ack_tail = slot.ack_tail();
        // Payload goes to the drivers straight from registered memory, except when a
        // capture wants each packet whole.
        let zero_copy = capture.is_none();
        // Whether the last destination may take GSO (one lookup per destination, not per
        // packet: an RC or UC QP sends to one).
        let mut gso_dst: Option<(SocketAddr, bool)> = None;
        loop {
            if udp.is_full() {
                counters.tx_errors += udp.flush() as u64;
                // A READ's responses measure the rate they leave at (a responder paces them
                // once the reader asks again, `congestion::responses`): a long READ spans
                // many batches, and what follows this `sendmmsg` leaves after it. (Requests
                // keep the time of the turn: the congestion control's delay rules were
                // measured with it.)
                if slot.qp.sending_read_responses() {
                    now = self.now();
                }
            }
            if let (Some(link), Some(shm)) = (ring, shm.as_mut())
                && slot.qp.wants_transmit()
                && !shm.has_room(link, srdma_proto::transport::MAX_PACKET_LEN)
            {
                blocked = true;
                break;
            }
            let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
            mem.deferring = zero_copy;
            mem.pieces.clear();
            let mut ctx = Ctx { now, mrs, mem, srq };
            let t = slot.qp.poll_transmit(&mut ctx, frame);
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
            let dqpn = u32::from_be_bytes([0, frame[5], frame[6], frame[7]]);
            if let Some(shm) = shm.as_mut()
                && let Some(link) = shm.route(dst, dqpn, now_ns)
            {
                if slot.path != crate::Path::SharedMemory {
                    // A ring holds the largest window: no need to grow into it.
                    slot.path = crate::Path::SharedMemory;
                    slot.qp.path_holds_window();
                }
                if let Some(w) = capture.as_mut() {
                    capture_tx(w, now_ns, &encap, &mut frame[..t.len]);
                }
                // A READ response's payload stays in the responder's memory while its READ
                // is outstanding: a peer that may read it there pulls it (`crate::pull`).
                let read_response = srdma_wire::Opcode::try_from(frame[0])
                    .is_ok_and(|o| o.kind() == srdma_wire::Kind::ReadResponse);
                let pkt = Outgoing {
                    len: t.len,
                    dst,
                    encap: &encap,
                    gso: GsoJoin::Alone,
                    pullable: read_response,
                };
                // A full ring or a piece gone: the driver counts the first, the transport
                // retransmits both.
                shm.queue(link, &pkt, frame, &*mem);
                continue;
            }
            let Some(link) = udp.route(dst, dqpn, now_ns) else {
                counters.tx_errors += 1;
                continue;
            };
            slot.path = crate::Path::Udp;
            // A bare ACK is the short tail of a GSO message only where `QpSlot::ack_tail`
            // says so; otherwise it shares a message only with datagrams of its size (other
            // QPs' ACKs to that peer, flushed together after a receive: one skb for all).
            let bare_ack = frame[0] == srdma_wire::Opcode::RcAcknowledge as u8;
            let dst_gso = match gso_dst {
                Some((d, g)) if d == dst => g,
                _ => {
                    let g = self.gso_for(probes, dst);
                    gso_dst = Some((dst, g));
                    g
                }
            };
            let gso = match (dst_gso, bare_ack && !ack_tail) {
                (false, _) => GsoJoin::Alone,
                (true, false) => GsoJoin::Any,
                (true, true) => GsoJoin::SameSize,
            };
            if let Some(w) = capture.as_mut() {
                if !capture_tx(w, now_ns, &encap, &mut frame[..t.len]) {
                    counters.tx_errors += 1;
                    continue;
                }
            }
            let pkt = Outgoing {
                len: t.len,
                dst,
                encap: &encap,
                gso,
                pullable: false,
            };
            if udp.queue(link, &pkt, frame, &*mem) {
                counters.tx_datagrams += 1;
            } else {
                counters.tx_errors += 1;
            }
        }
        st.timing.rest.delivered(deliver_completions(slot));
        count_share(&mut st.shares, slot);
        if blocked && !std::mem::replace(&mut slot.shm_blocked, true) {
            st.tx.shm_blocked.push(qpn);
        }
        // Held with work left: it waits for its turn.
        if let Some(ip) = budget_peer.filter(|_| held && slot.qp.has_requests_ready())
            && !std::mem::replace(&mut slot.waits, true)
        {
            st.tx.waiting.push(qpn, ip);
            st.shares.wait(ip, true);
        }
        note_timer(st, qpn);
        self.probe_answered(st, qpn, now);
    }

    /// Flushes again the QPs a full ring held back (see `shm`): whoever reads the rings or
    /// waits on the device calls this, and the QPs still without room stay on the list.
    pub(crate) fn flush_blocked(&self, st: &mut State) {
        if st.tx.shm_blocked.is_empty() {
            return;
        }
        let blocked = std::mem::take(&mut st.tx.shm_blocked);
        for qpn in &blocked {
            if let Some(s) = st.qps.get_mut(qpn) {
                s.shm_blocked = false;
            }
        }
        self.flush_each(st, &blocked);
    }

    /// Gives the QPs that their peer's spent budget held back their turn (see `share`),
    /// oldest first, each while its peer's budget lasts; those held again go to the back.
    pub(crate) fn flush_waiting(&self, st: &mut State) {
        if !st.tx.waiting() {
            return;
        }
        st.tx.turn = true;
        let round = st.tx.waiting.take();
        let kept = super::share::take_turns(
            st,
            round,
            |st, ip| st.shares.spent(ip),
            |st, qpn, ip| {
                st.shares.wait(ip, false);
                if let Some(s) = st.qps.get_mut(&qpn) {
                    s.waits = false;
                    self.queue_out(st, qpn);
                }
            },
        );
        st.tx.waiting.put_back(kept);
        st.tx.turn = false;
        self.send_queued(st);
    }

    /// Whether datagrams to `dst` may go as GSO messages.
    fn gso_for(&self, probes: &super::probe::Probes, dst: SocketAddr) -> bool {
        match self.cfg.gso {
            Gso::Never => false,
            Gso::Always => true,
            Gso::Local => self.uncut(dst),
            Gso::Auto => self.uncut(dst) || probes.verified(dst.ip()),
        }
    }

    /// True when a GSO message to `dst` is never cut with IPv4 IDs that matter: IPv6 has
    /// none, and this host's addresses are reached over loopback, which does not cut.
    pub(super) fn uncut(&self, dst: SocketAddr) -> bool {
        dst.is_ipv6() || dst.ip().is_loopback() || dst.ip() == self.local.ip()
    }
}

/// Writes an outgoing packet built whole in `pkt` (nothing is left in registered memory
/// while capturing) to the capture, with the ICRC it carries over UDP (filled in here; the
/// UDP driver fills the same one again). False when it could not be computed: nothing is
/// written.
pub(super) fn capture_tx(
    w: &mut pcap::Writer<BufWriter<File>>,
    now_ns: u64,
    encap: &Encap,
    pkt: &mut [u8],
) -> bool {
    if Packet::new_unchecked(&mut *pkt).fill_icrc(encap).is_err() {
        return false;
    }
    let _ = w.write_roce(now_ns + capture_epoch(), encap, pkt);
    true
}

/// Counts the QP among its peer's QPs with work (see `share`), with what it has in flight
/// over UDP, and caps its window at its fair share of the peer.
fn count_share(shares: &mut super::share::Shares, slot: &mut super::QpSlot) {
    let working = slot.qp.qp_type() != srdma_proto::QpType::Ud
        && slot.qp.send_queue_len() > 0
        && matches!(
            slot.qp.state(),
            srdma_proto::QpState::Rts | srdma_proto::QpState::Sqd
        );
    let peer = working.then(|| Gid(slot.qp.attr().ah_attr.dgid).ip());
    let udp_mtu = (slot.path == crate::Path::Udp).then(|| slot.qp.attr().path_mtu.bytes());
    let flight = match (peer, udp_mtu) {
        (Some(_), Some(mtu)) => slot.qp.outstanding_psns().saturating_mul(mtu),
        _ => 0,
    };
    let cap = shares.update(slot.sharing, peer, udp_mtu, (slot.flight, flight));
    slot.sharing = peer;
    slot.flight = flight;
    slot.qp.set_window_cap(cap);
}
