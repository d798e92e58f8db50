//! What `srdma perf` prints: perftest's header block, address lines and result tables (same
//! texts and printf formats), computed the way perftest computes them, plus the figures it
//! adds (CPU seconds per GB, the kernel-socket baseline and the ratio).

use anyhow::anyhow;
use serde_json::{Value, json};
use srdma::Gid;

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's `RESULT_FMT` (MB/s) and `RESULT_FMT_G` (Gb/s).
pub fn bw_columns(gbits: bool) -> &'static str {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

/// perftest's `RESULT_FMT_LAT`.
pub const LAT_COLUMNS: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// One bandwidth measurement: `msgs` messages of `size` bytes in `secs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwStats {
    /// Message size in bytes.
    pub size: u64,
    /// Messages moved (all QPs / streams).
    pub msgs: u64,
    /// From the first post to the last completion.
    pub secs: f64,
    /// The best time per message over any window of the run (perftest's peak); None when
    /// not measured (duration mode, or more than 20000 iterations, as perftest).
    pub peak_secs_per_msg: Option<f64>,
}

impl BwStats {
    /// Bytes per second, on average.
    pub fn bytes_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            (self.size * self.msgs) as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Messages per second, on average.
    pub fn msgs_per_sec(&self) -> f64 {
        if self.secs > 0.0 {
            self.msgs as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Peak bytes per second (0 when not measured).
    pub fn peak_bytes_per_sec(&self) -> f64 {
        match self.peak_secs_per_msg {
            Some(p) if p > 0.0 => self.size as f64 / p,
            _ => 0.0,
        }
    }

    /// The result line, perftest's `REPORT_FMT` (or `REPORT_FMT_EXT` for tiny Gb/s figures).
    pub fn line(&self, gbits: bool) -> String {
        // perftest: MB/sec is MiB (0x100000), Gb/sec is 10^9 bits (125000000 bytes).
        let unit = if gbits { 125_000_000.0 } else { 1_048_576.0 };
        let peak = self.peak_bytes_per_sec() / unit;
        let avg = self.bytes_per_sec() / unit;
        let rate = self.msgs_per_sec() / 1e6;
        if gbits && avg < 0.1 {
            format!(
                " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
                self.size, self.msgs, peak, avg, rate
            )
        } else {
            format!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                self.size, self.msgs, peak, avg, rate
            )
        }
    }

    /// Machine-readable form (also what travels over the control connection).
    pub fn to_json(self) -> Value {
        json!({
            "bytes": self.size,
            "iterations": self.msgs,
            "seconds": self.secs,
            "peak_seconds_per_msg": self.peak_secs_per_msg,
            "bw_peak_mib_s": self.peak_bytes_per_sec() / 1_048_576.0,
            "bw_avg_mib_s": self.bytes_per_sec() / 1_048_576.0,
            "bw_avg_gbit_s": self.bytes_per_sec() * 8.0 / 1e9,
            "msg_rate_mpps": self.msgs_per_sec() / 1e6,
        })
    }

    /// Reads [`BwStats::to_json`]'s form.
    pub fn from_json(v: &Value) -> anyhow::Result<BwStats> {
        let bad = || anyhow!("malformed bandwidth result from the peer");
        Ok(BwStats {
            size: v.get("bytes").and_then(Value::as_u64).ok_or_else(bad)?,
            msgs: v
                .get("iterations")
                .and_then(Value::as_u64)
                .ok_or_else(bad)?,
            secs: v.get("seconds").and_then(Value::as_f64).ok_or_else(bad)?,
            peak_secs_per_msg: v.get("peak_seconds_per_msg").and_then(Value::as_f64),
        })
    }
}

/// CPU seconds per 10^9 bytes moved.
pub fn cpu_per_gb(cpu_secs: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        cpu_secs / (bytes as f64 / 1e9)
    }
}

/// The line srdma adds under every bandwidth line.
pub fn cpu_line(local: f64, remote: Option<f64>) -> String {
    match remote {
        Some(r) => format!(" CPU[s/GB]: local {local:.3}  remote {r:.3}"),
        None => format!(" CPU[s/GB]: local {local:.3}"),
    }
}

/// One latency measurement, in microseconds, as perftest's `print_report_lat` computes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatStats {
    /// Message size.
    pub size: u64,
    /// Iterations run.
    pub iters: u64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample kept (perftest drops the two largest first).
    pub max: f64,
    /// Median.
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// perftest drops this many of the largest samples before the statistics.
const LAT_MEASURE_TAIL: usize = 2;

