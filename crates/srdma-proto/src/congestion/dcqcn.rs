//! DCQCN's reaction point (Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments", SIGCOMM 2015): the sending rate of a QP that receives CNPs.
//!
//! A switch marks ECN CE past a queue threshold; the receiver answers marked packets with a
//! CNP (at most one per QP per [`super::CNP_INTERVAL`]); here, the sender cuts its current
//! rate `Rc` by `α/2` on each CNP, remembering the rate it had as the target `Rt`, and raises
//! `α`, the estimate of how often it is marked. Without CNPs, `α` decays every
//! [`ALPHA_PERIOD`] and the rate recovers in steps counted by a timer ([`RATE_PERIOD`]) and
//! a byte counter ([`RATE_BYTES`]): [`FAST_RECOVERY`] steps halfway back to `Rt`, then
//! additive increase of `Rt` by [`RATE_AI`] per step, then hyper increase by
//! [`RATE_HAI`] times the steps taken. The parameters are in the range of ConnectX's
//! defaults (`/sys/class/net/*/ecn/roce_rp/*`: time reset 300 µs, AI 5 Mb/s, HAI 50 Mb/s);
//! the byte counter is the paper's.
//!
//! The rate starts unlimited: the first CNP limits it to what the QP was sending (a NIC
//! starts at line rate, which software has none of), and once it has recovered to
//! [`RELEASE_FACTOR`] times that, the limit is lifted again. Everything runs on the times
//! it is given; elapsed periods are counted when the next event comes, so there are no
//! timers to arm.

use core::time::Duration;

/// The gain of `α` (1/256, as the paper).
const G_SHIFT: u32 = 8;
/// `α` in fixed point: this is 1.0.
const ALPHA_ONE: u32 = 1 << 20;
/// Without a CNP for this long, `α` decays by a factor `1 - g`.
pub const ALPHA_PERIOD: Duration = Duration::from_micros(55);
/// Without a CNP for this long, the limit is lifted whatever the rate recovered to (also
/// bounds the steps an event counts after a long silence).
pub const RELEASE_IDLE: Duration = Duration::from_secs(1);
/// The rate-increase timer.
pub const RATE_PERIOD: Duration = Duration::from_micros(300);
/// The rate-increase byte counter.
pub const RATE_BYTES: u64 = 10 << 20;
/// Steps of fast recovery before additive increase.
pub const FAST_RECOVERY: u32 = 5;
/// Additive increase of the target rate per step, bytes per second (5 Mb/s).
pub const RATE_AI: u64 = 5_000_000 / 8;
/// Hyper increase per step, bytes per second (50 Mb/s).
pub const RATE_HAI: u64 = 50_000_000 / 8;
/// The lowest rate a QP is ever cut to, bytes per second (10 Mb/s): CNPs, forged ones too,
/// slow a QP down but never stop it.
pub const MIN_RATE: u64 = 10_000_000 / 8;
/// Once the rate has recovered to this many times the rate it was first cut from, the
/// limit is lifted.
pub const RELEASE_FACTOR: u64 = 4;

/// The reaction point of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dcqcn {
    /// Limiting: a CNP came and the rate has not recovered since.
    active: bool,
    /// Current rate, bytes per second.
    rc: u64,
    /// Target rate.
    rt: u64,
    /// `α` in 1/[`ALPHA_ONE`].
    alpha: u32,
    /// The rate the first CNP cut from: what "recovered" means.
    start_rate: u64,
    /// When `α` last decayed (or a CNP came).
    alpha_at: Duration,
    /// When the rate timer last counted a step.
    timer_at: Duration,
    /// Bytes sent since the byte counter last counted a step.
    bytes: u64,
    /// Steps counted by the timer and by the byte counter since the last CNP.
    timer_steps: u32,
    byte_steps: u32,
    /// CNPs taken in.
    cnps: u64,
}

impl Default for Dcqcn {
    fn default() -> Self {
        Dcqcn {
            active: false,
            rc: u64::MAX,
            rt: u64::MAX,
            alpha: ALPHA_ONE,
            start_rate: 0,
            alpha_at: Duration::ZERO,
            timer_at: Duration::ZERO,
            bytes: 0,
            timer_steps: 0,
            byte_steps: 0,
            cnps: 0,
        }
    }
}

impl Dcqcn {
    /// The rate limit, bytes per second (`None`: not limited).
    pub fn rate(&self) -> Option<u64> {
        self.active.then_some(self.rc)
    }

    /// CNPs taken in so far.
    pub fn cnps(&self) -> u64 {
        self.cnps
    }

    /// `α` in 1/1024.
    pub fn alpha(&self) -> u32 {
        self.alpha >> 10
    }

    /// A CNP came at `now`; `sending` is the rate the QP was sending at (bytes per second),
    /// the starting point if it was not limited yet.
    pub fn cnp(&mut self, now: Duration, sending: u64) {
        self.advance(now);
        self.cnps += 1;
        if !self.active {
            self.active = true;
            self.rc = sending.max(MIN_RATE);
            self.start_rate = self.rc;
            self.alpha = ALPHA_ONE;
        }
        self.rt = self.rc;
        let cut = (u128::from(self.rc) * u128::from(self.alpha) / u128::from(2 * ALPHA_ONE)) as u64;
        self.rc = self.rc.saturating_sub(cut).max(MIN_RATE);
        self.alpha = self.alpha - (self.alpha >> G_SHIFT) + (ALPHA_ONE >> G_SHIFT);
        self.alpha_at = now;
        self.timer_at = now;
        self.bytes = 0;
        self.timer_steps = 0;
        self.byte_steps = 0;
    }

