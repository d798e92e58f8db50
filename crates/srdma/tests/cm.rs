//! The TCP connection manager (`srdma::cm`) end to end: two devices in one process, on
//! different loopback addresses and UDP ports, as two hosts would be.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use srdma::cm::{self, CmError, CmEvent, ConnectOptions, Listener, MAX_PRIVATE_DATA, reason};
use srdma::{
    AccessFlags, ConnectParams, Cq, Device, DeviceConfig, Gid, Mtu, Pd, QpInit, QpState, QpType,
    RKey, RecvWr, RemoteMr, RemoteQp, SendOp, SendWr, SgeList, Wc, WcOpcode, WcStatus,
};
use srdma_wire::{Psn, Qpn};

const LONG: Option<Duration> = Some(Duration::from_secs(10));

struct Host {
    dev: Device,
    pd: Pd,
    cq: Cq,
}

fn host_mtu(ip: &str, mtu: Mtu) -> Host {
    let mut c = DeviceConfig::new(ip.parse().unwrap());
    c.port = 0;
    c.mtu = mtu;
    c.pcap = None;
    let dev = Device::open(c).unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256, None).unwrap();
    Host { dev, pd, cq }
}

/// A server on 127.0.0.3 and a client on 127.0.0.2.
fn hosts() -> (Host, Host) {
    (
        host_mtu("127.0.0.3", Mtu::Mtu1024),
        host_mtu("127.0.0.2", Mtu::Mtu1024),
    )
}

impl Host {
    fn init(&self, t: QpType) -> QpInit {
        QpInit::new(t, &self.cq, &self.cq)
    }

    fn listen(&self) -> Listener {
        let ip = self.dev.local_addr().ip();
        Listener::bind(&self.dev, &self.pd, SocketAddr::new(ip, 0)).unwrap()
    }

    fn connect(
        &self,
        server: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<cm::Connection, CmError> {
        cm::connect(&self.dev, &self.pd, server, &self.init(QpType::Rc), opts)
    }

    fn wait_wc(&self) -> Wc {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = self.cq.poll_one() {
                return wc;
            }
            assert!(Instant::now() < end, "no completion within 10 s");
            thread::sleep(Duration::from_micros(200));
        }
    }
}

fn opts(private_data: &[u8]) -> ConnectOptions {
    ConnectOptions {
        private_data: private_data.to_vec(),
        ..ConnectOptions::default()
    }
}

/// rping's buffer descriptor: address (be64), rkey (be32), length (be32).
fn encode_mr(r: RemoteMr) -> Vec<u8> {
    let mut v = r.addr.to_be_bytes().to_vec();
    v.extend(r.rkey.to_be_bytes());
    v.extend((r.len as u32).to_be_bytes());
    v
}

fn decode_mr(b: &[u8]) -> RemoteMr {
    assert_eq!(b.len(), 16, "descriptor is 16 bytes");
    RemoteMr {
        addr: u64::from_be_bytes(b[..8].try_into().unwrap()),
        rkey: u32::from_be_bytes(b[8..12].try_into().unwrap()),
        len: u32::from_be_bytes(b[12..16].try_into().unwrap()).into(),
    }
}

fn rejected(r: Result<cm::Connection, CmError>) -> (u16, Vec<u8>) {
    match r {
        Err(CmError::Rejected {
            reason,
            private_data,
        }) => (reason, private_data),
        other => panic!("expected a REJ, got {other:?}"),
    }
}

