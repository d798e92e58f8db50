//! rdma-core's own test suite (Debian's python3-pyverbs 44, `/usr/share/doc/rdma-core/tests`)
//! on the drop-in library, against what the same suite does on kernel rxe.
//!
//! The suite runs as a user would run it: `srdma exec /usr/bin/python3 tests/run_tests.py
//! --gid 1 -v` (the drop-in first on the loader's path, and sysfs entries for srdma's
//! devices, where the rdma_cm tests find a device's interface address), every device of this
//! host listed, the first one chosen by the suite. `testdata/rdma-core-suite/rxe.txt` is the suite's verbose output
//! on kernel rxe (Debian 6.1 kernel, rdma-core 44, in the interop lab's qemu guest): every
//! test that passes there must pass here, a test may error or fail here only where it errors
//! or fails on rxe, and a test srdma skips must be one rxe skips (or errors on: srdma says
//! it lacks the feature where rxe claims it and fails). Some tests rxe skips or fails must
//! pass here ([`BEYOND_RXE`]).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A test's outcome, as unittest's verbose runner prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    Error,
    Fail,
    Skip(String),
}

impl Outcome {
    fn parse(s: &str) -> Option<Outcome> {
        let s = s.trim();
        match s {
            "ok" => Some(Outcome::Ok),
            "ERROR" => Some(Outcome::Error),
            "FAIL" => Some(Outcome::Fail),
            _ => s
                .strip_prefix("skipped ")
                .map(|why| Outcome::Skip(why.to_string())),
        }
    }

    fn short(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "ERROR",
            Outcome::Fail => "FAIL",
            Outcome::Skip(_) => "skipped",
        }
    }
}

/// Test id → outcome, from unittest's verbose output. A test's line is `name (id)`, its
/// outcome follows ` ... ` on that line or on its docstring's line; a test that prints puts
/// its output after the ` ... ` and its outcome alone on a later line.
fn parse(out: &str) -> BTreeMap<String, Outcome> {
    let mut res = BTreeMap::new();
    let mut cur: Option<String> = None;
    for line in out.lines() {
        let mut rest = line;
        if let Some((name, tail)) = line.split_once(" (") {
            if name.starts_with("test") && !name.contains(' ') {
                if let Some((id, after)) = tail.split_once(')') {
                    if id.starts_with("tests.") {
                        cur = Some(id.to_string());
                        rest = after;
                    }
                }
            }
        }
        let Some(id) = &cur else { continue };
        let found = match rest.rsplit_once(" ... ") {
            Some((_, st)) => Outcome::parse(st),
            None => Outcome::parse(rest),
        };
        if let Some(o) = found {
            res.insert(id.clone(), o);
            cur = None;
        }
    }
    res
}

/// Tests that pass on rxe and not yet on srdma, with why. Each must still not pass here:
/// once one does, take it off the list.
const KNOWN_GAPS: &[(&str, &str)] = &[];

/// Tests rxe does not pass (it skips or fails them) that srdma must pass.
const BEYOND_RXE: &[&str] = &[
    // rxe (Debian 6.1) skips them: its rereg answers EOPNOTSUPP.
    "tests.test_mr.MRTest.test_mr_rereg_access",
    "tests.test_mr.MRTest.test_mr_rereg_access_bad_flow",
    "tests.test_mr.MRTest.test_mr_rereg_addr",
    "tests.test_mr.MRTest.test_mr_rereg_pd",
    // rxe (Debian 6.1) has no ATOMIC WRITE (kernel 6.2) and no XRC.
    "tests.test_qpex.QpExTestCase.test_qp_ex_rc_atomic_write",
    "tests.test_atomic.AtomicTest.test_xrc_atomic_cmp_and_swap",
    "tests.test_atomic.AtomicTest.test_xrc_atomic_fetch_and_add",
    "tests.test_cqex.CqExTestCase.test_xrc_traffic_cq_ex",
    "tests.test_qpex.QpExTestCase.test_qp_ex_xrc_send",
    "tests.test_qpex.QpExTestCase.test_qp_ex_xrc_send_imm",
    "tests.test_relaxed_ordering.RoTestCase.test_ro_xrc_traffic",
    // rxe (in the lab's guest) skips them: its device has no netdev in sysfs
    // (`/sys/class/infiniband/rxe0/device/net/`), where the suite looks for the address to
    // connect to. `srdma exec` gives srdma's devices those entries.
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_ex_leave_multicast_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_ex_multicast_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_multicast_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_read",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_reject_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_traffic_external_qp",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_udp_traffic",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_async_write",
    "tests.test_rdmacm.CMTestCase.test_rdmacm_sync_traffic",
];

