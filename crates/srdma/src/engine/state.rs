//! What the rest of the crate does to a device's [`State`]: QPs, SRQs, memory regions and
//! windows, identifiers and counters, each through a method here, so that the state's fields
//! stay the engine's.

use std::sync::Arc;

use srdma_proto::{
    AccessFlags, LKey, MrError, MrInfo, MrKeys, MwError, MwInfo, MwType, PdId, RKey,
    Srq as ProtoSrq,
};
use srdma_wire::Qpn;

use super::{QpSlot, State};
use crate::memory::Region;
use crate::types::DeviceCounters;

/// The numbers a device gives out: QPNs in the range it owns, and identifiers of PDs, CQs
/// and SRQs (in the engine's `State`).
#[derive(Debug)]
pub(super) struct Ids {
    /// The QPN range this device owns: `qpn_base | n` (0 unless the port is shared; a shared
    /// port's slot k owns k << 16 | n).
    qpn_base: u32,
    /// The `n` the next QPN tries, 0x11 (rxe's first) and up, wrapping.
    next_qpn: u32,
    /// The identifier given out last (the first is 2).
    next_id: u32,
}

impl Ids {
    /// The numbers of a device in slot `slot` of its port (0: the port is its alone).
    ///
    /// rxe numbers QPs from 17 (0x11) up, wrapping; 0 and 1 are the special QPs. A kernel
    /// device outlives the processes that use it, so a new process's QPs get numbers not
    /// used just before; here each process opens its own device (and takes the slot of one
    /// that ended), so the first number is drawn at random: a kernel peer still holds the
    /// last connection of a QPN for its timewait (seconds) and rejects a REQ from the same
    /// QPN as stale (REJ reason 10), as tgtd on rxe did to a libiscsi run right after
    /// another. The draw stays below 0x10000 on an unshared port too: a QPN's upper bits
    /// name the slot wherever packets are steered or shared-memory links found (`QPN >>
    /// 16`).
    pub(super) fn new(slot: u8) -> Ids {
        Ids {
            qpn_base: u32::from(slot) << 16,
            next_qpn: (0x11 + crate::random::random_u64() % (0xFFFF - 0x11 + 1)) as u32,
            next_id: 1,
        }
    }
}

