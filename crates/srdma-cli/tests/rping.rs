//! End-to-end tests of `srdma rping`: server and client processes over loopback (and between
//! two network namespaces), checked against rping's ping data, computed here independently;
//! plus the failures a user meets (no server, bad arguments, data that does not verify).
//!
//! Every test uses its own 127.62.N.x addresses and TCP port, so the tests run in parallel;
//! every process runs under a deadline and is killed past it, so nothing hangs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use srdma::cm::{CmEvent, Listener};
use srdma::{
    AccessFlags, Cq, Device, DeviceConfig, QpInit, QpType, RKey, RecvWr, SendOp, SendWr, SgeList,
    Wc, WcStatus,
};

/// Longest any one process may run.
const DEADLINE: Duration = Duration::from_secs(40);

/// The statistics directory of the processes: a scratch one, so their device files (and
/// those of the processes a test kills, until a reader removes them) stay out of /run/srdma.
fn run_dir() -> PathBuf {
    std::env::temp_dir().join("srdma-rping-tests")
}

mod common;
use common::{Outcome, Running};

fn spawn(mut cmd: Command, args: &[&str]) -> Running {
    cmd.env("SRDMA_RUN_DIR", run_dir());
    common::spawn(cmd, args)
}

/// `srdma rping ARGS`, over srdma's TCP connection manager (`--tcp-cm`) unless ARGS say
/// `--ib-cm` or `--help`: most tests here are about the TCP exchange and its fake servers.
fn start(args: &[&str]) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_srdma"));
    cmd.arg("rping");
    if !args.iter().any(|a| *a == "--ib-cm" || *a == "--help") {
        cmd.arg("--tcp-cm");
    }
    spawn(cmd, args)
}

/// `srdma rping ARGS` with no CM option: IB CM, as rdma-core's rping.
fn start_default(args: &[&str]) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_srdma"));
    cmd.arg("rping");
    spawn(cmd, args)
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

fn run(args: &[&str]) -> Outcome {
    start(args).finish()
}

/// Waits until some socket listens on TCP `port`.
fn wait_listening(port: u16) {
    assert!(
        common::listening(port),
        "nothing listens on TCP port {port}"
    );
}

/// rping's ping data for ping `n`, written from its description: "rdma-ping-<n>: ", then
/// characters from 'A' + n (mod the 58 of 'A'..='z') on, rotating, up to `size - 1` bytes.
fn expected_ping(n: u64, size: usize) -> String {
    let mut s = format!("rdma-ping-{n}: ");
    let mut c = b'A' + (n % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c = if c == b'z' { b'A' } else { c + 1 };
    }
    s.truncate(size - 1);
    s
}

/// Runs a server on `addr`:`port` and a client bound to `client_addr`, both with `extra`.
fn pair(addr: &str, client_addr: &str, port: u16, extra: &[&str]) -> (Outcome, Outcome) {
    let p = port.to_string();
    let mut sargs = vec!["-s", "-a", addr, "-p", &p];
    sargs.extend(extra.iter().filter(|a| **a == "-v" || **a == "-V"));
    let server = start(&sargs);
    wait_listening(port);
    let mut cargs = vec!["-c", "-a", addr, "--bind", client_addr, "-p", &p];
    cargs.extend(extra);
    let client = run(&cargs);
    (server.finish(), client)
}

/// Both sides succeeded and printed exactly the expected ping lines.
fn check_pair(s: &Outcome, c: &Outcome, size: usize, count: u64) {
    assert_eq!(c.code, Some(0), "client: {c:#?}\nserver: {s:#?}");
    assert_eq!(s.code, Some(0), "server: {s:#?}\nclient: {c:#?}");
    let want: String = (0..count)
        .map(|n| format!("ping data: {}\n", expected_ping(n, size)))
        .collect();
    assert_eq!(c.stdout, want, "client output");
    let want: String = (0..count)
        .map(|n| format!("server ping data: {}\n", expected_ping(n, size)))
        .collect();
    assert_eq!(s.stdout, want, "server output");
    assert!(s.stderr.contains("server DISCONNECT EVENT..."), "{s:#?}");
    assert!(c.stderr.contains("client DISCONNECT EVENT..."), "{c:#?}");
}

