//! Memory windows over loopback: two devices in this process (127.0.23.1 and 127.0.23.2),
//! an RC connection between them, and B's region reachable only through windows.
//!
//! Checks: RDMA WRITE and READ through a bound type 1 and type 2 window reach the right
//! bytes; a wrong window R_Key, an access outside the window, and any use after the window
//! was unbound, invalidated (locally or by the peer's SEND with invalidate) or deallocated
//! complete with a remote access error at the requester; the receiver of a SEND with
//! invalidate sees `WITH_INV` and the R_Key; a region with a bound window counts it.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, ConnectParams, Cq, Device, DeviceConfig, Mr, Mtu, Mw, MwBind, MwBindInfo, MwState,
    MwType, Pd, Qp, QpInit, QpType, RKey, RecvWr, SendFlags, SendOp, SendWr, SgeList, Wc, WcFlags,
    WcOpcode, WcStatus,
};
use srdma_wire::Psn;

mod common;
use common::remote;

const LEN: usize = 8192;
/// The window: 1 KiB at offset 1024 of B's region.
const WIN_OFF: u64 = 1024;
const WIN_LEN: u64 = 1024;

fn open(d: u8) -> Device {
    let mut cfg = DeviceConfig::new(IpAddr::V4(Ipv4Addr::new(127, 0, 23, d)));
    cfg.port = 0;
    Device::open(cfg).expect("opening a loopback device")
}

struct End {
    pd: Pd,
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    mr: Mr,
}

fn end(dev: &Device, access: AccessFlags) -> End {
    let pd = dev.alloc_pd();
    let scq = dev.create_cq(64, None).unwrap();
    let rcq = dev.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &scq, &rcq)).unwrap();
    let mr = pd.reg_mr(LEN, access).unwrap();
    End {
        pd,
        qp,
        scq,
        rcq,
        mr,
    }
}

/// A (plain local region) connected to B (a region windows may be bound to, no remote
/// rights of its own).
fn pair() -> (Device, Device, End, End) {
    let (da, db) = (open(1), open(2));
    let a = end(&da, AccessFlags::LOCAL_WRITE);
    let b = end(&db, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND);
    assert_eq!(b.mr.rkey(), None);
    let mut p = ConnectParams::new(Mtu::Mtu1024, Psn::new(100));
    p.max_rd_atomic = 4;
    p.max_dest_rd_atomic = 4;
    p.retry_cnt = 2;
    a.qp.connect(&remote(&db, b.qp.qpn(), 100), &p).unwrap();
    b.qp.connect(&remote(&da, a.qp.qpn(), 100), &p).unwrap();
    (da, db, a, b)
}

fn wait(cq: &Cq, what: &str) -> Wc {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} completion within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn sges(mr: &Mr, off: u64, len: u32) -> SgeList {
    SgeList::one(srdma::Sge {
        addr: mr.addr() + off,
        length: len,
        lkey: mr.lkey(),
    })
}

/// A WRITEs `len` bytes of 0x5A to `addr` under `rkey`; the completion's status.
fn write(a: &End, rkey: RKey, addr: u64, len: u32) -> WcStatus {
    a.mr.write(0, &vec![0x5A; len as usize]).unwrap();
    let op = SendOp::Write {
        remote_addr: addr,
        rkey,
    };
    a.qp.post_send(SendWr::new(1, op, sges(&a.mr, 0, len)))
        .unwrap();
    let wc = wait(&a.scq, "WRITE");
    assert_eq!(wc.wr_id, 1);
    wc.status
}

/// B binds a type 2 window over its region's [WIN_OFF, WIN_OFF + WIN_LEN) with `access`.
fn bind_type2(b: &End, access: AccessFlags) -> (Mw, RKey) {
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let rkey = srdma::inc_rkey(mw.rkey());
    let bind = MwBind {
        mw_rkey: mw.rkey(),
        rkey,
        mr_lkey: b.mr.lkey(),
        addr: b.mr.addr() + WIN_OFF,
        len: WIN_LEN,
        access,
    };
    b.qp.post_send(SendWr::new(7, SendOp::BindMw(bind), SgeList::new()))
        .unwrap();
    let wc = wait(&b.scq, "bind");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey(), rkey);
    assert_eq!(mw.info().unwrap().state, MwState::Valid);
    (mw, rkey)
}

