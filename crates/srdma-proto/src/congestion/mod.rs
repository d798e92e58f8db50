//! Congestion control of an RC QP's sends, sans-IO: what the requester may have in flight
//! (a window of PSNs) and how fast it may send (a pacing rate), from what it sees anyway —
//! ACKs with the time their AckReq packet left (round-trip time), losses (PSN-sequence NAKs,
//! implied NAKs, gaps a selective-repeat peer reports), retransmission timeouts, and CNPs.
//! It works against any peer: nothing is asked of the responder beyond the IBTA's ACKs.
//!
//! - [`window`]: the window, slow start and additive increase, multiplicative cuts.
//! - [`rtt`]: the round-trip time and the path's base RTT.
//! - [`dcqcn`]: the reaction point of DCQCN: a rate limit that CNPs cut.
//! - [`pacing`]: the token bucket that applies a rate.
//! - [`responses`]: the rate of READ responses toward a go-back-N requester, cut when it
//!   asks for responses again.
//!
//! The [`Controller`] joins them. Its policy:
//!
//! - **Delay** (Swift, Kumar et al., SIGCOMM 2020: clouds mark nothing): once per round trip
//!   (an epoch ends when the ACK passes what was sent when it began), if the least RTT sample
//!   of the epoch — the least, so that a responder descheduled for a moment does not count —
//!   exceeds the target, the window is cut by `β·(rtt − target)/rtt`, at most by
//!   [`MAX_DELAY_CUT`]. The target is a fixed [`DELAY_TARGET`] (as Swift's, so that flows
//!   sharing a queue aim at the same delay: a target measured from each flow's own base RTT
//!   favours the flow that came last, which measured its base with the queue already
//!   built), or the base RTT plus [`DELAY_SLACK`] on a longer path. Delay guards against a
//!   deep queue (bufferbloat); a shallow one drops or marks first.
//! - **Loss**: once per loss episode (until the ACK passes what was sent when the loss was
//!   seen), the window is cut to [`LOSS_CUT`] when the loss looks like congestion — it
//!   follows another within [`LOSS_MEMORY`] round trips (a full queue drops again and
//!   again), or the last RTT sample is above target — and to [`RANDOM_LOSS_CUT`] when it is
//!   isolated (random loss on a lossy link: halving the window for it would be paid for over
//!   many round trips; BBRv2 likewise ignores loss below a rate).
//! - **Timeout** (the QP's IBTA timer fired): the window collapses to its floor.
//! - **ECN**: a CNP cuts the pacing rate by DCQCN's rules; none, and the QP is not paced.
//!
//! Between two processes of one host ([`Controller::unlimited`]) nothing is controlled: the
//! path is memory that never drops.

pub mod dcqcn;
pub mod pacing;
pub mod responses;
pub mod rtt;
pub mod window;

use core::time::Duration;

use srdma_wire::Psn;

pub use window::{INITIAL_SR_WINDOW_PSNS, INITIAL_WINDOW_PSNS, MAX_WINDOW_PSNS, MIN_WINDOW_PSNS};

