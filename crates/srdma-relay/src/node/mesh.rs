//! The binomial pipeline's data path (`topology = "binomial"`, [`crate::schedule`]).
//!
//! Every node keeps the same ring of `slots` slots as in a tree, but chunks come from several
//! partners and out of order: chunk `seq` (from whichever partner the schedule names) is
//! written with WRITE_WITH_IMM (`imm = seq`) into slot `seq % slots` of the receiver, which
//! forwards it at once, from that slot, to the partners the schedule names for it. A node
//! *releases* its slots in sequence order, once a chunk's forwards completed: then the sink
//! checks and writes it (so sinks see the object in order, as in a tree), and the slot is
//! free again. Credits are the release count: a zero-byte SEND_WITH_IMM (`imm` = chunks
//! released, low 32 bits) to every partner, at least every quarter ring; a sender posts chunk
//! `seq` to a partner only while `seq < released + slots`. A node has one chunk on the wire at
//! a time (or 1 MiB of smaller ones), the oldest first and, of one chunk, to the partner with
//! the most ranks below it first: the schedule assumes a node's link carries one chunk per
//! step, and sharing it between several sends at once would delay them all. A node ends when
//! it released the end of the transfer and heard every partner release it too (so nobody
//! waits for a credit from a node that left). Healing and restarting a sink alone are not
//! available here: a node that fails ends the transfer with the exact report of a tree.
//!
//! The loop's steps: (1) completions, (2) the source frames chunks, (3) send, (4) release in
//! order, (5) credits, (6) done?, (7) failures, (8) idle (shared with the tree: `idle`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use srdma::cm::{self, ConnectOptions};
use srdma::{CompChannel, Cq, Device, Mr, RKey, RecvWr, SendOp, SendWr, SgeList, Wc, WcOpcode};

use crate::schedule::Binomial;

use super::connect::ack_timeout_for;
use super::fail::{Fail, R};
use super::idle::Idle;
use super::links::{Peer, Setup, watch};
use super::run::NodeRun;
use super::wire::{K_MESH_CREDIT, K_MESH_SEND, K_PEER_RECV, KIND_MASK, RingDesc, SEQ_MASK, imm_of};

/// A slot of the pipeline's ring.
#[derive(Debug, Clone, Copy)]
struct MSlot {
    seq: u64,
    have: bool,
    /// Partners it is queued for and not yet posted to.
    waiting: u32,
    /// Sends posted and not yet completed.
    pending: u32,
    len: usize,
    arrived: Instant,
    /// The rank it came from.
    from: usize,
}

/// The state of the pipeline's data loop.
struct Mesh<'m> {
    cq: &'m Cq,
    buf: &'m Mr,
    sched: Binomial,
    /// This node's rank.
    rank: usize,
    /// Slots of the ring.
    w: u64,
    ring: Vec<MSlot>,
    is_source: bool,
    next_fill: u64,
    /// Every chunk below this is released.
    next_release: u64,
    /// The release count last sent to the partners.
    announced: u64,
    eot: Option<u64>,
    /// Credits posted and not yet completed.
    credits_out: u64,
    last_activity: Instant,
    idle: Idle,
    /// Send credits at least this often (a quarter ring).
    announce_every: u64,
    /// The schedule repeats: this node's children per chunk, computed once.
    period: u64,
    kids_of: Vec<Vec<usize>>,
    /// Sends on the wire at most (one chunk, or 1 MiB of smaller ones), and now.
    max_inflight: usize,
    inflight: usize,
    /// `throttle`: a sink releases (the source frames) no faster than this.
    throttle_clock: Instant,
    progressed: bool,
}

impl Mesh<'_> {
    /// This node's children for chunk `seq` (same tree (`seq` mod d) and parity as `seq`).
    fn children(&self, seq: u64) -> &[usize] {
        &self.kids_of[(seq % self.period) as usize]
    }

    /// The release of chunk `seq` is done.
    fn finished(&self) -> bool {
        self.eot.is_some_and(|e| self.next_release > e)
    }
}

