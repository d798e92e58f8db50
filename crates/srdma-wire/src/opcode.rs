//! The RoCEv2 opcode table: for each BTH opcode, the extension headers it carries, its place
//! in a message (FIRST / MIDDLE / LAST / ONLY) and its payload rule.
//!
//! Values from IBTA vol. 1 §9.2 as listed in Linux `include/rdma/ib_pack.h`; header sets
//! as in rxe's `rxe_opcode.c`. RD opcodes are not supported (rxe has no RD QPs).

use core::fmt;

/// The transport service of an opcode: its top three bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
    /// Congestion notification packet (RoCEv2 DCQCN).
    Cnp,
    /// Extended reliable connected (IBTA XRC annex): RC with an XRCETH naming the target SRQ.
    Xrc,
}

impl Transport {
    /// Short name: "RC", "UC", "UD", "CNP".
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
        }
    }
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message: payload exactly one PMTU.
    First,
    /// Middle packet: payload exactly one PMTU.
    Middle,
    /// Last packet: payload 1..=PMTU.
    Last,
    /// The whole message in one packet: payload 0..=PMTU.
    Only,
}

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// SEND (with or without immediate or invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACKNOWLEDGE: ACK or NAK.
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// FLUSH (IBTA 1.5).
    Flush,
    /// ATOMIC WRITE (IBTA 1.5): an 8-byte write performed atomically.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
    /// srdma's selective acknowledgement (`SRDMA_SACK`, between srdma peers that agreed to
    /// selective repeat).
    Sack,
}

/// A set of extension headers, in wire order after the BTH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Headers(u16);

impl Headers {
    /// Datagram ETH (UD): Q_Key, source QP.
    pub const DETH: Headers = Headers(1 << 0);
    /// Flush ETH.
    pub const FETH: Headers = Headers(1 << 1);
    /// RDMA ETH: virtual address, R_Key, DMA length.
    pub const RETH: Headers = Headers(1 << 2);
    /// Atomic ETH: address, R_Key, swap/add and compare data.
    pub const ATOMIC_ETH: Headers = Headers(1 << 3);
    /// Immediate data.
    pub const IMM_DT: Headers = Headers(1 << 4);
    /// Invalidate ETH: the R_Key to invalidate.
    pub const IETH: Headers = Headers(1 << 5);
    /// ACK ETH: syndrome and MSN.
    pub const AETH: Headers = Headers(1 << 6);
    /// Atomic ACK ETH: the original remote data.
    pub const ATOMIC_ACK_ETH: Headers = Headers(1 << 7);
    /// The 16 reserved bytes that follow the BTH of a CNP.
    pub const CNP_RESERVED: Headers = Headers(1 << 8);
    /// XRC ETH: the XRC SRQ a request is for (first after the BTH).
    pub const XRCETH: Headers = Headers(1 << 9);
    /// srdma's SACK ETH: the PSN ranges a responder holds beyond the expected one.
    pub const SACK_ETH: Headers = Headers(1 << 10);
    /// No extension header.
    pub const NONE: Headers = Headers(0);

    /// Each header with its size and name, in the order they appear on the wire.
    pub const ORDER: [(Headers, usize, &'static str); 11] = [
        (Headers::XRCETH, 4, "XRCETH"),
        (Headers::DETH, 8, "DETH"),
        (Headers::FETH, 4, "FETH"),
        (Headers::RETH, 16, "RETH"),
        (Headers::ATOMIC_ETH, 28, "AtomicETH"),
        (Headers::IMM_DT, 4, "ImmDt"),
        (Headers::IETH, 4, "IETH"),
        (Headers::AETH, 4, "AETH"),
        (Headers::ATOMIC_ACK_ETH, 8, "AtomicAckETH"),
        (Headers::CNP_RESERVED, 16, "CNP reserved"),
        (Headers::SACK_ETH, 32, "SackETH"),
    ];

    /// True when every header of `other` is in `self`.
    #[inline]
    pub const fn contains(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of two sets.
    #[inline]
    #[must_use]
    pub const fn with(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }

    /// Total length in bytes of the headers in the set.
    pub const fn len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if self.contains(Self::ORDER[i].0) {
                n += Self::ORDER[i].1;
            }
            i += 1;
        }
        n
    }

