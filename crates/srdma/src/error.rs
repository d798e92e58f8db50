//! The error type of the verbs API.

use std::io;

/// Why a verbs call failed. Data-path failures never come here: they arrive as a
/// [`crate::WcStatus`] in a completion.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A socket or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_post_send` / `ibv_post_recv` refused the work request.
    #[error(transparent)]
    Post(#[from] srdma_proto::PostError),
    /// `ibv_modify_qp` refused the transition or an attribute.
    #[error(transparent)]
    Modify(#[from] srdma_proto::ModifyError),
    /// A QP or CQ capacity is above the device limit.
    #[error(transparent)]
    Caps(#[from] srdma_proto::CapsError),
    /// Memory registration failed.
    #[error(transparent)]
    Mr(#[from] srdma_proto::MrError),
    /// A memory window could not be allocated.
    #[error(transparent)]
    Mw(#[from] srdma_proto::MwError),
    /// Access flags are invalid for a registration.
    #[error(transparent)]
    Access(#[from] srdma_proto::AccessError),
    /// An argument is out of range or inconsistent; the message says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device ran out of something (QP numbers, memory).
    #[error("out of resources: {0}")]
    Exhausted(&'static str),
    /// The object belongs to another device.
    #[error("object belongs to another device")]
    WrongDevice,
    /// The device failed (its progress thread stopped): nothing works on it any more.
    #[error("the device failed (its progress thread stopped); open a new one")]
    DeviceFailed,
}

/// Result of the verbs API.
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}
