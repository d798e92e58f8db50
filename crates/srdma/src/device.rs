//! Devices and their resources: the configuration and attributes, the device handle,
//! protection domains and memory regions (GIDs, the GSO setting and the device counters are
//! in `types`). The engine that runs a device is `engine`; its socket, `udp`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use srdma_proto::{AccessFlags, DeviceLimits, MrKeys, Mtu, PdId};
use srdma_wire::Qpn;

pub use crate::config::DeviceConfig;
use crate::cq::{CompChannel, Cq};
use crate::engine::{DeviceHandle, State};
use crate::error::{Error, Result, io_err};
use crate::memory::Region;
use crate::sys;
use crate::types::{DeviceCounters, Gid, Gso};

/// The RoCEv2 UDP port.
pub const ROCEV2_PORT: u16 = srdma_wire::ROCEV2_PORT;

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
            share_port: crate::portshare::enabled(),
            shm: crate::shm::enabled_by_env(),
            shm_pull: crate::ShmPull::from_env(),
            ecn: std::env::var("SRDMA_ECN").map_or(true, |v| v != "0"),
            udp_buffer: 8 << 20,
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

    /// The completion vectors a device opened with this configuration offers
    /// (`num_comp_vectors`): one per possible CPU, as rxe's. A CQ may name any of them; all
    /// complete alike.
    pub fn comp_vectors(&self) -> u32 {
        crate::sys::possible_cpus()
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
            max_mw: srdma_proto::mr::MAX_MW,
            max_qp_rd_atom: l.max_qp_rd_atom,
            max_qp_init_rd_atom: l.max_qp_init_rd_atom,
            max_srq_wr: l.max_srq_wr,
            max_srq_sge: l.max_srq_sge,
            atomic_cap: 1,
            phys_port_cnt: 1,
            max_inline_data: l.max_inline_data,
            max_mcast_grp: crate::engine::MAX_MCAST_GRP,
            max_mcast_qp_attach: crate::engine::MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: crate::engine::MAX_MCAST_GRP
                * crate::engine::MAX_MCAST_QP_ATTACH,
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
    /// Largest memory window count.
    pub max_mw: u32,
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
    /// Multicast groups a device joins at most (rxe's limit).
    pub max_mcast_grp: u32,
    /// QPs attached to one multicast group at most (rxe's limit).
    pub max_mcast_qp_attach: u32,
    /// Attachments of QPs to groups at most, all groups together.
    pub max_total_mcast_qp_attach: u32,
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
        let sock = crate::udp::open(SocketAddr::new(cfg.addr, cfg.port), &cfg)?;
        Ok(Device {
            h: crate::engine::start(cfg, sock)?,
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

    /// Whether the device shares its address and port with other processes (its QPNs are
    /// then those of its slot).
    pub fn shares_port(&self) -> bool {
        self.h.shared.shared_port
    }

    /// The top byte of the CM communication IDs this device picks: its slot of a shared port
    /// (the port keeper routes CM replies by it), 0 otherwise.
    pub(crate) fn comm_id_prefix(&self) -> u32 {
        let slot = self.lock().port_slot();
        crate::portshare::comm_id_prefix(slot)
    }

    /// A GSI QP now lives here: on a shared port, have the keeper's forwarded MADs handled.
    pub(crate) fn enable_cm_forwarding(&self) {
        let sh = &self.h.shared;
        if sh._keeper.is_some() {
            sh.cm_forwarded.store(true, Ordering::Relaxed);
            sys::signal(&sh.wake);
        }
    }

    /// Asks the port keeper to forward REQs for `service_id` here (nothing to do when the
    /// port is this device's alone).
    pub(crate) fn cm_listen(&self, service_id: u64) -> Result<()> {
        match &self.h.shared._keeper {
            Some(k) => crate::portshare::register_listen(k, service_id)
                .map_err(io_err("registering a CM listen with the port keeper")),
            None => Ok(()),
        }
    }

    /// A CM connection of this device is established: on a shared port the keeper sends its
    /// peer a DREQ should this process die before [`Device::cm_closed`] (as the kernel does
    /// for a process's rdma_cm ids). Best effort: a connection the keeper does not know of
    /// is only left to the peer's own timers.
    pub(crate) fn cm_established(&self, c: &crate::portshare::CmConn) {
        if let Some(t) = self.cm_table() {
            t.insert(c);
        }
    }

    /// The CM connection `local_comm_id` ended (see [`Device::cm_established`]).
    pub(crate) fn cm_closed(&self, local_comm_id: u32) {
        if let Some(t) = self.cm_table() {
            t.remove(local_comm_id);
        }
    }

    /// The table of CM connections the keeper reads should this process die.
    fn cm_table(&self) -> Option<&crate::portshare::ConnTable> {
        let sh = &self.h.shared;
        let k = sh._keeper.as_ref()?;
        sh.cm_table
            .get_or_init(|| crate::portshare::ConnTable::share_with(k).ok())
            .as_ref()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &DeviceConfig {
        &self.h.shared.cfg
    }

    /// GID table entry `index`, as rxe builds it: for an IPv4 device, index 0 is the
    /// link-local address made from the node GUID (the default GID, whose subnet prefix
    /// programs read as the fabric's, as libfabric does), which srdma peers reach through the
    /// IPv4 address it holds on UDP 4791 ([`Gid::ip`]), and index 1 the IPv4-mapped address
    /// (so `-g 1` means the same as on rxe); for IPv6, index 0 is the bound address.
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
        for s in st.slots() {
            attr.bad_pkey_cntr += s.qp.counters().bad_pkey;
            attr.qkey_viol_cntr += s.qp.counters().qkey_violations;
        }
        attr
    }

    /// Sends every ACK and response an application-driven receive held back for the
    /// application's next post or poll (see [`crate::Qp::post_send`]). For callers that know the
    /// application has left the data path for a while, e.g. to set up a connection: its
    /// peer should not wait for those ACKs until the progress thread steps in.
    pub fn flush_held_back(&self) {
        let mut st = self.lock();
        self.h.shared.flush_deferred(&mut st);
    }

    /// Device receive/transmit statistics.
    pub fn counters(&self) -> DeviceCounters {
        self.lock().counters()
    }

    /// The sum of every QP's transport counters (rxe's hw counters).
    pub fn qp_counters(&self) -> srdma_proto::Counters {
        let st = self.lock();
        let mut c = srdma_proto::Counters::default();
        for s in st.slots() {
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
            Arc::downgrade(&self.h.shared) as crate::cq::Dev,
        ))
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.lock().next_id()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.h.shared.lock()
    }

    pub(crate) fn alloc_qpn(&self, st: &mut State) -> Result<Qpn> {
        st.alloc_qpn()
            .map(Qpn::new)
            .ok_or(Error::Exhausted("QP numbers"))
    }

    pub(crate) fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.h, &other.h)
    }

    /// Attaches QP `qpn` to multicast group `ip` (see [`crate::Qp::attach_mcast`]).
    pub(crate) fn attach_group(
        &self,
        st: &mut State,
        qpn: u32,
        ip: std::net::Ipv4Addr,
    ) -> Result<()> {
        self.h.shared.attach_group(st, qpn, ip)
    }

    /// Detaches QP `qpn` from group `ip`; whether it was attached.
    pub(crate) fn detach_group(&self, st: &mut State, qpn: u32, ip: Option<IpAddr>) -> bool {
        self.h.shared.detach_group(st, qpn, ip)
    }

    /// Detaches QP `qpn` from every group (it is being destroyed).
    pub(crate) fn detach_all_groups(&self, st: &mut State, qpn: u32) {
        if st.has_groups() {
            self.h.shared.detach_group(st, qpn, None);
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
        let keys =
            self.dev
                .lock()
                .register_mr(self.id, region.addr(), len as u64, access, &region)?;
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
        let keys = self
            .dev
            .lock()
            .register_mr(self.id, iova, len as u64, access, &region)?;
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

/// What [`Mr::rereg`] changes (`ibv_rereg_mr`'s flags): each part that is set.
#[derive(Debug, Default)]
pub struct MrChange {
    /// `IBV_REREG_MR_CHANGE_PD`: the region's new protection domain (of the same device).
    pub pd: Option<Pd>,
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`: the caller's memory the region covers from now on:
    /// address, length, and the address work requests and peers use for its first byte.
    pub translation: Option<(*mut u8, usize, u64)>,
    /// `IBV_REREG_MR_CHANGE_ACCESS`: the region's new rights.
    pub access: Option<AccessFlags>,
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

    pub(crate) fn pd_ref(&self) -> &Pd {
        &self.pd
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
    ///
    /// Like [`Mr::with_bytes`], reading drives the device first.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.pd.dev.h.shared.drive_from_app(true);
        self.read_quietly(offset, dst)
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

    /// [`Mr::read`] without driving the device first: for the engine's own users (QP1's
    /// CM reads the MADs its CQ hook took in, holding its own lock, and must neither run
    /// the hooks again nor make the progress thread stand aside as a polling application
    /// does).
    pub(crate) fn read_quietly(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let _st = self.pd.dev.lock();
        // SAFETY: the device lock is held for the whole borrow, so the engine cannot write
        // these bytes concurrently, and no `&mut` to them exists.
        let b = unsafe { self.region.bytes() };
        let src = b
            .get(offset..offset.saturating_add(dst.len()))
            .ok_or_else(|| range_err(offset, dst.len(), b.len()))?;
        dst.copy_from_slice(src);
        Ok(())
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

impl Mr {
    /// `ibv_rereg_mr`: changes the region's protection domain, memory or rights in place.
    /// Its keys stay the same; work in flight against it when it changes fails with a
    /// protection error instead of touching the old memory. On an error nothing changed.
    ///
    /// # Safety
    /// With a translation, the caller keeps the new range mapped as [`Pd::reg_user_mr`]
    /// requires, until the region is dropped or changed again.
    pub unsafe fn rereg(&mut self, change: MrChange) -> Result<()> {
        let dev = &self.pd.dev;
        dev.check_alive()?;
        if let Some(pd) = &change.pd {
            if !pd.dev.same(dev) {
                return Err(Error::InvalidArgument(
                    "the new PD belongs to another device".into(),
                ));
            }
        }
        let region = match change.translation {
            Some((addr, len, iova)) => {
                let ptr = std::ptr::NonNull::new(addr)
                    .ok_or_else(|| Error::InvalidArgument("NULL address".into()))?;
                if (addr as usize).checked_add(len).is_none()
                    || iova.checked_add(len as u64).is_none()
                {
                    return Err(Error::InvalidArgument(
                        "the range wraps around the address space".into(),
                    ));
                }
                // SAFETY: the caller's contract is `Region::foreign`'s.
                Some((Arc::new(unsafe { Region::foreign(ptr, len) }), iova))
            }
            None => None,
        };
        let range = region.as_ref().map(|(r, iova)| (*iova, r.len() as u64));
        let (region, iova) = region.unwrap_or_else(|| (Arc::clone(&self.region), self.iova));
        let info = dev.lock().reregister_mr(
            &self.keys,
            change.pd.as_ref().map(|p| p.id),
            range,
            change.access,
            &region,
        )?;
        self.keys = info.keys;
        self.region = region;
        self.iova = iova;
        if let Some(pd) = change.pd {
            self.pd = pd;
        }
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Windows still bound lose their binding (ibv_dereg_mr refuses before this).
        self.pd.dev.lock().deregister_mr(&self.keys);
    }
}
