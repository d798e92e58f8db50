//! End-to-end tests of `srdma perf`: a server and a client process over loopback (each pair
//! on its own 127.88.N.x addresses, so the tests run in parallel), and between two network
//! namespaces with srdma-netlab. Every data test runs with `--check`, so the receiving side
//! verifies every byte; every process runs under a deadline and is killed past it.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest any one process may run.
const DEADLINE: Duration = Duration::from_secs(50);

/// A started process whose output is being collected.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
    what: String,
}

/// What a finished process left.
#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

fn spawn(mut cmd: Command, what: String) -> Running {
    let mut child = cmd
        .env_remove("SRDMA_PCAP")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start srdma");
    let out = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    Running {
        child,
        lines,
        stdout,
        stderr,
        what,
    }
}

fn perf(args: &[&str]) -> Running {
    let mut c = Command::new(env!("CARGO_BIN_EXE_srdma"));
    c.arg("perf").args(args);
    spawn(c, format!("srdma perf {}", args.join(" ")))
}

impl Running {
    /// Waits until the server prints its waiting banner (it is listening then).
    fn wait_listening(&self) {
        let t0 = Instant::now();
        while t0.elapsed() < DEADLINE {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(l) if l.contains("Waiting for client") => return,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Waits for the exit; past `DEADLINE` kills the process and fails the test.
    fn finish(mut self) -> Outcome {
        let t0 = Instant::now();
        let code = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.code();
            }
            if t0.elapsed() > DEADLINE {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still running after {DEADLINE:?}\nstdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.stdout.join().unwrap(),
                    self.stderr.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Outcome {
            code,
            stdout: self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
            elapsed: t0.elapsed(),
        }
    }
}

/// Runs a server on 127.88.`net`.1 and a client on 127.88.`net`.2 with the same `args`
/// (plus `server_extra` / `client_extra`).
fn pair_with(
    test: &str,
    net: u8,
    args: &[&str],
    server_extra: &[&str],
    client_extra: &[&str],
) -> (Outcome, Outcome) {
    let (s_ip, c_ip) = (format!("127.88.{net}.1"), format!("127.88.{net}.2"));
    let mut sargs = vec![test, "--bind", &s_ip];
    sargs.extend_from_slice(args);
    sargs.extend_from_slice(server_extra);
    let server = perf(&sargs);
    server.wait_listening();
    let mut cargs = vec![test, &s_ip, "--bind", &c_ip];
    cargs.extend_from_slice(args);
    cargs.extend_from_slice(client_extra);
    let client = perf(&cargs).finish();
    let server = server.finish();
    (server, client)
}

fn pair(test: &str, net: u8, args: &[&str]) -> (Outcome, Outcome) {
    pair_with(test, net, args, &[], &[])
}

fn assert_ok(o: &Outcome, who: &str) {
    assert_eq!(
        o.code,
        Some(0),
        "{who} failed\nstdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
}

/// The result rows of a table: the lines after `header` up to the next dashed line.
fn rows_after<'a>(out: &'a str, header: &str) -> Vec<&'a str> {
    out.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(1)
        .take_while(|l| !l.starts_with("-----"))
        .collect()
}

/// Checks a bandwidth table: one row per size with positive bandwidth, each followed by the
/// CPU line.
fn check_bw(out: &str, sizes: &[u64], iters: u64) {
    let rows = rows_after(out, " #bytes     #iterations    BW peak");
    assert_eq!(
        rows.len(),
        2 * sizes.len(),
        "rows:\n{}\nall:\n{out}",
        rows.join("\n")
    );
    for (i, &size) in sizes.iter().enumerate() {
        let f: Vec<&str> = rows[2 * i].split_whitespace().collect();
        assert_eq!(f.len(), 5, "{}", rows[2 * i]);
        assert_eq!(f[0].parse::<u64>().unwrap(), size);
        assert_eq!(f[1].parse::<u64>().unwrap(), iters);
        let avg: f64 = f[3].parse().unwrap();
        let rate: f64 = f[4].parse().unwrap();
        // perftest prints MB/s with two decimals: a few 2-byte messages can show 0.00.
        assert!(rate > 0.0 && (avg > 0.0 || size < 4096), "{}", rows[2 * i]);
        assert!(
            rows[2 * i + 1].starts_with(" CPU[s/GB]: local "),
            "{}",
            rows[2 * i + 1]
        );
    }
}

/// Checks a latency table: one row, sane figures.
fn check_lat(out: &str, size: u64, iters: u64) {
    let rows = rows_after(out, " #bytes #iterations");
    assert_eq!(rows.len(), 1, "{out}");
    let f: Vec<f64> = rows[0]
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(f.len(), 9, "{}", rows[0]);
    assert_eq!(f[0] as u64, size);
    assert_eq!(f[1] as u64, iters);
    let (min, max, typical, avg) = (f[2], f[3], f[4], f[5]);
    assert!(
        min > 0.0 && min <= typical && typical <= max && min <= avg,
        "{}",
        rows[0]
    );
}

#[test]
fn write_bw_with_check() {
    let (s, c) = pair(
        "write-bw",
        1,
        &["-s", "4096", "-n", "200", "-q", "2", "--check"],
    );
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_bw(&c.stdout, &[4096], 400);
    check_bw(&s.stdout, &[4096], 400);
    assert!(c.stdout.contains("                    RDMA_Write BW Test"));
    assert_eq!(
        c.stdout.matches(" local address: LID 0000 QPN 0x").count(),
        2
    );
}

#[test]
fn read_bw_with_check() {
    let (s, c) = pair("read-bw", 2, &["-s", "8192", "-n", "100", "--check"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_bw(&c.stdout, &[8192], 100);
    assert!(c.stdout.contains(" Outstand reads  : 16"));
}

#[test]
fn send_bw_with_check() {
    let (s, c) = pair("send-bw", 3, &["-s", "3000", "-n", "300", "--check"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_bw(&c.stdout, &[3000], 300);
    assert!(s.stdout.contains(" RX depth        : 512"));
}

#[test]
fn atomic_bw_with_check() {
    let (s, c) = pair("atomic-bw", 4, &["-n", "300", "--check"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_bw(&c.stdout, &[8], 300);
    assert!(c.stdout.contains("Atomic FETCH_AND_ADD BW Test"));
}

#[test]
fn write_lat_with_check() {
    let (s, c) = pair("write-lat", 5, &["-s", "100", "-n", "100", "--check"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_lat(&c.stdout, 100, 100);
    check_lat(&s.stdout, 100, 100);
}

#[test]
fn read_lat_with_check() {
    let (s, c) = pair("read-lat", 6, &["-s", "64", "-n", "100", "--check"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_lat(&c.stdout, 64, 100);
}

#[test]
fn send_lat_with_check_and_events() {
    let (s, c) = pair("send-lat", 7, &["-s", "32", "-n", "100", "--check", "-e"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_lat(&c.stdout, 32, 100);
    check_lat(&s.stdout, 32, 100);
    assert!(c.stdout.contains(" Test with events."));
}

#[test]
fn atomic_lat_with_check() {
    let (s, c) = pair("atomic-lat", 8, &["-n", "100", "--check"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    check_lat(&c.stdout, 8, 100);
}

#[test]
fn all_sizes_are_checked_one_by_one() {
    // -a runs 2 .. 2^23; five iterations each keeps it small.
    let (s, c) = pair("write-bw", 9, &["-a", "-n", "5", "--check", "-m", "4096"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    let sizes: Vec<u64> = (1..=23).map(|e| 1 << e).collect();
    check_bw(&c.stdout, &sizes, 5);
    check_bw(&s.stdout, &sizes, 5);
}

#[test]
fn json_output_with_a_tcp_baseline() {
    let (s, c) = pair_with(
        "write-bw",
        10,
        &["-s", "2048", "-n", "100", "--check", "--baseline", "tcp"],
        &[],
        &["--json"],
    );
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    let v: serde_json::Value =
        serde_json::from_str(&c.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", c.stdout));
    assert_eq!(v["test"], "write-bw");
    assert_eq!(v["role"], "client");
    let r = &v["results"][0];
    assert_eq!(r["bytes"], 2048);
    assert_eq!(r["iterations"], 100);
    assert!(r["bw_avg_mib_s"].as_f64().unwrap() > 0.0);
    assert!(r["cpu_s_per_gb_local"].as_f64().is_some());
    assert!(r["cpu_s_per_gb_remote"].as_f64().is_some());
    assert_eq!(v["baseline"]["kind"], "tcp");
    let b = &v["baseline"]["results"][0];
    assert_eq!(b["iterations"], 100);
    assert!(b["bw_avg_mib_s"].as_f64().unwrap() > 0.0);
    let ratio = v["ratios"][0]["bw"].as_f64().unwrap();
    let want = r["bw_avg_mib_s"].as_f64().unwrap() / b["bw_avg_mib_s"].as_f64().unwrap();
    assert!((ratio - want).abs() < 1e-6 * want, "{ratio} vs {want}");
    // The server printed tables, with the baseline and the ratio.
    assert!(s.stdout.contains("Kernel TCP BW baseline"), "{}", s.stdout);
    assert!(s.stdout.contains(" srdma/tcp ratio:"));
}

#[test]
fn udp_latency_baseline() {
    let (s, c) = pair("send-lat", 11, &["-n", "50", "--baseline", "udp"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    let rows = rows_after(
        c.stdout
            .split("Kernel UDP Latency baseline (ping-pong, busy-poll)")
            .nth(1)
            .unwrap_or_else(|| panic!("no baseline table:\n{}", c.stdout)),
        " #bytes #iterations",
    );
    assert_eq!(rows.len(), 1, "{}", c.stdout);
    assert!(c.stdout.contains(" srdma/udp ratio:"));
}

/// Numbers become `N`, hexadecimal `0xH`, and the spacing of result rows (which follows the
/// figures' widths) is collapsed.
fn normalise(out: &str) -> String {
    let mut res = String::new();
    for line in out.lines() {
        let mut l = String::new();
        let b: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < b.len() {
            if b[i] == '0' && b.get(i + 1) == Some(&'x') {
                i += 2;
                while i < b.len() && b[i].is_ascii_hexdigit() {
                    i += 1;
                }
                l.push_str("0xH");
            } else if b[i].is_ascii_digit() {
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == '.') {
                    i += 1;
                }
                l.push('N');
            } else {
                l.push(b[i]);
                i += 1;
            }
        }
        if l.starts_with(" N ") {
            l = format!(" {}", l.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        res.push_str(&l);
        res.push('\n');
    }
    res
}

fn snapshot(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/perf_snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_SNAPSHOTS=1 writes it)", path.display()));
    assert_eq!(got, want, "output format of {name} changed");
}

#[test]
fn output_format_snapshot() {
    let (s, c) = pair("write-bw", 12, &["-s", "1024", "-n", "50"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    snapshot("write_bw_client.txt", &normalise(&c.stdout));
    snapshot("write_bw_server.txt", &normalise(&s.stdout));
    let (s, c) = pair("send-lat", 13, &["-n", "50"]);
    assert_ok(&c, "client");
    assert_ok(&s, "server");
    snapshot("send_lat_client.txt", &normalise(&c.stdout));
}

#[test]
fn option_mismatch_fails_both_sides() {
    let (s, c) = pair_with(
        "write-bw",
        14,
        &["-n", "100"],
        &["-s", "1024"],
        &["-s", "2048"],
    );
    assert_eq!(s.code, Some(1), "server: {s:?}");
    assert_eq!(c.code, Some(1), "client: {c:?}");
    for o in [&s, &c] {
        assert!(
            o.stderr
                .contains("the options of the server and the client differ")
                && o.stderr
                    .contains("-s/-a (message sizes): server [1024], client [2048]"),
            "{}",
            o.stderr
        );
    }
    assert!(c.stderr.contains("the peer reports"), "{}", c.stderr);
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["nosuch-test"][..],
        &["write-bw", "-s", "0"],
        &["write-bw", "-m", "1500"],
        &["write-bw", "-n", "2"],
        &["write-bw", "-a", "-s", "64"],
        &["write-bw", "-n", "10", "-D", "2"],
        &["atomic-bw", "-a"],
        &["atomic-lat", "-s", "16"],
        &["write-lat", "-q", "2"],
        &["send-bw", "-s", "100000", "--baseline", "udp"],
        &["write-bw", "--bind", "0.0.0.0"],
        &["write-bw", "--bind", "127.88.15.1", "-x", "0"],
    ] {
        let o = perf(args).finish();
        assert_eq!(o.code, Some(2), "{args:?}: {o:?}");
        assert!(o.stderr.contains("error"), "{args:?}: {}", o.stderr);
    }
}

#[test]
fn client_without_server_fails_fast() {
    let o = perf(&[
        "write-bw",
        "127.88.16.1",
        "--bind",
        "127.88.16.2",
        "-n",
        "10",
    ])
    .finish();
    assert_eq!(o.code, Some(1), "{o:?}");
    assert!(o.stderr.contains("could not connect"), "{}", o.stderr);
    assert!(o.elapsed < Duration::from_secs(10), "took {:?}", o.elapsed);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
}

#[test]
fn between_two_namespaces() {
    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let lab = srdma_netlab::Lab::star("perf", 2, 62, 1500).expect("lab");
    let (sh, ch) = (&lab.hosts[0], &lab.hosts[1]);
    let (s_ip, c_ip) = (sh.addr.to_string(), ch.addr.to_string());
    for (test, args) in [
        ("write-bw", &["-s", "65536", "-n", "200", "--check"][..]),
        ("send-lat", &["-s", "64", "-n", "200", "--check"]),
        (
            "read-bw",
            &["-s", "16384", "-n", "200", "--check", "-q", "2"],
        ),
    ] {
        let mut sc = sh.command(env!("CARGO_BIN_EXE_srdma"));
        sc.args(["perf", test, "--bind", &s_ip]).args(args);
        let server = spawn(sc, format!("server {test}"));
        server.wait_listening();
        let mut cc = ch.command(env!("CARGO_BIN_EXE_srdma"));
        cc.args(["perf", test, &s_ip, "--bind", &c_ip]).args(args);
        let c = spawn(cc, format!("client {test}")).finish();
        let s = server.finish();
        assert_ok(&c, test);
        assert_ok(&s, test);
        eprintln!("{test} between {s_ip} and {c_ip}:\n{}", c.stdout);
        if test.ends_with("-bw") {
            let qps: u64 = if test == "read-bw" { 2 } else { 1 };
            let size = args[1].parse().unwrap();
            check_bw(&c.stdout, &[size], 200 * qps);
        } else {
            check_lat(&c.stdout, 64, 200);
        }
        let gid: Vec<String> = c_ip
            .split('.')
            .map(|x| format!("{:02}", x.parse::<u8>().unwrap()))
            .collect();
        assert!(
            c.stdout.contains(&format!(
                " GID: 00:00:00:00:00:00:00:00:00:00:255:255:{}",
                gid.join(":")
            )),
            "{}",
            c.stdout
        );
    }
    // Between hosts too, runs of same-sized packets leave as UDP GSO buffers by default.
    let mut sc = sh.command(env!("CARGO_BIN_EXE_srdma"));
    sc.args([
        "perf", "write-bw", "--bind", &s_ip, "-s", "65536", "-n", "100", "--json",
    ]);
    let server = spawn(sc, "server write-bw --json".into());
    server.wait_listening();
    let mut cc = ch.command(env!("CARGO_BIN_EXE_srdma"));
    cc.args([
        "perf", "write-bw", &s_ip, "--bind", &c_ip, "-s", "65536", "-n", "100", "--json",
    ]);
    let c = spawn(cc, "client write-bw --json".into()).finish();
    let s = server.finish();
    assert_ok(&c, "write-bw --json");
    assert_ok(&s, "write-bw --json");
    let v: serde_json::Value = serde_json::from_str(&c.stdout).expect("perf --json output");
    let gso = v["device_counters"]["tx_gso_messages"]
        .as_u64()
        .unwrap_or(0);
    assert!(gso > 0, "no GSO sends between namespaces: {}", c.stdout);
    // ... once the path probe found that the peer takes cut GSO messages.
    let path = |k: &str| v["device_counters"][k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(
        (path("gso_paths_verified"), path("gso_paths_refused")),
        (1, 0),
        "{}",
        c.stdout
    );
}
