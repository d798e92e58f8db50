//! The engine's timing heuristics in one place: when an application's poll skips the
//! socket, how long the progress thread spins, rests or sleeps, when an ACK waits for the
//! application's next send (ACK-ride learning), when the UDP socket counts as quiet while
//! shared memory carries the traffic, and how often statistics refresh.
//!
//! Pure: the constants, and small structs holding the timestamps the decisions need, with
//! methods that take `now` (ns since the device's epoch, as the engine counts) and return a
//! decision. Nothing here reads a clock, takes a lock or does I/O; the engine reads the
//! time, passes it in and applies the answer. The tests below run on fake time.

use std::time::Duration;

// ---- The ACK ride: held-back ACKs and the application's next send ----

/// How soon after a `post_recv` that sent a held-back ACK a send must follow for the next
/// ACK to wait for the send instead; also how long such an ACK waits through the
/// application's polls for that send.
pub(super) const ACK_RIDE_WINDOW: Duration = Duration::from_micros(100);

/// The score of posts without waiting (`QpSlot::unwaited`) from which an application is
/// taken not to wait for its sends' completions: eight such posts in a row, or more than
/// four in five for long. One that waits only for its peer's reply, and takes its send
/// completions on the way, posts before its ACK came back now and then: such posts must not
/// change its ACKs' way.
pub(super) const UNWAITED_AT: u8 = 8;
/// The most the score of `QpSlot::unwaited` counts up to: an application that starts to
/// wait is recognized within a few posts.
pub(super) const UNWAITED_MAX: u8 = 16;

/// How many quick send-after-`post_recv` in a row make a QP's ACKs wait for its sends (a
/// few hand-shakes in a row must not: perftest's do, then it goes quiet).
pub(super) const ACK_RIDES_AFTER: u8 = 8;

/// Nanoseconds of `d` (the engine counts time in ns since the device's epoch).
const fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// What a receive holds back of the packets (ACKs, responses) of the QPs it touched, for
/// the application's next post (see `State::deferred`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// Nothing: everything leaves now.
    Nothing,
    /// Everything but requests: the receive was the application's busy poll of a CQ, or
    /// its read of its memory, which polls it for a peer's WRITE. It looks again soon, and
    /// one datagram a look may be enough (see `udp::RxBatch::recv`).
    Poll,
    /// The ACKs of QPs whose application posts a send right after it takes what they
    /// acknowledge ([`AckRide::rides`]), for at most [`ACK_RIDE_WINDOW`]: the
    /// progress thread's receive for an application that waits on its memory, not its CQ
    /// (perftest's `ib_write_lat`). Sent at once, such an ACK reaches the peer alone; the
    /// peer's application, which polls its send CQ for it, then turns to its memory, and
    /// the reply WRITE that follows lands while nothing polls — the progress thread has to
    /// take over there too, every round.
    Riding,
}

impl Hold {
    /// Whether a QP touched by a receive under this hold, with nothing but ACKs and
    /// responses to send (its requests always go now), keeps them back: under
    /// [`Hold::Riding`] only a QP whose ACKs are learned to ride its sends.
    pub(super) fn holds(self, ride: &AckRide) -> bool {
        match self {
            Hold::Nothing => false,
            Hold::Poll => true,
            Hold::Riding => ride.rides(),
        }
    }
}

/// What a QP learns of its application's rhythm, to decide where its ACKs go (part of the
/// engine's `QpSlot`): whether an ACK a receive held back waits for the application's next
/// send and leaves behind it in the same `sendmmsg` (the ride), and whether the application
/// waits for its sends' completions (which decides `QpSlot::ack_tail`).
#[derive(Debug, Clone)]
pub(super) struct AckRide {
    /// Learned: how many times in a row the application posted a send while what a receive
    /// brought was held back for it (an ACK, or nothing to send yet), or right after its
    /// `post_recv` or poll sent a held-back ACK (a SEND or WRITE ping-pong). From
    /// [`ACK_RIDES_AFTER`] on, an ACK held back by a receive (the progress thread's too:
    /// [`Hold::Riding`]) waits past `post_recv` and polls (for [`ACK_RIDE_WINDOW`]) for that
    /// send and leaves right behind it, in the same `sendmmsg`. Cleared when the progress
    /// thread had to send a held-back ACK because the application went elsewhere (a peer
    /// with a short retransmission timer, rxe in a slow VM, retries after a millisecond).
    rides: u8,
    /// When (ns since the epoch) `post_recv` or a poll last sent a held-back ACK (0: not
    /// since the last send): a send soon after it counts towards `rides`.
    flushed_at: u64,
    /// When (ns since the epoch) a receive last held this QP's packets back (put it in
    /// `State::deferred`).
    held_at: u64,
    /// Learned at each post, a score of the posts that came without the application waiting
    /// for the completion of its last send (it was unsignaled, is still unacknowledged or
    /// not polled yet, or came before the application's first look: no poll of the send CQ
    /// found it empty since that send): one up for each (to [`UNWAITED_MAX`]), four down for
    /// each post that came after such a wait. From [`UNWAITED_AT`] on, the application is
    /// taken not to wait for its sends' completions, which their ACKs bring (see
    /// `QpSlot::ack_tail`).
    unwaited: u8,
    /// Whether the last send WR posted to the QP completes (signaled, or `sq_sig_all`).
    last_signaled: bool,
    /// The send CQ's `Cq::waits` at the last post.
    waits_at_post: u32,
}

