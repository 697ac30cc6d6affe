//! Deterministic scenarios on virtual time: every message arrives exactly
//! once, in order and byte-identical, whatever the faults, and a peer that
//! stops answering is reported lost on time.

#![allow(clippy::unwrap_used)]

mod harness;

use std::fmt::Write as _;
use std::time::Duration;

use harness::{Faults, Net, payload};
use udbtl_reliability::{Config, Instant, Reliability};

const MESSAGES: u64 = 2000;

/// Sends `MESSAGES` messages each way between two nodes with `faults` on
/// both links, and checks exactly-once, in-order, intact delivery.
fn exchange(config: &Config, faults: Faults, seed: u64) -> Net {
    let mut net = Net::new(2, config, seed);
    net.set_faults(0, 1, faults.clone());
    net.set_faults(1, 0, faults);
    for i in 0..MESSAGES {
        net.send(0, 1, payload(0, i, (i % 300) as usize));
        net.send(1, 0, payload(1, i, (i % 200) as usize));
        if i % 16 == 0 {
            net.advance(Duration::from_micros(20));
        }
    }
    net.run_until_idle(Duration::from_secs(600));
    for (receiver, sender) in [(1, 0), (0, 1)] {
        let got = net.nodes[receiver]
            .delivered
            .get(&sender)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            got.len() as u64,
            MESSAGES,
            "node {receiver} got {} of {MESSAGES} from {sender}; {:?} {:?}",
            got.len(),
            net.nodes[sender].rel.stats(),
            net.nodes[sender].lost_peers
        );
        for (i, bytes) in got.iter().enumerate() {
            let len = if sender == 0 { i % 300 } else { i % 200 };
            assert_eq!(
                bytes,
                &payload(sender, i as u64, len),
                "message {i} from {sender}"
            );
        }
        let mut acked = net.nodes[sender].acked.clone();
        acked.sort_unstable();
        assert_eq!(
            acked,
            (0..MESSAGES).collect::<Vec<_>>(),
            "each fragment acknowledged exactly once"
        );
        assert!(net.nodes[sender].failed.is_empty());
    }
    net
}

#[test]
fn lossless_needs_no_retransmission() {
    let net = exchange(&Config::default(), Faults::default(), 1);
    for node in &net.nodes {
        let s = node.rel.stats();
        assert_eq!(
            (s.retransmitted, s.timeouts, s.duplicates),
            (0, 0, 0),
            "{s:?}"
        );
    }
}

#[test]
fn loss_of_1_5_10_and_30_percent() {
    for (loss, seed) in [(0.01, 2), (0.05, 3), (0.10, 4), (0.30, 5)] {
        println!("loss {loss}");
        let net = exchange(
            &Config::default(),
            Faults {
                loss,
                ..Faults::default()
            },
            seed,
        );
        let s = net.nodes[0].rel.stats();
        assert!(s.retransmitted > 0, "loss {loss}: {s:?}");
        assert!(
            s.fast_retransmits > 0,
            "loss {loss}: SACK gaps trigger fast retransmit: {s:?}"
        );
    }
}

#[test]
fn duplication_of_5_percent() {
    let net = exchange(
        &Config::default(),
        Faults {
            duplicate: 0.05,
            ..Faults::default()
        },
        6,
    );
    assert!(
        net.nodes[1].rel.stats().duplicates > 50,
        "{:?}",
        net.nodes[1].rel.stats()
    );
}

#[test]
fn reordering_within_the_window() {
    let faults = Faults {
        reorder: 0.2,
        reorder_delay: Duration::from_micros(30),
        ..Faults::default()
    };
    let net = exchange(&Config::default(), faults, 7);
    let s = net.nodes[1].rel.stats();
    assert!(
        s.out_of_order > 100,
        "early datagrams are buffered, not dropped: {s:?}"
    );
}

#[test]
fn reordering_beyond_the_window() {
    // Delays of several milliseconds put a datagram far behind the window.
    let faults = Faults {
        reorder: 0.05,
        reorder_delay: Duration::from_millis(5),
        ..Faults::default()
    };
    let net = exchange(&Config::default(), faults, 8);
    let s = net.nodes[1].rel.stats();
    assert!(
        s.duplicates > 0 || s.out_of_window > 0,
        "late copies arrive after their retransmission: {s:?}"
    );
}

#[test]
fn corruption_of_1_percent_is_caught_and_repaired() {
    let net = exchange(
        &Config::default(),
        Faults {
            corrupt: 0.01,
            ..Faults::default()
        },
        9,
    );
    assert!(net.nodes.iter().map(|n| n.bad_checksums).sum::<u64>() > 10);
}

