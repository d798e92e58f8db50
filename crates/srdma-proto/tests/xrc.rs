//! XRC: an initiator (XRC_SEND) and a target (XRC_RECV) whose requests land in the XRC SRQ
//! their XRCETH names; the wire carries the XRC opcode twins (RC + 0xA0).

mod common;
use common::*;
use srdma_proto::{Mtu, PostError, QpType, SendOp, SendWr, WcOpcode, WcStatus, XrcRole};
use srdma_wire::{NakCode, Opcode, Syndrome};

const SRQN: u32 = 0x00_0123;

/// A is the initiator; B the target, with an SRQ (`with_srq`) or none.
fn xrc_pair(with_srq: bool) -> Pair {
    let mut p = Pair::with_config(
        QpType::Rc,
        Mtu::Mtu1024,
        |end, cfg| cfg.uses_srq = end == End::B,
        |_| {},
    );
    if !with_srq {
        p.b.srq = None;
    }
    p.a.qp.set_xrc(XrcRole::Initiator);
    p.b.qp.set_xrc(XrcRole::Target);
    p
}

fn to_srq(mut wr: SendWr) -> SendWr {
    wr.xrc_srqn = Some(SRQN);
    wr
}

#[test]
fn xrc_send_lands_in_the_srq_and_is_acked_with_xrc_opcodes() {
    let mut p = xrc_pair(true);
    let src = p.reg(End::A, 0x1000, 4096, 0, all_remote());
    for (i, b) in p.bytes_mut(End::A, &src).iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let rb = p.reg(End::B, 0x9000, 4096, 0, all_remote());
    p.post_srq_recv(End::B, 77, &[sge(&rb, 0x9000, 4096)]);
    // Three packets at MTU 1024, with immediate data.
    p.post_send(
        End::A,
        to_srq(wr(
            1,
            SendOp::SendWithImm { imm: 0x1234 },
            &[sge(&src, 0x1000, 2500)],
        )),
    );
    p.settle();

    let a = p.completions(End::A);
    assert_eq!(
        a.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );
    let b = p.completions(End::B);
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(
        (
            b[0].wr_id,
            b[0].status,
            b[0].opcode,
            b[0].byte_len,
            b[0].imm_data
        ),
        (77, WcStatus::Success, WcOpcode::Recv, 2500, Some(0x1234))
    );
    let pattern: Vec<u8> = (0..2500).map(|i| (i % 253) as u8).collect();
    assert_eq!(&p.bytes(End::B, &rb)[..2500], &pattern[..]);

    let ops: Vec<_> = p.sent_by(End::A).iter().map(|s| s.pkt.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::XrcSendFirst,
            Opcode::XrcSendMiddle,
            Opcode::XrcSendLastWithImmediate
        ],
        "{}",
        p.trace()
    );
    assert!(p.sent_by(End::A).iter().all(|s| s.pkt.xrceth == Some(SRQN)));
    let acks = p.sent_by(End::B);
    assert!(!acks.is_empty());
    assert!(
        acks.iter()
            .all(|s| s.pkt.bth.opcode == Opcode::XrcAcknowledge && s.pkt.xrceth.is_none()),
        "{}",
        p.trace()
    );
}

