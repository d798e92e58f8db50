//! Middleware on the drop-in libraries, run through `srdma exec`: libfabric's verbs provider
//! (Debian's libfabric-bin 1.17, `fi_pingpong` with data checks) on its three endpoint types,
//! and qperf 0.4.11's RC tests over rdma_cm (`-cm1`).
//!
//! Each test runs a server and a client on 127.0.0.1 (device `srdma_lo`, both processes
//! sharing UDP 4791; libfabric finds a device by an interface address), and fi_pingpong's
//! endpoints also on two hosts (network namespaces, as root), one test at a time: both tools
//! busy-poll, and two cores do not carry two such pairs. A missing tool skips its test with a
//! message (`scripts/test.sh` installs libfabric-bin and qperf).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{Ended, finish};

/// The device both ends use.
const ADDR: &str = "127.0.0.1";
/// The longest a client or a server may run.
const LIMIT: Duration = Duration::from_secs(30);

fn srdma() -> &'static Path {
    common::srdma_bin()
}

/// One test at a time (see the module doc).
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `/usr/bin/NAME`, or None after saying which package would provide it.
fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let p = Path::new("/usr/bin").join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: {} is missing (apt-get install {package}, or run scripts/test.sh as root)",
            p.display()
        );
        None
    }
}

/// `srdma exec --device 127.0.0.1 PROG ARGS...`, output captured.
fn spawn(prog: &Path, args: &[&str]) -> Child {
    spawn_in(None, ADDR, prog, args)
}

/// `srdma exec --device DEVICE PROG ARGS...` in `host`'s namespace (or here), output captured.
fn spawn_in(host: Option<&srdma_netlab::Host>, device: &str, prog: &Path, args: &[&str]) -> Child {
    let mut c = match host {
        Some(h) => h.command(srdma()),
        None => Command::new(srdma()),
    };
    c.args(["exec", "--device", device])
        .arg(prog)
        .args(args)
        // A libfabric or srdma setting of the caller's must not change what is tested.
        .env_remove("FI_PROVIDER")
        .env_remove("FI_VERBS_GID_IDX")
        .env_remove("FI_UNIVERSE_SIZE")
        .env_remove("SRDMA_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn pair(
    prog: &Path,
    server: &[&str],
    client: &[&str],
    ready: impl Fn() -> bool,
    linger: Duration,
) -> (Ended, Ended) {
    let srv = spawn(prog, server);
    let start = Instant::now();
    while !ready() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = finish(spawn(prog, client), Instant::now() + LIMIT);
    let srv = finish(srv, Instant::now() + linger);
    (srv, cli)
}

/// True once some process listens on TCP `port` of any address (/proc/net/tcp{,6}).
fn listening(port: u16) -> bool {
    listening_in(port, |f| std::fs::read_to_string(f).unwrap_or_default())
}

/// As [`listening`], reading the tables with `read` (e.g. inside a namespace).
fn listening_in(port: u16, read: impl Fn(&str) -> String) -> bool {
    let needle = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        read(f).lines().any(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            // local_address is the second column; state 0A is LISTEN.
            c.len() > 3 && c[1].ends_with(&needle) && c[3] == "0A"
        })
    })
}

fn show(what: &str, e: &Ended) -> String {
    format!("{what}: status {:?}\n{}", e.status, e.out)
}

/// The rows of fi_pingpong's table: (size, sent, acknowledged).
fn pingpong_rows(out: &str) -> Vec<(String, String, String)> {
    out.lines()
        .skip_while(|l| !l.starts_with("bytes"))
        .skip(1)
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (c.len() == 8).then(|| (c[0].into(), c[1].into(), c[2].into()))
        })
        .collect()
}

/// fi_pingpong with data checks (`-c`) over every size it tries by default, both ends on
/// `srdma_lo`; both must exit 0 and report every message of every size acknowledged.
/// `ctrl_port` lies below Linux's ephemeral range (32768–60999), so no outgoing connection
/// of another test can hold it.
fn fi_pingpong(provider: &str, ep: &str, ctrl_port: u16, sizes: &[&str]) {
    let Some(prog) = tool("fi_pingpong", "libfabric-bin") else {
        return;
    };
    let _g = serial();
    let port = ctrl_port.to_string();
    let common = ["-p", provider, "-e", ep, "-I", "20", "-c"];
    let mut server = common.to_vec();
    server.extend(["-B", &port]);
    let mut client = common.to_vec();
    client.extend(["-P", &port, ADDR]);
    let (s, c) = pair(
        &prog,
        &server,
        &client,
        || listening(ctrl_port),
        Duration::from_secs(10),
    );
    check_pingpong(ep, sizes, &s, &c);
}

