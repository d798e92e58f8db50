//! Receive: datagrams from the device's socket, the port keeper and the multicast groups'
//! sockets, each checked and handed to its QP (or to every QP attached to its group).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use srdma_proto::{Ctx, RecvMeta};
use srdma_wire::{Encap, IpRepr, Kind, PacketRepr};

use super::timers::note_timer;
use super::timing::{Hold, silent_writes_until};
use super::{Shared, State, capture_epoch, deliver_completions};
use crate::driver::{Driver, Received, Via};
use crate::error::{Result, io_err};
use crate::sys;
use crate::types::Gid;

/// Datagrams taken from one multicast group's socket per receive pass.
const GROUP_BUDGET: usize = 64;
/// Multicast groups a device joins at most (rxe's `RXE_MAX_MCAST_GRP`).
pub const MAX_MCAST_GRP: u32 = 8192;
/// QPs attached to one multicast group at most (rxe's `RXE_MAX_MCAST_QP_ATTACH`).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;

/// What the receive path keeps from one datagram or pass to the next (in the engine's
/// `State`): the QPs a batch touched, the ICRC memo, the multicast groups and the buffers of
/// the side sockets.
pub(super) struct RxState {
    /// The QPs the batch being handled gave packets to, each once (`QpSlot::touched` says
    /// which are on it): flushed after the batch, then cleared.
    touched: Vec<u32>,
    /// Buffer for datagrams the port keeper forwards (allocated on first use).
    fwd_buf: Vec<u8>,
    /// What the receive path keeps from one datagram to the next to check ICRCs faster (see
    /// `handle_datagram`).
    icrc: srdma_wire::icrc::Memo,
    /// The multicast groups this device's UD QPs are attached to.
    groups: Vec<Group>,
    /// Receive buffer for the groups' sockets (allocated on first use).
    group_buf: Vec<u8>,
}

impl RxState {
    /// Empty, with room for a batch's QPs (the side buffers are allocated on first use).
    pub(super) fn new() -> RxState {
        RxState {
            touched: Vec::with_capacity(64),
            fwd_buf: Vec::new(),
            icrc: Default::default(),
            groups: Vec::new(),
            group_buf: Vec::new(),
        }
    }

    /// Whether some multicast group has QPs of this device attached.
    pub(super) fn has_groups(&self) -> bool {
        !self.groups.is_empty()
    }
}

/// The bytes of a packet whose payload stayed in its sender's memory, pulled now (see
/// `crate::pull`): its headers from `head`, the payload from the sender, zeros after (pad,
/// ICRC). `None` when it does not parse or cannot be read.
fn whole_packet(head: &[u8], p: crate::driver::Pulled<'_>) -> Option<Vec<u8>> {
    let (_, payload) = PacketRepr::parse_head(head, p.len).ok()?;
    let mut pkt = head.get(..payload.start)?.to_vec();
    crate::pull::read_now(p.pid, p.spans, &mut pkt).ok()?;
    (pkt.len() == payload.end).then(|| {
        pkt.resize(p.len, 0);
        pkt
    })
}

/// A multicast group UD QPs of this device are attached to ([`crate::Qp::attach_mcast`]),
/// as rxe keeps one per multicast GID: a socket that is a member of the group on the
/// device's interface and receives its datagrams, and the attached QPs, each of which gets a
/// copy of every datagram sent to QPN 0xFFFFFF (its Q_Key and receive queue decide the rest).
pub(super) struct Group {
    /// The group's address.
    pub(super) ip: IpAddr,
    /// Bound to the group's address and the device's port (see `udp::join_group`).
    pub(super) socket: UdpSocket,
    /// The attached QPs.
    pub(super) qpns: Vec<u32>,
}

