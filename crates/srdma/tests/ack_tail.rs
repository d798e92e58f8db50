//! In a SEND ping-pong, the ACK a receive holds back leaves with the application's reply.
//! Whether it goes as the short tail of the reply's GSO message (both arrive together) or as
//! a datagram of its own (the reply arrives sooner, the ACK one send later) follows the
//! application's shape (`QpSlot::ack_tail` in the engine): a QP with separate send and
//! receive CQs gets the tail, one whose completions share a CQ gets two datagrams.

use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, ConnectParams, Cq, Device, DeviceConfig, Mr, Mtu, Qp, QpInit, QpType, RecvWr,
    RemoteQp, SendOp, SendWr, SgeList, WcOpcode, WcStatus,
};
use srdma_wire::Psn;

const ROUNDS: u64 = 300;

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
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
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
    let (ga, gb) = (
        a.dev.counters().tx_gso_messages,
        b.dev.counters().tx_gso_messages,
    );
    for n in 0..ROUNDS {
        a.send(n);
        b.wait_recv(a);
        b.post_recv(n);
        b.send(n);
        a.wait_recv(b);
        a.post_recv(n);
    }
    (
        a.dev.counters().tx_gso_messages - ga,
        b.dev.counters().tx_gso_messages - gb,
    )
}

#[test]
fn the_ack_rides_as_the_tail_of_the_reply_only_for_separate_send_and_receive_cqs() {
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