/// Both ends of a `fi_pingpong -e EP` run exited 0 and each printed a row per size in
/// `sizes`, every one with 20 messages sent and 20 acknowledged.
fn check_pingpong(ep: &str, sizes: &[&str], s: &Ended, c: &Ended) {
    let all = format!("{}\n{}", show("server", s), show("client", c));
    assert!(s.ok() && c.ok(), "fi_pingpong -e {ep} failed\n{all}");
    for (who, e) in [("server", s), ("client", c)] {
        let rows = pingpong_rows(&e.out);
        let got: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(got, sizes, "{who}'s sizes\n{all}");
        for (size, sent, ack) in &rows {
            assert!(
                sent == "20" && ack == "=20",
                "{who}: {size} bytes: {sent} sent, {ack} acknowledged\n{all}"
            );
        }
    }
}

/// The connected endpoint (FI_EP_MSG over rdma_cm, RC).
#[test]
fn fi_pingpong_msg() {
    fi_pingpong(
        "verbs",
        "msg",
        27711,
        &["64", "256", "1k", "4k", "64k", "1m"],
    );
}

/// The reliable datagram endpoint: ofi_rxm over verbs MSG endpoints. Its MSG CQ holds
/// (128 receives + 128 sends) × 256 (the universe size) = 65536 entries: more than rxe's
/// max_cqe, so on rxe `fi_enable` fails with EINVAL ("Unable to create verbs CQ").
#[test]
fn fi_pingpong_rdm() {
    fi_pingpong(
        "verbs;ofi_rxm",
        "rdm",
        27712,
        &["64", "256", "1k", "4k", "64k", "1m"],
    );
}

/// The reliable datagram endpoint over the datagram one: ofi_rxd (its own sequencing,
/// acknowledgements and segmentation) over verbs UD.
#[test]
fn fi_pingpong_rdm_over_dgram() {
    fi_pingpong(
        "verbs;ofi_rxd",
        "rdm",
        27715,
        &["64", "256", "1k", "4k", "64k", "1m"],
    );
}

/// The datagram endpoint (UD): endpoints name themselves by GID index 0, srdma's link-local
/// GID, which must reach the device's IPv4 address. Sizes up to the path MTU (4096 on lo).
#[test]
fn fi_pingpong_dgram() {
    fi_pingpong("verbs", "dgram", 27713, &["64", "256", "1k", "4k"]);
}

/// fi_pingpong between two hosts (network namespaces joined by veth, MTU 1500, so a path
/// MTU of 1024), srdma at both ends, each end given its host's device (`--device`, what the
/// default list holds there too): both must exit 0 and report every message of every size in
/// `sizes` acknowledged.
///
/// The server takes no address: libfabric's verbs provider binds "localhost", which the
/// kernel's rdma_cm takes as a wildcard (no device), and then gives each device's endpoint
/// that device's interface address, which the server sends the client. srdma binds a
/// loopback address so when no device of its own has it (with `srdma_lo` listed, the server
/// stays on 127.0.0.1, which the client cannot reach).
fn fi_pingpong_between_namespaces(provider: &str, ep: &str, ctrl_port: u16, sizes: &[&str]) {
    let Some(prog) = tool("fi_pingpong", "libfabric-bin") else {
        return;
    };
    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _g = serial();
    let lab = srdma_netlab::Lab::star("fi", 2, 95, 1500).expect("creating namespaces");
    let (h0, h1) = (&lab.hosts[0], &lab.hosts[1]);
    let (sa, ca) = (h0.addr.to_string(), h1.addr.to_string());
    let port = ctrl_port.to_string();
    let common = ["-p", provider, "-e", ep, "-I", "20", "-c"];
    let mut server = common.to_vec();
    server.extend(["-B", &port]);
    let mut client = common.to_vec();
    client.extend(["-P", &port, &sa]);
    let srv = spawn_in(Some(h0), &sa, &prog, &server);
    let start = Instant::now();
    while !listening_in(ctrl_port, |f| h0.run("cat", &[f]).unwrap_or_default())
        && start.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = finish(
        spawn_in(Some(h1), &ca, &prog, &client),
        Instant::now() + LIMIT,
    );
    let s = finish(srv, Instant::now() + Duration::from_secs(10));
    check_pingpong(ep, sizes, &s, &c);
}

