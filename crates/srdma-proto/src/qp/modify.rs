//! The `ibv_modify_qp` rules: which state transitions exist, which attributes each one
//! requires and allows per QP type, and the value ranges of those attributes.
//!
//! The transition table is Linux's `qp_state_table` (`drivers/infiniband/core/verbs.c`,
//! consulted by `ib_modify_qp_is_ok`, which rxe's `rxe_qp_chk_attr` calls first), restricted
//! to RC, UC and UD; it encodes the IBTA vol. 1 ch. 11 Modify QP verb and is summarised in
//! rdma-core's `ibv_modify_qp(3)`. The value checks are rxe's (`rxe_qp.c rxe_qp_chk_attr`,
//! `rxe_av_chk_attr`) and the kernel core's (`_ib_modify_qp`), listed at
//! [`validate_modify`].
//!
//! Legal transitions (every QP type; "+" = only STATE may be given):
//!
//! | from \ to | RESET | INIT | RTR | RTS | SQD | SQE | ERR |
//! |-----------|-------|------|-----|-----|-----|-----|-----|
//! | RESET     | +     | yes  |     |     |     |     |     |
//! | INIT      | +     | yes  | yes |     |     |     | +   |
//! | RTR       | +     |      |     | yes |     |     | +   |
//! | RTS       | +     |      |     | yes | yes |     | +   |
//! | SQD       | +     |      |     | yes | yes |     | +   |
//! | SQE       | +     |      |     | yes |     |     | +   |
//! | ERR       | +     |      |     |     |     |     | +   |
//!
//! Notes on the kernel table: RESET→ERR is *not* legal (Linux has no such entry; rxe returns
//! EINVAL), nothing enters SQE by modify (the transport puts UC/UD QPs there), and SQE→RTS is
//! listed for RC too although an RC QP never reaches SQE.

use super::state::{AttrMask, QpAttr, QpState, QpType};
use crate::access::AccessError;
use crate::limits::DeviceLimits;

/// The attributes one transition requires and the ones it additionally accepts.
/// [`AttrMask::STATE`] is implied by a state change and appears in neither set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransitionRule {
    /// Attributes that must be in the mask.
    pub required: AttrMask,
    /// Attributes that may be in the mask.
    pub optional: AttrMask,
}

/// Why an `ibv_modify_qp` request is refused. The kernel and rxe answer all of these with a
/// bare EINVAL; here each says which attribute is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// No transition `from` → `to` exists for this QP type.
    #[error("{qp_type} QP cannot move from {from} to {to}")]
    IllegalTransition {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state (the current one when STATE is not in the mask).
        to: QpState,
    },
    /// A required attribute is not in the mask.
    #[error("{qp_type} {from}->{to} requires {attr} (missing: {missing})")]
    MissingAttribute {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The first missing attribute's mask name, e.g. `"PATH_MTU"`.
        attr: &'static str,
        /// Every missing attribute.
        missing: AttrMask,
    },
    /// An attribute that this transition does not accept is in the mask.
    #[error("{qp_type} {from}->{to} does not accept {attr} (unexpected: {unexpected})")]
    UnexpectedAttribute {
        /// The QP type.
        qp_type: QpType,
        /// The current state.
        from: QpState,
        /// The requested state.
        to: QpState,
        /// The first unexpected attribute's mask name, e.g. `"QKEY"`.
        attr: &'static str,
        /// Every unexpected attribute.
        unexpected: AttrMask,
    },
    /// Mask bits that `ibv_qp_attr_mask` does not define.
    #[error("unknown attribute mask bits {bits:#x}")]
    UnknownMaskBits {
        /// The undefined bits.
        bits: u32,
    },
    /// CUR_STATE was given and is not the QP's state.
    #[error("cur_qp_state is {given} but the QP is in {actual}")]
    CurStateMismatch {
        /// `attr.cur_qp_state`.
        given: QpState,
        /// The QP's actual state.
        actual: QpState,
    },
    /// A numeric attribute outside its allowed range.
    #[error("{attr} = {value} is outside {min}..={max}")]
    InvalidValue {
        /// The attribute's `ibv_qp_attr` field name, e.g. `"timeout"`, `"ah_attr.sgid_index"`.
        attr: &'static str,
        /// The value given (`path_mtu` in bytes).
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// `qp_access_flags` has bits `ibv_access_flags` does not define.
    #[error("qp_access_flags: {0}")]
    InvalidAccessFlags(AccessError),
    /// `ah_attr.is_global` is false: RoCE carries a GRH in every packet, so an address without
    /// one cannot be used (`rdma_check_ah_attr` / rxe.7: "GRH ... is mandatory with RoCE").
    #[error("ah_attr.is_global must be set: RoCE addresses are always global")]
    GrhRequired,
    /// An attribute the table allows but RoCE does not support.
    #[error("{attr} is not supported on RoCE")]
    Unsupported {
        /// The mask name, e.g. `"ALT_PATH"`.
        attr: &'static str,
    },
    /// A move out of SQD other than to ERR while the send queue is still draining (rxe
    /// `rxe_qp_chk_attr`).
    #[error("cannot leave SQD but for ERR while the send queue is draining")]
    SqDraining,
}

