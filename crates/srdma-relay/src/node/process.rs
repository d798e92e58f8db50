//! What a relay or sink does with a chunk in its slot, in the tree and the binomial pipeline
//! alike: under the device lock, check it and run the stages in place ([`stage_in_place`]),
//! then hand it to the sink's side; outside the lock, what the sink asked for (begin, commit,
//! save its bitmap); and count what passed.

use std::sync::atomic::Ordering;

use srdma::Mr;

use crate::chunk::{HEADER_LEN, flags};

use super::fail::{Fail, R};
use super::run::NodeRun;
use super::sink_side::{After, Arrival};
use super::stages::stage_in_place;

/// A processed chunk under the lock: bytes to forward, object bytes, (flags, object length),
/// what the sink asks afterwards, bytes copied.
type Processed = (usize, u64, (u16, u64), After, u64);

impl NodeRun<'_> {
    /// A relay or sink: checks and processes chunk `seq` (`byte_len` bytes arrived) in slot
    /// `s` in place, hands it to the sink. Returns (bytes to forward, object bytes it
    /// carries, end of transfer).
    pub(super) fn process(
        &mut self,
        buf: &Mr,
        s: usize,
        seq: u64,
        byte_len: usize,
    ) -> R<(usize, u64, bool)> {
        let me = self.name();
        let parent = self.parent_name();
        let base = s * self.hop.slot_size;
        let slot_size = self.hop.slot_size;
        let flip = self.hop.me.flip_bit_at_seq == Some(seq);
        // Processed before a heal rewound the transfer: forwarded again, not written again.
        let dup = seq < self.healing.dup_below;
        let corrupt = |what: String| {
            Fail::at(
                me,
                format!("chunk {seq} corrupt, caught at {me} (received from {parent}): {what}"),
            )
        };
        // The sink checks every chunk, unless a `verify` stage just did (and the flip knob did
        // not strike since).
        let verified = self.stages.last().is_some_and(|st| st.name() == "verify");
        let arrival = Arrival {
            seq,
            first_of_run: seq == self.start_seq,
            check: !verified || flip,
            me,
            corrupt: &corrupt,
        };
        let (stages, sink) = (&mut self.stages, &mut self.sink);
        let r: R<Processed> = buf.with_bytes_mut(|b| {
            let slot = &mut b[base..base + slot_size];
            let (hb, pb) = slot.split_at_mut(HEADER_LEN);
            let h = stage_in_place(hb, pb, (seq, byte_len), stages, flip, me, &corrupt)?;
            let plen = h.payload_len as usize;
            let data = if h.is_data() { u64::from(h.raw_len) } else { 0 };
            let (after, copied) = match sink.as_mut() {
                Some(sk) if !dup => sk.take(&h, pb, &arrival)?,
                _ => (After::Nothing, 0),
            };
            Ok((
                HEADER_LEN + plen,
                data,
                (h.flags, h.object_len),
                after,
                copied,
            ))
        });
        let (len, data, (chunk_flags, object_len), after, copied) = r?;
        let eot = chunk_flags & flags::END_OF_TRANSFER != 0;
        if dup {
            if let Some(sk) = self.sink.as_mut() {
                sk.heal_again += data;
            }
            return Ok((len, data, eot));
        }
        self.stats.own_copies += copied;
        if let Some(sk) = self.sink.as_mut() {
            sk.apply(after, seq, &self.hop, &self.stats)?;
            self.stats.objects = sk.committed;
        } else {
            // Relays count objects as their ends pass, and learn the size from their starts.
            if chunk_flags & flags::OBJECT_END != 0 {
                self.stats.objects += 1;
            }
            if chunk_flags & flags::OBJECT_START != 0 && object_len != u64::MAX {
                self.stats
                    .live
                    .total
                    .fetch_add(object_len, Ordering::Relaxed);
            }
        }
        Ok((len, data, eot))
    }
}
