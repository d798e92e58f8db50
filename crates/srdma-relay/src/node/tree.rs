//! The data loop of a chain or tree (`topology = "tree"`). Each turn takes its steps in
//! order: (1) completions — chunks that arrived (processed at once), credits from the
//! children, forwards completed; (2) at the source, frame the next chunk into a free staging
//! slot; (3) forward what is processed, as far as each child's credits go; (4) release slots
//! in order, returning each credit to the parent; (5) done?; (6) mend: failures elsewhere,
//! dead hops, heals (`mend`); (7) idle: spin, then sleep (`idle`). The ring's bookkeeping
//! is [`SlotRing`]'s.

use std::time::{Duration, Instant};

use srdma::{CompChannel, Cq, RKey, RecvWr, SendOp, SendWr, SgeList, Wc, WcOpcode, WcStatus};

use crate::config::Forward;

use super::fail::{Fail, R};
use super::heal::Decision;
use super::idle::Idle;
use super::links::{Child, Setup};
use super::ring::{SlotInUse, SlotRing};
use super::run::NodeRun;
use super::wire::{
    K_CREDIT_RECV, K_CREDIT_SEND, K_DATA_RECV, K_FORWARD, KIND_MASK, SEQ_MASK, imm_of,
};

/// Whether the loop goes on with this turn or starts the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// Go on with this turn's steps.
    On,
    /// Start the next turn at once (no idle step).
    Again,
}

/// The state of a tree's data loop.
pub(super) struct Tree<'t> {
    pub(super) cq: &'t Cq,
    pub(super) setup: Setup<'t>,
    pub(super) ring: SlotRing,
    /// The end of the transfer's chunk, once it came (or was framed).
    pub(super) eot: Option<u64>,
    /// Credits posted to the parent and not yet completed.
    pub(super) credits_out: u64,
    /// The throttle's clock: the budget is spent up to here.
    pub(super) throttle_clock: Instant,
    /// The last completion.
    pub(super) last_activity: Instant,
    /// Forward with SEND_WITH_IMM (else WRITE_WITH_IMM).
    fwd_send: bool,
    pub(super) idle: Idle,
    /// This turn made progress.
    pub(super) progressed: bool,
    /// The next deadline this turn found (a throttle's).
    pub(super) next_wake: Option<Instant>,
    pub(super) is_source: bool,
    pub(super) mendable: bool,
    /// A node that waits for the source to set the transfer up again when it loses a
    /// neighbour (not the source).
    pub(super) rewinds: bool,
}