    /// True when the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `header` after the end of the BTH, if it is in the set.
    pub const fn offset_of(self, header: Headers) -> Option<usize> {
        if !self.contains(header) || header.0.count_ones() != 1 {
            return None;
        }
        let mut n = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0.0 == header.0 {
                return Some(n);
            }
            if self.contains(Self::ORDER[i].0) {
                n += Self::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        f.write_str("[")?;
        for (h, _, name) in Headers::ORDER {
            if self.contains(h) {
                if !first {
                    f.write_str(", ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str("]")
    }
}

const H: Headers = Headers::NONE;
const RETH: Headers = Headers::RETH;
const IMM: Headers = Headers::IMM_DT;
const AETH: Headers = Headers::AETH;
const X: Headers = Headers::XRCETH;

macro_rules! opcodes {
    ($( $variant:ident = $value:literal, $name:literal, $kind:ident, $pos:expr, $hdrs:expr; )*) => {
        /// A BTH opcode known to srdma: every RC, UC and UD opcode and the CNP.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $( #[doc = $name] $variant = $value, )*
        }

        impl Opcode {
            /// Every opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$variant,)*];

            /// The opcode with wire value `v`, or `None` if `v` is not one srdma knows.
            #[inline]
            pub const fn from_u8(v: u8) -> Option<Opcode> {
                // A table lookup: this runs for every packet received.
                const TABLE: [Option<Opcode>; 256] = {
                    let mut t = [None; 256];
                    $( t[$value] = Some(Opcode::$variant); )*
                    t
                };
                TABLE[v as usize]
            }

            /// The name rxe and the IBTA use, e.g. `RC_RDMA_WRITE_FIRST`.
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$variant => $name, )* }
            }

            /// What the opcode does.
            #[inline]
            pub const fn kind(self) -> Kind {
                match self { $( Opcode::$variant => Kind::$kind, )* }
            }

            /// Where a packet with this opcode sits in its message (`None` for CNP).
            #[inline]
            pub const fn position(self) -> Option<Position> {
                match self { $( Opcode::$variant => $pos, )* }
            }

            /// The extension headers that follow the BTH.
            #[inline]
            pub const fn headers(self) -> Headers {
                match self { $( Opcode::$variant => $hdrs, )* }
            }

            /// Length of BTH plus extension headers (a constant per opcode).
            #[inline]
            pub const fn header_len(self) -> usize {
                match self { $( Opcode::$variant => const { crate::bth::BTH_LEN + $hdrs.len() }, )* }
            }
        }
    };
}

use Position::{First, Last, Middle, Only};

