//! The completion model: work completions (`ibv_wc`) and the enums around them, numbered
//! exactly as rdma-core's `libibverbs/verbs.h` so a value can cross into C unchanged.
//!
//! Data-path failures reach the application as a [`WcStatus`] in a [`Wc`], never as a panic
//! or a Rust error: that is the verbs contract the requester, responder and completer follow.

use srdma_wire::Qpn;

use crate::flags::bit_flags;
use crate::mr::RKey;

/// The status of a work completion: `enum ibv_wc_status`, same numbers.
///
/// The text of [`WcStatus::name`] is `ibv_wc_status_str()`'s (rdma-core
/// `libibverbs/enum_strs.c`), so logs read the same as with rdma-core tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum WcStatus {
    /// The operation completed successfully.
    #[default]
    Success = 0,
    /// Local length error: a message exceeds the receive buffer or the port's max message size.
    LocLenErr = 1,
    /// Local QP operation error: an internal QP consistency error (e.g. a malformed WQE).
    LocQpOpErr = 2,
    /// Local EE context operation error (RD only; never produced).
    LocEecOpErr = 3,
    /// Local protection error: a local SGE's L_Key, PD, bounds or rights are wrong.
    LocProtErr = 4,
    /// Flushed: the QP entered ERR before this work request was processed.
    WrFlushErr = 5,
    /// Memory window bind error.
    MwBindErr = 6,
    /// Bad response: an unexpected transport opcode was returned by the responder.
    BadRespErr = 7,
    /// Local access error: a protection error on local data in an incoming RDMA operation.
    LocAccessErr = 8,
    /// Remote invalid request: the responder NAKed with "invalid request" (AETH NAK code 1).
    RemInvReqErr = 9,
    /// Remote access error: the responder NAKed with "remote access error" (NAK code 2).
    RemAccessErr = 10,
    /// Remote operation error: the responder NAKed with "remote operational error" (NAK code 3).
    RemOpErr = 11,
    /// Transport retry counter exceeded: no ACK within `timeout` after `retry_cnt` retries.
    RetryExcErr = 12,
    /// RNR retry counter exceeded: the responder kept answering RNR NAK after `rnr_retry`.
    RnrRetryExcErr = 13,
    /// Local RDD violation (RD only; never produced).
    LocRddViolErr = 14,
    /// Remote invalid RD request (RD only; never produced).
    RemInvRdReqErr = 15,
    /// Remote aborted error.
    RemAbortErr = 16,
    /// Invalid EE context number (RD only; never produced).
    InvEecnErr = 17,
    /// Invalid EE context state (RD only; never produced).
    InvEecStateErr = 18,
    /// Fatal error.
    FatalErr = 19,
    /// Response timeout error.
    RespTimeoutErr = 20,
    /// General error: none of the above.
    GeneralErr = 21,
    /// Tag-matching error (never produced: srdma has no tag matching).
    TmErr = 22,
    /// Tag-matching rendezvous incomplete (never produced).
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// Every status in numeric order.
    pub const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];

    /// The `ibv_wc_status` number.
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The status with number `v`, or `None` if rdma-core defines none.
    pub const fn from_u32(v: u32) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// True for [`WcStatus::Success`].
    #[inline]
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }

    /// The text `ibv_wc_status_str()` prints, e.g. `"transport retry counter exceeded"`.
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a completed work request did: `enum ibv_wc_opcode`, same numbers.
///
/// Receive-side opcodes have bit 7 set (`IBV_WC_RECV = 1 << 7`), as in verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND (with or without immediate or invalidate) completed.
    Send = 0,
    /// An RDMA WRITE (with or without immediate) completed.
    RdmaWrite = 1,
    /// An RDMA READ completed.
    RdmaRead = 2,
    /// An atomic compare-and-swap completed.
    CompSwap = 3,
    /// An atomic fetch-and-add completed.
    FetchAdd = 4,
    /// A memory window bind completed.
    BindMw = 5,
    /// A local invalidate completed.
    LocalInv = 6,
    /// A TSO send completed (raw packet QPs only).
    Tso = 7,
    /// A FLUSH completed (IBTA 1.5).
    Flush = 8,
    /// An ATOMIC WRITE completed (IBTA 1.5).
    AtomicWrite = 9,
    /// A receive WQE consumed by an incoming SEND.
    Recv = 128,
    /// A receive WQE consumed by an incoming RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// The `ibv_wc_opcode` number.
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The opcode with number `v`, or `None` if it is not one listed here.
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            7 => WcOpcode::Tso,
            8 => WcOpcode::Flush,
            9 => WcOpcode::AtomicWrite,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => return None,
        })
    }

    /// True for completions of receive WQEs (`opcode & IBV_WC_RECV`).
    #[inline]
    pub const fn is_recv(self) -> bool {
        self as u32 & 128 != 0
    }
}

