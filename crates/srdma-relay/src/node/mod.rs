//! One node of a transfer, run as its own process: the source, a relay, a sink, or a relay
//! that is also a sink. See the crate documentation for the protocol.
//!
//! The rooms, from the run down:
//!
//! * `run` — [`run()`] builds a `NodeRun`: what every role shares (device, control channel,
//!   connections, stages, counters) and the role parts below; it sets the node up and runs
//!   the data loop of its topology. `hop` — what the node is (its configuration, its ring's
//!   shape, its dead-hop limit).
//! * `connect` — connection setup: agreeing with the source where the run starts (a sink may
//!   resume), accepting the parent, connecting the children and the CM retries.
//! * `tree` — the data loop of a chain or tree, a method per step; `mend` — its step 6,
//!   applying the healing policy's decisions (connect again, rewind, reopen the source).
//! * `ring` — the tree's slot ring, a pure type: arrivals, processing, forwards, release in
//!   order, rewinds.
//! * `heal` — healing as a policy returning decisions, the healing state, and the control
//!   channel's side of a heal.
//! * `source_side`, `sink_side` — the source's side (framing chunks from the source) and the
//!   sink's side (checking, writing, committing, resuming); `process` and `stages` — what a
//!   relay or sink does with a chunk in its slot.
//! * `mesh` — the binomial pipeline's data path.
//! * `idle` — spin, arm, sleep: the idle turn of both loops.
//! * `finish`, `progress` — the report, the source's verdict, and progress as the node runs.
//! * `links`, `wire`, `fail` — connections to neighbours, what travels besides chunks (work
//!   request ids, immediates, the ring descriptor), and failures with whom they blame.

mod connect;
mod fail;
mod finish;
mod heal;
mod hop;
mod idle;
mod links;
mod mend;
mod mesh;
mod process;
mod progress;
mod ring;
mod run;
mod sink_side;
mod source_side;
mod stages;
mod tree;
mod wire;

pub use finish::Outcome;
pub use hop::NodeOptions;

use crate::config::Config;
use crate::report::Report;

/// Loads the configuration at `path` and runs node `name` of it: what `srdma relay node` does.
/// Returns the exit status: 2 (with a message on stderr naming the file, node and field) for a
/// bad configuration or an unknown node, else [`run()`]'s.
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
    let mut n = run::NodeRun::new(cfg, me, opts);
    let result = n.run();
    n.finish(result)
}
