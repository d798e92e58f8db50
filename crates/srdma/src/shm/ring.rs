//! A ring of packets in memory two processes share: one producer, one consumer.
//!
//! Layout (all offsets in bytes, little-endian, 8-byte aligned):
//!
//! | at            | what                                                              |
//! |---------------|-------------------------------------------------------------------|
//! | 0             | magic `srdmaRg1`                                                  |
//! | 8             | capacity of the record area (a power of two)                      |
//! | 64            | `head`: bytes the producer wrote (monotonic, producer's)          |
//! | 128           | `tail`: bytes the consumer took (monotonic, consumer's)           |
//! | 136           | `sleepers`: consumer threads that may sleep (they want doorbells) |
//! | 140           | `naps`: how many times a consumer thread said it may sleep        |
//! | [`HEADER_LEN`] | the records                                                      |
//!
//! A record is `len: u32, kind: u32` then `len` bytes, padded to 8; its kind says what
//! the bytes are ([`Record`]: a packet, or a packet whose payload stays in the producer's
//! memory, see `crate::pull`), or marks a wrap. A record never wraps
//! round the end of the area: where the next one does not fit, the producer writes a wrap
//! marker and starts again at 0.
//!
//! Each side trusts only its own counter: the peer's is re-read, checked against the
//! capacity, and a record that does not fit what was published makes the ring corrupt for
//! good ([`Corrupt`]) — a peer that writes garbage can lose its own packets, never crash,
//! hang or misdirect the reader. The consumer copies the first bytes of every record (a
//! packet's headers) out before anyone looks at them, so nothing the checks read can change
//! under them; the rest (a payload) is read where it lies, once, by whoever copies it to
//! its destination — what a peer that breaks the rules can change there is only the bytes
//! it sent.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// The first 8 bytes of a ring.
const MAGIC: u64 = u64::from_le_bytes(*b"srdmaRg1");
/// Bytes before the record area.
pub(crate) const HEADER_LEN: usize = 4096;
const CAP_AT: usize = 8;
const HEAD_AT: usize = 64;
const TAIL_AT: usize = 128;
const SLEEPING_AT: usize = 136;
const NAPS_AT: usize = 140;
/// A record's own header.
const REC_HDR: usize = 8;
const KIND_PACKET: u32 = 1;
const KIND_WRAP: u32 = 2;
const KIND_PULL: u32 = 3;
/// The longest record: a RoCEv2 packet of the largest MTU with every header, with room.
pub(crate) const MAX_RECORD: usize = 8192;
/// The smallest and largest record areas a consumer accepts.
pub(crate) const MIN_CAPACITY: u64 = 64 << 10;
pub(crate) const MAX_CAPACITY: u64 = 256 << 20;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// A packet, whole.
    Packet,
    /// A packet whose payload stays in the producer's memory: its other bytes and where
    /// the payload is (laid out by `shm`).
    Pull,
}

/// The peer broke the ring's rules: it is not used again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Corrupt;

/// Memory a ring lives in: a shared mapping, or (tests, fuzzing) a heap buffer.
pub(crate) struct Mem {
    ptr: *mut u8,
    len: usize,
    /// Keeps the heap buffer alive; `None` for a mapping (unmapped on drop).
    heap: Option<std::sync::Arc<[AtomicU64]>>,
}

// SAFETY: the memory is only reached through the atomics and raw copies below; whoever
// holds the `Mem` owns its side of the ring (the handle may move between threads).
unsafe impl Send for Mem {}

impl Mem {
    /// Takes ownership of a shared mapping of `len` bytes at `ptr` (unmapped on drop).
    ///
    /// # Safety
    /// `ptr` must be a live `mmap` of `len` bytes, page-aligned, that nothing else unmaps,
    /// and whose backing file cannot shrink (sealed) while it is mapped.
    pub(crate) unsafe fn from_mapping(ptr: *mut u8, len: usize) -> Mem {
        Mem {
            ptr,
            len,
            heap: None,
        }
    }

