//! The shared-memory driver: RoCEv2 packets to srdma devices of this host (same network
//! namespace, same user) travel through rings in shared memory instead of the kernel's UDP
//! stack.
//!
//! It carries exactly the packets the UDP driver would (the engine, the transport and every
//! check stay the same), less the ICRC, which protects nothing inside one host's memory. A
//! device sends to a peer through a one-way *link*: a ring it produces into (a sealed
//! memfd, see [`ring`]) and a socket pair, both handed to the peer over its rendezvous
//! socket ([`port`]). The peer checks the sender's credentials (the kernel's
//! `SCM_CREDENTIALS`: same user) and reads the ring whenever it receives; the socket pair
//! carries doorbells to a peer that sleeps, and tells each side when the other went (its
//! process exited or closed the device), which ends the link: a restarted peer gets a new
//! one, an exited one's ring memory is freed with the last mapping.
//!
//! A full ring never drops a connected QP's packet: the engine asks for room
//! ([`Shm::has_room`]) before it has the QP build one, and a QP that finds none waits (its
//! packets stay in its send queue) until the peer has read — memory is not a network, and
//! nothing sent between two processes of one host is ever retransmitted for want of room
//! (4,096 QPs streaming into one ring used to turn drops into retry exhaustion). Only what
//! is built before its route is known (UD) can still find a ring full, and is dropped as a
//! full socket buffer drops it. A peer that froze or died leaves its QPs' peers to their
//! retry timers exactly as over UDP. What cannot be routed here — QP0/QP1 (the port keeper steers CM MADs by content),
//! multicast, peers in other namespaces or of other users, kernel rxe and every off-host
//! peer — goes over UDP, byte for byte as before.

pub(crate) mod port;
pub(crate) mod ring;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use ring::{Consumer, Producer, Push, Record};

use crate::driver::{Driver, Frame, Outgoing, Payload, Pulled, Received, Via};
use crate::pull::{MAX_SPANS, Span};
use crate::types::ShmPull;

/// Bytes of one ring (header and records): 8 MiB of records hold a QP's largest window
/// (1024 PSNs of 4 KiB) with room to spare, so a QP whose packets take a ring starts with
/// that window (`Qp::path_holds_window`).
pub(crate) const RING_LEN: usize = ring::HEADER_LEN + (8 << 20);
const _: () = {
    // The largest packet (IB MTU 4096, every header, the ICRC's room) with its record header.
    let record = 4096 + srdma_wire::MAX_HEADER_LEN + srdma_wire::icrc::ICRC_LEN + 8;
    assert!(
        RING_LEN - ring::HEADER_LEN
            >= (srdma_proto::transport::MAX_WINDOW_PSNS as usize + 1) * record
    );
};
/// Packets taken from each ring per receive batch ([`Driver::recv`]).
pub(crate) const RECV_BATCH: usize = 64;
/// How long a destination found without a same-host device goes over UDP before it is
/// looked up again.
const RETRY_NS: u64 = 1_000_000_000;

/// Whether shared memory is on by default: `SRDMA_SHM=0` turns it off.
pub(crate) fn enabled_by_env() -> bool {
    std::env::var_os("SRDMA_SHM").is_none_or(|v| v != "0")
}

/// Where packets to one peer device go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Through the out-link in this slot of `outs`.
    Link(usize),
    /// Over UDP, until (ns since the engine's epoch) it is looked up again.
    Udp(u64),
}

/// A link this device produces into.
struct Out {
    /// The peer it goes to (address, slot of the destination QPNs).
    key: (SocketAddr, u8),
    ring: Producer,
    sock: OwnedFd,
    /// Pushed since the last doorbell check.
    dirty: bool,
    /// The last push found the ring full (the peer's liveness was asked then).
    full: bool,
    /// The peer may read this process's memory: READ response payloads stay where they
    /// are (the peer said so, see `port::offer_pulls`).
    pull: bool,
}

/// A link a peer produces into.
struct In {
    /// The peer's address: the source of its packets.
    from: SocketAddr,
    ring: Consumer,
    /// `None` once the peer went: what it published before is still taken (as datagrams
    /// already in a socket's buffer are), then the link ends.
    sock: Option<OwnedFd>,
    /// The peer's process.
    pid: i32,
    /// This process may pull payloads from the peer's memory.
    may_pull: bool,
}

