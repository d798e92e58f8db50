//! The congestion window: how many PSNs an RC requester may have sent and not yet seen
//! acknowledged.
//!
//! It grows, up to [`MAX_WINDOW_PSNS`], only while it is what limits the sends (it held a
//! packet back since the last acknowledgement):
//!
//! - **Slow start** (below `ssthresh`), in one of two ways ([`Growth`]):
//!   - toward an IBTA peer (rxe, a NIC, an srdma peer that did not agree to selective
//!     repeat), from rxe's fixed 128 (`RXE_MAX_UNACKED_PSNS`), doubling only on evidence
//!     that the window and not the responder is what limits — [`GROW_AFTER`] times in a
//!     row, the window held a packet back and the next acknowledgement covered every PSN
//!     sent (the responder had handled all of it and was idle while the requester waited).
//!     A responder that cannot keep up acknowledges part of what was sent (rxe answers the
//!     AckReq every 64 packets as it reaches it) and the window stays where it is: a bigger
//!     one would overrun it (kernel rxe in an emulated guest drops the burst, and go-back-N
//!     pays a window for each loss).
//!   - toward an srdma peer that agreed to selective repeat, from
//!     [`INITIAL_SR_WINDOW_PSNS`], by every PSN acknowledged (doubling per round trip, as
//!     TCP): a loss there costs the packets lost, not a window.
//!
//!   Between two hosts 128 is too little for a responder that handles packets in batches
//!   (over veth at MTU 1500, 0.55× one TCP stream at 128 PSNs, 0.9× at 1024:
//!   benchmarks/README.md).
//! - **Congestion avoidance** (at or above `ssthresh`, after the first cut): [`AI_PSNS`] more
//!   per round trip.
//!
//! It shrinks multiplicatively — by a factor the controller chooses for a loss, a delay above
//! target or a timeout — and leaves slow start then; never below its floor: rxe's 128
//! toward an IBTA peer (go-back-N resends a window for each loss and the IBTA counts every
//! resend against `retry_cnt`: a small window loses its one ACK, or its tail, and runs into
//! the retry limit on a lossy path where rxe's fixed window keeps going), [`MIN_WINDOW_PSNS`]
//! toward a selective-repeat peer, whose losses cost what was lost and are recovered on
//! measured RTT.

use srdma_wire::Psn;

/// The most PSNs the window grows to.
pub const MAX_WINDOW_PSNS: u32 = 1024;
/// Where a window starts (rxe's fixed window).
pub const INITIAL_WINDOW_PSNS: u32 = 128;
/// Where a window starts toward an srdma peer that agreed to selective repeat: many such
/// flows may start at once into one queue (an incast), and slow start reaches the largest
/// window in a few round trips anyway.
pub const INITIAL_SR_WINDOW_PSNS: u32 = 16;
/// The least a selective-repeat peer's window is ever cut to (thousands of QPs share one
/// path: their windows together must fit its queue).
pub const MIN_WINDOW_PSNS: u32 = 4;
/// Drained acknowledgements in a row, each after the window held a packet back, that double
/// an IBTA peer's window in slow start.
pub const GROW_AFTER: u32 = 2;
/// PSNs added per round trip in congestion avoidance.
pub const AI_PSNS: u32 = 8;

/// How a window grows in slow start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// Doubling on evidence that the responder keeps up (IBTA peers, go-back-N).
    Drained,
    /// By what is acknowledged (selective-repeat peers).
    Acked,
}

/// The state of one requester's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    psns: u32,
    /// Slow start below this (`u32::MAX` until the first cut).
    ssthresh: u32,
    growth: Growth,
    /// The window held a packet back since the last acknowledgement that moved it.
    held: bool,
    /// Drained acknowledgements in a row (slow start, [`Growth::Drained`]).
    drains: u32,
    /// PSNs acknowledged towards the next additive increase (congestion avoidance).
    ca_acked: u32,
    /// The least the window is cut to.
    floor: u32,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            psns: INITIAL_WINDOW_PSNS,
            ssthresh: u32::MAX,
            floor: INITIAL_WINDOW_PSNS,
            growth: Growth::Drained,
            held: false,
            drains: 0,
            ca_acked: 0,
        }
    }
}