opcodes! {
    RcSendFirst = 0x00, "RC_SEND_FIRST", Send, Some(First), H;
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE", Send, Some(Middle), H;
    RcSendLast = 0x02, "RC_SEND_LAST", Send, Some(Last), H;
    RcSendLastWithImmediate = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Send, Some(Last), IMM;
    RcSendOnly = 0x04, "RC_SEND_ONLY", Send, Some(Only), H;
    RcSendOnlyWithImmediate = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Send, Some(Only), IMM;
    RcRdmaWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST", Write, Some(First), RETH;
    RcRdmaWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE", Write, Some(Middle), H;
    RcRdmaWriteLast = 0x08, "RC_RDMA_WRITE_LAST", Write, Some(Last), H;
    RcRdmaWriteLastWithImmediate = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, Some(Last), IMM;
    RcRdmaWriteOnly = 0x0A, "RC_RDMA_WRITE_ONLY", Write, Some(Only), RETH;
    RcRdmaWriteOnlyWithImmediate = 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, Some(Only), RETH.with(IMM);
    RcRdmaReadRequest = 0x0C, "RC_RDMA_READ_REQUEST", ReadRequest, Some(Only), RETH;
    RcRdmaReadResponseFirst = 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", ReadResponse, Some(First), AETH;
    RcRdmaReadResponseMiddle = 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", ReadResponse, Some(Middle), H;
    RcRdmaReadResponseLast = 0x0F, "RC_RDMA_READ_RESPONSE_LAST", ReadResponse, Some(Last), AETH;
    RcRdmaReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", ReadResponse, Some(Only), AETH;
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE", Acknowledge, Some(Only), AETH;
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE", AtomicAcknowledge, Some(Only), AETH.with(Headers::ATOMIC_ACK_ETH);
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP", CompareSwap, Some(Only), Headers::ATOMIC_ETH;
    RcFetchAdd = 0x14, "RC_FETCH_ADD", FetchAdd, Some(Only), Headers::ATOMIC_ETH;
    RcSendLastWithInvalidate = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", Send, Some(Last), Headers::IETH;
    RcSendOnlyWithInvalidate = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Send, Some(Only), Headers::IETH;
    RcFlush = 0x1C, "RC_FLUSH", Flush, Some(Only), Headers::FETH.with(RETH);
    RcAtomicWrite = 0x1D, "RC_ATOMIC_WRITE", AtomicWrite, Some(Only), RETH;
    UcSendFirst = 0x20, "UC_SEND_FIRST", Send, Some(First), H;
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE", Send, Some(Middle), H;
    UcSendLast = 0x22, "UC_SEND_LAST", Send, Some(Last), H;
    UcSendLastWithImmediate = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Send, Some(Last), IMM;
    UcSendOnly = 0x24, "UC_SEND_ONLY", Send, Some(Only), H;
    UcSendOnlyWithImmediate = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Send, Some(Only), IMM;
    UcRdmaWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST", Write, Some(First), RETH;
    UcRdmaWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE", Write, Some(Middle), H;
    UcRdmaWriteLast = 0x28, "UC_RDMA_WRITE_LAST", Write, Some(Last), H;
    UcRdmaWriteLastWithImmediate = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, Some(Last), IMM;
    UcRdmaWriteOnly = 0x2A, "UC_RDMA_WRITE_ONLY", Write, Some(Only), RETH;
    UcRdmaWriteOnlyWithImmediate = 0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, Some(Only), RETH.with(IMM);
    UdSendOnly = 0x64, "UD_SEND_ONLY", Send, Some(Only), Headers::DETH;
    UdSendOnlyWithImmediate = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Send, Some(Only), Headers::DETH.with(IMM);
    Cnp = 0x81, "CNP", Cnp, None, Headers::CNP_RESERVED;
    XrcSendFirst = 0xA0, "XRC_SEND_FIRST", Send, Some(First), X;
    XrcSendMiddle = 0xA1, "XRC_SEND_MIDDLE", Send, Some(Middle), X;
    XrcSendLast = 0xA2, "XRC_SEND_LAST", Send, Some(Last), X;
    XrcSendLastWithImmediate = 0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", Send, Some(Last), X.with(IMM);
    XrcSendOnly = 0xA4, "XRC_SEND_ONLY", Send, Some(Only), X;
    XrcSendOnlyWithImmediate = 0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", Send, Some(Only), X.with(IMM);
    XrcRdmaWriteFirst = 0xA6, "XRC_RDMA_WRITE_FIRST", Write, Some(First), X.with(RETH);
    XrcRdmaWriteMiddle = 0xA7, "XRC_RDMA_WRITE_MIDDLE", Write, Some(Middle), X;
    XrcRdmaWriteLast = 0xA8, "XRC_RDMA_WRITE_LAST", Write, Some(Last), X;
    XrcRdmaWriteLastWithImmediate = 0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Write, Some(Last), X.with(IMM);
    XrcRdmaWriteOnly = 0xAA, "XRC_RDMA_WRITE_ONLY", Write, Some(Only), X.with(RETH);
    XrcRdmaWriteOnlyWithImmediate = 0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write, Some(Only), X.with(RETH).with(IMM);
    XrcRdmaReadRequest = 0xAC, "XRC_RDMA_READ_REQUEST", ReadRequest, Some(Only), X.with(RETH);
    XrcRdmaReadResponseFirst = 0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", ReadResponse, Some(First), AETH;
    XrcRdmaReadResponseMiddle = 0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", ReadResponse, Some(Middle), H;
    XrcRdmaReadResponseLast = 0xAF, "XRC_RDMA_READ_RESPONSE_LAST", ReadResponse, Some(Last), AETH;
    XrcRdmaReadResponseOnly = 0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", ReadResponse, Some(Only), AETH;
    XrcAcknowledge = 0xB1, "XRC_ACKNOWLEDGE", Acknowledge, Some(Only), AETH;
    XrcAtomicAcknowledge = 0xB2, "XRC_ATOMIC_ACKNOWLEDGE", AtomicAcknowledge, Some(Only), AETH.with(Headers::ATOMIC_ACK_ETH);
    XrcCompareSwap = 0xB3, "XRC_COMPARE_SWAP", CompareSwap, Some(Only), X.with(Headers::ATOMIC_ETH);
    XrcFetchAdd = 0xB4, "XRC_FETCH_ADD", FetchAdd, Some(Only), X.with(Headers::ATOMIC_ETH);
    XrcSendLastWithInvalidate = 0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", Send, Some(Last), X.with(Headers::IETH);
    XrcSendOnlyWithInvalidate = 0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", Send, Some(Only), X.with(Headers::IETH);
    SrdmaSack = 0xE0, "SRDMA_SACK", Sack, Some(Only), Headers::SACK_ETH;
}

