//! Work requests: what an application posts to a send or receive queue.

use srdma_wire::Qpn;

use crate::mr::{LKey, MwBind, RKey};
use crate::qp::AhAttr;
use crate::wc::SendFlags;

/// One scatter/gather element: `length` bytes at `addr` of the region `lkey` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Address in the region's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: LKey,
}

/// Number of SGEs a work request holds without a heap allocation.
const INLINE_SGES: usize = 4;

/// A scatter/gather list: up to four entries stored inline (no allocation per work request in
/// the common case), more on the heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SgeList {
    inline: [Sge; INLINE_SGES],
    len: u8,
    heap: Vec<Sge>,
}

impl SgeList {
    /// An empty list.
    pub const fn new() -> Self {
        SgeList {
            inline: [Sge {
                addr: 0,
                length: 0,
                lkey: LKey(0),
            }; INLINE_SGES],
            len: 0,
            heap: Vec::new(),
        }
    }

    /// A list of one element.
    pub fn one(sge: Sge) -> Self {
        let mut l = Self::new();
        l.push(sge);
        l
    }

    /// Appends an element.
    pub fn push(&mut self, sge: Sge) {
        if self.heap.is_empty() && usize::from(self.len) < INLINE_SGES {
            self.inline[usize::from(self.len)] = sge;
            self.len += 1;
        } else {
            if self.heap.is_empty() {
                self.heap
                    .extend_from_slice(&self.inline[..usize::from(self.len)]);
            }
            self.heap.push(sge);
        }
    }

    /// The elements.
    pub fn as_slice(&self) -> &[Sge] {
        if self.heap.is_empty() {
            &self.inline[..usize::from(self.len)]
        } else {
            &self.heap
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total bytes, or `None` if it overflows 32 bits.
    pub fn total_len(&self) -> Option<u32> {
        self.as_slice()
            .iter()
            .try_fold(0u32, |acc, s| acc.checked_add(s.length))
    }
}

impl Default for SgeList {
    fn default() -> Self {
        SgeList::new()
    }
}

impl FromIterator<Sge> for SgeList {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> Self {
        let mut l = SgeList::new();
        for s in iter {
            l.push(s);
        }
        l
    }
}

/// Where a UD send goes (`ibv_send_wr.wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Address vector of the destination.
    pub ah: AhAttr,
    /// Destination QP.
    pub remote_qpn: Qpn,
    /// Destination Q_Key; with bit 31 set the QP's own Q_Key is sent instead (IBA C10-15).
    pub remote_qkey: u32,
}

/// The operation of a send work request, with its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm {
        /// Immediate data (delivered verbatim to the receiver's completion).
        imm: u32,
    },
    /// RDMA WRITE of the SGEs to `remote_addr` of `rkey`.
    Write {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// RDMA WRITE with immediate data: consumes a receive WQE at the target.
    WriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ of `remote_addr` of `rkey` into the SGEs.
    Read {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// Atomic compare-and-swap of the 8-byte word at `remote_addr`; the original value lands
    /// in the (8-byte) SGE.
    CompareSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Value to compare with.
        compare: u64,
        /// Value to store when equal.
        swap: u64,
    },
    /// Atomic fetch-and-add on the 8-byte word at `remote_addr`.
    FetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Value to add.
        add: u64,
    },
    /// SEND that also invalidates the remote R_Key `rkey` at the target (RC only; the
    /// receiver's completion carries `IBV_WC_WITH_INV`).
    SendWithInv {
        /// The R_Key to invalidate (`ibv_send_wr.invalidate_rkey`).
        rkey: RKey,
    },
    /// Local invalidate of `rkey` (a type 2 memory window bound to this QP): no packet, a
    /// completion once every earlier work request has completed.
    LocalInv {
        /// The R_Key to invalidate.
        rkey: RKey,
    },
    /// Bind a memory window (`IBV_WR_BIND_MW`, and `ibv_bind_mw` for type 1): no packet.
    BindMw(MwBind),
    /// ATOMIC WRITE (IBTA 1.5, RC only): stores the 8 bytes `data` at `remote_addr` in one
    /// indivisible access; the data travel in the request, not in SGEs.
    AtomicWrite {
        /// Remote virtual address (8-byte aligned, checked by the responder).
        remote_addr: u64,
        /// Remote key (needs REMOTE_WRITE).
        rkey: RKey,
        /// The bytes stored, in memory order.
        data: [u8; 8],
    },
}

