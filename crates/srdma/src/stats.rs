//! Live statistics of running devices: every open device publishes its counters to a small
//! text file that `srdma devinfo --stats` reads, as rxe exposes its hw counters in sysfs
//! (`rdma statistic show`).
//!
//! # Where
//!
//! `$SRDMA_RUN_DIR` if set; otherwise `/run/srdma` if it can be created and written, else
//! `$TMPDIR/srdma-<uid>` (`/tmp/srdma-<uid>` without `$TMPDIR`). Readers look in
//! `$SRDMA_RUN_DIR` alone when it is set, else in both of the others, so a user sees the
//! devices of root's processes as well as their own.
//!
//! # File format (version 1)
//!
//! One file per open device, named `<pid>-<n>.stats` (`n` counts the process's devices), UTF-8
//! lines of `key value`:
//!
//! ```text
//! srdma-stats 1
//! pid 4242
//! start 81234567
//! name srdma_lo
//! local 127.0.0.1:4791
//! counter rx_datagrams 17
//! counter tx_datagrams 17
//! ...
//! qp 0x1a2b window 64 rate - srtt_us 41 timeouts 0 cnps 0 recovery sr
//! ```
//!
//! `start` is the process's start time (field 22 of `/proc/<pid>/stat`, absent where `/proc`
//! cannot be read), so a file is not mistaken for a live device once its pid is reused. The
//! device counters come first, then the sum of the QP transport counters, each in the order
//! of its `entries()`; then a `qp` line for each connected QP that has sends outstanding (at
//! most [`MAX_QP_LINES`], then `qps_more N`): its congestion window (PSNs), pacing rate
//! (bytes per second, `-` when not paced), smoothed RTT (µs, `-` before the first sample),
//! timeouts, CNPs taken in, and how it recovers losses (`sr` selective repeat, `gbn`
//! go-back-N). Files are written to a temporary name and renamed, so a reader never
//! sees half a file. The device writes at open, then at most once a second, and removes the
//! file when it closes; files of processes that died without closing are removed by the next
//! reader. The counters are read under the device's lock, but the file is written after it
//! is released (the publisher hands back a pending write to commit): a file system call
//! can take a millisecond, and a packet that arrives meanwhile (a connection's REQ after an
//! idle second, say) must not wait for it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use crate::types::DeviceCounters;

/// The first line of every statistics file.
const MAGIC: &str = "srdma-stats 1";
/// File name suffix of statistics files.
const SUFFIX: &str = ".stats";
/// Least time between two writes of one device's file.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The system-wide directory.
const SYSTEM_DIR: &str = "/run/srdma";

/// Devices this process has published, for unique file names.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Writes this process started, for unique temporary names (two threads may write at once).
static WRITES: AtomicU64 = AtomicU64::new(0);

/// A statistics file to write once the device's lock is released.
#[derive(Debug)]
#[must_use = "the file is written by `commit` or `commit_later`"]
pub(crate) struct Pending {
    path: PathBuf,
    tmp: PathBuf,
    text: String,
    /// The publisher's file: true once it was removed (the device closed); held while the
    /// file is written, so a write never brings back the file of a closed device.
    closed: Arc<Mutex<bool>>,
}

impl Pending {
    /// Writes the file atomically (a temporary file, then rename). False on any I/O error,
    /// or when the device closed meanwhile.
    pub(crate) fn commit(self) -> bool {
        let closed = self
            .closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *closed {
            return false;
        }
        if std::fs::write(&self.tmp, &self.text).is_err() {
            let _ = std::fs::remove_file(&self.tmp);
            return false;
        }
        if std::fs::rename(&self.tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&self.tmp);
            return false;
        }
        true
    }

    /// Hands the write to the process's statistics writer thread (started on first use;
    /// written here if it cannot start). A progress thread must not write itself: replacing
    /// a file by a rename makes ext4 flush it (`auto_da_alloc`), which took 30–130 ms on this
    /// project's test machine, where `/run` is on disk — that long without reading the
    /// socket, and every peer's retransmission timer fires. A forked child, which has the
    /// channel but not the thread, writes itself.
    pub(crate) fn commit_later(self) {
        type Writer = (u32, Mutex<mpsc::Sender<Pending>>);
        static WRITER: OnceLock<Option<Writer>> = OnceLock::new();
        let writer = WRITER.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Pending>();
            crate::threads::spawn("srdma-stats", move || {
                for p in rx {
                    p.commit();
                }
            })
            .ok()
            .map(|_| (std::process::id(), Mutex::new(tx)))
        });
        let rejected = match writer {
            Some((pid, tx)) if *pid == std::process::id() => tx
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .send(self)
                .err()
                .map(|e| e.0),
            _ => Some(self),
        };
        if let Some(p) = rejected {
            p.commit();
        }
    }
}

