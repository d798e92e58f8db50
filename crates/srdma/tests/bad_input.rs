//! Hostile input: whatever arrives on a device's UDP port — random garbage, truncated
//! headers, bad ICRCs, well-formed packets for QPs that do not exist, with a wrong P_Key or
//! Q_Key, from an address that is not the QP's peer, with stale or far-future PSNs, and
//! floods of all of them — never crashes the engine and never disturbs a healthy QP; the
//! device and QP counters record every packet dropped.
//!
//! Each test runs a healthy RC pair (devices A and B in this process) moving data both ways
//! in a background thread, checking every byte and completion, while a plain
//! [`UdpSocket`] fires packets at A. Well-formed attack packets carry a correct ICRC for the
//! socket they are sent from (IPv4 ID 0, as a receiver reconstructs it), built with
//! [`PacketRepr::emit_with_icrc`]. Afterwards the healthy pair must have moved data the
//! whole time, a zero-filled "canary" region the attacks aimed RDMA WRITEs at must still be
//! zero, and a fresh QP pair on the same devices must work (the engine thread is alive).
//!
//! Addresses: 127.0.11.x, 127.0.12.x, 127.0.13.x (one /24 per test) and ::1, every device
//! on an ephemeral UDP port, so the tests can run in parallel with anything.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, CompChannel, ConnectParams, Cq, Device, DeviceConfig, DeviceCounters, Mr, Mtu, Qp,
    QpInit, QpState, QpType, RKey, RecvWr, RemoteQp, SendOp, SendWr, SgeList, Wc, WcOpcode,
    WcStatus,
};
use srdma_wire::{
    AethRepr, AtomicEthRepr, BthRepr, DethRepr, Encap, IpRepr, NakCode, Opcode, PacketRepr, Psn,
    Qpn, RethRepr, Syndrome,
};

mod common;
use common::remote;

/// First send PSN of A's healthy QP.
const PSN_A: u32 = 0x10_0000;
/// First send PSN of B's healthy QP (A's expected receive PSN).
const PSN_B: u32 = 0x20_0000;
/// Healthy message sizes, cycled.
const SIZES: [usize; 6] = [1, 100, 1024, 4000, 20_000, 65_536];
/// Region size: two messages of the largest size.
const BUF: usize = 2 * 65_536;
/// Longest wait for one completion.
const WC_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for the engine to count what was sent.
const COUNT_TIMEOUT: Duration = Duration::from_secs(10);
/// The UD Q_Key.
const QKEY: u32 = 0x1111_1111;

type R<T = ()> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn v4(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, c, d))
}

/// xorshift64*: reproducible garbage.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    r.bytes(len)
}

