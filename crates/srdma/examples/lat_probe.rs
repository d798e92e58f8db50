//! Latency probe: 8-byte SEND ping-pong between two processes (this program re-executed as
//! the server), busy polling, next to a UDP socket ping-pong of the same size.
//! `cargo run --release -p srdma --example lat_probe -- ITERS`

use std::net::UdpSocket;
use std::time::Instant;

use srdma::{
    AccessFlags, ConnectParams, Device, DeviceConfig, QpInit, QpType, RecvWr, RemoteQp, SendOp,
    SendWr, SgeList, WcStatus,
};
use srdma_wire::Psn;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20000);
    let server = args.get(2).is_some_and(|a| a == "server");
    let (me, peer) = if server {
        ("127.0.6.1", "127.0.6.2")
    } else {
        ("127.0.6.2", "127.0.6.1")
    };
    let child = (!server).then(|| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([iters.to_string(), "server".into()])
            .spawn()
            .unwrap()
    });
    let mut cfg = DeviceConfig::new(me.parse().unwrap());
    cfg.port = 4799;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // QPN 0x11 and PSN 1 on both sides: each process has one device with one QP.
    let remote = RemoteQp {
        qpn: qp.qpn(),
        psn: Psn::new(1),
        gid: srdma::Gid::from_ip(peer.parse().unwrap()),
        port: 4799,
    };
    for i in 0..16 {
        qp.post_recv(RecvWr {
            wr_id: i,
            sges: SgeList::one(mr.sge(1024, 64)),
        })
        .unwrap();
    }
    qp.connect(
        &remote,
        &ConnectParams::new(srdma::Mtu::Mtu1024, Psn::new(1)),
    )
    .unwrap();
    let sock = UdpSocket::bind((me, 4800)).unwrap();
    sock.connect((peer, 4800)).unwrap();
    sock.set_nonblocking(true).unwrap();
    // Handshake over UDP so both QPs are connected before the first SEND.
    let mut b = [0u8; 64];
    loop {
        let _ = sock.send(b"hi");
        std::thread::sleep(std::time::Duration::from_millis(5));
        if sock.recv(&mut b).is_ok() {
            let _ = sock.send(b"hi");
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    while sock.recv(&mut b).is_ok() {}
    let send = || {
        let mut wr = SendWr::new(0, SendOp::Send, SgeList::one(mr.sge(0, 8)));
        wr.flags = srdma::SendFlags::empty();
        qp.post_send(wr).unwrap();
    };
    let wait = || loop {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == srdma::WcOpcode::Recv {
                qp.post_recv(RecvWr {
                    wr_id: 0,
                    sges: SgeList::one(mr.sge(1024, 64)),
                })
                .unwrap();
                return;
            }
        }
    };
    let mut lat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        if server {
            wait();
            send();
        } else {
            send();
            wait();
        }
        lat.push(t.elapsed().as_nanos() as f64 / 2000.0);
    }
    // UDP ping-pong, busy polling.
    let mut ulat = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        if !server {
            sock.send(&b[..8]).unwrap();
        }
        while sock.recv(&mut b).is_err() {}
        if server {
            sock.send(&b[..8]).unwrap();
        }
        ulat.push(t.elapsed().as_nanos() as f64 / 2000.0);
    }
    if let Some(mut child) = child {
        let _ = child.wait();
        lat.sort_by(f64::total_cmp);
        ulat.sort_by(f64::total_cmp);
        let m = |v: &[f64]| v[v.len() / 2];
        println!(
            "half RTT median: srdma SEND {:.2} us, UDP {:.2} us, ratio {:.2}; dev {:?}",
            m(&lat),
            m(&ulat),
            m(&lat) / m(&ulat),
            dev.counters()
        );
    }
}
