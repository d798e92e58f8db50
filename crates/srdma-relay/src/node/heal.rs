//! Healing: what a node does when the transfer around it breaks, as a policy that returns a
//! [`Decision`] the data loop applies, and the control-channel side of a heal.
//!
//! The policy: with healing off (and no sink that may be restarted alone) any broken link
//! ends the transfer. With it on, the source does not decide from a broken link who died: it
//! *suspects* (and waits for the control channel to name the dead, at most twice
//! `timeout_ms` and a second); every other node drops its connections and *waits for the
//! source* to set the transfer up again. The source heals when the control channel names
//! relays that died or froze, or resumable sinks that died or are back: it halts every other
//! node, gathers the first chunk each lacks, waits for restarted sinks, and tells everyone
//! where the transfer goes on — a [`Decision::Rewind`] for its own loop. A node waiting for
//! the source answers each halt and gets its rewind the same way.
//!
//! This file owns the healing state ([`Healing`]) and talks to the control channel; it sets
//! up no connection and touches no ring: the loop does that with the decision in hand.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use srdma_wire::seq::Qpn;

use crate::config::Config;
use crate::control::{self, Healed, Msg};

use super::fail::{self, Fail, R};
use super::hop::Hop;

/// How often the source asks the control channel whether a node died.
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// What the data loop must do about the transfer around it.
#[derive(Debug)]
pub(super) enum Decision {
    /// Nothing to mend: go on.
    Go,
    /// End the transfer with this failure.
    Fail(Fail),
    /// The source: a link to a child failed; go on while the control channel has not said
    /// who died (the failure stands if it does not say so in time).
    Suspect(Fail),
    /// A node: a neighbour was lost (why); drop every connection and wait for the source to
    /// set the transfer up again.
    WaitForSource(String),
    /// The source: splice out the relays `dead`, wait for the resumable sinks `rejoin` to be
    /// back, and set the transfer up again.
    Heal {
        dead: Vec<String>,
        rejoin: Vec<String>,
    },
    /// The connections are up again: go on from chunk `to`.
    Rewind { to: u64 },
}

/// A node's healing state.
pub(super) struct Healing {
    /// Healing is on and some relay of the configuration may be healed around.
    heals: bool,
    /// The sinks that may be restarted while the rest waits ([`Config::rejoinable_sinks`]).
    rejoins: Vec<String>,
    /// The nodes spliced out of the tree so far (dead, frozen, or finished when a heal came).
    pub(super) dead: Vec<String>,
    /// The source: the last `halt` sent; a node: the last `halt` answered.
    pub(super) epoch: u64,
    /// A node: `rewind` messages acted on.
    rewinds_seen: u64,
    /// Chunks below this were processed before a heal rewound the transfer: a sink does not
    /// write them again, and nobody counts them twice.
    pub(super) dup_below: u64,
    /// The source: the heals so far.
    pub(super) healed: Vec<Healed>,
    /// A node: a neighbour was lost (why), found by a completion or a stall.
    lost: Option<String>,
    /// The source: when it first saw a child's link fail, and that failure.
    suspect: Option<(Instant, Fail)>,
    /// The source: when it last asked the control channel about deaths.
    checked: Instant,
    /// Queue pairs of connections dropped by a heal: their late completions are ignored.
    pub(super) retired: Vec<Qpn>,
}

/// One heal at the source, across its attempts.
pub(super) struct HealRound {
    started: Instant,
    /// Give up when nodes do not answer by then.
    deadline: Instant,
    /// Relays found dead and not yet spliced out.
    newly: Vec<String>,
    /// Resumable sinks that died: wait for them to be back.
    gone: Vec<String>,
    /// The restarted sinks and the first chunk each lacks.
    back: BTreeMap<String, u64>,
    /// Halt everyone (again).
    halt: bool,
    /// The relays spliced out by this heal.
    spliced: Vec<String>,
}

