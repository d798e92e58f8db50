//! The interface between the engine and its packet drivers: what the UDP driver (`udp`) and
//! the shared-memory driver (`shm`) both do for it, with nothing of the engine, the device
//! or its configuration in it (quinn's split between quinn-proto and quinn-udp).
//!
//! A driver routes (does it carry packets to this destination?), queues outgoing packets
//! given their built bytes and the payload pieces left in registered memory (what it does
//! with them is its business: UDP computes the ICRC and sends the pieces as iovecs, shm
//! copies them into a ring once and leaves the ICRC out), flushes (`sendmmsg`, doorbells),
//! receives batches, and counts. The engine asks shm first, then UDP; dispatch is static.

use std::net::SocketAddr;

use srdma_wire::Encap;

use crate::types::DeviceCounters;

/// A buffer one outgoing packet is built in, as long as the longest packet
/// (`MAX_PACKET_LEN`). The engine owns one; a driver that keeps a packet until it is
/// flushed (UDP, whose batch sends from it) takes the buffer and gives another, free one
/// back in exchange ([`Driver::queue`]): no byte is copied.
pub(crate) type Frame = Vec<u8>;

/// How a received packet arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via<'h> {
    /// A UDP datagram, at this place in its GRO buffer, with the ECN codepoint it arrived
    /// with.
    Udp {
        /// Its place in its GRO buffer.
        place: u16,
        /// The ECN bits of its IP header (3: congestion experienced).
        ecn: u8,
    },
    /// A ring of the shared-memory driver, with a private copy of the packet's first
    /// [`srdma_wire::MAX_HEADER_LEN`] bytes: the packet lies in memory the peer shares, so
    /// its headers are parsed from the copy (`PacketRepr::parse_head`) and its payload
    /// copied from where it lies (see `shm::Shm::drain`).
    SharedMemory(&'h [u8]),
    /// A ring of the shared-memory driver, whose packet's payload stayed in its sender's
    /// memory (see `crate::pull`): the private copy of its headers and where the payload
    /// is; the packet's bytes handed with it are empty.
    Pulled(&'h [u8], Pulled<'h>),
}

/// Where the payload of a packet that came without it is: in process `pid`, at `spans`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pulled<'h> {
    /// The packet's length, payload included.
    pub(crate) len: usize,
    /// The sender's process.
    pub(crate) pid: i32,
    /// (address, length) in the sender's process, in payload order.
    pub(crate) spans: &'h [crate::pull::Span],
}

/// The payload of an outgoing packet that stayed in registered memory while the packet was
/// built (zero copy): pieces, in packet order, each standing for bytes of the [`Frame`] the
/// packet was built in (which holds headers, gaps and pad around them).
pub(crate) trait Payload {
    /// How many pieces (0: the packet is whole in its frame).
    fn count(&self) -> usize;
    /// Where piece `i` belongs: the address in the frame of its first byte, and its length.
    fn place(&self, i: usize) -> (usize, usize);
    /// Piece `i`'s bytes; `None` once its memory is gone (the packet must not leave).
    fn bytes(&self, i: usize) -> Option<&[u8]>;
}

/// A packet whose payload is all in its frame.
pub(crate) struct Whole;

impl Payload for Whole {
    fn count(&self) -> usize {
        0
    }

    fn place(&self, _: usize) -> (usize, usize) {
        (0, 0)
    }

    fn bytes(&self, _: usize) -> Option<&[u8]> {
        None
    }
}

/// One built packet for [`Driver::queue`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    /// Its length: the frame's first `len` bytes, pieces included, ICRC last.
    pub(crate) len: usize,
    /// Where it goes.
    pub(crate) dst: SocketAddr,
    /// Its RoCEv2 encapsulation, which its ICRC covers.
    pub(crate) encap: &'a Encap,
    /// Whether it may go in one segmented message with its neighbours to the same
    /// destination (UDP GSO); drivers that do not segment ignore it.
    pub(crate) gso: GsoJoin,
    /// Its payload pieces stay where they are until the receiver is done with them (a READ
    /// response: the responder's application leaves its memory alone while its READ is
    /// outstanding): a driver whose peer may read this process's memory may send where
    /// they are instead of the bytes (see `crate::pull`).
    pub(crate) pullable: bool,
}

/// How a datagram may share a UDP GSO message (one segmented send: one skb through the
/// stack, cut into datagrams of one size but the last, which may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GsoJoin {
    /// It goes as a message of its own.
    Alone,
    /// It may start a run, continue one of its size, or be a run's shorter last datagram.
    Any,
    /// It may start a run or continue one of its own size, never be the shorter tail
    /// behind larger datagrams (a bare ACK that must not wait behind a request, see
    /// `QpSlot::ack_tail`, may still go in one message with other QPs' ACKs to that peer).
    SameSize,
}

/// What one [`Driver::recv`] took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    /// Buffers (UDP: each may hold a GRO run) or packets (shm) taken: 0 when none waited.
    pub(crate) taken: usize,
    /// The batch was full: more may be waiting.
    pub(crate) full: bool,
    /// Buffers dropped unread because their source could not be read (malformed).
    pub(crate) unreadable: usize,
}

/// A packet driver.
pub(crate) trait Driver {
    /// Where a routed packet goes (UDP: anywhere, `()`; shm: one of its links).
    type Link: Copy;

    /// Whether this driver carries packets to QP `dqpn` at `dst` (`now`: ns since the
    /// engine's epoch), and by which link.
    fn route(&mut self, dst: SocketAddr, dqpn: u32, now: u64) -> Option<Self::Link>;

    /// True when the next packet might not fit: [`Driver::flush`] before queueing it.
    fn is_full(&self) -> bool {
        false
    }

    /// Queues `pkt`, built in `frame` with its payload pieces (`payload`) still in
    /// registered memory, on `link`; the driver puts the ICRC in if its medium needs one. A
    /// driver that sends from the frame later swaps it for a free one. False when the
    /// packet was dropped (a piece was gone, a ring full, the ICRC could not be computed).
    fn queue(
        &mut self,
        link: Self::Link,
        pkt: &Outgoing<'_>,
        frame: &mut Frame,
        payload: &impl Payload,
    ) -> bool;

    /// Sends what was queued (`sendmmsg`, doorbells); returns how many packets were
    /// refused.
    fn flush(&mut self) -> usize;

    /// Receives a batch, handing each packet to `f` with its source and how it arrived.
    fn recv(&mut self, f: impl FnMut(SocketAddr, &[u8], Via<'_>)) -> Received;

    /// Copies the driver's own counters (totals) into the device's.
    fn count_into(&self, c: &mut DeviceCounters);
}
