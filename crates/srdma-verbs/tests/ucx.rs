//! Debian's unmodified UCX 1.13 (`ucx_info`, `ucx_perftest` from ucx-utils) on srdma, with
//! UCX's default configuration (no `UCX_*` variable but the transport list), run the way a
//! user runs it: through `srdma exec`, which gives the program the `/dev/infiniband/uverbsN`
//! nodes UCX looks for.
//!
//! Both ends run on this host, each on its own loopback address (`SRDMA_DEVICES`), every
//! test on its own addresses and TCP port. Skipped, with a message, without ucx-utils
//! (`scripts/test.sh` installs it); Open MPI over UCX too, without openmpi-bin and
//! libopenmpi-dev, and MPICH without mpich.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn srdma() -> &'static Path {
    common::srdma_bin()
}

/// Whether every one of `tools` is in /usr/bin; if not, says which is missing and what to
/// install (`packages`), and the caller skips.
fn installed(tools: &[&str], packages: &str) -> bool {
    let missing = tools
        .iter()
        .find(|t| !Path::new("/usr/bin").join(t).exists());
    if let Some(t) = missing {
        eprintln!(
            "skipped: /usr/bin/{t} is missing (apt-get install {packages}, or run \
             scripts/test.sh as root)"
        );
    }
    missing.is_none()
}

/// Whether UCX's tools are installed; if not, says so (the caller skips).
fn have_ucx() -> bool {
    installed(&["ucx_info", "ucx_perftest"], "ucx-utils")
}

/// `srdma exec PROGRAM ARGS` seeing one device, `ucx` at `addr`, and using `tls`.
fn exec(addr: &str, tls: &str, prog: &str, args: &[&str]) -> Command {
    let mut c = Command::new(srdma());
    c.arg("exec")
        .arg(prog)
        .args(args)
        .env("SRDMA_DEVICES", format!("ucx={addr}"))
        .env("UCX_TLS", tls)
        .env_remove("SRDMA_DEV_NODES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A child killed and reaped when dropped (a test that fails leaves no server behind).
struct Reaped(Option<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for `child` at most `limit`, killing it past that.
fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            // What srdma's devices in every process say (QPs, windows, timeouts, retries)
            // before the child goes: why it waited.
            let stats = Command::new(srdma())
                .args(["devinfo", "--stats"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| e.to_string());
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} did not finish within {limit:?}\n{}\nsrdma devinfo --stats:\n{stats}",
                text(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits (10 s at most) until some process listens on TCP `port`.
fn wait_listen(port: u16) {
    wait_listen_with(port, |f| std::fs::read_to_string(f).unwrap_or_default());
}

/// As [`wait_listen`], reading the tables with `read` (e.g. inside a namespace).
fn wait_listen_with(port: u16, read: impl Fn(&str) -> String) {
    let needle = format!(":{port:04X}");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let t = read(f);
            // local_address is the second column; state 0A is LISTEN.
            if t.lines().any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1].ends_with(&needle) && c[3] == "0A"
            }) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on TCP {port} after 10 s");
}

/// Runs `ucx_perftest` server and client (on 127.0.`net`.1 and .2) over `tls` with `args`
/// (a few hundred iterations); both must exit 0 and the client print its final line.
/// Returns the client's output.
fn perftest(net: u8, port: u16, tls: &str, args: &[&str]) -> String {
    let (sa, ca) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let port_s = port.to_string();
    let mut a: Vec<&str> = vec!["-p", &port_s, "-n", "500", "-w", "50"];
    a.extend_from_slice(args);
    let what = format!("ucx_perftest {} over {tls}", a.join(" "));
    let mut srv = Reaped(Some(exec(&sa, tls, "ucx_perftest", &a).spawn().unwrap()));
    wait_listen(port);
    let mut ca_args = vec![sa.as_str()];
    ca_args.extend_from_slice(&a);
    let cli = exec(&ca, tls, "ucx_perftest", &ca_args).spawn().unwrap();
    let c = wait(cli, Duration::from_secs(30), &format!("{what}: client"));
    let s = wait(
        srv.0.take().unwrap(),
        Duration::from_secs(10),
        &format!("{what}: server"),
    );
    assert!(c.status.success(), "{what}: client failed: {}", text(&c));
    assert!(s.status.success(), "{what}: server failed: {}", text(&s));
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    let fin = out
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("{what}: no final line: {}", text(&c)));
    // "Final: <iterations> ...": every iteration ran.
    assert_eq!(fin.split_whitespace().nth(1), Some("500"), "{what}: {fin}");
    for o in [&c, &s] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("UCX  ERROR"), "{what}: {}", text(o));
    }
    out
}

