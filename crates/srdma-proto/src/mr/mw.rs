//! Memory windows (IBA 10.6.7; what rxe's `rxe_mw.c` implements): a window is allocated in a
//! protection domain, then bound to part of a region registered with
//! [`AccessFlags::MW_BIND`]; while bound, its own R_Key and rights grant remote access to
//! that part only.
//!
//! - Type 1 windows are bound by `ibv_bind_mw` (a bind work request on any QP of the PD) and
//!   unbound by binding them again with length 0; they cannot be invalidated.
//! - Type 2 windows (2B, as rxe) are bound by an `IBV_WR_BIND_MW` work request, which
//!   associates them with that QP: only requests arriving at that QP may use the R_Key, and
//!   only that QP invalidates them (`IBV_WR_LOCAL_INV`, or a peer's SEND with invalidate).
//!
//! Every bind changes the key byte of the window's R_Key to the one the consumer chose (the
//! low 8 bits of the new R_Key, as `ibv_inc_rkey` makes it), so the previous key stops
//! working.

use srdma_wire::Qpn;

use super::{AccessFlags, LKey, MrError, MrGrant, MrHandle, MrTable, PdId, RKey};

/// The first table index of a memory window: R_Keys with `rkey >> 8` at or above it name
/// windows, below it regions (rxe keeps MRs and MWs in separate index ranges too).
pub const MW_INDEX_BASE: u32 = 0x0080_0000;

/// The most windows a table holds: `max_mw` of the rxe device in `../shared/rxe-lab`
/// (kernel 6.1), the same as its `max_mr`.
pub const MAX_MW: u32 = 524_287;

/// True when `key` names a memory window rather than a region.
#[inline]
pub(super) const fn is_mw_key(key: u32) -> bool {
    key >> 8 >= MW_INDEX_BASE
}

/// The type of a memory window: `enum ibv_mw_type`, same numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MwType {
    /// Bound by `ibv_bind_mw`, not associated with a QP, never invalidated.
    Type1 = 1,
    /// Bound by a bind work request, associated with that QP, invalidated by it.
    Type2 = 2,
}

impl MwType {
    /// The type numbered `v` (`IBV_MW_TYPE_1` / `IBV_MW_TYPE_2`), else `None` (EINVAL).
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(MwType::Type1),
            2 => Some(MwType::Type2),
            _ => None,
        }
    }
}

/// The state of a window (IBA 10.6.7.1; rxe `enum rxe_mw_state`, without INVALID: a
/// deallocated window is gone from the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwState {
    /// A type 2 window that is not bound: it may be bound.
    Free,
    /// A type 1 window (always, bound or not), or a bound type 2 window.
    Valid,
}

/// A bind request (`ibv_send_wr.bind_mw` / `ibv_wr_bind_mw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// The window's current R_Key.
    pub mw_rkey: RKey,
    /// The R_Key to give the window: only its key byte (low 8 bits) is used.
    pub rkey: RKey,
    /// The L_Key of the region to bind to (ignored when `len` is 0).
    pub mr_lkey: LKey,
    /// First byte of the window, in the region's address space.
    pub addr: u64,
    /// Length; 0 unbinds a type 1 window.
    pub len: u64,
    /// The window's rights (`mw_access_flags`).
    pub access: AccessFlags,
}

/// A window, as [`MrTable::query_mw`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwInfo {
    /// Its protection domain.
    pub pd: PdId,
    /// Type 1 or 2.
    pub mw_type: MwType,
    /// Its current R_Key.
    pub rkey: RKey,
    /// Free or valid.
    pub state: MwState,
    /// The region it is bound to, if bound with a non-zero length.
    pub mr: Option<MrHandle>,
    /// First byte it grants.
    pub addr: u64,
    /// Bytes it grants.
    pub len: u64,
    /// Its rights.
    pub access: AccessFlags,
    /// Type 2: the QP it is bound to.
    pub qpn: Option<Qpn>,
}