#[test]
fn tail_loss_is_repaired_by_the_timer() {
    // The whole burst must be in flight at once, before any credit comes
    // back: the sender trusts the full window from the start.
    let config = Config {
        initial_credit: Config::default().window,
        ..Config::default()
    };
    let mut net = Net::new(2, &config, 10);
    for i in 0..10 {
        net.send(0, 1, payload(0, i, 32));
    }
    // The last datagram of the burst is lost: nothing after it can reveal
    // the gap, so only the retransmission timer recovers it.
    net.set_faults(
        0,
        1,
        Faults {
            outage: Some((Duration::ZERO, Duration::from_nanos(1))),
            ..Faults::default()
        },
    );
    net.send(0, 1, payload(0, 10, 32));
    net.set_faults(0, 1, Faults::default());
    net.run_until_idle(Duration::from_secs(10));
    assert_eq!(net.nodes[1].delivered[&0].len(), 11);
    assert_eq!(net.nodes[0].rel.stats().timeouts, 1);
    assert_eq!(net.nodes[0].acked.len(), 11);
}

#[test]
fn ack_loss_is_repaired() {
    let config = Config::default();
    let mut net = Net::new(2, &config, 11);
    // One-way traffic: only acknowledgement-only datagrams flow back, and
    // they are all lost for the first 100 ms.
    net.set_faults(
        1,
        0,
        Faults {
            outage: Some((Duration::ZERO, Duration::from_millis(100))),
            ..Faults::default()
        },
    );
    for i in 0..500 {
        net.send(0, 1, payload(0, i, 64));
    }
    net.run_until_idle(Duration::from_secs(30));
    assert_eq!(net.nodes[1].delivered[&0].len(), 500);
    assert_eq!(net.nodes[0].acked.len(), 500);
    assert!(
        net.nodes[1].rel.stats().duplicates > 0,
        "retransmissions of delivered datagrams are re-acknowledged"
    );
}

fn blackout(length: Duration) -> Net {
    let config = Config {
        peer_timeout: Duration::from_secs(1),
        rto_max: Duration::from_millis(300),
        ..Config::default()
    };
    let mut net = Net::new(3, &config, 12);
    // Node 0 talks to 1 and 2; the link 0 -> 2 goes dark for `length`.
    net.set_faults(
        0,
        2,
        Faults {
            outage: Some((
                Duration::from_millis(10),
                Duration::from_millis(10) + length,
            )),
            ..Faults::default()
        },
    );
    for i in 0..100 {
        net.send(0, 1, payload(0, i, 16));
        net.send(0, 2, payload(0, i, 16));
        net.advance(Duration::from_micros(200));
    }
    net.run_until_idle(Duration::from_secs(20));
    net
}

#[test]
fn blackout_shorter_than_the_failure_timeout_loses_nothing() {
    let net = blackout(Duration::from_millis(700));
    assert!(net.nodes[0].lost_peers.is_empty());
    assert_eq!(net.nodes[2].delivered[&0].len(), 100);
    assert_eq!(net.nodes[1].delivered[&0].len(), 100);
}

#[test]
fn blackout_longer_than_the_failure_timeout_loses_only_that_peer() {
    let net = blackout(Duration::from_secs(5));
    let lost = &net.nodes[0].lost_peers;
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].0, 2);
    // The last acknowledgement from node 2 came just after the outage began
    // (10 ms); the failure is due one peer_timeout later, give or take an RTO.
    let at = lost[0].1 - Instant::ZERO;
    let rto = Duration::from_millis(300);
    assert!(
        at >= Duration::from_millis(1010) - rto && at <= Duration::from_millis(1010) + rto,
        "lost at {at:?}"
    );
    // Every fragment for node 2 that was not acknowledged failed; node 1 is
    // unaffected.
    assert!(!net.nodes[0].failed.is_empty());
    assert_eq!(net.nodes[0].acked.len() + net.nodes[0].failed.len(), 200);
    assert_eq!(net.nodes[1].delivered[&0].len(), 100);
    assert!(net.nodes[0].rel.is_lost(net.nodes[0].node_peer[&2]));
}

#[test]
fn idle_peers_arm_no_timer_and_stay_small() {
    let config = Config::default();
    let mut net = Net::new(2, &config, 13);
    net.send(0, 1, payload(0, 0, 8));
    net.run_until_idle(Duration::from_secs(10));
    assert!(
        net.nodes.iter_mut().all(|n| n.rel.poll_timeout().is_none()),
        "no timer while idle"
    );
    let size = Reliability::<u64, u64>::peer_state_size();
    println!("per-peer state: {size} bytes");
    assert!(size <= 256, "per-peer state is {size} bytes");
}

