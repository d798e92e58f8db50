//! Stages: what a relay does to each chunk, in place in its ring slot, before forwarding it.
//!
//! Specs ([`build`]):
//! - `verify`: checks every chunk's checksum against its payload (any hop catches a flipped
//!   bit). Touches no byte.
//! - `compress` / `compress:LEVEL`: zstd-compresses data chunks (level default
//!   [`DEFAULT_LEVEL`]). A chunk whose compressed form is not smaller stays uncompressed (so a
//!   payload never grows); an already compressed chunk passes through.
//! - `decompress`: undoes `compress`; uncompressed chunks pass through.
//! - `exec:COMMAND LINE`: runs `sh -c 'COMMAND LINE'` once per data chunk (a new process per
//!   chunk: simple and isolated, at the cost of a fork+exec per chunk, ~1 ms, which is small
//!   next to a multi-MiB chunk), feeds the payload on its stdin and replaces the payload with
//!   its stdout. The environment carries `SRDMA_SEQ`, `SRDMA_OBJECT`, `SRDMA_OFFSET`,
//!   `SRDMA_RAW_LEN` and `SRDMA_COMPRESSED` (0/1). A non-zero exit is an error carrying its
//!   stderr. On an uncompressed chunk the output must have the input's length (chunk offsets
//!   stay valid); on a compressed chunk it may have any length up to the slot's capacity.
//!
//! Every stage processes data chunks only: control chunks (`OBJECT_START`, `OBJECT_END`,
//! `END_OF_TRANSFER`) pass through untouched (`verify` still checks them). Stages that change
//! bytes first verify the incoming checksum (so they never re-seal corrupt data as good) and
//! re-seal the header afterwards.

use crate::chunk::{ChunkHeader, FrameError, MAX_NAME_LEN, flags};
use std::io::{self, Read, Write};
use std::process::{Command, Stdio};

/// zstd level `compress` uses when none is given (fast: relays chase bandwidth).
pub const DEFAULT_LEVEL: i32 = 1;

/// Most stderr bytes an `exec` error keeps (the end of the output).
const STDERR_KEEP: usize = 4096;

/// Why a stage failed on a chunk.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The chunk's payload does not match its checksum (or its lengths do not fit the slot).
    #[error("chunk {seq} corrupt: {error}")]
    Corrupt {
        /// The chunk's sequence number.
        seq: u64,
        /// What is wrong.
        #[source]
        error: FrameError,
    },
    /// An I/O error (spawning or talking to an `exec` command).
    #[error("stage I/O: {0}")]
    Io(#[from] io::Error),
    /// An `exec` command failed.
    #[error("exec stage `{cmd}` failed ({status}){}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    Exec {
        /// The command line.
        cmd: String,
        /// How it ended (exit status, or what was wrong with its output).
        status: String,
        /// The end of its standard error, trimmed.
        stderr: String,
    },
    /// A stage spec that cannot be parsed.
    #[error("bad stage spec: {0}")]
    Spec(String),
    /// zstd failed (corrupt compressed data, or data that does not decompress to `raw_len`).
    #[error("chunk {seq}: zstd: {message}")]
    Compress {
        /// The chunk's sequence number.
        seq: u64,
        /// What zstd said.
        message: String,
    },
    /// The stage's output does not fit the slot's payload capacity.
    #[error(
        "chunk {seq}: output of {need} bytes does not fit the slot's {capacity}-byte payload area"
    )]
    TooLarge {
        /// The chunk's sequence number.
        seq: u64,
        /// Bytes needed (at least).
        need: usize,
        /// Payload capacity of the slot.
        capacity: usize,
    },
}

/// A chunk in its ring slot.
pub struct Chunk<'a> {
    /// The decoded header (written back to the slot by the caller after the stages ran).
    pub header: &'a mut ChunkHeader,
    /// The slot's payload area (its whole capacity); the payload is `buf[..header.payload_len]`.
    pub buf: &'a mut [u8],
}

impl std::fmt::Debug for Chunk<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunk")
            .field("header", &self.header)
            .field("capacity", &self.buf.len())
            .finish()
    }
}

