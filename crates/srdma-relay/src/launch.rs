//! Running every node of a configuration as child processes of this one (the demo, and the
//! tests): each node is started with `--json`, its progress lines drive a display here, and
//! its final report is collected.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::config::{Config, Role};
use crate::report::{Progress, Report, human_bytes};

/// How one node process ended.
#[derive(Debug, Clone, Default)]
pub struct NodeResult {
    /// The node's name.
    pub name: String,
    /// Its exit status (`None`: killed by a signal, or by us on the deadline).
    pub code: Option<i32>,
    /// Its final JSON report, if it printed one.
    pub report: Option<Report>,
    /// Its last progress line.
    pub progress: Option<Progress>,
    /// Everything it wrote on stderr.
    pub stderr: String,
    /// Seconds from its start to its exit.
    pub seconds: f64,
}

/// Options of [`run_all`].
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Show progress bars (on a terminal) or plain progress lines on stderr.
    pub show: bool,
    /// Kill every node still running after this long.
    pub deadline: Duration,
}

#[derive(Default)]
struct Seen {
    report: Option<Report>,
    progress: Option<Progress>,
}

/// What the reader threads collect: each node's last report and progress line, and its
/// stderr.
#[derive(Default)]
struct Collected {
    seen: Mutex<BTreeMap<String, Seen>>,
    stderrs: Mutex<BTreeMap<String, String>>,
}

/// A started node process.
struct Running {
    name: String,
    child: Child,
    started: Instant,
}

/// Starts one process per node (`command(name)` builds its command line; it must end in
/// `relay node --config FILE --name NAME --json` or an equivalent), sinks first, and waits for
/// all of them. Progress is shown on stderr when `opts.show`.
pub fn run_all(
    cfg: &Config,
    mut command: impl FnMut(&str) -> Command,
    opts: &LaunchOptions,
) -> std::io::Result<Vec<NodeResult>> {
    let tty = std::io::stderr().is_terminal();
    let bars = progress_bars(cfg, opts.show && tty);
    let start = Instant::now();
    let mut running: Vec<Running> = Vec::new();
    let mut readers = Vec::new();
    let got: Arc<Collected> = Arc::default();
    for n in start_order(cfg) {
        let mut cmd = command(&n.name);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for mut r in running {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
                return Err(e);
            }
        };
        if let Some(out) = child.stdout.take() {
            let (name, got) = (n.name.clone(), Arc::clone(&got));
            let bar = bars.get(&n.name).cloned();
            readers.push(thread::spawn(move || {
                read_json_lines(out, &name, &got, bar)
            }));
        }
        if let Some(mut err) = child.stderr.take() {
            let (name, got) = (n.name.clone(), Arc::clone(&got));
            readers.push(thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                lock(&got.stderrs).insert(name, s);
            }));
        }
        running.push(Running {
            name: n.name.clone(),
            child,
            started: Instant::now(),
        });
    }
    let plain = opts.show && !tty;
    let done = wait_all(&mut running, start, opts.deadline, plain.then_some(&*got));
    for r in readers {
        let _ = r.join();
    }
    for b in bars.values() {
        b.finish();
    }
    let mut seen = lock(&got.seen);
    let mut stderrs = lock(&got.stderrs);
    let mut out = Vec::new();
    for n in &cfg.nodes {
        let s = seen.remove(&n.name).unwrap_or_default();
        let (code, seconds) = done.get(&n.name).copied().unwrap_or((None, 0.0));
        out.push(NodeResult {
            name: n.name.clone(),
            code,
            report: s.report,
            progress: s.progress,
            stderr: stderrs.remove(&n.name).unwrap_or_default(),
            seconds,
        });
    }
    Ok(out)
}

/// Locks `m`, poisoned or not.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The order to start the nodes in: the deepest first, and of one depth sinks, then relays,
/// then the source: listeners come up before their parents call.
fn start_order(cfg: &Config) -> Vec<&crate::config::Node> {
    let mut order: Vec<&crate::config::Node> = cfg.nodes.iter().collect();
    order.sort_by_key(|n| match n.role {
        Role::Sink => 0,
        Role::RelaySink | Role::Relay => 1,
        Role::Source => 2,
    });
    order.sort_by_key(|n| std::cmp::Reverse(cfg.depth(&n.name)));
    order
}

