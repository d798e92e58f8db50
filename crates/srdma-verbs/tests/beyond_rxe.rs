//! rdma-core 44's own test suite (python3-pyverbs, Debian's unmodified package) on the
//! drop-in library, for what Debian's kernel rxe (6.1) fails or skips: RDMA ATOMIC WRITE
//! through `ibv_wr_atomic_write`, and XRC (domains, XRC SRQs, XRC_SEND/XRC_RECV QPs) with
//! SENDs, SENDs with immediate, both post-send APIs, extended CQs and atomics; and the same
//! from C with bad input (tests/c/xrc_bad_input.c).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::lib_dir;

/// The tests that must print `ok`.
const MUST_PASS: [&str; 7] = [
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_atomic_write",
    "tests.test_atomic.AtomicTest.test_xrc_atomic_cmp_and_swap",
    "tests.test_atomic.AtomicTest.test_xrc_atomic_fetch_and_add",
    "tests.test_cqex.CqExTestCase.test_xrc_traffic_cq_ex",
    "tests.test_qpex.QpExTestCase.test_qp_ex_xrc_send",
    "tests.test_qpex.QpExTestCase.test_qp_ex_xrc_send_imm",
    "tests.test_relaxed_ordering.RoTestCase.test_ro_xrc_traffic",
];

/// rdma-core's tests, as Debian ships them (gzipped in the documentation), unpacked into a
/// fresh directory; `None` (the test is skipped) without python3-pyverbs.
fn suite() -> Option<PathBuf> {
    let src = Path::new("/usr/share/doc/rdma-core/tests");
    let pyverbs = Path::new("/usr/lib/python3/dist-packages/pyverbs");
    if !src.is_dir() || !pyverbs.is_dir() {
        eprintln!(
            "skipped: install python3-pyverbs (rdma-core's tests in {})",
            src.display()
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!("srdma-pyverbs-suite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("cp")
        .arg("-r")
        .arg(src)
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    let tests = dir.join("tests");
    for e in std::fs::read_dir(&tests).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "gz") {
            let st = Command::new("gunzip").arg("-f").arg(&p).status().unwrap();
            assert!(st.success(), "gunzip {}", p.display());
        }
    }
    Some(dir)
}

#[test]
fn pyverbs_atomic_write_and_xrc_tests_pass() {
    let Some(dir) = suite() else { return };
    let child = Command::new("/usr/bin/python3")
        .arg("tests/run_tests.py")
        .args(["--dev", "srdma_lo", "--gid", "1", "-v"])
        .args(MUST_PASS)
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", lib_dir())
        // srdma_lo, which the default list leaves out where another interface has an
        // address.
        .env("SRDMA_DEVICES", "127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running python3");
    // unittest writes its report to stderr.
    let out = common::wait(child, Duration::from_secs(300), "rdma-core's tests");
    let _ = std::fs::remove_dir_all(&dir);
    let report = common::text(&out);
    for name in MUST_PASS {
        let method = name.rsplit('.').next().unwrap();
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("{method} (")))
            .unwrap_or_else(|| panic!("{name} did not run:\n{report}"));
        assert!(line.ends_with("... ok"), "{line}\n{report}");
    }
    assert!(out.status.success(), "{report}");
}

#[test]
fn xrc_and_atomic_write_from_c_with_bad_input() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/xrc_bad_input.c");
    let exe = lib_dir().join("xrc_bad_input");
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("running cc: install gcc");
    assert!(
        o.status.success(),
        "compiling xrc_bad_input.c (libibverbs-dev installed?): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let child = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SRDMA_DEVICES", "127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = common::wait(child, Duration::from_secs(60), "xrc_bad_input");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("0 failures"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
