//! Receiver-driven credit (`Reliability::share_credit`): the peers that send
//! share the receive pool (up to two windows together); idle peers keep an
//! even share of at most half of it; a peer told 0 hears as soon as its
//! credit comes back.

#![allow(clippy::unwrap_used)]

mod pair;

use std::time::Duration;

use udbtl_reliability::{Config, Instant, PeerId, Reliability, Room};
use udbtl_wire::SeqNum;
use udbtl_wire::rel::{self, FLAG_ACK_REQ, FLAG_FIRST, FLAG_LAST};

use pair::*;

/// The default pool of the BTL at MTU 1500: 6 000 buffers, 256 reserved.
const FREE: usize = 5_744;

fn config() -> Config {
    Config {
        window: 740,
        ..Config::default()
    }
}

/// A receiver with `peers` peers, sharing `FREE` buffers.
fn receiver(peers: u32) -> Core {
    let mut core = Reliability::new(config()).unwrap();
    for _ in 0..peers {
        core.add_peer();
    }
    core.share_credit(Instant::ZERO, FREE, 1);
    core
}

/// Data datagram `seq` from a peer, asking for an acknowledgement.
fn data(seq: u32) -> rel::Repr {
    rel::Repr {
        seq: SeqNum(seq),
        flags: FLAG_FIRST | FLAG_LAST | FLAG_ACK_REQ,
        ..rel::Repr::default()
    }
}

/// The credit in the acknowledgement `core` sends `peer` now.
fn credit_to(core: &mut Core, now: Instant, peer: PeerId) -> u16 {
    let txs = drain(core, now);
    txs.iter()
        .rev()
        .find(|tx| tx.peer == peer)
        .map(|tx| tx.header.credit)
        .expect("an acknowledgement to the peer")
}

#[test]
fn one_sender_among_six_thousand_idle_peers_gets_a_whole_window() {
    let mut core = receiver(6_000);
    let sender = PeerId(4_321);
    let _ = core.on_datagram(Instant::ZERO, sender, &data(0), 0, Room::ALL);
    let credit = credit_to(&mut core, Instant::ZERO, sender);
    // An even split gave every pair FREE / 6000 = 0, raised to the floor
    // of 1.
    assert_eq!(
        credit, 740,
        "two windows, of half the pool, are the active peers'"
    );
    assert_eq!(core.active_peers(), 1);
    // An idle peer asking for an acknowledgement gets the floor.
    let idle = PeerId(7);
    let _ = core.on_datagram(
        Instant::ZERO,
        idle,
        &control(FLAG_ACK_REQ, 0, 64),
        0,
        Room::ALL,
    );
    assert_eq!(credit_to(&mut core, Instant::ZERO, idle), 1);
}

#[test]
fn active_senders_share_the_pool_and_idle_ones_keep_at_most_half() {
    let mut core = receiver(1_000);
    let senders: Vec<PeerId> = (0..100).map(PeerId).collect();
    for &peer in &senders {
        let _ = core.on_datagram(Instant::ZERO, peer, &data(0), 0, Room::ALL);
    }
    let txs = drain(&mut core, Instant::ZERO);
    assert_eq!(txs.len(), 100);
    let active: Vec<u16> = txs.iter().map(|tx| tx.header.credit).collect();
    // Idle: min(5744 / 1000, 2872 / 900) = 3 each, 2700 in all; the 100
    // active share the other 3044, but at most two windows (1480).
    assert!(active.iter().all(|c| *c == 14), "{active:?}");
    let promised = 100 * 14 + 900 * 3;
    assert!(promised <= FREE, "{promised} promised of {FREE}");
}

#[test]
fn a_sender_gone_quiet_for_the_horizon_is_idle_again() {
    let mut core = receiver(1_000);
    let _ = core.on_datagram(Instant::ZERO, P, &data(0), 0, Room::ALL);
    assert_eq!(credit_to(&mut core, Instant::ZERO, P), 740);
    let later = Instant::ZERO + config().credit_horizon + Duration::from_millis(1);
    core.share_credit(later, FREE, 1);
    assert_eq!(core.active_peers(), 0);
    let _ = core.on_datagram(later, P, &control(FLAG_ACK_REQ, 0, 64), 0, Room::ALL);
    // All 1 000 idle: half the pool, evenly.
    assert_eq!(credit_to(&mut core, later, P), 2);
}

#[test]
fn a_peer_told_zero_hears_at_once_when_room_comes_back() {
    let mut core = receiver(2);
    core.share_credit(Instant::ZERO, 0, 0);
    let _ = core.on_datagram(
        Instant::ZERO,
        P,
        &control(FLAG_ACK_REQ, 0, 64),
        0,
        Room::ALL,
    );
    assert_eq!(credit_to(&mut core, Instant::ZERO, P), 0);
    // Still no room: nothing to say.
    core.share_credit(at(ms(1)), 0, 0);
    assert!(drain(&mut core, at(ms(1))).is_empty());
    // Room again: an acknowledgement goes without anything from the peer.
    core.share_credit(at(ms(2)), FREE, 1);
    let txs = drain(&mut core, at(ms(2)));
    assert_eq!(txs.len(), 1, "{txs:?}");
    assert_eq!(txs[0].peer, P);
    assert!(txs[0].header.credit > 0);
    assert_eq!(core.stats().credit_updates, 1);
    // Once: the peer is not starved any more.
    core.share_credit(at(ms(3)), FREE, 1);
    assert!(drain(&mut core, at(ms(3))).is_empty());
}
