//! Every parser of srdma-wire on arbitrary bytes: as a RoCEv2 packet (`Packet`, every
//! accessor, `PacketRepr`, Display/verbose, re-emit), as a frame of every pcap link type
//! (`frame::roce_in_frame`, `icrc_status`), as a pcap file (`pcap::Reader`, every record), and
//! as IP / UDP headers. Nothing may panic, the accessors must agree, and whatever parses must
//! re-emit to a packet of the same length that parses to the same representation.
//!
//! Shared by the proptest in `tests/prop.rs` and the cargo-fuzz target
//! `fuzz/fuzz_targets/parse_packet.rs`: a violated check panics, which proptest reports (and
//! shrinks) as a failing case and libFuzzer as a crash.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::hint::black_box;

use srdma_wire::frame::{self, IcrcStatus};
use srdma_wire::icrc::{self, ICRC_LEN};
use srdma_wire::ip::UdpRepr;
use srdma_wire::{
    Encap, Error, Headers, IpRepr, Packet, PacketRepr, PayloadRule, ROCEV2_PORT, Syndrome, pcap,
};

pub const LINKTYPES: [u32; 7] = [
    pcap::LINKTYPE_NULL,
    pcap::LINKTYPE_ETHERNET,
    pcap::LINKTYPE_RAW,
    pcap::LINKTYPE_LINUX_SLL,
    pcap::LINKTYPE_IPV4,
    pcap::LINKTYPE_IPV6,
    pcap::LINKTYPE_LINUX_SLL2,
];

/// Every accessor of a checked packet; they must agree with each other.
fn packet_view(p: &Packet<&[u8]>) {
    let op = p.opcode();
    let bth = p.bth();
    black_box((
        bth.opcode_raw(),
        bth.solicited(),
        bth.mig_req(),
        bth.pkey(),
        bth.fecn(),
        bth.becn(),
        bth.dest_qpn(),
        bth.ack_req(),
        bth.psn(),
    ));
    assert_eq!(bth.opcode(), Ok(op));
    assert_eq!(bth.tver(), 0);
    assert_eq!(usize::from(bth.pad_cnt()), p.pad_len());

    let h = op.headers();
    assert_eq!(p.deth().is_some(), h.contains(Headers::DETH));
    assert_eq!(p.feth().is_some(), h.contains(Headers::FETH));
    assert_eq!(p.reth().is_some(), h.contains(Headers::RETH));
    assert_eq!(p.atomic_eth().is_some(), h.contains(Headers::ATOMIC_ETH));
    assert_eq!(p.imm_dt().is_some(), h.contains(Headers::IMM_DT));
    assert_eq!(p.ieth().is_some(), h.contains(Headers::IETH));
    assert_eq!(p.aeth().is_some(), h.contains(Headers::AETH));
    assert_eq!(
        p.atomic_ack_eth().is_some(),
        h.contains(Headers::ATOMIC_ACK_ETH)
    );
    if let Some(x) = p.deth() {
        black_box((x.qkey(), x.src_qpn()));
    }
    if let Some(x) = p.feth() {
        black_box((x.placement_type(), x.selectivity()));
    }
    if let Some(x) = p.reth() {
        black_box((x.va(), x.rkey(), x.dma_len()));
    }
    if let Some(x) = p.atomic_eth() {
        black_box((x.va(), x.rkey(), x.swap_add(), x.compare()));
    }
    if let Some(x) = p.imm_dt() {
        black_box(x.value());
    }
    if let Some(x) = p.ieth() {
        black_box(x.rkey());
    }
    if let Some(x) = p.aeth() {
        let s = Syndrome::from_byte(x.syndrome_raw());
        assert_eq!(s.to_byte(), x.syndrome_raw());
        black_box((x.msn(), s.to_string()));
    }
    if let Some(x) = p.atomic_ack_eth() {
        black_box(x.orig());
    }

    let total = p.as_bytes().len();
    assert_eq!(
        p.header_len() + p.payload_len() + p.pad_len() + ICRC_LEN,
        total
    );
    assert_eq!(p.header_len(), op.header_len());
    assert_eq!(p.payload().len(), p.payload_len());
    assert_eq!(p.pad().len(), p.pad_len());
    assert_eq!(p.icrc_covered().len(), total - ICRC_LEN);
    assert_eq!(Some(p.icrc()), icrc::carried(p.as_bytes()));
    if op.payload_rule() == PayloadRule::None {
        assert_eq!(p.payload_len(), 0);
    }
    black_box(op.check_payload_len(p.payload_len(), 1024).is_ok());
    let encap = Encap {
        ip: IpRepr::between([10, 0, 0, 1].into(), [10, 0, 0, 2].into()).unwrap(),
        src_port: 0xC000,
        dst_port: ROCEV2_PORT,
    };
    black_box(p.verify_icrc(&encap).is_ok());
}

