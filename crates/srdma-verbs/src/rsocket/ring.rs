//! Memory an rsocket owns and registers: an anonymous mapping, registered as the caller's
//! own memory (`Pd::reg_user_mr`), so that the socket copies bytes in and out without the
//! device lock, as a verbs application copies into its own buffers while the NIC works on
//! other parts of them.
//!
//! The rsocket protocol decides which bytes belong to whom: the engine writes into the
//! receive ring only where the peer was granted room and the application reads only
//! what completions said arrived; the engine reads the send ring only where posted sends
//! are in flight and the application writes only where their completions freed room. The
//! two never touch the same bytes at the same time, which is what makes the raw copies here
//! sound.

use std::ffi::c_int;
use std::ptr::NonNull;

use srdma::{AccessFlags, Mr, Pd};
use srdma_proto::Sge;

/// A registered, page-aligned, zeroed mapping of `len` bytes.
pub(super) struct Ring {
    ptr: NonNull<u8>,
    len: usize,
    /// Dropped before the mapping goes (see `Drop`).
    mr: Option<Mr>,
}

// SAFETY: the mapping belongs to this value alone; every access copies through raw
// pointers into bytes the protocol gives the caller (module docs), never through a
// reference to the whole region.
unsafe impl Send for Ring {}
// SAFETY: as above: shared access only copies disjoint ranges.
unsafe impl Sync for Ring {}

impl Ring {
    /// Maps and registers `len` bytes (at least one page) with `access`.
    pub(super) fn new(pd: &Pd, len: usize, access: AccessFlags) -> Result<Ring, c_int> {
        let len = len.max(1);
        // SAFETY: an anonymous private mapping; no memory arguments.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                // Not populated: an idle connection (a server's thousand clients) costs address
                // space, not memory, until bytes go through it.
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(libc::ENOMEM)?;
        let mut ring = Ring { ptr, len, mr: None };
        // SAFETY: the mapping stays until `ring` is dropped, which drops the region first.
        let mr = unsafe { pd.reg_user_mr(ptr.as_ptr(), len, ptr.as_ptr() as u64, access) }
            .map_err(|e| crate::errno_of(&e))?;
        ring.mr = Some(mr);
        Ok(ring)
    }

    fn mr(&self) -> &Mr {
        self.mr.as_ref().expect("registered until dropped")
    }

    /// The address peers and work requests use for the first byte.
    pub(super) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The remote key (0 without remote access).
    pub(super) fn rkey(&self) -> u32 {
        self.mr().rkey().map_or(0, |k| k.0)
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    pub(super) fn sge(&self, offset: usize, len: usize) -> Sge {
        self.mr().sge(offset, len)
    }

    /// Copies `src` in at `offset`. Out of range is a bug of this module: it panics (the
    /// panic boundary turns that into EIO) rather than write outside the mapping.
    pub(super) fn put(&self, offset: usize, src: &[u8]) {
        assert!(
            offset <= self.len && src.len() <= self.len - offset,
            "ring write out of range"
        );
        // SAFETY: in range (checked); the protocol gives these bytes to the caller (module
        // docs); `src` is another object.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len());
        }
    }

    /// Copies `dst.len()` bytes out from `offset` (range checked as [`Ring::put`]).
    pub(super) fn get(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset <= self.len && dst.len() <= self.len - offset,
            "ring read out of range"
        );
        // SAFETY: in range (checked); bytes the protocol gives the caller; `dst` is another
        // object.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Deregistered first: the engine touches the bytes no more once this returns.
        drop(self.mr.take());
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
