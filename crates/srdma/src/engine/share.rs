//! Fair shares of a destination: how many of this device's QPs are sending to each peer
//! address, and the cap each one's window gets so that together they fit what one peer
//! takes in flight — its socket buffer, or the shared-memory ring between the two
//! processes.
//!
//! A QP's congestion window is its own; thousands of QPs between the same two processes
//! (perftest `-q 4096`, an MPI job's connections) would each keep up to a full window in
//! flight, far more than the ring or socket holds: the ring then holds them back for
//! seconds (longer than their retransmission timers) and a socket drops. A NIC schedules
//! its QPs round robin for the same reason. The cap is [`SHARE_BUDGET_PSNS`] divided among
//! the QPs with work to that peer: no effect up to 16 QPs (a window is at most
//! [`srdma_proto::congestion::MAX_WINDOW_PSNS`], 1024), 64 PSNs each for 256, the floor
//! ([`srdma_proto::congestion::MIN_WINDOW_PSNS`]) from 4096 on; over UDP at most what the
//! peer's socket buffer holds ([`Shares::new`]).
//!
//! A cap per QP has a floor, and 10,000 QPs at the floor overrun any socket buffer: over UDP
//! the bytes in flight to a peer are counted too, and once they pass half its socket buffer
//! every QP there is held at what it has in flight ([`Shares::holds`]: it may resend that,
//! and sends nothing new) until ACKs free some; the QPs held with work wait in turn
//! ([`Waiting`]), so that the budget goes round them, as a NIC's scheduler goes round its
//! QPs, instead of to whichever QPs' ACKs come first. A QP alone toward a peer is its
//! congestion window's business.

use std::collections::VecDeque;
use std::net::IpAddr;

use crate::fasthash::FastMap;

/// PSNs in flight that one peer address gets from this device at most, all QPs together:
/// 16 MiB of 1 KiB packets (the MTU perftest picks), 64 MiB of 4 KiB ones. A ring holds
/// back what does not fit it; over UDP the budget is also the peer's socket buffer.
pub(super) const SHARE_BUDGET_PSNS: u32 = 16384;

/// The socket buffer assumed of a peer when the kernel did not say what ours is: what srdma
/// asks for and gets where `net.core.rmem_max` is 4 MiB (the kernel doubles the request it
/// grants).
const DEFAULT_UDP_BUFFER: u32 = 8 << 20;

