//! The chunk header: what sits at the start of every ring slot, before the payload.
//!
//! A transfer is a sequence of chunks. Each object in it is framed as one `OBJECT_START` chunk
//! (payload: the object's relative name, UTF-8), any number of data chunks (payload: object
//! bytes, possibly zstd-compressed) and one `OBJECT_END` chunk (payload: the 16-byte
//! whole-object digest from [`crate::digest`]; its `offset` and `object_len` are the object's
//! actual length, known even when the data chunks said `u64::MAX`). The last chunk of a
//! transfer carries `END_OF_TRANSFER` (an empty payload). `seq` counts every chunk, control
//! chunks included. [`crate::source::Framer`] produces this sequence and
//! [`crate::sink::Assembler`] consumes it.
//!
//! # Wire layout (64 bytes, all integers little-endian)
//!
//! | bytes  | field                                                      |
//! |--------|------------------------------------------------------------|
//! | 0..4   | magic `"SRLY"`                                             |
//! | 4      | version (1)                                                |
//! | 5      | check algorithm (0 none, 1 CRC32C, 2 XXH3-64)              |
//! | 6..8   | flags ([`flags`])                                          |
//! | 8..16  | seq                                                        |
//! | 16..20 | object                                                     |
//! | 20..24 | payload_len                                                |
//! | 24..28 | raw_len                                                    |
//! | 28..32 | reserved, zero                                             |
//! | 32..40 | offset                                                     |
//! | 40..48 | checksum (CRC32C zero-extended to 64 bits, or XXH3-64)     |
//! | 48..56 | object_len (`u64::MAX` when unknown)                       |
//! | 56..60 | reserved, zero                                             |
//! | 60..64 | CRC32C of bytes 0..60 (protects the header itself)         |
//!
//! The header CRC means a flipped bit in the header is caught by [`ChunkHeader::decode`]; a
//! flipped bit in the payload is caught by [`ChunkHeader::verify`].

/// Bytes of header at the start of every ring slot.
pub const HEADER_LEN: usize = 64;

/// The four magic bytes every header starts with.
pub const MAGIC: [u8; 4] = *b"SRLY";

/// The header format version this code writes and accepts.
pub const VERSION: u8 = 1;

/// Largest payload a header may announce (1 GiB): anything above is garbage.
pub const MAX_PAYLOAD: u32 = 1 << 30;

/// Largest object name (bytes) an `OBJECT_START` chunk may carry.
pub const MAX_NAME_LEN: u32 = 4096;

/// Length of the digest an `OBJECT_END` chunk carries.
pub const DIGEST_LEN: u32 = 16;

/// Chunk flags (a bit set in [`ChunkHeader::flags`]).
pub mod flags {
    /// The chunk opens an object; its payload is the object's relative name (UTF-8).
    pub const OBJECT_START: u16 = 1;
    /// The chunk closes an object; its payload is the 16-byte whole-object digest.
    pub const OBJECT_END: u16 = 2;
    /// The payload is zstd-compressed; `raw_len` is its uncompressed length.
    pub const COMPRESSED: u16 = 4;
    /// The last chunk of the transfer.
    pub const END_OF_TRANSFER: u16 = 8;
    /// Every flag this version knows; other bits are rejected by `decode`.
    pub const ALL: u16 = OBJECT_START | OBJECT_END | COMPRESSED | END_OF_TRANSFER;
    /// Flags that mark a control chunk (not object data).
    pub const CONTROL: u16 = OBJECT_START | OBJECT_END | END_OF_TRANSFER;
}

/// The checksum algorithm a header's `checksum` was computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckAlg {
    /// No checksum (`checksum` is 0, `verify` only checks lengths).
    None,
    /// CRC32C (Castagnoli), zero-extended to 64 bits.
    Crc32c,
    /// XXH3, 64-bit.
    Xxh3,
}

impl CheckAlg {
    /// The on-wire code.
    pub fn code(self) -> u8 {
        match self {
            CheckAlg::None => 0,
            CheckAlg::Crc32c => 1,
            CheckAlg::Xxh3 => 2,
        }
    }

