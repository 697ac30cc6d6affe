//! Liveness without progress, zero-window probing and initial credit.

use super::*;

// ----- 3. liveness, not progress --------------------------------------------

#[test]
fn busy_receiver_that_keeps_answering_is_not_lost() {
    let config = liveness_config();
    let mut net = Net::new(2, &config, 21);
    // The receiver can take nothing and grants nothing, for three failure
    // timeouts; it still answers every datagram.
    net.nodes[1].room = Room {
        in_order: false,
        early: false,
    };
    net.nodes[1].rel.set_credit(0);
    for i in 0..50 {
        net.send(0, 1, payload(0, i, 64));
    }
    net.advance(3 * config.peer_timeout);
    assert!(net.nodes[0].lost_peers.is_empty(), "busy is not lost");
    assert!(net.nodes[1].lost_peers.is_empty());
    assert!(!net.nodes[1].delivered.contains_key(&0));
    assert!(net.nodes[1].rel.stats().refused_no_room > 0);
    assert!(net.nodes[0].acked.is_empty());
    // Room returns: everything arrives, once, in order.
    net.nodes[1].room = Room::ALL;
    net.nodes[1].rel.set_credit(config.window);
    net.run_until_idle(Duration::from_secs(60));
    let got = &net.nodes[1].delivered[&0];
    assert_eq!(got.len(), 50);
    for (i, bytes) in got.iter().enumerate() {
        assert_eq!(bytes, &payload(0, i as u64, 64));
    }
    let mut acked = net.nodes[0].acked.clone();
    acked.sort_unstable();
    assert_eq!(acked, (0..50).collect::<Vec<_>>());
    assert!(net.nodes[0].failed.is_empty());
    assert!(net.nodes[0].lost_peers.is_empty());
}

/// Node 1 grants no credit: node 0 delivers its first burst, then probes.
fn probing_net(config: &Config, seed: u64) -> Net {
    let mut net = Net::new(2, config, seed);
    net.record = true;
    net.nodes[1].rel.set_credit(0);
    for i in 0..10 {
        net.send(0, 1, payload(0, i, 32));
    }
    net
}

#[test]
fn silent_peer_is_still_lost_within_timeout_and_one_rto_max() {
    let config = liveness_config();
    let mut net = probing_net(&config, 22);
    let dark_from = ms(100);
    net.set_faults(
        1,
        0,
        harness::Faults {
            outage: Some((dark_from, Duration::from_secs(1000))),
            ..harness::Faults::default()
        },
    );
    net.run_until_idle(Duration::from_secs(20));
    assert!(net.nodes[0].rel.stats().probes > 0);
    let lost = &net.nodes[0].lost_peers;
    assert_eq!(lost.len(), 1);
    assert_eq!(net.nodes[0].loss_reasons, [LossReason::Timeout]);
    // The last answer came before the link went dark, at most one probe
    // interval (rto_max) earlier.
    let lost_at = lost[0].1 - Instant::ZERO;
    assert!(
        lost_at >= dark_from + config.peer_timeout - config.rto_max
            && lost_at <= dark_from + config.peer_timeout + config.rto_max,
        "lost at {lost_at:?}"
    );
    assert_eq!(net.nodes[0].failed.len(), 6, "the backlog fails");
    assert_eq!(net.nodes[0].acked.len(), 4);
}

/// Node 0 sends node 1 a few messages; from `dark_from` on, neither hears
/// the other. Node 1 owes nothing and is owed nothing: only its keepalive
/// watch can notice node 0 is gone.
fn receiver_left_waiting(keepalive: bool, dark_from: Duration) -> Net {
    let config = Config {
        keepalive,
        ..liveness_config()
    };
    let mut net = Net::new(2, &config, 23);
    for i in 0..5 {
        net.send(0, 1, payload(0, i, 32));
    }
    for (from, to) in [(0, 1), (1, 0)] {
        net.set_faults(
            from,
            to,
            harness::Faults {
                outage: Some((dark_from, Duration::from_secs(1000))),
                ..harness::Faults::default()
            },
        );
    }
    net.run_until_idle(Duration::from_secs(20));
    net
}

