//! Connection management over TCP: what `rdma_cm` does for verbs applications, with a TCP
//! connection carrying the handshake instead of IB CM MADs on QP1.
//!
//! The passive side binds a [`Listener`] and takes [`ConnectRequest`]s from it; each request
//! carries the peer's QP number, first PSN, GID, UDP port, path MTU and private data, and is
//! answered with [`ConnectRequest::accept`] (or [`ConnectRequest::accept_with`]) or
//! [`ConnectRequest::reject`]. The active side calls [`connect`]. Both get a [`Connection`]
//! whose QP is in RTS; [`Connection::poll_event`] reports the peer's disconnect and
//! [`Connection::disconnect`] starts one. The TCP connection stays open for the life of the
//! RDMA connection: it carries the disconnect, and its loss counts as one.
//!
//! The exchange is the IB CM's, on TCP:
//!
//! ```text
//!   active (connect)                         passive (Listener)
//!   create QP (INIT), random PSN
//!   TCP connect ──────────────────────────▶  accept_request → ConnectRequest
//!   REQ {qpn, psn, gid, port, mtu, ...}  ──▶
//!                                            accept: QP INIT→RTR→RTS, random PSN
//!                                       ◀──  REP {qpn, psn, gid, port, mtu = min, ...}
//!   QP INIT→RTR→RTS                          (or REJ {reason, private data}: Rejected)
//!   RTU ──────────────────────────────────▶  accept returns: Established
//!   ...RDMA traffic on the QPs...
//!   disconnect: QP→ERR, DREQ ─────────────▶  poll_event: QP→ERR, Disconnected
//!   poll_event: Disconnected            ◀──  DREP
//! ```
//!
//! The passive QP reaches RTS before the REP leaves, so the active side may post as soon as
//! [`connect`] returns. Path MTU: the minimum of what each side offers (its option or its
//! device's active MTU). Read/atomic depth: each side's `max_rd_atomic` is its
//! `initiator_depth` capped by the peer's `responder_resources`, as `rdma_cm` negotiates.
//! Retry counts, ACK timeout and RNR timer are each side's own ([`ConnectOptions`]). The
//! GIDs and UDP ports come from the REQ and REP, not from the TCP addresses, so the CM link
//! may run between other addresses than the RoCE traffic; a GID of the other address family
//! than the local device's is refused ([`reason::INVALID_GID`]).
//!
//! # Wire format (version 1)
//!
//! Every message is a 6-byte header and a body, all integers big-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `"CM"` (0x43 0x4D) |
//! | 2 | 1 | protocol version: 1 ([`PROTOCOL_VERSION`]) |
//! | 3 | 1 | message type: REQ 0x10, REJ 0x12, REP 0x13, RTU 0x14, DREQ 0x15, DREP 0x16 (the IB CM attribute IDs) |
//! | 4 | 2 | body length in bytes |
//! | 6 | n | body |
//!
//! REQ and REP bodies (31 bytes + private data):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | QPN (24 bits; the top byte is zero) |
//! | 4 | 4 | first send PSN (24 bits) |
//! | 8 | 16 | GID (IPv4-mapped IPv6 for IPv4) |
//! | 24 | 2 | UDP port of the sender's RoCE device (4791 for a standard peer) |
//! | 26 | 1 | path MTU as `ibv_mtu` (1 = 256 … 5 = 4096): the largest the sender accepts in a REQ, the one chosen in a REP |
//! | 27 | 1 | transport: 0 = RC, 1 = UC (the IB CM's transport service type) |
//! | 28 | 1 | responder_resources: READ/atomic requests the sender accepts in flight |
//! | 29 | 1 | initiator_depth: READ/atomic requests the sender issues in flight |
//! | 30 | 1 | private data length, 0..=196 |
//! | 31 | n | private data |
//! | 31+n | 8 | optional ECE: vendor ID (a 24-bit OUI, in 4 bytes) and option bits. A REQ carries what its QP offers ([`crate::Qp::query_ece`]: srdma's selective repeat for RC unless `SRDMA_ECE=0`), a REP what the passive side agreed ([`crate::Qp::set_ece`]); absent, nothing is offered or agreed and both QPs keep the IBTA's go-back-N |
//!
//! REJ body: reason (2 bytes, the IB CM REJ reasons, see [`reason`]), private data length
//! (1 byte, 0..=196), private data. RTU, DREQ and DREP bodies are empty.
//!
//! A message whose body length does not match its type, a field out of range, a magic or
//! version other than these, or private data over [`MAX_PRIVATE_DATA`] bytes is a protocol
//! error ([`CmError::Protocol`]); a listener answers a bad REQ with a REJ naming the fault
//! ([`reason::INVALID_CLASS_VERSION`], [`reason::INVALID_MTU`],
//! [`reason::INVALID_TRANSPORT_TYPE`], else [`reason::UNSUPPORTED`]) and closes. Later
//! versions may lengthen bodies; a version 1 peer refuses them (an srdma from before the
//! ECE trailer refuses a REQ that carries one: run `SRDMA_ECE=0` beside such a peer).
//!
//! # Timeouts
//!
//! Every read has a deadline: [`connect`] gives up after [`ConnectOptions::timeout`] in
//! total (TCP connect and REP), [`ConnectRequest::accept_with`] waits that long for the
//! RTU, a listener waits at most [`REQUEST_TIMEOUT`] for a connected client's REQ, and a
//! disconnecting side waits at most [`DREP_TIMEOUT`] for the DREP before reporting
//! [`CmEvent::Disconnected`] anyway. Writes time out after two seconds.
//!
//! # Example
//!
//! A server thread accepts with a memory region's descriptor as private data; the client
//! writes into the region with RDMA WRITE and disconnects.
//!
//! ```
//! use std::time::Duration;
//! use srdma::cm::{self, CmEvent, ConnectOptions, Listener};
//! use srdma::{AccessFlags, Device, DeviceConfig, QpInit, QpType, SendOp, SendWr, SgeList, WcStatus};
//!
//! let open = |ip: &str| {
//!     let mut c = DeviceConfig::new(ip.parse().unwrap());
//!     c.port = 0; // any free UDP port, so two devices share the host
//!     Device::open(c).unwrap()
//! };
//! let (server_dev, client_dev) = (open("127.0.0.1"), open("127.0.0.1"));
//!
//! let server_pd = server_dev.alloc_pd();
//! let listener = Listener::bind(&server_dev, &server_pd, "127.0.0.1:0".parse().unwrap()).unwrap();
//! let addr = listener.local_addr();
//! let server = std::thread::spawn(move || {
//!     let cq = server_pd.device().create_cq(16, None).unwrap();
//!     let mr = server_pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
//!     let req = listener.accept_request(Some(Duration::from_secs(10))).unwrap();
//!     assert_eq!(req.private_data(), b"hello");
//!     // The descriptor the client needs: address, rkey, length, big-endian.
//!     let r = mr.remote().unwrap();
//!     let mut desc = r.addr.to_be_bytes().to_vec();
//!     desc.extend(r.rkey.to_be_bytes());
//!     desc.extend((r.len as u32).to_be_bytes());
//!     let conn = req.accept(&QpInit::new(QpType::Rc, &cq, &cq), &desc).unwrap();
//!     // Wait for the client's disconnect, then read what it wrote.
//!     assert!(matches!(conn.poll_event(None), Some(CmEvent::Established)));
//!     assert!(matches!(conn.poll_event(Some(Duration::from_secs(10))), Some(CmEvent::Disconnected)));
//!     let mut got = [0u8; 5];
//!     mr.read(0, &mut got).unwrap();
//!     got
//! });
//!
//! let pd = client_dev.alloc_pd();
//! let cq = client_dev.create_cq(16, None).unwrap();
//! let opts = ConnectOptions { private_data: b"hello".to_vec(), ..ConnectOptions::default() };
//! let conn = cm::connect(&client_dev, &pd, addr, &QpInit::new(QpType::Rc, &cq, &cq), &opts).unwrap();
//! let d = conn.remote_private_data();
//! let (raddr, rkey) = (u64::from_be_bytes(d[..8].try_into().unwrap()), u32::from_be_bytes(d[8..12].try_into().unwrap()));
//!
//! let src = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
//! src.write(0, b"world").unwrap();
//! let op = SendOp::Write { remote_addr: raddr, rkey: srdma::RKey(rkey) };
//! conn.qp().post_send(SendWr::new(1, op, SgeList::one(src.sge(0, 5)))).unwrap();
//! let wc = loop { if let Some(wc) = cq.poll_one() { break wc } };
//! assert_eq!(wc.status, WcStatus::Success);
//! conn.disconnect().unwrap();
//! assert_eq!(&server.join().unwrap(), b"world");
//! ```

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use srdma_proto::{AttrMask, Mtu, QpAttr, QpState, QpType};
use srdma_wire::{Psn, Qpn};

