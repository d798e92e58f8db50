//! A simulated RC QP pair on one core (both ends and the lossless link in one thread): 1 MiB
//! RDMA WRITEs and 8-byte SENDs at path MTU 4096, against a `memcpy` of the same bytes in the
//! same run. Everything a real engine does per packet is done: segmentation, ICRC fill and
//! verify, parsing, PSN/ACK processing, placement into registered memory.
//!
//! After criterion, a counting global allocator measures heap allocations per packet in
//! steady state (target: none).
//!
//! `cargo bench -p srdma-proto --bench transport`

#[path = "../tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant as WallInstant};

use common::simhost::Host;
use common::{caps, rc_connect};
use criterion::{Criterion, Throughput};
use srdma_proto::{
    AccessFlags, DeviceLimits, MrKeys, Mtu, PdId, Qp, QpConfig, QpType, RecvWr, SendOp, SendWr,
    Sge, SgeList,
};
use srdma_sim::{HostId, Instant, LinkConfig, Sim};
use srdma_wire::Qpn;

/// Counts allocations so the steady-state loop can prove it makes none.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the system allocator with the caller's arguments
// unchanged, so `Counting` upholds `GlobalAlloc`'s contract exactly as `System` does; the
// counter is a relaxed atomic with no effect on the allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller guarantees a valid, non-zero-size layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr`/`layout` come from `System` as above; the caller guarantees `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MIB: usize = 1 << 20;
const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";

struct Bench {
    sim: Sim<Host>,
    a: HostId,
    b: HostId,
    src: MrKeys,
    dst: MrKeys,
    recv: MrKeys,
    wr_id: u64,
}

impl Bench {
    fn new() -> Bench {
        Self::with_icrc(true)
    }

    fn with_icrc(icrc: bool) -> Bench {
        let (a_ip, b_ip): (IpAddr, IpAddr) = (A.parse().unwrap(), B.parse().unwrap());
        let limits = DeviceLimits::default();
        let mk = |qpn| {
            let caps = srdma_proto::QpCaps {
                max_send_wr: 256,
                max_recv_wr: 256,
                ..caps()
            };
            let cfg = QpConfig {
                qpn: Qpn::new(qpn),
                qp_type: QpType::Rc,
                pd: PdId(1),
                caps,
                sq_sig_all: false,
                uses_srq: false,
                port_mtu: Mtu::Mtu4096,
            };
            Qp::new(cfg, &limits).unwrap()
        };
        let (mut qa, mut qb) = (mk(0x11), mk(0x22));
        rc_connect(&mut qa, Qpn::new(0x22), b_ip, 100, 200, Mtu::Mtu4096, 14);
        rc_connect(&mut qb, Qpn::new(0x11), a_ip, 200, 100, Mtu::Mtu4096, 14);
        let mut ha = Host::new(a_ip, 1);
        let mut hb = Host::new(b_ip, 2);
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let reg = |h: &mut Host, addr: u64, len: usize| {
            let k = h.mrs.register(PdId(1), addr, len as u64, all).unwrap();
            h.mem.insert(k.handle, (0..len).map(|i| i as u8).collect());
            k
        };
        let src = reg(&mut ha, 0x1000_0000, MIB);
        let dst = reg(&mut hb, 0x2000_0000, MIB);
        let recv = reg(&mut hb, 0x3000_0000, 256 * 8);
        ha.add_qp(qa);
        hb.add_qp(qb);
        ha.icrc = icrc;
        hb.icrc = icrc;
        let mut sim = Sim::new(7);
        sim.set_default_link(LinkConfig {
            latency: Duration::from_micros(2),
            ..LinkConfig::IDEAL
        })
        .unwrap();
        let a = sim.add_host(a_ip, ha).unwrap();
        let b = sim.add_host(b_ip, hb).unwrap();
        Bench {
            sim,
            a,
            b,
            src,
            dst,
            recv,
            wr_id: 0,
        }
    }

    fn idle(&mut self) {
        let deadline = self.sim.now() + Duration::from_secs(3600);
        self.sim.run_until_idle(deadline);
    }

    fn drain(&mut self) -> usize {
        let mut n = 0;
        for (h, qpn) in [(self.a, 0x11), (self.b, 0x22)] {
            while let Some((_, wc)) = self.sim.endpoint_mut(h).qp(qpn).poll_completion() {
                assert!(wc.status.is_success(), "{wc:?}");
                n += 1;
            }
        }
        n
    }

