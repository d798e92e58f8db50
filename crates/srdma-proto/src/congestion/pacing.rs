//! Pacing: a token bucket that lets a QP send at a rate, in bursts no longer than
//! [`BURST`] of it (quinn-proto's `pacing.rs` has the same shape, for a window over an RTT).

use core::time::Duration;

/// How much time's worth of the rate a burst may carry. An engine wakes up no more often
/// than every few tens of microseconds (a system call, a thread switch); a shorter burst would
/// lose the rate between wake-ups, a longer one fills a switch's queue.
pub const BURST: Duration = Duration::from_micros(200);

/// The smallest burst, bytes: a few full packets, so pacing never cuts a message into
/// single datagrams (GSO sends runs).
pub const MIN_BURST_BYTES: u64 = 16 * 1024;

/// A token bucket in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacer {
    /// Bytes per second.
    rate: u64,
    /// Bytes that may go now; negative after a packet larger than what was left.
    tokens: i64,
    /// When tokens were last added.
    at: Duration,
}

impl Pacer {
    /// A full bucket at `rate` bytes per second.
    pub fn new(rate: u64, now: Duration) -> Pacer {
        let mut p = Pacer {
            rate: rate.max(1),
            tokens: 0,
            at: now,
        };
        p.tokens = p.capacity() as i64;
        p
    }

    /// The rate, bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Changes the rate from `now` on (what was earned at the old rate is kept, up to the
    /// new burst).
    pub fn set_rate(&mut self, rate: u64, now: Duration) {
        self.refill(now);
        self.rate = rate.max(1);
        self.tokens = self.tokens.min(self.capacity() as i64);
    }

    fn capacity(&self) -> u64 {
        let burst = (u128::from(self.rate) * BURST.as_nanos() / 1_000_000_000) as u64;
        burst.max(MIN_BURST_BYTES)
    }

    /// The tokens the bucket holds at `now`: what it held, plus what time earned since, up
    /// to a burst (time going backwards earns nothing).
    fn tokens_at(&self, now: Duration) -> i64 {
        let earned = now.checked_sub(self.at).map_or(0, |dt| {
            u128::from(self.rate) * dt.as_nanos() / 1_000_000_000
        });
        let earned = i64::try_from(earned).unwrap_or(i64::MAX);
        let cap = i64::try_from(self.capacity()).unwrap_or(i64::MAX);
        self.tokens.saturating_add(earned).min(cap)
    }

    fn refill(&mut self, now: Duration) {
        if now >= self.at {
            self.tokens = self.tokens_at(now);
            self.at = now;
        }
    }

    /// When a packet may go: `None` now (there are tokens left), else the time at which the
    /// bucket holds half a burst again. Not as soon as it is out of debt: that would wake
    /// the engine for every packet once the first burst is gone (a 1 KiB packet every 20 µs
    /// at 50 MB/s); half a burst keeps the rate while a wake-up comes late by up to the
    /// other half (quinn-proto's pacer likewise waits for most of a burst).
    pub fn delay(&mut self, now: Duration) -> Option<Duration> {
        self.refill(now);
        if self.tokens > 0 {
            return None;
        }
        let want = (self.capacity() / 2).max(1) as i128;
        let missing = (want - i128::from(self.tokens)) as u128;
        let wait = (missing * 1_000_000_000).div_ceil(u128::from(self.rate));
        Some(now + Duration::from_nanos(wait.min(u128::from(u64::MAX)) as u64))
    }

    /// Whether a packet of `bytes` leaving at `now` would leave the bucket empty, so that
    /// the next one waits (see [`Pacer::delay`]).
    pub fn empties_with(&self, bytes: u32, now: Duration) -> bool {
        self.tokens_at(now) <= i64::from(bytes)
    }

