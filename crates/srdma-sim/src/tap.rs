//! The pcap tap: what the endpoints sent and what they received, as captures that
//! `srdma decode`, tshark and Wireshark read.

use core::fmt;
use core::net::SocketAddr;
use std::io::{self, Write};
use std::path::Path;

use srdma_wire::pcap::Writer;
use srdma_wire::{Encap, IpRepr};

use crate::time::Instant;

/// Environment variable naming a directory where [`Sim::with_pcap_env`](crate::Sim::with_pcap_env)
/// writes `<name>.pcap` (sent) and `<name>.rx.pcap` (received). Set it when a test fails:
/// `SRDMA_SIM_PCAP_DIR=/tmp/caps cargo test my_test`, then `srdma decode /tmp/caps/my_test.pcap`.
pub const PCAP_DIR_ENV: &str = "SRDMA_SIM_PCAP_DIR";

/// Which of the two captures a writer receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Every datagram an endpoint handed to the network, stamped when it was sent, whatever
    /// its fate (like tcpdump on the sender).
    Tx,
    /// Every datagram handed to an endpoint, stamped on arrival, with any corruption and
    /// duplicates (like tcpdump on the receiver). Drops are what `Tx` has and `Rx` lacks.
    Rx,
}

type Sink = Writer<Box<dyn Write + Send>>;

/// Both captures and the first I/O error, kept rather than raised so a full disk does not
/// change the outcome of the simulation.
#[derive(Default)]
pub(crate) struct Tap {
    tx: Option<Sink>,
    rx: Option<Sink>,
    error: Option<io::Error>,
}

impl fmt::Debug for Tap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tap")
            .field("tx", &self.tx.is_some())
            .field("rx", &self.rx.is_some())
            .field("error", &self.error)
            .finish()
    }
}

impl Tap {
    pub(crate) fn set(&mut self, which: Capture, out: Box<dyn Write + Send>) -> io::Result<()> {
        let w = Some(Writer::new(out)?);
        match which {
            Capture::Tx => self.tx = w,
            Capture::Rx => self.rx = w,
        }
        Ok(())
    }

    pub(crate) fn open(&mut self, which: Capture, path: &Path) -> io::Result<()> {
        let file = std::fs::File::create(path)?;
        self.set(which, Box::new(io::BufWriter::new(file)))
    }

    /// Writes one datagram with IP and UDP headers synthesized from its socket addresses.
    /// A datagram between an IPv4 and an IPv6 address has no IP header and is left out.
    pub(crate) fn record(
        &mut self,
        which: Capture,
        at: Instant,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
    ) {
        let w = match which {
            Capture::Tx => self.tx.as_mut(),
            Capture::Rx => self.rx.as_mut(),
        };
        let (Some(w), Ok(ip)) = (w, IpRepr::between(src.ip(), dst.ip())) else {
            return;
        };
        let encap = Encap {
            ip,
            src_port: src.port(),
            dst_port: dst.port(),
        };
        if let Err(e) = w.write_roce(at.as_nanos(), &encap, payload) {
            self.error.get_or_insert(e);
        }
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        for w in [self.tx.as_mut(), self.rx.as_mut()].into_iter().flatten() {
            if let Err(e) = w.flush() {
                self.error.get_or_insert(e);
            }
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