fn open(ip: IpAddr) -> Device {
    let mut cfg = DeviceConfig::new(ip);
    cfg.port = 0;
    // `SRDMA_BAD_INPUT_PCAP_DIR`: capture every device's packets, one file per address.
    static OPENED: AtomicUsize = AtomicUsize::new(0);
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    cfg.pcap = std::env::var_os("SRDMA_BAD_INPUT_PCAP_DIR")
        .map(|d| std::path::PathBuf::from(d).join(format!("bad-input-{ip}-{n}.pcap")));
    Device::open(cfg).unwrap_or_else(|e| panic!("opening a device on {ip}: {e}"))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool, detail: impl Fn() -> String) -> R {
    let deadline = Instant::now() + COUNT_TIMEOUT;
    while !cond() {
        ensure!(
            Instant::now() < deadline,
            "{what}: not reached within {COUNT_TIMEOUT:?}; {}",
            detail()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The healthy pair
// ---------------------------------------------------------------------------------------

/// One end of an RC connection with its regions.
struct End {
    dev: Device,
    qp: Qp,
    scq: Cq,
    rcq: Cq,
    chan: CompChannel,
    /// Local source / READ sink.
    src: Mr,
    /// Remote-writable region; receives land here too.
    dst: Mr,
}

impl End {
    fn new(dev: &Device) -> End {
        let pd = dev.alloc_pd();
        let chan = CompChannel::new().unwrap();
        let scq = dev.create_cq(64, Some(&chan)).unwrap();
        let rcq = dev.create_cq(64, Some(&chan)).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &scq, &rcq)).unwrap();
        let src = pd.reg_mr(BUF, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = pd
            .reg_mr(
                BUF,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        End {
            dev: dev.clone(),
            qp,
            scq,
            rcq,
            chan,
            src,
            dst,
        }
    }

    fn wait(&self, cq: &Cq, what: &str) -> R<Wc> {
        self.wait_for(cq, what, WC_TIMEOUT)
    }

    fn wait_for(&self, cq: &Cq, what: &str, timeout: Duration) -> R<Wc> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(wc) = cq.poll_one() {
                return Ok(wc);
            }
            cq.req_notify(false);
            if let Some(wc) = cq.poll_one() {
                return Ok(wc);
            }
            let now = Instant::now();
            ensure!(
                now < deadline,
                "no {what} completion within {timeout:?}; QP {} {:?} {:?}; device {:?}",
                self.qp.qpn(),
                self.qp.state(),
                self.qp.counters(),
                self.dev.counters()
            );
            self.chan
                .get_event(Some((deadline - now).min(Duration::from_millis(50))))
                .map_err(|e| e.to_string())?;
        }
    }

    fn read(mr: &Mr, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        mr.read(off, &mut v).unwrap();
        v
    }
}

/// Connects two fresh RC QPs on `a` and `b` (ACK timeout 16 ≈ 270 ms, 7 retries: a flood
/// that overflows the socket buffer for a while costs retransmissions, not the QP).
fn connect_pair(a: &Device, b: &Device, psn_a: u32, psn_b: u32) -> (End, End) {
    let (ea, eb) = (End::new(a), End::new(b));
    let mut pa = ConnectParams::new(Mtu::Mtu1024, Psn::new(psn_a));
    pa.timeout = 16;
    pa.max_rd_atomic = 4;
    pa.max_dest_rd_atomic = 4;
    let mut pb = pa;
    pb.sq_psn = Psn::new(psn_b);
    ea.qp.connect(&remote(b, eb.qp.qpn(), psn_b), &pa).unwrap();
    eb.qp.connect(&remote(a, ea.qp.qpn(), psn_a), &pb).unwrap();
    (ea, eb)
}

fn check_wc(wc: &Wc, wr_id: u64, opcode: WcOpcode, len: usize, what: &str) -> R {
    ensure!(
        wc.wr_id == wr_id
            && wc.status == WcStatus::Success
            && wc.opcode == opcode
            && wc.byte_len as usize == len,
        "{what}: want wr_id {wr_id:#x} success {opcode:?} {len} bytes, got {wc:?}"
    );
    Ok(())
}

fn check_data(got: &[u8], want: &[u8], what: &str) -> R {
    if let Some(i) = got.iter().zip(want).position(|(x, y)| x != y) {
        return Err(format!(
            "{what}: byte {i} of {} wrong ({:#04x}, want {:#04x})",
            want.len(),
            got[i],
            want[i]
        ));
    }
    ensure!(got.len() == want.len(), "{what}: length");
    Ok(())
}

/// One round of healthy traffic, every byte and completion checked: A WRITEs to B, B SENDs
/// to A, B WRITEs to A, A READs back what it wrote.
fn round(a: &End, b: &End, i: usize) -> R {
    let len = SIZES[i % SIZES.len()];
    let id = (i as u64) << 8;
    let p0 = pattern(id | 1, len);
    let p1 = pattern(id | 2, len);
    let p2 = pattern(id | 3, len);
    let rk = |mr: &Mr| RKey(mr.rkey().expect("remote access").0);

    // A WRITEs to B.
    a.src.write(0, &p0).unwrap();
    let op = SendOp::Write {
        remote_addr: b.dst.addr(),
        rkey: rk(&b.dst),
    };
    a.qp.post_send(SendWr::new(id | 1, op, SgeList::one(a.src.sge(0, len))))
        .map_err(|e| e.to_string())?;
    check_wc(
        &a.wait(&a.scq, "WRITE")?,
        id | 1,
        WcOpcode::RdmaWrite,
        len,
        "A WRITE",
    )?;
    check_data(&End::read(&b.dst, 0, len), &p0, "A's WRITE at B")?;

    // B SENDs to A.
    a.qp.post_recv(RecvWr {
        wr_id: id | 2,
        sges: SgeList::one(a.dst.sge(0, BUF / 2)),
    })
    .map_err(|e| e.to_string())?;
    b.src.write(0, &p1).unwrap();
    b.qp.post_send(SendWr::new(
        id | 2,
        SendOp::Send,
        SgeList::one(b.src.sge(0, len)),
    ))
    .map_err(|e| e.to_string())?;
    check_wc(
        &b.wait(&b.scq, "SEND")?,
        id | 2,
        WcOpcode::Send,
        len,
        "B SEND",
    )?;
    check_wc(
        &a.wait(&a.rcq, "RECV")?,
        id | 2,
        WcOpcode::Recv,
        len,
        "A RECV",
    )?;
    check_data(&End::read(&a.dst, 0, len), &p1, "B's SEND at A")?;

    // B WRITEs to A.
    b.src.write(0, &p2).unwrap();
    let op = SendOp::Write {
        remote_addr: a.dst.addr() + (BUF / 2) as u64,
        rkey: rk(&a.dst),
    };
    b.qp.post_send(SendWr::new(id | 3, op, SgeList::one(b.src.sge(0, len))))
        .map_err(|e| e.to_string())?;
    check_wc(
        &b.wait(&b.scq, "WRITE")?,
        id | 3,
        WcOpcode::RdmaWrite,
        len,
        "B WRITE",
    )?;
    check_data(&End::read(&a.dst, BUF / 2, len), &p2, "B's WRITE at A")?;

    // A READs back from B.
    let op = SendOp::Read {
        remote_addr: b.dst.addr(),
        rkey: rk(&b.dst),
    };
    a.qp.post_send(SendWr::new(
        id | 4,
        op,
        SgeList::one(a.src.sge(BUF / 2, len)),
    ))
    .map_err(|e| e.to_string())?;
    check_wc(
        &a.wait(&a.scq, "READ")?,
        id | 4,
        WcOpcode::RdmaRead,
        len,
        "A READ",
    )?;
    check_data(&End::read(&a.src, BUF / 2, len), &p0, "A's READ from B")?;

    for (who, e) in [("A", a), ("B", b)] {
        ensure!(e.scq.poll_one().is_none(), "{who}: stray send completion");
        ensure!(
            e.rcq.poll_one().is_none(),
            "{who}: stray receive completion"
        );
    }
    Ok(())
}

/// Healthy traffic in a background thread until `stop`; hands the ends back.
struct Traffic {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    thread: JoinHandle<R<(End, End)>>,
}

impl Traffic {
    fn start(a: End, b: End) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let (s2, r2) = (Arc::clone(&stop), Arc::clone(&rounds));
        let thread = std::thread::spawn(move || {
            let mut i = 0;
            while !s2.load(Ordering::Relaxed) {
                round(&a, &b, i).map_err(|e| format!("healthy round {i}: {e}"))?;
                i += 1;
                r2.store(i, Ordering::Relaxed);
            }
            Ok((a, b))
        });
        Traffic {
            stop,
            rounds,
            thread,
        }
    }

    fn rounds(&self) -> usize {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Waits until `n` more rounds completed (the pair is still moving data); panics with
    /// the traffic's own error if it stopped.
    fn wait_rounds(self, n: usize, what: &str) -> Traffic {
        let want = self.rounds() + n;
        let deadline = Instant::now() + WC_TIMEOUT * 2;
        while self.rounds() < want {
            if self.thread.is_finished() {
                let err = match self.thread.join() {
                    Ok(Err(e)) => e,
                    Ok(Ok(_)) => "it returned early".into(),
                    Err(_) => "it panicked".into(),
                };
                panic!("{what}: the healthy traffic stopped: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "{what}: healthy traffic stalled at round {}",
                self.rounds()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        self
    }

    fn finish(self) -> (End, End, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let n = self.rounds();
        match self.thread.join() {
            Ok(Ok((a, b))) => (a, b, n),
            Ok(Err(e)) => panic!("healthy traffic failed: {e}"),
            Err(_) => panic!("healthy traffic thread panicked"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The attacker
// ---------------------------------------------------------------------------------------

/// A plain UDP socket aiming RoCEv2 packets at a device.
struct Attacker {
    sock: UdpSocket,
    to: SocketAddr,
    encap: Encap,
}

impl Attacker {
    fn new(ip: IpAddr, to: SocketAddr) -> Attacker {
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0)).expect("attacker socket");
        let me = sock.local_addr().unwrap();
        let encap = Encap {
            ip: IpRepr::between(me.ip(), to.ip()).unwrap(),
            src_port: me.port(),
            dst_port: to.port(),
        };
        Attacker { sock, to, encap }
    }

    /// The packet with a correct ICRC for this socket.
    fn emit(&self, r: &PacketRepr<'_>) -> Vec<u8> {
        let mut b = vec![0u8; r.buffer_len()];
        let n = r.emit_with_icrc(&mut b, &self.encap).expect("emit");
        b.truncate(n);
        srdma_wire::icrc::verify(&self.encap, &b).expect("self-check of the ICRC");
        b
    }

    /// `raw` (BTH onwards, no ICRC) followed by the ICRC it would need.
    fn seal(&self, raw: &[u8]) -> Vec<u8> {
        let crc = srdma_wire::icrc::compute(&self.encap, raw).expect("ICRC");
        let mut b = raw.to_vec();
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn send(&self, b: &[u8]) {
        self.sock.send_to(b, self.to).expect("attacker send");
    }

    /// Sends `pkts` in small bursts, each time waiting until `count` (a counter of the
    /// victim) has gone up by as many, so no socket buffer overflows and the final count must
    /// be exact.
    fn send_counted(&self, pkts: &[Vec<u8>], what: &str, count: impl Fn() -> u64) -> R {
        let base = count();
        let mut sent = 0u64;
        for chunk in pkts.chunks(32) {
            for p in chunk {
                self.send(p);
            }
            sent += chunk.len() as u64;
            wait_until(
                what,
                || count() - base >= sent,
                || format!("counted {} of {sent} sent", count() - base),
            )?;
        }
        std::thread::sleep(Duration::from_millis(20));
        let got = count() - base;
        ensure!(got == sent, "{what}: counted {got}, sent {sent}");
        Ok(())
    }
}

fn bth(opcode: Opcode, qpn: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(qpn),
        ack_req: true,
        psn: Psn::new(psn),
    }
}

fn send_only<'a>(qpn: u32, psn: u32, payload: &'a [u8]) -> PacketRepr<'a> {
    PacketRepr::new(bth(Opcode::RcSendOnly, qpn, psn), payload)
}

fn write_only<'a>(qpn: u32, psn: u32, va: u64, rkey: u32, payload: &'a [u8]) -> PacketRepr<'a> {
    let mut r = PacketRepr::new(bth(Opcode::RcRdmaWriteOnly, qpn, psn), payload);
    r.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: payload.len() as u32,
    });
    r
}