    /// The algorithm for an on-wire code, if known.
    pub fn from_code(c: u8) -> Option<CheckAlg> {
        match c {
            0 => Some(CheckAlg::None),
            1 => Some(CheckAlg::Crc32c),
            2 => Some(CheckAlg::Xxh3),
            _ => None,
        }
    }

    /// Parses "none", "crc32c" or "xxh3".
    pub fn parse(s: &str) -> Option<CheckAlg> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Some(CheckAlg::None),
            "crc32c" | "crc" => Some(CheckAlg::Crc32c),
            "xxh3" | "xxh" => Some(CheckAlg::Xxh3),
            _ => None,
        }
    }

    /// Computes this algorithm's checksum of `data`.
    pub fn checksum(self, data: &[u8]) -> u64 {
        match self {
            CheckAlg::None => 0,
            CheckAlg::Crc32c => u64::from(crc32c::crc32c(data)),
            CheckAlg::Xxh3 => xxhash_rust::xxh3::xxh3_64(data),
        }
    }
}

/// A chunk header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Transfer-wide chunk sequence number, from 0.
    pub seq: u64,
    /// Object index in the transfer, from 0.
    pub object: u32,
    /// A set of [`flags`].
    pub flags: u16,
    /// The algorithm `checksum` is computed with.
    pub check_alg: CheckAlg,
    /// Offset in the object of this chunk's (uncompressed) data.
    pub offset: u64,
    /// Payload bytes after the header in the slot, as they are now.
    pub payload_len: u32,
    /// Object bytes this chunk stands for (uncompressed).
    pub raw_len: u32,
    /// `check_alg` over the payload bytes as they are now.
    pub checksum: u64,
    /// Length of the whole object; `u64::MAX` when unknown (stdin).
    pub object_len: u64,
}