impl Chunk<'_> {
    /// Checks the payload fits the slot and matches the header's checksum.
    pub fn verify(&self) -> Result<(), StageError> {
        self.header
            .verify(self.buf)
            .map_err(|error| StageError::Corrupt {
                seq: self.header.seq,
                error,
            })
    }

    /// The payload as it is now (empty if `payload_len` overruns the slot; `verify` reports that).
    pub fn payload(&self) -> &[u8] {
        self.buf
            .get(..self.header.payload_len as usize)
            .unwrap_or(&[])
    }
}

/// One processing step a relay applies to every chunk.
pub trait Stage: Send {
    /// The stage's name (its spec).
    fn name(&self) -> &str;
    /// Processes the chunk in place (data chunks only; OBJECT_START/END pass through untouched).
    /// A stage that changes bytes re-seals the header.
    fn process(&mut self, chunk: Chunk<'_>) -> Result<(), StageError>;
    /// Bytes this stage copied in user space so far (counted for the "≤ 1% copied" target).
    fn copied_bytes(&self) -> u64 {
        0
    }
}

/// "verify" | "compress" | "compress:LEVEL" | "decompress" | "exec:COMMAND LINE"
pub fn build(spec: &str) -> Result<Box<dyn Stage>, StageError> {
    let spec_t = spec.trim();
    if let Some(cmd) = spec_t.strip_prefix("exec:") {
        if cmd.trim().is_empty() {
            return Err(StageError::Spec(format!("{spec:?}: exec needs a command")));
        }
        return Ok(Box::new(ExecStage::new(cmd)));
    }
    match spec_t.split_once(':') {
        None if spec_t == "verify" => Ok(Box::new(VerifyStage::default())),
        None if spec_t == "compress" => Ok(Box::new(CompressStage::new(DEFAULT_LEVEL)?)),
        None if spec_t == "decompress" => Ok(Box::new(DecompressStage::new()?)),
        Some(("compress", level)) => {
            let level: i32 = level.trim().parse().map_err(|_| {
                StageError::Spec(format!("{spec:?}: compression level must be an integer"))
            })?;
            let range = zstd::compression_level_range();
            if !range.contains(&level) {
                return Err(StageError::Spec(format!(
                    "{spec:?}: zstd level {level} outside {}..={}",
                    range.start(),
                    range.end()
                )));
            }
            Ok(Box::new(CompressStage::new(level)?))
        }
        _ => Err(StageError::Spec(format!(
            "{spec:?}: expected verify, compress[:LEVEL], decompress or exec:COMMAND"
        ))),
    }
}

/// Payload capacity a slot needs for chunks of `chunk_size` object bytes going through
/// `stages`: at least `chunk_size`, at least [`MAX_NAME_LEN`] (an `OBJECT_START` carries a name
/// of up to that many bytes), and the zstd bound of `chunk_size` when a stage may produce
/// compressed or command output (`compress` never grows a payload, but an `exec` on compressed
/// chunks may).
pub fn capacity_for(chunk_size: usize, stages: &[String]) -> usize {
    let mut cap = chunk_size.max(MAX_NAME_LEN as usize);
    for s in stages {
        let s = s.trim();
        if s.starts_with("compress") || s.starts_with("exec:") {
            cap = cap.max(zstd::zstd_safe::compress_bound(chunk_size));
        }
    }
    cap
}

/// `verify`: checks checksums, changes nothing.
#[derive(Debug, Default)]
pub struct VerifyStage {
    chunks: u64,
}

impl Stage for VerifyStage {
    fn name(&self) -> &str {
        "verify"
    }

    fn process(&mut self, chunk: Chunk<'_>) -> Result<(), StageError> {
        chunk.verify()?;
        self.chunks += 1;
        Ok(())
    }
}

fn zstd_err(seq: u64, e: io::Error) -> StageError {
    StageError::Compress {
        seq,
        message: e.to_string(),
    }
}

/// `compress[:LEVEL]`: zstd-compresses data chunks via a scratch buffer.
pub struct CompressStage {
    name: String,
    cctx: zstd::bulk::Compressor<'static>,
    scratch: Vec<u8>,
    copied: u64,
}

impl std::fmt::Debug for CompressStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressStage")
            .field("name", &self.name)
            .finish()
    }
}

