//! One copy over shared memory: READ response payloads taken straight from the responder's
//! process into their destination.
//!
//! A READ response over a ring normally costs two copies: the responder's engine copies
//! the bytes from its registered memory into the ring, the requester's from the ring into
//! the READ's buffer. Where the requester's process may read the responder's (same user,
//! no ptrace restriction: tried when the link is made, see `shm::port`), the responder
//! puts only where the payload lies — (address, length) spans in its own process — in the
//! ring record, and the requester pulls the bytes with `process_vm_readv` into their
//! destination: one copy, made by the kernel, as Open MPI's vader does with CMA.
//!
//! A READ response is the packet whose source is sure to stay put: the responder's memory
//! is the application's, which leaves it alone while its READ is outstanding, as for a
//! NIC's DMA. SEND and WRITE sources could be reused as soon as their QP is destroyed, with
//! their packets still in the ring, so they keep the copy.
//!
//! The transport handles such a packet as any other; its payload is a stand-in
//! ([`stand_in`]) of the right length, which it hands only to `Memory::write` — the engine's
//! store notes there ([`Batch::note`]) where the bytes go instead of copying them, and the
//! engine pulls a receive batch's worth in one system call ([`Batch::flush`]) before the
//! batch's completions or ACKs are published: one `process_vm_readv` costs a system call
//! and a walk of the other process's page tables, more than one packet's `memcpy`, and each
//! span it is given costs a page-pinning pass of its own, so the spans of consecutive
//! packets that follow each other (a READ's, in both processes) go as one. No byte needs
//! placing after the others (`Region::place`): a READ's buffer is the requester's to read
//! once its completion says so, not before. A pull that fails (the responder's process
//! went, or its region with it) fails the READs of that QP: the engine calls
//! `Qp::fail_placement`.

use std::io;

/// The longest payload a pulled packet carries (the largest IB MTU).
pub(crate) const MAX_PAYLOAD: usize = 4096;
/// The shortest payload worth a pull: below it the copy through the ring costs less than
/// the pull's share of its system call and page-table walk.
pub(crate) const MIN_PAYLOAD: usize = 1024;
/// Spans per packet at most (a READ response of a region of the responder's is one span;
/// a record with more keeps the copy).
pub(crate) const MAX_SPANS: usize = 8;
/// Iovecs per side of one `process_vm_readv` (the kernel's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// Set in a child this process forked: its peers know it by its parent's pid (the link's
/// credentials), so what it leaves to be pulled would be read from its parent.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether this process may leave payloads for its peers to pull: not once it is a forked
/// child of the process that made its links. [`watch_fork`] first.
pub(crate) fn may_lend() -> bool {
    !FORKED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Makes a forked child stop lending ([`may_lend`]); once per process.
pub(crate) fn watch_fork() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe, as
        // a child's handler must be); the other two are none.
        unsafe { libc::pthread_atfork(None, None, Some(forked)) };
    });
}

/// Where a pulled packet's payload is in its sender's process: (address, length) spans in
/// payload order.
pub(crate) type Span = (u64, u64);

/// Zero bytes: the payload of a packet whose bytes are pulled (see the module docs).
static STAND_IN: [u8; MAX_PAYLOAD] = [0; MAX_PAYLOAD];

/// The stand-in payload of `len` bytes (at most [`MAX_PAYLOAD`]).
pub(crate) fn stand_in(len: usize) -> &'static [u8] {
    &STAND_IN[..len.min(MAX_PAYLOAD)]
}

/// Where `src` starts in the stand-in, if it is part of it.
fn stand_in_offset(src: &[u8]) -> Option<usize> {
    let base = STAND_IN.as_ptr() as usize;
    let at = (src.as_ptr() as usize).wrapping_sub(base);
    (at <= MAX_PAYLOAD && src.len() <= MAX_PAYLOAD - at).then_some(at)
}

/// The packet being handled: whose process its payload is in, and where.
#[derive(Debug, Default)]
struct Source {
    pid: i32,
    qpn: u32,
    spans: Vec<Span>,
}

/// One placement noted: its destination and its spans in `Batch::spans`.
#[derive(Debug, Clone, Copy)]
struct Entry {
    qpn: u32,
    dst: Span,
    spans: (usize, usize),
}

/// The pulls of one receive batch (see the module docs): noted while its packets are
/// handled, made by [`Batch::flush`].
#[derive(Debug, Default)]
pub(crate) struct Batch {
    source: Option<Source>,
    /// The process the noted pulls read from.
    pid: i32,
    entries: Vec<Entry>,
    /// Every entry's spans in the sender's process.
    spans: Vec<Span>,
    /// The batch as one call: destinations and sources, neighbours joined.
    local: Vec<Span>,
    remote: Vec<Span>,
    /// QPs whose pulls failed since [`Batch::take_failed`], with the errno.
    failed: Vec<(u32, i32)>,
    /// Packets whose payload was pulled, and placements that failed (counters).
    pub(crate) packets: u64,
    pub(crate) failures: u64,
    /// Every pull fails as if the sender's process were gone (the engine's tests).
    #[cfg(test)]
    pub(crate) fail_all: bool,
}