/// The datagram endpoint between two hosts: the link-local GID 0 each end names itself by
/// reaches the other's address. Sizes up to the path MTU.
#[test]
fn fi_pingpong_dgram_between_two_namespaces() {
    fi_pingpong_between_namespaces("verbs", "dgram", 27714, &["64", "256", "1k"]);
}

/// The connected endpoint between two hosts, srdma the server.
#[test]
fn fi_pingpong_msg_between_two_namespaces() {
    fi_pingpong_between_namespaces(
        "verbs",
        "msg",
        27716,
        &["64", "256", "1k", "4k", "64k", "1m"],
    );
}

/// The reliable datagram endpoint (ofi_rxm over verbs MSG endpoints) between two hosts,
/// srdma the server.
#[test]
fn fi_pingpong_rdm_between_two_namespaces() {
    fi_pingpong_between_namespaces(
        "verbs;ofi_rxm",
        "rdm",
        27717,
        &["64", "256", "1k", "4k", "64k", "1m"],
    );
}

/// `qperf OPTIONS 127.0.0.1 TESTS` against a fresh server on TCP `port`, one second a test.
fn qperf(port: u16, options: &[&str], tests: &[&str]) -> Option<(Ended, Ended)> {
    let prog = tool("qperf", "qperf")?;
    let p = port.to_string();
    // -to: a loaded machine may take more than the default 5 s to exchange results.
    let mut client = vec!["-lp", &p, "-t", "1", "-to", "20"];
    client.extend(options);
    client.push(ADDR);
    client.extend(tests);
    Some(pair(
        &prog,
        &["-lp", &p],
        &client,
        || listening(port),
        Duration::from_millis(500),
    ))
}

/// qperf's RC tests over rdma_cm: every one reports a non-zero result.
#[test]
fn qperf_rc_over_rdma_cm() {
    let _g = serial();
    let tests = [
        ("rc_bw", "bw"),
        ("rc_lat", "latency"),
        ("rc_rdma_write_bw", "bw"),
        ("rc_rdma_write_lat", "latency"),
        ("rc_rdma_read_bw", "bw"),
        ("rc_rdma_read_lat", "latency"),
        ("rc_compare_swap_mr", "msg_rate"),
        ("rc_fetch_add_mr", "msg_rate"),
    ];
    let mut names: Vec<&str> = tests.iter().map(|t| t.0).collect();
    // `quit` ends the server.
    names.push("quit");
    let Some((s, c)) = qperf(19781, &["-cm1"], &names) else {
        return;
    };
    let all = format!("{}\n{}", show("server", &s), show("client", &c));
    assert!(c.ok() && s.ok(), "qperf failed\n{all}");
    let lines: Vec<&str> = c.out.lines().collect();
    for (name, field) in tests {
        let at = lines
            .iter()
            .position(|l| *l == format!("{name}:"))
            .unwrap_or_else(|| panic!("no {name} in\n{all}"));
        let value = lines
            .get(at + 1)
            .and_then(|l| l.trim().strip_prefix(field))
            .and_then(|l| l.trim().strip_prefix('='))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {field} for {name} in\n{all}"));
        assert!(value > 0.0, "{name}: {field} {value}\n{all}");
    }
}

