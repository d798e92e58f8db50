//! `ibv_modify_qp` rules: the transition table, required/optional attributes named in errors,
//! and the value checks.

use srdma_proto::qp::{check_sq_drain, transition_rule};
use srdma_proto::{
    AccessError, AccessFlags, AttrMask, DeviceLimits, ModifyError, Mtu, QpAttr, QpState, QpType,
    validate_modify,
};
use srdma_wire::{Psn, Qpn};

use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};

/// `QpState::Err` under a name that does not shadow `Result::Err`.
const ERR: QpState = QpState::Err;

/// The legal (from, to) pairs, written out independently of the implementation from Linux
/// `drivers/infiniband/core/verbs.c qp_state_table` (identical for RC, UC and UD).
const LEGAL: &[(QpState, QpState)] = &[
    (Reset, Reset),
    (Reset, Init),
    (Init, Reset),
    (Init, ERR),
    (Init, Init),
    (Init, Rtr),
    (Rtr, Reset),
    (Rtr, ERR),
    (Rtr, Rts),
    (Rts, Reset),
    (Rts, ERR),
    (Rts, Rts),
    (Rts, Sqd),
    (Sqd, Reset),
    (Sqd, ERR),
    (Sqd, Rts),
    (Sqd, Sqd),
    (Sqe, Reset),
    (Sqe, ERR),
    (Sqe, Rts),
    (ERR, Reset),
    (ERR, ERR),
];

fn limits() -> DeviceLimits {
    DeviceLimits::default()
}

/// A valid attribute set for a QP currently in `from`, moving to `to`.
fn attr(from: QpState, to: QpState) -> QpAttr {
    QpAttr {
        qp_state: to,
        cur_qp_state: from,
        qkey: 0x1111_1111,
        rq_psn: Psn::new(0x123),
        sq_psn: Psn::new(0x456),
        dest_qp_num: Qpn::new(0x11),
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ..QpAttr::default()
    }
}

fn named_bits(mask: AttrMask) -> impl Iterator<Item = (&'static str, AttrMask)> {
    mask.iter_names()
}

#[test]
fn legal_pairs_match_the_kernel_table_for_every_type() {
    for t in QpType::ALL {
        for from in QpState::ALL {
            for to in QpState::ALL {
                assert_eq!(
                    transition_rule(t, from, to).is_some(),
                    LEGAL.contains(&(from, to)),
                    "{t} {from}->{to}"
                );
            }
        }
    }
}

#[test]
fn every_illegal_pair_is_rejected_with_illegal_transition() {
    let mut rejected = 0;
    for t in QpType::ALL {
        for from in QpState::ALL {
            for to in QpState::ALL {
                if LEGAL.contains(&(from, to)) {
                    continue;
                }
                // STATE alone, and STATE with everything the table could ever want: the
                // transition itself is refused before any attribute is looked at.
                for mask in [AttrMask::STATE, AttrMask::all() - AttrMask::RATE_LIMIT] {
                    let err = validate_modify(t, from, &attr(from, to), mask, &limits());
                    assert_eq!(
                        err,
                        Err(ModifyError::IllegalTransition {
                            qp_type: t,
                            from,
                            to
                        }),
                        "{t} {from}->{to} mask {mask}"
                    );
                }
                rejected += 1;
            }
        }
    }
    assert_eq!(rejected, 3 * (49 - LEGAL.len()));
}

#[test]
fn reset_to_err_is_illegal_as_in_linux() {
    for t in QpType::ALL {
        let err = validate_modify(t, Reset, &attr(Reset, ERR), AttrMask::STATE, &limits());
        assert!(matches!(err, Err(ModifyError::IllegalTransition { .. })));
    }
}

#[test]
fn nothing_enters_sqe_by_modify() {
    for t in QpType::ALL {
        for from in QpState::ALL {
            assert!(transition_rule(t, from, Sqe).is_none(), "{t} {from}->SQE");
        }
    }
}

