//! Queue pairs: types, states, attributes and the `ibv_modify_qp` rules.
//!
//! The requester, responder and completer build on these; this module decides only whether a
//! QP may move between states with the given attributes, not what the move does.

mod modify;
mod state;

pub use modify::{ModifyError, TransitionRule, check_sq_drain, transition_rule, validate_modify};
pub use state::{AhAttr, AttrMask, MigState, Mtu, QpAttr, QpState, QpType};
