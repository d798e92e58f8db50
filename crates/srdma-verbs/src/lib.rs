//! `libibverbs.so.1` on srdma: the C ABI of rdma-core 44 (Debian bookworm's libibverbs1), so
//! that unmodified verbs programs (ibv_devinfo, ibv_rc_pingpong, perftest, your own) run on
//! srdma without an RDMA NIC, the rxe module or any kernel RDMA support.
//!
//! Layers, top to bottom:
//! - the exported `ibv_*` functions (this crate's modules other than [`abi`]): the only
//!   place with raw pointers and `unsafe`, each behind [`guard`], the one panic boundary;
//! - [`abi`]: the structs, enums and function-pointer tables of `infiniband/verbs.h`, byte
//!   for byte (checked against the installed header by a unit test);
//! - the safe `srdma` API, which does the work.
//!
//! Every function is bound to the symbol version Debian's library gives it (`symbols.txt`,
//! turned into `.symver` directives and a version script by `build.rs`).

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

pub mod abi;
pub mod abi_core;
mod context;
mod stubs;
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
