//! The lease tier ([`srdma::lease`]): buffers move into work requests and come back with
//! their completions; and the raw tier's plain behaviour.

use std::time::{Duration, Instant};

use srdma::lease::{Buf, BufPool, LeasedQp, RawPost};
use srdma::{
    AccessFlags, AttrMask, ConnectParams, Device, Mtu, QpAttr, QpInit, QpState, QpType, RKey,
    RemoteQp, SendOp, SendWr, SgeList, UdDest, Wc, WcOpcode, WcStatus,
};
use srdma_wire::Psn;

mod common;
use common::{loopback, remote};

/// Connects `a` (on `da`) and `b` (on `db`) with each other.
fn connect(da: &Device, a: &LeasedQp, db: &Device, b: &LeasedQp) {
    a.connect(
        &remote(db, b.qpn(), 200),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(100)),
    )
    .unwrap();
    b.connect(
        &remote(da, a.qpn(), 100),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(200)),
    )
    .unwrap();
}

struct Pair {
    da: Device,
    db: Device,
    pa: BufPool,
    pb: BufPool,
    qa: LeasedQp,
    qb: LeasedQp,
}

fn rc_pair(count: usize, slot: usize) -> Pair {
    let (da, db) = (loopback(), loopback());
    let pa = BufPool::new(&da, count, slot).unwrap();
    let pb = BufPool::new(&db, count, slot).unwrap();
    let qa = LeasedQp::new(&pa, QpType::Rc).unwrap();
    let qb = LeasedQp::new(&pb, QpType::Rc).unwrap();
    connect(&da, &qa, &db, &qb);
    Pair {
        da,
        db,
        pa,
        pb,
        qa,
        qb,
    }
}

