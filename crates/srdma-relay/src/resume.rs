//! Resuming a transfer: the chunk bitmap a `file:` sink with `resume = true` keeps beside
//! its partial output.
//!
//! Such a sink writes its object to `<output>.srdma-part` (a stable name, see
//! [`part_path`]) and keeps `<output>.srdma-partial` ([`state_path`]), a [`PartialState`]:
//! which chunks of the transfer (by sequence number) are durably in the part file. It is
//! updated every half ring of chunks (`slots / 2`): write the data, fsync the part file, then
//! write the state to `<output>.srdma-partial.tmp`, fsync it, rename it over the state file
//! and fsync the directory. A crash therefore loses at most the chunks since the last
//! completed update: less than a ring, even when it strikes during an update. With the ring
//! in flight on each hop, a resumed run sends again less than one ring per hop plus one.
//!
//! When the same configuration runs again, the sink loads the state, checks it and tells the
//! source (over the control channel, [`crate::control::Msg::Resume`]) the first chunk it
//! lacks; the source starts the whole transfer at the smallest such chunk over all sinks
//! ([`crate::control::Msg::Start`]) and reads the chunks before it only to digest them. A
//! sink that resumed recomputes the object digest over the whole part file when the
//! `OBJECT_END` chunk arrives and commits only if it matches the source's.
//!
//! A state file that is damaged (bad magic, version, length or checksum) or foreign (another
//! transfer's fingerprint, chunk size or object size, or a part file of the wrong size) is
//! discarded together with the part file, with a message, and the sink starts from chunk 0.
//!
//! # File layout (little-endian)
//!
//! | bytes        | field                                                          |
//! |--------------|----------------------------------------------------------------|
//! | 0..8         | magic `"SRLYPART"`                                             |
//! | 8..12        | version (1)                                                    |
//! | 12..28       | transfer fingerprint ([`fingerprint`], XXH3-128)               |
//! | 28..36       | chunk size                                                     |
//! | 36..44       | object length                                                  |
//! | 44..52       | `nbits`: chunks tracked (the `OBJECT_START` chunk and the data chunks) |
//! | 52..52+B     | bitmap, B = ceil(nbits / 8) bytes; bit k (LSB first) = chunk k  |
//! | 52+B..60+B   | XXH3-64 of every byte before                                   |

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::config::{Config, Node};

/// The four-plus-four magic bytes a state file starts with.
pub const MAGIC: [u8; 8] = *b"SRLYPART";
/// The state format version written and accepted.
pub const VERSION: u32 = 1;
/// Bytes before the bitmap.
const FIXED: usize = 52;
/// Largest state file read (a bitmap of 2^28 chunks): anything larger is not ours.
const MAX_STATE_LEN: u64 = (1 << 25) + 64;

/// `<output>.srdma-part`: where a resumable sink writes its object until it commits.
pub fn part_path(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(".srdma-part");
    PathBuf::from(s)
}

/// `<output>.srdma-partial`: the resume state beside it.
pub fn state_path(output: &Path) -> PathBuf {
    let mut s = output.as_os_str().to_owned();
    s.push(".srdma-partial");
    PathBuf::from(s)
}

/// The fingerprint of what sink `sink` of `cfg` receives: the source node's name and source
/// spec, the chunk size, and the sink node's name and sink spec. A state file with another
/// fingerprint belongs to another transfer.
pub fn fingerprint(cfg: &Config, sink: &Node) -> u128 {
    let src = cfg.source();
    let text = format!(
        "srdma-relay resume v{VERSION}\0source {}\0{}\0chunk_size {}\0sink {}\0{}",
        src.name,
        src.source.as_deref().unwrap_or(""),
        cfg.transfer.chunk_size,
        sink.name,
        sink.sink.as_deref().unwrap_or("")
    );
    xxhash_rust::xxh3::xxh3_128(text.as_bytes())
}

/// Chunks a resume bitmap tracks for an object of `len` bytes in chunks of `chunk_size`: the
/// `OBJECT_START` chunk (seq 0) and every data chunk (seq 1..).
pub fn tracked_chunks(len: u64, chunk_size: u64) -> u64 {
    1 + len.div_ceil(chunk_size.max(1))
}

/// A resumable sink's record of the chunks it holds durably.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialState {
    /// The transfer's [`fingerprint`].
    pub fingerprint: u128,
    /// The transfer's chunk size.
    pub chunk_size: u64,
    /// The object's length.
    pub object_len: u64,
    nbits: u64,
    bits: Vec<u8>,
}

