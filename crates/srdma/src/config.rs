//! How to open a device: [`DeviceConfig`], re-exported as `srdma::DeviceConfig` (its
//! constructor and the queries made from it are with the device, in `device`). A leaf
//! module, so that the engine can read the configuration without importing the device.

use std::net::IpAddr;
use std::path::PathBuf;

use srdma_proto::{DeviceLimits, Mtu};

use crate::types::{Gso, ShmPull};

/// How to open a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Device name, as `ibv_devices` would show it.
    pub name: String,
    /// Local address to bind (a specific address: it is part of every packet's ICRC).
    pub addr: IpAddr,
    /// UDP port (4791 for RoCEv2; other ports let several devices share an address).
    pub port: u16,
    /// The port's active MTU (the path MTU RC/UC QPs may use at most; UD's message limit).
    pub mtu: Mtu,
    /// Queue and resource limits.
    pub limits: DeviceLimits,
    /// Write every packet sent and received to this pcap (default: `$SRDMA_PCAP`). A file
    /// another device of this process captures to is not truncated: this device then writes
    /// `NAME-2.EXT` (`-3`, … for the next ones) beside it, and says so on stderr.
    pub pcap: Option<PathBuf>,
    /// When runs of packets to one peer go out as one UDP GSO message (default: `$SRDMA_GSO`,
    /// else [`Gso::Auto`]).
    pub gso: Gso,
    /// On the RoCEv2 port, share the address with this host's other srdma processes (see
    /// the port keeper); false binds the port alone. Default: true
    /// unless `SRDMA_SHARE_PORT=0`.
    pub share_port: bool,
    /// Send to srdma devices of this host (same network namespace, same user) through
    /// shared memory instead of UDP (see [`crate::DeviceCounters::tx_shm_packets`]). Default: true
    /// unless `SRDMA_SHM=0`.
    pub shm: bool,
    /// When READ responses through shared memory leave their payload for the requester to
    /// pull (default: `$SRDMA_SHM_PULL`, else [`ShmPull::Crowded`]).
    pub shm_pull: ShmPull,
    /// Send every RoCEv2 datagram ECN-capable (ECT(0), as RoCE NICs do), so that a switch
    /// that marks congestion marks it instead of dropping it; a peer that sees the mark
    /// answers with a CNP, and this device's QPs slow down by DCQCN's rules. CE marks on what
    /// arrives are read and answered with CNPs either way. Default: true unless `SRDMA_ECN=0`.
    pub ecn: bool,
    /// The buffers to ask the kernel for on the device's UDP socket, bytes each way (default
    /// 8 MiB). It takes at most `net.core.rmem_max` / `wmem_max` and doubles what it takes
    /// (where the limit is 4 MiB, 8 MiB asked is 8 MiB granted; on a stock Debian, 208 KiB,
    /// 416 KiB); a process with CAP_NET_ADMIN gets what it asked for past the limit. Over
    /// UDP the QPs to one peer keep at most half the receive buffer granted in flight
    /// together, taking it for the peer's.
    pub udp_buffer: usize,
}