/// Without rdma_cm (the default, and always for UC and UD) qperf exchanges LIDs and builds
/// addresses without a GRH, which a RoCE device refuses: the same messages and errno as on
/// rxe, and an exit status of 1, not a hang.
#[test]
fn qperf_without_rdma_cm_fails_as_on_rxe() {
    let _g = serial();
    let rtr = "failed to modify QP to RTR: Invalid argument";
    let ah = "failed to create address handle: Invalid argument";
    for (port, args, test, want) in [
        (19782, &[][..], "rc_bw", rtr),
        (19783, &["-cm1"][..], "uc_lat", rtr),
        (19784, &["-cm1"][..], "ud_lat", ah),
    ] {
        let Some((s, c)) = qperf(port, args, &[test]) else {
            return;
        };
        let all = format!("{}\n{}", show("server", &s), show("client", &c));
        assert_eq!(
            c.status.and_then(|s| s.code()),
            Some(1),
            "qperf {args:?} {test}\n{all}"
        );
        assert!(
            all.contains(want),
            "qperf {args:?} {test}: no {want:?}\n{all}"
        );
    }
}

/// Compiles `tests/c/NAME.c` against the system's headers into the scratch directory (None,
/// after saying why, without a C compiler).
fn compile_c(name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let prog = common::scratch_dir("middleware").join(name);
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&prog)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-lpthread"])
        .output();
    match cc {
        Err(e) => {
            eprintln!("skipped: cannot run cc ({e}): install gcc");
            None
        }
        Ok(o) => {
            assert!(
                o.status.success(),
                "compiling {name}.c failed (libibverbs-dev, librdmacm-dev installed?): {}",
                String::from_utf8_lossy(&o.stderr)
            );
            Some(prog)
        }
    }
}

/// A program that owns its signals (tests/c/signalfd_traffic.c): with its rdma_cm connection
/// up, it blocks SIGUSR2 and SIGRTMIN and reads them through a signalfd while RDMA WRITEs and
/// READs run and two threads `kill` and `sigqueue` the process; every signal arrives there
/// (none goes to one of srdma's threads, where SIGUSR2 ended the process), every other thread
/// blocks them but not SIGSEGV, and fork and exec work meanwhile.
#[test]
fn a_program_reads_its_signals_through_a_signalfd_during_traffic() {
    let _one = serial();
    let Some(prog) = compile_c("signalfd_traffic") else {
        return;
    };
    let e = finish(spawn(&prog, &["7391"]), Instant::now() + LIMIT);
    assert!(
        e.ok() && e.out.contains("signalfd_traffic: ok"),
        "{}",
        show("signalfd_traffic", &e)
    );
}

/// `pthread_cancel` of a thread blocked in `rdma_get_cm_event`, `ibv_get_cq_event` or
/// `ibv_get_async_event` (tests/c/cancel_wait.c) ends it, as on a kernel device where each
/// wait is a read(2), a cancellation point: libiscsi's iSER transport cancels its CM thread
/// on every disconnect (glibc's forced unwind met the library's panic boundary and aborted
/// the process: "FATAL: exception not rethrown").
#[test]
fn a_thread_waiting_for_an_event_can_be_cancelled() {
    let Some(prog) = compile_c("cancel_wait") else {
        return;
    };
    let e = finish(spawn(&prog, &[]), Instant::now() + LIMIT);
    assert!(
        e.ok() && e.out.contains("cancel_wait: ok"),
        "{}",
        show("cancel_wait", &e)
    );
}

/// `ibv_get_cq_event`, `rdma_get_cm_event` and signals (tests/c/event_signal.c): a handler
/// without `SA_RESTART` ends the wait with EINTR, as it ends rdma-core's read(2) or write(2)
/// of the kernel's channel; qperf's event-mode tests end so, and hung at random before (the
/// server waited for a message its stopped client would not send).
#[test]
fn a_signal_ends_an_event_wait_as_on_a_kernel_device() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/event_signal.c");
    let prog = common::scratch_dir("middleware").join("event_signal");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&prog)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-lpthread"])
        .output();
    match cc {
        Err(e) => {
            eprintln!("skipped: cannot run cc ({e}): install gcc");
            return;
        }
        Ok(o) => assert!(
            o.status.success(),
            "compiling event_signal.c failed (libibverbs-dev, librdmacm-dev installed?): {}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
    let e = finish(spawn(&prog, &[]), Instant::now() + LIMIT);
    assert!(
        e.ok() && e.out.contains("event_signal: ok"),
        "{}",
        show("event_signal", &e)
    );
}
