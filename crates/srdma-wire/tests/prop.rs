//! Property tests of the wire layer.
//!
//! * Every valid [`PacketRepr`] of every opcode in [`Opcode::ALL`] (random BTH fields, exactly
//!   the extension headers the opcode carries, random header values, a payload the opcode
//!   allows) survives `emit` / `emit_with_icrc` → `parse_bytes` unchanged, and its ICRC
//!   verifies for a random IPv4 or IPv6 encapsulation.
//! * The ICRC catches every single-bit error outside the masked fields and ignores exactly
//!   the masked ones.
//! * Well-formed frames and pcap files (every link type this crate reads) give back exactly
//!   the packets that went in.
//! * No input — random bytes, or valid packets, IP datagrams, link-layer frames and pcap files
//!   with random truncations, bit flips, byte writes, insertions and deletions — makes a
//!   parser, accessor or formatter panic, and whatever parses re-emits to the same
//!   representation.

mod parse_checks;

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, TestRunner};
use srdma_wire::frame::{self, IcrcStatus};
use srdma_wire::icrc::{self, ICRC_LEN};
use srdma_wire::ip::IPV4_DF;
use srdma_wire::pcap;
use srdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Encap, Error, FethRepr, Headers,
    IpRepr, Ipv4Repr, Ipv6Repr, Opcode, Packet, PacketRepr, PayloadRule, Psn, Qpn, ROCEV2_PORT,
    RethRepr, Syndrome,
};

/// Every link type `pcap.rs` names (and `frame::ip_payload` unwraps).
use parse_checks::LINKTYPES;

const MASK_24: u32 = 0x00FF_FFFF;

// ------------------------------------------------------------------------------------------
// Strategies
// ------------------------------------------------------------------------------------------

/// A generated packet: a repr whose payload lives in `payload` (a repr borrows its payload,
/// a strategy value must own it).
#[derive(Debug, Clone)]
struct Owned {
    /// Every field but the payload (`repr.payload` is empty).
    repr: PacketRepr<'static>,
    payload: Vec<u8>,
}

impl Owned {
    fn repr(&self) -> PacketRepr<'_> {
        PacketRepr {
            payload: &self.payload,
            ..self.repr
        }
    }
}

/// A 24-bit value, with the two ends of the range more often than uniform sampling gives.
fn u24() -> impl Strategy<Value = u32> {
    prop_oneof![1 => Just(0), 1 => Just(MASK_24), 8 => 0..=MASK_24]
}

/// An AETH syndrome from any byte (so every reserved value occurs), weighted so that ACK,
/// RNR NAK, NAK (defined and reserved codes), reserved type 10 and bit 7 set all occur often.
fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        0x00u8..=0x1F,
        0x20u8..=0x3F,
        0x40u8..=0x5F,
        0x60u8..=0x64,
        0x65u8..=0x7F,
        0x80u8..=0xFF,
    ]
    .prop_map(Syndrome::from_byte)
}

/// `Some(value)` when the opcode carries the header, `None` otherwise.
fn header<T: Clone + std::fmt::Debug + 'static>(
    carried: bool,
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<T>> {
    if carried {
        s.prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    }
}

/// A payload the opcode's rule allows at the wire level (`Packet::check_len`): none, exactly
/// 8 bytes, or 0..=4096 bytes (short lengths weighted up so every pad count is common).
fn payload(rule: PayloadRule) -> BoxedStrategy<Vec<u8>> {
    match rule {
        PayloadRule::None => Just(Vec::new()).boxed(),
        PayloadRule::Exactly8 => vec(any::<u8>(), 8).boxed(),
        PayloadRule::FullMtu | PayloadRule::Last | PayloadRule::UpToMtu => {
            prop_oneof![vec(any::<u8>(), 0..=8), vec(any::<u8>(), 0..=4096)].boxed()
        }
    }
}

