//! The relay configuration: one TOML file describing the transfer and every node of the
//! distribution tree, shared by all the nodes' processes.
//!
//! ```toml
//! [transfer]
//! chunk_size = "1MiB"      # default 1 MiB
//! slots = 8                # ring slots per hop (default 8)
//! forward = "send"         # "send" (default) or "write-imm": how relays forward
//! check = "crc32c"         # per-chunk checksum: "crc32c" (default), "xxh3", "none"
//! cm_port = 7471           # TCP port of every node's srdma::cm listener (default 7471)
//! udp_port = 4791          # RoCEv2 UDP port of every node's device (default 4791; 0 = any)
//! timeout_ms = 5000        # connect timeout and "hop is dead" limit (default 5000)
//! heal = true              # splice around a relay that dies or freezes (default true)
//! topology = "tree"        # "tree" (default: as the parents say) or "binomial"
//! # mtu = 4096             # path MTU offered (default: 4096 on loopback addresses, else 1024)
//!
//! [[node]]
//! name = "A"
//! addr = "127.0.30.1"
//! role = "source"          # "source" | "relay" | "sink" | "relay+sink"
//! source = "gen:1GiB"
//! stages = []
//!
//! [[node]]
//! name = "B"
//! addr = "127.0.30.2"
//! role = "relay"
//! parent = "A"
//! stages = ["verify"]
//!
//! [[node]]
//! name = "C"
//! addr = "127.0.30.3"
//! role = "sink"
//! parent = "B"
//! sink = "file:/tmp/out.bin"
//! stages = ["verify"]
//! # throttle = "10MiB/s"     # test knob: consume chunks at most this fast
//! # flip_bit_at_seq = 5      # test knob: flip a payload bit of chunk 5 after the stages
//! # resume = true            # keep a resume state beside the partial file (`file:` sinks)
//! ```
//!
//! `resume = true` on a `file:` sink makes it keep `<output>.srdma-part` (the partial object)
//! and `<output>.srdma-partial` (a bitmap of the chunks durably written, see
//! [`crate::resume`]) when the transfer fails, and pick up from them when the same
//! configuration runs again: the source then starts at the first chunk that sink lacks.
//!
//! Per node, `cm_port` and `udp_port` may override the transfer-wide values (so that several
//! nodes can share one address). [`Config::parse`] checks everything a node needs before it
//! opens a socket: exactly one source, every parent exists, no cycles, roles consistent with
//! the tree (a sink has no children, a relay and the source have some), addresses and sizes
//! parse, stage specs build. Every error names the file, the node and the field.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::Deserialize;

use crate::chunk::{CheckAlg, HEADER_LEN};

/// Default chunk size: 1 MiB.
pub const DEFAULT_CHUNK_SIZE: usize = 1 << 20;
/// Default ring slots per hop.
pub const DEFAULT_SLOTS: u32 = 8;
/// Default TCP port of the connection manager.
pub const DEFAULT_CM_PORT: u16 = 7471;
/// Default RoCEv2 UDP port.
pub const DEFAULT_UDP_PORT: u16 = 4791;
/// Default connect timeout and dead-hop limit, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 5000;
/// Smallest chunk size accepted (an OBJECT_START chunk carries the object's name).
pub const MIN_CHUNK_SIZE: usize = 4096;
/// Largest chunk size accepted.
pub const MAX_CHUNK_SIZE: usize = 256 << 20;
/// Most ring slots per hop.
pub const MAX_SLOTS: u32 = 1024;

/// A configuration error, with the file, node and field it concerns in its message.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {msg}")]
pub struct ConfigError {
    /// The configuration file (or `<generated>`).
    pub file: String,
    /// What is wrong, naming the node and field.
    pub msg: String,
}

/// How relays forward chunks to their children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// SEND_WITH_IMM into the child's posted receive (the slot's buffer).
    Send,
    /// RDMA WRITE_WITH_IMM into the child's ring slot.
    WriteImm,
}

impl Forward {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Forward::Send => "send",
            Forward::WriteImm => "write-imm",
        }
    }
}

/// How chunks travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Topology {
    /// Down the tree the `parent` fields draw (a chain is a tree).
    #[default]
    Tree,
    /// The binomial pipeline ([`crate::schedule`]): every sink also sends; no `parent`
    /// fields.
    Binomial,
}

impl Topology {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Tree => "tree",
            Topology::Binomial => "binomial",
        }
    }
}

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reads the data and sends it to its children.
    Source,
    /// Processes chunks in place and forwards them.
    Relay,
    /// Processes chunks and writes them to its sink.
    Sink,
    /// Both: writes them to its sink and forwards them.
    RelaySink,
}

impl Role {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Relay => "relay",
            Role::Sink => "sink",
            Role::RelaySink => "relay+sink",
        }
    }

    /// True when the role has a sink.
    pub fn has_sink(self) -> bool {
        matches!(self, Role::Sink | Role::RelaySink)
    }

    /// True when the role forwards to children.
    pub fn forwards(self) -> bool {
        matches!(self, Role::Source | Role::Relay | Role::RelaySink)
    }
}

/// The `[transfer]` table, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes of object data per chunk.
    pub chunk_size: usize,
    /// Ring slots per hop (chunks in flight per hop).
    pub slots: u32,
    /// How relays forward.
    pub forward: Forward,
    /// The per-chunk checksum.
    pub check: CheckAlg,
    /// Default TCP port of the CM listeners; the source's control port is one above its own.
    pub cm_port: u16,
    /// Default RoCEv2 UDP port (0: any free port).
    pub udp_port: u16,
    /// Connect timeout and dead-hop limit, in milliseconds.
    pub timeout_ms: u64,
    /// Path MTU offered; `None`: 4096 on loopback addresses, 1024 elsewhere.
    pub mtu: Option<u32>,
    /// Heal around a relay that dies or freezes (its children re-attach to the nearest live
    /// ancestor) instead of ending the transfer.
    pub heal: bool,
    /// How chunks travel.
    pub topology: Topology,
}

