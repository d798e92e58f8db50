//! The memory-region table: registration, L_Key/R_Key generation and the access checks the
//! requester (local SGEs) and responder (incoming RDMA) run before touching memory.
//!
//! Keys follow rxe (`rxe_mr.c rxe_mr_init`): `lkey = index << 8 | key`, where `index` is the
//! slot in this table and `key` a random byte; `rkey = lkey` when the region has a remote
//! right, otherwise the region has no R_Key. The key byte comes from a seeded PRNG, so keys are
//! never a guessable sequence, and a slot that is reused gets a key byte different from its
//! previous one (rxe `rxe_get_next_key`), so the previous registration's keys fail.
//!
//! # Deregistration while work is in flight
//!
//! A successful check returns an [`MrGrant`]: a byte range of one region, named by an
//! [`MrHandle`] = (index, generation). Each slot's generation advances when its region is
//! deregistered, so a handle outlives its region only as a *stale* handle:
//! [`MrTable::revalidate`] rejects it with [`MrError::Stale`], and every [`Memory`]
//! implementation must refuse it ([`crate::memory::MemoryError::NoRegion`]). Work checked
//! against a region that is then deregistered — even if the same index is immediately
//! registered again — can therefore never read or write the new region.
//!
//! # Memory windows
//!
//! The same table holds the device's memory windows ([`MwType`], `ibv_alloc_mw`), in the upper
//! half of the index space ([`MW_INDEX_BASE`]), so an R_Key names either a region or a window
//! by its index alone, as rxe's `rkey_is_mw`. A window bound to a region grants remote access
//! to part of it under the window's own R_Key and rights; see [`MrTable::bind_mw`].
//!
//! [`Memory`]: crate::memory::Memory

use std::collections::VecDeque;

use srdma_wire::NakCode;

use crate::access::{AccessError, AccessFlags};
use crate::rng::SplitMix64;
use crate::wc::WcStatus;

mod mw;

pub use mw::{MAX_MW, MW_INDEX_BASE, MwBind, MwError, MwInfo, MwState, MwType};

/// A protection domain, as the engine numbers them. A QP can only use regions of its own PD
/// (IBTA protection domains; rxe `lookup_mr` compares the region's PD with the QP's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PdId(pub u32);

/// The slot of a region in its [`MrTable`]: the upper 24 bits of its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MrIndex(u32);

impl MrIndex {
    /// The largest index a 32-bit key can carry above its 8-bit key byte.
    pub const MAX: u32 = 0x00FF_FFFF;

    /// The index as an integer in `1..=MrIndex::MAX` (index 0 is never used, so key values
    /// `0..=0xFF` never name a region).
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

/// A local key: names a region in local SGEs (`ibv_sge.lkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LKey(pub u32);

/// A remote key: names a region in RETH / AtomicETH fields sent by peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RKey(pub u32);

impl LKey {
    /// The table slot the key names (`lkey >> 8`).
    #[inline]
    pub const fn index_bits(self) -> u32 {
        self.0 >> 8
    }

    /// The random key byte (`lkey & 0xFF`).
    #[inline]
    pub const fn key_byte(self) -> u8 {
        self.0 as u8
    }
}

impl RKey {
    /// The table slot the key names (`rkey >> 8`).
    #[inline]
    pub const fn index_bits(self) -> u32 {
        self.0 >> 8
    }

    /// The random key byte (`rkey & 0xFF`).
    #[inline]
    pub const fn key_byte(self) -> u8 {
        self.0 as u8
    }
}

impl core::fmt::Display for LKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

impl core::fmt::Display for RKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// One registration of one region: its slot and that slot's generation at registration time.
///
/// Handles are only made by [`MrTable`]; a handle whose region has been deregistered is stale
/// forever, even after the slot is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrHandle {
    index: MrIndex,
    generation: u32,
}

impl MrHandle {
    /// The table slot.
    #[inline]
    pub const fn index(self) -> MrIndex {
        self.index
    }

    /// The slot's generation when the region was registered (wraps after 2^32 reuses of one
    /// slot; a handle would have to survive all of them to be mistaken).
    #[inline]
    pub const fn generation(self) -> u32 {
        self.generation
    }
}

