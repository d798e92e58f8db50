//! The IBTA encodings of the two transport timers, so the completer can turn QP attributes and
//! RNR NAK codes into durations. Durations only: the clock is the caller's.

use core::time::Duration;

/// The RNR NAK timer encoding (IBTA vol. 1 table "Encoding for RNR NAK Timer Field"), in
/// microseconds, indexed by the 5-bit code: 0 is the longest (655.36 ms), 1..=31 grow from
/// 0.01 ms to 491.52 ms. (rxe's `rnrnak_usec` table has 61410 for code 25, a typo for 61440.)
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The local ACK timeout for the QP attribute `timeout`: 4.096 µs × 2^timeout, or `None` for
/// 0, which means "wait forever" (IBTA; rxe `rxe_qp.c`: `4096ULL << attr->timeout` ns).
/// Values above 31 are invalid attributes; they are treated as 31 so this never panics.
pub const fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let exp = if timeout > 31 { 31 } else { timeout as u32 };
    Some(Duration::from_nanos(4096u64 << exp))
}

/// The shortest local ACK timer a QP runs: one jiffy of Debian's kernel (HZ 250), rxe's
/// floor (`rxe_qp.c` turns the timeout into jiffies and takes at least one). Below it a
/// timer shorter than the host's scheduling delays fires on ACKs that are only late: `timeout`
/// 1 is 8.2 µs, and a READ or WRITE of any size exhausts `retry_cnt` on a busy machine where
/// rxe completes it.
pub const MIN_ACK_TIMER: Duration = Duration::from_millis(4);

/// The local ACK timer the requester runs for the QP attribute `timeout`:
/// [`local_ack_timeout`], at least [`MIN_ACK_TIMER`]; `None` (no timer) for 0.
pub const fn ack_timer(timeout: u8) -> Option<Duration> {
    match local_ack_timeout(timeout) {
        Some(t) if t.as_nanos() < MIN_ACK_TIMER.as_nanos() => Some(MIN_ACK_TIMER),
        t => t,
    }
}

/// The delay an RNR NAK with timer code `code` (the low 5 bits of the AETH syndrome, or the
/// QP's `min_rnr_timer`) asks the requester to wait before retrying. Bits above the low five
/// are ignored.
pub const fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_US[(code & 0x1F) as usize] as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_timeout_encoding() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        // perftest's DEF_QP_TIME 14 = 67.1 ms.
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(67_108_864))
        );
        assert_eq!(
            local_ack_timeout(31),
            Some(Duration::from_nanos(4096 << 31))
        );
        assert_eq!(local_ack_timeout(255), local_ack_timeout(31));
    }

    #[test]
    fn the_ack_timer_is_at_least_a_jiffy() {
        assert_eq!(ack_timer(0), None);
        for t in 1..=9 {
            assert_eq!(ack_timer(t), Some(MIN_ACK_TIMER), "timeout {t}");
        }
        // 4.096 µs × 2^10 = 4.19 ms: the encoding from here on.
        assert_eq!(ack_timer(10), local_ack_timeout(10));
        assert_eq!(ack_timer(14), local_ack_timeout(14));
    }

    #[test]
    fn rnr_timer_encoding() {
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), Duration::from_micros(10));
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
        assert_eq!(rnr_timer(25), Duration::from_micros(61_440));
        assert_eq!(rnr_timer(31), Duration::from_micros(491_520));
        assert_eq!(rnr_timer(32 + 1), rnr_timer(1));
        // Codes 1..=31 are strictly increasing.
        for c in 1..31u8 {
            assert!(rnr_timer(c) < rnr_timer(c + 1));
        }
    }
}
