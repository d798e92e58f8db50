//! Immediate data (ImmDt) and Invalidate ETH (IETH): one 32-bit field each.

use crate::Result;
use crate::field::{be32, set_be32};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of ImmDt: 32 opaque bits delivered to the receiver's completion.
    ImmDt,
    4,
    "ImmDt"
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value, read big-endian (the bytes are opaque; `imm_data` in
    /// `ibv_wc` is this value in network byte order).
    #[inline]
    pub fn value(&self) -> u32 {
        be32(self.b(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate value.
    #[inline]
    pub fn set_value(&mut self, v: u32) {
        set_be32(self.bm(), 0, v);
    }
}

/// Parses ImmDt.
#[inline]
pub fn parse_imm<T: AsRef<[u8]>>(h: &ImmDt<T>) -> Result<u32> {
    h.check_len()?;
    Ok(h.value())
}

header_view!(
    /// A zero-copy view of an IETH: the R_Key the receiver must invalidate.
    Ieth,
    4,
    "IETH"
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// The R_Key to invalidate.
    #[inline]
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key to invalidate.
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        set_be32(self.bm(), 0, v);
    }
}

/// Parses an IETH.
#[inline]
pub fn parse_ieth<T: AsRef<[u8]>>(h: &Ieth<T>) -> Result<u32> {
    h.check_len()?;
    Ok(h.rkey())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes = [0xde, 0xad, 0xbe, 0xef];
        assert_eq!(
            parse_imm(&ImmDt::new_checked(&bytes[..]).unwrap()),
            Ok(0xdead_beef)
        );
        assert_eq!(
            parse_ieth(&Ieth::new_checked(&bytes[..]).unwrap()),
            Ok(0xdead_beef)
        );
        let mut out = [0u8; 4];
        ImmDt::new_unchecked(&mut out[..]).set_value(0xdead_beef);
        assert_eq!(out, bytes);
        assert!(ImmDt::new_checked(&bytes[..3]).is_err());
    }
}