#[test]
fn connect_accept_then_rdma_write_and_send() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let (tx, rx) = mpsc::channel();
    let client_gid = cli.dev.local_gid();
    let client_port = cli.dev.local_addr().port();
    let server = thread::spawn(move || {
        let target = srv
            .pd
            .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let inbox = srv.pd.reg_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
        // An existing QP with a receive already posted, so the client may SEND at once.
        let qp = srv.pd.create_qp(&srv.init(QpType::Rc)).unwrap();
        qp.post_recv(RecvWr {
            wr_id: 7,
            sges: SgeList::one(inbox.sge(0, 256)),
        })
        .unwrap();
        let req = listener.accept_request(LONG).unwrap();
        assert_eq!(req.private_data(), b"client hello");
        assert_eq!(req.qp_type(), QpType::Rc);
        assert_eq!(req.mtu(), Mtu::Mtu1024);
        assert_eq!(req.remote().gid, client_gid);
        assert_eq!(req.remote().port, client_port);
        let peer = req.remote();
        let conn = req
            .accept(&qp, &encode_mr(target.remote().unwrap()))
            .unwrap();
        assert_eq!(conn.qp().state(), QpState::Rts);
        assert_eq!(conn.qp().qpn(), qp.qpn());
        assert_eq!(conn.remote(), peer);
        let attr = conn.qp().query();
        assert_eq!(attr.dest_qp_num, peer.qpn);
        assert_eq!(
            attr.rq_psn, peer.psn,
            "our receive PSN is the peer's first send PSN"
        );
        tx.send((qp.qpn(), attr.sq_psn)).unwrap();

        let wc = srv.wait_wc();
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
        assert_eq!(wc.opcode, WcOpcode::Recv);
        let mut msg = vec![0u8; wc.byte_len as usize];
        inbox.read(0, &mut msg).unwrap();
        assert_eq!(msg, b"ping over SEND");
        // The WRITE was posted before the SEND: it has landed.
        let mut written = [0u8; 21];
        target.read(100, &mut written).unwrap();
        assert_eq!(&written, b"written by RDMA WRITE");
        conn
    });

    let conn = cli.connect(addr, &opts(b"client hello")).unwrap();
    let (server_qpn, server_psn) = rx.recv().unwrap();
    assert_eq!(conn.qp().state(), QpState::Rts);
    assert_eq!(conn.remote().qpn, server_qpn);
    assert_eq!(conn.remote().psn, server_psn);
    assert_eq!(
        conn.remote().gid,
        Gid::from_ip("127.0.0.3".parse().unwrap())
    );
    assert_eq!(conn.mtu(), Mtu::Mtu1024);
    assert_eq!(conn.qp().query().path_mtu, Mtu::Mtu1024);
    let remote = decode_mr(conn.remote_private_data());
    assert_eq!(remote.len, 4096);

    let src = cli.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, b"written by RDMA WRITE").unwrap();
    src.write(64, b"ping over SEND").unwrap();
    let write = SendOp::Write {
        remote_addr: remote.addr + 100,
        rkey: RKey(remote.rkey),
    };
    conn.qp()
        .post_send(SendWr::new(1, write, SgeList::one(src.sge(0, 21))))
        .unwrap();
    let wc = cli.wait_wc();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    conn.qp()
        .post_send(SendWr::new(2, SendOp::Send, SgeList::one(src.sge(64, 14))))
        .unwrap();
    let wc = cli.wait_wc();
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    let server_conn = server.join().unwrap();
    assert!(matches!(conn.poll_event(None), Some(CmEvent::Established)));
    assert!(matches!(
        server_conn.poll_event(None),
        Some(CmEvent::Established)
    ));
}

#[test]
fn reject_carries_reason_and_private_data_to_the_client() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let server = thread::spawn(move || {
        let req = listener.accept_request(LONG).unwrap();
        assert_eq!(req.private_data(), b"may I?");
        req.reject(reason::CONSUMER_DEFINED, b"server full, try 7471")
            .unwrap();
        // Dropping an unanswered request rejects too.
        drop(listener.accept_request(LONG).unwrap());
    });
    let t = Instant::now();
    let err = cli.connect(addr, &opts(b"may I?")).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2));
    match CmEvent::from(err) {
        CmEvent::Rejected {
            reason,
            private_data,
        } => {
            assert_eq!(reason, 28);
            assert_eq!(private_data, b"server full, try 7471");
        }
        other => panic!("{other:?}"),
    }
    let (reason, data) = rejected(cli.connect(addr, &opts(b"")));
    assert_eq!((reason, data.len()), (reason::CONSUMER_DEFINED, 0));
    server.join().unwrap();
}

#[test]
fn no_listener_is_unreachable_quickly() {
    let cli = host_mtu("127.0.0.2", Mtu::Mtu1024);
    // A port nobody listens on: bind one, then free it.
    let port = TcpListener::bind("127.0.0.4:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let t = Instant::now();
    let err = cli.connect(port, &opts(b"")).unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(&err, CmError::Unreachable(e) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(500), "took {took:?}");
    assert!(matches!(CmEvent::from(err), CmEvent::Unreachable(_)));
}

#[test]
fn a_listener_that_never_answers_times_out() {
    let (srv, cli) = hosts();
    // Bound (the kernel completes TCP handshakes) but nobody takes requests.
    let listener = srv.listen();
    let o = ConnectOptions {
        timeout: Duration::from_millis(300),
        ..opts(b"hello?")
    };
    let t = Instant::now();
    let err = cli.connect(listener.local_addr(), &o).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(err, CmError::Timeout), "{err:?}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(1500),
        "took {took:?}"
    );
    // The request is still queued; answering it late finds the client gone.
    let req = listener.accept_request(LONG).unwrap();
    assert_eq!(req.private_data(), b"hello?");
    let late = req.accept(&srv.init(QpType::Rc), b"");
    assert!(
        matches!(late, Err(CmError::Closed | CmError::Timeout)),
        "{late:?}"
    );
}