/// QPs with work, per destination address, and what they have in flight there over UDP.
#[derive(Debug)]
pub(super) struct Shares {
    /// A lookup or two per flush: [`FastMap`], whose keys here are the addresses of the
    /// application's own QPs' peers.
    peers: FastMap<IpAddr, Peer>,
    /// Bytes in flight that one peer address gets from this device over UDP, all QPs
    /// together: what its socket buffer holds, taken to be what ours does (a peer does not
    /// say; the hosts of one job are alike). A socket drops the excess where a ring holds
    /// it back, and go-back-N, whose windows stay at rxe's 128 PSNs or more, resends a
    /// window for each drop: 64 QPs each way between two processes at 4 KiB packets
    /// (`ib_write_bw -b -q 64`, 64 MiB of PSN budget) overran both 8 MiB sockets until
    /// `retry_cnt` ran out.
    udp_bytes: u32,
    /// Bytes in flight to one peer address over UDP, all QPs together, past which they
    /// send nothing new ([`Shares::holds`]): half the socket buffer, as the kernel charges
    /// a datagram more than its bytes, and ACKs share the buffer (`ib_write_bw -q 2000`
    /// over UDP on loopback, 8 MiB buffers: at 8 MiB in flight the receiving socket still
    /// dropped 598 skbs, at 4 MiB none; at 10,000 QPs, 1,067 and none).
    udp_flight: u64,
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
    /// The shares of a device whose socket's receive buffer is `rcvbuf` bytes (as the
    /// kernel granted it; 0: unknown).
    pub(super) fn new(rcvbuf: usize) -> Shares {
        let udp_bytes = match u32::try_from(rcvbuf) {
            Ok(0) => DEFAULT_UDP_BUFFER,
            Ok(b) => b,
            Err(_) => u32::MAX,
        };
        Shares {
            peers: FastMap::default(),
            udp_bytes,
            udp_flight: u64::from(udp_bytes / 2),
        }
    }

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
            Some(bytes) => SHARE_BUDGET_PSNS.min(self.udp_bytes / bytes.max(1)),
            None => SHARE_BUDGET_PSNS,
        };
        match now.and_then(|ip| self.peers.get(&ip)) {
            Some(p) if p.active > 1 => budget / p.active,
            _ => u32::MAX,
        }
    }

    /// Whether a QP toward `ip` over UDP may send nothing new now: the QPs there (it among
    /// them) have more than half the socket buffer in flight together, or — unless it is
    /// their round of turns (`turn`) — others wait for the budget before it, so that the QPs
    /// whose ACKs came do not take what frees up again and again. A QP alone there is its
    /// congestion window's business. (A cap per QP cannot keep thousands of QPs within the
    /// budget: 10,000 windows of [`srdma_proto::congestion::MIN_WINDOW_PSNS`] are 160 MiB of
    /// 4 KiB packets.)
    pub(super) fn holds(&self, ip: IpAddr, turn: bool) -> bool {
        self.peers.get(&ip).is_some_and(|p| {
            (p.active > 1 && p.flight > self.udp_flight) || (p.waiting > 0 && !turn)
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

/// The QPs that their peer's spent budget held back with work left, each once, a queue per
/// peer in the order they were held: [`take_turns`] gives them their turn.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    peers: FastMap<IpAddr, VecDeque<u32>>,
}

impl Waiting {
    /// QP `qpn` toward `ip` waits for its turn.
    pub(super) fn push(&mut self, qpn: u32, ip: IpAddr) {
        self.peers.entry(ip).or_default().push_back(qpn);
    }

    /// Whether some QP waits.
    pub(super) fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Takes the waiters for a round of turns; [`Waiting::put_back`] returns those it kept.
    pub(super) fn take(&mut self) -> Waiting {
        std::mem::take(self)
    }

    /// Puts back the waiters a round kept, in their order, ahead of any of the same peer
    /// that began to wait during the round (usually none: the round's map comes back whole,
    /// and no table is built per round).
    pub(super) fn put_back(&mut self, kept: Waiting) {
        if self.peers.is_empty() {
            self.peers = kept.peers;
            return;
        }
        for (ip, mut queue) in kept.peers {
            if let Some(mut later) = self.peers.remove(&ip) {
                queue.append(&mut later);
            }
            self.peers.insert(ip, queue);
        }
    }
}

/// One round of turns over `round` (from [`Waiting::take`]): the waiters of each peer whose
/// budget is not `spent` are served oldest first (`serve`: it sends what its window lets,
/// and may wait again, behind the others) until it is; the rest keep their places, which
/// this returns. A peer's waiters hold up no other peer's (a peer that does not acknowledge,
/// gone or slow, keeps its budget spent until its QPs time out), and a round costs one look
/// per peer beside the QPs it serves, however many wait.
pub(super) fn take_turns<C>(
    ctx: &mut C,
    mut round: Waiting,
    spent: impl Fn(&C, IpAddr) -> bool,
    mut serve: impl FnMut(&mut C, u32, IpAddr),
) -> Waiting {
    round.peers.retain(|&ip, queue| {
        while let Some(&qpn) = queue.front() {
            if spent(ctx, ip) {
                break;
            }
            queue.pop_front();
            serve(ctx, qpn, ip);
        }
        !queue.is_empty()
    });
    round
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_divided_among_the_qps_with_work() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut s = Shares::new(0);
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
        let mut s = Shares::new(0);
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
        let mut s = Shares::new(0);
        let half = (s.udp_flight / 2) as u32;
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

    #[test]
    fn a_spent_peer_holds_up_no_other_peers_waiters() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        // The context: which peers are spent, the queue, and who was served.
        struct Ctx {
            spent: Vec<IpAddr>,
            waiting: Waiting,
            served: Vec<u32>,
        }
        let mut ctx = Ctx {
            spent: vec![a],
            waiting: Waiting::default(),
            served: Vec::new(),
        };
        for (qpn, ip) in [(1, a), (2, b), (3, a), (4, b), (5, b)] {
            ctx.waiting.push(qpn, ip);
        }
        let round = ctx.waiting.take();
        let kept = take_turns(
            &mut ctx,
            round,
            |c, ip| c.spent.contains(&ip),
            |c, qpn, ip| {
                c.served.push(qpn);
                // Serving QP 4 spends b's budget, and QP 4 waits again with work left.
                if qpn == 4 {
                    c.spent.push(ip);
                    c.waiting.push(qpn, ip);
                }
            },
        );
        assert_eq!(ctx.served, [2, 4], "b's first two, a's waiters kept");
        ctx.waiting.put_back(kept);
        let queue = |ip| Vec::from(ctx.waiting.peers[&ip].clone());
        assert_eq!(queue(a), [1, 3]);
        assert_eq!(queue(b), [5, 4], "the kept, then the one that waits again");
    }

    #[test]
    fn the_budget_follows_the_socket_buffer() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        // A stock Debian's buffer (rmem_max 208 KiB, doubled by the kernel).
        let mut s = Shares::new(425_984);
        assert_eq!(s.update(None, Some(a), Some(1024), (0, 0)), u32::MAX);
        // Two QPs: 416 PSNs together.
        assert_eq!(s.update(None, Some(a), Some(1024), (0, 0)), 208);
        assert_eq!(s.update(Some(a), Some(a), Some(1024), (0, 0)), 208);
        s.update(Some(a), Some(a), Some(1024), (0, 200 << 10));
        assert!(!s.spent(a), "200 KiB in flight: within half the buffer");
        s.update(Some(a), Some(a), Some(1024), (0, 16 << 10));
        assert!(s.spent(a), "216 KiB: past it");
    }
}
