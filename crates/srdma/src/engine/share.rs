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

/// QPs with work, per destination address.
#[derive(Debug, Default)]
pub(super) struct Shares {
    active: HashMap<IpAddr, u32>,
}

impl Shares {
    /// A QP counted under `was` (None: not counted) now has work toward `now` (None: none);
    /// returns the cap of its window. `udp_mtu`: the QP's path MTU (its packets' size) when its
    /// path is UDP.
    pub(super) fn update(
        &mut self,
        was: Option<IpAddr>,
        now: Option<IpAddr>,
        udp_mtu: Option<u32>,
    ) -> u32 {
        if was != now {
            if let Some(ip) = was {
                if let Some(n) = self.active.get_mut(&ip) {
                    *n -= 1;
                    if *n == 0 {
                        self.active.remove(&ip);
                    }
                }
            }
            if let Some(ip) = now {
                *self.active.entry(ip).or_insert(0) += 1;
            }
        }
        let budget = match udp_mtu {
            Some(bytes) => SHARE_BUDGET_PSNS.min(UDP_SHARE_BYTES / bytes.max(1)),
            None => SHARE_BUDGET_PSNS,
        };
        match now.and_then(|ip| self.active.get(&ip)) {
            Some(&n) if n > 1 => budget / n,
            _ => u32::MAX,
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
        assert_eq!(s.update(None, Some(a), None), u32::MAX, "alone: no cap");
        assert_eq!(s.update(None, Some(a), None), SHARE_BUDGET_PSNS / 2);
        assert_eq!(
            s.update(None, Some(b), None),
            u32::MAX,
            "another peer's budget"
        );
        for _ in 0..14 {
            s.update(None, Some(a), None);
        }
        assert_eq!(
            s.update(Some(a), Some(a), None),
            1024,
            "16 QPs to a: a full window each"
        );
        // One goes idle, one moves to b.
        assert_eq!(s.update(Some(a), None, None), u32::MAX);
        assert_eq!(s.update(Some(a), Some(b), None), SHARE_BUDGET_PSNS / 2);
        assert_eq!(s.update(Some(a), Some(a), None), SHARE_BUDGET_PSNS / 14);
    }

    #[test]
    fn over_udp_the_budget_is_what_a_socket_buffer_holds() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut s = Shares::default();
        for _ in 0..63 {
            s.update(None, Some(a), Some(4096));
        }
        // 64 QPs of 4 KiB packets: 8 MiB together, 32 PSNs each (a ring's path: 256).
        assert_eq!(s.update(None, Some(a), Some(4096)), 32);
        assert_eq!(s.update(Some(a), Some(a), None), 256);
        // 1 KiB packets: 8192 PSNs together.
        assert_eq!(s.update(Some(a), Some(a), Some(1024)), 128);
    }
}
