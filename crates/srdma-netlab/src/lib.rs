//! Throw-away networks of Linux network namespaces for tests and benchmarks that need
//! several "hosts".
//!
//! [`Lab::star`] builds `n` host namespaces, each with one veth interface `eth0` addressed
//! `10.<net>.0.<i+1>/24`, joined by a bridge in a separate "wire" namespace. Nothing is
//! created in the caller's namespace and only addresses inside the namespaces are used, so
//! a test never sends traffic anywhere else. Dropping the [`Lab`] deletes every namespace
//! (which removes the interfaces with them).
//!
//! Needs root and `ip` (iproute2). [`skip_reason`] says why a test cannot run here
//! (`SRDMA_SKIP_NETNS=1` skips on purpose).
//!
//! Links are shaped per host: [`Lab::rate_limit`] puts a token bucket (`tbf`) on a host's
//! `eth0` (what it sends), [`Lab::rate_limit_all`] on every host, [`Lab::drop_random`] drops
//! a share of the datagrams a host receives (this kernel has no `sch_netem`). In a star every
//! host reaches every other through its own `eth0`, so a chain or tree of processes laid
//! over the hosts gets one shaped link per hop as long as each host sends to one peer.
//!
//! [`process::Proc`] runs a program in a host (through [`Host::command`]) and collects its
//! output lines ([`json::Value`] for JSON ones), memory and exit accounting.

pub mod json;
pub mod process;

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// An error building or changing a lab network: the command that failed and its output.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Why namespaced tests cannot run on this machine, or None when they can.
pub fn skip_reason() -> Option<String> {
    if std::env::var_os("SRDMA_SKIP_NETNS").is_some_and(|v| v == "1") {
        return Some("SRDMA_SKIP_NETNS=1".into());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc_geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) not installed".into());
    }
    None
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs `ip ARGS...`, returning its stdout or an error naming the command and its stderr.
pub fn ip(args: &[&str]) -> Result<String, Error> {
    run("ip", args)
}

