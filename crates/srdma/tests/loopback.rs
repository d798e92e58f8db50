//! Two srdma processes over loopback, IPv4 and IPv6: every operation of the transport, many
//! message sizes, three path MTUs, the data and every completion checked on both sides.
//!
//! Operations: on RC, SEND, SEND with immediate, RDMA WRITE, WRITE with immediate, RDMA READ,
//! compare-and-swap (hit and miss) and fetch-and-add; on UC, SEND, SEND with immediate, WRITE
//! and WRITE with immediate; on UD, SEND and SEND with immediate, the 40-byte GRH area of the
//! receive buffer checked. Sizes 0, 1, 3, 4, 255, 1024, 1025, 4096, 64 KiB and 1 MiB (UC up
//! to 64 KiB, UD up to the MTU) at MTU 256, 1024 and 4096; PSNs start near the 24-bit wrap so
//! large messages cross it.
//!
//! How: the test re-executes its own binary with `SRDMA_LOOPBACK_PEER` set, running only
//! [`peer_process`] (a no-op otherwise). The two processes exchange their QP numbers, PSNs,
//! GIDs, UDP ports and [`RemoteMr`] descriptors over a TCP control connection and then run
//! the same deterministic script. In each step one process is the requester and the other
//! the target; the target prepares (posts a receive, fills guard bytes or the data to be
//! read), says `READY`, the requester posts the work request, waits for its completion,
//! checks it and any data it brought back, says `DONE`, and the target checks what arrived:
//! receive completion (status, opcode, byte_len, immediate, flags, source QP), data, and the
//! guard bytes around it. Every wait is bounded; the child is killed if the test fails.
//!
//! IPv4 uses 127.0.10.1 and 127.0.10.2, UDP port 4791 each; IPv6 uses ::1 with two different
//! ports ([`RemoteQp::port`]). Set `SRDMA_LOOPBACK_PCAP_DIR` to capture every packet.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, CompChannel, ConnectParams, Cq, Device, DeviceConfig, Gid, Mr, Mtu, Qp, QpInit,
    QpState, QpType, RKey, RecvWr, RemoteMr, RemoteQp, SendOp, SendWr, SgeList, UdDest, Wc,
    WcFlags, WcOpcode, WcStatus,
};
use srdma_wire::{Psn, Qpn};

use common::KillOnDrop;

/// Set in the child: `<control address> <v4|v6>`.
const PEER_ENV: &str = "SRDMA_LOOPBACK_PEER";
/// Longest wait for one completion (a 1 MiB message at MTU 256 is 4096 packets).
const WC_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for a control message (longer than a completion wait on the other side).
const CTRL_TIMEOUT: Duration = Duration::from_secs(40);
/// Message sizes.
const SIZES: [usize; 10] = [0, 1, 3, 4, 255, 1024, 1025, 4096, 65536, 1 << 20];
/// Largest UC message: UC has no retransmission, so keep bursts well inside socket buffers.
const UC_MAX: usize = 65536;
/// Bytes before every buffer used (room for the guard in front).
const BASE: usize = 64;
/// Guard bytes checked on both sides of every region the remote side may write.
const GUARD: usize = 16;
/// Receive buffers are this much longer than the message (byte_len must still be exact).
const SLACK: usize = 7;
/// What guard bytes hold.
const SENTINEL: u8 = 0xA5;
/// Size of each memory region: the largest message, GRH, offsets and guards fit.
const MR_LEN: usize = (1 << 20) + 4096;
/// The UD Q_Key.
const QKEY: u32 = 0x1111_1111;
/// UD GRH area.
const GRH_LEN: usize = 40;

