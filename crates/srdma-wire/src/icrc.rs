//! The invariant CRC of a RoCEv2 packet (IBTA vol. 1 annex A17.3.3; rxe `rxe_icrc.c`).
//!
//! ```text
//! crc  = CRC-32 (IEEE 802.3, reflected, init !0, final !0) over
//!        8 x 0xFF                  stands in for the masked IB LRH
//!        IP header                 IPv4: TOS, TTL, checksum = all ones
//!                                  IPv6: traffic class, flow label, hop limit = all ones
//!        UDP header                checksum = 0xFFFF
//!        BTH                       byte 4 (FECN, BECN, resv6) = 0xFF
//!        extension headers, payload, pad
//! wire = crc, least significant byte first
//! ```
//! The IPv4 identification and flags are covered, so a sender must know the exact IP header
//! its kernel emits (an unconnected socket with DF sends ID 0). A receiver on a UDP socket
//! never sees the identification; [`verify_ipv4_unknown_ident`] checks the ICRC anyway by
//! solving for the one identification that makes it match.

use crate::bth::BTH_LEN;
use crate::ip::{Encap, IPV4_LEN, IPV6_LEN, UDP_LEN};
use crate::{Error, Result};

/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;

/// Longest masked pseudo header: LRH stand-in + IPv6 + UDP + BTH.
const MAX_PSEUDO: usize = 8 + IPV6_LEN + UDP_LEN + BTH_LEN;

/// Computes the ICRC from the raw IP header (20 bytes for IPv4 without options, 40 for IPv6),
/// the raw UDP header, and the RoCEv2 packet up to but excluding the ICRC.
pub fn compute_raw(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    let iplen = ip_header.len();
    if iplen != IPV4_LEN && iplen != IPV6_LEN {
        return Err(Error::MalformedIp(
            "IP (ICRC needs a 20-byte IPv4 or 40-byte IPv6 header)",
        ));
    }
    crate::error::need("UDP header", udp_header, UDP_LEN)?;
    crate::error::need("BTH", roce, BTH_LEN)?;
    let mut pseudo = [0u8; MAX_PSEUDO];
    let n = 8 + iplen + UDP_LEN + BTH_LEN;
    pseudo[..8].fill(0xFF);
    pseudo[8..8 + iplen].copy_from_slice(ip_header);
    pseudo[8 + iplen..8 + iplen + UDP_LEN].copy_from_slice(&udp_header[..UDP_LEN]);
    pseudo[8 + iplen + UDP_LEN..n].copy_from_slice(&roce[..BTH_LEN]);
    let ip = &mut pseudo[8..8 + iplen];
    if iplen == IPV4_LEN {
        ip[1] = 0xFF; // TOS
        ip[8] = 0xFF; // TTL
        ip[10] = 0xFF; // header checksum
        ip[11] = 0xFF;
    } else {
        ip[0] |= 0x0F; // traffic class, high nibble
        ip[1..4].fill(0xFF); // traffic class low nibble + flow label
        ip[7] = 0xFF; // hop limit
    }
    let udp = 8 + iplen;
    pseudo[udp + 6] = 0xFF;
    pseudo[udp + 7] = 0xFF;
    pseudo[udp + UDP_LEN + 4] = 0xFF; // BTH FECN/BECN/resv6
    let mut h = crc32fast::Hasher::new();
    h.update(&pseudo[..n]);
    h.update(&roce[BTH_LEN..]);
    Ok(h.finalize())
}

/// CRC-32 of the 8 bytes of 0xFF that stand in for the LRH: the state every ICRC starts from
/// (rxe folds the same bytes into its seed 0xdebb20e3, the raw register value).
const CRC_OF_LRH_PLACEHOLDER: u32 = 0x2144_df1c;

/// Computes the ICRC of `roce` (BTH to pad, without the ICRC) as carried in `encap`.
///
/// The masked pseudo header is built straight from the `Encap` fields: the masked bytes are
/// written as ones and the IPv4 checksum, which the mask hides, is never computed. This is
/// the per-packet path of a sender; [`compute_raw`] is for headers taken off the wire.
pub fn compute(encap: &Encap, roce: &[u8]) -> Result<u32> {
    let mut h = Hasher::new(encap, roce.len(), roce)?;
    h.update(&roce[BTH_LEN..]);
    Ok(h.finish())
}

/// [`compute`] with the pseudo header's CRC state kept in `memo` from one packet to the
/// next (see [`Hasher::with_memo`]): the same ICRC, cheaper for a stream of one QP's packets.
pub fn compute_with_memo(encap: &Encap, roce: &[u8], memo: &mut Memo) -> Result<u32> {
    // One pass from the PSN on: it is contiguous with the rest of the packet.
    let mut h = crc32fast::Hasher::new_with_initial(memo.state_to_psn(encap, roce.len(), roce)?);
    h.update(&roce[PSN_AT..]);
    Ok(h.finalize())
}