/// The round-trip time the window aims below. A software responder handles packets in
/// batches and its host schedules it late now and then: its RTT under load is several times
/// its idle RTT (tens of µs) without any network queue, and stays well below this.
pub const DELAY_TARGET: Duration = Duration::from_millis(1);
/// A path whose base RTT is above this is long: its target is its base plus
/// [`DELAY_SLACK`]. Below, every flow aims at the same [`DELAY_TARGET`], whatever base it
/// measured: a flow that starts into a queue others built measures that queue as its base
/// (up to a millisecond or so in an incast), and a target drawn from it would let that
/// flow keep the queue at its own higher target while every other is cut to its floor.
pub const LONG_PATH: Duration = Duration::from_millis(2);
/// On a long path ([`LONG_PATH`]), the queueing delay tolerated above the base.
pub const DELAY_SLACK: Duration = Duration::from_micros(250);
/// Swift's flow-based scaling: what a window at [`MIN_WINDOW_PSNS`] adds to its target, in
/// proportion to `1/√window` (nothing at [`MAX_WINDOW_PSNS`]). Flows that share a queue
/// converge to equal windows, as the one with the smaller window tolerates more delay.
pub const FLOW_SCALING: Duration = Duration::from_millis(1);
/// Swift's β: how much of the excess delay a cut takes off.
const DELAY_BETA: (u64, u64) = (4, 5);
/// The deepest cut a delay above target makes in one round trip (Swift's max_mdf: 1/2).
pub const MAX_DELAY_CUT: (u32, u32) = (1, 2);
/// The window after a loss while the path shows a queue.
pub const LOSS_CUT: (u32, u32) = (1, 2);
/// The window after an isolated loss.
pub const RANDOM_LOSS_CUT: (u32, u32) = (7, 8);
/// A loss episode that begins within this many round trips of the last one is congestion.
pub const LOSS_MEMORY: u64 = 4;

/// A notification point sends at most one CNP per QP per this long (ConnectX's default
/// `min_time_between_cnps`, DCQCN's 50 µs).
pub const CNP_INTERVAL: Duration = Duration::from_micros(50);

/// What a controller has seen and where it stands, for counters and `--stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CcStats {
    /// The window, PSNs.
    pub window_psns: u32,
    /// The pacing rate limit, bytes per second (`None`: not paced).
    pub rate: Option<u64>,
    /// The smoothed RTT.
    pub srtt: Option<Duration>,
    /// The base RTT.
    pub base_rtt: Option<Duration>,
    /// Loss episodes the window reacted to.
    pub loss_cuts: u64,
    /// Round trips whose delay cut the window.
    pub delay_cuts: u64,
    /// Retransmission timeouts the window collapsed for.
    pub timeouts: u64,
    /// Of the early ones (on measured RTT), those found spurious and undone (F-RTO).
    pub spurious_timeouts: u64,
    /// CNPs taken in.
    pub cnps: u64,
    /// The READ responses' rate limit, bytes per second (`None`: not paced; see
    /// [`responses`]).
    pub read_rate: Option<u64>,
    /// Repeated READs that cut it.
    pub read_cuts: u64,
}

/// The flow's part of the delay target (Swift's `fs_range · (1/√w − 1/√max) / (1/√min −
/// 1/√max)`, clamped): [`FLOW_SCALING`] at [`MIN_WINDOW_PSNS`] or less, nothing at
/// [`MAX_WINDOW_PSNS`].
pub fn flow_scaling(window_psns: u32) -> Duration {
    let inv = |w: u32| 1.0 / f64::from(w.max(1)).sqrt();
    let (lo, hi) = (inv(MAX_WINDOW_PSNS), inv(MIN_WINDOW_PSNS));
    let f = ((inv(window_psns) - lo) / (hi - lo)).clamp(0.0, 1.0);
    FLOW_SCALING.mul_f64(f)
}

/// The send rate of the last measured period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RateMeter {
    start: Duration,
    bytes: u64,
    last: u64,
}

/// A period of the rate meter.
const RATE_METER_PERIOD: Duration = Duration::from_millis(1);

impl RateMeter {
    fn sent(&mut self, now: Duration, bytes: u32) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= RATE_METER_PERIOD {
            self.last = rate_of(self.bytes, elapsed);
            self.start = now;
            self.bytes = 0;
        }
        self.bytes += u64::from(bytes);
    }

    /// Bytes per second: the last full period's, or the current one's when it is higher.
    fn rate(&self, now: Duration) -> u64 {
        let elapsed = now.saturating_sub(self.start);
        let current = if elapsed >= RATE_METER_PERIOD / 10 {
            rate_of(self.bytes, elapsed)
        } else {
            0
        };
        self.last.max(current)
    }
}

