//! The memory-region table: key generation, access checks, bounds, PDs, stale keys and
//! handles, the zero-length rule.

use proptest::prelude::*;
use srdma_proto::{
    AccessError, AccessFlags, LKey, Memory, MemoryError, MrError, MrTable, PdId, RKey, VecMemory,
};
use srdma_wire::NakCode;

const PD: PdId = PdId(1);
const OTHER_PD: PdId = PdId(2);
const ALL_REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn key_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut t = MrTable::new(seed);
    (0..n)
        .map(|i| {
            let k = t
                .register(PD, 0x1000 * i as u64, 64, AccessFlags::LOCAL_WRITE)
                .unwrap();
            k.lkey.key_byte()
        })
        .collect()
}

#[test]
fn key_layout_is_index_shift_8_or_key_byte() {
    let mut t = MrTable::new(42);
    for i in 1..=10u32 {
        let k = t.register(PD, 0x10_0000, 4096, ALL_REMOTE).unwrap();
        assert_eq!(k.index().value(), i, "fresh indices start at 1");
        assert_eq!(k.lkey.index_bits(), i);
        assert_eq!(k.lkey.0 >> 8, i);
        assert_eq!(
            k.rkey,
            Some(RKey(k.lkey.0)),
            "rkey = lkey with remote access"
        );
    }
}

#[test]
fn rkey_exists_only_with_a_remote_right() {
    let mut t = MrTable::new(1);
    let local = t.register(PD, 0, 64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(local.rkey, None);
    let none = t.register(PD, 0, 64, AccessFlags::empty()).unwrap();
    assert_eq!(none.rkey, None);
    let read = t.register(PD, 0, 64, AccessFlags::REMOTE_READ).unwrap();
    assert_eq!(read.rkey, Some(RKey(read.lkey.0)));
    // The L_Key value used as an R_Key on a local-only region names nothing.
    assert_eq!(
        t.check_remote(PD, RKey(local.lkey.0), 0, 8, AccessFlags::empty()),
        Err(MrError::InvalidKey { key: local.lkey.0 })
    );
}

#[test]
fn keys_differ_across_seeds() {
    let a = key_bytes(1, 64);
    let b = key_bytes(2, 64);
    assert_ne!(a, b);
    let same_positions = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    // Independent uniform bytes agree with probability 1/256 each: 64 draws → ~0.25.
    assert!(same_positions <= 4, "{same_positions} equal key bytes");
}

#[test]
fn keys_are_deterministic_for_a_seed() {
    assert_eq!(key_bytes(99, 32), key_bytes(99, 32));
}

#[test]
fn keys_are_not_a_sequence() {
    for seed in [0, 1, 0xDEAD_BEEF, u64::MAX] {
        let k = key_bytes(seed, 256);
        let diffs: Vec<u8> = k.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
        // Not an arithmetic progression of any step...
        assert!(diffs.iter().any(|&d| d != diffs[0]), "seed {seed}");
        // ...nor mostly one: consecutive keys rarely differ by the same step twice.
        let repeats = diffs.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(repeats < 10, "seed {seed}: {repeats} repeated steps");
        // And they cover the byte space: 256 uniform draws hit ~162 distinct values.
        let mut seen = [false; 256];
        k.iter().for_each(|&b| seen[b as usize] = true);
        let distinct = seen.iter().filter(|&&s| s).count();
        assert!(distinct > 120, "seed {seed}: {distinct} distinct");
    }
}

#[test]
fn registration_requires_local_write_for_remote_write_or_atomic() {
    let mut t = MrTable::new(3);
    for flags in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    ] {
        assert_eq!(
            t.register(PD, 0, 64, flags),
            Err(MrError::Access(AccessError::RemoteWriteNeedsLocalWrite {
                flags
            }))
        );
        assert!(
            t.register(PD, 0, 64, flags | AccessFlags::LOCAL_WRITE)
                .is_ok()
        );
    }
    // REMOTE_READ alone is fine.
    assert!(t.register(PD, 0, 64, AccessFlags::REMOTE_READ).is_ok());
}

