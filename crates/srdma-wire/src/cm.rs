//! InfiniBand Communication Management MADs, as kernel rdma_cm sends them over RoCEv2: UD
//! SEND_ONLY to QP1 with the GSI Q_Key, a 256-byte MAD (24-byte common header, 232 bytes of
//! message). IBTA vol. 1 ch. 12 (message layouts, field offsets from the start of the
//! message); the rdma_cm header (`cma_hdr`) that starts the REQ's private data.
//!
//! Every message parses from and emits to exactly its bytes: reserved bits are emitted as 0,
//! and what srdma does not interpret (a REQ's alternate path, a REJ's additional information,
//! a SIDR_REP's class port info) is carried as raw bytes, so a parsed message emits the same
//! 256 bytes (checked against kernel rxe's own MADs in `tests/golden.rs`).

use crate::Result;
use crate::error::{Error, need};
use crate::field::{be16, be24, be32, be64, set_be16, set_be24, set_be32, set_be64};

/// A MAD: 256 bytes.
pub const MAD_LEN: usize = 256;
/// The MAD common header.
pub const MAD_HDR_LEN: usize = 24;
/// The CM message after the header.
pub const CM_MSG_LEN: usize = MAD_LEN - MAD_HDR_LEN;
/// Management class of the CM.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// The CM class version kernel ib_cm speaks.
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD method: Send (the CM sends every message with it).
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (the message types).
pub mod attr {
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MessageReceiptAcknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResolutionRequest (UD).
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResolutionResponse (UD).
    pub const SIDR_REP: u16 = 0x0018;
}

/// The MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHdr {
    /// Base version: 1.
    pub base_version: u8,
    /// Management class (0x07 for the CM).
    pub mgmt_class: u8,
    /// Class version (2 for the CM).
    pub class_version: u8,
    /// Method (0x03 Send).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific field.
    pub class_specific: u16,
    /// Transaction ID: a reply echoes its request's.
    pub tid: u64,
    /// Attribute ID: the message type ([`attr`]).
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHdr {
    /// A CM Send header for message `attr_id` in transaction `tid`.
    pub const fn cm(attr_id: u16, tid: u64) -> MadHdr {
        MadHdr {
            base_version: 1,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Parses the first 24 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<MadHdr> {
        need("MAD header", b, MAD_HDR_LEN)?;
        Ok(MadHdr {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: be16(b, 4),
            class_specific: be16(b, 6),
            tid: be64(b, 8),
            attr_id: be16(b, 16),
            attr_mod: be32(b, 20),
        })
    }

    /// Writes the header into the first 24 bytes of `b` (which must hold them).
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        set_be16(b, 4, self.status);
        set_be16(b, 6, self.class_specific);
        set_be64(b, 8, self.tid);
        set_be16(b, 16, self.attr_id);
        set_be16(b, 18, 0);
        set_be32(b, 20, self.attr_mod);
    }
}

/// ConnectRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The vendor of the ECE options the sender offers (24 bits; the options are the MAD
    /// header's attribute modifier: IBA comment 9434, Linux `CM_REQ_VENDOR_ID`); 0: none.
    pub vendor_id: u32,
    /// The service (rdma_cm: `port_space << 16 | port`).
    pub service_id: u64,
    /// The sender's node GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (UD/RD; 0 for RC).
    pub local_qkey: u32,
    /// The sender's QP.
    pub local_qpn: u32,
    /// READ/atomic it accepts as responder.
    pub responder_resources: u8,
    /// EE context (RD; 0).
    pub local_eecn: u32,
    /// READ/atomic it issues as requester.
    pub initiator_depth: u8,
    /// Remote EE context (RD; 0).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer: 4.096 µs × 2^x.
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 3 RD.
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The PSN the active side expects first, i.e. the passive side's first send PSN (as
    /// kernel rdma_cm uses it: each side sends from the PSN the other announced).
    pub starting_psn: u32,
    /// How long the sender may take to answer: 4.096 µs × 2^x.
    pub local_cm_response_timeout: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU (`enum ibv_mtu`).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// How often the REQ is sent before giving up.
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (XRC).
    pub extended_transport_type: u8,
    /// Primary path: local LID (0xFFFF, permissive, on RoCE).
    pub primary_local_lid: u16,
    /// Primary path: remote LID.
    pub primary_remote_lid: u16,
    /// Primary path: the sender's GID.
    pub primary_local_gid: [u8; 16],
    /// Primary path: the receiver's GID.
    pub primary_remote_gid: [u8; 16],
    /// Primary path: flow label (20 bits).
    pub primary_flow_label: u32,
    /// Primary path: packet rate (6 bits).
    pub primary_packet_rate: u8,
    /// Primary path: traffic class.
    pub primary_traffic_class: u8,
    /// Primary path: hop limit.
    pub primary_hop_limit: u8,
    /// Primary path: service level (4 bits).
    pub primary_sl: u8,
    /// Primary path: subnet local.
    pub primary_subnet_local: bool,
    /// Primary path: local ACK timeout (5 bits, 4.096 µs × 2^x).
    pub primary_local_ack_timeout: u8,
    /// The alternate path, uninterpreted (bytes 96..140).
    pub alternate_path: [u8; 44],
    /// Private data (92 bytes; rdma_cm puts a [`CmaHdr`] in the first 36).
    pub private_data: [u8; 92],
}