impl Batch {
    /// The packet about to be handled (for QP `qpn`) has its payload at `spans` in process
    /// `pid`: writes of its stand-in are noted, not copied.
    pub(crate) fn begin(&mut self, pid: i32, qpn: u32, spans: &[Span]) {
        let mut s = self.source.take().unwrap_or_default();
        s.pid = pid;
        s.qpn = qpn;
        s.spans.clear();
        s.spans.extend_from_slice(spans);
        self.source = Some(s);
        self.packets += 1;
    }

    /// The packet of [`Batch::begin`] was handled.
    pub(crate) fn end(&mut self) {
        if let Some(s) = self.source.as_mut() {
            s.pid = 0;
        }
    }

    /// Whether `src` is (part of) the stand-in payload of the packet being handled: then
    /// [`Batch::note`] takes the write.
    pub(crate) fn is_stand_in(&self, src: &[u8]) -> bool {
        self.source.as_ref().is_some_and(|s| s.pid != 0) && stand_in_offset(src).is_some()
    }

    /// Notes that `src` (part of the stand-in) goes to `dst`: the bytes at the same place
    /// of the packet's payload in the sender's process. False when `src` is not part of the
    /// stand-in or lies beyond the spans (nothing is noted).
    ///
    /// # Safety
    /// `dst..dst + src.len()` stays writable memory of this process until the next
    /// [`Batch::flush`] returns, and nothing else writes it meanwhile.
    pub(crate) unsafe fn note(&mut self, dst: usize, src: &[u8]) -> bool {
        let (Some(at), Some(s)) = (stand_in_offset(src), self.source.as_ref()) else {
            return false;
        };
        if s.pid == 0 {
            return false;
        }
        let len = src.len();
        if len == 0 {
            return true;
        }
        let (pid, qpn, n) = (s.pid, s.qpn, s.spans.len());
        if pid != self.pid || self.local.len() >= IOV_MAX || self.remote.len() + n > IOV_MAX {
            self.flush();
            self.pid = pid;
        }
        let s0 = self.spans.len();
        let spans = self.source.as_ref().map_or(&[][..], |s| &s.spans[..]);
        if !spans_of(spans, at as u64, len as u64, &mut self.spans) {
            self.spans.truncate(s0);
            return false;
        }
        let dst = (dst as u64, len as u64);
        join(&mut self.local, dst);
        for i in s0..self.spans.len() {
            join(&mut self.remote, self.spans[i]);
        }
        self.entries.push(Entry {
            qpn,
            dst,
            spans: (s0, self.spans.len()),
        });
        true
    }

    /// Makes the pulls noted since the last call: one `process_vm_readv` for all (or, when
    /// that falls short, one per placement, to find which failed). QPs whose pulls failed
    /// are kept for [`Batch::take_failed`].
    pub(crate) fn flush(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        let total: u64 = self.local.iter().map(|&(_, n)| n).sum();
        // SAFETY: the local spans are the destinations `note`'s callers vouched for until
        // this flush returns.
        let whole = unsafe { self.pull(&self.local, &self.remote) };
        if !matches!(whole, Ok(n) if n as u64 == total) {
            for e in &self.entries {
                // SAFETY: as for the whole batch above.
                let one = unsafe { self.pull(&[e.dst], &self.spans[e.spans.0..e.spans.1]) };
                let errno = match one {
                    Ok(n) if n as u64 == e.dst.1 => continue,
                    Ok(_) => libc::EFAULT,
                    Err(err) => err.raw_os_error().unwrap_or(libc::EFAULT),
                };
                self.failures += 1;
                self.failed.push((e.qpn, errno));
            }
        }
        self.entries.clear();
        self.spans.clear();
        self.local.clear();
        self.remote.clear();
    }