#[test]
fn to_reset_and_to_err_take_state_only() {
    for t in QpType::ALL {
        for from in QpState::ALL {
            for to in [Reset, ERR] {
                let Some(rule) = transition_rule(t, from, to) else {
                    continue;
                };
                assert!(rule.required.is_empty() && rule.optional.is_empty());
                assert_eq!(
                    validate_modify(t, from, &attr(from, to), AttrMask::STATE, &limits()),
                    Ok(to)
                );
                // Anything more is unexpected.
                let err = validate_modify(
                    t,
                    from,
                    &attr(from, to),
                    AttrMask::STATE | AttrMask::QKEY,
                    &limits(),
                );
                assert!(
                    matches!(
                        err,
                        Err(ModifyError::UnexpectedAttribute { attr: "QKEY", .. })
                    ),
                    "{t} {from}->{to}: {err:?}"
                );
            }
        }
    }
}

/// The required masks of the connection path, from `ibv_modify_qp(3)`.
#[test]
fn required_attributes_of_the_connection_path_match_the_man_page() {
    use AttrMask as M;
    let cases = [
        (
            QpType::Rc,
            Reset,
            Init,
            M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        ),
        (
            QpType::Uc,
            Reset,
            Init,
            M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        ),
        (QpType::Ud, Reset, Init, M::PKEY_INDEX | M::PORT | M::QKEY),
        (
            QpType::Rc,
            Init,
            Rtr,
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        ),
        (
            QpType::Uc,
            Init,
            Rtr,
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
        ),
        (QpType::Ud, Init, Rtr, M::empty()),
        (
            QpType::Rc,
            Rtr,
            Rts,
            M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        ),
        (QpType::Uc, Rtr, Rts, M::SQ_PSN),
        (QpType::Ud, Rtr, Rts, M::SQ_PSN),
    ];
    for (t, from, to, required) in cases {
        let rule = transition_rule(t, from, to).unwrap();
        assert_eq!(rule.required, required, "{t} {from}->{to}");
    }
}

#[test]
fn every_required_attribute_when_removed_is_named() {
    let mut checked = 0;
    for t in QpType::ALL {
        for &(from, to) in LEGAL {
            let rule = transition_rule(t, from, to).unwrap();
            let full = AttrMask::STATE | rule.required;
            assert_eq!(
                validate_modify(t, from, &attr(from, to), full, &limits()),
                Ok(to),
                "{t} {from}->{to} with exactly the required attributes"
            );
            for (name, bit) in named_bits(rule.required) {
                let err = validate_modify(t, from, &attr(from, to), full - bit, &limits());
                assert_eq!(
                    err,
                    Err(ModifyError::MissingAttribute {
                        qp_type: t,
                        from,
                        to,
                        attr: name,
                        missing: bit
                    }),
                    "{t} {from}->{to} without {name}"
                );
                checked += 1;
            }
        }
    }
    // RC: 3 + 6 + 5, UC: 3 + 4 + 1, UD: 3 + 0 + 1.
    assert_eq!(checked, 26);
}

