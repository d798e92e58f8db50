//! The control channel: every non-source node keeps a TCP connection to the source's control
//! port (the source's address, its `cm_port + 1`) and reports on it; the source decides the
//! transfer's outcome and tells everyone.
//!
//! Messages are JSON objects, one per line, tagged by `"t"`:
//!
//! | direction | `t` | fields | when |
//! |---|---|---|---|
//! | node → source | `hello` | `node` | first, after connecting |
//! | node → source | `resume` | `node`, `from`, `note` | a sink, right after `hello`, when some sink of the configuration resumes: the first chunk it lacks |
//! | source → node | `start` | `from` | when every sink sent `resume`: the chunk the transfer starts at |
//! | source → node | `rewind` | `from`, `dead`, `epoch` | after `halt` (every node that answered): set the rings up again from chunk `from`, the nodes in `dead` spliced out |
//! | source → node | `halt` | `epoch`, `dead` | a relay died or froze: drop every connection, answer `held` |
//! | node → source | `held` | `node`, `epoch`, `next` | after `halt`: connections dropped; a sink's first missing chunk |
//! | node → source | `progress` | `node`, `bytes`, `chunks` | every 200 ms (a relay silent for `timeout_ms` while the transfer stalls is taken as frozen) |
//! | node → source | `final` | `node`, `ok`, `bytes`, `committed`, `error`, `failed_hop`, `primary` | once, when the node's part ended |
//! | source → node | `abort` | `failed_hop`, `error` | at once, when anything failed |
//! | source → node | `verdict` | `ok`, `error`, `failed_hop`, `sinks` | when every node reported (or was found dead, or the time ran out) |
//!
//! A node whose control connection closes before its `final` line died: that is the primary
//! failure (`failed_hop` = the node). A `final` with `primary = true` reports a failure at
//! the node itself (a corrupt chunk caught by its checks, a full disk, a stage that failed); a
//! `final` with `primary = false` reports the consequence of someone else's failure (the
//! parent or a child went away), and only names the hop when nothing better is known.
//!
//! `resume` and `start` are only exchanged when a sink of the configuration has
//! `resume = true` ([`crate::resume`]): then every node waits for `start` before it accepts
//! its parent's connection, so that every ring begins at the same chunk. A node the source
//! marked rejoinable ([`Server::set_rejoinable`]: the resumable sinks) that dies is not a
//! failure at once: a restarted process of it says `hello` again (and is not told the old
//! start), then `resume`, and the source answers it alone with a new `start` once the others
//! answered a `halt`.
//!
//! Healing ([`crate::config::Config::healable`]): the relays are rejoinable too. When one dies
//! (its control connection closes) or freezes (silent for `timeout_ms`, the transfer stalled), the source
//! [excludes](Server::exclude) it, sends `halt` to everyone else, waits for every `held`, and
//! sends `rewind` from the smallest chunk a sink lacks, with the dead spliced out of the tree.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What one sink achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkStatus {
    /// Object bytes the sink wrote (the last reported figure for a node that failed).
    pub bytes: u64,
    /// True when every object it received was committed with a matching digest.
    pub committed: bool,
    /// The chunk the sink resumed from (`None`: it started from the beginning).
    #[serde(default)]
    pub resumed_from: Option<u64>,
    /// Object bytes it received again that an earlier run had already written.
    #[serde(default)]
    pub bytes_sent_again: u64,
}

