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
//! step, and sharing it between several sends at once would delay them all. A node ends when it released the
//! end of the transfer and heard every partner release it too (so nobody waits for a credit
//! from a node that left). Healing and restarting a sink alone are not available here: a
//! node that fails ends the transfer with the exact report of a tree.

use super::*;
use crate::schedule::Binomial;

const K_PEER_RECV: u64 = 5 << 56;
const K_MESH_SEND: u64 = 6 << 56;
const K_MESH_CREDIT: u64 = 7 << 56;

/// A partner of the pipeline.
pub(super) struct Peer {
    rank: usize,
    name: String,
    pub(super) conn: Arc<Connection>,
    ring: Ring,
    /// The partner released every chunk below this (its credits).
    released: u64,
    /// Chunks to send it, oldest first.
    queue: std::collections::BTreeSet<u64>,
    down: Arc<AtomicBool>,
}

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

/// The 64-bit number whose low 32 bits are `imm`, at or above `base` (and less than 2^32
/// above it).
fn expand(imm: u32, base: u64) -> u64 {
    base + u64::from(imm.wrapping_sub(base as u32))
}

impl NodeRun<'_> {
    fn schedule(&self) -> R<(Binomial, usize)> {
        let me = &self.me.name;
        let sched = Binomial::new(self.cfg.nodes.len())
            .ok_or_else(|| Fail::at(me, "a binomial pipeline needs a source and a sink"))?;
        let rank = self
            .cfg
            .rank(me)
            .ok_or_else(|| Fail::at(me, "no rank in the binomial pipeline"))?;
        Ok((sched, rank))
    }

    fn rank_name(&self, r: usize) -> String {
        self.cfg
            .nodes
            .get(r)
            .map_or_else(|| format!("rank {r}"), |n| n.name.clone())
    }

    /// Posts the receives a partner's chunks and credits land in.
    fn post_peer_receives(&self, qp: &srdma::Qp, idx: usize) -> R<()> {
        for _ in 0..2 * self.slots + 8 {
            qp.post_recv(RecvWr {
                wr_id: K_PEER_RECV | idx as u64,
                sges: SgeList::new(),
            })
            .map_err(|e| Fail::at(self.name(), format!("posting a receive: {e}")))?;
        }
        Ok(())
    }

    /// Connects to every partner the schedule gives this node: to the higher ranks (which
    /// accept once they connected to theirs), then accepts the lower ranks. Each side's ring
    /// descriptor travels in the CM private data (REQ: ring and name; REP: ring).
    pub(super) fn mesh_connect(
        &mut self,
        listener: Option<&Listener>,
        dev: &Device,
        pd: &Pd,
        init: &QpInit,
        buf: &Mr,
        deadline: Instant,
    ) -> R<()> {
        let (sched, me) = self.schedule()?;
        let my_ring = buf.remote().map_or(
            Ring {
                addr: 0,
                rkey: 0,
                len: 0,
                slots: self.slots as u32,
                slot_size: self.slot_size as u32,
            },
            |d| Ring {
                addr: d.addr,
                rkey: d.rkey,
                len: d.len,
                slots: self.slots as u32,
                slot_size: self.slot_size as u32,
            },
        );
        let partners = sched.partners(me);
        for &r in partners.iter().filter(|&&r| r > me) {
            let node = &self.cfg.nodes[r];
            let mut private_data = my_ring.encode();
            private_data.extend(self.me.name.as_bytes());
            let conn = self.cm_connect(node, dev, pd, init, &private_data, deadline)?;
            let ring = self.check_ring(&node.name, conn.remote_private_data())?;
            self.post_peer_receives(conn.qp(), self.peers.len())?;
            let conn = Arc::new(conn);
            let down = watch(Arc::clone(&conn), Arc::clone(&self.live));
            self.peers.push(Peer {
                rank: r,
                name: node.name.clone(),
                conn,
                ring,
                released: self.start_seq,
                queue: std::collections::BTreeSet::new(),
                down,
            });
        }
        let lower: Vec<usize> = partners.into_iter().filter(|&r| r < me).collect();
        if lower.is_empty() {
            return Ok(());
        }
        let l = listener.ok_or_else(|| Fail::at(self.name(), "no CM listener"))?;
        while lower
            .iter()
            .any(|r| !self.peers.iter().any(|p| p.rank == *r))
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<String> = lower
                    .iter()
                    .filter(|r| !self.peers.iter().any(|p| p.rank == **r))
                    .map(|&r| self.rank_name(r))
                    .collect();
                return Err(Fail::blame(
                    &missing[0],
                    format!(
                        "{} did not connect within {} ms",
                        missing.join(", "),
                        self.timeout.as_millis()
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
                .find(|&r| self.cfg.nodes[r].name == who)
            else {
                let _ = req.reject(cm::reason::CONSUMER_DEFINED, b"not my partner");
                self.status(&format!("refused a connection from {who:?}: not a partner"));
                continue;
            };
            let ring = self.check_ring(&who, &pdata)?;
            let qp = pd
                .create_qp(init)
                .map_err(|e| Fail::at(self.name(), format!("creating a QP: {e}")))?;
            // A partner that gave up and asked again replaces its first attempt.
            if let Some(i) = self.peers.iter().position(|p| p.rank == r) {
                let old = self.peers.remove(i);
                let _ = old.conn.disconnect();
            }
            self.post_peer_receives(&qp, self.peers.len())?;
            let opts = ConnectOptions {
                private_data: my_ring.encode(),
                ack_timeout: ack_timeout_for(self.timeout),
                ..ConnectOptions::default()
            };
            let conn = match req.accept_with(&qp, &opts) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    self.status(&format!("accepting {who} failed: {e}; waiting again"));
                    continue;
                }
            };
            let down = watch(Arc::clone(&conn), Arc::clone(&self.live));
            self.peers.push(Peer {
                rank: r,
                name: who,
                conn,
                ring,
                released: self.start_seq,
                queue: std::collections::BTreeSet::new(),
                down,
            });
        }
        Ok(())
    }

    /// The ring descriptor a partner sent, checked against this node's configuration.
    fn check_ring(&self, who: &str, data: &[u8]) -> R<Ring> {
        let ring = Ring::decode(data).ok_or_else(|| {
            Fail::at(
                who,
                format!("{who} sent no ring descriptor (not a relay node?)"),
            )
        })?;
        let is_source = self.cfg.node(who).is_some_and(|n| n.role == Role::Source);
        if ring.slots as usize != self.slots
            || ring.slot_size as usize != self.slot_size
            || (!is_source && ring.len < ring.slots as u64 * u64::from(ring.slot_size))
        {
            return Err(Fail::at(
                who,
                format!(
                    "{who} announces {} slots of {} bytes, this node expects {} of {} (do all \
                     nodes use the same configuration?)",
                    ring.slots, ring.slot_size, self.slots, self.slot_size
                ),
            ));
        }
        Ok(ring)
    }

    /// Chunk `seq` (`len` bytes, from rank `from`) is in its slot: queues it for the partners
    /// in `kids` and returns the slot's state.
    fn ready(&mut self, seq: u64, len: usize, from: usize, kids: &[usize]) -> MSlot {
        let arrived = Instant::now();
        self.first_chunk.get_or_insert(arrived);
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
    #[allow(clippy::too_many_lines)]
    pub(super) fn mesh_loop(
        &mut self,
        cq: &Cq,
        chan: &CompChannel,
        buf: &Mr,
        mut source: Option<SourceState>,
    ) -> R<()> {
        let (sched, me) = self.schedule()?;
        let w = self.slots as u64;
        let slots = self.slots;
        let now = Instant::now();
        let mut ring = vec![
            MSlot {
                seq: 0,
                have: false,
                waiting: 0,
                pending: 0,
                len: 0,
                arrived: now,
                from: 0,
            };
            slots
        ];
        let is_source = source.is_some();
        let mut next_fill = self.start_seq;
        let mut next_release = self.start_seq;
        let mut announced = self.start_seq;
        let mut eot: Option<u64> = None;
        let mut credits_out = 0u64;
        let mut last_activity = Instant::now();
        let mut idle_since = Instant::now();
        let mut wcs: Vec<Wc> = Vec::with_capacity(64);
        let mut batch: Vec<Wc> = Vec::with_capacity(64);
        let announce_every = (w / 4).max(1);
        let spin = Duration::from_micros(
            std::env::var("SRDMA_RELAY_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2000),
        );
        // The schedule repeats: this node's children per chunk, computed once.
        let period = sched.period();
        let kids_of: Vec<Vec<usize>> = (0..period).map(|k| sched.children(me, k)).collect();
        let children = |seq: u64| {
            // Same tree (seq mod d) and parity as `seq`.
            &kids_of[(seq % period) as usize]
        };
        let max_inflight = ((1usize << 20) / self.cfg.transfer.chunk_size).max(1);
        let mut inflight = 0usize;
        // `throttle`: a sink releases (the source frames) no faster than this.
        let mut throttle_clock = Instant::now();
        let paced = |clock: Instant, len: usize| {
            self.me.throttle.map(|rate| {
                clock.max(Instant::now()) + Duration::from_secs_f64(len as f64 / rate as f64)
            })
        };
        loop {
            let mut progressed = false;
            // 1. Completions.
            if wcs.is_empty() {
                cq.poll_into(&mut wcs, 64);
            }
            std::mem::swap(&mut wcs, &mut batch);
            for wc in batch.drain(..) {
                progressed = true;
                last_activity = Instant::now();
                let idx = if wc.wr_id & KIND_MASK == K_MESH_SEND {
                    ((wc.wr_id >> 40) & 0xFFFF) as usize
                } else {
                    (wc.wr_id & SEQ_MASK) as usize
                };
                let peer_name = self
                    .peers
                    .iter()
                    .find(|p| p.conn.qp().qpn() == wc.qp_num)
                    .map_or_else(|| "?".to_string(), |p| p.name.clone());
                if wc.status != WcStatus::Success {
                    return Err(Fail::blame(
                        &peer_name,
                        format!(
                            "{:?} with {peer_name} failed: {} ({peer_name} unreachable or gone)",
                            wc.opcode, wc.status
                        ),
                    ));
                }
                match wc.wr_id & KIND_MASK {
                    K_PEER_RECV => {
                        let Some(peer) = self.peers.get(idx) else {
                            continue;
                        };
                        peer.conn
                            .qp()
                            .post_recv(RecvWr {
                                wr_id: wc.wr_id,
                                sges: SgeList::new(),
                            })
                            .map_err(|e| {
                                Fail::at(self.name(), format!("posting a receive: {e}"))
                            })?;
                        let imm = wc.imm_data.unwrap_or(0);
                        if wc.opcode != WcOpcode::RecvRdmaWithImm {
                            // A credit: the partner's release count.
                            let p = &mut self.peers[idx];
                            p.released = p.released.max(expand(imm, p.released));
                            continue;
                        }
                        let seq = expand(imm, next_release);
                        let from_rank = self.peers[idx].rank;
                        let who = self.peers[idx].name.clone();
                        let s = (seq % w) as usize;
                        if seq >= next_release + w || ring[s].have {
                            return Err(Fail::blame(
                                &who,
                                format!(
                                    "{who} sent chunk {seq} into a slot still in use (credit \
                                     violation; chunks below {next_release} are released)"
                                ),
                            ));
                        }
                        if sched.parent(me, seq) != Some(from_rank) {
                            return Err(Fail::blame(
                                &who,
                                format!(
                                    "{who} sent chunk {seq}, which the schedule does not give it"
                                ),
                            ));
                        }
                        ring[s] = self.ready(seq, wc.byte_len as usize, from_rank, children(seq));
                    }
                    K_MESH_SEND => {
                        inflight = inflight.saturating_sub(1);
                        let seq = wc.wr_id & ((1 << 40) - 1);
                        let s = (seq % w) as usize;
                        if ring[s].have && ring[s].seq & SEQ_MASK == seq && ring[s].pending > 0 {
                            ring[s].pending -= 1;
                            self.forwarded += u64::from(wc.byte_len);
                        }
                    }
                    K_MESH_CREDIT => credits_out = credits_out.saturating_sub(1),
                    _ => {}
                }
            }

            // 2. The source frames chunks into free slots.
            if let Some(src) = source.as_mut() {
                while !src.done && next_fill < next_release + w && throttle_clock <= Instant::now()
                {
                    let seq = next_fill;
                    let s = (seq % w) as usize;
                    let (len, data, is_eot) = self.fill(src, buf, s, seq, false)?;
                    ring[s] = self.ready(seq, len, me, children(seq));
                    if is_eot {
                        eot = Some(seq);
                        src.done = true;
                    }
                    if let Some(t) = paced(throttle_clock, len) {
                        throttle_clock = t;
                    }
                    self.note_chunk(data);
                    next_fill += 1;
                    progressed = true;
                }
            }

            // 3. Send, one chunk at a time: the oldest a partner has room for, and of one
            //    chunk, to the partner with the most ranks below it first.
            while inflight < max_inflight {
                let best = self
                    .peers
                    .iter()
                    .enumerate()
                    .filter_map(|(pi, p)| {
                        let &seq = p.queue.first()?;
                        let order = children(seq).iter().position(|&k| k == p.rank)?;
                        (seq < p.released + w).then_some((seq, order, pi))
                    })
                    .min();
                let Some((seq, _, pi)) = best else {
                    break;
                };
                let peer = &mut self.peers[pi];
                let s = (seq % w) as usize;
                let wr = SendWr::new(
                    K_MESH_SEND | ((pi as u64) << 40) | seq,
                    SendOp::WriteWithImm {
                        remote_addr: peer.ring.addr + (s * peer.ring.slot_size as usize) as u64,
                        rkey: RKey(peer.ring.rkey),
                        imm: imm_of(seq),
                    },
                    SgeList::one(buf.sge(s * self.slot_size, ring[s].len)),
                );
                peer.conn.qp().post_send(wr).map_err(|e| {
                    Fail::blame(
                        &peer.name,
                        format!("posting chunk {seq} to {}: {e}", peer.name),
                    )
                })?;
                ring[s].waiting -= 1;
                ring[s].pending += 1;
                peer.queue.pop_first();
                inflight += 1;
                progressed = true;
            }

            // 4. Release in order: the sink checks and writes, the slot is free again.
            loop {
                let s = (next_release % w) as usize;
                let sl = ring[s];
                if !(sl.have && sl.seq == next_release && sl.waiting == 0 && sl.pending == 0) {
                    break;
                }
                if !is_source && throttle_clock > Instant::now() {
                    break;
                }
                if !is_source {
                    if let Some(t) = paced(throttle_clock, sl.len) {
                        throttle_clock = t;
                    }
                    self.chunk_from = self.cfg.nodes.get(sl.from).map(|n| n.name.as_str());
                    let (_, data, is_eot) = self.process(buf, s, sl.seq, sl.len)?;
                    if is_eot {
                        eot = Some(sl.seq);
                    }
                    self.note_chunk(data);
                    self.latencies.record(sl.arrived.elapsed());
                }
                ring[s].have = false;
                next_release += 1;
                self.last_chunk = Some(Instant::now());
                progressed = true;
            }

            // 5. Credits: the release count, every quarter ring, when idle, and at the end.
            let finished = eot.is_some_and(|e| next_release > e);
            if next_release > announced
                && (next_release - announced >= announce_every || !progressed || finished)
            {
                for (pi, peer) in self.peers.iter().enumerate() {
                    let credit = SendWr::new(
                        K_MESH_CREDIT | pi as u64,
                        SendOp::SendWithImm {
                            imm: imm_of(next_release),
                        },
                        SgeList::new(),
                    );
                    peer.conn.qp().post_send(credit).map_err(|e| {
                        Fail::blame(
                            &peer.name,
                            format!("returning a credit to {}: {e}", peer.name),
                        )
                    })?;
                    credits_out += 1;
                }
                announced = next_release;
                progressed = true;
            }

            // 6. Done once every partner released the end too.
            if let Some(e) = eot {
                if finished
                    && announced > e
                    && credits_out == 0
                    && self.peers.iter().all(|p| p.released > e)
                {
                    return Ok(());
                }
            }

            // 7. Failures elsewhere, dead partners.
            self.check_outside(true)?;
            if let Some(p) = self.peers.iter().find(|p| p.down.load(Ordering::Acquire)) {
                return Err(Fail::blame(
                    &p.name,
                    format!("the connection to {} was lost", p.name),
                ));
            }
            if !progressed
                && last_activity.elapsed() > self.timeout
                && throttle_clock <= Instant::now()
            {
                let ms = self.timeout.as_millis();
                let blamed = if let Some(p) = self
                    .peers
                    .iter()
                    .find(|p| p.queue.first().is_some_and(|&seq| seq >= p.released + w))
                {
                    (
                        p.name.clone(),
                        format!(
                            "{} returned no credit for {ms} ms (released {})",
                            p.name, p.released
                        ),
                    )
                } else if let Some(r) = (!is_source && !finished)
                    .then(|| sched.parent(me, next_release))
                    .flatten()
                {
                    let n = self.rank_name(r);
                    (
                        n.clone(),
                        format!("chunk {next_release} did not come from {n} for {ms} ms"),
                    )
                } else if let Some(p) = self
                    .peers
                    .iter()
                    .find(|p| eot.is_some_and(|e| p.released <= e))
                {
                    (
                        p.name.clone(),
                        format!("{} did not finish within {ms} ms", p.name),
                    )
                } else {
                    (self.me.name.clone(), format!("no progress for {ms} ms"))
                };
                return Err(Fail::blame(
                    &blamed.0,
                    format!("{}: hop {} is dead or stuck", blamed.1, blamed.0),
                ));
            }
            if progressed {
                idle_since = Instant::now();
                continue;
            }
            // 8. Nothing to do: spin a while, then arm the CQ and sleep (as in a tree).
            if idle_since.elapsed() < spin {
                thread::yield_now();
                continue;
            }
            cq.req_notify(false);
            if cq.poll_into(&mut wcs, 64) > 0 {
                continue;
            }
            let wait = Duration::from_millis(20)
                .min(throttle_clock.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(1));
            let _ = chan.get_event(Some(wait));
        }
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
