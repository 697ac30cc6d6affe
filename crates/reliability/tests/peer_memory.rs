//! Heap bytes the reliability state keeps per peer, measured with a
//! byte-counting allocator (`tests/support/counting_alloc.rs`): a peer added
//! and never sent to or heard from keeps only where its streams start; one
//! that exchanged data keeps its state too, whatever the window.
//!
//! One process's state adds 10 000 peers (`UDBTL_PEER_MEMORY_PEERS=N` for
//! another count), then exchanges one message each way with every peer in
//! turn, each peer played by a state of its own whose memory is not
//! counted.

#![allow(clippy::unwrap_used)]

use udbtl_reliability::{Config, Instant, PeerId, Reliability, Room};

#[path = "../../../tests/support/counting_alloc.rs"]
mod counting;

use counting::live_bytes_of;

type Core = Reliability<u64, u64>;

fn peers() -> u32 {
    std::env::var("UDBTL_PEER_MEMORY_PEERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Passes everything `from` sends to `to` as coming from `peer`, counting
/// the allocations of whichever side `counted` names (0: `from`, 1: `to`).
fn pass(from: &mut Core, to: &mut Core, peer: PeerId, now: Instant, counted: usize) -> i64 {
    let mut bytes = 0;
    let mut counted_if = |side: usize, f: &mut dyn FnMut()| {
        if side == counted {
            bytes += live_bytes_of(&mut *f).1;
        } else {
            f();
        }
    };
    loop {
        let mut transmit = None;
        counted_if(0, &mut || transmit = from.poll_transmit(now));
        let Some(tx) = transmit else {
            return bytes;
        };
        counted_if(1, &mut || {
            let _ = to.on_datagram(now, peer, &tx.header, tx.frag.unwrap_or(0), Room::ALL);
            while to.poll_deliver().is_some() {}
            while to.poll_event().is_some() {}
        });
    }
}

#[test]
fn a_peer_costs_its_stream_start_until_it_talks_and_its_state_after() {
    let n = peers();
    let config = Config::default();
    let mut core: Core = Reliability::new(config.clone()).unwrap();
    let (_, idle) = live_bytes_of(|| {
        core.reserve_peers(n as usize);
        for _ in 0..n {
            core.add_peer();
        }
    });
    let idle = idle as f64 / f64::from(n);
    println!("{n} idle peers: {idle:.0} heap bytes per peer");
    assert_eq!(idle, Core::bytes_per_idle_peer() as f64);
    assert_eq!(core.awake_peers(), 0, "adding a peer wakes nothing");

    let now = Instant::ZERO;
    let mut active = 0;
    for i in 0..n {
        let to_core = PeerId(i);
        let mut peer: Core = Reliability::new(config.clone()).unwrap();
        let to_peer = peer.add_peer();
        // A message from the peer, and one back: both answered at once.
        peer.send_awaited(now, to_peer, u64::from(i)).unwrap();
        active += pass(&mut peer, &mut core, to_core, now, 1);
        active += pass(&mut core, &mut peer, to_peer, now, 0);
        active += live_bytes_of(|| core.send_awaited(now, to_core, u64::from(i)).unwrap()).1;
        active += pass(&mut core, &mut peer, to_peer, now, 0);
        active += pass(&mut peer, &mut core, to_core, now, 1);
        assert_eq!(
            core.queued(to_core),
            Some((0, 0)),
            "peer {i}: all acknowledged"
        );
    }
    assert_eq!(core.awake_peers(), n as usize);
    let active = idle + active as f64 / f64::from(n);
    println!(
        "{n} peers that talked: {active:.0} heap bytes per peer ({} by the state's own count, \
         before its vectors' and timer heap's growth)",
        Core::bytes_per_active_peer()
    );
    // Vectors that double as peers wake hold up to twice their length, and
    // the timer heap and the list of active peers grow with them: a guard
    // against growth, not a figure (10 000 peers: 484 bytes; 8 193, just
    // past a doubling: 588).
    assert!(
        active <= 2.5 * Core::bytes_per_active_peer() as f64,
        "{active:.0} bytes per peer that talked"
    );
}

#[test]
fn a_dormant_peer_behaves_as_one_just_added() {
    let config = Config::default();
    let mut core: Core = Reliability::new(config.clone()).unwrap();
    let peer = core.add_peer();
    assert_eq!(core.rto(peer), Some(config.rto_initial));
    assert_eq!(core.cwnd(peer), Some(u32::from(config.initial_cwnd)));
    assert_eq!(core.queued(peer), Some((0, 0)));
    assert!(core.accepts(peer).is_ok());
    assert!(!core.is_lost(peer));
    assert!(core.backlog_tail(peer).is_none());
    assert_eq!(core.poll_timeout(), None, "a dormant peer arms no timer");
    assert_eq!(core.awake_peers(), 0, "asking wakes nothing");
    assert!(core.rto(PeerId(1)).is_none() && core.accepts(PeerId(1)).is_err());
}
