//! Arbitrary input into a connected QP pair must never panic: the `qp_pair` fuzz target's
//! driver (`tests/fuzz_driver/mod.rs`, shared with `fuzz/fuzz_targets/qp_pair.rs`) run on
//! random byte strings, and on seeds from real traffic — a normal RC, UC or UD exchange of
//! every operation, followed by mutated replays of its packets, lossy wires, state changes
//! and memory-region churn in flight, or random actions.
//!
//! Every run also checks the driver's invariants: every transmitted packet parses, every
//! completion matches a posted work request, timers handled are not due again, and the pair
//! falls silent over a lossless wire. `SRDMA_FUZZ_SEED_DIR=<dir>` makes
//! `seeds_round_trip_and_can_seed_the_fuzz_corpus` write the seeds there as fuzz corpus files.

mod fuzz_driver;

use fuzz_driver::{
    Action, AttrSpec, Dereg, Modify, MrSpec, Poll, PostRecv, PostSend, Reconnect, RemoteSpec,
    Replay, Settle, Setup, SgeSpec, Stats, Timer, Transmit, decode, encode, execute, run,
};
use proptest::prelude::*;

/// RC, UC, UD as the setup's `ty` byte.
const TYPES: [u8; 3] = [0, 1, 2];
/// `ibv_send_flags` SIGNALED.
const SIGNALED: u8 = 2;
/// `ibv_send_flags` INLINE.
const INLINE: u8 = 8;
/// The op byte's "tidy" bit: valid buffers.
const TIDY: u8 = 8;

/// A pair with valid, generous settings: 16 KiB all-rights regions, 16-deep queues, inline
/// up to 300 bytes, an 8 µs ACK timeout, PSNs next to the wrap.
fn setup(ty: u8, mtu: u8) -> Setup {
    Setup {
        ty,
        mtu,
        flags: 0x20,
        psn: [0, 0],
        timeout: 1,
        retry: 7,
        rnr_retry: 3,
        min_rnr: 1,
        max_rd: 4,
        max_dest_rd: 4,
        caps: [16, 16, 4, 4, 100],
        mrs: std::array::from_fn(|_| MrSpec {
            len: 16384,
            access: 0x0F,
            addr: 0,
        }),
    }
}

fn recv(end: u8, len: u16) -> Action {
    Action::PostRecv(PostRecv {
        end: end | 2,
        sges: vec![SgeSpec {
            key: 0,
            mr: 0,
            off: 0,
            len,
        }],
    })
}

fn send(end: u8, op: u8, len: u16, flags: u8, inline: u16) -> Action {
    Action::PostSend(PostSend {
        end,
        op: op | TIDY,
        flags,
        sges: vec![SgeSpec {
            key: 0,
            mr: 1,
            off: 0,
            len,
        }],
        remote: RemoteSpec {
            key: 0,
            mr: 2,
            off: 64,
        },
        imm: 0xdead_beef,
        compare: 0x1d1d_1d1d_1d1d_1d1d,
        swap: 42,
        inline,
        ud: 0,
    })
}

fn settle(loss: u8, timers: u8) -> Action {
    Action::Settle(Settle {
        seed: 7,
        loss,
        timers,
    })
}

fn poll_all() -> [Action; 2] {
    [0, 1].map(|end| Action::Poll(Poll { end, max: 255 }))
}

/// A normal exchange: A sends every operation its QP type has (multi-packet where the type
/// allows, one inline SEND), B one SEND back; then both CQs are drained. Returns the actions
/// and the successful (send, receive) completions it must produce.
fn exchange(ty: u8) -> (Vec<Action>, (usize, usize)) {
    let len = if ty == 2 { 200 } else { 3000 };
    let ops: &[u8] = match ty {
        0 => &[0, 1, 2, 3, 4, 5, 6],
        1 => &[0, 1, 2, 3],
        _ => &[0, 1],
    };
    let mut a = vec![recv(0, 8192), recv(0, 8192)];
    a.extend((0..6).map(|_| recv(1, 8192)));
    for &op in ops {
        a.push(send(0, op, len, SIGNALED, 0));
    }
    a.push(send(0, 0, 0, SIGNALED | INLINE, 0x8000 | 100));
    a.push(send(1, 0, len, SIGNALED, 0));
    a.push(settle(0, 8));
    a.extend(poll_all());
    // Receives: SEND, SEND with immediate, WRITE with immediate and the inline SEND at B;
    // one SEND at A.
    let b_recvs = if ty == 2 { 3 } else { 4 };
    (a, (ops.len() + 2, b_recvs + 1))
}

