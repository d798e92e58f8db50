//! Kernel-socket baselines, run right after the RDMA test between the same two hosts with the
//! same sizes, iterations or duration, and parallelism (one stream or socket per QP):
//!
//! * bandwidth over TCP: one stream per QP, `write`s of the message size, timed from the
//!   first write to the receiver's acknowledgement of the last byte;
//! * bandwidth over UDP: a `sendmmsg` blast of message-size datagrams (64 per call), the rate
//!   counted at the receiver (`recvmmsg`) over the datagrams that arrived;
//! * latency over UDP or TCP: a ping-pong of message-size messages, busy-polling
//!   non-blocking sockets, or with `-e` blocking in `recv` (as the RDMA side sleeps on a
//!   completion channel).

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::report::BwStats;
use super::sys;

/// Which kernel transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BaselineKind {
    /// TCP streams (bandwidth) or a TCP ping-pong (latency).
    Tcp,
    /// A UDP sendmmsg blast (bandwidth) or a UDP ping-pong (latency).
    Udp,
}

impl BaselineKind {
    /// "tcp" / "udp".
    pub fn name(self) -> &'static str {
        match self {
            BaselineKind::Tcp => "tcp",
            BaselineKind::Udp => "udp",
        }
    }
}

/// Largest UDP payload over IPv4.
pub const MAX_DATAGRAM: u64 = 65507;
/// Datagrams per `sendmmsg`.
const BURST: usize = 64;
/// A ping-pong message not answered in this long is lost.
const PINGPONG_TIMEOUT: Duration = Duration::from_secs(5);

/// The receiving end of a bandwidth baseline, started before the client is told the port.
pub enum BwServer {
    /// Accepting and draining TCP streams.
    Tcp {
        /// Joined for the total bytes received.
        thread: std::thread::JoinHandle<anyhow::Result<u64>>,
    },
    /// Counting UDP datagrams.
    Udp {
        /// Joined for (datagrams, bytes, seconds from the first to the last).
        thread: std::thread::JoinHandle<anyhow::Result<(u64, u64, f64)>>,
        /// How many the client sent (u64::MAX until known).
        expected: Arc<AtomicU64>,
        /// The client has finished sending.
        stop: Arc<AtomicBool>,
    },
}

/// Binds the receiving end on `ip` (port chosen by the kernel) and starts draining; returns
/// it and its port.
pub fn bw_server(
    kind: BaselineKind,
    ip: IpAddr,
    size: usize,
    streams: usize,
) -> anyhow::Result<(BwServer, u16)> {
    match kind {
        BaselineKind::Tcp => {
            let l = TcpListener::bind((ip, 0)).context("binding the TCP baseline listener")?;
            let port = l.local_addr()?.port();
            let thread = std::thread::spawn(move || -> anyhow::Result<u64> {
                let mut handles = Vec::new();
                for _ in 0..streams {
                    let (mut s, _) = l.accept().context("accepting a baseline stream")?;
                    handles.push(std::thread::spawn(move || -> anyhow::Result<u64> {
                        sys::set_buffers(&s, 4 << 20);
                        let mut buf = vec![0u8; 1 << 20];
                        let mut total = 0u64;
                        loop {
                            match s.read(&mut buf) {
                                Ok(0) => break,
                                Ok(n) => total += n as u64,
                                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                                Err(e) => return Err(e).context("reading a baseline stream"),
                            }
                        }
                        s.write_all(&total.to_le_bytes())?;
                        Ok(total)
                    }));
                }
                let mut total = 0;
                for h in handles {
                    total += h
                        .join()
                        .map_err(|_| anyhow::anyhow!("a baseline reader panicked"))??;
                }
                Ok(total)
            });
            Ok((BwServer::Tcp { thread }, port))
        }
        BaselineKind::Udp => {
            let sock = UdpSocket::bind((ip, 0)).context("binding the UDP baseline socket")?;
            sys::set_buffers(&sock, 8 << 20);
            sock.set_read_timeout(Some(Duration::from_millis(50)))?;
            let port = sock.local_addr()?.port();
            let expected = Arc::new(AtomicU64::new(u64::MAX));
            let stop = Arc::new(AtomicBool::new(false));
            let (e2, s2) = (Arc::clone(&expected), Arc::clone(&stop));
            let thread = std::thread::spawn(move || -> anyhow::Result<(u64, u64, f64)> {
                let mut batch = sys::RecvBatch::new(BURST, size.max(1));
                let (mut n, mut bytes) = (0u64, 0u64);
                let (mut first, mut last) = (None, Instant::now());
                let mut idle_since: Option<Instant> = None;
                loop {
                    if n >= e2.load(Ordering::Acquire) {
                        break;
                    }
                    match batch.recv(&sock) {
                        Ok((k, b)) => {
                            let now = Instant::now();
                            first.get_or_insert(now);
                            last = now;
                            n += k as u64;
                            bytes += b;
                            idle_since = None;
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::WouldBlock
                                    | ErrorKind::TimedOut
                                    | ErrorKind::Interrupted
                            ) =>
                        {
                            if s2.load(Ordering::Acquire) {
                                // The rest was dropped: stop after a quiet spell.
                                let t = *idle_since.get_or_insert_with(Instant::now);
                                if t.elapsed() > Duration::from_millis(200) {
                                    break;
                                }
                            }
                        }
                        Err(e) => return Err(e).context("receiving baseline datagrams"),
                    }
                }
                let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
                Ok((n, bytes, secs))
            });
            Ok((
                BwServer::Udp {
                    thread,
                    expected,
                    stop,
                },
                port,
            ))
        }
    }
}

