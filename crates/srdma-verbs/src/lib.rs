//! `libibverbs.so.1` on srdma: the C ABI of rdma-core 44 (Debian bookworm's libibverbs1), so
//! that unmodified verbs programs (ibv_devinfo, ibv_rc_pingpong, perftest, your own) run on
//! srdma without an RDMA NIC, the rxe module or any kernel RDMA support.
//!
//! Layers, top to bottom:
//! - the exported `ibv_*` functions (`context`, `verbs`, `unsupported`): the only place
//!   with raw pointers and `unsafe`, each behind `guard`, the one panic boundary;
//! - [`abi_core`]: the structs, enums and function-pointer tables of `infiniband/verbs.h`,
//!   byte for byte (checked against the installed header by a unit test);
//! - the safe `srdma` API, which does the work.
//!
//! The same file is `librdmacm.so.1` too (`rdmacm`: rdma_cm over IB CM MADs on QP1, with the
//! list of what it implements).
//!
//! It also serves `srdma exec --rsockets` (`preload`: unmodified socket programs' TCP sockets
//! on rsockets, through `libsrdma_rspreload.so`, crate srdma-rspreload, which calls the one
//! entry `srdma_rspreload_init`, symbol version `SRDMA_PRIVATE_1`).
//!
//! The modules depend one way: `abi_core` ← `context` (devices, contexts) ← `verbs` (the
//! objects; it opens contexts, giving them its entries) ← `rdmacm` ← `rsocket` ← `preload`. What a
//! lower layer must tell a higher one goes through a hook the higher one registers
//! (`verbs::on_qp_destroyed`, through which rdma_cm connections let go of a destroyed QP).
//!
//! Every function is bound to the symbol version Debian's library gives it (`symbols.txt`,
//! turned into `.symver` directives and a version script by `build.rs`).
//!
//! # What is implemented
//!
//! - Implemented: `ibv_get_device_list`, `ibv_free_device_list`, `ibv_get_device_name`,
//!   `ibv_get_device_guid`, `ibv_get_device_index`, `ibv_open_device`, `ibv_close_device`,
//!   `ibv_query_device` (and `ibv_query_device_ex` through `verbs_context`),
//!   `ibv_query_port` (both forms), `ibv_query_gid`, `ibv_query_gid_ex`,
//!   `ibv_query_gid_table`, `ibv_query_gid_type`, `ibv_query_pkey`, `ibv_get_pkey_index`,
//!   `ibv_alloc_pd`, `ibv_dealloc_pd`, `ibv_reg_mr`, `ibv_reg_mr_iova`, `ibv_reg_mr_iova2`
//!   (the application's own memory, at its address or the iova given), `ibv_dereg_mr`,
//!   `ibv_create_comp_channel`, `ibv_destroy_comp_channel`, `ibv_create_cq`,
//!   `ibv_destroy_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events`, `ibv_poll_cq`,
//!   `ibv_req_notify_cq`, `ibv_create_qp` (RC, UC, UD), `ibv_modify_qp`, `ibv_query_qp`,
//!   `ibv_destroy_qp`, `ibv_post_send` (SEND, SEND with immediate, SEND with invalidate,
//!   WRITE, WRITE with immediate, READ, compare-and-swap, fetch-and-add, bind MW, local
//!   invalidate; inline), `ibv_post_recv`,
//!   `ibv_create_srq`, `ibv_modify_srq` (the limit), `ibv_query_srq`, `ibv_destroy_srq`,
//!   `ibv_post_srq_recv`, `ibv_create_ah`, `ibv_destroy_ah`, `ibv_init_ah_from_wc`,
//!   `ibv_create_ah_from_wc`, `ibv_get_async_event`, `ibv_ack_async_event` (CQ error, QP
//!   fatal, last WQE reached, device fatal, port active; as with rdma-core, destroying a QP
//!   or CQ drops its events not yet taken and waits until those taken are acknowledged),
//!   `ibv_fork_init`,
//!   `ibv_is_fork_initialized`, `ibv_dontfork_range`, `ibv_dofork_range`,
//!   `ibv_query_qp_data_in_order`, `ibv_attach_mcast`/`ibv_detach_mcast` (UD multicast:
//!   the device joins the group, see [`srdma::Qp::attach_mcast`]), the `*_str` functions and
//!   the rate conversions; through
//!   `verbs_context`, `ibv_create_cq_ex` (standard `IBV_WC_EX_WITH_*` fields) with
//!   `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and the `ibv_wc_read_*` functions, and
//!   `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, `ibv_qp_to_qp_ex` and the
//!   `ibv_wr_*` API (WRITE, WRITE with immediate, SEND, SEND with immediate, SEND with
//!   invalidate, READ, compare-and-swap, fetch-and-add, `ibv_wr_bind_mw`,
//!   `ibv_wr_local_inv`, `ibv_wr_atomic_write` (IBTA 1.5 RDMA ATOMIC WRITE, RC); SGEs,
//!   inline data, UD addresses, `ibv_wr_set_xrc_srqn`); XRC: `ibv_open_xrcd` (a file
//!   shares the domain within the process) and `ibv_close_xrcd`, `ibv_create_srq_ex`
//!   (`IBV_SRQT_XRC` with PD, domain and CQ; basic SRQs), `ibv_get_srq_num`,
//!   `IBV_QPT_XRC_SEND` QPs (`ibv_create_qp`/`ibv_create_qp_ex`,
//!   `wr.qp_type.xrc.remote_srqn` in `ibv_post_send`) and `IBV_QPT_XRC_RECV` QPs
//!   (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_XRCD`); memory windows as rxe has them:
//!   `IBV_ACCESS_MW_BIND` on `ibv_reg_mr`, `ibv_alloc_mw` (type 1 and 2B; another type
//!   EINVAL), `ibv_dealloc_mw`, `ibv_bind_mw` (type 1, through `ibv_context_ops.bind_mw`),
//!   `IBV_WC_BIND_MW`/`IBV_WC_LOCAL_INV` completions and `IBV_WC_WITH_INV` with the
//!   invalidated R_Key on the receiver; a window's R_Key is checked for RDMA READ, WRITE and
//!   atomics (bound, PD, type 2's QP, range, rights: remote access error otherwise), and
//!   `ibv_dereg_mr`/`ibv_rereg_mr` refuse a region with windows bound (EINVAL);
//!   `ibv_resize_cq`
//!   (rxe's bounds: not below the completions waiting); `ibv_rereg_mr` (PD, translation and
//!   access, the keys kept, as rxe's and mlx5's); `ibv_query_device_ex` with
//!   `phys_port_cnt_ex`; the access flags' optional range (relaxed ordering) accepted and
//!   ignored, as rxe.
//! - Stubbed, with rdma-core's answer for a provider without the feature: `ibv_reg_dmabuf_mr`,
//!   `ibv_query_ece`/`ibv_set_ece`, `ibv_import_*`,
//!   `ibv_resolve_eth_l2_from_gid` (EOPNOTSUPP); `ibv_read_sysfs_file` (-1, ENOENT); the
//!   `ibv_copy_*_kern` conversions (no-ops: only librdmacm's kernel path calls them); every
//!   `IBVERBS_PRIVATE_34` provider helper (`ibv_cmd_*` EOPNOTSUPP, registration no-ops) so
//!   that libmlx5.so.1 and libefa.so.1, which perftest links, load.
//! - Missing (their `verbs_context` slots are NULL, so the inline wrappers of verbs.h fail
//!   with EOPNOTSUPP): completion timestamps (`ibv_rc_pingpong -t` says the device is not
//!   capable, as on rxe), `ibv_wr_send_tso`, `ibv_open_qp` (sharing an XRC target QP),
//!   tag-matching SRQs, zero-based memory windows (EINVAL at bind, as rxe for type 1), work
//!   queues and RSS, flow steering, device memory, counters, thread domains and parent domains, `ibv_modify_cq`,
//!   `ibv_advise_mr`; on-demand paging (`IBV_ACCESS_ON_DEMAND`: EOPNOTSUPP).
//!
//! Pointers: every call except the data path (`ibv_post_*`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`, inline in the application, unchecked as in rdma-core) checks that
//! the object it is given is one this library handed out and has not destroyed: NULL, a
//! double destroy or a stale pointer gets EINVAL, not a crash.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