/// Publishes one device's counters while it is open; removes its file when dropped.
#[derive(Debug)]
pub(crate) struct Publisher {
    path: PathBuf,
    tmp: PathBuf,
    header: String,
    /// When the last `maybe_write` wrote (None before the first).
    last: Option<Instant>,
    /// The counters in the file.
    written: (DeviceCounters, srdma_proto::Counters),
    /// A rate-limited call saw counters the file does not have yet.
    dirty: bool,
    /// Shared with the pending writes (see [`Pending`]).
    closed: Arc<Mutex<bool>>,
}

impl Publisher {
    /// Starts publishing for the device `name` bound to `local` (None when the statistics
    /// directory cannot be used; the device works without it).
    pub(crate) fn new(name: &str, local: SocketAddr) -> Option<Publisher> {
        Publisher::new_in(&write_dir()?, name, local)
    }

    /// [`Publisher::new`] in `dir`, which must exist. Writes the file at once, with zero
    /// counters, so an idle device is listed too.
    fn new_in(dir: &Path, name: &str, local: SocketAddr) -> Option<Publisher> {
        let pid = std::process::id();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let mut header = format!("{MAGIC}\npid {pid}\n");
        if let Some(start) = start_time(pid) {
            let _ = writeln!(header, "start {start}");
        }
        // One line per field: no control characters in the name.
        let name: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        let _ = writeln!(header, "name {name}\nlocal {local}");
        let p = Publisher {
            path: dir.join(format!("{pid}-{n}{SUFFIX}")),
            tmp: dir.join(format!(".{pid}-{n}.tmp")),
            header,
            last: None,
            written: Default::default(),
            dirty: false,
            closed: Arc::default(),
        };
        p.render(
            &DeviceCounters::default(),
            &srdma_proto::Counters::default(),
            &[],
        )
        .commit()
        .then_some(p)
    }

