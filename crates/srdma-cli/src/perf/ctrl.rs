//! The TCP control connection between the two `srdma perf` processes: one JSON object per
//! line. It carries the options (checked for mismatches), the QP descriptions, the start and
//! end of every measured run, and the figures each side sends the other.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

/// How long to wait for the peer's next message, beyond the length of a measurement, before
/// giving up (a peer that is gone closes the connection; this catches one that hangs).
pub const PEER_TIMEOUT: Duration = Duration::from_secs(300);

/// A control connection.
pub struct Ctrl {
    stream: TcpStream,
    buf: Vec<u8>,
    patience: Duration,
}

impl Ctrl {
    /// Wraps a connected stream.
    pub fn new(stream: TcpStream) -> Ctrl {
        let _ = stream.set_nodelay(true);
        Ctrl {
            stream,
            buf: Vec::new(),
            patience: PEER_TIMEOUT,
        }
    }

    /// Waits for messages [`PEER_TIMEOUT`] plus `run` (the length of one measurement).
    pub fn set_run_length(&mut self, run: Duration) {
        self.patience = PEER_TIMEOUT + run;
    }

    /// Sends one message.
    pub fn send(&mut self, v: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(v)?;
        line.push(b'\n');
        self.stream
            .write_all(&line)
            .context("writing to the control connection")
    }

    /// Sends an error message for the peer to print.
    pub fn send_error(&mut self, msg: &str) {
        let _ = self.send(&serde_json::json!({"type": "error", "msg": msg}));
    }

    fn take_line(&mut self) -> anyhow::Result<Option<Value>> {
        let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
            return Ok(None);
        };
        let line: Vec<u8> = self.buf.drain(..=end).collect();
        let v: Value = serde_json::from_slice(&line[..end])
            .map_err(|e| anyhow!("malformed control message from the peer: {e}"))?;
        Ok(Some(v))
    }

    fn fill(&mut self) -> anyhow::Result<bool> {
        let mut tmp = [0u8; 4096];
        match self.stream.read(&mut tmp) {
            Ok(0) => bail!("the peer closed the control connection"),
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                Ok(true)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e).context("reading the control connection"),
        }
    }

    /// The next message, waiting up to `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.take_line()? {
                return Ok(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no message from the peer for {}s", timeout.as_secs());
            }
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            self.fill()?;
        }
    }

    /// The next message if one has arrived, without waiting.
    pub fn try_recv(&mut self) -> anyhow::Result<Option<Value>> {
        if let Some(v) = self.take_line()? {
            return Ok(Some(v));
        }
        self.stream.set_nonblocking(true)?;
        let r = self.fill();
        self.stream.set_nonblocking(false)?;
        r?;
        self.take_line()
    }

    /// The next message, which must be of type `kind`; an error message from the peer becomes
    /// this side's error.
    pub fn expect(&mut self, kind: &str) -> anyhow::Result<Value> {
        let v = self.recv(self.patience)?;
        check_kind(v, kind)
    }
}

/// `v` if it is of type `kind`; the peer's error or a protocol error otherwise.
pub fn check_kind(v: Value, kind: &str) -> anyhow::Result<Value> {
    match v.get("type").and_then(Value::as_str) {
        Some(k) if k == kind => Ok(v),
        Some("error") => Err(PeerError(
            v.get("msg")
                .and_then(Value::as_str)
                .unwrap_or("unspecified")
                .to_string(),
        )
        .into()),
        other => bail!("unexpected control message {other:?} from the peer (wanted {kind:?})"),
    }
}

/// An error the peer reported (printed as the peer's, and not sent back to it).
#[derive(Debug)]
pub struct PeerError(pub String);

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the peer reports: {}", self.0)
    }
}

impl std::error::Error for PeerError {}

/// An error this side has already sent to the peer.
#[derive(Debug)]
pub struct Reported(pub String);

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Reported {}

/// Field `k` of `v` as u64.
pub fn get_u64(v: &Value, k: &str) -> anyhow::Result<u64> {
    v.get(k)
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("control message without a numeric {k:?}"))
}

/// Field `k` of `v` as f64.
pub fn get_f64(v: &Value, k: &str) -> anyhow::Result<f64> {
    v.get(k)
        .and_then(Value::as_f64)
        .ok_or_else(|| anyhow!("control message without a number {k:?}"))
}
