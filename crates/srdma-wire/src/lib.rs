//! RoCEv2 on the wire, byte for byte: the InfiniBand transport headers (BTH, RETH, AETH,
//! AtomicETH, AtomicAckETH, ImmDt, IETH, DETH, FETH) that RoCEv2 carries in UDP to port 4791,
//! the opcode table of RC, UC and UD, 24-bit PSN/QPN arithmetic, the invariant CRC over the
//! masked IP/UDP/BTH pseudo header, the UDP source-port convention, and pcap read/write.
//!
//! Everything is checked against packets captured from Linux SoftRoCE (rxe), so what rxe and
//! RoCE NICs emit parses here and what srdma emits is what they accept.
//!
//! The style is smoltcp's: each header has a zero-copy view `Header<T: AsRef<[u8]>>` whose
//! `new_checked` validates the length once (after which no accessor panics) and a `Repr` with
//! `parse`/`emit`. No input makes a parser panic.
//!
//! ```
//! use srdma_wire::{Encap, IpRepr, Opcode, PacketRepr, Psn, Qpn, BthRepr};
//!
//! let bth = BthRepr {
//!     opcode: Opcode::RcSendOnly, solicited: false, mig_req: false, pad_cnt: 0, pkey: 0xffff,
//!     fecn: false, becn: false, dest_qpn: Qpn::new(0x11), ack_req: true, psn: Psn::new(0x100),
//! };
//! let repr = PacketRepr::new(bth, b"hello rdma!!");
//! let encap = Encap {
//!     ip: IpRepr::between("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()).unwrap(),
//!     src_port: srdma_wire::sport::udp_sport(0, 0x11, 0x11),
//!     dst_port: srdma_wire::ROCEV2_PORT,
//! };
//! let mut buf = [0u8; 64];
//! let n = repr.emit_with_icrc(&mut buf, &encap).unwrap();
//! let parsed = PacketRepr::parse_bytes(&buf[..n]).unwrap();
//! assert_eq!(parsed, repr);
//! srdma_wire::icrc::verify(&encap, &buf[..n]).unwrap();
//! ```
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod field;
mod view;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod deth;
pub mod error;
pub mod frame;
pub mod icrc;
pub mod imm;
pub mod ip;
pub mod opcode;
pub mod packet;
pub mod pcap;
mod pretty;
pub mod reth;
pub mod sack;
pub mod seq;
pub mod sport;

pub use aeth::{Aeth, AethRepr, NakCode, Syndrome};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{BTH_LEN, Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use error::{Error, Result};
pub use imm::{Ieth, ImmDt};
pub use ip::{Encap, IpRepr, Ipv4Repr, Ipv6Repr, ROCEV2_PORT};
pub use opcode::{Headers, Kind, Opcode, PayloadRule, Position, Transport};
pub use packet::{MAX_HEADER_LEN, Packet, PacketRepr};
pub use pretty::Verbose;
pub use reth::{Feth, FethRepr, Reth, RethRepr};
pub use sack::{Sack, SackRepr};
pub use seq::{Psn, Qpn};
