//! `srdma pingpong`: rdma-core's `ibv_rc_pingpong` (and, with `--ud`, `ibv_ud_pingpong`) on
//! an srdma device, so either end can be the rdma-core tool on rxe or a RoCE NIC.
//!
//! The protocol is the examples': the client connects to TCP port `-p` (18515) and sends
//! `"%04x:%06x:%06x:%s"` = LID:QPN:PSN:GID (the 16 GID bytes as 32 hex digits) plus a NUL,
//! 52 bytes; the server moves its QP to RTR/RTS, answers with its own 52 bytes, and the
//! client ends the exchange with `"done\0"`. Then the client sends `-n` messages of `-s`
//! bytes, each answered by one from the server, keeping `-r` receives posted. The printed
//! lines are the tools' own.
//!
//! srdma-specific choices, all in [`Args`]:
//!
//! * The device binds `--bind ADDR`. A client without it binds the source address the kernel
//!   would use to reach the server (a UDP `connect`, no packet sent). A server without it
//!   opens its device once a client has connected, on the address that client reached
//!   (the local address of the TCP connection); its "local address" line then comes after
//!   the connection instead of before.
//! * `-g` defaults to the GID of the bound address (index 1 for IPv4, as rxe users pass
//!   `-g 1`; index 0 for IPv6). rdma-core's default, no GID, cannot work on RoCE. Index 0 of an
//!   IPv4 device is the link-local GID made from the node GUID, which srdma peers reach
//!   through the address it holds (see [`srdma::Gid::ip`]) when the device is on UDP 4791;
//!   on another port it is refused with an explanation.
//! * `--udp-port` is the device's UDP port and `--peer-udp-port` the peer's, both 4791 by
//!   default (the exchange does not carry ports); other ports let two srdma processes share
//!   one address (IPv6 loopback) or keep off a 4791 that rxe holds.
//! * `-c` checks every received message, on both sides, against the data the rdma-core client
//!   sends with `-c` (0x7b bytes, 0 at each 4096-byte page start), and its length; a mismatch
//!   prints rdma-core's "invalid data in page N" lines and fails (rdma-core checks the
//!   server's buffer once at the end and exits 0 regardless).
//! * With `--ud` the port's active MTU is `-m` (default 1024, rxe's on 1500-byte Ethernet) and
//!   `-s` defaults to 1024, since ibv_ud_pingpong's 2048 does not fit it.
//! * `-d` names the device (srdma opens one per process); `-i` must be 1; `-l` is accepted and
//!   ignored (RoCEv2 over UDP carries no service level).

use std::io::{Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket,
};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use srdma::{
    AccessFlags, CompChannel, ConnectParams, Cq, Device, DeviceConfig, Gid, Mr, Mtu, QpInit,
    QpType, RecvWr, RemoteQp, SendOp, SendWr, SgeList, UdDest, Wc, WcStatus,
};
use srdma_wire::{Psn, Qpn};

/// wr_id of receives, as in the rdma-core examples.
const RECV_WRID: u64 = 1;
/// wr_id of sends.
const SEND_WRID: u64 = 2;
/// ibv_ud_pingpong's Q_Key.
const UD_QKEY: u32 = 0x1111_1111;
/// The GRH area at the start of every UD receive buffer.
const GRH_LEN: usize = 40;
/// The page size of the `-c` pattern (rdma-core uses the host's; 4096 on x86-64).
const CHECK_PAGE: usize = 4096;
/// The fill byte of rdma-core's buffers.
const FILL: u8 = 0x7b;
/// Length of the address message: `"0000:000000:000000:" + 32 hex digits + NUL`.
const MSG_LEN: usize = 52;
/// How long a client tries to open the TCP connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Options of `srdma pingpong`: ibv_rc_pingpong's, plus where the srdma device lives.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Server to connect to (name or address); without it, wait for a client.
    pub servername: Option<String>,
    /// Listen on / connect to TCP port PORT.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Device name (accepted: srdma opens one device per process).
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    pub ib_dev: Option<String>,
    /// Port of the device (srdma devices have one port: 1).
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = parse_ib_port)]
    pub ib_port: u8,
    /// Size of the messages to exchange [default: 4096; 1024 with --ud].
    #[arg(short = 's', long = "size", value_parser = parse_num)]
    pub size: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (with --ud, the port's active MTU).
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    pub mtu: Mtu,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value = "500", value_parser = parse_positive)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value = "1000", value_parser = parse_positive)]
    pub iters: u32,
    /// Service level (accepted and ignored: RoCEv2 over UDP has none).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Sleep on CQ events (a completion channel) instead of polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local GID index [default: the bound address's GID: 1 for IPv4, 0 for IPv6].
    #[arg(short = 'g', long = "gid-idx", value_name = "INDEX")]
    pub gid_idx: Option<usize>,
    /// Validate the received data (both sides need it).
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// Local IP address of the srdma device [default: client: the source address towards the
    /// server; server: the address the client connected to].
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<IpAddr>,
    /// UDP port of the srdma device (RoCEv2 peers such as rxe need 4791).
    #[arg(long, value_name = "PORT", default_value_t = srdma::ROCEV2_PORT)]
    pub udp_port: u16,
    /// UDP port of the peer's device (rxe and RoCE NICs: 4791).
    #[arg(long, value_name = "PORT", default_value_t = srdma::ROCEV2_PORT)]
    pub peer_udp_port: u16,
    /// Unreliable datagram: behave as ibv_ud_pingpong.
    #[arg(long)]
    pub ud: bool,
}

