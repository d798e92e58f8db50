//! Kernel-like sysfs entries for srdma's devices, for the program `srdma exec` runs.
//!
//! A kernel RDMA device (rxe) shows itself in `/sys/class/infiniband/<dev>/` and
//! `/sys/class/infiniband_verbs/uverbsN/`; some programs read those instead of asking
//! libibverbs: rdma-core's pyverbs tests find the device's netdev as the one entry of
//! `/sys/class/infiniband/<dev>/device/net/` (then its address with `ip addr`), and skip their
//! rdma_cm tests without it. srdma's devices have no kernel object, so inside the private mount
//! namespace of [`crate::devnodes`] `srdma exec` mounts a tmpfs on `/sys/class/infiniband` (on
//! `/sys/class`, with every original entry bound back, when that directory does not exist) and
//! writes, for device `<dev>` (the `i`-th of the program's list):
//!
//! - `<dev>/node_type` (`1: CA`), `node_guid`, `sys_image_guid`, `node_desc` (`srdma`; rxe's
//!   is `rxe`), `fw_ver`, and `parent` (the interface, as rxe has it);
//! - `<dev>/ports/1/`: `state` (`4: ACTIVE`), `phys_state` (`5: LinkUp`), `link_layer`
//!   (`Ethernet`), `rate`, `lid`, `sm_lid`, `lid_mask_count`, `sm_sl`, `pkeys/N`, and for each GID
//!   in use `gids/N`, `gid_attrs/types/N` (`RoCE v2`) and `gid_attrs/ndevs/N` (the
//!   interface). rxe has a `gids/N` for every index of its table (1024, unused ones all
//!   zero; their `gid_attrs` fail to read); here the unused indexes are absent (a tmpfs file
//!   takes a page of memory);
//! - `<dev>/device/net/<ifname>`, a link to `/sys/class/net/<ifname>`, when the address is an
//!   interface's: a NIC's device directory lists its netdev there (pyverbs looks), rxe on a
//!   virtual or virtio interface has no `device` (the lab's guest: pyverbs then skips);
//! - `/sys/class/infiniband_verbs/abi_version` (`6`) and `uverbs<i>/ibdev` (`<dev>`),
//!   `uverbs<i>/abi_version` (`2`), as rxe's (no `dev`: the node is a bind of `/dev/null`).
//!
//! The values are those of srdma's library (`ibv_query_device`, `ibv_query_port`,
//! `ibv_query_gid` of a device on UDP 4791). Entries of real devices already there stay; a
//! name taken by one is not written again. When the mount cannot be made the program runs
//! without the entries (a note on stderr); `SRDMA_SYSFS=0` skips all of this.

use std::fmt::Write as _;
use std::path::Path;

use srdma::DeviceConfig;

use crate::devnodes;

