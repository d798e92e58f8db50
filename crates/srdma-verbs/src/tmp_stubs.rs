//! Temporary until stubs.rs lands.
use std::ffi::{c_char, c_int, c_void};

/// tmp
#[unsafe(no_mangle)]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    let s: &'static std::ffi::CStr = match status {
        0 => c"success",
        5 => c"Work Request Flushed Error",
        _ => c"unknown",
    };
    s.as_ptr()
}
/// tmp
#[unsafe(no_mangle)]
pub extern "C" fn ibv_read_sysfs_file(
    _d: *const c_char,
    _f: *const c_char,
    _b: *mut c_char,
    _s: usize,
) -> c_int {
    crate::set_errno(libc::ENOENT);
    -1
}
/// tmp
#[unsafe(no_mangle)]
pub extern "C" fn ibv_attach_mcast(_q: *mut c_void, _g: *const c_void, _l: u16) -> c_int {
    libc::EOPNOTSUPP
}
/// tmp
#[unsafe(no_mangle)]
pub extern "C" fn ibv_detach_mcast(_q: *mut c_void, _g: *const c_void, _l: u16) -> c_int {
    libc::EOPNOTSUPP
}
