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
    /// Time from spawn to exit, as observed.
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
    fn kill(pid: i32, sig: i32) -> i32;
}

const WNOHANG: i32 = 1;
/// `SIGKILL`.
pub const SIGKILL: i32 = 9;
/// `SIGTERM`.
pub const SIGTERM: i32 = 15;

/// A spawned process whose stdout lines and stderr are collected by background threads.
/// Dropping it kills the process (if still running) and reaps it.
#[derive(Debug)]
pub struct Proc {
    /// A name for messages (e.g. the node's name).
    pub name: String,
    pid: u32,
    // Kept so the pipes' other ends stay owned; never waited on through std (we reap with
    // wait4 to get the rusage), so never killed through std either.
    _child: Child,
    start: Instant,
    exit: Option<Exit>,
    lines: Arc<Mutex<Vec<Line>>>,
    stderr: Arc<Mutex<String>>,
    peak: Arc<Mutex<Mem>>,
    // Stops the sampler before the pid is reaped (and could be reused).
    stop: Arc<AtomicBool>,
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
        if let Some(out) = child.stdout.take() {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for text in BufReader::new(out).lines() {
                    let Ok(text) = text else { break };
                    let json = Value::parse(&text).ok();
                    lines.lock().unwrap().push(Line {
                        at: start.elapsed(),
                        text,
                        json,
                    });
                }
            });
        }
        if let Some(mut err) = child.stderr.take() {
            let stderr = stderr.clone();
            std::thread::spawn(move || {
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
            });
        }
        if let Some(every) = sample {
            let peak = peak.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while let Some(m) = mem_status(pid) {
                    // Checked after reading: a reaped pid may already belong to another
                    // process, and then the reading is not ours.
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
        Ok(Proc {
            name: name.to_string(),
            pid,
            _child: child,
            start,
            exit: None,
            lines,
            stderr,
            peak,
            stop,
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

    /// Current memory figures; None once the process has exited.
    pub fn mem(&self) -> Option<Mem> {
        if self.exit.is_some() {
            return None;
        }
        mem_status(self.pid)
    }

    /// Largest `VmRSS` and `VmHWM` seen by the sampler (zeros without one).
    pub fn sampled_peak(&self) -> Mem {
        *self.peak.lock().unwrap()
    }

    /// The exit, if the process has ended (reaping it then).
    pub fn try_wait(&mut self) -> Option<Exit> {
        if self.exit.is_none() {
            self.reap(WNOHANG);
        }
        self.exit
    }

    /// Waits up to `limit` for the process to end.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<Exit> {
        let until = Instant::now() + limit;
        loop {
            if let Some(e) = self.try_wait() {
                // Give the reader threads a moment to drain the pipes.
                self.drain();
                return Some(e);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
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

    /// Sends `sig` to the process unless it has already been reaped.
    pub fn signal(&self, sig: i32) {
        if self.exit.is_none() {
            // SAFETY: kill has no memory preconditions; the pid is our unreaped child, so it
            // cannot have been reused by another process.
            unsafe { kill(self.pid as i32, sig) };
        }
    }

    /// Kills the process with SIGKILL and waits for it.
    pub fn kill(&mut self) -> Option<Exit> {
        self.signal(SIGKILL);
        self.wait_timeout(Duration::from_secs(10))
    }

    fn drain(&self) {
        // The pipes close when the process (and anything that inherited them) is gone; the
        // reader threads finish right after. A short grace period is enough.
        std::thread::sleep(Duration::from_millis(50));
    }

    fn reap(&mut self, options: i32) {
        let mut status = 0i32;
        let mut ru = Rusage::default();
        // SAFETY: status and ru are valid, writable and of the layout wait4 expects; the pid
        // is our own child.
        let r = unsafe { wait4(self.pid as i32, &mut status, options, &mut ru) };
        if r != self.pid as i32 {
            return;
        }
        // The pid is free for reuse from now on: the sampler drops any later reading.
        self.stop.store(true, Ordering::Release);
        let (code, signal) = if status & 0x7f == 0 {
            (Some((status >> 8) & 0xff), None)
        } else {
            (None, Some(status & 0x7f))
        };
        let secs = |t: &Timeval| t.sec as f64 + t.usec as f64 / 1e6;
        self.exit = Some(Exit {
            code,
            signal,
            max_rss_kib: ru.maxrss.max(0) as u64,
            user_s: secs(&ru.utime),
            sys_s: secs(&ru.stime),
            wall: self.start.elapsed(),
        });
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.signal(SIGKILL);
            self.reap(0);
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
