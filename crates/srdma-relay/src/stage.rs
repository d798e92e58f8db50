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
#[derive(Debug)]
pub struct Chunk<'a> {
    /// The decoded header (written back to the slot by the caller after the stages ran).
    pub header: &'a mut ChunkHeader,
    /// The slot's payload area (its whole capacity); the payload is `buf[..header.payload_len]`.
    pub buf: &'a mut [u8],
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