impl CompressStage {
    /// A compressor at zstd `level`.
    pub fn new(level: i32) -> Result<Self, StageError> {
        let cctx = zstd::bulk::Compressor::new(level)
            .map_err(|e| StageError::Spec(format!("zstd level {level}: {e}")))?;
        Ok(CompressStage {
            name: if level == DEFAULT_LEVEL {
                "compress".into()
            } else {
                format!("compress:{level}")
            },
            cctx,
            scratch: Vec::new(),
            copied: 0,
        })
    }
}

impl Stage for CompressStage {
    fn name(&self) -> &str {
        &self.name
    }

    fn process(&mut self, chunk: Chunk<'_>) -> Result<(), StageError> {
        let h = &*chunk.header;
        if !h.is_data() || h.has(flags::COMPRESSED) || h.payload_len == 0 {
            return Ok(());
        }
        chunk.verify()?;
        let n = chunk.header.payload_len as usize;
        let bound = zstd::zstd_safe::compress_bound(n);
        if self.scratch.len() < bound {
            self.scratch.resize(bound, 0);
        }
        let c = self
            .cctx
            .compress_to_buffer(&chunk.buf[..n], &mut self.scratch[..bound])
            .map_err(|e| zstd_err(chunk.header.seq, e))?;
        if c >= n {
            return Ok(()); // incompressible: forward as is, nothing copied
        }
        chunk.buf[..c].copy_from_slice(&self.scratch[..c]);
        self.copied += c as u64;
        chunk.header.flags |= flags::COMPRESSED;
        chunk.header.seal(&chunk.buf[..c]);
        Ok(())
    }

    fn copied_bytes(&self) -> u64 {
        self.copied
    }
}

/// `decompress`: undoes `compress` via a scratch buffer.
pub struct DecompressStage {
    dctx: zstd::bulk::Decompressor<'static>,
    scratch: Vec<u8>,
    copied: u64,
}

impl std::fmt::Debug for DecompressStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecompressStage").finish()
    }
}

impl DecompressStage {
    /// A decompressor.
    pub fn new() -> Result<Self, StageError> {
        let dctx = zstd::bulk::Decompressor::new()
            .map_err(|e| StageError::Spec(format!("zstd decompressor: {e}")))?;
        Ok(DecompressStage {
            dctx,
            scratch: Vec::new(),
            copied: 0,
        })
    }
}

impl Stage for DecompressStage {
    fn name(&self) -> &str {
        "decompress"
    }

    fn process(&mut self, chunk: Chunk<'_>) -> Result<(), StageError> {
        let h = &*chunk.header;
        if !h.is_data() || !h.has(flags::COMPRESSED) {
            return Ok(());
        }
        chunk.verify()?;
        let seq = chunk.header.seq;
        let raw = chunk.header.raw_len as usize;
        if raw > chunk.buf.len() {
            return Err(StageError::TooLarge {
                seq,
                need: raw,
                capacity: chunk.buf.len(),
            });
        }
        // One spare byte: output longer than raw_len must not fit exactly.
        if self.scratch.len() < raw + 1 {
            self.scratch.resize(raw + 1, 0);
        }
        let n = chunk.header.payload_len as usize;
        let got = self
            .dctx
            .decompress_to_buffer(&chunk.buf[..n], &mut self.scratch[..raw + 1])
            .map_err(|e| zstd_err(seq, e))?;
        if got != raw {
            return Err(StageError::Compress {
                seq,
                message: format!("decompressed to {got} bytes, header says {raw}"),
            });
        }
        chunk.buf[..raw].copy_from_slice(&self.scratch[..raw]);
        self.copied += raw as u64;
        chunk.header.flags &= !flags::COMPRESSED;
        chunk.header.seal(&chunk.buf[..raw]);
        Ok(())
    }

    fn copied_bytes(&self) -> u64 {
        self.copied
    }
}

/// `exec:COMMAND LINE`: pipes each data chunk through `sh -c COMMAND LINE`.
#[derive(Debug)]
pub struct ExecStage {
    name: String,
    cmd: String,
    scratch: Vec<u8>,
    copied: u64,
}

