//! Sinks: where a transfer's objects end up.
//!
//! The node calls [`Sink::begin`] at an object's `OBJECT_START`, [`Sink::write`] for each data
//! chunk (at the chunk's offset), then [`Sink::commit`] when every byte arrived and the
//! whole-object digest matched, or [`Sink::abort`] on failure.
//!
//! Specs ([`open`]):
//! - `file:PATH`: one object, stored at PATH.
//! - `dir:PATH`: every object stored at PATH/NAME (NAME is the object's relative name;
//!   names with `..`, `.`, empty components, absolute paths or NULs are rejected, and so is
//!   any existing symbolic link on the way, so nothing is written outside PATH).
//! - `stdout` (or `-`): objects written to standard output one after another, in offset order.
//! - `discard` (or `null`): bytes counted and dropped.
//!
//! File and directory sinks are atomic: an object is written to `<final>.srdma-part-<pid>`
//! and renamed to its final name on commit (after fsync); abort (or dropping the sink with an
//! object in progress) removes the partial file. A full disk surfaces as an `io::Error` whose
//! kind is [`std::io::ErrorKind::StorageFull`], with the path in the message.
//!
//! A resumable file sink ([`FileSink::resumable`], `resume = true` in the configuration)
//! writes to the stable `<final>.srdma-part` instead and keeps it when the run ends without
//! the object ([`Sink::suspend`]), so that a later run can [`Sink::reopen`] it; see
//! [`crate::resume`].

use crate::chunk::{ChunkHeader, DIGEST_LEN, FrameError, flags};
use crate::digest::{ObjectDigest, hex};
use crate::source::ObjectInfo;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// A destination for objects.
pub trait Sink: Send {
    /// Starts an object (the previous one must have been committed or aborted).
    fn begin(&mut self, obj: &ObjectInfo) -> std::io::Result<()>;
    /// Stores `data` at `offset` of the current object.
    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// Every byte arrived and the digest matched: make the object visible under its final name (atomic rename).
    fn commit(&mut self) -> std::io::Result<()>;
    /// Failure or digest mismatch: remove every trace of the partial object.
    fn abort(&mut self);
    /// Object bytes written to this sink so far (all objects).
    fn bytes_written(&self) -> u64 {
        0
    }
    /// Makes every byte written so far durable (fsync); sinks without files have nothing to do.
    fn sync(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    /// Ends the run keeping the object in progress for a later resume; sinks that cannot
    /// resume abort it.
    fn suspend(&mut self) {
        self.abort();
    }
    /// Continues the object `obj` an earlier run left partial (resumable sinks only).
    fn reopen(&mut self, obj: &ObjectInfo) -> std::io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("this sink cannot resume {:?}", obj.name),
        ))
    }
    /// Reads `buf.len()` bytes of the object in progress at `offset` back (resumable sinks
    /// only; fewer bytes than asked is an error).
    fn read_back(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let _ = (offset, buf);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this sink cannot read its object back",
        ))
    }
}

/// Opens a sink from its spec (see the module documentation).
pub fn open(spec: &str) -> std::io::Result<Box<dyn Sink>> {
    if let Some(p) = spec.strip_prefix("file:") {
        return Ok(Box::new(FileSink::new(PathBuf::from(p))?));
    }
    if let Some(p) = spec.strip_prefix("dir:") {
        return Ok(Box::new(DirSink::new(PathBuf::from(p))?));
    }
    match spec {
        "stdout" | "-" => Ok(Box::new(WriterSink::new(io::stdout()))),
        "discard" | "null" => Ok(Box::new(DiscardSink::default())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad sink spec {spec:?} (file:PATH, dir:PATH, stdout or discard)"),
        )),
    }
}

fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// True when `e` means the file system is full (ENOSPC or EDQUOT).
pub fn is_storage_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// The part-file name for `final_path`: `<final>.srdma-part-<pid>`.
pub fn part_path(final_path: &Path) -> PathBuf {
    let mut s = final_path.as_os_str().to_owned();
    s.push(format!(".srdma-part-{}", std::process::id()));
    PathBuf::from(s)
}

/// One object being written to a part file.
#[derive(Debug)]
struct PartFile {
    file: File,
    part: PathBuf,
    dest: PathBuf,
    len: Option<u64>,
    done: bool,
    /// Left in place on drop (a resumable object suspended).
    keep: bool,
}

