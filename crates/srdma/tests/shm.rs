//! The shared-memory driver: which path traffic takes, and what a dead or frozen peer does.
//!
//! * Same host, same namespace: RC WRITE, SEND and READ go through shared memory (the
//!   counters and `Qp::path` say so, not one UDP datagram leaves); with `DeviceConfig::shm`
//!   off the same traffic goes over UDP.
//! * Two network namespaces of one host (veth between them): UDP; two devices of one of
//!   them (two addresses on its veth): shared memory.
//! * A peer process SIGKILLed, or SIGSTOPped, while 1 MiB WRITEs stream into it through
//!   shared memory: the survivor's head WQE completes with RETRY_EXC_ERR within its retry
//!   budget (a frozen peer never hangs it); after both are gone no ring stays mapped.
//!
//! The peer is this test binary again ([`peer_process`], a no-op unless `SRDMA_SHM_PEER` is
//! set), talking to the test over its stdin and stdout. The tests of this file run one at a
//! time (the leak check reads this process's mappings).

use std::io::{BufRead, BufReader, Write as _};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, ConnectParams, Cq, Device, DeviceConfig, Mr, Mtu, Path, Qp, QpInit, QpType, RKey,
    RecvWr, RemoteQp, SendOp, SendWr, SgeList, WcOpcode, WcStatus,
};
use srdma_wire::{Psn, Qpn};

/// Set in the peer process: the address of its device.
const PEER_ENV: &str = "SRDMA_SHM_PEER";
/// Bytes of each side's region.
const MR_LEN: usize = 4 << 20;
/// One test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

struct Side {
    dev: Device,
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

fn side(ip: &str, shm: bool) -> Side {
    let mut c = DeviceConfig::new(ip.parse().unwrap());
    c.share_port = false;
    c.shm = shm;
    c.shm_pull = srdma::ShmPull::Always;
    let dev = Device::open(c).unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.reg_mr(MR_LEN, access).unwrap();
    Side { dev, qp, cq, mr }
}

fn remote(s: &Side, psn: u32) -> RemoteQp {
    RemoteQp {
        qpn: s.qp.qpn(),
        psn: Psn::new(psn),
        gid: s.dev.local_gid(),
        port: s.dev.local_addr().port(),
    }
}

fn params(psn: u32) -> ConnectParams {
    // 1024: what rxe gives a 1500-byte veth (loopback would take 4096).
    let mut p = ConnectParams::new(Mtu::Mtu1024, Psn::new(psn));
    // 4.096 µs × 2^14 ≈ 67 ms, 3 retries: a dead peer fails a send in ~270 ms.
    p.timeout = 14;
    p.retry_cnt = 3;
    p
}

fn connect(a: &Side, b: &Side) {
    a.qp.connect(&remote(b, 100), &params(200)).unwrap();
    b.qp.connect(&remote(a, 200), &params(100)).unwrap();
}

/// Waits for `n` completions on `s`'s CQ, each a success.
fn complete(s: &Side, n: usize) -> Vec<srdma::Wc> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        if let Some(wc) = s.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            got.push(wc);
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{got:?}");
    }
    got
}

fn write_op(to: &Mr, offset: u64) -> SendOp {
    let r = to.remote().unwrap();
    SendOp::Write {
        remote_addr: r.addr + offset,
        rkey: RKey(r.rkey),
    }
}

