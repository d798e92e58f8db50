//! The sink's side of a node: the sink it writes to, each chunk checked against the object
//! (its order, its checksum, the object digest), objects begun, committed or aborted, and a
//! resumable sink's bookkeeping ([`crate::resume`]): the bitmap of what is durably written,
//! what an earlier run already wrote, and what is kept or discarded when the node ends.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::chunk::{ChunkHeader, flags};
use crate::digest::{ObjectDigest, hex};
use crate::resume::{self, PartialState};
use crate::sink::{self, Sink};
use crate::source::ObjectInfo;

use super::fail::{Fail, R};
use super::hop::Hop;
use super::progress::Stats;

/// The sink's side of a node.
pub(super) struct SinkSide {
    sink: Box<dyn Sink>,
    /// An object is begun and not yet committed or aborted.
    open: bool,
    digest: ObjectDigest,
    next_offset: u64,
    object_len: u64,
    /// Objects committed.
    pub(super) committed: u64,
    /// The digest of every object committed, in order.
    pub(super) digests: Vec<[u8; 16]>,
    /// A sink with `resume = true`.
    resume: Option<SinkResume>,
    /// Object bytes received again after a heal.
    pub(super) heal_again: u64,
}

/// A resumable sink's bookkeeping (see [`crate::resume`]).
struct SinkResume {
    /// The sink's final path.
    output: PathBuf,
    fingerprint: u128,
    chunk_size: u64,
    /// The bitmap of the object in progress (`None` before it began, or for an object of
    /// unknown length, which cannot resume).
    state: Option<PartialState>,
    /// Chunks below this were durably written by an earlier run: checked, not rewritten.
    held_upto: u64,
    /// Chunks left to compare with what an earlier run may have written past `held_upto`
    /// (bytes found identical count as sent again); 0 stops comparing.
    compare_left: u64,
    /// The object continued an earlier run's: its digest is recomputed from the file.
    resumed: bool,
    /// Chunks written since the state was last saved.
    unsynced: u64,
    /// Save the state every this many chunks.
    every: u64,
    /// The state turned out foreign or the object wrong: discard, do not keep, on failure.
    discard: bool,
    /// Object bytes received again that an earlier run had already written.
    sent_again: u64,
    scratch: Vec<u8>,
    /// A valid earlier state, used when the object starts again (another sink needed the
    /// transfer from chunk 0).
    pending: Option<PartialState>,
}

/// What a chunk's processing asks of the sink afterwards (outside the device lock).
pub(super) enum After {
    Nothing,
    Begin(ObjectInfo),
    Commit,
    Mismatch {
        want: [u8; 16],
        got: [u8; 16],
    },
    /// A resumed object ended: digest the whole part file, then commit or not.
    VerifyFile {
        want: [u8; 16],
    },
    /// A resumable sink wrote half a ring's worth: make it durable and save the bitmap.
    Save,
}

/// A chunk arrived at the sink, as [`SinkSide::take`] sees it.
pub(super) struct Arrival<'x> {
    pub(super) seq: u64,
    /// The first chunk of this run (a resumed object is checked against it).
    pub(super) first_of_run: bool,
    /// Check the chunk's checksum (no `verify` stage just did, or the flip knob struck).
    pub(super) check: bool,
    /// This node.
    pub(super) me: &'x str,
    /// Makes the failure of a damaged chunk.
    pub(super) corrupt: &'x dyn Fn(String) -> Fail,
}

/// What the sink's side says of the run when the node ends.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Settled {
    /// The run succeeded and an object was committed.
    pub(super) committed: bool,
    /// Object bytes received again (after a heal, or already written by an earlier run).
    pub(super) sent_again: u64,
    /// An object continued an earlier run's.
    pub(super) resumed: bool,
}

/// The failure of a sink's write (a full disk says so).
fn write_fail(me: &str, what: &str, e: &std::io::Error) -> Fail {
    if sink::is_storage_full(e) {
        Fail::at(me, format!("disk full at sink {me}: {e}"))
    } else {
        Fail::at(me, format!("sink {me}: {what}: {e}"))
    }
}

