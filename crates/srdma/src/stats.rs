//! Live statistics of running devices (being written): every open device publishes its
//! counters to a file that `srdma devinfo --stats` reads, as rxe exposes hw counters in sysfs.

use std::net::SocketAddr;
use std::time::Instant;

use crate::device::DeviceCounters;

/// Publishes one device's counters while it is open; removes its file when dropped.
#[derive(Debug)]
pub(crate) struct Publisher {}

impl Publisher {
    /// Starts publishing for the device `name` bound to `local` (None when the statistics
    /// directory cannot be used; the device works without it).
    pub(crate) fn new(_name: &str, _local: SocketAddr) -> Option<Publisher> {
        None
    }

    /// Rewrites the file if the last write is older than a second.
    pub(crate) fn maybe_write(
        &mut self,
        _dev: &DeviceCounters,
        _qp: &srdma_proto::Counters,
        _now: Instant,
    ) {
    }
}

/// A device some process on this host has open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDevice {
    /// Device name.
    pub name: String,
    /// Bound UDP address.
    pub local: SocketAddr,
    /// Owning process.
    pub pid: u32,
    /// Counter name and value (device counters, then the QP transport counters).
    pub counters: Vec<(String, u64)>,
}

/// Every device open on this host (by a live process), from the statistics directory.
pub fn live_devices() -> Vec<LiveDevice> {
    Vec::new()
}