impl PartFile {
    fn create(dest: PathBuf, len: Option<u64>) -> io::Result<PartFile> {
        let part = part_path(&dest);
        PartFile::create_at(dest, part, len)
    }

    fn create_at(dest: PathBuf, part: PathBuf, len: Option<u64>) -> io::Result<PartFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&part)
            .map_err(|e| with_path(e, &part))?;
        let pf = PartFile {
            file,
            part,
            dest,
            len,
            done: false,
            keep: false,
        };
        if let Some(len) = len.filter(|&l| l > 0) {
            // Reserve the space now so a full disk shows at begin, not half-way through.
            pf.reserve(len)?; // on error `pf` drops and removes the part file
        }
        Ok(pf)
    }

    /// Opens the part file an earlier run left (no truncation); it must not be longer than
    /// `len`.
    fn reopen(dest: PathBuf, part: PathBuf, len: u64) -> io::Result<PartFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&part)
            .map_err(|e| with_path(e, &part))?;
        let have = file.metadata().map_err(|e| with_path(e, &part))?.len();
        // Keep it on an error below: the caller decides whether to discard it.
        let mut pf = PartFile {
            file,
            part,
            dest,
            len: Some(len),
            done: false,
            keep: true,
        };
        if have > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {have} bytes, the object has {len}", pf.part.display()),
            ));
        }
        pf.reserve(len)?;
        pf.keep = false;
        Ok(pf)
    }

    fn read_back(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| with_path(e, &self.part))
    }

    fn reserve(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let Ok(len) = libc::off_t::try_from(len) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "object too large",
            ));
        };
        // SAFETY: the fd is an open file owned by `self.file` for the duration of the call.
        let rc = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, len) };
        match rc {
            0 => Ok(()),
            // File systems without fallocate: fall back to plain writes.
            libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS => Ok(()),
            e => Err(with_path(io::Error::from_raw_os_error(e), &self.part)),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some(len) = self.len {
            let end = offset.checked_add(data.len() as u64);
            if end.is_none_or(|e| e > len) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: write of {} bytes at {offset} beyond the object's {len} bytes",
                        self.dest.display(),
                        data.len()
                    ),
                ));
            }
        }
        self.file
            .write_all_at(data, offset)
            .map_err(|e| with_path(e, &self.part))
    }

    /// fsync, then rename to the final name. On success the part file is gone (renamed);
    /// on failure it is left for `Drop` to remove.
    fn commit(&mut self) -> io::Result<()> {
        self.file
            .sync_data()
            .map_err(|e| with_path(e, &self.part))?;
        std::fs::rename(&self.part, &self.dest).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "rename {} -> {}: {e}",
                    self.part.display(),
                    self.dest.display()
                ),
            )
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.done && !self.keep {
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

/// `file:PATH`: a single object stored at PATH.
#[derive(Debug)]
pub struct FileSink {
    path: PathBuf,
    current: Option<PartFile>,
    committed: bool,
    bytes: u64,
    resumable: bool,
}

impl FileSink {
    /// A sink storing one object at `path` (its directory must exist).
    pub fn new(path: PathBuf) -> io::Result<FileSink> {
        if path.as_os_str().is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty sink path",
            ));
        }
        if path.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: is a directory (use dir:PATH)", path.display()),
            ));
        }
        Ok(FileSink {
            path,
            current: None,
            committed: false,
            bytes: 0,
            resumable: false,
        })
    }

    /// A sink storing one object at `path` through the stable part file
    /// [`crate::resume::part_path`], which [`Sink::suspend`] keeps and [`Sink::reopen`]
    /// continues.
    pub fn resumable(path: PathBuf) -> io::Result<FileSink> {
        Ok(FileSink {
            resumable: true,
            ..FileSink::new(path)?
        })
    }

    /// The final path of the object.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn no_object() -> io::Error {
    io::Error::other("sink: write/commit without an object begun")
}

