//! What srdma's integration tests share: opening a device, naming a QP as its peer connects
//! to it, waiting for a completion.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use srdma::{Cq, Device, DeviceConfig, Mtu, RemoteQp, Wc};
use srdma_wire::{Psn, Qpn};

/// Opens a device on `ip`, its configuration adjusted by `tune` first (else the defaults:
/// the RoCEv2 port, the interface's MTU, `$SRDMA_PCAP`, port sharing as the environment says).
pub fn dev_with(ip: &str, tune: impl FnOnce(&mut DeviceConfig)) -> Device {
    let mut c = DeviceConfig::new(ip.parse().unwrap());
    tune(&mut c);
    Device::open(c).unwrap()
}

/// Opens a device on `ip` at UDP `port` (0: a free port of its own) with MTU `mtu`.
pub fn dev(ip: &str, port: u16, mtu: Mtu) -> Device {
    dev_with(ip, |c| {
        c.port = port;
        c.mtu = mtu;
    })
}

/// Opens a device on 127.0.0.1 with a free port of its own and no capture.
pub fn loopback() -> Device {
    dev_with("127.0.0.1", |c| {
        c.port = 0;
        c.pcap = None;
    })
}

/// QP `qpn` of `dev`, as a peer connects to it, its first PSN `psn`.
pub fn remote(dev: &Device, qpn: Qpn, psn: u32) -> RemoteQp {
    RemoteQp {
        qpn,
        psn: Psn::new(psn),
        gid: dev.local_gid(),
        port: dev.local_addr().port(),
    }
}

/// The next completion on `cq`, if one comes within `limit`.
pub fn wait(cq: &Cq, limit: Duration) -> Option<Wc> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Some(wc) = cq.poll_one() {
            return Some(wc);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

/// A child process killed (if still running) and reaped when dropped: a failed test leaves
/// no peer process behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}
