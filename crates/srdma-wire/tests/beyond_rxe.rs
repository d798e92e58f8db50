//! Byte-exact packets of the opcodes Debian's kernel rxe (6.1) does not have: RDMA ATOMIC
//! WRITE (IBTA 1.5, 0x1D) and the XRC transport (0xA0.., XRCETH right after the BTH).

use srdma_wire::{
    AethRepr, AtomicEthRepr, BthRepr, Headers, Opcode, PacketRepr, Psn, Qpn, RethRepr, Syndrome,
    Transport,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn bth(opcode: Opcode, ack_req: bool) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x00_0022),
        ack_req,
        psn: Psn::new(0x12_3456),
    }
}

/// Emits `repr`, checks the bytes against `want` (ICRC left zero) and parses them back.
fn exact(repr: &PacketRepr<'_>, want: &str) {
    let want = hex(want);
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).unwrap();
    assert_eq!(&buf[..n], &want[..], "{repr}");
    let back = PacketRepr::parse_bytes(&buf[..n]).unwrap();
    let mut same = *repr;
    same.bth.pad_cnt = repr.pad_len() as u8;
    assert_eq!(back, same);
}

#[test]
fn rc_atomic_write_is_bth_reth_and_eight_bytes() {
    let mut r = PacketRepr::new(
        bth(Opcode::RcAtomicWrite, true),
        b"\x01\x02\x03\x04\x05\x06\x07\x08",
    );
    r.reth = Some(RethRepr {
        va: 0x0000_7f00_1234_5678,
        rkey: 0x0000_1a2b,
        dma_len: 8,
    });
    exact(
        &r,
        "1d 00 ffff 00 000022 80 123456
         00007f0012345678 00001a2b 00000008
         0102030405060708
         00000000",
    );
    assert_eq!(Opcode::RcAtomicWrite.header_len(), 28);
}

#[test]
fn rc_atomic_write_payload_is_exactly_eight_bytes() {
    let op = Opcode::RcAtomicWrite;
    assert!(op.check_payload_len(8, 256).is_ok());
    for bad in [0, 4, 7, 9, 16] {
        assert!(op.check_payload_len(bad, 4096).is_err(), "{bad}");
    }
    assert!(op.is_request() && op.is_start() && op.is_end());
    assert!(!op.consumes_recv_wqe());
}

#[test]
fn xrc_send_only_carries_the_xrceth_after_the_bth() {
    let mut r = PacketRepr::new(bth(Opcode::XrcSendOnly, true), b"hi!!");
    r.xrceth = Some(0x00AB_CDEF);
    exact(
        &r,
        "a4 00 ffff 00 000022 80 123456
         00abcdef
         68692121
         00000000",
    );
    let line = r.to_string();
    assert!(line.starts_with("XRC_SEND_ONLY"), "{line}");
    assert!(line.contains("xrceth[srq=0xabcdef]"), "{line}");
    assert!(
        r.verbose().to_string().contains("XRCETH: xrcsrq=0xabcdef"),
        "{}",
        r.verbose()
    );
}

#[test]
fn xrc_write_with_immediate_orders_xrceth_reth_immdt() {
    let mut r = PacketRepr::new(
        bth(Opcode::XrcRdmaWriteOnlyWithImmediate, true),
        b"\xaa\xbb",
    );
    r.xrceth = Some(7);
    r.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x55,
        dma_len: 2,
    });
    r.imm_dt = Some(0x0102_0304);
    // Two payload bytes: pad count 2 in the BTH (0x20), two zero pad bytes.
    exact(
        &r,
        "ab 20 ffff 00 000022 80 123456
         00000007
         0000000000001000 00000055 00000002
         01020304
         aabb 0000
         00000000",
    );
    let h = Opcode::XrcRdmaWriteOnlyWithImmediate.headers();
    assert_eq!(h.offset_of(Headers::XRCETH), Some(0));
    assert_eq!(h.offset_of(Headers::RETH), Some(4));
    assert_eq!(h.offset_of(Headers::IMM_DT), Some(20));
}

#[test]
fn xrc_fetch_add_and_its_acknowledgements() {
    let mut r = PacketRepr::new(bth(Opcode::XrcFetchAdd, true), &[]);
    r.xrceth = Some(0x12);
    r.atomic_eth = Some(AtomicEthRepr {
        va: 0x2000,
        rkey: 0x66,
        swap_add: 2,
        compare: 0,
    });
    exact(
        &r,
        "b4 00 ffff 00 000022 80 123456
         00000012
         0000000000002000 00000066 0000000000000002 0000000000000000
         00000000",
    );
    // Responses to XRC requests have no XRCETH: the same layout as RC's.
    let mut ack = PacketRepr::new(bth(Opcode::XrcAcknowledge, false), &[]);
    ack.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK,
        msn: 3,
    });
    exact(
        &ack,
        "b1 00 ffff 00 000022 00 123456
         1f000003
         00000000",
    );
    assert_eq!(Opcode::XrcAtomicAcknowledge.header_len(), 24);
    assert_eq!(Opcode::XrcRdmaReadResponseMiddle.header_len(), 12);
}

#[test]
fn xrc_opcodes_are_rc_plus_0xa0() {
    let mut n = 0;
    for &op in Opcode::ALL {
        if op.transport() != Transport::Xrc {
            continue;
        }
        n += 1;
        let rc = op.rc_xrc_twin().expect("every XRC opcode has an RC twin");
        assert_eq!(rc.value() + 0xA0, op.value());
        assert_eq!(rc.transport(), Transport::Rc);
        assert_eq!(rc.rc_xrc_twin(), Some(op));
        assert_eq!((rc.kind(), rc.position()), (op.kind(), op.position()));
        // Requests gain the XRCETH; responses do not.
        let want = if op.is_request() {
            rc.headers().with(Headers::XRCETH)
        } else {
            rc.headers()
        };
        assert_eq!(op.headers(), want, "{op}");
    }
    // Every RC opcode but FLUSH and ATOMIC WRITE (IBTA 1.5, no XRC twin in ib_pack.h).
    assert_eq!(n, 23);
    assert_eq!(Opcode::RcFlush.rc_xrc_twin(), None);
    assert_eq!(Opcode::RcAtomicWrite.rc_xrc_twin(), None);
    assert_eq!(Opcode::UdSendOnly.rc_xrc_twin(), None);
}

#[test]
fn xrceth_reserved_bits_are_ignored_and_its_range_is_24_bits() {
    let mut r = PacketRepr::new(bth(Opcode::XrcSendOnly, false), &[]);
    r.xrceth = Some(0x0100_0000);
    let mut buf = vec![0u8; r.buffer_len()];
    assert!(r.emit(&mut buf).is_err(), "25-bit SRQ number");
    r.xrceth = Some(0xFF_FFFF);
    let n = r.emit(&mut buf).unwrap();
    buf[12] = 0xC3; // reserved byte
    assert_eq!(
        PacketRepr::parse_bytes(&buf[..n]).unwrap().xrceth,
        Some(0xFF_FFFF)
    );
    // An XRC request without its XRCETH, or an RC one with it, is refused.
    r.xrceth = None;
    assert!(r.emit(&mut buf).is_err());
    let mut rc = PacketRepr::new(bth(Opcode::RcSendOnly, false), &[]);
    rc.xrceth = Some(1);
    assert!(rc.emit(&mut buf).is_err());
}