impl Window {
    /// How many PSNs may be outstanding now.
    pub fn psns(&self) -> u32 {
        self.psns
    }

    /// Whether the window is in slow start.
    pub fn slow_start(&self) -> bool {
        self.psns < self.ssthresh
    }

    /// The window held a packet back.
    pub fn held(&mut self) {
        self.held = true;
    }

    /// An acknowledgement moved the oldest unacknowledged PSN by `newly` PSNs; `outstanding`
    /// PSNs that were sent are still unacknowledged.
    pub fn acked(&mut self, newly: u32, outstanding: u32) {
        if !std::mem::take(&mut self.held) {
            // The application, not the window, limited the sends: no evidence to grow.
            self.drains = 0;
            return;
        }
        if self.slow_start() {
            let cap = self.ssthresh.min(MAX_WINDOW_PSNS);
            let grown = match self.growth {
                Growth::Acked => self.psns.saturating_add(newly),
                Growth::Drained if outstanding > 0 => {
                    self.drains = 0;
                    return;
                }
                Growth::Drained => {
                    self.drains += 1;
                    if self.drains < GROW_AFTER {
                        return;
                    }
                    self.drains = 0;
                    self.psns * 2
                }
            };
            self.psns = grown.min(cap).max(self.psns);
            return;
        }
        // A window's worth acknowledged while it limited: one round trip.
        self.ca_acked += newly;
        while self.ca_acked >= self.psns {
            self.ca_acked -= self.psns;
            self.psns = (self.psns + AI_PSNS).min(MAX_WINDOW_PSNS);
        }
    }

    /// Cuts the window to `num/den` of itself (not below its floor) and leaves slow start.
    pub fn cut(&mut self, num: u32, den: u32) {
        let cut = (u64::from(self.psns) * u64::from(num) / u64::from(den.max(1))) as u32;
        self.psns = cut.clamp(self.floor, self.psns.max(self.floor));
        self.ssthresh = self.psns;
        self.after_change();
    }

    /// A retransmission timeout: the path lost everything in flight. Back to the floor, slow
    /// start up to half of what it was.
    pub fn collapse(&mut self) {
        self.ssthresh = (self.psns / 2).max(self.floor);
        self.psns = self.floor;
        self.after_change();
    }

    /// Starts over from `psns` toward a selective-repeat peer: growing by what is
    /// acknowledged, cut down to [`MIN_WINDOW_PSNS`] (a connection that has not sent yet
    /// learned how its peer recovers losses).
    pub fn restart_selective(&mut self, psns: u32) {
        *self = Window {
            psns: psns.clamp(MIN_WINDOW_PSNS, MAX_WINDOW_PSNS),
            growth: Growth::Acked,
            floor: MIN_WINDOW_PSNS,
            ..Window::default()
        };
    }

    /// The path holds [`MAX_WINDOW_PSNS`] packets without loss (memory): open that far now.
    pub fn open_wide(&mut self) {
        self.psns = MAX_WINDOW_PSNS;
    }

    fn after_change(&mut self) {
        self.held = false;
        self.drains = 0;
        self.ca_acked = 0;
    }
}

/// A loss episode: further losses until the ACK passes the PSN after the highest sent when
/// the first was noticed are the same congestion event (TCP's recovery point, RFC 6582).
/// The highest *sent*: a message's PSNs are all assigned when it starts, and an episode
/// that waited for the end of a 1 MiB message at a small window lasted seconds, with the
/// window frozen at its floor all along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovery {
    until: Option<Psn>,
}

impl Recovery {
    /// A loss noticed while `next` was the PSN after the highest sent: true when it starts a new
    /// episode (the window should react), false inside one.
    pub fn loss(&mut self, next: Psn) -> bool {
        if self.until.is_some() {
            return false;
        }
        self.until = Some(next);
        true
    }

    /// Everything before `acked_to` is acknowledged.
    pub fn acked(&mut self, acked_to: Psn) {
        if self.until.is_some_and(|u| !acked_to.before(u)) {
            self.until = None;
        }
    }