/// A control message (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Msg {
    /// A node introduces itself.
    Hello {
        /// Its name.
        node: String,
    },
    /// A node's progress.
    Progress {
        /// Its name.
        node: String,
        /// Object bytes it processed (a sink: wrote).
        bytes: u64,
        /// Chunks it processed.
        chunks: u64,
    },
    /// A node's part ended.
    Final {
        /// Its name.
        node: String,
        /// True when its part succeeded.
        ok: bool,
        /// Object bytes it processed (a sink: wrote).
        bytes: u64,
        /// A sink: every object committed with a matching digest.
        committed: bool,
        /// What went wrong.
        error: Option<String>,
        /// The hop it blames.
        failed_hop: Option<String>,
        /// True when the failure happened at this node (not a consequence of another's).
        primary: bool,
        /// A sink: the chunk it resumed from.
        #[serde(default)]
        resumed_from: Option<u64>,
        /// A sink: object bytes received again that an earlier run had already written.
        #[serde(default)]
        bytes_sent_again: u64,
    },
    /// A sink tells where it can resume (see [`crate::resume`]).
    Resume {
        /// Its name.
        node: String,
        /// The first chunk it lacks (0: it needs everything).
        from: u64,
        /// Why an earlier state was discarded, if it was.
        note: Option<String>,
    },
    /// The source tells where the transfer starts (to a restarted sink: where it continues,
    /// with the state of the heals so far).
    Start {
        /// The first chunk sent.
        from: u64,
        /// The nodes spliced out so far.
        #[serde(default)]
        dead: Vec<String>,
        /// The last `halt` so far.
        #[serde(default)]
        epoch: u64,
    },
    /// The source tells every node that answered a `halt` to set its rings up again, starting
    /// at chunk `from`, with the nodes in `dead` spliced out.
    Rewind {
        /// The chunk the transfer continues at.
        from: u64,
        /// Every node healed around so far.
        #[serde(default)]
        dead: Vec<String>,
        /// The `halt` this answers (0: none).
        #[serde(default)]
        epoch: u64,
    },
    /// The source tells every live node that relays died: drop every connection and answer
    /// with `held`.
    Halt {
        /// Numbers the halts of one transfer, from 1.
        epoch: u64,
        /// Every node healed around so far.
        dead: Vec<String>,
    },
    /// A node's answer to `halt`: its connections are dropped.
    Held {
        /// Its name.
        node: String,
        /// The `halt` answered.
        epoch: u64,
        /// A node with a sink: the first chunk it lacks.
        next: Option<u64>,
    },
    /// The source stops the transfer.
    Abort {
        /// The hop that failed.
        failed_hop: Option<String>,
        /// What went wrong.
        error: String,
    },
    /// The transfer's outcome.
    Verdict {
        /// True when every sink committed everything.
        ok: bool,
        /// What went wrong.
        error: Option<String>,
        /// The hop that failed.
        failed_hop: Option<String>,
        /// Per sink: bytes and whether it committed.
        sinks: BTreeMap<String, SinkStatus>,
        /// What the transfer healed around.
        #[serde(default)]
        healed: Vec<Healed>,
    },
}

/// One heal: the nodes spliced out, how long it took, what was sent again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Healed {
    /// The nodes found dead or frozen (and spliced out) at once.
    pub nodes: Vec<String>,
    /// Milliseconds from the source learning of the failure to the data moving again.
    pub heal_ms: u64,
    /// The chunk the transfer continued at.
    pub from_chunk: u64,
    /// Chunks the source had sent that it sent again.
    pub resent_chunks: u64,
    /// Sinks that were restarted and caught up.
    #[serde(default)]
    pub rejoined: Vec<String>,
}

impl Msg {
    fn line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// A failure the source learned of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The hop blamed.
    pub failed_hop: Option<String>,
    /// What went wrong.
    pub error: String,
    /// True for a failure at the hop itself (see the module documentation).
    pub primary: bool,
}

/// A node's final report as the source keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinalReport {
    /// True when its part succeeded.
    pub ok: bool,
    /// Object bytes it processed.
    pub bytes: u64,
    /// A sink: committed everything.
    pub committed: bool,
    /// A sink: the chunk it resumed from.
    pub resumed_from: Option<u64>,
    /// A sink: object bytes received again that an earlier run had already written.
    pub bytes_sent_again: u64,
}

#[derive(Debug, Default)]
struct NodeSlot {
    hello: bool,
    writer: Option<TcpStream>,
    progress_bytes: u64,
    final_report: Option<FinalReport>,
    dead: bool,
    resume: Option<u64>,
    /// Said hello again after dying: a restarted process.
    rejoined: bool,
    /// When it was last heard from.
    last_heard: Option<Instant>,
    /// Spliced out of the transfer: its death is no failure, its reports are ignored.
    excluded: bool,
    /// The last `halt` it answered, and its first missing chunk then.
    held: Option<(u64, Option<u64>)>,
    /// Numbers its control connections: the end of a connection a restarted process replaced
    /// says nothing about the new one.
    conn: u64,
}

#[derive(Debug, Default)]
struct ServerState {
    nodes: BTreeMap<String, NodeSlot>,
    failures: Vec<Failure>,
    verdict_sent: bool,
    start: Option<u64>,
    /// Nodes whose death the source handles itself (it waits for them to come back).
    rejoinable: Vec<String>,
}