/// An ICRC computed piece by piece, for a packet whose bytes are not contiguous (headers in
/// one buffer, payload straight from registered memory): [`Hasher::new`] takes the BTH,
/// [`Hasher::update`] everything after it in order, up to the pad; [`Hasher::finish`] gives
/// what [`compute`] would for the same bytes.
#[derive(Debug, Clone)]
pub struct Hasher {
    h: crc32fast::Hasher,
}

impl Hasher {
    /// Starts the ICRC of a packet of `roce_len` bytes (BTH to pad, without the ICRC) carried
    /// in `encap`; `bth` holds at least its BTH.
    pub fn new(encap: &Encap, roce_len: usize, bth: &[u8]) -> Result<Hasher> {
        let (pseudo, n) = pseudo_header(encap, roce_len, bth)?;
        let mut h = crc32fast::Hasher::new_with_initial(CRC_OF_LRH_PLACEHOLDER);
        h.update(&pseudo[..n]);
        Ok(Hasher { h })
    }

    /// [`Hasher::new`], cheaper for a packet whose pseudo header equals the last one `memo`
    /// saw but for the PSN (the next packet of a stream of one QP): the CRC state up to the
    /// PSN is taken from `memo`, and only the PSN's three bytes are added. Otherwise the
    /// pseudo header is hashed and `memo` remembers it. The same ICRC either way.
    pub fn with_memo(
        encap: &Encap,
        roce_len: usize,
        bth: &[u8],
        memo: &mut Memo,
    ) -> Result<Hasher> {
        let mut h = crc32fast::Hasher::new_with_initial(memo.state_to_psn(encap, roce_len, bth)?);
        h.update(&bth[PSN_AT..BTH_LEN]);
        Ok(Hasher { h })
    }

    /// Adds the next bytes of the packet (after the BTH).
    pub fn update(&mut self, bytes: &[u8]) {
        self.h.update(bytes);
    }

    /// The ICRC.
    pub fn finish(self) -> u32 {
        self.h.finalize()
    }
}

/// The masked pseudo header of a packet of `roce_len` bytes (BTH to pad, without the ICRC)
/// carried in `encap`, after the LRH placeholder: IP header, UDP header and BTH, masked
/// bytes as ones (the IPv4 checksum, which the mask hides, is never computed); and its length.
fn pseudo_header(encap: &Encap, roce_len: usize, bth: &[u8]) -> Result<([u8; PSEUDO_MAX], usize)> {
    crate::error::need("BTH", bth, BTH_LEN)?;
    let udp_len = UDP_LEN + roce_len + ICRC_LEN;
    let udp_len16 = u16::try_from(udp_len).map_err(|_| Error::OutOfRange {
        field: "UDP length",
        value: udp_len as u64,
    })?;
    let mut pseudo = [0xFFu8; PSEUDO_MAX];
    let iplen = match encap.ip {
        crate::IpRepr::V4(h) => {
            let total = u16::try_from(IPV4_LEN + udp_len).map_err(|_| Error::OutOfRange {
                field: "IPv4 total length",
                value: (IPV4_LEN + udp_len) as u64,
            })?;
            let b = &mut pseudo[..IPV4_LEN];
            b[0] = 0x45;
            b[2..4].copy_from_slice(&total.to_be_bytes());
            b[4..6].copy_from_slice(&h.ident.to_be_bytes());
            b[6..8].copy_from_slice(&h.flags_frag.to_be_bytes());
            b[9] = crate::ip::IPPROTO_UDP;
            b[12..16].copy_from_slice(&h.src.octets());
            b[16..20].copy_from_slice(&h.dst.octets());
            IPV4_LEN
        }
        crate::IpRepr::V6(h) => {
            let b = &mut pseudo[..IPV6_LEN];
            b[0] = 0x6F;
            b[4..6].copy_from_slice(&udp_len16.to_be_bytes());
            b[6] = crate::ip::IPPROTO_UDP;
            b[8..24].copy_from_slice(&h.src.octets());
            b[24..40].copy_from_slice(&h.dst.octets());
            IPV6_LEN
        }
    };
    let u = &mut pseudo[iplen..iplen + UDP_LEN];
    u[0..2].copy_from_slice(&encap.src_port.to_be_bytes());
    u[2..4].copy_from_slice(&encap.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len16.to_be_bytes());
    let b = &mut pseudo[iplen + UDP_LEN..iplen + UDP_LEN + BTH_LEN];
    b.copy_from_slice(&bth[..BTH_LEN]);
    b[4] = 0xFF;
    Ok((pseudo, iplen + UDP_LEN + BTH_LEN))
}