/// What the driver counted (the engine adds them to the device's counters).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Packets sent through rings.
    pub(crate) tx_packets: u64,
    /// Packets dropped because a ring was full.
    pub(crate) tx_full: u64,
    /// Packets received from rings.
    pub(crate) rx_packets: u64,
    /// Links made to peers.
    pub(crate) links_out: u64,
    /// Links peers made to this device.
    pub(crate) links_in: u64,
    /// Links ended because the peer broke the ring's rules, or offers refused.
    pub(crate) refused: u64,
    /// Packets sent with their payload left in this process's memory.
    pub(crate) tx_pulls: u64,
    /// Records of pulled packets that did not check (dropped).
    pub(crate) rx_bad_pulls: u64,
}

/// A device's side of the shared-memory driver.
pub(crate) struct Shm {
    port: port::Port,
    /// The device's address: what its packets' receivers see as their source.
    me: SocketAddr,
    /// Every link's socket, by descriptor: one descriptor to poll for all of them.
    ep: OwnedFd,
    routes: HashMap<(SocketAddr, u8), Route>,
    /// The last route looked up (an RC QP sends to one peer): the link, or UDP until when.
    last: Option<((SocketAddr, u8), Route)>,
    outs: Vec<Option<Out>>,
    ins: Vec<In>,
    /// The private copy of each packet's headers (see [`Shm::drain`]).
    head: [u8; srdma_wire::MAX_HEADER_LEN],
    /// The private copy of a pulled packet's spans.
    spans: [Span; MAX_SPANS],
    /// When packets leave their payload for the peer to pull.
    pulls: ShmPull,
    /// The host's CPUs (not this process's affinity: an MPI rank bound to one core still
    /// has its own), and the other processes that produce into this device's rings (see
    /// [`ShmPull::Crowded`]).
    cpus: usize,
    peers: usize,
    /// Threads between [`Shm::arm`] and [`Shm::disarm`].
    armed: u32,
    pub(crate) counts: Counts,
}

impl Shm {
    /// Opens the driver of the device at `me`, slot `slot` of a shared port (`None`:
    /// unshared).
    /// `pulls`: when READ responses leave their payload for the peer to pull.
    pub(crate) fn open(me: SocketAddr, slot: Option<u8>, pulls: ShmPull) -> std::io::Result<Shm> {
        crate::pull::watch_fork();
        Ok(Shm {
            port: port::Port::bind(me, slot)?,
            me,
            ep: crate::sys::epoll()?,
            routes: HashMap::new(),
            last: None,
            outs: Vec::new(),
            ins: Vec::new(),
            head: [0; srdma_wire::MAX_HEADER_LEN],
            spans: [(0, 0); MAX_SPANS],
            pulls,
            cpus: crate::sys::online_cpus(),
            peers: 0,
            armed: 0,
            counts: Counts::default(),
        })
    }

    /// The descriptors to poll: the rendezvous socket (offers) and the links' epoll set
    /// (doorbells, ends). When either is readable, call [`Shm::service`].
    pub(crate) fn fds(&self) -> [RawFd; 2] {
        [self.port.fd(), self.ep.as_raw_fd()]
    }

    /// Whether some peer produces into this device (its rings must be read).
    pub(crate) fn has_ins(&self) -> bool {
        !self.ins.is_empty()
    }

    /// How many peers produce into this device.
    pub(crate) fn ins(&self) -> usize {
        self.ins.len()
    }

