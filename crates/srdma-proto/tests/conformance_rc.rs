//! RC transport conformance: one test per rule of the reliable connected service, as the IBTA
//! specification (vol. 1, ch. 9 "Transport layer" and ch. 10-11 "Verbs") states it and as
//! Linux SoftRoCE (`drivers/infiniband/sw/rxe`: `rxe_req.c` requester, `rxe_comp.c` completer,
//! `rxe_resp.c` responder) implements it.
//!
//! Every test drives two QPs through the hand-pumped harness (`tests/common`) and checks three
//! things: the exact completion statuses on both ends, the wire (opcodes, PSNs, AETH
//! syndromes, RETH fields — from the harness's packet log) and the memory contents.
//!
//! A is always the requester (send PSNs start at `PSN_A` = 0xFFFFF0, so most tests cross the
//! 24-bit wrap), B the responder (its ePSN starts at `PSN_A` too). Path MTU is 1024 unless a
//! test says otherwise.
//!
//! Citations: rxe function and symbol names are exact (Linux `drivers/infiniband/sw/rxe`,
//! 6.x); IBTA section and compliance numbers (vol. 1) are pointers to the relevant part of the
//! specification, not quotations.

mod common;

use std::time::Duration;

use common::*;
use srdma_proto::qp::AhAttr;
use srdma_proto::timer::{local_ack_timeout, rnr_timer};
use srdma_proto::transport::{MAX_UNACKED_PSNS, MAX_WINDOW_PSNS};
use srdma_proto::{
    AccessFlags, AttrMask, DeviceLimits, MrKeys, Mtu, PdId, PostError, Qp, QpAttr, QpConfig,
    QpState, QpType, RKey, RecvWr, SendFlags, SendOp, SendWr, Wc, WcFlags, WcOpcode, WcStatus,
};
use srdma_wire::{AethRepr, BthRepr, Kind, NakCode, Opcode, PacketRepr, Psn, Qpn, Syndrome};

use End::{A, B};

/// Where the test regions live.
const SRC: u64 = 0x1000; // on A: request data, READ and atomic results
const DST: u64 = 0x10_0000; // on B: RDMA target
const RCV: u64 = 0x20_0000; // on B: receive buffers
const LEN: usize = 64 * 1024;
/// Offset in A's region where READ and atomic results land.
const RES: u64 = 0x8000;

struct Regions {
    src: MrKeys,
    dst: MrKeys,
    rcv: MrKeys,
}

fn rc() -> Pair {
    Pair::new(QpType::Rc, Mtu::Mtu1024)
}

fn rc_with(tweak: impl Fn(&mut QpAttr)) -> Pair {
    Pair::with(QpType::Rc, Mtu::Mtu1024, tweak)
}

/// A's source region (a byte pattern; results area zero), B's target region (0xEE) and B's
/// receive region (0xCC).
fn regions(p: &mut Pair) -> Regions {
    let src = p.reg(A, SRC, LEN, 0, all_remote());
    let pat = pattern(LEN / 2);
    p.bytes_mut(A, &src)[..LEN / 2].copy_from_slice(&pat);
    let dst = p.reg(B, DST, LEN, 0xEE, all_remote());
    let rcv = p.reg(B, RCV, LEN, 0xCC, all_remote());
    Regions { src, dst, rcv }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A's request PSN number `i` (counting from its initial send PSN).
fn ps(i: u32) -> Psn {
    Psn::new(PSN_A).add(i)
}

fn rkey(k: &MrKeys) -> RKey {
    k.rkey.unwrap()
}

/// Asserts two byte strings are equal, reporting the first difference (not 50 KB of bytes).
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

fn word(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// (wr_id, status) of each completion.
fn st(wcs: &[Wc]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// (opcode, PSN) of every packet `from` sent.
fn wire(p: &Pair, from: End) -> Vec<(Opcode, Psn)> {
    p.sent_by(from)
        .iter()
        .map(|s| (s.pkt.bth.opcode, s.pkt.bth.psn))
        .collect()
}

/// (PSN, syndrome) of every RC ACKNOWLEDGE packet `from` sent.
fn acks(p: &Pair, from: End) -> Vec<(Psn, Syndrome)> {
    p.sent_by(from)
        .iter()
        .filter(|s| s.pkt.bth.opcode == Opcode::RcAcknowledge)
        .map(|s| (s.pkt.bth.psn, s.pkt.aeth.unwrap().syndrome))
        .collect()
}

fn nak(code: NakCode) -> Syndrome {
    Syndrome::Nak(code)
}

fn bth(opcode: Opcode, dest_qpn: Qpn, psn: Psn) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: srdma_wire::bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qpn,
        ack_req: false,
        psn,
    }
}

/// An RC ACKNOWLEDGE from B to A.
fn ack_from_b(psn: Psn, syndrome: Syndrome) -> PacketRepr<'static> {
    let mut r = PacketRepr::new(bth(Opcode::RcAcknowledge, Qpn::new(0x11), psn), &[]);
    r.aeth = Some(AethRepr { syndrome, msn: 0 });
    r
}

// ---------------------------------------------------------------------------------------
// Acknowledgements
// ---------------------------------------------------------------------------------------

/// Rule: an ACK whose PSN the requester never sent (a "ghost" ACK, IBA 9.7.5.1.2:
/// responses outside the outstanding window are invalid) is silently dropped: nothing
/// completes, nothing is retransmitted; the real ACK later completes the WQE normally
/// (rxe `rxe_comp.c check_psn`).
#[test]
fn ghost_ack_for_unsent_psn_is_ignored() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 64)]));
    let (pkt, encap) = p.transmit(A).unwrap();
    assert_eq!(wire(&p, A), vec![(Opcode::RcSendOnly, ps(0))]);
    let dropped = p.a.qp.counters().dropped_pkts;

    for ghost in [ps(1), ps(2), ps(1000)] {
        p.inject(B, &ack_from_b(ghost, Syndrome::ACK));
    }
    assert!(p.completions(A).is_empty(), "a ghost ACK completed a WQE");
    assert_eq!(p.a.qp.send_queue_len(), 1);
    assert_eq!(p.a.qp.counters().dropped_pkts, dropped + 3);
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert!(
        p.transmit(A).is_none(),
        "a ghost ACK triggered a retransmission"
    );

    // The real exchange still works.
    p.deliver(B, &pkt, encap);
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert_eq!(acks(&p, B), vec![(ps(0), Syndrome::ACK)]);
}

/// srdma's `Qp::ack_once_more`, what a responder does before its QP is destroyed: the ACK
/// of its last SEND was lost, the copy completes the requester's WQE with no timer. Only
/// after a SEND or WRITE it executed: not before any request, not after a READ (its
/// response acknowledged it), not once in ERR; a copy of an ACK that arrived acknowledges
/// nothing and changes nothing.
#[test]
fn the_last_ack_once_more_completes_a_send_whose_ack_was_lost() {
    let mut p = rc();
    let r = regions(&mut p);
    assert!(!p.b.qp.ack_once_more(), "nothing received yet");
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 64)]));
    p.pump_with(|from, _| if from == B { Fate::Drop } else { Fate::Deliver });
    assert!(p.completions(A).is_empty());
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::Success)]);

    assert!(p.b.qp.ack_once_more());
    p.pump();
    assert_eq!(p.now, Duration::ZERO, "completed without a timer");
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert_eq!(acks(&p, B), vec![(ps(0), Syndrome::ACK); 2]);

    // Once more: acknowledges nothing new, A stays as it was.
    let before = p.a.qp.unproductive_acks();
    assert!(p.b.qp.ack_once_more());
    p.pump();
    assert_eq!(p.a.qp.unproductive_acks(), before + 1);
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert!(p.completions(A).is_empty());

    // After a READ: nothing to repeat.
    p.post_send(
        A,
        wr(
            2,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 16)],
        ),
    );
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(2, WcStatus::Success)]);
    assert!(!p.b.qp.ack_once_more(), "a READ's response was the ACK");

    // A WRITE again, then B in ERR.
    p.post_send(
        A,
        wr(
            3,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 16)],
        ),
    );
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(3, WcStatus::Success)]);
    p.set_state(B, QpState::Err);
    assert!(!p.b.qp.ack_once_more(), "in ERR");
}

/// Rule: ACKs are cumulative (IBA 9.7.5.1.1; rxe `check_psn` → `COMPST_COMP_WQE`): one ACK
/// whose PSN covers several SENDs completes all of them, in posting order. rxe acknowledges
/// each AckReq'd SEND; here the first two ACKs are lost and the third alone completes all.
#[test]
fn cumulative_ack_completes_every_covered_send_in_order() {
    let mut p = rc();
    let r = regions(&mut p);
    for i in 0..3u64 {
        p.post_recv(B, 100 + i, &[sge(&r.rcv, RCV + 256 * i, 256)]);
        p.post_send(A, send(1 + i, &[sge(&r.src, SRC + 100 * i, 100)]));
    }
    let mut b_out = Vec::new();
    for _ in 0..3 {
        let (pkt, encap) = p.transmit(A).unwrap();
        p.deliver(B, &pkt, encap);
        while let Some(t) = p.transmit(B) {
            b_out.push(t);
        }
    }
    assert!(p.transmit(A).is_none());
    // One ACK per SEND (each is an ONLY packet with AckReq), each carrying its own PSN.
    assert_eq!(
        acks(&p, B),
        vec![
            (ps(0), Syndrome::ACK),
            (ps(1), Syndrome::ACK),
            (ps(2), Syndrome::ACK)
        ]
    );
    // Only the last reaches A.
    let (last, encap) = b_out.pop().unwrap();
    p.deliver(A, &last, encap);
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::Send, 100),
            (2, WcStatus::Success, WcOpcode::Send, 100),
            (3, WcStatus::Success, WcOpcode::Send, 100),
        ]
    );
    assert_eq!(p.a.qp.send_queue_len(), 0);
    assert_eq!(p.a.qp.poll_timeout(), None, "nothing left to time out");
    let b = p.completions(B);
    assert_eq!(
        st(&b),
        vec![
            (100, WcStatus::Success),
            (101, WcStatus::Success),
            (102, WcStatus::Success)
        ]
    );
    for i in 0..3usize {
        same(
            &p.bytes(B, &r.rcv)[256 * i..256 * i + 100],
            &pattern(LEN)[100 * i..100 * i + 100],
            "data",
        );
    }
}

/// Rule: implied NAK (IBA 9.9.2.1: a response for a later PSN means an earlier READ
/// response was lost; rxe `check_psn`: ACK PSN beyond a pending READ → `COMPST_ERROR_RETRY`).
/// The READ's only response is lost, the ACK of the SEND after it arrives: the requester
/// re-requests the READ (same PSN, same RETH) without waiting for the timer, and it
/// completes with the right data.
#[test]
fn implied_nak_rerequests_read_when_a_later_ack_arrives() {
    let mut p = rc();
    let r = regions(&mut p);
    p.bytes_mut(B, &r.dst)[..100].copy_from_slice(&[0x5A; 100]);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 100)],
        ),
    );
    p.post_send(A, send(2, &[sge(&r.src, SRC, 32)]));
    let mut dropped = false;
    p.pump_with(|from, r| {
        if from == B && r.bth.opcode.kind() == Kind::ReadResponse && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    assert!(dropped);
    assert_eq!(p.now, Duration::ZERO, "recovered without any timer");
    let t = p.trace();
    let a = wire(&p, A);
    // READ, SEND, then (after the ACK of the SEND) READ again and SEND again.
    assert_eq!(
        a,
        vec![
            (Opcode::RcRdmaReadRequest, ps(0)),
            (Opcode::RcSendOnly, ps(1)),
            (Opcode::RcRdmaReadRequest, ps(0)),
            (Opcode::RcSendOnly, ps(1)),
        ],
        "{t}"
    );
    let reads: Vec<_> = p
        .sent_by(A)
        .iter()
        .filter_map(|s| {
            s.pkt
                .reth
                .filter(|_| s.pkt.bth.opcode == Opcode::RcRdmaReadRequest)
        })
        .collect();
    assert_eq!(reads[0], reads[1], "the retry asks for the same bytes");
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::Send)
        ]
    );
    assert_eq!(wcs[0].byte_len, 100);
    assert_eq!(
        &p.bytes(A, &r.src)[RES as usize..RES as usize + 100],
        &[0x5A; 100]
    );
    // The duplicate SEND was not delivered twice.
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::Success)]);
    assert_eq!(p.a.qp.counters().completer_retry_err, 1);
    assert_eq!(p.b.qp.counters().duplicate_request, 2);
}

