//! A hash map for keys that no packet or peer chooses — descriptors, QPNs, device indices,
//! the addresses of the application's own QPs' peers — with a multiplicative hash (FxHash's
//! step: rotate, xor, multiply). The standard map's SipHash resists keys chosen to collide,
//! which these are not, and costs tens of nanoseconds a lookup: the engine looks its peers'
//! paths and shares up on every flush, the rsockets preload descriptors on every socket call
//! (a redis request made about ten such lookups).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hash map keyed by values of this process, not of its peers (see the module).
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// An odd constant with well-spread bits (FxHash's, from rustc).
const K: u64 = 0x517c_c1b7_2722_0a95;

/// The hasher of [`FastMap`].
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_i32(&mut self, n: i32) {
        self.write_u64(u64::from(n as u32));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_map_as_with_the_standard_hasher() {
        let mut m: FastMap<i32, i32> = FastMap::default();
        for fd in -3..5000 {
            m.insert(fd, fd * 2);
        }
        for fd in (-3..5000).step_by(7) {
            assert_eq!(m.remove(&fd), Some(fd * 2));
        }
        assert_eq!(m.get(&-1), Some(&-2));
        assert_eq!(m.get(&4), None);
        assert_eq!(m.get(&7), Some(&14));
        assert_eq!(m.len(), 5003 - 5003_usize.div_ceil(7));
    }

    #[test]
    fn neighbouring_keys_spread_over_the_top_bits() {
        // The map's control bytes come from the hash's top seven bits: consecutive
        // descriptors must not share them all.
        let top = |n: u32| {
            let mut h = FastHasher::default();
            h.write_u32(n);
            h.finish() >> 57
        };
        let distinct: std::collections::BTreeSet<u64> = (0..256).map(top).collect();
        assert!(distinct.len() > 64, "{}", distinct.len());
    }

    #[test]
    fn addresses_are_keys_too() {
        use std::net::IpAddr;
        let mut m: FastMap<IpAddr, u32> = FastMap::default();
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fe80::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        m.insert(v4, 4);
        m.insert(v6, 6);
        m.insert(mapped, 46);
        assert_eq!((m[&v4], m[&v6], m[&mapped]), (4, 6, 46));
    }
}