#[test]
fn xrc_atomics_read_and_write_use_the_target_memory() {
    let mut p = xrc_pair(true);
    let local = p.reg(End::A, 0x1000, 4096, 0, all_remote());
    let remote = p.reg(End::B, 0x8000, 4096, 0, all_remote());
    p.bytes_mut(End::B, &remote)[..8].copy_from_slice(&5u64.to_ne_bytes());
    p.bytes_mut(End::A, &local)[0x200..0x208].copy_from_slice(&42u64.to_ne_bytes());
    let rkey = remote.rkey.unwrap();
    p.post_send(
        End::A,
        to_srq(wr(
            1,
            SendOp::FetchAdd {
                remote_addr: 0x8000,
                rkey,
                add: 2,
            },
            &[sge(&local, 0x1000, 8)],
        )),
    );
    p.post_send(
        End::A,
        to_srq(wr(
            2,
            SendOp::CompareSwap {
                remote_addr: 0x8000,
                rkey,
                compare: 7,
                swap: 9,
            },
            &[sge(&local, 0x1008, 8)],
        )),
    );
    p.post_send(
        End::A,
        to_srq(wr(
            3,
            SendOp::Write {
                remote_addr: 0x8100,
                rkey,
            },
            &[sge(&local, 0x1200, 16)],
        )),
    );
    p.post_send(
        End::A,
        to_srq(wr(
            4,
            SendOp::Read {
                remote_addr: 0x8000,
                rkey,
            },
            &[sge(&local, 0x1800, 2048)],
        )),
    );
    p.settle();
    let a = p.completions(End::A);
    assert_eq!(
        a.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, WcOpcode::FetchAdd),
            (2, WcStatus::Success, WcOpcode::CompSwap),
            (3, WcStatus::Success, WcOpcode::RdmaWrite),
            (4, WcStatus::Success, WcOpcode::RdmaRead),
        ],
        "{}",
        p.trace()
    );
    let word = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!(word(p.bytes(End::A, &local), 0), 5, "fetch-add original");
    assert_eq!(word(p.bytes(End::A, &local), 8), 7, "compare-swap original");
    assert_eq!(word(p.bytes(End::B, &remote), 0), 9);
    assert_eq!(word(p.bytes(End::B, &remote), 0x100), 42);
    assert_eq!(&p.bytes(End::A, &local)[0x800..0x808], &9u64.to_ne_bytes());
    assert!(p.completions(End::B).is_empty());
    let b_ops: Vec<_> = p.sent_by(End::B).iter().map(|s| s.pkt.bth.opcode).collect();
    assert!(b_ops.contains(&Opcode::XrcAtomicAcknowledge), "{b_ops:?}");
    assert!(
        b_ops.contains(&Opcode::XrcRdmaReadResponseFirst),
        "{b_ops:?}"
    );
    assert!(
        b_ops.contains(&Opcode::XrcRdmaReadResponseLast),
        "{b_ops:?}"
    );
    let a_ops: Vec<_> = p.sent_by(End::A).iter().map(|s| s.pkt.bth.opcode).collect();
    assert_eq!(
        a_ops,
        [
            Opcode::XrcFetchAdd,
            Opcode::XrcCompareSwap,
            Opcode::XrcRdmaWriteOnly,
            Opcode::XrcRdmaReadRequest
        ]
    );
}

#[test]
fn a_request_naming_no_srq_is_nak_invalid_request() {
    let mut p = xrc_pair(false);
    let src = p.reg(End::A, 0x1000, 64, 0, all_remote());
    p.post_send(End::A, to_srq(send(1, &[sge(&src, 0x1000, 8)])));
    p.settle();
    let a = p.completions(End::A);
    assert_eq!(a[0].status, WcStatus::RemInvReqErr, "{a:?}");
    let nak = p.sent_by(End::B)[0].pkt;
    assert_eq!(nak.bth.opcode, Opcode::XrcAcknowledge);
    assert_eq!(
        nak.aeth.unwrap().syndrome,
        Syndrome::Nak(NakCode::InvalidRequest)
    );
}

#[test]
fn xrc_post_send_rules() {
    let mut p = xrc_pair(true);
    let src = p.reg(End::A, 0x1000, 64, 0, all_remote());
    // No SRQ number.
    let e =
        p.a.qp
            .post_send(send(1, &[sge(&src, 0x1000, 8)]))
            .unwrap_err();
    assert!(matches!(e, PostError::BadDestination), "{e}");
    // ATOMIC WRITE has no XRC opcode.
    let e =
        p.a.qp
            .post_send(to_srq(wr(
                2,
                SendOp::AtomicWrite {
                    remote_addr: 0,
                    rkey: srdma_proto::RKey(1),
                    data: [0; 8],
                },
                &[],
            )))
            .unwrap_err();
    assert!(matches!(e, PostError::UnsupportedOp { .. }), "{e}");
    // The target has no send queue.
    let e = p.b.qp.post_send(to_srq(send(3, &[]))).unwrap_err();
    assert!(matches!(e, PostError::UnsupportedOp { .. }), "{e}");
    assert_eq!(p.a.qp.xrc(), Some(XrcRole::Initiator));
    assert_eq!(p.b.qp.xrc(), Some(XrcRole::Target));
}

fn bth(opcode: Opcode, dest: u32) -> srdma_wire::BthRepr {
    srdma_wire::BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: srdma_wire::bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn: srdma_wire::Qpn::new(dest),
        ack_req: true,
        psn: srdma_wire::Psn::new(PSN_A),
    }
}