/// What the receiving end saw.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes.
    pub bytes: u64,
    /// UDP: datagrams that arrived.
    pub msgs: u64,
    /// UDP: seconds from the first datagram to the last.
    pub secs: f64,
}

impl BwServer {
    /// Waits for the end: `sent` is how many messages the client sent.
    pub fn finish(self, sent: u64) -> anyhow::Result<Received> {
        match self {
            BwServer::Tcp { thread } => {
                let bytes = thread
                    .join()
                    .map_err(|_| anyhow::anyhow!("the baseline receiver panicked"))??;
                Ok(Received {
                    bytes,
                    msgs: 0,
                    secs: 0.0,
                })
            }
            BwServer::Udp {
                thread,
                expected,
                stop,
            } => {
                expected.store(sent, Ordering::Release);
                stop.store(true, Ordering::Release);
                let (msgs, bytes, secs) = thread
                    .join()
                    .map_err(|_| anyhow::anyhow!("the baseline receiver panicked"))??;
                Ok(Received { bytes, msgs, secs })
            }
        }
    }
}

/// The sending end of a bandwidth baseline: `streams` TCP streams or UDP sockets, each
/// sending `iters` messages of `size` bytes (or for `duration`). Returns the messages sent
/// and the seconds (TCP: until the receiver acknowledged every byte).
pub fn bw_client(
    kind: BaselineKind,
    local: IpAddr,
    server: SocketAddr,
    size: usize,
    iters: u64,
    duration: Option<Duration>,
    streams: usize,
) -> anyhow::Result<(u64, f64)> {
    let barrier = Arc::new(Barrier::new(streams + 1));
    let mut handles = Vec::new();
    for _ in 0..streams {
        let b = Arc::clone(&barrier);
        handles.push(std::thread::spawn(move || -> anyhow::Result<u64> {
            let data = vec![0x5au8; size.max(1)];
            let deadline = |start: Instant| duration.map(|d| start + d);
            match kind {
                BaselineKind::Tcp => {
                    let conn = TcpStream::connect(server);
                    b.wait();
                    let mut s = conn.context("connecting the TCP baseline stream")?;
                    sys::set_buffers(&s, 4 << 20);
                    let start = Instant::now();
                    let end = deadline(start);
                    let mut n = 0u64;
                    while n < iters && end.is_none_or(|e| Instant::now() < e) {
                        s.write_all(&data[..size])
                            .context("writing the TCP baseline stream")?;
                        n += 1;
                    }
                    s.shutdown(Shutdown::Write)?;
                    let mut ack = [0u8; 8];
                    s.read_exact(&mut ack)
                        .context("reading the baseline receiver's acknowledgement")?;
                    let got = u64::from_le_bytes(ack);
                    if got != n * size as u64 {
                        bail!(
                            "the TCP baseline receiver got {got} bytes of {}",
                            n * size as u64
                        );
                    }
                    Ok(n)
                }
                BaselineKind::Udp => {
                    let s = UdpSocket::bind((local, 0));
                    b.wait();
                    let s = s.context("binding the UDP baseline socket")?;
                    s.connect(server)?;
                    sys::set_buffers(&s, 8 << 20);
                    let start = Instant::now();
                    let end = deadline(start);
                    let mut n = 0u64;
                    while n < iters && end.is_none_or(|e| Instant::now() < e) {
                        let want = (iters - n).min(BURST as u64) as usize;
                        match sys::send_burst(&s, &data[..size], want) {
                            Ok(k) => n += k as u64,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    ErrorKind::WouldBlock
                                        | ErrorKind::Interrupted
                                        | ErrorKind::ConnectionRefused
                                ) => {}
                            Err(e) => return Err(e).context("sending baseline datagrams"),
                        }
                    }
                    Ok(n)
                }
            }
        }));
    }
    barrier.wait();
    let start = Instant::now();
    let mut sent = 0;
    for h in handles {
        sent += h
            .join()
            .map_err(|_| anyhow::anyhow!("a baseline sender panicked"))??;
    }
    Ok((sent, start.elapsed().as_secs_f64()))
}

