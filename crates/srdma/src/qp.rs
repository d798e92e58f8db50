//! Queue pairs and shared receive queues.

use srdma_proto::qp::AhAttr;
use srdma_proto::{
    AccessFlags, AttrMask, Mtu, QpAttr, QpCaps, QpConfig, QpState, QpType, RecvWr, SendWr,
    Srq as ProtoSrq,
};
use srdma_wire::{Psn, Qpn};

use crate::cq::Cq;
use crate::device::{Device, Pd};
use crate::engine::{QpSlot, Ring};
use crate::error::{Error, Result};
use crate::types::Gid;

pub(crate) mod xrc;

/// Enhanced connection establishment options (`struct ibv_ece`): how two ends of a
/// connection agree on what goes beyond the IBTA, carried in the connection manager's REQ
/// and REP (IB CM: the vendor ID fields and the MAD's attribute modifier). srdma offers
/// [`Ece::SELECTIVE_REPEAT`] under [`Ece::SRDMA_VENDOR_ID`]; a peer that does not know it
/// (rxe, a NIC) answers with none, and both keep go-back-N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    /// The IEEE OUI of the vendor whose options these are (0: none).
    pub vendor_id: u32,
    /// The vendor's option bits.
    pub options: u32,
}

impl Ece {
    /// srdma's vendor ID: a locally administered OUI (the 0x02 bit of its first octet set,
    /// as no IEEE assignment is srdma's) spelling "SR".
    pub const SRDMA_VENDOR_ID: u32 = 0x02_5352;
    /// Option: selective repeat (the responder keeps what arrives out of order and reports
    /// it in SACKs; the requester resends only what is missing, and on its measured RTT).
    pub const SELECTIVE_REPEAT: u32 = 1;

    /// What srdma offers.
    pub const fn srdma() -> Ece {
        Ece {
            vendor_id: Ece::SRDMA_VENDOR_ID,
            options: Ece::SELECTIVE_REPEAT,
        }
    }

    /// What `self` (offered here) and `peer` (offered or accepted there) agree on: the
    /// common options of one vendor, or none.
    pub const fn agree(self, peer: Ece) -> Ece {
        if self.vendor_id == 0 || self.vendor_id != peer.vendor_id {
            return Ece {
                vendor_id: 0,
                options: 0,
            };
        }
        Ece {
            vendor_id: self.vendor_id,
            options: self.options & peer.options,
        }
    }

    /// Whether these options include srdma's selective repeat.
    pub const fn selective_repeat(&self) -> bool {
        self.vendor_id == Ece::SRDMA_VENDOR_ID && self.options & Ece::SELECTIVE_REPEAT != 0
    }

    /// Whether QPs offer srdma's options: true unless `SRDMA_ECE=0`.
    pub fn enabled_by_env() -> bool {
        std::env::var("SRDMA_ECE").map_or(true, |v| v != "0")
    }
}

/// How to create a QP (`ibv_qp_init_attr` plus the INIT attributes).
#[derive(Debug, Clone)]
pub struct QpInit {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Where send completions go.
    pub send_cq: Cq,
    /// Where receive completions go.
    pub recv_cq: Cq,
    /// Queue capacities.
    pub caps: QpCaps,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Receive from this SRQ instead of the QP's own receive queue.
    pub srq: Option<Srq>,
    /// Remote access the QP allows (RC/UC): REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC.
    pub access: AccessFlags,
    /// UD: the QP's Q_Key.
    pub qkey: u32,
}

impl QpInit {
    /// An RC/UC/UD QP with modest queues, all remote access allowed, Q_Key 0x11111111
    /// (ibv_ud_pingpong's).
    pub fn new(qp_type: QpType, send_cq: &Cq, recv_cq: &Cq) -> QpInit {
        QpInit {
            qp_type,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            caps: QpCaps {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
            sq_sig_all: false,
            srq: None,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qkey: 0x1111_1111,
        }
    }
}

/// What the other end of a connection announces (the exchange ibv_rc_pingpong and the CM do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    /// Its QP number.
    pub qpn: Qpn,
    /// Its first send PSN (our receive PSN).
    pub psn: Psn,
    /// Its GID.
    pub gid: Gid,
    /// Its device's UDP port: 4791 for every standard RoCE peer; another port lets several
    /// srdma devices share one address.
    pub port: u16,
}

