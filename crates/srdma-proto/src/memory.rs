//! The memory behind memory regions, supplied by the engine.
//!
//! This crate holds no pointers: the engine owns the bytes (page-aligned, possibly memfd
//! backed) and lends access through [`Memory`]. Every access names the region by an
//! [`MrHandle`] — index *and* generation — so an implementation can refuse a handle whose
//! region was deregistered, even if the index now holds a new region. [`VecMemory`] is the
//! reference implementation used by tests and the simulator.

use std::collections::BTreeMap;

use crate::mr::MrHandle;

/// Why a memory access could not be performed. After a successful [`crate::mr::MrTable`]
/// check only [`MemoryError::Misaligned`] (atomics) or a stale handle can occur.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// No region is stored under this handle: it never existed, or it was deregistered (the
    /// generation no longer matches). The access must not touch whatever lives at the index now.
    #[error("no memory behind region handle {handle:?} (deregistered or never supplied)")]
    NoRegion {
        /// The handle that was used.
        handle: MrHandle,
    },
    /// `offset + len` runs past the end of the region (or overflows).
    #[error("access {offset:#x}+{len:#x} outside region of {region_len:#x} bytes")]
    OutOfRange {
        /// Offset of the access within the region.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Length of the region.
        region_len: u64,
    },
    /// An atomic on an address that is not 8-byte aligned (IBTA: atomic operations act on a
    /// naturally aligned 64-bit word; rxe `rxe_mr_do_atomic_op` checks `iova & 7` and the
    /// responder NAKs with "invalid request").
    #[error("atomic at offset {offset:#x} is not 8-byte aligned")]
    Misaligned {
        /// Offset of the access within the region.
        offset: u64,
    },
}

/// Byte access to registered memory, by region handle and offset from the region's start.
///
/// Offsets are relative to the region, not virtual addresses: [`crate::mr::MrGrant`] converts.
/// Regions must start 8-byte aligned (srdma regions are page-aligned), so an offset that is a
/// multiple of 8 is an aligned address. Atomics operate on a native-endian `u64` in memory, as
/// rxe does (`rxe_mr.c rxe_mr_do_atomic_op`); the responder converts to and from the
/// big-endian AtomicETH / AtomicAckETH fields.
///
/// Implementations must not panic on any argument, and must return
/// [`MemoryError::NoRegion`] for a handle whose generation is not the live one.
pub trait Memory {
    /// The bytes of region `mr`, or [`MemoryError::NoRegion`] if `mr` is not the live handle.
    fn bytes(&self, mr: MrHandle) -> Result<&[u8], MemoryError>;

    /// The bytes of region `mr` for writing, or [`MemoryError::NoRegion`].
    fn bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8], MemoryError>;

    /// Copies `dst.len()` bytes starting at `offset` of region `mr` into `dst`.
    fn read(&self, mr: MrHandle, offset: u64, dst: &mut [u8]) -> Result<(), MemoryError> {
        let bytes = self.bytes(mr)?;
        let range = region_range(offset, dst.len() as u64, bytes.len() as u64)?;
        dst.copy_from_slice(&bytes[range]);
        Ok(())
    }

    /// Reads bytes that only go out in the packet being built (`dst` lies in the buffer
    /// handed to [`crate::transport::Qp::poll_transmit`]). An implementation may check the
    /// range, leave `dst` unwritten and note where the bytes are instead, so its engine hands
    /// them to the network straight from the region (a zero-copy send). Default: [`Memory::read`].
    fn read_for_transmit(
        &mut self,
        mr: MrHandle,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), MemoryError> {
        self.read(mr, offset, dst)
    }

    /// Copies `src` into region `mr` starting at `offset`. An implementation whose
    /// regions an application reads while they are written (an engine over the
    /// application's own memory) must store the last byte once, after all the others, as a
    /// NIC places a message: an application polling that byte may write the buffer as soon
    /// as it changes, and a second store of it (glibc's `memcpy` makes some) would undo that
    /// write. The default copies with `copy_from_slice`.
    fn write(&mut self, mr: MrHandle, offset: u64, src: &[u8]) -> Result<(), MemoryError> {
        let bytes = self.bytes_mut(mr)?;
        let range = region_range(offset, src.len() as u64, bytes.len() as u64)?;
        bytes[range].copy_from_slice(src);
        Ok(())
    }

    /// Atomically: if the `u64` at `offset` equals `compare`, replace it with `swap`. Returns
    /// the original value either way (IBTA CmpSwap). "Atomically" holds because every access
    /// to the memory goes through `&mut self`.
    fn compare_swap(
        &mut self,
        mr: MrHandle,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let word = word_mut(self.bytes_mut(mr)?, offset)?;
        let orig = u64::from_ne_bytes(*word);
        if orig == compare {
            *word = swap.to_ne_bytes();
        }
        Ok(orig)
    }

    /// Atomically stores the 8 bytes `data` (memory order) at the aligned word at `offset`
    /// (IBTA 1.5 ATOMIC WRITE): no reader sees a torn word.
    fn atomic_store(
        &mut self,
        mr: MrHandle,
        offset: u64,
        data: [u8; 8],
    ) -> Result<(), MemoryError> {
        *word_mut(self.bytes_mut(mr)?, offset)? = data;
        Ok(())
    }

    /// Atomically adds `add` (wrapping) to the `u64` at `offset`, returning the original value
    /// (IBTA FetchAdd).
    fn fetch_add(&mut self, mr: MrHandle, offset: u64, add: u64) -> Result<u64, MemoryError> {
        let word = word_mut(self.bytes_mut(mr)?, offset)?;
        let orig = u64::from_ne_bytes(*word);
        *word = orig.wrapping_add(add).to_ne_bytes();
        Ok(orig)
    }
}

