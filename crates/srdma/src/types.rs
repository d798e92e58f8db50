//! Plain types the engine, the statistics files and the device API share: a GID, the GSO
//! setting and the device counters. A leaf: it uses nothing else of the crate.

use std::net::IpAddr;

/// Use of UDP generic segmentation offload (`UDP_SEGMENT`) for runs of same-sized packets.
///
/// One GSO message crosses the stack as one buffer and is cut into datagrams where the path
/// needs it. IPv6 has no ID field, so the ICRC of every datagram is the same wherever it is
/// cut. An IPv4 datagram's ICRC covers the IP ID, and the kernel numbers the datagrams of a
/// buffer sent with ID 0 as 0, 1, 2, … (seen on the rxe lab's bridge, where the sending host
/// cuts it): the engine computes each datagram's ICRC for the ID it will carry
/// (`icrc::ipv4_icrc_with_ident`), so the datagrams are valid for kernel rxe (checked in the
/// lab: no rxe retries or sequence errors) and for srdma receivers, which solve for the ID.
/// A socket that refuses a GSO send (EIO, EINVAL: no segmentation on that path) makes the
/// device send one datagram per send from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gso {
    /// IPv6 peers and this host's addresses; an IPv4 peer elsewhere once a probe showed its
    /// path takes cut GSO messages (the default). The probe: ahead of an RC QP's first
    /// message to (or answer from) a new peer address, two copies of a duplicate request
    /// (a SEND without payload at a PSN the peer has seen) go as one GSO message; the peer
    /// must ACK each. Two ACKs verify the path; one, twice running, or no answer after five
    /// tries refuse it (one datagram per send). Until verified, one datagram per send.
    /// Counted in [`DeviceCounters::gso_paths_verified`] and `gso_paths_refused`.
    #[default]
    Auto,
    /// Every peer, unverified (`SRDMA_GSO=always`).
    Always,
    /// Only IPv6 peers and IPv4 peers on this host (loopback or a local address): for paths
    /// whose segmentation gives every datagram of a buffer the same IPv4 ID (`SRDMA_GSO=local`).
    Local,
    /// Never: one datagram per send (`SRDMA_GSO=never`).
    Never,
}

/// When a READ response to a process of this host leaves its payload in the responder's
/// memory for the requester to pull with `process_vm_readv` — one copy, made by the
/// requester, instead of one by each side through the ring (counted in
/// [`DeviceCounters::tx_shm_pulls`] and `rx_shm_pulled`). Only where the requester may
/// read the responder's memory (tried when their link is made: same user, no Yama or
/// seccomp refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShmPull {
    /// When the processes a device talks to through rings, and its own, outnumber the
    /// host's CPUs (the default). A pull saves a copy, but the requester makes it alone,
    /// and the kernel's copy with its page pinning costs more than a `memcpy`: where every
    /// process has a core of its own, the two copies made side by side move more (a 2-rank
    /// broadcast on 2 cores: 2,159–2,246 MiB/s pulled against 2,693–2,905 copied); where
    /// processes wait for cores, the work saved is what counts (3 ranks on 2 cores:
    /// 1,739–1,816 MiB/s against 1,364–1,630).
    #[default]
    Crowded,
    /// Whenever the requester may (`SRDMA_SHM_PULL=1`).
    Always,
    /// Never: this device neither pulls nor leaves payloads to be pulled
    /// (`SRDMA_SHM_PULL=0`).
    Never,
}

impl ShmPull {
    /// The setting `$SRDMA_SHM_PULL` names ([`ShmPull::Crowded`] when unset or unknown).
    pub fn from_env() -> ShmPull {
        match std::env::var("SRDMA_SHM_PULL").as_deref() {
            Ok("1") => ShmPull::Always,
            Ok("0") => ShmPull::Never,
            _ => ShmPull::Crowded,
        }
    }
}

