//! Behaviour of the simulator, driven by a toy scripted/echo endpoint.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use srdma_sim::{
    Capture, DropReason, Endpoint, HostId, Instant, LinkConfig, Outcome, Rng, Sim, SimError,
    TraceKind, Transmit,
};

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}
fn sa(n: u8) -> SocketAddr {
    SocketAddr::new(ip(n), 4791)
}
fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}
fn at_us(n: u64) -> Instant {
    Instant::ZERO + us(n)
}

/// Sends its script at the scheduled instants, echoes what it receives when `echo` is set,
/// arms the timers in `timers`, and logs everything.
#[derive(Debug, Default)]
struct Node {
    me: Option<SocketAddr>,
    echo: bool,
    script: VecDeque<(Instant, SocketAddr, Vec<u8>)>,
    replies: VecDeque<(SocketAddr, Vec<u8>)>,
    timers: VecDeque<Instant>,
    sent: Vec<(Instant, Vec<u8>)>,
    received: Vec<(Instant, SocketAddr, Vec<u8>)>,
    fired: Vec<Instant>,
}

impl Node {
    fn new(me: SocketAddr) -> Node {
        Node {
            me: Some(me),
            ..Node::default()
        }
    }
    fn echo(me: SocketAddr) -> Node {
        Node {
            echo: true,
            ..Node::new(me)
        }
    }
    fn send_at(&mut self, at: Instant, dst: SocketAddr, payload: Vec<u8>) {
        self.script.push_back((at, dst, payload));
    }
    fn payloads(&self) -> Vec<Vec<u8>> {
        self.received.iter().map(|r| r.2.clone()).collect()
    }
}

impl Endpoint for Node {
    fn handle_datagram(&mut self, now: Instant, src: SocketAddr, _dst: SocketAddr, p: &[u8]) {
        self.received.push((now, src, p.to_vec()));
        if self.echo {
            self.replies.push_back((src, p.to_vec()));
        }
    }
    fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (dst, p) = match self.replies.pop_front() {
            Some(r) => r,
            None if self.script.front().is_some_and(|s| s.0 <= now) => {
                let (_, dst, p) = self.script.pop_front()?;
                (dst, p)
            }
            None => return None,
        };
        buf.extend_from_slice(&p);
        self.sent.push((now, p));
        Some(Transmit::new(self.me?, dst))
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        let s = self.script.front().map(|s| s.0);
        let t = self.timers.front().copied();
        s.into_iter().chain(t).min()
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.fired.push(now);
        while self.timers.front().is_some_and(|&t| t <= now) {
            self.timers.pop_front();
        }
    }
}

/// Host 1 sends `count` numbered datagrams of `len` bytes to host 2, one every `gap`.
fn one_way(
    seed: u64,
    cfg: LinkConfig,
    count: u32,
    len: usize,
    gap: Duration,
) -> (Sim<Node>, HostId, HostId) {
    let mut sim = Sim::new(seed);
    sim.set_default_link(cfg).unwrap();
    let mut a = Node::new(sa(1));
    for i in 0..count {
        let mut p = vec![0u8; len.max(4)];
        p[..4].copy_from_slice(&i.to_be_bytes());
        a.send_at(Instant::ZERO + gap * i, sa(2), p);
    }
    let a = sim.add_host(ip(1), a).unwrap();
    let b = sim.add_host(ip(2), Node::new(sa(2))).unwrap();
    (sim, a, b)
}

fn seqs(node: &Node) -> Vec<u32> {
    node.received
        .iter()
        .map(|r| u32::from_be_bytes(r.2[..4].try_into().unwrap()))
        .collect()
}

/// Every datagram sent is delivered, dropped, or still in flight (duplicates count twice).
fn assert_balanced(sim: &Sim<Node>) {
    let t = sim.total_stats();
    assert_eq!(
        t.sent + t.duplicated,
        t.delivered + t.dropped() + sim.in_flight() as u64,
        "{t:?}"
    );
}