/// A header or payload that is not what it claims to be.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than a header (or than the announced payload).
    #[error("truncated chunk: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The header does not start with "SRLY".
    #[error("bad chunk magic {0:02x?} (expected \"SRLY\")")]
    BadMagic([u8; 4]),
    /// A header version this code does not speak.
    #[error("unsupported chunk header version {0} (this build speaks {VERSION})")]
    BadVersion(u8),
    /// An unknown checksum algorithm code.
    #[error("unknown checksum algorithm code {0}")]
    BadCheckAlg(u8),
    /// Unknown flag bits or an impossible flag combination.
    #[error("bad chunk flags {0:#06x}")]
    BadFlags(u16),
    /// The header's own CRC does not match (a corrupted header).
    #[error("chunk header corrupted (header crc {expected:#010x}, computed {got:#010x})")]
    HeaderCorrupt {
        /// The CRC stored in the header.
        expected: u32,
        /// The CRC computed over the received header.
        got: u32,
    },
    /// Lengths that cannot be right.
    #[error("bad chunk lengths: {0}")]
    BadLength(String),
    /// The payload does not match the header's checksum.
    #[error(
        "chunk {seq}: checksum mismatch (header says {expected:#018x}, payload gives {got:#018x})"
    )]
    ChecksumMismatch {
        /// The chunk's sequence number.
        seq: u64,
        /// The checksum in the header.
        expected: u64,
        /// The checksum computed over the payload.
        got: u64,
    },
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl ChunkHeader {
    /// A data chunk header (not yet sealed: `payload_len` and `checksum` are 0).
    pub fn data(
        seq: u64,
        object: u32,
        offset: u64,
        raw_len: u32,
        object_len: u64,
        check_alg: CheckAlg,
    ) -> ChunkHeader {
        ChunkHeader {
            seq,
            object,
            flags: 0,
            check_alg,
            offset,
            payload_len: 0,
            raw_len,
            checksum: 0,
            object_len,
        }
    }

    /// True for a data chunk (none of `OBJECT_START`, `OBJECT_END`, `END_OF_TRANSFER`).
    pub fn is_data(&self) -> bool {
        self.flags & flags::CONTROL == 0
    }

    /// True when `flag` (one of [`flags`]) is set.
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Checks the fields for internal consistency (the checks `decode` applies).
    pub fn validate(&self) -> Result<(), FrameError> {
        if self.flags & !flags::ALL != 0 {
            return Err(FrameError::BadFlags(self.flags));
        }
        let control = self.flags & flags::CONTROL;
        if control.count_ones() > 1 && control != (flags::OBJECT_END | flags::END_OF_TRANSFER) {
            // OBJECT_END may close the transfer too; other combinations are nonsense.
            return Err(FrameError::BadFlags(self.flags));
        }
        if control != 0 && self.has(flags::COMPRESSED) {
            return Err(FrameError::BadFlags(self.flags));
        }
        if self.payload_len > MAX_PAYLOAD {
            return Err(FrameError::BadLength(format!(
                "payload_len {} above the {MAX_PAYLOAD} limit",
                self.payload_len
            )));
        }
        if self.raw_len > MAX_PAYLOAD {
            return Err(FrameError::BadLength(format!(
                "raw_len {} above the {MAX_PAYLOAD} limit",
                self.raw_len
            )));
        }
        if self.has(flags::OBJECT_START) {
            if self.payload_len == 0 || self.payload_len > MAX_NAME_LEN {
                return Err(FrameError::BadLength(format!(
                    "object name of {} bytes (1..={MAX_NAME_LEN})",
                    self.payload_len
                )));
            }
        } else if self.has(flags::OBJECT_END) {
            if self.payload_len != DIGEST_LEN {
                return Err(FrameError::BadLength(format!(
                    "object end with {} payload bytes (digest is {DIGEST_LEN})",
                    self.payload_len
                )));
            }
        } else if self.has(flags::END_OF_TRANSFER) {
            if self.payload_len != 0 {
                return Err(FrameError::BadLength(format!(
                    "end of transfer with {} payload bytes",
                    self.payload_len
                )));
            }
        } else {
            if !self.has(flags::COMPRESSED) && self.payload_len != self.raw_len {
                return Err(FrameError::BadLength(format!(
                    "uncompressed data chunk with payload_len {} != raw_len {}",
                    self.payload_len, self.raw_len
                )));
            }
            let end = self
                .offset
                .checked_add(u64::from(self.raw_len))
                .ok_or_else(|| {
                    FrameError::BadLength(format!(
                        "offset {} + raw_len {} overflows",
                        self.offset, self.raw_len
                    ))
                })?;
            if self.object_len != u64::MAX && end > self.object_len {
                return Err(FrameError::BadLength(format!(
                    "data ends at {end}, beyond the object's {} bytes",
                    self.object_len
                )));
            }
        }
        Ok(())
    }

    /// Writes the header (magic, version, fields, header CRC) into `out[..HEADER_LEN]`.
    pub fn encode(&self, out: &mut [u8]) -> Result<(), FrameError> {
        if out.len() < HEADER_LEN {
            return Err(FrameError::Truncated {
                need: HEADER_LEN,
                have: out.len(),
            });
        }
        let o = &mut out[..HEADER_LEN];
        o[0..4].copy_from_slice(&MAGIC);
        o[4] = VERSION;
        o[5] = self.check_alg.code();
        o[6..8].copy_from_slice(&self.flags.to_le_bytes());
        o[8..16].copy_from_slice(&self.seq.to_le_bytes());
        o[16..20].copy_from_slice(&self.object.to_le_bytes());
        o[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        o[24..28].copy_from_slice(&self.raw_len.to_le_bytes());
        o[28..32].fill(0);
        o[32..40].copy_from_slice(&self.offset.to_le_bytes());
        o[40..48].copy_from_slice(&self.checksum.to_le_bytes());
        o[48..56].copy_from_slice(&self.object_len.to_le_bytes());
        o[56..60].fill(0);
        let crc = crc32c::crc32c(&o[..60]);
        o[60..64].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Reads a header from `b[..HEADER_LEN]`: checks magic, version, header CRC, flags and
    /// lengths. Never panics, whatever the bytes.
    pub fn decode(b: &[u8]) -> Result<ChunkHeader, FrameError> {
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated {
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let b = &b[..HEADER_LEN];
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(FrameError::BadVersion(b[4]));
        }
        let expected = le_u32(b, 60);
        let got = crc32c::crc32c(&b[..60]);
        if expected != got {
            return Err(FrameError::HeaderCorrupt { expected, got });
        }
        let check_alg = CheckAlg::from_code(b[5]).ok_or(FrameError::BadCheckAlg(b[5]))?;
        if le_u32(b, 28) != 0 || le_u32(b, 56) != 0 {
            return Err(FrameError::BadLength(
                "reserved header bytes are not zero".into(),
            ));
        }
        let h = ChunkHeader {
            seq: le_u64(b, 8),
            object: le_u32(b, 16),
            flags: le_u16(b, 6),
            check_alg,
            offset: le_u64(b, 32),
            payload_len: le_u32(b, 20),
            raw_len: le_u32(b, 24),
            checksum: le_u64(b, 40),
            object_len: le_u64(b, 48),
        };
        h.validate()?;
        Ok(h)
    }

    /// Sets `payload_len` to `payload.len()` and `checksum` to `check_alg` over `payload`.
    ///
    /// Payloads are bounded by the slot size; a payload above `u32::MAX` bytes (a caller bug)
    /// saturates `payload_len`, which `validate`/`verify` then reject.
    pub fn seal(&mut self, payload: &[u8]) {
        self.payload_len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        self.checksum = self.check_alg.checksum(payload);
    }

    /// Checks `checksum` against `payload[..payload_len]`.
    pub fn verify(&self, payload: &[u8]) -> Result<(), FrameError> {
        let len = self.payload_len as usize;
        let Some(p) = payload.get(..len) else {
            return Err(FrameError::Truncated {
                need: len,
                have: payload.len(),
            });
        };
        if self.check_alg == CheckAlg::None {
            return Ok(());
        }
        let got = self.check_alg.checksum(p);
        if got != self.checksum {
            return Err(FrameError::ChecksumMismatch {
                seq: self.seq,
                expected: self.checksum,
                got,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ChunkHeader {
        let mut h = ChunkHeader::data(7, 3, 4096, 11, 1 << 20, CheckAlg::Crc32c);
        h.seal(b"hello world");
        h
    }

    #[test]
    fn round_trip_every_alg_and_flag() {
        for alg in [CheckAlg::None, CheckAlg::Crc32c, CheckAlg::Xxh3] {
            for (flags, payload) in [
                (0u16, &b"data bytes"[..]),
                (flags::OBJECT_START, &b"dir/name.bin"[..]),
                (flags::OBJECT_END, &[9u8; 16][..]),
                (flags::END_OF_TRANSFER, &b""[..]),
                (flags::OBJECT_END | flags::END_OF_TRANSFER, &[1u8; 16][..]),
            ] {
                let mut h = ChunkHeader::data(u64::MAX - 1, 42, 0, 0, u64::MAX, alg);
                h.flags = flags;
                if flags == 0 {
                    h.raw_len = payload.len() as u32;
                }
                h.seal(payload);
                let mut b = [0u8; HEADER_LEN];
                h.encode(&mut b).unwrap();
                assert_eq!(&b[..4], b"SRLY");
                let d = ChunkHeader::decode(&b).unwrap();
                assert_eq!(d, h);
                d.verify(payload).unwrap();
            }
        }
    }

    #[test]
    fn golden_bytes_little_endian() {
        let h = ChunkHeader {
            seq: 0x0102030405060708,
            object: 0x0a0b0c0d,
            flags: flags::COMPRESSED,
            check_alg: CheckAlg::Xxh3,
            offset: 0x1122,
            payload_len: 5,
            raw_len: 9,
            checksum: 0xdeadbeef,
            object_len: 0x10000,
        };
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b).unwrap();
        assert_eq!(&b[0..8], &[b'S', b'R', b'L', b'Y', 1, 2, 4, 0]);
        assert_eq!(&b[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&b[16..20], &[0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(&b[20..28], &[5, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(&b[32..34], &[0x22, 0x11]);
        assert_eq!(&b[40..44], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(&b[48..56], &[0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(
            u32::from_le_bytes(b[60..64].try_into().unwrap()),
            crc32c::crc32c(&b[..60])
        );
    }

    #[test]
    fn encode_needs_room() {
        let mut b = [0u8; HEADER_LEN - 1];
        assert!(matches!(
            sample().encode(&mut b),
            Err(FrameError::Truncated { need: 64, have: 63 })
        ));
    }

    #[test]
    fn every_single_bit_flip_in_the_header_is_caught() {
        let mut b = [0u8; HEADER_LEN];
        sample().encode(&mut b).unwrap();
        for bit in 0..HEADER_LEN * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(
                ChunkHeader::decode(&c).is_err(),
                "bit {bit} flip not caught"
            );
        }
    }

    #[test]
    fn payload_bit_flip_caught_by_verify() {
        for alg in [CheckAlg::Crc32c, CheckAlg::Xxh3] {
            let mut h = sample();
            h.check_alg = alg;
            let mut p = *b"hello world";
            h.seal(&p);
            h.verify(&p).unwrap();
            p[4] ^= 0x10;
            match h.verify(&p) {
                Err(FrameError::ChecksumMismatch {
                    seq: 7,
                    expected,
                    got,
                }) => {
                    assert_ne!(expected, got)
                }
                other => panic!("expected mismatch, got {other:?}"),
            }
        }
    }

    #[test]
    fn verify_short_payload_is_an_error() {
        let h = sample();
        assert!(matches!(
            h.verify(b"hello"),
            Err(FrameError::Truncated { need: 11, have: 5 })
        ));
    }

    #[test]
    fn inconsistent_lengths_rejected() {
        let mut h = sample();
        h.raw_len = 12; // uncompressed but payload_len 11
        assert!(h.validate().is_err());
        let mut h = sample();
        h.offset = (1 << 20) - 5; // runs past object_len
        assert!(h.validate().is_err());
        let mut h = sample();
        h.offset = u64::MAX;
        h.object_len = u64::MAX;
        assert!(h.validate().is_err());
        let mut h = sample();
        h.flags = flags::OBJECT_END; // payload 11, not 16
        assert!(h.validate().is_err());
        let mut h = sample();
        h.flags = 0x40;
        assert!(h.validate().is_err());
        let mut h = sample();
        h.flags = flags::OBJECT_START | flags::COMPRESSED;
        assert!(h.validate().is_err());
    }

    /// Deterministic xorshift so the garbage test is reproducible.
    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn garbage_never_panics() {
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut accepted = 0;
        for i in 0..200_000 {
            let len = (xorshift(&mut s) % 80) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| xorshift(&mut s) as u8).collect();
            // Half the cases get a valid magic+version so decoding goes deeper.
            if i % 2 == 0 && len >= 5 {
                b[..4].copy_from_slice(b"SRLY");
                b[4] = VERSION;
            }
            // A quarter also get a valid header CRC so field checks are exercised.
            if i % 4 == 0 && len >= HEADER_LEN {
                let crc = crc32c::crc32c(&b[..60]);
                b[60..64].copy_from_slice(&crc.to_le_bytes());
            }
            if let Ok(h) = ChunkHeader::decode(&b) {
                accepted += 1;
                let _ = h.verify(&b);
            }
        }
        // Random field values essentially never pass every consistency check.
        assert!(accepted < 100, "{accepted} garbage headers accepted");
    }

    #[test]
    fn truncated_valid_headers_rejected() {
        let mut b = [0u8; HEADER_LEN];
        sample().encode(&mut b).unwrap();
        for n in 0..HEADER_LEN {
            assert!(matches!(
                ChunkHeader::decode(&b[..n]),
                Err(FrameError::Truncated { .. })
            ));
        }
    }
}