impl NodeRun<'_> {
    /// Runs a chain or tree node to the end of the transfer.
    pub(super) fn tree_loop(&mut self, cq: &Cq, chan: &CompChannel, setup: &Setup<'_>) -> R<()> {
        let is_source = self.source.is_some();
        let mendable = self.healing.mendable();
        if let Some(server) = &self.server {
            self.healing.announce(server, self.hop.cfg);
        }
        let now = Instant::now();
        let mut t = Tree {
            cq,
            setup: *setup,
            ring: SlotRing::new(self.hop.slots, self.start_seq),
            eot: None,
            credits_out: 0,
            throttle_clock: now,
            last_activity: now,
            fwd_send: self.hop.cfg.transfer.forward == Forward::Send && !is_source,
            idle: Idle::new(),
            progressed: false,
            next_wake: None,
            is_source,
            mendable,
            rewinds: setup.listener.is_some() && mendable,
        };
        loop {
            t.progressed = false;
            t.next_wake = None;
            self.completions(&mut t)?;
            self.feed(&mut t)?;
            self.forward(&mut t)?;
            self.release(&mut t)?;
            if self.done(&t) {
                return Ok(());
            }
            if self.mend(&mut t)? == Turn::Again {
                continue;
            }
            if t.progressed {
                t.idle.busy();
                continue;
            }
            t.idle.wait(cq, chan, t.next_wake, Duration::ZERO);
        }
    }

    /// Step 1: handles the completions (some may be left from the check before sleeping).
    fn completions(&mut self, t: &mut Tree<'_>) -> R<()> {
        let batch = t.idle.completions(t.cq);
        for wc in &batch {
            t.progressed = true;
            t.last_activity = Instant::now();
            if self.healing.retired.contains(&wc.qp_num) {
                continue; // a connection a heal dropped
            }
            if wc.status != WcStatus::Success {
                self.on_failed_wc(t, wc)?;
                continue;
            }
            match wc.wr_id & KIND_MASK {
                K_DATA_RECV => self.on_chunk(t, wc)?,
                K_CREDIT_RECV => self.on_credit(wc)?,
                K_FORWARD => {
                    // A completion for a slot dropped by a rewind does not count.
                    let counted = t.ring.forwarded(wc.wr_id & SEQ_MASK);
                    self.stats.forwarded += u64::from(counted) * u64::from(wc.byte_len);
                }
                K_CREDIT_SEND => t.credits_out = t.credits_out.saturating_sub(1),
                _ => {}
            }
        }
        t.idle.recycle(batch);
        Ok(())
    }

    /// A work request failed: the healing policy decides (the source marks a child's link
    /// broken while it suspects).
    fn on_failed_wc(&mut self, t: &mut Tree<'_>, wc: &Wc) -> R<()> {
        let child = self
            .children
            .iter()
            .position(|c| c.conn.qp().qpn() == wc.qp_num);
        let on_parent = self
            .parent
            .as_ref()
            .is_some_and(|p| p.conn.qp().qpn() == wc.qp_num);
        let peer = self.peer_of(wc);
        let fail = Fail::blame(
            &peer,
            format!(
                "{:?} with {peer} failed: {} ({peer} unreachable or gone)",
                wc.opcode, wc.status
            ),
        );
        let why = format!("lost {peer} ({})", wc.status);
        let near = child.is_some() || on_parent;
        let d = self.healing.judge(t.is_source, near, fail, why);
        if let (Decision::Suspect(_), Some(c)) = (&d, child) {
            self.children[c].broken = true;
        }
        self.healing.hold(d)
    }

    /// A chunk arrived from the parent: it takes its slot and is processed at once.
    fn on_chunk(&mut self, t: &mut Tree<'_>, wc: &Wc) -> R<()> {
        let imm = wc
            .imm_data
            .ok_or_else(|| Fail::at(self.name(), "a chunk arrived without immediate data"))?;
        let seq = t.ring.next_in();
        if imm != imm_of(seq) {
            return Err(Fail::at(
                self.name(),
                format!(
                    "chunk {imm} arrived from {}, expected {seq}",
                    self.parent_name()
                ),
            ));
        }
        let s = t.ring.slot_of(seq);
        if wc.opcode == WcOpcode::Recv && (wc.wr_id & SEQ_MASK) as usize != s {
            return Err(Fail::at(
                self.name(),
                format!(
                    "chunk {seq} landed in slot {}, expected {s}",
                    wc.wr_id & SEQ_MASK
                ),
            ));
        }
        let arrived = Instant::now();
        t.ring.arrive(arrived).map_err(|SlotInUse| {
            let p = self.parent_name();
            Fail::blame(
                p,
                format!("{p} sent chunk {seq} into a slot still in use (credit violation)"),
            )
        })?;
        self.stats.first_chunk.get_or_insert(arrived);
        let (len, data, is_eot) = self.process(t.setup.buf, s, seq, wc.byte_len as usize)?;
        if is_eot {
            t.eot = Some(seq);
        }
        let mut ready_at = arrived;
        if let Some(rate) = self.hop.me.throttle {
            let cost = Duration::from_secs_f64(len as f64 / rate as f64);
            t.throttle_clock = t.throttle_clock.max(arrived) + cost;
            ready_at = t.throttle_clock;
        }
        t.ring.processed(seq, len, ready_at);
        if seq >= self.healing.dup_below {
            self.stats.note_chunk(data);
        }
        Ok(())
    }

    /// A child returned a credit (in order); its receive is posted again.
    fn on_credit(&mut self, wc: &Wc) -> R<()> {
        let me = self.name();
        let c = (wc.wr_id & SEQ_MASK) as usize;
        let Some(child) = self.children.get_mut(c) else {
            return Ok(());
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
            self.stats.latencies.record(t.elapsed());
        }
        child
            .conn
            .qp()
            .post_recv(RecvWr {
                wr_id: wc.wr_id,
                sges: SgeList::new(),
            })
            .map_err(|e| Fail::at(me, format!("posting a receive: {e}")))
    }

    /// Step 2: the source frames the next chunk into its staging slot when the slot is free
    /// (no faster than its throttle, if any).
    fn feed(&mut self, t: &mut Tree<'_>) -> R<()> {
        let Some(src) = self.source.as_mut() else {
            return Ok(());
        };
        let throttle = self.hop.me.throttle;
        let paced = throttle.is_some() && t.throttle_clock > Instant::now();
        if paced {
            t.next_wake = Some(t.throttle_clock);
        }
        if src.done() || paced || !t.ring.next_is_free() {
            return Ok(());
        }
        let seq = t.ring.next_in();
        let (hop, stages, stats) = (&self.hop, &mut self.stages, &mut self.stats);
        let (len, data, is_eot) = src.fill(hop, stages, stats, t.setup.buf, seq, false)?;
        if seq < src.resend_until {
            src.resent += data;
        }
        let now = Instant::now();
        self.stats.first_chunk.get_or_insert(now);
        if t.ring.arrive(now).is_ok() {
            t.ring.processed(seq, len, now);
        }
        if is_eot {
            t.eot = Some(seq);
        }
        self.stats.note_chunk(data);
        t.progressed = true;
        if let Some(rate) = throttle {
            let cost = Duration::from_secs_f64(len as f64 / rate as f64);
            t.throttle_clock = t.throttle_clock.max(now) + cost;
        }
        Ok(())
    }

    /// Step 3: forwards what is processed, as far as each child's credits go.
    fn forward(&mut self, t: &mut Tree<'_>) -> R<()> {
        let slots = self.hop.slots as u64;
        for (ci, child) in self.children.iter_mut().enumerate() {
            if child.broken {
                continue;
            }
            while child.next_post < t.ring.next_in() && child.next_post < child.credits + slots {
                let seq = child.next_post;
                let Some((s, len)) = t.ring.forwardable(seq) else {
                    break;
                };
                post_forward(child, ci, t, (s, seq, len), self.hop.slot_size)?;
                t.ring.posted(seq);
                child.posted_at.push_back(Instant::now());
                child.next_post += 1;
                t.progressed = true;
            }
        }
        Ok(())
    }

    /// Step 4: releases slots in order — processed, forwarded to every child, throttle
    /// satisfied. A relay or sink reposts the slot's receive and returns the credit.
    fn release(&mut self, t: &mut Tree<'_>) -> R<()> {
        let now = Instant::now();
        let (me, pname) = (self.name(), self.parent_name());
        let posted_to_all = self
            .children
            .iter()
            .map(|c| c.next_post)
            .min()
            .unwrap_or(u64::MAX);
        let (parent, leaf) = (self.parent.as_ref(), self.children.is_empty());
        let (buf, slot_size) = (t.setup.buf, self.hop.slot_size);
        let (latencies, credits_out) = (&mut self.stats.latencies, &mut t.credits_out);
        let done = t.ring.release_in_order(now, posted_to_all, |s, sl| {
            let Some(p) = parent else {
                return Ok(());
            };
            let qp = p.conn.qp();
            qp.post_recv(RecvWr {
                wr_id: K_DATA_RECV | s as u64,
                sges: SgeList::one(buf.sge(s * slot_size, slot_size)),
            })
            .map_err(|e| Fail::at(me, format!("reposting a receive: {e}")))?;
            let credit = SendWr::new(
                K_CREDIT_SEND | (sl.seq & SEQ_MASK),
                SendOp::SendWithImm {
                    imm: imm_of(sl.seq),
                },
                SgeList::new(),
            );
            qp.post_send(credit)
                .map_err(|e| Fail::blame(pname, format!("returning a credit to {pname}: {e}")))?;
            *credits_out += 1;
            if leaf {
                latencies.record(sl.arrived.elapsed());
            }
            Ok(())
        })?;
        if let Some(w) = done.wake {
            t.next_wake = Some(t.next_wake.map_or(w, |x| x.min(w)));
        }
        if done.count > 0 {
            self.stats.last_chunk = Some(now);
            t.progressed = true;
        }
        Ok(())
    }

    /// Step 5: the source is done when every child returned the end's credit; any other node
    /// when it released the end and its credits completed.
    fn done(&self, t: &Tree<'_>) -> bool {
        let Some(e) = t.eot else {
            return false;
        };
        if t.is_source {
            self.children.iter().all(|c| c.credits > e)
        } else {
            t.ring.next_release() > e && t.credits_out == 0
        }
    }
}

/// Posts chunk `seq` (slot `s`, `len` bytes) to child number `ci`.
fn post_forward(
    child: &Child,
    ci: usize,
    t: &Tree<'_>,
    (s, seq, len): (usize, u64, usize),
    slot_size: usize,
) -> R<()> {
    let op = if t.fwd_send {
        SendOp::SendWithImm { imm: imm_of(seq) }
    } else {
        SendOp::WriteWithImm {
            remote_addr: child.ring.addr + (s * child.ring.slot_size as usize) as u64,
            rkey: RKey(child.ring.rkey),
            imm: imm_of(seq),
        }
    };
    let wr = SendWr::new(
        K_FORWARD | ((ci as u64) << 40) | (seq & SEQ_MASK),
        op,
        SgeList::one(t.setup.buf.sge(s * slot_size, len)),
    );
    child.conn.qp().post_send(wr).map_err(|e| {
        Fail::blame(
            &child.name,
            format!("posting chunk {seq} to {}: {e}", child.name),
        )
    })
}