use crate::device::{Device, Pd};
use crate::error::Error;
use crate::qp::{ConnectParams, Qp, QpInit, RemoteQp};
use crate::sys;
use crate::types::Gid;

/// The most private data a REQ, REP or REJ carries (the IB CM REP's 196 bytes).
pub const MAX_PRIVATE_DATA: usize = 196;

/// The wire protocol version this module speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// How long a listener waits for the REQ of a client whose TCP connection it accepted.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a disconnecting side waits for the peer's DREP before reporting
/// [`CmEvent::Disconnected`] without it.
pub const DREP_TIMEOUT: Duration = Duration::from_secs(2);

const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// A blocked [`Connection::poll_event`] re-checks the connection state this often.
const POLL_SLICE: Duration = Duration::from_millis(100);
/// How often a [`Connection::poll_event`] whose reader another thread holds checks back.
const BUSY_WAIT: Duration = Duration::from_millis(5);

const MAGIC: [u8; 2] = *b"CM";
const HEADER_LEN: usize = 6;
const HELLO_LEN: usize = 31;
/// The optional ECE trailer of a REQ or REP: vendor ID, options.
const ECE_LEN: usize = 8;

const T_REQ: u8 = 0x10;
const T_REJ: u8 = 0x12;
const T_REP: u8 = 0x13;
const T_RTU: u8 = 0x14;
const T_DREQ: u8 = 0x15;
const T_DREP: u8 = 0x16;