pub mod abi_core;
pub mod cma_abi;
mod context;
#[cfg(test)]
mod layout_check;
mod preload;
mod rdmacm;
mod rsocket;
mod signals;
mod unsupported;
mod verbs;

#[cfg(not(test))]
include!(concat!(env!("OUT_DIR"), "/symver.rs"));

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location always returns the calling thread's valid errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The panic boundary: runs `f`; if it panics, sets `errno` to `EIO` and returns `on_panic`
/// (an errno for functions that return one, NULL for those that return a pointer). No panic
/// unwinds into C.
pub(crate) fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// The errno rdma-core (with the rxe provider) returns for what `e` describes.
pub(crate) fn errno_of(e: &srdma::Error) -> i32 {
    use srdma_proto::{MrError, PostError};
    match e {
        srdma::Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        srdma::Error::Post(PostError::QueueFull { .. }) => libc::ENOMEM,
        srdma::Error::Mr(MrError::TableFull { .. }) | srdma::Error::Exhausted(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// The objects this library handed out and that are still alive, by address: calls that
/// take an object check it here, so NULL, stale (destroyed) and foreign pointers get EINVAL
/// instead of a crash. The data path (`ibv_post_*`, `ibv_poll_cq`, `ibv_req_notify_cq`),
/// inline in the application, skips the check, as rdma-core's does.
static LIVE: std::sync::Mutex<std::collections::BTreeSet<usize>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<usize>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records a new object.
pub(crate) fn register<T>(p: *const T) {
    live().insert(p as usize);
}

/// Forgets an object being destroyed; false if it was not alive (NULL, stale, foreign).
pub(crate) fn unregister<T>(p: *const T) -> bool {
    live().remove(&(p as usize))
}

/// Whether `p` is an object this library handed out and has not destroyed.
pub(crate) fn is_live<T>(p: *const T) -> bool {
    !p.is_null() && live().contains(&(p as usize))
}