#[test]
fn accept_request_honours_its_timeout() {
    let srv = host_mtu("127.0.0.3", Mtu::Mtu1024);
    let listener = srv.listen();
    let t = Instant::now();
    assert!(matches!(
        listener.accept_request(Some(Duration::from_millis(150))),
        Err(CmError::Timeout)
    ));
    assert!(
        listener
            .poll_event(Some(Duration::from_millis(50)))
            .is_none()
    );
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(1));
}

#[test]
fn private_data_over_196_bytes_is_an_error_on_both_sides() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    // Active side: refused before anything is sent.
    let t = Instant::now();
    let err = cli.connect(addr, &opts(&[0xAB; 197])).unwrap_err();
    assert!(matches!(err, CmError::PrivateDataTooLong(197)), "{err:?}");
    assert!(t.elapsed() < Duration::from_millis(100));
    assert!(matches!(
        listener.accept_request(Some(Duration::from_millis(100))),
        Err(CmError::Timeout)
    ));
    // Passive side: accept and reject refuse 197 bytes; the client is rejected.
    let server = thread::spawn(move || {
        let req = listener.accept_request(LONG).unwrap();
        let err = req.accept(&srv.init(QpType::Rc), &[1; 197]).unwrap_err();
        assert!(matches!(err, CmError::PrivateDataTooLong(197)), "{err:?}");
        let req = listener.accept_request(LONG).unwrap();
        let err = req.reject(99, &[2; 197]).unwrap_err();
        assert!(matches!(err, CmError::PrivateDataTooLong(197)), "{err:?}");
    });
    for _ in 0..2 {
        let (reason, _) = rejected(cli.connect(addr, &opts(b"")));
        assert_eq!(reason, reason::CONSUMER_DEFINED);
    }
    server.join().unwrap();
}

#[test]
fn private_data_of_196_bytes_round_trips_both_ways() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let req_data: Vec<u8> = (0..MAX_PRIVATE_DATA).map(|i| i as u8).collect();
    let rep_data: Vec<u8> = req_data.iter().rev().copied().collect();
    let (want, give) = (req_data.clone(), rep_data.clone());
    let server = thread::spawn(move || {
        let req = listener.accept_request(LONG).unwrap();
        assert_eq!(req.private_data(), want);
        let conn = req.accept(&srv.init(QpType::Rc), &give).unwrap();
        assert_eq!(conn.remote_private_data(), want);
        let reject = listener.accept_request(LONG).unwrap();
        reject.reject(0xBEEF, &give).unwrap();
    });
    let conn = cli.connect(addr, &opts(&req_data)).unwrap();
    assert_eq!(conn.remote_private_data(), rep_data);
    let (reason, data) = rejected(cli.connect(addr, &opts(&req_data)));
    assert_eq!((reason, data), (0xBEEF, rep_data));
    server.join().unwrap();
}

/// A REQ built by hand from the module documentation's table.
fn req_bytes(
    qpn: u32,
    psn: u32,
    gid: Gid,
    port: u16,
    mtu: u8,
    transport: u8,
    pd: &[u8],
) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(qpn.to_be_bytes());
    body.extend(psn.to_be_bytes());
    body.extend(gid.0);
    body.extend(port.to_be_bytes());
    body.extend([mtu, transport, 4, 4, pd.len() as u8]);
    body.extend(pd);
    let mut m = vec![b'C', b'M', 1, 0x10];
    m.extend((body.len() as u16).to_be_bytes());
    m.extend(body);
    m
}

/// Reads one whole message (header + body) from a raw stream.
fn read_msg(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = [0u8; 6];
    s.read_exact(&mut h).unwrap();
    let mut body = vec![0u8; u16::from_be_bytes([h[4], h[5]]).into()];
    s.read_exact(&mut body).unwrap();
    let mut m = h.to_vec();
    m.extend(body);
    m
}

