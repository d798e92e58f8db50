//! A three-host forwarding chain: A writes into B by RDMA WRITE, B gets a completion and
//! forwards by SEND to C.
//!
//! ```text
//!   A (127.0.20.1)                 B (127.0.20.2)                  C (127.0.20.3)
//!   stage chunk i, CRC32 trailer
//!   WRITE_WITH_IMM(imm = i) ──────▶ ring slot i % SLOTS
//!                                   RECV_RDMA_WITH_IMM: chunk i
//!                                   check the CRC in place
//!                                   SEND_WITH_IMM(imm = i) ───────▶ receive buffer
//!                                   from the same slot, no copy      RECV: chunk i, check it
//!                                   SEND completion: slot free
//!   RECV: credit for chunk i ◀───── SEND_WITH_IMM(imm = i), 0 bytes
//! ```
//!
//! Three devices on 127.0.20.1, .2 and .3, UDP port 4791 each, as three hosts would be. The
//! connections are made with [`srdma::cm`]: B accepts A's connection and answers with its
//! ring's [`srdma::RemoteMr`] descriptor as private data; B connects to C. Both passive sides post
//! their receives on a QP in INIT before accepting, so no message ever meets an empty receive
//! queue.
//!
//! Flow control is by credits: A starts with one credit per ring slot and spends one per
//! chunk. B gives a slot's credit back once C acknowledged the chunk it forwarded from that
//! slot (the SEND's completion), and reposts the receive the WRITE_WITH_IMM consumed. C
//! reposts each receive buffer once it has checked the chunk in it. The chunk number travels
//! as the immediate data of every message, so no side needs a header inside the payload.
//!
//! When every chunk arrived intact at C, A disconnects; B sees the disconnect and disconnects
//! from C in turn.
//!
//! `cargo run -p srdma --example forward_chain` (exits 0 when every chunk arrived intact)

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use srdma::cm::{self, CmEvent, ConnectOptions, Connection, Listener};
use srdma::{
    AccessFlags, Device, DeviceConfig, Mr, QpInit, QpType, RKey, RecvWr, RemoteMr, SendOp, SendWr,
    SgeList, Wc, WcOpcode, WcStatus,
};

/// Chunks A sends.
pub const CHUNKS: u32 = 24;
/// Bytes per chunk, the CRC32 trailer included.
pub const CHUNK_LEN: usize = 4096;
/// Slots in B's ring (and A's staging area, and C's receive buffers): chunks in flight.
pub const SLOTS: u32 = 4;
/// Longest wait for any one step.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an idle side sleeps between polls of its CQ.
const IDLE: Duration = Duration::from_micros(50);
/// How a side that stopped because another failed reports it.
const STOPPED: &str = "stopped: another side failed";
/// `wr_id` bit marking B's credit messages to A (its forwards to C use the chunk number).
const CREDIT: u64 = 1 << 32;

/// Errors of the example: anything with a message, movable between threads.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Chunks that arrived at C with a correct CRC and the expected contents.
    pub delivered: u32,
    /// Payload bytes those chunks carried (trailers included).
    pub bytes: u64,
    /// Times A had a chunk ready but no credit and waited for B.
    pub credit_stalls: u32,
    /// Wall time of the run, from the first connection to the last chunk checked at C.
    pub elapsed: Duration,
}

fn main() {
    match run() {
        Ok(s) => {
            println!(
                "forward_chain: {} of {CHUNKS} chunks ({} bytes) arrived intact at C in {:.1?}, \
                 A waited for credit {} times",
                s.delivered, s.bytes, s.elapsed, s.credit_stalls
            );
        }
        Err(e) => {
            eprintln!("forward_chain: {e}");
            std::process::exit(1);
        }
    }
}

