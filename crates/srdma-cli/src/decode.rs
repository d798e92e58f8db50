//! `srdma decode`: one line per RoCEv2 packet of a pcap, with the ICRC checked.

use std::fmt::Write as _;
use std::io::Write;
use std::net::IpAddr;

use srdma_wire::frame::{self, IcrcStatus};
use srdma_wire::{IpRepr, PacketRepr, pcap};

/// How to decode.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Print every field of every packet.
    pub verbose: bool,
    /// Print the per-packet lines (the demo prints only summaries).
    pub per_packet: bool,
    /// UDP destination port that marks RoCEv2 traffic.
    pub port: u16,
}

/// Counts for one capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// RoCEv2 packets found.
    pub roce: usize,
    /// ICRC verified.
    pub icrc_ok: usize,
    /// ICRC wrong.
    pub icrc_bad: usize,
    /// ICRC could not be checked (truncated capture, fragment, IP options).
    pub unverifiable: usize,
    /// RoCEv2 packets (or their IP/UDP headers) that do not parse.
    pub malformed: usize,
    /// Frames that are not RoCEv2 (TCP, ARP, other UDP ports...).
    pub skipped: usize,
}

impl Summary {
    /// True when no packet is malformed or has a bad ICRC.
    pub fn clean(&self) -> bool {
        self.icrc_bad == 0 && self.malformed == 0
    }
}

fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// Decodes the pcap held in `data`, writing lines to `out`.
pub fn decode(data: &[u8], opts: Options, out: &mut dyn Write) -> anyhow::Result<Summary> {
    let reader = pcap::Reader::new(data)?;
    let linktype = reader.linktype();
    let mut s = Summary::default();
    let mut t0 = None;
    for (i, rec) in reader.enumerate() {
        let n = i + 1;
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                // A capture cut off mid-record (tcpdump killed): report it, keep what we have.
                writeln!(out, "{n:>5} capture ends inside a record: {e}")?;
                s.malformed += 1;
                break;
            }
        };
        let t = rec.ts_ns - *t0.get_or_insert(rec.ts_ns);
        let time = format!("{}.{:06}", t / 1_000_000_000, (t % 1_000_000_000) / 1000);
        let found = frame::ip_payload(linktype, rec.data)
            .and_then(|ip| ip.map_or(Ok(None), |ip| frame::roce_in_ip(ip, opts.port)));
        let f = match found {
            Ok(Some(f)) => f,
            Ok(None) => {
                s.skipped += 1;
                continue;
            }
            Err(e) => {
                // A frame whose IP/UDP headers are broken: we cannot tell whether it is RoCE.
                if opts.per_packet {
                    writeln!(out, "{n:>5} {time} MALFORMED frame: {e}")?;
                }
                s.malformed += 1;
                continue;
            }
        };
        s.roce += 1;
        let src = endpoint(f.encap.ip.src(), f.encap.src_port);
        let dst = endpoint(f.encap.ip.dst(), f.encap.dst_port);
        let repr = match PacketRepr::parse_bytes(f.roce) {
            Ok(r) => r,
            Err(e) => {
                s.malformed += 1;
                if opts.per_packet {
                    writeln!(out, "{n:>5} {time} {src} > {dst} MALFORMED: {e}")?;
                }
                continue;
            }
        };
        let icrc = match f.icrc_status() {
            IcrcStatus::Ok => {
                s.icrc_ok += 1;
                "icrc=ok".to_string()
            }
            IcrcStatus::Bad { carried, computed } => {
                s.icrc_bad += 1;
                format!("icrc=BAD(carried {carried:#010x}, computed {computed:#010x})")
            }
            IcrcStatus::Unverifiable(why) => {
                s.unverifiable += 1;
                format!("icrc=unverifiable({why})")
            }
        };
        if !opts.per_packet {
            continue;
        }
        writeln!(out, "{n:>5} {time} {src} > {dst} {repr} {icrc}")?;
        if opts.verbose {
            let mut ip = String::new();
            match f.encap.ip {
                IpRepr::V4(h) => write!(
                    ip,
                    "    IPv4: tos={:#04x} ttl={} id={:#06x} flags_frag={:#06x}",
                    h.tos, h.ttl, h.ident, h.flags_frag
                )?,
                IpRepr::V6(h) => write!(
                    ip,
                    "    IPv6: traffic_class={:#04x} flow_label={:#07x} hop_limit={}",
                    h.traffic_class, h.flow_label, h.hop_limit
                )?,
            }
            let udp_csum = u16::from_be_bytes([f.udp_header[6], f.udp_header[7]]);
            writeln!(out, "{ip}")?;
            writeln!(
                out,
                "    UDP: sport={} dport={} checksum={udp_csum:#06x}",
                f.encap.src_port, f.encap.dst_port
            )?;
            writeln!(out, "{}", repr.verbose())?;
            let wire = f.roce[f.roce.len() - 4..]
                .iter()
                .fold(String::new(), |mut acc, b| {
                    let _ = write!(acc, "{b:02x}");
                    acc
                });
            writeln!(out, "    ICRC: wire bytes {wire}, {icrc}")?;
        }
    }
    Ok(s)
}

/// The summary line printed after each capture.
pub fn summary_line(name: &str, s: &Summary) -> String {
    format!(
        "{name}: {} RoCEv2 packets: {} ICRC ok, {} bad ICRC, {} unverifiable, {} malformed; {} other frames skipped",
        s.roce, s.icrc_ok, s.icrc_bad, s.unverifiable, s.malformed, s.skipped
    )
}