#[test]
fn type1_window_grants_write_and_read_until_unbound() {
    let (_da, _db, a, b) = pair();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let win = b.mr.addr() + WIN_OFF;
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let rkey =
        b.qp.bind_mw(
            &mw,
            &MwBindInfo {
                mr: Some(&b.mr),
                addr: win,
                len: WIN_LEN,
                access: rw,
            },
            3,
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!(rkey, srdma::inc_rkey(RKey(mw.alloc_rkey().0)));
    let wc = wait(&b.scq, "bind");
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(b.mr.bound_windows(), 1);

    assert_eq!(write(&a, rkey, win + 8, 100), WcStatus::Success);
    let mut got = vec![0u8; LEN];
    b.mr.read(0, &mut got).unwrap();
    assert!(got[1032..1132].iter().all(|&x| x == 0x5A));
    assert!(got[..1032].iter().chain(&got[1132..]).all(|&x| x == 0));

    // READ it back into A's region at offset 4096.
    b.mr.write(1024, &[0x77; 64]).unwrap();
    let op = SendOp::Read {
        remote_addr: win,
        rkey,
    };
    a.qp.post_send(SendWr::new(2, op, sges(&a.mr, 4096, 64)))
        .unwrap();
    assert_eq!(wait(&a.scq, "READ").status, WcStatus::Success);
    let mut back = [0u8; 64];
    a.mr.read(4096, &mut back).unwrap();
    assert_eq!(back, [0x77; 64]);

    // Unbind (a bind of length 0): the key is dead.
    let rkey2 =
        b.qp.bind_mw(
            &mw,
            &MwBindInfo {
                mr: None,
                addr: 0,
                len: 0,
                access: AccessFlags::empty(),
            },
            4,
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert_ne!(rkey2, rkey);
    assert_eq!(wait(&b.scq, "unbind").status, WcStatus::Success);
    assert_eq!(b.mr.bound_windows(), 0);
    assert_eq!(write(&a, rkey, win, 8), WcStatus::RemAccessErr);
}

#[test]
fn wrong_window_key_and_out_of_window_are_remote_access_errors() {
    let (_da, _db, a, b) = pair();
    let (_mw, rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    let win = b.mr.addr() + WIN_OFF;
    assert_eq!(
        write(&a, RKey(rkey.0 ^ 0x40), win, 8),
        WcStatus::RemAccessErr
    );
    // The QP is in ERR after the error: a fresh pair for the next case.
    let (_da, _db, a, b) = pair();
    let (_mw, rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    let win = b.mr.addr() + WIN_OFF;
    assert_eq!(
        write(&a, rkey, win + WIN_LEN - 4, 8),
        WcStatus::RemAccessErr
    );
    // And rights: a READ through a write-only window.
    let (_da, _db, a, b) = pair();
    let (_mw, rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    let op = SendOp::Read {
        remote_addr: b.mr.addr() + WIN_OFF,
        rkey,
    };
    a.qp.post_send(SendWr::new(2, op, sges(&a.mr, 0, 8)))
        .unwrap();
    assert_eq!(wait(&a.scq, "READ").status, WcStatus::RemAccessErr);
}

#[test]
fn local_invalidate_then_use_fails() {
    let (_da, _db, a, b) = pair();
    let (mw, rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    let win = b.mr.addr() + WIN_OFF;
    assert_eq!(write(&a, rkey, win, 8), WcStatus::Success);
    b.qp.post_send(SendWr::new(9, SendOp::LocalInv { rkey }, SgeList::new()))
        .unwrap();
    let wc = wait(&b.scq, "local invalidate");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(mw.info().unwrap().state, MwState::Free);
    assert_eq!(b.mr.bound_windows(), 0);
    assert_eq!(write(&a, rkey, win, 8), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_then_use_fails() {
    let (_da, _db, a, b) = pair();
    let (_mw, rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    let win = b.mr.addr() + WIN_OFF;
    b.qp.post_recv(RecvWr {
        wr_id: 5,
        sges: sges(&b.mr, 4096, 64),
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        6,
        SendOp::SendWithInv { rkey },
        sges(&a.mr, 0, 16),
    ))
    .unwrap();
    let wc = wait(&a.scq, "SEND with invalidate");
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
    let wc = wait(&b.rcq, "receive");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (5, WcStatus::Success, WcOpcode::Recv, 16)
    );
    assert!(wc.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(wc.invalidated_rkey, Some(rkey));
    assert_eq!(write(&a, rkey, win, 8), WcStatus::RemAccessErr);
}

#[test]
fn deallocated_window_key_fails() {
    let (_da, _db, a, b) = pair();
    let (mw, rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    assert_eq!(b.mr.bound_windows(), 1);
    drop(mw);
    assert_eq!(b.mr.bound_windows(), 0);
    assert_eq!(
        write(&a, rkey, b.mr.addr() + WIN_OFF, 8),
        WcStatus::RemAccessErr
    );
}

#[test]
fn bind_behind_a_send_completes_after_it() {
    let (_da, _db, a, b) = pair();
    a.qp.post_recv(RecvWr {
        wr_id: 50,
        sges: sges(&a.mr, 0, 64),
    })
    .unwrap();
    // B: a SEND, then at once a bind, which must wait for the SEND's ACK and then run
    // without another post or poll of B's send queue to push it.
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let rkey = srdma::inc_rkey(mw.rkey());
    b.qp.post_send(SendWr::new(20, SendOp::Send, sges(&b.mr, 0, 32)))
        .unwrap();
    let bind = MwBind {
        mw_rkey: mw.rkey(),
        rkey,
        mr_lkey: b.mr.lkey(),
        addr: b.mr.addr(),
        len: 64,
        access: AccessFlags::REMOTE_READ,
    };
    b.qp.post_send(SendWr::new(21, SendOp::BindMw(bind), SgeList::new()))
        .unwrap();
    let got: Vec<_> = (0..2)
        .map(|_| {
            let wc = wait(&b.scq, "SEND or bind");
            (wc.wr_id, wc.opcode, wc.status)
        })
        .collect();
    assert_eq!(
        got,
        [
            (20, WcOpcode::Send, WcStatus::Success),
            (21, WcOpcode::BindMw, WcStatus::Success)
        ]
    );
    assert_eq!(wait(&a.rcq, "receive").byte_len, 32);
}

#[test]
fn destroying_the_qp_frees_its_type2_windows() {
    let (_da, _db, _a, b) = pair();
    let (mw, _rkey) = bind_type2(&b, AccessFlags::REMOTE_WRITE);
    assert_eq!(b.mr.bound_windows(), 1);
    let End { qp, mr, .. } = b;
    drop(qp);
    assert_eq!(mw.info().unwrap().state, MwState::Free);
    assert_eq!(mr.bound_windows(), 0);
}