/// ConnectReply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rep {
    /// The replier's communication ID.
    pub local_comm_id: u32,
    /// The vendor of the ECE options the replier accepted (24 bits, in three bytes:
    /// `CM_REP_VENDOR_ID_H/M/L`; the options are the MAD header's attribute modifier).
    pub vendor_id: u32,
    /// The REQ's.
    pub remote_comm_id: u32,
    /// Q_Key.
    pub local_qkey: u32,
    /// The replier's QP.
    pub local_qpn: u32,
    /// EE context (RD; 0).
    pub local_eecn: u32,
    /// The PSN the passive side expects first (the active side's first send PSN).
    pub starting_psn: u32,
    /// READ/atomic it accepts as responder.
    pub responder_resources: u8,
    /// READ/atomic it issues as requester.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The replier's QP uses an SRQ.
    pub srq: bool,
    /// The replier's node GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; 196],
}

/// ReadyToUse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rtu {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The peer's.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

/// ConnectReject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The peer's (0 if unknown).
    pub remote_comm_id: u32,
    /// Which message is rejected: 0 REQ, 1 REP, 2 no MRA sent (2 bits).
    pub message_rejected: u8,
    /// Bytes of `additional_info` used (7 bits).
    pub rejected_info_length: u8,
    /// Why (IBTA table 104; 28 = consumer reject).
    pub reason: u16,
    /// Additional rejection information.
    pub additional_info: [u8; 72],
    /// Private data.
    pub private_data: [u8; 148],
}

/// MessageReceiptAcknowledgement: asks the peer to wait longer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The peer's.
    pub remote_comm_id: u32,
    /// Which message: 0 REQ, 1 REP, 2 LAP (2 bits).
    pub message_mraed: u8,
    /// The time the sender needs: 4.096 µs × 2^x (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; 222],
}

/// DisconnectRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The peer's.
    pub remote_comm_id: u32,
    /// The peer's QP.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; 220],
}

/// DisconnectReply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The peer's.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; 224],
}

/// ServiceIDResolutionRequest: which UD QP serves this service?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq {
    /// The requester's ID for this resolution.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// The service.
    pub service_id: u64,
    /// Private data (rdma_cm: a [`CmaHdr`] first).
    pub private_data: [u8; 216],
}

/// ServiceIDResolutionResponse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// 0: the QP is valid.
    pub status: u8,
    /// Bytes of additional information.
    pub additional_info_length: u8,
    /// The UD QP serving the service.
    pub qpn: u32,
    /// The service.
    pub service_id: u64,
    /// That QP's Q_Key.
    pub qkey: u32,
    /// ClassPortInfo, uninterpreted.
    pub class_port_info: [u8; 72],
    /// Private data.
    pub private_data: [u8; 136],
}

/// A CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)]
pub enum CmMsg {
    /// ConnectRequest.
    Req(Req),
    /// MessageReceiptAcknowledgement.
    Mra(Mra),
    /// ConnectReject.
    Rej(Rej),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Rtu),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Drep),
    /// ServiceIDResolutionRequest.
    SidrReq(SidrReq),
    /// ServiceIDResolutionResponse.
    SidrRep(SidrRep),
}

fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

