//! The action driver shared by the `qp_pair` fuzz target (`fuzz/fuzz_targets/qp_pair.rs`
//! includes this file by path) and the `arbitrary_input` proptest, so CI builds and runs the
//! very code libFuzzer drives.
//!
//! [`run`] decodes any byte string — every string is a valid script — into a [`Setup`] (QP
//! type, path MTU, PSNs, timers, queue sizes, SRQs, IPv4/IPv6 and three memory regions per
//! end of a connected RC, UC or UD pair) and up to [`MAX_ACTIONS`] [`Action`]s, and executes
//! them: posting sends of every operation with valid, stale, foreign or random keys, in- and
//! out-of-bounds addresses, misaligned atomics, inline data and any flags; posting receives;
//! `modify` to any state with any attribute mask; deregistering and registering regions;
//! delivering arbitrary bytes, crafted packets of any opcode, and mutated copies of packets the
//! QPs sent (bit flips, PSN/QPN/opcode/header/length rewrites, re-emitted so they parse);
//! dropping, duplicating, reflecting and reordering packets; moving time and firing timers;
//! polling completions. Then it drains the pair over a lossless wire.
//!
//! Invariants (a violation panics, which is what the fuzzer and the test look for):
//! - nothing in srdma-proto panics;
//! - every packet `poll_transmit` writes parses with `PacketRepr::parse_bytes`, is at most
//!   `MAX_PACKET_LEN` bytes, uses the QP's transport, and comes only when `wants_transmit()`
//!   said there was something to send;
//! - after `handle_timeout(now)`, `poll_timeout()` is not `<= now` (an engine sleeping until
//!   the next deadline would spin);
//! - every completion names its QP and belongs to a work request posted to that QP (or its
//!   SRQ), on that side (send/receive), not yet completed and not discarded by RESET;
//! - with the clock stopped and a lossless wire the pair falls silent (no livelock);
//! - the run terminates: at most [`MAX_ACTIONS`] actions, [`MAX_PKTS_PER_STEP`] packets per
//!   action and [`MAX_PKTS_PER_RUN`] per run before the final drain.
//!
//! [`encode`] is the exact inverse of [`decode`] for scripts built from [`Action`]s, so tests
//! write seeds as actions (see `tests/arbitrary_input.rs`).
#![allow(dead_code)]

use std::collections::{HashSet, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use srdma_proto::qp::{AhAttr, transition_rule};
use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_proto::{
    AccessFlags, AttrMask, CqSide, Ctx, DeviceLimits, MrKeys, MrTable, Mtu, PdId, Qp, QpAttr,
    QpCaps, QpConfig, QpState, QpType, RKey, RecvMeta, RecvWr, SendFlags, SendOp, SendWr, Sge,
    SgeList, Srq, UdDest, VecMemory, Wc,
};
use srdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Encap, FethRepr, Headers, IpRepr,
    Kind, Opcode, PacketRepr, PayloadRule, Psn, Qpn, ROCEV2_PORT, RethRepr, Syndrome, Transport,
};

/// Most actions executed per input.
pub const MAX_ACTIONS: usize = 256;
/// Most packets one action moves.
pub const MAX_PKTS_PER_STEP: usize = 256;
/// Most packets the actions of one run move (the final drain comes on top).
pub const MAX_PKTS_PER_RUN: usize = 8192;
/// Packets kept for replay, newest last.
const LOG_LEN: usize = 64;
/// Packets held back for reordering; the oldest is delivered late when more arrive.
const HELD_MAX: usize = 32;
/// Regions remembered per end (dead ones too: their keys are reused as stale keys).
const REGIONS_MAX: usize = 16;
/// Size of each end's memory-region table (small, so slots get reused and the table fills).
const MAX_MR: u32 = 8;
/// The Q_Key both UD QPs are configured with.
pub const QKEY: u32 = 0x1111_1111;
/// QP numbers of the two ends.
pub const QPN: [u32; 2] = [0x11, 0x22];
const PD: PdId = PdId(1);

// ---------------------------------------------------------------------------------------------
// Byte codec.

/// Reads the input; past its end every byte reads as zero.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }

    /// True once every byte was read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn byte(&mut self) -> u8 {
        match self.data.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }
}