/// Where the PSN starts in the BTH (its last three bytes).
const PSN_AT: usize = BTH_LEN - 3;

/// Longest pseudo header after the LRH placeholder: IPv6 + UDP + BTH.
const PSEUDO_MAX: usize = IPV6_LEN + UDP_LEN + BTH_LEN;

/// What a sender or a receiver keeps from one packet to the next to make the next ICRC
/// cheaper: the CRC state after the masked pseudo headers of the last two kinds of packet up to
/// their PSN (the packets of one QP's stream differ there only in the PSN; a ping-pong
/// alternates two kinds, its requests and its ACKs, which one entry would forget each time),
/// see [`Hasher::with_memo`]; and the factor of the last IPv4 length whose Identification was
/// guessed, see [`verify_ipv4_ident_guess`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Memo {
    /// The pseudo headers remembered, the most recently used first: what each was made of
    /// (encapsulation, packet length, BTH up to the PSN with byte 4 masked) and the CRC state
    /// after it up to the PSN.
    seen: [Option<(MemoKey, u32)>; 2],
    ident_len: usize,
    ident_factor: u32,
}

/// What a pseudo header up to the PSN is made of.
type MemoKey = (Encap, usize, [u8; PSN_AT]);

impl Memo {
    /// The CRC state after the masked pseudo header of a packet of `roce_len` bytes carried in
    /// `encap` up to its PSN, from the memo when one of the last two kinds of packet had the
    /// same, and remembered (in place of the older one) otherwise.
    fn state_to_psn(&mut self, encap: &Encap, roce_len: usize, bth: &[u8]) -> Result<u32> {
        crate::error::need("BTH", bth, BTH_LEN)?;
        // Keyed by what the pseudo header is made of (BTH byte 4 is masked).
        let mut head = [0u8; PSN_AT];
        head.copy_from_slice(&bth[..PSN_AT]);
        head[4] = 0xFF;
        let key = (*encap, roce_len, head);
        match self.seen {
            [Some((k, state)), _] if k == key => return Ok(state),
            [_, Some((k, state))] if k == key => {
                self.seen.swap(0, 1);
                return Ok(state);
            }
            _ => {}
        }
        let (pseudo, n) = pseudo_header(encap, roce_len, bth)?;
        let mut h = crc32fast::Hasher::new_with_initial(CRC_OF_LRH_PLACEHOLDER);
        h.update(&pseudo[..n - (BTH_LEN - PSN_AT)]);
        let state = h.finalize();
        self.seen = [Some((key, state)), self.seen[0]];
        Ok(state)
    }
}

/// The ICRC carried by a whole RoCEv2 packet (its last four bytes, little-endian).
pub fn carried(packet: &[u8]) -> Option<u32> {
    let n = packet.len().checked_sub(ICRC_LEN)?;
    Some(u32::from_le_bytes([
        packet[n],
        packet[n + 1],
        packet[n + 2],
        packet[n + 3],
    ]))
}

/// Verifies a whole RoCEv2 packet (ICRC included) against raw IP and UDP headers.
pub fn verify_raw(ip_header: &[u8], udp_header: &[u8], packet: &[u8]) -> Result<()> {
    let carried = carried(packet).ok_or(Error::Truncated {
        what: "ICRC",
        needed: 4,
        actual: packet.len(),
    })?;
    let computed = compute_raw(ip_header, udp_header, &packet[..packet.len() - ICRC_LEN])?;
    if computed == carried {
        Ok(())
    } else {
        Err(Error::BadIcrc { carried, computed })
    }
}

/// Verifies a whole RoCEv2 packet (ICRC included) as carried in `encap`.
pub fn verify(encap: &Encap, packet: &[u8]) -> Result<()> {
    verify_with_memo(encap, packet, &mut Memo::default())
}

/// [`verify`] with the pseudo header's CRC state kept in `memo` from one packet to the next
/// (see [`Hasher::with_memo`]).
pub fn verify_with_memo(encap: &Encap, packet: &[u8], memo: &mut Memo) -> Result<()> {
    let carried = carried(packet).ok_or(Error::Truncated {
        what: "ICRC",
        needed: 4,
        actual: packet.len(),
    })?;
    let computed = compute_with_memo(encap, &packet[..packet.len() - ICRC_LEN], memo)?;
    if computed == carried {
        Ok(())
    } else {
        Err(Error::BadIcrc { carried, computed })
    }
}

