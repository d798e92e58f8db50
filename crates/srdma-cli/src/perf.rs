//! `srdma perf`: perftest's bandwidth and latency tests (`ib_write_bw`, `ib_write_lat`,
//! `ib_read_bw`, `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_bw`, `ib_atomic_lat`)
//! on srdma devices, with kernel-socket baselines.
//!
//! `srdma perf TEST` is the server: it binds its device (`--bind`, default 127.0.0.1, UDP
//! `--udp-port`) and waits on TCP port `-p` (18515) of the same address. `srdma perf TEST
//! SERVER` is the client. Both sides must be given the same test options: the client sends
//! its options over the TCP control connection and the server refuses a mismatch (both exit
//! 1, naming the options). Then the two exchange their QPs (QPN, PSN, R_Key, address, GID,
//! UDP port), run every message size in lockstep, and print perftest's header block, address
//! lines and result table, with perftest's defaults (`-s` 65536 for bandwidth, 2 for
//! latency; `-n` 5000 / 1000; `-t` 128; CQ moderation 100) and its arithmetic (MB/sec are
//! MiB/s; latency is half the round trip for the WRITE and SEND ping-pongs, the full time of
//! one operation for READ and atomics, with the two largest samples dropped).
//!
//! What srdma adds:
//!
//! * a `CPU[s/GB]` line under every bandwidth line: CPU seconds (user + system, every thread
//!   of the process, from `getrusage`) per 10^9 bytes moved, for this side and, as it reports
//!   it over the control connection, the peer;
//! * `--check`: the receiving side of the data verifies every byte against a deterministic
//!   pattern (each SEND as it arrives; WRITE targets, READ destinations and atomic counters
//!   after each size), and a difference fails the run;
//! * `--baseline tcp|udp`: right after the RDMA test, the same transfer between the same two
//!   addresses over kernel sockets (see [`baseline`]), its table, and the ratio srdma/kernel;
//! * `--json`: one JSON object with every figure instead of the tables, the device's
//!   counters (`device_counters`: datagrams, GSO sends, GRO buffers, drops, shared-memory
//!   packets and links) and which driver carried each QP (`qp_paths`: `udp` or `shm`).
//!
//! `-e` sleeps on an [`srdma::CompChannel`] instead of busy polling; for `write-lat`, whose
//! receiver polls memory in perftest, `-e` uses WRITE with immediate so that the receiver
//! has a completion to sleep on.

mod baseline;
mod ctrl;
mod engine;
mod report;
mod sys;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use srdma::{Device, DeviceConfig, Mtu};

pub use baseline::BaselineKind;
use ctrl::{Ctrl, PeerError, get_f64, get_u64};
use report::{BwStats, LatStats, RESULT_LINE};

/// The tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TestKind {
    /// RDMA WRITE bandwidth (ib_write_bw).
    WriteBw,
    /// RDMA WRITE latency (ib_write_lat).
    WriteLat,
    /// RDMA READ bandwidth (ib_read_bw).
    ReadBw,
    /// RDMA READ latency (ib_read_lat).
    ReadLat,
    /// SEND bandwidth (ib_send_bw).
    SendBw,
    /// SEND latency (ib_send_lat).
    SendLat,
    /// Fetch-and-add bandwidth (ib_atomic_bw).
    AtomicBw,
    /// Fetch-and-add latency (ib_atomic_lat).
    AtomicLat,
}

/// The operation a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// SEND.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Fetch-and-add.
    Atomic,
}

impl TestKind {
    /// The test's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TestKind::WriteBw => "write-bw",
            TestKind::WriteLat => "write-lat",
            TestKind::ReadBw => "read-bw",
            TestKind::ReadLat => "read-lat",
            TestKind::SendBw => "send-bw",
            TestKind::SendLat => "send-lat",
            TestKind::AtomicBw => "atomic-bw",
            TestKind::AtomicLat => "atomic-lat",
        }
    }

    /// The operation.
    pub fn verb(self) -> Verb {
        match self {
            TestKind::WriteBw | TestKind::WriteLat => Verb::Write,
            TestKind::ReadBw | TestKind::ReadLat => Verb::Read,
            TestKind::SendBw | TestKind::SendLat => Verb::Send,
            TestKind::AtomicBw | TestKind::AtomicLat => Verb::Atomic,
        }
    }

    /// A bandwidth test.
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::SendBw | TestKind::AtomicBw
        )
    }

    /// Latency samples are divided by this: 2 for the ping-pongs (half the round trip).
    fn rtt_factor(self) -> f64 {
        match self.verb() {
            Verb::Send | Verb::Write => 2.0,
            Verb::Read | Verb::Atomic => 1.0,
        }
    }
}

