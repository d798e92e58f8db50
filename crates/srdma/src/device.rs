//! Devices: one UDP socket, the transport state of every QP, and the progress thread.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use srdma_proto::transport::MAX_PACKET_LEN;
use srdma_proto::{
    AccessFlags, CqSide, Ctx, DeviceLimits, MrKeys, MrTable, Mtu, PdId, Qp as ProtoQp, RecvMeta,
    Srq as ProtoSrq,
};
use srdma_wire::{Encap, IpRepr, Packet, PacketRepr, Qpn, pcap};

use crate::cq::{CompChannel, Cq};
use crate::error::{Error, Result, io_err};
use crate::memory::{Region, Store};
use crate::sys;

/// Datagrams queued per `sendmmsg` (runs of them to one peer go out as one UDP GSO message).
const TX_BATCH: usize = 128;
/// Buffers per `recvmmsg` (each may hold a GRO-coalesced run of datagrams).
const RX_BATCH: usize = 32;
/// Receive batches handled before timers and the stop flag are looked at again: a flood of
/// datagrams must not starve retransmissions or block the device's drop.
const RX_BUDGET: usize = 8;
/// How long after an application's last poll the progress thread keeps out of the way:
/// while an application polls, its polls drive the device (no thread hand-off on the hot
/// path); when it stops, the thread takes over within this time.
const APP_GRACE: Duration = Duration::from_millis(1);
/// How often an application's polls refresh the device's published statistics at most.
const STATS_EVERY: Duration = Duration::from_millis(250);

/// The RoCEv2 UDP port.
pub const ROCEV2_PORT: u16 = srdma_wire::ROCEV2_PORT;

/// How to open a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Device name, as `ibv_devices` would show it.
    pub name: String,
    /// Local address to bind (a specific address: it is part of every packet's ICRC).
    pub addr: IpAddr,
    /// UDP port (4791 for RoCEv2; other ports let several devices share an address).
    pub port: u16,
    /// The port's active MTU (the path MTU RC/UC QPs may use at most; UD's message limit).
    pub mtu: Mtu,
    /// Queue and resource limits.
    pub limits: DeviceLimits,
    /// Write every packet sent and received to this pcap (default: `$SRDMA_PCAP`).
    pub pcap: Option<PathBuf>,
    /// When runs of packets to one peer go out as one UDP GSO message (default: `$SRDMA_GSO`,
    /// else [`Gso::Auto`]).
    pub gso: Gso,
}

/// Use of UDP generic segmentation offload (`UDP_SEGMENT`) for runs of same-sized packets.
///
/// One GSO message crosses the stack as one buffer and is cut into datagrams where the path
/// needs it. IPv6 has no ID field, so the ICRC of every datagram is the same wherever it is
/// cut. An IPv4 datagram's ICRC covers the IP ID: the socket's DF setting makes it 0, which
/// stays true when the receiving host cuts the buffer (loopback, veth), but a sending host that
/// cuts it in software numbers the datagrams 0, 1, 2, ... — which an srdma receiver verifies
/// (it solves for the ID) and kernel rxe or a NIC would reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gso {
    /// IPv6 peers, and IPv4 peers on this host (loopback or a local address).
    #[default]
    Auto,
    /// Every peer (for srdma-only networks, e.g. namespaces over veth).
    Always,
    /// Never: one datagram per send.
    Never,
}

impl Gso {
    fn from_env() -> Gso {
        match std::env::var("SRDMA_GSO").as_deref() {
            Ok("always" | "1" | "on") => Gso::Always,
            Ok("never" | "0" | "off") => Gso::Never,
            _ => Gso::Auto,
        }
    }
}

impl DeviceConfig {
    /// A device on `addr`, port 4791, the active MTU rxe would give the interface holding
    /// `addr` (1024 on 1500-byte Ethernet, 4096 on loopback or 9000-byte links), rxe's limits,
    /// capture to `$SRDMA_PCAP` if set.
    pub fn new(addr: IpAddr) -> DeviceConfig {
        DeviceConfig {
            name: "srdma0".into(),
            addr,
            port: ROCEV2_PORT,
            // rxe's active MTU for the interface; a 1500-byte Ethernet when it is unknown.
            mtu: sys::interface_mtu(addr)
                .and_then(Mtu::for_netdev_mtu)
                .unwrap_or(Mtu::Mtu1024),
            limits: DeviceLimits::default(),
            pcap: std::env::var_os("SRDMA_PCAP")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            gso: Gso::from_env(),
        }
    }
}

impl DeviceConfig {
    /// The node GUID of a device opened with this configuration on UDP `port`: EUI-64 style,
    /// from the address instead of a MAC (`02:xx:xx:ff:fe:xx:xx:pp`).
    fn node_guid_on(&self, port: u16) -> u64 {
        let b = match self.addr {
            IpAddr::V4(v4) => v4.octets(),
            IpAddr::V6(v6) => v6.octets()[12..].try_into().unwrap_or([0; 4]),
        };
        u64::from_be_bytes([
            0x02,
            b[0],
            b[1],
            0xff,
            0xfe,
            b[2],
            b[3],
            (port & 0xff) as u8,
        ])
    }

    /// The GID table of a device opened with this configuration on UDP `port` (see
    /// [`Device::gid`]).
    pub fn gids_on(&self, port: u16) -> Vec<Gid> {
        match self.addr {
            IpAddr::V4(_) => {
                let mut ll = [0u8; 16];
                ll[0] = 0xfe;
                ll[1] = 0x80;
                ll[8..].copy_from_slice(&self.node_guid_on(port).to_be_bytes());
                vec![Gid(ll), Gid::from_ip(self.addr)]
            }
            IpAddr::V6(_) => vec![Gid::from_ip(self.addr)],
        }
    }

