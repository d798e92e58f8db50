//! Test harness: two QPs wired back to back, pumped by hand so a test can drop, delay,
//! duplicate, rewrite or inject any packet, with a virtual clock.
#![allow(dead_code)]

pub mod simhost;

use std::time::Duration;

use srdma_proto::qp::AhAttr;
use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_proto::{
    AccessFlags, AttrMask, Ctx, DeviceLimits, MrKeys, MrTable, Mtu, PdId, Qp, QpAttr, QpCaps,
    QpConfig, QpState, QpType, RecvMeta, RecvWr, SendOp, SendWr, Sge, SgeList, Srq, VecMemory, Wc,
};
use srdma_wire::{Encap, IpRepr, PacketRepr, Psn, Qpn};

/// Which end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    A,
    B,
}

impl End {
    pub fn other(self) -> End {
        match self {
            End::A => End::B,
            End::B => End::A,
        }
    }
}

/// One end: a QP with its device's MR table and memory.
pub struct Side {
    pub qp: Qp,
    pub mrs: MrTable,
    pub mem: VecMemory,
    pub srq: Option<Srq>,
    pub pd: PdId,
    pub ip: std::net::IpAddr,
}

/// What the pump does with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    Deliver,
    Drop,
    /// Deliver these bytes instead.
    Replace(Vec<u8>),
    /// Deliver twice.
    Duplicate,
}

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub now: Duration,
    pub limits: DeviceLimits,
    /// Every packet put on the wire, in order: (from, bytes).
    pub log: Vec<(End, Vec<u8>)>,
    /// The virtual time each packet of `log` was put on the wire (same indices).
    pub sent_at: Vec<Duration>,
}

pub const PSN_A: u32 = 0xFF_FFF0; // near the wrap, so every test crosses it
pub const PSN_B: u32 = 0x12_3456;

pub fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    }
}

impl Pair {
    /// Two connected QPs of `ty` at `mtu`, both RTS.
    pub fn new(ty: QpType, mtu: Mtu) -> Pair {
        Self::with(ty, mtu, |_| {})
    }

    /// Like `new`, letting `tweak` change the attributes used for RTR/RTS (timeouts, retries...).
    pub fn with(ty: QpType, mtu: Mtu, tweak: impl Fn(&mut QpAttr)) -> Pair {
        Self::with_config(ty, mtu, |_, _| {}, tweak)
    }

    /// Like `with`, letting `config` also change each end's creation attributes
    /// (`sq_sig_all`, `uses_srq`...). An end created with `uses_srq` gets an empty SRQ of 64
    /// WQEs of 4 SGEs (post with [`Pair::post_srq_recv`]).
    pub fn with_config(
        ty: QpType,
        mtu: Mtu,
        config: impl Fn(End, &mut QpConfig),
        tweak: impl Fn(&mut QpAttr),
    ) -> Pair {
        let limits = DeviceLimits::default();
        let mk = |end: End, qpn: u32, seed: u64, ip: &str| {
            let mut cfg = QpConfig {
                qpn: Qpn::new(qpn),
                qp_type: ty,
                pd: PdId(1),
                caps: caps(),
                sq_sig_all: false,
                uses_srq: false,
                port_mtu: mtu,
            };
            config(end, &mut cfg);
            Side {
                qp: Qp::new(cfg, &limits).unwrap(),
                mrs: MrTable::new(seed),
                mem: VecMemory::new(),
                srq: cfg.uses_srq.then(|| Srq::new(64, 4)),
                pd: PdId(1),
                ip: ip.parse().unwrap(),
            }
        };
        let mut p = Pair {
            a: mk(End::A, 0x11, 1, "10.0.0.1"),
            b: mk(End::B, 0x22, 2, "10.0.0.2"),
            now: Duration::ZERO,
            limits,
            log: Vec::new(),
            sent_at: Vec::new(),
        };
        p.connect(End::A, &tweak);
        p.connect(End::B, &tweak);
        p
    }

