//! UC and UD transport conformance: one test per rule of the unreliable connected and
//! unreliable datagram services, as the IBTA specification (vol. 1, ch. 9 "Transport layer",
//! ch. 10-11 "Verbs") states it and as Linux SoftRoCE (`drivers/infiniband/sw/rxe`)
//! implements it.
//!
//! UC: same SEND/WRITE opcodes as RC but no ACK/NAK, no retransmission, no READ/atomics; a
//! gap or any error drops the rest of the message and reception resumes at the next
//! FIRST/ONLY; the sender completes a WR once its last packet is on the wire.
//!
//! UD: single-packet SENDs addressed per WR, Q_Key checked at the receiver, the 40-byte GRH
//! (for IPv4: 20 zero bytes then the IPv4 header) at the head of every receive buffer.
//!
//! Each test checks completion statuses, the wire (from the harness's packet log) and memory.
//! Citations: rxe function and symbol names are exact (Linux `drivers/infiniband/sw/rxe`,
//! 6.x); IBTA section and compliance numbers (vol. 1) are pointers to the relevant part of the
//! specification, not quotations.
//!
//! Tests marked `` document a defect of `srdma-proto`.

mod common;

use common::*;
use srdma_proto::qp::AhAttr;
use srdma_proto::{
    AccessFlags, MrKeys, Mtu, PostError, QpState, QpType, RKey, SendOp, SendWr, UdDest, Wc,
    WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use srdma_wire::{Opcode, Psn, Qpn};

use End::{A, B};

const SRC: u64 = 0x1000;
const DST: u64 = 0x10_0000;
const RCV: u64 = 0x20_0000;
const LEN: usize = 64 * 1024;
const QKEY: u32 = 0x1111_1111;

struct Regions {
    src: MrKeys,
    dst: MrKeys,
    rcv: MrKeys,
}

fn regions(p: &mut Pair) -> Regions {
    let src = p.reg(A, SRC, LEN, 0, all_remote());
    p.bytes_mut(A, &src).copy_from_slice(&pattern(LEN));
    let dst = p.reg(B, DST, LEN, 0xEE, all_remote());
    let rcv = p.reg(B, RCV, LEN, 0xCC, all_remote());
    Regions { src, dst, rcv }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn ps(i: u32) -> Psn {
    Psn::new(PSN_A).add(i)
}

fn rkey(k: &MrKeys) -> RKey {
    k.rkey.unwrap()
}

fn st(wcs: &[Wc]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn wire(p: &Pair, from: End) -> Vec<(Opcode, Psn)> {
    p.sent_by(from)
        .iter()
        .map(|s| (s.pkt.bth.opcode, s.pkt.bth.psn))
        .collect()
}

#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i}: got {:#04x}, want {:#04x}",
            got[i], want[i]
        );
    }
}

