//! Step 6 of the tree's data loop: mending. It asks the healing policy ([`Healing`]) what to
//! do about lost neighbours, halts, dead hops and stalls, and applies its decisions: it drops
//! and sets up the connections again, rewinds the ring, and at the source reopens the source
//! — or ends the transfer with the failure.
//!
//! [`Healing`]: super::heal::Healing

use std::time::Instant;

use srdma::Device;

use super::fail::{Fail, R};
use super::heal::Decision;
use super::links::Setup;
use super::run::NodeRun;
use super::tree::{Tree, Turn};

impl NodeRun<'_> {
    /// Step 6: failures elsewhere, dead hops. A sink that may come back is waited for; with
    /// healing, the source splices out relays that died or froze, and the other nodes wait
    /// for it to set the transfer up again. [`Turn::Again`]: the transfer was set up again
    /// (or must be), start the next turn.
    pub(super) fn mend(&mut self, t: &mut Tree<'_>) -> R<Turn> {
        if t.rewinds {
            let down_child = self
                .children
                .iter()
                .find(|c| c.is_down())
                .map(|c| c.name.clone());
            let down_parent = self
                .parent
                .as_ref()
                .is_some_and(|p| p.is_down())
                .then(|| self.parent_name());
            let halted = self.halted();
            let d = self
                .healing
                .must_wait(down_child.as_deref(), down_parent, halted);
            if let Decision::WaitForSource(why) = d {
                let d = self.wait_for_source(&why, t)?;
                self.apply(t, d)?;
                return Ok(Turn::Again);
            }
        }
        if t.is_source && t.mendable {
            let stalled = t.last_activity.elapsed() >= self.hop.timeout / 2;
            let d = match &self.server {
                Some(server) => self.healing.source_check(server, &self.hop, stalled),
                None => Decision::Go,
            };
            if let Decision::Heal { dead, rejoin } = d {
                let d = self.heal(dead, rejoin, t)?;
                self.apply(t, d)?;
                return Ok(Turn::Again);
            }
        }
        self.failures(t)
    }

    /// What is wrong without a heal under way: an abort or a failure elsewhere, a lost child,
    /// a stall, a suspicion the control channel did not confirm in time.
    fn failures(&mut self, t: &mut Tree<'_>) -> R<Turn> {
        // A node that rewinds leaves a lost neighbour to the next turn: a connection whose
        // watcher said so only since (a killed sink's, or the parent's as the source heals)
        // is not a failure, it is the next turn's rewind.
        let next_release = t.ring.next_release();
        let done_with_parent = t
            .eot
            .is_some_and(|e| next_release > e && t.credits_out == 0);
        self.check_outside(done_with_parent || t.rewinds)?;
        for c in &self.children {
            let finished = t.eot.is_some_and(|e| c.credits > e);
            if !finished && !t.rewinds && c.is_down() {
                let f = Fail::blame(
                    &c.name,
                    format!("the connection to child {} was lost", c.name),
                );
                let why = f.msg.clone();
                let d = self.healing.judge(t.is_source, true, f, why);
                self.healing.hold(d)?;
            }
        }
        if let Some(f) = self.stalled(t) {
            let why = f.msg.clone();
            let d = self.healing.judge(t.is_source, true, f, why);
            let wait = matches!(d, Decision::WaitForSource(_));
            self.healing.hold(d)?;
            if wait {
                return Ok(Turn::Again);
            }
        }
        if let Some(f) = self.healing.suspect_expired(self.hop.timeout) {
            return Err(f);
        }
        Ok(Turn::On)
    }

    /// Nothing moved for `timeout_ms` (and no throttle holds the loop): the hop at fault — a
    /// child that returns no credit, or the parent that sends no chunk.
    fn stalled(&self, t: &Tree<'_>) -> Option<Fail> {
        if t.progressed || t.last_activity.elapsed() <= self.hop.timeout || t.next_wake.is_some() {
            return None;
        }
        let ms = self.hop.timeout.as_millis();
        if let Some(c) = self.children.iter().find(|c| c.next_post > c.credits) {
            return Some(Fail::blame(
                &c.name,
                format!(
                    "{} returned no credit for {ms} ms ({} of {} chunks acknowledged): hop {} is dead or stuck",
                    c.name, c.credits, c.next_post, c.name
                ),
            ));
        }
        if t.is_source {
            return None;
        }
        let p = self.parent_name();
        let next_in = t.ring.next_in();
        Some(Fail::blame(
            p,
            format!(
                "no chunk from parent {p} for {ms} ms after chunk {next_in}: hop {p} is dead or stuck"
            ),
        ))
    }

    /// Applies a [`Decision::Rewind`]: the transfer goes on from its chunk (at the source,
    /// from a source opened again).
    fn apply(&mut self, t: &mut Tree<'_>, d: Decision) -> R<()> {
        let Decision::Rewind { to } = d else {
            return Ok(());
        };
        let next_in = t.ring.next_in();
        if let Some(src) = self.source.as_mut() {
            src.resend_until = src.resend_until.max(next_in);
        } else {
            self.healing.dup_below = self.healing.dup_below.max(next_in);
        }
        self.healing.mended();
        t.ring.rewind(to);
        t.eot = None;
        t.credits_out = 0;
        let now = Instant::now();
        t.throttle_clock = now;
        t.last_activity = now;
        if let Some(src) = self.source.as_mut() {
            // Frame the transfer again up to `to`, from a fresh source.
            let (hop, stages, stats) = (&self.hop, &mut self.stages, &mut self.stats);
            src.open(hop, stages, stats, t.setup.buf, to)?;
        }
        t.idle.busy();
        Ok(())
    }

    /// Drops the connection to every child (their late completions are ignored).
    fn drop_children(&mut self) {
        for c in self.children.drain(..) {
            self.healing.retired.push(c.conn.qp().qpn());
            let _ = c.conn.disconnect();
        }
    }

    /// The device, to connect again.
    fn device(&self) -> R<Device> {
        self.dev
            .clone()
            .ok_or_else(|| Fail::at(self.name(), "no device"))
    }

    /// The source heals: splices out the relays `dead`, waits for the resumable sinks
    /// `rejoin`, sets the tree up again and connects to its children again (healing around
    /// children that fail meanwhile), until it works or fails for good.
    fn heal(&mut self, dead: Vec<String>, rejoin: Vec<String>, t: &Tree<'_>) -> R<Decision> {
        let me = self.name();
        let server = self
            .server
            .clone()
            .ok_or_else(|| Fail::at(me, "no control server"))?;
        let dev = self.device()?;
        let next_in = t.ring.next_in();
        let mut round = self.healing.begin_heal(dead, rejoin, self.hop.timeout);
        loop {
            self.drop_children();
            let from = self
                .healing
                .regroup(&mut round, &server, &self.hop, next_in)?;
            self.start_seq = from;
            let by = Instant::now() + self.hop.timeout;
            match self.connect_children(&t.setup, &dev, by) {
                Ok(()) => {
                    self.healing.finish_heal(round, me, from, next_in);
                    return Ok(Decision::Rewind { to: from });
                }
                Err(f) => {
                    self.healing
                        .after_failed_setup(&mut round, &server, &self.hop, f)?;
                }
            }
        }
    }

    /// A node lost its parent or a child (or the source said `halt`; `why`): drops every
    /// connection, answers each `halt` with `held` (a sink: its first missing chunk), and
    /// when the source's `rewind` comes accepts its parent and connects to its children
    /// again, with the dead spliced out. Waits up to three times `timeout_ms` for that (the
    /// source may first have to find a frozen node silent, or wait for a restarted sink),
    /// again after every `halt`.
    fn wait_for_source(&mut self, why: &str, t: &Tree<'_>) -> R<Decision> {
        let me = self.name();
        let limit = 3 * self.hop.timeout;
        let client = self
            .client
            .clone()
            .ok_or_else(|| Fail::at(me, "no control connection"))?;
        let dev = self.device()?;
        let next_in = t.ring.next_in();
        let next = self
            .sink
            .is_some()
            .then_some(next_in.max(self.healing.dup_below));
        eprintln!("{me}: {why}; waiting for the source to set the transfer up again");
        let mut deadline = Instant::now() + limit;
        loop {
            if let Some(p) = self.parent.take() {
                self.healing.retired.push(p.conn.qp().qpn());
                let _ = p.conn.disconnect();
            }
            self.drop_children();
            let from =
                self.healing
                    .await_rewind(&client, &self.hop, (why, next), &mut deadline, limit)?;
            self.start_seq = from;
            let setup: Setup<'_> = t.setup;
            match self.connect_tree(&setup, &dev, Instant::now() + self.hop.timeout) {
                Ok(()) => {
                    eprintln!(
                        "{me}: forwarding again from chunk {from} (parent {})",
                        self.parent_name()
                    );
                    return Ok(Decision::Rewind { to: from });
                }
                // A neighbour failed again: the source will set the tree up again, or stop.
                Err(f) => {
                    self.hop
                        .status(&format!("{}; waiting for the source", f.msg));
                    deadline = Instant::now() + limit;
                }
            }
        }
    }
}
