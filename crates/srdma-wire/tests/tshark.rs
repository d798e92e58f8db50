//! Wireshark agrees with srdma: a pcap of packets emitted by `PacketRepr::emit_with_icrc` and
//! written by `pcap::Writer` decodes in tshark's InfiniBand (RRoCE) dissector without a
//! malformed packet or an expert item, and every field tshark shows equals the `Repr`.
//!
//! The capture holds every opcode of `Opcode::ALL` once, then every AETH syndrome class and
//! NAK code, then every pad count over IPv4 and IPv6; each packet differs from its neighbours
//! in every BTH field (PSNs near the 24-bit wrap, QPNs, P_Keys, SE/M/AckReq/FECN/BECN).
//!
//! What tshark 4.0 cannot show, and what is checked instead (see [`not_decoded`]):
//! - FLUSH (0x1C), ATOMIC WRITE (0x1D) and CNP (0x81) are "Unknown" opcodes: tshark prints
//!   the BTH and then everything after it as one "Unknown/Vendor Specific Data" blob (ICRC
//!   included), which must equal the FETH/RETH/payload/ICRC laid out by hand here.
//! - FECN and BECN are not named: the BTH byte holding them is shown as `infiniband.reserved`.
//! - PadCnt is shown but not applied: the payload tshark hands on includes the pad bytes.
//! - The ICRC is shown (the four wire bytes read big-endian) but not verified.
//!
//! tshark's payload heuristics (RPC-over-RDMA, EoIB, SMB Direct, ...) would reinterpret the
//! test payloads; 4.0's RPC-over-RDMA and EoIB heuristics even throw "Malformed Packet" on
//! short SEND payloads. The strict checks run with them disabled; a run with tshark's
//! defaults checks that any malformed packet is blamed on one of them, never on InfiniBand.
//!
//! Needs `tshark` on the PATH; set `SRDMA_SKIP_TSHARK=1` to skip when it is not installed.

use std::collections::BTreeMap;
use std::fmt;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use srdma_wire::ip::IPV4_DF;
use srdma_wire::sport::udp_sport;
use srdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Encap, FethRepr, Headers, IpRepr,
    NakCode, Opcode, PacketRepr, PayloadRule, Psn, Qpn, ROCEV2_PORT, RethRepr, Syndrome, pcap,
};

// ---------------------------------------------------------------------------------------------
// The packets.
// ---------------------------------------------------------------------------------------------

/// Payload bytes: every packet's payload is a prefix of this.
static PAYLOAD: [u8; 256] = {
    let mut a = [0u8; 256];
    let mut i = 0;
    while i < a.len() {
        a[i] = (i as u8).wrapping_mul(151).wrapping_add(0xA7);
        i += 1;
    }
    a
};

const PSNS: [u32; 11] = [
    0xFF_FFFF, 0, 0xFF_FFFE, 1, 0x80_0000, 0x7F_FFFF, 0xAB_CDEF, 0x12_3456, 0xFF_FFFD, 0x00_FF00,
    0x5A_5A5A,
];
/// Destination QPNs. QP1 is left out: tshark dissects UD packets to it as MADs.
const QPNS: [u32; 8] = [
    0x11, 0xFF_FFFE, 0x12_3456, 0x80_0001, 0xAB_CDEF, 0x00_0002, 0x7F_FFFF, 0xC0_FFEE,
];
const PKEYS: [u16; 7] = [0xFFFF, 0x8001, 0x7FFF, 0x1234, 0xABCD, 0xFFFE, 0x0001];
const ONLY_LENS: [usize; 10] = [0, 1, 2, 3, 4, 5, 6, 7, 13, 255];
const LAST_LENS: [usize; 8] = [1, 2, 3, 4, 5, 6, 7, 254];

/// One packet of the capture.
struct Case {
    repr: PacketRepr<'static>,
    encap: Encap,
}