fn rate_of(bytes: u64, over: Duration) -> u64 {
    let ns = over.as_nanos().max(1);
    (u128::from(bytes) * 1_000_000_000 / ns).min(u128::from(u64::MAX)) as u64
}

/// A round trip of decisions on delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Epoch {
    /// Ends when the ACK passes this PSN (`None`: not begun, nothing sent yet).
    until: Option<Psn>,
    /// The least sample in it.
    least: Duration,
}

/// The congestion controller of one RC requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controller {
    window: window::Window,
    recovery: window::Recovery,
    rtt: rtt::RttEstimator,
    probes: rtt::Probes,
    dcqcn: dcqcn::Dcqcn,
    pacer: pacing::Pacer,
    epoch: Epoch,
    meter: RateMeter,
    /// The engine's share cap on the window.
    cap: u32,
    /// The engine's hold on new PSNs (see [`Controller::set_hold`]); `u32::MAX`: none.
    hold: u32,
    /// After an early retransmission timeout: the window it collapsed, and the PSN before
    /// which packets have been sent again since (see [`Controller::on_early_timeout`]).
    frto: Option<(window::Window, Psn)>,
    /// Round trips (epochs) ended so far.
    epochs: u64,
    /// The epoch count when the last loss episode began.
    last_loss: Option<u64>,
    unlimited: bool,
    stats: CcStats,
}

impl Default for Controller {
    fn default() -> Self {
        Controller {
            window: window::Window::default(),
            recovery: window::Recovery::default(),
            rtt: rtt::RttEstimator::default(),
            probes: rtt::Probes::default(),
            dcqcn: dcqcn::Dcqcn::default(),
            pacer: pacing::Pacer::new(u64::MAX, Duration::ZERO),
            epoch: Epoch {
                until: None,
                least: Duration::MAX,
            },
            meter: RateMeter::default(),
            cap: u32::MAX,
            hold: u32::MAX,
            frto: None,
            epochs: 0,
            last_loss: None,
            unlimited: false,
            stats: CcStats::default(),
        }
    }
}

impl Controller {
    /// How many PSNs may be outstanding now: the congestion window (the largest on a path
    /// of memory), within the engine's share cap ([`Controller::set_cap`]).
    pub fn window(&self) -> u32 {
        let w = if self.unlimited {
            MAX_WINDOW_PSNS
        } else {
            self.window.psns()
        };
        w.min(self.cap).min(self.hold)
    }

    /// Whether the pacer holds the next packet once a packet of `bytes` leaves at `now`:
    /// such a packet asks for an ACK, so that what was sent is acknowledged during the
    /// pacer's gap and not left for the tail loss probe and the RTO, which count from the
    /// last ACK.
    pub fn paced_after(&self, now: Duration, bytes: u32) -> bool {
        self.dcqcn.rate().is_some() && self.pacer.empties_with(bytes, now)
    }

    /// How many packets may go between two that ask for an ACK: `max` (rxe: 64), or half
    /// the window when that is less, so that a small window is acknowledged before it runs
    /// dry (a responder answers AckReq packets only).
    pub fn ack_every(&self, max: u32) -> u32 {
        max.min(self.window() / 2).max(1)
    }

    /// Caps the window at `psns` (at least [`MIN_WINDOW_PSNS`]): the engine's fair share of
    /// what one destination takes in flight when many QPs send to it (thousands of QPs
    /// between two processes share one socket buffer or ring; their windows together must
    /// fit it). `u32::MAX`: no cap.
    pub fn set_cap(&mut self, psns: u32) {
        self.cap = psns.max(MIN_WINDOW_PSNS);
    }

    /// Holds the window at `psns` (`None`: no hold), below [`MIN_WINDOW_PSNS`] and down to
    /// 0: what the QP has in flight when the engine's budget for its destination, shared by
    /// all its QPs there, is spent. It may then resend what is in flight (go-back-N's
    /// window starts at the oldest unacknowledged PSN) and send nothing new.
    pub fn set_hold(&mut self, psns: Option<u32>) {
        self.hold = psns.unwrap_or(u32::MAX);
    }

