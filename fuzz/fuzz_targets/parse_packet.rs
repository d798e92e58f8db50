//! Feeds arbitrary bytes to every parser of srdma-wire: the checks of
//! `crates/srdma-wire/tests/parse_checks/mod.rs` (shared with the proptest
//! `no_input_panics_and_parses_are_consistent`), with libFuzzer's coverage guidance. See
//! `fuzz/README.md` for how to run it.

#![no_main]

#[path = "../../crates/srdma-wire/tests/parse_checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::any_input(data));
