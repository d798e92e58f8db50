//! `VecMemory`: reads, writes and atomics by region handle, alignment and range errors.

use srdma_proto::memory::{check_atomic_offset, region_range};
use srdma_proto::{AccessFlags, Memory, MemoryError, MrHandle, MrTable, PdId, VecMemory};

fn setup(len: usize) -> (MrTable, VecMemory, MrHandle) {
    let mut t = MrTable::new(0x5EED);
    let k = t
        .register(PdId(1), 0x10_000, len as u64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mut m = VecMemory::new();
    m.insert_zeroed(k.handle, len);
    (t, m, k.handle)
}

#[test]
fn write_then_read() {
    let (_t, mut m, h) = setup(64);
    m.write(h, 10, b"hello").unwrap();
    let mut buf = [0u8; 5];
    m.read(h, 10, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    // Up to the last byte.
    m.write(h, 63, b"z").unwrap();
    m.read(h, 63, &mut buf[..1]).unwrap();
    assert_eq!(buf[0], b'z');
    // Zero-length accesses at the end are fine.
    m.write(h, 64, b"").unwrap();
}

#[test]
fn out_of_range_is_an_error() {
    let (_t, mut m, h) = setup(64);
    assert_eq!(
        m.write(h, 60, b"hello"),
        Err(MemoryError::OutOfRange {
            offset: 60,
            len: 5,
            region_len: 64
        })
    );
    let mut buf = [0u8; 2];
    assert!(m.read(h, 63, &mut buf).is_err());
    assert!(m.read(h, u64::MAX, &mut buf).is_err());
    assert!(m.write(h, 65, b"").is_err());
}

#[test]
fn compare_swap_on_aligned_words() {
    let (_t, mut m, h) = setup(64);
    m.write(h, 8, &5u64.to_ne_bytes()).unwrap();
    // Mismatch: returns the original, leaves memory alone.
    assert_eq!(m.compare_swap(h, 8, 4, 99), Ok(5));
    assert_eq!(m.region(h).unwrap()[8..16], 5u64.to_ne_bytes());
    // Match: swaps.
    assert_eq!(m.compare_swap(h, 8, 5, 99), Ok(5));
    assert_eq!(m.region(h).unwrap()[8..16], 99u64.to_ne_bytes());
    // First and last words.
    assert_eq!(m.compare_swap(h, 0, 0, 1), Ok(0));
    assert_eq!(m.compare_swap(h, 56, 0, 2), Ok(0));
    assert_eq!(m.region(h).unwrap()[56..64], 2u64.to_ne_bytes());
}

#[test]
fn fetch_add_wraps() {
    let (_t, mut m, h) = setup(16);
    m.write(h, 8, &u64::MAX.to_ne_bytes()).unwrap();
    assert_eq!(m.fetch_add(h, 8, 2), Ok(u64::MAX));
    assert_eq!(m.fetch_add(h, 8, 0), Ok(1));
}

#[test]
fn misaligned_atomics_are_errors_not_panics() {
    let (_t, mut m, h) = setup(64);
    for off in [1u64, 2, 4, 7, 9, 63, u64::MAX] {
        assert_eq!(
            m.compare_swap(h, off, 0, 1),
            Err(MemoryError::Misaligned { offset: off })
        );
        assert_eq!(
            m.fetch_add(h, off, 1),
            Err(MemoryError::Misaligned { offset: off })
        );
    }
    assert!(m.region(h).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn aligned_atomic_past_the_end_is_out_of_range() {
    let (_t, mut m, h) = setup(60);
    // Offset 56 is aligned but only 4 bytes remain.
    assert_eq!(
        m.fetch_add(h, 56, 1),
        Err(MemoryError::OutOfRange {
            offset: 56,
            len: 8,
            region_len: 60
        })
    );
    assert!(m.compare_swap(h, 64, 0, 1).is_err());
    assert!(m.fetch_add(h, u64::MAX - 7, 1).is_err());
}

#[test]
fn unknown_handles_are_refused() {
    let (mut t, mut m, h) = setup(16);
    let other = t
        .register(PdId(1), 0, 16, AccessFlags::LOCAL_WRITE)
        .unwrap();
    // Registered in the table but no memory supplied.
    let mut buf = [0u8; 1];
    assert_eq!(
        m.read(other.handle, 0, &mut buf),
        Err(MemoryError::NoRegion {
            handle: other.handle
        })
    );
    assert_eq!(m.remove(other.handle), None);
    assert_eq!(m.remove(h).map(|v| v.len()), Some(16));
    assert!(m.region(h).is_none());
    assert!(m.write(h, 0, b"x").is_err());
}

#[test]
fn helpers() {
    assert_eq!(check_atomic_offset(0), Ok(()));
    assert_eq!(check_atomic_offset(16), Ok(()));
    assert_eq!(
        check_atomic_offset(3),
        Err(MemoryError::Misaligned { offset: 3 })
    );
    assert_eq!(region_range(0, 10, 10), Ok(0..10));
    assert_eq!(region_range(10, 0, 10), Ok(10..10));
    assert!(region_range(11, 0, 10).is_err());
    assert!(region_range(1, u64::MAX, u64::MAX).is_err());
    assert!(region_range(u64::MAX, 1, u64::MAX).is_err());
}
