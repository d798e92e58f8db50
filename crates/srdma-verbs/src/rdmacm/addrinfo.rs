//! `rdma_getaddrinfo` and `rdma_freeaddrinfo`.

use super::*;

/// `rdma_getaddrinfo`: `getaddrinfo` turned into an `rdma_addrinfo` (the first answer),
/// with librdmacm's hint mapping (RC → stream/TCP, UD → datagram/UDP). Returns 0, or
/// getaddrinfo's error code.
///
/// # Safety
/// `node`/`service` NULL or C strings; `hints` NULL or valid; `res` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(err(libc::EIO), || {
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return err(libc::EINVAL);
        }
        // SAFETY: rdma_addrinfo is plain C data; calloc zeroes it.
        let rai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if rai.is_null() {
            return err(libc::ENOMEM);
        }
        // SAFETY: just allocated, zeroed.
        let r = unsafe { &mut *rai };
        // SAFETY: NULL or valid per the contract.
        let h = unsafe { hints.as_ref() };
        if !node.is_null() || !service.is_null() {
            // SAFETY: addrinfo is plain C data.
            let mut ai_h: libc::addrinfo = unsafe { std::mem::zeroed() };
            if let Some(h) = h {
                if h.ai_flags & RAI_PASSIVE != 0 {
                    ai_h.ai_flags |= libc::AI_PASSIVE;
                }
                if h.ai_flags & RAI_NUMERICHOST != 0 {
                    ai_h.ai_flags |= libc::AI_NUMERICHOST;
                }
                if h.ai_family == libc::AF_INET || h.ai_family == libc::AF_INET6 {
                    ai_h.ai_family = h.ai_family;
                } else if h.ai_flags & RAI_FAMILY == 0 {
                    ai_h.ai_family = libc::AF_UNSPEC;
                }
                ai_h.ai_socktype = match h.ai_qp_type as ibv_qp_type {
                    IBV_QPT_RC | IBV_QPT_UC => libc::SOCK_STREAM,
                    IBV_QPT_UD => libc::SOCK_DGRAM,
                    _ => 0,
                };
                ai_h.ai_protocol = match h.ai_port_space as rdma_port_space {
                    RDMA_PS_TCP => libc::IPPROTO_TCP,
                    RDMA_PS_UDP => libc::IPPROTO_UDP,
                    _ => 0,
                };
            }
            let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
            // SAFETY: C strings or NULL per the contract; `ai_h` and `ai` live locals.
            let ret = unsafe {
                libc::getaddrinfo(
                    node,
                    service,
                    if h.is_some() { &ai_h } else { std::ptr::null() },
                    &mut ai,
                )
            };
            if ret != 0 {
                // SAFETY: allocated above, nothing else in it yet.
                unsafe { libc::free(rai.cast()) };
                return ret;
            }
            // SAFETY: getaddrinfo succeeded: `ai` is a valid list.
            let a = unsafe { &*ai };
            r.ai_qp_type = match h.map_or(0, |h| h.ai_qp_type) {
                0 if a.ai_socktype == libc::SOCK_DGRAM => IBV_QPT_UD as c_int,
                0 => IBV_QPT_RC as c_int,
                t => t,
            };
            r.ai_port_space = match h.map_or(0, |h| h.ai_port_space) {
                0 if a.ai_protocol == libc::IPPROTO_UDP => RDMA_PS_UDP as c_int,
                0 => RDMA_PS_TCP as c_int,
                p => p,
            };
            r.ai_family = a.ai_family;
            // SAFETY: ai_addr is ai_addrlen readable bytes.
            let copy = unsafe { dup_bytes(a.ai_addr.cast(), a.ai_addrlen as usize) };
            let canon = if a.ai_canonname.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: a C string from getaddrinfo.
                unsafe { libc::strdup(a.ai_canonname) }
            };
            if a.ai_flags & libc::AI_PASSIVE != 0 {
                r.ai_flags = RAI_PASSIVE;
                r.ai_src_addr = copy.cast();
                r.ai_src_len = a.ai_addrlen;
                r.ai_src_canonname = canon;
            } else {
                r.ai_dst_addr = copy.cast();
                r.ai_dst_len = a.ai_addrlen;
                r.ai_dst_canonname = canon;
            }
            // SAFETY: the list getaddrinfo returned, freed once.
            unsafe { libc::freeaddrinfo(ai) };
        } else if let Some(h) = h {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
                // SAFETY: the hint's address, ai_dst_len bytes.
                r.ai_dst_addr =
                    unsafe { dup_bytes(h.ai_dst_addr.cast(), h.ai_dst_len as usize) }.cast();
                r.ai_dst_len = h.ai_dst_len;
            }
        }
        if let Some(h) = h {
            if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
                // SAFETY: the hint's address, ai_src_len bytes.
                r.ai_src_addr =
                    unsafe { dup_bytes(h.ai_src_addr.cast(), h.ai_src_len as usize) }.cast();
                r.ai_src_len = h.ai_src_len;
            }
        }
        // SAFETY: writable per the contract.
        unsafe { *res = rai };
        0
    })
}

/// A malloc'ed copy of `len` bytes at `p` (freed by [`rdma_freeaddrinfo`]).
///
/// # Safety
/// `p` is readable for `len` bytes.
unsafe fn dup_bytes(p: *const u8, len: usize) -> *mut u8 {
    // SAFETY: a fresh allocation of `len` bytes.
    let d = unsafe { libc::malloc(len.max(1)) }.cast::<u8>();
    if !d.is_null() {
        // SAFETY: both valid for `len` bytes, distinct.
        unsafe { std::ptr::copy_nonoverlapping(p, d, len) };
    }
    d
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` NULL or from [`rdma_getaddrinfo`], freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list of calloc'ed entries whose members are malloc'ed or NULL.
            unsafe {
                let r = &*p;
                let next = r.ai_next;
                for m in [
                    r.ai_connect,
                    r.ai_route,
                    r.ai_src_canonname.cast(),
                    r.ai_dst_canonname.cast(),
                    r.ai_src_addr.cast(),
                    r.ai_dst_addr.cast(),
                ] {
                    libc::free(m);
                }
                libc::free(p.cast());
                p = next;
            }
        }
    })
}
