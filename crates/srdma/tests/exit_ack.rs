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
//!
//! A QP destroyed right after its last receive sends that message's ACK once more
//! (`a_destroyed_qp_acknowledges_its_last_message_once_more`).

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::KillOnDrop;
use srdma::cm::{self, ConnectOptions, Listener};
use srdma::{
    AccessFlags, ConnectParams, Cq, Device, Gid, Mr, Mtu, Qp, QpInit, QpType, RecvWr, RemoteQp,
    SendOp, SendWr, SgeList, Wc, WcStatus,
};
use srdma_wire::{BthRepr, Encap, IpRepr, Opcode, PacketRepr, Psn, Qpn, Syndrome};

const PEER_ENV: &str = "SRDMA_EXIT_ACK_PEER";
/// Ping-pong rounds before the last message: enough for the receiver to learn that its
/// application answers each message with a send.
const ROUNDS: u64 = 200;

fn device(ip: &str) -> Device {
    common::dev_with(ip, |c| {
        c.port = 0;
        c.mtu = Mtu::Mtu1024;
        c.pcap = None;
        c.shm = false;
    })
}

/// The next completion, polled without a pause (the application drives the receives).
fn wait_wc(cq: &Cq) -> Wc {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(Instant::now() < end, "no completion in 10 s");
        std::hint::spin_loop();
    }
}

/// Keeps 8 receives of 32 bytes at offset 32 of `mr` posted on `qp`.
fn post_receives(qp: &Qp, mr: &Mr) {
    for i in 0..8 {
        repost(qp, mr, 1000 + i);
    }
}

fn repost(qp: &Qp, mr: &Mr, wr_id: u64) {
    qp.post_recv(RecvWr {
        wr_id,
        sges: SgeList::one(mr.sge(32, 32)),
    })
    .unwrap();
}

fn send(qp: &Qp, mr: &Mr, wr_id: u64) {
    qp.post_send(SendWr::new(wr_id, SendOp::Send, SgeList::one(mr.sge(0, 8))))
        .unwrap();
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
        // Its harness's lines would mix with ours; a failure shows on stderr.
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let req = listener
        .accept_request(Some(Duration::from_secs(20)))
        .unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    post_receives(&qp, &mr);
    let conn = req.accept(&qp, &[]).unwrap();
    let qp = conn.qp();
    for round in 0..=ROUNDS {
        send(qp, &mr, round);
        // The send's completion (its ACK), then, but after the last, the peer's answer.
        let want = if round < ROUNDS { 2 } else { 1 };
        for _ in 0..want {
            let wc = wait_wc(&cq);
            assert_eq!(wc.status, WcStatus::Success, "round {round}: {wc:?}");
            if wc.wr_id >= 1000 {
                repost(qp, &mr, wc.wr_id);
            }
        }
    }
    let st = child.0.wait().unwrap();
    assert!(st.success(), "the peer process failed: {st:?}");
}

/// The receiver: answers every message with a SEND, but the last, after which it exits at
/// once. Runs only as the child of the test above (without its variable it does nothing).
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
    post_receives(qp, &mr);
    let mut received = 0;
    loop {
        let wc = wait_wc(&cq);
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.wr_id < 1000 {
            continue; // an answer's completion
        }
        received += 1;
        if received > ROUNDS {
            // The last message: no answer, no goodbye.
            std::process::exit(0);
        }
        repost(qp, &mr, wc.wr_id);
        send(qp, &mr, received);
    }
}

/// Destroyed right after its last receive, a QP sends that message's ACK once more, in a
/// datagram of its own (`srdma_proto::Qp::ack_once_more`): on a lossy path one lost ACK then
/// does not leave the requester retrying into a QP that is gone (rxe retries for ever with
/// `retry_cnt` 7). The requester is a plain UDP socket that sends SEND_ONLYs and reads what
/// comes back; a QP destroyed before any request sends nothing more.
#[test]
fn a_destroyed_qp_acknowledges_its_last_message_once_more() {
    let dev = device("127.0.88.3");
    let peer = UdpSocket::bind("127.0.88.4:0").unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (me, to) = (peer.local_addr().unwrap(), dev.local_addr());
    let encap = Encap {
        ip: IpRepr::between(me.ip(), to.ip()).unwrap(),
        src_port: me.port(),
        dst_port: to.port(),
    };
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16, None).unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let connected = || {
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        post_receives(&qp, &mr);
        let remote = RemoteQp {
            qpn: Qpn::new(0x99),
            psn: Psn::new(0x700),
            gid: Gid::from_ip(me.ip()),
            port: me.port(),
        };
        qp.connect(&remote, &ConnectParams::new(Mtu::Mtu1024, Psn::new(0x100)))
            .unwrap();
        qp
    };
    let send_only = |qp: &Qp, psn: u32| {
        let bth = BthRepr {
            opcode: Opcode::RcSendOnly,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qpn: qp.qpn(),
            ack_req: true,
            psn: Psn::new(psn),
        };
        let r = PacketRepr::new(bth, &[7u8; 8]);
        let mut b = vec![0u8; r.buffer_len()];
        let n = r.emit_with_icrc(&mut b, &encap).unwrap();
        peer.send_to(&b[..n], to).unwrap();
    };
    // (PSN, syndrome) of each ACK that arrives until the socket stays quiet for 300 ms.
    let acks = || {
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = peer.recv(&mut buf) {
            let r = PacketRepr::parse_bytes(&buf[..n]).expect("a valid packet");
            assert_eq!(r.bth.opcode, Opcode::RcAcknowledge, "{r}");
            got.push((r.bth.psn.value(), r.aeth.unwrap().syndrome));
            peer.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
        }
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        got
    };

    let qp = connected();
    for psn in 0x700..0x703 {
        send_only(&qp, psn);
        assert_eq!(wait_wc(&cq).status, WcStatus::Success);
    }
    assert_eq!(acks().last(), Some(&(0x702, Syndrome::ACK)));
    drop(qp);
    assert_eq!(acks(), [(0x702, Syndrome::ACK)], "the last ACK once more");

    // Nothing received: nothing to acknowledge once more.
    let qp = connected();
    drop(qp);
    peer.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(acks(), []);
}