    /// `ibv_query_device` of a device opened with this configuration on UDP `port`, without
    /// opening it.
    pub fn query_on(&self, port: u16) -> DeviceAttr {
        let l = &self.limits;
        DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").into(),
            node_guid: self.node_guid_on(port),
            vendor_id: 0xFF_FFFF,
            max_mr_size: l.max_mr_size,
            page_size_cap: crate::memory::PAGE as u64,
            max_qp: 0x1_0000,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_send_sge,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_qp_rd_atom: l.max_qp_rd_atom,
            max_qp_init_rd_atom: l.max_qp_init_rd_atom,
            max_srq_wr: l.max_srq_wr,
            max_srq_sge: l.max_srq_sge,
            atomic_cap: 1,
            phys_port_cnt: 1,
            max_inline_data: l.max_inline_data,
        }
    }

    /// `ibv_query_port` of a device opened with this configuration (its counters at 0).
    pub fn query_port(&self) -> PortAttr {
        let l = &self.limits;
        PortAttr {
            state: 4,
            max_mtu: l.port_max_mtu,
            active_mtu: self.mtu,
            gid_tbl_len: l.gid_tbl_len,
            max_msg_sz: l.max_msg_sz,
            pkey_tbl_len: l.pkey_tbl_len,
            link_layer: "Ethernet",
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
        }
    }
}

/// A GID: for RoCEv2, the IPv6 address (IPv4 addresses IPv4-mapped, `::ffff:a.b.c.d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address a GID stands for.
    pub fn ip(&self) -> IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    }
}

impl std::fmt::Display for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As `ibv_devinfo -v` prints RoCE v2 GIDs: inet_ntop(AF_INET6).
        std::net::Ipv6Addr::from(self.0).fmt(f)
    }
}

/// Device attributes, the fields of `ibv_query_device` srdma has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID (EUI-64 made from the address, as rxe makes it from the MAC).
    pub node_guid: u64,
    /// IEEE vendor id: 0xFFFFFF ("not assigned", what current rxe reports).
    pub vendor_id: u32,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Largest QP count.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per WR.
    pub max_sge: u32,
    /// Largest CQ.
    pub max_cqe: u32,
    /// Largest MR count.
    pub max_mr: u32,
    /// Outstanding READ/atomic as responder, per QP.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomic as requester, per QP.
    pub max_qp_init_rd_atom: u32,
    /// SRQ depth.
    pub max_srq_wr: u32,
    /// SRQ scatter entries.
    pub max_srq_sge: u32,
    /// Atomic guarantee ("ATOMIC_HCA (1)": atomic with respect to this device's operations).
    pub atomic_cap: u32,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Largest inline send.
    pub max_inline_data: u32,
}

/// Port attributes (`ibv_query_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// PORT_ACTIVE (4).
    pub state: u32,
    /// Largest MTU.
    pub max_mtu: Mtu,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Largest message.
    pub max_msg_sz: u64,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// "Ethernet".
    pub link_layer: &'static str,
    /// Packets dropped for a P_Key mismatch.
    pub bad_pkey_cntr: u64,
    /// UD packets dropped for a Q_Key mismatch.
    pub qkey_viol_cntr: u64,
}

/// Device-level receive statistics: what happened to packets before they reached a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounters {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Dropped: not a well-formed RoCEv2 packet.
    pub rx_malformed: u64,
    /// Dropped: ICRC wrong.
    pub rx_bad_icrc: u64,
    /// IPv4 packets from a peer that sets the IP ID: the ICRC was verified by solving for the
    /// 16-bit ID a UDP socket cannot see (a corruption passes with probability 2^-16).
    pub rx_icrc_ident_solved: u64,
    /// Dropped: no such QP.
    pub rx_unknown_qp: u64,
    /// Dropped: RC/UC packet from an address other than the QP's peer.
    pub rx_bad_source: u64,
    /// Congestion notification packets (ignored).
    pub rx_cnp: u64,
    /// Datagrams sent.
    pub tx_datagrams: u64,
    /// Datagrams the socket refused (the transport retransmits).
    pub tx_errors: u64,
    /// Sends that carried a run of datagrams as one UDP GSO message.
    pub tx_gso_messages: u64,
    /// Receive buffers that held a GRO-coalesced run of datagrams.
    pub rx_gro_buffers: u64,
}

