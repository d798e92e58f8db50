//! The types of `rdma/rdma_cma.h` (librdmacm, rdma-core 44, x86-64), byte for byte, for the
//! drop-in librdmacm to come: `struct rdma_cm_id` is ABI, since the inline helpers of
//! `rdma_verbs.h` read its `pd`, `qp`, `send_cq` and friends. Checked against the installed
//! header by the unit test below.

use std::ffi::{c_char, c_int, c_void};

use libc::{sockaddr, sockaddr_storage, socklen_t};

use crate::abi_core::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_qp_type,
    ibv_srq,
};

/// `enum rdma_cm_event_type`.
pub type rdma_cm_event_type = u32;
/// `RDMA_CM_EVENT_ADDR_RESOLVED`.
pub const RDMA_CM_EVENT_ADDR_RESOLVED: rdma_cm_event_type = 0;
/// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: rdma_cm_event_type = 2;
/// `RDMA_CM_EVENT_CONNECT_REQUEST`.
pub const RDMA_CM_EVENT_CONNECT_REQUEST: rdma_cm_event_type = 4;
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the REP came for an id without a QP.
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: rdma_cm_event_type = 5;
/// `RDMA_CM_EVENT_CONNECT_ERROR`.
pub const RDMA_CM_EVENT_CONNECT_ERROR: rdma_cm_event_type = 6;
/// `RDMA_CM_EVENT_UNREACHABLE`.
pub const RDMA_CM_EVENT_UNREACHABLE: rdma_cm_event_type = 7;
/// `RDMA_CM_EVENT_REJECTED`.
pub const RDMA_CM_EVENT_REJECTED: rdma_cm_event_type = 8;
/// `RDMA_CM_EVENT_ESTABLISHED`.
pub const RDMA_CM_EVENT_ESTABLISHED: rdma_cm_event_type = 9;
/// `RDMA_CM_EVENT_DISCONNECTED`.
pub const RDMA_CM_EVENT_DISCONNECTED: rdma_cm_event_type = 10;
/// `RDMA_CM_EVENT_MULTICAST_JOIN`.
pub const RDMA_CM_EVENT_MULTICAST_JOIN: rdma_cm_event_type = 12;
/// `RDMA_CM_EVENT_MULTICAST_ERROR`.
pub const RDMA_CM_EVENT_MULTICAST_ERROR: rdma_cm_event_type = 13;
/// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: rdma_cm_event_type = 15;

/// `enum rdma_port_space`.
pub type rdma_port_space = u32;
/// `RDMA_PS_TCP`: RC connections.
pub const RDMA_PS_TCP: rdma_port_space = 0x0106;
/// `RDMA_PS_UDP`: UD through SIDR.
pub const RDMA_PS_UDP: rdma_port_space = 0x0111;

/// `struct rdma_event_channel`: its `fd` is pollable.
#[repr(C)]
pub struct rdma_event_channel {
    /// Readable when an event waits.
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key (network order).
    pub pkey: u16,
}

/// `struct rdma_addr` (each anonymous union as its largest member).
#[repr(C)]
pub struct rdma_addr {
    /// `src_addr` / `src_sin` / `src_sin6` / `src_storage`.
    pub src_storage: sockaddr_storage,
    /// `dst_addr` / `dst_sin` / `dst_sin6` / `dst_storage`.
    pub dst_storage: sockaddr_storage,
    /// `addr.ibaddr`.
    pub addr: rdma_ib_addr,
}