    /// The file to rewrite, if the last write is older than a second (the first call always
    /// writes); unchanged counters are not rewritten. The caller commits it, outside the
    /// device's lock. A write that fails is not retried until the counters change again: the
    /// device does not depend on it.
    pub(crate) fn maybe_write(
        &mut self,
        dev: &DeviceCounters,
        qp: &srdma_proto::Counters,
        qps: &[QpLine],
        now: Instant,
    ) -> Option<Pending> {
        let changed = (*dev, *qp) != self.written;
        if self.last.is_some() && !changed {
            return None;
        }
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < MIN_INTERVAL)
        {
            self.dirty = true;
            return None;
        }
        self.last = Some(now);
        self.written = (*dev, *qp);
        self.dirty = false;
        Some(self.render(dev, qp, qps))
    }

    /// Whether a write would be rate-limited at `now` anyway: the caller need not sum the QP
    /// counters (thousands of QPs) for it. The device's own counters, which move with every
    /// packet, stand for them: if they changed, the file is due at the interval's end.
    pub(crate) fn throttled(&mut self, dev: &DeviceCounters, now: Instant) -> bool {
        let within = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < MIN_INTERVAL);
        if within && *dev != self.written.0 {
            self.dirty = true;
        }
        within
    }

    /// How long until a call to [`maybe_write`](Publisher::maybe_write) would publish
    /// counters that a rate-limited call left out (None: the file is up to date). A progress
    /// thread that would sleep longer can wake then, so the file never lags by more than
    /// about a second.
    pub(crate) fn due_in(&self, now: Instant) -> Option<Duration> {
        if !self.dirty {
            return None;
        }
        let since = self
            .last
            .map_or(MIN_INTERVAL, |t| now.saturating_duration_since(t));
        Some(MIN_INTERVAL.saturating_sub(since))
    }

    /// The file's contents for these counters, to write under a temporary name of its own.
    fn render(&self, dev: &DeviceCounters, qp: &srdma_proto::Counters, qps: &[QpLine]) -> Pending {
        let mut text = self.header.clone();
        for (k, v) in dev.entries().into_iter().chain(qp.entries()) {
            let _ = writeln!(text, "counter {k} {v}");
        }
        for q in qps.iter().take(MAX_QP_LINES) {
            let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let _ = writeln!(
                text,
                "qp {:#x} window {} rate {} srtt_us {} timeouts {} cnps {} recovery {}",
                q.qpn,
                q.window_psns,
                opt(q.rate),
                opt(q.srtt_us),
                q.timeouts,
                q.cnps,
                if q.selective_repeat { "sr" } else { "gbn" }
            );
        }
        if qps.len() > MAX_QP_LINES {
            let _ = writeln!(text, "qps_more {}", qps.len() - MAX_QP_LINES);
        }
        let k = WRITES.fetch_add(1, Ordering::Relaxed);
        let mut tmp = self.tmp.clone().into_os_string();
        tmp.push(format!(".{k}"));
        Pending {
            path: self.path.clone(),
            tmp: tmp.into(),
            text,
            closed: Arc::clone(&self.closed),
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Waits for a write under way; none comes after.
        let mut closed = self
            .closed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *closed = true;
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// A device some process on this host has open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDevice {
    /// Device name.
    pub name: String,
    /// Bound UDP address.
    pub local: SocketAddr,
    /// Owning process.
    pub pid: u32,
    /// Counter name and value (device counters, then the QP transport counters).
    pub counters: Vec<(String, u64)>,
    /// The congestion control of its connected QPs with sends outstanding (at most
    /// [`MAX_QP_LINES`]).
    pub qps: Vec<QpLine>,
    /// Such QPs left out of `qps`.
    pub qps_more: u64,
}

/// The most `qp` lines a statistics file holds.
pub const MAX_QP_LINES: usize = 256;

/// Where one QP's congestion control stands, as a statistics file holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpLine {
    /// The QP number.
    pub qpn: u32,
    /// The congestion window, PSNs.
    pub window_psns: u32,
    /// The pacing rate, bytes per second (`None`: not paced).
    pub rate: Option<u64>,
    /// The smoothed RTT, µs (`None`: no sample yet).
    pub srtt_us: Option<u64>,
    /// Retransmission timeouts the window collapsed for.
    pub timeouts: u64,
    /// CNPs taken in.
    pub cnps: u64,
    /// Selective repeat agreed (else go-back-N).
    pub selective_repeat: bool,
}

impl QpLine {
    /// Parses the rest of a `qp` line.
    fn parse(rest: &str) -> Option<QpLine> {
        let f: Vec<&str> = rest.split(' ').collect();
        let [
            qpn,
            "window",
            w,
            "rate",
            r,
            "srtt_us",
            t,
            "timeouts",
            to,
            "cnps",
            c,
            "recovery",
            rec,
        ] = f[..]
        else {
            return None;
        };
        let opt = |v: &str| -> Option<Option<u64>> {
            if v == "-" {
                Some(None)
            } else {
                v.parse().ok().map(Some)
            }
        };
        Some(QpLine {
            qpn: u32::from_str_radix(qpn.strip_prefix("0x")?, 16).ok()?,
            window_psns: w.parse().ok()?,
            rate: opt(r)?,
            srtt_us: opt(t)?,
            timeouts: to.parse().ok()?,
            cnps: c.parse().ok()?,
            selective_repeat: match rec {
                "sr" => true,
                "gbn" => false,
                _ => return None,
            },
        })
    }
}

/// Every device open on this host (by a live process), from the statistics directory.
/// Ordered by pid, then by the order the process opened them.
pub fn live_devices() -> Vec<LiveDevice> {
    live_devices_in(&read_dirs())
}