/// Delivers `from`'s packets one by one, dropping those whose PSN is in `lost`.
fn pump_losing(p: &mut Pair, lost: &[Psn]) {
    p.pump_with(|from, r| {
        if from == A && lost.contains(&r.bth.psn) {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
}

fn uc() -> Pair {
    Pair::new(QpType::Uc, Mtu::Mtu1024)
}

// =======================================================================================
// UC
// =======================================================================================

/// Rule: UC carries multi-packet SEND, SEND with immediate, RDMA WRITE and WRITE with
/// immediate exactly as RC does (IBA 9.8.3: FIRST/MIDDLE/LAST segmentation at the path MTU,
/// RETH on the first packet of a WRITE, ImmDt on the last); the receiver completes SENDs and
/// WRITE-with-immediate with their byte counts and immediate data.
#[test]
fn uc_multi_packet_send_and_write_are_delivered() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 4096, 4096)]);
    p.post_recv(B, 102, &[sge(&r.rcv, RCV + 8192, 16)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 3000)]));
    p.post_send(
        A,
        wr(
            2,
            SendOp::SendWithImm { imm: 0xCAFE_F00D },
            &[sge(&r.src, SRC + 100, 1500)],
        ),
    );
    p.post_send(
        A,
        wr(
            3,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 2500)],
        ),
    );
    p.post_send(
        A,
        wr(
            4,
            SendOp::WriteWithImm {
                remote_addr: DST + 8192,
                rkey: rkey(&r.dst),
                imm: 7,
            },
            &[sge(&r.src, SRC + 200, 2100)],
        ),
    );
    p.settle();
    let ops: Vec<Opcode> = wire(&p, A).iter().map(|x| x.0).collect();
    assert_eq!(
        ops,
        vec![
            Opcode::UcSendFirst,
            Opcode::UcSendMiddle,
            Opcode::UcSendLast,
            Opcode::UcSendFirst,
            Opcode::UcSendLastWithImmediate,
            Opcode::UcRdmaWriteFirst,
            Opcode::UcRdmaWriteMiddle,
            Opcode::UcRdmaWriteLast,
            Opcode::UcRdmaWriteFirst,
            Opcode::UcRdmaWriteMiddle,
            Opcode::UcRdmaWriteLastWithImmediate,
        ]
    );
    let psns: Vec<Psn> = wire(&p, A).iter().map(|x| x.1).collect();
    assert_eq!(psns, (0..11).map(ps).collect::<Vec<_>>());
    let a = p.completions(A);
    assert_eq!(
        a.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::Send, 3000),
            (2, WcStatus::Success, WcOpcode::Send, 1500),
            (3, WcStatus::Success, WcOpcode::RdmaWrite, 2500),
            (4, WcStatus::Success, WcOpcode::RdmaWrite, 2100),
        ]
    );
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data))
            .collect::<Vec<_>>(),
        vec![
            (100, WcStatus::Success, WcOpcode::Recv, 3000, None),
            (
                101,
                WcStatus::Success,
                WcOpcode::Recv,
                1500,
                Some(0xCAFE_F00D)
            ),
            (
                102,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                2100,
                Some(7)
            ),
        ]
    );
    let pat = pattern(LEN);
    same(&p.bytes(B, &r.rcv)[..3000], &pat[..3000], "SEND");
    same(
        &p.bytes(B, &r.rcv)[4096..5596],
        &pat[100..1600],
        "SEND with imm",
    );
    same(&p.bytes(B, &r.dst)[..2500], &pat[..2500], "WRITE");
    same(
        &p.bytes(B, &r.dst)[8192..10292],
        &pat[200..2300],
        "WRITE with imm",
    );
    assert_eq!(p.bytes(B, &r.dst)[2500], 0xEE);
    assert_eq!(
        &p.bytes(B, &r.rcv)[8192..8208],
        &[0xCC; 16],
        "WRITE_IMM data"
    );
}

/// Rule: a UC responder never sends anything — no ACK, no NAK, not for success, a PSN gap, a
/// missing receive WQE or a bad R_Key (IBA 9.8: "UC does not generate responses";
/// rxe `acknowledge`: `if (qp_type(qp) != IB_QPT_RC) return RESPST_CLEANUP`) — and a UC
/// requester never sets AckReq (rxe: AckReq only for RC).
#[test]
fn uc_never_acknowledges() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 3000)])); // fine
    p.post_send(A, send(2, &[sge(&r.src, SRC, 3000)])); // middle lost
    p.post_send(A, send(3, &[sge(&r.src, SRC, 100)])); // no receive left
    p.post_send(
        A,
        wr(
            4,
            SendOp::Write {
                remote_addr: DST,
                rkey: RKey(rkey(&r.dst).0 ^ 0x5A),
            },
            &[sge(&r.src, SRC, 100)],
        ),
    ); // bad R_Key
    pump_losing(&mut p, &[ps(4)]);
    p.settle();
    assert!(p.sent_by(B).is_empty(), "UC responder sent:\n{}", p.trace());
    assert!(p.sent_by(A).iter().all(|s| !s.pkt.bth.ack_req));
    assert_eq!(p.a.qp.poll_timeout(), None, "no retransmission timer");
    assert_eq!(p.b.qp.poll_timeout(), None);
    assert_eq!(p.b.qp.state(), QpState::Rts, "UC errors never break the QP");
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::Success)]);
}