/// WRITE 1 MiB a→b, SEND 8 B b→a, READ 64 KiB a←b, data checked.
fn traffic(a: &Side, b: &Side) {
    connect(a, b);
    let pattern: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write(0, &pattern).unwrap();
    let wr = SendWr::new(1, write_op(&b.mr, 0), SgeList::one(a.mr.sge(0, 1 << 20)));
    a.qp.post_send(wr).unwrap();
    complete(a, 1);
    let mut got = vec![0u8; 1 << 20];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == pattern, "the WRITE's bytes differ");
    a.qp.post_recv(RecvWr {
        wr_id: 2,
        sges: SgeList::one(a.mr.sge(2 << 20, 64)),
    })
    .unwrap();
    b.mr.write(3 << 20, b"ping pong").unwrap();
    let wr = SendWr::new(3, SendOp::Send, SgeList::one(b.mr.sge(3 << 20, 9)));
    b.qp.post_send(wr).unwrap();
    complete(b, 1);
    let wc = complete(a, 1);
    assert_eq!((wc[0].opcode, wc[0].byte_len), (WcOpcode::Recv, 9));
    let r = b.mr.remote().unwrap();
    let op = SendOp::Read {
        remote_addr: r.addr,
        rkey: RKey(r.rkey),
    };
    a.qp.post_send(SendWr::new(4, op, SgeList::one(a.mr.sge(1 << 20, 65536))))
        .unwrap();
    complete(a, 1);
    let mut back = vec![0u8; 65536];
    a.mr.read(1 << 20, &mut back).unwrap();
    assert!(back[..] == pattern[..65536], "the READ's bytes differ");
}

#[test]
fn same_host_traffic_takes_shared_memory_and_shm_off_takes_udp() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b) = (side("127.0.31.1", true), side("127.0.31.2", true));
    traffic(&a, &b);
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    assert_eq!(
        (a.qp.path(), b.qp.path()),
        (Path::SharedMemory, Path::SharedMemory)
    );
    assert!(
        ca.tx_shm_packets > 256 && cb.rx_shm_packets > 256,
        "{ca:?} {cb:?}"
    );
    assert_eq!((ca.tx_datagrams, cb.tx_datagrams), (0, 0), "{ca:?} {cb:?}");
    assert_eq!((ca.rx_datagrams, cb.rx_datagrams), (0, 0), "{ca:?} {cb:?}");
    assert_eq!((ca.shm_links_out, ca.shm_links_in), (1, 1), "{ca:?}");
    assert_eq!((ca.tx_shm_full, ca.shm_refused), (0, 0), "{ca:?}");
    // The READ's responses left their payload in b's memory; a pulled it from there.
    assert!(cb.tx_shm_pulls > 0, "{cb:?}");
    assert_eq!(ca.rx_shm_pulled, cb.tx_shm_pulls, "{ca:?} {cb:?}");
    assert_eq!(ca.rx_shm_pull_failed, 0, "{ca:?}");

    let (a, b) = (side("127.0.31.3", false), side("127.0.31.4", false));
    traffic(&a, &b);
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    assert_eq!((a.qp.path(), b.qp.path()), (Path::Udp, Path::Udp));
    assert_eq!(
        (ca.tx_shm_packets, cb.rx_shm_packets),
        (0, 0),
        "{ca:?} {cb:?}"
    );
    assert!(
        ca.tx_datagrams > 256 && cb.rx_datagrams > 256,
        "{ca:?} {cb:?}"
    );
}

/// Mappings of ring memory in this process.
fn rings_mapped() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("srdma-ring"))
        .count()
}

/// What the peer's region holds at `offset` (READs check it).
fn peer_byte(offset: usize) -> u8 {
    ((offset >> 12) + offset * 7) as u8
}

/// The peer process: a device at `$SRDMA_SHM_PEER`, one RC QP and a region others may
/// write and read (holding [`peer_byte`]s). It prints `qpn psn rkey addr`, reads `qpn psn` of its peer, connects, prints
/// `ready` and lives until its stdin closes (its progress thread takes the WRITEs).
#[test]
fn peer_process() {
    let Ok(ip) = std::env::var(PEER_ENV) else {
        return;
    };
    let s = side(&ip, true);
    let bytes: Vec<u8> = (0..MR_LEN).map(peer_byte).collect();
    s.mr.write(0, &bytes).unwrap();
    let r = s.mr.remote().unwrap();
    println!("{} 300 {} {}", s.qp.qpn().value(), r.rkey, r.addr);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let v: Vec<u32> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let peer = RemoteQp {
        qpn: Qpn::new(v[0]),
        psn: Psn::new(v[1]),
        gid: srdma::Gid::from_ip("127.0.32.1".parse().unwrap()),
        port: srdma::ROCEV2_PORT,
    };
    s.qp.connect(&peer, &params(300)).unwrap();
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut rest = String::new();
    let _ = std::io::stdin().lock().read_line(&mut rest);
}

