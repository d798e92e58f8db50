//! `srdma`: the one command-line tool of the srdma RDMA stack.

mod decode;
mod demo;
mod devinfo;
mod devnodes;
mod exec;
mod perf;
mod pingpong;
mod relay;
mod rping;
mod sysfs;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// srdma: RDMA over RoCEv2 in user space.
#[derive(Debug, Parser)]
#[command(name = "srdma", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode the RoCEv2 packets of pcap files, one line each, verifying every ICRC.
    ///
    /// Exits 1 when a file cannot be read or is not a pcap, or when any RoCEv2 packet is
    /// malformed or carries a bad ICRC.
    Decode {
        /// pcap files (classic pcap; Ethernet, raw IP, Linux cooked or loopback link types).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print every field of every packet.
        #[arg(short, long)]
        verbose: bool,
        /// UDP destination port that marks RoCEv2 traffic.
        #[arg(long, default_value_t = srdma_wire::ROCEV2_PORT)]
        port: u16,
    },
    /// Decode the captures of real rxe traffic built into this binary and check every packet,
    /// then run a live A -> B -> C RDMA forwarding chain on this host.
    Demo {
        /// Also print every packet, with every field.
        #[arg(short, long)]
        verbose: bool,
        /// Skip the live part (it binds 127.0.20.1-3 on UDP 4791).
        #[arg(long)]
        no_live: bool,
    },
    /// Ping-pong SENDs with a peer, as rdma-core's ibv_rc_pingpong (ibv_ud_pingpong with
    /// --ud): same options, TCP exchange and output, so the peer may be that tool on rxe.
    ///
    /// Without SERVERNAME, waits for a client. Exits 1 when the peer cannot be reached or a
    /// completion fails.
    Pingpong(pingpong::Args),
    /// List devices and ports with their attributes, GIDs and statistics, as ibv_devinfo.
    Devinfo(devinfo::Args),
    /// Bandwidth and latency tests as perftest's ib_*_bw / ib_*_lat.
    Perf(perf::Args),
    /// Ping a peer through srdma's connection manager, as rdma-core's rping.
    Rping(rping::Args),
    /// srdma-relay: distribute data through chains and trees of hosts.
    Relay(relay::Args),
    /// Run an unmodified verbs program (ibv_devinfo, ibv_rc_pingpong, perftest, your own)
    /// on srdma's drop-in libibverbs.so.1.
    Exec(exec::Args),
    /// Make /dev/infiniband/uverbsN nodes for programs that look for them before they use a
    /// device (UCX), where `srdma exec` cannot make them in a private namespace (needs root).
    SetupDev(devnodes::SetupArgs),
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    // Not locked for the whole command: the demo's threads print too.
    let mut out = std::io::stdout();
    match cli.command {
        Command::Decode {
            files,
            verbose,
            port,
        } => {
            let opts = decode::Options {
                verbose,
                per_packet: true,
                port,
            };
            let mut clean = true;
            for path in &files {
                let name = path.display().to_string();
                let data = match std::fs::read(path) {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("error: {name}: {e}");
                        clean = false;
                        continue;
                    }
                };
                if files.len() > 1 {
                    writeln!(out, "== {name}")?;
                }
                match decode::decode(&data, opts, &mut out) {
                    Ok(s) => {
                        writeln!(out, "{}", decode::summary_line(&name, &s))?;
                        if !s.clean() {
                            eprintln!(
                                "error: {name}: {} malformed RoCEv2 packets, {} with a bad ICRC",
                                s.malformed, s.icrc_bad
                            );
                            clean = false;
                        }
                    }
                    Err(e) => {
                        eprintln!("error: {name}: {e}");
                        clean = false;
                    }
                }
            }
            Ok(clean)
        }
        Command::Demo { verbose, no_live } => demo::run(verbose, !no_live, &mut out),
        Command::Pingpong(args) => pingpong::run(&args, &mut out),
        Command::Devinfo(args) => devinfo::run(&args, &mut out),
        Command::Perf(args) => perf::run(&args, &mut out),
        Command::Rping(args) => rping::run(&args, &mut out),
        Command::Relay(args) => relay::run(&args, &mut out),
        Command::Exec(args) => exec::run(&args),
        Command::SetupDev(args) => devnodes::setup(&args, &mut out),
    }
}

/// A usage or configuration error: exits with status 2, like clap's own argument errors.
/// An empty message means the command already said what was wrong.
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            // A closed stdout (`srdma decode f | head`) is not an error worth a message.
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            if let Some(u) = e.downcast_ref::<UsageError>() {
                if !u.0.is_empty() {
                    eprintln!("error: {u}");
                }
                return ExitCode::from(2);
            }
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