impl PartialState {
    /// An empty bitmap for an object of `object_len` bytes.
    pub fn new(fingerprint: u128, chunk_size: u64, object_len: u64) -> PartialState {
        let nbits = tracked_chunks(object_len, chunk_size);
        PartialState {
            fingerprint,
            chunk_size,
            object_len,
            nbits,
            bits: vec![0; usize::try_from(nbits.div_ceil(8)).unwrap_or(0)],
        }
    }

    /// Chunks tracked.
    pub fn tracked(&self) -> u64 {
        self.nbits
    }

    /// True when chunk `seq` is recorded as durably written.
    pub fn has(&self, seq: u64) -> bool {
        seq < self.nbits
            && usize::try_from(seq / 8)
                .ok()
                .and_then(|i| self.bits.get(i))
                .is_some_and(|b| b & (1 << (seq % 8)) != 0)
    }

    /// Records chunk `seq` as durably written (ignored beyond the tracked chunks).
    pub fn set(&mut self, seq: u64) {
        if seq < self.nbits {
            if let Some(b) = usize::try_from(seq / 8)
                .ok()
                .and_then(|i| self.bits.get_mut(i))
            {
                *b |= 1 << (seq % 8);
            }
        }
    }

    /// The first chunk not recorded: where a resumed transfer starts for this sink
    /// ([`PartialState::tracked`] when every data chunk is there: only `OBJECT_END` is due).
    pub fn first_missing(&self) -> u64 {
        (0..self.nbits)
            .find(|&k| !self.has(k))
            .unwrap_or(self.nbits)
    }

    /// The state's bytes (see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FIXED + self.bits.len() + 8);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.extend_from_slice(&self.fingerprint.to_le_bytes());
        v.extend_from_slice(&self.chunk_size.to_le_bytes());
        v.extend_from_slice(&self.object_len.to_le_bytes());
        v.extend_from_slice(&self.nbits.to_le_bytes());
        v.extend_from_slice(&self.bits);
        let sum = xxhash_rust::xxh3::xxh3_64(&v);
        v.extend_from_slice(&sum.to_le_bytes());
        v
    }

    /// Parses a state file's bytes; the error says what is wrong. Never panics.
    pub fn decode(b: &[u8]) -> Result<PartialState, String> {
        if b.len() < FIXED + 8 {
            return Err(format!("{} bytes, too short for a resume state", b.len()));
        }
        if b[..8] != MAGIC {
            return Err("not a resume state (bad magic)".into());
        }
        let (body, sum) = b.split_at(b.len() - 8);
        let want = u64::from_le_bytes(sum.try_into().map_err(|_| "truncated")?);
        let got = xxhash_rust::xxh3::xxh3_64(body);
        if want != got {
            return Err(format!(
                "checksum mismatch (stored {want:#018x}, computed {got:#018x}): the file is damaged"
            ));
        }
        let u64_at = |i: usize| {
            body.get(i..i + 8)
                .and_then(|s| s.try_into().ok())
                .map_or(0, u64::from_le_bytes)
        };
        let version = body
            .get(8..12)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u32::from_le_bytes);
        if version != VERSION {
            return Err(format!(
                "state version {version}, this build reads {VERSION}"
            ));
        }
        let fingerprint = body
            .get(12..28)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u128::from_le_bytes);
        let chunk_size = u64_at(28);
        let object_len = u64_at(36);
        let nbits = u64_at(44);
        if chunk_size == 0 || nbits != tracked_chunks(object_len, chunk_size) {
            return Err(format!(
                "inconsistent sizes (chunk size {chunk_size}, object {object_len} bytes, {nbits} chunks)"
            ));
        }
        let bits = &body[FIXED..];
        if bits.len() as u64 != nbits.div_ceil(8) {
            return Err(format!("bitmap of {} bytes for {nbits} chunks", bits.len()));
        }
        let st = PartialState {
            fingerprint,
            chunk_size,
            object_len,
            nbits,
            bits: bits.to_vec(),
        };
        if (nbits..bits.len() as u64 * 8).any(|k| bits[(k / 8) as usize] & (1 << (k % 8)) != 0) {
            return Err("bits set beyond the object's chunks".into());
        }
        Ok(st)
    }

    /// Reads the state at `path`: `Ok(None)` when there is none, `Err` (the reason) when the
    /// file exists but cannot be used.
    pub fn load(path: &Path) -> Result<Option<PartialState>, String> {
        let md = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        if !md.is_file() {
            return Err("not a regular file".into());
        }
        if md.len() > MAX_STATE_LEN {
            return Err(format!("{} bytes, too large for a resume state", md.len()));
        }
        let b = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        PartialState::decode(&b).map(Some)
    }

    /// Writes the state durably and atomically: to `<path>.tmp`, fsync, rename over `path`,
    /// fsync the directory.
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let ctx =
            |e: io::Error, p: &Path| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
        {
            let mut f = File::create(&tmp).map_err(|e| ctx(e, &tmp))?;
            f.write_all(&self.encode()).map_err(|e| ctx(e, &tmp))?;
            f.sync_all().map_err(|e| ctx(e, &tmp))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| ctx(e, path))?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Removes a resumable sink's state and part file (missing ones are fine).
