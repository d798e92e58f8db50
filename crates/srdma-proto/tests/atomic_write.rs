//! RDMA ATOMIC WRITE (IBTA 1.5, opcode 0x1D): the request on the wire, the responder's
//! checks (REMOTE_WRITE, alignment, length) and the completions, as Linux rxe >= 6.2.

mod common;
use common::*;
use srdma_proto::{AccessFlags, Mtu, PostError, QpType, SendOp, WcOpcode, WcStatus};
use srdma_wire::{NakCode, Opcode, Syndrome};

const DATA: [u8; 8] = *b"atomic!!";

fn atomic_write(wr_id: u64, remote_addr: u64, rkey: srdma_proto::RKey) -> srdma_proto::SendWr {
    wr(
        wr_id,
        SendOp::AtomicWrite {
            remote_addr,
            rkey,
            data: DATA,
        },
        &[],
    )
}

#[test]
fn atomic_write_stores_eight_bytes_and_completes_on_the_ack() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let dst = p.reg(End::B, 0x10_0000, 64, 0xEE, all_remote());
    p.post_send(End::A, atomic_write(9, 0x10_0008, dst.rkey.unwrap()));
    p.settle();

    let a = p.completions(End::A);
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(
        (a[0].wr_id, a[0].status, a[0].opcode),
        (9, WcStatus::Success, WcOpcode::AtomicWrite)
    );
    assert!(p.completions(End::B).is_empty(), "no receive completion");
    let b = p.bytes(End::B, &dst);
    assert_eq!(&b[8..16], &DATA);
    assert_eq!(&b[..8], &[0xEE; 8]);
    assert_eq!(&b[16..], &[0xEE; 48]);

    // One request: RETH (va, rkey, DMA length 8), ACK requested, the 8 bytes as payload;
    // one plain ACK back.
    let sent = p.sent();
    let req: Vec<_> = sent.iter().filter(|s| s.from == End::A).collect();
    assert_eq!(req.len(), 1, "{}", p.trace());
    let r = &req[0].pkt;
    assert_eq!(r.bth.opcode, Opcode::RcAtomicWrite);
    assert!(r.bth.ack_req);
    let reth = r.reth.unwrap();
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (0x10_0008, dst.rkey.unwrap().0, 8)
    );
    assert_eq!(r.payload, &DATA);
    let acks: Vec<_> = sent.iter().filter(|s| s.from == End::B).collect();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0].pkt.bth.opcode, Opcode::RcAcknowledge);
    assert_eq!(acks[0].pkt.bth.psn, r.bth.psn);
    assert_eq!(acks[0].pkt.aeth.unwrap().syndrome, Syndrome::ACK);
}

fn nak_of(p: &Pair) -> Option<Syndrome> {
    p.sent_by(End::B)
        .iter()
        .find_map(|s| s.pkt.aeth.map(|a| a.syndrome))
}

#[test]
fn misaligned_atomic_write_is_nak_invalid_request() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let dst = p.reg(End::B, 0x10_0000, 64, 0xEE, all_remote());
    p.post_send(End::A, atomic_write(1, 0x10_0004, dst.rkey.unwrap()));
    p.settle();
    let a = p.completions(End::A);
    assert_eq!(a[0].status, WcStatus::RemInvReqErr, "{a:?}");
    assert_eq!(nak_of(&p), Some(Syndrome::Nak(NakCode::InvalidRequest)));
    assert_eq!(p.bytes(End::B, &dst), &[0xEE; 64][..], "nothing stored");
}

#[test]
fn atomic_write_needs_remote_write_on_the_mr() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    // REMOTE_ATOMIC alone is not enough: ATOMIC WRITE is checked as a WRITE.
    let dst = p.reg(
        End::B,
        0x10_0000,
        64,
        0xEE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    );
    p.post_send(End::A, atomic_write(1, 0x10_0000, dst.rkey.unwrap()));
    p.settle();
    let a = p.completions(End::A);
    assert_eq!(a[0].status, WcStatus::RemAccessErr, "{a:?}");
    assert_eq!(nak_of(&p), Some(Syndrome::Nak(NakCode::RemoteAccessError)));
    assert_eq!(p.bytes(End::B, &dst), &[0xEE; 64][..]);
}