/// Verifies an IPv4 RoCEv2 packet whose IPv4 Identification is unknown, and returns the one
/// Identification for which the ICRC matches.
///
/// A receiver on an ordinary UDP socket knows every IPv4 field the ICRC covers (addresses,
/// total length = 20 + UDP length, protocol, DF) except the 16-bit Identification: Linux rxe
/// sends hashed non-zero IDs, srdma sends 0, and the socket API exposes neither. The ID in
/// `encap` is ignored; everything else is used as given, including `flags_frag`, which a
/// receiver sets to [`crate::ip::IPV4_DF`] (what [`IpRepr::between`](crate::IpRepr::between)
/// gives and what rxe and srdma send). `packet` is BTH to ICRC inclusive, as for [`verify`].
///
/// # Method
///
/// CRC-32 is affine over GF(2): with the Identification `id` in place of 0 the ICRC becomes
/// `icrc(0) ^ L(id)`, where `L` is linear in the 16 ID bits. In polynomial terms (modulo the
/// CRC polynomial `P`) a message bit followed by `t` more bits adds `x^(32+t)` to the CRC, so
/// `L(id) = x^(32+8k) * D(id)` with `k` the number of bytes after the ID field (the rest of
/// the IPv4 header, UDP and the packet) and `D(id)` the ID bits as a polynomial of degree at
/// most 15 (the low ID byte in `x^0..x^7`, the high one in `x^8..x^15`: CRC-32 is reflected).
/// This is the 32 x 16 system `L * id = carried ^ icrc(0)`; because `x` is invertible modulo
/// `P` (which has a constant term) it is solved by one multiplication rather than Gaussian
/// elimination:
///
/// ```text
/// R = (carried ^ icrc(ID 0)) * x^-(32+8k) mod P
/// accept iff deg R <= 15, and then id = the 16 coefficients of R
/// ```
///
/// `x^-(32+8k)` is the product of two entries of 256-entry tables built at compile time
/// (`k` < 2^16 for any IPv4 packet), so the cost on top of the one CRC pass is two 32-step
/// carry-less multiplications modulo `P` (tens of nanoseconds). The solution, when it
/// exists, is unique: `L` has full column rank 16 for every length, since `x^j * D ≡ 0 mod P`
/// with `deg D <= 15` forces `D = 0`.
///
/// # What it still detects
///
/// 2^16 of the 2^32 ICRC values now pass instead of one, so an arbitrary corruption whose
/// effect on the CRC is random is accepted with probability 2^-16 (about 1.5e-5; a plain
/// ICRC check: 2^-32), and then with a wrong Identification. A flip of one covered bit
/// anywhere in `packet` (ICRC included; BTH byte 4 is masked) is always detected for packets
/// shorter than 26,745 bytes (`deg(x^-m mod P) <= 15` holds for no `m` in `177..=214,134`),
/// which covers every RoCE MTU; two or more flipped bits are no longer guaranteed to be
/// caught.
///
/// Fails with [`Error::BadIcrc`] (`computed` being the ICRC for ID 0) when no Identification
/// matches, [`Error::Truncated`] when `packet` is shorter than BTH + ICRC,
/// [`Error::OutOfRange`] when it cannot fit one IPv4 datagram, and [`Error::MalformedIp`]
/// for an IPv6 `encap` (IPv6 has no such field: use [`verify`]). Never panics.
pub fn verify_ipv4_unknown_ident(encap: &Encap, packet: &[u8]) -> Result<u16> {
    let (carried, computed, k) = ident_check(encap, packet, &mut Memo::default())?;
    solve_ident(carried, computed, k)
}

/// [`verify_ipv4_unknown_ident`], cheaper when the caller can guess the Identification:
/// a packet that carries ID 0 (srdma's single datagrams) or `guess` (srdma's GSO messages
/// number their datagrams 0, 1, 2, …: a datagram's place in a GRO buffer that arrived uncut)
/// is checked with the CRC pass and at most one short multiplication (an ID below 256; the
/// length's factor is kept in `memo` from one packet to the next, as is the pseudo header's
/// CRC state, see [`Hasher::with_memo`]). Any other ID is solved for as
/// [`verify_ipv4_unknown_ident`] does. The same packets pass and the same errors come back as
/// from [`verify_ipv4_unknown_ident`] (the solution is unique).
pub fn verify_ipv4_ident_guess(
    encap: &Encap,
    packet: &[u8],
    guess: u16,
    memo: &mut Memo,
) -> Result<u16> {
    let (carried, computed, k) = ident_check(encap, packet, memo)?;
    if carried == computed {
        return Ok(0);
    }
    if guess != 0 {
        if memo.ident_len != packet.len() {
            memo.ident_len = packet.len();
            memo.ident_factor = ipv4_ident_factor(packet.len());
        }
        if carried == ipv4_icrc_with_ident_factor(computed, memo.ident_factor, guess) {
            return Ok(guess);
        }
    }
    solve_ident(carried, computed, k)
}

