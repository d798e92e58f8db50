//! Memory and QP access rights: `ibv_access_flags`, bit for bit.
//!
//! The same flag set serves two purposes, as in verbs: the rights of a memory region
//! (`ibv_reg_mr(..., access)`) and the remote operations a QP's responder accepts
//! (`ibv_qp_attr.qp_access_flags`). Only memory registration carries the IBTA rule that remote
//! write and remote atomic imply local write; see [`AccessFlags::validate_for_mr`].

use crate::flags::bit_flags;

bit_flags! {
    /// Access rights, numbered as `enum ibv_access_flags` in rdma-core `libibverbs/verbs.h`.
    ///
    /// Local read access is implicit and always granted ("Local read access is always enabled
    /// for the MR", `ibv_reg_mr(3)`); every other right must be requested.
    pub struct AccessFlags: u32 {
        /// The local consumer may write the region (scatter targets, READ/atomic results).
        const LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA READ the region.
        const REMOTE_READ = 1 << 2;
        /// Remote peers may perform atomic operations on the region.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the region (`ibv_bind_mw`; see [`crate::mr`]).
        const MW_BIND = 1 << 4;
        /// Zero-based virtual addressing (memory windows only; not supported by srdma).
        const ZERO_BASED = 1 << 5;
        /// On-demand paging (not applicable: srdma regions are always resident).
        const ON_DEMAND = 1 << 6;
        /// Hint that the region is backed by huge pages (accepted and ignored).
        const HUGETLB = 1 << 7;
        /// Remote peers may FLUSH to global visibility (IBTA 1.5).
        const FLUSH_GLOBAL = 1 << 8;
        /// Remote peers may FLUSH to persistence (IBTA 1.5; not supported by srdma).
        const FLUSH_PERSISTENT = 1 << 9;
        /// Relaxed PCIe ordering: an optional hint, meaningless in software (accepted, ignored).
        const RELAXED_ORDERING = 1 << 20;
    }
}

/// Why a set of access flags cannot be used to register a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE: `ibv_reg_mr(3)` "If
    /// IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then IBV_ACCESS_LOCAL_WRITE
    /// must be set too"; the kernel's `ib_check_mr_access` returns EINVAL.
    #[error("{flags} requires LOCAL_WRITE (IBTA: remote write/atomic imply local write)")]
    RemoteWriteNeedsLocalWrite {
        /// The flags as requested.
        flags: AccessFlags,
    },
    /// Bits that are not part of `ibv_access_flags` at all (EINVAL).
    #[error("unknown access flag bits {bits:#x}")]
    UnknownBits {
        /// The unnamed bits.
        bits: u32,
    },
    /// A defined flag srdma does not implement (EOPNOTSUPP in the kernel).
    #[error("access flag {flag} is not supported")]
    Unsupported {
        /// The flag's name, e.g. `"MW_BIND"`.
        flag: &'static str,
    },
}

impl AccessFlags {
    /// The remote rights: the flags that make a region reachable by an R_Key.
    pub const REMOTE: AccessFlags = AccessFlags::REMOTE_WRITE
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC)
        .union(AccessFlags::FLUSH_GLOBAL)
        .union(AccessFlags::FLUSH_PERSISTENT);

    /// Flags srdma refuses at registration (EOPNOTSUPP): zero-based addressing, on-demand
    /// paging and persistent flush have no implementation.
    pub const UNSUPPORTED_FOR_MR: AccessFlags = AccessFlags::ZERO_BASED
        .union(AccessFlags::ON_DEMAND)
        .union(AccessFlags::FLUSH_PERSISTENT);

    /// True when the region has any remote right, i.e. its R_Key is meaningful (rxe sets
    /// `rkey = lkey` only then, `rxe_mr.c rxe_mr_init`).
    #[inline]
    pub const fn has_remote(self) -> bool {
        self.intersects(Self::REMOTE)
    }

    /// Checks flags for `ibv_reg_mr`, in the kernel's order (`ib_check_mr_access` in
    /// `include/rdma/ib_verbs.h`): the IBTA rule that REMOTE_WRITE or REMOTE_ATOMIC require
    /// LOCAL_WRITE (EINVAL), then unknown bits (EINVAL), then flags srdma does not implement
    /// (EOPNOTSUPP).
    pub fn validate_for_mr(self) -> Result<(), AccessError> {
        if self.intersects(Self::REMOTE_WRITE | Self::REMOTE_ATOMIC)
            && !self.contains(Self::LOCAL_WRITE)
        {
            return Err(AccessError::RemoteWriteNeedsLocalWrite { flags: self });
        }
        let unknown = self.unknown_bits();
        if unknown != 0 {
            return Err(AccessError::UnknownBits { bits: unknown });
        }
        if let Some(flag) = self.intersection(Self::UNSUPPORTED_FOR_MR).first_name() {
            return Err(AccessError::Unsupported { flag });
        }
        Ok(())
    }

    /// Checks a QP's `qp_access_flags`: any defined flag is accepted (applications commonly
    /// pass LOCAL_WRITE there too, and the kernel stores the value unchecked), unknown bits are
    /// refused. The LOCAL_WRITE rule does not apply: a QP may enable REMOTE_WRITE alone.
    pub fn validate_for_qp(self) -> Result<(), AccessError> {
        match self.unknown_bits() {
            0 => Ok(()),
            bits => Err(AccessError::UnknownBits { bits }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_matches_verbs_h() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::MW_BIND.bits(), 16);
        assert_eq!(AccessFlags::ZERO_BASED.bits(), 32);
        assert_eq!(AccessFlags::ON_DEMAND.bits(), 64);
        assert_eq!(AccessFlags::HUGETLB.bits(), 128);
        assert_eq!(AccessFlags::FLUSH_GLOBAL.bits(), 256);
        assert_eq!(AccessFlags::FLUSH_PERSISTENT.bits(), 512);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
    }

    #[test]
    fn display_names_flags_and_unknown_bits() {
        let f = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        assert_eq!(f.to_string(), "LOCAL_WRITE|REMOTE_READ");
        assert_eq!(AccessFlags::empty().to_string(), "0");
        assert_eq!(
            AccessFlags::from_bits_retain(1 | 0x4000).to_string(),
            "LOCAL_WRITE|0x4000"
        );
        assert_eq!(
            format!("{:?}", AccessFlags::REMOTE_WRITE),
            "AccessFlags(REMOTE_WRITE)"
        );
    }
}
