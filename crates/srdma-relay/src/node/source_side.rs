//! The source's side of a node: the source it reads (opened again from the beginning when a
//! heal rewinds the transfer), framing each chunk in its staging slot, the object digests it
//! computes, and what it sent again after a heal.

use std::sync::atomic::Ordering;

use srdma::Mr;

use crate::chunk::{ChunkHeader, HEADER_LEN, flags};
use crate::digest::ObjectDigest;
use crate::source::{self, ObjectInfo, Source};
use crate::stage::{Chunk, Stage};

use super::fail::{Fail, R};
use super::hop::Hop;
use super::progress::Stats;
use super::stages::flip_bit;

/// The source's side of a node.
#[derive(Default)]
pub(super) struct SourceSide {
    /// The open source (from [`SourceSide::open`] on).
    feed: Option<Feed>,
    /// The digest of every object framed, in order.
    pub(super) digests: Vec<[u8; 16]>,
    /// Chunks below this were sent before a heal rewound the transfer.
    pub(super) resend_until: u64,
    /// Object bytes sent again after a heal.
    pub(super) resent: u64,
}

/// An open source and where framing stands in it.
struct Feed {
    src: Box<dyn Source>,
    /// Read straight into the slot (not stdin: that is read into `scratch` first, a copy).
    in_place: bool,
    scratch: Vec<u8>,
    current: Option<ObjectInfo>,
    object: u32,
    offset: u64,
    digest: ObjectDigest,
    /// The end of the transfer was framed.
    done: bool,
}

/// What the next chunk is.
enum What {
    Start(ObjectInfo),
    Data,
    End,
    Eot,
}

