//! srdma-relay: distribute data from one source through chains and trees of relays to sinks,
//! over srdma's RDMA.
//!
//! (Design notes: see the module documentation of [`node`] and [`control`].)

pub mod chunk;
pub mod config;
pub mod control;
pub mod digest;
pub mod launch;
pub mod node;
pub mod report;
pub mod sink;
pub mod source;
pub mod stage;
