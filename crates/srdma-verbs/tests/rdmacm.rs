//! Debian's unmodified rdmacm-utils and perftest binaries on the drop-in librdmacm.so.1
//! (the same file as the drop-in libibverbs.so.1): rping, rdma_server/rdma_client,
//! ucmatose, udaddy (UD through SIDR), mckey (multicast), rstream and rcopy (rsockets),
//! ib_write_bw -R and ib_send_lat -R, on one address, on two, and between network
//! namespaces; and bad input through the C API.

mod common;

use common::{lib_dir, wait};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tests run one at a time: on two cores, parallel pairs starve each other's CM threads
/// (see `perftest_over_rdma_cm`).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: install rdmacm-utils and perftest (apt-get install rdmacm-utils \
         perftest), or run scripts/test.sh as root",
        p.display()
    );
    p
}

fn cmd(prog: &Path, devices: &str, args: &[&str]) -> Command {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SRDMA_DEVICES", devices)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The status and the last 3000 bytes of each stream.
fn text(o: &Output) -> String {
    let tail = |b: &[u8]| String::from_utf8_lossy(&b[b.len().saturating_sub(3000)..]).into_owned();
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        tail(&o.stdout),
        tail(&o.stderr)
    )
}

/// Waits (15 s at most) until process `pid` has a thread named `name` (the drop-in names
/// its rdma_listen threads `srdma-cm-listen`).
fn wait_thread(pid: u32, name: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                if comm.trim() == name {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("process {pid} never started a {name} thread");
}

/// The server's and the client's address for test network `net`: an even `net` puts both on
/// one address (sharing UDP 4791 as processes share a kernel device), an odd one on two.
fn addresses(net: u8) -> (String, String) {
    let server = format!("127.0.{net}.1");
    let client = if net % 2 == 0 {
        server.clone()
    } else {
        format!("127.0.{net}.2")
    };
    (server, client)
}

/// Runs a server until it listens, then a client, on the [`addresses`] of `net`; both must
/// exit 0. `{server}` in the client's arguments is the server's address.
fn pair(prog: &str, net: u8, server: &[&str], client: &[&str]) -> (Output, Output) {
    pair_on("srdma-cm-listen", prog, net, server, client)
}

/// [`pair`], the server being ready once it has a thread named `listen_thread`.
fn pair_on(
    listen_thread: &str,
    prog: &str,
    net: u8,
    server: &[&str],
    client: &[&str],
) -> (Output, Output) {
    let (sa, ca) = addresses(net);
    let sargs: Vec<String> = server.iter().map(|a| a.replace("{server}", &sa)).collect();
    let sargs: Vec<&str> = sargs.iter().map(String::as_str).collect();
    let srv = cmd(&tool(prog), &sa, &sargs).spawn().unwrap();
    wait_thread(srv.id(), listen_thread);
    let cargs: Vec<String> = client.iter().map(|a| a.replace("{server}", &sa)).collect();
    let cargs: Vec<&str> = cargs.iter().map(String::as_str).collect();
    // The server's output is read while the client runs: rping -V fills a pipe.
    let what = format!("{prog} server");
    let s = std::thread::spawn(move || wait(srv, Duration::from_secs(60), &what));
    let cli = cmd(&tool(prog), &ca, &cargs).spawn().unwrap();
    let c = wait(cli, Duration::from_secs(60), &format!("{prog} client"));
    let s = s.join().expect("server wait");
    assert!(c.status.success(), "{prog} client failed: {}", text(&c));
    assert!(s.status.success(), "{prog} server failed: {}", text(&s));
    (s, c)
}

/// `name version` of what `objdump -T` shows `lib` defining under an RDMACM node.
fn rdmacm_exports(lib: &Path) -> std::collections::BTreeSet<String> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (binutils)");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("RDMACM") && !l.contains("*UND*") && !l.contains("*ABS*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 2).then(|| format!("{} {}", f[f.len() - 1], f[f.len() - 2]))
        })
        .collect()
}

