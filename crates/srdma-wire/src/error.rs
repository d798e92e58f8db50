//! The one error type of the wire layer.

use crate::opcode::Opcode;

/// Why a buffer is not a well-formed RoCEv2 packet (or pcap file, or IP/UDP frame).
///
/// Every parser in this crate returns one of these instead of panicking, whatever the input.
/// A receiver drops such packets silently, as rxe does (`rxe_recv.c hdr_check`): none of
/// these errors is answered with a NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the structure does.
    #[error("truncated: {what} needs {needed} bytes, only {actual} present")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        actual: usize,
    },
    /// BTH TVer is not 0 (rxe drops such packets).
    #[error("bad BTH transport header version {0} (must be 0)")]
    BadVersion(u8),
    /// The BTH opcode is not one of the RC, UC, UD or CNP opcodes.
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The pad count does not fit the payload: pad bytes on a packet without payload.
    /// (Payload + pad not a multiple of four is a [`Error::LengthMismatch`]; a FIRST/MIDDLE
    /// packet with pad fails the responder's PMTU check, [`crate::Opcode::check_payload_len`].)
    #[error("bad pad count {pad} for {opcode}: {reason}")]
    BadPad {
        /// Opcode of the packet.
        opcode: Opcode,
        /// BTH PadCnt.
        pad: u8,
        /// The rule broken.
        reason: &'static str,
    },
    /// A length field or the packet size contradicts the opcode's rules.
    #[error("length mismatch for {opcode}: {reason} ({len} bytes)")]
    LengthMismatch {
        /// Opcode of the packet.
        opcode: Opcode,
        /// The offending length.
        len: usize,
        /// The rule broken.
        reason: &'static str,
    },
    /// A `Repr` asked to emit a header set that its opcode does not carry, or lacks one it does.
    #[error("{opcode} {reason} extension header {header}")]
    HeaderMismatch {
        /// Opcode of the packet.
        opcode: Opcode,
        /// Header name (e.g. "RETH").
        header: &'static str,
        /// "requires" or "does not carry".
        reason: &'static str,
    },
    /// The invariant CRC does not match the packet.
    #[error("bad ICRC: packet carries {carried:#010x}, computed {computed:#010x}")]
    BadIcrc {
        /// ICRC carried in the packet (little-endian wire bytes as a number).
        carried: u32,
        /// ICRC computed over the masked pseudo header and packet.
        computed: u32,
    },
    /// The output buffer is too small for `emit`.
    #[error("output buffer too small: need {needed} bytes, have {actual}")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes offered.
        actual: usize,
    },
    /// A value does not fit its wire field (e.g. a payload longer than an IP packet can carry).
    #[error("{field} out of range: {value}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// The file does not start with a pcap magic number.
    #[error(
        "not a pcap file (magic {0:#010x}); pcapng is not supported, convert with `editcap -F pcap`"
    )]
    NotPcap(u32),
    /// The pcap file uses a link type this reader cannot unwrap.
    #[error("unsupported pcap link type {0}")]
    UnsupportedLinkType(u32),
    /// An IP or UDP header is malformed.
    #[error("malformed {0} header")]
    MalformedIp(&'static str),
}

/// Result with the wire [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

/// Fails with [`Error::Truncated`] unless `buf` holds at least `needed` bytes.
#[inline]
pub(crate) fn need(what: &'static str, buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::Truncated {
            what,
            needed,
            actual: buf.len(),
        })
    } else {
        Ok(())
    }
}
