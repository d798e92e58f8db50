//! The simulator: hosts, links, the event queue and the virtual clock.

use core::cmp::Ordering;
use core::net::{IpAddr, SocketAddr};
use core::time::Duration;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{self, Write};
use std::path::Path;

use crate::link::{Link, LinkConfig, LinkStats, SimError};
use crate::port::{Bottleneck, Port, PortStats, Verdict};
use crate::tap::{Capture, PCAP_DIR_ENV, Tap};
use crate::time::Instant;

/// A simulated host: what a sans-IO transport (a QP, a device) exposes to the network, in the
/// quinn-proto shape. Time is always an argument; the endpoint never reads a clock.
///
/// Contract: after any `handle_*` call, or after the test touched it through
/// [`Sim::endpoint_mut`], the simulator drains [`poll_transmit`](Endpoint::poll_transmit)
/// and re-reads [`poll_timeout`](Endpoint::poll_timeout). An endpoint that wants to send
/// later (pacing, retry) must say so with a timeout; it is not polled otherwise.
pub trait Endpoint {
    /// A datagram from `src` to `dst` arrived at `now`. `dst` has this host's IP address and
    /// whatever port the sender chose: demultiplexing ports is the endpoint's business.
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: SocketAddr, payload: &[u8]);

    /// [`handle_datagram`](Endpoint::handle_datagram), with the ECN codepoint the datagram
    /// arrived with (see [`crate::ecn`]: a [`crate::Bottleneck`] may have marked it CE). The
    /// default ignores it.
    fn handle_datagram_ecn(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: SocketAddr,
        ecn: u8,
        payload: &[u8],
    ) {
        let _ = ecn;
        self.handle_datagram(now, src, dst, payload);
    }

    /// The next datagram to send, if any: its payload is written into `buf` (empty on entry,
    /// with capacity recycled from earlier datagrams, so steady-state sending allocates
    /// nothing) and its addresses returned. `Transmit::src` need not be this host's address;
    /// the link is chosen by the pair of addresses.
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit>;

    /// When [`handle_timeout`](Endpoint::handle_timeout) should run next; `None` for never.
    /// A past instant fires at once.
    fn poll_timeout(&mut self) -> Option<Instant>;

    /// The instant from [`poll_timeout`](Endpoint::poll_timeout) has come.
    fn handle_timeout(&mut self, now: Instant);
}

impl<T: Endpoint + ?Sized> Endpoint for Box<T> {
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: SocketAddr, payload: &[u8]) {
        (**self).handle_datagram(now, src, dst, payload);
    }
    fn handle_datagram_ecn(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: SocketAddr,
        ecn: u8,
        payload: &[u8],
    ) {
        (**self).handle_datagram_ecn(now, src, dst, ecn, payload);
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        (**self).poll_transmit(now, buf)
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        (**self).poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant) {
        (**self).handle_timeout(now);
    }
}

/// The addresses of a datagram returned by [`Endpoint::poll_transmit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transmit {
    /// Source socket address (UDP source port: the RoCEv2 entropy port).
    pub src: SocketAddr,
    /// Destination socket address (UDP port 4791 for RoCEv2).
    pub dst: SocketAddr,
    /// The ECN codepoint of its IP header (see [`crate::ecn`]; 0: not ECN-capable).
    pub ecn: u8,
}

impl Transmit {
    /// A datagram from `src` to `dst`, not ECN-capable.
    pub const fn new(src: SocketAddr, dst: SocketAddr) -> Transmit {
        Transmit { src, dst, ecn: 0 }
    }
}

/// A host of a simulator: an index in the order of [`Sim::add_host`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(usize);

impl HostId {
    /// The position of the host in the order it was added.
    pub const fn index(self) -> usize {
        self.0
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The condition of [`Sim::run_while`] became false.
    Stopped,
    /// Nothing is in flight, no endpoint has anything to send and no timer is armed.
    Idle,
    /// The next event lies beyond the deadline; the clock now reads the deadline.
    Deadline,
    /// More work than the stall limit happened without the clock moving: almost always a
    /// livelock (an endpoint that always has something to send, a timer that re-arms in the
    /// past, a ping-pong over a zero-latency link). See [`Sim::set_stall_limit`].
    Stalled,
}

/// Why a datagram did not arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Random loss ([`LinkConfig::loss`]).
    Lost,
    /// Tail drop ([`LinkConfig::queue_limit_bytes`]).
    QueueFull,
    /// The link was down when it was sent, or was cut while it was in flight.
    LinkDown,
    /// No host has the destination address, or that host is down.
    Unreachable,
}