/// Options of `srdma perf`: perftest's, plus where the srdma device lives and what srdma adds.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The test.
    #[arg(value_enum)]
    pub test: TestKind,
    /// Server to connect to (name or address); without it, wait for a client.
    pub server: Option<String>,
    /// Size of message to exchange [default: 65536 for bandwidth, 2 for latency, 8 for atomics].
    #[arg(short = 's', long = "size", value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub size: Option<u64>,
    /// Run sizes from 2 till 2^23.
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all: bool,
    /// Number of exchanges per QP (at least 5) [default: 5000 for bandwidth, 1000 for latency].
    #[arg(short = 'n', long = "iters", value_parser = clap::value_parser!(u64).range(5..=100_000_000))]
    pub iters: Option<u64>,
    /// Run each size for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", conflicts_with = "iters", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: Option<u64>,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub qps: u32,
    /// Size of the send queue: WRs kept in flight per QP [default: 128; latency: 1].
    #[arg(short = 't', long = "tx-depth", value_parser = clap::value_parser!(u32).range(1..=15000))]
    pub tx_depth: Option<u32>,
    /// Generate a completion only every this many WRs (bandwidth tests: at most every
    /// 16 MiB of messages).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub cq_mod: u32,
    /// Receives kept posted (SEND tests).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (the smaller of the two sides' is used).
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    pub mtu: Mtu,
    /// GID index [default: the bound address's GID: 1 for IPv4, 0 for IPv6].
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<usize>,
    /// Listen on / connect to TCP port PORT.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Accepted for perftest compatibility (srdma does not count CPU cycles).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Report bandwidth in Gb/sec instead of MB/sec.
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
    /// Largest message sent inline (WRITE and SEND).
    #[arg(short = 'I', long = "inline_size", alias = "inline-size", value_parser = clap::value_parser!(u32).range(0..=512))]
    pub inline_size: Option<u32>,
    /// Sleep on CQ events (a completion channel) instead of busy polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local IP address of the srdma device [default: server 127.0.0.1; client: the source
    /// address towards the server].
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// UDP port of the srdma device.
    #[arg(long, value_name = "PORT", default_value_t = srdma::ROCEV2_PORT)]
    pub udp_port: u16,
    /// Print one JSON object with every figure instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Verify every byte of the data on the receiving side (both sides need it).
    #[arg(long)]
    pub check: bool,
    /// After the RDMA test, run the same transfer over kernel sockets and print the ratio.
    #[arg(long, value_enum, value_name = "tcp|udp")]
    pub baseline: Option<BaselineKind>,
}

/// An MTU in bytes.
fn parse_mtu(s: &str) -> Result<Mtu, String> {
    s.parse::<u32>()
        .ok()
        .and_then(Mtu::from_bytes)
        .ok_or_else(|| "the MTU must be 256, 512, 1024, 2048 or 4096".into())
}

/// How long a client keeps retrying a refused connection (the server may be starting).
const CONNECT_RETRY: Duration = Duration::from_secs(2);
/// Outstanding READs / atomics per QP.
const OUT_READS: u8 = 16;

/// The options both sides must agree on, with defaults applied.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    test: TestKind,
    sizes: Vec<u64>,
    iters: u64,
    duration: Option<u64>,
    qps: u32,
    check: bool,
    baseline: Option<BaselineKind>,
}

impl Spec {
    fn to_json(&self) -> Value {
        json!({
            "test": self.test.name(),
            "sizes": self.sizes,
            "iters": self.iters,
            "duration": self.duration,
            "qps": self.qps,
            "check": self.check,
            "baseline": self.baseline.map(BaselineKind::name),
        })
    }

    /// The differences between the server's options (these) and the client's, as
    /// "name: server X, client Y".
    fn mismatches(&self, peer: &Value) -> Vec<String> {
        let mine = self.to_json();
        let names = [
            ("test", "test"),
            ("sizes", "-s/-a (message sizes)"),
            ("iters", "-n (iterations)"),
            ("duration", "-D (duration)"),
            ("qps", "-q (QPs)"),
            ("check", "--check"),
            ("baseline", "--baseline"),
        ];
        names
            .iter()
            .filter(|(k, _)| mine.get(*k) != peer.get(*k))
            .map(|(k, label)| {
                let show = |v: Option<&Value>| v.map_or("(none)".to_string(), short);
                format!(
                    "{label}: server {}, client {}",
                    show(mine.get(*k)),
                    show(peer.get(*k))
                )
            })
            .collect()
    }

    fn duration(&self) -> Option<Duration> {
        self.duration.map(Duration::from_secs)
    }
}

/// A JSON value shortened for an error message.
fn short(v: &Value) -> String {
    match v {
        Value::Array(a) if a.len() > 3 => {
            format!("[{}, ..., {}] ({} sizes)", a[0], a[a.len() - 1], a.len())
        }
        Value::Null => "(none)".into(),
        other => other.to_string(),
    }
}

/// A bad combination of options: clap's usage error, exit status 2.
fn usage_error(msg: impl std::fmt::Display) -> ! {
    clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, format!("{msg}\n")).exit()
}

