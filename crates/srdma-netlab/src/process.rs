//! Watching the processes a lab runs: their JSON output lines as they come, their memory
//! (`VmRSS` / `VmHWM` from `/proc/PID/status`) while they run, and, once they are gone,
//! their exit status with the peak resident set and CPU time the kernel accounted
//! (`wait4`'s `rusage`).
//!
//! [`Host::command`](crate::Host::command) runs `ip netns exec NS PROG`, and `ip` execs
//! `PROG` in place, so the pid of the spawned child is the program's own pid: signals sent to
//! it (e.g. [`Proc::kill`]) reach the program, and `VmHWM` is the program's.

use std::ffi::c_long;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Error;
use crate::json::Value;

/// One line a process printed on stdout, with when it arrived.
#[derive(Debug, Clone)]
pub struct Line {
    /// Time since the process was spawned.
    pub at: Duration,
    /// The text, without the newline.
    pub text: String,
    /// The line parsed as JSON, when it is JSON.
    pub json: Option<Value>,
}

/// How a process ended, with what the kernel accounted for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exit {
    /// Exit code, when it exited (not killed by a signal).
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
    /// `ru_maxrss` in KiB. Careful: Linux carries it across `execve` and a forked child
    /// starts from its parent's peak, so for a program started from a large process (a
    /// test holding its input in memory) it says more about the parent. The program's own
    /// peak is its `VmHWM`: [`Proc::mem`] while it runs, [`Proc::sampled_peak`] after.
    pub max_rss_kib: u64,
    /// User CPU seconds.
    pub user_s: f64,
    /// System CPU seconds.
    pub sys_s: f64,
    /// Time from spawn to exit (noticed by a waiter thread as it happens).
    pub wall: Duration,
}

/// Memory figures of a running process, from `/proc/PID/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mem {
    /// Current resident set size, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set size so far, KiB (`VmHWM`).
    pub hwm_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of process `pid`; None once it has exited (or never existed).
