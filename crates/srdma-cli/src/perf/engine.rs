//! The RDMA side of `srdma perf`: the device, QPs and memory of one side, and the measured
//! loops (perftest's `run_iter_bw`, `run_iter_lat_write`, `run_iter_lat_send`, ...).
//!
//! Memory: one region, per QP `[target slot][local slot][receive ring]`. The target slot is
//! what the peer WRITEs, READs or hits with atomics (its address and R_Key are announced);
//! the local slot is the source of WRITE/SEND and the destination of READ and atomic results;
//! the receive ring takes SENDs (one buffer reused by every receive, or with `--check` one
//! buffer per outstanding receive so that each message can be verified).

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use srdma::{
    AccessFlags, CompChannel, ConnectParams, Cq, Device, Ece, Gid, Mr, Mtu, Pd, Qp, QpCaps, QpInit,
    QpType, RKey, RecvWr, RemoteQp, SendFlags, SendOp, SendWr, SgeList, Wc, WcOpcode, WcStatus,
};
use srdma_wire::{Psn, Qpn};

use super::ctrl::Ctrl;
use super::{TestKind, Verb};

/// wr_id = QP index << QP_SHIFT | sequence number.
const QP_SHIFT: u32 = 40;
const SEQ_MASK: u64 = (1 << QP_SHIFT) - 1;
/// No completion for this long: the peer is gone or the connection is broken.
const STALL: Duration = Duration::from_secs(10);
/// The most bytes of messages a bandwidth client posts between two signaled ones.
const SIGNAL_BYTES: usize = 16 << 20;
/// Largest receive ring kept for `--check` (bytes per QP).
const CHECK_RING_BYTES: usize = 64 << 20;
/// perftest computes the peak bandwidth only up to this many iterations.
const PEAK_MAX_ITERS: u64 = 20_000;
/// Send queue depth of the latency tests (only one message is in flight; completions are
/// reaped lazily).
const LAT_SQ: u32 = 128;

/// How one side runs.
#[derive(Debug, Clone)]
pub struct Opts {
    /// The test.
    pub test: TestKind,
    /// QPs.
    pub qps: usize,
    /// Send queue depth (bandwidth tests).
    pub tx_depth: u32,
    /// Signal every this many WRs.
    pub cq_mod: u32,
    /// Receives kept posted (SEND tests, and WRITE latency with events).
    pub rx_depth: u32,
    /// Largest message sent inline.
    pub inline: u32,
    /// Sleep on a completion channel instead of busy polling.
    pub events: bool,
    /// Verify the data.
    pub check: bool,
    /// Path MTU.
    pub mtu: Mtu,
    /// Largest message size of the run.
    pub max_size: usize,
    /// Outstanding READs / atomics.
    pub out_reads: u8,
}

impl Opts {
    fn uses_recv(&self) -> bool {
        self.test.verb() == Verb::Send || (self.test == TestKind::WriteLat && self.events)
    }
}

/// What one side announces about one of its QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// First send PSN.
    pub psn: u32,
    /// R_Key of the region.
    pub rkey: u32,
    /// Address of the QP's target slot.
    pub vaddr: u64,
    /// GID of the device.
    pub gid: Gid,
    /// UDP port of the device.
    pub port: u16,
    /// The QP's ECE options (`Qp::query_ece`): both ends set what they agree on, as
    /// rdma_cm does with the REQ and REP (an older peer sends none: go-back-N).
    pub ece: Ece,
}

impl QpInfo {
    /// JSON form.
    pub fn to_json(self) -> Value {
        let gid: String = self.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        json!({"qpn": self.qpn, "psn": self.psn, "rkey": self.rkey, "vaddr": self.vaddr,
               "gid": gid, "port": self.port,
               "ece": [self.ece.vendor_id, self.ece.options]})
    }

    /// Reads [`QpInfo::to_json`]'s form.
    pub fn from_json(v: &Value) -> anyhow::Result<QpInfo> {
        let bad = || anyhow!("malformed QP description from the peer: {v}");
        let n = |k: &str| v.get(k).and_then(Value::as_u64).ok_or_else(bad);
        let hex = v.get("gid").and_then(Value::as_str).ok_or_else(bad)?;
        if hex.len() != 32 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        let qpn = n("qpn")?;
        let psn = n("psn")?;
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(bad());
        }
        Ok(QpInfo {
            qpn: qpn as u32,
            psn: psn as u32,
            rkey: u32::try_from(n("rkey")?).map_err(|_| bad())?,
            vaddr: n("vaddr")?,
            gid: Gid(gid),
            port: u16::try_from(n("port")?).map_err(|_| bad())?,
            ece: match v.get("ece").and_then(Value::as_array).map(Vec::as_slice) {
                None => Ece::default(),
                Some([a, b]) => Ece {
                    vendor_id: a
                        .as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(bad)?,
                    options: b
                        .as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or_else(bad)?,
                },
                Some(_) => return Err(bad()),
            },
        })
    }
}