impl AckRide {
    /// A new QP's: nothing learned, its (no) last send taken as signaled.
    pub(super) const fn new() -> AckRide {
        AckRide {
            rides: 0,
            flushed_at: 0,
            held_at: 0,
            unwaited: 0,
            last_signaled: true,
            waits_at_post: 0,
        }
    }

    /// Whether the QP's ACKs are learned to ride its application's sends (see
    /// [`AckRide::rides`]).
    pub(super) fn rides(&self) -> bool {
        self.rides >= ACK_RIDES_AFTER
    }

    /// Whether the application is taken not to wait for its sends' completions (see
    /// [`AckRide::unwaited`]).
    pub(super) fn unwaited(&self) -> bool {
        self.unwaited >= UNWAITED_AT
    }

    /// At a post, before its WRs join the send queue: learns whether the application took
    /// the completion of its last send first. `waits`: the send CQ's `Cq::waits` now;
    /// `idle`: whether the send queue and the send CQ are empty (asked only when the rest
    /// says the application may have waited: it takes the CQ's lock).
    pub(super) fn note_post(&mut self, waits: u32, idle: impl FnOnce() -> bool) {
        let waited = self.last_signaled && waits != self.waits_at_post && idle();
        self.waits_at_post = waits;
        self.unwaited = if !waited {
            (self.unwaited + 1).min(UNWAITED_MAX)
        } else {
            self.unwaited.saturating_sub(4)
        };
    }

    /// Whether the last send WR posted completes.
    pub(super) fn set_last_signaled(&mut self, signaled: bool) {
        self.last_signaled = signaled;
    }

    /// Whether `post_recv` or a poll sent a held-back ACK since the last send: the next
    /// send's time then matters ([`AckRide::send_posted`]), else the caller need not read
    /// the clock.
    pub(super) fn awaits_send(&self) -> bool {
        self.flushed_at != 0
    }

    /// A send posted at `now`: one more quick send after a flushed ACK (within
    /// [`ACK_RIDE_WINDOW`]), or a slow one that starts the count over.
    pub(super) fn send_posted(&mut self, now: u64) {
        if self.flushed_at == 0 {
            return;
        }
        self.rides = if now.saturating_sub(self.flushed_at) < ns(ACK_RIDE_WINDOW) {
            self.rides.saturating_add(1)
        } else {
            0
        };
        self.flushed_at = 0;
    }

    /// The application posted a send while what a receive held back waited for it: one
    /// more time it answered what it received with a send.
    pub(super) fn answered(&mut self) {
        self.rides = self.rides.saturating_add(1);
    }

    /// `post_recv` or a poll sent a held-back ACK at `now`.
    pub(super) fn flushed(&mut self, now: u64) {
        self.flushed_at = now.max(1);
    }

    /// A receive held the QP's packets back at `now`.
    pub(super) fn held(&mut self, now: u64) {
        self.held_at = now;
    }

    /// When (ns since the epoch) what a receive held back for this QP has waited
    /// [`ACK_RIDE_WINDOW`] and leaves whatever the application does.
    pub(super) fn hold_ends(&self) -> u64 {
        self.held_at.saturating_add(ns(ACK_RIDE_WINDOW))
    }

    /// At an application's poll at `now`: whether what is held back keeps waiting for the
    /// application's send (its ACKs ride, and the window is not over).
    pub(super) fn keeps_holding(&self, now: u64) -> bool {
        self.rides() && now < self.hold_ends()
    }

    /// At the progress thread's look at `now`: whether what is held back waited its window
    /// out and leaves now; if it held packets back (`held_packets`: an ACK or a response),
    /// the application, which neither posted nor polled in time, is no longer waited for
    /// (the ride is unlearned). A receive that brought the QP nothing to send (the ACK of
    /// its own WRITE, taken by the poll that completed it, after which `ib_write_lat` turns
    /// to its memory) held nothing back from the peer and unlearns nothing.
    pub(super) fn hold_expired(&mut self, now: u64, held_packets: bool) -> bool {
        if now < self.hold_ends() {
            return false;
        }
        if held_packets {
            self.rides = 0;
        }
        true
    }
}

/// Whether an application's poll at `now` that left held-back ACKs must wake the progress
/// thread, which sleeps until `sleep_until`: it would sleep past their window, and nothing
/// else would send them before the peer's retransmission timer fires.
pub(super) fn ride_wakes(now: u64, sleep_until: u64) -> bool {
    sleep_until > now + ns(ACK_RIDE_WINDOW)
}

// ---- Application polls and the progress thread ----