/// A datagram as the trace remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatagramInfo {
    /// Source socket address.
    pub src: SocketAddr,
    /// Destination socket address.
    pub dst: SocketAddr,
    /// Payload length.
    pub len: usize,
    /// FNV-1a hash of the payload, so corruption and identity show in a trace.
    pub digest: u64,
}

/// What happened, in a [`TraceEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceKind {
    /// An endpoint handed a datagram to the network.
    Sent(DatagramInfo),
    /// A datagram reached its endpoint (with its bytes as delivered).
    Delivered(DatagramInfo),
    /// A datagram was dropped.
    Dropped(DatagramInfo, DropReason),
    /// A host's timer fired.
    Timeout(HostId),
}

/// One entry of the event trace ([`Sim::enable_trace`]): two runs are the same run exactly
/// when their traces are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceEvent {
    /// Virtual time of the event.
    pub at: Instant,
    /// The event.
    pub kind: TraceKind,
}

/// Default [`Sim::set_stall_limit`]: ten million units of work at one instant.
pub const DEFAULT_STALL_LIMIT: u64 = 10_000_000;

#[derive(Debug)]
struct Host<E> {
    ip: IpAddr,
    endpoint: E,
    up: bool,
    /// Must be polled for transmits and its timer re-read.
    dirty: bool,
    timer: Option<Instant>,
}

/// A datagram on the wire. Ordered by arrival time, then by the order it was scheduled, so
/// ties never depend on anything but the run itself.
#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    link: usize,
    generation: u64,
    src: SocketAddr,
    dst: SocketAddr,
    ecn: u8,
    /// On its way to the destination's bottleneck (not yet through it).
    to_port: bool,
    buf: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    // Reversed: BinaryHeap is a max-heap and the earliest must come out first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A deterministic network of [`Endpoint`]s.
///
/// All randomness comes from the seed given to [`Sim::new`] (each link direction draws from
/// its own stream derived from the seed and its two addresses), the clock is virtual, ties are
/// broken by scheduling order and hosts by [`HostId`], and no hash-map order is involved: the
/// same seed and the same endpoints give the same run, byte for byte.
///
/// Hosts are found by IP address; a link is one direction between two addresses and follows
/// the default [`LinkConfig`] unless given its own. Endpoints are generic so tests reach
/// their concrete type; mix kinds with `Sim<Box<dyn Endpoint>>`.
#[derive(Debug)]
pub struct Sim<E> {
    seed: u64,
    now: Instant,
    hosts: Vec<Host<E>>,
    by_ip: BTreeMap<IpAddr, HostId>,
    default_link: LinkConfig,
    links: Vec<Link>,
    link_index: BTreeMap<(IpAddr, IpAddr), usize>,
    /// The bottlenecks toward hosts, by the host's address.
    ports: BTreeMap<IpAddr, Port>,
    queue: BinaryHeap<InFlight>,
    next_seq: u64,
    /// Recycled payload buffers: the simulator allocates only until it has as many as the
    /// most datagrams ever in flight at once.
    pool: Vec<Vec<u8>>,
    trace: Option<Vec<TraceEvent>>,
    tap: Tap,
    stall_limit: Option<u64>,
    work_at_now: u64,
}

impl<E: Endpoint> Sim<E> {
    /// An empty network at [`Instant::ZERO`] with ideal links, drawing every random decision
    /// from `seed`.
    pub fn new(seed: u64) -> Self {
        Sim {
            seed,
            now: Instant::ZERO,
            hosts: Vec::new(),
            by_ip: BTreeMap::new(),
            default_link: LinkConfig::IDEAL,
            links: Vec::new(),
            link_index: BTreeMap::new(),
            ports: BTreeMap::new(),
            queue: BinaryHeap::new(),
            next_seq: 0,
            pool: Vec::new(),
            trace: None,
            tap: Tap::default(),
            stall_limit: Some(DEFAULT_STALL_LIMIT),
            work_at_now: 0,
        }
    }