impl LatStats {
    /// Statistics of per-iteration times `samples` (seconds), each divided by `factor`
    /// (2 for a ping-pong: half the round trip).
    pub fn from_samples(size: u64, iters: u64, samples: &mut [f64], factor: f64) -> LatStats {
        samples.sort_by(f64::total_cmp);
        let us = |s: f64| s * 1e6 / factor;
        if samples.is_empty() {
            return LatStats {
                size,
                iters,
                min: 0.0,
                max: 0.0,
                typical: 0.0,
                avg: 0.0,
                stdev: 0.0,
                p99: 0.0,
                p999: 0.0,
            };
        }
        let n = samples.len();
        let cnt = if n > LAT_MEASURE_TAIL + 1 {
            n - LAT_MEASURE_TAIL
        } else {
            n
        };
        let at = |i: usize| us(samples[i.min(n - 1)]);
        let typical = if (cnt - 1) % 2 == 1 {
            (at(cnt / 2) + at(cnt / 2 - 1)) / 2.0
        } else {
            at(cnt / 2)
        };
        let avg = samples[..cnt].iter().map(|&s| us(s)).sum::<f64>() / cnt as f64;
        let var = samples[..cnt]
            .iter()
            .map(|&s| (us(s) - avg).powi(2))
            .sum::<f64>()
            / cnt as f64;
        LatStats {
            size,
            iters,
            min: at(0),
            max: at(cnt),
            typical,
            avg,
            stdev: var.sqrt(),
            p99: at((cnt as f64 * 0.99).ceil() as usize),
            p999: at((cnt as f64 * 0.999).ceil() as usize),
        }
    }

    /// The result line, perftest's `REPORT_FMT_LAT`.
    pub fn line(&self) -> String {
        format!(
            " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
            self.size,
            self.iters,
            self.min,
            self.max,
            self.typical,
            self.avg,
            self.stdev,
            self.p99,
            self.p999
        )
    }

    /// Machine-readable form.
    pub fn to_json(self) -> Value {
        json!({
            "bytes": self.size,
            "iterations": self.iters,
            "t_min_us": self.min,
            "t_max_us": self.max,
            "t_typical_us": self.typical,
            "t_avg_us": self.avg,
            "t_stdev_us": self.stdev,
            "p99_us": self.p99,
            "p99_9_us": self.p999,
        })
    }

    /// Reads [`LatStats::to_json`]'s form.
    pub fn from_json(v: &Value) -> anyhow::Result<LatStats> {
        let f = |k: &str| {
            v.get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| anyhow!("malformed latency result from the peer ({k})"))
        };
        Ok(LatStats {
            size: f("bytes")? as u64,
            iters: f("iterations")? as u64,
            min: f("t_min_us")?,
            max: f("t_max_us")?,
            typical: f("t_typical_us")?,
            avg: f("t_avg_us")?,
            stdev: f("t_stdev_us")?,
            p99: f("p99_us")?,
            p999: f("p99_9_us")?,
        })
    }
}

/// C's `%#0Nx`: zero-padded to `width` including the `0x`, which is left out for 0.
pub fn c_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$x}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

/// perftest's address line of one QP (`BASIC_ADDR_FMT`, `READ_FMT`, `RDMA_FMT`).
pub fn addr_line(
    side: &str,
    qpn: u32,
    psn: u32,
    out_reads: Option<u32>,
    rdma: Option<(u32, u64)>,
) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_hex(0, 4),
        c_hex(qpn.into(), 6),
        c_hex(psn.into(), 6)
    );
    if let Some(o) = out_reads {
        s += &format!(" OUT {}", c_hex(o.into(), 4));
    }
    if let Some((rkey, vaddr)) = rdma {
        s += &format!(" RKey {} VAddr {}", c_hex(rkey.into(), 8), c_hex(vaddr, 16));
    }
    s
}

/// perftest's GID line (`PERF_GID_FMT`: the 16 bytes in decimal).
pub fn gid_line(gid: &Gid) -> String {
    let bytes: Vec<String> = gid.0.iter().map(|b| format!("{b:02}")).collect();
    format!(" GID: {}", bytes.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_hex_matches_printf() {
        assert_eq!(c_hex(0, 4), "0000");
        assert_eq!(c_hex(0x11, 6), "0x0011");
        assert_eq!(c_hex(0x123456, 6), "0x123456");
        assert_eq!(c_hex(0x7f12_3456_7000, 16), "0x007f1234567000");
    }

    #[test]
    fn latency_statistics_follow_perftest() {
        // 10 samples of 1..=10 us full round trip; the two largest are dropped.
        let mut s: Vec<f64> = (1..=10).rev().map(|i| i as f64 * 1e-6).collect();
        let l = LatStats::from_samples(2, 11, &mut s, 2.0);
        assert!((l.min - 0.5).abs() < 1e-9);
        assert!((l.max - 4.5).abs() < 1e-9); // the first dropped sample, as perftest prints
        assert!((l.typical - 2.25).abs() < 1e-9); // median of 1..=8, halved
        assert!((l.avg - 2.25).abs() < 1e-9);
    }

    #[test]
    fn bandwidth_line_layout() {
        let b = BwStats {
            size: 65536,
            msgs: 5000,
            secs: 1.0,
            peak_secs_per_msg: Some(1.0 / 6000.0),
        };
        assert_eq!(
            b.line(false),
            " 65536      5000             375.00             312.50 \t\t   0.005000"
        );
    }
}
