//! Sources: where a transfer's objects come from.
//!
//! A [`Source`] yields objects one after another ([`Source::next_object`]) and fills ring slots
//! with each object's bytes ([`Source::read`]), straight into the slot: files are read with
//! read(2) into the caller's buffer, generated data is produced in place.
//!
//! Specs ([`open`]):
//! - `gen:SIZE[:SEED]`: one object of SIZE deterministic pseudo-random bytes. Byte `i` depends
//!   only on (SEED, i) (a counter-based generator, see [`gen_fill`]), so any receiver can
//!   recompute the expected bytes. SEED defaults to 1. Produces several GB/s.
//! - `file:PATH`: one object, the file; its name is the file's last path component.
//! - `dir:PATH`: every regular file below PATH (symbolic links are not followed), named by its
//!   path relative to PATH with `/` separators, in byte-wise sorted order.
//! - `stdin` (or `-`): one object named `stdin` of unknown length.
//! - a bare PATH: `file:` or `dir:` depending on what PATH is.

use crate::chunk::{CheckAlg, ChunkHeader, DIGEST_LEN, MAX_NAME_LEN, MAX_PAYLOAD, flags};
use crate::digest::ObjectDigest;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// What the next object of a source is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Relative name (UTF-8, `/`-separated) under which sinks store the object.
    pub name: String,
    /// Length in bytes, when known in advance (`None` for stdin).
    pub len: Option<u64>,
}

/// A sequence of objects to distribute.
pub trait Source: Send {
    /// Moves to the next object (skipping what is left of the current one); `None` when done.
    fn next_object(&mut self) -> std::io::Result<Option<ObjectInfo>>;
    /// Fills `dst` (a slot's payload area, registered memory) with the next bytes of the current
    /// object; returns 0 at the object's end. Fills fully unless the object ends.
    fn read(&mut self, dst: &mut [u8]) -> std::io::Result<usize>;
}

/// Opens a source from its spec (see the module documentation).
pub fn open(spec: &str) -> std::io::Result<Box<dyn Source>> {
    let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
    if let Some(rest) = spec.strip_prefix("gen:") {
        let (size, seed) = match rest.split_once(':') {
            Some((s, seed)) => {
                let seed = parse_seed(seed)
                    .ok_or_else(|| bad(format!("source {spec:?}: bad seed {seed:?}")))?;
                (s, seed)
            }
            None => (rest, 1),
        };
        let size = parse_size(size).map_err(|e| bad(format!("source {spec:?}: {e}")))?;
        return Ok(Box::new(GenSource::new(size, seed)));
    }
    if let Some(p) = spec.strip_prefix("file:") {
        return Ok(Box::new(FileSource::open(Path::new(p))?));
    }
    if let Some(p) = spec.strip_prefix("dir:") {
        return Ok(Box::new(DirSource::open(Path::new(p))?));
    }
    if spec == "stdin" || spec == "-" {
        return Ok(Box::new(StdinSource::new()));
    }
    if spec.is_empty() {
        return Err(bad(
            "empty source spec (gen:SIZE[:SEED], file:PATH, dir:PATH, stdin or a path)".into(),
        ));
    }
    let p = Path::new(spec);
    let md = std::fs::metadata(p).map_err(|e| with_path(e, p))?;
    if md.is_dir() {
        Ok(Box::new(DirSource::open(p)?))
    } else {
        Ok(Box::new(FileSource::open(p)?))
    }
}

fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses a byte count: a decimal integer with an optional unit, case-insensitive:
/// `KiB`/`MiB`/`GiB`/`TiB` and the short `K`/`M`/`G`/`T` are powers of 1024; `KB`/`MB`/`GB`/`TB`
/// are powers of 1000; `B` or nothing is bytes. Examples: "1GiB", "64MiB", "4KiB", "1G", "1000".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "bad size {s:?}: expected a number like 64MiB, 1G or 1000"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: number too large"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "bad size {s:?}: unknown unit {u:?} (B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("bad size {s:?}: more than 2^64 bytes"))
}

fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

// ---------------------------------------------------------------------------------------------
// gen

/// The generator's 64-bit word number `w` for `seed`: a counter-based wyrand step (one
/// 64x64->128-bit multiply per word, every word independent, so any offset can be produced
/// without the ones before it).
#[inline(always)]
fn gen_word(seed: u64, w: u64) -> u64 {
    let s = w
        .wrapping_mul(0xa076_1d64_78bd_642f)
        .wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let t = u128::from(s).wrapping_mul(u128::from(s ^ 0xe703_7ed1_a0b4_28db));
    ((t >> 64) as u64) ^ (t as u64)
}