/// The byte at offset `k` of QP `q`'s messages: position-dependent, so misplaced data shows.
pub fn pattern(q: usize, k: usize) -> u8 {
    let x = (k as u32).wrapping_mul(0x9E37_79B1) ^ (q as u32).wrapping_mul(0x85EB_CA6B);
    ((x >> 24) as u8) ^ (k as u8)
}

fn fill_pattern(b: &mut [u8], q: usize) {
    for (k, x) in b.iter_mut().enumerate() {
        *x = pattern(q, k);
    }
}

/// The first offset where `b` differs from QP `q`'s pattern.
fn first_mismatch(b: &[u8], q: usize) -> Option<usize> {
    b.iter().enumerate().position(|(k, &x)| x != pattern(q, k))
}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

/// Where things are in the region.
#[derive(Debug, Clone, Copy)]
struct Layout {
    slot: usize,
    rx_slot: usize,
    rx_slots: usize,
    per_qp: usize,
}

impl Layout {
    fn new(o: &Opts) -> Layout {
        let slot = round_up(o.max_size.max(64), 4096);
        let (rx_slot, rx_slots) = if o.uses_recv() {
            let rs = round_up(o.max_size.max(1), 64);
            let n = if o.check {
                (CHECK_RING_BYTES / rs).clamp(2, o.rx_depth.max(2) as usize)
            } else {
                1
            };
            (rs, n)
        } else {
            (0, 0)
        };
        Layout {
            slot,
            rx_slot,
            rx_slots,
            per_qp: round_up(2 * slot + rx_slot * rx_slots, 4096),
        }
    }

    fn target(&self, q: usize) -> usize {
        q * self.per_qp
    }

    fn local(&self, q: usize) -> usize {
        q * self.per_qp + self.slot
    }

    fn rx(&self, q: usize, n: u64) -> usize {
        q * self.per_qp + 2 * self.slot + (n % self.rx_slots as u64) as usize * self.rx_slot
    }
}

/// Counts progress and notices a stalled run. It reads the clock only once a wait spins
/// idle, and then every 16th spin (a ping-pong's waits mostly find their completion at the
/// first poll, and the baseline's loops read no clock there either).
struct Watch {
    /// Since when nothing happened; `None` until the first idle spin after progress.
    last: Option<Instant>,
    /// When the caller was last told to look around; `None` since the last progress.
    looked: Option<Instant>,
    spins: u32,
}

/// The longest a wait goes without looking around (control messages), however long each of
/// its spins takes: a poll that sleeps on a completion channel takes up to 10 ms, 256 of them
/// on a loaded machine could take longer than [`STALL`].
const LOOK_EVERY: Duration = Duration::from_millis(50);

impl Watch {
    fn new() -> Watch {
        Watch {
            last: None,
            looked: None,
            spins: 0,
        }
    }

    fn progress(&mut self) {
        self.spins = 0;
        self.last = None;
        self.looked = None;
    }

    /// Every 256 idle spins, or [`LOOK_EVERY`] after the last look: true, time to look around
    /// (control messages). An error once a look made [`STALL`] after the last progress found
    /// nothing either (the caller calls [`Watch::progress`] when its look finds something).
    fn idle(&mut self, what: &str) -> anyhow::Result<bool> {
        let last = *self.last.get_or_insert_with(Instant::now);
        self.spins += 1;
        if self.spins % 16 == 0 {
            let now = Instant::now();
            let looked = *self.looked.get_or_insert(last);
            if self.spins % 256 == 0 || now.duration_since(looked) >= LOOK_EVERY {
                if looked.duration_since(last) > STALL {
                    bail!(
                        "no progress for {}s while {what} (is the peer still running?)",
                        STALL.as_secs()
                    );
                }
                self.looked = Some(now);
                return Ok(true);
            }
        }
        // Spin a little, then let the progress threads (ours and, on a small machine, the
        // peer's) have the CPU: busy polling must not starve the engine that completes.
        if self.spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        Ok(false)
    }
}

/// One side's RDMA resources.
pub struct Rdma {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    channel: Option<CompChannel>,
    qps: Vec<Qp>,
    mr: Mr,
    layout: Layout,
    psns: Vec<u32>,
    remote: Vec<QpInfo>,
    opts: Opts,
    wcs: Vec<Wc>,
    /// Receives posted / completed, per QP.
    rx_posted: Vec<u64>,
    rx_done: Vec<u64>,
    /// Sends posted / known complete (latency tests), per QP.
    sq_posted: u64,
    sq_done: u64,
    /// Receive completions reaped while looking for send completions.
    pending: std::collections::VecDeque<Wc>,
}