impl Gso {
    /// The setting `$SRDMA_GSO` names ([`Gso::Auto`] when unset or unknown).
    pub(crate) fn from_env() -> Gso {
        match std::env::var("SRDMA_GSO").as_deref() {
            Ok("always" | "1" | "on") => Gso::Always,
            Ok("local") => Gso::Local,
            Ok("never" | "0" | "off") => Gso::Never,
            _ => Gso::Auto,
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

    /// The IP address a GID stands for: the IPv4 address of an IPv4-mapped GID or of the
    /// link-local GID an IPv4 srdma device on port 4791 has at index 0 (see
    /// [`Gid::srdma_link_local_ipv4`]), else the GID as an IPv6 address.
    #[inline]
    pub fn ip(&self) -> IpAddr {
        let v6 = std::net::Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped().or_else(|| self.srdma_link_local_ipv4()) {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The IPv4 address inside the link-local GID an IPv4 srdma device on the RoCEv2 port has
    /// at index 0 (`fe80::2aa:bbff:fecc:ddb7` for `aa.bb.cc.dd`, from its node GUID): rxe's
    /// GID 0 is the interface's IPv6 link-local address, reachable on the link, and programs
    /// address peers by it (libfabric's verbs `FI_EP_DGRAM` names an endpoint by GID index 0
    /// unless `FI_VERBS_GID_IDX` says otherwise); srdma's is reachable through the address
    /// it was made from. None for any other GID, including the MAC-derived link-local GID of
    /// an rxe peer unless its MAC reads `00:aa:bb:cc:dd:b7`.
    pub fn srdma_link_local_ipv4(&self) -> Option<std::net::Ipv4Addr> {
        let g = &self.0;
        let shape = g[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0]
            && g[8] == 0x02
            && g[11..13] == [0xff, 0xfe]
            && g[15] == (srdma_wire::ROCEV2_PORT & 0xff) as u8;
        shape.then(|| std::net::Ipv4Addr::new(g[9], g[10], g[13], g[14]))
    }
}

impl std::fmt::Display for Gid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As `ibv_devinfo -v` prints RoCE v2 GIDs: inet_ntop(AF_INET6).
        std::net::Ipv6Addr::from(self.0).fmt(f)
    }
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
    /// Peer addresses whose path the GSO probe found to take cut GSO messages.
    pub gso_paths_verified: u64,
    /// Peer addresses whose path rejected the second datagram of a cut GSO message (or
    /// never answered the probe): sent one datagram per send since.
    pub gso_paths_refused: u64,
    /// Packets sent to devices of this host through shared memory instead of UDP (not in
    /// `tx_datagrams`).
    pub tx_shm_packets: u64,
    /// Packets received from devices of this host through shared memory (not in
    /// `rx_datagrams`).
    pub rx_shm_packets: u64,
    /// Packets dropped because the peer's ring was full (the transport retransmits).
    pub tx_shm_full: u64,
    /// Shared-memory links this device made to peers of this host.
    pub shm_links_out: u64,
    /// Shared-memory links peers of this host made to this device.
    pub shm_links_in: u64,
    /// Shared-memory links refused (another user, a malformed offer) or ended because the
    /// peer broke the ring's rules.
    pub shm_refused: u64,
    /// READ responses sent through shared memory with their payload left in this process's
    /// memory, for the requester to pull (one copy instead of two).
    pub tx_shm_pulls: u64,
    /// READ responses received that way whose payload this device pulled.
    pub rx_shm_pulled: u64,
    /// Pulled READ responses dropped (their record did not check) or whose payload could
    /// not be read (the responder's process or region went: the READ fails).
    pub rx_shm_pull_failed: u64,
}

impl DeviceCounters {
    /// Every counter with its name, in declaration order (for devinfo and stats files).
    pub fn entries(&self) -> [(&'static str, u64); 22] {
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
            ("gso_paths_verified", self.gso_paths_verified),
            ("gso_paths_refused", self.gso_paths_refused),
            ("tx_shm_packets", self.tx_shm_packets),
            ("rx_shm_packets", self.rx_shm_packets),
            ("tx_shm_full", self.tx_shm_full),
            ("shm_links_out", self.shm_links_out),
            ("shm_links_in", self.shm_links_in),
            ("shm_refused", self.shm_refused),
            ("tx_shm_pulls", self.tx_shm_pulls),
            ("rx_shm_pulled", self.rx_shm_pulled),
            ("rx_shm_pull_failed", self.rx_shm_pull_failed),
        ]
    }
}

/// Which packet driver carried a QP's packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Path {
    /// It sent nothing yet.
    #[default]
    None,
    /// UDP (the kernel's stack): off-host peers, kernel rxe, `SRDMA_SHM=0`.
    Udp,
    /// Shared memory: a device of this host, same network namespace and user.
    SharedMemory,
}

impl Path {
    /// `none`, `udp` or `shm`.
    pub fn name(self) -> &'static str {
        match self {
            Path::None => "none",
            Path::Udp => "udp",
            Path::SharedMemory => "shm",
        }
    }
}
