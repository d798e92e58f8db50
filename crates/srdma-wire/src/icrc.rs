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
//! its kernel emits (an unconnected socket with DF sends ID 0).

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

/// Computes the ICRC of `roce` (BTH to pad, without the ICRC) as carried in `encap`.
pub fn compute(encap: &Encap, roce: &[u8]) -> Result<u32> {
    let mut hdr = [0u8; IPV6_LEN + UDP_LEN];
    let hl = encap.header_len();
    encap.emit(&mut hdr, roce.len() + ICRC_LEN, None)?;
    let iplen = encap.ip.header_len();
    compute_raw(&hdr[..iplen], &hdr[iplen..hl], roce)
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
    let carried = carried(packet).ok_or(Error::Truncated {
        what: "ICRC",
        needed: 4,
        actual: packet.len(),
    })?;
    let computed = compute(encap, &packet[..packet.len() - ICRC_LEN])?;
    if computed == carried {
        Ok(())
    } else {
        Err(Error::BadIcrc { carried, computed })
    }
}
