//! Typed queue pairs: [`RcQp`], [`UcQp`] and [`UdQp`] offer only the operations their
//! transport has, so a misuse is a compile error instead of a refused post.
//!
//! | operation | [`RcQp`] | [`UcQp`] | [`UdQp`] |
//! |---|---|---|---|
//! | SEND, SEND with immediate | `send`, `send_with_imm` | `send`, `send_with_imm` | `send_to`, `send_to_with_imm` (to a [`UdDest`]) |
//! | RDMA WRITE, WRITE with immediate | `write`, `write_with_imm` | `write`, `write_with_imm` | — |
//! | RDMA READ | `read` | — | — |
//! | compare-and-swap, fetch-and-add | `compare_swap`, `fetch_add` | — | — |
//! | receive | `post_recv` | `post_recv` | `post_recv` |
//! | bring up | `connect` | `connect` | `activate` |
//!
//! These are the operations the IBA defines for each transport service; an untyped [`Qp`]
//! refuses the others only at post time, with
//! [`PostError::UnsupportedOp`](srdma_proto::PostError::UnsupportedOp).
//!
//! A typed QP wraps a [`Qp`]: make one with `create` (like [`Pd::create_qp`]) or convert a
//! `Qp` you already have, such as a [`Connection`](crate::cm::Connection)'s, with
//! [`TryFrom`]. The convenience methods post signaled work requests; for flags (unsignaled,
//! solicited, fence, inline) or batches, post a [`SendWr`] on the untyped handle,
//! [`as_qp`](RcQp::as_qp). Every method is a thin layer over [`Qp::post_send`] and
//! [`Qp::post_recv`]: the work requests and completions are the same.
//!
//! Like every srdma handle, typed QPs are cheap to clone, `Send` and `Sync`: one thread may
//! post while another polls, and clones may move to other threads.
//!
//! ```
//! fn send_sync<T: Send + Sync + Clone>() {}
//! send_sync::<srdma::RcQp>();
//! send_sync::<srdma::UcQp>();
//! send_sync::<srdma::UdQp>();
//! send_sync::<srdma::Qp>();
//! send_sync::<srdma::Device>();
//! send_sync::<srdma::Pd>();
//! send_sync::<srdma::Cq>();
//! send_sync::<srdma::CompChannel>();
//! send_sync::<srdma::Srq>();
//! fn send_sync_unique<T: Send + Sync>() {}
//! send_sync_unique::<srdma::Mr>(); // unique: it deregisters when dropped
//! ```
//!
//! # Example
//!
//! An RC pair: A writes into B's region and reads it back, then adds to a counter in it.
//!
//! ```
//! use srdma::{AccessFlags, ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RcQp, RemoteQp, WcStatus};
//! use srdma::typed::RemoteAddr;
//! use srdma_wire::Psn;
//!
//! let open = || { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() };
//! let (a, b) = (open(), open());
//! let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
//! let (cqa, cqb) = (a.create_cq(16, None).unwrap(), b.create_cq(16, None).unwrap());
//! let qa = RcQp::create(&pa, &QpInit::new(QpType::Rc, &cqa, &cqa)).unwrap();
//! let qb = RcQp::create(&pb, &QpInit::new(QpType::Rc, &cqb, &cqb)).unwrap();
//! let at = |d: &Device, qp: &RcQp, psn| RemoteQp { qpn: qp.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! qa.connect(&at(&b, &qb, 20), &ConnectParams::new(Mtu::Mtu1024, Psn::new(10))).unwrap();
//! qb.connect(&at(&a, &qa, 10), &ConnectParams::new(Mtu::Mtu1024, Psn::new(20))).unwrap();
//! let wait = || loop { if let Some(wc) = cqa.poll_one() { assert_eq!(wc.status, WcStatus::Success); break wc } };
//!
//! let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
//! let target = pb.reg_mr(4096, rw).unwrap();
//! let remote = RemoteAddr::from(target.remote().unwrap());
//! let local = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! local.write(0, b"typed").unwrap();
//!
//! qa.write(1, local.sge(0, 5), remote.offset(8)).unwrap();
//! assert_eq!(wait().wr_id, 1);
//! qa.read(2, local.sge(100, 5), remote.offset(8)).unwrap();
//! assert_eq!(wait().wr_id, 2);
//! let mut back = [0u8; 5];
//! local.read(100, &mut back).unwrap();
//! assert_eq!(&back, b"typed");
//!
//! qa.fetch_add(3, local.sge(200, 8), remote, 5).unwrap(); // the word at offset 0 was 0
//! wait();
//! qa.fetch_add(4, local.sge(200, 8), remote, 5).unwrap();
//! wait();
//! let mut old = [0u8; 8];
//! local.read(200, &mut old).unwrap();
//! assert_eq!(u64::from_ne_bytes(old), 5); // the value before the second add
//! ```
//!
//! # What does not compile
//!
//! UC has no RDMA READ and no atomics:
//!
//! ```compile_fail,E0599
//! # use srdma::{typed::RemoteAddr, Mr, UcQp};
//! fn fetch(qp: &UcQp, local: &Mr, remote: RemoteAddr) {
//!     qp.read(1, local.sge(0, 8), remote).unwrap();
//! }
//! ```
//!
//! ```compile_fail,E0599
//! # use srdma::{typed::RemoteAddr, Mr, UcQp};
//! fn lock(qp: &UcQp, local: &Mr, remote: RemoteAddr) {
//!     qp.compare_swap(1, local.sge(0, 8), remote, 0, 1).unwrap();
//! }
//! ```
//!
//! UD has no RDMA at all:
//!
//! ```compile_fail,E0599
//! # use srdma::{typed::RemoteAddr, Mr, UdQp};
//! fn put(qp: &UdQp, local: &Mr, remote: RemoteAddr) {
//!     qp.write(1, local.sge(0, 8), remote).unwrap();
//! }
//! ```
//!
//! A UD send names its destination; a connected QP's does not take one:
//!
//! ```compile_fail,E0599
//! # use srdma::{Mr, UdQp};
//! fn hello(qp: &UdQp, local: &Mr) {
//!     qp.send(1, local.sge(0, 5)).unwrap();
//! }
//! ```
//!
//! ```compile_fail,E0599
//! # use srdma::{Mr, RcQp, UdDest};
//! fn hello(qp: &RcQp, dest: &UdDest, local: &Mr) {
//!     qp.send_to(dest, 1, local.sge(0, 5)).unwrap();
//! }
//! ```
//!
//! A UD QP is activated, not connected:
//!
//! ```compile_fail,E0599
//! # use srdma::{ConnectParams, RemoteQp, UdQp};
//! fn up(qp: &UdQp, peer: &RemoteQp, p: &ConnectParams) {
//!     qp.connect(peer, p).unwrap();
//! }
//! ```
//!
//! And one transport's QP does not stand in for another's:
//!
//! ```compile_fail,E0308
//! # use srdma::{RcQp, UcQp};
//! fn needs_rc(qp: &RcQp) {}
//! fn give(qp: &UcQp) {
//!     needs_rc(qp);
//! }
//! ```

