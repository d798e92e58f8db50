//! Debian's unmodified rdma-core and perftest binaries on the drop-in libibverbs.so.1.
//!
//! Each test puts the library built from this crate first on the loader's path and runs the
//! tools from `/usr/bin` (packages ibverbs-utils and perftest; `scripts/test.sh` installs
//! them), both ends on this host: the server on one loopback address, the client on another
//! (`SRDMA_DEVICES`), every test on its own addresses and TCP port so they run in parallel.

mod common;

use common::{lib_dir, wait};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The Debian binary `name`, or a panic that says which package to install.
fn tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: install ibverbs-utils and perftest (apt-get install ibverbs-utils \
         perftest), or run scripts/test.sh as root",
        p.display()
    );
    p
}

fn cmd(name: &str, devices: &str, args: &[&str]) -> Command {
    let mut c = Command::new(tool(name));
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SRDMA_DEVICES", devices)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a server and, once it listens, a client; both must exit 0. Returns both outputs.
/// An even `net` puts both on one address (sharing UDP 4791, as two processes share a
/// kernel device), an odd one on two.
fn pair(name: &str, net: u8, server: &[&str], client: &[&str]) -> (Output, Output) {
    pair_env(name, net, &[], server, client)
}

/// [`pair`] with environment variables `env` set for both sides.
fn pair_env(
    name: &str,
    net: u8,
    env: &[(&str, &str)],
    server: &[&str],
    client: &[&str],
) -> (Output, Output) {
    let sa = format!("127.0.{net}.1");
    let ca = if net % 2 == 0 {
        sa.clone()
    } else {
        format!("127.0.{net}.2")
    };
    let with_env = |mut c: Command| {
        c.envs(env.iter().copied());
        c
    };
    let srv = with_env(cmd(name, &sa, server)).spawn().unwrap();
    // ibv_*_pingpong clients try their TCP connect once: start them once the server listens.
    let port = server
        .iter()
        .position(|a| *a == "-p")
        .and_then(|i| server.get(i + 1))
        .and_then(|p| p.parse().ok());
    match port {
        Some(p) => wait_listen(p),
        None => std::thread::sleep(Duration::from_millis(400)),
    }
    let mut cargs: Vec<&str> = client.to_vec();
    cargs.push(&sa);
    let cli = with_env(cmd(name, &ca, &cargs)).spawn().unwrap();
    let c = wait(cli, Duration::from_secs(60), &format!("{name} client"));
    let s = wait(srv, Duration::from_secs(60), &format!("{name} server"));
    assert!(
        s.status.success() && c.status.success(),
        "{name} server: {}\n{name} client: {}",
        text(&s),
        text(&c)
    );
    (s, c)
}

/// Waits (10 s at most) until some process listens on TCP `port` (/proc/net/tcp{,6}).
fn wait_listen(port: u16) {
    wait_listen_with(port, |f| std::fs::read_to_string(f).unwrap_or_default());
}

/// As [`wait_listen`], reading the tables with `read` (e.g. inside a namespace).
fn wait_listen_with(port: u16, read: impl Fn(&str) -> String) {
    let needle = format!(":{port:04X} ");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let t = read(f);
            // local_address is the second column; state 0A is LISTEN.
            if t.lines().any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && format!("{} ", c[1]).ends_with(&needle) && c[3] == "0A"
            }) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ibv_devices_lists_the_configured_devices() {
    let o = cmd("ibv_devices", "first=127.0.9.1,127.0.9.2", &[])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains("first"), "{out}");
    // 127.0.9.2 is not an interface address of its own: named by position.
    assert!(out.contains("srdma1"), "{out}");
    // The node GUID is made from the address, as srdma devinfo makes it.
    assert!(out.contains("027f00fffe0901b7"), "{out}");
}

