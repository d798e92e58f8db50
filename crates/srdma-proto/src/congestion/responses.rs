//! The rate of a responder's READ responses toward a go-back-N requester.
//!
//! READ responses are not acknowledged: the responder sends a READ's packets as fast as it
//! can, and learns that some were lost only when the requester asks for them again — a READ
//! request with a PSN it has already executed (IBA 9.7.5.1.4). A requester whose receive
//! path is slower than srdma's send path (kernel rxe in a slow guest, a host busy elsewhere)
//! loses the tail of every long burst, waits for its retransmission timer, and asks again:
//! rxe reading 2 MiB from srdma in a TCG guest got 1.7 MB/s, against 17.9 MB/s from another
//! rxe, because each READ cost a timeout. rxe's completer drops out-of-sequence READ
//! responses and waits for its timer; no NIC paces READ responses either, but a NIC's peer
//! drains at line rate.
//!
//! So a repeated READ is this QP's loss signal for its responses, and the policy is AIMD on
//! a pacing rate:
//!
//! - the first repeat limits the responses to half the rate they were leaving at (the
//!   [`RateMeter`](super::RateMeter)'s), each later one halves the limit; the repeats that
//!   one loss brings at once (a requester's retry resends every READ still outstanding) cut
//!   once: a repeat within [`REPEAT_GUARD`] of the last cut is the same loss;
//! - after [`HOLD`] without a repeat the limit grows by 1/[`GROWTH`] every [`GROW_PERIOD`],
//!   and goes once it is back at the rate first measured.
//!
//! A selective-repeat requester (an srdma peer) paces its READs itself: its window covers
//! the responses it asked for. A same-host path is memory and never drops. Neither is paced
//! here (the transport does not call this for them).

use core::time::Duration;

use super::{RateMeter, dcqcn::MIN_RATE, pacing::Pacer};

/// Repeats closer than this to the last cut are the same loss.
pub const REPEAT_GUARD: Duration = Duration::from_millis(10);
/// How long the limit stays where a cut left it.
pub const HOLD: Duration = Duration::from_millis(500);
/// How often the limit grows after [`HOLD`].
pub const GROW_PERIOD: Duration = Duration::from_millis(100);
/// Each growth adds 1/GROWTH of the limit.
pub const GROWTH: u64 = 16;

/// The READ responses' rate of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponsePacer {
    meter: RateMeter,
    /// The limit, bytes per second (`None`: not paced).
    limit: Option<u64>,
    pacer: Pacer,
    /// The rate measured at the first cut: reached again, the limit goes.
    ceiling: u64,
    /// The last cut, and the last growth.
    cut_at: Duration,
    grown_at: Duration,
    cuts: u64,
}

impl Default for ResponsePacer {
    fn default() -> Self {
        ResponsePacer {
            meter: RateMeter::default(),
            limit: None,
            pacer: Pacer::new(u64::MAX, Duration::ZERO),
            ceiling: 0,
            cut_at: Duration::ZERO,
            grown_at: Duration::ZERO,
            cuts: 0,
        }
    }
}

impl ResponsePacer {
    /// The limit, bytes per second (`None`: not paced).
    pub fn rate(&self) -> Option<u64> {
        self.limit
    }

    /// How many times a repeated READ cut the limit.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// A READ response of `bytes` left at `now`.
    pub fn sent(&mut self, now: Duration, bytes: u32) {
        self.meter.sent(now, bytes);
        if self.limit.is_some() {
            self.pacer.sent(bytes, now);
        }
    }

    /// The requester asked at `now` for READ responses it had been sent: some were lost.
    pub fn repeated(&mut self, now: Duration) {
        if self.limit.is_some() && now.saturating_sub(self.cut_at) < REPEAT_GUARD {
            return;
        }
        let measured = self.meter.rate(now);
        let from = match self.limit {
            Some(l) => l.min(measured.max(MIN_RATE)),
            None => {
                self.ceiling = measured.max(MIN_RATE);
                self.ceiling
            }
        };
        let limit = (from / 2).max(MIN_RATE);
        match self.limit {
            Some(_) => self.pacer.set_rate(limit, now),
            None => self.pacer = Pacer::new(limit, now),
        }
        self.limit = Some(limit);
        self.cut_at = now;
        self.grown_at = now;
        self.cuts += 1;
    }