    /// A zeroed heap buffer of `len` bytes (a multiple of 8): a ring inside one process.
    pub(crate) fn heap(len: usize) -> Mem {
        let b: std::sync::Arc<[AtomicU64]> =
            (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        let ptr = b.as_ptr().cast::<u8>().cast_mut();
        Mem {
            ptr,
            len: len.div_ceil(8) * 8,
            heap: Some(b),
        }
    }

    /// The bytes: for tests and fuzzing that write garbage where a peer would, and for
    /// users that lay out atomics of their own in a mapping (the port keeper's table).
    pub(crate) fn raw(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }

    #[cfg(test)]
    /// A second handle on a heap buffer (the other side of a ring inside one process);
    /// `None` for a mapping.
    pub(crate) fn share(&self) -> Option<Mem> {
        Some(Mem {
            ptr: self.ptr,
            len: self.len,
            heap: Some(self.heap.clone()?),
        })
    }

    fn atomic64(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at % 8 == 0 && at + 8 <= HEADER_LEN);
        // SAFETY: `at` is 8-aligned inside the header page of a live, 8-aligned region of at
        // least HEADER_LEN bytes (checked at construction); the other process reaches these
        // words only atomically too.
        unsafe { &*self.ptr.add(at).cast::<AtomicU64>() }
    }

    fn atomic32(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at % 4 == 0 && at + 4 <= HEADER_LEN);
        // SAFETY: as in `atomic64`, 4-aligned.
        unsafe { &*self.ptr.add(at).cast::<AtomicU32>() }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        if self.heap.is_none() {
            // SAFETY: a mapping we own (from_mapping's contract); no reference into it
            // outlives `self`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

fn round8(n: usize) -> usize {
    (n + 7) & !7
}

/// The producer's side.
pub(crate) struct Producer {
    mem: Mem,
    cap: u64,
    /// What this side published (the shared copy is never read back).
    head: u64,
    /// The consumer's tail as last read.
    tail: u64,
    /// The consumer's `naps` when this side last rang its doorbell.
    rung: Option<u32>,
}

/// What became of a record the producer offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Published.
    Done,
    /// No room now (the consumer is behind): dropped, as a full socket buffer drops.
    Full,
    /// `fill` withdrew it.
    Withdrawn,
}

impl Producer {
    /// Lays out a fresh ring in `mem` (its record area: all of it after the header, rounded
    /// down to a power of two).
    pub(crate) fn new(mem: Mem) -> Option<Producer> {
        let area = mem.len.checked_sub(HEADER_LEN)? as u64;
        if area < MIN_CAPACITY {
            return None;
        }
        let cap = 1u64 << (63 - area.leading_zeros());
        mem.atomic64(CAP_AT).store(cap, Ordering::Relaxed);
        mem.atomic64(HEAD_AT).store(0, Ordering::Relaxed);
        mem.atomic64(TAIL_AT).store(0, Ordering::Relaxed);
        mem.atomic32(SLEEPING_AT).store(0, Ordering::Relaxed);
        mem.atomic64(0).store(MAGIC, Ordering::Release);
        Some(Producer {
            mem,
            cap,
            head: 0,
            tail: 0,
            rung: None,
        })
    }

    /// Bytes free as last seen (re-reading the consumer's tail), or `Corrupt`.
    fn free(&mut self) -> Result<u64, Corrupt> {
        let tail = self.mem.atomic64(TAIL_AT).load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > self.cap || tail < self.tail {
            return Err(Corrupt);
        }
        self.tail = tail;
        Ok(self.cap - used)
    }

    /// Whether a record of `len` bytes would fit now (re-reading the consumer's tail only if
    /// the last reading leaves too little), or `Corrupt`.
    pub(crate) fn has_room(&mut self, len: usize) -> Result<bool, Corrupt> {
        if len > MAX_RECORD {
            return Ok(false);
        }
        let need = (REC_HDR + round8(len)) as u64;
        let pos = self.head & (self.cap - 1);
        let to_end = self.cap - pos;
        let total = if need > to_end { to_end + need } else { need };
        let used = self.head - self.tail;
        Ok(self.cap - used >= total || self.free()? >= total)
    }