/// How much payload a packet of an opcode may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadRule {
    /// No payload at all (ACKs, READ requests, atomics, FLUSH, CNP).
    None,
    /// Exactly one path MTU (FIRST and MIDDLE packets).
    FullMtu,
    /// 1..=PMTU bytes (LAST packets).
    Last,
    /// 0..=PMTU bytes (ONLY packets).
    UpToMtu,
    /// Exactly 8 bytes (ATOMIC WRITE).
    Exactly8,
}

impl Opcode {
    /// The wire value.
    #[inline]
    pub const fn value(self) -> u8 {
        self as u8
    }

    /// The transport service (top three bits).
    #[inline]
    pub const fn transport(self) -> Transport {
        match self.value() >> 5 {
            // srdma's own RC acknowledgement, in the manufacturer-specific range.
            _ if self.value() == Opcode::SrdmaSack as u8 => Transport::Rc,
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            5 => Transport::Xrc,
            _ => Transport::Cnp,
        }
    }

    /// The payload rule of the opcode.
    #[inline]
    pub const fn payload_rule(self) -> PayloadRule {
        match self.kind() {
            Kind::Send | Kind::Write | Kind::ReadResponse => match self.position() {
                Some(First) | Some(Middle) => PayloadRule::FullMtu,
                Some(Last) => PayloadRule::Last,
                _ => PayloadRule::UpToMtu,
            },
            Kind::AtomicWrite => PayloadRule::Exactly8,
            _ => PayloadRule::None,
        }
    }

    /// True for packets a requester sends (the responder processes them).
    #[inline]
    pub const fn is_request(self) -> bool {
        !matches!(
            self.kind(),
            Kind::ReadResponse
                | Kind::Acknowledge
                | Kind::AtomicAcknowledge
                | Kind::Cnp
                | Kind::Sack
        )
    }