#[test]
fn latency_delivers_at_exactly_the_latency() {
    let mut sim = Sim::new(1);
    sim.set_links(
        ip(1),
        ip(2),
        LinkConfig {
            latency: us(10),
            ..LinkConfig::IDEAL
        },
    )
    .unwrap();
    let mut a = Node::new(sa(1));
    a.send_at(Instant::ZERO, sa(2), b"one".to_vec());
    a.send_at(at_us(1000), sa(2), b"two".to_vec());
    let a = sim.add_host(ip(1), a).unwrap();
    let b = sim.add_host(ip(2), Node::echo(sa(2))).unwrap();
    assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Idle);
    let times = |n: &Node| n.received.iter().map(|r| r.0).collect::<Vec<_>>();
    assert_eq!(times(sim.endpoint(b)), [at_us(10), at_us(1010)]);
    assert_eq!(times(sim.endpoint(a)), [at_us(20), at_us(1020)]);
    assert_eq!(
        sim.endpoint(a).payloads(),
        [b"one".to_vec(), b"two".to_vec()]
    );
    assert_eq!(sim.endpoint(b).received[0].1, sa(1));
    assert_eq!(sim.now(), at_us(1020));
    let s = sim.link_stats(ip(1), ip(2));
    assert_eq!(
        (s.sent, s.delivered, s.sent_bytes, s.delivered_bytes),
        (2, 2, 6, 6)
    );
    assert_balanced(&sim);
}

#[test]
fn bandwidth_serializes_back_to_back() {
    // 1250 bytes at 1 Gb/s = 10 us on the wire each, plus 1 us of latency.
    let cfg = LinkConfig {
        latency: us(1),
        bandwidth_bps: Some(1_000_000_000),
        ..LinkConfig::IDEAL
    };
    assert_eq!(cfg.serialization_delay(1250), us(10));
    let (mut sim, _, b) = one_way(1, cfg, 5, 1250, Duration::ZERO);
    sim.run_until_idle(Instant::MAX);
    let arrivals: Vec<_> = sim.endpoint(b).received.iter().map(|r| r.0).collect();
    assert_eq!(arrivals, [11, 21, 31, 41, 51].map(at_us));
    assert_eq!(seqs(sim.endpoint(b)), [0, 1, 2, 3, 4]);

    // The per-packet overhead counts for serialization: 1250 + 1250 bytes = 20 us.
    let cfg = LinkConfig {
        overhead_bytes: 1250,
        ..cfg
    };
    let (mut sim, _, b) = one_way(1, cfg, 2, 1250, Duration::ZERO);
    sim.run_until_idle(Instant::MAX);
    let arrivals: Vec<_> = sim.endpoint(b).received.iter().map(|r| r.0).collect();
    assert_eq!(arrivals, [21, 41].map(at_us));
}

#[test]
fn full_queue_tail_drops() {
    let cfg = LinkConfig {
        bandwidth_bps: Some(1_000_000_000),
        queue_limit_bytes: Some(3 * 1250),
        ..LinkConfig::IDEAL
    };
    let (mut sim, a, b) = one_way(1, cfg, 10, 1250, Duration::ZERO);
    sim.endpoint_mut(a)
        .send_at(at_us(100), sa(2), vec![0xEE; 1250]);
    sim.enable_trace();
    sim.run_until_idle(Instant::MAX);
    assert_eq!(seqs(sim.endpoint(b)), [0, 1, 2, 0xEEEE_EEEE]);
    let s = sim.link_stats(ip(1), ip(2));
    assert_eq!((s.sent, s.delivered, s.queue_dropped), (11, 4, 7));
    let drops = sim
        .trace()
        .iter()
        .filter(|e| matches!(e.kind, TraceKind::Dropped(_, DropReason::QueueFull)))
        .count();
    assert_eq!(drops, 7);
    assert_balanced(&sim);
}

