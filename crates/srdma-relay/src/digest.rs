//! Whole-object digests: streaming XXH3-128 over an object's raw (uncompressed) bytes.
//!
//! The source computes the digest while it reads an object and sends it in the object's
//! `OBJECT_END` chunk; every sink recomputes it over the bytes it wrote and commits the object
//! only when both agree. XXH3 is not cryptographic: it catches corruption, not tampering.

use xxhash_rust::xxh3::Xxh3;

/// A streaming XXH3-128 digest of an object's raw bytes.
#[derive(Clone)]
pub struct ObjectDigest {
    state: Xxh3,
    len: u64,
}

impl std::fmt::Debug for ObjectDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectDigest")
            .field("len", &self.len)
            .field("digest", &hex(&self.finish()))
            .finish()
    }
}

impl Default for ObjectDigest {
    fn default() -> Self {
        Self::new()
    }
}

impl ObjectDigest {
    /// A digest of zero bytes so far.
    pub fn new() -> Self {
        ObjectDigest {
            state: Xxh3::new(),
            len: 0,
        }
    }

    /// Adds the next bytes of the object (in object order).
    pub fn update(&mut self, data: &[u8]) {
        self.state.update(data);
        self.len += data.len() as u64;
    }

    /// The digest of every byte added so far, big-endian (the canonical XXH3-128 byte order).
    /// Does not consume the state: more bytes may follow.
    pub fn finish(&self) -> [u8; 16] {
        self.state.digest128().to_be_bytes()
    }

    /// Bytes added so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when no byte has been added.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digest of `data` in one call.
    pub fn of(data: &[u8]) -> [u8; 16] {
        xxhash_rust::xxh3::xxh3_128(data).to_be_bytes()
    }
}

/// Lower-case hexadecimal of a digest (32 characters).
pub fn hex(d: &[u8; 16]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(32);
    for b in d {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_equals_one_shot_for_any_split() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        let whole = ObjectDigest::of(&data);
        for split in [0, 1, 15, 16, 17, 240, 1024, 4999, 9999, 10_000] {
            let mut d = ObjectDigest::new();
            d.update(&data[..split]);
            d.update(&data[split..]);
            assert_eq!(d.finish(), whole, "split at {split}");
            assert_eq!(d.len(), 10_000);
        }
        let mut tiny = ObjectDigest::new();
        for b in &data {
            tiny.update(std::slice::from_ref(b));
        }
        assert_eq!(tiny.finish(), whole);
    }

    #[test]
    fn one_changed_byte_changes_the_digest() {
        let mut data = vec![0u8; 4096];
        let a = ObjectDigest::of(&data);
        data[2000] = 1;
        assert_ne!(ObjectDigest::of(&data), a);
    }

    #[test]
    fn hex_is_32_lowercase_digits() {
        let mut d = [0u8; 16];
        d[0] = 0xab;
        d[15] = 0x01;
        let h = hex(&d);
        assert_eq!(h.len(), 32);
        assert!(h.starts_with("ab00"));
        assert!(h.ends_with("0001"));
        // Known XXH3-128 of the empty input, as a check on byte order.
        assert_eq!(
            hex(&ObjectDigest::new().finish()),
            format!("{:032x}", xxhash_rust::xxh3::xxh3_128(b""))
        );
    }
}