/// [`live_devices`] over the given directories (a missing one holds nothing).
fn live_devices_in(dirs: &[PathBuf]) -> Vec<LiveDevice> {
    let mut found: Vec<((u32, u64), LiveDevice)> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            if let Some(pid) = stale_tmp_pid(&file_name) {
                // A writer that died between writing and renaming.
                if !alive(pid, None) {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            let Some(stem) = file_name
                .to_str()
                .and_then(|n| n.strip_suffix(SUFFIX))
                .filter(|n| !n.starts_with('.'))
            else {
                continue;
            };
            let order = stem
                .split_once('-')
                .and_then(|(p, n)| Some((p.parse().ok()?, n.parse().ok()?)))
                .unwrap_or((u32::MAX, u64::MAX));
            let path = entry.path();
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let Some(parsed) = parse(&text) else {
                continue;
            };
            if !alive(parsed.dev.pid, parsed.start) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            found.push((order, parsed.dev));
        }
    }
    found.sort_by_key(|(order, _)| *order);
    found.into_iter().map(|(_, d)| d).collect()
}

/// The pid in the name of a temporary file (`.<pid>-<n>.tmp`).
fn stale_tmp_pid(name: &std::ffi::OsStr) -> Option<u32> {
    let n = name.to_str()?.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (pid, seq) = n.split_once('-')?;
    seq.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// A parsed statistics file.
struct Parsed {
    dev: LiveDevice,
    start: Option<u64>,
}

/// Reads a statistics file; None if it is not one (wrong magic, a field missing or bad).
fn parse(text: &str) -> Option<Parsed> {
    let mut lines = text.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let (mut pid, mut start, mut name, mut local) = (None, None, None, None);
    let mut counters = Vec::new();
    let (mut qps, mut qps_more) = (Vec::new(), 0);
    for line in lines {
        let (key, rest) = line.split_once(' ')?;
        match key {
            "pid" => pid = Some(rest.parse().ok()?),
            "start" => start = Some(rest.parse().ok()?),
            "name" => name = Some(rest.to_owned()),
            "local" => local = Some(rest.parse().ok()?),
            "counter" => {
                let (k, v) = rest.split_once(' ')?;
                counters.push((k.to_owned(), v.parse().ok()?));
            }
            // A line this reader cannot parse costs that line only.
            "qp" => qps.extend(QpLine::parse(rest)),
            "qps_more" => qps_more = rest.parse().unwrap_or(0),
            // Fields of later versions.
            _ => {}
        }
    }
    Some(Parsed {
        dev: LiveDevice {
            name: name?,
            local: local?,
            pid: pid?,
            counters,
            qps,
            qps_more,
        },
        start,
    })
}

/// True if process `pid` exists and, when the file recorded it, started at `start`.
fn alive(pid: u32, start: Option<u64>) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        // 0 and negative pids name process groups to kill(2).
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled; nothing
    // is delivered.
    let r = unsafe { libc::kill(p, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    match (start, start_time(pid)) {
        (Some(recorded), Some(now)) => recorded == now,
        // No /proc here, or an older file: the pid check is all there is.
        _ => true,
    }
}

/// Start time of process `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    let after = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the comm, so field 22 is the 20th.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The directory this process publishes to, created if needed.
fn write_dir() -> Option<PathBuf> {
    if let Some(d) = env_dir() {
        return std::fs::create_dir_all(&d).is_ok().then_some(d);
    }
    let sys = PathBuf::from(SYSTEM_DIR);
    if std::fs::create_dir_all(&sys).is_ok() && writable(&sys) {
        return Some(sys);
    }
    let user = user_dir();
    std::fs::create_dir_all(&user).is_ok().then_some(user)
}

/// The directories readers look in.
fn read_dirs() -> Vec<PathBuf> {
    match env_dir() {
        Some(d) => vec![d],
        None => vec![PathBuf::from(SYSTEM_DIR), user_dir()],
    }
}

/// `$SRDMA_RUN_DIR`, if set and not empty.
fn env_dir() -> Option<PathBuf> {
    std::env::var_os("SRDMA_RUN_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `$TMPDIR/srdma-<uid>`.
fn user_dir() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("srdma-{uid}"))
}

/// True if this process may create files in `dir`.
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty directory for one test, removed when dropped.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!(
            "srdma-stats-test-{}-{tag}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn local() -> SocketAddr {
        "127.0.0.9:4791".parse().unwrap()
    }

    fn counter(d: &LiveDevice, name: &str) -> u64 {
        d.counters
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no counter {name} in {d:?}"))
    }

    fn files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn published_at_open_with_zero_counters_and_removed_on_drop() {
        let dir = scratch("open");
        let p = Publisher::new_in(&dir, "srdma_lo", local()).unwrap();
        let live = live_devices_in(std::slice::from_ref(&*dir));
        assert_eq!(live.len(), 1);
        let d = &live[0];
        assert_eq!(
            (d.name.as_str(), d.local, d.pid),
            ("srdma_lo", local(), std::process::id())
        );
        let names: Vec<&str> = d.counters.iter().map(|(k, _)| k.as_str()).collect();
        let expected: Vec<&str> = DeviceCounters::default()
            .entries()
            .iter()
            .chain(srdma_proto::Counters::default().entries().iter())
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(names, expected);
        assert!(d.counters.iter().all(|(_, v)| *v == 0));
        drop(p);
        assert!(live_devices_in(std::slice::from_ref(&*dir)).is_empty());
        assert!(files(&dir).is_empty(), "left behind: {:?}", files(&dir));
    }

    #[test]
    fn writes_at_most_once_a_second_but_the_first_call_at_once() {
        let dir = scratch("rate");
        let mut p = Publisher::new_in(&dir, "d", local()).unwrap();
        let read = || {
            counter(
                &live_devices_in(std::slice::from_ref(&*dir))[0],
                "rx_datagrams",
            )
        };
        let t0 = Instant::now();
        let mut dev = DeviceCounters {
            rx_datagrams: 5,
            ..DeviceCounters::default()
        };
        let mut qp = srdma_proto::Counters {
            rdma_sends: 3,
            ..srdma_proto::Counters::default()
        };
        assert!(
            p.maybe_write(&dev, &qp, &[], t0)
                .is_some_and(Pending::commit)
        );
        assert_eq!(read(), 5, "the first call writes at once");
        let live = live_devices_in(std::slice::from_ref(&*dir));
        assert_eq!(counter(&live[0], "rdma_sends"), 3);
        dev.rx_datagrams = 6;
        assert!(
            p.maybe_write(&dev, &qp, &[], t0 + Duration::from_millis(999))
                .is_none()
        );
        assert_eq!(read(), 5, "rate-limited");
        qp.rdma_sends = 4;
        assert_eq!(
            p.due_in(t0 + Duration::from_millis(999)),
            Some(Duration::from_millis(1))
        );
        assert!(
            p.maybe_write(&dev, &qp, &[], t0 + Duration::from_secs(1))
                .is_some_and(Pending::commit)
        );
        assert_eq!(read(), 6);
        assert_eq!(p.due_in(t0 + Duration::from_secs(1)), None);
        let live = live_devices_in(std::slice::from_ref(&*dir));
        assert_eq!(counter(&live[0], "rdma_sends"), 4);
        // Unchanged counters are not rewritten, and leave nothing due.
        let file = dir.join(&files(&dir)[0]);
        let before = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            p.maybe_write(&dev, &qp, &[], t0 + Duration::from_secs(5))
                .is_none()
        );
        assert_eq!(
            std::fs::metadata(&file).unwrap().modified().unwrap(),
            before
        );
        assert_eq!(p.due_in(t0 + Duration::from_secs(5)), None);
        // No temporary file stays behind.
        assert_eq!(files(&dir).len(), 1, "{:?}", files(&dir));
    }

    #[test]
    fn qp_lines_go_through_the_file() {
        let dir = scratch("qps");
        let mut p = Publisher::new_in(&dir, "d", local()).unwrap();
        let line = |qpn: u32| QpLine {
            qpn,
            window_psns: 37,
            rate: (qpn % 2 == 0).then_some(12_500_000),
            srtt_us: (qpn % 3 != 0).then_some(41),
            timeouts: 2,
            cnps: u64::from(qpn),
            selective_repeat: qpn % 2 == 1,
        };
        let qps: Vec<QpLine> = (0x11..0x11 + MAX_QP_LINES as u32 + 5).map(line).collect();
        let dev = DeviceCounters {
            rx_datagrams: 1,
            ..DeviceCounters::default()
        };
        let qp = srdma_proto::Counters::default();
        assert!(
            p.maybe_write(&dev, &qp, &qps, Instant::now())
                .is_some_and(Pending::commit)
        );
        let live = live_devices_in(std::slice::from_ref(&*dir));
        assert_eq!(live[0].qps, qps[..MAX_QP_LINES]);
        assert_eq!(live[0].qps_more, 5);
        // A line of a later format is skipped, the rest of the file kept.
        let file = dir.join(&files(&dir)[0]);
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("{text}qp 0x99 window 3 burst 7\n")).unwrap();
        let live = live_devices_in(std::slice::from_ref(&*dir));
        assert_eq!(live[0].qps.len(), MAX_QP_LINES);
        assert_eq!(counter(&live[0], "rx_datagrams"), 1);
    }

    #[test]
    fn files_of_dead_processes_are_skipped_and_removed() {
        let dir = scratch("dead");
        let keep = Publisher::new_in(&dir, "alive", local()).unwrap();
        // No Linux pid reaches 2^30 (pid_max is at most 2^22).
        let dead = dir.join("1073741000-0.stats");
        std::fs::write(
            &dead,
            format!("{MAGIC}\npid 1073741000\nname gone\nlocal 127.0.0.1:1\n"),
        )
        .unwrap();
        // This process's pid with another start time: a reused pid.
        let reused = dir.join("1-0.stats");
        std::fs::write(
            &reused,
            format!(
                "{MAGIC}\npid {}\nstart 1\nname reused\nlocal 127.0.0.1:2\n",
                std::process::id()
            ),
        )
        .unwrap();
        // A dead writer's temporary file; a live one's is left alone.
        let dead_tmp = dir.join(".1073741000-3.tmp");
        std::fs::write(&dead_tmp, "half").unwrap();
        let live_tmp = dir.join(format!(".{}-77.tmp", std::process::id()));
        std::fs::write(&live_tmp, "half").unwrap();
        let live = live_devices_in(std::slice::from_ref(&*dir));
        let names: Vec<&str> = live.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["alive"]);
        assert!(!dead.exists() && !reused.exists() && !dead_tmp.exists());
        assert!(live_tmp.exists());
        drop(keep);
    }

    #[test]
    fn unreadable_and_foreign_files_are_skipped() {
        let dir = scratch("junk");
        let _p = Publisher::new_in(&dir, "ok", local()).unwrap();
        let bad = [
            ("garbage.stats", "not a stats file\n".to_string()),
            ("2-0.stats", format!("{MAGIC}\npid 2\nname x\n")), // no address
            (
                "3-0.stats",
                format!("{MAGIC}\npid x\nname x\nlocal 1.2.3.4:5\n"),
            ),
            (
                "4-0.stats",
                format!("{MAGIC}\npid 1\nname x\nlocal 1.2.3.4:5\ncounter a b\n"),
            ),
            ("notes.txt", "ignored\n".to_string()),
            (".5-0.stats", "a temporary file\n".to_string()),
        ];
        for (n, t) in &bad {
            std::fs::write(dir.join(n), t).unwrap();
        }
        // A directory with the suffix cannot be read as a file.
        std::fs::create_dir(dir.join("6-0.stats")).unwrap();
        let live = live_devices_in(&[dir.to_path_buf(), dir.join("missing")]);
        let names: Vec<&str> = live.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        // Not ours to judge: they stay.
        assert!(dir.join("garbage.stats").exists() && dir.join("notes.txt").exists());
    }

    #[test]
    fn names_stay_on_one_line_and_several_devices_are_ordered() {
        let dir = scratch("names");
        let a = Publisher::new_in(&dir, "first\nsecond", local()).unwrap();
        let b = Publisher::new_in(&dir, "with space", "[::1]:7".parse().unwrap()).unwrap();
        let live = live_devices_in(std::slice::from_ref(&*dir));
        let got: Vec<(&str, SocketAddr)> =
            live.iter().map(|d| (d.name.as_str(), d.local)).collect();
        assert_eq!(
            got,
            [
                ("first?second", local()),
                ("with space", "[::1]:7".parse().unwrap())
            ]
        );
        drop((a, b));
    }

    #[test]
    fn a_publisher_in_a_missing_directory_is_none() {
        let dir = scratch("missing").join("not-there");
        assert!(Publisher::new_in(&dir, "d", local()).is_none());
    }

    #[test]
    fn start_time_of_this_process_is_readable_and_stable() {
        let a = start_time(std::process::id());
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(a.is_some());
        }
        assert_eq!(a, start_time(std::process::id()));
        assert!(alive(std::process::id(), a));
        assert!(!alive(0, None));
        assert!(!alive(u32::MAX, None));
    }
}
