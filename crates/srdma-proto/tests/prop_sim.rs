//! Property test: random mixes of SEND, SEND/WRITE with immediate, WRITE, READ and
//! FETCH_ADD on 1-4 RC QP pairs, messages of 0 B to 1 MiB, path MTUs 256-4096, through a
//! simulated link with 0-20 % loss, duplication, reordering and corruption, half the pairs
//! recovering by go-back-N and half by selective repeat. For every seed: every byte lands
//! exactly once in the right place and nothing outside a granted range
//! changes; every receive and every send completes exactly once, in order, with the right
//! status (all SUCCESS, unless the retry budget runs out, which must then show as one
//! RETRY_EXC_ERR followed only by WR_FLUSH_ERR).
//!
//! `SRDMA_PROP_CASES` sets the number of seeds (default 1000), `SRDMA_PROP_SEED` runs one seed;
//! with `SRDMA_SIM_PCAP_DIR` set each case leaves `prop-<seed>.pcap` to read with `srdma decode`.

mod common;

use std::net::IpAddr;

use common::simhost::Host;
use common::{caps, rc_connect};
use srdma_proto::{
    AccessFlags, DeviceLimits, MrKeys, Mtu, PdId, Qp, QpConfig, QpType, RecvWr, Reliability,
    SendOp, SendWr, Sge, SgeList, WcOpcode, WcStatus,
};
use srdma_sim::{Instant, LinkConfig, Rng, Sim};
use srdma_wire::Qpn;

#[derive(Debug, Clone, Copy)]
enum Op {
    Send {
        len: u32,
        imm: Option<u32>,
        slack: u32,
    },
    Write {
        len: u32,
        src_off: u32,
    },
    WriteImm {
        len: u32,
        src_off: u32,
        imm: u32,
    },
    Read {
        len: u32,
        slack: u32,
    },
    Fadd {
        add: u64,
    },
}

fn size(r: &mut Rng, budget: &mut u64) -> u32 {
    let s = match r.below(100) {
        0..=39 => r.below(65),
        40..=74 => r.below(4097),
        75..=96 => r.below(65_537),
        _ => r.below((1 << 20) + 1),
    };
    let s = s.min(*budget);
    *budget -= s;
    s as u32
}

const PAD: u32 = 64;
const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";

struct PairMem {
    ops: Vec<Op>,
    a_src: MrKeys,
    a_rd: MrKeys,
    a_at: MrKeys,
    b_dst: MrKeys,
    b_recv: MrKeys,
    b_rsrc: MrKeys,
    b_ctr: MrKeys,
}

fn fill(r: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        let x = r.next_u64().to_le_bytes();
        c.copy_from_slice(&x[..c.len()]);
    }
    v
}

fn reg(h: &mut Host, addr: u64, bytes: Vec<u8>) -> MrKeys {
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let k = h
        .mrs
        .register(PdId(1), addr, bytes.len() as u64, access)
        .unwrap();
    h.mem.insert(k.handle, bytes);
    k
}

