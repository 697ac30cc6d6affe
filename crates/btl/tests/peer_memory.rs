//! Heap bytes per idle peer: a module's memory grows by a fixed amount per
//! peer, whatever the window, and by at most 256 bytes for a peer it never
//! exchanged a datagram with. (It used to reserve transmit queue room for
//! peers × window: 10.7 KB per peer at MTU 1500's window of 740; and, until
//! the reliability state was made only for peers that talk, 587 bytes.)
//!
//! A byte-counting global allocator (`tests/support/counting_alloc.rs`)
//! tracks the live heap bytes of the measuring thread (allocations minus
//! frees, capacity included: an over-grown vector counts). A module on the
//! real `udp` provider
//! (loopback) adds peers from published addresses, as `add_procs` does in
//! a job: everything the module, the reliability state and the fabric keep
//! per peer is counted (endpoint, address handle, indexes, reserved queue
//! room). Progress is not called: an idle peer is one that was added and
//! never sent to.
//!
//! `UDBTL_PEER_MEMORY_PEERS=N` measures N peers instead of 10 000.

#![allow(clippy::unwrap_used)]

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;
use udbtl_wire::modex;

#[path = "../../../tests/support/counting_alloc.rs"]
mod counting;

use counting::{live_bytes_of, size};

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
    let (added, live) = live_bytes_of(|| btl.add_procs(&views).unwrap());
    // What add_procs returns is the caller's, not the module's.
    let returned = size(
        added.capacity() * size_of::<AddProcs>()
            + n as usize * (size_of::<Option<EndpointId>>() + size_of::<bool>()),
    );
    assert_eq!(added.len(), 1, "one module");
    let reached = added[0].endpoints.iter().flatten().count();
    assert_eq!(reached, n as usize, "every peer gets an endpoint");
    drop(added);
    btl.finalize().unwrap();
    (live - returned) as f64 / f64::from(n)
}

/// What an idle peer may cost at most: the scale target (issue 29).
const IDLE_PEER_BYTES_MAX: f64 = 256.0;

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