fn read_request(qpn: u32, psn: u32, va: u64, rkey: u32, len: u32) -> PacketRepr<'static> {
    let mut r = PacketRepr::new(bth(Opcode::RcRdmaReadRequest, qpn, psn), &[]);
    r.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: len,
    });
    r
}

fn fetch_add(qpn: u32, psn: u32, va: u64, rkey: u32) -> PacketRepr<'static> {
    let mut r = PacketRepr::new(bth(Opcode::RcFetchAdd, qpn, psn), &[]);
    r.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add: 0x4141_4141,
        compare: 0,
    });
    r
}

fn ack(qpn: u32, psn: u32, syndrome: Syndrome) -> PacketRepr<'static> {
    let mut r = PacketRepr::new(bth(Opcode::RcAcknowledge, qpn, psn), &[]);
    r.aeth = Some(AethRepr { syndrome, msn: 1 });
    r
}

fn ud_send<'a>(qpn: u32, qkey: u32, payload: &'a [u8]) -> PacketRepr<'a> {
    let mut r = PacketRepr::new(bth(Opcode::UdSendOnly, qpn, 0), payload);
    r.deth = Some(DethRepr {
        qkey,
        src_qpn: Qpn::new(0x99),
    });
    r
}

/// Structurally broken packets with a correct ICRC (so only the parser can refuse them),
/// aimed at QP `qpn`.
fn malformed(att: &Attacker, qpn: u32) -> Vec<Vec<u8>> {
    let valid = att.emit(&send_only(qpn, 1, b"abcd"));
    let body = &valid[..valid.len() - 4];
    let mut raw: Vec<Vec<u8>> = Vec::new();
    // TVer 1.
    let mut b = body.to_vec();
    b[1] |= 0x01;
    raw.push(b);
    // Opcodes that do not exist.
    for op in [0x15u8, 0x1F, 0x30, 0x70, 0xC0, 0xFF] {
        let mut b = body.to_vec();
        b[0] = op;
        raw.push(b);
    }
    let with_op = |op: Opcode, extra: usize| {
        let mut b = body[..12].to_vec();
        b[0] = op.value();
        b.extend(std::iter::repeat_n(0x5Au8, extra));
        b
    };
    // Extension headers cut short.
    raw.push(with_op(Opcode::RcRdmaWriteFirst, 8)); // RETH is 16
    raw.push(with_op(Opcode::RcRdmaReadRequest, 0));
    raw.push(with_op(Opcode::RcCompareSwap, 20)); // AtomicETH is 28
    raw.push(with_op(Opcode::UdSendOnly, 4)); // DETH is 8
    raw.push(with_op(Opcode::RcAcknowledge, 0)); // AETH is 4
    // Payload + pad not a multiple of 4.
    raw.push(with_op(Opcode::RcSendOnly, 5));
    // Payload where the opcode allows none.
    raw.push(with_op(Opcode::RcAcknowledge, 12));
    // Pad count without payload to pad.
    let mut b = with_op(Opcode::RcSendOnly, 0);
    b[1] |= 0x30;
    raw.push(b);
    raw.iter()
        .map(|r| {
            let p = att.seal(r);
            assert!(
                PacketRepr::parse_bytes(&p).is_err(),
                "meant to be malformed: {p:02x?}"
            );
            p
        })
        .collect()
}