/// Why an allocation, bind or invalidation of a window failed. A failed bind completes with
/// `IBV_WC_MW_BIND_ERR`, a failed local invalidate with `IBV_WC_LOC_QP_OP_ERR` (rxe
/// `rxe_do_local_ops`), a failed remote invalidate is NAKed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MwError {
    /// Not `IBV_MW_TYPE_1` or `IBV_MW_TYPE_2` (EINVAL, as rxe).
    #[error("memory window type {ty} does not exist")]
    InvalidType {
        /// The type as given.
        ty: u32,
    },
    /// Every window slot is in use.
    #[error("memory window table full ({max} windows)")]
    TableFull {
        /// Capacity.
        max: u32,
    },
    /// No window has this R_Key (unknown index, or a key byte a bind has since replaced).
    #[error("no memory window with key {key:#010x}")]
    InvalidKey {
        /// The key as given.
        key: u32,
    },
    /// The key names a region, and srdma has no fast-registration regions to invalidate
    /// (rxe `rxe_invalidate_mr` refuses user regions too).
    #[error("key {key:#010x} is not a memory window")]
    NotAWindow {
        /// The key as given.
        key: u32,
    },
    /// Type 1 windows are never invalidated (IBA o10-37.2.26).
    #[error("key {key:#010x} names a type 1 window, which cannot be invalidated")]
    Type1Invalidate {
        /// The key as given.
        key: u32,
    },
    /// The window is not in the state the operation needs (a type 2 window must be free to
    /// bind and valid to invalidate).
    #[error("window {key:#010x} is {state:?}")]
    WrongState {
        /// The key as given.
        key: u32,
        /// Its state.
        state: MwState,
    },
    /// The QP, window and region are not all in one protection domain (C10-72).
    #[error("window {key:#010x}: protection domains differ")]
    PdMismatch {
        /// The window's key.
        key: u32,
    },
    /// A type 2 window used by a QP other than the one it is bound to.
    #[error("window {key:#010x} is bound to another QP")]
    QpMismatch {
        /// The window's key.
        key: u32,
    },
    /// The region to bind to does not exist (bad L_Key).
    #[error("no memory region with key {key:#010x} to bind to")]
    NoRegion {
        /// The L_Key as given.
        key: u32,
    },
    /// The region was not registered with `IBV_ACCESS_MW_BIND` (C10-73).
    #[error("region {key:#010x} does not allow window binding")]
    NotBindable {
        /// The region's L_Key.
        key: u32,
    },
    /// A window with remote write or atomic rights on a region without local write (C10-74).
    #[error("window rights {access} need a region with local write")]
    NeedsLocalWrite {
        /// The rights requested.
        access: AccessFlags,
    },
    /// The window does not lie inside the region (C10-75).
    #[error("window {addr:#x}+{len:#x} is outside its region")]
    OutOfRegion {
        /// Requested start.
        addr: u64,
        /// Requested length.
        len: u64,
    },
    /// A type 2 window bound with length 0 or no region (o10-37.2.40).
    #[error("a type 2 window cannot be bound with length 0")]
    ZeroLength,
    /// Rights srdma does not bind: zero-based windows, unknown bits.
    #[error("window rights {access} are not supported")]
    Unsupported {
        /// The rights requested.
        access: AccessFlags,
    },
}

#[derive(Debug, Clone, Copy)]
struct Binding {
    mr: MrHandle,
    /// The region's own start, to turn window addresses into region offsets.
    mr_addr: u64,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    pd: PdId,
    ty: MwType,
    rkey: u32,
    state: MwState,
    binding: Option<Binding>,
    addr: u64,
    len: u64,
    access: AccessFlags,
    qpn: Option<Qpn>,
}

impl Window {
    fn unbind(&mut self) {
        self.binding = None;
        self.addr = 0;
        self.len = 0;
        self.access = AccessFlags::empty();
        self.qpn = None;
        if self.ty == MwType::Type2 {
            self.state = MwState::Free;
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Slot {
    last_key: Option<u8>,
    window: Option<Window>,
}

/// The windows of one [`MrTable`].
#[derive(Debug, Clone, Default)]
pub(super) struct Windows {
    /// `slots[i]` is index `MW_INDEX_BASE + i`.
    slots: Vec<Slot>,
    /// Freed slot numbers, oldest first.
    free: std::collections::VecDeque<u32>,
    live: usize,
}

impl Windows {
    /// How many windows are bound to the region `mr`.
    pub(super) fn bound_to(&self, mr: MrHandle) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.window.as_ref())
            .filter(|w| w.binding.is_some_and(|b| b.mr == mr))
            .count()
    }

    /// Unbinds every window bound to `mr`.
    pub(super) fn unbind_all(&mut self, mr: MrHandle) {
        for w in self.slots.iter_mut().filter_map(|s| s.window.as_mut()) {
            if w.binding.is_some_and(|b| b.mr == mr) {
                w.unbind();
            }
        }
    }

    fn slot(&self, key: u32) -> Option<&Slot> {
        let i = (key >> 8).checked_sub(MW_INDEX_BASE)?;
        self.slots.get(usize::try_from(i).ok()?)
    }

    fn slot_mut(&mut self, key: u32) -> Option<&mut Slot> {
        let i = (key >> 8).checked_sub(MW_INDEX_BASE)?;
        self.slots.get_mut(usize::try_from(i).ok()?)
    }

    /// The window with exactly this R_Key.
    fn get(&self, key: u32) -> Option<&Window> {
        self.slot(key)?.window.as_ref().filter(|w| w.rkey == key)
    }

    fn get_mut(&mut self, key: u32) -> Option<&mut Window> {
        self.slot_mut(key)?
            .window
            .as_mut()
            .filter(|w| w.rkey == key)
    }
}

impl MrTable {
    /// Allocates a memory window of type `ty` in `pd` (`ibv_alloc_mw`) and returns its R_Key.
    /// A type 1 window starts valid and unbound, a type 2 window free (rxe `rxe_alloc_mw`).
    pub fn alloc_mw(&mut self, pd: PdId, ty: MwType) -> Result<RKey, MwError> {
        let n = match self.mws.free.pop_front() {
            Some(n) => n,
            None if (self.mws.slots.len() as u32) < MAX_MW => {
                self.mws.slots.push(Slot::default());
                self.mws.slots.len() as u32 - 1
            }
            None => return Err(MwError::TableFull { max: MAX_MW }),
        };
        let slot = self
            .mws
            .slots
            .get_mut(n as usize)
            .ok_or(MwError::TableFull { max: MAX_MW })?;
        let key = self.rng.next_key_byte(slot.last_key);
        slot.last_key = Some(key);
        let rkey = (MW_INDEX_BASE + n) << 8 | u32::from(key);
        slot.window = Some(Window {
            pd,
            ty,
            rkey,
            state: match ty {
                MwType::Type1 => MwState::Valid,
                MwType::Type2 => MwState::Free,
            },
            binding: None,
            addr: 0,
            len: 0,
            access: AccessFlags::empty(),
            qpn: None,
        });
        self.mws.live += 1;
        Ok(RKey(rkey))
    }

