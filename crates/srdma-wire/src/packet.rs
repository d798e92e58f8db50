//! A whole RoCEv2 packet (the UDP payload): BTH, extension headers, payload, pad, ICRC.

use crate::aeth::{Aeth, AethRepr};
use crate::atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
use crate::bth::{BTH_LEN, Bth, BthRepr};
use crate::deth::{Deth, DethRepr};
use crate::icrc::{self, ICRC_LEN};
use crate::imm::{Ieth, ImmDt};
use crate::ip::Encap;
use crate::opcode::{Headers, Opcode, PayloadRule};
use crate::reth::{Feth, FethRepr, Reth, RethRepr};
use crate::{Error, Result};
use core::ops::Range;

/// Smallest RoCEv2 packet: a BTH and an ICRC.
pub const MIN_PACKET_LEN: usize = BTH_LEN + ICRC_LEN;

/// The longest headers (BTH and extension headers) any opcode carries: a
/// [`PacketRepr::parse_head`] needs no more of a packet.
pub const MAX_HEADER_LEN: usize = {
    let mut max = 0;
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let hl = Opcode::ALL[i].header_len();
        if hl > max {
            max = hl;
        }
        i += 1;
    }
    max
};

/// A zero-copy view of a whole RoCEv2 packet.
///
/// [`Packet::new_checked`] validates the structure once — TVer 0, a known opcode, room for
/// every header its opcode carries and for the ICRC, a pad count that fits the payload, no
/// payload where the opcode allows none — after which no accessor panics. Rules that need the
/// path MTU are the responder's ([`Opcode::check_payload_len`]); the ICRC needs the IP header
/// ([`Packet::verify_icrc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors may panic on malformed input.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Validates the structure (see the type's documentation).
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        check_structure(b, b.len())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole packet.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The BTH.
    #[inline]
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.buffer.as_ref()[..BTH_LEN])
    }

    /// The opcode. Panics only on an unchecked packet with an unknown opcode.
    pub fn opcode(&self) -> Opcode {
        self.bth()
            .opcode()
            .expect("Packet::check_len validated the opcode")
    }

    fn header(&self, h: Headers, len: usize) -> Option<&[u8]> {
        let off = BTH_LEN + self.opcode().headers().offset_of(h)?;
        Some(&self.buffer.as_ref()[off..off + len])
    }

    /// The DETH, if the opcode carries one.
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.header(Headers::DETH, 8).map(Deth::new_unchecked)
    }
    /// The FETH, if the opcode carries one.
    pub fn feth(&self) -> Option<Feth<&[u8]>> {
        self.header(Headers::FETH, 4).map(Feth::new_unchecked)
    }
    /// The RETH, if the opcode carries one.
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.header(Headers::RETH, 16).map(Reth::new_unchecked)
    }
    /// The AtomicETH, if the opcode carries one.
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.header(Headers::ATOMIC_ETH, 28)
            .map(AtomicEth::new_unchecked)
    }
    /// The ImmDt, if the opcode carries one.
    pub fn imm_dt(&self) -> Option<ImmDt<&[u8]>> {
        self.header(Headers::IMM_DT, 4).map(ImmDt::new_unchecked)
    }
    /// The IETH, if the opcode carries one.
    pub fn ieth(&self) -> Option<Ieth<&[u8]>> {
        self.header(Headers::IETH, 4).map(Ieth::new_unchecked)
    }
    /// The AETH, if the opcode carries one.
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.header(Headers::AETH, 4).map(Aeth::new_unchecked)
    }
    /// The AtomicAckETH, if the opcode carries one.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.header(Headers::ATOMIC_ACK_ETH, 8)
            .map(AtomicAckEth::new_unchecked)
    }

    /// Length of BTH and extension headers.
    pub fn header_len(&self) -> usize {
        self.opcode().header_len()
    }

    /// Number of pad bytes.
    pub fn pad_len(&self) -> usize {
        usize::from(self.bth().pad_cnt())
    }

    /// Payload length (pad excluded): total − headers − pad − ICRC, as rxe's `payload_size`.
    pub fn payload_len(&self) -> usize {
        self.buffer.as_ref().len() - self.header_len() - self.pad_len() - ICRC_LEN
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        let hl = self.header_len();
        &self.buffer.as_ref()[hl..hl + self.payload_len()]
    }

    /// The pad bytes (normally zero).
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[b.len() - ICRC_LEN - self.pad_len()..b.len() - ICRC_LEN]
    }

    /// The ICRC as a number (the four wire bytes read little-endian).
    pub fn icrc(&self) -> u32 {
        icrc::carried(self.buffer.as_ref()).expect("Packet::check_len validated the length")
    }

    /// Everything the ICRC covers after the pseudo header: BTH to pad.
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }

    /// Checks the ICRC against the IP and UDP headers the packet travelled in.
    pub fn verify_icrc(&self, encap: &Encap) -> Result<()> {
        icrc::verify(encap, self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        let n = self.payload_len();
        &mut self.buffer.as_mut()[hl..hl + n]
    }

    /// Computes the ICRC for `encap` and writes it into the last four bytes.
    pub fn fill_icrc(&mut self, encap: &Encap) -> Result<()> {
        self.fill_icrc_with_memo(encap, &mut icrc::Memo::default())
    }

    /// [`Packet::fill_icrc`] with the pseudo header's CRC state kept in `memo` from one packet
    /// to the next (see [`icrc::Hasher::with_memo`]).
    pub fn fill_icrc_with_memo(&mut self, encap: &Encap, memo: &mut icrc::Memo) -> Result<()> {
        let crc = icrc::compute_with_memo(encap, self.icrc_covered(), memo)?;
        let b = self.buffer.as_mut();
        let n = b.len();
        b[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }
}

/// The checks of [`Packet::check_len`] for a packet of `len` bytes whose first bytes are
/// `b`: all its headers at least (or the whole packet, if shorter).
fn check_structure(b: &[u8], len: usize) -> Result<()> {
    let bth = Bth::new_checked(b)?;
    if bth.tver() != 0 {
        return Err(Error::BadVersion(bth.tver()));
    }
    let opcode = bth.opcode()?;
    let hl = opcode.header_len();
    // Headers missing from `b` count as missing from the packet.
    let actual = if b.len() < hl { b.len() } else { len };
    if actual < hl + ICRC_LEN {
        return Err(Error::Truncated {
            what: opcode.name(),
            needed: hl + ICRC_LEN,
            actual,
        });
    }
    let area = len - hl - ICRC_LEN;
    let pad = usize::from(bth.pad_cnt());
    if pad > 0 && area <= pad {
        return Err(Error::BadPad {
            opcode,
            pad: pad as u8,
            reason: "pad without payload",
        });
    }
    if area % 4 != 0 {
        return Err(Error::LengthMismatch {
            opcode,
            len: area,
            reason: "payload + pad is not a multiple of 4",
        });
    }
    if opcode.payload_rule() == PayloadRule::None && area != 0 {
        return Err(Error::LengthMismatch {
            opcode,
            len: area,
            reason: "opcode carries no payload",
        });
    }
    Ok(())
}

/// Every field of a RoCEv2 packet: the BTH, whichever extension headers its opcode carries,
/// and the payload. The pad follows from the payload length and the ICRC from the IP header,
/// so neither is stored: [`PacketRepr::emit`] writes zero pad bytes and
/// [`PacketRepr::emit_with_icrc`] the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// Base transport header. `bth.pad_cnt` is filled by `parse`; `emit` derives it from the
    /// payload length.
    pub bth: BthRepr,
    /// XRCETH (XRC requests): the 24-bit number of the XRC SRQ at the target.
    pub xrceth: Option<u32>,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// FETH (FLUSH).
    pub feth: Option<FethRepr>,
    /// RETH (RDMA WRITE first/only, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<RethRepr>,
    /// AtomicETH (compare-and-swap, fetch-and-add).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// Immediate data.
    pub imm_dt: Option<u32>,
    /// R_Key to invalidate.
    pub ieth: Option<u32>,
    /// AETH (ACK, NAK, READ response first/last/only, atomic ACK).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// srdma's SACK ETH (`SRDMA_SACK`).
    pub sack: Option<crate::sack::SackRepr>,
    /// Payload (pad excluded).
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// A repr with `bth` and `payload` and no extension headers; set the ones the opcode needs.
    pub fn new(bth: BthRepr, payload: &'a [u8]) -> Self {
        PacketRepr {
            bth,
            xrceth: None,
            deth: None,
            feth: None,
            reth: None,
            atomic_eth: None,
            imm_dt: None,
            ieth: None,
            aeth: None,
            atomic_ack_eth: None,
            sack: None,
            payload,
        }
    }

    /// Parses a packet view; the repr borrows the packet's buffer, not the view.
    pub fn parse(packet: &Packet<&'a [u8]>) -> Result<PacketRepr<'a>> {
        Self::parse_bytes(packet.buffer)
    }

    /// Parses a whole packet straight from bytes (checks included).
    pub fn parse_bytes(bytes: &'a [u8]) -> Result<PacketRepr<'a>> {
        let (mut repr, payload) = PacketRepr::parse_head(bytes, bytes.len())?;
        repr.payload = &bytes[payload];
        Ok(repr)
    }

    /// Parses a packet of `len` bytes from `head`, its first bytes — all its headers at
    /// least, or the whole packet if it is shorter than [`MAX_HEADER_LEN`] — with the checks
    /// of [`PacketRepr::parse_bytes`]. Returns the repr with an empty payload and where the
    /// payload lies in the packet. For a packet that lies where someone else may write: its
    /// headers are read from a private copy once, and the payload taken from where it lies.
    pub fn parse_head(head: &[u8], len: usize) -> Result<(PacketRepr<'a>, Range<usize>)> {
        check_structure(head, len)?;
        let bytes = head;
        let p = Packet::new_unchecked(head);
        let bth = BthRepr::with_opcode(&p.bth(), p.opcode());
        let headers = bth.opcode.headers();
        let mut repr = PacketRepr::new(bth, &[]);
        // One walk over the headers, in wire order; `check_structure` guaranteed they fit.
        let mut at = BTH_LEN;
        let mut take = |h: Headers, len: usize| -> Option<&[u8]> {
            if headers.contains(h) {
                at += len;
                Some(&bytes[at - len..at])
            } else {
                None
            }
        };
        // The top byte of the XRCETH is reserved: ignored on receipt.
        repr.xrceth = take(Headers::XRCETH, 4).map(|b| u32::from_be_bytes([0, b[1], b[2], b[3]]));
        repr.deth = take(Headers::DETH, 8)
            .map(|b| DethRepr::parse(&Deth::new_unchecked(b)))
            .transpose()?;
        repr.feth = take(Headers::FETH, 4)
            .map(|b| FethRepr::parse(&Feth::new_unchecked(b)))
            .transpose()?;
        repr.reth = take(Headers::RETH, 16)
            .map(|b| RethRepr::parse(&Reth::new_unchecked(b)))
            .transpose()?;
        repr.atomic_eth = take(Headers::ATOMIC_ETH, 28)
            .map(|b| AtomicEthRepr::parse(&AtomicEth::new_unchecked(b)))
            .transpose()?;
        repr.imm_dt = take(Headers::IMM_DT, 4)
            .map(|b| crate::imm::parse_imm(&ImmDt::new_unchecked(b)))
            .transpose()?;
        repr.ieth = take(Headers::IETH, 4)
            .map(|b| crate::imm::parse_ieth(&Ieth::new_unchecked(b)))
            .transpose()?;
        repr.aeth = take(Headers::AETH, 4)
            .map(|b| AethRepr::parse(&Aeth::new_unchecked(b)))
            .transpose()?;
        repr.atomic_ack_eth = take(Headers::ATOMIC_ACK_ETH, 8)
            .map(|b| AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b)))
            .transpose()?;
        // The CNP's reserved bytes come before the SACK ETH in the order (no opcode has both).
        let _ = take(Headers::CNP_RESERVED, 16);
        repr.sack = take(Headers::SACK_ETH, 32)
            .map(|b| crate::sack::SackRepr::parse(&crate::sack::Sack::new_unchecked(b)))
            .transpose()?;
        let hl = bth.opcode.header_len();
        let end = len - ICRC_LEN - usize::from(bth.pad_cnt);
        Ok((repr, hl..end))
    }

    /// Pad bytes the payload needs: `(-len) & 3`.
    pub fn pad_len(&self) -> usize {
        self.payload.len().wrapping_neg() & 3
    }

    /// Length of the packet on the wire, ICRC included.
    pub fn buffer_len(&self) -> usize {
        self.bth.opcode.header_len() + self.payload.len() + self.pad_len() + ICRC_LEN
    }

    /// Checks that the extension headers present are exactly those the opcode carries and
    /// that the payload fits the opcode (no payload where none is allowed).
    pub fn check(&self) -> Result<()> {
        self.check_headers()?;
        let op = self.bth.opcode;
        if op.payload_rule() == PayloadRule::None && !self.payload.is_empty() {
            return Err(Error::LengthMismatch {
                opcode: op,
                len: self.payload.len(),
                reason: "opcode carries no payload",
            });
        }
        Ok(())
    }

    /// [`check`](Self::check) but for the payload: the extension headers and their fields.
    fn check_headers(&self) -> Result<()> {
        let op = self.bth.opcode;
        let want = op.headers();
        let have = [
            (Headers::XRCETH, self.xrceth.is_some()),
            (Headers::DETH, self.deth.is_some()),
            (Headers::FETH, self.feth.is_some()),
            (Headers::RETH, self.reth.is_some()),
            (Headers::ATOMIC_ETH, self.atomic_eth.is_some()),
            (Headers::IMM_DT, self.imm_dt.is_some()),
            (Headers::IETH, self.ieth.is_some()),
            (Headers::AETH, self.aeth.is_some()),
            (Headers::ATOMIC_ACK_ETH, self.atomic_ack_eth.is_some()),
            (Headers::SACK_ETH, self.sack.is_some()),
        ];
        for (h, present) in have {
            if want.contains(h) != present {
                let name = Headers::ORDER
                    .iter()
                    .find(|e| e.0 == h)
                    .map_or("?", |e| e.2);
                let reason = if present {
                    "does not carry"
                } else {
                    "requires"
                };
                return Err(Error::HeaderMismatch {
                    opcode: op,
                    header: name,
                    reason,
                });
            }
        }
        self.check_ranges()
    }

    /// Fields wider than their wire encoding would be silently cut by `emit`; refuse them.
    fn check_ranges(&self) -> Result<()> {
        let bad = |field, value: u64| Err(Error::OutOfRange { field, value });
        if let Some(n) = self.xrceth {
            if n > crate::seq::MASK_24 {
                return bad("XRCETH XRC SRQ number", n.into());
            }
        }
        if let Some(a) = self.aeth {
            if a.msn > crate::seq::MASK_24 {
                return bad("AETH MSN", a.msn.into());
            }
            let b = a.syndrome.to_byte();
            if crate::aeth::Syndrome::from_byte(b) != a.syndrome {
                return bad("AETH syndrome code", b.into());
            }
            let code = match a.syndrome {
                crate::aeth::Syndrome::Ack { credit_code: c }
                | crate::aeth::Syndrome::RnrNak { timer_code: c } => c,
                _ => 0,
            };
            if code > 0x1F {
                return bad("AETH credit or timer code", code.into());
            }
        }
        if let Some(f) = self.feth {
            if f.placement_type > 0xF || f.selectivity > 3 {
                return bad(
                    "FETH placement type or selectivity",
                    (u64::from(f.placement_type) << 8) | u64::from(f.selectivity),
                );
            }
        }
        Ok(())
    }

    /// Writes the packet into `buf[..buffer_len()]` with zero pad and a zero ICRC; returns the
    /// length written. Use [`Packet::fill_icrc`] (or [`emit_with_icrc`](Self::emit_with_icrc))
    /// to complete it.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.emit_headers(buf, self.payload.len())?;
        let hl = self.bth.opcode.header_len();
        buf[hl..hl + self.payload.len()].copy_from_slice(self.payload);
        Ok(len)
    }

    /// Like [`emit`](Self::emit) for a packet whose payload is `payload_len` bytes that the
    /// caller writes itself into `buf[header_len..header_len + payload_len]` (e.g. straight from
    /// registered memory, saving a copy). `self.payload` is ignored; headers, zero pad and a
    /// zero ICRC are written. Returns the packet length.
    pub fn emit_headers(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        self.check_headers()?;
        let op = self.bth.opcode;
        if op.payload_rule() == PayloadRule::None && payload_len != 0 {
            return Err(Error::LengthMismatch {
                opcode: op,
                len: payload_len,
                reason: "opcode carries no payload",
            });
        }
        let pad = payload_len.wrapping_neg() & 3;
        let len = op.header_len() + payload_len + pad + ICRC_LEN;
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                needed: len,
                actual: buf.len(),
            });
        }
        let buf = &mut buf[..len];
        let mut bth = self.bth;
        bth.pad_cnt = pad as u8;
        bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
        let headers = self.bth.opcode.headers();
        let at = |h: Headers| BTH_LEN + headers.offset_of(h).unwrap_or(0);
        if let Some(n) = self.xrceth {
            let o = at(Headers::XRCETH);
            buf[o..o + 4].copy_from_slice(&n.to_be_bytes());
        }
        if let Some(h) = self.deth {
            h.emit(&mut Deth::new_unchecked(&mut buf[at(Headers::DETH)..]));
        }
        if let Some(h) = self.feth {
            h.emit(&mut Feth::new_unchecked(&mut buf[at(Headers::FETH)..]));
        }
        if let Some(h) = self.reth {
            h.emit(&mut Reth::new_unchecked(&mut buf[at(Headers::RETH)..]));
        }
        if let Some(h) = self.atomic_eth {
            h.emit(&mut AtomicEth::new_unchecked(
                &mut buf[at(Headers::ATOMIC_ETH)..],
            ));
        }
        if let Some(v) = self.imm_dt {
            ImmDt::new_unchecked(&mut buf[at(Headers::IMM_DT)..]).set_value(v);
        }
        if let Some(v) = self.ieth {
            Ieth::new_unchecked(&mut buf[at(Headers::IETH)..]).set_rkey(v);
        }
        if let Some(h) = self.aeth {
            h.emit(&mut Aeth::new_unchecked(&mut buf[at(Headers::AETH)..]));
        }
        if let Some(h) = self.atomic_ack_eth {
            h.emit(&mut AtomicAckEth::new_unchecked(
                &mut buf[at(Headers::ATOMIC_ACK_ETH)..],
            ));
        }
        if headers.contains(Headers::CNP_RESERVED) {
            let o = at(Headers::CNP_RESERVED);
            buf[o..o + 16].fill(0);
        }
        if let Some(h) = self.sack {
            h.emit(&mut crate::sack::Sack::new_unchecked(
                &mut buf[at(Headers::SACK_ETH)..],
            ));
        }
        // Zero pad (rare: payloads are mostly whole words) and ICRC; a fixed-size store for
        // the ICRC rather than a `memset` call per packet.
        if pad > 0 {
            buf[len - ICRC_LEN - pad..len - ICRC_LEN].fill(0);
        }
        buf[len - ICRC_LEN..].copy_from_slice(&[0; ICRC_LEN]);
        Ok(len)
    }

    /// [`emit`](Self::emit), then the ICRC for the packet carried in `encap`.
    pub fn emit_with_icrc(&self, buf: &mut [u8], encap: &Encap) -> Result<usize> {
        let len = self.emit(buf)?;
        Packet::new_unchecked(&mut buf[..len]).fill_icrc(encap)?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{NakCode, Syndrome};
    use crate::{Psn, Qpn};

    fn ack(syndrome: Syndrome, msn: u32) -> Result<usize> {
        let bth = BthRepr {
            opcode: Opcode::RcAcknowledge,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qpn: Qpn::new(1),
            ack_req: false,
            psn: Psn::new(1),
        };
        let mut r = PacketRepr::new(bth, &[]);
        r.aeth = Some(AethRepr { syndrome, msn });
        r.emit(&mut [0u8; 64])
    }

    /// Values that do not fit their wire field are refused, never silently truncated.
    #[test]
    fn emit_refuses_what_the_wire_cannot_carry() {
        assert!(ack(Syndrome::ACK, 0xFF_FFFF).is_ok());
        assert!(matches!(
            ack(Syndrome::ACK, 0x100_0000),
            Err(Error::OutOfRange { .. })
        ));
        assert!(ack(Syndrome::Ack { credit_code: 32 }, 1).is_err());
        assert!(ack(Syndrome::RnrNak { timer_code: 40 }, 1).is_err());
        assert!(ack(Syndrome::Nak(NakCode::Reserved(2)), 1).is_err());
        assert!(ack(Syndrome::Nak(NakCode::Reserved(9)), 1).is_ok());
        assert!(ack(Syndrome::Reserved(0x1F), 1).is_err());
        assert!(ack(Syndrome::Reserved(0x45), 1).is_ok());
    }
}
