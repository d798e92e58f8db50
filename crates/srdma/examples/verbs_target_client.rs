//! RDMA WRITE and READ by srdma into the memory of a process on kernel rxe
//! (`interop/verbs_target.c`): connects over TCP port 18520, exchanges QP numbers, PSNs,
//! GIDs and the target's buffer address and R_Key, WRITEs 4096 bytes of a pattern into the
//! first half of the target's buffer, READs 8192 bytes of the target's own pattern from its
//! second half and checks them, then tells the target to check what it received.
//!
//! `cargo run -p srdma --example verbs_target_client -- TARGET_IP LOCAL_IP`

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

use srdma::{
    AccessFlags, ConnectParams, Device, DeviceConfig, Gid, Mtu, QpInit, QpType, RKey, RemoteQp,
    SendOp, SendWr, SgeList, WcStatus,
};
use srdma_wire::{Psn, Qpn};

fn main() {
    if let Err(e) = run() {
        eprintln!("verbs_target_client: {e}");
        std::process::exit(1);
    }
}

fn hex_gid(g: &Gid) -> String {
    g.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, local] = &args[..] else {
        return Err("usage: verbs_target_client TARGET_IP LOCAL_IP".into());
    };
    let target: IpAddr = target.parse()?;
    let dev = Device::open(DeviceConfig::new(local.parse()?))?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
    let mr = pd.reg_mr(65536, AccessFlags::LOCAL_WRITE)?;
    mr.with_bytes_mut(|b| {
        b.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i * 7 + 3) as u8)
    });
    let psn = Psn::new(std::process::id() * 7919);

    let mut s = TcpStream::connect((target, 18520))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    writeln!(
        s,
        "{:x} {:x} {}",
        qp.qpn().value(),
        psn.value(),
        hex_gid(&dev.local_gid())
    )?;
    let mut line = String::new();
    BufReader::new(s.try_clone()?).read_line(&mut line)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let [rqpn, rpsn, rgid, addr, rkey] = f[..] else {
        return Err(format!("bad reply {line:?}").into());
    };
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&rgid[2 * i..2 * i + 2], 16)?;
    }
    let (addr, rkey) = (
        u64::from_str_radix(addr, 16)?,
        RKey(u32::from_str_radix(rkey, 16)?),
    );
    let remote = RemoteQp::new(
        Qpn::new(u32::from_str_radix(rqpn, 16)?),
        Psn::new(u32::from_str_radix(rpsn, 16)?),
        Gid(gid),
    );
    qp.connect(&remote, &ConnectParams::new(Mtu::Mtu1024, psn))?;

    let wait = |what: &str| -> Result<(), Box<dyn std::error::Error>> {
        let t = Instant::now();
        loop {
            if let Some(wc) = cq.poll_one() {
                if wc.status != WcStatus::Success {
                    return Err(
                        format!("{what}: {} ({})", wc.status.name(), wc.status.as_u32()).into(),
                    );
                }
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!("{what}: no completion in 20 s").into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    qp.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: addr,
            rkey,
        },
        SgeList::one(mr.sge(0, 4096)),
    ))?;
    wait("RDMA WRITE")?;
    qp.post_send(SendWr::new(
        2,
        SendOp::Read {
            remote_addr: addr + 32768,
            rkey,
        },
        SgeList::one(mr.sge(32768, 8192)),
    ))?;
    wait("RDMA READ")?;
    let bad = mr.with_bytes(|b| {
        (32768..32768 + 8192)
            .filter(|&i| b[i] != (i * 13 + 1) as u8)
            .count()
    });
    writeln!(s, "done 4096")?;
    println!(
        "verbs_target_client: WRITE 4096 B and READ 8192 B done, {bad} wrong bytes in the READ"
    );
    println!("device counters: {:?}", dev.counters());
    if bad != 0 {
        return Err("READ data differs".into());
    }
    Ok(())
}
