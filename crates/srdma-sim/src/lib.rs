//! A deterministic network simulator for srdma's tests and benchmarks.
//!
//! The transport state machines of `srdma-proto` are sans-IO: they take datagrams and the
//! time as arguments and hand back datagrams and deadlines. This crate is the network they
//! run on in tests: hosts ([`Endpoint`]s) joined by links ([`LinkConfig`]: latency, jitter,
//! bandwidth with a FIFO queue and tail drop, loss, duplication, reordering, bit corruption),
//! bottlenecks toward a host that every sender shares ([`Bottleneck`]: rate, queue,
//! drop-tail, ECN marking),
//! a virtual clock ([`Instant`]) that jumps from event to event, and a pcap tap whose
//! captures `srdma decode`, tshark and Wireshark read as RoCEv2.
//!
//! Everything is reproducible: all randomness comes from one seed, ties are broken by
//! scheduling order, and nothing depends on hash-map order or the wall clock. Run a failing
//! test again with the same seed and it fails the same way; set [`PCAP_DIR_ENV`] to see it.
//!
//! In steady state the simulator allocates nothing per datagram: payload buffers are recycled
//! and handed to [`Endpoint::poll_transmit`] to fill, so a benchmark measures the endpoints.
//!
//! ```
//! use core::net::{IpAddr, SocketAddr};
//! use core::time::Duration;
//! use srdma_sim::{Endpoint, Instant, LinkConfig, Outcome, Sim, Transmit};
//!
//! /// Sends what is in `out`; echoes what it receives when `echo` is set; logs arrivals.
//! struct Node { me: SocketAddr, echo: bool, out: Vec<(SocketAddr, Vec<u8>)>, log: Vec<Instant> }
//!
//! impl Endpoint for Node {
//!     fn handle_datagram(&mut self, now: Instant, src: SocketAddr, _dst: SocketAddr, p: &[u8]) {
//!         self.log.push(now);
//!         if self.echo { self.out.push((src, p.to_vec())); }
//!     }
//!     fn poll_transmit(&mut self, _now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
//!         let (dst, p) = self.out.pop()?;
//!         buf.extend_from_slice(&p);
//!         Some(Transmit::new(self.me, dst))
//!     }
//!     fn poll_timeout(&mut self) -> Option<Instant> { None }
//!     fn handle_timeout(&mut self, _now: Instant) {}
//! }
//!
//! let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
//! let sa = SocketAddr::new(a, 4791);
//! let sb = SocketAddr::new(b, 4791);
//! let mut sim = Sim::new(42);
//! sim.set_default_link(LinkConfig { latency: Duration::from_micros(5), ..LinkConfig::IDEAL })?;
//! let ping = vec![(sb, b"ping".to_vec())];
//! let client = sim.add_host(a, Node { me: sa, echo: false, out: ping, log: vec![] })?;
//! sim.add_host(b, Node { me: sb, echo: true, out: vec![], log: vec![] })?;
//! assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Idle);
//! assert_eq!(sim.endpoint(client).log, [Instant::from_nanos(10_000)]);
//! # Ok::<(), srdma_sim::SimError>(())
//! ```
#![forbid(unsafe_code)]

mod link;
mod port;
mod rng;
mod sim;
mod tap;
mod time;

pub use link::{LinkConfig, LinkStats, SimError};
pub use port::{Bottleneck, EcnMarking, PortStats, ecn};
pub use rng::Rng;
pub use sim::{
    DEFAULT_STALL_LIMIT, DatagramInfo, DropReason, Endpoint, HostId, Outcome, Sim, TraceEvent,
    TraceKind, Transmit,
};
pub use tap::{Capture, PCAP_DIR_ENV};
pub use time::Instant;
