//! IB CM over QP1 between two srdma devices (each with its UDP port to itself): connect,
//! accept, data, disconnect; a reject; a REQ for a port nobody listens on times out.

use std::time::Duration;

use srdma::cm::{CmError, CmEvent, ConnectOptions};
use srdma::ibcm::{self, Gsi, IbListener};
use srdma::{
    AccessFlags, Device, DeviceConfig, QpInit, QpType, RKey, SendOp, SendWr, SgeList, WcStatus,
};

mod common;

/// A device on `ip` with its UDP port to itself, and its GSI.
fn dev(ip: &str) -> (Device, Gsi) {
    let d = common::dev_with(ip, |c| c.share_port = false);
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
    let listener = IbListener::bind(&gb, 7174).unwrap();
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
    let listener = IbListener::bind(&gb, 7000).unwrap();
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

/// A REQ for a port nobody listens on is rejected at once with reason 8 (invalid service
/// ID), as a kernel CM does: by the device itself, or by the port keeper on a shared port.
/// With no device at all on the address, the REQ goes unanswered: a timeout.
#[test]
fn nobody_listening_is_rejected() {
    for (k, share) in [(1u8, false), (2, true)] {
        let open = |ip: String| {
            let mut c = DeviceConfig::new(ip.parse().unwrap());
            c.share_port = share;
            let d = Device::open(c).unwrap();
            let g = Gsi::open(&d).unwrap();
            (d, g)
        };
        let (a, ga) = open(format!("127.0.78.{k}"));
        let (_b, _gb) = open(format!("127.0.78.{}", k + 10));
        let pa = a.alloc_pd();
        let cq = a.create_cq(16, None).unwrap();
        let start = std::time::Instant::now();
        let err = ibcm::connect(
            &ga,
            &pa,
            format!("127.0.78.{}:7174", k + 10).parse().unwrap(),
            &QpInit::new(QpType::Rc, &cq, &cq),
            &opts(),
        )
        .unwrap_err();
        assert!(
            matches!(err, CmError::Rejected { reason: 8, .. }),
            "share {share}: {err}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }
    let (a, ga) = dev("127.0.78.30");
    let pa = a.alloc_pd();
    let cq = a.create_cq(16, None).unwrap();
    let mut o = opts();
    o.timeout = Duration::from_millis(1200);
    let err = ibcm::connect(
        &ga,
        &pa,
        "127.0.78.31:7174".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &o,
    )
    .unwrap_err();
    assert!(matches!(err, CmError::Timeout), "{err}");
}

#[test]
fn ib_cm_through_the_port_keeper() {
    let open = || {
        let mut c = DeviceConfig::new("127.0.85.1".parse().unwrap());
        c.share_port = true;
        let d = Device::open(c).unwrap();
        let g = Gsi::open(&d).unwrap();
        (d, g)
    };
    let ((a, ga), (b, gb)) = (open(), open());
    assert!(a.shares_port() && b.shares_port());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let listener = IbListener::bind(&gb, 7500).unwrap();
    let server = std::thread::spawn(move || {
        let req = listener.accept_request(Duration::from_secs(10)).unwrap();
        let cq = b.create_cq(16, None).unwrap();
        let conn = req
            .accept(&pb, &QpInit::new(QpType::Rc, &cq, &cq), &opts())
            .unwrap();
        let ev = conn.poll_event(Some(Duration::ZERO));
        assert!(matches!(ev, Some(CmEvent::Established)), "{ev:?}");
        let ev = conn.poll_event(Some(Duration::from_secs(10)));
        assert!(matches!(ev, Some(CmEvent::Disconnected)), "{ev:?}");
    });
    let cq = a.create_cq(16, None).unwrap();
    let conn = ibcm::connect(
        &ga,
        &pa,
        "127.0.85.1:7500".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &opts(),
    )
    .unwrap();
    assert_ne!(
        conn.qp().qpn().value() >> 16,
        conn.remote().qpn.value() >> 16
    );
    conn.disconnect().unwrap();
    server.join().unwrap();
}

/// Hostile traffic on QP1: truncated MADs, MADs of other classes and versions, LAP and APR
/// (dropped, as kernel ib_cm drops them on RoCE), a flood of REQs for another service, a
/// stray DREQ: nothing crashes, the backlog stays bounded, the flood does not hide the real
/// request, the stray DREQ disconnects nothing. (It also caught signaled MAD sends
/// overrunning the GSI CQ in a burst, which killed QP1.)
#[test]
fn hostile_mads_are_ignored_and_bounded() {
    use srdma_wire::cm::{self as wire, CmMsg, MadHdr};
    let (a, ga) = dev("127.0.83.1");
    let (b, gb) = dev("127.0.83.2");
    let to_b = b.local_gid();
    // Truncated, wrong class, wrong class version, unknown attribute.
    ga.send_raw(to_b, &[1, 7, 2, 3, 0, 0]).unwrap();
    let mut mad = [0u8; wire::MAD_LEN];
    MadHdr::cm(wire::attr::REQ, 1).emit(&mut mad);
    let mut m = mad;
    m[1] = 0x81;
    ga.send_raw(to_b, &m).unwrap();
    let mut m = mad;
    m[2] = 9;
    ga.send_raw(to_b, &m).unwrap();
    let mut m = mad;
    m[17] = 0x99;
    ga.send_raw(to_b, &m).unwrap();
    // LAP and APR (alternate paths): kernel ib_cm drops them on RoCE ports, and so do we.
    for attr in [0x0019u16, 0x001A] {
        let mut m = [0u8; wire::MAD_LEN];
        MadHdr::cm(attr, 2).emit(&mut m);
        ga.send_raw(to_b, &m).unwrap();
    }
    // A flood of REQs for a service nobody listens on.
    for i in 0..600u32 {
        let mut req = [0u8; wire::MAD_LEN];
        MadHdr::cm(wire::attr::REQ, u64::from(i)).emit(&mut req);
        req[24..28].copy_from_slice(&i.to_be_bytes());
        req[24 + 8..24 + 16].copy_from_slice(&wire::service_id(0x0106, 9).to_be_bytes());
        ga.send_raw(to_b, &req).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(gb.backlog_len() <= ibcm::BACKLOG, "{}", gb.backlog_len());
    let c = gb.counters();
    assert_eq!(c.malformed, 6, "{c:?}");
    // Loopback may drop some of the flood; each one that arrived was answered.
    assert!(c.unknown_service > 0 && c.unknown_service <= 600, "{c:?}");
    assert_eq!(c.mads_received, c.malformed + c.unknown_service, "{c:?}");
    // The real connection still goes through.
    let (conn, sconn, _cqs, _pds) = pair(&(a, ga.clone()), &(b, gb.clone()), "127.0.83.2:7300");
    assert_eq!(conn.remote().qpn, sconn.qp().qpn());
    assert_eq!(sconn.remote().qpn, conn.qp().qpn());
    // A stray CM message of another connection changes nothing.
    let stray = CmMsg::Dreq(wire::Dreq {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: 3,
        private_data: [0; 220],
    });
    ga.send(to_b, &MadHdr::cm(wire::attr::DREQ, 5), &stray)
        .unwrap();
    assert!(matches!(
        sconn.poll_event(Some(Duration::ZERO)),
        Some(CmEvent::Established)
    ));
    assert!(sconn.poll_event(Some(Duration::from_millis(200))).is_none());
    assert_eq!(sconn.qp().state(), srdma::QpState::Rts);
    // ... and is answered with a DREP, as a kernel CM answers a DREQ for no connection.
    assert_eq!(gb.counters().stray_dreqs, 1);
    let drep = ga.recv(
        std::time::Instant::now() + Duration::from_secs(2),
        |i| matches!(&i.msg, CmMsg::Drep(d) if d.remote_comm_id == 1 && d.local_comm_id == 2),
    );
    assert!(drep.is_some(), "no DREP for the stray DREQ");
}

/// A peer that sends a REQ and vanishes before the RTU: the passive side's accept times out
/// (after sending its REP again a few times) and leaves its QP in ERR.
#[test]
fn peer_vanishing_before_the_rtu_times_out() {
    use srdma_wire::cm::{self as wire, CmMsg, CmaHdr, MadHdr};
    let (_a, ga) = dev("127.0.84.1");
    let (b, gb) = dev("127.0.84.2");
    let listener = IbListener::bind(&gb, 7400).unwrap();
    let mut private = [0u8; 92];
    CmaHdr {
        cma_version: 0,
        ip_version: 4,
        src_port: 40000,
        src_addr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 127, 0, 84, 1],
        dst_addr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 127, 0, 84, 2],
    }
    .emit(&mut private);
    let req = wire::Req {
        local_comm_id: 77,
        vendor_id: 0,
        service_id: wire::service_id(wire::port_space::TCP, 7400),
        local_ca_guid: 1,
        local_qkey: 0,
        local_qpn: 0x123,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: false,
        starting_psn: 5,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_local_lid: 0xffff,
        primary_remote_lid: 0xffff,
        primary_local_gid: _a.local_gid().0,
        primary_remote_gid: b.local_gid().0,
        primary_flow_label: 0,
        primary_packet_rate: 0,
        primary_traffic_class: 0,
        primary_hop_limit: 64,
        primary_sl: 0,
        primary_subnet_local: false,
        primary_local_ack_timeout: 19,
        alternate_path: [0; 44],
        private_data: private,
    };
    ga.send(
        b.local_gid(),
        &MadHdr::cm(wire::attr::REQ, 9),
        &CmMsg::Req(req),
    )
    .unwrap();
    let r = listener.accept_request(Duration::from_secs(10)).unwrap();
    let pb = b.alloc_pd();
    let cq = b.create_cq(16, None).unwrap();
    let qp = pb.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mut o = opts();
    o.timeout = Duration::from_millis(1500);
    let start = std::time::Instant::now();
    let err = r.accept_with(&qp, &o).unwrap_err();
    assert!(matches!(err, CmError::Timeout), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(qp.state(), srdma::QpState::Err);
    // It sent its REP more than once while waiting (they wait, unasked for, at A).
    assert!(ga.backlog_len() >= 2, "{}", ga.backlog_len());
}

/// An MRA for a REQ (kernel ib_cm sends one for each REQ that arrives again while its
/// application has not accepted yet) stops the REQ's resends for the time it names: the
/// passive side, slow to decide, sees the REQ once while it waits 2.5 s (five resend periods),
/// then rejects, and the active side gets the REJ rather than a timeout.
#[test]
fn an_mra_stops_the_resends_of_a_req() {
    use srdma_wire::cm::{self as wire, CmMsg, MadHdr};
    let (a, ga) = dev("127.0.161.1");
    let (_b, gb) = dev("127.0.161.2");
    let listener = IbListener::bind(&gb, 7600).unwrap();
    let to_a = a.local_gid();
    let server = std::thread::spawn(move || {
        let first = listener.accept_request(Duration::from_secs(10)).unwrap();
        let comm = first.req().local_comm_id;
        // 4.096 µs × 2^20: 4.3 s.
        let mra = CmMsg::Mra(wire::Mra {
            local_comm_id: 0x77,
            remote_comm_id: comm,
            message_mraed: 0,
            service_timeout: 20,
            private_data: [0; 222],
        });
        gb.send(to_a, &MadHdr::cm(wire::attr::MRA, 9), &mra)
            .unwrap();
        let start = std::time::Instant::now();
        let mut again = 0;
        while start.elapsed() < Duration::from_millis(2500) {
            if let Ok(r) = listener.accept_request(Duration::from_millis(100))
                && r.req().local_comm_id == comm
            {
                again += 1;
            }
        }
        first.reject(srdma::cm::reason::UNSUPPORTED, &[]).unwrap();
        (again, gb.counters().duplicate_reqs)
    });
    let pa = a.alloc_pd();
    let cq = a.create_cq(16, None).unwrap();
    let r = ibcm::connect(
        &ga,
        &pa,
        "127.0.161.2:7600".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &ConnectOptions {
            timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
    );
    let (again, dups) = server.join().unwrap();
    assert!(
        matches!(r, Err(CmError::Rejected { .. })),
        "{:?}",
        r.map(|_| ())
    );
    assert_eq!(again, 0, "a resent REQ became a second request");
    assert_eq!(dups, 0, "the REQ was sent again during the MRA's wait");
}

/// A listener slow to accept (1.5 s, three resend periods of the REQ) sees its request once:
/// the REQ sent again is no new request, it gets an MRA (as kernel rdma_cm answers it), the
/// active side stops sending and waits, and the accept connects.
#[test]
fn a_resent_req_is_one_request_and_gets_an_mra_while_the_application_decides() {
    let (a, ga) = dev("127.0.162.1");
    let (b, gb) = dev("127.0.162.2");
    let listener = IbListener::bind(&gb, 7700).unwrap();
    let server = std::thread::spawn(move || {
        let first = listener.accept_request(Duration::from_secs(10)).unwrap();
        let again = listener.accept_request(Duration::from_millis(1500));
        let pb = b.alloc_pd();
        let cq = b.create_cq(16, None).unwrap();
        let conn = first
            .accept(&pb, &QpInit::new(QpType::Rc, &cq, &cq), &opts())
            .map(|_| ());
        (again.is_ok(), conn, gb.counters().duplicate_reqs)
    });
    let pa = a.alloc_pd();
    let cq = a.create_cq(16, None).unwrap();
    let r = ibcm::connect(
        &ga,
        &pa,
        "127.0.162.2:7700".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &ConnectOptions {
            timeout: Duration::from_secs(5),
            ..ConnectOptions::default()
        },
    );
    let (again, accepted, dups) = server.join().unwrap();
    assert!(r.is_ok(), "{:?}", r.map(|_| ()));
    assert!(accepted.is_ok(), "{accepted:?}");
    assert!(!again, "a resent REQ became a second request");
    // One resend at 500 ms, answered by the MRA; none after it (loopback may lose one).
    assert!((1..=2).contains(&dups), "{dups} duplicate REQs");
}

/// A request dropped unanswered is rejected (as kernel ib_cm rejects the REQ of a destroyed
/// id): the active side gets the REJ at once, not a timeout.
#[test]
fn a_request_dropped_unanswered_is_rejected() {
    let (a, ga) = dev("127.0.163.1");
    let (_b, gb) = dev("127.0.163.2");
    let listener = IbListener::bind(&gb, 7800).unwrap();
    let server = std::thread::spawn(move || {
        drop(listener.accept_request(Duration::from_secs(10)).unwrap());
    });
    let pa = a.alloc_pd();
    let cq = a.create_cq(16, None).unwrap();
    let r = ibcm::connect(
        &ga,
        &pa,
        "127.0.163.2:7800".parse().unwrap(),
        &QpInit::new(QpType::Rc, &cq, &cq),
        &ConnectOptions {
            timeout: Duration::from_secs(5),
            ..ConnectOptions::default()
        },
    );
    server.join().unwrap();
    assert!(
        matches!(r, Err(CmError::Rejected { reason: 28, .. })),
        "{:?}",
        r.map(|_| ())
    );
}

/// A SIDR_REQ sent again while the application decides is one request (QP1 drops the
/// resends, as kernel ib_cm drops a SIDR_REQ it already holds), and the answer reaches the
/// requester.
#[test]
fn a_resent_sidr_req_is_one_request() {
    let (_a, ga) = dev("127.0.164.1");
    let (_b, gb) = dev("127.0.164.2");
    let listener = IbListener::bind_ps(&gb, srdma_wire::cm::port_space::UDP, 7900).unwrap();
    let server = std::thread::spawn(move || {
        let first = listener.accept_sidr(Duration::from_secs(10)).unwrap();
        // The requester resends every 500 ms meanwhile.
        let again = listener.accept_sidr(Duration::from_millis(1500));
        first
            .accept(srdma_wire::Qpn::new(0x1234), 0x1111_2222, b"hi")
            .unwrap();
        (again.is_ok(), gb.counters().duplicate_reqs)
    });
    let r = ibcm::sidr_resolve(
        &ga,
        "127.0.164.2:7900".parse().unwrap(),
        5000,
        &ConnectOptions {
            timeout: Duration::from_secs(5),
            ..ConnectOptions::default()
        },
    );
    let (again, dups) = server.join().unwrap();
    let rep = r.unwrap();
    assert_eq!((rep.qpn.value(), rep.qkey), (0x1234, 0x1111_2222));
    assert_eq!(&rep.private_data[..2], b"hi");
    assert!(!again, "a resent SIDR_REQ became a second request");
    assert!(dups >= 1, "{dups} duplicate SIDR_REQs");
}

/// A SIDR request dropped unanswered is rejected, as kernel ib_cm rejects the SIDR_REQ of an
/// id destroyed before it replied: the requester learns at once, not by its timeout.
#[test]
fn a_sidr_request_dropped_unanswered_is_rejected() {
    let (_a, ga) = dev("127.0.165.1");
    let (_b, gb) = dev("127.0.165.2");
    let listener = IbListener::bind_ps(&gb, srdma_wire::cm::port_space::UDP, 7901).unwrap();
    let server = std::thread::spawn(move || {
        drop(listener.accept_sidr(Duration::from_secs(10)).unwrap());
    });
    let r = ibcm::sidr_resolve(
        &ga,
        "127.0.165.2:7901".parse().unwrap(),
        5001,
        &ConnectOptions {
            timeout: Duration::from_secs(5),
            ..ConnectOptions::default()
        },
    );
    server.join().unwrap();
    assert!(
        matches!(r, Err(CmError::Rejected { reason: 2, .. })),
        "{r:?}"
    );
}

/// A SIDR_REQ that finds nobody listening yet (SIDR_REP "unsupported") is asked again for
/// `unlisted_retry`, as a REQ is: perftest -R's UD test connects as soon as its control
/// connection is up, and its server may not listen on the UDP port yet (seen against rxe in
/// the lab). Without it, the refusal is reported at once.
#[test]
fn a_sidr_req_before_the_listener_is_asked_again() {
    let (_a, ga) = dev("127.0.166.1");
    let (_b, gb) = dev("127.0.166.2");
    let server = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let listener = IbListener::bind_ps(&gb, srdma_wire::cm::port_space::UDP, 7902).unwrap();
        let req = listener.accept_sidr(Duration::from_secs(10)).unwrap();
        req.accept(srdma_wire::Qpn::new(0x4321), 7, &[]).unwrap();
    });
    let at_once = ibcm::sidr_resolve(
        &ga,
        "127.0.166.2:7902".parse().unwrap(),
        5002,
        &ConnectOptions::default(),
    );
    assert!(
        matches!(at_once, Err(CmError::Rejected { reason: 1, .. })),
        "{at_once:?}"
    );
    let r = ibcm::sidr_resolve(
        &ga,
        "127.0.166.2:7902".parse().unwrap(),
        5003,
        &ConnectOptions {
            unlisted_retry: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
    );
    server.join().unwrap();
    assert_eq!(r.unwrap().qpn.value(), 0x4321);
}

/// A connection from `a` to `b` (listening at `dst`): (active side, passive side), with the
/// PDs and CQs they need kept alive.
#[allow(clippy::type_complexity)]
fn pair(
    a: &(Device, Gsi),
    b: &(Device, Gsi),
    dst: &str,
) -> (
    ibcm::IbConnection,
    ibcm::IbConnection,
    Vec<srdma::Cq>,
    Vec<srdma::Pd>,
) {
    let (pa, pb) = (a.0.alloc_pd(), b.0.alloc_pd());
    let dst: std::net::SocketAddr = dst.parse().unwrap();
    let listener = IbListener::bind(&b.1, dst.port()).unwrap();
    let (bd, bpd) = (b.0.clone(), pb.clone());
    let server = std::thread::spawn(move || {
        let req = listener.accept_request(Duration::from_secs(10)).unwrap();
        let cq = bd.create_cq(16, None).unwrap();
        let conn = req
            .accept(&bpd, &QpInit::new(QpType::Rc, &cq, &cq), &opts())
            .unwrap();
        (conn, cq)
    });
    let cq = a.0.create_cq(16, None).unwrap();
    let conn = ibcm::connect(&a.1, &pa, dst, &QpInit::new(QpType::Rc, &cq, &cq), &opts()).unwrap();
    let (sconn, scq) = server.join().unwrap();
    (conn, sconn, vec![cq, scq], vec![pa, pb])
}

/// Watched connections (`IbConnection::watch`: the GSI thread handles their DREQ and DREP,
/// no thread waits per connection): a disconnect ends both sides through their callbacks,
/// a DREQ that came before the watch is handled by it, and a DREQ nobody answers is sent
/// again and ends the connection after its last send (~2 s), its callback called once,
/// though its owner dropped it right after `start_disconnect`.
#[test]
fn watched_connections_end_through_the_gsi_thread() {
    use std::sync::Arc;
    use std::sync::mpsc::channel;
    use std::time::Instant;
    let a = dev("127.0.81.1");
    let b = dev("127.0.81.2");
    let (tx, rx) = channel::<&'static str>();
    let watch = |c: &Arc<ibcm::IbConnection>, name: &'static str| {
        let tx = tx.clone();
        c.watch(move || {
            let _ = tx.send(name);
        });
    };

    // The active side disconnects; the passive side watches only after the DREQ came.
    let (c, s, _cqs, _pds) = pair(&a, &b, "127.0.81.2:7181");
    let (c, s) = (Arc::new(c), Arc::new(s));
    watch(&c, "active");
    let t = Instant::now();
    c.start_disconnect().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!s.is_disconnected(), "nobody took the DREQ yet");
    watch(&s, "passive");
    let mut ended = vec![
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
    ];
    ended.sort();
    assert_eq!(ended, ["active", "passive"]);
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert!(c.is_disconnected() && s.is_disconnected());
    // Each callback once, and poll_event has nothing for a watched connection.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(c.poll_event(Some(Duration::ZERO)).is_none());

    // The passive side never answers (its connection is leaked, unwatched, so its DREQ
    // waits in the backlog): the active side's DREQ is sent again and the connection ends.
    let (c, s, _cqs2, _pds2) = pair(&a, &b, "127.0.81.2:7182");
    std::mem::forget(s);
    let c = Arc::new(c);
    watch(&c, "unanswered");
    let t = Instant::now();
    c.start_disconnect().unwrap();
    // Its owner lets go at once (as `rdma_destroy_id` does): the drop does not wait for the
    // DREP, and the GSI thread keeps the connection and its resends until the end.
    let weak = Arc::downgrade(&c);
    drop(c);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert!(
        weak.upgrade().is_some(),
        "nothing holds the disconnecting connection"
    );
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        "unanswered"
    );
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    // The GSI thread let go of it after its last send.
    assert!(weak.upgrade().is_none());
}

