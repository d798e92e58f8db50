//! Device limits and QP capacity checks.

use srdma_proto::{CapsError, DeviceLimits, Mtu, QpCaps};

#[test]
fn defaults_are_rxe_like() {
    let l = DeviceLimits::default();
    assert_eq!(l.max_qp_wr, 16384);
    assert_eq!(l.max_send_sge, 32);
    assert_eq!(l.max_recv_sge, 32);
    assert_eq!(l.max_inline_data, 512);
    // Not rxe's 32767: libfabric's RDM endpoint asks for 65536 (see the field's doc).
    assert_eq!(l.max_cqe, 4194303);
    assert_eq!(l.max_qp_rd_atom, 128);
    assert_eq!(l.max_qp_init_rd_atom, 128);
    assert_eq!(l.max_srq_sge, 27);
    assert_eq!(l.port_max_mtu, Mtu::Mtu4096);
    assert_eq!(l.port_active_mtu, Mtu::Mtu1024);
    assert_eq!(l.pkey_tbl_len, 1);
    assert_eq!(l.phys_port_cnt, 1);
}

#[test]
fn caps_at_the_limits_pass() {
    let l = DeviceLimits::default();
    let caps = QpCaps {
        max_send_wr: l.max_qp_wr,
        max_recv_wr: l.max_qp_wr,
        max_send_sge: l.max_send_sge,
        max_recv_sge: l.max_recv_sge,
        max_inline_data: l.max_inline_data,
    };
    assert_eq!(caps.validate(&l, false), Ok(()));
    assert_eq!(QpCaps::default().validate(&l, false), Ok(()));
}

/// A change to one field of a capacity request.
type Edit = fn(&mut QpCaps);

#[test]
fn each_cap_over_its_limit_is_named() {
    let l = DeviceLimits::default();
    let base = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let cases: [(&str, Edit, u32, u32); 5] = [
        ("max_send_wr", |c| c.max_send_wr = 16385, 16385, 16384),
        ("max_recv_wr", |c| c.max_recv_wr = 16385, 16385, 16384),
        ("max_send_sge", |c| c.max_send_sge = 33, 33, 32),
        ("max_recv_sge", |c| c.max_recv_sge = 33, 33, 32),
        ("max_inline_data", |c| c.max_inline_data = 513, 513, 512),
    ];
    for (field, edit, value, max) in cases {
        let mut c = base;
        edit(&mut c);
        let err = c.validate(&l, false).unwrap_err();
        assert_eq!(err, CapsError::TooLarge { field, value, max });
        assert_eq!(
            err.to_string(),
            format!("{field} = {value} exceeds the device limit {max}")
        );
    }
}

#[test]
fn receive_caps_are_ignored_with_an_srq() {
    let l = DeviceLimits::default();
    let caps = QpCaps {
        max_recv_wr: u32::MAX,
        max_recv_sge: u32::MAX,
        ..QpCaps::default()
    };
    assert!(caps.validate(&l, false).is_err());
    assert_eq!(caps.validate(&l, true), Ok(()));
}
