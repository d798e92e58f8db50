//! The exports nothing calls on srdma, and the small pure functions of the API.
//!
//! - Real: the `*_str` functions (rdma-core's strings), the rate conversions (rdma-core's
//!   tables), `ibv_get_sysfs_path`.
//! - Unsupported, with rdma-core's errno for a provider without the feature: memory windows'
//!   entry points, dma-buf MRs, importing objects from
//!   another process, resolving a RoCE L2 address (EOPNOTSUPP; NULL with errno for pointers).
//! - Provider-only (`IBVERBS_PRIVATE_34`): the kernel command and ioctl helpers a provider
//!   library calls (`ibv_cmd_*`, `execute_ioctl`, …). They exist so that libmlx5.so.1 and
//!   libefa.so.1, which perftest links, load (Debian builds with BIND_NOW): no device of theirs
//!   ever exists without a kernel, so they are never reached; if one is, it gets EOPNOTSUPP.
//!   `verbs_register_driver_34` (their constructors call it) records nothing.
//! - `ibv_copy_*_kern`: conversions between the kernel's uverbs structs and the user ones,
//!   imported by librdmacm for its kernel path, which cannot run without
//!   /dev/infiniband/rdma_cm; they copy nothing here.
//!
//! Signatures: only the argument registers the C callers use matter on x86-64 (System V), so
//! the provider-only stubs take no arguments and return the C function's return type.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::set_errno;

/// What rdma-core's sysfs lookups return here: there is no sysfs RDMA device.
///
/// # Safety
/// Never dereferences its arguments.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// As [`ibv_read_sysfs_file`], for the provider-only variant.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// `ibv_get_sysfs_path`: "/sys", as rdma-core returns it when sysfs is mounted there.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_wc_status_str`: rdma-core's text for a completion status.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    let s: &'static std::ffi::CStr = match status {
        0 => c"success",
        1 => c"local length error",
        2 => c"local QP operation error",
        3 => c"local EE context operation error",
        4 => c"local protection error",
        5 => c"Work Request Flushed Error",
        6 => c"memory management operation error",
        7 => c"bad response error",
        8 => c"local access error",
        9 => c"remote invalid request error",
        10 => c"remote access error",
        11 => c"remote operation error",
        12 => c"transport retry counter exceeded",
        13 => c"RNR retry counter exceeded",
        14 => c"local RDD violation error",
        15 => c"remote invalid RD request",
        16 => c"aborted error",
        17 => c"invalid EE context number",
        18 => c"invalid EE context state",
        19 => c"fatal error",
        20 => c"response timeout error",
        21 => c"general error",
        22 => c"TM error",
        23 => c"TM rendezvous incomplete",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `ibv_node_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    let s: &'static std::ffi::CStr = match node_type {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `ibv_port_state_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_port_state_str(port_state: c_uint) -> *const c_char {
    let s: &'static std::ffi::CStr = match port_state {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `ibv_event_type_str`.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_event_type_str(event: c_uint) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        0 => c"CQ error",
        1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error",
        3 => c"local access violation work queue error",
        4 => c"communication established",
        5 => c"send queue drained",
        6 => c"path migrated",
        7 => c"path migration request error",
        8 => c"local catastrophic error",
        9 => c"port active",
        10 => c"port error",
        11 => c"LID change",
        12 => c"P_Key change",
        13 => c"SM change",
        14 => c"SRQ catastrophic error",
        15 => c"SRQ limit reached",
        16 => c"last WQE reached",
        17 => c"client reregistration",
        18 => c"GID table change",
        19 => c"WQ fatal",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `enum ibv_rate` → (multiple of 2.5 Gb/s, Mb/s), rdma-core's tables (-1: none).
const RATES: [(c_int, c_int, c_int); 21] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
];

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s, -1 for others.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`: the inverse; `IBV_RATE_MAX` (0) for an unknown multiple.
#[unsafe(no_mangle)]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s, -1 for others.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: the inverse; `IBV_RATE_MAX` (0) for an unknown rate.
#[unsafe(no_mangle)]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// `ibv_reg_dmabuf_mr`: no dma-buf: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_dmabuf_mr() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_resolve_eth_l2_from_gid`: srdma needs no L2 address (the kernel routes its UDP):
/// EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_resolve_eth_l2_from_gid() -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_import_device`: objects of another process cannot be shared: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_device() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_pd`: objects of another process cannot be shared: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_pd() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_mr`: objects of another process cannot be shared: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_mr() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_dm`: objects of another process cannot be shared: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_dm() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_unimport_pd`: nothing was imported: does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_unimport_pd(_obj: *mut c_void) {}

