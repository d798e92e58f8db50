//! Multicast (RoCEv2, IPv4 groups, as kernel rdma_cm's cma_iboe_join_multicast).

use super::event::{event, with_ud};
use super::*;

/// A group an id joined.
pub(super) struct Joined {
    /// The group's address.
    pub(super) ip: IpAddr,
    /// Joined send-only (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`): the QP is not attached.
    pub(super) send_only: bool,
}

/// The kernel's ENOTSUPP (not a userspace errno; what `rdma_join_multicast` of an IPv6
/// group on a RoCEv2 port fails with).
const ENOTSUPP: c_int = 524;

/// `rdma_join_multicast`: joins the group at `addr` as a full member (see
/// [`rdma_join_multicast_ex`]).
///
/// # Safety
/// `id` NULL or live; `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let (Some(me), Some(a)) = (unsafe { id_of(id) }, unsafe { read_addr(addr) }) else {
            return err(libc::EINVAL);
        };
        join(me, a.ip(), false, context)
    })
}

/// `rdma_join_multicast_ex`: joins an IPv4 multicast group on the id's device, as kernel
/// rdma_cm does on a RoCEv2 port. The id must have a device (bound to an address or
/// resolved) and be neither listening nor connecting (EINVAL). The group's GID is its
/// IPv4-mapped address. RDMA_CM_EVENT_MULTICAST_JOIN follows, with `param.ud` as the
/// kernel gives it (address handle attributes toward the group, hop limit 64, QPN
/// 0xFFFFFF, Q_Key 0x01234567 in the UDP port space) and `private_data` = `context`; when
/// the application takes it, a full member's QP (`id->qp`, if it has one by then) is
/// attached to the group (`ibv_attach_mcast`: the device joins the group on its
/// interface), a send-only member's is not; a QP that cannot be attached makes the event
/// RDMA_CM_EVENT_MULTICAST_ERROR with status -errno. Errors: a
/// `comp_mask` bit librdmacm does not know: EOPNOTSUPP; no address or join flags, an
/// unknown flag, the zero address, a unicast address: EINVAL; an IPv6 group: ENOTSUPP
/// (524, the kernel's answer on RoCEv2).
///
/// # Safety
/// `id` NULL or live; `mc_join_attr` NULL or valid, its `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let Some(me) = (unsafe { id_of(id) }) else {
            return err(libc::EINVAL);
        };
        if mc_join_attr.is_null() {
            return err(libc::EINVAL);
        }
        // SAFETY: non-NULL, valid per the contract.
        let m = unsafe { &*mc_join_attr };
        if m.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return err(libc::EOPNOTSUPP);
        }
        if m.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || m.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || m.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        let Some(a) = (unsafe { read_addr(m.addr) }) else {
            return err(libc::EINVAL);
        };
        let send_only = m.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
        join(me, a.ip(), send_only, context)
    })
}

fn join(me: &mut Id, ip: IpAddr, send_only: bool, context: *mut c_void) -> c_int {
    let dev = {
        let st = lock(&me.sh.st);
        if st.listening || st.connecting {
            return err(libc::EINVAL);
        }
        st.dev
    };
    let Some(d) = dev else {
        return err(libc::EINVAL);
    };
    let v4 = match ip {
        IpAddr::V6(_) => return err(ENOTSUPP),
        IpAddr::V4(v4) => v4,
    };
    if !v4.is_multicast() || !cm_devs()[d].addr.is_ipv4() {
        return err(libc::EINVAL);
    }
    let gid = Gid::from_ip(ip);
    let qkey = if me.c.ps == RDMA_PS_UDP {
        RDMA_UDP_QKEY
    } else {
        0
    };
    let mut ev = with_ud(
        event(me.ptr() as usize, RDMA_CM_EVENT_MULTICAST_JOIN, 0),
        Some(gid),
        srdma_wire::Qpn::MULTICAST.value(),
        qkey,
        &[],
    );
    // librdmacm hands the join's context back as the event's private data.
    ev.c.param.ud.private_data = context.cast_const();
    if !send_only {
        ev.attach = Some(gid);
    }
    lock(&me.sh.st).joined.push(Joined { ip, send_only });
    me.sh.push(ev);
    me.complete()
}

/// `rdma_leave_multicast`: leaves a group the id joined, detaching its QP (a full member's).
/// EADDRNOTAVAIL when the id did not join `addr`; EINVAL for NULL.
///
/// # Safety
/// `id` NULL or live; `addr` NULL or a valid sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard(err(libc::EIO), || {
        // SAFETY: per the contract.
        let (Some(me), Some(a)) = (unsafe { id_of(id) }, unsafe { read_addr(addr) }) else {
            return err(libc::EINVAL);
        };
        let left = {
            let mut st = lock(&me.sh.st);
            match st.joined.iter().position(|j| j.ip == a.ip()) {
                Some(i) => st.joined.remove(i),
                None => return err(libc::EADDRNOTAVAIL),
            }
        };
        if !left.send_only && !me.c.qp.is_null() {
            detach(me.c.qp, left.ip);
        }
        0
    })
}

/// Detaches `qp` from group `ip` (an error, a QP not attached, changes nothing).
pub(super) fn detach(qp: *mut ibv_qp, ip: IpAddr) {
    let g = ibv_gid {
        raw: Gid::from_ip(ip).0,
    };
    // SAFETY: a live QP of an id and a live GID.
    unsafe { crate::verbs::ibv_detach_mcast(qp, &g, 0) };
}