/// Rule: a UC send WR completes as soon as its last packet has been handed to the network
/// (IBA 9.8; rxe `rxe_xmit_packet` → `wqe_state_done` for non-RC), successfully, whether
/// or not anything arrives; nothing is kept for retransmission.
#[test]
fn uc_sender_completes_on_transmit() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 2500)]));
    p.post_send(
        A,
        wr(
            2,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 100)],
        ),
    );
    assert!(p.transmit(A).is_some()); // FIRST
    assert!(p.transmit(A).is_some()); // MIDDLE
    assert!(
        p.completions(A).is_empty(),
        "completed before its last packet"
    );
    assert!(p.transmit(A).is_some()); // LAST
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, WcOpcode::Send, 2500)]
    );
    assert!(p.transmit(A).is_some()); // WRITE ONLY
    assert_eq!(st(&p.completions(A)), vec![(2, WcStatus::Success)]);
    assert!(p.transmit(A).is_none());
    assert_eq!(p.a.qp.send_queue_len(), 0);
    assert_eq!(p.a.qp.poll_timeout(), None);
    // Nothing was delivered; nothing more will happen.
    assert!(!p.fire_next_timer());
    assert!(p.completions(B).is_empty());
}

/// Rule: a PSN gap inside a UC SEND drops the rest of that message: no receive completion,
/// the packets after the gap are not placed, and the receive WQE is reset and reused by the
/// next message (IBA 9.8.3; rxe `check_psn` UC `drop_msg`, `do_class_d1e_error`
/// "reset the recv wr to its original state"). Reception resumes at the next FIRST/ONLY.
/// (The first packet, already placed before the gap, is not undone — rxe copies each packet
/// into the buffer as it arrives too — and the next message overwrites it.)
#[test]
fn uc_psn_gap_drops_the_send_and_reuses_its_receive_wqe() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 4096, 4096)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 3000)])); // PSN 0..2, 1 lost
    p.post_send(A, send(2, &[sge(&r.src, SRC + 5000, 100)])); // PSN 3
    pump_losing(&mut p, &[ps(1)]);
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 100)],
        "the first receive WQE was reused for the second message"
    );
    assert_eq!(p.b.qp.recv_queue_len(), 1);
    let pat = pattern(LEN);
    same(
        &p.bytes(B, &r.rcv)[..100],
        &pat[5000..5100],
        "second message",
    );
    assert!(
        p.bytes(B, &r.rcv)[2048..4096].iter().all(|&b| b == 0xCC),
        "the packet after the gap was placed"
    );
    assert!(p.bytes(B, &r.rcv)[4096..].iter().all(|&b| b == 0xCC));
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

/// Rule: a PSN gap inside a UC RDMA WRITE drops the rest of that WRITE (no more bytes placed;
/// a WRITE with immediate does not consume its receive WQE) and the next WRITE, starting with
/// FIRST/ONLY, is executed normally (rxe `check_psn` UC).
#[test]
fn uc_psn_gap_drops_the_rest_of_a_write() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 16)]);
    p.post_send(
        A,
        wr(
            1,
            SendOp::WriteWithImm {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                imm: 1,
            },
            &[sge(&r.src, SRC, 3000)],
        ),
    ); // PSN 0..2, 1 lost
    p.post_send(
        A,
        wr(
            2,
            SendOp::WriteWithImm {
                remote_addr: DST + 8192,
                rkey: rkey(&r.dst),
                imm: 2,
            },
            &[sge(&r.src, SRC, 500)],
        ),
    ); // PSN 3
    pump_losing(&mut p, &[ps(1)]);
    let pat = pattern(LEN);
    same(&p.bytes(B, &r.dst)[..1024], &pat[..1024], "FIRST placed");
    assert!(
        p.bytes(B, &r.dst)[1024..8192].iter().all(|&b| b == 0xEE),
        "bytes after the gap were placed"
    );
    same(&p.bytes(B, &r.dst)[8192..8692], &pat[..500], "next WRITE");
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.imm_data, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(
            100,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            Some(2),
            500
        )],
        "only the complete WRITE with immediate consumed the receive"
    );
}