/// Rule: retries started by implied NAKs draw on the same `retry_cnt` budget as timeouts
/// (rxe `COMPST_ERROR_RETRY` decrements `comp.retry_cnt`; `started_retry` keeps a second
/// implied NAK from starting another retry until a timeout; only a *good* response resets the
/// counters, `reset_retry_counters`). A READ whose responses are always lost while the SEND
/// behind it is ACKed must end in RETRY_EXC_ERR after `retry_cnt + 1` READ requests.
#[test]
fn implied_nak_retries_are_charged_to_retry_cnt() {
    let mut p = rc_with(|a| {
        a.retry_cnt = 2;
        a.timeout = 10;
    });
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 100)],
        ),
    );
    p.post_send(A, send(2, &[sge(&r.src, SRC, 32)]));
    // Bounded so that a livelock shows up as a failed count, not a hang.
    let mut budget = 300;
    p.settle_with(20, |from, r| {
        if budget == 0 {
            return Fate::Drop;
        }
        budget -= 1;
        if from == B && r.bth.opcode.kind() == Kind::ReadResponse {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let reads = wire(&p, A)
        .iter()
        .filter(|(op, _)| *op == Opcode::RcRdmaReadRequest)
        .count();
    assert_eq!(reads, 3, "retry_cnt + 1 READ requests\n{}", p.trace());
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
}

/// Rule: a gap in request PSNs makes the responder send exactly ONE NAK "PSN sequence error"
/// carrying its expected PSN, and drop the rest of the out-of-sequence packets silently until
/// the expected PSN arrives (IBA 9.7.5.1.3; rxe `check_psn` with `sent_psn_nak`). The
/// requester treats the NAK as an ACK of everything before it and resends from the NAK's PSN
/// (rxe `req_retry` / `retry_first_write_send`: resuming mid-message with a MIDDLE packet).
/// Data arrives intact; rcvd_seq_err counts the NAK on the requester.
#[test]
fn psn_sequence_nak_once_per_gap_and_resend_from_nak_psn() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 4096)],
        ),
    );
    let mut dropped = false;
    p.pump_with(|from, r| {
        if from == A && r.bth.psn == ps(1) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    let t = p.trace();
    assert_eq!(
        wire(&p, A),
        vec![
            (Opcode::RcRdmaWriteFirst, ps(0)),
            (Opcode::RcRdmaWriteMiddle, ps(1)), // lost
            (Opcode::RcRdmaWriteMiddle, ps(2)),
            (Opcode::RcRdmaWriteLast, ps(3)),
            // Resent from the NAK's PSN, continuing the message.
            (Opcode::RcRdmaWriteMiddle, ps(1)),
            (Opcode::RcRdmaWriteMiddle, ps(2)),
            (Opcode::RcRdmaWriteLast, ps(3)),
        ],
        "{t}"
    );
    assert_eq!(
        acks(&p, B),
        vec![
            (ps(1), nak(NakCode::PsnSequenceError)),
            (ps(3), Syndrome::ACK)
        ],
        "{t}"
    );
    assert_eq!(
        p.now,
        Duration::ZERO,
        "the NAK, not a timer, drove the retry"
    );
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    same(&p.bytes(B, &r.dst)[..4096], &pattern(4096)[..], "data");
    assert_eq!(p.bytes(B, &r.dst)[4096], 0xEE);
    assert_eq!(p.a.qp.counters().rcvd_seq_err, 1);
    assert_eq!(p.a.qp.counters().completer_retry_err, 1);
    assert_eq!(
        p.b.qp.state(),
        QpState::Rts,
        "PSN errors are class B: the QP stays"
    );
}

/// Rule: rxe's `out_of_seq_request` counter counts PSN-sequence NAKs sent — it is incremented
/// only where `sent_psn_nak` is set (`rxe_resp.c check_psn`), once per gap — not every
/// out-of-sequence packet dropped after it. The counters are documented as rxe's, for
/// comparison with `rdma statistic show`.
#[test]

fn out_of_seq_request_counts_once_per_gap_like_rxe() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 4096)],
        ),
    );
    let mut dropped = false;
    p.pump_with(|from, r| {
        if from == A && r.bth.psn == ps(1) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    // Two packets (PSN 2 and 3) arrived out of sequence; one NAK was sent.
    assert_eq!(acks(&p, B)[0], (ps(1), nak(NakCode::PsnSequenceError)));
    assert_eq!(p.b.qp.counters().out_of_seq_request, 1);
}

// ---------------------------------------------------------------------------------------
// Duplicates
// ---------------------------------------------------------------------------------------

/// Rule: a duplicate SEND is not executed again; the responder re-ACKs it with the PSN of the
/// last request it executed (IBA C9-105; rxe `duplicate_request`: `send_ack(prev_psn)`).
/// One receive completion only; the second receive WQE stays posted.
#[test]
fn duplicate_send_is_reacked_not_reexecuted() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 256, 256)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    let (pkt, encap) = p.transmit(A).unwrap();
    p.deliver(B, &pkt, encap);
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    // The network delivers the SEND again, late.
    p.deliver(B, &pkt, encap);
    p.pump();
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), Syndrome::ACK), (ps(0), Syndrome::ACK)],
        "the duplicate is re-ACKed with the last executed PSN"
    );
    let b = p.completions(B);
    assert_eq!(st(&b), vec![(100, WcStatus::Success)]);
    assert_eq!(b[0].byte_len, 100);
    assert_eq!(
        p.b.qp.recv_queue_len(),
        1,
        "no receive WQE consumed by the duplicate"
    );
    assert_eq!(&p.bytes(B, &r.rcv)[256..512], &[0xCC; 256]);
    assert_eq!(p.b.qp.counters().duplicate_request, 1);
    assert!(
        p.completions(A).is_empty(),
        "the re-ACK completes nothing new"
    );
}

/// Rule: a duplicate RDMA WRITE is not executed again (IBA 9.7.5.1.4 / C9-105; rxe
/// `duplicate_request`): the responder re-ACKs and leaves memory alone — proven by changing
/// the target memory between the original and the duplicate.
#[test]
fn duplicate_write_is_reacked_not_rewritten() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 2048)],
        ),
    );
    let mut held = Vec::new();
    while let Some((pkt, encap)) = p.transmit(A) {
        p.deliver(B, &pkt, encap);
        held.push((pkt, encap));
    }
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    same(&p.bytes(B, &r.dst)[..2048], &pattern(2048)[..], "data");
    // The application reuses the buffer.
    p.bytes_mut(B, &r.dst)[..2048].fill(0x55);
    for (pkt, encap) in &held {
        p.deliver(B, pkt, *encap);
    }
    p.pump();
    assert_eq!(
        &p.bytes(B, &r.dst)[..2048],
        &[0x55; 2048][..],
        "duplicate rewrote memory"
    );
    let a = acks(&p, B);
    assert_eq!(a[0], (ps(1), Syndrome::ACK));
    assert!(
        a[1..].iter().all(|&x| x == (ps(1), Syndrome::ACK)),
        "duplicates are re-ACKed with the last executed PSN: {a:?}"
    );
    assert!(a.len() >= 2);
    assert_eq!(p.b.qp.counters().duplicate_request, 2);
    assert!(p.completions(B).is_empty());
    assert_eq!(
        p.b.qp.silent_writes(),
        1,
        "one WRITE message without immediate executed, whatever its packets and duplicates"
    );
}

/// Rule: a duplicate RDMA READ is answered from the responder resources (IBA 9.7.5.1.4;
/// rxe `duplicate_request` → `find_resource`, `res->replay = 1`). rxe regenerates the
/// response from memory (`read_reply` re-reads the MR through `rxe_recheck_mr`), so if the
/// target memory changed in between, the retried READ returns the *current* bytes; IBTA
/// likewise treats READ as idempotent and gives no snapshot guarantee. Same PSN, same MSN.
#[test]
fn duplicate_read_is_replayed_from_current_memory() {
    let mut p = rc();
    let r = regions(&mut p);
    p.bytes_mut(B, &r.dst)[..100].fill(0x11);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 100)],
        ),
    );
    p.pump_with(|from, _| if from == B { Fate::Drop } else { Fate::Deliver });
    assert!(p.completions(A).is_empty());
    p.bytes_mut(B, &r.dst)[..100].fill(0x22);
    let timeout = local_ack_timeout(14).unwrap();
    assert_eq!(p.a.qp.poll_timeout(), Some(timeout));
    p.settle();
    assert_eq!(p.now, timeout, "one retransmission timeout");
    let req: Vec<_> = p.sent_by(A);
    assert_eq!(req.len(), 2);
    assert_eq!(req[0].pkt.bth.psn, ps(0));
    assert_eq!(req[1].pkt.bth.psn, ps(0));
    assert_eq!(req[0].pkt.reth, req[1].pkt.reth);
    let resp = p.sent_by(B);
    assert_eq!(resp.len(), 2);
    for s in &resp {
        assert_eq!(s.pkt.bth.opcode, Opcode::RcRdmaReadResponseOnly);
        assert_eq!(s.pkt.bth.psn, ps(0));
        assert_eq!(
            s.pkt.aeth.unwrap().msn,
            1,
            "a replay does not advance the MSN"
        );
    }
    assert_eq!(resp[0].pkt.payload, &[0x11; 100][..]);
    assert_eq!(resp[1].pkt.payload, &[0x22; 100][..]);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert_eq!(
        &p.bytes(A, &r.src)[RES as usize..RES as usize + 100],
        &[0x22; 100]
    );
    assert_eq!(p.b.qp.counters().duplicate_request, 1);
}

/// Rule: a duplicate atomic is NOT executed again; the responder answers it from its atomic
/// replay cache with the saved original value (IBA 9.7.5.1.4; rxe `duplicate_request`
/// → `atomic_reply` with `res->replay`, `res->atomic.orig_val`). The ATOMIC ACKNOWLEDGE is
/// lost, the FETCH_ADD retried: memory is incremented exactly once, the requester gets the
/// original value.
#[test]
fn duplicate_fetch_add_is_replayed_not_reexecuted() {
    let mut p = rc();
    let r = regions(&mut p);
    p.bytes_mut(B, &r.dst)[..8].copy_from_slice(&100u64.to_ne_bytes());
    p.post_send(
        A,
        wr(
            1,
            SendOp::FetchAdd {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                add: 5,
            },
            &[sge(&r.src, SRC + RES, 8)],
        ),
    );
    let mut dropped = false;
    p.settle_with(10, |from, _| {
        if from == B && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    assert_eq!(p.now, local_ack_timeout(14).unwrap());
    assert_eq!(
        wire(&p, A),
        vec![(Opcode::RcFetchAdd, ps(0)), (Opcode::RcFetchAdd, ps(0))]
    );
    let acks: Vec<_> = p
        .sent_by(B)
        .iter()
        .map(|s| {
            (
                s.pkt.bth.opcode,
                s.pkt.bth.psn,
                s.pkt.atomic_ack_eth.unwrap().orig,
            )
        })
        .collect();
    assert_eq!(
        acks,
        vec![
            (Opcode::RcAtomicAcknowledge, ps(0), 100),
            (Opcode::RcAtomicAcknowledge, ps(0), 100)
        ]
    );
    assert_eq!(word(p.bytes(B, &r.dst), 0), 105, "incremented exactly once");
    assert_eq!(word(p.bytes(A, &r.src), RES as usize), 100);
    let wcs = p.completions(A);
    assert_eq!(st(&wcs), vec![(1, WcStatus::Success)]);
    assert_eq!((wcs[0].opcode, wcs[0].byte_len), (WcOpcode::FetchAdd, 8));
    assert_eq!(p.b.qp.counters().duplicate_request, 1);
}

/// Rule: as for FETCH_ADD, a duplicate COMPARE_SWAP returns the saved original value and is
/// not re-executed (a re-execution would compare against the swapped value and return it).
#[test]
fn duplicate_compare_swap_is_replayed_not_reexecuted() {
    let mut p = rc();
    let r = regions(&mut p);
    p.bytes_mut(B, &r.dst)[..8].copy_from_slice(&100u64.to_ne_bytes());
    p.post_send(
        A,
        wr(
            1,
            SendOp::CompareSwap {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                compare: 100,
                swap: 7,
            },
            &[sge(&r.src, SRC + RES, 8)],
        ),
    );
    let mut dropped = false;
    p.settle_with(10, |from, _| {
        if from == B && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    let origs: Vec<_> = p
        .sent_by(B)
        .iter()
        .map(|s| s.pkt.atomic_ack_eth.unwrap().orig)
        .collect();
    assert_eq!(origs, vec![100, 100]);
    assert_eq!(word(p.bytes(B, &r.dst), 0), 7);
    assert_eq!(word(p.bytes(A, &r.src), RES as usize), 100);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
}

/// Rule: a duplicate READ/atomic whose PSN is no longer in the responder resources (the ring
/// keeps `max_dest_rd_atomic` entries) is dropped silently — class D (rxe `duplicate_request`:
/// "Resource not found. Class D error. Drop the request."). Nothing is answered, nothing is
/// executed, the QP stays in RTS.
#[test]
fn duplicate_atomic_outside_the_resources_is_dropped() {
    let mut p = rc_with(|a| a.max_dest_rd_atomic = 1);
    let r = regions(&mut p);
    p.bytes_mut(B, &r.dst)[..8].copy_from_slice(&100u64.to_ne_bytes());
    for i in 0..2u64 {
        p.post_send(
            A,
            wr(
                1 + i,
                SendOp::FetchAdd {
                    remote_addr: DST,
                    rkey: rkey(&r.dst),
                    add: 1,
                },
                &[sge(&r.src, SRC + RES + 8 * i, 8)],
            ),
        );
    }
    p.settle();
    assert_eq!(st(&p.completions(A)).len(), 2);
    assert_eq!(word(p.bytes(B, &r.dst), 0), 102);
    let first = p.log[0].1.clone();
    let sent_before = p.sent_by(B).len();
    let repr = PacketRepr::parse_bytes(&first).unwrap();
    assert_eq!(repr.bth.opcode, Opcode::RcFetchAdd);
    p.inject(A, &repr);
    assert!(
        p.transmit(B).is_none(),
        "an evicted duplicate is not answered"
    );
    assert_eq!(p.sent_by(B).len(), sent_before);
    assert_eq!(word(p.bytes(B, &r.dst), 0), 102, "not executed again");
    assert_eq!(p.b.qp.state(), QpState::Rts);
    assert_eq!(p.b.qp.counters().duplicate_request, 1);
}

/// Rule: the re-ACK of a duplicate SEND/WRITE carries the PSN of the last SEND/WRITE/atomic
/// acknowledged, never that of a later RDMA READ: an ACK cannot acknowledge a READ (only its
/// responses do), and the requester would read it as an implied NAK and re-request the READ
/// for nothing (rxe commit "IB/rxe: fix for duplicate request processing and ack psns":
/// `duplicate_request` uses `resp.ack_psn - 1`, which READs do not advance). Here WRITE(p0)
/// and READ(p1) lose their answers; at the timeout both are resent; the duplicate WRITE must
/// be re-ACKed with p0, and no second retry may start.
#[test]

fn duplicate_write_after_a_read_is_reacked_with_the_write_psn() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 64)],
        ),
    );
    p.post_send(
        A,
        wr(
            2,
            SendOp::Read {
                remote_addr: DST + 4096,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 64)],
        ),
    );
    p.pump_with(|from, _| if from == B { Fate::Drop } else { Fate::Deliver });
    p.settle();
    let t = p.trace();
    let b = p.sent_by(B);
    // First round (all lost): ACK(p0), READ_RESPONSE_ONLY(p1). Second round: the re-ACK.
    let reack = b
        .iter()
        .skip(2)
        .find(|s| s.pkt.bth.opcode == Opcode::RcAcknowledge)
        .expect("a re-ACK")
        .pkt
        .bth
        .psn;
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(reack, ps(0), "{t}");
    assert_eq!(
        p.a.qp.counters().completer_retry_err,
        1,
        "only the timeout started a retry"
    );
}

/// Rule: a PSN gap inside a multi-packet SEND keeps the receive WQE the SEND is filling: the
/// resent MIDDLE/LAST continue it and exactly one receive completion reports the whole
/// message (IBA 9.7.5.1.3: class B, nothing is lost at the responder; rxe keeps
/// `resp.wqe` across the NAK).
#[test]
fn psn_gap_inside_a_send_keeps_its_receive_wqe() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 4096, 4096)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 3000)]));
    let mut dropped = false;
    p.settle_with(10, |from, r| {
        if from == A && r.bth.psn == ps(1) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    assert_eq!(acks(&p, B)[0], (ps(1), nak(NakCode::PsnSequenceError)));
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 3000)]
    );
    assert_eq!(p.b.qp.recv_queue_len(), 1);
    same(&p.bytes(B, &r.rcv)[..3000], &pattern(3000), "data");
}