/// Streams 1 MiB WRITEs into a peer process through shared memory (or READs from it,
/// their payload pulled from the peer's memory, data checked), sends it `signal` once 16
/// completed, and checks the survivor: RETRY_EXC_ERR within its retry budget (a READ whose
/// payload can no longer be pulled from a dead peer ends so too), the QP in error, no ring
/// left mapped once the peer is gone and the device closed.
fn peer_fails(signal: libc::c_int, read: bool) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["peer_process", "--exact", "--nocapture", "--test-threads=1"])
        .env(PEER_ENV, "127.0.32.2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = child.stdin.take().unwrap();
    let mut from = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    // The test harness prints its own lines first.
    let peer: Vec<u64> = loop {
        line.clear();
        assert!(from.read_line(&mut line).unwrap() > 0, "the peer exited");
        let v: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() == 4 {
            break v;
        }
    };
    {
        let a = side("127.0.32.1", true);
        let at = RemoteQp {
            qpn: Qpn::new(peer[0] as u32),
            psn: Psn::new(peer[1] as u32),
            gid: srdma::Gid::from_ip("127.0.32.2".parse::<IpAddr>().unwrap()),
            port: srdma::ROCEV2_PORT,
        };
        a.qp.connect(&at, &params(400)).unwrap();
        writeln!(to, "{} 400", a.qp.qpn().value()).unwrap();
        line.clear();
        from.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let op = |k: u64| {
            let (remote_addr, rkey) = (peer[3] + (k % 4) * (1 << 20), RKey(peer[2] as u32));
            if read {
                SendOp::Read { remote_addr, rkey }
            } else {
                SendOp::Write { remote_addr, rkey }
            }
        };
        // READs land in their own MiB of the region (at most 4 are outstanding).
        let at = |k: u64| if read { (k as usize % 4) << 20 } else { 0 };
        let mut posted = 0u64;
        let mut done = 0u64;
        let mut signalled: Option<Instant> = None;
        let failed_at = loop {
            while posted - done < 4 {
                let sge = a.mr.sge(at(posted), 1 << 20);
                let wr = SendWr::new(posted, op(posted), SgeList::one(sge));
                if a.qp.post_send(wr).is_err() {
                    break;
                }
                posted += 1;
            }
            if let Some(wc) = a.cq.poll_one() {
                if wc.status != WcStatus::Success {
                    assert!(signalled.is_some(), "failed before the signal: {wc:?}");
                    assert_eq!(wc.status, WcStatus::RetryExcErr, "{wc:?}");
                    break Instant::now();
                }
                if read && signalled.is_none() {
                    let mut got = vec![0u8; 1 << 20];
                    a.mr.read(at(wc.wr_id), &mut got).unwrap();
                    let from = (wc.wr_id as usize % 4) << 20;
                    assert!(
                        got.iter()
                            .enumerate()
                            .all(|(i, &b)| b == peer_byte(from + i)),
                        "READ {} brought other bytes",
                        wc.wr_id
                    );
                }
                done += 1;
            }
            if done == 16 && signalled.is_none() {
                assert_eq!(a.qp.path(), Path::SharedMemory);
                // SAFETY: signals our own child, which is alive (we hold its pipes).
                unsafe { libc::kill(child.id() as libc::pid_t, signal) };
                signalled = Some(Instant::now());
            }
            if let Some(t) = signalled {
                assert!(t.elapsed() < Duration::from_secs(10), "no error completion");
            }
        };
        // (retry_cnt + 1) × 67 ms, with slack for a loaded machine.
        let took = failed_at - signalled.unwrap();
        assert!(
            took < Duration::from_secs(3),
            "RETRY_EXC_ERR after {took:?}"
        );
        assert_eq!(a.qp.state(), srdma::QpState::Err);
        let c = a.dev.counters();
        if read {
            // 16 READs of 1 MiB in 1 KiB responses, all pulled.
            assert!(c.rx_shm_pulled >= 16 << 10, "{c:?}");
        } else {
            assert!(c.tx_shm_packets > 16000, "{c:?}");
        }
        // A frozen peer keeps its link (the retransmissions fill its ring); a dead one's
        // ends, and the retransmissions try UDP, which nobody answers either.
        if signal == libc::SIGSTOP {
            assert_eq!(c.tx_datagrams, 0, "{c:?}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(to);
    assert_eq!(rings_mapped(), 0, "a ring stayed mapped");
}

#[test]
fn a_peer_killed_mid_transfer_fails_the_survivor_within_its_retry_budget() {
    peer_fails(libc::SIGKILL, false);
}

#[test]
fn a_peer_frozen_mid_transfer_fails_the_survivor_within_its_retry_budget() {
    peer_fails(libc::SIGSTOP, false);
}

#[test]
fn a_peer_killed_mid_read_fails_the_reader_within_its_retry_budget() {
    peer_fails(libc::SIGKILL, true);
}

#[test]
fn a_peer_frozen_mid_read_fails_the_reader_within_its_retry_budget() {
    peer_fails(libc::SIGSTOP, true);
}

fn ip(args: &str) {
    let ok = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "ip {args} failed (needs root and iproute2; SRDMA_SKIP_NETNS=1 skips)"
    );
}

/// Opens a device at `addr` from a thread inside network namespace `ns` (its sockets live
/// there; the device is then used from any thread).
fn side_in(ns: &str, addr: &str) -> Side {
    let (ns, addr) = (ns.to_string(), addr.to_string());
    std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: setns on a namespace file we hold open; affects this thread only.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        side(&addr, true)
    })
    .join()
    .unwrap()
}

