//! Registered memory: page-aligned allocations the engine reads and writes for RDMA, and the
//! application reads and writes through [`crate::Mr`]; or the application's own memory,
//! registered by [`crate::Pd::reg_user_mr`] (the drop-in libibverbs' `ibv_reg_mr`). Every access happens with the device
//! lock held, which is what makes handing out slices of the raw allocation sound.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use srdma_proto::memory::MemoryError;
use srdma_proto::{Memory, MrHandle};

/// Page size for MR alignment.
pub const PAGE: usize = 4096;

/// One zeroed, page-aligned allocation, or a range of the application's memory.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation to free on drop; `None` for the application's own memory.
    layout: Option<Layout>,
}

// SAFETY: a Region owns its allocation outright; the pointer is never shared outside the
// device, and every access goes through `bytes`/`bytes_mut`, which the device only calls with
// its state lock held, so no two threads touch the bytes at once.
unsafe impl Send for Region {}
// SAFETY: see `Send`: shared references never reach the bytes without the device lock.
unsafe impl Sync for Region {}

impl Region {
    /// A zeroed region of `len` bytes (at least one page), aligned to a page.
    pub(crate) fn new(len: usize) -> Option<Region> {
        let size = len.max(1).checked_next_multiple_of(PAGE)?;
        let layout = Layout::from_size_align(size, PAGE).ok()?;
        // SAFETY: `layout` has a non-zero size (at least one page).
        let ptr = unsafe { alloc_zeroed(layout) };
        Some(Region {
            ptr: NonNull::new(ptr)?,
            len,
            layout: Some(layout),
        })
    }

    /// The application's bytes `ptr..ptr + len`, which the region does not own.
    ///
    /// # Safety
    /// As [`crate::Pd::reg_user_mr`]: the range stays mapped, readable and writable for as
    /// long as the region exists.
    pub(crate) unsafe fn foreign(ptr: NonNull<u8>, len: usize) -> Region {
        Region {
            ptr,
            len,
            layout: None,
        }
    }

    /// Address of the first byte: the region's virtual address for RDMA, as on a NIC.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    ///
    /// # Safety
    /// The caller holds the device state lock, so no `&mut` to these bytes exists.
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed) bytes for the life of `self`;
        // exclusivity against writers is the caller's lock.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Copies `src` to `offset..offset + src.len()` as a NIC places a message: the last
    /// byte is stored once, after all the others. An application that polls the last byte
    /// of a WRITE and then writes into the same buffer (riostream's latency loop) must never
    /// see the engine store into it again once that byte appeared; `memcpy` gives no such
    /// promise (glibc's AVX-512 `memcpy` copies 64 bytes as two stores of the same 64), so
    /// the bytes before the last go by `memcpy` and the last one by a release store of its
    /// own.
    ///
    /// # Safety
    /// The caller holds the device state lock, no reference to these bytes is live, and
    /// `offset + src.len() <= self.len()`.
    pub(crate) unsafe fn place(&self, offset: usize, src: &[u8]) {
        let Some((&last, head)) = src.split_last() else {
            return;
        };
        // SAFETY: in bounds by the caller's contract; `src` is not in a region (packet
        // buffers and staging copies), so the two ranges do not overlap.
        unsafe {
            let dst = self.ptr.as_ptr().add(offset);
            std::ptr::copy_nonoverlapping(head.as_ptr(), dst, head.len());
            std::sync::atomic::AtomicU8::from_ptr(dst.add(head.len()))
                .store(last, std::sync::atomic::Ordering::Release);
        }
    }

    /// The bytes, writable.
    ///
    /// # Safety
    /// The caller holds the device state lock and no other reference to these bytes is live.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as `bytes`; the lock makes this the only live reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `new` with exactly this layout, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