/// Rule: inline data is copied when the WR is posted (IBA 10.8.2 `IBV_SEND_INLINE`: the
/// buffer may be reused as soon as `ibv_post_send` returns; rxe `copy_inline_data_to_wqe`),
/// so later changes to the source do not reach the wire — not even in a retransmission.
#[test]
fn inline_data_is_captured_at_post_time() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    let mut data = vec![0x42u8; 100];
    p.post_send(A, send(1, &[]).with_inline(data.clone()));
    data.fill(0x99);
    let mut first = true;
    p.settle_with(10, |from, _| {
        if from == A && first {
            first = false;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    let a = p.sent_by(A);
    assert_eq!(a.len(), 2, "sent, lost, resent");
    assert!(a.iter().all(|s| s.pkt.payload == [0x42u8; 100]));
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert_eq!(&p.bytes(B, &r.rcv)[..100], &[0x42u8; 100][..]);
    assert_eq!(data[0], 0x99);
}

// ---------------------------------------------------------------------------------------
// READ retries
// ---------------------------------------------------------------------------------------

fn read_4k(p: &mut Pair, r: &Regions) {
    p.bytes_mut(B, &r.dst)[..4096].copy_from_slice(&pattern(4096));
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 4096)],
        ),
    );
}

/// Rule: when a middle READ response is lost, the requester re-requests only the missing part
/// (IBA 9.7.5.1; rxe `req_retry`: `wqe->iova += npsn * mtu`, RETH length = the
/// residue, request PSN = the first missing response PSN). The 4-packet READ loses response
/// PSN+1: the second READ request carries PSN+1, va+1024, length 3072; the responder answers
/// PSN+1..PSN+3 (starting with READ_RESPONSE_FIRST, as hardware does) and the data is intact.
/// srdma re-requests as soon as the next response shows the gap (a sequence error on the
/// responses, like an implied NAK); rxe ignores the out-of-order responses
/// (`check_psn` → `COMPST_DONE`) and re-requests at the ACK timeout. Both are valid; the
/// re-request is exactly one either way.
#[test]
fn partial_read_retry_restarts_at_the_missing_offset() {
    let mut p = rc();
    let r = regions(&mut p);
    read_4k(&mut p, &r);
    let mut dropped = false;
    p.settle_with(10, |from, r| {
        if from == B && r.bth.psn == ps(1) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    let t = p.trace();
    let reqs: Vec<_> = p
        .sent_by(A)
        .iter()
        .map(|s| (s.pkt.bth.opcode, s.pkt.bth.psn, s.pkt.reth.unwrap(), s.at))
        .collect();
    assert_eq!(reqs.len(), 2, "{t}");
    assert_eq!(
        (reqs[0].1, reqs[0].2.va, reqs[0].2.dma_len),
        (ps(0), DST, 4096)
    );
    assert_eq!(reqs[1].0, Opcode::RcRdmaReadRequest);
    assert_eq!(
        (reqs[1].1, reqs[1].2.va, reqs[1].2.dma_len, reqs[1].2.rkey),
        (ps(1), DST + 1024, 3072, rkey(&r.dst).0),
        "{t}"
    );
    assert_eq!(
        reqs[1].3,
        Duration::ZERO,
        "re-requested on the gap, not by the timer"
    );
    let resp: Vec<_> = wire(&p, B);
    assert_eq!(
        resp[4..],
        [
            (Opcode::RcRdmaReadResponseFirst, ps(1)),
            (Opcode::RcRdmaReadResponseMiddle, ps(2)),
            (Opcode::RcRdmaReadResponseLast, ps(3)),
        ],
        "{t}"
    );
    assert_eq!(resp.len(), 7, "{t}");
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    same(
        &p.bytes(A, &r.src)[RES as usize..RES as usize + 4096],
        &pattern(4096)[..],
        "data",
    );
}

/// A 1 MiB READ from B whose responses lose PSN 100 once, `selective` or go-back-N between
/// the two; returns the pair after it settled and the time the READ took.
fn read_losing_one_response(selective: bool) -> (Pair, Duration) {
    let mut p = rc();
    if selective {
        p.a.qp
            .set_reliability(srdma_proto::transport::Reliability::SelectiveRepeat);
        p.b.qp
            .set_reliability(srdma_proto::transport::Reliability::SelectiveRepeat);
    }
    let len = 1 << 20;
    let data = pattern(len);
    let remote = p.reg(B, DST, len, 0, all_remote());
    p.bytes_mut(B, &remote).copy_from_slice(&data);
    let local = p.reg(A, SRC, len, 0, all_remote());
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&remote),
            },
            &[sge(&local, SRC, len as u32)],
        ),
    );
    let start = p.now;
    let mut dropped = false;
    p.settle_with(10_000, |from, r| {
        if from == B && r.bth.psn == ps(100) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    assert!(dropped);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    same(p.bytes(A, &local), &data, "data");
    let took = p.now - start;
    (p, took)
}

/// Rule (srdma): READ responses are not acknowledged, and a requester that asks for some
/// again lost them (IBA 9.7.5.1.4: a READ request with a PSN already executed). Toward a
/// go-back-N requester (rxe, a NIC) that is the responder's loss signal: its READ responses
/// are paced from then on, at half the rate they left at (at least
/// `congestion::dcqcn::MIN_RATE`), so that a requester slower than srdma (rxe in a slow
/// guest) is not sent bursts it loses again and again. They still go in PSN order and the
/// data is intact. A selective-repeat requester paces its READs itself: no cut there.
#[test]
fn a_read_asked_again_paces_the_responses_toward_a_go_back_n_requester() {
    use srdma_proto::congestion::{dcqcn::MIN_RATE, responses::HOLD};
    let (p, took) = read_losing_one_response(false);
    let cc = p.b.qp.congestion();
    assert_eq!(cc.read_cuts, 1, "one loss, one cut");
    // The simulated clock stands still while packets move: the rate measured before the
    // cut is nothing, and the limit is the floor, MIN_RATE. What followed the lost PSN
    // (about 900 KiB) needs more than HOLD at that rate, so the READ took at least HOLD;
    // the limit then grew back to the rate first measured and went.
    assert!((900 << 10) as f64 / MIN_RATE as f64 > HOLD.as_secs_f64());
    assert!(took >= HOLD, "{took:?}");
    assert_eq!(cc.read_rate, None);
    // The responses in PSN order after the re-request, never a gap.
    let psns: Vec<_> = wire(&p, B).into_iter().map(|(_, psn)| psn).collect();
    let restart = psns.iter().rposition(|&x| x == ps(100)).unwrap();
    assert!(psns[restart..].windows(2).all(|w| w[1] == w[0].add(1)));

    let (p, took) = read_losing_one_response(true);
    let cc = p.b.qp.congestion();
    assert_eq!((cc.read_cuts, cc.read_rate), (0, None));
    assert!(took < Duration::from_millis(100), "{took:?}");
}

/// Rule (rxe interoperability): rxe's responder replays a partial READ from its resource in
/// the "replay" state and so answers a re-request that starts mid-READ with
/// READ_RESPONSE_MIDDLE … LAST (`rxe_resp.c read_reply`: `res->state != new` → MIDDLE/LAST),
/// while hardware answers with FIRST … LAST; rxe's completer accepts either (`check_ack`).
/// A requester talking to kernel rxe must complete the READ from a MIDDLE/LAST replay.
#[test]

fn partial_read_retry_accepts_an_rxe_style_middle_last_replay() {
    let mut p = rc_with(|a| {
        a.retry_cnt = 2;
        a.timeout = 10;
    });
    let r = regions(&mut p);
    read_4k(&mut p, &r);
    let mut dropped = false;
    let mut rewritten = 0;
    p.settle_with(10, |from, r| {
        if from == B && r.bth.psn == ps(1) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        // The replay's first packet: rewrite READ_RESPONSE_FIRST as rxe sends it.
        if from == B && dropped && r.bth.opcode == Opcode::RcRdmaReadResponseFirst {
            let mut x = *r;
            x.bth.opcode = Opcode::RcRdmaReadResponseMiddle;
            x.aeth = None;
            rewritten += 1;
            return Fate::Replace(craft(&x));
        }
        Fate::Deliver
    });
    let t = p.trace();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)], "{t}");
    assert_eq!(rewritten, 1, "one replay was enough\n{t}");
    same(
        &p.bytes(A, &r.src)[RES as usize..RES as usize + 4096],
        &pattern(4096)[..],
        "data",
    );
}

// ---------------------------------------------------------------------------------------
// RNR
// ---------------------------------------------------------------------------------------

/// Rule: a SEND arriving with no receive WQE is answered with an RNR NAK carrying the
/// packet's PSN and the responder's `min_rnr_timer` (IBA 9.7.5.2.8; rxe
/// `RESPST_ERR_RNR`, class B: the QP stays). The requester waits the RNR timer — not a
/// nanosecond less — then resends the same PSN; once a receive is posted it completes.
/// Counters: send_rnr_err (responder), rcvd_rnr_err (requester).
#[test]
fn rnr_nak_waits_the_rnr_timer_then_succeeds() {
    let mut p = rc_with(|a| a.min_rnr_timer = 12); // 0.64 ms
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    p.pump();
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), Syndrome::RnrNak { timer_code: 12 })]
    );
    assert!(p.completions(A).is_empty());
    assert_eq!(p.b.qp.state(), QpState::Rts);
    let wait = rnr_timer(12);
    assert_eq!(wait, Duration::from_micros(640));
    assert_eq!(p.a.qp.poll_timeout(), Some(wait));
    assert!(!p.a.qp.wants_transmit());

    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    // Just before the timer: nothing moves.
    p.run_timers_at(wait - Duration::from_nanos(1));
    assert_eq!(p.pump(), 0, "retransmitted before the RNR timer expired");
    // At the timer: the SEND goes again, same PSN, and completes.
    p.run_timers_at(wait);
    p.settle();
    let a = p.sent_by(A);
    assert_eq!(
        a.iter()
            .map(|s| (s.pkt.bth.opcode, s.pkt.bth.psn, s.at))
            .collect::<Vec<_>>(),
        vec![
            (Opcode::RcSendOnly, ps(0), Duration::ZERO),
            (Opcode::RcSendOnly, ps(0), wait)
        ]
    );
    assert_eq!(acks(&p, B)[1], (ps(0), Syndrome::ACK));
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    let b = p.completions(B);
    assert_eq!(st(&b), vec![(100, WcStatus::Success)]);
    same(&p.bytes(B, &r.rcv)[..100], &pattern(100)[..], "data");
    assert_eq!(p.a.qp.counters().rcvd_rnr_err, 1);
    assert_eq!(p.b.qp.counters().send_rnr_err, 1);
}

/// Rule: a WRITE with immediate needs a receive WQE too (IBA 9.7.5.2.8; rxe `RXE_RWR_MASK`):
/// without one it is RNR NAKed before any byte is placed, and completes once a receive is
/// posted, consuming it with opcode RECV_RDMA_WITH_IMM and byte_len = the RETH length. The
/// RNR NAK is class B: it leaves no trace in the responder, so the retried request is
/// executed as new (rxe: the RNR is decided in `check_resource`, before any state changes).
#[test]

fn write_with_imm_without_receive_is_rnr_naked_then_completes() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::WriteWithImm {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                imm: 0x1234_5678,
            },
            &[sge(&r.src, SRC, 200)],
        ),
    );
    p.pump();
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), Syndrome::RnrNak { timer_code: 1 })]
    );
    assert_eq!(
        &p.bytes(B, &r.dst)[..200],
        &[0xEE; 200][..],
        "placed before RNR"
    );
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 16)]);
    p.settle();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    let b = p.completions(B);
    assert_eq!(b.len(), 1);
    assert_eq!(
        (
            b[0].wr_id,
            b[0].status,
            b[0].opcode,
            b[0].byte_len,
            b[0].imm_data
        ),
        (
            100,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            200,
            Some(0x1234_5678)
        )
    );
    assert!(b[0].wc_flags.contains(WcFlags::WITH_IMM));
    same(&p.bytes(B, &r.dst)[..200], &pattern(200)[..], "data");
    assert_eq!(
        &p.bytes(B, &r.rcv)[..16],
        &[0xCC; 16],
        "no data in the receive buffer"
    );
    assert_eq!(
        p.b.qp.silent_writes(),
        0,
        "a WRITE with immediate completes"
    );
}

/// Rule: RNR retries exhausted (IBA 9.7.5.2.8; rxe `COMPST_RNR_RETRY`): with
/// `rnr_retry` = 2 the requester sends the SEND 3 times, gets exactly 3 RNR NAKs, waits the
/// RNR timer between them, then completes the WQE with RNR_RETRY_EXC_ERR and moves to ERR.
/// The responder QP is untouched (RNR is class B).
#[test]
fn rnr_retry_exhausted_after_exactly_three_rnr_naks() {
    let mut p = rc_with(|a| a.rnr_retry = 2);
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    p.settle_with(20, |_, _| Fate::Deliver);
    let t = p.trace();
    let rnr = Syndrome::RnrNak { timer_code: 1 };
    assert_eq!(acks(&p, B), vec![(ps(0), rnr); 3], "{t}");
    let step = rnr_timer(1);
    assert_eq!(
        p.sent_by(A).iter().map(|s| s.at).collect::<Vec<_>>(),
        vec![Duration::ZERO, step, step * 2],
        "{t}"
    );
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RnrRetryExcErr)]);
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.counters().retry_rnr_exceeded_err, 1);
    assert_eq!(p.a.qp.counters().rcvd_rnr_err, 3);
    assert_eq!(p.b.qp.counters().send_rnr_err, 3);
    assert_eq!(p.b.qp.state(), QpState::Rts);
    // A send posted to the failed QP is flushed at once.
    p.post_send(A, send(2, &[sge(&r.src, SRC, 8)]));
    assert_eq!(st(&p.completions(A)), vec![(2, WcStatus::WrFlushErr)]);
    assert!(p.transmit(A).is_none());
}

