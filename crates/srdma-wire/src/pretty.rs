//! Human-readable forms: one line per packet (`Display` of [`PacketRepr`]) and every field
//! (`PacketRepr::verbose`).

use core::fmt;

use crate::aeth::{Syndrome, credits, rnr_timer_usec};
use crate::packet::PacketRepr;

impl fmt::Display for PacketRepr<'_> {
    /// `RC_RDMA_WRITE_FIRST qp=0x000011 psn=0x59c9f5 ack=0 reth[va=0x.. rkey=0x.. len=2500] len=1024`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.bth;
        write!(
            f,
            "{} qp={} psn={} ack={}",
            b.opcode,
            b.dest_qpn,
            b.psn,
            u8::from(b.ack_req)
        )?;
        if b.solicited {
            f.write_str(" se")?;
        }
        if b.fecn || b.becn {
            write!(f, " fecn={} becn={}", u8::from(b.fecn), u8::from(b.becn))?;
        }
        if b.pkey != crate::bth::DEFAULT_PKEY {
            write!(f, " pkey={:#06x}", b.pkey)?;
        }
        if let Some(n) = self.xrceth {
            write!(f, " xrceth[srq={n:#08x}]")?;
        }
        if let Some(h) = self.deth {
            write!(f, " deth[qkey={:#010x} src_qp={}]", h.qkey, h.src_qpn)?;
        }
        if let Some(h) = self.feth {
            write!(f, " feth[plt={} sel={}]", h.placement_type, h.selectivity)?;
        }
        if let Some(h) = self.reth {
            write!(
                f,
                " reth[va={:#x} rkey={:#x} len={}]",
                h.va, h.rkey, h.dma_len
            )?;
        }
        if let Some(h) = self.atomic_eth {
            write!(
                f,
                " atomiceth[va={:#x} rkey={:#x} swap_add={:#x} cmp={:#x}]",
                h.va, h.rkey, h.swap_add, h.compare
            )?;
        }
        if let Some(v) = self.imm_dt {
            write!(f, " imm={v:#010x}")?;
        }
        if let Some(v) = self.ieth {
            write!(f, " ieth[rkey={v:#x}]")?;
        }
        if let Some(h) = self.aeth {
            write!(f, " aeth[{} msn={}]", h.syndrome, h.msn)?;
        }
        if let Some(h) = self.atomic_ack_eth {
            write!(f, " atomicacketh[orig={:#x}]", h.orig)?;
        }
        if let Some(h) = self.sack {
            f.write_str(" sack[")?;
            for (i, (s, e)) in h.ranges().enumerate() {
                write!(f, "{}{}..{}", if i > 0 { " " } else { "" }, s, e)?;
            }
            f.write_str("]")?;
        }
        write!(f, " len={}", self.payload.len())
    }
}

/// Every field of a packet, one per line, indented; from [`PacketRepr::verbose`].
#[derive(Debug, Clone, Copy)]
pub struct Verbose<'r, 'a>(&'r PacketRepr<'a>);

impl PacketRepr<'_> {
    /// A `Display` that prints every field, one per line.
    pub fn verbose(&self) -> Verbose<'_, '_> {
        Verbose(self)
    }
}

impl fmt::Display for Verbose<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        let b = &r.bth;
        writeln!(
            f,
            "    BTH: opcode={:#04x} ({}) transport={}",
            b.opcode.value(),
            b.opcode,
            b.opcode.transport().name()
        )?;
        writeln!(
            f,
            "         se={} migreq={} padcnt={} tver=0 pkey={:#06x} fecn={} becn={}",
            u8::from(b.solicited),
            u8::from(b.mig_req),
            r.pad_len(),
            b.pkey,
            u8::from(b.fecn),
            u8::from(b.becn)
        )?;
        writeln!(
            f,
            "         destqp={} ackreq={} psn={} ({})",
            b.dest_qpn,
            u8::from(b.ack_req),
            b.psn,
            b.psn.value()
        )?;
        if let Some(n) = r.xrceth {
            writeln!(f, "    XRCETH: xrcsrq={n:#08x}")?;
        }
        if let Some(h) = r.deth {
            writeln!(f, "    DETH: qkey={:#010x} srcqp={}", h.qkey, h.src_qpn)?;
        }
        if let Some(h) = r.feth {
            writeln!(
                f,
                "    FETH: placement_type={} selectivity={}",
                h.placement_type, h.selectivity
            )?;
        }
        if let Some(h) = r.reth {
            writeln!(
                f,
                "    RETH: va={:#018x} rkey={:#010x} dmalen={}",
                h.va, h.rkey, h.dma_len
            )?;
        }
        if let Some(h) = r.atomic_eth {
            writeln!(
                f,
                "    AtomicETH: va={:#018x} rkey={:#010x} swap_add={:#x} ({}) compare={:#x} ({})",
                h.va, h.rkey, h.swap_add, h.swap_add, h.compare, h.compare
            )?;
        }
        if let Some(v) = r.imm_dt {
            writeln!(f, "    ImmDt: {v:#010x}")?;
        }
        if let Some(v) = r.ieth {
            writeln!(f, "    IETH: rkey={v:#010x}")?;
        }
        if let Some(h) = r.aeth {
            let detail = match h.syndrome {
                Syndrome::Ack { credit_code } => match credits(credit_code) {
                    Some(c) => alloc::format!("ACK, credit code {credit_code} = {c} credits"),
                    None => {
                        alloc::format!("ACK, credit code {credit_code} = no end-to-end credits")
                    }
                },
                Syndrome::RnrNak { timer_code } => {
                    alloc::format!(
                        "RNR NAK, timer code {timer_code} = {} us",
                        rnr_timer_usec(timer_code)
                    )
                }
                Syndrome::Nak(c) => alloc::format!("NAK {} (code {})", c.name(), c.code()),
                Syndrome::Reserved(v) => alloc::format!("reserved syndrome {v:#04x}"),
            };
            writeln!(
                f,
                "    AETH: syndrome={:#04x} ({detail}) msn={}",
                h.syndrome.to_byte(),
                h.msn
            )?;
        }
        if let Some(h) = r.atomic_ack_eth {
            writeln!(f, "    AtomicAckETH: orig={:#018x} ({})", h.orig, h.orig)?;
        }
        if let Some(h) = r.sack {
            f.write_str("    SackETH:")?;
            for (s, e) in h.ranges() {
                write!(f, " {s}..{e}")?;
            }
            writeln!(f)?;
        }
        write!(
            f,
            "    payload: {} bytes, pad {}",
            r.payload.len(),
            r.pad_len()
        )?;
        if !r.payload.is_empty() {
            f.write_str(": ")?;
            for byte in r.payload.iter().take(32) {
                write!(f, "{byte:02x}")?;
            }
            if r.payload.len() > 32 {
                f.write_str("...")?;
            }
        }
        Ok(())
    }
}
