//! `srdma rping`: rdma-core's `rping` (librdmacm/examples/rping.c) over srdma's connection
//! manager.
//!
//! Each ping is rping's exchange on one RC connection:
//!
//! ```text
//!   client                                   server
//!   SEND {start buffer addr, rkey, len} ──▶  RDMA READ the start buffer
//!                                       ◀──  SEND "go ahead"
//!   SEND {sink buffer addr, rkey, len}  ──▶  RDMA WRITE what it read into the sink
//!                                       ◀──  SEND "go ahead" (the write is done)
//!   check the sink (-V), print it (-v)
//! ```
//!
//! The descriptors are rping's `struct rping_rdma_info`: address (8 bytes), rkey (4), length
//! (4), big-endian; the "go ahead" messages are 16 bytes too. The ping data is rping's:
//! `"rdma-ping-<n>: "` followed by a rotating run of the characters `A`..`z`, NUL-terminated,
//! `-S` bytes in all. After `-C` pings (forever without it) the client disconnects.
//!
//! The server listens on `-a ADDR` (TCP port `-p`), serves one client until that client
//! disconnects and exits 0, as `rping -s` does without `-P`; it answers pings of any size up
//! to 65535 bytes whatever its own `-S`, and like rping ignores `-C`. It creates its QP itself
//! and posts its receive before accepting (what rping does with `-q`; `-q` is accepted for
//! compatibility and changes nothing).
//!
//! srdma specifics: by default the connection is made as kernel `rdma_cm` makes it, with IB
//! CM MADs on QP1 (`srdma::ibcm`; `-p` is the rdma_cm port, 7174 by default as rping's), so
//! the peer may be rdma-core's `rping` (on kernel rxe, or on srdma's librdmacm), in either
//! role; the device is on UDP 4791 (shared with this host's other srdma processes: the port
//! keeper forwards QP1's MADs). With `--tcp-cm` the CM speaks srdma's TCP exchange instead
//! (TCP port `-p`), and the peer must be srdma rping with `--tcp-cm` too. The server's srdma device binds
//! `-a`'s address, so it must be a specific address; the client's binds `--bind` (`-I`), by
//! default the source address the kernel uses towards the server. Both use a free UDP port
//! unless `--udp-port` says otherwise (the CM tells the peer which), and the interface's MTU
//! as rxe would (lo: 4096, 1500-byte Ethernet: 1024).
//!
//! Exit status: 0 when every ping completed, and for the server once its client disconnects
//! (at whatever point, as rping's); 1 when the server cannot be reached, a completion fails,
//! the data does not verify or the server leaves before the last ping; 2 for bad arguments.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use anyhow::{Context, bail};
use srdma::cm::{self, CmError, CmEvent, ConnectOptions, Connection, Listener};
use srdma::ibcm::{self, Gsi, IbConnection, IbListener};
use srdma::{
    AccessFlags, CompChannel, Cq, Device, DeviceConfig, Mr, Pd, Qp, QpCaps, QpInit, QpState,
    QpType, RKey, RecvWr, SendOp, SendWr, SgeList, Wc, WcOpcode, WcStatus,
};

/// rping's default port.
const DEFAULT_PORT: u16 = 7174;
/// `RPING_BUFSIZE`: the largest ping is one byte less.
const RPING_BUFSIZE: u32 = 64 * 1024;
/// `RPING_MIN_BUFSIZE`: `sizeof("2147483647") + sizeof("rdma-ping-%d: ")`.
const RPING_MIN_BUFSIZE: u32 = 11 + 15;
/// `RPING_SQ_DEPTH`.
const SQ_DEPTH: u32 = 16;
/// `sizeof(struct rping_rdma_info)`.
const INFO_LEN: usize = 16;
/// wr_id of receives.
const RECV_WRID: u64 = 1;
/// wr_id of SENDs.
const SEND_WRID: u64 = 2;
/// wr_id of RDMA READs and WRITEs.
const RDMA_WRID: u64 = 3;
/// How long one wait on the completion channel lasts before the connection state is looked
/// at again.
const WAIT_SLICE: Duration = Duration::from_millis(200);