#[test]
fn registration_refuses_unknown_and_unsupported_flags() {
    let mut t = MrTable::new(3);
    assert_eq!(
        t.register(PD, 0, 64, AccessFlags::from_bits_retain(1 << 15)),
        Err(MrError::Access(AccessError::UnknownBits { bits: 1 << 15 }))
    );
    for (flag, name) in [
        (AccessFlags::ZERO_BASED, "ZERO_BASED"),
        (AccessFlags::ON_DEMAND, "ON_DEMAND"),
        (AccessFlags::FLUSH_PERSISTENT, "FLUSH_PERSISTENT"),
    ] {
        assert_eq!(
            t.register(PD, 0, 64, flag | AccessFlags::LOCAL_WRITE),
            Err(MrError::Access(AccessError::Unsupported { flag: name }))
        );
    }
    // Memory windows may be bound to a region (IBV_ACCESS_MW_BIND, as on rxe).
    assert!(
        t.register(PD, 0, 64, AccessFlags::MW_BIND | AccessFlags::LOCAL_WRITE)
            .is_ok()
    );
    // Hints are accepted.
    assert!(
        t.register(
            PD,
            0,
            64,
            AccessFlags::HUGETLB | AccessFlags::RELAXED_ORDERING
        )
        .is_ok()
    );
    assert_eq!(t.len(), 2);
}

#[test]
fn registration_refuses_address_overflow() {
    let mut t = MrTable::new(3);
    assert_eq!(
        t.register(PD, u64::MAX - 15, 17, AccessFlags::empty()),
        Err(MrError::AddressOverflow {
            addr: u64::MAX - 15,
            len: 17
        })
    );
    // Ending exactly at u64::MAX (exclusive end) is allowed, as ib_umem_get.
    assert!(
        t.register(PD, u64::MAX - 15, 15, AccessFlags::empty())
            .is_ok()
    );
    assert!(t.register(PD, 0, u64::MAX, AccessFlags::empty()).is_ok());
    assert_eq!(
        t.register(PD, 1, u64::MAX, AccessFlags::empty()),
        Err(MrError::AddressOverflow {
            addr: 1,
            len: u64::MAX
        })
    );
}

#[test]
fn bounds_at_the_edges() {
    let mut t = MrTable::new(5);
    let base = 0x7000_0000_1000u64;
    let k = t.register(PD, base, 4096, ALL_REMOTE).unwrap();
    let rkey = k.rkey.unwrap();
    let need = AccessFlags::REMOTE_READ;
    let ok = |va, len| t.check_remote(PD, rkey, va, len, need);
    let oob = |va: u64, len: u64| {
        Err(MrError::OutOfBounds {
            key: rkey.0,
            addr: va,
            len,
            region_addr: base,
            region_len: 4096,
        })
    };
    // Whole region, first byte, last byte.
    let g = ok(base, 4096).unwrap().unwrap();
    assert_eq!((g.offset(), g.len()), (0, 4096));
    let g = ok(base + 4095, 1).unwrap().unwrap();
    assert_eq!((g.offset(), g.len()), (4095, 1));
    // One past the end, one before the start.
    assert_eq!(ok(base, 4097), oob(base, 4097));
    assert_eq!(ok(base + 4096, 1), oob(base + 4096, 1));
    assert_eq!(ok(base - 1, 1), oob(base - 1, 1));
    assert_eq!(ok(base - 1, 4096), oob(base - 1, 4096));
    // Lengths that would wrap va + len.
    assert_eq!(ok(base + 1, u64::MAX), oob(base + 1, u64::MAX));
    assert_eq!(ok(u64::MAX, 2), oob(u64::MAX, 2));
    // The same for local keys.
    let l = |addr, len| t.check_local(PD, k.lkey, addr, len, AccessFlags::LOCAL_WRITE);
    assert!(l(base, 4096).unwrap().is_some());
    assert!(matches!(l(base, 4097), Err(MrError::OutOfBounds { .. })));
    assert!(matches!(
        l(base + 1, u64::MAX),
        Err(MrError::OutOfBounds { .. })
    ));
}

#[test]
fn bounds_near_the_top_of_the_address_space() {
    let mut t = MrTable::new(5);
    let base = u64::MAX - 15; // region [MAX-15, MAX): 15 bytes, ending at the last address.
    let k = t.register(PD, base, 15, ALL_REMOTE).unwrap();
    let rkey = k.rkey.unwrap();
    let r = |va, len| t.check_remote(PD, rkey, va, len, AccessFlags::REMOTE_WRITE);
    assert!(r(base, 15).unwrap().is_some(), "exact end");
    assert!(r(u64::MAX - 1, 1).unwrap().is_some(), "last byte");
    assert!(matches!(
        r(u64::MAX - 1, 2),
        Err(MrError::OutOfBounds { .. })
    ));
    assert!(matches!(r(u64::MAX, 1), Err(MrError::OutOfBounds { .. })));
    assert!(matches!(
        r(base, u64::MAX),
        Err(MrError::OutOfBounds { .. })
    ));
    assert!(matches!(
        r(u64::MAX, u64::MAX),
        Err(MrError::OutOfBounds { .. })
    ));
}

