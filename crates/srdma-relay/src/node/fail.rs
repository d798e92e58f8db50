//! A node's failures: what went wrong and whom it blames, and what the control channel says
//! about failures elsewhere (an abort from the source, failures reported to it, a lost
//! control connection).

use crate::control;

/// A failure, with whom it blames.
#[derive(Debug, Clone)]
pub(super) struct Fail {
    pub(super) msg: String,
    pub(super) hop: Option<String>,
    /// This node caught the fault itself (not only lost a neighbour).
    pub(super) primary: bool,
}

/// A node's result.
pub(super) type R<T> = Result<T, Fail>;

impl Fail {
    /// A fault of `hop` (this node itself, or a peer it found at fault).
    pub(super) fn at(hop: &str, msg: impl Into<String>) -> Fail {
        Fail {
            msg: msg.into(),
            hop: Some(hop.to_string()),
            primary: true,
        }
    }

    /// A neighbour `hop` was lost: it is blamed, but yields to a primary report.
    pub(super) fn blame(hop: &str, msg: impl Into<String>) -> Fail {
        Fail {
            msg: msg.into(),
            hop: Some(hop.to_string()),
            primary: false,
        }
    }
}

/// The source: fails with the first failure a node reported (a primary one first).
pub(super) fn reported(server: &control::Server) -> R<()> {
    let f = server.failures();
    if let Some(f) = f.iter().find(|f| f.primary).or(f.first()) {
        return Err(Fail {
            msg: f.error.clone(),
            hop: f.failed_hop.clone(),
            primary: false,
        });
    }
    Ok(())
}

/// A node: fails when the source (named `source`) stopped the transfer or its control
/// connection is gone.
pub(super) fn source_said(h: &control::Heard, source: &str) -> R<()> {
    if let Some((hop, err)) = &h.abort {
        return Err(Fail {
            msg: format!("the source stopped the transfer: {err}"),
            hop: hop.clone(),
            primary: false,
        });
    }
    if h.lost {
        return Err(Fail::blame(
            source,
            format!("lost the control connection to the source {source}"),
        ));
    }
    Ok(())
}
