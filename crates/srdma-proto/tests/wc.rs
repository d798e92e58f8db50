//! The completion model: numbering and strings as rdma-core's `verbs.h` / `enum_strs.c`.

use srdma_proto::{RKey, SendFlags, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode};
use srdma_wire::Qpn;

#[test]
fn wc_status_numbers_and_strings() {
    let expected = [
        (0, "success"),
        (1, "local length error"),
        (2, "local QP operation error"),
        (3, "local EE context operation error"),
        (4, "local protection error"),
        (5, "Work Request Flushed Error"),
        (6, "memory management operation error"),
        (7, "bad response error"),
        (8, "local access error"),
        (9, "remote invalid request error"),
        (10, "remote access error"),
        (11, "remote operation error"),
        (12, "transport retry counter exceeded"),
        (13, "RNR retry counter exceeded"),
        (14, "local RDD violation error"),
        (15, "remote invalid RD request"),
        (16, "aborted error"),
        (17, "invalid EE context number"),
        (18, "invalid EE context state"),
        (19, "fatal error"),
        (20, "response timeout error"),
        (21, "general error"),
        (22, "TM error"),
        (23, "TM software rendezvous"),
    ];
    for (n, text) in expected {
        let s = WcStatus::from_u32(n).unwrap();
        assert_eq!(s.as_u32(), n);
        assert_eq!(s.name(), text);
        assert_eq!(s.to_string(), text);
    }
    assert_eq!(WcStatus::RetryExcErr as u32, 12);
    assert_eq!(WcStatus::WrFlushErr as u32, 5);
    assert_eq!(WcStatus::from_u32(24), None);
    assert!(WcStatus::Success.is_success());
    assert!(!WcStatus::RemAccessErr.is_success());
}

#[test]
fn wc_opcode_numbers() {
    let expected = [
        (WcOpcode::Send, 0),
        (WcOpcode::RdmaWrite, 1),
        (WcOpcode::RdmaRead, 2),
        (WcOpcode::CompSwap, 3),
        (WcOpcode::FetchAdd, 4),
        (WcOpcode::BindMw, 5),
        (WcOpcode::LocalInv, 6),
        (WcOpcode::Tso, 7),
        (WcOpcode::Flush, 8),
        (WcOpcode::AtomicWrite, 9),
        (WcOpcode::Recv, 128),
        (WcOpcode::RecvRdmaWithImm, 129),
    ];
    for (op, n) in expected {
        assert_eq!(op as u32, n);
        assert_eq!(WcOpcode::from_u32(n), Some(op));
        assert_eq!(op.is_recv(), n >= 128);
    }
    assert_eq!(WcOpcode::from_u32(10), None);
    assert_eq!(WcOpcode::from_u32(130), None);
}

#[test]
fn wr_opcode_numbers_and_completion_opcodes() {
    let expected = [
        (WrOpcode::RdmaWrite, 0, Some(WcOpcode::RdmaWrite)),
        (WrOpcode::RdmaWriteWithImm, 1, Some(WcOpcode::RdmaWrite)),
        (WrOpcode::Send, 2, Some(WcOpcode::Send)),
        (WrOpcode::SendWithImm, 3, Some(WcOpcode::Send)),
        (WrOpcode::RdmaRead, 4, Some(WcOpcode::RdmaRead)),
        (WrOpcode::AtomicCmpAndSwp, 5, Some(WcOpcode::CompSwap)),
        (WrOpcode::AtomicFetchAndAdd, 6, Some(WcOpcode::FetchAdd)),
        (WrOpcode::LocalInv, 7, Some(WcOpcode::LocalInv)),
        (WrOpcode::BindMw, 8, Some(WcOpcode::BindMw)),
        (WrOpcode::SendWithInv, 9, Some(WcOpcode::Send)),
        (WrOpcode::Tso, 10, Some(WcOpcode::Tso)),
        (WrOpcode::Driver1, 11, None),
        (WrOpcode::Flush, 14, Some(WcOpcode::Flush)),
        (WrOpcode::AtomicWrite, 15, Some(WcOpcode::AtomicWrite)),
    ];
    for (op, n, wc) in expected {
        assert_eq!(op as u32, n);
        assert_eq!(WrOpcode::from_u32(n), Some(op));
        assert_eq!(op.wc_opcode(), wc);
    }
    assert_eq!(WrOpcode::from_u32(12), None);
    assert_eq!(WrOpcode::from_u32(13), None);
}

#[test]
fn flag_bits() {
    assert_eq!(WcFlags::GRH.bits(), 1);
    assert_eq!(WcFlags::WITH_IMM.bits(), 2);
    assert_eq!(WcFlags::IP_CSUM_OK.bits(), 4);
    assert_eq!(WcFlags::WITH_INV.bits(), 8);
    assert_eq!(SendFlags::FENCE.bits(), 1);
    assert_eq!(SendFlags::SIGNALED.bits(), 2);
    assert_eq!(SendFlags::SOLICITED.bits(), 4);
    assert_eq!(SendFlags::INLINE.bits(), 8);
    assert_eq!(SendFlags::IP_CSUM.bits(), 16);
}

#[test]
fn wc_builders_keep_imm_and_inv_exclusive() {
    let qp = Qpn::new(0x11);
    let wc = Wc::new(7, WcStatus::Success, WcOpcode::Recv, qp)
        .with_byte_len(40 + 12)
        .with_flags(WcFlags::GRH)
        .with_imm(0x1234_5678)
        .with_src_qp(Qpn::new(0x22));
    assert_eq!(wc.imm_data, Some(0x1234_5678));
    assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
    assert_eq!((wc.byte_len, wc.src_qp, wc.slid), (52, Qpn::new(0x22), 0));
    assert!(wc.is_success());

    let inv = wc.with_invalidated_rkey(RKey(0xABCD));
    assert_eq!(inv.imm_data, None);
    assert_eq!(inv.invalidated_rkey, Some(RKey(0xABCD)));
    assert_eq!(inv.wc_flags, WcFlags::GRH | WcFlags::WITH_INV);

    let f = Wc::flushed(9, WcOpcode::RdmaWrite, qp);
    assert_eq!(f.status, WcStatus::WrFlushErr);
    assert!(!f.is_success());
}
