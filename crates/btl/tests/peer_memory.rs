//! Heap bytes per peer: a module's memory grows by a fixed amount per peer,
//! whatever the window. (It used to reserve transmit queue room for
//! peers × window: 10.7 KB per peer at MTU 1500's window of 740.)
//!
//! A byte-counting global allocator tracks the live heap bytes of the
//! measuring thread (allocations minus frees, capacity included: an
//! over-grown vector counts). A module on the real `udp` provider
//! (loopback) adds peers from published addresses, as `add_procs` does in
//! a job: everything the module, the reliability state and the fabric keep
//! per peer is counted (endpoint, address handle, indexes, reserved queue
//! room). Progress is not called: an idle peer is one that was added and
//! never sent to.
//!
//! `UDBTL_PEER_MEMORY_PEERS=N` measures N peers instead of 10 000.

#![allow(unsafe_code, clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;
use udbtl_wire::modex;

/// `System`, counting the live bytes of armed threads.
struct Counting;

/// Live bytes allocated by armed threads (negative if they freed more
/// than they allocated while armed).
static LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// Whether this thread's allocations are counted. Const-initialized:
    /// reading it allocates nothing.
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

fn count(bytes: i64) {
    if ARMED.try_with(Cell::get).unwrap_or(false) {
        LIVE.fetch_add(bytes, Ordering::Relaxed);
    }
}

fn size(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; counting touches only an atomic
// and a const-initialized thread-local, and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(size(layout.size()));
        // SAFETY: the caller's contract for `alloc` is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(size(layout.size()));
        // SAFETY: the caller's contract for `alloc_zeroed` is `System`'s.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(size(new_size) - size(layout.size()));
        // SAFETY: `ptr` came from `System` with `layout`; the rest is the
        // caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-size(layout.size()));
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A module on UDP loopback with `window` datagrams per peer.
fn component(window: &str) -> Component<UdpProvider> {
    let params = Params::load_from(&BtlConfig::default(), |name| {
        (name == "UDBTL_REL_WINDOW").then(|| window.to_string())
    })
    .unwrap();
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

/// The published addresses of `n` peers on loopback, as their blobs:
/// copies of `like` with their own ports, process ids and nonces.
fn peer_blobs(like: modex::Address, n: u32) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let port = 20_000 + 4 * i;
            let peer = modex::Address {
                qpns: [port, port + 1, port + 2, port + 3],
                proc_id: 1_000_000 + i,
                stream_nonce: i.wrapping_mul(0x9e37_79b9),
                ..like
            };
            modex::emit_blob(&[peer]).unwrap()
        })
        .collect()
}

/// Live heap bytes per peer when a module with `window` adds `n` peers.
fn bytes_per_peer(window: &str, n: u32) -> f64 {
    let mut btl = component(window);
    let like = modex::parse_blob(&btl.modex()).unwrap()[0];
    let blobs = peer_blobs(like, n);
    let views: Vec<Option<&[u8]>> = blobs.iter().map(|b| Some(b.as_slice())).collect();
    let mut added = Vec::with_capacity(1);
    LIVE.store(0, Ordering::Relaxed);
    ARMED.with(|a| a.set(true));
    added.push(btl.add_procs(&views).unwrap());
    ARMED.with(|a| a.set(false));
    let live = LIVE.load(Ordering::Relaxed);
    // What add_procs returns is the caller's, not the module's.
    let returned = size(n as usize * (size_of::<Option<EndpointId>>() + size_of::<bool>()));
    let reached = added[0][0].endpoints.iter().flatten().count();
    assert_eq!(reached, n as usize, "every peer gets an endpoint");
    drop(added);
    btl.finalize().unwrap();
    (live - returned) as f64 / f64::from(n)
}

/// Where an idle peer's bytes stay under: a guard against growth, not a
/// goal (the reliability state alone keeps 256 bytes per peer).
const IDLE_PEER_BYTES_MAX: f64 = 768.0;

#[test]
fn an_idle_peers_memory_does_not_grow_with_the_window() {
    let n = std::env::var("UDBTL_PEER_MEMORY_PEERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let figures: Vec<f64> = ["64", "740", "1024"]
        .into_iter()
        .map(|window| {
            let per_peer = bytes_per_peer(window, n);
            println!("window {window}, {n} idle peers: {per_peer:.0} heap bytes per peer");
            per_peer
        })
        .collect();
    assert!(
        figures.iter().all(|f| (f - figures[0]).abs() < 1.0),
        "{figures:?}: the window changes the bytes per peer"
    );
    assert!(
        figures[0] <= IDLE_PEER_BYTES_MAX,
        "{figures:?} bytes per idle peer"
    );
}