/// The 64-bit number whose low 32 bits are `imm`, at or above `base` (and less than 2^32
/// above it).
fn expand(imm: u32, base: u64) -> u64 {
    base + u64::from(imm.wrapping_sub(base as u32))
}

/// The throttle's clock after `len` more bytes (from `clock`, or now if later), if a rate is
/// set.
fn paced(throttle: Option<u64>, clock: Instant, len: usize) -> Option<Instant> {
    throttle
        .map(|rate| clock.max(Instant::now()) + Duration::from_secs_f64(len as f64 / rate as f64))
}

impl NodeRun<'_> {
    fn schedule(&self) -> R<(Binomial, usize)> {
        let me = self.name();
        let sched = Binomial::new(self.hop.cfg.nodes.len())
            .ok_or_else(|| Fail::at(me, "a binomial pipeline needs a source and a sink"))?;
        let rank = self
            .hop
            .cfg
            .rank(me)
            .ok_or_else(|| Fail::at(me, "no rank in the binomial pipeline"))?;
        Ok((sched, rank))
    }

    fn rank_name(&self, r: usize) -> String {
        self.hop
            .cfg
            .nodes
            .get(r)
            .map_or_else(|| format!("rank {r}"), |n| n.name.clone())
    }

    /// Posts the receives a partner's chunks and credits land in.
    fn post_peer_receives(&self, qp: &srdma::Qp, idx: usize) -> R<()> {
        for _ in 0..2 * self.hop.slots + 8 {
            qp.post_recv(RecvWr {
                wr_id: K_PEER_RECV | idx as u64,
                sges: SgeList::new(),
            })
            .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
        }
        Ok(())
    }

    /// A partner, connected.
    fn add_peer(&mut self, rank: usize, name: String, conn: cm::Connection, ring: RingDesc) {
        let conn = Arc::new(conn);
        let down = watch(Arc::clone(&conn), Arc::clone(&self.stats.live));
        self.peers.push(Peer {
            rank,
            name,
            conn,
            ring,
            released: self.start_seq,
            queue: BTreeSet::new(),
            down,
        });
    }

    /// Connects to every partner the schedule gives this node: to the higher ranks (which
    /// accept once they connected to theirs), then accepts the lower ranks. Each side's ring
    /// descriptor travels in the CM private data (REQ: ring and name; REP: ring).
    pub(super) fn mesh_connect(
        &mut self,
        setup: &Setup<'_>,
        dev: &Device,
        deadline: Instant,
    ) -> R<()> {
        let (sched, me) = self.schedule()?;
        // The source's staging ring takes no writes: it has no rkey to announce.
        let my_ring = self.ring_desc(setup).unwrap_or(RingDesc {
            addr: 0,
            rkey: 0,
            len: 0,
            slots: self.hop.slots as u32,
            slot_size: self.hop.slot_size as u32,
        });
        let partners = sched.partners(me);
        for &r in partners.iter().filter(|&&r| r > me) {
            let node = &self.hop.cfg.nodes[r];
            let mut private_data = my_ring.encode();
            private_data.extend(self.name().as_bytes());
            let conn = self.cm_connect(node, dev, setup, &private_data, deadline)?;
            let ring = self.check_ring(&node.name, conn.remote_private_data())?;
            self.post_peer_receives(conn.qp(), self.peers.len())?;
            self.add_peer(r, node.name.clone(), conn, ring);
        }
        let lower: Vec<usize> = partners.into_iter().filter(|&r| r < me).collect();
        if lower.is_empty() {
            return Ok(());
        }
        self.accept_lower(&lower, setup, &my_ring, deadline)
    }

    /// Accepts the partners of lower rank `lower`, by `deadline`.
    fn accept_lower(
        &mut self,
        lower: &[usize],
        setup: &Setup<'_>,
        my_ring: &RingDesc,
        deadline: Instant,
    ) -> R<()> {
        let l = setup
            .listener
            .ok_or_else(|| Fail::at(self.name(), "no CM listener"))?;
        let missing = |peers: &[Peer]| -> Vec<usize> {
            lower
                .iter()
                .copied()
                .filter(|r| !peers.iter().any(|p| p.rank == *r))
                .collect()
        };
        while !missing(&self.peers).is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<String> = missing(&self.peers)
                    .into_iter()
                    .map(|r| self.rank_name(r))
                    .collect();
                return Err(Fail::blame(
                    &missing[0],
                    format!(
                        "{} did not connect within {} ms",
                        missing.join(", "),
                        self.hop.timeout.as_millis()
                    ),
                ));
            }
            let Ok(req) = l.accept_request(Some(left.min(Duration::from_millis(200)))) else {
                continue;
            };
            let pdata = req.private_data().to_vec();
            let who = String::from_utf8_lossy(pdata.get(32..).unwrap_or_default()).into_owned();
            let Some(r) = lower
                .iter()
                .copied()
                .find(|&r| self.hop.cfg.nodes[r].name == who)
            else {
                let _ = req.reject(cm::reason::CONSUMER_DEFINED, b"not my partner");
                self.hop
                    .status(&format!("refused a connection from {who:?}: not a partner"));
                continue;
            };
            let ring = self.check_ring(&who, &pdata)?;
            let qp = setup
                .pd
                .create_qp(setup.init)
                .map_err(|e| Fail::at(self.name(), format!("creating a QP: {e}")))?;
            // A partner that gave up and asked again replaces its first attempt.
            if let Some(i) = self.peers.iter().position(|p| p.rank == r) {
                let old = self.peers.remove(i);
                let _ = old.conn.disconnect();
            }
            self.post_peer_receives(&qp, self.peers.len())?;
            let opts = ConnectOptions {
                private_data: my_ring.encode(),
                ack_timeout: ack_timeout_for(self.hop.timeout),
                ..ConnectOptions::default()
            };
            match req.accept_with(&qp, &opts) {
                Ok(c) => self.add_peer(r, who, c, ring),
                Err(e) => {
                    self.hop
                        .status(&format!("accepting {who} failed: {e}; waiting again"));
                }
            }
        }
        Ok(())
    }

    /// Chunk `seq` (`len` bytes, from rank `from`) is in its slot: queues it for the partners
    /// in `kids` and returns the slot's state.
    fn ready(&mut self, seq: u64, len: usize, from: usize, kids: &[usize]) -> MSlot {
        let arrived = Instant::now();
        self.stats.first_chunk.get_or_insert(arrived);
        let mut waiting = 0;
        for &k in kids {
            if let Some(p) = self.peers.iter_mut().find(|p| p.rank == k) {
                p.queue.insert(seq);
                waiting += 1;
            }
        }
        MSlot {
            seq,
            have: true,
            waiting,
            pending: 0,
            len,
            arrived,
            from,
        }
    }

    /// Runs the pipeline to the end of the transfer (see the module documentation).
    pub(super) fn mesh_loop(&mut self, cq: &Cq, chan: &CompChannel, buf: &Mr) -> R<()> {
        let (sched, rank) = self.schedule()?;
        let w = self.hop.slots as u64;
        let now = Instant::now();
        let free = MSlot {
            seq: 0,
            have: false,
            waiting: 0,
            pending: 0,
            len: 0,
            arrived: now,
            from: 0,
        };
        let period = sched.period();
        let kids_of: Vec<Vec<usize>> = (0..period).map(|k| sched.children(rank, k)).collect();
        let mut m = Mesh {
            cq,
            buf,
            sched,
            rank,
            w,
            ring: vec![free; self.hop.slots],
            is_source: self.source.is_some(),
            next_fill: self.start_seq,
            next_release: self.start_seq,
            announced: self.start_seq,
            eot: None,
            credits_out: 0,
            last_activity: now,
            idle: Idle::new(),
            announce_every: (w / 4).max(1),
            period,
            kids_of,
            max_inflight: ((1usize << 20) / self.hop.cfg.transfer.chunk_size).max(1),
            inflight: 0,
            throttle_clock: now,
            progressed: false,
        };
        loop {
            m.progressed = false;
            self.mesh_completions(&mut m)?;
            self.mesh_fill(&mut m)?;
            self.mesh_send(&mut m)?;
            self.mesh_release(&mut m)?;
            self.mesh_credits(&mut m)?;
            if self.mesh_done(&m) {
                return Ok(());
            }
            self.mesh_failures(&m)?;
            if m.progressed {
                m.idle.busy();
                continue;
            }
            let floor = Duration::from_millis(1);
            m.idle.wait(cq, chan, Some(m.throttle_clock), floor);
        }
    }

    /// Step 1: handles the completions.
    fn mesh_completions(&mut self, m: &mut Mesh<'_>) -> R<()> {
        let batch = m.idle.completions(m.cq);
        for wc in &batch {
            m.progressed = true;
            m.last_activity = Instant::now();
            if wc.status != srdma::WcStatus::Success {
                let peer = self
                    .peers
                    .iter()
                    .find(|p| p.conn.qp().qpn() == wc.qp_num)
                    .map_or_else(|| "?".to_string(), |p| p.name.clone());
                return Err(Fail::blame(
                    &peer,
                    format!(
                        "{:?} with {peer} failed: {} ({peer} unreachable or gone)",
                        wc.opcode, wc.status
                    ),
                ));
            }
            match wc.wr_id & KIND_MASK {
                K_PEER_RECV => self.on_peer_recv(m, wc)?,
                K_MESH_SEND => {
                    m.inflight = m.inflight.saturating_sub(1);
                    let seq = wc.wr_id & SEQ_MASK;
                    let s = (seq % m.w) as usize;
                    let sl = &mut m.ring[s];
                    if sl.have && sl.seq & SEQ_MASK == seq && sl.pending > 0 {
                        sl.pending -= 1;
                        self.stats.forwarded += u64::from(wc.byte_len);
                    }
                }
                K_MESH_CREDIT => m.credits_out = m.credits_out.saturating_sub(1),
                _ => {}
            }
        }
        m.idle.recycle(batch);
        Ok(())
    }

    /// A partner's chunk (into its slot, queued for this node's children) or credit came;
    /// the receive is posted again.
    fn on_peer_recv(&mut self, m: &mut Mesh<'_>, wc: &Wc) -> R<()> {
        let idx = (wc.wr_id & SEQ_MASK) as usize;
        let Some(peer) = self.peers.get(idx) else {
            return Ok(());
        };
        peer.conn
            .qp()
            .post_recv(RecvWr {
                wr_id: wc.wr_id,
                sges: SgeList::new(),
            })
            .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
        let imm = wc.imm_data.unwrap_or(0);
        if wc.opcode != WcOpcode::RecvRdmaWithImm {
            // A credit: the partner's release count.
            let p = &mut self.peers[idx];
            p.released = p.released.max(expand(imm, p.released));
            return Ok(());
        }
        let seq = expand(imm, m.next_release);
        let from_rank = self.peers[idx].rank;
        let who = self.peers[idx].name.clone();
        let s = (seq % m.w) as usize;
        if seq >= m.next_release + m.w || m.ring[s].have {
            return Err(Fail::blame(
                &who,
                format!(
                    "{who} sent chunk {seq} into a slot still in use (credit violation; chunks \
                     below {} are released)",
                    m.next_release
                ),
            ));
        }
        if m.sched.parent(m.rank, seq) != Some(from_rank) {
            return Err(Fail::blame(
                &who,
                format!("{who} sent chunk {seq}, which the schedule does not give it"),
            ));
        }
        let sl = self.ready(seq, wc.byte_len as usize, from_rank, m.children(seq));
        m.ring[s] = sl;
        Ok(())
    }

    /// Step 2: the source frames chunks into free slots.
    fn mesh_fill(&mut self, m: &mut Mesh<'_>) -> R<()> {
        let throttle = self.hop.me.throttle;
        while self.source.as_ref().is_some_and(|s| !s.done())
            && m.next_fill < m.next_release + m.w
            && m.throttle_clock <= Instant::now()
        {
            let seq = m.next_fill;
            let s = (seq % m.w) as usize;
            let Some(src) = self.source.as_mut() else {
                break;
            };
            let (hop, stages, stats) = (&self.hop, &mut self.stages, &mut self.stats);
            let (len, data, is_eot) = src.fill(hop, stages, stats, m.buf, seq, false)?;
            let sl = self.ready(seq, len, m.rank, m.children(seq));
            m.ring[s] = sl;
            if is_eot {
                m.eot = Some(seq);
            }
            if let Some(t) = paced(throttle, m.throttle_clock, len) {
                m.throttle_clock = t;
            }
            self.stats.note_chunk(data);
            m.next_fill += 1;
            m.progressed = true;
        }
        Ok(())
    }

    /// Step 3: sends, one chunk at a time: the oldest a partner has room for, and of one
    /// chunk, to the partner with the most ranks below it first.
    fn mesh_send(&mut self, m: &mut Mesh<'_>) -> R<()> {
        while m.inflight < m.max_inflight {
            let best = self
                .peers
                .iter()
                .enumerate()
                .filter_map(|(pi, p)| {
                    let &seq = p.queue.first()?;
                    let order = m.children(seq).iter().position(|&k| k == p.rank)?;
                    (seq < p.released + m.w).then_some((seq, order, pi))
                })
                .min();
            let Some((seq, _, pi)) = best else {
                break;
            };
            let peer = &mut self.peers[pi];
            let s = (seq % m.w) as usize;
            let wr = SendWr::new(
                K_MESH_SEND | ((pi as u64) << 40) | seq,
                SendOp::WriteWithImm {
                    remote_addr: peer.ring.addr + (s * peer.ring.slot_size as usize) as u64,
                    rkey: RKey(peer.ring.rkey),
                    imm: imm_of(seq),
                },
                SgeList::one(m.buf.sge(s * self.hop.slot_size, m.ring[s].len)),
            );
            peer.conn.qp().post_send(wr).map_err(|e| {
                Fail::blame(
                    &peer.name,
                    format!("posting chunk {seq} to {}: {e}", peer.name),
                )
            })?;
            m.ring[s].waiting -= 1;
            m.ring[s].pending += 1;
            peer.queue.pop_first();
            m.inflight += 1;
            m.progressed = true;
        }
        Ok(())
    }

    /// Step 4: releases in order: the sink checks and writes, the slot is free again.
    fn mesh_release(&mut self, m: &mut Mesh<'_>) -> R<()> {
        loop {
            let s = (m.next_release % m.w) as usize;
            let sl = m.ring[s];
            if !(sl.have && sl.seq == m.next_release && sl.waiting == 0 && sl.pending == 0) {
                break;
            }
            if !m.is_source && m.throttle_clock > Instant::now() {
                break;
            }
            if !m.is_source {
                if let Some(t) = paced(self.hop.me.throttle, m.throttle_clock, sl.len) {
                    m.throttle_clock = t;
                }
                self.chunk_from = self.hop.cfg.nodes.get(sl.from).map(|n| n.name.as_str());
                let (_, data, is_eot) = self.process(m.buf, s, sl.seq, sl.len)?;
                if is_eot {
                    m.eot = Some(sl.seq);
                }
                self.stats.note_chunk(data);
                self.stats.latencies.record(sl.arrived.elapsed());
            }
            m.ring[s].have = false;
            m.next_release += 1;
            self.stats.last_chunk = Some(Instant::now());
            m.progressed = true;
        }
        Ok(())
    }

    /// Step 5: credits: the release count to every partner, every quarter ring, when idle,
    /// and at the end.
    fn mesh_credits(&mut self, m: &mut Mesh<'_>) -> R<()> {
        if m.next_release <= m.announced {
            return Ok(());
        }
        let due = m.next_release - m.announced >= m.announce_every || !m.progressed || m.finished();
        if !due {
            return Ok(());
        }
        for (pi, peer) in self.peers.iter().enumerate() {
            let credit = SendWr::new(
                K_MESH_CREDIT | pi as u64,
                SendOp::SendWithImm {
                    imm: imm_of(m.next_release),
                },
                SgeList::new(),
            );
            peer.conn.qp().post_send(credit).map_err(|e| {
                Fail::blame(
                    &peer.name,
                    format!("returning a credit to {}: {e}", peer.name),
                )
            })?;
            m.credits_out += 1;
        }
        m.announced = m.next_release;
        m.progressed = true;
        Ok(())
    }

    /// Step 6: done once every partner released the end too.
    fn mesh_done(&self, m: &Mesh<'_>) -> bool {
        m.eot.is_some_and(|e| {
            m.finished()
                && m.announced > e
                && m.credits_out == 0
                && self.peers.iter().all(|p| p.released > e)
        })
    }

    /// Step 7: failures elsewhere, dead partners, a stall.
    fn mesh_failures(&self, m: &Mesh<'_>) -> R<()> {
        self.check_outside(true)?;
        if let Some(p) = self
            .peers
            .iter()
            .find(|p| p.down.load(std::sync::atomic::Ordering::Acquire))
        {
            return Err(Fail::blame(
                &p.name,
                format!("the connection to {} was lost", p.name),
            ));
        }
        if m.progressed
            || m.last_activity.elapsed() <= self.hop.timeout
            || m.throttle_clock > Instant::now()
        {
            return Ok(());
        }
        let (who, what) = self.mesh_stall_blame(m);
        Err(Fail::blame(
            &who,
            format!("{what}: hop {who} is dead or stuck"),
        ))
    }

    /// Whom a stall blames, and for what: a partner that returns no credit, the partner the
    /// next chunk should come from, a partner that did not finish, or this node.
    fn mesh_stall_blame(&self, m: &Mesh<'_>) -> (String, String) {
        let ms = self.hop.timeout.as_millis();
        if let Some(p) = self
            .peers
            .iter()
            .find(|p| p.queue.first().is_some_and(|&seq| seq >= p.released + m.w))
        {
            return (
                p.name.clone(),
                format!(
                    "{} returned no credit for {ms} ms (released {})",
                    p.name, p.released
                ),
            );
        }
        if let Some(r) = (!m.is_source && !m.finished())
            .then(|| m.sched.parent(m.rank, m.next_release))
            .flatten()
        {
            let n = self.rank_name(r);
            let what = format!("chunk {} did not come from {n} for {ms} ms", m.next_release);
            return (n, what);
        }
        if let Some(p) = self
            .peers
            .iter()
            .find(|p| m.eot.is_some_and(|e| p.released <= e))
        {
            return (
                p.name.clone(),
                format!("{} did not finish within {ms} ms", p.name),
            );
        }
        (self.name().to_string(), format!("no progress for {ms} ms"))
    }
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn immediates_expand_above_the_base() {
        assert_eq!(expand(5, 0), 5);
        assert_eq!(expand(5, 3), 5);
        assert_eq!(expand(1, (1 << 32) - 2), (1 << 32) + 1);
        assert_eq!(expand(7, 7 + (5 << 32)), 7 + (5 << 32));
    }
}