pub fn mem_status(pid: u32) -> Option<Mem> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some(Mem {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

#[repr(C)]
#[derive(Default)]
struct Timeval {
    sec: c_long,
    usec: c_long,
}

/// Linux's `struct rusage`: two timevals and fourteen longs (`ru_maxrss` first).
#[repr(C)]
#[derive(Default)]
struct Rusage {
    utime: Timeval,
    stime: Timeval,
    maxrss: c_long,
    rest: [c_long; 13],
}

unsafe extern "C" {
    fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
    fn waitid(idtype: u32, id: u32, infop: *mut SigInfo, options: i32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
}

/// `siginfo_t`: 128 bytes, 8-byte aligned; only filled in, never read here.
#[repr(C, align(8))]
struct SigInfo([u8; 128]);

const P_PID: u32 = 1;
const WEXITED: i32 = 4;
const WNOWAIT: i32 = 0x0100_0000;
/// `SIGKILL`.
pub const SIGKILL: i32 = 9;
/// `SIGTERM`.
pub const SIGTERM: i32 = 15;
/// `SIGSTOP` (freezes a process; SIGKILL still ends it).
pub const SIGSTOP: i32 = 19;

/// What the waiter thread knows about the process.
#[derive(Debug, Default)]
struct State {
    /// Set when the process has ended (it may not be reaped yet, but it is a zombie then,
    /// so its pid cannot be reused while this lock is held).
    ended: bool,
    exit: Option<Exit>,
}

/// A spawned process whose stdout lines and stderr are collected by background threads,
/// and whose end is noticed (and timed) by a waiter thread as it happens. Dropping it kills
/// the process (if still running) and reaps it.
#[derive(Debug)]
pub struct Proc {
    /// A name for messages (e.g. the node's name).
    pub name: String,
    pid: u32,
    // Kept so the pipes' other ends stay owned; never waited on through std (the waiter
    // thread reaps with wait4 to get the rusage), so never killed through std either.
    _child: Child,
    start: Instant,
    state: Arc<Mutex<State>>,
    waiter: Option<std::thread::JoinHandle<()>>,
    lines: Arc<Mutex<Vec<Line>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    peak: Arc<Mutex<Mem>>,
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr piped (stdin closed) and starts collecting.
    /// Its memory is sampled every `sample` (None: never; [`Proc::mem`] still works).
    pub fn spawn(name: &str, mut cmd: Command, sample: Option<Duration>) -> Result<Proc, Error> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let start = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| Error(format!("spawn {name} ({cmd:?}): {e}")))?;
        let pid = child.id();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let peak = Arc::new(Mutex::new(Mem::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(State::default()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            let lines = lines.clone();
            readers.push(std::thread::spawn(move || {
                for text in BufReader::new(out).lines() {
                    let Ok(text) = text else { break };
                    let json = Value::parse(&text).ok();
                    lines.lock().unwrap().push(Line {
                        at: start.elapsed(),
                        text,
                        json,
                    });
                }
            }));
        }
        if let Some(mut err) = child.stderr.take() {
            let stderr = stderr.clone();
            readers.push(std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    stderr
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }));
        }
        if let Some(every) = sample {
            let peak = peak.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                // A zombie has no VmRSS line, so this ends when the process does (and the
                // flag covers the rest).
                while let Some(m) = mem_status(pid) {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let mut p = peak.lock().unwrap();
                    p.rss_kib = p.rss_kib.max(m.rss_kib);
                    p.hwm_kib = p.hwm_kib.max(m.hwm_kib);
                    drop(p);
                    std::thread::sleep(every);
                }
            });
        }
        let waiter = {
            let state = state.clone();
            let stop = stop.clone();
            std::thread::spawn(move || wait_for(pid, start, &state, &stop))
        };
        Ok(Proc {
            name: name.to_string(),
            pid,
            _child: child,
            start,
            state,
            waiter: Some(waiter),
            lines,
            stderr,
            readers,
            peak,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Time since spawn.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Every stdout line so far.
    pub fn lines(&self) -> Vec<Line> {
        self.lines.lock().unwrap().clone()
    }

    /// The JSON stdout lines so far whose `"event"` is `event`, with their arrival times.
    pub fn events(&self, event: &str) -> Vec<(Duration, Value)> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| {
                let j = l.json.as_ref()?;
                (j.get("event").as_str() == Some(event)).then(|| (l.at, j.clone()))
            })
            .collect()
    }

    /// The last JSON line with `"event"` equal to `event`.
    pub fn last_event(&self, event: &str) -> Option<Value> {
        self.events(event).pop().map(|(_, v)| v)
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Current memory figures; None once the process has ended.
    pub fn mem(&self) -> Option<Mem> {
        let st = self.state.lock().unwrap();
        if st.ended {
            return None;
        }
        // Read under the lock: the pid stays ours until the waiter can take it.
        mem_status(self.pid)
    }

    /// Largest `VmRSS` and `VmHWM` seen by the sampler (zeros without one).
    pub fn sampled_peak(&self) -> Mem {
        *self.peak.lock().unwrap()
    }

    /// The exit, once the process has ended and been reaped.
    pub fn try_wait(&mut self) -> Option<Exit> {
        self.state.lock().unwrap().exit
    }

    /// Waits up to `limit` for the process to end; once it has, also for its output pipes
    /// to be read to their end (unless something it started still holds them).
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<Exit> {
        let until = Instant::now() + limit;
        loop {
            if let Some(e) = self.try_wait() {
                self.drain(Instant::now() + Duration::from_secs(1));
                return Some(e);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until a stdout line satisfies `pred`, the process ends, or `limit` passes;
    /// returns the line when one did.
    pub fn wait_line(&mut self, limit: Duration, pred: impl Fn(&Line) -> bool) -> Option<Line> {
        let until = Instant::now() + limit;
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| pred(l)) {
                return Some(l.clone());
            }
            if self.try_wait().is_some() || Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `sig` to the process unless it has already ended.
    pub fn signal(&self, sig: i32) {
        let st = self.state.lock().unwrap();
        if !st.ended {
            // SAFETY: kill has no memory preconditions. The process has not ended or is a
            // zombie the waiter cannot reap while we hold the lock, so the pid is still ours.
            unsafe { kill(self.pid as i32, sig) };
        }
    }

    /// Kills the process with SIGKILL and waits for it.
    pub fn kill(&mut self) -> Option<Exit> {
        self.signal(SIGKILL);
        self.wait_timeout(Duration::from_secs(10))
    }

    /// Waits (until `until` at the latest) for the reader threads to reach the end of the
    /// pipes, so that every line the process printed is in.
    fn drain(&mut self, until: Instant) {
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The waiter thread: notices the end of `pid` without reaping it, marks it ended under the
/// lock, then reaps it with its rusage.
fn wait_for(pid: u32, start: Instant, state: &Mutex<State>, stop: &AtomicBool) {
    let mut info = SigInfo([0; 128]);
    loop {
        // SAFETY: info is a writable, aligned siginfo_t-sized buffer; the pid is our child.
        let r = unsafe { waitid(P_PID, pid, &mut info, WEXITED | WNOWAIT) };
        if r == 0 {
            break;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // Not our child any more (someone else reaped it): nothing to report.
            let mut st = state.lock().unwrap();
            st.ended = true;
            stop.store(true, Ordering::Release);
            return;
        }
    }
    let wall = start.elapsed();
    let mut st = state.lock().unwrap();
    st.ended = true;
    stop.store(true, Ordering::Release);
    let mut status = 0i32;
    let mut ru = Rusage::default();
    // SAFETY: status and ru are valid, writable and of the layout wait4 expects; the pid is
    // our own child, a zombie by now, so this returns at once.
    let r = unsafe { wait4(pid as i32, &mut status, 0, &mut ru) };
    if r != pid as i32 {
        return;
    }
    let (code, signal) = if status & 0x7f == 0 {
        (Some((status >> 8) & 0xff), None)
    } else {
        (None, Some(status & 0x7f))
    };
    let secs = |t: &Timeval| t.sec as f64 + t.usec as f64 / 1e6;
    st.exit = Some(Exit {
        code,
        signal,
        max_rss_kib: ru.maxrss.max(0) as u64,
        user_s: secs(&ru.utime),
        sys_s: secs(&ru.stime),
        wall,
    });
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal(SIGKILL);
        if let Some(w) = self.waiter.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_lines_exit_code_and_rusage() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo '{\"event\":\"progress\",\"bytes\":1}'; echo plain; echo oops >&2; exit 3",
        ]);
        let mut p = Proc::spawn("sh", c, Some(Duration::from_millis(1))).unwrap();
        let e = p.wait_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(e.code, Some(3));
        assert_eq!(e.signal, None);
        assert!(e.max_rss_kib > 0);
        let ev = p.events("progress");
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].1.get("bytes").as_u64(), Some(1));
        assert_eq!(p.lines().len(), 2);
        assert_eq!(p.stderr(), "oops\n");
        assert!(p.mem().is_none());
    }

    #[test]
    fn the_exit_is_timed_when_it_happens_not_when_asked() {
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 0.3; exit 4"]);
        let mut p = Proc::spawn("sh", c, None).unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        let e = p.try_wait().expect("ended");
        assert_eq!(e.code, Some(4));
        assert!(
            e.wall >= Duration::from_millis(300) && e.wall < Duration::from_millis(900),
            "{:?}",
            e.wall
        );
    }

    #[test]
    fn kill_reports_the_signal_and_memory_is_readable_while_running() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let mut p = Proc::spawn("sleep", c, None).unwrap();
        let m = p.mem().expect("running");
        assert!(m.hwm_kib >= m.rss_kib && m.rss_kib > 0, "{m:?}");
        assert!(p.try_wait().is_none());
        let e = p.kill().unwrap();
        assert_eq!(e.signal, Some(SIGKILL));
        assert_eq!(e.code, None);
        assert!(e.wall < Duration::from_secs(10));
    }
}