    /// Offers a record of `len` bytes, which `fill` writes (it returns false to withdraw it:
    /// nothing is published). `Corrupt` when the consumer broke the rules.
    #[cfg(test)]
    pub(crate) fn push(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Result<Push, Corrupt> {
        self.push_as(Record::Packet, len, fill)
    }

    /// [`Producer::push`] of a record of kind `record`.
    pub(crate) fn push_as(
        &mut self,
        record: Record,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Result<Push, Corrupt> {
        if len > MAX_RECORD {
            return Ok(Push::Full);
        }
        let need = (REC_HDR + round8(len)) as u64;
        let pos = self.head & (self.cap - 1);
        let to_end = self.cap - pos;
        let total = if need > to_end { to_end + need } else { need };
        // The consumer's tail as last read may already leave room; read it again only if not.
        let used = self.head - self.tail;
        if self.cap - used < total && self.free()? < total {
            return Ok(Push::Full);
        }
        let mut at = pos as usize;
        if need > to_end {
            self.write_hdr(at, 0, KIND_WRAP);
            at = 0;
        }
        // SAFETY: `at + need <= cap` (a record never crosses the end), inside the record area
        // of the live region; the consumer does not touch unpublished bytes (a misbehaving one
        // can only spoil its own copy of them).
        let data = unsafe {
            std::slice::from_raw_parts_mut(self.mem.ptr.add(HEADER_LEN + at + REC_HDR), len)
        };
        if !fill(data) {
            return Ok(Push::Withdrawn);
        }
        let kind = match record {
            Record::Packet => KIND_PACKET,
            Record::Pull => KIND_PULL,
        };
        self.write_hdr(at, len as u32, kind);
        self.head += total;
        self.mem
            .atomic64(HEAD_AT)
            .store(self.head, Ordering::Release);
        Ok(Push::Done)
    }

    fn write_hdr(&mut self, at: usize, len: u32, kind: u32) {
        let v = u64::from(len) | u64::from(kind) << 32;
        // SAFETY: `at` is an 8-aligned offset inside the record area (at + 8 <= cap).
        unsafe {
            self.mem
                .ptr
                .add(HEADER_LEN + at)
                .cast::<u64>()
                .write_volatile(v.to_le())
        };
    }

    /// After publishing: whether to ring the consumer's doorbell — some consumer thread may
    /// be asleep, and none was rung for since it said so (one doorbell per nap: a flood of
    /// packets while the consumer wakes up rings once).
    pub(crate) fn wants_bell(&mut self) -> bool {
        // Orders the head store before the loads (the consumer does the reverse).
        fence(Ordering::SeqCst);
        if self.mem.atomic32(SLEEPING_AT).load(Ordering::Relaxed) == 0 {
            return false;
        }
        let naps = self.mem.atomic32(NAPS_AT).load(Ordering::Relaxed);
        self.rung.replace(naps) != Some(naps)
    }
}

/// The consumer's side.
pub(crate) struct Consumer {
    mem: Mem,
    cap: u64,
    /// What this side took (the shared copy is never read back).
    tail: u64,
    /// The producer broke the rules once: nothing is read any more.
    corrupt: bool,
}

impl Consumer {
    /// Takes the consumer's side of the ring the producer laid out in `mem`: checks the
    /// magic and the capacity against the region's size.
    pub(crate) fn attach(mem: Mem) -> Option<Consumer> {
        if mem.len < HEADER_LEN {
            return None;
        }
        if mem.atomic64(0).load(Ordering::Acquire) != MAGIC {
            return None;
        }
        let cap = mem.atomic64(CAP_AT).load(Ordering::Relaxed);
        let fits = (HEADER_LEN as u64).checked_add(cap)? <= mem.len as u64;
        if !cap.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&cap) || !fits {
            return None;
        }
        Some(Consumer {
            mem,
            cap,
            tail: 0,
            corrupt: false,
        })
    }

    /// Whether the producer published nothing this side has not taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.corrupt || self.mem.atomic64(HEAD_AT).load(Ordering::Acquire) == self.tail
    }