/// A value with a fixed byte encoding (little-endian integers, fields in order).
pub trait Field: Sized {
    /// Decodes one value.
    fn get(r: &mut Reader<'_>) -> Self;
    /// Encodes it; `get` reads it back unchanged.
    fn put(&self, w: &mut Vec<u8>);
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn get(r: &mut Reader<'_>) -> Self {
                let mut b = [0u8; size_of::<$t>()];
                for x in &mut b {
                    *x = r.byte();
                }
                <$t>::from_le_bytes(b)
            }
            fn put(&self, w: &mut Vec<u8>) {
                w.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
int_field!(u8, u16, u32, u64);

impl<T: Field, const N: usize> Field for [T; N] {
    fn get(r: &mut Reader<'_>) -> Self {
        std::array::from_fn(|_| T::get(r))
    }
    fn put(&self, w: &mut Vec<u8>) {
        for x in self {
            x.put(w);
        }
    }
}

/// Up to seven elements: a count byte (low three bits), then the elements.
impl<T: Field> Field for Vec<T> {
    fn get(r: &mut Reader<'_>) -> Self {
        let n = r.byte() & 7;
        (0..n).map(|_| T::get(r)).collect()
    }
    fn put(&self, w: &mut Vec<u8>) {
        assert!(self.len() <= 7, "a list holds at most 7 elements");
        w.push(self.len() as u8);
        for x in self {
            x.put(w);
        }
    }
}

/// Raw bytes: a length byte (255: a 16-bit length modulo `MAX_PACKET_LEN + 64` follows), then
/// the bytes. Short by default, so one raw packet does not swallow the rest of the input.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl Field for Bytes {
    fn get(r: &mut Reader<'_>) -> Self {
        let n = match r.byte() {
            255 => usize::from(u16::get(r)) % (MAX_PACKET_LEN + 64),
            n => usize::from(n),
        };
        Bytes(r.take(n).to_vec())
    }
    fn put(&self, w: &mut Vec<u8>) {
        let n = self.0.len();
        assert!(n < MAX_PACKET_LEN + 64, "raw packet too long");
        if n < 255 {
            w.push(n as u8);
        } else {
            w.push(255);
            (n as u16).put(w);
        }
        w.extend_from_slice(&self.0);
    }
}

/// Declares a struct of [`Field`]s whose encoding is its fields in order.
macro_rules! record {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
        impl Field for $name {
            fn get(r: &mut Reader<'_>) -> Self {
                $name { $($f: <$t as Field>::get(r),)* }
            }
            fn put(&self, w: &mut Vec<u8>) {
                $(self.$f.put(w);)*
            }
        }
    };
}

record!(
    /// A local buffer: which key (`key % 8`: 0-3 a region of this end, live or dead; 4 far
    /// past its start; 5 just before it; 6 a random key; 7 a region of the other end), which
    /// region, the offset in it and the length (`len >> 14`: 0-1 up to 16 KiB, 2 up to 63
    /// bytes, 3 above 2 GiB). "Tidy" requests ignore `key` and stay inside a live region.
    SgeSpec { key: u8, mr: u8, off: u16, len: u16 }
);
record!(
    /// A remote buffer (R_Key and VA), chosen like [`SgeSpec`] among the other end's regions.
    RemoteSpec { key: u8, mr: u8, off: u32 }
);
record!(
    /// A memory region: length, access flags, and (bit 7 of `addr`) a misaligned start.
    MrSpec { len: u16, access: u8, addr: u8 }
);
record!(
    /// How the pair is built. `ty % 3`: RC, UC, UD; `mtu % 5`: 256..4096; `flags`: bit 0/1
    /// `sq_sig_all` on A/B, bit 2/3 an SRQ on A/B, bit 4 IPv6, bit 5 PSNs next to the 2^24
    /// wrap; `caps`: send and receive depth (`% 17`), send and receive SGEs (`% 6`), inline
    /// bytes (`× 3`, above the device's 512 falls back to 512).
    Setup {
        ty: u8,
        mtu: u8,
        flags: u8,
        psn: [u32; 2],
        timeout: u8,
        retry: u8,
        rnr_retry: u8,
        min_rnr: u8,
        max_rd: u8,
        max_dest_rd: u8,
        caps: [u8; 5],
        mrs: [MrSpec; 6],
    }
);
record!(
    /// `post_send` on `end & 1`. `op & 7 % 7`: SEND, SEND/imm, WRITE, WRITE/imm, READ,
    /// CMP_SWAP, FETCH_ADD; `op & 8`: tidy (valid buffers, one aligned 8-byte SGE for atomics);
    /// `flags`: raw `ibv_send_flags` bits; `inline & 0x8000`: inline data of `inline & 0x3ff`
    /// bytes; `ud % 8` picks the UD destination (right, own Q_Key, wrong Q_Key, wrong QPN, none).
    PostSend {
        end: u8,
        op: u8,
        flags: u8,
        sges: Vec<SgeSpec>,
        remote: RemoteSpec,
        imm: u32,
        compare: u64,
        swap: u64,
        inline: u16,
        ud: u8,
    }
);
record!(
    /// `post_recv` on `end & 1` (to its SRQ if it has one, unless bit 2); bit 1: tidy buffers.
    PostRecv { end: u8, sges: Vec<SgeSpec> }
);
record!(
    /// Attributes of a modify. `mask_mode % 4`: 0 raw mask (unknown bits too), 1 known bits,
    /// 2 the transition's required attributes plus some optional ones, 3 the same without
    /// ALT_PATH. `misc`: bit 0 CUR_STATE right, bit 1 values in range, bit 2 random Q_Key,
    /// bit 3 random destination QPN, bit 4 random GID, bit 5 SQD async notify.
    AttrSpec {
        state: u8,
        cur: u8,
        mask_mode: u8,
        mask: u32,
        rq_psn: u32,
        sq_psn: u32,
        access: u8,
        mtu: u8,
        timeout: u8,
        retry: u8,
        rnr_retry: u8,
        min_rnr: u8,
        max_rd: u8,
        max_dest_rd: u8,
        qkey: u32,
        dest_qpn: u32,
        av: u8,
        flow_label: u32,
        misc: u8,
    }
);
record!(
    /// `modify` of `end & 1`.
    Modify { end: u8, attr: AttrSpec }
);
record!(
    /// RESET then INIT/RTR/RTS with valid attributes: `which % 3` A, B or both; bit 2 takes
    /// PSNs that continue the traffic seen so far instead of `psn`; `mtu % 6 == 5` keeps the
    /// setup's MTU.
    Reconnect { which: u8, psn: [u32; 2], mtu: u8, timeout: u8, retry: u8, rnr: u8 }
);
record!(
    /// Deregisters region `mr` of `end & 1`: `mode` bit 0 keeps its memory, bit 1 uses a
    /// random key instead.
    Dereg { end: u8, mr: u8, mode: u8 }
);
record!(
    /// Registers a region on `end & 1`: `mode % 4` 0-1 with its memory, 2 with half of it,
    /// 3 without; bit 2 raw (possibly invalid) access flags; bit 3 an address that overflows.
    Reg { end: u8, spec: MrSpec, mode: u8 }
);
record!(
    /// Delivers raw bytes to `to & 1` (dropped if they do not parse).
    Raw { to: u8, bytes: Bytes }
);
record!(
    /// Builds a well-formed packet and delivers it to `to & 1`. `mode`: bits 0-1 the PSN (the
    /// expected one, near it, `psn`, one before), bit 2 a random destination QPN, bit 3 a
    /// random P_Key, bit 4 a payload of any length (else one the opcode allows at the path
    /// MTU), bit 5 any opcode (else one of the receiver's transport), bit 6 a DMA length
    /// inside the region; `opcode` picks it, `key` the R_Key/VA of RETH and AtomicETH.
    Craft {
        to: u8,
        opcode: u8,
        mode: u8,
        psn: u32,
        key: RemoteSpec,
        len: u32,
        imm: u32,
        syn: u8,
        msn: u32,
        val: u64,
        payload: u16,
    }
);
record!(
    /// Up to `count % 16 + 1` packets from `from & 1`, each with `fate` (see [`Fate`]);
    /// mutations take `a` (plus the packet's index) and `b`.
    Transmit { from: u8, count: u8, fate: u8, a: u32, b: u32 }
);
record!(
    /// Moves packets both ways until both ends are idle; each packet has a `loss`/256 chance of
    /// a fate other than delivery, drawn from `seed`.
    Pump { seed: u32, loss: u8 }
);
record!(
    /// Delivers held packet `idx` (bit 0 of `how`: twice).
    Release { idx: u8, how: u8 }
);
record!(
    /// Delivers a mutated copy of the `idx`-th newest logged packet to its receiver (or, with
    /// `to & 1`, back to its sender). See [`mutate`] for `kind`, `a`, `b`.
    Replay { idx: u8, to: u8, kind: u8, a: u32, b: u32 }
);
record!(
    /// `kind % 4`: 0 fire the next timer, 1 advance `delta` µs and run timers, 2 run timers
    /// without advancing, 3 advance to 1 ns before the next deadline and run timers.
    Timer { kind: u8, delta: u32 }
);
record!(
    /// Polls up to `max % 32 + 1` completions of `end & 1` (`max == 255`: all); bits 1-2 of
    /// `end`: both CQs, the send CQ, the receive CQ.
    Poll { end: u8, max: u8 }
);
record!(
    /// A pump, then up to `timers % 16` rounds of firing the next timer and pumping.
    Settle { seed: u32, loss: u8, timers: u8 }
);

/// One step of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `post_send`.
    PostSend(PostSend),
    /// `post_recv` (or the SRQ's `post`).
    PostRecv(PostRecv),
    /// `modify` with any state and mask.
    Modify(Modify),
    /// RESET and reconnect with valid attributes.
    Reconnect(Reconnect),
    /// Deregister a region.
    Dereg(Dereg),
    /// Register a region.
    Reg(Reg),
    /// Deliver raw bytes.
    Raw(Raw),
    /// Deliver a crafted packet.
    Craft(Craft),
    /// Transmit a few packets from one end.
    Transmit(Transmit),
    /// Move packets until idle.
    Pump(Pump),
    /// Deliver a held packet.
    Release(Release),
    /// Deliver a mutated copy of a logged packet.
    Replay(Replay),
    /// Move time, run timers.
    Timer(Timer),
    /// Poll completions.
    Poll(Poll),
    /// Pump and fire timers.
    Settle(Settle),
}

/// Action kinds by tag byte (`tag % 32`), weighted towards traffic: a random input should
/// mostly post, move packets and run timers, and only sometimes tear the connection down.
const TAGS: [u8; 32] = [
    0, 0, 0, 0, 1, 1, 1, 2, 3, 4, 5, 6, 7, 7, 7, 8, 8, 8, 9, 9, 9, 10, 11, 11, 11, 12, 12, 13, 13,
    14, 14, 14,
];

impl Field for Action {
    fn get(r: &mut Reader<'_>) -> Self {
        match TAGS[usize::from(r.byte() % 32)] {
            0 => Action::PostSend(Field::get(r)),
            1 => Action::PostRecv(Field::get(r)),
            2 => Action::Modify(Field::get(r)),
            3 => Action::Reconnect(Field::get(r)),
            4 => Action::Dereg(Field::get(r)),
            5 => Action::Reg(Field::get(r)),
            6 => Action::Raw(Field::get(r)),
            7 => Action::Craft(Field::get(r)),
            8 => Action::Transmit(Field::get(r)),
            9 => Action::Pump(Field::get(r)),
            10 => Action::Release(Field::get(r)),
            11 => Action::Replay(Field::get(r)),
            12 => Action::Timer(Field::get(r)),
            13 => Action::Poll(Field::get(r)),
            _ => Action::Settle(Field::get(r)),
        }
    }