/// The regions of one device, by MR handle: the [`Memory`] the transport reads and writes.
/// Lives inside the device state, so it is only reachable with the lock held.
#[derive(Debug, Default)]
pub(crate) struct Store {
    regions: BTreeMap<u32, (MrHandle, Arc<Region>)>,
    /// While set, reads for transmission are noted in `pieces` instead of copied.
    pub(crate) deferring: bool,
    /// The payload pieces of the packet being built, in packet order.
    pub(crate) pieces: Vec<Piece>,
    /// Payloads pulled from a peer process (see [`crate::pull`]): writes of a pulled
    /// packet's stand-in payload are noted there, not copied.
    pub(crate) pulls: crate::pull::Batch,
}

/// Payload bytes of a packet under construction that stay in their region: the engine sends
/// them from there (zero-copy) instead of from the packet buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) handle: MrHandle,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    /// Address of the bytes in the packet buffer they stand for.
    pub(crate) dst: usize,
}

/// The pieces noted while the packet was built: what a driver sends or copies from.
impl crate::driver::Payload for Store {
    fn count(&self) -> usize {
        self.pieces.len()
    }

    fn place(&self, i: usize) -> (usize, usize) {
        let p = &self.pieces[i];
        (p.dst, p.len)
    }

    fn bytes(&self, i: usize) -> Option<&[u8]> {
        self.piece(&self.pieces[i])
    }
}

impl Store {
    pub(crate) fn insert(&mut self, h: MrHandle, r: Arc<Region>) {
        self.regions.insert(h.index().value(), (h, r));
    }

    pub(crate) fn remove(&mut self, h: MrHandle) {
        if self
            .regions
            .get(&h.index().value())
            .is_some_and(|(k, _)| *k == h)
        {
            self.regions.remove(&h.index().value());
        }
    }

    /// The bytes of a noted piece.
    pub(crate) fn piece(&self, p: &Piece) -> Option<&[u8]> {
        self.bytes(p.handle).ok()?.get(p.offset..p.offset + p.len)
    }

    fn get(&self, h: MrHandle) -> Result<&Region, MemoryError> {
        match self.regions.get(&h.index().value()) {
            Some((k, r)) if *k == h => Ok(r),
            _ => Err(MemoryError::NoRegion { handle: h }),
        }
    }

    /// The 8-byte word at `offset` of region `mr`, for a remote atomic: it must be aligned
    /// in memory (rxe checks the page offset the IOVA maps to, which for a region of the
    /// application's own memory need not be the offset into the region).
    fn word(&self, mr: MrHandle, offset: u64) -> Result<&AtomicU64, MemoryError> {
        let r = self.get(mr)?;
        let range = srdma_proto::memory::region_range(offset, 8, r.len() as u64)?;
        let p = r.ptr.as_ptr().wrapping_add(range.start);
        if p as usize % 8 != 0 {
            return Err(MemoryError::Misaligned { offset });
        }
        // SAFETY: 8 bytes in bounds of the region and aligned; the region outlives the
        // borrow of `self`. An atomic is the one way to touch bytes the application may
        // touch at the same time (its own atomics on the word stay whole).
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }
}

impl Memory for Store {
    fn bytes(&self, mr: MrHandle) -> Result<&[u8], MemoryError> {
        let r = self.get(mr)?;
        // SAFETY: the store is only reachable through the locked device state, and the
        // returned borrow of `&self` ends before the lock is released, so no writer is active.
        Ok(unsafe { r.bytes() })
    }

    fn read_for_transmit(
        &mut self,
        mr: MrHandle,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), MemoryError> {
        if !self.deferring {
            return self.read(mr, offset, dst);
        }
        let len = self.get(mr)?.len() as u64;
        let range = srdma_proto::memory::region_range(offset, dst.len() as u64, len)?;
        self.pieces.push(Piece {
            handle: mr,
            offset: range.start,
            len: range.len(),
            dst: dst.as_ptr() as usize,
        });
        Ok(())
    }

