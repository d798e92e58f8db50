//! The end of a node's run: its report (what it moved, how fast, what it copied, what was
//! sent again, the heals), the source's verdict over every node (it stops everyone on a
//! failure and waits for every report), a node's final report to the source and the verdict
//! it hears back; then the progress display and the connections stop and the report is
//! printed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::control::{self, Msg, SinkStatus};
use crate::digest::{ObjectDigest, hex};
use crate::report::{self, Report};

use super::fail::{Fail, R};
use super::progress::unix_time;
use super::run::NodeRun;
use super::sink_side::Settled;

/// How a node ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Its report (also printed).
    pub report: Report,
    /// Its exit status: 0 success, 1 failure, 2 bad configuration.
    pub code: i32,
}

/// One digest for a list of object digests: the only one, or the digest of them all.
fn combined_digest(ds: &[[u8; 16]]) -> Option<String> {
    match ds {
        [] => None,
        [one] => Some(hex(one)),
        many => {
            let mut d = ObjectDigest::new();
            for x in many {
                d.update(x);
            }
            Some(hex(&d.finish()))
        }
    }
}

impl NodeRun<'_> {
    /// Ends the run: reports to the source (or decides, at the source), prints the report.
    pub(super) fn finish(mut self, result: R<()>) -> Outcome {
        let name = self.name();
        let settled = match self.sink.as_mut() {
            Some(sk) => sk.settle(result.is_ok(), name),
            None => Settled::default(),
        };
        let mut report = self.report(&result, &settled);
        if let Some(server) = &self.server {
            self.verdict(server, &result, &mut report);
        } else if let Some(client) = &self.client {
            self.hear_verdict(client, &result, settled.committed, &mut report);
        }
        // Stop the progress display and the connection watchers.
        self.stats.stop();
        for c in &self.children {
            let _ = c.conn.disconnect();
        }
        for p in &self.peers {
            let _ = p.conn.disconnect();
        }
        if let Some(p) = &self.parent {
            let _ = p.conn.disconnect();
        }
        print(&report, name, self.hop.opts.json);
        let code = if report.ok { 0 } else { 1 };
        Outcome { report, code }
    }

    /// The node's own report of its run.
    fn report(&self, result: &R<()>, settled: &Settled) -> Report {
        let name = self.name();
        let st = &self.stats;
        let seconds = st.seconds();
        let resumed_from = (self.hop.cfg.resumable() && (self.start_seq > 0 || settled.resumed))
            .then_some(self.start_seq);
        let mut report = Report {
            event: "report".into(),
            node: name.to_string(),
            role: self.hop.me.role.as_str().into(),
            ok: result.is_ok(),
            bytes: st.bytes,
            objects: st.objects,
            chunks: st.chunks,
            seconds,
            throughput_mbps: report::mbps(st.bytes, seconds),
            chunk_latency_p50_us: st.latencies.percentile(50.0),
            chunk_latency_p99_us: st.latencies.percentile(99.0),
            retransmissions: self
                .dev
                .as_ref()
                .map_or(0, |d| d.qp_counters().completer_retry_err),
            copied_bytes: st.own_copies + self.stages.iter().map(|s| s.copied_bytes()).sum::<u64>(),
            forwarded_bytes: st.forwarded,
            digest: match (&self.sink, &self.source) {
                (Some(sk), _) => combined_digest(&sk.digests),
                (None, Some(src)) => combined_digest(&src.digests),
                (None, None) => None,
            },
            error: None,
            failed_hop: None,
            sinks: BTreeMap::new(),
            resumed_from_chunk: resumed_from,
            bytes_sent_again: settled.sent_again,
            resume_note: self.resume_note.clone(),
            healed: self.healing.healed.clone(),
            first_chunk_at: st.first_chunk.map_or(0.0, unix_time),
            last_chunk_at: st.last_chunk.map_or(0.0, unix_time),
        };
        if let Err(f) = result {
            report.error = Some(format!("{name}: {}", f.msg));
            report.failed_hop = f.hop.clone();
        }
        report
    }

    /// The source: stops everyone on a failure, waits (up to `timeout_ms`) for every report,
    /// decides and sends the verdict; `report` gets it.
    fn verdict(&self, server: &control::Server, result: &R<()>, report: &mut Report) {
        let name = self.name();
        let grace = self.hop.timeout;
        if let Err(f) = result {
            server.record(control::Failure {
                failed_hop: f.hop.clone(),
                error: format!("{name}: {}", f.msg),
                primary: f.primary,
            });
            server.broadcast(&Msg::Abort {
                failed_hop: f.hop.clone(),
                error: format!("{name}: {}", f.msg),
            });
        }
        let all = server.wait_all(Instant::now() + grace, result.is_err());
        for n in server.dead_without_final() {
            server.record(control::Failure {
                failed_hop: Some(n.clone()),
                error: format!("node {n} died (its control connection closed without a report)"),
                primary: true,
            });
        }
        let failures = server.failures();
        if result.is_ok() && !failures.is_empty() {
            server.broadcast(&Msg::Abort {
                failed_hop: failures[0].failed_hop.clone(),
                error: failures[0].error.clone(),
            });
        }
        let sinks = self.sink_statuses(server);
        let resent = self.source.as_ref().map_or(0, |s| s.resent);
        report.bytes_sent_again = sinks
            .values()
            .map(|s| s.bytes_sent_again)
            .max()
            .unwrap_or(0)
            .max(resent);
        let ok =
            result.is_ok() && failures.is_empty() && all && sinks.values().all(|s| s.committed);
        report.ok = ok;
        if !ok {
            if let Some(f) = failures.iter().find(|f| f.primary).or(failures.first()) {
                report.error = Some(f.error.clone());
                report.failed_hop = f.failed_hop.clone();
            } else if report.error.is_none() {
                let missing = server.pending();
                let unconnected = server.unconnected();
                let who = unconnected.first().or(missing.first()).cloned();
                report.error = Some(format!(
                    "no final report from {} within {} ms",
                    if missing.is_empty() {
                        "some sinks".to_string()
                    } else {
                        missing.join(", ")
                    },
                    grace.as_millis()
                ));
                report.failed_hop = who;
            }
        }
        report.sinks = sinks.clone();
        server.broadcast(&Msg::Verdict {
            ok,
            error: report.error.clone(),
            failed_hop: report.failed_hop.clone(),
            sinks,
            healed: self.healing.healed.clone(),
        });
    }

    /// The source: every sink's bytes and final state, as the control channel heard them.
    fn sink_statuses(&self, server: &control::Server) -> BTreeMap<String, SinkStatus> {
        let finals = server.finals();
        let mut sinks = BTreeMap::new();
        for s in self.hop.cfg.sinks() {
            let f = finals.get(&s.name);
            sinks.insert(
                s.name.clone(),
                SinkStatus {
                    bytes: server.bytes_of(&s.name),
                    committed: f.is_some_and(|f| f.ok && f.committed),
                    resumed_from: f.and_then(|f| f.resumed_from),
                    bytes_sent_again: f.map_or(0, |f| f.bytes_sent_again),
                },
            );
        }
        sinks
    }

    /// A node: sends its final report to the source and waits for the verdict; `report`
    /// takes the sinks' states, the heals and (the source knows best which hop failed first)
    /// the failure from it.
    fn hear_verdict(
        &self,
        client: &control::Client,
        result: &R<()>,
        committed: bool,
        report: &mut Report,
    ) {
        let name = self.name();
        let grace = self.hop.timeout;
        let (error, hop, primary) = match result {
            Ok(()) => (None, None, false),
            Err(f) => (Some(format!("{name}: {}", f.msg)), f.hop.clone(), f.primary),
        };
        client.send(&Msg::Final {
            node: name.to_string(),
            ok: result.is_ok(),
            bytes: self.stats.bytes,
            committed,
            error,
            failed_hop: hop,
            primary,
            resumed_from: report.resumed_from_chunk,
            bytes_sent_again: report.bytes_sent_again,
        });
        // The source may itself wait up to `grace` for the other nodes' reports after
        // hearing this one, so wait longer than that for its verdict.
        let heard = client.wait_verdict(Instant::now() + 2 * grace + Duration::from_secs(1));
        let Some(Msg::Verdict {
            error,
            failed_hop,
            sinks,
            healed,
            ..
        }) = heard.verdict
        else {
            return;
        };
        report.healed = healed;
        if self.sink.is_none() {
            report.bytes_sent_again = sinks
                .values()
                .map(|s| s.bytes_sent_again)
                .max()
                .unwrap_or(0);
        }
        report.sinks = sinks;
        if let Err(f) = result {
            take_verdict_failure(report, f, failed_hop, error);
        }
    }
}