impl RemoteQp {
    /// A standard RoCE peer (UDP port 4791).
    pub fn new(qpn: Qpn, psn: Psn, gid: Gid) -> RemoteQp {
        RemoteQp {
            qpn,
            psn,
            gid,
            port: crate::ROCEV2_PORT,
        }
    }
}

/// Connection parameters for RTR/RTS, with ibv_rc_pingpong's values as defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// Path MTU.
    pub mtu: Mtu,
    /// Our first send PSN.
    pub sq_psn: Psn,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout; 14 ≈ 67 ms).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry: u8,
    /// RNR NAK timer code we ask peers to wait (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// READ/atomic outstanding as requester.
    pub max_rd_atomic: u8,
    /// READ/atomic outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
}

impl ConnectParams {
    /// ibv_rc_pingpong's attributes at `mtu` starting at `sq_psn`.
    pub fn new(mtu: Mtu, sq_psn: Psn) -> ConnectParams {
        ConnectParams {
            mtu,
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            hop_limit: 64,
        }
    }
}

/// A queue pair. Cheap to clone; dropping the last handle destroys the QP.
#[derive(Debug, Clone)]
pub struct Qp {
    inner: std::sync::Arc<QpInner>,
}

#[derive(Debug)]
struct QpInner {
    dev: Device,
    qpn: Qpn,
    qp_type: QpType,
    _pd: Pd,
    _cqs: (Cq, Cq),
    _srq: Option<Srq>,
    /// An XRC target's domain.
    _xrcd: Option<xrc::Xrcd>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let mut st = self.dev.lock();
        // ACKs an application-driven receive held back still go out, and the last once
        // more: the peer's last message must not be left unacknowledged because this side
        // destroyed its QP.
        self.dev.h.shared.last_words(&mut st, self.qpn.value());
        self.dev.detach_all_groups(&mut st, self.qpn.value());
        st.remove_qp(self.qpn);
    }
}

impl Pd {
    /// `ibv_create_qp` then RESET→INIT: a QP ready to take receives and be connected.
    pub fn create_qp(&self, init: &QpInit) -> Result<Qp> {
        self.create_qp_in(init, true)
    }

    /// `ibv_create_qp` alone: the QP starts in RESET and every transition, RESET→INIT
    /// included, is the caller's (`init.access` and `init.qkey` are then unused).
    pub fn create_qp_reset(&self, init: &QpInit) -> Result<Qp> {
        self.create_qp_in(init, false)
    }