/// Options of `srdma rping`: rping's, plus where the srdma devices live.
///
/// By default it speaks IB CM MADs on QP1, as rdma_cm does, so the peer may be rdma-core's
/// rping; with `--tcp-cm` srdma's connection manager runs over TCP and the peer must be
/// srdma rping with `--tcp-cm`.
#[derive(Debug, clap::Args)]
#[command(
    group(clap::ArgGroup::new("role").required(true).args(["server", "client"])),
    after_help = "rping's connection is made with IB CM MADs on QP1, as rdma_cm makes it, so \
                  the peer may be rdma-core's rping (on kernel rxe or through srdma exec); \
                  the device is on UDP 4791. With --tcp-cm the peer must be srdma rping \
                  --tcp-cm: srdma's connection manager runs over TCP.\n\
                  The server serves one client and exits 0 when that client disconnects."
)]
pub struct Args {
    /// Server side: listen on -a ADDR, serve one client, exit when it disconnects.
    #[arg(short = 's')]
    pub server: bool,
    /// Client side: ping the server at -a ADDR.
    #[arg(short = 'c')]
    pub client: bool,
    /// Server: the address to listen on (a specific one: the srdma device binds it).
    /// Client: the server's address.
    #[arg(short = 'a', value_name = "ADDR", required = true)]
    pub addr: String,
    /// The rdma_cm port (with --tcp-cm: the TCP port of srdma's connection manager).
    #[arg(short = 'p', value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Ping data size in bytes (26 to 65535).
    #[arg(short = 'S', value_name = "SIZE", default_value_t = 64, value_parser = parse_size)]
    pub size: u32,
    /// Number of pings (0: until interrupted). The server ignores it, as rping's does.
    #[arg(short = 'C', value_name = "COUNT", default_value_t = 0)]
    pub count: u64,
    /// Print the ping data.
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Verify that the data written back equals the data sent (client).
    #[arg(short = 'V')]
    pub validate: bool,
    /// Print debug lines.
    #[arg(short = 'd')]
    pub debug: bool,
    /// Use a self-created, self-modified QP (accepted: the server always does; the client's
    /// QP is the CM's).
    #[arg(short = 'q')]
    pub self_create_qp: bool,
    /// Client: the local address of the srdma device [default: the source address towards
    /// the server].
    #[arg(short = 'I', long = "bind", value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// UDP port of the local srdma device (0: 4791, shared with this host's srdma processes;
    /// with --tcp-cm any free port, which the CM tells the peer).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub udp_port: u16,
    /// Connect through srdma's TCP exchange instead of IB CM MADs on QP1 (kernel rdma_cm's
    /// wire protocol): -p is then a TCP port, the peer srdma rping --tcp-cm.
    #[arg(long, conflicts_with = "ib_cm")]
    pub tcp_cm: bool,
    /// IB CM MADs on QP1: the default (accepted for scripts written when it was not).
    #[arg(long, hide = true)]
    pub ib_cm: bool,
}

impl Args {
    /// Whether the connection is made with IB CM (the default) rather than over TCP.
    fn uses_ib_cm(&self) -> bool {
        self.ib_cm || !self.tcp_cm
    }
}

/// The connection, made by srdma's TCP CM or by IB CM.
enum Conn {
    Tcp(Connection),
    Ib(IbConnection),
}

impl Conn {
    fn qp(&self) -> Qp {
        match self {
            Conn::Tcp(c) => c.qp().clone(),
            Conn::Ib(c) => c.qp(),
        }
    }

    fn disconnect(&self) -> Result<(), CmError> {
        match self {
            Conn::Tcp(c) => c.disconnect(),
            Conn::Ib(c) => c.disconnect(),
        }
    }

    fn poll_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        match self {
            Conn::Tcp(c) => c.poll_event(timeout),
            Conn::Ib(c) => c.poll_event(timeout),
        }
    }
}

/// A ping size rping accepts.
fn parse_size(s: &str) -> Result<u32, String> {
    let max = RPING_BUFSIZE - 1;
    match s.parse::<u32>() {
        Ok(n) if (RPING_MIN_BUFSIZE..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid size (valid range is {RPING_MIN_BUFSIZE} to {max})"
        )),
    }
}