fn bth(opcode: Opcode) -> impl Strategy<Value = BthRepr> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        u24(),
        any::<bool>(),
        u24(),
    )
        .prop_map(
            move |(solicited, mig_req, pkey, fecn, becn, qpn, ack_req, psn)| BthRepr {
                opcode,
                solicited,
                mig_req,
                pad_cnt: 0,
                pkey,
                fecn,
                becn,
                dest_qpn: Qpn::new(qpn),
                ack_req,
                psn: Psn::new(psn),
            },
        )
}

/// A valid packet of `opcode`: random BTH, exactly the headers `opcode.headers()` lists with
/// random (in-range) fields, a payload `opcode.payload_rule()` allows, and
/// `bth.pad_cnt == (-len) & 3` as `parse` reports it.
fn packet_of(opcode: Opcode) -> impl Strategy<Value = Owned> {
    let h = opcode.headers();
    (
        (bth(opcode), header(h.contains(Headers::XRCETH), u24())),
        header(
            h.contains(Headers::DETH),
            (any::<u32>(), u24()).prop_map(|(qkey, q)| DethRepr {
                qkey,
                src_qpn: Qpn::new(q),
            }),
        ),
        header(
            h.contains(Headers::FETH),
            (0u8..16, 0u8..4).prop_map(|(placement_type, selectivity)| FethRepr {
                placement_type,
                selectivity,
            }),
        ),
        header(
            h.contains(Headers::RETH),
            (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, dma_len)| RethRepr {
                va,
                rkey,
                dma_len,
            }),
        ),
        header(
            h.contains(Headers::ATOMIC_ETH),
            (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
                |(va, rkey, swap_add, compare)| AtomicEthRepr {
                    va,
                    rkey,
                    swap_add,
                    compare,
                },
            ),
        ),
        header(h.contains(Headers::IMM_DT), any::<u32>()),
        header(h.contains(Headers::IETH), any::<u32>()),
        header(
            h.contains(Headers::AETH),
            (syndrome(), u24()).prop_map(|(syndrome, msn)| AethRepr { syndrome, msn }),
        ),
        header(
            h.contains(Headers::ATOMIC_ACK_ETH),
            any::<u64>().prop_map(|orig| AtomicAckEthRepr { orig }),
        ),
        header(
            h.contains(Headers::SACK_ETH),
            vec((u24(), u24()), 4).prop_map(|b| {
                let mut r = srdma_wire::SackRepr::default();
                for (i, (s, e)) in b.into_iter().enumerate() {
                    r.blocks[i] = (Psn::new(s), Psn::new(e));
                }
                r
            }),
        ),
        payload(opcode.payload_rule()),
    )
        .prop_map(
            |(
                (mut bth, xrceth),
                deth,
                feth,
                reth,
                atomic_eth,
                imm_dt,
                ieth,
                aeth,
                atomic_ack_eth,
                sack,
                payload,
            )| {
                bth.pad_cnt = (payload.len().wrapping_neg() & 3) as u8;
                Owned {
                    repr: PacketRepr {
                        bth,
                        xrceth,
                        deth,
                        feth,
                        reth,
                        atomic_eth,
                        imm_dt,
                        ieth,
                        aeth,
                        atomic_ack_eth,
                        sack,
                        payload: &[],
                    },
                    payload,
                }
            },
        )
}

/// A valid packet of a random opcode.
fn packet() -> impl Strategy<Value = Owned> {
    select(Opcode::ALL).prop_flat_map(packet_of)
}

/// IPv4 flags/fragment field: mostly DF or 0 (unfragmented), sometimes MF, sometimes anything.
fn flags_frag() -> impl Strategy<Value = u16> {
    prop_oneof![Just(IPV4_DF), Just(0), Just(0x2000), any::<u16>()]
}