    /// Offers a ring to the device at `key`, if one lives in this namespace: its slot name
    /// (a shared port), or its unshared name.
    fn connect(&mut self, key: (SocketAddr, u8)) -> Option<usize> {
        let (dst, slot) = key;
        let names = [
            (slot != 0).then(|| port::name_of(dst, Some(slot))),
            Some(port::name_of(dst, None)),
        ];
        for name in names.into_iter().flatten() {
            if !self.port.exists(&name) {
                continue;
            }
            let Ok((ring, sock)) = self.port.offer(&name, self.me, RING_LEN) else {
                continue;
            };
            if crate::sys::epoll_add(&self.ep, sock.as_raw_fd()).is_err() {
                return None;
            }
            let out = Out {
                key,
                ring,
                sock,
                dirty: false,
                full: false,
                pull: false,
            };
            self.counts.links_out += 1;
            let i = match self.outs.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    self.outs.push(None);
                    self.outs.len() - 1
                }
            };
            self.outs[i] = Some(out);
            return Some(i);
        }
        None
    }

    /// Publishes a packet of `len` bytes, written by `fill` (false: withdrawn), on out-link
    /// `i`. False when it was not sent (ring full, withdrawn, or the link just ended).
    pub(crate) fn push(
        &mut self,
        i: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        self.push_as(i, Record::Packet, len, fill)
    }

    /// [`Shm::push`] of a record of kind `record`.
    fn push_as(
        &mut self,
        i: usize,
        record: Record,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let Some(out) = self.outs.get_mut(i).and_then(Option::as_mut) else {
            return false;
        };
        match out.ring.push_as(record, len, fill) {
            Ok(Push::Withdrawn) => false,
            Ok(Push::Done) => {
                out.dirty = true;
                out.full = false;
                self.counts.tx_packets += 1;
                true
            }
            Ok(Push::Full) => {
                self.counts.tx_full += 1;
                // A peer that went without a word (the socket pair tells the progress
                // thread, which may not have looked yet): ask the socket, once per run of
                // full pushes (not a system call per dropped packet).
                if !std::mem::replace(&mut out.full, true) && port::ring_bell(&out.sock).is_err() {
                    self.end_out(i, None);
                }
                false
            }
            Err(ring::Corrupt) => {
                self.counts.refused += 1;
                self.end_out(i, Some(u64::MAX));
                false
            }
        }
    }

    /// Whether out-link `i` has room for a packet of `len` bytes now. A link that just ended
    /// (its destination goes over UDP from now on) has room. No room: the peer is asked
    /// whether it is still there, once per run of full looks, as a full push asks.
    pub(crate) fn has_room(&mut self, i: usize, len: usize) -> bool {
        let Some(out) = self.outs.get_mut(i).and_then(Option::as_mut) else {
            return true;
        };
        match out.ring.has_room(len) {
            Ok(true) => true,
            Ok(false) => {
                if !std::mem::replace(&mut out.full, true) && port::ring_bell(&out.sock).is_err() {
                    self.end_out(i, None);
                    return true;
                }
                false
            }
            Err(ring::Corrupt) => {
                self.counts.refused += 1;
                self.end_out(i, Some(u64::MAX));
                true
            }
        }
    }

    /// Rings the doorbell of every peer that got packets since the last call and sleeps.
    pub(crate) fn ring_bells(&mut self) {
        for i in 0..self.outs.len() {
            let Some(out) = self.outs[i].as_mut() else {
                continue;
            };
            if !std::mem::take(&mut out.dirty) || !out.ring.wants_bell() {
                continue;
            }
            if port::ring_bell(&out.sock).is_err() {
                self.end_out(i, None);
            }
        }
    }

    /// Ends out-link `i`; its destination goes over UDP until `udp_until` (`None`: is
    /// looked up again at once — a restarted peer gets a new link).
    fn end_out(&mut self, i: usize, udp_until: Option<u64>) {
        let Some(out) = self.outs.get_mut(i).and_then(Option::take) else {
            return;
        };
        self.last = None;
        match udp_until {
            Some(t) => {
                self.routes.insert(out.key, Route::Udp(t));
            }
            None => {
                self.routes.remove(&out.key);
            }
        }
    }

    /// Takes up to `max` packets from each in-link, handing each to `f` with its source, a
    /// private copy of its first [`srdma_wire::MAX_HEADER_LEN`] bytes (all its headers; the
    /// whole packet if shorter) and the whole packet where it lies in the ring: parse the
    /// headers from the copy (`PacketRepr::parse_head`), copy the payload from the ring.
    /// A packet whose payload stayed in its sender's memory comes with where it is
    /// ([`Pulled`]) and only its other bytes. Returns how many it took, and whether some
    /// ring gave `max` (more may wait there).
    pub(crate) fn drain(
        &mut self,
        max: usize,
        mut f: impl FnMut(SocketAddr, &[u8], &[u8], Option<Pulled<'_>>),
    ) -> (usize, bool) {
        let mut n = 0;
        let mut cut = false;
        let mut ended = false;
        let Shm {
            ins,
            head,
            spans,
            counts,
            ..
        } = self;
        for link in ins.iter_mut() {
            if link.ring.is_empty() {
                ended |= link.sock.is_none();
                continue;
            }
            let (from, pid) = (link.from, link.may_pull.then_some(link.pid));
            let r = link.ring.pop(head, max, |kind, h, d| match (kind, pid) {
                (Record::Packet, _) => f(from, h, d, None),
                (Record::Pull, Some(pid)) => match unpack_pull(h, d, pid, spans) {
                    Some((h, p)) => f(from, h, &[], Some(p)),
                    None => counts.rx_bad_pulls += 1,
                },
                // Pulls this side never offered.
                (Record::Pull, None) => counts.rx_bad_pulls += 1,
            });
            match r {
                Ok(k) => {
                    n += k;
                    cut |= k == max;
                    ended |= link.sock.is_none() && link.ring.is_empty();
                }
                Err(ring::Corrupt) => {
                    if let Some(sock) = &link.sock {
                        port::refuse(sock);
                    }
                    counts.refused += 1;
                    ended = true;
                }
            }
        }
        if ended {
            // Corrupt rings, and rings of peers that went once they are empty.
            ins.retain(|l| !l.ring.is_corrupt() && (l.sock.is_some() || !l.ring.is_empty()));
            self.peers = processes(&self.ins);
        }
        counts.rx_packets += n as u64;
        (n, cut)
    }

    /// The caller (a thread about to sleep on [`Shm::fds`]) wants doorbells for what peers
    /// send from now on; returns false if some ring has packets already (then it must not
    /// sleep). Every `arm` is followed by one [`Shm::disarm`].
    pub(crate) fn arm(&mut self) -> bool {
        self.armed += 1;
        let mut empty = true;
        for link in &self.ins {
            empty &= link.ring.arm();
        }
        empty
    }

    /// The caller of [`Shm::arm`] woke.
    pub(crate) fn disarm(&mut self) {
        self.armed = self.armed.saturating_sub(1);
        for link in &self.ins {
            link.ring.disarm();
        }
    }

    /// Handles what the descriptors of [`Shm::fds`] say: new offers, doorbells, links whose
    /// other end went or refused.
    /// `port`: the rendezvous socket polled readable (an offer may wait); without it only
    /// the links are looked at (a system call fewer on every doorbell).
    pub(crate) fn service(&mut self, now: u64, port: bool) {
        let pulls = self.pulls != ShmPull::Never;
        while let Some(offer) = port.then(|| self.port.accept(pulls)).flatten() {
            let Ok(hello) = offer else {
                self.counts.refused += 1;
                continue;
            };
            match Consumer::attach(hello.mem) {
                Some(ring) if crate::sys::epoll_add(&self.ep, hello.link.as_raw_fd()).is_ok() => {
                    ring.set_sleepers(self.armed);
                    self.counts.links_in += 1;
                    if hello.may_pull {
                        port::offer_pulls(&hello.link);
                    }
                    self.ins.push(In {
                        from: hello.from,
                        ring,
                        sock: Some(hello.link),
                        pid: hello.pid,
                        may_pull: hello.may_pull,
                    });
                    self.peers = processes(&self.ins);
                }
                _ => {
                    self.counts.refused += 1;
                    port::refuse(&hello.link);
                }
            }
        }
        let mut ready = [0 as RawFd; 64];
        let n = crate::sys::epoll_ready(&self.ep, &mut ready);
        for &fd in &ready[..n] {
            let is = |l: &In| l.sock.as_ref().is_some_and(|s| s.as_raw_fd() == fd);
            if let Some(k) = self.ins.iter().position(is) {
                // A doorbell is for every thread that armed: while one still sleeps (or is
                // on its way into `poll`, past its last look at the rings), it stays there
                // for that one to see — taken here, it would be lost to it, and the peer
                // rings once per nap. The last thread to disarm takes it.
                if self.armed > 0 {
                    continue;
                }
                let link = &mut self.ins[k];
                if link.sock.as_ref().map(port::read_link) != Some(port::LinkNews::Bells) {
                    // The peer went (or refuses): its socket leaves the epoll set; what it
                    // published before is still taken (`drain`), then the link ends.
                    link.sock = None;
                    if link.ring.is_empty() || link.ring.is_corrupt() {
                        self.ins.swap_remove(k);
                        self.peers = processes(&self.ins);
                    }
                }
                continue;
            }
            let out = self
                .outs
                .iter()
                .position(|o| o.as_ref().is_some_and(|o| o.sock.as_raw_fd() == fd));
            if let Some(i) = out {
                let mut news = port::read_link(&self.outs[i].as_ref().expect("found").sock);
                if news == port::LinkNews::Pulls {
                    // Said once, when the peer took the link; what it says next may follow.
                    let out = self.outs[i].as_mut().expect("found");
                    out.pull = true;
                    news = port::read_link(&out.sock);
                }
                match news {
                    port::LinkNews::Bells | port::LinkNews::Pulls => {}
                    port::LinkNews::Refused => {
                        self.counts.refused += 1;
                        self.end_out(i, Some(now.saturating_add(RETRY_NS)));
                    }
                    port::LinkNews::Gone => self.end_out(i, None),
                }
            }
        }
    }
}

