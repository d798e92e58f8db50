//! Thousands of QPs between two devices over UDP keep what they have in flight together
//! within what the receiving socket holds: a burst of WRITEs on every QP at once arrives
//! without a drop, so nothing is retransmitted (on loopback only a full socket drops).
//!
//! The same with a stock Debian's socket buffers (`net.core.rmem_max` 208 KiB: the kernel
//! grants an unprivileged process 416 KiB for srdma's 8 MiB): the budget follows the buffer
//! granted.
//! With a fixed 4 MiB budget, 1,024 QPs on such a host overran the socket (`ib_write_bw -q
//! 1024` over UDP failed with a completion error in 5 s, `-q 64` dropped 10,646 datagrams).
//!
//! Before the engine counted the bytes in flight per peer, each QP's window was capped at
//! its fair share with a floor of 4 PSNs: 1,024 QPs of 4 KiB packets put 16 MiB in flight
//! into an 8 MiB socket buffer and the drops came back as go-back-N timeouts (`ib_write_bw
//! -q 4096` over UDP failed with `IBV_WC_RETRY_EXC_ERR`).

use std::time::{Duration, Instant};

mod common;

use srdma::{
    AccessFlags, ConnectParams, Cq, Device, Mr, Mtu, Qp, QpInit, QpType, SendOp, SendWr, SgeList,
    WcStatus,
};
use srdma_wire::Psn;

/// QPs per side.
const QPS: usize = 1024;
/// Bytes of one WRITE (sixteen 4 KiB packets).
const BYTES: usize = 64 << 10;
/// WRITEs each QP has posted at once: 256 MiB together.
const DEPTH: usize = 4;

struct Side {
    dev: Device,
    qps: Vec<Qp>,
    cq: Cq,
    mr: Mr,
}

/// A device on `ip` over UDP asking for `buffer` bytes of socket buffers.
fn side(ip: &str, buffer: usize) -> Side {
    let dev = common::dev_with(ip, |c| {
        c.share_port = false;
        // Over UDP: peers of one host would meet through shared memory, which never drops.
        c.shm = false;
        c.udp_buffer = buffer;
    });
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(DEPTH * QPS, None).unwrap();
    let qps = (0..QPS)
        .map(|_| pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap())
        .collect();
    let mr = pd
        .reg_mr(BYTES, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    Side { dev, qps, cq, mr }
}

#[test]
fn a_thousand_qps_writing_at_once_lose_nothing_over_udp() {
    writes_lose_nothing("127.0.16.1", "127.0.16.2", 8 << 20);
}

#[test]
fn a_thousand_qps_lose_nothing_with_a_stock_socket_buffer() {
    // 416 KiB granted, what a stock Debian grants an unprivileged process, whatever this
    // host's rmem_max.
    writes_lose_nothing("127.0.16.3", "127.0.16.4", 208 << 10);
}

/// Every QP of two devices with `buffer`-byte socket buffers posts its WRITEs at once; all
/// complete, with no packet retransmitted.
fn writes_lose_nothing(ip_a: &str, ip_b: &str, buffer: usize) {
    let (a, b) = (side(ip_a, buffer), side(ip_b, buffer));
    let at = |s: &Side, i: usize| common::remote(&s.dev, s.qps[i].qpn(), 0);
    let mut params = ConnectParams::new(Mtu::Mtu4096, Psn::new(0));
    // 1 s: a loaded machine that keeps the receiver from its socket for a while causes no
    // timeout; only a drop makes a retransmission.
    params.timeout = 18;
    for i in 0..QPS {
        a.qps[i].connect(&at(&b, i), &params).unwrap();
        b.qps[i].connect(&at(&a, i), &params).unwrap();
    }
    a.mr.write(0, &[7u8; BYTES]).unwrap();
    for k in 0..DEPTH {
        for (i, qp) in a.qps.iter().enumerate() {
            let op = SendOp::Write {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey().unwrap(),
            };
            let wr = SendWr::new((k * QPS + i) as u64, op, SgeList::one(a.mr.sge(0, BYTES)));
            qp.post_send(wr).unwrap();
        }
    }
    let start = Instant::now();
    let mut done = 0;
    while done < DEPTH * QPS {
        for wc in a.cq.poll(64) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done += 1;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{done} of {} WRITEs completed",
            DEPTH * QPS
        );
    }
    let mut got = [0u8; BYTES];
    b.mr.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 7), "the WRITEs' bytes arrived");
    let sum = |f: fn(&srdma_proto::Counters) -> u64| -> u64 {
        a.qps.iter().map(|q| f(&q.counters())).sum()
    };
    let (resent, timeouts) = (
        sum(|c| c.retransmitted_pkts),
        sum(|c| c.local_ack_timeout_err),
    );
    assert_eq!(
        (resent, timeouts),
        (0, 0),
        "packets retransmitted, ACK timeouts: the receiving socket dropped"
    );
}