fn drops(c: &DeviceCounters) -> u64 {
    c.rx_malformed + c.rx_bad_icrc + c.rx_unknown_qp + c.rx_bad_source + c.rx_cnp
}

fn fresh_pair_works(a: &Device, b: &Device, what: &str) {
    let (x, y) = connect_pair(a, b, 0xAB_CDEF, 0x00_0100);
    for i in 0..SIZES.len() {
        round(&x, &y, i).unwrap_or_else(|e| panic!("{what}: a new QP pair fails: {e}"));
    }
}

/// Waits for the device to count `n` more datagrams past `base` (everything sent was read).
fn settle(dev: &Device, base: u64, n: u64, what: &str) -> R {
    wait_until(
        what,
        || dev.counters().rx_datagrams - base >= n,
        || format!("{:?}", dev.counters()),
    )
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Every kind of bad packet, counted exactly where it belongs, while a healthy RC pair moves
/// data: garbage and truncated datagrams, bad ICRCs, malformed packets with a good ICRC, CNPs,
/// packets for unknown QPNs, packets from a stranger's address (including an RDMA WRITE with
/// the right R_Key), a wrong P_Key from the peer's address, a wrong Q_Key for a UD QP,
/// stale request PSNs, ghost and stale responses (far-future request PSNs: see
/// [`far_future_psns_never_stall_healthy_traffic`]). The canary region stays zero, the
/// healthy QP stays in RTS, and a new QP pair works afterwards.
#[test]
fn hostile_packets_are_dropped_counted_and_harmless() {
    let (a, b) = (open(v4(11, 1)), open(v4(11, 2)));
    let (ea, eb) = connect_pair(&a, &b, PSN_A, PSN_B);
    let qa = ea.qp.clone();
    let qpn = qa.qpn().value();
    // More victims on A: a UD QP and a canary region every forged WRITE aims at.
    let pd = a.alloc_pd();
    let ucq = a.create_cq(16, None).unwrap();
    let ud = pd.create_qp(&QpInit::new(QpType::Ud, &ucq, &ucq)).unwrap();
    ud.activate(Psn::new(1)).unwrap();
    let canary = pd
        .reg_mr(
            4096,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let (cva, ckey) = (canary.addr(), canary.rkey().unwrap().0);

    let traffic = Traffic::start(ea, eb);
    let traffic = traffic.wait_rounds(2, "before the attack");

    let dest = a.local_addr();
    let stranger = Attacker::new(v4(11, 3), dest);
    // The peer's IP address, another port: passes the source check.
    let spoof = Attacker::new(v4(11, 2), dest);
    let d0 = a.counters();
    let q0 = qa.counters();
    let mut rng = Rng(0x5EED_0001);
    let dc = || a.counters();

    // Random garbage, 0 to 300 bytes.
    let garbage: Vec<Vec<u8>> = (0..600)
        .map(|_| {
            let n = rng.below(301);
            rng.bytes(n)
        })
        .collect();
    let before = drops(&dc());
    stranger
        .send_counted(&garbage, "random garbage", || drops(&dc()) - before)
        .unwrap();

    // Truncated BTHs: every prefix of a valid packet shorter than BTH + ICRC.
    let valid = stranger.emit(&send_only(qpn, PSN_B, b"0123456789ab"));
    let truncated: Vec<Vec<u8>> = (0..16)
        .flat_map(|n| [valid[..n].to_vec(), valid[..n].to_vec()])
        .collect();
    let before = drops(&dc());
    stranger
        .send_counted(&truncated, "truncated BTHs", || drops(&dc()) - before)
        .unwrap();

    // Well-formed packets with one bit flipped where the structure does not notice: P_Key,
    // QPN, PSN, extension headers, payload, ICRC (not the opcode, flags/pad/TVer byte, or
    // byte 4 of the BTH, which the ICRC does not cover).
    let bad_icrc: Vec<Vec<u8>> = (0..300)
        .map(|i| {
            let payload = rng.bytes(i % 64);
            let mut p = match i % 3 {
                0 => stranger.emit(&send_only(qpn, PSN_B, &payload)),
                1 => stranger.emit(&write_only(qpn, PSN_B, cva, ckey, &payload)),
                _ => stranger.emit(&ud_send(ud.qpn().value(), QKEY, &payload)),
            };
            let at = match rng.below(p.len() - 3) {
                0 => 2,
                1 => 3,
                n => n + 3,
            };
            p[at] ^= 1 << rng.below(8);
            p
        })
        .collect();
    stranger
        .send_counted(&bad_icrc, "bad ICRC", || dc().rx_bad_icrc - d0.rx_bad_icrc)
        .unwrap();

    // Correct ICRC, broken structure.
    let mal: Vec<Vec<u8>> = malformed(&stranger, qpn)
        .into_iter()
        .cycle()
        .take(170)
        .collect();
    stranger
        .send_counted(&mal, "malformed", || dc().rx_malformed - d0.rx_malformed)
        .unwrap();

    // Congestion notifications: counted and ignored.
    let cnps: Vec<Vec<u8>> = (0..50)
        .map(|_| stranger.emit(&PacketRepr::new(bth(Opcode::Cnp, qpn, 0), &[])))
        .collect();
    stranger
        .send_counted(&cnps, "CNPs", || dc().rx_cnp - d0.rx_cnp)
        .unwrap();

    // Valid packets for QPs that do not exist (0/1: special QPs srdma does not have).
    let payload = [0x42u8; 32];
    let unknown: Vec<Vec<u8>> = [0u32, 1, 2, 0x10, 0x5_0000, 0xFF_FFFE, 0xFF_FFFF]
        .iter()
        .flat_map(|&q| {
            [
                stranger.emit(&send_only(q, 0, &payload)),
                stranger.emit(&write_only(q, 0, cva, ckey, &payload)),
                stranger.emit(&read_request(q, 0, cva, ckey, 64)),
                stranger.emit(&ack(q, 0, Syndrome::ACK)),
                stranger.emit(&ud_send(q, QKEY, &payload)),
            ]
        })
        .cycle()
        .take(350)
        .collect();
    stranger
        .send_counted(&unknown, "unknown QPNs", || {
            dc().rx_unknown_qp - d0.rx_unknown_qp
        })
        .unwrap();

    // Valid packets for the healthy QP from an address that is not its peer — including an
    // RDMA WRITE, READ and atomic with the right R_Key and the PSN A expects next (roughly).
    let strange: Vec<Vec<u8>> = (0..300u32)
        .map(|i| {
            let psn = PSN_B.wrapping_add(i % 64);
            match i % 5 {
                0 => stranger.emit(&send_only(qpn, psn, &payload)),
                1 => stranger.emit(&write_only(qpn, psn, cva, ckey, &payload)),
                2 => stranger.emit(&read_request(qpn, psn, cva, ckey, 64)),
                3 => stranger.emit(&fetch_add(qpn, psn, cva, ckey)),
                _ => stranger.emit(&ack(qpn, PSN_A, Syndrome::Nak(NakCode::RemoteAccessError))),
            }
        })
        .collect();
    stranger
        .send_counted(&strange, "wrong source", || {
            dc().rx_bad_source - d0.rx_bad_source
        })
        .unwrap();

    // A wrong P_Key, from the peer's address (so only the P_Key check can stop it).
    let pkeys = [0x0000u16, 0x8000, 0x1234, 0x8001, 0x7FFE];
    let bad_pkey: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let mut r = match i % 3 {
                0 => send_only(qpn, PSN_B.wrapping_add(i), &payload),
                1 => write_only(qpn, PSN_B.wrapping_add(i), cva, ckey, &payload),
                _ => ack(qpn, PSN_A, Syndrome::Nak(NakCode::RemoteAccessError)),
            };
            r.bth.pkey = pkeys[i as usize % pkeys.len()];
            spoof.emit(&r)
        })
        .collect();
    spoof
        .send_counted(&bad_pkey, "wrong P_Key (RC)", || {
            qa.counters().bad_pkey - q0.bad_pkey
        })
        .unwrap();
    let ud_pkey: Vec<Vec<u8>> = (0..50)
        .map(|i| {
            let mut r = ud_send(ud.qpn().value(), QKEY, &payload);
            r.bth.pkey = pkeys[i % pkeys.len()];
            stranger.emit(&r)
        })
        .collect();
    let u0 = ud.counters();
    stranger
        .send_counted(&ud_pkey, "wrong P_Key (UD)", || {
            ud.counters().bad_pkey - u0.bad_pkey
        })
        .unwrap();

    // A wrong Q_Key for the UD QP.
    let bad_qkey: Vec<Vec<u8>> = (0..50u32)
        .map(|i| stranger.emit(&ud_send(ud.qpn().value(), QKEY ^ (1 << (i % 32)), &payload)))
        .collect();
    stranger
        .send_counted(&bad_qkey, "wrong Q_Key", || {
            ud.counters().qkey_violations - u0.qkey_violations
        })
        .unwrap();

    // Requests from the peer's address with stale PSNs (duplicates: re-ACKed or replayed,
    // never executed).
    let stale: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let psn = PSN_B.wrapping_sub(1 + i * 37) & 0xFF_FFFF;
            match i % 3 {
                0 => spoof.emit(&send_only(qpn, psn, &payload)),
                1 => spoof.emit(&write_only(qpn, psn, cva, ckey, &payload)),
                _ => spoof.emit(&read_request(qpn, psn, cva, ckey, 64)),
            }
        })
        .collect();
    let q1 = qa.counters();
    spoof
        .send_counted(&stale, "stale request PSNs", || {
            qa.counters().duplicate_request - q1.duplicate_request
        })
        .unwrap_or_else(|e| {
            // Healthy retransmissions may add duplicates; only fewer is wrong.
            assert!(
                qa.counters().duplicate_request - q1.duplicate_request >= stale.len() as u64,
                "{e}"
            );
        });

    // Ghost responses: ACKs and NAKs for PSNs A never sent; stale plain ACKs.
    let ghosts: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let far = (PSN_A + 0x40_0000 + i * 997) & 0xFF_FFFF;
            match i % 4 {
                0 => spoof.emit(&ack(qpn, far, Syndrome::ACK)),
                1 => spoof.emit(&ack(qpn, far, Syndrome::Nak(NakCode::RemoteAccessError))),
                2 => spoof.emit(&ack(qpn, far, Syndrome::Nak(NakCode::InvalidRequest))),
                _ => spoof.emit(&ack(qpn, PSN_A.wrapping_sub(1 + i), Syndrome::ACK)),
            }
        })
        .collect();
    let base = a.counters().rx_datagrams;
    for p in &ghosts {
        spoof.send(p);
    }
    settle(&a, base, ghosts.len() as u64, "ghost responses").unwrap();

    // The pair still moves data.
    let traffic = traffic.wait_rounds(3, "after the attack");
    let (ea, eb, rounds) = traffic.finish();

    let d = a.counters();
    let q = qa.counters();
    println!(
        "device A: {d:?}\nhealthy QP: {q:?}\nUD QP: {:?}\n{rounds} healthy rounds",
        ud.counters()
    );
    assert!(
        q.dropped_pkts - q0.dropped_pkts >= 200 + 150,
        "P_Key and ghost drops: {q:?}"
    );
    assert_eq!(qa.state(), QpState::Rts);
    assert_eq!(ud.state(), QpState::Rts);
    assert!(
        ucq.poll_one().is_none(),
        "the UD QP completed something it should have dropped"
    );
    let mut c = vec![0u8; 4096];
    canary.read(0, &mut c).unwrap();
    assert!(c.iter().all(|&x| x == 0), "the canary region was written");
    let b_counters = b.counters();
    assert_eq!(
        (b_counters.rx_malformed, b_counters.rx_bad_icrc),
        (0, 0),
        "B saw bad packets: {b_counters:?}"
    );
    drop((ea, eb));
    fresh_pair_works(&a, &b, "after the attack");
}