    /// The GSI QP (QP1), on which IB CM MADs travel: a UD QP numbered 1 in INIT with the GSI
    /// Q_Key, one per device. On a port shared with other processes, the port keeper
    /// forwards it the MADs that concern this process (see `portshare`).
    pub fn create_gsi_qp(&self, init: &QpInit) -> Result<Qp> {
        if init.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument("the GSI QP is a UD QP".into()));
        }
        let mut init = init.clone();
        init.qkey = srdma_wire::deth::GSI_QKEY;
        let qp = self.create_qp_numbered(&init, true, Some(Qpn::GSI))?;
        self.device().enable_cm_forwarding();
        Ok(qp)
    }

    fn create_qp_in(&self, init: &QpInit, to_init: bool) -> Result<Qp> {
        self.create_qp_numbered(init, to_init, None)
    }

    fn create_qp_numbered(&self, init: &QpInit, to_init: bool, number: Option<Qpn>) -> Result<Qp> {
        let dev = self.device();
        dev.check_alive()?;
        if let Some(srq) = &init.srq {
            if !srq.inner.dev.same(dev) {
                return Err(Error::WrongDevice);
            }
        }
        let limits = dev.config().limits.clone();
        let mut st = dev.lock();
        let qpn = match number {
            Some(n) if st.has_qp(n.value()) => {
                return Err(Error::InvalidArgument(format!("QP {n} exists already")));
            }
            Some(n) => n,
            None => dev.alloc_qpn(&mut st)?,
        };
        let cfg = QpConfig {
            qpn,
            qp_type: init.qp_type,
            pd: self.id,
            caps: init.caps,
            sq_sig_all: init.sq_sig_all,
            uses_srq: init.srq.is_some(),
            port_mtu: dev.config().mtu,
        };
        let mut qp = srdma_proto::Qp::new(cfg, &limits)?;
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            ..QpAttr::default()
        };
        let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        if init.qp_type == QpType::Ud {
            attr.qkey = init.qkey;
            mask |= AttrMask::QKEY;
        } else {
            attr.qp_access_flags = init.access;
            mask |= AttrMask::ACCESS_FLAGS;
        }
        if to_init {
            qp.modify(&attr, mask, &limits)?;
        }
        st.add_qp(
            qpn.value(),
            QpSlot::new(
                qp,
                init.send_cq.clone(),
                init.recv_cq.clone(),
                init.srq.as_ref().map(|s| s.inner.id),
            ),
        );
        drop(st);
        Ok(Qp {
            inner: std::sync::Arc::new(QpInner {
                dev: dev.clone(),
                qpn,
                qp_type: init.qp_type,
                _pd: self.clone(),
                _cqs: (init.send_cq.clone(), init.recv_cq.clone()),
                _srq: init.srq.clone(),
                _xrcd: None,
            }),
        })
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let dev = self.device();
        let l = &dev.config().limits;
        if max_wr == 0 || max_wr > l.max_srq_wr || max_sge > l.max_srq_sge {
            return Err(Error::InvalidArgument(format!(
                "SRQ of {max_wr} WRs x {max_sge} SGEs above the device limits"
            )));
        }
        let id = dev.next_id();
        dev.lock().add_srq(id, ProtoSrq::new(max_wr, max_sge));
        Ok(Srq {
            inner: std::sync::Arc::new(SrqInner {
                dev: dev.clone(),
                id,
                _xrcd: None,
            }),
        })
    }
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.inner.qpn
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// Which driver carried the last packet this QP sent: UDP, or shared memory to a
    /// device of this host (see [`crate::DeviceConfig::shm`]).
    pub fn path(&self) -> crate::Path {
        let st = self.inner.dev.lock();
        st.slot(self.inner.qpn.value())
            .map_or(crate::Path::None, |s| s.path)
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.with(|s| s.qp.state())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> QpAttr {
        self.with(|s| *s.qp.attr())
    }

    /// The QP's transport counters.
    pub fn counters(&self) -> srdma_proto::Counters {
        self.with(|s| *s.qp.counters())
    }

    /// Where the QP's congestion control stands: window, pacing rate, RTT, and what it
    /// reacted to (losses, delay, timeouts, CNPs).
    pub fn congestion(&self) -> crate::CcStats {
        self.with(|s| s.qp.congestion())
    }

    /// `ibv_query_ece`: the enhanced connection establishment options of this QP — what it
    /// offers before [`Qp::set_ece`] (srdma's selective repeat, for an RC QP, unless
    /// `SRDMA_ECE=0`), what was agreed after.
    pub fn query_ece(&self) -> Ece {
        let offer = self.offer();
        self.with(|s| s.ece.unwrap_or(offer))
    }

    /// `ibv_set_ece`: the peer's options (its REQ, REP, or [`Qp::query_ece`] exchanged out
    /// of band), before the QP reaches RTS; returns what is agreed: the options both offer
    /// — srdma's selective repeat when both ends are srdma and both offered it. Anything
    /// else (another vendor's options, none) agrees on nothing and leaves the IBTA's
    /// go-back-N, as toward rxe or a NIC.
    ///
    /// Errors: [`Error::InvalidArgument`] once the QP is in RTS or later (the peer's
    /// responder may already expect one way of recovery).
    pub fn set_ece(&self, ece: Ece) -> Result<Ece> {
        let offer = self.offer();
        let agreed = offer.agree(ece);
        self.with(|s| {
            if !matches!(s.qp.state(), QpState::Reset | QpState::Init | QpState::Rtr) {
                return Err(Error::InvalidArgument(format!(
                    "ECE is set before RTS (QP {} is in {:?})",
                    s.qp.qpn(),
                    s.qp.state()
                )));
            }
            // Another vendor's options are never echoed back as if agreed (a NIC would then
            // speak its own protocol to this QP): nothing is agreed with it.
            s.ece = Some(agreed);
            s.qp.set_reliability(if agreed.selective_repeat() {
                srdma_proto::Reliability::SelectiveRepeat
            } else {
                srdma_proto::Reliability::GoBackN
            });
            Ok(agreed)
        })
    }

    /// Whether the QP recovers losses by srdma's selective repeat (agreed through ECE with
    /// an srdma peer, [`Qp::set_ece`]) rather than the IBTA's go-back-N.
    pub fn selective_repeat(&self) -> bool {
        self.with(|s| s.qp.reliability() == srdma_proto::Reliability::SelectiveRepeat)
    }

    /// What this QP offers: selective repeat for an RC QP, unless turned off.
    fn offer(&self) -> Ece {
        if self.inner.qp_type == QpType::Rc && Ece::enabled_by_env() {
            Ece::srdma()
        } else {
            Ece::default()
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut QpSlot) -> R) -> R {
        let mut st = self.inner.dev.lock();
        let slot = st
            .slot_mut(self.inner.qpn.value())
            .expect("a live Qp handle keeps its slot");
        f(slot)
    }

    /// `ibv_modify_qp`, checked against the IBTA table: a wrong transition or a missing
    /// attribute is an error naming it.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let dev = &self.inner.dev;
        let limits = dev.config().limits.clone();
        let mut st = dev.lock();
        dev.h
            .shared
            .modify_qp(&mut st, self.inner.qpn.value(), attr, mask, &limits)
    }

    /// `ibv_attach_mcast`: from the next datagram on, this UD QP gets a copy of every
    /// datagram sent to QPN 0xFFFFFF at IPv4 multicast group `gid`, named by its
    /// IPv4-mapped GID (`::ffff:239.1.1.1`, how rdma_cm names it on RoCEv2). The device
    /// joins the group on its interface for its first QP in it and leaves it after its
    /// last. Attaching twice is no error, as with rxe. IPv6 groups are not supported (kernel
    /// rdma_cm does not join them on RoCEv2 either).
    ///
    /// Errors: [`Error::InvalidArgument`] for a QP that is not UD, a device that is not
    /// IPv4 or a GID that is no IPv4 multicast address; [`Error::Exhausted`] beyond rxe's
    /// limits ([`DeviceAttr::max_mcast_grp`](crate::DeviceAttr) groups,
    /// `max_mcast_qp_attach` QPs per group); [`Error::Io`] when the kernel refuses the
    /// membership.
    pub fn attach_mcast(&self, gid: Gid) -> Result<()> {
        let group = self.mcast_group(gid)?;
        let mut st = self.inner.dev.lock();
        self.inner
            .dev
            .attach_group(&mut st, self.inner.qpn.value(), group)
    }

    /// `ibv_detach_mcast`: undoes [`Qp::attach_mcast`]. Errors: [`Error::InvalidArgument`]
    /// when the QP is not attached to `gid`.
    pub fn detach_mcast(&self, gid: Gid) -> Result<()> {
        let group = self.mcast_group(gid)?;
        let mut st = self.inner.dev.lock();
        if self
            .inner
            .dev
            .detach_group(&mut st, self.inner.qpn.value(), Some(group.into()))
        {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "QP {} is not attached to multicast group {gid}",
                self.inner.qpn
            )))
        }
    }

    /// Whether the QP is attached to some multicast group (`ibv_destroy_qp` refuses to
    /// destroy such a QP with EBUSY, as the kernel does; dropping the last handle detaches it).
    pub fn is_attached(&self) -> bool {
        let st = self.inner.dev.lock();
        crate::engine::Shared::in_group(&st, self.inner.qpn.value())
    }

    /// The IPv4 group of multicast GID `gid`, checked for this QP.
    fn mcast_group(&self, gid: Gid) -> Result<std::net::Ipv4Addr> {
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument(format!(
                "only UD QPs join multicast groups, QP {} is {:?}",
                self.inner.qpn, self.inner.qp_type
            )));
        }
        match gid.ip() {
            std::net::IpAddr::V4(g) if g.is_multicast() => Ok(g),
            _ => Err(Error::InvalidArgument(format!(
                "{gid} is no IPv4 multicast group"
            ))),
        }
    }

    /// The protection domain the QP was created in.
    pub fn pd(&self) -> &Pd {
        &self.inner._pd
    }

    /// The device the QP lives on.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// RC/UC: INIT → RTR → RTS towards `remote` (what ibv_rc_pingpong's `pp_connect_ctx` does).
    pub fn connect(&self, remote: &RemoteQp, p: &ConnectParams) -> Result<()> {
        if self.inner.qp_type == QpType::Ud {
            return Err(Error::InvalidArgument(
                "UD QPs are not connected: use activate".into(),
            ));
        }
        check_family(&self.inner.dev, remote.gid)?;
        let [(rtr, rtr_mask), (rts, rts_mask)] = connect_attrs(self.inner.qp_type, remote, p);
        self.modify(&rtr, rtr_mask)?;
        self.modify(&rts, rts_mask)
    }

    /// UD: INIT → RTR → RTS with send PSN `sq_psn`.
    pub fn activate(&self, sq_psn: Psn) -> Result<()> {
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::InvalidArgument("connected QPs need connect".into()));
        }
        let mut attr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        self.modify(&attr, AttrMask::STATE)?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = sq_psn;
        self.modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN)
    }

    /// `ibv_post_send`, then the doorbell: the packets go out from the caller's thread.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.post_send_batch(std::iter::once(wr))
    }

    /// Posts several send WRs with one doorbell. Stops at the first refused WR (the ones
    /// before it are posted), like `ibv_post_send`'s `bad_wr`.
    pub fn post_send_batch(&self, wrs: impl IntoIterator<Item = SendWr>) -> Result<()> {
        self.post_send_ringing(wrs, Ring::Now)
    }

    /// Posts a send WR without ringing the doorbell while the application polls this
    /// device: its packets leave at the application's next CQ poll (or `post_send` to this
    /// QP), together with everything else posted so — one `sendmmsg` for many QPs, and one
    /// UDP GSO message for each run of equal-sized datagrams to one peer. An event loop
    /// that answers many connections and then polls (a server) sends its replies in one
    /// system call instead of one each.
    ///
    /// Should the application neither poll nor post again, the progress thread sends them
    /// once it takes over the device, at most `APP_GRACE` (1 ms) after the last poll. An
    /// application that has not polled for that long gets the doorbell at once, as with
    /// [`Qp::post_send`]. Errors are `post_send`'s.
    pub fn post_send_deferred(&self, wr: SendWr) -> Result<()> {
        self.post_send_ringing(std::iter::once(wr), Ring::Deferred)
    }

    fn post_send_ringing(&self, wrs: impl IntoIterator<Item = SendWr>, ring: Ring) -> Result<()> {
        let dev = &self.inner.dev;
        dev.check_alive()?;
        let mut st = dev.lock();
        // A UD destination this device cannot reach would otherwise "complete" unsent.
        let checked = wrs.into_iter().map(|wr| match &wr.ud {
            Some(ud) => check_family(dev, Gid(ud.ah.dgid)).map(|()| wr),
            None => Ok(wr),
        });
        dev.h
            .shared
            .post_send(&mut st, self.inner.qpn.value(), checked, ring)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.post_recv_ringing(wr, Ring::Now)
    }

    /// `ibv_post_recv` that leaves what a receive held back for this QP's application (the
    /// ACK of what came) for the application's next poll or post, while it polls this
    /// device: [`Qp::post_recv`] sends it at once (unless the QP's application is known to
    /// answer with a send right after), one `sendmmsg` per QP. An event loop that takes many
    /// connections' messages, replenishes their receives and answers them next (the
    /// rsockets preload) sends all ACKs together at its next poll, behind its answers. As
    /// with [`Qp::post_send_deferred`], the progress thread sends them should the polls stop.
    pub fn post_recv_deferred(&self, wr: RecvWr) -> Result<()> {
        self.post_recv_ringing(wr, Ring::Deferred)
    }

    fn post_recv_ringing(&self, wr: RecvWr, ring: Ring) -> Result<()> {
        let dev = &self.inner.dev;
        dev.check_alive()?;
        let mut st = dev.lock();
        dev.h
            .shared
            .post_recv(&mut st, self.inner.qpn.value(), wr, ring)
    }
}