fn spec_of(args: &Args) -> Spec {
    let t = args.test;
    if t.verb() == Verb::Atomic {
        if args.all {
            usage_error("-a is not available for atomic tests (their messages are 8 bytes)");
        }
        if args.size.is_some_and(|s| s != 8) {
            usage_error("atomic tests use 8-byte messages: leave out -s or give -s 8");
        }
    }
    if !t.is_bw() && args.qps != 1 {
        usage_error("latency tests run on one QP: leave out -q");
    }
    let sizes: Vec<u64> = if args.all {
        (1..=23).map(|e| 1u64 << e).collect()
    } else if t.verb() == Verb::Atomic {
        vec![8]
    } else {
        vec![args.size.unwrap_or(if t.is_bw() { 65536 } else { 2 })]
    };
    if args.baseline == Some(BaselineKind::Udp) || (args.baseline.is_some() && !t.is_bw()) {
        if let Some(&big) = sizes.iter().find(|&&s| s > baseline::MAX_DATAGRAM) {
            usage_error(format!(
                "the UDP baseline cannot carry {big}-byte messages (at most {} bytes per datagram)",
                baseline::MAX_DATAGRAM
            ));
        }
    }
    if let Some(ip) = args.bind {
        if ip.is_unspecified() {
            usage_error("--bind needs a specific address (it is covered by every packet's ICRC)");
        }
    }
    Spec {
        test: t,
        sizes,
        iters: args.iters.unwrap_or(if t.is_bw() { 5000 } else { 1000 }),
        duration: args.duration,
        qps: args.qps,
        check: args.check,
        baseline: args.baseline,
    }
}

/// Runs `srdma perf`.
pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    let spec = spec_of(args);
    let mut side = Side::new(args, spec, out);
    match &args.server {
        Some(server) => side.client(server),
        None => side.server(),
    }
}

/// One side of a test run and what it prints.
struct Side<'a, W: Write> {
    args: &'a Args,
    spec: Spec,
    out: &'a mut W,
    client: bool,
    json: Value,
}

