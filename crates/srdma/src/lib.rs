//! srdma: RDMA verbs in user space, speaking RoCEv2 over UDP.
//!
//! The model is libibverbs': open a [`Device`] on an IP address, allocate a protection domain
//! ([`Pd`]), register memory ([`Mr`]), create completion queues ([`Cq`], optionally with a
//! [`CompChannel`]) and queue pairs ([`Qp`]), connect them, post work requests, poll
//! completions. On the wire every packet is RoCEv2, byte for byte, so the peer can be another
//! srdma process, Linux SoftRoCE (rxe) or a RoCE NIC.
//!
//! A background progress thread per device receives, acknowledges, retransmits and completes,
//! so one-sided operations (RDMA WRITE/READ, atomics) finish without the target application's
//! help. Posting sends the packets from the caller's thread.
//!
//! ```
//! use srdma::{AccessFlags, ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RemoteQp, SendOp, SendWr, SgeList, WcStatus};
//! use srdma_wire::Psn;
//!
//! // Two devices on loopback addresses, as two hosts would be.
//! let mut ca = DeviceConfig::new("127.0.0.1".parse().unwrap());
//! ca.port = 0; // any free port (rxe peers need 4791)
//! let mut cb = DeviceConfig::new("127.0.0.1".parse().unwrap());
//! cb.port = 0;
//! let (a, b) = (Device::open(ca).unwrap(), Device::open(cb).unwrap());
//! let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
//! let (cqa, cqb) = (a.create_cq(16, None).unwrap(), b.create_cq(16, None).unwrap());
//! let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa, &cqa)).unwrap();
//! let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb, &cqb)).unwrap();
//! let at = |d: &Device, qpn, psn| RemoteQp { qpn, psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! qa.connect(&at(&b, qb.qpn(), 2), &ConnectParams::new(Mtu::Mtu1024, Psn::new(1))).unwrap();
//! qb.connect(&at(&a, qa.qpn(), 1), &ConnectParams::new(Mtu::Mtu1024, Psn::new(2))).unwrap();
//!
//! // A writes "hello" into B's region; B's application is not involved.
//! let src = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! src.write(0, b"hello").unwrap();
//! let dst = pb.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
//! let remote = dst.remote().unwrap();
//! let op = SendOp::Write { remote_addr: remote.addr, rkey: srdma::RKey(remote.rkey) };
//! qa.post_send(SendWr::new(1, op, SgeList::one(src.sge(0, 5)))).unwrap();
//! let wc = loop { if let Some(wc) = cqa.poll_one() { break wc } };
//! assert_eq!(wc.status, WcStatus::Success);
//! let mut got = [0u8; 5];
//! dst.read(0, &mut got).unwrap();
//! assert_eq!(&got, b"hello");
//! ```

pub mod cm;
mod config;
#[path = "examples_doc.rs"]
pub mod cookbook;
mod cq;
mod device;
mod driver;
mod engine;
mod error;
mod event;
pub mod fasthash;
pub mod ibcm;
pub mod lease;
mod memory;
mod mw;
pub mod netdev;
mod portshare;
mod pull;
mod qp;
mod random;
mod shm;
pub mod stats;
mod sys;
pub mod threads;
pub mod typed;
mod types;
mod udp;

/// Entry points for the fuzz targets (`fuzz/`): not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// Reads `bytes` as the memory of a shared-memory ring a peer wrote (see `shm::ring`);
    /// returns the bytes of the records it took.
    pub fn read_ring(bytes: &[u8]) -> usize {
        crate::shm::ring::read_untrusted(bytes)
    }
}

pub use cq::{CompChannel, Cq};
pub use device::{
    Device, DeviceAttr, DeviceConfig, Mr, MrChange, Pd, PortAttr, ROCEV2_PORT, RemoteMr,
};
pub use error::{Error, Result};
pub use event::{AsyncEvent, EventHandler};
pub use lease::{Buf, BufPool, LeasedQp, RawPost};
pub use mw::{Mw, MwBindInfo, inc_rkey};
pub use qp::xrc::Xrcd;
pub use qp::{ConnectParams, Ece, Qp, QpInit, RemoteQp, Srq, ah, connect_attrs};
pub use random::{random_psn, random_u64};
pub use srdma_proto::XrcRole;
pub use srdma_proto::congestion::CcStats;
pub use srdma_proto::qp::AhAttr;
pub use srdma_proto::{
    AccessFlags, AttrMask, Counters, DeviceLimits, LKey, Mtu, MwBind, MwInfo, MwState, MwType,
    QpAttr, QpCaps, QpState, QpType, RKey, RecvWr, SendFlags, SendOp, SendWr, Sge, SgeList, UdDest,
    Wc, WcFlags, WcOpcode, WcStatus,
};
pub use typed::{RcQp, UcQp, UdQp};
pub use types::{DeviceCounters, Gid, Gso, Path, ShmPull};
