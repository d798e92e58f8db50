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
/// How long after an application's last poll the progress thread keeps out of the way:
/// while an application polls, its polls drive the device (no thread hand-off on the hot
/// path); when it stops, the thread takes over within this time.
pub(super) const APP_GRACE: Duration = Duration::from_millis(1);
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
