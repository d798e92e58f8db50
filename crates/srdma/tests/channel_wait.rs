//! A thread asleep in `CompChannel::get_event` watches its device's socket itself (the
//! progress thread leaves the socket to it, so a message wakes the application directly).
//! These tests check that the device keeps its promises around that hand-over: one-sided
//! operations aimed at a device whose only application thread waits on its channel complete;
//! and once that thread stops waiting (after a timeout, or after an event, also after a long
//! idle wait), the progress thread takes the socket back and one-sided operations still
//! complete with nobody polling.

use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, CompChannel, ConnectParams, Cq, Device, DeviceConfig, Mr, Mtu, Qp, QpInit, QpType,
    RKey, RecvWr, SendOp, SendWr, SgeList, WcOpcode, WcStatus,
};
use srdma_wire::Psn;

mod common;
use common::remote;

const LEN: usize = 4096;

struct Side {
    _dev: Device,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

/// A (plain CQ) and B (CQ on `ch`), an RC pair between them, an MR on each.
fn pair(ip_a: &str, ip_b: &str, ch: &CompChannel) -> (Side, Side) {
    let open = |ip: &str| {
        let mut c = DeviceConfig::new(ip.parse().unwrap());
        c.share_port = false;
        Device::open(c).unwrap()
    };
    let (a, b) = (open(ip_a), open(ip_b));
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let cqa = a.create_cq(64, None).unwrap();
    let cqb = b.create_cq(64, Some(ch)).unwrap();
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa, &cqa)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb, &cqb)).unwrap();
    let params = |psn| ConnectParams::new(Mtu::Mtu1024, Psn::new(psn));
    qa.connect(&remote(&b, qb.qpn(), 9), &params(4)).unwrap();
    qb.connect(&remote(&a, qa.qpn(), 4), &params(9)).unwrap();
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (ma, mb) = (pa.reg_mr(LEN, all).unwrap(), pb.reg_mr(LEN, all).unwrap());
    (
        Side {
            _dev: a,
            qp: qa,
            cq: cqa,
            mr: ma,
        },
        Side {
            _dev: b,
            qp: qb,
            cq: cqb,
            mr: mb,
        },
    )
}

/// The next completion on `cq` (not polling faster than every millisecond: the device must
/// progress without the application's help).
fn wait_wc(cq: &Cq, what: &str) -> srdma::Wc {
    let start = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: no completion"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A WRITEs `round`'s pattern into B's MR and READs it back: both must complete (B's
/// application is not polling) and the data must be B's.
fn write_then_read(a: &Side, b: &Side, round: u8) {
    let r = b.mr.remote().unwrap();
    let data = vec![round; 1500];
    a.mr.write(0, &data).unwrap();
    let ops = [
        (
            SendOp::Write {
                remote_addr: r.addr,
                rkey: RKey(r.rkey),
            },
            0,
            WcOpcode::RdmaWrite,
        ),
        (
            SendOp::Read {
                remote_addr: r.addr,
                rkey: RKey(r.rkey),
            },
            2048,
            WcOpcode::RdmaRead,
        ),
    ];
    for (op, at, opcode) in ops {
        a.qp.post_send(SendWr::new(1, op, SgeList::one(a.mr.sge(at, 1500))))
            .unwrap();
        let wc = wait_wc(&a.cq, &format!("round {round}: {op:?}"));
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, opcode),
            "round {round}: {op:?}"
        );
    }
    let mut back = vec![0u8; 1500];
    a.mr.read(2048, &mut back).unwrap();
    assert_eq!(back, data, "round {round}: what the READ brought back");
}

/// B's only application thread waits on its channel while A WRITEs and READs B's memory:
/// the waiting thread receives for the device, and a SEND then wakes it with B's CQ event.
#[test]
fn one_sided_operations_complete_while_the_target_waits_on_its_channel() {
    let ch = CompChannel::new().unwrap();
    let (a, b) = pair("127.0.41.1", "127.0.41.2", &ch);
    b.qp.post_recv(RecvWr {
        wr_id: 7,
        sges: SgeList::one(b.mr.sge(LEN - 64, 64)),
    })
    .unwrap();
    b.cq.req_notify(false);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ch.get_event(Some(Duration::from_secs(20))).unwrap());
        for round in 1..=20 {
            write_then_read(&a, &b, round);
        }
        a.qp.post_send(SendWr::new(2, SendOp::Send, SgeList::one(a.mr.sge(0, 16))))
            .unwrap();
        assert_eq!(waiter.join().unwrap(), Some(b.cq.id()));
    });
    assert_eq!(wait_wc(&a.cq, "the SEND").status, WcStatus::Success);
    let wc = b.cq.poll_one().expect("the SEND's completion");
    assert_eq!((wc.wr_id, wc.opcode), (7, WcOpcode::Recv));
}

/// B's thread stops waiting (a timeout; an event after a long idle wait, when the progress
/// thread had gone to sleep on timers alone) and never polls again: the progress thread
/// must take the socket back, or the next WRITE and READ would never complete.
#[test]
fn the_progress_thread_takes_the_socket_back_when_the_waiter_leaves() {
    let ch = CompChannel::new().unwrap();
    let (a, b) = pair("127.0.42.1", "127.0.42.2", &ch);
    // A wait that times out.
    b.cq.req_notify(false);
    assert_eq!(ch.get_event(Some(Duration::from_millis(30))).unwrap(), None);
    write_then_read(&a, &b, 1);
    // A long wait (the progress thread sleeps deep meanwhile) that an event ends.
    b.qp.post_recv(RecvWr {
        wr_id: 8,
        sges: SgeList::one(b.mr.sge(LEN - 64, 64)),
    })
    .unwrap();
    b.cq.req_notify(false);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| ch.get_event(Some(Duration::from_secs(20))).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        a.qp.post_send(SendWr::new(3, SendOp::Send, SgeList::one(a.mr.sge(0, 16))))
            .unwrap();
        assert_eq!(waiter.join().unwrap(), Some(b.cq.id()));
    });
    assert_eq!(wait_wc(&a.cq, "the SEND").status, WcStatus::Success);
    // Nobody on B waits or polls any more.
    for round in 2..=5 {
        write_then_read(&a, &b, round);
    }
}