    fn connect(&mut self, end: End, tweak: &dyn Fn(&mut QpAttr)) {
        let limits = self.limits.clone();
        let (me, peer) = match end {
            End::A => (&mut self.a, &self.b),
            End::B => (&mut self.b, &self.a),
        };
        let (my_psn, peer_psn) = if end == End::A {
            (PSN_A, PSN_B)
        } else {
            (PSN_B, PSN_A)
        };
        let ty = me.qp.qp_type();
        let mut attr = QpAttr::default();
        attr.qp_access_flags =
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        attr.qkey = 0x1111_1111;
        attr.path_mtu = me.qp.attr().path_mtu;
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.min_rnr_timer = 1;
        attr.max_rd_atomic = 4;
        attr.max_dest_rd_atomic = 4;
        attr.dest_qp_num = peer.qp.qpn();
        attr.rq_psn = Psn::new(peer_psn);
        attr.sq_psn = Psn::new(my_psn);
        attr.ah_attr = AhAttr {
            dgid: gid(peer.ip),
            ..AhAttr::default()
        };
        tweak(&mut attr);
        let (init, rtr, rts) = match ty {
            QpType::Ud => (
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
                AttrMask::STATE,
                AttrMask::STATE | AttrMask::SQ_PSN,
            ),
            QpType::Uc => (
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN,
                AttrMask::STATE | AttrMask::SQ_PSN,
            ),
            QpType::Rc => (
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER,
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::MAX_QP_RD_ATOMIC,
            ),
        };
        for (state, mask) in [
            (QpState::Init, init),
            (QpState::Rtr, rtr),
            (QpState::Rts, rts),
        ] {
            attr.qp_state = state;
            me.qp
                .modify(&attr, mask, &limits)
                .unwrap_or_else(|e| panic!("{state:?}: {e}"));
        }
    }

    pub fn side(&mut self, end: End) -> &mut Side {
        match end {
            End::A => &mut self.a,
            End::B => &mut self.b,
        }
    }

    /// Registers `len` bytes filled with `fill` at a made-up address on `end`.
    pub fn reg(
        &mut self,
        end: End,
        addr: u64,
        len: usize,
        fill: u8,
        access: AccessFlags,
    ) -> MrKeys {
        let s = self.side(end);
        let k = s.mrs.register(s.pd, addr, len as u64, access).unwrap();
        s.mem.insert(k.handle, vec![fill; len]);
        k
    }

    pub fn bytes(&self, end: End, k: &MrKeys) -> &[u8] {
        let s = match end {
            End::A => &self.a,
            End::B => &self.b,
        };
        srdma_proto::VecMemory::region(&s.mem, k.handle).unwrap()
    }

    pub fn bytes_mut(&mut self, end: End, k: &MrKeys) -> &mut [u8] {
        self.side(end).mem.region_mut(k.handle).unwrap()
    }

    pub fn post_send(&mut self, end: End, wr: SendWr) {
        self.side(end).qp.post_send(wr).unwrap();
    }

    pub fn post_recv(&mut self, end: End, wr_id: u64, sges: &[Sge]) {
        self.side(end)
            .qp
            .post_recv(RecvWr {
                wr_id,
                sges: sges.iter().copied().collect(),
            })
            .unwrap();
    }

    /// The next packet `end` wants to send, ICRC filled, with the IP/UDP headers it travels in.
    pub fn transmit(&mut self, end: End) -> Option<(Vec<u8>, Encap)> {
        let now = self.now;
        let s = self.side(end);
        let mut buf = vec![0u8; MAX_PACKET_LEN];
        let mut ctx = Ctx {
            now,
            mrs: &mut s.mrs,
            mem: &mut s.mem,
            srq: s.srq.as_mut(),
        };
        let t = s.qp.poll_transmit(&mut ctx, &mut buf)?;
        buf.truncate(t.len);
        let peer_ip = ip_of(t.dest.dgid);
        let encap = encap(s.ip, peer_ip, t.dest.udp_sport, t.dest.udp_dport);
        srdma_wire::Packet::new_unchecked(&mut buf[..])
            .fill_icrc(&encap)
            .unwrap();
        self.log.push((end, buf.clone()));
        self.sent_at.push(now);
        Some((buf, encap))
    }

    /// Hands `bytes` to `to` as if they arrived in `encap`; a bad ICRC is dropped as the
    /// engine drops it.
    pub fn deliver(&mut self, to: End, bytes: &[u8], encap: Encap) {
        let now = self.now;
        let s = self.side(to);
        let Ok(repr) = PacketRepr::parse_bytes(bytes) else {
            return;
        };
        if srdma_wire::icrc::verify(&encap, bytes).is_err() {
            return;
        }
        let mut ctx = Ctx {
            now,
            mrs: &mut s.mrs,
            mem: &mut s.mem,
            srq: s.srq.as_mut(),
        };
        s.qp.handle_packet(&mut ctx, &repr, &RecvMeta { encap });
    }

