//! Asynchronous events (`ibv_get_async_event`): what happens to a device, a QP or a CQ
//! outside any call the application made.

use std::sync::Arc;

use srdma_wire::Qpn;

/// An asynchronous event, as verbs reports it (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// More completions arrived than the CQ holds (`IBV_EVENT_CQ_ERR`): the completion that
    /// did not fit is lost, and the QPs that completed into the full CQ moved to ERR.
    CqError {
        /// The CQ's id ([`crate::Cq::id`]).
        cq: u32,
    },
    /// The QP moved to ERR on its own (`IBV_EVENT_QP_FATAL`): a transport error (retries
    /// exhausted, a NAK), a CQ overrun or a device failure.
    QpFatal {
        /// The QP.
        qpn: Qpn,
    },
    /// A QP on an SRQ reached ERR and will take no more receives from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached {
        /// The QP.
        qpn: Qpn,
    },
    /// A QP moved to SQD finished the messages it had started (`IBV_EVENT_SQ_DRAINED`): it
    /// may now go back to RTS (before, only a move to ERR is accepted, as by rxe).
    SqDrained {
        /// The QP.
        qpn: Qpn,
    },
    /// An SRQ's posted receives fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`,
    /// see [`crate::Srq::set_limit`]); the limit is disarmed until set again.
    SrqLimitReached {
        /// The SRQ's id ([`crate::Srq::id`]).
        srq: u32,
    },
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`): its progress thread stopped; every QP was
    /// flushed with error completions and later calls fail.
    DeviceFatal,
}

/// Receives a device's async events. Called from the engine (its progress thread or the
/// thread that drives it) with the device locked: it must return quickly and must not call
/// into the device.
pub type EventHandler = Arc<dyn Fn(AsyncEvent) + Send + Sync>;
