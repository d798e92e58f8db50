//! Virtual time.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point in virtual time: nanoseconds since the simulation started.
///
/// The simulator owns the only clock; it jumps from one event to the next, so a test of a
/// 30-second retry timeout runs in microseconds and gives the same result on every machine.
/// Arithmetic saturates instead of panicking (`u64` nanoseconds cover 584 years).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The start of the simulation.
    pub const ZERO: Instant = Instant(0);
    /// The end of time; a deadline that never passes.
    pub const MAX: Instant = Instant(u64::MAX);

    /// The instant `ns` nanoseconds after the start.
    pub const fn from_nanos(ns: u64) -> Instant {
        Instant(ns)
    }

    /// Nanoseconds since the start (also the pcap timestamp of a capture).
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time since the start, for adapters whose clock is a [`Duration`] since an epoch.
    pub const fn since_start(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// Time elapsed from `earlier` to `self`, or zero when `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// Whole nanoseconds of `d`, saturated to `u64`.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(nanos(d)))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(nanos(d)))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    /// Saturates at zero, like [`Instant::saturating_duration_since`].
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Display for Instant {
    /// Seconds with nanosecond precision, e.g. `1.000250000s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_nanos(1_500);
        assert_eq!(t + Duration::from_nanos(500), Instant::from_nanos(2_000));
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(Instant::MAX + Duration::MAX, Instant::MAX);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::from_nanos(500), Duration::from_nanos(1_000));
        assert_eq!(t.since_start(), Duration::from_nanos(1_500));
        assert_eq!(
            Instant::from_nanos(1_000_250_000).to_string(),
            "1.000250000s"
        );
    }
}