/// A packet of opcode `op` whose every field derives from `n` (its index in the capture).
fn case(op: Opcode, n: usize, v6: bool) -> Case {
    let n32 = n as u32;
    let n64 = n as u64;
    let bit = |b: u32| (n32 >> b) & 1 == 1;
    let bth = BthRepr {
        opcode: op,
        solicited: bit(0),
        mig_req: bit(1),
        pad_cnt: 0,
        pkey: PKEYS[n % PKEYS.len()],
        ack_req: bit(2),
        fecn: bit(3),
        becn: bit(4),
        dest_qpn: Qpn::new(QPNS[n % QPNS.len()]),
        psn: Psn::new(PSNS[n % PSNS.len()]),
    };
    let len = match op.payload_rule() {
        PayloadRule::None => 0,
        PayloadRule::FullMtu => 256,
        PayloadRule::Last => LAST_LENS[n % LAST_LENS.len()],
        PayloadRule::UpToMtu => ONLY_LENS[n % ONLY_LENS.len()],
        PayloadRule::Exactly8 => 8,
    };
    let mut repr = PacketRepr::new(bth, &PAYLOAD[..len]);
    let h = op.headers();
    if h.contains(Headers::DETH) {
        repr.deth = Some(DethRepr {
            qkey: 0x8765_4321 ^ (n32 << 8),
            src_qpn: Qpn::new(0xFE_DCBA - n32 * 0x1111),
        });
    }
    if h.contains(Headers::XRCETH) {
        repr.xrceth = Some(0xAB_CDEF ^ n32);
    }
    if h.contains(Headers::FETH) {
        repr.feth = Some(FethRepr {
            placement_type: 1 + (n32 % 2) as u8,
            selectivity: (n32 / 2 % 2) as u8,
        });
    }
    if h.contains(Headers::RETH) {
        repr.reth = Some(RethRepr {
            va: 0x0123_4567_89AB_CDEF ^ n64.wrapping_mul(0x1111_0000_0000_1001),
            rkey: 0xDEAD_0000 | n32,
            dma_len: if n % 5 == 0 {
                0xFFFF_FFFF
            } else {
                0x0001_0000 + n32 * 7
            },
        });
    }
    if h.contains(Headers::ATOMIC_ETH) {
        repr.atomic_eth = Some(AtomicEthRepr {
            va: 0xFFFF_8000_0000_0000 | (n64 << 3),
            rkey: 0x8000_0001 + n32,
            swap_add: 0xFEDC_BA98_7654_3210 + n64,
            compare: 0x8000_0000_0000_0001 ^ (n64 << 32),
        });
    }
    if h.contains(Headers::IMM_DT) {
        repr.imm_dt = Some(0x89AB_CDEF ^ n32);
    }
    if h.contains(Headers::IETH) {
        repr.ieth = Some(0x0BAD_F00D + n32);
    }
    if h.contains(Headers::AETH) {
        repr.aeth = Some(AethRepr {
            syndrome: Syndrome::Ack {
                credit_code: (n32 % 32) as u8,
            },
            msn: 0xFF_FFFF - n32 * 0x10101,
        });
    }
    if h.contains(Headers::ATOMIC_ACK_ETH) {
        repr.atomic_ack_eth = Some(AtomicAckEthRepr {
            orig: u64::MAX - n64,
        });
    }
    if h.contains(Headers::SACK_ETH) {
        let mut sack = srdma_wire::SackRepr::default();
        sack.blocks[0] = (Psn::new(0x10 + n32), Psn::new(0x20 + n32));
        sack.blocks[1] = (Psn::new(0xFF_FFF0), Psn::new(3));
        repr.sack = Some(sack);
    }
    let (src, dst) = if v6 {
        (
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, n as u16, 0, 0, 0, 1)),
            IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0x1234, 0, n as u16, 2)),
        )
    } else {
        (
            IpAddr::V4(Ipv4Addr::new(10, n as u8, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 168, 7, n as u8)),
        )
    };
    let flow_label = if n % 3 == 0 { 0xA_BCDE + n32 } else { 0 };
    let encap = Encap {
        ip: IpRepr::between(src, dst).unwrap(),
        src_port: udp_sport(flow_label, 0x11 + n32, bth.dest_qpn.value()),
        dst_port: ROCEV2_PORT,
    };
    Case { repr, encap }
}

