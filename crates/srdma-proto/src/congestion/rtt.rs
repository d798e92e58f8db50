//! Round-trip time, measured from the ACKs of request packets that asked for one (AckReq),
//! and what the requester derives from it: a smoothed RTT and its variation (RFC 6298), the
//! path's base RTT (a windowed minimum), and a retransmission timeout on measured time.

use core::time::Duration;

use srdma_wire::Psn;

/// How long a base-RTT minimum holds before a newer one replaces it: a path that got longer
/// (a reroute, a slower peer) is learned within two of these.
pub const BASE_WINDOW: Duration = Duration::from_secs(10);

/// The shortest retransmission timeout on measured RTT. Below this, a descheduled responder
/// makes spurious timeouts routine (a loaded two-core host answers milliseconds late now
/// and then, and a software responder may hold an ACK back for up to a millisecond to let
/// it ride a reply: at 1 ms, a WRITE stream over loopback timed out 55 times in 3 s without
/// losing a packet), and so does a queue that fills faster than SRTT follows (a deep
/// bottleneck took RTTs from 0.1 to 5 ms). Lost tails are found sooner by the tail loss
/// probe ([`RttEstimator::pto`]); this is the backstop, well below the IBTA timer's usual
/// 67 ms.
pub const MIN_RTO: Duration = Duration::from_millis(2);

/// The retransmission timeout before the first sample (RFC 6298 says 1 s for the Internet;
/// a peer that has not answered the first window within this long lost it).
pub const INITIAL_RTO: Duration = Duration::from_millis(5);

/// The shortest tail loss probe timeout (RFC 8985's PTO): a probe is one packet, cheap even
/// when spurious.
pub const MIN_PTO: Duration = Duration::from_micros(200);

/// RFC 6298 estimator of one QP's path, plus a windowed minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    latest: Duration,
    /// The minimum of the current base window and of the one before it.
    min_now: Duration,
    min_before: Duration,
    window_start: Duration,
}

impl Default for RttEstimator {
    fn default() -> Self {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            latest: Duration::ZERO,
            min_now: Duration::MAX,
            min_before: Duration::MAX,
            window_start: Duration::ZERO,
        }
    }
}

impl RttEstimator {
    /// Takes in one sample measured at `now`.
    pub fn update(&mut self, now: Duration, sample: Duration) {
        self.latest = sample;
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(srtt) => {
                let dev = srtt.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((srtt * 7 + sample) / 8);
            }
        }
        if now.saturating_sub(self.window_start) >= BASE_WINDOW {
            self.min_before = self.min_now;
            self.min_now = Duration::MAX;
            self.window_start = now;
        }
        self.min_now = self.min_now.min(sample);
    }

    /// The smoothed RTT, once a sample came.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The latest sample (zero before the first).
    pub fn latest(&self) -> Duration {
        self.latest
    }

    /// The path's base RTT: the least sample of the last one to two [`BASE_WINDOW`]s.
    pub fn base(&self) -> Option<Duration> {
        let m = self.min_now.min(self.min_before);
        (m != Duration::MAX).then_some(m)
    }

    /// The tail loss probe timeout: two smoothed RTTs, at least [`MIN_PTO`] (RFC 8985);
    /// [`INITIAL_RTO`] before the first sample.
    pub fn pto(&self) -> Duration {
        self.srtt.map_or(INITIAL_RTO, |s| (s * 2).max(MIN_PTO))
    }

    /// A retransmission timeout on measured time (RFC 6298: SRTT + 4·RTTVAR; at least twice
    /// the latest sample, since a queue that fills raises the RTT faster than SRTT follows;
    /// at least [`MIN_RTO`]; [`INITIAL_RTO`] before the first sample).
    pub fn rto(&self) -> Duration {
        match self.srtt {
            Some(srtt) => (srtt + self.rttvar * 4).max(self.latest * 2).max(MIN_RTO),
            None => INITIAL_RTO,
        }
    }
}

/// How many AckReq packets may be timed at once: more outstanding than this and the oldest
/// are forgotten (they would only give samples inflated by the ACKs in between).
const PROBES: usize = 16;

/// The send times of request packets that asked for an ACK, to time that ACK. Only packets
/// sent once are timed (Karn): a packet sent again is no longer timed (a later one's ACK may
/// then include the time the loss took to repair: an overestimate, on the safe side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probes {
    ring: [(u32, Duration); PROBES],
    /// Probes in the ring, oldest first from `head`.
    len: usize,
    head: usize,
}