impl<'a, W: Write> Side<'a, W> {
    fn new(args: &'a Args, spec: Spec, out: &'a mut W) -> Side<'a, W> {
        let client = args.server.is_some();
        let json = json!({
            "test": spec.test.name(),
            "role": if client { "client" } else { "server" },
            "results": [],
        });
        Side {
            args,
            spec,
            out,
            client,
            json,
        }
    }

    /// Prints a line of the tables (nothing in JSON mode).
    fn say(&mut self, line: impl AsRef<str>) -> anyhow::Result<()> {
        if !self.args.json {
            writeln!(self.out, "{}", line.as_ref())?;
            self.out.flush()?;
        }
        Ok(())
    }

    fn open_device(&self, ip: IpAddr) -> anyhow::Result<Device> {
        let mut cfg = DeviceConfig::new(ip);
        cfg.port = self.args.udp_port;
        cfg.mtu = self.args.mtu;
        let dev = Device::open(cfg).with_context(|| {
            format!(
                "opening the srdma device on {ip} UDP port {}",
                self.args.udp_port
            )
        })?;
        let want = self
            .args
            .gid_index
            .unwrap_or(if ip.is_ipv4() { 1 } else { 0 });
        if dev.gid(want) != Some(dev.local_gid()) {
            usage_error(format!(
                "GID index {want} is not the GID of {ip} (use -x {}): RoCEv2 traffic needs the \
                 address's GID",
                if ip.is_ipv4() { 1 } else { 0 }
            ));
        }
        Ok(dev)
    }

    fn client(&mut self, server: &str) -> anyhow::Result<bool> {
        let addr = (server, self.args.port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {server}"))?
            .next()
            .ok_or_else(|| anyhow!("{server} has no address"))?;
        let ip = match self.args.bind {
            Some(ip) => ip,
            None => sys::source_towards(addr)
                .ok_or_else(|| anyhow!("no local address reaches {addr}; give --bind"))?,
        };
        let dev = self.open_device(ip)?;
        let stream = connect(addr)?;
        let mut ctrl = Ctrl::new(stream);
        ctrl.set_run_length(self.spec.duration().unwrap_or_default());
        let r = self.client_run(&mut ctrl, dev);
        finish(&mut ctrl, r)
    }

    fn server(&mut self) -> anyhow::Result<bool> {
        let ip = self.args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let dev = self.open_device(ip)?;
        let listener = TcpListener::bind((ip, self.args.port))
            .with_context(|| format!("listening on TCP {ip}:{}", self.args.port))?;
        self.say("\n************************************")?;
        self.say("* Waiting for client to connect... *")?;
        self.say("************************************")?;
        let (stream, _) = listener.accept().context("accepting the client")?;
        drop(listener);
        let mut ctrl = Ctrl::new(stream);
        ctrl.set_run_length(self.spec.duration().unwrap_or_default());
        let r = self.server_run(&mut ctrl, dev);
        finish(&mut ctrl, r)
    }

    fn engine_opts(&self, mtu: Mtu) -> engine::Opts {
        let t = self.spec.test;
        engine::Opts {
            test: t,
            qps: self.spec.qps as usize,
            tx_depth: self
                .args
                .tx_depth
                .unwrap_or(if t.is_bw() { 128 } else { 1 }),
            cq_mod: self.args.cq_mod,
            rx_depth: self.args.rx_depth,
            inline: self.args.inline_size.unwrap_or(0),
            events: self.args.events,
            check: self.spec.check,
            mtu,
            max_size: self.spec.sizes.iter().copied().max().unwrap_or(8) as usize,
            out_reads: OUT_READS,
        }
    }

    fn client_run(&mut self, ctrl: &mut Ctrl, dev: Device) -> anyhow::Result<()> {
        ctrl.send(&json!({"type": "hello", "spec": self.spec.to_json(),
                          "mtu": self.args.mtu.bytes()}))?;
        let ok = ctrl.expect("hello_ok")?;
        let mtu = Mtu::from_bytes(get_u64(&ok, "mtu")? as u32)
            .ok_or_else(|| anyhow!("the server chose an invalid MTU"))?;
        let opts = self.engine_opts(mtu);
        let mut rdma = engine::Rdma::new(dev, opts.clone())?;
        let local = rdma.local_info();
        ctrl.send(
            &json!({"type": "qps", "qps": local.iter().map(|q| q.to_json()).collect::<Vec<_>>()}),
        )?;
        let remote = parse_qps(&ctrl.expect("qps")?)?;
        rdma.connect(remote.clone())?;
        self.print_header(&opts, &rdma, &local, &remote)?;
        let server_ip = remote[0].gid.ip();
        let results = self.client_sizes(ctrl, &mut rdma, &opts)?;
        if let Some(kind) = self.spec.baseline {
            let local_ip = rdma.device().local_addr().ip();
            self.client_baseline(ctrl, kind, local_ip, server_ip, &results)?;
        }
        self.note_counters(rdma.device());
        self.note_qps(&rdma);
        self.json["qp_paths"] = json!(rdma.paths());
        self.emit_json(&opts)
    }

    fn server_run(&mut self, ctrl: &mut Ctrl, dev: Device) -> anyhow::Result<()> {
        let hello = ctrl.expect("hello")?;
        let peer = hello
            .get("spec")
            .ok_or_else(|| anyhow!("hello without options"))?;
        let bad = self.spec.mismatches(peer);
        if !bad.is_empty() {
            let msg = format!(
                "the options of the server and the client differ: {}",
                bad.join("; ")
            );
            ctrl.send_error(&msg);
            return Err(ctrl::Reported(msg).into());
        }
        let peer_mtu = get_u64(&hello, "mtu")? as u32;
        let mtu = Mtu::from_bytes(peer_mtu.min(self.args.mtu.bytes()))
            .ok_or_else(|| anyhow!("the client sent an invalid MTU"))?;
        ctrl.send(&json!({"type": "hello_ok", "mtu": mtu.bytes()}))?;
        let opts = self.engine_opts(mtu);
        let mut rdma = engine::Rdma::new(dev, opts.clone())?;
        let local = rdma.local_info();
        let remote = parse_qps(&ctrl.expect("qps")?)?;
        ctrl.send(
            &json!({"type": "qps", "qps": local.iter().map(|q| q.to_json()).collect::<Vec<_>>()}),
        )?;
        rdma.connect(remote.clone())?;
        self.print_header(&opts, &rdma, &local, &remote)?;
        let results = self.server_sizes(ctrl, &mut rdma)?;
        if let Some(kind) = self.spec.baseline {
            let ip = rdma.device().local_addr().ip();
            self.server_baseline(ctrl, kind, ip, &results)?;
        }
        self.note_counters(rdma.device());
        self.note_qps(&rdma);
        self.json["qp_paths"] = json!(rdma.paths());
        self.emit_json(&opts)
    }

    fn print_header(
        &mut self,
        o: &engine::Opts,
        rdma: &engine::Rdma,
        local: &[engine::QpInfo],
        remote: &[engine::QpInfo],
    ) -> anyhow::Result<()> {
        let t = self.spec.test;
        let verb = t.verb();
        let name = match verb {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic FETCH_AND_ADD",
        };
        let kind = if t.is_bw() { "BW" } else { "Latency" };
        let dev = rdma.device();
        let gid_index = self
            .args
            .gid_index
            .unwrap_or(if dev.local_addr().is_ipv4() { 1 } else { 0 });
        let mut lines = vec![
            RESULT_LINE.to_string(),
            format!("                    {name} {kind} Test"),
        ];
        if o.events {
            lines.push(format!(
                " Test with events. Using {}_comp0",
                dev.config().name
            ));
        }
        lines.push(format!(
            " Dual-port       : OFF\t\tDevice         : {}",
            dev.config().name
        ));
        lines.push(format!(
            " Number of qps   : {}\t\tTransport type : IB",
            o.qps
        ));
        lines.push(" Connection type : RC\t\tUsing SRQ      : OFF".into());
        if self.client {
            lines.push(format!(" TX depth        : {}", o.tx_depth));
        }
        if verb == Verb::Send && !self.client {
            lines.push(format!(" RX depth        : {}", o.rx_depth));
        }
        if t.is_bw() {
            lines.push(format!(" CQ Moderation   : {}", o.cq_mod.min(o.tx_depth)));
        }
        lines.push(format!(" Mtu             : {}[B]", o.mtu.bytes()));
        lines.push(" Link type       : Ethernet".into());
        lines.push(format!(" GID index       : {gid_index}"));
        if matches!(verb, Verb::Read | Verb::Atomic) {
            lines.push(format!(" Outstand reads  : {}", o.out_reads));
        } else {
            lines.push(format!(" Max inline data : {}[B]", o.inline));
        }
        lines.push(" rdma_cm QPs\t : OFF".into());
        lines.push(" Data ex. method : Ethernet".into());
        lines.push(RESULT_LINE.into());
        let outs = matches!(verb, Verb::Read | Verb::Atomic).then_some(u32::from(o.out_reads));
        for (side, qps) in [("local", local), ("remote", remote)] {
            for q in qps {
                let rdma_part = (verb != Verb::Send).then_some((q.rkey, q.vaddr));
                lines.push(report::addr_line(side, q.qpn, q.psn, outs, rdma_part));
                lines.push(report::gid_line(&q.gid));
            }
        }
        lines.push(RESULT_LINE.into());
        lines.push(if t.is_bw() {
            report::bw_columns(self.args.report_gbits).to_string()
        } else {
            report::LAT_COLUMNS.to_string()
        });
        for l in lines {
            self.say(l)?;
        }
        let params = json!({
            "spec": self.spec.to_json(),
            "tx_depth": o.tx_depth, "cq_mod": o.cq_mod.min(o.tx_depth), "rx_depth": o.rx_depth,
            "mtu": o.mtu.bytes(), "inline": o.inline, "events": o.events,
            "local": local.iter().map(|q| q.to_json()).collect::<Vec<_>>(),
            "remote": remote.iter().map(|q| q.to_json()).collect::<Vec<_>>(),
        });
        self.json["params"] = params;
        Ok(())
    }

    fn push_result(&mut self, v: Value) {
        if let Some(a) = self.json["results"].as_array_mut() {
            a.push(v);
        }
    }

    fn client_sizes(
        &mut self,
        ctrl: &mut Ctrl,
        rdma: &mut engine::Rdma,
        opts: &engine::Opts,
    ) -> anyhow::Result<Vec<Measured>> {
        let t = self.spec.test;
        let mut all = Vec::new();
        for &size in &self.spec.sizes.clone() {
            let size_u = size as usize;
            rdma.prepare(size_u, true);
            ctrl.send(&json!({"type": "size", "size": size}))?;
            ctrl.expect("ready")?;
            let cpu0 = sys::cpu_seconds();
            if t.is_bw() {
                let (stats, ops) = rdma.bw_client(size_u, self.spec.iters, self.spec.duration())?;
                let cpu = sys::cpu_seconds() - cpu0;
                rdma.verify(size_u, true, &ops)?;
                ctrl.send(
                    &json!({"type": "done", "ops": ops, "result": stats.to_json(), "cpu": cpu}),
                )?;
                let res = ctrl.expect("result")?;
                let remote_cpu = get_f64(&res, "cpu")?;
                self.report_bw(&stats, cpu, Some(remote_cpu))?;
                all.push(Measured::Bw(stats));
            } else {
                let iters = if self.spec.duration.is_some() {
                    None
                } else {
                    Some(self.spec.iters)
                };
                let (times, _) = rdma.lat_loop(size_u, true, iters, self.spec.duration(), ctrl)?;
                let cpu = sys::cpu_seconds() - cpu0;
                let n = times.len() as u64;
                rdma.verify(size_u, true, &[n])?;
                let stats = lat_stats(size, &times, t.rtt_factor());
                ctrl.send(&json!({"type": "done", "iters": n, "ops": [n], "result": stats.to_json(), "cpu": cpu}))?;
                let res = ctrl.expect("result")?;
                let remote_cpu = get_f64(&res, "cpu")?;
                self.report_lat(&stats, cpu, Some(remote_cpu))?;
                all.push(Measured::Lat(stats));
            }
        }
        let _ = opts;
        self.say(RESULT_LINE)?;
        Ok(all)
    }

    fn server_sizes(
        &mut self,
        ctrl: &mut Ctrl,
        rdma: &mut engine::Rdma,
    ) -> anyhow::Result<Vec<Measured>> {
        let t = self.spec.test;
        let mut all = Vec::new();
        for &want in &self.spec.sizes.clone() {
            let size = get_u64(&ctrl.expect("size")?, "size")?;
            if size != want {
                bail!("the client asked for {size}-byte messages, expected {want}");
            }
            let size_u = size as usize;
            rdma.prepare(size_u, false);
            let cpu0 = sys::cpu_seconds();
            ctrl.send(&json!({"type": "ready"}))?;
            let iters = if self.spec.duration.is_some() {
                None
            } else {
                Some(self.spec.iters)
            };
            let (done, times) = if t.is_bw() {
                let early = if t.verb() == Verb::Send {
                    rdma.bw_server_recv(size_u, iters.map(|i| i * u64::from(self.spec.qps)), ctrl)?
                } else {
                    None
                };
                (early, Vec::new())
            } else {
                let (times, early) = rdma.lat_loop(size_u, false, iters, None, ctrl)?;
                (early, times)
            };
            let done = match done {
                Some(d) => d,
                None => ctrl.expect("done")?,
            };
            let cpu = sys::cpu_seconds() - cpu0;
            let ops: Vec<u64> = done
                .get("ops")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .ok_or_else(|| anyhow!("done message without operation counts"))?;
            rdma.verify(size_u, false, &ops)?;
            ctrl.send(&json!({"type": "result", "cpu": cpu}))?;
            let remote_cpu = get_f64(&done, "cpu")?;
            let result = done
                .get("result")
                .ok_or_else(|| anyhow!("done message without a result"))?;
            if t.is_bw() {
                let stats = BwStats::from_json(result)?;
                self.report_bw(&stats, cpu, Some(remote_cpu))?;
                all.push(Measured::Bw(stats));
            } else {
                // The ping-pong servers measure their own side, as perftest's; READ and atomic
                // servers only serve, and show the client's figures.
                let stats = if times.len() >= 2 {
                    lat_stats(size, &times, t.rtt_factor())
                } else {
                    LatStats::from_json(result)?
                };
                self.report_lat(&stats, cpu, Some(remote_cpu))?;
                all.push(Measured::Lat(stats));
            }
        }
        self.say(RESULT_LINE)?;
        Ok(all)
    }

    fn report_bw(&mut self, s: &BwStats, cpu: f64, remote: Option<f64>) -> anyhow::Result<()> {
        let bytes = s.size * s.msgs;
        let local = report::cpu_per_gb(cpu, bytes);
        let remote = remote.map(|r| report::cpu_per_gb(r, bytes));
        self.say(s.line(self.args.report_gbits))?;
        self.say(report::cpu_line(local, remote))?;
        let mut v = s.to_json();
        v["cpu_s_per_gb_local"] = json!(local);
        v["cpu_s_per_gb_remote"] = json!(remote);
        v["cpu_s_local"] = json!(cpu);
        self.push_result(v);
        Ok(())
    }

    fn report_lat(&mut self, s: &LatStats, cpu: f64, remote: Option<f64>) -> anyhow::Result<()> {
        self.say(s.line())?;
        let mut v = s.to_json();
        v["cpu_s_local"] = json!(cpu);
        v["cpu_s_remote"] = json!(remote);
        self.push_result(v);
        Ok(())
    }

    fn baseline_title(&self, kind: BaselineKind) -> String {
        let busy = if self.args.events {
            "blocking"
        } else {
            "busy-poll"
        };
        match (self.spec.test.is_bw(), kind) {
            (true, BaselineKind::Tcp) => format!(
                "                    Kernel TCP BW baseline ({} stream{}, writes of the message size)",
                self.spec.qps,
                if self.spec.qps == 1 { "" } else { "s" }
            ),
            (true, BaselineKind::Udp) => {
                "                    Kernel UDP BW baseline (sendmmsg blast, rate at the receiver)"
                    .into()
            }
            (false, k) => format!(
                "                    Kernel {} Latency baseline (ping-pong, {busy})",
                k.name().to_uppercase()
            ),
        }
    }

    /// The title and column line of a baseline table.
    fn baseline_header(&mut self, kind: BaselineKind) -> anyhow::Result<()> {
        self.say(self.baseline_title(kind))?;
        self.say(if self.spec.test.is_bw() {
            report::bw_columns(self.args.report_gbits).to_string()
        } else {
            report::LAT_COLUMNS.to_string()
        })
    }

    fn client_baseline(
        &mut self,
        ctrl: &mut Ctrl,
        kind: BaselineKind,
        local_ip: IpAddr,
        server_ip: IpAddr,
        rdma: &[Measured],
    ) -> anyhow::Result<()> {
        let t = self.spec.test;
        self.baseline_header(kind)?;
        let mut base = Vec::new();
        let mut jres = Vec::new();
        for &size in &self.spec.sizes.clone() {
            let size_u = size as usize;
            ctrl.send(&json!({"type": "bsize", "size": size}))?;
            let port = get_u64(&ctrl.expect("bready")?, "port")? as u16;
            let server = SocketAddr::new(server_ip, port);
            let cpu0 = sys::cpu_seconds();
            // Duration mode: as many as fit in the time.
            let iters = if self.spec.duration.is_some() {
                u64::MAX
            } else {
                self.spec.iters
            };
            if t.is_bw() {
                let per_stream = match kind {
                    BaselineKind::Tcp => iters,
                    BaselineKind::Udp => iters.saturating_mul(u64::from(self.spec.qps)),
                };
                let streams = match kind {
                    BaselineKind::Tcp => self.spec.qps as usize,
                    BaselineKind::Udp => 1,
                };
                let (sent, secs) = baseline::bw_client(
                    kind,
                    local_ip,
                    server,
                    size_u,
                    per_stream,
                    self.spec.duration(),
                    streams,
                )?;
                let cpu = sys::cpu_seconds() - cpu0;
                ctrl.send(&json!({"type": "bdone", "sent": sent, "cpu": cpu}))?;
                let r = ctrl.expect("bresult")?;
                let received = baseline::Received {
                    bytes: get_u64(&r, "bytes")?,
                    msgs: get_u64(&r, "msgs")?,
                    secs: get_f64(&r, "secs")?,
                };
                let stats = baseline::bw_stats(kind, size_u, sent, secs, &received);
                let remote_cpu = get_f64(&r, "cpu")?;
                let v = self.baseline_bw_lines(&stats, cpu, remote_cpu, sent)?;
                ctrl.send(&json!({"type": "bstats", "result": v}))?;
                jres.push(v);
                base.push(Measured::Bw(stats));
            } else {
                let busy = !self.args.events;
                let times = baseline::ping(
                    kind,
                    local_ip,
                    server,
                    size_u,
                    iters,
                    self.spec.duration(),
                    busy,
                )?;
                let cpu = sys::cpu_seconds() - cpu0;
                let stats = lat_stats(size, &times, t.rtt_factor());
                ctrl.send(&json!({"type": "bdone", "sent": times.len(), "cpu": cpu}))?;
                let r = ctrl.expect("bresult")?;
                self.say(stats.line())?;
                let mut v = stats.to_json();
                v["cpu_s_local"] = json!(cpu);
                v["cpu_s_remote"] = json!(get_f64(&r, "cpu")?);
                ctrl.send(&json!({"type": "bstats", "result": v}))?;
                jres.push(v);
                base.push(Measured::Lat(stats));
            }
        }
        self.say(RESULT_LINE)?;
        self.finish_baseline(kind, rdma, &base, jres)
    }

    fn baseline_bw_lines(
        &mut self,
        stats: &BwStats,
        cpu: f64,
        remote_cpu: f64,
        sent: u64,
    ) -> anyhow::Result<Value> {
        let bytes = stats.size * stats.msgs;
        let local = report::cpu_per_gb(cpu, bytes);
        let remote = report::cpu_per_gb(remote_cpu, bytes);
        self.say(stats.line(self.args.report_gbits))?;
        self.say(report::cpu_line(local, Some(remote)))?;
        let mut v = stats.to_json();
        v["sent"] = json!(sent);
        v["cpu_s_per_gb_local"] = json!(local);
        v["cpu_s_per_gb_remote"] = json!(remote);
        Ok(v)
    }

    fn server_baseline(
        &mut self,
        ctrl: &mut Ctrl,
        kind: BaselineKind,
        ip: IpAddr,
        rdma: &[Measured],
    ) -> anyhow::Result<()> {
        let t = self.spec.test;
        self.baseline_header(kind)?;
        let mut base = Vec::new();
        let mut jres = Vec::new();
        for &want in &self.spec.sizes.clone() {
            let size = get_u64(&ctrl.expect("bsize")?, "size")?;
            if size != want {
                bail!("the client asked for {size}-byte baseline messages, expected {want}");
            }
            let size_u = size as usize;
            if t.is_bw() {
                let streams = match kind {
                    BaselineKind::Tcp => self.spec.qps as usize,
                    BaselineKind::Udp => 1,
                };
                let (srv, port) = baseline::bw_server(kind, ip, size_u, streams)?;
                let cpu0 = sys::cpu_seconds();
                ctrl.send(&json!({"type": "bready", "port": port}))?;
                let d = ctrl.expect("bdone")?;
                let sent = get_u64(&d, "sent")?;
                let r = srv.finish(sent)?;
                let cpu = sys::cpu_seconds() - cpu0;
                ctrl.send(&json!({"type": "bresult", "bytes": r.bytes, "msgs": r.msgs,
                                  "secs": r.secs, "cpu": cpu}))?;
                let st = ctrl.expect("bstats")?;
                let v = st.get("result").cloned().unwrap_or(Value::Null);
                let stats = BwStats::from_json(&v)?;
                let bytes = stats.size * stats.msgs;
                self.say(stats.line(self.args.report_gbits))?;
                self.say(report::cpu_line(
                    report::cpu_per_gb(cpu, bytes),
                    Some(report::cpu_per_gb(get_f64(&d, "cpu")?, bytes)),
                ))?;
                jres.push(v);
                base.push(Measured::Bw(stats));
            } else {
                let (echo, port) = baseline::echo_bind(kind, ip)?;
                let cpu0 = sys::cpu_seconds();
                ctrl.send(&json!({"type": "bready", "port": port}))?;
                let n = baseline::echo_serve(echo, size_u, !self.args.events)?;
                let d = ctrl.expect("bdone")?;
                let sent = get_u64(&d, "sent")?;
                if sent != n {
                    bail!("the baseline ping-pong echoed {n} messages, the client sent {sent}");
                }
                let cpu = sys::cpu_seconds() - cpu0;
                ctrl.send(&json!({"type": "bresult", "cpu": cpu}))?;
                let st = ctrl.expect("bstats")?;
                let v = st.get("result").cloned().unwrap_or(Value::Null);
                let stats = LatStats::from_json(&v)?;
                self.say(stats.line())?;
                jres.push(v);
                base.push(Measured::Lat(stats));
            }
        }
        self.say(RESULT_LINE)?;
        self.finish_baseline(kind, rdma, &base, jres)
    }

    /// Prints the srdma/kernel ratio of every size and records the baseline in the JSON.
    fn finish_baseline(
        &mut self,
        kind: BaselineKind,
        rdma: &[Measured],
        base: &[Measured],
        jres: Vec<Value>,
    ) -> anyhow::Result<()> {
        let name = kind.name();
        let mut ratios = Vec::new();
        if self.spec.test.is_bw() {
            self.say(format!(
                " srdma/{name} ratio:  #bytes     BW average   MsgRate   (above 1: srdma faster)"
            ))?;
        } else {
            self.say(format!(
                " srdma/{name} ratio:  #bytes     t_typical    t_avg     (below 1: srdma faster)"
            ))?;
        }
        for (r, b) in rdma.iter().zip(base) {
            match (r, b) {
                (Measured::Bw(r), Measured::Bw(b)) => {
                    let bw = ratio(r.bytes_per_sec(), b.bytes_per_sec());
                    let mr = ratio(r.msgs_per_sec(), b.msgs_per_sec());
                    self.say(format!(
                        "                    {:<7}    {:<9.3}    {:<9.3}",
                        r.size, bw, mr
                    ))?;
                    ratios.push(json!({"bytes": r.size, "bw": bw, "msg_rate": mr}));
                }
                (Measured::Lat(r), Measured::Lat(b)) => {
                    let ty = ratio(r.typical, b.typical);
                    let av = ratio(r.avg, b.avg);
                    self.say(format!(
                        "                    {:<7}    {:<9.3}    {:<9.3}",
                        r.size, ty, av
                    ))?;
                    ratios.push(json!({"bytes": r.size, "t_typical": ty, "t_avg": av}));
                }
                _ => {}
            }
        }
        self.say(RESULT_LINE)?;
        self.json["baseline"] = json!({
            "kind": name,
            "mode": if self.args.events { "blocking" } else { "busy-poll" },
            "results": jres,
        });
        self.json["ratios"] = json!(ratios);
        Ok(())
    }

    /// The device's counters (datagrams, GSO and GRO use, drops) in the JSON output.
    fn note_counters(&mut self, dev: &Device) {
        let c: serde_json::Map<String, Value> = dev
            .counters()
            .entries()
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect();
        self.json["device_counters"] = Value::Object(c);
    }

    /// The QPs' counters (summed; retransmissions, timeouts, NAKs/SACKs, CNPs sent and
    /// received) and each one's congestion control, for `--json`.
    fn note_qps(&mut self, rdma: &engine::Rdma) {
        let c: serde_json::Map<String, Value> = rdma
            .qp_counters()
            .entries()
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect();
        self.json["qp_counters"] = Value::Object(c);
        self.json["congestion"] = json!(rdma.congestion());
    }

    fn emit_json(&mut self, _opts: &engine::Opts) -> anyhow::Result<()> {
        if self.args.json {
            writeln!(self.out, "{}", serde_json::to_string_pretty(&self.json)?)?;
            self.out.flush()?;
        }
        Ok(())
    }
}

