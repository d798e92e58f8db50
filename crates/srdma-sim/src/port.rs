//! Bottlenecks: a switch port toward one host, whose queue every sender to that host shares
//! (an incast), with drop-tail and ECN marking as a RoCE switch configures them (RED with
//! ECN: mark CE between a low and a high threshold with a probability rising to a maximum,
//! always past the high one, as DCQCN's switches do).

use core::time::Duration;
use std::collections::VecDeque;

use crate::link::SimError;
use crate::rng::Rng;
use crate::time::Instant;

/// ECN codepoints of the IP header's low two bits (RFC 3168).
pub mod ecn {
    /// Not ECN-capable: a marking switch drops instead.
    pub const NOT_ECT: u8 = 0;
    /// ECN-capable, ECT(1).
    pub const ECT1: u8 = 1;
    /// ECN-capable, ECT(0): what RoCE NICs send.
    pub const ECT0: u8 = 2;
    /// Congestion experienced.
    pub const CE: u8 = 3;
}

/// RED-style ECN marking on a [`Bottleneck`]'s queue, in bytes queued when a datagram
/// arrives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcnMarking {
    /// Below this, nothing is marked (DCQCN's K_min).
    pub min_bytes: u64,
    /// At or above this, every ECN-capable datagram is marked (K_max).
    pub max_bytes: u64,
    /// The marking probability just below `max_bytes` (P_max); it rises linearly from 0 at
    /// `min_bytes`.
    pub max_prob: f64,
}

/// A switch port toward one host ([`crate::Sim::set_bottleneck`]): a FIFO queue drained at
/// `rate_bps`, shared by every datagram to that host whatever link it came over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bottleneck {
    /// Drain rate in bits per second.
    pub rate_bps: u64,
    /// Bytes added to each datagram for serialization (see [`crate::LinkConfig`]).
    pub overhead_bytes: u32,
    /// Most bytes queued (serializing included): a datagram that would exceed it is dropped
    /// (tail drop).
    pub queue_limit_bytes: u64,
    /// ECN marking of ECN-capable datagrams; `None`: none (drop-tail only).
    pub ecn: Option<EcnMarking>,
}

impl Bottleneck {
    /// Checks the rate is not 0 and the marking probability is in `0..=1`.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.rate_bps == 0 {
            return Err(SimError::ZeroBandwidth);
        }
        if let Some(e) = self.ecn {
            if !(0.0..=1.0).contains(&e.max_prob) {
                return Err(SimError::InvalidProbability {
                    field: "ecn.max_prob",
                    value: e.max_prob,
                });
            }
        }
        Ok(())
    }
}

/// What a bottleneck saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Datagrams that reached the port.
    pub arrived: u64,
    /// Of them, tail-dropped.
    pub dropped: u64,
    /// Of them, marked CE here.
    pub marked: u64,
    /// Payload bytes that left the port.
    pub departed_bytes: u64,
    /// The most bytes ever queued.
    pub max_queue_bytes: u64,
    /// The sum over arrivals of the bytes queued at arrival (with `arrived`: the mean queue a
    /// datagram found).
    pub queue_bytes_sum: u128,
}

impl PortStats {
    /// The mean queue a datagram found on arrival, bytes.
    pub fn mean_queue_bytes(&self) -> u64 {
        (self.queue_bytes_sum / u128::from(self.arrived.max(1))) as u64
    }
}

/// The state of one port.
#[derive(Debug)]
pub(crate) struct Port {
    pub(crate) cfg: Bottleneck,
    busy_until: Instant,
    backlog: VecDeque<(Instant, u64)>,
    backlog_bytes: u64,
    rng: Rng,
    pub(crate) stats: PortStats,
}

/// What happens to a datagram at a port.
pub(crate) enum Verdict {
    /// Tail-dropped.
    Drop,
    /// Leaves the port at this instant, with this ECN codepoint.
    Depart(Instant, u8),
}

