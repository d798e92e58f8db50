//! A process that exits right after its last receive still acknowledges it.
//!
//! srdma holds the ACK of a QP whose application answers each message with a send, for a
//! moment, so that it leaves with that send (`Hold::Riding`). A NIC acknowledges at
//! arrival, whatever its process does next: a receiver that exits instead of answering (a
//! socket program closing, a test ending) must not leave the sender's last message
//! unacknowledged, or the sender retries into a QP that is gone and fails. The device
//! flushes what it holds at `exit`.
//!
//! The receiver is this test binary run again as a child process (`exit_peer`), connected
//! through `srdma::cm` over UDP (no shared memory, where nothing is held).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use srdma::cm::{self, ConnectOptions, Listener};
use srdma::{
    AccessFlags, Cq, Device, DeviceConfig, Mtu, QpInit, QpType, RecvWr, SendOp, SendWr, SgeList,
    Wc, WcStatus,
};

const PEER_ENV: &str = "SRDMA_EXIT_ACK_PEER";
/// Ping-pong rounds before the last message: enough for the receiver to learn that its
/// application answers each message with a send.
const ROUNDS: u64 = 200;

fn device(ip: &str) -> Device {
    let mut c = DeviceConfig::new(ip.parse().unwrap());
    c.port = 0;
    c.mtu = Mtu::Mtu1024;
    c.pcap = None;
    c.shm = false;
    Device::open(c).unwrap()
}

fn wait_wc(cq: &Cq, limit: Duration) -> Option<Wc> {
    let end = Instant::now() + limit;
    loop {
        if let Some(wc) = cq.poll_one() {
            return Some(wc);
        }
        if Instant::now() >= end {
            return None;
        }
        std::hint::spin_loop();
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

#[test]
fn the_last_message_is_acknowledged_when_the_receiver_exits() {
    let dev = device("127.0.88.1");
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64, None).unwrap();
    let listener = Listener::bind(&dev, &pd, "127.0.88.1:0".parse().unwrap()).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["exit_peer", "--exact", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, listener.local_addr().to_string())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let req = listener
        .accept_request(Some(Duration::from_secs(20)))
        .unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..8 {
        qp.post_recv(RecvWr {
            wr_id: 1000 + i,
            sges: SgeList::one(mr.sge(32, 32)),
        })
        .unwrap();
    }
    let conn = req.accept(&qp, &[]).unwrap();
    let qp = conn.qp();
    for round in 0..=ROUNDS {
        qp.post_send(SendWr::new(round, SendOp::Send, SgeList::one(mr.sge(0, 8))))
            .unwrap();
        // The send's completion (its ACK), then, but after the last, the peer's answer.
        let want = if round < ROUNDS { 2 } else { 1 };
        for _ in 0..want {
            let wc = wait_wc(&cq, Duration::from_secs(10)).expect("no completion in 10 s");
            assert_eq!(wc.status, WcStatus::Success, "round {round}: {wc:?}");
            if wc.wr_id >= 1000 {
                qp.post_recv(RecvWr {
                    wr_id: wc.wr_id,
                    sges: SgeList::one(mr.sge(32, 32)),
                })
                .unwrap();
            }
        }
    }
    let st = child.0.wait().unwrap();
    assert!(st.success(), "the peer process failed: {st:?}");
}

/// The receiver: answers every message with a SEND, but the last, after which it exits at
/// once. Runs only as the child of the test above.
#[test]
fn exit_peer() {
    let Ok(server) = std::env::var(PEER_ENV) else {
        return;
    };
    let server: SocketAddr = server.parse().unwrap();
    let dev = device("127.0.88.2");
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64, None).unwrap();
    let init = QpInit::new(QpType::Rc, &cq, &cq);
    let conn = cm::connect(&dev, &pd, server, &init, &ConnectOptions::default()).unwrap();
    let qp = conn.qp();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..8 {
        qp.post_recv(RecvWr {
            wr_id: 1000 + i,
            sges: SgeList::one(mr.sge(32, 32)),
        })
        .unwrap();
    }
    let mut received = 0;
    while received <= ROUNDS {
        let wc = wait_wc(&cq, Duration::from_secs(10)).expect("no completion in 10 s");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.wr_id < 1000 {
            continue; // an answer's completion
        }
        received += 1;
        if received > ROUNDS {
            // The last message: no answer, no goodbye.
            std::process::exit(0);
        }
        qp.post_recv(RecvWr {
            wr_id: wc.wr_id,
            sges: SgeList::one(mr.sge(32, 32)),
        })
        .unwrap();
        qp.post_send(SendWr::new(
            received,
            SendOp::Send,
            SgeList::one(mr.sge(0, 8)),
        ))
        .unwrap();
    }
}