impl Probes {
    /// Packet `psn`, which asks for an ACK, left at `now` for the first time.
    pub fn sent(&mut self, psn: Psn, now: Duration) {
        if self.len == PROBES {
            self.head = (self.head + 1) % PROBES;
            self.len -= 1;
        }
        self.ring[(self.head + self.len) % PROBES] = (psn.value(), now);
        self.len += 1;
    }

    /// An ACK at `now` acknowledged every PSN before `acked_to`: the sample of the newest
    /// probe it covers (the older ones it covers waited for a later packet's ACK, or theirs
    /// was lost), and every probe it covers is done.
    pub fn acked(&mut self, acked_to: Psn, now: Duration) -> Option<Duration> {
        let mut sample = None;
        while self.len > 0 {
            let (psn, at) = self.ring[self.head];
            if !Psn::new(psn).before(acked_to) {
                break;
            }
            // `now` before `at`: the caller read its clock before the probe left (an
            // engine handling a batch with the time it read first): no sample.
            sample = (at != Duration::MAX)
                .then(|| now.checked_sub(at))
                .flatten()
                .or(sample);
            self.head = (self.head + 1) % PROBES;
            self.len -= 1;
        }
        sample
    }

    /// Packets are being sent again: no ACK from now on says when the first copy arrived.
    pub fn forget(&mut self) {
        self.len = 0;
        self.head = 0;
    }

    /// Packet `psn` is being sent again: it is no longer timed.
    pub fn forget_psn(&mut self, psn: Psn) {
        for i in 0..self.len {
            let slot = &mut self.ring[(self.head + i) % PROBES];
            if slot.0 == psn.value() {
                // Its time moves to "never": an ACK covering it takes the newer probes'.
                slot.1 = Duration::MAX;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn smooths_as_rfc_6298() {
        let mut r = RttEstimator::default();
        assert_eq!(r.rto(), INITIAL_RTO);
        r.update(Duration::ZERO, 100 * US);
        assert_eq!(r.srtt(), Some(100 * US));
        assert_eq!(r.rto(), MIN_RTO, "300 µs is under the floor");
        r.update(Duration::ZERO, 200 * US);
        // rttvar = 3/4·50 + 1/4·100 = 62.5; srtt = 7/8·100 + 1/8·200 = 112.5
        assert_eq!(r.srtt(), Some(112_500 * Duration::from_nanos(1)));
        r.update(Duration::ZERO, 10_000 * US);
        assert!(r.rto() >= 10 * MIN_RTO, "twice the latest");
        assert_eq!(r.latest(), 10_000 * US);
        assert_eq!(r.base(), Some(100 * US));
    }

    #[test]
    fn base_rtt_forgets_an_old_minimum_after_two_windows() {
        let mut r = RttEstimator::default();
        r.update(Duration::ZERO, 50 * US);
        r.update(BASE_WINDOW, 400 * US);
        assert_eq!(
            r.base(),
            Some(50 * US),
            "one window later: still remembered"
        );
        r.update(BASE_WINDOW * 2, 400 * US);
        assert_eq!(r.base(), Some(400 * US));
    }

    #[test]
    fn probes_time_the_newest_packet_an_ack_covers() {
        let mut p = Probes::default();
        p.sent(Psn::new(10), 100 * US);
        p.sent(Psn::new(20), 150 * US);
        p.sent(Psn::new(30), 200 * US);
        assert_eq!(p.acked(Psn::new(10), 250 * US), None, "covers nothing");
        assert_eq!(p.acked(Psn::new(21), 300 * US), Some(150 * US));
        assert_eq!(p.acked(Psn::new(31), 260 * US), Some(60 * US));
        assert_eq!(p.acked(Psn::new(40), 400 * US), None);
    }

    #[test]
    fn probes_wrap_and_forget() {
        let mut p = Probes::default();
        for i in 0..(PROBES as u32 + 4) {
            p.sent(Psn::new(0xFF_FFF0 + i), Duration::from_micros(u64::from(i)));
        }
        // Across the PSN wrap, the newest covered is 0xFF_FFF0 + 19 = 0x000003.
        assert_eq!(
            p.acked(Psn::new(4), Duration::from_micros(100)),
            Some(Duration::from_micros(100 - 19))
        );
        p.sent(Psn::new(5), Duration::ZERO);
        p.forget();
        assert_eq!(p.acked(Psn::new(100), Duration::from_micros(1)), None);
        // A packet sent again is no longer timed; the older one still is.
        p.sent(Psn::new(200), Duration::ZERO);
        p.sent(Psn::new(210), Duration::from_micros(5));
        p.forget_psn(Psn::new(210));
        assert_eq!(
            p.acked(Psn::new(211), Duration::from_micros(50)),
            Some(Duration::from_micros(50))
        );
    }
}