/// `ibv_unimport_mr`: nothing was imported: does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_unimport_mr(_obj: *mut c_void) {}

/// `ibv_unimport_dm`: nothing was imported: does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_unimport_dm(_obj: *mut c_void) {}

/// `ibv_copy_qp_attr_from_kern`: for librdmacm's kernel path, which cannot run here: copies nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}

/// `ibv_copy_ah_attr_from_kern`: for librdmacm's kernel path, which cannot run here: copies nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}

/// `ibv_copy_path_rec_from_kern`: for librdmacm's kernel path, which cannot run here: copies nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {}

/// `ibv_copy_path_rec_to_kern`: for librdmacm's kernel path, which cannot run here: copies nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *const c_void) {}

/// `ibv_register_driver` (IBVERBS_1.1, hidden): a no-op in rdma-core since v13.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_register_driver(_name: *const c_char, _init: *mut c_void) {}

/// Provider registration (the constructors of libmlx5 and libefa call it): records nothing,
/// since no kernel device exists for a provider to drive.
#[unsafe(no_mangle)]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// Provider helper: does nothing (no provider context is ever created).
#[unsafe(no_mangle)]
pub extern "C" fn verbs_set_ops(_vctx: *mut c_void, _ops: *const c_void) {}

/// Provider helper: does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn verbs_uninit_context(_vctx: *mut c_void) {}

/// Provider helper: does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn verbs_init_cq() {}

/// Provider logging (variadic in C; only its fixed arguments are declared, which x86-64
/// callers may call this way): logs nothing.
#[unsafe(no_mangle)]
pub extern "C" fn __verbs_log(_ctx: *mut c_void, _level: u32, _fmt: *const c_char) {}

/// Provider helper: no provider contexts here: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn _verbs_init_and_alloc_context() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Provider helper: NULL with EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn verbs_open_device() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Provider ioctl helper: there is no kernel to talk to: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn execute_ioctl() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider ioctl helper: the attribute count it is given.
#[unsafe(no_mangle)]
pub extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}

/// Provider flag: false.
#[unsafe(no_mangle)]
pub static mut verbs_allow_disassociate_destroy: bool = false;

/// Provider command `ibv_cmd_advise_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_advise_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_alloc_dm`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_alloc_dm() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_alloc_mw`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_alloc_mw() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_alloc_pd`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_alloc_pd() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_attach_mcast`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_attach_mcast() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_close_xrcd`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_close_xrcd() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_ah`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_ah() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_counters`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_counters() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_cq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_cq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_cq_ex`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_cq_ex() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_flow`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_flow() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_flow_action_esp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_flow_action_esp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_qp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_qp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_qp_ex`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_qp_ex() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_qp_ex2`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_qp_ex2() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_rwq_ind_table`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_rwq_ind_table() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_srq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_srq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_srq_ex`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_srq_ex() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_create_wq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_create_wq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_dealloc_mw`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_dealloc_mw() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_dealloc_pd`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_dealloc_pd() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_dereg_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_dereg_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_ah`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_ah() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_counters`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_counters() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_cq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_cq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_flow`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_flow() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_flow_action`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_flow_action() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_qp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_qp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_rwq_ind_table`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_rwq_ind_table() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_srq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_srq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_destroy_wq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_destroy_wq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_detach_mcast`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_detach_mcast() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_free_dm`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_free_dm() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_get_context`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_get_context() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_modify_cq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_modify_cq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_modify_flow_action_esp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_modify_flow_action_esp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_modify_qp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_modify_qp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_modify_qp_ex`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_modify_qp_ex() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_modify_srq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_modify_srq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_modify_wq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_modify_wq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_open_qp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_open_qp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_open_xrcd`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_open_xrcd() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_poll_cq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_poll_cq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_post_recv`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_post_recv() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_post_send`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_post_send() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_post_srq_recv`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_post_srq_recv() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_query_context`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_query_context() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_query_device_any`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_query_device_any() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_query_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_query_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_query_port`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_query_port() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_query_qp`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_query_qp() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_query_srq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_query_srq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_read_counters`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_read_counters() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_reg_dm_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_reg_dm_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_reg_dmabuf_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_reg_dmabuf_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_reg_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_reg_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_req_notify_cq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_req_notify_cq() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_rereg_mr`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_rereg_mr() -> c_int {
    libc::EOPNOTSUPP
}

/// Provider command `ibv_cmd_resize_cq`: no kernel: EOPNOTSUPP.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_cmd_resize_cq() -> c_int {
    libc::EOPNOTSUPP
}
