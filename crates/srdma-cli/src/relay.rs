//! `srdma relay` (being written).

use std::io::Write;

/// Options of `srdma relay`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `srdma relay`.
pub fn run(_args: &Args, _out: &mut impl Write) -> anyhow::Result<bool> {
    anyhow::bail!("srdma relay is not implemented yet")
}