impl Rdma {
    /// Creates the PD, CQ, QPs and the region on `dev`.
    pub fn new(dev: Device, opts: Opts) -> anyhow::Result<Rdma> {
        let pd = dev.alloc_pd();
        let channel = if opts.events {
            Some(CompChannel::new().context("creating the completion channel")?)
        } else {
            None
        };
        let lat = !opts.test.is_bw();
        let sq = if lat { LAT_SQ } else { opts.tx_depth };
        let rq = if opts.uses_recv() { opts.rx_depth } else { 1 };
        let cqe = ((sq as usize + rq as usize) * opts.qps + 64).min(32767);
        let cq = dev
            .create_cq(cqe, channel.as_ref())
            .context("creating the CQ")?;
        let layout = Layout::new(&opts);
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.caps = QpCaps {
            max_send_wr: sq,
            max_recv_wr: rq,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: opts.inline,
        };
        let mut qps = Vec::new();
        let mut psns = Vec::new();
        for _ in 0..opts.qps {
            qps.push(pd.create_qp(&init).context("creating a QP")?);
            psns.push(srdma::random_psn().value());
        }
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd
            .reg_mr(layout.per_qp * opts.qps, access)
            .context("registering the buffer")?;
        // Sources carry the pattern; READ targets too.
        mr.with_bytes_mut(|b| {
            for q in 0..opts.qps {
                let l = layout.local(q);
                fill_pattern(&mut b[l..l + layout.slot], q);
                let t = layout.target(q);
                fill_pattern(&mut b[t..t + layout.slot], q);
            }
        });
        Ok(Rdma {
            dev,
            _pd: pd,
            cq,
            channel,
            rx_posted: vec![0; opts.qps],
            rx_done: vec![0; opts.qps],
            qps,
            mr,
            layout,
            psns,
            remote: Vec::new(),
            opts,
            wcs: Vec::with_capacity(256),
            sq_posted: 0,
            sq_done: 0,
            pending: std::collections::VecDeque::new(),
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Which driver carried each QP's last packet (`udp`, `shm`, `none`).
    pub fn paths(&self) -> Vec<&'static str> {
        self.qps.iter().map(|q| q.path().name()).collect()
    }

    /// Where the QPs stand, for an error that says the transfer stalled: congestion control
    /// and the counters that are not zero.
    pub fn stall_report(&self) -> String {
        let counters: Vec<String> = self
            .qp_counters()
            .entries()
            .iter()
            .filter(|(_, v)| *v != 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(
            "congestion {}; counters {}",
            Value::from(self.congestion()),
            counters.join(" ")
        )
    }

    /// The QPs' transport counters, summed.
    pub fn qp_counters(&self) -> srdma::Counters {
        let mut c = srdma::Counters::default();
        for q in &self.qps {
            c += q.counters();
        }
        c
    }

    /// Each QP's congestion control: window, rate, RTT, reactions, and how it recovers
    /// losses (the ECE agreed).
    pub fn congestion(&self) -> Vec<Value> {
        self.qps
            .iter()
            .map(|q| {
                let c = q.congestion();
                let us = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64() * 1e6);
                json!({
                    "window_psns": c.window_psns,
                    "rate_mib_s": c.rate.map(|r| r as f64 / f64::from(1 << 20)),
                    "srtt_us": us(c.srtt),
                    "base_rtt_us": us(c.base_rtt),
                    "loss_cuts": c.loss_cuts,
                    "delay_cuts": c.delay_cuts,
                    "timeouts": c.timeouts,
                    "spurious_timeouts": c.spurious_timeouts,
                    "cnps": c.cnps,
                    "read_rate_mib_s": c.read_rate.map(|r| r as f64 / f64::from(1 << 20)),
                    "read_cuts": c.read_cuts,
                    "selective_repeat": q.query_ece().selective_repeat(),
                })
            })
            .collect()
    }

    /// What to announce to the peer.
    pub fn local_info(&self) -> Vec<QpInfo> {
        let rkey = self.mr.rkey().map_or(0, |r| r.0);
        (0..self.qps.len())
            .map(|q| QpInfo {
                qpn: self.qps[q].qpn().value(),
                psn: self.psns[q],
                rkey,
                vaddr: self.mr.addr() + self.layout.target(q) as u64,
                gid: self.dev.local_gid(),
                port: self.dev.local_addr().port(),
                ece: self.qps[q].query_ece(),
            })
            .collect()
    }

    /// Moves every QP to RTS towards the peer's QPs and posts the first receives.
    pub fn connect(&mut self, remote: Vec<QpInfo>) -> anyhow::Result<()> {
        if remote.len() != self.qps.len() {
            bail!(
                "the peer announced {} QPs, this side has {}",
                remote.len(),
                self.qps.len()
            );
        }
        for (q, r) in remote.iter().enumerate() {
            let mut p = ConnectParams::new(self.opts.mtu, Psn::new(self.psns[q]));
            p.max_rd_atomic = self.opts.out_reads;
            p.max_dest_rd_atomic = self.opts.out_reads;
            let rq = RemoteQp {
                qpn: Qpn::new(r.qpn),
                psn: Psn::new(r.psn),
                gid: r.gid,
                port: r.port,
            };
            let agreed = self.qps[q].query_ece().agree(r.ece);
            self.qps[q]
                .set_ece(agreed)
                .and_then(|_| self.qps[q].connect(&rq, &p))
                .with_context(|| format!("connecting QP {:#x} to the peer", r.qpn))?;
        }
        self.remote = remote;
        if self.opts.uses_recv() {
            let want = if self.opts.check {
                self.layout.rx_slots as u64
            } else {
                u64::from(self.opts.rx_depth)
            };
            for q in 0..self.qps.len() {
                while self.rx_posted[q] - self.rx_done[q] < want {
                    self.post_recv(q)?;
                }
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, q: usize) -> anyhow::Result<()> {
        let n = self.rx_posted[q];
        let off = self.layout.rx(q, n);
        let wr = RecvWr {
            wr_id: ((q as u64) << QP_SHIFT) | n,
            sges: SgeList::one(self.mr.sge(off, self.layout.rx_slot)),
        };
        self.qps[q].post_recv(wr).context("posting a receive")?;
        self.rx_posted[q] += 1;
        Ok(())
    }

    /// Handles a receive completion: checks it, verifies the message with `--check`, posts a
    /// new receive. Returns the QP index.
    fn on_recv(&mut self, wc: &Wc, size: usize) -> anyhow::Result<usize> {
        let q = (wc.wr_id >> QP_SHIFT) as usize;
        let n = wc.wr_id & SEQ_MASK;
        if q >= self.qps.len() {
            bail!("receive completion with an unknown wr_id {:#x}", wc.wr_id);
        }
        self.rx_done[q] = n + 1;
        if self.opts.check && wc.opcode == WcOpcode::Recv {
            if wc.byte_len as usize != size {
                bail!(
                    "--check: QP {q} message {n} is {} bytes, expected {size}",
                    wc.byte_len
                );
            }
            let off = self.layout.rx(q, n);
            if let Some(k) = self
                .mr
                .with_bytes(|b| first_mismatch(&b[off..off + size], q))
            {
                bail!("--check: QP {q} message {n} differs from the pattern at byte {k}");
            }
        }
        self.post_recv(q)?;
        Ok(q)
    }

    /// Polls the CQ into `self.wcs` (busy, or with events a short sleep on the channel).
    fn poll(&mut self) -> anyhow::Result<usize> {
        let n = self.poll_checked()?;
        if let Some(wc) = self.wcs.iter().find(|wc| !wc.status.is_success()) {
            let e = Self::check_status(wc).err();
            if let Some(e) = e {
                bail!("{e}; {}", self.stall_report());
            }
        }
        Ok(n)
    }

    fn poll_checked(&mut self) -> anyhow::Result<usize> {
        let n = self.cq.poll_into(&mut self.wcs, 256);
        if n > 0 || self.channel.is_none() {
            return Ok(n);
        }
        self.cq.req_notify(false);
        let n = self.cq.poll_into(&mut self.wcs, 256);
        if n > 0 {
            return Ok(n);
        }
        if let Some(ch) = &self.channel {
            ch.get_event(Some(Duration::from_millis(10)))
                .context("waiting for a CQ event")?;
        }
        Ok(self.cq.poll_into(&mut self.wcs, 256))
    }

    fn check_status(wc: &Wc) -> anyhow::Result<()> {
        if wc.status != WcStatus::Success {
            bail!(
                "completion with error: {:?} (opcode {:?}, wr_id {:#x}, vendor_err {:#x})",
                wc.status,
                wc.opcode,
                wc.wr_id,
                wc.vendor_err
            );
        }
        Ok(())
    }

    fn send_wr(&self, q: usize, seq: u64, size: usize, signaled: bool) -> SendWr {
        let r = &self.remote[q];
        let rkey = RKey(r.rkey);
        let local = self.layout.local(q);
        let (op, len) = match self.opts.test.verb() {
            Verb::Write => (
                SendOp::Write {
                    remote_addr: r.vaddr,
                    rkey,
                },
                size,
            ),
            Verb::Read => (
                SendOp::Read {
                    remote_addr: r.vaddr,
                    rkey,
                },
                size,
            ),
            Verb::Send => (SendOp::Send, size),
            Verb::Atomic => (
                SendOp::FetchAdd {
                    remote_addr: r.vaddr,
                    rkey,
                    add: 1,
                },
                8,
            ),
        };
        let flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        let wr = SendWr::new(
            ((q as u64) << QP_SHIFT) | seq,
            op,
            SgeList::one(self.mr.sge(local, len)),
        )
        .with_flags(flags);
        let inline = matches!(self.opts.test.verb(), Verb::Write | Verb::Send)
            && len <= self.opts.inline as usize
            && len > 0;
        if inline {
            let mut data = vec![0u8; len];
            fill_pattern(&mut data, q);
            wr.with_inline(data)
        } else {
            wr
        }
    }

    /// Prepares this side's memory for a run of `size`-byte messages: the target slots are
    /// reset where the peer writes (so stale data cannot pass `--check`), local READ
    /// destinations are cleared.
    pub fn prepare(&self, size: usize, client: bool) {
        let verb = self.opts.test.verb();
        let l = self.layout;
        let qps = self.qps.len();
        let lat_write = self.opts.test == TestKind::WriteLat;
        self.mr.with_bytes_mut(|b| {
            for q in 0..qps {
                let t = l.target(q);
                let loc = l.local(q);
                if (!client && matches!(verb, Verb::Write | Verb::Atomic)) || lat_write {
                    b[t..t + l.slot].fill(0);
                }
                if client && matches!(verb, Verb::Read | Verb::Atomic) {
                    b[loc..loc + l.slot].fill(0);
                }
                if lat_write {
                    fill_pattern(&mut b[loc..loc + l.slot], q);
                }
            }
        });
        let _ = size;
    }

    /// After a run, checks what the peer did to this side's memory (`--check`): WRITE targets
    /// hold the pattern, atomic words count every operation, READ destinations hold the
    /// pattern, atomic results are the last value fetched.
    pub fn verify(&self, size: usize, client: bool, ops: &[u64]) -> anyhow::Result<()> {
        if !self.opts.check {
            return Ok(());
        }
        let l = self.layout;
        let verb = self.opts.test.verb();
        let test = self.opts.test;
        self.mr.with_bytes(|b| {
            for (q, &n) in ops.iter().enumerate() {
                let t = l.target(q);
                let loc = l.local(q);
                let word = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
                match (verb, client) {
                    (Verb::Write, c) if n > 0 && (!c || test == TestKind::WriteLat) => {
                        let len = if test == TestKind::WriteLat {
                            size - 1
                        } else {
                            size
                        };
                        if let Some(k) = first_mismatch(&b[t..t + len], q) {
                            bail!(
                                "--check: QP {q}: written data differs from the pattern at byte {k}"
                            );
                        }
                    }
                    (Verb::Read, true) if n > 0 => {
                        if let Some(k) = first_mismatch(&b[loc..loc + size], q) {
                            bail!(
                                "--check: QP {q}: data read differs from the pattern at byte {k}"
                            );
                        }
                    }
                    (Verb::Atomic, false) if word(t) != n => {
                        bail!(
                            "--check: QP {q}: the counter is {} after {n} fetch-and-adds",
                            word(t)
                        );
                    }
                    (Verb::Atomic, true) if n > 0 && word(loc) != n - 1 => {
                        bail!(
                            "--check: QP {q}: the last fetch-and-add returned {}, expected {}",
                            word(loc),
                            n - 1
                        );
                    }
                    _ => {}
                }
            }
            Ok(())
        })
    }

    /// The bandwidth loop of the requester (perftest's `run_iter_bw`): keeps `tx_depth` WRs
    /// in flight on every QP, signals every `cq_mod`-th, for `iters` per QP or `duration`.
    /// Returns the figures and the WRs completed per QP.
    pub fn bw_client(
        &mut self,
        size: usize,
        iters: u64,
        duration: Option<Duration>,
    ) -> anyhow::Result<(super::report::BwStats, Vec<u64>)> {
        let nq = self.qps.len();
        let tx = u64::from(self.opts.tx_depth);
        // At most SIGNAL_BYTES between two signaled WRs: a large message's flow shared
        // with many others may take seconds for a hundred of them, too long to tell a
        // slow flow from a stalled one.
        let cq_mod = u64::from(self.opts.cq_mod.min(self.opts.tx_depth))
            .min((SIGNAL_BYTES / size.max(1)) as u64)
            .max(1);
        let mut limit = vec![if duration.is_some() { u64::MAX } else { iters }; nq];
        let mut posted = vec![0u64; nq];
        let mut done = vec![0u64; nq];
        let peak = duration.is_none() && iters <= PEAK_MAX_ITERS;
        let mut tposted: Vec<Instant> =
            Vec::with_capacity(if peak { (iters as usize) * nq } else { 0 });
        let mut tdone: Vec<(u64, Instant)> = Vec::new();
        let mut total_done = 0u64;
        let mut batch: Vec<SendWr> = Vec::with_capacity(64);
        let mut watch = Watch::new();
        let start = Instant::now();
        let deadline = duration.map(|d| start + d);
        let mut last_done = start;
        loop {
            if let Some(d) = deadline {
                if limit[0] == u64::MAX && Instant::now() >= d {
                    for q in 0..nq {
                        // Finish on a signaled WR: up to the next multiple of cq_mod.
                        limit[q] = posted[q].div_ceil(cq_mod) * cq_mod;
                    }
                }
            }
            let mut any = false;
            for q in 0..nq {
                let room = (tx - (posted[q] - done[q])).min(limit[q] - posted[q]);
                if room == 0 {
                    continue;
                }
                let n = room.min(64);
                batch.clear();
                for seq in posted[q]..posted[q] + n {
                    let signaled = (seq + 1) % cq_mod == 0 || seq + 1 == limit[q];
                    batch.push(self.send_wr(q, seq, size, signaled));
                }
                self.qps[q]
                    .post_send_batch(batch.drain(..))
                    .context("posting send WRs")?;
                if peak {
                    let now = Instant::now();
                    tposted.extend(std::iter::repeat_n(now, n as usize));
                }
                posted[q] += n;
                any = true;
            }
            let got = self.poll()?;
            if got > 0 {
                let now = Instant::now();
                for wc in self.wcs.drain(..) {
                    Self::check_status(&wc)?;
                    let q = (wc.wr_id >> QP_SHIFT) as usize;
                    let seq = wc.wr_id & SEQ_MASK;
                    if q >= nq || seq >= posted[q] {
                        bail!("completion with an unknown wr_id {:#x}", wc.wr_id);
                    }
                    total_done += seq + 1 - done[q];
                    done[q] = seq + 1;
                    if peak {
                        tdone.push((total_done, now));
                    }
                }
                last_done = now;
                watch.progress();
            }
            if (0..nq).all(|q| done[q] == limit[q]) {
                break;
            }
            if !any && got == 0 {
                watch
                    .idle("waiting for completions")
                    .map_err(|e| anyhow::anyhow!("{e}; {}", self.stall_report()))?;
            }
        }
        let secs = last_done.duration_since(start).as_secs_f64();
        let peak_secs = if peak {
            peak_time_per_msg(&tposted, &tdone)
        } else {
            None
        };
        let msgs: u64 = done.iter().sum();
        Ok((
            super::report::BwStats {
                size: size as u64,
                msgs,
                secs,
                peak_secs_per_msg: peak_secs,
            },
            done,
        ))
    }

    /// The receiving side of SEND bandwidth: reposts receives (verifying each message with
    /// `--check`) until `expected` messages arrived; with `expected` None (duration mode),
    /// until the client's "done" message says how many to wait for. Returns that message if
    /// it came during the loop.
    pub fn bw_server_recv(
        &mut self,
        size: usize,
        expected: Option<u64>,
        ctrl: &mut Ctrl,
    ) -> anyhow::Result<Option<Value>> {
        let mut expected = expected;
        let mut done_msg = None;
        let mut got = 0u64;
        let mut watch = Watch::new();
        loop {
            if expected.is_some_and(|e| got >= e) {
                break;
            }
            let n = self.poll()?;
            if n > 0 {
                let wcs: Vec<Wc> = self.wcs.drain(..).collect();
                for wc in &wcs {
                    Self::check_status(wc)?;
                    self.on_recv(wc, size)?;
                    got += 1;
                }
                watch.progress();
            } else if watch.idle("receiving SENDs")? && expected.is_none() {
                if let Some(v) = ctrl.try_recv()? {
                    let v = super::ctrl::check_kind(v, "done")?;
                    let posted: u64 = v
                        .get("ops")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_u64).sum())
                        .ok_or_else(|| anyhow!("malformed done message"))?;
                    expected = Some(posted);
                    done_msg = Some(v);
                    watch.progress();
                }
            }
        }
        Ok(done_msg)
    }

    /// Reaps send completions (latency tests keep the send queue short), keeping receive
    /// completions for [`Rdma::wait_recv`]; with `wait`, until the queue is half empty.
    fn reap_sends(&mut self, wait: bool) -> anyhow::Result<()> {
        let mut watch = Watch::new();
        loop {
            let n = self.cq.poll_into(&mut self.wcs, 64);
            for wc in self.wcs.drain(..) {
                Self::check_status(&wc)?;
                if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    self.pending.push_back(wc);
                } else {
                    self.sq_done = (wc.wr_id & SEQ_MASK) + 1;
                }
            }
            if !wait || self.sq_posted - self.sq_done < u64::from(LAT_SQ) / 2 {
                return Ok(());
            }
            if n == 0 {
                watch.idle("waiting for send completions")?;
            }
        }
    }

    fn post_one(&mut self, op: SendOp, len: usize, signaled: bool) -> anyhow::Result<()> {
        let seq = self.sq_posted;
        let flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        let wr = SendWr::new(
            seq,
            op,
            SgeList::one(self.mr.sge(self.layout.local(0), len)),
        )
        .with_flags(flags);
        let wr = if matches!(
            op,
            SendOp::Send | SendOp::Write { .. } | SendOp::WriteWithImm { .. }
        ) && len <= self.opts.inline as usize
            && len > 0
        {
            let mut data = vec![0u8; len];
            self.mr.read(self.layout.local(0), &mut data)?;
            wr.with_inline(data)
        } else {
            wr
        };
        self.qps[0].post_send(wr).context("posting a send WR")?;
        self.sq_posted += 1;
        Ok(())
    }

    /// The latency loop. Ping-pong for WRITE (polling the last byte of the target slot, or
    /// with events WRITE with immediate and a receive) and SEND; one READ or atomic at a time
    /// for those (the server then only waits). Returns the post time of every iteration and
    /// the iterations run. `iters` None: until `duration` (client) or until the client's
    /// "done" message (server).
    pub fn lat_loop(
        &mut self,
        size: usize,
        client: bool,
        iters: Option<u64>,
        duration: Option<Duration>,
        ctrl: &mut Ctrl,
    ) -> anyhow::Result<(Vec<Instant>, Option<Value>)> {
        let verb = self.opts.test.verb();
        let mut times = Vec::with_capacity(iters.unwrap_or(100_000) as usize);
        let start = Instant::now();
        let deadline = duration.map(|d| start + d);
        let mut limit = iters;
        let mut done_msg = None;
        let cq_mod = u64::from(self.opts.cq_mod).clamp(1, u64::from(LAT_SQ) / 4);
        let r = self.remote[0];
        let rkey = RKey(r.rkey);
        let target = self.layout.target(0);
        let mem_poll = verb == Verb::Write && !self.opts.events;
        let mut i = 0u64;
        loop {
            if limit.is_some_and(|l| i >= l) {
                break;
            }
            if client && limit.is_none() && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            // 1..=255, never the same twice in a row and never the zero of a fresh buffer.
            let c = (i % 255) as u8 + 1;
            let signaled = (i + 1) % cq_mod == 0;
            let op = match verb {
                Verb::Write if self.opts.events => SendOp::WriteWithImm {
                    remote_addr: r.vaddr,
                    rkey,
                    imm: c.into(),
                },
                Verb::Write => SendOp::Write {
                    remote_addr: r.vaddr,
                    rkey,
                },
                Verb::Send => SendOp::Send,
                Verb::Read => SendOp::Read {
                    remote_addr: r.vaddr,
                    rkey,
                },
                Verb::Atomic => SendOp::FetchAdd {
                    remote_addr: r.vaddr,
                    rkey,
                    add: 1,
                },
            };
            let len = if verb == Verb::Atomic { 8 } else { size };
            match verb {
                Verb::Read | Verb::Atomic => {
                    if !client {
                        // The responder's engine does the work; wait for the client's end.
                        let v = ctrl.expect("done")?;
                        return Ok((times, Some(v)));
                    }
                    times.push(Instant::now());
                    self.post_one(op, len, true)?;
                    self.wait_send_completion(i)?;
                }
                Verb::Write | Verb::Send => {
                    if client {
                        times.push(Instant::now());
                        self.set_counter(c, size)?;
                        self.post_one(op, len, signaled)?;
                        // Send completions are collected while the message travels, not
                        // between the reply and the next post (a poll there costs a look
                        // at the socket on the round trip).
                        self.reap_sends(true)?;
                        if mem_poll {
                            self.wait_memory(target + size - 1, c, None, &mut None)?;
                        } else {
                            self.wait_recv(size, None, &mut None)?;
                        }
                    } else {
                        let stop = if mem_poll {
                            self.wait_memory(target + size - 1, c, Some(&mut *ctrl), &mut done_msg)?
                        } else {
                            self.wait_recv(size, Some(&mut *ctrl), &mut done_msg)?
                        };
                        if stop {
                            // The client ended (duration mode) and said after how many.
                            let n = done_msg
                                .as_ref()
                                .and_then(|v| v.get("iters"))
                                .and_then(Value::as_u64)
                                .unwrap_or(i);
                            if i >= n {
                                break;
                            }
                            limit = Some(n);
                            continue;
                        }
                        times.push(Instant::now());
                        self.set_counter(c, size)?;
                        self.post_one(op, len, signaled)?;
                        self.reap_sends(true)?;
                    }
                }
            }
            i += 1;
            if !client && limit.is_none() {
                if let Some(v) = &done_msg {
                    limit = v.get("iters").and_then(Value::as_u64);
                }
            }
        }
        self.reap_sends(false)?;
        if !self.pending.is_empty() {
            bail!("a message arrived after the last ping-pong round");
        }
        Ok((times, done_msg))
    }

    /// WRITE latency: the last byte of the message is the iteration counter.
    fn set_counter(&self, c: u8, size: usize) -> anyhow::Result<()> {
        if self.opts.test == TestKind::WriteLat && size > 0 {
            self.mr.write(self.layout.local(0) + size - 1, &[c])?;
        }
        Ok(())
    }

    fn wait_send_completion(&mut self, seq: u64) -> anyhow::Result<()> {
        let mut watch = Watch::new();
        loop {
            let n = self.poll()?;
            for wc in self.wcs.drain(..) {
                Self::check_status(&wc)?;
                self.sq_done = (wc.wr_id & SEQ_MASK) + 1;
            }
            if self.sq_done > seq {
                return Ok(());
            }
            if n == 0 {
                watch.idle("waiting for a completion")?;
            }
        }
    }

    /// Spins until the byte at `off` is `c`. With `ctrl`, also watches for the client's
    /// "done" message; returns true if it came (and `c` did not).
    fn wait_memory(
        &mut self,
        off: usize,
        c: u8,
        mut ctrl: Option<&mut Ctrl>,
        done: &mut Option<Value>,
    ) -> anyhow::Result<bool> {
        let mut watch = Watch::new();
        let mut b = [0u8; 1];
        loop {
            self.mr.read(off, &mut b)?;
            if b[0] == c {
                return Ok(false);
            }
            // Each read drives the device from this thread (a receive that finds the WRITE
            // places it), as a CQ poll would: look again at once, or the peer's WRITE waits
            // for the spin (32 `pause`s between looks cost WRITE latency ~1 µs over SEND's).
            if watch.idle("waiting for the peer's WRITE")? {
                self.reap_sends(false)?;
                if let Some(ctrl) = ctrl.as_deref_mut() {
                    if done.is_none() {
                        if let Some(v) = ctrl.try_recv()? {
                            *done = Some(super::ctrl::check_kind(v, "done")?);
                            watch.progress();
                        }
                    }
                }
                if done.is_some() {
                    // Re-read once: the last WRITE may have landed meanwhile.
                    self.mr.read(off, &mut b)?;
                    return Ok(b[0] != c);
                }
            }
        }
    }

    /// Waits for the next receive completion (SEND, or WRITE with immediate). With `ctrl`,
    /// as [`Rdma::wait_memory`].
    fn wait_recv(
        &mut self,
        size: usize,
        mut ctrl: Option<&mut Ctrl>,
        done: &mut Option<Value>,
    ) -> anyhow::Result<bool> {
        let mut watch = Watch::new();
        loop {
            if self.pending.is_empty() {
                let _ = self.poll()?;
                for wc in self.wcs.drain(..) {
                    Self::check_status(&wc)?;
                    if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                        self.pending.push_back(wc);
                    } else {
                        self.sq_done = (wc.wr_id & SEQ_MASK) + 1;
                    }
                }
            }
            if let Some(wc) = self.pending.pop_front() {
                self.on_recv(&wc, size)?;
                return Ok(false);
            }
            if watch.idle("waiting for the peer's message")? {
                if let Some(ctrl) = ctrl.as_deref_mut() {
                    if done.is_none() {
                        if let Some(v) = ctrl.try_recv()? {
                            *done = Some(super::ctrl::check_kind(v, "done")?);
                            watch.progress();
                        }
                    }
                }
                if done.is_some() {
                    return Ok(true);
                }
            }
        }
    }
}

