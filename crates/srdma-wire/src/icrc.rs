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

/// CRC-32 of the 8 bytes of 0xFF that stand in for the LRH: the state every ICRC starts from
/// (rxe folds the same bytes into its seed 0xdebb20e3, the raw register value).
const CRC_OF_LRH_PLACEHOLDER: u32 = 0x2144_df1c;

/// Computes the ICRC of `roce` (BTH to pad, without the ICRC) as carried in `encap`.
///
/// The masked pseudo header is built straight from the `Encap` fields: the masked bytes are
/// written as ones and the IPv4 checksum, which the mask hides, is never computed. This is
/// the per-packet path of a sender; [`compute_raw`] is for headers taken off the wire.
pub fn compute(encap: &Encap, roce: &[u8]) -> Result<u32> {
    crate::error::need("BTH", roce, BTH_LEN)?;
    let udp_len = UDP_LEN + roce.len() + ICRC_LEN;
    let udp_len16 = u16::try_from(udp_len).map_err(|_| Error::OutOfRange {
        field: "UDP length",
        value: udp_len as u64,
    })?;
    let mut pseudo = [0xFFu8; IPV6_LEN + UDP_LEN + BTH_LEN];
    let iplen = match encap.ip {
        crate::IpRepr::V4(h) => {
            let total = (IPV4_LEN + udp_len) as u16;
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
    let bth = &mut pseudo[iplen + UDP_LEN..iplen + UDP_LEN + BTH_LEN];
    bth.copy_from_slice(&roce[..BTH_LEN]);
    bth[4] = 0xFF;
    let mut h = crc32fast::Hasher::new_with_initial(CRC_OF_LRH_PLACEHOLDER);
    h.update(&pseudo[..iplen + UDP_LEN + BTH_LEN]);
    h.update(&roce[BTH_LEN..]);
    Ok(h.finalize())
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

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }
}
