//! Feeds arbitrary bytes to the reader of srdma's shared-memory rings, as the memory a peer
//! process could have written: the reader must neither panic nor loop (`shm::ring`). See
//! `fuzz/README.md` for how to run it.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = srdma::fuzzing::read_ring(data);
});