/// The checks and the CRC pass of the unknown-ID verification: (carried ICRC, ICRC for ID 0,
/// bytes covered after the ID field).
fn ident_check(encap: &Encap, packet: &[u8], memo: &mut Memo) -> Result<(u32, u32, usize)> {
    let crate::IpRepr::V4(mut h) = encap.ip else {
        return Err(Error::MalformedIp(
            "IPv6 (no Identification to solve for: verify the ICRC with icrc::verify)",
        ));
    };
    let carried = carried(packet).ok_or(Error::Truncated {
        what: "ICRC",
        needed: ICRC_LEN,
        actual: packet.len(),
    })?;
    let total = IPV4_LEN + UDP_LEN + packet.len();
    if total > usize::from(u16::MAX) {
        return Err(Error::OutOfRange {
            field: "IPv4 total length",
            value: total as u64,
        });
    }
    h.ident = 0;
    let zero = Encap {
        ip: crate::IpRepr::V4(h),
        ..*encap
    };
    let covered = &packet[..packet.len() - ICRC_LEN];
    // Bytes after the ID field (IPv4 bytes 4-5): IPv4 bytes 6..20, UDP, the covered packet;
    // below 2^16 since `total` is.
    let k = (IPV4_LEN - 6) + UDP_LEN + covered.len();
    let computed = compute_with_memo(&zero, covered, memo)?;
    Ok((carried, computed, k))
}

/// Solves `carried ^ computed = x^(32+8k) * D(id)` for the ID (see
/// [`verify_ipv4_unknown_ident`]).
fn solve_ident(carried: u32, computed: u32, k: usize) -> Result<u16> {
    // `k` < 2^16: the masks only make the indexing visibly safe.
    let inv = if k < 256 {
        INV_X_LOW[k & 0xFF] // INV_X_HIGH[0] is 1: packets up to 237 bytes (ACKs) skip a step
    } else {
        mul_mod(INV_X_LOW[k & 0xFF], INV_X_HIGH[(k >> 8) & 0xFF])
    };
    let r = mul_mod(carried ^ computed, inv);
    if r & 0xFFFF == 0 {
        // Reflected: x^0..x^7 (the low ID byte) sit in bits 31..24, x^8..x^15 in bits 23..16.
        Ok(((r >> 16) as u16).swap_bytes())
    } else {
        Err(Error::BadIcrc { carried, computed })
    }
}

/// The CRC-32 polynomial `P` (IEEE 802.3) without its `x^32` term, reflected as the CRC
/// register holds it: bit `31 - i` is the coefficient of `x^i`.
const POLY: u32 = 0xEDB8_8320;

/// The polynomial 1 in the reflected representation.
const X0: u32 = 0x8000_0000;

/// `a * x mod P`: one step of the CRC register over a zero bit.
const fn mul_x(a: u32) -> u32 {
    (a >> 1) ^ (POLY & (a & 1).wrapping_neg())
}

/// `a * x^-1 mod P`, the inverse of [`mul_x`] (`x` is invertible: `P` has a constant term).
const fn div_x(a: u32) -> u32 {
    let c = a >> 31;
    ((a ^ (POLY & c.wrapping_neg())) << 1) | c
}

/// `a * b mod P` (zlib's `multmodp`): one step per coefficient of `a`, from `x^0` up to its
/// highest one, so a factor with only low powers (an Identification, below) takes few.
const fn mul_mod(mut a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    while a != 0 {
        // All ones when the coefficient of x^i in `a` is set; `b` holds the input times x^i.
        p ^= b & ((a as i32) >> 31) as u32;
        a <<= 1;
        b = mul_x(b);
    }
    p
}

/// The ICRC of an IPv4 RoCEv2 packet whose Identification is `ident`, from `icrc_id0`, the
/// ICRC of the same packet with Identification 0 (what [`compute`] gives for an `encap`
/// with ID 0); `roce_len` is the packet's length, BTH to ICRC inclusive.
///
/// A UDP GSO buffer sent with ID 0 is cut into datagrams numbered 0, 1, 2, … (the kernel's
/// segmentation increments the Identification; seen in the rxe lab's captures): datagram `j`
/// must carry the ICRC for ID `j` to pass a receiver that checks it (rxe, a NIC). By the
/// affinity of CRC-32 (see [`verify_ipv4_unknown_ident`]) that is
/// `icrc_id0 ^ x^(32+8k) * D(ident) mod P`, one carry-less multiplication: no second pass
/// over the packet. Lengths past one IPv4 datagram wrap (no such packet exists).
pub fn ipv4_icrc_with_ident(icrc_id0: u32, roce_len: usize, ident: u16) -> u32 {
    ipv4_icrc_with_ident_factor(icrc_id0, ipv4_ident_factor(roce_len), ident)
}