#[test]
fn closed_peer_lingers_and_still_acknowledges() {
    let config = Config {
        linger: Duration::from_millis(50),
        ..Config::default()
    };
    let mut net = Net::new(2, &config, 14);
    net.send(0, 1, payload(0, 0, 8));
    net.run_until_idle(Duration::from_secs(1));
    let peer = net.nodes[1].node_peer[&0];
    net.nodes[1].rel.close_peer(net.now, peer);
    net.send(0, 1, payload(0, 1, 8));
    net.run_until_idle(Duration::from_secs(2));
    assert_eq!(net.nodes[1].delivered[&0].len(), 2);
    assert_eq!(net.nodes[0].acked.len(), 2);
}

/// Goodput (messages delivered per virtual second) for loss rates and
/// windows, kept as a snapshot: a change in protocol behaviour shows up as a
/// diff. Set `UPDATE_SNAPSHOTS=1` to rewrite it.
#[test]
fn goodput_table_snapshot() {
    let mut table = String::from("loss \\ window");
    let windows = [4u16, 16, 65];
    for w in windows {
        write!(table, " | {w:>9}").unwrap();
    }
    table.push('\n');
    for loss in [0.0, 0.01, 0.05, 0.10, 0.30] {
        write!(table, "{:>12.0}%", loss * 100.0).unwrap();
        for window in windows {
            let config = Config {
                window,
                initial_cwnd: window.min(16),
                // The table measures loss recovery with a receiver that
                // grants the whole window from the first datagram.
                initial_credit: window,
                ..Config::default()
            };
            let mut net = Net::new(2, &config, 42);
            net.set_faults(
                0,
                1,
                Faults {
                    loss,
                    ..Faults::default()
                },
            );
            net.set_faults(
                1,
                0,
                Faults {
                    loss,
                    ..Faults::default()
                },
            );
            for i in 0..1000 {
                net.send(0, 1, payload(0, i, 1024));
            }
            // Goodput counts until the last message is delivered, not until
            // the last stale timer fires.
            net.run_while(Duration::from_secs(600), |n| {
                n.nodes[1].delivered.get(&0).map_or(0, Vec::len) < 1000
            });
            assert_eq!(
                net.nodes[1].delivered[&0].len(),
                1000,
                "loss {loss} window {window}"
            );
            let seconds = (net.now - Instant::ZERO).as_secs_f64();
            write!(table, " | {:>9.0}", 1000.0 / seconds).unwrap();
        }
        table.push('\n');
    }
    println!("{table}");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/goodput.txt");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() || !std::path::Path::new(path).exists() {
        std::fs::create_dir_all(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots")).unwrap();
        std::fs::write(path, &table).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(path).unwrap(),
        table,
        "goodput changed; rerun with UPDATE_SNAPSHOTS=1 if intended"
    );
}

/// A window past the selective ACK's span (as MTU-sized datagrams need):
/// exactly once and in order, lossless and through loss, where a receiver
/// drops what arrives too far ahead of a hole and the sender repairs it.
#[test]
fn a_large_window_streams_and_repairs_loss() {
    let config = Config {
        window: 512,
        initial_cwnd: 512,
        initial_credit: 512,
        ..Config::default()
    };
    let lossless = exchange(&config, Faults::default(), 31);
    let s = lossless.nodes[0].rel.stats();
    assert_eq!((s.retransmitted, s.timeouts), (0, 0), "{s:?}");
    for (loss, seed) in [(0.01, 32), (0.05, 33)] {
        let net = exchange(
            &config,
            Faults {
                loss,
                ..Faults::default()
            },
            seed,
        );
        assert!(net.nodes[0].rel.stats().retransmitted > 0);
    }
}

/// A timeout that was spurious (the path only slowed down) resends a
/// bounded burst of a large window, not all of it: the original datagrams'
/// acknowledgements then release everything.
#[test]
fn a_spurious_timeout_resends_a_burst_not_the_whole_window() {
    let config = Config {
        window: 512,
        initial_cwnd: 512,
        initial_credit: 512,
        ..Config::default()
    };
    let mut net = Net::new(2, &config, 34);
    // One way takes 0.8 of the first timeout: the timer fires before any
    // acknowledgement can come back, and the acknowledgements arrive before
    // a second expiry.
    net.latency = config.rto_initial.mul_f64(0.8);
    for i in 0..400 {
        net.send(0, 1, payload(0, i, 64));
    }
    net.run_until_idle(Duration::from_secs(60));
    assert_eq!(net.nodes[1].delivered[&0].len(), 400);
    let s = net.nodes[0].rel.stats();
    assert_eq!(s.timeouts, 1, "{s:?}");
    let span = udbtl_reliability::SACK_SPAN as u64;
    assert_eq!(s.retransmitted, span, "{s:?}");
}