/// Every opcode once, then every AETH syndrome class and NAK code on the four opcodes that
/// carry an AETH, then every pad count over IPv4 and IPv6.
fn cases() -> Vec<Case> {
    let mut out: Vec<Case> = Vec::new();
    for &op in Opcode::ALL {
        out.push(case(op, out.len(), out.len() % 2 == 1));
    }
    let syndromes = [
        Syndrome::ACK,
        Syndrome::Ack { credit_code: 0 },
        Syndrome::Ack { credit_code: 13 },
        Syndrome::RnrNak { timer_code: 0 },
        Syndrome::RnrNak { timer_code: 12 },
        Syndrome::RnrNak { timer_code: 31 },
        Syndrome::Nak(NakCode::PsnSequenceError),
        Syndrome::Nak(NakCode::InvalidRequest),
        Syndrome::Nak(NakCode::RemoteAccessError),
        Syndrome::Nak(NakCode::RemoteOperationalError),
        Syndrome::Nak(NakCode::InvalidRdRequest),
        Syndrome::Nak(NakCode::Reserved(5)),
        Syndrome::Nak(NakCode::Reserved(31)),
        // Type 10 (reserved), and bit 7 set on an ACK and a NAK.
        Syndrome::Reserved(0x4A),
        Syndrome::Reserved(0x9F),
        Syndrome::Reserved(0xE3),
    ];
    let aeth_opcodes = [
        Opcode::RcAcknowledge,
        Opcode::RcAtomicAcknowledge,
        Opcode::RcRdmaReadResponseOnly,
        Opcode::RcRdmaReadResponseFirst,
        Opcode::RcRdmaReadResponseLast,
    ];
    for (i, syndrome) in syndromes.into_iter().enumerate() {
        let mut c = case(aeth_opcodes[i % 5], out.len(), out.len() % 2 == 1);
        c.repr.aeth.as_mut().unwrap().syndrome = syndrome;
        out.push(c);
    }
    for (op, max) in [
        (Opcode::RcSendOnly, 8),
        (Opcode::UdSendOnlyWithImmediate, 3),
    ] {
        for len in 0..=max {
            for v6 in [false, true] {
                let mut c = case(op, out.len(), v6);
                c.repr.payload = &PAYLOAD[..len];
                out.push(c);
            }
        }
    }
    // `emit` derives PadCnt from the payload length; `parse` reads it back.
    for c in &mut out {
        c.repr.bth.pad_cnt = c.repr.pad_len() as u8;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// What tshark should print.
// ---------------------------------------------------------------------------------------------

/// Opcodes tshark 4.0 does not know: it shows their BTH, then the rest of the packet as
/// `infiniband.vendor` bytes. XRC opcodes (0xA0..) are among them, and srdma's own
/// `SRDMA_SACK` (0xE0, manufacturer specific).
fn not_decoded(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::RcFlush | Opcode::RcAtomicWrite | Opcode::Cnp | Opcode::SrdmaSack
    ) || op.transport() == srdma_wire::Transport::Xrc
}

/// The fields asked of tshark, in column order. Every one not expected is expected absent.
const FIELDS: &[&str] = &[
    "frame.number",
    "ip.src",
    "ip.dst",
    "ip.len",
    "ip.ttl",
    "ip.id",
    "ip.flags.df",
    "ip.checksum.status",
    "ipv6.src",
    "ipv6.dst",
    "ipv6.plen",
    "ipv6.hlim",
    "udp.srcport",
    "udp.dstport",
    "udp.length",
    "udp.checksum.status",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.m",
    "infiniband.bth.padcnt",
    "infiniband.bth.tver",
    "infiniband.bth.p_key",
    "infiniband.reserved",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.reserved7",
    "infiniband.bth.psn",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.syndrome.reserved",
    "infiniband.aeth.syndrome.opcode",
    "infiniband.aeth.syndrome.credit_count",
    "infiniband.aeth.syndrome.timer",
    "infiniband.aeth.syndrome.reserved_value",
    "infiniband.aeth.syndrome.error_code",
    "infiniband.aeth.msn",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.invariant.crc",
    "infiniband.vendor",
    "infiniband.payload",
    "data.data",
    "data.len",
    "_ws.malformed",
    "_ws.expert",
    "_ws.expert.severity",
];

/// A value as tshark prints it, whatever its base.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    /// An integer: decimal, or hex with `0x`.
    Num(u64),
    /// A boolean: `1`/`0` (tshark 4.0) or `True`/`False`.
    Flag(bool),
    /// Bytes as hex, with or without `:` separators.
    Bytes(Vec<u8>),
    /// An IPv4 or IPv6 address.
    Addr(IpAddr),
}

