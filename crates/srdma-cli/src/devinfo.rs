//! `srdma devinfo` (being written).

use std::io::Write;

/// Options of `srdma devinfo`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `srdma devinfo`.
pub fn run(_args: &Args, _out: &mut impl Write) -> anyhow::Result<bool> {
    anyhow::bail!("srdma devinfo is not implemented yet")
}
