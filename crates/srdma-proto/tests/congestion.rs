//! Congestion control through a shared bottleneck, in the simulator: N senders, each with one
//! RC QP streaming RDMA WRITEs to its own QP on one receiver, whose switch port is a
//! bottleneck (rate, drop-tail queue, optionally RED/ECN marking). Deterministic: a failure
//! repeats with the same seed.
//!
//! What must hold (the network issue's targets, here on a clean virtual network):
//! the flows fill the bottleneck, share it fairly (Jain's index), none stalls, nothing fails;
//! with ECN marking the queue stays short (DCQCN through CNPs); without it the delay policy
//! keeps the queue below the drop-tail limit most of the time.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::rc_connect;
use common::simhost::Host;
use srdma_proto::{
    AccessFlags, DeviceLimits, MrKeys, Mtu, PdId, Qp, QpCaps, QpConfig, QpType, Reliability,
    SendOp, SendWr, Sge, SgeList, WcStatus,
};
use srdma_sim::{Bottleneck, EcnMarking, HostId, Instant, LinkConfig, PortStats, Sim};
use srdma_wire::Qpn;

const MSG: u32 = 64 * 1024;
/// WRITEs each sender keeps posted.
const DEPTH: usize = 8;
const SRC: u64 = 0x10_0000;
const DST: u64 = 0x20_0000;

struct Flow {
    host: HostId,
    qpn: u32,
    keys: MrKeys,
    rkey: srdma_proto::RKey,
    posted: usize,
    /// Bytes completed in each slice of the run.
    slices: Vec<u64>,
}

struct Report {
    /// Goodput per flow over the measured part, bytes per second.
    goodput: Vec<f64>,
    /// The longest time any flow completed nothing, in the measured part.
    longest_idle: Duration,
    port: PortStats,
    cnps: u64,
    /// Tail loss probes and retransmission timeouts, all flows.
    probes: u64,
    timeouts: u64,
    errors: Vec<WcStatus>,
    /// The size of each WRITE.
    msg: u32,
}

fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * q)
    }
}

fn qp(qpn: u32) -> Qp {
    let cfg = QpConfig {
        qpn: Qpn::new(qpn),
        qp_type: QpType::Rc,
        pd: PdId(1),
        caps: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
        uses_srq: false,
        port_mtu: Mtu::Mtu4096,
    };
    Qp::new(cfg, &DeviceLimits::default()).unwrap()
}

/// A run: `n` flows into a bottleneck `b` for `run` (the first `warmup` not measured), links
/// of `latency` each way losing `loss` of their datagrams at random, the QPs recovering by
/// selective repeat or go-back-N.
struct Setup {
    seed: u64,
    n: usize,
    b: Bottleneck,
    latency: Duration,
    loss: f64,
    selective: bool,
    warmup: Duration,
    run: Duration,
    /// The size of each WRITE.
    msg: u32,
}

impl Setup {
    fn new(seed: u64, n: usize, b: Bottleneck) -> Setup {
        Setup {
            seed,
            n,
            b,
            latency: Duration::from_micros(10),
            loss: 0.0,
            selective: true,
            warmup: Duration::from_millis(20),
            run: Duration::from_millis(80),
            msg: MSG,
        }
    }
}