/// REJ reasons: the IB CM's (`enum ib_cm_rej_reason`), so a later IB CM implementation reports
/// the same numbers. Applications usually reject with [`CONSUMER_DEFINED`](reason::CONSUMER_DEFINED)
/// and say why in the private data.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Out of resources (a QP could not be connected).
    pub const NO_RESOURCES: u16 = 3;
    /// The request timed out.
    pub const TIMEOUT: u16 = 4;
    /// Malformed or unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// The transport (RC/UC) does not match the accepting QP's.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// The GID cannot be reached from this device (other address family).
    pub const INVALID_GID: u16 = 12;
    /// The path MTU is unusable.
    pub const INVALID_MTU: u16 = 26;
    /// Nobody listens on the requested service (IB CM; what a REQ for a closed port gets).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Rejected by the application (what `rdma_reject` sends, and what a dropped request
    /// sends).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// The peer speaks another protocol version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// Why a connection could not be made or went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The peer answered with a REJ (`RDMA_CM_EVENT_REJECTED`).
    #[error("rejected by the peer (reason {reason}, {} bytes of private data)", private_data.len())]
    Rejected {
        /// The reject reason ([`reason`]; applications' own rejects are
        /// [`reason::CONSUMER_DEFINED`]).
        reason: u16,
        /// The peer's private data.
        private_data: Vec<u8>,
    },
    /// The peer did not answer in time.
    #[error("timed out waiting for the peer")]
    Timeout,
    /// The TCP connection to the server failed: refused (no listener), no route, or no
    /// answer to the TCP handshake within the timeout.
    #[error("server unreachable: {0}")]
    Unreachable(#[source] io::Error),
    /// The peer sent something this protocol does not allow; the text says what.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Private data over [`MAX_PRIVATE_DATA`] bytes; nothing was sent.
    #[error("{0} bytes of private data, at most 196 fit")]
    PrivateDataTooLong(usize),
    /// The peer closed (or reset) the TCP connection in the middle of the exchange.
    #[error("the peer closed the connection")]
    Closed,
    /// A socket operation failed.
    #[error("socket error: {0}")]
    Io(#[source] io::Error),
    /// A verbs call (QP creation, connection) failed, or an argument is invalid.
    #[error(transparent)]
    Verbs(#[from] Error),
}

/// A connection-manager event, as `rdma_get_cm_event` reports them.
#[derive(Debug)]
#[non_exhaustive]
pub enum CmEvent {
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a peer asks to connect ([`Listener::poll_event`]).
    ConnectRequest(ConnectRequest),
    /// `RDMA_CM_EVENT_ESTABLISHED`: the first event of every [`Connection`].
    Established,
    /// `RDMA_CM_EVENT_REJECTED`: the peer refused.
    Rejected {
        /// The reject reason ([`reason`]).
        reason: u16,
        /// The peer's private data.
        private_data: Vec<u8>,
    },
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is over and the QP in ERR, its
    /// outstanding work flushed. Nothing follows it.
    Disconnected,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the exchange failed (protocol error, local error).
    ConnectError(CmError),
    /// `RDMA_CM_EVENT_UNREACHABLE`: the server could not be reached or did not answer
    /// (`TimedOut`).
    Unreachable(io::Error),
}

impl From<CmError> for CmEvent {
    /// The event `rdma_cm` reports for the failure: REJ → `Rejected`, no route or no answer →
    /// `Unreachable`, anything else → `ConnectError`.
    fn from(e: CmError) -> CmEvent {
        match e {
            CmError::Rejected {
                reason,
                private_data,
            } => CmEvent::Rejected {
                reason,
                private_data,
            },
            CmError::Unreachable(io) => CmEvent::Unreachable(io),
            CmError::Timeout => CmEvent::Unreachable(io::ErrorKind::TimedOut.into()),
            e => CmEvent::ConnectError(e),
        }
    }
}

/// Connection parameters (`struct rdma_conn_param` plus the QP attributes `rdma_cm` picks),
/// for [`connect`] and [`ConnectRequest::accept_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Sent in the REQ (active) or REP (passive): at most [`MAX_PRIVATE_DATA`] bytes.
    pub private_data: Vec<u8>,
    /// Active: the whole exchange (TCP connect, REQ, REP). Passive: the wait for the RTU.
    pub timeout: Duration,
    /// Transport retries of the local QP (0..=7).
    pub retry_cnt: u8,
    /// RNR retries of the local QP (0..=7; 7 = forever).
    pub rnr_retry: u8,
    /// The largest path MTU to use; `None`: the device's active MTU (it is also the cap).
    pub mtu: Option<Mtu>,
    /// READ/atomic requests the local QP accepts in flight (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READ/atomic requests the local QP issues in flight, capped by the peer's
    /// responder resources (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Local ACK timeout exponent (4.096 µs × 2^n; 0..=31).
    pub ack_timeout: u8,
    /// RNR NAK timer code the local QP asks senders to wait (0..=31).
    pub min_rnr_timer: u8,
    /// IP hop limit / TTL of the QP's packets.
    pub hop_limit: u8,
    /// Active side, IB CM: for how long after the first REQ a REJ "invalid service ID"
    /// (nobody listens on the port yet) is answered by sending the REQ again, every 50 ms,
    /// instead of ending the attempt. Zero (the default) reports it at once, as a kernel
    /// does; a client racing a server that is about to listen again (perftest -R between
    /// its two connections) wants a second or so.
    pub unlisted_retry: Duration,
    /// IB CM, a QP the application moves itself (the CM has none): the ECE options the REQ
    /// offers or the REP accepts (`rdma_set_local_ece`). A QP the CM connects offers its
    /// own ([`crate::Qp::query_ece`]).
    pub ece: crate::Ece,
    /// IB CM, active side: the rdma_cm port space the REQ's service ID names
    /// (`srdma_wire::cm::port_space`: TCP, the default, as `RDMA_PS_TCP`; IB for
    /// `RDMA_PS_IB`). A listener of another port space does not see the REQ (a kernel
    /// answers it with REJ 8, invalid service ID). The TCP CM has no port spaces.
    pub port_space: u16,
}

impl Default for ConnectOptions {
    /// No private data, 5 s timeout, rping's retry counts (7, 7), the device MTU, 16 READs
    /// in flight each way, ibv_rc_pingpong's ACK timeout (14) and RNR timer (12).
    fn default() -> ConnectOptions {
        ConnectOptions {
            private_data: Vec::new(),
            timeout: Duration::from_secs(5),
            retry_cnt: 7,
            rnr_retry: 7,
            mtu: None,
            responder_resources: 16,
            initiator_depth: 16,
            ack_timeout: 14,
            min_rnr_timer: 12,
            hop_limit: 64,
            unlisted_retry: Duration::ZERO,
            ece: crate::Ece::default(),
            port_space: srdma_wire::cm::port_space::TCP,
        }
    }
}

impl ConnectOptions {
    pub(crate) fn check(&self) -> Result<(), CmError> {
        check_private_data(&self.private_data)?;
        let bad = |what: &str| Err(CmError::Verbs(Error::InvalidArgument(what.into())));
        if self.timeout.is_zero() {
            return bad("a zero connection timeout");
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return bad("retry_cnt and rnr_retry are 3-bit (0..=7)");
        }
        if self.ack_timeout > 31 || self.min_rnr_timer > 31 {
            return bad("ack_timeout and min_rnr_timer are 5-bit (0..=31)");
        }
        Ok(())
    }

    /// The MTU this side offers on `dev`.
    pub(crate) fn offered_mtu(&self, dev: &Device) -> Mtu {
        let port = dev.config().mtu;
        self.mtu.map_or(port, |m| m.min(port))
    }

    /// `responder_resources` and `initiator_depth` capped by the device limits.
    pub(crate) fn depths(&self, dev: &Device) -> (u8, u8) {
        let l = &dev.config().limits;
        let cap = |v: u8, max: u32| u32::from(v).min(max) as u8;
        (
            cap(self.responder_resources, l.max_qp_rd_atom),
            cap(self.initiator_depth, l.max_qp_init_rd_atom),
        )
    }

    pub(crate) fn params(
        &self,
        mtu: Mtu,
        sq_psn: Psn,
        rd_atomic: u8,
        dest_rd_atomic: u8,
    ) -> ConnectParams {
        ConnectParams {
            mtu,
            sq_psn,
            timeout: self.ack_timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: rd_atomic,
            max_dest_rd_atomic: dest_rd_atomic,
            hop_limit: self.hop_limit,
        }
    }
}

fn check_private_data(data: &[u8]) -> Result<(), CmError> {
    if data.len() > MAX_PRIVATE_DATA {
        Err(CmError::PrivateDataTooLong(data.len()))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Wire format.

/// The body of a REQ or REP.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hello {
    qpn: Qpn,
    psn: Psn,
    gid: Gid,
    port: u16,
    mtu: Mtu,
    qp_type: QpType,
    responder_resources: u8,
    initiator_depth: u8,
    private_data: Vec<u8>,
    /// ECE: what the REQ's QP offers, what the REP's QP agreed to (none: no trailer).
    ece: crate::Ece,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Msg {
    Req(Hello),
    Rep(Hello),
    Rej { reason: u16, private_data: Vec<u8> },
    Rtu,
    Dreq,
    Drep,
}

/// A malformed message: what is wrong, and the REJ reason to answer a bad REQ with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WireError {
    reason: u16,
    detail: String,
}

fn malformed(detail: impl Into<String>) -> WireError {
    WireError {
        reason: reason::UNSUPPORTED,
        detail: detail.into(),
    }
}

impl Hello {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend(self.qpn.value().to_be_bytes());
        out.extend(self.psn.value().to_be_bytes());
        out.extend(self.gid.0);
        out.extend(self.port.to_be_bytes());
        out.push(self.mtu.as_u32() as u8);
        out.push(match self.qp_type {
            QpType::Uc => 1,
            _ => 0,
        });
        out.push(self.responder_resources);
        out.push(self.initiator_depth);
        out.push(self.private_data.len() as u8);
        out.extend(&self.private_data);
        if self.ece.vendor_id != 0 {
            out.extend(self.ece.vendor_id.to_be_bytes());
            out.extend(self.ece.options.to_be_bytes());
        }
    }

    fn decode(b: &[u8], what: &str) -> Result<Hello, WireError> {
        if b.len() < HELLO_LEN {
            return Err(malformed(format!(
                "{what} body of {} bytes, shorter than {HELLO_LEN}",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let qpn = u32_at(0);
        if !(2..=0xFF_FFFF).contains(&qpn) {
            return Err(malformed(format!(
                "{what} QPN {qpn:#x} is not a 24-bit QPN ≥ 2"
            )));
        }
        let psn = u32_at(4);
        if psn > 0xFF_FFFF {
            return Err(malformed(format!(
                "{what} PSN {psn:#x} is wider than 24 bits"
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        let port = u16::from_be_bytes([b[24], b[25]]);
        if port == 0 {
            return Err(malformed(format!("{what} UDP port 0")));
        }
        let mtu = Mtu::from_u32(b[26].into()).ok_or_else(|| WireError {
            reason: reason::INVALID_MTU,
            detail: format!("{what} MTU code {} outside 1..=5", b[26]),
        })?;
        let qp_type = match b[27] {
            0 => QpType::Rc,
            1 => QpType::Uc,
            t => {
                return Err(WireError {
                    reason: reason::INVALID_TRANSPORT_TYPE,
                    detail: format!("{what} transport {t} is neither RC (0) nor UC (1)"),
                });
            }
        };
        let n = usize::from(b[30]);
        if n > MAX_PRIVATE_DATA {
            return Err(malformed(format!(
                "{what} announces {n} bytes of private data, at most {MAX_PRIVATE_DATA} fit"
            )));
        }
        let ece = match b.len() - HELLO_LEN {
            k if k == n => crate::Ece::default(),
            k if k == n + ECE_LEN => {
                let at = HELLO_LEN + n;
                let ece = crate::Ece {
                    vendor_id: u32_at(at),
                    options: u32_at(at + 4),
                };
                if ece.vendor_id == 0 || ece.vendor_id > 0xFF_FFFF {
                    return Err(malformed(format!(
                        "{what} ECE vendor ID {:#x} is not a 24-bit OUI",
                        ece.vendor_id
                    )));
                }
                ece
            }
            _ => {
                return Err(malformed(format!(
                    "{what} body of {} bytes for {n} bytes of private data (expected {}, or {} \
                     with ECE)",
                    b.len(),
                    HELLO_LEN + n,
                    HELLO_LEN + n + ECE_LEN
                )));
            }
        };
        Ok(Hello {
            qpn: Qpn::new(qpn),
            psn: Psn::new(psn),
            gid: Gid(gid),
            port,
            mtu,
            qp_type,
            responder_resources: b[28],
            initiator_depth: b[29],
            private_data: b[HELLO_LEN..HELLO_LEN + n].to_vec(),
            ece,
        })
    }

    fn remote(&self) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: self.psn,
            gid: self.gid,
            port: self.port,
        }
    }
}

impl Msg {
    fn kind(&self) -> u8 {
        match self {
            Msg::Req(_) => T_REQ,
            Msg::Rep(_) => T_REP,
            Msg::Rej { .. } => T_REJ,
            Msg::Rtu => T_RTU,
            Msg::Dreq => T_DREQ,
            Msg::Drep => T_DREP,
        }
    }

    fn name(&self) -> &'static str {
        type_name(self.kind()).unwrap_or("?")
    }

    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        match self {
            Msg::Req(h) | Msg::Rep(h) => h.encode(&mut body),
            Msg::Rej {
                reason,
                private_data,
            } => {
                body.extend(reason.to_be_bytes());
                body.push(private_data.len() as u8);
                body.extend(private_data);
            }
            Msg::Rtu | Msg::Dreq | Msg::Drep => {}
        }
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend(MAGIC);
        out.push(PROTOCOL_VERSION);
        out.push(self.kind());
        out.extend((body.len() as u16).to_be_bytes());
        out.extend(body);
        out
    }
}

fn type_name(t: u8) -> Option<&'static str> {
    Some(match t {
        T_REQ => "REQ",
        T_REP => "REP",
        T_REJ => "REJ",
        T_RTU => "RTU",
        T_DREQ => "DREQ",
        T_DREP => "DREP",
        _ => return None,
    })
}

/// The body lengths a message type allows.
fn body_range(t: u8) -> (usize, usize) {
    match t {
        T_REQ | T_REP => (HELLO_LEN, HELLO_LEN + MAX_PRIVATE_DATA + ECE_LEN),
        T_REJ => (3, 3 + MAX_PRIVATE_DATA),
        _ => (0, 0),
    }
}

/// Decodes the message at the front of `buf`: `Ok(None)` while it is incomplete, else the
/// message and its length. Bad bytes are reported as soon as they arrive, so garbage never
/// waits for a timeout.
fn decode(buf: &[u8]) -> Result<Option<(Msg, usize)>, WireError> {
    let have = buf.len().min(2);
    if buf[..have] != MAGIC[..have] {
        return Err(malformed(format!(
            "not an srdma CM peer: message starts {:02x?}, not \"CM\"",
            &buf[..have]
        )));
    }
    if let Some(&v) = buf.get(2) {
        if v != PROTOCOL_VERSION {
            return Err(WireError {
                reason: reason::INVALID_CLASS_VERSION,
                detail: format!("protocol version {v}, this side speaks {PROTOCOL_VERSION}"),
            });
        }
    }
    let Some(&t) = buf.get(3) else {
        return Ok(None);
    };
    let Some(name) = type_name(t) else {
        return Err(malformed(format!("unknown message type {t:#04x}")));
    };
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
    let (min, max) = body_range(t);
    if !(min..=max).contains(&len) {
        return Err(malformed(format!(
            "{name} body of {len} bytes, outside {min}..={max}"
        )));
    }
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
        return Ok(None);
    };
    let msg = match t {
        T_REQ => Msg::Req(Hello::decode(body, name)?),
        T_REP => Msg::Rep(Hello::decode(body, name)?),
        T_REJ => {
            let n = usize::from(body[2]);
            if body.len() != 3 + n {
                return Err(malformed(format!(
                    "REJ body of {len} bytes for {n} bytes of private data"
                )));
            }
            Msg::Rej {
                reason: u16::from_be_bytes([body[0], body[1]]),
                private_data: body[3..].to_vec(),
            }
        }
        T_RTU => Msg::Rtu,
        T_DREQ => Msg::Dreq,
        _ => Msg::Drep,
    };
    Ok(Some((msg, HEADER_LEN + len)))
}

/// Why a read failed.
#[derive(Debug)]
enum RecvError {
    Wire(WireError),
    Closed,
    Io(io::Error),
}

impl From<RecvError> for CmError {
    fn from(e: RecvError) -> CmError {
        match e {
            RecvError::Wire(w) => CmError::Protocol(w.detail),
            RecvError::Closed => CmError::Closed,
            RecvError::Io(e) => CmError::Io(e),
        }
    }
}

/// The receiving half of a CM TCP connection: bytes received but not yet decoded stay here
/// between calls.
#[derive(Debug)]
struct Reader {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Reader {
    /// The next message, or `Ok(None)` once `deadline` passes (`None`: wait forever).
    fn recv(&mut self, deadline: Option<Instant>) -> Result<Option<Msg>, RecvError> {
        loop {
            if !self.buf.is_empty() {
                if let Some((msg, used)) = decode(&self.buf).map_err(RecvError::Wire)? {
                    self.buf.drain(..used);
                    return Ok(Some(msg));
                }
            }
            let wait = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(w) if !w.is_zero() => Some(w),
                    _ => return Ok(None),
                },
            };
            self.stream.set_read_timeout(wait).map_err(RecvError::Io)?;
            let mut chunk = [0u8; 512];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(RecvError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::Interrupted => {}
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                        return Err(RecvError::Closed);
                    }
                    _ => return Err(RecvError::Io(e)),
                },
            }
        }
    }
}

