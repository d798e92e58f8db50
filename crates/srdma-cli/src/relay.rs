//! `srdma relay`: distribute data through chains and trees of hosts (srdma-relay).
//!
//! - `srdma relay node --config FILE [--name NAME] [--json] [--quiet]` runs one node: the
//!   one called NAME, or without `--name` the one whose address belongs to this host, so the
//!   same command line runs on every host (see `docs/cluster.md`).
//! - `srdma relay demo` runs source → relay → sink on this host (127.0.30.1-3) as three
//!   processes, 1 GiB of generated data through the verify stage.
//! - `srdma relay chain --hops N` / `srdma relay tree --fanout K --depth D` /
//!   `srdma relay binomial --sinks N` generate such a configuration and run it the same way
//!   (`--print-config` prints it instead).
//!
//! Exit status: 0 success, 1 failure (the message names the failed hop and what reached
//! each sink), 2 bad configuration or arguments.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use srdma_relay::config::{self, Config, GenOptions, Transfer};
use srdma_relay::launch::{self, LaunchOptions};
use srdma_relay::node::{self, NodeOptions};
use srdma_relay::report::{self, human_bytes};

/// Options of `srdma relay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one node of a configuration file as this process.
    Node(NodeArgs),
    /// Run a whole transfer on this host: source -> relay -> sink on 127.0.30.1-3, 1 GiB of
    /// generated data, every node a process; exit 0 only if every sink committed.
    Demo(DemoArgs),
    /// Generate a chain of N hops and run it on this host (or print it).
    Chain(ChainArgs),
    /// Generate a tree and run it on this host (or print it).
    Tree(TreeArgs),
    /// Generate a binomial pipeline to N sinks and run it on this host (or print it).
    Binomial(BinomialArgs),
}

#[derive(Debug, clap::Args)]
struct NodeArgs {
    /// The configuration file (TOML).
    #[arg(long)]
    config: PathBuf,
    /// This node's name in it (default: the node whose address is one of this host's).
    #[arg(long)]
    name: Option<String>,
    /// Progress and the final report as JSON lines on stdout.
    #[arg(long)]
    json: bool,
    /// No progress display on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Topology {
    Chain,
    Tree,
    Binomial,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ForwardArg {
    Send,
    WriteImm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CheckArg {
    Crc32c,
    Xxh3,
    None,
}

fn size(s: &str) -> Result<u64, String> {
    srdma_relay::source::parse_size(s)
}

#[derive(Debug, Clone, clap::Args)]
struct Common {
    /// Bytes of generated data the source sends.
    #[arg(long, default_value = "1GiB", value_parser = size)]
    size: u64,
    /// What the source reads instead of generated data (`gen:SIZE[:SEED]`, `file:PATH`, `dir:PATH`).
    #[arg(long)]
    source: Option<String>,
    /// Chunk size.
    #[arg(long, default_value = "1MiB", value_parser = size)]
    chunk: u64,
    /// Ring slots per hop.
    #[arg(long, default_value_t = config::DEFAULT_SLOTS)]
    slots: u32,
    /// How relays forward chunks.
    #[arg(long, value_enum, default_value_t = ForwardArg::Send)]
    forward: ForwardArg,
    /// Per-chunk checksum.
    #[arg(long, value_enum, default_value_t = CheckArg::Crc32c)]
    check: CheckArg,
    /// Sinks write `DIR/<name>.bin` instead of discarding (after checking) the data.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Address of the first node; the others follow (127.0.30.1, .2, ...).
    #[arg(long, default_value = "127.0.30.1")]
    base_addr: std::net::Ipv4Addr,
    /// TCP port of every node's connection manager (the source's control port is one above).
    #[arg(long, default_value_t = config::DEFAULT_CM_PORT)]
    cm_port: u16,
    /// UDP port of every node's RDMA device.
    #[arg(long, default_value_t = config::DEFAULT_UDP_PORT)]
    udp_port: u16,
    /// Connect timeout and dead-hop limit.
    #[arg(long, default_value_t = config::DEFAULT_TIMEOUT_MS)]
    timeout_ms: u64,
    /// Print the generated configuration (TOML) and exit.
    #[arg(long)]
    print_config: bool,
    /// Print each node's final report as a JSON line.
    #[arg(long)]
    json: bool,
    /// No progress display.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Chain or tree.
    #[arg(long, value_enum, default_value_t = Topology::Chain)]
    topology: Topology,
    /// Hops of the chain (links: a 2-hop chain is source -> relay -> sink).
    #[arg(long, default_value_t = 2)]
    hops: usize,
    /// Children per inner node of the tree.
    #[arg(long, default_value_t = 2)]
    fanout: usize,
    /// Levels below the source in the tree.
    #[arg(long, default_value_t = 2)]
    depth: usize,
    /// Sinks of the binomial pipeline.
    #[arg(long, default_value_t = 4)]
    sinks: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, clap::Args)]
struct BinomialArgs {
    /// Sinks (every one also sends to others).
    #[arg(long, default_value_t = 4)]
    sinks: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, clap::Args)]