/// Rule: after a lost FIRST, the MIDDLE and LAST of that message are dropped (they do not
/// start a message; rxe `check_op_seq` UC: MIDDLE/LAST with no message → `drop_msg`); the
/// receive WQE is untouched and taken by the next message.
#[test]
fn uc_lost_first_drops_middle_and_last() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 3000)])); // PSN 0..2, 0 lost
    pump_losing(&mut p, &[ps(0)]);
    assert!(p.completions(B).is_empty());
    assert!(p.bytes(B, &r.rcv).iter().all(|&b| b == 0xCC), "placed");
    assert_eq!(p.b.qp.recv_queue_len(), 1);
    p.post_send(A, send(2, &[sge(&r.src, SRC + 7, 2000)])); // PSN 3, 4
    p.pump();
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 2000)]
    );
    same(&p.bytes(B, &r.rcv)[..2000], &pattern(LEN)[7..2007], "data");
}

/// Rule: a UC SEND arriving with no receive WQE is dropped silently — no RNR NAK on UC (IBA
/// 9.8; rxe `RESPST_ERR_RNR`: "UD/UC - class D", `drop_msg`); the next SEND after a
/// receive is posted is delivered.
#[test]
fn uc_send_without_receive_is_dropped_silently() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 2000)]));
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert!(p.completions(B).is_empty());
    assert!(p.sent_by(B).is_empty());
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_send(A, send(2, &[sge(&r.src, SRC + 3, 50)]));
    p.pump();
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 50)]
    );
    same(&p.bytes(B, &r.rcv)[..50], &pattern(LEN)[3..53], "data");
    assert!(p.bytes(B, &r.rcv)[50..].iter().all(|&b| b == 0xCC));
}

/// Rule: a UC RDMA WRITE that violates the R_Key (here: a wrong key) is dropped silently;
/// no memory changes, the QP stays in RTS and the next WRITE works (rxe
/// `RESPST_ERR_RKEY_VIOLATION` for UC without SRQ: class E, `drop_msg`, no QP error).
#[test]
fn uc_remote_access_error_is_dropped_silently() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: RKey(rkey(&r.dst).0 ^ 0x5A),
            },
            &[sge(&r.src, SRC, 2500)],
        ),
    );
    p.post_send(
        A,
        wr(
            2,
            SendOp::Write {
                remote_addr: DST + 4096,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 100)],
        ),
    );
    p.pump();
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "a UC sender cannot know"
    );
    assert!(p.bytes(B, &r.dst)[..4096].iter().all(|&b| b == 0xEE));
    same(
        &p.bytes(B, &r.dst)[4096..4196],
        &pattern(LEN)[..100],
        "next WRITE",
    );
    assert!(p.sent_by(B).is_empty());
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

/// Rule: a UC RDMA WRITE to a QP without REMOTE_WRITE in its access flags is dropped
/// silently (rxe `check_op_valid` UC: `drop_msg`, no NAK, no QP error).
#[test]
fn uc_write_to_qp_without_remote_write_is_dropped_silently() {
    let mut p = Pair::with(QpType::Uc, Mtu::Mtu1024, |a| {
        a.qp_access_flags = AccessFlags::empty();
    });
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 100)],
        ),
    );
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert!(p.bytes(B, &r.dst).iter().all(|&b| b == 0xEE));
    assert!(p.sent_by(B).is_empty());
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

/// Rule: a UC SEND larger than the receive buffer is dropped without error (IBA class D
/// for UC without SRQ; rxe `RESPST_ERR_LENGTH` UC/UD no SRQ → `drop_msg`, `RESPST_CLEANUP`:
/// no completion, the WQE is not consumed), the QP stays in RTS and the WQE takes the next
/// message that fits.
#[test]
fn uc_receive_buffer_too_small_drops_the_message() {
    let mut p = uc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 100)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 200)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC + 9, 60)]));
    p.pump();
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 60)]
    );
    same(&p.bytes(B, &r.rcv)[..60], &pattern(LEN)[9..69], "data");
    assert_eq!(p.b.qp.state(), QpState::Rts);
    assert!(p.sent_by(B).is_empty());
}