/// The factor [`ipv4_icrc_with_ident_factor`] needs for packets of `roce_len` bytes (BTH to
/// ICRC inclusive): `x^(32+8k) mod P`, `k` being the bytes the ICRC covers after the
/// Identification. Computed once for a run of same-sized datagrams.
pub fn ipv4_ident_factor(roce_len: usize) -> u32 {
    let covered = roce_len.saturating_sub(ICRC_LEN);
    let k = (IPV4_LEN - 6) + UDP_LEN + covered;
    mul_mod(X_LOW[k & 0xFF], X_HIGH[(k >> 8) & 0xFF])
}

/// [`ipv4_icrc_with_ident`] with the length's factor from [`ipv4_ident_factor`]: the ICRC
/// for Identification `ident` of a packet whose ICRC for ID 0 is `icrc_id0`. An ID below 256
/// costs eight steps of the CRC register.
pub fn ipv4_icrc_with_ident_factor(icrc_id0: u32, factor: u32, ident: u16) -> u32 {
    // Reflected: the low ID byte in bits 31..24, the high one in bits 23..16.
    let d = u32::from(ident.swap_bytes()) << 16;
    icrc_id0 ^ mul_mod(d, factor)
}

/// `X_LOW[i] = x^(32 + 8 i) mod P`: [`INV_X_LOW`]'s inverses.
static X_LOW: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut v = X0;
    let mut i = 0;
    while i < 32 {
        v = mul_x(v);
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        t[i] = v;
        let mut j = 0;
        while j < 8 {
            v = mul_x(v);
            j += 1;
        }
        i += 1;
    }
    t
};

/// `X_HIGH[i] = x^(8 * 256 i) mod P`: [`INV_X_HIGH`]'s inverses.
static X_HIGH: [u32; 256] = {
    let mut step = X0;
    let mut i = 0;
    while i < 8 * 256 {
        step = mul_x(step);
        i += 1;
    }
    let mut t = [0u32; 256];
    t[0] = X0;
    let mut i = 1;
    while i < 256 {
        t[i] = mul_mod(t[i - 1], step);
        i += 1;
    }
    t
};

/// `INV_X_LOW[i] = x^-(32 + 8 i) mod P`: the `x^-32` that turns a register contribution
/// back into message bits, times the low byte of `k` zero bytes.
static INV_X_LOW: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut v = X0;
    let mut i = 0;
    while i < 32 {
        v = div_x(v);
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        t[i] = v;
        let mut j = 0;
        while j < 8 {
            v = div_x(v);
            j += 1;
        }
        i += 1;
    }
    t
};

