//! UD multicast (`Qp::attach_mcast`): a datagram to QPN 0xFFFFFF at a group reaches every
//! QP attached to it, on every device that joined it, as with rxe; bad attaches are refused.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, Device, Error, Gid, Mr, Mtu, Qp, QpInit, QpType, RecvWr, SendOp, SendWr, SgeList,
    UdDest, Wc, WcStatus, ah,
};
use srdma_wire::{Psn, Qpn};

mod common;
use common::{dev, wait};

const QKEY: u32 = 0x0123_4567;

struct Member {
    qp: Qp,
    cq: srdma::Cq,
    mr: Mr,
}

fn member(d: &Device, qkey: u32) -> Member {
    let pd = d.alloc_pd();
    let cq = d.create_cq(16, None).unwrap();
    let mut init = QpInit::new(QpType::Ud, &cq, &cq);
    init.qkey = qkey;
    let qp = pd.create_qp(&init).unwrap();
    qp.activate(Psn::new(0)).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        qp.post_recv(RecvWr {
            wr_id: i,
            sges: SgeList::one(mr.sge(i as usize * 1024, 1024)),
        })
        .unwrap();
    }
    Member { qp, cq, mr }
}

fn group_gid(ip: &str) -> Gid {
    Gid::from_ip(ip.parse::<IpAddr>().unwrap())
}

fn send_to_group(from: &Member, group: Gid, port: u16, imm: u32, payload: &[u8]) {
    from.mr.write(3 * 1024, payload).unwrap();
    let mut a = ah(group);
    a.udp_dport = port;
    let dest = UdDest {
        ah: a,
        remote_qpn: Qpn::MULTICAST,
        remote_qkey: QKEY,
    };
    let wr = SendWr::new(
        u64::from(imm),
        SendOp::SendWithImm { imm },
        SgeList::one(from.mr.sge(3 * 1024, payload.len())),
    )
    .to_ud(dest);
    from.qp.post_send(wr).unwrap();
}

/// The received message: the GRH's destination address (IPv4 header in its last 20 bytes)
/// and the payload.
fn received(m: &Member, wc: &Wc, len: usize) -> ([u8; 4], Vec<u8>) {
    let mut buf = vec![0u8; 40 + len];
    m.mr.read(wc.wr_id as usize * 1024, &mut buf).unwrap();
    (buf[36..40].try_into().unwrap(), buf[40..].to_vec())
}

#[test]
fn a_datagram_to_a_group_reaches_every_attached_qp_and_no_other() {
    // Receivers on two devices (two "hosts" on loopback) share the port the sender aims at.
    let r1 = dev("127.0.61.1", 0, Mtu::Mtu1024);
    let port = r1.local_addr().port();
    let r2 = dev("127.0.61.2", port, Mtu::Mtu1024);
    let s = dev("127.0.61.3", 0, Mtu::Mtu1024);
    let group = group_gid("239.61.0.1");

    let a = member(&r1, QKEY);
    let b = member(&r2, QKEY);
    let wrong_qkey = member(&r2, 0x1111);
    let not_attached = member(&r2, QKEY);
    let sender = member(&s, QKEY);
    a.qp.attach_mcast(group).unwrap();
    // Attaching twice is no error (rxe).
    a.qp.attach_mcast(group).unwrap();
    b.qp.attach_mcast(group).unwrap();
    wrong_qkey.qp.attach_mcast(group).unwrap();
    assert!(a.qp.is_attached() && !not_attached.qp.is_attached());

    send_to_group(&sender, group, port, 7, b"to the group");
    for m in [&a, &b] {
        let wc = wait(&m.cq, Duration::from_secs(5)).expect("the group's datagram arrives");
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.imm_data, Some(7));
        assert_eq!(wc.src_qp, sender.qp.qpn());
        assert_eq!(wc.byte_len, 40 + 12);
        let (dst, payload) = received(m, &wc, 12);
        assert_eq!(
            dst,
            [239, 61, 0, 1],
            "the GRH names the group as destination"
        );
        assert_eq!(payload, b"to the group");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        wrong_qkey.cq.poll_one().is_none(),
        "a wrong Q_Key is dropped"
    );
    assert_eq!(wrong_qkey.qp.counters().qkey_violations, 1);
    assert!(not_attached.cq.poll_one().is_none());

    // Detached, b gets no more; a still does.
    b.qp.detach_mcast(group).unwrap();
    assert!(matches!(
        b.qp.detach_mcast(group),
        Err(Error::InvalidArgument(_))
    ));
    send_to_group(&sender, group, port, 8, b"second");
    let wc = wait(&a.cq, Duration::from_secs(5)).expect("a, still attached, gets it");
    assert_eq!(wc.imm_data, Some(8));
    std::thread::sleep(Duration::from_millis(100));
    assert!(b.cq.poll_one().is_none(), "a detached QP gets nothing");
}