/// Runs `s`; returns what happened.
fn incast(s: Setup) -> Report {
    let Setup {
        seed,
        n,
        b,
        latency,
        loss,
        selective,
        warmup,
        run,
        msg,
    } = s;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let rx_ip: IpAddr = "10.9.0.100".parse().unwrap();
    let mut sim: Sim<Host> = Sim::new(seed);
    sim.set_default_link(LinkConfig {
        latency,
        loss,
        ..LinkConfig::IDEAL
    })
    .unwrap();
    let mut rx = Host::new(rx_ip, seed ^ 0xBEEF);
    let mut flows = Vec::new();
    let mut senders = Vec::new();
    for i in 0..n {
        let ip: IpAddr = format!("10.9.0.{}", i + 1).parse().unwrap();
        let mut h = Host::new(ip, seed ^ i as u64);
        let (qa, qb) = (0x100 + i as u32, 0x200 + i as u32);
        let mut a = qp(qa);
        let mut bq = qp(qb);
        let (pa, pb) = (1000 * i as u32, 7_000_000 + i as u32);
        rc_connect(&mut a, Qpn::new(qb), rx_ip, pa, pb, Mtu::Mtu1024, 14);
        rc_connect(&mut bq, Qpn::new(qa), ip, pb, pa, Mtu::Mtu1024, 14);
        if selective {
            a.set_reliability(Reliability::SelectiveRepeat);
            bq.set_reliability(Reliability::SelectiveRepeat);
        }
        let keys = h
            .mrs
            .register(PdId(1), SRC, u64::from(msg), access)
            .unwrap();
        h.mem.insert(keys.handle, vec![i as u8; msg as usize]);
        let dk = rx
            .mrs
            .register(
                PdId(1),
                DST + (i as u64) * u64::from(msg),
                u64::from(msg),
                access,
            )
            .unwrap();
        rx.mem.insert(dk.handle, vec![0; msg as usize]);
        h.add_qp(a);
        rx.add_qp(bq);
        senders.push((h, qa, keys, dk.rkey.unwrap()));
    }
    sim.set_bottleneck(rx_ip, b).unwrap();
    sim.add_host(rx_ip, rx).unwrap();
    for (h, qpn, keys, rkey) in senders {
        let ip = h.ip;
        let host = sim.add_host(ip, h).unwrap();
        flows.push(Flow {
            host,
            qpn,
            keys,
            rkey,
            posted: 0,
            slices: Vec::new(),
        });
    }
    let slice = Duration::from_micros(500);
    let slices = (run.as_nanos() / slice.as_nanos()) as usize;
    let mut errors = Vec::new();
    for k in 0..slices {
        for (i, f) in flows.iter_mut().enumerate() {
            let h = sim.endpoint_mut(f.host);
            let mut done = 0u64;
            while let Some((_, wc)) = h.qp(f.qpn).poll_completion() {
                if wc.status.is_success() {
                    done += u64::from(msg);
                } else {
                    errors.push(wc.status);
                }
                f.posted -= 1;
            }
            if k > 0 {
                f.slices.push(done);
            }
            while f.posted < DEPTH {
                let wr = SendWr::new(
                    f.posted as u64,
                    SendOp::Write {
                        remote_addr: DST + (i as u64) * u64::from(msg),
                        rkey: f.rkey,
                    },
                    [Sge {
                        addr: SRC,
                        length: msg,
                        lkey: f.keys.lkey,
                    }]
                    .into_iter()
                    .collect::<SgeList>(),
                );
                if h.qp(f.qpn).post_send(wr).is_err() {
                    break;
                }
                f.posted += 1;
            }
        }
        sim.run_until(Instant::ZERO + slice * (k as u32 + 1));
    }
    let skip = (warmup.as_nanos() / slice.as_nanos()) as usize;
    let measured = slice * (slices - 1 - skip) as u32;
    let goodput = flows
        .iter()
        .map(|f| f.slices[skip..].iter().sum::<u64>() as f64 / measured.as_secs_f64())
        .collect();
    let longest_idle = flows
        .iter()
        .map(|f| {
            let mut longest = 0;
            let mut run = 0;
            for &b in &f.slices[skip..] {
                run = if b == 0 { run + 1 } else { 0 };
                longest = longest.max(run);
            }
            slice * longest
        })
        .max()
        .unwrap_or_default();
    for f in &flows {
        let q = sim.endpoint_mut(f.host).qp(f.qpn);
        let c = q.counters();
        eprintln!(
            "  flow {:#x}: {:?}, retransmitted {}, SACKs/NAKs {}, ACK timeouts {}, probes {}",
            f.qpn,
            q.congestion(),
            c.retransmitted_pkts,
            c.rcvd_seq_err,
            c.local_ack_timeout_err,
            c.tlp_probes
        );
    }
    let mut sum = |f: fn(&mut Qp) -> u64| {
        flows
            .iter()
            .map(|fl| f(sim.endpoint_mut(fl.host).qp(fl.qpn)))
            .sum::<u64>()
    };
    let cnps = sum(|q| q.counters().rp_cnp_handled);
    let probes = sum(|q| q.counters().tlp_probes);
    let timeouts = sum(|q| q.congestion().timeouts);
    Report {
        goodput,
        longest_idle,
        port: sim.port_stats(rx_ip).unwrap(),
        cnps,
        probes,
        timeouts,
        errors,
        msg,
    }
}

