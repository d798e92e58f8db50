//! Classic pcap files: a reader for captures (tcpdump, tshark, rxe-lab) and a writer that wraps
//! each RoCEv2 packet in the IP and UDP headers its ICRC covers, so Wireshark decodes it as
//! InfiniBand over UDP 4791.

use alloc::vec::Vec;

use crate::ip::Encap;
use crate::{Error, Result};

/// LINKTYPE_NULL (BSD loopback).
pub const LINKTYPE_NULL: u32 = 0;
/// LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// LINKTYPE_RAW: each record starts with an IPv4 or IPv6 header. The writer uses it.
pub const LINKTYPE_RAW: u32 = 101;
/// LINKTYPE_LINUX_SLL (`tcpdump -i any`).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// LINKTYPE_IPV4.
pub const LINKTYPE_IPV4: u32 = 228;
/// LINKTYPE_IPV6.
pub const LINKTYPE_IPV6: u32 = 229;
/// LINKTYPE_LINUX_SLL2.
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

const MAGIC_USEC: u32 = 0xA1B2_C3D4;
const MAGIC_NSEC: u32 = 0xA1B2_3C4D;
const GLOBAL_LEN: usize = 24;
const RECORD_LEN: usize = 16;
/// Snap length the writer announces.
pub const SNAPLEN: u32 = 262_144;

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Capture time in nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Length of the frame on the wire.
    pub orig_len: u32,
    /// The captured bytes (may be shorter than `orig_len`).
    pub data: &'a [u8],
}

impl Record<'_> {
    /// True when the capture cut the frame short (snap length).
    pub fn truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.orig_len)
    }
}

/// Reads a classic pcap file held in memory (either byte order, micro- or nanosecond stamps).
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    big_endian: bool,
    nanos: bool,
    linktype: u32,
    offset: usize,
}

impl<'a> Reader<'a> {
    /// Parses the global header.
    pub fn new(data: &'a [u8]) -> Result<Self> {
        if data.len() < 4 {
            return Err(Error::NotPcap(0));
        }
        let le = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let be = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
        let (big_endian, nanos) = match (le, be) {
            (MAGIC_USEC, _) => (false, false),
            (MAGIC_NSEC, _) => (false, true),
            (_, MAGIC_USEC) => (true, false),
            (_, MAGIC_NSEC) => (true, true),
            _ => return Err(Error::NotPcap(be)),
        };
        crate::error::need("pcap global header", data, GLOBAL_LEN)?;
        let mut r = Reader {
            data,
            big_endian,
            nanos,
            linktype: 0,
            offset: GLOBAL_LEN,
        };
        r.linktype = r.u32_at(20) & 0x0FFF_FFFF;
        Ok(r)
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b = [
            self.data[at],
            self.data[at + 1],
            self.data[at + 2],
            self.data[at + 3],
        ];
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    /// The link type of every record.
    pub fn linktype(&self) -> u32 {
        self.linktype
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Record<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.data.len() - self.offset;
        if rest == 0 {
            return None;
        }
        if rest < RECORD_LEN {
            self.offset = self.data.len();
            return Some(Err(Error::Truncated {
                what: "pcap record header",
                needed: RECORD_LEN,
                actual: rest,
            }));
        }
        let o = self.offset;
        let secs = u64::from(self.u32_at(o));
        let frac = u64::from(self.u32_at(o + 4));
        let incl = self.u32_at(o + 8) as usize;
        let orig_len = self.u32_at(o + 12);
        let start = o + RECORD_LEN;
        if self.data.len() - start < incl {
            self.offset = self.data.len();
            return Some(Err(Error::Truncated {
                what: "pcap record",
                needed: incl,
                actual: self.data.len() - start,
            }));
        }
        self.offset = start + incl;
        let ts_ns = secs * 1_000_000_000 + if self.nanos { frac } else { frac * 1000 };
        Some(Ok(Record {
            ts_ns,
            orig_len,
            data: &self.data[start..start + incl],
        }))
    }
}

/// The 24-byte global header of a nanosecond-resolution, little-endian pcap of `linktype`.
pub fn file_header(linktype: u32) -> [u8; GLOBAL_LEN] {
    let mut h = [0u8; GLOBAL_LEN];
    h[0..4].copy_from_slice(&MAGIC_NSEC.to_le_bytes());
    h[4..6].copy_from_slice(&2u16.to_le_bytes());
    h[6..8].copy_from_slice(&4u16.to_le_bytes());
    h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
    h[20..24].copy_from_slice(&linktype.to_le_bytes());
    h
}

/// Appends one LINKTYPE_RAW record to `out`: the IP and UDP headers of `encap` (with a valid
/// UDP checksum, as a kernel socket sends) followed by the RoCEv2 packet `roce` (BTH to ICRC).
pub fn append_roce_record(out: &mut Vec<u8>, ts_ns: u64, encap: &Encap, roce: &[u8]) -> Result<()> {
    let hl = encap.header_len();
    let frame_len = hl + roce.len();
    let frame_len32 = u32::try_from(frame_len).map_err(|_| Error::OutOfRange {
        field: "pcap record",
        value: frame_len as u64,
    })?;
    let secs = u32::try_from(ts_ns / 1_000_000_000).map_err(|_| Error::OutOfRange {
        field: "pcap timestamp",
        value: ts_ns,
    })?;
    let nanos = (ts_ns % 1_000_000_000) as u32;
    out.reserve(RECORD_LEN + frame_len);
    out.extend_from_slice(&secs.to_le_bytes());
    out.extend_from_slice(&nanos.to_le_bytes());
    out.extend_from_slice(&frame_len32.to_le_bytes());
    out.extend_from_slice(&frame_len32.to_le_bytes());
    let at = out.len();
    out.resize(at + hl, 0);
    encap.emit(&mut out[at..], roce.len(), Some(roce))?;
    out.extend_from_slice(roce);
    Ok(())
}

/// A pcap file writer over any [`std::io::Write`] (LINKTYPE_RAW, nanosecond stamps).
#[cfg(feature = "std")]
#[derive(Debug)]
pub struct Writer<W: std::io::Write> {
    out: W,
    scratch: Vec<u8>,
}

#[cfg(feature = "std")]
impl<W: std::io::Write> Writer<W> {
    /// Writes the global header.
    pub fn new(mut out: W) -> std::io::Result<Self> {
        out.write_all(&file_header(LINKTYPE_RAW))?;
        Ok(Writer {
            out,
            scratch: Vec::new(),
        })
    }

    /// Writes one RoCEv2 packet (BTH to ICRC) carried in `encap`, stamped `ts_ns`.
    pub fn write_roce(&mut self, ts_ns: u64, encap: &Encap, roce: &[u8]) -> std::io::Result<()> {
        self.scratch.clear();
        append_roce_record(&mut self.scratch, ts_ns, encap, roce)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.out.write_all(&self.scratch)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    /// Gives the underlying writer back.
    pub fn into_inner(self) -> W {
        self.out
    }
}