impl CmMsg {
    /// The attribute ID of this message.
    pub const fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Parses a whole MAD: its header, and the message if it is a CM message this module
    /// knows (class 0x07, version 2, method Send). Anything else is an error that says why.
    pub fn parse_mad(mad: &[u8]) -> Result<(MadHdr, CmMsg)> {
        need("CM MAD", mad, MAD_LEN)?;
        let h = MadHdr::parse(mad)?;
        if h.base_version != 1 {
            return Err(Error::OutOfRange {
                field: "MAD base version",
                value: h.base_version.into(),
            });
        }
        if h.mgmt_class != MGMT_CLASS_CM {
            return Err(Error::OutOfRange {
                field: "MAD management class (CM is 0x07)",
                value: h.mgmt_class.into(),
            });
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(Error::OutOfRange {
                field: "CM class version",
                value: h.class_version.into(),
            });
        }
        if h.method != METHOD_SEND {
            return Err(Error::OutOfRange {
                field: "CM method (Send is 0x03)",
                value: h.method.into(),
            });
        }
        let b = &mad[MAD_HDR_LEN..MAD_LEN];
        let msg = match h.attr_id {
            attr::REQ => CmMsg::Req(Req {
                local_comm_id: be32(b, 0),
                vendor_id: be24(b, 5),
                service_id: be64(b, 8),
                local_ca_guid: be64(b, 16),
                local_qkey: be32(b, 28),
                local_qpn: be24(b, 32),
                responder_resources: b[35],
                local_eecn: be24(b, 36),
                initiator_depth: b[39],
                remote_eecn: be24(b, 40),
                remote_cm_response_timeout: b[43] >> 3,
                transport_service_type: (b[43] >> 1) & 3,
                end_to_end_flow_control: b[43] & 1 != 0,
                starting_psn: be24(b, 44),
                local_cm_response_timeout: b[47] >> 3,
                retry_count: b[47] & 7,
                pkey: be16(b, 48),
                path_mtu: b[50] >> 4,
                rdc_exists: b[50] & 8 != 0,
                rnr_retry_count: b[50] & 7,
                max_cm_retries: b[51] >> 4,
                srq: b[51] & 8 != 0,
                extended_transport_type: b[51] & 7,
                primary_local_lid: be16(b, 52),
                primary_remote_lid: be16(b, 54),
                primary_local_gid: arr(b, 56),
                primary_remote_gid: arr(b, 72),
                primary_flow_label: be32(b, 88) >> 12,
                primary_packet_rate: b[91] & 0x3f,
                primary_traffic_class: b[92],
                primary_hop_limit: b[93],
                primary_sl: b[94] >> 4,
                primary_subnet_local: b[94] & 8 != 0,
                primary_local_ack_timeout: b[95] >> 3,
                alternate_path: arr(b, 96),
                private_data: arr(b, 140),
            }),
            attr::REP => CmMsg::Rep(Rep {
                local_comm_id: be32(b, 0),
                vendor_id: u32::from(b[15]) << 16 | u32::from(b[19]) << 8 | u32::from(b[23]),
                remote_comm_id: be32(b, 4),
                local_qkey: be32(b, 8),
                local_qpn: be24(b, 12),
                local_eecn: be24(b, 16),
                starting_psn: be24(b, 20),
                responder_resources: b[24],
                initiator_depth: b[25],
                target_ack_delay: b[26] >> 3,
                failover_accepted: (b[26] >> 1) & 3,
                end_to_end_flow_control: b[26] & 1 != 0,
                rnr_retry_count: b[27] >> 5,
                srq: b[27] & 0x10 != 0,
                local_ca_guid: be64(b, 28),
                private_data: arr(b, 36),
            }),
            attr::RTU => CmMsg::Rtu(Rtu {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                private_data: arr(b, 8),
            }),
            attr::REJ => CmMsg::Rej(Rej {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                message_rejected: b[8] >> 6,
                rejected_info_length: b[9] >> 1,
                reason: be16(b, 10),
                additional_info: arr(b, 12),
                private_data: arr(b, 84),
            }),
            attr::MRA => CmMsg::Mra(Mra {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                message_mraed: b[8] >> 6,
                service_timeout: b[9] >> 3,
                private_data: arr(b, 10),
            }),
            attr::DREQ => CmMsg::Dreq(Dreq {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                remote_qpn: be24(b, 8),
                private_data: arr(b, 12),
            }),
            attr::DREP => CmMsg::Drep(Drep {
                local_comm_id: be32(b, 0),
                remote_comm_id: be32(b, 4),
                private_data: arr(b, 8),
            }),
            attr::SIDR_REQ => CmMsg::SidrReq(SidrReq {
                request_id: be32(b, 0),
                pkey: be16(b, 4),
                service_id: be64(b, 8),
                private_data: arr(b, 16),
            }),
            attr::SIDR_REP => CmMsg::SidrRep(SidrRep {
                request_id: be32(b, 0),
                status: b[4],
                additional_info_length: b[5],
                qpn: be24(b, 8),
                service_id: be64(b, 12),
                qkey: be32(b, 20),
                class_port_info: arr(b, 24),
                private_data: arr(b, 96),
            }),
            other => {
                return Err(Error::OutOfRange {
                    field: "CM attribute ID",
                    value: other.into(),
                });
            }
        };
        Ok((h, msg))
    }

