//! QP types, states and attributes: `ibv_qp_type`, `ibv_qp_state`, `ibv_mtu`,
//! `ibv_mig_state`, `struct ibv_qp_attr` and `enum ibv_qp_attr_mask`, numbered as rdma-core's
//! `libibverbs/verbs.h` so values cross into C unchanged.

use srdma_wire::{Psn, Qpn, ROCEV2_PORT};

use crate::access::AccessFlags;
use crate::flags::bit_flags;
use crate::limits::QpCaps;

/// The transport service of a QP: `enum ibv_qp_type` (RC 2, UC 3, UD 4). rxe has no RD, and
/// srdma implements neither XRC nor raw packet QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected: acknowledged, retransmitted, in order; all operations.
    Rc = 2,
    /// Unreliable connected: SEND and RDMA WRITE, no acknowledgements.
    Uc = 3,
    /// Unreliable datagram: single-packet SENDs addressed per WR, Q_Key protected.
    Ud = 4,
}

impl QpType {
    /// All supported types.
    pub const ALL: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

    /// The `ibv_qp_type` number.
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The type with number `v`, or `None` for unsupported or unknown types.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            _ => None,
        }
    }

    /// "RC", "UC" or "UD".
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        }
    }
}

impl core::fmt::Display for QpType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A QP state: `enum ibv_qp_state`, RESET 0 through ERR 6, the states of the IBTA QP state diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u32)]
pub enum QpState {
    /// Freshly created or reset: no work is processed, posting receives is allowed only in
    /// later states.
    #[default]
    Reset = 0,
    /// Initialized: receives may be posted but nothing is received.
    Init = 1,
    /// Ready to receive: the responder runs.
    Rtr = 2,
    /// Ready to send: requester and responder run.
    Rts = 3,
    /// Send queue drain: no new send WQEs start; outstanding ones finish.
    Sqd = 4,
    /// Send queue error (UC/UD only): a send failed; receives still work. Entered by the
    /// transport, never by modify.
    Sqe = 5,
    /// Error: all outstanding and newly posted work is flushed.
    Err = 6,
}

impl QpState {
    /// Every state in numeric order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The `ibv_qp_state` number.
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The state with number `v`, or `None` (`IBV_QPS_UNKNOWN` and beyond).
    pub const fn from_u32(v: u32) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// The verbs name: "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR".
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl core::fmt::Display for QpState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A path MTU: `enum ibv_mtu`, 256 bytes = 1 through 4096 bytes = 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u32)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes: rxe's active MTU on a 1500-byte Ethernet.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// The `ibv_mtu` number (1..=5).
    #[inline]
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The MTU with `ibv_mtu` number `v`, or `None`.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1..=5 => Some(Self::ALL[v as usize - 1]),
            _ => None,
        }
    }

    /// The payload bytes per packet: 256 << (number − 1).
    #[inline]
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU of exactly `bytes` bytes, or `None` if it is not 256/512/1024/2048/4096.
    pub const fn from_bytes(bytes: u32) -> Option<Self> {
        match bytes {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }

    /// The largest IB MTU that fits a network device MTU once RoCEv2 headers are taken off,
    /// as rxe's `eth_mtu_int_to_enum` (subtract `RXE_MAX_HDR_LENGTH` = 80, round down): 1500
    /// gives 1024, 9000 gives 4096; `None` below 336.
    pub const fn for_netdev_mtu(netdev_mtu: u32) -> Option<Self> {
        match netdev_mtu.saturating_sub(80) {
            0..256 => None,
            256..512 => Some(Mtu::Mtu256),
            512..1024 => Some(Mtu::Mtu512),
            1024..2048 => Some(Mtu::Mtu1024),
            2048..4096 => Some(Mtu::Mtu2048),
            _ => Some(Mtu::Mtu4096),
        }
    }
}