/// The rule for `from` → `to` on a QP of type `qp_type`, or `None` if the transition does not
/// exist. A transcription of Linux `qp_state_table` (`drivers/infiniband/core/verbs.c`) for
/// `IB_QPT_RC`, `IB_QPT_UC` and `IB_QPT_UD`.
pub fn transition_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionRule> {
    use AttrMask as M;
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    use QpType::{Rc, Uc, Ud};

    let none = M::empty();
    let (required, optional) = match (from, to) {
        // Any state → RESET, with STATE only (table entries `[*][IB_QPS_RESET] = { .valid = 1 }`).
        (_, Reset) => (none, none),
        // Any state but RESET → ERR, with STATE only. Linux has no RESET → ERR entry.
        (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => (none, none),
        (Reset, Init) => match qp_type {
            Ud => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Rc | Uc => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        (Init, Init) => match qp_type {
            Ud => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Rc | Uc => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => match qp_type {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            Uc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Rc => (
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
        },
        (Rtr, Rts) => match qp_type {
            Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
            Uc => (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => (
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Rts, Rts) => match qp_type {
            Ud => (none, M::CUR_STATE | M::QKEY),
            Uc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE,
            ),
            Rc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Rts) => match qp_type {
            Ud => (none, M::CUR_STATE | M::QKEY),
            Uc => (
                none,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Rc => (
                none,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
        },
        (Sqd, Sqd) => match qp_type {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            Uc => (
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Rc => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
        },
        (Sqe, Rts) => match qp_type {
            Ud => (none, M::CUR_STATE | M::QKEY),
            Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            // Listed as valid with no attributes; an RC QP never enters SQE in practice.
            Rc => (none, none),
        },
        _ => return None,
    };
    Some(TransitionRule { required, optional })
}

/// Validates an `ibv_modify_qp(qp, attr, mask)` call on a QP of type `qp_type` in state
/// `cur_state`, and returns the state the QP moves to (`attr.qp_state` if STATE is in the
/// mask, otherwise `cur_state`: a modify without STATE is a `cur → cur` transition).
///
/// Checks, in this order:
/// 1. `mask` has only `ibv_qp_attr_mask` bits;
/// 2. the transition exists ([`transition_rule`]; the Linux `ib_modify_qp_is_ok` table);
/// 3. every required attribute is in `mask` (all missing ones are reported, the first by name);
/// 4. nothing outside required ∪ optional ∪ STATE is in `mask`;
/// 5. CUR_STATE, if given, equals `cur_state`;
/// 6. ALT_PATH is refused: "Today the core code can only handle alternate paths and APM for
///    IB. Ban them in roce mode." (`_ib_modify_qp`);
/// 7. the value of every attribute in `mask`:
///    - `port_num` in `1..=phys_port_cnt` (rxe: `rdma_is_port_valid`);
///    - `pkey_index` below `pkey_tbl_len` (one entry: index 0 only);
///    - `qp_access_flags` only defined bits;
///    - `ah_attr`: `is_global` set (RoCE), `port_num` valid, `sgid_index` below
///      `gid_tbl_len`; `flow_label` is not checked: the kernel takes any 32-bit value and
///      only its low 20 bits reach the wire (UCX passes `~0` on RoCE, `ib_iface.c`);
///    - `path_mtu` at most the port's `max_mtu` (rxe: "invalid mtu");
///    - `timeout` ≤ 31 (rxe: "invalid QP timeout"; 4.096 µs · 2^31 is the largest encodable);
///    - `retry_cnt` ≤ 7 and `rnr_retry` ≤ 7 (3-bit fields, IBTA);
///    - `min_rnr_timer` ≤ 31 (5-bit AETH timer code);
///    - `max_rd_atomic` ≤ `max_qp_init_rd_atom`, `max_dest_rd_atomic` ≤ `max_qp_rd_atom`
///      (128 each; rxe checks the former).
///
/// The SQD→SQD-while-draining rule depends on run-time drain progress, not on the request;
/// the QP owner checks it with [`check_sq_drain`].
pub fn validate_modify(
    qp_type: QpType,
    cur_state: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &DeviceLimits,
) -> Result<QpState, ModifyError> {
    let unknown = mask.unknown_bits();
    if unknown != 0 {
        return Err(ModifyError::UnknownMaskBits { bits: unknown });
    }
    let next = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur_state
    };
    let rule = transition_rule(qp_type, cur_state, next).ok_or(ModifyError::IllegalTransition {
        qp_type,
        from: cur_state,
        to: next,
    })?;

    let missing = rule.required - mask;
    if let Some(name) = missing.first_name() {
        return Err(ModifyError::MissingAttribute {
            qp_type,
            from: cur_state,
            to: next,
            attr: name,
            missing,
        });
    }
    let unexpected = mask - rule.required - rule.optional - AttrMask::STATE;
    if let Some(name) = unexpected.first_name() {
        return Err(ModifyError::UnexpectedAttribute {
            qp_type,
            from: cur_state,
            to: next,
            attr: name,
            unexpected,
        });
    }

    if mask.contains(AttrMask::CUR_STATE) && attr.cur_qp_state != cur_state {
        return Err(ModifyError::CurStateMismatch {
            given: attr.cur_qp_state,
            actual: cur_state,
        });
    }
    if mask.contains(AttrMask::ALT_PATH) {
        return Err(ModifyError::Unsupported { attr: "ALT_PATH" });
    }

    check_values(attr, mask, limits)?;
    Ok(next)
}

/// The SQD rule of rxe's `rxe_qp_chk_attr`: while the send queue is still draining, a
/// modify of an SQD QP that names a new state other than ERR (SQD again, RTS) is refused.
pub fn check_sq_drain(
    cur_state: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    sq_draining: bool,
) -> Result<(), ModifyError> {
    if sq_draining
        && cur_state == QpState::Sqd
        && mask.contains(AttrMask::STATE)
        && attr.qp_state != QpState::Err
    {
        Err(ModifyError::SqDraining)
    } else {
        Ok(())
    }
}

/// `Ok` if `value` is in `min..=max`, else [`ModifyError::InvalidValue`] naming `attr`.
fn in_range(attr: &'static str, value: u64, min: u64, max: u64) -> Result<(), ModifyError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ModifyError::InvalidValue {
            attr,
            value,
            min,
            max,
        })
    }
}

/// Step 7 of [`validate_modify`]: the value of every attribute in `mask`.
fn check_values(attr: &QpAttr, mask: AttrMask, limits: &DeviceLimits) -> Result<(), ModifyError> {
    let ports = u64::from(limits.phys_port_cnt);
    if mask.contains(AttrMask::PORT) {
        in_range("port_num", attr.port_num.into(), 1, ports)?;
    }
    if mask.contains(AttrMask::PKEY_INDEX) {
        // An empty P_Key table admits no index: max = -1 is expressed as min > max.
        let (min, max) = match limits.pkey_tbl_len {
            0 => (1, 0),
            n => (0, u64::from(n) - 1),
        };
        in_range("pkey_index", attr.pkey_index.into(), min, max)?;
    }
    if mask.contains(AttrMask::ACCESS_FLAGS) {
        attr.qp_access_flags
            .validate_for_qp()
            .map_err(ModifyError::InvalidAccessFlags)?;
    }
    if mask.contains(AttrMask::AV) {
        let ah = &attr.ah_attr;
        if !ah.is_global {
            return Err(ModifyError::GrhRequired);
        }
        in_range("ah_attr.port_num", ah.port_num.into(), 1, ports)?;
        let (min, max) = match limits.gid_tbl_len {
            0 => (1, 0),
            n => (0, u64::from(n) - 1),
        };
        in_range("ah_attr.sgid_index", ah.sgid_index.into(), min, max)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        in_range(
            "path_mtu",
            attr.path_mtu.bytes().into(),
            256,
            limits.port_max_mtu.bytes().into(),
        )?;
    }
    if mask.contains(AttrMask::TIMEOUT) {
        in_range("timeout", attr.timeout.into(), 0, 31)?;
    }
    if mask.contains(AttrMask::RETRY_CNT) {
        in_range("retry_cnt", attr.retry_cnt.into(), 0, 7)?;
    }
    if mask.contains(AttrMask::RNR_RETRY) {
        in_range("rnr_retry", attr.rnr_retry.into(), 0, 7)?;
    }
    if mask.contains(AttrMask::MIN_RNR_TIMER) {
        in_range("min_rnr_timer", attr.min_rnr_timer.into(), 0, 31)?;
    }
    if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
        in_range(
            "max_rd_atomic",
            attr.max_rd_atomic.into(),
            0,
            limits.max_qp_init_rd_atom.into(),
        )?;
    }
    if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
        in_range(
            "max_dest_rd_atomic",
            attr.max_dest_rd_atomic.into(),
            0,
            limits.max_qp_rd_atom.into(),
        )?;
    }
    Ok(())
}