/// Every symbol of Debian's librdmacm.so.1, under the same version; and the loader maps the
/// drop-in once for both names, so rping's rdma_* and ibv_* calls reach one library.
#[test]
fn exports_match_debians_librdmacm() {
    let _serial = serial();
    let debian = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    assert!(debian.exists(), "install librdmacm1 (rdmacm-utils)");
    let ours = rdmacm_exports(&lib_dir().join("librdmacm.so.1"));
    let theirs = rdmacm_exports(debian);
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    assert!(extra.is_empty(), "exported beyond Debian's: {extra:?}");
    assert!(ours.len() >= 60, "{}", ours.len());
    let o = Command::new("ldd")
        .args(["-r", "/usr/bin/rping"])
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&lib_dir().join("librdmacm.so.1").display().to_string()),
        "{out}"
    );
    assert!(!out.contains("undefined symbol"), "{out}");
}

#[test]
fn rping_sizes_and_verify() {
    let _serial = serial();
    for (i, size) in ["64", "4000", "65535"].into_iter().enumerate() {
        let net = 100 + i as u8;
        let common = ["-v", "-V", "-C", "10", "-S", size, "-p", "7300"];
        let mut s = vec!["-s", "-a", "{server}"];
        s.extend_from_slice(&common);
        let mut c = vec!["-c", "-a", "{server}"];
        c.extend_from_slice(&common);
        let (_, cli) = pair("rping", net, &s, &c);
        let out = String::from_utf8_lossy(&cli.stdout);
        let lines = out.lines().filter(|l| l.starts_with("ping data: ")).count();
        assert_eq!(lines, 10, "{}", text(&cli));
        // rping's pattern, rotated by the iteration number, as real rping prints it.
        assert!(
            out.contains("ping data: rdma-ping-9: JKLMNOPQRSTUVWXYZ"),
            "{}",
            text(&cli)
        );
    }
}

/// rdma_server and rdma_client (rdma_create_ep, rdma_get_request and the inline helpers of
/// rdma_verbs.h), on one address and on two.
#[test]
fn rdma_server_and_client() {
    let _serial = serial();
    for net in [112u8, 113] {
        let (sa, ca) = addresses(net);
        let srv = cmd(&tool("rdma_server"), &sa, &["-s", &sa, "-p", "7472"])
            .spawn()
            .unwrap();
        wait_thread(srv.id(), "srdma-cm-listen");
        let cli = cmd(&tool("rdma_client"), &ca, &["-s", &sa, "-p", "7472"])
            .spawn()
            .unwrap();
        let c = wait(cli, Duration::from_secs(30), "rdma_client");
        let s = wait(srv, Duration::from_secs(30), "rdma_server");
        assert!(c.status.success(), "{}", text(&c));
        assert!(s.status.success(), "{}", text(&s));
        assert!(String::from_utf8_lossy(&c.stdout).contains("rdma_client: end 0"));
        assert!(String::from_utf8_lossy(&s.stdout).contains("rdma_server: end 0"));
    }
}

#[test]
fn ucmatose_many_connections() {
    let _serial = serial();
    for net in [114, 115] {
        let (s, c) = pair(
            "ucmatose",
            net,
            &["-c", "4", "-C", "20", "-S", "1000", "-p", "7474"],
            &[
                "-s", "{server}", "-c", "4", "-C", "20", "-S", "1000", "-p", "7474",
            ],
        );
        for o in [&s, &c] {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("return status 0"), "{}", text(o));
        }
    }
}

/// `RDMA_PS_IB` (ucmatose -P ib): the REQ names the IB port space's service ID, which the
/// listener of that space answers (the client used to name the TCP space and got REJ 8).
#[test]
fn ucmatose_in_the_ib_port_space() {
    let _serial = serial();
    let (s, c) = pair(
        "ucmatose",
        133,
        &["-P", "ib", "-c", "2", "-C", "5", "-p", "7475"],
        &[
            "-P", "ib", "-s", "{server}", "-c", "2", "-C", "5", "-p", "7475",
        ],
    );
    for o in [&s, &c] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("return status 0"), "{}", text(o));
    }
}