impl DeviceCounters {
    /// Every counter with its name, in declaration order (for devinfo and stats files).
    pub fn entries(&self) -> [(&'static str, u64); 11] {
        [
            ("rx_datagrams", self.rx_datagrams),
            ("rx_malformed", self.rx_malformed),
            ("rx_bad_icrc", self.rx_bad_icrc),
            ("rx_icrc_ident_solved", self.rx_icrc_ident_solved),
            ("rx_unknown_qp", self.rx_unknown_qp),
            ("rx_bad_source", self.rx_bad_source),
            ("rx_cnp", self.rx_cnp),
            ("tx_datagrams", self.tx_datagrams),
            ("tx_errors", self.tx_errors),
            ("tx_gso_messages", self.tx_gso_messages),
            ("rx_gro_buffers", self.rx_gro_buffers),
        ]
    }
}

pub(crate) struct QpSlot {
    pub(crate) qp: ProtoQp,
    /// The state the application last saw or set: a move to ERR the engine makes on its
    /// own raises `QpFatal`.
    pub(crate) state_seen: srdma_proto::QpState,
    pub(crate) send_cq: Cq,
    pub(crate) recv_cq: Cq,
    pub(crate) srq: Option<u32>,
}

pub(crate) struct State {
    pub(crate) mrs: MrTable,
    pub(crate) mem: Store,
    pub(crate) qps: BTreeMap<u32, QpSlot>,
    pub(crate) srqs: BTreeMap<u32, ProtoSrq>,
    /// The QPN range this device owns: `qpn_base | n` (0 unless the port is shared).
    qpn_base: u32,
    next_qpn: u32,
    next_id: u32,
    pub(crate) counters: DeviceCounters,
    capture: Option<pcap::Writer<BufWriter<File>>>,
    tx: sys::TxBatch,
    /// The receive batch; `None` only while a receive pass has it out.
    rx: Option<sys::RxBatch>,
    touched: Vec<u32>,
    /// QPs whose packets (ACKs, responses) an application-driven receive held back: they go
    /// out with the application's next post to that QP (one send for the ACK and the reply
    /// of a ping-pong) or at its next poll, whichever comes first.
    deferred: Vec<u32>,
    due: Vec<u32>,
    /// Earliest QP timer, in ns since the epoch (u64::MAX: none).
    next_timer: u64,
    /// When (ns since the epoch) the published statistics may be refreshed next.
    stats_next: u64,
    stats: Option<crate::stats::Publisher>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    socket: UdpSocket,
    /// The connection to the port keeper while this device holds a slot of a shared port.
    _keeper: Option<OwnedFd>,
    /// Where async events go.
    events: Mutex<Option<crate::EventHandler>>,
    /// Set when the progress thread failed: the device is dead.
    pub(crate) fatal: AtomicBool,
    /// Test hook: the progress thread panics at its next turn.
    inject_failure: AtomicBool,
    pub(crate) local: SocketAddr,
    wake: OwnedFd,
    /// The timer the progress thread sleeps towards, in ns since `epoch` (u64::MAX: none).
    /// A post from an application thread that arms an earlier timer wakes it.
    sleep_until: AtomicU64,
    /// Until when (ns since `epoch`) an application's polls drive the device.
    app_active_until: AtomicU64,
    stop: AtomicBool,
    epoch: Instant,
    pub(crate) cfg: DeviceConfig,
}

/// Keeps the progress thread alive exactly as long as some handle needs the device.
pub(crate) struct DeviceHandle {
    pub(crate) shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        // Held-back ACKs go out before the device goes away.
        {
            let mut st = self.shared.lock();
            self.shared.flush_deferred(&mut st);
        }
        self.shared.stop.store(true, Ordering::Release);
        sys::signal(&self.shared.wake);
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

/// An RDMA device: a UDP socket speaking RoCEv2, with the verbs objects on it. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(crate) h: Arc<DeviceHandle>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.h.shared.cfg.name)
            .field("local", &self.h.shared.local)
            .finish()
    }
}