    /// `n` signaled 1 MiB WRITEs.
    fn writes(&mut self, n: usize) {
        let rkey = self.dst.rkey.unwrap();
        let qp = self.sim.endpoint_mut(self.a).qp(0x11);
        for _ in 0..n {
            let sge = Sge {
                addr: 0x1000_0000,
                length: MIB as u32,
                lkey: self.src.lkey,
            };
            qp.post_send(SendWr::new(
                self.wr_id,
                SendOp::Write {
                    remote_addr: 0x2000_0000,
                    rkey,
                },
                SgeList::one(sge),
            ))
            .unwrap();
            self.wr_id += 1;
        }
        self.idle();
        assert_eq!(self.drain(), n);
    }

    /// `n` signaled 8-byte SENDs (and the receives for them).
    fn sends(&mut self, n: usize) {
        let qp = self.sim.endpoint_mut(self.b).qp(0x22);
        for i in 0..n {
            let sge = Sge {
                addr: 0x3000_0000 + 8 * i as u64,
                length: 8,
                lkey: self.recv.lkey,
            };
            qp.post_recv(RecvWr {
                wr_id: i as u64,
                sges: SgeList::one(sge),
            })
            .unwrap();
        }
        let qp = self.sim.endpoint_mut(self.a).qp(0x11);
        for _ in 0..n {
            let sge = Sge {
                addr: 0x1000_0000,
                length: 8,
                lkey: self.src.lkey,
            };
            qp.post_send(SendWr::new(self.wr_id, SendOp::Send, SgeList::one(sge)))
                .unwrap();
            self.wr_id += 1;
        }
        self.idle();
        assert_eq!(self.drain(), 2 * n);
    }

    fn datagrams(&self) -> u64 {
        self.sim.total_stats().sent
    }
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(4))
        .sample_size(20);
    let mut g = c.benchmark_group("transport");
    let src = vec![7u8; MIB];
    let mut dst = vec![0u8; MIB];
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("memcpy/1MiB", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    let mut w = Bench::new();
    g.bench_function("sim_rc_write/1MiB", |b| b.iter(|| w.writes(1)));
    let mut w0 = Bench::with_icrc(false);
    g.bench_function("sim_rc_write_no_icrc/1MiB", |b| b.iter(|| w0.writes(1)));
    g.throughput(Throughput::Bytes(64 * 8));
    let mut s = Bench::new();
    g.bench_function("sim_rc_send/8B_x64", |b| b.iter(|| s.sends(64)));
    let small_src = [7u8; 8];
    let mut small_dst = [0u8; 8];
    g.bench_function("memcpy/8B_x64", |b| {
        b.iter(|| {
            for _ in 0..64 {
                small_dst.copy_from_slice(black_box(&small_src));
                black_box(&small_dst);
            }
        })
    });
    g.finish();

    // Steady state, measured directly: rates, and heap allocations per packet.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| !a.starts_with('-')) {
        let mut w = Bench::new();
        w.writes(4); // warm-up: queues and pools reach their working size
        let (p0, a0, t0) = (
            w.datagrams(),
            ALLOCS.load(Ordering::Relaxed),
            WallInstant::now(),
        );
        w.writes(64);
        let (dt, pk, al) = (
            t0.elapsed(),
            w.datagrams() - p0,
            ALLOCS.load(Ordering::Relaxed) - a0,
        );
        let t1 = WallInstant::now();
        for _ in 0..64 {
            dst.copy_from_slice(black_box(&src));
        }
        let mc = t1.elapsed();
        let gbs = 64.0 * MIB as f64 / dt.as_secs_f64() / 1e9;
        let mgbs = 64.0 * MIB as f64 / mc.as_secs_f64() / 1e9;
        println!(
            "steady state, 64 x 1 MiB WRITE (MTU 4096): {pk} packets in {dt:.2?}: {:.0} packets/s, {gbs:.2} GB/s payload per core; memcpy {mgbs:.2} GB/s: ratio {:.2}; heap allocations {al} ({:.4} per packet)",
            pk as f64 / dt.as_secs_f64(),
            gbs / mgbs,
            al as f64 / pk as f64
        );
        let mut s = Bench::new();
        s.sends(64);
        let (p0, a0, t0) = (
            s.datagrams(),
            ALLOCS.load(Ordering::Relaxed),
            WallInstant::now(),
        );
        for _ in 0..100 {
            s.sends(64);
        }
        let (dt, pk, al) = (
            t0.elapsed(),
            s.datagrams() - p0,
            ALLOCS.load(Ordering::Relaxed) - a0,
        );
        println!(
            "steady state, 6400 x 8 B SEND: {pk} packets in {dt:.2?}: {:.0} packets/s, {:.0} messages/s per core; heap allocations {al} ({:.4} per packet)",
            pk as f64 / dt.as_secs_f64(),
            6400.0 / dt.as_secs_f64(),
            al as f64 / pk as f64
        );
        let _ = Instant::ZERO;
    }
}
