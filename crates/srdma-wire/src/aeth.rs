//! ACK Extended Transport Header: `Syndrome(8) | MSN(24)`, 4 bytes.
//!
//! Syndrome (IBTA vol. 1 §9.7.5.1.2; rxe `enum aeth_syndrome`): bit 7 reserved, bits 6..5
//! the type (00 ACK, 01 RNR NAK, 11 NAK), bits 4..0 the credit code, RNR timer code or NAK code.

use core::fmt;

use crate::Result;
use crate::field::{be24, set_be24};
use crate::view::header_view;

header_view!(
    /// A zero-copy view of an AETH.
    Aeth,
    4,
    "AETH"
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    #[inline]
    pub fn syndrome_raw(&self) -> u8 {
        self.b()[0]
    }
    /// Message sequence number.
    #[inline]
    pub fn msn(&self) -> u32 {
        be24(self.b(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the raw syndrome byte.
    #[inline]
    pub fn set_syndrome_raw(&mut self, v: u8) {
        self.bm()[0] = v;
    }
    /// Sets the MSN (low 24 bits).
    #[inline]
    pub fn set_msn(&mut self, v: u32) {
        set_be24(self.bm(), 1, v);
    }
}

/// The credit code an ACK carries when end-to-end credits are not used; rxe always sends it
/// (`AETH_ACK_UNLIMITED`).
pub const CREDITS_INVALID: u8 = 0x1F;

/// Credits for credit codes 0..=30 (rdmavt `credit_table`); code 31 means "invalid".
const CREDIT_TABLE: [u16; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// RNR NAK timer code → microseconds (IBTA table 45; rxe `rnrnak_usec`, whose entry 25 has a
/// typo 61410 that we do not copy).
const RNR_TIMER_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// Number of receive credits an ACK credit code grants, or `None` for code 31 ("invalid":
/// the responder does not use end-to-end flow control).
#[inline]
pub fn credits(code: u8) -> Option<u16> {
    CREDIT_TABLE.get(usize::from(code & 0x1F)).copied()
}

/// The delay, in microseconds, an RNR NAK timer code asks for (the `min_rnr_timer` attribute).
#[inline]
pub fn rnr_timer_usec(code: u8) -> u32 {
    RNR_TIMER_USEC[usize::from(code & 0x1F)]
}

/// NAK codes (syndrome 011xxxxx).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the PSN field carries the expected PSN; the requester retries from it.
    PsnSequenceError,
    /// Invalid request (→ `IBV_WC_REM_INV_REQ_ERR`).
    InvalidRequest,
    /// Remote access error (→ `IBV_WC_REM_ACCESS_ERR`).
    RemoteAccessError,
    /// Remote operational error (→ `IBV_WC_REM_OP_ERR`).
    RemoteOperationalError,
    /// Invalid RD request (RD only).
    InvalidRdRequest,
    /// A reserved code (5..=31); treated as a remote operational error by rxe.
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    #[inline]
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1F,
        }
    }

    /// From a 5-bit code.
    #[inline]
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1F {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }

    /// Human name.
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved NAK code",
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a credit code (31 = no end-to-end credits).
    Ack {
        /// 5-bit credit code.
        credit_code: u8,
    },
    /// Receiver not ready: retry after the timer code's delay.
    RnrNak {
        /// 5-bit RNR timer code.
        timer_code: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Type 10 (reserved) or bit 7 set: kept raw so it re-emits byte for byte.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte.
    #[inline]
    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => Syndrome::Ack {
                credit_code: b & 0x1F,
            },
            1 => Syndrome::RnrNak {
                timer_code: b & 0x1F,
            },
            3 => Syndrome::Nak(NakCode::from_code(b)),
            _ => Syndrome::Reserved(b),
        }
    }

    /// Encodes to a syndrome byte.
    #[inline]
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1F,
            Syndrome::RnrNak { timer_code } => 0x20 | (timer_code & 0x1F),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(b) => b,
        }
    }

    /// The ACK rxe sends: credit code 31 (no end-to-end credits).
    pub const ACK: Syndrome = Syndrome::Ack {
        credit_code: CREDITS_INVALID,
    };
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Syndrome::Ack { credit_code } => match credits(credit_code) {
                Some(c) => write!(f, "ACK credits={c}"),
                None => write!(f, "ACK credits=invalid"),
            },
            Syndrome::RnrNak { timer_code } => {
                write!(
                    f,
                    "RNR-NAK timer={timer_code}({}us)",
                    rnr_timer_usec(timer_code)
                )
            }
            Syndrome::Nak(c) => write!(f, "NAK {}({})", c.name(), c.code()),
            Syndrome::Reserved(b) => write!(f, "reserved-syndrome({b:#04x})"),
        }
    }
}

/// The fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parses a view.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Result<Self> {
        h.check_len()?;
        Ok(AethRepr {
            syndrome: Syndrome::from_byte(h.syndrome_raw()),
            msn: h.msn(),
        })
    }
    /// Writes the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome_raw(self.syndrome.to_byte());
        h.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_round_trip() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x1F), Syndrome::ACK);
        assert_eq!(
            Syndrome::from_byte(0x2C),
            Syndrome::RnrNak { timer_code: 12 }
        );
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::from_byte(0x45), Syndrome::Reserved(0x45));
    }

    #[test]
    fn tables() {
        assert_eq!(credits(0), Some(0));
        assert_eq!(credits(30), Some(32768));
        assert_eq!(credits(31), None);
        assert_eq!(rnr_timer_usec(0), 655_360);
        assert_eq!(rnr_timer_usec(12), 640);
        assert_eq!(rnr_timer_usec(25), 61_440);
    }

    #[test]
    fn golden() {
        // ACK, credits invalid, MSN 1 (rc_send_pingpong.pcap).
        let bytes = [0x1f, 0, 0, 1];
        let r = AethRepr::parse(&Aeth::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AethRepr {
                syndrome: Syndrome::ACK,
                msn: 1
            }
        );
        let mut out = [0u8; 4];
        r.emit(&mut Aeth::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
