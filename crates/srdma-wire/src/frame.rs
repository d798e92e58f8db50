//! Finding RoCEv2 packets in captured frames: link layer → IP → UDP port 4791 → RoCEv2.

use crate::icrc;
use crate::ip::{Encap, IPPROTO_UDP, IPV4_DF, IpRepr, ROCEV2_PORT, UDP_LEN, UdpRepr};
use crate::pcap::{
    LINKTYPE_ETHERNET, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2,
    LINKTYPE_NULL, LINKTYPE_RAW,
};
use crate::{Error, Result};

/// A RoCEv2 packet found in a frame, with the raw IP and UDP headers its ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Raw IP header bytes (options included).
    pub ip_header: &'a [u8],
    /// Raw UDP header bytes.
    pub udp_header: &'a [u8],
    /// The parsed IP and UDP headers.
    pub encap: Encap,
    /// The RoCEv2 packet, BTH to ICRC, cut to the UDP length.
    pub roce: &'a [u8],
    /// True when the capture holds fewer bytes than the UDP length announces.
    pub truncated: bool,
}

/// What can be said of a packet's ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcStatus {
    /// The ICRC matches.
    Ok,
    /// The ICRC does not match.
    Bad {
        /// Carried value.
        carried: u32,
        /// Computed value.
        computed: u32,
    },
    /// The ICRC cannot be checked, and why.
    Unverifiable(&'static str),
}

impl RoceFrame<'_> {
    /// Checks the ICRC against the captured IP and UDP headers.
    pub fn icrc_status(&self) -> IcrcStatus {
        if self.truncated {
            return IcrcStatus::Unverifiable("capture truncated");
        }
        if let IpRepr::V4(h) = self.encap.ip {
            if h.flags_frag & !IPV4_DF != 0 {
                return IcrcStatus::Unverifiable("IPv4 fragment");
            }
            if self.ip_header.len() != crate::ip::IPV4_LEN {
                return IcrcStatus::Unverifiable("IPv4 options");
            }
        }
        match icrc::verify_raw(self.ip_header, self.udp_header, self.roce) {
            Ok(()) => IcrcStatus::Ok,
            Err(Error::BadIcrc { carried, computed }) => IcrcStatus::Bad { carried, computed },
            Err(_) => IcrcStatus::Unverifiable("packet too short"),
        }
    }
}

/// Finds the IP header in a frame of `linktype`. `Ok(None)` for frames that carry no IP.
pub fn ip_payload(linktype: u32, frame: &[u8]) -> Result<Option<&[u8]>> {
    let (ethertype, rest) = match linktype {
        LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => return Ok(Some(frame)),
        LINKTYPE_ETHERNET => {
            crate::error::need("Ethernet header", frame, 14)?;
            let mut et = u16::from_be_bytes([frame[12], frame[13]]);
            let mut rest = &frame[14..];
            // 802.1Q / 802.1ad tags.
            while et == 0x8100 || et == 0x88A8 {
                crate::error::need("VLAN tag", rest, 4)?;
                et = u16::from_be_bytes([rest[2], rest[3]]);
                rest = &rest[4..];
            }
            (et, rest)
        }
        LINKTYPE_LINUX_SLL => {
            crate::error::need("SLL header", frame, 16)?;
            (u16::from_be_bytes([frame[14], frame[15]]), &frame[16..])
        }
        LINKTYPE_LINUX_SLL2 => {
            crate::error::need("SLL2 header", frame, 20)?;
            (u16::from_be_bytes([frame[0], frame[1]]), &frame[20..])
        }
        LINKTYPE_NULL => {
            crate::error::need("loopback header", frame, 4)?;
            let fam = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]);
            let et = match fam {
                2 => 0x0800,
                10 | 24 | 28 | 30 => 0x86DD,
                _ => 0,
            };
            (et, &frame[4..])
        }
        other => return Err(Error::UnsupportedLinkType(other)),
    };
    Ok(match ethertype {
        0x0800 | 0x86DD => Some(rest),
        _ => None,
    })
}

/// Extracts the RoCEv2 packet of an IP datagram, if it is UDP to `port` (4791 for RoCEv2).
/// `Ok(None)` for anything else (TCP, other UDP ports, non-first fragments, IPv6 extension
/// headers); `Err` when the IP or UDP header itself is malformed.
pub fn roce_in_ip(ip: &[u8], port: u16) -> Result<Option<RoceFrame<'_>>> {
    if IpRepr::protocol(ip) != Some(IPPROTO_UDP) {
        return Ok(None);
    }
    let (repr, hl, _) = IpRepr::parse(ip)?;
    if let IpRepr::V4(h) = repr {
        if h.flags_frag & 0x1FFF != 0 {
            return Ok(None);
        }
    }
    let rest = &ip[hl..];
    let udp = UdpRepr::parse(rest)?;
    if udp.dst_port != port {
        return Ok(None);
    }
    let want = usize::from(udp.len);
    let have = rest.len();
    let end = want.min(have);
    Ok(Some(RoceFrame {
        ip_header: &ip[..hl],
        udp_header: &rest[..UDP_LEN],
        encap: Encap {
            ip: repr,
            src_port: udp.src_port,
            dst_port: udp.dst_port,
        },
        roce: &rest[UDP_LEN..end],
        truncated: have < want,
    }))
}

/// [`ip_payload`] then [`roce_in_ip`] with the RoCEv2 port.
pub fn roce_in_frame(linktype: u32, frame: &[u8]) -> Result<Option<RoceFrame<'_>>> {
    match ip_payload(linktype, frame)? {
        Some(ip) => roce_in_ip(ip, ROCEV2_PORT),
        None => Ok(None),
    }
}