impl SendOp {
    /// The `ibv_wr_opcode` of the operation.
    pub const fn wr_opcode(&self) -> crate::wc::WrOpcode {
        use crate::wc::WrOpcode;
        match self {
            SendOp::Send => WrOpcode::Send,
            SendOp::SendWithImm { .. } => WrOpcode::SendWithImm,
            SendOp::Write { .. } => WrOpcode::RdmaWrite,
            SendOp::WriteWithImm { .. } => WrOpcode::RdmaWriteWithImm,
            SendOp::Read { .. } => WrOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WrOpcode::AtomicCmpAndSwp,
            SendOp::FetchAdd { .. } => WrOpcode::AtomicFetchAndAdd,
            SendOp::SendWithInv { .. } => WrOpcode::SendWithInv,
            SendOp::LocalInv { .. } => WrOpcode::LocalInv,
            SendOp::BindMw(_) => WrOpcode::BindMw,
            SendOp::AtomicWrite { .. } => WrOpcode::AtomicWrite,
        }
    }

    /// A local operation (bind, local invalidate): executed by the requester without sending
    /// anything (rxe `WR_LOCAL_OP_MASK`).
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv { .. } | SendOp::BindMw(_))
    }

    /// A SEND of any form (plain, with immediate, with invalidate).
    pub const fn is_send(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
        )
    }

    /// READ or an atomic: needs a responder resource and counts against `max_rd_atomic`.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// An atomic operation.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Immediate data, if any.
    pub const fn imm(&self) -> Option<u32> {
        match *self {
            SendOp::SendWithImm { imm } | SendOp::WriteWithImm { imm, .. } => Some(imm),
            _ => None,
        }
    }
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data: gathered for SEND/WRITE, scattered into for READ and atomics.
    pub sges: SgeList,
    /// SIGNALED, SOLICITED, FENCE, INLINE.
    pub flags: SendFlags,
    /// With INLINE: the data itself (copied at post time; the SGEs are ignored).
    pub inline_data: Option<Vec<u8>>,
    /// UD only: the destination.
    pub ud: Option<UdDest>,
    /// XRC initiator only: the XRC SRQ at the target (`qp_type.xrc.remote_srqn`).
    pub xrc_srqn: Option<u32>,
}

impl SendWr {
    /// A signaled request of `op` over `sges`.
    pub fn new(wr_id: u64, op: SendOp, sges: SgeList) -> Self {
        SendWr {
            wr_id,
            op,
            sges,
            flags: SendFlags::SIGNALED,
            inline_data: None,
            ud: None,
            xrc_srqn: None,
        }
    }

    /// Sets the flags.
    #[must_use]
    pub fn with_flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Makes it a UD send to `dest`.
    #[must_use]
    pub fn to_ud(mut self, dest: UdDest) -> Self {
        self.ud = Some(dest);
        self
    }

    /// Makes it an inline send of `data`.
    #[must_use]
    pub fn with_inline(mut self, data: Vec<u8>) -> Self {
        self.inline_data = Some(data);
        self.flags |= SendFlags::INLINE;
        self
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data lands.
    pub sges: SgeList,
}

/// Why a work request was refused at post time (`ibv_post_send` / `ibv_post_recv` errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The QP's state does not accept this queue's work requests (e.g. RESET, or INIT for sends).
    #[error("QP {qpn} is in state {state:?}, which does not accept posted {queue} work requests")]
    InvalidState {
        /// The QP.
        qpn: Qpn,
        /// Its state.
        state: crate::qp::QpState,
        /// "send" or "receive".
        queue: &'static str,
    },
    /// The queue already holds its maximum number of work requests.
    #[error("{queue} queue full ({max} work requests)")]
    QueueFull {
        /// "send", "receive" or "shared receive".
        queue: &'static str,
        /// Its depth.
        max: u32,
    },
    /// More SGEs than the QP's capability.
    #[error("{num} SGEs exceed max_sge {max}")]
    TooManySges {
        /// SGEs given.
        num: usize,
        /// Capability.
        max: u32,
    },
    /// Inline data longer than max_inline_data.
    #[error("{len} bytes of inline data exceed max_inline_data {max}")]
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// Capability.
        max: u32,
    },
    /// The operation does not exist on this QP type (READ or atomics on UC or UD, RDMA on UD).
    #[error("{op:?} is not supported on a {qp_type} QP")]
    UnsupportedOp {
        /// The operation.
        op: crate::wc::WrOpcode,
        /// The QP type name.
        qp_type: &'static str,
    },
    /// A UD send without a destination, or a connected QP's send with one.
    #[error("UD sends need a destination (and only UD sends take one)")]
    BadDestination,
    /// The message is longer than 2^31 bytes, or the SGE lengths overflow.
    #[error("message length exceeds 2^31 bytes")]
    MessageTooLong,
    /// An atomic needs exactly one 8-byte SGE and an 8-byte aligned remote address.
    #[error("atomic operations need one 8-byte SGE and an 8-byte aligned remote address")]
    BadAtomic,
    /// The QP receives through a shared receive queue: post there.
    #[error("QP uses a shared receive queue; post receives to the SRQ")]
    UsesSrq,
}