/// A number as `strtoul(s, NULL, 0)` reads it: decimal, or hexadecimal after `0x`.
fn parse_num(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("not a number: {e}"))
}

/// A count of at least 1.
fn parse_positive(s: &str) -> Result<u32, String> {
    match parse_num(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// An MTU in bytes, as `pp_mtu_to_enum` takes it.
fn parse_mtu(s: &str) -> Result<Mtu, String> {
    parse_num(s)
        .ok()
        .and_then(Mtu::from_bytes)
        .ok_or_else(|| "the MTU must be 256, 512, 1024, 2048 or 4096".into())
}

/// The device port: srdma devices have only port 1.
fn parse_ib_port(s: &str) -> Result<u8, String> {
    match parse_num(s)? {
        1 => Ok(1),
        _ => Err("srdma devices have a single port, 1".into()),
    }
}

/// What each side announces over TCP (`struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dest {
    /// LID: 0 on RoCE.
    lid: u16,
    /// QP number.
    qpn: u32,
    /// First PSN of the side's sends.
    psn: u32,
    /// GID: the IP address the side's device is reached at.
    gid: Gid,
}

impl Dest {
    /// The 52-byte message: `"%04x:%06x:%06x:%s"` and a NUL.
    fn encode(&self) -> [u8; MSG_LEN] {
        let mut text = format!("{:04x}:{:06x}:{:06x}:", self.lid, self.qpn, self.psn);
        for b in self.gid.0 {
            text.push_str(&format!("{b:02x}"));
        }
        let mut msg = [0u8; MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Reads a peer's message (as the examples' `sscanf("%x:%x:%x:%s")`).
    fn decode(msg: &[u8]) -> anyhow::Result<Dest> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = String::from_utf8_lossy(&msg[..end]);
        let bad = || anyhow!("malformed address message from the peer: {text:?}");
        let mut parts = text.splitn(4, ':');
        let mut field = |max: u32| -> anyhow::Result<u32> {
            let f = parts.next().ok_or_else(bad)?;
            u32::from_str_radix(f, 16)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(bad)
        };
        let lid = field(0xffff)? as u16;
        let qpn = field(0xff_ffff)?;
        let psn = field(0xff_ffff)?;
        let hex = parts.next().ok_or_else(bad)?;
        if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Dest {
            lid,
            qpn,
            psn,
            gid: Gid(gid),
        })
    }
}

/// The source address the kernel would pick to reach `dst` (a UDP `connect`: no packet).
fn route_source(dst: IpAddr, port: u16) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any)?;
    s.connect((dst, port))?;
    Ok(s.local_addr()?.ip())
}

/// Whether a GID is IPv6 link-local (fe80::/10).
fn is_link_local(gid: &Gid) -> bool {
    gid.0[0] == 0xfe && gid.0[1] & 0xc0 == 0x80
}

/// The verbs objects of one side (`struct pingpong_context`).
struct Ctx {
    /// The device (its address checks the peer's GID).
    dev: Device,
    /// The completion channel, with `-e`.
    channel: Option<CompChannel>,
    /// The one CQ, for sends and receives.
    cq: Cq,
    /// The RC or UD QP.
    qp: srdma::Qp,
    /// The one buffer: every receive lands in it and every send leaves from it.
    mr: Mr,
    /// Where the message starts in the buffer: 0, or the GRH area on UD.
    offset: usize,
    /// Message size.
    size: usize,
    /// Receives kept posted.
    rx_depth: u32,
    /// `--ud`.
    ud: bool,
    /// `-c`.
    check: bool,
    /// What this side announces.
    my: Dest,
    /// UDP port of the peer's device.
    peer_udp_port: u16,
    /// UD: where sends go, once the peer is known.
    ud_dest: Option<UdDest>,
    /// The peer's device, once known.
    peer: Option<SocketAddr>,
}