    fn put(&self, w: &mut Vec<u8>) {
        let kind = match self {
            Action::PostSend(_) => 0,
            Action::PostRecv(_) => 1,
            Action::Modify(_) => 2,
            Action::Reconnect(_) => 3,
            Action::Dereg(_) => 4,
            Action::Reg(_) => 5,
            Action::Raw(_) => 6,
            Action::Craft(_) => 7,
            Action::Transmit(_) => 8,
            Action::Pump(_) => 9,
            Action::Release(_) => 10,
            Action::Replay(_) => 11,
            Action::Timer(_) => 12,
            Action::Poll(_) => 13,
            Action::Settle(_) => 14,
        };
        w.push(TAGS.iter().position(|&k| k == kind).unwrap() as u8);
        match self {
            Action::PostSend(x) => x.put(w),
            Action::PostRecv(x) => x.put(w),
            Action::Modify(x) => x.put(w),
            Action::Reconnect(x) => x.put(w),
            Action::Dereg(x) => x.put(w),
            Action::Reg(x) => x.put(w),
            Action::Raw(x) => x.put(w),
            Action::Craft(x) => x.put(w),
            Action::Transmit(x) => x.put(w),
            Action::Pump(x) => x.put(w),
            Action::Release(x) => x.put(w),
            Action::Replay(x) => x.put(w),
            Action::Timer(x) => x.put(w),
            Action::Poll(x) => x.put(w),
            Action::Settle(x) => x.put(w),
        }
    }
}

/// Splits an input into its setup and actions (at most [`MAX_ACTIONS`]).
pub fn decode(data: &[u8]) -> (Setup, Vec<Action>) {
    let mut r = Reader::new(data);
    let setup = Setup::get(&mut r);
    let mut actions = Vec::new();
    while !r.is_empty() && actions.len() < MAX_ACTIONS {
        actions.push(Action::get(&mut r));
    }
    (setup, actions)
}

/// The input that [`decode`]s to `setup` and `actions`.
pub fn encode(setup: &Setup, actions: &[Action]) -> Vec<u8> {
    let mut w = Vec::new();
    setup.put(&mut w);
    for a in actions {
        a.put(&mut w);
    }
    w
}

// ---------------------------------------------------------------------------------------------
// The pair.

/// What a run did (for tests that check a script exercised what it meant to).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Actions executed.
    pub actions: usize,
    /// Send WRs accepted / refused by `post_send`.
    pub posted_sends: usize,
    /// Send WRs refused.
    pub refused_sends: usize,
    /// Receive WRs accepted (QP or SRQ).
    pub posted_recvs: usize,
    /// Receive WRs refused.
    pub refused_recvs: usize,
    /// Modifies accepted.
    pub modifies_ok: usize,
    /// Modifies refused.
    pub modifies_refused: usize,
    /// Packets written by `poll_transmit` (drain included).
    pub transmitted: usize,
    /// Packets handed to `handle_packet`.
    pub delivered: usize,
    /// Inputs meant as packets that did not parse (raw bytes, raw mutations).
    pub unparsable: usize,
    /// Timer runs.
    pub timers: usize,
    /// Successful send completions.
    pub send_ok: usize,
    /// Failed send completions.
    pub send_err: usize,
    /// Successful receive completions.
    pub recv_ok: usize,
    /// Failed receive completions.
    pub recv_err: usize,
    /// Packets moved by the final drain.
    pub drained: usize,
}

/// What happens to a transmitted packet (`fate % 8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// 0-2: delivered to the other end.
    Deliver,
    /// 3: dropped.
    Drop,
    /// 4: delivered twice.
    Duplicate,
    /// 5: held back, delivered later (reordered).
    Hold,
    /// 6: delivered to the other end and reflected back to the sender.
    Reflect,
    /// 7: mutated, then delivered.
    Mutate,
}

impl Fate {
    /// The fate a byte selects.
    pub fn from_byte(b: u8) -> Fate {
        match b % 8 {
            0..=2 => Fate::Deliver,
            3 => Fate::Drop,
            4 => Fate::Duplicate,
            5 => Fate::Hold,
            6 => Fate::Reflect,
            _ => Fate::Mutate,
        }
    }
}

struct Region {
    keys: MrKeys,
    addr: u64,
    len: u64,
    live: bool,
}

struct Side {
    qp: Qp,
    mrs: MrTable,
    mem: VecMemory,
    srq: Option<Srq>,
    ip: IpAddr,
    regions: Vec<Region>,
    /// wr_ids of send WRs posted and not yet completed (or discarded by RESET).
    sends: HashSet<u64>,
    /// wr_ids of receive WRs posted (QP or SRQ) and not yet completed.
    recvs: HashSet<u64>,
    /// The PSN after the last request this end put on the wire.
    next_req_psn: Psn,
}

/// Valid connection attributes.
struct Conn {
    sq_psn: Psn,
    rq_psn: Psn,
    mtu: Mtu,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
    min_rnr: u8,
    max_rd: u8,
    max_dest_rd: u8,
}

struct World {
    sides: [Side; 2],
    ty: QpType,
    port_mtu: Mtu,
    /// Encapsulation of packets arriving at each end.
    encap: [Encap; 2],
    now: Duration,
    limits: DeviceLimits,
    log: VecDeque<(usize, Vec<u8>)>,
    held: VecDeque<(usize, Vec<u8>)>,
    next_wr_id: u64,
    next_addr: u64,
    budget: usize,
    buf: Vec<u8>,
    stats: Stats,
}

/// Decodes `data` and runs it; panics if an invariant breaks.
pub fn run(data: &[u8]) -> Stats {
    let (setup, actions) = decode(data);
    execute(&setup, &actions)
}

/// Runs a decoded script; panics if an invariant breaks.
pub fn execute(setup: &Setup, actions: &[Action]) -> Stats {
    let mut w = World::new(setup);
    for a in actions.iter().take(MAX_ACTIONS) {
        w.step(a);
    }
    w.finish();
    w.stats
}

fn gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Deterministic filler bytes.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

/// Region rights from the low four bits, made registrable (remote write or atomic ⇒ local write).
fn mr_access(bits: u8) -> AccessFlags {
    let mut a = AccessFlags::from_bits_truncate(u32::from(bits & 0x0F));
    if a.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
        a |= AccessFlags::LOCAL_WRITE;
    }
    a
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn shift_psn(p: Psn, a: u32, b: u32) -> Psn {
    if b & 1 == 1 {
        return Psn::new(a);
    }
    let d = (a % 257) as i32 - 128;
    if d >= 0 {
        p.add(d as u32)
    } else {
        p.sub(d.unsigned_abs())
    }
}

/// `(key, address, bytes left in the region from there)` for a buffer spec: `regions` are the
/// end the key is meant for, `others` the other end's (a key from the wrong table).
fn pick(
    regions: &[Region],
    others: &[Region],
    key: u8,
    mr: u8,
    off: u64,
    tidy: bool,
) -> (u32, u64, u64) {
    if tidy {
        let live: Vec<&Region> = regions.iter().filter(|r| r.live).collect();
        if let Some(r) = live.get(usize::from(mr) % live.len().max(1)) {
            let o = off % r.len.max(1);
            return (r.keys.lkey.0, r.addr.wrapping_add(o), r.len - o.min(r.len));
        }
    }
    let from = |rs: &[Region]| -> Option<(u32, u64, u64)> {
        let r = rs.get(usize::from(mr) % rs.len().max(1))?;
        Some((r.keys.lkey.0, r.addr, r.len))
    };
    let sel = key % 8;
    let found = match sel {
        6 => None,
        7 => from(others),
        _ => from(regions),
    };
    let Some((k, base, len)) = found else {
        let wild_key = (u32::from(mr) << 8) | (off as u32 & 0xFFFF_00FF);
        return (wild_key, off.wrapping_mul(0x9E37_79B9_7F4A_7C15), 0);
    };
    match sel {
        4 => (k, base.wrapping_add(off << 8), 0),
        5 => (k, base.wrapping_sub(off % 16 + 1), 0),
        _ => {
            let o = off % (len + 9);
            (k, base.wrapping_add(o), len.saturating_sub(o))
        }
    }
}

fn sge_len(len: u16, room: u64, tidy: bool) -> u32 {
    if tidy {
        return u64::from(len & 0x3FFF).min(room) as u32;
    }
    match len >> 14 {
        0 | 1 => u32::from(len & 0x3FFF),
        2 => u32::from(len & 0x3F),
        _ => 0x8000_0000 | (u32::from(len & 0x3FFF) << 16),
    }
}