/// An application poll this soon after a receive that left the socket empty (a batch not
/// full) does not look at the socket again (once): it comes to collect what that receive
/// completed, and the application's next step (a post, in a ping-pong) should not wait for
/// a system call that finds nothing. Loopback, 8 B SEND ping-pong: the client's poll
/// between its receive and its next send cost ~0.9 µs of the round trip (see
/// benchmarks/README.md). A `post_send` in between cancels the rest: what it sent may
/// already have been answered (a QP of this device answers at once).
pub(super) const RX_REST: Duration = Duration::from_micros(3);
/// How long the progress thread keeps looking at the socket (without sleeping) after it
/// answered a one-sided request (READ, atomic) that came alone in its receive batch: the
/// peer's next one waits on this thread alone — no application here polls for it — and a
/// wake-up from `poll` costs more than the round trip (loopback: `ib_read_lat -s 8` 24–38 µs
/// typical while the thread slept between requests, 10–12 µs with it looking on). Requests
/// that come several to a batch are a stream that keeps the thread busy anyway; looking on
/// there took a core from the requester (`ib_read_bw -e -s 4096` −20 % on 2 cores).
pub(super) const ONE_SIDED_SPIN: Duration = Duration::from_micros(50);
/// How long the progress thread keeps looking (without sleeping) after it took packets from
/// the rings of the shared-memory driver: looking costs no system call, while a sleeping
/// consumer costs its peer a doorbell and itself a wake-up per burst (loopback, 64 B WRITE
/// stream: the target's thread spent a quarter of its time switching in and out of `poll`).
pub(super) const SHM_SPIN: Duration = Duration::from_micros(50);
/// While a full shared-memory ring holds QPs back, how soon the progress thread looks again
/// whether the peer made room.
pub(super) const SHM_ROOM_LOOK: Duration = Duration::from_micros(20);
/// While QPs wait for their peer's budget over UDP (see `share`), how soon the progress
/// thread gives them their turn at the latest (ACKs do it sooner).
pub(super) const BUDGET_LOOK: Duration = Duration::from_millis(1);
/// How long after an application's last poll the progress thread keeps out of the way:
/// while an application polls, its polls drive the device (no thread hand-off on the hot
/// path); when it stops, the thread takes over within this time.
pub(super) const APP_GRACE: Duration = Duration::from_millis(1);
/// How often at least an application whose CQ polls find all they ask for (completions keep
/// coming) drives the device itself: well within [`APP_GRACE`], so that the progress thread
/// keeps standing aside for it.
pub(super) const FULL_POLL_DRIVE: Duration = Duration::from_micros(250);
const _: () = assert!(FULL_POLL_DRIVE.as_nanos() * 2 <= APP_GRACE.as_nanos());
/// While WRITEs without immediate arrive (see `Shared::silent_writes_until`), a gap this
/// long since an application's last poll means it stopped polling before its grace ran
/// out — it spins on its memory for the peer's next WRITE, as perftest's `ib_write_lat`
/// does after its send completes — and the progress thread takes over at once.
pub(super) const POLL_GAP: Duration = Duration::from_micros(20);
/// The progress thread's first look, while it stands aside, at whether the application
/// still polls; each look after that waits twice as long, up to the grace.
pub(super) const FIRST_LOOK: Duration = Duration::from_micros(25);
/// How often an application's polls refresh the device's published statistics at most.
pub(super) const STATS_EVERY: Duration = Duration::from_millis(250);

// ---- Receive ----

/// While peers of this host send through shared memory, an application's polls look at the
/// UDP socket only this long after it was last found empty: the rings cost nothing to look
/// at, a socket a system call (a same-host 8 B ping-pong over rings is a few hundred ns).
/// What comes over UDP meanwhile (off-host peers, CM) waits at most this long.
pub(super) const UDP_QUIET: Duration = Duration::from_micros(20);

/// How long after the last WRITE without immediate the progress thread keeps looking.
pub(super) const SILENT_WRITES_HOLD: Duration = Duration::from_millis(100);

// ---- What the engine's state keeps for these decisions ----

/// The timestamps and counts the timing decisions need, kept in the engine's `State`
/// (each part's invariants on its type).
#[derive(Debug, Default)]
pub(super) struct Timing {
    /// When an application's poll looks at the UDP socket.
    pub(super) rest: RxRest,
    /// When the progress thread spins instead of sleeping.
    pub(super) spin: Spin,
    /// When an application's poll refreshes the published statistics.
    pub(super) stats: StatsClock,
    /// The pacing deadline the progress thread sleeps towards to the microsecond.
    pub(super) pace: Pace,
}