#[test]
fn udaddy_through_sidr() {
    let _serial = serial();
    for net in [116, 117] {
        let (s, c) = pair(
            "udaddy",
            net,
            &["-c", "2", "-C", "10"],
            &["-s", "{server}", "-c", "2", "-C", "10"],
        );
        for o in [&s, &c] {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("return status 0"), "{}", text(o));
        }
    }
}

/// perftest -R makes two connections one after the other, destroying its listener in
/// between: the second REQ can reach the server before it listens again. It waits for the
/// new listener (`LINGER` in rdmacm.rs) and the ACK the client owes the server's last SEND
/// leaves before the client's REQ; without both this failed about one run in three.
#[test]
fn perftest_over_rdma_cm() {
    let _serial = serial();
    let (_, c) = pair(
        "ib_write_bw",
        118,
        &["-R", "-s", "65536", "-n", "300", "-p", "18700"],
        &["-R", "-s", "65536", "-n", "300", "-p", "18700", "{server}"],
    );
    let out = String::from_utf8_lossy(&c.stdout);
    assert!(out.contains("65536      300"), "{}", text(&c));
    let (_, c) = pair(
        "ib_send_lat",
        119,
        &["-R", "-n", "300", "-p", "18701"],
        &["-R", "-n", "300", "-p", "18701", "{server}"],
    );
    let out = String::from_utf8_lossy(&c.stdout);
    assert!(out.contains(" 2       300"), "{}", text(&c));
    let (_, c) = pair(
        "ib_read_bw",
        120,
        &["-R", "-s", "4096", "-n", "300", "-p", "18702"],
        &["-R", "-s", "4096", "-n", "300", "-p", "18702", "{server}"],
    );
    assert!(
        String::from_utf8_lossy(&c.stdout).contains("4096       300"),
        "{}",
        text(&c)
    );
}

