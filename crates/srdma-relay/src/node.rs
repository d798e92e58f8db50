//! One node of a transfer, run as its own process: the source, a relay, a sink, or a relay
//! that is also a sink. See the crate documentation for the protocol.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use srdma::cm::{self, CmError, CmEvent, ConnectOptions, Connection, Listener};
use srdma::{
    AccessFlags, CompChannel, Cq, Device, DeviceConfig, Mr, Mtu, Pd, QpInit, QpType, RKey, RecvWr,
    SendOp, SendWr, SgeList, Wc, WcOpcode, WcStatus,
};

use crate::chunk::{ChunkHeader, HEADER_LEN, flags};
use crate::config::{Config, Forward, Node, Role, Topology};
use crate::control::{self, Healed, Msg, SinkStatus};
use crate::digest::{ObjectDigest, hex};
use crate::report::{self, Display, Latencies, Report};
use crate::resume::{self, PartialState};
use crate::sink::{self, Sink};
use crate::source::{self, ObjectInfo, Source};
use crate::stage::{self, Chunk, Stage, StageError};

/// How a node shows what it does.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeOptions {
    /// Progress and report as JSON lines on stdout.
    pub json: bool,
    /// No progress bar or lines on stderr.
    pub quiet: bool,
}

/// How a node ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Its report (also printed).
    pub report: Report,
    /// Its exit status: 0 success, 1 failure, 2 bad configuration.
    pub code: i32,
}

mod mesh;

// wr_id kinds, in the top byte.
const K_DATA_RECV: u64 = 1 << 56;
const K_CREDIT_RECV: u64 = 2 << 56;
const K_FORWARD: u64 = 3 << 56;
const K_CREDIT_SEND: u64 = 4 << 56;
const KIND_MASK: u64 = 0xFF << 56;
const SEQ_MASK: u64 = (1 << 40) - 1;

/// How often the source asks the control channel whether a node died.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// Magic of the ring descriptor a child sends as the CM REP's private data.
const RING_MAGIC: &[u8; 4] = b"SRR1";

/// A failure, with whom it blames.
#[derive(Debug, Clone)]
struct Fail {
    msg: String,
    hop: Option<String>,
    primary: bool,
}

type R<T> = Result<T, Fail>;

impl Fail {
    fn at(hop: &str, msg: impl Into<String>) -> Fail {
        Fail {
            msg: msg.into(),
            hop: Some(hop.to_string()),
            primary: true,
        }
    }

    fn blame(hop: &str, msg: impl Into<String>) -> Fail {
        Fail {
            msg: msg.into(),
            hop: Some(hop.to_string()),
            primary: false,
        }
    }
}

/// A child's ring, as its REP announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ring {
    addr: u64,
    rkey: u32,
    len: u64,
    slots: u32,
    slot_size: u32,
}

impl Ring {
    fn encode(&self) -> Vec<u8> {
        let mut d = RING_MAGIC.to_vec();
        d.extend(self.addr.to_be_bytes());
        d.extend(self.rkey.to_be_bytes());
        d.extend(self.len.to_be_bytes());
        d.extend(self.slots.to_be_bytes());
        d.extend(self.slot_size.to_be_bytes());
        d
    }

    fn decode(d: &[u8]) -> Option<Ring> {
        if d.len() < 32 || &d[..4] != RING_MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(d[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap_or_default());
        Some(Ring {
            addr: u64_at(4),
            rkey: u32_at(12),
            len: u64_at(16),
            slots: u32_at(24),
            slot_size: u32_at(28),
        })
    }
}

struct Child {
    name: String,
    conn: Arc<Connection>,
    ring: Ring,
    /// Credits received (= chunks the child released).
    credits: u64,
    /// Next chunk to post to it.
    next_post: u64,
    posted_at: VecDeque<Instant>,
    down: Arc<AtomicBool>,
    /// A send to it failed (the source waits for the control channel to say why).
    broken: bool,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u64,
    busy: bool,
    processed: bool,
    /// Forwards posted and not yet completed.
    pending: u32,
    /// Bytes of header and payload to forward.
    len: usize,
    arrived: Instant,
    ready_at: Instant,
}

/// The sink side of a node.
struct SinkState {
    sink: Box<dyn Sink>,
    open: bool,
    digest: ObjectDigest,
    next_offset: u64,
    object_len: u64,
    committed: u64,
    digests: Vec<[u8; 16]>,
    /// A sink with `resume = true`.
    resume: Option<SinkResume>,
}

/// A resumable sink's bookkeeping (see [`crate::resume`]).
struct SinkResume {
    /// The sink's final path.
    output: std::path::PathBuf,
    fingerprint: u128,
    chunk_size: u64,
    /// The bitmap of the object in progress (`None` before it began, or for an object of
    /// unknown length, which cannot resume).
    state: Option<PartialState>,
    /// Chunks below this were durably written by an earlier run: checked, not rewritten.
    held_upto: u64,
    /// Chunks left to compare with what an earlier run may have written past `held_upto`
    /// (bytes found identical count as sent again); 0 stops comparing.
    compare_left: u64,
    /// The object continued an earlier run's: its digest is recomputed from the file.
    resumed: bool,
    /// Chunks written since the state was last saved.
    unsynced: u64,
    /// Save the state every this many chunks.
    every: u64,
    /// The state turned out foreign or the object wrong: discard, do not keep, on failure.
    discard: bool,
    /// Object bytes received again that an earlier run had already written.
    sent_again: u64,
    scratch: Vec<u8>,
    /// A valid earlier state, used when the object starts again (another sink needed the
    /// transfer from chunk 0).
    pending: Option<PartialState>,
}

/// The source side.
struct SourceState {
    src: Box<dyn Source>,
    in_place: bool,
    scratch: Vec<u8>,
    current: Option<ObjectInfo>,
    object: u32,
    offset: u64,
    digest: ObjectDigest,
    digests: Vec<[u8; 16]>,
    done: bool,
}

/// Counters the progress thread reads.
#[derive(Debug, Default)]
struct Live {
    bytes: AtomicU64,
    chunks: AtomicU64,
    total: AtomicU64,
    stop: AtomicBool,
}

/// A processed chunk: bytes to forward, object bytes, (flags, object length), what to do
/// next, bytes copied.
type Processed = (usize, u64, (u16, u64), After, u64);

/// What the data loop needs to connect again (a sink that came back, a rewind).
struct Links<'l> {
    pd: &'l Pd,
    init: &'l QpInit,
    /// The CM listener for the parent (not at the source).
    listener: Option<&'l Listener>,
}

/// What a chunk's processing asks of the loop afterwards (outside the device lock).
enum After {
    Nothing,
    Begin(ObjectInfo),
    Commit,
    Mismatch {
        want: [u8; 16],
        got: [u8; 16],
    },
    /// A resumed object ended: digest the whole part file, then commit or not.
    VerifyFile {
        want: [u8; 16],
    },
    /// A resumable sink wrote half a ring's worth: make it durable and save the bitmap.
    Save,
}