impl World {
    fn new(setup: &Setup) -> World {
        let ty = QpType::ALL[usize::from(setup.ty % 3)];
        let mtu = Mtu::ALL[usize::from(setup.mtu % 5)];
        let limits = DeviceLimits::default();
        let ips: [IpAddr; 2] = if setup.flags & 0x10 != 0 {
            ["fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()]
        } else {
            ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()]
        };
        let c = setup.caps;
        let mut caps = QpCaps {
            max_send_wr: u32::from(c[0] % 17),
            max_recv_wr: u32::from(c[1] % 17),
            max_send_sge: u32::from(c[2] % 6),
            max_recv_sge: u32::from(c[3] % 6),
            max_inline_data: u32::from(c[4]) * 3,
        };
        let mk = |e: usize, caps: QpCaps| -> Result<Side, srdma_proto::CapsError> {
            let cfg = QpConfig {
                qpn: Qpn::new(QPN[e]),
                qp_type: ty,
                pd: PD,
                caps,
                sq_sig_all: setup.flags & (1 << e) != 0,
                uses_srq: setup.flags & (4 << e) != 0,
                port_mtu: mtu,
            };
            Ok(Side {
                qp: Qp::new(cfg, &limits)?,
                mrs: MrTable::with_max_mr(0x5eed + e as u64, MAX_MR),
                mem: VecMemory::new(),
                srq: cfg
                    .uses_srq
                    .then(|| Srq::new(caps.max_recv_wr, caps.max_recv_sge)),
                ip: ips[e],
                regions: Vec::new(),
                sends: HashSet::new(),
                recvs: HashSet::new(),
                next_req_psn: Psn::new(0),
            })
        };
        let (a, b) = match (mk(0, caps), mk(1, caps)) {
            (Ok(a), Ok(b)) => (a, b),
            _ => {
                // Refused capabilities (inline data above the device limit): clamp.
                caps.max_inline_data = caps.max_inline_data.min(limits.max_inline_data);
                (mk(0, caps).unwrap(), mk(1, caps).unwrap())
            }
        };
        let encap = |from: IpAddr, to: IpAddr| Encap {
            ip: IpRepr::between(from, to).unwrap(),
            src_port: 0xC000,
            dst_port: ROCEV2_PORT,
        };
        let mut w = World {
            encap: [encap(ips[1], ips[0]), encap(ips[0], ips[1])],
            sides: [a, b],
            ty,
            port_mtu: mtu,
            now: Duration::ZERO,
            limits,
            log: VecDeque::new(),
            held: VecDeque::new(),
            next_wr_id: 1,
            next_addr: 0x1000_0000,
            budget: MAX_PKTS_PER_RUN,
            buf: vec![0; MAX_PACKET_LEN],
            stats: Stats::default(),
        };
        for (i, spec) in setup.mrs.iter().enumerate() {
            w.register(i / 3, spec, mr_access(spec.access), 0);
        }
        let psn = if setup.flags & 0x20 != 0 {
            [Psn::new(0xFF_FFF0), Psn::new(0xFF_FFF8)]
        } else {
            [Psn::new(setup.psn[0]), Psn::new(setup.psn[1])]
        };
        for e in 0..2 {
            let conn = Conn {
                sq_psn: psn[e],
                rq_psn: psn[1 - e],
                mtu,
                timeout: setup.timeout % 32,
                retry: setup.retry % 8,
                rnr_retry: setup.rnr_retry % 8,
                min_rnr: setup.min_rnr % 32,
                max_rd: setup.max_rd % 17,
                max_dest_rd: setup.max_dest_rd % 17,
            };
            w.connect(e, &conn)
                .unwrap_or_else(|err| panic!("driver: connecting end {e} failed: {err}"));
            // Bit 6: both ends recover by selective repeat (SACKs, kept packets, early
            // retransmission).
            if setup.flags & 0x40 != 0 {
                w.sides[e]
                    .qp
                    .set_reliability(srdma_proto::Reliability::SelectiveRepeat);
            }
        }
        w
    }

    fn ctx_parts(&mut self, e: usize) -> (Duration, &mut Side) {
        (self.now, &mut self.sides[e])
    }

