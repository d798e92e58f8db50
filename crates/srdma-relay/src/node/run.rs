//! The run of one node: [`NodeRun`] holds what every role shares (the device, the control
//! channel, the connections, the stages, the counters) and the role parts — the source's
//! side ([`SourceSide`]), the sink's side ([`SinkSide`]), and the healing state
//! ([`Healing`]) — and sets the node up: stages, device, control channel, completion queue,
//! ring; then it runs the tree's or the binomial pipeline's data loop.

use std::sync::Arc;
use std::time::Instant;

use srdma::cm::Listener;
use srdma::{AccessFlags, CompChannel, Cq, Device, DeviceConfig, Mr, Mtu, Pd, QpInit, QpType, Wc};

use crate::config::{Config, Node, Role, Topology};
use crate::control;
use crate::stage::{self, Stage};

use super::fail::{self, Fail, R};
use super::heal::Healing;
use super::hop::{Hop, NodeOptions};
use super::links::{Child, Parent, Peer, Setup};
use super::progress::Stats;
use super::sink_side::SinkSide;
use super::source_side::SourceSide;

/// One node's run.
pub(super) struct NodeRun<'a> {
    pub(super) hop: Hop<'a>,
    pub(super) stats: Stats,
    pub(super) stages: Vec<Box<dyn Stage>>,
    pub(super) dev: Option<Device>,
    /// The source: the control channel's server.
    pub(super) server: Option<control::Server>,
    /// Every other node: its control connection to the source.
    pub(super) client: Option<Arc<control::Client>>,
    pub(super) parent: Option<Parent>,
    pub(super) children: Vec<Child>,
    /// The binomial pipeline's partners.
    pub(super) peers: Vec<Peer>,
    /// The source's side (the source only).
    pub(super) source: Option<SourceSide>,
    /// The sink's side (a sink, once its sink is open).
    pub(super) sink: Option<SinkSide>,
    pub(super) healing: Healing,
    /// The chunk this run starts at (0 unless a sink resumes; a heal moves it).
    pub(super) start_seq: u64,
    /// Why a resume state was discarded.
    pub(super) resume_note: Option<String>,
    /// The binomial pipeline: who sent the chunk being processed (for messages).
    pub(super) chunk_from: Option<&'a str>,
}