#[test]
fn pairs_with_several_sizes_and_counts() {
    // Minimum, default, one packet, several packets at lo's 4096 MTU, the maximum.
    for (i, (size, count)) in [(26, 1), (64, 12), (1000, 7), (9000, 5), (65535, 3)]
        .into_iter()
        .enumerate()
    {
        let (s, c) = pair(
            "127.62.1.1",
            "127.62.1.2",
            17400 + i as u16,
            &[
                "-V",
                "-v",
                "-S",
                &size.to_string(),
                "-C",
                &count.to_string(),
            ],
        );
        check_pair(&s, &c, size, count);
    }
}

#[test]
fn verbose_lines_are_rpings() {
    // What rdma-core's rping printed on kernel rxe (shared/rxe-lab/demo/09-rdma_cm_rping.txt).
    let (s, c) = pair("127.62.2.1", "127.62.2.2", 17410, &["-v", "-C", "3"]);
    assert_eq!(
        c.stdout,
        "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\n\
         ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs\n\
         ping data: rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst\n"
    );
    assert_eq!(
        s.stdout,
        "server ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\n\
         server ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs\n\
         server ping data: rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst\n"
    );
    assert_eq!(c.stderr, "client DISCONNECT EVENT...\n");
    assert_eq!(s.stderr, "server DISCONNECT EVENT...\n");
    assert_eq!((s.code, c.code), (Some(0), Some(0)));
}

#[test]
fn many_pings_wrap_the_characters_and_quiet_runs_print_nothing() {
    // 60 pings pass 'z' (58 characters); without -v nothing is printed.
    let (s, c) = pair("127.62.3.1", "127.62.3.2", 17420, &["-V", "-C", "60"]);
    assert_eq!((s.code, c.code), (Some(0), Some(0)), "{s:#?}\n{c:#?}");
    assert_eq!((s.stdout.as_str(), c.stdout.as_str()), ("", ""));
    let (s, c) = pair("127.62.3.1", "127.62.3.2", 17421, &["-v", "-C", "60"]);
    check_pair(&s, &c, 64, 60);
}

#[test]
fn client_without_a_server_fails_fast() {
    // Nothing listens on this port.
    let out = run(&[
        "-c",
        "-a",
        "127.62.4.1",
        "--bind",
        "127.62.4.2",
        "-p",
        "17430",
        "-C",
        "1",
    ]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(3), "{out:#?}");
    assert!(
        out.stderr
            .contains("cannot connect to an srdma rping server at 127.62.4.1:17430")
            && out.stderr.contains("RDMA_CM_EVENT_UNREACHABLE"),
        "{out:#?}"
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn bad_arguments_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["-a", "127.0.0.1"], "required"),
        (&["-s", "-c", "-a", "127.0.0.1"], "cannot be used with"),
        (&["-c"], "required"),
        (
            &["-c", "-a", "127.0.0.1", "-S", "25"],
            "valid range is 26 to 65535",
        ),
        (
            &["-c", "-a", "127.0.0.1", "-S", "65536"],
            "valid range is 26 to 65535",
        ),
        (&["-c", "-a", "127.0.0.1", "-C", "-1"], "-1"),
        (&["-c", "-a", "127.0.0.1", "-p", "70000"], "-p"),
        (&["-c", "-a", "127.0.0.1", "--bind", "nowhere"], "--bind"),
        (&["-c", "-a", "127.0.0.1", "--frobnicate"], "--frobnicate"),
        (&["-s", "-a", "0.0.0.0"], "must be a specific address"),
        (&["-s", "-a", "::"], "must be a specific address"),
    ];
    for (args, needle) in cases {
        let out = run(args);
        assert_eq!(out.code, Some(2), "{args:?}: {out:#?}");
        assert!(
            out.stderr.contains(needle),
            "{args:?}: {needle:?} not in {out:#?}"
        );
        assert_eq!(out.stdout, "", "{args:?}");
    }
    // --help says when the real rping can be the peer.
    let help = run(&["--help"]);
    assert_eq!(help.code, Some(0));
    assert!(
        help.stdout
            .contains("With --tcp-cm the peer must be srdma rping")
            && help
                .stdout
                .contains("the peer may be rdma-core's rping (on kernel rxe"),
        "{help:#?}"
    );
}