use srdma_proto::{QpState, QpType, RKey, RecvWr, SendOp, SendWr, Sge, SgeList, UdDest};
use srdma_wire::{Psn, Qpn};

use crate::device::{Pd, RemoteMr};
use crate::error::{Error, Result};
use crate::qp::{ConnectParams, Qp, QpInit, RemoteQp};

/// Where an RDMA operation lands in the peer's memory: a virtual address and the R_Key of the
/// region covering it (the `remote_addr`/`rkey` pair of `ibv_send_wr`).
///
/// Made from a peer's [`RemoteMr`] descriptor (its first byte) and moved along with
/// [`offset`](RemoteAddr::offset). The peer checks the bounds; an access outside its region
/// completes with a remote access error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key.
    pub rkey: RKey,
}

impl RemoteAddr {
    /// `addr` in the region of `rkey`.
    pub fn new(addr: u64, rkey: RKey) -> RemoteAddr {
        RemoteAddr { addr, rkey }
    }

    /// The address `offset` bytes further on, in the same region.
    #[must_use]
    pub fn offset(self, offset: u64) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        }
    }
}

impl From<RemoteMr> for RemoteAddr {
    /// The region's first byte.
    fn from(r: RemoteMr) -> RemoteAddr {
        RemoteAddr::new(r.addr, RKey(r.rkey))
    }
}

impl From<&RemoteMr> for RemoteAddr {
    /// The region's first byte.
    fn from(r: &RemoteMr) -> RemoteAddr {
        RemoteAddr::from(*r)
    }
}