impl Sink for FileSink {
    /// Starts the object; an object still in progress is aborted first.
    fn begin(&mut self, obj: &ObjectInfo) -> io::Result<()> {
        self.current = None;
        if self.committed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a file sink stores one object; {:?} is a second one (use dir:PATH)",
                    self.path.display(),
                    obj.name
                ),
            ));
        }
        self.current = Some(if self.resumable {
            let part = crate::resume::part_path(&self.path);
            PartFile::create_at(self.path.clone(), part, obj.len)?
        } else {
            PartFile::create(self.path.clone(), obj.len)?
        });
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let cur = self.current.as_mut().ok_or_else(no_object)?;
        cur.write(offset, data)?;
        self.bytes += data.len() as u64;
        Ok(())
    }

    fn commit(&mut self) -> io::Result<()> {
        let mut cur = self.current.take().ok_or_else(no_object)?;
        cur.commit()?;
        self.committed = true;
        Ok(())
    }

    fn abort(&mut self) {
        self.current = None;
    }

    fn sync(&mut self) -> io::Result<()> {
        match &self.current {
            Some(cur) => cur.file.sync_data().map_err(|e| with_path(e, &cur.part)),
            None => Ok(()),
        }
    }

    fn suspend(&mut self) {
        if let Some(mut cur) = self.current.take() {
            if self.resumable {
                let _ = cur.file.sync_data();
                cur.keep = true;
            }
        }
    }

    fn reopen(&mut self, obj: &ObjectInfo) -> io::Result<()> {
        let (true, Some(len)) = (self.resumable, obj.len) else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{}: not a resumable sink", self.path.display()),
            ));
        };
        if let Some(mut old) = self.current.take() {
            old.keep = true; // the very file about to be reopened
        }
        let part = crate::resume::part_path(&self.path);
        self.current = Some(PartFile::reopen(self.path.clone(), part, len)?);
        Ok(())
    }

    fn read_back(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let cur = self.current.as_ref().ok_or_else(no_object)?;
        cur.read_back(offset, buf)
    }

    fn bytes_written(&self) -> u64 {
        self.bytes
    }
}

/// Checks an object name for a directory sink: relative, `/`-separated normal components only
/// (no `..`, `.`, empty components, leading `/` or NUL).
pub fn check_name(name: &str) -> io::Result<Vec<&str>> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("object name {name:?} rejected: {why}"),
        )
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.contains('\0') {
        return Err(bad("contains NUL"));
    }
    if name.starts_with('/') {
        return Err(bad("absolute path"));
    }
    let parts: Vec<&str> = name.split('/').collect();
    for p in &parts {
        match *p {
            "" => return Err(bad("empty path component")),
            "." | ".." => return Err(bad("`.` or `..` component")),
            _ => {}
        }
        // Belt and braces: the component must be a plain file name to the OS too.
        let mut c = Path::new(p).components();
        if !matches!((c.next(), c.next()), (Some(Component::Normal(_)), None)) {
            return Err(bad("not a plain path component"));
        }
    }
    Ok(parts)
}

/// `dir:PATH`: objects stored under a directory by their relative names.
#[derive(Debug)]
pub struct DirSink {
    root: PathBuf,
    current: Option<PartFile>,
    bytes: u64,
}

impl DirSink {
    /// A sink storing objects below `root` (created if missing).
    pub fn new(root: PathBuf) -> io::Result<DirSink> {
        if root.as_os_str().is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty sink path",
            ));
        }
        std::fs::create_dir_all(&root).map_err(|e| with_path(e, &root))?;
        Ok(DirSink {
            root,
            current: None,
            bytes: 0,
        })
    }

    /// Creates the directories leading to `parts`' last component, refusing symbolic links
    /// and non-directories on the way; returns the final path.
    fn prepare(&self, parts: &[&str]) -> io::Result<PathBuf> {
        let mut p = self.root.clone();
        let (last, dirs) = parts
            .split_last()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty object name"))?;
        for d in dirs {
            p.push(d);
            match std::fs::symlink_metadata(&p) {
                Ok(md) if md.file_type().is_dir() => {}
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: exists and is not a directory", p.display()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::create_dir(&p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let md = std::fs::symlink_metadata(&p).map_err(|e| with_path(e, &p))?;
                        if !md.file_type().is_dir() {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidInput,
                                format!("{}: exists and is not a directory", p.display()),
                            ));
                        }
                    }
                    Err(e) => return Err(with_path(e, &p)),
                },
                Err(e) => return Err(with_path(e, &p)),
            }
        }
        p.push(last);
        Ok(p)
    }
}