impl Device {
    /// Opens a device: binds the UDP socket (DF set, zero IPv6 checksums accepted) and starts
    /// the progress thread.
    pub fn open(cfg: DeviceConfig) -> Result<Device> {
        if cfg.addr.is_unspecified() {
            return Err(Error::InvalidArgument(
                "bind a specific address: it is covered by every packet's ICRC".into(),
            ));
        }
        if cfg.mtu.bytes() > cfg.limits.port_max_mtu.bytes() {
            return Err(Error::InvalidArgument(format!(
                "MTU {} above the port maximum",
                cfg.mtu.bytes()
            )));
        }
        let bind = SocketAddr::new(cfg.addr, cfg.port);
        // On the RoCEv2 port, share the address with this host's other srdma processes
        // (see portshare); the slot numbers our QPs.
        let share = if cfg.port == ROCEV2_PORT && crate::portshare::enabled() {
            crate::portshare::acquire(bind).ok()
        } else {
            None
        };
        let (socket, slot, keeper) = match share {
            Some(s) => (s.socket, s.slot, Some(s.keeper)),
            None => (
                UdpSocket::bind(bind).map_err(io_err(format!("binding UDP {bind}")))?,
                0,
                None,
            ),
        };
        let fd = socket.as_raw_fd();
        let v6 = cfg.addr.is_ipv6();
        sys::set_dont_fragment(fd, v6).map_err(io_err("setting IP_MTU_DISCOVER"))?;
        if v6 {
            sys::set_no_check6_rx(fd).map_err(io_err("setting UDP_NO_CHECK6_RX"))?;
        }
        sys::set_buffers(fd, 8 << 20);
        // Best effort: without GRO every datagram is its own buffer, as before.
        sys::set_gro(fd);
        socket
            .set_nonblocking(true)
            .map_err(io_err("making the socket non-blocking"))?;
        let local = socket
            .local_addr()
            .map_err(io_err("reading the bound address"))?;
        let capture = match &cfg.pcap {
            Some(p) => Some(
                pcap::Writer::new(BufWriter::new(
                    File::create(p).map_err(io_err(format!("creating {}", p.display())))?,
                ))
                .map_err(io_err("writing the pcap header"))?,
            ),
            None => None,
        };
        let state = State {
            mrs: MrTable::new(crate::random::random_u64()),
            mem: Store::default(),
            qps: BTreeMap::new(),
            srqs: BTreeMap::new(),
            // rxe numbers QPs from 17 (0x11); 0 and 1 are the special QPs. A shared port's
            // slot k owns k << 16 | n.
            qpn_base: u32::from(slot) << 16,
            next_qpn: 0x11,
            next_id: 1,
            counters: DeviceCounters::default(),
            capture,
            tx: sys::TxBatch::new(TX_BATCH, MAX_PACKET_LEN),
            // Slots large enough for a GRO run; a longer datagram is cut and fails to parse.
            rx: Some(sys::RxBatch::new(RX_BATCH, sys::RX_BUF)),
            touched: Vec::with_capacity(64),
            deferred: Vec::with_capacity(64),
            due: Vec::with_capacity(64),
            next_timer: u64::MAX,
            stats_next: 0,
            stats: crate::stats::Publisher::new(&cfg.name, local),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            socket,
            _keeper: keeper,
            events: Mutex::new(None),
            fatal: AtomicBool::new(false),
            inject_failure: AtomicBool::new(false),
            local,
            wake: sys::eventfd().map_err(io_err("eventfd"))?,
            sleep_until: AtomicU64::new(u64::MAX),
            app_active_until: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
            cfg,
        });
        let s2 = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("srdma-{}", local))
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| progress(&s2));
                if std::panic::catch_unwind(run).is_err() {
                    s2.fail();
                }
            })
            .map_err(io_err("starting the progress thread"))?;
        Ok(Device {
            h: Arc::new(DeviceHandle {
                shared,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Sends the device's async events (CQ overrun, QP fatal, last WQE, device fatal) to
    /// `handler` from now on, replacing any earlier handler.
    pub fn set_event_handler(&self, handler: crate::EventHandler) {
        *self
            .h
            .shared
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(handler);
    }

    /// True once the device failed (`AsyncEvent::DeviceFatal`): every call that needs the
    /// engine then fails with [`Error::DeviceFailed`].
    pub fn is_failed(&self) -> bool {
        self.h.shared.fatal.load(Ordering::Acquire)
    }

    /// [`Error::DeviceFailed`] once the device failed.
    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.is_failed() {
            Err(Error::DeviceFailed)
        } else {
            Ok(())
        }
    }

    /// Fault injection for tests: the progress thread panics at its next turn, which kills
    /// the device as a real failure would (see [`AsyncEvent::DeviceFatal`]).
    ///
    /// [`AsyncEvent::DeviceFatal`]: crate::AsyncEvent::DeviceFatal
    #[doc(hidden)]
    pub fn inject_failure(&self) {
        self.h.shared.inject_failure.store(true, Ordering::Relaxed);
        sys::signal(&self.h.shared.wake);
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.h.shared.local
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &DeviceConfig {
        &self.h.shared.cfg
    }

    /// GID table entry `index`, as rxe builds it: for an IPv4 device, index 0 is the
    /// link-local address made from the node GUID and index 1 the IPv4-mapped address (so
    /// `-g 1` means the same as on rxe); for IPv6, index 0 is the bound address.
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.gids().get(index).copied()
    }

    /// The GID table.
    pub fn gids(&self) -> Vec<Gid> {
        self.h.shared.cfg.gids_on(self.h.shared.local.port())
    }

    /// The GID of the bound address.
    pub fn local_gid(&self) -> Gid {
        Gid::from_ip(self.h.shared.cfg.addr)
    }

    /// `ibv_query_device`.
    pub fn query(&self) -> DeviceAttr {
        self.h.shared.cfg.query_on(self.h.shared.local.port())
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self) -> PortAttr {
        let mut attr = self.h.shared.cfg.query_port();
        let st = self.lock();
        for s in st.qps.values() {
            attr.bad_pkey_cntr += s.qp.counters().bad_pkey;
            attr.qkey_viol_cntr += s.qp.counters().qkey_violations;
        }
        attr
    }

    /// Device receive/transmit statistics.
    pub fn counters(&self) -> DeviceCounters {
        self.lock().counters
    }

    /// The sum of every QP's transport counters (rxe's hw counters).
    pub fn qp_counters(&self) -> srdma_proto::Counters {
        let st = self.lock();
        let mut c = srdma_proto::Counters::default();
        for s in st.qps.values() {
            c += *s.qp.counters();
        }
        c
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        let id = self.next_id();
        Pd {
            dev: self.clone(),
            id: PdId(id),
        }
    }

    /// A completion queue of `cqe` entries, optionally tied to a completion channel.
    pub fn create_cq(&self, cqe: usize, channel: Option<&CompChannel>) -> Result<Cq> {
        self.check_alive()?;
        if cqe == 0 || cqe > self.h.shared.cfg.limits.max_cqe as usize {
            return Err(Error::InvalidArgument(format!(
                "cqe {cqe} outside 1..={}",
                self.h.shared.cfg.limits.max_cqe
            )));
        }
        Ok(Cq::new(
            self.next_id(),
            cqe,
            channel.cloned(),
            Arc::downgrade(&self.h.shared),
        ))
    }

    pub(crate) fn next_id(&self) -> u32 {
        let mut st = self.lock();
        st.next_id += 1;
        st.next_id
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.h.shared.lock()
    }

    pub(crate) fn alloc_qpn(&self, st: &mut State) -> Result<Qpn> {
        // Unshared: 0x11..=0xFFFFFE; a shared port's slot: its 64 Ki numbers (0x11..=0xFFFF).
        let last = if st.qpn_base == 0 { 0xFF_FFFE } else { 0xFFFF };
        for _ in 0..0x1_0000 {
            let n = st.next_qpn;
            st.next_qpn = if n >= last { 0x11 } else { n + 1 };
            let qpn = st.qpn_base | n;
            if !st.qps.contains_key(&qpn) {
                return Ok(Qpn::new(qpn));
            }
        }
        Err(Error::Exhausted("QP numbers"))
    }

    pub(crate) fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.h, &other.h)
    }

    /// Sends `qpn`'s packets if an application-driven receive held them back.
    pub(crate) fn flush_if_deferred(&self, st: &mut State, qpn: u32) {
        if let Some(i) = st.deferred.iter().position(|&q| q == qpn) {
            st.deferred.swap_remove(i);
            self.h.shared.flush(st, qpn);
        }
    }

    /// Sends every packet `qpn` has ready, from the caller's thread (the "doorbell"), and
    /// wakes the progress thread if the QP now has a timer earlier than the one it sleeps on.
    pub(crate) fn flush(&self, st: &mut State, qpn: u32) {
        let sh = &self.h.shared;
        sh.flush(st, qpn);
        if let Some(t) = st.qps.get(&qpn).and_then(|s| s.qp.poll_timeout()) {
            if (t.as_nanos() as u64) < sh.sleep_until.load(Ordering::Acquire) {
                sys::signal(&sh.wake);
            }
        }
    }
}

/// A protection domain (`ibv_pd`).
#[derive(Debug, Clone)]
pub struct Pd {
    pub(crate) dev: Device,
    pub(crate) id: PdId,
}