impl Healing {
    /// The healing state of a node of `cfg`.
    pub(super) fn new(cfg: &Config) -> Healing {
        Healing {
            heals: cfg.transfer.heal && cfg.nodes.iter().any(|n| cfg.healable(&n.name)),
            rejoins: cfg.rejoinable_sinks(),
            dead: Vec::new(),
            epoch: 0,
            rewinds_seen: 0,
            dup_below: 0,
            healed: Vec::new(),
            lost: None,
            suspect: None,
            checked: Instant::now(),
            retired: Vec::new(),
        }
    }

    /// Relays may die (healing) or resumable sinks be restarted: the source then sets the
    /// tree up again, and every other node waits for it when it loses a neighbour.
    pub(super) fn mendable(&self) -> bool {
        self.heals || !self.rejoins.is_empty()
    }

    /// The source: tells the control server which nodes may come back.
    pub(super) fn announce(&self, server: &control::Server, cfg: &Config) {
        let mut rejoinable = self.rejoins.clone();
        if self.heals {
            rejoinable.extend(
                cfg.nodes
                    .iter()
                    .filter(|n| cfg.healable(&n.name))
                    .map(|n| n.name.clone()),
            );
        }
        server.set_rejoinable(&rejoinable);
    }

    /// A node: a `halt` newer than the last one answered came.
    pub(super) fn halted(&self, client: Option<&control::Client>) -> bool {
        client.is_some_and(|c| c.halt_epoch() > self.epoch)
    }

    /// The policy for a link that broke — `fail` says how, `why` says it for a node that
    /// waits for the source, `near` says whether it is this node's parent's or a child's.
    pub(super) fn judge(&self, is_source: bool, near: bool, fail: Fail, why: String) -> Decision {
        if !self.mendable() || !near {
            Decision::Fail(fail)
        } else if is_source {
            Decision::Suspect(fail)
        } else {
            Decision::WaitForSource(why)
        }
    }

    /// Applies the policy's [`Decision::Suspect`] and [`Decision::WaitForSource`] (they only
    /// change this state); returns the failure of a [`Decision::Fail`].
    pub(super) fn hold(&mut self, d: Decision) -> R<()> {
        match d {
            Decision::Fail(f) => return Err(f),
            Decision::Suspect(f) => {
                self.suspect.get_or_insert((Instant::now(), f));
            }
            Decision::WaitForSource(why) => self.lost = Some(why),
            Decision::Go | Decision::Heal { .. } | Decision::Rewind { .. } => {}
        }
        Ok(())
    }

    /// A node that waits for the source when it loses a neighbour: whether it must now, and
    /// why — a child or the parent was lost (`down_child`, `down_parent`), a link broke
    /// earlier, or the source halted the transfer.
    pub(super) fn must_wait(
        &mut self,
        down_child: Option<&str>,
        down_parent: Option<&str>,
        halted: bool,
    ) -> Decision {
        let why = if let Some(c) = down_child {
            format!("lost child {c}")
        } else if let Some(p) = down_parent {
            format!("lost parent {p}")
        } else if let Some(why) = self.lost.take() {
            why
        } else if halted {
            "the source halted the transfer to heal it".to_string()
        } else {
            return Decision::Go;
        };
        Decision::WaitForSource(why)
    }

    /// The source: asks the control channel (every few milliseconds: it takes a lock; at once
    /// when a child's link failed) about relays that died — or, once the transfer `stalled`,
    /// froze — and resumable sinks that died or are back.
    pub(super) fn source_check(
        &mut self,
        server: &control::Server,
        hop: &Hop<'_>,
        stalled: bool,
    ) -> Decision {
        if self.suspect.is_none() && self.checked.elapsed() < CHECK_EVERY {
            return Decision::Go;
        }
        self.checked = Instant::now();
        let dead = self.newly_dead(server, hop, stalled);
        let rejoin = self.gone_sinks(server);
        if dead.is_empty() && rejoin.is_empty() {
            Decision::Go
        } else {
            Decision::Heal { dead, rejoin }
        }
    }

    /// The source: a child's link failed and nobody was found dead or frozen in time (a
    /// frozen relay falls silent within `timeout_ms`): that failure.
    pub(super) fn suspect_expired(&self, timeout: Duration) -> Option<Fail> {
        let (at, f) = self.suspect.as_ref()?;
        (at.elapsed() > 2 * timeout + Duration::from_secs(1)).then(|| f.clone())
    }

