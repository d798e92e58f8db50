//! IB CM over QP1 between two srdma devices (each with its UDP port to itself): connect,
//! accept, data, disconnect; a reject; a REQ for a port nobody listens on times out.

use std::time::Duration;

use srdma::cm::{CmError, CmEvent, ConnectOptions};
use srdma::ibcm::{self, Gsi, IbListener};
use srdma::{
    AccessFlags, Device, DeviceConfig, QpInit, QpType, RKey, SendOp, SendWr, SgeList, WcStatus,
};

fn dev(ip: &str) -> (Device, Gsi) {
    let mut c = DeviceConfig::new(ip.parse().unwrap());
    c.share_port = false;
    let d = Device::open(c).unwrap();
    let g = Gsi::open(&d).unwrap();
    (d, g)
}

fn opts() -> ConnectOptions {
    ConnectOptions {
        timeout: Duration::from_secs(10),
        ..ConnectOptions::default()
    }
}

#[test]
fn connect_write_disconnect() {
    let (a, ga) = dev("127.0.76.1");
    let (b, gb) = dev("127.0.76.2");
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let listener = IbListener::bind(&gb, 7174);
    let server = std::thread::spawn(move || {
        let req = listener.accept_request(Duration::from_secs(10)).unwrap();
        assert_eq!(&req.private_data()[..5], b"hello");
        let cq = b.create_cq(16, None).unwrap();
        let conn = req
            .accept(&pb, &QpInit::new(QpType::Rc, &cq, &cq), &opts())
            .unwrap();
        let dst = pb
            .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        (conn, dst, cq, pb)
    });
    let cq = a.create_cq(16, None).unwrap();
    let mut o = opts();
    o.private_data = b"hello".to_vec();
    let conn = ibcm::connect(
        &ga,
        &pa,
        "127.0.76.2:7174".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &o,
    )
    .unwrap();
    let (sconn, dst, _scq, _spd) = server.join().unwrap();
    assert!(matches!(
        conn.poll_event(Some(Duration::ZERO)),
        Some(CmEvent::Established)
    ));
    assert!(matches!(
        sconn.poll_event(Some(Duration::ZERO)),
        Some(CmEvent::Established)
    ));
    let src = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, b"over IB CM").unwrap();
    let r = dst.remote().unwrap();
    let op = SendOp::Write {
        remote_addr: r.addr,
        rkey: RKey(r.rkey),
    };
    conn.qp()
        .post_send(SendWr::new(1, op, SgeList::one(src.sge(0, 10))))
        .unwrap();
    let wc = loop {
        if let Some(wc) = cq.poll_one() {
            break wc;
        }
    };
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = [0u8; 10];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over IB CM");
    let t = std::thread::spawn(move || {
        let ev = sconn.poll_event(Some(Duration::from_secs(10)));
        assert!(matches!(ev, Some(CmEvent::Disconnected)), "{ev:?}");
    });
    conn.disconnect().unwrap();
    assert!(matches!(
        conn.poll_event(Some(Duration::ZERO)),
        Some(CmEvent::Disconnected)
    ));
    t.join().unwrap();
}

#[test]
fn reject_reaches_the_active_side() {
    let (a, ga) = dev("127.0.77.1");
    let (_b, gb) = dev("127.0.77.2");
    let pa = a.alloc_pd();
    let listener = IbListener::bind(&gb, 7000);
    let server = std::thread::spawn(move || {
        let req = listener.accept_request(Duration::from_secs(10)).unwrap();
        req.reject(28, b"no thanks").unwrap();
    });
    let cq = a.create_cq(16, None).unwrap();
    let err = ibcm::connect(
        &ga,
        &pa,
        "127.0.77.2:7000".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &opts(),
    )
    .unwrap_err();
    server.join().unwrap();
    match err {
        CmError::Rejected {
            reason,
            private_data,
        } => {
            assert_eq!(reason, 28);
            assert_eq!(&private_data[..9], b"no thanks");
        }
        e => panic!("{e}"),
    }
}

#[test]
fn nobody_listening_times_out() {
    let (a, ga) = dev("127.0.78.1");
    let (_b, _gb) = dev("127.0.78.2");
    let pa = a.alloc_pd();
    let cq = a.create_cq(16, None).unwrap();
    let mut o = opts();
    o.timeout = Duration::from_millis(1200);
    let err = ibcm::connect(
        &ga,
        &pa,
        "127.0.78.2:7174".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &o,
    )
    .unwrap_err();
    assert!(matches!(err, CmError::Timeout), "{err}");
}

#[test]
fn gsi_needs_the_port_alone() {
    let mut c = DeviceConfig::new("127.0.79.1".parse().unwrap());
    c.share_port = true;
    let d = Device::open(c).unwrap();
    let e = Gsi::open(&d).unwrap_err();
    assert!(e.to_string().contains("SRDMA_SHARE_PORT=0"), "{e}");
}