    /// True for packets a responder sends (the completer processes them).
    #[inline]
    pub const fn is_response(self) -> bool {
        matches!(
            self.kind(),
            Kind::ReadResponse | Kind::Acknowledge | Kind::AtomicAcknowledge | Kind::Sack
        )
    }

    /// First or only packet of a message (rxe `RXE_START_MASK`).
    #[inline]
    pub const fn is_start(self) -> bool {
        matches!(self.position(), Some(First) | Some(Only))
    }

    /// Last or only packet of a message (rxe `RXE_END_MASK`).
    #[inline]
    pub const fn is_end(self) -> bool {
        matches!(self.position(), Some(Last) | Some(Only))
    }

    /// Carries immediate data.
    #[inline]
    pub const fn has_immediate(self) -> bool {
        self.headers().contains(Headers::IMM_DT)
    }

    /// The same operation on the other connected reliable service: an RC opcode's XRC
    /// twin and back (XRC opcodes are RC's plus 0xA0, ib_pack.h); `None` for the others.
    #[inline]
    pub const fn rc_xrc_twin(self) -> Option<Opcode> {
        match self.transport() {
            Transport::Rc => Opcode::from_u8(self.value() + 0xA0),
            Transport::Xrc => Opcode::from_u8(self.value() - 0xA0),
            _ => None,
        }
    }

    /// Carries an IETH (SEND with invalidate).
    #[inline]
    pub const fn has_invalidate(self) -> bool {
        self.headers().contains(Headers::IETH)
    }

    /// Consumes a receive WQE (rxe `RXE_RWR_MASK`): SEND first/only, and RDMA WRITE with
    /// immediate on its last/only packet. Without a posted WQE the responder answers RNR NAK.
    #[inline]
    pub const fn consumes_recv_wqe(self) -> bool {
        match self.kind() {
            Kind::Send => self.is_start(),
            Kind::Write => self.has_immediate(),
            _ => false,
        }
    }

    /// Generates a receive completion (rxe `RXE_COMP_MASK`): SEND last/only and RDMA WRITE
    /// with immediate last/only.
    #[inline]
    pub const fn completes_recv(self) -> bool {
        match self.kind() {
            Kind::Send => self.is_end(),
            Kind::Write => self.has_immediate(),
            _ => false,
        }
    }

    /// Checks a payload length against this opcode's rule for path MTU `pmtu` bytes.
    ///
    /// This is the responder's length check (`rxe_resp_check_length`), not a parse error:
    /// on RC a violation is answered with NAK invalid request.
    #[inline]
    pub fn check_payload_len(self, len: usize, pmtu: usize) -> crate::Result<()> {
        let reason = match self.payload_rule() {
            PayloadRule::None if len != 0 => "opcode carries no payload",
            PayloadRule::FullMtu if len != pmtu => "FIRST/MIDDLE payload must equal the PMTU",
            PayloadRule::Last if len == 0 || len > pmtu => "LAST payload must be 1..=PMTU",
            PayloadRule::UpToMtu if len > pmtu => "ONLY payload exceeds the PMTU",
            PayloadRule::Exactly8 if len != 8 => "ATOMIC WRITE payload must be 8 bytes",
            _ => return Ok(()),
        };
        Err(crate::Error::LengthMismatch {
            opcode: self,
            len,
            reason,
        })
    }