/// Fills `dst` with the `gen` bytes of `seed` starting at byte `offset` of the stream: byte `i`
/// of the stream is byte `i % 8` (little-endian) of word `i / 8`. Deterministic and
/// position-independent, so tests and sinks can recompute any range.
pub fn gen_fill(seed: u64, offset: u64, dst: &mut [u8]) {
    let mut pos = offset;
    let mut rest = dst;
    // Leading partial word.
    let lead = (pos % 8) as usize;
    if lead != 0 && !rest.is_empty() {
        let bytes = gen_word(seed, pos / 8).to_le_bytes();
        let n = (8 - lead).min(rest.len());
        rest[..n].copy_from_slice(&bytes[lead..lead + n]);
        rest = &mut rest[n..];
        pos += n as u64;
    }
    let mut w = pos / 8;
    let mut words = rest.chunks_exact_mut(8);
    for c in &mut words {
        c.copy_from_slice(&gen_word(seed, w).to_le_bytes());
        w += 1;
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let bytes = gen_word(seed, w).to_le_bytes();
        let n = tail.len();
        tail.copy_from_slice(&bytes[..n]);
    }
}

/// `gen:SIZE[:SEED]`: one object of deterministic pseudo-random bytes.
#[derive(Debug)]
pub struct GenSource {
    size: u64,
    seed: u64,
    pos: u64,
    state: State,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Before,
    In,
    Done,
}

impl GenSource {
    /// A source of one object of `size` bytes generated from `seed`.
    pub fn new(size: u64, seed: u64) -> Self {
        GenSource {
            size,
            seed,
            pos: 0,
            state: State::Before,
        }
    }
}

impl Source for GenSource {
    fn next_object(&mut self) -> io::Result<Option<ObjectInfo>> {
        match self.state {
            State::Before => {
                self.state = State::In;
                Ok(Some(ObjectInfo {
                    name: format!("gen-{}-{}.bin", self.size, self.seed),
                    len: Some(self.size),
                }))
            }
            _ => {
                self.state = State::Done;
                Ok(None)
            }
        }
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.state != State::In {
            return Ok(0);
        }
        let n = (self.size - self.pos).min(dst.len() as u64) as usize;
        gen_fill(self.seed, self.pos, &mut dst[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------------
// files

/// Reads exactly `want` bytes of `f` into `dst` (read(2) straight into it) unless EOF comes
/// first; returns the count.
fn read_full(f: &mut impl Read, dst: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < dst.len() {
        match f.read(&mut dst[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A file being read as an object: its length is fixed when it is opened.
#[derive(Debug)]
struct OpenFile {
    file: File,
    path: PathBuf,
    len: u64,
    pos: u64,
}

impl OpenFile {
    fn open(path: &Path) -> io::Result<OpenFile> {
        let file = File::open(path).map_err(|e| with_path(e, path))?;
        let md = file.metadata().map_err(|e| with_path(e, path))?;
        if !md.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file", path.display()),
            ));
        }
        Ok(OpenFile {
            file,
            path: path.to_owned(),
            len: md.len(),
            pos: 0,
        })
    }

    /// Reads up to the length the file had when opened; a file that shrinks meanwhile is an
    /// error, bytes appended meanwhile are not sent.
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let want = (self.len - self.pos).min(dst.len() as u64) as usize;
        let n =
            read_full(&mut self.file, &mut dst[..want]).map_err(|e| with_path(e, &self.path))?;
        if n < want {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: file shrank while being sent (ended at {} of {} bytes)",
                    self.path.display(),
                    self.pos + n as u64,
                    self.len
                ),
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// `file:PATH`: one object, the file.
#[derive(Debug)]
pub struct FileSource {
    name: String,
    file: Option<OpenFile>,
    state: State,
}

impl FileSource {
    /// Opens `path` (must be a regular file).
    pub fn open(path: &Path) -> io::Result<FileSource> {
        let file = OpenFile::open(path)?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: file name is not UTF-8", path.display()),
                )
            })?
            .to_owned();
        Ok(FileSource {
            name,
            file: Some(file),
            state: State::Before,
        })
    }
}

impl Source for FileSource {
    fn next_object(&mut self) -> io::Result<Option<ObjectInfo>> {
        match (&self.state, &self.file) {
            (State::Before, Some(f)) => {
                self.state = State::In;
                Ok(Some(ObjectInfo {
                    name: self.name.clone(),
                    len: Some(f.len),
                }))
            }
            _ => {
                self.state = State::Done;
                self.file = None;
                Ok(None)
            }
        }
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match (&self.state, &mut self.file) {
            (State::In, Some(f)) => f.read(dst),
            _ => Ok(0),
        }
    }
}

/// `dir:PATH`: every regular file below a directory, sorted by relative name.
#[derive(Debug)]
pub struct DirSource {
    root: PathBuf,
    names: std::vec::IntoIter<String>,
    current: Option<OpenFile>,
}

impl DirSource {
    /// Lists every regular file below `root` (symbolic links are skipped, not followed).
    pub fn open(root: &Path) -> io::Result<DirSource> {
        let md = std::fs::metadata(root).map_err(|e| with_path(e, root))?;
        if !md.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a directory", root.display()),
            ));
        }
        let mut names = Vec::new();
        walk(root, "", &mut names)?;
        names.sort();
        Ok(DirSource {
            root: root.to_owned(),
            names: names.into_iter(),
            current: None,
        })
    }
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| with_path(e, dir))? {
        let entry = entry.map_err(|e| with_path(e, dir))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_str().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: file name is not UTF-8", path.display()),
            )
        })?;
        let rel = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let ft = entry.file_type().map_err(|e| with_path(e, &path))?;
        if ft.is_dir() {
            walk(&path, &rel, out)?;
        } else if ft.is_file() {
            out.push(rel);
        }
    }
    Ok(())
}

