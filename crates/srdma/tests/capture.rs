//! `DeviceConfig::pcap` (default `$SRDMA_PCAP`): every packet a device sends and receives is
//! written to a pcap that `srdma decode` and tshark read, with the IP/UDP headers the ICRC
//! covers, so every captured ICRC verifies.

use srdma::{
    AccessFlags, ConnectParams, Device, DeviceConfig, Mtu, QpInit, QpType, RKey, RemoteQp, SendOp,
    SendWr, SgeList, WcStatus,
};
use srdma_wire::frame::{self, IcrcStatus};
use srdma_wire::{Opcode, PacketRepr, Psn, pcap};

/// A 3000-byte WRITE at MTU 1024 between two devices, both capturing: A's file holds the three
/// WRITE packets it sent and the ACK it received, B's the same four from the other side; every
/// packet parses and its ICRC verifies against the recorded headers.
#[test]
fn devices_capture_what_they_send_and_receive() {
    let dir = std::env::temp_dir().join(format!("srdma-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = |ip: &str, name: &str| {
        let mut c = DeviceConfig::new(ip.parse().unwrap());
        c.pcap = Some(dir.join(name));
        Device::open(c).unwrap()
    };
    let (a, b) = (open("127.0.30.1", "a.pcap"), open("127.0.30.2", "b.pcap"));
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let at = |d: &Device, q: &srdma::Qp, psn| RemoteQp {
        qpn: q.qpn(),
        psn: Psn::new(psn),
        gid: d.local_gid(),
        port: d.local_addr().port(),
    };
    qa.connect(
        &at(&b, &qb, 7),
        &ConnectParams::new(Mtu::Mtu1024, Psn::new(5)),
    )
    .unwrap();
    qb.connect(
        &at(&a, &qa, 5),
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
    drop((qa, qb, src, dst, ca, cb, pa, pb, a, b)); // closes and flushes the captures
    for name in ["a.pcap", "b.pcap"] {
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
    std::fs::remove_dir_all(&dir).unwrap();
}