    /// The transfer was set up again: nothing is lost or suspected any more.
    pub(super) fn mended(&mut self) {
        self.lost = None;
        self.suspect = None;
    }

    /// The source: relays that died (control connection closed without a report) or, with
    /// `silent_too`, froze (silent for `timeout_ms`), not spliced out yet. The data loop asks
    /// about silence only once the transfer itself stalled for half `timeout_ms` (a frozen
    /// relay stops the source within a ring's time): a live relay whose heartbeat was merely
    /// late on a loaded host is not cut out while chunks still flow.
    fn newly_dead(&self, server: &control::Server, hop: &Hop<'_>, silent_too: bool) -> Vec<String> {
        server
            .dead_or_silent(silent_too.then_some(hop.timeout))
            .into_iter()
            .filter(|n| hop.cfg.healable(n) && !self.dead.contains(n))
            .collect()
    }

    /// The source: resumable sinks that died (and were not finished) or whose restarted
    /// process is saying hello.
    fn gone_sinks(&self, server: &control::Server) -> Vec<String> {
        self.rejoins
            .iter()
            .filter(|n| server.is_dead(n) || server.rejoining(n))
            .cloned()
            .collect()
    }

    /// The source starts a heal of the relays in `newly` and the resumable sinks in `gone`;
    /// nodes get three times `timeout_ms` to answer.
    pub(super) fn begin_heal(
        &self,
        newly: Vec<String>,
        gone: Vec<String>,
        timeout: Duration,
    ) -> HealRound {
        let started = Instant::now();
        HealRound {
            started,
            deadline: started + 3 * timeout,
            newly,
            gone,
            back: BTreeMap::new(),
            halt: true,
            spliced: Vec::new(),
        }
    }

