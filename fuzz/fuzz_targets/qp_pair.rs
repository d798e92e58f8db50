//! Feeds arbitrary work requests, state changes, memory-region churn, timers and packets —
//! arbitrary bytes, crafted packets of every opcode, and mutated, dropped, duplicated,
//! reflected and reordered copies of what the QPs themselves sent — into a connected RC, UC or
//! UD QP pair of srdma-proto. Nothing may panic; every packet `poll_transmit` writes must parse;
//! completions must match posted work requests; the pair must fall silent over a lossless wire
//! with the clock stopped.
//!
//! The input format, the actions and the invariants live in
//! `crates/srdma-proto/tests/fuzz_driver/mod.rs`, which the proptest
//! `crates/srdma-proto/tests/arbitrary_input.rs` runs in CI. See `fuzz/README.md`.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/srdma-proto/tests/fuzz_driver/mod.rs"]
mod driver;

fuzz_target!(|data: &[u8]| {
    driver::run(data);
});