    /// Writes the whole MAD (`hdr` with this message's attribute ID) into `mad`, which must
    /// hold [`MAD_LEN`] bytes.
    pub fn emit_mad(&self, hdr: &MadHdr, mad: &mut [u8]) -> Result<()> {
        if mad.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                needed: MAD_LEN,
                actual: mad.len(),
            });
        }
        let mut h = *hdr;
        h.attr_id = self.attr_id();
        h.emit(mad);
        let b = &mut mad[MAD_HDR_LEN..MAD_LEN];
        b.fill(0);
        match self {
            CmMsg::Req(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be24(b, 5, m.vendor_id & 0xFF_FFFF);
                set_be64(b, 8, m.service_id);
                set_be64(b, 16, m.local_ca_guid);
                set_be32(b, 28, m.local_qkey);
                set_be24(b, 32, m.local_qpn);
                b[35] = m.responder_resources;
                set_be24(b, 36, m.local_eecn);
                b[39] = m.initiator_depth;
                set_be24(b, 40, m.remote_eecn);
                b[43] = (m.remote_cm_response_timeout << 3)
                    | ((m.transport_service_type & 3) << 1)
                    | u8::from(m.end_to_end_flow_control);
                set_be24(b, 44, m.starting_psn);
                b[47] = (m.local_cm_response_timeout << 3) | (m.retry_count & 7);
                set_be16(b, 48, m.pkey);
                b[50] = (m.path_mtu << 4) | (u8::from(m.rdc_exists) << 3) | (m.rnr_retry_count & 7);
                b[51] = (m.max_cm_retries << 4)
                    | (u8::from(m.srq) << 3)
                    | (m.extended_transport_type & 7);
                set_be16(b, 52, m.primary_local_lid);
                set_be16(b, 54, m.primary_remote_lid);
                b[56..72].copy_from_slice(&m.primary_local_gid);
                b[72..88].copy_from_slice(&m.primary_remote_gid);
                set_be32(
                    b,
                    88,
                    (m.primary_flow_label << 12) | u32::from(m.primary_packet_rate & 0x3f),
                );
                b[92] = m.primary_traffic_class;
                b[93] = m.primary_hop_limit;
                b[94] = (m.primary_sl << 4) | (u8::from(m.primary_subnet_local) << 3);
                b[95] = m.primary_local_ack_timeout << 3;
                b[96..140].copy_from_slice(&m.alternate_path);
                b[140..232].copy_from_slice(&m.private_data);
            }
            CmMsg::Rep(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                set_be32(b, 8, m.local_qkey);
                set_be24(b, 12, m.local_qpn);
                set_be24(b, 16, m.local_eecn);
                set_be24(b, 20, m.starting_psn);
                b[24] = m.responder_resources;
                b[25] = m.initiator_depth;
                b[26] = (m.target_ack_delay << 3)
                    | ((m.failover_accepted & 3) << 1)
                    | u8::from(m.end_to_end_flow_control);
                b[27] = (m.rnr_retry_count << 5) | (u8::from(m.srq) << 4);
                set_be64(b, 28, m.local_ca_guid);
                b[36..232].copy_from_slice(&m.private_data);
                b[15] = (m.vendor_id >> 16) as u8;
                b[19] = (m.vendor_id >> 8) as u8;
                b[23] = m.vendor_id as u8;
            }
            CmMsg::Rtu(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                b[8..232].copy_from_slice(&m.private_data);
            }
            CmMsg::Rej(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                b[8] = m.message_rejected << 6;
                b[9] = m.rejected_info_length << 1;
                set_be16(b, 10, m.reason);
                b[12..84].copy_from_slice(&m.additional_info);
                b[84..232].copy_from_slice(&m.private_data);
            }
            CmMsg::Mra(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                b[8] = m.message_mraed << 6;
                b[9] = m.service_timeout << 3;
                b[10..232].copy_from_slice(&m.private_data);
            }
            CmMsg::Dreq(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                set_be24(b, 8, m.remote_qpn);
                b[12..232].copy_from_slice(&m.private_data);
            }
            CmMsg::Drep(m) => {
                set_be32(b, 0, m.local_comm_id);
                set_be32(b, 4, m.remote_comm_id);
                b[8..232].copy_from_slice(&m.private_data);
            }
            CmMsg::SidrReq(m) => {
                set_be32(b, 0, m.request_id);
                set_be16(b, 4, m.pkey);
                set_be64(b, 8, m.service_id);
                b[16..232].copy_from_slice(&m.private_data);
            }
            CmMsg::SidrRep(m) => {
                set_be32(b, 0, m.request_id);
                b[4] = m.status;
                b[5] = m.additional_info_length;
                set_be24(b, 8, m.qpn);
                set_be64(b, 12, m.service_id);
                set_be32(b, 20, m.qkey);
                b[24..96].copy_from_slice(&m.class_port_info);
                b[96..232].copy_from_slice(&m.private_data);
            }
        }
        Ok(())
    }
}