#[test]
fn all_missing_attributes_are_reported_and_the_message_names_them() {
    let err = validate_modify(
        QpType::Rc,
        Init,
        &attr(Init, Rtr),
        AttrMask::STATE,
        &limits(),
    )
    .unwrap_err();
    let ModifyError::MissingAttribute {
        attr: name,
        missing,
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    assert_eq!(name, "AV");
    assert_eq!(
        missing,
        transition_rule(QpType::Rc, Init, Rtr).unwrap().required
    );
    assert_eq!(
        err.to_string(),
        "RC INIT->RTR requires AV (missing: AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|\
         MAX_DEST_RD_ATOMIC|DEST_QPN)"
    );

    let mask = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    let err = validate_modify(QpType::Rc, Init, &attr(Init, Rtr), mask, &limits()).unwrap_err();
    assert!(err.to_string().contains("requires PATH_MTU"), "{err}");
}

#[test]
fn every_optional_attribute_is_accepted() {
    for t in QpType::ALL {
        for &(from, to) in LEGAL {
            let rule = transition_rule(t, from, to).unwrap();
            for (name, bit) in named_bits(rule.optional) {
                let mask = AttrMask::STATE | rule.required | bit;
                let res = validate_modify(t, from, &attr(from, to), mask, &limits());
                if bit == AttrMask::ALT_PATH {
                    assert_eq!(
                        res,
                        Err(ModifyError::Unsupported { attr: "ALT_PATH" }),
                        "{t} {from}->{to}"
                    );
                } else {
                    assert_eq!(res, Ok(to), "{t} {from}->{to} with optional {name}");
                }
            }
        }
    }
}

#[test]
fn every_attribute_outside_the_rule_is_unexpected() {
    let mut checked = 0;
    for t in QpType::ALL {
        for &(from, to) in LEGAL {
            let rule = transition_rule(t, from, to).unwrap();
            let outside = AttrMask::all() - rule.required - rule.optional - AttrMask::STATE;
            for (name, bit) in named_bits(outside) {
                let mask = AttrMask::STATE | rule.required | bit;
                let err = validate_modify(t, from, &attr(from, to), mask, &limits());
                assert_eq!(
                    err,
                    Err(ModifyError::UnexpectedAttribute {
                        qp_type: t,
                        from,
                        to,
                        attr: name,
                        unexpected: bit
                    }),
                    "{t} {from}->{to} with {name}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 300, "{checked}");
}

#[test]
fn typical_attributes_of_other_types_are_unexpected() {
    // QKEY is a UD attribute: an RC QP refuses it at RESET->INIT.
    let mask = AttrMask::STATE
        | AttrMask::PKEY_INDEX
        | AttrMask::PORT
        | AttrMask::ACCESS_FLAGS
        | AttrMask::QKEY;
    let err = validate_modify(QpType::Rc, Reset, &attr(Reset, Init), mask, &limits());
    assert!(matches!(
        err,
        Err(ModifyError::UnexpectedAttribute { attr: "QKEY", .. })
    ));
    // UD has no access flags.
    let mask = AttrMask::STATE
        | AttrMask::PKEY_INDEX
        | AttrMask::PORT
        | AttrMask::QKEY
        | AttrMask::ACCESS_FLAGS;
    let err = validate_modify(QpType::Ud, Reset, &attr(Reset, Init), mask, &limits());
    assert!(matches!(
        err,
        Err(ModifyError::UnexpectedAttribute {
            attr: "ACCESS_FLAGS",
            ..
        })
    ));
    // UC has no RDMA READ / atomic responder resources.
    let rule = transition_rule(QpType::Uc, Init, Rtr).unwrap();
    let mask = AttrMask::STATE | rule.required | AttrMask::MAX_DEST_RD_ATOMIC;
    let err = validate_modify(QpType::Uc, Init, &attr(Init, Rtr), mask, &limits());
    assert!(matches!(
        err,
        Err(ModifyError::UnexpectedAttribute {
            attr: "MAX_DEST_RD_ATOMIC",
            ..
        })
    ));
    // CAP is never accepted by modify.
    let err = validate_modify(
        QpType::Rc,
        Rts,
        &attr(Rts, Rts),
        AttrMask::STATE | AttrMask::CAP,
        &limits(),
    );
    assert!(matches!(
        err,
        Err(ModifyError::UnexpectedAttribute { attr: "CAP", .. })
    ));
}

#[test]
fn modify_without_state_is_a_self_transition() {
    // RTS with only MIN_RNR_TIMER: RTS->RTS allows it.
    assert_eq!(
        validate_modify(
            QpType::Rc,
            Rts,
            &attr(Rts, Rts),
            AttrMask::MIN_RNR_TIMER,
            &limits()
        ),
        Ok(Rts)
    );
    // RTR has no RTR->RTR entry, so any modify without STATE is refused.
    assert_eq!(
        validate_modify(
            QpType::Rc,
            Rtr,
            &attr(Rtr, Rtr),
            AttrMask::MIN_RNR_TIMER,
            &limits()
        ),
        Err(ModifyError::IllegalTransition {
            qp_type: QpType::Rc,
            from: Rtr,
            to: Rtr
        })
    );
    // `qp_state` is ignored without STATE.
    let mut a = attr(Init, Init);
    a.qp_state = ERR;
    assert_eq!(
        validate_modify(QpType::Ud, Init, &a, AttrMask::QKEY, &limits()),
        Ok(Init)
    );
}

#[test]
fn unknown_mask_bits_are_refused() {
    let mask = AttrMask::from_bits_retain(AttrMask::STATE.bits() | 1 << 30);
    assert_eq!(
        validate_modify(QpType::Rc, Init, &attr(Init, ERR), mask, &limits()),
        Err(ModifyError::UnknownMaskBits { bits: 1 << 30 })
    );
}

#[test]
fn cur_state_must_match_when_given() {
    let mask = AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::CUR_STATE;
    let good = attr(Rtr, Rts);
    assert_eq!(
        validate_modify(QpType::Ud, Rtr, &good, mask, &limits()),
        Ok(Rts)
    );
    let mut bad = good;
    bad.cur_qp_state = Init;
    assert_eq!(
        validate_modify(QpType::Ud, Rtr, &bad, mask, &limits()),
        Err(ModifyError::CurStateMismatch {
            given: Init,
            actual: Rtr
        })
    );
    // CUR_STATE is not accepted at all below RTR (the kernel's first check).
    let err = validate_modify(
        QpType::Rc,
        Init,
        &attr(Init, ERR),
        AttrMask::STATE | AttrMask::CUR_STATE,
        &limits(),
    );
    assert!(matches!(
        err,
        Err(ModifyError::UnexpectedAttribute {
            attr: "CUR_STATE",
            ..
        })
    ));
}

#[test]
fn leaving_sqd_but_for_err_is_refused_while_draining() {
    let a = attr(Sqd, Sqd);
    assert_eq!(
        check_sq_drain(Sqd, &a, AttrMask::STATE, true),
        Err(ModifyError::SqDraining)
    );
    assert_eq!(
        check_sq_drain(Sqd, &attr(Sqd, Rts), AttrMask::STATE, true),
        Err(ModifyError::SqDraining)
    );
    assert_eq!(
        check_sq_drain(Sqd, &attr(Sqd, ERR), AttrMask::STATE, true),
        Ok(())
    );
    assert_eq!(check_sq_drain(Sqd, &a, AttrMask::STATE, false), Ok(()));
    assert_eq!(
        check_sq_drain(Sqd, &attr(Sqd, Rts), AttrMask::STATE, false),
        Ok(())
    );
    assert_eq!(check_sq_drain(Sqd, &a, AttrMask::QKEY, true), Ok(()));
}

/// Runs `validate_modify` on a transition where `bit` is allowed, with `edit` applied.
fn check_value(
    t: QpType,
    from: QpState,
    to: QpState,
    bit: AttrMask,
    edit: impl Fn(&mut QpAttr),
) -> Result<QpState, ModifyError> {
    let rule = transition_rule(t, from, to).unwrap();
    assert!((rule.required | rule.optional).contains(bit));
    let mut a = attr(from, to);
    edit(&mut a);
    validate_modify(
        t,
        from,
        &a,
        AttrMask::STATE | rule.required | bit,
        &limits(),
    )
}

fn invalid(attr: &'static str, value: u64, min: u64, max: u64) -> Result<QpState, ModifyError> {
    Err(ModifyError::InvalidValue {
        attr,
        value,
        min,
        max,
    })
}

#[test]
fn timeout_range() {
    let check = |v| check_value(QpType::Rc, Rtr, Rts, AttrMask::TIMEOUT, |a| a.timeout = v);
    assert_eq!(check(0), Ok(Rts));
    assert_eq!(check(31), Ok(Rts));
    assert_eq!(check(32), invalid("timeout", 32, 0, 31));
    assert_eq!(check(255), invalid("timeout", 255, 0, 31));
}

#[test]
fn retry_counts_range() {
    let retry = |v| {
        check_value(QpType::Rc, Rtr, Rts, AttrMask::RETRY_CNT, |a| {
            a.retry_cnt = v
        })
    };
    assert_eq!(retry(7), Ok(Rts));
    assert_eq!(retry(8), invalid("retry_cnt", 8, 0, 7));
    let rnr = |v| {
        check_value(QpType::Rc, Rtr, Rts, AttrMask::RNR_RETRY, |a| {
            a.rnr_retry = v
        })
    };
    assert_eq!(rnr(7), Ok(Rts));
    assert_eq!(rnr(8), invalid("rnr_retry", 8, 0, 7));
}

#[test]
fn min_rnr_timer_range() {
    let check = |v| {
        check_value(QpType::Rc, Init, Rtr, AttrMask::MIN_RNR_TIMER, |a| {
            a.min_rnr_timer = v
        })
    };
    assert_eq!(check(0), Ok(Rtr));
    assert_eq!(check(31), Ok(Rtr));
    assert_eq!(check(32), invalid("min_rnr_timer", 32, 0, 31));
}

#[test]
fn rd_atomic_limits() {
    let init = |v| {
        check_value(QpType::Rc, Rtr, Rts, AttrMask::MAX_QP_RD_ATOMIC, |a| {
            a.max_rd_atomic = v
        })
    };
    assert_eq!(init(128), Ok(Rts));
    assert_eq!(init(129), invalid("max_rd_atomic", 129, 0, 128));
    let dest = |v| {
        check_value(QpType::Rc, Init, Rtr, AttrMask::MAX_DEST_RD_ATOMIC, |a| {
            a.max_dest_rd_atomic = v
        })
    };
    assert_eq!(dest(0), Ok(Rtr));
    assert_eq!(dest(128), Ok(Rtr));
    assert_eq!(dest(200), invalid("max_dest_rd_atomic", 200, 0, 128));
}

#[test]
fn path_mtu_within_port_max() {
    let check = |m| {
        check_value(QpType::Uc, Init, Rtr, AttrMask::PATH_MTU, |a| {
            a.path_mtu = m
        })
    };
    for m in Mtu::ALL {
        assert_eq!(check(m), Ok(Rtr));
    }
    let small = DeviceLimits {
        port_max_mtu: Mtu::Mtu1024,
        ..DeviceLimits::default()
    };
    let rule = transition_rule(QpType::Uc, Init, Rtr).unwrap();
    let mut a = attr(Init, Rtr);
    a.path_mtu = Mtu::Mtu2048;
    assert_eq!(
        validate_modify(
            QpType::Uc,
            Init,
            &a,
            AttrMask::STATE | rule.required,
            &small
        ),
        invalid("path_mtu", 2048, 256, 1024)
    );
}

#[test]
fn port_and_pkey_index() {
    let port = |p| check_value(QpType::Rc, Reset, Init, AttrMask::PORT, |a| a.port_num = p);
    assert_eq!(port(1), Ok(Init));
    assert_eq!(port(0), invalid("port_num", 0, 1, 1));
    assert_eq!(port(2), invalid("port_num", 2, 1, 1));
    let pkey = |i| {
        check_value(QpType::Ud, Reset, Init, AttrMask::PKEY_INDEX, |a| {
            a.pkey_index = i
        })
    };
    assert_eq!(pkey(0), Ok(Init));
    assert_eq!(pkey(1), invalid("pkey_index", 1, 0, 0));
}

#[test]
fn address_vector_checks() {
    let av = |f: fn(&mut QpAttr)| check_value(QpType::Rc, Init, Rtr, AttrMask::AV, f);
    assert_eq!(av(|_| {}), Ok(Rtr));
    assert_eq!(
        av(|a| a.ah_attr.is_global = false),
        Err(ModifyError::GrhRequired)
    );
    assert_eq!(
        av(|a| a.ah_attr.port_num = 0),
        invalid("ah_attr.port_num", 0, 1, 1)
    );
    assert_eq!(av(|a| a.ah_attr.sgid_index = 255), Ok(Rtr));
    assert_eq!(av(|a| a.ah_attr.flow_label = 0xF_FFFF), Ok(Rtr));
    // The kernel does not range-check the flow label (only its low 20 bits are used) and
    // UCX's rc_verbs connects with `~0` on RoCE.
    assert_eq!(av(|a| a.ah_attr.flow_label = 0x10_0000), Ok(Rtr));
    assert_eq!(av(|a| a.ah_attr.flow_label = u32::MAX), Ok(Rtr));
    let tiny = DeviceLimits {
        gid_tbl_len: 2,
        ..DeviceLimits::default()
    };
    let rule = transition_rule(QpType::Rc, Init, Rtr).unwrap();
    let mut a = attr(Init, Rtr);
    a.ah_attr.sgid_index = 2;
    assert_eq!(
        validate_modify(QpType::Rc, Init, &a, AttrMask::STATE | rule.required, &tiny),
        invalid("ah_attr.sgid_index", 2, 0, 1)
    );
}

#[test]
fn qp_access_flags_may_not_have_unknown_bits() {
    let check = |f| {
        check_value(QpType::Rc, Reset, Init, AttrMask::ACCESS_FLAGS, |a| {
            a.qp_access_flags = f
        })
    };
    // A QP may enable REMOTE_WRITE without LOCAL_WRITE (that rule is for regions only).
    assert_eq!(check(AccessFlags::REMOTE_WRITE), Ok(Init));
    assert_eq!(check(AccessFlags::all()), Ok(Init));
    assert_eq!(
        check(AccessFlags::from_bits_retain(1 << 12)),
        Err(ModifyError::InvalidAccessFlags(AccessError::UnknownBits {
            bits: 1 << 12
        }))
    );
}

#[test]
fn values_outside_the_mask_are_not_checked() {
    // An out-of-range timeout is irrelevant at INIT->RTR, which does not take TIMEOUT.
    let rule = transition_rule(QpType::Rc, Init, Rtr).unwrap();
    let mut a = attr(Init, Rtr);
    a.timeout = 200;
    a.retry_cnt = 9;
    assert_eq!(
        validate_modify(
            QpType::Rc,
            Init,
            &a,
            AttrMask::STATE | rule.required,
            &limits()
        ),
        Ok(Rtr)
    );
}

#[test]
fn rc_pingpong_sequence_is_accepted() {
    // The masks of rdma-core's libibverbs/examples/rc_pingpong.c, as raw C values.
    // RESET->INIT: STATE|PKEY_INDEX|PORT|ACCESS_FLAGS = 0x39.
    let l = limits();
    let mut a = attr(Reset, Init);
    a.qp_access_flags = AccessFlags::empty();
    let m = AttrMask::from_bits(0x39).unwrap();
    assert_eq!(validate_modify(QpType::Rc, Reset, &a, m, &l), Ok(Init));
    // INIT->RTR: STATE|AV|PATH_MTU|DEST_QPN|RQ_PSN|MAX_DEST_RD_ATOMIC|MIN_RNR_TIMER.
    let a = attr(Init, Rtr);
    let m =
        AttrMask::from_bits(0x1 | 0x80 | 0x100 | 0x10_0000 | 0x1000 | 0x2_0000 | 0x8000).unwrap();
    assert_eq!(validate_modify(QpType::Rc, Init, &a, m, &l), Ok(Rtr));
    // RTR->RTS: STATE|TIMEOUT|RETRY_CNT|RNR_RETRY|SQ_PSN|MAX_QP_RD_ATOMIC.
    let a = attr(Rtr, Rts);
    let m = AttrMask::from_bits(0x1 | 0x200 | 0x400 | 0x800 | 0x1_0000 | 0x2000).unwrap();
    assert_eq!(validate_modify(QpType::Rc, Rtr, &a, m, &l), Ok(Rts));
    // Then RTS->SQD->RTS and to ERR and back to RESET.
    assert_eq!(
        validate_modify(QpType::Rc, Rts, &attr(Rts, Sqd), AttrMask::STATE, &l),
        Ok(Sqd)
    );
    assert_eq!(
        validate_modify(QpType::Rc, Sqd, &attr(Sqd, Rts), AttrMask::STATE, &l),
        Ok(Rts)
    );
    assert_eq!(
        validate_modify(QpType::Rc, Rts, &attr(Rts, ERR), AttrMask::STATE, &l),
        Ok(ERR)
    );
    assert_eq!(
        validate_modify(QpType::Rc, ERR, &attr(ERR, Reset), AttrMask::STATE, &l),
        Ok(Reset)
    );
}

#[test]
fn sqe_recovers_to_rts_for_ud_and_uc() {
    let l = limits();
    let mask = AttrMask::STATE | AttrMask::CUR_STATE | AttrMask::QKEY;
    assert_eq!(
        validate_modify(QpType::Ud, Sqe, &attr(Sqe, Rts), mask, &l),
        Ok(Rts)
    );
    let mask = AttrMask::STATE | AttrMask::CUR_STATE | AttrMask::ACCESS_FLAGS;
    assert_eq!(
        validate_modify(QpType::Uc, Sqe, &attr(Sqe, Rts), mask, &l),
        Ok(Rts)
    );
}