    /// The ring's memory (tests write garbage into it as a peer could).
    #[cfg(test)]
    pub(crate) fn raw(&self) -> (*mut u8, usize) {
        self.mem.raw()
    }

    /// Whether the producer broke the rules (the ring is not read any more).
    pub(crate) fn is_corrupt(&self) -> bool {
        self.corrupt
    }

    /// Counts one more thread of this side that may sleep (it wants a doorbell for the
    /// next record); returns whether the ring is still empty: if not, it must not sleep.
    pub(crate) fn arm(&self) -> bool {
        self.mem.atomic32(NAPS_AT).fetch_add(1, Ordering::Relaxed);
        self.mem
            .atomic32(SLEEPING_AT)
            .fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.is_empty()
    }

    /// One thread less that may sleep.
    pub(crate) fn disarm(&self) {
        let _ = self.mem.atomic32(SLEEPING_AT).fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |n| Some(n.saturating_sub(1)),
        );
    }

    /// Sets the count of threads that may sleep (a ring taken while some already do).
    pub(crate) fn set_sleepers(&self, n: u32) {
        self.mem.atomic32(SLEEPING_AT).store(n, Ordering::Relaxed);
    }

    /// Takes up to `max` records, handing each to `f` as its kind, its first `head.len()`
    /// bytes (or all of it, if shorter) copied into `head`, and the whole record where it
    /// lies in the ring.
    /// Returns how many it took, or `Corrupt` (what was taken before the fault was handed on).
    ///
    /// The records stay the consumer's until `pop` returns (the tail moves then), so a
    /// producer that follows the rules writes none of them meanwhile; one that does not can
    /// change only the bytes of the record it is in, and decisions must come from `head`.
    pub(crate) fn pop(
        &mut self,
        head: &mut [u8],
        max: usize,
        mut f: impl FnMut(Record, &[u8], &[u8]),
    ) -> Result<usize, Corrupt> {
        if self.corrupt {
            return Err(Corrupt);
        }
        let head_len = head.len();
        let at_head = self.mem.atomic64(HEAD_AT).load(Ordering::Acquire);
        let avail = at_head.wrapping_sub(self.tail);
        if avail > self.cap {
            self.corrupt = true;
            return Err(Corrupt);
        }
        let mut taken = 0;
        let mut tail = self.tail;
        let r = loop {
            if tail == at_head || taken == max {
                break Ok(taken);
            }
            let left = at_head - tail;
            let pos = (tail & (self.cap - 1)) as usize;
            if left < REC_HDR as u64 {
                break Err(Corrupt);
            }
            // SAFETY: `pos` is 8-aligned (every record is a multiple of 8 long) and
            // `pos + 8 <= cap` (cap is a multiple of 8): inside the record area.
            let v = u64::from_le(unsafe {
                self.mem
                    .ptr
                    .add(HEADER_LEN + pos)
                    .cast::<u64>()
                    .read_volatile()
            });
            let (len, kind) = ((v & 0xffff_ffff) as usize, (v >> 32) as u32);
            let to_end = self.cap - pos as u64;
            match kind {
                KIND_WRAP if to_end <= left => tail += to_end,
                KIND_PACKET | KIND_PULL if len <= MAX_RECORD => {
                    let need = (REC_HDR + round8(len)) as u64;
                    if need > to_end || need > left {
                        break Err(Corrupt);
                    }
                    let n = len.min(head_len);
                    // SAFETY: `pos + 8 + len <= cap` (checked: need <= to_end): the record
                    // lies inside the record area, which lives as long as `self.mem`; `head`
                    // holds `n <= len` bytes. The producer published the record and writes
                    // none of it until the tail moves (after this loop): the slice stays
                    // what it is while `f` has it. Were the peer to break that rule, it
                    // could change only bytes of this record, any value of which is fine to
                    // copy: `len` was read once, and the checks read `head`, our own copy.
                    let whole = unsafe {
                        let at = self.mem.ptr.add(HEADER_LEN + pos + REC_HDR);
                        std::ptr::copy_nonoverlapping(at, head.as_mut_ptr(), n);
                        std::slice::from_raw_parts(at, len)
                    };
                    tail += need;
                    taken += 1;
                    let record = if kind == KIND_PULL {
                        Record::Pull
                    } else {
                        Record::Packet
                    };
                    f(record, &head[..n], whole);
                }
                _ => break Err(Corrupt),
            }
        };
        self.tail = tail;
        self.mem.atomic64(TAIL_AT).store(tail, Ordering::Release);
        self.corrupt = r.is_err();
        r
    }
}