impl Pd {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// `ibv_reg_mr` on memory srdma allocates: `len` zeroed, page-aligned bytes the region
    /// owns. Its address is the region's virtual address for remote access, as with a NIC.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        self.dev.check_alive()?;
        access.validate_for_mr()?;
        let region = Arc::new(Region::new(len).ok_or(Error::Exhausted("memory for the region"))?);
        let mut st = self.dev.lock();
        let keys = st
            .mrs
            .register(self.id, region.addr(), len as u64, access)?;
        st.mem.insert(keys.handle, Arc::clone(&region));
        Ok(Mr {
            pd: self.clone(),
            keys,
            iova: region.addr(),
            region,
        })
    }

    /// `ibv_reg_mr_iova2` on the caller's own memory: registers the `len` bytes at `addr`,
    /// which peers and work requests address as `iova..iova + len` (pass `addr as u64` for
    /// what `ibv_reg_mr` does). The region does not own the bytes and never frees them.
    ///
    /// # Safety
    /// The caller keeps `addr..addr + len` mapped, readable and writable (a region without
    /// write access is still only read) until the returned [`Mr`] is dropped. The engine reads
    /// and writes those bytes from its progress thread and from the threads that post and
    /// poll, as a NIC's DMA would: while a transfer targets them, the application must not
    /// rely on their contents (the verbs contract), and it must not free or unmap them.
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        self.dev.check_alive()?;
        access.validate_for_mr()?;
        let ptr = std::ptr::NonNull::new(addr)
            .ok_or_else(|| Error::InvalidArgument("NULL address".into()))?;
        if (addr as usize).checked_add(len).is_none() || iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidArgument(
                "the range wraps around the address space".into(),
            ));
        }
        // SAFETY: the caller's contract is `Region::foreign`'s.
        let region = Arc::new(unsafe { Region::foreign(ptr, len) });
        let mut st = self.dev.lock();
        let keys = st.mrs.register(self.id, iova, len as u64, access)?;
        st.mem.insert(keys.handle, Arc::clone(&region));
        Ok(Mr {
            pd: self.clone(),
            keys,
            iova,
            region,
        })
    }
}

/// A memory region (`ibv_mr`) owning its memory. Dropping it deregisters it: work still in
/// flight against it then fails with a protection error instead of touching freed memory.
#[derive(Debug)]
pub struct Mr {
    pd: Pd,
    keys: MrKeys,
    /// The address work requests and peers use for the first byte.
    iova: u64,
    region: Arc<Region>,
}

/// What a peer needs to reach a region: address, R_Key, length. Plain data, to send across.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
}

impl Mr {
    /// Address of the first byte as work requests and peers name it: its virtual address,
    /// or the I/O virtual address it was registered at.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Local key.
    pub fn lkey(&self) -> srdma_proto::LKey {
        self.keys.lkey
    }

    /// Remote key, if remote access was granted.
    pub fn rkey(&self) -> Option<srdma_proto::RKey> {
        self.keys.rkey
    }

    /// The descriptor a peer needs (None without remote access).
    pub fn remote(&self) -> Option<RemoteMr> {
        self.keys.rkey.map(|r| RemoteMr {
            addr: self.addr(),
            rkey: r.0,
            len: self.len() as u64,
        })
    }

    /// A scatter/gather entry for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> srdma_proto::Sge {
        srdma_proto::Sge {
            addr: self.addr() + offset as u64,
            length: len as u32,
            lkey: self.keys.lkey,
        }
    }

    /// Copies `dst.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.with_bytes(|b| {
            let src = b
                .get(offset..offset.saturating_add(dst.len()))
                .ok_or_else(|| range_err(offset, dst.len(), b.len()))?;
            dst.copy_from_slice(src);
            Ok(())
        })
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.with_bytes_mut(|b| {
            let len = b.len();
            let dst = b
                .get_mut(offset..offset.saturating_add(src.len()))
                .ok_or_else(|| range_err(offset, src.len(), len))?;
            dst.copy_from_slice(src);
            Ok(())
        })
    }

    /// Runs `f` on the region's bytes with the device locked (RDMA into it waits meanwhile).
    /// `f` must not call back into the same device (post, poll a QP, register memory): the
    /// device lock is not reentrant, so that would deadlock. Copy out with [`Mr::read`] first.
    ///
    /// Like a CQ poll, reading drives the device first: an application that polls memory
    /// for a peer's RDMA WRITE (as perftest's latency tests do) sees it land without waiting
    /// for the progress thread.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        self.pd.dev.h.shared.drive_from_app(true);
        let _st = self.pd.dev.lock();
        // SAFETY: the device lock is held for the whole borrow, so the engine cannot write
        // these bytes concurrently, and no `&mut` to them exists.
        f(unsafe { self.region.bytes() })
    }

    /// Runs `f` on the region's bytes, writable, with the device locked. The same rule as
    /// [`Mr::with_bytes`]: no calls back into the device from `f`.
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let _st = self.pd.dev.lock();
        // SAFETY: the device lock is held for the whole borrow; it is the only live reference.
        f(unsafe { self.region.bytes_mut() })
    }
}

fn range_err(offset: usize, len: usize, size: usize) -> Error {
    Error::InvalidArgument(format!(
        "{len} bytes at offset {offset} outside a {size}-byte region"
    ))
}