/// What [`MrTable::register`] hands back: the keys to give the application and the handle
/// under which the engine must supply the region's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// The L_Key (`ibv_mr.lkey`).
    pub lkey: LKey,
    /// The R_Key (`ibv_mr.rkey`), present only when the region has a remote right; rxe reports
    /// 0 otherwise.
    pub rkey: Option<RKey>,
    /// The region's handle, for [`crate::memory::Memory`].
    pub handle: MrHandle,
}

impl MrKeys {
    /// The table slot (the same for both keys).
    #[inline]
    pub const fn index(&self) -> MrIndex {
        self.handle.index
    }
}

/// A registered region, as [`MrTable::query`] and [`MrTable::deregister`] report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrInfo {
    /// The region's protection domain.
    pub pd: PdId,
    /// The virtual address of the first byte, as peers address it in RETH/AtomicETH.
    pub addr: u64,
    /// The length in bytes.
    pub len: u64,
    /// The region's rights.
    pub access: AccessFlags,
    /// Keys and handle.
    pub keys: MrKeys,
}

/// Permission to access `len` bytes at `offset` of one registration of one region.
///
/// Made only by the checks of [`MrTable`]; carried by in-flight work so that the data movement,
/// which may happen much later (a retransmission, a READ response), addresses the region by
/// handle and offset and can be revalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrGrant {
    handle: MrHandle,
    offset: u64,
    len: u64,
}

impl MrGrant {
    /// The region registration the grant is for.
    #[inline]
    pub const fn handle(&self) -> MrHandle {
        self.handle
    }

    /// Offset of the first granted byte from the start of the region.
    #[inline]
    pub const fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of granted bytes (never 0: zero-length accesses get no grant).
    #[inline]
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a grant covers at least one byte. (Present for API symmetry with `len`.)
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-grant of `len` bytes starting `at` bytes into this one (e.g. one packet's share
    /// of a message), or `None` if it does not lie inside this grant. Overflow-safe.
    pub const fn slice(&self, at: u64, len: u64) -> Option<MrGrant> {
        if at > self.len || len > self.len - at {
            return None;
        }
        Some(MrGrant {
            handle: self.handle,
            offset: self.offset + at,
            len,
        })
    }
}

/// Why a registration, deregistration or access check failed.
///
/// Every variant that names a key carries the raw 32-bit key value so logs match what the
/// application passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MrError {
    /// The access flags cannot be registered.
    #[error("invalid access flags: {0}")]
    Access(#[from] AccessError),
    /// `addr + len` overflows the 64-bit address space (the kernel's `ib_umem_get` rejects it
    /// with EINVAL).
    #[error("region {addr:#x}+{len:#x} wraps around the 64-bit address space")]
    AddressOverflow {
        /// Requested start address.
        addr: u64,
        /// Requested length.
        len: u64,
    },
    /// Every slot is in use.
    #[error("memory region table full ({max} regions)")]
    TableFull {
        /// The table's capacity.
        max: u32,
    },
    /// No live region has this key: unknown index, wrong key byte (a stale or guessed key), or
    /// an R_Key used on a region without remote rights.
    #[error("no memory region with key {key:#010x}")]
    InvalidKey {
        /// The key as given.
        key: u32,
    },
    /// The region belongs to another protection domain.
    #[error("key {key:#010x} belongs to {region_pd:?}, not {pd:?}")]
    PdMismatch {
        /// The key as given.
        key: u32,
        /// The PD of the accessing QP.
        pd: PdId,
        /// The PD of the region.
        region_pd: PdId,
    },
    /// The region lacks a required right.
    #[error("key {key:#010x} grants {have}, access needs {need}")]
    AccessDenied {
        /// The key as given.
        key: u32,
        /// The rights the access needs.
        need: AccessFlags,
        /// The rights the region has.
        have: AccessFlags,
    },
    /// The range is not inside the region.
    #[error(
        "range {addr:#x}+{len:#x} outside region {region_addr:#x}+{region_len:#x} (key {key:#010x})"
    )]
    OutOfBounds {
        /// The key as given.
        key: u32,
        /// Start of the requested range.
        addr: u64,
        /// Length of the requested range.
        len: u64,
        /// Start of the region.
        region_addr: u64,
        /// Length of the region.
        region_len: u64,
    },
    /// An atomic target address that is not 8-byte aligned.
    #[error("atomic address {va:#x} is not 8-byte aligned")]
    Misaligned {
        /// The requested address.
        va: u64,
    },
    /// The region a grant was issued for has been deregistered since.
    #[error("region handle {handle:?} is stale: deregistered after the access was checked")]
    Stale {
        /// The stale handle.
        handle: MrHandle,
    },
    /// The region cannot be deregistered while memory windows are bound to it (IBA
    /// 10.6.7.2.6; rxe `rxe_dereg_mr` returns EINVAL).
    #[error("key {key:#010x}: {windows} memory window(s) still bound to the region")]
    WindowsBound {
        /// The L_Key as given.
        key: u32,
        /// How many windows are bound to it.
        windows: usize,
    },
}

