//! XRC over loopback UDP: an initiator on one device sends to a target QP on another; the
//! message lands in the XRC SRQ its XRCETH names and completes on that SRQ's CQ. A request
//! naming an SRQ of another XRC domain is refused (NAK invalid request).

use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, AttrMask, ConnectParams, Cq, Mtu, Qp, QpAttr, QpInit, QpState, QpType, RecvWr,
    SendOp, SendWr, SgeList, Wc, WcOpcode, WcStatus, XrcRole,
};
use srdma_wire::Psn;

mod common;
use common::{loopback, remote};

/// RESET → INIT, as an application does after `ibv_create_qp_ex`.
fn to_init(qp: &Qp) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
}

fn wait_one(cq: &Cq) -> Wc {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(Instant::now() < end, "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn xrc_send_lands_in_the_named_srq_of_the_targets_domain() {
    let (da, db) = (loopback(), loopback());
    let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    let cqa = da.create_cq(64, None).unwrap();
    let ini = pa
        .create_xrc_send_qp(&QpInit::new(QpType::Rc, &cqa, &cqa))
        .unwrap();
    assert_eq!(ini.xrc_role(), Some(XrcRole::Initiator));
    to_init(&ini);

    let xrcd = db.open_xrcd().unwrap();
    let other = db.open_xrcd().unwrap();
    let cqb = db.create_cq(64, None).unwrap();
    let cq_other = db.create_cq(64, None).unwrap();
    let srq = pb.create_xrc_srq(&xrcd, &cqb, 16, 1).unwrap();
    let srq_other = pb.create_xrc_srq(&other, &cq_other, 16, 1).unwrap();
    assert_ne!(srq.number(), srq_other.number());
    let tgt = xrcd.create_target_qp(AccessFlags::empty()).unwrap();
    assert_eq!(tgt.xrc_role(), Some(XrcRole::Target));
    to_init(&tgt);

    let params = |psn| ConnectParams::new(Mtu::Mtu1024, Psn::new(psn));
    ini.connect(&remote(&db, tgt.qpn(), 200), &params(100))
        .unwrap();
    tgt.connect(&remote(&da, ini.qpn(), 100), &params(200))
        .unwrap();

    let src = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let msg: Vec<u8> = (0..3000).map(|i| (i % 241) as u8).collect();
    src.write(0, &msg).unwrap();
    let dst = pb.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    srq.post_recv(RecvWr {
        wr_id: 55,
        sges: SgeList::one(dst.sge(0, 4096)),
    })
    .unwrap();
    srq_other
        .post_recv(RecvWr {
            wr_id: 66,
            sges: SgeList::one(dst.sge(0, 4096)),
        })
        .unwrap();

    // A WR without an SRQ number is refused at once.
    assert!(
        ini.post_send(SendWr::new(1, SendOp::Send, SgeList::one(src.sge(0, 8))))
            .is_err()
    );
    let mut wr = SendWr::new(2, SendOp::Send, SgeList::one(src.sge(0, 3000)));
    wr.xrc_srqn = Some(srq.number());
    ini.post_send(wr).unwrap();
    let s = wait_one(&cqa);
    assert_eq!((s.wr_id, s.status), (2, WcStatus::Success));
    let r = wait_one(&cqb);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.qp_num),
        (55, WcStatus::Success, WcOpcode::Recv, 3000, tgt.qpn())
    );
    let mut got = vec![0u8; 3000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, msg);

    // An SRQ of another domain: refused, the initiator sees the NAK; the SRQ keeps its WQE.
    let mut wr = SendWr::new(3, SendOp::Send, SgeList::one(src.sge(0, 8)));
    wr.xrc_srqn = Some(srq_other.number());
    ini.post_send(wr).unwrap();
    let s = wait_one(&cqa);
    assert_eq!((s.wr_id, s.status), (3, WcStatus::RemInvReqErr));
    assert!(cq_other.poll_one().is_none());
    assert_eq!(srq_other.len(), 1);
    assert_eq!(tgt.state(), QpState::Err);
}