impl SinkSide {
    /// Opens `hop`'s sink; a resumable one keeps `pending` (a valid earlier state) for when
    /// its object starts.
    pub(super) fn open(hop: &Hop<'_>, pending: Option<PartialState>) -> R<SinkSide> {
        let me = hop.me;
        let spec = me.sink.as_deref().unwrap_or("discard");
        let output = spec
            .strip_prefix("file:")
            .filter(|_| me.resume)
            .map(PathBuf::from);
        let s = match &output {
            Some(p) => sink::FileSink::resumable(p.clone()).map(|f| Box::new(f) as Box<dyn Sink>),
            None => sink::open(spec),
        }
        .map_err(|e| Fail::at(&me.name, format!("opening sink {spec:?}: {e}")))?;
        let resume = output.map(|output| SinkResume {
            output,
            fingerprint: resume::fingerprint(hop.cfg, me),
            chunk_size: hop.cfg.transfer.chunk_size as u64,
            state: None,
            held_upto: 0,
            compare_left: 0,
            resumed: false,
            unsynced: 0,
            every: (hop.slots as u64 / 2).max(1),
            discard: false,
            sent_again: 0,
            scratch: Vec::new(),
            pending,
        });
        Ok(SinkSide {
            sink: s,
            open: false,
            digest: ObjectDigest::new(),
            next_offset: 0,
            object_len: u64::MAX,
            committed: 0,
            digests: Vec::new(),
            resume,
            heal_again: 0,
        })
    }