/// The exchange, then `tail`, then a final settle and poll.
fn script(ty: u8, mtu: u8, tail: impl IntoIterator<Item = Action>) -> Vec<u8> {
    let (mut actions, _) = exchange(ty);
    actions.extend(tail);
    actions.push(settle(0, 15));
    actions.extend(poll_all());
    encode(&setup(ty, mtu), &actions)
}

/// Mutated replays of the 32 newest packets with mutation `kind`, to the receiver and back
/// to the sender, then a lossy settle.
fn replays(kind: u8) -> Vec<Action> {
    let mut v: Vec<Action> = (0..32u8)
        .map(|idx| {
            Action::Replay(Replay {
                idx,
                to: idx & 1,
                kind,
                a: u32::from(idx) * 7919 + u32::from(kind) * 104_729,
                b: u32::from(idx) * 31 + u32::from(kind),
            })
        })
        .collect();
    v.push(settle(40, 8));
    v
}

/// A few more send/receive rounds with the given `fate` on every packet.
fn lossy_round(fate: u8) -> Vec<Action> {
    let mut v = vec![recv(1, 8192), recv(1, 8192), recv(0, 8192)];
    v.push(send(0, 0, 5000, SIGNALED, 0));
    v.push(send(0, 4, 2000, SIGNALED, 0));
    v.push(send(1, 0, 700, SIGNALED, 0));
    for i in 0..6u32 {
        v.push(Action::Transmit(Transmit {
            from: (i & 1) as u8,
            count: 15,
            fate,
            a: i * 977,
            b: i,
        }));
    }
    v.push(Action::Timer(Timer { kind: 0, delta: 0 }));
    v
}

fn modify(end: u8, state: u8) -> Action {
    Action::Modify(Modify {
        end,
        attr: AttrSpec {
            state,
            mask_mode: 3,
            misc: 3,
            ..AttrSpec::default()
        },
    })
}

/// State changes and region churn with traffic in flight.
fn churn(step: u8) -> Vec<Action> {
    let mut v = vec![recv(1, 8192), recv(1, 8192)];
    v.push(send(0, 0, 9000, SIGNALED, 0));
    v.push(send(0, 4, 9000, SIGNALED, 0));
    v.push(send(0, 2, 9000, SIGNALED, 0));
    v.push(Action::Transmit(Transmit {
        from: 0,
        count: 5,
        fate: 0,
        a: 0,
        b: 0,
    }));
    v.extend(match step % 6 {
        // ERR on either end, then RESET and reconnect both with continuing PSNs.
        0 => vec![
            modify(0, 6),
            settle(0, 4),
            modify(1, 6),
            Action::Reconnect(Reconnect {
                which: 2 | 4,
                mtu: 5,
                timeout: 1,
                retry: 7,
                rnr: 7,
                ..Reconnect::default()
            }),
        ],
        // SQD in the middle of a message, then back to RTS.
        1 => vec![modify(0, 4), settle(0, 2), modify(0, 3)],
        // Deregister the source, the target and a receive buffer in flight.
        2 => vec![
            Action::Dereg(Dereg {
                end: 0,
                mr: 1,
                mode: 0,
            }),
            Action::Dereg(Dereg {
                end: 1,
                mr: 2,
                mode: 1,
            }),
            Action::Dereg(Dereg {
                end: 1,
                mr: 0,
                mode: 0,
            }),
        ],
        // Reconnect one end only, with a different MTU and unrelated PSNs.
        3 => vec![Action::Reconnect(Reconnect {
            which: 1,
            psn: [0x00_0100, 0xFF_FFFE],
            mtu: 0,
            timeout: 2,
            retry: 1,
            rnr: 0,
        })],
        // Drop everything for a while: retries until the budget runs out.
        4 => (0..10)
            .flat_map(|i| {
                [
                    Action::Transmit(Transmit {
                        from: i & 1,
                        count: 15,
                        fate: 3,
                        a: 0,
                        b: 0,
                    }),
                    Action::Timer(Timer { kind: 0, delta: 0 }),
                ]
            })
            .collect(),
        // RESET the responder under the requester.
        _ => vec![modify(1, 0), settle(0, 4)],
    });
    v
}