/// A shared receive queue (`ibv_srq`). Cheap to clone; dropping the last handle (QPs using
/// it hold one) destroys it.
#[derive(Debug, Clone)]
pub struct Srq {
    inner: std::sync::Arc<SrqInner>,
}

#[derive(Debug)]
struct SrqInner {
    dev: Device,
    id: u32,
    /// An XRC SRQ's domain.
    _xrcd: Option<xrc::Xrcd>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let mut st = self.dev.lock();
        st.remove_srq(self.id);
    }
}

/// Refuses a peer address of the other IP family: this device's socket cannot reach it.
fn check_family(dev: &Device, gid: Gid) -> Result<()> {
    if gid.ip().is_ipv4() == dev.config().addr.is_ipv4() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "GID {gid} is not reachable from a device on {}",
            dev.config().addr
        )))
    }
}

impl Srq {
    /// How many handles share this SRQ: this one, its clones, and one per QP using it.
    /// More than one means it is in use.
    pub fn users(&self) -> usize {
        std::sync::Arc::strong_count(&self.inner)
    }

    /// The SRQ's id, unique among the device's objects (named by
    /// [`crate::AsyncEvent::SrqLimitReached`]).
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): once a receive leaves
    /// fewer than `limit` WQEs posted, the device raises
    /// [`crate::AsyncEvent::SrqLimitReached`] and disarms the limit; 0 disarms it. A limit
    /// above the SRQ's size is refused, as by rxe.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        let mut st = self.inner.dev.lock();
        let srq = st
            .srq_mut(self.inner.id)
            .ok_or(Error::InvalidArgument("SRQ destroyed".into()))?;
        if limit > srq.max_wr() {
            return Err(Error::InvalidArgument(format!(
                "SRQ limit {limit} above its {} WRs",
                srq.max_wr()
            )));
        }
        srq.set_limit(limit);
        Ok(())
    }

    /// The armed limit; 0 when none is (never set, or the event fired).
    pub fn limit(&self) -> u32 {
        self.inner
            .dev
            .lock()
            .srq(self.inner.id)
            .map_or(0, |s| s.limit())
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let mut st = self.inner.dev.lock();
        let srq = st
            .srq_mut(self.inner.id)
            .ok_or(Error::InvalidArgument("SRQ destroyed".into()))?;
        Ok(srq.post(wr)?)
    }

    /// Posted receive WQEs.
    pub fn len(&self) -> usize {
        self.inner
            .dev
            .lock()
            .srq(self.inner.id)
            .map_or(0, |s| s.len())
    }

    /// True when none is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An address vector for UD sends to `gid` (`ibv_create_ah`).
pub fn ah(gid: Gid) -> AhAttr {
    AhAttr {
        dgid: gid.0,
        ..AhAttr::default()
    }
}

/// The attributes [`Qp::connect`] gives an RC or UC QP of `qp_type` for RTR and for RTS,
/// with their masks (for a caller that moves the QP itself: `rdma_init_qp_attr`).
pub fn connect_attrs(
    qp_type: QpType,
    remote: &RemoteQp,
    p: &ConnectParams,
) -> [(QpAttr, AttrMask); 2] {
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: p.mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: p.max_dest_rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        ah_attr: AhAttr {
            dgid: remote.gid.0,
            hop_limit: p.hop_limit,
            udp_dport: remote.port,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let mut rtr =
        AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    let mut rts = AttrMask::STATE | AttrMask::SQ_PSN;
    if qp_type == QpType::Rc {
        rtr |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        rts |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    }
    let rtr_attr = attr;
    attr.qp_state = QpState::Rts;
    attr.sq_psn = p.sq_psn;
    attr.timeout = p.timeout;
    attr.retry_cnt = p.retry_cnt;
    attr.rnr_retry = p.rnr_retry;
    attr.max_rd_atomic = p.max_rd_atomic;
    [(rtr_attr, rtr), (attr, rts)]
}