    /// RESET, then INIT → RTR → RTS with `c` (the masks `ibv_rc_pingpong` and friends use).
    fn connect(&mut self, e: usize, c: &Conn) -> Result<(), srdma_proto::ModifyError> {
        let peer_qpn = self.sides[1 - e].qp.qpn();
        let peer_gid = gid(self.sides[1 - e].ip);
        let mut attr = QpAttr {
            qp_access_flags: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qkey: QKEY,
            path_mtu: c.mtu,
            timeout: c.timeout,
            retry_cnt: c.retry,
            rnr_retry: c.rnr_retry,
            min_rnr_timer: c.min_rnr,
            max_rd_atomic: c.max_rd,
            max_dest_rd_atomic: c.max_dest_rd,
            dest_qp_num: peer_qpn,
            rq_psn: c.rq_psn,
            sq_psn: c.sq_psn,
            ah_attr: AhAttr {
                dgid: peer_gid,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        let (init, rtr, rts) = match self.ty {
            QpType::Ud => (
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
                AttrMask::STATE,
                AttrMask::STATE | AttrMask::SQ_PSN,
            ),
            QpType::Uc => (
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN,
                AttrMask::STATE | AttrMask::SQ_PSN,
            ),
            QpType::Rc => (
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MAX_DEST_RD_ATOMIC
                    | AttrMask::MIN_RNR_TIMER,
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::MAX_QP_RD_ATOMIC,
            ),
        };
        let limits = &self.limits;
        let s = &mut self.sides[e];
        for (state, mask) in [
            (QpState::Reset, AttrMask::STATE),
            (QpState::Init, init),
            (QpState::Rtr, rtr),
            (QpState::Rts, rts),
        ] {
            attr.qp_state = state;
            s.qp.modify(&attr, mask, limits)?;
            if state == QpState::Reset {
                s.forget_discarded();
            }
        }
        s.next_req_psn = c.sq_psn;
        Ok(())
    }

    fn register(&mut self, e: usize, spec: &MrSpec, access: AccessFlags, mode: u8) {
        let len = u64::from(spec.len);
        let misalign = if spec.addr & 0x80 != 0 {
            u64::from(spec.addr & 7)
        } else {
            0
        };
        let addr = if mode & 8 != 0 {
            u64::MAX - len / 2
        } else {
            self.next_addr + misalign
        };
        self.next_addr += 0x10_0000;
        let s = &mut self.sides[e];
        let Ok(keys) = s.mrs.register(PD, addr, len, access) else {
            return;
        };
        match mode % 4 {
            0 | 1 => s
                .mem
                .insert(keys.handle, pattern(len as usize, addr as u32)),
            2 => s
                .mem
                .insert(keys.handle, pattern(len as usize / 2, addr as u32)),
            _ => {}
        }
        if s.regions.len() >= REGIONS_MAX {
            let victim = s.regions.iter().position(|r| !r.live).unwrap_or(0);
            s.regions.remove(victim);
        }
        s.regions.push(Region {
            keys,
            addr,
            len,
            live: true,
        });
    }

    fn step(&mut self, a: &Action) {
        self.stats.actions += 1;
        match a {
            Action::PostSend(x) => self.post_send(x),
            Action::PostRecv(x) => self.post_recv(x),
            Action::Modify(x) => self.modify(x),
            Action::Reconnect(x) => self.reconnect(x),
            Action::Dereg(x) => self.dereg(x),
            Action::Reg(x) => {
                let access = if x.mode & 4 != 0 {
                    AccessFlags::from_bits_retain(u32::from(x.spec.access))
                } else {
                    mr_access(x.spec.access)
                };
                self.register(usize::from(x.end & 1), &x.spec, access, x.mode);
            }
            Action::Raw(x) => self.deliver(usize::from(x.to & 1), &x.bytes.0),
            Action::Craft(x) => {
                if let Some(bytes) = self.craft(x) {
                    self.deliver(usize::from(x.to & 1), &bytes);
                }
            }
            Action::Transmit(x) => self.transmit_some(x),
            Action::Pump(x) => self.pump(x.seed, x.loss),
            Action::Release(x) => {
                if !self.held.is_empty() {
                    let i = usize::from(x.idx) % self.held.len();
                    if let Some((to, bytes)) = self.held.remove(i) {
                        self.deliver(to, &bytes);
                        if x.how & 1 != 0 {
                            self.deliver(to, &bytes);
                        }
                    }
                }
            }
            Action::Replay(x) => self.replay(x),
            Action::Timer(x) => self.timer(x),
            Action::Poll(x) => {
                let max = if x.max == 255 {
                    usize::MAX
                } else {
                    usize::from(x.max % 32) + 1
                };
                self.poll(usize::from(x.end & 1), max, x.end >> 1);
            }
            Action::Settle(x) => {
                self.pump(x.seed, x.loss);
                for i in 0..x.timers % 16 {
                    if !self.fire_next_timer() {
                        break;
                    }
                    self.pump(x.seed.wrapping_add(u32::from(i) + 1), x.loss);
                }
            }
        }
    }

    fn post_send(&mut self, p: &PostSend) {
        let e = usize::from(p.end & 1);
        let tidy = p.op & 8 != 0;
        let op_kind = (p.op & 7) % 7;
        let (own, peer) = if e == 0 {
            (&self.sides[0], &self.sides[1])
        } else {
            (&self.sides[1], &self.sides[0])
        };
        let atomic = op_kind >= 5;
        let r = &p.remote;
        let (rkey, mut va, remote_room) = pick(
            &peer.regions,
            &own.regions,
            r.key,
            r.mr,
            u64::from(r.off),
            tidy,
        );
        if tidy && atomic {
            va = va.wrapping_add(7) & !7;
        }
        let rkey = RKey(rkey);
        let op = match op_kind {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm: p.imm },
            2 => SendOp::Write {
                remote_addr: va,
                rkey,
            },
            3 => SendOp::WriteWithImm {
                remote_addr: va,
                rkey,
                imm: p.imm,
            },
            4 => SendOp::Read {
                remote_addr: va,
                rkey,
            },
            5 => SendOp::CompareSwap {
                remote_addr: va,
                rkey,
                compare: p.compare,
                swap: p.swap,
            },
            _ => SendOp::FetchAdd {
                remote_addr: va,
                rkey,
                add: p.swap,
            },
        };
        let mut sges = SgeList::new();
        if tidy && atomic {
            let s = p.sges.first().cloned().unwrap_or_default();
            let (lkey, addr, _) = pick(&own.regions, &[], 0, s.mr, u64::from(s.off), true);
            sges.push(Sge {
                addr,
                length: 8,
                lkey: srdma_proto::LKey(lkey),
            });
        } else {
            // A tidy WRITE or READ also fits the remote region.
            let mut room = if tidy && matches!(op_kind, 2..=4) {
                remote_room
            } else {
                u64::MAX
            };
            for s in &p.sges {
                let (lkey, addr, local_room) = pick(
                    &own.regions,
                    &peer.regions,
                    s.key,
                    s.mr,
                    u64::from(s.off),
                    tidy,
                );
                let length = sge_len(s.len, local_room.min(room), tidy);
                room = room.saturating_sub(u64::from(length));
                sges.push(Sge {
                    addr,
                    length,
                    lkey: srdma_proto::LKey(lkey),
                });
            }
        }
        let ud_dest = |qpn: u32, qkey: u32| UdDest {
            ah: AhAttr {
                dgid: gid(peer.ip),
                flow_label: u32::from(p.ud) << 8,
                ..AhAttr::default()
            },
            remote_qpn: Qpn::new(qpn),
            remote_qkey: qkey,
        };
        let peer_qpn = QPN[1 - e];
        let ud = if self.ty == QpType::Ud {
            match p.ud % 8 {
                0..=3 => Some(ud_dest(peer_qpn, QKEY)),
                4 => Some(ud_dest(peer_qpn, 0x8000_0000 | p.imm)),
                5 => Some(ud_dest(peer_qpn, p.imm)),
                6 => Some(ud_dest(p.imm, QKEY)),
                _ => None,
            }
        } else if p.ud % 16 == 15 {
            Some(ud_dest(peer_qpn, QKEY))
        } else {
            None
        };
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let wr = SendWr {
            wr_id,
            op,
            sges,
            flags: SendFlags::from_bits_retain(u32::from(p.flags)),
            inline_data: (p.inline & 0x8000 != 0)
                .then(|| pattern(usize::from(p.inline & 0x3FF) % 600, p.imm)),
            ud,
            xrc_srqn: None,
        };
        let s = &mut self.sides[e];
        match s.qp.post_send(wr) {
            Ok(()) => {
                s.sends.insert(wr_id);
                self.stats.posted_sends += 1;
            }
            Err(_) => self.stats.refused_sends += 1,
        }
    }

    fn post_recv(&mut self, p: &PostRecv) {
        let e = usize::from(p.end & 1);
        let tidy = p.end & 2 != 0;
        let (own, peer) = if e == 0 {
            (&self.sides[0], &self.sides[1])
        } else {
            (&self.sides[1], &self.sides[0])
        };
        let sges: SgeList = p
            .sges
            .iter()
            .map(|s| {
                let (lkey, addr, room) = pick(
                    &own.regions,
                    &peer.regions,
                    s.key,
                    s.mr,
                    u64::from(s.off),
                    tidy,
                );
                Sge {
                    addr,
                    length: sge_len(s.len, room, tidy),
                    lkey: srdma_proto::LKey(lkey),
                }
            })
            .collect();
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let wr = RecvWr { wr_id, sges };
        let s = &mut self.sides[e];
        let res = match s.srq.as_mut() {
            Some(srq) if p.end & 4 == 0 => srq.post(wr),
            _ => s.qp.post_recv(wr),
        };
        match res {
            Ok(()) => {
                s.recvs.insert(wr_id);
                self.stats.posted_recvs += 1;
            }
            Err(_) => self.stats.refused_recvs += 1,
        }
    }

    fn modify(&mut self, m: &Modify) {
        let e = usize::from(m.end & 1);
        let a = &m.attr;
        let sane = a.misc & 2 != 0;
        let state = QpState::ALL[usize::from(a.state % 7)];
        let actual = self.sides[e].qp.state();
        let cur = if a.misc & 1 != 0 {
            actual
        } else {
            QpState::ALL[usize::from(a.cur % 7)]
        };
        let peer_gid = gid(self.sides[1 - e].ip);
        let attr = QpAttr {
            qp_state: state,
            cur_qp_state: cur,
            path_mtu: Mtu::ALL[usize::from(a.mtu % 5)],
            qkey: if a.misc & 4 != 0 { a.qkey } else { QKEY },
            rq_psn: Psn::new(a.rq_psn),
            sq_psn: Psn::new(a.sq_psn),
            dest_qp_num: Qpn::new(if a.misc & 8 != 0 {
                a.dest_qpn
            } else {
                QPN[1 - e]
            }),
            qp_access_flags: if sane {
                AccessFlags::from_bits_truncate(u32::from(a.access & 0x0F))
            } else {
                AccessFlags::from_bits_retain(u32::from(a.access) | (a.mask & 0x0010_0000))
            },
            ah_attr: AhAttr {
                dgid: if a.misc & 16 != 0 {
                    let mut g = [0u8; 16];
                    g[..4].copy_from_slice(&a.flow_label.to_be_bytes());
                    g[12..].copy_from_slice(&a.dest_qpn.to_be_bytes());
                    g
                } else {
                    peer_gid
                },
                flow_label: if sane {
                    a.flow_label & 0xF_FFFF
                } else {
                    a.flow_label
                },
                sgid_index: if sane { 0 } else { a.av },
                is_global: sane || a.av & 1 != 0,
                port_num: if sane { 1 } else { a.av % 3 },
                hop_limit: a.av,
                traffic_class: a.av,
                sl: a.av & 0xF,
                udp_dport: ROCEV2_PORT,
            },
            pkey_index: if sane { 0 } else { u16::from(a.av >> 6) },
            en_sqd_async_notify: a.misc & 32 != 0,
            max_rd_atomic: if sane { a.max_rd % 17 } else { a.max_rd },
            max_dest_rd_atomic: if sane {
                a.max_dest_rd % 17
            } else {
                a.max_dest_rd
            },
            min_rnr_timer: if sane { a.min_rnr % 32 } else { a.min_rnr },
            timeout: if sane { a.timeout % 32 } else { a.timeout },
            retry_cnt: if sane { a.retry % 8 } else { a.retry },
            rnr_retry: if sane { a.rnr_retry % 8 } else { a.rnr_retry },
            ..QpAttr::default()
        };
        let known = AttrMask::from_bits_truncate(a.mask);
        let mask = match a.mask_mode % 4 {
            0 => AttrMask::from_bits_retain(a.mask),
            1 => known,
            mode => {
                let mut mask = match transition_rule(self.ty, actual, state) {
                    Some(rule) => rule.required | (known & rule.optional) | AttrMask::STATE,
                    None => known | AttrMask::STATE,
                };
                if mode == 3 {
                    mask -= AttrMask::ALT_PATH;
                }
                mask
            }
        };
        let s = &mut self.sides[e];
        match s.qp.modify(&attr, mask, &self.limits) {
            Ok(()) => {
                self.stats.modifies_ok += 1;
                if s.qp.state() == QpState::Reset && actual != QpState::Reset {
                    s.forget_discarded();
                }
                if mask.contains(AttrMask::SQ_PSN) {
                    s.next_req_psn = attr.sq_psn;
                }
            }
            Err(_) => self.stats.modifies_refused += 1,
        }
    }

    fn reconnect(&mut self, r: &Reconnect) {
        let ends: &[usize] = match r.which % 3 {
            0 => &[0],
            1 => &[1],
            _ => &[0, 1],
        };
        let seen = [self.sides[0].next_req_psn, self.sides[1].next_req_psn];
        let mtu = match r.mtu % 6 {
            5 => self.port_mtu,
            m => Mtu::ALL[usize::from(m)],
        };
        for &e in ends {
            let (sq, rq) = if r.which & 4 != 0 {
                (seen[e], seen[1 - e])
            } else {
                (Psn::new(r.psn[e]), Psn::new(r.psn[1 - e]))
            };
            let attr = self.sides[e].qp.attr();
            let conn = Conn {
                sq_psn: sq,
                rq_psn: rq,
                mtu,
                timeout: r.timeout % 32,
                retry: r.retry % 8,
                rnr_retry: r.rnr % 8,
                min_rnr: attr.min_rnr_timer % 32,
                max_rd: attr.max_rd_atomic.min(16),
                max_dest_rd: attr.max_dest_rd_atomic.min(16),
            };
            match self.connect(e, &conn) {
                Ok(()) => self.stats.modifies_ok += 1,
                Err(_) => self.stats.modifies_refused += 1,
            }
        }
    }

    fn dereg(&mut self, d: &Dereg) {
        let s = &mut self.sides[usize::from(d.end & 1)];
        if d.mode & 2 != 0 {
            let _ = s
                .mrs
                .deregister(srdma_proto::LKey(u32::from(d.mr) << 8 | u32::from(d.mode)));
            return;
        }
        if s.regions.is_empty() {
            return;
        }
        let i = usize::from(d.mr) % s.regions.len();
        let r = &mut s.regions[i];
        // Deregistering a dead region is the error path (a stale or reused key).
        if s.mrs.deregister(r.keys.lkey).is_ok() {
            r.live = false;
            if d.mode & 1 == 0 {
                s.mem.remove(r.keys.handle);
            }
        }
    }

    /// A well-formed packet as [`Craft`] describes it.
    fn craft(&self, c: &Craft) -> Option<Vec<u8>> {
        let to = usize::from(c.to & 1);
        let from = 1 - to;
        let receiver = &self.sides[to];
        let want = transport_of(self.ty);
        let op = if c.mode & 0x20 != 0 {
            Opcode::ALL[usize::from(c.opcode) % Opcode::ALL.len()]
        } else {
            let ops: Vec<Opcode> = Opcode::ALL
                .iter()
                .copied()
                .filter(|o| o.transport() == want)
                .collect();
            ops[usize::from(c.opcode) % ops.len()]
        };
        let base = if op.is_request() {
            self.sides[from].next_req_psn
        } else {
            receiver.next_req_psn.sub(1)
        };
        let psn = match c.mode & 3 {
            0 => base,
            1 => shift_psn(base, c.psn, 0),
            2 => Psn::new(c.psn),
            _ => base.sub(1),
        };
        let pmtu = receiver.qp.attr().path_mtu.bytes() as usize;
        let (rkey, va, room) = pick(
            &receiver.regions,
            &self.sides[from].regions,
            c.key.key,
            c.key.mr,
            u64::from(c.key.off),
            c.mode & 0x40 != 0,
        );
        let bth = BthRepr {
            opcode: op,
            solicited: c.msn & (1 << 30) != 0,
            mig_req: c.msn & (1 << 29) != 0,
            pad_cnt: 0,
            pkey: if c.mode & 8 != 0 {
                c.imm as u16
            } else {
                srdma_wire::bth::DEFAULT_PKEY
            },
            fecn: c.msn & (1 << 28) != 0,
            becn: c.msn & (1 << 27) != 0,
            dest_qpn: Qpn::new(if c.mode & 4 != 0 { c.msn } else { QPN[to] }),
            ack_req: c.msn & (1 << 31) != 0,
            psn,
        };
        let plen = if c.mode & 0x10 != 0 {
            usize::from(c.payload) % (MAX_PACKET_LEN + 1)
        } else {
            let p = usize::from(c.payload);
            match op.payload_rule() {
                PayloadRule::None => 0,
                PayloadRule::FullMtu => pmtu,
                PayloadRule::Last => 1 + p % pmtu,
                PayloadRule::UpToMtu => p % (pmtu + 1),
                PayloadRule::Exactly8 => 8,
            }
        };
        let payload = pattern(plen, c.imm);
        let h = op.headers();
        let dma_len = if c.mode & 0x40 != 0 {
            (u64::from(c.len) % (room + 1)) as u32
        } else {
            c.len
        };
        let mut r = PacketRepr::new(bth, &payload);
        r.deth = h.contains(Headers::DETH).then_some(DethRepr {
            qkey: if c.syn & 0x80 == 0 { QKEY } else { c.imm },
            src_qpn: Qpn::new(QPN[from]),
        });
        r.feth = h.contains(Headers::FETH).then_some(FethRepr {
            placement_type: c.syn & 0xF,
            selectivity: (c.syn >> 4) & 3,
        });
        r.reth = h
            .contains(Headers::RETH)
            .then_some(RethRepr { va, rkey, dma_len });
        r.atomic_eth = h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
            va: if c.mode & 0x40 != 0 { va & !7 } else { va },
            rkey,
            swap_add: c.val,
            compare: c.val.rotate_left(32),
        });
        r.imm_dt = h.contains(Headers::IMM_DT).then_some(c.imm);
        r.ieth = h.contains(Headers::IETH).then_some(c.imm);
        r.aeth = h.contains(Headers::AETH).then_some(AethRepr {
            syndrome: Syndrome::from_byte(c.syn),
            msn: c.msn & 0xFF_FFFF,
        });
        r.atomic_ack_eth = h
            .contains(Headers::ATOMIC_ACK_ETH)
            .then_some(AtomicAckEthRepr { orig: c.val });
        r.sack = h.contains(Headers::SACK_ETH).then(|| sack_of(psn, c.val));
        emit(&r)
    }

    /// Hands `bytes` to end `to` if they parse (no ICRC check: the engine does that).
    fn deliver(&mut self, to: usize, bytes: &[u8]) {
        let Ok(repr) = PacketRepr::parse_bytes(bytes) else {
            self.stats.unparsable += 1;
            return;
        };
        let encap = self.encap[to];
        let (now, s) = self.ctx_parts(to);
        let mut ctx = Ctx {
            now,
            mrs: &mut s.mrs,
            mem: &mut s.mem,
            srq: s.srq.as_mut(),
        };
        s.qp.handle_packet(&mut ctx, &repr, &RecvMeta { encap });
        self.stats.delivered += 1;
    }

    /// The next packet of end `from`, checked, logged; `None` when it has none.
    fn transmit_one(&mut self, from: usize) -> Option<Vec<u8>> {
        let now = self.now;
        let ty = self.ty;
        // Garbage in the buffer: whatever the QP does not write must not matter.
        self.buf.fill(0xA5);
        let s = &mut self.sides[from];
        let wants = s.qp.wants_transmit();
        let mut ctx = Ctx {
            now,
            mrs: &mut s.mrs,
            mem: &mut s.mem,
            srq: s.srq.as_mut(),
        };
        let t = s.qp.poll_transmit(&mut ctx, &mut self.buf)?;
        let state = s.qp.state();
        assert!(
            wants,
            "end {from}: poll_transmit gave a packet although wants_transmit() was false"
        );
        assert!(
            t.len <= MAX_PACKET_LEN,
            "end {from}: a {}-byte packet exceeds MAX_PACKET_LEN",
            t.len
        );
        let bytes = self.buf[..t.len].to_vec();
        let repr = match PacketRepr::parse_bytes(&bytes) {
            Ok(r) => r,
            Err(e) => panic!(
                "end {from} ({ty}, {state}) transmitted a packet that does not parse: {e}\n{bytes:02x?}"
            ),
        };
        assert_eq!(
            repr.bth.opcode.transport(),
            transport_of(ty),
            "end {from}: {ty} QP sent {}",
            repr.bth.opcode
        );
        if repr.bth.opcode.is_request() {
            let n = match (repr.bth.opcode.kind(), repr.reth) {
                (Kind::ReadRequest, Some(reth)) => {
                    let pmtu = s.qp.attr().path_mtu.bytes();
                    reth.dma_len.div_ceil(pmtu).max(1)
                }
                _ => 1,
            };
            let next = repr.bth.psn.add(n);
            if next.after(s.next_req_psn) {
                s.next_req_psn = next;
            }
        }
        self.stats.transmitted += 1;
        if self.log.len() >= LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back((from, bytes.clone()));
        Some(bytes)
    }

    fn route(&mut self, from: usize, bytes: Vec<u8>, fate: Fate, a: u32, b: u32) {
        let to = 1 - from;
        match fate {
            Fate::Deliver => self.deliver(to, &bytes),
            Fate::Drop => {}
            Fate::Duplicate => {
                self.deliver(to, &bytes);
                self.deliver(to, &bytes);
            }
            Fate::Hold => {
                self.held.push_back((to, bytes));
                let late = if self.held.len() > HELD_MAX {
                    self.held.pop_front()
                } else {
                    None
                };
                if let Some((to, late)) = late {
                    self.deliver(to, &late);
                }
            }
            Fate::Reflect => {
                self.deliver(to, &bytes);
                self.deliver(from, &bytes);
            }
            Fate::Mutate => match mutate(&bytes, (a % 10) as u8, a / 10, b) {
                Some(m) => self.deliver(to, &m),
                None => self.stats.unparsable += 1,
            },
        }
    }

    fn transmit_some(&mut self, t: &Transmit) {
        let from = usize::from(t.from & 1);
        let n = (usize::from(t.count % 16) + 1).min(self.budget);
        for i in 0..n {
            let Some(bytes) = self.transmit_one(from) else {
                break;
            };
            self.budget -= 1;
            self.route(
                from,
                bytes,
                Fate::from_byte(t.fate),
                t.a.wrapping_add(i as u32),
                t.b,
            );
        }
    }

    fn pump(&mut self, seed: u32, loss: u8) {
        let mut rng = u64::from(seed) << 1 | 1;
        let mut left = MAX_PKTS_PER_STEP.min(self.budget);
        loop {
            let mut moved = false;
            for from in 0..2 {
                while left > 0 {
                    let Some(bytes) = self.transmit_one(from) else {
                        break;
                    };
                    left -= 1;
                    self.budget -= 1;
                    moved = true;
                    let x = xorshift(&mut rng);
                    let fate = if (x & 0xFF) < u64::from(loss) {
                        Fate::from_byte(3 + ((x >> 8) % 5) as u8)
                    } else {
                        Fate::Deliver
                    };
                    self.route(from, bytes, fate, (x >> 16) as u32, (x >> 40) as u32);
                }
            }
            if !moved || left == 0 {
                return;
            }
        }
    }

    fn replay(&mut self, r: &Replay) {
        if self.log.is_empty() {
            return;
        }
        let i = self.log.len() - 1 - usize::from(r.idx) % self.log.len();
        let (from, bytes) = self.log[i].clone();
        let to = if r.to & 1 == 0 { 1 - from } else { from };
        match mutate(&bytes, r.kind, r.a, r.b) {
            Some(m) => self.deliver(to, &m),
            None => self.stats.unparsable += 1,
        }
    }

    fn run_timers(&mut self) {
        let now = self.now;
        for e in 0..2 {
            let s = &mut self.sides[e];
            let mut ctx = Ctx {
                now,
                mrs: &mut s.mrs,
                mem: &mut s.mem,
                srq: s.srq.as_mut(),
            };
            s.qp.handle_timeout(&mut ctx);
            if let Some(t) = s.qp.poll_timeout() {
                assert!(
                    t > now,
                    "end {e}: after handle_timeout at {now:?} the next deadline is {t:?}, not in the future"
                );
            }
        }
        self.stats.timers += 1;
    }

    fn next_deadline(&self) -> Option<Duration> {
        self.sides.iter().filter_map(|s| s.qp.poll_timeout()).min()
    }

    fn fire_next_timer(&mut self) -> bool {
        let Some(t) = self.next_deadline() else {
            return false;
        };
        self.now = self.now.max(t);
        self.run_timers();
        true
    }

    fn timer(&mut self, t: &Timer) {
        match t.kind % 4 {
            0 => {
                self.fire_next_timer();
            }
            1 => {
                self.now += Duration::from_micros(u64::from(t.delta));
                self.run_timers();
            }
            2 => self.run_timers(),
            _ => {
                if let Some(d) = self.next_deadline() {
                    self.now = self.now.max(d.saturating_sub(Duration::from_nanos(1)));
                }
                self.run_timers();
            }
        }
    }

    /// Polls up to `max` completions of end `e` (`which % 3`: both CQs, send, receive) and
    /// checks each against the work requests posted.
    fn poll(&mut self, e: usize, max: usize, which: u8) {
        let s = &mut self.sides[e];
        let mut n = 0;
        while n < max {
            let got = match which % 3 {
                0 => s.qp.poll_completion(),
                1 => s.qp.poll_send_completion().map(|w| (CqSide::Send, w)),
                _ => s.qp.poll_recv_completion().map(|w| (CqSide::Recv, w)),
            };
            let Some((cq, wc)) = got else { break };
            n += 1;
            check_completion(e, s, cq, &wc);
            match (cq, wc.status.is_success()) {
                (CqSide::Send, true) => self.stats.send_ok += 1,
                (CqSide::Send, false) => self.stats.send_err += 1,
                (CqSide::Recv, true) => self.stats.recv_ok += 1,
                (CqSide::Recv, false) => self.stats.recv_err += 1,
            }
        }
    }

    /// Moves every packet over a lossless wire with the clock stopped: the pair must fall
    /// silent. The bound is far above anything the run's posts and deliveries can cause, so
    /// reaching it means a livelock.
    fn finish(&mut self) {
        let cap = 200_000
            + 1_000
                * (self.stats.delivered + self.stats.posted_sends + self.stats.posted_recvs + 1);
        let mut moved = 0usize;
        loop {
            let mut any = false;
            for from in 0..2 {
                while let Some(bytes) = self.transmit_one(from) {
                    moved += 1;
                    any = true;
                    assert!(
                        moved <= cap,
                        "livelock: the pair still sends after {moved} packets over a lossless \
                         wire with the clock stopped (last from end {from}: {})",
                        PacketRepr::parse_bytes(&bytes).map_or(String::new(), |r| r.to_string())
                    );
                    self.deliver(1 - from, &bytes);
                }
            }
            if !any {
                break;
            }
        }
        self.stats.drained = moved;
        for e in 0..2 {
            self.poll(e, usize::MAX, 0);
        }
    }
}