impl Drop for Mr {
    fn drop(&mut self) {
        let mut st = self.pd.dev.lock();
        let _ = st.mrs.deregister(self.keys.lkey);
        st.mem.remove(self.keys.handle);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn encap_to(&self, dst: SocketAddr, sport: u16) -> Option<Encap> {
        let ip = IpRepr::between(self.local.ip(), dst.ip()).ok()?;
        Some(Encap {
            ip,
            src_port: sport,
            dst_port: dst.port(),
        })
    }

    /// Sends everything QP `qpn` has to send, then hands its completions to its CQs.
    fn flush(&self, st: &mut State, qpn: u32) {
        let now = self.now();
        let State {
            mrs,
            mem,
            qps,
            srqs,
            counters,
            capture,
            tx,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            return;
        };
        let fd = self.socket.as_raw_fd();
        // Payload goes to the socket straight from registered memory, except when a capture
        // wants each packet whole.
        let zero_copy = capture.is_none();
        loop {
            if tx.is_full() {
                counters.tx_errors += tx.send(fd) as u64;
            }
            let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
            mem.deferring = zero_copy;
            mem.pieces.clear();
            let mut ctx = Ctx { now, mrs, mem, srq };
            let t = slot.qp.poll_transmit(&mut ctx, tx.slot());
            mem.deferring = false;
            let Some(t) = t else {
                break;
            };
            let dst = SocketAddr::new(Gid(t.dest.dgid).ip(), t.dest.udp_dport);
            // The QP names the rxe-style entropy source port, but the socket sends from its
            // bound port, and the ICRC must cover what goes on the wire.
            let Some(encap) = self.encap_to(dst, self.local.port()) else {
                counters.tx_errors += 1;
                continue;
            };
            let gso = self.gso_for(dst);
            if !mem.pieces.is_empty() {
                match commit_zero_copy(tx, mem, &encap, t.len, dst, gso) {
                    ZeroCopy::Queued => {
                        counters.tx_datagrams += 1;
                        continue;
                    }
                    ZeroCopy::Copied => {}
                    ZeroCopy::Failed => {
                        // Never send a packet whose payload is not all there.
                        counters.tx_errors += 1;
                        continue;
                    }
                }
            }
            let pkt = &mut tx.slot()[..t.len];
            if Packet::new_unchecked(&mut *pkt).fill_icrc(&encap).is_err() {
                counters.tx_errors += 1;
                continue;
            }
            if let Some(w) = capture.as_mut() {
                let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &encap, pkt);
            }
            tx.commit(t.len, dst, gso);
            counters.tx_datagrams += 1;
        }
        if tx.len() > 0 {
            counters.tx_errors += tx.send(fd) as u64;
        }
        counters.tx_gso_messages = tx.gso_messages;
        deliver_completions(slot);
        note_timer(&mut st.next_timer, slot);
    }

    fn gso_for(&self, dst: SocketAddr) -> bool {
        match self.cfg.gso {
            Gso::Never => false,
            Gso::Always => true,
            Gso::Auto => dst.is_ipv6() || dst.ip().is_loopback() || dst.ip() == self.local.ip(),
        }
    }

    /// Called from an application's CQ poll: drives the device from the caller's thread if no
    /// one else is (the progress thread keeps out while polls keep coming).
    /// `polling`: the caller keeps polling (the thread stands aside for a grace period).
    /// Sends `ev` to the device's event handler, if it has one.
    pub(crate) fn raise(&self, ev: crate::AsyncEvent) {
        let h = self
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(h) = h {
            h(ev);
        }
    }

    /// The progress thread died: the device is dead. Every QP goes to ERR with its work
    /// flushed (error completions, so no waiter hangs), then `DeviceFatal`; later calls fail.
    fn fail(&self) {
        self.fatal.store(true, Ordering::Release);
        let mut st = self.lock();
        for slot in st.qps.values_mut() {
            slot.qp.set_error();
            deliver_completions(slot);
        }
        drop(st);
        self.raise(crate::AsyncEvent::DeviceFatal);
    }

    pub(crate) fn drive_from_app(&self, polling: bool) {
        if self.fatal.load(Ordering::Acquire) {
            return;
        }
        let now = self.now().as_nanos() as u64;
        let until = now + APP_GRACE.as_nanos() as u64;
        if polling && self.app_active_until.load(Ordering::Relaxed) < until {
            self.app_active_until.store(until, Ordering::Relaxed);
        }
        let Ok(mut st) = self.state.try_lock() else {
            return;
        };
        self.flush_deferred(&mut st);
        self.receive(&mut st, RX_BUDGET, true);
        if now >= st.next_timer {
            self.run_timers(&mut st);
        }
        if now >= st.stats_next {
            st.stats_next = now + STATS_EVERY.as_nanos() as u64;
            publish_stats(&mut st);
        }
    }

    /// The application stops polling (it armed a CQ to sleep on its channel): the progress
    /// thread takes over at once.
    pub(crate) fn app_sleeps(&self) {
        if self.app_active_until.swap(0, Ordering::Relaxed) > self.now().as_nanos() as u64 {
            sys::signal(&self.wake);
        }
    }

    /// Sends what earlier application-driven receives held back.
    fn flush_deferred(&self, st: &mut State) {
        let mut deferred = std::mem::take(&mut st.deferred);
        for qpn in deferred.drain(..) {
            self.flush(st, qpn);
        }
        st.deferred = deferred;
    }

    /// Receives and handles up to `budget` batches of datagrams, flushing every QP they
    /// touched (with `defer`, completing their work now but holding their packets back:
    /// see `State::deferred`); returns true when the budget ran out with more waiting.
    fn receive(&self, st: &mut State, budget: usize, defer: bool) -> bool {
        let Some(mut rx) = st.rx.take() else {
            return false;
        };
        let fd = self.socket.as_raw_fd();
        let mut more = false;
        for _ in 0..budget {
            let n = rx.recv(fd).unwrap_or(0);
            for i in 0..n {
                match rx.get(i) {
                    // An empty datagram is one (malformed) packet too.
                    Some((data, from, _)) if data.is_empty() => {
                        self.handle_datagram(st, from, data);
                    }
                    Some((data, from, seg)) => {
                        if seg < data.len() {
                            st.counters.rx_gro_buffers += 1;
                        }
                        for pkt in data.chunks(seg.max(1)) {
                            self.handle_datagram(st, from, pkt);
                        }
                    }
                    None => st.counters.rx_malformed += 1,
                }
            }
            let mut touched = std::mem::take(&mut st.touched);
            for qpn in touched.drain(..) {
                // Requests (a window the ACKs just opened) go now; only ACKs and responses
                // wait for the application's reply.
                let ready = st.qps.get(&qpn).is_some_and(|s| s.qp.has_requests_ready());
                if !defer || ready {
                    self.flush(st, qpn);
                } else if let Some(slot) = st.qps.get_mut(&qpn) {
                    deliver_completions(slot);
                    note_timer(&mut st.next_timer, slot);
                    if !st.deferred.contains(&qpn) {
                        st.deferred.push(qpn);
                    }
                }
            }
            st.touched = touched;
            more = n == RX_BATCH;
            if !more {
                break;
            }
        }
        st.rx = Some(rx);
        more
    }