/// A random IPv4 or IPv6 + UDP encapsulation; the destination port is 4791 half the time.
fn encap() -> impl Strategy<Value = Encap> {
    let v4 = (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        flags_frag(),
    )
        .prop_map(|(src, dst, tos, ttl, ident, flags_frag)| {
            IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::from(src),
                dst: Ipv4Addr::from(dst),
                tos,
                ttl,
                ident,
                flags_frag,
            })
        });
    let v6 = (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        0u32..=0xF_FFFF,
        any::<u8>(),
    )
        .prop_map(|(src, dst, traffic_class, flow_label, hop_limit)| {
            IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(src),
                dst: Ipv6Addr::from(dst),
                traffic_class,
                flow_label,
                hop_limit,
            })
        });
    (
        prop_oneof![v4, v6],
        any::<u16>(),
        prop_oneof![Just(ROCEV2_PORT), any::<u16>()],
    )
        .prop_map(|(ip, src_port, dst_port)| Encap {
            ip,
            src_port,
            dst_port,
        })
}

// ------------------------------------------------------------------------------------------
// Building frames and pcap files
// ------------------------------------------------------------------------------------------

/// The packet emitted with its ICRC for `encap`.
fn wire(repr: &PacketRepr<'_>, encap: &Encap) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit_with_icrc(&mut buf, encap).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// The IP datagram carrying `roce` (with a UDP checksum, as a kernel socket sends it).
fn datagram(encap: &Encap, roce: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; encap.header_len()];
    encap.emit(&mut d, roce.len(), Some(roce)).unwrap();
    d.extend_from_slice(roce);
    d
}

/// `ip` behind the link-layer header of `linktype`. `variant` picks among equivalent
/// encodings (802.1Q / 802.1ad tags on Ethernet, the BSD address-family numbers of IPv6).
fn link_frame(linktype: u32, ip: &[u8], variant: u8) -> Vec<u8> {
    let v6 = ip.first().is_some_and(|b| b >> 4 == 6);
    let ethertype: u16 = if v6 { 0x86DD } else { 0x0800 };
    let mut f = Vec::new();
    match linktype {
        pcap::LINKTYPE_ETHERNET => {
            f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2]);
            for _ in 0..variant % 3 {
                let tpid: u16 = if variant & 4 == 0 { 0x8100 } else { 0x88A8 };
                f.extend_from_slice(&tpid.to_be_bytes());
                f.extend_from_slice(&[0x20, 0x05]);
            }
            f.extend_from_slice(&ethertype.to_be_bytes());
        }
        pcap::LINKTYPE_LINUX_SLL => {
            // packet type, ARPHRD_ETHER, address length 6, address (8), protocol
            f.extend_from_slice(&[0, 0, 0, 1, 0, 6, 0x02, 0, 0, 0, 0, 1, 0, 0]);
            f.extend_from_slice(&ethertype.to_be_bytes());
        }
        pcap::LINKTYPE_LINUX_SLL2 => {
            // protocol, reserved, ifindex, ARPHRD_ETHER, packet type, address length, address
            f.extend_from_slice(&ethertype.to_be_bytes());
            f.extend_from_slice(&[0, 0, 0, 0, 0, 3, 0, 1, 0, 6]);
            f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0, 0]);
        }
        pcap::LINKTYPE_NULL => {
            let family: u32 = if v6 {
                [10, 24, 28, 30][usize::from(variant % 4)]
            } else {
                2
            };
            f.extend_from_slice(&family.to_le_bytes());
        }
        _ => {}
    }
    f.extend_from_slice(ip);
    f
}

