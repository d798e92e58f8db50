//! The process harness the CLI tests share: start `srdma` with piped output, collect it on
//! threads, wait under a deadline (killing the process past it, so nothing hangs), and wait
//! for a server's TCP port.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A started process whose output is being collected.
pub struct Running {
    pub child: Child,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
    args: Vec<String>,
}

/// What a finished process left.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Starts `cmd` with `args` (stdin closed, stdout and stderr collected, no capture file).
pub fn spawn(mut cmd: Command, args: &[&str]) -> Running {
    let mut child = cmd
        .args(args)
        .env_remove("SRDMA_PCAP")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start srdma");
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    Running {
        child,
        stdout,
        stderr,
        args: args.iter().map(|s| s.to_string()).collect(),
    }
}

impl Running {
    /// Waits for the exit; past `deadline` kills the process and fails the test.
    pub fn finish_within(mut self, deadline: Duration) -> Outcome {
        let t0 = Instant::now();
        let code = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.code();
            }
            if t0.elapsed() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "srdma {:?} still running after {deadline:?}\nstdout:\n{}\nstderr:\n{}",
                    self.args,
                    self.stdout.join().unwrap(),
                    self.stderr.join().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Outcome {
            code,
            stdout: self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
            elapsed: t0.elapsed(),
        }
    }
}

/// Waits until some socket listens on TCP `port` (Linux: /proc/net/tcp{,6}); false after 20 s.
pub fn listening(port: u16) -> bool {
    let t0 = Instant::now();
    let needle = format!(":{port:04X} ");
    while t0.elapsed() < Duration::from_secs(20) {
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let table = std::fs::read_to_string(f).unwrap_or_default();
            // Columns: sl local_address rem_address st ...; st 0A = LISTEN.
            if table.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && format!("{} ", c[1]).ends_with(&needle) && c[3] == "0A"
            }) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