/// Local memory of a work request: one [`Sge`], an [`SgeList`], an array, slice or `Vec` of
/// them (an empty one for a zero-length message or a receive without buffers).
pub trait IntoSgeList {
    /// The scatter/gather list.
    fn into_sge_list(self) -> SgeList;
}

impl IntoSgeList for Sge {
    fn into_sge_list(self) -> SgeList {
        SgeList::one(self)
    }
}

impl IntoSgeList for SgeList {
    fn into_sge_list(self) -> SgeList {
        self
    }
}

impl<const N: usize> IntoSgeList for [Sge; N] {
    fn into_sge_list(self) -> SgeList {
        self.into_iter().collect()
    }
}

impl IntoSgeList for &[Sge] {
    fn into_sge_list(self) -> SgeList {
        self.iter().copied().collect()
    }
}

impl IntoSgeList for Vec<Sge> {
    fn into_sge_list(self) -> SgeList {
        self.into_iter().collect()
    }
}

/// A [`Qp`] of the wrong transport for the typed QP it was converted to; holds the QP, so
/// the conversion loses nothing.
///
/// ```
/// use srdma::{Device, DeviceConfig, QpInit, QpType, RcQp, UdQp};
///
/// let mut c = DeviceConfig::new([127, 0, 0, 1].into());
/// c.port = 0;
/// let dev = Device::open(c).unwrap();
/// let cq = dev.create_cq(4, None).unwrap();
/// let qp = dev.alloc_pd().create_qp(&QpInit::new(QpType::Ud, &cq, &cq)).unwrap();
///
/// let err = RcQp::try_from(qp).unwrap_err();
/// assert_eq!((err.expected(), err.found()), (QpType::Rc, QpType::Ud));
/// let ud = UdQp::try_from(err.into_qp()).unwrap(); // nothing lost
/// assert_eq!(ud.as_qp().qp_type(), QpType::Ud);
/// ```
#[derive(Debug, Clone)]
pub struct WrongQpType {
    qp: Qp,
    expected: QpType,
}

impl WrongQpType {
    /// The transport the typed QP needs.
    pub fn expected(&self) -> QpType {
        self.expected
    }

    /// The transport the QP has.
    pub fn found(&self) -> QpType {
        self.qp.qp_type()
    }

    /// The QP, back.
    pub fn into_qp(self) -> Qp {
        self.qp
    }
}

impl std::fmt::Display for WrongQpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QP {:#x} is {:?}, not {:?}",
            self.qp.qpn().value(),
            self.found(),
            self.expected
        )
    }
}

impl std::error::Error for WrongQpType {}

/// Posts a signaled send WR of `op` over `sges` (what every typed send method does).
fn post(qp: &Qp, wr_id: u64, op: SendOp, sges: impl IntoSgeList) -> Result<()> {
    qp.post_send(SendWr::new(wr_id, op, sges.into_sge_list()))
}

/// Creates a QP of `qp_type` from `init`, refusing an `init` that asks for another one.
fn create(pd: &Pd, init: &QpInit, qp_type: QpType) -> Result<Qp> {
    if init.qp_type != qp_type {
        return Err(Error::InvalidArgument(format!(
            "a {qp_type:?} QP from QpInit of type {:?}",
            init.qp_type
        )));
    }
    pd.create_qp(init)
}