/// Requests from the peer's address with PSNs far ahead of the expected one, interleaved
/// with healthy traffic: each gap is answered with one PSN-sequence NAK (the real peer then
/// resends from the expected PSN, which costs nothing but a few duplicates), nothing is
/// executed, and the healthy pair keeps moving correct data.
#[test]

fn far_future_psns_never_stall_healthy_traffic() {
    let (a, b) = (open(v4(14, 1)), open(v4(14, 2)));
    let (ea, eb) = connect_pair(&a, &b, PSN_A, PSN_B);
    let qa = ea.qp.clone();
    let qpn = qa.qpn().value();
    let pd = a.alloc_pd();
    let canary = pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let (cva, ckey) = (canary.addr(), canary.rkey().unwrap().0);
    let traffic = Traffic::start(ea, eb);
    let traffic = traffic.wait_rounds(2, "before the attack");
    let spoof = Attacker::new(v4(14, 2), a.local_addr());
    let q0 = qa.counters();
    let payload = [0x42u8; 64];
    let future: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| {
            let psn = (PSN_B + 0x40_0000 + i * 1013) & 0xFF_FFFF;
            match i % 2 {
                0 => spoof.emit(&send_only(qpn, psn, &payload)),
                _ => spoof.emit(&write_only(qpn, psn, cva, ckey, &payload)),
            }
        })
        .collect();
    // Spread over the traffic so some land in the middle of multi-packet messages.
    for chunk in future.chunks(10) {
        for p in chunk {
            spoof.send(p);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let traffic = traffic.wait_rounds(3, "after the attack");
    let (_ea, _eb, rounds) = traffic.finish();
    let q = qa.counters();
    println!("{rounds} healthy rounds; healthy QP {q:?}");
    assert!(q.out_of_seq_request > q0.out_of_seq_request, "{q:?}");
    assert_eq!(qa.state(), QpState::Rts);
    let mut c = vec![0u8; 4096];
    canary.read(0, &mut c).unwrap();
    assert!(c.iter().all(|&x| x == 0), "the canary region was written");
}

/// A flood of 100,000 bad packets of every kind, as fast as one socket sends them, while a
/// healthy RC pair moves data: the healthy data stays correct, the engine counts what it
/// read, keeps running (the pair moves data after the flood) and serves a new QP pair.
#[test]
fn flood_never_stops_the_engine() {
    let (a, b) = (open(v4(12, 1)), open(v4(12, 2)));
    let (ea, eb) = connect_pair(&a, &b, PSN_A, PSN_B);
    let qa = ea.qp.clone();
    let qpn = qa.qpn().value();
    let traffic = Traffic::start(ea, eb);
    let traffic = traffic.wait_rounds(2, "before the flood");

    let dest = a.local_addr();
    let stranger = Attacker::new(v4(12, 3), dest);
    let spoof = Attacker::new(v4(12, 2), dest);
    let mut rng = Rng(0xF100D);
    let payload = rng.bytes(200);
    // (class, packet): 0 garbage or bad ICRC, 1 unknown QPN, 2 wrong source, 3 wrong P_Key,
    // 4 stale PSN; 3 and 4 come from the peer's address.
    let mut pkts: Vec<(usize, Vec<u8>)> = Vec::new();
    for i in 0..64u32 {
        let n = rng.below(300);
        pkts.push((0, rng.bytes(n)));
        let mut bad = stranger.emit(&send_only(qpn, PSN_B + i, &payload));
        bad[20] ^= 0x10;
        pkts.push((0, bad));
        pkts.push((1, stranger.emit(&send_only(0x77_0000 + i, i, &payload))));
        pkts.push((
            2,
            stranger.emit(&write_only(qpn, PSN_B + i, 0x1000, 0x1234, &payload)),
        ));
        let mut r = send_only(qpn, PSN_B + i, &payload);
        r.bth.pkey = 0x1234;
        pkts.push((3, spoof.emit(&r)));
        pkts.push((
            4,
            spoof.emit(&send_only(qpn, PSN_B.wrapping_sub(1000 + i), &payload)),
        ));
    }
    let d0 = a.counters();
    let q0 = qa.counters();
    // Attack packets the engine has dealt with so far, by where they are counted.
    let seen = || {
        let (d, q) = (a.counters(), qa.counters());
        [
            d.rx_bad_icrc - d0.rx_bad_icrc + d.rx_malformed - d0.rx_malformed,
            d.rx_unknown_qp - d0.rx_unknown_qp,
            d.rx_bad_source - d0.rx_bad_source,
            q.bad_pkey - q0.bad_pkey,
            // Healthy retransmissions may add a few.
            q.duplicate_request - q0.duplicate_request,
        ]
    };
    let started = Instant::now();
    let total = 100_000;
    let mut sent = [0u64; 5];
    for i in 0..total {
        let (class, p) = &pkts[i % pkts.len()];
        let sock = if *class >= 3 { &spoof } else { &stranger };
        // A full socket buffer on the sending side is fine: try the next one.
        if sock.sock.send_to(p, dest).is_ok() {
            sent[*class] += 1;
        }
    }
    let sent_in = started.elapsed();
    // Let the engine read what survived in its socket buffer: until the counts stop moving.
    let mut last = seen();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = seen();
        if now == last {
            break;
        }
        last = now;
    }
    let got = seen();
    println!(
        "flood: {total} sent in {sent_in:.2?}, counted by the engine in {:.2?}: \
         sent {sent:?} counted {got:?}; {:?}; healthy QP {:?}",
        started.elapsed(),
        a.counters(),
        qa.counters()
    );
    for k in 0..5 {
        assert!(
            got[k] > 0,
            "class {k} of the flood was never counted: {got:?}"
        );
        // The kernel may drop some when the engine falls behind; nothing is counted twice.
        assert!(
            k == 4 || got[k] <= sent[k],
            "class {k} over-counted: {got:?} > {sent:?}"
        );
    }

    let traffic = traffic.wait_rounds(3, "after the flood");
    let (ea, eb, rounds) = traffic.finish();
    assert!(rounds >= 5);
    assert_eq!(qa.state(), QpState::Rts);
    drop((ea, eb));
    fresh_pair_works(&a, &b, "after the flood");
}