#[test]
fn loss_rate_matches_the_probability() {
    let n = 20_000;
    let cfg = LinkConfig {
        loss: 0.1,
        latency: us(3),
        ..LinkConfig::IDEAL
    };
    let (mut sim, _, b) = one_way(7, cfg, n, 16, us(1));
    sim.run_until_idle(Instant::MAX);
    let s = sim.link_stats(ip(1), ip(2));
    let rate = s.lost as f64 / f64::from(n);
    assert!((0.09..0.11).contains(&rate), "loss rate {rate}");
    assert_eq!(s.delivered + s.lost, u64::from(n));
    assert_eq!(sim.endpoint(b).received.len() as u64, s.delivered);
    // Survivors arrive in order: loss alone does not reorder.
    assert!(seqs(sim.endpoint(b)).is_sorted());
    assert_balanced(&sim);
}

#[test]
fn duplication_delivers_copies() {
    let cfg = LinkConfig {
        duplicate: 1.0,
        latency: us(2),
        ..LinkConfig::IDEAL
    };
    let (mut sim, _, b) = one_way(3, cfg, 100, 8, us(1));
    sim.run_until_idle(Instant::MAX);
    let s = sim.link_stats(ip(1), ip(2));
    assert_eq!((s.sent, s.duplicated, s.delivered), (100, 100, 200));
    let got = seqs(sim.endpoint(b));
    for i in 0..100 {
        assert_eq!(got.iter().filter(|&&x| x == i).count(), 2);
    }

    let cfg = LinkConfig {
        duplicate: 0.25,
        ..cfg
    };
    let (mut sim, _, _) = one_way(3, cfg, 10_000, 8, us(1));
    sim.run_until_idle(Instant::MAX);
    let s = sim.link_stats(ip(1), ip(2));
    let rate = s.duplicated as f64 / 10_000.0;
    assert!((0.23..0.27).contains(&rate), "duplicate rate {rate}");
    assert_eq!(s.delivered, s.sent + s.duplicated);
    assert_balanced(&sim);
}

#[test]
fn reordering_reorders() {
    let cfg = LinkConfig {
        latency: us(10),
        reorder: 0.2,
        reorder_delay: us(5),
        ..LinkConfig::IDEAL
    };
    let (mut sim, _, b) = one_way(11, cfg, 1000, 8, us(1));
    sim.run_until_idle(Instant::MAX);
    let got = seqs(sim.endpoint(b));
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..1000).collect::<Vec<_>>(),
        "everything arrives once"
    );
    let inversions = got.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(inversions > 50, "only {inversions} inversions");
    let s = sim.link_stats(ip(1), ip(2));
    assert!((150..250).contains(&s.reordered), "{}", s.reordered);
    // A held-back datagram arrives exactly latency + reorder_delay after it was sent.
    for (t, _, p) in &sim.endpoint(b).received {
        let i = u64::from(u32::from_be_bytes(p[..4].try_into().unwrap()));
        let delay = *t - at_us(i);
        assert!(delay == us(10) || delay == us(15), "{delay:?}");
    }
}

#[test]
fn jitter_stays_within_bounds() {
    let cfg = LinkConfig {
        latency: us(10),
        jitter: us(5),
        ..LinkConfig::IDEAL
    };
    let (mut sim, _, b) = one_way(5, cfg, 1000, 8, us(100));
    sim.run_until_idle(Instant::MAX);
    let delays: Vec<_> = sim
        .endpoint(b)
        .received
        .iter()
        .map(|(t, _, p)| {
            *t - at_us(100 * u64::from(u32::from_be_bytes(p[..4].try_into().unwrap())))
        })
        .collect();
    assert_eq!(delays.len(), 1000);
    assert!(delays.iter().all(|d| (us(10)..=us(15)).contains(d)));
    assert!(delays.iter().any(|&d| d < us(11)) && delays.iter().any(|&d| d > us(14)));
}