/// The suite's folder, copied out of python3-pyverbs' documentation and unzipped.
fn suite_copy() -> std::path::PathBuf {
    let src = Path::new("/usr/share/doc/rdma-core/tests");
    assert!(
        src.join("run_tests.py").exists() || src.join("run_tests.py.gz").exists(),
        "rdma-core's test suite is missing: install python3-pyverbs (apt-get install \
         python3-pyverbs), or run scripts/test.sh as root"
    );
    let dir = std::env::temp_dir().join(format!("srdma-rdma-core-suite-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let tests = dir.join("tests");
    std::fs::create_dir_all(&tests).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, tests.join(p.file_name().unwrap())).unwrap();
        }
    }
    let st = Command::new("sh")
        .arg("-c")
        .arg("gunzip -f tests/*.gz")
        .current_dir(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "gunzip of the suite's files failed");
    dir
}

#[test]
fn rdma_core_suite_matches_rxe() {
    let dir = suite_copy();
    let child = Command::new(common::srdma_bin())
        .args([
            "exec",
            "/usr/bin/python3",
            "tests/run_tests.py",
            "--gid",
            "1",
            "-v",
        ])
        .current_dir(&dir)
        .env_remove("SRDMA_DEVICES")
        .env_remove("SRDMA_SYSFS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait(child, Duration::from_secs(300), "rdma-core's suite");
    let log = common::text(&out);
    let _ = std::fs::remove_dir_all(&dir);
    let ours = parse(&log);
    let rxe_text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/rdma-core-suite/rxe.txt"),
    )
    .unwrap();
    let rxe = parse(&rxe_text);
    assert_eq!(rxe.len(), 273, "the rxe baseline lists 273 tests");

    let mut problems = Vec::new();
    let mut count = BTreeMap::<&str, usize>::new();
    for (id, theirs) in &rxe {
        let Some(o) = ours.get(id) else {
            problems.push(format!(
                "{id}: no outcome on srdma (rxe: {})",
                theirs.short()
            ));
            continue;
        };
        *count.entry(o.short()).or_default() += 1;
        let gap = KNOWN_GAPS.iter().any(|(g, _)| g == id);
        if BEYOND_RXE.contains(&id.as_str()) && *o != Outcome::Ok {
            problems.push(format!("{id}: srdma must pass it, got {o:?}"));
        }
        let bad = |x: &Outcome| matches!(x, Outcome::Error | Outcome::Fail);
        if gap {
            if *o == Outcome::Ok {
                problems.push(format!("{id} passes now: take it off KNOWN_GAPS"));
            }
        } else if *theirs == Outcome::Ok && *o != Outcome::Ok {
            problems.push(format!("{id}: passes on rxe, {o:?} on srdma"));
        } else if bad(o) && !bad(theirs) {
            problems.push(format!("{id}: {} on srdma, {theirs:?} on rxe", o.short()));
        }
    }
    for id in ours.keys().filter(|id| !rxe.contains_key(*id)) {
        problems.push(format!("{id}: not in the rxe baseline"));
    }
    eprintln!("rdma-core suite on srdma: {count:?} (rxe: 86 ok, 8 errors, 179 skipped)");
    assert!(
        problems.is_empty(),
        "rdma-core's suite differs from rxe:\n{}\n\nsuite output:\n{log}",
        problems.join("\n")
    );
    assert!(
        count.get("ok").copied().unwrap_or(0) >= 86 - KNOWN_GAPS.len(),
        "{count:?}"
    );
}

#[test]
fn parser_reads_every_form_of_outcome() {
    let out = "test_a (tests.t.A.test_a) ... ok\n\
               test_b (tests.t.A.test_b)\nDoc line ... skipped 'no'\n\
               test_c (tests.t.A.test_c) ... printed = 2\nok\n\
               test_d (tests.t.A.test_d) ... ERROR\n\
               test_e (tests.t.A.test_e)\nDoc ... FAIL\n";
    let p = parse(out);
    assert_eq!(p["tests.t.A.test_a"], Outcome::Ok);
    assert_eq!(p["tests.t.A.test_b"], Outcome::Skip("'no'".into()));
    assert_eq!(p["tests.t.A.test_c"], Outcome::Ok);
    assert_eq!(p["tests.t.A.test_d"], Outcome::Error);
    assert_eq!(p["tests.t.A.test_e"], Outcome::Fail);
    assert_eq!(p.len(), 5);
}
