//! `srdma demo`: the main job until srdma-relay lands. Two parts:
//!
//! 1. Decodes the captures of real Linux rxe traffic built into the binary and checks every
//!    packet: each must parse and carry a correct ICRC, except the four deliberately broken
//!    probes of `host_rc_pingpong`.
//! 2. Live: three srdma devices on this host (127.0.20.1-3, UDP 4791) run the relay scenario
//!    in miniature — A writes chunks into B's registered ring by RDMA WRITE with immediate,
//!    B's completion notifies it, B checks each chunk's CRC in place and forwards it by SEND
//!    from the same buffer to C, C checks it; credits flow back to A.

use std::io::Write;

use crate::decode::{self, Options, Summary};

/// The A -> B -> C forwarding chain, shared with `cargo run -p srdma --example forward_chain`.
#[path = "../../srdma/examples/forward_chain.rs"]
#[allow(dead_code)]
mod forward_chain;

/// A capture built into the binary, with what decoding it must find.
struct Capture {
    name: &'static str,
    data: &'static [u8],
    bad_icrc: usize,
    malformed: usize,
}

macro_rules! capture {
    ($name:literal, $bad:expr, $malformed:expr) => {
        Capture {
            name: $name,
            data: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../testdata/pcaps/",
                $name
            )),
            bad_icrc: $bad,
            malformed: $malformed,
        }
    };
}

const CAPTURES: &[Capture] = &[
    capture!("rc_send_pingpong.pcap", 0, 0),
    capture!("rc_rdma_write.pcap", 0, 0),
    capture!("rc_rdma_read.pcap", 0, 0),
    capture!("rc_atomic_cmp_swap.pcap", 0, 0),
    capture!("rc_atomic_fetch_add.pcap", 0, 0),
    capture!("rc_send_lat.pcap", 0, 0),
    capture!("ud_send_pingpong.pcap", 0, 0),
    capture!("rdma_cm_rping.pcap", 0, 0),
    capture!("host_rc_server.pcap", 0, 0),
    capture!("host_rc_no_ack.pcap", 0, 0),
    // Probes sent to rxe: ICRC with a flipped bit, without the 8 x 0xFF LRH stand-in, for the
    // wrong IP ID; and a BTH with TVer 1.
    capture!("host_rc_pingpong.pcap", 3, 1),
];

/// Runs the demo; `Ok(true)` when every expectation held.
pub fn run(verbose: bool, live: bool, out: &mut dyn Write) -> anyhow::Result<bool> {
    writeln!(
        out,
        "srdma demo: decoding {} captures of Linux SoftRoCE (rxe) traffic built into this binary",
        CAPTURES.len()
    )?;
    let opts = Options {
        verbose,
        per_packet: verbose,
        port: srdma_wire::ROCEV2_PORT,
    };
    let mut total = Summary::default();
    let mut all_good = true;
    for c in CAPTURES {
        let s = decode::decode(c.data, opts, out)?;
        let as_expected =
            s.icrc_bad == c.bad_icrc && s.malformed == c.malformed && s.unverifiable == 0;
        all_good &= as_expected;
        let verdict = match (as_expected, c.bad_icrc + c.malformed) {
            (false, _) => "UNEXPECTED",
            (true, 0) => "all verified",
            (true, _) => "probes caught",
        };
        writeln!(out, "  {} [{verdict}]", decode::summary_line(c.name, &s))?;
        total.roce += s.roce;
        total.icrc_ok += s.icrc_ok;
        total.icrc_bad += s.icrc_bad;
        total.malformed += s.malformed;
    }
    writeln!(
        out,
        "{} RoCEv2 packets: {} parsed and re-verified their ICRC; {} deliberately broken packets caught ({} bad ICRC, {} bad BTH version)",
        total.roce,
        total.icrc_ok,
        total.icrc_bad + total.malformed,
        total.icrc_bad,
        total.malformed
    )?;
    if live {
        writeln!(
            out,
            "live: A -> B -> C over UDP on this host (RDMA WRITE with immediate into B, CRC check in place, SEND to C)"
        )?;
        out.flush()?;
        match forward_chain::run() {
            Ok(s) => writeln!(
                out,
                "live: {} chunks ({} bytes) arrived intact at C in {:.1?}; A waited for credit {} times",
                s.delivered, s.bytes, s.elapsed, s.credit_stalls
            )?,
            Err(e) => {
                writeln!(out, "live: FAILED: {e}")?;
                all_good = false;
            }
        }
    }
    writeln!(
        out,
        "{}",
        if all_good {
            "demo: OK"
        } else {
            "demo: FAILED (see above)"
        }
    )?;
    Ok(all_good)
}