#[test]
fn corruption_flips_exactly_one_bit() {
    let cfg = LinkConfig {
        corrupt: 1.0,
        ..LinkConfig::IDEAL
    };
    let mut sim = Sim::new(9);
    sim.set_default_link(cfg).unwrap();
    let mut a = Node::new(sa(1));
    let mut rng = Rng::new(1);
    let mut sent = Vec::new();
    for i in 0..1000 {
        let p: Vec<u8> = (0..1 + i % 64).map(|_| rng.next_u64() as u8).collect();
        sent.push(p.clone());
        a.send_at(at_us(i), sa(2), p);
    }
    a.send_at(at_us(2000), sa(2), Vec::new());
    sim.add_host(ip(1), a).unwrap();
    let b = sim.add_host(ip(2), Node::new(sa(2))).unwrap();
    sim.run_until_idle(Instant::MAX);
    let got = sim.endpoint(b).payloads();
    assert_eq!(got.len(), 1001);
    for (s, g) in sent.iter().zip(&got) {
        let flipped: u32 = s.iter().zip(g).map(|(x, y)| (x ^ y).count_ones()).sum();
        assert_eq!((s.len(), flipped), (g.len(), 1));
    }
    assert!(got[1000].is_empty(), "an empty payload stays empty");
    assert_eq!(sim.link_stats(ip(1), ip(2)).corrupted, 1000);
}

/// Echo traffic over a link with every impairment, traced.
fn faulty_run(seed: u64) -> Vec<srdma_sim::TraceEvent> {
    let cfg = LinkConfig {
        latency: us(5),
        jitter: us(3),
        bandwidth_bps: Some(10_000_000_000),
        queue_limit_bytes: Some(20_000),
        loss: 0.05,
        duplicate: 0.05,
        reorder: 0.1,
        reorder_delay: us(4),
        corrupt: 0.05,
        ..LinkConfig::IDEAL
    };
    let mut sim = Sim::new(seed).with_trace();
    sim.set_default_link(cfg).unwrap();
    let mut a = Node::new(sa(1));
    for i in 0..500u32 {
        a.send_at(
            Instant::ZERO + Duration::from_nanos(u64::from(i) * 700),
            sa(2),
            vec![i as u8; 1000],
        );
    }
    sim.add_host(ip(1), a).unwrap();
    sim.add_host(ip(2), Node::echo(sa(2))).unwrap();
    assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Idle);
    sim.take_trace()
}

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    let one = faulty_run(1234);
    assert!(one.len() > 1500);
    assert_eq!(one, faulty_run(1234));
    assert_ne!(one, faulty_run(1235));
    for kind in [DropReason::Lost, DropReason::QueueFull] {
        let hit =
            |e: &srdma_sim::TraceEvent| matches!(e.kind, TraceKind::Dropped(_, k) if k == kind);
        assert!(one.iter().any(hit), "{kind:?} happens");
    }
}

#[test]
fn unrelated_traffic_does_not_change_a_links_faults() {
    let cfg = LinkConfig {
        loss: 0.3,
        jitter: us(7),
        ..LinkConfig::IDEAL
    };
    let run = |extra: bool| {
        let (mut sim, _, b) = one_way(77, cfg, 300, 8, us(1));
        if extra {
            let mut c = Node::new(sa(3));
            for i in 0..300 {
                c.send_at(at_us(i), sa(4), vec![1; 8]);
            }
            sim.add_host(ip(3), c).unwrap();
            sim.add_host(ip(4), Node::new(sa(4))).unwrap();
        }
        sim.run_until_idle(Instant::MAX);
        sim.endpoint(b).received.clone()
    };
    assert_eq!(run(false), run(true));
}