/// Runs the chain: opens the three devices, connects A→B and B→C, pushes [`CHUNKS`] chunks
/// through it and tears it down. Fails if any chunk is lost, damaged or out of order, or any
/// step takes longer than 20 seconds.
pub fn run() -> Result<Summary, Error> {
    let host = |last: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 20, last));
    let open = |ip: IpAddr| -> Result<Device, Error> {
        Device::open(DeviceConfig::new(ip))
            .map_err(|e| format!("opening a device on {ip}: {e}").into())
    };
    let (a, b, c) = (open(host(1))?, open(host(2))?, open(host(3))?);
    println!(
        "devices: A {}, B {}, C {}",
        a.local_addr(),
        b.local_addr(),
        c.local_addr()
    );

    // Both listeners are bound before anyone connects, so no connect can be refused.
    let b_pd = b.alloc_pd();
    let b_listener = Listener::bind(&b, &b_pd, SocketAddr::new(host(2), 0))?;
    let c_pd = c.alloc_pd();
    let c_listener = Listener::bind(&c, &c_pd, SocketAddr::new(host(3), 0))?;
    let (b_cm, c_cm) = (b_listener.local_addr(), c_listener.local_addr());

    // Every side finishes its data phase before anyone disconnects: a disconnect flushes the
    // QP, and B's last credit must not be flushed on its way to A.
    let done = Rendezvous::default();
    let start = Instant::now();
    let (stalls, delivered) = thread::scope(|s| {
        let done = &done;
        let a = s.spawn(|| done.guard(side_a(&a, b_cm, done)));
        let b = s.spawn(|| done.guard(side_b(&b, &b_pd, &b_listener, c_cm, done)));
        let c = s.spawn(|| done.guard(side_c(&c, &c_pd, &c_listener, done)));
        let results = [("A", a.join()), ("B", b.join()), ("C", c.join())].map(|(who, r)| {
            r.unwrap_or_else(|_| Err("panicked".into()))
                .map_err(|e| format!("{who}: {e}"))
        });
        // Report the side that failed first, not one that stopped because of it.
        let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        if let Some(e) = failed
            .iter()
            .find(|e| !e.ends_with(STOPPED))
            .or(failed.first())
        {
            return Err(Error::from(e.as_str()));
        }
        let [stalls, _forwarded, delivered] = results.map(|r| r.unwrap_or_default());
        Ok::<_, Error>((stalls, delivered))
    })?;
    if delivered != CHUNKS {
        return Err(format!("{delivered} of {CHUNKS} chunks arrived at C").into());
    }
    Ok(Summary {
        delivered,
        bytes: u64::from(delivered) * CHUNK_LEN as u64,
        credit_stalls: stalls,
        elapsed: start.elapsed(),
    })
}

/// A: stages each chunk in a slot of its own region, WRITEs it WITH IMMEDIATE into the same
/// slot of B's ring once it has a credit, and counts credits coming back. Returns how often
/// it waited for a credit.
fn side_a(dev: &Device, b_cm: SocketAddr, done: &Rendezvous) -> Result<u32, Error> {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64, None)?;
    let init = QpInit::new(QpType::Rc, &cq, &cq);
    let conn = cm::connect(dev, &pd, b_cm, &init, &ConnectOptions::default())?;
    let ring = decode_ring(conn.remote_private_data())?;
    println!(
        "A: connected to B (QP {:#x} → {:#x}); B's ring: {} bytes at {:#x}, rkey {:#x}",
        conn.qp().qpn().value(),
        conn.remote().qpn.value(),
        ring.len,
        ring.addr,
        ring.rkey
    );
    let qp = conn.qp();
    // Credits arrive as zero-length SENDs: receives without buffers.
    for i in 0..SLOTS {
        qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sges: SgeList::new(),
        })?;
    }
    let staging = pd.reg_mr(SLOTS as usize * CHUNK_LEN, AccessFlags::LOCAL_WRITE)?;

    let mut credits = SLOTS;
    // A staging slot is reused once the WRITE from it completed (a retransmission reads it).
    let mut staged = [false; SLOTS as usize];
    let (mut next, mut returned, mut stalls) = (0u32, 0u32, 0u32);
    let mut waiting = false;
    let mut last = Instant::now();
    while returned < CHUNKS {
        let slot = (next % SLOTS) as usize;
        if next < CHUNKS && credits > 0 && !staged[slot] {
            let off = slot * CHUNK_LEN;
            staging.with_bytes_mut(|b| fill_chunk(next, &mut b[off..off + CHUNK_LEN]));
            let op = SendOp::WriteWithImm {
                remote_addr: ring.addr + off as u64,
                rkey: RKey(ring.rkey),
                imm: next,
            };
            println!("A: chunk {next:2} → B slot {slot} (WRITE_WITH_IMM, imm {next})");
            qp.post_send(SendWr::new(
                u64::from(next),
                op,
                SgeList::one(staging.sge(off, CHUNK_LEN)),
            ))?;
            staged[slot] = true;
            credits -= 1;
            next += 1;
            waiting = false;
            last = Instant::now();
            continue;
        }
        if next < CHUNKS && credits == 0 && !waiting {
            stalls += 1;
            waiting = true;
        }
        match cq.poll_one() {
            Some(wc) => {
                last = Instant::now();
                check(&wc)?;
                match wc.opcode {
                    WcOpcode::RdmaWrite => staged[(wc.wr_id % u64::from(SLOTS)) as usize] = false,
                    WcOpcode::Recv => {
                        let chunk = wc.imm_data.ok_or("a credit without immediate data")?;
                        qp.post_recv(RecvWr {
                            wr_id: wc.wr_id,
                            sges: SgeList::new(),
                        })?;
                        credits += 1;
                        returned += 1;
                        println!("A: credit back for chunk {chunk:2} ({credits} available)");
                    }
                    other => return Err(format!("unexpected completion {other:?}").into()),
                }
            }
            None if last.elapsed() > STEP_TIMEOUT => {
                return Err(format!(
                    "stuck: {next} chunks sent, {returned} credits back, {credits} available"
                )
                .into());
            }
            None => {
                done.check()?;
                thread::sleep(IDLE);
            }
        }
    }
    done.wait()?;
    // A started the chain; it ends it, and B passes the disconnect on.
    conn.disconnect()?;
    Ok(stalls)
}