/// Exits 2 with `msg`, as clap does for a bad argument.
fn bad_argument(msg: String) -> ! {
    clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{msg}\n")).exit()
}

/// Runs `srdma rping`.
pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    let target = match (args.addr.as_str(), args.port).to_socket_addrs() {
        Ok(mut addrs) => match addrs.next() {
            Some(a) => a,
            None => bad_argument(format!("-a {}: no address found", args.addr)),
        },
        Err(e) => bad_argument(format!(
            "-a {}: invalid hostname or IP address ({e})",
            args.addr
        )),
    };
    if args.server {
        if target.ip().is_unspecified() {
            bad_argument(format!(
                "the server's -a must be a specific address, not {}: its srdma device binds it \
                 (the address is covered by every packet's ICRC)",
                target.ip()
            ));
        }
        run_server(args, target, out)
    } else {
        run_client(args, target, out)
    }
}

/// Prints `-d` lines.
struct Log {
    debug: bool,
}

impl Log {
    fn debug(&self, out: &mut impl Write, line: std::fmt::Arguments<'_>) -> std::io::Result<()> {
        if self.debug {
            writeln!(out, "{line}")?;
            out.flush()?;
        }
        Ok(())
    }
}

/// Opens the srdma device on `ip`, named and sized after its interface.
fn open_device(ip: IpAddr, udp_port: u16) -> anyhow::Result<Device> {
    let cfg = match srdma::netdev::local_device(ip) {
        Some(d) => d.config(udp_port),
        None => {
            // An address of lo's 127.0.0.0/8 that is not listed (only 127.0.0.1 is): lo's
            // device; otherwise a plain one.
            let lo = ip
                .is_loopback()
                .then(|| {
                    srdma::netdev::local_devices()
                        .ok()?
                        .into_iter()
                        .find(|d| d.addr.is_loopback() && d.addr.is_ipv4() == ip.is_ipv4())
                })
                .flatten();
            match lo {
                Some(mut d) => {
                    d.addr = ip;
                    let mut cfg = d.config(udp_port);
                    cfg.mtu = d.active_mtu().min(cfg.limits.port_max_mtu);
                    cfg
                }
                None => {
                    let mut cfg = DeviceConfig::new(ip);
                    cfg.port = udp_port;
                    cfg
                }
            }
        }
    };
    let mut cfg = cfg;
    // As every srdma program: capture to $SRDMA_PCAP when set.
    cfg.pcap = std::env::var_os("SRDMA_PCAP")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from);
    let name = cfg.name.clone();
    Device::open(cfg).with_context(|| format!("opening srdma device {name} on {ip}"))
}

/// The verbs objects of one side (`struct rping_cb`).
struct Side {
    pd: Pd,
    cq: Cq,
    channel: CompChannel,
    /// Receives descriptors / "go ahead" messages.
    recv_mr: Mr,
    /// What this side SENDs.
    send_mr: Mr,
    /// Server: where RDMA READ lands and RDMA WRITE comes from. Client: the sink.
    rdma_mr: Mr,
}

impl Side {
    fn new(dev: &Device, rdma_len: usize, log: &Log, out: &mut impl Write) -> anyhow::Result<Side> {
        let pd = dev.alloc_pd();
        log.debug(out, format_args!("created pd"))?;
        let channel = CompChannel::new().context("creating the completion channel")?;
        log.debug(out, format_args!("created channel"))?;
        let cq = dev
            .create_cq(2 * SQ_DEPTH as usize, Some(&channel))
            .context("creating the CQ")?;
        cq.req_notify(false);
        log.debug(out, format_args!("created cq"))?;
        let remote =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let side = Side {
            recv_mr: pd.reg_mr(INFO_LEN, AccessFlags::LOCAL_WRITE)?,
            send_mr: pd.reg_mr(INFO_LEN, AccessFlags::empty())?,
            rdma_mr: pd.reg_mr(rdma_len, remote)?,
            pd,
            cq,
            channel,
        };
        log.debug(out, format_args!("allocated & registered buffers..."))?;
        Ok(side)
    }

