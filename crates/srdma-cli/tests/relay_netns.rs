//! srdma-relay over real network stacks: every node of a relay topology runs as its own
//! `srdma relay node --config FILE --name NAME --json` process in its own network namespace
//! (an srdma-netlab star of 4–6 hosts, created and removed by each test), and the tests check
//! what arrives, what every node reports and how it exits.
//!
//! - a chain of three relays (A → B → C → D → E) and a fan-out-2 tree deliver files
//!   byte-identical to every sink;
//! - the same under 2 % loss. This kernel has no `sch_netem`, so "2 % loss" is an nftables
//!   rule in every namespace that drops 2 % of the UDP datagrams the host receives, at random
//!   (`Lab::drop_random`): the loss half of `tc netem loss 2%`, applied at each receiver;
//! - healing: in a 5-hop chain and in a tree of 7, one relay killed with SIGKILL and another
//!   frozen with SIGSTOP mid-transfer; the same with one relay killed under 2 % loss: every
//!   sink commits a byte-identical object, every survivor exits 0 and reports what healed and
//!   what was sent again (each sink: at most two rings; the source: at most a ring per hop);
//! - with healing off, a relay killed with SIGKILL mid-transfer (and one frozen with SIGSTOP):
//!   the source and every node below the relay exit 1 within `timeout_ms` + 3 s, name the
//!   failed hop and say how many bytes reached each sink; the sink leaves no final file;
//! - a binomial pipeline to eight sinks under 2 % loss delivers to every sink;
//! - a sink throttled to a tenth of the link rate slows the source down to its pace, and no
//!   node's peak resident memory (`VmHWM`) passes `2 × slots × chunk_size + allowance`;
//! - one bit flipped in a chunk at a relay is caught, never delivered.
//!
//! Data is 8–64 MiB per test. The tests take one lab at a time (a lock): they measure rates
//! and memory, and two cores shared by two labs would make those figures meaningless. Without
//! root or `ip` (or with `SRDMA_SKIP_NETNS=1`) every test prints why and passes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use srdma_netlab::json::Value;
use srdma_netlab::process::{Exit, Proc, SIGKILL, SIGSTOP};
use srdma_netlab::{Lab, skip_reason};

const MIB: u64 = 1 << 20;

/// Longest any test waits for its nodes to finish.
const RUN_LIMIT: Duration = Duration::from_secs(75);

/// One lab at a time (see the module docs).
static ONE_LAB: Mutex<()> = Mutex::new(());

/// Skips (returning None) when namespaces cannot be made here; otherwise holds the lab lock.
fn lab_guard(needs_nft: bool) -> Option<std::sync::MutexGuard<'static, ()>> {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return None;
    }
    if needs_nft
        && std::process::Command::new("nft")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("skipped: `nft` (nftables) not installed; loss is emulated with it");
        return None;
    }
    Some(ONE_LAB.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A per-test scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("srdma-relaynet-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `len` pseudo-random bytes (xorshift64*, from `seed`) to `path` and returns them.
fn make_input(path: &Path, len: u64, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len as usize + 8);
    while (data.len() as u64) < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        data.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    data.truncate(len as usize);
    std::fs::write(path, &data).unwrap();
    data
}

/// The first offset where two byte strings differ, for messages.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// A node of a test topology, on lab host `host`.
struct Node {
    name: &'static str,
    host: usize,
    role: &'static str,
    parent: Option<&'static str>,
    stages: &'static [&'static str],
    /// Extra `key = value` lines (source, sink, throttle, flip_bit_at_seq).
    extra: Vec<String>,
}

impl Node {
    fn new(
        name: &'static str,
        host: usize,
        role: &'static str,
        parent: Option<&'static str>,
    ) -> Node {
        Node {
            name,
            host,
            role,
            parent,
            stages: &[],
            extra: Vec::new(),
        }
    }

    fn stages(mut self, stages: &'static [&'static str]) -> Node {
        self.stages = stages;
        self
    }

    fn with(mut self, line: String) -> Node {
        self.extra.push(line);
        self
    }

    fn is_sink(&self) -> bool {
        self.role.contains("sink")
    }
}

/// The TOML of the shared relay configuration spec for `nodes` on `lab`'s hosts.
fn config(lab: &Lab, transfer: &[&str], nodes: &[Node]) -> String {
    let mut s = String::from("[transfer]\n");
    for t in transfer {
        s.push_str(t);
        s.push('\n');
    }
    for n in nodes {
        let stages: Vec<String> = n.stages.iter().map(|s| format!("{s:?}")).collect();
        write!(
            s,
            "\n[[node]]\nname = {:?}\naddr = \"{}\"\nrole = {:?}\nstages = [{}]\n",
            n.name,
            lab.hosts[n.host].addr,
            n.role,
            stages.join(", ")
        )
        .unwrap();
        if let Some(p) = n.parent {
            writeln!(s, "parent = {p:?}").unwrap();
        }
        for e in &n.extra {
            writeln!(s, "{e}").unwrap();
        }
    }
    s
}

/// The node processes of one run, in the order of the topology.
struct Run {
    procs: Vec<Proc>,
    started: Instant,
}

