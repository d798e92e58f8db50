//! Tests of `srdma devinfo`: the loopback device's output against ibv_devinfo's layout (only
//! the node GUID, which follows the device's free UDP port, is normalised), `-l`, errors, and
//! `--stats` showing the devices of running `srdma rping` processes, then forgetting them.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn devinfo(args: &[&str]) -> Output {
    devinfo_in(None, args)
}

fn devinfo_in(run_dir: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_srdma"));
    cmd.arg("devinfo").args(args).env_remove("SRDMA_PCAP");
    if let Some(d) = run_dir {
        cmd.env("SRDMA_RUN_DIR", d);
    }
    cmd.output().expect("run srdma devinfo")
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("UTF-8 output")
}

/// The active MTU rxe gives an interface of `netdev_mtu` bytes, as `ibv_devinfo` prints it.
fn rxe_active_mtu(netdev_mtu: u32) -> &'static str {
    match netdev_mtu.saturating_sub(80) {
        0..512 => "256 (1)",
        512..1024 => "512 (2)",
        1024..2048 => "1024 (3)",
        2048..4096 => "2048 (4)",
        _ => "4096 (5)",
    }
}

fn lo_active_mtu() -> &'static str {
    let mtu = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65536);
    rxe_active_mtu(mtu)
}

/// Replaces the value of `key:` lines (GUIDs) with `<guid>`, returning the values seen.
fn normalise(out: &str, keys: &[&str]) -> (String, Vec<String>) {
    let mut seen = Vec::new();
    let mut norm = String::new();
    for line in out.split_inclusive('\n') {
        let key = line.trim_start().split(':').next().unwrap_or("");
        if keys.contains(&key) {
            let (head, value) = line.rsplit_once('\t').unwrap();
            seen.push(value.trim_end().to_string());
            norm.push_str(head);
            norm.push_str("\t<guid>\n");
        } else {
            norm.push_str(line);
        }
    }
    (norm, seen)
}

/// What the GUID of srdma_lo is: EUI-64 style from 127.0.0.1 and the UDP port's low byte.
fn check_guid(guid: &str) {
    let groups: Vec<&str> = guid.split(':').collect();
    assert_eq!(groups.len(), 4, "{guid}");
    assert_eq!(&groups[..3], ["027f", "00ff", "fe00"], "{guid}");
    assert!(
        groups[3].starts_with("01") && groups[3].len() == 4,
        "{guid}"
    );
}

const BRIEF: &str = "hca_id:\tsrdma_lo
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t@VERSION@
\tnode_guid:\t\t\t<guid>
\tsys_image_guid:\t\t\t<guid>
\tvendor_id:\t\t\t0xffffff
\tvendor_part_id:\t\t\t0
\thw_ver:\t\t\t\t0x0
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t@MTU@
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t0
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tEthernet

";

fn expected_brief() -> String {
    BRIEF
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
        .replace("@MTU@", lo_active_mtu())
}