impl SourceSide {
    /// Opens the source (`hop`'s `source` spec) from the beginning — at the start, and again
    /// when a heal rewinds the transfer — and frames the chunks before `from` without sending
    /// them (so that object digests still cover every byte), counting objects and digests
    /// afresh.
    pub(super) fn open(
        &mut self,
        hop: &Hop<'_>,
        stages: &mut [Box<dyn Stage>],
        stats: &mut Stats,
        buf: &Mr,
        from: u64,
    ) -> R<()> {
        let me = hop.me;
        stats.objects = 0;
        self.digests.clear();
        stats.live.total.store(0, Ordering::Relaxed);
        let spec = me.source.as_deref().unwrap_or("");
        let src = source::open(spec)
            .map_err(|e| Fail::at(&me.name, format!("opening source {spec:?}: {e}")))?;
        self.feed = Some(Feed {
            src,
            in_place: !matches!(spec, "stdin" | "-"),
            scratch: Vec::new(),
            current: None,
            object: 0,
            offset: 0,
            digest: ObjectDigest::new(),
            done: false,
        });
        for seq in 0..from {
            let (_, _, eot) = self.fill(hop, stages, stats, buf, seq, true)?;
            if eot {
                return Err(Fail::at(
                    &me.name,
                    format!(
                        "a sink resumes at chunk {from}, but the transfer has only {} chunks \
                         (did the source change?)",
                        seq + 1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The end of the transfer was framed.
    pub(super) fn done(&self) -> bool {
        self.feed.as_ref().is_none_or(|f| f.done)
    }

    /// Frames chunk `seq` (the next one) in its staging slot. Returns (bytes to send, object
    /// bytes it carries, end of transfer). `dry`: a chunk before the start of a resumed run,
    /// framed only to be digested (no stages, no test knobs).
    pub(super) fn fill(
        &mut self,
        hop: &Hop<'_>,
        stages: &mut [Box<dyn Stage>],
        stats: &mut Stats,
        buf: &Mr,
        seq: u64,
        dry: bool,
    ) -> R<(usize, u64, bool)> {
        let me = hop.name();
        let feed = self
            .feed
            .as_mut()
            .ok_or_else(|| Fail::at(me, "the source is not open"))?;
        let chunk_size = hop.cfg.transfer.chunk_size;
        // Decide what this chunk is, and read a blocking source, outside the device lock:
        // opening files may block.
        let what = feed.what_next(me)?;
        let pre = feed.read_ahead(&what, chunk_size, me)?;
        let base = (seq % hop.slots as u64) as usize * hop.slot_size;
        let knob = Knob {
            seq,
            me,
            dry,
            flip: !dry && hop.me.flip_bit_at_seq == Some(seq),
            check: hop.cfg.transfer.check,
            chunk_size,
        };
        let r: R<(usize, u64, What)> = buf.with_bytes_mut(|b| {
            let slot = &mut b[base..base + hop.slot_size];
            feed.frame(slot, what, pre, stages, &knob)
        });
        let (len, data, what) = r?;
        if pre.is_some() {
            stats.own_copies += data;
        }
        Ok(match what {
            What::Start(info) => {
                if let Some(l) = info.len {
                    stats.live.total.fetch_add(l, Ordering::Relaxed);
                }
                feed.current = Some(info);
                feed.offset = 0;
                feed.digest = ObjectDigest::new();
                (len, 0, false)
            }
            What::Data => {
                feed.offset += data;
                (len, data, false)
            }
            What::End => {
                let d = feed.digest.finish();
                self.digests.push(d);
                feed.current = None;
                feed.object += 1;
                stats.objects += 1;
                (len, 0, false)
            }
            What::Eot => {
                feed.done = true;
                (len, 0, true)
            }
        })
    }
}

/// How chunk `seq` is framed.
struct Knob<'k> {
    seq: u64,
    me: &'k str,
    dry: bool,
    flip: bool,
    check: crate::chunk::CheckAlg,
    chunk_size: usize,
}

impl Feed {
    /// What the next chunk is: an object's start (the source moves to its next object), the
    /// end of the transfer, or data (or the end) of the current object.
    fn what_next(&mut self, me: &str) -> R<What> {
        if self.current.is_some() {
            return Ok(What::Data);
        }
        match self.src.next_object() {
            Ok(Some(info)) => Ok(What::Start(info)),
            Ok(None) => Ok(What::Eot),
            Err(e) => Err(read_err(me, &e)),
        }
    }

    /// Stdin and other blocking sources: reads the data of the next chunk into `scratch`
    /// (to be copied in); returns how much.
    fn read_ahead(&mut self, what: &What, chunk_size: usize, me: &str) -> R<Option<usize>> {
        if !matches!(what, What::Data) || self.in_place {
            return Ok(None);
        }
        self.scratch.resize(chunk_size, 0);
        let mut got = 0;
        while got < chunk_size {
            let n = self
                .src
                .read(&mut self.scratch[got..])
                .map_err(|e| read_err(me, &e))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(Some(got))
    }

    /// Frames the chunk in `slot` (header and payload). Returns (bytes to send, object bytes,
    /// what the chunk turned out to be: data with nothing left is the object's end).
    fn frame(
        &mut self,
        slot: &mut [u8],
        what: What,
        pre: Option<usize>,
        stages: &mut [Box<dyn Stage>],
        k: &Knob<'_>,
    ) -> R<(usize, u64, What)> {
        let (hb, pb) = slot.split_at_mut(HEADER_LEN);
        let mut data = 0u64;
        let (h, what) = match what {
            What::Start(info) => (self.frame_start(pb, &info, k)?, What::Start(info)),
            What::Eot => {
                let mut h = ChunkHeader::data(k.seq, self.object, 0, 0, 0, k.check);
                h.flags = flags::END_OF_TRANSFER;
                h.seal(&[]);
                (h, What::Eot)
            }
            What::Data | What::End => {
                let n = self.payload(pb, pre, k)?;
                if n == 0 {
                    (self.frame_end(pb, k), What::End)
                } else {
                    data = n as u64;
                    (self.frame_data(pb, n, stages, k)?, What::Data)
                }
            }
        };
        h.encode(hb)
            .map_err(|e| Fail::at(k.me, format!("framing chunk {}: {e}", k.seq)))?;
        if k.flip {
            flip_bit(hb, pb, h.payload_len as usize);
        }
        Ok((HEADER_LEN + h.payload_len as usize, data, what))
    }

    /// An object's start: its name is the payload.
    fn frame_start(&self, pb: &mut [u8], info: &ObjectInfo, k: &Knob<'_>) -> R<ChunkHeader> {
        let name = info.name.as_bytes();
        if name.len() > pb.len() {
            return Err(Fail::at(
                k.me,
                format!("object name {:?} is too long", info.name),
            ));
        }
        pb[..name.len()].copy_from_slice(name);
        let len = info.len.unwrap_or(u64::MAX);
        let mut h = ChunkHeader::data(k.seq, self.object, 0, 0, len, k.check);
        h.flags = flags::OBJECT_START;
        h.seal(&pb[..name.len()]);
        Ok(h)
    }

    /// The current object's next bytes into the payload (copied from `scratch` when read
    /// ahead, else straight from the source); returns how many (0: the object ended).
    fn payload(&mut self, pb: &mut [u8], pre: Option<usize>, k: &Knob<'_>) -> R<usize> {
        if let Some(n) = pre {
            pb[..n].copy_from_slice(&self.scratch[..n]);
            return Ok(n);
        }
        let mut got = 0;
        while got < k.chunk_size {
            let n = self
                .src
                .read(&mut pb[got..k.chunk_size])
                .map_err(|e| read_err(k.me, &e))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got)
    }

    /// The current object's length as chunk headers carry it (`u64::MAX`: unknown).
    fn object_len(&self) -> u64 {
        self.current
            .as_ref()
            .map_or(u64::MAX, |info| info.len.unwrap_or(u64::MAX))
    }

    /// An object's end: its digest is the payload.
    fn frame_end(&mut self, pb: &mut [u8], k: &Knob<'_>) -> ChunkHeader {
        let d = self.digest.finish();
        pb[..16].copy_from_slice(&d);
        let mut h = ChunkHeader::data(
            k.seq,
            self.object,
            self.offset,
            0,
            self.object_len(),
            k.check,
        );
        h.flags = flags::OBJECT_END;
        h.seal(&pb[..16]);
        h
    }

    /// `n` bytes of data in the payload: digested, framed, then the stages (not for a dry
    /// chunk).
    fn frame_data(
        &mut self,
        pb: &mut [u8],
        n: usize,
        stages: &mut [Box<dyn Stage>],
        k: &Knob<'_>,
    ) -> R<ChunkHeader> {
        self.digest.update(&pb[..n]);
        let len = self.object_len();
        let mut h = ChunkHeader::data(k.seq, self.object, self.offset, n as u32, len, k.check);
        h.seal(&pb[..n]);
        for st in stages.iter_mut().filter(|_| !k.dry) {
            st.process(Chunk {
                header: &mut h,
                buf: &mut *pb,
            })
            .map_err(|e| Fail::at(k.me, format!("stage {}: {e}", st.name())))?;
        }
        Ok(h)
    }
}

/// A failure to read the source.
fn read_err(me: &str, e: &std::io::Error) -> Fail {
    Fail::at(me, format!("reading the source: {e}"))
}
