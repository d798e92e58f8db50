//! Links: the impairments of one direction between two addresses, and what happened on it.

use core::fmt;
use core::net::IpAddr;
use core::ops::AddAssign;
use core::time::Duration;
use std::collections::VecDeque;

use crate::rng::{Rng, splitmix64};
use crate::time::{Instant, nanos};

/// The behaviour of one direction of a link, netem-style. [`Default`] is an ideal wire: no
/// delay, unlimited bandwidth, no faults.
///
/// A datagram handed to the link goes through, in this order: the FIFO queue and serializer
/// (when `bandwidth_bps` is set: it leaves the sender `(len + overhead_bytes) * 8 /
/// bandwidth_bps` after the previous one did, or is tail-dropped when the queue is full), then
/// `loss`, `corrupt`, `duplicate`, and for each copy a delay of `latency` + uniform
/// `[0, jitter]` + (with probability `reorder`) `reorder_delay`. Lost datagrams still used
/// their share of bandwidth, as on a real wire. Like netem, jitter alone reorders.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Upper bound of a uniform random extra delay per datagram.
    pub jitter: Duration,
    /// Serialization rate in bits per second; `None` is unlimited (no queue, no delay).
    pub bandwidth_bps: Option<u64>,
    /// Bytes added to each datagram's length for serialization only: framing the simulator
    /// does not carry. 0 counts the UDP payload alone; 66 models Ethernet (preamble, header,
    /// FCS and inter-frame gap: 38) + IPv4 (20) + UDP (8).
    pub overhead_bytes: u32,
    /// Most bytes (`len + overhead_bytes` each) that may wait for or be in serialization; a
    /// datagram that would exceed it is tail-dropped. `None` is an unbounded queue. Inert
    /// without `bandwidth_bps`, since then nothing ever waits.
    pub queue_limit_bytes: Option<u64>,
    /// Probability that a datagram is lost on the wire.
    pub loss: f64,
    /// Probability that a datagram arrives twice (each copy with its own delay).
    pub duplicate: f64,
    /// Probability that a datagram is held back by `reorder_delay`, so later ones overtake it.
    pub reorder: f64,
    /// The extra delay of a held-back datagram.
    pub reorder_delay: Duration,
    /// Probability that exactly one uniformly chosen bit of the payload is flipped (the copy
    /// and the original share the flip). An empty payload is never corrupted.
    pub corrupt: f64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig::IDEAL
    }
}

impl LinkConfig {
    /// No delay, unlimited bandwidth, no faults.
    pub const IDEAL: LinkConfig = LinkConfig {
        latency: Duration::ZERO,
        jitter: Duration::ZERO,
        bandwidth_bps: None,
        overhead_bytes: 0,
        queue_limit_bytes: None,
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_delay: Duration::ZERO,
        corrupt: 0.0,
    };

    /// Checks that every probability is in `0..=1` (NaN is not) and the bandwidth is not 0.
    pub fn validate(&self) -> Result<(), SimError> {
        for (field, value) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(SimError::InvalidProbability { field, value });
            }
        }
        if self.bandwidth_bps == Some(0) {
            return Err(SimError::ZeroBandwidth);
        }
        Ok(())
    }

    /// Time to serialize `bytes` (plus the overhead), rounded up to whole nanoseconds.
    pub fn serialization_delay(&self, bytes: usize) -> Duration {
        Duration::from_nanos(self.serialization_nanos(bytes))
    }

    fn serialization_nanos(&self, bytes: usize) -> u64 {
        let Some(bps) = self.bandwidth_bps.filter(|&b| b > 0) else {
            return 0;
        };
        let bits = (bytes as u128 + u128::from(self.overhead_bytes)) * 8;
        let ns = (bits * 1_000_000_000).div_ceil(u128::from(bps));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Counters of one link direction. Every datagram handed to the link ends in exactly one of
/// `delivered`, `lost`, `queue_dropped`, `link_down`, `unreachable` or is still in flight;
/// a duplicate adds one more datagram to that balance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams handed to the link.
    pub sent: u64,
    /// Payload bytes handed to the link.
    pub sent_bytes: u64,
    /// Datagrams handed to the destination endpoint (duplicates included).
    pub delivered: u64,
    /// Payload bytes handed to the destination endpoint.
    pub delivered_bytes: u64,
    /// Dropped by random loss.
    pub lost: u64,
    /// Tail-dropped because the queue was full.
    pub queue_dropped: u64,
    /// Dropped because the link was down when sent or was cut while they were in flight.
    pub link_down: u64,
    /// Dropped on arrival: no host has the destination address, or that host is down.
    pub unreachable: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams held back by the reorder delay.
    pub reordered: u64,
    /// Datagrams with a flipped bit.
    pub corrupted: u64,
}

impl LinkStats {
    /// All drops, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.lost + self.queue_dropped + self.link_down + self.unreachable
    }
}

impl AddAssign<&LinkStats> for LinkStats {
    fn add_assign(&mut self, o: &LinkStats) {
        self.sent += o.sent;
        self.sent_bytes += o.sent_bytes;
        self.delivered += o.delivered;
        self.delivered_bytes += o.delivered_bytes;
        self.lost += o.lost;
        self.queue_dropped += o.queue_dropped;
        self.link_down += o.link_down;
        self.unreachable += o.unreachable;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.corrupted += o.corrupted;
    }
}

