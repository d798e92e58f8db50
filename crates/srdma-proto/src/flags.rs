//! A small bit-flag newtype generator, so the verbs flag sets (`ibv_access_flags`,
//! `ibv_qp_attr_mask`, `ibv_wc_flags`, `ibv_send_flags`) keep their C numbering without pulling
//! in the `bitflags` crate.
//!
//! Every generated type stores raw bits, may carry bits that have no name (so a value received
//! from C can be validated and the offending bits reported instead of silently dropped), and
//! prints as `NAME|NAME|0x..`.

/// Defines a `Copy` newtype over an unsigned integer with named flag constants, set operators
/// and name-based formatting.
macro_rules! bit_flags {
    (
        $(#[$outer:meta])*
        $vis:vis struct $name:ident: $t:ty {
            $(
                $(#[$inner:meta])*
                const $flag:ident = $value:expr;
            )*
        }
    ) => {
        $(#[$outer])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        $vis struct $name($t);

        impl $name {
            $(
                $(#[$inner])*
                pub const $flag: $name = $name($value);
            )*

            /// Every named flag with its name, in declaration order (lowest bit first).
            pub const NAMED: &'static [(&'static str, $name)] = &[
                $( (stringify!($flag), $name($value)), )*
            ];

            /// The empty set.
            #[inline]
            pub const fn empty() -> Self {
                $name(0)
            }

            /// The set of every named flag.
            #[inline]
            pub const fn all() -> Self {
                $name(0 $( | $value )*)
            }

            /// The raw bits, numbered as in the C enum.
            #[inline]
            pub const fn bits(self) -> $t {
                self.0
            }

            /// A set from raw bits, or `None` if any bit has no name.
            #[inline]
            pub const fn from_bits(bits: $t) -> Option<Self> {
                if bits & !Self::all().0 == 0 { Some($name(bits)) } else { None }
            }

            /// A set from raw bits with the unnamed bits dropped.
            #[inline]
            pub const fn from_bits_truncate(bits: $t) -> Self {
                $name(bits & Self::all().0)
            }

            /// A set from raw bits, unnamed bits kept (so validation can report them).
            #[inline]
            pub const fn from_bits_retain(bits: $t) -> Self {
                $name(bits)
            }

            /// The bits of `self` that have no name (zero for a set built from constants).
            #[inline]
            pub const fn unknown_bits(self) -> $t {
                self.0 & !Self::all().0
            }

            /// True when no bit is set.
            #[inline]
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            /// True when every bit of `other` is set in `self`.
            #[inline]
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// True when `self` and `other` share at least one bit.
            #[inline]
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// `self ∪ other`.
            #[inline]
            #[must_use]
            pub const fn union(self, other: Self) -> Self {
                $name(self.0 | other.0)
            }

            /// `self ∩ other`.
            #[inline]
            #[must_use]
            pub const fn intersection(self, other: Self) -> Self {
                $name(self.0 & other.0)
            }

            /// `self \ other`: the bits of `self` not in `other`.
            #[inline]
            #[must_use]
            pub const fn difference(self, other: Self) -> Self {
                $name(self.0 & !other.0)
            }

            /// The named flags set in `self`, lowest bit first, each with its name.
            pub fn iter_names(self) -> impl Iterator<Item = (&'static str, Self)> {
                Self::NAMED.iter().copied().filter(move |&(_, f)| f.0 != 0 && self.contains(f))
            }

            /// The name of the lowest named flag set in `self`, if any.
            pub fn first_name(self) -> Option<&'static str> {
                self.iter_names().next().map(|(n, _)| n)
            }
        }

        impl core::ops::BitOr for $name {
            type Output = Self;
            #[inline]
            fn bitor(self, rhs: Self) -> Self {
                self.union(rhs)
            }
        }

        impl core::ops::BitOrAssign for $name {
            #[inline]
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl core::ops::BitAnd for $name {
            type Output = Self;
            #[inline]
            fn bitand(self, rhs: Self) -> Self {
                self.intersection(rhs)
            }
        }

        impl core::ops::BitAndAssign for $name {
            #[inline]
            fn bitand_assign(&mut self, rhs: Self) {
                self.0 &= rhs.0;
            }
        }

        impl core::ops::Sub for $name {
            type Output = Self;
            #[inline]
            fn sub(self, rhs: Self) -> Self {
                self.difference(rhs)
            }
        }

        impl core::ops::SubAssign for $name {
            #[inline]
            fn sub_assign(&mut self, rhs: Self) {
                self.0 &= !rhs.0;
            }
        }

        impl core::ops::Not for $name {
            type Output = Self;
            /// The named flags not in `self` (unnamed bits never appear).
            #[inline]
            fn not(self) -> Self {
                $name(!self.0 & Self::all().0)
            }
        }

        impl core::fmt::Display for $name {
            /// `NAME|NAME|0x..`, or `0` for the empty set.
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let mut first = true;
                for (name, _) in self.iter_names() {
                    if !first {
                        f.write_str("|")?;
                    }
                    f.write_str(name)?;
                    first = false;
                }
                let unknown = self.unknown_bits();
                if unknown != 0 {
                    if !first {
                        f.write_str("|")?;
                    }
                    write!(f, "{unknown:#x}")?;
                    first = false;
                }
                if first {
                    f.write_str("0")?;
                }
                Ok(())
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}({})", stringify!($name), self)
            }
        }
    };
}

pub(crate) use bit_flags;
