//! How a node's data loop takes its completions, and what it does when a turn made no
//! progress, for the tree and the binomial pipeline alike: while chunks are moving, keep
//! polling (each poll drives the device from the node's thread, cheaper than a wake-up per
//! chunk); after `spin` without progress, arm the CQ (which hands the device back to the
//! engine's progress thread) and sleep on the completion channel until a completion, the
//! next deadline, or a periodic check.

use std::thread;
use std::time::{Duration, Instant};

use srdma::{CompChannel, Cq, Wc};

/// The longest sleep: the loop's periodic checks (failures, dead hops) run at least this
/// often.
const NAP: Duration = Duration::from_millis(20);

/// How long a loop spins before it sleeps, since when it is idle, and the completions it
/// polled.
pub(super) struct Idle {
    spin: Duration,
    since: Instant,
    /// Completions polled and not yet handed out (the check before sleeping may leave some).
    wcs: Vec<Wc>,
    /// The buffer of the batch being handled, when given back.
    spare: Vec<Wc>,
}

impl Idle {
    /// Spins for 2 ms (`SRDMA_RELAY_SPIN_US` in the environment changes it) before sleeping.
    pub(super) fn new() -> Idle {
        let spin = Duration::from_micros(
            std::env::var("SRDMA_RELAY_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2000),
        );
        Idle {
            spin,
            since: Instant::now(),
            wcs: Vec::with_capacity(64),
            spare: Vec::with_capacity(64),
        }
    }

    /// The completions to handle this turn: those the check before sleeping left, or else
    /// what `cq` has now (up to 64). Give the batch back with [`Idle::recycle`].
    pub(super) fn completions(&mut self, cq: &Cq) -> Vec<Wc> {
        if self.wcs.is_empty() {
            cq.poll_into(&mut self.wcs, 64);
        }
        std::mem::replace(&mut self.wcs, std::mem::take(&mut self.spare))
    }

    /// Takes back a handled batch's buffer.
    pub(super) fn recycle(&mut self, mut batch: Vec<Wc>) {
        batch.clear();
        self.spare = batch;
    }

    /// The loop made progress: it is not idle.
    pub(super) fn busy(&mut self) {
        self.since = Instant::now();
    }

    /// A turn without progress: yields the CPU while the loop has been idle for less than
    /// `spin`; then arms `cq`, looks once more (a completion that came before the arm fires
    /// no event: it is handed out next turn) and sleeps on `chan` until an event, `wake`, or
    /// [`NAP`] — at least `floor`.
    pub(super) fn wait(
        &mut self,
        cq: &Cq,
        chan: &CompChannel,
        wake: Option<Instant>,
        floor: Duration,
    ) {
        if self.since.elapsed() < self.spin {
            thread::yield_now();
            return;
        }
        cq.req_notify(false);
        if cq.poll_into(&mut self.wcs, 64) > 0 {
            return;
        }
        let mut nap = NAP;
        if let Some(w) = wake {
            nap = nap.min(w.saturating_duration_since(Instant::now()));
        }
        let _ = chan.get_event(Some(nap.max(floor)));
    }
}
