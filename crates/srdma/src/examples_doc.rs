//! Cookbook: every operation of the transport as a short, runnable example.
//!
//! Each example is a doctest that runs: two devices on the loopback address, each bound to a
//! free UDP port (`port = 0`; a RoCE peer would be on 4791 of its own address), talk RoCEv2 to
//! each other through the kernel. The examples use the plain verbs surface ([`Qp`],
//! [`SendWr`], [`Cq`]); [`crate::typed`] has the same operations as methods of [`RcQp`],
//! [`UcQp`] and [`UdQp`], checked by the compiler.
//!
//! | operation | example |
//! |---|---|
//! | SEND / RECV | [SEND and RECV](#send-and-recv) |
//! | SEND with immediate | [SEND with immediate](#send-with-immediate) |
//! | RDMA WRITE | [RDMA WRITE](#rdma-write) |
//! | RDMA WRITE with immediate | [RDMA WRITE with immediate](#rdma-write-with-immediate) |
//! | RDMA READ | [RDMA READ](#rdma-read) |
//! | compare-and-swap | [Compare-and-swap](#compare-and-swap) |
//! | fetch-and-add | [Fetch-and-add](#fetch-and-add) |
//! | UD SEND | [UD SEND](#ud-send) |
//! | shared receive queue | [Shared receive queue](#shared-receive-queue) |
//! | completion channel, `req_notify` | [Completion channel](#completion-channel) |
//!
//! # Setup
//!
//! The examples share this setup; it is written out here and hidden in the others (the lines
//! are in the source). `pair()` gives two ends of an RC connection, `a` and `b`, each with
//! its device, protection domain, CQ (for sends and receives) and QP; `wait` polls a CQ for
//! the next completion, for at most ten seconds.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use srdma::*;
//! use srdma_wire::Psn;
//!
//! struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//!
//! /// A device on 127.0.0.1 at a free UDP port.
//! fn open() -> Device {
//!     let mut c = DeviceConfig::new([127, 0, 0, 1].into());
//!     c.port = 0;
//!     Device::open(c).unwrap()
//! }
//!
//! /// A device with a PD, a CQ and a QP of type `t` (in INIT).
//! fn end(t: QpType) -> End {
//!     let dev = open();
//!     let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap());
//!     let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap();
//!     End { dev, pd, cq, qp }
//! }
//!
//! /// Connects `qa` on `da` and `qb` on `db` to each other (what `srdma::cm` or an
//! /// out-of-band exchange of QP numbers, PSNs, GIDs and ports does).
//! fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//!     let at = |d: &Device, q: &Qp, psn| RemoteQp {
//!         qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port(),
//!     };
//!     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//!     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! }
//!
//! fn pair() -> (End, End) {
//!     let (a, b) = (end(QpType::Rc), end(QpType::Rc));
//!     link(&a.dev, &a.qp, &b.dev, &b.qp);
//!     (a, b)
//! }
//!
//! fn wait(cq: &Cq) -> Wc {
//!     let t = Instant::now();
//!     loop {
//!         if let Some(wc) = cq.poll_one() {
//!             return wc;
//!         }
//!         assert!(t.elapsed() < Duration::from_secs(10), "no completion");
//!         std::thread::sleep(Duration::from_micros(50));
//!     }
//! }
//!
//! let (a, b) = pair();
//! assert_eq!(a.qp.state(), QpState::Rts);
//! assert_eq!(b.qp.state(), QpState::Rts);
//! ```
//!
//! # SEND and RECV
//!
//! The receiver posts a buffer first; the SEND consumes it, and both sides get a completion.
//! The receive completion says how many bytes arrived.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! let inbox = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! b.qp.post_recv(RecvWr { wr_id: 7, sges: SgeList::one(inbox.sge(0, 64)) }).unwrap();
//!
//! let outbox = a.pd.reg_mr(4096, AccessFlags::empty()).unwrap(); // SEND only reads it
//! outbox.write(0, b"ping").unwrap();
//! a.qp.post_send(SendWr::new(1, SendOp::Send, SgeList::one(outbox.sge(0, 4)))).unwrap();
//!
//! let sent = wait(&a.cq);
//! assert_eq!((sent.wr_id, sent.status, sent.opcode), (1, WcStatus::Success, WcOpcode::Send));
//! let got = wait(&b.cq);
//! assert_eq!((got.wr_id, got.status, got.opcode), (7, WcStatus::Success, WcOpcode::Recv));
//! assert_eq!(got.byte_len, 4);
//! let mut data = [0u8; 4];
//! inbox.read(0, &mut data).unwrap();
//! assert_eq!(&data, b"ping");
//! ```
//!
//! # SEND with immediate
//!
//! Four bytes of immediate data travel in the header and arrive in the receive completion,
//! next to the message (which may be empty: a zero-length SEND with immediate is a doorbell).
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! b.qp.post_recv(RecvWr { wr_id: 1, sges: SgeList::new() }).unwrap(); // no buffer needed
//!
//! a.qp.post_send(SendWr::new(9, SendOp::SendWithImm { imm: 0xC0FFEE }, SgeList::new())).unwrap();
//! assert_eq!(wait(&a.cq).status, WcStatus::Success);
//!
//! let got = wait(&b.cq);
//! assert_eq!((got.status, got.opcode, got.byte_len), (WcStatus::Success, WcOpcode::Recv, 0));
//! assert_eq!(got.imm_data, Some(0xC0FFEE));
//! assert!(got.wc_flags.contains(WcFlags::WITH_IMM));
//! ```
//!
//! # RDMA WRITE
//!
//! One-sided: the data lands in the target's region, named by its address and R_Key (a
//! [`RemoteMr`] the target sent earlier). Only the initiator gets a completion; the
//! target's application is not involved and its CQ stays empty.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! let target = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
//! let remote: RemoteMr = target.remote().unwrap(); // what B tells A
//!
//! let src = a.pd.reg_mr(4096, AccessFlags::empty()).unwrap();
//! src.write(0, &[0xAB; 3000]).unwrap(); // three packets at MTU 1024
//! let op = SendOp::Write { remote_addr: remote.addr + 100, rkey: RKey(remote.rkey) };
//! a.qp.post_send(SendWr::new(1, op, SgeList::one(src.sge(0, 3000)))).unwrap();
//!
//! let wc = wait(&a.cq);
//! assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaWrite, 3000));
//! assert!(target.with_bytes(|m| m[..100].iter().all(|&x| x == 0) && m[100..3100].iter().all(|&x| x == 0xAB)));
//! assert!(b.cq.poll_one().is_none());
//! ```
//!
//! # RDMA WRITE with immediate
//!
//! A WRITE that also notifies: the data goes where the WRITE says, and the immediate data
//! consumes a receive at the target, whose completion (`RecvRdmaWithImm`) carries it and the
//! length written. The receive needs no buffer.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! let ring = b.pd.reg_mr(8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
//! let remote = ring.remote().unwrap();
//! b.qp.post_recv(RecvWr { wr_id: 5, sges: SgeList::new() }).unwrap();
//!
//! let src = a.pd.reg_mr(4096, AccessFlags::empty()).unwrap();
//! src.write(0, b"chunk three").unwrap();
//! let op = SendOp::WriteWithImm { remote_addr: remote.addr + 4096, rkey: RKey(remote.rkey), imm: 3 };
//! a.qp.post_send(SendWr::new(1, op, SgeList::one(src.sge(0, 11)))).unwrap();
//! assert_eq!(wait(&a.cq).opcode, WcOpcode::RdmaWrite);
//!
//! let got = wait(&b.cq);
//! assert_eq!((got.wr_id, got.status, got.opcode), (5, WcStatus::Success, WcOpcode::RecvRdmaWithImm));
//! assert_eq!((got.imm_data, got.byte_len), (Some(3), 11));
//! let mut data = [0u8; 11];
//! ring.read(4096, &mut data).unwrap(); // the immediate says which slot; 3 → offset 4096 here
//! assert_eq!(&data, b"chunk three");
//! ```
//!
//! # RDMA READ
//!
//! One-sided the other way: the initiator fetches bytes from the target's region (granted
//! `REMOTE_READ`) into its own, which must be writable.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! let table = b.pd.reg_mr(4096, AccessFlags::REMOTE_READ).unwrap();
//! table.write(0, b"the answer is 42").unwrap();
//! let remote = table.remote().unwrap();
//!
//! let dst = a.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! let op = SendOp::Read { remote_addr: remote.addr + 14, rkey: RKey(remote.rkey) };
//! a.qp.post_send(SendWr::new(1, op, SgeList::one(dst.sge(0, 2)))).unwrap();
//!
//! let wc = wait(&a.cq);
//! assert_eq!((wc.status, wc.opcode, wc.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 2));
//! let mut got = [0u8; 2];
//! dst.read(0, &mut got).unwrap();
//! assert_eq!(&got, b"42");
//! ```
//!
//! # Compare-and-swap
//!
//! An atomic on an 8-byte aligned word of the target's region (granted `REMOTE_ATOMIC`): if
//! it equals `compare` it becomes `swap`. The word's previous value comes back into the
//! initiator's 8-byte buffer either way, so comparing it with `compare` tells whether the
//! swap happened. Words are in host byte order. Here A takes a lock word that is free (0),
//! then fails to take it again.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! let locks = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).unwrap();
//! let remote = locks.remote().unwrap();
//! let old = a.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! let word = |mr: &Mr| { let mut b = [0u8; 8]; mr.read(0, &mut b).unwrap(); u64::from_ne_bytes(b) };
//!
//! let take = SendOp::CompareSwap { remote_addr: remote.addr, rkey: RKey(remote.rkey), compare: 0, swap: 0xA };
//! a.qp.post_send(SendWr::new(1, take, SgeList::one(old.sge(0, 8)))).unwrap();
//! let wc = wait(&a.cq);
//! assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::CompSwap));
//! assert_eq!(word(&old), 0); // it was free: taken
//! assert_eq!(word(&locks), 0xA);
//!
//! let take_again = SendOp::CompareSwap { remote_addr: remote.addr, rkey: RKey(remote.rkey), compare: 0, swap: 0xB };
//! a.qp.post_send(SendWr::new(2, take_again, SgeList::one(old.sge(0, 8)))).unwrap();
//! assert_eq!(wait(&a.cq).status, WcStatus::Success);
//! assert_eq!(word(&old), 0xA); // held by 0xA: no swap
//! assert_eq!(word(&locks), 0xA);
//! ```
//!
//! # Fetch-and-add
//!
//! Adds to an 8-byte aligned word of the target's region and returns the value before the
//! addition: a ticket counter several initiators can share.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn pair() -> (End, End) { let (a, b) = (end(QpType::Rc), end(QpType::Rc)); link(&a.dev, &a.qp, &b.dev, &b.qp); (a, b) }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = pair();
//! let counter = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).unwrap();
//! counter.write(64, &100u64.to_ne_bytes()).unwrap();
//! let remote = counter.remote().unwrap();
//! let tickets = a.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//!
//! for i in 0..3u64 {
//!     let op = SendOp::FetchAdd { remote_addr: remote.addr + 64, rkey: RKey(remote.rkey), add: 1 };
//!     a.qp.post_send(SendWr::new(i, op, SgeList::one(tickets.sge(8 * i as usize, 8)))).unwrap();
//! }
//! for i in 0..3 {
//!     let wc = wait(&a.cq); // completions come in posting order
//!     assert_eq!((wc.wr_id, wc.status, wc.opcode), (i, WcStatus::Success, WcOpcode::FetchAdd));
//! }
//! let mut got = [0u8; 24];
//! tickets.read(0, &mut got).unwrap();
//! let got: Vec<u64> = got.chunks(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap())).collect();
//! assert_eq!(got, [100, 101, 102]);
//! let mut now = [0u8; 8];
//! counter.read(64, &mut now).unwrap();
//! assert_eq!(u64::from_ne_bytes(now), 103);
//! ```
//!
//! # UD SEND
//!
//! Datagrams: a UD QP is not connected but activated, and every SEND names its destination
//! (address vector, QP number, Q_Key). Messages are at most one MTU; the receive buffer
//! needs 40 bytes in front for the GRH, and the completion says which QP sent it.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let (a, b) = (end(QpType::Ud), end(QpType::Ud)); // Q_Key 0x11111111 from QpInit::new
//! a.qp.activate(Psn::new(1)).unwrap();
//! b.qp.activate(Psn::new(1)).unwrap();
//! let inbox = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! b.qp.post_recv(RecvWr { wr_id: 3, sges: SgeList::one(inbox.sge(0, 40 + 1024)) }).unwrap();
//!
//! let mut ah = srdma::ah(b.dev.local_gid());
//! ah.udp_dport = b.dev.local_addr().port(); // a RoCE peer: 4791, the default
//! let dest = UdDest { ah, remote_qpn: b.qp.qpn(), remote_qkey: 0x1111_1111 };
//! let msg = a.pd.reg_mr(4096, AccessFlags::empty()).unwrap();
//! msg.write(0, b"datagram").unwrap();
//! a.qp.post_send(SendWr::new(1, SendOp::Send, SgeList::one(msg.sge(0, 8))).to_ud(dest)).unwrap();
//! assert_eq!(wait(&a.cq).status, WcStatus::Success); // sent (UD has no acknowledgement)
//!
//! let got = wait(&b.cq);
//! assert_eq!((got.wr_id, got.status, got.opcode), (3, WcStatus::Success, WcOpcode::Recv));
//! assert_eq!(got.byte_len, 40 + 8); // the GRH area counts
//! assert_eq!(got.src_qp, a.qp.qpn());
//! assert!(got.wc_flags.contains(WcFlags::GRH));
//! let mut data = [0u8; 8];
//! inbox.read(40, &mut data).unwrap();
//! assert_eq!(&data, b"datagram");
//! ```
//!
//! # Shared receive queue
//!
//! Several QPs receive from one pool of buffers ([`Srq`]) instead of each keeping its own:
//! B serves two connections from four buffers. A QP created with an SRQ takes no receives
//! of its own.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let b = open();
//! let (pd, cq) = (b.alloc_pd(), b.create_cq(16, None).unwrap());
//! let srq = pd.create_srq(16, 1).unwrap();
//! let bufs = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! for i in 0..4 {
//!     srq.post_recv(RecvWr { wr_id: i, sges: SgeList::one(bufs.sge(64 * i as usize, 64)) }).unwrap();
//! }
//! let mut init = QpInit::new(QpType::Rc, &cq, &cq);
//! init.srq = Some(srq.clone());
//! let (b1, b2) = (pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap());
//! assert!(b1.post_recv(RecvWr { wr_id: 9, sges: SgeList::new() }).is_err()); // post to the SRQ
//!
//! let (a1, a2) = (end(QpType::Rc), end(QpType::Rc));
//! link(&a1.dev, &a1.qp, &b, &b1);
//! link(&a2.dev, &a2.qp, &b, &b2);
//! // Inline sends: the data is copied at post time, no registered buffer needed.
//! a1.qp.post_send(SendWr::new(1, SendOp::Send, SgeList::new()).with_inline(b"one".to_vec())).unwrap();
//! let first = wait(&cq);
//! a2.qp.post_send(SendWr::new(1, SendOp::Send, SgeList::new()).with_inline(b"two".to_vec())).unwrap();
//! let second = wait(&cq);
//!
//! // The buffers were taken in order, whichever QP the message came to.
//! assert_eq!((first.wr_id, first.qp_num, first.byte_len), (0, b1.qpn(), 3));
//! assert_eq!((second.wr_id, second.qp_num, second.byte_len), (1, b2.qpn(), 3));
//! let mut got = [0u8; 3];
//! bufs.read(64, &mut got).unwrap();
//! assert_eq!(&got, b"two");
//! assert_eq!(srq.len(), 2);
//! ```
//!
//! # Completion channel
//!
//! To sleep instead of polling: create the CQ with a [`CompChannel`], arm it with
//! [`Cq::req_notify`], and wait in [`CompChannel::get_event`] (or in `poll`/`epoll`/tokio on
//! its file descriptor: it is [`AsFd`](std::os::fd::AsFd)). One event per arming: re-arm,
//! then poll the CQ empty, so a completion that arrives in between is not missed. Armed
//! with `solicited_only`, only messages sent with [`SendFlags::SOLICITED`] (and errors)
//! fire.
//!
//! ```
//! # use std::time::{Duration, Instant};
//! # use srdma::*;
//! # use srdma_wire::Psn;
//! # struct End { dev: Device, pd: Pd, cq: Cq, qp: Qp }
//! # fn open() -> Device { let mut c = DeviceConfig::new([127, 0, 0, 1].into()); c.port = 0; Device::open(c).unwrap() }
//! # fn end(t: QpType) -> End { let dev = open(); let (pd, cq) = (dev.alloc_pd(), dev.create_cq(16, None).unwrap()); let qp = pd.create_qp(&QpInit::new(t, &cq, &cq)).unwrap(); End { dev, pd, cq, qp } }
//! # fn link(da: &Device, qa: &Qp, db: &Device, qb: &Qp) {
//! #     let at = |d: &Device, q: &Qp, psn| RemoteQp { qpn: q.qpn(), psn: Psn::new(psn), gid: d.local_gid(), port: d.local_addr().port() };
//! #     qa.connect(&at(db, qb, 200), &ConnectParams::new(Mtu::Mtu1024, Psn::new(100))).unwrap();
//! #     qb.connect(&at(da, qa, 100), &ConnectParams::new(Mtu::Mtu1024, Psn::new(200))).unwrap();
//! # }
//! # fn wait(cq: &Cq) -> Wc { let t = Instant::now(); loop { if let Some(wc) = cq.poll_one() { return wc } assert!(t.elapsed() < Duration::from_secs(10), "no completion"); std::thread::sleep(Duration::from_micros(50)) } }
//! let a = end(QpType::Rc);
//! let b = open();
//! let channel = CompChannel::new().unwrap();
//! let cq = b.create_cq(16, Some(&channel)).unwrap();
//! let qp = b.alloc_pd().create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
//! link(&a.dev, &a.qp, &b, &qp);
//! for i in 0..4 {
//!     qp.post_recv(RecvWr { wr_id: i, sges: SgeList::new() }).unwrap();
//! }
//! let send = |flags| a.qp.post_send(SendWr::new(0, SendOp::Send, SgeList::new()).with_flags(flags)).unwrap();
//! let timeout = Some(Duration::from_secs(10));
//!
//! // Any completion fires.
//! cq.req_notify(false);
//! send(SendFlags::SIGNALED);
//! assert_eq!(channel.get_event(timeout).unwrap(), Some(cq.id())); // slept until it came
//! cq.req_notify(false); // re-arm first, then drain
//! let mut drained = Vec::new();
//! while let Some(wc) = cq.poll_one() {
//!     drained.push(wc.wr_id);
//! }
//! assert_eq!(drained, [0]);
//!
//! // Solicited only: an ordinary SEND completes without an event, a solicited one fires.
//! cq.req_notify(true);
//! send(SendFlags::SIGNALED);
//! assert_eq!(wait(&cq).wr_id, 1);
//! assert_eq!(channel.get_event(Some(Duration::ZERO)).unwrap(), None);
//! send(SendFlags::SIGNALED | SendFlags::SOLICITED);
//! assert_eq!(channel.get_event(timeout).unwrap(), Some(cq.id()));
//! let wc = wait(&cq);
//! assert_eq!((wc.wr_id, wc.solicited), (2, true));
//! ```
//!
//! [`Qp`]: crate::Qp
//! [`SendWr`]: crate::SendWr
//! [`Cq`]: crate::Cq
//! [`Cq::req_notify`]: crate::Cq::req_notify
//! [`RcQp`]: crate::RcQp
//! [`UcQp`]: crate::UcQp
//! [`UdQp`]: crate::UdQp
//! [`RemoteMr`]: crate::RemoteMr
//! [`Srq`]: crate::Srq
//! [`CompChannel`]: crate::CompChannel
//! [`CompChannel::get_event`]: crate::CompChannel::get_event
//! [`SendFlags::SOLICITED`]: crate::SendFlags::SOLICITED
