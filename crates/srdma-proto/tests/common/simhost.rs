//! A simulated host for srdma-sim: QPs, an MR table and memory behind an `Endpoint`, doing
//! what the UDP engine will do — ICRC fill and check, dispatch by destination QPN.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_proto::{Ctx, MrTable, Qp, RecvMeta, VecMemory};
use srdma_sim::{Endpoint, Instant, Transmit};
use srdma_wire::{Encap, IpRepr, Packet, PacketRepr};

pub struct Host {
    pub ip: IpAddr,
    pub mrs: MrTable,
    pub mem: VecMemory,
    pub qps: Vec<Qp>,
    by_qpn: BTreeMap<u32, usize>,
    next: usize,
    /// Datagrams dropped for a bad ICRC or a parse error.
    pub rx_bad: u64,
    /// Datagrams for an unknown QP.
    pub rx_no_qp: u64,
    /// Skip the ICRC (fill and check). Only for the benchmark that separates the transport's
    /// own cost from the CRC's; every test keeps it on.
    pub icrc: bool,
    /// Packet buffer, zeroed once: the sim's buffers arrive empty and zero-filling 4 KiB per
    /// packet would dominate the run.
    scratch: Vec<u8>,
    /// Send every packet ECN-capable (ECT(0)), as RoCE NICs do.
    pub ect: bool,
}

impl Host {
    pub fn new(ip: IpAddr, seed: u64) -> Host {
        Host {
            ip,
            mrs: MrTable::new(seed),
            mem: VecMemory::new(),
            qps: Vec::new(),
            by_qpn: BTreeMap::new(),
            next: 0,
            rx_bad: 0,
            rx_no_qp: 0,
            icrc: true,
            scratch: vec![0; MAX_PACKET_LEN],
            ect: true,
        }
    }

    pub fn add_qp(&mut self, qp: Qp) -> usize {
        self.by_qpn.insert(qp.qpn().value(), self.qps.len());
        self.qps.push(qp);
        self.qps.len() - 1
    }

    pub fn qp(&mut self, qpn: u32) -> &mut Qp {
        let i = self.by_qpn[&qpn];
        &mut self.qps[i]
    }
}

fn encap(src: SocketAddr, dst: SocketAddr) -> Encap {
    encap_ecn(src, dst, 0)
}

/// The encapsulation with the ECN codepoint `ecn` in the traffic class.
fn encap_ecn(src: SocketAddr, dst: SocketAddr, ecn: u8) -> Encap {
    let mut ip = IpRepr::between(src.ip(), dst.ip()).unwrap();
    match &mut ip {
        IpRepr::V4(h) => h.tos = ecn,
        IpRepr::V6(h) => h.traffic_class = ecn,
    }
    Encap {
        ip,
        src_port: src.port(),
        dst_port: dst.port(),
    }
}

pub fn ip_of(gid: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(gid);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

fn now_of(t: Instant) -> Duration {
    t.since_start()
}

impl Endpoint for Host {
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: SocketAddr, payload: &[u8]) {
        self.handle_datagram_ecn(now, src, dst, 0, payload);
    }

    fn handle_datagram_ecn(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: SocketAddr,
        ecn: u8,
        payload: &[u8],
    ) {
        let encap = encap_ecn(src, dst, ecn);
        if self.icrc && srdma_wire::icrc::verify(&encap, payload).is_err() {
            self.rx_bad += 1;
            return;
        }
        let Ok(repr) = PacketRepr::parse_bytes(payload) else {
            self.rx_bad += 1;
            return;
        };
        let Some(&i) = self.by_qpn.get(&repr.bth.dest_qpn.value()) else {
            self.rx_no_qp += 1;
            return;
        };
        let mut ctx = Ctx {
            now: now_of(now),
            mrs: &mut self.mrs,
            mem: &mut self.mem,
            srq: None,
        };
        self.qps[i].handle_packet(&mut ctx, &repr, &RecvMeta { encap });
    }

    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        let n = self.qps.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if !self.qps[i].wants_transmit() {
                continue;
            }
            let mut ctx = Ctx {
                now: now_of(now),
                mrs: &mut self.mrs,
                mem: &mut self.mem,
                srq: None,
            };
            if let Some(t) = self.qps[i].poll_transmit(&mut ctx, &mut self.scratch) {
                self.next = i + 1;
                let pkt = &mut self.scratch[..t.len];
                let src = SocketAddr::new(self.ip, t.dest.udp_sport);
                let dst = SocketAddr::new(ip_of(t.dest.dgid), t.dest.udp_dport);
                Packet::new_unchecked(&mut *pkt)
                    .fill_icrc(&encap(src, dst))
                    .unwrap();
                buf.clear();
                buf.extend_from_slice(pkt);
                let ecn = if self.ect { srdma_sim::ecn::ECT0 } else { 0 };
                return Some(Transmit { src, dst, ecn });
            }
        }
        None
    }

    fn poll_timeout(&mut self) -> Option<Instant> {
        self.qps
            .iter()
            .filter_map(|q| q.poll_timeout())
            .min()
            .map(|d| Instant::from_nanos(d.as_nanos() as u64))
    }

    fn handle_timeout(&mut self, now: Instant) {
        for qp in &mut self.qps {
            let mut ctx = Ctx {
                now: now_of(now),
                mrs: &mut self.mrs,
                mem: &mut self.mem,
                srq: None,
            };
            qp.handle_timeout(&mut ctx);
        }
    }
}