/// perftest's peak: the smallest time per message over any window from a post to a later
/// completion.
fn peak_time_per_msg(tposted: &[Instant], tdone: &[(u64, Instant)]) -> Option<f64> {
    let mut best: Option<f64> = None;
    for (i, &tp) in tposted.iter().enumerate() {
        for &(n, tc) in tdone {
            if n as usize > i {
                let t = tc.saturating_duration_since(tp).as_secs_f64() / (n as usize - i) as f64;
                if t > 0.0 && best.is_none_or(|b| t < b) {
                    best = Some(t);
                }
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait whose every spin sleeps (a poll on a completion channel) still looks around
    /// within [`LOOK_EVERY`] and a few spins, not after 256 of them: the server of a latency
    /// test in events mode hears the client's "done" in time.
    #[test]
    fn a_wait_whose_spins_sleep_looks_around_within_the_look_interval() {
        let mut w = Watch::new();
        let mut spins = 0;
        loop {
            std::thread::sleep(Duration::from_millis(5));
            spins += 1;
            if w.idle("testing").unwrap() {
                break;
            }
        }
        // 16 spins of at least 5 ms each are past LOOK_EVERY at the first clock read.
        assert_eq!(spins, 16);
        // Progress starts the count again.
        w.progress();
        assert!(w.last.is_none() && w.looked.is_none());
    }
}