    fn handle_datagram(&self, st: &mut State, from: SocketAddr, data: &[u8]) {
        let now = self.now();
        st.counters.rx_datagrams += 1;
        let Some(encap) = self.encap_from(from) else {
            st.counters.rx_malformed += 1;
            return;
        };
        if let Some(w) = st.capture.as_mut() {
            let _ = w.write_roce(now.as_nanos() as u64 + capture_epoch(), &encap, data);
        }
        // rxe's order: the structure first (length, version, opcode, headers), the ICRC last.
        // One parse serves both: the repr is used only once the ICRC has verified.
        let Ok(repr) = PacketRepr::parse_bytes(data) else {
            st.counters.rx_malformed += 1;
            return;
        };
        // IPv6: every covered field is known. IPv4: the ID is not (a UDP socket cannot see
        // it); one pass solves for it — srdma peers send 0, rxe and NICs others.
        let verified = match encap.ip {
            IpRepr::V4(_) => match srdma_wire::icrc::verify_ipv4_unknown_ident(&encap, data) {
                Ok(0) => true,
                Ok(_) => {
                    st.counters.rx_icrc_ident_solved += 1;
                    true
                }
                Err(_) => false,
            },
            IpRepr::V6(_) => srdma_wire::icrc::verify(&encap, data).is_ok(),
        };
        if !verified {
            st.counters.rx_bad_icrc += 1;
            return;
        }
        if repr.bth.opcode == srdma_wire::Opcode::Cnp {
            st.counters.rx_cnp += 1;
            return;
        }
        let qpn = repr.bth.dest_qpn.value();
        let State {
            mrs,
            mem,
            qps,
            srqs,
            counters,
            touched,
            ..
        } = st;
        let Some(slot) = qps.get_mut(&qpn) else {
            counters.rx_unknown_qp += 1;
            return;
        };
        // rxe check_addr: a connected QP only takes packets from its peer's address.
        if slot.qp.qp_type() != srdma_proto::QpType::Ud
            && Gid(slot.qp.attr().ah_attr.dgid).ip() != from.ip()
        {
            counters.rx_bad_source += 1;
            return;
        }
        let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
        let mut ctx = Ctx { now, mrs, mem, srq };
        slot.qp.handle_packet(&mut ctx, &repr, &RecvMeta { encap });
        if !touched.contains(&qpn) {
            touched.push(qpn);
        }
    }

    fn encap_from(&self, from: SocketAddr) -> Option<Encap> {
        let ip = IpRepr::between(from.ip(), self.local.ip()).ok()?;
        Some(Encap {
            ip,
            src_port: from.port(),
            dst_port: self.local.port(),
        })
    }

