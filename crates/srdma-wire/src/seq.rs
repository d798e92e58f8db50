//! 24-bit packet sequence numbers and queue pair numbers.

use core::cmp::Ordering;
use core::fmt;

/// Mask of the 24 bits a PSN or QPN occupies on the wire.
pub const MASK_24: u32 = 0x00FF_FFFF;

/// A packet sequence number: 24 bits, wrapping, compared modulo 2^24.
///
/// PSNs have no total order: `a` is "before" `b` when `b - a` mod 2^24 is in (0, 2^23), the
/// rule of rxe's `psn_compare` (`(s32)((a - b) << 8)`). Use [`Psn::cmp_mod`] or
/// [`Psn::diff`], never a plain integer comparison.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Half the PSN space: the largest forward distance that still compares as "after".
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `v` (higher bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Self {
        Psn(v & MASK_24)
    }

    /// The PSN as an integer in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Psn(self.0.wrapping_add(n) & MASK_24)
    }

    /// `self - n` modulo 2^24.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Psn(self.0.wrapping_sub(n) & MASK_24)
    }

    /// Signed distance `self - other` in `-2^23..2^23`.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        (self.0.wrapping_sub(other.0) << 8) as i32 >> 8
    }

    /// Modular comparison: `Less` when `self` comes before `other`.
    #[inline]
    pub fn cmp_mod(self, other: Psn) -> Ordering {
        self.diff(other).cmp(&0)
    }

    /// True when `self` comes strictly before `other` (modulo 2^24).
    #[inline]
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True when `self` comes strictly after `other` (modulo 2^24).
    #[inline]
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A queue pair number: 24 bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// QP0, the subnet management QP (not used on RoCE; a packet to it is invalid).
    pub const SMI: Qpn = Qpn(0);
    /// QP1, the general services interface: CM MADs travel here as UD SENDs.
    pub const GSI: Qpn = Qpn(1);
    /// The multicast QPN.
    pub const MULTICAST: Qpn = Qpn(MASK_24);

    /// A QPN from the low 24 bits of `v` (higher bits are dropped).
    #[inline]
    pub const fn new(v: u32) -> Self {
        Qpn(v & MASK_24)
    }

    /// The QPN as an integer in `0..2^24`.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_and_compares_modulo() {
        let top = Psn::new(MASK_24);
        assert_eq!(top.add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), top);
        assert!(top.before(Psn::new(0)));
        assert!(Psn::new(5).after(top));
        assert_eq!(Psn::new(2).diff(top), 3);
        assert_eq!(top.diff(Psn::new(2)), -3);
        assert_eq!(Psn::new(0).cmp_mod(Psn::new(Psn::HALF - 1)), Ordering::Less);
        assert_eq!(
            Psn::new(0).cmp_mod(Psn::new(Psn::HALF + 1)),
            Ordering::Greater
        );
        assert_eq!(Psn::new(0x0100_0005).value(), 5);
    }

    #[test]
    fn qpn_masks() {
        assert_eq!(Qpn::new(0xFF00_0011).value(), 0x11);
        assert_eq!(Qpn::MULTICAST.value(), 0xFF_FFFF);
    }
}