    fn qp_init(&self) -> QpInit {
        let mut init = QpInit::new(QpType::Rc, &self.cq, &self.cq);
        init.caps = QpCaps {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        init
    }

    fn post_recv(&self, qp: &Qp) -> anyhow::Result<()> {
        qp.post_recv(RecvWr {
            wr_id: RECV_WRID,
            sges: SgeList::one(self.recv_mr.sge(0, INFO_LEN)),
        })
        .context("ibv_post_recv")
    }

    /// SENDs `info` (16 bytes).
    fn send(&self, qp: &Qp, info: &[u8; INFO_LEN]) -> anyhow::Result<()> {
        self.send_mr.write(0, info)?;
        qp.post_send(SendWr::new(
            SEND_WRID,
            SendOp::Send,
            SgeList::one(self.send_mr.sge(0, INFO_LEN)),
        ))
        .context("post send")
    }

    /// Waits for the next completion that is not a SEND's (those are checked and passed
    /// over): a receive, an RDMA READ or an RDMA WRITE. `Ok(None)` once the connection is
    /// gone (the QP flushed its work, or is in ERR with nothing left to complete).
    fn wait(&self, conn: &Conn, log: &Log, out: &mut impl Write) -> anyhow::Result<Option<Wc>> {
        loop {
            let wc = match self.cq.poll_one() {
                Some(wc) => wc,
                None => {
                    if conn.qp().state() == QpState::Err {
                        match self.cq.poll_one() {
                            Some(wc) => wc,
                            None => return Ok(None),
                        }
                    } else {
                        // Arm, then look again: a completion between the poll and the arm
                        // is not missed.
                        self.cq.req_notify(false);
                        match self.cq.poll_one() {
                            Some(wc) => wc,
                            None => {
                                self.channel
                                    .get_event(Some(WAIT_SLICE))
                                    .context("waiting for completions")?;
                                continue;
                            }
                        }
                    }
                }
            };
            if wc.status == WcStatus::WrFlushErr {
                return Ok(None);
            }
            if !wc.status.is_success() {
                bail!(
                    "cq completion failed status {} ({}) for the {}",
                    wc.status.as_u32(),
                    wc.status.name(),
                    match wc.wr_id {
                        RECV_WRID => "receive",
                        SEND_WRID => "SEND",
                        _ => "RDMA READ/WRITE",
                    }
                );
            }
            match wc.opcode {
                WcOpcode::Send => log.debug(out, format_args!("send completion"))?,
                WcOpcode::RdmaRead => {
                    log.debug(out, format_args!("rdma read completion"))?;
                    return Ok(Some(wc));
                }
                WcOpcode::RdmaWrite => {
                    log.debug(out, format_args!("rdma write completion"))?;
                    return Ok(Some(wc));
                }
                WcOpcode::Recv => {
                    log.debug(out, format_args!("recv completion"))?;
                    if wc.byte_len as usize != INFO_LEN {
                        bail!("Received bogus data, size {}", wc.byte_len);
                    }
                    return Ok(Some(wc));
                }
                other => bail!("unexpected completion {other:?}"),
            }
        }
    }
}

/// `rping_format_send`: the 16-byte descriptor of `mr`'s first `len` bytes.
fn descriptor(mr: &Mr, len: u32) -> anyhow::Result<[u8; INFO_LEN]> {
    let rkey = mr.rkey().context("a region without remote access")?;
    let mut info = [0u8; INFO_LEN];
    info[..8].copy_from_slice(&mr.addr().to_be_bytes());
    info[8..12].copy_from_slice(&rkey.0.to_be_bytes());
    info[12..].copy_from_slice(&len.to_be_bytes());
    Ok(info)
}

/// The peer's descriptor: (address, rkey, length).
fn parse_descriptor(b: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&b[..8]);
    let mut rkey = [0u8; 4];
    rkey.copy_from_slice(&b[8..12]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&b[12..]);
    (
        u64::from_be_bytes(addr),
        u32::from_be_bytes(rkey),
        u32::from_be_bytes(len),
    )
}