impl Ctx {
    /// Opens the device on `addr` and creates everything (`pp_init_ctx`), posts `rx_depth`
    /// receives, arms the CQ with `-e`, and picks the GID.
    fn open(args: &Args, addr: IpAddr, size: usize) -> anyhow::Result<Ctx> {
        let mut cfg = DeviceConfig::new(addr);
        if let Some(name) = &args.ib_dev {
            cfg.name.clone_from(name);
        }
        cfg.port = args.udp_port;
        cfg.mtu = args.mtu;
        let bind = SocketAddr::new(addr, args.udp_port);
        let dev = Device::open(cfg).map_err(|e| {
            let hint = if let srdma::Error::Io { source, .. } = &e {
                match source.kind() {
                    std::io::ErrorKind::AddrInUse => format!(
                        " (another RoCE device, srdma or rxe, uses UDP {bind}: pick another \
                         --bind address or --udp-port)"
                    ),
                    std::io::ErrorKind::AddrNotAvailable => {
                        format!(" ({addr} is not an address of this host: check --bind)")
                    }
                    _ => String::new(),
                }
            } else {
                String::new()
            };
            anyhow!("Couldn't open the srdma device on {bind}: {e}{hint}")
        })?;
        let ud = args.ud;
        let offset = if ud { GRH_LEN } else { 0 };
        let pd = dev.alloc_pd();
        let mr = pd
            .reg_mr((offset + size).max(1), AccessFlags::LOCAL_WRITE)
            .context("Couldn't register MR")?;
        mr.with_bytes_mut(|b| b.fill(FILL));
        let channel = if args.events {
            Some(CompChannel::new().context("Couldn't create completion channel")?)
        } else {
            None
        };
        let cq = dev
            .create_cq(args.rx_depth as usize + 1, channel.as_ref())
            .context("Couldn't create CQ")?;
        let qp_type = if ud { QpType::Ud } else { QpType::Rc };
        let mut init = QpInit::new(qp_type, &cq, &cq);
        init.caps.max_send_wr = 1;
        init.caps.max_recv_wr = args.rx_depth;
        init.caps.max_send_sge = 1;
        init.caps.max_recv_sge = 1;
        init.caps.max_inline_data = 0;
        init.access = AccessFlags::empty();
        init.qkey = UD_QKEY;
        let qp = pd.create_qp(&init).context("Couldn't create QP")?;

        let gids = dev.gids();
        let own = dev.local_gid();
        let own_idx = gids.iter().position(|g| *g == own).unwrap_or(0);
        let idx = args.gid_idx.unwrap_or(own_idx);
        let list = gids
            .iter()
            .enumerate()
            .map(|(i, g)| format!("[{i}] {g}"))
            .collect::<Vec<_>>()
            .join(", ");
        let Some(&gid) = gids.get(idx) else {
            bail!(
                "can't read sgid of index {idx}: the GID table of an srdma device on {addr} is \
                 {list}; use -g {own_idx}"
            );
        };
        if gid.ip() != own.ip() {
            bail!(
                "GID index {idx} is {gid}, the link-local GID made from the node GUID (as rxe's \
                 index 0 from the MAC); srdma carries RoCEv2 over UDP on {addr} and can neither \
                 send from nor be reached at a link-local GID. Use -g {own_idx} ({own}), the \
                 GID of the bound address (rxe users pass -g 1 for the IPv4-mapped GID)"
            );
        }
        let mut ctx = Ctx {
            dev,
            channel,
            cq,
            qp,
            mr,
            offset,
            size,
            rx_depth: args.rx_depth,
            ud,
            check: args.chk,
            my: Dest {
                lid: 0,
                qpn: 0,
                psn: srdma::random_psn().value(),
                gid,
            },
            peer_udp_port: args.peer_udp_port,
            ud_dest: None,
            peer: None,
        };
        ctx.my.qpn = ctx.qp.qpn().value();
        let posted = ctx.post_recv(ctx.rx_depth);
        if posted < ctx.rx_depth {
            bail!("Couldn't post receive ({posted})");
        }
        if ctx.channel.is_some() {
            ctx.cq.req_notify(false);
        }
        Ok(ctx)
    }