    /// Moves packets both ways until neither end has one, asking `fate` about each.
    /// Returns the number of packets moved.
    pub fn pump_with(&mut self, mut fate: impl FnMut(End, &PacketRepr<'_>) -> Fate) -> usize {
        let mut n = 0;
        loop {
            let mut moved = false;
            for end in [End::A, End::B] {
                while let Some((pkt, encap)) = self.transmit(end) {
                    moved = true;
                    n += 1;
                    assert!(n < 1_000_000, "pump does not converge");
                    let repr = PacketRepr::parse_bytes(&pkt).unwrap();
                    match fate(end, &repr) {
                        Fate::Deliver => self.deliver(end.other(), &pkt, encap),
                        Fate::Drop => {}
                        Fate::Replace(mut bytes) => {
                            // The rewritten packet gets a valid ICRC: the test is about the
                            // transport's reaction, not the ICRC check.
                            srdma_wire::Packet::new_unchecked(&mut bytes[..])
                                .fill_icrc(&encap)
                                .unwrap();
                            self.deliver(end.other(), &bytes, encap)
                        }
                        Fate::Duplicate => {
                            self.deliver(end.other(), &pkt, encap);
                            self.deliver(end.other(), &pkt, encap);
                        }
                    }
                }
            }
            if !moved {
                return n;
            }
        }
    }

    pub fn pump(&mut self) -> usize {
        self.pump_with(|_, _| Fate::Deliver)
    }

    /// Advances the clock to the earliest timer of either end and runs it. False if none.
    pub fn fire_next_timer(&mut self) -> bool {
        let next = [self.a.qp.poll_timeout(), self.b.qp.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { return false };
        self.now = self.now.max(t);
        let now = self.now;
        for end in [End::A, End::B] {
            let s = self.side(end);
            let mut ctx = Ctx {
                now,
                mrs: &mut s.mrs,
                mem: &mut s.mem,
                srq: s.srq.as_mut(),
            };
            s.qp.handle_timeout(&mut ctx);
        }
        true
    }

    /// Pumps and fires timers until both ends are idle (or `max_timers` timers fired).
    pub fn settle_with(
        &mut self,
        max_timers: usize,
        mut fate: impl FnMut(End, &PacketRepr<'_>) -> Fate,
    ) {
        self.pump_with(&mut fate);
        for _ in 0..max_timers {
            if !self.fire_next_timer() {
                return;
            }
            self.pump_with(&mut fate);
        }
    }

    pub fn settle(&mut self) {
        self.settle_with(1000, |_, _| Fate::Deliver)
    }

    pub fn completions(&mut self, end: End) -> Vec<Wc> {
        let mut v = Vec::new();
        while let Some((_, wc)) = self.side(end).qp.poll_completion() {
            v.push(wc);
        }
        v
    }
}

pub fn gid(ip: std::net::IpAddr) -> [u8; 16] {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    }
}

pub fn ip_of(gid: [u8; 16]) -> std::net::IpAddr {
    let v6 = std::net::Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    }
}

pub fn encap(src: std::net::IpAddr, dst: std::net::IpAddr, sport: u16, dport: u16) -> Encap {
    Encap {
        ip: IpRepr::between(src, dst).unwrap(),
        src_port: sport,
        dst_port: dport,
    }
}

pub fn sge(k: &MrKeys, addr: u64, length: u32) -> Sge {
    Sge {
        addr,
        length,
        lkey: k.lkey,
    }
}

pub fn send(wr_id: u64, sges: &[Sge]) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::Send,
        sges.iter().copied().collect::<SgeList>(),
    )
}

pub fn wr(wr_id: u64, op: SendOp, sges: &[Sge]) -> SendWr {
    SendWr::new(wr_id, op, sges.iter().copied().collect::<SgeList>())
}

pub const LOCAL: AccessFlags = AccessFlags::LOCAL_WRITE;

pub fn all_remote() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Pair {
    /// The packet log, one decoded line each (for failure messages).
    pub fn trace(&self) -> String {
        let mut s = String::new();
        for (end, b) in &self.log {
            let line =
                PacketRepr::parse_bytes(b).map_or_else(|e| format!("<{e}>"), |r| r.to_string());
            s += &format!("{end:?}> {line}\n");
        }
        s
    }
}

