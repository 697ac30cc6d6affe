//! Scale on virtual time (`scalenet/mod.rs`): incast, a stencil among
//! thousands of peers, a broadcast root and an all-to-all, each checked for
//! exactly-once in-order delivery, no peer lost and no retransmission
//! timeout without loss;
//! each prints its figures beside those of the even credit split that
//! receiver-driven credit replaced.
//!
//! `UDBTL_SCALE_LARGE=1` runs the larger variants (10 000 peers in the
//! stencil, 1 000 nodes in the all-to-all).

#![allow(clippy::unwrap_used)]

mod scalenet;

use std::time::Duration;

use scalenet::{CreditPolicy, Outcome, ScaleNet, Setup, jain};

const LIMIT: Duration = Duration::from_secs(600);

fn large() -> bool {
    std::env::var_os("UDBTL_SCALE_LARGE").is_some()
}

/// Receiver goodput as a share of its link: data delivered × the time one
/// datagram takes on the link, over the time it all took.
fn goodput(setup: &Setup, outcome: &Outcome) -> f64 {
    outcome.delivered as f64 * setup.per_datagram.as_secs_f64() / outcome.finished.as_secs_f64()
}

fn assert_clean(what: &str, outcome: &Outcome, lossless: bool) {
    assert_eq!(outcome.delivered, outcome.data_sent, "{what}: {outcome:?}");
    assert_eq!(outcome.peers_lost, 0, "{what}: {outcome:?}");
    if lossless {
        assert_eq!(outcome.timeouts, 0, "{what}: {outcome:?}");
    }
}

/// `senders` nodes each send `messages` datagrams to node 0 at once.
fn incast(senders: usize, messages: u64, loss: f64, policy: CreditPolicy) -> (Outcome, f64, f64) {
    let mut setup = Setup::new(senders + 1, policy);
    setup.loss = loss;
    let mut net = ScaleNet::new(setup.clone());
    for s in 1..=senders {
        net.connect(0, s);
        net.send(s, 0, messages);
    }
    let outcome = net.run(LIMIT);
    let sources: Vec<usize> = (1..=senders).collect();
    let rates: Vec<f64> = net
        .last_deliveries(0, &sources)
        .iter()
        .map(|t| messages as f64 / t.as_secs_f64())
        .collect();
    (outcome.clone(), goodput(&setup, &outcome), jain(&rates))
}

#[test]
fn a_thousand_senders_into_one_fill_its_link_fairly() {
    for loss in [0.0, 0.01] {
        for policy in [CreditPolicy::Even, CreditPolicy::Shared] {
            let (outcome, goodput, fairness) = incast(1_000, 100, loss, policy);
            println!(
                "incast 1000 -> 1, 100 messages each, loss {loss}, {policy:?}: goodput {goodput:.3} of the link, \
                 Jain {fairness:.3}, {:.1} ms, {} timeouts, {} dropped at the pool",
                outcome.finished.as_secs_f64() * 1e3,
                outcome.timeouts,
                outcome.dropped_no_buffer
            );
            if policy == CreditPolicy::Shared {
                assert_clean("incast", &outcome, loss == 0.0);
                assert!(goodput >= 0.9, "goodput {goodput}: {outcome:?}");
                assert!(fairness >= 0.9, "fairness {fairness}: {outcome:?}");
            }
        }
    }
}

/// Node 0 and its 26 neighbours (a 3-D stencil) exchange `messages` each
/// way; every node has `peers` peers in all, the others idle.
fn stencil(peers: usize, messages: u64, policy: CreditPolicy) -> Outcome {
    let mut net = ScaleNet::new(Setup::new(27, policy));
    for n in 1..27 {
        net.connect(0, n);
        net.send(0, n, messages);
        net.send(n, 0, messages);
    }
    for n in 0..27 {
        let idle = peers.saturating_sub(net.peers(n));
        net.add_idle_peers(n, idle);
    }
    net.run(LIMIT)
}

#[test]
fn a_stencil_among_thousands_of_peers_is_not_slowed_by_the_idle_ones() {
    let sizes: &[usize] = if large() {
        &[100, 1_000, 10_000]
    } else {
        &[100, 1_000, 6_000]
    };
    for &peers in sizes {
        let even = stencil(peers, 2_000, CreditPolicy::Even);
        let shared = stencil(peers, 2_000, CreditPolicy::Shared);
        println!(
            "stencil, 26 neighbours among {peers} peers, 2000 messages each way: \
             {:.1} ms with credit by need, {:.1} ms split evenly ({} and {} timeouts)",
            shared.finished.as_secs_f64() * 1e3,
            even.finished.as_secs_f64() * 1e3,
            shared.timeouts,
            even.timeouts,
        );
        // Node 0 sends to 26 peers at once through its one link: the
        // acknowledgements it owes them go ahead of its own data, or their
        // retransmission timers expire while the acknowledgements wait
        // (12 to 45 did, when they queued behind it).
        assert_clean("stencil", &shared, true);
        assert_clean("stencil, split evenly", &even, true);
        // By need, idle peers cost the talking ones nothing: the exchange
        // takes as long among 10 000 peers as among 100 (virtual time).
        let baseline = stencil(27, 2_000, CreditPolicy::Shared);
        assert!(
            shared.finished.as_secs_f64() <= 1.1 * baseline.finished.as_secs_f64(),
            "{peers} peers: {:?} against {:?} among the 26 alone",
            shared.finished,
            baseline.finished
        );
    }
}

#[test]
fn a_broadcast_root_reaches_a_thousand_peers() {
    let nodes = 1_001;
    let mut net = ScaleNet::new(Setup::new(nodes, CreditPolicy::Shared));
    for n in 1..nodes {
        net.connect(0, n);
        net.send(0, n, 10);
    }
    let outcome = net.run(LIMIT);
    println!(
        "broadcast 1 -> 1000, 10 messages each: {:.1} ms, {} timeouts",
        outcome.finished.as_secs_f64() * 1e3,
        outcome.timeouts
    );
    assert_clean("broadcast", &outcome, true);
}

#[test]
fn an_all_to_all_completes() {
    let nodes = if large() { 1_000 } else { 200 };
    let mut net = ScaleNet::new(Setup::new(nodes, CreditPolicy::Shared));
    for a in 0..nodes {
        for b in a + 1..nodes {
            net.connect(a, b);
        }
    }
    for a in 0..nodes {
        for b in (0..nodes).filter(|b| *b != a) {
            net.send(a, b, 2);
        }
    }
    let outcome = net.run(LIMIT);
    println!(
        "all-to-all among {nodes}, 2 messages each pair: {:.1} ms, {} timeouts, {} dropped at a pool",
        outcome.finished.as_secs_f64() * 1e3,
        outcome.timeouts,
        outcome.dropped_no_buffer
    );
    assert_clean("all-to-all", &outcome, true);
}
