//! `DeviceConfig::pcap` (default `$SRDMA_PCAP`): every packet a device sends and receives is
//! written to a pcap that `srdma decode` and tshark read, with the IP/UDP headers the ICRC
//! covers, so every captured ICRC verifies — also for packets that went through shared memory
//! (the default between devices of one host; `SRDMA_SHM=0` runs it over UDP).

use srdma::{
    AccessFlags, ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RKey, SendOp, SendWr,
    SgeList, WcStatus,
};
use srdma_wire::frame::{self, IcrcStatus};
use srdma_wire::{Opcode, PacketRepr, Psn, pcap};

mod common;
use common::remote;

/// A 3000-byte WRITE at MTU 1024 between two devices, both capturing: A's file holds the three
/// WRITE packets it sent and the ACK it received, B's the same four from the other side; every
/// packet parses and its ICRC verifies against the recorded headers.
#[test]
fn devices_capture_what_they_send_and_receive() {
    let dir = std::env::temp_dir().join(format!("srdma-capture-{}", std::process::id()));
    write_captured(&dir, ["127.0.30.1", "127.0.30.2"], ["a.pcap", "b.pcap"]);
    check_captures(&dir, ["a.pcap", "b.pcap"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two devices of one process given the same capture file (as `DeviceConfig::new` gives
/// every device `$SRDMA_PCAP`): the second writes `NAME-2.EXT` instead of truncating the
/// first's file, and both captures are whole.
#[test]
fn a_second_device_on_the_same_capture_file_writes_its_own() {
    let dir = std::env::temp_dir().join(format!("srdma-capture-same-{}", std::process::id()));
    write_captured(
        &dir,
        ["127.0.32.1", "127.0.32.2"],
        ["same.pcap", "same.pcap"],
    );
    check_captures(&dir, ["same.pcap", "same-2.pcap"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The WRITE of [`devices_capture_what_they_send_and_receive`] from a device on `ips[0]` to
/// one on `ips[1]`, capturing to `names` in `dir`; returns once both devices are closed.
fn write_captured(dir: &std::path::Path, ips: [&str; 2], names: [&str; 2]) {
    std::fs::create_dir_all(dir).unwrap();
    let open = |ip: &str, name: &str| {
        let mut c = DeviceConfig::new(ip.parse().unwrap());
        c.pcap = Some(dir.join(name));
        Device::open(c).unwrap()
    };
    let (a, b) = (open(ips[0], names[0]), open(ips[1], names[1]));
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    qa.connect(
        &remote(&b, qb.qpn(), 7),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(5)),
    )
    .unwrap();
    qb.connect(
        &remote(&a, qa.qpn(), 5),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(7)),
    )
    .unwrap();
    let src = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pb
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let r = dst.remote().unwrap();
    qa.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: r.addr,
            rkey: RKey(r.rkey),
        },
        SgeList::one(src.sge(0, 3000)),
    ))
    .unwrap();
    let t = std::time::Instant::now();
    let wc = loop {
        if let Some(wc) = ca.poll_one() {
            break wc;
        }
        assert!(t.elapsed().as_secs() < 10, "no completion");
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert_eq!(wc.status, WcStatus::Success);
    // Same host: shared memory unless SRDMA_SHM=0; captured the same either way (the
    // receiver of a ring's packet records the ICRC the packet would carry over UDP).
    let shm = a.counters().tx_shm_packets;
    assert_eq!(shm > 0, a.config().shm, "{:?}", a.counters());
    drop((qa, qb, src, dst, ca, cb, pa, pb, a, b)); // closes and flushes the captures
}

/// Each of `names` in `dir` is a capture of the WRITE of [`write_captured`]: its three
/// packets and the ACK (and that ACK once more as B's QP goes), every ICRC verifying.
fn check_captures(dir: &std::path::Path, names: [&str; 2]) {
    for (i, name) in names.into_iter().enumerate() {
        let data = std::fs::read(dir.join(name)).unwrap();
        let reader = pcap::Reader::new(&data).unwrap();
        let lt = reader.linktype();
        let mut ops = Vec::new();
        for rec in reader {
            let rec = rec.unwrap();
            let f = frame::roce_in_frame(lt, rec.data)
                .unwrap()
                .expect("only RoCEv2 in a device capture");
            assert_eq!(f.icrc_status(), IcrcStatus::Ok, "{name}");
            ops.push(PacketRepr::parse_bytes(f.roce).unwrap().bth.opcode);
        }
        // B's QP, destroyed, sends its last ACK once more (`Qp::ack_once_more`); A's
        // device may close before it receives it.
        if i == 1 || ops.len() == 5 {
            assert_eq!(ops.pop(), Some(Opcode::RcAcknowledge), "{name}: {ops:?}");
        }
        assert_eq!(
            ops,
            [
                Opcode::RcRdmaWriteFirst,
                Opcode::RcRdmaWriteMiddle,
                Opcode::RcRdmaWriteLast,
                Opcode::RcAcknowledge
            ],
            "{name}"
        );
    }
}

/// In a SEND ping-pong whose application polls its CQ between replenishing its receive and
/// posting its reply (as perftest and `srdma perf` do), the ACK of the peer's message does
/// not leave ahead of the reply: once the device has learned the pattern it waits through
/// those polls and goes right behind the reply. Both captures are read for what each side
/// sent; after a warm-up, most replies must be followed (not preceded) by their ACK. (The
/// learning gives up after a slow turn, which a loaded machine may cause now and then,
/// hence "most".)
#[test]
fn in_a_send_ping_pong_the_ack_leaves_behind_the_reply() {
    const ROUNDS: usize = 300;
    let dir = std::env::temp_dir().join(format!("srdma-ack-order-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = |ip: &str, name: &str| {
        let mut c = DeviceConfig::new(ip.parse().unwrap());
        c.pcap = Some(dir.join(name));
        c.share_port = false;
        Device::open(c).unwrap()
    };
    let (a, b) = (open("127.0.31.1", "a.pcap"), open("127.0.31.2", "b.pcap"));
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (
        a.create_cq(64, None).unwrap(),
        b.create_cq(64, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let params = |psn| ConnectParams::new(Mtu::Mtu1024, Psn::new(psn));
    qa.connect(&remote(&b, qb.qpn(), 7), &params(5)).unwrap();
    qb.connect(&remote(&a, qa.qpn(), 5), &params(7)).unwrap();
    let ma = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // One side's loop: wait for a receive, replenish, poll once more, answer (the client
    // starts with a send).
    let run = |qp: &srdma::Qp, cq: &srdma::Cq, mr: &srdma::Mr, client: bool| {
        let recv = || srdma::RecvWr {
            wr_id: 0,
            sges: SgeList::one(mr.sge(0, 64)),
        };
        let send = || SendWr::new(1, SendOp::Send, SgeList::one(mr.sge(64, 8)));
        qp.post_recv(recv()).unwrap();
        let mut wcs = Vec::new();
        if client {
            qp.post_send(send()).unwrap();
        }
        for i in 0..ROUNDS {
            let t = std::time::Instant::now();
            loop {
                wcs.clear();
                cq.poll_into(&mut wcs, 8);
                for wc in &wcs {
                    assert_eq!(wc.status, WcStatus::Success);
                }
                if wcs.iter().any(|w| w.opcode == srdma::WcOpcode::Recv) {
                    break;
                }
                assert!(t.elapsed().as_secs() < 10, "round {i}: no message");
            }
            qp.post_recv(recv()).unwrap();
            wcs.clear();
            cq.poll_into(&mut wcs, 8);
            if client && i + 1 == ROUNDS {
                break;
            }
            qp.post_send(send()).unwrap();
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| run(&qb, &cb, &mb, false));
        run(&qa, &ca, &ma, true);
    });
    drop((qa, qb, ma, mb, ca, cb, pa, pb, a, b)); // closes and flushes the captures
    // Each capture in order, sent and received: (sent by this side, opcode).
    let packets = |name: &str, me: [u8; 4]| -> Vec<(bool, Opcode)> {
        let data = std::fs::read(dir.join(name)).unwrap();
        let reader = pcap::Reader::new(&data).unwrap();
        let lt = reader.linktype();
        reader
            .filter_map(|rec| {
                let rec = rec.unwrap();
                let f = frame::roce_in_frame(lt, rec.data).unwrap()?;
                let p = PacketRepr::parse_bytes(f.roce).unwrap();
                Some((f.ip_header[12..16] == me, p.bth.opcode))
            })
            .collect()
    };
    for (name, me) in [("a.pcap", [127, 0, 31, 1]), ("b.pcap", [127, 0, 31, 2])] {
        let pkts = packets(name, me);
        let sends = pkts
            .iter()
            .filter(|&&(out, o)| out && o == Opcode::RcSendOnly)
            .count();
        assert!(sends >= ROUNDS - 1, "{name}: {sends} SENDs");
        // After the warm-up: what this side sent first after each SEND it received, its
        // reply or the ACK of what it received.
        let (mut reply_first, mut ack_first) = (0, 0);
        let mut answering = false;
        for &(out, op) in &pkts[pkts.len() / 3..] {
            match (out, op) {
                (false, Opcode::RcSendOnly) => answering = true,
                (true, Opcode::RcSendOnly) if answering => {
                    reply_first += 1;
                    answering = false;
                }
                (true, Opcode::RcAcknowledge) if answering => {
                    ack_first += 1;
                    answering = false;
                }
                _ => {}
            }
        }
        assert!(
            reply_first > 2 * ack_first,
            "{name}: the reply left first {reply_first} times, the ACK {ack_first} times"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