/// When an application's poll looks at the UDP socket: not within [`RX_REST`] after a
/// receive that left the socket empty and completed something (once), nor while peers of
/// this host send through shared memory and the socket was found empty less than
/// [`UDP_QUIET`] ago.
#[derive(Debug, Default)]
pub(super) struct RxRest {
    /// When (ns since the epoch) a receive that took datagrams last left the socket empty
    /// (0: no rest); taken (reset) by the next application poll, which skips the socket if
    /// it comes within [`RX_REST`].
    drained_at: u64,
    /// A running count of the completions flushes and held-back receives moved to CQs; only
    /// its change across one receive matters (a receive that moved none is no reason for
    /// the application to skip a look).
    delivered: u64,
    /// Until when (ns since the epoch) an application's poll leaves the UDP socket alone
    /// while peers send through shared memory (see [`UDP_QUIET`]).
    udp_quiet_until: u64,
}

impl RxRest {
    /// Whether an application's look at `now` reads the UDP socket, and the rest it takes
    /// (it is for one poll). `polling`: a busy poll (not the last look before sleeping,
    /// which always looks); `rings_in`: some peer of this host produces into the device's
    /// shared-memory rings.
    pub(super) fn poll_looks(&mut self, now: u64, polling: bool, rings_in: bool) -> bool {
        let drained = std::mem::take(&mut self.drained_at);
        let quiet = now < self.udp_quiet_until && rings_in;
        !polling || (now >= drained + ns(RX_REST) && !quiet)
    }

    /// A post may bring answers soon (at once from a QP of this device): the next
    /// application poll looks at the socket.
    pub(super) fn expect_answers(&mut self) {
        self.drained_at = 0;
    }

    /// `n` completions moved to CQs.
    pub(super) fn delivered(&mut self, n: usize) {
        self.delivered += n as u64;
    }

    /// The count of completions moved so far, to hand to [`RxRest::drained`] after a
    /// receive.
    pub(super) fn mark(&self) -> u64 {
        self.delivered
    }

    /// A receive found the device's sockets and rings empty at `now` (`udp`: it looked at
    /// the UDP socket); `mark`: [`RxRest::mark`] before it. The rest begins only after a
    /// receive that completed something for the application to collect; after a look that
    /// found nothing, or only what completes nothing (a peer's ACK of unsignaled sends),
    /// the next poll looks again.
    pub(super) fn drained(&mut self, now: u64, mark: u64, udp: bool) {
        if udp && self.delivered != mark {
            self.drained_at = now;
        }
    }

    /// A look at the UDP socket at `now` took `taken` datagrams: found empty, it is quiet
    /// for [`UDP_QUIET`].
    pub(super) fn udp_looked(&mut self, now: u64, taken: usize) {
        self.udp_quiet_until = match taken {
            0 => now + ns(UDP_QUIET),
            _ => 0,
        };
    }

    /// Until when (ns since the epoch) the UDP socket counts as quiet (see
    /// [`RxRest::udp_looked`]).
    pub(super) fn quiet_until(&self) -> u64 {
        self.udp_quiet_until
    }
}

/// When the progress thread keeps looking instead of sleeping: for [`ONE_SIDED_SPIN`] after
/// a one-sided request that came alone in its receive batch, for [`SHM_SPIN`] after it took
/// packets from the shared-memory rings.
#[derive(Debug, Default)]
pub(super) struct Spin {
    /// When (ns since the epoch) a READ or atomic request last arrived (its batch's time).
    one_sided_at: u64,
    /// Whether that request came alone in its receive batch.
    one_sided_lone: bool,
    /// When (ns since the epoch) a receive last took packets from the shared-memory rings.
    shm_took_at: u64,
}

impl Spin {
    /// A READ or atomic request arrived in the receive batch read at `now` (several in one
    /// batch, one clock reading: a stream, not a ping-pong).
    pub(super) fn one_sided(&mut self, now: u64) {
        self.one_sided_lone = self.one_sided_at != now;
        self.one_sided_at = now;
    }

    /// A receive took packets from the shared-memory rings at `now`.
    pub(super) fn shm_took(&mut self, now: u64) {
        self.shm_took_at = now;
    }

    /// Whether at `now` the progress thread keeps looking for a peer's next lone one-sided
    /// request.
    pub(super) fn one_sided_spins(&self, now: u64) -> bool {
        self.one_sided_lone && now < self.one_sided_at.saturating_add(ns(ONE_SIDED_SPIN))
    }

    /// Whether at `now` the progress thread keeps looking at the rings of a peer that
    /// streams through them.
    pub(super) fn shm_spins(&self, now: u64) -> bool {
        now < self.shm_took_at.saturating_add(ns(SHM_SPIN))
    }
}

/// When an application's poll refreshes the published statistics: every [`STATS_EVERY`]
/// at most.
#[derive(Debug, Default)]
pub(super) struct StatsClock {
    /// When (ns since the epoch) the published statistics may be refreshed next.
    next: u64,
}

impl StatsClock {
    /// Whether a poll at `now` refreshes them; if so, the next may not before
    /// [`STATS_EVERY`] from now.
    pub(super) fn due(&mut self, now: u64) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + ns(STATS_EVERY);
        true
    }
}