/// The operation of a send work request: `enum ibv_wr_opcode`, same numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WrOpcode {
    /// RDMA WRITE.
    RdmaWrite = 0,
    /// RDMA WRITE with immediate data (consumes a receive WQE at the target).
    RdmaWriteWithImm = 1,
    /// SEND.
    Send = 2,
    /// SEND with immediate data.
    SendWithImm = 3,
    /// RDMA READ.
    RdmaRead = 4,
    /// Atomic compare-and-swap on a remote 8-byte word.
    AtomicCmpAndSwp = 5,
    /// Atomic fetch-and-add on a remote 8-byte word.
    AtomicFetchAndAdd = 6,
    /// Local invalidate of an L_Key/R_Key.
    LocalInv = 7,
    /// Bind a memory window.
    BindMw = 8,
    /// SEND with invalidate of a remote R_Key.
    SendWithInv = 9,
    /// TCP segmentation offload (raw packet QPs only).
    Tso = 10,
    /// Driver-specific operation.
    Driver1 = 11,
    /// FLUSH (IBTA 1.5).
    Flush = 14,
    /// ATOMIC WRITE (IBTA 1.5).
    AtomicWrite = 15,
}

impl WrOpcode {
    /// The `ibv_wr_opcode` number.
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The opcode with number `v`, or `None` if rdma-core defines none.
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => WrOpcode::RdmaWrite,
            1 => WrOpcode::RdmaWriteWithImm,
            2 => WrOpcode::Send,
            3 => WrOpcode::SendWithImm,
            4 => WrOpcode::RdmaRead,
            5 => WrOpcode::AtomicCmpAndSwp,
            6 => WrOpcode::AtomicFetchAndAdd,
            7 => WrOpcode::LocalInv,
            8 => WrOpcode::BindMw,
            9 => WrOpcode::SendWithInv,
            10 => WrOpcode::Tso,
            11 => WrOpcode::Driver1,
            14 => WrOpcode::Flush,
            15 => WrOpcode::AtomicWrite,
            _ => return None,
        })
    }

    /// The opcode the send-side completion reports, as rxe's `wr_to_wc_opcode`
    /// (`rxe_comp.c`): WRITE_WITH_IMM reports RDMA_WRITE, SEND_WITH_IMM and SEND_WITH_INV
    /// report SEND. `None` for [`WrOpcode::Driver1`], which has no completion opcode.
    pub const fn wc_opcode(self) -> Option<WcOpcode> {
        Some(match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::Tso => WcOpcode::Tso,
            WrOpcode::Flush => WcOpcode::Flush,
            WrOpcode::AtomicWrite => WcOpcode::AtomicWrite,
            WrOpcode::Driver1 => return None,
        })
    }
}

bit_flags! {
    /// Flags of a work completion: `enum ibv_wc_flags`, same bits.
    pub struct WcFlags: u32 {
        /// A GRH is present: the first 40 bytes of a UD receive buffer hold it. srdma sets it
        /// on UD receive completions only (rxe sets it on every receive completion).
        const GRH = 1;
        /// [`Wc::imm_data`] is valid.
        const WITH_IMM = 1 << 1;
        /// The IP checksum was verified (raw packet QPs; never set by srdma).
        const IP_CSUM_OK = 1 << 2;
        /// [`Wc::invalidated_rkey`] is valid: a SEND with invalidate was received.
        const WITH_INV = 1 << 3;
        /// Tag matching: sync required (never set).
        const TM_SYNC_REQ = 1 << 4;
        /// Tag matching: matched (never set).
        const TM_MATCH = 1 << 5;
        /// Tag matching: data valid (never set).
        const TM_DATA_VALID = 1 << 6;
    }
}

bit_flags! {
    /// Flags of a send work request: `enum ibv_send_flags`, same bits.
    pub struct SendFlags: u32 {
        /// Wait for all prior RDMA READ and atomic WRs to complete before starting this one
        /// (IBA 10.8.3.3; rxe `rxe_wqe_is_fenced`).
        const FENCE = 1;
        /// Generate a completion even on a QP created without `sq_sig_all` (IBA 10.7.3.1).
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit on the last packet (SEND / WRITE with immediate).
        const SOLICITED = 1 << 2;
        /// Copy the payload at post time; the SGEs' L_Keys are not checked.
        const INLINE = 1 << 3;
        /// Offload the IP checksum (raw packet QPs only).
        const IP_CSUM = 1 << 4;
    }
}