    /// The peer agreed to selective repeat (an srdma peer): a smaller first window
    /// ([`INITIAL_SR_WINDOW_PSNS`]) before anything was sent.
    pub fn selective_peer(&mut self) {
        if !self.unlimited && self.epoch.until.is_none() {
            self.window.restart_selective(INITIAL_SR_WINDOW_PSNS);
        }
    }

    /// The path is memory (a same-host peer's ring): the largest window, no pacing, and no
    /// reaction to what cannot happen there.
    pub fn unlimited(&mut self) {
        self.unlimited = true;
        self.window.open_wide();
    }

    /// Whether the path is memory.
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }

    /// The window held a packet back.
    pub fn held(&mut self) {
        // Held by the cap, not the congestion window: no evidence for the latter to grow.
        if self.cap.min(self.hold) >= self.window.psns() {
            self.window.held();
        }
    }

    /// A new request packet `psn` of `bytes` left at `now`; `ack_req`: it asks for an ACK.
    pub fn on_sent(&mut self, now: Duration, psn: Psn, bytes: u32, ack_req: bool) {
        if ack_req {
            self.probes.sent(psn, now);
        }
        if self.epoch.until.is_none() {
            self.epoch.until = Some(psn);
        }
        self.sent_bytes(now, bytes);
    }

    /// Packet `psn` of `bytes` was sent again at `now`.
    pub fn on_resent(&mut self, now: Duration, psn: Psn, bytes: u32) {
        self.probes.forget_psn(psn);
        if let Some((_, hi)) = &mut self.frto {
            if !psn.before(*hi) {
                *hi = psn.add(1);
            }
        }
        self.sent_bytes(now, bytes);
    }

    fn sent_bytes(&mut self, now: Duration, bytes: u32) {
        self.meter.sent(now, bytes);
        if self.dcqcn.rate().is_some() {
            self.dcqcn.sent(now, bytes);
            self.pacer.sent(bytes, now);
        }
    }

    /// An acknowledgement at `now` moved the oldest unacknowledged PSN to `acked_to`, by
    /// `newly` PSNs; `outstanding` PSNs sent are still unacknowledged, and `next` is the PSN
    /// after the highest sent (not the next a message was given: a message takes all its
    /// PSNs when it starts, and a round trip measured to its end would last as long as the
    /// whole message takes).
    pub fn on_ack(
        &mut self,
        now: Duration,
        acked_to: Psn,
        newly: u32,
        outstanding: u32,
        next: Psn,
    ) {
        if let Some(sample) = self.probes.acked(acked_to, now) {
            self.rtt.update(now, sample);
            self.epoch.least = self.epoch.least.min(sample);
        }
        // F-RTO (RFC 5682): the first ACK after an early timeout that acknowledges a packet
        // not sent again since then shows the first copies arrived — the timeout was
        // spurious (a responder descheduled for a moment), and what it collapsed is undone.
        if let Some((before, resent_to)) = self.frto.take() {
            if acked_to.after(resent_to) {
                self.window = before;
                self.stats.spurious_timeouts += 1;
            }
        }
        self.recovery.acked(acked_to);
        if self.unlimited {
            return;
        }
        if !self.recovery.active() {
            self.window.acked(newly, outstanding);
        }
        // The epoch ends with the first ACK of a packet sent in it: one round trip.
        if self.epoch.until.is_some_and(|u| acked_to.after(u)) {
            let least = std::mem::replace(&mut self.epoch.least, Duration::MAX);
            self.epoch.until = Some(next);
            self.epochs += 1;
            if let Some(target) = self.target()
                && least != Duration::MAX
                && least > target
            {
                // Swift: cut by β·(rtt − target)/rtt, at most MAX_DELAY_CUT.
                let excess = (least - target).as_nanos();
                let (b, bd) = DELAY_BETA;
                let cut = (excess * u128::from(b) * 1000 / (least.as_nanos() * u128::from(bd)))
                    .min(1000) as u32;
                let keep = (1000 - cut).max(1000 * MAX_DELAY_CUT.0 / MAX_DELAY_CUT.1);
                self.window.cut(keep, 1000);
                self.stats.delay_cuts += 1;
            }
        }
    }

    /// The delay above which the window shrinks: `None` before the first sample. The path's
    /// part is [`DELAY_TARGET`] for every flow whose base RTT is below [`LONG_PATH`], and
    /// the base plus [`DELAY_SLACK`] beyond; the flow's part ([`flow_scaling`]) grows as its
    /// window shrinks.
    pub fn target(&self) -> Option<Duration> {
        let base = self.rtt.base()?;
        let path = if base > LONG_PATH {
            base + DELAY_SLACK
        } else {
            DELAY_TARGET
        };
        Some(path + flow_scaling(self.window.psns()))
    }

    /// Whether the last RTT sample shows a queue beyond the target.
    fn queue_seen(&self) -> bool {
        self.target().is_some_and(|t| self.rtt.latest() > t)
    }

    /// A loss was seen at `now` (a PSN-sequence NAK, an implied NAK, a gap reported by a
    /// selective-repeat peer) while `next` was the PSN after the highest sent.
    pub fn on_loss(&mut self, _now: Duration, next: Psn) {
        self.probes.forget();
        if self.unlimited || !self.recovery.loss(next) {
            return;
        }
        let recent = self
            .last_loss
            .is_some_and(|e| self.epochs.saturating_sub(e) <= LOSS_MEMORY);
        self.last_loss = Some(self.epochs);
        let (num, den) = if recent || self.queue_seen() {
            LOSS_CUT
        } else {
            RANDOM_LOSS_CUT
        };
        self.window.cut(num, den);
        self.stats.loss_cuts += 1;
    }

    /// The retransmission timer fired at `now`.
    pub fn on_timeout(&mut self, _now: Duration) {
        self.probes.forget();
        self.frto = None;
        if self.unlimited {
            return;
        }
        self.window.collapse();
        self.stats.timeouts += 1;
    }

    /// The early retransmission timer (on measured RTT) fired at `now`, with `from` the
    /// oldest unacknowledged PSN, from which packets go again: the window collapses, as on
    /// a timeout, but is restored if the next ACK shows the timeout was spurious.
    pub fn on_early_timeout(&mut self, now: Duration, from: Psn) {
        let before = self.window;
        self.on_timeout(now);
        if !self.unlimited {
            self.frto = Some((before, from));
        }
    }

    /// A CNP for this QP came at `now`.
    pub fn on_cnp(&mut self, now: Duration) {
        self.stats.cnps += 1;
        if self.unlimited {
            return;
        }
        let limited = self.dcqcn.rate().is_some();
        self.dcqcn.cnp(now, self.meter.rate(now));
        if let Some(rate) = self.dcqcn.rate() {
            if limited {
                self.pacer.set_rate(rate, now);
            } else {
                self.pacer = pacing::Pacer::new(rate, now);
            }
        }
    }

    /// When the next packet may leave: `None` at once, else not before the time returned.
    pub fn pace(&mut self, now: Duration) -> Option<Duration> {
        self.dcqcn.advance(now);
        let rate = self.dcqcn.rate()?;
        if rate != self.pacer.rate() {
            self.pacer.set_rate(rate, now);
        }
        self.pacer.delay(now)
    }

    /// Where the controller stands.
    pub fn stats(&self) -> CcStats {
        CcStats {
            window_psns: self.window(),
            rate: self.dcqcn.rate(),
            srtt: self.rtt.srtt(),
            base_rtt: self.rtt.base(),
            ..self.stats
        }
    }

    /// The RTT estimator (for a retransmission timeout on measured time).
    pub fn rtt(&self) -> &rtt::RttEstimator {
        &self.rtt
    }
}