/// Loads the configuration at `path` and runs node `name` of it: what `srdma relay node` does.
/// Returns the exit status: 2 (with a message on stderr naming the file, node and field) for a
/// bad configuration or an unknown node, else [`run`]'s.
pub fn run_file(path: &std::path::Path, name: &str, opts: &NodeOptions) -> i32 {
    match Config::load(path) {
        Ok(cfg) => run(&cfg, name, opts).code,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

/// Runs node `name` of `cfg` to its end and prints its report; never panics on bad input.
pub fn run(cfg: &Config, name: &str, opts: &NodeOptions) -> Outcome {
    let Some(me) = cfg.node(name) else {
        let names: Vec<&str> = cfg.nodes.iter().map(|n| n.name.as_str()).collect();
        let msg = format!(
            "{}: no node named {name:?} (the nodes are {})",
            cfg.file,
            names.join(", ")
        );
        eprintln!("error: {msg}");
        return Outcome {
            report: Report {
                event: "report".into(),
                node: name.into(),
                error: Some(msg),
                ..Report::default()
            },
            code: 2,
        };
    };
    let mut n = NodeRun::new(cfg, me, opts);
    let result = n.run();
    n.finish(result)
}

struct NodeRun<'a> {
    cfg: &'a Config,
    me: &'a Node,
    opts: NodeOptions,
    slots: usize,
    slot_size: usize,
    timeout: Duration,
    live: Arc<Live>,
    started: Instant,
    first_chunk: Option<Instant>,
    last_chunk: Option<Instant>,
    dev: Option<Device>,
    server: Option<control::Server>,
    client: Option<Arc<control::Client>>,
    children: Vec<Child>,
    parent: Option<(Arc<Connection>, Arc<AtomicBool>)>,
    stages: Vec<Box<dyn Stage>>,
    own_copies: u64,
    forwarded: u64,
    latencies: Latencies,
    bytes: u64,
    chunks: u64,
    objects: u64,
    sink: Option<SinkState>,
    source_digests: Vec<[u8; 16]>,
    progress: Option<thread::JoinHandle<Display>>,
    /// The chunk this run starts at (0 unless a sink resumes).
    start_seq: u64,
    /// Why a resume state was discarded.
    resume_note: Option<String>,
    /// A resumable sink's valid state, kept for when the object starts again.
    pending_state: Option<PartialState>,
    /// The source: chunks below this were sent before a child came back.
    resend_until: u64,
    /// The source: object bytes sent again to a child that came back.
    resent: u64,
    /// A relay: `rewind` messages acted on.
    rewinds_seen: u64,
    /// Healing is on and some relay of the configuration may be healed around.
    heals: bool,
    /// The sinks that may be restarted while the rest waits ([`Config::rejoinable_sinks`]).
    rejoins: Vec<String>,
    /// The nodes spliced out of the tree so far (dead, frozen, or finished when a heal came).
    dead: Vec<String>,
    /// The source: the last `halt` sent; a node: the last `halt` answered.
    epoch: u64,
    /// Chunks below this were processed before a heal rewound the transfer: a sink does not
    /// write them again, and nobody counts them twice.
    dup_below: u64,
    /// Object bytes this sink received again after a heal.
    heal_again: u64,
    /// The source: the heals so far.
    healed: Vec<Healed>,
    /// The binomial pipeline's partners.
    peers: Vec<mesh::Peer>,
    /// The binomial pipeline: who sent the chunk being processed (for messages).
    chunk_from: Option<&'a str>,
}

fn mtu_of(v: u32) -> Mtu {
    match v {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

fn imm_of(seq: u64) -> u32 {
    (seq & 0xFFFF_FFFF) as u32
}

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

impl<'a> NodeRun<'a> {
    fn new(cfg: &'a Config, me: &'a Node, opts: &NodeOptions) -> NodeRun<'a> {
        NodeRun {
            cfg,
            me,
            opts: *opts,
            slots: cfg.transfer.slots as usize,
            slot_size: cfg.slot_size(),
            timeout: Duration::from_millis(cfg.transfer.timeout_ms),
            live: Arc::new(Live::default()),
            started: Instant::now(),
            first_chunk: None,
            last_chunk: None,
            dev: None,
            server: None,
            client: None,
            children: Vec::new(),
            parent: None,
            stages: Vec::new(),
            own_copies: 0,
            forwarded: 0,
            latencies: Latencies::default(),
            bytes: 0,
            chunks: 0,
            objects: 0,
            sink: None,
            source_digests: Vec::new(),
            progress: None,
            start_seq: 0,
            resume_note: None,
            pending_state: None,
            resend_until: 0,
            resent: 0,
            rewinds_seen: 0,
            heals: cfg.transfer.heal && cfg.nodes.iter().any(|n| cfg.healable(&n.name)),
            rejoins: cfg.rejoinable_sinks(),
            dead: Vec::new(),
            epoch: 0,
            dup_below: 0,
            heal_again: 0,
            healed: Vec::new(),
            peers: Vec::new(),
            chunk_from: None,
        }
    }

    fn name(&self) -> &str {
        &self.me.name
    }

    /// The parent: the nearest ancestor not spliced out (in the binomial pipeline: the
    /// partner the chunk being processed came from).
    fn parent_name(&self) -> &'a str {
        if let Some(from) = self.chunk_from {
            return from;
        }
        self.cfg
            .live_parent(&self.me.name, &self.dead)
            .map_or("?", |n| n.name.as_str())
    }

    /// A `halt` newer than the last one answered came.
    fn halted(&self) -> bool {
        self.client
            .as_ref()
            .is_some_and(|c| c.halt_epoch() > self.epoch)
    }

    fn status(&self, msg: &str) {
        if !self.opts.quiet && !self.opts.json {
            eprintln!("{}: {msg}", self.me.name);
        }
    }

    fn run(&mut self) -> R<()> {
        let me = self.me;
        let t = &self.cfg.transfer;
        for s in &me.stages {
            let st =
                stage::build(s).map_err(|e| Fail::at(&me.name, format!("stage {s:?}: {e}")))?;
            self.stages.push(st);
        }
        // The device.
        let mut dc = DeviceConfig::new(me.addr);
        dc.port = me.udp_port;
        dc.mtu = mtu_of(
            t.mtu
                .unwrap_or(if me.addr.is_loopback() { 4096 } else { 1024 }),
        );
        let dev = Device::open(dc).map_err(|e| {
            let hint = if e.to_string().to_lowercase().contains("in use") {
                " — the port is busy: is another relay node running on this address?"
            } else {
                ""
            };
            Fail::at(
                &me.name,
                format!(
                    "cannot open the RDMA device on UDP {}:{}: {e}{hint}",
                    me.addr, me.udp_port
                ),
            )
        })?;
        self.dev = Some(dev.clone());
        let pd = dev.alloc_pd();
        let deadline = Instant::now() + self.timeout;

        // The control channel, and the CM listener for the parent.
        let listener = if me.role == Role::Source {
            let expected: Vec<String> = self
                .cfg
                .nodes
                .iter()
                .filter(|n| n.role != Role::Source)
                .map(|n| n.name.clone())
                .collect();
            let addr = self.cfg.control_addr();
            let server = control::Server::bind(addr, &expected).map_err(|e| {
                Fail::at(
                    &me.name,
                    format!("cannot listen on the control port TCP {addr}: {e} (port busy?)"),
                )
            })?;
            self.server = Some(server);
            None
        } else {
            let l = Listener::bind(&dev, &pd, me.cm_addr()).map_err(|e| {
                Fail::at(
                    &me.name,
                    format!(
                        "cannot listen for connections on TCP {}: {e} (port busy?)",
                        me.cm_addr()
                    ),
                )
            })?;
            let src = self.cfg.source();
            let addr = self.cfg.control_addr();
            let client = control::Client::connect(addr, &me.name, deadline).map_err(|e| {
                Fail::blame(
                    &src.name,
                    format!(
                        "cannot reach the source {} at its control port TCP {addr} within {} ms: {e}",
                        src.name, t.timeout_ms
                    ),
                )
            })?;
            self.client = Some(Arc::new(client));
            Some(l)
        };
        self.start_progress();

        let chan = CompChannel::new()
            .map_err(|e| Fail::at(&me.name, format!("completion channel: {e}")))?;
        let binomial = self.cfg.transfer.topology == Topology::Binomial;
        let nkids = if binomial {
            crate::schedule::Binomial::new(self.cfg.nodes.len())
                .zip(self.cfg.rank(&me.name))
                .map_or(0, |(b, r)| b.partners(r).len())
        } else {
            self.cfg.children(&me.name).len()
        };
        let cq_len = (3 * self.slots * (nkids + 1) + 64).min(32_000);
        let cq = dev
            .create_cq(cq_len, Some(&chan))
            .map_err(|e| Fail::at(&me.name, format!("creating a CQ: {e}")))?;
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        let depth = (2 * self.slots as u32 + 16).max(128);
        init.caps.max_send_wr = depth;
        init.caps.max_recv_wr = depth;
        let access = if me.role == Role::Source {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        };
        let buf = pd
            .reg_mr(self.slots * self.slot_size, access)
            .map_err(|e| Fail::at(&me.name, format!("registering the ring: {e}")))?;

        // Where this run starts (a sink may resume), before any ring is set up.
        let held = self.negotiate_start(deadline)?;
        if binomial {
            self.mesh_connect(listener.as_ref(), &dev, &pd, &init, &buf, deadline)?;
        } else {
            if let Some(l) = &listener {
                self.accept_parent(l, &pd, &init, &buf, deadline)?;
            }
            for child in self.cfg.live_children(&me.name, &self.dead) {
                self.connect_child(child, &dev, &pd, &init, deadline)?;
            }
        }
        if me.role.has_sink() {
            let spec = me.sink.as_deref().unwrap_or("discard");
            let output = spec
                .strip_prefix("file:")
                .filter(|_| me.resume)
                .map(std::path::PathBuf::from);
            let s = match &output {
                Some(p) => {
                    sink::FileSink::resumable(p.clone()).map(|f| Box::new(f) as Box<dyn Sink>)
                }
                None => sink::open(spec),
            }
            .map_err(|e| Fail::at(&me.name, format!("opening sink {spec:?}: {e}")))?;
            let resume = output.map(|output| SinkResume {
                output,
                fingerprint: resume::fingerprint(self.cfg, me),
                chunk_size: self.cfg.transfer.chunk_size as u64,
                state: None,
                held_upto: 0,
                compare_left: 0,
                resumed: false,
                unsynced: 0,
                every: (self.slots as u64 / 2).max(1),
                discard: false,
                sent_again: 0,
                scratch: Vec::new(),
                pending: None,
            });
            self.sink = Some(SinkState {
                sink: s,
                open: false,
                digest: ObjectDigest::new(),
                next_offset: 0,
                object_len: u64::MAX,
                committed: 0,
                digests: Vec::new(),
                resume,
            });
            if let (Some(sk), Some(st)) = (self.sink.as_mut(), self.pending_state.take()) {
                if let Some(rs) = sk.resume.as_mut() {
                    rs.pending = Some(st);
                }
            }
            if let Some(st) = held {
                self.continue_object(st)?;
            }
        }
        let mut source = None;
        if me.role == Role::Source {
            source = Some(self.open_source()?);
        }
        if let Some(src) = source.as_mut() {
            self.skip_to_start(src, &buf)?;
        }
        self.status(&format!(
            "connected ({} slots of {} bytes per ring)",
            self.slots, self.slot_size
        ));
        if binomial {
            return self.mesh_loop(&cq, &chan, &buf, source);
        }
        let links = Links {
            pd: &pd,
            init: &init,
            listener: listener.as_ref(),
        };
        self.data_loop(&cq, &chan, &buf, source, &links)
    }

    /// Prints (always: it is a warning, not progress) and remembers a note about resuming.
    fn note(&mut self, msg: String) {
        eprintln!("{}: {msg}", self.me.name);
        self.resume_note = Some(msg);
    }

    /// When a sink of the configuration resumes: agrees on the chunk this run starts at
    /// (`self.start_seq`). The source waits for every sink's first missing chunk and starts
    /// at the smallest; every other node waits to hear it. A resumable sink loads and checks
    /// its state first (discarding a damaged or foreign one, with a message) and returns the
    /// state it continues from.
    fn negotiate_start(&mut self, deadline: Instant) -> R<Option<PartialState>> {
        if !self.cfg.resumable() {
            return Ok(None);
        }
        let me = self.me;
        if let Some(server) = &self.server {
            let sinks: Vec<String> = self.cfg.sinks().iter().map(|n| n.name.clone()).collect();
            let heard = server.wait_resume(&sinks, deadline);
            let from = sinks
                .iter()
                .map(|n| heard.get(n).copied().unwrap_or(0))
                .min()
                .unwrap_or(0);
            server.set_start(from);
            self.start_seq = from;
            if from > 0 {
                self.status(&format!("resuming the transfer at chunk {from}"));
            }
            return Ok(None);
        }
        let mut held: Option<PartialState> = None;
        let output = me
            .sink
            .as_deref()
            .and_then(|s| s.strip_prefix("file:"))
            .filter(|_| me.resume)
            .map(std::path::PathBuf::from);
        if let Some(out) = &output {
            let fp = resume::fingerprint(self.cfg, me);
            match resume::check(out, fp, self.cfg.transfer.chunk_size as u64) {
                Ok(st) => held = st,
                Err(why) => {
                    resume::discard(out);
                    self.note(format!(
                        "discarded the resume state {}: {why}; receiving the object from chunk 0",
                        resume::state_path(out).display()
                    ));
                }
            }
        }
        let point = held.as_ref().map_or(0, PartialState::first_missing);
        let Some(client) = self.client.clone() else {
            return Ok(None);
        };
        if me.role.has_sink() {
            client.send(&Msg::Resume {
                node: me.name.clone(),
                from: point,
                note: self.resume_note.clone(),
            });
        }
        let h = client.wait_start(deadline);
        let src = self.cfg.source().name.clone();
        let Some(from) = h.start else {
            if let Some((hop, err)) = h.abort {
                return Err(Fail {
                    msg: format!("the source stopped the transfer: {err}"),
                    hop,
                    primary: false,
                });
            }
            return Err(Fail::blame(
                &src,
                if h.lost {
                    format!("lost the control connection to the source {src}")
                } else {
                    format!(
                        "the source {src} did not say where the transfer starts within {} ms",
                        self.timeout.as_millis()
                    )
                },
            ));
        };
        self.start_seq = from;
        // A restarted sink joins a tree the heals so far have changed.
        self.dead = h.start_dead.clone();
        self.epoch = h.start_epoch;
        if let Some(st) = held {
            if from > point {
                return Err(Fail::at(
                    &me.name,
                    format!(
                        "the source starts at chunk {from}, but sink {} lacks chunk {point}",
                        me.name
                    ),
                ));
            }
            if from == 0 {
                // Another sink needs everything: use the state when the object starts.
                self.status(&format!(
                    "holding chunks 0..{point}; the transfer restarts from chunk 0 for another sink"
                ));
                self.pending_state = Some(st);
                return Ok(None);
            }
            self.status(&format!("resuming at chunk {from} (holding 0..{point})"));
            return Ok(Some(st));
        }
        if from > 0 && me.role.has_sink() {
            return Err(Fail::at(
                &me.name,
                format!(
                    "the source starts at chunk {from}, but sink {} holds nothing to resume from",
                    me.name
                ),
            ));
        }
        Ok(None)
    }

    /// The source: opens its source from the beginning.
    fn open_source(&self) -> R<SourceState> {
        let me = self.me;
        let spec = me.source.as_deref().unwrap_or("");
        let src = source::open(spec)
            .map_err(|e| Fail::at(&me.name, format!("opening source {spec:?}: {e}")))?;
        Ok(SourceState {
            src,
            in_place: !matches!(spec, "stdin" | "-"),
            scratch: Vec::new(),
            current: None,
            object: 0,
            offset: 0,
            digest: ObjectDigest::new(),
            digests: Vec::new(),
            done: false,
        })
    }

    /// The source, healing: relays that died (control connection closed without a report)
    /// or, with `silent_too`, froze (silent for `timeout_ms`), not spliced out yet. The data
    /// loop asks about silence only once the transfer itself stalled for half `timeout_ms`
    /// (a frozen relay stops the source within a ring's time): a live relay whose heartbeat
    /// was merely late on a loaded host is not cut out while chunks still flow.
    fn newly_dead(&self, silent_too: bool) -> Vec<String> {
        let Some(server) = &self.server else {
            return Vec::new();
        };
        server
            .dead_or_silent(silent_too.then_some(self.timeout))
            .into_iter()
            .filter(|n| self.cfg.healable(n) && !self.dead.contains(n))
            .collect()
    }

    /// The source: resumable sinks that died (and were not finished) or whose restarted
    /// process is saying hello.
    fn gone_sinks(&self) -> Vec<String> {
        let Some(server) = &self.server else {
            return Vec::new();
        };
        self.rejoins
            .iter()
            .filter(|n| server.is_dead(n) || server.rejoining(n))
            .cloned()
            .collect()
    }

    /// The source sets the tree up again: splices out the relays in `newly` (telling them to
    /// stop), halts every other node and waits for each to answer with the first chunk it
    /// lacks, waits (up to `timeout_ms`) for each resumable sink in `gone` to be restarted
    /// and say where it resumes, then has everyone connect again without the dead, from the
    /// smallest chunk any sink lacks (returned), and connects to its own children again.
    /// Relays found dead or frozen meanwhile are spliced out too. Fails (ending the transfer
    /// as before) when a node fails on its own, a sink does not come back, or a node does not
    /// answer within three times `timeout_ms`.
    fn heal(
        &mut self,
        mut newly: Vec<String>,
        gone: Vec<String>,
        next_in: u64,
        pd: &Pd,
        init: &QpInit,
        retired: &mut Vec<srdma_wire::seq::Qpn>,
    ) -> R<u64> {
        let me = self.me.name.clone();
        let t0 = Instant::now();
        let server = self
            .server
            .clone()
            .ok_or_else(|| Fail::at(&me, "no control server"))?;
        let dev = self.dev.clone().ok_or_else(|| Fail::at(&me, "no device"))?;
        let mut spliced = Vec::new();
        // The restarted sinks and where they resume.
        let mut back: BTreeMap<String, u64> = BTreeMap::new();
        let mut halt = true;
        let deadline = t0 + 3 * self.timeout;
        loop {
            for c in self.children.drain(..) {
                retired.push(c.conn.qp().qpn());
                let _ = c.conn.disconnect();
            }
            let held = loop {
                self.check_outside(true)?;
                if halt || !newly.is_empty() {
                    halt = false;
                    for n in &newly {
                        server.exclude(n);
                        if !self.dead.contains(n) {
                            self.dead.push(n.clone());
                        }
                    }
                    spliced.extend(newly.iter().cloned());
                    self.epoch += 1;
                    if !newly.is_empty() {
                        eprintln!(
                            "{me}: {} died or froze; healing around it (halt {})",
                            newly.join(", "),
                            self.epoch
                        );
                    }
                    server.broadcast(&Msg::Halt {
                        epoch: self.epoch,
                        dead: self.dead.clone(),
                    });
                    for (n, from) in &back {
                        server.mark_held(n, self.epoch, Some(*from));
                    }
                }
                let waiting: Vec<String> = gone
                    .iter()
                    .filter(|n| !back.contains_key(*n))
                    .cloned()
                    .collect();
                for n in &waiting {
                    let ms = self.timeout.as_millis();
                    eprintln!(
                        "{me}: lost {n}; waiting up to {ms} ms for it to be restarted and resume"
                    );
                    let by = (Instant::now() + self.timeout).min(deadline);
                    let Some(from) = server.wait_rejoin(n, by) else {
                        self.check_outside(true)?;
                        return Err(Fail::at(
                            n,
                            format!(
                                "node {n} died (its connections closed) and did not come back within {ms} ms"
                            ),
                        ));
                    };
                    eprintln!("{me}: {n} is back and lacks chunk {from}");
                    server.mark_held(n, self.epoch, Some(from));
                    back.insert(n.clone(), from);
                }
                let (held, missing) = server.wait_held(
                    self.epoch,
                    (Instant::now() + Duration::from_millis(200)).min(deadline),
                );
                if missing.is_empty() {
                    break held;
                }
                newly = self.newly_dead(true);
                if newly.is_empty() && Instant::now() >= deadline {
                    return Err(Fail::at(
                        &missing[0],
                        format!(
                            "the transfer could not be set up again: {} did not answer within {} ms",
                            missing.join(", "),
                            (3 * self.timeout).as_millis()
                        ),
                    ));
                }
            };
            // Nodes that finished take no part: splice them out of the tree too.
            let mut splice = self.dead.clone();
            for n in server.finals().into_keys() {
                if !splice.contains(&n) {
                    splice.push(n);
                }
            }
            let from = held
                .values()
                .flatten()
                .copied()
                .min()
                .unwrap_or(next_in)
                .min(next_in);
            for n in held.keys() {
                let msg = if back.contains_key(n) {
                    Msg::Start {
                        from,
                        dead: splice.clone(),
                        epoch: self.epoch,
                    }
                } else {
                    Msg::Rewind {
                        from,
                        dead: splice.clone(),
                        epoch: self.epoch,
                    }
                };
                server.send_to(n, &msg);
            }
            self.dead = splice;
            self.start_seq = from;
            let by = Instant::now() + self.timeout;
            let mut r = Ok(());
            for child in self.cfg.live_children(&me, &self.dead) {
                r = self.connect_child(child, &dev, pd, init, by);
                if r.is_err() {
                    break;
                }
            }
            if let Err(f) = r {
                // A child failed as the tree was set up again: if it died or froze, heal
                // around it too.
                eprintln!("{me}: {}; looking for nodes that died", f.msg);
                while newly.is_empty() && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(50));
                    self.check_outside(true)?;
                    newly = self.newly_dead(true);
                }
                if newly.is_empty() {
                    return Err(f);
                }
                continue;
            }
            let h = Healed {
                nodes: spliced,
                heal_ms: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
                from_chunk: from,
                resent_chunks: next_in.saturating_sub(from),
                rejoined: back.into_keys().collect(),
            };
            let what = match (h.nodes.is_empty(), h.rejoined.is_empty()) {
                (false, true) => format!("healed around {}", h.nodes.join(", ")),
                (true, _) => format!("{} rejoined", h.rejoined.join(", ")),
                (false, false) => format!(
                    "healed around {}, {} rejoined",
                    h.nodes.join(", "),
                    h.rejoined.join(", ")
                ),
            };
            eprintln!(
                "{me}: {what} in {} ms; resending from chunk {from} ({} chunks sent again)",
                h.heal_ms, h.resent_chunks
            );
            self.healed.push(h);
            return Ok(from);
        }
    }

    /// A node lost its parent or a child (or the source said `halt`): drops every
    /// connection, answers each `halt` with `held` (with `next`: a sink's first missing
    /// chunk), and when the source's `rewind` comes accepts its parent and connects to its
    /// children again, with the dead spliced out, from the chunk it names (returned). Waits
    /// up to three times `timeout_ms` for that (the source may first have to find a frozen
    /// node silent, or wait for a restarted sink), again after every `halt`.
    #[allow(clippy::too_many_arguments)]
    fn rewind(
        &mut self,
        why: &str,
        listener: &Listener,
        pd: &Pd,
        init: &QpInit,
        buf: &Mr,
        retired: &mut Vec<srdma_wire::seq::Qpn>,
        next: Option<u64>,
    ) -> R<u64> {
        let me = self.me.name.clone();
        let limit = 3 * self.timeout;
        let client = self
            .client
            .clone()
            .ok_or_else(|| Fail::at(&me, "no control connection"))?;
        let dev = self.dev.clone().ok_or_else(|| Fail::at(&me, "no device"))?;
        eprintln!("{me}: {why}; waiting for the source to set the transfer up again");
        let mut deadline = Instant::now() + limit;
        loop {
            if let Some((p, _)) = self.parent.take() {
                retired.push(p.qp().qpn());
                let _ = p.disconnect();
            }
            for c in self.children.drain(..) {
                retired.push(c.conn.qp().qpn());
                let _ = c.conn.disconnect();
            }
            let h = client.wait_rewind(self.rewinds_seen, self.epoch, deadline);
            if let Some((e, dead)) = h.halt.clone().filter(|(e, _)| *e > self.epoch) {
                self.epoch = e;
                self.dead = dead;
                client.send(&Msg::Held {
                    node: me.clone(),
                    epoch: e,
                    next,
                });
                deadline = Instant::now() + limit;
                continue;
            }
            if h.rewinds <= self.rewinds_seen {
                self.source_said(&h)?;
                let p = self.parent_name().to_string();
                return Err(Fail::blame(
                    &p,
                    format!(
                        "{why}, and the source did not set the transfer up again within {} ms",
                        limit.as_millis()
                    ),
                ));
            }
            self.rewinds_seen = h.rewinds;
            self.dead = h.rewind_dead.clone();
            let from = h.rewind.unwrap_or(0);
            self.start_seq = from;
            let connect_by = Instant::now() + self.timeout;
            let mut r = self.accept_parent(listener, pd, init, buf, connect_by);
            if r.is_ok() {
                for child in self.cfg.live_children(&me, &self.dead) {
                    r = self.connect_child(child, &dev, pd, init, connect_by);
                    if r.is_err() {
                        break;
                    }
                }
            }
            match r {
                Ok(()) => {
                    eprintln!(
                        "{me}: forwarding again from chunk {from} (parent {})",
                        self.parent_name()
                    );
                    return Ok(from);
                }
                // A neighbour failed again: the source will set the tree up again, or stop.
                Err(f) => {
                    self.status(&format!("{}; waiting for the source", f.msg));
                    deadline = Instant::now() + limit;
                }
            }
        }
    }

    /// A resumable sink continues the object of state `st` at chunk `self.start_seq` (>= 1).
    fn continue_object(&mut self, st: PartialState) -> R<()> {
        let name = self.me.name.clone();
        let from = self.start_seq;
        let slots = self.slots as u64;
        let sk = self
            .sink
            .as_mut()
            .ok_or_else(|| Fail::at(&name, "no sink"))?;
        let rs = sk
            .resume
            .as_mut()
            .ok_or_else(|| Fail::at(&name, "no resumable sink"))?;
        let len = st.object_len;
        let info = ObjectInfo {
            name: rs.output.display().to_string(),
            len: Some(len),
        };
        if let Err(e) = sk.sink.reopen(&info) {
            rs.discard = true;
            return Err(Fail::at(
                &name,
                format!("sink {name}: reopening the partial object: {e}"),
            ));
        }
        sk.open = true;
        sk.digest = ObjectDigest::new();
        sk.next_offset = from
            .saturating_sub(1)
            .saturating_mul(rs.chunk_size)
            .min(len);
        sk.object_len = len;
        rs.held_upto = st.first_missing();
        rs.compare_left = 4 * slots;
        rs.resumed = true;
        rs.state = Some(st);
        self.live.total.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// The source, when the run starts at chunk `self.start_seq`: frames the chunks before it
    /// without sending them (so that object digests still cover every byte).
    fn skip_to_start(&mut self, src: &mut SourceState, buf: &Mr) -> R<()> {
        let from = self.start_seq;
        for seq in 0..from {
            let s = (seq % self.slots as u64) as usize;
            let (_, _, eot) = self.fill(src, buf, s, seq, true)?;
            if eot {
                return Err(Fail::at(
                    &self.me.name,
                    format!(
                        "a sink resumes at chunk {from}, but the transfer has only {} chunks \
                         (did the source change?)",
                        seq + 1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A resumed object ended: digests the whole part file (an earlier run wrote part of it)
    /// and says whether to commit.
    fn digest_part_file(&mut self, want: [u8; 16]) -> R<After> {
        let name = self.me.name.clone();
        let sk = self
            .sink
            .as_mut()
            .ok_or_else(|| Fail::at(&name, "no sink"))?;
        let len = sk.object_len;
        let mut d = ObjectDigest::new();
        let mut piece = vec![0u8; (1 << 20).min(usize::try_from(len).unwrap_or(1 << 20))];
        let mut off = 0u64;
        while off < len {
            let n = piece
                .len()
                .min(usize::try_from(len - off).unwrap_or(usize::MAX));
            sk.sink.read_back(off, &mut piece[..n]).map_err(|e| {
                Fail::at(&name, format!("sink {name}: reading the object back: {e}"))
            })?;
            d.update(&piece[..n]);
            off += n as u64;
        }
        let got = d.finish();
        sk.digest = d;
        Ok(if got == want {
            After::Commit
        } else {
            After::Mismatch { want, got }
        })
    }

    /// A resumable sink: makes the object durable, then saves its bitmap.
    fn save_resume(&mut self) -> R<()> {
        let name = self.me.name.clone();
        let Some(sk) = self.sink.as_mut() else {
            return Ok(());
        };
        let Some(rs) = sk.resume.as_mut() else {
            return Ok(());
        };
        let Some(st) = &rs.state else {
            return Ok(());
        };
        let r = sk
            .sink
            .sync()
            .and_then(|()| st.save(&resume::state_path(&rs.output)));
        rs.unsynced = 0;
        r.map_err(|e| {
            if sink::is_storage_full(&e) {
                Fail::at(&name, format!("disk full at sink {name}: {e}"))
            } else {
                Fail::at(&name, format!("sink {name}: saving the resume state: {e}"))
            }
        })
    }

    fn start_progress(&mut self) {
        let live = Arc::clone(&self.live);
        let name = self.me.name.clone();
        let json = self.opts.json;
        let quiet = self.opts.quiet;
        let started = self.started;
        let client = self.client.clone();
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

    /// Waits for the parent's connection (posting a receive per ring slot first) and
    /// answers with the ring's descriptor.
    fn accept_parent(
        &mut self,
        l: &Listener,
        pd: &Pd,
        init: &QpInit,
        ring: &Mr,
        deadline: Instant,
    ) -> R<()> {
        let parent = self.parent_name().to_string();
        let desc = ring
            .remote()
            .ok_or_else(|| Fail::at(self.name(), "the ring has no rkey"))?;
        let ring_desc = Ring {
            addr: desc.addr,
            rkey: desc.rkey,
            len: desc.len,
            slots: self.slots as u32,
            slot_size: self.slot_size as u32,
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Fail::blame(
                    &parent,
                    format!(
                        "parent {parent} did not connect within {} ms",
                        self.timeout.as_millis()
                    ),
                ));
            }
            if self.halted() {
                return Err(Fail::blame(&parent, "the source halted the transfer again"));
            }
            let req = match l.accept_request(Some(left.min(Duration::from_millis(200)))) {
                Ok(r) => r,
                Err(CmError::Timeout) => continue,
                Err(_) => continue,
            };
            if req.private_data() != parent.as_bytes() {
                let who = String::from_utf8_lossy(req.private_data()).into_owned();
                let _ = req.reject(cm::reason::CONSUMER_DEFINED, b"not my parent");
                self.status(&format!("refused a connection from {who:?}: not my parent"));
                continue;
            }
            let qp = pd
                .create_qp(init)
                .map_err(|e| Fail::at(self.name(), format!("creating a QP: {e}")))?;
            // Chunk `start_seq` lands in the first receive: start at its slot.
            let first = (self.start_seq % self.slots as u64) as usize;
            for i in 0..self.slots {
                let s = (first + i) % self.slots;
                qp.post_recv(RecvWr {
                    wr_id: K_DATA_RECV | s as u64,
                    sges: SgeList::one(ring.sge(s * self.slot_size, self.slot_size)),
                })
                .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
            }
            let opts = ConnectOptions {
                private_data: ring_desc.encode(),
                ack_timeout: ack_timeout_for(self.timeout),
                ..ConnectOptions::default()
            };
            let conn = match req.accept_with(&qp, &opts) {
                Ok(c) => c,
                Err(e) => {
                    self.status(&format!("accepting {parent} failed: {e}; waiting again"));
                    continue;
                }
            };
            let conn = Arc::new(conn);
            let down = watch(Arc::clone(&conn), Arc::clone(&self.live));
            self.parent = Some((conn, down));
            return Ok(());
        }
    }

    /// Connects to a child (retrying until `deadline`: it may start later), reads its ring
    /// descriptor, posts a receive per slot for its credits.
    fn connect_child(
        &mut self,
        child: &Node,
        dev: &Device,
        pd: &Pd,
        init: &QpInit,
        deadline: Instant,
    ) -> R<()> {
        let conn = self.cm_connect(child, dev, pd, init, self.me.name.as_bytes(), deadline)?;
        let ring = Ring::decode(conn.remote_private_data()).ok_or_else(|| {
            Fail::at(
                &child.name,
                format!("{} sent no ring descriptor (not a relay node?)", child.name),
            )
        })?;
        if ring.slots as usize != self.slots
            || ring.slot_size as usize != self.slot_size
            || ring.len < ring.slots as u64 * u64::from(ring.slot_size)
        {
            return Err(Fail::at(
                &child.name,
                format!(
                    "{} announces {} slots of {} bytes, this node expects {} of {} (do all nodes \
                     use the same configuration?)",
                    child.name, ring.slots, ring.slot_size, self.slots, self.slot_size
                ),
            ));
        }
        let idx = self.children.len() as u64;
        for _ in 0..self.slots {
            conn.qp()
                .post_recv(RecvWr {
                    wr_id: K_CREDIT_RECV | idx,
                    sges: SgeList::new(),
                })
                .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
        }
        let conn = Arc::new(conn);
        let down = watch(Arc::clone(&conn), Arc::clone(&self.live));
        self.children.push(Child {
            name: child.name.clone(),
            conn,
            ring,
            credits: self.start_seq,
            next_post: self.start_seq,
            posted_at: VecDeque::new(),
            down,
            broken: false,
        });
        Ok(())
    }

    fn peer_of(&self, wc: &Wc) -> String {
        if let Some((p, _)) = &self.parent {
            if p.qp().qpn() == wc.qp_num {
                return self.parent_name().to_string();
            }
        }
        for c in &self.children {
            if c.conn.qp().qpn() == wc.qp_num {
                return c.name.clone();
            }
        }
        "?".into()
    }

    /// Fails when the source stopped the transfer or its control connection is gone.
    fn source_said(&self, h: &control::Heard) -> R<()> {
        if let Some((hop, err)) = &h.abort {
            return Err(Fail {
                msg: format!("the source stopped the transfer: {err}"),
                hop: hop.clone(),
                primary: false,
            });
        }
        if h.lost {
            let src = &self.cfg.source().name;
            return Err(Fail::blame(
                src,
                format!("lost the control connection to the source {src}"),
            ));
        }
        Ok(())
    }

    /// Connects to `node`'s CM listener with `private_data`, retrying until `deadline` (it may
    /// start later); a rejection ends it at once.
    fn cm_connect(
        &self,
        node: &Node,
        dev: &Device,
        pd: &Pd,
        init: &QpInit,
        private_data: &[u8],
        deadline: Instant,
    ) -> R<Connection> {
        let addr: SocketAddr = node.cm_addr();
        let mut last_err = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.halted() {
                return Err(Fail::blame(
                    &node.name,
                    "the source halted the transfer again",
                ));
            }
            if left.is_zero() {
                return Err(Fail::at(
                    &node.name,
                    format!(
                        "cannot reach {} at {addr} (its CM port) within {} ms: {last_err}",
                        node.name,
                        self.timeout.as_millis()
                    ),
                ));
            }
            let opts = ConnectOptions {
                private_data: private_data.to_vec(),
                timeout: left.min(Duration::from_secs(2)),
                ack_timeout: ack_timeout_for(self.timeout),
                ..ConnectOptions::default()
            };
            match cm::connect(dev, pd, addr, init, &opts) {
                Ok(c) => return Ok(c),
                Err(e @ CmError::Rejected { .. }) => {
                    return Err(Fail::at(
                        &node.name,
                        format!("{} at {addr} refused the connection: {e}", node.name),
                    ));
                }
                Err(e) => {
                    last_err = e.to_string();
                    thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Checks what the rest of the transfer says: aborts, lost peers. `ignore_parent`: the
    /// parent's connection may close (this node is done with it, or the data loop waits to be
    /// set up again when it does).
    fn check_outside(&self, ignore_parent: bool) -> R<()> {
        if let Some(s) = &self.server {
            let f = s.failures();
            if let Some(f) = f.iter().find(|f| f.primary).or(f.first()) {
                return Err(Fail {
                    msg: f.error.clone(),
                    hop: f.failed_hop.clone(),
                    primary: false,
                });
            }
        }
        if let Some(c) = &self.client {
            self.source_said(&c.heard())?;
        }
        if let Some((_, down)) = &self.parent {
            if !ignore_parent && down.load(Ordering::Acquire) {
                let p = self.parent_name();
                return Err(Fail::blame(
                    p,
                    format!("the connection from parent {p} was lost"),
                ));
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_lines)]
    fn data_loop(
        &mut self,
        cq: &Cq,
        chan: &CompChannel,
        buf: &Mr,
        mut source: Option<SourceState>,
        links: &Links<'_>,
    ) -> R<()> {
        let (pd, init, listener) = (links.pd, links.init, links.listener);
        let slots = self.slots;
        // Relays may die (healing) and resumable sinks be restarted: the source then sets the
        // tree up again, and every other node waits for it when it loses a neighbour.
        let mendable = self.heals || !self.rejoins.is_empty();
        let rewinds = listener.is_some() && mendable;
        if let Some(server) = &self.server {
            let mut rejoinable = self.rejoins.clone();
            if self.heals {
                rejoinable.extend(
                    self.cfg
                        .nodes
                        .iter()
                        .filter(|n| self.cfg.healable(&n.name))
                        .map(|n| n.name.clone()),
                );
            }
            server.set_rejoinable(&rejoinable);
        }
        let mut retired = Vec::new();
        let mut lost = false;
        // What broke, for the messages of a node waiting to be set up again.
        let mut lost_why = String::new();
        // The source, healing: when it first saw a child's connection fail.
        let mut suspect: Option<(Instant, Fail)> = None;
        let mut checked = Instant::now();
        let now = Instant::now();
        let mut ring: Vec<Slot> = vec![
            Slot {
                seq: 0,
                busy: false,
                processed: false,
                pending: 0,
                len: 0,
                arrived: now,
                ready_at: now,
            };
            slots
        ];
        let is_source = source.is_some();
        let mut next_in: u64 = self.start_seq;
        let mut next_release: u64 = self.start_seq;
        let mut eot: Option<u64> = None;
        let mut credits_out: u64 = 0;
        let mut throttle_clock = Instant::now();
        let mut last_activity = Instant::now();
        let mut wcs: Vec<Wc> = Vec::with_capacity(64);
        let mut batch: Vec<Wc> = Vec::with_capacity(64);
        let fwd_send = self.cfg.transfer.forward == Forward::Send && !is_source;
        let spin = Duration::from_micros(
            std::env::var("SRDMA_RELAY_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2000),
        );
        let mut idle_since = Instant::now();
        loop {
            let mut progressed = false;
            // 1. Completions (some may be left from the check before sleeping).
            if wcs.is_empty() {
                cq.poll_into(&mut wcs, 64);
            }
            std::mem::swap(&mut wcs, &mut batch);
            for wc in batch.drain(..) {
                progressed = true;
                last_activity = Instant::now();
                if retired.contains(&wc.qp_num) {
                    continue; // the connection to a child that died and came back
                }
                if wc.status != WcStatus::Success {
                    let on_child = self.children.iter().any(|c| c.conn.qp().qpn() == wc.qp_num);
                    let on_parent = self
                        .parent
                        .as_ref()
                        .is_some_and(|(p, _)| p.qp().qpn() == wc.qp_num);
                    let peer = self.peer_of(&wc);
                    let fail = Fail::blame(
                        &peer,
                        format!(
                            "{:?} with {peer} failed: {} ({peer} unreachable or gone)",
                            wc.opcode, wc.status
                        ),
                    );
                    if is_source && mendable && on_child {
                        // The source decides who died from the control channel.
                        if let Some(c) = self
                            .children
                            .iter_mut()
                            .find(|c| c.conn.qp().qpn() == wc.qp_num)
                        {
                            c.broken = true;
                        }
                        suspect.get_or_insert((Instant::now(), fail));
                        continue;
                    }
                    if rewinds && (on_child || on_parent) {
                        lost = true;
                        lost_why = format!("lost {peer} ({})", wc.status);
                        continue;
                    }
                    return Err(fail);
                }
                match wc.wr_id & KIND_MASK {
                    K_DATA_RECV => {
                        let imm = wc.imm_data.ok_or_else(|| {
                            Fail::at(self.name(), "a chunk arrived without immediate data")
                        })?;
                        let seq = next_in;
                        if imm != imm_of(seq) {
                            return Err(Fail::at(
                                self.name(),
                                format!(
                                    "chunk {imm} arrived from {}, expected {seq}",
                                    self.parent_name()
                                ),
                            ));
                        }
                        let s = (seq % slots as u64) as usize;
                        if wc.opcode == WcOpcode::Recv && (wc.wr_id & SEQ_MASK) as usize != s {
                            return Err(Fail::at(
                                self.name(),
                                format!(
                                    "chunk {seq} landed in slot {}, expected {s}",
                                    wc.wr_id & SEQ_MASK
                                ),
                            ));
                        }
                        if ring[s].busy {
                            return Err(Fail::blame(
                                self.parent_name(),
                                format!(
                                    "{} sent chunk {seq} into a slot still in use (credit violation)",
                                    self.parent_name()
                                ),
                            ));
                        }
                        next_in += 1;
                        let arrived = Instant::now();
                        self.first_chunk.get_or_insert(arrived);
                        ring[s] = Slot {
                            seq,
                            busy: true,
                            processed: false,
                            pending: 0,
                            len: 0,
                            arrived,
                            ready_at: arrived,
                        };
                        let (len, data, is_eot) =
                            self.process(buf, s, seq, wc.byte_len as usize)?;
                        if is_eot {
                            eot = Some(seq);
                        }
                        ring[s].len = len;
                        ring[s].processed = true;
                        if let Some(rate) = self.me.throttle {
                            let cost = Duration::from_secs_f64(len as f64 / rate as f64);
                            throttle_clock = throttle_clock.max(arrived) + cost;
                            ring[s].ready_at = throttle_clock;
                        }
                        if seq >= self.dup_below {
                            self.note_chunk(data);
                        }
                    }
                    K_CREDIT_RECV => {
                        let c = (wc.wr_id & SEQ_MASK) as usize;
                        let Some(child) = self.children.get_mut(c) else {
                            continue;
                        };
                        let imm = wc.imm_data.unwrap_or(u32::MAX);
                        if imm != imm_of(child.credits) {
                            return Err(Fail::blame(
                                &child.name,
                                format!(
                                    "{} returned the credit of chunk {imm}, expected {}",
                                    child.name, child.credits
                                ),
                            ));
                        }
                        child.credits += 1;
                        if let Some(t) = child.posted_at.pop_front() {
                            self.latencies.record(t.elapsed());
                        }
                        child
                            .conn
                            .qp()
                            .post_recv(RecvWr {
                                wr_id: wc.wr_id,
                                sges: SgeList::new(),
                            })
                            .map_err(|e| {
                                Fail::at(&self.me.name, format!("posting a receive: {e}"))
                            })?;
                    }
                    K_FORWARD => {
                        let seq = wc.wr_id & SEQ_MASK;
                        let s = (seq % slots as u64) as usize;
                        if ring[s].busy && ring[s].seq & SEQ_MASK == seq && ring[s].pending > 0 {
                            ring[s].pending -= 1;
                            self.forwarded += u64::from(wc.byte_len);
                        }
                    }
                    K_CREDIT_SEND => credits_out = credits_out.saturating_sub(1),
                    _ => {}
                }
            }

            // 2. The source fills free staging slots (no faster than its throttle, if any).
            let mut next_wake: Option<Instant> = None;
            if let Some(src) = source.as_mut() {
                let now = Instant::now();
                let paced = self.me.throttle.is_some() && throttle_clock > now;
                if paced {
                    next_wake = Some(throttle_clock);
                }
                if !src.done && !paced {
                    let s = (next_in % slots as u64) as usize;
                    if !ring[s].busy {
                        let seq = next_in;
                        let (len, data, is_eot) = self.fill(src, buf, s, seq, false)?;
                        if seq < self.resend_until {
                            self.resent += data;
                        }
                        let t = Instant::now();
                        self.first_chunk.get_or_insert(t);
                        ring[s] = Slot {
                            seq,
                            busy: true,
                            processed: true,
                            pending: 0,
                            len,
                            arrived: t,
                            ready_at: t,
                        };
                        if is_eot {
                            eot = Some(seq);
                            src.done = true;
                        }
                        self.note_chunk(data);
                        next_in += 1;
                        progressed = true;
                        if let Some(rate) = self.me.throttle {
                            let cost = Duration::from_secs_f64(len as f64 / rate as f64);
                            throttle_clock = throttle_clock.max(t) + cost;
                        }
                    }
                }
            }

            // 3. Forward what is processed, as far as each child's credits go.
            for (ci, child) in self.children.iter_mut().enumerate() {
                if child.broken {
                    continue;
                }
                while child.next_post < next_in && child.next_post < child.credits + slots as u64 {
                    let seq = child.next_post;
                    let s = (seq % slots as u64) as usize;
                    if !ring[s].processed || ring[s].seq != seq {
                        break;
                    }
                    let off = s * self.slot_size;
                    let op = if fwd_send {
                        SendOp::SendWithImm { imm: imm_of(seq) }
                    } else {
                        SendOp::WriteWithImm {
                            remote_addr: child.ring.addr
                                + (s * child.ring.slot_size as usize) as u64,
                            rkey: RKey(child.ring.rkey),
                            imm: imm_of(seq),
                        }
                    };
                    let wr = SendWr::new(
                        K_FORWARD | ((ci as u64) << 40) | (seq & SEQ_MASK),
                        op,
                        SgeList::one(buf.sge(off, ring[s].len)),
                    );
                    child.conn.qp().post_send(wr).map_err(|e| {
                        Fail::blame(
                            &child.name,
                            format!("posting chunk {seq} to {}: {e}", child.name),
                        )
                    })?;
                    ring[s].pending += 1;
                    child.posted_at.push_back(Instant::now());
                    child.next_post += 1;
                    progressed = true;
                }
            }

            // 4. Release slots in order: processed, forwarded to every child, throttle
            //    satisfied. A relay/sink reposts the receive and returns the credit.
            let now = Instant::now();
            while next_release < next_in {
                let s = (next_release % slots as u64) as usize;
                let sl = ring[s];
                let all_posted = self.children.iter().all(|c| c.next_post > sl.seq);
                if !(sl.busy && sl.processed && sl.pending == 0 && all_posted) {
                    break;
                }
                if sl.ready_at > now {
                    next_wake = Some(next_wake.map_or(sl.ready_at, |w| w.min(sl.ready_at)));
                    break;
                }
                if let Some((parent, _)) = &self.parent {
                    let qp = parent.qp();
                    qp.post_recv(RecvWr {
                        wr_id: K_DATA_RECV | s as u64,
                        sges: SgeList::one(buf.sge(s * self.slot_size, self.slot_size)),
                    })
                    .map_err(|e| Fail::at(&self.me.name, format!("reposting a receive: {e}")))?;
                    let credit = SendWr::new(
                        K_CREDIT_SEND | (sl.seq & SEQ_MASK),
                        SendOp::SendWithImm {
                            imm: imm_of(sl.seq),
                        },
                        SgeList::new(),
                    );
                    qp.post_send(credit).map_err(|e| {
                        Fail::blame(
                            self.parent_name(),
                            format!("returning a credit to {}: {e}", self.parent_name()),
                        )
                    })?;
                    credits_out += 1;
                    if self.children.is_empty() {
                        self.latencies.record(sl.arrived.elapsed());
                    }
                }
                ring[s].busy = false;
                ring[s].processed = false;
                next_release += 1;
                self.last_chunk = Some(now);
                progressed = true;
            }

            // 5. Done?
            if let Some(e) = eot {
                let done = if is_source {
                    self.children.iter().all(|c| c.credits > e)
                } else {
                    next_release > e && credits_out == 0
                };
                if done {
                    return Ok(());
                }
            }

            // 6. Failures elsewhere, dead hops. A sink that may come back is waited for; with
            //    healing, the source splices out relays that died or froze, and the other
            //    nodes wait for it to set the transfer up again.
            if let (true, Some(l)) = (rewinds, listener) {
                let down = self
                    .children
                    .iter()
                    .find(|c| c.down.load(Ordering::Acquire));
                let parent_down = self
                    .parent
                    .as_ref()
                    .is_some_and(|(_, d)| d.load(Ordering::Acquire));
                let halted = self.halted();
                if lost || down.is_some() || parent_down || halted {
                    let why = if let Some(c) = down {
                        format!("lost child {}", c.name)
                    } else if parent_down {
                        format!("lost parent {}", self.parent_name())
                    } else if lost {
                        std::mem::take(&mut lost_why)
                    } else {
                        "the source halted the transfer to heal it".to_string()
                    };
                    let next = self.sink.is_some().then_some(next_in.max(self.dup_below));
                    let from = self.rewind(&why, l, pd, init, buf, &mut retired, next)?;
                    self.dup_below = self.dup_below.max(next_in);
                    lost = false;
                    clear(&mut ring);
                    next_in = from;
                    next_release = from;
                    eot = None;
                    credits_out = 0;
                    throttle_clock = Instant::now();
                    last_activity = Instant::now();
                    idle_since = Instant::now();
                    continue;
                }
            }
            let mut restart_from = None;
            // The source asks the control channel about deaths every few milliseconds (it
            // takes a lock), at once when a child's link failed.
            if is_source && mendable && (suspect.is_some() || checked.elapsed() >= CHECK_EVERY) {
                checked = Instant::now();
                let newly = self.newly_dead(last_activity.elapsed() >= self.timeout / 2);
                let gone = self.gone_sinks();
                if !newly.is_empty() || !gone.is_empty() {
                    restart_from = Some(self.heal(newly, gone, next_in, pd, init, &mut retired)?);
                    suspect = None;
                }
            }
            if let Some(from) = restart_from {
                lost = false;
                self.resend_until = self.resend_until.max(next_in);
                clear(&mut ring);
                next_in = from;
                next_release = from;
                eot = None;
                throttle_clock = Instant::now();
                last_activity = Instant::now();
                // Frame the transfer again up to `from`, from a fresh source.
                self.objects = 0;
                self.source_digests.clear();
                self.live.total.store(0, Ordering::Relaxed);
                let mut src = self.open_source()?;
                self.skip_to_start(&mut src, buf)?;
                source = Some(src);
                idle_since = Instant::now();
                continue;
            }
            // A node that rewinds leaves a lost neighbour to step 6: a connection whose
            // watcher said so only since (a killed sink's, or the parent's as the source
            // heals) is not a failure, it is the next turn's rewind.
            let done_with_parent = eot.is_some_and(|e| next_release > e && credits_out == 0);
            self.check_outside(done_with_parent || rewinds)?;
            for c in &self.children {
                let finished = eot.is_some_and(|e| c.credits > e);
                if !finished && !rewinds && c.down.load(Ordering::Acquire) {
                    let f = Fail::blame(
                        &c.name,
                        format!("the connection to child {} was lost", c.name),
                    );
                    if is_source && mendable {
                        suspect.get_or_insert((Instant::now(), f));
                    } else {
                        return Err(f);
                    }
                }
            }
            if !progressed && last_activity.elapsed() > self.timeout && next_wake.is_none() {
                let ms = self.timeout.as_millis();
                let stalled = if let Some(c) =
                    self.children.iter().find(|c| c.next_post > c.credits)
                {
                    Some(Fail::blame(
                        &c.name,
                        format!(
                            "{} returned no credit for {ms} ms ({} of {} chunks acknowledged): hop {} is dead or stuck",
                            c.name, c.credits, c.next_post, c.name
                        ),
                    ))
                } else if !is_source {
                    let p = self.parent_name().to_string();
                    Some(Fail::blame(
                        &p,
                        format!(
                            "no chunk from parent {p} for {ms} ms after chunk {next_in}: hop {p} is dead or stuck"
                        ),
                    ))
                } else {
                    None
                };
                if let Some(f) = stalled {
                    if rewinds {
                        lost = true;
                        lost_why = f.msg;
                        continue;
                    }
                    if is_source && mendable {
                        suspect.get_or_insert((Instant::now(), f));
                    } else {
                        return Err(f);
                    }
                }
            }
            // The source, healing: a child's link failed and nobody was found dead or frozen
            // in time (a frozen relay falls silent within `timeout_ms`).
            if let Some((at, f)) = &suspect {
                if at.elapsed() > 2 * self.timeout + Duration::from_secs(1) {
                    return Err(f.clone());
                }
            }
            if progressed {
                idle_since = Instant::now();
                continue;
            }
            // 7. Nothing to do. While chunks are moving, keep polling (each poll drives the
            //    device from this thread, cheaper than a wake-up per chunk); after `spin`
            //    without progress, arm the CQ (which hands the device back to the progress
            //    thread) and sleep until a completion, the next throttle deadline, or a
            //    periodic check.
            if idle_since.elapsed() < spin {
                thread::yield_now();
                continue;
            }
            // Arm, then look once more: a completion that came before the arm fires no event.
            cq.req_notify(false);
            if cq.poll_into(&mut wcs, 64) > 0 {
                continue;
            }
            let mut wait = Duration::from_millis(20);
            if let Some(w) = next_wake {
                wait = wait.min(w.saturating_duration_since(Instant::now()));
            }
            let _ = chan.get_event(Some(wait));
        }
    }

    fn note_chunk(&mut self, data: u64) {
        self.chunks += 1;
        self.bytes += data;
        self.live.chunks.store(self.chunks, Ordering::Relaxed);
        self.live.bytes.store(self.bytes, Ordering::Relaxed);
    }

    /// The source: frames the next chunk in staging slot `s`. Returns (bytes to send, object
    /// bytes it carries, end of transfer). `dry`: a chunk before the start of a resumed run,
    /// framed only to be digested (no stages, no test knobs).
    fn fill(
        &mut self,
        src: &mut SourceState,
        buf: &Mr,
        s: usize,
        seq: u64,
        dry: bool,
    ) -> R<(usize, u64, bool)> {
        let me = self.me.name.clone();
        let check = self.cfg.transfer.check;
        let chunk_size = self.cfg.transfer.chunk_size;
        let base = s * self.slot_size;
        let slot_size = self.slot_size;
        let src_err = |e: std::io::Error| Fail::at(&me, format!("reading the source: {e}"));
        // Decide what this chunk is (outside the device lock: opening files may block).
        enum What {
            Start(ObjectInfo),
            Data,
            End,
            Eot,
        }
        let what = if src.current.is_none() {
            match src.src.next_object().map_err(src_err)? {
                Some(info) => What::Start(info),
                None => What::Eot,
            }
        } else {
            What::Data
        };
        // Stdin and other blocking sources: read outside the lock, copy in (counted).
        let mut pre: Option<usize> = None;
        if matches!(what, What::Data) && !src.in_place {
            src.scratch.resize(chunk_size, 0);
            let mut got = 0;
            while got < chunk_size {
                let n = src.src.read(&mut src.scratch[got..]).map_err(src_err)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            pre = Some(got);
        }
        let flip = !dry && self.me.flip_bit_at_seq == Some(seq);
        let stages = &mut self.stages;
        let r: R<(usize, u64, Option<What>)> = buf.with_bytes_mut(|b| {
            let slot = &mut b[base..base + slot_size];
            let (hb, pb) = slot.split_at_mut(HEADER_LEN);
            let obj_len = |info: &ObjectInfo| info.len.unwrap_or(u64::MAX);
            let mut what = what;
            let mut h;
            let mut data = 0u64;
            match &what {
                What::Start(info) => {
                    let name = info.name.as_bytes();
                    if name.len() > pb.len() {
                        return Err(Fail::at(
                            &me,
                            format!("object name {:?} is too long", info.name),
                        ));
                    }
                    pb[..name.len()].copy_from_slice(name);
                    h = ChunkHeader::data(seq, src.object, 0, 0, obj_len(info), check);
                    h.flags = flags::OBJECT_START;
                    h.seal(&pb[..name.len()]);
                }
                What::Eot => {
                    h = ChunkHeader::data(seq, src.object, 0, 0, 0, check);
                    h.flags = flags::END_OF_TRANSFER;
                    h.seal(&[]);
                }
                What::Data | What::End => {
                    let n = match pre {
                        Some(n) => {
                            pb[..n].copy_from_slice(&src.scratch[..n]);
                            n
                        }
                        None => {
                            // Fill the slot straight from the source.
                            let mut got = 0;
                            while got < chunk_size {
                                let n = src.src.read(&mut pb[got..chunk_size]).map_err(src_err)?;
                                if n == 0 {
                                    break;
                                }
                                got += n;
                            }
                            got
                        }
                    };
                    let len = src.current.as_ref().map_or(u64::MAX, obj_len);
                    if n == 0 {
                        let d = src.digest.finish();
                        pb[..16].copy_from_slice(&d);
                        h = ChunkHeader::data(seq, src.object, src.offset, 0, len, check);
                        h.flags = flags::OBJECT_END;
                        h.seal(&pb[..16]);
                        what = What::End;
                    } else {
                        src.digest.update(&pb[..n]);
                        h = ChunkHeader::data(seq, src.object, src.offset, n as u32, len, check);
                        h.seal(&pb[..n]);
                        for st in stages.iter_mut().filter(|_| !dry) {
                            st.process(Chunk {
                                header: &mut h,
                                buf: &mut *pb,
                            })
                            .map_err(|e| Fail::at(&me, format!("stage {}: {e}", st.name())))?;
                        }
                        data = n as u64;
                    }
                }
            }
            h.encode(hb)
                .map_err(|e| Fail::at(&me, format!("framing chunk {seq}: {e}")))?;
            if flip {
                flip_bit(hb, pb, h.payload_len as usize);
            }
            Ok((HEADER_LEN + h.payload_len as usize, data, Some(what)))
        });
        let (len, data, what) = r?;
        if pre.is_some() {
            self.own_copies += data;
        }
        match what {
            Some(What::Start(info)) => {
                if let Some(l) = info.len {
                    self.live.total.fetch_add(l, Ordering::Relaxed);
                }
                src.current = Some(info);
                src.offset = 0;
                src.digest = ObjectDigest::new();
                Ok((len, 0, false))
            }
            Some(What::Data) => {
                src.offset += data;
                Ok((len, data, false))
            }
            Some(What::End) => {
                let d = src.digest.finish();
                src.digests.push(d);
                self.source_digests.push(d);
                src.current = None;
                src.object += 1;
                self.objects += 1;
                Ok((len, 0, false))
            }
            Some(What::Eot) | None => Ok((len, 0, true)),
        }
    }

    /// A relay or sink: checks and processes the chunk in slot `s` in place, hands it to the
    /// sink. Returns (bytes to forward, object bytes it carries, end of transfer).
    fn process(&mut self, buf: &Mr, s: usize, seq: u64, byte_len: usize) -> R<(usize, u64, bool)> {
        let me = self.me.name.clone();
        let parent = self.parent_name().to_string();
        let base = s * self.slot_size;
        let slot_size = self.slot_size;
        let flip = self.me.flip_bit_at_seq == Some(seq);
        let first_of_run = seq == self.start_seq;
        // Processed before a heal rewound the transfer: forwarded again, not written again.
        let dup = seq < self.dup_below;
        let mut again = 0u64;
        let stages = &mut self.stages;
        let sink = &mut self.sink;
        let corrupt = |what: String| {
            Fail::at(
                &me,
                format!("chunk {seq} corrupt, caught at {me} (received from {parent}): {what}"),
            )
        };
        let verified = stages.last().is_some_and(|st| st.name() == "verify");
        let r: R<Processed> = buf.with_bytes_mut(|b| {
            let slot = &mut b[base..base + slot_size];
            let (hb, pb) = slot.split_at_mut(HEADER_LEN);
            let mut h = ChunkHeader::decode(hb).map_err(|e| corrupt(e.to_string()))?;
            if h.seq != seq {
                return Err(corrupt(format!("its header says chunk {}", h.seq)));
            }
            if HEADER_LEN + h.payload_len as usize != byte_len {
                return Err(corrupt(format!(
                    "{byte_len} bytes arrived, the header announces {}",
                    HEADER_LEN + h.payload_len as usize
                )));
            }
            for st in stages.iter_mut() {
                st.process(Chunk {
                    header: &mut h,
                    buf: &mut *pb,
                })
                .map_err(|e| match e {
                    StageError::Corrupt { error, .. } => corrupt(error.to_string()),
                    other => Fail::at(&me, format!("stage {} at {me}: {other}", st.name())),
                })?;
            }
            h.encode(hb)
                .map_err(|e| Fail::at(&me, format!("re-framing chunk {seq}: {e}")))?;
            if flip {
                flip_bit(hb, pb, h.payload_len as usize);
                // Re-read what now goes on: the sink below must see the damage too.
                if h.payload_len == 0 {
                    h = ChunkHeader::decode(hb).map_err(|e| corrupt(e.to_string()))?;
                }
            }
            let plen = h.payload_len as usize;
            let payload = &pb[..plen];
            let data = if h.is_data() { u64::from(h.raw_len) } else { 0 };
            let mut after = After::Nothing;
            let mut copied = 0u64;
            if dup {
                again = data;
            } else if let Some(sk) = sink.as_mut() {
                // The sink checks every chunk, unless a `verify` stage just did (and the flip
                // knob did not strike since).
                if !verified || flip {
                    h.verify(pb).map_err(|e| corrupt(e.to_string()))?;
                }
                if h.has(flags::OBJECT_START) {
                    if sk.open {
                        return Err(corrupt("an object starts inside another".into()));
                    }
                    let name = String::from_utf8(payload.to_vec())
                        .map_err(|_| corrupt("the object name is not UTF-8".into()))?;
                    copied += plen as u64;
                    after = After::Begin(ObjectInfo {
                        name,
                        len: (h.object_len != u64::MAX).then_some(h.object_len),
                    });
                } else if h.has(flags::OBJECT_END) {
                    if !sk.open {
                        return Err(corrupt("an object ends that never started".into()));
                    }
                    let want: [u8; 16] = payload
                        .get(..16)
                        .and_then(|d| d.try_into().ok())
                        .ok_or_else(|| corrupt("the object digest is missing".into()))?;
                    if sk.object_len != u64::MAX && sk.next_offset != sk.object_len {
                        return Err(corrupt(format!(
                            "the object ends after {} of its {} bytes",
                            sk.next_offset, sk.object_len
                        )));
                    }
                    let got = sk.digest.finish();
                    after = if sk.resume.as_ref().is_some_and(|r| r.resumed) {
                        // Part of the object came from an earlier run: digest the file.
                        After::VerifyFile { want }
                    } else if got == want {
                        After::Commit
                    } else {
                        After::Mismatch { want, got }
                    };
                } else if h.has(flags::END_OF_TRANSFER) {
                    if sk.open {
                        return Err(corrupt("the transfer ends inside an object".into()));
                    }
                } else {
                    if !sk.open {
                        return Err(corrupt("data outside an object".into()));
                    }
                    if h.has(flags::COMPRESSED) {
                        return Err(Fail::at(
                            &me,
                            format!(
                                "chunk {seq} reached sink {me} compressed: add a \"decompress\" stage"
                            ),
                        ));
                    }
                    let mut write = true;
                    if let Some(rs) = sk.resume.as_mut().filter(|r| r.state.is_some()) {
                        if rs.resumed
                            && first_of_run
                            && (h.object_len != sk.object_len || h.offset != sk.next_offset)
                        {
                            // Same configuration, but the source's object is not the one the
                            // earlier run wrote.
                            rs.discard = true;
                            return Err(Fail::at(
                                &me,
                                format!(
                                    "chunk {seq} is at offset {} of an object of {} bytes, but \
                                     the resume state of {} says offset {} of {} bytes: the \
                                     source changed; the partial object and its state are \
                                     discarded, run the transfer again to start from chunk 0",
                                    h.offset,
                                    h.object_len,
                                    rs.output.display(),
                                    sk.next_offset,
                                    sk.object_len
                                ),
                            ));
                        }
                        if seq < rs.held_upto {
                            write = false;
                        } else if rs.compare_left > 0 {
                            // What an earlier run wrote past its last saved state is still
                            // in the file: identical bytes were sent again.
                            rs.scratch.resize(plen, 0);
                            let same = sk.sink.read_back(h.offset, &mut rs.scratch).is_ok()
                                && rs.scratch[..] == *payload;
                            if same {
                                write = false;
                                rs.compare_left -= 1;
                            } else {
                                rs.compare_left = 0;
                            }
                        }
                        if !write {
                            rs.sent_again += plen as u64;
                        }
                    }
                    if h.offset != sk.next_offset || h.raw_len as usize != plen {
                        return Err(corrupt(format!(
                            "data at offset {} ({} bytes), expected offset {}",
                            h.offset, plen, sk.next_offset
                        )));
                    }
                    if !sk.resume.as_ref().is_some_and(|r| r.resumed) {
                        sk.digest.update(payload);
                    }
                    if write {
                        sk.sink.write(h.offset, payload).map_err(|e| {
                            if sink::is_storage_full(&e) {
                                Fail::at(&me, format!("disk full at sink {me}: {e}"))
                            } else {
                                Fail::at(&me, format!("sink {me}: writing: {e}"))
                            }
                        })?;
                    }
                    sk.next_offset += plen as u64;
                    if let Some(rs) = sk.resume.as_mut() {
                        if let Some(st) = rs.state.as_mut() {
                            st.set(seq);
                            rs.unsynced += 1;
                            if rs.unsynced >= rs.every {
                                after = After::Save;
                            }
                        }
                    }
                }
            }
            Ok((HEADER_LEN + plen, data, (h.flags, h.object_len), after, copied))
        });
        let (len, data, (chunk_flags, object_len), after, copied) = r?;
        let eot = chunk_flags & flags::END_OF_TRANSFER != 0;
        if dup {
            if self.sink.is_some() {
                self.heal_again += again;
            }
            return Ok((len, data, eot));
        }
        self.own_copies += copied;
        let after = match after {
            After::VerifyFile { want } => self.digest_part_file(want)?,
            other => other,
        };
        match after {
            After::Nothing => {}
            After::Save => self.save_resume()?,
            After::VerifyFile { .. } => {}
            After::Begin(info) => {
                let name = self.me.name.clone();
                let slots = self.slots as u64;
                let sk = self
                    .sink
                    .as_mut()
                    .ok_or_else(|| Fail::at(&self.me.name, "no sink"))?;
                if let Some(l) = info.len {
                    self.live.total.fetch_add(l, Ordering::Relaxed);
                }
                // A resumable sink continues a valid earlier state of this object's size.
                let mut reopened = false;
                if let (Some(rs), Some(olen)) = (sk.resume.as_mut(), info.len) {
                    if let Some(st) = rs.pending.take().filter(|st| st.object_len == olen) {
                        sk.sink.reopen(&info).map_err(|e| {
                            rs.discard = true;
                            Fail::at(
                                &name,
                                format!("sink {name}: reopening the partial object: {e}"),
                            )
                        })?;
                        rs.held_upto = st.first_missing();
                        rs.compare_left = 4 * slots;
                        rs.resumed = true;
                        rs.state = Some(st);
                        reopened = true;
                    }
                }
                if !reopened {
                    sk.sink.begin(&info).map_err(|e| {
                        if sink::is_storage_full(&e) {
                            Fail::at(&name, format!("disk full at sink {name}: {e}"))
                        } else {
                            Fail::at(&name, format!("sink {name}: starting {:?}: {e}", info.name))
                        }
                    })?;
                }
                sk.open = true;
                sk.digest = ObjectDigest::new();
                sk.next_offset = 0;
                sk.object_len = info.len.unwrap_or(u64::MAX);
                if let Some(rs) = sk.resume.as_mut().filter(|_| !reopened) {
                    // A fresh object: record its start (the state of an object of unknown
                    // length is not kept: it cannot be checked on a resume).
                    rs.state = info.len.map(|l| {
                        let mut st = PartialState::new(rs.fingerprint, rs.chunk_size, l);
                        st.set(seq);
                        st
                    });
                    rs.resumed = false;
                    rs.held_upto = 0;
                    rs.compare_left = 0;
                    self.save_resume()?;
                }
            }
            After::Commit => {
                let name = self.me.name.clone();
                let sk = self
                    .sink
                    .as_mut()
                    .ok_or_else(|| Fail::at(&name, "no sink"))?;
                sk.open = false;
                sk.sink.commit().map_err(|e| {
                    if sink::is_storage_full(&e) {
                        Fail::at(&name, format!("disk full at sink {name}: {e}"))
                    } else {
                        Fail::at(&name, format!("sink {name}: committing: {e}"))
                    }
                })?;
                sk.committed += 1;
                sk.digests.push(sk.digest.finish());
                if let Some(rs) = sk.resume.as_mut() {
                    // Committed: the state has served.
                    resume::discard(&rs.output);
                    rs.state = None;
                }
            }
            After::Mismatch { want, got } => {
                let name = self.me.name.clone();
                let mut what = String::new();
                if let Some(sk) = self.sink.as_mut() {
                    sk.open = false;
                    sk.sink.abort();
                    if let Some(rs) = sk.resume.as_mut() {
                        rs.discard = true;
                        rs.state = None;
                        resume::discard(&rs.output);
                        if rs.resumed {
                            what = format!(
                                " (over the partial object of an earlier run and this run's \
                                 chunks); the partial object and its resume state {} are \
                                 discarded, the next run starts from chunk 0",
                                resume::state_path(&rs.output).display()
                            );
                        }
                    }
                }
                return Err(Fail::at(
                    &name,
                    format!(
                        "object digest mismatch at sink {name}: the source sent {}, the data gives {}{what}",
                        hex(&want),
                        hex(&got)
                    ),
                ));
            }
        }
        if self.sink.is_none() {
            // Relays count objects as their ends pass, and learn the size from their starts.
            if chunk_flags & flags::OBJECT_END != 0 {
                self.objects += 1;
            }
            if chunk_flags & flags::OBJECT_START != 0 && object_len != u64::MAX {
                self.live.total.fetch_add(object_len, Ordering::Relaxed);
            }
        } else if let Some(sk) = &self.sink {
            self.objects = sk.committed;
        }
        Ok((len, data, eot))
    }

    /// Ends the run: reports to the source (or decides, at the source), prints the report.
    fn finish(mut self, result: R<()>) -> Outcome {
        let name = self.me.name.clone();
        let seconds = match (self.first_chunk, self.last_chunk) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        // A sink removes any partial object, unless it can resume it: then it saves its
        // bitmap and keeps it.
        let mut committed = false;
        let mut kept = None;
        if self.sink.as_ref().is_some_and(|sk| {
            sk.open
                && sk
                    .resume
                    .as_ref()
                    .is_some_and(|r| !r.discard && r.state.is_some())
        }) {
            kept = Some(self.save_resume());
        }
        let mut sent_again = 0;
        let mut resumed = false;
        if let Some(sk) = self.sink.as_mut() {
            if sk.open {
                match (&kept, sk.resume.as_ref()) {
                    (Some(Ok(())), Some(rs)) => {
                        sk.sink.suspend();
                        let n = rs.state.as_ref().map_or(0, PartialState::first_missing);
                        let msg = format!(
                            "kept the partial object (chunks 0..{n}) and its resume state {} for \
                             the next run",
                            resume::state_path(&rs.output).display()
                        );
                        eprintln!("{name}: {msg}");
                    }
                    (_, Some(rs)) => {
                        sk.sink.abort();
                        resume::discard(&rs.output);
                    }
                    (_, None) => sk.sink.abort(),
                }
                sk.open = false;
            } else if let Some(rs) = sk.resume.as_ref().filter(|r| r.discard) {
                resume::discard(&rs.output);
            }
            committed = result.is_ok() && sk.committed > 0;
            if let Some(rs) = &sk.resume {
                sent_again = rs.sent_again;
                resumed = rs.resumed;
            }
            sent_again += self.heal_again;
        }
        let resumed_from =
            (self.cfg.resumable() && (self.start_seq > 0 || resumed)).then_some(self.start_seq);
        let mut report = Report {
            event: "report".into(),
            node: name.clone(),
            role: self.me.role.as_str().into(),
            ok: result.is_ok(),
            bytes: self.bytes,
            objects: self.objects,
            chunks: self.chunks,
            seconds,
            throughput_mbps: report::mbps(self.bytes, seconds),
            chunk_latency_p50_us: self.latencies.percentile(50.0),
            chunk_latency_p99_us: self.latencies.percentile(99.0),
            retransmissions: self
                .dev
                .as_ref()
                .map_or(0, |d| d.qp_counters().completer_retry_err),
            copied_bytes: self.own_copies
                + self.stages.iter().map(|s| s.copied_bytes()).sum::<u64>(),
            forwarded_bytes: self.forwarded,
            digest: match &self.sink {
                Some(sk) => combined_digest(&sk.digests),
                None => combined_digest(&self.source_digests),
            },
            error: None,
            failed_hop: None,
            sinks: BTreeMap::new(),
            resumed_from_chunk: resumed_from,
            bytes_sent_again: sent_again,
            resume_note: self.resume_note.clone(),
            healed: self.healed.clone(),
            first_chunk_at: self.first_chunk.map_or(0.0, unix_time),
            last_chunk_at: self.last_chunk.map_or(0.0, unix_time),
        };
        if let Err(f) = &result {
            report.error = Some(format!("{name}: {}", f.msg));
            report.failed_hop = f.hop.clone();
        }
        let grace = self.timeout;
        if let Some(server) = &self.server {
            // The source: stop everyone on a failure, then wait for every report.
            if let Err(f) = &result {
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
                    error: format!(
                        "node {n} died (its control connection closed without a report)"
                    ),
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
            let finals = server.finals();
            let mut sinks = BTreeMap::new();
            for s in self.cfg.sinks() {
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
            report.bytes_sent_again = sinks
                .values()
                .map(|s| s.bytes_sent_again)
                .max()
                .unwrap_or(0)
                .max(self.resent);
            let mut ok = result.is_ok() && failures.is_empty() && all;
            ok &= sinks.values().all(|s| s.committed);
            if ok {
                report.ok = true;
            } else {
                report.ok = false;
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
                healed: self.healed.clone(),
            });
        } else if let Some(client) = &self.client {
            let (error, hop, primary) = match &result {
                Ok(()) => (None, None, false),
                Err(f) => (Some(format!("{name}: {}", f.msg)), f.hop.clone(), f.primary),
            };
            client.send(&Msg::Final {
                node: name.clone(),
                ok: result.is_ok(),
                bytes: self.bytes,
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
            if let Some(Msg::Verdict {
                error,
                failed_hop,
                sinks,
                healed,
                ..
            }) = heard.verdict
            {
                report.healed = healed;
                if self.sink.is_none() {
                    report.bytes_sent_again = sinks
                        .values()
                        .map(|s| s.bytes_sent_again)
                        .max()
                        .unwrap_or(0);
                }
                report.sinks = sinks;
                if let Err(f) = &result {
                    // The source knows best which hop failed first.
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
            }
        }
        // Stop the progress display and the connection watchers.
        self.live.stop.store(true, Ordering::Release);
        if let Some(h) = self.progress.take() {
            if let Ok(mut d) = h.join() {
                d.progress(self.bytes, self.chunks, self.started.elapsed());
                d.finish();
            }
        }
        for c in &self.children {
            let _ = c.conn.disconnect();
        }
        for p in &self.peers {
            let _ = p.conn.disconnect();
        }
        if let Some((p, _)) = &self.parent {
            let _ = p.disconnect();
        }
        if self.opts.json {
            report::print_json(&report);
        } else {
            println!("{}", report::human(&report));
        }
        if !report.ok {
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
        let code = if report.ok { 0 } else { 1 };
        Outcome { report, code }
    }
}

/// Empties a ring whose connections were set up again: every slot is free.
fn clear(ring: &mut [Slot]) {
    for sl in ring {
        sl.busy = false;
        sl.processed = false;
        sl.pending = 0;
    }
}

/// The wall-clock time (Unix seconds) of instant `t`.
fn unix_time(t: Instant) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    now - t.elapsed().as_secs_f64()
}

/// Flips one bit of the payload (or, for an empty payload, of the header) in place.
fn flip_bit(hb: &mut [u8], pb: &mut [u8], payload_len: usize) {
    if payload_len > 0 {
        pb[payload_len / 2] ^= 0x10;
    } else {
        hb[8] ^= 0x01;
    }
}

/// Watches a connection for the peer's disconnect (or the loss of its TCP link).
fn watch(conn: Arc<Connection>, live: Arc<Live>) -> Arc<AtomicBool> {
    let down = Arc::new(AtomicBool::new(false));
    let d2 = Arc::clone(&down);
    let _ = thread::Builder::new()
        .name("relay-cm-watch".into())
        .spawn(move || {
            while !live.stop.load(Ordering::Acquire) {
                match conn.poll_event(Some(Duration::from_millis(100))) {
                    Some(CmEvent::Established) | None => {}
                    Some(_) => {
                        d2.store(true, Ordering::Release);
                        return;
                    }
                }
            }
        });
    down
}

/// The RC ACK timeout exponent for a transfer whose dead-hop limit is `limit`: the largest
/// (at most 18, about 1 s) whose seven retries still give up within half the limit. A
/// busy 2-core host can stall a live peer for longer than ibv_rc_pingpong's 67 ms
/// (exponent 14) now and then; retries must not declare it dead for that, while a dead peer
/// is found by the control connection at once and by the transport within the limit.
fn ack_timeout_for(limit: Duration) -> u8 {
    let budget = limit.as_secs_f64() / 2.0 / 8.0;
    (14..=18)
        .rev()
        .find(|t| 4.096e-6 * f64::from(1u32 << t) <= budget)
        .unwrap_or(14)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_descriptor_round_trips() {
        let r = Ring {
            addr: 0x7f00_1234_5000,
            rkey: 0xdead_beef,
            len: 8 << 20,
            slots: 8,
            slot_size: (1 << 20) + 64,
        };
        assert_eq!(Ring::decode(&r.encode()), Some(r));
        assert_eq!(Ring::decode(&r.encode()[..31]), None);
        assert_eq!(Ring::decode(b"XXXX0000000000000000000000000000"), None);
    }

    #[test]
    fn flipping_changes_exactly_one_bit() {
        let mut h = [0u8; HEADER_LEN];
        let mut p = [0u8; 10];
        flip_bit(&mut h, &mut p, 10);
        assert_eq!(p.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
        flip_bit(&mut h, &mut p, 0);
        assert_eq!(h.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
    }
}