const GBIT: u64 = 1_000_000_000;

fn bottleneck(rate_bps: u64, queue: u64, ecn: Option<EcnMarking>) -> Bottleneck {
    Bottleneck {
        rate_bps,
        overhead_bytes: 66,
        queue_limit_bytes: queue,
        ecn,
    }
}

fn check_shared(r: &Report, rate_bps: u64, what: &str) {
    let sum: f64 = r.goodput.iter().sum();
    // Payload goodput against the wire rate: headers (28 B transport + 66 B framing per
    // 1 KiB packet) take ~8 %.
    let wire = rate_bps as f64 / 8.0 * 1024.0 / (1024.0 + 28.0 + 66.0);
    let j = jain(&r.goodput);
    eprintln!(
        "{what}: sum {:.0} MB/s of {:.0} ({:.2}), Jain {j:.3}, longest idle {:?}, port {:?}, \
         cnps {}",
        sum / 1e6,
        wire / 1e6,
        sum / wire,
        r.longest_idle,
        r.port,
        r.cnps
    );
    assert!(r.errors.is_empty(), "{what}: errors {:?}", r.errors);
    assert!(sum >= 0.9 * wire, "{what}: the flows fill the bottleneck");
    assert!(j >= 0.9, "{what}: Jain's index {j:.3} ({:?})", r.goodput);
    // A flow completes a message every `n · msg / rate` at its fair share: it may go that
    // long several times over without one (a whole window lost at a full queue waits for a
    // probe or a timeout), but no longer than 25 ms or five messages.
    let message = Duration::from_secs_f64(r.goodput.len() as f64 * f64::from(r.msg) / wire);
    let idle = Duration::from_millis(25).max(message * 5);
    assert!(
        r.longest_idle <= idle,
        "{what}: a flow made no progress for {:?} (allowed {idle:?})",
        r.longest_idle
    );
}

#[test]
fn eight_flows_share_a_drop_tail_bottleneck() {
    // 10 Gb/s, a 256 KiB queue (200 µs), 10 µs links each way.
    let r = incast(Setup::new(1, 8, bottleneck(10 * GBIT, 256 << 10, None)));
    check_shared(&r, 10 * GBIT, "8 flows, drop-tail");
}

#[test]
fn flows_of_large_messages_share_a_drop_tail_bottleneck() {
    // 1 MiB WRITEs: a message takes its 1,024 PSNs when it starts, long before they are
    // sent. A loss episode that lasted until the ACK passed the message's last PSN (not the
    // last one sent) kept a flow's window at its floor for the rest of the message, and its
    // share went to the others.
    let mut s = Setup::new(6, 4, bottleneck(10 * GBIT, 256 << 10, None));
    s.msg = 1 << 20;
    s.run = Duration::from_millis(120);
    let r = incast(s);
    check_shared(&r, 10 * GBIT, "4 flows of 1 MiB messages, drop-tail");
}

#[test]
fn sixteen_flows_share_a_drop_tail_bottleneck() {
    let r = incast(Setup::new(2, 16, bottleneck(10 * GBIT, 256 << 10, None)));
    check_shared(&r, 10 * GBIT, "16 flows, drop-tail");
}