impl Val {
    /// Reads `s`, as printed by tshark, as a value of the same kind as `self`.
    fn read_like(&self, s: &str) -> Option<Val> {
        Some(match self {
            Val::Num(_) => Val::Num(match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok()?,
                None => s.parse().ok()?,
            }),
            Val::Flag(_) => Val::Flag(match s {
                "1" | "True" | "true" => true,
                "0" | "False" | "false" => false,
                _ => return None,
            }),
            Val::Bytes(_) => {
                let h: String = s.chars().filter(|&c| c != ':').collect();
                if h.len() % 2 != 0 {
                    return None;
                }
                let bytes = (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()?;
                Val::Bytes(bytes)
            }
            Val::Addr(_) => Val::Addr(s.parse().ok()?),
        })
    }
}

/// What one field must look like.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    /// Present, each occurrence equal to this (tshark 4.0 adds ImmDt and IETH twice).
    Each(Val),
    /// Exactly these occurrences, in order.
    Seq(Vec<Val>),
    /// Bytes whose occurrences are prefixes of these, the last one all of them.
    Prefixes(Vec<u8>),
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Num(v) => write!(f, "{v} ({v:#x})"),
            Val::Flag(v) => write!(f, "{v}"),
            Val::Bytes(v) => v.iter().try_for_each(|b| write!(f, "{b:02x}")),
            Val::Addr(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Each(v) => write!(f, "{v}"),
            Expect::Seq(vs) => {
                let vs: Vec<String> = vs.iter().map(Val::to_string).collect();
                write!(f, "[{}]", vs.join(", "))
            }
            Expect::Prefixes(v) => write!(f, "{} (and prefixes of it)", Val::Bytes(v.clone())),
        }
    }
}

fn num(v: impl Into<u64>) -> Expect {
    Expect::Each(Val::Num(v.into()))
}

fn flag(v: bool) -> Expect {
    Expect::Each(Val::Flag(v))
}

fn bytes(v: &[u8]) -> Expect {
    Expect::Each(Val::Bytes(v.to_vec()))
}

/// The payload followed by its pad bytes (zero), as tshark 4.0 delimits the payload.
fn payload_and_pad(repr: &PacketRepr<'_>) -> Vec<u8> {
    let mut v = repr.payload.to_vec();
    v.resize(repr.payload.len() + repr.pad_len(), 0);
    v
}

/// Everything after the BTH of a packet tshark does not decode, laid out by hand from the
/// IBTA header formats (not with srdma's emitters): FETH, RETH, payload, pad, ICRC.
fn undecoded_tail(repr: &PacketRepr<'_>, icrc: [u8; 4]) -> Vec<u8> {
    // Everything after the BTH as emitted (extension headers, payload, pad), then the ICRC.
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).unwrap();
    let mut v = buf[srdma_wire::BTH_LEN..n - 4].to_vec();
    v.extend_from_slice(&icrc);
    v
}