#[test]
fn rc_opcodes_do_not_reach_an_xrc_target_nor_xrc_ones_an_rc_qp() {
    // An RC SEND into the XRC target: dropped, nothing answered, nothing received.
    let mut p = xrc_pair(true);
    let rb = p.reg(End::B, 0x9000, 64, 0, all_remote());
    p.post_srq_recv(End::B, 5, &[sge(&rb, 0x9000, 64)]);
    p.inject(
        End::A,
        &srdma_wire::PacketRepr::new(bth(Opcode::RcSendOnly, 0x22), b"abcd"),
    );
    p.pump();
    assert!(p.sent_by(End::B).is_empty(), "{}", p.trace());
    assert!(p.completions(End::B).is_empty());
    // The same as XRC is taken.
    let mut x = srdma_wire::PacketRepr::new(bth(Opcode::XrcSendOnly, 0x22), b"abcd");
    x.xrceth = Some(SRQN);
    p.inject(End::A, &x);
    p.pump();
    assert_eq!(p.completions(End::B).len(), 1);

    // An XRC SEND into a plain RC QP: dropped.
    let mut q = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let rb = q.reg(End::B, 0x9000, 64, 0, all_remote());
    q.post_recv(End::B, 5, &[sge(&rb, 0x9000, 64)]);
    q.inject(End::A, &x);
    q.pump();
    assert!(q.sent_by(End::B).is_empty(), "{}", q.trace());
    assert!(q.completions(End::B).is_empty());
}

/// A QP of `role` in RESET.
fn lone(role: Option<XrcRole>) -> srdma_proto::Qp {
    let cfg = srdma_proto::QpConfig {
        qpn: srdma_wire::Qpn::new(0x33),
        qp_type: QpType::Rc,
        pd: srdma_proto::PdId(1),
        caps: caps(),
        sq_sig_all: false,
        uses_srq: false,
        port_mtu: Mtu::Mtu1024,
    };
    let mut qp = srdma_proto::Qp::new(cfg, &srdma_proto::DeviceLimits::default()).unwrap();
    if let Some(r) = role {
        qp.set_xrc(r);
    }
    qp
}

#[test]
fn xrc_modify_rules_follow_the_kernels_qp_state_table() {
    use srdma_proto::{AttrMask as M, QpAttr, QpState};
    let limits = srdma_proto::DeviceLimits::default();
    let attr = |s| QpAttr {
        qp_state: s,
        port_num: 1,
        ah_attr: srdma_proto::AhAttr {
            dgid: gid("10.0.0.2".parse().unwrap()),
            ..Default::default()
        },
        ..QpAttr::default()
    };
    let init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    let rtr_ini = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rtr_rc = rtr_ini | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    let rts_tgt = M::STATE | M::TIMEOUT | M::SQ_PSN;
    let rts_rc = rts_tgt | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;

    // The initiator's RTR needs no responder attributes; RC's are still accepted.
    for rtr in [rtr_ini, rtr_rc] {
        let mut q = lone(Some(XrcRole::Initiator));
        q.modify(&attr(QpState::Init), init, &limits).unwrap();
        q.modify(&attr(QpState::Rtr), rtr, &limits).unwrap();
        // Its RTS is RC's.
        assert!(q.modify(&attr(QpState::Rts), rts_tgt, &limits).is_err());
        q.modify(&attr(QpState::Rts), rts_rc, &limits).unwrap();
    }
    // The target's RTS needs only TIMEOUT and SQ_PSN; its RTR is RC's.
    for rts in [rts_tgt, rts_rc] {
        let mut q = lone(Some(XrcRole::Target));
        q.modify(&attr(QpState::Init), init, &limits).unwrap();
        assert!(q.modify(&attr(QpState::Rtr), rtr_ini, &limits).is_err());
        q.modify(&attr(QpState::Rtr), rtr_rc, &limits).unwrap();
        q.modify(&attr(QpState::Rts), rts, &limits).unwrap();
        assert_eq!(q.state(), QpState::Rts);
    }
    // A plain RC QP keeps RC's rules.
    let mut q = lone(None);
    q.modify(&attr(QpState::Init), init, &limits).unwrap();
    assert!(q.modify(&attr(QpState::Rtr), rtr_ini, &limits).is_err());
    q.modify(&attr(QpState::Rtr), rtr_rc, &limits).unwrap();
    assert!(q.modify(&attr(QpState::Rts), rts_tgt, &limits).is_err());
    // What the mask leaves out is not applied: the target keeps its defaults.
    let mut q = lone(Some(XrcRole::Target));
    q.modify(&attr(QpState::Init), init, &limits).unwrap();
    q.modify(&attr(QpState::Rtr), rtr_rc, &limits).unwrap();
    let mut a = attr(QpState::Rts);
    a.retry_cnt = 5;
    q.modify(&a, rts_tgt, &limits).unwrap();
    assert_eq!(q.attr().retry_cnt, QpAttr::default().retry_cnt);
}