/// Rule: as above with more WQEs queued behind the first: they are pipelined, so the
/// responder also sends a PSN-sequence NAK for the SEND after the refused one; that NAK
/// acknowledges nothing new and must not refill the RNR retry budget (rxe only resets the
/// retry counters on a good response, `reset_retry_counters`). After exactly 3 RNR NAKs the
/// head completes with RNR_RETRY_EXC_ERR and the rest are flushed, in order.
#[test]
fn rnr_retry_exhausted_flushes_the_rest_in_order() {
    let mut p = rc_with(|a| a.rnr_retry = 2);
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 100)]));
    p.post_send(
        A,
        wr(
            3,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 100)],
        ),
    );
    p.settle_with(20, |_, _| Fate::Deliver);
    let t = p.trace();
    let rnr_naks = acks(&p, B)
        .iter()
        .filter(|(_, s)| matches!(s, Syndrome::RnrNak { .. }))
        .count();
    assert_eq!(rnr_naks, 3, "{t}");
    assert_eq!(
        st(&p.completions(A)),
        vec![
            (1, WcStatus::RnrRetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
}

// ---------------------------------------------------------------------------------------
// Retransmission timer
// ---------------------------------------------------------------------------------------

/// Rule: when the peer is gone, the requester retransmits at every local ACK timeout
/// (4.096 µs × 2^timeout, IBA 9.7.6.1.3; rxe `rxe_qp.c`: `4096 << timeout` ns) and
/// after `retry_cnt` retries — `retry_cnt + 1` transmissions — completes the head WQE with
/// RETRY_EXC_ERR, moves to ERR and flushes the rest (rxe `COMPST_ERROR_RETRY`). Checked on
/// the virtual clock.
#[test]
fn retries_exhausted_when_the_peer_is_gone() {
    let mut p = rc_with(|a| {
        a.retry_cnt = 3;
        a.timeout = 10;
    });
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 100)]));
    p.settle_with(100, |_, _| Fate::Drop);
    let tick = Duration::from_nanos(4096 << 10);
    assert_eq!(local_ack_timeout(10), Some(tick));
    let first: Vec<_> = p
        .sent_by(A)
        .iter()
        .filter(|s| s.pkt.bth.psn == ps(0))
        .map(|s| s.at)
        .collect();
    assert_eq!(first, vec![Duration::ZERO, tick, tick * 2, tick * 3]);
    assert_eq!(p.sent_by(A).len(), 8, "both SENDs, 4 times each");
    assert_eq!(p.now, tick * 4, "the error is reported at the 4th timeout");
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::RetryExcErr, WcOpcode::Send),
            (2, WcStatus::WrFlushErr, WcOpcode::Send)
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.poll_timeout(), None);
    assert_eq!(p.a.qp.counters().retry_exceeded_err, 1);
    assert_eq!(p.a.qp.counters().completer_retry_err, 3);
    assert_eq!(p.a.qp.counters().send_err, 2);
}

/// Rule: `retry_cnt` = 7 means seven retries (IBTA defines "7 = infinite" only for
/// `rnr_retry`, 9.7.5.2.8 vs. 9.7.6.1.3). srdma follows IBTA here; rxe treats 7 as
/// infinite (`if (qp->comp.retry_cnt != 7) retry_cnt--`) — a documented deviation.
#[test]
fn retry_cnt_seven_is_seven_retries() {
    let mut p = rc_with(|a| {
        a.retry_cnt = 7;
        a.timeout = 1;
    });
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]));
    p.settle_with(100, |_, _| Fate::Drop);
    assert_eq!(p.sent_by(A).len(), 8);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RetryExcErr)]);
}

/// Rule: `timeout` = 0 disables the local ACK timer (IBA 9.7.6.1.3: "infinite"; rxe:
/// `qp_timeout_jiffies = 0`): a lost request is never retransmitted and never fails.
#[test]
fn timeout_zero_never_retransmits() {
    let mut p = rc_with(|a| a.timeout = 0);
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]));
    p.settle_with(100, |_, _| Fate::Drop);
    assert_eq!(p.sent_by(A).len(), 1);
    assert_eq!(p.a.qp.poll_timeout(), None);
    assert!(!p.fire_next_timer());
    assert!(p.completions(A).is_empty());
    assert_eq!(p.a.qp.send_queue_len(), 1);
    assert_eq!(p.a.qp.state(), QpState::Rts);
}

/// Rule: the RC requester starts with at most `RXE_MAX_UNACKED_PSNS` (128) PSNs outstanding
/// (rxe `rxe_req.c`: `wait_psn`). With every ACK lost, a 200-packet WRITE stops after 128.
/// (rxe's test `psn_compare(req.psn, comp.psn + 128) > 0` lets one more through: 129.)
#[test]
fn at_most_128_unacknowledged_psns() {
    let mut p = rc_with(|a| a.path_mtu = Mtu::Mtu256);
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 200 * 256)],
        ),
    );
    p.pump_with(|from, _| if from == B { Fate::Drop } else { Fate::Deliver });
    assert_eq!(p.sent_by(A).len(), MAX_UNACKED_PSNS as usize);
    assert_eq!(p.sent_by(A).last().unwrap().pkt.bth.psn, ps(127));
}

/// A WRITE of `packets` packets of 256 bytes from A into B, posted; returns (A's source, B's
/// target) regions.
fn post_big_write(p: &mut Pair, wr_id: u64, packets: u32) -> (MrKeys, MrKeys) {
    let len = packets as usize * 256;
    let src = p.reg(A, SRC, len, 0x5A, all_remote());
    let dst = p.reg(B, DST, len, 0, all_remote());
    p.post_send(
        A,
        wr(
            wr_id,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&dst),
            },
            &[sge(&src, SRC, len as u32)],
        ),
    );
    (src, dst)
}

/// Rule (srdma; rxe's window is fixed): the window doubles, up to `MAX_WINDOW_PSNS`, after two
/// rounds in a row in which it held a packet back and the responder then acknowledged
/// everything sent; a PSN-sequence NAK on a path that shows no queue cuts it to 7/8
/// (`congestion::RANDOM_LOSS_CUT`: a loss there is noise, not congestion).
#[test]
fn the_psn_window_grows_while_the_responder_drains_it_and_falls_back_on_a_loss() {
    let mut p = rc_with(|a| a.path_mtu = Mtu::Mtu256);
    let n = 4 * MAX_WINDOW_PSNS;
    let (_, dst) = post_big_write(&mut p, 1, n);
    // Rounds: A sends all it may, B takes all of it and answers with one cumulative ACK.
    let mut bursts = vec![];
    loop {
        let mut k = 0;
        while let Some((pkt, e)) = p.transmit(A) {
            p.deliver(B, &pkt, e);
            k += 1;
        }
        if k == 0 {
            break;
        }
        bursts.push(k);
        while let Some((pkt, e)) = p.transmit(B) {
            p.deliver(A, &pkt, e);
        }
    }
    assert_eq!(
        bursts,
        [128, 128, 256, 256, 512, 512, 1024, 1024, 256],
        "packets per round"
    );
    assert_eq!(st(&p.completions(A)), [(1, WcStatus::Success)]);
    assert!(p.bytes(B, &dst).iter().all(|&b| b == 0x5A));

    // At 1024, the tenth packet of the next WRITE is lost: B NAKs the eleventh, and A resends
    // from the tenth with 7/8 of the window in flight.
    let base = p.sent_by(A).len();
    let (_, _) = post_big_write(&mut p, 2, n);
    let mut k = 0;
    while let Some((pkt, e)) = p.transmit(A) {
        if k != 9 {
            p.deliver(B, &pkt, e);
        }
        k += 1;
    }
    assert_eq!(k, 1024);
    while let Some((pkt, e)) = p.transmit(B) {
        p.deliver(A, &pkt, e);
    }
    let resent: Vec<Psn> = std::iter::from_fn(|| p.transmit(A))
        .map(|(pkt, _)| PacketRepr::parse_bytes(&pkt).unwrap().bth.psn)
        .collect();
    let first = p.sent_by(A)[base].pkt.bth.psn;
    let (num, den) = srdma_proto::congestion::RANDOM_LOSS_CUT;
    assert_eq!(
        resent.len() as u32,
        MAX_WINDOW_PSNS * num / den,
        "window after the NAK"
    );
    assert_eq!(p.a.qp.congestion().loss_cuts, 1);
    assert_eq!(
        resent[0],
        first.add(9),
        "the retry starts at the lost packet"
    );
    assert_eq!(p.a.qp.counters().rcvd_seq_err, 1);
}

/// Rule (srdma): a path that holds a whole window (`Qp::path_holds_window`: a shared-memory
/// ring, memory that never drops) starts the window at `MAX_WINDOW_PSNS` and keeps it there:
/// a loss (a peer that restarted, a test that drops) is recovered, not taken for congestion.
#[test]
fn a_path_that_holds_the_window_opens_it_at_once_and_a_loss_does_not_close_it() {
    let mut p = rc_with(|a| a.path_mtu = Mtu::Mtu256);
    p.a.qp.path_holds_window();
    let n = 2 * MAX_WINDOW_PSNS;
    let (_, dst) = post_big_write(&mut p, 1, n);
    let mut k = 0;
    while let Some((pkt, e)) = p.transmit(A) {
        // The tenth packet is lost.
        if k != 9 {
            p.deliver(B, &pkt, e);
        }
        k += 1;
    }
    assert_eq!(
        k, MAX_WINDOW_PSNS,
        "the first burst fills the largest window"
    );
    while let Some((pkt, e)) = p.transmit(B) {
        p.deliver(A, &pkt, e);
    }
    let mut resent = 0;
    while let Some((pkt, e)) = p.transmit(A) {
        p.deliver(B, &pkt, e);
        resent += 1;
    }
    assert_eq!(resent, MAX_WINDOW_PSNS, "window after the NAK");
    assert_eq!(p.a.qp.congestion().loss_cuts, 0);
    // Let everything through: the WRITE completes.
    loop {
        let mut moved = 0;
        while let Some((pkt, e)) = p.transmit(A) {
            p.deliver(B, &pkt, e);
            moved += 1;
        }
        while let Some((pkt, e)) = p.transmit(B) {
            p.deliver(A, &pkt, e);
            moved += 1;
        }
        if moved == 0 {
            break;
        }
    }
    assert_eq!(st(&p.completions(A)), [(1, WcStatus::Success)]);
    assert!(p.bytes(B, &dst).iter().all(|&b| b == 0x5A));
}

/// Rule (srdma): a responder that acknowledges part of what was sent while the rest waits in
/// its queue (rxe ACKs the AckReq of every 64th packet as it reaches it) never lets the
/// window grow: the requester keeps at most 128 PSNs outstanding, as toward rxe.
#[test]
fn the_psn_window_stays_at_128_toward_a_responder_that_lags() {
    let mut p = rc_with(|a| a.path_mtu = Mtu::Mtu256);
    let n = 4 * MAX_WINDOW_PSNS;
    let (_, dst) = post_big_write(&mut p, 1, n);
    // Each step A sends up to 64 packets and B handles them; B's ACKs reach A two steps later.
    let mut late: std::collections::VecDeque<Vec<(Vec<u8>, srdma_wire::Encap)>> =
        Default::default();
    let mut next_unacked = Psn::new(PSN_A);
    let mut most = 0;
    for _ in 0..100_000 {
        let mut k = 0;
        while k < 64 {
            let Some((pkt, e)) = p.transmit(A) else { break };
            let psn = PacketRepr::parse_bytes(&pkt).unwrap().bth.psn;
            most = most.max(psn.diff(next_unacked) + 1);
            p.deliver(B, &pkt, e);
            k += 1;
        }
        late.push_back(std::iter::from_fn(|| p.transmit(B)).collect());
        if late.len() > 2 {
            for (ack, e) in late.pop_front().unwrap() {
                let psn = PacketRepr::parse_bytes(&ack).unwrap().bth.psn;
                next_unacked = psn.add(1);
                p.deliver(A, &ack, e);
            }
        }
        if k == 0 && late.iter().all(Vec::is_empty) {
            break;
        }
    }
    assert_eq!(most, 128, "most PSNs outstanding");
    assert_eq!(st(&p.completions(A)), [(1, WcStatus::Success)]);
    assert!(p.bytes(B, &dst).iter().all(|&b| b == 0x5A));
}

// ---------------------------------------------------------------------------------------
// Remote access errors
// ---------------------------------------------------------------------------------------

/// The common check of a remote violation: A posts `op` (on `len` bytes of its region) and a
/// SEND behind it; B's target region has `access`. The requester gets `expect` (NAK code
/// `code`) for the first and WR_FLUSH_ERR for the second, both QPs end in ERR, B's posted
/// receive is flushed, and neither side's memory changed. `rewrite` may replace A's first
/// request on the wire.
fn check_violation(
    access: AccessFlags,
    op: impl Fn(RKey) -> SendOp,
    len: u32,
    code: NakCode,
    expect: WcStatus,
    rewrite: impl Fn(&PacketRepr<'_>) -> Option<Vec<u8>>,
) {
    let mut p = rc();
    let src = p.reg(A, SRC, LEN, 0, all_remote());
    p.bytes_mut(A, &src)[..LEN / 2].copy_from_slice(&pattern(LEN / 2));
    p.bytes_mut(A, &src)[RES as usize..RES as usize + 16].fill(0xAB);
    let dst = p.reg(B, DST, 4096, 0xEE, access);
    p.bytes_mut(B, &dst)[..8].copy_from_slice(&100u64.to_ne_bytes());
    let rcv = p.reg(B, RCV, 4096, 0xCC, all_remote());
    let a_before = p.bytes(A, &src).to_vec();
    let b_before = p.bytes(B, &dst).to_vec();
    p.post_recv(B, 100, &[sge(&rcv, RCV, 256)]);
    let the_op = op(dst.rkey.unwrap_or(RKey(dst.lkey.0)));
    let at = if the_op.is_read_or_atomic() {
        SRC + RES
    } else {
        SRC
    };
    p.post_send(A, wr(1, the_op, &[sge(&src, at, len)]));
    p.post_send(A, send(2, &[sge(&src, SRC, 16)]));
    let mut first = true;
    p.settle_with(10, |from, r| {
        if from == A && first {
            first = false;
            if let Some(b) = rewrite(r) {
                return Fate::Replace(b);
            }
        }
        Fate::Deliver
    });
    let t = p.trace();
    let wcs = p.completions(A);
    assert_eq!(
        st(&wcs),
        vec![(1, expect), (2, WcStatus::WrFlushErr)],
        "{t}"
    );
    assert_eq!(wcs[0].opcode, the_op.wr_opcode().wc_opcode().unwrap());
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), nak(code))],
        "exactly one NAK, for the offending PSN\n{t}"
    );
    assert!(
        p.sent_by(B).len() == 1,
        "the responder sends nothing but the NAK\n{t}"
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(
        p.b.qp.state(),
        QpState::Err,
        "class C error: responder QP → ERR"
    );
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::WrFlushErr)]);
    assert_eq!(p.bytes(B, &dst), &b_before[..], "target memory changed");
    assert_eq!(p.bytes(A, &src), &a_before[..], "local memory changed");
    // Later WRs are flushed at once on both sides.
    p.post_send(A, send(3, &[sge(&src, SRC, 8)]));
    assert_eq!(st(&p.completions(A)), vec![(3, WcStatus::WrFlushErr)]);
    p.post_recv(B, 101, &[sge(&rcv, RCV, 8)]);
    assert_eq!(st(&p.completions(B)), vec![(101, WcStatus::WrFlushErr)]);
}

fn no_rewrite(_: &PacketRepr<'_>) -> Option<Vec<u8>> {
    None
}

fn bad_key(k: RKey) -> RKey {
    RKey(k.0 ^ 0x5A) // the right index, a wrong key byte
}