#[test]
fn malformed_clients_get_protocol_errors_and_the_listener_keeps_serving() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let gid = cli.dev.local_gid();
    let mut oversize = req_bytes(0x22, 1, gid, 4791, 3, 0, &[0; 196]);
    oversize[6 + 30] = 197; // announces 197 bytes of private data
    // (bytes, expected REJ reason; None: no REJ, the client closed its side first)
    let cases: Vec<(&str, Vec<u8>, Option<u16>)> = vec![
        (
            "HTTP",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            Some(5),
        ),
        ("version 2", b"CM\x02\x10\x00\x1f".to_vec(), Some(31)),
        ("unknown type", b"CM\x01\x99\x00\x00".to_vec(), Some(5)),
        ("length 65535", b"CM\x01\x10\xff\xff".to_vec(), Some(5)),
        ("RTU first", b"CM\x01\x14\x00\x00".to_vec(), Some(5)),
        (
            "MTU code 9",
            req_bytes(0x22, 1, gid, 4791, 9, 0, b""),
            Some(26),
        ),
        (
            "transport UD",
            req_bytes(0x22, 1, gid, 4791, 3, 3, b""),
            Some(9),
        ),
        ("QPN 1", req_bytes(1, 1, gid, 4791, 3, 0, b""), Some(5)),
        ("private data 197", oversize, Some(5)),
    ];
    for (name, bytes, want) in cases {
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(&bytes).unwrap();
        let t = Instant::now();
        let err = listener.accept_request(LONG).unwrap_err();
        assert!(matches!(err, CmError::Protocol(_)), "{name}: {err:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{name}: waited");
        let rej = read_msg(&mut raw);
        assert_eq!(&rej[..4], b"CM\x01\x12", "{name}: answered with a REJ");
        assert_eq!(
            Some(u16::from_be_bytes([rej[6], rej[7]])),
            want,
            "{name}: {err}"
        );
    }
    // A truncated REQ, then the client hangs up; a client that connects and leaves at once.
    let whole = req_bytes(0x22, 1, gid, 4791, 3, 0, b"abc");
    for cut in [0, 3, 6, 20, whole.len() - 1] {
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(&whole[..cut]).unwrap();
        raw.shutdown(Shutdown::Write).unwrap();
        let err = listener.accept_request(LONG).unwrap_err();
        assert!(matches!(err, CmError::Closed), "cut {cut}: {err:?}");
    }
    // The event form of the same.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(b"CM\x01\x10\x00\x00").unwrap();
    let ev = listener.poll_event(LONG);
    assert!(
        matches!(ev, Some(CmEvent::ConnectError(CmError::Protocol(_)))),
        "{ev:?}"
    );
    // Then a good client is served.
    let client = thread::spawn(move || cli.connect(addr, &opts(b"good")).map(|c| c.mtu()));
    let req = listener.accept_request(LONG).unwrap();
    assert_eq!(req.private_data(), b"good");
    let conn = req.accept(&srv.init(QpType::Rc), b"welcome").unwrap();
    assert_eq!(conn.qp().state(), QpState::Rts);
    assert_eq!(client.join().unwrap().unwrap(), Mtu::Mtu1024);
}