/// `INV_X_HIGH[i] = x^-(8 * 256 i) mod P`: the high byte of `k` zero bytes.
static INV_X_HIGH: [u32; 256] = {
    let mut step = X0;
    let mut i = 0;
    while i < 8 * 256 {
        step = div_x(step);
        i += 1;
    }
    let mut t = [0u32; 256];
    t[0] = X0;
    let mut i = 1;
    while i < 256 {
        t[i] = mul_mod(t[i - 1], step);
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    /// `x^n mod P` by repeated [`mul_x`], for checking the faster paths.
    fn x_pow(n: usize) -> u32 {
        (0..n).fold(X0, |v, _| mul_x(v))
    }

    #[test]
    fn icrc_for_another_ident_matches_a_full_computation() {
        let mut payload = [0u8; 8192];
        for (i, b) in payload.iter_mut().enumerate() {
            *b = (i * 31 + 7) as u8;
        }
        for (len, ident) in [
            (60usize, 1u16),
            (1080, 2),
            (1080, 63),
            (4140, 0x1234),
            (300, 0xffff),
        ] {
            let mut h = crate::ip::Ipv4Repr {
                src: core::net::Ipv4Addr::new(10, 77, 0, 1),
                dst: core::net::Ipv4Addr::new(10, 77, 0, 2),
                tos: 0,
                ttl: 64,
                ident: 0,
                flags_frag: crate::ip::IPV4_DF,
            };
            let encap = |h| Encap {
                ip: crate::IpRepr::V4(h),
                src_port: 4791,
                dst_port: 4791,
            };
            let roce = &payload[..len];
            let covered = &roce[..len - ICRC_LEN];
            let id0 = compute(&encap(h), covered).unwrap();
            h.ident = ident;
            let direct = compute(&encap(h), covered).unwrap();
            assert_eq!(
                ipv4_icrc_with_ident(id0, len, ident),
                direct,
                "len {len} id {ident}"
            );
            assert_eq!(ipv4_icrc_with_ident(id0, len, 0), id0);
        }
    }

    /// A memo serving packets of three kinds in turn (two remembered at a time: a request and
    /// an ACK of a ping-pong, then a third that evicts the older) gives every packet the ICRC
    /// a computation from scratch gives, whatever it remembers.
    #[test]
    fn memo_of_two_kinds_matches_a_full_computation() {
        let encap = |last: u8| Encap {
            ip: crate::IpRepr::V4(crate::ip::Ipv4Repr {
                src: core::net::Ipv4Addr::new(10, 77, 0, 1),
                dst: core::net::Ipv4Addr::new(10, 77, 0, last),
                tos: 0,
                ttl: 64,
                ident: 0,
                flags_frag: crate::ip::IPV4_DF,
            }),
            src_port: 4791,
            dst_port: 4791,
        };
        // BTH opcode, length and destination differ by kind; the PSN by packet.
        let kinds: [(u8, usize, u8); 3] = [(0x04, 24, 2), (0x11, 16, 2), (0x04, 24, 3)];
        let mut memo = Memo::default();
        let order = [0usize, 1, 0, 1, 1, 0, 2, 0, 1, 2, 2, 1, 0];
        for (n, &k) in order.iter().enumerate() {
            let (opcode, len, last) = kinds[k];
            let mut buf = [0u8; 24];
            let roce = &mut buf[..len];
            roce[0] = opcode;
            roce[4] = 0x5a; // masked
            roce[7] = 0x11 + k as u8; // destination QP
            roce[9..12].copy_from_slice(&(n as u32).to_be_bytes()[1..]); // PSN
            for (i, b) in roce.iter_mut().enumerate().skip(BTH_LEN) {
                *b = (i * 13 + n) as u8;
            }
            let e = encap(last);
            assert_eq!(
                compute_with_memo(&e, roce, &mut memo).unwrap(),
                compute(&e, roce).unwrap(),
                "packet {n} of kind {k}"
            );
        }
    }

    #[test]
    fn polynomial_arithmetic() {
        let mut v = 0x1234_5678u32;
        for _ in 0..100 {
            assert_eq!(mul_x(div_x(v)), v);
            assert_eq!(div_x(mul_x(v)), v);
            v = v.rotate_left(5) ^ 0x9e37_79b9;
        }
        assert_eq!(mul_mod(X0, 0xdead_beef), 0xdead_beef);
        assert_eq!(mul_mod(x_pow(5), x_pow(40)), x_pow(45));
        assert_eq!(
            mul_mod(0x0bad_f00d, 0x1357_9bdf),
            mul_mod(0x1357_9bdf, 0x0bad_f00d)
        );
        for (i, &inv) in INV_X_LOW.iter().enumerate() {
            assert_eq!(mul_mod(inv, x_pow(32 + 8 * i)), X0, "low {i}");
        }
        for i in [0, 1, 2, 7, 100, 255] {
            assert_eq!(mul_mod(INV_X_HIGH[i], x_pow(2048 * i)), X0, "high {i}");
        }
    }

    /// The bound in the doc of [`verify_ipv4_unknown_ident`]: a single flipped bit `m` bits
    /// before the end of the IPv4 ID's contribution (177 <= m <= 8 * length + 176) passes
    /// only if `x^-m mod P` has degree <= 15; the first such `m` past 176 is 214,135.
    #[test]
    fn single_bit_errors_are_detected_up_to_26744_bytes() {
        let mut v = X0;
        let mut first = None;
        for m in 1..=300_000usize {
            v = div_x(v);
            if v & 0xFFFF == 0 {
                first = Some(m);
                break;
            }
        }
        assert_eq!(first, Some(214_135));
        // The longest packet whose flips all have m < 214,135: 8 * len + 176 < 214,135.
        let longest = first.map(|m| (m - 177) / 8);
        assert_eq!(longest, Some(26_744));
    }

    /// The memo changes nothing but the cost: a stream of packets where mostly the PSN
    /// changes, now and then one other thing the pseudo header is made of (any BTH byte, the
    /// length, an address, a port, the IPv4 ID, the IP version), gives the ICRC a full
    /// computation gives, whole or piece by piece.
    #[test]
    fn a_memo_gives_the_icrc_a_full_computation_gives() {
        use crate::ip::{Ipv4Repr, Ipv6Repr};
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let v4 = Ipv4Repr {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            tos: 0,
            ttl: 64,
            ident: 0,
            flags_frag: crate::ip::IPV4_DF,
        };
        let v6 = Ipv6Repr {
            src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1].into(),
            dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2].into(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        };
        let mut encap = Encap {
            ip: crate::IpRepr::V4(v4),
            src_port: 0xC000,
            dst_port: 4791,
        };
        let mut packet = [0u8; 600];
        for (i, b) in packet.iter_mut().enumerate() {
            *b = (i * 13 + 5) as u8;
        }
        let mut len = 300;
        let mut memo = Memo::default();
        let mut hits = 0;
        for n in 0..20_000 {
            let r = next();
            match r % 16 {
                0 => {
                    let at = (r >> 8) as usize % PSN_AT;
                    packet[at] ^= 1 << ((r >> 16) % 8);
                }
                1 => len = BTH_LEN + (r >> 8) as usize % (packet.len() - BTH_LEN),
                2 => match &mut encap.ip {
                    crate::IpRepr::V4(h) => match (r >> 8) % 4 {
                        0 => h.ident = (r >> 16) as u16,
                        1 => h.src = ((r >> 16) as u32).into(),
                        2 => h.dst = ((r >> 16) as u32).into(),
                        _ => encap.ip = crate::IpRepr::V6(v6),
                    },
                    crate::IpRepr::V6(h) => match (r >> 8) % 3 {
                        0 => h.src = ((r >> 16) as u128).into(),
                        1 => h.dst = ((r >> 16) as u128).into(),
                        _ => encap.ip = crate::IpRepr::V4(v4),
                    },
                },
                3 => encap.src_port = (r >> 8) as u16,
                4 => encap.dst_port = (r >> 8) as u16,
                _ => hits += 1,
            }
            // A new PSN every time.
            packet[PSN_AT..BTH_LEN].copy_from_slice(&(n as u32).to_be_bytes()[1..]);
            let roce = &packet[..len];
            let want = compute(&encap, roce).unwrap();
            assert_eq!(
                compute_with_memo(&encap, roce, &mut memo).unwrap(),
                want,
                "packet {n}"
            );
            let cut = BTH_LEN + (r >> 40) as usize % (len - BTH_LEN + 1);
            let mut h = Hasher::with_memo(&encap, len, roce, &mut memo).unwrap();
            h.update(&roce[BTH_LEN..cut]);
            h.update(&roce[cut..]);
            assert_eq!(h.finish(), want, "packet {n} in pieces");
        }
        assert!(hits > 10_000, "{hits}");
        // A packet shorter than a BTH is an error, with or without a memo.
        assert!(compute_with_memo(&encap, &packet[..BTH_LEN - 1], &mut memo).is_err());
    }

    #[test]
    fn placeholder_constant_is_the_crc_of_eight_ones() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), CRC_OF_LRH_PLACEHOLDER);
    }

    /// The fast path (pseudo header from the fields) equals the raw path (real header bytes,
    /// masked) for IPv4 and IPv6, whatever the masked fields hold.
    #[test]
    fn fast_and_raw_paths_agree() {
        use crate::ip::{Ipv4Repr, Ipv6Repr};
        let roce: [u8; 20] = [
            0x04, 0x30, 0xff, 0xff, 0xc0, 0, 0, 0x11, 0x80, 0, 1, 0, 1, 2, 3, 4, 5, 6, 0, 0,
        ];
        let v4 = crate::IpRepr::V4(Ipv4Repr {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            tos: 0x03,
            ttl: 7,
            ident: 0x1234,
            flags_frag: crate::ip::IPV4_DF,
        });
        let v6 = crate::IpRepr::V6(Ipv6Repr {
            src: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1].into(),
            dst: [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2].into(),
            traffic_class: 0x68,
            flow_label: 0x12345,
            hop_limit: 3,
        });
        for ip in [v4, v6] {
            let encap = Encap {
                ip,
                src_port: 0xC123,
                dst_port: 4791,
            };
            let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
            encap.emit(&mut hdr, roce.len() + ICRC_LEN, None).unwrap();
            let il = ip.header_len();
            assert_eq!(
                compute(&encap, &roce).unwrap(),
                compute_raw(&hdr[..il], &hdr[il..il + UDP_LEN], &roce).unwrap()
            );
            // Piece by piece, cut anywhere after the BTH, gives the same ICRC.
            for cut in BTH_LEN..=roce.len() {
                let mut h = Hasher::new(&encap, roce.len(), &roce[..BTH_LEN]).unwrap();
                h.update(&roce[BTH_LEN..cut]);
                h.update(&roce[cut..]);
                assert_eq!(h.finish(), compute(&encap, &roce).unwrap(), "cut at {cut}");
            }
        }
    }
}