const NO_REMOTE_WRITE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const NO_REMOTE_READ: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);
const NO_REMOTE_ATOMIC: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// Rule: an RDMA WRITE with an invalid R_Key is NAKed "remote access error" (IBA 9.7.5.2,
/// class C; rxe `check_rkey` → `RESPST_ERR_RKEY_VIOLATION`): REM_ACCESS_ERR, target
/// untouched, responder QP → ERR, later WRs flushed.
#[test]
fn write_with_invalid_rkey_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::Write {
            remote_addr: DST,
            rkey: bad_key(k),
        },
        2048,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: an RDMA WRITE past the end of the region is a remote access error (rxe
/// `mr_check_range` in `check_rkey`).
#[test]
fn write_out_of_bounds_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::Write {
            remote_addr: DST + 4096 - 8,
            rkey: k,
        },
        16,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: an RDMA WRITE to a region registered without REMOTE_WRITE is a remote access error
/// (rxe `lookup_mr` with `IB_ACCESS_REMOTE_WRITE`).
#[test]
fn write_to_region_without_remote_write_is_remote_access_error() {
    check_violation(
        NO_REMOTE_WRITE,
        |k| SendOp::Write {
            remote_addr: DST,
            rkey: k,
        },
        64,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: an RDMA READ with an invalid R_Key is a remote access error; the requester's buffer
/// is not written.
#[test]
fn read_with_invalid_rkey_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::Read {
            remote_addr: DST,
            rkey: bad_key(k),
        },
        2048,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: an RDMA READ past the end of the region is a remote access error (the whole RETH
/// range is checked on the request, rxe `check_rkey`).
#[test]
fn read_out_of_bounds_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::Read {
            remote_addr: DST + 1024,
            rkey: k,
        },
        4096,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: an RDMA READ from a region without REMOTE_READ is a remote access error.
#[test]
fn read_from_region_without_remote_read_is_remote_access_error() {
    check_violation(
        NO_REMOTE_READ,
        |k| SendOp::Read {
            remote_addr: DST,
            rkey: k,
        },
        64,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: a COMPARE_SWAP with an invalid R_Key is a remote access error; the word is unchanged.
#[test]
fn compare_swap_with_invalid_rkey_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::CompareSwap {
            remote_addr: DST,
            rkey: bad_key(k),
            compare: 100,
            swap: 1,
        },
        8,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: a COMPARE_SWAP outside the region (aligned, one word past the end) is a remote
/// access error.
#[test]
fn compare_swap_out_of_bounds_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::CompareSwap {
            remote_addr: DST + 4096,
            rkey: k,
            compare: 0,
            swap: 1,
        },
        8,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: a COMPARE_SWAP on a region without REMOTE_ATOMIC is a remote access error.
#[test]
fn compare_swap_without_remote_atomic_is_remote_access_error() {
    check_violation(
        NO_REMOTE_ATOMIC,
        |k| SendOp::CompareSwap {
            remote_addr: DST,
            rkey: k,
            compare: 100,
            swap: 1,
        },
        8,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: a FETCH_ADD with an invalid R_Key is a remote access error.
#[test]
fn fetch_add_with_invalid_rkey_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::FetchAdd {
            remote_addr: DST,
            rkey: bad_key(k),
            add: 1,
        },
        8,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: a FETCH_ADD outside the region is a remote access error.
#[test]
fn fetch_add_out_of_bounds_is_remote_access_error() {
    check_violation(
        all_remote(),
        |k| SendOp::FetchAdd {
            remote_addr: DST + 4096,
            rkey: k,
            add: 1,
        },
        8,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Rule: a FETCH_ADD on a region without REMOTE_ATOMIC is a remote access error.
#[test]
fn fetch_add_without_remote_atomic_is_remote_access_error() {
    check_violation(
        NO_REMOTE_ATOMIC,
        |k| SendOp::FetchAdd {
            remote_addr: DST,
            rkey: k,
            add: 1,
        },
        8,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        no_rewrite,
    );
}

/// Moves the AtomicETH address of an atomic request 4 bytes up (misaligned). The requester
/// refuses such a WR at post time (`PostError::BadAtomic`, rxe `validate_send_wr`), so it is
/// crafted on the wire.
fn misalign(r: &PacketRepr<'_>) -> Option<Vec<u8>> {
    let mut x = *r;
    let a = x.atomic_eth.as_mut()?;
    a.va += 4;
    Some(craft(&x))
}

/// Rule: a misaligned atomic (va not 8-byte aligned) is NAKed "invalid request" (rxe
/// `RESPST_ERR_MISALIGNED_ATOMIC` → `AETH_NAK_INVALID_REQ`): REM_INV_REQ_ERR,
/// memory unchanged, responder QP in ERR.
#[test]
fn misaligned_compare_swap_is_invalid_request() {
    check_violation(
        all_remote(),
        |k| SendOp::CompareSwap {
            remote_addr: DST + 8,
            rkey: k,
            compare: 0xEEEE_EEEE_EEEE_EEEE,
            swap: 1,
        },
        8,
        NakCode::InvalidRequest,
        WcStatus::RemInvReqErr,
        misalign,
    );
}

/// Rule: as above for FETCH_ADD.
#[test]
fn misaligned_fetch_add_is_invalid_request() {
    check_violation(
        all_remote(),
        |k| SendOp::FetchAdd {
            remote_addr: DST + 8,
            rkey: k,
            add: 1,
        },
        8,
        NakCode::InvalidRequest,
        WcStatus::RemInvReqErr,
        misalign,
    );
}

/// The requester half of the misaligned-atomic rule: such a WR never reaches the wire.
#[test]
fn misaligned_atomic_is_refused_at_post_time() {
    let mut p = rc();
    let r = regions(&mut p);
    let e = p.a.qp.post_send(wr(
        1,
        SendOp::FetchAdd {
            remote_addr: DST + 4,
            rkey: rkey(&r.dst),
            add: 1,
        },
        &[sge(&r.src, SRC + RES, 8)],
    ));
    assert_eq!(e, Err(PostError::BadAtomic));
    assert_eq!(p.a.qp.send_queue_len(), 0);
}

/// Check that an operation the responder QP's access flags do not enable is NAKed "invalid
/// request" (rxe `check_op_valid` → `RESPST_ERR_UNSUPPORTED_OPCODE` → class C,
/// `AETH_NAK_INVALID_REQ`), whatever the region allows.
fn check_qp_access(qp_access: AccessFlags, op: impl Fn(RKey) -> SendOp, len: u32) {
    let mut p = rc_with(|a| a.qp_access_flags = qp_access);
    let r = regions(&mut p);
    p.bytes_mut(B, &r.dst)[..8].copy_from_slice(&100u64.to_ne_bytes());
    let before = p.bytes(B, &r.dst).to_vec();
    let the_op = op(rkey(&r.dst));
    let at = if the_op.is_read_or_atomic() {
        SRC + RES
    } else {
        SRC
    };
    p.post_send(A, wr(1, the_op, &[sge(&r.src, at, len)]));
    p.settle();
    assert_eq!(acks(&p, B), vec![(ps(0), nak(NakCode::InvalidRequest))]);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.bytes(B, &r.dst), &before[..]);
    assert!(
        p.bytes(A, &r.src)[RES as usize..RES as usize + 64]
            .iter()
            .all(|&b| b == 0)
    );
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.state(), QpState::Err);
}

/// Rule: an RDMA WRITE to a QP without REMOTE_WRITE in its access flags → NAK invalid
/// request → REM_INV_REQ_ERR (IBA 9.7.5.2; rxe `check_op_valid`).
#[test]
fn write_to_qp_without_remote_write_is_invalid_request() {
    check_qp_access(
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        |k| SendOp::Write {
            remote_addr: DST,
            rkey: k,
        },
        64,
    );
}

/// Rule: as above for RDMA READ without REMOTE_READ.
#[test]
fn read_from_qp_without_remote_read_is_invalid_request() {
    check_qp_access(
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        |k| SendOp::Read {
            remote_addr: DST,
            rkey: k,
        },
        64,
    );
}

/// Rule: as above for atomics without REMOTE_ATOMIC.
#[test]
fn atomic_on_qp_without_remote_atomic_is_invalid_request() {
    check_qp_access(
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        |k| SendOp::FetchAdd {
            remote_addr: DST,
            rkey: k,
            add: 1,
        },
        8,
    );
}

/// Rule: a READ or atomic to a responder with `max_dest_rd_atomic` = 0 has no responder
/// resource: NAK invalid request (rxe `check_resource` → `RESPST_ERR_TOO_MANY_RDMA_ATM_REQ`,
/// class C).
#[test]
fn read_without_responder_resources_is_invalid_request() {
    let mut p = rc_with(|a| a.max_dest_rd_atomic = 0);
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 64)],
        ),
    );
    p.settle();
    assert_eq!(acks(&p, B), vec![(ps(0), nak(NakCode::InvalidRequest))]);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
}

/// Rule: a zero-length RDMA WRITE or READ does not validate the R_Key or address (IBA C9-88;
/// rxe `check_rkey`: "A zero-byte op is not required to set an addr or rkey"): it succeeds
/// with any R_Key and moves no data.
#[test]
fn zero_length_rdma_skips_the_rkey_check() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: 0xDEAD_0000,
                rkey: RKey(0x0BAD_0BAD),
            },
            &[],
        ),
    );
    p.post_send(
        A,
        wr(
            2,
            SendOp::Read {
                remote_addr: 0xDEAD_0000,
                rkey: RKey(0x0BAD_0BAD),
            },
            &[],
        ),
    );
    p.settle();
    let t = p.trace();
    assert_eq!(
        wire(&p, A),
        vec![
            (Opcode::RcRdmaWriteOnly, ps(0)),
            (Opcode::RcRdmaReadRequest, ps(1))
        ],
        "{t}"
    );
    assert_eq!(
        wire(&p, B),
        vec![
            (Opcode::RcAcknowledge, ps(0)),
            (Opcode::RcRdmaReadResponseOnly, ps(1))
        ],
        "{t}"
    );
    let wcs = p.completions(A);
    assert_eq!(
        st(&wcs),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!((wcs[0].byte_len, wcs[1].byte_len), (0, 0));
    assert!(p.bytes(B, &r.dst).iter().all(|&b| b == 0xEE));
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

// ---------------------------------------------------------------------------------------
// Work-request rules
// ---------------------------------------------------------------------------------------

fn lone_rc_qp() -> (Qp, DeviceLimits) {
    let limits = DeviceLimits::default();
    let qp = Qp::new(
        QpConfig {
            qpn: Qpn::new(0x33),
            qp_type: QpType::Rc,
            pd: PdId(1),
            caps: caps(),
            sq_sig_all: false,
            uses_srq: false,
            port_mtu: Mtu::Mtu1024,
        },
        &limits,
    )
    .unwrap();
    (qp, limits)
}

fn any_send() -> SendWr {
    SendWr::new(
        1,
        SendOp::Send,
        [srdma_proto::Sge {
            addr: SRC,
            length: 8,
            lkey: srdma_proto::LKey(0x100),
        }]
        .into_iter()
        .collect(),
    )
}

fn any_recv() -> RecvWr {
    RecvWr {
        wr_id: 9,
        sges: srdma_proto::SgeList::new(),
    }
}

/// Rule: `ibv_post_send` is refused in RESET, INIT and RTR (IBA 11.4.1.1: the send
/// queue is enabled from RTS; rxe `rxe_post_send`: `if (qp->req.state < QP_STATE_READY)
/// return -EINVAL`); `ibv_post_recv` is refused in RESET and accepted from INIT on (IBA
/// 10.3.1: the receive queue accepts work requests in INIT). Refusal has no side effect.
#[test]
fn posting_in_the_wrong_state_is_refused() {
    let (mut qp, limits) = lone_rc_qp();
    let qpn = qp.qpn();
    let refused = |state, queue| PostError::InvalidState { qpn, state, queue };
    assert_eq!(
        qp.post_send(any_send()),
        Err(refused(QpState::Reset, "send"))
    );
    assert_eq!(
        qp.post_recv(any_recv()),
        Err(refused(QpState::Reset, "receive"))
    );
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    qp.modify(
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        &limits,
    )
    .unwrap();
    assert_eq!(
        qp.post_send(any_send()),
        Err(refused(QpState::Init, "send"))
    );
    assert_eq!(qp.post_recv(any_recv()), Ok(()));
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = AhAttr {
        dgid: gid("10.0.0.2".parse().unwrap()),
        ..AhAttr::default()
    };
    qp.modify(
        &attr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
        &limits,
    )
    .unwrap();
    assert_eq!(qp.post_send(any_send()), Err(refused(QpState::Rtr, "send")));
    assert_eq!(qp.post_recv(any_recv()), Ok(()));
    assert_eq!(qp.send_queue_len(), 0);
    assert_eq!(qp.recv_queue_len(), 2);
    assert!(qp.poll_completion().is_none());
    // Back to RESET discards the receives silently.
    attr.qp_state = QpState::Reset;
    qp.modify(&attr, AttrMask::STATE, &limits).unwrap();
    assert_eq!(qp.recv_queue_len(), 0);
    assert!(qp.poll_completion().is_none());
}

/// Rule: moving a QP to ERR flushes every outstanding send WQE — in flight or not yet
/// started — and every receive WQE with WR_FLUSH_ERR, in posting order, each with its own
/// opcode (IBA 10.3.1; rxe `rxe_drain_resp_pkts(notify)`, `check_resource` in
/// ERROR); the QP sends nothing more; WRs posted afterwards complete at once with
/// WR_FLUSH_ERR (rxe `rxe_requester` in ERR).
#[test]
fn modify_to_err_flushes_everything_in_order() {
    let mut p = rc();
    let r = regions(&mut p);
    for i in 0..3u64 {
        p.post_recv(B, 100 + i, &[sge(&r.rcv, RCV, 64)]);
    }
    p.post_send(
        A,
        send(1, &[sge(&r.src, SRC, 8)]).with_flags(SendFlags::empty()),
    );
    p.post_send(
        A,
        wr(
            2,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 8)],
        ),
    );
    p.post_send(
        A,
        wr(
            3,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 8)],
        ),
    );
    // The first is on the wire, unacknowledged.
    assert!(p.transmit(A).is_some());
    p.set_state(A, QpState::Err);
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.qp_num))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::WrFlushErr, WcOpcode::Send, Qpn::new(0x11)),
            (2, WcStatus::WrFlushErr, WcOpcode::RdmaWrite, Qpn::new(0x11)),
            (3, WcStatus::WrFlushErr, WcOpcode::RdmaRead, Qpn::new(0x11)),
        ],
        "unsignaled or not, flushed WRs complete"
    );
    assert!(p.transmit(A).is_none());
    assert_eq!(p.a.qp.poll_timeout(), None);
    p.set_state(B, QpState::Err);
    let wcs = p.completions(B);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (100, WcStatus::WrFlushErr, WcOpcode::Recv),
            (101, WcStatus::WrFlushErr, WcOpcode::Recv),
            (102, WcStatus::WrFlushErr, WcOpcode::Recv),
        ]
    );
    assert_eq!(&p.bytes(B, &r.rcv)[..64], &[0xCC; 64][..]);
    // Posting afterwards flushes immediately.
    p.post_send(A, send(4, &[sge(&r.src, SRC, 8)]));
    p.post_recv(B, 103, &[sge(&r.rcv, RCV, 64)]);
    assert_eq!(st(&p.completions(A)), vec![(4, WcStatus::WrFlushErr)]);
    assert_eq!(st(&p.completions(B)), vec![(103, WcStatus::WrFlushErr)]);
    assert!(p.transmit(A).is_none());
}

