//! srdma-relay: distribute data from a source through chains and trees of relays to sinks,
//! by RDMA WRITE_WITH_IMM into registered rings and SEND forwarding (being written).

pub mod chunk;
pub mod digest;
pub mod sink;
pub mod source;
pub mod stage;
