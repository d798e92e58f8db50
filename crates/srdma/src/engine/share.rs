//! Fair shares of a destination: how many of this device's QPs are sending to each peer
//! address, and the cap each one's window gets so that together they fit what one peer
//! takes in flight — its socket buffer, or the shared-memory ring between the two
//! processes (8 MiB either way).
//!
//! A QP's congestion window is its own; thousands of QPs between the same two processes
//! (perftest `-q 4096`, an MPI job's connections) would each keep up to a full window in
//! flight, far more than the ring or socket holds: the ring then holds them back for
//! seconds (longer than their retransmission timers) and a socket drops. A NIC schedules
//! its QPs round robin for the same reason. The cap is [`SHARE_BUDGET_PSNS`] divided among
//! the QPs with work to that peer: no effect up to 16 QPs (a window is at most
//! [`srdma_proto::congestion::MAX_WINDOW_PSNS`], 1024), 64 PSNs each for 256, the floor
//! ([`srdma_proto::congestion::MIN_WINDOW_PSNS`]) from 4096 on; over UDP at most what the
//! peer's socket buffer holds ([`UDP_SHARE_BYTES`]).
//!
//! A cap per QP has a floor, and 10,000 QPs at the floor overrun any socket buffer: over UDP
//! the bytes in flight to a peer are counted too, and once they pass [`UDP_FLIGHT_BYTES`]
//! every QP there is held at what it has in flight ([`Shares::holds`]: it may resend that,
//! and sends nothing new) until ACKs free some; the QPs held with work wait in turn
//! (`TxState::waiting`), so that the budget goes round them, as a NIC's scheduler goes
//! round its QPs, instead of to whichever QPs' ACKs come first.

use std::collections::HashMap;
use std::net::IpAddr;

/// PSNs in flight that one peer address gets from this device at most, all QPs together:
/// 16 MiB of 1 KiB packets (the MTU perftest picks), 64 MiB of 4 KiB ones. A ring holds
/// back what does not fit it; over UDP the budget is also [`UDP_SHARE_BYTES`].
pub(super) const SHARE_BUDGET_PSNS: u32 = 16384;

/// Bytes in flight that one peer address gets from this device over UDP, all QPs together:
/// what the peer's socket buffer holds (srdma asks for 8 MiB). A socket drops the excess
/// where a ring holds it back, and go-back-N, whose windows stay at rxe's 128 PSNs or more,
/// resends a window for each drop: 64 QPs each way between two processes at 4 KiB packets
/// (`ib_write_bw -b -q 64`, 64 MiB of PSN budget) overran both sockets until `retry_cnt`
/// ran out.
pub(super) const UDP_SHARE_BYTES: u32 = 8 << 20;

/// Bytes in flight to one peer address over UDP, all QPs together, past which they send
/// nothing new ([`Shares::holds`]): half the socket buffer srdma asks for, as the kernel
/// charges a datagram more than its bytes, and ACKs share the buffer (`ib_write_bw -q 2000`
/// over UDP on loopback: at 8 MiB the receiving socket still dropped 598 skbs, at 4 MiB
/// none; at 10,000 QPs, 1,067 and none).
const UDP_FLIGHT_BYTES: u64 = UDP_SHARE_BYTES as u64 / 2;

/// QPs with work, per destination address, and what they have in flight there over UDP.
#[derive(Debug, Default)]
pub(super) struct Shares {
    peers: HashMap<IpAddr, Peer>,
}

/// One destination's QPs.
#[derive(Debug, Default, Clone, Copy)]
struct Peer {
    /// QPs with work there.
    active: u32,
    /// Bytes the UDP-path QPs among them have in flight (sent, not acknowledged).
    flight: u64,
    /// QPs held back because the budget was spent, waiting for their turn (see
    /// [`Shares::holds`]).
    waiting: u32,
}

impl Peer {
    fn idle(&self) -> bool {
        self.active == 0 && self.flight == 0 && self.waiting == 0
    }
}

impl Shares {
    /// A QP counted under `was` (None: not counted) with `flight.0` bytes in flight over UDP
    /// now has work toward `now` (None: none) with `flight.1` bytes in flight; returns the
    /// cap of its window. `udp_mtu`: the QP's path MTU (its packets' size) when its path is
    /// UDP.
    pub(super) fn update(
        &mut self,
        was: Option<IpAddr>,
        now: Option<IpAddr>,
        udp_mtu: Option<u32>,
        flight: (u32, u32),
    ) -> u32 {
        // Most flushes change neither (the map is then only read, for the cap).
        if was != now || flight.0 != flight.1 {
            if let Some(ip) = was {
                if let Some(p) = self.peers.get_mut(&ip) {
                    if was != now {
                        p.active -= 1;
                    }
                    p.flight = p.flight.saturating_sub(u64::from(flight.0));
                    if p.idle() {
                        self.peers.remove(&ip);
                    }
                }
            }
            if let Some(ip) = now {
                let p = self.peers.entry(ip).or_default();
                if was != now {
                    p.active += 1;
                }
                p.flight += u64::from(flight.1);
            }
        }
        let budget = match udp_mtu {
            Some(bytes) => SHARE_BUDGET_PSNS.min(UDP_SHARE_BYTES / bytes.max(1)),
            None => SHARE_BUDGET_PSNS,
        };
        match now.and_then(|ip| self.peers.get(&ip)) {
            Some(p) if p.active > 1 => budget / p.active,
            _ => u32::MAX,
        }
    }