#[test]
fn ecn_marking_keeps_the_queue_short() {
    // RED/ECN: mark from 20 KiB, always from 200 KiB; the queue holds 1 MiB.
    let marking = EcnMarking {
        min_bytes: 20 << 10,
        max_bytes: 200 << 10,
        max_prob: 0.1,
    };
    let mut s = Setup::new(3, 8, bottleneck(10 * GBIT, 1 << 20, Some(marking)));
    // DCQCN converges slowly from the unequal rates the first CNPs cut.
    s.warmup = Duration::from_millis(60);
    s.run = Duration::from_millis(160);
    let r = incast(s);
    check_shared(&r, 10 * GBIT, "8 flows, RED/ECN");
    assert!(r.cnps > 0, "CE marks came back as CNPs");
    assert_eq!(r.port.dropped, 0, "marking, not dropping");
    assert!(
        r.port.mean_queue_bytes() < 100 << 10,
        "the queue stays short: mean {} B",
        r.port.mean_queue_bytes()
    );
}

#[test]
fn one_paced_flow_fills_an_ecn_bottleneck_without_probing() {
    // One flow alone at 1 Gb/s, marked from 10 KiB of queue: CNPs cut its rate again and
    // again, and the pacer then spreads its packets. Each packet after which the pacer holds
    // the next asks for an ACK: without that, the packets sent since the last ACK request
    // waited out the pacer's gap unacknowledged, and the tail loss probe fired once or
    // twice per CNP (the RTO now and then) although nothing was lost: in the lab 8,000–9,200
    // probes for 4,100–4,500 CNPs in 4 s (benchmarks/README.md, "Tail loss probes in every
    // pacing gap").
    let marking = EcnMarking {
        min_bytes: 10 << 10,
        max_bytes: 100 << 10,
        max_prob: 0.1,
    };
    let mut s = Setup::new(7, 1, bottleneck(GBIT, 1 << 20, Some(marking)));
    s.msg = 1 << 20;
    s.warmup = Duration::from_millis(40);
    s.run = Duration::from_millis(240);
    let r = incast(s);
    check_shared(&r, GBIT, "1 flow, RED/ECN");
    assert!(r.cnps > 0, "the flow was marked");
    assert!(
        r.probes + r.timeouts <= r.cnps / 20,
        "{} probes and {} timeouts for {} CNPs, nothing lost",
        r.probes,
        r.timeouts,
        r.cnps
    );
}

#[test]
fn delay_keeps_a_deep_queue_from_filling() {
    // 1 Gb/s with 4 MiB of buffer (33 ms): loss would come only after the queue is full;
    // the delay policy holds it within a few times its RTT target (1 ms) instead.
    let mut s = Setup::new(4, 8, bottleneck(GBIT, 4 << 20, None));
    s.warmup = Duration::from_millis(40);
    s.run = Duration::from_millis(200);
    let r = incast(s);
    check_shared(&r, GBIT, "8 flows, deep drop-tail");
    assert_eq!(r.port.dropped, 0, "the queue never filled");
    let mean_us = r.port.mean_queue_bytes() as f64 * 8.0 / 1e3;
    assert!(
        mean_us < 4000.0,
        "mean queue {mean_us:.0} µs of 33 ms: held within a few times the delay target"
    );
}

#[test]
fn selective_repeat_keeps_goodput_under_random_loss() {
    // One flow, 1 % of datagrams lost at random (both directions), 10 Gb/s.
    let goodput = |selective: bool| {
        let mut s = Setup::new(5, 1, bottleneck(10 * GBIT, 1 << 20, None));
        s.loss = 0.01;
        s.selective = selective;
        let r = incast(s);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        r.goodput[0]
    };
    let wire = 10e9 / 8.0 * 1024.0 / (1024.0 + 28.0 + 66.0);
    let (sr, gbn) = (goodput(true), goodput(false));
    eprintln!(
        "1 % loss: selective repeat {:.0} MB/s ({:.2} of the link), go-back-N {:.0} MB/s ({:.2})",
        sr / 1e6,
        sr / wire,
        gbn / 1e6,
        gbn / wire
    );
    assert!(
        sr >= 0.4 * wire,
        "selective repeat keeps 40 % of the link at least"
    );
    assert!(sr >= 3.0 * gbn, "and does much better than go-back-N");
}