impl State {
    /// Takes QP `qpn` off the list of QPs whose packets a receive held back; true if it was
    /// on it.
    pub(crate) fn undefer(&mut self, qpn: u32) -> bool {
        match self.deferred.iter().position(|&q| q == qpn) {
            Some(i) => {
                self.deferred.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether a receive held back QP `qpn`'s packets (see `State::deferred`).
    pub(crate) fn is_deferred(&self, qpn: u32) -> bool {
        self.deferred.contains(&qpn)
    }

    /// A post may bring answers soon (at once from a QP of this device): the next
    /// application poll looks at the socket (see `timing::RX_REST`).
    pub(crate) fn expect_answers(&mut self) {
        self.timing.rest.expect_answers();
    }

    /// The slot of QP `qpn`.
    pub(crate) fn slot(&self, qpn: u32) -> Option<&QpSlot> {
        self.qps.get(&qpn)
    }

    /// The slot of QP `qpn`, to change.
    pub(crate) fn slot_mut(&mut self, qpn: u32) -> Option<&mut QpSlot> {
        self.qps.get_mut(&qpn)
    }

    /// Every QP's slot.
    pub(crate) fn slots(&self) -> impl Iterator<Item = &QpSlot> {
        self.qps.values()
    }

    /// Whether QP `qpn` exists.
    pub(crate) fn has_qp(&self, qpn: u32) -> bool {
        self.qps.contains_key(&qpn)
    }

    /// Adds QP `qpn` (created).
    pub(crate) fn add_qp(&mut self, qpn: u32, slot: QpSlot) {
        self.qps.insert(qpn, slot);
    }

    /// Forgets QP `qpn` (destroyed). Type 2 windows bound to it die with it: a later QP with
    /// the same number must not inherit them.
    pub(crate) fn remove_qp(&mut self, qpn: Qpn) {
        if let Some(slot) = self.qps.remove(&qpn.value()) {
            self.timers.disarm(qpn.value(), &slot);
            self.shares
                .update(slot.sharing, None, None, (slot.flight, 0));
        }
        self.mrs.unbind_qp_windows(qpn);
        self.xrc.qp_gone(qpn.value());
    }

    /// A free QP number of this device's range, `None` when every one is taken. Unshared:
    /// 0x11..=0xFFFFFE; a shared port's slot: its 64 Ki numbers (0x11..=0xFFFF).
    pub(crate) fn alloc_qpn(&mut self) -> Option<u32> {
        let ids = &mut self.ids;
        let last = if ids.qpn_base == 0 { 0xFF_FFFE } else { 0xFFFF };
        for _ in 0..0x1_0000 {
            let n = ids.next_qpn;
            ids.next_qpn = if n >= last { 0x11 } else { n + 1 };
            let qpn = ids.qpn_base | n;
            if !self.qps.contains_key(&qpn) {
                return Some(qpn);
            }
        }
        None
    }

    /// The slot of a shared port this device holds (0 when the port is its alone).
    pub(crate) fn port_slot(&self) -> u8 {
        (self.ids.qpn_base >> 16) as u8
    }

    /// A new identifier for a PD, CQ or SRQ, unique on the device.
    pub(crate) fn next_id(&mut self) -> u32 {
        self.ids.next_id += 1;
        self.ids.next_id
    }

    /// The device's receive/transmit statistics.
    pub(crate) fn counters(&self) -> DeviceCounters {
        self.counters
    }

    /// Adds SRQ `id` (created).
    pub(crate) fn add_srq(&mut self, id: u32, srq: ProtoSrq) {
        self.srqs.insert(id, srq);
    }

    /// SRQ `id`.
    pub(crate) fn srq(&self, id: u32) -> Option<&ProtoSrq> {
        self.srqs.get(&id)
    }

    /// SRQ `id`, to change.
    pub(crate) fn srq_mut(&mut self, id: u32) -> Option<&mut ProtoSrq> {
        self.srqs.get_mut(&id)
    }

    /// Forgets SRQ `id` (destroyed), an XRC SRQ's domain binding too.
    pub(crate) fn remove_srq(&mut self, id: u32) {
        self.srqs.remove(&id);
        self.xrc.srq_gone(id);
    }

    /// The XRC domains' SRQs and target QPs.
    pub(crate) fn xrc_mut(&mut self) -> &mut super::xrc::XrcState {
        &mut self.xrc
    }

    /// Registers `region` as a memory region of PD `pd`, addressed as `iova..iova + len`.
    pub(crate) fn register_mr(
        &mut self,
        pd: PdId,
        iova: u64,
        len: u64,
        access: AccessFlags,
        region: &Arc<Region>,
    ) -> Result<MrKeys, MrError> {
        let keys = self.mrs.register(pd, iova, len, access)?;
        self.mem.insert(keys.handle, Arc::clone(region));
        Ok(keys)
    }

    /// Changes the region with keys `keys` in place (`MrTable::reregister`): its memory is
    /// `region` from now on (the same as before when the range does not change).
    pub(crate) fn reregister_mr(
        &mut self,
        keys: &MrKeys,
        pd: Option<PdId>,
        range: Option<(u64, u64)>,
        access: Option<AccessFlags>,
        region: &Arc<Region>,
    ) -> Result<MrInfo, MrError> {
        let info = self.mrs.reregister(keys.lkey, pd, range, access)?;
        self.mem.remove(keys.handle);
        self.mem.insert(info.keys.handle, Arc::clone(region));
        Ok(info)
    }

    /// Deregisters the region with keys `keys`; windows still bound to it lose their binding.
    pub(crate) fn deregister_mr(&mut self, keys: &MrKeys) {
        let _ = self.mrs.deregister_unbinding(keys.lkey);
        self.mem.remove(keys.handle);
    }

    /// Allocates a memory window of type `ty` in PD `pd`.
    pub(crate) fn alloc_mw(&mut self, pd: PdId, ty: MwType) -> Result<RKey, MwError> {
        self.mrs.alloc_mw(pd, ty)
    }

    /// The window allocated with `rkey`.
    pub(crate) fn query_mw(&self, rkey: RKey) -> Option<MwInfo> {
        self.mrs.query_mw(rkey)
    }

    /// Frees the window allocated with `rkey`.
    pub(crate) fn dealloc_mw(&mut self, rkey: RKey) -> Result<MwInfo, MwError> {
        self.mrs.dealloc_mw(rkey)
    }

    /// How many windows are bound to the region `lkey`.
    pub(crate) fn windows_bound(&self, lkey: LKey) -> usize {
        self.mrs.windows_bound(lkey)
    }

    /// Whether some multicast group has QPs of this device attached.
    pub(crate) fn has_groups(&self) -> bool {
        self.rx.has_groups()
    }
}