/// What every typed QP has: construction, conversion, the untyped handle, receives.
macro_rules! typed_qp {
    ($name:ident, $ty:ident, $what:literal) => {
        impl $name {
            #[doc = concat!("Creates ", $what, " QP on `pd` (`ibv_create_qp`, then INIT), ")]
            #[doc = concat!("from `init`, whose `qp_type` must be `QpType::", stringify!($ty), "`.")]
            pub fn create(pd: &Pd, init: &QpInit) -> Result<$name> {
                create(pd, init, QpType::$ty).map(|qp| $name { qp })
            }

            /// The untyped handle (shared, not a copy of the QP): for batches, flags and the
            /// rest of the verbs surface.
            pub fn as_qp(&self) -> &Qp {
                &self.qp
            }

            /// The untyped handle.
            pub fn into_qp(self) -> Qp {
                self.qp
            }

            /// The QP number.
            pub fn qpn(&self) -> Qpn {
                self.qp.qpn()
            }

            /// The current state.
            pub fn state(&self) -> QpState {
                self.qp.state()
            }

            /// Posts a receive of `wr_id` into `sges` (`ibv_post_recv`).
            pub fn post_recv(&self, wr_id: u64, sges: impl IntoSgeList) -> Result<()> {
                self.qp.post_recv(RecvWr {
                    wr_id,
                    sges: sges.into_sge_list(),
                })
            }
        }

        impl TryFrom<Qp> for $name {
            type Error = WrongQpType;

            #[doc = concat!("The QP as ", $what, " QP, if it is one.")]
            fn try_from(qp: Qp) -> std::result::Result<$name, WrongQpType> {
                if qp.qp_type() == QpType::$ty {
                    Ok($name { qp })
                } else {
                    Err(WrongQpType {
                        qp,
                        expected: QpType::$ty,
                    })
                }
            }
        }

        impl From<$name> for Qp {
            fn from(q: $name) -> Qp {
                q.qp
            }
        }

        impl AsRef<Qp> for $name {
            fn as_ref(&self) -> &Qp {
                &self.qp
            }
        }
    };
}

/// What the connected transports (RC, UC) share: connection, SEND and RDMA WRITE.
macro_rules! connected_qp {
    ($name:ident) => {
        impl $name {
            /// INIT → RTR → RTS towards `remote` ([`Qp::connect`]).
            pub fn connect(&self, remote: &RemoteQp, params: &ConnectParams) -> Result<()> {
                self.qp.connect(remote, params)
            }

            /// SEND of `sges`: consumes a receive at the peer.
            pub fn send(&self, wr_id: u64, sges: impl IntoSgeList) -> Result<()> {
                post(&self.qp, wr_id, SendOp::Send, sges)
            }

            /// SEND of `sges` with immediate data `imm`, delivered in the peer's receive
            /// completion.
            pub fn send_with_imm(
                &self,
                wr_id: u64,
                sges: impl IntoSgeList,
                imm: u32,
            ) -> Result<()> {
                post(&self.qp, wr_id, SendOp::SendWithImm { imm }, sges)
            }

            /// RDMA WRITE of `sges` to `remote`: the peer's application sees no completion.
            pub fn write(
                &self,
                wr_id: u64,
                sges: impl IntoSgeList,
                remote: impl Into<RemoteAddr>,
            ) -> Result<()> {
                let r = remote.into();
                let op = SendOp::Write {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                };
                post(&self.qp, wr_id, op, sges)
            }

            /// RDMA WRITE of `sges` to `remote` with immediate data `imm`: consumes a receive
            /// at the peer, whose completion (`RecvRdmaWithImm`) carries `imm`.
            pub fn write_with_imm(
                &self,
                wr_id: u64,
                sges: impl IntoSgeList,
                remote: impl Into<RemoteAddr>,
                imm: u32,
            ) -> Result<()> {
                let r = remote.into();
                let op = SendOp::WriteWithImm {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                    imm,
                };
                post(&self.qp, wr_id, op, sges)
            }
        }
    };
}

/// A reliable connected QP: SEND, RDMA WRITE, RDMA READ and atomics, acknowledged and
/// retransmitted. Cheap to clone; clones share the QP.
#[derive(Debug, Clone)]
pub struct RcQp {
    qp: Qp,
}

/// An unreliable connected QP: SEND and RDMA WRITE, no acknowledgements (a lost packet
/// loses its message), no READ, no atomics. Cheap to clone; clones share the QP.
#[derive(Debug, Clone)]
pub struct UcQp {
    qp: Qp,
}