/// IPv6 (::1, devices on different ports): garbage, truncated packets, bad ICRCs, malformed
/// packets, unknown QPNs and a wrong P_Key are counted exactly and the healthy pair is
/// undisturbed. (One loopback address: no third address for a wrong-source test.)
#[test]
fn hostile_packets_ipv6() {
    let lo = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let (a, b) = (open(lo), open(lo));
    let (ea, eb) = connect_pair(&a, &b, PSN_A, PSN_B);
    let qa = ea.qp.clone();
    let qpn = qa.qpn().value();
    let traffic = Traffic::start(ea, eb);
    let traffic = traffic.wait_rounds(2, "before the attack");

    let att = Attacker::new(lo, a.local_addr());
    let d0 = a.counters();
    let q0 = qa.counters();
    let dc = || a.counters();
    let mut rng = Rng(0x5EED_0006);

    let mut junk: Vec<Vec<u8>> = (0..300)
        .map(|_| {
            let n = rng.below(200);
            rng.bytes(n)
        })
        .collect();
    let valid = att.emit(&send_only(qpn, PSN_B, b"0123"));
    junk.extend((0..16).map(|n| valid[..n].to_vec()));
    let before = drops(&dc());
    att.send_counted(&junk, "garbage", || drops(&dc()) - before)
        .unwrap();

    let bad_icrc: Vec<Vec<u8>> = (0..100)
        .map(|i| {
            let mut p = att.emit(&send_only(qpn, PSN_B, &[7u8; 40]));
            let at = [2, 3, 8, 12, 30, 51, 55][i % 7];
            p[at] ^= 0x80;
            p
        })
        .collect();
    att.send_counted(&bad_icrc, "bad ICRC", || dc().rx_bad_icrc - d0.rx_bad_icrc)
        .unwrap();

    let mal: Vec<Vec<u8>> = malformed(&att, qpn).into_iter().cycle().take(68).collect();
    att.send_counted(&mal, "malformed", || dc().rx_malformed - d0.rx_malformed)
        .unwrap();

    let unknown: Vec<Vec<u8>> = (0..100u32)
        .map(|i| att.emit(&send_only(0x30_0000 + i, 0, b"abcd")))
        .collect();
    att.send_counted(&unknown, "unknown QPNs", || {
        dc().rx_unknown_qp - d0.rx_unknown_qp
    })
    .unwrap();

    let bad_pkey: Vec<Vec<u8>> = (0..100u32)
        .map(|i| {
            let mut r = send_only(qpn, PSN_B + i, b"abcd");
            r.bth.pkey = 0x1234;
            att.emit(&r)
        })
        .collect();
    att.send_counted(&bad_pkey, "wrong P_Key", || {
        qa.counters().bad_pkey - q0.bad_pkey
    })
    .unwrap();

    let traffic = traffic.wait_rounds(3, "after the attack");
    let (ea, eb, _) = traffic.finish();
    assert_eq!(qa.state(), QpState::Rts);
    drop((ea, eb));
    fresh_pair_works(&a, &b, "after the attack");
}

