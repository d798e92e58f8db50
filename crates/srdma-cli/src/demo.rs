//! `srdma demo`: the main job until srdma-relay lands. Decodes the captures of real Linux
//! rxe traffic that are built into the binary and checks every packet: each must parse and
//! carry a correct ICRC, except the four deliberately broken probes of `host_rc_pingpong`.

use std::io::Write;

use crate::decode::{self, Options, Summary};

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
pub fn run(verbose: bool, out: &mut dyn Write) -> anyhow::Result<bool> {
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
    writeln!(
        out,
        "{}",
        if all_good {
            "demo: OK"
        } else {
            "demo: FAILED (see UNEXPECTED above)"
        }
    )?;
    Ok(all_good)
}
