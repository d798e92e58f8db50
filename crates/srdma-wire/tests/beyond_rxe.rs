//! Byte-exact packets of the opcodes Debian's kernel rxe (6.1) does not have: RDMA ATOMIC
//! WRITE (IBTA 1.5, 0x1D).

use srdma_wire::{BthRepr, Opcode, PacketRepr, Psn, Qpn, RethRepr};

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
    assert_eq!(&back, repr);
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
