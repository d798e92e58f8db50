//! Transmit: a QP's packets into the send batch (payloads straight from registered memory
//! where they can), and whether a destination takes UDP GSO.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use srdma_proto::Ctx;
use srdma_wire::{Encap, IpRepr, Packet};

use super::probe::PathGso;
use super::timers::note_timer;
use super::{Shared, State, capture_epoch, deliver_completions};
use crate::memory::Store;
use crate::types::{Gid, Gso};

impl Shared {
    pub(super) fn encap_to(&self, dst: SocketAddr, sport: u16) -> Option<Encap> {
        let ip = IpRepr::between(self.local.ip(), dst.ip()).ok()?;
        Some(Encap {
            ip,
            src_port: sport,
            dst_port: dst.port(),
        })
    }

    /// Sends everything QP `qpn` has to send, then hands its completions to its CQs.
    pub(crate) fn flush(&self, st: &mut State, qpn: u32) {
        let now = self.now();
        self.probe_path(st, qpn, now);
        let State {
            mrs,
            mem,
            qps,
            srqs,
            counters,
            capture,
            tx,
            paths,
            tx_icrc,
            shm,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        let now_ns = now.as_nanos() as u64;
        let ack_tail = slot.ack_tail();
        let fd = self.socket.as_raw_fd();
        // Payload goes to the socket straight from registered memory, except when a capture
        // wants each packet whole.
        let zero_copy = capture.is_none();
        // Whether the last destination may take GSO (one lookup per destination, not per
        // packet: an RC or UC QP sends to one).
        let mut gso_dst: Option<(SocketAddr, bool)> = None;
        loop {
            if tx.is_full() {
                counters.tx_errors += tx.send(fd) as u64;
            }
            let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
            mem.deferring = zero_copy;
            mem.pieces.clear();
            let mut ctx = Ctx { now, mrs, mem, srq };
            let t = slot.qp.poll_transmit(&mut ctx, tx.slot());
            mem.deferring = false;
            let Some(t) = t else {
                break;
            };
            let dst = SocketAddr::new(Gid(t.dest.dgid).ip(), t.dest.udp_dport);
            // The QP names the rxe-style entropy source port, but the socket sends from its
            // bound port, and the ICRC must cover what goes on the wire.
            let Some(encap) = self.encap_to(dst, self.local.port()) else {
                counters.tx_errors += 1;
                continue;
            };
            if let Some(shm) = shm.as_mut() {
                let pkt = tx.slot();
                let dqpn = u32::from_be_bytes([0, pkt[5], pkt[6], pkt[7]]);
                if let Some(link) = shm.route(dst, dqpn, now_ns) {
                    if slot.path != crate::Path::SharedMemory {
                        // A ring holds the largest window: no need to grow into it.
                        slot.path = crate::Path::SharedMemory;
                        slot.qp.path_holds_window();
                    }
                    if let Some(w) = capture.as_mut() {
                        // Captured whole (no pieces while capturing), with its ICRC.
                        let pkt = &mut pkt[..t.len];
                        let _ =
                            Packet::new_unchecked(&mut *pkt).fill_icrc_with_memo(&encap, tx_icrc);
                        let _ = w.write_roce(now_ns + capture_epoch(), &encap, pkt);
                    }
                    let base = pkt.as_ptr() as usize;
                    let pkt = &pkt[..t.len];
                    shm.push(link, t.len, |out| assemble(out, pkt, base, mem));
                    continue;
                }
            }
            slot.path = crate::Path::Udp;
            // A bare ACK is the short tail of a GSO message only where `QpSlot::ack_tail`
            // says so; otherwise it goes as its own datagram.
            let bare_ack = tx.slot()[0] == srdma_wire::Opcode::RcAcknowledge as u8;
            let dst_gso = match gso_dst {
                Some((d, g)) if d == dst => g,
                _ => {
                    let g = self.gso_for(paths, dst);
                    gso_dst = Some((dst, g));
                    g
                }
            };
            let gso = dst_gso && (ack_tail || !bare_ack);
            if !mem.pieces.is_empty() {
                match commit_zero_copy(tx, mem, tx_icrc, &encap, t.len, dst, gso) {
                    ZeroCopy::Queued => {
                        counters.tx_datagrams += 1;
                        continue;
                    }
                    ZeroCopy::Copied => {}
                    ZeroCopy::Failed => {
                        // Never send a packet whose payload is not all there.
                        counters.tx_errors += 1;
                        continue;
                    }
                }
            }
            let pkt = &mut tx.slot()[..t.len];
            if Packet::new_unchecked(&mut *pkt)
                .fill_icrc_with_memo(&encap, tx_icrc)
                .is_err()
            {
                counters.tx_errors += 1;
                continue;
            }
            if let Some(w) = capture.as_mut() {
                let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &encap, pkt);
            }
            tx.commit(t.len, dst, gso);
            counters.tx_datagrams += 1;
        }
        if tx.len() > 0 {
            counters.tx_errors += tx.send(fd) as u64;
        }
        counters.tx_gso_messages = tx.gso_messages;
        if let Some(shm) = shm.as_mut() {
            shm.ring_bells();
            shm.count_into(counters);
        }
        deliver_completions(slot);
        note_timer(&mut st.next_timer, slot);
        self.probe_answered(st, qpn, now);
    }

