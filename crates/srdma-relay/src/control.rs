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
//! | source → relay | `rewind` | `from` | a restarted sink came back: set the rings up again from chunk `from` |
//! | node → source | `progress` | `node`, `bytes`, `chunks` | about every 200 ms |
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
//! marked rejoinable ([`Server::set_rejoinable`]: the resumable sink at the end of a chain) that dies
//! is not a failure at once: a restarted process of it says `hello` again (and is not told the
//! old start), then `resume`, and the source answers it alone with a new `start`.

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
    /// The source tells where the transfer starts.
    Start {
        /// The first chunk sent.
        from: u64,
    },
    /// The source tells a relay on the way to a restarted sink to set its rings up again,
    /// starting at chunk `from` (see [`crate::config::Config::rejoin_chain`]).
    Rewind {
        /// The chunk the transfer continues at.
        from: u64,
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
    },
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

/// The source's end: accepts every node's connection and collects their reports.
#[derive(Debug)]
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
            .filter(|(k, v)| v.dead && v.final_report.is_none() && st.rejoinable.contains(k))
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
        self.broadcast(&Msg::Start { from });
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

fn serve(stream: TcpStream, shared: &Arc<(Mutex<ServerState>, Condvar)>) {
    let (m, cv) = &**shared;
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut me: Option<String> = None;
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
        match msg {
            Msg::Hello { node } => {
                let start = st.start;
                if let Some(slot) = st.nodes.get_mut(&node) {
                    slot.writer = writer.try_clone().ok();
                    slot.hello = true;
                    me = Some(node);
                    if slot.dead {
                        // A restarted process: the source tells it where to start itself.
                        slot.dead = false;
                        slot.rejoined = true;
                        slot.resume = None;
                        slot.final_report = None;
                    } else if let (Some(from), Some(w)) = (start, slot.writer.as_mut()) {
                        let _ = w.write_all(&Msg::Start { from }.line());
                    }
                }
            }
            Msg::Resume { node, from, .. } => {
                if let Some(slot) = st.nodes.get_mut(&node) {
                    slot.resume = Some(from);
                }
            }
            Msg::Progress { node, bytes, .. } => {
                if let Some(slot) = st.nodes.get_mut(&node) {
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
                if let Some(slot) = st.nodes.get_mut(&node) {
                    slot.final_report = Some(FinalReport {
                        ok,
                        bytes,
                        committed,
                        resumed_from,
                        bytes_sent_again,
                    });
                }
                if !ok {
                    st.failures.push(Failure {
                        failed_hop,
                        error: error.unwrap_or_else(|| format!("{node} failed")),
                        primary,
                    });
                }
            }
            Msg::Abort { .. } | Msg::Verdict { .. } | Msg::Start { .. } | Msg::Rewind { .. } => {}
        }
        cv.notify_all();
    }
    // The connection is gone: a node that did not report its end died.
    let mut st = lock(m);
    if let Some(name) = me {
        let verdict_sent = st.verdict_sent;
        let rejoinable = st.rejoinable.contains(&name);
        if let Some(slot) = st.nodes.get_mut(&name) {
            slot.writer = None;
            if slot.final_report.is_none() && !verdict_sent && rejoinable {
                slot.dead = true;
            } else if slot.final_report.is_none() && !verdict_sent {
                slot.dead = true;
                st.failures.push(Failure {
                    failed_hop: Some(name.clone()),
                    error: format!(
                        "node {name} died (its control connection closed without a report)"
                    ),
                    primary: true,
                });
            }
        }
    }
    cv.notify_all();
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
    /// The chunk the last `rewind` named, and how many came.
    pub rewind: Option<u64>,
    /// `rewind` messages heard.
    pub rewinds: u64,
}

/// A node's end of the control channel.
#[derive(Debug)]
pub struct Client {
    writer: Mutex<TcpStream>,
    heard: Arc<(Mutex<Heard>, Condvar)>,
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
        thread::Builder::new()
            .name("relay-control".into())
            .spawn(move || listen(reader, &h2))?;
        let c = Client {
            writer: Mutex::new(stream),
            heard,
        };
        c.send(&Msg::Hello { node: node.into() });
        Ok(c)
    }

    /// Sends a message (errors ignored: a lost source shows up in [`Client::heard`]).
    pub fn send(&self, msg: &Msg) {
        let _ = lock(&self.writer).write_all(&msg.line());
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

    /// Waits until more than `seen` `rewind` messages came, the source aborts, the
    /// connection is lost, or `deadline` passes.
    pub fn wait_rewind(&self, seen: u64, deadline: Instant) -> Heard {
        let (m, cv) = &*self.heard;
        let mut h = lock(m);
        while h.rewinds <= seen && h.abort.is_none() && !h.lost {
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

fn listen(stream: TcpStream, heard: &Arc<(Mutex<Heard>, Condvar)>) {
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
            Msg::Start { from } => h.start = Some(from),
            Msg::Rewind { from } => {
                h.rewind = Some(from);
                h.rewinds += 1;
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
        server.send_to("C", &Msg::Start { from: 9 });
        assert_eq!(c2.wait_start(soon()).start, Some(9));
        assert!(!server.is_dead("C"));
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
        });
        let h = c.wait_verdict(Instant::now() + Duration::from_secs(5));
        assert!(matches!(h.verdict, Some(Msg::Verdict { ok: false, .. })));
    }
}
