//! `srdma rping` (being written).

use std::io::Write;

/// Options of `srdma rping`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `srdma rping`.
pub fn run(_args: &Args, _out: &mut impl Write) -> anyhow::Result<bool> {
    anyhow::bail!("srdma rping is not implemented yet")
}