/// A node that failed (`f`) takes the source's account of the failure.
fn take_verdict_failure(
    report: &mut Report,
    f: &Fail,
    failed_hop: Option<String>,
    error: Option<String>,
) {
    if failed_hop.is_some() {
        report.failed_hop = failed_hop;
    }
    if let Some(e) = error {
        let mine = report.error.take().unwrap_or_default();
        report.error = Some(if f.primary && !e.contains(&mine) {
            format!("{e} (here: {mine})")
        } else {
            e
        });
    }
}

/// Prints the report (a JSON line, or for people), and a failure on stderr.
fn print(report: &Report, name: &str, json: bool) {
    if json {
        report::print_json(report);
    } else {
        println!("{}", report::human(report));
    }
    if report.ok {
        return;
    }
    let mut msg = report.error.clone().unwrap_or_else(|| "failed".into());
    if let Some(h) = &report.failed_hop {
        msg.push_str(&format!("; failed hop: {h}"));
    }
    for (s, st) in &report.sinks {
        msg.push_str(&format!(
            "; sink {s}: {} bytes{}",
            st.bytes,
            if st.committed {
                " committed"
            } else {
                ", not committed"
            }
        ));
    }
    if msg.starts_with(&format!("{name}: ")) {
        eprintln!("error: {msg}");
    } else {
        eprintln!("error: {name}: {msg}");
    }
}
