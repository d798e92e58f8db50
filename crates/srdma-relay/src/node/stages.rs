//! A chunk in its slot at a relay or sink: its header checked against what arrived, the
//! node's stages run on it in place, and the test knob that flips a bit after them.

use crate::chunk::{ChunkHeader, HEADER_LEN};
use crate::stage::{Chunk, Stage, StageError};

use super::fail::{Fail, R};

/// Checks the chunk in `hb` (header) and `pb` (payload) — chunk `seq`, `byte_len` bytes
/// arrived — and runs `stages` on it in place, re-framing it; `flip` then flips one bit (see
/// [`flip_bit`]). Returns the header of what now goes on. `corrupt` makes the failure of a
/// damaged chunk; `me` names this node.
pub(super) fn stage_in_place(
    hb: &mut [u8],
    pb: &mut [u8],
    (seq, byte_len): (u64, usize),
    stages: &mut [Box<dyn Stage>],
    flip: bool,
    me: &str,
    corrupt: &dyn Fn(String) -> Fail,
) -> R<ChunkHeader> {
    let mut h = ChunkHeader::decode(hb).map_err(|e| corrupt(e.to_string()))?;
    if h.seq != seq {
        return Err(corrupt(format!("its header says chunk {}", h.seq)));
    }
    if HEADER_LEN + h.payload_len as usize != byte_len {
        return Err(corrupt(format!(
            "{byte_len} bytes arrived, the header announces {}",
            HEADER_LEN + h.payload_len as usize
        )));
    }
    for st in stages.iter_mut() {
        st.process(Chunk {
            header: &mut h,
            buf: &mut *pb,
        })
        .map_err(|e| match e {
            StageError::Corrupt { error, .. } => corrupt(error.to_string()),
            other => Fail::at(me, format!("stage {} at {me}: {other}", st.name())),
        })?;
    }
    h.encode(hb)
        .map_err(|e| Fail::at(me, format!("re-framing chunk {seq}: {e}")))?;
    if flip {
        flip_bit(hb, pb, h.payload_len as usize);
        // Re-read what now goes on: the sink below must see the damage too.
        if h.payload_len == 0 {
            h = ChunkHeader::decode(hb).map_err(|e| corrupt(e.to_string()))?;
        }
    }
    Ok(h)
}

/// Flips one bit of the payload (or, for an empty payload, of the header) in place.
pub(super) fn flip_bit(hb: &mut [u8], pb: &mut [u8], payload_len: usize) {
    if payload_len > 0 {
        pb[payload_len / 2] ^= 0x10;
    } else {
        hb[8] ^= 0x01;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flipping_changes_exactly_one_bit() {
        let mut h = [0u8; HEADER_LEN];
        let mut p = [0u8; 10];
        flip_bit(&mut h, &mut p, 10);
        assert_eq!(p.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
        flip_bit(&mut h, &mut p, 0);
        assert_eq!(h.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
    }
}