/// A configuration or setup mistake, reported instead of a panic.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SimError {
    /// A probability outside `0..=1`, or NaN.
    InvalidProbability {
        /// The [`LinkConfig`] field.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// `bandwidth_bps: Some(0)`: nothing could ever be sent (use `None` for unlimited).
    ZeroBandwidth,
    /// Two hosts with the same address: the simulator routes by address.
    DuplicateAddress(IpAddr),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::InvalidProbability { field, value } => {
                write!(f, "link {field} probability {value} is not in 0..=1")
            }
            SimError::ZeroBandwidth => f.write_str("link bandwidth 0 (use None for unlimited)"),
            SimError::DuplicateAddress(a) => write!(f, "address {a} is already taken"),
        }
    }
}

impl std::error::Error for SimError {}

/// The state of one direction.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    /// `None` follows the simulator's default.
    pub(crate) config: Option<LinkConfig>,
    pub(crate) up: bool,
    /// Bumped when the link goes down, so datagrams in flight at that moment are lost even
    /// if the link is restored before they would have arrived.
    pub(crate) generation: u64,
    /// When the serializer is free again.
    busy_until: Instant,
    /// End of serialization and wire size of each datagram still queued or serializing.
    backlog: VecDeque<(Instant, u64)>,
    backlog_bytes: u64,
    /// Each direction has its own stream derived from the seed and the addresses, so adding
    /// traffic elsewhere does not change the faults seen here.
    pub(crate) rng: Rng,
    pub(crate) stats: LinkStats,
}

impl Link {
    pub(crate) fn new(seed: u64, src: IpAddr, dst: IpAddr) -> Link {
        let mix = |h: u64, w: u64| splitmix64(&mut (h ^ w));
        let mut h = seed;
        for part in [src, dst] {
            let (tag, octets) = match part {
                IpAddr::V4(a) => (4, a.to_ipv6_mapped().octets()),
                IpAddr::V6(a) => (6, a.octets()),
            };
            let v = u128::from_be_bytes(octets);
            h = mix(mix(mix(h, tag), (v >> 64) as u64), v as u64);
        }
        Link {
            src,
            dst,
            config: None,
            up: true,
            generation: 0,
            busy_until: Instant::ZERO,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            rng: Rng::new(h),
            stats: LinkStats::default(),
        }
    }

    /// Queues `len` bytes for serialization at `now`: the instant the last bit leaves, or
    /// `None` when the queue limit tail-drops it.
    pub(crate) fn enqueue(
        &mut self,
        cfg: &LinkConfig,
        now: Instant,
        len: usize,
    ) -> Option<Instant> {
        if cfg.bandwidth_bps.is_none() {
            return Some(now);
        }
        while let Some(&(end, bytes)) = self.backlog.front() {
            if end > now {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= bytes;
        }
        let wire = len as u64 + u64::from(cfg.overhead_bytes);
        if let Some(limit) = cfg.queue_limit_bytes {
            if self.backlog_bytes.saturating_add(wire) > limit {
                return None;
            }
        }
        let end = Instant::from_nanos(
            self.busy_until
                .max(now)
                .as_nanos()
                .saturating_add(cfg.serialization_nanos(len)),
        );
        self.busy_until = end;
        self.backlog.push_back((end, wire));
        self.backlog_bytes = self.backlog_bytes.saturating_add(wire);
        Some(end)
    }

    /// The propagation delay of one copy: latency, jitter and maybe the reorder hold-back.
    pub(crate) fn propagation(&mut self, cfg: &LinkConfig) -> u64 {
        let mut ns = nanos(cfg.latency);
        let jitter = nanos(cfg.jitter);
        if jitter > 0 {
            ns = ns.saturating_add(self.rng.below(jitter.saturating_add(1)));
        }
        if self.rng.chance(cfg.reorder) {
            self.stats.reordered += 1;
            ns = ns.saturating_add(nanos(cfg.reorder_delay));
        }
        ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert_eq!(LinkConfig::default().validate(), Ok(()));
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let c = LinkConfig {
                corrupt: bad,
                ..LinkConfig::IDEAL
            };
            assert!(matches!(
                c.validate(),
                Err(SimError::InvalidProbability {
                    field: "corrupt",
                    ..
                })
            ));
        }
        let c = LinkConfig {
            bandwidth_bps: Some(0),
            ..LinkConfig::IDEAL
        };
        assert_eq!(c.validate(), Err(SimError::ZeroBandwidth));
    }

    #[test]
    fn serialization_rounds_up() {
        let c = LinkConfig {
            bandwidth_bps: Some(3_000_000_000),
            ..LinkConfig::IDEAL
        };
        // 1 byte = 8 bits at 3 Gb/s = 2.67 ns -> 3 ns.
        assert_eq!(c.serialization_delay(1), Duration::from_nanos(3));
        let huge = LinkConfig {
            bandwidth_bps: Some(1),
            overhead_bytes: u32::MAX,
            ..LinkConfig::IDEAL
        };
        assert_eq!(
            huge.serialization_delay(usize::MAX),
            Duration::from_nanos(u64::MAX)
        );
    }
}
