//! `/dev/infiniband/uverbsN` for programs run by `srdma exec` (a private mount namespace) and
//! by `srdma setup-dev` (persistent nodes), without touching this host's `/dev`: the tests
//! that make nodes for good do it on a tmpfs `/dev` of their own mount namespace.

use std::path::Path;
use std::process::{Command, Output};

const SRDMA: &str = env!("CARGO_BIN_EXE_srdma");

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `prog` runs (util-linux's unshare, setpriv).
fn have(prog: &str) -> bool {
    Command::new(prog).arg("--version").output().is_ok()
}

/// `sh -c script` in a new mount namespace with a tmpfs on `/dev`, where `$S` is srdma; or
/// `None` (with a message) without root or `unshare`.
fn in_private_dev(script: &str) -> Option<Output> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !have("unshare") {
        eprintln!("skipped: needs root and util-linux's unshare");
        return None;
    }
    let full = format!("mount -t tmpfs none /dev && {script}");
    Some(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &full])
            .env("S", SRDMA)
            .output()
            .unwrap(),
    )
}

/// The program sees character devices it may read and write; this host's /dev is unchanged.
#[test]
fn exec_gives_the_program_nodes_and_leaves_dev_alone() {
    let before = Path::new("/dev/infiniband").exists();
    let o = Command::new(SRDMA)
        .args(["exec", "--device", "127.0.77.1", "sh", "-c"])
        .arg(
            "test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 && \
             test -w /dev/infiniband/uverbs0 && test -c /dev/null && echo fine",
        )
        .env_remove("SRDMA_DEV_NODES")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("fine"));
    assert_eq!(
        Path::new("/dev/infiniband").exists(),
        before,
        "host /dev changed"
    );
}

/// `setup-dev` makes uverbs0..N as 1:3 nodes, mode 0666, keeps what exists, and `--remove`
/// takes away only its own.
#[test]
fn setup_dev_makes_and_removes_nodes() {
    let Some(o) = in_private_dev(
        "$S setup-dev --count 2 && test -c /dev/infiniband/uverbs1 && \
         ! test -e /dev/infiniband/uverbs2 && stat -c '%a %t:%T' /dev/infiniband/uverbs0 && \
         touch /dev/infiniband/uverbs9 && $S setup-dev --remove && \
         ! test -e /dev/infiniband/uverbs0 && test -e /dev/infiniband/uverbs9 && echo done",
    ) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("666 1:3"), "{}", text(&o));
    assert!(out.contains("done"), "{}", text(&o));
}

/// Where neither a mount nor a user namespace is allowed, the program still runs, and a note
/// says why it has no nodes and what to do. Simulated in a user namespace that may not
/// create further ones, without capabilities.
#[test]
fn exec_without_namespaces_says_so_and_runs_the_program() {
    if !have("unshare") || !have("setpriv") {
        eprintln!("skipped: needs util-linux's unshare and setpriv");
        return;
    }
    let script = "echo 0 > /proc/sys/user/max_user_namespaces && \
                  exec setpriv --inh-caps=-all --bounding-set=-all \"$S\" exec sh -c \
                  '! test -e /dev/infiniband/uverbs0 && echo program-ran'";
    let o = Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c", script])
        .env("S", SRDMA)
        .env_remove("SRDMA_DEV_NODES")
        .output()
        .unwrap();
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unshare") {
        eprintln!("skipped: user namespaces unavailable here: {}", text(&o));
        return;
    }
    if Path::new("/dev/infiniband/uverbs0").exists() {
        return; // Real nodes: nothing to miss.
    }
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("program-ran"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no /dev/infiniband/uverbsN nodes") && err.contains("srdma setup-dev"),
        "{}",
        text(&o)
    );
}

/// With a `/dev/infiniband` already there (a real device's nodes), `exec` covers only that
/// directory: what was in it stays, the missing uverbsN are added.
#[test]
fn exec_adds_to_an_existing_infiniband_directory() {
    let Some(o) = in_private_dev(
        "mknod -m 666 /dev/null c 1 3 && mkdir /dev/infiniband && \
         mknod -m 666 /dev/infiniband/rdma_cm c 1 3 && \
         mknod -m 666 /dev/infiniband/uverbs0 c 1 3 && \
         \"$S\" exec --device 127.0.77.2 sh -c 'test -c /dev/infiniband/rdma_cm && \
         test -c /dev/infiniband/uverbs0 && test -c /dev/infiniband/uverbs5 && \
         test -c /dev/null && echo inside-ok' && ! test -e /dev/infiniband/uverbs5 && \
         echo outside-ok",
    ) else {
        return;
    };
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("inside-ok") && out.contains("outside-ok"),
        "{}",
        text(&o)
    );
}