/// Runs `prog ARGS...` to completion; an error names the command and its stderr.
pub fn run(prog: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| Error(format!("{prog} {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(Error(format!(
            "{prog} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One host of a lab: a namespace with `eth0` at `addr`.
#[derive(Debug, Clone)]
pub struct Host {
    /// Namespace name.
    pub ns: String,
    /// Address of its `eth0`.
    pub addr: Ipv4Addr,
}

impl Host {
    /// A command that runs `program` inside this host's namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns]).arg(program);
        c
    }

    /// Runs `prog ARGS...` inside the namespace to completion.
    pub fn run(&self, prog: &str, args: &[&str]) -> Result<String, Error> {
        let mut all = vec!["netns", "exec", &self.ns, prog];
        all.extend_from_slice(args);
        ip(&all)
    }
}

/// A set of namespaces joined by a bridge; deleted on drop.
#[derive(Debug)]
pub struct Lab {
    /// The hosts, in creation order.
    pub hosts: Vec<Host>,
    /// The namespace holding the bridge and the hosts' peer ends (`p0`, `p1`, ...).
    pub wire: String,
    namespaces: Vec<String>,
}

static LABS: AtomicU32 = AtomicU32::new(0);

impl Lab {
    /// `n` hosts (`tag`-named namespaces) on one bridged segment `10.<net>.0.0/24`, every
    /// link at `mtu`. `net` picks the subnet (any value; namespaces isolate it).
    pub fn star(tag: &str, n: usize, net: u8, mtu: u32) -> Result<Lab, Error> {
        let seq = LABS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("snl{}-{seq}-{tag}", std::process::id());
        let wire = format!("{prefix}-w");
        let mut lab = Lab {
            hosts: Vec::new(),
            wire: wire.clone(),
            namespaces: Vec::new(),
        };
        lab.add_ns(&wire)?;
        let mtu_s = mtu.to_string();
        lab.in_wire(&["link", "add", "br0", "type", "bridge"])?;
        lab.in_wire(&["link", "set", "br0", "mtu", &mtu_s, "up"])?;
        for i in 0..n {
            let ns = format!("{prefix}-{i}");
            lab.add_ns(&ns)?;
            let peer = format!("p{i}");
            ip(&[
                "-n", &ns, "link", "add", "eth0", "mtu", &mtu_s, "type", "veth", "peer", "name",
                &peer, "mtu", &mtu_s, "netns", &wire,
            ])?;
            let addr = Ipv4Addr::new(10, net, 0, i as u8 + 1);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            lab.in_wire(&["link", "set", &peer, "master", "br0", "up"])?;
            lab.hosts.push(Host { ns, addr });
        }
        Ok(lab)
    }

    fn add_ns(&mut self, ns: &str) -> Result<(), Error> {
        ip(&["netns", "add", ns])?;
        self.namespaces.push(ns.to_string());
        Ok(())
    }

    fn in_wire(&self, args: &[&str]) -> Result<String, Error> {
        let mut all = vec!["-n", &self.wire];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Limits what host `i` sends to `rate` (a tc rate such as `200mbit`) with a token
    /// bucket filter on its `eth0` (256 kB burst, 100 ms of queue).
    pub fn rate_limit(&self, i: usize, rate: &str) -> Result<(), Error> {
        let h = &self.hosts[i];
        run(
            "tc",
            &[
                "-n", &h.ns, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                "burst", "256kb", "latency", "100ms",
            ],
        )
        .map(|_| ())
    }

    /// [`Lab::rate_limit`] on every host: every link of the star sends at most `rate`.
    pub fn rate_limit_all(&self, rate: &str) -> Result<(), Error> {
        (0..self.hosts.len()).try_for_each(|i| self.rate_limit(i, rate))
    }

    /// Removes host `i`'s rate limit (its `eth0` goes back to the default queue).
    pub fn clear_rate_limit(&self, i: usize) -> Result<(), Error> {
        let h = &self.hosts[i];
        match run("tc", &["-n", &h.ns, "qdisc", "del", "dev", "eth0", "root"]) {
            Ok(_) => Ok(()),
            // Nothing to delete: already unlimited.
            Err(e) if e.0.contains("No such file") || e.0.contains("Cannot find") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The `tc -s qdisc` statistics of host `i`'s `eth0` (sent bytes, drops, overlimits).
    pub fn qdisc_stats(&self, i: usize) -> Result<String, Error> {
        let h = &self.hosts[i];
        run("tc", &["-n", &h.ns, "-s", "qdisc", "show", "dev", "eth0"])
    }
}

impl Lab {
    /// Drops `percent`% of the UDP datagrams host `i` receives, at random, with an nftables
    /// rule in its namespace (`numgen random`). This kernel has no `sch_netem`; the rule is the
    /// loss half of `tc netem loss` and needs the `nft` tool (Debian package nftables).
    pub fn drop_random(&self, i: usize, percent: u32) -> Result<(), Error> {
        let ns = &self.hosts[i].ns;
        let nft = |args: &[&str]| {
            let mut all = vec!["netns", "exec", ns, "nft"];
            all.extend_from_slice(args);
            ip(&all)
        };
        let _ = nft(&["delete", "table", "inet", "netlab"]);
        if percent == 0 {
            return Ok(());
        }
        nft(&["add", "table", "inet", "netlab"])?;
        nft(&[
            "add",
            "chain",
            "inet",
            "netlab",
            "in",
            "{ type filter hook input priority 0; }",
        ])?;
        let p = percent.to_string();
        let mut rule = vec![
            "add", "rule", "inet", "netlab", "in", "meta", "l4proto", "udp",
        ];
        if percent < 100 {
            rule.extend_from_slice(&["numgen", "random", "mod", "100", "<", &p]);
        }
        rule.extend_from_slice(&["counter", "drop"]);
        nft(&rule).map(|_| ())
    }

    /// Datagrams dropped so far by [`Lab::drop_random`] on host `i`.
    pub fn dropped(&self, i: usize) -> Result<u64, Error> {
        let out = self.hosts[i].run("nft", &["list", "table", "inet", "netlab"])?;
        Ok(out
            .split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_hosts_reach_each_other_and_vanish_on_drop() {
        if let Some(why) = skip_reason() {
            eprintln!("skipped: {why}");
            return;
        }
        let lab = Lab::star("t", 2, 250, 1500).unwrap();
        // A UDP datagram from host 0 reaches a listener on host 1.
        let b = lab.hosts[1].addr;
        let listen = format!(
            "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);\
             s.bind(('{b}',9));s.settimeout(5);print(s.recv(64).decode())"
        );
        let rx = lab.hosts[1]
            .command("python3")
            .args(["-c", &listen])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let send = format!(
            "import socket,time;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             for _ in range(50): s.sendto(b'hi',('{b}',9)); time.sleep(0.05)"
        );
        let _ = lab.hosts[0].run("python3", &["-c", &send]);
        let out = rx.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "hi");
        if Command::new("nft").arg("--version").output().is_ok() {
            lab.drop_random(1, 100).unwrap();
            let _ = lab.hosts[0].run("python3", &["-c", &send]);
            assert_eq!(lab.dropped(1).unwrap(), 50);
        }
        let names: Vec<String> = lab.hosts.iter().map(|h| h.ns.clone()).collect();
        drop(lab);
        let list = ip(&["netns", "list"]).unwrap();
        for n in names {
            assert!(!list.contains(&n), "{n} left behind");
        }
    }
}
