//! In a ping-pong, the ACK a receive holds back leaves with the application's reply.
//! Whether it goes as the short tail of the reply's GSO message (both arrive together) or as
//! a datagram of its own (the reply arrives sooner, the ACK one send later) follows the
//! application's shape (`QpSlot::ack_tail` in the engine): an application that waits for
//! its send's completion before it looks for the reply gets the tail (in a SEND ping-pong,
//! one with separate send and receive CQs, as perftest's `ib_send_lat`; in a WRITE
//! ping-pong, where each side spins on its memory for the peer's WRITE, as perftest's
//! `ib_write_lat`); one whose completions share a CQ with its receives, or that does not
//! wait for its sends' completions, gets two datagrams.

use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, ConnectParams, Cq, Device, DeviceConfig, Mr, Mtu, Qp, QpInit, QpType, RecvWr,
    RemoteQp, SendOp, SendWr, SgeList, WcOpcode, WcStatus,
};
use srdma_wire::Psn;

const ROUNDS: u64 = 300;

/// One ping-pong at a time: each runs two busy threads, as many as a small machine has cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Side {
    dev: Device,
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    mr: Mr,
}

fn side(ip: &str, separate_cqs: bool) -> Side {
    let mut c = DeviceConfig::new(ip.parse().unwrap());
    c.share_port = false;
    // GSO messages are the UDP driver's: this host's peers would meet through shared memory.
    c.shm = false;
    let dev = Device::open(c).unwrap();
    let pd = dev.alloc_pd();
    let send_cq = dev.create_cq(64, None).unwrap();
    let recv_cq = if separate_cqs {
        dev.create_cq(64, None).unwrap()
    } else {
        send_cq.clone()
    };
    let qp = pd
        .create_qp(&QpInit::new(QpType::Rc, &send_cq, &recv_cq))
        .unwrap();
    let mr = pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    Side {
        dev,
        qp,
        send_cq,
        recv_cq,
        mr,
    }
}

fn connect(a: &Side, b: &Side) {
    let at = |s: &Side, psn| RemoteQp {
        qpn: s.qp.qpn(),
        psn: Psn::new(psn),
        gid: s.dev.local_gid(),
        port: s.dev.local_addr().port(),
    };
    let params = |psn| ConnectParams::new(Mtu::Mtu1024, Psn::new(psn));
    a.qp.connect(&at(b, 7), &params(3)).unwrap();
    b.qp.connect(&at(a, 3), &params(7)).unwrap();
}

impl Side {
    fn post_recv(&self, n: u64) {
        let wr = RecvWr {
            wr_id: n,
            sges: SgeList::one(self.mr.sge(2048, 8)),
        };
        self.qp.post_recv(wr).unwrap();
    }

    fn send(&self, n: u64) {
        let wr = SendWr::new(n, SendOp::Send, SgeList::one(self.mr.sge(0, 8)));
        self.qp.post_send(wr).unwrap();
    }

    /// WRITEs `c` into the last of 8 bytes at the peer's offset 2048 (the byte it spins on).
    fn write(&self, n: u64, c: u8, peer: &Side) {
        self.mr.write(7, &[c]).unwrap();
        let op = SendOp::Write {
            remote_addr: peer.mr.addr() + 2048,
            rkey: peer.mr.rkey().unwrap(),
        };
        let wr = SendWr::new(n, op, SgeList::one(self.mr.sge(0, 8)));
        self.qp.post_send(wr).unwrap();
    }

    /// Polls the send CQ: until a completion came (`wait`), else once (a completion a poll
    /// did not take waits for the next round's).
    fn reap(&self, wait: bool, peer: &Side) {
        let start = Instant::now();
        loop {
            if let Some(wc) = self.send_cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                return;
            }
            if !wait {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no send completion: {:?}, peer {:?}",
                self.dev.counters(),
                peer.dev.counters()
            );
        }
    }

    /// Spins on the byte the peer WRITEs until it reads `c` (each read drives the device).
    fn wait_memory(&self, c: u8, peer: &Side) {
        let start = Instant::now();
        let mut b = [0u8];
        loop {
            self.mr.read(2048 + 7, &mut b).unwrap();
            if b[0] == c {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no WRITE: {:?}, peer {:?}",
                self.dev.counters(),
                peer.dev.counters()
            );
        }
    }

    /// Polls (busy, as a latency benchmark does) until a receive completes, reaping the
    /// send completions on the way.
    fn wait_recv(&self, peer: &Side) {
        let start = Instant::now();
        loop {
            let mut got = false;
            for cq in [&self.recv_cq, &self.send_cq] {
                while let Some(wc) = cq.poll_one() {
                    assert_eq!(
                        wc.status,
                        WcStatus::Success,
                        "{wc:?}: {:?}, peer {:?}",
                        self.dev.counters(),
                        peer.dev.counters()
                    );
                    got |= wc.opcode == WcOpcode::Recv;
                }
            }
            if got {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no message: {:?}, peer {:?}",
                self.dev.counters(),
                peer.dev.counters()
            );
        }
    }
}

