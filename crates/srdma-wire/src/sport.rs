//! The RoCEv2 UDP source port: entropy for ECMP, the same in both directions of a connection.
//!
//! Linux (`rdma_get_udp_sport` in `include/rdma/ib_verbs.h`, used by rxe since commit
//! 104f062f): take the AV's 20-bit flow label, or if it is zero derive one from the QPN pair,
//! then fold it into 14 bits and put it in 0xC000..=0xFFFF.

/// Flow label derived from a QP pair (`rdma_calc_flow_label`). Symmetric in its arguments.
pub const fn calc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = (lqpn as u64) * (rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// Folds a 20-bit flow label into a source port in 0xC000..=0xFFFF
/// (`rdma_flow_label_to_udp_sport`).
pub const fn flow_label_to_udp_sport(fl: u32) -> u16 {
    let mut lo = fl & 0x3FFF;
    let hi = fl & 0xF_C000;
    lo ^= hi >> 14;
    (lo | 0xC000) as u16
}

/// The source port rxe uses on a connected QP: from the AV flow label when non-zero, else
/// from the QPN pair.
pub const fn udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label & 0xF_FFFF != 0 {
        flow_label & 0xF_FFFF
    } else {
        calc_flow_label(lqpn, rqpn)
    };
    flow_label_to_udp_sport(fl)
}

/// The source port rxe uses before the QP has an address vector:
/// `0xC000 + (hash_32(qpn, 14) & 0x3FFF)`.
pub const fn udp_sport_unconnected(qpn: u32) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61C8_8647;
    let h = qpn.wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14);
    0xC000 + (h & 0x3FFF) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_ports_seen_from_rxe() {
        // Source ports in the rxe captures (rxe-lab README): 49441 for QPNs 0x11/0x11,
        // 49476 for 0x12/0x12, 51889 for 0x11/0xa1.
        assert_eq!(udp_sport(0, 0x11, 0x11), 49441);
        assert_eq!(udp_sport(0, 0x12, 0x12), 49476);
        assert_eq!(udp_sport(0, 0x11, 0xa1), 51889);
        assert_eq!(udp_sport(0, 0xa1, 0x11), 51889);
        assert!(udp_sport_unconnected(17) >= 0xC000);
    }
}