impl Sink for DirSink {
    /// Starts the object; an object still in progress is aborted first.
    fn begin(&mut self, obj: &ObjectInfo) -> io::Result<()> {
        self.current = None;
        let parts = check_name(&obj.name)?;
        let dest = self.prepare(&parts)?;
        if std::fs::symlink_metadata(&dest).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: exists and is a directory", dest.display()),
            ));
        }
        self.current = Some(PartFile::create(dest, obj.len)?);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let cur = self.current.as_mut().ok_or_else(no_object)?;
        cur.write(offset, data)?;
        self.bytes += data.len() as u64;
        Ok(())
    }

    fn commit(&mut self) -> io::Result<()> {
        let mut cur = self.current.take().ok_or_else(no_object)?;
        cur.commit()
    }

    fn abort(&mut self) {
        self.current = None;
    }

    fn bytes_written(&self) -> u64 {
        self.bytes
    }
}

/// `stdout` (or any writer): objects written one after another, strictly in offset order.
#[derive(Debug)]
pub struct WriterSink<W: Write + Send> {
    w: W,
    next: Option<u64>,
    bytes: u64,
}

impl<W: Write + Send> WriterSink<W> {
    /// A sink writing to `w`.
    pub fn new(w: W) -> Self {
        WriterSink {
            w,
            next: None,
            bytes: 0,
        }
    }

    /// The writer.
    pub fn get_ref(&self) -> &W {
        &self.w
    }

    /// Gives the writer back.
    pub fn into_inner(self) -> W {
        self.w
    }
}

impl<W: Write + Send> Sink for WriterSink<W> {
    fn begin(&mut self, _obj: &ObjectInfo) -> io::Result<()> {
        self.next = Some(0);
        Ok(())
    }

    /// Errors (`InvalidData`) unless `offset` is exactly where the previous write ended.
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let next = self.next.ok_or_else(no_object)?;
        if offset != next {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "stream sink: chunk at offset {offset} arrived out of order (expected {next})"
                ),
            ));
        }
        self.w.write_all(data)?;
        self.next = Some(next + data.len() as u64);
        self.bytes += data.len() as u64;
        Ok(())
    }

    fn commit(&mut self) -> io::Result<()> {
        self.next.take().ok_or_else(no_object)?;
        self.w.flush()
    }

    /// A stream cannot take bytes back: flushes and stops accepting writes for this object.
    fn abort(&mut self) {
        self.next = None;
        let _ = self.w.flush();
    }

    fn bytes_written(&self) -> u64 {
        self.bytes
    }
}

/// `discard`: counts bytes and objects, keeps nothing.
#[derive(Debug, Default)]
pub struct DiscardSink {
    /// Object bytes received.
    pub bytes: u64,
    /// Objects committed.
    pub objects: u64,
}

impl Sink for DiscardSink {
    fn begin(&mut self, _obj: &ObjectInfo) -> io::Result<()> {
        Ok(())
    }

    fn write(&mut self, _offset: u64, data: &[u8]) -> io::Result<()> {
        self.bytes += data.len() as u64;
        Ok(())
    }

    fn commit(&mut self) -> io::Result<()> {
        self.objects += 1;
        Ok(())
    }

    fn abort(&mut self) {}

    fn bytes_written(&self) -> u64 {
        self.bytes
    }
}

// ---------------------------------------------------------------------------------------------
// reassembly

/// Why a chunk could not be delivered to a sink.
#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    /// The chunk's payload does not match its checksum.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Chunks out of sequence or framing rules broken.
    #[error("transfer out of sequence: {0}")]
    Sequence(String),
    /// A compressed chunk that does not decompress to its `raw_len`.
    #[error("chunk {seq}: cannot decompress: {message}")]
    Decompress {
        /// The chunk's sequence number.
        seq: u64,
        /// What zstd said.
        message: String,
    },
    /// The object's bytes do not match the digest the source sent.
    #[error("object {name:?}: digest mismatch (source {expected}, received {got}); not committed")]
    Digest {
        /// The object's name.
        name: String,
        /// The source's digest (hex).
        expected: String,
        /// The digest of the bytes received (hex).
        got: String,
    },
    /// The sink failed (`storage_full` tells a full disk apart).
    #[error("sink error on object {name:?}: {source}")]
    Io {
        /// The object's name.
        name: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl DeliverError {
    /// True when the sink's file system is full.
    pub fn storage_full(&self) -> bool {
        matches!(self, DeliverError::Io { source, .. } if is_storage_full(source))
    }
}

/// What a delivered chunk did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// An object was begun in the sink.
    Started {
        /// Its name.
        name: String,
    },
    /// Object bytes were written.
    Data {
        /// How many.
        bytes: u64,
    },
    /// An object was complete, its digest matched and the sink committed it.
    Committed {
        /// Its name.
        name: String,
        /// Its length.
        len: u64,
        /// Its digest (hex).
        digest: String,
    },
    /// The transfer's last chunk.
    EndOfTransfer,
}