/// Every field tshark must show for `case`, emitted as `wire`, at 1-based `frame`.
fn expected(frame: usize, case: &Case, wire: &[u8]) -> BTreeMap<&'static str, Expect> {
    let mut e = BTreeMap::new();
    let r = &case.repr;
    let udp_len = 8 + wire.len();
    e.insert("frame.number", num(frame as u64));
    match case.encap.ip {
        IpRepr::V4(h) => {
            e.insert("ip.src", Expect::Each(Val::Addr(h.src.into())));
            e.insert("ip.dst", Expect::Each(Val::Addr(h.dst.into())));
            e.insert("ip.len", num((20 + udp_len) as u64));
            e.insert("ip.ttl", num(h.ttl));
            e.insert("ip.id", num(h.ident));
            e.insert("ip.flags.df", flag(h.flags_frag & IPV4_DF != 0));
            e.insert("ip.checksum.status", num(1u8)); // Good
        }
        IpRepr::V6(h) => {
            e.insert("ipv6.src", Expect::Each(Val::Addr(h.src.into())));
            e.insert("ipv6.dst", Expect::Each(Val::Addr(h.dst.into())));
            e.insert("ipv6.plen", num(udp_len as u64));
            e.insert("ipv6.hlim", num(h.hop_limit));
        }
    }
    e.insert("udp.srcport", num(case.encap.src_port));
    e.insert("udp.dstport", num(case.encap.dst_port));
    e.insert("udp.length", num(udp_len as u64));
    e.insert("udp.checksum.status", num(1u8)); // Good

    let b = &r.bth;
    e.insert("infiniband.bth.opcode", num(b.opcode.value()));
    e.insert("infiniband.bth.se", flag(b.solicited));
    e.insert("infiniband.bth.m", flag(b.mig_req));
    e.insert("infiniband.bth.padcnt", num(b.pad_cnt));
    e.insert("infiniband.bth.tver", num(0u8));
    e.insert("infiniband.bth.p_key", num(b.pkey));
    // BTH byte 4 (FECN | BECN | 6 reserved bits), then the reserved byte of a DETH.
    let mut reserved = vec![Val::Bytes(vec![
        (u8::from(b.fecn) << 7) | (u8::from(b.becn) << 6),
    ])];
    if r.deth.is_some() {
        reserved.push(Val::Bytes(vec![0]));
    }
    e.insert("infiniband.reserved", Expect::Seq(reserved));
    e.insert("infiniband.bth.destqp", num(b.dest_qpn.value()));
    e.insert("infiniband.bth.a", flag(b.ack_req));
    e.insert("infiniband.bth.reserved7", num(0u8));
    e.insert("infiniband.bth.psn", num(b.psn.value()));

    let icrc: [u8; 4] = wire[wire.len() - 4..].try_into().unwrap();
    if not_decoded(b.opcode) {
        e.insert(
            "infiniband.vendor",
            Expect::Prefixes(undecoded_tail(r, icrc)),
        );
        return e;
    }

    if let Some(n) = r.xrceth {
        e.insert("infiniband.xrceth.xrcsrq", num(n));
    }
    if let Some(h) = r.deth {
        e.insert("infiniband.deth.q_key", num(h.qkey));
        e.insert("infiniband.deth.srcqp", num(h.src_qpn.value()));
    }
    if let Some(h) = r.reth {
        e.insert("infiniband.reth.va", num(h.va));
        e.insert("infiniband.reth.r_key", num(h.rkey));
        e.insert("infiniband.reth.dmalen", num(h.dma_len));
    }
    if let Some(h) = r.atomic_eth {
        // tshark shows the AtomicETH address and key with the RETH's fields.
        e.insert("infiniband.reth.va", num(h.va));
        e.insert("infiniband.reth.r_key", num(h.rkey));
        e.insert("infiniband.atomiceth.swapdt", num(h.swap_add));
        e.insert("infiniband.atomiceth.cmpdt", num(h.compare));
    }
    if let Some(h) = r.aeth {
        let s = h.syndrome.to_byte();
        e.insert("infiniband.aeth.syndrome", num(s));
        e.insert("infiniband.aeth.syndrome.reserved", num(s >> 7));
        e.insert("infiniband.aeth.syndrome.opcode", num((s >> 5) & 3));
        let code_field = match (s >> 5) & 3 {
            0 => "infiniband.aeth.syndrome.credit_count",
            1 => "infiniband.aeth.syndrome.timer",
            2 => "infiniband.aeth.syndrome.reserved_value",
            _ => "infiniband.aeth.syndrome.error_code",
        };
        e.insert(code_field, num(s & 0x1F));
        e.insert("infiniband.aeth.msn", num(h.msn));
    }
    if let Some(h) = r.atomic_ack_eth {
        e.insert("infiniband.atomicacketh.origremdt", num(h.orig));
    }
    if let Some(v) = r.imm_dt {
        e.insert("infiniband.immdt", bytes(&v.to_be_bytes()));
    }
    if let Some(v) = r.ieth {
        e.insert("infiniband.ieth", bytes(&v.to_be_bytes()));
    }
    e.insert("infiniband.invariant.crc", num(u32::from_be_bytes(icrc)));
    if !r.payload.is_empty() {
        let data = payload_and_pad(r);
        e.insert("data.len", num(data.len() as u64));
        e.insert("data.data", bytes(&data));
    }
    e
}