    /// Deallocates the window whose index `rkey` names, whatever its key byte now is
    /// (`ibv_dealloc_mw`; binds change the byte). Its R_Key stops working at once.
    pub fn dealloc_mw(&mut self, rkey: RKey) -> Result<MwInfo, MwError> {
        let info = self
            .mws
            .slot(rkey.0)
            .and_then(|s| s.window.as_ref())
            .map(info)
            .ok_or(MwError::InvalidKey { key: rkey.0 })?;
        if let Some(slot) = self.mws.slot_mut(rkey.0) {
            if let Some(w) = slot.window.take() {
                slot.last_key = Some(w.rkey as u8);
            }
        }
        self.mws.free.push_back((rkey.0 >> 8) - MW_INDEX_BASE);
        self.mws.live -= 1;
        Ok(info)
    }

    /// The window whose index `rkey` names (any key byte), if allocated.
    pub fn query_mw(&self, rkey: RKey) -> Option<MwInfo> {
        self.mws.slot(rkey.0)?.window.as_ref().map(info)
    }

    /// The number of allocated windows.
    pub fn mw_count(&self) -> usize {
        self.mws.live
    }

    /// The number of windows bound to the region with L_Key `lkey` (0 for an unknown key).
    pub fn windows_bound(&self, lkey: LKey) -> usize {
        self.query(lkey)
            .map_or(0, |i| self.mws.bound_to(i.keys.handle))
    }

    /// Executes a bind work request posted on QP `qpn` of protection domain `qp_pd` and
    /// returns the window's new R_Key. The checks are rxe's (`rxe_bind_mw`,
    /// `rxe_check_bind_mw`), plus the IBTA rule that the region is in the window's PD.
    pub fn bind_mw(&mut self, qp_pd: PdId, qpn: Qpn, b: &MwBind) -> Result<RKey, MwError> {
        let key = b.mw_rkey.0;
        let w = *self.mws.get(key).ok_or(MwError::InvalidKey { key })?;
        let mr = if b.len > 0 {
            let info = self
                .query(b.mr_lkey)
                .ok_or(MwError::NoRegion { key: b.mr_lkey.0 })?;
            Some(info)
        } else {
            None
        };
        let supported = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND;
        if !supported.contains(b.access) {
            return Err(MwError::Unsupported { access: b.access });
        }
        match w.ty {
            MwType::Type1 => {
                if w.state != MwState::Valid {
                    return Err(MwError::WrongState {
                        key,
                        state: w.state,
                    });
                }
            }
            MwType::Type2 => {
                if w.state != MwState::Free {
                    return Err(MwError::WrongState {
                        key,
                        state: w.state,
                    });
                }
                if qp_pd != w.pd {
                    return Err(MwError::PdMismatch { key });
                }
                if mr.is_none() {
                    return Err(MwError::ZeroLength);
                }
            }
        }
        if let Some(mr) = &mr {
            if mr.pd != w.pd {
                return Err(MwError::PdMismatch { key });
            }
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(MwError::NotBindable { key: b.mr_lkey.0 });
            }
            if b.access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !mr.access.contains(AccessFlags::LOCAL_WRITE)
            {
                return Err(MwError::NeedsLocalWrite { access: b.access });
            }
            let inside = b
                .addr
                .checked_sub(mr.addr)
                .is_some_and(|off| off <= mr.len && b.len <= mr.len - off);
            if !inside {
                return Err(MwError::OutOfRegion {
                    addr: b.addr,
                    len: b.len,
                });
            }
        }
        let w = self.mws.get_mut(key).ok_or(MwError::InvalidKey { key })?;
        w.rkey = (w.rkey & !0xFF) | (b.rkey.0 & 0xFF);
        w.state = MwState::Valid;
        w.access = b.access;
        w.addr = b.addr;
        w.len = b.len;
        w.binding = mr.map(|m| Binding {
            mr: m.keys.handle,
            mr_addr: m.addr,
        });
        w.qpn = (w.ty == MwType::Type2).then_some(qpn);
        let rkey = w.rkey;
        if let Some(slot) = self.mws.slot_mut(rkey) {
            slot.last_key = Some(rkey as u8);
        }
        Ok(RKey(rkey))
    }

