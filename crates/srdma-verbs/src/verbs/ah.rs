//! Address handles, and the ones made from a completion.

use super::*;

/// An `ibv_ah`.
#[repr(C)]
pub(super) struct Ah {
    pub(super) c: ibv_ah,
    pub(super) attr: AhAttr,
}

pub(super) fn ah_attr(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: a.grh.dgid.raw,
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        is_global: a.is_global != 0,
        sl: a.sl,
        port_num: a.port_num,
        ..AhAttr::default()
    }
}

pub(super) fn ah_attr_to_c(a: &AhAttr, out: &mut ibv_ah_attr) {
    out.grh.dgid.raw = a.dgid;
    out.grh.flow_label = a.flow_label;
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = a.hop_limit;
    out.grh.traffic_class = a.traffic_class;
    out.is_global = u8::from(a.is_global);
    out.sl = a.sl;
    out.port_num = a.port_num;
    out.dlid = 0;
}

/// `ibv_create_ah`: EINVAL without a GRH (`is_global = 0`), as on any RoCE device, or with a
/// source GID index past the table; ENODATA for an empty entry (the kernel's answers).
///
/// # Safety
/// `pd` NULL or live; `attr` NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: readable per the contract.
        let a = unsafe { &*attr };
        if a.is_global == 0 || a.port_num != 1 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: a live PD's context is open.
        let ctx = unsafe { Context::from_c(p.c.context) };
        if let Some(e) = ctx.and_then(|c| crate::context::sgid_index_errno(c, a.grh.sgid_index)) {
            set_errno(e);
            return std::ptr::null_mut();
        }
        let c = ibv_ah {
            context: p.c.context,
            pd,
            handle: 0,
        };
        pd_users(pd, 1);
        hand_out(Ah {
            c,
            attr: ah_attr(a),
        })
    })
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// `ah` NULL or live, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: live objects came from hand_out::<Ah>.
        let Some(a) = (unsafe { take_back::<Ah, _>(ah) }) else {
            return libc::EINVAL;
        };
        pd_users(a.c.pd, -1);
        0
    })
}

/// `ibv_init_ah_from_wc`: the address handle attributes that answer the sender of a UD
/// receive completion, from the GRH in the first 40 bytes of the receive buffer (an IPv4
/// header in its last 20 bytes for IPv4 peers, as rxe writes it).
///
/// # Safety
/// `context` open; `wc` and `grh` readable; `ah_attr` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let ok = unsafe { Context::from_c(context) }.is_some();
        if !ok || wc.is_null() || grh.is_null() || ah_attr.is_null() || port_num != 1 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: readable per the contract.
        let (w, g) = unsafe { (&*wc, &*grh) };
        if w.wc_flags & IBV_WC_GRH == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the GRH area is 40 readable bytes.
        let bytes: [u8; 40] = unsafe { std::ptr::read_unaligned(grh.cast()) };
        let _ = g;
        let mut a = AhAttr::default();
        // An IPv4 header (version 4, IHL 5) in the last 20 bytes; else an IPv6 header.
        if bytes[20] == 0x45 {
            let mut src = [0u8; 4];
            src.copy_from_slice(&bytes[32..36]);
            a.dgid = std::net::Ipv4Addr::from(src).to_ipv6_mapped().octets();
            a.traffic_class = bytes[21];
            a.hop_limit = 0xff;
        } else {
            a.dgid.copy_from_slice(&bytes[8..24]);
            a.traffic_class = ((bytes[0] & 0x0f) << 4) | (bytes[1] >> 4);
            a.flow_label = u32::from_be_bytes([0, bytes[1] & 0x0f, bytes[2], bytes[3]]);
            a.hop_limit = 0xff;
        }
        a.sl = w.sl;
        a.port_num = port_num;
        a.sgid_index = 0;
        // SAFETY: writable per the contract.
        let out = unsafe { &mut *ah_attr };
        // SAFETY: plain C data; all zeroes is valid.
        *out = unsafe { std::mem::zeroed() };
        ah_attr_to_c(&a, out);
        // The reply leaves from our address: pick the GID index that holds it.
        // SAFETY: context is open (checked above).
        if let Some(ctx) = unsafe { Context::from_c(context) } {
            let local = srdma::Gid::from_ip(ctx.entry.cfg.addr);
            let gids = ctx.entry.cfg.gids_on(ctx.entry.cfg.port);
            out.grh.sgid_index = gids.iter().position(|g| *g == local).unwrap_or(0) as u8;
        }
        0
    })
}

/// `ibv_create_ah_from_wc`: [`ibv_init_ah_from_wc`] then [`ibv_create_ah`].
///
/// # Safety
/// As both.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: per the contract.
        let Some(p) = (unsafe { back::<Pd, _>(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // SAFETY: plain C data; all zeroes is valid.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: forwarded under the same contract.
        if unsafe { ibv_init_ah_from_wc(p.c.context, port_num, wc, grh, &mut attr) } != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: `attr` is a live local.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}