/// A measured size, kept for the ratios.
enum Measured {
    Bw(BwStats),
    Lat(LatStats),
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Latency statistics of consecutive post times (perftest: `tposted[i+1] - tposted[i]`).
fn lat_stats(size: u64, times: &[Instant], factor: f64) -> LatStats {
    let mut deltas: Vec<f64> = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    LatStats::from_samples(size, times.len() as u64, &mut deltas, factor)
}

fn parse_qps(v: &Value) -> anyhow::Result<Vec<engine::QpInfo>> {
    v.get("qps")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("QP message without QPs"))?
        .iter()
        .map(engine::QpInfo::from_json)
        .collect()
}

/// Connects the control connection, retrying a refused connection for a moment (the server
/// may still be starting).
fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            Ok(s) => return Ok(s),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && t0.elapsed() < CONNECT_RETRY =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "could not connect to the server at {addr} (is `srdma perf` waiting there?)"
                    )
                });
            }
        }
    }
}

/// Ends a side: on an error of this side, tells the peer before returning it.
fn finish(ctrl: &mut Ctrl, r: anyhow::Result<()>) -> anyhow::Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) => {
            if e.downcast_ref::<PeerError>().is_none()
                && e.downcast_ref::<ctrl::Reported>().is_none()
            {
                ctrl.send_error(&format!("{e:#}"));
            }
            Err(e)
        }
    }
}
