//! Debian's unmodified socket programs through `srdma exec --rsockets`: redis-server with
//! redis-benchmark and redis-cli, iperf3, sockperf, on one host (one network namespace)
//! and between two (veth); a C program's socket calls compared line by line with the same
//! program on the kernel; peers that are not on rsockets. Every run checks from the
//! programs' own reports (`SRDMA_RS_REPORT`) that rsockets carried the traffic, and every
//! wait is bounded: a failure is an error, never a hang.
//!
//! Needs root (network namespaces), gcc and Debian's redis-server, redis-tools, iperf3 and
//! sockperf (scripts/test.sh installs them); `SRDMA_SKIP_NETNS=1` skips.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

#[path = "../../srdma-verbs/tests/common/mod.rs"]
mod common;

use common::{scratch_dir, text, wait};
use srdma_netlab::{Host, Lab};

/// One test at a time: each runs two busy programs, and the machine may have two cores.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `target/debug/srdma`, with the drop-in library and libsrdma_rspreload.so beside it.
fn srdma() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let st = Command::new(env!("CARGO"))
            .args([
                "build",
                "-q",
                "-p",
                "srdma-verbs",
                "-p",
                "srdma-cli",
                "-p",
                "srdma-rspreload",
            ])
            .current_dir(&root)
            .status()
            .expect("running cargo build");
        assert!(
            st.success(),
            "cargo build -p srdma-verbs -p srdma-cli -p srdma-rspreload failed"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("debug/srdma").canonicalize().unwrap()
    })
}

/// Why this machine cannot run these tests (None: it can).
fn skip() -> Option<String> {
    if let Some(why) = srdma_netlab::skip_reason() {
        return Some(why);
    }
    for t in [
        "redis-server",
        "redis-benchmark",
        "redis-cli",
        "iperf3",
        "sockperf",
        "gcc",
    ] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()));
        if !found {
            return Some(format!(
                "{t} is missing (apt-get install redis-server redis-tools iperf3 sockperf gcc; \
                 scripts/test.sh does)"
            ));
        }
    }
    None
}

macro_rules! skip_unless_able {
    () => {
        if let Some(why) = skip() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// `prog ARGS` in `host`, under `srdma exec --rsockets` when `rs`, its report in `report`.
fn run_in(host: &Host, rs: bool, report: &Path, prog: &str, args: &[&str]) -> Command {
    let mut c = if rs {
        let mut c = host.command(srdma());
        c.args(["exec", "--rsockets", prog]);
        c
    } else {
        host.command(prog)
    };
    c.args(args)
        .env("SRDMA_RS_REPORT", report)
        .env_remove("SRDMA_DEVICES")
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits until process `pid` has a thread named `name` (a listener is up), at most 60 s.
fn wait_thread(pid: u32, name: &str, child: &mut Child) {
    let start = Instant::now();
    loop {
        let found = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
            });
        if found {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the server exited ({st}) before listening");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no {name} thread in {pid} after 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until something listens on TCP `port` in `host` (a kernel server), at most 60 s.
fn wait_port(host: &Host, port: u16) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let out = host
            .run("ss", &["-Hltn", &format!("sport = :{port}")])
            .unwrap_or_default();
        if !out.trim().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on port {port} after 60 s");
}

/// One line of a report: `key=value` pairs.
struct Report(Vec<(String, String)>);

impl Report {
    fn get(&self, k: &str) -> u64 {
        self.0
            .iter()
            .find(|(a, _)| a == k)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }
}

/// The report lines of the processes whose program name contains `prog`.
fn reports(file: &Path, prog: &str) -> Vec<Report> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("prog={prog}")) || l.contains(&format!("/{prog} ")))
        .map(|l| {
            Report(
                l.split_whitespace()
                    .filter_map(|w| w.split_once('='))
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
            )
        })
        .collect()
}

/// Asserts that `prog`'s processes ran on rsockets: connections made or accepted, bytes
/// moved, no connect that fell back to the kernel.
fn assert_on_rsockets(file: &Path, prog: &str) {
    assert_fallbacks(file, prog, 0);
}

