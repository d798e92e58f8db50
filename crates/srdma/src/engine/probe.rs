//! The GSO path probe (`Gso::Auto`): whether a GSO message cut into datagrams on the way to
//! a peer reaches its transport whole.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::tx::capture_tx;
use super::{Shared, State};
use crate::driver::{Driver, GsoJoin, Outgoing, Whole};
use crate::types::{Gid, Gso};

/// What a device knows of the path to a peer address for UDP GSO (`Gso::Auto`, IPv4 peers
/// off this host): whether a GSO message cut into datagrams on the way reaches the peer's
/// transport whole (each datagram's ICRC covers the IPv4 ID the cutting gives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PathGso {
    /// Not known yet: one datagram per send; a QP to it probes when idle, from `next_try`.
    /// `tries` probes were inconclusive so far, the last `ones` in a row with one answer.
    Unknown { tries: u8, ones: u8, next_try: u64 },
    /// QP `qpn` sent the probe: two copies of a duplicate request in one GSO message.
    Probing {
        qpn: u32,
        /// The QP's `unproductive_acks` and `psn_state` when it sent the probe.
        acks: u64,
        psns: (srdma_wire::Psn, srdma_wire::Psn),
        deadline: u64,
        tries: u8,
        ones: u8,
    },
    /// Both copies drew their ACK.
    Verified,
    /// One did, the other did not: one datagram per send from now on.
    Refused,
}

/// What a device knows of the paths to its peers' addresses.
pub(super) type Paths = crate::fasthash::FastMap<IpAddr, PathGso>;

/// What the GSO path probe ([`Shared::probe_path`]) learned of each peer address (in the
/// engine's `State`).
#[derive(Debug, Default)]
pub(super) struct Probes {
    /// Each peer address's path, once a QP to it was flushed.
    paths: Paths,
    /// How many of `paths` are [`PathGso::Probing`]: flushes look at them only then.
    probing: usize,
}

impl Probes {
    /// Whether the path to `ip` is known to take GSO messages cut into datagrams.
    pub(super) fn verified(&self, ip: IpAddr) -> bool {
        self.paths.get(&ip) == Some(&PathGso::Verified)
    }

    /// The deadlines (ns since the epoch) of the probes under way.
    pub(super) fn deadlines(&self) -> impl Iterator<Item = u64> + '_ {
        let under_way = if self.probing > 0 {
            Some(self.paths.values())
        } else {
            None
        };
        under_way.into_iter().flatten().filter_map(|p| match *p {
            PathGso::Probing { deadline, .. } => Some(deadline),
            _ => None,
        })
    }
}

/// How long a probe's two ACKs may take.
const PROBE_WAIT: Duration = Duration::from_millis(200);
/// Inconclusive probes (lost, or the QP got busy) before the path counts as refused.
const PROBE_TRIES: u8 = 5;
/// Probes in a row with exactly one answer (the QP idle meanwhile) that refuse the path: a
/// path that rejects cut datagrams does so every time, a lossy one rarely twice running.
const PROBE_ONES: u8 = 2;

/// What a probe's answers say: `got` ACKs by the deadline (`None`: before it, as they
/// come), the QP idle all along or not, after `tries` inconclusive probes, the last
/// `ones` of them answered once. `None`: wait for more.
fn probe_verdict(got: u64, idle: bool, due: bool, tries: u8, ones: u8) -> Option<PathGso> {
    if got >= 2 {
        return Some(PathGso::Verified);
    }
    if !due {
        return None;
    }
    let ones = if got == 1 && idle { ones + 1 } else { 0 };
    Some(if ones >= PROBE_ONES || tries + 1 >= PROBE_TRIES {
        PathGso::Refused
    } else {
        PathGso::Unknown {
            tries: tries + 1,
            ones,
            next_try: 0,
        }
    })
}

