//! The types of `infiniband/verbs.h` (rdma-core 44, x86-64) this library hands out or reads,
//! byte for byte; names are the C names. Checked against the installed header by the layout
//! test in `abi.rs`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use libc::{pthread_cond_t, pthread_mutex_t};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `enum ibv_node_type`.
pub type ibv_node_type = c_int;
/// A channel adapter.
pub const IBV_NODE_CA: ibv_node_type = 1;
/// `enum ibv_transport_type`.
pub type ibv_transport_type = c_int;
/// InfiniBand transport (RoCE included).
pub const IBV_TRANSPORT_IB: ibv_transport_type = 0;

/// `enum ibv_qp_state`.
pub type ibv_qp_state = c_uint;
/// RESET.
pub const IBV_QPS_RESET: ibv_qp_state = 0;
/// `enum ibv_qp_type`.
pub type ibv_qp_type = c_uint;
/// Reliable connected.
pub const IBV_QPT_RC: ibv_qp_type = 2;
/// Unreliable connected.
pub const IBV_QPT_UC: ibv_qp_type = 3;
/// Unreliable datagram.
pub const IBV_QPT_UD: ibv_qp_type = 4;
/// Raw packet.
pub const IBV_QPT_RAW_PACKET: ibv_qp_type = 8;
/// XRC send.
pub const IBV_QPT_XRC_SEND: ibv_qp_type = 9;
/// XRC receive.
pub const IBV_QPT_XRC_RECV: ibv_qp_type = 10;
/// Driver-specific.
pub const IBV_QPT_DRIVER: ibv_qp_type = 0xff;
/// `enum ibv_mig_state`.
pub type ibv_mig_state = c_uint;
/// Migrated.
pub const IBV_MIG_MIGRATED: ibv_mig_state = 0;
/// `enum ibv_mtu`.
pub type ibv_mtu = c_uint;
/// `enum ibv_port_state`.
pub type ibv_port_state = c_uint;
/// `enum ibv_atomic_cap`.
pub type ibv_atomic_cap = c_uint;
/// `enum ibv_wc_status`.
pub type ibv_wc_status = c_uint;
/// `enum ibv_wc_opcode`.
pub type ibv_wc_opcode = c_uint;
/// `enum ibv_wr_opcode`.
pub type ibv_wr_opcode = c_uint;
/// RDMA WRITE.
pub const IBV_WR_RDMA_WRITE: ibv_wr_opcode = 0;
/// RDMA WRITE with immediate.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
/// SEND.
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
/// SEND with immediate.
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;
/// RDMA READ.
pub const IBV_WR_RDMA_READ: ibv_wr_opcode = 4;
/// Atomic compare-and-swap.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wr_opcode = 5;
/// Atomic fetch-and-add.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wr_opcode = 6;
/// Local invalidate.
pub const IBV_WR_LOCAL_INV: ibv_wr_opcode = 7;
/// Bind a memory window.
pub const IBV_WR_BIND_MW: ibv_wr_opcode = 8;
/// SEND with invalidate.
pub const IBV_WR_SEND_WITH_INV: ibv_wr_opcode = 9;
/// `enum ibv_event_type`.
pub type ibv_event_type = c_uint;
/// CQ overrun.
pub const IBV_EVENT_CQ_ERR: ibv_event_type = 0;
/// A QP entered ERR on its own.
pub const IBV_EVENT_QP_FATAL: ibv_event_type = 1;
/// The device failed.
pub const IBV_EVENT_DEVICE_FATAL: ibv_event_type = 8;
/// The port became active.
pub const IBV_EVENT_PORT_ACTIVE: ibv_event_type = 9;
/// An SQD QP finished the messages it had started.
pub const IBV_EVENT_SQ_DRAINED: ibv_event_type = 5;
/// An SRQ's QP reached its last WQE.
pub const IBV_EVENT_QP_LAST_WQE_REACHED: ibv_event_type = 16;
/// `IBV_EVENT_SRQ_LIMIT_REACHED`.
pub const IBV_EVENT_SRQ_LIMIT_REACHED: ibv_event_type = 15;
/// `enum ibv_fork_status`.
pub type ibv_fork_status = c_uint;
/// Fork needs no preparation.
pub const IBV_FORK_UNNEEDED: ibv_fork_status = 2;
/// `enum ibv_gid_type` values as `ibv_query_gid_type` and `ibv_gid_entry` report them.
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs` (driver.h): RoCE v2, as `ibv_query_gid_type` reports it.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u32 = 2;
/// `IBV_ACCESS_ON_DEMAND`.
pub const IBV_ACCESS_ON_DEMAND: c_int = 1 << 6;
/// `IBV_ACCESS_RELAXED_ORDERING` (`IBV_ACCESS_OPTIONAL_FIRST`).
pub const IBV_ACCESS_RELAXED_ORDERING: c_int = 1 << 20;
/// `IBV_REREG_MR_CHANGE_TRANSLATION`.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1;
/// `IBV_REREG_MR_CHANGE_PD`.
pub const IBV_REREG_MR_CHANGE_PD: c_int = 2;
/// `IBV_REREG_MR_CHANGE_ACCESS`.
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 4;
/// `IBV_REREG_MR_FLAGS_SUPPORTED`.
pub const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = 7;
/// `IBV_REREG_MR_ERR_INPUT`: the old region is still valid; the input was refused.
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_ACCESS_OPTIONAL_RANGE`: bits 20..=29, hints a device may ignore.
pub const IBV_ACCESS_OPTIONAL_RANGE: c_int = 0x3ff0_0000;
/// `IBV_WC_GRH`.
pub const IBV_WC_GRH: c_uint = 1;
/// `IBV_SRQ_MAX_WR`.
pub const IBV_SRQ_MAX_WR: u32 = 1;
/// `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_LIMIT: u32 = 2;
/// `IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG`.
pub const IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG: u32 = 1;