/// The device MTU for a configured MTU in bytes (1024 for anything else).
fn mtu_of(v: u32) -> Mtu {
    match v {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

impl<'a> NodeRun<'a> {
    /// Node `me` of `cfg`, not started.
    pub(super) fn new(cfg: &'a Config, me: &'a Node, opts: &NodeOptions) -> NodeRun<'a> {
        NodeRun {
            hop: Hop::new(cfg, me, opts),
            stats: Stats::new(),
            stages: Vec::new(),
            dev: None,
            server: None,
            client: None,
            parent: None,
            children: Vec::new(),
            peers: Vec::new(),
            source: (me.role == Role::Source).then(SourceSide::default),
            sink: None,
            healing: Healing::new(cfg),
            start_seq: 0,
            resume_note: None,
            chunk_from: None,
        }
    }

    /// The node's name.
    pub(super) fn name(&self) -> &'a str {
        self.hop.name()
    }

    /// The parent: the nearest ancestor not spliced out (in the binomial pipeline: the
    /// partner the chunk being processed came from).
    pub(super) fn parent_name(&self) -> &'a str {
        if let Some(from) = self.chunk_from {
            return from;
        }
        self.hop
            .cfg
            .live_parent(self.name(), &self.healing.dead)
            .map_or("?", |n| n.name.as_str())
    }

    /// A `halt` newer than the last one answered came.
    pub(super) fn halted(&self) -> bool {
        self.healing.halted(self.client.as_deref())
    }

    /// Sets the node up and runs its data loop to the end of the transfer.
    pub(super) fn run(&mut self) -> R<()> {
        let me = self.hop.me;
        for s in &me.stages {
            let st =
                stage::build(s).map_err(|e| Fail::at(&me.name, format!("stage {s:?}: {e}")))?;
            self.stages.push(st);
        }
        let dev = self.open_device()?;
        self.dev = Some(dev.clone());
        let pd = dev.alloc_pd();
        let deadline = Instant::now() + self.hop.timeout;
        let listener = self.open_control(&dev, &pd, deadline)?;
        self.stats.start_progress(&self.hop, self.client.clone());
        let chan = CompChannel::new()
            .map_err(|e| Fail::at(&me.name, format!("completion channel: {e}")))?;
        let binomial = self.hop.cfg.transfer.topology == Topology::Binomial;
        let (cq, init) = self.make_queues(&dev, &chan, binomial)?;
        let buf = self.register_ring(&pd)?;
        // Where this run starts (a sink may resume), before any ring is set up.
        let resumed = self.negotiate_start(deadline)?;
        let setup = Setup {
            pd: &pd,
            init: &init,
            listener: listener.as_ref(),
            buf: &buf,
        };
        if binomial {
            self.mesh_connect(&setup, &dev, deadline)?;
        } else {
            self.connect_tree(&setup, &dev, deadline)?;
        }
        if me.role.has_sink() {
            let mut sk = SinkSide::open(&self.hop, resumed.later)?;
            if let Some(st) = resumed.now {
                sk.continue_object(&self.hop, st, self.start_seq, &self.stats)?;
            }
            self.sink = Some(sk);
        }
        if let Some(src) = self.source.as_mut() {
            let (hop, stages, stats) = (&self.hop, &mut self.stages, &mut self.stats);
            src.open(hop, stages, stats, &buf, self.start_seq)?;
        }
        self.hop.status(&format!(
            "connected ({} slots of {} bytes per ring)",
            self.hop.slots, self.hop.slot_size
        ));
        if binomial {
            return self.mesh_loop(&cq, &chan, &buf);
        }
        self.tree_loop(&cq, &chan, &setup)
    }

    /// Opens the RDMA device on the node's address and UDP port.
    fn open_device(&self) -> R<Device> {
        let me = self.hop.me;
        let mut dc = DeviceConfig::new(me.addr);
        dc.port = me.udp_port;
        dc.mtu = mtu_of(
            self.hop
                .cfg
                .transfer
                .mtu
                .unwrap_or(if me.addr.is_loopback() { 4096 } else { 1024 }),
        );
        Device::open(dc).map_err(|e| {
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
        })
    }

    /// The control channel: the source listens on its control port; every other node
    /// listens for its parent's CM connection (returned) and connects to the source.
    fn open_control(&mut self, dev: &Device, pd: &Pd, deadline: Instant) -> R<Option<Listener>> {
        let (cfg, me) = (self.hop.cfg, self.hop.me);
        let addr = cfg.control_addr();
        if me.role == Role::Source {
            let expected: Vec<String> = cfg
                .nodes
                .iter()
                .filter(|n| n.role != Role::Source)
                .map(|n| n.name.clone())
                .collect();
            let server = control::Server::bind(addr, &expected).map_err(|e| {
                Fail::at(
                    &me.name,
                    format!("cannot listen on the control port TCP {addr}: {e} (port busy?)"),
                )
            })?;
            self.server = Some(server);
            return Ok(None);
        }
        let l = Listener::bind(dev, pd, me.cm_addr()).map_err(|e| {
            Fail::at(
                &me.name,
                format!(
                    "cannot listen for connections on TCP {}: {e} (port busy?)",
                    me.cm_addr()
                ),
            )
        })?;
        let src = cfg.source();
        let client = control::Client::connect(addr, &me.name, deadline).map_err(|e| {
            Fail::blame(
                &src.name,
                format!(
                    "cannot reach the source {} at its control port TCP {addr} within {} ms: {e}",
                    src.name, cfg.transfer.timeout_ms
                ),
            )
        })?;
        self.client = Some(Arc::new(client));
        Ok(Some(l))
    }

    /// The completion queue (one for every connection, tied to `chan`) and the QP template.
    fn make_queues(&self, dev: &Device, chan: &CompChannel, binomial: bool) -> R<(Cq, QpInit)> {
        let (cfg, name, slots) = (self.hop.cfg, self.name(), self.hop.slots);
        let nkids = if binomial {
            crate::schedule::Binomial::new(cfg.nodes.len())
                .zip(cfg.rank(name))
                .map_or(0, |(b, r)| b.partners(r).len())
        } else {
            cfg.children(name).len()
        };
        let cq_len = (3 * slots * (nkids + 1) + 64).min(32_000);
        let cq = dev
            .create_cq(cq_len, Some(chan))
            .map_err(|e| Fail::at(name, format!("creating a CQ: {e}")))?;
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        let depth = (2 * slots as u32 + 16).max(128);
        init.caps.max_send_wr = depth;
        init.caps.max_recv_wr = depth;
        Ok((cq, init))
    }

    /// The ring: `slots` slots in one memory region (peers write into it, but the source's).
    fn register_ring(&self, pd: &Pd) -> R<Mr> {
        let access = if self.hop.me.role == Role::Source {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
        };
        pd.reg_mr(self.hop.slots * self.hop.slot_size, access)
            .map_err(|e| Fail::at(self.name(), format!("registering the ring: {e}")))
    }

    /// Who is at the other end of the connection a completion came on.
    pub(super) fn peer_of(&self, wc: &Wc) -> String {
        if let Some(p) = &self.parent {
            if p.conn.qp().qpn() == wc.qp_num {
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

    /// Checks what the rest of the transfer says: aborts, lost peers. `ignore_parent`: the
    /// parent's connection may close (this node is done with it, or the data loop waits to be
    /// set up again when it does).
    pub(super) fn check_outside(&self, ignore_parent: bool) -> R<()> {
        if let Some(s) = &self.server {
            fail::reported(s)?;
        }
        if let Some(c) = &self.client {
            fail::source_said(&c.heard(), &self.hop.cfg.source().name)?;
        }
        if let Some(p) = &self.parent {
            if !ignore_parent && p.is_down() {
                let p = self.parent_name();
                return Err(Fail::blame(
                    p,
                    format!("the connection from parent {p} was lost"),
                ));
            }
        }
        Ok(())
    }
}
