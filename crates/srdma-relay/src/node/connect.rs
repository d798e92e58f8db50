//! Setting up a node's connections: agreeing with the source where the run starts (a sink
//! may resume), accepting the parent's connection (a receive posted per ring slot, the ring
//! descriptor in the REP), connecting to each child (its ring checked, a receive posted per
//! slot for its credits), and connecting the tree again after a heal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use srdma::cm::{self, CmError, ConnectOptions, Connection};
use srdma::{Device, RecvWr, SgeList};

use crate::config::Node;
use crate::control::{self, Msg};
use crate::resume::{self, PartialState};

use super::fail::{Fail, R};
use super::links::{Child, Parent, Setup, watch};
use super::run::NodeRun;
use super::wire::{K_CREDIT_RECV, K_DATA_RECV, RingDesc};

/// What a resumable sink continues from, as [`NodeRun::negotiate_start`] agreed.
#[derive(Default)]
pub(super) struct Resumed {
    /// The state of the object it continues now.
    pub(super) now: Option<PartialState>,
    /// A valid state to use when the object starts again (another sink needed chunk 0).
    pub(super) later: Option<PartialState>,
}

/// The RC ACK timeout exponent for a transfer whose dead-hop limit is `limit`: the largest
/// (at most 18, about 1 s) whose seven retries still give up within half the limit. A
/// busy 2-core host can stall a live peer for longer than ibv_rc_pingpong's 67 ms
/// (exponent 14) now and then; retries must not declare it dead for that, while a dead peer
/// is found by the control connection at once and by the transport within the limit.
pub(super) fn ack_timeout_for(limit: Duration) -> u8 {
    let budget = limit.as_secs_f64() / 2.0 / 8.0;
    (14..=18)
        .rev()
        .find(|t| 4.096e-6 * f64::from(1u32 << t) <= budget)
        .unwrap_or(14)
}