/// Feeds a transfer's chunks (in sequence order) into a [`Sink`]: checks sequence numbers,
/// offsets and checksums, decompresses compressed chunks, digests every object and commits it
/// only when the digest matches (aborting it otherwise, or on any error).
pub struct Assembler {
    sink: Box<dyn Sink>,
    next_seq: u64,
    current: Option<Current>,
    dctx: Option<zstd::bulk::Decompressor<'static>>,
    scratch: Vec<u8>,
    ended: bool,
    bytes: u64,
    objects: u64,
}

struct Current {
    index: u32,
    name: String,
    len: Option<u64>,
    offset: u64,
    digest: ObjectDigest,
}

impl std::fmt::Debug for Assembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assembler")
            .field("next_seq", &self.next_seq)
            .field("bytes", &self.bytes)
            .field("objects", &self.objects)
            .finish()
    }
}

impl Assembler {
    /// Delivers into `sink`, expecting the transfer from sequence number 0.
    pub fn new(sink: Box<dyn Sink>) -> Self {
        Assembler {
            sink,
            next_seq: 0,
            current: None,
            dctx: None,
            scratch: Vec::new(),
            ended: false,
            bytes: 0,
            objects: 0,
        }
    }

    /// The sink.
    pub fn sink(&self) -> &dyn Sink {
        self.sink.as_ref()
    }

    /// Object bytes delivered so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Objects committed so far.
    pub fn objects(&self) -> u64 {
        self.objects
    }

    /// True once `END_OF_TRANSFER` was delivered.
    pub fn finished(&self) -> bool {
        self.ended
    }

    /// Aborts the object in progress, if any (e.g. when the transfer is torn down).
    pub fn abort(&mut self) {
        if self.current.take().is_some() {
            self.sink.abort();
        }
    }

    /// Delivers the chunk `h` whose payload is `payload[..h.payload_len]`. On error the object
    /// in progress is aborted (nothing of it stays in the sink).
    pub fn accept(&mut self, h: &ChunkHeader, payload: &[u8]) -> Result<Delivered, DeliverError> {
        let r = self.accept_inner(h, payload);
        if r.is_err() {
            self.abort();
        }
        r
    }

    fn accept_inner(&mut self, h: &ChunkHeader, payload: &[u8]) -> Result<Delivered, DeliverError> {
        if self.ended {
            return seq_err(format!("chunk {} after the end of the transfer", h.seq));
        }
        if h.seq != self.next_seq {
            return seq_err(format!(
                "chunk {} arrived, expected {}",
                h.seq, self.next_seq
            ));
        }
        h.validate()?;
        h.verify(payload)?;
        self.next_seq += 1;
        let payload = &payload[..h.payload_len as usize];
        if h.has(flags::OBJECT_START) {
            return self.start_object(h, payload);
        }
        if h.has(flags::END_OF_TRANSFER) && !h.has(flags::OBJECT_END) {
            if let Some(c) = &self.current {
                return seq_err(format!("transfer ends inside object {:?}", c.name));
            }
            self.ended = true;
            return Ok(Delivered::EndOfTransfer);
        }
        let Some(cur) = self.current.as_ref() else {
            return seq_err(format!("chunk {} outside any object", h.seq));
        };
        if h.object != cur.index {
            return seq_err(format!(
                "chunk {} for object {}, inside object {}",
                h.seq, h.object, cur.index
            ));
        }
        if h.has(flags::OBJECT_END) {
            return self.end_object(h, payload);
        }
        self.data(h, payload)
    }