impl Side {
    /// RESET discards every queued WR (and completion) without completing it.
    fn forget_discarded(&mut self) {
        self.sends.clear();
        if self.srq.is_none() {
            self.recvs.clear();
        }
    }
}

fn check_completion(e: usize, s: &mut Side, cq: CqSide, wc: &Wc) {
    assert_eq!(
        wc.qp_num,
        s.qp.qpn(),
        "end {e}: completion names another QP: {wc:?}"
    );
    let outstanding = match cq {
        CqSide::Send => &mut s.sends,
        CqSide::Recv => &mut s.recvs,
    };
    assert!(
        outstanding.remove(&wc.wr_id),
        "end {e}: {cq:?} completion for a work request that was not posted to that queue, \
         was already completed, or was discarded by RESET: {wc:?}"
    );
}

fn transport_of(ty: QpType) -> Transport {
    match ty {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
    }
}

fn emit(r: &PacketRepr<'_>) -> Option<Vec<u8>> {
    let mut out = vec![0u8; r.buffer_len()];
    let n = r.emit(&mut out).ok()?;
    out.truncate(n);
    Some(out)
}

fn flip(v: &mut [u8], bit: u32) {
    if !v.is_empty() {
        let bit = bit as usize % (v.len() * 8);
        v[bit / 8] ^= 1 << (bit % 8);
    }
}