fn send(stream: &TcpStream, msg: &Msg) -> Result<(), CmError> {
    let mut w = stream;
    w.write_all(&msg.encode()).map_err(|e| match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => CmError::Closed,
        _ => CmError::Io(e),
    })
}

/// Best-effort REJ on a connection we are about to drop. Never blocks.
fn send_rej_nowait(stream: &TcpStream, reason: u16, private_data: &[u8]) {
    let _ = stream.set_nonblocking(true);
    let _ = send(
        stream,
        &Msg::Rej {
            reason,
            private_data: private_data.to_vec(),
        },
    );
}

/// Splits a fresh TCP connection into a reader and a writer with the CM's socket options.
fn setup(stream: TcpStream) -> Result<(Reader, TcpStream), CmError> {
    stream.set_nonblocking(false).map_err(CmError::Io)?;
    // Handshake messages are small and latency-bound.
    stream.set_nodelay(true).map_err(CmError::Io)?;
    stream
        .set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(CmError::Io)?;
    let writer = stream.try_clone().map_err(CmError::Io)?;
    Ok((
        Reader {
            stream,
            buf: Vec::new(),
        },
        writer,
    ))
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Moves `qp` to ERR: outstanding work completes with `WR_FLUSH_ERR`.
pub(crate) fn to_error(qp: &Qp) -> Result<(), Error> {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp.modify(&attr, AttrMask::STATE)
}

fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    // A timeout too large to represent waits forever.
    timeout.and_then(|t| Instant::now().checked_add(t))
}

fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

fn same_family(a: Gid, b: Gid) -> bool {
    a.ip().is_ipv4() == b.ip().is_ipv4()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Passive side.

/// The passive side (`rdma_listen`): a TCP listener handing out [`ConnectRequest`]s for QPs on
/// one protection domain.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    pd: Pd,
    local: SocketAddr,
}

impl Listener {
    /// Listens on `addr` (port 0: any free port, see [`local_addr`](Listener::local_addr));
    /// accepted QPs are created on `pd`, which must belong to `device`.
    pub fn bind(device: &Device, pd: &Pd, addr: SocketAddr) -> Result<Listener, CmError> {
        if !pd.device().same(device) {
            return Err(Error::WrongDevice.into());
        }
        let tcp = TcpListener::bind(addr).map_err(CmError::Io)?;
        tcp.set_nonblocking(true).map_err(CmError::Io)?;
        let local = tcp.local_addr().map_err(CmError::Io)?;
        Ok(Listener {
            tcp,
            pd: pd.clone(),
            local,
        })
    }

    /// The bound TCP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits up to `timeout` (`None`: forever) for the next client and its REQ
    /// (`rdma_get_request`).
    ///
    /// [`CmError::Timeout`] when `timeout` passes first. A client that sends a malformed REQ
    /// (answered with a REJ), closes early, or sends nothing within [`REQUEST_TIMEOUT`] makes
    /// this call return [`CmError::Protocol`] or [`CmError::Closed`]; the listener is
    /// unaffected and the next call serves the next client.
    pub fn accept_request(&self, timeout: Option<Duration>) -> Result<ConnectRequest, CmError> {
        let deadline = deadline_after(timeout);
        let (stream, peer) = loop {
            match self.tcp.accept() {
                Ok(x) => break x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let wait = match deadline {
                        None => None,
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(w) if !w.is_zero() => Some(w),
                            _ => return Err(CmError::Timeout),
                        },
                    };
                    sys::poll_readable([self.tcp.as_raw_fd()], wait).map_err(CmError::Io)?;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(CmError::Io(e)),
            }
        };
        let (mut reader, writer) = setup(stream)?;
        let req_deadline = Instant::now() + REQUEST_TIMEOUT;
        let req_deadline = deadline.map_or(req_deadline, |d| d.min(req_deadline));
        let hello = match reader.recv(Some(req_deadline)) {
            Ok(Some(Msg::Req(h))) => h,
            Ok(Some(other)) => {
                send_rej_nowait(&writer, reason::UNSUPPORTED, &[]);
                return Err(CmError::Protocol(format!(
                    "{peer} sent a {} instead of a REQ",
                    other.name()
                )));
            }
            Ok(None) if passed(deadline) => return Err(CmError::Timeout),
            Ok(None) => {
                return Err(CmError::Protocol(format!(
                    "{peer} sent no REQ within {REQUEST_TIMEOUT:?}"
                )));
            }
            Err(RecvError::Wire(w)) => {
                send_rej_nowait(&writer, w.reason, &[]);
                return Err(CmError::Protocol(format!("from {peer}: {}", w.detail)));
            }
            Err(e) => return Err(e.into()),
        };
        Ok(ConnectRequest {
            hello,
            peer,
            pd: self.pd.clone(),
            link: Some((reader, writer)),
        })
    }

    /// [`accept_request`](Listener::accept_request) as an event: `ConnectRequest`, or
    /// `ConnectError` for a client that failed; `None` once `timeout` passes.
    pub fn poll_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        match self.accept_request(timeout) {
            Ok(req) => Some(CmEvent::ConnectRequest(req)),
            Err(CmError::Timeout) => None,
            Err(e) => Some(CmEvent::ConnectError(e)),
        }
    }
}

/// Which QP [`ConnectRequest::accept`] connects: an existing one in INIT (receives may
/// already be posted) or a new one created on the listener's protection domain.
#[derive(Debug, Clone)]
pub enum AcceptQp<'a> {
    /// A QP in INIT, of the request's transport, on the listener's device.
    Existing(Qp),
    /// Create the QP from these attributes.
    Create(&'a QpInit),
}

impl From<Qp> for AcceptQp<'_> {
    fn from(qp: Qp) -> Self {
        AcceptQp::Existing(qp)
    }
}

impl From<&Qp> for AcceptQp<'_> {
    fn from(qp: &Qp) -> Self {
        AcceptQp::Existing(qp.clone())
    }
}

impl<'a> From<&'a QpInit> for AcceptQp<'a> {
    fn from(init: &'a QpInit) -> Self {
        AcceptQp::Create(init)
    }
}

/// A peer's REQ, waiting for [`accept`](ConnectRequest::accept) or
/// [`reject`](ConnectRequest::reject) (`RDMA_CM_EVENT_CONNECT_REQUEST`). Dropping it rejects
/// with [`reason::CONSUMER_DEFINED`].
#[derive(Debug)]
pub struct ConnectRequest {
    hello: Hello,
    peer: SocketAddr,
    pd: Pd,
    link: Option<(Reader, TcpStream)>,
}

impl ConnectRequest {
    /// The peer's QP: number, first PSN, GID and RoCE UDP port.
    pub fn remote(&self) -> RemoteQp {
        self.hello.remote()
    }

    /// The largest path MTU the peer accepts.
    pub fn mtu(&self) -> Mtu {
        self.hello.mtu
    }

    /// The peer QP's transport (RC or UC); the accepting QP must match.
    pub fn qp_type(&self) -> QpType {
        self.hello.qp_type
    }

    /// READ/atomic requests the peer accepts in flight.
    pub fn responder_resources(&self) -> u8 {
        self.hello.responder_resources
    }

    /// READ/atomic requests the peer issues in flight.
    pub fn initiator_depth(&self) -> u8 {
        self.hello.initiator_depth
    }

