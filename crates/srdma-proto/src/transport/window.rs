//! The RC requester's PSN window: how many PSNs it may have sent and not yet seen
//! acknowledged.
//!
//! rxe keeps a fixed 128 (`RXE_MAX_UNACKED_PSNS`). Between two hosts that is too little for
//! a responder that handles packets in batches: the requester sends 128, waits for the ACK of
//! the batch, and both sides take turns instead of working at once (over veth at MTU 1500,
//! 0.55× one TCP stream at 128 PSNs, 0.9× at 1024: benchmarks/README.md). A bigger fixed
//! window overruns a slow responder instead (kernel rxe in an emulated guest drops the burst).
//!
//! So the window starts at rxe's 128 and doubles, up to [`MAX_WINDOW_PSNS`], only on
//! evidence that the window and not the responder is what limits: [`GROW_AFTER`] times in a
//! row, the window held a packet back and the next acknowledgement covered every PSN sent —
//! the responder had handled all of it and was idle while the requester waited. A responder
//! that cannot keep up acknowledges part of what was sent (rxe answers the AckReq every 64
//! packets as it reaches it) and the window stays where it is. A loss (a PSN-sequence NAK,
//! an implied NAK or a retransmission timeout) puts it back to 128 and doubles the evidence
//! needed to grow again.

use super::MAX_UNACKED_PSNS;

/// The most PSNs the window grows to.
pub const MAX_WINDOW_PSNS: u32 = 1024;

/// Drained acknowledgements in a row, each after the window held a packet back, that double
/// the window (doubled after every loss, up to [`GROW_AFTER_MAX`]).
const GROW_AFTER: u32 = 2;

/// The most evidence ever asked for.
const GROW_AFTER_MAX: u32 = 1 << 10;

/// The state of one requester's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    psns: u32,
    /// The window held a packet back since the last acknowledgement that moved it.
    held: bool,
    /// Drained acknowledgements in a row.
    drains: u32,
    /// Drains needed to grow.
    need: u32,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            psns: MAX_UNACKED_PSNS,
            held: false,
            drains: 0,
            need: GROW_AFTER,
        }
    }
}

impl Window {
    /// How many PSNs may be outstanding now.
    pub(super) fn psns(&self) -> u32 {
        self.psns
    }

    /// The window held a packet back.
    pub(super) fn held(&mut self) {
        self.held = true;
    }

    /// An acknowledgement moved the oldest unacknowledged PSN; `outstanding` PSNs that were
    /// sent are still unacknowledged.
    pub(super) fn acked(&mut self, outstanding: u32) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        if outstanding > 0 {
            self.drains = 0;
            return;
        }
        self.drains += 1;
        if self.drains >= self.need {
            self.drains = 0;
            self.psns = (self.psns * 2).min(MAX_WINDOW_PSNS);
        }
    }

    /// The path holds [`MAX_WINDOW_PSNS`] packets without loss: open that far now.
    pub(super) fn open_wide(&mut self) {
        self.psns = MAX_WINDOW_PSNS;
    }

    /// A packet was lost: back to rxe's window, and more evidence before growing again.
    pub(super) fn lost(&mut self) {
        if self.psns > MAX_UNACKED_PSNS {
            self.need = (self.need * 2).min(GROW_AFTER_MAX);
        }
        self.psns = MAX_UNACKED_PSNS;
        self.held = false;
        self.drains = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_only_on_drains_in_a_row_after_holding_back() {
        let mut w = Window::default();
        assert_eq!(w.psns(), 128);
        // Drained, but nothing was held back: the window did not limit.
        for _ in 0..10 {
            w.acked(0);
        }
        assert_eq!(w.psns(), 128);
        // Held back, then a partial ACK: the responder was still busy.
        for _ in 0..10 {
            w.held();
            w.acked(64);
        }
        assert_eq!(w.psns(), 128);
        // A partial ACK between two drains breaks the run.
        w.held();
        w.acked(0);
        w.held();
        w.acked(1);
        w.held();
        w.acked(0);
        assert_eq!(w.psns(), 128);
        w.held();
        w.acked(0);
        assert_eq!(w.psns(), 256);
        for _ in 0..10 {
            w.held();
            w.acked(0);
        }
        assert_eq!(w.psns(), MAX_WINDOW_PSNS);
    }

    #[test]
    fn a_loss_falls_back_and_asks_for_more_evidence() {
        let mut w = Window::default();
        for _ in 0..GROW_AFTER {
            w.held();
            w.acked(0);
        }
        assert_eq!(w.psns(), 256);
        w.lost();
        assert_eq!(w.psns(), 128);
        for _ in 0..2 * GROW_AFTER - 1 {
            w.held();
            w.acked(0);
        }
        assert_eq!(w.psns(), 128);
        w.held();
        w.acked(0);
        assert_eq!(w.psns(), 256);
        // A loss at the starting window asks for no more.
        let mut w = Window::default();
        w.lost();
        for _ in 0..GROW_AFTER {
            w.held();
            w.acked(0);
        }
        assert_eq!(w.psns(), 256);
    }
}