/// As [`assert_on_rsockets`], with `n` connects falling back to the kernel in each process
/// (a listener that stays the kernel's, say for IPv6 without an IPv6 device, is no
/// fallback).
fn assert_fallbacks(file: &Path, prog: &str, n: u64) {
    let all = std::fs::read_to_string(file).unwrap_or_default();
    let r = reports(file, prog);
    assert!(!r.is_empty(), "no report of {prog}:\n{all}");
    for x in &r {
        assert!(
            x.get("connected") + x.get("accepted") > 0,
            "{prog} made no rsocket connection:\n{all}"
        );
        assert!(
            x.get("sent") + x.get("received") > 0,
            "{prog} moved nothing:\n{all}"
        );
        assert_eq!(
            x.get("fallbacks"),
            n,
            "{prog}'s connects fell back to the kernel:\n{all}"
        );
    }
}

fn finish(c: Child, what: &str) -> Output {
    wait(c, Duration::from_secs(120), what)
}

fn report_file(name: &str) -> PathBuf {
    let f = scratch_dir("rspreload").join(format!("{name}.report"));
    let _ = std::fs::remove_file(&f);
    f
}

/// redis-server under rsockets, redis-benchmark and redis-cli under rsockets (their SETs
/// read back by GETs), then a plain redis-cli on the kernel (the server's listener accepts
/// both) that shuts the server down.
fn redis(server: &Host, client: &Host, addr: &str, report: &Path) {
    let port = "6380";
    let mut srv = run_in(
        server,
        true,
        report,
        "redis-server",
        &[
            "--port",
            port,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
    )
    .spawn()
    .unwrap();
    wait_thread(srv.id(), "srdma-rs-listen", &mut srv);
    let b = run_in(
        client,
        true,
        report,
        "redis-benchmark",
        &[
            "-h", addr, "-p", port, "-t", "set,get", "-n", "3000", "-c", "20", "-q",
        ],
    )
    .spawn()
    .unwrap();
    let b = finish(b, "redis-benchmark");
    let out = text(&b);
    assert!(b.status.success(), "redis-benchmark: {out}");
    assert!(
        out.contains("SET:") && out.contains("GET:") && !out.to_lowercase().contains("error"),
        "redis-benchmark: {out}"
    );
    for (args, want) in [
        (vec!["set", "srdma", "rsockets"], "OK"),
        (vec!["get", "srdma"], "rsockets"),
        (vec!["dbsize"], ""),
    ] {
        let mut a = vec!["-h", addr, "-p", port];
        a.extend(&args);
        let c = finish(
            run_in(client, true, report, "redis-cli", &a)
                .spawn()
                .unwrap(),
            "redis-cli",
        );
        assert!(c.status.success(), "redis-cli {args:?}: {}", text(&c));
        assert!(
            String::from_utf8_lossy(&c.stdout).contains(want),
            "redis-cli {args:?}: {}",
            text(&c)
        );
    }
    // A client on the kernel's TCP: the rsocket server's listener takes it too.
    let k = finish(
        run_in(
            client,
            false,
            report,
            "redis-cli",
            &["-h", addr, "-p", port, "get", "srdma"],
        )
        .spawn()
        .unwrap(),
        "redis-cli on the kernel",
    );
    assert!(
        String::from_utf8_lossy(&k.stdout).contains("rsockets"),
        "{}",
        text(&k)
    );
    let _ = finish(
        run_in(
            client,
            false,
            report,
            "redis-cli",
            &["-h", addr, "-p", port, "shutdown", "nosave"],
        )
        .spawn()
        .unwrap(),
        "redis-cli shutdown",
    );
    let s = finish(srv, "redis-server");
    assert!(s.status.success(), "redis-server: {}", text(&s));
    assert_on_rsockets(report, "redis-benchmark");
    assert_on_rsockets(report, "redis-cli");
    assert_on_rsockets(report, "redis-server");
}

/// iperf3 for two seconds, its JSON's bytes sent and received equal.
fn iperf3(server: &Host, client: &Host, addr: &str, report: &Path) {
    let mut srv = run_in(server, true, report, "iperf3", &["-s", "-1", "-p", "5211"])
        .spawn()
        .unwrap();
    wait_thread(srv.id(), "srdma-rs-listen", &mut srv);
    let c = run_in(
        client,
        true,
        report,
        "iperf3",
        &["-c", addr, "-p", "5211", "-t", "2", "-J"],
    )
    .spawn()
    .unwrap();
    let c = finish(c, "iperf3 client");
    let s = finish(srv, "iperf3 server");
    assert!(c.status.success(), "iperf3 client: {}", text(&c));
    assert!(s.status.success(), "iperf3 server: {}", text(&s));
    let out = String::from_utf8_lossy(&c.stdout);
    let bytes = |key: &str| -> u64 {
        let at = out.find(key).unwrap_or_else(|| panic!("no {key} in {out}"));
        let rest = &out[at..];
        let b = rest.find("\"bytes\":").expect("bytes") + 8;
        rest[b..]
            .trim_start()
            .split(|ch: char| !ch.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a byte count")
    };
    let (sent, received) = (bytes("\"sum_sent\""), bytes("\"sum_received\""));
    // The server stops counting at the client's TEST_END, which travels on the control
    // connection and may pass the last data in flight on the data connection (over a
    // network, TCP's figures differ the same way).
    assert!(
        sent > 0 && received <= sent && received >= sent / 10 * 9,
        "iperf3 sent {sent}, received {received}"
    );
    assert_on_rsockets(report, "iperf3");
}

/// sockperf ping-pong for a second: every message answered.
fn sockperf(server: &Host, client: &Host, addr: &str, report: &Path) {
    let mut srv = run_in(
        server,
        true,
        report,
        "sockperf",
        &["sr", "--tcp", "-i", addr, "-p", "11311"],
    )
    .spawn()
    .unwrap();
    wait_thread(srv.id(), "srdma-rs-listen", &mut srv);
    let c = run_in(
        client,
        true,
        report,
        "sockperf",
        &["pp", "--tcp", "-i", addr, "-p", "11311", "-t", "1"],
    )
    .spawn()
    .unwrap();
    let c = finish(c, "sockperf client");
    let _ = srv.kill();
    let _ = finish(srv, "sockperf server");
    let out = text(&c);
    assert!(c.status.success(), "sockperf: {out}");
    // The last round trip may be cut by the timer: the valid part's counts match.
    let counts = out
        .split("[Valid Duration]")
        .nth(1)
        .and_then(|r| r.split("SentMessages=").nth(1))
        .and_then(|r| {
            let sent: u64 = r.split(';').next()?.trim().parse().ok()?;
            let recvd: u64 = r
                .split("ReceivedMessages=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some((sent, recvd))
        })
        .unwrap_or_else(|| panic!("no message counts: {out}"));
    assert!(
        counts.0 > 100 && counts.0 == counts.1,
        "sockperf {counts:?}: {out}"
    );
    assert!(out.contains("avg-latency="), "{out}");
    assert_on_rsockets(report, "sockperf");
}

#[test]
fn redis_on_one_host() {
    let _s = serial();
    skip_unless_able!();
    let lab = Lab::star("rsredis", 1, 151, 1500).expect("namespace");
    let h = &lab.hosts[0];
    // 127.0.0.1: srdma's device is on eth0's address; the connection goes to it as rdma_cm
    // resolves loopback on a host without an RDMA device on lo.
    redis(h, h, "127.0.0.1", &report_file("redis1"));
}

#[test]
fn iperf3_and_sockperf_on_one_host() {
    let _s = serial();
    skip_unless_able!();
    let lab = Lab::star("rsperf", 1, 152, 1500).expect("namespace");
    let h = &lab.hosts[0];
    let addr = h.addr.to_string();
    iperf3(h, h, &addr, &report_file("iperf1"));
    sockperf(h, h, &addr, &report_file("sockperf1"));
}

#[test]
fn programs_between_two_namespaces() {
    let _s = serial();
    skip_unless_able!();
    let lab = Lab::star("rs2ns", 2, 153, 1500).expect("namespaces");
    let (a, b) = (&lab.hosts[0], &lab.hosts[1]);
    let addr = a.addr.to_string();
    redis(a, b, &addr, &report_file("redis2"));
    iperf3(a, b, &addr, &report_file("iperf2"));
    sockperf(a, b, &addr, &report_file("sockperf2"));
}

/// A client on rsockets toward a server on the kernel's TCP, and the other way round: the
/// connection is the kernel's, the programs see nothing else.
#[test]
fn peers_not_on_rsockets() {
    let _s = serial();
    skip_unless_able!();
    let lab = Lab::star("rskern", 2, 154, 1500).expect("namespaces");
    let (a, b) = (&lab.hosts[0], &lab.hosts[1]);
    let addr = a.addr.to_string();
    let report = report_file("kernel-peer");
    let srv = run_in(
        a,
        false,
        &report,
        "redis-server",
        &["--port", "6381", "--save", "", "--protected-mode", "no"],
    )
    .spawn()
    .unwrap();
    wait_port(a, 6381);
    // No srdma on the server's host at all: the CM's request goes unanswered, the socket
    // falls back after SRDMA_RS_CONNECT_MS.
    let mut c = run_in(
        b,
        true,
        &report,
        "redis-cli",
        &["-h", &addr, "-p", "6381", "set", "k", "kernel"],
    );
    c.env("SRDMA_RS_CONNECT_MS", "500");
    let c = finish(c.spawn().unwrap(), "redis-cli");
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("OK"),
        "{}",
        text(&c)
    );
    // The same host, where srdma answers that nobody listens: at once.
    let t = Instant::now();
    let c = finish(
        run_in(
            a,
            true,
            &report,
            "redis-cli",
            &["-h", "127.0.0.1", "-p", "6381", "get", "k"],
        )
        .spawn()
        .unwrap(),
        "redis-cli",
    );
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("kernel"),
        "{}",
        text(&c)
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let r = reports(&report, "redis-cli");
    assert_eq!(
        r.len(),
        2,
        "{}",
        std::fs::read_to_string(&report).unwrap_or_default()
    );
    assert!(
        r.iter().all(|x| x.get("fallbacks") == 1),
        "{}",
        std::fs::read_to_string(&report).unwrap_or_default()
    );
    let _ = finish(
        run_in(
            a,
            false,
            &report,
            "redis-cli",
            &["-p", "6381", "shutdown", "nosave"],
        )
        .spawn()
        .unwrap(),
        "shutdown",
    );
    let _ = finish(srv, "redis-server");
}

/// tests/c/sockets.c, a server and a client making the socket calls servers make, prints the
/// same lines on rsockets as on the kernel: descriptor numbers, errno values, readiness,
/// blocking and non-blocking connects, epoll/poll/select over both kinds of descriptor,
/// dup/dup2, fcntl, ioctl, timeouts, fork, shutdown, sendfile, UDP and Unix sockets.
#[test]
fn socket_calls_behave_as_on_the_kernel() {
    let _s = serial();
    skip_unless_able!();
    let dir = scratch_dir("rspreload-c");
    let exe = dir.join("sockets");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/sockets.c");
    let st = Command::new("gcc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc failed");
    let lab = Lab::star("rssem", 1, 155, 1500).expect("namespace");
    let h = &lab.hosts[0];
    // Loopback only in this namespace's device list, as on a host with no other address.
    let run = |rs: bool, port: &str| -> (String, String) {
        let report = report_file(if rs { "c-rs" } else { "c-kernel" });
        let exe = exe.to_str().unwrap();
        let ready = dir.join(if rs { "ready-rs" } else { "ready-kernel" });
        let _ = std::fs::remove_file(&ready);
        let ready = ready.to_str().unwrap();
        let mk = |side: &str| {
            let mut c = run_in(h, rs, &report, exe, &[side, port, ready]);
            c.env("SRDMA_DEVICES", "127.0.0.1");
            c
        };
        let mut srv = mk("server").spawn().unwrap();
        if rs {
            wait_thread(srv.id(), "srdma-rs-listen", &mut srv);
        } else {
            wait_port(h, port.parse().unwrap());
        }
        let c = finish(mk("client").spawn().unwrap(), "sockets client");
        let s = finish(srv, "sockets server");
        assert!(
            c.status.success() && s.status.success(),
            "{}\n{}",
            text(&s),
            text(&c)
        );
        if rs {
            // The client's two refused connects are the kernel's; the other fifteen
            // connections (two, six in one epoll set, then one to each of seven
            // listeners) are rsockets.
            let r = reports(&report, "sockets");
            let all = std::fs::read_to_string(&report).unwrap_or_default();
            assert_eq!(r.len(), 2, "{all}");
            assert!(
                r.iter()
                    .any(|x| x.get("accepted") == 15 && x.get("fallbacks") == 0),
                "{all}"
            );
            assert!(
                r.iter()
                    .any(|x| x.get("connected") == 15 && x.get("fallbacks") == 2),
                "{all}"
            );
        }
        (text(&s), text(&c))
    };
    let kernel = run(false, "17101");
    let rs = run(true, "17102");
    for (k, r, side) in [(&kernel.0, &rs.0, "server"), (&kernel.1, &rs.1, "client")] {
        for (i, (a, b)) in k.lines().zip(r.lines()).enumerate() {
            assert_eq!(a, b, "{side} line {}: kernel\n{k}\nrsockets\n{r}", i + 1);
        }
        assert_eq!(
            k.lines().count(),
            r.lines().count(),
            "{side}: kernel\n{k}\nrsockets\n{r}"
        );
    }
}