/// `srdma exec` gives the program `/dev/infiniband/uverbsN` character devices it may read
/// and write, keeps the rest of `/dev` working, and skips that on `SRDMA_DEV_NODES=0`.
#[test]
fn exec_provides_device_nodes() {
    let script = "test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 && \
                  test -w /dev/infiniband/uverbs0 && echo ok > /dev/null && test -d /dev/shm && \
                  echo nodes-ok";
    let o = exec("127.0.60.1", "", "/bin/sh", &["-c", script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nodes-ok"));
    let o = exec("127.0.60.1", "", "/bin/sh", &["-c", "ls /dev/infiniband"])
        .env("SRDMA_DEV_NODES", "0")
        .output()
        .unwrap();
    if Path::new("/dev/infiniband/uverbs0").exists() {
        return; // A real RDMA device: nothing to tell apart.
    }
    assert!(
        !o.status.success(),
        "nodes made despite SRDMA_DEV_NODES=0: {}",
        text(&o)
    );
}

#[test]
fn ucx_info_lists_rc_and_ud_verbs() {
    if !have_ucx() {
        return;
    }
    let o = exec("127.0.61.1", "rc_verbs,ud_verbs", "ucx_info", &["-d"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "Memory domain: ucx",
        "Transport: rc_verbs",
        "Transport: ud_verbs",
        "Device: ucx:1",
    ] {
        assert!(out.contains(want), "missing {want:?}: {}", text(&o));
    }
}

/// UCP over RC (UD for wire-up): tag matching, RMA put and get, atomics.
#[test]
fn ucp_over_rc_verbs() {
    if !have_ucx() {
        return;
    }
    let tls = "rc_verbs,ud_verbs";
    perftest(62, 18640, tls, &["-t", "tag_lat"]);
    perftest(63, 18641, tls, &["-t", "tag_bw", "-s", "100000"]);
    perftest(64, 18642, tls, &["-t", "ucp_put_bw", "-s", "65536"]);
    perftest(65, 18643, tls, &["-t", "ucp_get", "-s", "4096"]);
    perftest(66, 18644, tls, &["-t", "ucp_fadd"]);
    perftest(67, 18645, tls, &["-t", "ucp_cswap"]);
}

/// UCP over UD alone (every packet through the receive path whose GRH UCX checks), and the
/// UCT transports directly.
#[test]
fn ucp_over_ud_verbs_and_uct() {
    if !have_ucx() {
        return;
    }
    perftest(68, 18646, "ud_verbs", &["-t", "tag_lat"]);
    perftest(69, 18647, "ud_verbs", &["-t", "tag_bw", "-s", "65536"]);
    for (i, (tl, test)) in [
        ("rc_verbs", "am_lat"),
        ("rc_verbs", "put_bw"),
        ("rc_verbs", "fadd"),
        ("ud_verbs", "am_bw"),
    ]
    .into_iter()
    .enumerate()
    {
        perftest(
            70 + i as u8,
            18648 + i as u16,
            tl,
            &["-d", "ucx:1", "-x", tl, "-t", test],
        );
    }
}

/// Whether Open MPI (mpicc, mpirun) is installed; if not, says so (the caller skips).
fn have_mpi() -> bool {
    installed(&["mpicc", "mpirun"], "openmpi-bin libopenmpi-dev")
}

/// A directory of this process removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("srdma-ucx-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// tests/c/mpi_check.c built with mpicc into `dir`.
fn build_mpi_check(dir: &Path) -> String {
    build_mpi(dir, "mpicc", "crates/srdma-verbs/tests/c/mpi_check.c")
}

/// The C program `src` (a path from the repository's root) built with the MPI compiler
/// wrapper `cc` into `dir`, named after `cc` and the source.
fn build_mpi(dir: &Path, cc: &str, src: &str) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(src);
    let stem = src.file_stem().unwrap().to_str().unwrap();
    let prog = dir.join(format!("{stem}.{cc}"));
    let o = Command::new(cc)
        .args(["-O1", "-Wall", "-o"])
        .arg(&prog)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{cc} {}: {}", src.display(), text(&o));
    prog.to_str().unwrap().to_string()
}

/// mpi_check's or mpi_coll's run `o` passed on `ranks` ranks, UCX reporting no error.
fn assert_mpi_passed(o: &Output, ranks: usize) {
    assert!(o.status.success(), "{}", text(o));
    let passed = format!("PASSED: 0 failures over {ranks} ranks");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&passed),
        "{}",
        text(o)
    );
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("UCX  ERROR"),
        "{}",
        text(o)
    );
}