/// Rule: UC has no RDMA READ and no atomics (IBA table 38 "operations per service";
/// rxe `validate_send_wr` / `rxe_wr_opcode_info` masks): posting one is refused.
#[test]
fn uc_refuses_read_and_atomics_at_post_time() {
    let mut p = uc();
    let r = regions(&mut p);
    for (op, code) in [
        (
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            WrOpcode::RdmaRead,
        ),
        (
            SendOp::FetchAdd {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                add: 1,
            },
            WrOpcode::AtomicFetchAndAdd,
        ),
        (
            SendOp::CompareSwap {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                compare: 0,
                swap: 1,
            },
            WrOpcode::AtomicCmpAndSwp,
        ),
    ] {
        let e = p.a.qp.post_send(wr(1, op, &[sge(&r.src, SRC, 8)]));
        assert!(
            matches!(e, Err(PostError::UnsupportedOp { op, .. }) if op == code),
            "{e:?}"
        );
    }
    assert_eq!(p.a.qp.send_queue_len(), 0);
}

// =======================================================================================
// UD
// =======================================================================================

fn ud() -> Pair {
    Pair::new(QpType::Ud, Mtu::Mtu1024)
}

fn to_b(p: &Pair, qkey: u32) -> UdDest {
    UdDest {
        ah: AhAttr {
            dgid: gid(p.b.ip),
            ..AhAttr::default()
        },
        remote_qpn: p.b.qp.qpn(),
        remote_qkey: qkey,
    }
}

fn ud_send(p: &Pair, id: u64, op: SendOp, sges: &[srdma_proto::Sge], qkey: u32) -> SendWr {
    wr(id, op, sges).to_ud(to_b(p, qkey))
}

/// Internet checksum over `b` (0 when a header with its checksum is valid).
fn ip_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// Rule: a UD SEND lands in the receive buffer after a 40-byte GRH; over IPv4 the GRH is
/// 20 zero bytes followed by the packet's IPv4 header (IBA A17.4.5 RoCEv2 "the GRH of a
/// RoCEv2 IPv4 packet"; `union rdma_network_hdr` in `include/rdma/ib_verbs.h`, rxe
/// `execute`: `memset(&hdr.reserved, 0, ...)`, `memcpy(&hdr.roce4grh, ip_hdr(skb), ...)`).
/// byte_len = payload + 40, src_qp = the sender's QPN (from the DETH), wc_flags has GRH, sl
/// the network header type as mlx5 reports it (2 = IPv4; UCX `uct_ud_iface_check_grh`).
#[test]
fn ud_send_lands_after_an_ipv4_grh() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1024 + 40)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 100)], QKEY);
    p.post_send(A, w);
    p.pump();
    let a = p.sent_by(A);
    assert_eq!(a.len(), 1);
    let pkt = a[0].pkt;
    assert_eq!(pkt.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(pkt.bth.dest_qpn, Qpn::new(0x22));
    assert!(!pkt.bth.ack_req);
    let deth = pkt.deth.unwrap();
    assert_eq!((deth.qkey, deth.src_qpn), (QKEY, Qpn::new(0x11)));
    let roce_len = pkt.buffer_len();
    assert_eq!(roce_len, 12 + 8 + 100 + 4);

    let b = p.completions(B);
    assert_eq!(b.len(), 1);
    let wc = b[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.src_qp),
        (100, WcStatus::Success, WcOpcode::Recv, 140, Qpn::new(0x11))
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(
        wc.sl, 2,
        "network header type IPv4, as mlx5 reports it (UCX reads it)"
    );
    assert!(!wc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(wc.imm_data, None);
    let buf = p.bytes(B, &r.rcv);
    assert_eq!(&buf[..20], &[0u8; 20], "reserved half of the GRH");
    let ip = &buf[20..40];
    assert_eq!(ip[0], 0x45, "IPv4, IHL 5");
    assert_eq!(
        u16::from_be_bytes([ip[2], ip[3]]) as usize,
        20 + 8 + roce_len,
        "total length"
    );
    assert_eq!(ip[9], 17, "protocol UDP");
    assert_eq!(&ip[12..16], &[10, 0, 0, 1], "source address");
    assert_eq!(&ip[16..20], &[10, 0, 0, 2], "destination address");
    assert_eq!(ip_checksum(ip), 0, "header checksum");
    same(&buf[40..140], &pattern(LEN)[..100], "payload");
    assert!(buf[140..1064].iter().all(|&b| b == 0xCC));
    // The sender completed on transmit.
    let a = p.completions(A);
    assert_eq!(
        a.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, WcOpcode::Send, 100)]
    );
    assert!(p.sent_by(B).is_empty(), "no response on UD");
}

