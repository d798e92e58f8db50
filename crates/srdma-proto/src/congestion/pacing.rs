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

    fn refill(&mut self, now: Duration) {
        let Some(dt) = now.checked_sub(self.at) else {
            return;
        };
        let earned = u128::from(self.rate) * dt.as_nanos() / 1_000_000_000;
        let cap = self.capacity() as i64;
        self.tokens = (self.tokens as i128 + earned as i128).min(i128::from(cap)) as i64;
        self.at = now;
    }

    /// When a packet may go: `None` now (there are tokens left), else the time at which the
    /// bucket is no longer in debt.
    pub fn delay(&mut self, now: Duration) -> Option<Duration> {
        self.refill(now);
        if self.tokens > 0 {
            return None;
        }
        let debt = (1 - self.tokens) as u128;
        let wait = (debt * 1_000_000_000).div_ceil(u128::from(self.rate));
        Some(now + Duration::from_nanos(wait.min(u128::from(u64::MAX)) as u64))
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
        // In debt by 0 bytes: one byte's worth of time (10 ns) until the next.
        let next = p.delay(t0).unwrap();
        assert_eq!(next - t0, Duration::from_nanos(10));
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
        // 16 KiB + 1 byte of debt at 1 MB/s.
        assert_eq!(p.delay(t0), Some(Duration::from_nanos(1_000)));
        p.sent(4096, t0);
        assert_eq!(p.delay(t0), Some(Duration::from_nanos(4_097_000)));
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