    /// The seed of this run (print it when a randomized test fails).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The virtual clock.
    pub fn now(&self) -> Instant {
        self.now
    }

    // ----- hosts -----

    /// Adds a host owning address `ip`; datagrams to any port of `ip` go to `endpoint`.
    pub fn add_host(&mut self, ip: IpAddr, endpoint: E) -> Result<HostId, SimError> {
        if self.by_ip.contains_key(&ip) {
            return Err(SimError::DuplicateAddress(ip));
        }
        let id = HostId(self.hosts.len());
        self.hosts.push(Host {
            ip,
            endpoint,
            up: true,
            dirty: true,
            timer: None,
        });
        self.by_ip.insert(ip, id);
        Ok(id)
    }

    /// The host owning `ip`.
    pub fn host_at(&self, ip: IpAddr) -> Option<HostId> {
        self.by_ip.get(&ip).copied()
    }

    /// Every host and its address, in [`HostId`] order.
    pub fn hosts(&self) -> impl Iterator<Item = (HostId, IpAddr)> + '_ {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (HostId(i), h.ip))
    }

    /// The address of a host.
    ///
    /// # Panics
    /// If `id` was not returned by this simulator's [`add_host`](Sim::add_host).
    pub fn addr(&self, id: HostId) -> IpAddr {
        self.hosts[id.0].ip
    }

    /// A host's endpoint, to inspect it.
    ///
    /// # Panics
    /// If `id` was not returned by this simulator's [`add_host`](Sim::add_host).
    pub fn endpoint(&self, id: HostId) -> &E {
        &self.hosts[id.0].endpoint
    }

    /// A host's endpoint, to drive it (post work, change its state). The simulator polls it
    /// for transmits and its timer at the next step.
    ///
    /// # Panics
    /// If `id` was not returned by this simulator's [`add_host`](Sim::add_host).
    pub fn endpoint_mut(&mut self, id: HostId) -> &mut E {
        let h = &mut self.hosts[id.0];
        h.dirty = true;
        &mut h.endpoint
    }

    /// Kills (`false`) or revives (`true`) a host, to simulate a dead peer: while down it is
    /// neither polled nor woken by its timer, and datagrams reaching it are dropped as
    /// [`DropReason::Unreachable`]. Datagrams it had already sent still arrive.
    ///
    /// # Panics
    /// If `id` was not returned by this simulator's [`add_host`](Sim::add_host).
    pub fn set_host_up(&mut self, id: HostId, up: bool) {
        let h = &mut self.hosts[id.0];
        h.up = up;
        h.dirty = true;
    }

    /// Whether a host is up.
    ///
    /// # Panics
    /// If `id` was not returned by this simulator's [`add_host`](Sim::add_host).
    pub fn is_host_up(&self, id: HostId) -> bool {
        self.hosts[id.0].up
    }

    // ----- links -----

    /// Sets the configuration of every link direction that has none of its own; takes effect
    /// for datagrams sent from now on.
    pub fn set_default_link(&mut self, config: LinkConfig) -> Result<(), SimError> {
        config.validate()?;
        self.default_link = config;
        Ok(())
    }

    /// The configuration of links without their own.
    pub fn default_link(&self) -> &LinkConfig {
        &self.default_link
    }

    /// Sets the configuration of the direction `src` → `dst` (datagrams already on the wire
    /// keep their arrival time; the serializer's backlog carries over).
    pub fn set_link(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        config: LinkConfig,
    ) -> Result<(), SimError> {
        config.validate()?;
        let i = self.link(src, dst);
        self.links[i].config = Some(config);
        Ok(())
    }

    /// [`set_link`](Sim::set_link) in both directions between `a` and `b`.
    pub fn set_links(&mut self, a: IpAddr, b: IpAddr, config: LinkConfig) -> Result<(), SimError> {
        self.set_link(a, b, config)?;
        self.set_link(b, a, config)
    }

    /// The configuration the direction `src` → `dst` uses.
    pub fn link_config(&self, src: IpAddr, dst: IpAddr) -> LinkConfig {
        self.link_index
            .get(&(src, dst))
            .and_then(|&i| self.links[i].config)
            .unwrap_or(self.default_link)
    }

    /// Brings the direction `src` → `dst` down or up. Going down loses every datagram in
    /// flight on it (even if it comes back up before they would have arrived); while down,
    /// everything sent on it is dropped as [`DropReason::LinkDown`].
    pub fn set_link_up(&mut self, src: IpAddr, dst: IpAddr, up: bool) {
        let i = self.link(src, dst);
        let link = &mut self.links[i];
        if link.up && !up {
            link.generation += 1;
        }
        link.up = up;
    }

    /// Cuts both directions between `a` and `b` (a partition; see
    /// [`set_link_up`](Sim::set_link_up)).
    pub fn cut_link(&mut self, a: IpAddr, b: IpAddr) {
        self.set_link_up(a, b, false);
        self.set_link_up(b, a, false);
    }

    /// Restores both directions between `a` and `b`.
    pub fn restore_link(&mut self, a: IpAddr, b: IpAddr) {
        self.set_link_up(a, b, true);
        self.set_link_up(b, a, true);
    }

    /// The counters of the direction `src` → `dst` (zero if it never carried anything).
    pub fn link_stats(&self, src: IpAddr, dst: IpAddr) -> LinkStats {
        self.link_index
            .get(&(src, dst))
            .map(|&i| self.links[i].stats)
            .unwrap_or_default()
    }

    /// Every link direction that exists (carried traffic or was configured) and its
    /// counters, ordered by (source, destination).
    pub fn links(&self) -> impl Iterator<Item = (IpAddr, IpAddr, &LinkStats)> + '_ {
        self.link_index.values().map(|&i| {
            let l = &self.links[i];
            (l.src, l.dst, &l.stats)
        })
    }

    /// The counters of all links added up.
    pub fn total_stats(&self) -> LinkStats {
        let mut total = LinkStats::default();
        for l in &self.links {
            total += &l.stats;
        }
        total
    }

    /// Datagrams on the wire (sent, not yet delivered or dropped).
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Puts a bottleneck in front of the host at `host`: every datagram to it, from any
    /// sender and over any link, then goes through one queue drained at the bottleneck's
    /// rate (after the link's own delay and faults), tail-dropped past its limit and
    /// ECN-marked as configured.
    pub fn set_bottleneck(&mut self, host: IpAddr, b: Bottleneck) -> Result<(), SimError> {
        b.validate()?;
        let mut h = self.seed ^ 0x706f_7274;
        let v = match host {
            IpAddr::V4(a) => u128::from_be_bytes(a.to_ipv6_mapped().octets()),
            IpAddr::V6(a) => u128::from_be_bytes(a.octets()),
        };
        h ^= (v >> 64) as u64 ^ v as u64;
        self.ports
            .insert(host, Port::new(b, crate::rng::splitmix64(&mut h)));
        Ok(())
    }

    /// What the bottleneck toward `host` saw, if it has one.
    pub fn port_stats(&self, host: IpAddr) -> Option<PortStats> {
        self.ports.get(&host).map(|p| p.stats)
    }

    fn link(&mut self, src: IpAddr, dst: IpAddr) -> usize {
        if let Some(&i) = self.link_index.get(&(src, dst)) {
            return i;
        }
        let i = self.links.len();
        self.links.push(Link::new(self.seed, src, dst));
        self.link_index.insert((src, dst), i);
        i
    }

    // ----- observation -----

    /// Starts recording a [`TraceEvent`] for every send, delivery, drop and timeout (costs an
    /// allocation now and then and a hash per datagram; off by default for benchmarks).
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// [`enable_trace`](Sim::enable_trace), builder style.
    pub fn with_trace(mut self) -> Self {
        self.enable_trace();
        self
    }

    /// The events recorded so far (empty unless tracing is enabled).
    pub fn trace(&self) -> &[TraceEvent] {
        self.trace.as_deref().unwrap_or_default()
    }

    /// Takes the events recorded so far, leaving tracing on if it was.
    pub fn take_trace(&mut self) -> Vec<TraceEvent> {
        self.trace.as_mut().map(core::mem::take).unwrap_or_default()
    }

    /// Captures every datagram sent ([`Capture::Tx`]) into a pcap file at `path`.
    pub fn with_pcap(mut self, path: impl AsRef<Path>) -> io::Result<Self> {
        self.tap.open(Capture::Tx, path.as_ref())?;
        Ok(self)
    }

    /// Captures every datagram delivered ([`Capture::Rx`]) into a pcap file at `path`.
    pub fn with_pcap_rx(mut self, path: impl AsRef<Path>) -> io::Result<Self> {
        self.tap.open(Capture::Rx, path.as_ref())?;
        Ok(self)
    }

    /// Captures into `dir/<name>.pcap` (sent) and `dir/<name>.rx.pcap` (delivered); `name`
    /// is made file-name safe (a test path like `link::cut` becomes `link__cut`).
    pub fn with_pcap_in(self, dir: impl AsRef<Path>, name: &str) -> io::Result<Self> {
        let safe: String = name
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '.' => c,
                _ => '_',
            })
            .collect();
        let dir = dir.as_ref();
        self.with_pcap(dir.join(format!("{safe}.pcap")))?
            .with_pcap_rx(dir.join(format!("{safe}.rx.pcap")))
    }

    /// [`with_pcap_in`](Sim::with_pcap_in) the directory named by the environment variable
    /// [`PCAP_DIR_ENV`] (`SRDMA_SIM_PCAP_DIR`) when it is set; otherwise captures nothing.
    /// The convention for tests: call it with the test's name, always.
    pub fn with_pcap_env(self, name: &str) -> io::Result<Self> {
        match std::env::var_os(PCAP_DIR_ENV) {
            Some(dir) if !dir.is_empty() => self.with_pcap_in(dir, name),
            _ => Ok(self),
        }
    }

    /// Sends one capture to any writer (a `Vec<u8>` behind a lock, a socket...); the pcap
    /// global header is written at once.
    pub fn set_pcap_writer(
        &mut self,
        which: Capture,
        out: Box<dyn Write + Send>,
    ) -> io::Result<()> {
        self.tap.set(which, out)
    }

    /// Flushes the captures and reports the first write error since the last flush (capture
    /// errors never stop the simulation). Files are also flushed when the simulator is
    /// dropped, so a panicking test still leaves its capture.
    pub fn flush_pcap(&mut self) -> io::Result<()> {
        self.tap.flush()
    }

    /// Sets how much work (transmits, deliveries, timeouts) may happen at one instant before
    /// a run gives up with [`Outcome::Stalled`]; `None` never gives up. A zero-latency link
    /// does all its work at one instant: raise the limit or give the link some latency.
    pub fn set_stall_limit(&mut self, limit: Option<u64>) {
        self.stall_limit = limit;
    }

    // ----- running -----

    /// Processes the next event: first every pending transmit at the current instant, then
    /// the earliest delivery or timer (a delivery before a timer at the same instant, timers
    /// in [`HostId`] order), advancing the clock to it. False when there is nothing left to
    /// do (or on a stall).
    pub fn step(&mut self) -> bool {
        self.try_step(Instant::MAX).is_ok()
    }

    /// Runs every event up to and including `deadline`, then sets the clock to `deadline`
    /// (returning [`Outcome::Idle`] if nothing is pending then, [`Outcome::Deadline`]
    /// otherwise), unless it stalls.
    pub fn run_until(&mut self, deadline: Instant) -> Outcome {
        loop {
            match self.try_step(deadline) {
                Ok(()) => {}
                Err(Outcome::Stalled) => return Outcome::Stalled,
                Err(o) => {
                    self.advance_to(deadline);
                    return o;
                }
            }
        }
    }

    /// [`run_until`](Sim::run_until) `now + d`.
    pub fn run_for(&mut self, d: Duration) -> Outcome {
        self.run_until(self.now + d)
    }

    /// Runs until nothing is left to do ([`Outcome::Idle`], the clock stays at the last
    /// event) or the next event lies beyond `deadline` ([`Outcome::Deadline`]).
    pub fn run_until_idle(&mut self, deadline: Instant) -> Outcome {
        self.run_while(|_| true, deadline)
    }

    /// Runs while `cond` holds (checked before every step): [`Outcome::Stopped`] when it no
    /// longer does, [`Outcome::Idle`] when nothing is left to do though it still holds,
    /// [`Outcome::Deadline`] when the next event lies beyond `deadline`.
    pub fn run_while(&mut self, mut cond: impl FnMut(&Self) -> bool, deadline: Instant) -> Outcome {
        loop {
            if !cond(self) {
                return Outcome::Stopped;
            }
            match self.try_step(deadline) {
                Ok(()) => {}
                Err(Outcome::Deadline) => {
                    self.advance_to(deadline);
                    return Outcome::Deadline;
                }
                Err(o) => return o,
            }
        }
    }

    fn advance_to(&mut self, t: Instant) {
        if t > self.now {
            self.now = t;
            self.work_at_now = 0;
        }
    }

    fn tick(&mut self) -> Result<(), Outcome> {
        self.work_at_now += 1;
        match self.stall_limit {
            Some(limit) if self.work_at_now > limit => Err(Outcome::Stalled),
            _ => Ok(()),
        }
    }

    fn try_step(&mut self, deadline: Instant) -> Result<(), Outcome> {
        self.poll_hosts()?;
        let (at, timer) = self.next_event().ok_or(Outcome::Idle)?;
        if at > deadline {
            return Err(Outcome::Deadline);
        }
        self.advance_to(at);
        self.tick()?;
        match timer {
            Some(id) => self.fire(id),
            None => self.deliver(),
        }
        Ok(())
    }

    /// The earliest pending event: a delivery (`None`) or a host's timer.
    fn next_event(&self) -> Option<(Instant, Option<HostId>)> {
        let mut best = self.queue.peek().map(|d| (d.at, None));
        for (i, h) in self.hosts.iter().enumerate() {
            if let (true, Some(t)) = (h.up, h.timer) {
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, Some(HostId(i))));
                }
            }
        }
        best
    }

    fn poll_hosts(&mut self) -> Result<(), Outcome> {
        for i in 0..self.hosts.len() {
            if !self.hosts[i].dirty || !self.hosts[i].up {
                continue;
            }
            loop {
                let mut buf = self.pool.pop().unwrap_or_default();
                buf.clear();
                let Some(tx) = self.hosts[i].endpoint.poll_transmit(self.now, &mut buf) else {
                    self.pool.push(buf);
                    break;
                };
                self.transmit(tx, buf);
                self.tick()?;
            }
            let h = &mut self.hosts[i];
            h.dirty = false;
            h.timer = h.endpoint.poll_timeout();
        }
        Ok(())
    }

    fn fire(&mut self, id: HostId) {
        note(&mut self.trace, self.now, || TraceKind::Timeout(id));
        let h = &mut self.hosts[id.0];
        h.timer = None;
        h.dirty = true;
        h.endpoint.handle_timeout(self.now);
    }

    fn transmit(&mut self, tx: Transmit, mut buf: Vec<u8>) {
        let now = self.now;
        self.tap.record(Capture::Tx, now, tx.src, tx.dst, &buf);
        note(&mut self.trace, now, || TraceKind::Sent(info(&tx, &buf)));
        let li = self.link(tx.src.ip(), tx.dst.ip());
        let link = &mut self.links[li];
        let cfg = link.config.unwrap_or(self.default_link);
        link.stats.sent += 1;
        link.stats.sent_bytes += buf.len() as u64;
        let sent = if !link.up {
            Err(DropReason::LinkDown)
        } else {
            match link.enqueue(&cfg, now, buf.len()) {
                None => Err(DropReason::QueueFull),
                Some(_) if link.rng.chance(cfg.loss) => Err(DropReason::Lost),
                Some(end) => Ok(end),
            }
        };
        let end = match sent {
            Ok(end) => end,
            Err(reason) => {
                count_drop(&mut link.stats, reason);
                note(&mut self.trace, now, || {
                    TraceKind::Dropped(info(&tx, &buf), reason)
                });
                self.pool.push(buf);
                return;
            }
        };
        if !buf.is_empty() && link.rng.chance(cfg.corrupt) {
            let bit = link.rng.below((buf.len() as u64).saturating_mul(8));
            buf[(bit / 8) as usize] ^= 1 << (bit % 8);
            link.stats.corrupted += 1;
        }
        let duplicate = link.rng.chance(cfg.duplicate);
        let generation = link.generation;
        let at = end + Duration::from_nanos(link.propagation(&cfg));
        let copy_at = duplicate.then(|| {
            link.stats.duplicated += 1;
            end + Duration::from_nanos(link.propagation(&cfg))
        });
        if let Some(copy_at) = copy_at {
            let mut copy = self.pool.pop().unwrap_or_default();
            copy.clear();
            copy.extend_from_slice(&buf);
            self.schedule(copy_at, li, generation, tx, copy);
        }
        self.schedule(at, li, generation, tx, buf);
    }

    fn schedule(&mut self, at: Instant, link: usize, generation: u64, tx: Transmit, buf: Vec<u8>) {
        let to_port = self.ports.contains_key(&tx.dst.ip());
        self.push(InFlight {
            at,
            seq: 0,
            link,
            generation,
            src: tx.src,
            dst: tx.dst,
            ecn: tx.ecn,
            to_port,
            buf,
        });
    }

    fn push(&mut self, mut d: InFlight) {
        self.next_seq += 1;
        d.seq = self.next_seq;
        self.queue.push(d);
    }

    fn deliver(&mut self) {
        let Some(d) = self.queue.pop() else {
            return;
        };
        let now = self.now;
        let tx = Transmit {
            src: d.src,
            dst: d.dst,
            ecn: d.ecn,
        };
        if d.to_port && d.generation == self.links[d.link].generation {
            if let Some(port) = self.ports.get_mut(&d.dst.ip()) {
                match port.arrive(now, d.buf.len(), d.ecn) {
                    Verdict::Drop => {
                        let reason = DropReason::QueueFull;
                        count_drop(&mut self.links[d.link].stats, reason);
                        note(&mut self.trace, now, || {
                            TraceKind::Dropped(info(&tx, &d.buf), reason)
                        });
                        self.pool.push(d.buf);
                    }
                    Verdict::Depart(at, ecn) => self.push(InFlight {
                        at,
                        ecn,
                        to_port: false,
                        ..d
                    }),
                }
                return;
            }
        }
        let to = match self.by_ip.get(&d.dst.ip()) {
            _ if d.generation != self.links[d.link].generation => Err(DropReason::LinkDown),
            Some(&id) if self.hosts[id.0].up => Ok(id),
            _ => Err(DropReason::Unreachable),
        };
        let stats = &mut self.links[d.link].stats;
        match to {
            Ok(id) => {
                stats.delivered += 1;
                stats.delivered_bytes += d.buf.len() as u64;
                self.tap.record(Capture::Rx, now, d.src, d.dst, &d.buf);
                note(&mut self.trace, now, || {
                    TraceKind::Delivered(info(&tx, &d.buf))
                });
                let h = &mut self.hosts[id.0];
                h.dirty = true;
                h.endpoint
                    .handle_datagram_ecn(now, d.src, d.dst, d.ecn, &d.buf);
            }
            Err(reason) => {
                count_drop(stats, reason);
                note(&mut self.trace, now, || {
                    TraceKind::Dropped(info(&tx, &d.buf), reason)
                });
            }
        }
        self.pool.push(d.buf);
    }
}

fn count_drop(stats: &mut LinkStats, reason: DropReason) {
    match reason {
        DropReason::Lost => stats.lost += 1,
        DropReason::QueueFull => stats.queue_dropped += 1,
        DropReason::LinkDown => stats.link_down += 1,
        DropReason::Unreachable => stats.unreachable += 1,
    }
}

fn note(trace: &mut Option<Vec<TraceEvent>>, at: Instant, kind: impl FnOnce() -> TraceKind) {
    if let Some(t) = trace {
        t.push(TraceEvent { at, kind: kind() });
    }
}

fn info(tx: &Transmit, payload: &[u8]) -> DatagramInfo {
    let digest = payload.iter().fold(0xCBF2_9CE4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    });
    DatagramInfo {
        src: tx.src,
        dst: tx.dst,
        len: payload.len(),
        digest,
    }
}
