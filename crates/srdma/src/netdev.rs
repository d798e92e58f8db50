//! The devices srdma offers on this host: one per address of every interface that is up, as
//! rxe binds a device to a netdev. `srdma_<ifname>` names an interface's first address (IPv4
//! before IPv6), `srdma_<ifname>_<k>` its k-th further one. IPv6 link-local addresses are left
//! out (a device cannot bind them without a scope). Loopback devices come last, so that the
//! first device, which most programs open, is reachable from other hosts. `srdma devinfo`
//! lists them all; the drop-in libibverbs lists them too ([`device_list`]), but for the
//! loopback devices when another interface has an address (every host has a `srdma_lo` on
//! 127.0.0.1, which a program would take for a path to its peer).

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{DeviceConfig, Mtu};

/// A local address srdma can open a device on, named as rxe would name its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalDev {
    /// `srdma_<ifname>` or `srdma_<ifname>_<k>`.
    pub name: String,
    /// The interface.
    pub ifname: String,
    /// The address.
    pub addr: IpAddr,
    /// The interface's MTU (1500 when it cannot be read).
    pub netdev_mtu: u32,
}

impl LocalDev {
    /// A configuration for this device on UDP `port`: its name, no capture, and the active
    /// MTU the engine gives the interface (rxe's rule).
    pub fn config(&self, port: u16) -> DeviceConfig {
        let mut cfg = DeviceConfig::new(self.addr);
        cfg.name = self.name.clone();
        cfg.port = port;
        cfg.pcap = None;
        cfg
    }

    /// The active MTU rxe derives from this interface's MTU.
    pub fn active_mtu(&self) -> Mtu {
        Mtu::for_netdev_mtu(self.netdev_mtu).unwrap_or(Mtu::Mtu256)
    }
}

/// Every address of every interface that is up, as devices (see the module doc).
pub fn local_devices() -> std::io::Result<Vec<LocalDev>> {
    let mut per_if: Vec<(String, Vec<IpAddr>)> = Vec::new();
    for (ifname, addr) in interface_addresses()? {
        if let IpAddr::V6(v6) = addr {
            // fe80::/10 needs a scope id to bind; multicast is not an interface address.
            if v6.segments()[0] & 0xffc0 == 0xfe80 || v6.is_multicast() {
                continue;
            }
        }
        match per_if.iter_mut().find(|(n, _)| *n == ifname) {
            Some((_, addrs)) => {
                if !addrs.contains(&addr) {
                    addrs.push(addr);
                }
            }
            None => per_if.push((ifname, vec![addr])),
        }
    }
    let mut out = Vec::new();
    for (ifname, mut addrs) in per_if {
        // Stable: IPv4 first, otherwise in the kernel's order.
        addrs.sort_by_key(|a| a.is_ipv6());
        let netdev_mtu = netdev_mtu(&ifname).unwrap_or(1500);
        for (k, addr) in addrs.into_iter().enumerate() {
            let name = match k {
                0 => format!("srdma_{ifname}"),
                k => format!("srdma_{ifname}_{k}"),
            };
            out.push(LocalDev {
                name,
                ifname: ifname.clone(),
                addr,
                netdev_mtu,
            });
        }
    }
    // Loopback last: programs open the first device (ibv_rc_pingpong, perftest, pyverbs),
    // and a loopback GID announced to a peer on another host leads nowhere.
    out.sort_by_key(|d| d.addr.is_loopback());
    Ok(out)
}

/// The devices srdma's drop-in library lists: those of `list` (`SRDMA_DEVICES`' syntax:
/// entries `[NAME=]ADDRESS[:PORT]` separated by commas, blanks or lines, `#` starting a
/// comment) when it is given and not blank, else of the file `SRDMA_CONFIG` names (default
/// `/etc/srdma/devices.conf`) if it can be read, else one per local interface address
/// ([`local_devices`], on UDP 4791) without the loopback ones when another interface has an
/// address: with it, a program's rdma_cm resolves 127.x destinations as the kernel does on
/// a host without an RDMA device on `lo` (the first device, its own address). A name left out is the interface rule's for a local
/// address, else `srdma<k>`. Entries that do not parse are left out, with a note on stderr
/// unless `quiet`.
pub fn device_list(list: Option<&str>, quiet: bool) -> Vec<DeviceConfig> {
    let local = local_devices().unwrap_or_default();
    let text = match list.filter(|v| !v.trim().is_empty()) {
        Some(v) => v.to_string(),
        None => {
            let path =
                std::env::var("SRDMA_CONFIG").unwrap_or_else(|_| "/etc/srdma/devices.conf".into());
            match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(_) => {
                    let others = local.iter().any(|d| !d.addr.is_loopback());
                    return local
                        .iter()
                        .filter(|d| !(others && d.addr.is_loopback()))
                        .map(|d| d.config(crate::ROCEV2_PORT))
                        .collect();
                }
            }
        }
    };
    let mut out = Vec::new();
    for (k, entry) in text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split(|c: char| c == ',' || c.is_whitespace()))
        .filter(|e| !e.is_empty())
        .enumerate()
    {
        let (name, addr) = match entry.split_once('=') {
            Some((n, a)) => (Some(n.to_string()), a),
            None => (None, entry),
        };
        let (ip, port) = if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
            (sa.ip(), sa.port())
        } else if let Ok(ip) = addr.trim_matches(['[', ']']).parse::<IpAddr>() {
            (ip, crate::ROCEV2_PORT)
        } else {
            if !quiet {
                eprintln!("srdma: ignoring device entry {entry:?}: not [NAME=]ADDRESS[:PORT]");
            }
            continue;
        };
        let mut cfg = match local.iter().find(|d| d.addr == ip) {
            Some(d) => d.config(port),
            None => {
                let mut c = DeviceConfig::new(ip);
                c.name = format!("srdma{k}");
                c.port = port;
                c
            }
        };
        if let Some(n) = name {
            cfg.name = n;
        }
        out.push(cfg);
    }
    out
}

/// The device on `addr`, if `addr` is a local interface address.
pub fn local_device(addr: IpAddr) -> Option<LocalDev> {
    local_devices().ok()?.into_iter().find(|d| d.addr == addr)
}

/// The MTU of interface `ifname` (`/sys/class/net/<if>/mtu`; an alias `eth0:1` is `eth0`'s).
fn netdev_mtu(ifname: &str) -> Option<u32> {
    let base = ifname.split(':').next().unwrap_or(ifname);
    if base.is_empty() || base.contains('/') || base.starts_with('.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{base}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// (interface name, address) of every IPv4 and IPv6 address of an interface that is up, in
/// `getifaddrs` order.
fn interface_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success it owns a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, which is not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null()
            || ifa.ifa_name.is_null()
            || ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0
        {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points at a sockaddr of at least the size its
        // family implies; unaligned reads make no assumption about its alignment.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin: libc::sockaddr_in = std::ptr::read_unaligned(ifa.ifa_addr.cast());
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6: libc::sockaddr_in6 = std::ptr::read_unaligned(ifa.ifa_addr.cast());
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // SAFETY: `ifa_name` is a non-null NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push((name, ip));
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it survives.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
