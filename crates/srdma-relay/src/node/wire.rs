//! What travels between two nodes besides the chunks: the work request ids a node tells its
//! completions apart by, the immediate that carries a chunk's sequence number, and the ring
//! descriptor a node announces in its CM private data.

// wr_id kinds, in the top byte.
/// A receive posted for a chunk from the parent (the slot index in the low bits).
pub(super) const K_DATA_RECV: u64 = 1 << 56;
/// A receive posted for a child's credit (the child's index in the low bits).
pub(super) const K_CREDIT_RECV: u64 = 2 << 56;
/// A chunk forwarded to a child (child index in bits 40.., the sequence number's low 40 bits).
pub(super) const K_FORWARD: u64 = 3 << 56;
/// A credit returned to the parent (the sequence number's low 40 bits).
pub(super) const K_CREDIT_SEND: u64 = 4 << 56;
/// The binomial pipeline: a receive posted for a partner's chunk or credit.
pub(super) const K_PEER_RECV: u64 = 5 << 56;
/// The binomial pipeline: a chunk sent to a partner.
pub(super) const K_MESH_SEND: u64 = 6 << 56;
/// The binomial pipeline: a credit (the release count) sent to a partner.
pub(super) const K_MESH_CREDIT: u64 = 7 << 56;
/// The kind of a wr_id.
pub(super) const KIND_MASK: u64 = 0xFF << 56;
/// The sequence number (or index) of a wr_id.
pub(super) const SEQ_MASK: u64 = (1 << 40) - 1;

/// Magic of the ring descriptor a child sends as the CM REP's private data.
const RING_MAGIC: &[u8; 4] = b"SRR1";

/// The immediate that carries chunk `seq`: its low 32 bits.
pub(super) fn imm_of(seq: u64) -> u32 {
    (seq & 0xFFFF_FFFF) as u32
}

/// A node's ring, as its CM private data announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RingDesc {
    pub(super) addr: u64,
    pub(super) rkey: u32,
    pub(super) len: u64,
    pub(super) slots: u32,
    pub(super) slot_size: u32,
}

impl RingDesc {
    /// The descriptor as private data: `"SRR1"`, address, R_Key, length, slots, slot size
    /// (big endian).
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut d = RING_MAGIC.to_vec();
        d.extend(self.addr.to_be_bytes());
        d.extend(self.rkey.to_be_bytes());
        d.extend(self.len.to_be_bytes());
        d.extend(self.slots.to_be_bytes());
        d.extend(self.slot_size.to_be_bytes());
        d
    }

    /// The descriptor at the start of `d`, if it is one.
    pub(super) fn decode(d: &[u8]) -> Option<RingDesc> {
        if d.len() < 32 || &d[..4] != RING_MAGIC {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(d[i..i + 8].try_into().unwrap_or_default());
        let u32_at = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap_or_default());
        Some(RingDesc {
            addr: u64_at(4),
            rkey: u32_at(12),
            len: u64_at(16),
            slots: u32_at(24),
            slot_size: u32_at(28),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_descriptor_round_trips() {
        let r = RingDesc {
            addr: 0x7f00_1234_5000,
            rkey: 0xdead_beef,
            len: 8 << 20,
            slots: 8,
            slot_size: (1 << 20) + 64,
        };
        assert_eq!(RingDesc::decode(&r.encode()), Some(r));
        assert_eq!(RingDesc::decode(&r.encode()[..31]), None);
        assert_eq!(RingDesc::decode(b"XXXX0000000000000000000000000000"), None);
    }
}