#[test]
fn documented_wire_format_by_hand() {
    // A client speaking the documented bytes to a real listener, with a real QP.
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let server = thread::spawn(move || {
        let req = listener.accept_request(LONG).unwrap();
        assert_eq!(req.remote().psn, Psn::new(0x00AB_CDEF));
        assert_eq!(req.responder_resources(), 4);
        assert_eq!(req.initiator_depth(), 4);
        assert_eq!(req.mtu(), Mtu::Mtu2048);
        let o = ConnectOptions {
            private_data: b"rep".to_vec(),
            initiator_depth: 8,
            ..ConnectOptions::default()
        };
        let conn = req.accept_with(&srv.init(QpType::Rc), &o).unwrap();
        assert_eq!(conn.mtu(), Mtu::Mtu1024, "min(2048 offered, device 1024)");
        let attr = conn.qp().query();
        assert_eq!(
            attr.max_rd_atomic, 4,
            "capped by the peer's responder resources"
        );
        assert_eq!(attr.max_dest_rd_atomic, 16);
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Established)));
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Disconnected)));
        assert_eq!(conn.qp().state(), QpState::Err);
        conn.qp().qpn()
    });
    let qp = cli.pd.create_qp(&cli.init(QpType::Rc)).unwrap();
    let mut raw = TcpStream::connect(addr).unwrap();
    let port = cli.dev.local_addr().port();
    raw.write_all(&req_bytes(
        qp.qpn().value(),
        0xAB_CDEF,
        cli.dev.local_gid(),
        port,
        4,
        0,
        b"x",
    ))
    .unwrap();
    let rep = read_msg(&mut raw);
    assert_eq!(&rep[..4], b"CM\x01\x13");
    assert_eq!(u16::from_be_bytes([rep[4], rep[5]]), 31 + 3);
    let b = &rep[6..];
    let qpn = u32::from_be_bytes(b[0..4].try_into().unwrap());
    let psn = u32::from_be_bytes(b[4..8].try_into().unwrap());
    let gid = Gid(b[8..24].try_into().unwrap());
    let rport = u16::from_be_bytes([b[24], b[25]]);
    assert_eq!(gid, srv_gid());
    assert_eq!((b[26], b[27], b[28], b[29], b[30]), (3, 0, 16, 4, 3));
    assert_eq!(&b[31..], b"rep");
    let remote = RemoteQp {
        qpn: Qpn::new(qpn),
        psn: Psn::new(psn),
        gid,
        port: rport,
    };
    qp.connect(
        &remote,
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(0xAB_CDEF)),
    )
    .unwrap();
    raw.write_all(b"CM\x01\x14\x00\x00").unwrap(); // RTU
    raw.write_all(b"CM\x01\x15\x00\x00").unwrap(); // DREQ
    assert_eq!(read_msg(&mut raw), b"CM\x01\x16\x00\x00"); // DREP
    assert_eq!(server.join().unwrap().value(), qpn);
}

fn srv_gid() -> Gid {
    Gid::from_ip("127.0.0.3".parse().unwrap())
}

#[test]
fn a_client_that_never_sends_the_rtu_times_out_the_accept() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let mut raw = TcpStream::connect(listener.local_addr()).unwrap();
    raw.write_all(&req_bytes(0x40, 5, cli.dev.local_gid(), 4791, 3, 0, b""))
        .unwrap();
    let req = listener.accept_request(LONG).unwrap();
    let qp = srv.pd.create_qp(&srv.init(QpType::Rc)).unwrap();
    let o = ConnectOptions {
        timeout: Duration::from_millis(200),
        ..ConnectOptions::default()
    };
    let t = Instant::now();
    let err = req.accept_with(&qp, &o).unwrap_err();
    assert!(matches!(err, CmError::Timeout), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(
        qp.state(),
        QpState::Err,
        "an unconfirmed QP does not stay in RTS"
    );
    assert_eq!(&read_msg(&mut raw)[..4], b"CM\x01\x13"); // the REP
    let rej = read_msg(&mut raw);
    assert_eq!(&rej[..8], b"CM\x01\x12\x00\x03\x00\x04"); // REJ, reason 4 (timeout)
}

/// A fake server: answers every client's first message with `reply`, or closes at once.
fn fake_server(reply: Option<Vec<u8>>) -> (SocketAddr, thread::JoinHandle<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.3:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let Some(reply) = reply else {
            return Vec::new();
        };
        let _req = read_msg(&mut s);
        s.write_all(&reply).unwrap();
        // Whatever the client says next (a REJ, or nothing before it closes).
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    (addr, h)
}

#[test]
fn a_misbehaving_server_fails_the_client_cleanly() {
    let cli = host_mtu("127.0.0.2", Mtu::Mtu1024);
    let fast = |addr| {
        let t = Instant::now();
        let r = cli.connect(addr, &opts(b""));
        assert!(t.elapsed() < Duration::from_secs(1));
        r.unwrap_err()
    };
    let (addr, h) = fake_server(None);
    assert!(matches!(fast(addr), CmError::Closed));
    h.join().unwrap();

    let (addr, h) = fake_server(Some(b"SSH-2.0-OpenSSH_9.6\r\n".to_vec()));
    assert!(matches!(fast(addr), CmError::Protocol(_)));
    h.join().unwrap();

    let (addr, h) = fake_server(Some(b"CM\x01\x16\x00\x00".to_vec())); // DREP
    let e = fast(addr);
    assert!(
        matches!(&e, CmError::Protocol(m) if m.contains("DREP")),
        "{e:?}"
    );
    assert_eq!(&h.join().unwrap()[..4], b"CM\x01\x12");

    // A REP choosing MTU 4096 when 1024 was offered: REJ with INVALID_MTU.
    let srv_gid = srv_gid();
    let mut rep = req_bytes(0x77, 9, srv_gid, 4791, 5, 0, b"");
    rep[3] = 0x13;
    let (addr, h) = fake_server(Some(rep));
    assert!(matches!(fast(addr), CmError::Protocol(_)));
    assert_eq!(&h.join().unwrap()[..8], b"CM\x01\x12\x00\x03\x00\x1a");

    // A REP with an IPv6 GID for an IPv4 device: REJ with INVALID_GID.
    let mut rep = req_bytes(
        0x77,
        9,
        Gid::from_ip("::1".parse().unwrap()),
        4791,
        3,
        0,
        b"",
    );
    rep[3] = 0x13;
    let (addr, h) = fake_server(Some(rep));
    assert!(matches!(fast(addr), CmError::Protocol(_)));
    assert_eq!(&h.join().unwrap()[..8], b"CM\x01\x12\x00\x03\x00\x0c");
}