/// Rule: an unsignaled WR that succeeds produces no completion, one that fails always does
/// (IBA 10.7.3.1: "if a completion error occurs, a Work Completion will always be
/// generated"; rxe `do_complete`). The WRs flushed behind the error complete too.
#[test]
fn unsignaled_wrs_complete_only_on_error() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    let quiet = SendFlags::empty();
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]).with_flags(quiet));
    p.post_send(
        A,
        wr(
            2,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 8)],
        ),
    );
    p.settle();
    let wcs = p.completions(A);
    assert_eq!(st(&wcs), vec![(2, WcStatus::Success)]);
    p.post_send(
        A,
        wr(
            3,
            SendOp::Write {
                remote_addr: DST,
                rkey: bad_key(rkey(&r.dst)),
            },
            &[sge(&r.src, SRC, 8)],
        )
        .with_flags(quiet),
    );
    p.post_send(A, send(4, &[sge(&r.src, SRC, 8)]).with_flags(quiet));
    p.settle();
    assert_eq!(
        st(&p.completions(A)),
        vec![(3, WcStatus::RemAccessErr), (4, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.a.qp.counters().send_err, 2);
}

/// Rule: with `sq_sig_all` every send WR completes, whatever its SIGNALED flag (IBA 10.2
/// `ibv_qp_init_attr.sq_sig_all`; rxe `qp->sq_sig_type == IB_SIGNAL_ALL_WR`).
#[test]
fn sq_sig_all_signals_every_wr() {
    let mut p = Pair::with_config(QpType::Rc, Mtu::Mtu1024, |_, c| c.sq_sig_all = true, |_| {});
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    let quiet = SendFlags::empty();
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]).with_flags(quiet));
    p.post_send(
        A,
        wr(
            2,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 8)],
        )
        .with_flags(quiet),
    );
    p.post_send(
        A,
        wr(
            3,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 8)],
        )
        .with_flags(quiet),
    );
    p.settle();
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaRead)
        ]
    );
}

/// Rule: a SEND larger than the posted receive buffer is a class C error at the responder:
/// NAK invalid request (requester: REM_INV_REQ_ERR), the responder's receive WQE completes
/// in error and its QP moves to ERR, flushing the next receive (IBA 9.7.5.2; rxe
/// `RESPST_ERR_LENGTH`). The receive status follows IBA/verbs and NICs: LOC_LEN_ERR ("the
/// incoming message is larger than the receive buffer"); kernel rxe reports
/// REM_INV_REQ_ERR on the receive side instead (`do_class_ac_error(..., IB_WC_REM_INV_REQ_ERR)`).
#[test]
fn receive_buffer_too_small_is_invalid_request_and_local_length_error() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 100)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 1024, 1024)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 200)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 10)]));
    p.settle();
    let t = p.trace();
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), nak(NakCode::InvalidRequest))],
        "{t}"
    );
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (100, WcStatus::LocLenErr, WcOpcode::Recv),
            (101, WcStatus::WrFlushErr, WcOpcode::Recv)
        ]
    );
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(&p.bytes(B, &r.rcv)[1024..1034], &[0xCC; 10]);
}

/// Rule: same for a multi-packet SEND that overflows the receive buffer in a later packet:
/// the NAK carries the PSN of the packet that does not fit.
#[test]
fn receive_buffer_overflow_in_a_later_packet_is_naked_at_that_psn() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 1500)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 3000)]));
    p.settle();
    let t = p.trace();
    assert_eq!(
        acks(&p, B),
        vec![(ps(1), nak(NakCode::InvalidRequest))],
        "{t}"
    );
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::LocLenErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(
        &p.bytes(B, &r.rcv)[1500..1600],
        &[0xCC; 100][..],
        "no overflow"
    );
}

/// Rule: the solicited-event bit is set only on the last (or only) packet of a SEND, SEND
/// with immediate or RDMA WRITE with immediate posted with SOLICITED (IBA 9.2.3;
/// rxe `init_req_packet`: `solicited = SOLICITED && END && (SEND || WRITE_IMM)`), never on a
/// plain WRITE nor without the flag.
#[test]
fn solicited_event_only_on_the_last_packet() {
    let mut p = rc();
    let r = regions(&mut p);
    for i in 0..4u64 {
        p.post_recv(B, 100 + i, &[sge(&r.rcv, RCV + 4096 * i, 4096)]);
    }
    let se = SendFlags::SIGNALED | SendFlags::SOLICITED;
    p.post_send(A, send(1, &[sge(&r.src, SRC, 2500)]).with_flags(se));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 2500)]));
    p.post_send(
        A,
        wr(
            3,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 2500)],
        )
        .with_flags(se),
    );
    p.post_send(
        A,
        wr(
            4,
            SendOp::WriteWithImm {
                remote_addr: DST,
                rkey: rkey(&r.dst),
                imm: 1,
            },
            &[sge(&r.src, SRC, 2500)],
        )
        .with_flags(se),
    );
    p.post_send(
        A,
        wr(5, SendOp::SendWithImm { imm: 2 }, &[sge(&r.src, SRC, 100)]).with_flags(se),
    );
    p.settle();
    let got: Vec<_> = p
        .sent_by(A)
        .iter()
        .map(|s| (s.pkt.bth.opcode, s.pkt.bth.solicited))
        .collect();
    assert_eq!(
        got,
        vec![
            (Opcode::RcSendFirst, false),
            (Opcode::RcSendMiddle, false),
            (Opcode::RcSendLast, true),
            (Opcode::RcSendFirst, false),
            (Opcode::RcSendMiddle, false),
            (Opcode::RcSendLast, false),
            (Opcode::RcRdmaWriteFirst, false),
            (Opcode::RcRdmaWriteMiddle, false),
            (Opcode::RcRdmaWriteLast, false),
            (Opcode::RcRdmaWriteFirst, false),
            (Opcode::RcRdmaWriteMiddle, false),
            (Opcode::RcRdmaWriteLastWithImmediate, true),
            (Opcode::RcSendOnlyWithImmediate, true),
        ]
    );
    assert_eq!(p.completions(A).len(), 5);
}

/// Rule: AckReq is set on the last packet of every message and at least every 64 packets
/// of a long one (IBA 9.7.5.1: the requester must request an ACK often enough to
/// avoid stalling; rxe `RXE_MAX_PKT_PER_ACK`, which asks every 65th — srdma every 64th).
/// 200 packets at MTU 256.
#[test]
fn ack_req_on_the_last_packet_and_at_least_every_64() {
    let mut p = rc_with(|a| a.path_mtu = Mtu::Mtu256);
    let r = regions(&mut p);
    let len = 200 * 256;
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, len)],
        ),
    );
    p.settle();
    let a = p.sent_by(A);
    assert_eq!(a.len(), 200);
    for (i, s) in a.iter().enumerate() {
        assert_eq!(
            s.pkt.bth.psn,
            ps(i as u32),
            "PSNs consecutive across the wrap"
        );
    }
    let asked: Vec<usize> = a
        .iter()
        .enumerate()
        .filter(|(_, s)| s.pkt.bth.ack_req)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(*asked.last().unwrap(), 199, "last packet asks for an ACK");
    let mut prev: isize = -1;
    for &i in &asked {
        assert!(
            i as isize - prev <= 64,
            "gap > 64 before packet {i}: {asked:?}"
        );
        prev = i as isize;
    }
    // The responder only ACKs AckReq'd packets (it may coalesce ACKs still queued: they are
    // cumulative), and the last ACK covers the last packet.
    let acked: Vec<Psn> = acks(&p, B).iter().map(|a| a.0).collect();
    let asked_psns: Vec<Psn> = asked.iter().map(|&i| ps(i as u32)).collect();
    assert!(
        acked.iter().all(|a| asked_psns.contains(a)),
        "ACK for a packet without AckReq: {acked:?} vs {asked_psns:?}"
    );
    assert_eq!(acked.last(), Some(&ps(199)));
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    let want = p.bytes(A, &r.src)[..len as usize].to_vec();
    same(&p.bytes(B, &r.dst)[..len as usize], &want, "WRITE data");
}

/// Rule: PSNs are 24-bit and wrap (IBA 9.7.1; rxe `psn_compare`, `& BTH_PSN_MASK`): a
/// 32-packet WRITE starting at 0xFFFFF0 crosses 0xFFFFFF → 0x000000; a loss just after the
/// wrap is NAKed with the wrapped PSN and recovered; the final ACK carries 0x00000F.
#[test]
fn psn_wrap_including_a_nak_across_the_wrap() {
    let mut p = rc();
    let r = regions(&mut p);
    assert_eq!(ps(16), Psn::new(0));
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 32 * 1024)],
        ),
    );
    let lost = Psn::new(2);
    let mut dropped = false;
    p.settle_with(10, |from, r| {
        if from == A && r.bth.psn == lost && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    let t = p.trace();
    let a: Vec<u32> = wire(&p, A).iter().map(|x| x.1.value()).collect();
    let first: Vec<u32> = (0..32).map(|i| (PSN_A + i) & 0xFF_FFFF).collect();
    assert_eq!(&a[..32], &first[..], "{t}");
    assert_eq!(a[15], 0xFF_FFFF);
    assert_eq!(a[16], 0);
    let resent: Vec<u32> = (2..16).collect();
    assert_eq!(
        &a[32..],
        &resent[..],
        "resent from the wrapped NAK PSN\n{t}"
    );
    assert_eq!(
        acks(&p, B),
        vec![
            (lost, nak(NakCode::PsnSequenceError)),
            (Psn::new(0x0F), Syndrome::ACK)
        ]
    );
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    same(
        &p.bytes(B, &r.dst)[..32 * 1024],
        &pattern(LEN)[..32 * 1024],
        "data",
    );
}

/// Rule: at most `max_rd_atomic` READ/atomic requests are outstanding at once (IBA
/// 9.5: the initiator depth; rxe `req.rd_atomic`, `need_rd_atomic`). Eight READs
/// with `max_rd_atomic` = 2: the log never shows more than 2 unanswered READ requests, and
/// all complete in order.
#[test]
fn max_rd_atomic_bounds_outstanding_reads() {
    let mut p = rc_with(|a| a.max_rd_atomic = 2);
    let r = regions(&mut p);
    for i in 0..8u64 {
        p.bytes_mut(B, &r.dst)[64 * i as usize..64 * (i as usize + 1)].fill(i as u8);
        p.post_send(
            A,
            wr(
                1 + i,
                SendOp::Read {
                    remote_addr: DST + 64 * i,
                    rkey: rkey(&r.dst),
                },
                &[sge(&r.src, SRC + RES + 64 * i, 64)],
            ),
        );
    }
    p.settle();
    let mut outstanding = 0i32;
    let mut peak = 0;
    for s in p.sent() {
        match (s.from, s.pkt.bth.opcode) {
            (A, Opcode::RcRdmaReadRequest) => outstanding += 1,
            (B, Opcode::RcRdmaReadResponseOnly | Opcode::RcRdmaReadResponseLast) => {
                outstanding -= 1
            }
            _ => {}
        }
        peak = peak.max(outstanding);
    }
    assert_eq!(peak, 2, "{}", p.trace());
    assert_eq!(wire(&p, A).len(), 8, "no retransmission needed");
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    for i in 0..8usize {
        let at = RES as usize + 64 * i;
        assert_eq!(&p.bytes(A, &r.src)[at..at + 64], &[i as u8; 64][..]);
    }
}

/// Rule: a FENCE'd WR is not started before every earlier READ and atomic has completed
/// (IBA 10.8.3.3; rxe `rxe_wqe_is_fenced`). A FENCE'd SEND after a 3-packet READ
/// goes on the wire only after the READ's last response; without the fence it goes right
/// after the READ request; a fence does not wait for an earlier WRITE.
#[test]
fn fence_waits_for_earlier_reads() {
    for fenced in [true, false] {
        let mut p = rc();
        let r = regions(&mut p);
        p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
        p.post_recv(B, 101, &[sge(&r.rcv, RCV + 64, 64)]);
        p.post_send(
            A,
            wr(
                1,
                SendOp::Read {
                    remote_addr: DST,
                    rkey: rkey(&r.dst),
                },
                &[sge(&r.src, SRC + RES, 3000)],
            ),
        );
        let f = if fenced {
            SendFlags::SIGNALED | SendFlags::FENCE
        } else {
            SendFlags::SIGNALED
        };
        p.post_send(A, send(2, &[sge(&r.src, SRC, 16)]).with_flags(f));
        p.settle();
        let log = p.sent();
        let pos = |from: End, op: Opcode| {
            log.iter()
                .position(|s| s.from == from && s.pkt.bth.opcode == op)
                .unwrap()
        };
        let send_at = pos(A, Opcode::RcSendOnly);
        let last_resp = pos(B, Opcode::RcRdmaReadResponseLast);
        let req = pos(A, Opcode::RcRdmaReadRequest);
        if fenced {
            assert!(
                send_at > last_resp,
                "fenced SEND before the READ completed\n{}",
                p.trace()
            );
        } else {
            assert_eq!(send_at, req + 1, "unfenced SEND waits\n{}", p.trace());
        }
        assert_eq!(
            st(&p.completions(A)),
            vec![(1, WcStatus::Success), (2, WcStatus::Success)]
        );
    }

    // A fence only waits for READs and atomics.
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC, 3000)],
        ),
    );
    p.post_send(
        A,
        send(2, &[sge(&r.src, SRC, 16)]).with_flags(SendFlags::SIGNALED | SendFlags::FENCE),
    );
    let mut a = Vec::new();
    while let Some((pkt, _)) = p.transmit(A) {
        a.push(PacketRepr::parse_bytes(&pkt).unwrap().bth.opcode);
    }
    assert_eq!(
        a,
        vec![
            Opcode::RcRdmaWriteFirst,
            Opcode::RcRdmaWriteMiddle,
            Opcode::RcRdmaWriteLast,
            Opcode::RcSendOnly
        ]
    );
}

/// Rule: a send WR whose local buffer was deregistered after posting fails with
/// LOC_PROT_ERR when the requester reaches it (IBA 10.7.3: local protection
/// error; rxe `rxe_req.c` copy failure → `IB_WC_LOC_PROT_ERR`), nothing goes on the wire,
/// the QP moves to ERR and the WRs behind it are flushed.
#[test]
fn deregistered_local_mr_gives_local_protection_error() {
    let mut p = rc();
    let r = regions(&mut p);
    let tmp = p.reg(A, 0x80_0000, 4096, 0x77, LOCAL);
    p.post_send(A, send(1, &[sge(&tmp, 0x80_0000, 100)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 16)]));
    p.a.mrs.deregister(tmp.lkey).unwrap();
    p.a.mem.remove(tmp.handle);
    p.settle();
    assert!(p.sent_by(A).is_empty(), "{}", p.trace());
    let wcs = p.completions(A);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::LocProtErr, WcOpcode::Send),
            (2, WcStatus::WrFlushErr, WcOpcode::Send)
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(p.b.qp.state(), QpState::Rts);
}