/// A mutated copy of packet `bytes`, or `None` if the result does not parse or emit.
/// `kind % 10`: 0 unchanged; 1 one bit flipped anywhere; 2 three bits flipped; 3 PSN moved by
/// -128..=128 (or set to `a` if `b` is odd); 4 destination QPN set to `a` (or, `b` odd, to
/// one of the pair's); 5 opcode changed to `Opcode::ALL[a]`, headers adapted; 6 one header
/// field rewritten (`b % 12` says which); 7 payload cut to `a` bytes (or, `b` odd, extended);
/// 8 byte `a` set to `b`; 9 PSN and opcode both.
pub fn mutate(bytes: &[u8], kind: u8, a: u32, b: u32) -> Option<Vec<u8>> {
    let kind = kind % 10;
    if matches!(kind, 1 | 2 | 8) {
        let mut v = bytes.to_vec();
        match kind {
            1 => flip(&mut v, a),
            2 => {
                flip(&mut v, a);
                flip(&mut v, b);
                flip(&mut v, a.rotate_left(13) ^ b);
            }
            _ => {
                if !v.is_empty() {
                    let i = a as usize % v.len();
                    v[i] = b as u8;
                }
            }
        }
        return PacketRepr::parse_bytes(&v).is_ok().then_some(v);
    }
    let orig = PacketRepr::parse_bytes(bytes).ok()?;
    let mut payload = orig.payload.to_vec();
    let mut r = orig;
    match kind {
        0 => {}
        3 => r.bth.psn = shift_psn(r.bth.psn, a, b),
        4 => r.bth.dest_qpn = Qpn::new(if b & 1 == 0 { a } else { QPN[(a & 1) as usize] }),
        5 => change_opcode(&mut r, &mut payload, a, b),
        6 => tweak_header(&mut r, a, b),
        7 => {
            if b & 1 == 0 {
                payload.truncate(a as usize % (payload.len() + 1));
            } else {
                payload.extend(pattern(a as usize % 512, b));
            }
        }
        _ => {
            r.bth.psn = shift_psn(r.bth.psn, a, b);
            change_opcode(&mut r, &mut payload, a, b);
        }
    }
    r.payload = &payload;
    emit(&r)
}