#[test]
fn each_remote_right_is_checked() {
    let mut t = MrTable::new(6);
    let rights = [
        AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
    ];
    for have in rights {
        let k = t
            .register(PD, 0x1000, 64, have | AccessFlags::LOCAL_WRITE)
            .unwrap();
        let rkey = k.rkey.unwrap();
        for need in rights {
            let res = t.check_remote(PD, rkey, 0x1000, 8, need);
            if need == have {
                assert!(res.unwrap().is_some());
            } else {
                assert_eq!(
                    res,
                    Err(MrError::AccessDenied {
                        key: rkey.0,
                        need,
                        have: have | AccessFlags::LOCAL_WRITE
                    })
                );
                assert_eq!(res.unwrap_err().remote_nak(), NakCode::RemoteAccessError);
            }
        }
    }
}

#[test]
fn local_write_is_checked_and_local_read_is_implicit() {
    let mut t = MrTable::new(7);
    let ro = t.register(PD, 0x1000, 64, AccessFlags::empty()).unwrap();
    assert!(
        t.check_local(PD, ro.lkey, 0x1000, 64, AccessFlags::empty())
            .unwrap()
            .is_some()
    );
    let err = t
        .check_local(PD, ro.lkey, 0x1000, 64, AccessFlags::LOCAL_WRITE)
        .unwrap_err();
    assert_eq!(
        err,
        MrError::AccessDenied {
            key: ro.lkey.0,
            need: AccessFlags::LOCAL_WRITE,
            have: AccessFlags::empty()
        }
    );
    assert_eq!(err.local_wc_status(), srdma_proto::WcStatus::LocProtErr);
    let rw = t
        .register(PD, 0x1000, 64, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert!(
        t.check_local(PD, rw.lkey, 0x1000, 64, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .is_some()
    );
}

#[test]
fn pd_mismatch_is_refused() {
    let mut t = MrTable::new(8);
    let k = t.register(PD, 0x1000, 64, ALL_REMOTE).unwrap();
    assert_eq!(
        t.check_local(OTHER_PD, k.lkey, 0x1000, 8, AccessFlags::empty()),
        Err(MrError::PdMismatch {
            key: k.lkey.0,
            pd: OTHER_PD,
            region_pd: PD
        })
    );
    assert!(matches!(
        t.check_remote(
            OTHER_PD,
            k.rkey.unwrap(),
            0x1000,
            8,
            AccessFlags::REMOTE_READ
        ),
        Err(MrError::PdMismatch { .. })
    ));
    assert!(matches!(
        t.check_atomic(OTHER_PD, k.rkey.unwrap(), 0x1000),
        Err(MrError::PdMismatch { .. })
    ));
}

#[test]
fn wrong_key_byte_and_unknown_index_are_invalid_keys() {
    let mut t = MrTable::new(9);
    let k = t.register(PD, 0x1000, 64, ALL_REMOTE).unwrap();
    let wrong = LKey(k.lkey.0 ^ 0x01);
    assert_eq!(
        t.check_local(PD, wrong, 0x1000, 8, AccessFlags::empty()),
        Err(MrError::InvalidKey { key: wrong.0 })
    );
    for key in [
        0u32,
        0xFF,
        0x0200_0000 | u32::from(k.lkey.key_byte()),
        u32::MAX,
    ] {
        assert_eq!(
            t.check_remote(PD, RKey(key), 0x1000, 8, AccessFlags::REMOTE_READ),
            Err(MrError::InvalidKey { key })
        );
    }
}

#[test]
fn dereg_and_reregister_same_index_rejects_the_stale_key_and_handle() {
    let mut t = MrTable::new(10);
    let mut mem = VecMemory::new();
    let old = t.register(PD, 0x1000, 64, ALL_REMOTE).unwrap();
    mem.insert_zeroed(old.handle, 64);
    // Work checked against the old region...
    let grant = t
        .check_remote(PD, old.rkey.unwrap(), 0x1000, 8, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .unwrap();
    assert_eq!(t.revalidate(&grant), Ok(()));

    // ...the region is deregistered and the same index registered again.
    let info = t.deregister(old.lkey).unwrap();
    assert_eq!(info.keys, old);
    assert_eq!(mem.remove(old.handle).map(|b| b.len()), Some(64));
    let new = t.register(PD, 0x1000, 64, ALL_REMOTE).unwrap();
    mem.insert(new.handle, vec![0xAA; 64]);
    assert_eq!(new.index(), old.index(), "the freed index is reused");
    assert_ne!(new.lkey, old.lkey, "the key byte changes");
    assert_ne!(new.handle, old.handle, "the generation changes");

    // Old keys fail every check.
    assert_eq!(
        t.check_remote(PD, old.rkey.unwrap(), 0x1000, 8, AccessFlags::REMOTE_WRITE),
        Err(MrError::InvalidKey {
            key: old.rkey.unwrap().0
        })
    );
    assert_eq!(
        t.check_local(PD, old.lkey, 0x1000, 8, AccessFlags::empty()),
        Err(MrError::InvalidKey { key: old.lkey.0 })
    );
    assert_eq!(
        t.deregister(old.lkey),
        Err(MrError::InvalidKey { key: old.lkey.0 })
    );
    // The in-flight grant is stale, and memory refuses its handle: no write reaches the new
    // region.
    assert!(!t.is_live(grant.handle()));
    assert_eq!(
        t.revalidate(&grant),
        Err(MrError::Stale { handle: old.handle })
    );
    assert_eq!(
        mem.write(grant.handle(), grant.offset(), &[0u8; 8]),
        Err(MemoryError::NoRegion { handle: old.handle })
    );
    let mut buf = [0u8; 8];
    assert!(mem.read(grant.handle(), 0, &mut buf).is_err());
    assert!(mem.fetch_add(grant.handle(), 0, 1).is_err());
    assert_eq!(mem.region(new.handle).unwrap(), &[0xAA; 64][..]);
    // The new keys work.
    assert!(t.is_live(new.handle));
    assert!(
        t.check_remote(PD, new.rkey.unwrap(), 0x1000, 8, AccessFlags::REMOTE_WRITE)
            .unwrap()
            .is_some()
    );
}

#[test]
fn every_reregistration_of_a_slot_changes_its_key() {
    let mut t = MrTable::new(11);
    let mut prev = t.register(PD, 0, 64, AccessFlags::empty()).unwrap();
    for _ in 0..1000 {
        t.deregister(prev.lkey).unwrap();
        let next = t.register(PD, 0, 64, AccessFlags::empty()).unwrap();
        assert_eq!(next.index(), prev.index());
        assert_ne!(next.lkey, prev.lkey);
        prev = next;
    }
}

#[test]
fn freed_indices_are_reused_oldest_first() {
    let mut t = MrTable::new(12);
    let keys: Vec<_> = (0..4)
        .map(|_| t.register(PD, 0, 8, AccessFlags::empty()).unwrap())
        .collect();
    t.deregister(keys[2].lkey).unwrap();
    t.deregister(keys[0].lkey).unwrap();
    assert_eq!(t.len(), 2);
    let a = t.register(PD, 0, 8, AccessFlags::empty()).unwrap();
    let b = t.register(PD, 0, 8, AccessFlags::empty()).unwrap();
    let c = t.register(PD, 0, 8, AccessFlags::empty()).unwrap();
    assert_eq!(a.index(), keys[2].index());
    assert_eq!(b.index(), keys[0].index());
    assert_eq!(c.index().value(), 5);
}

#[test]
fn table_full() {
    let mut t = MrTable::with_max_mr(13, 3);
    let k: Vec<_> = (0..3)
        .map(|_| t.register(PD, 0, 8, AccessFlags::empty()).unwrap())
        .collect();
    assert_eq!(
        t.register(PD, 0, 8, AccessFlags::empty()),
        Err(MrError::TableFull { max: 3 })
    );
    t.deregister(k[1].lkey).unwrap();
    assert!(t.register(PD, 0, 8, AccessFlags::empty()).is_ok());
}

#[test]
fn zero_length_remote_access_skips_rkey_validation() {
    // IBTA C9-88: a zero-length RDMA READ/WRITE validates neither R_Key nor VA.
    let t = MrTable::new(14);
    for rkey in [RKey(0), RKey(0xDEAD_BEEF), RKey(u32::MAX)] {
        assert_eq!(
            t.check_remote(PD, rkey, u64::MAX, 0, AccessFlags::REMOTE_WRITE),
            Ok(None)
        );
    }
    // A zero-length local SGE is not looked up either (rxe copy_data).
    assert_eq!(
        t.check_local(PD, LKey(0x1234_5678), 0, 0, AccessFlags::LOCAL_WRITE),
        Ok(None)
    );
    // One byte is validated.
    assert!(matches!(
        t.check_remote(PD, RKey(0xDEAD_BEEF), 0, 1, AccessFlags::REMOTE_WRITE),
        Err(MrError::InvalidKey { .. })
    ));
}

#[test]
fn atomics_need_the_right_and_alignment() {
    let mut t = MrTable::new(15);
    let k = t.register(PD, 0x1000, 64, ALL_REMOTE).unwrap();
    let rkey = k.rkey.unwrap();
    let g = t.check_atomic(PD, rkey, 0x1008).unwrap();
    assert_eq!((g.offset(), g.len()), (8, 8));
    // Misaligned: invalid request, after the key checks passed.
    let err = t.check_atomic(PD, rkey, 0x1004).unwrap_err();
    assert_eq!(err, MrError::Misaligned { va: 0x1004 });
    assert_eq!(err.remote_nak(), NakCode::InvalidRequest);
    // The last aligned word fits; one past it does not.
    assert!(t.check_atomic(PD, rkey, 0x1038).is_ok());
    assert!(matches!(
        t.check_atomic(PD, rkey, 0x1040),
        Err(MrError::OutOfBounds { .. })
    ));
    // A bad key on a misaligned address is a key error (rxe checks the key first).
    assert!(matches!(
        t.check_atomic(PD, RKey(rkey.0 ^ 1), 0x1004),
        Err(MrError::InvalidKey { .. })
    ));
    // Without REMOTE_ATOMIC.
    let ro = t
        .register(PD, 0x1000, 64, AccessFlags::REMOTE_READ)
        .unwrap();
    assert!(matches!(
        t.check_atomic(PD, ro.rkey.unwrap(), 0x1000),
        Err(MrError::AccessDenied { .. })
    ));
}

#[test]
fn grant_slices_stay_inside() {
    let mut t = MrTable::new(16);
    let k = t.register(PD, 0x1000, 4096, ALL_REMOTE).unwrap();
    let g = t
        .check_local(PD, k.lkey, 0x1100, 1024, AccessFlags::empty())
        .unwrap()
        .unwrap();
    let s = g.slice(256, 256).unwrap();
    assert_eq!(
        (s.offset(), s.len(), s.handle()),
        (0x100 + 256, 256, g.handle())
    );
    assert!(g.slice(0, 1024).is_some());
    assert!(g.slice(1024, 0).is_some());
    assert!(g.slice(1, 1024).is_none());
    assert!(g.slice(1025, 0).is_none());
    assert!(g.slice(u64::MAX, 2).is_none());
}

#[test]
fn query_reports_the_registration() {
    let mut t = MrTable::new(17);
    let k = t.register(PD, 0xABC0, 100, ALL_REMOTE).unwrap();
    let info = t.query(k.lkey).unwrap();
    assert_eq!(
        (info.pd, info.addr, info.len, info.access, info.keys),
        (PD, 0xABC0, 100, ALL_REMOTE, k)
    );
    assert_eq!(t.query(LKey(k.lkey.0 + 1)), None);
}

#[test]
fn error_messages_carry_context() {
    let mut t = MrTable::new(18);
    let k = t
        .register(PD, 0x1000, 16, AccessFlags::REMOTE_READ)
        .unwrap();
    let err = t
        .check_remote(PD, k.rkey.unwrap(), 0x1000, 8, AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("grants REMOTE_READ"), "{msg}");
    assert!(msg.contains("needs REMOTE_WRITE"), "{msg}");
    let err = t
        .check_remote(PD, k.rkey.unwrap(), 0x1008, 9, AccessFlags::REMOTE_READ)
        .unwrap_err();
    assert!(err.to_string().contains("0x1008+0x9"), "{err}");
}

proptest! {
    /// No input panics, and every grant lies inside its region.
    #[test]
    fn checks_never_panic_and_grants_are_in_bounds(
        addr in any::<u64>(),
        len in prop_oneof![0u64..0x1_0000, any::<u64>()],
        va_off in prop_oneof![-64i64..0x1_0040, any::<i64>()],
        n in prop_oneof![0u64..0x1_0040, any::<u64>()],
        key_noise in any::<u32>(),
        need in 0u32..16,
    ) {
        let mut t = MrTable::new(addr ^ len);
        let need = AccessFlags::from_bits_truncate(need);
        let Ok(k) = t.register(PD, addr, len, ALL_REMOTE) else {
            prop_assert!(addr.checked_add(len).is_none());
            return Ok(());
        };
        let va = addr.wrapping_add_signed(va_off);
        let inside = va
            .checked_sub(addr)
            .is_some_and(|off| off <= len && n <= len - off);
        for key in [k.lkey.0, k.lkey.0 ^ key_noise] {
            let remote = t.check_remote(PD, RKey(key), va, n, need);
            let local = t.check_local(PD, LKey(key), va, n, need);
            if key == k.lkey.0 && n > 0 {
                // The right key: the outcome is decided by the bounds alone.
                prop_assert_eq!(remote.is_ok(), inside);
                prop_assert_eq!(local.is_ok(), inside);
            }
            for res in [remote, local, t.check_atomic(PD, RKey(key), va).map(Some)] {
                if let Ok(Some(g)) = res {
                    prop_assert!(!g.is_empty());
                    prop_assert!(g.offset() <= len && g.len() <= len - g.offset());
                    prop_assert_eq!(va - addr, g.offset());
                }
            }
        }
    }
}

/// `ibv_rereg_mr`: PD, range and rights change in place, the keys stay, grants issued before
/// go stale, and a refused change leaves the region as it was.
#[test]
fn reregister_keeps_keys_and_stales_old_grants() {
    let mut t = MrTable::new(7);
    let k = t.register(PD, 0x1000, 64, ALL_REMOTE).unwrap();
    let rkey = k.rkey.unwrap();
    let grant = t
        .check_remote(PD, rkey, 0x1000, 8, AccessFlags::REMOTE_WRITE)
        .unwrap()
        .unwrap();

    // Rights: no remote write any more; the keys are the same, the old grant stale.
    let info = t
        .reregister(
            k.lkey,
            None,
            None,
            Some(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ),
        )
        .unwrap();
    assert_eq!((info.keys.lkey, info.keys.rkey), (k.lkey, Some(rkey)));
    assert_ne!(info.keys.handle, k.handle);
    assert!(t.revalidate(&grant).is_err());
    assert!(matches!(
        t.check_remote(PD, rkey, 0x1000, 8, AccessFlags::REMOTE_WRITE),
        Err(MrError::AccessDenied { .. })
    ));
    assert!(
        t.check_remote(PD, rkey, 0x1000, 8, AccessFlags::REMOTE_READ)
            .is_ok()
    );

    // PD: the region now answers to the other PD only.
    t.reregister(k.lkey, Some(OTHER_PD), None, None).unwrap();
    assert!(matches!(
        t.check_remote(PD, rkey, 0x1000, 8, AccessFlags::REMOTE_READ),
        Err(MrError::PdMismatch { .. })
    ));
    assert!(
        t.check_remote(OTHER_PD, rkey, 0x1000, 8, AccessFlags::REMOTE_READ)
            .is_ok()
    );

    // Range: the old addresses are out of bounds, the new ones in.
    t.reregister(k.lkey, None, Some((0x9000, 16)), None)
        .unwrap();
    assert!(
        t.check_remote(OTHER_PD, rkey, 0x1000, 8, AccessFlags::REMOTE_READ)
            .is_err()
    );
    assert!(
        t.check_remote(OTHER_PD, rkey, 0x9008, 8, AccessFlags::REMOTE_READ)
            .is_ok()
    );

    // Refused: remote write without local write; an overflowing range; an unknown key.
    let before = t.query(k.lkey).unwrap();
    assert!(
        t.reregister(k.lkey, None, None, Some(AccessFlags::REMOTE_WRITE))
            .is_err()
    );
    assert!(matches!(
        t.reregister(k.lkey, None, Some((u64::MAX, 2)), None),
        Err(MrError::AddressOverflow { .. })
    ));
    assert_eq!(t.query(k.lkey), Some(before));
    assert!(matches!(
        t.reregister(LKey(k.lkey.0 ^ 1), None, None, None),
        Err(MrError::InvalidKey { .. })
    ));
}