impl Port {
    pub(crate) fn new(cfg: Bottleneck, seed: u64) -> Port {
        Port {
            cfg,
            busy_until: Instant::ZERO,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            rng: Rng::new(seed),
            stats: PortStats::default(),
        }
    }

    /// A datagram of `len` payload bytes with codepoint `ecn` reaches the port at `now`.
    pub(crate) fn arrive(&mut self, now: Instant, len: usize, ecn: u8) -> Verdict {
        while let Some(&(end, bytes)) = self.backlog.front() {
            if end > now {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= bytes;
        }
        let q = self.backlog_bytes;
        self.stats.arrived += 1;
        self.stats.queue_bytes_sum += u128::from(q);
        let wire = len as u64 + u64::from(self.cfg.overhead_bytes);
        if q.saturating_add(wire) > self.cfg.queue_limit_bytes {
            self.stats.dropped += 1;
            return Verdict::Drop;
        }
        let mut out = ecn;
        if let Some(m) = self.cfg.ecn {
            if ecn != ecn::NOT_ECT && ecn != ecn::CE && self.marks(&m, q) {
                out = ecn::CE;
                self.stats.marked += 1;
            }
        }
        let ns = (u128::from(wire) * 8 * 1_000_000_000).div_ceil(u128::from(self.cfg.rate_bps));
        let ser = Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64);
        let end = self.busy_until.max(now) + ser;
        self.busy_until = end;
        self.backlog.push_back((end, wire));
        self.backlog_bytes += wire;
        self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(self.backlog_bytes);
        self.stats.departed_bytes += len as u64;
        Verdict::Depart(end, out)
    }

    fn marks(&mut self, m: &EcnMarking, q: u64) -> bool {
        if q < m.min_bytes {
            return false;
        }
        if q >= m.max_bytes {
            return true;
        }
        let span = (m.max_bytes - m.min_bytes).max(1) as f64;
        let p = m.max_prob * (q - m.min_bytes) as f64 / span;
        self.rng.chance(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(ecn: Option<EcnMarking>) -> Port {
        Port::new(
            Bottleneck {
                rate_bps: 8_000_000_000, // 1 byte per ns
                overhead_bytes: 0,
                queue_limit_bytes: 10_000,
                ecn,
            },
            7,
        )
    }

    #[test]
    fn drains_at_its_rate_and_drops_the_tail() {
        let mut p = port(None);
        let t = Instant::ZERO;
        for i in 1..=10 {
            match p.arrive(t, 1000, ecn::ECT0) {
                Verdict::Depart(end, e) => {
                    assert_eq!(end, Instant::from_nanos(1000 * i));
                    assert_eq!(e, ecn::ECT0);
                }
                Verdict::Drop => panic!("room for ten"),
            }
        }
        assert!(matches!(p.arrive(t, 1, 0), Verdict::Drop));
        // 5 µs later half has left.
        assert!(matches!(
            p.arrive(Instant::from_nanos(5000), 1000, 0),
            Verdict::Depart(..)
        ));
        assert_eq!(p.stats.dropped, 1);
        assert_eq!(p.stats.max_queue_bytes, 10_000);
    }

    #[test]
    fn marks_ect_past_the_threshold_and_never_not_ect() {
        let mut p = port(Some(EcnMarking {
            min_bytes: 3000,
            max_bytes: 3000,
            max_prob: 1.0,
        }));
        let mut marks = vec![];
        for _ in 0..6 {
            if let Verdict::Depart(_, e) = p.arrive(Instant::ZERO, 1000, ecn::ECT0) {
                marks.push(e == ecn::CE);
            }
        }
        assert_eq!(marks, [false, false, false, true, true, true]);
        assert!(matches!(
            p.arrive(Instant::ZERO, 1000, ecn::NOT_ECT),
            Verdict::Depart(_, ecn::NOT_ECT)
        ));
        assert_eq!(p.stats.marked, 3);
    }
}