/// Rule: UD SEND with immediate: UD_SEND_ONLY_WITH_IMMEDIATE, the receive completion carries
/// the immediate data and WITH_IMM besides GRH (rxe `do_complete`).
#[test]
fn ud_send_with_immediate() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1024 + 40)]);
    let w = ud_send(
        &p,
        1,
        SendOp::SendWithImm { imm: 0x0102_0304 },
        &[sge(&r.src, SRC, 33)],
        QKEY,
    );
    p.post_send(A, w);
    p.pump();
    assert_eq!(
        wire(&p, A).iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![Opcode::UdSendOnlyWithImmediate]
    );
    let wc = p.completions(B)[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm_data, wc.src_qp),
        (
            100,
            WcStatus::Success,
            73,
            Some(0x0102_0304),
            Qpn::new(0x11)
        )
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    same(&p.bytes(B, &r.rcv)[40..73], &pattern(LEN)[..33], "payload");
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
}

/// Rule: over IPv6 the 40-byte GRH is the packet's IPv6 header itself (`struct ibv_grh` =
/// version/class/flow, payload length, next header, hop limit, SGID, DGID; rxe `execute`:
/// `send_data_in(qp, ipv6_hdr(skb), sizeof(hdr))`).
#[test]
fn ud_send_lands_after_an_ipv6_grh() {
    let mut p = ud();
    p.a.ip = "fd00::1".parse().unwrap();
    p.b.ip = "fd00::2".parse().unwrap();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1024 + 40)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 10)], QKEY);
    p.post_send(A, w);
    p.pump();
    let roce_len = p.sent_by(A)[0].pkt.buffer_len();
    let wc = p.completions(B)[0];
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 50));
    assert_eq!(wc.sl, 1, "network header type IPv6, as mlx5 reports it");
    let g = &p.bytes(B, &r.rcv)[..40];
    assert_eq!(g[0] >> 4, 6, "version 6");
    assert_eq!(
        u16::from_be_bytes([g[4], g[5]]) as usize,
        8 + roce_len,
        "payload length"
    );
    assert_eq!(g[6], 17, "next header UDP");
    let src: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
    let dst: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
    assert_eq!(&g[8..24], &src.octets(), "SGID");
    assert_eq!(&g[24..40], &dst.octets(), "DGID");
    same(&p.bytes(B, &r.rcv)[40..50], &pattern(LEN)[..10], "payload");
}

/// Rule: a UD packet whose DETH Q_Key differs from the receiving QP's is silently dropped and
/// counted (IBA 10.2: Q_Key violation, `qkey_viol_cntr`): no completion, the receive
/// WQE stays posted. The sender, knowing nothing, completes successfully.
#[test]
fn ud_qkey_mismatch_is_dropped_and_counted() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1024 + 40)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 10)], 0x2222_2222);
    p.post_send(A, w);
    p.pump();
    assert_eq!(p.sent_by(A)[0].pkt.deth.unwrap().qkey, 0x2222_2222);
    assert!(p.completions(B).is_empty());
    assert_eq!(p.b.qp.counters().qkey_violations, 1);
    assert_eq!(p.b.qp.recv_queue_len(), 1);
    assert!(p.bytes(B, &r.rcv).iter().all(|&b| b == 0xCC));
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
}