/// The source's end: accepts every node's connection and collects their reports. Clones
/// share it.
#[derive(Debug, Clone)]
pub struct Server {
    shared: Arc<(Mutex<ServerState>, Condvar)>,
    local: SocketAddr,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Server {
    /// Listens on `addr` for the nodes named in `expected`.
    pub fn bind(addr: SocketAddr, expected: &[String]) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        let mut st = ServerState::default();
        for n in expected {
            st.nodes.insert(n.clone(), NodeSlot::default());
        }
        let shared = Arc::new((Mutex::new(st), Condvar::new()));
        let s2 = Arc::clone(&shared);
        thread::Builder::new()
            .name("relay-control".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let s3 = Arc::clone(&s2);
                    let _ = thread::Builder::new()
                        .name("relay-control-conn".into())
                        .spawn(move || serve(stream, &s3));
                }
            })?;
        Ok(Server { shared, local })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Failures reported so far, in arrival order.
    pub fn failures(&self) -> Vec<Failure> {
        lock(&self.shared.0).failures.clone()
    }

    /// Records a failure the source found itself.
    pub fn record(&self, f: Failure) {
        let (m, cv) = &*self.shared;
        lock(m).failures.push(f);
        cv.notify_all();
    }

    /// Last known bytes of node `name` (its final figure, or its last progress).
    pub fn bytes_of(&self, name: &str) -> u64 {
        let st = lock(&self.shared.0);
        st.nodes.get(name).map_or(0, |n| {
            n.final_report
                .as_ref()
                .map_or(n.progress_bytes, |f| f.bytes)
        })
    }

    /// Final reports so far.
    pub fn finals(&self) -> BTreeMap<String, FinalReport> {
        let st = lock(&self.shared.0);
        st.nodes
            .iter()
            .filter_map(|(k, v)| v.final_report.clone().map(|f| (k.clone(), f)))
            .collect()
    }

    /// Nodes that have neither reported their end nor died.
    pub fn pending(&self) -> Vec<String> {
        let st = lock(&self.shared.0);
        st.nodes
            .iter()
            .filter(|(_, v)| v.final_report.is_none() && !v.dead)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Nodes that have not (yet) connected.
    pub fn unconnected(&self) -> Vec<String> {
        let st = lock(&self.shared.0);
        st.nodes
            .iter()
            .filter(|(_, v)| v.writer.is_none() && v.final_report.is_none() && !v.dead)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Waits until every node reported or died, or `deadline` passes; true if all did. With
    /// `connected_only`, nodes that never connected are not waited for (after a failure,
    /// they may never come).
    pub fn wait_all(&self, deadline: Instant, connected_only: bool) -> bool {
        let (m, cv) = &*self.shared;
        let mut st = lock(m);
        loop {
            if st
                .nodes
                .values()
                .all(|n| n.final_report.is_some() || n.dead || (connected_only && !n.hello))
            {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until every node in `names` said where it resumes (or reported its end, or died),
    /// or `deadline` passes; returns the resume points heard.
    pub fn wait_resume(&self, names: &[String], deadline: Instant) -> BTreeMap<String, u64> {
        let (m, cv) = &*self.shared;
        let mut st = lock(m);
        loop {
            let all = names.iter().all(|n| {
                st.nodes
                    .get(n)
                    .is_none_or(|s| s.resume.is_some() || s.final_report.is_some() || s.dead)
            });
            let now = Instant::now();
            if all || now >= deadline || !st.failures.is_empty() {
                return names
                    .iter()
                    .filter_map(|n| Some((n.clone(), st.nodes.get(n)?.resume?)))
                    .collect();
            }
            st = cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Nodes whose silent death (control connection closed without a `final`) is not recorded
    /// as a failure: the source waits for them to come back ([`Server::wait_rejoin`]).
    pub fn set_rejoinable(&self, names: &[String]) {
        lock(&self.shared.0).rejoinable = names.to_vec();
    }

    /// True when node `name`'s control connection closed without a final report (and it has
    /// not said hello again since).
    pub fn is_dead(&self, name: &str) -> bool {
        lock(&self.shared.0).nodes.get(name).is_some_and(|n| n.dead)
    }

    /// Rejoinable nodes that died and did not come back, without a final report.
    pub fn dead_without_final(&self) -> Vec<String> {
        let st = lock(&self.shared.0);
        st.nodes
            .iter()
            .filter(|(k, v)| {
                v.dead && !v.excluded && v.final_report.is_none() && st.rejoinable.contains(k)
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Waits until node `name`, restarted after dying, said hello again and where it resumes
    /// (or `deadline` passes, or another failure is recorded); returns its resume point.
    pub fn wait_rejoin(&self, name: &str, deadline: Instant) -> Option<u64> {
        let (m, cv) = &*self.shared;
        let mut st = lock(m);
        loop {
            if let Some(n) = st.nodes.get_mut(name) {
                if n.rejoined && !n.dead {
                    if let Some(from) = n.resume {
                        n.rejoined = false;
                        return Some(from);
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline || !st.failures.is_empty() {
                return None;
            }
            st = cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Rejoinable nodes that are dead (control connection closed without a final report) or,
    /// with `limit`, silent that long (frozen), not yet excluded.
    pub fn dead_or_silent(&self, limit: Option<Duration>) -> Vec<String> {
        let st = lock(&self.shared.0);
        st.nodes
            .iter()
            .filter(|(k, v)| {
                st.rejoinable.contains(k)
                    && !v.excluded
                    && v.final_report.is_none()
                    && (v.dead
                        || v.hello
                            && limit
                                .is_some_and(|l| v.last_heard.is_some_and(|t| t.elapsed() >= l)))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Splices node `name` out of the transfer: it counts as dead without being a failure,
    /// is told to stop (a frozen process reads it when it wakes), and is heard no more.
    pub fn exclude(&self, name: &str) {
        let (m, cv) = &*self.shared;
        let mut st = lock(m);
        if let Some(n) = st.nodes.get_mut(name) {
            n.excluded = true;
            n.dead = true;
            if let Some(mut w) = n.writer.take() {
                let _ = w.set_write_timeout(Some(Duration::from_millis(200)));
                let _ = w.write_all(
                    &Msg::Abort {
                        failed_hop: Some(name.to_string()),
                        error: "the transfer healed around this node".into(),
                    }
                    .line(),
                );
                let _ = w.shutdown(std::net::Shutdown::Both);
            }
        }
        cv.notify_all();
    }

    /// True when node `name` was spliced out.
    pub fn is_excluded(&self, name: &str) -> bool {
        lock(&self.shared.0)
            .nodes
            .get(name)
            .is_some_and(|n| n.excluded)
    }

    /// Waits until every node still taking part (connected, not dead, no final report) answered
    /// `halt` number `epoch`, a node dies, or `deadline` passes. Returns each answer's first
    /// missing chunk (sinks), and the nodes that did not answer.
    pub fn wait_held(
        &self,
        epoch: u64,
        deadline: Instant,
    ) -> (BTreeMap<String, Option<u64>>, Vec<String>) {
        let (m, cv) = &*self.shared;
        let mut st = lock(m);
        let dead_at_start = st.nodes.values().filter(|n| n.dead).count();
        loop {
            let mut held = BTreeMap::new();
            let mut missing = Vec::new();
            for (k, v) in &st.nodes {
                if v.dead || v.final_report.is_some() || !v.hello {
                    continue;
                }
                match v.held {
                    Some((e, next)) if e == epoch => {
                        held.insert(k.clone(), next);
                    }
                    _ => missing.push(k.clone()),
                }
            }
            let now = Instant::now();
            let died = st.nodes.values().filter(|n| n.dead).count() > dead_at_start;
            if missing.is_empty() || died || now >= deadline {
                return (held, missing);
            }
            st = cv
                .wait_timeout(st, (deadline - now).min(Duration::from_millis(100)))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// True when node `name` died and a restarted process of it said hello (and
    /// [`Server::wait_rejoin`] has not taken it yet).
    pub fn rejoining(&self, name: &str) -> bool {
        lock(&self.shared.0)
            .nodes
            .get(name)
            .is_some_and(|n| n.rejoined)
    }

    /// Counts node `name` as having answered `halt` number `epoch` (a restarted sink, which
    /// holds no connection yet), lacking chunk `next`.
    pub fn mark_held(&self, name: &str, epoch: u64, next: Option<u64>) {
        let (m, cv) = &*self.shared;
        if let Some(n) = lock(m).nodes.get_mut(name) {
            n.held = Some((epoch, next));
        }
        cv.notify_all();
    }

    /// Sends `msg` to node `name` only.
    pub fn send_to(&self, name: &str, msg: &Msg) {
        let line = msg.line();
        let mut st = lock(&self.shared.0);
        if let Some(w) = st.nodes.get_mut(name).and_then(|n| n.writer.as_mut()) {
            let _ = w.set_write_timeout(Some(Duration::from_secs(2)));
            let _ = w.write_all(&line);
        }
    }

    /// Tells every node, now and on connecting later, that the transfer starts at `from`.
    pub fn set_start(&self, from: u64) {
        lock(&self.shared.0).start = Some(from);
        self.broadcast(&Msg::Start {
            from,
            dead: Vec::new(),
            epoch: 0,
        });
    }

    /// Sends `msg` to every connected node.
    pub fn broadcast(&self, msg: &Msg) {
        let line = msg.line();
        let mut st = lock(&self.shared.0);
        if matches!(msg, Msg::Verdict { .. }) {
            st.verdict_sent = true;
        }
        for n in st.nodes.values_mut() {
            if let Some(w) = n.writer.as_mut() {
                let _ = w.set_write_timeout(Some(Duration::from_secs(2)));
                if w.write_all(&line).is_err() {
                    n.writer = None;
                }
            }
        }
    }
}

/// Serves one node's control connection: records what it says until it closes.
fn serve(stream: TcpStream, shared: &Arc<(Mutex<ServerState>, Condvar)>) {
    let (m, cv) = &**shared;
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    // The node, once it said hello, and the number of this connection of it.
    let mut me: Option<(String, u64)> = None;
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).unwrap_or(0);
        if n == 0 {
            break;
        }
        let Ok(msg) = serde_json::from_str::<Msg>(line.trim()) else {
            continue;
        };
        let mut st = lock(m);
        if let Some(slot) = me.as_ref().and_then(|(n, _)| st.nodes.get_mut(n)) {
            slot.last_heard = Some(Instant::now());
            if slot.excluded {
                continue; // healed around: what it says no longer counts
            }
        }
        match msg {
            Msg::Hello { node } => {
                if let Some(conn) = st.hello(&node, &writer, me.is_none()) {
                    me = Some((node, conn));
                }
            }
            other => st.take(other),
        }
        cv.notify_all();
    }
    // The connection is gone: a node that did not report its end died.
    if let Some((name, conn)) = me {
        lock(m).closed(&name, conn);
    }
    cv.notify_all();
}

impl ServerState {
    /// Node `node` said hello on a connection (`writer`; `first`: the first thing said on
    /// it). Returns the connection's number, for a node of the transfer.
    fn hello(&mut self, node: &str, writer: &TcpStream, first: bool) -> Option<u64> {
        let start = self.start;
        let rejoinable = self.rejoinable.iter().any(|n| n == node);
        let slot = self.nodes.get_mut(node)?;
        // A rejoinable node saying hello again before its old connection was seen to close:
        // a restarted process all the same.
        let restarted =
            slot.dead || (rejoinable && slot.hello && slot.final_report.is_none() && first);
        slot.last_heard = Some(Instant::now());
        slot.writer = writer.try_clone().ok();
        slot.hello = true;
        slot.conn += 1;
        if slot.excluded {
            // Healed around: it has no part any more.
            if let Some(w) = slot.writer.as_mut() {
                let _ = w.write_all(
                    &Msg::Abort {
                        failed_hop: Some(node.to_string()),
                        error: "the transfer healed around this node".into(),
                    }
                    .line(),
                );
            }
            slot.writer = None;
        } else if restarted {
            // A restarted process: the source tells it where to start itself.
            slot.dead = false;
            slot.rejoined = true;
            slot.resume = None;
            slot.final_report = None;
        } else if let (Some(from), Some(w)) = (start, slot.writer.as_mut()) {
            let msg = Msg::Start {
                from,
                dead: Vec::new(),
                epoch: 0,
            };
            let _ = w.write_all(&msg.line());
        }
        Some(slot.conn)
    }

    /// Records what a node said (anything but hello).
    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Resume { node, from, .. } => {
                if let Some(slot) = self.nodes.get_mut(&node) {
                    slot.resume = Some(from);
                }
            }
            Msg::Progress { node, bytes, .. } => {
                if let Some(slot) = self.nodes.get_mut(&node) {
                    slot.progress_bytes = bytes;
                }
            }
            Msg::Final {
                node,
                ok,
                bytes,
                committed,
                error,
                failed_hop,
                primary,
                resumed_from,
                bytes_sent_again,
            } => {
                if let Some(slot) = self.nodes.get_mut(&node) {
                    slot.final_report = Some(FinalReport {
                        ok,
                        bytes,
                        committed,
                        resumed_from,
                        bytes_sent_again,
                    });
                }
                if !ok {
                    self.failures.push(Failure {
                        failed_hop,
                        error: error.unwrap_or_else(|| format!("{node} failed")),
                        primary,
                    });
                }
            }
            Msg::Held { node, epoch, next } => {
                if let Some(slot) = self.nodes.get_mut(&node) {
                    slot.held = Some((epoch, next));
                }
            }
            Msg::Hello { .. }
            | Msg::Abort { .. }
            | Msg::Verdict { .. }
            | Msg::Start { .. }
            | Msg::Rewind { .. }
            | Msg::Halt { .. } => {}
        }
    }

    /// Connection `conn` of node `name` closed: unless a later one replaced it, the node is
    /// gone, and died if it did not report its end (a failure, unless it may come back).
    fn closed(&mut self, name: &str, conn: u64) {
        let verdict_sent = self.verdict_sent;
        let rejoinable = self.rejoinable.iter().any(|n| n == name);
        let Some(slot) = self.nodes.get_mut(name).filter(|s| s.conn == conn) else {
            return;
        };
        slot.writer = None;
        if slot.excluded || slot.final_report.is_some() || verdict_sent {
            // Healed around already, or it ended properly.
            return;
        }
        slot.dead = true;
        if !rejoinable {
            self.failures.push(Failure {
                failed_hop: Some(name.to_string()),
                error: format!("node {name} died (its control connection closed without a report)"),
                primary: true,
            });
        }
    }
}

/// What a node heard from the source.
#[derive(Debug, Default, Clone)]
pub struct Heard {
    /// The source aborted the transfer.
    pub abort: Option<(Option<String>, String)>,
    /// The outcome.
    pub verdict: Option<Msg>,
    /// The control connection closed before a verdict came: the source is gone.
    pub lost: bool,
    /// The chunk the transfer starts at (when a sink resumes).
    pub start: Option<u64>,
    /// With `start`: the nodes spliced out so far.
    pub start_dead: Vec<String>,
    /// With `start`: the last `halt` so far.
    pub start_epoch: u64,
    /// The chunk the last `rewind` named, and how many came.
    pub rewind: Option<u64>,
    /// `rewind` messages heard.
    pub rewinds: u64,
    /// The nodes the last `rewind` spliced out.
    pub rewind_dead: Vec<String>,
    /// The last `halt`: its epoch and the nodes spliced out.
    pub halt: Option<(u64, Vec<String>)>,
}

/// A node's end of the control channel.
#[derive(Debug)]
pub struct Client {
    writer: Mutex<TcpStream>,
    heard: Arc<(Mutex<Heard>, Condvar)>,
    /// The epoch of the last `halt` heard, for a check without the lock.
    halt_epoch: Arc<std::sync::atomic::AtomicU64>,
}

impl Client {
    /// Connects to the source's control port (retrying until `deadline`: the source may
    /// start later) and says hello.
    pub fn connect(addr: SocketAddr, node: &str, deadline: Instant) -> std::io::Result<Client> {
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(
                &addr,
                left.clamp(Duration::from_millis(10), Duration::from_secs(1)),
            ) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let reader = stream.try_clone()?;
        let heard = Arc::new((Mutex::new(Heard::default()), Condvar::new()));
        let h2 = Arc::clone(&heard);
        let halt_epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let e2 = Arc::clone(&halt_epoch);
        thread::Builder::new()
            .name("relay-control".into())
            .spawn(move || listen(reader, &h2, &e2))?;
        let c = Client {
            writer: Mutex::new(stream),
            heard,
            halt_epoch,
        };
        c.send(&Msg::Hello { node: node.into() });
        Ok(c)
    }

    /// Sends a message (errors ignored: a lost source shows up in [`Client::heard`]).
    pub fn send(&self, msg: &Msg) {
        let _ = lock(&self.writer).write_all(&msg.line());
    }

    /// The epoch of the last `halt` heard (0: none), without taking the lock.
    pub fn halt_epoch(&self) -> u64 {
        self.halt_epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// What the source said so far.
    pub fn heard(&self) -> Heard {
        lock(&self.heard.0).clone()
    }

    /// Waits until the source says where the transfer starts, aborts, the connection is lost,
    /// or `deadline` passes.
    pub fn wait_start(&self, deadline: Instant) -> Heard {
        let (m, cv) = &*self.heard;
        let mut h = lock(m);
        while h.start.is_none() && h.abort.is_none() && !h.lost {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            h = cv
                .wait_timeout(h, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        h.clone()
    }

    /// Waits until more than `seen` `rewind` messages came, a `halt` after epoch `halted`
    /// came, the source aborts, the connection is lost, or `deadline` passes.
    pub fn wait_rewind(&self, seen: u64, halted: u64, deadline: Instant) -> Heard {
        let (m, cv) = &*self.heard;
        let mut h = lock(m);
        while h.rewinds <= seen
            && h.halt.as_ref().is_none_or(|(e, _)| *e <= halted)
            && h.abort.is_none()
            && !h.lost
        {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            h = cv
                .wait_timeout(h, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        h.clone()
    }

    /// Waits until the verdict comes, the connection is lost, or `deadline` passes.
    pub fn wait_verdict(&self, deadline: Instant) -> Heard {
        let (m, cv) = &*self.heard;
        let mut h = lock(m);
        while h.verdict.is_none() && !h.lost {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            h = cv
                .wait_timeout(h, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        h.clone()
    }
}

impl Drop for Client {
    /// Closes the connection (the reader thread holds a clone of the socket).
    fn drop(&mut self) {
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

fn listen(
    stream: TcpStream,
    heard: &Arc<(Mutex<Heard>, Condvar)>,
    halt_epoch: &std::sync::atomic::AtomicU64,
) {
    let (m, cv) = &**heard;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let Ok(msg) = serde_json::from_str::<Msg>(line.trim()) else {
            continue;
        };
        let mut h = lock(m);
        match msg {
            Msg::Abort { failed_hop, error } if h.abort.is_none() => {
                h.abort = Some((failed_hop, error));
            }
            v @ Msg::Verdict { .. } => h.verdict = Some(v),
            Msg::Start { from, dead, epoch } => {
                h.start = Some(from);
                h.start_dead = dead;
                h.start_epoch = epoch;
            }
            Msg::Rewind { from, dead, .. } => {
                h.rewind = Some(from);
                h.rewind_dead = dead;
                h.rewinds += 1;
            }
            Msg::Halt { epoch, dead } => {
                halt_epoch.fetch_max(epoch, std::sync::atomic::Ordering::Release);
                h.halt = Some((epoch, dead));
            }
            _ => {}
        }
        cv.notify_all();
    }
    let mut h = lock(m);
    if h.verdict.is_none() {
        h.lost = true;
    }
    cv.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_json_lines() {
        let m = Msg::Final {
            node: "C".into(),
            ok: false,
            bytes: 7,
            committed: false,
            error: Some("disk full".into()),
            failed_hop: Some("C".into()),
            primary: true,
            resumed_from: Some(3),
            bytes_sent_again: 5,
        };
        let line = m.line();
        assert_eq!(line.last(), Some(&b'\n'));
        let back: Msg = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn start_reaches_early_and_late_nodes_and_a_restarted_node_rejoins() {
        let server =
            Server::bind("127.0.0.1:0".parse().unwrap(), &["B".into(), "C".into()]).unwrap();
        let addr = server.local_addr();
        let soon = || Instant::now() + Duration::from_secs(5);
        let c = Client::connect(addr, "C", soon()).unwrap();
        c.send(&Msg::Resume {
            node: "C".into(),
            from: 7,
            note: None,
        });
        let got = server.wait_resume(&["C".into()], soon());
        assert_eq!(got.get("C"), Some(&7));
        server.set_rejoinable(&["C".into()]);
        server.set_start(7);
        assert_eq!(c.wait_start(soon()).start, Some(7));
        // A node connecting after the start was set hears it too.
        let b = Client::connect(addr, "B", soon()).unwrap();
        assert_eq!(b.wait_start(soon()).start, Some(7));
        // C dies: no failure (it may come back), but it is dead.
        drop(c);
        let t = Instant::now();
        while !server.is_dead("C") {
            assert!(t.elapsed() < Duration::from_secs(5), "C's death not seen");
            thread::sleep(Duration::from_millis(10));
        }
        assert!(server.failures().is_empty());
        assert_eq!(server.dead_without_final(), ["C"]);
        // A restarted C is not told the old start; it says where it resumes, is told anew.
        let c2 = Client::connect(addr, "C", soon()).unwrap();
        c2.send(&Msg::Resume {
            node: "C".into(),
            from: 9,
            note: None,
        });
        assert_eq!(server.wait_rejoin("C", soon()), Some(9));
        assert_eq!(c2.heard().start, None);
        server.send_to(
            "C",
            &Msg::Start {
                from: 9,
                dead: Vec::new(),
                epoch: 0,
            },
        );
        assert_eq!(c2.wait_start(soon()).start, Some(9));
        assert!(!server.is_dead("C"));
        // A restarted C that says hello before its old connection is seen to close is a
        // restart too, and the old connection's end then says nothing.
        let c3 = Client::connect(addr, "C", soon()).unwrap();
        let t = Instant::now();
        while !server.rejoining("C") {
            assert!(t.elapsed() < Duration::from_secs(5), "C's restart not seen");
            thread::sleep(Duration::from_millis(10));
        }
        drop(c2);
        thread::sleep(Duration::from_millis(100));
        assert!(!server.is_dead("C") && server.failures().is_empty());
        c3.send(&Msg::Resume {
            node: "C".into(),
            from: 11,
            note: None,
        });
        assert_eq!(server.wait_rejoin("C", soon()), Some(11));
        // B, not rejoinable, dying is a failure.
        drop(b);
        let t = Instant::now();
        while server.failures().is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "B's death not recorded"
            );
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.failures()[0].failed_hop.as_deref(), Some("B"));
    }

    #[test]
    fn a_healed_around_relay_is_excluded_and_the_others_answer_the_halt() {
        let names: Vec<String> = ["B", "C", "D"].iter().map(|s| s.to_string()).collect();
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), &names).unwrap();
        let addr = server.local_addr();
        let soon = || Instant::now() + Duration::from_secs(5);
        server.set_rejoinable(&["B".into()]);
        let b = Client::connect(addr, "B", soon()).unwrap();
        let c = Client::connect(addr, "C", soon()).unwrap();
        let d = Client::connect(addr, "D", soon()).unwrap();
        // Everyone has said hello; nobody is silent for a second yet.
        let t = Instant::now();
        while !server.unconnected().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(5));
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            server
                .dead_or_silent(Some(Duration::from_secs(1)))
                .is_empty()
        );
        // B goes quiet (frozen): after the limit it is silent; C and D, talking, are not.
        thread::sleep(Duration::from_millis(300));
        c.send(&Msg::Progress {
            node: "C".into(),
            bytes: 1,
            chunks: 1,
        });
        d.send(&Msg::Progress {
            node: "D".into(),
            bytes: 1,
            chunks: 1,
        });
        let t = Instant::now();
        while server.dead_or_silent(Some(Duration::from_millis(250))) != ["B"] {
            assert!(t.elapsed() < Duration::from_secs(5), "B not found silent");
            thread::sleep(Duration::from_millis(10));
        }
        // Silence alone is not death when the caller does not ask about it.
        assert!(server.dead_or_silent(None).is_empty());
        // Spliced out: told to stop, no failure, its death and its reports ignored.
        server.exclude("B");
        assert!(server.is_excluded("B"));
        let h = b.wait_verdict(soon());
        assert!(h.abort.is_some() && h.lost, "{h:?}");
        b.send(&Msg::Final {
            node: "B".into(),
            ok: false,
            bytes: 0,
            committed: false,
            error: Some("woke up".into()),
            failed_hop: Some("B".into()),
            primary: true,
            resumed_from: None,
            bytes_sent_again: 0,
        });
        drop(b);
        // The halt: C and D answer; wait_held returns their first missing chunks.
        server.broadcast(&Msg::Halt {
            epoch: 1,
            dead: vec!["B".into()],
        });
        let hc = c.wait_rewind(0, 0, soon());
        assert_eq!(hc.halt, Some((1, vec!["B".to_string()])));
        c.send(&Msg::Held {
            node: "C".into(),
            epoch: 1,
            next: None,
        });
        let (held, missing) = server.wait_held(1, Instant::now() + Duration::from_millis(200));
        assert_eq!(missing, ["D"]);
        assert_eq!(held.get("C"), Some(&None));
        d.send(&Msg::Held {
            node: "D".into(),
            epoch: 1,
            next: Some(42),
        });
        let (held, missing) = server.wait_held(1, soon());
        assert!(missing.is_empty());
        assert_eq!(held.get("D"), Some(&Some(42)));
        server.broadcast(&Msg::Rewind {
            from: 42,
            dead: vec!["B".into()],
            epoch: 1,
        });
        let hd = d.wait_rewind(0, 1, soon());
        assert_eq!((hd.rewinds, hd.rewind), (1, Some(42)));
        assert_eq!(hd.rewind_dead, ["B"]);
        assert!(server.failures().is_empty(), "{:?}", server.failures());
        assert!(server.dead_without_final().is_empty());
    }

    #[test]
    fn a_node_that_vanishes_is_reported_dead() {
        let server =
            Server::bind("127.0.0.1:0".parse().unwrap(), &["B".into(), "C".into()]).unwrap();
        let addr = server.local_addr();
        let deadline = Instant::now() + Duration::from_secs(5);
        let b = Client::connect(addr, "B", deadline).unwrap();
        let c = Client::connect(addr, "C", deadline).unwrap();
        c.send(&Msg::Final {
            node: "C".into(),
            ok: true,
            bytes: 10,
            committed: true,
            error: None,
            failed_hop: None,
            primary: false,
            resumed_from: None,
            bytes_sent_again: 0,
        });
        drop(b);
        assert!(server.wait_all(Instant::now() + Duration::from_secs(5), false));
        let f = server.failures();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].failed_hop.as_deref(), Some("B"));
        assert!(f[0].primary);
        assert_eq!(server.bytes_of("C"), 10);
        server.broadcast(&Msg::Verdict {
            ok: false,
            error: Some("x".into()),
            failed_hop: Some("B".into()),
            sinks: BTreeMap::new(),
            healed: Vec::new(),
        });
        let h = c.wait_verdict(Instant::now() + Duration::from_secs(5));
        assert!(matches!(h.verdict, Some(Msg::Verdict { ok: false, .. })));
    }
}