impl Run {
    /// Writes the config and starts every node in its namespace, leaves first so that
    /// listeners are up before their parents look for them.
    fn start(lab: &Lab, dir: &Scratch, cfg: &str, nodes: &[Node]) -> Run {
        Run::start_with(lab, dir, cfg, nodes, true)
    }

    /// As [`Run::start`]; without `by_name`, every node gets the same command line and picks
    /// its node from its host's addresses (no `--name`).
    fn start_with(lab: &Lab, dir: &Scratch, cfg: &str, nodes: &[Node], by_name: bool) -> Run {
        let cfg_path = dir.path("relay.toml");
        std::fs::write(&cfg_path, cfg).unwrap();
        let mut procs: Vec<Option<Proc>> = nodes.iter().map(|_| None).collect();
        for (i, n) in nodes.iter().enumerate().rev() {
            let mut cmd = lab.hosts[n.host].command(env!("CARGO_BIN_EXE_srdma"));
            cmd.args(["relay", "node", "--config"])
                .arg(&cfg_path)
                .arg("--json")
                .env_remove("SRDMA_PCAP");
            if by_name {
                cmd.args(["--name", n.name]);
            }
            procs[i] = Some(
                Proc::spawn(n.name, cmd, Some(Duration::from_millis(20)))
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        Run {
            procs: procs.into_iter().map(Option::unwrap).collect(),
            started: Instant::now(),
        }
    }

    fn node(&self, name: &str) -> &Proc {
        self.procs.iter().find(|p| p.name == name).unwrap()
    }

    fn node_mut(&mut self, name: &str) -> &mut Proc {
        self.procs.iter_mut().find(|p| p.name == name).unwrap()
    }

    /// Waits for every node to exit (killing the rest after `limit`, which fails the test
    /// with everything the nodes said).
    fn wait_all(&mut self, limit: Duration) -> Vec<Exit> {
        let until = self.started + limit;
        let mut exits = Vec::new();
        for i in 0..self.procs.len() {
            let left = until.saturating_duration_since(Instant::now());
            match self.procs[i].wait_timeout(left) {
                Some(e) => exits.push(e),
                None => {
                    let name = self.procs[i].name.clone();
                    let dump = self.dump();
                    for p in &mut self.procs {
                        p.kill();
                    }
                    panic!("node {name} still running after {limit:?}\n{dump}");
                }
            }
        }
        exits
    }

    /// The final report line of node `name` (panics, with the dump, when there is none).
    fn report(&self, name: &str) -> Value {
        self.node(name)
            .last_event("report")
            .unwrap_or_else(|| panic!("{name} printed no report line\n{}", self.dump()))
    }

    /// Everything the nodes said, for failure messages.
    fn dump(&self) -> String {
        let mut s = String::new();
        for p in &self.procs {
            let lines = p.lines();
            let tail: Vec<&str> = lines
                .iter()
                .skip(lines.len().saturating_sub(3))
                .map(|l| l.text.as_str())
                .collect();
            let _ = writeln!(
                s,
                "--- {} (pid {}): {} stdout lines, last: {:?}\n    stderr: {}",
                p.name,
                p.pid(),
                lines.len(),
                tail,
                p.stderr().trim_end().replace('\n', "\n            ")
            );
        }
        s
    }
}

/// Checks a run in which every node must succeed: exit 0, every sink's file byte-identical
/// to `input`, every sink's report complete, the source's per-sink map complete. Prints the
/// figures (throughput, retransmissions, relay copies).
fn check_success(run: &mut Run, nodes: &[Node], dir: &Scratch, input: &[u8], label: &str) {
    let exits = run.wait_all(RUN_LIMIT);
    let dump = run.dump();
    for (n, e) in nodes.iter().zip(&exits) {
        assert_eq!(
            e.code,
            Some(0),
            "{label}: node {} exited {e:?}\n{dump}",
            n.name
        );
    }
    let size = input.len() as u64;
    let source = nodes.iter().find(|n| n.role == "source").unwrap();
    let src = run.report(source.name);
    assert_eq!(src.get("ok").as_bool(), Some(true), "{label}: source {src}");
    let mut sinks = 0;
    for n in nodes.iter().filter(|n| n.is_sink()) {
        sinks += 1;
        let out = std::fs::read(dir.path(&format!("out-{}.bin", n.name)))
            .unwrap_or_else(|e| panic!("{label}: sink {} wrote no file: {e}\n{dump}", n.name));
        assert!(
            out == input,
            "{label}: sink {}: {} bytes, expected {size}, first difference at {:?}",
            n.name,
            out.len(),
            first_difference(&out, input)
        );
        let r = run.report(n.name);
        assert_eq!(r.get("ok").as_bool(), Some(true), "{label}: {r}");
        assert_eq!(r.get("bytes").as_u64(), Some(size), "{label}: {r}");
        assert!(r.get("error").is_null(), "{label}: {r}");
        let at_source = src.get("sinks").get(n.name);
        assert_eq!(
            at_source.get("committed").as_bool(),
            Some(true),
            "{label}: source's view of sink {}: {src}",
            n.name
        );
        assert_eq!(
            at_source.get("bytes").as_u64(),
            Some(size),
            "{label}: {src}"
        );
    }
    assert_eq!(
        src.get("sinks").members().len(),
        sinks,
        "{label}: the source reports on every sink and only them: {src}"
    );
    for n in nodes.iter().filter(|n| n.role.starts_with("relay")) {
        let r = run.report(n.name);
        let fwd = r.get("forwarded_bytes").as_u64().unwrap_or(0);
        let copied = r.get("copied_bytes").as_u64().unwrap_or(u64::MAX);
        let children = nodes.iter().filter(|c| c.parent == Some(n.name)).count() as u64;
        assert!(
            fwd >= size * children,
            "{label}: relay {} forwarded {fwd} bytes to {children} children of a {size}-byte object: {r}",
            n.name
        );
        eprintln!(
            "{label}: relay {}: forwarded {fwd} B, copied {copied} B in user space ({:.3} %)",
            n.name,
            copied as f64 * 100.0 / fwd.max(1) as f64
        );
    }
    for n in nodes {
        let r = run.report(n.name);
        eprintln!(
            "{label}: {} {:<10} {:>7.1} Mbit/s, {:.2} s, retransmissions {}, peak RSS {} KiB",
            n.name,
            n.role,
            r.get("throughput_mbps").as_f64().unwrap_or(f64::NAN),
            r.get("seconds").as_f64().unwrap_or(f64::NAN),
            r.get("retransmissions"),
            run.node(n.name).sampled_peak().hwm_kib
        );
    }
}

fn source(host: usize, input: &Path) -> Node {
    Node::new("A", host, "source", None).with(format!("source = \"file:{}\"", input.display()))
}

fn sink(name: &'static str, host: usize, parent: &'static str, dir: &Scratch) -> Node {
    sink_role(name, host, "sink", parent, dir)
}

fn sink_role(
    name: &'static str,
    host: usize,
    role: &'static str,
    parent: &'static str,
    dir: &Scratch,
) -> Node {
    let out = dir.path(&format!("out-{name}.bin"));
    Node::new(name, host, role, Some(parent))
        .stages(&["verify"])
        .with(format!("sink = \"file:{}\"", out.display()))
}

/// A → B → C → D → E: three relays between the source and the sink.
fn chain_of_three_relays(dir: &Scratch, input: &Path) -> Vec<Node> {
    vec![
        source(0, input),
        Node::new("B", 1, "relay", Some("A")).stages(&["verify"]),
        Node::new("C", 2, "relay", Some("B")).stages(&["verify"]),
        Node::new("D", 3, "relay", Some("C")).stages(&["verify"]),
        sink("E", 4, "D", dir),
    ]
}

/// A fan-out-2 tree of depth 3 over six hosts, four sinks:
///
/// ```text
///        A
///      /   \
///     B     C (relay+sink)
///    / \     \
///   D   E     F
/// ```
fn fanout_two_tree(dir: &Scratch, input: &Path) -> Vec<Node> {
    vec![
        source(0, input),
        Node::new("B", 1, "relay", Some("A")).stages(&["verify"]),
        sink_role("C", 2, "relay+sink", "A", dir),
        sink("D", 3, "B", dir),
        sink("E", 4, "B", dir),
        sink("F", 5, "C", dir),
    ]
}

/// Drops 2 % of the UDP datagrams every host receives, at random.
fn two_percent_loss(lab: &Lab) {
    for i in 0..lab.hosts.len() {
        lab.drop_random(i, 2).unwrap();
    }
}

/// Datagrams the loss rules dropped, all hosts together.
fn total_dropped(lab: &Lab) -> u64 {
    (0..lab.hosts.len()).map(|i| lab.dropped(i).unwrap()).sum()
}

/// A chain of three relays delivers a 32 MiB file byte-identical to its sink; every node
/// exits 0 and reports the whole object.
#[test]
fn chain_of_three_relays_delivers_identical_bytes() {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("chain");
    let input = make_input(&dir.path("input.bin"), 32 * MIB, 0x5eed_0001);
    let lab = Lab::star("rchain", 5, 61, 1500).unwrap();
    let nodes = chain_of_three_relays(&dir, &dir.path("input.bin"));
    let cfg = config(&lab, &["chunk_size = \"1MiB\"", "slots = 8"], &nodes);
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    check_success(&mut run, &nodes, &dir, &input, "chain");
}

/// The same command line on every host (no `--name`, as under `srun` or a Kubernetes Job):
/// each node finds itself by its host's address, and the chain delivers.
#[test]
fn one_command_line_for_every_host() {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("samecmd");
    let input = make_input(&dir.path("input.bin"), 8 * MIB, 0x5eed_0007);
    let lab = Lab::star("rsame", 5, 67, 1500).unwrap();
    let nodes = chain_of_three_relays(&dir, &dir.path("input.bin"));
    let cfg = config(&lab, &["chunk_size = \"1MiB\"", "slots = 8"], &nodes);
    let mut run = Run::start_with(&lab, &dir, &cfg, &nodes, false);
    check_success(&mut run, &nodes, &dir, &input, "same command");
}

/// A fan-out-2 tree (six namespaces, four sinks, one of them a relay+sink) delivers a 16 MiB
/// file byte-identical to every sink, relays forwarding by WRITE_WITH_IMM.
#[test]
fn fanout_two_tree_delivers_to_every_sink() {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("tree");
    let input = make_input(&dir.path("input.bin"), 16 * MIB, 0x5eed_0002);
    let lab = Lab::star("rtree", 6, 62, 1500).unwrap();
    let nodes = fanout_two_tree(&dir, &dir.path("input.bin"));
    let cfg = config(
        &lab,
        &[
            "chunk_size = \"1MiB\"",
            "slots = 8",
            "forward = \"write-imm\"",
        ],
        &nodes,
    );
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    check_success(&mut run, &nodes, &dir, &input, "tree");
}

/// The chain under 2 % random datagram loss at every host (see the module docs: nftables,
/// not netem) still delivers identical bytes; the loss really happened.
#[test]
fn chain_under_two_percent_loss() {
    let Some(_lab_lock) = lab_guard(true) else {
        return;
    };
    let dir = Scratch::new("chainloss");
    let input = make_input(&dir.path("input.bin"), 16 * MIB, 0x5eed_0003);
    let lab = Lab::star("rchl", 5, 63, 1500).unwrap();
    two_percent_loss(&lab);
    let nodes = chain_of_three_relays(&dir, &dir.path("input.bin"));
    let cfg = config(&lab, &["chunk_size = \"1MiB\"", "slots = 8"], &nodes);
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    check_success(&mut run, &nodes, &dir, &input, "chain, 2% loss");
    let dropped = total_dropped(&lab);
    eprintln!("chain, 2% loss: {dropped} datagrams dropped");
    assert!(dropped > 0, "the loss rule dropped nothing");
}

/// The fan-out-2 tree under 2 % random datagram loss at every host.
#[test]
fn tree_under_two_percent_loss() {
    let Some(_lab_lock) = lab_guard(true) else {
        return;
    };
    let dir = Scratch::new("treeloss");
    let input = make_input(&dir.path("input.bin"), 8 * MIB, 0x5eed_0004);
    let lab = Lab::star("rtrl", 6, 64, 1500).unwrap();
    two_percent_loss(&lab);
    let nodes = fanout_two_tree(&dir, &dir.path("input.bin"));
    let cfg = config(&lab, &["chunk_size = \"1MiB\"", "slots = 8"], &nodes);
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    check_success(&mut run, &nodes, &dir, &input, "tree, 2% loss");
    let dropped = total_dropped(&lab);
    eprintln!("tree, 2% loss: {dropped} datagrams dropped");
    assert!(dropped > 0, "the loss rule dropped nothing");
}

/// A binomial pipeline from the source to eight sinks (a cube of eight ranks and one twin),
/// one namespace each, under 2 % loss: every sink commits the file.
#[test]
fn binomial_pipeline_to_eight_sinks_under_two_percent_loss() {
    let Some(_lab_lock) = lab_guard(true) else {
        return;
    };
    let dir = Scratch::new("binomial");
    let input = make_input(&dir.path("input.bin"), 16 * MIB, 0x5eed_000c);
    let lab = Lab::star("rbin", 9, 72, 1500).unwrap();
    two_percent_loss(&lab);
    let names = ["B", "C", "D", "E", "F", "G", "H", "I"];
    let mut nodes = vec![source(0, &dir.path("input.bin"))];
    for (i, n) in names.into_iter().enumerate() {
        let out = dir.path(&format!("out-{n}.bin"));
        nodes.push(
            Node::new(n, i + 1, "sink", None)
                .stages(&["verify"])
                .with(format!("sink = \"file:{}\"", out.display())),
        );
    }
    let cfg = config(
        &lab,
        &[
            "chunk_size = \"1MiB\"",
            "slots = 8",
            "topology = \"binomial\"",
        ],
        &nodes,
    );
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    check_success(&mut run, &nodes, &dir, &input, "binomial, 2% loss");
    let dropped = total_dropped(&lab);
    eprintln!("binomial, 2% loss: {dropped} datagrams dropped");
    assert!(dropped > 0, "the loss rule dropped nothing");
}

/// Whether `text` contains `word` standing alone (not inside a longer name, such as the
/// `B` of `MiB`).
fn names_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// The progress `bytes` of a node's latest progress line (0 before the first).
fn progress_bytes(p: &Proc) -> u64 {
    p.last_event("progress")
        .and_then(|v| v.get("bytes").as_u64())
        .unwrap_or(0)
}

/// With healing off: relay B of A → B → C → D is killed with SIGKILL once 4 MiB went through
/// it (of 32 MiB, the source's link limited to 80 Mbit/s so the transfer lasts about 3.5 s).
/// The source and
/// both nodes below B exit 1 within `timeout_ms` + 3 s, each naming B as the failed hop and
/// saying how many bytes reached the sink (less than the object, not committed); the sink
/// reports failure and leaves no file.
#[test]
fn relay_killed_mid_transfer_is_reported() {
    failed_relay("kill", 65, SIGKILL);
}

/// The same with B frozen (SIGSTOP) instead of killed: its connections stay open and its
/// kernel keeps acknowledging TCP, so only the `timeout_ms` "hop is dead" limit can tell.
#[test]
fn relay_frozen_mid_transfer_is_reported() {
    failed_relay("freeze", 68, SIGSTOP);
}

/// The scenario of the two tests above; `signal` is what B gets.
fn failed_relay(label: &str, net: u8, signal: i32) {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new(label);
    let size = 32 * MIB;
    make_input(&dir.path("input.bin"), size, 0x5eed_0005);
    let lab = Lab::star(label, 4, net, 1500).unwrap();
    lab.rate_limit(0, "80mbit").unwrap();
    let nodes = vec![
        source(0, &dir.path("input.bin")),
        Node::new("B", 1, "relay", Some("A")).stages(&["verify"]),
        Node::new("C", 2, "relay", Some("B")).stages(&["verify"]),
        sink("D", 3, "C", &dir),
    ];
    let timeout_ms = 2000;
    let cfg = config(
        &lab,
        &[
            "chunk_size = \"1MiB\"",
            "slots = 4",
            &format!("timeout_ms = {timeout_ms}"),
            "heal = false",
        ],
        &nodes,
    );
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    let b = run.node_mut("B");
    let seen = b.wait_line(Duration::from_secs(40), |l| {
        l.json.as_ref().is_some_and(|j| {
            j.get("event").as_str() == Some("progress")
                && j.get("bytes").as_u64().is_some_and(|n| n >= 4 * MIB)
        })
    });
    assert!(
        seen.is_some(),
        "B never reported 4 MiB of progress\n{}",
        run.dump()
    );
    let at_kill = progress_bytes(run.node("B"));
    assert!(
        at_kill < size,
        "B was done before the {label}: {at_kill}\n{}",
        run.dump()
    );
    // Each survivor's age at the signal, to tell from its exit's age how long it took.
    let age_at_kill: Vec<Duration> = ["A", "C", "D"]
        .iter()
        .map(|n| run.node(n).elapsed())
        .collect();
    run.node("B").signal(signal);
    let bound = Duration::from_millis(timeout_ms) + Duration::from_secs(3);
    let mut took = Vec::new();
    for (name, age) in ["A", "C", "D"].into_iter().zip(age_at_kill) {
        let e = run.node_mut(name).wait_timeout(bound);
        let dump = run.dump();
        let e = e.unwrap_or_else(|| {
            panic!("{label}: {name} still running {bound:?} after B's {label}\n{dump}")
        });
        took.push((name, e.wall.saturating_sub(age)));
        assert_eq!(e.code, Some(1), "{label}: {name} exited {e:?}\n{dump}");
        let stderr = run.node(name).stderr();
        assert!(
            names_word(&stderr, "B"),
            "{label}: {name}'s message does not name the failed hop B: {stderr:?}"
        );
        let r = run.report(name);
        assert_eq!(r.get("ok").as_bool(), Some(false), "{label}: {name}: {r}");
        assert_eq!(
            r.get("failed_hop").as_str(),
            Some("B"),
            "{label}: {name}: {r}"
        );
        assert!(!r.get("error").is_null(), "{label}: {name}: {r}");
        // Every survivor says how much reached the sink, in its report and its message.
        let at_d = r.get("sinks").get("D");
        let n = at_d.get("bytes").as_u64();
        assert!(
            n.is_some_and(|n| n < size),
            "{label}: {name} does not say how many bytes reached D: {r}"
        );
        assert_eq!(
            at_d.get("committed").as_bool(),
            Some(false),
            "{label}: {name}: {r}"
        );
        let n = n.unwrap_or_default().to_string();
        assert!(
            names_word(&stderr, "D") && names_word(&stderr, &n),
            "{label}: {name}'s message does not say that {n} bytes reached D: {stderr:?}"
        );
    }
    let sink_bytes = run.report("D").get("bytes").as_u64().unwrap_or(u64::MAX);
    assert!(sink_bytes < size, "{label}: D got {sink_bytes} of {size}");
    // Nobody can know of more bytes at D than D received.
    for name in ["A", "C"] {
        let view = run.report(name).get("sinks").get("D").get("bytes").as_u64();
        assert!(
            view.is_some_and(|v| v <= sink_bytes),
            "{label}: {name} claims {view:?} bytes reached D, D got {sink_bytes}"
        );
    }
    assert!(
        !dir.path("out-D.bin").exists(),
        "{label}: the sink left a final file for an incomplete object"
    );
    let reached = run.report("A").get("sinks").get("D").get("bytes").as_u64();
    eprintln!(
        "{label}: B stopped after {at_kill} B of progress; survivors exited after {took:?}; \
         the source says {reached:?} B reached D, D says {sink_bytes} B"
    );
    eprintln!("{label}: A says: {}", run.node("A").stderr().trim_end());
}

/// Waits until sink `sink` reported at least `bytes` of progress (panics after 40 s).
fn wait_sink_progress(run: &mut Run, sink: &str, bytes: u64, label: &str) {
    let seen = run.node_mut(sink).wait_line(Duration::from_secs(40), |l| {
        l.json.as_ref().is_some_and(|j| {
            j.get("event").as_str() == Some("progress")
                && j.get("bytes").as_u64().is_some_and(|n| n >= bytes)
        })
    });
    assert!(
        seen.is_some(),
        "{label}: {sink} never reported {bytes} bytes of progress\n{}",
        run.dump()
    );
}

/// A healing scenario: once the last sink has `first` bytes, relay `kill` gets SIGKILL; once
/// it has `second`, relay `freeze` (if any) gets SIGSTOP. Every other node must exit 0, every
/// sink commit a byte-identical object, and every survivor report the heals, in that order,
/// with what was sent again within bounds.
#[allow(clippy::too_many_arguments)]
fn heal_scenario(
    label: &str,
    lab: &Lab,
    dir: &Scratch,
    input: &[u8],
    nodes: &[Node],
    transfer: &[&str],
    (first, kill): (u64, &str),
    freeze: Option<(u64, &str)>,
) {
    let slots = 4u64;
    let chunk = MIB;
    let mut t: Vec<&str> = vec!["chunk_size = \"1MiB\"", "slots = 4", "timeout_ms = 2000"];
    t.extend_from_slice(transfer);
    let cfg = config(lab, &t, nodes);
    let mut run = Run::start(lab, dir, &cfg, nodes);
    let watch = nodes.iter().rev().find(|n| n.is_sink()).unwrap().name;
    wait_sink_progress(&mut run, watch, first, label);
    run.node(kill).signal(SIGKILL);
    let mut gone = vec![kill];
    if let Some((second, frozen)) = freeze {
        wait_sink_progress(&mut run, watch, second, label);
        run.node(frozen).signal(SIGSTOP);
        gone.push(frozen);
    }
    let signalled = Instant::now();
    let mut dump = String::new();
    for n in nodes.iter().filter(|n| !gone.contains(&n.name)) {
        let left = RUN_LIMIT.saturating_sub(signalled.elapsed());
        let e = run.node_mut(n.name).wait_timeout(left);
        dump = run.dump();
        let Some(e) = e else {
            for p in &mut run.procs {
                p.kill();
            }
            panic!(
                "{label}: {} still running {RUN_LIMIT:?} after the signals\n{dump}",
                n.name
            );
        };
        assert_eq!(e.code, Some(0), "{label}: {} exited {e:?}\n{dump}", n.name);
    }
    for g in &gone {
        run.node_mut(g).kill();
    }
    let size = input.len() as u64;
    let depth = |name: &str| {
        let mut d = 0;
        let mut cur = nodes.iter().find(|n| n.name == name).and_then(|n| n.parent);
        while let Some(p) = cur {
            d += 1;
            cur = nodes.iter().find(|n| n.name == p).and_then(|n| n.parent);
        }
        d
    };
    let deepest = nodes.iter().map(|n| depth(n.name)).max().unwrap_or(1);
    for n in nodes.iter().filter(|n| !gone.contains(&n.name)) {
        let r = run.report(n.name);
        assert_eq!(
            r.get("ok").as_bool(),
            Some(true),
            "{label}: {}: {r}",
            n.name
        );
        let healed: Vec<String> = r
            .get("healed")
            .items()
            .iter()
            .flat_map(|h| {
                h.get("nodes")
                    .items()
                    .iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            healed, gone,
            "{label}: {} reports healing around {healed:?}: {r}",
            n.name
        );
        for h in r.get("healed").items() {
            let resent = h.get("resent_chunks").as_u64().unwrap_or(u64::MAX);
            assert!(
                resent <= deepest as u64 * slots,
                "{label}: {}: the source sent {resent} chunks again (at most a ring per hop, \
                 {deepest} hops): {h}",
                n.name
            );
        }
        if n.is_sink() {
            let out = std::fs::read(dir.path(&format!("out-{}.bin", n.name)))
                .unwrap_or_else(|e| panic!("{label}: sink {} wrote no file: {e}\n{dump}", n.name));
            assert!(
                out == input,
                "{label}: sink {}: {} bytes, expected {size}, first difference at {:?}",
                n.name,
                out.len(),
                first_difference(&out, input)
            );
            assert_eq!(r.get("bytes").as_u64(), Some(size), "{label}: {r}");
            let again = r.get("bytes_sent_again").as_u64().unwrap_or(u64::MAX);
            assert!(
                again <= 2 * slots * chunk,
                "{label}: sink {} received {again} bytes again (at most two rings): {r}",
                n.name
            );
            let src = run.report("A");
            let at_source = src.get("sinks").get(n.name);
            assert_eq!(
                at_source.get("committed").as_bool(),
                Some(true),
                "{label}: {at_source}"
            );
        }
    }
    let a = run.report("A");
    eprintln!("{label}: the source reports: healed {}", a.get("healed"));
    eprintln!("{label}: A says: {}", run.node("A").stderr().trim_end());
}

/// A → B → C → D → E → F, five hops: C is killed, then E frozen; F ends up below B and then
/// D, and commits the whole file.
#[test]
fn a_five_hop_chain_heals_around_a_killed_and_a_frozen_relay() {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("healchain");
    let input = make_input(&dir.path("input.bin"), 40 * MIB, 0x5eed_0009);
    let lab = Lab::star("rhc", 6, 69, 1500).unwrap();
    lab.rate_limit(0, "80mbit").unwrap();
    let relay = |name, parent| Node::new(name, 0, "relay", Some(parent)).stages(&["verify"]);
    let mut nodes = vec![
        source(0, &dir.path("input.bin")),
        relay("B", "A"),
        relay("C", "B"),
        relay("D", "C"),
        relay("E", "D"),
        sink("F", 5, "E", &dir),
    ];
    for (i, n) in nodes.iter_mut().enumerate() {
        n.host = i;
    }
    heal_scenario(
        "chain",
        &lab,
        &dir,
        &input,
        &nodes,
        &[],
        (6 * MIB, "C"),
        Some((14 * MIB, "E")),
    );
}

/// A tree of 7 (A; relays B and C; sinks D, E below B and F, G below C): B is killed, then C
/// frozen; all four sinks end up below A and commit the whole file.
#[test]
fn a_tree_of_seven_heals_around_a_killed_and_a_frozen_relay() {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("healtree");
    let input = make_input(&dir.path("input.bin"), 32 * MIB, 0x5eed_000a);
    let lab = Lab::star("rht", 7, 70, 1500).unwrap();
    lab.rate_limit(0, "80mbit").unwrap();
    let nodes = vec![
        source(0, &dir.path("input.bin")),
        Node::new("B", 1, "relay", Some("A")).stages(&["verify"]),
        Node::new("C", 2, "relay", Some("A")).stages(&["verify"]),
        sink("D", 3, "B", &dir),
        sink("E", 4, "B", &dir),
        sink("F", 5, "C", &dir),
        sink("G", 6, "C", &dir),
    ];
    heal_scenario(
        "tree",
        &lab,
        &dir,
        &input,
        &nodes,
        &[],
        (6 * MIB, "B"),
        Some((12 * MIB, "C")),
    );
}

/// The chain of three relays under 2 % loss at every host: C is killed mid-transfer, and the
/// transfer heals around it all the same.
#[test]
fn a_chain_under_two_percent_loss_heals_around_a_killed_relay() {
    let Some(_lab_lock) = lab_guard(true) else {
        return;
    };
    let dir = Scratch::new("healloss");
    let input = make_input(&dir.path("input.bin"), 24 * MIB, 0x5eed_000b);
    let lab = Lab::star("rhl", 5, 71, 1500).unwrap();
    lab.rate_limit(0, "80mbit").unwrap();
    two_percent_loss(&lab);
    let nodes = chain_of_three_relays(&dir, &dir.path("input.bin"));
    heal_scenario(
        "chain, 2% loss",
        &lab,
        &dir,
        &input,
        &nodes,
        &[],
        (6 * MIB, "C"),
        None,
    );
    let dropped = total_dropped(&lab);
    eprintln!("chain, 2% loss, C killed: {dropped} datagrams dropped");
    assert!(dropped > 0, "the loss rule dropped nothing");
}

/// A → B → C → D with every link at 420 Mbit/s (≈ 50 MiB/s) and D consuming at most
/// 5 MiB/s, a tenth of that. Over a 6-second window of a 64 MiB transfer: D's pace is the
/// throttle, the source sends no more than D consumed plus what the rings between them hold,
/// and no node's peak resident memory passes `2 × slots × chunk_size + ALLOWANCE`.
#[test]
fn throttled_sink_slows_the_source_within_bounded_memory() {
    /// Memory every node may use besides its rings: the binary, heap, thread stacks and
    /// the device's packet buffers. Measured: 16.5 MiB peak with 4 × 1 MiB slots and
    /// 20.5 MiB with 8 × 1 MiB (debug build), so about 12.5 MiB without any ring.
    const ALLOWANCE: u64 = 16 * MIB;
    const CHUNK: u64 = MIB;
    const SLOTS: u64 = 4;
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("throttle");
    let size = 64 * MIB;
    make_input(&dir.path("input.bin"), size, 0x5eed_0006);
    let lab = Lab::star("rthr", 4, 66, 1500).unwrap();
    lab.rate_limit_all("420mbit").unwrap();
    let throttle = 5.0 * MIB as f64;
    let nodes = vec![
        source(0, &dir.path("input.bin")),
        Node::new("B", 1, "relay", Some("A")).stages(&["verify"]),
        Node::new("C", 2, "relay", Some("B")).stages(&["verify"]),
        sink("D", 3, "C", &dir).with("throttle = \"5MiB/s\"".into()),
    ];
    let cfg = config(
        &lab,
        &[
            &format!("chunk_size = \"{}MiB\"", CHUNK / MIB),
            &format!("slots = {SLOTS}"),
        ],
        &nodes,
    );
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    // Wait for the data to flow, then watch a 6 s window.
    let first = run.node_mut("D").wait_line(Duration::from_secs(30), |l| {
        l.json.as_ref().is_some_and(|j| {
            j.get("event").as_str() == Some("progress")
                && j.get("bytes").as_u64().is_some_and(|n| n > 0)
        })
    });
    assert!(first.is_some(), "no data reached D\n{}", run.dump());
    std::thread::sleep(Duration::from_secs(1));
    let (a0, d0, t0) = (
        progress_bytes(run.node("A")),
        progress_bytes(run.node("D")),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs(5));
    let (a1, d1, dt) = (
        progress_bytes(run.node("A")),
        progress_bytes(run.node("D")),
        t0.elapsed().as_secs_f64(),
    );
    let dump = run.dump();
    for p in &run.procs {
        assert!(
            p.mem().is_some(),
            "{} ended during the window\n{dump}",
            p.name
        );
    }
    let mut peaks = Vec::new();
    for p in &mut run.procs {
        let live = p.mem().unwrap_or_default().hwm_kib;
        let sampled = p.sampled_peak().hwm_kib;
        // (Not the exit's ru_maxrss: it includes this test process's own peak, see
        // `Exit::max_rss_kib`.)
        p.kill();
        peaks.push((p.name.clone(), live.max(sampled)));
    }
    let d_rate = (d1 - d0) as f64 / dt;
    let a_rate = (a1 - a0) as f64 / dt;
    let in_rings = 3 * SLOTS * CHUNK;
    let bound_kib = (2 * SLOTS * CHUNK + ALLOWANCE) / 1024;
    eprintln!(
        "throttle: D {:.2} MiB/s, A {:.2} MiB/s (throttle {:.2} MiB/s, links ≈ 50 MiB/s); \
         A sent {a1} B, D consumed {d1} B, rings hold {in_rings} B; peak RSS KiB {peaks:?}, \
         bound {bound_kib} KiB",
        d_rate / MIB as f64,
        a_rate / MIB as f64,
        throttle / MIB as f64
    );
    assert!(
        d_rate <= throttle * 1.2 && d_rate >= throttle * 0.5,
        "D's pace {d_rate:.0} B/s is not its throttle {throttle} B/s\n{dump}"
    );
    assert!(
        a_rate <= throttle * 1.25,
        "the source kept sending at {a_rate:.0} B/s, more than the sink's {throttle} B/s\n{dump}"
    );
    assert!(
        a1 <= d1 + in_rings + 2 * CHUNK,
        "the source sent {a1} B while the sink consumed {d1} B: more than the {in_rings} B \
         the rings can hold\n{dump}"
    );
    for (name, kib) in &peaks {
        assert!(
            *kib <= bound_kib,
            "{name}'s peak RSS {kib} KiB is above the bound {bound_kib} KiB"
        );
    }
}

/// Relay B of A → B → C → D flips one payload bit of chunk 5 after its own verify stage.
/// The flip must be caught: the sink never commits a file that differs from the input, and
/// either the chunk is recovered (every node succeeds, the file is identical, and some node
/// names chunk 5 and its checksum failure) or the transfer fails with C (the first node
/// after the flip), the source and the sink naming chunk 5 and the checksum failure, and
/// the sink leaving no file.
#[test]
fn bit_flip_in_a_chunk_is_caught() {
    let Some(_lab_lock) = lab_guard(false) else {
        return;
    };
    let dir = Scratch::new("flip");
    let input = make_input(&dir.path("input.bin"), 8 * MIB, 0x5eed_0007);
    let lab = Lab::star("rflip", 4, 67, 1500).unwrap();
    let nodes = vec![
        source(0, &dir.path("input.bin")),
        Node::new("B", 1, "relay", Some("A"))
            .stages(&["verify"])
            .with("flip_bit_at_seq = 5".into()),
        Node::new("C", 2, "relay", Some("B")).stages(&["verify"]),
        sink("D", 3, "C", &dir),
    ];
    let cfg = config(
        &lab,
        &["chunk_size = \"256KiB\"", "slots = 8", "timeout_ms = 3000"],
        &nodes,
    );
    let mut run = Run::start(&lab, &dir, &cfg, &nodes);
    let exits = run.wait_all(RUN_LIMIT);
    let dump = run.dump();
    let out = std::fs::read(dir.path("out-D.bin")).ok();
    let d = run.report("D");
    if let Some(out) = &out {
        assert!(
            out == &input,
            "CORRUPT DELIVERY: the sink kept a file that differs at {:?}\n{dump}",
            first_difference(out, &input)
        );
    }
    if d.get("ok").as_bool() == Some(true) {
        assert!(out.is_some(), "D reports success without a file\n{dump}");
    }
    // Caught means named: the chunk (5) and what was wrong with it. B flipped the bit after
    // its own verify stage, so the first node that can see it is C.
    let words = ["crc", "checksum", "corrupt", "mismatch"];
    let mentions = |p: &Proc| {
        let mut text = p.stderr().to_lowercase();
        if let Some(r) = p.last_event("report") {
            text.push_str(&r.get("error").to_string().to_lowercase());
        }
        text.contains("chunk 5") && words.iter().any(|w| text.contains(w))
    };
    let all_ok = exits.iter().all(|e| e.code == Some(0));
    if all_ok {
        // Recovered: some node must have said it saw the corruption.
        assert!(
            run.procs.iter().any(mentions),
            "every node succeeded and nobody mentions the flipped bit: was it caught?\n{dump}"
        );
    } else {
        assert_eq!(d.get("ok").as_bool(), Some(false), "{dump}");
        assert!(out.is_none(), "a failed sink left a file\n{dump}");
        assert!(
            mentions(run.node("C")),
            "C, the first node after the flip, does not name the bad chunk 5\n{dump}"
        );
        for name in ["A", "D"] {
            assert!(
                mentions(run.node(name)),
                "{name} failed without naming the bad chunk 5\n{dump}"
            );
        }
        let src = run.report("A");
        assert_eq!(src.get("ok").as_bool(), Some(false), "{src}");
        assert_eq!(
            src.get("sinks").get("D").get("committed").as_bool(),
            Some(false),
            "{src}"
        );
    }
    eprintln!(
        "flip: exits {:?}; D: {d}",
        exits.iter().map(|e| e.code).collect::<Vec<_>>()
    );
}