impl Default for Transfer {
    fn default() -> Self {
        Transfer {
            chunk_size: DEFAULT_CHUNK_SIZE,
            slots: DEFAULT_SLOTS,
            forward: Forward::Send,
            check: CheckAlg::Crc32c,
            cm_port: DEFAULT_CM_PORT,
            udp_port: DEFAULT_UDP_PORT,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            mtu: None,
            heal: true,
            topology: Topology::Tree,
        }
    }
}

/// One `[[node]]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Unique name.
    pub name: String,
    /// The node's IP address: its device and CM listener bind here.
    pub addr: IpAddr,
    /// What it does.
    pub role: Role,
    /// Its parent (`None` for the source).
    pub parent: Option<String>,
    /// Source spec (source only).
    pub source: Option<String>,
    /// Sink spec (sink roles only).
    pub sink: Option<String>,
    /// Stage specs, run in order on every chunk.
    pub stages: Vec<String>,
    /// TCP port of this node's CM listener.
    pub cm_port: u16,
    /// UDP port of this node's device (0: any).
    pub udp_port: u16,
    /// Test knob: consume chunks at most this many bytes per second.
    pub throttle: Option<u64>,
    /// Test knob: flip one payload bit of this chunk after the stages.
    pub flip_bit_at_seq: Option<u64>,
    /// A `file:` sink: keep a resume state beside the partial file and resume from it.
    pub resume: bool,
}

impl Node {
    /// The CM listener's address.
    pub fn cm_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.cm_port)
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where it came from (for messages).
    pub file: String,
    /// The `[transfer]` table.
    pub transfer: Transfer,
    /// The nodes, in file order.
    pub nodes: Vec<Node>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTransfer {
    chunk_size: Option<SizeValue>,
    slots: Option<i64>,
    forward: Option<String>,
    check: Option<String>,
    cm_port: Option<i64>,
    udp_port: Option<i64>,
    timeout_ms: Option<i64>,
    mtu: Option<i64>,
    heal: Option<bool>,
    topology: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    addr: String,
    role: String,
    parent: Option<String>,
    source: Option<String>,
    sink: Option<String>,
    #[serde(default)]
    stages: Vec<String>,
    cm_port: Option<i64>,
    udp_port: Option<i64>,
    throttle: Option<String>,
    flip_bit_at_seq: Option<i64>,
    #[serde(default)]
    resume: bool,
}

/// A size: "1MiB" or a plain integer of bytes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Int(i64),
    Text(String),
}

/// Parses a throughput like "10MiB/s" (or "10MiB") into bytes per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let v = crate::source::parse_size(t)?;
    if v == 0 {
        return Err(format!("{s:?}: a rate must be above zero"));
    }
    Ok(v)
}

