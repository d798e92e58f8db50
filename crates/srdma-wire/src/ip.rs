//! The IPv4/IPv6 and UDP headers a RoCEv2 packet travels in: just enough to parse them out of
//! a capture, to synthesize them for a pcap, and to feed the ICRC pseudo header.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::field::{be16, be32, set_be16, set_be32};
use crate::{Error, Result};

/// The RoCEv2 UDP destination port (IANA).
pub const ROCEV2_PORT: u16 = 4791;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IPv4 header length without options.
pub const IPV4_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_LEN: usize = 40;
/// UDP header length.
pub const UDP_LEN: usize = 8;
/// The IPv4 "don't fragment" flag in the flags/fragment-offset field.
pub const IPV4_DF: u16 = 0x4000;

/// An IPv4 header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Type of service (DSCP + ECN); masked in the ICRC.
    pub tos: u8,
    /// Time to live; masked in the ICRC.
    pub ttl: u8,
    /// Identification: covered by the ICRC. Linux sends 0 from an unconnected socket with DF.
    pub ident: u16,
    /// Flags and fragment offset, raw (DF = 0x4000); covered by the ICRC.
    pub flags_frag: u16,
}

/// An IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class; masked in the ICRC.
    pub traffic_class: u8,
    /// Flow label (20 bits); masked in the ICRC.
    pub flow_label: u32,
    /// Hop limit; masked in the ICRC.
    pub hop_limit: u8,
}

/// An IPv4 or IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// A header between two addresses with the fields Linux uses for an unconnected UDP
    /// socket with DF set: TTL/hop limit 64, TOS 0, IPv4 ID 0. Mixed families are refused.
    pub fn between(src: IpAddr, dst: IpAddr) -> Result<IpRepr> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Ok(IpRepr::V4(Ipv4Repr {
                src,
                dst,
                tos: 0,
                ttl: 64,
                ident: 0,
                flags_frag: IPV4_DF,
            })),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Ok(IpRepr::V6(Ipv6Repr {
                src,
                dst,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
            })),
            _ => Err(Error::MalformedIp("mixed IPv4/IPv6 address pair")),
        }
    }

    /// Header length in bytes.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_LEN,
            IpRepr::V6(_) => IPV6_LEN,
        }
    }

    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            IpRepr::V4(h) => IpAddr::V4(h.src),
            IpRepr::V6(h) => IpAddr::V6(h.src),
        }
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            IpRepr::V4(h) => IpAddr::V4(h.dst),
            IpRepr::V6(h) => IpAddr::V6(h.dst),
        }
    }

    /// Writes the header for a UDP datagram of `payload_len` bytes (UDP header included) into
    /// `buf[..header_len()]`, with a valid IPv4 header checksum.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        crate::error::need("IP header buffer", buf, self.header_len()).map_err(|_| {
            Error::BufferTooSmall {
                needed: self.header_len(),
                actual: buf.len(),
            }
        })?;
        match self {
            IpRepr::V4(h) => {
                let total = IPV4_LEN + payload_len;
                let total = u16::try_from(total).map_err(|_| Error::OutOfRange {
                    field: "IPv4 total length",
                    value: total as u64,
                })?;
                let b = &mut buf[..IPV4_LEN];
                b[0] = 0x45;
                b[1] = h.tos;
                set_be16(b, 2, total);
                set_be16(b, 4, h.ident);
                set_be16(b, 6, h.flags_frag);
                b[8] = h.ttl;
                b[9] = IPPROTO_UDP;
                set_be16(b, 10, 0);
                b[12..16].copy_from_slice(&h.src.octets());
                b[16..20].copy_from_slice(&h.dst.octets());
                let sum = !fold(sum_be16(b, 0));
                set_be16(b, 10, sum);
            }
            IpRepr::V6(h) => {
                let plen = u16::try_from(payload_len).map_err(|_| Error::OutOfRange {
                    field: "IPv6 payload length",
                    value: payload_len as u64,
                })?;
                let b = &mut buf[..IPV6_LEN];
                let word =
                    (6u32 << 28) | (u32::from(h.traffic_class) << 20) | (h.flow_label & 0xF_FFFF);
                set_be32(b, 0, word);
                set_be16(b, 4, plen);
                b[6] = IPPROTO_UDP;
                b[7] = h.hop_limit;
                b[8..24].copy_from_slice(&h.src.octets());
                b[24..40].copy_from_slice(&h.dst.octets());
            }
        }
        Ok(())
    }

    /// Parses an IP header that carries UDP. Returns the header, its length, and the length of
    /// the IP payload the header announces.
    pub fn parse(buf: &[u8]) -> Result<(IpRepr, usize, usize)> {
        let first = *buf.first().ok_or(Error::Truncated {
            what: "IP header",
            needed: 1,
            actual: 0,
        })?;
        match first >> 4 {
            4 => {
                crate::error::need("IPv4 header", buf, IPV4_LEN)?;
                let ihl = usize::from(first & 0xF) * 4;
                if ihl < IPV4_LEN {
                    return Err(Error::MalformedIp("IPv4 (IHL < 5)"));
                }
                crate::error::need("IPv4 header with options", buf, ihl)?;
                let total = usize::from(be16(buf, 2));
                if total < ihl {
                    return Err(Error::MalformedIp("IPv4 (total length < header length)"));
                }
                let mut src = [0u8; 4];
                src.copy_from_slice(&buf[12..16]);
                let mut dst = [0u8; 4];
                dst.copy_from_slice(&buf[16..20]);
                let repr = Ipv4Repr {
                    src: src.into(),
                    dst: dst.into(),
                    tos: buf[1],
                    ttl: buf[8],
                    ident: be16(buf, 4),
                    flags_frag: be16(buf, 6),
                };
                Ok((IpRepr::V4(repr), ihl, total - ihl))
            }
            6 => {
                crate::error::need("IPv6 header", buf, IPV6_LEN)?;
                let word = be32(buf, 0);
                let mut src = [0u8; 16];
                src.copy_from_slice(&buf[8..24]);
                let mut dst = [0u8; 16];
                dst.copy_from_slice(&buf[24..40]);
                let repr = Ipv6Repr {
                    src: src.into(),
                    dst: dst.into(),
                    traffic_class: ((word >> 20) & 0xFF) as u8,
                    flow_label: word & 0xF_FFFF,
                    hop_limit: buf[7],
                };
                Ok((IpRepr::V6(repr), IPV6_LEN, usize::from(be16(buf, 4))))
            }
            _ => Err(Error::MalformedIp("IP (version is neither 4 nor 6)")),
        }
    }

    /// The next-header / protocol byte of a raw header.
    pub fn protocol(buf: &[u8]) -> Option<u8> {
        match buf.first()? >> 4 {
            4 => buf.get(9).copied(),
            6 => buf.get(6).copied(),
            _ => None,
        }
    }
}