/// Rule: a local error on a WR behind one still waiting for its ACK is reported in order:
/// the earlier WR completes (successfully) first, then the failed one, then the flushes
/// (IBA 10.8 completions are returned in order; rxe marks the WQE `wqe_state_error` and
/// the completer reports it when it reaches the head).
#[test]
fn local_error_behind_an_unacknowledged_wr_is_reported_in_order() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    let tmp = p.reg(A, 0x80_0000, 4096, 0x77, LOCAL);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 16)]));
    p.post_send(A, send(2, &[sge(&tmp, 0x80_0000, 100)]));
    p.post_send(A, send(3, &[sge(&r.src, SRC, 16)]));
    let (pkt, encap) = p.transmit(A).unwrap();
    p.a.mrs.deregister(tmp.lkey).unwrap();
    p.a.mem.remove(tmp.handle);
    assert!(p.transmit(A).is_none());
    assert!(
        p.completions(A).is_empty(),
        "reported before the earlier WR completed"
    );
    p.deliver(B, &pkt, encap);
    p.settle();
    assert_eq!(
        st(&p.completions(A)),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::LocProtErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
    assert_eq!(wire(&p, A), vec![(Opcode::RcSendOnly, ps(0))]);
}

// ---------------------------------------------------------------------------------------
// Opcode sequence
// ---------------------------------------------------------------------------------------

/// Rule: a MIDDLE/LAST packet with no message in progress is an opcode-sequence error: NAK
/// invalid request (IBA 9.7.5.1; rxe `check_op_seq` →
/// `RESPST_ERR_MISSING_OPCODE_FIRST`, class C). A full-MTU SEND_ONLY is rewritten into a
/// SEND_MIDDLE (so only the sequence is wrong, not the length).
#[test]
fn middle_without_first_is_invalid_request() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 1024)]));
    p.settle_with(10, |from, r| {
        if from == A && r.bth.opcode == Opcode::RcSendOnly {
            let mut x = *r;
            x.bth.opcode = Opcode::RcSendMiddle;
            return Fate::Replace(craft(&x));
        }
        Fate::Deliver
    });
    assert_eq!(acks(&p, B), vec![(ps(0), nak(NakCode::InvalidRequest))]);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(st(&p.completions(B)), vec![(100, WcStatus::WrFlushErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(&p.bytes(B, &r.rcv)[..1024], &[0xCC; 1024][..]);
}

/// Rule: a packet of another kind in the middle of a message (here an RDMA WRITE MIDDLE
/// after SEND FIRST: the SEND's LAST is missing) is NAKed invalid request; the receive WQE
/// the SEND was filling completes in error (rxe `RESPST_ERR_MISSING_OPCODE_LAST_C` →
/// `do_class_ac_error(..., IB_WC_REM_INV_REQ_ERR)` → `do_complete`).
#[test]
fn missing_last_is_invalid_request_and_fails_the_receive() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV, 4096)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 2048)]));
    p.settle_with(10, |from, r| {
        if from == A && r.bth.opcode == Opcode::RcSendLast {
            let mut x = *r;
            x.bth.opcode = Opcode::RcRdmaWriteMiddle;
            return Fate::Replace(craft(&x));
        }
        Fate::Deliver
    });
    assert_eq!(acks(&p, B), vec![(ps(1), nak(NakCode::InvalidRequest))]);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(
        st(&p.completions(B)),
        vec![(100, WcStatus::RemInvReqErr), (101, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.b.qp.state(), QpState::Err);
}

/// Rule: an RNR NAK implicitly acknowledges every request before its PSN (IBA 9.7.5.1;
/// rxe `check_psn`: a response past a WQE's last PSN completes it): SEND 1 is completed by
/// the RNR NAK of SEND 2 even though its own ACK was lost; SEND 2 completes after the RNR
/// wait once a receive is posted.
#[test]
fn rnr_nak_acknowledges_the_requests_before_it() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 16)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 16)]));
    p.pump_with(|from, r| {
        let positive = r
            .aeth
            .is_some_and(|a| matches!(a.syndrome, Syndrome::Ack { .. }));
        if from == B && positive {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    assert_eq!(
        acks(&p, B),
        vec![
            (ps(0), Syndrome::ACK),
            (ps(1), Syndrome::RnrNak { timer_code: 1 })
        ]
    );
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 64, 64)]);
    p.settle();
    assert_eq!(st(&p.completions(A)), vec![(2, WcStatus::Success)]);
    assert_eq!(
        st(&p.completions(B)),
        vec![(100, WcStatus::Success), (101, WcStatus::Success)]
    );
}

/// Rule: an error NAK also acknowledges the requests before its PSN: they complete
/// successfully, in order, before the failed one (IBA 9.7.5.1; rxe `check_psn` completes
/// earlier WQEs before `check_ack` sees the NAK). The ACK of SEND 1 is lost; the NAK of the
/// WRITE behind it completes SEND 1 with success, then the WRITE with REM_ACCESS_ERR.
#[test]
fn error_nak_acknowledges_the_requests_before_it() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 16)]));
    p.post_send(
        A,
        wr(
            2,
            SendOp::Write {
                remote_addr: DST,
                rkey: bad_key(rkey(&r.dst)),
            },
            &[sge(&r.src, SRC, 16)],
        ),
    );
    p.settle_with(10, |from, r| {
        let positive = r
            .aeth
            .is_some_and(|a| matches!(a.syndrome, Syndrome::Ack { .. }));
        if from == B && positive {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    assert_eq!(
        acks(&p, B),
        vec![
            (ps(0), Syndrome::ACK),
            (ps(1), nak(NakCode::RemoteAccessError))
        ]
    );
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]
    );
    assert_eq!(p.now, Duration::ZERO, "no timeout involved");
}

/// Rule: the responder re-validates the R_Key for every READ response packet it generates
/// (rxe `read_reply` → `rxe_recheck_mr`): if the region is deregistered while a multi-packet
/// READ is being answered, the responder stops, NAKs "remote access error" and moves to ERR;
/// the requester completes the READ with REM_ACCESS_ERR. (srdma NAKs with the PSN of the
/// first response not sent; rxe NAKs with the request's PSN, which an rxe requester that
/// already has the first response ignores until its timer expires.)
#[test]
fn read_response_stops_when_the_region_is_deregistered() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(
        A,
        wr(
            1,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, 3000)],
        ),
    );
    let (req, encap) = p.transmit(A).unwrap();
    p.deliver(B, &req, encap);
    let (first, encap) = p.transmit(B).unwrap();
    p.deliver(A, &first, encap);
    p.b.mrs.deregister(r.dst.lkey).unwrap();
    p.settle();
    let t = p.trace();
    assert_eq!(
        wire(&p, B),
        vec![
            (Opcode::RcRdmaReadResponseFirst, ps(0)),
            (Opcode::RcAcknowledge, ps(1))
        ],
        "{t}"
    );
    assert_eq!(acks(&p, B), vec![(ps(1), nak(NakCode::RemoteAccessError))]);
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert_eq!(p.a.qp.state(), QpState::Err);
}

/// Rule: a zero-length SEND is legal (IBA 9.7 ONLY packet with no payload; rxe
/// `check_length`: ONLY may carry 0..PMTU bytes): it consumes a receive WQE, which completes
/// with byte_len 0 and leaves the buffer untouched.
#[test]
fn zero_length_send_consumes_a_receive() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.post_send(A, send(1, &[]));
    p.settle();
    assert_eq!(wire(&p, A), vec![(Opcode::RcSendOnly, ps(0))]);
    assert!(p.sent_by(A)[0].pkt.payload.is_empty());
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 0)]
    );
    assert_eq!(&p.bytes(B, &r.rcv)[..64], &[0xCC; 64][..]);
    let a = p.completions(A);
    assert_eq!((a[0].status, a[0].byte_len), (WcStatus::Success, 0));
}

/// Rule: the message is the concatenation of the send WR's SGEs, placed into the receive
/// WR's SGEs in order, independent of where packet boundaries fall (IBA 10.7 gather/scatter
/// lists; rxe `copy_data`); READ responses scatter the same way.
#[test]
fn scatter_gather_lists_are_concatenated_across_packet_boundaries() {
    let mut p = rc();
    let r = regions(&mut p);
    let pat = pattern(LEN);
    // 3000 bytes gathered from three pieces of A's region...
    let pieces = [(SRC + 10, 1000u32), (SRC + 5000, 700), (SRC + 9000, 1300)];
    let mut want = Vec::new();
    for (addr, len) in pieces {
        let o = (addr - SRC) as usize;
        want.extend_from_slice(&pat[o..o + len as usize]);
    }
    // ...scattered into four pieces of B's receive region.
    let slots = [
        (RCV, 500u32),
        (RCV + 2000, 1100),
        (RCV + 6000, 900),
        (RCV + 9000, 1000),
    ];
    p.post_recv(B, 100, &slots.map(|(a, l)| sge(&r.rcv, a, l)));
    p.post_send(A, send(1, &pieces.map(|(a, l)| sge(&r.src, a, l))));
    // The READ brings B's rcv pieces back into two pieces of A's results area.
    p.settle();
    let mut got = Vec::new();
    let buf = p.bytes(B, &r.rcv);
    let mut left = 3000usize;
    for (addr, len) in slots {
        let o = (addr - RCV) as usize;
        let n = (len as usize).min(left);
        got.extend_from_slice(&buf[o..o + n]);
        left -= n;
    }
    same(&got, &want, "scattered SEND");
    assert_eq!(buf[9000 + 500], 0xCC, "last slot only partly used");
    assert_eq!(buf[500], 0xCC, "first slot overflowed");
    let b = p.completions(B);
    assert_eq!((b[0].status, b[0].byte_len), (WcStatus::Success, 3000));

    p.bytes_mut(B, &r.dst)[..2500].copy_from_slice(&pat[..2500]);
    let halves = [(SRC + RES, 1234u32), (SRC + RES + 4000, 1266)];
    p.post_send(
        A,
        wr(
            2,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &halves.map(|(a, l)| sge(&r.src, a, l)),
        ),
    );
    p.settle();
    let a = p.bytes(A, &r.src);
    let o = RES as usize;
    same(&a[o..o + 1234], &pat[..1234], "READ first SGE");
    same(
        &a[o + 4000..o + 4000 + 1266],
        &pat[1234..2500],
        "READ second SGE",
    );
    assert_eq!(
        st(&p.completions(A)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

/// Check that A's first request, rewritten by `edit`, is NAKed invalid request with nothing
/// written at B and both QPs in ERR.
fn check_malformed(
    op: impl Fn(RKey) -> SendOp,
    len: u32,
    edit: impl Fn(&mut PacketRepr<'_>) -> Vec<u8>,
) {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 4096)]);
    p.post_send(A, wr(1, op(rkey(&r.dst)), &[sge(&r.src, SRC, len)]));
    let mut first = true;
    p.settle_with(10, |from, r| {
        if from == A && first {
            first = false;
            let mut x = *r;
            return Fate::Replace(edit(&mut x));
        }
        Fate::Deliver
    });
    let t = p.trace();
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), nak(NakCode::InvalidRequest))],
        "{t}"
    );
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.b.qp.state(), QpState::Err);
    assert!(
        p.bytes(B, &r.dst).iter().all(|&b| b == 0xEE),
        "WRITE placed data"
    );
    assert!(
        p.bytes(B, &r.rcv).iter().all(|&b| b == 0xCC),
        "SEND placed data"
    );
}

/// Rule: an RDMA WRITE whose RETH DMA length exceeds 2^31 is a length error → NAK invalid
/// request (IBA: max message 2^31; rxe `check_length`: `dmalen > (1 << 31)` →
/// `RESPST_ERR_LENGTH`, class C).
#[test]
fn write_longer_than_2_pow_31_is_invalid_request() {
    check_malformed(
        |k| SendOp::Write {
            remote_addr: DST,
            rkey: k,
        },
        64,
        |x| {
            if let Some(reth) = x.reth.as_mut() {
                reth.dma_len = 0x8000_0001;
            }
            craft(x)
        },
    );
}

/// Rule: the payload of an RDMA WRITE ONLY must equal the RETH DMA length (rxe
/// `check_rkey`: `pktlen != resid` → `RESPST_ERR_LENGTH` → NAK invalid request); here
/// the RETH announces 100 bytes and the packet carries 64.
#[test]
fn write_payload_must_match_the_reth_length() {
    check_malformed(
        |k| SendOp::Write {
            remote_addr: DST,
            rkey: k,
        },
        64,
        |x| {
            if let Some(reth) = x.reth.as_mut() {
                reth.dma_len = 100;
            }
            craft(x)
        },
    );
}

/// Rule: FIRST and MIDDLE packets carry exactly one path MTU of payload (rxe
/// `check_length`: "first" or "middle" packets `payload != mtu` → `RESPST_ERR_LENGTH` →
/// NAK invalid request); a SEND FIRST cut to 1000 bytes is refused.
#[test]
fn first_packet_shorter_than_the_mtu_is_invalid_request() {
    check_malformed(
        |_| SendOp::Send,
        2048,
        |x| {
            let short = &x.payload[..1000];
            let mut y = *x;
            y.payload = short;
            craft(&y)
        },
    );
}

/// Rule: `rnr_retry` = 7 means "retry forever" (IBA 9.7.5.2.8; rxe `if (qp->comp.rnr_retry
/// != 7) rnr_retry--`): with no receive ever posted the SEND keeps being resent after each
/// RNR wait and never fails.
#[test]
fn rnr_retry_seven_retries_forever() {
    let mut p = rc(); // rnr_retry 7
    let r = regions(&mut p);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]));
    p.settle_with(50, |_, _| Fate::Deliver);
    assert_eq!(p.sent_by(A).len(), 51);
    assert!(p.completions(A).is_empty());
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(p.a.qp.counters().rcvd_rnr_err, 51);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 64)]);
    p.settle();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
}

// ---------------------------------------------------------------------------------------
// Shared receive queue
// ---------------------------------------------------------------------------------------

