//! Memory windows (IBA 10.6.7; rxe `rxe_mw.c`, the MW paths of `rxe_req.c` / `rxe_resp.c`):
//! the table rules of bind, invalidate and deregistration, and end to end through two QPs —
//! RDMA with a window's R_Key inside and outside it, after a local invalidate, after a SEND
//! with invalidate, and the completions on both ends.

mod common;

use common::*;
use srdma_proto::{
    AccessFlags, MrError, MrKeys, MrTable, Mtu, MwBind, MwError, MwState, MwType, PdId, QpType,
    RKey, SendOp, WcFlags, WcOpcode, WcStatus,
};
use srdma_wire::{Opcode, PacketRepr, Qpn};

use End::{A, B};

const SRC: u64 = 0x1000_0000;
const DST: u64 = 0x2000_0000;
const RCV: u64 = 0x3000_0000;
const LEN: usize = 4096;
/// The window B binds over its region: 1 KiB starting 512 bytes in.
const WIN: u64 = DST + 512;
const WIN_LEN: u64 = 1024;

fn bindable() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
}

fn bind(mw_rkey: RKey, mr: &MrKeys, addr: u64, len: u64, access: AccessFlags) -> MwBind {
    MwBind {
        mw_rkey,
        rkey: srdma_inc(mw_rkey),
        mr_lkey: mr.lkey,
        addr,
        len,
        access,
    }
}

fn srdma_inc(k: RKey) -> RKey {
    RKey((k.0 & !0xFF) | (k.0.wrapping_add(1) & 0xFF))
}

/// An RC pair; B's region (no remote rights of its own) with a type 2 window bound by a
/// BIND_MW work request on B's QP. Returns A's source region, B's region, the window's R_Key.
fn bound_pair(access: AccessFlags) -> (Pair, MrKeys, MrKeys, RKey) {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    let src = p.reg(A, SRC, LEN, 0x5A, all_remote());
    let dst = p.reg(B, DST, LEN, 0, bindable());
    assert_eq!(dst.rkey, None, "the region itself has no R_Key");
    let s = p.side(B);
    let mw = s.mrs.alloc_mw(s.pd, MwType::Type2).unwrap();
    let b = bind(mw, &dst, WIN, WIN_LEN, access);
    p.post_send(B, wr(7, SendOp::BindMw(b), &[]));
    p.settle();
    let wcs = p.completions(B);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (7, WcStatus::Success, WcOpcode::BindMw)
    );
    assert!(p.log.is_empty(), "a bind sends nothing");
    (p, src, dst, b.rkey)
}

fn write(p: &mut Pair, src: &MrKeys, rkey: RKey, addr: u64, len: u32) -> WcStatus {
    p.post_send(
        A,
        wr(
            1,
            SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            &[sge(src, SRC, len)],
        ),
    );
    p.settle();
    let wcs = p.completions(A);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0].status
}

#[test]
fn rdma_write_through_a_window_lands_in_its_region() {
    let (mut p, src, dst, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    assert_eq!(write(&mut p, &src, rkey, WIN + 10, 100), WcStatus::Success);
    let b = p.bytes(B, &dst);
    assert!(b[522..622].iter().all(|&x| x == 0x5A));
    assert!(b[..522].iter().chain(&b[622..]).all(|&x| x == 0));
}

#[test]
fn window_bounds_rights_and_key_are_checked() {
    // Past the window's end (but inside the region): remote access error.
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    assert_eq!(
        write(&mut p, &src, rkey, WIN + WIN_LEN - 8, 16),
        WcStatus::RemAccessErr
    );
    // Before the window.
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    assert_eq!(
        write(&mut p, &src, rkey, WIN - 1, 4),
        WcStatus::RemAccessErr
    );
    // A READ-only window refuses WRITE (test_qp_ex_rc_bind_mw's case, with LOCAL_WRITE only).
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_READ);
    assert_eq!(write(&mut p, &src, rkey, WIN, 4), WcStatus::RemAccessErr);
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::LOCAL_WRITE);
    assert_eq!(write(&mut p, &src, rkey, WIN, 4), WcStatus::RemAccessErr);
    // The key the window had before the bind no longer works.
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    let old = RKey((rkey.0 & !0xFF) | (rkey.0.wrapping_sub(1) & 0xFF));
    assert_eq!(write(&mut p, &src, old, WIN, 4), WcStatus::RemAccessErr);
    // The NAK on the wire is "remote access error".
    let naks: Vec<_> = p
        .log
        .iter()
        .filter(|(from, _)| *from == B)
        .filter_map(|(_, b)| PacketRepr::parse_bytes(b).ok()?.aeth)
        .filter(|a| matches!(a.syndrome, srdma_wire::Syndrome::Nak(_)))
        .collect();
    assert_eq!(naks.len(), 1);
    assert_eq!(
        naks[0].syndrome,
        srdma_wire::Syndrome::Nak(srdma_wire::NakCode::RemoteAccessError)
    );
}