/// A progress bar per node, by name (none unless `show`: on a terminal).
fn progress_bars(cfg: &Config, show: bool) -> BTreeMap<String, indicatif::ProgressBar> {
    let mut bars = BTreeMap::new();
    if !show {
        return bars;
    }
    let total = source_size(cfg);
    let m = indicatif::MultiProgress::new();
    for n in &cfg.nodes {
        let bar = m.add(match total {
            Some(t) => indicatif::ProgressBar::new(t),
            None => indicatif::ProgressBar::new_spinner(),
        });
        let style = indicatif::ProgressStyle::with_template(
            "{prefix:>12} [{bar:40}] {bytes:>10}/{total_bytes} {bytes_per_sec:>12} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("{} {}", n.name, n.role.as_str()));
        bars.insert(n.name.clone(), bar);
    }
    bars
}

/// Reads node `name`'s JSON lines from `out`: its progress and its report go to `got` (and
/// its bar, if any).
fn read_json_lines(
    out: impl Read,
    name: &str,
    got: &Collected,
    bar: Option<indicatif::ProgressBar>,
) {
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let line = line.trim();
        if !line.starts_with('{') {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let mut s = lock(&got.seen);
        let entry = s.entry(name.to_string()).or_default();
        match v.get("event").and_then(|e| e.as_str()) {
            Some("progress") => {
                if let Ok(p) = serde_json::from_value::<Progress>(v) {
                    if let Some(b) = &bar {
                        b.set_position(p.bytes);
                    }
                    entry.progress = Some(p);
                }
            }
            Some("report") => {
                if let Ok(r) = serde_json::from_value::<Report>(v) {
                    if let Some(b) = &bar {
                        b.set_position(r.bytes);
                        b.set_message(if r.ok { "ok" } else { "FAILED" });
                    }
                    entry.report = Some(r);
                }
            }
            _ => {}
        }
    }
}

/// Waits for every process to exit, killing those still running `deadline` after `start`;
/// with `plain`, prints a progress line every second. Returns each node's exit status and
/// seconds run.
fn wait_all(
    running: &mut [Running],
    start: Instant,
    deadline: Duration,
    plain: Option<&Collected>,
) -> BTreeMap<String, (Option<i32>, f64)> {
    let mut done: BTreeMap<String, (Option<i32>, f64)> = BTreeMap::new();
    let mut last_plain = Instant::now();
    while done.len() < running.len() {
        for r in running.iter_mut() {
            if done.contains_key(r.name.as_str()) {
                continue;
            }
            if let Ok(Some(st)) = r.child.try_wait() {
                done.insert(
                    r.name.clone(),
                    (st.code(), r.started.elapsed().as_secs_f64()),
                );
            }
        }
        if start.elapsed() > deadline {
            for r in running.iter_mut() {
                if !done.contains_key(r.name.as_str()) {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    done.insert(r.name.clone(), (None, r.started.elapsed().as_secs_f64()));
                }
            }
            break;
        }
        if let Some(got) = plain.filter(|_| last_plain.elapsed() >= Duration::from_secs(1)) {
            last_plain = Instant::now();
            let s = lock(&got.seen);
            let line: Vec<String> = s
                .iter()
                .filter_map(|(k, v)| {
                    v.progress
                        .as_ref()
                        .map(|p| format!("{k} {}", human_bytes(p.bytes)))
                })
                .collect();
            if !line.is_empty() {
                eprintln!("progress: {}", line.join(", "));
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    done
}

/// The source's size when it is generated data (`gen:SIZE[:SEED]`) or one file.
pub fn source_size(cfg: &Config) -> Option<u64> {
    let spec = cfg.source().source.as_deref()?;
    if let Some(rest) = spec.strip_prefix("gen:") {
        let size = rest.split(':').next()?;
        return crate::source::parse_size(size).ok();
    }
    let p = spec.strip_prefix("file:").unwrap_or(spec);
    let md = std::fs::metadata(Path::new(p)).ok()?;
    md.is_file().then_some(md.len())
}
