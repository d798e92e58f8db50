//! End-to-end tests of `srdma pingpong`: two processes over loopback, as ibv_rc_pingpong and
//! ibv_ud_pingpong would run on two hosts, plus the failures a user meets (bad arguments, no
//! server, an unreachable or misconfigured peer, a completion error).
//!
//! Every test uses its own 127.77.N.x addresses and its own TCP port, so the tests run in
//! parallel; the ports lie below Linux's ephemeral range (32768–60999), where no outgoing
//! connection of another process can take them (the server listens on the wildcard address,
//! as ibv_rc_pingpong does). Every process runs under a deadline and is killed past it, so
//! nothing hangs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest any one process may run.
const DEADLINE: Duration = Duration::from_secs(60);

mod common;
use common::{Outcome, Running};

fn start(args: &[&str]) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_srdma"));
    cmd.arg("pingpong");
    common::spawn(cmd, args)
}

/// Waits for `r`'s exit under the deadline.
trait Finish {
    fn finish(self) -> Outcome;
}

impl Finish for Running {
    fn finish(self) -> Outcome {
        self.finish_within(DEADLINE)
    }
}

/// Runs one process to its end.
fn run(args: &[&str]) -> Outcome {
    start(args).finish()
}

/// Runs a client, starting it again while the server is not listening yet.
fn run_client(args: &[&str]) -> Outcome {
    let t0 = Instant::now();
    loop {
        let out = run(args);
        let refused = out.code == Some(1) && out.stderr.contains("Couldn't connect to");
        if !refused || t0.elapsed() > Duration::from_secs(20) {
            return out;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until some socket listens on TCP `port`.
fn wait_listening(port: u16) {
    assert!(
        common::listening(port),
        "nothing listens on TCP port {port}"
    );
}

/// Runs a server and a client; both must exit 0.
fn pair(server: &[&str], client: &[&str]) -> (Outcome, Outcome) {
    let s = start(server);
    let c = run_client(client);
    if c.code != Some(0) {
        // Do not leave the server waiting for a client that gave up.
        let mut s = s;
        let _ = s.child.kill();
        let s = s.finish();
        panic!("client failed: {c:#?}\nserver: {s:#?}");
    }
    let s = s.finish();
    assert_eq!(s.code, Some(0), "server failed: {s:#?}\nclient: {c:#?}");
    (s, c)
}

/// One "local address" / "remote address" line.
#[derive(Debug, PartialEq, Eq)]
struct Addr {
    lid: String,
    qpn: String,
    psn: String,
    gid: String,
}

fn addr_line(out: &str, which: &str) -> Addr {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("  {which} address: ")))
        .unwrap_or_else(|| panic!("no {which} address line in:\n{out}"));
    // "  local address:  LID 0x0000, QPN 0x000011, PSN 0x59c9f5, GID ::ffff:10.77.0.2" (the UD
    // local line has "PSN 0x..: GID").
    let rest = line.split_once("LID ").unwrap().1;
    let (lid, rest) = rest.split_once(", QPN ").unwrap();
    let (qpn, rest) = rest.split_once(", PSN ").unwrap();
    let (psn, gid) = rest
        .split_once(", GID ")
        .or_else(|| rest.split_once(": GID "))
        .unwrap();
    for (v, digits) in [(lid, 4), (qpn, 6), (psn, 6)] {
        assert!(
            v.len() == digits + 2
                && v.starts_with("0x")
                && v[2..].bytes().all(|b| b.is_ascii_hexdigit()),
            "{line}"
        );
    }
    Addr {
        lid: lid.into(),
        qpn: qpn.into(),
        psn: psn.into(),
        gid: gid.into(),
    }
}

/// Checks the output of a successful run: the address lines, then
/// "N bytes in T seconds = R Mbit/sec" and "N iters in T seconds = U usec/iter".
fn check_stats(out: &Outcome, size: u64, iters: u64) {
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{out:#?}");
    assert!(lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"));
    assert!(lines[1].starts_with("  remote address: LID 0x0000, QPN 0x"));
    let num = |s: &str| -> f64 { s.parse().unwrap_or_else(|_| panic!("{s:?} in {out:#?}")) };
    let w: Vec<&str> = lines[2].split(' ').collect();
    assert_eq!(
        (w.len(), w[1], w[2], w[4], w[5], w[7]),
        (8, "bytes", "in", "seconds", "=", "Mbit/sec"),
        "{}",
        lines[2]
    );
    assert_eq!(w[0].parse::<u64>().unwrap(), size * iters * 2);
    assert!(num(w[3]) >= 0.0 && num(w[6]) > 0.0);
    assert!(
        w[3].split_once('.').unwrap().1.len() == 2 && w[6].split_once('.').unwrap().1.len() == 2
    );
    let w: Vec<&str> = lines[3].split(' ').collect();
    assert_eq!(
        (w.len(), w[1], w[2], w[4], w[5], w[7]),
        (8, "iters", "in", "seconds", "=", "usec/iter"),
        "{}",
        lines[3]
    );
    assert_eq!(w[0].parse::<u64>().unwrap(), iters);
    assert!(num(w[6]) > 0.0);
    assert!(out.stderr.is_empty(), "{}", out.stderr);
}

/// Checks a successful pair: each side's remote line is the other's local line, the GIDs are
/// the expected ones, and the statistics add up.
fn check_pair(s: &Outcome, c: &Outcome, size: u64, iters: u64, server_gid: &str, client_gid: &str) {
    check_stats(s, size, iters);
    check_stats(c, size, iters);
    let (sl, sr) = (
        addr_line(&s.stdout, "local"),
        addr_line(&s.stdout, "remote"),
    );
    let (cl, cr) = (
        addr_line(&c.stdout, "local"),
        addr_line(&c.stdout, "remote"),
    );
    assert_eq!(sl, cr);
    assert_eq!(cl, sr);
    assert_eq!(sl.gid, server_gid);
    assert_eq!(cl.gid, client_gid);
    assert_eq!(sl.lid, "0x0000");
}

fn rc_pair(net: u8, tcp_port: u16, extra: &[&str], size: u64, iters: u64) -> (Outcome, Outcome) {
    let (sa, ca) = (format!("127.77.{net}.1"), format!("127.77.{net}.2"));
    let (port, n) = (tcp_port.to_string(), iters.to_string());
    let mut server = vec!["--bind", &sa, "-p", &port, "-n", &n];
    server.extend_from_slice(extra);
    let mut client = server.clone();
    client[1] = &ca;
    client.push(&sa);
    let (s, c) = pair(&server, &client);
    check_pair(
        &s,
        &c,
        size,
        iters,
        &format!("::ffff:{sa}"),
        &format!("::ffff:{ca}"),
    );
    (s, c)
}

/// True when this host has an IPv6 loopback.
fn have_ipv6() -> bool {
    UdpSocket::bind("[::1]:0").is_ok()
}

// ---------------------------------------------------------------------------------------------
// Successful runs.

/// RC, 64-byte messages, `-g 1` as rxe users pass it.
#[test]
fn rc_64_bytes_gid_1() {
    rc_pair(1, 18811, &["-s", "64", "-g", "1"], 64, 300);
}

/// RC with `-g 0`, the first GID, which programs take by default: the link-local GID made
/// from the node GUID, which the peer reaches through the address it holds.
#[test]
fn rc_gid_0() {
    let (s, c) = pair(
        &[
            "--bind",
            "127.77.17.1",
            "-p",
            "18829",
            "-n",
            "20",
            "-g",
            "0",
        ],
        &[
            "--bind",
            "127.77.17.2",
            "-p",
            "18829",
            "-n",
            "20",
            "-g",
            "0",
            "127.77.17.1",
        ],
    );
    assert_eq!((s.code, c.code), (Some(0), Some(0)), "{s:#?}\n{c:#?}");
    check_stats(&s, 4096, 20);
    assert!(
        addr_line(&c.stdout, "remote").gid.starts_with("fe80::"),
        "{}",
        c.stdout
    );
}

/// RC at the default size, 4096 bytes: four packets per message at the default MTU 1024; one
/// receive posted at a time.
#[test]
fn rc_default_size() {
    rc_pair(2, 18812, &["-r", "1"], 4096, 200);
}

/// RC, 64 KiB messages: 64 packets each (FIRST, MIDDLE..., LAST).
#[test]
fn rc_64k_multi_packet() {
    rc_pair(3, 18813, &["-s", "65536"], 65536, 40);
}

/// `-c` validates every received message; odd size, MTU 2048.
#[test]
fn rc_check_data() {
    let (s, c) = rc_pair(4, 18814, &["-c", "-s", "10000", "-m", "2048"], 10000, 200);
    assert!(!s.stdout.contains("invalid data") && !c.stdout.contains("invalid data"));
}

/// `-e`: both sides sleep on the completion channel.
#[test]
fn rc_events() {
    rc_pair(5, 18815, &["-e", "-s", "5000", "-r", "8"], 5000, 300);
}

/// `--ud`: ibv_ud_pingpong, its "PSN 0x..: GID" local line, 40-byte GRH area, Q_Key
/// 0x11111111, default size 1024.
#[test]
fn ud_pingpong() {
    let (s, c) = rc_pair(6, 18816, &["--ud"], 1024, 300);
    for out in [&s, &c] {
        let local = out.stdout.lines().next().unwrap();
        assert!(local.contains(", PSN 0x") && local.contains(": GID ::ffff:127.77.6."));
    }
}

/// `--ud` with events and data checks.
#[test]
fn ud_events_check_data() {
    rc_pair(7, 18817, &["--ud", "-e", "-c", "-s", "700"], 700, 200);
}

/// IPv6: one loopback address, so the two devices use different UDP ports.
#[test]
fn ipv6_rc_and_ud() {
    if !have_ipv6() {
        eprintln!("no IPv6 loopback: skipped");
        return;
    }
    for (port, ud) in [("18818", false), ("18819", true)] {
        let mut server = vec![
            "--bind",
            "::1",
            "--udp-port",
            "47961",
            "--peer-udp-port",
            "47962",
            "-p",
            port,
            "-n",
            "200",
            "-s",
            "1000",
        ];
        if ud {
            server.push("--ud");
        }
        let mut client = server.clone();
        client[3] = "47962";
        client[5] = "47961";
        client.push("::1");
        let (s, c) = pair(&server, &client);
        check_pair(&s, &c, 1000, 200, "::1", "::1");
    }
}

/// A server without `--bind` opens its device on the address the client reached.
#[test]
fn server_binds_the_address_it_was_reached_at() {
    let server = ["-p", "18820", "-n", "100", "-s", "100"];
    let client = [
        "--bind",
        "127.77.8.2",
        "-p",
        "18820",
        "-n",
        "100",
        "-s",
        "100",
        "127.77.8.1",
    ];
    let (s, c) = pair(&server, &client);
    check_pair(&s, &c, 100, 100, "::ffff:127.77.8.1", "::ffff:127.77.8.2");
}

/// A client without `--bind` binds the kernel's source address towards the server.
#[test]
fn client_binds_its_route_source() {
    // The kernel reaches 127.77.9.1 from 127.0.0.1; a private UDP port keeps the client off
    // 127.0.0.1:4791.
    let server = [
        "--bind",
        "127.77.9.1",
        "--peer-udp-port",
        "47963",
        "-p",
        "18821",
        "-n",
        "100",
    ];
    let client = [
        "--udp-port",
        "47963",
        "-p",
        "18821",
        "-n",
        "100",
        "127.77.9.1",
    ];
    let (s, c) = pair(&server, &client);
    let expect = UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("127.77.9.1:4791").map(|()| u))
        .and_then(|u| u.local_addr())
        .unwrap()
        .ip();
    check_pair(
        &s,
        &c,
        4096,
        100,
        "::ffff:127.77.9.1",
        &format!("::ffff:{expect}"),
    );
}

// ---------------------------------------------------------------------------------------------
// Failures.

/// Bad arguments: clap's message and exit status 2.
#[test]
fn bad_arguments_exit_2() {
    for (args, says) in [
        (&["-m", "1000"][..], "256, 512, 1024, 2048 or 4096"),
        (&["-i", "2"], "single port"),
        (&["-n", "0"], "at least 1"),
        (&["-s", "big"], "not a number"),
        (&["--bind", "nowhere"], "--bind"),
        (&["--frobnicate"], "--frobnicate"),
        (&["host1", "host2"], "host2"),
    ] {
        let out = run(args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:#?}");
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty());
    }
}

/// No server: a clear message and exit 1, at once.
#[test]
fn no_server_fails_fast() {
    let out = run(&["--bind", "127.77.10.2", "-p", "18822", "127.77.10.1"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr
            .contains("Couldn't connect to 127.77.10.1:18822: Connection refused"),
        "{}",
        out.stderr
    );
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
}

/// A peer that completes the exchange but has no RoCE device: the first SEND exhausts its
/// retries and the completion error is reported as rdma-core does, exit 1.
#[test]
fn unreachable_peer_is_a_completion_error() {
    let listener = TcpListener::bind("127.77.11.1:18823").unwrap();
    let peer = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut msg = [0u8; 52];
        c.read_exact(&mut msg).unwrap();
        c.write_all(b"0000:000011:000001:00000000000000000000ffff7f4d0b01\0")
            .unwrap();
        let mut done = [0u8; 5];
        c.read_exact(&mut done).unwrap();
        (msg, done)
    });
    let out = run(&[
        "--bind",
        "127.77.11.2",
        "-p",
        "18823",
        "-n",
        "5",
        "127.77.11.1",
    ]);
    let (msg, done) = peer.join().unwrap();
    assert_eq!(&done, b"done\0");
    let text = std::str::from_utf8(&msg).unwrap();
    // LID 0, a QPN of the device's slot of the shared UDP 4791 (slot << 16 | n, n from
    // 0x11 up: a process's first QPN is drawn at random, as a kernel device's next one is
    // whatever its earlier users left).
    let qpn = u32::from_str_radix(&text[5..11], 16).unwrap_or(0);
    assert!(
        text.starts_with("0000:")
            && qpn & 0xFFFF >= 0x11
            && text.ends_with(":00000000000000000000ffff7f4d0b02\0"),
        "{text:?}"
    );
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr
            .contains("Failed status transport retry counter exceeded (12) for wr_id 2"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("no acknowledgement from the peer's RoCE device at UDP 127.77.11.1:4791"),
        "{}",
        out.stderr
    );
    let remote = addr_line(&out.stdout, "remote");
    assert_eq!(
        (remote.qpn.as_str(), remote.psn.as_str()),
        ("0x000011", "0x000001")
    );
    assert!(out.elapsed < Duration::from_secs(20), "{:?}", out.elapsed);
}

/// A server whose receive buffers are smaller than the client's messages: the server's
/// receive fails with a local length error, the client's SEND with a remote invalid request
/// (the NAK), both exit 1.
#[test]
fn message_larger_than_the_receive_buffer() {
    let s = start(&["--bind", "127.77.12.1", "-p", "18824", "-s", "1000"]);
    let c = run_client(&[
        "--bind",
        "127.77.12.2",
        "-p",
        "18824",
        "-s",
        "2000",
        "127.77.12.1",
    ]);
    let s = s.finish();
    assert_eq!((s.code, c.code), (Some(1), Some(1)), "{s:#?}\n{c:#?}");
    assert!(
        s.stderr
            .contains("Failed status local length error (1) for wr_id 1"),
        "{}",
        s.stderr
    );
    assert!(
        c.stderr
            .contains("Failed status remote invalid request error (9) for wr_id 2"),
        "{}",
        c.stderr
    );
}

/// `-c` catches data that is not the `-c` pattern: a server checking data from a client that
/// does not send it reports rdma-core's "invalid data in page N" lines and exits 1.
#[test]
fn check_data_detects_a_wrong_pattern() {
    let s = start(&["--bind", "127.77.21.1", "-p", "18832", "-c", "-s", "9000"]);
    wait_listening(18832);
    let mut c = start(&[
        "--bind",
        "127.77.21.2",
        "-p",
        "18832",
        "-s",
        "9000",
        "127.77.21.1",
    ]);
    let s = s.finish();
    // The client waits for an answer that never comes, as ibv_rc_pingpong would.
    let _ = c.child.kill();
    let c = c.finish();
    assert_eq!(s.code, Some(1), "{s:#?}");
    // 0x7b everywhere: byte 0 of pages 0, 1 and 2 should be 0.
    assert!(
        s.stdout
            .ends_with("invalid data in page 0\ninvalid data in page 1\ninvalid data in page 2\n"),
        "{}",
        s.stdout
    );
    assert!(
        s.stderr.contains("differs from the -c data"),
        "{}",
        s.stderr
    );
    assert!(c.stdout.contains("  remote address: "), "{c:#?}");
}

/// A fake peer that answers the exchange with `gid` (32 hex digits).
fn fake_server(addr: &str, gid: &'static str) -> JoinHandle<()> {
    let listener = TcpListener::bind(addr).unwrap();
    std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut msg = [0u8; 52];
        c.read_exact(&mut msg).unwrap();
        let _ = c.write_all(format!("0000:000011:000001:{gid}\0").as_bytes());
        let mut done = [0u8; 5];
        let _ = c.read_exact(&mut done);
    })
}

