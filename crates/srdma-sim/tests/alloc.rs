//! The simulator allocates nothing per datagram in steady state (only a rare high-water mark
//! grows), so a benchmark built on it
//! measures the endpoints. Alone in its own test binary because it swaps the global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use srdma_sim::{Endpoint, Instant, LinkConfig, Outcome, Sim, Transmit};

/// Counts allocations made by threads that opted in.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNT_HERE.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
// contract; the counter neither allocates nor touches the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const LEN: usize = 256;

/// Keeps `window` datagrams in flight to `peer` (sends one more per echo), or echoes.
struct Flow {
    me: SocketAddr,
    peer: Option<SocketAddr>,
    to_start: usize,
    echoes: VecDeque<(SocketAddr, [u8; LEN])>,
    received: u64,
}

impl Endpoint for Flow {
    fn handle_datagram(&mut self, _: Instant, src: SocketAddr, _: SocketAddr, p: &[u8]) {
        self.received += 1;
        if self.peer.is_some() {
            self.to_start += 1;
        } else {
            let mut copy = [0u8; LEN];
            copy[..p.len()].copy_from_slice(p);
            self.echoes.push_back((src, copy));
        }
    }
    fn poll_transmit(&mut self, _: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        let dst = match (self.peer, self.echoes.pop_front()) {
            (_, Some((src, p))) => {
                buf.extend_from_slice(&p);
                src
            }
            (Some(peer), None) if self.to_start > 0 => {
                self.to_start -= 1;
                buf.resize(LEN, 0xAB);
                peer
            }
            _ => return None,
        };
        Some(Transmit::new(self.me, dst))
    }
    fn poll_timeout(&mut self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _: Instant) {}
}

#[test]
fn steady_state_allocates_nothing_per_datagram() {
    let (a, b) = (
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    );
    let flow = |me: IpAddr, peer: Option<IpAddr>, window| Flow {
        me: SocketAddr::new(me, 4791),
        peer: peer.map(|p| SocketAddr::new(p, 4791)),
        to_start: window,
        echoes: VecDeque::with_capacity(64),
        received: 0,
    };
    let mut sim = Sim::new(5);
    sim.set_default_link(LinkConfig {
        latency: Duration::from_micros(2),
        jitter: Duration::from_nanos(300),
        bandwidth_bps: Some(10_000_000_000),
        reorder: 0.05,
        reorder_delay: Duration::from_nanos(500),
        corrupt: 0.05,
        ..LinkConfig::IDEAL
    })
    .unwrap();
    let client = sim.add_host(a, flow(a, Some(b), 16)).unwrap();
    sim.add_host(b, flow(b, None, 0)).unwrap();

    assert_eq!(
        sim.run_until(Instant::ZERO + Duration::from_millis(1)),
        Outcome::Deadline
    );
    let before = sim.endpoint(client).received;
    COUNT_HERE.with(|c| c.set(true));
    let outcome = sim.run_until(Instant::ZERO + Duration::from_millis(25));
    COUNT_HERE.with(|c| c.set(false));
    let datagrams = 2 * (sim.endpoint(client).received - before);
    assert_eq!(outcome, Outcome::Deadline);
    assert!(datagrams > 100_000, "only {datagrams} datagrams");
    // A rare burst may still push a high-water mark (the event heap, the buffer pool, a
    // link's serializer backlog) past a power of two: a handful of reallocations over the
    // run, never one per datagram.
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    assert!(
        allocations <= 4,
        "{allocations} allocations over {datagrams} datagrams"
    );
}