    /// The opcode for `kind` at `position` on `transport`, with or without immediate data.
    ///
    /// This is the segmentation table of the kinds that span packets — SEND, RDMA WRITE and
    /// READ responses (rxe `next_opcode_rc/uc`): for example `(Rc, Write, Last, true)` gives
    /// `RC_RDMA_WRITE_LAST_WITH_IMMEDIATE`. Returns `None` for combinations that do not exist
    /// (a UC READ response, a UD FIRST packet, ...) and for the single-packet kinds.
    pub fn for_message(
        transport: Transport,
        kind: Kind,
        position: Position,
        imm: bool,
    ) -> Option<Opcode> {
        // Computed, not searched: the requester asks for every packet it sends.
        let op = match (kind, position, imm) {
            (Kind::Send, Position::First, false) => 0x00,
            (Kind::Send, Position::Middle, false) => 0x01,
            (Kind::Send, Position::Last, false) => 0x02,
            (Kind::Send, Position::Last, true) => 0x03,
            (Kind::Send, Position::Only, false) => 0x04,
            (Kind::Send, Position::Only, true) => 0x05,
            (Kind::Write, Position::First, false) => 0x06,
            (Kind::Write, Position::Middle, false) => 0x07,
            (Kind::Write, Position::Last, false) => 0x08,
            (Kind::Write, Position::Last, true) => 0x09,
            (Kind::Write, Position::Only, false) => 0x0A,
            (Kind::Write, Position::Only, true) => 0x0B,
            (Kind::ReadResponse, Position::First, false) => 0x0D,
            (Kind::ReadResponse, Position::Middle, false) => 0x0E,
            (Kind::ReadResponse, Position::Last, false) => 0x0F,
            (Kind::ReadResponse, Position::Only, false) => 0x10,
            _ => return None,
        };
        let base = match transport {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
            Transport::Xrc => 0xA0,
            Transport::Cnp => return None,
        };
        // The table decides what exists (UD has only SEND ONLY, UC no READ responses).
        Opcode::from_u8(base + op).filter(|o| o.transport() == transport && o.kind() == kind)
    }
}