fn sum_be16(b: &[u8], init: u32) -> u32 {
    let mut s = init;
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        s += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        s += u32::from(*last) << 8;
    }
    s
}

fn fold(mut s: u32) -> u16 {
    while s > 0xFFFF {
        s = (s & 0xFFFF) + (s >> 16);
    }
    s as u16
}

/// The IP and UDP headers around one RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encap {
    /// IP header.
    pub ip: IpRepr,
    /// UDP source port (entropy; see [`crate::sport`]).
    pub src_port: u16,
    /// UDP destination port (4791 for RoCEv2).
    pub dst_port: u16,
}

impl Encap {
    /// Length of the IP and UDP headers.
    pub const fn header_len(&self) -> usize {
        self.ip.header_len() + UDP_LEN
    }

    /// Writes the IP and UDP headers for a RoCEv2 packet of `roce_len` bytes (BTH to ICRC
    /// inclusive) into `buf[..header_len()]`. The UDP checksum is computed over `roce` when
    /// given (what a kernel socket sends), or left 0 (what rxe sends).
    pub fn emit(&self, buf: &mut [u8], roce_len: usize, roce: Option<&[u8]>) -> Result<()> {
        let hl = self.header_len();
        if buf.len() < hl {
            return Err(Error::BufferTooSmall {
                needed: hl,
                actual: buf.len(),
            });
        }
        let udp_len = UDP_LEN + roce_len;
        let udp_len16 = u16::try_from(udp_len).map_err(|_| Error::OutOfRange {
            field: "UDP length",
            value: udp_len as u64,
        })?;
        self.ip.emit(buf, udp_len)?;
        let iplen = self.ip.header_len();
        let (ip, rest) = buf.split_at_mut(iplen);
        let udp = &mut rest[..UDP_LEN];
        set_be16(udp, 0, self.src_port);
        set_be16(udp, 2, self.dst_port);
        set_be16(udp, 4, udp_len16);
        set_be16(udp, 6, 0);
        if let Some(payload) = roce {
            let mut s = match self.ip {
                IpRepr::V4(_) => sum_be16(&ip[12..20], 0),
                IpRepr::V6(_) => sum_be16(&ip[8..40], 0),
            };
            s += u32::from(IPPROTO_UDP) + udp_len as u32;
            s = sum_be16(udp, s);
            s = sum_be16(payload, s);
            let c = !fold(s);
            set_be16(udp, 6, if c == 0 { 0xFFFF } else { c });
        }
        Ok(())
    }
}

/// A parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Length field (header + payload).
    pub len: u16,
    /// Checksum field (0 = none).
    pub checksum: u16,
}

impl UdpRepr {
    /// Parses a UDP header.
    pub fn parse(buf: &[u8]) -> Result<UdpRepr> {
        crate::error::need("UDP header", buf, UDP_LEN)?;
        let r = UdpRepr {
            src_port: be16(buf, 0),
            dst_port: be16(buf, 2),
            len: be16(buf, 4),
            checksum: be16(buf, 6),
        };
        if usize::from(r.len) < UDP_LEN {
            return Err(Error::MalformedIp("UDP (length < 8)"));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_of_vector_b() {
        // Test vector B: 192.168.0.7 -> 192.168.0.7, TOS 1, ID 0x0478, DF, TTL 64, csum 0xb4d5.
        let ip = IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(192, 168, 0, 7),
            dst: Ipv4Addr::new(192, 168, 0, 7),
            tos: 1,
            ttl: 64,
            ident: 0x0478,
            flags_frag: IPV4_DF,
        });
        let mut b = [0u8; 20];
        ip.emit(&mut b, 44).unwrap();
        let want = [
            0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0,
            7, 0xc0, 0xa8, 0, 7,
        ];
        assert_eq!(b, want);
        let (parsed, hl, plen) = IpRepr::parse(&b).unwrap();
        assert_eq!((parsed, hl, plen), (ip, 20, 44));
    }

    #[test]
    fn rejects_garbage() {
        assert!(IpRepr::parse(&[]).is_err());
        assert!(IpRepr::parse(&[0x41; 20]).is_err());
        assert!(IpRepr::parse(&[0x60; 39]).is_err());
        assert!(UdpRepr::parse(&[0, 0, 0, 0, 0, 7, 0, 0]).is_err());
    }
}
