//! A node's connections to its neighbours: the parent it receives chunks from, the children
//! it forwards them to (with their credits), the partners of the binomial pipeline, and a
//! watcher per connection that notices the peer's disconnect.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use srdma::cm::{CmEvent, Connection, Listener};
use srdma::{Mr, Pd, QpInit};

use super::progress::Live;
use super::wire::RingDesc;

/// What connecting (again) needs: the protection domain, the QP template, the CM listener
/// for the parent (none at the source) and the node's ring.
#[derive(Clone, Copy)]
pub(super) struct Setup<'l> {
    pub(super) pd: &'l Pd,
    pub(super) init: &'l QpInit,
    pub(super) listener: Option<&'l Listener>,
    pub(super) buf: &'l Mr,
}

/// The connection from the parent.
pub(super) struct Parent {
    pub(super) conn: Arc<Connection>,
    /// Its watcher saw it close.
    pub(super) down: Arc<AtomicBool>,
}

impl Parent {
    /// Whether the connection was lost.
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }
}

/// A child: the connection to it, its ring and its credits.
pub(super) struct Child {
    pub(super) name: String,
    pub(super) conn: Arc<Connection>,
    pub(super) ring: RingDesc,
    /// Credits received (= chunks the child released).
    pub(super) credits: u64,
    /// Next chunk to post to it.
    pub(super) next_post: u64,
    /// When each chunk posted and not yet credited was posted.
    pub(super) posted_at: VecDeque<Instant>,
    pub(super) down: Arc<AtomicBool>,
    /// A send to it failed (the source waits for the control channel to say why).
    pub(super) broken: bool,
}

impl Child {
    /// Whether the connection was lost.
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }
}

/// A partner of the binomial pipeline.
pub(super) struct Peer {
    pub(super) rank: usize,
    pub(super) name: String,
    pub(super) conn: Arc<Connection>,
    pub(super) ring: RingDesc,
    /// The partner released every chunk below this (its credits).
    pub(super) released: u64,
    /// Chunks to send it, oldest first.
    pub(super) queue: BTreeSet<u64>,
    pub(super) down: Arc<AtomicBool>,
}

/// Watches a connection for the peer's disconnect (or the loss of its TCP link) until
/// `live.stop`; the flag returned turns true when it comes.
pub(super) fn watch(conn: Arc<Connection>, live: Arc<Live>) -> Arc<AtomicBool> {
    let down = Arc::new(AtomicBool::new(false));
    let d2 = Arc::clone(&down);
    let _ = thread::Builder::new()
        .name("relay-cm-watch".into())
        .spawn(move || {
            while !live.stop.load(Ordering::Acquire) {
                match conn.poll_event(Some(Duration::from_millis(100))) {
                    Some(CmEvent::Established) | None => {}
                    Some(_) => {
                        d2.store(true, Ordering::Release);
                        return;
                    }
                }
            }
        });
    down
}