impl Shared {
    /// Receives and handles up to `budget` batches of datagrams, flushing every QP they
    /// touched, except that `hold` may have a QP complete its work now but hold its packets
    /// back (see `State::deferred`); returns true when the budget ran out with more waiting.
    ///
    /// `udp`: look at the UDP socket too (the rings of the shared-memory driver are always
    /// looked at: that costs no system call). `now`: the time the caller read just before, if
    /// it did (a busy poll's look then reads the clock once, not twice).
    pub(super) fn receive(
        &self,
        st: &mut State,
        budget: usize,
        hold: Hold,
        udp: bool,
        mut now: Option<Duration>,
    ) -> bool {
        if st.udp.is_none() {
            return false;
        }
        // QPs a full ring held back: the peer may have read since.
        self.flush_blocked(st);
        // QPs a spent budget held back: ACKs handled since may have freed some.
        self.flush_waiting(st);
        let mut more = false;
        if udp && self.cm_forwarded.load(Ordering::Relaxed) {
            self.receive_forwarded(st);
        }
        if udp && !st.rx.groups.is_empty() {
            self.receive_groups(st);
        }
        // The socket once per call while it is empty: the rings' batches that follow cost no
        // system call each.
        let mut look_udp = udp;
        let mark = st.timing.rest.mark();
        for _ in 0..budget {
            let now = now.take().unwrap_or_else(|| self.now());
            let k = self.receive_shm(st, now);
            let n = if look_udp {
                self.receive_udp(st, now, hold == Hold::Poll)
            } else {
                Received::default()
            };
            if look_udp {
                // The socket found empty (rings or not): quiet for a while.
                st.timing.rest.udp_looked(now.as_nanos() as u64, n.taken);
                look_udp = n.taken > 0;
            }
            if n.taken == 0 && k.taken == 0 {
                // The rest begins only after a receive that completed something (see
                // `RxRest::drained`).
                st.timing.rest.drained(now.as_nanos() as u64, mark, udp);
                break;
            }
            let mut touched = std::mem::take(&mut st.rx.touched);
            for qpn in touched.drain(..) {
                if let Some(s) = st.qps.get_mut(&qpn) {
                    s.touched = false;
                }
                // Requests (a window the ACKs just opened) go now; only ACKs and responses
                // wait for the application's reply.
                let held = st
                    .qps
                    .get(&qpn)
                    .is_some_and(|s| !s.qp.has_requests_ready() && hold.holds(&s.ride));
                if !held {
                    if hold == Hold::Riding
                        && let Some(slot) = st.qps.get_mut(&qpn)
                        && slot.qp.wants_transmit()
                        && !slot.qp.has_requests_ready()
                        && !slot.qp.sending_read_responses()
                    {
                        // Its ACKs do not ride yet, so this one leaves now; should the
                        // application answer with a send at once, that counts towards the
                        // ride (see `AckRide::send_posted`): one that spins on its memory
                        // gets its peer's next reply in a poll, not from this thread.
                        slot.ride.flushed(now.as_nanos() as u64);
                    }
                    self.queue_out(st, qpn);
                } else if let Some(slot) = st.qps.get_mut(&qpn) {
                    st.timing.rest.delivered(deliver_completions(slot));
                    if !st.deferred.contains(&qpn) {
                        slot.ride.held(now.as_nanos() as u64);
                        st.deferred.push(qpn);
                    }
                    note_timer(st, qpn);
                }
            }
            st.rx.touched = touched;
            // Every QP's packets of this batch in one go.
            self.send_queued(st);
            // The ACKs of this batch freed budget: the QPs waiting for it go first.
            self.flush_waiting(st);
            more = n.full || k.full;
            if !more {
                st.timing.rest.drained(now.as_nanos() as u64, mark, udp);
                break;
            }
        }
        more
    }