/// Bandwidth figures of a finished baseline run, from the client's count and time and the
/// receiver's report.
pub fn bw_stats(kind: BaselineKind, size: usize, sent: u64, secs: f64, r: &Received) -> BwStats {
    match kind {
        BaselineKind::Tcp => BwStats {
            size: size as u64,
            msgs: sent,
            secs,
            peak_secs_per_msg: None,
        },
        BaselineKind::Udp => BwStats {
            size: size as u64,
            msgs: r.msgs,
            secs: r.secs,
            peak_secs_per_msg: None,
        },
    }
}

/// A bound ping-pong echo end, before the client is told the port.
pub enum Echo {
    /// Waiting for the TCP connection.
    Tcp(TcpListener),
    /// The UDP socket.
    Udp(UdpSocket),
}

/// Binds the echoing end on `ip`; returns it and its port.
pub fn echo_bind(kind: BaselineKind, ip: IpAddr) -> anyhow::Result<(Echo, u16)> {
    Ok(match kind {
        BaselineKind::Tcp => {
            let l = TcpListener::bind((ip, 0)).context("binding the TCP baseline listener")?;
            let p = l.local_addr()?.port();
            (Echo::Tcp(l), p)
        }
        BaselineKind::Udp => {
            let s = UdpSocket::bind((ip, 0)).context("binding the UDP baseline socket")?;
            let p = s.local_addr()?.port();
            (Echo::Udp(s), p)
        }
    })
}

/// Reads exactly `buf.len()` bytes, spinning on a non-blocking socket when `busy`. Ok(false)
/// at end of stream before the first byte.
fn read_full(s: &mut TcpStream, buf: &mut [u8], busy: bool) -> anyhow::Result<bool> {
    let mut got = 0;
    let t0 = Instant::now();
    let mut spins = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => bail!("the baseline peer closed mid-message"),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if busy && t0.elapsed() > PINGPONG_TIMEOUT {
                    bail!("no ping-pong message for {}s", PINGPONG_TIMEOUT.as_secs());
                }
                idle(&mut spins);
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                bail!("no ping-pong message for {}s", PINGPONG_TIMEOUT.as_secs())
            }
            Err(e) => return Err(e).context("reading the baseline ping-pong"),
        }
    }
    Ok(true)
}

/// Receives one datagram, spinning when `busy`.
fn recv_dgram(s: &UdpSocket, buf: &mut [u8], busy: bool) -> anyhow::Result<usize> {
    let t0 = Instant::now();
    let mut spins = 0;
    loop {
        match s.recv(buf) {
            Ok(n) => return Ok(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if busy && t0.elapsed() > PINGPONG_TIMEOUT {
                    bail!(
                        "no ping-pong datagram for {}s (lost?)",
                        PINGPONG_TIMEOUT.as_secs()
                    );
                }
                idle(&mut spins);
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                bail!(
                    "no ping-pong datagram for {}s (lost?)",
                    PINGPONG_TIMEOUT.as_secs()
                )
            }
            Err(e) => return Err(e).context("receiving a ping-pong datagram"),
        }
    }
}

