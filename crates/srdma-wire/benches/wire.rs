//! Wire-format benchmarks: ICRC, parse + verify, emit + ICRC and header parsing, each next to a
//! `memcpy` of the same packet measured in the same run (see `benchmarks/README.md`).
//!
//! Run with `cargo bench -p srdma-wire --bench wire`. Every figure that moves bytes reports
//! throughput over the whole RoCEv2 packet (BTH to ICRC inclusive), so the ratio of two
//! throughputs is the inverse ratio of their times.
//!
//! The `…/4096` figures run on one packet that stays in L1, the hardest baseline for the ICRC:
//! `memcpy` streams L1 at load + store width while the CRC is bound by carry-less multiplies.
//! The `…/4096/pool*` figures walk a pool of distinct packets (source and destination pools
//! each of the given size) so the data comes from L2 or beyond, as a received packet would.
//!
//! Criterion measures wall time, which other processes on a busy machine inflate. After the
//! criterion run (unfiltered `cargo bench` only) the bench prints a second table: for every
//! workload the fastest of many short batches, which a time slice given to another process
//! rarely hits, with the ratios to the matching `memcpy`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use srdma_wire::{
    BthRepr, Encap, Headers, IpRepr, Opcode, Packet, PacketRepr, Psn, Qpn, RethRepr, icrc, sport,
};

/// Calls per batch of the robust summary.
const BATCH: u32 = 1000;
/// Batches per workload in the robust summary; the fastest counts.
const ROUNDS: u32 = 1000;

/// A packet of `opcode` carrying `payload`, emitted with its ICRC for `encap`.
fn packet(opcode: Opcode, payload: &[u8], encap: &Encap) -> Vec<u8> {
    let bth = BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qpn: Qpn::new(0x11),
        ack_req: false,
        psn: Psn::new(0x1234),
    };
    let mut repr = PacketRepr::new(bth, payload);
    if opcode.headers().contains(Headers::RETH) {
        repr.reth = Some(RethRepr {
            va: 0x7f00_dead_beef_0000,
            rkey: 0x1234_5678,
            dma_len: 1 << 20,
        });
    }
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit_with_icrc(&mut buf, encap).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// The workloads outlive `wire` (the robust summary runs them later), so their packets live for
/// the whole process.
fn leak(v: Vec<u8>) -> &'static [u8] {
    Box::leak(v.into_boxed_slice())
}

fn payload(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + seed) as u8).collect()
}

fn encap() -> Encap {
    Encap {
        ip: IpRepr::between("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()).unwrap(),
        src_port: sport::udp_sport(0, 0x11, 0x11),
        dst_port: srdma_wire::ROCEV2_PORT,
    }
}

/// A workload of the robust summary: runs one batch of `BATCH` calls, returns ns per call.
type Batch = Box<dyn FnMut() -> f64>;

/// One row of the robust summary.
struct Row {
    name: String,
    bytes: Option<u64>,
    baseline: Option<&'static str>,
    batch: Batch,
    best: f64,
}

/// Runs criterion on each workload and keeps it for the robust summary.
struct Runner<'c> {
    g: BenchmarkGroup<'c, WallTime>,
    rows: Vec<Row>,
}

impl Runner<'_> {
    fn run<R>(
        &mut self,
        name: &str,
        bytes: Option<u64>,
        baseline: Option<&'static str>,
        mut f: impl FnMut() -> R + 'static,
    ) {
        self.g.throughput(match bytes {
            Some(n) => Throughput::Bytes(n),
            None => Throughput::Elements(1),
        });
        self.g.bench_function(name, |b| b.iter(&mut f));
        let batch = move || {
            let t = Instant::now();
            for _ in 0..BATCH {
                black_box(f());
            }
            t.elapsed().as_nanos() as f64 / f64::from(BATCH)
        };
        self.rows.push(Row {
            name: name.to_owned(),
            bytes,
            baseline,
            batch: Box::new(batch),
            best: f64::MAX,
        });
    }
}

/// `memcpy` and `icrc::compute` of 4096-byte-payload packets taken in turn from a pool of
/// `pool_bytes` (and copied into a second pool of the same size), so neither runs from L1.
fn pooled(r: &mut Runner<'_>, encap: Encap, pool_bytes: usize, copy: &'static str, crc: &str) {
    let len = packet(Opcode::RcRdmaWriteMiddle, &payload(4096, 3), &encap).len();
    let count = pool_bytes / len;
    let mut src = Vec::with_capacity(count * len);
    for i in 0..count {
        src.extend_from_slice(&packet(
            Opcode::RcRdmaWriteMiddle,
            &payload(4096, i),
            &encap,
        ));
    }
    let src = leak(src);
    let mut dst = vec![0u8; count * len];
    let bytes = Some(len as u64);

    let mut i = 0;
    r.run(copy, bytes, None, move || {
        let at = i * len;
        i = (i + 1) % count;
        black_box(&mut dst[at..at + len]).copy_from_slice(black_box(&src[at..at + len]));
    });
    let mut i = 0;
    r.run(crc, bytes, Some(copy), move || {
        let at = i * len;
        i = (i + 1) % count;
        let covered = &src[at..at + len - icrc::ICRC_LEN];
        icrc::compute(black_box(&encap), black_box(covered)).unwrap()
    });
}