/// The path migration state: `enum ibv_mig_state`. Stored and reported; automatic path
/// migration itself does not exist on RoCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MigState {
    /// Migrated (the only state reachable without an alternate path).
    #[default]
    Migrated = 0,
    /// Rearm.
    Rearm = 1,
    /// Armed.
    Armed = 2,
}

/// An address vector (`struct ibv_ah_attr` with its `ibv_global_route`): where a connected
/// QP's packets go, or a UD address handle's destination.
///
/// On RoCE every address is global: `is_global` must be true and `dgid` holds the peer's GID
/// (an IPv4-mapped or IPv6 address), from which the IP destination is derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (`grh.dgid`), 16 bytes in network order.
    pub dgid: [u8; 16],
    /// IPv6 flow label (`grh.flow_label`, 20 bits).
    pub flow_label: u32,
    /// Index of the local source GID (`grh.sgid_index`).
    pub sgid_index: u8,
    /// IP hop limit / TTL (`grh.hop_limit`).
    pub hop_limit: u8,
    /// IP traffic class / TOS (`grh.traffic_class`).
    pub traffic_class: u8,
    /// A GRH is present (`is_global`); required on RoCE.
    pub is_global: bool,
    /// Service level (`sl`), mapped to a priority by some RoCE fabrics.
    pub sl: u8,
    /// The local port (`port_num`): 1.
    pub port_num: u8,
    /// The peer's UDP destination port: 4791 for RoCEv2 (srdma devices may listen elsewhere;
    /// not part of `ibv_ah_attr`).
    pub udp_dport: u16,
}

impl Default for AhAttr {
    /// A global route on port 1 to the zero GID, hop limit 64, UDP port 4791.
    fn default() -> Self {
        AhAttr {
            dgid: [0; 16],
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            is_global: true,
            sl: 0,
            port_num: 1,
            udp_dport: ROCEV2_PORT,
        }
    }
}

bit_flags! {
    /// Which [`QpAttr`] fields an `ibv_modify_qp` call sets: `enum ibv_qp_attr_mask`, same
    /// bits. Constant names are the C names without `IBV_QP_`, and are what
    /// [`crate::qp::ModifyError`] reports.
    pub struct AttrMask: u32 {
        /// `qp_state`: the state to move to.
        const STATE = 1;
        /// `cur_qp_state`: the state the caller believes the QP is in.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`: raise an async event when SQD has drained.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`: remote operations the responder accepts.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey` (UD).
        const QKEY = 1 << 6;
        /// `ah_attr`: the primary path.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`: local ACK timeout exponent.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`: transport retries.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`: RNR retries.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`: the first expected receive PSN.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`: outstanding READ/atomic as initiator.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and friends: the alternate path (not supported on RoCE).
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`: the RNR NAK timer this responder advertises.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`: the first send PSN.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`: outstanding READ/atomic as responder.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`: queue sizes (resizing is never allowed by modify).
        const CAP = 1 << 19;
        /// `dest_qp_num`: the connected peer QP.
        const DEST_QPN = 1 << 20;
        /// `rate_limit` (raw packet QPs only).
        const RATE_LIMIT = 1 << 25;
    }
}