/// `data` as a RoCEv2 packet.
fn packet_bytes(data: &[u8]) {
    let checked = Packet::new_checked(data);
    let parsed = PacketRepr::parse_bytes(data);
    assert_eq!(checked.is_ok(), parsed.is_ok(), "{checked:?} vs {parsed:?}");
    // The headers from a prefix (as from a private copy of a shared ring's record) and the
    // payload from where it lies: the same repr, the same verdict.
    let cut = data.len().min(srdma_wire::MAX_HEADER_LEN);
    match (PacketRepr::parse_head(&data[..cut], data.len()), &parsed) {
        (Ok((mut r, range)), Ok(whole)) => {
            r.payload = &data[range];
            assert_eq!(&r, whole);
        }
        (Err(e), Err(whole)) => assert_eq!(&e, whole),
        (head, whole) => panic!("parse_head {head:?} vs parse_bytes {whole:?}"),
    }
    // A head shorter than the headers is an error, never a panic.
    for short in 0..cut {
        let _ = black_box(PacketRepr::parse_head(&data[..short], data.len()));
    }
    if let Ok(p) = checked {
        packet_view(&p);
    }
    if let Ok(repr) = parsed {
        let line = repr.to_string();
        assert!(!line.contains('\n'), "Display is one line: {line}");
        let mut s = String::new();
        write!(s, "{}\n{repr:?}", repr.verbose()).unwrap();
        black_box(s);
        // parse(emit(parse(x))) == parse(x), at the same length.
        let mut out = vec![0u8; repr.buffer_len()];
        assert_eq!(repr.emit(&mut out), Ok(data.len()));
        assert_eq!(PacketRepr::parse_bytes(&out), Ok(repr));
    }
}

/// `data` as a frame of `linktype`.
fn frame_bytes(linktype: u32, data: &[u8]) {
    if let Ok(Some(f)) = frame::roce_in_frame(linktype, data) {
        assert!(f.ip_header.len() >= 20);
        assert_eq!(f.udp_header.len(), 8);
        assert_eq!(f.encap.dst_port, ROCEV2_PORT);
        let status = f.icrc_status();
        if f.truncated {
            assert_eq!(status, IcrcStatus::Unverifiable("capture truncated"));
        }
        black_box(status);
        packet_bytes(f.roce);
    }
}

/// All the checks on `data`.
pub fn any_input(data: &[u8]) {
    packet_bytes(data);
    for linktype in LINKTYPES {
        frame_bytes(linktype, data);
    }
    assert_eq!(
        frame::roce_in_frame(0xBEEF, data).map(|_| ()),
        Err(Error::UnsupportedLinkType(0xBEEF))
    );
    if let Ok((ip, hl, _)) = IpRepr::parse(data) {
        assert!(hl >= ip.header_len() && hl <= data.len());
    }
    if let Ok(udp) = UdpRepr::parse(data) {
        assert!(udp.len >= 8);
    }
    if let Ok(reader) = pcap::Reader::new(data) {
        let linktype = reader.linktype();
        // Every record consumes at least its 16-byte header: the iteration must end.
        let bound = data.len() / 16 + 1;
        for (n, rec) in reader.enumerate() {
            assert!(n < bound, "pcap reader does not terminate");
            if let Ok(rec) = rec {
                black_box((rec.ts_ns, rec.truncated()));
                frame_bytes(linktype, rec.data);
            }
        }
    }
}
