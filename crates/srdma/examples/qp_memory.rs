//! What an idle QP costs: two devices of this process (127.0.0.1 and 127.0.0.2) open N
//! connected RC QPs each (one pair per QP, in RTS, one CQ per device), then the heap bytes in
//! use and the resident set are read before and after, and divided by the 2·N QPs.
//!
//! `cargo run --release -p srdma --example qp_memory -- [N (10000)] [SEND_WR (128)] [RECV_WR (128)]`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use srdma::{ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RemoteQp};
use srdma_wire::Psn;

/// Counts the heap bytes in use, of every thread (the engine's progress threads included).
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts the bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The resident set of this process, bytes (/proc/self/statm, 4 KiB pages).
fn rss() -> i64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    s.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<i64>().ok())
        .unwrap_or(0)
        * 4096
}

fn main() {
    let arg = |i: usize, d: u32| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (n, send_wr, recv_wr) = (arg(1, 10_000), arg(2, 128), arg(3, 128));
    let mut ca = DeviceConfig::new("127.0.0.1".parse().unwrap());
    ca.port = 0;
    let mut cb = ca.clone();
    cb.addr = "127.0.0.2".parse().unwrap();
    let (a, b) = (Device::open(ca).unwrap(), Device::open(cb).unwrap());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (
        a.create_cq(4096, None).unwrap(),
        b.create_cq(4096, None).unwrap(),
    );
    let at = |d: &Device, qpn, psn| RemoteQp {
        qpn,
        psn: Psn::new(psn),
        gid: d.local_gid(),
        port: d.local_addr().port(),
    };
    let (heap0, rss0) = (LIVE.load(Ordering::Relaxed), rss());
    let mut qps = Vec::with_capacity(2 * n as usize);
    for _ in 0..n {
        let mut ia = QpInit::new(QpType::Rc, &cqa, &cqa);
        ia.caps.max_send_wr = send_wr;
        ia.caps.max_recv_wr = recv_wr;
        let mut ib = QpInit::new(QpType::Rc, &cqb, &cqb);
        ib.caps = ia.caps;
        let qa = pa.create_qp(&ia).unwrap();
        let qb = pb.create_qp(&ib).unwrap();
        let params = ConnectParams::new(Mtu::Mtu1024, Psn::new(1));
        qa.connect(&at(&b, qb.qpn(), 1), &params).unwrap();
        qb.connect(&at(&a, qa.qpn(), 1), &params).unwrap();
        qps.push(qa);
        qps.push(qb);
    }
    let (heap1, rss1) = (LIVE.load(Ordering::Relaxed), rss());
    let per = |d: i64| d as f64 / qps.len() as f64;
    println!(
        "{} RC QPs in RTS (send_wr {send_wr}, recv_wr {recv_wr}): heap {:.0} B per QP, resident set {:.0} B per QP",
        qps.len(),
        per((heap1 - heap0) as i64),
        per(rss1 - rss0),
    );
}
