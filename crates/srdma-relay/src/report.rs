//! What a node reports: progress while it runs and one final report, as JSON lines
//! (`--json`) or for people (a progress bar on a terminal, plain lines otherwise).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::control::{Healed, SinkStatus};

/// A node's final report; with `--json` it is printed as one line,
/// `{"event":"report",...}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `"report"`.
    pub event: String,
    /// The node's name.
    pub node: String,
    /// The node's role.
    #[serde(default)]
    pub role: String,
    /// True when the node's part succeeded (the source: every sink committed).
    pub ok: bool,
    /// Object bytes the node handled: the source read and sent, a relay processed, a sink
    /// wrote.
    pub bytes: u64,
    /// Objects completed.
    pub objects: u64,
    /// Chunks handled.
    #[serde(default)]
    pub chunks: u64,
    /// Seconds from the first chunk to the last.
    pub seconds: f64,
    /// `bytes` over `seconds`, in megabits (10^6 bits) per second.
    pub throughput_mbps: f64,
    /// Median chunk latency: at a sender, from posting a chunk to a child until that child's
    /// credit for it came back; at a sink, from arrival to credit return.
    pub chunk_latency_p50_us: f64,
    /// 99th percentile of the same.
    pub chunk_latency_p99_us: f64,
    /// Transport retransmissions (`completer_retry_err` of the node's device).
    pub retransmissions: u64,
    /// Chunk bytes copied in user space at this node (its stages and itself).
    pub copied_bytes: u64,
    /// Bytes (headers included) sent to children.
    pub forwarded_bytes: u64,
    /// Object digest (hex): the source's as sent, a sink's as verified; several objects:
    /// the digest of their digests.
    pub digest: Option<String>,
    /// What went wrong.
    pub error: Option<String>,
    /// The hop that failed.
    pub failed_hop: Option<String>,
    /// Per sink: bytes written and whether it committed (the source's report; others carry
    /// it when the source's verdict reached them).
    pub sinks: BTreeMap<String, SinkStatus>,
    /// The chunk this run started at when a sink resumed (a sink: the first chunk it
    /// lacked); `None` for a transfer from the beginning.
    #[serde(default)]
    pub resumed_from_chunk: Option<u64>,
    /// Object bytes sent again: chunks an earlier run had already written at a sink (a sink:
    /// its own; the source and relays: the most of any sink, from the verdict).
    #[serde(default)]
    pub bytes_sent_again: u64,
    /// Why a sink's earlier resume state was discarded, if it was.
    #[serde(default)]
    pub resume_note: Option<String>,
    /// Wall-clock time (Unix seconds) of the node's first chunk (0: none), to compare nodes
    /// on one host or synchronised hosts: a transfer's completion time is the last sink's
    /// `last_chunk_at` minus the source's `first_chunk_at`.
    #[serde(default)]
    pub first_chunk_at: f64,
    /// Wall-clock time (Unix seconds) of the node's last chunk (0: none).
    #[serde(default)]
    pub last_chunk_at: f64,
    /// The relays the transfer healed around (the source's record; others carry it when the
    /// verdict reached them).
    #[serde(default)]
    pub healed: Vec<Healed>,
}