fn wire(c: &mut Criterion) -> Vec<Row> {
    let encap = encap();
    let mut g = c.benchmark_group("wire");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    let mut r = Runner {
        g,
        rows: Vec::new(),
    };

    for (len, copy) in [
        (64usize, "memcpy/64"),
        (1024, "memcpy/1024"),
        (4096, "memcpy/4096"),
    ] {
        let pkt = leak(packet(Opcode::RcRdmaWriteMiddle, &payload(len, 3), &encap));
        let bytes = Some(pkt.len() as u64);

        let mut dst = vec![0u8; pkt.len()];
        r.run(copy, bytes, None, move || {
            black_box(&mut dst[..]).copy_from_slice(black_box(pkt));
            black_box(&dst);
        });

        let covered = &pkt[..pkt.len() - icrc::ICRC_LEN];
        r.run(
            &format!("icrc/compute/{len}"),
            bytes,
            Some(copy),
            move || icrc::compute(black_box(&encap), black_box(covered)).unwrap(),
        );

        // A stream of one QP's packets, as a sender or receiver sees it: the PSN changes.
        let mut stream = covered.to_vec();
        let mut memo = icrc::Memo::default();
        let mut psn = 0u32;
        r.run(
            &format!("icrc/compute_with_memo/{len}"),
            bytes,
            Some(copy),
            move || {
                psn = psn.wrapping_add(1);
                stream[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
                icrc::compute_with_memo(black_box(&encap), black_box(&stream), &mut memo).unwrap()
            },
        );

        r.run(
            &format!("icrc/verify_unknown_ident/{len}"),
            bytes,
            Some(copy),
            move || icrc::verify_ipv4_unknown_ident(black_box(&encap), black_box(pkt)).unwrap(),
        );

        if len == 4096 {
            r.run(
                &format!("parse_verify/{len}"),
                bytes,
                Some(copy),
                move || {
                    let bytes = black_box(pkt);
                    let p = Packet::new_checked(bytes).unwrap();
                    let repr = PacketRepr::parse_bytes(p.into_inner()).unwrap();
                    icrc::verify(black_box(&encap), bytes).unwrap();
                    repr.bth.psn
                },
            );

            let repr = PacketRepr::parse_bytes(pkt).unwrap();
            let mut out = vec![0u8; pkt.len()];
            repr.emit_with_icrc(&mut out, &encap).unwrap();
            assert_eq!(out, pkt, "emit_with_icrc reproduces the packet");
            r.run(&format!("emit_icrc/{len}"), bytes, Some(copy), move || {
                black_box(&repr)
                    .emit_with_icrc(black_box(&mut out[..]), black_box(&encap))
                    .unwrap()
            });
        }
    }

    pooled(
        &mut r,
        encap,
        1 << 20,
        "memcpy/4096/pool1MiB",
        "icrc/compute/4096/pool1MiB",
    );
    pooled(
        &mut r,
        encap,
        16 << 20,
        "memcpy/4096/pool16MiB",
        "icrc/compute/4096/pool16MiB",
    );

    let first = leak(packet(Opcode::RcRdmaWriteFirst, &payload(1024, 3), &encap));
    r.run("parse_header", None, None, move || {
        let bytes = black_box(first);
        let p = Packet::new_checked(bytes).unwrap();
        PacketRepr::parse_bytes(p.into_inner()).unwrap()
    });
    r.g.finish();
    r.rows
}

/// Runs every workload's batches round-robin, so a burst of load elsewhere on the machine
/// hits some batches of every workload rather than all batches of one, and prints the best.
fn print_summary(rows: &mut [Row]) {
    for _ in 0..ROUNDS {
        for row in rows.iter_mut() {
            row.best = row.best.min((row.batch)());
        }
    }
    println!(
        "\nRobust summary: fastest of {ROUNDS} round-robin batches of {BATCH} calls (ns per call)"
    );
    println!(
        "{:<30} {:>9} {:>8}  ratio to baseline",
        "benchmark", "ns/op", "GB/s"
    );
    for row in rows.iter() {
        let gbs = row
            .bytes
            .map_or_else(String::new, |b| format!("{:.1}", b as f64 / row.best));
        let ratio = row
            .baseline
            .and_then(|base| rows.iter().find(|r| r.name == base))
            .map_or_else(String::new, |base| {
                format!("{:.2} x {}", base.best / row.best, base.name)
            });
        println!("{:<30} {:>9.1} {:>8}  {ratio}", row.name, row.best, gbs);
    }
}

// `criterion_group!` would generate an undocumented `pub fn`; this is what it and
// `criterion_main!` expand to, plus the robust summary.
fn main() {
    // The summary only makes sense for a full `cargo bench` run: not under `cargo test`
    // (no `--bench`), nor with a filter or any other positional argument.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let summary = args.iter().any(|a| a == "--bench") && args.iter().all(|a| a.starts_with('-'));
    let mut c = Criterion::default().configure_from_args();
    let mut rows = wire(&mut c);
    c.final_summary();
    if summary {
        print_summary(&mut rows);
    }
}