/// B: posts a receive per ring slot, accepts A's connection with the ring's descriptor,
/// connects to C; then for each WRITE_WITH_IMM completion checks the chunk in place and
/// SENDs it to C from the same slot, and on each SEND completion gives A the slot's credit.
/// Returns how many chunks it forwarded.
fn side_b(
    dev: &Device,
    pd: &srdma::Pd,
    listener: &Listener,
    c_cm: SocketAddr,
    done: &Rendezvous,
) -> Result<u32, Error> {
    let cq = dev.create_cq(64, None)?;
    let init = QpInit::new(QpType::Rc, &cq, &cq);
    let ring = pd.reg_mr(
        SLOTS as usize * CHUNK_LEN,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let (to_c, from_a) = connect_b(dev, pd, listener, c_cm, &init, &ring)?;
    let (qp_a, qp_c) = (from_a.qp(), to_c.qp());

    let (mut received, mut forwarded, mut credited, mut credits_done) = (0u32, 0u32, 0u32, 0u32);
    let mut last = Instant::now();
    while forwarded < CHUNKS || credits_done < CHUNKS {
        let Some(wc) = cq.poll_one() else {
            if last.elapsed() > STEP_TIMEOUT {
                return Err(format!(
                    "stuck: {forwarded} chunks forwarded, {credited} credits given back"
                )
                .into());
            }
            done.check()?;
            thread::sleep(IDLE);
            continue;
        };
        last = Instant::now();
        check(&wc)?;
        match wc.opcode {
            // A's WRITE_WITH_IMM: the data is in the ring, the immediate says which chunk.
            WcOpcode::RecvRdmaWithImm => {
                let chunk = wc
                    .imm_data
                    .ok_or("a WRITE_WITH_IMM without immediate data")?;
                // RC delivers in order, and A writes in order.
                if chunk != received {
                    return Err(format!("chunk {chunk} arrived, expected {received}").into());
                }
                received += 1;
                if wc.byte_len as usize != CHUNK_LEN {
                    return Err(format!("chunk {chunk}: {} bytes", wc.byte_len).into());
                }
                let off = (chunk % SLOTS) as usize * CHUNK_LEN;
                let crc = ring.with_bytes(|b| verify_chunk(&b[off..off + CHUNK_LEN]));
                let crc =
                    crc.map_err(|e| format!("chunk {chunk} in slot {}: {e}", chunk % SLOTS))?;
                // The WRITE_WITH_IMM consumed a receive: put it back for a later chunk.
                qp_a.post_recv(RecvWr {
                    wr_id: wc.wr_id,
                    sges: SgeList::new(),
                })?;
                // Forward from the ring itself: the SEND gathers straight from the slot.
                println!(
                    "B: chunk {chunk:2} in slot {}, CRC32 {crc:#010x} ok, SEND → C",
                    chunk % SLOTS
                );
                let op = SendOp::SendWithImm { imm: chunk };
                qp_c.post_send(SendWr::new(
                    u64::from(chunk),
                    op,
                    SgeList::one(ring.sge(off, CHUNK_LEN)),
                ))?;
            }
            // C acknowledged a forwarded chunk: its slot is free, A gets the credit.
            WcOpcode::Send if wc.qp_num == qp_c.qpn() => {
                forwarded += 1;
                let chunk = wc.wr_id as u32;
                println!(
                    "B: C has chunk {chunk:2}, slot {} free, credit → A",
                    chunk % SLOTS
                );
                let op = SendOp::SendWithImm { imm: chunk };
                qp_a.post_send(SendWr::new(CREDIT | wc.wr_id, op, SgeList::new()))?;
                credited += 1;
            }
            // A acknowledged a credit.
            WcOpcode::Send if wc.wr_id & CREDIT != 0 => credits_done += 1,
            other => return Err(format!("unexpected completion {other:?} ({wc:?})").into()),
        }
    }
    done.wait()?;
    // A disconnects first; pass it on down the chain.
    wait_disconnect(&from_a)?;
    println!("B: A disconnected; disconnecting from C");
    to_c.disconnect()?;
    Ok(forwarded)
}

/// B's two connections: to C (active), then from A (passive, receives posted first).
fn connect_b(
    dev: &Device,
    pd: &srdma::Pd,
    listener: &Listener,
    c_cm: SocketAddr,
    init: &QpInit,
    ring: &Mr,
) -> Result<(Connection, Connection), Error> {
    let to_c = cm::connect(dev, pd, c_cm, init, &ConnectOptions::default())?;
    println!(
        "B: connected to C (QP {:#x} → {:#x})",
        to_c.qp().qpn().value(),
        to_c.remote().qpn.value()
    );
    let req = listener.accept_request(Some(STEP_TIMEOUT))?;
    // The QP that accepts A, in INIT with one receive per ring slot: every WRITE_WITH_IMM
    // consumes one (the data goes where the WRITE says, so the receives need no buffers).
    let qp = pd.create_qp(init)?;
    for i in 0..SLOTS {
        qp.post_recv(RecvWr {
            wr_id: u64::from(i),
            sges: SgeList::new(),
        })?;
    }
    let desc = ring.remote().ok_or("the ring has no rkey")?;
    let from_a = req.accept(qp, &encode_ring(&desc))?;
    println!(
        "B: accepted A (QP {:#x} ← {:#x}), ring of {SLOTS} × {CHUNK_LEN} bytes announced",
        from_a.qp().qpn().value(),
        from_a.remote().qpn.value()
    );
    Ok((to_c, from_a))
}

/// C: posts a receive buffer per slot, accepts B's connection, and checks every chunk that
/// arrives: in order, its CRC, and its bytes against what A generated. Returns how many
/// arrived intact.
fn side_c(
    dev: &Device,
    pd: &srdma::Pd,
    listener: &Listener,
    done: &Rendezvous,
) -> Result<u32, Error> {
    let cq = dev.create_cq(64, None)?;
    let bufs = pd.reg_mr(SLOTS as usize * CHUNK_LEN, AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
    let post = |slot: u64| {
        qp.post_recv(RecvWr {
            wr_id: slot,
            sges: SgeList::one(bufs.sge(slot as usize * CHUNK_LEN, CHUNK_LEN)),
        })
    };
    (0..u64::from(SLOTS)).try_for_each(post)?;
    let from_b = listener
        .accept_request(Some(STEP_TIMEOUT))?
        .accept(&qp, &[])?;
    println!(
        "C: accepted B (QP {:#x} ← {:#x}), {SLOTS} receive buffers posted",
        qp.qpn().value(),
        from_b.remote().qpn.value()
    );

    let mut expected = vec![0u8; CHUNK_LEN];
    let mut delivered = 0u32;
    let mut last = Instant::now();
    while delivered < CHUNKS {
        let Some(wc) = cq.poll_one() else {
            if last.elapsed() > STEP_TIMEOUT {
                return Err(format!("stuck: {delivered} chunks arrived").into());
            }
            done.check()?;
            thread::sleep(IDLE);
            continue;
        };
        last = Instant::now();
        check(&wc)?;
        if wc.opcode != WcOpcode::Recv {
            return Err(format!("unexpected completion {:?}", wc.opcode).into());
        }
        let chunk = wc.imm_data.ok_or("a chunk without immediate data")?;
        // RC delivers in order, and B forwards in the order A wrote.
        if chunk != delivered {
            return Err(format!("chunk {chunk} arrived, expected {delivered}").into());
        }
        if wc.byte_len as usize != CHUNK_LEN {
            return Err(format!("chunk {chunk}: {} bytes", wc.byte_len).into());
        }
        let off = wc.wr_id as usize * CHUNK_LEN;
        fill_chunk(chunk, &mut expected);
        let (crc, same) = bufs.with_bytes(|b| {
            let got = &b[off..off + CHUNK_LEN];
            (verify_chunk(got), got == expected.as_slice())
        });
        let crc = crc.map_err(|e| format!("chunk {chunk}: {e}"))?;
        if !same {
            return Err(format!("chunk {chunk}: CRC fine but the bytes differ").into());
        }
        println!(
            "C: chunk {chunk:2} arrived in buffer {}, {} bytes, CRC32 {crc:#010x} ok",
            wc.wr_id, wc.byte_len
        );
        post(wc.wr_id)?;
        delivered += 1;
    }
    done.wait()?;
    wait_disconnect(&from_b)?;
    println!("C: B disconnected");
    Ok(delivered)
}

/// Where the three sides meet after their data phase, and how one side's failure reaches the
/// others at once instead of after their timeouts.
#[derive(Debug, Default)]
struct Rendezvous {
    arrived: AtomicU32,
    failed: AtomicBool,
}

impl Rendezvous {
    /// Records `r`'s failure for the other sides, and passes it on.
    fn guard<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if r.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        r
    }

    /// Fails if another side has failed.
    fn check(&self) -> Result<(), Error> {
        if self.failed.load(Ordering::Acquire) {
            Err(STOPPED.into())
        } else {
            Ok(())
        }
    }

    /// Waits until all three sides arrived (or one failed).
    fn wait(&self) -> Result<(), Error> {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let t = Instant::now();
        while self.arrived.load(Ordering::Acquire) < 3 {
            self.check()?;
            if t.elapsed() > STEP_TIMEOUT {
                return Err("the other sides did not finish".into());
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

/// Waits for the peer's disconnect (past the `Established` every connection reports first).
fn wait_disconnect(conn: &Connection) -> Result<(), Error> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match conn.poll_event(Some(left)) {
            Some(CmEvent::Established) => {}
            Some(CmEvent::Disconnected) => return Ok(()),
            other => return Err(format!("waiting for the peer's disconnect: {other:?}").into()),
        }
    }
}

/// Fails on an unsuccessful completion.
fn check(wc: &Wc) -> Result<(), Error> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(format!(
            "work request {:#x} completed with {} ({:?})",
            wc.wr_id, wc.status, wc.opcode
        )
        .into())
    }
}

/// B's ring descriptor as private data: address, R_Key, length, big-endian.
fn encode_ring(r: &RemoteMr) -> Vec<u8> {
    let mut d = r.addr.to_be_bytes().to_vec();
    d.extend(r.rkey.to_be_bytes());
    d.extend(r.len.to_be_bytes());
    d
}

fn decode_ring(d: &[u8]) -> Result<RemoteMr, Error> {
    let field = |r: std::ops::Range<usize>| d.get(r).ok_or("B's private data is too short");
    let r = RemoteMr {
        addr: u64::from_be_bytes(field(0..8)?.try_into()?),
        rkey: u32::from_be_bytes(field(8..12)?.try_into()?),
        len: u64::from_be_bytes(field(12..20)?.try_into()?),
    };
    if r.len < u64::from(SLOTS) * CHUNK_LEN as u64 {
        return Err(format!("B's ring is {} bytes, too small", r.len).into());
    }
    Ok(r)
}

/// Chunk `n`'s contents: bytes from a generator seeded by `n`, then the CRC32 of those bytes,
/// little-endian, in the last four.
fn fill_chunk(n: u32, out: &mut [u8]) {
    let (body, trailer) = out.split_at_mut(out.len() - 4);
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(n).wrapping_mul(0xD1B5_4A32_D192_ED03);
    for b in body.iter_mut() {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *b = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8;
    }
    trailer.copy_from_slice(&crc32(body).to_le_bytes());
}

/// Checks a chunk's CRC32 trailer; returns the CRC.
fn verify_chunk(chunk: &[u8]) -> Result<u32, String> {
    let (body, trailer) = chunk.split_at(chunk.len() - 4);
    let want = u32::from_le_bytes(trailer.try_into().map_err(|_| "no trailer")?);
    let got = crc32(body);
    if got == want {
        Ok(got)
    } else {
        Err(format!("CRC32 {got:#010x}, trailer says {want:#010x}"))
    }
}

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), bit by bit: the checksum of zlib
/// and Ethernet, computed by hand to keep the example free of dependencies.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}
