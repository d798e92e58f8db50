//! What `libsrdma_rspreload.so` (crate srdma-rspreload, the library `srdma exec --rsockets`
//! preloads) and srdma's library pass each other. This one file is compiled into both.
//!
//! The preload library exports the C library's socket functions. It hands every call on a
//! descriptor this library marked (an rsocket, or an epoll set holding rsockets) to the
//! [`Hooks`] below, and every other call straight to the C library, found with
//! `dlsym(RTLD_NEXT)` ([`Real`], which this library uses for the kernel's side of the
//! descriptors it marked). Entry: `srdma_rspreload_init(VERSION, &real, &mut hooks)`,
//! exported by srdma's library, returns the marks (one byte per descriptor number, below
//! [`MARKS`]) or NULL when the versions differ.

#![allow(missing_docs, dead_code)]

use std::ffi::{c_int, c_ulong, c_void};

use libc::{msghdr, pollfd, sigset_t, sockaddr, socklen_t, timespec};

/// The version of this table; both sides must agree.
pub const VERSION: u32 = 1;

/// Descriptor numbers the marks cover (higher ones are never rsockets).
pub const MARKS: usize = 1 << 20;

/// A descriptor's mark: an rsocket of the application's.
pub const MARK_RSOCKET: u8 = 1;
/// A descriptor's mark: an epoll set that holds rsockets.
pub const MARK_EPOLL: u8 = 2;

/// The C library's functions.
#[repr(C)]
pub struct Real {
    pub socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    pub bind: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    pub listen: unsafe extern "C" fn(c_int, c_int) -> c_int,
    pub accept4: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int,
    pub connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    pub close: unsafe extern "C" fn(c_int) -> c_int,
    pub dup: unsafe extern "C" fn(c_int) -> c_int,
    pub dup2: unsafe extern "C" fn(c_int, c_int) -> c_int,
    pub dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    pub fcntl: unsafe extern "C" fn(c_int, c_int, ...) -> c_int,
    pub ioctl: unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int,
    pub getsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int,
    pub setsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int,
    pub getsockname: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    pub getpeername: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    pub shutdown: unsafe extern "C" fn(c_int, c_int) -> c_int,
    pub ppoll:
        unsafe extern "C" fn(*mut pollfd, libc::nfds_t, *const timespec, *const sigset_t) -> c_int,
    pub epoll_ctl: unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int,
    pub epoll_pwait:
        unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int, *const sigset_t) -> c_int,
    pub read: unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize,
    pub write: unsafe extern "C" fn(c_int, *const c_void, usize) -> isize,
    pub recvfrom: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        usize,
        c_int,
        *mut sockaddr,
        *mut socklen_t,
    ) -> isize,
    pub sendto: unsafe extern "C" fn(
        c_int,
        *const c_void,
        usize,
        c_int,
        *const sockaddr,
        socklen_t,
    ) -> isize,
    pub recvmsg: unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> isize,
    pub sendmsg: unsafe extern "C" fn(c_int, *const msghdr, c_int) -> isize,
    pub readv: unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize,
    pub writev: unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize,
    pub sendfile: unsafe extern "C" fn(c_int, c_int, *mut i64, usize) -> isize,
}

/// srdma's side: each function as the C library's of the same name (`select` as pselect6,
/// `poll` as ppoll, `epoll_wait` as `epoll_pwait`, `accept` as `accept4`), called for marked
/// descriptors (`socket` always, the multi-descriptor ones when any is marked).
#[repr(C)]
pub struct Hooks {
    pub socket: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    pub bind: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    pub listen: unsafe extern "C" fn(c_int, c_int) -> c_int,
    pub accept4: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int,
    pub connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
    pub close: unsafe extern "C" fn(c_int) -> c_int,
    pub dup: unsafe extern "C" fn(c_int) -> c_int,
    /// `dup2` (`flags` -1) and `dup3`.
    pub dup3: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    /// `fcntl` with its one argument as an integer or pointer-sized value.
    pub fcntl: unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int,
    pub ioctl: unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int,
    pub getsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int,
    pub setsockopt: unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int,
    pub getsockname: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    pub getpeername: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
    pub shutdown: unsafe extern "C" fn(c_int, c_int) -> c_int,
    /// `recv`, `recvfrom`, `read` (flags 0, no address).
    pub recvfrom: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        usize,
        c_int,
        *mut sockaddr,
        *mut socklen_t,
    ) -> isize,
    /// `send`, `sendto`, `write`.
    pub sendto: unsafe extern "C" fn(
        c_int,
        *const c_void,
        usize,
        c_int,
        *const sockaddr,
        socklen_t,
    ) -> isize,
    pub recvmsg: unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> isize,
    pub sendmsg: unsafe extern "C" fn(c_int, *const msghdr, c_int) -> isize,
    /// `readv` and `writev` (`write` true).
    pub rwv: unsafe extern "C" fn(c_int, *const libc::iovec, c_int, bool) -> isize,
    /// `poll` (NULL sigmask, timeout from milliseconds) and `ppoll`; `timeout` NULL: forever.
    pub ppoll:
        unsafe extern "C" fn(*mut pollfd, libc::nfds_t, *const timespec, *const sigset_t) -> c_int,
    /// `select` (`update` true: the timeout is updated with what is left, as Linux does)
    /// and `pselect`.
    pub pselect: unsafe extern "C" fn(
        c_int,
        *mut libc::fd_set,
        *mut libc::fd_set,
        *mut libc::fd_set,
        *mut timespec,
        *const sigset_t,
        bool,
    ) -> c_int,
    pub epoll_ctl: unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int,
    /// `epoll_wait`, `epoll_pwait` and `epoll_pwait2`; `timeout` NULL: forever.
    pub epoll_pwait2: unsafe extern "C" fn(
        c_int,
        *mut libc::epoll_event,
        c_int,
        *const timespec,
        *const sigset_t,
    ) -> c_int,
    /// `sendfile` and `sendfile64` with an rsocket to send to.
    pub sendfile: unsafe extern "C" fn(c_int, c_int, *mut i64, usize) -> isize,
}