impl Driver for Shm {
    /// An out-link (its slot).
    type Link = usize;

    /// The out-link for a packet to QP `dqpn` at `dst` (`now`: ns since the engine's epoch),
    /// or `None`: UDP.
    fn route(&mut self, dst: SocketAddr, dqpn: u32, now: u64) -> Option<usize> {
        // QP0/QP1 (steered by content on a shared port) and multicast stay on UDP.
        if dqpn <= 1 || dqpn == srdma_wire::Qpn::MULTICAST.value() {
            return None;
        }
        let key = (dst, (dqpn >> 16) as u8);
        // One lookup per destination, not per packet (off-host peers included).
        let route = match self.last {
            Some((k, r)) if k == key => Some(r),
            _ => self.routes.get(&key).copied(),
        };
        let route = match route {
            Some(Route::Udp(until)) if now >= until => None,
            r => r,
        };
        let route = route.unwrap_or_else(|| {
            let r = self
                .connect(key)
                .map_or(Route::Udp(now.saturating_add(RETRY_NS)), Route::Link);
            self.routes.insert(key, r);
            r
        });
        self.last = Some((key, route));
        match route {
            Route::Link(i) => Some(i),
            Route::Udp(_) => None,
        }
    }

    /// Copies the packet into the link's ring, its payload straight from registered memory
    /// (the one copy); no ICRC is computed (a ring carries none worth checking). False when
    /// it was not sent (ring full, a piece gone, the link just ended).
    fn queue(
        &mut self,
        link: usize,
        pkt: &Outgoing<'_>,
        frame: &mut Frame,
        payload: &impl Payload,
    ) -> bool {
        let base = frame.as_ptr() as usize;
        let bytes = &frame[..pkt.len];
        let crowded = match self.pulls {
            ShmPull::Never => false,
            ShmPull::Always => true,
            ShmPull::Crowded => self.peers + 1 > self.cpus,
        };
        let pulls = pkt.pullable
            && crowded
            && crate::pull::may_lend()
            && self
                .outs
                .get(link)
                .is_some_and(|o| o.as_ref().is_some_and(|o| o.pull));
        if let Some(layout) = pulls
            .then(|| PullLayout::of(bytes, base, payload))
            .flatten()
        {
            let sent = self.push_as(link, Record::Pull, layout.record_len(pkt.len), |out| {
                layout.write(out, bytes, payload)
            });
            self.counts.tx_pulls += u64::from(sent);
            return sent;
        }
        self.push(link, pkt.len, |out| assemble(out, bytes, base, payload))
    }

