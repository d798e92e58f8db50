//! Device and port limits (`ibv_device_attr` / `ibv_port_attr` values) and QP capacity checks.
//!
//! Defaults are rxe's (`linux:drivers/infiniband/sw/rxe/rxe_param.h`, cross-checked against
//! `ibv_devinfo -v` of the kernel 6.1 rxe in `../shared/rxe-lab/demo/01-devinfo.txt`), except
//! where a field's doc says otherwise, so srdma advertises what an rxe peer would.

use crate::qp::Mtu;

/// The limits a QP or region request is validated against, and that `ibv_query_device` /
/// `ibv_query_port` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest work queue (`max_qp_wr`). Default 0x4000 = 16384, the classic rxe value
    /// (`RXE_MAX_QP_WR`); newer rxe advertises 1 << 20, but a user-space stack pays memory per
    /// slot and 16 Ki outstanding WRs per queue is ample.
    pub max_qp_wr: u32,
    /// Largest gather list of a send WR (`max_send_sge`, rxe `RXE_MAX_SGE` 32).
    pub max_send_sge: u32,
    /// Largest scatter list of a receive WR (`max_recv_sge`, 32).
    pub max_recv_sge: u32,
    /// Largest scatter list of an RDMA READ (`max_sge_rd`, 32).
    pub max_sge_rd: u32,
    /// Largest inline payload. Default 512 = `RXE_MAX_SGE × sizeof(struct ib_sge)`, the value
    /// current rxe derives from its WQE size (`RXE_MAX_WQE_SIZE - sizeof(struct
    /// rxe_send_wqe)`); older rxe used 400.
    pub max_inline_data: u32,
    /// Largest completion queue (`max_cqe`). Default `(1 << 22) - 1` = 4194303, what mlx5
    /// devices advertise, not rxe's `(1 << RXE_MAX_LOG_CQE) - 1` = 32767: libfabric 1.17's
    /// RDM endpoint (`ofi_rxm` over verbs) sizes its CQ at (receive + send queue size) ×
    /// universe size = 65536 entries by default and does not clamp to `max_cqe`, so on rxe
    /// `fi_enable` fails with EINVAL. A CQ's memory grows with what it holds, not its size.
    pub max_cqe: u32,
    /// Most memory regions (`max_mr`, 524287 on the lab's rxe).
    pub max_mr: u32,
    /// Largest memory region in bytes (`max_mr_size`, unlimited).
    pub max_mr_size: u64,
    /// Most outstanding RDMA READ / atomic requests a QP accepts as responder
    /// (`max_qp_rd_atom`, 128): the bound of `max_dest_rd_atomic`.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA READ / atomic requests a QP issues as initiator
    /// (`max_qp_init_rd_atom`, 128): the bound of `max_rd_atomic`.
    pub max_qp_init_rd_atom: u32,
    /// Largest shared receive queue (`max_srq_wr`; 0x4000 like `max_qp_wr`).
    pub max_srq_wr: u32,
    /// Largest scatter list of an SRQ WR (`max_srq_sge`, rxe 27).
    pub max_srq_sge: u32,
    /// Largest message (`max_msg_sz`). Default 2^31, current rxe's `RXE_PORT_MAX_MSG_SZ`; the
    /// kernel 6.1 rxe in the lab still reports 0x800000 (8 MiB).
    pub max_msg_sz: u64,
    /// Number of physical ports (rxe: 1). Valid port numbers are `1..=phys_port_cnt`.
    pub phys_port_cnt: u8,
    /// Largest path MTU the port supports (`max_mtu`, 4096).
    pub port_max_mtu: Mtu,
    /// The MTU the link currently allows (`active_mtu`; 1024 on a 1500-byte Ethernet, see
    /// [`Mtu::for_netdev_mtu`]). Advisory: `path_mtu` is checked against `port_max_mtu`, as rxe.
    pub port_active_mtu: Mtu,
    /// Entries in the P_Key table (`pkey_tbl_len`): 1, the default P_Key 0xFFFF at index 0.
    pub pkey_tbl_len: u16,
    /// Entries in the GID table (`gid_tbl_len`, rxe 1024); `sgid_index` must be below it.
    pub gid_tbl_len: u32,
    /// `local_ca_ack_delay` (rxe 15).
    pub local_ca_ack_delay: u8,
}

impl Default for DeviceLimits {
    fn default() -> Self {
        DeviceLimits {
            max_qp_wr: 0x4000,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_sge_rd: 32,
            max_inline_data: 512,
            max_cqe: (1 << 22) - 1,
            max_mr: crate::mr::MrTable::DEFAULT_MAX_MR,
            max_mr_size: u64::MAX,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_srq_wr: 0x4000,
            max_srq_sge: 27,
            max_msg_sz: 1 << 31,
            phys_port_cnt: 1,
            port_max_mtu: Mtu::Mtu4096,
            port_active_mtu: Mtu::Mtu1024,
            pkey_tbl_len: 1,
            gid_tbl_len: 1024,
            local_ca_ack_delay: 15,
        }
    }
}

/// The sizes of a QP's queues (`struct ibv_qp_cap`), requested at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter entries per receive WR (ignored with an SRQ).
    pub max_recv_sge: u32,
    /// Largest inline payload per send WR.
    pub max_inline_data: u32,
}

/// A QP capacity above the device's limit (`ibv_create_qp` fails with EINVAL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapsError {
    /// One field exceeds its limit.
    #[error("{field} = {value} exceeds the device limit {max}")]
    TooLarge {
        /// The `ibv_qp_cap` field, e.g. `"max_send_wr"`.
        field: &'static str,
        /// The requested value.
        value: u32,
        /// The limit.
        max: u32,
    },
}

impl QpCaps {
    /// Checks every field against `limits`, in rxe's order (`rxe_qp.c rxe_qp_chk_cap`):
    /// send WRs, send SGEs, then — only without an SRQ — receive WRs and SGEs, then inline data.
    /// Zero is allowed everywhere (a send-only or receive-only QP).
    pub fn validate(&self, limits: &DeviceLimits, has_srq: bool) -> Result<(), CapsError> {
        let check = |field: &'static str, value: u32, max: u32| {
            if value > max {
                Err(CapsError::TooLarge { field, value, max })
            } else {
                Ok(())
            }
        };
        check("max_send_wr", self.max_send_wr, limits.max_qp_wr)?;
        check("max_send_sge", self.max_send_sge, limits.max_send_sge)?;
        if !has_srq {
            check("max_recv_wr", self.max_recv_wr, limits.max_qp_wr)?;
            check("max_recv_sge", self.max_recv_sge, limits.max_recv_sge)?;
        }
        check(
            "max_inline_data",
            self.max_inline_data,
            limits.max_inline_data,
        )
    }
}