/// The earliest pacing deadline of a QP, as of the last run of the timers: a sleep that
/// ends at or after it is kept to the microsecond (every other sleep rounds up to the
/// millisecond, so the IBTA timers fire no earlier than a kernel rxe's, which count
/// jiffies).
#[derive(Debug)]
pub(super) struct Pace {
    /// In ns since the epoch (u64::MAX: none).
    next: u64,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace { next: u64::MAX }
    }
}

impl Pace {
    /// The earliest timer, `first` (ns since the epoch), is a QP's pacing deadline: `Some`;
    /// it is not, or there is none: `None`.
    pub(super) fn set(&mut self, first: Option<u64>) {
        self.next = first.unwrap_or(u64::MAX);
    }

    /// Whether a sleep until `until` (ns since the epoch, u64::MAX: no deadline) must be
    /// kept to the microsecond.
    pub(super) fn precise(&self, until: u64) -> bool {
        self.next <= until
    }
}

/// An application's poll at `now` keeps the progress thread out of the way until the
/// time returned (ns since the epoch): [`APP_GRACE`] from now.
pub(super) fn app_grace_until(now: u64) -> u64 {
    now + ns(APP_GRACE)
}

/// Whether an application's poll at `now` that found all it asked for drives the device
/// all the same: the last poll that drove it set `active` ([`app_grace_until`]) and came
/// [`FULL_POLL_DRIVE`] or more before.
pub(super) fn drives_now(now: u64, active: u64) -> bool {
    app_grace_until(now) >= active + ns(FULL_POLL_DRIVE)
}

/// What remains at `now` of the grace after an application thread woke from its wait on
/// the socket at `woke` (0: never): while some does, the progress thread leaves the socket
/// to it (the application is expected back).
pub(super) fn watch_grace(woke: u64, now: u64) -> Option<Duration> {
    let end = woke + ns(APP_GRACE);
    (woke != 0 && now < end).then(|| Duration::from_nanos(end - now))
}

/// Until when (at `now`, the time of the receive batch) the progress thread, standing aside
/// for an application's polls, looks often whether they stopped, after a QP executed a
/// WRITE without immediate.
pub(super) fn silent_writes_until(now: Duration) -> Duration {
    now + SILENT_WRITES_HOLD
}

/// What the progress thread keeps from one turn of its loop to the next (on its own
/// stack, not in the state): how often it looks while it stands aside, and until when a
/// look without waiting may take the rings alone.
#[derive(Debug)]
pub(super) struct Turns {
    /// How long the next sleep while standing aside may be at most, when an application may
    /// wait on its memory: [`FIRST_LOOK`], doubling at each look up to [`APP_GRACE`].
    look: Duration,
    /// Until when (ns since the epoch) a look without waiting may take the rings alone: a
    /// same-host peer streams through them and the socket was found empty less than
    /// [`UDP_QUIET`] ago (the socket, the doorbells, new links and wake-ups cost system
    /// calls to look at; they wait that long at most).
    rings_only_until: u64,
}

impl Default for Turns {
    fn default() -> Turns {
        Turns {
            look: FIRST_LOOK,
            rings_only_until: 0,
        }
    }
}

impl Turns {
    /// Whether at `now` the progress thread stands aside for an application's polls, which
    /// keep it out until `active` (ns since the epoch; the last poll came [`APP_GRACE`]
    /// before) while some QP executed a WRITE without immediate until `silent_until`:
    /// `Some(how long it sleeps)` while it does, `None` when it takes over. While such WRITEs
    /// come, an application may spin on its memory instead of polling: the thread takes over
    /// after a gap of [`POLL_GAP`] in the polls, and looks whether they stopped after
    /// [`FIRST_LOOK`], then twice as long each time, up to the grace.
    pub(super) fn stand_aside(
        &mut self,
        now: u64,
        active: u64,
        silent_until: u64,
    ) -> Option<Duration> {
        let last_poll = active.saturating_sub(ns(APP_GRACE));
        let looking = now < silent_until;
        if now < active && (!looking || now.saturating_sub(last_poll) < ns(POLL_GAP)) {
            let rest = Duration::from_nanos(active - now);
            let sleep = if looking { rest.min(self.look) } else { rest };
            self.look = (self.look * 2).min(APP_GRACE);
            return Some(sleep);
        }
        self.look = FIRST_LOOK;
        None
    }

    /// Whether a look at `now` that does not wait (`wait`: how long it may) takes the rings
    /// alone, leaving the socket, doorbells and wake-ups for later.
    pub(super) fn rings_only(&self, now: u64, wait: Option<Duration>) -> bool {
        wait == Some(Duration::ZERO) && now < self.rings_only_until
    }