    /// Handles one batch of the UDP driver, its datagrams as arrived at `now`, the time of
    /// the look (read just before the receive call: at most that call's microsecond early,
    /// which no timer of the transport resolves; a clock read after it cost a busy round
    /// trip ~25 ns). `busy`: an application's busy poll of a CQ or of its memory, which
    /// may take one datagram (see `udp::RxBatch::recv`).
    fn receive_udp(&self, st: &mut State, now: Duration, busy: bool) -> Received {
        let Some(mut udp) = st.udp.take() else {
            return Received::default();
        };
        udp.busy_look = busy;
        let to = self.local.ip();
        let r = udp.recv(|from, data, via| {
            self.handle_datagram_to(st, now, from, to, data, via);
        });
        st.counters.rx_malformed += r.unreadable as u64;
        udp.count_into(&mut st.counters);
        st.udp = Some(udp);
        r
    }

    /// Handles a batch of the shared-memory driver (up to `shm::RECV_BATCH` packets from
    /// each of its rings).
    fn receive_shm(&self, st: &mut State, now: Duration) -> Received {
        if st.shm.as_ref().is_none_or(|s| !s.has_ins()) {
            return Received::default();
        }
        let Some(mut shm) = st.shm.take() else {
            return Received::default();
        };
        let to = self.local.ip();
        let k = shm.recv(|from, data, via| {
            self.handle_datagram_to(st, now, from, to, data, via);
        });
        // The payloads this batch pulls, before any of its completions or ACKs is
        // published (`crate::pull`).
        st.mem.pulls.flush();
        if st.mem.pulls.has_failed() {
            self.fail_pulls(st);
        }
        if k.taken > 0 {
            shm.count_into(&mut st.counters);
            let pulls = &st.mem.pulls;
            st.counters.rx_shm_pulled = pulls.packets;
            st.counters.rx_shm_pull_failed = pulls.failures + shm.counts.rx_bad_pulls;
            st.timing.spin.shm_took(now.as_nanos() as u64);
        }
        // A ring found corrupt is gone.
        self.shm_ins.store(shm.ins(), Ordering::Relaxed);
        st.shm = Some(shm);
        k
    }

    /// QPs whose pulled READ payloads could not be read (the responder's process went, or
    /// its region): their READs fail as a NIC's whose DMA read faults (`Qp::fail_placement`).
    #[cold]
    fn fail_pulls(&self, st: &mut State) {
        for (qpn, errno) in st.mem.pulls.take_failed() {
            let Some(slot) = st.qps.get_mut(&qpn) else {
                continue;
            };
            // A responder that is gone: as its retries running out; one whose memory is.
            let status = if errno == libc::ESRCH {
                srdma_proto::WcStatus::RetryExcErr
            } else {
                srdma_proto::WcStatus::RemAccessErr
            };
            slot.qp.fail_placement(status);
            if !std::mem::replace(&mut slot.touched, true) {
                st.rx.touched.push(qpn);
            }
        }
    }

    /// Handles the QP1 datagrams the port keeper forwarded (see `portshare`), as if the socket
    /// had received them.
    fn receive_forwarded(&self, st: &mut State) {
        let Some(conn) = self._keeper.as_ref() else {
            return;
        };
        let mut buf = std::mem::take(&mut st.rx.fwd_buf);
        buf.resize(crate::portshare::FWD_HDR + 65536, 0);
        while let Some((from, n)) = crate::portshare::recv_forwarded(conn, &mut buf) {
            self.handle_datagram(st, self.now(), from, &buf[..n], 0);
        }
        let touched = std::mem::take(&mut st.rx.touched);
        self.untouch(st, &touched);
        self.flush_each(st, &touched);
        st.rx.touched = touched;
        st.rx.touched.clear();
        st.rx.fwd_buf = buf;
    }

    /// Handles what the sockets of the multicast groups received: at most [`GROUP_BUDGET`]
    /// datagrams per group and pass, so that a flood cannot starve the rest.
    fn receive_groups(&self, st: &mut State) {
        let mut buf = std::mem::take(&mut st.rx.group_buf);
        buf.resize(crate::udp::RX_BUF, 0);
        let mut now = None;
        for i in 0..st.rx.groups.len() {
            let to = st.rx.groups[i].ip;
            for _ in 0..GROUP_BUDGET {
                let Ok((n, from)) = st.rx.groups[i].socket.recv_from(&mut buf) else {
                    break;
                };
                let now = *now.get_or_insert_with(|| self.now());
                let via = Via::Udp { place: 0, ecn: 0 };
                self.handle_datagram_to(st, now, from, to, &buf[..n], via);
            }
        }
        let touched = std::mem::take(&mut st.rx.touched);
        self.untouch(st, &touched);
        self.flush_each(st, &touched);
        st.rx.touched = touched;
        st.rx.touched.clear();
        st.rx.group_buf = buf;
    }

