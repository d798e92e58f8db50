//! What the relay's integration tests share: scratch directories and a tiny tmpfs, node
//! processes (a test binary re-executes itself as a node: the ignored test
//! `common::relay_node_process`, told which node by environment variables, as `srdma relay
//! node` would run it), configurations written and run, reports read, and the progress lines
//! of a node process followed as they come.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use srdma_relay::config::Config;
use srdma_relay::launch::{self, LaunchOptions, NodeResult};
use srdma_relay::node::{self, NodeOptions};
use srdma_relay::report::Report;

const ENV_CONFIG: &str = "SRDMA_RELAY_TEST_CONFIG";
const ENV_NODE: &str = "SRDMA_RELAY_TEST_NODE";

/// The entry point of the node processes the other tests start; does nothing when run by hand.
#[test]
#[ignore = "entry point of the node processes the other tests start"]
fn relay_node_process() {
    let (Ok(cfg), Ok(name)) = (std::env::var(ENV_CONFIG), std::env::var(ENV_NODE)) else {
        return;
    };
    let opts = NodeOptions {
        json: true,
        quiet: true,
    };
    std::process::exit(node::run_file(Path::new(&cfg), &name, &opts));
}

/// The command that runs node `name` of the configuration at `cfg` as a process of this test
/// binary.
pub fn node_command(cfg: &Path, name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "common::relay_node_process",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ENV_CONFIG, cfg)
    .env(ENV_NODE, name);
    c
}

/// A fresh empty directory under the system temp dir, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A directory named after `tag`, this process and a counter.
    pub fn new(tag: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("srdma-relay-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// `name` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `len` pseudo-random bytes (seeded by `seed`) to `name`.
    pub fn random_file(&self, name: &str, len: usize, seed: u64) -> PathBuf {
        let mut x = seed | 1;
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.truncate(len);
        let p = self.path(name);
        std::fs::write(&p, v).unwrap();
        p
    }

    /// Writes `text` to `relay.toml` and loads it (a bad one panics, showing it).
    pub fn config(&self, text: &str) -> (PathBuf, Config) {
        let p = self.path("relay.toml");
        std::fs::write(&p, text).unwrap();
        let c = Config::load(&p).unwrap_or_else(|e| panic!("{e}\n{text}"));
        (p, c)
    }

    /// Files in the directory whose name starts with `prefix`.
    pub fn leftovers(&self, prefix: &str) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny tmpfs mounted on a directory (needs root and mount(2); `None` when unavailable).
pub struct TinyFs(PathBuf);

impl TinyFs {
    /// Mounts a tmpfs of `size` (as mount's `size=` option) on `dir`, made if need be.
    pub fn mount(dir: PathBuf, size: &str) -> Option<TinyFs> {
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(TinyFs(dir))
    }

    /// Where it is mounted.
    pub fn dir(&self) -> &Path {
        &self.0
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Runs every node of `cfg` (written at `cfg_path`) as processes of this binary, within 50 s;
/// the results by node name.
pub fn run(cfg_path: &Path, cfg: &Config) -> BTreeMap<String, NodeResult> {
    let res = launch::run_all(
        cfg,
        |name| node_command(cfg_path, name),
        &LaunchOptions {
            show: false,
            deadline: Duration::from_secs(50),
        },
    )
    .unwrap();
    res.into_iter().map(|r| (r.name.clone(), r)).collect()
}

/// Node `name`'s final report (it printed one).
pub fn report<'a>(r: &'a BTreeMap<String, NodeResult>, name: &str) -> &'a Report {
    let n = &r[name];
    n.report
        .as_ref()
        .unwrap_or_else(|| panic!("{name} printed no report (exit {:?}): {}", n.code, n.stderr))
}

/// Every node exited 0 and reported success.
pub fn assert_all_ok(r: &BTreeMap<String, NodeResult>) {
    for (name, n) in r {
        assert_eq!(n.code, Some(0), "{name} failed: {}", n.stderr);
        assert!(report(r, name).ok, "{name}: {:?}", n.report);
    }
}

/// A `[[node]]` table: `name` at `addr` with `role`, its `parent`, and `extra` lines.
pub fn node(name: &str, addr: &str, role: &str, parent: Option<&str>, extra: &str) -> String {
    let mut s = format!("[[node]]\nname = \"{name}\"\naddr = \"{addr}\"\nrole = \"{role}\"\n");
    if let Some(p) = parent {
        s.push_str(&format!("parent = \"{p}\"\n"));
    }
    s.push_str(extra);
    s.push('\n');
    s
}

/// Lines a child prints on stdout, as they come (read on a thread).
pub fn lines_of(c: &mut Child) -> Receiver<String> {
    let out = BufReader::new(c.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The bytes of a JSON progress line.
pub fn progress_bytes(line: &str) -> Option<u64> {
    serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .filter(|v| v["event"] == "progress")
        .and_then(|v| v["bytes"].as_u64())
}

/// Waits (up to 30 s) for a progress line of at least `bytes`; `seen` collects the lines.
pub fn wait_progress(rx: &Receiver<String>, bytes: u64, seen: &mut Vec<String>) {
    let start = Instant::now();
    loop {
        let left = Duration::from_secs(30).saturating_sub(start.elapsed());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no progress to {bytes} bytes within 30 s: {seen:?}"));
        let reached = progress_bytes(&line).is_some_and(|b| b >= bytes);
        seen.push(line);
        if reached {
            return;
        }
    }
}

/// Sends `sig` to a child that has not been waited for (no `kill` binary needed).
pub fn signal(c: &Child, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(c.id()).expect("pid fits pid_t");
    // SAFETY: kill has no memory preconditions; the child is not reaped yet, so the pid is
    // still this child's.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        r,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}
