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
fn tail_loss_is_repaired_by_the_probe_before_any_timeout() {
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
    // the gap. The tail-loss probe (two round trips later) resends it,
    // before any retransmission timeout.
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
    let s = net.nodes[0].rel.stats();
    assert_eq!(
        (s.tail_probes, s.timeouts, s.retransmitted),
        (1, 0, 1),
        "{s:?}"
    );
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

/// Goodput of 1000 one-way messages, in messages per virtual second, over a
/// link that loses `loss` of the datagrams both ways, and has a `bottleneck`
/// (time per datagram) both ways if given; and the sender's counters.
fn goodput(
    window: u16,
    loss: f64,
    seed: u64,
    bottleneck: Option<Duration>,
) -> (f64, udbtl_reliability::Stats) {
    let config = Config {
        window,
        initial_cwnd: window.min(16),
        // Loss recovery alone is measured: the receiver grants the whole
        // window from the first datagram.
        initial_credit: window,
        ..Config::default()
    };
    let mut net = Net::new(2, &config, seed);
    let faults = Faults {
        loss,
        ..Faults::default()
    };
    net.set_faults(0, 1, faults.clone());
    net.set_faults(1, 0, faults);
    if let Some(per_datagram) = bottleneck {
        net.set_bottleneck(0, 1, per_datagram);
        net.set_bottleneck(1, 0, per_datagram);
    }
    for i in 0..1000 {
        net.send(0, 1, payload(0, i, 1024));
    }
    // Goodput counts until the last message is delivered, not until the
    // last stale timer fires.
    net.run_while(Duration::from_secs(600), |n| {
        n.nodes[1].delivered.get(&0).map_or(0, Vec::len) < 1000
    });
    assert_eq!(
        net.nodes[1].delivered[&0].len(),
        1000,
        "loss {loss} window {window}"
    );
    let seconds = (net.now - Instant::ZERO).as_secs_f64();
    (1000.0 / seconds, *net.nodes[0].rel.stats())
}

/// Goodput at each loss rate and window, medians over 5 seeds, as a printed
/// table; and for window 64, each loss rate's ratio to lossless with the
/// median run's counters.
fn goodput_table(bottleneck: Option<Duration>) -> Vec<(f64, f64, udbtl_reliability::Stats)> {
    const SEEDS: [u64; 5] = [42, 43, 44, 45, 46];
    let median = |window: u16, loss: f64| {
        let mut runs: Vec<(f64, udbtl_reliability::Stats)> = SEEDS
            .iter()
            .map(|&seed| goodput(window, loss, seed, bottleneck))
            .collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        runs.swap_remove(SEEDS.len() / 2)
    };
    let mut table = format!("bottleneck {bottleneck:?}; messages/s\nloss \\ window");
    let windows = [4u16, 16, 64];
    for w in windows {
        write!(table, " | {w:>9}").unwrap();
    }
    table.push('\n');
    let mut at_64 = Vec::new();
    for loss in [0.0, 0.01, 0.05, 0.10, 0.30] {
        write!(table, "{:>12.0}%", loss * 100.0).unwrap();
        for window in windows {
            let (rate, stats) = median(window, loss);
            write!(table, " | {rate:>9.0}").unwrap();
            if window == 64 {
                at_64.push((loss, rate, stats));
            }
        }
        table.push('\n');
    }
    println!("{table}");
    let lossless = at_64[0].1;
    at_64
        .into_iter()
        .map(|(loss, rate, stats)| (loss, rate / lossless, stats))
        .collect()
}

fn assert_ratios(ratios: &[(f64, f64, udbtl_reliability::Stats)], bounds: [(f64, f64); 3]) {
    for (loss, needs) in bounds {
        let (_, ratio, stats) = ratios.iter().find(|r| r.0 == loss).unwrap();
        println!("window 64, loss {loss}: {ratio:.2} of lossless (needs {needs}); {stats:?}");
        assert!(
            ratio >= &needs,
            "loss {loss}: {ratio:.2} < {needs}; {stats:?}"
        );
    }
}

/// Loss recovery keeps goodput up under random loss both ways, as ratios to
/// the lossless run of the same harness (window 64), on a link with no
/// bottleneck, where the window is all that limits the sender.
///
/// Here the window of 64 is about one round trip of datagrams, so every
/// lost datagram stalls the sender for about a round trip: it cannot go past
/// the hole by more than the window until the repair is acknowledged, which
/// takes at least a round trip after the loss shows. At 1 % loss, 1000
/// messages (16 round trips lossless) meet about ten losses, so no in-order
/// protocol with this window reaches the 0.8; the bounds below are
/// what this recovery achieves (0.73, 0.42, 0.18 when written), with a
/// margin, and they fail if recovery regresses to waiting for timeouts
/// (0.29, 0.01 and 0.003 before RACK and the tail-loss probe).
#[test]
fn goodput_under_random_loss_stays_within_its_ratios_of_lossless() {
    let ratios = goodput_table(None);
    assert_ratios(&ratios, [(0.01, 0.65), (0.05, 0.35), (0.10, 0.14)]);
}

/// The same through a bottleneck of one datagram per 625 ns each way, so
/// the path holds 16 datagrams a round trip and the window of 64 has room
/// to repair a loss while new data flows, as on a real link. These are the
/// issue's targets: 0.8 of lossless at 1 % loss, 0.5 at 5 % and 0.3 at 10 %.
#[test]
fn goodput_through_a_bottleneck_meets_the_loss_recovery_targets() {
    let ratios = goodput_table(Some(Duration::from_nanos(625)));
    assert_ratios(&ratios, [(0.01, 0.8), (0.05, 0.5), (0.10, 0.3)]);
}

/// A window past the selective ACK's span (as MTU-sized datagrams need):
/// exactly once and in order, lossless and through loss, where a receiver
/// buffers what arrives far ahead of a hole that the sender repairs.
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

/// A datagram lost, then lost again when resent, is found lost again by
/// time (its retransmission is judged like any send) and repaired, without
/// a retransmission timeout.
#[test]
fn a_datagram_lost_twice_is_resent_twice_without_a_timeout() {
    let config = Config {
        initial_credit: Config::default().window,
        ..Config::default()
    };
    let mut net = Net::new(2, &config, 35);
    net.set_faults(
        0,
        1,
        Faults {
            drop_seq: Some((20, 2)),
            ..Faults::default()
        },
    );
    // A steady stream, so that datagrams sent after each transmission of
    // number 20 are delivered and show it missing.
    for i in 0..400 {
        net.send(0, 1, payload(0, i, 64));
        if i % 8 == 7 {
            let until = net.now + Duration::from_micros(2);
            net.run_while(Duration::from_secs(1), |n| n.now < until);
        }
    }
    net.run_until_idle(Duration::from_secs(10));
    assert_eq!(net.nodes[1].delivered[&0].len(), 400);
    let s = net.nodes[0].rel.stats();
    assert_eq!(
        (s.retransmitted, s.fast_retransmits, s.timeouts),
        (2, 2, 0),
        "{s:?}"
    );
}

/// A timeout that was spurious (the path only slowed down) resends one
/// datagram of a large window, not a burst (the tail-loss probe, due at the
/// same time before any round trip was measured, is an acknowledgement
/// request and resends nothing): the original datagrams' acknowledgements
/// then release everything, and show the retransmission spurious.
#[test]
fn a_spurious_timeout_costs_a_datagram_not_a_burst() {
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
    assert_eq!((s.timeouts, s.tail_probes), (1, 1), "{s:?}");
    assert_eq!(s.retransmitted, 1, "{s:?}");
    assert_eq!(s.spurious_retransmits, 1, "{s:?}");
}

/// Acknowledgements lost for a while, then one that answers a timeout's
/// resend and also covers first transmissions delivered long before: it
/// gives no round-trip sample, so the estimate stays that of the path, not
/// of the outage; and the backoff ends with it. Before, such a sample made
/// the smoothed round trip grow by an eighth of the outage each time, and
/// on a path losing 30 % both ways the timeout climbed to its maximum and
/// stayed there (a 2-rank job under 30 % kernel loss stalled).
#[test]
fn an_ack_that_answers_a_resend_gives_no_round_trip_sample() {
    let config = Config::default();
    let mut net = Net::new(2, &config, 51);
    net.send(0, 1, payload(0, 0, 8));
    net.run_until_idle(Duration::from_secs(1));
    let peer = net.nodes[0].node_peer[&1];
    // A lone message waits out the receiver's acknowledgement delay.
    let before = net.nodes[0].rel.srtt(peer).unwrap();

    let dark_from = net.now - Instant::ZERO;
    let outage = Duration::from_millis(20);
    net.set_faults(
        1,
        0,
        Faults {
            outage: Some((dark_from, dark_from + outage)),
            ..Faults::default()
        },
    );
    for i in 1..9 {
        net.send(0, 1, payload(0, i, 8));
    }
    net.run_until_idle(Duration::from_secs(10));
    assert_eq!(net.nodes[1].delivered[&0].len(), 9);
    assert_eq!(net.nodes[0].acked.len(), 9);
    let stats = *net.nodes[0].rel.stats();
    assert!(
        stats.timeouts > 0,
        "the outage made the timer expire: {stats:?}"
    );
    let after = net.nodes[0].rel.srtt(peer).unwrap();
    assert!(
        after <= before + before / 2,
        "the outage of {outage:?} leaked into the round trip: {before:?} -> {after:?}"
    );
    let rto = net.nodes[0].rel.rto(peer).unwrap();
    assert!(rto < outage / 4, "the backoff ended: {rto:?}");
}