/// `union ibv_gid`: 16 bytes, 8-aligned (its other member is two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct ibv_gid {
    /// The bytes, network order.
    pub raw: [u8; 16],
}

/// `struct _ibv_device_ops`: unused placeholders.
#[repr(C)]
pub struct _ibv_device_ops {
    /// Unused.
    pub _dummy1: Option<unsafe extern "C" fn()>,
    /// Unused.
    pub _dummy2: Option<unsafe extern "C" fn()>,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    /// Placeholders.
    pub _ops: _ibv_device_ops,
    /// Node type.
    pub node_type: ibv_node_type,
    /// Transport.
    pub transport_type: ibv_transport_type,
    /// Kernel device name (`rxe0`).
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    /// uverbs device name.
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    /// uverbs sysfs path.
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    /// Device sysfs path.
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// A function pointer slot this library leaves NULL or never calls through.
pub type opaque_fn = Option<unsafe extern "C" fn()>;

/// `struct ibv_context_ops`: the entries the inline functions of verbs.h call.
#[repr(C)]
pub struct ibv_context_ops {
    /// Compat.
    pub _compat_query_device: opaque_fn,
    /// Compat.
    pub _compat_query_port: opaque_fn,
    /// Compat.
    pub _compat_alloc_pd: opaque_fn,
    /// Compat.
    pub _compat_dealloc_pd: opaque_fn,
    /// Compat.
    pub _compat_reg_mr: opaque_fn,
    /// Compat.
    pub _compat_rereg_mr: opaque_fn,
    /// Compat.
    pub _compat_dereg_mr: opaque_fn,
    /// `ibv_alloc_mw` (NULL: EOPNOTSUPP).
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw>,
    /// `ibv_bind_mw`.
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    /// `ibv_dealloc_mw`.
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    /// Compat.
    pub _compat_create_cq: opaque_fn,
    /// `ibv_poll_cq`.
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    /// `ibv_req_notify_cq`.
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    /// Compat.
    pub _compat_cq_event: opaque_fn,
    /// Compat.
    pub _compat_resize_cq: opaque_fn,
    /// Compat.
    pub _compat_destroy_cq: opaque_fn,
    /// Compat.
    pub _compat_create_srq: opaque_fn,
    /// Compat.
    pub _compat_modify_srq: opaque_fn,
    /// Compat.
    pub _compat_query_srq: opaque_fn,
    /// Compat.
    pub _compat_destroy_srq: opaque_fn,
    /// `ibv_post_srq_recv`.
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    /// Compat.
    pub _compat_create_qp: opaque_fn,
    /// Compat.
    pub _compat_query_qp: opaque_fn,
    /// Compat.
    pub _compat_modify_qp: opaque_fn,
    /// Compat.
    pub _compat_destroy_qp: opaque_fn,
    /// `ibv_post_send`.
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    /// `ibv_post_recv`.
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Compat.
    pub _compat_create_ah: opaque_fn,
    /// Compat.
    pub _compat_destroy_ah: opaque_fn,
    /// Compat.
    pub _compat_attach_mcast: opaque_fn,
    /// Compat.
    pub _compat_detach_mcast: opaque_fn,
    /// Compat.
    pub _compat_async_event: opaque_fn,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    /// The device.
    pub device: *mut ibv_device,
    /// The data-path entries.
    pub ops: ibv_context_ops,
    /// The kernel command descriptor (-1 here).
    pub cmd_fd: c_int,
    /// Pollable async event descriptor.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// Library lock.
    pub mutex: pthread_mutex_t,
    /// `UINTPTR_MAX` for a `verbs_context`.
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context` of rdma-core 44: extended ops, then `sz`, then the context last.
#[repr(C)]
pub struct verbs_context {
    /// `query_port` with the caller's struct size.
    pub query_port:
        Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int>,
    /// `advise_mr`.
    pub advise_mr: opaque_fn,
    /// `alloc_null_mr`.
    pub alloc_null_mr: opaque_fn,
    /// `read_counters`.
    pub read_counters: opaque_fn,
    /// `attach_counters_point_flow`.
    pub attach_counters_point_flow: opaque_fn,
    /// `create_counters`.
    pub create_counters: opaque_fn,
    /// `destroy_counters`.
    pub destroy_counters: opaque_fn,
    /// `reg_dm_mr`.
    pub reg_dm_mr: opaque_fn,
    /// `alloc_dm`.
    pub alloc_dm: opaque_fn,
    /// `free_dm`.
    pub free_dm: opaque_fn,
    /// `modify_flow_action_esp`.
    pub modify_flow_action_esp: opaque_fn,
    /// `destroy_flow_action`.
    pub destroy_flow_action: opaque_fn,
    /// `create_flow_action_esp`.
    pub create_flow_action_esp: opaque_fn,
    /// `modify_qp_rate_limit`.
    pub modify_qp_rate_limit: opaque_fn,
    /// `alloc_parent_domain`.
    pub alloc_parent_domain: opaque_fn,
    /// `dealloc_td`.
    pub dealloc_td: opaque_fn,
    /// `alloc_td`.
    pub alloc_td: opaque_fn,
    /// `modify_cq`.
    pub modify_cq: opaque_fn,
    /// `post_srq_ops`.
    pub post_srq_ops: opaque_fn,
    /// `destroy_rwq_ind_table`.
    pub destroy_rwq_ind_table: opaque_fn,
    /// `create_rwq_ind_table`.
    pub create_rwq_ind_table: opaque_fn,
    /// `destroy_wq`.
    pub destroy_wq: opaque_fn,
    /// `modify_wq`.
    pub modify_wq: opaque_fn,
    /// `create_wq`.
    pub create_wq: opaque_fn,
    /// `query_rt_values`.
    pub query_rt_values: opaque_fn,
    /// `create_cq_ex`.
    pub create_cq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    /// Library private.
    pub priv_: *mut c_void,
    /// `query_device_ex` with the caller's struct size.
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *const ibv_query_device_ex_input,
            *mut ibv_device_attr_ex,
            usize,
        ) -> c_int,
    >,
    /// `ibv_destroy_flow`.
    pub ibv_destroy_flow: opaque_fn,
    /// Placeholder.
    pub ABI_placeholder2: opaque_fn,
    /// `ibv_create_flow`.
    pub ibv_create_flow: opaque_fn,
    /// Placeholder.
    pub ABI_placeholder1: opaque_fn,
    /// `open_qp`.
    pub open_qp: opaque_fn,
    /// `create_qp_ex`.
    pub create_qp_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    /// `get_srq_num`.
    pub get_srq_num: Option<unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int>,
    /// `create_srq_ex`.
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    /// `open_xrcd`.
    pub open_xrcd:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd>,
    /// `close_xrcd`.
    pub close_xrcd: Option<unsafe extern "C" fn(*mut ibv_xrcd) -> c_int>,
    /// Placeholder.
    pub _ABI_placeholder3: u64,
    /// Size of this struct: ops whose distance to the end exceeds it are absent.
    pub sz: usize,
    /// The context (must be last).
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    /// Its context.
    pub context: *mut ibv_context,
    /// Handle.
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// First byte.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
    /// Handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Its context.
    pub context: *mut ibv_context,
    /// Pollable descriptor.
    pub fd: c_int,
    /// CQs using it.
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its channel.
    pub channel: *mut ibv_comp_channel,
    /// The application's pointer.
    pub cq_context: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// Entries.
    pub cqe: c_int,
    /// Event lock.
    pub mutex: pthread_mutex_t,
    /// Event condition.
    pub cond: pthread_cond_t,
    /// Completion events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    /// Its context.
    pub context: *mut ibv_context,
    /// The application's pointer.
    pub srq_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
    /// Event lock.
    pub mutex: pthread_mutex_t,
    /// Event condition.
    pub cond: pthread_cond_t,
    /// Events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    /// Its context.
    pub context: *mut ibv_context,
    /// The application's pointer.
    pub qp_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// Its SRQ.
    pub srq: *mut ibv_srq,
    /// Handle.
    pub handle: u32,
    /// QP number.
    pub qp_num: u32,
    /// State as last seen.
    pub state: ibv_qp_state,
    /// Type.
    pub qp_type: ibv_qp_type,
    /// Event lock.
    pub mutex: pthread_mutex_t,
    /// Event condition.
    pub cond: pthread_cond_t,
    /// Events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_qp_ex`: a QP with the `ibv_wr_*` send API (`ibv_qp_to_qp_ex`).
#[repr(C)]
pub struct ibv_qp_ex {
    /// The QP.
    pub qp_base: ibv_qp,
    /// Valid fields.
    pub comp_mask: u64,
    /// The next WR's id.
    pub wr_id: u64,
    /// The next WR's `IBV_SEND_*` flags.
    pub wr_flags: c_uint,
    /// `ibv_wr_atomic_cmp_swp`.
    pub wr_atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    /// `ibv_wr_atomic_fetch_add`.
    pub wr_atomic_fetch_add: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    /// `ibv_wr_bind_mw`.
    pub wr_bind_mw:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    /// `ibv_wr_local_inv`.
    pub wr_local_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_rdma_read`.
    pub wr_rdma_read: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write`.
    pub wr_rdma_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    /// `ibv_wr_rdma_write_imm`.
    pub wr_rdma_write_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_send`.
    pub wr_send: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_send_imm`.
    pub wr_send_imm: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_inv`.
    pub wr_send_inv: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_send_tso`.
    pub wr_send_tso: opaque_fn,
    /// `ibv_wr_set_ud_addr`.
    pub wr_set_ud_addr: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    /// `ibv_wr_set_xrc_srqn`.
    pub wr_set_xrc_srqn: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    /// `ibv_wr_set_inline_data`.
    pub wr_set_inline_data: Option<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    /// `ibv_wr_set_inline_data_list`.
    pub wr_set_inline_data_list:
        Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    /// `ibv_wr_set_sge`.
    pub wr_set_sge: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    /// `ibv_wr_set_sge_list`.
    pub wr_set_sge_list: Option<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    /// `ibv_wr_start`.
    pub wr_start: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_complete`.
    pub wr_complete: Option<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    /// `ibv_wr_abort`.
    pub wr_abort: Option<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    /// `ibv_wr_atomic_write`.
    pub wr_atomic_write: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
}

/// `struct ibv_data_buf`.
#[repr(C)]
pub struct ibv_data_buf {
    /// Address.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
}

/// `struct ibv_qp_init_attr_ex` (its `rx_hash_conf` as raw space).
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    /// The application's pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// Type.
    pub qp_type: ibv_qp_type,
    /// Signal every send.
    pub sq_sig_all: c_int,
    /// Valid fields (`IBV_QP_INIT_ATTR_*`).
    pub comp_mask: u32,
    /// PD.
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// Creation flags.
    pub create_flags: u32,
    /// TSO header size.
    pub max_tso_header: u16,
    /// RSS indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf` (function u8, key len u8, key pointer, fields mask u64).
    pub rx_hash_conf: [u64; 3],
    /// Source QPN (raw packet QPs).
    pub source_qpn: u32,
    /// `IBV_QP_EX_WITH_*`: the operations of the `ibv_wr_*` API.
    pub send_ops_flags: u64,
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
pub const IBV_QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// The `IBV_QP_EX_WITH_*` operations srdma does: RDMA WRITE (with immediate), SEND (with
/// immediate), RDMA READ, compare-and-swap, fetch-and-add, local invalidate, bind MW, SEND
/// with invalidate.
pub const SRDMA_QP_EX_OPS: u64 = 0x3ff;
/// `IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV`: the
/// memory-window operations (RC and UC only; SEND with invalidate RC only).
pub const SRDMA_QP_EX_MW_OPS: u64 = (1 << 7) | (1 << 8) | (1 << 9);

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    /// Entries.
    pub cqe: u32,
    /// The application's pointer.
    pub cq_context: *mut c_void,
    /// Channel.
    pub channel: *mut ibv_comp_channel,
    /// Completion vector.
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*`: what the read functions must report.
    pub wc_flags: u64,
    /// Valid fields.
    pub comp_mask: u32,
    /// Creation flags.
    pub flags: u32,
    /// Parent domain.
    pub parent_domain: *mut ibv_pd,
}

/// `IBV_WC_STANDARD_FLAGS`: byte_len, imm, qp_num, src_qp, slid, sl, dlid_path_bits.
pub const IBV_WC_STANDARD_FLAGS: u64 = 0x7f;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`.
pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`.
pub const IBV_CREATE_CQ_ATTR_KNOWN: u32 = 3;

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct ibv_poll_cq_attr {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_cq_ex`: an `ibv_cq` followed by the polling API of `ibv_start_poll`.
#[repr(C)]
pub struct ibv_cq_ex {
    /// The `ibv_cq` fields, same layout (`ibv_cq_ex_to_cq` is a cast).
    pub cq: ibv_cq,
    /// Valid fields.
    pub comp_mask: u32,
    /// Status of the current completion.
    pub status: ibv_wc_status,
    /// wr_id of the current completion.
    pub wr_id: u64,
    /// `ibv_start_poll`.
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    /// `ibv_next_poll`.
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    /// `ibv_end_poll`.
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    /// `ibv_wc_read_opcode`.
    pub read_opcode: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> ibv_wc_opcode>,
    /// `ibv_wc_read_vendor_err`.
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_byte_len`.
    pub read_byte_len: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_imm_data`.
    pub read_imm_data: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_qp_num`.
    pub read_qp_num: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_src_qp`.
    pub read_src_qp: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_wc_flags`.
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_uint>,
    /// `ibv_wc_read_slid`.
    pub read_slid: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u32>,
    /// `ibv_wc_read_sl`.
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_dlid_path_bits`.
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    /// `ibv_wc_read_completion_ts`.
    pub read_completion_ts: opaque_fn,
    /// `ibv_wc_read_cvlan`.
    pub read_cvlan: opaque_fn,
    /// `ibv_wc_read_flow_tag`.
    pub read_flow_tag: opaque_fn,
    /// `ibv_wc_read_tm_info`.
    pub read_tm_info: opaque_fn,
    /// `ibv_wc_read_completion_wallclock_ns`.
    pub read_completion_wallclock_ns: opaque_fn,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    /// Its context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    /// Global route.
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// GRH present.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_cap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Gather entries.
    pub max_send_sge: u32,
    /// Scatter entries.
    pub max_recv_sge: u32,
    /// Inline bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    /// The application's pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// Type.
    pub qp_type: ibv_qp_type,
    /// Signal every send.
    pub sq_sig_all: c_int,
}

/// `struct ibv_ece`: enhanced connection establishment options.
#[repr(C)]
pub struct ibv_ece {
    /// The vendor (IEEE OUI) whose options these are.
    pub vendor_id: u32,
    /// The vendor's option bits.
    pub options: u32,
    /// Reserved: 0.
    pub comp_mask: u32,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
pub struct ibv_qp_attr {
    /// State.
    pub qp_state: ibv_qp_state,
    /// Current state.
    pub cur_qp_state: ibv_qp_state,
    /// Path MTU.
    pub path_mtu: ibv_mtu,
    /// Migration state.
    pub path_mig_state: ibv_mig_state,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Destination QP.
    pub dest_qp_num: u32,
    /// Remote access.
    pub qp_access_flags: c_uint,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// Address vector.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD event.
    pub en_sqd_async_notify: u8,
    /// Draining.
    pub sq_draining: u8,
    /// Outstanding READ/atomic as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR timer.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// ACK timeout.
    pub timeout: u8,
    /// Retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit.
    pub rate_limit: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
pub struct ibv_srq_attr {
    /// Depth.
    pub max_wr: u32,
    /// Scatter entries.
    pub max_sge: u32,
    /// Limit event threshold.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// The application's pointer.
    pub srq_context: *mut c_void,
    /// Attributes.
    pub attr: ibv_srq_attr,
}

/// `struct ibv_tm_cap`: tag matching capabilities.
#[repr(C)]
pub struct ibv_tm_cap {
    /// Tags.
    pub max_num_tags: u32,
    /// Outstanding tag operations.
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    /// The application's pointer.
    pub srq_context: *mut c_void,
    /// Attributes.
    pub attr: ibv_srq_attr,
    /// Which of the fields below are valid (`IBV_SRQ_INIT_ATTR_*`).
    pub comp_mask: u32,
    /// `IBV_SRQT_BASIC`, `IBV_SRQT_XRC`, `IBV_SRQT_TM`.
    pub srq_type: u32,
    /// Protection domain.
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// XRC completion queue.
    pub cq: *mut ibv_cq,
    /// Tag matching.
    pub tm_cap: ibv_tm_cap,
}

/// `IBV_SRQ_INIT_ATTR_TYPE`.
pub const IBV_SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
/// `IBV_SRQ_INIT_ATTR_PD`.
pub const IBV_SRQ_INIT_ATTR_PD: u32 = 1 << 1;
/// `IBV_SRQT_BASIC`.
pub const IBV_SRQT_BASIC: u32 = 0;
/// `IBV_SRQT_XRC`.
pub const IBV_SRQT_XRC: u32 = 1;
/// `IBV_SRQ_INIT_ATTR_XRCD`.
pub const IBV_SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
/// `IBV_SRQ_INIT_ATTR_CQ`.
pub const IBV_SRQ_INIT_ATTR_CQ: u32 = 1 << 3;

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    /// Its context.
    pub context: *mut ibv_context,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    /// Valid fields (`IBV_XRCD_INIT_ATTR_*`).
    pub comp_mask: u32,
    /// A file naming the domain to share, or -1.
    pub fd: c_int,
    /// `O_CREAT`, `O_EXCL`.
    pub oflags: c_int,
}

/// `IBV_XRCD_INIT_ATTR_FD`.
pub const IBV_XRCD_INIT_ATTR_FD: u32 = 1 << 0;
/// `IBV_XRCD_INIT_ATTR_OFLAGS`.
pub const IBV_XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
/// `IBV_QP_INIT_ATTR_XRCD`.
pub const IBV_QP_INIT_ATTR_XRCD: u32 = 1 << 1;

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    /// Address.
    pub addr: u64,
    /// Length.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    /// The application's id.
    pub wr_id: u64,
    /// Next in the list.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Entries.
    pub num_sge: c_int,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_rdma {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_atomic {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare (CAS) or add (FAA) operand.
    pub compare_add: u64,
    /// Swap operand.
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_ud {
    /// Address handle.
    pub ah: *mut ibv_ah,
    /// Remote QPN.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// `union wr` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    /// RDMA.
    pub rdma: ibv_send_wr_rdma,
    /// Atomic.
    pub atomic: ibv_send_wr_atomic,
    /// UD.
    pub ud: ibv_send_wr_ud,
}

/// `struct ibv_send_wr` (the XRC and bind/TSO unions as raw space).
#[repr(C)]
pub struct ibv_send_wr {
    /// The application's id.
    pub wr_id: u64,
    /// Next in the list.
    pub next: *mut ibv_send_wr,
    /// Gather list.
    pub sg_list: *mut ibv_sge,
    /// Entries.
    pub num_sge: c_int,
    /// Operation.
    pub opcode: ibv_wr_opcode,
    /// Flags.
    pub send_flags: c_uint,
    /// Immediate data (network order) or rkey to invalidate.
    pub imm_data: u32,
    /// Operation-specific.
    pub wr: ibv_send_wr_wr,
    /// `qp_type.xrc.remote_srqn`.
    pub qp_type_xrc_remote_srqn: u32,
    /// `bind_mw` / `tso` union.
    pub bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_wc`.
#[repr(C)]
pub struct ibv_wc {
    /// The application's id.
    pub wr_id: u64,
    /// Status.
    pub status: ibv_wc_status,
    /// Opcode.
    pub opcode: ibv_wc_opcode,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes.
    pub byte_len: u32,
    /// Immediate data (network order) or invalidated rkey.
    pub imm_data: u32,
    /// Local QP.
    pub qp_num: u32,
    /// Source QP (UD).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: c_uint,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Path bits.
    pub dlid_path_bits: u8,
}

/// `struct ibv_grh`.
#[repr(C)]
pub struct ibv_grh {
    /// Version, traffic class, flow label.
    pub version_tclass_flow: u32,
    /// Payload length.
    pub paylen: u16,
    /// Next header.
    pub next_hdr: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
}

/// `element` of `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    /// CQ.
    pub cq: *mut ibv_cq,
    /// QP.
    pub qp: *mut ibv_qp,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// WQ.
    pub wq: *mut c_void,
    /// Port.
    pub port_num: c_int,
}

/// `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    /// The object.
    pub element: ibv_async_event_element,
    /// What happened.
    pub event_type: ibv_event_type,
}

/// `struct ibv_device_attr`.
#[repr(C)]
pub struct ibv_device_attr {
    /// Firmware version.
    pub fw_ver: [c_char; 64],
    /// Node GUID (network order).
    pub node_guid: u64,
    /// System image GUID (network order).
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Page sizes.
    pub page_size_cap: u64,
    /// Vendor.
    pub vendor_id: u32,
    /// Part.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// QPs.
    pub max_qp: c_int,
    /// WRs per queue.
    pub max_qp_wr: c_int,
    /// Capabilities.
    pub device_cap_flags: c_uint,
    /// SGEs.
    pub max_sge: c_int,
    /// SGEs for READ.
    pub max_sge_rd: c_int,
    /// CQs.
    pub max_cq: c_int,
    /// CQ entries.
    pub max_cqe: c_int,
    /// MRs.
    pub max_mr: c_int,
    /// PDs.
    pub max_pd: c_int,
    /// Responder READ/atomic.
    pub max_qp_rd_atom: c_int,
    /// EE.
    pub max_ee_rd_atom: c_int,
    /// Total responder resources.
    pub max_res_rd_atom: c_int,
    /// Requester READ/atomic.
    pub max_qp_init_rd_atom: c_int,
    /// EE.
    pub max_ee_init_rd_atom: c_int,
    /// Atomic guarantee.
    pub atomic_cap: ibv_atomic_cap,
    /// EE.
    pub max_ee: c_int,
    /// RDD.
    pub max_rdd: c_int,
    /// MWs.
    pub max_mw: c_int,
    /// Raw IPv6 QPs.
    pub max_raw_ipv6_qp: c_int,
    /// Raw Ethernet QPs.
    pub max_raw_ethy_qp: c_int,
    /// Multicast groups.
    pub max_mcast_grp: c_int,
    /// QPs per group.
    pub max_mcast_qp_attach: c_int,
    /// Attachments.
    pub max_total_mcast_qp_attach: c_int,
    /// AHs.
    pub max_ah: c_int,
    /// FMRs.
    pub max_fmr: c_int,
    /// Maps per FMR.
    pub max_map_per_fmr: c_int,
    /// SRQs.
    pub max_srq: c_int,
    /// SRQ WRs.
    pub max_srq_wr: c_int,
    /// SRQ SGEs.
    pub max_srq_sge: c_int,
    /// P_Keys.
    pub max_pkeys: u16,
    /// ACK delay.
    pub local_ca_ack_delay: u8,
    /// Ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
pub struct ibv_query_device_ex_input {
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_device_attr_ex`: the legacy attributes then extensions srdma reports as absent
/// (kept as zeroed space of the v44 size).
#[repr(C)]
pub struct ibv_device_attr_ex {
    /// The legacy attributes.
    pub orig_attr: ibv_device_attr,
    /// Valid fields.
    pub comp_mask: u32,
    /// `odp_caps` (24 bytes, 8-aligned).
    pub odp_caps: [u64; 3],
    /// Timestamp mask.
    pub completion_timestamp_mask: u64,
    /// Core clock.
    pub hca_core_clock: u64,
    /// Extended capabilities.
    pub device_cap_flags_ex: u64,
    /// `tso_caps`, `rss_caps`, `max_wq_type_rq`, `packet_pacing_caps`, `raw_packet_caps`,
    /// `tm_caps`, `cq_mod_caps` (none of them srdma's: zero).
    pub caps: [u32; 22],
    /// Largest device memory allocation.
    pub max_dm_size: u64,
    /// `pci_atomic_caps` (three u16).
    pub pci_atomic_caps: [u16; 3],
    /// XRC on-demand paging capabilities.
    pub xrc_odp_caps: u32,
    /// Number of ports, as `phys_port_cnt` when below 256.
    pub phys_port_cnt_ex: u32,
}

/// `struct ibv_port_attr` of rdma-core 44.
#[repr(C)]
pub struct ibv_port_attr {
    /// State.
    pub state: ibv_port_state,
    /// Largest MTU.
    pub max_mtu: ibv_mtu,
    /// Active MTU.
    pub active_mtu: ibv_mtu,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// Capabilities.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// P_Key violations.
    pub bad_pkey_cntr: u32,
    /// Q_Key violations.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID.
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// VLs.
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Width.
    pub active_width: u8,
    /// Speed.
    pub active_speed: u8,
    /// Physical state.
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: u8,
    /// Flags.
    pub flags: u8,
    /// More capabilities.
    pub port_cap_flags2: u16,
}

/// `struct ibv_gid_entry`.
#[repr(C)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: ibv_gid,
    /// Its index.
    pub gid_index: u32,
    /// Its port.
    pub port_num: u32,
    /// `enum ibv_gid_type`.
    pub gid_type: u32,
    /// Interface index.
    pub ndev_ifindex: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    /// The context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Its R_Key (type 1: updated by `ibv_bind_mw`).
    pub rkey: u32,
    /// Handle.
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub type_: u32,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    /// The region (NULL with length 0 to unbind).
    pub mr: *mut ibv_mr,
    /// First byte.
    pub addr: u64,
    /// Length.
    pub length: u64,
    /// `IBV_ACCESS_*` rights of the window.
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`'s argument).
#[repr(C)]
pub struct ibv_mw_bind {
    /// The application's id.
    pub wr_id: u64,
    /// `IBV_SEND_*`.
    pub send_flags: c_uint,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `struct ibv_send_wr` (in its `bind_mw_or_tso` space).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr_bind_mw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// The R_Key to give it.
    pub rkey: u32,
    /// What to bind.
    pub bind_info: ibv_mw_bind_info,
}

const _: () = assert!(
    std::mem::size_of::<ibv_send_wr_bind_mw>() == std::mem::size_of::<[u64; 6]>()
        && std::mem::align_of::<ibv_send_wr_bind_mw>() <= std::mem::align_of::<[u64; 6]>()
);

#[cfg(test)]
mod tests {
    //! Every struct above against the installed `infiniband/verbs.h`: size, alignment and the
    //! offset of every field, computed by the C compiler and by rustc from one list.

    use super::*;
    use crate::layout;

    #[test]
    fn layouts_match_the_installed_verbs_h() {
        let (rust, c) = layout! {
            union ibv_gid { raw }
            struct _ibv_device_ops { _dummy1, _dummy2 }
            struct ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
            struct ibv_context_ops {
                _compat_query_device, alloc_mw, bind_mw, dealloc_mw, poll_cq, req_notify_cq,
                post_srq_recv, post_send, post_recv, _compat_async_event
            }
            struct ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
            struct verbs_context {
                query_port, advise_mr, create_cq_ex, priv_ = "priv", query_device_ex,
                ibv_destroy_flow, ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp,
                create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd,
                _ABI_placeholder3, sz, context
            }
            struct ibv_pd { context, handle }
            struct ibv_mr { context, pd, addr, length, handle, lkey, rkey }
            struct ibv_comp_channel { context, fd, refcnt }
            struct ibv_cq {
                context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
                async_events_completed
            }
            struct ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
            struct ibv_qp {
                context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
                mutex, cond, events_completed
            }
            struct ibv_ah { context, pd, handle }
            struct ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
            struct ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
            struct ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
            struct ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
            struct ibv_qp_attr {
                qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
                dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index,
                alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic,
                max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
                alt_port_num, alt_timeout, rate_limit
            }
            struct ibv_ece { vendor_id, options, comp_mask }
            struct ibv_srq_attr { max_wr, max_sge, srq_limit }
            struct ibv_srq_init_attr { srq_context, attr }
            struct ibv_srq_init_attr_ex { srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap }
            struct ibv_xrcd { context }
            struct ibv_xrcd_init_attr { comp_mask, fd, oflags }
            struct ibv_sge { addr, length, lkey }
            struct ibv_recv_wr { wr_id, next, sg_list, num_sge }
            struct ibv_send_wr {
                wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data,
                wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic.remote_addr, wr.atomic.compare_add,
                wr.atomic.swap, wr.atomic.rkey, wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey,
                qp_type_xrc_remote_srqn = "qp_type.xrc.remote_srqn", bind_mw_or_tso = "bind_mw"
            }
            struct ibv_wc {
                wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags,
                pkey_index, slid, sl, dlid_path_bits
            }
            struct ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid }
            struct ibv_async_event { element, event_type }
            struct ibv_device_attr {
                fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
                vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
                max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
                max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
                max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
                max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
                max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
            }
            struct ibv_query_device_ex_input { comp_mask }
            struct ibv_device_attr_ex {
                orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
                device_cap_flags_ex, caps = "tso_caps", max_dm_size, pci_atomic_caps,
                xrc_odp_caps, phys_port_cnt_ex
            }
            struct ibv_port_attr {
                state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
                bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl,
                subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
                link_layer, flags, port_cap_flags2
            }
            struct ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
            struct ibv_qp_ex {
                qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
                wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
                wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
                wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list,
                wr_start, wr_complete, wr_abort, wr_atomic_write
            }
            struct ibv_data_buf { addr, length }
            struct ibv_mw { context, pd, rkey, handle, type_ = "type" }
            struct ibv_mw_bind_info { mr, addr, length, mw_access_flags }
            struct ibv_mw_bind { wr_id, send_flags, bind_info }
            struct ibv_qp_init_attr_ex {
                qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
                create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn,
                send_ops_flags
            }
            struct ibv_cq_init_attr_ex {
                cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
            }
            struct ibv_poll_cq_attr { comp_mask }
            struct ibv_cq_ex {
                cq.context = "context", cq.channel = "channel", cq.cq_context = "cq_context",
                cq.handle = "handle", cq.cqe = "cqe", cq.mutex = "mutex", cq.cond = "cond",
                cq.comp_events_completed = "comp_events_completed",
                cq.async_events_completed = "async_events_completed", comp_mask, status, wr_id,
                start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len,
                read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl,
                read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
                read_completion_wallclock_ns
            }
        };
        crate::layout_check::compare(&["infiniband/verbs.h"], &rust, &c, 250);
    }
}