impl Source for DirSource {
    fn next_object(&mut self) -> io::Result<Option<ObjectInfo>> {
        self.current = None;
        let Some(name) = self.names.next() else {
            return Ok(None);
        };
        let f = OpenFile::open(&self.root.join(&name))?;
        let len = f.len;
        self.current = Some(f);
        Ok(Some(ObjectInfo {
            name,
            len: Some(len),
        }))
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match &mut self.current {
            Some(f) => f.read(dst),
            None => Ok(0),
        }
    }
}

/// `stdin`: one object of unknown length, read straight into the slot.
#[derive(Debug)]
pub struct StdinSource {
    state: State,
    eof: bool,
}

impl Default for StdinSource {
    fn default() -> Self {
        Self::new()
    }
}

impl StdinSource {
    /// The process's standard input as one object named `stdin`.
    pub fn new() -> Self {
        StdinSource {
            state: State::Before,
            eof: false,
        }
    }
}

impl Source for StdinSource {
    fn next_object(&mut self) -> io::Result<Option<ObjectInfo>> {
        match self.state {
            State::Before => {
                self.state = State::In;
                Ok(Some(ObjectInfo {
                    name: "stdin".into(),
                    len: None,
                }))
            }
            _ => {
                self.state = State::Done;
                Ok(None)
            }
        }
    }

    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.state != State::In || self.eof {
            return Ok(0);
        }
        // Stdin's own buffer is bypassed for large reads (std reads straight into `dst` when
        // its buffer is empty and `dst` is at least as large as it).
        let n = read_full(&mut io::stdin().lock(), dst)?;
        if n < dst.len() {
            self.eof = true;
        }
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------------
// framing

/// Turns a [`Source`] into the transfer's chunk sequence, straight into ring slots.
///
/// For every object: an `OBJECT_START` chunk (payload: the name), data chunks of `chunk_size`
/// bytes (the last one shorter), then an `OBJECT_END` chunk (payload: the 16-byte
/// [`ObjectDigest`] of the object's bytes; its `offset` and
/// `object_len` are the object's actual length, known even for stdin); after the last object
/// one `END_OF_TRANSFER` chunk. Every header comes back sealed; the caller encodes it in front
/// of the payload.
pub struct Framer {
    src: Box<dyn Source>,
    chunk_size: usize,
    alg: CheckAlg,
    seq: u64,
    object: u32,
    state: FrameState,
    offset: u64,
    len: Option<u64>,
    digest: ObjectDigest,
}

impl std::fmt::Debug for Framer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Framer")
            .field("chunk_size", &self.chunk_size)
            .field("seq", &self.seq)
            .field("object", &self.object)
            .field("offset", &self.offset)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameState {
    NeedObject,
    InObject,
    Finished,
}

impl Framer {
    /// Frames `src` into data chunks of `chunk_size` bytes, checksummed with `alg`.
    pub fn new(src: Box<dyn Source>, chunk_size: usize, alg: CheckAlg) -> io::Result<Framer> {
        if chunk_size == 0 || chunk_size > MAX_PAYLOAD as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("chunk size {chunk_size} outside 1..={MAX_PAYLOAD}"),
            ));
        }
        Ok(Framer {
            src,
            chunk_size,
            alg,
            seq: 0,
            object: 0,
            state: FrameState::NeedObject,
            offset: 0,
            len: None,
            digest: ObjectDigest::new(),
        })
    }

    /// Sequence number the next chunk gets (= chunks produced so far).
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// Writes the next chunk's payload into `payload` (a slot's payload area: at least
    /// `chunk_size` and [`MAX_NAME_LEN`] bytes) and returns its sealed header; `None` once
    /// `END_OF_TRANSFER` has been produced.
    pub fn next_chunk(&mut self, payload: &mut [u8]) -> io::Result<Option<ChunkHeader>> {
        let need = self.chunk_size.max(MAX_NAME_LEN as usize);
        if payload.len() < need {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot payload area of {} bytes, need {need}", payload.len()),
            ));
        }
        let mut h = ChunkHeader::data(self.seq, self.object, 0, 0, u64::MAX, self.alg);
        let n = match self.state {
            FrameState::Finished => return Ok(None),
            FrameState::NeedObject => match self.src.next_object()? {
                None => {
                    h.flags = flags::END_OF_TRANSFER;
                    self.state = FrameState::Finished;
                    0
                }
                Some(info) => {
                    let name = info.name.as_bytes();
                    if name.is_empty() || name.len() > MAX_NAME_LEN as usize {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "object name {:?}: {} bytes (1..={MAX_NAME_LEN})",
                                info.name,
                                name.len()
                            ),
                        ));
                    }
                    payload[..name.len()].copy_from_slice(name);
                    h.flags = flags::OBJECT_START;
                    h.object_len = info.len.unwrap_or(u64::MAX);
                    self.len = info.len;
                    self.offset = 0;
                    self.digest = ObjectDigest::new();
                    self.state = FrameState::InObject;
                    name.len()
                }
            },
            FrameState::InObject => {
                let n = self.src.read(&mut payload[..self.chunk_size])?;
                if n > 0 {
                    self.digest.update(&payload[..n]);
                    h.offset = self.offset;
                    h.raw_len = n as u32;
                    h.object_len = self.len.unwrap_or(u64::MAX);
                    self.offset += n as u64;
                    if self.len.is_some_and(|l| self.offset > l) {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("object {} grew beyond its announced length", self.object),
                        ));
                    }
                    n
                } else {
                    if let Some(l) = self.len.filter(|&l| l != self.offset) {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "object {} ended at {} of its announced {l} bytes",
                                self.object, self.offset
                            ),
                        ));
                    }
                    payload[..DIGEST_LEN as usize].copy_from_slice(&self.digest.finish());
                    h.flags = flags::OBJECT_END;
                    h.offset = self.offset;
                    h.object_len = self.offset;
                    self.object += 1;
                    self.state = FrameState::NeedObject;
                    DIGEST_LEN as usize
                }
            }
        };
        h.seal(&payload[..n]);
        self.seq += 1;
        Ok(Some(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2 MB"), Ok(2_000_000));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("7B"), Ok(7));
        for bad in [
            "",
            "GiB",
            "1.5G",
            "-1",
            "1XB",
            "99999999999999999999",
            "16777216TiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn gen_is_position_independent() {
        let mut whole = vec![0u8; 1000];
        gen_fill(5, 3, &mut whole);
        // Any split into pieces at any offsets gives the same bytes.
        for step in [1usize, 3, 7, 8, 9, 64, 333] {
            let mut pieces = vec![0u8; 1000];
            let mut at = 0;
            while at < 1000 {
                let n = step.min(1000 - at);
                gen_fill(5, 3 + at as u64, &mut pieces[at..at + n]);
                at += n;
            }
            assert_eq!(pieces, whole, "step {step}");
        }
        let mut other = vec![0u8; 1000];
        gen_fill(6, 3, &mut other);
        assert_ne!(other, whole, "seed must matter");
    }

    #[test]
    fn gen_source_reads_size_bytes_then_zero() {
        let mut s = open("gen:10000:42").unwrap();
        let info = s.next_object().unwrap().unwrap();
        assert_eq!(info.len, Some(10_000));
        let mut all = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            // Fills fully unless the object ends.
            assert!(n == 4096 || all.len() + n == 10_000);
            all.extend_from_slice(&buf[..n]);
        }
        assert_eq!(all.len(), 10_000);
        let mut expect = vec![0u8; 10_000];
        gen_fill(42, 0, &mut expect);
        assert_eq!(all, expect);
        assert!(s.next_object().unwrap().is_none());
        assert_eq!(s.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn gen_bytes_look_random() {
        let mut b = vec![0u8; 1 << 16];
        gen_fill(1, 0, &mut b);
        let mut counts = [0u32; 256];
        for &x in &b {
            counts[x as usize] += 1;
        }
        // 65536 bytes over 256 values: about 256 each.
        assert!(
            counts.iter().all(|&c| (150..400).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn bad_specs() {
        for bad in [
            "gen:",
            "gen:12Q",
            "gen:1K:zz",
            "",
            "/nonexistent/srdma/relay/x",
        ] {
            assert!(open(bad).is_err(), "{bad:?} accepted");
        }
    }
}