#[test]
fn loopback_device_as_ibv_devinfo_prints_it() {
    let out = devinfo(&["-d", "srdma_lo"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (norm, guids) = normalise(&text(&out.stdout), &["node_guid", "sys_image_guid"]);
    assert_eq!(norm, expected_brief());
    assert_eq!(
        guids[0], guids[1],
        "rxe reports the node GUID as the system image GUID"
    );
    check_guid(&guids[0]);
    // -i 1 is the same; the whole list contains it.
    let one = devinfo(&["-d", "srdma_lo", "-i", "1"]);
    let (norm, _) = normalise(&text(&one.stdout), &["node_guid", "sys_image_guid"]);
    assert_eq!(norm, expected_brief());
    let all = devinfo(&[]);
    assert_eq!(all.status.code(), Some(0), "{all:?}");
    let (norm, _) = normalise(&text(&all.stdout), &["node_guid", "sys_image_guid"]);
    assert!(norm.contains(&expected_brief()), "{norm}");
}

#[test]
fn loopback_device_verbose() {
    let out = devinfo(&["-d", "srdma_lo", "-v"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = text(&out.stdout);
    let (norm, guids) = normalise(&stdout, &["node_guid", "sys_image_guid"]);
    check_guid(&guids[0]);
    // GID 0 is the link-local GID made from the node GUID (as rxe makes it from the MAC).
    let g: Vec<u16> = guids[0]
        .split(':')
        .map(|h| u16::from_str_radix(h, 16).unwrap())
        .collect();
    let gid0 = format!("fe80::{:x}:{:x}:{:x}:{:x}", g[0], g[1], g[2], g[3]);
    let norm = norm.replace(&gid0, "<gid0>");
    let want = format!(
        "hca_id:\tsrdma_lo
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t{version}
\tnode_guid:\t\t\t<guid>
\tsys_image_guid:\t\t\t<guid>
\tvendor_id:\t\t\t0xffffff
\tvendor_part_id:\t\t\t0
\thw_ver:\t\t\t\t0x0
\tphys_port_cnt:\t\t\t1
\tmax_mr_size:\t\t\t0xffffffffffffffff
\tpage_size_cap:\t\t\t0x1000
\tmax_qp:\t\t\t\t65536
\tmax_qp_wr:\t\t\t16384
\tdevice_cap_flags:\t\t0x01021806
\t\t\t\t\tBAD_PKEY_CNTR
\t\t\t\t\tBAD_QKEY_CNTR
\t\t\t\t\tSYS_IMAGE_GUID
\t\t\t\t\tRC_RNR_NAK_GEN
\t\t\t\t\tMEM_WINDOW
\t\t\t\t\tMEM_WINDOW_TYPE_2B
\tmax_sge:\t\t\t32
\tmax_sge_rd:\t\t\t32
\tmax_cq:\t\t\t\t2147483647
\tmax_cqe:\t\t\t4194303
\tmax_mr:\t\t\t\t524287
\tmax_pd:\t\t\t\t2147483647
\tmax_qp_rd_atom:\t\t\t128
\tmax_ee_rd_atom:\t\t\t0
\tmax_res_rd_atom:\t\t8388608
\tmax_qp_init_rd_atom:\t\t128
\tmax_ee_init_rd_atom:\t\t0
\tatomic_cap:\t\t\tATOMIC_HCA (1)
\tmax_ee:\t\t\t\t0
\tmax_rdd:\t\t\t0
\tmax_mw:\t\t\t\t524287
\tmax_raw_ipv6_qp:\t\t0
\tmax_raw_ethy_qp:\t\t0
\tmax_mcast_grp:\t\t\t8192
\tmax_mcast_qp_attach:\t\t56
\tmax_total_mcast_qp_attach:\t458752
\tmax_ah:\t\t\t\t2147483647
\tmax_fmr:\t\t\t0
\tmax_srq:\t\t\t2147483647
\tmax_srq_wr:\t\t\t16384
\tmax_srq_sge:\t\t\t27
\tmax_pkeys:\t\t\t1
\tlocal_ca_ack_delay:\t\t15
\tgeneral_odp_caps:
\trc_odp_caps:
\t\t\t\t\tNO SUPPORT
\tuc_odp_caps:
\t\t\t\t\tNO SUPPORT
\tud_odp_caps:
\t\t\t\t\tNO SUPPORT
\txrc_odp_caps:
\t\t\t\t\tNO SUPPORT
\tcompletion_timestamp_mask not supported
\tcore clock not supported
\tdevice_cap_flags_ex:\t\t0x1021806
\ttso_caps:
\t\tmax_tso:\t\t\t0
\trss_caps:
\t\tmax_rwq_indirection_tables:\t\t\t0
\t\tmax_rwq_indirection_table_size:\t\t\t0
\t\trx_hash_function:\t\t\t\t0x0
\t\trx_hash_fields_mask:\t\t\t\t0x0
\tmax_wq_type_rq:\t\t\t0
\tpacket_pacing_caps:
\t\tqp_rate_limit_min:\t0kbps
\t\tqp_rate_limit_max:\t0kbps
\ttag matching not supported
\tnum_comp_vectors:\t\t{vectors}
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t{mtu}
\t\t\tsm_lid:\t\t\t0
\t\t\tport_lid:\t\t0
\t\t\tport_lmc:\t\t0x00
\t\t\tlink_layer:\t\tEthernet
\t\t\tmax_msg_sz:\t\t0x80000000
\t\t\tport_cap_flags:\t\t0x00000000
\t\t\tport_cap_flags2:\t0x0000
\t\t\tmax_vl_num:\t\t1 (1)
\t\t\tbad_pkey_cntr:\t\t0x0
\t\t\tqkey_viol_cntr:\t\t0x0
\t\t\tsm_sl:\t\t\t0
\t\t\tpkey_tbl_len:\t\t1
\t\t\tgid_tbl_len:\t\t1024
\t\t\tsubnet_timeout:\t\t0
\t\t\tinit_type_reply:\t0
\t\t\tactive_width:\t\t1X (1)
\t\t\tactive_speed:\t\t2.5 Gbps (1)
\t\t\tphys_state:\t\tLINK_UP (5)
\t\t\tGID[  0]:\t\t<gid0>, RoCE v2
\t\t\tGID[  1]:\t\t::ffff:127.0.0.1, RoCE v2

",
        version = env!("CARGO_PKG_VERSION"),
        mtu = lo_active_mtu(),
        vectors = configured_cpus()
    );
    assert_eq!(norm, want);
}

#[test]
fn list_names_every_device() {
    let out = devinfo(&["-l"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let head = lines.next().unwrap();
    let names: Vec<&str> = lines
        .take_while(|l| !l.is_empty())
        .map(|l| l.strip_prefix('\t').expect("tab-indented name"))
        .collect();
    let n = names.len();
    assert_eq!(
        head,
        format!("{n} HCA{} found:", if n == 1 { "" } else { "s" })
    );
    assert!(stdout.ends_with("\n\n"));
    assert!(names.contains(&"srdma_lo"), "{stdout}");
    // Every listed device opens and reports under its name.
    for name in names {
        let one = devinfo(&["-d", name]);
        assert_eq!(one.status.code(), Some(0), "{name}: {one:?}");
        assert!(text(&one.stdout).starts_with(&format!("hca_id:\t{name}\n")));
    }
}

#[test]
fn unknown_device_and_port_exit_1() {
    let out = devinfo(&["-d", "srdma_nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("IB device 'srdma_nope' wasn't found") && err.contains("srdma_lo"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = devinfo(&["-d", "srdma_lo", "-i", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("Invalid port requested for device srdma_lo: 2"));
}

#[test]
fn bad_arguments_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["-i", "0"], "at least 1"),
        (&["-i", "one"], "at least 1"),
        (&["--bogus"], "--bogus"),
        (&["-l", "-v"], "cannot be used with"),
        (&["-l", "--stats"], "cannot be used with"),
        (&["-d"], "-d"),
    ];
    for (args, needle) in cases {
        let out = devinfo(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
        assert!(out.stdout.is_empty());
    }
}

/// A scratch statistics directory for one test, removed at the end.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A background `srdma rping` (over srdma's TCP CM, on a port of its own) that is killed
/// if the test fails.
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rping(run_dir: &Path, args: &[&str]) -> Bg {
    Bg(Command::new(env!("CARGO_BIN_EXE_srdma"))
        .args(["rping", "--tcp-cm"])
        .args(args)
        .env_remove("SRDMA_PCAP")
        .env("SRDMA_RUN_DIR", run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start srdma rping"))
}

/// A `--stats` line, parsed: pid, address, counters.
type StatsLine = (u32, String, Vec<(String, u64)>);

/// The `--stats` line of the device bound to `ip`.
fn stats_line(out: &str, ip: &str) -> Option<StatsLine> {
    let line = out.lines().find(|l| l.contains(&format!(" local {ip}:")))?;
    let w: Vec<&str> = line.split(' ').collect();
    assert_eq!(
        (w[0], w[1], w[2], w[4]),
        ("link", "srdma_lo/1", "pid", "local"),
        "{line}"
    );
    let counters = w[6..]
        .chunks(2)
        .map(|c| (c[0].to_string(), c[1].parse().unwrap()))
        .collect();
    Some((w[3].parse().unwrap(), w[5].to_string(), counters))
}

fn counter(c: &[(String, u64)], name: &str) -> u64 {
    c.iter().find(|(k, _)| k == name).unwrap().1
}

#[test]
fn stats_show_the_devices_of_running_processes() {
    let dir =
        RunDir(std::env::temp_dir().join(format!("srdma-devinfo-stats-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let stats = || {
        let out = devinfo_in(Some(&dir.0), &["--stats"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        (text(&out.stdout), text(&out.stderr))
    };
    let (out, err) = stats();
    assert_eq!(out, "");
    assert!(err.contains("no srdma device is open"), "{err}");

    // An idle server is listed at once, with zero counters.
    let mut server = rping(&dir.0, &["-s", "-a", "127.63.1.1", "-p", "17500"]);
    let t0 = Instant::now();
    let (pid, local, c) = loop {
        if let Some(l) = stats_line(&stats().0, "127.63.1.1") {
            break l;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "server never listed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(pid, server.0.id());
    assert!(local.starts_with("127.63.1.1:"));
    assert_eq!(counter(&c, "rx_datagrams"), 0);
    assert_eq!(counter(&c, "rdma_recvs"), 0);
    assert!(c.len() > 20, "device and QP counters: {c:?}");

    // With a client pinging, both devices are listed and the server's counters move.
    let mut client = rping(
        &dir.0,
        &[
            "-c",
            "-a",
            "127.63.1.1",
            "--bind",
            "127.63.1.2",
            "-p",
            "17500",
        ],
    );
    let t0 = Instant::now();
    loop {
        let (out, _) = stats();
        let s = stats_line(&out, "127.63.1.1");
        let c = stats_line(&out, "127.63.1.2");
        if let (Some(s), Some(c)) = (s, c) {
            assert_eq!(c.0, client.0.id());
            let received = counter(&s.2, "rx_datagrams") + counter(&s.2, "rx_shm_packets");
            if counter(&s.2, "rdma_recvs") > 10 && received > 10 {
                assert!(counter(&s.2, "sent_pkts") > 0);
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the counters never moved:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A killed client leaves its file behind; the server exits cleanly on its disconnect.
    client.0.kill().unwrap();
    client.0.wait().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = server.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "server still running"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    server
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{status:?}: {err}");
    assert!(err.contains("server DISCONNECT EVENT..."), "{err}");
    let stats_files = || {
        std::fs::read_dir(&dir.0)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                n.to_string_lossy().ends_with(".stats")
            })
            .count()
    };
    assert_eq!(stats_files(), 1, "the killed client's file is still there");

    // Both are gone from the list, and the reader removed the dead client's file.
    let (out, err) = stats();
    assert_eq!(out, "");
    assert!(err.contains("no srdma device is open"), "{err}");
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
    let out = devinfo_in(Some(&dir.0), &["--stats", "-d", "srdma_lo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no srdma device named 'srdma_lo' is open"));
}

/// The drop-in libibverbs, built for this test run (beside the srdma binary, where
/// `srdma exec` looks for it).
fn build_verbs_lib() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let st = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "srdma-verbs"])
        .current_dir(root)
        .status()
        .expect("cargo build -p srdma-verbs");
    assert!(st.success());
}

/// Debian's own ibv_devinfo, run on srdma through `srdma exec`, prints what `srdma devinfo`
/// prints for the same device (GUIDs aside: srdma devinfo opens on a free port, the drop-in
/// describes the device on 4791).
#[test]
fn ibv_devinfo_on_the_drop_in_matches_srdma_devinfo() {
    assert!(
        Path::new("/usr/bin/ibv_devinfo").exists(),
        "install ibverbs-utils (scripts/test.sh does)"
    );
    build_verbs_lib();
    let theirs = Command::new(env!("CARGO_BIN_EXE_srdma"))
        // The drop-in's default list leaves srdma_lo out where another interface has an
        // address: name it.
        .args([
            "exec",
            "--device",
            "127.0.0.1",
            "ibv_devinfo",
            "-v",
            "-d",
            "srdma_lo",
        ])
        .output()
        .unwrap();
    assert!(theirs.status.success(), "{}", text(&theirs.stderr));
    let ours = devinfo(&["-v", "-d", "srdma_lo"]);
    assert!(ours.status.success());
    let strip = |o: &Output| {
        let (n, _) = normalise(&text(&o.stdout), &["node_guid", "sys_image_guid"]);
        n.lines()
            .filter(|l| !l.contains("GID[  0]"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&theirs), strip(&ours));
}

/// The CPUs this machine is configured with, as glibc counts them for `_SC_NPROCESSORS_CONF`
/// (the `cpuN` entries of /sys/devices/system/cpu): one completion vector each, as rxe.
fn configured_cpus() -> usize {
    std::fs::read_dir("/sys/devices/system/cpu")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.strip_prefix("cpu")
                        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(1)
        .max(1)
}