/// Open MPI 4.1 over UCX over srdma (`--mca pml ucx --mca osc ucx`, verbs transports only):
/// tests/c/mpi_check.c checks point-to-point at eager and rendezvous sizes, collectives and
/// one-sided RMA. READ responses leave their payload for the reader to pull
/// (`SRDMA_SHM_PULL=1`; 2 ranks on 2 cores would copy): the rendezvous and `MPI_Get` data
/// is checked through that path. Skipped without Open MPI (openmpi-bin, libopenmpi-dev).
#[test]
fn open_mpi_over_ucx() {
    if !have_ucx() || !have_mpi() {
        return;
    }
    let dir = TempDir::new("mpi");
    let prog = build_mpi_check(&dir.0);
    let mut args = vec!["--oversubscribe", "-np", "2"];
    args.extend(MPI_OVER_UCX);
    args.extend(["-x", "LD_LIBRARY_PATH", "-x", "SRDMA_DEVICES"]);
    args.extend(["-x", "SRDMA_SHM_PULL", &prog]);
    let o = {
        let mut c = exec("127.0.75.1", "rc_verbs,ud_verbs,self", "mpirun", &args);
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("SRDMA_SHM_PULL", "1");
        common::wait(
            c.spawn().unwrap(),
            Duration::from_secs(60),
            "mpirun mpi_check",
        )
    };
    assert_mpi_passed(&o, 2);
}

/// Open MPI over UCX over srdma on 3 ranks: benchmarks/mpi_coll.c checks a send/recv stream
/// at every size from 8 B to 4 MiB, `MPI_Allreduce` and `MPI_Alltoall` of 3 MiB per call,
/// every element of every result.
#[test]
fn open_mpi_collectives_over_ucx() {
    if !have_ucx() || !have_mpi() {
        return;
    }
    let dir = TempDir::new("mpicoll");
    let prog = build_mpi(&dir.0, "mpicc", "benchmarks/mpi_coll.c");
    let mut args = vec!["--oversubscribe", "-np", "3"];
    args.extend(MPI_OVER_UCX);
    args.extend(["-x", "LD_LIBRARY_PATH", "-x", "SRDMA_DEVICES", &prog]);
    args.extend(MPI_COLL_SIZES);
    let o = {
        let mut c = exec("127.0.76.1", "rc_verbs,ud_verbs,self", "mpirun", &args);
        c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        common::wait(
            c.spawn().unwrap(),
            Duration::from_secs(90),
            "mpirun mpi_coll",
        )
    };
    assert_mpi_passed(&o, 3);
}

/// mpi_coll's arguments in the tests: sizes up to 4 MiB, 3 MiB per collective call, 12 MiB
/// of each.
const MPI_COLL_SIZES: [&str; 3] = ["4", "3", "12"];

/// Whether MPICH (Debian's mpich: `mpicc.mpich`, `mpiexec.mpich`, device ch4:ucx) is
/// installed; if not, says so (the caller skips).
fn have_mpich() -> bool {
    installed(&["mpicc.mpich", "mpiexec.mpich"], "mpich")
}

/// MPICH 4.0 (Debian's, ch4:ucx, its Hydra launcher) over UCX over srdma: mpi_check on 2
/// ranks (point-to-point, collectives, one-sided RMA) and mpi_coll on 3. UCX may use the
/// verbs transports only, and `MPIR_CVAR_NOLOCAL=1` keeps MPICH from its own shared memory
/// between ranks of one host: every byte between ranks goes through srdma.
#[test]
fn mpich_over_ucx() {
    if !have_ucx() || !have_mpich() {
        return;
    }
    let dir = TempDir::new("mpich");
    let check = build_mpi(
        &dir.0,
        "mpicc.mpich",
        "crates/srdma-verbs/tests/c/mpi_check.c",
    );
    let coll = build_mpi(&dir.0, "mpicc.mpich", "benchmarks/mpi_coll.c");
    for (ranks, prog, sizes) in [(2, &check, &[][..]), (3, &coll, &MPI_COLL_SIZES[..])] {
        let np = ranks.to_string();
        let mut args = vec!["-n", &np, prog];
        args.extend(sizes);
        let what = format!("mpiexec.mpich {prog}");
        let o = {
            let mut c = exec(
                "127.0.77.1",
                "rc_verbs,ud_verbs,self",
                "mpiexec.mpich",
                &args,
            );
            c.env("MPIR_CVAR_NOLOCAL", "1");
            common::wait(c.spawn().unwrap(), Duration::from_secs(90), &what)
        };
        assert_mpi_passed(&o, ranks);
    }
}