/// Rule: a QP attached to an SRQ takes its receive WQEs from the SRQ (IBA 10.2.9; rxe
/// `get_srq_wqe`); `ibv_post_recv` on the QP itself is refused; an empty SRQ makes the RC
/// responder send an RNR NAK like an empty RQ.
#[test]
fn srq_feeds_receives_and_an_empty_srq_is_rnr() {
    let mut p = Pair::with_config(
        QpType::Rc,
        Mtu::Mtu1024,
        |end, c| c.uses_srq = end == B,
        |_| {},
    );
    let r = regions(&mut p);
    assert_eq!(
        p.b.qp.post_recv(RecvWr {
            wr_id: 1,
            sges: srdma_proto::SgeList::new()
        }),
        Err(PostError::UsesSrq)
    );
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    p.pump();
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), Syndrome::RnrNak { timer_code: 1 })]
    );
    p.post_srq_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    p.settle();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    let b = p.completions(B);
    assert_eq!(
        b.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(100, WcStatus::Success, 100)]
    );
    assert!(p.b.srq.as_ref().unwrap().is_empty());
    same(&p.bytes(B, &r.rcv)[..100], &pattern(100)[..], "data");
}

/// B receives a SEND from A (and owes A an ACK), then posts two SENDs of its own, of
/// `reply` and 8 bytes: what B sends, in order, and the ACKs among it.
fn b_replies_owing_an_ack(reply: u32) -> (Vec<Opcode>, Vec<(Psn, Syndrome)>, String) {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    p.post_recv(A, 200, &[sge(&r.src, SRC + RES, 4096)]);
    p.post_recv(A, 201, &[sge(&r.src, SRC + RES + 4096, 64)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]));
    let (pkt, encap) = p.transmit(A).unwrap();
    p.deliver(B, &pkt, encap);
    p.post_send(B, send(10, &[sge(&r.rcv, RCV + 1024, reply)]));
    p.post_send(B, send(11, &[sge(&r.rcv, RCV + 8192, 8)]));
    while p.transmit(B).is_some() {}
    let ops = wire(&p, B).into_iter().map(|(op, _)| op).collect();
    (ops, acks(&p, B), p.trace())
}

/// Packet order (srdma's choice; IBTA leaves it to the implementation): a lone positive ACK
/// lets one request message of the responder's own send queue go first — the peer waits for
/// that request (in a ping-pong, the reply), and the ACK, being cumulative, loses nothing by
/// following it. It does not wait for more than one, and a NAK never waits.
#[test]
fn a_lone_ack_follows_one_request_of_the_responders_own_and_a_nak_goes_first() {
    let (ops, acked, t) = b_replies_owing_an_ack(8);
    assert_eq!(
        ops,
        vec![
            Opcode::RcSendOnly,
            Opcode::RcAcknowledge,
            Opcode::RcSendOnly
        ],
        "{t}"
    );
    assert_eq!(acked, vec![(ps(0), Syndrome::ACK)], "{t}");

    // A PSN gap: B's NAK leaves before its next request.
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 256, 256)]);
    p.post_recv(A, 200, &[sge(&r.src, SRC + RES, 64)]);
    p.post_send(A, send(1, &[sge(&r.src, SRC, 8)]));
    p.post_send(A, send(2, &[sge(&r.src, SRC, 8)]));
    let _lost = p.transmit(A).unwrap();
    let (pkt, encap) = p.transmit(A).unwrap();
    p.deliver(B, &pkt, encap);
    p.post_send(B, send(10, &[sge(&r.rcv, RCV + 1024, 8)]));
    while p.transmit(B).is_some() {}
    let t = p.trace();
    let ops: Vec<Opcode> = wire(&p, B).into_iter().map(|(op, _)| op).collect();
    assert_eq!(ops, vec![Opcode::RcAcknowledge, Opcode::RcSendOnly], "{t}");
    assert_eq!(
        acks(&p, B),
        vec![(ps(0), nak(NakCode::PsnSequenceError))],
        "{t}"
    );
}

/// A lone positive ACK follows the whole of a reply of several packets, not its first packet:
/// a peer that takes the ACK in a poll and then spins on its memory for the reply (perftest's
/// `ib_write_lat`) finds all of it placed.
#[test]
fn a_lone_ack_follows_the_last_packet_of_a_reply_of_several() {
    // 2,500 bytes: three packets at MTU 1024.
    let (ops, acked, t) = b_replies_owing_an_ack(2500);
    assert_eq!(
        ops,
        vec![
            Opcode::RcSendFirst,
            Opcode::RcSendMiddle,
            Opcode::RcSendLast,
            Opcode::RcAcknowledge,
            Opcode::RcSendOnly
        ],
        "{t}"
    );
    assert_eq!(acked, vec![(ps(0), Syndrome::ACK)], "{t}");
}

/// A's GSO path probe (`Qp::gso_probe`, srdma's): a SEND_ONLY without payload at the PSN
/// before A's oldest unacknowledged one. B treats each copy as a duplicate (executes nothing,
/// consumes no receive) and answers each with its own ACK, as rxe's `duplicate_request`
/// does, and A counts both as ACKs that acknowledged nothing. The probe exists only while A
/// has nothing unacknowledged, right after connecting as after traffic.
#[test]
fn each_copy_of_a_gso_probe_draws_an_ack_that_acknowledges_nothing() {
    let mut p = rc();
    let r = regions(&mut p);
    p.post_recv(B, 100, &[sge(&r.rcv, RCV, 256)]);
    p.post_recv(B, 101, &[sge(&r.rcv, RCV + 256, 256)]);
    let probe_twice = |p: &mut Pair| -> u64 {
        let before = p.a.qp.unproductive_acks();
        for _ in 0..2 {
            let mut buf = vec![0u8; srdma_proto::transport::MAX_PACKET_LEN];
            let t = p.a.qp.gso_probe(&mut buf).expect("an idle RTS QP probes");
            buf.truncate(t.len);
            let e = encap(
                p.a.ip,
                ip_of(t.dest.dgid),
                t.dest.udp_sport,
                t.dest.udp_dport,
            );
            srdma_wire::Packet::new_unchecked(&mut buf[..])
                .fill_icrc(&e)
                .unwrap();
            let repr = PacketRepr::parse_bytes(&buf).unwrap();
            assert_eq!(repr.bth.opcode, Opcode::RcSendOnly);
            assert_eq!(repr.bth.psn, p.a.qp.psn_state().1.sub(1));
            assert!(repr.payload.is_empty());
            p.deliver(B, &buf, e);
        }
        p.pump();
        p.a.qp.unproductive_acks() - before
    };
    // Right after connecting: nothing sent yet.
    assert_eq!(probe_twice(&mut p), 2, "{}", p.trace());
    assert_eq!(p.b.qp.counters().duplicate_request, 2);
    // After a message, and while one is unacknowledged.
    p.post_send(A, send(1, &[sge(&r.src, SRC, 100)]));
    let (pkt, encap) = p.transmit(A).unwrap();
    let mut buf = vec![0u8; srdma_proto::transport::MAX_PACKET_LEN];
    assert!(
        p.a.qp.gso_probe(&mut buf).is_none(),
        "no probe while a PSN is unacknowledged"
    );
    p.deliver(B, &pkt, encap);
    p.pump();
    assert_eq!(st(&p.completions(A)), vec![(1, WcStatus::Success)]);
    assert_eq!(probe_twice(&mut p), 2, "{}", p.trace());
    assert_eq!(p.b.qp.counters().duplicate_request, 4);
    let b = p.completions(B);
    assert_eq!(
        st(&b),
        vec![(100, WcStatus::Success)],
        "probes complete nothing"
    );
    assert_eq!(p.b.qp.recv_queue_len(), 1, "nor take a receive");
    assert!(p.completions(A).is_empty());
}

/// A's and B's 1 MiB regions for the long READs below (A: zeros, B: a byte pattern).
fn long_regions(p: &mut Pair) -> (MrKeys, MrKeys) {
    let (a_at, b_at) = (0x100_0000, 0x200_0000);
    let a = p.reg(A, a_at, 1 << 20, 0, all_remote());
    let b = p.reg(B, b_at, 1 << 20, 0, all_remote());
    p.bytes_mut(B, &b).copy_from_slice(&pattern(1 << 20));
    (a, b)
}

fn read_1m(p: &mut Pair, a: &MrKeys, b: &MrKeys) {
    p.post_send(
        A,
        wr(
            7,
            SendOp::Read {
                remote_addr: 0x200_0000,
                rkey: rkey(b),
            },
            &[sge(a, 0x100_0000, 1 << 20)],
        ),
    );
}

/// (PSN, va, length) of every READ request A sent.
fn read_requests(p: &Pair) -> Vec<(Psn, u64, u32)> {
    p.sent_by(A)
        .iter()
        .filter(|s| s.pkt.bth.opcode == Opcode::RcRdmaReadRequest)
        .map(|s| {
            let r = s.pkt.reth.unwrap();
            (s.pkt.bth.psn, r.va, r.dma_len)
        })
        .collect()
}

/// Rule (srdma; flow control of READ responses): a READ longer than one segment
/// (`read_segment`: the window shared by `max_rd_atomic` READs, at least 256 response
/// packets) goes as consecutive READ requests of a segment each — PSN, address and length
/// advancing together, every one a READ request any responder takes — so that the window
/// paces its responses as it paces WRITEs; one completion, the data whole.
#[test]
fn a_long_read_goes_as_one_request_per_segment() {
    let mut p = rc();
    let (a, b) = long_regions(&mut p);
    read_1m(&mut p, &a, &b);
    p.settle();
    let t = p.trace();
    let seg = 256u32; // max_rd_atomic 4: 1024 / 4
    let want: Vec<_> = (0..4)
        .map(|i| {
            (
                ps(i * seg),
                0x200_0000 + u64::from(i * seg) * 1024,
                seg * 1024,
            )
        })
        .collect();
    assert_eq!(read_requests(&p), want, "{t}");
    assert_eq!(st(&p.completions(A)), vec![(7, WcStatus::Success)]);
    same(p.bytes(A, &a), &pattern(1 << 20), "data");
}

/// Rule: a response of a segmented READ that is lost is asked for again from the first
/// missing packet to the end of its segment (a request the responder answers from the
/// resource of that segment, as rxe's does: `duplicate_request` takes a re-request only
/// inside one READ's range), and the READ completes once, whole.
#[test]
fn a_lost_response_of_a_long_read_is_asked_again_to_its_segment_end() {
    let mut p = rc();
    let (a, b) = long_regions(&mut p);
    read_1m(&mut p, &a, &b);
    let mut dropped = false;
    // Timers enough for the responses paced after the re-request (go-back-N: see
    // `a_read_asked_again_paces_the_responses_toward_a_go_back_n_requester`).
    p.settle_with(10_000, |from, r| {
        if from == B && r.bth.psn == ps(300) && !dropped {
            dropped = true;
            return Fate::Drop;
        }
        Fate::Deliver
    });
    let t = p.trace();
    let reqs = read_requests(&p);
    assert!(
        reqs.contains(&(ps(300), 0x200_0000 + 300 * 1024, (512 - 300) * 1024)),
        "{reqs:x?}\n{t}"
    );
    assert!(
        reqs.iter().all(|&(psn, va, len)| {
            let k = psn.diff(ps(0)) as u64;
            va == 0x200_0000 + k * 1024 && (k + u64::from(len) / 1024) % 256 == 0
        }),
        "every request ends at a segment's end: {reqs:x?}"
    );
    assert_eq!(st(&p.completions(A)), vec![(7, WcStatus::Success)], "{t}");
    same(p.bytes(A, &a), &pattern(1 << 20), "data");
}

/// Rule: with `max_rd_atomic` 1 a READ's segments (1024 packets each) go one at a time: the
/// next request leaves only after the last response of the one before, so that no more
/// READ requests are outstanding than the responder agreed to keep.
#[test]
fn segments_of_a_long_read_respect_max_rd_atomic() {
    let mut p = rc_with(|a| {
        a.max_rd_atomic = 1;
        a.max_dest_rd_atomic = 1;
    });
    let a = p.reg(A, 0x100_0000, 2 << 20, 0, all_remote());
    let b = p.reg(B, 0x400_0000, 2 << 20, 0, all_remote());
    p.bytes_mut(B, &b).copy_from_slice(&pattern(2 << 20));
    p.post_send(
        A,
        wr(
            9,
            SendOp::Read {
                remote_addr: 0x400_0000,
                rkey: rkey(&b),
            },
            &[sge(&a, 0x100_0000, 2 << 20)],
        ),
    );
    p.settle();
    let t = p.trace();
    let sent = p.sent();
    let second = sent
        .iter()
        .position(|s| s.pkt.bth.opcode == Opcode::RcRdmaReadRequest && s.pkt.bth.psn == ps(1024))
        .unwrap_or_else(|| panic!("no second request\n{t}"));
    let last_of_first = sent
        .iter()
        .position(|s| {
            s.pkt.bth.psn == ps(1023) && s.pkt.bth.opcode == Opcode::RcRdmaReadResponseLast
        })
        .unwrap_or_else(|| panic!("no end of the first segment\n{t}"));
    assert!(last_of_first < second, "{t}");
    assert_eq!(read_requests(&p).len(), 2, "{t}");
    assert_eq!(st(&p.completions(A)), vec![(9, WcStatus::Success)]);
    same(p.bytes(A, &a), &pattern(2 << 20), "data");
}

/// An engine that cannot place a READ's payload after the transport took its responses (it
/// pulls them from the responder's memory, which went away: `Qp::fail_placement`): the READ
/// that completed with those bytes completes in error instead, later work is flushed, and
/// the QP is in ERR. Before completions are polled, so no success is ever seen.
#[test]
fn a_read_whose_bytes_could_not_be_placed_completes_in_error() {
    // A READ of `len` bytes of B's region into A's.
    let read = |r: &Regions, id, len| {
        wr(
            id,
            SendOp::Read {
                remote_addr: DST,
                rkey: rkey(&r.dst),
            },
            &[sge(&r.src, SRC + RES, len)],
        )
    };
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(A, read(&r, 1, 4000));
    p.settle();
    assert_eq!(st(&p.completions(A)), [(1, WcStatus::Success)]);
    // The second READ's responses are taken, its completion waits to be polled.
    p.post_send(A, read(&r, 2, 4000));
    p.post_send(A, send(3, &[sge(&r.src, SRC, 8)]));
    p.pump_with(|from, r| {
        if from == A && r.bth.opcode.kind() != Kind::ReadRequest {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.side(A).qp.fail_placement(WcStatus::RemAccessErr);
    assert_eq!(
        st(&p.completions(A)),
        [(2, WcStatus::RemAccessErr), (3, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.side(A).qp.state(), QpState::Err);

    // A READ still in progress (its first responses taken): it is the one that fails.
    let mut p = rc();
    let r = regions(&mut p);
    p.post_send(A, read(&r, 7, 8000));
    let mut responses = 0;
    p.pump_with(|from, r| {
        if from == B && r.bth.opcode.kind() == Kind::ReadResponse {
            responses += 1;
            if responses > 1 {
                return Fate::Drop;
            }
        }
        Fate::Deliver
    });
    assert!(p.completions(A).is_empty());
    p.side(A).qp.fail_placement(WcStatus::RetryExcErr);
    assert_eq!(st(&p.completions(A)), [(7, WcStatus::RetryExcErr)]);
    assert_eq!(p.side(A).qp.state(), QpState::Err);
}