impl Shared {
    /// The GSO path probe (`Gso::Auto`): when QP `qpn` is an idle RC QP in RTS and the path
    /// to its peer (an IPv4 address off this host) is not known yet, sends two copies of a
    /// duplicate request (`Qp::gso_probe`) as one GSO message. The peer answers each copy
    /// that reaches its transport intact with an ACK: two mean cut datagrams are accepted
    /// ([`PathGso::Verified`]); one, with the QP still idle, means the second datagram of
    /// the cut message was rejected (its ICRC did not match the IPv4 ID it arrived with):
    /// the path is refused and gets one datagram per send. Lost or muddled probes are
    /// tried again, [`PROBE_TRIES`] times in all. Until verified, one datagram per send; the
    /// probe leaves ahead of a QP's first message to the peer, or its first answer.
    pub(super) fn probe_path(&self, st: &mut State, qpn: u32, now: Duration) {
        if self.cfg.gso != Gso::Auto {
            return;
        }
        let State {
            qps,
            udp,
            tx: super::tx::TxState { frame, .. },
            probes: Probes { paths, probing },
            counters,
            timers,
            capture,
            shm,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        // Its packets go through a ring: no UDP path to learn (and no lookups per post).
        if slot.path == crate::Path::SharedMemory {
            return;
        }
        // Only once the peer can answer: it sent us something, or the application has a
        // message for it (not at the move to RTS, which may come before the peer's to RTR).
        let a = slot.qp.attr();
        if slot.qp.state() != srdma_proto::QpState::Rts
            || slot.qp.qp_type() != srdma_proto::QpType::Rc
            || !(slot.qp.has_requests_ready() || slot.qp.counters().rcvd_pkts > 0)
        {
            return;
        }
        let dst = SocketAddr::new(Gid(a.ah_attr.dgid).ip(), a.ah_attr.udp_dport);
        if self.uncut(dst) {
            return;
        }
        // Known, or being probed: the common case, one lookup per flush.
        if !matches!(paths.get(&dst.ip()), None | Some(PathGso::Unknown { .. })) {
            return;
        }
        let ns = now.as_nanos() as u64;
        // A peer of this host reached through shared memory: no UDP path to learn.
        if shm
            .as_mut()
            .is_some_and(|s| s.route(dst, a.dest_qp_num.value(), ns).is_some())
        {
            return;
        }
        let entry = paths.entry(dst.ip()).or_insert(PathGso::Unknown {
            tries: 0,
            ones: 0,
            next_try: 0,
        });
        let PathGso::Unknown {
            tries,
            ones,
            next_try,
        } = *entry
        else {
            return;
        };
        if ns < next_try {
            return;
        }
        let Some(encap) = self.encap_to(dst, self.local.port()) else {
            return;
        };
        let (acks, psns) = (slot.qp.unproductive_acks(), slot.qp.psn_state());
        let Some(udp) = udp.as_deref_mut() else {
            return;
        };
        counters.tx_errors += udp.flush() as u64;
        for _ in 0..2 {
            let Some(t) = slot.qp.gso_probe(frame) else {
                break;
            };
            if let Some(w) = capture.as_mut() {
                if !capture_tx(w, ns, &encap, &mut frame[..t.len]) {
                    break;
                }
            }
            let pkt = Outgoing {
                len: t.len,
                dst,
                encap: &encap,
                gso: GsoJoin::Any,
                pullable: false,
            };
            if !udp.queue((), &pkt, frame, &Whole) {
                break;
            }
        }
        if udp.queued() != 2 {
            // Not idle after all (or no room): nothing sent, try at a later flush.
            udp.discard();
            return;
        }
        counters.tx_datagrams += 2;
        counters.tx_errors += udp.flush() as u64;
        udp.count_into(counters);
        let deadline = ns + PROBE_WAIT.as_nanos() as u64;
        *entry = PathGso::Probing {
            qpn,
            acks,
            psns,
            deadline,
            tries,
            ones,
        };
        *probing += 1;
        timers.expect(deadline);
    }

    /// After QP `qpn` handled what arrived: a probe it sent that both ACKs answered
    /// verifies its path; at the probe's deadline ([`Shared::run_timers`]) the answers so
    /// far decide.
    pub(super) fn probe_answered(&self, st: &mut State, qpn: u32, now: Duration) {
        if st.probes.probing == 0 {
            return;
        }
        let ns = now.as_nanos() as u64;
        for path in st.probes.paths.values_mut() {
            let PathGso::Probing {
                qpn: q,
                acks,
                psns,
                deadline,
                tries,
                ones,
            } = *path
            else {
                continue;
            };
            if q != qpn && ns < deadline {
                continue;
            }
            let (got, idle) = st.qps.get(&q).map_or((0, false), |s| {
                (
                    s.qp.unproductive_acks().saturating_sub(acks),
                    s.qp.psn_state() == psns,
                )
            });
            let Some(v) = probe_verdict(got, idle, ns >= deadline, tries, ones) else {
                continue;
            };
            st.probes.probing -= 1;
            *path = match v {
                PathGso::Unknown { tries, ones, .. } => PathGso::Unknown {
                    tries,
                    ones,
                    next_try: ns + PROBE_WAIT.as_nanos() as u64,
                },
                v => v,
            };
            match *path {
                PathGso::Verified => st.counters.gso_paths_verified += 1,
                PathGso::Refused => st.counters.gso_paths_refused += 1,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PROBE_TRIES, PathGso, probe_verdict};

    #[test]
    fn a_probe_verifies_on_two_answers_and_refuses_on_one_twice_running() {
        // Two answers verify at once, before the deadline too.
        assert_eq!(
            probe_verdict(2, false, false, 0, 0),
            Some(PathGso::Verified)
        );
        // Before the deadline, fewer wait.
        assert_eq!(probe_verdict(1, true, false, 0, 0), None);
        // One answer with the QP idle: once is not enough (a lossy path), twice refuses.
        let once = probe_verdict(1, true, true, 0, 0);
        assert!(matches!(
            once,
            Some(PathGso::Unknown {
                tries: 1,
                ones: 1,
                ..
            })
        ));
        assert_eq!(probe_verdict(1, true, true, 1, 1), Some(PathGso::Refused));
        // One answer while the QP was busy (the answer may have acknowledged something),
        // or none: inconclusive, and the run of single answers starts over.
        let busy = probe_verdict(1, false, true, 1, 1);
        assert!(matches!(
            busy,
            Some(PathGso::Unknown {
                tries: 2,
                ones: 0,
                ..
            })
        ));
        let none = probe_verdict(0, true, true, 0, 0);
        assert!(matches!(
            none,
            Some(PathGso::Unknown {
                tries: 1,
                ones: 0,
                ..
            })
        ));
        // A path that never answers is refused after the last try.
        assert_eq!(
            probe_verdict(0, true, true, PROBE_TRIES - 1, 0),
            Some(PathGso::Refused)
        );
    }
}