fn change_opcode(r: &mut PacketRepr<'_>, payload: &mut Vec<u8>, a: u32, b: u32) {
    let op = Opcode::ALL[a as usize % Opcode::ALL.len()];
    let h = op.headers();
    let wide = u64::from(b) << 3;
    r.bth.opcode = op;
    r.deth = h.contains(Headers::DETH).then(|| {
        r.deth.unwrap_or(DethRepr {
            qkey: b,
            src_qpn: Qpn::new(b >> 8),
        })
    });
    r.feth = h.contains(Headers::FETH).then(|| {
        r.feth.unwrap_or(FethRepr {
            placement_type: (b & 0xF) as u8,
            selectivity: ((b >> 4) & 3) as u8,
        })
    });
    r.reth = h.contains(Headers::RETH).then(|| {
        r.reth.unwrap_or(RethRepr {
            va: wide,
            rkey: b,
            dma_len: b >> 16,
        })
    });
    r.atomic_eth = h.contains(Headers::ATOMIC_ETH).then(|| {
        r.atomic_eth.unwrap_or(AtomicEthRepr {
            va: wide,
            rkey: b,
            swap_add: u64::from(b),
            compare: 0,
        })
    });
    r.imm_dt = h.contains(Headers::IMM_DT).then(|| r.imm_dt.unwrap_or(b));
    r.ieth = h.contains(Headers::IETH).then(|| r.ieth.unwrap_or(b));
    r.aeth = h.contains(Headers::AETH).then(|| {
        r.aeth.unwrap_or(AethRepr {
            syndrome: Syndrome::ACK,
            msn: b & 0xFF_FFFF,
        })
    });
    r.atomic_ack_eth = h.contains(Headers::ATOMIC_ACK_ETH).then(|| {
        r.atomic_ack_eth
            .unwrap_or(AtomicAckEthRepr { orig: u64::from(b) })
    });
    r.sack = h.contains(Headers::SACK_ETH).then(|| {
        r.sack
            .unwrap_or(sack_of(r.bth.psn, u64::from(a) << 32 | u64::from(b)))
    });
    match op.payload_rule() {
        PayloadRule::None => payload.clear(),
        PayloadRule::Exactly8 => payload.resize(8, 0),
        _ => {}
    }
}

/// A SACK ETH of blocks around `psn`, shaped by the bits of `v`: near (within a window),
/// far, inverted, empty, across the 2^24 wrap.
fn sack_of(psn: Psn, v: u64) -> srdma_wire::SackRepr {
    let mut r = srdma_wire::SackRepr::default();
    for (i, blk) in r.blocks.iter_mut().enumerate() {
        let bits = (v >> (16 * i)) as u32;
        let start = match bits & 3 {
            0 => psn.add(1 + (bits >> 2) % 64),
            1 => psn.add(bits >> 2),
            2 => psn.sub((bits >> 2) % 64),
            _ => Psn::new(bits),
        };
        let len = (bits >> 8) % 32;
        *blk = (start, start.add(len));
    }
    r
}

fn tweak_header(r: &mut PacketRepr<'_>, a: u32, b: u32) {
    match b % 12 {
        0 => {
            if let Some(x) = &mut r.aeth {
                x.syndrome = Syndrome::from_byte(a as u8);
            }
        }
        1 => {
            if let Some(x) = &mut r.aeth {
                x.msn = a & 0xFF_FFFF;
            }
        }
        2 => {
            if let Some(x) = &mut r.reth {
                x.va ^= u64::from(a);
            }
        }
        3 => {
            if let Some(x) = &mut r.reth {
                x.dma_len = a;
            }
        }
        4 => {
            if let Some(x) = &mut r.reth {
                x.rkey = a;
            }
        }
        5 => {
            if let Some(x) = &mut r.atomic_eth {
                x.va ^= u64::from(a);
            }
        }
        6 => {
            if let Some(x) = &mut r.atomic_eth {
                x.rkey = a;
            }
        }
        7 => {
            if let Some(x) = &mut r.deth {
                x.qkey = a;
                x.src_qpn = Qpn::new(b);
            }
        }
        8 => {
            r.imm_dt = r.imm_dt.map(|_| a);
            r.ieth = r.ieth.map(|_| a);
        }
        9 => {
            r.bth.solicited = a & 1 != 0;
            r.bth.mig_req = a & 2 != 0;
            r.bth.ack_req = a & 4 != 0;
            r.bth.fecn = a & 8 != 0;
            r.bth.becn = a & 16 != 0;
        }
        10 => r.bth.pkey = a as u16,
        _ => {
            if let Some(x) = &mut r.atomic_ack_eth {
                x.orig = u64::from(a);
            }
        }
    }
}