impl Report {
    /// The report as one line of JSON.
    pub fn json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A progress line, `{"event":"progress","node":"C","bytes":N,"chunks":N}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Always `"progress"`.
    pub event: String,
    /// The node's name.
    pub node: String,
    /// Object bytes so far.
    pub bytes: u64,
    /// Chunks so far.
    pub chunks: u64,
}

/// Chunk latencies, in microseconds: a fixed-size log-linear histogram (exact below 128 µs,
/// then 64 buckets per power of two, under 1.6 % error), so memory does not grow with the
/// transfer.
#[derive(Debug, Default, Clone)]
pub struct Latencies {
    buckets: Vec<u64>,
    count: u64,
}

const LINEAR: u64 = 128;
const SUB: u64 = 64;
const BUCKETS: usize = (LINEAR + (64 - 7) * SUB) as usize;

fn bucket_of(us: u64) -> usize {
    if us < LINEAR {
        return us as usize;
    }
    let e = u64::from(63 - us.leading_zeros());
    let sub = (us >> (e - 6)) & (SUB - 1);
    (LINEAR + (e - 7) * SUB + sub) as usize
}

fn value_of(b: usize) -> f64 {
    let b = b as u64;
    if b < LINEAR {
        return b as f64;
    }
    let e = (b - LINEAR) / SUB + 7;
    let sub = (b - LINEAR) % SUB;
    let lo = (1u64 << e) + (sub << (e - 6));
    // The middle of the bucket.
    lo as f64 + (1u64 << (e - 6)) as f64 / 2.0
}

impl Latencies {
    /// Records one latency.
    pub fn record(&mut self, d: Duration) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; BUCKETS];
        }
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(us).min(BUCKETS - 1)] += 1;
        self.count += 1;
    }

    /// The `p`-th percentile (0..=100, nearest rank), in microseconds; 0 without samples.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return value_of(i);
            }
        }
        value_of(BUCKETS - 1)
    }

    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// True without samples.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Megabits per second for `bytes` in `seconds`.
pub fn mbps(bytes: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        0.0
    } else {
        bytes as f64 * 8.0 / seconds / 1e6
    }
}

/// Bytes for people: "1.50 GiB".
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// How a node shows its progress.
#[derive(Debug)]
pub struct Display {
    name: String,
    json: bool,
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    last_plain: std::time::Instant,
}

impl Display {
    /// JSON progress lines on stdout with `json`; a bar on stderr when it is a terminal, plain
    /// lines about every second otherwise; nothing on stderr with `quiet`.
    pub fn new(name: &str, json: bool, quiet: bool, total: Option<u64>) -> Display {
        let tty = std::io::stderr().is_terminal();
        let bar = (!quiet && tty).then(|| {
            let bar = match total {
                Some(t) => indicatif::ProgressBar::new(t),
                None => indicatif::ProgressBar::new_spinner(),
            };
            let style = indicatif::ProgressStyle::with_template(
                "{prefix:>4} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(name.to_string());
            bar
        });
        Display {
            name: name.into(),
            json,
            bar,
            plain: !quiet && !tty,
            last_plain: std::time::Instant::now(),
        }
    }

    /// Sets the expected total once known (turns a spinner into a bar).
    pub fn set_total(&mut self, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    /// Shows progress.
    pub fn progress(&mut self, bytes: u64, chunks: u64, elapsed: Duration) {
        if self.json {
            let p = Progress {
                event: "progress".into(),
                node: self.name.clone(),
                bytes,
                chunks,
            };
            print_json(&p);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
        } else if self.plain && self.last_plain.elapsed() >= Duration::from_secs(1) {
            self.last_plain = std::time::Instant::now();
            eprintln!(
                "{}: {} in {} chunks, {:.1} Mbit/s",
                self.name,
                human_bytes(bytes),
                chunks,
                mbps(bytes, elapsed.as_secs_f64())
            );
        }
    }

    /// Shows a one-line status message (connections, waiting).
    pub fn status(&mut self, msg: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(msg.to_string());
        } else if self.plain {
            eprintln!("{}: {msg}", self.name);
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// Prints `v` as one JSON line on stdout.
pub fn print_json<T: Serialize>(v: &T) {
    if let Ok(s) = serde_json::to_string(v) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    }
}

/// The report for people, several lines.
pub fn human(r: &Report) -> String {
    let mut s = format!(
        "{} ({}): {} — {} in {} objects, {} chunks, {:.2} s, {:.1} Mbit/s ({:.1} MiB/s); chunk \
         latency p50 {:.0} µs, p99 {:.0} µs; {} retransmissions; copied {} of {} forwarded",
        r.node,
        r.role,
        if r.ok { "ok" } else { "FAILED" },
        human_bytes(r.bytes),
        r.objects,
        r.chunks,
        r.seconds,
        r.throughput_mbps,
        r.throughput_mbps * 1e6 / 8.0 / 1_048_576.0,
        r.chunk_latency_p50_us,
        r.chunk_latency_p99_us,
        r.retransmissions,
        human_bytes(r.copied_bytes),
        human_bytes(r.forwarded_bytes),
    );
    if let Some(n) = r.resumed_from_chunk {
        s.push_str(&format!(
            "\n  resumed from chunk {n}; bytes sent again: {} ({} bytes)",
            human_bytes(r.bytes_sent_again),
            r.bytes_sent_again
        ));
    }
    if let Some(n) = &r.resume_note {
        s.push_str(&format!("\n  {n}"));
    }
    for h in &r.healed {
        s.push_str(&format!(
            "\n  healed around {} in {} ms: continued at chunk {}, {} chunks sent again",
            h.nodes.join(", "),
            h.heal_ms,
            h.from_chunk,
            h.resent_chunks
        ));
    }
    if r.resumed_from_chunk.is_none() && !r.healed.is_empty() {
        s.push_str(&format!(
            "\n  bytes sent again: {} ({} bytes)",
            human_bytes(r.bytes_sent_again),
            r.bytes_sent_again
        ));
    }
    if let Some(d) = &r.digest {
        s.push_str(&format!("\n  digest {d}"));
    }
    if let Some(e) = &r.error {
        s.push_str(&format!("\n  error: {e}"));
    }
    if let Some(h) = &r.failed_hop {
        s.push_str(&format!("\n  failed hop: {h}"));
    }
    for (name, st) in &r.sinks {
        s.push_str(&format!(
            "\n  sink {name}: {} ({} bytes), {}",
            human_bytes(st.bytes),
            st.bytes,
            if st.committed {
                "committed"
            } else {
                "NOT committed"
            }
        ));
        if let Some(n) = st.resumed_from {
            s.push_str(&format!(
                ", resumed from chunk {n}, {} bytes sent again",
                st.bytes_sent_again
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_report_says_where_it_resumed() {
        let mut r = Report {
            node: "A".into(),
            ok: true,
            ..Report::default()
        };
        assert!(!human(&r).contains("resumed"));
        r.resumed_from_chunk = Some(42);
        r.bytes_sent_again = 3 << 16;
        r.sinks.insert(
            "C".into(),
            SinkStatus {
                bytes: 1,
                committed: true,
                resumed_from: Some(42),
                bytes_sent_again: 3 << 16,
            },
        );
        let h = human(&r);
        assert!(
            h.contains("resumed from chunk 42; bytes sent again: 192.00 KiB (196608 bytes)"),
            "{h}"
        );
        assert!(
            h.contains(
                "sink C: 1 B (1 bytes), committed, resumed from chunk 42, 196608 bytes sent again"
            ),
            "{h}"
        );
        let back: Report = serde_json::from_str(&r.json_line()).unwrap();
        assert_eq!(back, r);
        // Reports of older builds, without the resume fields, still parse.
        let old: Report = serde_json::from_str(
            r#"{"event":"report","node":"A","ok":true,"bytes":0,"objects":0,"seconds":0.0,
               "throughput_mbps":0.0,"chunk_latency_p50_us":0.0,"chunk_latency_p99_us":0.0,
               "retransmissions":0,"copied_bytes":0,"forwarded_bytes":0,"digest":null,
               "error":null,"failed_hop":null,"sinks":{}}"#,
        )
        .unwrap();
        assert_eq!(old.resumed_from_chunk, None);
    }

    #[test]
    fn percentiles() {
        let mut l = Latencies::default();
        assert_eq!(l.percentile(50.0), 0.0);
        for us in 1..=100u64 {
            l.record(Duration::from_micros(us));
        }
        assert_eq!(l.percentile(50.0), 50.0);
        assert_eq!(l.percentile(99.0), 99.0);
        assert_eq!(l.len(), 100);
        // Large values: within the bucket resolution.
        let mut l = Latencies::default();
        for us in [10_000u64, 20_000, 1_000_000] {
            l.record(Duration::from_micros(us));
        }
        for (p, want) in [(10.0, 10_000.0), (50.0, 20_000.0), (100.0, 1_000_000.0)] {
            let got = l.percentile(p);
            assert!((got - want).abs() / want < 0.016, "p{p}: {got} vs {want}");
        }
        for us in [0u64, 1, 127, 128, 129, 1 << 20, u64::MAX >> 1] {
            let b = bucket_of(us);
            assert!(b < BUCKETS);
            if us >= 128 {
                assert!((value_of(b) - us as f64).abs() / us as f64 <= 0.016, "{us}");
            }
        }
    }

    #[test]
    fn report_json_has_the_spec_fields() {
        let r = Report {
            event: "report".into(),
            node: "C".into(),
            ok: true,
            ..Report::default()
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for k in [
            "event",
            "node",
            "ok",
            "bytes",
            "objects",
            "seconds",
            "throughput_mbps",
            "chunk_latency_p50_us",
            "chunk_latency_p99_us",
            "retransmissions",
            "copied_bytes",
            "forwarded_bytes",
            "digest",
            "error",
            "failed_hop",
            "sinks",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(mbps(1_000_000, 8.0), 1.0);
    }
}