    fn write(&mut self, mr: MrHandle, offset: u64, src: &[u8]) -> Result<(), MemoryError> {
        let r = self.get(mr)?;
        let range = srdma_proto::memory::region_range(offset, src.len() as u64, r.len() as u64)?;
        if self.pulls.is_stand_in(src) {
            let (dst, region_len) = (r.addr() as usize + range.start, r.len() as u64);
            // SAFETY: the range lies in the region (checked); the engine flushes the batch
            // before it releases the device lock, and regions leave the store only with
            // that lock held, so the bytes stay mapped and no one else writes them.
            return if unsafe { self.pulls.note(dst, src) } {
                Ok(())
            } else {
                Err(MemoryError::OutOfRange {
                    offset,
                    len: src.len() as u64,
                    region_len,
                })
            };
        }
        // SAFETY: `&mut self` means the device lock is held and no slice of the store's
        // regions is live; the range was checked against the region's length.
        unsafe { r.place(range.start, src) };
        Ok(())
    }

    /// A CPU atomic on the word: atomic against the application's own atomics as well.
    fn compare_swap(
        &mut self,
        mr: MrHandle,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let w = self.word(mr, offset)?;
        Ok(
            w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst)
                .unwrap_or_else(|orig| orig),
        )
    }

    /// A CPU atomic on the word, as `compare_swap`.
    fn fetch_add(&mut self, mr: MrHandle, offset: u64, add: u64) -> Result<u64, MemoryError> {
        Ok(self.word(mr, offset)?.fetch_add(add, Ordering::SeqCst))
    }

    /// A CPU atomic store on the word, as `compare_swap`.
    fn atomic_store(
        &mut self,
        mr: MrHandle,
        offset: u64,
        data: [u8; 8],
    ) -> Result<(), MemoryError> {
        self.word(mr, offset)?
            .store(u64::from_ne_bytes(data), Ordering::SeqCst);
        Ok(())
    }

    fn bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8], MemoryError> {
        let r = self.get(mr)?;
        // SAFETY: `&mut self` means the device lock is held and no other slice of the store's
        // regions is live for as long as this borrow lasts.
        Ok(unsafe { r.bytes_mut() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    /// Spins until `done` holds, yielding now and then: on a loaded machine the other side
    /// may not be running.
    fn spin_until(mut done: impl FnMut() -> bool) {
        let mut n = 0u32;
        while !done() {
            n = n.wrapping_add(1);
            if n % 1024 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// The race riostream's latency loop runs: the engine places a 64-byte message whose
    /// last byte is the marker `m`; the application waits for `m`, stores `m + 1` into the
    /// same byte (the buffer is also what it sends back) and must keep it. With a plain
    /// `memcpy` into a destination 16 bytes past a cache line, glibc stores the 64 bytes
    /// twice: the marker came back 1 to 8 times in 400 000 rounds here.
    #[test]
    fn nothing_is_stored_after_the_last_byte_of_a_placed_message() {
        const LEN: usize = 64;
        const AT: usize = 16;
        const ROUNDS: u32 = 1_000_000;
        const STOP: u32 = u32::MAX;
        let region = Arc::new(Region::new(PAGE).expect("a page"));
        let turn = Arc::new(AtomicU32::new(0));
        let engine = {
            let (region, turn) = (region.clone(), turn.clone());
            std::thread::spawn(move || {
                let mut msg = [0u8; LEN];
                for i in 1.. {
                    spin_until(|| turn.load(Ordering::Acquire) >= i);
                    if turn.load(Ordering::Acquire) == STOP {
                        return;
                    }
                    msg[LEN - 1] = (2 * i) as u8;
                    // SAFETY: in bounds; the application side only touches the last byte,
                    // through an atomic, as an application's volatile loads and stores.
                    unsafe { region.place(AT, &msg) };
                }
            })
        };
        // SAFETY: `AT + LEN - 1` is inside the region, which outlives this test's loop.
        let last = unsafe { AtomicU8::from_ptr(region.ptr.as_ptr().add(AT + LEN - 1)) };
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut reverted = 0;
        for i in 1..=ROUNDS {
            turn.store(i, Ordering::Release);
            let m = (2 * i) as u8;
            spin_until(|| last.load(Ordering::Acquire) == m);
            last.store(m.wrapping_add(1), Ordering::Relaxed);
            for _ in 0..20 {
                std::hint::spin_loop();
            }
            if last.load(Ordering::Relaxed) != m.wrapping_add(1) {
                reverted += 1;
            }
            if Instant::now() > deadline {
                break;
            }
        }
        turn.store(STOP, Ordering::Release);
        engine.join().expect("engine thread");
        assert_eq!(
            reverted, 0,
            "the engine stored into a message after its last byte"
        );
    }

    /// A remote FetchAdd and the application's own atomic adds on the same word lose no
    /// update (a read, add and write of the bytes — the trait's default — loses some).
    #[test]
    fn remote_atomics_are_atomic_against_the_application() {
        const ADDS: u64 = 200_000;
        let region = Arc::new(Region::new(PAGE).expect("a page"));
        let mut table = srdma_proto::MrTable::new(1);
        let access =
            srdma_proto::AccessFlags::LOCAL_WRITE | srdma_proto::AccessFlags::REMOTE_ATOMIC;
        let h = table
            .register(srdma_proto::mr::PdId(1), region.addr(), PAGE as u64, access)
            .expect("a free slot")
            .handle;
        let mut store = Store::default();
        store.insert(h, region.clone());
        let app = {
            let region = region.clone();
            std::thread::spawn(move || {
                // SAFETY: offset 8 of a page-aligned, live region: aligned and in bounds.
                let w = unsafe { AtomicU64::from_ptr(region.ptr.as_ptr().add(8).cast()) };
                for _ in 0..ADDS {
                    w.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        for _ in 0..ADDS {
            store.fetch_add(h, 8, 1 << 32).expect("aligned word");
        }
        app.join().expect("application thread");
        let mut word = [0u8; 8];
        store.read(h, 8, &mut word).expect("in range");
        assert_eq!(u64::from_ne_bytes(word), ADDS | ADDS << 32);
        assert_eq!(store.compare_swap(h, 8, 0, 1), Ok(ADDS | ADDS << 32));
        assert_eq!(
            store.fetch_add(h, 12, 1),
            Err(MemoryError::Misaligned { offset: 12 })
        );
    }

    /// ATOMIC WRITE stores the whole word at once, in memory order; a misaligned one is
    /// refused and changes nothing.
    #[test]
    fn atomic_store_is_one_aligned_word() {
        let region = Arc::new(Region::new(PAGE).expect("a page"));
        let mut table = srdma_proto::MrTable::new(1);
        let access = srdma_proto::AccessFlags::LOCAL_WRITE | srdma_proto::AccessFlags::REMOTE_WRITE;
        let h = table
            .register(srdma_proto::mr::PdId(1), region.addr(), PAGE as u64, access)
            .expect("a free slot")
            .handle;
        let mut store = Store::default();
        store.insert(h, region.clone());
        store
            .atomic_store(h, 16, *b"12345678")
            .expect("aligned word");
        let mut word = [0u8; 8];
        store.read(h, 16, &mut word).expect("in range");
        assert_eq!(&word, b"12345678");
        assert_eq!(
            store.atomic_store(h, 20, [0xFF; 8]),
            Err(MemoryError::Misaligned { offset: 20 })
        );
        let mut around = [0u8; 16];
        store.read(h, 16, &mut around).expect("in range");
        assert_eq!(&around[..8], b"12345678");
        assert_eq!(&around[8..], &[0; 8]);
        assert!(
            store.atomic_store(h, PAGE as u64, [0; 8]).is_err(),
            "past the end"
        );
    }
}