type R<T = ()> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// The parent test process is side A, the re-executed peer side B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }

    fn parse(s: &str) -> Option<Family> {
        match s {
            "v4" => Some(Family::V4),
            "v6" => Some(Family::V6),
            _ => None,
        }
    }

    /// Where `side`'s device binds.
    fn bind(self, side: Side) -> (IpAddr, u16) {
        match (self, side) {
            (Family::V4, Side::A) => (IpAddr::V4(Ipv4Addr::new(127, 0, 10, 1)), 4791),
            (Family::V4, Side::B) => (IpAddr::V4(Ipv4Addr::new(127, 0, 10, 2)), 4791),
            (Family::V6, _) => (IpAddr::V6(Ipv6Addr::LOCALHOST), 0),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Control connection
// ---------------------------------------------------------------------------------------

/// Line-oriented control connection between the two processes.
struct Ctrl {
    rd: BufReader<TcpStream>,
    wr: TcpStream,
}

impl Ctrl {
    fn new(s: TcpStream) -> R<Ctrl> {
        s.set_nonblocking(false).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(CTRL_TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(CTRL_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        let wr = s.try_clone().map_err(|e| e.to_string())?;
        Ok(Ctrl {
            rd: BufReader::new(s),
            wr,
        })
    }

    fn send(&mut self, line: &str) -> R {
        writeln!(self.wr, "{line}").map_err(|e| format!("control send {line:?}: {e}"))
    }

    fn recv(&mut self) -> R<String> {
        let mut l = String::new();
        match self.rd.read_line(&mut l) {
            Ok(0) => Err("the other process closed the control connection".into()),
            Ok(_) => {
                let l = l.trim_end();
                match l.strip_prefix("FAIL ") {
                    Some(m) => Err(format!("the other process failed: {m}")),
                    None => Ok(l.to_string()),
                }
            }
            Err(e) => Err(format!("control receive (timeout {CTRL_TIMEOUT:?}): {e}")),
        }
    }

    fn expect(&mut self, want: &str) -> R {
        let got = self.recv()?;
        ensure!(got == want, "control: expected {want:?}, got {got:?}");
        Ok(())
    }

    /// Both sides send `tag`, then wait for the other's.
    fn barrier(&mut self, tag: &str) -> R {
        self.send(tag)?;
        self.expect(tag)
    }
}

// ---------------------------------------------------------------------------------------
// The script
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tr {
    Rc,
    Uc,
    Ud,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CmpSwap { hit: bool },
    FetchAdd,
}

impl Op {
    fn is_atomic(self) -> bool {
        matches!(self, Op::CmpSwap { .. } | Op::FetchAdd)
    }

    fn imm(self) -> bool {
        matches!(self, Op::SendImm | Op::WriteImm)
    }

    fn consumes_recv(self) -> bool {
        matches!(self, Op::Send | Op::SendImm | Op::WriteImm)
    }
}

/// One operation of the script; both processes derive the same list.
#[derive(Debug, Clone, Copy)]
struct Step {
    n: usize,
    tr: Tr,
    op: Op,
    len: usize,
    /// The requester.
    by: Side,
    /// Gather entries on the requester / scatter entries on the target.
    parts: usize,
    rparts: usize,
    seed: u64,
    /// Offset in the target's region.
    t_off: usize,
    /// Offset in the requester's local region.
    i_off: usize,
    imm: u32,
}

impl Step {
    /// The 8-byte value an atomic target starts with, and the operands.
    fn atomic_init(&self) -> u64 {
        mix(self.seed ^ 1)
    }

    fn atomic_operand(&self) -> u64 {
        mix(self.seed ^ 2)
    }

    fn cmp_value(&self) -> u64 {
        match self.op {
            Op::CmpSwap { hit: true } => self.atomic_init(),
            _ => self.atomic_init() ^ 0xFFFF_0000_FFFF,
        }
    }

    /// What the target's 8 bytes must hold afterwards.
    fn atomic_result(&self) -> u64 {
        match self.op {
            Op::CmpSwap { hit: true } => self.atomic_operand(),
            Op::CmpSwap { hit: false } => self.atomic_init(),
            Op::FetchAdd => self.atomic_init().wrapping_add(self.atomic_operand()),
            _ => unreachable!(),
        }
    }

    fn recv_wr_id(&self) -> u64 {
        0x7000_0000 + self.n as u64
    }

    fn send_wr_id(&self) -> u64 {
        0x5000_0000 + self.n as u64
    }
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finaliser.
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` pseudo-random bytes from `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut k = 0u64;
    while v.len() < len {
        v.extend_from_slice(&mix(seed ^ k.wrapping_mul(0x1000_0001)).to_le_bytes());
        k += 1;
    }
    v.truncate(len);
    v
}

fn mtu_of(bytes: usize) -> Mtu {
    match bytes {
        256 => Mtu::Mtu256,
        1024 => Mtu::Mtu1024,
        _ => Mtu::Mtu4096,
    }
}

/// The steps at one MTU.
fn script(mtu: usize, mtu_idx: usize) -> Vec<Step> {
    // (transport, operation, length, requester); the requester alternates with the size, the
    // operation and the MTU, so every (operation, size) runs in both directions over the MTUs
    // and each direction sees every size within one MTU.
    let mut plan: Vec<(Tr, Op, usize, usize)> = Vec::new();
    let group = |tr: Tr, ops: &[Op], sizes: &[usize], plan: &mut Vec<_>| {
        for (oi, &op) in ops.iter().enumerate() {
            for (k, &len) in sizes.iter().enumerate() {
                plan.push((tr, op, len, (k + oi + mtu_idx) % 2));
            }
        }
    };
    let rc_ops = [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read];
    group(Tr::Rc, &rc_ops, &SIZES, &mut plan);
    for op in [
        Op::CmpSwap { hit: true },
        Op::CmpSwap { hit: false },
        Op::FetchAdd,
    ] {
        // Once from each side.
        plan.push((Tr::Rc, op, 8, 0));
        plan.push((Tr::Rc, op, 8, 1));
    }
    let uc_sizes: Vec<usize> = SIZES.into_iter().filter(|&l| l <= UC_MAX).collect();
    let uc_ops = [Op::Send, Op::SendImm, Op::Write, Op::WriteImm];
    group(Tr::Uc, &uc_ops, &uc_sizes, &mut plan);
    let mut ud_sizes: Vec<usize> = SIZES.into_iter().filter(|&l| l < mtu).collect();
    ud_sizes.push(mtu);
    group(Tr::Ud, &[Op::Send, Op::SendImm], &ud_sizes, &mut plan);
    plan.into_iter()
        .enumerate()
        .map(|(n, (tr, op, len, dir))| {
            let seed = mix(((mtu as u64) << 32) ^ n as u64);
            let t_off = if op.is_atomic() {
                BASE + ((n * 13) % 8) * 8
            } else {
                BASE + (n * 13) % 61
            };
            Step {
                n,
                tr,
                op,
                len,
                by: if dir == 0 { Side::A } else { Side::B },
                parts: 1 + n % 3,
                rparts: 1 + (n / 3) % 3,
                seed,
                t_off,
                i_off: BASE + (n * 7) % 29,
                imm: mix(seed ^ 3) as u32,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// One process's side of a scenario
// ---------------------------------------------------------------------------------------

/// A QP with its own CQs and completion channel.
struct Ep {
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    chan: CompChannel,
}

impl Ep {
    fn new(node_pd: &srdma::Pd, ty: QpType) -> R<Ep> {
        let dev = node_pd.device();
        let chan = CompChannel::new().map_err(|e| e.to_string())?;
        let scq = dev.create_cq(64, Some(&chan)).map_err(|e| e.to_string())?;
        let rcq = dev.create_cq(64, Some(&chan)).map_err(|e| e.to_string())?;
        let mut init = QpInit::new(ty, &scq, &rcq);
        init.qkey = QKEY;
        let qp = node_pd
            .create_qp(&init)
            .map_err(|e| format!("create {ty:?} QP: {e}"))?;
        Ok(Ep { qp, scq, rcq, chan })
    }

    /// Waits for the next completion on `cq` (one of this endpoint's), bounded.
    fn wait(&self, cq: &Cq, what: &str, dev: &Device) -> R<Wc> {
        let deadline = Instant::now() + WC_TIMEOUT;
        loop {
            if let Some(wc) = cq.poll_one() {
                return Ok(wc);
            }
            cq.req_notify(false);
            if let Some(wc) = cq.poll_one() {
                return Ok(wc);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "no {what} completion within {WC_TIMEOUT:?}; QP {} state {:?}, counters \
                     {:?}; device {:?}",
                    self.qp.qpn(),
                    self.qp.state(),
                    self.qp.counters(),
                    dev.counters()
                ));
            }
            self.chan
                .get_event(Some((deadline - now).min(Duration::from_millis(100))))
                .map_err(|e| format!("get_event: {e}"))?;
        }
    }

    fn check_idle(&self, who: &str) -> R {
        if let Some(wc) = self.scq.poll_one() {
            return Err(format!("{who}: unexpected send completion {wc:?}"));
        }
        if let Some(wc) = self.rcq.poll_one() {
            return Err(format!("{who}: unexpected receive completion {wc:?}"));
        }
        Ok(())
    }
}

/// What the other process announced.
#[derive(Debug, Clone, Copy)]
struct PeerInfo {
    gid: Gid,
    port: u16,
    rc: (Qpn, Psn),
    uc: (Qpn, Psn),
    ud: Qpn,
    mr: RemoteMr,
}

/// One process's device, regions and QPs at one MTU.
struct Node {
    me: Side,
    fam: Family,
    mtu: usize,
    dev: Device,
    /// Requester-local memory: gather source, READ sink, atomic result.
    src: Mr,
    /// The remotely accessible region, also where receives land.
    dst: Mr,
    rc: Ep,
    uc: Ep,
    ud: Ep,
    psns: [u32; 3],
}

impl Node {
    fn open(me: Side, fam: Family, mtu: usize) -> R<Node> {
        let (ip, port) = fam.bind(me);
        let mut cfg = DeviceConfig::new(ip);
        cfg.name = format!("loop{}", if me == Side::A { 'a' } else { 'b' });
        cfg.port = port;
        cfg.mtu = mtu_of(mtu);
        cfg.pcap = std::env::var_os("SRDMA_LOOPBACK_PCAP_DIR").map(|d| {
            std::path::PathBuf::from(d).join(format!("loopback-{}-{mtu}-{me:?}.pcap", fam.name()))
        });
        // The previous scenario's device closed its socket synchronously; still, be patient
        // with a port that is a moment late to free.
        let deadline = Instant::now() + Duration::from_secs(5);
        let dev = loop {
            match Device::open(cfg.clone()) {
                Ok(d) => break d,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(format!("open device on {ip} port {port}: {e}")),
            }
        };
        let pd = dev.alloc_pd();
        let src = pd
            .reg_mr(MR_LEN, AccessFlags::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let dst = pd
            .reg_mr(
                MR_LEN,
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .map_err(|e| e.to_string())?;
        let rc = Ep::new(&pd, QpType::Rc)?;
        let uc = Ep::new(&pd, QpType::Uc)?;
        let ud = Ep::new(&pd, QpType::Ud)?;
        // Start near the 24-bit wrap so that long messages cross it.
        let psns = match me {
            Side::A => [0xFF_F800, 0xFF_FFF0, 0x12_3456],
            Side::B => [0xFF_FE00, 0x00_0007, 0xAB_CDEF],
        };
        ud.qp
            .activate(Psn::new(psns[2]))
            .map_err(|e| format!("activate UD: {e}"))?;
        Ok(Node {
            me,
            fam,
            mtu,
            dev,
            src,
            dst,
            rc,
            uc,
            ud,
            psns,
        })
    }

    fn info_line(&self) -> String {
        let r = self.dst.remote().expect("dst has remote access");
        format!(
            "INFO {} {} {} {} {} {} {} {} {} {}",
            self.dev.local_gid(),
            self.dev.local_addr().port(),
            self.rc.qp.qpn().value(),
            self.psns[0],
            self.uc.qp.qpn().value(),
            self.psns[1],
            self.ud.qp.qpn().value(),
            r.addr,
            r.rkey,
            r.len
        )
    }

    fn parse_info(line: &str) -> R<PeerInfo> {
        let f: Vec<&str> = line.split_whitespace().collect();
        ensure!(f.len() == 11 && f[0] == "INFO", "bad INFO line {line:?}");
        let num = |i: usize| -> R<u64> {
            f[i].parse::<u64>()
                .map_err(|e| format!("INFO field {i} {:?}: {e}", f[i]))
        };
        let gid: Ipv6Addr = f[1].parse().map_err(|e| format!("INFO gid: {e}"))?;
        Ok(PeerInfo {
            gid: Gid(gid.octets()),
            port: num(2)? as u16,
            rc: (Qpn::new(num(3)? as u32), Psn::new(num(4)? as u32)),
            uc: (Qpn::new(num(5)? as u32), Psn::new(num(6)? as u32)),
            ud: Qpn::new(num(7)? as u32),
            mr: RemoteMr {
                addr: num(8)?,
                rkey: num(9)? as u32,
                len: num(10)?,
            },
        })
    }

    fn connect(&self, p: &PeerInfo) -> R {
        let mtu = mtu_of(self.mtu);
        for (ep, (qpn, psn), mine) in [
            (&self.rc, p.rc, self.psns[0]),
            (&self.uc, p.uc, self.psns[1]),
        ] {
            let remote = RemoteQp {
                qpn,
                psn,
                gid: p.gid,
                port: p.port,
            };
            ep.qp
                .connect(&remote, &ConnectParams::new(mtu, Psn::new(mine)))
                .map_err(|e| format!("connect {:?}: {e}", ep.qp.qp_type()))?;
        }
        Ok(())
    }

    fn ep(&self, tr: Tr) -> &Ep {
        match tr {
            Tr::Rc => &self.rc,
            Tr::Uc => &self.uc,
            Tr::Ud => &self.ud,
        }
    }

    fn peer_qpn(p: &PeerInfo, tr: Tr) -> Qpn {
        match tr {
            Tr::Rc => p.rc.0,
            Tr::Uc => p.uc.0,
            Tr::Ud => p.ud,
        }
    }

    fn read(mr: &Mr, off: usize, len: usize) -> R<Vec<u8>> {
        let mut v = vec![0u8; len];
        mr.read(off, &mut v)
            .map_err(|e| format!("read {len} at {off}: {e}"))?;
        Ok(v)
    }

    fn write(mr: &Mr, off: usize, data: &[u8]) -> R {
        mr.write(off, data)
            .map_err(|e| format!("write {} at {off}: {e}", data.len()))
    }

    fn fill(mr: &Mr, off: usize, len: usize) -> R {
        Self::write(mr, off, &vec![SENTINEL; len])
    }

    /// Checks `mr[off..off + len]` still holds guard bytes.
    fn check_guard(mr: &Mr, off: usize, len: usize, what: &str) -> R {
        let g = Self::read(mr, off, len)?;
        if let Some(i) = g.iter().position(|&b| b != SENTINEL) {
            return Err(format!(
                "{what}: byte {} (offset {}) overwritten: {:#04x}",
                i,
                off + i,
                g[i]
            ));
        }
        Ok(())
    }

    fn check_data(got: &[u8], want: &[u8], what: &str) -> R {
        ensure!(
            got.len() == want.len(),
            "{what}: length {} != {}",
            got.len(),
            want.len()
        );
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            let wrong = got.iter().zip(want).filter(|(a, b)| a != b).count();
            return Err(format!(
                "{what}: {wrong} of {} bytes wrong, first at {i}: got {:#04x} want {:#04x}",
                want.len(),
                got[i],
                want[i]
            ));
        }
        Ok(())
    }

    /// `len` bytes at `off` of `mr` as `parts` scatter/gather entries.
    fn sges(mr: &Mr, off: usize, len: usize, parts: usize) -> SgeList {
        let mut l = SgeList::new();
        if len == 0 {
            return l;
        }
        let parts = parts.clamp(1, len);
        let mut at = off;
        for i in 0..parts {
            let n = if i + 1 == parts {
                off + len - at
            } else {
                len / parts
            };
            l.push(mr.sge(at, n));
            at += n;
        }
        l
    }

    /// Receive buffer length the target posts.
    fn recv_len(s: &Step) -> usize {
        match s.tr {
            Tr::Ud => GRH_LEN + s.len + SLACK,
            _ => s.len + SLACK,
        }
    }

    // --- target side -------------------------------------------------------------------

    fn target_prepare(&self, s: &Step) -> R {
        let ep = self.ep(s.tr);
        match s.op {
            Op::Send | Op::SendImm => {
                let n = Self::recv_len(s);
                Self::fill(&self.dst, s.t_off - GUARD, n + 2 * GUARD)?;
                let sges = Self::sges(&self.dst, s.t_off, n, s.rparts);
                ep.qp
                    .post_recv(RecvWr {
                        wr_id: s.recv_wr_id(),
                        sges,
                    })
                    .map_err(|e| format!("post_recv: {e}"))?;
            }
            Op::Write | Op::WriteImm => {
                Self::fill(&self.dst, s.t_off - GUARD, s.len + 2 * GUARD)?;
                if s.op == Op::WriteImm {
                    // WRITE with immediate consumes a receive WQE but places no data in it.
                    ep.qp
                        .post_recv(RecvWr {
                            wr_id: s.recv_wr_id(),
                            sges: SgeList::new(),
                        })
                        .map_err(|e| format!("post_recv: {e}"))?;
                }
            }
            Op::Read => Self::write(&self.dst, s.t_off, &pattern(s.seed, s.len))?,
            Op::CmpSwap { .. } | Op::FetchAdd => {
                Self::fill(&self.dst, s.t_off - GUARD, 8 + 2 * GUARD)?;
                Self::write(&self.dst, s.t_off, &s.atomic_init().to_ne_bytes())?;
            }
        }
        Ok(())
    }

    fn target_verify(&self, s: &Step, p: &PeerInfo) -> R {
        let ep = self.ep(s.tr);
        let want = pattern(s.seed, s.len);
        if s.op.consumes_recv() {
            let wc = ep.wait(&ep.rcq, "receive", &self.dev)?;
            let (opcode, byte_len) = match (s.op, s.tr) {
                (Op::WriteImm, _) => (WcOpcode::RecvRdmaWithImm, s.len),
                (_, Tr::Ud) => (WcOpcode::Recv, GRH_LEN + s.len),
                _ => (WcOpcode::Recv, s.len),
            };
            ensure!(
                wc.wr_id == s.recv_wr_id(),
                "receive wr_id {:#x}: {wc:?}",
                wc.wr_id
            );
            ensure!(
                wc.status == WcStatus::Success,
                "receive status {}: {wc:?}",
                wc.status
            );
            ensure!(
                wc.opcode == opcode,
                "receive opcode {:?} != {opcode:?}: {wc:?}",
                wc.opcode
            );
            ensure!(
                wc.byte_len as usize == byte_len,
                "receive byte_len {} != {byte_len}: {wc:?}",
                wc.byte_len
            );
            ensure!(wc.qp_num == ep.qp.qpn(), "receive qp_num: {wc:?}");
            // UD: the DETH's source QP. RC/UC: rxe leaves it 0 (it only copies a DETH); the
            // peer's QPN would be as good.
            let peer_qpn = Self::peer_qpn(p, s.tr);
            ensure!(
                wc.src_qp == peer_qpn || (s.tr != Tr::Ud && wc.src_qp.value() == 0),
                "receive src_qp {} (peer {peer_qpn}): {wc:?}",
                wc.src_qp
            );
            if s.op.imm() {
                ensure!(
                    wc.imm_data == Some(s.imm) && wc.wc_flags.contains(WcFlags::WITH_IMM),
                    "receive immediate: want {:#x}: {wc:?}",
                    s.imm
                );
            } else {
                ensure!(
                    wc.imm_data.is_none() && !wc.wc_flags.contains(WcFlags::WITH_IMM),
                    "receive carries an immediate: {wc:?}"
                );
            }
            if s.tr == Tr::Ud {
                ensure!(
                    wc.wc_flags.contains(WcFlags::GRH),
                    "UD receive without GRH flag: {wc:?}"
                );
            }
        }
        match s.op {
            Op::Send | Op::SendImm => {
                let n = Self::recv_len(s);
                let data_off = if s.tr == Tr::Ud {
                    self.check_grh(&Self::read(&self.dst, s.t_off, GRH_LEN)?, p, s)?;
                    s.t_off + GRH_LEN
                } else {
                    s.t_off
                };
                Self::check_data(
                    &Self::read(&self.dst, data_off, s.len)?,
                    &want,
                    "received data",
                )?;
                let end = data_off + s.len;
                // The receive buffer's unused tail, and the guards, are untouched.
                Self::check_guard(
                    &self.dst,
                    end,
                    s.t_off + n + GUARD - end,
                    "after the message",
                )?;
                Self::check_guard(&self.dst, s.t_off - GUARD, GUARD, "before the buffer")?;
            }
            Op::Write | Op::WriteImm => {
                if s.tr == Tr::Uc && s.op == Op::Write {
                    // No completion anywhere says a UC WRITE arrived: wait for the bytes.
                    let deadline = Instant::now() + WC_TIMEOUT;
                    while Self::read(&self.dst, s.t_off, s.len)? != want {
                        ensure!(
                            Instant::now() < deadline,
                            "UC WRITE data never arrived (lost?); QP counters {:?}, device {:?}",
                            ep.qp.counters(),
                            self.dev.counters()
                        );
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                Self::check_data(
                    &Self::read(&self.dst, s.t_off, s.len)?,
                    &want,
                    "written data",
                )?;
                Self::check_guard(&self.dst, s.t_off - GUARD, GUARD, "before the target")?;
                Self::check_guard(&self.dst, s.t_off + s.len, GUARD, "after the target")?;
            }
            Op::Read => {
                let got = Self::read(&self.dst, s.t_off, s.len)?;
                Self::check_data(&got, &want, "READ source after the READ")?;
            }
            Op::CmpSwap { .. } | Op::FetchAdd => {
                let got = Self::read(&self.dst, s.t_off, 8)?;
                let v = u64::from_ne_bytes(got.try_into().expect("8 bytes"));
                ensure!(
                    v == s.atomic_result(),
                    "atomic target holds {v:#x}, want {:#x} (initial {:#x})",
                    s.atomic_result(),
                    s.atomic_init()
                );
                Self::check_guard(&self.dst, s.t_off - GUARD, GUARD, "before the atomic")?;
                Self::check_guard(&self.dst, s.t_off + 8, GUARD, "after the atomic")?;
            }
        }
        ep.check_idle("target")
    }

    /// The 40 bytes ahead of a UD message: rxe's layout (IPv4: 20 zero bytes then the IPv4
    /// header; IPv6: the IPv6 header), addresses and lengths of the packet that carried it.
    fn check_grh(&self, g: &[u8], p: &PeerInfo, s: &Step) -> R {
        let pad = s.len.wrapping_neg() & 3;
        let roce = 12 + 8 + if s.op.imm() { 4 } else { 0 } + s.len + pad + 4;
        let be16 = |i: usize| usize::from(u16::from_be_bytes([g[i], g[i + 1]]));
        let src = p.gid.ip();
        let dst = self.dev.local_gid().ip();
        match (self.fam, src, dst) {
            (Family::V4, IpAddr::V4(src), IpAddr::V4(dst)) => {
                ensure!(
                    g[..20].iter().all(|&b| b == 0),
                    "GRH: first 20 bytes not zero: {g:02x?}"
                );
                ensure!(g[20] == 0x45, "GRH: IPv4 version/IHL {:#x}", g[20]);
                ensure!(
                    be16(22) == 20 + 8 + roce,
                    "GRH: IPv4 total length {}",
                    be16(22)
                );
                ensure!(g[29] == 17, "GRH: IPv4 protocol {}", g[29]);
                ensure!(
                    g[32..36] == src.octets(),
                    "GRH: IPv4 source {:?}",
                    &g[32..36]
                );
                ensure!(
                    g[36..40] == dst.octets(),
                    "GRH: IPv4 destination {:?}",
                    &g[36..40]
                );
                let sum: u32 = g[20..40]
                    .chunks(2)
                    .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
                    .sum();
                let folded = (sum & 0xFFFF) + (sum >> 16);
                let folded = (folded & 0xFFFF) + (folded >> 16);
                ensure!(
                    folded == 0xFFFF,
                    "GRH: IPv4 header checksum wrong: {:02x?}",
                    &g[20..]
                );
            }
            (Family::V6, IpAddr::V6(src), IpAddr::V6(dst)) => {
                ensure!(g[0] >> 4 == 6, "GRH: IPv6 version {}", g[0] >> 4);
                ensure!(be16(4) == 8 + roce, "GRH: IPv6 payload length {}", be16(4));
                ensure!(g[6] == 17, "GRH: IPv6 next header {}", g[6]);
                ensure!(g[8..24] == src.octets(), "GRH: IPv6 source {:?}", &g[8..24]);
                ensure!(
                    g[24..40] == dst.octets(),
                    "GRH: IPv6 destination {:?}",
                    &g[24..40]
                );
            }
            other => return Err(format!("GRH: unexpected address family {other:?}")),
        }
        Ok(())
    }

    // --- requester side ----------------------------------------------------------------

    fn requester_prepare(&self, s: &Step) -> R {
        match s.op {
            Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
                Self::write(&self.src, s.i_off, &pattern(s.seed, s.len))
            }
            Op::Read => Self::fill(&self.src, s.i_off - GUARD, s.len + 2 * GUARD),
            Op::CmpSwap { .. } | Op::FetchAdd => {
                Self::fill(&self.src, s.i_off - GUARD, 8 + 2 * GUARD)
            }
        }
    }

    fn requester_run(&self, s: &Step, p: &PeerInfo) -> R {
        let ep = self.ep(s.tr);
        let remote_addr = p.mr.addr + s.t_off as u64;
        let rkey = RKey(p.mr.rkey);
        let op = match s.op {
            Op::Send => SendOp::Send,
            Op::SendImm => SendOp::SendWithImm { imm: s.imm },
            Op::Write => SendOp::Write { remote_addr, rkey },
            Op::WriteImm => SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: s.imm,
            },
            Op::Read => SendOp::Read { remote_addr, rkey },
            Op::CmpSwap { .. } => SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare: s.cmp_value(),
                swap: s.atomic_operand(),
            },
            Op::FetchAdd => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: s.atomic_operand(),
            },
        };
        let sges = if s.op.is_atomic() {
            SgeList::one(self.src.sge(s.i_off, 8))
        } else {
            Self::sges(&self.src, s.i_off, s.len, s.parts)
        };
        let mut wr = SendWr::new(s.send_wr_id(), op, sges);
        if s.tr == Tr::Ud {
            let mut ah = srdma::ah(p.gid);
            ah.udp_dport = p.port;
            wr = wr.to_ud(UdDest {
                ah,
                remote_qpn: p.ud,
                remote_qkey: QKEY,
            });
        }
        ep.qp.post_send(wr).map_err(|e| format!("post_send: {e}"))?;
        let wc = ep.wait(&ep.scq, "send", &self.dev)?;
        let opcode = match s.op {
            Op::Send | Op::SendImm => WcOpcode::Send,
            Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
            Op::Read => WcOpcode::RdmaRead,
            Op::CmpSwap { .. } => WcOpcode::CompSwap,
            Op::FetchAdd => WcOpcode::FetchAdd,
        };
        ensure!(
            wc.wr_id == s.send_wr_id(),
            "send wr_id {:#x}: {wc:?}",
            wc.wr_id
        );
        ensure!(
            wc.status == WcStatus::Success,
            "send status {}: {wc:?}",
            wc.status
        );
        ensure!(
            wc.opcode == opcode,
            "send opcode {:?} != {opcode:?}: {wc:?}",
            wc.opcode
        );
        ensure!(
            wc.byte_len as usize == s.len,
            "send byte_len {} != {}: {wc:?}",
            wc.byte_len,
            s.len
        );
        ensure!(wc.qp_num == ep.qp.qpn(), "send qp_num: {wc:?}");
        match s.op {
            Op::Read => {
                let got = Self::read(&self.src, s.i_off, s.len)?;
                Self::check_data(&got, &pattern(s.seed, s.len), "READ data")?;
                Self::check_guard(&self.src, s.i_off - GUARD, GUARD, "before the READ sink")?;
                Self::check_guard(&self.src, s.i_off + s.len, GUARD, "after the READ sink")?;
            }
            Op::CmpSwap { .. } | Op::FetchAdd => {
                let got = Self::read(&self.src, s.i_off, 8)?;
                let v = u64::from_ne_bytes(got.try_into().expect("8 bytes"));
                ensure!(
                    v == s.atomic_init(),
                    "atomic returned {v:#x}, want the original {:#x}",
                    s.atomic_init()
                );
                Self::check_guard(
                    &self.src,
                    s.i_off - GUARD,
                    GUARD,
                    "before the atomic result",
                )?;
                Self::check_guard(&self.src, s.i_off + 8, GUARD, "after the atomic result")?;
            }
            _ => {}
        }
        Ok(())
    }

    fn step(&self, s: &Step, p: &PeerInfo, ctrl: &mut Ctrl) -> R {
        if s.by == self.me {
            self.requester_prepare(s)?;
            ctrl.expect(&format!("READY {}", s.n))?;
            self.requester_run(s, p)?;
            self.ep(s.tr).check_idle("requester")?;
            ctrl.send(&format!("DONE {}", s.n))?;
            ctrl.expect(&format!("OK {}", s.n))
        } else {
            self.target_prepare(s)?;
            ctrl.send(&format!("READY {}", s.n))?;
            ctrl.expect(&format!("DONE {}", s.n))?;
            self.target_verify(s, p)?;
            ctrl.send(&format!("OK {}", s.n))
        }
    }

    /// No packet between the two processes was malformed, had a bad ICRC or came from the
    /// wrong address; no RC/UC QP failed.
    fn check_health(&self) -> R {
        let c = self.dev.counters();
        ensure!(
            c.rx_malformed == 0 && c.rx_bad_icrc == 0 && c.rx_bad_source == 0,
            "device counters show bad packets: {c:?}"
        );
        for ep in [&self.rc, &self.uc, &self.ud] {
            let q = ep.qp.counters();
            ensure!(
                q.send_err == 0 && q.retry_exceeded_err == 0 && q.bad_pkey == 0,
                "{:?} QP counters show errors: {q:?}",
                ep.qp.qp_type()
            );
            ensure!(
                ep.qp.state() == QpState::Rts,
                "{:?} QP left RTS: {:?}",
                ep.qp.qp_type(),
                ep.qp.state()
            );
        }
        Ok(())
    }
}

/// Statistics of one process's run.
#[derive(Debug, Default)]
struct Summary {
    steps: usize,
    bytes: usize,
    retransmissions: u64,
    datagrams: u64,
}

fn session_inner(me: Side, fam: Family, ctrl: &mut Ctrl) -> R<Summary> {
    let mut sum = Summary::default();
    for (mtu_idx, mtu) in [256usize, 1024, 4096].into_iter().enumerate() {
        let node = Node::open(me, fam, mtu)?;
        ctrl.send(&node.info_line())?;
        let peer = Node::parse_info(&ctrl.recv()?)?;
        node.connect(&peer)?;
        ctrl.barrier(&format!("CONNECTED {mtu}"))?;
        for s in script(mtu, mtu_idx) {
            node.step(&s, &peer, ctrl).map_err(|e| {
                format!(
                    "[{} side {me:?}] {} MTU {mtu} step {} {:?} {:?} {} bytes, requester {:?}: \
                     {e}",
                    fam.name(),
                    fam.name(),
                    s.n,
                    s.tr,
                    s.op,
                    s.len,
                    s.by
                )
            })?;
            sum.steps += 1;
            sum.bytes += s.len;
        }
        node.check_health()
            .map_err(|e| format!("[{} side {me:?}] MTU {mtu}: {e}", fam.name()))?;
        sum.retransmissions += node.dev.qp_counters().completer_retry_err;
        sum.datagrams += node.dev.counters().tx_datagrams;
        ctrl.barrier(&format!("END {mtu}"))?;
    }
    ctrl.barrier("BYE")?;
    Ok(sum)
}

/// Runs one side; on failure tells the other process why.
fn session(me: Side, fam: Family, ctrl: &mut Ctrl) -> R<Summary> {
    let r = session_inner(me, fam, ctrl);
    if let Err(e) = &r {
        if !e.contains("the other process failed") {
            let _ = ctrl.send(&format!("FAIL {}", e.replace('\n', " ")));
        }
    }
    r
}

// ---------------------------------------------------------------------------------------
// Process management
// ---------------------------------------------------------------------------------------

/// The peer process's control connection, within 30 s, or why it never came.
fn accept(listener: &TcpListener, child: &mut Child) -> R<TcpStream> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match listener.accept() {
            Ok((s, _)) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(st)) = child.try_wait() {
                    return Err(format!("the peer process exited before connecting: {st}"));
                }
                ensure!(
                    Instant::now() < deadline,
                    "the peer process never connected"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> R<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => return Err(format!("the peer process did not exit within {timeout:?}")),
            Err(e) => return Err(format!("waiting for the peer process: {e}")),
        }
    }
}

/// The parent side: spawn the peer, run the script, collect the peer's verdict.
fn two_processes(fam: Family) {
    let started = Instant::now();
    let listener = TcpListener::bind("127.0.0.1:0").expect("control listener");
    let ctl: SocketAddr = listener.local_addr().expect("control address");
    let log = std::env::temp_dir().join(format!(
        "srdma-loopback-{}-{}.log",
        fam.name(),
        std::process::id()
    ));
    let out = File::create(&log).expect("peer log file");
    let child = Command::new(std::env::current_exe().expect("test binary path"))
        .args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, format!("{ctl} {}", fam.name()))
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log handle"))
        .stderr(out)
        .spawn()
        .expect("spawning the peer process");
    let mut child = KillOnDrop(child);
    let result = accept(&listener, &mut child.0)
        .and_then(Ctrl::new)
        .and_then(|mut ctrl| session(Side::A, fam, &mut ctrl));
    let exit = match &result {
        // Give a failed peer a moment to report, then kill it.
        Err(_) => wait_exit(&mut child.0, Duration::from_secs(2)),
        Ok(_) => wait_exit(&mut child.0, Duration::from_secs(20)),
    };
    drop(child);
    let peer_log = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match (result, exit) {
        (Ok(sum), Ok(st)) if st.success() => {
            println!(
                "{}: {} steps, {} payload bytes, {} datagrams sent, {} retransmission \
                 sequences, {:.2?}",
                fam.name(),
                sum.steps,
                sum.bytes,
                sum.datagrams,
                sum.retransmissions,
                started.elapsed()
            );
        }
        (Ok(_), st) => panic!("the peer process failed ({st:?})\n--- peer output ---\n{peer_log}"),
        (Err(e), _) => panic!("{e}\n--- peer output ---\n{peer_log}"),
    }
}

/// The peer role: a no-op unless this binary was re-executed by [`two_processes`].
#[test]
fn peer_process() {
    let Ok(spec) = std::env::var(PEER_ENV) else {
        return;
    };
    let mut it = spec.split_whitespace();
    let ctl: SocketAddr = it
        .next()
        .and_then(|s| s.parse().ok())
        .expect("control address");
    let fam = it.next().and_then(Family::parse).expect("address family");
    let stream =
        TcpStream::connect_timeout(&ctl, Duration::from_secs(10)).expect("control connection");
    let mut ctrl = Ctrl::new(stream).expect("control setup");
    if let Err(e) = session(Side::B, fam, &mut ctrl) {
        panic!("peer: {e}");
    }
}

/// Two processes on 127.0.10.1:4791 and 127.0.10.2:4791: every RC, UC and UD operation at
/// every size and MTU, data and completions checked on both sides.
#[test]
fn two_processes_ipv4() {
    two_processes(Family::V4);
}

/// Two processes on ::1 with different UDP ports: every RC, UC and UD operation at every
/// size and MTU, data and completions checked on both sides.
#[test]
fn two_processes_ipv6() {
    two_processes(Family::V6);
}