#[test]
fn a_receiver_with_nothing_owed_notices_its_sender_is_gone() {
    let config = liveness_config();
    let dark_from = ms(100);
    let net = receiver_left_waiting(true, dark_from);
    assert_eq!(net.nodes[1].delivered[&0].len(), 5);
    let lost = &net.nodes[1].lost_peers;
    assert_eq!(lost.len(), 1, "the receiver must notice");
    assert_eq!(net.nodes[1].loss_reasons, [LossReason::Timeout]);
    let lost_at = lost[0].1 - Instant::ZERO;
    assert!(
        lost_at <= dark_from + config.peer_timeout,
        "lost at {lost_at:?}, more than the timeout after the last word"
    );
    assert!(net.nodes[1].rel.stats().keepalives > 0);
    // Without the watch, nothing tells the receiver: it would wait forever.
    let blind = receiver_left_waiting(false, dark_from);
    assert!(blind.nodes[1].lost_peers.is_empty());
    assert_eq!(blind.nodes[1].rel.stats().keepalives, 0);
}

#[test]
fn idle_peers_that_answer_are_watched_briefly_then_left_alone() {
    let config = Config {
        keepalive: true,
        ..liveness_config()
    };
    let mut net = Net::new(2, &config, 24);
    for i in 0..5 {
        net.send(0, 1, payload(0, i, 32));
        net.send(1, 0, payload(1, i, 32));
    }
    // Ends only when no timer is armed: the watch ends by itself.
    net.run_until_idle(Duration::from_secs(60));
    assert!(
        net.now - Instant::ZERO < 3 * config.peer_timeout,
        "still probing at {:?}",
        net.now
    );
    for node in &net.nodes {
        assert!(node.lost_peers.is_empty(), "alive and idle is not lost");
        let keepalives = node.rel.stats().keepalives;
        // A probe every quarter timeout until the peer answered for a whole
        // timeout: about four, never a stream.
        assert!((1..=8).contains(&keepalives), "{keepalives} keepalives");
    }
    for node in &mut net.nodes {
        assert_eq!(node.rel.poll_timeout(), None);
    }
}

// ----- 4. zero-window probing -----------------------------------------------

#[test]
fn zero_credit_is_probed_until_credit_returns() {
    let config = liveness_config();
    let mut net = probing_net(&config, 23);
    net.advance(Duration::from_millis(1500));
    // The first burst (initial credit) went through; the rest waits, and
    // the probes' answers keep the receiver alive past peer_timeout.
    assert_eq!(net.nodes[1].delivered[&0].len(), 4);
    assert_eq!(net.nodes[0].acked.len(), 4);
    assert_eq!(net.nodes[0].rel.queued(PeerId(0)), Some((0, 6)));
    assert!(net.nodes[0].lost_peers.is_empty());
    let s = *net.nodes[0].rel.stats();
    assert!(s.probes >= 3, "{s:?}");
    assert_eq!(s.timeouts, 0, "a probe is not a retransmission: {s:?}");
    let probes: Vec<_> = net.log.iter().filter(|d| d.from == 0 && !d.data).collect();
    assert!(
        probes
            .iter()
            .all(|d| d.header.has(FLAG_ACK_ONLY | FLAG_ACK_REQ))
    );
    assert_eq!(probes.len() as u64, s.probes);
    // Probes back off (20, 40, 80, ... ms, up to rto_max).
    let gaps: Vec<Duration> = probes.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    assert!(gaps.iter().all(|g| *g <= config.rto_max));
    // Every probe was answered, without a request.
    let answers = net
        .log
        .iter()
        .filter(|d| d.from == 1 && !d.data && !d.header.has(FLAG_ACK_REQ))
        .count();
    assert!(answers >= probes.len());
    // Credit returns: sending resumes at the next probe.
    let returned = net.now;
    net.nodes[1].rel.set_credit(config.window);
    net.run_while(Duration::from_secs(30), |n| {
        n.nodes[1].delivered[&0].len() < 10
    });
    assert!(net.now - returned <= config.rto_max + ms(1));
    net.run_until_idle(Duration::from_secs(30));
    let got = &net.nodes[1].delivered[&0];
    assert_eq!(got.len(), 10);
    for (i, bytes) in got.iter().enumerate() {
        assert_eq!(bytes, &payload(0, i as u64, 32));
    }
    assert_eq!(net.nodes[0].acked.len(), 10);
    assert!(net.nodes.iter_mut().all(|n| n.rel.poll_timeout().is_none()));
}

