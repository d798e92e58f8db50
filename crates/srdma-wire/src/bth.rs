//! Base Transport Header (IBTA vol. 1 §9.2; rxe `struct rxe_bth`), 12 bytes.
//!
//! ```text
//!  0       OpCode
//!  1       SE | M | PadCnt(2) | TVer(4)
//!  2..4    P_Key
//!  4       FECN | BECN | Resv6      (masked to 0xFF in the ICRC)
//!  5..8    DestQP (24)
//!  8       AckReq | Resv7
//!  9..12   PSN (24)
//! ```

use crate::field::{be16, be24, set_be16, set_be24};
use crate::opcode::Opcode;
use crate::seq::{Psn, Qpn};
use crate::view::header_view;
use crate::{Error, Result};

/// BTH length in bytes.
pub const BTH_LEN: usize = 12;

/// The default partition key, full member (rxe `BTH_DEF_PKEY`).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

header_view!(
    /// A zero-copy view of a BTH.
    Bth,
    BTH_LEN,
    "BTH"
);

impl<T: AsRef<[u8]>> Bth<T> {
    /// Raw opcode byte.
    #[inline]
    pub fn opcode_raw(&self) -> u8 {
        self.b()[0]
    }
    /// The opcode, if known.
    #[inline]
    pub fn opcode(&self) -> Result<Opcode> {
        Opcode::try_from(self.opcode_raw())
    }
    /// Solicited event.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }
    /// MigReq (rxe sends 0, ConnectX sends 1; never checked on receive).
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }
    /// Number of pad bytes after the payload.
    #[inline]
    pub fn pad_cnt(&self) -> u8 {
        (self.b()[1] >> 4) & 0x3
    }
    /// Transport header version (must be 0).
    #[inline]
    pub fn tver(&self) -> u8 {
        self.b()[1] & 0x0F
    }
    /// Partition key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        be16(self.b(), 2)
    }
    /// Forward explicit congestion notification.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.b()[4] & 0x80 != 0
    }
    /// Backward explicit congestion notification (set in CNPs).
    #[inline]
    pub fn becn(&self) -> bool {
        self.b()[4] & 0x40 != 0
    }
    /// Destination QP.
    #[inline]
    pub fn dest_qpn(&self) -> Qpn {
        Qpn::new(be24(self.b(), 5))
    }
    /// Acknowledge request.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }
    /// Packet sequence number.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.b(), 9))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Sets the opcode.
    #[inline]
    pub fn set_opcode(&mut self, op: Opcode) {
        self.bm()[0] = op.value();
    }
    /// Sets SE, M, PadCnt and TVer (0) at once.
    #[inline]
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_cnt: u8) {
        self.bm()[1] = (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad_cnt & 3) << 4);
    }
    /// Sets the partition key.
    #[inline]
    pub fn set_pkey(&mut self, pkey: u16) {
        set_be16(self.bm(), 2, pkey);
    }
    /// Sets FECN and BECN (the six reserved bits become 0).
    #[inline]
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.bm()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QP.
    #[inline]
    pub fn set_dest_qpn(&mut self, qpn: Qpn) {
        set_be24(self.bm(), 5, qpn.value());
    }
    /// Sets AckReq (the seven reserved bits become 0).
    #[inline]
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.bm()[8] = u8::from(ack_req) << 7;
    }
    /// Sets the PSN.
    #[inline]
    pub fn set_psn(&mut self, psn: Psn) {
        set_be24(self.bm(), 9, psn.value());
    }
}

/// The fields of a BTH.
///
/// Reserved bits are not kept: they are ignored on parse and sent as zero, as rxe does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// Pad byte count (0..=3).
    pub pad_cnt: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qpn: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a checked view: fails on TVer ≠ 0 or an unknown opcode.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        bth.check_len()?;
        if bth.tver() != 0 {
            return Err(Error::BadVersion(bth.tver()));
        }
        Ok(Self::with_opcode(bth, bth.opcode()?))
    }

    /// The fields of a view whose length, version and opcode were already checked.
    #[inline]
    pub(crate) fn with_opcode<T: AsRef<[u8]>>(bth: &Bth<T>, opcode: Opcode) -> BthRepr {
        BthRepr {
            opcode,
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_cnt: bth.pad_cnt(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qpn: bth.dest_qpn(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        }
    }

    /// Length on the wire.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes every field into `bth`.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode(self.opcode);
        bth.set_flags(self.solicited, self.mig_req, self.pad_cnt);
        bth.set_pkey(self.pkey);
        bth.set_ecn(self.fecn, self.becn);
        bth.set_dest_qpn(self.dest_qpn);
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From test vector B (roce-reference.md §1.7): UC_SEND_ONLY, M=1, PadCnt 2, QP 211.
    const BYTES: [u8; 12] = [
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
    ];

    #[test]
    fn parse_and_emit_golden() {
        let repr = BthRepr::parse(&Bth::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(repr.opcode, Opcode::UcSendOnly);
        assert!(repr.mig_req && !repr.solicited && !repr.ack_req);
        assert_eq!(repr.pad_cnt, 2);
        assert_eq!(repr.pkey, 0xffff);
        assert_eq!(repr.dest_qpn, Qpn::new(211));
        assert_eq!(repr.psn, Psn::new(13_571_856));
        let mut out = [0u8; 12];
        repr.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
    }

    #[test]
    fn rejects_version_and_short() {
        let mut b = BYTES;
        b[1] |= 1;
        assert_eq!(
            BthRepr::parse(&Bth::new_unchecked(&b[..])),
            Err(Error::BadVersion(1))
        );
        assert!(matches!(
            Bth::new_checked(&BYTES[..11]),
            Err(Error::Truncated { .. })
        ));
    }
}