impl ExecStage {
    /// A stage running `cmd` with `sh -c` for every data chunk.
    pub fn new(cmd: &str) -> Self {
        ExecStage {
            name: format!("exec:{cmd}"),
            cmd: cmd.to_owned(),
            scratch: Vec::new(),
            copied: 0,
        }
    }

    fn fail(&self, status: String, stderr: &[u8]) -> StageError {
        let tail = &stderr[stderr.len().saturating_sub(STDERR_KEEP)..];
        StageError::Exec {
            cmd: self.cmd.clone(),
            status,
            stderr: String::from_utf8_lossy(tail).trim().to_owned(),
        }
    }
}

/// Reads `r` to its end into `out[..]`, stopping early (returning `cap + 1`) when more than
/// `cap` bytes come.
fn read_capped(r: &mut impl Read, out: &mut Vec<u8>, cap: usize) -> io::Result<usize> {
    out.clear();
    if out.capacity() < cap + 1 {
        out.reserve(cap + 1);
    }
    let limit = (cap + 1) as u64;
    r.take(limit).read_to_end(out)?;
    Ok(out.len())
}

/// Asks the kernel for a pipe buffer of `len` bytes (ignored when refused: unprivileged
/// processes are capped by /proc/sys/fs/pipe-max-size).
fn grow_pipe(p: &impl std::os::fd::AsRawFd, len: usize) {
    let len = libc::c_int::try_from(len).unwrap_or(libc::c_int::MAX);
    // SAFETY: fcntl on a pipe fd we own, with an integer argument; no memory is passed.
    unsafe {
        libc::fcntl(p.as_raw_fd(), libc::F_SETPIPE_SZ, len);
    }
}

impl Stage for ExecStage {
    fn name(&self) -> &str {
        &self.name
    }