/// Reads a ring laid out by someone who may not follow the rules: `bytes` become the ring's
/// memory (header and records) as a peer could have written it, and the consumer takes
/// records until the ring is empty or corrupt. It must neither panic nor loop forever.
pub(crate) fn read_untrusted(bytes: &[u8]) -> usize {
    let mem = Mem::heap(bytes.len().max(HEADER_LEN + MIN_CAPACITY as usize));
    let (ptr, len) = mem.raw();
    // SAFETY: `ptr` is the start of `len >= bytes.len()` writable bytes of the heap buffer.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len().min(len)) };
    let Some(mut c) = Consumer::attach(mem) else {
        return 0;
    };
    let mut head = [0u8; 64];
    let mut total = 0;
    while let Ok(n) = c.pop(&mut head, 64, |_, h, d| {
        assert!(h.len() <= d.len() && d.starts_with(h));
        total += d.len();
    }) {
        if n == 0 {
            break;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cap: usize) -> (Producer, Consumer, (*mut u8, usize)) {
        let mem = Mem::heap(HEADER_LEN + cap);
        let (ptr, len) = mem.raw();
        let view = mem.share().unwrap();
        let p = Producer::new(mem).unwrap();
        let c = Consumer::attach(view).unwrap();
        (p, c, (ptr, len))
    }

    fn drain(c: &mut Consumer) -> Result<Vec<Vec<u8>>, Corrupt> {
        let mut head = [0u8; 16];
        let mut out = Vec::new();
        c.pop(&mut head, usize::MAX, |_, h, d| {
            assert_eq!(h, &d[..d.len().min(16)]);
            out.push(d.to_vec())
        })?;
        Ok(out)
    }

    #[test]
    fn records_come_out_in_order_across_many_wraps() {
        let (mut p, mut c, _) = pair(64 << 10);
        let mut expect = std::collections::VecDeque::new();
        let mut n = 0u32;
        for round in 0..2000usize {
            let len = (round * 37) % 4200;
            let pushed = p
                .push(len, |d| {
                    for (i, b) in d.iter_mut().enumerate() {
                        *b = (n as usize + i) as u8;
                    }
                    true
                })
                .unwrap();
            if pushed == Push::Done {
                expect.push_back((n, len));
                n += 1;
            }
            if round % 7 == 0 {
                for got in drain(&mut c).unwrap() {
                    let (k, len) = expect.pop_front().unwrap();
                    assert_eq!(got.len(), len);
                    assert!(
                        got.iter()
                            .enumerate()
                            .all(|(i, &b)| b == (k as usize + i) as u8)
                    );
                }
            }
        }
        assert!(drain(&mut c).unwrap().len() == expect.len());
        assert!(n > 1500);
    }

    #[test]
    fn each_record_comes_out_with_its_kind() {
        let (mut p, mut c, _) = pair(64 << 10);
        let kinds = [Record::Pull, Record::Packet, Record::Pull, Record::Pull];
        for (i, &k) in kinds.iter().enumerate() {
            assert_eq!(p.push_as(k, 40 + i, |_| true).unwrap(), Push::Done);
        }
        let mut head = [0u8; 16];
        let mut got = Vec::new();
        c.pop(&mut head, 10, |k, _, d| got.push((k, d.len())))
            .unwrap();
        let want: Vec<_> = kinds
            .iter()
            .enumerate()
            .map(|(i, &k)| (k, 40 + i))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_full_ring_refuses_and_takes_again_once_drained() {
        let (mut p, mut c, _) = pair(64 << 10);
        let mut done = 0;
        while p.push(4000, |_| true).unwrap() == Push::Done {
            done += 1;
        }
        assert_eq!(done, (64 << 10) / 4008);
        assert_eq!(drain(&mut c).unwrap().len(), done);
        assert_eq!(p.push(4000, |_| true).unwrap(), Push::Done);
        // Too long for any ring: refused, not corrupt.
        assert_eq!(p.push(MAX_RECORD + 1, |_| true).unwrap(), Push::Full);
    }

    #[test]
    fn the_producer_rings_once_per_nap() {
        let (mut p, c, _) = pair(64 << 10);
        assert!(!p.wants_bell());
        assert!(c.arm());
        p.push(8, |_| true).unwrap();
        assert!(p.wants_bell());
        assert!(!p.wants_bell(), "one doorbell per nap");
        c.disarm();
        assert!(!p.wants_bell());
        // Two threads asleep; one wakes, goes back to sleep: a new nap, a new doorbell.
        assert!(!c.arm(), "a packet waits");
        let mut head = [0u8; 8];
        let mut c = c;
        c.pop(&mut head, 10, |_, _, _| {}).unwrap();
        assert!(c.arm());
        assert!(p.wants_bell());
        c.disarm();
        c.disarm();
        c.disarm();
        assert!(!p.wants_bell());
    }

    #[test]
    fn any_bytes_as_a_ring_are_read_without_panic_or_hang() {
        let mut x = crate::random::random_u64() | 1;
        for i in 0..400 {
            let mut bytes = vec![0u8; HEADER_LEN + (64 << 10)];
            for b in bytes.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
            if i % 2 == 0 {
                bytes[CAP_AT..CAP_AT + 8].copy_from_slice(&(64u64 << 10).to_le_bytes());
                bytes[TAIL_AT..TAIL_AT + 8].copy_from_slice(&0u64.to_le_bytes());
            }
            let _ = read_untrusted(&bytes);
        }
    }

    #[test]
    fn garbage_from_the_peer_makes_the_ring_corrupt_not_the_reader() {
        let mut rng = crate::random::random_u64() | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..3000 {
            let (mut p, mut c, (ptr, len)) = pair(64 << 10);
            for _ in 0..(next() % 40) {
                let l = (next() % 5000) as usize;
                let _ = p.push(l, |_| true);
            }
            // Scribble over the header words and some record bytes.
            for _ in 0..(next() % 6 + 1) {
                let at = match next() % 4 {
                    0 => HEAD_AT,
                    1 => TAIL_AT,
                    2 => CAP_AT,
                    _ => HEADER_LEN + (next() as usize % (len - HEADER_LEN)) / 8 * 8,
                };
                let v = match next() % 3 {
                    0 => next(),
                    1 => next() % 70000,
                    _ => (next() % 9000) | u64::from(1 + (next() % 3) as u32) << 32,
                };
                // SAFETY (test): an 8-aligned word inside the heap buffer.
                unsafe { ptr.add(at).cast::<u64>().write_volatile(v) };
            }
            let mut head = [0u8; 64];
            for _ in 0..3 {
                if let Ok(n) = c.pop(&mut head, 1000, |_, h, d| {
                    assert!(d.len() <= MAX_RECORD && h.len() <= 64);
                }) {
                    assert!(n <= 1000);
                }
                let _ = p.push((next() % 100) as usize, |_| true);
            }
        }
    }
}