/// Every seed: normal exchanges at several MTUs, each followed by every replay mutation,
/// every fate, and every churn scenario.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for ty in TYPES {
        for mtu in [0u8, 2, 4] {
            out.push((format!("exchange-t{ty}-m{mtu}"), script(ty, mtu, [])));
        }
        for kind in 0..10 {
            out.push((
                format!("replay-t{ty}-k{kind}"),
                script(ty, kind % 5, replays(kind)),
            ));
        }
        for fate in 3..8 {
            out.push((
                format!("fate-t{ty}-f{fate}"),
                script(ty, 0, lossy_round(fate)),
            ));
        }
        for step in 0..6 {
            out.push((format!("churn-t{ty}-s{step}"), script(ty, 1, churn(step))));
        }
    }
    // The RC ones again with selective repeat (setup flag 0x40): SACKs, kept packets and
    // early retransmissions under the same replays and losses.
    let rc: Vec<_> = out
        .iter()
        .filter(|(name, _)| name.contains("-t0-"))
        .map(|(name, data)| {
            let mut data = data.clone();
            data[SETUP_FLAGS_BYTE] |= 0x40;
            (format!("{name}-sr"), data)
        })
        .collect();
    out.extend(rc);
    out
}

/// Where a script keeps its setup's flags: the third byte, after the type and the MTU.
const SETUP_FLAGS_BYTE: usize = 2;

/// The normal exchange alone completes every work request successfully for RC, UC and UD at
/// every MTU: the driver's "tidy" requests are valid, so the mutated replays start from real
/// traffic.
#[test]
fn normal_exchange_completes_every_request() {
    for ty in TYPES {
        for mtu in 0..5 {
            let (actions, (sends, recvs)) = exchange(ty);
            let s: Stats = execute(&setup(ty, mtu), &actions);
            assert_eq!(
                (s.send_ok, s.send_err, s.recv_ok, s.recv_err),
                (sends, 0, recvs, 0),
                "type {ty} mtu {mtu}: {s:?}"
            );
            assert!(s.transmitted >= sends, "type {ty} mtu {mtu}: {s:?}");
        }
    }
}

/// Every seed runs clean: replays of real packets under each mutation kind, each fate, each
/// state change and region churn in flight.
#[test]
fn mutated_real_traffic_breaks_no_invariant() {
    for (name, bytes) in seeds() {
        let s = run(&bytes);
        assert!(s.delivered > 0 && s.send_ok > 0, "{name}: {s:?}");
    }
}

/// `encode` is the inverse of `decode` on the seeds; with `SRDMA_FUZZ_SEED_DIR` set the seeds
/// are written there (one file each) to seed `cargo fuzz run qp_pair`.
#[test]
fn seeds_round_trip_and_can_seed_the_fuzz_corpus() {
    let dir = std::env::var_os("SRDMA_FUZZ_SEED_DIR");
    for (name, bytes) in seeds() {
        let (setup, actions) = decode(&bytes);
        assert_eq!(encode(&setup, &actions), bytes, "{name}");
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(std::path::Path::new(dir).join(name), &bytes).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// Random byte strings, decoded as a setup and up to 256 actions, break no invariant.
    #[test]
    fn random_bytes_break_no_invariant(data in proptest::collection::vec(any::<u8>(), 0..4000)) {
        run(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// A seed from real traffic followed by random actions (random bytes appended) breaks no
    /// invariant.
    #[test]
    fn real_traffic_then_random_actions_break_no_invariant(
        seed in 0usize..1000,
        tail in proptest::collection::vec(any::<u8>(), 0..1500),
    ) {
        let seeds = seeds();
        let mut data = seeds[seed % seeds.len()].1.clone();
        data.extend_from_slice(&tail);
        run(&data);
    }
}