fn wait(poll: impl Fn() -> Option<(Wc, Buf)>) -> (Wc, Buf) {
    let t0 = Instant::now();
    loop {
        if let Some(x) = poll() {
            return x;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no completion in 10 s"
        );
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn ok<T>(r: Result<T, (srdma::Error, Buf)>) -> T {
    r.map_err(|(e, _)| e).unwrap()
}

#[test]
fn send_into_leased_recv_both_come_back_and_are_reused() {
    let p = rc_pair(4, 2048);
    let mut tx = p.pa.lease().unwrap();
    let mut rx = p.pb.lease().unwrap();
    for round in 0u8..20 {
        let msg: Vec<u8> = (0..(100 + round as usize * 50))
            .map(|i| i as u8 ^ round)
            .collect();
        tx.copy_from(&msg);
        // The receive buffer is lent whole, whatever its length was.
        let rx_id = ok(p.qb.post_recv(rx));
        let tx_id = ok(p.qa.post_send(tx, SendOp::Send));
        assert_eq!((p.qa.in_flight(), p.qb.in_flight()), (1, 1));
        let (wc, back) = wait(|| p.qa.poll());
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (tx_id, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(&back[..], &msg[..], "the sent buffer comes back intact");
        tx = back;
        let (wc, got) = wait(|| p.qb.poll());
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (rx_id, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(wc.byte_len as usize, msg.len());
        assert_eq!(
            got.len(),
            msg.len(),
            "a receive's Buf is cut to the bytes received"
        );
        assert_eq!(&got[..], &msg[..]);
        rx = got;
        assert_eq!((p.qa.in_flight(), p.qb.in_flight()), (0, 0));
    }
    // The same two slots were used every round.
    assert_eq!((p.pa.available(), p.pb.available()), (3, 3));
    drop((tx, rx));
    assert_eq!((p.pa.available(), p.pb.available()), (4, 4));
}

#[test]
fn in_place_writes_are_what_is_sent() {
    let p = rc_pair(2, 4096);
    let mut tx = p.pa.lease().unwrap();
    tx.set_len(4096);
    for (i, b) in tx.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    tx.as_mut_capacity()[0] = 0xAA;
    ok(p.qb.post_recv(p.pb.lease().unwrap()));
    ok(p.qa.post_send(tx, SendOp::SendWithImm { imm: 7 }));
    let (wc, got) = wait(|| p.qb.poll_recv());
    assert_eq!((wc.status, wc.imm_data), (WcStatus::Success, Some(7)));
    assert_eq!(got.len(), 4096, "a multi-packet message (MTU 1024)");
    assert_eq!(got[0], 0xAA);
    assert!(
        got[1..]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == ((i + 1) % 251) as u8)
    );
    wait(|| p.qa.poll_send());
}

#[test]
fn rdma_write_and_read_with_a_plain_remote_mr() {
    let p = rc_pair(2, 1024);
    // B's target is an ordinary region in B's pool PD; A only knows its RemoteMr.
    let target =
        p.pb.reg_mr(
            4096,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let r = target.remote().unwrap();
    let mut buf = p.pa.lease().unwrap();
    buf.copy_from(b"leased write");
    let op = SendOp::Write {
        remote_addr: r.addr + 100,
        rkey: RKey(r.rkey),
    };
    ok(p.qa.post_send(buf, op));
    let (wc, mut buf) = wait(|| p.qa.poll());
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut seen = [0u8; 12];
    target.read(100, &mut seen).unwrap();
    assert_eq!(&seen, b"leased write");

    // READ it back into the same lease, cleared first.
    buf.as_mut_slice().fill(0);
    let op = SendOp::Read {
        remote_addr: r.addr + 100,
        rkey: RKey(r.rkey),
    };
    ok(p.qa.post_send(buf, op));
    let (wc, buf) = wait(|| p.qa.poll());
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(&buf[..], b"leased write");

    // An atomic lands the original value in the lease.
    let mut word = buf;
    word.set_len(8);
    target.write(0, &41u64.to_ne_bytes()).unwrap();
    let op = SendOp::FetchAdd {
        remote_addr: r.addr,
        rkey: RKey(r.rkey),
        add: 1,
    };
    ok(p.qa.post_send(word, op));
    let (wc, word) = wait(|| p.qa.poll());
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(u64::from_ne_bytes(word[..].try_into().unwrap()), 41);
    let mut now = [0u8; 8];
    target.read(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 42);
}

#[test]
fn exhausted_pool_gives_none_until_a_lease_returns() {
    let (d, _) = (loopback(), ());
    let pool = BufPool::new(&d, 3, 64).unwrap();
    assert_eq!(
        (pool.count(), pool.available(), pool.slot_size()),
        (3, 3, 64)
    );
    let bufs: Vec<Buf> = (0..3).map(|_| pool.lease().unwrap()).collect();
    assert!(pool.lease().is_none());
    assert_eq!(pool.available(), 0);
    let mut bufs = bufs.into_iter();
    drop(bufs.next());
    let again = pool.lease().expect("a dropped lease returns to the pool");
    assert_eq!((again.len(), again.capacity()), (0, 64));
    assert!(pool.lease().is_none());
    drop(bufs);
    drop(again);
    assert_eq!(pool.available(), 3);
    assert!(BufPool::new(&d, 0, 64).is_err());
    assert!(BufPool::new(&d, 1, 0).is_err());
}

#[test]
fn error_completions_return_the_buffers() {
    let p = rc_pair(4, 256);
    let rx1 = ok(p.qa.post_recv(p.pa.lease().unwrap()));
    let rx2 = ok(p.qa.post_recv(p.pa.lease().unwrap()));
    let mut buf = p.pa.lease().unwrap();
    buf.copy_from(b"nowhere");
    // A write to an R_Key B never issued: remote access error, then the QP flushes.
    let op = SendOp::Write {
        remote_addr: 0x1000,
        rkey: RKey(0xdead_beef),
    };
    let tx = ok(p.qa.post_send(buf, op));
    assert_eq!(p.pa.available(), 1);
    let (wc, back) = wait(|| p.qa.poll_send());
    assert_eq!(wc.wr_id, tx);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(&back[..], b"nowhere");
    let mut flushed = vec![wait(|| p.qa.poll_recv()), wait(|| p.qa.poll_recv())];
    flushed.sort_by_key(|(wc, _)| wc.wr_id);
    for ((wc, b), id) in flushed.iter().zip([rx1, rx2]) {
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::WrFlushErr));
        assert!(b.is_empty(), "a flushed receive got nothing");
    }
    assert_eq!(p.qa.in_flight(), 0);
    drop((back, flushed));
    assert_eq!(p.pa.available(), 4);
    let _ = (&p.da, &p.db, &p.qb, &p.pb);
}

#[test]
fn moving_to_err_flushes_leases_back() {
    let p = rc_pair(4, 256);
    for _ in 0..3 {
        ok(p.qb.post_recv(p.pb.lease().unwrap()));
    }
    assert_eq!(p.pb.available(), 1);
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.qb.modify(&attr, AttrMask::STATE).unwrap();
    let mut n = 0;
    while let Some((wc, _buf)) = p.qb.poll() {
        assert_eq!(wc.status, WcStatus::WrFlushErr);
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(p.pb.available(), 4);
    // RESET would discard WQEs without completions: refused.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    assert!(p.qb.modify(&reset, AttrMask::STATE).is_err());
    assert_eq!(p.qb.state(), QpState::Err);
}

#[test]
fn refused_posts_return_the_buffer() {
    let d = loopback();
    let pool = BufPool::new(&d, 2, 128).unwrap();
    let qp = LeasedQp::new(&pool, QpType::Rc).unwrap();
    assert_eq!(qp.state(), QpState::Init);
    let mut buf = pool.lease().unwrap();
    buf.copy_from(b"too early");
    // Sending from INIT is refused at post time.
    let (_, buf) = qp.post_send(buf, SendOp::Send).unwrap_err();
    assert_eq!(&buf[..], b"too early");
    assert_eq!(qp.in_flight(), 0);

    // A buffer of another pool (another PD) is refused before reaching the engine.
    let other = BufPool::new(&d, 1, 128).unwrap();
    let (e, foreign) = qp.post_recv(other.lease().unwrap()).unwrap_err();
    assert!(matches!(e, srdma::Error::InvalidArgument(_)), "{e}");
    assert_eq!(other.available(), 0);
    drop(foreign);
    assert_eq!(other.available(), 1);
    drop(buf);
    assert_eq!(pool.available(), 2);
}

#[test]
fn dropping_a_leased_qp_with_work_in_flight_releases_everything() {
    let d = loopback();
    let pool = BufPool::new(&d, 8, 512).unwrap();
    let qp = LeasedQp::new(&pool, QpType::Rc).unwrap();
    // A peer that never answers: the sends stay in flight, retransmitting.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let nobody = RemoteQp {
        qpn: srdma_wire::Qpn::new(0x99),
        psn: Psn::new(1),
        gid: d.local_gid(),
        port: silent.local_addr().unwrap().port(),
    };
    qp.connect(&nobody, &ConnectParams::new(Mtu::Mtu1024, Psn::new(1)))
        .unwrap();
    for _ in 0..4 {
        ok(qp.post_recv(pool.lease().unwrap()));
    }
    for i in 0..3u8 {
        let mut b = pool.lease().unwrap();
        b.copy_from(&[i; 300]);
        ok(qp.post_send(b, SendOp::Send));
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(qp.poll_send().is_none(), "no ACK can have come");
    assert_eq!((qp.in_flight(), pool.available()), (7, 1));
    drop(qp);
    assert_eq!(pool.available(), 8, "every in-flight lease is back");

    // The pool's memory outlives the pool handle while a lease is out.
    let mut last = pool.lease().unwrap();
    drop(pool);
    last.copy_from(b"still mine");
    assert_eq!(&last[..], b"still mine");
    drop(last);
    // The device keeps running.
    let again = BufPool::new(&d, 1, 64).unwrap();
    assert!(again.lease().is_some());
}

#[test]
fn several_qps_share_one_pool_and_keep_their_own_completions() {
    let (da, db) = (loopback(), loopback());
    let pa = BufPool::new(&da, 16, 1024).unwrap();
    let pb = BufPool::new(&db, 16, 1024).unwrap();
    let qas: Vec<LeasedQp> = (0..3)
        .map(|_| LeasedQp::new(&pa, QpType::Rc).unwrap())
        .collect();
    let qbs: Vec<LeasedQp> = (0..3)
        .map(|_| LeasedQp::new(&pb, QpType::Rc).unwrap())
        .collect();
    for (a, b) in qas.iter().zip(&qbs) {
        connect(&da, a, &db, b);
    }
    for (i, (a, b)) in qas.iter().zip(&qbs).enumerate() {
        for j in 0..2u8 {
            ok(b.post_recv(pb.lease().unwrap()));
            let mut buf = pa.lease().unwrap();
            buf.copy_from(&[i as u8 * 10 + j; 100]);
            ok(a.post_send(buf, SendOp::Send));
        }
    }
    assert_eq!((pa.available(), pb.available()), (10, 10));
    for (i, (a, b)) in qas.iter().zip(&qbs).enumerate() {
        for j in 0..2u8 {
            let (wc, sent) = wait(|| a.poll());
            assert_eq!((wc.status, wc.qp_num), (WcStatus::Success, a.qpn()));
            assert_eq!(sent[0], i as u8 * 10 + j, "in order, on its own QP");
            let (wc, got) = wait(|| b.poll());
            assert_eq!((wc.status, wc.qp_num), (WcStatus::Success, b.qpn()));
            assert_eq!(&got[..], &[i as u8 * 10 + j; 100][..]);
        }
        assert!(a.poll().is_none() && b.poll().is_none());
    }
    assert_eq!((pa.available(), pb.available()), (16, 16));
}

#[test]
fn ud_send_to_a_leased_receive() {
    let (da, db) = (loopback(), loopback());
    let pa = BufPool::new(&da, 2, 2048).unwrap();
    let pb = BufPool::new(&db, 2, 2048).unwrap();
    let qa = LeasedQp::new(&pa, QpType::Ud).unwrap();
    let qb = LeasedQp::new(&pb, QpType::Ud).unwrap();
    qa.activate(Psn::new(1)).unwrap();
    qb.activate(Psn::new(1)).unwrap();
    ok(qb.post_recv(pb.lease().unwrap()));
    let mut ah = srdma::ah(db.local_gid());
    ah.udp_dport = db.local_addr().port();
    let dest = UdDest {
        ah,
        remote_qpn: qb.qpn(),
        remote_qkey: 0x1111_1111,
    };
    let mut buf = pa.lease().unwrap();
    buf.copy_from(b"datagram");
    ok(qa.post_send_to(buf, SendOp::Send, dest));
    let (wc, _sent) = wait(|| qa.poll());
    assert_eq!(wc.status, WcStatus::Success);
    let (wc, got) = wait(|| qb.poll());
    assert_eq!(wc.status, WcStatus::Success);
    // The first 40 bytes are the GRH area, as with verbs.
    assert_eq!(got.len(), 40 + 8);
    assert_eq!(&got[40..], b"datagram");
}

#[test]
fn raw_tier_posts_like_the_sge_tier() {
    let (da, db) = (loopback(), loopback());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let (ca, cb) = (
        da.create_cq(8, None).unwrap(),
        db.create_cq(8, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    qa.connect(
        &remote(&db, qb.qpn(), 2),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(1)),
    )
    .unwrap();
    qb.connect(
        &remote(&da, qa.qpn(), 1),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(2)),
    )
    .unwrap();
    let src = pa.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, b"raw").unwrap();
    let dst = pb.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = srdma::RecvWr {
        wr_id: 9,
        sges: SgeList::one(dst.sge(0, 64)),
    };
    // SAFETY: `dst` outlives the receive's completion (polled below) and is not touched
    // until then.
    unsafe { qb.post_recv_raw(&recv) }.unwrap();
    let wr = SendWr::new(8, SendOp::Send, SgeList::one(src.sge(0, 3)));
    // SAFETY: `src` stays registered and unmodified until the completion polled below.
    unsafe { qa.post_send_raw(&wr) }.unwrap();
    let t0 = Instant::now();
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        sent = sent.or_else(|| ca.poll_one());
        got = got.or_else(|| cb.poll_one());
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(sent.unwrap().wr_id, 8);
    let got = got.unwrap();
    assert_eq!((got.wr_id, got.byte_len), (9, 3));
    let mut b = [0u8; 3];
    dst.read(0, &mut b).unwrap();
    assert_eq!(&b, b"raw");
}

#[test]
fn leases_and_leased_qps_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Buf>();
    send_sync::<BufPool>();
    send_sync::<LeasedQp>();
}