/// Rule: a send WR whose `remote_qkey` has bit 31 set sends the QP's own Q_Key instead (IBA
/// C10-15: "if the high-order bit of the Q_Key in the WR is set, the Q_Key of the QP
/// context is used"; mthca/hns/erdma do this — kernel rxe does not and sends the WR's value).
#[test]
fn ud_remote_qkey_with_bit_31_uses_the_qp_qkey() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1024 + 40)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 10)], 0x8000_0000);
    p.post_send(A, w);
    p.pump();
    assert_eq!(p.sent_by(A)[0].pkt.deth.unwrap().qkey, QKEY);
    assert_eq!(
        st(&p.completions(B)),
        vec![(100, WcStatus::Success)],
        "delivered under the QP's Q_Key"
    );
    assert_eq!(p.b.qp.counters().qkey_violations, 0);
}

/// Rule: a UD message larger than the receive buffer (GRH included) completes the receive
/// WQE with LOC_LEN_ERR and the UD QP stays usable (IBA verbs: "Local Length Error:
/// the receive WQE isn't big enough for the incoming message"; a UD error never moves the
/// QP to ERR). (Kernel rxe drops such a message silently instead — class D,
/// `RESPST_ERR_LENGTH` without SRQ — and keeps the WQE.)
#[test]
fn ud_receive_buffer_too_small_is_local_length_error_and_qp_survives() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 40 + 50)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 4096, 40 + 50)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 100)], QKEY);
    p.post_send(A, w);
    let w = ud_send(&p, 2, SendOp::Send, &[sge(&r.src, SRC + 1, 50)], QKEY);
    p.post_send(A, w);
    p.pump();
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (100, WcStatus::LocLenErr, WcOpcode::Recv),
            (101, WcStatus::Success, WcOpcode::Recv)
        ]
    );
    assert_eq!(b[1].byte_len, 90);
    assert_eq!(p.b.qp.state(), QpState::Rts);
    same(
        &p.bytes(B, &r.rcv)[4096 + 40..4096 + 90],
        &pattern(LEN)[1..51],
        "second message",
    );
    assert!(
        p.bytes(B, &r.rcv)[40 + 50..4096].iter().all(|&b| b == 0xCC),
        "wrote past the receive buffer"
    );
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// Rule: a UD send longer than the path (port) MTU cannot be sent: the WR completes with
/// LOC_LEN_ERR, nothing goes on the wire, the QP stays usable (IBA C10-93.1.1 /
/// verbs "Local Length Error ... message greater than the maximum message size supported";
/// hardware reports the error, kernel rxe instead completes it *successfully* without
/// sending — srdma follows the hardware, as documented in `requester.rs`).
#[test]
fn ud_message_larger_than_mtu_is_local_length_error_on_the_sender() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 1025)], QKEY);
    p.post_send(A, w);
    p.pump();
    let a = p.completions(A);
    assert_eq!(
        a.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::LocLenErr, WcOpcode::Send)]
    );
    assert!(p.sent_by(A).is_empty(), "nothing on the wire");
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(p.a.qp.send_queue_len(), 0);
    // The QP goes on: a full-MTU message is fine.
    let w = ud_send(&p, 2, SendOp::Send, &[sge(&r.src, SRC, 1024)], QKEY);
    p.post_send(A, w);
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(2, WcStatus::Success)]);
    let sent = p.sent_by(A);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].pkt.payload.len(), 1024);
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 1064)]
    );
}

/// Rule: a local error on one UD WR does not hold up the WRs queued behind it (a UD error
/// never stops the send queue, IBA 10.7.3), and `poll_transmit` returning `None` means
/// "nothing to send now": after the oversized WR fails, the same drain of `poll_transmit`
/// must send the next WR — an engine (like `srdma-sim`) that drains until `None` and then
/// waits for the next event would otherwise leave it stranded on an idle QP.
#[test]

fn ud_local_error_does_not_strand_the_next_wr() {
    let mut p = ud();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 1025)], QKEY);
    p.post_send(A, w);
    let w = ud_send(&p, 2, SendOp::Send, &[sge(&r.src, SRC, 1024)], QKEY);
    p.post_send(A, w);
    p.pump();
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::Success)]
    );
    assert_eq!(p.sent_by(A).len(), 1);
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::Success)]);
}