    /// `bytes` were sent at `now`.
    pub fn sent(&mut self, now: Duration, bytes: u32) {
        if !self.active {
            return;
        }
        self.advance(now);
        self.bytes += u64::from(bytes);
        while self.active && self.bytes >= RATE_BYTES {
            self.bytes -= RATE_BYTES;
            self.byte_steps += 1;
            self.increase();
        }
    }

    /// Counts the periods that passed up to `now`: `α`'s decay and the timer's steps.
    pub fn advance(&mut self, now: Duration) {
        if !self.active {
            return;
        }
        if now.saturating_sub(self.timer_at) >= RELEASE_IDLE {
            // A QP limited long ago: whatever it recovered to by now, it is free.
            *self = Dcqcn {
                cnps: self.cnps,
                ..Dcqcn::default()
            };
            return;
        }
        while now.saturating_sub(self.alpha_at) >= ALPHA_PERIOD && self.alpha > 0 {
            self.alpha -= (self.alpha >> G_SHIFT).max(1);
            self.alpha_at += ALPHA_PERIOD;
        }
        if self.alpha == 0 {
            self.alpha_at = now;
        }
        while self.active && now.saturating_sub(self.timer_at) >= RATE_PERIOD {
            self.timer_at += RATE_PERIOD;
            self.timer_steps += 1;
            self.increase();
        }
    }

    /// One step of rate increase.
    fn increase(&mut self) {
        let (t, b) = (self.timer_steps, self.byte_steps);
        if t.max(b) < FAST_RECOVERY {
            // Fast recovery: halfway back to the target.
        } else if t.min(b) > FAST_RECOVERY {
            // Hyper increase.
            let i = u64::from(t.min(b) - FAST_RECOVERY);
            self.rt = self.rt.saturating_add(RATE_HAI.saturating_mul(i));
        } else {
            self.rt = self.rt.saturating_add(RATE_AI);
        }
        self.rc = self.rc / 2 + self.rt / 2;
        if self.rc >= self.start_rate.saturating_mul(RELEASE_FACTOR) {
            *self = Dcqcn {
                cnps: self.cnps,
                ..Dcqcn::default()
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);
    const GBIT: u64 = 125_000_000;

    #[test]
    fn a_cnp_halves_the_rate_it_was_sending_at() {
        let mut d = Dcqcn::default();
        assert_eq!(d.rate(), None);
        d.cnp(Duration::ZERO, GBIT);
        assert_eq!(d.rate(), Some(GBIT / 2), "α starts at 1: cut by half");
        // α = 1 - 1/256 + 1/256 = 1 still; a second CNP at once halves again.
        d.cnp(Duration::ZERO, 0);
        assert_eq!(d.rate(), Some(GBIT / 4));
        assert_eq!(d.cnps(), 2);
    }

    #[test]
    fn alpha_decays_without_cnps_and_later_cuts_are_gentler() {
        let mut d = Dcqcn::default();
        d.cnp(Duration::ZERO, GBIT);
        // 256 periods without a CNP: α ≈ (1 - 1/256)^256 ≈ 0.37.
        d.advance(ALPHA_PERIOD * 256);
        assert!((300..450).contains(&d.alpha()), "{}", d.alpha());
        let before = d.rate().unwrap();
        d.cnp(ALPHA_PERIOD * 256, 0);
        let after = d.rate().unwrap();
        // A cut by α/2 ≈ 0.19.
        assert!(
            after > before * 3 / 4 && after < before * 9 / 10,
            "{before} → {after}"
        );
    }

    #[test]
    fn recovers_in_stages_and_lifts_the_limit() {
        let mut d = Dcqcn::default();
        d.cnp(Duration::ZERO, GBIT);
        let cut = d.rate().unwrap();
        // Fast recovery: five timer steps halve the distance to the target each time.
        d.advance(RATE_PERIOD * FAST_RECOVERY);
        let r = d.rate().unwrap();
        assert!(r > cut && r < GBIT && GBIT - r <= (GBIT - cut) / 31, "{r}");
        // Additive increase moves the target above the old rate.
        d.advance(RATE_PERIOD * (FAST_RECOVERY + 3));
        assert!(d.rate().unwrap() > r);
        // The timer alone never reaches hyper increase (it needs the byte counter too), but
        // additive increase does get there in the end: the limit is lifted.
        let mut t = RATE_PERIOD * 8;
        while d.rate().is_some() {
            t += RATE_PERIOD * 100;
            d.advance(t);
            assert!(t < RELEASE_IDLE, "not released by additive increase");
        }
        assert_eq!(d.cnps(), 1, "the count survives the release");
    }

    #[test]
    fn sending_brings_hyper_increase() {
        let mut d = Dcqcn::default();
        d.cnp(Duration::ZERO, GBIT);
        let mut now = Duration::ZERO;
        // Both counters past fast recovery: the target climbs by growing steps.
        let mut released_at = None;
        for step in 0..10_000u32 {
            now += RATE_PERIOD;
            d.sent(now, RATE_BYTES as u32);
            if d.rate().is_none() {
                released_at = Some(step);
                break;
            }
        }
        let steps = released_at.expect("released");
        assert!(steps < 200, "hyper increase is fast: {steps} steps");
    }

    #[test]
    fn a_long_silence_lifts_the_limit_at_once() {
        let mut d = Dcqcn::default();
        d.cnp(Duration::ZERO, 100 * GBIT);
        d.advance(RELEASE_IDLE + US);
        assert_eq!(d.rate(), None);
    }

    #[test]
    fn no_cnp_stream_drives_the_rate_below_the_floor() {
        let mut d = Dcqcn::default();
        for i in 0..10_000u64 {
            d.cnp(US * i as u32, GBIT);
        }
        assert_eq!(d.rate(), Some(MIN_RATE));
    }
}