#[test]
fn a_sender_attached_to_its_group_gets_no_copy_of_its_own_datagram() {
    let d = dev("127.0.61.4", 0, Mtu::Mtu1024);
    let port = d.local_addr().port();
    let group = group_gid("239.61.0.2");
    let sender = member(&d, QKEY);
    let peer = member(&d, QKEY);
    sender.qp.attach_mcast(group).unwrap();
    peer.qp.attach_mcast(group).unwrap();
    send_to_group(&sender, group, port, 9, b"loop");
    let wc = wait(&peer.cq, Duration::from_secs(5)).expect("the other QP of the device gets it");
    assert_eq!((wc.status, wc.imm_data), (WcStatus::Success, Some(9)));
    std::thread::sleep(Duration::from_millis(100));
    while let Some(wc) = sender.cq.poll_one() {
        assert_eq!(
            wc.opcode,
            srdma::WcOpcode::Send,
            "as rxe: no copy for the sending QP"
        );
    }
    // Destroying an attached QP detaches it: the group is joined again from scratch.
    drop(sender);
    drop(peer);
    let again = member(&d, QKEY);
    again.qp.attach_mcast(group).unwrap();
    again.qp.detach_mcast(group).unwrap();
}

#[test]
fn bad_attaches_are_refused() {
    let d = dev("127.0.61.5", 0, Mtu::Mtu1024);
    let ud = member(&d, QKEY);
    let pd = d.alloc_pd();
    let cq = d.create_cq(4, None).unwrap();
    let rc = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let invalid = |r: srdma::Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(invalid(rc.attach_mcast(group_gid("239.61.0.3"))), "RC QP");
    assert!(
        invalid(ud.qp.attach_mcast(group_gid("10.1.2.3"))),
        "unicast"
    );
    assert!(
        invalid(ud.qp.attach_mcast(group_gid("ff02::1"))),
        "IPv6 group, IPv4 device"
    );
    assert!(
        invalid(ud.qp.detach_mcast(group_gid("239.61.0.3"))),
        "not attached"
    );
    assert!(!ud.qp.is_attached());
}

#[test]
fn junk_sent_to_a_group_is_counted_and_dropped() {
    let d = dev("127.0.61.6", 0, Mtu::Mtu1024);
    let port = d.local_addr().port();
    let group = group_gid("239.61.0.4");
    let m = member(&d, QKEY);
    m.qp.attach_mcast(group).unwrap();
    let before = d.counters();
    let junk = std::net::UdpSocket::bind("127.0.61.7:0").unwrap();
    let mut bth = [0u8; 60];
    bth[0] = 0x64; // UD SEND_ONLY
    bth[5..8].copy_from_slice(&[0xff, 0xff, 0xff]); // to the multicast QPN; no valid ICRC
    for d in [&[][..], &[0x5a; 7][..], &bth[..]] {
        junk.send_to(d, ("239.61.0.4", port)).unwrap();
    }
    let sender = member(&dev("127.0.61.8", 0, Mtu::Mtu1024), QKEY);
    send_to_group(&sender, group, port, 11, b"after the junk");
    let wc = wait(&m.cq, Duration::from_secs(5)).expect("the group still works");
    assert_eq!((wc.status, wc.imm_data), (WcStatus::Success, Some(11)));
    let after = d.counters();
    let dropped =
        (after.rx_malformed + after.rx_bad_icrc) - (before.rx_malformed + before.rx_bad_icrc);
    assert_eq!(dropped, 3, "{after:?}");
    assert_eq!(after.rx_datagrams - before.rx_datagrams, 4);
}

/// A thread asleep on a completion channel since before the attach (it watches the device's
/// socket, not the group's, and the progress thread leaves the device to it) still gets the
/// group's datagram's completion.
#[test]
fn a_thread_waiting_on_its_channel_gets_a_group_datagram() {
    let d = dev("127.0.61.9", 0, Mtu::Mtu1024);
    let port = d.local_addr().port();
    let group = group_gid("239.61.0.5");
    let ch = srdma::CompChannel::new().unwrap();
    let pd = d.alloc_pd();
    let cq = d.create_cq(16, Some(&ch)).unwrap();
    let mut init = QpInit::new(QpType::Ud, &cq, &cq);
    init.qkey = QKEY;
    let qp = pd.create_qp(&init).unwrap();
    qp.activate(Psn::new(0)).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    qp.post_recv(RecvWr {
        wr_id: 1,
        sges: SgeList::one(mr.sge(0, 1024)),
    })
    .unwrap();
    cq.req_notify(false);
    let sender = member(&dev("127.0.61.10", 0, Mtu::Mtu1024), QKEY);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t = Instant::now();
            let ev = ch.get_event(Some(Duration::from_secs(10))).unwrap();
            (ev, t.elapsed())
        });
        // Let the waiter go to sleep first.
        std::thread::sleep(Duration::from_millis(200));
        qp.attach_mcast(group).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        send_to_group(&sender, group, port, 12, b"wake up");
        let (ev, waited) = waiter.join().unwrap();
        assert!(ev.is_some(), "no completion event in {waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    });
    let wc = cq.poll_one().expect("the completion the event announced");
    assert_eq!((wc.status, wc.imm_data), (WcStatus::Success, Some(12)));
}