fn port(v: i64, what: &str, allow_zero: bool) -> Result<u16, String> {
    match u16::try_from(v) {
        Ok(0) if !allow_zero => Err(format!("{what} 0 is not a port")),
        Ok(p) => Ok(p),
        Err(_) => Err(format!("{what} {v} is not a port (0..=65535)")),
    }
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            msg: format!("cannot read the file: {e}"),
        })?;
        Config::parse(&text, &file)
    }

    /// Parses and validates configuration text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let err = |msg: String| ConfigError {
            file: file.to_string(),
            msg,
        };
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            match e.span() {
                Some(span) => {
                    let line = text[..span.start.min(text.len())].lines().count().max(1);
                    err(format!("TOML syntax error at line {line}: {msg}"))
                }
                None => err(format!("TOML syntax error: {msg}")),
            }
        })?;
        for key in table.keys() {
            if key != "transfer" && key != "node" {
                return Err(err(format!(
                    "unknown top-level key `{key}` (expected `[transfer]` and `[[node]]`)"
                )));
            }
        }
        let raw_t: RawTransfer = match table.get("transfer") {
            None => RawTransfer::default(),
            Some(v) => v
                .clone()
                .try_into()
                .map_err(|e: toml::de::Error| err(format!("[transfer]: {}", e.message())))?,
        };
        let transfer = validate_transfer(raw_t).map_err(|m| err(format!("[transfer]: {m}")))?;
        let Some(list) = table.get("node") else {
            return Err(err(
                "no `[[node]]` tables: a transfer needs a source and a sink".into(),
            ));
        };
        let Some(list) = list.as_array() else {
            return Err(err("`node` must be an array of tables (`[[node]]`)".into()));
        };
        let mut raws = Vec::new();
        for (i, v) in list.iter().enumerate() {
            let label = match v.get("name").and_then(|n| n.as_str()) {
                Some(n) => format!("node #{} ({n:?})", i + 1),
                None => format!("node #{}", i + 1),
            };
            let raw: RawNode = v
                .clone()
                .try_into()
                .map_err(|e: toml::de::Error| err(format!("{label}: {}", e.message())))?;
            raws.push(raw);
        }
        let nodes = validate_nodes(raws, &transfer).map_err(err)?;
        let cfg = Config {
            file: file.to_string(),
            transfer,
            nodes,
        };
        cfg.check_topology().map_err(err)?;
        Ok(cfg)
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The one node whose address is among `local` (this host's addresses): what a host
    /// runs when it is started without `--name`, so that one command line serves every host
    /// (SLURM `srun`, pdsh, Ansible, a Kubernetes Job). No match, or several, is an error
    /// that lists the nodes and this host's addresses and says to pass `--name`.
    pub fn node_on_host(&self, local: &[IpAddr]) -> Result<&Node, String> {
        let mine: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| local.contains(&n.addr))
            .collect();
        match mine.as_slice() {
            [one] => Ok(one),
            [] => {
                let nodes: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("{} ({})", n.name, n.addr))
                    .collect();
                let here: Vec<String> = local.iter().map(ToString::to_string).collect();
                Err(format!(
                    "{}: no node's address is one of this host's ({}); the nodes are {}; \
                     pass --name to pick one",
                    self.file,
                    here.join(", "),
                    nodes.join(", ")
                ))
            }
            several => {
                let names: Vec<String> = several
                    .iter()
                    .map(|n| format!("{} ({})", n.name, n.addr))
                    .collect();
                Err(format!(
                    "{}: several nodes have an address of this host: {}; pass --name to pick one",
                    self.file,
                    names.join(", ")
                ))
            }
        }
    }

    /// The source node (validation guarantees exactly one).
    pub fn source(&self) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.role == Role::Source)
            .unwrap_or(&self.nodes[0])
    }

    /// The children of `name`, in file order.
    pub fn children(&self, name: &str) -> Vec<&Node> {
        self.nodes
            .iter()
            .filter(|n| n.parent.as_deref() == Some(name))
            .collect()
    }

    /// True when some sink keeps a resume state: the nodes then agree on the chunk the
    /// transfer starts at before any data moves (see [`crate::resume`]).
    pub fn resumable(&self) -> bool {
        self.nodes.iter().any(|n| n.resume)
    }

    /// The sinks (`role = "sink"`) with `resume = true`, when the source can be read again
    /// (not stdin): such a sink may be killed and restarted alone while the rest of the tree
    /// waits for it, and the transfer rewinds to the first chunk it lacks.
    pub fn rejoinable_sinks(&self) -> Vec<String> {
        if matches!(self.source().source.as_deref(), Some("stdin" | "-"))
            || self.transfer.topology == Topology::Binomial
        {
            return Vec::new(); // a stream cannot be read again
        }
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Sink && n.resume)
            .map(|n| n.name.clone())
            .collect()
    }

    /// True when the transfer may heal around node `name` dying: healing is on, the node is
    /// a relay without a sink of its own, and the source can be read again (not stdin).
    pub fn healable(&self, name: &str) -> bool {
        self.transfer.heal
            && self.node(name).is_some_and(|n| n.role == Role::Relay)
            && !matches!(self.source().source.as_deref(), Some("stdin" | "-"))
    }

    /// The parent of `name` once the nodes in `dead` are spliced out: its nearest ancestor
    /// not in `dead` (`None` for the source).
    pub fn live_parent(&self, name: &str, dead: &[String]) -> Option<&Node> {
        let mut cur = self.node(name)?.parent.as_deref();
        for _ in 0..=self.nodes.len() {
            let p = self.node(cur?)?;
            if !dead.contains(&p.name) {
                return Some(p);
            }
            cur = p.parent.as_deref();
        }
        None
    }

    /// The children of `name` once the nodes in `dead` are spliced out: its children, with
    /// every dead one replaced by its own live children, in file order.
    pub fn live_children(&self, name: &str, dead: &[String]) -> Vec<&Node> {
        self.nodes
            .iter()
            .filter(|n| !dead.contains(&n.name))
            .filter(|n| {
                self.live_parent(&n.name, dead)
                    .is_some_and(|p| p.name == name)
            })
            .collect()
    }

    /// The nodes with a sink, in file order.
    pub fn sinks(&self) -> Vec<&Node> {
        self.nodes.iter().filter(|n| n.role.has_sink()).collect()
    }

    /// The names from the source down to `name` (inclusive); empty if `name` is unknown.
    pub fn path_from_source(&self, name: &str) -> Vec<String> {
        let mut path = Vec::new();
        let mut cur = self.node(name);
        while let Some(n) = cur {
            if path.contains(&n.name) || path.len() > self.nodes.len() {
                break;
            }
            path.push(n.name.clone());
            cur = n.parent.as_deref().and_then(|p| self.node(p));
        }
        path.reverse();
        path
    }

    /// The nodes below `name` (children, grandchildren, ...), breadth first.
    pub fn descendants(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut queue = vec![name.to_string()];
        while let Some(n) = queue.pop() {
            for c in self.children(&n) {
                if !out.contains(&c.name) {
                    out.push(c.name.clone());
                    queue.insert(0, c.name.clone());
                }
            }
        }
        out
    }

    /// Hops from the source to `name`.
    pub fn depth(&self, name: &str) -> usize {
        self.path_from_source(name).len().saturating_sub(1)
    }

    /// Payload capacity of every ring slot: the largest any node's stages need, so that a
    /// chunk fits every ring it passes through.
    pub fn payload_capacity(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| crate::stage::capacity_for(self.transfer.chunk_size, &n.stages))
            .max()
            .unwrap_or(self.transfer.chunk_size)
            .max(self.transfer.chunk_size)
    }

    /// Bytes per ring slot: the header and the payload capacity, rounded up to 64 bytes.
    pub fn slot_size(&self) -> usize {
        (HEADER_LEN + self.payload_capacity()).div_ceil(64) * 64
    }

    /// The source's control address: its address, its CM port + 1.
    pub fn control_addr(&self) -> SocketAddr {
        let s = self.source();
        SocketAddr::new(s.addr, s.cm_port.wrapping_add(1))
    }

    fn check_topology(&self) -> Result<(), String> {
        if self.transfer.topology == Topology::Binomial {
            return self.check_binomial();
        }
        let sources: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| n.role == Role::Source)
            .collect();
        match sources.len() {
            1 => {}
            0 => return Err("no node has role = \"source\": exactly one must".into()),
            _ => {
                let names: Vec<&str> = sources.iter().map(|n| n.name.as_str()).collect();
                return Err(format!(
                    "nodes {} all have role = \"source\": exactly one may",
                    names.join(", ")
                ));
            }
        }
        let index: HashMap<&str, &Node> = self.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        for n in &self.nodes {
            let label = format!("node {:?}", n.name);
            match (&n.parent, n.role) {
                (Some(_), Role::Source) => {
                    return Err(format!("{label}: field `parent`: the source has no parent"));
                }
                (None, Role::Source) => {}
                (None, _) => {
                    return Err(format!(
                        "{label}: field `parent` is missing (every node but the source has one)"
                    ));
                }
                (Some(p), _) => {
                    if !index.contains_key(p.as_str()) {
                        return Err(format!("{label}: field `parent`: no node named {p:?}"));
                    }
                    if p == &n.name {
                        return Err(format!(
                            "{label}: field `parent`: a node cannot be its own parent"
                        ));
                    }
                }
            }
        }
        for n in &self.nodes {
            let label = format!("node {:?}", n.name);
            // Walk up: a cycle never reaches the source.
            let mut seen = vec![n.name.as_str()];
            let mut cur = n;
            while let Some(p) = cur.parent.as_deref() {
                if seen.contains(&p) {
                    return Err(format!(
                        "{label}: field `parent`: the parents form a cycle ({} -> {p})",
                        seen.join(" -> ")
                    ));
                }
                seen.push(p);
                cur = index[p];
            }
        }
        for n in &self.nodes {
            let label = format!("node {:?}", n.name);
            let kids = self.children(&n.name);
            match n.role {
                Role::Sink if !kids.is_empty() => {
                    return Err(format!(
                        "{label}: field `role`: a sink has no children, but {} name it as parent \
                         (use role = \"relay+sink\")",
                        kids.iter()
                            .map(|k| k.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                Role::Relay | Role::RelaySink | Role::Source if kids.is_empty() => {
                    return Err(format!(
                        "{label}: field `role`: a {} needs children, but no node has parent = {:?}",
                        n.role.as_str(),
                        n.name
                    ));
                }
                _ => {}
            }
        }
        let src = sources[0];
        let control = SocketAddr::new(src.addr, src.cm_port.wrapping_add(1));
        if src.cm_port == u16::MAX {
            return Err(format!(
                "node {:?}: field `cm_port`: the source's control port is cm_port + 1, so 65535 \
                 does not work",
                src.name
            ));
        }
        for n in &self.nodes {
            if n.cm_addr() == control {
                return Err(format!(
                    "node {:?}: field `cm_port`: {} is the source's control port (its cm_port + 1)",
                    n.name,
                    n.cm_addr()
                ));
            }
        }
        Ok(())
    }

    /// `topology = "binomial"`: one source first, then sinks; no parents; stages that leave
    /// chunks as they are (a sink forwards a chunk before its own stages run).
    fn check_binomial(&self) -> Result<(), String> {
        for (i, n) in self.nodes.iter().enumerate() {
            let label = format!("node {:?}", n.name);
            let want = if i == 0 { Role::Source } else { Role::Sink };
            if n.role != want {
                return Err(format!(
                    "{label}: field `role`: with topology = \"binomial\" the first node is the \
                     source and every other is a sink, not {:?}",
                    n.role.as_str()
                ));
            }
            if n.parent.is_some() {
                return Err(format!(
                    "{label}: field `parent`: with topology = \"binomial\" the schedule decides \
                     who sends to whom; remove `parent`"
                ));
            }
            if let Some(st) = n.stages.iter().find(|st| st.as_str() != "verify") {
                return Err(format!(
                    "{label}: field `stages`: {st:?}: with topology = \"binomial\" only \
                     \"verify\" (stages that leave chunks unchanged)"
                ));
            }
        }
        Ok(())
    }

    /// The rank of node `name` in the binomial pipeline: its place in the file.
    pub fn rank(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The configuration as TOML, as a file would hold it.
    pub fn to_toml(&self) -> String {
        let t = &self.transfer;
        let mut s = String::new();
        let _ = writeln!(s, "[transfer]");
        let _ = writeln!(s, "chunk_size = \"{}\"", format_size(t.chunk_size as u64));
        let _ = writeln!(s, "slots = {}", t.slots);
        let _ = writeln!(s, "forward = {:?}", t.forward.as_str());
        let check = match t.check {
            CheckAlg::None => "none",
            CheckAlg::Crc32c => "crc32c",
            CheckAlg::Xxh3 => "xxh3",
        };
        let _ = writeln!(s, "check = {check:?}");
        let _ = writeln!(s, "cm_port = {}", t.cm_port);
        let _ = writeln!(s, "udp_port = {}", t.udp_port);
        let _ = writeln!(s, "timeout_ms = {}", t.timeout_ms);
        if let Some(m) = t.mtu {
            let _ = writeln!(s, "mtu = {m}");
        }
        if !t.heal {
            let _ = writeln!(s, "heal = false");
        }
        if t.topology != Topology::Tree {
            let _ = writeln!(s, "topology = {:?}", t.topology.as_str());
        }
        for n in &self.nodes {
            let _ = writeln!(s, "\n[[node]]");
            let _ = writeln!(s, "name = {:?}", n.name);
            let _ = writeln!(s, "addr = \"{}\"", n.addr);
            let _ = writeln!(s, "role = {:?}", n.role.as_str());
            if let Some(p) = &n.parent {
                let _ = writeln!(s, "parent = {p:?}");
            }
            if let Some(src) = &n.source {
                let _ = writeln!(s, "source = {src:?}");
            }
            if let Some(sink) = &n.sink {
                let _ = writeln!(s, "sink = {sink:?}");
            }
            let stages: Vec<String> = n.stages.iter().map(|st| format!("{st:?}")).collect();
            let _ = writeln!(s, "stages = [{}]", stages.join(", "));
            if n.cm_port != t.cm_port {
                let _ = writeln!(s, "cm_port = {}", n.cm_port);
            }
            if n.udp_port != t.udp_port {
                let _ = writeln!(s, "udp_port = {}", n.udp_port);
            }
            if let Some(r) = n.throttle {
                let _ = writeln!(s, "throttle = \"{}/s\"", format_size(r));
            }
            if let Some(f) = n.flip_bit_at_seq {
                let _ = writeln!(s, "flip_bit_at_seq = {f}");
            }
            if n.resume {
                let _ = writeln!(s, "resume = true");
            }
        }
        s
    }
}

fn validate_transfer(r: RawTransfer) -> Result<Transfer, String> {
    let mut t = Transfer::default();
    if let Some(c) = r.chunk_size {
        let v = match c {
            SizeValue::Int(i) => {
                u64::try_from(i).map_err(|_| format!("field `chunk_size`: {i} is negative"))?
            }
            SizeValue::Text(s) => {
                crate::source::parse_size(&s).map_err(|e| format!("field `chunk_size`: {e}"))?
            }
        };
        if v < MIN_CHUNK_SIZE as u64 || v > MAX_CHUNK_SIZE as u64 {
            return Err(format!(
                "field `chunk_size`: {v} bytes is outside {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE}"
            ));
        }
        t.chunk_size = v as usize;
    }
    if let Some(s) = r.slots {
        if !(1..=i64::from(MAX_SLOTS)).contains(&s) {
            return Err(format!("field `slots`: {s} is outside 1..={MAX_SLOTS}"));
        }
        t.slots = s as u32;
    }
    if let Some(f) = r.forward {
        t.forward = match f.as_str() {
            "send" => Forward::Send,
            "write-imm" | "write_imm" | "write-with-imm" => Forward::WriteImm,
            other => {
                return Err(format!(
                    "field `forward`: {other:?} is neither \"send\" nor \"write-imm\""
                ));
            }
        };
    }
    if let Some(c) = r.check {
        t.check = match c.as_str() {
            "crc32c" => CheckAlg::Crc32c,
            "xxh3" => CheckAlg::Xxh3,
            "none" => CheckAlg::None,
            other => {
                return Err(format!(
                    "field `check`: {other:?} is not one of \"crc32c\", \"xxh3\", \"none\""
                ));
            }
        };
    }
    if let Some(p) = r.cm_port {
        t.cm_port = port(p, "field `cm_port`:", false)?;
    }
    if let Some(p) = r.udp_port {
        t.udp_port = port(p, "field `udp_port`:", true)?;
    }
    if let Some(ms) = r.timeout_ms {
        if !(100..=3_600_000).contains(&ms) {
            return Err(format!(
                "field `timeout_ms`: {ms} is outside 100..=3600000 milliseconds"
            ));
        }
        t.timeout_ms = ms as u64;
    }
    if let Some(m) = r.mtu {
        if ![256, 512, 1024, 2048, 4096].contains(&m) {
            return Err(format!(
                "field `mtu`: {m} is not an RDMA MTU (256, 512, 1024, 2048, 4096)"
            ));
        }
        t.mtu = Some(m as u32);
    }
    if let Some(h) = r.heal {
        t.heal = h;
    }
    if let Some(top) = r.topology {
        t.topology = match top.as_str() {
            "tree" | "chain" => Topology::Tree,
            "binomial" => Topology::Binomial,
            other => {
                return Err(format!(
                    "field `topology`: {other:?} is not \"tree\" or \"binomial\""
                ));
            }
        };
    }
    Ok(t)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn validate_nodes(raws: Vec<RawNode>, t: &Transfer) -> Result<Vec<Node>, String> {
    if raws.len() < 2 {
        return Err(format!(
            "{} `[[node]]` table(s): a transfer needs at least a source and a sink",
            raws.len()
        ));
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut endpoints: BTreeMap<SocketAddr, String> = BTreeMap::new();
    for (i, r) in raws.into_iter().enumerate() {
        let label = format!("node #{} ({:?})", i + 1, r.name);
        let node = validate_node(&label, r, t, &nodes)?;
        check_endpoints(&label, &node, &nodes, &mut endpoints)?;
        nodes.push(node);
    }
    Ok(nodes)
}

/// Checks one `[[node]]` table (`label` names it in messages; `earlier`: the nodes before it).
fn validate_node(label: &str, r: RawNode, t: &Transfer, earlier: &[Node]) -> Result<Node, String> {
    if !valid_name(&r.name) {
        return Err(format!(
            "{label}: field `name`: use 1 to 64 letters, digits, '_', '-' or '.'"
        ));
    }
    if earlier.iter().any(|n| n.name == r.name) {
        return Err(format!("{label}: field `name`: {:?} is used twice", r.name));
    }
    let addr: IpAddr = r
        .addr
        .trim()
        .parse()
        .map_err(|_| format!("{label}: field `addr`: {:?} is not an IP address", r.addr))?;
    if addr.is_unspecified() || addr.is_multicast() {
        return Err(format!(
            "{label}: field `addr`: {addr} cannot be bound as a node's own address"
        ));
    }
    let role = parse_role(label, &r.role)?;
    check_role_fields(label, role, &r)?;
    for st in &r.stages {
        crate::stage::build(st).map_err(|e| format!("{label}: field `stages`: {st:?}: {e}"))?;
    }
    let cm_port = match r.cm_port {
        Some(p) => port(p, &format!("{label}: field `cm_port`:"), false)?,
        None => t.cm_port,
    };
    let udp_port = match r.udp_port {
        Some(p) => port(p, &format!("{label}: field `udp_port`:"), true)?,
        None => t.udp_port,
    };
    let throttle = match &r.throttle {
        Some(s) => Some(parse_rate(s).map_err(|e| format!("{label}: field `throttle`: {e}"))?),
        None => None,
    };
    let flip_bit_at_seq = match r.flip_bit_at_seq {
        Some(v) => Some(
            u64::try_from(v)
                .map_err(|_| format!("{label}: field `flip_bit_at_seq`: {v} is negative"))?,
        ),
        None => None,
    };
    if r.resume && !r.sink.as_deref().is_some_and(|s| s.starts_with("file:")) {
        return Err(format!(
            "{label}: field `resume`: only a `file:` sink can resume (sink = \"file:PATH\")"
        ));
    }
    Ok(Node {
        name: r.name,
        addr,
        role,
        parent: r.parent,
        source: r.source,
        sink: r.sink,
        stages: r.stages,
        cm_port,
        udp_port,
        throttle,
        flip_bit_at_seq,
        resume: r.resume,
    })
}

/// A node's `role` field.
fn parse_role(label: &str, role: &str) -> Result<Role, String> {
    match role {
        "source" => Ok(Role::Source),
        "relay" => Ok(Role::Relay),
        "sink" => Ok(Role::Sink),
        "relay+sink" => Ok(Role::RelaySink),
        other => Err(format!(
            "{label}: field `role`: {other:?} is not one of \"source\", \"relay\", \
                 \"sink\", \"relay+sink\""
        )),
    }
}

/// The `source` and `sink` fields a node of `role` must have, and only those.
fn check_role_fields(label: &str, role: Role, r: &RawNode) -> Result<(), String> {
    match (role, &r.source) {
        (Role::Source, None) => {
            return Err(format!(
                "{label}: field `source` is missing (e.g. source = \"gen:64MiB\")"
            ));
        }
        (Role::Source, Some(s)) if s.trim().is_empty() => {
            return Err(format!("{label}: field `source` is empty"));
        }
        (Role::Source, Some(_)) | (_, None) => {}
        (_, Some(_)) => {
            return Err(format!(
                "{label}: field `source`: only the source node reads a source"
            ));
        }
    }
    match (role.has_sink(), &r.sink) {
        (true, None) => Err(format!(
            "{label}: field `sink` is missing (e.g. sink = \"file:/tmp/out.bin\" or \"discard\")"
        )),
        (false, Some(_)) => Err(format!(
            "{label}: field `sink`: a {} has no sink (use role = \"relay+sink\")",
            role.as_str()
        )),
        (true, Some(s)) => check_sink_spec(s).map_err(|e| format!("{label}: field `sink`: {e}")),
        (false, None) => Ok(()),
    }
}

/// A node's CM address (`endpoints`: those of the nodes before it) and UDP endpoint must be
/// its own.
fn check_endpoints(
    label: &str,
    node: &Node,
    earlier: &[Node],
    endpoints: &mut BTreeMap<SocketAddr, String>,
) -> Result<(), String> {
    let cm = SocketAddr::new(node.addr, node.cm_port);
    if let Some(other) = endpoints.insert(cm, node.name.clone()) {
        return Err(format!(
            "{label}: field `addr`: {cm} is node {other:?}'s CM address too (give every \
             node its own address, or its own cm_port)"
        ));
    }
    if node.udp_port != 0 {
        // The UDP endpoint must be distinct as well (port 0 picks a free one).
        let udp = SocketAddr::new(node.addr, node.udp_port);
        if let Some(n) = earlier
            .iter()
            .find(|n| n.udp_port != 0 && SocketAddr::new(n.addr, n.udp_port) == udp)
        {
            return Err(format!(
                "{label}: field `udp_port`: UDP {udp} is node {:?}'s too",
                n.name
            ));
        }
    }
    Ok(())
}

fn check_sink_spec(s: &str) -> Result<(), String> {
    let ok = s == "stdout"
        || s == "discard"
        || s.strip_prefix("file:").is_some_and(|p| !p.is_empty())
        || s.strip_prefix("dir:").is_some_and(|p| !p.is_empty());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not one of file:PATH, dir:PATH, stdout, discard"
        ))
    }
}

/// A byte count as the shortest exact spelling `parse_size` reads back: "1GiB", "256KiB",
/// "1000".
pub fn format_size(n: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n != 0 && n % (1u64 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// The name of the `i`-th generated node: A, B, ..., Z, then N27, N28, ...
pub fn node_name(i: usize) -> String {
    if i < 26 {
        char::from(b'A' + i as u8).to_string()
    } else {
        format!("N{}", i + 1)
    }
}

/// Options for generated configurations ([`generate_chain`], [`generate_tree`]).
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Source spec of the source node.
    pub source: String,
    /// Transfer settings.
    pub transfer: Transfer,
    /// First three octets' base and first host number: node `i` gets `base + i`.
    pub base: [u8; 4],
    /// Stages at relays.
    pub relay_stages: Vec<String>,
    /// Stages at sinks.
    pub sink_stages: Vec<String>,
    /// Sink spec for sink `name`: `None` discards; `Some(dir)` writes `dir/<name>.bin`.
    pub out_dir: Option<std::path::PathBuf>,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            source: "gen:1GiB".into(),
            transfer: Transfer::default(),
            base: [127, 0, 30, 1],
            relay_stages: vec!["verify".into()],
            sink_stages: vec!["verify".into()],
            out_dir: None,
        }
    }
}

impl GenOptions {
    fn addr(&self, i: usize) -> Result<IpAddr, String> {
        let last = usize::from(self.base[3]) + i;
        if last > 254 {
            return Err(format!("{} nodes do not fit after {:?}", i + 1, self.base));
        }
        Ok(IpAddr::from([
            self.base[0],
            self.base[1],
            self.base[2],
            last as u8,
        ]))
    }

    fn sink_spec(&self, name: &str) -> String {
        match &self.out_dir {
            None => "discard".into(),
            Some(d) => format!("file:{}", d.join(format!("{name}.bin")).display()),
        }
    }

    fn node(&self, i: usize, role: Role, parent: Option<usize>) -> Result<Node, String> {
        let name = node_name(i);
        Ok(Node {
            addr: self.addr(i)?,
            role,
            parent: parent.map(node_name),
            source: (role == Role::Source).then(|| self.source.clone()),
            sink: role.has_sink().then(|| self.sink_spec(&name)),
            stages: match role {
                Role::Source => Vec::new(),
                Role::Relay | Role::RelaySink => self.relay_stages.clone(),
                Role::Sink => self.sink_stages.clone(),
            },
            cm_port: self.transfer.cm_port,
            udp_port: self.transfer.udp_port,
            throttle: None,
            flip_bit_at_seq: None,
            resume: false,
            name,
        })
    }

    fn finish(&self, nodes: Vec<Node>) -> Result<Config, ConfigError> {
        let cfg = Config {
            file: "<generated>".into(),
            transfer: self.transfer.clone(),
            nodes,
        };
        // Round-trip through the parser: a generated file is checked like any other.
        Config::parse(&cfg.to_toml(), "<generated>")
    }
}

/// A chain of `hops` links: source, `hops - 1` relays, one sink.
pub fn generate_chain(hops: usize, opts: &GenOptions) -> Result<Config, ConfigError> {
    let gen_err = |msg: String| ConfigError {
        file: "<generated>".into(),
        msg,
    };
    if hops == 0 {
        return Err(gen_err("a chain needs at least one hop".into()));
    }
    let mut nodes = vec![opts.node(0, Role::Source, None).map_err(gen_err)?];
    for i in 1..=hops {
        let role = if i == hops { Role::Sink } else { Role::Relay };
        nodes.push(opts.node(i, role, Some(i - 1)).map_err(gen_err)?);
    }
    opts.finish(nodes)
}

/// A binomial pipeline ([`crate::schedule`]) from the source to `sinks` sinks.
pub fn generate_binomial(sinks: usize, opts: &GenOptions) -> Result<Config, ConfigError> {
    let gen_err = |msg: String| ConfigError {
        file: "<generated>".into(),
        msg,
    };
    if sinks == 0 {
        return Err(gen_err(
            "a binomial pipeline needs at least one sink".into(),
        ));
    }
    let mut nodes = vec![opts.node(0, Role::Source, None).map_err(gen_err)?];
    for i in 1..=sinks {
        nodes.push(opts.node(i, Role::Sink, None).map_err(gen_err)?);
    }
    let mut opts = opts.clone();
    opts.transfer.topology = Topology::Binomial;
    opts.finish(nodes)
}

/// A complete `fanout`-ary tree of `depth` levels below the source: inner nodes relay,
/// leaves are sinks.
pub fn generate_tree(
    fanout: usize,
    depth: usize,
    opts: &GenOptions,
) -> Result<Config, ConfigError> {
    let gen_err = |msg: String| ConfigError {
        file: "<generated>".into(),
        msg,
    };
    if fanout == 0 || depth == 0 {
        return Err(gen_err("a tree needs fanout >= 1 and depth >= 1".into()));
    }
    let mut nodes = vec![opts.node(0, Role::Source, None).map_err(gen_err)?];
    let mut level = vec![0usize];
    for d in 1..=depth {
        let mut next = Vec::new();
        for &p in &level {
            for _ in 0..fanout {
                let i = nodes.len();
                if i > 250 {
                    return Err(gen_err(format!(
                        "a tree of fanout {fanout} and depth {depth} has too many nodes (at most 250)"
                    )));
                }
                let role = if d == depth { Role::Sink } else { Role::Relay };
                nodes.push(opts.node(i, role, Some(p)).map_err(gen_err)?);
                next.push(i);
            }
        }
        level = next;
    }
    opts.finish(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[transfer]
chunk_size = "256KiB"
slots = 4

[[node]]
name = "A"
addr = "127.0.30.1"
role = "source"
source = "gen:8MiB"

[[node]]
name = "B"
addr = "127.0.30.2"
role = "relay"
parent = "A"
stages = ["verify"]

[[node]]
name = "C"
addr = "127.0.30.3"
role = "sink"
parent = "B"
sink = "discard"
"#;

    #[test]
    fn parses_a_chain() {
        let c = Config::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.transfer.chunk_size, 256 << 10);
        assert_eq!(c.transfer.slots, 4);
        assert_eq!(c.transfer.cm_port, DEFAULT_CM_PORT);
        assert_eq!(c.children("A")[0].name, "B");
        assert_eq!(c.path_from_source("C"), ["A", "B", "C"]);
        assert_eq!(c.descendants("A"), ["B", "C"]);
        assert_eq!(c.sinks()[0].name, "C");
        assert_eq!(c.depth("C"), 2);
        // Printing and re-parsing gives the same configuration.
        let again = Config::parse(&c.to_toml(), "t.toml").unwrap();
        assert_eq!(again.nodes, c.nodes);
        assert_eq!(again.transfer, c.transfer);
    }

    fn bad(text: &str) -> String {
        Config::parse(text, "bad.toml").unwrap_err().to_string()
    }

    #[test]
    fn resume_needs_a_file_sink_and_round_trips() {
        let e = bad(&GOOD.replace("sink = \"discard\"", "sink = \"discard\"\nresume = true"));
        assert!(e.contains("\"C\"") && e.contains("`resume`"), "{e}");
        let e = bad(&GOOD.replace("stages = [\"verify\"]", "stages = []\nresume = true"));
        assert!(e.contains("\"B\"") && e.contains("`resume`"), "{e}");
        let c = Config::parse(GOOD, "t.toml").unwrap();
        assert!(!c.resumable());
        let text = GOOD.replace(
            "sink = \"discard\"",
            "sink = \"file:/tmp/x\"\nresume = true",
        );
        let c = Config::parse(&text, "t.toml").unwrap();
        assert!(c.resumable() && c.node("C").unwrap().resume);
        assert_eq!(c.rejoinable_sinks(), ["C"]);
        assert!(
            Config::parse(GOOD, "t.toml")
                .unwrap()
                .rejoinable_sinks()
                .is_empty()
        );
        let again = Config::parse(&c.to_toml(), "t.toml").unwrap();
        assert_eq!(again.nodes, c.nodes);
    }

    #[test]
    fn errors_name_file_node_and_field() {
        let e = bad(&GOOD.replace("parent = \"B\"", "parent = \"X\""));
        assert!(e.starts_with("bad.toml: "), "{e}");
        assert!(
            e.contains("\"C\"") && e.contains("`parent`") && e.contains("\"X\""),
            "{e}"
        );

        let e = bad(&GOOD.replace("127.0.30.2", "127.0.300.2"));
        assert!(e.contains("\"B\"") && e.contains("`addr`"), "{e}");

        let e = bad(&GOOD.replace("role = \"relay\"", "role = \"relais\""));
        assert!(e.contains("\"B\"") && e.contains("`role`"), "{e}");

        let e = bad(&GOOD.replace("slots = 4", "slots = 0"));
        assert!(e.contains("[transfer]") && e.contains("`slots`"), "{e}");

        let e = bad(&GOOD.replace("slots = 4", "slotz = 4"));
        assert!(e.contains("[transfer]") && e.contains("slotz"), "{e}");

        let e = bad(&GOOD.replace("stages = [\"verify\"]", "stages = [\"verify\"]\ncolour = 1"));
        assert!(e.contains("\"B\"") && e.contains("colour"), "{e}");

        let e = bad(&GOOD.replace("sink = \"discard\"", ""));
        assert!(e.contains("\"C\"") && e.contains("`sink`"), "{e}");
    }

    #[test]
    fn topology_rules() {
        // Two sources.
        let e = bad(&GOOD.replace(
            "role = \"relay\"\nparent = \"A\"",
            "role = \"source\"\nsource = \"gen:1\"",
        ));
        assert!(e.contains("exactly one"), "{e}");
        // A cycle: A's child B's parent is C, C's parent is B.
        let e = bad(&GOOD.replace("parent = \"A\"", "parent = \"C\"").replace(
            "role = \"sink\"\nparent = \"B\"\nsink = \"discard\"",
            "role = \"relay\"\nparent = \"B\"",
        ));
        assert!(e.contains("cycle") || e.contains("children"), "{e}");
        // A sink with children.
        let e = bad(&GOOD.replace("role = \"relay\"", "role = \"sink\"\nsink = \"discard\""));
        assert!(e.contains("\"B\"") && e.contains("children"), "{e}");
        // A relay without children.
        let e = bad(&GOOD.replace(
            "role = \"sink\"\nparent = \"B\"",
            "role = \"sink\"\nparent = \"A\"",
        ));
        assert!(e.contains("\"B\"") && e.contains("needs children"), "{e}");
        // Duplicate names.
        let e = bad(&GOOD.replace("name = \"C\"", "name = \"B\""));
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn syntax_errors_give_a_line() {
        let e = bad("[transfer\nslots = 1\n");
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn generators() {
        let opts = GenOptions {
            source: "gen:1MiB".into(),
            ..GenOptions::default()
        };
        let c = generate_chain(3, &opts).unwrap();
        assert_eq!(c.nodes.len(), 4);
        assert_eq!(c.path_from_source("D"), ["A", "B", "C", "D"]);
        assert_eq!(c.nodes[3].addr, "127.0.30.4".parse::<IpAddr>().unwrap());
        let t = generate_tree(2, 2, &opts).unwrap();
        assert_eq!(t.nodes.len(), 7);
        assert_eq!(t.sinks().len(), 4);
        assert_eq!(t.children("A").len(), 2);
        assert!(generate_chain(0, &opts).is_err());
        assert!(generate_tree(3, 6, &opts).is_err());
    }

    #[test]
    fn dead_relays_are_spliced_out_to_the_nearest_live_ancestor() {
        let opts = GenOptions {
            source: "gen:1MiB".into(),
            ..GenOptions::default()
        };
        // A → B → C → D → E: C dies, then B.
        let c = generate_chain(4, &opts).unwrap();
        let names = |v: Vec<&Node>| v.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        let dead = vec!["C".to_string()];
        assert_eq!(c.live_parent("D", &dead).unwrap().name, "B");
        assert_eq!(names(c.live_children("B", &dead)), ["D"]);
        assert!(c.live_children("C", &dead).is_empty());
        let dead = vec!["C".to_string(), "B".to_string()];
        assert_eq!(c.live_parent("D", &dead).unwrap().name, "A");
        assert_eq!(names(c.live_children("A", &dead)), ["D"]);
        assert!(c.live_parent("A", &dead).is_none());
        assert!(c.healable("B") && !c.healable("A") && !c.healable("E"));
        // A tree of 7: B dies, its sinks move up to A beside C.
        let t = generate_tree(2, 2, &opts).unwrap();
        let under_b = names(t.children("B"));
        let dead = vec!["B".to_string()];
        let mut want = vec!["C".to_string()];
        want.extend(under_b);
        let mut got = names(t.live_children("A", &dead));
        got.sort();
        want.sort();
        assert_eq!(got, want);
        // Healing off, or a stdin source that cannot be read again: nothing is healable.
        let mut off = c.clone();
        off.transfer.heal = false;
        assert!(!off.healable("B"));
        assert!(off.to_toml().contains("heal = false"));
        let mut stdin = c.clone();
        stdin.nodes[0].source = Some("stdin".into());
        assert!(!stdin.healable("B"));
    }

    #[test]
    fn binomial_configurations() {
        let opts = GenOptions {
            source: "gen:1MiB".into(),
            ..GenOptions::default()
        };
        let b = generate_binomial(8, &opts).unwrap();
        assert_eq!(b.transfer.topology, Topology::Binomial);
        assert_eq!(b.sinks().len(), 8);
        assert_eq!(b.rank("C"), Some(2));
        assert!(b.to_toml().contains("topology = \"binomial\""));
        assert!(b.rejoinable_sinks().is_empty() && !b.healable("B"));
        let text = b.to_toml();
        let e = bad(&text.replacen("role = \"sink\"", "role = \"relay+sink\"", 1));
        assert!(e.contains("\"B\"") && e.contains("`role`"), "{e}");
        let e = bad(&text.replacen(
            "stages = [\"verify\"]",
            "stages = [\"verify\"]\nparent = \"A\"",
            1,
        ));
        assert!(e.contains("`parent`"), "{e}");
        let e = bad(&text.replacen("stages = [\"verify\"]", "stages = [\"compress\"]", 1));
        assert!(e.contains("`stages`") && e.contains("compress"), "{e}");
        let e = bad(&text.replace("topology = \"binomial\"", "topology = \"ring\""));
        assert!(e.contains("`topology`"), "{e}");
    }

    #[test]
    fn sizes_print_as_they_parse() {
        for n in [1u64, 1000, 4096, 256 << 10, 1 << 20, 3 << 30, (1 << 20) + 1] {
            assert_eq!(crate::source::parse_size(&format_size(n)).unwrap(), n);
        }
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(0), "0");
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("10MiB/s").unwrap(), 10 << 20);
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("fast").is_err());
    }
}