    /// Whether an episode is going on.
    pub fn active(&self) -> bool {
        self.until.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibta_slow_start_grows_only_on_drains_in_a_row_after_holding_back() {
        let mut w = Window::default();
        assert_eq!(w.psns(), 128);
        // Drained, but nothing was held back: the window did not limit.
        for _ in 0..10 {
            w.acked(64, 0);
        }
        assert_eq!(w.psns(), 128);
        // Held back, then a partial ACK: the responder was still busy.
        for _ in 0..10 {
            w.held();
            w.acked(64, 64);
        }
        assert_eq!(w.psns(), 128);
        // A partial ACK between two drains breaks the run.
        w.held();
        w.acked(64, 0);
        w.held();
        w.acked(64, 1);
        w.held();
        w.acked(64, 0);
        assert_eq!(w.psns(), 128);
        w.held();
        w.acked(64, 0);
        assert_eq!(w.psns(), 256);
        for _ in 0..10 {
            w.held();
            w.acked(64, 0);
        }
        assert_eq!(w.psns(), MAX_WINDOW_PSNS);
    }

    #[test]
    fn an_ibta_window_never_falls_below_rxes() {
        let mut w = Window::default();
        w.open_wide();
        for _ in 0..10 {
            w.cut(1, 2);
        }
        assert_eq!(w.psns(), INITIAL_WINDOW_PSNS);
        w.collapse();
        assert_eq!(w.psns(), INITIAL_WINDOW_PSNS);
    }

    #[test]
    fn selective_slow_start_grows_by_what_is_acknowledged() {
        let mut w = Window::default();
        w.restart_selective(INITIAL_SR_WINDOW_PSNS);
        assert_eq!(w.psns(), 16);
        w.acked(8, 8);
        assert_eq!(w.psns(), 16, "not held back: no growth");
        w.held();
        w.acked(8, 8);
        assert_eq!(w.psns(), 24);
        for _ in 0..200 {
            w.held();
            w.acked(64, 64);
        }
        assert_eq!(w.psns(), MAX_WINDOW_PSNS);
    }

    #[test]
    fn a_cut_leaves_slow_start_and_grows_additively() {
        let mut w = Window::default();
        w.open_wide();
        w.cut(7, 10);
        assert_eq!(w.psns(), 716);
        assert!(!w.slow_start());
        // Drains no longer double it.
        for _ in 0..4 {
            w.held();
            w.acked(64, 0);
        }
        assert_eq!(w.psns(), 716);
        // A window's worth acknowledged while limited: AI_PSNS more.
        for _ in 0..8 {
            w.held();
            w.acked(90, 100);
        }
        assert_eq!(w.psns(), 716 + AI_PSNS);
        // Acknowledged without having limited: nothing.
        for _ in 0..100 {
            w.acked(90, 100);
        }
        assert_eq!(w.psns(), 716 + AI_PSNS);
    }

    #[test]
    fn a_selective_window_is_cut_to_the_least_and_grows_back() {
        let mut w = Window::default();
        w.restart_selective(INITIAL_SR_WINDOW_PSNS);
        for _ in 0..20 {
            w.cut(1, 2);
        }
        assert_eq!(w.psns(), MIN_WINDOW_PSNS);
        w.cut(0, 0);
        assert_eq!(w.psns(), MIN_WINDOW_PSNS);
        let mut w = Window::default();
        w.restart_selective(64);
        w.collapse();
        assert_eq!(w.psns(), MIN_WINDOW_PSNS);
        assert!(w.slow_start());
        // Slow start doubles per window acknowledged: 4, 8, 16, then 32, half of 64.
        for _ in 0..3 {
            w.held();
            w.acked(w.psns(), 0);
        }
        assert_eq!(w.psns(), 32, "slow start up to half of 64");
        assert!(!w.slow_start());
    }

    #[test]
    fn one_recovery_episode_per_window_of_losses() {
        let mut r = Recovery::default();
        assert!(r.loss(Psn::new(100)));
        assert!(!r.loss(Psn::new(120)), "same episode");
        r.acked(Psn::new(99));
        assert!(r.active());
        r.acked(Psn::new(100));
        assert!(!r.active());
        assert!(r.loss(Psn::new(200)));
    }
}
