//! What a node counts as it runs, and the thread that shows it: a progress line (or bar)
//! about every 200 ms, and the same figures to the source on the control channel, whose
//! silence tells the source that a node froze.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::control::{self, Msg};
use crate::report::{Display, Latencies};

use super::hop::Hop;

/// Counters the progress thread reads; `stop` also ends the connection watchers.
#[derive(Debug, Default)]
pub(super) struct Live {
    pub(super) bytes: AtomicU64,
    pub(super) chunks: AtomicU64,
    /// Object bytes expected in all (0: not known yet).
    pub(super) total: AtomicU64,
    pub(super) stop: AtomicBool,
}

/// What a node counts for its report.
pub(super) struct Stats {
    pub(super) live: Arc<Live>,
    pub(super) started: Instant,
    pub(super) first_chunk: Option<Instant>,
    pub(super) last_chunk: Option<Instant>,
    /// Object bytes handled (framed, passed on, or delivered).
    pub(super) bytes: u64,
    pub(super) chunks: u64,
    pub(super) objects: u64,
    /// Chunk bytes this node copied itself (its stages count their own).
    pub(super) own_copies: u64,
    /// Bytes whose forwards completed.
    pub(super) forwarded: u64,
    pub(super) latencies: Latencies,
    progress: Option<thread::JoinHandle<Display>>,
}

impl Stats {
    /// Nothing counted yet; the clock starts now.
    pub(super) fn new() -> Stats {
        Stats {
            live: Arc::new(Live::default()),
            started: Instant::now(),
            first_chunk: None,
            last_chunk: None,
            bytes: 0,
            chunks: 0,
            objects: 0,
            own_copies: 0,
            forwarded: 0,
            latencies: Latencies::default(),
            progress: None,
        }
    }

    /// A chunk carrying `data` object bytes went through.
    pub(super) fn note_chunk(&mut self, data: u64) {
        self.chunks += 1;
        self.bytes += data;
        self.live.chunks.store(self.chunks, Ordering::Relaxed);
        self.live.bytes.store(self.bytes, Ordering::Relaxed);
    }

    /// Seconds from the first chunk to the last.
    pub(super) fn seconds(&self) -> f64 {
        match (self.first_chunk, self.last_chunk) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Starts the progress thread of `hop` (progress to `client` too, at a node).
    pub(super) fn start_progress(&mut self, hop: &Hop<'_>, client: Option<Arc<control::Client>>) {
        let live = Arc::clone(&self.live);
        let name = hop.name().to_string();
        let json = hop.opts.json;
        let quiet = hop.opts.quiet;
        let started = self.started;
        let h = thread::Builder::new()
            .name("relay-progress".into())
            .spawn(move || {
                let mut d = Display::new(&name, json, quiet, None);
                let mut total_set = false;
                loop {
                    // Sleep in short steps so the end is not delayed by a whole period.
                    for _ in 0..20 {
                        if live.stop.load(Ordering::Acquire) {
                            return d;
                        }
                        thread::sleep(Duration::from_millis(10));
                    }
                    let total = live.total.load(Ordering::Relaxed);
                    if !total_set && total > 0 {
                        d.set_total(total);
                        total_set = true;
                    }
                    let bytes = live.bytes.load(Ordering::Relaxed);
                    let chunks = live.chunks.load(Ordering::Relaxed);
                    d.progress(bytes, chunks, started.elapsed());
                    // Every period, changed or not: the source takes a node silent for
                    // `timeout_ms` as frozen.
                    if let Some(c) = &client {
                        c.send(&Msg::Progress {
                            node: name.clone(),
                            bytes,
                            chunks,
                        });
                    }
                }
            });
        self.progress = h.ok();
    }

    /// Stops the progress thread and the connection watchers; the display shows the final
    /// figures.
    pub(super) fn stop(&mut self) {
        self.live.stop.store(true, Ordering::Release);
        if let Some(h) = self.progress.take() {
            if let Ok(mut d) = h.join() {
                d.progress(self.bytes, self.chunks, self.started.elapsed());
                d.finish();
            }
        }
    }
}

/// The wall-clock time (Unix seconds) of instant `t`.
pub(super) fn unix_time(t: Instant) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    now - t.elapsed().as_secs_f64()
}