/// mpirun's options for point-to-point and one-sided traffic over UCX, with the ranks
/// getting the launcher's `UCX_TLS`.
const MPI_OVER_UCX: [&str; 8] = [
    "--mca", "pml", "ucx", "--mca", "osc", "ucx", "-x", "UCX_TLS",
];

/// mpirun's launch agent (`plm_rsh_agent`, in place of ssh) for hosts that are network
/// namespaces: `agent HOST COMMAND...` runs the command line (through a shell, as ssh does)
/// in namespace HOST with HOST as its host name (a UTS namespace: the daemons of two hosts
/// sharing one would share their session directory and topology file in /tmp), under
/// `srdma exec` seeing only the device of HOST's `eth0` address.
const NETNS_AGENT: &str = r#"#!/bin/sh
host=$1; shift
addr=$(ip -n "$host" -4 -o addr show dev eth0 | sed -n 's/.* inet \([0-9.]*\).*/\1/p')
[ -n "$addr" ] || { echo "agent: no IPv4 address on eth0 in namespace $host" >&2; exit 1; }
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$host" \
    "$SRDMA" exec --device "ucx=$addr" /bin/sh -c "$*"
"#;

/// Open MPI between two hosts (network namespaces joined by veth, the way
/// [`ucp_between_two_namespaces`] makes them), two ranks on each, mapped by node so that
/// every rank's partner (rank ^ 1) is on the other host: mpi_check.c as in
/// [`open_mpi_over_ucx`], over rc_verbs and ud_verbs only (no shared memory, no TCP but
/// Open MPI's own out-of-band wiring). mpirun runs in the first namespace and starts a
/// daemon on each host through [`NETNS_AGENT`]; the ranks inherit their daemon's `srdma exec`.
/// The second host's `eth0` must have received at least the point-to-point payload of its
/// two ranks.
#[test]
fn open_mpi_between_two_namespaces() {
    if !have_ucx() || !have_mpi() {
        return;
    }
    if std::env::var_os("SRDMA_SKIP_NETNS").is_some_and(|v| v == "1") {
        eprintln!("skipped: SRDMA_SKIP_NETNS=1");
        return;
    }
    let lab = srdma_netlab::Lab::star("mpi", 2, 94, 1500).unwrap_or_else(|e| {
        panic!(
            "creating network namespaces failed: {e}\n(needs root and iproute2; \
             SRDMA_SKIP_NETNS=1 skips)"
        )
    });
    let dir = TempDir::new("mpi-netns");
    let prog = build_mpi_check(&dir.0);
    let agent = dir.0.join("agent");
    std::fs::write(&agent, NETNS_AGENT).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hostfile = dir.0.join("hosts");
    let hosts: String = lab
        .hosts
        .iter()
        .map(|h| format!("{} slots=2\n", h.ns))
        .collect();
    std::fs::write(&hostfile, hosts).unwrap();
    let rx_bytes = || -> u64 {
        lab.hosts[1]
            .run("cat", &["/sys/class/net/eth0/statistics/rx_bytes"])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let rx0 = rx_bytes();
    let mut args = vec![
        "--allow-run-as-root",
        "--hostfile",
        hostfile.to_str().unwrap(),
        "-np",
        "4",
        "--map-by",
        "node",
        "--mca",
        "plm_rsh_agent",
        agent.to_str().unwrap(),
        "--mca",
        "oob_tcp_if_include",
        "eth0",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
    ];
    args.extend(MPI_OVER_UCX);
    args.push(&prog);
    let child = lab.hosts[0]
        .command("mpirun")
        .args(args)
        .env("SRDMA", srdma())
        .env("UCX_TLS", "rc_verbs,ud_verbs,self")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("SRDMA_DEVICES")
        .env_remove("SRDMA_DEV_NODES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = common::wait(
        child,
        Duration::from_secs(120),
        "mpirun mpi_check between namespaces",
    );
    assert_mpi_passed(&o, 4);
    // Each of the second host's ranks received 8 B + 1 KiB + ... + 4 MiB from its partner.
    let rx = rx_bytes() - rx0;
    let payload = 2 * (8 + 1024 + 8192 + 65536 + (1 << 20) + (4 << 20));
    assert!(
        rx >= payload,
        "{}: {rx} bytes received, less than the {payload} sent to it",
        lab.hosts[1].ns
    );
}

/// Two hosts (network namespaces joined by veth, MTU 1500), each process on srdma's default
/// device list: the device of its host's interface only, as the list leaves loopback devices
/// out where another interface has an address (every host would have a `srdma_lo` with the
/// same address, which UCX would take for a path to the peer). UCP tag matching and put over
/// RC, tags over UD.
#[test]
fn ucp_between_two_namespaces() {
    if !have_ucx() {
        return;
    }
    if let Some(why) = srdma_netlab::skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let lab = srdma_netlab::Lab::star("ucx", 2, 92, 1500).expect("creating namespaces");
    let (h0, h1) = (&lab.hosts[0], &lab.hosts[1]);
    let server = h0.addr.to_string();
    let in_ns = |h: &srdma_netlab::Host, tls: &str, args: &[&str]| {
        let mut c = h.command(srdma());
        c.args(["exec", "ucx_perftest"])
            .args(args)
            .env("UCX_TLS", tls)
            .env_remove("SRDMA_DEVICES")
            .env_remove("SRDMA_DEV_NODES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    for (i, (tls, test, size)) in [
        ("rc_verbs,ud_verbs", "tag_bw", "100000"),
        ("rc_verbs,ud_verbs", "ucp_put_bw", "65536"),
        ("ud_verbs", "tag_lat", "8"),
    ]
    .into_iter()
    .enumerate()
    {
        let port = (18660 + i).to_string();
        let args = ["-p", &port, "-n", "300", "-w", "30", "-t", test, "-s", size];
        let what = format!("{test} over {tls} between namespaces");
        let mut srv = Reaped(Some(in_ns(h0, tls, &args).spawn().unwrap()));
        wait_listen_with(18660 + i as u16, |f| {
            h0.run("cat", &[f]).unwrap_or_default()
        });
        let mut cargs = vec![server.as_str()];
        cargs.extend_from_slice(&args);
        let cli = in_ns(h1, tls, &cargs).spawn().unwrap();
        let c = wait(cli, Duration::from_secs(30), &format!("{what}: client"));
        let s = wait(srv.0.take().unwrap(), Duration::from_secs(10), &what);
        assert!(c.status.success(), "{what}: client: {}", text(&c));
        assert!(s.status.success(), "{what}: server: {}", text(&s));
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(
            out.lines()
                .any(|l| l.starts_with("Final:") && l.contains(" 300 ")),
            "{what}: {}",
            text(&c)
        );
    }
}

/// A peer killed mid-run (SIGKILL, no goodbye): the survivor's RC QP exhausts its retries and
/// UCX fails with that error instead of hanging, over rc_verbs and over ud_verbs alone.
///
/// Over rc_verbs the survivor streams `ucp_put_bw` (RDMA WRITEs it posts on its own): a
/// survivor that waits for its peer instead — a `tag_bw` sender out of UCX's flow-control
/// credits, its sends all acknowledged — has nothing in flight when the peer dies, and RC has
/// no keepalive: with a NIC as with srdma it can wait for ever (CI saw such a wait once,
/// loaded: 5,801 tag_bw iterations, then nothing for 180 s, no error).
#[test]
fn a_killed_peer_makes_the_survivor_fail() {
    if !have_ucx() {
        return;
    }
    for (net, port, tls, test, needle) in [
        (
            96u8,
            18660u16,
            "rc_verbs,ud_verbs",
            "ucp_put_bw",
            "retry counter exceeded",
        ),
        (97, 18661, "ud_verbs", "tag_bw", "timeout"),
    ] {
        let (sa, ca) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
        let port_s = port.to_string();
        let mut srv = Reaped(Some(
            exec(&sa, tls, "ucx_perftest", &["-p", &port_s])
                .spawn()
                .unwrap(),
        ));
        wait_listen(port);
        let args = [
            sa.as_str(),
            "-p",
            &port_s,
            "-t",
            test,
            "-s",
            "65536",
            "-n",
            "100000000",
        ];
        let cli = exec(&ca, tls, "ucx_perftest", &args).spawn().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        // `srdma exec` becomes the program: this kills ucx_perftest itself.
        srv.0.as_mut().unwrap().kill().unwrap();
        // Unloaded, both cases together take ~45 s (2 s of traffic each, then UCX's QP
        // retries and its UD peer timeout); the whole suite on 2 cores has stretched the
        // rc_verbs case past 90 s.
        let c = wait(
            cli,
            Duration::from_secs(180),
            &format!("ucx_perftest client over {tls} after its server was killed"),
        );
        assert!(!c.status.success(), "{tls}: {}", text(&c));
        let out = text(&c);
        assert!(out.contains(needle), "{tls}: no {needle:?} in {out}");
    }
}
