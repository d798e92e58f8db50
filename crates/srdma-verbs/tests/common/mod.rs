//! What the tests that run Debian's binaries on the drop-in library share.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A directory where both `libibverbs.so.1` and `librdmacm.so.1` are the drop-in library
/// (one file), built once per test run.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
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
        let exe = std::env::current_exe().unwrap();
        let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
        // The test's name, without the hash cargo appends (it changes with every build).
        let name = match stem.rsplit_once('-') {
            Some((name, hash))
                if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                name
            }
            _ => &stem,
        };
        let dir = scratch_dir(name);
        for name in ["libibverbs.so.1", "librdmacm.so.1"] {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).unwrap();
        }
        dir
    })
}

/// A directory `srdma-NAME-PID` in the temporary directory, created for this process.
/// The test binary cannot remove it when it exits (the statics that hold it are never
/// dropped), so the same directories of processes that are gone are removed first: one
/// run's directories last until the next run.
pub fn scratch_dir(name: &str) -> PathBuf {
    let tmp = std::env::temp_dir();
    let prefix = format!("srdma-{name}-");
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for e in entries.flatten() {
            let file = e.file_name();
            let pid = file.to_str().and_then(|f| f.strip_prefix(&prefix));
            if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok())
                && pid != std::process::id()
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = tmp.join(format!("{prefix}{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `target/debug/srdma`, built (with the drop-in library beside it, where `srdma exec`
/// finds it) once per test run.
pub fn srdma_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let st = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "srdma-verbs", "-p", "srdma-cli"])
            .current_dir(&root)
            .status()
            .expect("running cargo build -p srdma-verbs -p srdma-cli");
        assert!(
            st.success(),
            "cargo build -p srdma-verbs -p srdma-cli failed"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("debug/srdma").canonicalize().unwrap()
    })
}

/// Waits until `child` exits or `deadline` passes (then kills it), reading its stdout and
/// stderr meanwhile: a program that prints more than a pipe holds (rping -V, the pyverbs
/// suite) would otherwise block before it exits. The status is None if it was killed.
fn collect(
    mut child: Child,
    deadline: Instant,
) -> (Option<ExitStatus>, ExitStatus, Vec<u8>, Vec<u8>) {
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let last = status.unwrap_or_else(|| child.wait().unwrap());
    (status, last, out.join().unwrap(), err.join().unwrap())
}

/// Waits for `child` at most `limit`, killing it past that (and then failing with what it
/// printed).
pub fn wait(child: Child, limit: Duration, what: &str) -> Output {
    let (status, last, stdout, stderr) = collect(child, Instant::now() + limit);
    let o = Output {
        status: last,
        stdout,
        stderr,
    };
    assert!(
        status.is_some(),
        "{what} did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// How a process ended (None: still running at its deadline, then killed) and its output,
/// stdout then stderr.
pub struct Ended {
    /// The exit status; None if it was killed at its deadline.
    pub status: Option<ExitStatus>,
    /// stdout and stderr, one after the other.
    pub out: String,
}

impl Ended {
    /// It exited, with status 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "status {:?}\n{}", self.status, self.out)
    }
}

/// Waits until `child` exits or `deadline` passes (then kills it), reading its output.
pub fn finish(child: Child, deadline: Instant) -> Ended {
    let (status, _, o, e) = collect(child, deadline);
    Ended {
        status,
        out: format!(
            "{}{}",
            String::from_utf8_lossy(&o),
            String::from_utf8_lossy(&e)
        ),
    }
}

/// stdout and stderr of `o`, one after the other.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