#[test]
fn ibv_devinfo_shows_an_rxe_like_device() {
    let o = cmd("ibv_devinfo", "127.0.9.3", &["-v"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    for want in [
        "transport:\t\t\tInfiniBand (0)",
        "vendor_id:\t\t\t0xffffff",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "::ffff:127.0.9.3, RoCE v2",
        "phys_port_cnt:\t\t\t1",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
}

#[test]
fn ibv_devinfo_without_devices_says_so() {
    let o = cmd("ibv_devinfo", "", &[])
        .env("SRDMA_DEVICES", "#none")
        .output()
        .unwrap();
    let all = text(&o);
    assert!(!o.status.success(), "{all}");
    assert!(all.contains("No IB devices found"), "{all}");
}

#[test]
fn ibv_rc_pingpong_sizes_and_events() {
    for (i, (size, events)) in [(64, false), (4096, true), (65536, false), (200_000, true)]
        .into_iter()
        .enumerate()
    {
        let port = (18520 + i).to_string();
        let size = size.to_string();
        // -c: both ends check every received byte.
        let mut args = vec!["-g", "1", "-n", "50", "-s", &size, "-p", &port, "-c"];
        if events {
            args.push("-e");
        }
        let (s, c) = pair("ibv_rc_pingpong", 10 + i as u8, &args, &args);
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(out.contains("50 iters"), "{}", text(&c));
        assert!(String::from_utf8_lossy(&s.stdout).contains("50 iters"));
    }
}

#[test]
fn ibv_ud_pingpong() {
    let args = ["-g", "1", "-n", "50", "-s", "1024", "-p", "18530"];
    let (_, c) = pair("ibv_ud_pingpong", 20, &args, &args);
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("50 iters"),
        "{}",
        text(&c)
    );
}

#[test]
fn ibv_srq_pingpong() {
    for (i, (size, events)) in [("4096", false), ("65536", true), ("1", false)]
        .into_iter()
        .enumerate()
    {
        let port = (18540 + i).to_string();
        let mut args = vec!["-g", "1", "-n", "50", "-s", size, "-q", "4", "-p", &port];
        if events {
            args.push("-e");
        }
        let (_, c) = pair("ibv_srq_pingpong", 30 + i as u8, &args, &args);
        assert!(
            String::from_utf8_lossy(&c.stdout).contains("iters"),
            "{}",
            text(&c)
        );
    }
}

fn perftest(name: &str, net: u8, port: u16, extra: &[&str]) -> String {
    let port = port.to_string();
    let mut args = vec!["-x", "1", "-p", &port];
    args.extend_from_slice(extra);
    let (_, c) = pair(name, net, &args, &args);
    let mut s = String::new();
    s.push_str(&String::from_utf8_lossy(&c.stdout));
    s
}

#[test]
fn perftest_bandwidth() {
    for (i, (name, extra)) in [
        ("ib_write_bw", &["-s", "65536", "-n", "200"][..]),
        ("ib_read_bw", &["-s", "65536", "-n", "200"][..]),
        ("ib_send_bw", &["-s", "4096", "-n", "200"][..]),
        ("ib_atomic_bw", &["-n", "200"][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let out = perftest(name, 40 + i as u8, 18550 + i as u16, extra);
        assert!(out.contains("BW average"), "{name}: {out}");
    }
}

#[test]
fn perftest_latency() {
    for (i, (name, extra)) in [
        ("ib_write_lat", &["-s", "8", "-n", "200"][..]),
        ("ib_send_lat", &["-s", "8", "-n", "200"][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let out = perftest(name, 50 + i as u8, 18560 + i as u16, extra);
        assert!(out.contains("t_avg"), "{name}: {out}");
    }
}

/// READs through shared memory with their payload pulled from the responder's process
/// (`SRDMA_SHM_PULL=1`: by default only where processes outnumber the cores): Debian's
/// ib_read_bw at 64 KiB and 1 MiB, and ib_read_lat, as two processes of one address. The
/// devices' statistics files (`SRDMA_RUN_DIR`, written once a second while they run) must
/// show pulled READ responses and no failed pull — where the shared memory is on (the test
/// script runs this file over UDP too).
#[test]
fn perftest_reads_pulled_from_the_responders_memory() {
    let shm = std::env::var_os("SRDMA_SHM").is_none_or(|v| v != "0");
    let run_dir = lib_dir().join(format!("pull-stats-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir).unwrap();
    let dir = run_dir.to_str().unwrap();
    for (i, (name, extra)) in [
        ("ib_read_bw", &["-s", "65536", "-D", "3"][..]),
        ("ib_read_bw", &["-s", "1048576", "-n", "100"][..]),
        ("ib_read_lat", &["-s", "65536", "-n", "200"][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18590 + i).to_string();
        let mut args = vec!["-x", "1", "-p", &port];
        args.extend_from_slice(extra);
        // What the statistics files say while the pair runs: the most pulled, and failed.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = {
            let (done, run_dir) = (done.clone(), run_dir.clone());
            std::thread::spawn(move || {
                let mut most = (0, 0);
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let (pulled, failed) = pull_counters(&run_dir);
                    most = (most.0.max(pulled), most.1.max(failed));
                    std::thread::sleep(Duration::from_millis(50));
                }
                most
            })
        };
        let env = [("SRDMA_SHM_PULL", "1"), ("SRDMA_RUN_DIR", dir)];
        let (_, c) = pair_env(name, 68, &env, &args, &args);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let (pulled, failed) = watch.join().unwrap();
        let out = String::from_utf8_lossy(&c.stdout);
        let want = if name == "ib_read_lat" {
            "t_avg"
        } else {
            "BW average"
        };
        assert!(out.contains(want), "{name} {extra:?}: {}", text(&c));
        assert_eq!(failed, 0, "{name} {extra:?}: pulls failed");
        if shm && i == 0 {
            // The run of 3 s: its files were written with traffic under way.
            assert!(pulled > 0, "{name} {extra:?}: no READ response pulled");
        }
    }
    let _ = std::fs::remove_dir_all(&run_dir);
}

/// The sums over the statistics files in `dir` of `rx_shm_pulled` and `rx_shm_pull_failed`.
fn pull_counters(dir: &Path) -> (u64, u64) {
    let mut sums = (0, 0);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines() {
            let mut f = line.split(' ');
            let (Some("counter"), Some(key), Some(v)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match key {
                "rx_shm_pulled" => sums.0 += v,
                "rx_shm_pull_failed" => sums.1 += v,
                _ => {}
            }
        }
    }
    sums
}

/// Two processes each sending to the other on 64 QPs over UDP (`ib_write_bw -b -q 64`):
/// the QPs toward one peer keep no more in flight than its socket buffer holds. Before,
/// both sockets overran, go-back-N resent windows and `retry_cnt` ran out (`Failed status
/// 12`, in every run). And a local ACK timeout of 8 µs (`-u 1`) runs at rxe's floor of 4 ms,
/// so a 1 MiB READ completes (before: `RETRY_EXC_ERR` on the first READ, every run).
#[test]
fn perftest_many_qps_both_ways_over_udp_and_a_short_ack_timeout() {
    for (i, (name, extra, shm)) in [
        ("ib_write_bw", &["-b", "-q", "64", "-D", "2"][..], "0"),
        (
            "ib_read_bw",
            &["-u", "1", "-s", "1048576", "-n", "50"][..],
            "1",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18580 + i).to_string();
        let mut args = vec!["-x", "1", "-p", &port];
        args.extend_from_slice(extra);
        let (_, c) = pair_env(
            name,
            56 + 2 * i as u8 + 1,
            &[("SRDMA_SHM", shm)],
            &args,
            &args,
        );
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(out.contains("BW average"), "{name} {extra:?}: {}", text(&c));
    }
}

/// Compiles `tests/c/NAME.c` against the installed verbs.h and the system's -libverbs (what a
/// user does), into a file of its own per call (tests run in parallel).
fn c_program(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = lib_dir().join(format!("{name}-{k}"));
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("running cc: install gcc");
    assert!(
        o.status.success(),
        "compiling {name}.c failed (libibverbs-dev installed?): {}",
        text(&o)
    );
    out
}

fn c_cmd(prog: &Path, devices: &str, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SRDMA_DEVICES", devices)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn bad_input_gets_rdma_core_errors() {
    let prog = c_program("bad_input");
    let o = wait(
        c_cmd(&prog, "127.0.60.1", &[]).spawn().unwrap(),
        Duration::from_secs(60),
        "bad_input",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.contains("0 failures"), "{out}");
    // Every check ran (a crash would stop the list early).
    assert!(
        out.lines().filter(|l| l.starts_with("ok ")).count() >= 45,
        "{out}"
    );
}

#[test]
fn device_failure_is_reported_not_hung() {
    let prog = c_program("bad_input");
    let o = wait(
        c_cmd(&prog, "127.0.61.1", &["fatal"])
            .env("SRDMA_INJECT_DEVICE_FAILURE_MS", "300")
            .env("RUST_BACKTRACE", "0")
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
        "bad_input fatal",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ok fatal-flush"));
}

/// The seed scenario as a C program: A writes into B, B forwards by SEND to C; all three
/// processes on one address (sharing UDP 4791), then on three.
#[test]
fn seed_scenario_chain_of_three_c_processes() {
    let prog = c_program("chain");
    for (k, devs) in [
        ["127.0.62.1"; 3],
        ["127.0.63.1", "127.0.63.2", "127.0.63.3"],
    ]
    .iter()
    .enumerate()
    {
        let size = "3000000";
        let (pb, pc) = ((19100 + 2 * k).to_string(), (19101 + 2 * k).to_string());
        let c = c_cmd(&prog, devs[2], &["c", size, &pc]).spawn().unwrap();
        let b = c_cmd(&prog, devs[1], &["b", size, &pb, "127.0.0.1", &pc])
            .spawn()
            .unwrap();
        let a = c_cmd(&prog, devs[0], &["a", size, "127.0.0.1", &pb])
            .spawn()
            .unwrap();
        for (name, p) in [("a", a), ("b", b), ("c", c)] {
            let o = wait(p, Duration::from_secs(60), name);
            assert!(o.status.success(), "chain {name} on {devs:?}: {}", text(&o));
        }
    }
}

/// Two hosts (network namespaces joined by veth, MTU 1500): ibv_rc_pingpong picks its
/// device by name (`-d srdma_eth0`, the interface rule), ib_write_bw and ib_read_bw by
/// `SRDMA_DEVICES`.
#[test]
fn tools_between_two_namespaces() {
    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let lab = srdma_netlab::Lab::star("verbs", 2, 91, 1500).expect("creating namespaces");
    let (h0, h1) = (&lab.hosts[0], &lab.hosts[1]);
    let server_addr = h0.addr.to_string();
    let in_ns = |h: &srdma_netlab::Host, prog: &str, args: &[&str], devices: Option<&str>| {
        let mut c = h.command(tool(prog));
        c.args(args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match devices {
            Some(d) => c.env("SRDMA_DEVICES", d),
            None => c.env_remove("SRDMA_DEVICES"),
        };
        c
    };
    let runs: [(&str, Vec<&str>, bool); 3] = [
        (
            "ibv_rc_pingpong",
            vec![
                "-d",
                "srdma_eth0",
                "-g",
                "1",
                "-n",
                "100",
                "-s",
                "65536",
                "-c",
            ],
            false,
        ),
        (
            "ib_write_bw",
            vec!["-x", "1", "-s", "65536", "-n", "500"],
            true,
        ),
        (
            "ib_read_bw",
            vec!["-x", "1", "-s", "65536", "-n", "500"],
            true,
        ),
    ];
    for (prog, args, by_env) in runs {
        let d0 = by_env.then_some(server_addr.as_str());
        let d1s = h1.addr.to_string();
        let d1 = by_env.then_some(d1s.as_str());
        let srv = in_ns(h0, prog, &args, d0).spawn().unwrap();
        // Both tools listen on TCP 18515 by default.
        wait_listen_with(18515, |f| h0.run("cat", &[f]).unwrap_or_default());
        let mut cargs = args.clone();
        cargs.push(&server_addr);
        let cli = in_ns(h1, prog, &cargs, d1).spawn().unwrap();
        let c = wait(cli, Duration::from_secs(60), prog);
        let s = wait(srv, Duration::from_secs(60), prog);
        assert!(s.status.success(), "{prog} server: {}", text(&s));
        assert!(c.status.success(), "{prog} client: {}", text(&c));
    }
}

/// `name version` of every symbol `objdump -T` shows `lib` defining under an IBVERBS node
/// (a hidden, non-default version in parentheses, as objdump prints it).
fn exports(lib: &Path) -> std::collections::BTreeSet<String> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils)");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("IBVERBS") && !l.contains("*UND*") && !l.contains("*ABS*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 2).then(|| format!("{} {}", f[f.len() - 1], f[f.len() - 2]))
        })
        .collect()
}

/// Every symbol Debian's libibverbs.so.1 exports, under the same version, except the
/// IBVERBS_1.0 compatibility variants of 1.1 functions (old layouts no bookworm binary
/// binds); and the provider libraries perftest links, and librdmacm, resolve against it.
#[test]
fn exports_match_debians_libibverbs() {
    let debian = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    assert!(
        debian.exists(),
        "install libibverbs1 (a dependency of ibverbs-utils)"
    );
    let ours = exports(&lib_dir().join("libibverbs.so.1"));
    let theirs: std::collections::BTreeSet<String> = exports(debian)
        .into_iter()
        .filter(|s| !s.ends_with(" (IBVERBS_1.0)"))
        .collect();
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    assert!(extra.is_empty(), "exported beyond Debian's: {extra:?}");
    assert!(ours.len() >= 140, "{}", ours.len());
    for lib in ["libmlx5.so.1", "libefa.so.1", "librdmacm.so.1"] {
        let o = Command::new("ldd")
            .arg("-r")
            .arg(Path::new("/usr/lib/x86_64-linux-gnu").join(lib))
            .env("LD_LIBRARY_PATH", lib_dir())
            .output()
            .unwrap();
        let out = text(&o);
        assert!(
            out.contains(&lib_dir().display().to_string()),
            "{lib} did not load ours: {out}"
        );
        assert!(!out.contains("undefined symbol"), "{lib}: {out}");
    }
}

/// The extended API: `ibv_create_cq_ex` with `ibv_start_poll`, `ibv_create_qp_ex` with the
/// `ibv_wr_*` send API (tests/c/ex_api.c), and `ibv_rc_pingpong -N`, which uses it.
#[test]
fn extended_cq_and_qp_api() {
    let prog = c_program("ex_api");
    let o = wait(
        c_cmd(&prog, "127.0.64.1", &[]).spawn().unwrap(),
        Duration::from_secs(60),
        "ex_api",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 failures"));
    let args = [
        "-g", "1", "-n", "50", "-s", "4096", "-N", "-c", "-p", "18570",
    ];
    let (_, c) = pair("ibv_rc_pingpong", 65, &args, &args);
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("50 iters"),
        "{}",
        text(&c)
    );
}

#[test]
fn ibv_uc_pingpong() {
    let args = ["-g", "1", "-n", "50", "-s", "4096", "-c", "-p", "18575"];
    let (_, c) = pair("ibv_uc_pingpong", 66, &args, &args);
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("50 iters"),
        "{}",
        text(&c)
    );
}