    /// When the next response may leave: `None` at once, else not before the time returned.
    pub fn delay(&mut self, now: Duration) -> Option<Duration> {
        let limit = self.limit?;
        if now.saturating_sub(self.cut_at) >= HOLD {
            let since = now.saturating_sub(self.grown_at.max(self.cut_at + HOLD));
            let steps = (since.as_nanos() / GROW_PERIOD.as_nanos()).min(64) as u32;
            if steps > 0 {
                let mut l = limit;
                for _ in 0..steps {
                    l = l.saturating_add((l / GROWTH).max(1));
                }
                self.grown_at = now;
                if l >= self.ceiling {
                    self.limit = None;
                    return None;
                }
                self.pacer.set_rate(l, now);
                self.limit = Some(l);
            }
        }
        self.pacer.delay(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Sends `bytes` in 1 KiB packets at `rate` bytes/s from `from`, as far as the pacer
    /// lets; returns when the last left.
    fn burst(p: &mut ResponsePacer, from: Duration, bytes: u64, rate: u64) -> Duration {
        let mut now = from;
        let step = Duration::from_nanos(1024 * 1_000_000_000 / rate);
        let mut left = bytes;
        while left > 0 {
            if let Some(t) = p.delay(now) {
                now = now.max(t);
                continue;
            }
            p.sent(now, 1024);
            left = left.saturating_sub(1024);
            now += step;
        }
        now
    }

    #[test]
    fn unpaced_until_a_repeat_then_half_the_rate_measured() {
        let mut p = ResponsePacer::default();
        let t0 = Duration::from_secs(1);
        // 2 MiB at 100 MB/s: nothing holds it.
        let end = burst(&mut p, t0, 2 << 20, 100_000_000);
        assert_eq!(p.rate(), None);
        assert!(end - t0 < 22 * MS, "{:?}", end - t0);
        // The requester's timer fired and it asks again: half of ~100 MB/s.
        p.repeated(end + 1000 * MS);
        let r = p.rate().unwrap();
        assert!((45_000_000..=55_000_000).contains(&r), "{r}");
        assert_eq!(p.cuts(), 1);
        // The same 2 MiB now takes about twice as long.
        let t1 = end + 1000 * MS;
        let end = burst(&mut p, t1, 2 << 20, 100_000_000);
        let took = end - t1;
        assert!(took > 38 * MS && took < 46 * MS, "{took:?}");
    }

    #[test]
    fn the_repeats_of_one_loss_cut_once_later_ones_halve_again() {
        let mut p = ResponsePacer::default();
        let t0 = Duration::from_secs(1);
        let end = burst(&mut p, t0, 4 << 20, 100_000_000);
        // A retry resends every outstanding READ: four repeats within microseconds.
        for i in 0..4 {
            p.repeated(end + Duration::from_micros(i));
        }
        assert_eq!(p.cuts(), 1);
        let first = p.rate().unwrap();
        // The next loss, a timeout later, halves the limit again (the meter saw the paced
        // rate, not more).
        let end = burst(&mut p, end, 2 << 20, 100_000_000);
        p.repeated(end + 67 * MS);
        assert_eq!(p.cuts(), 2);
        let second = p.rate().unwrap();
        assert!(second <= first / 2 + 1, "{first} → {second}");
        // Never below the floor.
        let mut now = end + 67 * MS;
        for _ in 0..40 {
            now += 20 * MS;
            p.repeated(now);
        }
        assert_eq!(p.rate(), Some(MIN_RATE));
    }

    #[test]
    fn the_limit_holds_then_grows_and_goes() {
        let mut p = ResponsePacer::default();
        let t0 = Duration::from_secs(1);
        let end = burst(&mut p, t0, 4 << 20, 100_000_000);
        p.repeated(end);
        let cut = p.rate().unwrap();
        // Within the hold: unchanged.
        let _ = p.delay(end + HOLD - MS);
        assert_eq!(p.rate(), Some(cut));
        // Ten periods after it: grown by (17/16)^10 ≈ 1.83.
        let _ = p.delay(end + HOLD + 10 * GROW_PERIOD);
        let grown = p.rate().unwrap();
        let want = (0..10).fold(cut, |l, _| l + l / GROWTH);
        assert_eq!(grown, want);
        // Back at the rate first measured: not paced any more.
        assert_eq!(p.delay(end + HOLD + 20 * GROW_PERIOD), None);
        assert_eq!(p.rate(), None);
    }

    #[test]
    fn a_slow_reader_is_met_within_a_few_losses() {
        // A reader that drains 17 MB/s behind a queue of 1000 packets (a TCG guest's tap):
        // 2 MiB READs one after another, each loss found by the reader 67 ms later.
        let mut p = ResponsePacer::default();
        let drain = 17_000_000u64;
        let mut now = Duration::from_secs(1);
        let mut losses = 0;
        let mut last_loss_round = 0;
        for round in 0..60 {
            let start = now;
            let end = burst(&mut p, start, 2 << 20, 100_000_000);
            // What the queue held at the end of the burst: sent minus drained.
            let took = (end - start).as_secs_f64();
            let backlog = (2u64 << 20) as f64 - drain as f64 * took;
            if backlog > 1000.0 * 1024.0 {
                losses += 1;
                last_loss_round = round;
                now = end + 67 * MS;
                p.repeated(now);
            } else {
                // The reader takes what is queued before it asks for the next READ.
                now = end + Duration::from_secs_f64(backlog.max(0.0) / drain as f64);
            }
        }
        // Unpaced, every round would lose (2 MiB at 100 MB/s leaves 1.7 MiB queued).
        assert!(losses <= 15, "{losses} losses in 60 rounds");
        assert!(last_loss_round > 0 && p.cuts() >= 2);
    }
}
