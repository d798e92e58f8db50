//! Datagram Extended Transport Header: `Q_Key(32) | resv(8) | SrcQP(24)`, 8 bytes.

use crate::Result;
use crate::field::{be24, be32, set_be24, set_be32};
use crate::seq::Qpn;
use crate::view::header_view;

/// The Q_Key of the GSI QP (QP1), on which CM MADs travel (rxe `GSI_QKEY`).
pub const GSI_QKEY: u32 = 0x8001_0000;

header_view!(
    /// A zero-copy view of a DETH.
    Deth,
    8,
    "DETH"
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    #[inline]
    pub fn qkey(&self) -> u32 {
        be32(self.b(), 0)
    }
    /// Source QP.
    #[inline]
    pub fn src_qpn(&self) -> Qpn {
        Qpn::new(be24(self.b(), 5))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the queue key.
    #[inline]
    pub fn set_qkey(&mut self, v: u32) {
        set_be32(self.bm(), 0, v);
    }
    /// Sets the source QP (the reserved byte becomes 0).
    #[inline]
    pub fn set_src_qpn(&mut self, v: Qpn) {
        self.bm()[4] = 0;
        set_be24(self.bm(), 5, v.value());
    }
}

/// The fields of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP.
    pub src_qpn: Qpn,
}

impl DethRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(DethRepr {
            qkey: h.qkey(),
            src_qpn: h.src_qpn(),
        })
    }
    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_qkey(self.qkey);
        h.set_src_qpn(self.src_qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes = [0x80, 0x01, 0, 0, 0, 0, 0, 1];
        let r = DethRepr::parse(&Deth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: GSI_QKEY,
                src_qpn: Qpn::GSI
            }
        );
        let mut out = [0xffu8; 8];
        r.emit(&mut Deth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