    /// After a pass at `now`: how long the progress thread may sleep (`None`: no deadline),
    /// from `timeout`, what the timers and held-back ACKs allow. `more`: the receive budget
    /// ran out with more waiting; `watching`: the thread watches the socket and rings (no
    /// application thread does); `blocked`: a full ring holds QPs back (the peer that reads
    /// it rings no bell for room: look again within [`SHM_ROOM_LOOK`]); `timing`: the state's
    /// (its [`Spin`], and its [`RxRest`]: whether the socket is quiet).
    pub(super) fn after_pass(
        &mut self,
        now: u64,
        timeout: Option<Duration>,
        more: bool,
        watching: bool,
        blocked: bool,
        timing: &Timing,
    ) -> Option<Duration> {
        let Timing { spin, rest, .. } = timing;
        let mut timeout = timeout;
        // More waiting, or a peer doing one-sided operations: look again without sleeping.
        let one_sided = watching && spin.one_sided_spins(now);
        // A peer of this host streaming through shared memory: its next packets cost no
        // system call to look for, a doorbell and a wake-up several microseconds each.
        let shm = watching && spin.shm_spins(now);
        if more || one_sided || shm {
            timeout = Some(Duration::ZERO);
        }
        if blocked {
            timeout = Some(timeout.map_or(SHM_ROOM_LOOK, |t| t.min(SHM_ROOM_LOOK)));
        }
        self.rings_only_until = if shm && !more && !one_sided {
            rest.quiet_until()
        } else {
            0
        };
        timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `d` after `t` (ns since the epoch).
    fn at(t: u64, d: Duration) -> u64 {
        t + ns(d)
    }

    const T0: u64 = 1_000_000_000;
    const US: Duration = Duration::from_micros(1);

    #[test]
    fn a_poll_that_finds_enough_drives_once_the_last_drive_is_old() {
        // The last drive at T0 set `active` to T0 + the grace.
        let active = app_grace_until(T0);
        assert!(!drives_now(T0, active));
        assert!(!drives_now(at(T0, FULL_POLL_DRIVE - US), active));
        assert!(drives_now(at(T0, FULL_POLL_DRIVE), active));
        // Never driven: the first poll drives.
        assert!(drives_now(T0, 0));
    }

    #[test]
    fn a_drained_socket_rests_one_poll_within_rx_rest() {
        let mut r = RxRest::default();
        let mark = r.mark();
        r.delivered(1);
        r.drained(T0, mark, true);
        // Within RX_REST a busy poll skips the socket, once.
        assert!(!r.poll_looks(at(T0, RX_REST - US), true, false));
        assert!(r.poll_looks(at(T0, RX_REST - US), true, false), "taken");
        // At RX_REST it looks.
        r.drained(T0, mark, true);
        assert!(r.poll_looks(at(T0, RX_REST), true, false));
        // The last look before sleeping always looks.
        r.drained(T0, mark, true);
        assert!(r.poll_looks(T0, false, false));
        // A post cancels the rest: what it sent may be answered already.
        r.drained(T0, mark, true);
        r.expect_answers();
        assert!(r.poll_looks(T0 + 1, true, false));
    }

    #[test]
    fn a_receive_that_completed_nothing_starts_no_rest() {
        let mut r = RxRest::default();
        let mark = r.mark();
        r.drained(T0, mark, true);
        assert!(r.poll_looks(T0 + 1, true, false));
        // Nor one that did not look at the socket.
        r.delivered(3);
        r.drained(T0, mark, false);
        assert!(r.poll_looks(T0 + 1, true, false));
    }

    #[test]
    fn the_socket_is_quiet_for_udp_quiet_while_rings_carry_traffic() {
        let mut r = RxRest::default();
        r.udp_looked(T0, 0);
        assert_eq!(r.quiet_until(), at(T0, UDP_QUIET));
        let just_before = at(T0, UDP_QUIET - US);
        assert!(!r.poll_looks(just_before, true, true), "rings in: skip");
        assert!(r.poll_looks(just_before, true, false), "no rings: look");
        assert!(r.poll_looks(at(T0, UDP_QUIET), true, true), "quiet over");
        // A look that took datagrams ends the quiet.
        r.udp_looked(T0, 5);
        assert_eq!(r.quiet_until(), 0);
        assert!(r.poll_looks(T0 + 1, true, true));
    }

    #[test]
    fn a_lone_one_sided_request_arms_the_spin_a_stream_does_not() {
        let mut s = Spin::default();
        assert!(!s.one_sided_spins(T0));
        s.one_sided(T0);
        assert!(s.one_sided_spins(at(T0, ONE_SIDED_SPIN - US)));
        assert!(!s.one_sided_spins(at(T0, ONE_SIDED_SPIN)));
        // A second one in the same batch (same clock reading): a stream.
        s.one_sided(T0);
        assert!(!s.one_sided_spins(T0 + 1));
        // Alone in the next batch again.
        s.one_sided(T0 + 5);
        assert!(s.one_sided_spins(T0 + 6));
    }

    #[test]
    fn packets_from_the_rings_arm_the_shm_spin() {
        let mut s = Spin::default();
        assert!(!s.shm_spins(at(0, SHM_SPIN)));
        s.shm_took(T0);
        assert!(s.shm_spins(at(T0, SHM_SPIN - US)));
        assert!(!s.shm_spins(at(T0, SHM_SPIN)));
    }

    /// A QP whose application posted `n` sends each `gap` after a flushed ACK.
    fn quick_sends(r: &mut AckRide, n: u8, t: &mut u64, gap: Duration) {
        for _ in 0..n {
            r.flushed(*t);
            assert!(r.awaits_send());
            *t = at(*t, gap);
            r.send_posted(*t);
            assert!(!r.awaits_send());
            *t += ns(ACK_RIDE_WINDOW);
        }
    }

    #[test]
    fn ack_rides_are_learned_after_ack_rides_after_quick_sends() {
        let mut r = AckRide::new();
        let mut t = T0;
        quick_sends(&mut r, ACK_RIDES_AFTER - 1, &mut t, 10 * US);
        assert!(!r.rides());
        quick_sends(&mut r, 1, &mut t, 10 * US);
        assert!(r.rides());
        // A send with no flushed ACK before it changes nothing.
        r.send_posted(t);
        assert!(r.rides());
    }

    #[test]
    fn a_slow_send_starts_the_count_over() {
        let mut r = AckRide::new();
        let mut t = T0;
        quick_sends(&mut r, ACK_RIDES_AFTER - 1, &mut t, ACK_RIDE_WINDOW - US);
        quick_sends(&mut r, 1, &mut t, ACK_RIDE_WINDOW);
        quick_sends(&mut r, ACK_RIDES_AFTER - 1, &mut t, US);
        assert!(!r.rides());
        // Sends that answered what was held back count too.
        r.answered();
        assert!(r.rides());
    }

    #[test]
    fn a_held_ack_waits_its_window_then_unlearns_the_ride() {
        let mut r = AckRide::new();
        for _ in 0..ACK_RIDES_AFTER {
            r.answered();
        }
        assert!(Hold::Riding.holds(&r));
        r.held(T0);
        assert_eq!(r.hold_ends(), at(T0, ACK_RIDE_WINDOW));
        let end = r.hold_ends();
        // An application's poll within the window leaves it for the send.
        assert!(r.keeps_holding(end - 1));
        assert!(!r.keeps_holding(end));
        // A hold that kept nothing back (the QP had nothing to send) ends and unlearns
        // nothing.
        assert!(!r.hold_expired(end - 1, false));
        assert!(r.hold_expired(end, false));
        assert!(r.rides());
        // The progress thread sends what was held once the window is over, and stops
        // waiting.
        assert!(!r.hold_expired(end - 1, true));
        assert!(r.rides());
        assert!(r.hold_expired(end, true));
        assert!(!r.rides());
        assert!(!Hold::Riding.holds(&r));
        assert!(!r.keeps_holding(end - 1), "not learned: no hold");
    }

    #[test]
    fn what_each_hold_keeps_back() {
        let r = AckRide::new();
        assert!(!Hold::Nothing.holds(&r));
        assert!(Hold::Poll.holds(&r));
        assert!(!Hold::Riding.holds(&r));
    }

    #[test]
    fn an_application_that_does_not_wait_is_recognized_and_forgotten() {
        let mut r = AckRide::new();
        // Posts with the send CQ's waits unchanged: not waited for.
        for _ in 0..UNWAITED_AT - 1 {
            r.note_post(0, || panic!("idle is asked only when the waits changed"));
        }
        assert!(!r.unwaited());
        r.note_post(0, || true);
        assert!(r.unwaited());
        // The score stops at UNWAITED_MAX.
        for _ in 0..2 * UNWAITED_MAX {
            r.note_post(0, || true);
        }
        // Posts after a wait (a poll that found the CQ empty, the queue idle): four down
        // each.
        let downs = (UNWAITED_MAX - UNWAITED_AT) / 4 + 1;
        for w in 1..=u32::from(downs) {
            assert!(r.unwaited());
            r.note_post(w, || true);
        }
        assert!(!r.unwaited());
        // Unsignaled sends are never waited for.
        r.set_last_signaled(false);
        let w = u32::from(downs);
        for k in 1..=u32::from(UNWAITED_AT) {
            r.note_post(w + k, || panic!("not asked"));
        }
        assert!(r.unwaited());
        // A wait that found the queue busy does not count.
        r.set_last_signaled(true);
        r.note_post(1000, || false);
        assert!(r.unwaited());
    }

    #[test]
    fn a_poll_with_held_acks_wakes_a_thread_that_sleeps_past_their_window() {
        assert!(!ride_wakes(T0, 0), "standing aside");
        assert!(!ride_wakes(T0, at(T0, ACK_RIDE_WINDOW)));
        assert!(ride_wakes(T0, at(T0, ACK_RIDE_WINDOW) + 1));
        assert!(ride_wakes(T0, u64::MAX), "asleep with no deadline");
    }

    #[test]
    fn statistics_refresh_every_stats_every() {
        let mut s = StatsClock::default();
        assert!(s.due(T0));
        assert!(!s.due(at(T0, STATS_EVERY - US)));
        assert!(s.due(at(T0, STATS_EVERY)));
    }

    #[test]
    fn a_sleep_towards_a_pacing_deadline_is_precise() {
        let mut p = Pace::default();
        assert!(!p.precise(T0));
        assert!(!p.precise(u64::MAX - 1));
        p.set(Some(T0));
        assert!(p.precise(T0));
        assert!(
            p.precise(u64::MAX),
            "no deadline: it ends at the pace's timer"
        );
        assert!(!p.precise(T0 - 1), "ends before: rounding cannot pass it");
        p.set(None);
        assert!(!p.precise(T0));
    }

    #[test]
    fn the_grace_after_an_application_s_poll_or_wait() {
        assert_eq!(app_grace_until(T0), at(T0, APP_GRACE));
        assert_eq!(watch_grace(0, T0), None, "never woke");
        assert_eq!(
            watch_grace(T0, T0 + 1),
            Some(APP_GRACE - Duration::from_nanos(1))
        );
        assert_eq!(watch_grace(T0, at(T0, APP_GRACE)), None);
        assert_eq!(
            silent_writes_until(Duration::from_nanos(T0)),
            Duration::from_nanos(T0) + SILENT_WRITES_HOLD
        );
    }

    #[test]
    fn the_progress_thread_stands_aside_while_polls_come() {
        let mut t = Turns::default();
        // A poll at T0: aside for the whole grace (no WRITEs without immediate).
        let active = app_grace_until(T0);
        assert_eq!(
            t.stand_aside(T0 + 1, active, 0),
            Some(APP_GRACE - Duration::from_nanos(1))
        );
        // Grace over: takes over.
        assert_eq!(t.stand_aside(active, active, 0), None);
    }

    #[test]
    fn with_silent_writes_it_looks_more_and_more_rarely_then_takes_over_after_a_gap() {
        let mut t = Turns::default();
        let active = app_grace_until(T0);
        let silent = T0 + ns(SILENT_WRITES_HOLD);
        let mut looks = Vec::new();
        for _ in 0..8 {
            looks.push(t.stand_aside(T0 + 1, active, silent).unwrap());
        }
        assert_eq!(looks[0], FIRST_LOOK);
        assert_eq!(looks[1], FIRST_LOOK * 2);
        assert_eq!(looks[2], FIRST_LOOK * 4);
        assert!(looks.iter().all(|&l| l <= APP_GRACE));
        // A gap of POLL_GAP since the last poll: the application stopped polling.
        assert!(
            t.stand_aside(at(T0, POLL_GAP - US), active, silent)
                .is_some()
        );
        assert_eq!(t.stand_aside(at(T0, POLL_GAP), active, silent), None);
        // Taking over starts the looks over.
        assert_eq!(t.stand_aside(T0 + 1, active, silent), Some(FIRST_LOOK));
    }

    #[test]
    fn after_a_pass_the_thread_spins_rests_or_sleeps() {
        let mut timing = Timing::default();
        let mut t = Turns::default();
        let ms = Some(Duration::from_millis(1));
        // Nothing going on: the timers' deadline.
        assert_eq!(t.after_pass(T0, ms, false, true, false, &timing), ms);
        assert_eq!(t.after_pass(T0, None, false, true, false, &timing), None);
        // More waiting: look again at once.
        assert_eq!(
            t.after_pass(T0, ms, true, true, false, &timing),
            Some(Duration::ZERO)
        );
        // A lone READ: spin, while the thread watches the socket.
        timing.spin.one_sided(T0);
        assert_eq!(
            t.after_pass(T0 + 1, None, false, true, false, &timing),
            Some(Duration::ZERO)
        );
        assert_eq!(
            t.after_pass(T0 + 1, None, false, false, false, &timing),
            None
        );
        let over = at(T0, ONE_SIDED_SPIN);
        assert_eq!(t.after_pass(over, None, false, true, false, &timing), None);
        // A full ring holding QPs back: look again within SHM_ROOM_LOOK.
        assert_eq!(
            t.after_pass(over, None, false, true, true, &timing),
            Some(SHM_ROOM_LOOK)
        );
        assert_eq!(
            t.after_pass(over, Some(US), false, true, true, &timing),
            Some(US)
        );
    }

    #[test]
    fn a_shm_stream_spins_on_the_rings_alone_while_the_socket_is_quiet() {
        let mut timing = Timing::default();
        let mut t = Turns::default();
        let zero = Some(Duration::ZERO);
        timing.spin.shm_took(T0);
        timing.rest.udp_looked(T0, 0);
        assert_eq!(
            t.after_pass(T0 + 1, None, false, true, false, &timing),
            zero
        );
        // The next look without waiting takes the rings alone, until the quiet ends.
        assert!(t.rings_only(T0 + 2, zero));
        assert!(
            !t.rings_only(T0 + 2, Some(US)),
            "a look that may wait sees everything"
        );
        assert!(!t.rings_only(at(T0, UDP_QUIET), zero));
        // More waiting, or a one-sided spin, need the socket too.
        assert_eq!(t.after_pass(T0 + 1, None, true, true, false, &timing), zero);
        assert!(!t.rings_only(T0 + 2, zero));
    }
}