    /// A resumable sink continues the object of state `st` at chunk `from` (>= 1).
    pub(super) fn continue_object(
        &mut self,
        hop: &Hop<'_>,
        st: PartialState,
        from: u64,
        stats: &Stats,
    ) -> R<()> {
        let name = hop.name();
        let rs = self
            .resume
            .as_mut()
            .ok_or_else(|| Fail::at(name, "no resumable sink"))?;
        let len = st.object_len;
        let info = ObjectInfo {
            name: rs.output.display().to_string(),
            len: Some(len),
        };
        if let Err(e) = self.sink.reopen(&info) {
            rs.discard = true;
            return Err(Fail::at(
                name,
                format!("sink {name}: reopening the partial object: {e}"),
            ));
        }
        self.open = true;
        self.digest = ObjectDigest::new();
        self.next_offset = from
            .saturating_sub(1)
            .saturating_mul(rs.chunk_size)
            .min(len);
        self.object_len = len;
        rs.held_upto = st.first_missing();
        rs.compare_left = 4 * hop.slots as u64;
        rs.resumed = true;
        rs.state = Some(st);
        stats.live.total.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Under the device lock: checks the chunk `h` (payload in `pb`) against the object and
    /// writes its data. Returns what to do afterwards and the bytes copied (an object's name).
    pub(super) fn take(&mut self, h: &ChunkHeader, pb: &[u8], a: &Arrival<'_>) -> R<(After, u64)> {
        let corrupt = a.corrupt;
        if a.check {
            h.verify(pb).map_err(|e| corrupt(e.to_string()))?;
        }
        let payload = &pb[..h.payload_len as usize];
        if h.has(flags::OBJECT_START) {
            if self.open {
                return Err(corrupt("an object starts inside another".into()));
            }
            let name = String::from_utf8(payload.to_vec())
                .map_err(|_| corrupt("the object name is not UTF-8".into()))?;
            let info = ObjectInfo {
                name,
                len: (h.object_len != u64::MAX).then_some(h.object_len),
            };
            return Ok((After::Begin(info), payload.len() as u64));
        }
        if h.has(flags::OBJECT_END) {
            return Ok((self.end_of_object(payload, corrupt)?, 0));
        }
        if h.has(flags::END_OF_TRANSFER) {
            if self.open {
                return Err(corrupt("the transfer ends inside an object".into()));
            }
            return Ok((After::Nothing, 0));
        }
        Ok((self.take_data(h, payload, a)?, 0))
    }

    /// An object's end (its digest in `payload`): whether to commit.
    fn end_of_object(&mut self, payload: &[u8], corrupt: &dyn Fn(String) -> Fail) -> R<After> {
        if !self.open {
            return Err(corrupt("an object ends that never started".into()));
        }
        let want: [u8; 16] = payload
            .get(..16)
            .and_then(|d| d.try_into().ok())
            .ok_or_else(|| corrupt("the object digest is missing".into()))?;
        if self.object_len != u64::MAX && self.next_offset != self.object_len {
            return Err(corrupt(format!(
                "the object ends after {} of its {} bytes",
                self.next_offset, self.object_len
            )));
        }
        let got = self.digest.finish();
        Ok(if self.resume.as_ref().is_some_and(|r| r.resumed) {
            // Part of the object came from an earlier run: digest the file.
            After::VerifyFile { want }
        } else if got == want {
            After::Commit
        } else {
            After::Mismatch { want, got }
        })
    }

    /// A data chunk: checked against the object, digested and written (unless an earlier
    /// run already wrote it).
    fn take_data(&mut self, h: &ChunkHeader, payload: &[u8], a: &Arrival<'_>) -> R<After> {
        let (me, corrupt) = (a.me, a.corrupt);
        if !self.open {
            return Err(corrupt("data outside an object".into()));
        }
        if h.has(flags::COMPRESSED) {
            return Err(Fail::at(
                me,
                format!(
                    "chunk {} reached sink {me} compressed: add a \"decompress\" stage",
                    a.seq
                ),
            ));
        }
        let write = self.needs_writing(h, payload, a)?;
        let plen = payload.len();
        if h.offset != self.next_offset || h.raw_len as usize != plen {
            return Err(corrupt(format!(
                "data at offset {} ({} bytes), expected offset {}",
                h.offset, plen, self.next_offset
            )));
        }
        if !self.resume.as_ref().is_some_and(|r| r.resumed) {
            self.digest.update(payload);
        }
        if write {
            self.sink
                .write(h.offset, payload)
                .map_err(|e| write_fail(me, "writing", &e))?;
        }
        self.next_offset += plen as u64;
        let mut after = After::Nothing;
        if let Some(rs) = self.resume.as_mut() {
            if let Some(st) = rs.state.as_mut() {
                st.set(a.seq);
                rs.unsynced += 1;
                if rs.unsynced >= rs.every {
                    after = After::Save;
                }
            }
        }
        Ok(after)
    }

    /// A resumable sink with a state: whether the data chunk still needs writing (an earlier
    /// run may hold it: below `held_upto`, or found identical in the file). Fails when the
    /// first chunk of a resumed run does not fit the object the earlier run wrote.
    fn needs_writing(&mut self, h: &ChunkHeader, payload: &[u8], a: &Arrival<'_>) -> R<bool> {
        let Some(rs) = self.resume.as_mut().filter(|r| r.state.is_some()) else {
            return Ok(true);
        };
        if rs.resumed
            && a.first_of_run
            && (h.object_len != self.object_len || h.offset != self.next_offset)
        {
            // Same configuration, but the source's object is not the one the earlier run
            // wrote.
            rs.discard = true;
            return Err(Fail::at(
                a.me,
                format!(
                    "chunk {} is at offset {} of an object of {} bytes, but the resume state of \
                     {} says offset {} of {} bytes: the source changed; the partial object and \
                     its state are discarded, run the transfer again to start from chunk 0",
                    a.seq,
                    h.offset,
                    h.object_len,
                    rs.output.display(),
                    self.next_offset,
                    self.object_len
                ),
            ));
        }
        let mut write = true;
        if a.seq < rs.held_upto {
            write = false;
        } else if rs.compare_left > 0 {
            // What an earlier run wrote past its last saved state is still in the file:
            // identical bytes were sent again.
            rs.scratch.resize(payload.len(), 0);
            let same = self.sink.read_back(h.offset, &mut rs.scratch).is_ok()
                && rs.scratch[..] == *payload;
            if same {
                write = false;
                rs.compare_left -= 1;
            } else {
                rs.compare_left = 0;
            }
        }
        if !write {
            rs.sent_again += payload.len() as u64;
        }
        Ok(write)
    }

    /// Outside the device lock: does what chunk `seq` asked (`after`).
    pub(super) fn apply(&mut self, after: After, seq: u64, hop: &Hop<'_>, stats: &Stats) -> R<()> {
        let name = hop.name();
        let after = match after {
            After::VerifyFile { want } => self.digest_part_file(want, name)?,
            other => other,
        };
        match after {
            After::Nothing | After::VerifyFile { .. } => Ok(()),
            After::Save => self.save_resume(name),
            After::Begin(info) => self.begin(info, seq, hop, stats),
            After::Commit => self.commit(name),
            After::Mismatch { want, got } => Err(self.mismatch(want, got, name)),
        }
    }

    /// An object starts: a resumable sink continues a valid earlier state of its size, any
    /// other begins it afresh.
    fn begin(&mut self, info: ObjectInfo, seq: u64, hop: &Hop<'_>, stats: &Stats) -> R<()> {
        let name = hop.name();
        if let Some(l) = info.len {
            stats.live.total.fetch_add(l, Ordering::Relaxed);
        }
        let mut reopened = false;
        if let (Some(rs), Some(olen)) = (self.resume.as_mut(), info.len) {
            if let Some(st) = rs.pending.take().filter(|st| st.object_len == olen) {
                self.sink.reopen(&info).map_err(|e| {
                    rs.discard = true;
                    Fail::at(
                        name,
                        format!("sink {name}: reopening the partial object: {e}"),
                    )
                })?;
                rs.held_upto = st.first_missing();
                rs.compare_left = 4 * hop.slots as u64;
                rs.resumed = true;
                rs.state = Some(st);
                reopened = true;
            }
        }
        if !reopened {
            self.sink
                .begin(&info)
                .map_err(|e| write_fail(name, &format!("starting {:?}", info.name), &e))?;
        }
        self.open = true;
        self.digest = ObjectDigest::new();
        self.next_offset = 0;
        self.object_len = info.len.unwrap_or(u64::MAX);
        if let Some(rs) = self.resume.as_mut().filter(|_| !reopened) {
            // A fresh object: record its start (the state of an object of unknown length is
            // not kept: it cannot be checked on a resume).
            rs.state = info.len.map(|l| {
                let mut st = PartialState::new(rs.fingerprint, rs.chunk_size, l);
                st.set(seq);
                st
            });
            rs.resumed = false;
            rs.held_upto = 0;
            rs.compare_left = 0;
            self.save_resume(name)?;
        }
        Ok(())
    }

    /// The object's digest matched: commits it.
    fn commit(&mut self, name: &str) -> R<()> {
        self.open = false;
        self.sink
            .commit()
            .map_err(|e| write_fail(name, "committing", &e))?;
        self.committed += 1;
        self.digests.push(self.digest.finish());
        if let Some(rs) = self.resume.as_mut() {
            // Committed: the state has served.
            resume::discard(&rs.output);
            rs.state = None;
        }
        Ok(())
    }

    /// The object's digest did not match: aborts it (and discards a resume state).
    fn mismatch(&mut self, want: [u8; 16], got: [u8; 16], name: &str) -> Fail {
        let mut what = String::new();
        self.open = false;
        self.sink.abort();
        if let Some(rs) = self.resume.as_mut() {
            rs.discard = true;
            rs.state = None;
            resume::discard(&rs.output);
            if rs.resumed {
                what = format!(
                    " (over the partial object of an earlier run and this run's chunks); the \
                     partial object and its resume state {} are discarded, the next run starts \
                     from chunk 0",
                    resume::state_path(&rs.output).display()
                );
            }
        }
        Fail::at(
            name,
            format!(
                "object digest mismatch at sink {name}: the source sent {}, the data gives {}{what}",
                hex(&want),
                hex(&got)
            ),
        )
    }

    /// A resumed object ended: digests the whole part file (an earlier run wrote part of it)
    /// and says whether to commit.
    fn digest_part_file(&mut self, want: [u8; 16], name: &str) -> R<After> {
        let len = self.object_len;
        let mut d = ObjectDigest::new();
        let mut piece = vec![0u8; (1 << 20).min(usize::try_from(len).unwrap_or(1 << 20))];
        let mut off = 0u64;
        while off < len {
            let n = piece
                .len()
                .min(usize::try_from(len - off).unwrap_or(usize::MAX));
            self.sink.read_back(off, &mut piece[..n]).map_err(|e| {
                Fail::at(name, format!("sink {name}: reading the object back: {e}"))
            })?;
            d.update(&piece[..n]);
            off += n as u64;
        }
        let got = d.finish();
        self.digest = d;
        Ok(if got == want {
            After::Commit
        } else {
            After::Mismatch { want, got }
        })
    }

    /// A resumable sink: makes the object durable, then saves its bitmap.
    fn save_resume(&mut self, name: &str) -> R<()> {
        let Some(rs) = self.resume.as_mut() else {
            return Ok(());
        };
        let Some(st) = &rs.state else {
            return Ok(());
        };
        let r = self
            .sink
            .sync()
            .and_then(|()| st.save(&resume::state_path(&rs.output)));
        rs.unsynced = 0;
        r.map_err(|e| {
            if sink::is_storage_full(&e) {
                Fail::at(name, format!("disk full at sink {name}: {e}"))
            } else {
                Fail::at(name, format!("sink {name}: saving the resume state: {e}"))
            }
        })
    }

    /// The node ends (`ok`: its run succeeded): removes a partial object, unless it can be
    /// resumed (then saves its bitmap and keeps it), and says what the report needs.
    pub(super) fn settle(&mut self, ok: bool, name: &str) -> Settled {
        let resumable = self
            .resume
            .as_ref()
            .is_some_and(|r| !r.discard && r.state.is_some());
        let kept = (self.open && resumable).then(|| self.save_resume(name));
        if self.open {
            match (&kept, self.resume.as_ref()) {
                (Some(Ok(())), Some(rs)) => {
                    self.sink.suspend();
                    let n = rs.state.as_ref().map_or(0, PartialState::first_missing);
                    let msg = format!(
                        "kept the partial object (chunks 0..{n}) and its resume state {} for \
                         the next run",
                        resume::state_path(&rs.output).display()
                    );
                    eprintln!("{name}: {msg}");
                }
                (_, Some(rs)) => {
                    self.sink.abort();
                    resume::discard(&rs.output);
                }
                (_, None) => self.sink.abort(),
            }
            self.open = false;
        } else if let Some(rs) = self.resume.as_ref().filter(|r| r.discard) {
            resume::discard(&rs.output);
        }
        let mut s = Settled {
            committed: ok && self.committed > 0,
            ..Settled::default()
        };
        if let Some(rs) = &self.resume {
            s.sent_again = rs.sent_again;
            s.resumed = rs.resumed;
        }
        s.sent_again += self.heal_again;
        s
    }
}