/// Deletes the test's namespaces, also when it fails.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
fn across_network_namespaces_udp_within_one_shared_memory() {
    if std::env::var("SRDMA_SKIP_NETNS").is_ok_and(|v| v == "1") {
        eprintln!("skipped: SRDMA_SKIP_NETNS=1");
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let (na, nb) = (format!("srdmashm-{pid}-a"), format!("srdmashm-{pid}-b"));
    let _gone = Namespaces(vec![na.clone(), nb.clone()]);
    ip(&format!("netns add {na}"));
    ip(&format!("netns add {nb}"));
    ip(&format!(
        "link add sv{pid} netns {na} type veth peer name sv{pid} netns {nb}"
    ));
    for (ns, addrs) in [
        (&na, ["10.214.0.1/24", "10.214.0.3/24"]),
        (&nb, ["10.214.0.2/24", ""]),
    ] {
        for a in addrs.iter().filter(|a| !a.is_empty()) {
            ip(&format!("-n {ns} addr add {a} dev sv{pid}"));
        }
        ip(&format!("-n {ns} link set sv{pid} up"));
        ip(&format!("-n {ns} link set lo up"));
    }
    // Another namespace: the peer's name is not visible, UDP.
    let (a, b) = (side_in(&na, "10.214.0.1"), side_in(&nb, "10.214.0.2"));
    traffic(&a, &b);
    assert_eq!((a.qp.path(), b.qp.path()), (Path::Udp, Path::Udp));
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    assert_eq!(
        (ca.tx_shm_packets, cb.tx_shm_packets),
        (0, 0),
        "{ca:?} {cb:?}"
    );
    assert!(
        ca.tx_datagrams > 256 && cb.rx_datagrams > 256,
        "{ca:?} {cb:?}"
    );
    // The same namespace, another address on the veth: shared memory.
    drop((a, b));
    let (c, d) = (side_in(&na, "10.214.0.3"), side_in(&na, "10.214.0.1"));
    traffic(&c, &d);
    assert_eq!(
        (c.qp.path(), d.qp.path()),
        (Path::SharedMemory, Path::SharedMemory)
    );
    let (cc, cd) = (c.dev.counters(), d.dev.counters());
    assert_eq!((cc.tx_datagrams, cd.tx_datagrams), (0, 0), "{cc:?} {cd:?}");
}