    /// Runs due timers; returns the time until the next one (also kept in `next_timer`).
    fn run_timers(&self, st: &mut State) -> Option<Duration> {
        let now = self.now();
        let mut due = std::mem::take(&mut st.due);
        due.clear();
        let mut next: Option<Duration> = None;
        for (&qpn, slot) in &st.qps {
            if let Some(t) = slot.qp.poll_timeout() {
                if t <= now {
                    due.push(qpn);
                } else {
                    next = Some(next.map_or(t - now, |n| n.min(t - now)));
                }
            }
        }
        for &qpn in &due {
            let State {
                mrs,
                mem,
                qps,
                srqs,
                ..
            } = &mut *st;
            if let Some(slot) = qps.get_mut(&qpn) {
                let srq = slot.srq.and_then(|id| srqs.get_mut(&id));
                let mut ctx = Ctx { now, mrs, mem, srq };
                slot.qp.handle_timeout(&mut ctx);
            }
            self.flush(st, qpn);
            if let Some(t) = st.qps.get(&qpn).and_then(|s| s.qp.poll_timeout()) {
                let d = t.saturating_sub(now);
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        st.due = due;
        st.next_timer = next.map_or(u64::MAX, |d| (now + d).as_nanos() as u64);
        next
    }
}

/// What became of a packet built with its payload left in registered memory.
enum ZeroCopy {
    /// Queued, sent from the pieces.
    Queued,
    /// The pieces were copied into the slot: send it as an ordinary packet.
    Copied,
    /// The payload could not be assembled: drop the packet (the transport retransmits).
    Failed,
}

/// Queues the packet in the current slot of `tx` — headers and pad there, payload pieces in
/// registered memory (noted by the store while the packet was built) — computing its ICRC
/// across the pieces. When it cannot go out that way (too many pieces) the pieces are
/// copied into the slot instead.
fn commit_zero_copy(
    tx: &mut sys::TxBatch,
    mem: &Store,
    encap: &Encap,
    len: usize,
    dst: SocketAddr,
    gso: bool,
) -> ZeroCopy {
    const ICRC: usize = srdma_wire::icrc::ICRC_LEN;
    let slot = tx.slot();
    let base = slot.as_ptr() as usize;
    let mut parts = [(std::ptr::null::<u8>(), 0usize); sys::MAX_PARTS];
    let mut n = 0;
    let fits = 2 * mem.pieces.len() < sys::MAX_PARTS && len >= srdma_wire::bth::BTH_LEN + ICRC;
    let hasher = fits
        .then(|| srdma_wire::icrc::Hasher::new(encap, len - ICRC, &slot[..len]).ok())
        .flatten();
    let Some(mut h) = hasher else {
        return materialize(slot, base, mem);
    };
    let mut at = srdma_wire::bth::BTH_LEN;
    let mut gap = 0;
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        let src = mem.piece(p);
        let (Some(src), true) = (src, off >= at && off + p.len <= len - ICRC) else {
            return materialize(slot, base, mem);
        };
        h.update(&slot[at..off]);
        h.update(src);
        if off > gap {
            parts[n] = (slot[gap..].as_ptr(), off - gap);
            n += 1;
        }
        parts[n] = (src.as_ptr(), src.len());
        n += 1;
        at = off + p.len;
        gap = at;
    }
    h.update(&slot[at..len - ICRC]);
    slot[len - ICRC..len].copy_from_slice(&h.finish().to_le_bytes());
    parts[n] = (slot[gap..].as_ptr(), len - gap);
    n += 1;
    tx.commit_parts(len, dst, gso, parts[..n].iter().copied());
    ZeroCopy::Queued
}

/// Copies noted payload pieces into the packet buffer they stand for.
fn materialize(slot: &mut [u8], base: usize, mem: &Store) -> ZeroCopy {
    for p in &mem.pieces {
        let off = p.dst.wrapping_sub(base);
        match (mem.piece(p), slot.get_mut(off..off.saturating_add(p.len))) {
            (Some(src), Some(dst)) => dst.copy_from_slice(src),
            _ => return ZeroCopy::Failed,
        }
    }
    ZeroCopy::Copied
}

/// Unix time of the engine's epoch, so captures carry real timestamps.
fn capture_epoch() -> u64 {
    static EPOCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// Refreshes the device's published statistics (at most once a second).
fn publish_stats(st: &mut State) {
    if st.stats.is_none() {
        return;
    }
    let mut qp = srdma_proto::Counters::default();
    for s in st.qps.values() {
        qp += *s.qp.counters();
    }
    let dev = st.counters;
    if let Some(p) = st.stats.as_mut() {
        p.maybe_write(&dev, &qp, Instant::now());
    }
}

/// Keeps `next_timer` (the earliest timer an application's poll must run) at or before the
/// QP's timer, so a timer armed by a post or a packet fires while an application polls.
fn note_timer(next_timer: &mut u64, slot: &QpSlot) {
    if let Some(t) = slot.qp.poll_timeout() {
        *next_timer = (*next_timer).min(t.as_nanos() as u64);
    }
}

pub(crate) fn deliver_completions(slot: &mut QpSlot) {
    let mut overrun = false;
    while let Some((side, wc)) = slot.qp.poll_completion() {
        let solicited = wc.solicited;
        overrun |= !match side {
            CqSide::Send => slot.send_cq.push(wc, false),
            CqSide::Recv => slot.recv_cq.push(wc, solicited),
        };
    }
    if overrun {
        // As rxe: a QP whose completion found its CQ full goes to ERR; its flushed work
        // requests go where they can (an overrun CQ takes no more).
        slot.qp.set_error();
        while let Some((side, wc)) = slot.qp.poll_completion() {
            let _ = match side {
                CqSide::Send => slot.send_cq.push(wc, false),
                CqSide::Recv => slot.recv_cq.push(wc, false),
            };
        }
    }
    let state = slot.qp.state();
    if state == srdma_proto::QpState::Err && slot.state_seen != state {
        let qpn = slot.qp.qpn();
        slot.send_cq.raise(crate::AsyncEvent::QpFatal { qpn });
        if slot.srq.is_some() {
            slot.send_cq
                .raise(crate::AsyncEvent::QpLastWqeReached { qpn });
        }
    }
    slot.state_seen = state;
}

/// The progress thread: receive, dispatch, acknowledge, retransmit, complete — so one-sided
/// operations finish without the target application's help. Sleeps in `poll` when idle, and
/// keeps out of the way while an application's CQ polls drive the device.
fn progress(shared: &Shared) {
    let mut timeout = None;
    while !shared.stop.load(Ordering::Acquire) {
        if shared.inject_failure.load(Ordering::Relaxed) {
            panic!("srdma: injected failure of the progress thread (Device::inject_failure)");
        }
        let now = shared.now().as_nanos() as u64;
        let active = shared.app_active_until.load(Ordering::Relaxed);
        if now < active {
            // Posts need not wake us meanwhile (0: "asleep until the past", so no timer is
            // earlier): the application's polls run the timers, and we run them on return.
            shared.sleep_until.store(0, Ordering::Release);
            let _ = sys::poll_readable(
                [shared.wake.as_raw_fd()],
                Some(Duration::from_nanos(active - now)),
            );
            sys::drain(&shared.wake);
            timeout = Some(Duration::ZERO);
            continue;
        }
        let fds = [shared.socket.as_raw_fd(), shared.wake.as_raw_fd()];
        if sys::poll_readable(fds, timeout).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        sys::drain(&shared.wake);
        let mut st = shared.lock();
        shared.flush_deferred(&mut st);
        let more = shared.receive(&mut st, RX_BUDGET, false);
        timeout = shared.run_timers(&mut st);
        if more {
            timeout = Some(Duration::ZERO);
        }
        // Published under the lock: a post that arms an earlier timer after this sees the
        // value and wakes the thread.
        let until = timeout.map_or(u64::MAX, |t| (shared.now() + t).as_nanos() as u64);
        shared.sleep_until.store(until, Ordering::Release);
        if let Some(w) = st.capture.as_mut() {
            let _ = w.flush();
        }
        publish_stats(&mut st);
        // A rate-limited refresh is pending: come back for it even if nothing else happens.
        if let Some(d) = st.stats.as_ref().and_then(|p| p.due_in(Instant::now())) {
            timeout = Some(timeout.map_or(d, |t| t.min(d)));
        }
    }
}