/// Two hosts (network namespaces joined by veth, MTU 1500), each with its own device.
#[test]
fn rdma_cm_between_two_namespaces() {
    let _serial = serial();
    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let lab = srdma_netlab::Lab::star("rdmacm", 2, 93, 1500).expect("creating namespaces");
    let (h0, h1) = (&lab.hosts[0], &lab.hosts[1]);
    let sa = h0.addr.to_string();
    let in_ns = |h: &srdma_netlab::Host, prog: &str, args: &[String]| {
        let mut c = h.command(tool(prog));
        c.args(args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env_remove("SRDMA_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let runs: [(&str, &str, &str); 6] = [
        (
            "rstream",
            "-b {server} -p 7494 -T v -S 100000 -C 50",
            "-s {server} -p 7494 -T v -S 100000 -C 50",
        ),
        (
            "rping",
            "-s -a {server} -p 7301 -V -C 20 -S 20000",
            "-c -a {server} -p 7301 -V -C 20 -S 20000",
        ),
        (
            "ucmatose",
            "-c 2 -C 10 -p 7478",
            "-s {server} -c 2 -C 10 -p 7478",
        ),
        ("udaddy", "-C 10", "-s {server} -C 10"),
        (
            "ib_write_bw",
            "-R -s 65536 -n 200 -p 18710",
            "-R -s 65536 -n 200 -p 18710 {server}",
        ),
        (
            "ib_send_lat",
            "-R -n 200 -p 18711",
            "-R -n 200 -p 18711 {server}",
        ),
    ];
    for (prog, s, c) in runs {
        let split = |a: &str| -> Vec<String> {
            a.split_whitespace()
                .map(|w| w.replace("{server}", &sa))
                .collect()
        };
        let srv = in_ns(h0, prog, &split(s)).spawn().unwrap();
        let listen = if prog == "rstream" {
            "srdma-rs-listen"
        } else {
            "srdma-cm-listen"
        };
        wait_thread(srv.id(), listen);
        let s = std::thread::spawn(move || wait(srv, Duration::from_secs(60), prog));
        let cli = in_ns(h1, prog, &split(c)).spawn().unwrap();
        let c = wait(cli, Duration::from_secs(60), prog);
        let s = s.join().expect("server wait");
        assert!(c.status.success(), "{prog} client: {}", text(&c));
        assert!(s.status.success(), "{prog} server: {}", text(&s));
    }
}

/// A client with nobody listening is rejected (reason 8, invalid service ID) soon: after the
/// 1 s in which the drop-in sends such a REQ again (`ConnectOptions::unlisted_retry`).
#[test]
fn rping_without_a_server_is_rejected_quickly() {
    let _serial = serial();
    let start = Instant::now();
    let o = wait(
        cmd(
            &tool("rping"),
            "127.0.121.1",
            &["-c", "-a", "127.0.121.1", "-p", "7399", "-C", "1"],
        )
        .spawn()
        .unwrap(),
        Duration::from_secs(30),
        "rping",
    );
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("RDMA_CM_EVENT_REJECTED"), "{}", text(&o));
}

/// A process killed with its connection up: its peer gets RDMA_CM_EVENT_DISCONNECTED within
/// moments, as when a process on a kernel device dies (the kernel sends the DREQ; here the
/// port keeper does). Both on one address (one keeper) and on two (the client's keeper
/// sends it).
#[test]
fn a_killed_peer_is_disconnected() {
    let _serial = serial();
    for net in [122u8, 123] {
        let (sa, ca) = addresses(net);
        let srv = cmd(&tool("rping"), &sa, &["-s", "-a", &sa, "-p", "7398"])
            .spawn()
            .unwrap();
        wait_thread(srv.id(), "srdma-cm-listen");
        let mut cli = cmd(
            &tool("rping"),
            &ca,
            &["-c", "-a", &sa, "-p", "7398", "-C", "100000000"],
        )
        .spawn()
        .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(cli.try_wait().unwrap().is_none(), "the client ended early");
        cli.kill().unwrap(); // SIGKILL: no destructor, no rdma_disconnect
        cli.wait().unwrap();
        let killed = Instant::now();
        let s = wait(srv, Duration::from_secs(30), "rping server");
        let err = String::from_utf8_lossy(&s.stderr);
        assert!(err.contains("server DISCONNECT EVENT"), "{}", text(&s));
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the server heard of it after {:?}",
            killed.elapsed()
        );
    }
}

#[test]
fn a_request_between_two_listeners_waits_for_the_second() {
    let _serial = serial();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/relisten.c");
    let out = lib_dir().join("relisten");
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("running cc: install gcc");
    assert!(o.status.success(), "compiling: {}", text(&o));
    let o = wait(
        cmd(&out, "127.0.123.1", &["127.0.123.1"]).spawn().unwrap(),
        Duration::from_secs(60),
        "relisten",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("relisten: ok"));
}

/// Ids without a QP (tests/c/qpless.c, the way UCX connects): each side names its own QP in
/// `conn_param->qp_num` and moves it with `rdma_init_qp_attr`; the active side gets
/// CONNECT_RESPONSE and completes with `rdma_establish`. In one process, then between two
/// processes on two addresses. (The lab runs the same program against kernel rxe.)
#[test]
fn connecting_ids_without_a_qp() {
    let _serial = serial();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/qpless.c");
    let out = lib_dir().join("qpless");
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs", "-lpthread"])
        .output()
        .expect("running cc: install gcc");
    assert!(o.status.success(), "compiling: {}", text(&o));
    let o = wait(
        cmd(&out, "127.0.124.1", &["both", "127.0.124.1"])
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
        "qpless both",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("qpless: ok"));

    let srv = cmd(&out, "127.0.125.1", &["server", "127.0.125.1", "7471"])
        .spawn()
        .unwrap();
    wait_thread(srv.id(), "srdma-cm-listen");
    let s = std::thread::spawn(move || wait(srv, Duration::from_secs(60), "qpless server"));
    let c = wait(
        cmd(&out, "127.0.125.2", &["client", "127.0.125.1", "7471"])
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
        "qpless client",
    );
    let s = s.join().expect("server wait");
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(s.status.success(), "server: {}", text(&s));
    assert!(String::from_utf8_lossy(&c.stdout).contains("qpless: ok"));
}