impl NodeRun<'_> {
    /// Prints (always: it is a warning, not progress) and remembers a note about resuming.
    fn note(&mut self, msg: String) {
        eprintln!("{}: {msg}", self.name());
        self.resume_note = Some(msg);
    }

    /// When a sink of the configuration resumes: agrees on the chunk this run starts at
    /// (`self.start_seq`). The source waits for every sink's first missing chunk and starts
    /// at the smallest; every other node waits to hear it. A resumable sink loads and checks
    /// its state first (discarding a damaged or foreign one, with a message) and returns the
    /// state it continues from.
    pub(super) fn negotiate_start(&mut self, deadline: Instant) -> R<Resumed> {
        let cfg = self.hop.cfg;
        if !cfg.resumable() {
            return Ok(Resumed::default());
        }
        if let Some(server) = &self.server {
            let sinks: Vec<String> = cfg.sinks().iter().map(|n| n.name.clone()).collect();
            let heard = server.wait_resume(&sinks, deadline);
            let from = sinks
                .iter()
                .map(|n| heard.get(n).copied().unwrap_or(0))
                .min()
                .unwrap_or(0);
            server.set_start(from);
            self.start_seq = from;
            if from > 0 {
                self.hop
                    .status(&format!("resuming the transfer at chunk {from}"));
            }
            return Ok(Resumed::default());
        }
        let held = self.load_resume_state();
        let Some(client) = self.client.clone() else {
            return Ok(Resumed::default());
        };
        self.hear_start(&client, held, deadline)
    }

    /// A resumable sink's saved state, if it is valid (a damaged or foreign one is discarded,
    /// with a note).
    fn load_resume_state(&mut self) -> Option<PartialState> {
        let (cfg, me) = (self.hop.cfg, self.hop.me);
        let out = me
            .sink
            .as_deref()
            .and_then(|s| s.strip_prefix("file:"))
            .filter(|_| me.resume)
            .map(PathBuf::from)?;
        let fp = resume::fingerprint(cfg, me);
        match resume::check(&out, fp, cfg.transfer.chunk_size as u64) {
            Ok(st) => st,
            Err(why) => {
                resume::discard(&out);
                self.note(format!(
                    "discarded the resume state {}: {why}; receiving the object from chunk 0",
                    resume::state_path(&out).display()
                ));
                None
            }
        }
    }

    /// A node: tells the source where its sink resumes (`held`: its valid state) and waits
    /// for where the run starts.
    fn hear_start(
        &mut self,
        client: &control::Client,
        held: Option<PartialState>,
        deadline: Instant,
    ) -> R<Resumed> {
        let me = self.hop.me;
        let point = held.as_ref().map_or(0, PartialState::first_missing);
        if me.role.has_sink() {
            client.send(&Msg::Resume {
                node: me.name.clone(),
                from: point,
                note: self.resume_note.clone(),
            });
        }
        let h = client.wait_start(deadline);
        let src = self.hop.cfg.source().name.clone();
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
                        self.hop.timeout.as_millis()
                    )
                },
            ));
        };
        self.start_seq = from;
        // A restarted sink joins a tree the heals so far have changed.
        self.healing.dead = h.start_dead.clone();
        self.healing.epoch = h.start_epoch;
        self.held_from(held, point, from)
    }

    /// What a sink holding `held` (its first missing chunk `point`) continues from when the
    /// run starts at chunk `from`.
    fn held_from(&self, held: Option<PartialState>, point: u64, from: u64) -> R<Resumed> {
        let me = self.hop.me;
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
                self.hop.status(&format!(
                    "holding chunks 0..{point}; the transfer restarts from chunk 0 for another sink"
                ));
                return Ok(Resumed {
                    now: None,
                    later: Some(st),
                });
            }
            self.hop
                .status(&format!("resuming at chunk {from} (holding 0..{point})"));
            return Ok(Resumed {
                now: Some(st),
                later: None,
            });
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
        Ok(Resumed::default())
    }

    /// Accepts the parent's connection (not at the source), then connects to every child
    /// not spliced out, each by `deadline`.
    pub(super) fn connect_tree(
        &mut self,
        setup: &Setup<'_>,
        dev: &Device,
        deadline: Instant,
    ) -> R<()> {
        if setup.listener.is_some() {
            self.accept_parent(setup, deadline)?;
        }
        self.connect_children(setup, dev, deadline)
    }

    /// Connects to every child not spliced out, by `deadline`.
    pub(super) fn connect_children(
        &mut self,
        setup: &Setup<'_>,
        dev: &Device,
        deadline: Instant,
    ) -> R<()> {
        let cfg = self.hop.cfg;
        for child in cfg.live_children(self.name(), &self.healing.dead) {
            self.connect_child(child, dev, setup, deadline)?;
        }
        Ok(())
    }

    /// Waits for the parent's connection (posting a receive per ring slot first) and
    /// answers with the ring's descriptor.
    pub(super) fn accept_parent(&mut self, setup: &Setup<'_>, deadline: Instant) -> R<()> {
        let parent = self.parent_name().to_string();
        let l = setup
            .listener
            .ok_or_else(|| Fail::at(self.name(), "no CM listener"))?;
        let ring_desc = self.ring_desc(setup)?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Fail::blame(
                    &parent,
                    format!(
                        "parent {parent} did not connect within {} ms",
                        self.hop.timeout.as_millis()
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
                self.hop
                    .status(&format!("refused a connection from {who:?}: not my parent"));
                continue;
            }
            let qp = setup
                .pd
                .create_qp(setup.init)
                .map_err(|e| Fail::at(self.name(), format!("creating a QP: {e}")))?;
            self.post_ring_receives(&qp, setup)?;
            let opts = ConnectOptions {
                private_data: ring_desc.encode(),
                ack_timeout: ack_timeout_for(self.hop.timeout),
                ..ConnectOptions::default()
            };
            let conn = match req.accept_with(&qp, &opts) {
                Ok(c) => c,
                Err(e) => {
                    self.hop
                        .status(&format!("accepting {parent} failed: {e}; waiting again"));
                    continue;
                }
            };
            let conn = Arc::new(conn);
            let down = watch(Arc::clone(&conn), Arc::clone(&self.stats.live));
            self.parent = Some(Parent { conn, down });
            return Ok(());
        }
    }

    /// This node's ring, as its private data announces it.
    pub(super) fn ring_desc(&self, setup: &Setup<'_>) -> R<RingDesc> {
        let desc = setup
            .buf
            .remote()
            .ok_or_else(|| Fail::at(self.name(), "the ring has no rkey"))?;
        Ok(RingDesc {
            addr: desc.addr,
            rkey: desc.rkey,
            len: desc.len,
            slots: self.hop.slots as u32,
            slot_size: self.hop.slot_size as u32,
        })
    }

    /// Posts a receive per ring slot on `qp`, in the order chunks will come: chunk
    /// `start_seq` lands in the first.
    fn post_ring_receives(&self, qp: &srdma::Qp, setup: &Setup<'_>) -> R<()> {
        let (slots, slot_size) = (self.hop.slots, self.hop.slot_size);
        let first = (self.start_seq % slots as u64) as usize;
        for i in 0..slots {
            let s = (first + i) % slots;
            qp.post_recv(RecvWr {
                wr_id: K_DATA_RECV | s as u64,
                sges: SgeList::one(setup.buf.sge(s * slot_size, slot_size)),
            })
            .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
        }
        Ok(())
    }

    /// Connects to a child (retrying until `deadline`: it may start later), reads its ring
    /// descriptor, posts a receive per slot for its credits.
    fn connect_child(
        &mut self,
        child: &Node,
        dev: &Device,
        setup: &Setup<'_>,
        deadline: Instant,
    ) -> R<()> {
        let name = self.name().as_bytes();
        let conn = self.cm_connect(child, dev, setup, name, deadline)?;
        let ring = self.check_ring(&child.name, conn.remote_private_data())?;
        let idx = self.children.len() as u64;
        for _ in 0..self.hop.slots {
            conn.qp()
                .post_recv(RecvWr {
                    wr_id: K_CREDIT_RECV | idx,
                    sges: SgeList::new(),
                })
                .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
        }
        let conn = Arc::new(conn);
        let down = watch(Arc::clone(&conn), Arc::clone(&self.stats.live));
        self.children.push(Child {
            name: child.name.clone(),
            conn,
            ring,
            credits: self.start_seq,
            next_post: self.start_seq,
            posted_at: Default::default(),
            down,
            broken: false,
        });
        Ok(())
    }

    /// The ring descriptor a peer sent, checked against this node's configuration (the
    /// source's staging ring, which nobody writes into, may be empty).
    pub(super) fn check_ring(&self, who: &str, data: &[u8]) -> R<RingDesc> {
        let ring = RingDesc::decode(data).ok_or_else(|| {
            Fail::at(
                who,
                format!("{who} sent no ring descriptor (not a relay node?)"),
            )
        })?;
        let (slots, slot_size) = (self.hop.slots, self.hop.slot_size);
        let is_source = self
            .hop
            .cfg
            .node(who)
            .is_some_and(|n| n.role == crate::config::Role::Source);
        if ring.slots as usize != slots
            || ring.slot_size as usize != slot_size
            || (!is_source && ring.len < ring.slots as u64 * u64::from(ring.slot_size))
        {
            return Err(Fail::at(
                who,
                format!(
                    "{who} announces {} slots of {} bytes, this node expects {} of {} (do all \
                     nodes use the same configuration?)",
                    ring.slots, ring.slot_size, slots, slot_size
                ),
            ));
        }
        Ok(ring)
    }

    /// Connects to `node`'s CM listener with `private_data`, retrying until `deadline` (it may
    /// start later); a rejection ends it at once.
    pub(super) fn cm_connect(
        &self,
        node: &Node,
        dev: &Device,
        setup: &Setup<'_>,
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
                        self.hop.timeout.as_millis()
                    ),
                ));
            }
            let opts = ConnectOptions {
                private_data: private_data.to_vec(),
                timeout: left.min(Duration::from_secs(2)),
                ack_timeout: ack_timeout_for(self.hop.timeout),
                ..ConnectOptions::default()
            };
            match cm::connect(dev, setup.pd, addr, setup.init, &opts) {
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
}