/// Runs the ping-pong (A sends first; each side replenishes its receive and replies as soon
/// as a message arrives) and returns the GSO messages each side sent during it.
fn ping_pong(a: &Side, b: &Side) -> (u64, u64) {
    connect(a, b);
    for s in [a, b] {
        for n in 0..4 {
            s.post_recv(n);
        }
    }
    gso_messages_during(a, b, || {
        for n in 0..ROUNDS {
            a.send(n);
            b.wait_recv(a);
            b.post_recv(n);
            b.send(n);
            a.wait_recv(b);
            a.post_recv(n);
        }
    })
}

/// The GSO messages A and B send while `run` runs.
fn gso_messages_during(a: &Side, b: &Side, run: impl FnOnce()) -> (u64, u64) {
    let sent = || {
        (
            a.dev.counters().tx_gso_messages,
            b.dev.counters().tx_gso_messages,
        )
    };
    let (ga, gb) = sent();
    run();
    let (na, nb) = sent();
    (na - ga, nb - gb)
}

#[test]
fn the_ack_rides_as_the_tail_of_the_reply_only_for_separate_send_and_receive_cqs() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let a = side("127.0.0.81", true);
    let b = side("127.0.0.82", false);
    let (ga, gb) = ping_pong(&a, &b);
    // A's ACKs ride behind its requests once it learned that a send follows each receive
    // (after a few rounds): as GSO tails (all but ~10 of the rounds on a quiet machine; a
    // quarter leaves room for a loaded one, where a late post makes it learn again). B's go
    // alone, and its replies are single packets.
    assert!(
        ga >= ROUNDS / 4,
        "A sent {ga} GSO messages in {ROUNDS} rounds"
    );
    assert_eq!(gb, 0, "B sent {gb} GSO messages");
}

/// Runs a WRITE ping-pong, each side on a thread of its own (A writes first; each side
/// answers the peer's WRITE, which it learns of from its memory, with its own), and returns
/// the GSO messages each side sent during it. `wait`: after each post the application polls
/// its send CQ until the WRITE completes (perftest's `ib_write_lat`); else it polls once and
/// turns to its memory.
fn write_ping_pong(a: &Side, b: &Side, wait: bool) -> (u64, u64) {
    connect(a, b);
    let c = |n: u64| (n % 255) as u8 + 1;
    gso_messages_during(a, b, || {
        std::thread::scope(|t| {
            t.spawn(|| {
                for n in 0..ROUNDS {
                    a.write(n, c(n), b);
                    a.reap(wait, b);
                    a.wait_memory(c(n), b);
                }
            });
            t.spawn(|| {
                for n in 0..ROUNDS {
                    b.wait_memory(c(n), a);
                    b.write(n, c(n), a);
                    b.reap(wait, a);
                }
            });
        })
    })
}

#[test]
fn in_a_write_ping_pong_the_ack_rides_as_the_tail_only_for_an_application_that_waits_for_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let a = side("127.0.0.83", true);
    let b = side("127.0.0.84", true);
    let (ga, gb) = write_ping_pong(&a, &b, true);
    // Every reply carries the ACK of the WRITE it answers: all but a few rounds on a quiet
    // machine. On a loaded one, an ACK that the progress thread or a poll sent before the
    // reply was posted (its application was descheduled) goes alone, and many rounds miss.
    assert!(
        ga + gb >= ROUNDS / 8,
        "GSO messages in {ROUNDS} rounds: A {ga}, B {gb}"
    );

    let a = side("127.0.0.85", true);
    let b = side("127.0.0.86", true);
    let (ga, gb) = write_ping_pong(&a, &b, false);
    // Learned within the first posts (`ACK_WAITS_NOT_AFTER`): the ACK goes alone.
    assert!(
        ga <= 12 && gb <= 12,
        "GSO messages in {ROUNDS} rounds: A {ga}, B {gb}"
    );
}