#[test]
fn disconnect_is_seen_by_the_peer_and_flushes_outstanding_receives() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let server = thread::spawn(move || {
        let buf = srv.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let qp = srv.pd.create_qp(&srv.init(QpType::Rc)).unwrap();
        for i in 0..3 {
            qp.post_recv(RecvWr {
                wr_id: 100 + i,
                sges: SgeList::one(buf.sge(i as usize * 1024, 1024)),
            })
            .unwrap();
        }
        let conn = listener
            .accept_request(LONG)
            .unwrap()
            .accept(&qp, b"")
            .unwrap();
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Established)));
        let t = Instant::now();
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Disconnected)));
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(conn.qp().state(), QpState::Err);
        let mut flushed: Vec<(u64, WcStatus)> = (0..3)
            .map(|_| srv.wait_wc())
            .map(|w| (w.wr_id, w.status))
            .collect();
        flushed.sort_by_key(|f| f.0);
        assert_eq!(
            flushed,
            [100, 101, 102].map(|id| (id, WcStatus::WrFlushErr))
        );
        assert!(
            conn.poll_event(LONG).is_none(),
            "nothing after Disconnected"
        );
        // Disconnecting a disconnected connection is a no-op.
        conn.disconnect().unwrap();
    });
    let conn = cli.connect(addr, &opts(b"")).unwrap();
    let buf = cli.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    conn.qp()
        .post_recv(RecvWr {
            wr_id: 9,
            sges: SgeList::one(buf.sge(0, 64)),
        })
        .unwrap();
    assert!(matches!(conn.poll_event(None), Some(CmEvent::Established)));
    conn.disconnect().unwrap();
    assert_eq!(conn.qp().state(), QpState::Err);
    let wc = cli.wait_wc();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WrFlushErr));
    // The DREP arrives once the server has polled: well before DREP_TIMEOUT.
    let t = Instant::now();
    assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Disconnected)));
    assert!(
        t.elapsed() < cm::DREP_TIMEOUT,
        "got the DREP, not the timeout"
    );
    assert!(conn.poll_event(Some(Duration::from_secs(5))).is_none());
    server.join().unwrap();
}

#[test]
fn disconnect_completes_without_a_drep_after_the_drep_timeout() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let (tx, rx) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let conn = listener
            .accept_request(LONG)
            .unwrap()
            .accept(&srv.init(QpType::Rc), b"")
            .unwrap();
        // Never polls until told to: the DREQ stays unanswered.
        rx.recv().unwrap();
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Established)));
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Disconnected)));
    });
    let conn = cli.connect(addr, &opts(b"")).unwrap();
    assert!(matches!(conn.poll_event(None), Some(CmEvent::Established)));
    let t = Instant::now();
    conn.disconnect().unwrap();
    assert!(conn.poll_event(Some(Duration::from_millis(300))).is_none());
    // A second thread polls with no timeout; it returns once DREP_TIMEOUT has passed.
    thread::scope(|s| {
        s.spawn(|| assert!(matches!(conn.poll_event(None), Some(CmEvent::Disconnected))));
    });
    let took = t.elapsed();
    assert!(
        took >= cm::DREP_TIMEOUT && took < cm::DREP_TIMEOUT + Duration::from_secs(1),
        "took {took:?}"
    );
    tx.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn dropping_a_connection_disconnects_the_peer() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let server = thread::spawn(move || {
        let conn = listener
            .accept_request(LONG)
            .unwrap()
            .accept(&srv.init(QpType::Rc), b"")
            .unwrap();
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Established)));
        let t = Instant::now();
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Disconnected)));
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(conn.qp().state(), QpState::Err);
    });
    let conn = cli.connect(addr, &opts(b"")).unwrap();
    let qp = conn.qp().clone();
    drop(conn);
    assert_eq!(qp.state(), QpState::Err);
    server.join().unwrap();
}

