//! What a node is, for as long as it runs: its configuration and its entry in it, how it
//! shows what it does, the shape of its ring and the transfer's dead-hop limit.

use std::time::Duration;

use crate::config::{Config, Node};

/// How a node shows what it does.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeOptions {
    /// Progress and report as JSON lines on stdout.
    pub json: bool,
    /// No progress bar or lines on stderr.
    pub quiet: bool,
}

/// A node of a configuration, as it runs.
#[derive(Clone, Copy)]
pub(super) struct Hop<'a> {
    pub(super) cfg: &'a Config,
    pub(super) me: &'a Node,
    pub(super) opts: NodeOptions,
    /// Slots of every ring.
    pub(super) slots: usize,
    /// Bytes of a slot: a chunk header and the largest payload.
    pub(super) slot_size: usize,
    /// `timeout_ms`: a hop that moves nothing for this long is dead.
    pub(super) timeout: Duration,
}

impl<'a> Hop<'a> {
    /// Node `me` of `cfg`.
    pub(super) fn new(cfg: &'a Config, me: &'a Node, opts: &NodeOptions) -> Hop<'a> {
        Hop {
            cfg,
            me,
            opts: *opts,
            slots: cfg.transfer.slots as usize,
            slot_size: cfg.slot_size(),
            timeout: Duration::from_millis(cfg.transfer.timeout_ms),
        }
    }

    /// The node's name.
    pub(super) fn name(&self) -> &'a str {
        &self.me.name
    }

    /// Says what the node does on stderr (not with `--json` or `--quiet`).
    pub(super) fn status(&self, msg: &str) {
        if !self.opts.quiet && !self.opts.json {
            eprintln!("{}: {msg}", self.me.name);
        }
    }
}