/// The notification point's side: at most one CNP per QP per [`CNP_INTERVAL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CnpGate {
    last: Option<Duration>,
}

impl CnpGate {
    /// A CE-marked packet came at `now`: true when a CNP should answer it.
    pub fn marked(&mut self, now: Duration) -> bool {
        if self
            .last
            .is_some_and(|l| now.saturating_sub(l) < CNP_INTERVAL && now >= l)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// A controller toward a selective-repeat peer, its window opened to 128 PSNs.
    fn selective() -> Controller {
        let mut c = Controller::default();
        c.selective_peer();
        c.held();
        c.on_ack(Duration::ZERO, Psn::new(0), 112, 0, Psn::new(0));
        assert_eq!(c.window(), 128);
        c
    }

    /// Sends `n` packets of 1 KiB from `psn` at `now`, one AckReq at the end.
    fn send(c: &mut Controller, now: Duration, psn: &mut Psn, n: u32) {
        for i in 0..n {
            let p = *psn;
            *psn = psn.add(1);
            c.on_sent(now, p, 1024, i + 1 == n);
        }
    }

    #[test]
    fn a_standing_queue_shrinks_the_window_once_per_round_trip() {
        let mut c = selective();
        let mut psn = Psn::new(0);
        let mut now = Duration::ZERO;
        // Base RTT 100 µs.
        send(&mut c, now, &mut psn, 64);
        now += 100 * US;
        c.on_ack(now, psn, 64, 0, psn);
        assert_eq!(c.stats().base_rtt, Some(100 * US));
        assert_eq!(c.window(), INITIAL_WINDOW_PSNS);
        assert_eq!(c.target(), Some(DELAY_TARGET + flow_scaling(128)));
        // Then RTTs of 2 ms: each round trip cuts by 0.8·(rtt − target)/rtt, the target
        // rising as the window shrinks.
        for round in 0..3 {
            let (w, target) = (c.window(), c.target().unwrap());
            let excess = (2000 * US - target).as_secs_f64() / 2e-3;
            send(&mut c, now, &mut psn, 64);
            now += 2000 * US;
            c.on_ack(now, psn, 64, 0, psn);
            assert_eq!(c.stats().delay_cuts, round + 1);
            let keep = 1.0 - 0.8 * excess;
            assert!(
                (f64::from(c.window()) - f64::from(w) * keep).abs() <= 1.0,
                "round {round}: {w} × {keep:.3} → {}",
                c.window()
            );
        }
        assert!(c.window() < 64);
        // One sample below target in a round trip spares it.
        let w = c.window();
        send(&mut c, now, &mut psn, 2);
        c.on_sent(now, psn, 1024, true);
        psn = psn.add(1);
        now += 150 * US;
        c.on_ack(now, psn.sub(1), 1, 0, psn);
        now += 2000 * US;
        c.on_ack(now, psn, 1, 0, psn);
        assert_eq!(c.window(), w);
    }

    #[test]
    fn loss_cuts_once_per_episode_and_less_on_an_idle_path() {
        let mut c = selective();
        let mut psn = Psn::new(0);
        send(&mut c, Duration::ZERO, &mut psn, 64);
        c.on_ack(100 * US, psn, 64, 0, psn);
        send(&mut c, 100 * US, &mut psn, 64);
        // No queue: a loss is noise.
        c.on_loss(150 * US, psn);
        assert_eq!(c.window(), 128 * 7 / 8);
        c.on_loss(160 * US, psn);
        assert_eq!(c.window(), 112, "same episode");
        c.on_ack(300 * US, psn, 64, 0, psn);
        // A queue now (2 ms, above target), rounds enough for the first loss to be old: the
        // next loss is congestion all the same.
        let mut now = 300 * US;
        for _ in 0..=LOSS_MEMORY + 1 {
            send(&mut c, now, &mut psn, 8);
            now += 2000 * US;
            c.on_ack(now, psn, 8, 0, psn);
        }
        let w = c.window();
        assert!(w < 112, "the round trips' delay cut it");
        send(&mut c, now, &mut psn, 8);
        c.on_loss(now + 100 * US, psn);
        assert_eq!(c.window(), (w / 2).max(MIN_WINDOW_PSNS));
        assert_eq!(c.stats().loss_cuts, 2);
        c.on_timeout(now + 200 * US);
        assert_eq!(c.window(), MIN_WINDOW_PSNS);
        assert_eq!(c.stats().timeouts, 1);
        // Toward an IBTA peer, never below rxe's window.
        let mut c = Controller::default();
        c.on_timeout(Duration::ZERO);
        assert_eq!(c.window(), INITIAL_WINDOW_PSNS);
    }

    #[test]
    fn the_cap_bounds_the_window_and_its_acks() {
        let mut c = Controller::default();
        assert_eq!(c.ack_every(64), 64);
        c.set_cap(10);
        assert_eq!(c.window(), 10);
        assert_eq!(c.ack_every(64), 5);
        c.set_cap(1);
        assert_eq!(c.window(), MIN_WINDOW_PSNS);
        // Held by the cap: the window itself does not grow.
        c.held();
        c.on_ack(Duration::ZERO, Psn::new(64), 64, 0, Psn::new(64));
        c.set_cap(u32::MAX);
        assert_eq!(c.window(), INITIAL_WINDOW_PSNS);
    }

    #[test]
    fn a_hold_goes_below_the_floor_and_lets_go() {
        let mut c = Controller::default();
        c.set_cap(64);
        c.set_hold(Some(0));
        assert_eq!(c.window(), 0, "nothing new while the budget is spent");
        assert_eq!(c.ack_every(64), 1);
        c.set_hold(Some(3));
        assert_eq!(c.window(), 3, "what it had in flight, below the floor");
        c.set_hold(None);
        assert_eq!(c.window(), 64, "the cap again");
    }

    #[test]
    fn cnps_pace_the_rate_it_was_sending_at() {
        let mut c = Controller::default();
        let mut psn = Psn::new(0);
        let mut now = Duration::ZERO;
        assert_eq!(c.pace(now), None);
        // 1 KiB every µs: ~1 GB/s for 2 ms.
        for _ in 0..2000 {
            send(&mut c, now, &mut psn, 1);
            now += US;
        }
        c.on_cnp(now);
        let rate = c.stats().rate.expect("limited");
        assert!((400_000_000..600_000_000).contains(&rate), "{rate}");
        // The burst goes, then packets wait.
        let mut sent = 0u64;
        while c.pace(now).is_none() {
            send(&mut c, now, &mut psn, 1);
            sent += 1024;
        }
        assert!(sent >= pacing::MIN_BURST_BYTES);
        let at = c.pace(now).unwrap();
        assert!(at > now);
        assert_eq!(c.stats().cnps, 1);
    }

    #[test]
    fn unlimited_paths_are_not_controlled() {
        let mut c = Controller::default();
        c.unlimited();
        c.on_loss(Duration::ZERO, Psn::new(5));
        c.on_timeout(Duration::ZERO);
        c.on_cnp(Duration::ZERO);
        assert_eq!(c.window(), MAX_WINDOW_PSNS);
        assert_eq!(c.pace(Duration::ZERO), None);
        assert_eq!(c.ack_every(64), 64);
    }

    #[test]
    fn one_cnp_per_interval() {
        let mut g = CnpGate::default();
        assert!(g.marked(100 * US));
        assert!(!g.marked(120 * US));
        assert!(g.marked(150 * US));
        // A clock that went back does not silence the gate forever.
        assert!(g.marked(10 * US));
    }
}
