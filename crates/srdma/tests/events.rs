//! Async events and port sharing: a CQ overrun (IBV_EVENT_CQ_ERR, its QP to ERR), a device
//! failure (IBV_EVENT_DEVICE_FATAL, every QP flushed, later calls refused), and two devices
//! sharing one address and UDP 4791 with QPNs steered by the kernel to the right socket.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, AsyncEvent, ConnectParams, Cq, Device, Error, Mtu, Qp, QpInit, QpState, QpType,
    RKey, RecvWr, SendOp, SendWr, SgeList, Wc, WcStatus,
};
use srdma_wire::Psn;

mod common;
use common::{dev_with, remote};

fn events(dev: &Device) -> Arc<Mutex<Vec<AsyncEvent>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    dev.set_event_handler(Arc::new(move |ev| s2.lock().unwrap().push(ev)));
    seen
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn poll(cq: &Cq) -> Wc {
    let start = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no completion");
    }
}

/// An RC pair on `a` and `b`, connected.
fn rc_pair(a: &Device, b: &Device, cqe: usize) -> (Qp, Cq, Qp, Cq) {
    let (cqa, cqb) = (
        a.create_cq(cqe, None).unwrap(),
        b.create_cq(64, None).unwrap(),
    );
    let qa = a
        .alloc_pd()
        .create_qp(&QpInit::new(QpType::Rc, &cqa, &cqa))
        .unwrap();
    let qb = b
        .alloc_pd()
        .create_qp(&QpInit::new(QpType::Rc, &cqb, &cqb))
        .unwrap();
    qa.connect(
        &remote(b, qb.qpn(), 7),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(3)),
    )
    .unwrap();
    qb.connect(
        &remote(a, qa.qpn(), 3),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(7)),
    )
    .unwrap();
    (qa, cqa, qb, cqb)
}

#[test]
fn two_devices_share_one_address_and_port() {
    let (a, b) = (
        dev_with("127.0.71.1", |c| c.port = 4791),
        dev_with("127.0.71.1", |c| c.port = 4791),
    );
    assert_eq!(a.local_addr(), b.local_addr());
    let (qa, cqa, qb, _cqb) = rc_pair(&a, &b, 64);
    // Each device numbers its QPs in its own slot: the kernel steers by QPN >> 16.
    assert_ne!(qa.qpn().value() >> 16, qb.qpn().value() >> 16);
    assert_ne!(qa.qpn().value() >> 16, 0);
    let src = qa.pd().reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, &[0x5a; 1 << 16]).unwrap();
    let dst = qb
        .pd()
        .reg_mr(
            1 << 16,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let r = dst.remote().unwrap();
    let op = SendOp::Write {
        remote_addr: r.addr,
        rkey: RKey(r.rkey),
    };
    qa.post_send(SendWr::new(1, op, SgeList::one(src.sge(0, 1 << 16))))
        .unwrap();
    assert_eq!(poll(&cqa).status, WcStatus::Success);
    let mut got = vec![0u8; 1 << 16];
    dst.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x5a));
}

#[test]
fn cq_overrun_raises_cq_err_and_moves_the_qp_to_err() {
    let (a, b) = (
        dev_with("127.0.72.1", |c| c.port = 0),
        dev_with("127.0.72.2", |c| c.port = 0),
    );
    let seen = events(&a);
    let (qa, cqa, _qb, _cqb) = rc_pair(&a, &b, 2);
    let mr = qa.pd().reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // Receives complete into a 2-entry CQ nobody polls: the flush of 4 overruns it.
    for i in 0..4 {
        qa.post_recv(RecvWr {
            wr_id: i,
            sges: SgeList::one(mr.sge(0, 64)),
        })
        .unwrap();
    }
    // Moving to ERR flushes the 4 receives into the 2-entry CQ.
    let attr = srdma::QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    qa.modify(&attr, srdma::AttrMask::STATE).unwrap();
    wait_for("CQ_ERR", || {
        seen.lock()
            .unwrap()
            .contains(&AsyncEvent::CqError { cq: cqa.id() })
    });
    assert!(cqa.overflowed());
    assert_eq!(qa.state(), QpState::Err);
    // Only what fitted is there.
    assert_eq!(cqa.poll(16).len(), 2);
}

#[test]
fn a_transport_error_raises_qp_fatal() {
    let (a, b) = (
        dev_with("127.0.73.1", |c| c.port = 0),
        dev_with("127.0.73.2", |c| c.port = 0),
    );
    let seen = events(&a);
    let (qa, cqa, _qb, _cqb) = rc_pair(&a, &b, 16);
    let mr = qa.pd().reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // A WRITE with a wrong R_Key: the responder NAKs, the requester's QP goes to ERR.
    let op = SendOp::Write {
        remote_addr: 0x1000,
        rkey: RKey(0xdead_beef),
    };
    qa.post_send(SendWr::new(9, op, SgeList::one(mr.sge(0, 8))))
        .unwrap();
    assert_eq!(poll(&cqa).status, WcStatus::RemAccessErr);
    wait_for("QP_FATAL", || {
        seen.lock()
            .unwrap()
            .contains(&AsyncEvent::QpFatal { qpn: qa.qpn() })
    });
}

#[test]
fn device_failure_flushes_every_qp_and_later_calls_fail() {
    let (a, b) = (
        dev_with("127.0.74.1", |c| c.port = 0),
        dev_with("127.0.74.2", |c| c.port = 0),
    );
    let seen = events(&a);
    let (qa, cqa, _qb, _cqb) = rc_pair(&a, &b, 16);
    let mr = qa.pd().reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    qa.post_recv(RecvWr {
        wr_id: 42,
        sges: SgeList::one(mr.sge(0, 64)),
    })
    .unwrap();
    a.inject_failure();
    wait_for("DEVICE_FATAL", || {
        seen.lock().unwrap().contains(&AsyncEvent::DeviceFatal)
    });
    assert!(a.is_failed());
    let wc = poll(&cqa);
    assert_eq!((wc.wr_id, wc.status), (42, WcStatus::WrFlushErr));
    assert_eq!(qa.state(), QpState::Err);
    let op = SendOp::Send;
    let err = qa
        .post_send(SendWr::new(1, op, SgeList::one(mr.sge(0, 8))))
        .unwrap_err();
    assert!(matches!(err, Error::DeviceFailed), "{err}");
    assert!(matches!(a.create_cq(4, None), Err(Error::DeviceFailed)));
}