/// A REP sent again to an established (watched) connection — its RTU was lost, and the
/// passive side would otherwise fail its accept — is answered with the RTU again, as ib_cm
/// answers a duplicate REP; the connection stays up.
#[test]
fn a_resent_rep_gets_the_rtu_again() {
    use srdma_wire::cm::{self as wire, CmMsg, MadHdr};
    use std::sync::Arc;
    let a = dev("127.0.82.1");
    let b = dev("127.0.82.2");
    let (c, s, _cqs, _pds) = pair(&a, &b, "127.0.82.2:7182");
    let c = Arc::new(c);
    c.watch(|| {});
    let (mine, theirs) = c.comm_ids();
    assert_eq!(s.comm_ids(), (theirs, mine));
    let rep = CmMsg::Rep(wire::Rep {
        local_comm_id: theirs,
        vendor_id: 0,
        remote_comm_id: mine,
        local_qkey: 0,
        local_qpn: s.qp().qpn().value(),
        local_eecn: 0,
        starting_psn: 0,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0,
        private_data: [0; 196],
    });
    b.1.send(a.0.local_gid(), &MadHdr::cm(wire::attr::REP, 77), &rep)
        .unwrap();
    let rtu = b.1.recv(
        std::time::Instant::now() + Duration::from_secs(2),
        |i| matches!(&i.msg, CmMsg::Rtu(r) if r.local_comm_id == mine && r.remote_comm_id == theirs),
    );
    assert!(
        rtu.is_some_and(|i| i.hdr.tid == 77),
        "no RTU for the resent REP"
    );
    assert_eq!(a.1.counters().duplicate_reps, 1);
    assert!(!c.is_disconnected());
    assert_eq!(c.qp().state(), srdma::QpState::Rts);
}