    /// `bytes` left at `now`.
    pub fn sent(&mut self, bytes: u32, now: Duration) {
        self.refill(now);
        self.tokens = self.tokens.saturating_sub(i64::from(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn sends_a_burst_then_at_the_rate() {
        // 100 MB/s: the burst is 20 kB.
        let t0 = Duration::from_secs(1);
        let mut p = Pacer::new(100 * MB, t0);
        let mut sent = 0u64;
        while p.delay(t0).is_none() {
            p.sent(1000, t0);
            sent += 1000;
        }
        assert_eq!(sent, 20_000);
        // Out of tokens: the next packet waits for half a burst (10 kB, 100 µs).
        let next = p.delay(t0).unwrap();
        assert_eq!(next - t0, Duration::from_micros(100));
        assert_eq!(p.delay(next), None);
        // Over one millisecond at most 100 kB more go.
        let mut now = t0;
        let end = t0 + Duration::from_millis(1);
        let mut later = 0u64;
        while now <= end {
            match p.delay(now) {
                None => {
                    p.sent(1000, now);
                    later += 1000;
                }
                Some(t) => now = t,
            }
        }
        assert!((99_000..=101_000).contains(&later), "{later}");
    }

    #[test]
    fn a_slower_rate_shrinks_the_burst_and_waits_longer() {
        let t0 = Duration::ZERO;
        let mut p = Pacer::new(1000 * MB, t0);
        p.set_rate(MB, t0);
        let mut sent = 0u64;
        while p.delay(t0).is_none() {
            p.sent(4096, t0);
            sent += 4096;
        }
        assert_eq!(sent, MIN_BURST_BYTES, "at 1 MB/s the smallest burst");
        // Half the smallest burst (8 KiB) at 1 MB/s.
        assert_eq!(p.delay(t0), Some(Duration::from_nanos(8_192_000)));
        // In debt by 4 KiB more: that long more.
        p.sent(4096, t0);
        assert_eq!(p.delay(t0), Some(Duration::from_nanos(12_288_000)));
    }

    #[test]
    fn a_paced_sender_wakes_once_per_half_burst_not_per_packet() {
        // 50 MB/s in 1 KiB packets for 100 ms: 4,883 packets, each a wake-up if the next
        // one went as soon as the bucket was out of debt.
        let t0 = Duration::from_secs(3);
        let end = t0 + Duration::from_millis(100);
        let mut p = Pacer::new(50 * MB, t0);
        let (mut now, mut bytes, mut packets, mut wakeups) = (t0, 0u64, 0u64, 0u64);
        loop {
            match p.delay(now) {
                None => {
                    p.sent(1024, now);
                    bytes += 1024;
                    packets += 1;
                }
                Some(t) if t <= end => {
                    now = t;
                    wakeups += 1;
                }
                Some(_) => break,
            }
        }
        // The rate holds: 5 MB in 100 ms, plus the first burst (16 KiB).
        assert!((4_990_000..=5_030_000).contains(&bytes), "{bytes}");
        // Half of the 16 KiB burst per wake-up: 8 packets each.
        assert!(
            wakeups * 8 <= packets + 8,
            "{wakeups} wake-ups for {packets} packets"
        );
        // Wake-ups that come late (by less than half a burst) lose nothing but the end: what
        // the last, later wake-up would have sent (half a burst and the lateness).
        let mut q = Pacer::new(50 * MB, t0);
        let (mut now, mut late_bytes) = (t0, 0u64);
        while now <= end {
            match q.delay(now) {
                None => {
                    q.sent(1024, now);
                    late_bytes += 1024;
                }
                Some(t) => now = t + Duration::from_micros(50),
            }
        }
        assert!(
            late_bytes + 12 * 1024 >= bytes,
            "{late_bytes} against {bytes}"
        );
    }

    #[test]
    fn the_packet_that_empties_the_bucket_is_known_before_it_goes() {
        let t0 = Duration::from_secs(1);
        // 100 MB/s: a 20 kB burst.
        let mut p = Pacer::new(100 * MB, t0);
        let mut left = 0;
        while !p.empties_with(1000, t0) {
            p.sent(1000, t0);
            left += 1;
        }
        assert_eq!(left, 19, "the 20th packet empties it");
        p.sent(1000, t0);
        assert!(p.delay(t0).is_some());
        // At the end of the wait, half a burst: 10 kB.
        let later = p.delay(t0).unwrap();
        assert!(!p.empties_with(9_999, later));
        assert!(p.empties_with(10_000, later));
        // What time earns counts, up to the burst.
        assert!(!p.empties_with(10_999, later + Duration::from_micros(10)));
        assert!(!p.empties_with(19_999, later + Duration::from_secs(1)));
        assert!(p.empties_with(20_000, later + Duration::from_secs(1)));
    }

    #[test]
    fn time_going_backwards_earns_nothing() {
        let mut p = Pacer::new(MB, Duration::from_secs(5));
        p.sent(100_000, Duration::from_secs(5));
        let d = p.delay(Duration::from_secs(4)).unwrap();
        assert!(d > Duration::from_secs(4));
        assert_eq!(Pacer::new(0, Duration::ZERO).rate(), 1, "never a zero rate");
    }
}