/// An unreliable datagram QP: SENDs of at most one MTU, each to a destination of its own; no
/// RDMA. Cheap to clone; clones share the QP.
///
/// ```
/// use srdma::{AccessFlags, Device, DeviceConfig, QpInit, QpType, UdDest, UdQp, WcOpcode};
/// use srdma_wire::Psn;
///
/// let open = || { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() };
/// let (a, b) = (open(), open());
/// let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
/// let (cqa, cqb) = (a.create_cq(4, None).unwrap(), b.create_cq(4, None).unwrap());
/// let qa = UdQp::create(&pa, &QpInit::new(QpType::Ud, &cqa, &cqa)).unwrap();
/// let qb = UdQp::create(&pb, &QpInit::new(QpType::Ud, &cqb, &cqb)).unwrap();
/// qa.activate(Psn::new(0)).unwrap();
/// qb.activate(Psn::new(0)).unwrap();
///
/// let inbox = pb.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
/// qb.post_recv(1, inbox.sge(0, 40 + 64)).unwrap(); // GRH area, then the data
/// let mut ah = srdma::ah(b.local_gid());
/// ah.udp_dport = b.local_addr().port();
/// let to_b = UdDest { ah, remote_qpn: qb.qpn(), remote_qkey: 0x1111_1111 };
/// let msg = pa.reg_mr(4096, AccessFlags::empty()).unwrap();
/// msg.write(0, b"hi").unwrap();
/// qa.send_to_with_imm(&to_b, 1, msg.sge(0, 2), 7).unwrap();
///
/// let wc = loop { if let Some(wc) = cqb.poll_one() { break wc } };
/// assert_eq!((wc.opcode, wc.byte_len, wc.imm_data), (WcOpcode::Recv, 40 + 2, Some(7)));
/// assert_eq!(wc.src_qp, qa.qpn());
/// ```
#[derive(Debug, Clone)]
pub struct UdQp {
    qp: Qp,
}

typed_qp!(RcQp, Rc, "an RC");
typed_qp!(UcQp, Uc, "a UC");
typed_qp!(UdQp, Ud, "a UD");
connected_qp!(RcQp);
connected_qp!(UcQp);

impl RcQp {
    /// RDMA READ of `remote` into `sges` (as many bytes as they hold).
    pub fn read(
        &self,
        wr_id: u64,
        sges: impl IntoSgeList,
        remote: impl Into<RemoteAddr>,
    ) -> Result<()> {
        let r = remote.into();
        let op = SendOp::Read {
            remote_addr: r.addr,
            rkey: r.rkey,
        };
        post(&self.qp, wr_id, op, sges)
    }

    /// Atomic compare-and-swap of the 8-byte word at `remote` (8-byte aligned): if it equals
    /// `compare` it becomes `swap`. The original value lands in `result` (8 bytes, host byte
    /// order), so it equals `compare` exactly when the swap happened.
    pub fn compare_swap(
        &self,
        wr_id: u64,
        result: Sge,
        remote: impl Into<RemoteAddr>,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        let r = remote.into();
        let op = SendOp::CompareSwap {
            remote_addr: r.addr,
            rkey: r.rkey,
            compare,
            swap,
        };
        post(&self.qp, wr_id, op, result)
    }

    /// Atomic fetch-and-add of `add` to the 8-byte word at `remote` (8-byte aligned); the
    /// value before the addition lands in `result` (8 bytes, host byte order).
    pub fn fetch_add(
        &self,
        wr_id: u64,
        result: Sge,
        remote: impl Into<RemoteAddr>,
        add: u64,
    ) -> Result<()> {
        let r = remote.into();
        let op = SendOp::FetchAdd {
            remote_addr: r.addr,
            rkey: r.rkey,
            add,
        };
        post(&self.qp, wr_id, op, result)
    }
}

impl UdQp {
    /// INIT → RTR → RTS, first send PSN `sq_psn` ([`Qp::activate`]).
    pub fn activate(&self, sq_psn: Psn) -> Result<()> {
        self.qp.activate(sq_psn)
    }

    /// SEND of `sges` (at most one MTU) to `dest`. The receiver's buffer needs 40 bytes in
    /// front of the data for the GRH.
    pub fn send_to(&self, dest: &UdDest, wr_id: u64, sges: impl IntoSgeList) -> Result<()> {
        self.send_op(dest, wr_id, SendOp::Send, sges)
    }

    /// SEND of `sges` to `dest` with immediate data `imm`.
    pub fn send_to_with_imm(
        &self,
        dest: &UdDest,
        wr_id: u64,
        sges: impl IntoSgeList,
        imm: u32,
    ) -> Result<()> {
        self.send_op(dest, wr_id, SendOp::SendWithImm { imm }, sges)
    }

    fn send_op(&self, dest: &UdDest, wr_id: u64, op: SendOp, sges: impl IntoSgeList) -> Result<()> {
        self.qp
            .post_send(SendWr::new(wr_id, op, sges.into_sge_list()).to_ud(*dest))
    }
}