#[test]
fn an_ack_of_everything_with_zero_credit_arms_the_probe_timer() {
    let mut a = core(&Config::default());
    let t0 = Instant::ZERO;
    for frag in 0..6 {
        a.send(t0, P, frag).unwrap();
    }
    assert_eq!(drain(&mut a, t0).len(), 4);
    let t1 = at(ms(1));
    let _ = a.on_datagram(t1, P, &control(0, 4, 0), 0, Room::ALL);
    assert_eq!(acked(&events(&mut a)), [0, 1, 2, 3]);
    assert_eq!(a.queued(P), Some((0, 2)));
    let rto = a.rto(P).unwrap();
    assert!(drain(&mut a, t1).is_empty());
    let due = a.poll_timeout().expect("a probe timer");
    assert_eq!(due, t1 + rto);
    a.handle_timeout(due);
    let probe = drain(&mut a, due);
    assert_eq!(probe.len(), 1);
    assert!(probe[0].frag.is_none());
    assert!(probe[0].header.has(FLAG_ACK_ONLY | FLAG_ACK_REQ));
    assert_eq!(a.stats().probes, 1);
    assert_eq!(a.rto(P), Some(2 * rto), "backed off");
    // The answer grants credit: both wait no longer, with a fresh timer.
    let _ = a.on_datagram(due, P, &control(0, 4, 64), 0, Room::ALL);
    let tx = drain(&mut a, due);
    assert_eq!(
        tx.iter().map(|t| t.frag).collect::<Vec<_>>(),
        [Some(4), Some(5)]
    );
    assert_eq!(a.rto(P), Some(rto), "the backoff ends");
    // Data in flight again: the tail-loss probe, at least two round trips
    // away (more while the round trip's variance is high, as after one
    // sample), is the first timer; the retransmission timer comes no sooner.
    let srtt = a.srtt(P).unwrap();
    let probe_at = a.poll_timeout().unwrap();
    assert!(probe_at >= due + 2 * srtt, "{probe_at:?}");
    assert!(probe_at <= due + rto, "{probe_at:?}");
}

// ----- 5. credit ------------------------------------------------------------

#[test]
fn initial_credit_limits_the_first_burst() {
    let config = Config::default();
    assert_eq!(config.initial_credit, 4);
    let mut a = core(&config);
    let t0 = Instant::ZERO;
    for frag in 0..10 {
        a.send(t0, P, frag).unwrap();
    }
    let first = drain(&mut a, t0);
    assert_eq!(first.len(), 4);
    assert!(
        first[3].header.has(FLAG_ACK_REQ),
        "the sender waits: it asks"
    );
    // The peer's first header tells the real credit.
    let t1 = at(ms(1));
    let _ = a.on_datagram(t1, P, &control(0, 0, 64), 0, Room::ALL);
    assert_eq!(drain(&mut a, t1).len(), 6);
    for bad in [0, 65] {
        let config = Config {
            initial_credit: bad,
            ..Config::default()
        };
        assert_eq!(config.validate().unwrap_err().name, "initial_credit");
    }
    let small = Config {
        window: 2,
        ..Config::default()
    };
    assert_eq!(small.validate().unwrap_err().name, "initial_credit");
}

#[test]
fn zero_credit_is_advertised() {
    let mut b = core(&Config::default());
    b.set_credit(0);
    let _ = b.on_datagram(
        Instant::ZERO,
        P,
        &control(FLAG_ACK_REQ, 0, 64),
        0,
        Room::ALL,
    );
    let ack = drain(&mut b, Instant::ZERO);
    assert_eq!(ack[0].header.credit, 0);
    b.set_credit(1000);
    let _ = b.on_datagram(
        Instant::ZERO,
        P,
        &control(FLAG_ACK_REQ, 0, 64),
        0,
        Room::ALL,
    );
    assert_eq!(drain(&mut b, Instant::ZERO)[0].header.credit, 64);
}