#[test]
fn disconnect_from_another_thread_wakes_a_blocked_poll() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let server = thread::spawn(move || {
        let conn = listener
            .accept_request(LONG)
            .unwrap()
            .accept(&srv.init(QpType::Rc), b"")
            .unwrap();
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Established)));
        assert!(matches!(conn.poll_event(LONG), Some(CmEvent::Disconnected)));
    });
    let conn = cli.connect(addr, &opts(b"")).unwrap();
    assert!(matches!(conn.poll_event(None), Some(CmEvent::Established)));
    thread::scope(|s| {
        let waiter = s.spawn(|| conn.poll_event(None));
        thread::sleep(Duration::from_millis(100));
        // A second poller's timeout holds while the first one waits.
        let t = Instant::now();
        assert!(conn.poll_event(Some(Duration::from_millis(150))).is_none());
        let took = t.elapsed();
        assert!(took < Duration::from_millis(400), "took {took:?}");
        conn.disconnect().unwrap();
        assert!(matches!(
            waiter.join().unwrap(),
            Some(CmEvent::Disconnected)
        ));
    });
    server.join().unwrap();
}

#[test]
fn path_mtu_is_the_minimum_of_both_sides() {
    let srv = host_mtu("127.0.0.3", Mtu::Mtu1024);
    let cli = host_mtu("127.0.0.2", Mtu::Mtu4096);
    let listener = srv.listen();
    let addr = listener.local_addr();
    // (client option, server option, expected)
    let cases = [
        (None, None, Mtu::Mtu1024),
        (Some(Mtu::Mtu512), None, Mtu::Mtu512),
        (None, Some(Mtu::Mtu256), Mtu::Mtu256),
        (Some(Mtu::Mtu4096), Some(Mtu::Mtu2048), Mtu::Mtu1024),
    ];
    let server = thread::spawn(move || {
        let mut conns = Vec::new();
        let target = srv
            .pd
            .reg_mr(16384, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        for (_, server_mtu, want) in cases {
            let o = ConnectOptions {
                mtu: server_mtu,
                private_data: encode_mr(target.remote().unwrap()),
                ..ConnectOptions::default()
            };
            let req = listener.accept_request(LONG).unwrap();
            let conn = req.accept_with(&srv.init(QpType::Rc), &o).unwrap();
            assert_eq!((conn.mtu(), conn.qp().query().path_mtu), (want, want));
            conns.push(conn);
        }
        for c in &conns {
            assert!(matches!(c.poll_event(LONG), Some(CmEvent::Established)));
            assert!(matches!(c.poll_event(LONG), Some(CmEvent::Disconnected)));
        }
        let mut got = vec![0u8; 10000];
        target.read(0, &mut got).unwrap();
        got
    });
    let src = cli.pd.reg_mr(16384, AccessFlags::LOCAL_WRITE).unwrap();
    let pattern: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
    src.write(0, &pattern).unwrap();
    for (i, (client_mtu, _, want)) in cases.into_iter().enumerate() {
        let conn = cli
            .connect(
                addr,
                &ConnectOptions {
                    mtu: client_mtu,
                    ..ConnectOptions::default()
                },
            )
            .unwrap();
        assert_eq!((conn.mtu(), conn.qp().query().path_mtu), (want, want));
        // A multi-packet WRITE at the negotiated MTU.
        let r = decode_mr(conn.remote_private_data());
        let op = SendOp::Write {
            remote_addr: r.addr,
            rkey: RKey(r.rkey),
        };
        conn.qp()
            .post_send(SendWr::new(i as u64, op, SgeList::one(src.sge(0, 10000))))
            .unwrap();
        let wc = cli.wait_wc();
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        conn.disconnect().unwrap();
    }
    assert_eq!(server.join().unwrap(), pattern);
}

#[test]
fn uc_connections_and_transport_mismatch() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let rc_qp = srv.pd.create_qp(&srv.init(QpType::Rc)).unwrap();
    let server = thread::spawn(move || {
        // UC with a UC QP, through the event API.
        let Some(CmEvent::ConnectRequest(req)) = listener.poll_event(LONG) else {
            panic!("expected a connect request");
        };
        assert_eq!(req.qp_type(), QpType::Uc);
        let conn = req.accept(&srv.init(QpType::Uc), b"uc ok").unwrap();
        assert_eq!(conn.qp().qp_type(), QpType::Uc);
        // UC request, RC QP: refused locally and rejected.
        let req = listener.accept_request(LONG).unwrap();
        let err = req.accept(rc_qp, b"").unwrap_err();
        assert!(matches!(err, CmError::Verbs(_)), "{err:?}");
        conn
    });
    let uc = cli.init(QpType::Uc);
    let conn = cm::connect(&cli.dev, &cli.pd, addr, &uc, &opts(b"")).unwrap();
    assert_eq!(conn.remote_private_data(), b"uc ok");
    assert_eq!(conn.qp().state(), QpState::Rts);
    let (reason, _) = rejected(cm::connect(&cli.dev, &cli.pd, addr, &uc, &opts(b"")));
    assert_eq!(reason, reason::INVALID_TRANSPORT_TYPE);
    let _server_conn = server.join().unwrap();
    // UD is not connectable.
    let ud = cli.init(QpType::Ud);
    let err = cm::connect(&cli.dev, &cli.pd, addr, &ud, &opts(b"")).unwrap_err();
    assert!(matches!(err, CmError::Verbs(_)), "{err:?}");
}