/// A datagram too short to hold a BTH and an ICRC is not a RoCEv2 packet at all: it must
/// count as malformed (rxe drops it before any ICRC check), not as a bad ICRC.
#[test]
fn truncated_datagrams_count_as_malformed() {
    let a = open(v4(13, 1));
    let att = Attacker::new(v4(13, 2), a.local_addr());
    let valid = att.emit(&send_only(0x11, 0, b"abcd"));
    let short: Vec<Vec<u8>> = (0..16).map(|n| valid[..n].to_vec()).collect();
    let d0 = a.counters();
    att.send_counted(&short, "truncated", || drops(&a.counters()) - drops(&d0))
        .unwrap();
    let d = a.counters();
    assert_eq!(
        (
            d.rx_malformed - d0.rx_malformed,
            d.rx_bad_icrc - d0.rx_bad_icrc
        ),
        (16, 0),
        "{d:?}"
    );
}

/// A NAK for a PSN the requester already saw acknowledged (stale, e.g. a delayed duplicate
/// or a forgery from the peer's address) must be ignored, as rxe's completer ignores any
/// response older than the PSN it expects (`check_psn`); it must not fail a work request or
/// move the QP to ERR.
#[test]
fn stale_nak_is_ignored() {
    let (a, b) = (open(v4(13, 11)), open(v4(13, 12)));
    let (ea, eb) = connect_pair(&a, &b, PSN_A, PSN_B);
    for i in 0..3 {
        round(&ea, &eb, i).unwrap();
    }
    // PSN_A was acknowledged long ago; the NAK comes from the peer's address.
    let spoof = Attacker::new(v4(13, 12), a.local_addr());
    let qpn = ea.qp.qpn().value();
    let base = a.counters().rx_datagrams;
    spoof.send(&spoof.emit(&ack(qpn, PSN_A, Syndrome::Nak(NakCode::RemoteAccessError))));
    settle(&a, base, 1, "stale NAK").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        ea.qp.state(),
        QpState::Rts,
        "a stale NAK moved the QP to ERR"
    );
    assert!(
        ea.scq.poll_one().is_none(),
        "a stale NAK completed something"
    );
    round(&ea, &eb, 3).unwrap();
}