/// Writes `text` and a newline into the file `path`.
fn put(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, format!("{text}\n"))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A GUID as sysfs prints it: four groups of four hex digits.
fn guid_str(g: u64) -> String {
    let b = g.to_be_bytes();
    b.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A GID as sysfs prints it: eight groups of four hex digits.
fn gid_str(g: &[u8; 16]) -> String {
    g.chunks(2).fold(String::new(), |mut s, c| {
        if !s.is_empty() {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", c[0], c[1]);
        s
    })
}

/// Writes the entries of device `cfg` into the directory `dir` (`/sys/class/infiniband/<dev>`).
fn write_device(dir: &Path, cfg: &DeviceConfig) -> Result<(), String> {
    let attr = cfg.query_on(cfg.port);
    let pa = cfg.query_port();
    devnodes::mkdir(dir)?;
    put(&dir.join("node_type"), "1: CA")?;
    put(&dir.join("node_guid"), &guid_str(attr.node_guid))?;
    put(&dir.join("sys_image_guid"), &guid_str(attr.node_guid))?;
    // rxe's is its driver's name.
    put(&dir.join("node_desc"), "srdma")?;
    put(&dir.join("fw_ver"), &attr.fw_ver)?;
    let port = dir.join("ports");
    devnodes::mkdir(&port)?;
    let port = port.join("1");
    devnodes::mkdir(&port)?;
    put(&port.join("state"), "4: ACTIVE")?;
    put(&port.join("phys_state"), "5: LinkUp")?;
    put(&port.join("link_layer"), pa.link_layer)?;
    // 1X at 2.5 Gb/s, as `ibv_query_port` reports (and rxe).
    put(&port.join("rate"), "2.5 Gb/sec (1X SDR)")?;
    for (f, v) in [
        ("lid", "0x0"),
        ("sm_lid", "0x0"),
        ("lid_mask_count", "0"),
        ("sm_sl", "0"),
    ] {
        put(&port.join(f), v)?;
    }
    let ifname = srdma::netdev::local_device(cfg.addr).map(|d| d.ifname);
    let gids = cfg.gids_on(cfg.port);
    for d in [
        "gids",
        "pkeys",
        "gid_attrs",
        "gid_attrs/types",
        "gid_attrs/ndevs",
    ] {
        devnodes::mkdir(&port.join(d))?;
    }
    // The entries in use only: rxe has a file for each of the table's 1024, but a tmpfs
    // file takes a page, and programs read the entries `ibv_query_port` lists.
    for (i, g) in gids.iter().enumerate().take(pa.gid_tbl_len as usize) {
        put(&port.join(format!("gids/{i}")), &gid_str(&g.0))?;
        put(&port.join(format!("gid_attrs/types/{i}")), "RoCE v2")?;
        if let Some(n) = &ifname {
            put(&port.join(format!("gid_attrs/ndevs/{i}")), n)?;
        }
    }
    for i in 0..pa.pkey_tbl_len {
        let v = if i == 0 { "0xffff" } else { "0x0000" };
        put(&port.join(format!("pkeys/{i}")), v)?;
    }
    if let Some(n) = &ifname {
        // rxe's `parent`: its netdev.
        put(&dir.join("parent"), n)?;
        let net = dir.join("device/net");
        devnodes::mkdir(&dir.join("device"))?;
        devnodes::mkdir(&net)?;
        let base = n.split(':').next().unwrap_or(n);
        std::os::unix::fs::symlink(format!("/sys/class/net/{base}"), net.join(base))
            .map_err(|e| format!("cannot link {}: {e}", net.join(base).display()))?;
    }
    Ok(())
}

/// Writes `/sys/class/infiniband/<dev>` (into `ib`) for `devices`, leaving names already
/// there alone.
fn write_ib(ib: &Path, devices: &[DeviceConfig]) -> Result<(), String> {
    for cfg in devices {
        let dir = ib.join(&cfg.name);
        if cfg.name.is_empty() || cfg.name.contains('/') || dir.symlink_metadata().is_ok() {
            continue;
        }
        write_device(&dir, cfg)?;
    }
    Ok(())
}

/// Writes `/sys/class/infiniband_verbs/*` (into `verbs`) for `devices`, leaving names
/// already there alone.
fn write_verbs(verbs: &Path, devices: &[DeviceConfig]) -> Result<(), String> {
    if !verbs.join("abi_version").exists() {
        put(&verbs.join("abi_version"), "6")?;
    }
    for (i, cfg) in devices.iter().enumerate() {
        let u = verbs.join(format!("uverbs{i}"));
        if u.symlink_metadata().is_err() {
            devnodes::mkdir(&u)?;
            put(&u.join("ibdev"), &cfg.name)?;
            put(&u.join("abi_version"), "2")?;
        }
    }
    Ok(())
}

/// Gives this process and the program it will exec sysfs entries for `devices` (see the
/// module documentation). Must run while the process has one thread. `Ok(false)`: switched
/// off, or no device.
pub(crate) fn provide(devices: &[DeviceConfig]) -> Result<bool, String> {
    if std::env::var_os("SRDMA_SYSFS").is_some_and(|v| v == "0") || devices.is_empty() {
        return Ok(false);
    }
    devnodes::private_mounts()?;
    let class = Path::new("/sys/class");
    let (ib, verbs) = (class.join("infiniband"), class.join("infiniband_verbs"));
    const OPTS: &str = "mode=755,size=1m";
    if ib.is_dir() {
        // ib_core is loaded (kernel devices, or none): cover its directories one by one.
        if verbs.is_dir() {
            devnodes::cover(&verbs, OPTS, |v| write_verbs(v, devices))?;
        }
        devnodes::cover(&ib, OPTS, |ib| write_ib(ib, devices))?;
        return Ok(true);
    }
    // Neither class exists, and sysfs makes no directories: cover /sys/class.
    devnodes::cover(class, OPTS, |class| {
        let (ib, verbs) = (class.join("infiniband"), class.join("infiniband_verbs"));
        devnodes::mkdir(&ib)?;
        write_ib(&ib, devices)?;
        if !verbs.exists() {
            devnodes::mkdir(&verbs)?;
            write_verbs(&verbs, devices)?;
        }
        Ok(())
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_and_gids_print_as_sysfs_does() {
        assert_eq!(guid_str(0x0200_5eff_fe00_0101), "0200:5eff:fe00:0101");
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = 1;
        assert_eq!(gid_str(&g), "fe80:0000:0000:0000:0000:0000:0000:0001");
    }
}