/// The attributes of `ibv_modify_qp` / `ibv_query_qp` (`struct ibv_qp_attr`, minus the
/// alternate path, which RoCE does not support). [`AttrMask`] says which are meaningful.
///
/// `Default` gives a valid value for every field — port 1, a global address, the
/// `ibv_rc_pingpong` timers (`timeout` 14, `retry_cnt` 7, `rnr_retry` 7, `min_rnr_timer` 12,
/// one outstanding READ/atomic each way) — so a caller fills in only what differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// The state to move to ([`AttrMask::STATE`]).
    pub qp_state: QpState,
    /// The state the caller believes the QP is in ([`AttrMask::CUR_STATE`]).
    pub cur_qp_state: QpState,
    /// Path MTU ([`AttrMask::PATH_MTU`]).
    pub path_mtu: Mtu,
    /// Path migration state ([`AttrMask::PATH_MIG_STATE`]).
    pub path_mig_state: MigState,
    /// Q_Key of a UD QP ([`AttrMask::QKEY`]).
    pub qkey: u32,
    /// First expected receive PSN ([`AttrMask::RQ_PSN`]).
    pub rq_psn: Psn,
    /// First send PSN ([`AttrMask::SQ_PSN`]).
    pub sq_psn: Psn,
    /// The connected peer QP ([`AttrMask::DEST_QPN`]).
    pub dest_qp_num: Qpn,
    /// Remote operations the responder accepts ([`AttrMask::ACCESS_FLAGS`]).
    pub qp_access_flags: AccessFlags,
    /// Queue sizes (query only: [`AttrMask::CAP`] is never accepted by modify).
    pub cap: QpCaps,
    /// The primary path ([`AttrMask::AV`]).
    pub ah_attr: AhAttr,
    /// P_Key table index ([`AttrMask::PKEY_INDEX`]).
    pub pkey_index: u16,
    /// Raise an async event when SQD has drained ([`AttrMask::EN_SQD_ASYNC_NOTIFY`]).
    pub en_sqd_async_notify: bool,
    /// Query only: the send queue is still draining in SQD.
    pub sq_draining: bool,
    /// Outstanding RDMA READ / atomic requests as initiator ([`AttrMask::MAX_QP_RD_ATOMIC`]).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ / atomic requests as responder
    /// ([`AttrMask::MAX_DEST_RD_ATOMIC`]).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder sends, 0..=31 ([`AttrMask::MIN_RNR_TIMER`]; see
    /// [`crate::timer::rnr_timer`]).
    pub min_rnr_timer: u8,
    /// Port number, 1 ([`AttrMask::PORT`]).
    pub port_num: u8,
    /// Local ACK timeout exponent, 0..=31, 0 = infinite ([`AttrMask::TIMEOUT`]; see
    /// [`crate::timer::local_ack_timeout`]).
    pub timeout: u8,
    /// Transport retries after a timeout or NAK, 0..=7 ([`AttrMask::RETRY_CNT`]).
    pub retry_cnt: u8,
    /// RNR retries, 0..=7, 7 = infinite ([`AttrMask::RNR_RETRY`]).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            dest_qp_num: Qpn::new(0),
            qp_access_flags: AccessFlags::empty(),
            cap: QpCaps::default(),
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_matches_verbs_h() {
        assert_eq!(QpType::Rc.as_u32(), 2);
        assert_eq!(QpType::Ud.as_u32(), 4);
        assert_eq!(QpState::Err.as_u32(), 6);
        assert_eq!(Mtu::Mtu256.as_u32(), 1);
        assert_eq!(Mtu::Mtu4096.as_u32(), 5);
        assert_eq!(AttrMask::DEST_QPN.bits(), 1_048_576);
        assert_eq!(AttrMask::MAX_DEST_RD_ATOMIC.bits(), 131_072);
        assert_eq!(AttrMask::MIN_RNR_TIMER.bits(), 32_768);
        assert_eq!(AttrMask::CAP.bits(), 524_288);
    }

    #[test]
    fn mtu_bytes_and_conversions() {
        let bytes: Vec<u32> = Mtu::ALL.iter().map(|m| m.bytes()).collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
            assert_eq!(Mtu::from_u32(m.as_u32()), Some(m));
        }
        assert_eq!(Mtu::from_u32(0), None);
        assert_eq!(Mtu::from_u32(6), None);
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::for_netdev_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_netdev_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_netdev_mtu(335), None);
        assert_eq!(Mtu::for_netdev_mtu(336), Some(Mtu::Mtu256));
        assert_eq!(Mtu::for_netdev_mtu(0), None);
    }

    #[test]
    fn state_round_trip() {
        for s in QpState::ALL {
            assert_eq!(QpState::from_u32(s.as_u32()), Some(s));
        }
        assert_eq!(QpState::from_u32(7), None);
    }
}