/// The echoing end: answers every message until the client ends (TCP: end of stream; UDP:
/// an empty datagram). Returns the messages echoed.
pub fn echo_serve(echo: Echo, size: usize, busy: bool) -> anyhow::Result<u64> {
    let mut buf = vec![0u8; size.max(1)];
    let mut n = 0u64;
    match echo {
        Echo::Tcp(l) => {
            let (mut s, _) = l.accept().context("accepting the baseline connection")?;
            s.set_nodelay(true)?;
            s.set_nonblocking(busy)?;
            if !busy {
                s.set_read_timeout(Some(PINGPONG_TIMEOUT))?;
            }
            while read_full(&mut s, &mut buf[..size], busy)? {
                s.write_all(&buf[..size])?;
                n += 1;
            }
        }
        Echo::Udp(s) => {
            s.set_nonblocking(busy)?;
            if !busy {
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
            }
            let mut big = vec![0u8; size.max(1) + 1];
            loop {
                let mut spins = 0;
                let (len, from) = loop {
                    match s.recv_from(&mut big) {
                        Ok(x) => break x,
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::WouldBlock | ErrorKind::Interrupted
                            ) =>
                        {
                            idle(&mut spins)
                        }
                        Err(e) => return Err(e).context("receiving a ping-pong datagram"),
                    }
                };
                if len == 0 {
                    break;
                }
                s.send_to(&big[..len], from)?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The pinging end: `iters` round trips (or for `duration`). Returns the start time of
/// every round trip.
pub fn ping(
    kind: BaselineKind,
    local: IpAddr,
    server: SocketAddr,
    size: usize,
    iters: u64,
    duration: Option<Duration>,
    busy: bool,
) -> anyhow::Result<Vec<Instant>> {
    let msg = vec![0x5au8; size.max(1)];
    let mut buf = vec![0u8; size.max(1)];
    let mut times = Vec::with_capacity(iters.min(10_000_000) as usize);
    let start = Instant::now();
    let end = duration.map(|d| start + d);
    let more = |n: u64| n < iters && end.is_none_or(|e| Instant::now() < e);
    match kind {
        BaselineKind::Tcp => {
            let mut s = TcpStream::connect(server).context("connecting the TCP baseline")?;
            s.set_nodelay(true)?;
            s.set_nonblocking(busy)?;
            if !busy {
                s.set_read_timeout(Some(PINGPONG_TIMEOUT))?;
            }
            while more(times.len() as u64) {
                times.push(Instant::now());
                write_all_spin(&mut s, &msg[..size])?;
                if !read_full(&mut s, &mut buf[..size], busy)? {
                    bail!("the baseline echo closed the connection");
                }
            }
            s.set_nonblocking(false)?;
            s.shutdown(Shutdown::Write)?;
        }
        BaselineKind::Udp => {
            let s = UdpSocket::bind((local, 0)).context("binding the UDP baseline socket")?;
            s.connect(server)?;
            s.set_nonblocking(busy)?;
            if !busy {
                s.set_read_timeout(Some(PINGPONG_TIMEOUT))?;
            }
            while more(times.len() as u64) {
                times.push(Instant::now());
                s.send(&msg[..size])?;
                let n = recv_dgram(&s, &mut buf, busy)?;
                if n != size {
                    bail!("a {n}-byte answer to a {size}-byte ping");
                }
            }
            // The end marker; sent twice in case one is dropped.
            s.send(&[])?;
            s.send(&[])?;
        }
    }
    Ok(times)
}

/// One idle turn of a busy-polling loop, as the RDMA side's: spin a little, then yield so
/// that a small machine's other runnable threads get the CPU.
fn idle(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn write_all_spin(s: &mut TcpStream, mut data: &[u8]) -> anyhow::Result<()> {
    while !data.is_empty() {
        match s.write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                std::hint::spin_loop()
            }
            Err(e) => return Err(e).context("writing the baseline ping-pong"),
        }
    }
    Ok(())
}
