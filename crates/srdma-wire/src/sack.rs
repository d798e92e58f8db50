//! srdma's selective acknowledgement (SACK ETH), carried by the `SRDMA_SACK` opcode (0xE0, in
//! the IBTA's manufacturer-specific range): up to [`SACK_BLOCKS`] ranges of PSNs a responder
//! holds beyond the PSN it expects next (the BTH's PSN, which acknowledges everything
//! before it as an ACK does). Each block is `resv(8) | Start(24) | resv(8) | End(24)`, End
//! exclusive; a block with Start = End is empty. 32 bytes.
//!
//! Only srdma peers that agreed to selective repeat at connection time (ECE) send or expect
//! it: rxe and RoCE NICs never see one.

use crate::Result;
use crate::field::{be24, set_be24};
use crate::seq::Psn;
use crate::view::header_view;

/// Blocks in a SACK ETH.
pub const SACK_BLOCKS: usize = 4;

header_view!(
    /// A zero-copy view of a SACK ETH.
    Sack,
    32,
    "SackETH"
);

impl<T: AsRef<[u8]>> Sack<T> {
    /// Block `i` (`i < SACK_BLOCKS`): its first PSN and the PSN after its last.
    #[inline]
    pub fn block(&self, i: usize) -> (Psn, Psn) {
        let o = 8 * (i % SACK_BLOCKS);
        (
            Psn::new(be24(self.b(), o + 1)),
            Psn::new(be24(self.b(), o + 5)),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Sack<T> {
    /// Sets block `i` (reserved bytes become 0).
    #[inline]
    pub fn set_block(&mut self, i: usize, start: Psn, end: Psn) {
        let o = 8 * (i % SACK_BLOCKS);
        let b = self.bm();
        b[o] = 0;
        set_be24(b, o + 1, start.value());
        b[o + 4] = 0;
        set_be24(b, o + 5, end.value());
    }
}

/// The fields of a SACK ETH: ranges `start..end` of PSNs the responder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SackRepr {
    /// The blocks, empty ones (`start == end`) last.
    pub blocks: [(Psn, Psn); SACK_BLOCKS],
}

impl SackRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Sack<T>) -> Result<Self> {
        h.check_len()?;
        let mut blocks = [(Psn::new(0), Psn::new(0)); SACK_BLOCKS];
        for (i, b) in blocks.iter_mut().enumerate() {
            *b = h.block(i);
        }
        Ok(SackRepr { blocks })
    }

    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Sack<T>) {
        for (i, &(s, e)) in self.blocks.iter().enumerate() {
            h.set_block(i, s, e);
        }
    }

    /// The blocks that are not empty.
    pub fn ranges(&self) -> impl Iterator<Item = (Psn, Psn)> + '_ {
        self.blocks.iter().copied().filter(|(s, e)| s != e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let mut bytes = [0u8; 32];
        bytes[1..4].copy_from_slice(&[0x00, 0x01, 0x00]);
        bytes[5..8].copy_from_slice(&[0x00, 0x01, 0x10]);
        bytes[9..12].copy_from_slice(&[0xFF, 0xFF, 0xF0]);
        bytes[13..16].copy_from_slice(&[0x00, 0x00, 0x04]);
        let r = SackRepr::parse(&Sack::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.blocks[0], (Psn::new(0x100), Psn::new(0x110)));
        assert_eq!(
            r.blocks[1],
            (Psn::new(0xFF_FFF0), Psn::new(4)),
            "across the wrap"
        );
        assert_eq!(r.ranges().count(), 2);
        let mut out = [0xFFu8; 32];
        r.emit(&mut Sack::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Sack::new_checked(&bytes[..31]).is_err());
    }
}
