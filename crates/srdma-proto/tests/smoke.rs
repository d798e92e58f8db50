//! Every operation once over a lossless wire, RC at MTU 1024 with multi-packet messages.

mod common;
use common::*;
use srdma_proto::{Mtu, QpType, SendOp, WcOpcode, WcStatus};

/// SEND (multi-packet), SEND with immediate, WRITE, WRITE with immediate, READ (multi-packet),
/// compare-and-swap and fetch-and-add all move the right bytes and complete once each.
#[test]
fn every_rc_operation_over_a_clean_wire() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.reg(End::A, 0x1000, 8192, 0, all_remote());
    for (i, b) in p.bytes_mut(End::A, &src).iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let dst = p.reg(End::B, 0x10_0000, 8192, 0xEE, all_remote());
    let rb = p.reg(End::B, 0x20_0000, 8192, 0, all_remote());
    p.post_recv(End::B, 100, &[sge(&rb, 0x20_0000, 4000)]);
    p.post_recv(End::B, 101, &[sge(&rb, 0x20_0000 + 4000, 100)]);
    p.post_recv(End::B, 102, &[sge(&rb, 0x20_0000 + 4100, 100)]);

    p.post_send(End::A, send(1, &[sge(&src, 0x1000, 3000)]));
    p.post_send(
        End::A,
        wr(
            2,
            SendOp::SendWithImm { imm: 0xdead_beef },
            &[sge(&src, 0x1000, 10)],
        ),
    );
    let rkey = dst.rkey.unwrap();
    p.post_send(
        End::A,
        wr(
            3,
            SendOp::Write {
                remote_addr: 0x10_0000,
                rkey,
            },
            &[sge(&src, 0x1000, 2500)],
        ),
    );
    p.post_send(
        End::A,
        wr(
            4,
            SendOp::WriteWithImm {
                remote_addr: 0x10_0000 + 4096,
                rkey,
                imm: 7,
            },
            &[sge(&src, 0x1000, 5)],
        ),
    );
    p.post_send(
        End::A,
        wr(
            5,
            SendOp::Read {
                remote_addr: 0x10_0000,
                rkey,
            },
            &[sge(&src, 0x1000 + 4096, 2500)],
        ),
    );
    p.settle();
    p.post_send(
        End::A,
        wr(
            6,
            SendOp::CompareSwap {
                remote_addr: 0x10_0000 + 8000,
                rkey,
                compare: 0xEEEE_EEEE_EEEE_EEEE,
                swap: 42,
            },
            &[sge(&src, 0x1000 + 7000, 8)],
        ),
    );
    p.post_send(
        End::A,
        wr(
            7,
            SendOp::FetchAdd {
                remote_addr: 0x10_0000 + 8000,
                rkey,
                add: 8,
            },
            &[sge(&src, 0x1000 + 7008, 8)],
        ),
    );
    p.settle();

    let a = p.completions(End::A);
    let ids: Vec<_> = a.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        ids,
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::Send),
            (3, WcStatus::Success, WcOpcode::RdmaWrite),
            (4, WcStatus::Success, WcOpcode::RdmaWrite),
            (5, WcStatus::Success, WcOpcode::RdmaRead),
            (6, WcStatus::Success, WcOpcode::CompSwap),
            (7, WcStatus::Success, WcOpcode::FetchAdd),
        ]
    );
    let b = p.completions(End::B);
    assert_eq!(b.len(), 3, "{b:?}");
    assert_eq!(
        (b[0].wr_id, b[0].byte_len, b[0].opcode),
        (100, 3000, WcOpcode::Recv)
    );
    assert_eq!(
        (b[1].wr_id, b[1].byte_len, b[1].imm_data),
        (101, 10, Some(0xdead_beef))
    );
    assert_eq!(
        (b[2].wr_id, b[2].opcode, b[2].imm_data, b[2].byte_len),
        (102, WcOpcode::RecvRdmaWithImm, Some(7), 5)
    );

    let pattern: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
    assert_eq!(&p.bytes(End::B, &rb)[..3000], &pattern[..]);
    assert_eq!(&p.bytes(End::B, &dst)[..2500], &pattern[..2500]);
    assert_eq!(&p.bytes(End::B, &dst)[2500..4096], &[0xEE; 1596][..]);
    assert_eq!(&p.bytes(End::B, &dst)[4096..4101], &pattern[..5]);
    assert_eq!(
        &p.bytes(End::A, &src)[4096..4096 + 2500],
        &pattern[..2500],
        "READ brought back what WRITE put"
    );
    let word = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!(
        word(p.bytes(End::A, &src), 7000),
        0xEEEE_EEEE_EEEE_EEEE,
        "CAS returns the original"
    );
    assert_eq!(
        word(p.bytes(End::A, &src), 7008),
        42,
        "FADD returns the value CAS stored"
    );
    assert_eq!(word(p.bytes(End::B, &dst), 8000), 50);
}