    /// The REQ's private data (at most [`MAX_PRIVATE_DATA`] bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.hello.private_data
    }

    /// The peer's TCP address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Refuses the connection (`rdma_reject`): the peer's [`connect`] fails with
    /// [`CmError::Rejected`] carrying `reason` and `private_data`. With more than
    /// [`MAX_PRIVATE_DATA`] bytes this fails, and the peer gets a bare
    /// [`reason::CONSUMER_DEFINED`] REJ instead.
    pub fn reject(mut self, reason: u16, private_data: &[u8]) -> Result<(), CmError> {
        check_private_data(private_data)?;
        let (_, writer) = self.link.take().ok_or(CmError::Closed)?;
        send(
            &writer,
            &Msg::Rej {
                reason,
                private_data: private_data.to_vec(),
            },
        )
    }

    /// Accepts with default options and `private_data` in the REP (`rdma_accept`).
    pub fn accept<'a>(
        self,
        qp: impl Into<AcceptQp<'a>>,
        private_data: &[u8],
    ) -> Result<Connection, CmError> {
        let opts = ConnectOptions {
            private_data: private_data.to_vec(),
            ..ConnectOptions::default()
        };
        self.accept_with(qp, &opts)
    }

    /// Accepts: connects the QP (RTR, RTS) to the peer's, sends the REP and waits up to
    /// `opts.timeout` for the RTU. On a local failure the peer gets a REJ; if the RTU does not
    /// come, the QP is moved to ERR.
    pub fn accept_with<'a>(
        mut self,
        qp: impl Into<AcceptQp<'a>>,
        opts: &ConnectOptions,
    ) -> Result<Connection, CmError> {
        // Until the REP is sent, every early return drops `self`, which rejects.
        opts.check()?;
        let dev = self.pd.device().clone();
        let qp = match qp.into() {
            AcceptQp::Existing(qp) => {
                // The REP advertises this device's GID and port: the QP must live there.
                if !qp.device().same(&dev) {
                    return Err(Error::WrongDevice.into());
                }
                if qp.state() != QpState::Init {
                    return Err(Error::InvalidArgument(format!(
                        "accepting with QP {:?} in {}, not INIT",
                        qp.qpn(),
                        qp.state()
                    ))
                    .into());
                }
                qp
            }
            AcceptQp::Create(init) => match self.pd.create_qp(init) {
                Ok(qp) => qp,
                Err(e) => return Err(self.refuse(reason::NO_QP, e.into())),
            },
        };
        if qp.qp_type() != self.hello.qp_type {
            let e = Error::InvalidArgument(format!(
                "the peer asks for a {:?} connection, the QP is {:?}",
                self.hello.qp_type,
                qp.qp_type()
            ));
            return Err(self.refuse(reason::INVALID_TRANSPORT_TYPE, e.into()));
        }
        if !same_family(self.hello.gid, dev.local_gid()) {
            let e = CmError::Protocol(format!(
                "peer GID {} is not reachable from {}",
                self.hello.gid,
                dev.local_gid()
            ));
            return Err(self.refuse(reason::INVALID_GID, e));
        }
        let mtu = opts.offered_mtu(&dev).min(self.hello.mtu);
        let (responder, initiator) = opts.depths(&dev);
        let initiator = initiator.min(self.hello.responder_resources);
        let psn = crate::random_psn();
        let remote = self.hello.remote();
        // What both QPs do on loss: srdma's selective repeat when the REQ offered it (and
        // this QP does), else the IBTA's go-back-N.
        let ece = match qp.set_ece(self.hello.ece) {
            Ok(agreed) => agreed,
            Err(e) => return Err(self.refuse(reason::NO_RESOURCES, e.into())),
        };
        if let Err(e) = qp.connect(&remote, &opts.params(mtu, psn, initiator, responder)) {
            return Err(self.refuse(reason::NO_RESOURCES, e.into()));
        }
        let (mut reader, writer) = self.link.take().ok_or(CmError::Closed)?;
        let rep = Msg::Rep(Hello {
            qpn: qp.qpn(),
            psn,
            gid: dev.local_gid(),
            port: dev.local_addr().port(),
            mtu,
            qp_type: qp.qp_type(),
            responder_resources: responder,
            initiator_depth: initiator,
            private_data: opts.private_data.clone(),
            ece,
        });
        let fail = |e: CmError| {
            let _ = to_error(&qp);
            Err(e)
        };
        if let Err(e) = send(&writer, &rep) {
            return fail(e);
        }
        match reader.recv(deadline_after(Some(opts.timeout))) {
            Ok(Some(Msg::Rtu)) => {}
            Ok(Some(Msg::Rej {
                reason,
                private_data,
            })) => {
                return fail(CmError::Rejected {
                    reason,
                    private_data,
                });
            }
            Ok(Some(other)) => {
                return fail(CmError::Protocol(format!(
                    "{} sent a {} instead of an RTU",
                    self.peer,
                    other.name()
                )));
            }
            Ok(None) => {
                send_rej_nowait(&writer, reason::TIMEOUT, &[]);
                return fail(CmError::Timeout);
            }
            Err(e) => return fail(e.into()),
        }
        Ok(Connection::new(
            qp,
            remote,
            mtu,
            std::mem::take(&mut self.hello.private_data),
            self.peer,
            reader,
            writer,
        ))
    }

    /// Sends a REJ with `reason` (instead of the drop's CONSUMER_DEFINED) and returns `e`.
    fn refuse(&mut self, reason: u16, e: CmError) -> CmError {
        if let Some((_, writer)) = self.link.take() {
            send_rej_nowait(&writer, reason, &[]);
        }
        e
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if let Some((_, writer)) = self.link.take() {
            send_rej_nowait(&writer, reason::CONSUMER_DEFINED, &[]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Active side.

/// The active side (`rdma_connect`): creates a QP from `init` on `pd` (of `device`), sends the
/// REQ to the [`Listener`] at `server`, connects the QP to the REP's and answers with the RTU.
///
/// Fails with [`CmError::Unreachable`] if the TCP connection cannot be made,
/// [`CmError::Rejected`] on a REJ, [`CmError::Timeout`] if no answer comes within
/// `opts.timeout` (counted from the call), [`CmError::PrivateDataTooLong`] before sending
/// anything.
pub fn connect(
    device: &Device,
    pd: &Pd,
    server: SocketAddr,
    init: &QpInit,
    opts: &ConnectOptions,
) -> Result<Connection, CmError> {
    let start = Instant::now();
    opts.check()?;
    if !pd.device().same(device) {
        return Err(Error::WrongDevice.into());
    }
    if !matches!(init.qp_type, QpType::Rc | QpType::Uc) {
        return Err(Error::InvalidArgument(format!(
            "the CM connects RC and UC QPs, not {:?}",
            init.qp_type
        ))
        .into());
    }
    let qp = pd.create_qp(init)?;
    let deadline = start + opts.timeout;
    let left = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(CmError::Timeout)?;
    let stream = TcpStream::connect_timeout(&server, left).map_err(CmError::Unreachable)?;
    let (mut reader, writer) = setup(stream)?;
    let mtu = opts.offered_mtu(device);
    let (responder, initiator) = opts.depths(device);
    let psn = crate::random_psn();
    let req = Msg::Req(Hello {
        qpn: qp.qpn(),
        psn,
        gid: device.local_gid(),
        port: device.local_addr().port(),
        mtu,
        qp_type: init.qp_type,
        responder_resources: responder,
        initiator_depth: initiator,
        private_data: opts.private_data.clone(),
        ece: qp.query_ece(),
    });
    send(&writer, &req)?;
    let rep = match reader.recv(Some(deadline)) {
        Ok(Some(Msg::Rep(h))) => h,
        Ok(Some(Msg::Rej {
            reason,
            private_data,
        })) => {
            return Err(CmError::Rejected {
                reason,
                private_data,
            });
        }
        Ok(Some(other)) => {
            send_rej_nowait(&writer, reason::UNSUPPORTED, &[]);
            return Err(CmError::Protocol(format!(
                "{server} sent a {} instead of a REP",
                other.name()
            )));
        }
        Ok(None) => return Err(CmError::Timeout),
        Err(e) => return Err(e.into()),
    };
    let refuse = |reason: u16, e: CmError| {
        send_rej_nowait(&writer, reason, &[]);
        Err(e)
    };
    if rep.mtu > mtu {
        return refuse(
            reason::INVALID_MTU,
            CmError::Protocol(format!(
                "REP chose MTU {} above the {} offered",
                rep.mtu.bytes(),
                mtu.bytes()
            )),
        );
    }
    if rep.qp_type != init.qp_type {
        return refuse(
            reason::INVALID_TRANSPORT_TYPE,
            CmError::Protocol(format!(
                "REP for a {:?} QP, the REQ asked for {:?}",
                rep.qp_type, init.qp_type
            )),
        );
    }
    if !same_family(rep.gid, device.local_gid()) {
        return refuse(
            reason::INVALID_GID,
            CmError::Protocol(format!("REP GID {} is not reachable", rep.gid)),
        );
    }
    let remote = rep.remote();
    let initiator = initiator.min(rep.responder_resources);
    // The REP says what the passive side agreed to (nothing from a peer without ECE).
    if let Err(e) = qp.set_ece(rep.ece) {
        return refuse(reason::NO_RESOURCES, e.into());
    }
    if let Err(e) = qp.connect(&remote, &opts.params(rep.mtu, psn, initiator, responder)) {
        return refuse(reason::NO_RESOURCES, e.into());
    }
    if let Err(e) = send(&writer, &Msg::Rtu) {
        let _ = to_error(&qp);
        return Err(e);
    }
    Ok(Connection::new(
        qp,
        remote,
        rep.mtu,
        rep.private_data,
        server,
        reader,
        writer,
    ))
}

// ---------------------------------------------------------------------------------------------
// Established connections.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connected,
    /// We sent a DREQ at this instant and wait for the DREP.
    DisconnectSent(Instant),
    Disconnected,
}

#[derive(Debug)]
struct ConnState {
    phase: Phase,
    events: VecDeque<CmEvent>,
    writer: TcpStream,
}

/// An established connection: the QP in RTS and the CM link to the peer. `Send + Sync`;
/// dropping it disconnects (the QP moves to ERR and the peer sees
/// [`CmEvent::Disconnected`]).
#[derive(Debug)]
pub struct Connection {
    qp: Qp,
    remote: RemoteQp,
    mtu: Mtu,
    private_data: Vec<u8>,
    peer: SocketAddr,
    reader: Mutex<Reader>,
    state: Mutex<ConnState>,
}

impl Connection {
    fn new(
        qp: Qp,
        remote: RemoteQp,
        mtu: Mtu,
        private_data: Vec<u8>,
        peer: SocketAddr,
        reader: Reader,
        writer: TcpStream,
    ) -> Connection {
        Connection {
            qp,
            remote,
            mtu,
            private_data,
            peer,
            reader: Mutex::new(reader),
            state: Mutex::new(ConnState {
                phase: Phase::Connected,
                events: VecDeque::from([CmEvent::Established]),
                writer,
            }),
        }
    }

    /// The connected QP.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The private data of the peer's REQ (passive side) or REP (active side).
    pub fn remote_private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's QP.
    pub fn remote(&self) -> RemoteQp {
        self.remote
    }

    /// The path MTU both QPs use.
    pub fn mtu(&self) -> Mtu {
        self.mtu
    }

    /// The peer's TCP address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// `rdma_disconnect`: moves the QP to ERR (outstanding work completes with
    /// `WR_FLUSH_ERR`) and sends a DREQ; the peer sees [`CmEvent::Disconnected`], and so does
    /// this side once the DREP comes (or [`DREP_TIMEOUT`] passes) in
    /// [`poll_event`](Connection::poll_event). Does nothing if already disconnected.
    pub fn disconnect(&self) -> Result<(), CmError> {
        let mut st = lock(&self.state);
        if st.phase != Phase::Connected {
            return Ok(());
        }
        let r = to_error(&self.qp);
        match send(&st.writer, &Msg::Dreq) {
            Ok(()) => st.phase = Phase::DisconnectSent(Instant::now()),
            Err(_) => {
                // The peer is gone already.
                st.phase = Phase::Disconnected;
                st.events.push_back(CmEvent::Disconnected);
            }
        }
        r.map_err(CmError::from)
    }

    /// The next event (`rdma_get_cm_event`), waiting up to `timeout` (`None`: until one
    /// comes). The first is [`CmEvent::Established`]; then [`CmEvent::Disconnected`] when
    /// either side disconnects or the TCP link is lost, or [`CmEvent::ConnectError`] if the
    /// peer breaks the protocol (the QP is then in ERR too). Returns `None` on timeout, and
    /// at once after the last event.
    ///
    /// The peer's DREQ is answered here: poll (or drop the connection) to let a peer's
    /// disconnect complete promptly.
    pub fn poll_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = deadline_after(timeout);
        loop {
            let drep_deadline = {
                let mut st = lock(&self.state);
                if let Some(ev) = st.events.pop_front() {
                    return Some(ev);
                }
                match st.phase {
                    Phase::Disconnected => return None,
                    Phase::DisconnectSent(at) if at.elapsed() >= DREP_TIMEOUT => {
                        return Some(self.finish(&mut st, CmEvent::Disconnected));
                    }
                    Phase::DisconnectSent(at) => Some(at + DREP_TIMEOUT),
                    Phase::Connected => None,
                }
            };
            // Read in slices: notice a disconnect started by another thread, and let another
            // poller take its turn with the reader.
            let slice = Instant::now() + POLL_SLICE;
            let wait = [deadline, drep_deadline]
                .into_iter()
                .flatten()
                .fold(slice, Instant::min);
            let got = match self.reader.try_lock() {
                Ok(mut reader) => reader.recv(Some(wait)),
                Err(TryLockError::Poisoned(p)) => p.into_inner().recv(Some(wait)),
                Err(TryLockError::WouldBlock) => {
                    // Another thread is reading (it reports what arrives): check back
                    // shortly, so this caller's own timeout holds.
                    match wait.checked_duration_since(Instant::now()) {
                        Some(left) if !left.is_zero() => std::thread::sleep(left.min(BUSY_WAIT)),
                        _ if passed(deadline) => return lock(&self.state).events.pop_front(),
                        _ => {}
                    }
                    continue;
                }
            };
            let mut st = lock(&self.state);
            let ev = match got {
                Ok(None) if passed(deadline) => return st.events.pop_front(),
                Ok(None) => continue,
                Ok(Some(Msg::Dreq)) => {
                    let _ = send(&st.writer, &Msg::Drep);
                    CmEvent::Disconnected
                }
                Ok(Some(Msg::Drep)) if matches!(st.phase, Phase::DisconnectSent(_)) => {
                    CmEvent::Disconnected
                }
                Ok(Some(other)) => CmEvent::ConnectError(CmError::Protocol(format!(
                    "{} sent an unexpected {}",
                    self.peer,
                    other.name()
                ))),
                Err(RecvError::Closed) => CmEvent::Disconnected,
                Err(e) => CmEvent::ConnectError(e.into()),
            };
            if st.phase == Phase::Disconnected {
                // Another thread finished meanwhile (its event is queued).
                return st.events.pop_front();
            }
            return Some(self.finish(&mut st, ev));
        }
    }

    /// Ends the connection: QP to ERR, no more events after `ev`.
    fn finish(&self, st: &mut ConnState, ev: CmEvent) -> CmEvent {
        let _ = to_error(&self.qp);
        st.phase = Phase::Disconnected;
        ev
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if st.phase == Phase::Connected {
            let _ = to_error(&self.qp);
            let _ = st.writer.set_nonblocking(true);
            let _ = send(&st.writer, &Msg::Dreq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(n: usize) -> Hello {
        Hello {
            qpn: Qpn::new(0x12_3456),
            psn: Psn::new(0xAB_CDEF),
            gid: Gid::from_ip("127.0.0.9".parse().unwrap()),
            port: 4791,
            mtu: Mtu::Mtu2048,
            qp_type: QpType::Uc,
            responder_resources: 3,
            initiator_depth: 4,
            private_data: (0..n).map(|i| i as u8).collect(),
            ece: crate::Ece::default(),
        }
    }

    fn all() -> Vec<Msg> {
        vec![
            Msg::Req(hello(0)),
            Msg::Req(hello(MAX_PRIVATE_DATA)),
            Msg::Req(Hello {
                ece: crate::Ece::srdma(),
                ..hello(MAX_PRIVATE_DATA)
            }),
            Msg::Rep(Hello {
                ece: crate::Ece::srdma(),
                ..hello(3)
            }),
            Msg::Rep(hello(17)),
            Msg::Rej {
                reason: 28,
                private_data: vec![9; MAX_PRIVATE_DATA],
            },
            Msg::Rej {
                reason: 0xFFFF,
                private_data: vec![],
            },
            Msg::Rtu,
            Msg::Dreq,
            Msg::Drep,
        ]
    }

    #[test]
    fn every_message_round_trips_and_every_prefix_waits() {
        for m in all() {
            let b = m.encode();
            assert_eq!(decode(&b), Ok(Some((m.clone(), b.len()))), "{m:?}");
            for cut in 0..b.len() {
                assert_eq!(decode(&b[..cut]), Ok(None), "{m:?} cut at {cut}");
            }
            // Trailing bytes belong to the next message.
            let mut two = b.clone();
            two.extend(Msg::Rtu.encode());
            assert_eq!(decode(&two), Ok(Some((m.clone(), b.len()))));
        }
    }

    #[test]
    fn header_layout_is_as_documented() {
        assert_eq!(Msg::Dreq.encode(), [b'C', b'M', 1, 0x15, 0, 0]);
        let b = Msg::Req(hello(2)).encode();
        assert_eq!(&b[..6], &[b'C', b'M', 1, 0x10, 0, 33]);
        assert_eq!(&b[6..10], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&b[10..14], &[0, 0xAB, 0xCD, 0xEF]);
        assert_eq!(&b[14..30], &Gid::from_ip("127.0.0.9".parse().unwrap()).0);
        assert_eq!(&b[30..], &[0x12, 0xB7, 4, 1, 3, 4, 2, 0, 1]);
    }

    #[test]
    fn bad_input_is_reported_as_soon_as_it_arrives() {
        let bad: &[(&[u8], u16)] = &[
            (b"G", reason::UNSUPPORTED),
            (b"CX", reason::UNSUPPORTED),
            (b"CM\x02", reason::INVALID_CLASS_VERSION),
            (b"CM\x01\x11", reason::UNSUPPORTED),
            (b"CM\x01\x14\x00\x01", reason::UNSUPPORTED), // RTU with a body
            (b"CM\x01\x10\x00\x1e", reason::UNSUPPORTED), // REQ shorter than 31
            (b"CM\x01\x10\x00\xec", reason::UNSUPPORTED), // REQ longer than 235
            (b"CM\x01\x12\xff\xff", reason::UNSUPPORTED),
        ];
        for (b, r) in bad {
            let e = decode(b).unwrap_err();
            assert_eq!(e.reason, *r, "{b:?}: {}", e.detail);
        }
    }

    #[test]
    fn the_ece_trailer_is_read_and_checked() {
        let with = Msg::Req(Hello {
            ece: crate::Ece::srdma(),
            ..hello(4)
        })
        .encode();
        let plain = Msg::Req(hello(4)).encode();
        assert_eq!(
            with.len(),
            plain.len() + ECE_LEN,
            "ECE rides after the private data"
        );
        assert_eq!(
            &with[HEADER_LEN + HELLO_LEN + 4..],
            &[0, 2, 0x53, 0x52, 0, 0, 0, 1]
        );
        // A body whose length fits neither form, and a trailer naming no vendor.
        let mut odd = with.clone();
        odd.truncate(with.len() - 3);
        odd[5] -= 3;
        assert!(decode(&odd).is_err());
        let mut none = with.clone();
        none[HEADER_LEN + HELLO_LEN + 4..HEADER_LEN + HELLO_LEN + 8].fill(0);
        assert!(decode(&none).is_err());
        let mut wide = with;
        wide[HEADER_LEN + HELLO_LEN + 4] = 1;
        assert!(decode(&wide).is_err(), "vendor above 24 bits");
    }

    #[test]
    fn bad_fields_are_refused() {
        let req = Msg::Req(hello(4)).encode();
        let with = |i: usize, v: u8| {
            let mut b = req.clone();
            b[HEADER_LEN + i] = v;
            decode(&b)
        };
        assert!(with(0, 1).is_err(), "QPN above 24 bits");
        assert!(with(4, 1).is_err(), "PSN above 24 bits");
        assert_eq!(with(26, 0).unwrap_err().reason, reason::INVALID_MTU);
        assert_eq!(with(26, 6).unwrap_err().reason, reason::INVALID_MTU);
        assert_eq!(
            with(27, 3).unwrap_err().reason,
            reason::INVALID_TRANSPORT_TYPE
        );
        assert!(with(30, 5).is_err(), "private data length beyond the body");
        assert!(
            with(30, 3).is_err(),
            "private data length short of the body"
        );
        let mut zero_qpn = req.clone();
        zero_qpn[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&[0, 0, 0, 1]);
        assert!(decode(&zero_qpn).is_err(), "QP1 is not connectable");
        let mut port0 = req.clone();
        port0[HEADER_LEN + 24..HEADER_LEN + 26].copy_from_slice(&[0, 0]);
        assert!(decode(&port0).is_err(), "UDP port 0");
        // A 227-byte body announcing 197 bytes of private data.
        let mut long = Msg::Req(hello(MAX_PRIVATE_DATA)).encode();
        long[HEADER_LEN + 30] = 197;
        assert!(decode(&long).unwrap_err().detail.contains("197"));
    }

    #[test]
    fn random_psns_differ() {
        let a: Vec<u32> = (0..8).map(|_| crate::random_psn().value()).collect();
        assert!(a.iter().any(|&p| p != a[0]), "{a:x?}");
    }
}
