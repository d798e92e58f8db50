//! Registered memory: page-aligned allocations the engine reads and writes for RDMA, and the
//! application reads and writes through [`crate::Mr`]. Every access happens with the device
//! lock held, which is what makes handing out slices of the raw allocation sound.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

use srdma_proto::memory::{MemoryError, region_range};
use srdma_proto::{Memory, MrHandle};

/// Page size for MR alignment.
pub const PAGE: usize = 4096;

/// One zeroed, page-aligned allocation.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
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
            layout,
        })
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
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The regions of one device, by MR handle: the [`Memory`] the transport reads and writes.
/// Lives inside the device state, so it is only reachable with the lock held.
#[derive(Debug, Default)]
pub(crate) struct Store {
    regions: BTreeMap<u32, (MrHandle, Arc<Region>)>,
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

    fn get(&self, h: MrHandle) -> Result<&Region, MemoryError> {
        match self.regions.get(&h.index().value()) {
            Some((k, r)) if *k == h => Ok(r),
            _ => Err(MemoryError::NoRegion { handle: h }),
        }
    }

    fn word(&mut self, h: MrHandle, offset: u64) -> Result<&mut [u8], MemoryError> {
        srdma_proto::memory::check_atomic_offset(offset)
            .map_err(|_| MemoryError::Misaligned { offset })?;
        let r = self.get(h)?;
        let range = region_range(offset, 8, r.len() as u64)?;
        // SAFETY: `&mut self` on the store means the device lock is held (the store lives in
        // the locked state) and no other slice of this region is live.
        Ok(unsafe { &mut r.bytes_mut()[range] })
    }
}

impl Memory for Store {
    fn read(&self, mr: MrHandle, offset: u64, dst: &mut [u8]) -> Result<(), MemoryError> {
        let r = self.get(mr)?;
        let range = region_range(offset, dst.len() as u64, r.len() as u64)?;
        // SAFETY: the store is only reachable through the locked device state, so no writer
        // is active; `dst` is a separate buffer.
        dst.copy_from_slice(unsafe { &r.bytes()[range] });
        Ok(())
    }

    fn write(&mut self, mr: MrHandle, offset: u64, src: &[u8]) -> Result<(), MemoryError> {
        let r = self.get(mr)?;
        let range = region_range(offset, src.len() as u64, r.len() as u64)?;
        // SAFETY: `&mut self` means the device lock is held; no other slice is live; `src` is
        // a packet buffer, never this region.
        unsafe { r.bytes_mut()[range].copy_from_slice(src) };
        Ok(())
    }

    fn compare_swap(
        &mut self,
        mr: MrHandle,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let w = self.word(mr, offset)?;
        let orig = u64::from_ne_bytes(
            w.try_into()
                .map_err(|_| MemoryError::Misaligned { offset })?,
        );
        if orig == compare {
            w.copy_from_slice(&swap.to_ne_bytes());
        }
        Ok(orig)
    }

    fn fetch_add(&mut self, mr: MrHandle, offset: u64, add: u64) -> Result<u64, MemoryError> {
        let w = self.word(mr, offset)?;
        let orig = u64::from_ne_bytes(
            w.try_into()
                .map_err(|_| MemoryError::Misaligned { offset })?,
        );
        w.copy_from_slice(&orig.wrapping_add(add).to_ne_bytes());
        Ok(orig)
    }
}