    /// Invalidates the R_Key `rkey` for QP `qpn`: an `IBV_WR_LOCAL_INV` posted on it, or a
    /// SEND with invalidate arriving at it. Only a valid type 2 window bound to that QP can
    /// be invalidated; it returns to the free state and its R_Key grants nothing (rxe
    /// `rxe_invalidate_mw`; region keys fail as rxe's `rxe_invalidate_mr` fails for
    /// regions that are not fast-registered, which srdma does not have).
    pub fn invalidate_rkey(&mut self, qpn: Qpn, rkey: RKey) -> Result<(), MwError> {
        let key = rkey.0;
        if !is_mw_key(key) {
            return Err(MwError::NotAWindow { key });
        }
        let w = self.mws.get_mut(key).ok_or(MwError::InvalidKey { key })?;
        if w.ty == MwType::Type1 {
            return Err(MwError::Type1Invalidate { key });
        }
        if w.state != MwState::Valid {
            return Err(MwError::WrongState {
                key,
                state: w.state,
            });
        }
        if w.qpn != Some(qpn) {
            return Err(MwError::QpMismatch { key });
        }
        w.unbind();
        Ok(())
    }

    /// Returns every type 2 window bound to QP `qpn` to the free state: the QP is being
    /// destroyed, and its number may be given to another QP later.
    pub fn unbind_qp_windows(&mut self, qpn: Qpn) {
        for w in self.mws.slots.iter_mut().filter_map(|s| s.window.as_mut()) {
            if w.ty == MwType::Type2 && w.qpn == Some(qpn) {
                w.unbind();
            }
        }
    }

    /// The remote-access check of an R_Key that names a window (rxe `rxe_lookup_mw`, then the
    /// range, here against the window): same key, a QP of the window's PD (and for type 2 the
    /// QP it is bound to), bound with a non-zero length, rights, bounds; the grant is on the
    /// region behind it.
    pub(super) fn check_mw(
        &self,
        pd: PdId,
        qpn: Option<Qpn>,
        rkey: RKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrGrant, MrError> {
        let key = rkey.0;
        let w = self.mws.get(key).ok_or(MrError::InvalidKey { key })?;
        if w.pd != pd {
            return Err(MrError::PdMismatch {
                key,
                pd,
                region_pd: w.pd,
            });
        }
        let qp_ok = w.ty == MwType::Type1 || (qpn.is_some() && w.qpn == qpn);
        let Some(b) = w.binding.filter(|_| qp_ok && w.state == MwState::Valid) else {
            return Err(MrError::InvalidKey { key });
        };
        if !w.access.contains(need) {
            return Err(MrError::AccessDenied {
                key,
                need,
                have: w.access,
            });
        }
        let in_window = va
            .checked_sub(w.addr)
            .is_some_and(|off| off <= w.len && len <= w.len - off);
        if !in_window {
            return Err(MrError::OutOfBounds {
                key,
                addr: va,
                len,
                region_addr: w.addr,
                region_len: w.len,
            });
        }
        if !self.is_live(b.mr) {
            return Err(MrError::Stale { handle: b.mr });
        }
        // The bind kept the window inside the region; checked anyway, never a wrap.
        let offset = va.checked_sub(b.mr_addr).ok_or(MrError::OutOfBounds {
            key,
            addr: va,
            len,
            region_addr: w.addr,
            region_len: w.len,
        })?;
        Ok(MrGrant {
            handle: b.mr,
            offset,
            len,
        })
    }
}

fn info(w: &Window) -> MwInfo {
    MwInfo {
        pd: w.pd,
        mw_type: w.ty,
        rkey: RKey(w.rkey),
        state: w.state,
        mr: w.binding.map(|b| b.mr),
        addr: w.addr,
        len: w.len,
        access: w.access,
        qpn: w.qpn,
    }
}