    /// Rings the doorbells (see [`Shm::ring_bells`]); a ring refuses nothing here.
    fn flush(&mut self) -> usize {
        self.ring_bells();
        0
    }

    /// Up to [`RECV_BATCH`] packets from each in-link (see [`Shm::drain`]).
    fn recv(&mut self, mut f: impl FnMut(SocketAddr, &[u8], Via<'_>)) -> Received {
        let (taken, full) = self.drain(RECV_BATCH, |from, head, data, pulled| match pulled {
            Some(p) => f(from, data, Via::Pulled(head, p)),
            None => f(from, data, Via::SharedMemory(head)),
        });
        Received {
            taken,
            full,
            unreadable: 0,
        }
    }

    /// Copies what the driver counted into the device's counters.
    fn count_into(&self, c: &mut crate::types::DeviceCounters) {
        let k = &self.counts;
        c.tx_shm_packets = k.tx_packets;
        c.rx_shm_packets = k.rx_packets;
        c.tx_shm_full = k.tx_full;
        c.shm_links_out = k.links_out;
        c.shm_links_in = k.links_in;
        c.shm_refused = k.refused;
        c.tx_shm_pulls = k.tx_pulls;
    }
}

/// How many other processes produce into `ins` (a process with several devices has a
/// link from each; one may have a link from a device of its own).
fn processes(ins: &[In]) -> usize {
    let mut pids: Vec<i32> = ins.iter().map(|l| l.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    pids.len() - usize::from(pids.binary_search(&me).is_ok())
}

/// How a packet whose payload stays in this process's memory is laid out in its record:
/// the packet's bytes before the payload (headers) and after it (pad, ICRC), then the
/// payload's spans (address and length, `u64` LE each), then the packet's length and the
/// number of spans (`u32` LE each).
struct PullLayout {
    /// Where the payload starts in the packet, and its length.
    at: usize,
    len: usize,
    /// Spans.
    n: usize,
}

/// Bytes after the spans: the packet's length, the number of spans.
const PULL_FOOTER: usize = 8;

impl PullLayout {
    /// The layout of the packet `frame` (whose address is `base`), if its payload may stay
    /// where it is: pieces that follow each other in the packet, long enough to be worth a
    /// pull, still there.
    fn of(frame: &[u8], base: usize, payload: &impl Payload) -> Option<PullLayout> {
        let n = payload.count();
        if n == 0 || n > MAX_SPANS {
            return None;
        }
        let start = payload.place(0).0.wrapping_sub(base);
        let mut end = start;
        for i in 0..n {
            let (dst, len) = payload.place(i);
            if dst.wrapping_sub(base) != end || payload.bytes(i).is_none() {
                return None;
            }
            end += len;
        }
        let len = end - start;
        let fits = end <= frame.len()
            && (crate::pull::MIN_PAYLOAD..=crate::pull::MAX_PAYLOAD).contains(&len);
        fits.then_some(PullLayout { at: start, len, n })
    }

    fn record_len(&self, pkt_len: usize) -> usize {
        pkt_len - self.len + 16 * self.n + PULL_FOOTER
    }

    /// Writes the record into `out` (`record_len` bytes). False when a piece is gone.
    fn write(&self, out: &mut [u8], frame: &[u8], payload: &impl Payload) -> bool {
        let (at, rest) = (self.at, frame.len() - self.at - self.len);
        out[..at].copy_from_slice(&frame[..at]);
        out[at..at + rest].copy_from_slice(&frame[at + self.len..]);
        let mut w = at + rest;
        for i in 0..self.n {
            let Some(b) = payload.bytes(i) else {
                return false;
            };
            out[w..w + 8].copy_from_slice(&(b.as_ptr() as u64).to_le_bytes());
            out[w + 8..w + 16].copy_from_slice(&(b.len() as u64).to_le_bytes());
            w += 16;
        }
        out[w..w + 4].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        out[w + 4..w + 8].copy_from_slice(&(self.n as u32).to_le_bytes());
        true
    }
}

/// Reads the record of a pulled packet (see [`PullLayout`]) from `pid`: `head`, the private
/// copy of its first bytes, and `rec`, the record where it lies. Returns the packet's
/// headers (from `head`) and where its payload is, the spans copied into `spans`; `None`
/// when the record does not check (its payload must be as long as its spans say).
fn unpack_pull<'h>(
    head: &'h [u8],
    rec: &[u8],
    pid: i32,
    spans: &'h mut [Span; MAX_SPANS],
) -> Option<(&'h [u8], Pulled<'h>)> {
    let l = rec.len();
    let mut footer = [0u8; PULL_FOOTER];
    footer.copy_from_slice(rec.get(l.checked_sub(PULL_FOOTER)?..)?);
    let pkt_len = u32::from_le_bytes(footer[..4].try_into().ok()?) as usize;
    let n = u32::from_le_bytes(footer[4..].try_into().ok()?) as usize;
    if n == 0 || n > MAX_SPANS {
        return None;
    }
    let frame_len = l.checked_sub(PULL_FOOTER + 16 * n)?;
    let mut total = 0u64;
    for (i, s) in spans.iter_mut().take(n).enumerate() {
        let at = frame_len + 16 * i;
        let mut b = [0u8; 16];
        b.copy_from_slice(&rec[at..at + 16]);
        *s = (
            u64::from_le_bytes(b[..8].try_into().ok()?),
            u64::from_le_bytes(b[8..].try_into().ok()?),
        );
        total = total.checked_add(s.1)?;
    }
    let payload = pkt_len.checked_sub(frame_len)?;
    if total != payload as u64 || payload > crate::pull::MAX_PAYLOAD {
        return None;
    }
    let head = &head[..head.len().min(frame_len)];
    Some((
        head,
        Pulled {
            len: pkt_len,
            pid,
            spans: &spans[..n],
        },
    ))
}

/// Writes the packet built in `frame` (whose address is `base`) into `out` (as long as the
/// packet): its headers and gaps from `frame`, the payload pieces from registered memory.
/// False when a piece is gone (the packet must not leave).
fn assemble(out: &mut [u8], frame: &[u8], base: usize, payload: &impl Payload) -> bool {
    let len = out.len();
    let mut at = 0;
    for i in 0..payload.count() {
        let (dst, plen) = payload.place(i);
        let off = dst.wrapping_sub(base);
        let (Some(src), true) = (payload.bytes(i), off >= at && off + plen <= len) else {
            return false;
        };
        out[at..off].copy_from_slice(&frame[at..off]);
        out[off..off + plen].copy_from_slice(src);
        at = off + plen;
    }
    out[at..].copy_from_slice(&frame[at..len]);
    true
}

impl In {
    #[cfg(test)]
    fn ring_mem_for_test(&self) -> (*mut u8, usize) {
        self.ring.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn readable(fd: RawFd) -> bool {
        crate::sys::poll_readable([fd], Some(std::time::Duration::from_millis(200))).unwrap()[0]
    }

    #[test]
    fn packets_cross_a_link_with_doorbells_and_the_link_ends_with_its_producer() {
        // Port numbers no device of another test uses.
        let (a_at, b_at) = (addr("127.0.0.1:47911"), addr("127.0.0.1:47912"));
        let mut a = Shm::open(a_at, None, ShmPull::Always).unwrap();
        let mut b = Shm::open(b_at, Some(3), ShmPull::Always).unwrap();
        // No device at that address and slot: UDP (and remembered).
        assert_eq!(a.route(addr("127.0.0.1:47913"), 0x30011, 0), None);
        assert_eq!(a.route(b_at, 0x20011, 0), None, "slot 2 is not b");
        assert_eq!(a.route(b_at, 1, 0), None, "QP1 stays on UDP");
        let i = a
            .route(b_at, 0x30011, 0)
            .expect("b's slot 3 is on this host");
        assert!(readable(b.fds()[0]));
        b.service(0, true);
        assert_eq!(b.counts.links_in, 1);
        for k in 0..100u8 {
            assert!(a.push(i, 100 + usize::from(k), |d| {
                d.fill(k);
                true
            }));
        }
        a.ring_bells();
        let mut got = Vec::new();
        // A batch that stops at its limit says more may wait; the last one does not.
        assert_eq!(
            b.drain(60, |from, _, d, _| got.push((from, d.to_vec()))),
            (60, true)
        );
        assert_eq!(
            b.drain(60, |from, _, d, _| got.push((from, d.to_vec()))),
            (40, false)
        );
        assert_eq!(got.len(), 100);
        assert!(got.iter().all(|(from, _)| *from == a_at));
        assert!(
            got.iter()
                .enumerate()
                .all(|(k, (_, d))| d.len() == 100 + k && d.iter().all(|&x| x == k as u8))
        );
        // b sleeps: the next push rings its doorbell.
        assert!(b.arm());
        assert!(!readable(b.fds()[1]));
        assert!(a.push(i, 10, |_| true));
        a.ring_bells();
        assert!(readable(b.fds()[1]));
        b.disarm();
        b.service(0, true);
        assert_eq!(b.drain(10, |_, _, _, _| {}), (1, false));
        // a goes: b's link ends.
        drop(a);
        assert!(readable(b.fds()[1]));
        b.service(0, true);
        assert!(!b.has_ins());
    }

    #[test]
    fn what_a_producer_published_before_it_went_is_still_taken() {
        let (a_at, b_at) = (addr("127.0.0.1:47916"), addr("127.0.0.1:47917"));
        let mut a = Shm::open(a_at, None, ShmPull::Always).unwrap();
        let mut b = Shm::open(b_at, None, ShmPull::Always).unwrap();
        let i = a.route(b_at, 0x11, 0).unwrap();
        for _ in 0..3 {
            assert!(a.push(i, 40, |_| true));
        }
        // The replies of a UD server that exits right after sending them (udaddy).
        drop(a);
        b.service(0, true);
        assert!(b.has_ins(), "the ring still holds packets");
        assert_eq!(
            b.drain(10, |from, _, _, _| assert_eq!(from, a_at)),
            (3, false)
        );
        assert!(!b.has_ins(), "then the link ends");
    }

    /// Payload pieces at fixed places of a frame (tests).
    struct Pieces<'a> {
        base: usize,
        at: Vec<(usize, &'a [u8])>,
    }

    impl Payload for Pieces<'_> {
        fn count(&self) -> usize {
            self.at.len()
        }

        fn place(&self, i: usize) -> (usize, usize) {
            (self.base + self.at[i].0, self.at[i].1.len())
        }

        fn bytes(&self, i: usize) -> Option<&[u8]> {
            Some(self.at[i].1)
        }
    }