#[test]
fn wrong_device_and_bad_options_fail_before_the_network() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let other_pd = srv.pd.clone();
    let err = Listener::bind(&cli.dev, &other_pd, "127.0.0.2:0".parse().unwrap()).unwrap_err();
    assert!(
        matches!(err, CmError::Verbs(srdma::Error::WrongDevice)),
        "{err:?}"
    );
    let err =
        cm::connect(&cli.dev, &other_pd, addr, &cli.init(QpType::Rc), &opts(b"")).unwrap_err();
    assert!(
        matches!(err, CmError::Verbs(srdma::Error::WrongDevice)),
        "{err:?}"
    );
    for o in [
        ConnectOptions {
            retry_cnt: 8,
            ..ConnectOptions::default()
        },
        ConnectOptions {
            ack_timeout: 32,
            ..ConnectOptions::default()
        },
        ConnectOptions {
            timeout: Duration::ZERO,
            ..ConnectOptions::default()
        },
    ] {
        let err = cli.connect(addr, &o).unwrap_err();
        assert!(
            matches!(err, CmError::Verbs(srdma::Error::InvalidArgument(_))),
            "{err:?}"
        );
    }
    assert!(matches!(
        listener.accept_request(Some(Duration::from_millis(50))),
        Err(CmError::Timeout)
    ));
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<cm::Connection>();
    check::<cm::Listener>();
    check::<cm::ConnectRequest>();
    check::<CmError>();
    fn send<T: Send>() {}
    send::<CmEvent>();
}

/// Two srdma peers connected by the TCP CM agree on selective repeat (ECE in the REQ and
/// REP, as the IB CM carries it), so the relay's QPs recover from loss without go-back-N;
/// a UC connection offers nothing and agrees on nothing.
#[test]
fn srdma_peers_agree_on_selective_repeat() {
    let (srv, cli) = hosts();
    let listener = srv.listen();
    let addr = listener.local_addr();
    let server = thread::spawn(move || {
        let req = listener.accept_request(LONG).unwrap();
        let conn = req.accept_with(&srv.init(QpType::Rc), &opts(b"")).unwrap();
        let rc = (conn.qp().query_ece(), conn.qp().selective_repeat());
        let req = listener.accept_request(LONG).unwrap();
        let conn = req.accept_with(&srv.init(QpType::Uc), &opts(b"")).unwrap();
        (rc, conn.qp().query_ece(), conn.qp().selective_repeat())
    });
    let rc = cli.connect(addr, &opts(b"")).unwrap();
    let uc = cm::connect(&cli.dev, &cli.pd, addr, &cli.init(QpType::Uc), &opts(b"")).unwrap();
    let ((srv_ece, srv_sr), srv_uc, srv_uc_sr) = server.join().unwrap();
    // Agreed, and in force: the QPs recover by selective repeat (an offer alone is not).
    assert!(rc.qp().selective_repeat(), "client RC");
    assert!(srv_sr && srv_ece.selective_repeat(), "server RC");
    assert!(rc.qp().query_ece().selective_repeat());
    assert!(!uc.qp().selective_repeat(), "client UC");
    assert!(!srv_uc_sr, "server UC");
    assert_eq!(srv_uc, srdma::Ece::default(), "server UC");
}