/// `struct ibv_sa_path_rec` (`infiniband/sa.h`).
#[repr(C)]
pub struct ibv_sa_path_rec {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// Raw traffic.
    pub raw_traffic: c_int,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Reversible.
    pub reversible: c_int,
    /// Paths.
    pub numb_path: u8,
    /// P_Key.
    pub pkey: u16,
    /// Service level.
    pub sl: u8,
    /// MTU selector.
    pub mtu_selector: u8,
    /// MTU.
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Rate.
    pub rate: u8,
    /// Packet lifetime selector.
    pub packet_life_time_selector: u8,
    /// Packet lifetime.
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    /// Addresses.
    pub addr: rdma_addr,
    /// Path records.
    pub path_rec: *mut ibv_sa_path_rec,
    /// Their number.
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    /// The device context (after bind or resolve).
    pub verbs: *mut ibv_context,
    /// Where its events go.
    pub channel: *mut rdma_event_channel,
    /// The application's pointer.
    pub context: *mut c_void,
    /// Its QP (`rdma_create_qp`).
    pub qp: *mut ibv_qp,
    /// Route.
    pub route: rdma_route,
    /// Port space.
    pub ps: rdma_port_space,
    /// Port.
    pub port_num: u8,
    /// The event being processed (`rdma_get_request`).
    pub event: *mut rdma_cm_event,
    /// Send CQ channel (`rdma_create_ep`).
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ channel.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// PD.
    pub pd: *mut ibv_pd,
    /// QP type.
    pub qp_type: ibv_qp_type,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Flow control.
    pub flow_control: u8,
    /// Retries (ignored when accepting).
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: u8,
    /// QPN (when the application made its own QP).
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// How to reach the peer.
    pub ah_attr: ibv_ah_attr,
    /// The peer's QPN.
    pub qp_num: u32,
    /// The peer's Q_Key.
    pub qkey: u32,
}

/// `param` of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected QPs.
    pub conn: rdma_conn_param,
    /// UD.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    /// The id it concerns (a new one for a connect request).
    pub id: *mut rdma_cm_id,
    /// The listening id, for a connect request.
    pub listen_id: *mut rdma_cm_id,
    /// What happened.
    pub event: rdma_cm_event_type,
    /// 0, or an errno / reject reason.
    pub status: c_int,
    /// Connection or UD parameters.
    pub param: rdma_cm_event_param,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// Which fields are set (`RDMA_CM_JOIN_MC_ATTR_*`).
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub join_flags: u32,
    /// The group's address.
    pub addr: *mut sockaddr,
}

/// `rdma_cm_join_mc_attr_ex.addr` is set.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
/// `rdma_cm_join_mc_attr_ex.join_flags` is set.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
/// The first `comp_mask` bit librdmacm does not know.
pub const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;
/// Join to send and receive.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
/// Join to send only (the QP is not attached).
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
/// The first join flag librdmacm does not know.
pub const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*` flags.
    pub ai_flags: c_int,
    /// Address family.
    pub ai_family: c_int,
    /// QP type.
    pub ai_qp_type: c_int,
    /// Port space.
    pub ai_port_space: c_int,
    /// Source address length.
    pub ai_src_len: socklen_t,
    /// Destination address length.
    pub ai_dst_len: socklen_t,
    /// Source address.
    pub ai_src_addr: *mut sockaddr,
    /// Destination address.
    pub ai_dst_addr: *mut sockaddr,
    /// Source canonical name.
    pub ai_src_canonname: *mut c_char,
    /// Destination canonical name.
    pub ai_dst_canonname: *mut c_char,
    /// Route length.
    pub ai_route_len: usize,
    /// Route.
    pub ai_route: *mut c_void,
    /// Connect data length.
    pub ai_connect_len: usize,
    /// Connect data.
    pub ai_connect: *mut c_void,
    /// Next.
    pub ai_next: *mut rdma_addrinfo,
}

#[cfg(test)]
mod tests {
    //! Every struct above against the installed `rdma/rdma_cma.h`.

    use super::*;
    use crate::layout;

    #[test]
    fn layouts_match_the_installed_rdma_cma_h() {
        let (rust, c) = layout! {
            struct rdma_event_channel { fd }
            struct rdma_ib_addr { sgid, dgid, pkey }
            struct rdma_addr { src_storage, dst_storage, addr = "addr.ibaddr" }
            struct ibv_sa_path_rec {
                dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
                reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
                packet_life_time_selector, packet_life_time, preference
            }
            struct rdma_route { addr, path_rec, num_paths }
            struct rdma_cm_id {
                verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
                send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type
            }
            struct rdma_conn_param {
                private_data, private_data_len, responder_resources, initiator_depth,
                flow_control, retry_count, rnr_retry_count, srq, qp_num
            }
            struct rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
            struct rdma_cm_event { id, listen_id, event, status, param }
            struct rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
            struct rdma_addrinfo {
                ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
                ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len,
                ai_route, ai_connect_len, ai_connect, ai_next
            }
        };
        crate::layout_check::compare(&["rdma/rdma_cma.h"], &rust, &c, 80);
    }
}