    fn process(&mut self, chunk: Chunk<'_>) -> Result<(), StageError> {
        if !chunk.header.is_data() {
            return Ok(());
        }
        chunk.verify()?;
        let h = *chunk.header;
        let n = h.payload_len as usize;
        let cap = chunk.buf.len();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.cmd)
            .env("SRDMA_SEQ", h.seq.to_string())
            .env("SRDMA_OBJECT", h.object.to_string())
            .env("SRDMA_OFFSET", h.offset.to_string())
            .env("SRDMA_RAW_LEN", h.raw_len.to_string())
            .env(
                "SRDMA_COMPRESSED",
                if h.has(flags::COMPRESSED) { "1" } else { "0" },
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("spawning sh -c {:?}: {e}", self.cmd)))?;
        let mut stdin = child.stdin.take();
        let mut stdout = child.stdout.take();
        // Bigger pipes: fewer context switches per multi-MiB chunk (best effort).
        let pipe_len = n.clamp(1 << 16, 1 << 20);
        if let Some(p) = &stdin {
            grow_pipe(p, pipe_len);
        }
        if let Some(p) = &stdout {
            grow_pipe(p, pipe_len);
        }
        let mut stderr = child.stderr.take();
        let payload = &chunk.buf[..n];
        let scratch = &mut self.scratch;
        // Feed stdin and drain stderr on helper threads while this one drains stdout, so no
        // pipe fills up and deadlocks.
        let (out_len, err_bytes) = std::thread::scope(|s| {
            let feeder = s.spawn(move || {
                if let Some(mut w) = stdin.take() {
                    // A command that stops reading early (EPIPE) is not an error by itself;
                    // its exit status says whether it failed.
                    let _ = w.write_all(payload);
                }
            });
            let errs = s.spawn(move || {
                let mut v = Vec::new();
                if let Some(mut e) = stderr.take() {
                    let _ = (&mut e).take(1 << 20).read_to_end(&mut v);
                    // Keep draining past the cap so the command never blocks on stderr.
                    let _ = io::copy(&mut e, &mut io::sink());
                }
                v
            });
            let out = match stdout.as_mut() {
                Some(o) => read_capped(o, scratch, cap),
                None => Ok(0),
            };
            if !matches!(out, Ok(m) if m <= cap) {
                // Too much output (or a read error): stop the command so the helpers finish.
                let _ = child.kill();
            }
            drop(stdout);
            let _ = feeder.join();
            let err_bytes = errs.join().unwrap_or_default();
            (out, err_bytes)
        });
        let status = child.wait()?;
        let out_len = out_len?;
        if out_len > cap {
            return Err(StageError::TooLarge {
                seq: h.seq,
                need: out_len,
                capacity: cap,
            });
        }
        if !status.success() {
            return Err(self.fail(status.to_string(), &err_bytes));
        }
        if !h.has(flags::COMPRESSED) && out_len != n {
            return Err(self.fail(
                format!(
                    "wrote {out_len} bytes for a {n}-byte uncompressed chunk; commands must keep \
                     the length of uncompressed data"
                ),
                &err_bytes,
            ));
        }
        chunk.buf[..out_len].copy_from_slice(&self.scratch[..out_len]);
        self.copied += out_len as u64;
        chunk.header.seal(&chunk.buf[..out_len]);
        Ok(())
    }

    fn copied_bytes(&self) -> u64 {
        self.copied
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::CheckAlg;

    /// A sealed data chunk of `data` in a slot of `cap` payload bytes.
    fn slot(data: &[u8], cap: usize, alg: CheckAlg) -> (ChunkHeader, Vec<u8>) {
        let mut buf = vec![0u8; cap];
        buf[..data.len()].copy_from_slice(data);
        let mut h = ChunkHeader::data(9, 0, 0, data.len() as u32, u64::MAX, alg);
        h.seal(data);
        (h, buf)
    }

    fn text(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| b"the quick brown fox jumps over the lazy dog "[i % 44])
            .collect()
    }

    fn run(st: &mut dyn Stage, h: &mut ChunkHeader, buf: &mut [u8]) -> Result<(), StageError> {
        st.process(Chunk { header: h, buf })
    }

    #[test]
    fn build_specs() {
        for ok in [
            "verify",
            "compress",
            "compress:5",
            "compress:-3",
            "decompress",
            "exec:cat",
        ] {
            assert!(build(ok).is_ok(), "{ok}");
        }
        assert_eq!(build("compress:5").unwrap().name(), "compress:5");
        for bad in [
            "",
            "zip",
            "compress:x",
            "compress:99",
            "exec:",
            "exec:  ",
            "verify:1",
        ] {
            assert!(matches!(build(bad), Err(StageError::Spec(_))), "{bad:?}");
        }
    }

    #[test]
    fn capacity() {
        assert_eq!(capacity_for(1 << 20, &[]), 1 << 20);
        assert_eq!(capacity_for(1 << 20, &["verify".into()]), 1 << 20);
        assert!(capacity_for(1 << 20, &["compress:3".into()]) > 1 << 20);
        assert!(capacity_for(1 << 20, &["exec:cat".into()]) > 1 << 20);
        // Room for the longest object name even with tiny chunks.
        assert_eq!(capacity_for(100, &[]), MAX_NAME_LEN as usize);
    }

    #[test]
    fn verify_catches_a_flipped_bit_in_any_alg() {
        for alg in [CheckAlg::Crc32c, CheckAlg::Xxh3] {
            let data = text(5000);
            let (mut h, mut buf) = slot(&data, 8192, alg);
            let mut v = build("verify").unwrap();
            run(v.as_mut(), &mut h, &mut buf).unwrap();
            buf[1234] ^= 4;
            match run(v.as_mut(), &mut h, &mut buf) {
                Err(StageError::Corrupt {
                    seq: 9,
                    error: FrameError::ChecksumMismatch { .. },
                }) => {}
                other => panic!("{other:?}"),
            }
            // Bytes past payload_len are not the payload: changing them is fine.
            buf[1234] ^= 4;
            buf[6000] ^= 1;
            run(v.as_mut(), &mut h, &mut buf).unwrap();
        }
    }

    #[test]
    fn verify_rejects_payload_len_beyond_slot() {
        let (mut h, mut buf) = slot(&text(100), 100, CheckAlg::Crc32c);
        h.payload_len = 101;
        h.raw_len = 101;
        let mut v = build("verify").unwrap();
        assert!(matches!(
            run(v.as_mut(), &mut h, &mut buf),
            Err(StageError::Corrupt { .. })
        ));
    }

    #[test]
    fn compress_then_decompress_round_trip() {
        let data = text(1 << 20);
        let cap = capacity_for(1 << 20, &["compress".into()]);
        let (mut h, mut buf) = slot(&data, cap, CheckAlg::Xxh3);
        let mut c = build("compress:3").unwrap();
        let mut d = build("decompress").unwrap();
        run(c.as_mut(), &mut h, &mut buf).unwrap();
        assert!(h.has(flags::COMPRESSED));
        assert!(
            h.payload_len < 100_000,
            "text should compress well: {}",
            h.payload_len
        );
        assert_eq!(h.raw_len, 1 << 20);
        assert_eq!(c.copied_bytes(), u64::from(h.payload_len));
        h.validate().unwrap();
        h.verify(&buf).unwrap();
        // Compressing again is a no-op.
        let before = h;
        run(c.as_mut(), &mut h, &mut buf).unwrap();
        assert_eq!(h, before);
        run(d.as_mut(), &mut h, &mut buf).unwrap();
        assert!(!h.has(flags::COMPRESSED));
        assert_eq!(h.payload_len, 1 << 20);
        assert!(buf[..1 << 20] == data[..]);
        h.verify(&buf).unwrap();
        assert_eq!(d.copied_bytes(), 1 << 20);
        // Decompressing an uncompressed chunk is a no-op.
        run(d.as_mut(), &mut h, &mut buf).unwrap();
        assert!(buf[..1 << 20] == data[..]);
    }

    #[test]
    fn incompressible_chunks_stay_raw() {
        let mut data = vec![0u8; 65536];
        crate::source::gen_fill(3, 0, &mut data);
        let (mut h, mut buf) = slot(&data, 70_000, CheckAlg::Crc32c);
        let mut c = build("compress").unwrap();
        run(c.as_mut(), &mut h, &mut buf).unwrap();
        assert!(!h.has(flags::COMPRESSED));
        assert!(buf[..65536] == data[..]);
        assert_eq!(c.copied_bytes(), 0);
    }

    #[test]
    fn control_chunks_pass_through() {
        let mut h = ChunkHeader::data(0, 0, 0, 0, 10, CheckAlg::Crc32c);
        h.flags = flags::OBJECT_START;
        let name = b"some/name.txt";
        let mut buf = vec![0u8; 4096];
        buf[..name.len()].copy_from_slice(name);
        h.seal(name);
        let before = (h, buf.clone());
        for spec in ["verify", "compress", "decompress", "exec:false"] {
            let mut st = build(spec).unwrap();
            run(st.as_mut(), &mut h, &mut buf).unwrap();
            assert_eq!((h, buf.clone()), before, "{spec}");
        }
    }

    #[test]
    fn corrupt_input_is_not_resealed() {
        for spec in ["compress", "exec:cat"] {
            let (mut h, mut buf) = slot(&text(10_000), 20_000, CheckAlg::Crc32c);
            buf[10] ^= 0x80;
            let mut st = build(spec).unwrap();
            assert!(
                matches!(
                    run(st.as_mut(), &mut h, &mut buf),
                    Err(StageError::Corrupt { .. })
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn decompress_garbage_is_an_error() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut d = build("decompress").unwrap();
        for len in [0usize, 1, 4, 13, 100, 5000] {
            let mut g = vec![0u8; len];
            for b in g.iter_mut() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *b = s as u8;
            }
            // Also a real zstd magic with garbage after it.
            if len >= 4 {
                g[..4].copy_from_slice(&[0x28, 0xb5, 0x2f, 0xfd]);
            }
            let (mut h, mut buf) = slot(&g, 8192, CheckAlg::Crc32c);
            h.flags |= flags::COMPRESSED;
            h.raw_len = 4096;
            assert!(
                matches!(
                    run(d.as_mut(), &mut h, &mut buf),
                    Err(StageError::Compress { .. })
                ),
                "len {len}"
            );
        }
    }

    #[test]
    fn decompress_wrong_raw_len_is_an_error() {
        let data = text(10_000);
        let (mut h, mut buf) = slot(&data, 20_000, CheckAlg::Crc32c);
        run(build("compress").unwrap().as_mut(), &mut h, &mut buf).unwrap();
        assert!(h.has(flags::COMPRESSED));
        for raw in [9_999u32, 10_001] {
            let mut h2 = h;
            h2.raw_len = raw;
            let mut b2 = buf.clone();
            assert!(matches!(
                run(build("decompress").unwrap().as_mut(), &mut h2, &mut b2),
                Err(StageError::Compress { .. })
            ));
        }
        // raw_len larger than the slot.
        let mut h3 = h;
        h3.raw_len = 30_000;
        assert!(matches!(
            run(build("decompress").unwrap().as_mut(), &mut h3, &mut buf),
            Err(StageError::TooLarge { need: 30_000, .. })
        ));
    }

    #[test]
    fn exec_transforms_in_place() {
        let data = b"hello relay world".repeat(1000);
        let (mut h, mut buf) = slot(&data, 32_768, CheckAlg::Crc32c);
        let mut st = build("exec:tr a-z A-Z").unwrap();
        run(st.as_mut(), &mut h, &mut buf).unwrap();
        assert!(buf[..data.len()] == data.to_ascii_uppercase()[..]);
        h.verify(&buf).unwrap();
        assert_eq!(st.copied_bytes(), data.len() as u64);
    }

    #[test]
    fn exec_large_chunk_does_not_deadlock() {
        // More than any pipe buffer in both directions at once.
        let mut data = vec![0u8; 4 << 20];
        crate::source::gen_fill(1, 0, &mut data);
        let (mut h, mut buf) = slot(&data, 4 << 20, CheckAlg::Xxh3);
        run(build("exec:cat").unwrap().as_mut(), &mut h, &mut buf).unwrap();
        assert!(buf[..] == data[..]);
    }

    #[test]
    fn exec_sees_chunk_environment() {
        let data = b"0123456789".to_vec();
        let (mut h, mut buf) = slot(&data, 64, CheckAlg::Crc32c);
        h.flags |= flags::COMPRESSED; // lets the output length change
        h.raw_len = 99;
        h.seal(&data);
        let mut st =
            build("exec:cat >/dev/null; printf '%s,%s' \"$SRDMA_SEQ\" \"$SRDMA_COMPRESSED\"")
                .unwrap();
        run(st.as_mut(), &mut h, &mut buf).unwrap();
        assert_eq!(&buf[..h.payload_len as usize], b"9,1");
        h.verify(&buf).unwrap();
    }

    #[test]
    fn exec_failure_carries_stderr() {
        let (mut h, mut buf) = slot(b"abc", 64, CheckAlg::Crc32c);
        let mut st = build("exec:echo disk on fire >&2; exit 3").unwrap();
        match run(st.as_mut(), &mut h, &mut buf) {
            Err(StageError::Exec {
                cmd,
                status,
                stderr,
            }) => {
                assert!(cmd.contains("exit 3"));
                assert!(status.contains('3'), "{status}");
                assert_eq!(stderr, "disk on fire");
            }
            other => panic!("{other:?}"),
        }
        // Payload untouched on failure.
        assert_eq!(&buf[..3], b"abc");
        h.verify(&buf).unwrap();
    }

    #[test]
    fn exec_output_too_large_or_wrong_length() {
        let (mut h, mut buf) = slot(b"abc", 64, CheckAlg::Crc32c);
        let mut st = build("exec:cat >/dev/null; head -c 100000 /dev/zero").unwrap();
        assert!(matches!(
            run(st.as_mut(), &mut h, &mut buf),
            Err(StageError::TooLarge { capacity: 64, .. })
        ));
        // An endless producer is stopped too.
        let mut st = build("exec:cat /dev/zero").unwrap();
        assert!(matches!(
            run(st.as_mut(), &mut h, &mut buf),
            Err(StageError::TooLarge { .. })
        ));
        // Uncompressed data must keep its length.
        let mut st = build("exec:cat; echo extra").unwrap();
        assert!(matches!(
            run(st.as_mut(), &mut h, &mut buf),
            Err(StageError::Exec { .. })
        ));
        assert_eq!(&buf[..3], b"abc");
    }
}