    /// The source, one attempt of a heal: splices out the relays found dead (telling them to
    /// stop), halts every other node and waits for each to answer with the first chunk it
    /// lacks, waits (up to `timeout_ms`) for each gone sink to be restarted and say where it
    /// resumes; then tells everyone where the transfer goes on (`rewind`, or `start` to a
    /// restarted sink), with the dead and the finished spliced out: the smallest chunk any
    /// node lacks, at most `next_in` (returned). Relays found dead or frozen meanwhile are
    /// spliced out too. Fails when a node fails on its own, a sink does not come back, or a
    /// node does not answer in time.
    pub(super) fn regroup(
        &mut self,
        round: &mut HealRound,
        server: &control::Server,
        hop: &Hop<'_>,
        next_in: u64,
    ) -> R<u64> {
        let held = loop {
            fail::reported(server)?;
            if round.halt || !round.newly.is_empty() {
                round.halt = false;
                self.halt(round, server, hop.name());
            }
            self.wait_rejoins(round, server, hop)?;
            let (held, missing) = server.wait_held(
                self.epoch,
                (Instant::now() + Duration::from_millis(200)).min(round.deadline),
            );
            if missing.is_empty() {
                break held;
            }
            round.newly = self.newly_dead(server, hop, true);
            if round.newly.is_empty() && Instant::now() >= round.deadline {
                return Err(Fail::at(
                    &missing[0],
                    format!(
                        "the transfer could not be set up again: {} did not answer within {} ms",
                        missing.join(", "),
                        (3 * hop.timeout).as_millis()
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
            let (dead, epoch) = (splice.clone(), self.epoch);
            let msg = if round.back.contains_key(n) {
                Msg::Start { from, dead, epoch }
            } else {
                Msg::Rewind { from, dead, epoch }
            };
            server.send_to(n, &msg);
        }
        self.dead = splice;
        Ok(from)
    }

    /// Splices out the relays found dead and halts every other node (a new epoch).
    fn halt(&mut self, round: &mut HealRound, server: &control::Server, me: &str) {
        for n in &round.newly {
            server.exclude(n);
            if !self.dead.contains(n) {
                self.dead.push(n.clone());
            }
        }
        round.spliced.extend(round.newly.iter().cloned());
        self.epoch += 1;
        if !round.newly.is_empty() {
            eprintln!(
                "{me}: {} died or froze; healing around it (halt {})",
                round.newly.join(", "),
                self.epoch
            );
        }
        server.broadcast(&Msg::Halt {
            epoch: self.epoch,
            dead: self.dead.clone(),
        });
        for (n, from) in &round.back {
            server.mark_held(n, self.epoch, Some(*from));
        }
    }

    /// Waits (up to `timeout_ms` each) for the gone sinks not back yet.
    fn wait_rejoins(
        &mut self,
        round: &mut HealRound,
        server: &control::Server,
        hop: &Hop<'_>,
    ) -> R<()> {
        let me = hop.name();
        let waiting: Vec<String> = round
            .gone
            .iter()
            .filter(|n| !round.back.contains_key(*n))
            .cloned()
            .collect();
        for n in &waiting {
            let ms = hop.timeout.as_millis();
            eprintln!("{me}: lost {n}; waiting up to {ms} ms for it to be restarted and resume");
            let by = (Instant::now() + hop.timeout).min(round.deadline);
            let Some(from) = server.wait_rejoin(n, by) else {
                fail::reported(server)?;
                return Err(Fail::at(
                    n,
                    format!(
                        "node {n} died (its connections closed) and did not come back within {ms} ms"
                    ),
                ));
            };
            eprintln!("{me}: {n} is back and lacks chunk {from}");
            server.mark_held(n, self.epoch, Some(from));
            round.back.insert(n.clone(), from);
        }
        Ok(())
    }

    /// The source could not connect to its children again (`f`): waits (until the heal's
    /// deadline) for the control channel to name nodes that died or froze meanwhile, to
    /// heal around them too; fails with `f` when none does.
    pub(super) fn after_failed_setup(
        &mut self,
        round: &mut HealRound,
        server: &control::Server,
        hop: &Hop<'_>,
        f: Fail,
    ) -> R<()> {
        eprintln!("{}: {}; looking for nodes that died", hop.name(), f.msg);
        while round.newly.is_empty() && Instant::now() < round.deadline {
            thread::sleep(Duration::from_millis(50));
            fail::reported(server)?;
            round.newly = self.newly_dead(server, hop, true);
        }
        if round.newly.is_empty() {
            return Err(f);
        }
        Ok(())
    }

    /// The source's heal is done, the transfer going on from `from` (`next_in`: where it
    /// stood): records it for the reports and says so.
    pub(super) fn finish_heal(&mut self, round: HealRound, me: &str, from: u64, next_in: u64) {
        let h = Healed {
            nodes: round.spliced,
            heal_ms: u64::try_from(round.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            from_chunk: from,
            resent_chunks: next_in.saturating_sub(from),
            rejoined: round.back.into_keys().collect(),
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
    }

    /// A node waiting for the source (its connections dropped): answers each `halt` with
    /// `held` (`next`: a sink's first missing chunk) and returns the chunk the source's next
    /// `rewind` names, with the dead it names spliced out. Each halt gives the source another
    /// `limit`; fails (`why` it waited) when the source sets nothing up by `deadline`, stops
    /// the transfer, or is lost.
    pub(super) fn await_rewind(
        &mut self,
        client: &control::Client,
        hop: &Hop<'_>,
        (why, next): (&str, Option<u64>),
        deadline: &mut Instant,
        limit: Duration,
    ) -> R<u64> {
        loop {
            let h = client.wait_rewind(self.rewinds_seen, self.epoch, *deadline);
            if let Some((e, dead)) = h.halt.clone().filter(|(e, _)| *e > self.epoch) {
                self.epoch = e;
                self.dead = dead;
                client.send(&Msg::Held {
                    node: hop.name().to_string(),
                    epoch: e,
                    next,
                });
                *deadline = Instant::now() + limit;
                continue;
            }
            if h.rewinds <= self.rewinds_seen {
                fail::source_said(&h, &hop.cfg.source().name)?;
                let p = hop
                    .cfg
                    .live_parent(hop.name(), &self.dead)
                    .map_or("?", |n| n.name.as_str());
                return Err(Fail::blame(
                    p,
                    format!(
                        "{why}, and the source did not set the transfer up again within {} ms",
                        limit.as_millis()
                    ),
                ));
            }
            self.rewinds_seen = h.rewinds;
            self.dead = h.rewind_dead.clone();
            return Ok(h.rewind.unwrap_or(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain A → B → C; `heal` and `stdin` as said.
    fn chain(heal: bool, stdin: bool) -> Config {
        let src = if stdin { "stdin" } else { "gen:8MiB" };
        let text = format!(
            "[transfer]\nchunk_size = \"256KiB\"\nslots = 4\nheal = {heal}\n\n\
             [[node]]\nname = \"A\"\naddr = \"127.0.30.1\"\nrole = \"source\"\nsource = \"{src}\"\n\n\
             [[node]]\nname = \"B\"\naddr = \"127.0.30.2\"\nrole = \"relay\"\nparent = \"A\"\n\n\
             [[node]]\nname = \"C\"\naddr = \"127.0.30.3\"\nrole = \"sink\"\nparent = \"B\"\nsink = \"discard\"\n"
        );
        Config::parse(&text, "test.toml").unwrap()
    }

    fn fail() -> Fail {
        Fail::blame("B", "lost B")
    }

    #[test]
    fn a_broken_link_ends_the_transfer_unless_healing_can_mend_it() {
        let on = Healing::new(&chain(true, false));
        assert!(on.mendable());
        assert!(matches!(
            on.judge(true, true, fail(), "why".into()),
            Decision::Suspect(f) if f.msg == "lost B"
        ));
        assert!(matches!(
            on.judge(false, true, fail(), "why".into()),
            Decision::WaitForSource(w) if w == "why"
        ));
        // A link that is not this node's parent's or a child's.
        assert!(matches!(
            on.judge(false, false, fail(), "why".into()),
            Decision::Fail(_)
        ));
        for off in [chain(false, false), chain(true, true)] {
            let off = Healing::new(&off);
            assert!(!off.mendable());
            for is_source in [true, false] {
                assert!(matches!(
                    off.judge(is_source, true, fail(), "why".into()),
                    Decision::Fail(_)
                ));
            }
        }
    }

    #[test]
    fn the_source_keeps_its_first_suspicion_until_mended() {
        let mut h = Healing::new(&chain(true, false));
        h.hold(Decision::Suspect(Fail::blame("B", "first")))
            .unwrap();
        h.hold(Decision::Suspect(Fail::blame("C", "second")))
            .unwrap();
        assert_eq!(
            h.suspect.as_ref().map(|(_, f)| f.msg.as_str()),
            Some("first")
        );
        // Not expired yet: the control channel gets twice the timeout and a second.
        assert!(h.suspect_expired(Duration::ZERO).is_none());
        h.mended();
        assert!(h.suspect.is_none());
        let err = h.hold(Decision::Fail(fail())).unwrap_err();
        assert_eq!(err.hop.as_deref(), Some("B"));
    }

    #[test]
    fn a_node_waits_for_the_source_for_the_first_reason_it_has() {
        let mut h = Healing::new(&chain(true, false));
        assert!(matches!(h.must_wait(None, None, false), Decision::Go));
        h.hold(Decision::WaitForSource("lost B (retry exceeded)".into()))
            .unwrap();
        // A lost child or parent says more than an earlier broken link.
        assert!(matches!(
            h.must_wait(Some("C"), Some("A"), true),
            Decision::WaitForSource(w) if w == "lost child C"
        ));
        assert!(matches!(
            h.must_wait(None, Some("A"), true),
            Decision::WaitForSource(w) if w == "lost parent A"
        ));
        assert!(matches!(
            h.must_wait(None, None, true),
            Decision::WaitForSource(w) if w == "lost B (retry exceeded)"
        ));
        // The broken link was answered once; a halt remains.
        assert!(matches!(
            h.must_wait(None, None, true),
            Decision::WaitForSource(w) if w == "the source halted the transfer to heal it"
        ));
        h.mended();
        assert!(matches!(h.must_wait(None, None, false), Decision::Go));
    }
}
