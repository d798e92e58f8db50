//! Unguessable numbers for MR key bytes and initial PSNs.

use srdma_wire::Psn;

/// 64 random bits from the OS (`getrandom(2)`, one system call: connection setup draws
/// several). Should that fail, the wall clock's nanoseconds and the process id, mixed
/// (splitmix64) — weaker, never constant.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: writes at most 8 bytes into a live buffer of 8 bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut z = t ^ u64::from(std::process::id()).rotate_left(32);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A random initial PSN (what ibv_rc_pingpong draws with `lrand48() & 0xffffff`).
pub fn random_psn() -> Psn {
    Psn::new(random_u64() as u32)
}
