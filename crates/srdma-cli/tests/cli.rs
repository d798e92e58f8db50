//! End-to-end tests of the `srdma` binary: exit codes, messages and output lines.

use std::path::PathBuf;
use std::process::{Command, Output};

fn srdma(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_srdma"))
        .args(args)
        .output()
        .expect("run srdma")
}

fn capture(name: &str) -> String {
    format!("{}/../../testdata/pcaps/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("srdma-cli-test-{}-{name}", std::process::id()))
}

/// A clean rxe capture decodes with exit 0, one line per RoCEv2 packet, every ICRC ok.
#[test]
fn decode_clean_capture() {
    let out = srdma(&["decode", &capture("rc_rdma_write.pcap")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(" > ")).collect();
    assert_eq!(lines.len(), 30);
    assert!(lines.iter().all(|l| l.ends_with("icrc=ok")), "{stdout}");
    assert!(
        stdout.contains("RC_RDMA_WRITE_FIRST qp=0x000012"),
        "{stdout}"
    );
    assert!(stdout.contains("reth[va=0x"), "{stdout}");
    assert!(stdout.contains("RC_RDMA_WRITE_MIDDLE"), "{stdout}");
    assert!(stdout.contains("RC_RDMA_WRITE_LAST"), "{stdout}");
    assert!(stdout.contains(
        "30 RoCEv2 packets: 30 ICRC ok, 0 bad ICRC, 0 unverifiable, 0 malformed; 83 other"
    ));
}

/// The probes of host_rc_pingpong.pcap (three bad ICRCs, one TVer 1) make decode fail with
/// exit 1, and each is named on its own line.
#[test]
fn decode_reports_the_broken_probes() {
    let out = srdma(&["decode", &capture("host_rc_pingpong.pcap")]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let line = |n: usize| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{n} ")))
            .unwrap()
            .to_string()
    };
    for n in [15, 16, 17] {
        assert!(line(n).contains("icrc=BAD(carried 0x"), "{}", line(n));
    }
    assert!(
        line(20).contains("MALFORMED: bad BTH transport header version 1"),
        "{}",
        line(20)
    );
    assert!(line(18).ends_with("icrc=ok"));
    assert!(text(&out.stderr).contains("1 malformed RoCEv2 packets, 3 with a bad ICRC"));
}

/// `--verbose` prints every header's fields.
#[test]
fn decode_verbose_prints_every_field() {
    let out = srdma(&["decode", "--verbose", &capture("rc_atomic_fetch_add.pcap")]);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    for needle in [
        "BTH: opcode=0x14 (RC_FETCH_ADD)",
        "AtomicETH: va=0x",
        "swap_add=0x1 (1)",
        "AtomicAckETH: orig=",
        "IPv4: tos=",
        "UDP: sport=",
        "ICRC: wire bytes",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in\n{s}");
    }
}

/// A file that is not a pcap, and a missing file, give a clear error and exit 1.
#[test]
fn decode_rejects_non_pcap() {
    let p = temp("notpcap");
    std::fs::write(&p, b"this is not a capture at all").unwrap();
    let out = srdma(&["decode", p.to_str().unwrap()]);
    std::fs::remove_file(&p).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a pcap file"),
        "{}",
        text(&out.stderr)
    );

    let out = srdma(&["decode", "/nonexistent/x.pcap"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/x.pcap"));
}

/// A capture cut off in the middle of a record is reported, not a panic.
#[test]
fn decode_truncated_capture() {
    let data = std::fs::read(capture("rc_send_pingpong.pcap")).unwrap();
    let p = temp("trunc.pcap");
    std::fs::write(&p, &data[..data.len() - 7]).unwrap();
    let out = srdma(&["decode", p.to_str().unwrap()]);
    std::fs::remove_file(&p).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("capture ends inside a record"));
}

/// Wrong arguments are a usage error (exit 2).
#[test]
fn usage_errors_exit_2() {
    assert_eq!(srdma(&[]).status.code(), Some(2));
    assert_eq!(srdma(&["decode"]).status.code(), Some(2));
    assert_eq!(
        srdma(&["decode", "--port", "99999", "x"]).status.code(),
        Some(2)
    );
    assert_eq!(srdma(&["frobnicate"]).status.code(), Some(2));
}

/// The README's main command: decodes the built-in rxe captures and checks them.
#[test]
fn demo_passes() {
    let out = srdma(&["demo"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let s = text(&out.stdout);
    assert!(
        s.contains("374 RoCEv2 packets: 370 parsed and re-verified"),
        "{s}"
    );
    assert!(
        s.contains("live: 24 chunks (98304 bytes) arrived intact at C"),
        "{s}"
    );
    assert!(s.ends_with("demo: OK\n"));
}

/// Traffic on a non-standard port is found with `--port`.
#[test]
fn decode_other_port() {
    let out = srdma(&[
        "decode",
        "--port",
        "18515",
        &capture("rc_send_pingpong.pcap"),
    ]);
    // TCP 18515 is not UDP: nothing is RoCE on that port.
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains(": 0 RoCEv2 packets"));
}

/// `srdma relay node` without `--name` needs exactly one node on this host's addresses:
/// none (127.0.30.x are routed to lo, not addresses of it) or two (both on 127.0.0.1) is a
/// usage error that names the nodes and says to pass --name.
#[test]
fn relay_node_without_name_needs_one_node_on_this_host() {
    let base = srdma(&["relay", "chain", "--hops", "1", "--print-config"]);
    assert!(base.status.success(), "{}", text(&base.stderr));
    let none = text(&base.stdout);
    let path = temp("relay-none.toml");
    std::fs::write(&path, &none).unwrap();
    let out = srdma(&["relay", "node", "--config", path.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no node's address is one of this host's")
            && err.contains("A (127.0.30.1)")
            && err.contains("--name"),
        "{err}"
    );
    let two = none.replace("127.0.30.1", "127.0.0.1").replace(
        "addr = \"127.0.30.2\"",
        "addr = \"127.0.0.1\"\ncm_port = 7481\nudp_port = 4792",
    );
    std::fs::write(&path, two).unwrap();
    let out = srdma(&["relay", "node", "--config", path.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("several nodes") && err.contains("B (127.0.0.1)"),
        "{err}"
    );
    let _ = std::fs::remove_file(&path);
}

/// `srdma relay binomial --sinks N --print-config` prints a configuration the relay accepts:
/// one source, N sinks, no parents, `topology = "binomial"`; 0 sinks is a usage error.
#[test]
fn relay_binomial_prints_a_binomial_configuration() {
    let out = srdma(&["relay", "binomial", "--sinks", "5", "--print-config"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let toml = text(&out.stdout);
    assert!(toml.contains("topology = \"binomial\""), "{toml}");
    assert_eq!(toml.matches("role = \"sink\"").count(), 5, "{toml}");
    assert!(!toml.contains("parent"), "{toml}");
    let cfg = srdma_relay::config::Config::parse(&toml, "printed").unwrap();
    assert_eq!(cfg.sinks().len(), 5);
    let out = srdma(&["relay", "binomial", "--sinks", "0", "--print-config"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("at least one sink"),
        "{}",
        text(&out.stderr)
    );
}