/// Brings a fresh RC QP to RTS towards `dest_qpn` at `peer` (the attributes `ibv_rc_pingpong`
/// uses, with `timeout`), as a connection manager would.
pub fn rc_connect(
    qp: &mut Qp,
    dest_qpn: Qpn,
    peer: std::net::IpAddr,
    sq_psn: u32,
    rq_psn: u32,
    mtu: Mtu,
    timeout: u8,
) {
    let limits = DeviceLimits::default();
    let mut attr = QpAttr {
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        path_mtu: mtu,
        timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        dest_qp_num: dest_qpn,
        rq_psn: Psn::new(rq_psn),
        sq_psn: Psn::new(sq_psn),
        ah_attr: AhAttr {
            dgid: gid(peer),
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let steps = [
        (
            QpState::Init,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        ),
        (
            QpState::Rtr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        ),
        (
            QpState::Rts,
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC,
        ),
    ];
    for (state, mask) in steps {
        attr.qp_state = state;
        qp.modify(&attr, mask, &limits).unwrap();
    }
}

/// A decoded entry of the packet log.
#[derive(Debug, Clone, Copy)]
pub struct Sent<'a> {
    /// Index in `Pair::log`.
    pub index: usize,
    /// Who sent it.
    pub from: End,
    /// When (virtual time).
    pub at: Duration,
    /// The packet.
    pub pkt: PacketRepr<'a>,
}

impl Pair {
    /// The packet log, decoded, with send times.
    pub fn sent(&self) -> Vec<Sent<'_>> {
        self.log
            .iter()
            .zip(&self.sent_at)
            .enumerate()
            .map(|(index, ((from, b), &at))| Sent {
                index,
                from: *from,
                at,
                pkt: PacketRepr::parse_bytes(b).expect("the log holds valid packets"),
            })
            .collect()
    }

    /// The decoded packets `from` sent, in order.
    pub fn sent_by(&self, from: End) -> Vec<Sent<'_>> {
        self.sent().into_iter().filter(|s| s.from == from).collect()
    }

    /// Builds `repr` as it would travel from `from` to the other end (valid ICRC) and hands it
    /// to the other end. Injected packets are not added to the log.
    pub fn inject(&mut self, from: End, repr: &PacketRepr<'_>) {
        let (src, dst) = match from {
            End::A => (self.a.ip, self.b.ip),
            End::B => (self.b.ip, self.a.ip),
        };
        let encap = encap(src, dst, 0xC000, srdma_wire::ROCEV2_PORT);
        let mut bytes = craft(repr);
        srdma_wire::Packet::new_unchecked(&mut bytes[..])
            .fill_icrc(&encap)
            .unwrap();
        self.deliver(from.other(), &bytes, encap);
    }

    /// Advances the virtual clock to `t` (never backwards) and runs both ends' timers that are
    /// due, whether or not one is due at exactly `t`.
    pub fn run_timers_at(&mut self, t: Duration) {
        self.now = self.now.max(t);
        let now = self.now;
        for end in [End::A, End::B] {
            let s = self.side(end);
            let mut ctx = Ctx {
                now,
                mrs: &mut s.mrs,
                mem: &mut s.mem,
                srq: s.srq.as_mut(),
            };
            s.qp.handle_timeout(&mut ctx);
        }
    }

    /// Posts a receive WQE to `end`'s shared receive queue.
    pub fn post_srq_recv(&mut self, end: End, wr_id: u64, sges: &[Sge]) {
        self.side(end)
            .srq
            .as_mut()
            .expect("this end was created with uses_srq")
            .post(RecvWr {
                wr_id,
                sges: sges.iter().copied().collect(),
            })
            .unwrap();
    }

    /// Modifies `end`'s QP to `state` with STATE only (RESET, ERR).
    pub fn set_state(&mut self, end: End, state: QpState) {
        let limits = self.limits.clone();
        let attr = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        self.side(end)
            .qp
            .modify(&attr, AttrMask::STATE, &limits)
            .unwrap();
    }
}

/// The bytes of `repr` (zero ICRC): for rewriting a packet in `Fate::Replace`.
pub fn craft(repr: &PacketRepr<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).expect("a well-formed packet");
    buf.truncate(n);
    buf
}