/// A `Write` whose bytes the test can read back after the simulator took the writer.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);
impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn roce_packet(src: SocketAddr, dst: SocketAddr, psn: u32) -> Vec<u8> {
    use srdma_wire::{BthRepr, Encap, IpRepr, Opcode, PacketRepr, Psn, Qpn};
    let bth = BthRepr {
        opcode: Opcode::RcSendOnly,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x11),
        ack_req: true,
        psn: Psn::new(psn),
    };
    let payload = psn.to_be_bytes().repeat(8);
    let repr = PacketRepr::new(bth, &payload);
    let encap = Encap {
        ip: IpRepr::between(src.ip(), dst.ip()).unwrap(),
        src_port: src.port(),
        dst_port: dst.port(),
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit_with_icrc(&mut buf, &encap).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn pcap_tap_records_what_was_sent_and_what_arrived() {
    use srdma_wire::frame::{IcrcStatus, roce_in_frame};
    use srdma_wire::pcap::{LINKTYPE_RAW, Reader};

    let cfg = LinkConfig {
        latency: us(2),
        loss: 0.2,
        corrupt: 0.3,
        ..LinkConfig::IDEAL
    };
    let (tx, rx) = (Shared::default(), Shared::default());
    let mut sim = Sim::new(21);
    sim.set_pcap_writer(Capture::Tx, Box::new(tx.clone()))
        .unwrap();
    sim.set_pcap_writer(Capture::Rx, Box::new(rx.clone()))
        .unwrap();
    sim.set_default_link(cfg).unwrap();
    let src = SocketAddr::new(ip(1), 49152);
    let mut a = Node::new(src);
    for psn in 0..200 {
        a.send_at(at_us(u64::from(psn)), sa(2), roce_packet(src, sa(2), psn));
    }
    let a = sim.add_host(ip(1), a).unwrap();
    let b = sim.add_host(ip(2), Node::new(sa(2))).unwrap();
    sim.run_until_idle(Instant::MAX);
    sim.flush_pcap().unwrap();

    let check = |bytes: &[u8], want: Vec<(Instant, Vec<u8>)>, (from, to)| {
        let reader = Reader::new(bytes).unwrap();
        assert_eq!(reader.linktype(), LINKTYPE_RAW);
        let mut bad = 0;
        let records: Vec<_> = reader.map(|r| r.unwrap()).collect();
        assert_eq!(records.len(), want.len());
        for (rec, (t, payload)) in records.iter().zip(want) {
            assert_eq!(rec.ts_ns, t.as_nanos());
            let f = roce_in_frame(LINKTYPE_RAW, rec.data).unwrap().unwrap();
            assert_eq!(f.roce, payload.as_slice());
            assert_eq!((f.encap.src_port, f.encap.dst_port), (49152, 4791));
            assert_eq!((f.encap.ip.src(), f.encap.ip.dst()), (from, to));
            if f.icrc_status() != IcrcStatus::Ok {
                bad += 1;
            }
        }
        bad
    };
    let sent = sim.endpoint(a).sent.clone();
    assert_eq!(check(&tx.0.lock().unwrap(), sent, (ip(1), ip(2))), 0);
    let got = sim
        .endpoint(b)
        .received
        .iter()
        .map(|r| (r.0, r.2.clone()))
        .collect();
    let bad = check(&rx.0.lock().unwrap(), got, (ip(1), ip(2)));
    let s = sim.link_stats(ip(1), ip(2));
    // A flip in the masked BTH byte escapes the ICRC; every other flip is caught.
    assert!(
        bad > 0 && bad <= s.corrupted,
        "{bad} bad of {}",
        s.corrupted
    );
    assert_eq!(s.delivered as usize, sim.endpoint(b).received.len());
}

#[test]
fn pcap_files_land_in_the_directory() {
    let dir = std::env::temp_dir().join(format!("srdma-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sim, _, _) = one_way(1, LinkConfig::IDEAL, 3, 40, us(1));
    let mut sim = sim.with_pcap_in(&dir, "pcap::files").unwrap();
    sim.run_until_idle(Instant::MAX);
    drop(sim); // flushes
    for name in ["pcap__files.pcap", "pcap__files.rx.pcap"] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let n = srdma_wire::pcap::Reader::new(&bytes).unwrap().count();
        assert_eq!(n, 3, "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cut_link_drops_everything_including_what_is_in_flight() {
    let cfg = LinkConfig {
        latency: us(100),
        ..LinkConfig::IDEAL
    };
    let (mut sim, _, b) = one_way(1, cfg, 100, 8, us(10));
    // Sent at 0..40 us arrive by 140 us; those sent at 50..90 are in flight at 145 us.
    sim.run_until(at_us(145));
    assert_eq!(seqs(sim.endpoint(b)), [0, 1, 2, 3, 4]);
    sim.cut_link(ip(1), ip(2));
    // Up to and including the deadline: the datagram sent at 400 us would still be cut.
    sim.run_until(at_us(395));
    sim.restore_link(ip(1), ip(2));
    sim.run_until_idle(Instant::MAX);
    // 5..=14 were in flight at the cut, 15..=39 were sent while it was down.
    let expected: Vec<u32> = (0..5).chain(40..100).collect();
    assert_eq!(seqs(sim.endpoint(b)), expected);
    assert_eq!(sim.link_stats(ip(1), ip(2)).link_down, 35);
    assert_balanced(&sim);
}

#[test]
fn one_way_partition() {
    let mut sim = Sim::new(1);
    let mut a = Node::new(sa(1));
    a.send_at(Instant::ZERO, sa(2), b"ping".to_vec());
    let a = sim.add_host(ip(1), a).unwrap();
    let b = sim.add_host(ip(2), Node::echo(sa(2))).unwrap();
    sim.set_link_up(ip(2), ip(1), false);
    sim.run_until_idle(Instant::MAX);
    assert_eq!(sim.endpoint(b).received.len(), 1);
    assert!(sim.endpoint(a).received.is_empty());
    assert_eq!(sim.link_stats(ip(2), ip(1)).link_down, 1);
}

#[test]
fn dead_host_drops_and_sleeps() {
    let mut sim = Sim::new(1);
    sim.set_default_link(LinkConfig {
        latency: us(1),
        ..LinkConfig::IDEAL
    })
    .unwrap();
    let mut a = Node::new(sa(1));
    a.send_at(at_us(10), sa(2), b"lost".to_vec());
    a.send_at(at_us(100), sa(2), b"kept".to_vec());
    a.send_at(at_us(100), sa(9), b"nobody".to_vec());
    sim.add_host(ip(1), a).unwrap();
    let mut bn = Node::new(sa(2));
    bn.timers.push_back(at_us(20));
    let b = sim.add_host(ip(2), bn).unwrap();
    sim.set_host_up(b, false);
    assert_eq!(sim.run_until(at_us(50)), Outcome::Deadline);
    assert!(
        sim.endpoint(b).fired.is_empty(),
        "a dead host's timer does not fire"
    );
    sim.set_host_up(b, true);
    sim.run_until_idle(Instant::MAX);
    assert_eq!(
        sim.endpoint(b).fired,
        [at_us(50)],
        "an overdue timer fires on revival"
    );
    assert_eq!(sim.endpoint(b).payloads(), [b"kept".to_vec()]);
    assert_eq!(sim.link_stats(ip(1), ip(2)).unreachable, 1);
    assert_eq!(sim.link_stats(ip(1), ip(9)).unreachable, 1);
}

#[test]
fn timeouts_fire_at_the_requested_virtual_time() {
    let mut sim = Sim::new(1).with_trace();
    let mut x = Node::new(sa(1));
    x.timers.extend([
        at_us(5),
        at_us(1000),
        Instant::ZERO + Duration::from_secs(30),
    ]);
    let mut y = Node::new(sa(2));
    y.timers.push_back(at_us(1000));
    let x = sim.add_host(ip(1), x).unwrap();
    let y = sim.add_host(ip(2), y).unwrap();
    assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Idle);
    assert_eq!(
        sim.endpoint(x).fired,
        [
            at_us(5),
            at_us(1000),
            Instant::ZERO + Duration::from_secs(30)
        ]
    );
    assert_eq!(sim.endpoint(y).fired, [at_us(1000)]);
    assert_eq!(sim.now(), Instant::ZERO + Duration::from_secs(30));
    // Same instant: host order.
    let kinds: Vec<_> = sim.trace().iter().map(|e| (e.at, e.kind)).collect();
    assert_eq!(
        kinds[1..3],
        [
            (at_us(1000), TraceKind::Timeout(x)),
            (at_us(1000), TraceKind::Timeout(y))
        ]
    );
}

#[test]
fn run_outcomes() {
    let cfg = LinkConfig {
        latency: us(10),
        ..LinkConfig::IDEAL
    };
    let (mut sim, _, b) = one_way(1, cfg, 10, 8, us(10));
    let o = sim.run_while(|s| s.endpoint(b).received.len() < 3, Instant::MAX);
    assert_eq!((o, sim.now()), (Outcome::Stopped, at_us(30)));
    assert_eq!(sim.run_until(at_us(55)), Outcome::Deadline);
    assert_eq!((sim.now(), sim.endpoint(b).received.len()), (at_us(55), 5));
    assert_eq!(sim.run_until_idle(at_us(70)), Outcome::Deadline);
    assert_eq!(sim.now(), at_us(70));
    assert!(sim.step());
    assert_eq!(sim.now(), at_us(80));
    assert_eq!(sim.run_for(us(1000)), Outcome::Idle);
    assert_eq!(sim.now(), at_us(1080));
    assert_eq!(sim.run_while(|_| true, Instant::MAX), Outcome::Idle);
    assert!(!sim.step());
}

#[test]
fn zero_latency_ping_pong_stalls_instead_of_hanging() {
    let mut sim = Sim::new(1);
    sim.set_stall_limit(Some(1000));
    let mut a = Node::echo(sa(1));
    a.send_at(Instant::ZERO, sa(2), b"ball".to_vec());
    sim.add_host(ip(1), a).unwrap();
    sim.add_host(ip(2), Node::echo(sa(2))).unwrap();
    assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Stalled);
    assert_eq!(sim.now(), Instant::ZERO);
    // With latency the same game just runs to the deadline.
    sim.set_default_link(LinkConfig {
        latency: us(1),
        ..LinkConfig::IDEAL
    })
    .unwrap();
    sim.set_stall_limit(None);
    assert_eq!(sim.run_until(at_us(100)), Outcome::Deadline);
}

#[test]
fn bad_configuration_is_a_typed_error() {
    let mut sim: Sim<Node> = Sim::new(1);
    let bad = LinkConfig {
        loss: 1.01,
        ..LinkConfig::IDEAL
    };
    assert_eq!(
        sim.set_default_link(bad),
        Err(SimError::InvalidProbability {
            field: "loss",
            value: 1.01
        })
    );
    let bad = LinkConfig {
        bandwidth_bps: Some(0),
        ..LinkConfig::IDEAL
    };
    assert_eq!(
        sim.set_link(ip(1), ip(2), bad),
        Err(SimError::ZeroBandwidth)
    );
    assert_eq!(sim.link_config(ip(1), ip(2)), LinkConfig::IDEAL);
    sim.add_host(ip(1), Node::new(sa(1))).unwrap();
    assert_eq!(
        sim.add_host(ip(1), Node::new(sa(1))),
        Err(SimError::DuplicateAddress(ip(1)))
    );
    let extreme = LinkConfig {
        latency: Duration::MAX,
        jitter: Duration::MAX,
        reorder: 1.0,
        reorder_delay: Duration::MAX,
        bandwidth_bps: Some(1),
        overhead_bytes: u32::MAX,
        queue_limit_bytes: Some(u64::MAX),
        loss: 0.0,
        duplicate: 1.0,
        corrupt: 1.0,
    };
    let (mut sim, _, b) = one_way(1, extreme, 3, 8, us(1));
    assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Idle);
    assert_eq!(
        sim.endpoint(b).received.len(),
        6,
        "saturated at the end of time"
    );
}

#[test]
fn mixed_endpoint_types_through_box() {
    struct Sink(usize);
    impl Endpoint for Sink {
        fn handle_datagram(&mut self, _: Instant, _: SocketAddr, _: SocketAddr, _: &[u8]) {
            self.0 += 1;
        }
        fn poll_transmit(&mut self, _: Instant, _: &mut Vec<u8>) -> Option<Transmit> {
            None
        }
        fn poll_timeout(&mut self) -> Option<Instant> {
            None
        }
        fn handle_timeout(&mut self, _: Instant) {}
    }
    let mut sim: Sim<Box<dyn Endpoint>> = Sim::new(1);
    let mut a = Node::new(sa(1));
    a.send_at(Instant::ZERO, sa(2), vec![1]);
    sim.add_host(ip(1), Box::new(a)).unwrap();
    sim.add_host(ip(2), Box::new(Sink(0))).unwrap();
    assert_eq!(sim.run_until_idle(Instant::MAX), Outcome::Idle);
    assert_eq!(sim.total_stats().delivered, 1);
}