/// A PSN-sequence NAK for the middle of a multi-packet WRITE, followed in the same receive
/// batch by the ACK of the whole WRITE (what a responder sends when a stray out-of-sequence
/// packet — here a forgery, in the wild a duplicate — arrived among the WRITE's packets):
/// the WRITE must complete. The peer is a plain UDP socket playing the responder; holding
/// the device lock while it sends makes the NAK and the ACK reach the engine in one batch.
#[test]
fn nak_then_ack_in_one_batch_completes_the_write() {
    let a = open(v4(13, 21));
    let peer = Attacker::new(v4(13, 22), a.local_addr());
    peer.sock
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let end = End::new(&a);
    let remote = RemoteQp {
        qpn: Qpn::new(0x99),
        psn: Psn::new(0x500),
        gid: srdma::Gid::from_ip(v4(13, 22)),
        port: peer.sock.local_addr().unwrap().port(),
    };
    let psn = 0x1000;
    end.qp
        .connect(&remote, &ConnectParams::new(Mtu::Mtu256, Psn::new(psn)))
        .unwrap();
    let qpn = end.qp.qpn().value();
    end.src.write(0, &[0x33; 1024]).unwrap();
    let op = SendOp::Write {
        remote_addr: 0x10_0000,
        rkey: RKey(0x55),
    };
    end.qp
        .post_send(SendWr::new(7, op, SgeList::one(end.src.sge(0, 1024))))
        .unwrap();
    // The four packets of the WRITE.
    let recv_psns = |n: usize| -> Vec<u32> {
        let mut buf = [0u8; 2048];
        (0..n)
            .map(|_| {
                let (len, _) = peer.sock.recv_from(&mut buf).expect("a packet from A");
                let r = PacketRepr::parse_bytes(&buf[..len]).expect("a valid packet");
                r.bth.psn.value()
            })
            .collect()
    };
    assert_eq!(recv_psns(4), [psn, psn + 1, psn + 2, psn + 3]);
    let nak = peer.emit(&ack(qpn, psn + 1, Syndrome::Nak(NakCode::PsnSequenceError)));
    let acked = peer.emit(&ack(qpn, psn + 3, Syndrome::ACK));
    end.src.with_bytes(|_| {
        // Wake the engine with a datagram it will find malformed; it then waits for the
        // lock this closure holds, and the NAK and ACK queue up behind it.
        peer.send(&[0u8; 3]);
        std::thread::sleep(Duration::from_millis(50));
        peer.send(&nak);
        peer.send(&acked);
    });
    // The ACK that follows the NAK covers every PSN of the WRITE, so the WRITE is complete
    // whether or not the requester already started resending from psn + 1 (rxe's requester,
    // running apart from its completer, may have; srdma handles both in one batch and need
    // not). A responder answers any resent duplicates by acknowledging the WRITE again.
    peer.sock
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 2048];
    while let Ok((len, _)) = peer.sock.recv_from(&mut buf) {
        let r = PacketRepr::parse_bytes(&buf[..len]).expect("a valid packet");
        assert!(
            r.bth.psn.value() > psn && r.bth.psn.value() <= psn + 3,
            "resent {r}"
        );
        peer.send(&acked);
    }
    let wc = end.wait_for(&end.scq, "WRITE", Duration::from_secs(3));
    let c = end.qp.counters();
    let wc =
        wc.unwrap_or_else(|e| panic!("{e}; QP attributes {:?}; counters {c:?}", end.qp.query()));
    check_wc(&wc, 7, WcOpcode::RdmaWrite, 1024, "WRITE").unwrap();
}