#[test]
fn atomic_write_past_the_region_is_an_access_error() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let dst = p.reg(End::B, 0x10_0000, 64, 0xEE, all_remote());
    p.post_send(End::A, atomic_write(1, 0x10_0040, dst.rkey.unwrap()));
    p.settle();
    assert_eq!(p.completions(End::A)[0].status, WcStatus::RemAccessErr);
}

#[test]
fn atomic_write_needs_remote_write_on_the_qp() {
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, |a| {
        a.qp_access_flags = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    });
    let dst = p.reg(End::B, 0x10_0000, 64, 0xEE, all_remote());
    p.post_send(End::A, atomic_write(1, 0x10_0000, dst.rkey.unwrap()));
    p.settle();
    assert_eq!(p.completions(End::A)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(p.bytes(End::B, &dst), &[0xEE; 64][..]);
}

#[test]
fn a_wrong_length_atomic_write_is_nak_invalid_request() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let dst = p.reg(End::B, 0x10_0000, 64, 0xEE, all_remote());
    let rkey = dst.rkey.unwrap();
    // A 4-byte payload, crafted: the opcode's rule is exactly 8.
    let bth = srdma_wire::BthRepr {
        opcode: Opcode::RcAtomicWrite,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: srdma_wire::bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn: srdma_wire::Qpn::new(0x22),
        ack_req: true,
        psn: srdma_wire::Psn::new(PSN_A),
    };
    let mut r = srdma_wire::PacketRepr::new(bth, &[1, 2, 3, 4]);
    r.reth = Some(srdma_wire::RethRepr {
        va: 0x10_0000,
        rkey: rkey.0,
        dma_len: 8,
    });
    p.inject(End::A, &r);
    p.pump();
    assert_eq!(nak_of(&p), Some(Syndrome::Nak(NakCode::InvalidRequest)));
    assert_eq!(p.bytes(End::B, &dst), &[0xEE; 64][..]);
}

#[test]
fn a_duplicate_atomic_write_is_acked_not_executed_again() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let dst = p.reg(End::B, 0x10_0000, 64, 0, all_remote());
    let rkey = dst.rkey.unwrap();
    p.post_send(End::A, atomic_write(1, 0x10_0000, rkey));
    p.settle();
    // The application on B overwrites the word; a replay of the request must not undo that.
    p.bytes_mut(End::B, &dst)[..8].copy_from_slice(&[7; 8]);
    let req = p.sent_by(End::A)[0].pkt;
    let bytes = craft(&req);
    let again = srdma_wire::PacketRepr::parse_bytes(&bytes).unwrap();
    let before = p.sent_by(End::B).len();
    p.inject(End::A, &again);
    p.pump();
    assert_eq!(&p.bytes(End::B, &dst)[..8], &[7; 8]);
    let acks = p.sent_by(End::B);
    assert_eq!(acks.len(), before + 1, "{}", p.trace());
    assert_eq!(
        acks.last().unwrap().pkt.aeth.unwrap().syndrome,
        Syndrome::ACK
    );
}

#[test]
fn atomic_write_is_rc_only() {
    for ty in [QpType::Uc, QpType::Ud] {
        let mut p = Pair::new(ty, Mtu::Mtu1024);
        let err = p
            .side(End::A)
            .qp
            .post_send(atomic_write(1, 0, srdma_proto::RKey(1)))
            .unwrap_err();
        assert!(
            matches!(err, PostError::UnsupportedOp { .. }),
            "{ty:?}: {err}"
        );
    }
}

#[test]
fn atomic_write_needs_a_responder_resource() {
    let mut p = Pair::with(QpType::Rc, Mtu::Mtu1024, |a| a.max_dest_rd_atomic = 0);
    let dst = p.reg(End::B, 0x10_0000, 64, 0xEE, all_remote());
    p.post_send(End::A, atomic_write(1, 0x10_0000, dst.rkey.unwrap()));
    p.settle();
    assert_eq!(p.completions(End::A)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(nak_of(&p), Some(Syndrome::Nak(NakCode::InvalidRequest)));
    assert_eq!(p.bytes(End::B, &dst), &[0xEE; 64][..]);
}