/// Compares tshark's column `got` for `field` with `want`; `None` when they agree.
fn mismatch(field: &str, want: Option<&Expect>, got: &str) -> Option<String> {
    let occurrences: Vec<&str> = if got.is_empty() {
        Vec::new()
    } else {
        got.split(',').collect()
    };
    let ok = match want {
        None => occurrences.is_empty(),
        Some(Expect::Each(v)) => {
            !occurrences.is_empty()
                && occurrences
                    .iter()
                    .all(|s| v.read_like(s).as_ref() == Some(v))
        }
        Some(Expect::Seq(vs)) => {
            occurrences.len() == vs.len()
                && occurrences
                    .iter()
                    .zip(vs)
                    .all(|(s, v)| v.read_like(s).as_ref() == Some(v))
        }
        Some(Expect::Prefixes(all)) => {
            let want = Val::Bytes(all.clone());
            let read: Option<Vec<Val>> = occurrences.iter().map(|s| want.read_like(s)).collect();
            match read.as_deref() {
                Some([prefixes @ .., Val::Bytes(last)]) => {
                    last == all
                        && prefixes
                            .iter()
                            .all(|p| matches!(p, Val::Bytes(p) if all.starts_with(p)))
                }
                _ => false,
            }
        }
    };
    if ok {
        None
    } else {
        let want = want.map_or_else(|| "nothing".to_owned(), Expect::to_string);
        Some(format!(
            "{field}: tshark printed {got:?}, the repr says {want}"
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Running tshark.
// ---------------------------------------------------------------------------------------------

/// A file removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(what: &str) -> TempFile {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        TempFile(std::env::temp_dir().join(format!(
            "srdma-wire-tshark-{}-{nanos}-{what}",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Runs tshark with `args` and a configuration directory of its own (so a user's profile,
/// with its disabled protocols or "decode as" rules, changes nothing); returns its stdout.
fn tshark(config_dir: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .env("WIRESHARK_CONFIG_DIR", config_dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running tshark {args:?}: {e}"));
    assert!(
        out.status.success(),
        "tshark {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

/// tshark's version line, or `None` when tshark is not installed and `SRDMA_SKIP_TSHARK=1`.
fn tshark_version() -> Option<String> {
    match Command::new("tshark").arg("--version").output() {
        Ok(out) if out.status.success() => Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("tshark")
                .trim_end_matches('.')
                .to_owned(),
        ),
        Ok(out) => panic!(
            "`tshark --version` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if std::env::var("SRDMA_SKIP_TSHARK").is_ok_and(|v| v == "1") {
                eprintln!("tshark not found: skipped (SRDMA_SKIP_TSHARK=1)");
                None
            } else {
                panic!(
                    "tshark not found: apt-get install tshark, or set SRDMA_SKIP_TSHARK=1 to skip"
                );
            }
        }
        Err(e) => panic!("running tshark: {e}"),
    }
}

#[test]
fn tshark_decodes_every_opcode_as_the_repr_says() {
    let Some(version) = tshark_version() else {
        return;
    };

    // Emit every packet and write the capture.
    let cases = cases();
    let mut seen: Vec<Opcode> = cases.iter().map(|c| c.repr.bth.opcode).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, Opcode::ALL, "the capture must hold every opcode");
    for v6 in [false, true] {
        for pad in 0..4 {
            assert!(
                cases
                    .iter()
                    .any(|c| c.repr.pad_len() == pad && matches!(c.encap.ip, IpRepr::V6(_)) == v6),
                "no packet with pad {pad} over IPv{}",
                if v6 { 6 } else { 4 }
            );
        }
    }
    let mut wires = Vec::new();
    let file = TempFile::new("capture.pcap");
    let config_dir = TempFile::new("config");
    {
        let f = std::fs::File::create(&file.0).unwrap();
        let mut w = pcap::Writer::new(std::io::BufWriter::new(f)).unwrap();
        for (i, c) in cases.iter().enumerate() {
            let mut wire = vec![0u8; c.repr.buffer_len()];
            let n = c.repr.emit_with_icrc(&mut wire, &c.encap).unwrap();
            assert_eq!(n, wire.len());
            assert_eq!(PacketRepr::parse_bytes(&wire).unwrap(), c.repr);
            let ts = 1_700_000_000_000_000_000 + i as u64 * 1000;
            w.write_roce(ts, &c.encap, &wire).unwrap();
            wires.push(wire);
        }
        w.flush().unwrap();
    }
    let path = file.0.to_str().expect("temporary path is UTF-8");
    let dir = &config_dir.0;

    // With tshark's defaults, a malformed packet may only be the fault of a dissector that a
    // payload heuristic called after InfiniBand: the last protocol of the frame is that one.
    let malformed = tshark(
        dir,
        &[
            "-n",
            "-r",
            path,
            "-Y",
            "_ws.malformed",
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "frame.protocols",
        ],
    );
    let mut blamed = BTreeMap::<&str, Vec<&str>>::new();
    for line in malformed.lines() {
        let (frame, protocols) = line.split_once('\t').unwrap_or((line, ""));
        let last = protocols.rsplit(':').next().unwrap_or("");
        assert!(
            protocols.contains("infiniband:")
                && !["raw", "ip", "ipv6", "udp", "infiniband"].contains(&last),
            "with default settings tshark finds frame {frame} malformed in {last:?} \
             (protocols {protocols:?})"
        );
        blamed.entry(last).or_default().push(frame);
    }
    if !blamed.is_empty() {
        eprintln!(
            "{version}: with default settings these payload heuristics throw \
             \"Malformed Packet\" on frames: {blamed:?}; they are disabled below"
        );
    }

    // Disable every heuristic on InfiniBand payloads: the payload reaches tshark's "data".
    let heuristics = tshark(dir, &["-G", "heuristic-decodes"]);
    let mut args: Vec<&str> = vec!["-n", "-r", path];
    for line in heuristics.lines() {
        let mut cols = line.split('\t');
        if let (Some("infiniband.payload"), Some(proto)) = (cols.next(), cols.next()) {
            args.extend(["--disable-protocol", proto]);
        }
    }
    args.extend([
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
    ]);

    // Pass 1: the full dissection has no malformed packet and no expert item at all.
    let mut verbose_args = args.clone();
    verbose_args.push("-V");
    let verbose = tshark(dir, &verbose_args);
    let bad: Vec<&str> = verbose
        .lines()
        .filter(|l| l.contains("Malformed") || l.contains("Expert Info"))
        .collect();
    assert!(bad.is_empty(), "tshark -V reports: {bad:#?}");
    let ib_frames = verbose.lines().filter(|l| *l == "InfiniBand").count();
    assert_eq!(
        ib_frames,
        cases.len(),
        "frames tshark decodes as InfiniBand"
    );

    // Pass 2: every field, one line per packet.
    let mut field_args = args.clone();
    field_args.extend(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"]);
    for f in FIELDS {
        field_args.extend(["-e", f]);
    }
    let fields = tshark(dir, &field_args);
    let lines: Vec<&str> = fields.lines().collect();
    assert_eq!(lines.len(), cases.len(), "one line per packet:\n{fields}");
    let mut failures = Vec::new();
    for (i, ((line, case), wire)) in lines.iter().zip(&cases).zip(&wires).enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(
            cols.len(),
            FIELDS.len(),
            "columns of frame {}: {line}",
            i + 1
        );
        let want = expected(i + 1, case, wire);
        for (field, got) in FIELDS.iter().zip(&cols) {
            if let Some(m) = mismatch(field, want.get(field), got) {
                failures.push(format!("frame {} ({}): {m}", i + 1, case.repr));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{version} disagrees with the repr in {} fields:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "{version} decodes all {} packets as their reprs say ({} fields each); shown as \
         undecoded bytes: {:?}",
        cases.len(),
        FIELDS.len(),
        Opcode::ALL
            .iter()
            .filter(|o| not_decoded(**o))
            .collect::<Vec<_>>()
    );
}