/// A peer started without `-g` announces GID `::`; one with `-g 0` on rxe a link-local GID.
/// Neither can be reached over IP: the error says why and what to pass.
#[test]
fn unusable_peer_gids_are_explained() {
    for (n, gid, says) in [
        (13u8, "00000000000000000000000000000000", "without -g"),
        (
            14,
            "fe80000000000000505400fffe770002",
            "link-local GID fe80::5054:ff:fe77:2",
        ),
    ] {
        let sa = format!("127.77.{n}.1");
        let port = format!("{}", 18812 + u16::from(n));
        let peer = fake_server(&format!("{sa}:{port}"), gid);
        let ca = format!("127.77.{n}.2");
        let out = run(&["--bind", &ca, "-p", &port, &sa]);
        peer.join().unwrap();
        assert_eq!(out.code, Some(1), "{out:#?}");
        assert!(out.stderr.contains(says), "{}", out.stderr);
        assert!(out.stderr.contains("-g 1"), "{}", out.stderr);
    }
}

/// A server refuses a client announcing GID `::` (ibv_rc_pingpong without `-g`), explains it,
/// and closes the connection without answering.
#[test]
fn server_refuses_a_client_without_gid() {
    let s = start(&["--bind", "127.77.15.1", "-p", "18827"]);
    let t0 = Instant::now();
    let mut conn = loop {
        match TcpStream::connect("127.77.15.1:18827") {
            Ok(c) => break c,
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    };
    conn.write_all(b"0000:000042:123456:00000000000000000000000000000000\0")
        .unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let s = s.finish();
    assert!(answer.is_empty(), "{answer:?}");
    assert_eq!(s.code, Some(1), "{s:#?}");
    assert!(
        s.stderr.contains("Couldn't connect to remote QP"),
        "{}",
        s.stderr
    );
    assert!(s.stderr.contains("GID :: (no GID)"), "{}", s.stderr);
}

/// `-g 0` on an IPv4 device off UDP 4791 is a link-local GID no peer can map to the
/// address: explained, exit 1.
#[test]
fn local_link_local_gid_off_the_rocev2_port_is_refused() {
    let out = run(&[
        "--bind",
        "127.77.16.2",
        "--udp-port",
        "4792",
        "-g",
        "0",
        "-p",
        "18828",
        "127.77.16.1",
    ]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("GID index 0 is fe80::"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
}

/// A GID index past the table: rdma-core's message, with the table.
#[test]
fn gid_index_out_of_range() {
    let out = run(&[
        "--bind",
        "127.77.17.2",
        "-g",
        "5",
        "-p",
        "18829",
        "127.77.17.1",
    ]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("can't read sgid of index 5"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("[1] ::ffff:127.77.17.2"),
        "{}",
        out.stderr
    );
}

/// `--ud` messages must fit the port MTU, as ibv_ud_pingpong checks.
#[test]
fn ud_message_above_the_mtu() {
    let out = run(&["--ud", "-s", "2048", "--bind", "127.77.18.2", "127.77.18.1"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr
            .contains("Requested size larger than port MTU (1024)"),
        "{}",
        out.stderr
    );
}

/// `--bind` an address this host does not have: said so.
#[test]
fn bind_to_a_foreign_address() {
    let out = run(&["--bind", "192.0.2.1", "-p", "18830", "127.77.19.1"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("not an address of this host"),
        "{}",
        out.stderr
    );
}

/// The UDP port of a device already in use: said so, with the way out.
#[test]
fn device_port_in_use() {
    let _taken = UdpSocket::bind(SocketAddr::from(([127, 77, 20, 2], 4791))).unwrap();
    let out = run(&["--bind", "127.77.20.2", "-p", "18831", "127.77.20.1"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(out.stderr.contains("--udp-port"), "{}", out.stderr);
}