pub fn discard(output: &Path) {
    let _ = std::fs::remove_file(state_path(output));
    let mut tmp = state_path(output).into_os_string();
    tmp.push(".tmp");
    let _ = std::fs::remove_file(tmp);
    let _ = std::fs::remove_file(part_path(output));
}

/// Loads and checks the resume state of the sink writing `output`: `Ok(Some(state))` when it
/// can be resumed from, `Ok(None)` when there is nothing to resume, `Err(reason)` when a state
/// exists but is damaged or foreign (the caller discards it and says so).
pub fn check(
    output: &Path,
    fingerprint: u128,
    chunk_size: u64,
) -> Result<Option<PartialState>, String> {
    let Some(st) = PartialState::load(&state_path(output))? else {
        return Ok(None);
    };
    if st.fingerprint != fingerprint {
        return Err(format!(
            "it belongs to another transfer (fingerprint {:032x}, this configuration's is \
             {fingerprint:032x}: a different source, chunk size or sink)",
            st.fingerprint
        ));
    }
    if st.chunk_size != chunk_size {
        return Err(format!(
            "it was written with chunk size {}, this configuration uses {chunk_size}",
            st.chunk_size
        ));
    }
    let part = part_path(output);
    let md = std::fs::symlink_metadata(&part)
        .map_err(|e| format!("its part file {} is unusable: {e}", part.display()))?;
    if !md.is_file() || md.len() > st.object_len {
        return Err(format!(
            "its part file {} has {} bytes, the object {}",
            part.display(),
            md.len(),
            st.object_len
        ));
    }
    if st.first_missing() == 0 {
        return Ok(None);
    }
    Ok(Some(st))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PartialState {
        let mut s = PartialState::new(0x1234_5678_9abc_def0_1122_3344_5566_7788, 65536, 1_000_000);
        for k in 0..7 {
            s.set(k);
        }
        s
    }

    #[test]
    fn round_trip_and_first_missing() {
        let s = sample();
        assert_eq!(s.tracked(), 1 + 16);
        assert_eq!(s.first_missing(), 7);
        let d = PartialState::decode(&s.encode()).unwrap();
        assert_eq!(d, s);
        let mut full = s.clone();
        for k in 0..100 {
            full.set(k);
        }
        assert_eq!(full.first_missing(), full.tracked());
        assert!(!full.has(17) && full.has(16));
    }

    #[test]
    fn every_bit_flip_and_truncation_is_caught() {
        let b = sample().encode();
        for bit in 0..b.len() * 8 {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(PartialState::decode(&c).is_err(), "bit {bit} flip accepted");
        }
        for n in 0..b.len() {
            assert!(PartialState::decode(&b[..n]).is_err(), "{n} bytes accepted");
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..20_000 {
            let len = (i % 120) as usize;
            let mut v: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if len >= 8 {
                v[..8].copy_from_slice(&MAGIC);
            }
            if len >= 16 {
                // A valid checksum, so the field checks run.
                let n = v.len() - 8;
                let sum = xxhash_rust::xxh3::xxh3_64(&v[..n]);
                v[n..].copy_from_slice(&sum.to_le_bytes());
            }
            let _ = PartialState::decode(&v);
        }
    }

    #[test]
    fn save_load_check_discard() {
        let d = std::env::temp_dir().join(format!("srdma-resume-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let out = d.join("out.bin");
        assert_eq!(check(&out, 1, 65536), Ok(None));
        let mut s = PartialState::new(1, 65536, 1_000_000);
        s.set(0);
        s.set(1);
        s.save(&state_path(&out)).unwrap();
        // No part file: unusable.
        assert!(check(&out, 1, 65536).unwrap_err().contains("part file"));
        std::fs::write(part_path(&out), vec![0u8; 1_000_000]).unwrap();
        assert_eq!(check(&out, 1, 65536).unwrap().unwrap().first_missing(), 2);
        assert!(
            check(&out, 2, 65536)
                .unwrap_err()
                .contains("another transfer")
        );
        assert!(check(&out, 1, 4096).unwrap_err().contains("chunk size"));
        let mut b = std::fs::read(state_path(&out)).unwrap();
        b[60] ^= 1;
        std::fs::write(state_path(&out), &b).unwrap();
        assert!(check(&out, 1, 65536).unwrap_err().contains("checksum"));
        discard(&out);
        assert!(!state_path(&out).exists() && !part_path(&out).exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