impl Opcode {
    /// The opcode of packet `position` of a SEND with invalidate on `transport`: the IETH
    /// rides on the last packet (`RC_SEND_LAST_WITH_INVALIDATE` 0x16,
    /// `RC_SEND_ONLY_WITH_INVALIDATE` 0x17), FIRST and MIDDLE packets are plain SEND ones
    /// (IBA 9.4.1.1, rxe `next_opcode_rc`). `None` off RC: UC and UD have no such opcode.
    pub fn for_send_with_invalidate(transport: Transport, position: Position) -> Option<Opcode> {
        if transport != Transport::Rc {
            return None;
        }
        Some(match position {
            Position::First => Opcode::RcSendFirst,
            Position::Middle => Opcode::RcSendMiddle,
            Position::Last => Opcode::RcSendLastWithInvalidate,
            Position::Only => Opcode::RcSendOnlyWithInvalidate,
        })
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<u8> for Opcode {
    type Error = crate::Error;

    fn try_from(v: u8) -> crate::Result<Opcode> {
        Opcode::from_u8(v).ok_or(crate::Error::UnknownOpcode(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_rxe() {
        // Header lengths (BTH + ETHs) from roce-reference.md §1.5 / rxe_opcode.c.
        let cases = [
            (Opcode::RcSendOnly, 12),
            (Opcode::RcSendOnlyWithImmediate, 16),
            (Opcode::RcRdmaWriteFirst, 28),
            (Opcode::RcRdmaWriteOnlyWithImmediate, 32),
            (Opcode::RcRdmaReadRequest, 28),
            (Opcode::RcRdmaReadResponseFirst, 16),
            (Opcode::RcRdmaReadResponseMiddle, 12),
            (Opcode::RcAcknowledge, 16),
            (Opcode::RcAtomicAcknowledge, 24),
            (Opcode::RcCompareSwap, 40),
            (Opcode::UdSendOnly, 20),
            (Opcode::UdSendOnlyWithImmediate, 24),
            (Opcode::RcFlush, 32),
            (Opcode::Cnp, 28),
        ];
        for (op, len) in cases {
            assert_eq!(op.header_len(), len, "{op}");
        }
        let h = Opcode::RcRdmaWriteOnlyWithImmediate.headers();
        assert_eq!(h.offset_of(Headers::RETH), Some(0));
        assert_eq!(h.offset_of(Headers::IMM_DT), Some(16));
        assert_eq!(Opcode::RcFlush.headers().offset_of(Headers::RETH), Some(4));
        // The longest: XRC compare-and-swap, BTH + XRCETH + AtomicETH.
        assert_eq!(crate::MAX_HEADER_LEN, 44);
        assert_eq!(Opcode::XrcCompareSwap.header_len(), crate::MAX_HEADER_LEN);
        assert_eq!(
            Opcode::RcAtomicAcknowledge
                .headers()
                .offset_of(Headers::ATOMIC_ACK_ETH),
            Some(4)
        );
    }

    #[test]
    fn table_round_trips_and_classifies() {
        assert_eq!(Opcode::ALL.len(), 64);
        for v in 0..=255u8 {
            if let Some(op) = Opcode::from_u8(v) {
                assert_eq!(op.value(), v);
            }
        }
        assert_eq!(Opcode::UcSendOnly.transport(), Transport::Uc);
        assert_eq!(Opcode::UdSendOnly.transport(), Transport::Ud);
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert_eq!(Opcode::SrdmaSack.transport(), Transport::Rc);
        assert!(Opcode::SrdmaSack.is_response() && !Opcode::SrdmaSack.is_request());
        assert_eq!(Opcode::SrdmaSack.header_len(), 12 + 32);
        assert!(Opcode::RcRdmaWriteLastWithImmediate.consumes_recv_wqe());
        assert!(!Opcode::RcRdmaWriteLast.consumes_recv_wqe());
        assert!(Opcode::RcSendFirst.consumes_recv_wqe());
        assert!(!Opcode::RcSendFirst.completes_recv());
        assert_eq!(
            Opcode::try_from(0x15),
            Err(crate::Error::UnknownOpcode(0x15))
        );
        assert_eq!(
            Opcode::for_message(Transport::Rc, Kind::Write, Position::Last, true),
            Some(Opcode::RcRdmaWriteLastWithImmediate)
        );
        assert_eq!(
            Opcode::for_message(Transport::Uc, Kind::ReadRequest, Position::Only, false),
            None
        );
        // The computed answer equals a search of the table, for every combination.
        let kinds = [
            Kind::Send,
            Kind::Write,
            Kind::ReadRequest,
            Kind::ReadResponse,
            Kind::Acknowledge,
        ];
        for t in [
            Transport::Rc,
            Transport::Uc,
            Transport::Ud,
            Transport::Cnp,
            Transport::Xrc,
        ] {
            for k in kinds {
                for p in [
                    Position::First,
                    Position::Middle,
                    Position::Last,
                    Position::Only,
                ] {
                    for imm in [false, true] {
                        let searched = Opcode::ALL.iter().copied().find(|op| {
                            op.transport() == t
                                && op.kind() == k
                                && matches!(k, Kind::Send | Kind::Write | Kind::ReadResponse)
                                && op.position() == Some(p)
                                && op.has_immediate() == imm
                                && !op.has_invalidate()
                        });
                        assert_eq!(
                            Opcode::for_message(t, k, p, imm),
                            searched,
                            "{t:?} {k:?} {p:?} {imm}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn payload_rules() {
        assert!(Opcode::RcSendFirst.check_payload_len(1024, 1024).is_ok());
        assert!(Opcode::RcSendFirst.check_payload_len(1000, 1024).is_err());
        assert!(Opcode::RcSendLast.check_payload_len(0, 1024).is_err());
        assert!(Opcode::RcSendOnly.check_payload_len(0, 1024).is_ok());
        assert!(Opcode::RcSendOnly.check_payload_len(1025, 1024).is_err());
        assert!(Opcode::RcAcknowledge.check_payload_len(4, 1024).is_err());
        assert!(Opcode::RcAtomicWrite.check_payload_len(8, 256).is_ok());
    }
}