    /// Handles one datagram the device's socket received; `now` is when its receive batch
    /// arrived (one clock read per batch, not per packet); `place`: its place in its GRO
    /// buffer.
    fn handle_datagram(
        &self,
        st: &mut State,
        now: Duration,
        from: SocketAddr,
        data: &[u8],
        place: u16,
    ) {
        let via = Via::Udp { place, ecn: 0 };
        self.handle_datagram_to(st, now, from, self.local.ip(), data, via);
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
        via: Via<'_>,
    ) {
        if let (Via::Pulled(head, p), Some(_)) = (via, st.capture.as_ref()) {
            // A capture wants the packet's bytes: its payload is pulled now, and the packet
            // handled as one that came whole.
            let Some(pkt) = whole_packet(head, p) else {
                st.counters.rx_malformed += 1;
                return;
            };
            let head = &pkt[..pkt.len().min(srdma_wire::MAX_HEADER_LEN)];
            return self.handle_datagram_to(st, now, from, to, &pkt, Via::SharedMemory(head));
        }
        let Some(mut encap) = self.encap_between(from, to) else {
            st.counters.rx_malformed += 1;
            return;
        };
        // The ECN bits it arrived with (the ICRC masks them): a CE mark makes its QP answer
        // with a CNP.
        if let Via::Udp { ecn, .. } = via {
            match &mut encap.ip {
                IpRepr::V4(h) => h.tos = ecn,
                IpRepr::V6(h) => h.traffic_class = ecn,
            }
        }
        // IPv6: every covered field is known. IPv4: the ID is not (a UDP socket cannot see
        // it); one pass solves for it — srdma peers send 0 (or 0, 1, 2, … across a GSO run,
        // which reaches us uncut over veth: the place in the GRO buffer is the likely ID),
        // rxe and NICs others. A ring carries no ICRC worth checking: it protects nothing
        // inside one host's memory.
        let ident = match (via, encap.ip) {
            (Via::SharedMemory(_) | Via::Pulled(..), _) => Some(0),
            (Via::Udp { place, .. }, IpRepr::V4(_)) => {
                st.counters.rx_datagrams += 1;
                srdma_wire::icrc::verify_ipv4_ident_guess(&encap, data, place, &mut st.rx.icrc).ok()
            }
            (Via::Udp { .. }, IpRepr::V6(_)) => {
                st.counters.rx_datagrams += 1;
                srdma_wire::icrc::verify_with_memo(&encap, data, &mut st.rx.icrc)
                    .ok()
                    .map(|()| 0)
            }
        };
        if let (Via::SharedMemory(_), Some(w)) = (via, st.capture.as_mut()) {
            // Captured with the ICRC it would carry over UDP, so that it checks.
            let mut pkt = data.to_vec();
            let _ = srdma_wire::Packet::new_unchecked(&mut pkt[..]).fill_icrc(&encap);
            let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &encap, &pkt);
        } else if let Some(w) = st.capture.as_mut() {
            // Captured with the Identification the datagram carried, so its ICRC checks.
            let mut e = encap;
            if let (IpRepr::V4(h), Some(id)) = (&mut e.ip, ident) {
                h.ident = id;
            }
            let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &e, data);
        }
        // rxe's order: the structure first (length, version, opcode, headers), the ICRC last.
        // One parse serves both: the repr is used only once the ICRC has verified. From a
        // ring, the headers come from our own copy and the payload from the ring (placed
        // with one copy, not two).
        let parsed = match via {
            Via::SharedMemory(head) => {
                PacketRepr::parse_head(head, data.len()).map(|(mut repr, payload)| {
                    repr.payload = &data[payload];
                    repr
                })
            }
            // Its payload stays in the sender's memory: the transport gets a stand-in of its
            // length, which it only writes to memory (a READ response's bytes go nowhere
            // else), and the store notes where those writes go (`crate::pull`).
            Via::Pulled(head, p) => {
                PacketRepr::parse_head(head, p.len).and_then(|(mut repr, payload)| {
                    let spans: u64 = p.spans.iter().map(|s| s.1).sum();
                    if repr.bth.opcode.kind() != Kind::ReadResponse || spans != payload.len() as u64
                    {
                        return Err(srdma_wire::Error::LengthMismatch {
                            opcode: repr.bth.opcode,
                            len: payload.len(),
                            reason: "a pulled payload is a READ response's, as long as its spans",
                        });
                    }
                    repr.payload = crate::pull::stand_in(payload.len());
                    Ok(repr)
                })
            }
            Via::Udp { .. } => PacketRepr::parse_bytes(data),
        };
        let Ok(repr) = parsed else {
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
            // Counted here, and handed to its QP like any packet (DCQCN: its rate drops).
            st.counters.rx_cnp += 1;
        }
        if matches!(
            repr.bth.opcode.kind(),
            Kind::ReadRequest | Kind::CompareSwap | Kind::FetchAdd
        ) {
            st.timing.spin.one_sided(now.as_nanos() as u64);
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
            rx: RxState { touched, .. },
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
        let srq_id = match &xrc_srq {
            Some(found) => found.as_ref().map(|&(id, _)| id),
            None => slot.srq,
        };
        let srq = srq_id.and_then(|id| srqs.get_mut(&id));
        if let Via::Pulled(_, p) = via {
            mem.pulls.begin(p.pid, qpn, p.spans);
        }
        let mut ctx = Ctx { now, mrs, mem, srq };
        let silent = slot.qp.silent_writes();
        slot.qp.handle_packet(&mut ctx, &repr, &RecvMeta { encap });
        srq_limit(slot, srq_id, ctx.srq);
        mem.pulls.end();
        if let Some(Some((_, cq))) = &xrc_srq {
            super::xrc::complete_to(&mut slot.qp, cq);
        }
        if slot.qp.silent_writes() != silent {
            let until = silent_writes_until(now);
            self.silent_writes_until
                .store(until.as_nanos() as u64, Ordering::Relaxed);
        }
        if !std::mem::replace(&mut slot.touched, true) {
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
            rx: RxState {
                touched, groups, ..
            },
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
            srq_limit(slot, slot.srq, ctx.srq);
            if !std::mem::replace(&mut slot.touched, true) {
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
        if let Some(g) = st.rx.groups.iter_mut().find(|g| g.ip == ip) {
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
        if st.rx.groups.len() >= MAX_MCAST_GRP as usize {
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
        st.rx.groups.push(Group {
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
        st.rx.groups.retain_mut(|g| {
            if ip.is_none_or(|ip| ip == g.ip) {
                let before = g.qpns.len();
                g.qpns.retain(|&q| q != qpn);
                found |= g.qpns.len() != before;
            }
            // Closing the socket leaves the group (and the epoll set).
            !g.qpns.is_empty()
        });
        if st.rx.groups.is_empty() {
            self.groups_fd.store(-1, Ordering::SeqCst);
        }
        found
    }

    /// Whether QP `qpn` is attached to some multicast group.
    pub(crate) fn in_group(st: &State, qpn: u32) -> bool {
        st.rx.groups.iter().any(|g| g.qpns.contains(&qpn))
    }

    /// Takes `qpns` off the touched list's bookkeeping (they are flushed now).
    fn untouch(&self, st: &mut State, qpns: &[u32]) {
        for qpn in qpns {
            if let Some(s) = st.qps.get_mut(qpn) {
                s.touched = false;
            }
        }
    }

    /// The RoCEv2 encapsulation of a datagram from `from` to `to` on the device's port.
    fn encap_between(&self, from: SocketAddr, to: IpAddr) -> Option<Encap> {
        let ip = IpRepr::between(from.ip(), to).ok()?;
        Some(Encap {
            ip,
            src_port: from.port(),
            dst_port: self.local.port(),
        })
    }
}

/// Raises `SrqLimitReached` when the receive QP `slot` just handled took SRQ `id` below its
/// armed limit (rxe's get_srq_wqe: the event goes out as the WQE is taken).
fn srq_limit(slot: &super::QpSlot, id: Option<u32>, srq: Option<&mut srdma_proto::Srq>) {
    if let (Some(id), Some(srq)) = (id, srq)
        && srq.take_limit_event()
    {
        slot.send_cq
            .raise(crate::AsyncEvent::SrqLimitReached { srq: id });
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::{
        AccessFlags, ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RKey, RemoteQp,
        SendOp, SendWr, SgeList, ShmPull, WcStatus,
    };
    use srdma_wire::Psn;

    /// Two devices of this process through shared memory, READ responses pulled. Once every
    /// pull fails (as when the responder's process is gone), the READ completes with
    /// RETRY_EXC_ERR — never with success over bytes that were not placed — and its QP is in
    /// ERR; the reads before it brought the responder's bytes.
    #[test]
    fn a_read_whose_payload_cannot_be_pulled_fails_its_qp() {
        let open = |ip: [u8; 4]| {
            let mut c = DeviceConfig::new(ip.into());
            c.share_port = false;
            // Whatever `SRDMA_SHM` says (the test script runs this crate with it off too).
            c.shm = true;
            c.shm_pull = ShmPull::Always;
            Device::open(c).unwrap()
        };
        let (a, b) = (open([127, 0, 33, 1]), open([127, 0, 33, 2]));
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let (ca, cb) = (
            a.create_cq(16, None).unwrap(),
            b.create_cq(16, None).unwrap(),
        );
        let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
        let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
        let (ma, mb) = (
            pa.reg_mr(1 << 20, access).unwrap(),
            pb.reg_mr(1 << 20, access).unwrap(),
        );
        let remote = |d: &Device, q: &crate::Qp| RemoteQp {
            qpn: q.qpn(),
            psn: Psn::new(1),
            gid: d.local_gid(),
            port: d.local_addr().port(),
        };
        let params = ConnectParams::new(Mtu::Mtu4096, Psn::new(1));
        qa.connect(&remote(&b, &qb), &params).unwrap();
        qb.connect(&remote(&a, &qa), &params).unwrap();
        let bytes: Vec<u8> = (0..1 << 20).map(|i| (i * 13 + 5) as u8).collect();
        mb.write(0, &bytes).unwrap();
        let r = mb.remote().unwrap();
        let read = |id| {
            let op = SendOp::Read {
                remote_addr: r.addr,
                rkey: RKey(r.rkey),
            };
            qa.post_send(SendWr::new(id, op, SgeList::one(ma.sge(0, 1 << 20))))
                .unwrap();
            let start = Instant::now();
            loop {
                if let Some(wc) = ca.poll_one() {
                    break wc;
                }
                assert!(start.elapsed() < Duration::from_secs(10), "no completion");
            }
        };
        // The first READ makes the link both ways (b learns that a pulls), the second
        // goes by pulls.
        for id in 0..2 {
            assert_eq!(read(id).status, WcStatus::Success);
        }
        let mut got = vec![0; 1 << 20];
        ma.read(0, &mut got).unwrap();
        assert!(got == bytes);
        let c = a.counters();
        assert!(c.rx_shm_pulled >= 256, "{c:?}");
        a.h.shared.lock().mem.pulls.fail_all = true;
        let wc = read(2);
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExcErr));
        assert_eq!(qa.state(), crate::QpState::Err);
        assert!(a.counters().rx_shm_pull_failed > 0);
    }
}