/// rping's ping data: `"rdma-ping-<ping>: "` then characters from `start` on, `A`..`z`
/// rotating, the last byte NUL (`snprintf` truncation included).
pub(crate) fn ping_data(buf: &mut [u8], ping: u64, start: u8) {
    let Some(last) = buf.len().checked_sub(1) else {
        return;
    };
    let text = format!("rdma-ping-{ping}: ");
    let n = text.len().min(last);
    buf[..n].copy_from_slice(&text.as_bytes()[..n]);
    let mut c = start;
    for b in buf.iter_mut().skip(text.len()) {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    buf[last] = 0;
}

/// The bytes up to the first NUL, as `printf("%s")` shows them.
fn c_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The connection options rping uses (`rping_init_conn_param`).
fn conn_options() -> ConnectOptions {
    ConnectOptions {
        responder_resources: 1,
        initiator_depth: 1,
        retry_cnt: 7,
        rnr_retry: 7,
        ..ConnectOptions::default()
    }
}

/// Reports the connection's CM events until it ends, as rping's CM thread does.
fn cm_thread(conn: &Conn, role: &str, debug: bool) {
    loop {
        match conn.poll_event(None) {
            Some(CmEvent::Established) => {
                if debug {
                    println!("cma_event type RDMA_CM_EVENT_ESTABLISHED");
                }
            }
            Some(CmEvent::Disconnected) => {
                if debug {
                    println!("cma_event type RDMA_CM_EVENT_DISCONNECTED");
                }
                eprintln!("{role} DISCONNECT EVENT...");
                return;
            }
            Some(CmEvent::ConnectError(e)) => {
                eprintln!("cma event RDMA_CM_EVENT_CONNECT_ERROR, error: {e}");
                return;
            }
            Some(other) => {
                eprintln!("unhandled event: {other:?}, ignoring");
            }
            None => return,
        }
    }
}

/// The client side (`rping_run_client`).
fn run_client(args: &Args, server: SocketAddr, out: &mut impl Write) -> anyhow::Result<bool> {
    let log = Log { debug: args.debug };
    let local = match args.bind {
        Some(ip) => ip,
        None => route_source(server).with_context(|| {
            format!("finding the local address towards {server} (give one with --bind)")
        })?,
    };
    let dev = open_device(local, udp_port(args))?;
    log.debug(
        out,
        format_args!("srdma device {} on {}", dev.config().name, dev.local_addr()),
    )?;
    let side = Side::new(&dev, args.size as usize, &log, out)?;
    let start_mr = side.pd.reg_mr(
        args.size as usize,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?;
    let made = if args.uses_ib_cm() {
        Gsi::open(&dev)
            .map_err(CmError::from)
            .and_then(|gsi| ibcm::connect(&gsi, &side.pd, server, &side.qp_init(), &conn_options()))
            .map(Conn::Ib)
    } else {
        cm::connect(&dev, &side.pd, server, &side.qp_init(), &conn_options()).map(Conn::Tcp)
    };
    let conn = match made {
        Ok(c) => c,
        Err(e) => {
            let event = match &e {
                CmError::Rejected { .. } => "RDMA_CM_EVENT_REJECTED",
                CmError::Unreachable(_) | CmError::Timeout => "RDMA_CM_EVENT_UNREACHABLE",
                _ => "RDMA_CM_EVENT_CONNECT_ERROR",
            };
            eprintln!(
                "cma event {event}: cannot connect to an {} rping server at {server}: {e}",
                if args.uses_ib_cm() {
                    "rdma_cm"
                } else {
                    "srdma"
                }
            );
            eprintln!("connect error -1");
            return Ok(false);
        }
    };
    log.debug(
        out,
        format_args!("created qp {:#x}", conn.qp().qpn().value()),
    )?;
    side.post_recv(&conn.qp())?;
    log.debug(out, format_args!("rdma_connect successful"))?;
    std::thread::scope(|s| {
        let cm = s.spawn(|| cm_thread(&conn, "client", args.debug));
        let r = client_loop(args, &side, &start_mr, &conn, &log, out);
        let _ = conn.disconnect();
        let _ = cm.join();
        match r {
            Ok(()) => Ok(true),
            Err(e) => {
                eprintln!("rping client failed: {e:#}");
                Ok(false)
            }
        }
    })
}

/// `rping_test_client`.
fn client_loop(
    args: &Args,
    side: &Side,
    start_mr: &Mr,
    conn: &Conn,
    log: &Log,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let size = args.size as usize;
    let qp = &conn.qp();
    let mut start = b'A';
    let mut ping: u64 = 0;
    let mut data = vec![0u8; size];
    let mut sink = vec![0u8; size];
    let gone = |ping: u64| anyhow::anyhow!("the server disconnected after {ping} pings");
    while args.count == 0 || ping < args.count {
        ping_data(&mut data, ping, start);
        start = if start >= b'z' { b'A' } else { start + 1 };
        start_mr.write(0, &data)?;
        // rping reuses the sink as is; clearing it makes -V catch a write that never came.
        side.rdma_mr.write(0, &vec![0u8; size])?;

        let info = descriptor(start_mr, args.size)?;
        log.debug(
            out,
            format_args!(
                "RDMA addr {:x} rkey {:x} len {}",
                start_mr.addr(),
                start_mr.rkey().map_or(0, |k| k.0),
                args.size
            ),
        )?;
        side.send(qp, &info)?;
        // The server READs the start buffer, then says "go ahead".
        if side.wait(conn, log, out)?.is_none() {
            return Err(gone(ping));
        }
        side.post_recv(qp)?;

        let info = descriptor(&side.rdma_mr, args.size)?;
        log.debug(
            out,
            format_args!(
                "RDMA addr {:x} rkey {:x} len {}",
                side.rdma_mr.addr(),
                side.rdma_mr.rkey().map_or(0, |k| k.0),
                args.size
            ),
        )?;
        side.send(qp, &info)?;
        // The server WRITEs into the sink, then says so.
        if side.wait(conn, log, out)?.is_none() {
            return Err(gone(ping));
        }
        side.post_recv(qp)?;

        side.rdma_mr.read(0, &mut sink)?;
        if args.validate && sink != data {
            let at = sink
                .iter()
                .zip(&data)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            bail!(
                "data mismatch! ping {ping}: byte {at} is {:#04x}, sent {:#04x}",
                sink[at],
                data[at]
            );
        }
        if args.verbose {
            writeln!(out, "ping data: {}", c_string(&sink))?;
            out.flush()?;
        }
        ping += 1;
    }
    Ok(())
}

/// The server side (`rping_run_server`).
fn run_server(args: &Args, listen: SocketAddr, out: &mut impl Write) -> anyhow::Result<bool> {
    let log = Log { debug: args.debug };
    let dev = open_device(listen.ip(), udp_port(args))?;
    log.debug(
        out,
        format_args!("srdma device {} on {}", dev.config().name, dev.local_addr()),
    )?;
    // The largest ping fits, whatever this side's -S.
    let side = Side::new(&dev, RPING_BUFSIZE as usize, &log, out)?;
    let conn = if args.uses_ib_cm() {
        match serve_ib(&dev, &side, listen, &log, out)? {
            Some(c) => Conn::Ib(c),
            None => return Ok(false),
        }
    } else {
        match serve_tcp(&dev, &side, listen, &log, out)? {
            Some(c) => Conn::Tcp(c),
            None => return Ok(false),
        }
    };
    std::thread::scope(|s| {
        let cm = s.spawn(|| cm_thread(&conn, "server", args.debug));
        let r = server_loop(&side, &conn, &log, args.verbose, out);
        let _ = conn.disconnect();
        let _ = cm.join();
        match r {
            Ok(n) => {
                log.debug(out, format_args!("served {n} pings"))?;
                Ok(true)
            }
            Err(e) => {
                eprintln!("rping server failed: {e:#}");
                Ok(false)
            }
        }
    })
}

/// The UDP port of the device: with IB CM, rxe's 4791 unless given.
fn udp_port(args: &Args) -> u16 {
    if args.uses_ib_cm() && args.udp_port == 0 {
        srdma::ROCEV2_PORT
    } else {
        args.udp_port
    }
}

/// Waits for one client through srdma's TCP CM and accepts it (None: said why on stderr).
fn serve_tcp(
    dev: &Device,
    side: &Side,
    listen: SocketAddr,
    log: &Log,
    out: &mut impl Write,
) -> anyhow::Result<Option<Connection>> {
    let listener = Listener::bind(dev, &side.pd, listen)
        .with_context(|| format!("listening on TCP {listen}"))?;
    log.debug(out, format_args!("rdma_bind_addr successful"))?;
    log.debug(out, format_args!("rdma_listen"))?;
    let req = listener
        .accept_request(None)
        .context("waiting for a client")?;
    log.debug(
        out,
        format_args!(
            "cma_event type RDMA_CM_EVENT_CONNECT_REQUEST from {}",
            req.peer_addr()
        ),
    )?;
    let qp = side
        .pd
        .create_qp(&side.qp_init())
        .context("creating the QP")?;
    log.debug(out, format_args!("created qp {:#x}", qp.qpn().value()))?;
    side.post_recv(&qp)?;
    log.debug(out, format_args!("accepting client connection request"))?;
    match req.accept_with(&qp, &conn_options()) {
        Ok(c) => Ok(Some(c)),
        Err(e) => {
            eprintln!("connect error: accepting the client failed: {e}");
            Ok(None)
        }
    }
}

/// Waits for one client's REQ on QP1 (IB CM, rdma_cm's port `listen.port()`) and accepts
/// it (None: said why on stderr).
fn serve_ib(
    dev: &Device,
    side: &Side,
    listen: SocketAddr,
    log: &Log,
    out: &mut impl Write,
) -> anyhow::Result<Option<IbConnection>> {
    let gsi = Gsi::open(dev).context("creating the GSI QP (QP1)")?;
    let listener = IbListener::bind(&gsi, listen.port()).context("listening on QP1")?;
    log.debug(out, format_args!("rdma_bind_addr successful"))?;
    log.debug(out, format_args!("rdma_listen"))?;
    let req = loop {
        match listener.accept_request(Duration::from_secs(3600)) {
            Ok(r) => break r,
            Err(CmError::Timeout) => continue,
            Err(e) => return Err(e).context("waiting for a client"),
        }
    };
    log.debug(
        out,
        format_args!("cma_event type RDMA_CM_EVENT_CONNECT_REQUEST"),
    )?;
    let qp = side
        .pd
        .create_qp(&side.qp_init())
        .context("creating the QP")?;
    log.debug(out, format_args!("created qp {:#x}", qp.qpn().value()))?;
    side.post_recv(&qp)?;
    log.debug(out, format_args!("accepting client connection request"))?;
    match req.accept_with(&qp, &conn_options()) {
        Ok(c) => Ok(Some(c)),
        Err(e) => {
            eprintln!("connect error: accepting the client failed: {e}");
            Ok(None)
        }
    }
}

/// `rping_test_server`: serves pings until the client disconnects; returns how many.
fn server_loop(
    side: &Side,
    conn: &Conn,
    log: &Log,
    verbose: bool,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let qp = &conn.qp();
    let mut served = 0;
    let mut info = [0u8; INFO_LEN];
    let mut buf = vec![0u8; RPING_BUFSIZE as usize];
    loop {
        // The client's start buffer (or its disconnect, the normal end).
        if side.wait(conn, log, out)?.is_none() {
            return Ok(served);
        }
        side.recv_mr.read(0, &mut info)?;
        side.post_recv(qp)?;
        let (addr, rkey, len) = parse_descriptor(&info);
        log.debug(
            out,
            format_args!("Received rkey {rkey:x} addr {addr:x} len {len} from peer"),
        )?;
        if len == 0 || len >= RPING_BUFSIZE {
            bail!(
                "the client announced a {len}-byte buffer (at most {} fit)",
                RPING_BUFSIZE - 1
            );
        }
        let read = SendWr::new(
            RDMA_WRID,
            SendOp::Read {
                remote_addr: addr,
                rkey: RKey(rkey),
            },
            SgeList::one(side.rdma_mr.sge(0, len as usize)),
        );
        qp.post_send(read).context("post send (RDMA READ)")?;
        log.debug(out, format_args!("server posted rdma read req"))?;
        match side.wait(conn, log, out)? {
            Some(wc) if wc.opcode == WcOpcode::RdmaRead => {}
            Some(wc) => bail!("expected the RDMA READ completion, got {:?}", wc.opcode),
            None => return Ok(served),
        }
        log.debug(out, format_args!("server received read complete"))?;
        side.rdma_mr.read(0, &mut buf[..len as usize])?;
        // What the buffer holds as a C string: the pong is that and its NUL.
        let text_len = buf[..len as usize]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(len as usize - 1);
        if verbose {
            writeln!(out, "server ping data: {}", c_string(&buf[..len as usize]))?;
            out.flush()?;
        }
        side.send(qp, &[0u8; INFO_LEN])?;
        log.debug(out, format_args!("server posted go ahead"))?;

        // The client's sink.
        match side.wait(conn, log, out)? {
            Some(wc) if wc.opcode == WcOpcode::Recv => {}
            Some(wc) => bail!("expected the sink descriptor, got {:?}", wc.opcode),
            None => return Ok(served),
        }
        side.recv_mr.read(0, &mut info)?;
        side.post_recv(qp)?;
        let (addr, rkey, sink_len) = parse_descriptor(&info);
        log.debug(out, format_args!("server received sink adv"))?;
        let wlen = (text_len as u32 + 1).min(sink_len);
        log.debug(
            out,
            format_args!(
                "rdma write from lkey {:x} laddr {:x} len {wlen}",
                side.rdma_mr.lkey().0,
                side.rdma_mr.addr()
            ),
        )?;
        let write = SendWr::new(
            RDMA_WRID,
            SendOp::Write {
                remote_addr: addr,
                rkey: RKey(rkey),
            },
            SgeList::one(side.rdma_mr.sge(0, wlen as usize)),
        );
        qp.post_send(write).context("post send (RDMA WRITE)")?;
        match side.wait(conn, log, out)? {
            Some(wc) if wc.opcode == WcOpcode::RdmaWrite => {}
            Some(wc) => bail!("expected the RDMA WRITE completion, got {:?}", wc.opcode),
            None => return Ok(served),
        }
        log.debug(out, format_args!("server rdma write complete"))?;
        side.send(qp, &[0u8; INFO_LEN])?;
        log.debug(out, format_args!("server posted go ahead"))?;
        served += 1;
    }
}

/// The source address the kernel would use towards `dst` (a UDP `connect`; nothing is sent).
fn route_source(dst: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any)?;
    s.connect(dst)?;
    Ok(s.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_data_is_rpings() {
        let mut b = vec![0u8; 64];
        ping_data(&mut b, 0, b'A');
        assert_eq!(
            c_string(&b),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        assert_eq!(b[63], 0);
        ping_data(&mut b, 2, b'C');
        assert_eq!(
            c_string(&b),
            "rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst"
        );
        // Wraps from z to A.
        ping_data(&mut b, 7, b'y');
        assert!(c_string(&b).starts_with("rdma-ping-7: yzABC"));
        // Truncated like snprintf when the prefix does not fit.
        let mut s = vec![0u8; 26];
        ping_data(&mut s, u64::MAX, b'A');
        assert_eq!(c_string(&s), "rdma-ping-184467440737095");
    }

    #[test]
    fn descriptors_round_trip() {
        let b: [u8; 16] = [0, 0, 0x7f, 1, 2, 3, 4, 5, 0, 0, 0x12, 0x34, 0, 0, 0, 64];
        assert_eq!(parse_descriptor(&b), (0x7f01_0203_0405, 0x1234, 64));
    }

    #[test]
    fn sizes_are_rpings() {
        assert!(parse_size("25").is_err());
        assert_eq!(parse_size("26"), Ok(26));
        assert_eq!(parse_size("65535"), Ok(65535));
        assert!(parse_size("65536").is_err());
        assert!(parse_size("x").is_err());
    }
}