    /// Whether a QP toward `ip` over UDP may send nothing new now: the QPs there have
    /// more than [`UDP_FLIGHT_BYTES`] in flight together (a per-QP cap cannot keep thousands of QPs
    /// within it: 10,000 windows of [`srdma_proto::congestion::MIN_WINDOW_PSNS`] are 160 MiB
    /// of 4 KiB packets), or — unless it is its turn (`turn`) — others wait for the budget
    /// before it, so that the QPs whose ACKs came do not take what frees up again and again.
    /// A QP alone there is its congestion window's business.
    pub(super) fn holds(&self, ip: IpAddr, turn: bool) -> bool {
        self.peers.get(&ip).is_some_and(|p| {
            (p.active > 1 && p.flight > UDP_FLIGHT_BYTES) || (p.waiting > 0 && !turn)
        })
    }

    /// Whether the budget toward `ip` is spent (see [`Shares::holds`]).
    pub(super) fn spent(&self, ip: IpAddr) -> bool {
        self.holds(ip, true)
    }

    /// A QP toward `ip` waits for its turn (`true`) or stopped waiting (`false`).
    pub(super) fn wait(&mut self, ip: IpAddr, waits: bool) {
        let p = self.peers.entry(ip).or_default();
        if waits {
            p.waiting += 1;
        } else {
            p.waiting -= 1;
            if p.idle() {
                self.peers.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_divided_among_the_qps_with_work() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut s = Shares::default();
        assert_eq!(
            s.update(None, Some(a), None, (0, 0)),
            u32::MAX,
            "alone: no cap"
        );
        assert_eq!(s.update(None, Some(a), None, (0, 0)), SHARE_BUDGET_PSNS / 2);
        assert_eq!(
            s.update(None, Some(b), None, (0, 0)),
            u32::MAX,
            "another peer's budget"
        );
        for _ in 0..14 {
            s.update(None, Some(a), None, (0, 0));
        }
        assert_eq!(
            s.update(Some(a), Some(a), None, (0, 0)),
            1024,
            "16 QPs to a: a full window each"
        );
        // One goes idle, one moves to b.
        assert_eq!(s.update(Some(a), None, None, (0, 0)), u32::MAX);
        assert_eq!(
            s.update(Some(a), Some(b), None, (0, 0)),
            SHARE_BUDGET_PSNS / 2
        );
        assert_eq!(
            s.update(Some(a), Some(a), None, (0, 0)),
            SHARE_BUDGET_PSNS / 14
        );
    }

    #[test]
    fn over_udp_the_budget_is_what_a_socket_buffer_holds() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut s = Shares::default();
        for _ in 0..63 {
            s.update(None, Some(a), Some(4096), (0, 0));
        }
        // 64 QPs of 4 KiB packets: 8 MiB together, 32 PSNs each (a ring's path: 256).
        assert_eq!(s.update(None, Some(a), Some(4096), (0, 0)), 32);
        assert_eq!(s.update(Some(a), Some(a), None, (0, 0)), 256);
        // 1 KiB packets: 8192 PSNs together.
        assert_eq!(s.update(Some(a), Some(a), Some(1024), (0, 0)), 128);
    }

    #[test]
    fn a_spent_budget_holds_every_qp_there_and_waiters_go_first() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut s = Shares::default();
        let half = (UDP_FLIGHT_BYTES / 2) as u32;
        s.update(None, Some(a), Some(4096), (0, half));
        assert!(!s.holds(a, false));
        // A second QP brings the flight past the budget: both are held, b's QPs are not.
        s.update(None, Some(a), Some(4096), (0, half + 4096));
        assert!(s.holds(a, false) && s.holds(a, true) && s.spent(a));
        assert!(!s.holds(b, false));
        // ACKs came for the first: the budget frees up, but one QP waits for its turn.
        s.update(Some(a), Some(a), Some(4096), (half, 0));
        assert!(!s.spent(a));
        s.wait(a, true);
        assert!(
            s.holds(a, false),
            "the QP whose ACKs came goes behind the waiter"
        );
        assert!(!s.holds(a, true), "the waiter's turn");
        s.wait(a, false);
        assert!(!s.holds(a, false));
        // Everything acknowledged and idle: nothing is kept.
        s.update(Some(a), None, Some(4096), (half + 4096, 0));
        s.update(Some(a), None, Some(4096), (0, 0));
        assert!(s.peers.is_empty());
    }
}