/// The aligned 8-byte word at `offset` of a region.
fn word_mut(bytes: &mut [u8], offset: u64) -> Result<&mut [u8; 8], MemoryError> {
    check_atomic_offset(offset)?;
    let range = region_range(offset, 8, bytes.len() as u64)?;
    (&mut bytes[range])
        .try_into()
        .map_err(|_| MemoryError::Misaligned { offset })
}

/// Checks that an atomic at `offset` is 8-byte aligned; a helper for [`Memory`] implementors.
#[inline]
pub const fn check_atomic_offset(offset: u64) -> Result<(), MemoryError> {
    if offset % 8 == 0 {
        Ok(())
    } else {
        Err(MemoryError::Misaligned { offset })
    }
}

/// Converts `offset..offset+len` within a region of `region_len` bytes into a `usize` range,
/// or the [`MemoryError::OutOfRange`] describing why it does not fit. Overflow-safe; a helper
/// for [`Memory`] implementors.
pub fn region_range(
    offset: u64,
    len: u64,
    region_len: u64,
) -> Result<core::ops::Range<usize>, MemoryError> {
    let err = MemoryError::OutOfRange {
        offset,
        len,
        region_len,
    };
    if offset > region_len || len > region_len - offset {
        return Err(err);
    }
    let start = usize::try_from(offset).map_err(|_| err)?;
    let end = usize::try_from(offset + len).map_err(|_| err)?;
    Ok(start..end)
}

/// Regions as plain `Vec<u8>`s keyed by handle: the [`Memory`] of tests and the simulator.
///
/// Single-threaded, so "atomic" operations are ordinary read-modify-writes; the alignment rule
/// is still enforced so tests catch what real memory would reject.
#[derive(Debug, Clone, Default)]
pub struct VecMemory {
    /// Index → (generation, bytes). One entry per index: inserting a newer generation replaces
    /// the old region, which is exactly the situation stale handles must not reach.
    regions: BTreeMap<u32, (u32, Vec<u8>)>,
}

impl VecMemory {
    /// No regions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Supplies `bytes` as the memory of region `mr`, replacing whatever was stored at its
    /// index (an older generation becomes unreachable).
    pub fn insert(&mut self, mr: MrHandle, bytes: Vec<u8>) {
        self.regions
            .insert(mr.index().value(), (mr.generation(), bytes));
    }

    /// Supplies `len` zero bytes as the memory of region `mr`.
    pub fn insert_zeroed(&mut self, mr: MrHandle, len: usize) {
        self.insert(mr, vec![0; len]);
    }

    /// Removes the memory of region `mr` and returns it; `None` if `mr` is not the live handle.
    pub fn remove(&mut self, mr: MrHandle) -> Option<Vec<u8>> {
        let idx = mr.index().value();
        match self.regions.get(&idx) {
            Some((generation, _)) if *generation == mr.generation() => {
                self.regions.remove(&idx).map(|(_, b)| b)
            }
            _ => None,
        }
    }

    /// The bytes of region `mr`, if `mr` is the live handle.
    pub fn region(&self, mr: MrHandle) -> Option<&[u8]> {
        match self.regions.get(&mr.index().value()) {
            Some((generation, bytes)) if *generation == mr.generation() => Some(bytes),
            _ => None,
        }
    }

    /// The bytes of region `mr` for writing, if `mr` is the live handle.
    pub fn region_mut(&mut self, mr: MrHandle) -> Option<&mut [u8]> {
        match self.regions.get_mut(&mr.index().value()) {
            Some((generation, bytes)) if *generation == mr.generation() => Some(bytes),
            _ => None,
        }
    }
}

impl Memory for VecMemory {
    fn bytes(&self, mr: MrHandle) -> Result<&[u8], MemoryError> {
        self.region(mr).ok_or(MemoryError::NoRegion { handle: mr })
    }

    fn bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8], MemoryError> {
        self.region_mut(mr)
            .ok_or(MemoryError::NoRegion { handle: mr })
    }
}