/// A work completion: what `ibv_poll_cq` returns in `struct ibv_wc`.
///
/// `imm_data` and `invalidated_rkey` share one field in C (a union selected by
/// [`WcFlags::WITH_IMM`] / [`WcFlags::WITH_INV`]); here they are separate options, and the
/// constructors keep them consistent with `wc_flags`. Only `wr_id`, `status`, `qp_num` and
/// `vendor_err` are meaningful on an error completion (verbs rule: the other fields are
/// undefined when `status != SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wc {
    /// The consumer's ID of the completed work request.
    pub wr_id: u64,
    /// How the work request ended.
    pub status: WcStatus,
    /// What the work request did.
    pub opcode: WcOpcode,
    /// Vendor syndrome; rxe reports 0.
    pub vendor_err: u32,
    /// Bytes transferred: received bytes for RECV (including the 40-byte GRH area on UD), the
    /// RETH length for RECV_RDMA_WITH_IMM, the message length on the send side.
    pub byte_len: u32,
    /// The ImmDt value, read big-endian from the wire (`ibv_wc.imm_data` holds the same four
    /// bytes in network order, i.e. `imm.to_be()` in C memory).
    pub imm_data: Option<u32>,
    /// The R_Key invalidated by an incoming SEND with invalidate.
    pub invalidated_rkey: Option<RKey>,
    /// The local QP the work request belonged to.
    pub qp_num: Qpn,
    /// The remote QP on UD (from the DETH); 0 on RC/UC, as rxe reports it.
    pub src_qp: Qpn,
    /// Which optional fields are valid.
    pub wc_flags: WcFlags,
    /// The P_Key index (always 0: the P_Key table has one entry).
    pub pkey_index: u16,
    /// The source LID: always 0 on RoCE.
    pub slid: u16,
    /// The service level.
    pub sl: u8,
    /// The destination LID path bits: always 0 on RoCE.
    pub dlid_path_bits: u8,
    /// The message carried the solicited-event bit (drives solicited-only CQ notification;
    /// not a field of `ibv_wc`).
    pub solicited: bool,
}

impl Wc {
    /// A completion with every optional field empty and `byte_len` 0.
    pub const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        Wc {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: Qpn::new(0),
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            solicited: false,
        }
    }

    /// A flush completion ([`WcStatus::WrFlushErr`]), as posted for every outstanding WQE when
    /// a QP enters ERR (rxe `rxe_comp.c`/`rxe_resp.c` flush paths).
    pub const fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: Qpn) -> Self {
        Wc::new(wr_id, WcStatus::WrFlushErr, opcode, qp_num)
    }

    /// Sets `byte_len`.
    #[must_use]
    pub const fn with_byte_len(mut self, byte_len: u32) -> Self {
        self.byte_len = byte_len;
        self
    }

    /// Sets `src_qp`.
    #[must_use]
    pub const fn with_src_qp(mut self, src_qp: Qpn) -> Self {
        self.src_qp = src_qp;
        self
    }

    /// Sets the immediate data and [`WcFlags::WITH_IMM`], clearing any invalidated R_Key
    /// (the two share one field in `ibv_wc`).
    #[must_use]
    pub const fn with_imm(mut self, imm: u32) -> Self {
        self.imm_data = Some(imm);
        self.invalidated_rkey = None;
        self.wc_flags = self
            .wc_flags
            .union(WcFlags::WITH_IMM)
            .difference(WcFlags::WITH_INV);
        self
    }

    /// Sets the invalidated R_Key and [`WcFlags::WITH_INV`], clearing any immediate data.
    #[must_use]
    pub const fn with_invalidated_rkey(mut self, rkey: RKey) -> Self {
        self.invalidated_rkey = Some(rkey);
        self.imm_data = None;
        self.wc_flags = self
            .wc_flags
            .union(WcFlags::WITH_INV)
            .difference(WcFlags::WITH_IMM);
        self
    }

    /// Adds `flags` (e.g. [`WcFlags::GRH`]).
    #[must_use]
    pub const fn with_flags(mut self, flags: WcFlags) -> Self {
        self.wc_flags = self.wc_flags.union(flags);
        self
    }

    /// True when the operation succeeded.
    #[inline]
    pub const fn is_success(&self) -> bool {
        self.status.is_success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u32_round_trips() {
        for s in WcStatus::ALL {
            assert_eq!(WcStatus::from_u32(s.as_u32()), Some(s));
        }
        assert_eq!(WcStatus::from_u32(24), None);
        for v in 0..256 {
            if let Some(op) = WcOpcode::from_u32(v) {
                assert_eq!(op.as_u32(), v);
            }
            if let Some(op) = WrOpcode::from_u32(v) {
                assert_eq!(op.as_u32(), v);
            }
        }
    }
}
