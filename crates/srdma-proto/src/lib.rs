//! The sans-IO RDMA transport of srdma: the state machines and rules between the verbs API
//! and the RoCEv2 wire format, with no threads, sockets or clocks — time, packets and memory
//! are supplied by the caller.
//!
//! This layer provides the foundations the requester, responder and completer stand on:
//!
//! - [`wc`]: the completion model (`ibv_wc`, `ibv_wc_status`, `ibv_wc_opcode`,
//!   `ibv_wr_opcode`, completion and send flags), numbered as rdma-core;
//! - [`access`]: access rights (`ibv_access_flags`) and the registration rule
//!   REMOTE_WRITE/REMOTE_ATOMIC ⇒ LOCAL_WRITE;
//! - [`mr`]: the memory-region table — random-keyed L_Keys/R_Keys, local and remote access
//!   checks with the IBTA zero-length rule, and generation-checked handles that make
//!   deregistration with work in flight safe; memory windows (type 1 and 2B: bind,
//!   invalidate, R_Key checks);
//! - [`memory`]: the [`memory::Memory`] trait through which the engine lends region bytes,
//!   and [`memory::VecMemory`] for tests;
//! - [`qp`]: QP types, states and attributes, and the `ibv_modify_qp` transition table with
//!   named-attribute errors;
//! - [`limits`]: device limits (rxe defaults) and QP capacity checks;
//! - [`timer`]: the local ACK timeout and RNR NAK timer encodings.
//!
//! Nothing here panics on any input; failures are typed errors, and data-path failures are
//! meant to surface as a [`wc::WcStatus`].
//!
//! A responder's view of an incoming RDMA WRITE, and of a region deregistered under it:
//!
//! ```
//! use srdma_proto::{AccessFlags, Memory, MrError, MrTable, PdId, VecMemory};
//!
//! let pd = PdId(1);
//! let mut table = MrTable::new(0x5eed); // the engine seeds from the OS RNG
//! let mut memory = VecMemory::new(); // the engine supplies real pages
//! let keys = table
//!     .register(pd, 0x7f00_0000_0000, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .unwrap();
//! memory.insert_zeroed(keys.handle, 4096);
//!
//! // RETH: va, rkey, length. The check yields a grant (None for a zero-length WRITE).
//! let rkey = keys.rkey.unwrap();
//! let grant = table
//!     .check_remote(pd, rkey, 0x7f00_0000_0010, 5, AccessFlags::REMOTE_WRITE)
//!     .unwrap()
//!     .unwrap();
//! memory.write(grant.handle(), grant.offset(), b"hello").unwrap();
//!
//! // The application deregisters and registers again: same slot, new key and generation.
//! table.deregister(keys.lkey).unwrap();
//! memory.remove(keys.handle);
//! let again = table.register(pd, 0x7f00_0000_0000, 4096, AccessFlags::LOCAL_WRITE).unwrap();
//! memory.insert_zeroed(again.handle, 4096);
//! assert_eq!(again.index(), keys.index());
//!
//! // The old grant and key are dead; nothing reaches the new region.
//! assert!(matches!(table.revalidate(&grant), Err(MrError::Stale { .. })));
//! assert!(memory.write(grant.handle(), grant.offset(), b"late!").is_err());
//! assert!(table.check_remote(pd, rkey, 0x7f00_0000_0010, 5, AccessFlags::REMOTE_WRITE).is_err());
//! ```
#![forbid(unsafe_code)]

mod flags;

pub mod access;
pub mod congestion;
pub mod counters;
pub mod limits;
pub mod memory;
pub mod mr;
pub mod qp;
pub mod rng;
pub mod srq;
pub mod timer;
pub mod transport;
pub mod wc;
pub mod wr;

pub use access::{AccessError, AccessFlags};
pub use counters::Counters;
pub use limits::{CapsError, DeviceLimits, QpCaps};
pub use memory::{Memory, MemoryError, VecMemory};
pub use mr::{
    LKey, MrError, MrGrant, MrHandle, MrIndex, MrInfo, MrKeys, MrTable, MwBind, MwError, MwInfo,
    MwState, MwType, PdId, RKey,
};
pub use qp::{
    AhAttr, AttrMask, MigState, ModifyError, Mtu, QpAttr, QpState, QpType, TransitionRule,
    validate_modify,
};
pub use srq::Srq;
pub use transport::{CqSide, Ctx, Dest, Qp, QpConfig, RecvMeta, Reliability, Transmit, XrcRole};
pub use wc::{SendFlags, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode};
pub use wr::{PostError, RecvWr, SendOp, SendWr, Sge, SgeList, UdDest};