    /// The "  local address: ..." line.
    fn print_local(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let sep = if self.ud { ':' } else { ',' };
        let d = &self.my;
        writeln!(
            out,
            "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
            d.lid, d.qpn, d.psn, d.gid
        )?;
        Ok(())
    }

    /// The IP address a peer's GID stands for, or why srdma cannot reach it.
    fn peer_ip(&self, gid: Gid) -> anyhow::Result<IpAddr> {
        if gid == Gid::default() {
            bail!(
                "the peer announced GID :: (no GID): it was started without -g. srdma reaches \
                 peers by the IP address in their GID; run ibv_rc_pingpong / ibv_ud_pingpong on \
                 rxe with -g 1 (its IPv4-mapped GID)"
            );
        }
        if is_link_local(&gid) && gid.srdma_link_local_ipv4().is_none() {
            bail!(
                "the peer announced the link-local GID {gid}: srdma sends RoCEv2 over UDP/IP and \
                 cannot route to a link-local address; give the peer the GID of its IP address \
                 (-g 1 for the IPv4-mapped GID on rxe)"
            );
        }
        let ip = gid.ip();
        let mine = self.dev.local_addr().ip();
        if ip.is_ipv4() != mine.is_ipv4() {
            bail!(
                "the peer's GID {gid} is the address {ip}, but this device is bound to {mine}: \
                 both ends must use the same IP version (see --bind)"
            );
        }
        Ok(ip)
    }

    /// `pp_connect_ctx`: RC to RTR/RTS towards the peer; UD to RTS and its address handle.
    fn connect(&mut self, rem: &Dest, args: &Args) -> anyhow::Result<()> {
        self.peer = Some(SocketAddr::new(self.peer_ip(rem.gid)?, self.peer_udp_port));
        let psn = Psn::new(self.my.psn);
        if self.ud {
            self.qp
                .activate(psn)
                .context("Failed to modify QP to RTS")?;
            let mut ah = srdma::ah(rem.gid);
            ah.udp_dport = self.peer_udp_port;
            ah.sl = args.sl;
            self.ud_dest = Some(UdDest {
                ah,
                remote_qpn: Qpn::new(rem.qpn),
                remote_qkey: UD_QKEY,
            });
        } else {
            let remote = RemoteQp {
                qpn: Qpn::new(rem.qpn),
                psn: Psn::new(rem.psn),
                gid: rem.gid,
                port: self.peer_udp_port,
            };
            self.qp
                .connect(&remote, &ConnectParams::new(args.mtu, psn))
                .context("Failed to modify QP to RTR/RTS")?;
        }
        Ok(())
    }

    /// Posts up to `n` receives of the whole buffer; returns how many were posted.
    fn post_recv(&self, n: u32) -> u32 {
        let sge = self.mr.sge(0, self.offset + self.size);
        for i in 0..n {
            let wr = RecvWr {
                wr_id: RECV_WRID,
                sges: SgeList::one(sge),
            };
            if self.qp.post_recv(wr).is_err() {
                return i;
            }
        }
        n
    }

