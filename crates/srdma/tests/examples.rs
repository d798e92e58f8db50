//! The examples, run as tests: each example's logic lives in a `run` function its `main`
//! calls, so the test includes the example's source and calls `run` directly (no `cargo run`
//! from inside a test, no second build).

#[path = "../examples/forward_chain.rs"]
#[allow(dead_code)] // `main`, only the example binary calls it
mod forward_chain;

/// A writes chunks into B's ring, B forwards each from the ring to C: every chunk arrives at
/// C intact, in order, and the credits keep at most one ring's worth in flight.
#[test]
fn forward_chain_delivers_every_chunk_intact() {
    let s = forward_chain::run().unwrap_or_else(|e| panic!("forward_chain: {e}"));
    assert_eq!(s.delivered, forward_chain::CHUNKS);
    assert_eq!(
        s.bytes,
        u64::from(forward_chain::CHUNKS) * forward_chain::CHUNK_LEN as u64
    );
    // More chunks than ring slots, and A fills the ring before it looks for credits: it must
    // have waited for B at least once.
    assert!(s.credit_stalls > 0, "{s:?}");
}

/// The hand-written CRC32 is the standard one (the check value of CRC-32/ISO-HDLC).
#[test]
fn forward_chain_crc32_check_value() {
    assert_eq!(forward_chain::crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(forward_chain::crc32(b""), 0);
}