fn run_case(seed: u64) -> Result<String, String> {
    let mut r = Rng::new(seed);
    let pairs = 1 + r.below(4) as usize;
    let mtu = Mtu::ALL[r.below(5) as usize];
    let fault = |r: &mut Rng| if r.chance(0.3) { 0.0 } else { r.unit() * 0.2 };
    let link = LinkConfig {
        latency: std::time::Duration::from_micros(5 + r.below(50)),
        jitter: std::time::Duration::from_micros(r.below(5)),
        loss: fault(&mut r),
        duplicate: fault(&mut r),
        reorder: fault(&mut r),
        reorder_delay: std::time::Duration::from_micros(20),
        corrupt: fault(&mut r),
        ..LinkConfig::IDEAL
    };
    let mut budget: u64 = 3 << 19;
    let a_ip: IpAddr = A_IP.parse().unwrap();
    let b_ip: IpAddr = B_IP.parse().unwrap();
    let mut a = Host::new(a_ip, seed ^ 0xA);
    let mut b = Host::new(b_ip, seed ^ 0xB);
    let limits = DeviceLimits::default();
    let mut mems = Vec::new();
    for i in 0..pairs {
        let (qa, qb) = (0x100 + i as u32, 0x200 + i as u32);
        let mk = |qpn| {
            let cfg = QpConfig {
                qpn: Qpn::new(qpn),
                qp_type: QpType::Rc,
                pd: PdId(1),
                caps: caps(),
                sq_sig_all: false,
                uses_srq: false,
                port_mtu: mtu,
            };
            Qp::new(cfg, &limits).unwrap()
        };
        let (psn_a, psn_b) = (r.below(1 << 24) as u32, r.below(1 << 24) as u32);
        let mut qp_a = mk(qa);
        let mut qp_b = mk(qb);
        rc_connect(&mut qp_a, Qpn::new(qb), b_ip, psn_a, psn_b, mtu, 6);
        rc_connect(&mut qp_b, Qpn::new(qa), a_ip, psn_b, psn_a, mtu, 6);
        // Half the pairs recover by selective repeat (chosen from the seed, so the random
        // stream of the rest of the case is the same either way).
        if seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (60 - i) & 1 == 1 {
            qp_a.set_reliability(Reliability::SelectiveRepeat);
            qp_b.set_reliability(Reliability::SelectiveRepeat);
        }
        let n = 1 + r.below(20) as usize;
        let mut ops = Vec::new();
        for _ in 0..n {
            let imm = r.next_u64() as u32;
            ops.push(match r.below(6) {
                0 => Op::Send {
                    len: size(&mut r, &mut budget),
                    imm: None,
                    slack: r.below(16) as u32,
                },
                1 => Op::Send {
                    len: size(&mut r, &mut budget),
                    imm: Some(imm),
                    slack: 0,
                },
                2 => Op::Write {
                    len: size(&mut r, &mut budget),
                    src_off: r.below(64) as u32,
                },
                3 => Op::WriteImm {
                    len: size(&mut r, &mut budget),
                    src_off: r.below(64) as u32,
                    imm,
                },
                4 => Op::Read {
                    len: size(&mut r, &mut budget),
                    slack: r.below(16) as u32,
                },
                _ => Op::Fadd { add: r.below(1000) },
            });
        }
        let max = ops
            .iter()
            .map(|o| match *o {
                Op::Send { len, .. } | Op::Read { len, .. } => len,
                Op::Write { len, src_off } | Op::WriteImm { len, src_off, .. } => len + src_off,
                Op::Fadd { .. } => 8,
            })
            .max()
            .unwrap_or(0)
            + PAD;
        let sum = |f: &dyn Fn(&Op) -> u32| ops.iter().map(f).sum::<u32>() + PAD;
        let base = 0x1_0000_0000u64 * (i as u64 + 1);
        let a_src = reg(&mut a, base, fill(&mut r, max as usize));
        let a_rd = reg(
            &mut a,
            base + 0x1000_0000,
            vec![
                0;
                sum(&|o| if let Op::Read { len, slack } = o {
                    len + slack
                } else {
                    0
                }) as usize
            ],
        );
        let a_at = reg(&mut a, base + 0x2000_0000, vec![0; 8 * ops.len() + 8]);
        let b_dst = reg(
            &mut b,
            base,
            vec![
                0;
                sum(&|o| match o {
                    Op::Write { len, .. } | Op::WriteImm { len, .. } => *len,
                    _ => 0,
                }) as usize
            ],
        );
        let b_recv = reg(
            &mut b,
            base + 0x1000_0000,
            vec![
                0;
                sum(&|o| if let Op::Send { len, slack, .. } = o {
                    len + slack
                } else {
                    0
                }) as usize
            ],
        );
        let b_rsrc = reg(&mut b, base + 0x2000_0000, fill(&mut r, max as usize));
        let b_ctr = reg(&mut b, base + 0x3000_0000, vec![0; 8]);
        // Receive WQEs, one per message that consumes one, in order.
        let (mut recv_off, mut wr_id) = (0u64, 0u64);
        for op in &ops {
            let sges = match *op {
                Op::Send { len, slack, .. } => {
                    let s = Sge {
                        addr: base + 0x1000_0000 + recv_off,
                        length: len + slack,
                        lkey: b_recv.lkey,
                    };
                    recv_off += u64::from(len + slack);
                    SgeList::one(s)
                }
                Op::WriteImm { .. } => SgeList::new(),
                _ => continue,
            };
            qp_b.post_recv(RecvWr { wr_id, sges }).unwrap();
            wr_id += 1;
        }
        // The send WRs, all signaled.
        let (mut dst_off, mut rd_off) = (0u64, 0u64);
        for (k, op) in ops.iter().enumerate() {
            let rkey = |m: &MrKeys| m.rkey.unwrap();
            let (opk, sge) = match *op {
                Op::Send { len, imm, .. } => (
                    imm.map_or(SendOp::Send, |imm| SendOp::SendWithImm { imm }),
                    Sge {
                        addr: base,
                        length: len,
                        lkey: a_src.lkey,
                    },
                ),
                Op::Write { len, src_off } | Op::WriteImm { len, src_off, .. } => {
                    let remote_addr = base + dst_off;
                    dst_off += u64::from(len);
                    let o = if let Op::WriteImm { imm, .. } = *op {
                        SendOp::WriteWithImm {
                            remote_addr,
                            rkey: rkey(&b_dst),
                            imm,
                        }
                    } else {
                        SendOp::Write {
                            remote_addr,
                            rkey: rkey(&b_dst),
                        }
                    };
                    (
                        o,
                        Sge {
                            addr: base + u64::from(src_off),
                            length: len,
                            lkey: a_src.lkey,
                        },
                    )
                }
                Op::Read { len, slack } => {
                    let s = Sge {
                        addr: base + 0x1000_0000 + rd_off,
                        length: len,
                        lkey: a_rd.lkey,
                    };
                    rd_off += u64::from(len + slack);
                    (
                        SendOp::Read {
                            remote_addr: base + 0x2000_0000,
                            rkey: rkey(&b_rsrc),
                        },
                        s,
                    )
                }
                Op::Fadd { add } => (
                    SendOp::FetchAdd {
                        remote_addr: base + 0x3000_0000,
                        rkey: rkey(&b_ctr),
                        add,
                    },
                    Sge {
                        addr: base + 0x2000_0000 + 8 * k as u64,
                        length: 8,
                        lkey: a_at.lkey,
                    },
                ),
            };
            qp_a.post_send(SendWr::new(k as u64, opk, SgeList::one(sge)))
                .unwrap();
        }
        a.add_qp(qp_a);
        b.add_qp(qp_b);
        mems.push(PairMem {
            ops,
            a_src,
            a_rd,
            a_at,
            b_dst,
            b_recv,
            b_rsrc,
            b_ctr,
        });
    }

    let mut sim = Sim::new(seed)
        .with_pcap_env(&format!("prop-{seed}"))
        .map_err(|e| e.to_string())?;
    sim.set_default_link(link).map_err(|e| e.to_string())?;
    let ha = sim.add_host(a_ip, a).unwrap();
    let hb = sim.add_host(b_ip, b).unwrap();
    let deadline_ms: u64 = std::env::var("SRDMA_PROP_DEADLINE_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3_600_000);
    let outcome = sim.run_until_idle(Instant::from_nanos(deadline_ms * 1_000_000));
    let stats = sim.total_stats();
    let desc = format!(
        "seed {seed}: {pairs} pairs, mtu {}, loss {:.3} dup {:.3} reorder {:.3} corrupt {:.3}, {outcome:?}, {} datagrams, {} lost",
        mtu.bytes(),
        link.loss,
        link.duplicate,
        link.reorder,
        link.corrupt,
        stats.sent,
        stats.lost
    );
    let fail = |m: String| Err(format!("{desc}: {m}"));

    for (i, pm) in mems.iter().enumerate() {
        let (qa, qb) = (0x100 + i as u32, 0x200 + i as u32);
        let mut a_wcs = Vec::new();
        while let Some((_, wc)) = sim.endpoint_mut(ha).qp(qa).poll_completion() {
            a_wcs.push(wc);
        }
        let mut b_wcs = Vec::new();
        while let Some((_, wc)) = sim.endpoint_mut(hb).qp(qb).poll_completion() {
            b_wcs.push(wc);
        }
        // Send side: one completion per WR, in order; SUCCESS, or SUCCESS... RETRY_EXC_ERR FLUSH...
        if a_wcs.len() != pm.ops.len() {
            return fail(format!(
                "pair {i}: {} send completions for {} WRs",
                a_wcs.len(),
                pm.ops.len()
            ));
        }
        let mut failed_at = None;
        for (k, wc) in a_wcs.iter().enumerate() {
            if wc.wr_id != k as u64 {
                return fail(format!("pair {i}: completion {k} has wr_id {}", wc.wr_id));
            }
            match (failed_at, wc.status) {
                (None, WcStatus::Success) => {}
                (None, WcStatus::RetryExcErr) => failed_at = Some(k),
                (Some(_), WcStatus::WrFlushErr) => {}
                (_, s) => {
                    return fail(format!(
                        "pair {i}: WR {k} ({:?}) completed with {s:?}",
                        pm.ops[k]
                    ));
                }
            }
        }
        let ok = |k: usize| failed_at.is_none_or(|f| k < f);
        let a = sim.endpoint(ha);
        let b = sim.endpoint(hb);
        let src = a.mem.region(pm.a_src.handle).unwrap();
        let rd = a.mem.region(pm.a_rd.handle).unwrap();
        let at = a.mem.region(pm.a_at.handle).unwrap();
        let dst = b.mem.region(pm.b_dst.handle).unwrap();
        let recv = b.mem.region(pm.b_recv.handle).unwrap();
        let rsrc = b.mem.region(pm.b_rsrc.handle).unwrap();
        let ctr = u64::from_ne_bytes(b.mem.region(pm.b_ctr.handle).unwrap().try_into().unwrap());
        let (mut dst_off, mut recv_off, mut rd_off, mut sum, mut rwc) =
            (0usize, 0usize, 0usize, 0u64, 0usize);
        let mut all_ok = true;
        for (k, op) in pm.ops.iter().enumerate() {
            all_ok &= ok(k);
            match *op {
                Op::Send { len, imm, slack } => {
                    let (len, slack) = (len as usize, slack as usize);
                    if ok(k) {
                        let Some(wc) = b_wcs.get(rwc) else {
                            return fail(format!("pair {i}: no receive completion for WR {k}"));
                        };
                        let want = (
                            rwc as u64,
                            WcStatus::Success,
                            WcOpcode::Recv,
                            len as u32,
                            imm,
                        );
                        if (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) != want {
                            return fail(format!(
                                "pair {i}: receive {rwc} is {wc:?}, want {want:?}"
                            ));
                        }
                        if recv[recv_off..recv_off + len] != src[..len] {
                            return fail(format!("pair {i}: SEND {k} data differs"));
                        }
                    }
                    if recv[recv_off + len..recv_off + len + slack]
                        .iter()
                        .any(|&x| x != 0)
                    {
                        return fail(format!("pair {i}: SEND {k} wrote past its length"));
                    }
                    rwc += 1;
                    recv_off += len + slack;
                }
                Op::Write { len, src_off } | Op::WriteImm { len, src_off, .. } => {
                    let (len, so) = (len as usize, src_off as usize);
                    if ok(k) && dst[dst_off..dst_off + len] != src[so..so + len] {
                        return fail(format!("pair {i}: WRITE {k} data differs"));
                    }
                    if let Op::WriteImm { imm, len, .. } = *op {
                        if ok(k) {
                            let Some(wc) = b_wcs.get(rwc) else {
                                return fail(format!("pair {i}: no completion for WRITE_IMM {k}"));
                            };
                            let want = (
                                rwc as u64,
                                WcStatus::Success,
                                WcOpcode::RecvRdmaWithImm,
                                len,
                                Some(imm),
                            );
                            if (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data) != want {
                                return fail(format!(
                                    "pair {i}: receive {rwc} is {wc:?}, want {want:?}"
                                ));
                            }
                        }
                        rwc += 1;
                    }
                    dst_off += len;
                }
                Op::Read { len, slack } => {
                    let (len, slack) = (len as usize, slack as usize);
                    if ok(k) && rd[rd_off..rd_off + len] != rsrc[..len] {
                        return fail(format!("pair {i}: READ {k} data differs"));
                    }
                    if rd[rd_off + len..rd_off + len + slack]
                        .iter()
                        .any(|&x| x != 0)
                    {
                        return fail(format!("pair {i}: READ {k} wrote past its length"));
                    }
                    rd_off += len + slack;
                }
                Op::Fadd { add } => {
                    let orig = u64::from_ne_bytes(at[8 * k..8 * k + 8].try_into().unwrap());
                    if ok(k) && orig != sum {
                        return fail(format!(
                            "pair {i}: FETCH_ADD {k} returned {orig}, want {sum}"
                        ));
                    }
                    sum += add;
                }
            }
        }
        // Nothing beyond the granted ranges changed.
        if dst[dst_off..].iter().any(|&x| x != 0)
            || rd[rd_off..].iter().any(|&x| x != 0)
            || recv[recv_off..].iter().any(|&x| x != 0)
        {
            return fail(format!("pair {i}: bytes written past every granted range"));
        }
        if all_ok {
            if ctr != sum {
                return fail(format!(
                    "pair {i}: counter {ctr}, want {sum}: an atomic ran twice or never"
                ));
            }
            if b_wcs.len() != rwc {
                return fail(format!(
                    "pair {i}: {} receive completions, want {rwc}",
                    b_wcs.len()
                ));
            }
        } else if b_wcs.len() > rwc || b_wcs.iter().any(|w| w.status != WcStatus::Success) {
            return fail(format!(
                "pair {i}: unexpected receive completions {b_wcs:?}"
            ));
        }
    }
    Ok(desc)
}

#[test]
fn random_operations_over_a_faulty_link_deliver_exactly_once() {
    let seeds: Vec<u64> = match std::env::var("SRDMA_PROP_SEED") {
        Ok(s) => vec![s.parse().expect("SRDMA_PROP_SEED is a number")],
        Err(_) => {
            let n: u64 = std::env::var("SRDMA_PROP_CASES")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1000);
            (0..n).collect()
        }
    };
    let mut failures = Vec::new();
    let mut retry_exhausted = 0;
    for &seed in &seeds {
        match run_case(seed) {
            Ok(_) => {}
            Err(e) if e.contains("RetryExcErr") => {
                retry_exhausted += 1;
                failures.push(e);
            }
            Err(e) => failures.push(e),
        }
    }
    let _ = retry_exhausted;
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
}