struct ChainArgs {
    /// Hops (links): a 2-hop chain is source -> relay -> sink.
    #[arg(long, default_value_t = 2)]
    hops: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, clap::Args)]
struct TreeArgs {
    /// Children per inner node.
    #[arg(long, default_value_t = 2)]
    fanout: usize,
    /// Levels below the source.
    #[arg(long, default_value_t = 2)]
    depth: usize,
    #[command(flatten)]
    common: Common,
}

/// Runs `srdma relay`.
pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<bool> {
    match &args.cmd {
        Cmd::Node(a) => run_node(a),
        Cmd::Demo(a) => match a.topology {
            Topology::Chain => generate_and_run(Shape::Chain(a.hops), &a.common, out),
            Topology::Tree => generate_and_run(Shape::Tree(a.fanout, a.depth), &a.common, out),
            Topology::Binomial => generate_and_run(Shape::Binomial(a.sinks), &a.common, out),
        },
        Cmd::Chain(a) => generate_and_run(Shape::Chain(a.hops), &a.common, out),
        Cmd::Tree(a) => generate_and_run(Shape::Tree(a.fanout, a.depth), &a.common, out),
        Cmd::Binomial(a) => generate_and_run(Shape::Binomial(a.sinks), &a.common, out),
    }
}

fn run_node(a: &NodeArgs) -> anyhow::Result<bool> {
    let opts = NodeOptions {
        json: a.json,
        quiet: a.quiet,
    };
    let code = match &a.name {
        Some(name) => node::run_file(&a.config, name, &opts),
        None => match config::Config::load(&a.config) {
            Ok(cfg) => {
                let local: Vec<std::net::IpAddr> = srdma::netdev::local_devices()
                    .context("listing this host's addresses")?
                    .into_iter()
                    .map(|d| d.addr)
                    .collect();
                match cfg.node_on_host(&local) {
                    Ok(me) => {
                        let name = me.name.clone();
                        node::run(&cfg, &name, &opts).code
                    }
                    Err(e) => return Err(crate::UsageError(e).into()),
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                2
            }
        },
    };
    match code {
        0 => Ok(true),
        // The node printed what was wrong with the configuration.
        2 => Err(crate::UsageError(String::new()).into()),
        _ => Ok(false),
    }
}

enum Shape {
    Chain(usize),
    Tree(usize, usize),
    Binomial(usize),
}

fn generate(shape: &Shape, c: &Common) -> Result<Config, String> {
    let chunk = usize::try_from(c.chunk).map_err(|_| "--chunk is too large".to_string())?;
    let opts = GenOptions {
        source: c
            .source
            .clone()
            .unwrap_or_else(|| format!("gen:{}", config::format_size(c.size))),
        transfer: Transfer {
            chunk_size: chunk,
            slots: c.slots,
            forward: match c.forward {
                ForwardArg::Send => config::Forward::Send,
                ForwardArg::WriteImm => config::Forward::WriteImm,
            },
            check: match c.check {
                CheckArg::Crc32c => srdma_relay::chunk::CheckAlg::Crc32c,
                CheckArg::Xxh3 => srdma_relay::chunk::CheckAlg::Xxh3,
                CheckArg::None => srdma_relay::chunk::CheckAlg::None,
            },
            cm_port: c.cm_port,
            udp_port: c.udp_port,
            timeout_ms: c.timeout_ms,
            mtu: None,
            heal: true,
            topology: config::Topology::Tree,
        },
        base: c.base_addr.octets(),
        out_dir: c.out.clone(),
        ..GenOptions::default()
    };
    match shape {
        Shape::Chain(h) => config::generate_chain(*h, &opts),
        Shape::Tree(f, d) => config::generate_tree(*f, *d, &opts),
        Shape::Binomial(n) => config::generate_binomial(*n, &opts),
    }
    .map_err(|e| e.to_string())
}

fn generate_and_run(shape: Shape, c: &Common, out: &mut impl Write) -> anyhow::Result<bool> {
    let cfg = generate(&shape, c).map_err(crate::UsageError)?;
    if c.print_config {
        write!(out, "{}", cfg.to_toml())?;
        return Ok(true);
    }
    if let Some(d) = &c.out {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let path = std::env::temp_dir().join(format!("srdma-relay-{}.toml", std::process::id()));
    std::fs::write(&path, cfg.to_toml()).with_context(|| format!("writing {}", path.display()))?;
    let exe = std::env::current_exe().context("finding this program to start the nodes")?;
    let topo = match shape {
        Shape::Chain(h) => format!("a {h}-hop chain"),
        Shape::Tree(f, d) => format!("a tree of fanout {f} and depth {d}"),
        Shape::Binomial(n) => format!("a binomial pipeline to {n} sinks"),
    };
    writeln!(
        out,
        "srdma relay: {} nodes on this host ({topo}), {} in {} chunks, {} slots per hop, \
         forward by {}; config {}",
        cfg.nodes.len(),
        launch::source_size(&cfg).map_or("the source".to_string(), human_bytes),
        human_bytes(cfg.transfer.chunk_size as u64),
        cfg.transfer.slots,
        cfg.transfer.forward.as_str(),
        path.display()
    )?;
    for n in &cfg.nodes {
        writeln!(
            out,
            "  {:<4} {:<10} {}  parent {:<4} stages [{}]",
            n.name,
            n.role.as_str(),
            n.addr,
            n.parent.as_deref().unwrap_or("-"),
            n.stages.join(", ")
        )?;
    }
    out.flush()?;
    let path_s = path.display().to_string();
    // Generous: 1 GiB at even 20 MiB/s fits.
    let deadline = Duration::from_secs(120 + launch::source_size(&cfg).unwrap_or(0) / (20 << 20));
    let results = launch::run_all(
        &cfg,
        |name| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "relay", "node", "--config", &path_s, "--name", name, "--json", "--quiet",
            ]);
            cmd
        },
        &LaunchOptions {
            show: !c.quiet,
            deadline,
        },
    )
    .context("starting the nodes")?;
    let _ = std::fs::remove_file(&path);
    writeln!(out)?;
    let mut ok = true;
    for r in &results {
        match &r.report {
            Some(rep) => {
                if c.json {
                    writeln!(out, "{}", rep.json_line())?;
                } else {
                    writeln!(out, "{}", report::human(rep))?;
                }
                ok &= rep.ok && r.code == Some(0);
            }
            None => {
                ok = false;
                writeln!(out, "{}: no report (exit status {:?})", r.name, r.code)?;
            }
        }
        if r.code != Some(0) {
            let err = r.stderr.trim();
            if !err.is_empty() {
                writeln!(out, "  {} said: {}", r.name, err.replace('\n', "\n    "))?;
            }
        }
    }
    let sinks: Vec<&launch::NodeResult> = results
        .iter()
        .filter(|r| cfg.node(&r.name).is_some_and(|n| n.role.has_sink()))
        .collect();
    let src = results.iter().find(|r| r.name == cfg.source().name);
    let src_digest = src
        .and_then(|r| r.report.as_ref())
        .and_then(|r| r.digest.clone());
    writeln!(out)?;
    for s in &sinks {
        let Some(rep) = &s.report else { continue };
        let matches = rep.ok && rep.digest.is_some() && rep.digest == src_digest;
        ok &= matches;
        writeln!(
            out,
            "sink {}: {} at {:.1} MiB/s, digest {} {}",
            s.name,
            human_bytes(rep.bytes),
            rep.throughput_mbps * 1e6 / 8.0 / 1_048_576.0,
            rep.digest.as_deref().unwrap_or("-"),
            if matches {
                "verified (matches the source's)"
            } else if !rep.ok {
                "FAILED, nothing committed"
            } else {
                "DOES NOT MATCH the source's"
            }
        )?;
    }
    writeln!(out, "{}", if ok { "relay: OK" } else { "relay: FAILED" })?;
    Ok(ok)
}