    /// Posts one signaled SEND of the message.
    fn post_send(&self) -> anyhow::Result<()> {
        let sge = self.mr.sge(self.offset, self.size);
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, SgeList::one(sge));
        if let Some(dest) = self.ud_dest {
            wr = wr.to_ud(dest);
        }
        self.qp.post_send(wr).context("Couldn't post send")
    }

    /// Writes the `-c` pattern into the message.
    fn fill_pattern(&self) {
        let (off, size) = (self.offset, self.size);
        self.mr.with_bytes_mut(|b| {
            for (i, byte) in b[off..off + size].iter_mut().enumerate() {
                *byte = expected(i);
            }
        });
    }

    /// Checks a received message: its length and every byte. The error lists the bad pages
    /// as rdma-core prints them.
    fn check_recv(&self, wc: &Wc) -> Result<(), String> {
        let want = (self.offset + self.size) as u32;
        if wc.byte_len != want {
            return Err(format!("received {} bytes instead of {want}", wc.byte_len));
        }
        let (off, size) = (self.offset, self.size);
        let bad: Vec<usize> = self.mr.with_bytes(|b| {
            let msg = &b[off..off + size];
            let mut pages: Vec<usize> = Vec::new();
            for (i, &byte) in msg.iter().enumerate() {
                let page = i / CHECK_PAGE;
                if byte != expected(i) && pages.last() != Some(&page) {
                    pages.push(page);
                }
            }
            pages
        });
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad
                .iter()
                .map(|p| format!("invalid data in page {p}"))
                .collect::<Vec<_>>()
                .join("\n"))
        }
    }

    /// Waits for completions: on the channel with `-e` (then re-arms and drains the CQ), else
    /// by polling the CQ.
    fn wait(&self, wcs: &mut Vec<Wc>) -> anyhow::Result<()> {
        if let Some(ch) = &self.channel {
            let id = ch
                .get_event(None)
                .context("Failed to get cq_event")?
                .ok_or_else(|| anyhow!("Failed to get cq_event"))?;
            if id != self.cq.id() {
                bail!("CQ event for unknown CQ {id}");
            }
            self.cq.req_notify(false);
            while self.cq.poll_into(wcs, 16) > 0 {}
            return Ok(());
        }
        let mut spins = 0u32;
        while self.cq.poll_into(wcs, 2) == 0 {
            // The engine's progress thread completes receives; leave it the CPU now and then.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// The `-c` data: rdma-core's client fills its buffer with 0x7b and zeroes the first byte of
/// every page.
fn expected(i: usize) -> u8 {
    if i % CHECK_PAGE == 0 { 0 } else { FILL }
}

/// Runs the ping-pong; `Ok(false)` after a failure already reported on stderr.
pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    let size = args.size.unwrap_or(if args.ud { 1024 } else { 4096 }) as usize;
    if args.ud && size > args.mtu.bytes() as usize {
        bail!(
            "Requested size larger than port MTU ({}): use -s {} or less, or raise the port's \
             MTU with -m",
            args.mtu.bytes(),
            args.mtu.bytes()
        );
    }
    let ctx = match &args.servername {
        Some(server) => client_exchange(args, server, size, out)?,
        None => server_exchange(args, size, out)?,
    };
    pingpong(args, ctx, out)
}

/// The client's side of the exchange (`pp_client_exch_dest`), then `pp_connect_ctx`.
fn client_exchange(
    args: &Args,
    server: &str,
    size: usize,
    out: &mut impl Write,
) -> anyhow::Result<Ctx> {
    let addrs: Vec<SocketAddr> = (server, args.port)
        .to_socket_addrs()
        .with_context(|| format!("Couldn't resolve {server}:{}", args.port))?
        .collect();
    let first = addrs
        .first()
        .ok_or_else(|| anyhow!("Couldn't resolve {server}:{}: no address", args.port))?;
    let bind = match args.bind {
        Some(b) => b,
        None => route_source(first.ip(), args.udp_port).with_context(|| {
            format!(
                "no route to {}: pass --bind with this host's address",
                first.ip()
            )
        })?,
    };
    let mut ctx = Ctx::open(args, bind, size)?;
    ctx.print_local(out)?;

    let mut last_err = None;
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = Some(e),
        }
    }
    let Some(mut stream) = stream else {
        let why = last_err.map_or_else(String::new, |e| format!(": {e}"));
        bail!(
            "Couldn't connect to {server}:{}{why} (is the server running?)",
            args.port
        );
    };
    stream
        .write_all(&ctx.my.encode())
        .context("Couldn't send local address")?;
    let mut msg = [0u8; MSG_LEN];
    stream
        .read_exact(&mut msg)
        .and_then(|()| stream.write_all(b"done\0"))
        .context("Couldn't read/write remote address (the server closed the connection)")?;
    let rem = Dest::decode(&msg)?;
    print_remote(&rem, out)?;
    ctx.connect(&rem, args)?;
    Ok(ctx)
}

/// The server's side (`pp_server_exch_dest`): accept one client, connect, answer.
fn server_exchange(args: &Args, size: usize, out: &mut impl Write) -> anyhow::Result<Ctx> {
    let early = match args.bind {
        Some(b) => Some(Ctx::open(args, b, size)?),
        None => None,
    };
    // Any address, both IP versions (a dual-stack socket), IPv4 only where IPv6 is off.
    let listener = TcpListener::bind((Ipv6Addr::UNSPECIFIED, args.port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.port)))
        .with_context(|| format!("Couldn't listen to port {}", args.port))?;
    if let Some(ctx) = &early {
        ctx.print_local(out)?;
    }
    let (mut conn, _) = listener.accept().context("accept() failed")?;
    drop(listener);
    let mut msg = [0u8; MSG_LEN];
    conn.read_exact(&mut msg)
        .context("Couldn't read remote address")?;
    let rem = Dest::decode(&msg)?;
    let mut ctx = match early {
        Some(ctx) => ctx,
        None => {
            let local = conn
                .local_addr()
                .context("reading the TCP connection's address")?;
            let ctx = Ctx::open(args, local.ip().to_canonical(), size)?;
            ctx.print_local(out)?;
            ctx
        }
    };
    ctx.connect(&rem, args)
        .context("Couldn't connect to remote QP")?;
    let mut done = [0u8; 5];
    conn.write_all(&ctx.my.encode())
        .and_then(|()| conn.read_exact(&mut done))
        .context("Couldn't send/recv local address")?;
    print_remote(&rem, out)?;
    Ok(ctx)
}

