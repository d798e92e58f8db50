//! `srdma perf` (being written).

use std::io::Write;

/// Options of `srdma perf`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `srdma perf`.
pub fn run(_args: &Args, _out: &mut impl Write) -> anyhow::Result<bool> {
    anyhow::bail!("srdma perf is not implemented yet")
}