    /// An object starts (its name in `payload`): the sink begins it.
    fn start_object(&mut self, h: &ChunkHeader, payload: &[u8]) -> Result<Delivered, DeliverError> {
        if let Some(c) = &self.current {
            return seq_err(format!(
                "object {} starts before object {} ({:?}) ended",
                h.object, c.index, c.name
            ));
        }
        if h.object != self.objects as u32 {
            return seq_err(format!(
                "object {} starts, expected {}",
                h.object, self.objects
            ));
        }
        let name = std::str::from_utf8(payload)
            .map_err(|_| DeliverError::Sequence(format!("object {}: name is not UTF-8", h.object)))?
            .to_owned();
        let len = (h.object_len != u64::MAX).then_some(h.object_len);
        let info = ObjectInfo {
            name: name.clone(),
            len,
        };
        self.sink.begin(&info).map_err(|e| io_err(&name, e))?;
        self.current = Some(Current {
            index: h.object,
            name: name.clone(),
            len,
            offset: 0,
            digest: ObjectDigest::new(),
        });
        Ok(Delivered::Started { name })
    }

    /// The current object ends (its digest in `payload`): committed if it matches.
    fn end_object(&mut self, h: &ChunkHeader, payload: &[u8]) -> Result<Delivered, DeliverError> {
        let Some(cur) = self.current.take() else {
            return seq_err(format!("chunk {} outside any object", h.seq));
        };
        if cur.len.is_some_and(|l| l != cur.offset) || h.object_len != cur.offset {
            let e = seq_err(format!(
                "object {:?} ends after {} bytes, announced {:?}/{}",
                cur.name, cur.offset, cur.len, h.object_len
            ));
            self.current = Some(cur);
            return e;
        }
        let mut expected = [0u8; DIGEST_LEN as usize];
        expected.copy_from_slice(payload);
        let got = cur.digest.finish();
        if got != expected {
            self.sink.abort();
            return Err(DeliverError::Digest {
                name: cur.name,
                expected: hex(&expected),
                got: hex(&got),
            });
        }
        self.sink.commit().map_err(|e| io_err(&cur.name, e))?;
        self.objects += 1;
        if h.has(flags::END_OF_TRANSFER) {
            self.ended = true;
        }
        Ok(Delivered::Committed {
            name: cur.name,
            len: cur.offset,
            digest: hex(&got),
        })
    }

    /// A data chunk of the current object (decompressed if need be): digested and written.
    fn data(&mut self, h: &ChunkHeader, payload: &[u8]) -> Result<Delivered, DeliverError> {
        let Some(cur) = self.current.as_mut() else {
            return seq_err(format!("chunk {} outside any object", h.seq));
        };
        if h.offset != cur.offset {
            return seq_err(format!(
                "object {:?}: chunk {} at offset {}, expected {}",
                cur.name, h.seq, h.offset, cur.offset
            ));
        }
        let data: &[u8] = if h.has(flags::COMPRESSED) {
            inflate(&mut self.dctx, &mut self.scratch, h, payload)?
        } else {
            payload
        };
        cur.digest.update(data);
        self.sink
            .write(cur.offset, data)
            .map_err(|e| io_err(&cur.name, e))?;
        cur.offset += data.len() as u64;
        self.bytes += data.len() as u64;
        Ok(Delivered::Data {
            bytes: data.len() as u64,
        })
    }
}

/// A chunk out of order.
fn seq_err<T>(m: String) -> Result<T, DeliverError> {
    Err(DeliverError::Sequence(m))
}

/// A sink's I/O error for object `name`.
fn io_err(name: &str, source: io::Error) -> DeliverError {
    DeliverError::Io {
        name: name.to_owned(),
        source,
    }
}

/// The compressed chunk `h` (`payload`) decompressed into `scratch` (`dctx` made on first
/// use): exactly the raw length its header says.
fn inflate<'s>(
    dctx: &mut Option<zstd::bulk::Decompressor<'static>>,
    scratch: &'s mut Vec<u8>,
    h: &ChunkHeader,
    payload: &[u8],
) -> Result<&'s [u8], DeliverError> {
    let raw = h.raw_len as usize;
    let fail = |message: String| DeliverError::Decompress {
        seq: h.seq,
        message,
    };
    if dctx.is_none() {
        *dctx = Some(zstd::bulk::Decompressor::new().map_err(|e| fail(e.to_string()))?);
    }
    let Some(d) = dctx.as_mut() else {
        return Err(fail("no decompressor".into()));
    };
    if scratch.len() < raw + 1 {
        scratch.resize(raw + 1, 0);
    }
    let got = d
        .decompress_to_buffer(payload, &mut scratch[..raw + 1])
        .map_err(|e| fail(e.to_string()))?;
    if got != raw {
        return Err(fail(format!("{got} bytes, header says {raw}")));
    }
    Ok(&scratch[..raw])
}
