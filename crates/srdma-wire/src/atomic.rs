//! Atomic ETH (28 bytes) and Atomic ACK ETH (8 bytes).

use crate::Result;
use crate::field::{be32, be64, set_be32, set_be64};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an AtomicETH: `VA(64) | R_Key(32) | SwapOrAdd(64) | Compare(64)`.
    AtomicEth,
    28,
    "AtomicETH"
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Remote virtual address (must be 8-byte aligned).
    #[inline]
    pub fn va(&self) -> u64 {
        be64(self.b(), 0)
    }
    /// Remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 8)
    }
    /// Swap data (compare and swap) or add data (fetch and add).
    #[inline]
    pub fn swap_add(&self) -> u64 {
        be64(self.b(), 12)
    }
    /// Compare data (compare and swap only).
    #[inline]
    pub fn compare(&self) -> u64 {
        be64(self.b(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
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
    /// Sets the swap or add data.
    #[inline]
    pub fn set_swap_add(&mut self, v: u64) {
        set_be64(self.bm(), 12, v);
    }
    /// Sets the compare data.
    #[inline]
    pub fn set_compare(&mut self, v: u64) {
        set_be64(self.bm(), 20, v);
    }
}

/// The fields of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap data (CMP_AND_SWP) or add data (FETCH_AND_ADD).
    pub swap_add: u64,
    /// Compare data (0 for FETCH_AND_ADD, as rxe sends).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }
    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

header_view!(
    /// A zero-copy view of an AtomicAckETH: `OrigRemDt(64)`.
    AtomicAckEth,
    8,
    "AtomicAckETH"
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The value the target held before the atomic operation.
    #[inline]
    pub fn orig(&self) -> u64 {
        be64(self.b(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original value.
    #[inline]
    pub fn set_orig(&mut self, v: u64) {
        set_be64(self.bm(), 0, v);
    }
}

/// The fields of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(AtomicAckEthRepr { orig: h.orig() })
    }
    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig(self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_golden() {
        let mut bytes = [0u8; 28];
        bytes[..8].copy_from_slice(&0x55c9_ff40_3000u64.to_be_bytes());
        bytes[8..12].copy_from_slice(&0x2d4u32.to_be_bytes());
        bytes[12..20].copy_from_slice(&1u64.to_be_bytes());
        let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AtomicEthRepr {
                va: 0x55c9_ff40_3000,
                rkey: 0x2d4,
                swap_add: 1,
                compare: 0
            }
        );
        let mut out = [0xffu8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn atomic_ack_golden() {
        let bytes = 0x0123_4567_89ab_cdefu64.to_be_bytes();
        let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&bytes[..]).unwrap()).unwrap();
        let mut out = [0u8; 8];
        r.emit(&mut AtomicAckEth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(AtomicAckEth::new_checked(&bytes[..7]).is_err());
    }
}
