//! Throughput probe: RDMA WRITE bandwidth between two devices of this process over loopback,
//! next to a TCP stream of the same writes. `cargo run --release -p srdma --example bw_probe -- SIZE SECS`

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RKey, RemoteQp,
    SendFlags, SendOp, SendWr, SgeList, WcStatus,
};
use srdma_wire::Psn;

/// Counts heap allocations of every thread (the engine's progress threads included).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let size: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(65536);
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let mtu = match args.get(3).map(String::as_str) {
        Some("4096") => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    };
    let mut ca = DeviceConfig::new("127.0.0.1".parse().unwrap());
    ca.port = 0;
    ca.limits.port_max_mtu = Mtu::Mtu4096;
    ca.mtu = mtu;
    let mut cb = ca.clone();
    cb.addr = "127.0.0.2".parse().unwrap();
    let (a, b) = (Device::open(ca).unwrap(), Device::open(cb).unwrap());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (
        a.create_cq(4096, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let mut init = QpInit::new(QpType::Rc, &cqa, &cqa);
    init.caps.max_send_wr = 1024;
    let qa = pa.create_qp(&init).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb, &cqb)).unwrap();
    let at = |d: &Device, qpn, psn| RemoteQp {
        qpn,
        psn: Psn::new(psn),
        gid: d.local_gid(),
        port: d.local_addr().port(),
    };
    qa.connect(&at(&b, qb.qpn(), 2), &ConnectParams::new(mtu, Psn::new(1)))
        .unwrap();
    qb.connect(&at(&a, qa.qpn(), 1), &ConnectParams::new(mtu, Psn::new(2)))
        .unwrap();
    let src = pa.reg_mr(size, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pb
        .reg_mr(size, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let r = dst.remote().unwrap();
    let depth = 64usize.min((16 << 20) / size).max(2);
    let mut inflight = 0;
    let mut done = 0u64;
    let t0 = Instant::now();
    let mut wcs = Vec::with_capacity(64);
    let mut steady: Option<(u64, u64)> = None;
    let sig_every = (depth / 4).max(1) as u64;
    let mut posted = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        if steady.is_none() && t0.elapsed().as_secs_f64() > secs / 2.0 {
            let d = a.counters().tx_datagrams + b.counters().rx_datagrams;
            steady = Some((ALLOCS.load(Ordering::Relaxed), d));
        }
        while inflight < depth {
            let mut wr = SendWr::new(
                posted,
                SendOp::Write {
                    remote_addr: r.addr,
                    rkey: RKey(r.rkey),
                },
                SgeList::one(src.sge(0, size)),
            );
            if posted % sig_every == sig_every - 1 {
                wr.flags = SendFlags::SIGNALED;
            } else {
                wr.flags = SendFlags::empty();
            }
            qa.post_send(wr).unwrap();
            posted += 1;
            inflight += 1;
        }
        wcs.clear();
        cqa.poll_into(&mut wcs, 64);
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            inflight -= sig_every as usize;
            done += sig_every;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    if let Some((a0, d0)) = steady {
        let d = a.counters().tx_datagrams + b.counters().rx_datagrams - d0;
        let n = ALLOCS.load(Ordering::Relaxed) - a0;
        println!("steady state: {n} allocations for {d} datagrams sent + received");
    }
    let rd = (done as f64 * size as f64) / el / 1e6;
    println!("srdma WRITE {size} B: {rd:.0} MB/s ({done} msgs in {el:.2}s)");
    println!("dev a: {:?}\ndev b: {:?}", a.counters(), b.counters());
    if std::env::var_os("NO_TCP").is_some() {
        return;
    }
    // TCP baseline.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; size.max(1 << 16)];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        n
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let buf = vec![1u8; size];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        s.write_all(&buf).unwrap();
        sent += size as u64;
    }
    drop(s);
    let got = h.join().unwrap();
    let el = t0.elapsed().as_secs_f64();
    println!(
        "tcp {size} B writes: {:.0} MB/s ({got} of {sent})",
        sent as f64 / el / 1e6
    );
}