/// The "  remote address: ..." line (the same for RC and UD).
fn print_remote(rem: &Dest, out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid, rem.qpn, rem.psn, rem.gid
    )?;
    Ok(())
}

/// The timed loop: the client sends first; each side sends its next message once its last
/// send completed and the peer's message arrived, refilling receives as they run low.
fn pingpong(args: &Args, ctx: Ctx, out: &mut impl Write) -> anyhow::Result<bool> {
    let client = args.servername.is_some();
    let iters = args.iters;
    let mut pending = RECV_WRID;
    if client {
        if ctx.check {
            ctx.fill_pattern();
        }
        ctx.post_send()?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut scnt, mut rcnt, mut routs) = (0u32, 0u32, ctx.rx_depth);
    let mut wcs = Vec::with_capacity(16);
    while rcnt < iters || scnt < iters {
        wcs.clear();
        ctx.wait(&mut wcs)?;
        for wc in &wcs {
            if !wc.status.is_success() {
                eprintln!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status.name(),
                    wc.status.as_u32(),
                    wc.wr_id as i32
                );
                if wc.status == WcStatus::RetryExcErr {
                    if let Some(peer) = ctx.peer {
                        eprintln!(
                            "error: no acknowledgement from the peer's RoCE device at UDP {peer}: \
                             it is unreachable, not running, on another UDP port \
                             (--peer-udp-port), or the path drops packets of this MTU (-m)"
                        );
                    }
                }
                return Ok(false);
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if ctx.check {
                        if let Err(why) = ctx.check_recv(wc) {
                            writeln!(out, "{why}")?;
                            eprintln!(
                                "error: message {} from the peer differs from the -c data",
                                rcnt + 1
                            );
                            return Ok(false);
                        }
                    }
                    routs = routs.saturating_sub(1);
                    if routs <= 1 {
                        routs += ctx.post_recv(ctx.rx_depth - routs);
                        if routs < ctx.rx_depth {
                            bail!("Couldn't post receive ({routs})");
                        }
                    }
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {}", other as i32),
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                ctx.post_send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = ctx.size as u64 * u64::from(iters) * 2;
    writeln!(
        out,
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    writeln!(
        out,
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / f64::from(iters)
    )?;
    out.flush()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trip() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0x1f011e,
            gid: Gid::from_ip("10.77.0.2".parse().unwrap()),
        };
        let m = d.encode();
        assert_eq!(
            &m[..],
            b"0000:000011:1f011e:00000000000000000000ffff0a4d0002\0"
        );
        assert_eq!(Dest::decode(&m).unwrap(), d);
    }

    #[test]
    fn malformed_messages_are_refused() {
        for m in [
            &b"done\0"[..],
            b"0000:000011:1f011e:00000000000000000000ffff0a4d00\0",
            b"0000:1000000:1f011e:00000000000000000000ffff0a4d0002",
            b"0000:000011:1f011e:0000000000000000000Xffff0a4d0002\0",
        ] {
            assert!(Dest::decode(m).is_err(), "{m:?}");
        }
    }

    #[test]
    fn numbers_read_like_strtoul() {
        assert_eq!(parse_num("4096"), Ok(4096));
        assert_eq!(parse_num("0x10"), Ok(16));
        assert!(parse_num("-1").is_err());
        assert!(parse_positive("0").is_err());
        assert_eq!(parse_mtu("2048"), Ok(Mtu::Mtu2048));
        assert!(parse_mtu("1000").is_err());
        assert!(parse_ib_port("2").is_err());
    }

    #[test]
    fn check_pattern_is_rdma_core_s() {
        assert_eq!(expected(0), 0);
        assert_eq!(expected(1), 0x7b);
        assert_eq!(expected(4096), 0);
        assert_eq!(expected(4097), 0x7b);
    }
}