/// Waits (15 s at most) until `users` sockets in process `pid`'s network namespace are
/// members of IPv4 multicast group `group` (the Users column of its `/proc/PID/net/igmp`).
fn wait_joined(pid: u32, group: std::net::Ipv4Addr, users: usize) {
    let hex = format!("{:08X}", u32::from_le_bytes(group.octets()));
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        let igmp = std::fs::read_to_string(format!("/proc/{pid}/net/igmp")).unwrap_or_default();
        let joined: usize = igmp
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(hex.as_str())).then(|| w.next()?.parse::<usize>().ok())?
            })
            .sum();
        if joined >= users {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("process {pid}: fewer than {users} members of {group}");
}

/// mckey: receivers join an IPv4 group (rdma_join_multicast_ex: their UD QPs are attached)
/// and a sender's SENDs to QPN 0xFFFFFF at the group reach each. One address (two receivers
/// and the sender share UDP 4791), two addresses, two network namespaces. (The lab runs
/// mckey against kernel rxe, both roles.)
#[test]
fn mckey_multicast() {
    let _serial = serial();
    // Receivers first (each must have joined before the sender's one burst), then the
    // sender; every one must see its 10 messages.
    let run = |recvs: Vec<Command>, mut send: Command, group: &str, what: &str| {
        let mut waits = Vec::new();
        for (i, mut recv) in recvs.into_iter().enumerate() {
            let r = recv.spawn().unwrap();
            wait_joined(r.id(), group.parse().unwrap(), i + 1);
            let what_r = format!("{what}: mckey receiver {i}");
            waits.push(std::thread::spawn(move || {
                wait(r, Duration::from_secs(60), &what_r)
            }));
        }
        let s = wait(send.spawn().unwrap(), Duration::from_secs(60), what);
        let mut outs = vec![s];
        outs.extend(waits.into_iter().map(|r| r.join().expect("receiver wait")));
        for o in &outs {
            assert!(o.status.success(), "{what}: {}", text(o));
            assert!(
                String::from_utf8_lossy(&o.stdout).contains("data transfers complete"),
                "{what}: {}",
                text(o)
            );
        }
        let out = String::from_utf8_lossy(&outs[1].stdout).into_owned();
        assert!(out.contains("joined dgid: ::ffff:"), "{what}: {out}");
    };
    // An even net: two receivers and the sender share one address (and UDP 4791); an odd
    // one: receiver and sender on two.
    for (net, group) in [(126u8, "239.126.0.1"), (127, "239.127.0.1")] {
        let (ra, sa) = addresses(net);
        let receiver = || {
            cmd(
                &tool("mckey"),
                &ra,
                &["-m", group, "-b", &ra, "-C", "10", "-S", "500"],
            )
        };
        let recvs = if net % 2 == 0 {
            vec![receiver(), receiver()]
        } else {
            vec![receiver()]
        };
        let send = cmd(
            &tool("mckey"),
            &sa,
            &["-m", group, "-b", &sa, "-s", "-C", "10", "-S", "500"],
        );
        run(recvs, send, group, &format!("net {net}"));
    }

    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("namespaces skipped: {why}");
        return;
    }
    let lab = srdma_netlab::Lab::star("mckey", 2, 94, 1500).expect("creating namespaces");
    let in_ns = |h: &srdma_netlab::Host, args: &[&str]| {
        let mut c = h.command(tool("mckey"));
        c.args(args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env_remove("SRDMA_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let (a0, a1) = (lab.hosts[0].addr.to_string(), lab.hosts[1].addr.to_string());
    let group = "239.94.0.1";
    run(
        vec![in_ns(&lab.hosts[0], &["-m", group, "-b", &a0, "-C", "10"])],
        in_ns(&lab.hosts[1], &["-m", group, "-b", &a1, "-s", "-C", "10"]),
        group,
        "namespaces",
    );
}

/// rsockets (librdmacm's socket API over RC QPs): Debian's rstream, its whole default test
/// set with data verification on one address and a set of sizes on two, in its default
/// non-blocking mode, blocking (`-T b`) and with rpoll (`-T a`); rcopy copies a file
/// intact. (The lab runs rstream against kernel rxe's librdmacm, both roles.)
#[test]
fn rsockets_rstream_and_rcopy() {
    let _serial = serial();
    // The listener's thread name, as the kernel truncates it (15 bytes).
    const LISTEN: &str = "srdma-rs-listen";
    let (s, c) = pair_on(
        LISTEN,
        "rstream",
        128,
        &["-b", "{server}", "-p", "7495", "-T", "v"],
        &["-s", "{server}", "-p", "7495", "-T", "v"],
    );
    for o in [&s, &c] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("1m_bw") && out.contains("64_lat"),
            "{}",
            text(o)
        );
    }
    for mode in ["b", "a"] {
        pair_on(
            LISTEN,
            "rstream",
            129,
            &[
                "-b", "{server}", "-p", "7496", "-T", mode, "-S", "100000", "-C", "100",
            ],
            &[
                "-s", "{server}", "-p", "7496", "-T", mode, "-S", "100000", "-C", "100",
            ],
        );
    }

    // riostream: riomap'd buffers written by riowrite, in both of its shapes (many transfers
    // and one ping-pong of a marker byte per transfer), data verified.
    for (port, args) in [
        ("7498", ["-S", "100000", "-C", "60", "-I", "1"]),
        ("7499", ["-S", "4096", "-C", "1", "-I", "100"]),
    ] {
        let (s, c) = pair_on(
            LISTEN,
            "riostream",
            131,
            &[&["-b", "{server}", "-p", port, "-T", "v"][..], &args[..]].concat(),
            &[&["-s", "{server}", "-p", port, "-T", "v"][..], &args[..]].concat(),
        );
        for o in [&s, &c] {
            assert!(
                String::from_utf8_lossy(&o.stdout).contains("custom"),
                "{}",
                text(o)
            );
        }
    }

    // rcopy: the server serves until killed.
    let dir = std::env::temp_dir().join(format!("srdma-rcopy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, dst) = (dir.join("src.bin"), dir.join("dst.bin"));
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let mut srv = cmd(&tool("rcopy"), "127.0.130.1", &["-p", "7497"])
        .spawn()
        .unwrap();
    wait_thread(srv.id(), LISTEN);
    let target = format!("127.0.130.1:{}", dst.display());
    let c = wait(
        cmd(
            &tool("rcopy"),
            "127.0.130.2",
            &[src.to_str().unwrap(), &target, "-p", "7497"],
        )
        .spawn()
        .unwrap(),
        Duration::from_secs(60),
        "rcopy client",
    );
    let _ = srv.kill();
    let _ = srv.wait();
    assert!(c.status.success(), "{}", text(&c));
    assert!(std::fs::read(&dst).unwrap() == data, "the copy differs");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_through_the_cm_api() {
    let _serial = serial();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cm_bad_input.c");
    let out = lib_dir().join("cm_bad_input");
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("running cc: install gcc");
    assert!(
        o.status.success(),
        "compiling (librdmacm-dev?): {}",
        text(&o)
    );
    let o = wait(
        cmd(&out, "127.0.122.1", &["127.0.122.1"]).spawn().unwrap(),
        Duration::from_secs(60),
        "cm_bad_input",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("0 failures"));
}