/// A classic pcap file of `frames` in either byte order and either time resolution.
/// Record `i` is stamped `1_700_000_000 + i` seconds and `7 * i` micro- or nanoseconds.
fn pcap_file(linktype: u32, frames: &[Vec<u8>], big_endian: bool, nanos: bool) -> Vec<u8> {
    let w32 = |v: u32| {
        if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let w16 = |v: u16| {
        if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mut out = Vec::new();
    out.extend_from_slice(&w32(if nanos { 0xA1B2_3C4D } else { 0xA1B2_C3D4 }));
    out.extend_from_slice(&w16(2));
    out.extend_from_slice(&w16(4));
    out.extend_from_slice(&w32(0));
    out.extend_from_slice(&w32(0));
    out.extend_from_slice(&w32(262_144));
    out.extend_from_slice(&w32(linktype));
    for (i, f) in frames.iter().enumerate() {
        let i = i as u32;
        out.extend_from_slice(&w32(1_700_000_000 + i));
        out.extend_from_slice(&w32(7 * i));
        out.extend_from_slice(&w32(f.len() as u32));
        out.extend_from_slice(&w32(f.len() as u32));
        out.extend_from_slice(f);
    }
    out
}

fn ts_ns(i: usize, nanos: bool) -> u64 {
    let frac = 7 * i as u64;
    (1_700_000_000 + i as u64) * 1_000_000_000 + if nanos { frac } else { frac * 1000 }
}

/// The ICRC status a frame built from `encap` must get: IPv4 fragments cannot be checked.
fn expected_status(encap: &Encap) -> IcrcStatus {
    match encap.ip {
        IpRepr::V4(h) if h.flags_frag & !IPV4_DF != 0 => IcrcStatus::Unverifiable("IPv4 fragment"),
        _ => IcrcStatus::Ok,
    }
}

/// True when `frame::roce_in_ip` must find the packet: UDP to 4791, not a non-first fragment.
fn findable(encap: &Encap) -> bool {
    let first_fragment = match encap.ip {
        IpRepr::V4(h) => h.flags_frag & 0x1FFF == 0,
        IpRepr::V6(_) => true,
    };
    encap.dst_port == ROCEV2_PORT && first_fragment
}

// ------------------------------------------------------------------------------------------
// Mutations
// ------------------------------------------------------------------------------------------

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Mutation {
    /// Cut to a random length (0..=len).
    Truncate(Index),
    /// Flip one bit.
    FlipBit(Index, u8),
    /// Overwrite one byte.
    SetByte(Index, u8),
    /// Insert bytes at a random position.
    Insert(Index, Vec<u8>),
    /// Delete up to `n` bytes from a random position.
    Remove(Index, u8),
    /// Append bytes.
    Append(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => any::<Index>().prop_map(Mutation::Truncate),
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        4 => (any::<Index>(), prop_oneof![Just(0u8), Just(0xFF), Just(0x80), Just(0x7F), any::<u8>()])
            .prop_map(|(i, v)| Mutation::SetByte(i, v)),
        1 => (any::<Index>(), vec(any::<u8>(), 1..8)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        1 => (any::<Index>(), 1u8..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => vec(any::<u8>(), 1..8).prop_map(Mutation::Append),
    ]
}

fn mutate(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len();
    match m {
        Mutation::Truncate(i) => bytes.truncate(i.index(n + 1)),
        Mutation::FlipBit(i, bit) if n > 0 => bytes[i.index(n)] ^= 1 << (bit & 7),
        Mutation::SetByte(i, v) if n > 0 => bytes[i.index(n)] = *v,
        Mutation::Insert(i, v) => {
            let at = i.index(n + 1);
            bytes.splice(at..at, v.iter().copied());
        }
        Mutation::Remove(i, k) if n > 0 => {
            let at = i.index(n);
            bytes.drain(at..(at + usize::from(*k)).min(n));
        }
        Mutation::Append(v) => bytes.extend_from_slice(v),
        _ => {}
    }
}

/// A well-formed input of some shape: a bare RoCEv2 packet, an IP datagram, a link-layer
/// frame of a random link type, or a pcap file of 1..=3 such frames.
fn well_formed() -> impl Strategy<Value = Vec<u8>> {
    (
        vec((packet(), encap()), 1..=3),
        select(&LINKTYPES[..]),
        0u8..4,
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(packets, linktype, shape, variant, big_endian, nanos)| {
            let frames: Vec<Vec<u8>> = packets
                .iter()
                .map(|(o, e)| link_frame(linktype, &datagram(e, &wire(&o.repr(), e)), variant))
                .collect();
            let (o, e) = &packets[0];
            match shape {
                0 => wire(&o.repr(), e),
                1 => datagram(e, &wire(&o.repr(), e)),
                2 => frames[0].clone(),
                _ => pcap_file(linktype, &frames, big_endian, nanos),
            }
        })
}

/// Arbitrary bytes: uniformly random (short and long), or a well-formed input with 1..=4
/// random mutations.
fn arbitrary_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => vec(any::<u8>(), 0..64),
        2 => vec(any::<u8>(), 0..2000),
        6 => (well_formed(), vec(mutation(), 1..=4)).prop_map(|(mut b, ms)| {
            for m in &ms {
                mutate(&mut b, m);
            }
            b
        }),
    ]
}

// ------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------

/// `emit`, `emit_with_icrc` and `parse_bytes` of one valid repr.
fn check_round_trip(repr: &PacketRepr<'_>, encap: &Encap) -> Result<(), TestCaseError> {
    let len = repr.buffer_len();
    let pad = repr.pad_len();
    prop_assert_eq!(usize::from(repr.bth.pad_cnt), pad);
    prop_assert_eq!(len % 4, 0, "a RoCEv2 packet is a whole number of words");

    // emit: exactly buffer_len() bytes, zero pad and ICRC, nothing written beyond.
    let mut buf = vec![0xA5u8; len + 7];
    let n = repr.emit(&mut buf)?;
    prop_assert_eq!(n, len);
    prop_assert!(buf[n - ICRC_LEN - pad..n].iter().all(|&b| b == 0));
    prop_assert!(buf[n..].iter().all(|&b| b == 0xA5));
    prop_assert_eq!(PacketRepr::parse_bytes(&buf[..n]), Ok(*repr));
    let p = Packet::new_checked(&buf[..n])?;
    prop_assert_eq!(p.opcode(), repr.bth.opcode);
    prop_assert_eq!(p.header_len(), repr.bth.opcode.header_len());
    prop_assert_eq!(p.payload(), repr.payload);
    prop_assert_eq!(p.payload_len(), repr.payload.len());
    prop_assert_eq!(p.pad_len(), pad);
    let short = repr.emit(&mut buf[..len - 1]);
    prop_assert!(
        matches!(short, Err(Error::BufferTooSmall { .. })),
        "emit into {} bytes: {:?}",
        len - 1,
        short
    );

    // emit_with_icrc: the same bytes plus an ICRC that verifies.
    let mut w = vec![0x5Au8; len];
    prop_assert_eq!(repr.emit_with_icrc(&mut w, encap)?, len);
    prop_assert_eq!(&w[..len - ICRC_LEN], &buf[..len - ICRC_LEN]);
    prop_assert_eq!(PacketRepr::parse_bytes(&w), Ok(*repr));
    prop_assert_eq!(icrc::verify(encap, &w), Ok(()));
    let p = Packet::new_checked(&w[..])?;
    prop_assert_eq!(p.verify_icrc(encap), Ok(()));
    prop_assert_eq!(p.icrc(), icrc::compute(encap, p.icrc_covered())?);
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Properties
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Emitting a valid repr of a random opcode writes exactly `buffer_len()` bytes (zero pad
    /// and ICRC, nothing beyond), and `parse_bytes` of the output — with or without the ICRC
    /// for a random IPv4/IPv6 encapsulation — gives back the same repr; the ICRC verifies.
    #[test]
    fn emit_then_parse_is_identity(o in packet(), encap in encap()) {
        check_round_trip(&o.repr(), &encap)?;
    }

    /// Flipping any one bit of an emitted packet (BTH to ICRC) outside the masked BTH byte 4
    /// makes ICRC verification fail: CRC-32 detects every single-bit error.
    #[test]
    fn icrc_detects_every_single_bit_flip(
        o in packet(),
        encap in encap(),
        at in any::<Index>(),
        bit in 0u8..8,
    ) {
        let mut w = wire(&o.repr(), &encap);
        let i = at.index(w.len() - 1);
        let i = if i >= 4 { i + 1 } else { i };
        w[i] ^= 1 << bit;
        prop_assert!(
            matches!(icrc::verify(&encap, &w), Err(Error::BadIcrc { .. })),
            "flip of byte {} bit {} not detected", i, bit
        );
    }

    /// The ICRC ignores exactly the fields the IBTA masks: any BTH byte 4 (FECN, BECN,
    /// reserved) and any IPv4 TOS/TTL or IPv6 traffic class/flow label/hop limit still verify,
    /// while a one-bit change of a covered encapsulation field (ports, addresses, IPv4
    /// identification or flags/fragment offset) fails.
    #[test]
    fn icrc_masks_exactly_the_variant_fields(
        o in packet(),
        encap in encap(),
        byte4 in any::<u8>(),
        (a, b) in (any::<u8>(), any::<u8>()),
        flow_label in 0u32..=0xF_FFFF,
        field in any::<Index>(),
        bit in any::<Index>(),
    ) {
        let w = wire(&o.repr(), &encap);

        let mut ecn = w.clone();
        ecn[4] = byte4;
        prop_assert_eq!(icrc::verify(&encap, &ecn), Ok(()));

        let mut masked = encap;
        match &mut masked.ip {
            IpRepr::V4(h) => {
                h.tos = a;
                h.ttl = b;
            }
            IpRepr::V6(h) => {
                h.traffic_class = a;
                h.hop_limit = b;
                h.flow_label = flow_label;
            }
        }
        prop_assert_eq!(icrc::verify(&masked, &w), Ok(()));

        let mut covered = encap;
        let fields = match covered.ip {
            IpRepr::V4(_) => 6,
            IpRepr::V6(_) => 4,
        };
        let f = field.index(fields);
        match (f, &mut covered.ip) {
            (0, _) => covered.src_port ^= 1 << bit.index(16),
            (1, _) => covered.dst_port ^= 1 << bit.index(16),
            (2, IpRepr::V4(h)) => h.src = Ipv4Addr::from(h.src.to_bits() ^ (1 << bit.index(32))),
            (3, IpRepr::V4(h)) => h.dst = Ipv4Addr::from(h.dst.to_bits() ^ (1 << bit.index(32))),
            (4, IpRepr::V4(h)) => h.ident ^= 1 << bit.index(16),
            (5, IpRepr::V4(h)) => h.flags_frag ^= 1 << bit.index(16),
            (2, IpRepr::V6(h)) => h.src = Ipv6Addr::from(h.src.to_bits() ^ (1 << bit.index(128))),
            (3, IpRepr::V6(h)) => h.dst = Ipv6Addr::from(h.dst.to_bits() ^ (1 << bit.index(128))),
            _ => unreachable!(),
        }
        prop_assert!(
            matches!(icrc::verify(&covered, &w), Err(Error::BadIcrc { .. })),
            "change of covered field {} not detected: {:?}", f, covered
        );
    }

    /// Packets wrapped in IP/UDP, behind the link-layer header of every link type, in a pcap
    /// file of either byte order and time resolution, read back as exactly the records, time
    /// stamps and link type written; `frame::roce_in_frame` finds each packet (unless it is
    /// not UDP to 4791 or is a non-first IPv4 fragment) with its encapsulation, byte for byte,
    /// and its ICRC checks out (IPv4 fragments: unverifiable). `pcap::Writer` output reads
    /// back the same way.
    #[test]
    fn pcap_and_frames_give_back_what_went_in(
        packets in vec((packet(), encap()), 1..=3),
        linktype in select(&LINKTYPES[..]),
        variant in any::<u8>(),
        big_endian in any::<bool>(),
        nanos in any::<bool>(),
    ) {
        let wires: Vec<Vec<u8>> = packets.iter().map(|(o, e)| wire(&o.repr(), e)).collect();
        let frames: Vec<Vec<u8>> = packets
            .iter()
            .zip(&wires)
            .map(|((_, e), w)| link_frame(linktype, &datagram(e, w), variant))
            .collect();
        let file = pcap_file(linktype, &frames, big_endian, nanos);
        let reader = pcap::Reader::new(&file)?;
        prop_assert_eq!(reader.linktype(), linktype);
        let records: Vec<pcap::Record<'_>> = reader.collect::<Result<_, _>>()?;
        prop_assert_eq!(records.len(), frames.len());
        for (i, rec) in records.iter().enumerate() {
            let (o, e) = &packets[i];
            prop_assert_eq!(rec.data, &frames[i][..]);
            prop_assert_eq!(rec.ts_ns, ts_ns(i, nanos));
            prop_assert!(!rec.truncated());
            let found = frame::roce_in_frame(linktype, rec.data)?;
            if !findable(e) {
                prop_assert_eq!(found, None);
                continue;
            }
            let f = found.ok_or_else(|| TestCaseError::fail("packet not found"))?;
            prop_assert_eq!(f.roce, &wires[i][..]);
            prop_assert_eq!(f.encap, *e);
            prop_assert!(!f.truncated);
            prop_assert_eq!(f.icrc_status(), expected_status(e));
            prop_assert_eq!(PacketRepr::parse_bytes(f.roce), Ok(o.repr()));
        }

        let mut writer = pcap::Writer::new(Vec::new())?;
        for (i, ((_, e), w)) in packets.iter().zip(&wires).enumerate() {
            writer.write_roce(ts_ns(i, true), e, w)?;
        }
        let file = writer.into_inner();
        let reader = pcap::Reader::new(&file)?;
        prop_assert_eq!(reader.linktype(), pcap::LINKTYPE_RAW);
        let records: Vec<pcap::Record<'_>> = reader.collect::<Result<_, _>>()?;
        prop_assert_eq!(records.len(), packets.len());
        for (i, rec) in records.iter().enumerate() {
            let e = &packets[i].1;
            prop_assert_eq!(rec.data, &datagram(e, &wires[i])[..]);
            prop_assert_eq!(rec.ts_ns, ts_ns(i, true));
            if findable(e) {
                let f = frame::roce_in_frame(pcap::LINKTYPE_RAW, rec.data)?
                    .ok_or_else(|| TestCaseError::fail("packet not found"))?;
                prop_assert_eq!(f.roce, &wires[i][..]);
                prop_assert_eq!(f.icrc_status(), expected_status(e));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// No input panics any parser, accessor or formatter: random bytes, and valid packets,
    /// IP datagrams, frames and pcap files after random truncations, bit flips, byte writes,
    /// insertions and deletions go through `Packet::new_checked` (and then every accessor),
    /// `PacketRepr::parse_bytes` (then Display, `verbose()`, and re-emit, which must parse to
    /// the same repr at the same length), `frame::roce_in_frame` for every link type and
    /// `icrc_status`, `pcap::Reader` over all records, `IpRepr::parse` and `UdpRepr::parse`.
    /// Accessors must agree (header + payload + pad + ICRC = length, the headers present are
    /// the opcode's) and `new_checked` and `parse_bytes` must accept the same inputs.
    #[test]
    fn no_input_panics_and_parses_are_consistent(data in arbitrary_input()) {
        parse_checks::any_input(&data);
    }
}

/// Every opcode of `Opcode::ALL` (not just those a random choice happens to pick) gets 32
/// generated packets through the round trip of `emit_then_parse_is_identity`, and the
/// generator really produces that opcode with exactly its headers.
#[test]
fn every_opcode_round_trips() {
    for &op in Opcode::ALL {
        let mut runner = TestRunner::new(Config {
            cases: 32,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&(packet_of(op), encap()), |(o, e)| {
                let repr = o.repr();
                prop_assert_eq!(repr.bth.opcode, op);
                prop_assert_eq!(repr.check(), Ok(()));
                check_round_trip(&repr, &e)
            })
            .unwrap_or_else(|e| panic!("{op}: {e}"));
    }
}