    /// Whether datagrams to `dst` may go as GSO messages.
    fn gso_for(
        &self,
        paths: &std::collections::HashMap<std::net::IpAddr, PathGso>,
        dst: SocketAddr,
    ) -> bool {
        match self.cfg.gso {
            Gso::Never => false,
            Gso::Always => true,
            Gso::Local => self.uncut(dst),
            Gso::Auto => self.uncut(dst) || paths.get(&dst.ip()) == Some(&PathGso::Verified),
        }
    }

    /// True when a GSO message to `dst` is never cut with IPv4 IDs that matter: IPv6 has
    /// none, and this host's addresses are reached over loopback, which does not cut.
    pub(super) fn uncut(&self, dst: SocketAddr) -> bool {
        dst.is_ipv6() || dst.ip().is_loopback() || dst.ip() == self.local.ip()
    }
}

/// What became of a packet built with its payload left in registered memory.
enum ZeroCopy {
    /// Queued, sent from the pieces.
    Queued,
    /// The pieces were copied into the slot: send it as an ordinary packet.
    Copied,
    /// The payload could not be assembled: drop the packet (the transport retransmits).
    Failed,
}

/// Payloads up to this many bytes are copied into the packet rather than sent from the
/// registered memory (see `commit_zero_copy`).
const COPY_BELOW: usize = 512;

/// Most iovecs a packet is sent from without copying its payload (up to four pieces of
/// registered memory, more are copied into the slot); at most [`crate::udp::MAX_PARTS`].
const ZERO_COPY_PARTS: usize = 9;
const _: () = assert!(ZERO_COPY_PARTS <= crate::udp::MAX_PARTS);

/// Queues the packet in the current slot of `tx` — headers and pad there, payload pieces in
/// registered memory (noted by the store while the packet was built) — computing its ICRC
/// across the pieces. When it cannot go out that way (too many pieces), or the payload is
/// at most [`COPY_BELOW`] bytes, the pieces are copied into the slot instead.
fn commit_zero_copy(
    tx: &mut crate::udp::TxBatch,
    mem: &Store,
    memo: &mut srdma_wire::icrc::Memo,
    encap: &Encap,
    len: usize,
    dst: SocketAddr,
    gso: bool,
) -> ZeroCopy {
    const ICRC: usize = srdma_wire::icrc::ICRC_LEN;
    let slot = tx.slot();
    let base = slot.as_ptr() as usize;
    // A small payload is cheaper copied than sent as iovecs of its own (the kernel imports
    // and copies each piece separately).
    if mem.pieces.iter().map(|p| p.len).sum::<usize>() <= COPY_BELOW {
        return materialize(slot, base, mem);
    }
    // A piece and the headers or gap before it, and the tail: few enough for a small array
    // (one per packet: a `MAX_PARTS` array cost a 640-byte `memset` each, 1 % of a sender).
    let mut parts = [(std::ptr::null::<u8>(), 0usize); ZERO_COPY_PARTS];
    let mut n = 0;
    let fits = 2 * mem.pieces.len() < ZERO_COPY_PARTS && len >= srdma_wire::bth::BTH_LEN + ICRC;
    let hasher = fits
        .then(|| srdma_wire::icrc::Hasher::with_memo(encap, len - ICRC, &slot[..len], memo).ok())
        .flatten();
    let Some(mut h) = hasher else {
        return materialize(slot, base, mem);
    };
    let mut at = srdma_wire::bth::BTH_LEN;
    let mut gap = 0;
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        let src = mem.piece(p);
        let (Some(src), true) = (src, off >= at && off + p.len <= len - ICRC) else {
            return materialize(slot, base, mem);
        };
        h.update(&slot[at..off]);
        h.update(src);
        if off > gap {
            parts[n] = (slot[gap..].as_ptr(), off - gap);
            n += 1;
        }
        parts[n] = (src.as_ptr(), src.len());
        n += 1;
        at = off + p.len;
        gap = at;
    }
    h.update(&slot[at..len - ICRC]);
    slot[len - ICRC..len].copy_from_slice(&h.finish().to_le_bytes());
    parts[n] = (slot[gap..].as_ptr(), len - gap);
    n += 1;
    tx.commit_parts(len, dst, gso, parts[..n].iter().copied());
    ZeroCopy::Queued
}

/// Writes the packet `slot` stands for into `out` (as long as the packet): its headers and
/// gaps from `slot` (whose address is `base`), the payload pieces noted while it was built
/// from registered memory. False when a piece is gone (the packet must not leave).
fn assemble(out: &mut [u8], slot: &[u8], base: usize, mem: &Store) -> bool {
    let len = out.len();
    let mut at = 0;
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        let (Some(src), true) = (mem.piece(p), off >= at && off + p.len <= len) else {
            return false;
        };
        out[at..off].copy_from_slice(&slot[at..off]);
        out[off..off + p.len].copy_from_slice(src);
        at = off + p.len;
    }
    out[at..].copy_from_slice(&slot[at..len]);
    true
}

/// Copies noted payload pieces into the packet buffer they stand for.
fn materialize(slot: &mut [u8], base: usize, mem: &Store) -> ZeroCopy {
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        match (mem.piece(p), slot.get_mut(off..off.saturating_add(p.len))) {
            (Some(src), Some(dst)) => dst.copy_from_slice(src),
            _ => return ZeroCopy::Failed,
        }
    }
    ZeroCopy::Copied
}
