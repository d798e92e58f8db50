//! RDMA Extended Transport Header (16 bytes) and Flush ETH (4 bytes).

use crate::Result;
use crate::field::{be32, be64, set_be32, set_be64};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of a RETH: `VA(64) | R_Key(32) | DMALen(32)`.
    Reth,
    16,
    "RETH"
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Remote virtual address.
    #[inline]
    pub fn va(&self) -> u64 {
        be64(self.b(), 0)
    }
    /// Remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 8)
    }
    /// DMA length of the whole message.
    #[inline]
    pub fn dma_len(&self) -> u32 {
        be32(self.b(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the remote virtual address.
    #[inline]
    pub fn set_va(&mut self, v: u64) {
        set_be64(self.bm(), 0, v);
    }
    /// Sets the remote key.
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        set_be32(self.bm(), 8, v);
    }
    /// Sets the DMA length.
    #[inline]
    pub fn set_dma_len(&mut self, v: u32) {
        set_be32(self.bm(), 12, v);
    }
}

/// The fields of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(RethRepr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        })
    }
    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Reth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_dma_len(self.dma_len);
    }
}

header_view!(
    /// A zero-copy view of a FETH (IBTA 1.5 FLUSH): `resv(26) | SEL(2) | PLT(4)`.
    Feth,
    4,
    "FETH"
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// Placement type (bits 3..0).
    #[inline]
    pub fn placement_type(&self) -> u8 {
        (be32(self.b(), 0) & 0xF) as u8
    }
    /// Selectivity level (bits 5..4).
    #[inline]
    pub fn selectivity(&self) -> u8 {
        ((be32(self.b(), 0) >> 4) & 0x3) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    /// Sets placement type and selectivity level (reserved bits become 0).
    #[inline]
    pub fn set_fields(&mut self, placement_type: u8, selectivity: u8) {
        set_be32(
            self.bm(),
            0,
            u32::from(placement_type & 0xF) | (u32::from(selectivity & 3) << 4),
        );
    }
}

/// The fields of a FETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FethRepr {
    /// Placement type (1 global visibility, 2 persistence).
    pub placement_type: u8,
    /// Selectivity level (0 memory region range, 1 whole memory region).
    pub selectivity: u8,
}

impl FethRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Feth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(FethRepr {
            placement_type: h.placement_type(),
            selectivity: h.selectivity(),
        })
    }
    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Feth<T>) {
        h.set_fields(self.placement_type, self.selectivity);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reth_golden() {
        // RETH of test vector D.
        let bytes = [0, 0, 0x7f, 0, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 5];
        let r = RethRepr::parse(&Reth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            RethRepr {
                va: 0x7f00_0000_1000,
                rkey: 0x1234,
                dma_len: 5
            }
        );
        let mut out = [0xAAu8; 16];
        r.emit(&mut Reth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Reth::new_checked(&bytes[..15]).is_err());
    }

    #[test]
    fn feth_fields() {
        let mut b = [0u8; 4];
        FethRepr {
            placement_type: 2,
            selectivity: 1,
        }
        .emit(&mut Feth::new_unchecked(&mut b[..]));
        assert_eq!(b, [0, 0, 0, 0x12]);
        let f = FethRepr::parse(&Feth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((f.placement_type, f.selectivity), (2, 1));
    }
}