    /// `sys::pull` from the batch's process.
    ///
    /// # Safety
    /// As `sys::pull`.
    unsafe fn pull(&self, local: &[Span], remote: &[Span]) -> io::Result<usize> {
        #[cfg(test)]
        if self.fail_all {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // SAFETY: the caller's.
        unsafe { crate::sys::pull(self.pid, local, remote) }
    }

    /// The QPs whose pulls failed since the last call, each with the errno.
    pub(crate) fn take_failed(&mut self) -> Vec<(u32, i32)> {
        std::mem::take(&mut self.failed)
    }

    /// Whether some pull failed and is not taken yet.
    pub(crate) fn has_failed(&self) -> bool {
        !self.failed.is_empty()
    }
}

/// Appends `span` to `spans`, joined to the last one if it follows it.
fn join(spans: &mut Vec<Span>, span: Span) {
    match spans.last_mut() {
        Some(last) if last.0.wrapping_add(last.1) == span.0 => last.1 += span.1,
        _ => spans.push(span),
    }
}

/// Appends to `out` the spans of the payload bytes `at..at + len`, given the payload's
/// `spans` in order. False when the bytes run past the spans.
fn spans_of(spans: &[Span], mut at: u64, mut len: u64, out: &mut Vec<Span>) -> bool {
    for &(addr, n) in spans {
        if len == 0 {
            break;
        }
        if at >= n {
            at -= n;
            continue;
        }
        let take = (n - at).min(len);
        out.push((addr.wrapping_add(at), take));
        len -= take;
        at = 0;
    }
    len == 0
}

/// The whole payload of a pulled packet, read now (a capture's copy of the packet).
pub(crate) fn read_now(pid: i32, spans: &[Span], out: &mut Vec<u8>) -> io::Result<()> {
    let total: u64 = spans.iter().map(|s| s.1).sum();
    let start = out.len();
    out.resize(start + total as usize, 0);
    let local = [(out[start..].as_mut_ptr() as u64, total)];
    // SAFETY: the local span is `out`'s new tail, which the `&mut` borrow keeps ours.
    match unsafe { crate::sys::pull(pid, &local, spans) }? {
        n if n as u64 == total => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EFAULT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_ranges_map_onto_the_spans_they_cross() {
        let spans = [(1000, 10), (5000, 6), (9000, 100)];
        let mut out = Vec::new();
        assert!(spans_of(&spans, 0, 10, &mut out));
        assert_eq!(out, [(1000, 10)]);
        out.clear();
        assert!(spans_of(&spans, 8, 10, &mut out));
        assert_eq!(out, [(1008, 2), (5000, 6), (9000, 2)]);
        out.clear();
        assert!(spans_of(&spans, 16, 100, &mut out));
        assert_eq!(out, [(9000, 100)]);
        out.clear();
        assert!(!spans_of(&spans, 16, 101, &mut out), "past the spans");
        assert!(spans_of(&spans, 116, 0, &mut out));
    }

    #[test]
    fn only_the_stand_in_is_taken_for_a_pull() {
        assert_eq!(stand_in_offset(stand_in(100)), Some(0));
        assert_eq!(stand_in_offset(&stand_in(100)[40..]), Some(40));
        assert_eq!(stand_in_offset(&[0u8; 8]), None);
        let b = Batch::default();
        assert!(!b.is_stand_in(stand_in(8)), "no packet is being handled");
    }

    /// Pulls from this very process (the kernel allows it): the bytes land; a span that is
    /// not mapped fails its QP, not the others.
    #[test]
    fn a_batch_places_what_it_pulled_and_names_the_qps_whose_pulls_failed() {
        let src: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let mut dst = vec![0u8; 10_000];
        let pid = std::process::id() as i32;
        let mut b = Batch::default();
        let half = (src.as_ptr() as u64, 5000);
        let rest = (src.as_ptr() as u64 + 5000, 5000);
        b.begin(pid, 7, &[half, rest]);
        // The transport writes the payload in two pieces (two SGEs).
        // SAFETY: `dst` outlives the flush below and nothing else writes it.
        unsafe {
            assert!(b.note(dst.as_mut_ptr() as usize, &stand_in(4096)[..3000]));
        }
        b.end();
        b.begin(pid, 8, &[(src.as_ptr() as u64 + 3000, 4096)]);
        // SAFETY: as above.
        unsafe { assert!(b.note(dst.as_mut_ptr() as usize + 3000, stand_in(4096))) };
        b.end();
        // Neighbours on both sides: one span each for the system call.
        assert_eq!((b.local.len(), b.remote.len(), b.entries.len()), (1, 1, 2));
        // A span at an address nothing maps (page 1).
        b.begin(pid, 9, &[(4096, 100)]);
        let mut lost = [7u8; 100];
        // SAFETY: as above.
        unsafe { assert!(b.note(lost.as_mut_ptr() as usize, stand_in(100))) };
        b.end();
        b.flush();
        assert_eq!(&dst[..7096], &src[..7096]);
        assert_eq!(lost, [7u8; 100], "nothing placed");
        assert_eq!(b.take_failed(), [(9, libc::EFAULT)]);
        assert_eq!((b.packets, b.failures), (3, 1));
        // Writes that are not the stand-in, or beyond the spans, are not taken.
        b.begin(pid, 7, &[(half.0, 100)]);
        // SAFETY: as above (nothing is noted).
        unsafe {
            assert!(!b.note(dst.as_mut_ptr() as usize, &[1, 2, 3]));
            assert!(!b.note(dst.as_mut_ptr() as usize, stand_in(4096)));
        }
        b.end();
        b.flush();
        assert!(!b.has_failed());
    }

    #[test]
    fn a_process_that_is_gone_fails_the_pull() {
        let mut out = Vec::new();
        let src = [1u8; 16];
        let spans = [(src.as_ptr() as u64, 16)];
        // The largest PID the kernel hands out is below 2^22.
        let err = read_now(i32::MAX - 1, &spans, &mut out).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
        out.clear();
        read_now(std::process::id() as i32, &spans, &mut out).unwrap();
        assert_eq!(out, src);
    }
}