    #[test]
    fn a_pulled_packet_record_carries_its_headers_and_spans_and_garbage_is_refused() {
        let frame: Vec<u8> = (0..4096 + 20 + 4).map(|i| i as u8).collect();
        let src = vec![9u8; 4096];
        let pieces = Pieces {
            base: frame.as_ptr() as usize,
            at: vec![(16, &src[..1000]), (1016, &src[1000..])],
        };
        let layout = PullLayout::of(&frame, pieces.base, &pieces).expect("pullable");
        let len = layout.record_len(frame.len());
        assert_eq!(len, frame.len() - 4096 + 2 * 16 + PULL_FOOTER);
        let mut rec = vec![0u8; len];
        assert!(layout.write(&mut rec, &frame, &pieces));
        let head = rec[..rec.len().min(srdma_wire::MAX_HEADER_LEN)].to_vec();
        let mut spans = [(0, 0); MAX_SPANS];
        let (h, p) = unpack_pull(&head, &rec, 42, &mut spans).expect("checks");
        assert_eq!(&h[..16], &frame[..16], "the headers");
        assert_eq!((p.len, p.pid), (frame.len(), 42));
        let at = src.as_ptr() as u64;
        assert_eq!(p.spans, [(at, 1000), (at + 1000, 3096)]);
        // Pieces with a gap between them, or too short to be worth a pull, keep the copy.
        let gap = Pieces {
            base: pieces.base,
            at: vec![(16, &src[..1000]), (1020, &src[1000..2000])],
        };
        assert!(PullLayout::of(&frame, gap.base, &gap).is_none());
        let short = Pieces {
            base: pieces.base,
            at: vec![(16, &src[..100])],
        };
        assert!(PullLayout::of(&frame, short.base, &short).is_none());
        // A peer's garbage: refused or taken, never a panic; a length that does not add up
        // with the spans is refused.
        let mut bad = rec.clone();
        let l = bad.len();
        bad[l - 8..l - 4].copy_from_slice(&(frame.len() as u32 + 4).to_le_bytes());
        assert!(unpack_pull(&head, &bad, 42, &mut spans).is_none());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..20_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut g = rec.clone();
            g.truncate(n % (rec.len() + 1));
            let k = g.len();
            if k > 0 {
                g[(x as usize) % k] = (x >> 32) as u8;
                g[(x as usize >> 8) % k] = (x >> 40) as u8;
            }
            let _ = unpack_pull(&head, &g, 42, &mut spans);
        }
    }

    #[test]
    fn a_refused_link_sends_its_destination_over_udp() {
        let (a_at, b_at) = (addr("127.0.0.1:47914"), addr("127.0.0.1:47915"));
        let mut a = Shm::open(a_at, None, ShmPull::Always).unwrap();
        let mut b = Shm::open(b_at, None, ShmPull::Always).unwrap();
        let i = a.route(b_at, 0x11, 0).unwrap();
        b.service(0, true);
        // b finds garbage in the ring: it refuses the link.
        assert!(a.push(i, 8, |_| true));
        let (ptr, _) = b.ins[0].ring_mem_for_test();
        // SAFETY (test): the first record's header word, inside the mapping.
        unsafe {
            ptr.add(ring::HEADER_LEN)
                .cast::<u64>()
                .write_volatile(u64::MAX)
        };
        assert_eq!(b.drain(10, |_, _, _, _| {}), (0, false));
        assert!(!b.has_ins());
        assert!(readable(a.fds()[1]));
        a.service(5, true);
        assert_eq!(a.route(b_at, 0x11, 6), None, "refused: UDP for a while");
        assert!(a.route(b_at, 0x11, 6 + RETRY_NS).is_some(), "then again");
    }
}
