//! rdma-core's own memory-window tests (python3-pyverbs, the suite Debian ships in
//! /usr/share/doc/rdma-core/tests) on the drop-in libibverbs.so.1: each listed test must say
//! `ok`, as it does on kernel rxe. Skipped, saying why, when /usr/bin/python3 cannot import
//! pyverbs or the suite is not installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The tests that pass on rxe and must pass here.
const TESTS: [&str; 8] = [
    "tests.test_mr.MWTest.test_mw_type1",
    "tests.test_mr.MWTest.test_mw_type2",
    "tests.test_mr.MWTest.test_invalidate_mw_type1",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_local",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_remote",
    "tests.test_mr.MWTest.test_mw_type2_invalidate_dealloc",
    "tests.test_mr.MWTest.test_reg_mw_wrong_type",
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_bind_mw",
];

const SUITE: &str = "/usr/share/doc/rdma-core/tests";
const PYTHON: &str = "/usr/bin/python3";

/// A private directory holding `libibverbs.so.1` (the library built from this crate), so no
/// other run can swap the library under this one.
fn lib_dir(scratch: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let st = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "srdma-verbs"])
        .current_dir(&root)
        .status()
        .expect("running cargo build -p srdma-verbs");
    assert!(st.success(), "cargo build -p srdma-verbs failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let lib = target.join("debug/libibverbs.so").canonicalize().unwrap();
    let dir = scratch.join("lib");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libibverbs.so.1", "librdmacm.so.1"] {
        std::os::unix::fs::symlink(&lib, dir.join(name)).unwrap();
    }
    dir
}

/// The suite, copied and decompressed (Debian gzips its larger files) into `scratch`.
fn suite(scratch: &Path) -> PathBuf {
    let st = Command::new("cp")
        .args(["-r", SUITE])
        .arg(scratch)
        .status()
        .expect("cp");
    assert!(st.success(), "copying {SUITE}");
    let tests = scratch.join("tests");
    for e in std::fs::read_dir(&tests).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "gz") {
            let st = Command::new("gunzip").arg("-f").arg(&p).status().unwrap();
            assert!(st.success(), "gunzip {}", p.display());
        }
    }
    tests
}

/// Why the suite cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if !Path::new(SUITE).join("run_tests.py").exists() {
        return Some(format!(
            "{SUITE}/run_tests.py is missing (package rdma-core's docs)"
        ));
    }
    let ok = Command::new(PYTHON)
        .args(["-c", "import pyverbs.device"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| format!("{PYTHON} cannot import pyverbs (install python3-pyverbs)"))
}

/// The verdict unittest printed for test `id` in `-v` mode: the word after the ` ... ` that
/// follows `(id)` (a test with a docstring prints it in between).
fn verdict<'a>(log: &'a str, id: &str) -> Option<&'a str> {
    let at = log.find(&format!("({id})"))?;
    let rest = &log[at..];
    let v = &rest[rest.find(" ... ")? + 5..];
    Some(v.lines().next().unwrap_or("").trim())
}

#[test]
fn pyverbs_memory_window_tests_pass() {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let scratch = std::env::temp_dir().join(format!("srdma-mw-suite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let lib = lib_dir(&scratch);
    let tests = suite(&scratch);
    let mut child = Command::new(PYTHON)
        .arg(tests.join("run_tests.py"))
        // GID index 1 is the IPv4 one the suite's RoCEv2 tests want (index 0 is the
        // link-local IPv6 GID).
        .args(["--dev", "srdma_lo", "--gid", "1", "-v"])
        .args(TESTS)
        .current_dir(&scratch)
        .env("LD_LIBRARY_PATH", &lib)
        .env("TMPDIR", &scratch)
        // srdma_lo, which the default list leaves out where another interface has an
        // address.
        .env("SRDMA_DEVICES", "127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting python3");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<_> = TESTS
        .iter()
        .filter(|id| verdict(&log, id) != Some("ok"))
        .map(|id| format!("{id}: {:?}", verdict(&log, id)))
        .collect();
    assert!(bad.is_empty(), "not ok:\n{}\n\n{log}", bad.join("\n"));
    let _ = std::fs::remove_dir_all(&scratch);
}