#[test]
fn server_address_that_is_not_local_fails_clearly() {
    // 192.0.2.0/24 is TEST-NET-1: never an address of this host.
    let out = run(&["-s", "-a", "192.0.2.77", "-p", "17440"]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(out.stderr.contains("192.0.2.77"), "{out:#?}");
}

/// Polls `cq` for one completion, up to 10 s.
fn poll(cq: &Cq) -> Wc {
    let t0 = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            return wc;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A one-ping rping server written against the verbs API, which corrupts byte `corrupt` of
/// the data it writes back when given one.
fn fake_server(addr: &str, port: u16, corrupt: Option<usize>) -> JoinHandle<()> {
    let mut cfg = DeviceConfig::new(addr.parse().unwrap());
    cfg.port = 0;
    cfg.pcap = None;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd();
    let listener = Listener::bind(&dev, &pd, SocketAddr::new(addr.parse().unwrap(), port)).unwrap();
    std::thread::spawn(move || {
        let cq = dev.create_cq(32, None).unwrap();
        let req = listener
            .accept_request(Some(Duration::from_secs(20)))
            .unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        let recv = pd.reg_mr(16, AccessFlags::LOCAL_WRITE).unwrap();
        let send = pd.reg_mr(16, AccessFlags::empty()).unwrap();
        let buf = pd.reg_mr(65536, AccessFlags::LOCAL_WRITE).unwrap();
        let post_recv = || {
            qp.post_recv(RecvWr {
                wr_id: 1,
                sges: SgeList::one(recv.sge(0, 16)),
            })
            .unwrap()
        };
        let desc = || {
            let mut b = [0u8; 16];
            recv.read(0, &mut b).unwrap();
            (
                u64::from_be_bytes(b[..8].try_into().unwrap()),
                u32::from_be_bytes(b[8..12].try_into().unwrap()),
                u32::from_be_bytes(b[12..].try_into().unwrap()),
            )
        };
        let go_ahead = || {
            let wr = SendWr::new(2, SendOp::Send, SgeList::one(send.sge(0, 16)));
            qp.post_send(wr).unwrap();
            poll(&cq);
        };
        post_recv();
        let conn = req.accept(&qp, &[]).unwrap();
        poll(&cq);
        let (addr, rkey, len) = desc();
        post_recv();
        let op = SendOp::Read {
            remote_addr: addr,
            rkey: RKey(rkey),
        };
        qp.post_send(SendWr::new(3, op, SgeList::one(buf.sge(0, len as usize))))
            .unwrap();
        poll(&cq);
        go_ahead();
        poll(&cq);
        let (addr, rkey, _) = desc();
        if let Some(at) = corrupt {
            buf.write(at, b"!").unwrap();
        }
        let op = SendOp::Write {
            remote_addr: addr,
            rkey: RKey(rkey),
        };
        qp.post_send(SendWr::new(3, op, SgeList::one(buf.sge(0, len as usize))))
            .unwrap();
        poll(&cq);
        go_ahead();
        // Wait for the client to leave.
        while !matches!(
            conn.poll_event(Some(Duration::from_secs(20))),
            Some(CmEvent::Disconnected) | None
        ) {}
    })
}

#[test]
fn validation_catches_wrong_data() {
    // The fake server is faithful: the client verifies and succeeds...
    let server = fake_server("127.62.5.1", 17450, None);
    let out = run(&[
        "-c",
        "-a",
        "127.62.5.1",
        "--bind",
        "127.62.5.2",
        "-p",
        "17450",
        "-V",
        "-C",
        "1",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    server.join().unwrap();
    // ...and when it changes one byte, -V catches it...
    let server = fake_server("127.62.5.1", 17451, Some(20));
    let out = run(&[
        "-c",
        "-a",
        "127.62.5.1",
        "--bind",
        "127.62.5.2",
        "-p",
        "17451",
        "-V",
        "-v",
        "-C",
        "1",
    ]);
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(
        out.stderr.contains("data mismatch! ping 0: byte 20"),
        "{out:#?}"
    );
    assert_eq!(out.stdout, "", "nothing printed for a ping that failed");
    server.join().unwrap();
    // ...which without -V goes unnoticed, as in rping.
    let server = fake_server("127.62.5.1", 17452, Some(20));
    let out = run(&[
        "-c",
        "-a",
        "127.62.5.1",
        "--bind",
        "127.62.5.2",
        "-p",
        "17452",
        "-v",
        "-C",
        "1",
    ]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    let mut want = expected_ping(0, 64);
    want.replace_range(20..21, "!");
    assert_eq!(out.stdout, format!("ping data: {want}\n"));
    server.join().unwrap();
}

#[test]
fn server_killed_mid_run_fails_the_client() {
    let server = start(&["-s", "-a", "127.62.6.1", "-p", "17460"]);
    wait_listening(17460);
    // An endless client.
    let client = start(&[
        "-c",
        "-a",
        "127.62.6.1",
        "--bind",
        "127.62.6.2",
        "-p",
        "17460",
        "-V",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    let mut server = server;
    let server_pid = server.child.id();
    server.child.kill().unwrap();
    let _ = server.finish();
    let out = client.finish();
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(out.stderr.contains("rping client failed"), "{out:#?}");
    // The killed server could not remove its statistics file; the next reader does.
    let killed = run_dir().join(format!("{server_pid}-0.stats"));
    assert!(killed.exists());
    let stats = Command::new(env!("CARGO_BIN_EXE_srdma"))
        .args(["devinfo", "--stats"])
        .env("SRDMA_RUN_DIR", run_dir())
        .output()
        .unwrap();
    assert_eq!(stats.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&stats.stdout).contains(&format!("pid {server_pid} ")));
    assert!(!killed.exists());
}

#[test]
fn pair_between_two_network_namespaces() {
    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let lab = srdma_netlab::Lab::star("rp", 2, 61, 1500).expect("lab");
    let server_addr = lab.hosts[0].addr.to_string();
    let mut cmd = lab.hosts[0].command(env!("CARGO_BIN_EXE_srdma"));
    cmd.arg("rping");
    let server = spawn(cmd, &["-s", "-a", &server_addr, "-v", "-d", "--tcp-cm"]);
    // Messages of 2000 bytes: two packets each at the 1024-byte MTU of 1500-byte Ethernet.
    let t0 = Instant::now();
    let client = loop {
        let mut cmd = lab.hosts[1].command(env!("CARGO_BIN_EXE_srdma"));
        cmd.arg("rping");
        let out = spawn(
            cmd,
            &[
                "-c",
                "-a",
                &server_addr,
                "-v",
                "-V",
                "-C",
                "5",
                "-S",
                "2000",
                "--tcp-cm",
            ],
        )
        .finish();
        let refused = out.code == Some(1) && out.stderr.contains("Connection refused");
        if !refused || t0.elapsed() > Duration::from_secs(20) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let server = server.finish();
    assert_eq!(
        (server.code, client.code),
        (Some(0), Some(0)),
        "{server:#?}\n{client:#?}"
    );
    let want: String = (0..5)
        .map(|n| format!("ping data: {}\n", expected_ping(n, 2000)))
        .collect();
    assert_eq!(client.stdout, want);
    for n in 0..5 {
        let line = format!("server ping data: {}\n", expected_ping(n, 2000));
        assert!(server.stdout.contains(&line), "{server:#?}");
    }
    // The server's device is eth0's, with rxe's MTU for it.
    assert!(
        server
            .stdout
            .contains(&format!("srdma device srdma_eth0 on {server_addr}:")),
        "{server:#?}"
    );
}

#[test]
fn ipv6_pair() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("skipped: no IPv6 loopback");
        return;
    }
    let (s, c) = pair("::1", "::1", 17470, &["-V", "-v", "-S", "3000", "-C", "4"]);
    check_pair(&s, &c, 3000, 4);
}

/// `--ib-cm`: the connection is made with IB CM MADs on QP1 (rdma_cm's wire protocol; the
/// interop run checks it against rdma-core's rping on kernel rxe), pings as usual.
#[test]
fn ib_cm_pair() {
    let server = start(&["-s", "-a", "127.0.82.1", "-v", "--ib-cm"]);
    // No TCP listener to wait for: the client sends its REQ again until the server is up.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let client = run(&[
        "-c",
        "-a",
        "127.0.82.1",
        "--bind",
        "127.0.82.2",
        "-v",
        "-V",
        "-C",
        "5",
        "--ib-cm",
    ]);
    check_pair(&server.finish(), &client, 64, 5);
    // Both on one address: UDP 4791 and QP1 shared, the port keeper forwarding the MADs;
    // no CM option, IB CM being the default.
    let server = start_default(&["-s", "-a", "127.0.82.3", "-v"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let client = start_default(&[
        "-c",
        "-a",
        "127.0.82.3",
        "--bind",
        "127.0.82.3",
        "-v",
        "-V",
        "-C",
        "5",
    ])
    .finish();
    check_pair(&server.finish(), &client, 64, 5);
}