#[test]
fn rdma_read_through_a_window() {
    let (mut p, src, dst, rkey) = bound_pair(AccessFlags::REMOTE_READ);
    p.bytes_mut(B, &dst)[512..612].fill(0x77);
    p.post_send(
        A,
        wr(
            2,
            SendOp::Read {
                remote_addr: WIN,
                rkey,
            },
            &[sge(&src, SRC, 100)],
        ),
    );
    p.settle();
    let wcs = p.completions(A);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(p.bytes(A, &src)[..100].iter().all(|&x| x == 0x77));
}

#[test]
fn local_invalidate_revokes_the_window() {
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    assert_eq!(write(&mut p, &src, rkey, WIN, 8), WcStatus::Success);
    p.post_send(B, wr(9, SendOp::LocalInv { rkey }, &[]));
    p.settle();
    let wcs = p.completions(B);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(p.side(B).mrs.query_mw(rkey).unwrap().state, MwState::Free);
    assert_eq!(write(&mut p, &src, rkey, WIN, 8), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_revokes_the_window_at_the_target() {
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    let rcv = p.reg(B, RCV, LEN, 0, AccessFlags::LOCAL_WRITE);
    p.post_recv(B, 5, &[sge(&rcv, RCV, 64)]);
    p.post_send(
        A,
        wr(3, SendOp::SendWithInv { rkey }, &[sge(&src, SRC, 16)]),
    );
    p.settle();
    let sent = PacketRepr::parse_bytes(&p.log[0].1).unwrap();
    assert_eq!(sent.bth.opcode, Opcode::RcSendOnlyWithInvalidate);
    assert_eq!(sent.ieth, Some(rkey.0));
    let a = p.completions(A);
    assert_eq!(
        (a[0].status, a[0].opcode),
        (WcStatus::Success, WcOpcode::Send)
    );
    let b = p.completions(B);
    assert_eq!(
        (b[0].wr_id, b[0].status, b[0].opcode),
        (5, WcStatus::Success, WcOpcode::Recv)
    );
    assert!(b[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(b[0].invalidated_rkey, Some(rkey));
    assert_eq!(b[0].byte_len, 16);
    assert_eq!(write(&mut p, &src, rkey, WIN, 8), WcStatus::RemAccessErr);
}

#[test]
fn multi_packet_send_with_invalidate_carries_the_ieth_last() {
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    let rcv = p.reg(B, RCV, LEN, 0, AccessFlags::LOCAL_WRITE);
    p.post_recv(B, 5, &[sge(&rcv, RCV, 4096)]);
    p.post_send(
        A,
        wr(3, SendOp::SendWithInv { rkey }, &[sge(&src, SRC, 2500)]),
    );
    p.settle();
    let ops: Vec<_> = p
        .log
        .iter()
        .filter(|(from, _)| *from == A)
        .map(|(_, b)| PacketRepr::parse_bytes(b).unwrap())
        .map(|r| (r.bth.opcode, r.ieth))
        .collect();
    assert_eq!(
        ops,
        [
            (Opcode::RcSendFirst, None),
            (Opcode::RcSendMiddle, None),
            (Opcode::RcSendLastWithInvalidate, Some(rkey.0)),
        ]
    );
    let b = p.completions(B);
    assert_eq!(b[0].invalidated_rkey, Some(rkey));
    assert_eq!(b[0].byte_len, 2500);
}

#[test]
fn send_with_invalidate_of_a_bad_key_is_an_invalid_request() {
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    let rcv = p.reg(B, RCV, LEN, 0, AccessFlags::LOCAL_WRITE);
    p.post_recv(B, 5, &[sge(&rcv, RCV, 64)]);
    let wrong = RKey(rkey.0 ^ 0x80);
    p.post_send(
        A,
        wr(
            3,
            SendOp::SendWithInv { rkey: wrong },
            &[sge(&src, SRC, 16)],
        ),
    );
    p.settle();
    assert_eq!(p.completions(A)[0].status, WcStatus::RemInvReqErr);
    assert_eq!(p.completions(B)[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn failed_bind_completes_with_mw_bind_err() {
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    // A region without MW_BIND (C10-73).
    let dst = p.reg(B, DST, LEN, 0, AccessFlags::LOCAL_WRITE);
    let s = p.side(B);
    let mw = s.mrs.alloc_mw(s.pd, MwType::Type2).unwrap();
    let b = bind(mw, &dst, DST, 64, AccessFlags::REMOTE_WRITE);
    p.post_send(B, wr(4, SendOp::BindMw(b), &[]));
    p.settle();
    let wcs = p.completions(B);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (4, WcStatus::MwBindErr, WcOpcode::BindMw)
    );
    assert_eq!(p.side(B).qp.state(), srdma_proto::QpState::Err);
}

#[test]
fn local_ops_complete_in_order_after_earlier_requests() {
    let (mut p, src, _, rkey) = bound_pair(AccessFlags::REMOTE_WRITE);
    let rcv = p.reg(B, RCV, LEN, 0, AccessFlags::LOCAL_WRITE);
    p.post_recv(B, 5, &[sge(&rcv, RCV, 64)]);
    // A: SEND, then a bind of its own window: the bind completes after the SEND's ACK.
    let amr = p.reg(A, DST, LEN, 0, bindable());
    let s = p.side(A);
    let amw = s.mrs.alloc_mw(s.pd, MwType::Type2).unwrap();
    p.post_send(A, wr(1, SendOp::Send, &[sge(&src, SRC, 8)]));
    p.post_send(
        A,
        wr(
            2,
            SendOp::BindMw(bind(amw, &amr, DST, 64, AccessFlags::REMOTE_READ)),
            &[],
        ),
    );
    // Before any packet comes back, the bind has not run.
    while p.transmit(A).is_some() {}
    assert!(p.completions(A).is_empty());
    p.settle();
    let wcs = p.completions(A);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
    assert_eq!(
        got,
        [
            (1, WcOpcode::Send, WcStatus::Success),
            (2, WcOpcode::BindMw, WcStatus::Success)
        ]
    );
    let _ = rkey;
}

// ---- The table rules, without traffic.

const PD: PdId = PdId(1);
const QP: Qpn = Qpn::new(0x11);

fn table() -> (MrTable, MrKeys) {
    let mut t = MrTable::new(9);
    let mr = t.register(PD, 0x10_000, 4096, bindable()).unwrap();
    (t, mr)
}

#[test]
fn bind_checks_follow_rxe() {
    let (mut t, mr) = table();
    let w2 = t.alloc_mw(PD, MwType::Type2).unwrap();
    assert!(w2.0 >> 8 >= srdma_proto::mr::MW_INDEX_BASE, "{w2:?}");
    let rw = AccessFlags::REMOTE_WRITE;
    // Outside the region (C10-75).
    assert_eq!(
        t.bind_mw(PD, QP, &bind(w2, &mr, 0x10_000 + 4000, 200, rw)),
        Err(MwError::OutOfRegion {
            addr: 0x10_000 + 4000,
            len: 200
        })
    );
    // Type 2 with length 0 (o10-37.2.40).
    assert_eq!(
        t.bind_mw(PD, QP, &bind(w2, &mr, 0x10_000, 0, rw)),
        Err(MwError::ZeroLength)
    );
    // A QP of another PD (C10-72).
    assert_eq!(
        t.bind_mw(PdId(2), QP, &bind(w2, &mr, 0x10_000, 8, rw)),
        Err(MwError::PdMismatch { key: w2.0 })
    );
    // Zero-based windows are not supported.
    assert!(matches!(
        t.bind_mw(
            PD,
            QP,
            &bind(w2, &mr, 0x10_000, 8, rw | AccessFlags::ZERO_BASED)
        ),
        Err(MwError::Unsupported { .. })
    ));
    // A wrong window key.
    assert_eq!(
        t.bind_mw(PD, QP, &bind(RKey(w2.0 ^ 1), &mr, 0x10_000, 8, rw)),
        Err(MwError::InvalidKey { key: w2.0 ^ 1 })
    );
    // Remote write on a region without local write (C10-74).
    let ro = t.register(PD, 0x20_000, 64, AccessFlags::MW_BIND).unwrap();
    assert_eq!(
        t.bind_mw(PD, QP, &bind(w2, &ro, 0x20_000, 8, rw)),
        Err(MwError::NeedsLocalWrite { access: rw })
    );
    // A good bind; a type 2 window cannot be bound twice without an invalidate.
    let k = t.bind_mw(PD, QP, &bind(w2, &mr, 0x10_000, 8, rw)).unwrap();
    assert_eq!(k.0 & 0xFF, (w2.0 + 1) & 0xFF);
    assert!(matches!(
        t.bind_mw(PD, QP, &bind(k, &mr, 0x10_000, 8, rw)),
        Err(MwError::WrongState { .. })
    ));
}

#[test]
fn type2_windows_serve_only_their_qp() {
    let (mut t, mr) = table();
    let w = t.alloc_mw(PD, MwType::Type2).unwrap();
    let k = t
        .bind_mw(
            PD,
            QP,
            &bind(w, &mr, 0x10_000, 64, AccessFlags::REMOTE_WRITE),
        )
        .unwrap();
    let rw = AccessFlags::REMOTE_WRITE;
    assert!(t.check_remote_at(PD, QP, k, 0x10_000, 8, rw).is_ok());
    assert!(matches!(
        t.check_remote_at(PD, Qpn::new(0x99), k, 0x10_000, 8, rw),
        Err(MrError::InvalidKey { .. })
    ));
    assert!(t.check_remote(PD, k, 0x10_000, 8, rw).is_err());
    assert!(matches!(
        t.check_remote_at(PdId(2), QP, k, 0x10_000, 8, rw),
        Err(MrError::PdMismatch { .. })
    ));
    // Only its QP invalidates it.
    assert_eq!(
        t.invalidate_rkey(Qpn::new(0x99), k),
        Err(MwError::QpMismatch { key: k.0 })
    );
    t.invalidate_rkey(QP, k).unwrap();
    assert!(t.check_remote_at(PD, QP, k, 0x10_000, 8, rw).is_err());
    assert!(matches!(
        t.invalidate_rkey(QP, k),
        Err(MwError::WrongState { .. })
    ));
    // A destroyed QP's windows go free, and a later QP with its number gets none of them.
    let w = t.alloc_mw(PD, MwType::Type2).unwrap();
    let k = t.bind_mw(PD, QP, &bind(w, &mr, 0x10_000, 64, rw)).unwrap();
    t.unbind_qp_windows(QP);
    assert_eq!(t.query_mw(k).unwrap().state, MwState::Free);
    assert!(t.check_remote_at(PD, QP, k, 0x10_000, 8, rw).is_err());
}

#[test]
fn type1_windows_bind_unbind_and_never_invalidate() {
    let (mut t, mr) = table();
    let w = t.alloc_mw(PD, MwType::Type1).unwrap();
    assert_eq!(t.query_mw(w).unwrap().state, MwState::Valid);
    let rr = AccessFlags::REMOTE_READ;
    assert!(t.check_remote(PD, w, 0x10_000, 8, rr).is_err(), "unbound");
    let k = t.bind_mw(PD, QP, &bind(w, &mr, 0x10_000, 64, rr)).unwrap();
    // Any QP of the PD may use a type 1 window.
    assert!(
        t.check_remote_at(PD, Qpn::new(0x99), k, 0x10_008, 8, rr)
            .is_ok()
    );
    assert!(t.check_remote(PD, k, 0x10_000, 64, rr).is_ok());
    assert_eq!(
        t.invalidate_rkey(QP, k),
        Err(MwError::Type1Invalidate { key: k.0 })
    );
    // Rebinding with length 0 unbinds (what test_invalidate_mw_type1 does).
    let k2 = t
        .bind_mw(
            PD,
            QP,
            &MwBind {
                len: 0,
                ..bind(k, &mr, 0x10_000, 0, AccessFlags::empty())
            },
        )
        .unwrap();
    assert!(t.check_remote(PD, k2, 0x10_000, 8, rr).is_err());
    // Region keys are not invalidated (srdma has no fast-registration regions).
    assert_eq!(
        t.invalidate_rkey(QP, RKey(mr.lkey.0)),
        Err(MwError::NotAWindow { key: mr.lkey.0 })
    );
}

#[test]
fn deregistration_waits_for_bound_windows_and_dealloc_kills_the_key() {
    let (mut t, mr) = table();
    let w = t.alloc_mw(PD, MwType::Type2).unwrap();
    let k = t
        .bind_mw(
            PD,
            QP,
            &bind(w, &mr, 0x10_000, 64, AccessFlags::REMOTE_READ),
        )
        .unwrap();
    assert_eq!(t.windows_bound(mr.lkey), 1);
    assert_eq!(
        t.deregister(mr.lkey),
        Err(MrError::WindowsBound {
            key: mr.lkey.0,
            windows: 1
        })
    );
    assert!(t.query(mr.lkey).is_some(), "still registered");
    assert_eq!(
        t.reregister(mr.lkey, None, None, Some(AccessFlags::LOCAL_WRITE)),
        Err(MrError::WindowsBound {
            key: mr.lkey.0,
            windows: 1
        })
    );
    // Deallocating the window unbinds it; its key is dead; the region may go.
    t.dealloc_mw(w).unwrap();
    assert_eq!(t.mw_count(), 0);
    assert!(
        t.check_remote_at(PD, QP, k, 0x10_000, 8, AccessFlags::REMOTE_READ)
            .is_err()
    );
    assert_eq!(t.windows_bound(mr.lkey), 0);
    t.deregister(mr.lkey).unwrap();
    // The forced form unbinds instead of refusing.
    let (mut t, mr) = table();
    let w = t.alloc_mw(PD, MwType::Type2).unwrap();
    let k = t
        .bind_mw(
            PD,
            QP,
            &bind(w, &mr, 0x10_000, 64, AccessFlags::REMOTE_READ),
        )
        .unwrap();
    t.deregister_unbinding(mr.lkey).unwrap();
    assert_eq!(t.query_mw(k).unwrap().state, MwState::Free);
    assert!(
        t.check_remote_at(PD, QP, k, 0x10_000, 8, AccessFlags::REMOTE_READ)
            .is_err()
    );
}

#[test]
fn wrong_types_are_refused() {
    assert_eq!(MwType::from_u32(1), Some(MwType::Type1));
    assert_eq!(MwType::from_u32(2), Some(MwType::Type2));
    assert_eq!(MwType::from_u32(0), None);
    assert_eq!(MwType::from_u32(3), None);
}