impl MrError {
    /// The completion status for a failed check of a *local* SGE on the send side: local
    /// protection error (rxe's requester turns any `copy_data` failure into
    /// `IB_WC_LOC_PROT_ERR`). The responder reports receive-buffer failures differently
    /// (rxe: `IB_WC_LOC_QP_OP_ERR`) and decides that itself.
    #[inline]
    pub const fn local_wc_status(&self) -> WcStatus {
        WcStatus::LocProtErr
    }

    /// The NAK an RC responder sends for a failed check of a *remote* access: "invalid request"
    /// for a misaligned atomic (rxe `RESPST_ERR_MISALIGNED_ATOMIC`), "remote access error" for
    /// every key, PD, rights or bounds violation (rxe `RESPST_ERR_RKEY_VIOLATION`, IBTA class C).
    #[inline]
    pub const fn remote_nak(&self) -> NakCode {
        match self {
            MrError::Misaligned { .. } => NakCode::InvalidRequest,
            _ => NakCode::RemoteAccessError,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Region {
    pd: PdId,
    addr: u64,
    len: u64,
    access: AccessFlags,
    key: u8,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    generation: u32,
    /// The key byte of the most recent registration in this slot, so the next one differs.
    last_key: Option<u8>,
    region: Option<Region>,
}

/// Which key space a lookup is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Local,
    Remote,
}

/// The registered memory regions of one device.
///
/// Indices run from 1 to the capacity; freed indices are reused oldest-first, so a freed slot
/// rests as long as possible before it is handed out again. The table is sans-IO and holds no
/// memory: see [`crate::memory::Memory`].
#[derive(Debug, Clone)]
pub struct MrTable {
    /// `slots[i]` is index `i + 1`.
    slots: Vec<Slot>,
    /// Freed indices, oldest first.
    free: VecDeque<u32>,
    rng: SplitMix64,
    max: u32,
    live: usize,
    /// The memory windows (indices from [`MW_INDEX_BASE`]).
    mws: mw::Windows,
}

impl MrTable {
    /// The default capacity: `max_mr` of the rxe device in `../shared/rxe-lab` (kernel 6.1).
    pub const DEFAULT_MAX_MR: u32 = 524_287;

    /// An empty table whose key bytes come from a PRNG seeded with `seed`. The engine passes
    /// OS randomness; tests pass a constant for reproducible keys.
    pub fn new(seed: u64) -> Self {
        Self::with_max_mr(seed, Self::DEFAULT_MAX_MR)
    }

    /// An empty table holding at most `max_mr` regions (clamped to `1..MW_INDEX_BASE`: the
    /// indices above are memory windows').
    pub fn with_max_mr(seed: u64, max_mr: u32) -> Self {
        MrTable {
            slots: Vec::new(),
            free: VecDeque::new(),
            rng: SplitMix64::new(seed),
            max: max_mr.clamp(1, MW_INDEX_BASE - 1),
            live: 0,
            mws: mw::Windows::default(),
        }
    }

    /// The capacity.
    #[inline]
    pub fn max_mr(&self) -> u32 {
        self.max
    }

    /// The number of registered regions.
    #[inline]
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no region is registered.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Registers `len` bytes at virtual address `addr` (the address peers will use) in `pd`
    /// with rights `access` (`ibv_reg_mr`).
    ///
    /// Fails on flags [`AccessFlags::validate_for_mr`] refuses (notably REMOTE_WRITE or
    /// REMOTE_ATOMIC without LOCAL_WRITE), on `addr + len` overflowing, and on a full table.
    /// Zero-length regions are allowed (only zero-length accesses can use them).
    pub fn register(
        &mut self,
        pd: PdId,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrKeys, MrError> {
        access.validate_for_mr()?;
        if addr.checked_add(len).is_none() {
            return Err(MrError::AddressOverflow { addr, len });
        }
        let index = self.alloc_index()?;
        let max = self.max;
        // Disjoint field borrows: the slot (in `slots`) and the key generator.
        let slot = usize::try_from(index - 1)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
            .ok_or(MrError::TableFull { max })?;
        let key = self.rng.next_key_byte(slot.last_key);
        slot.last_key = Some(key);
        slot.region = Some(Region {
            pd,
            addr,
            len,
            access,
            key,
        });
        let generation = slot.generation;
        self.live += 1;
        Ok(Self::keys(MrIndex(index), generation, key, access))
    }

    /// Deregisters the region with L_Key `lkey` (`ibv_dereg_mr`) and returns what it was, so
    /// the engine can release the memory supplied under its handle.
    ///
    /// The handle becomes stale at once: grants issued for it fail [`MrTable::revalidate`],
    /// and its keys stop working even if the slot is registered again.
    ///
    /// Fails with [`MrError::WindowsBound`], leaving the region registered, while memory
    /// windows are bound to it (rxe); [`MrTable::deregister_unbinding`] does not.
    pub fn deregister(&mut self, lkey: LKey) -> Result<MrInfo, MrError> {
        let info = self
            .query(lkey)
            .ok_or(MrError::InvalidKey { key: lkey.0 })?;
        let windows = self.mws.bound_to(info.keys.handle);
        if windows > 0 {
            return Err(MrError::WindowsBound {
                key: lkey.0,
                windows,
            });
        }
        self.remove(info)
    }

    /// Deregisters the region with L_Key `lkey` even with windows bound to it: they become
    /// unbound (type 1 windows lose their binding, type 2 windows return to the free state),
    /// so their R_Keys stop granting access. For owners that cannot fail (a dropped region).
    pub fn deregister_unbinding(&mut self, lkey: LKey) -> Result<MrInfo, MrError> {
        let info = self
            .query(lkey)
            .ok_or(MrError::InvalidKey { key: lkey.0 })?;
        self.mws.unbind_all(info.keys.handle);
        self.remove(info)
    }

    fn remove(&mut self, info: MrInfo) -> Result<MrInfo, MrError> {
        let index = info.keys.index().value();
        if let Some(slot) = self.slot_mut(index) {
            slot.region = None;
            slot.generation = slot.generation.wrapping_add(1);
        }
        self.free.push_back(index);
        self.live -= 1;
        Ok(info)
    }

    /// Changes the region with L_Key `lkey` in place (`ibv_rereg_mr`): its protection domain,
    /// its address and length, its rights, each when given. The keys stay the same (as rxe's
    /// and mlx5's rereg keep them); the handle changes, so grants issued before fail
    /// [`MrTable::revalidate`] and the engine supplies the memory under the new handle.
    ///
    /// Fails as [`MrTable::register`] does on the new values, with [`MrError::InvalidKey`]
    /// for an unknown `lkey`, and with [`MrError::WindowsBound`] while memory windows are
    /// bound to the region; the region is unchanged then.
    pub fn reregister(
        &mut self,
        lkey: LKey,
        pd: Option<PdId>,
        range: Option<(u64, u64)>,
        access: Option<AccessFlags>,
    ) -> Result<MrInfo, MrError> {
        let old = self
            .query(lkey)
            .ok_or(MrError::InvalidKey { key: lkey.0 })?;
        // IBA 10.6.7.2.6: no reregistration while windows are bound (their grants name the
        // handle this would retire).
        let windows = self.mws.bound_to(old.keys.handle);
        if windows > 0 {
            return Err(MrError::WindowsBound {
                key: lkey.0,
                windows,
            });
        }
        let access = access.unwrap_or(old.access);
        access.validate_for_mr()?;
        let (addr, len) = range.unwrap_or((old.addr, old.len));
        if addr.checked_add(len).is_none() {
            return Err(MrError::AddressOverflow { addr, len });
        }
        let index = old.keys.index();
        let slot = self
            .slot_mut(index.value())
            .ok_or(MrError::InvalidKey { key: lkey.0 })?;
        let key = lkey.0 as u8;
        slot.region = Some(Region {
            pd: pd.unwrap_or(old.pd),
            addr,
            len,
            access,
            key,
        });
        slot.generation = slot.generation.wrapping_add(1);
        self.query(lkey).ok_or(MrError::InvalidKey { key: lkey.0 })
    }

    /// The live region with L_Key `lkey`, if any.
    pub fn query(&self, lkey: LKey) -> Option<MrInfo> {
        let (index, slot, region) = self.lookup(lkey.0, KeyKind::Local)?;
        Some(MrInfo {
            pd: region.pd,
            addr: region.addr,
            len: region.len,
            access: region.access,
            keys: Self::keys(index, slot.generation, region.key, region.access),
        })
    }

    /// Checks a local SGE (`addr`, `len`, `lkey`) used by a QP in `pd` that needs rights `need`
    /// (empty for a gather/send source, [`AccessFlags::LOCAL_WRITE`] for a scatter target or a
    /// READ / atomic result buffer).
    ///
    /// Checks in rxe's order (`rxe_mr.c lookup_mr`, then `mr_check_range`): key, PD, rights,
    /// bounds. Any failure means a local protection error ([`MrError::local_wc_status`]).
    ///
    /// A zero-length SGE is not checked at all and yields `Ok(None)`: rxe's `copy_data` returns
    /// before looking up the key when the length is 0, so applications may pass any L_Key with
    /// an empty buffer.
    pub fn check_local(
        &self,
        pd: PdId,
        lkey: LKey,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<MrGrant>, MrError> {
        if len == 0 {
            return Ok(None);
        }
        self.check(pd, lkey.0, KeyKind::Local, addr, len, need)
            .map(Some)
    }

    /// Checks a remote access (RETH or AtomicETH fields: `va`, `len`, `rkey`) arriving at a QP
    /// in `pd` that needs rights `need` ([`AccessFlags::REMOTE_WRITE`], `REMOTE_READ` or
    /// `REMOTE_ATOMIC`).
    ///
    /// Checks in rxe's order (`rxe_resp.c check_rkey`): the R_Key names a live region with a
    /// remote right, PD, rights, then bounds — computed without overflow, so `va + len` past
    /// `u64::MAX` is an [`MrError::OutOfBounds`], never a wrap.
    ///
    /// **Zero-length rule (IBTA C9-88):** an RDMA READ or WRITE whose DMA length is 0 does not
    /// validate the R_Key or the VA. For `len == 0` this returns `Ok(None)` without looking at
    /// `rkey`, `va` or the rights: the responder must accept the request and move no data. (Its
    /// separate check that the QP's access flags allow the operation still applies.)
    pub fn check_remote(
        &self,
        pd: PdId,
        rkey: RKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<MrGrant>, MrError> {
        if len == 0 {
            return Ok(None);
        }
        self.check_rkey(pd, None, rkey, va, len, need).map(Some)
    }

    /// [`MrTable::check_remote`] for a request arriving at QP `qpn`: an R_Key of a type 2
    /// memory window only grants access to the QP the window is bound to (IBA C10-71 ff.;
    /// rxe `rxe_lookup_mw`), which `check_remote` (no QP) never grants.
    pub fn check_remote_at(
        &self,
        pd: PdId,
        qpn: srdma_wire::Qpn,
        rkey: RKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<Option<MrGrant>, MrError> {
        if len == 0 {
            return Ok(None);
        }
        self.check_rkey(pd, Some(qpn), rkey, va, len, need)
            .map(Some)
    }

    /// [`MrTable::check_atomic`] for a request arriving at QP `qpn` (see
    /// [`MrTable::check_remote_at`]).
    pub fn check_atomic_at(
        &self,
        pd: PdId,
        qpn: srdma_wire::Qpn,
        rkey: RKey,
        va: u64,
    ) -> Result<MrGrant, MrError> {
        let grant = self.check_rkey(pd, Some(qpn), rkey, va, 8, AccessFlags::REMOTE_ATOMIC)?;
        if va % 8 != 0 {
            return Err(MrError::Misaligned { va });
        }
        Ok(grant)
    }

    /// An R_Key check: a window's (index from [`MW_INDEX_BASE`]) or a region's.
    fn check_rkey(
        &self,
        pd: PdId,
        qpn: Option<srdma_wire::Qpn>,
        rkey: RKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrGrant, MrError> {
        if mw::is_mw_key(rkey.0) {
            self.check_mw(pd, qpn, rkey, va, len, need)
        } else {
            self.check(pd, rkey.0, KeyKind::Remote, va, len, need)
        }
    }

    /// Checks the target of an atomic (CmpSwap / FetchAdd): 8 bytes at `va` under `rkey` with
    /// [`AccessFlags::REMOTE_ATOMIC`], then 8-byte alignment of `va` — the order of rxe, whose
    /// key check (`check_rkey`) precedes the alignment check (`rxe_mr_do_atomic_op`), so a bad
    /// key is a remote access error and a misaligned address an invalid request
    /// ([`MrError::remote_nak`]).
    pub fn check_atomic(&self, pd: PdId, rkey: RKey, va: u64) -> Result<MrGrant, MrError> {
        let grant = self.check_rkey(pd, None, rkey, va, 8, AccessFlags::REMOTE_ATOMIC)?;
        if va % 8 != 0 {
            return Err(MrError::Misaligned { va });
        }
        Ok(grant)
    }

    /// True when `handle` names the live registration of its slot.
    pub fn is_live(&self, handle: MrHandle) -> bool {
        self.slot(handle.index.0)
            .is_some_and(|s| s.region.is_some() && s.generation == handle.generation)
    }

    /// Confirms that the region `grant` was issued for is still registered, before data moves
    /// (e.g. when a retransmission or a replayed READ reads memory again). A deregistered
    /// region — whether or not its slot was reused — yields [`MrError::Stale`].
    pub fn revalidate(&self, grant: &MrGrant) -> Result<(), MrError> {
        if self.is_live(grant.handle) {
            Ok(())
        } else {
            Err(MrError::Stale {
                handle: grant.handle,
            })
        }
    }

    fn check(
        &self,
        pd: PdId,
        key: u32,
        kind: KeyKind,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrGrant, MrError> {
        let (index, slot, region) = self.lookup(key, kind).ok_or(MrError::InvalidKey { key })?;
        if region.pd != pd {
            return Err(MrError::PdMismatch {
                key,
                pd,
                region_pd: region.pd,
            });
        }
        if !region.access.contains(need) {
            return Err(MrError::AccessDenied {
                key,
                need,
                have: region.access,
            });
        }
        // [addr, addr+len) ⊆ [region.addr, region.addr+region.len), without computing either
        // end: offset = addr - region.addr must exist and leave room for len.
        let offset = addr
            .checked_sub(region.addr)
            .filter(|&off| off <= region.len && len <= region.len - off)
            .ok_or(MrError::OutOfBounds {
                key,
                addr,
                len,
                region_addr: region.addr,
                region_len: region.len,
            })?;
        Ok(MrGrant {
            handle: MrHandle {
                index,
                generation: slot.generation,
            },
            offset,
            len,
        })
    }

    /// The live region named by `key`: index in range, slot occupied, key byte equal, and for
    /// an R_Key a region with a remote right.
    fn lookup(&self, key: u32, kind: KeyKind) -> Option<(MrIndex, &Slot, &Region)> {
        let index = key >> 8;
        let slot = self.slot(index)?;
        let region = slot.region.as_ref()?;
        if region.key != key as u8 {
            return None;
        }
        if kind == KeyKind::Remote && !region.access.has_remote() {
            return None;
        }
        Some((MrIndex(index), slot, region))
    }

    fn slot(&self, index: u32) -> Option<&Slot> {
        let i = usize::try_from(index.checked_sub(1)?).ok()?;
        self.slots.get(i)
    }

    fn slot_mut(&mut self, index: u32) -> Option<&mut Slot> {
        let i = usize::try_from(index.checked_sub(1)?).ok()?;
        self.slots.get_mut(i)
    }

    /// The oldest freed index, else a fresh one.
    fn alloc_index(&mut self) -> Result<u32, MrError> {
        if let Some(index) = self.free.pop_front() {
            return Ok(index);
        }
        if self.slots.len() < self.max as usize {
            self.slots.push(Slot::default());
            return Ok(self.slots.len() as u32);
        }
        Err(MrError::TableFull { max: self.max })
    }

    fn keys(index: MrIndex, generation: u32, key: u8, access: AccessFlags) -> MrKeys {
        let lkey = index.0 << 8 | u32::from(key);
        MrKeys {
            lkey: LKey(lkey),
            rkey: access.has_remote().then_some(RKey(lkey)),
            handle: MrHandle { index, generation },
        }
    }
}