/// Rule: a UD message arriving with no receive WQE posted is dropped silently — no RNR on UD
/// (IBA 9.8; rxe `RESPST_ERR_RNR` "UD/UC - class D"); a later message after a receive is
/// posted arrives normally.
#[test]
fn ud_without_receive_is_dropped_silently() {
    let mut p = ud();
    let r = regions(&mut p);
    let w = ud_send(&p, 1, SendOp::Send, &[sge(&r.src, SRC, 10)], QKEY);
    p.post_send(A, w);
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert!(p.completions(B).is_empty());
    assert!(p.sent_by(B).is_empty());
    assert!(p.b.qp.counters().dropped_pkts >= 1);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1024)]);
    let w = ud_send(&p, 2, SendOp::Send, &[sge(&r.src, SRC + 1, 20)], QKEY);
    p.post_send(A, w);
    p.pump();
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 60)]
    );
    same(&p.bytes(B, &r.rcv)[40..60], &pattern(LEN)[1..21], "payload");
}

/// Rule: UD supports only SEND and SEND with immediate, and every UD send WR names its
/// destination (IBA table 38; rxe `validate_send_wr`): RDMA WRITE/READ/atomics and a UD WR
/// without address are refused at post time, as is a destination on a connected QP.
#[test]
fn ud_refuses_rdma_and_missing_destinations_at_post_time() {
    let mut p = ud();
    let r = regions(&mut p);
    let dest = to_b(&p, QKEY);
    for op in [
        SendOp::Write {
            remote_addr: DST,
            rkey: rkey(&r.dst),
        },
        SendOp::Read {
            remote_addr: DST,
            rkey: rkey(&r.dst),
        },
        SendOp::FetchAdd {
            remote_addr: DST,
            rkey: rkey(&r.dst),
            add: 1,
        },
    ] {
        let e =
            p.a.qp
                .post_send(wr(1, op, &[sge(&r.src, SRC, 8)]).to_ud(dest));
        assert!(matches!(e, Err(PostError::UnsupportedOp { .. })), "{e:?}");
    }
    assert_eq!(
        p.a.qp.post_send(send(1, &[sge(&r.src, SRC, 8)])),
        Err(PostError::BadDestination)
    );
    let mut c = uc();
    let rc_ = regions(&mut c);
    assert_eq!(
        c.a.qp
            .post_send(send(1, &[sge(&rc_.src, SRC, 8)]).to_ud(dest)),
        Err(PostError::BadDestination)
    );
    assert_eq!(p.a.qp.send_queue_len(), 0);
}

/// UC with an SRQ: when a PSN gap abandons a partly received SEND, its receive WQE goes back
/// to the SRQ and is reused by the next message (rxe keeps and reuses the WQE), not parked on
/// the QP's private receive queue, which an SRQ QP never reads.
#[test]
fn uc_srq_gap_returns_the_wqe_to_the_srq() {
    let mut p = Pair::with_config(
        QpType::Uc,
        Mtu::Mtu1024,
        |e, c| c.uses_srq = e == End::B,
        |_| {},
    );
    let src = p.reg(End::A, 0x1000, 4096, 7, all_remote());
    let rb = p.reg(End::B, 0x10_0000, 4096, 0, all_remote());
    p.post_srq_recv(End::B, 100, &[sge(&rb, 0x10_0000, 2048)]);
    p.post_srq_recv(End::B, 101, &[sge(&rb, 0x10_0000 + 2048, 2048)]);
    p.post_send(End::A, send(1, &[sge(&src, 0x1000, 1500)])); // FIRST + LAST
    p.post_send(End::A, send(2, &[sge(&src, 0x1000, 10)]));
    p.post_send(End::A, send(3, &[sge(&src, 0x1000, 10)]));
    let mut i = 0;
    p.pump_with(|_, _| {
        i += 1;
        if i == 2 { Fate::Drop } else { Fate::Deliver }
    });
    let got: Vec<(u64, u32)> = p
        .completions(End::B)
        .iter()
        .map(|w| (w.wr_id, w.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![(100, 10), (101, 10)],
        "the abandoned WQE 100 is reused for message 2"
    );
    assert_eq!(p.b.qp.recv_queue_len(), 0);
}