/// rdma_cm's port spaces (the top of a service ID).
pub mod port_space {
    /// RDMA_PS_TCP: RC connections (rping, perftest `-R`).
    pub const TCP: u16 = 0x0106;
    /// RDMA_PS_UDP: UD through SIDR.
    pub const UDP: u16 = 0x0111;
    /// RDMA_PS_IB.
    pub const IB: u16 = 0x013F;
}

/// The service ID rdma_cm uses for `port` in port space `ps`.
pub const fn service_id(ps: u16, port: u16) -> u64 {
    ((ps as u64) << 16) | port as u64
}

/// The 36-byte header rdma_cm puts before the application's private data in a REQ or
/// SIDR_REQ: version 0, IP version (4 or 6), the source port, the source and destination
/// addresses (IPv4 as the last 4 of 16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// `cma_version` (0).
    pub cma_version: u8,
    /// 4 or 6 (the upper nibble of the byte on the wire).
    pub ip_version: u8,
    /// The active side's port.
    pub src_port: u16,
    /// The active side's address.
    pub src_addr: [u8; 16],
    /// The passive side's address (a listener matches it).
    pub dst_addr: [u8; 16],
}

/// Length of [`CmaHdr`].
pub const CMA_HDR_LEN: usize = 36;

impl CmaHdr {
    /// Parses the first 36 bytes of `b` (REQ private data).
    pub fn parse(b: &[u8]) -> Result<CmaHdr> {
        need("rdma_cm header", b, CMA_HDR_LEN)?;
        Ok(CmaHdr {
            cma_version: b[0],
            ip_version: b[1] >> 4,
            src_port: be16(b, 2),
            src_addr: arr(b, 4),
            dst_addr: arr(b, 20),
        })
    }

    /// Writes it into the first 36 bytes of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.cma_version;
        b[1] = self.ip_version << 4;
        set_be16(b, 2, self.src_port);
        b[4..20].copy_from_slice(&self.src_addr);
        b[20..36].copy_from_slice(&self.dst_addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let mut mad = [0u8; MAD_LEN];
        for (i, byte) in mad.iter_mut().enumerate().skip(MAD_HDR_LEN) {
            *byte = (i * 37 + 11) as u8;
        }
        for id in [
            attr::REQ,
            attr::MRA,
            attr::REJ,
            attr::REP,
            attr::RTU,
            attr::DREQ,
            attr::DREP,
            attr::SIDR_REQ,
            attr::SIDR_REP,
        ] {
            MadHdr::cm(id, 0x1234_5678_9abc_def0).emit(&mut mad);
            let (h, m) = CmMsg::parse_mad(&mad).unwrap();
            let mut out = [0u8; MAD_LEN];
            m.emit_mad(&h, &mut out).unwrap();
            // Parse what was emitted: the fields survive (reserved bits are zeroed).
            let (h2, m2) = CmMsg::parse_mad(&out).unwrap();
            assert_eq!((h, m), (h2, m2), "attribute {id:#x}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_cm_mad() {
        let mut mad = [0u8; MAD_LEN];
        MadHdr::cm(attr::REQ, 1).emit(&mut mad);
        assert!(CmMsg::parse_mad(&mad[..100]).is_err());
        let mut m = mad;
        m[1] = 0x81;
        assert!(CmMsg::parse_mad(&m).is_err());
        let mut m = mad;
        m[2] = 1;
        assert!(CmMsg::parse_mad(&m).is_err());
        let mut m = mad;
        m[17] = 0x99;
        assert!(CmMsg::parse_mad(&m).is_err());
        assert!(CmMsg::parse_mad(&mad).is_ok());
    }

    #[test]
    fn rdma_cm_service_ids() {
        assert_eq!(service_id(port_space::TCP, 7174), 0x0000_0000_0106_1C06);
    }
}
