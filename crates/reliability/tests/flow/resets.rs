//! Resets, failures only after draining, and resuming after not running.

use super::*;

// ----- 6. resets ------------------------------------------------------------

/// Drives a core whose peer never answers until it declares the peer lost;
/// returns every transmit and the time of the loss.
fn lose_the_peer(a: &mut Core) -> (Vec<Transmit<u32>>, Instant) {
    let mut sent = Vec::new();
    for _ in 0..1000 {
        let now = fire_next(a);
        sent.extend(drain(a, now));
        if a.is_lost(P) {
            return (sent, now);
        }
    }
    panic!("never lost");
}

#[test]
fn a_lost_peer_is_reset_and_reset_again_only_when_it_sends_or_asks() {
    let config = liveness_config();
    let mut a = core(&config);
    a.send(Instant::ZERO, P, 9).unwrap();
    let _ = drain(&mut a, Instant::ZERO);
    let (sent, now) = lose_the_peer(&mut a);
    assert_eq!(
        events(&mut a),
        [
            Event::Failed { peer: P, frag: 9 },
            Event::PeerLost {
                peer: P,
                reason: LossReason::Timeout
            }
        ]
    );
    let resets: Vec<_> = sent.iter().filter(|t| t.header.has(FLAG_RESET)).collect();
    assert_eq!(resets.len(), 1);
    assert!(resets[0].frag.is_none() && resets[0].header.has(FLAG_ACK_ONLY));
    assert_eq!(sent.last().unwrap().header.flags & FLAG_RESET, FLAG_RESET);
    assert_eq!(a.stats().resets_sent, 1);
    // Data from the lost peer is answered with a reset; so is a request.
    let data = rel::Repr {
        seq: SeqNum(0),
        credit: 64,
        ..rel::Repr::default()
    };
    for header in [data, control(FLAG_ACK_REQ, 0, 64)] {
        assert_eq!(
            a.on_datagram(now, P, &header, 1, Room::ALL),
            Receipt::Discard(1, Discard::PeerLost)
        );
        let reply = drain(&mut a, now);
        assert_eq!(reply.len(), 1);
        assert!(reply[0].header.has(FLAG_ACK_ONLY | FLAG_RESET));
    }
    // A plain acknowledgement or a reset is not: no reset loops.
    for header in [control(0, 0, 64), control(FLAG_RESET, 0, 64)] {
        assert_eq!(
            a.on_datagram(now, P, &header, 1, Room::ALL),
            Receipt::Discard(1, Discard::PeerLost)
        );
        assert!(drain(&mut a, now).is_empty());
    }
    assert!(events(&mut a).is_empty());
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn a_received_reset_declares_the_peer_lost_and_fails_its_fragments() {
    let config = Config::default();
    let (mut a, mut b) = (core(&config), core(&config));
    let t0 = Instant::ZERO;
    // b has three fragments in flight to a, and holds an early datagram
    // from a.
    for frag in 0..3 {
        b.send(t0, P, frag).unwrap();
    }
    let _ = drain(&mut b, t0);
    a.send(t0, P, 100).unwrap();
    a.send(t0, P, 101).unwrap();
    let from_a = drain(&mut a, t0);
    assert_eq!(
        b.on_datagram(t0, P, &from_a[1].header, 55, Room::ALL),
        Receipt::Buffered
    );
    let _ = drain(&mut b, t0);
    let reset = control(FLAG_RESET, 0, 0);
    assert_eq!(
        b.on_datagram(at(ms(1)), P, &reset, 56, Room::ALL),
        Receipt::Discard(56, Discard::PeerLost)
    );
    assert_eq!(
        events(&mut b),
        [
            Event::Failed { peer: P, frag: 0 },
            Event::Failed { peer: P, frag: 1 },
            Event::Failed { peer: P, frag: 2 },
            Event::PeerLost {
                peer: P,
                reason: LossReason::Reset
            }
        ]
    );
    assert_eq!(b.poll_reclaim(), Some(55));
    assert!(b.is_lost(P));
    assert!(drain(&mut b, at(ms(1))).is_empty(), "no reset back");
    assert_eq!(b.stats().resets_sent, 0);
    assert_eq!(b.send(at(ms(1)), P, 3), Err(SendError::PeerLost(0)));
    // Whatever a sends now is answered with a reset; a's reset to that is
    // not answered: the exchange ends.
    let _ = feed(&mut b, at(ms(2)), &from_a, Room::ALL);
    let replies = drain(&mut b, at(ms(2)));
    assert_eq!(replies.len(), 2);
    assert!(replies.iter().all(|r| r.header.has(FLAG_RESET)));
    let _ = feed(&mut b, at(ms(2)), &replies, Room::ALL);
    assert!(drain(&mut b, at(ms(2))).is_empty());
    assert_eq!(b.poll_timeout(), None);
}

#[test]
fn reset_on_timeout_reaches_a_live_peer_and_the_exchange_ends() {
    let config = liveness_config();
    let mut net = Net::new(2, &config, 24);
    net.record = true;
    // Node 1 can hear node 0 but never answer it.
    net.set_faults(
        1,
        0,
        harness::Faults {
            outage: Some((Duration::ZERO, Duration::from_secs(1000))),
            ..harness::Faults::default()
        },
    );
    for i in 0..5 {
        net.send(0, 1, payload(0, i, 16));
    }
    net.advance(ms(500));
    for i in 0..3 {
        net.send(1, 0, payload(1, i, 16));
    }
    net.run_until_idle(Duration::from_secs(60));
    assert_eq!(net.nodes[0].loss_reasons, [LossReason::Timeout]);
    assert_eq!(net.nodes[1].loss_reasons, [LossReason::Reset]);
    assert_eq!(net.nodes[1].failed.len(), 3, "its fragments fail");
    assert_eq!(net.nodes[0].failed.len(), 5);
    // Node 0 never heard node 1's credit: only its first burst went out.
    assert_eq!(
        net.nodes[1].delivered[&0].len(),
        usize::from(config.initial_credit)
    );
    let lost_at = net.nodes[0].lost_peers[0].1;
    assert_eq!(net.nodes[1].lost_peers[0].1, lost_at + net.latency);
    let resets: Vec<_> = net
        .log
        .iter()
        .filter(|d| d.header.has(FLAG_RESET))
        .collect();
    assert_eq!(resets.len(), 1);
    assert_eq!((resets[0].from, resets[0].at), (0, lost_at));
    assert!(net.log.iter().all(|d| d.at <= lost_at), "then silence");
}

#[test]
fn data_from_a_lost_peer_is_answered_with_resets_until_one_gets_through() {
    let config = liveness_config();
    let mut net = Net::new(2, &config, 25);
    net.record = true;
    // Node 0 cannot reach node 1 for 2.5 s: it declares node 1 lost, and
    // that reset is lost too.
    net.set_faults(
        0,
        1,
        harness::Faults {
            outage: Some((Duration::ZERO, ms(2500))),
            ..harness::Faults::default()
        },
    );
    net.send(0, 1, payload(0, 0, 16));
    net.advance(Duration::from_secs(2));
    assert_eq!(net.nodes[0].loss_reasons, [LossReason::Timeout]);
    assert!(net.nodes[1].lost_peers.is_empty());
    // Node 1, which never heard of node 0, now sends: each datagram is
    // answered with a reset, until one arrives.
    net.send(1, 0, payload(1, 0, 16));
    net.run_until_idle(Duration::from_secs(60));
    assert_eq!(net.nodes[1].loss_reasons, [LossReason::Reset]);
    assert_eq!(net.nodes[1].failed, [0]);
    // Node 1's tail-loss probes ask for an acknowledgement: answered with a
    // reset too.
    let data_from_1 = net
        .log
        .iter()
        .filter(|d| d.from == 1 && (d.data || d.header.has(FLAG_ACK_REQ)))
        .count();
    let resets_from_0 = net
        .log
        .iter()
        .filter(|d| d.from == 0 && d.header.has(FLAG_RESET))
        .count();
    assert!(data_from_1 >= 2);
    assert_eq!(resets_from_0, 1 + data_from_1, "one per datagram or probe");
    assert!(
        !net.log
            .iter()
            .any(|d| d.from == 1 && d.header.has(FLAG_RESET))
    );
    let lost_at = net.nodes[1].lost_peers[0].1;
    assert!(lost_at >= at(ms(2500)) && lost_at <= at(ms(2500) + config.rto_max));
}

// ----- 7. failures only after draining ---------------------------------------

#[test]
fn deferred_failures_wait_for_the_next_plain_call() {
    let config = liveness_config();
    let mut a = core(&config);
    a.send(Instant::ZERO, P, 1).unwrap();
    let _ = drain(&mut a, Instant::ZERO);
    let fail_at = at(config.peer_timeout);
    // Deferring, for three timeouts: never lost, retransmissions go on, and
    // a deadline past its time stays visible.
    let mut now = Instant::ZERO;
    let mut deferred = false;
    while now < at(3 * config.peer_timeout) {
        now = now + ms(10);
        // The failure is examined when a timer fires past its deadline.
        deferred |= now >= fail_at && a.poll_timeout().is_some_and(|due| due <= now);
        a.handle_timeout_deferring_failures(now);
        let _ = drain(&mut a, now);
        assert!(!a.is_lost(P), "lost while deferring at {now:?}");
        let due = a.poll_timeout().expect("a deadline");
        if deferred {
            assert!(due <= now, "the deferred failure is due, at {due:?}");
        }
    }
    assert!(deferred);
    assert!(events(&mut a).is_empty());
    assert!(a.stats().timeouts >= 5, "{:?}", a.stats());
    // The next plain call declares it.
    a.handle_timeout(now);
    assert!(a.is_lost(P));
    assert_eq!(
        events(&mut a),
        [
            Event::Failed { peer: P, frag: 1 },
            Event::PeerLost {
                peer: P,
                reason: LossReason::Timeout
            }
        ]
    );
}

#[test]
fn an_acknowledgement_read_after_deferring_saves_the_peer() {
    let config = liveness_config();
    let mut a = core(&config);
    a.send(Instant::ZERO, P, 1).unwrap();
    let _ = drain(&mut a, Instant::ZERO);
    // The caller was late: the first timer it fires is past the failure
    // deadline, and the fabric holds an acknowledgement.
    let late = at(config.peer_timeout + ms(500));
    a.handle_timeout_deferring_failures(late);
    a.handle_timeout_deferring_failures(late);
    assert!(!a.is_lost(P));
    assert_eq!(a.poll_timeout(), Some(at(config.peer_timeout)));
    let _ = a.on_datagram(late, P, &control(0, 1, 64), 0, Room::ALL);
    a.handle_timeout(late);
    assert!(!a.is_lost(P));
    assert_eq!(events(&mut a), [Event::Acked { peer: P, frag: 1 }]);
    assert_eq!(a.poll_timeout(), None);
}

// ----- 8. resume after not running ------------------------------------------

fn paused(resume: bool) -> Net {
    let config = liveness_config();
    let mut net = Net::new(2, &config, 26);
    for i in 0..10 {
        net.send(0, 1, payload(0, i, 16));
    }
    // Both processes stop for 100 failure timeouts; the datagrams wait in
    // the fabric.
    net.now = net.now + 100 * config.peer_timeout;
    if resume {
        let now = net.now;
        for node in &mut net.nodes {
            node.rel.resume(now);
        }
        assert_eq!(net.nodes[0].rel.poll_timeout(), Some(now), "refresh now");
        // One step: the fabric's datagrams arrive, the refresh fires.
        let mut first = true;
        net.run_while(Duration::from_secs(1000), |_| std::mem::take(&mut first));
        // The refresh resends the oldest datagram only; its answer tells
        // what else is missing (here: nothing).
        let s = net.nodes[0].rel.stats();
        assert_eq!((s.timeouts, s.retransmitted), (0, 1), "{s:?}");
        assert_eq!(
            net.nodes[0].rel.rto(PeerId(0)),
            Some(config.rto_initial),
            "no backoff"
        );
    }
    net.run_until_idle(Duration::from_secs(1000));
    net
}

#[test]
fn resume_after_a_long_jump_declares_nobody_lost() {
    // Without resume the jump looks like a dead peer.
    let net = paused(false);
    assert_eq!(net.nodes[0].loss_reasons, [LossReason::Timeout]);
    let net = paused(true);
    for node in &net.nodes {
        assert!(node.lost_peers.is_empty());
        assert_eq!(node.rel.stats().resumes, 1);
    }
    assert_eq!(net.nodes[1].delivered[&0].len(), 10);
    assert_eq!(net.nodes[0].acked.len(), 10);
    let s = net.nodes[0].rel.stats();
    assert_eq!(s.timeouts, 0, "the refresh is no timeout: {s:?}");
}

/// A closed peer that still has data in flight when its linger ends (it
/// never acknowledges) fails that data and is reported closed; the timers
/// stop. It once kept a deadline in the past, and `handle_timeout` spun on
/// it for ever (found by the fuzz target `reliability`).
#[test]
fn a_closed_peer_that_never_acknowledges_fails_its_data_when_the_linger_ends() {
    let config = Config::default();
    let mut a = core(&config);
    let t0 = Instant::ZERO;
    a.send(t0, P, 7).unwrap();
    let _ = drain(&mut a, t0);
    a.close_peer(t0, P);
    let end = at(config.linger + ms(1));
    a.handle_timeout(end);
    assert_eq!(
        events(&mut a),
        [
            Event::Failed { peer: P, frag: 7 },
            Event::PeerClosed { peer: P }
        ]
    );
    assert_eq!(a.poll_timeout(), None, "no timer left");
    assert_eq!(a.queued(P), Some((0, 0)));
}

#[test]
fn a_held_acknowledgement_rides_on_the_reply_or_goes_when_released() {
    let config = Config::default();
    let (mut a, mut b) = (core(&config), core(&config));
    let t0 = Instant::ZERO;
    // Two datagrams: the second ends the burst and asks for an
    // acknowledgement at once.
    for frag in 0..2 {
        a.send(t0, P, frag).unwrap();
    }
    let tx = drain(&mut a, t0);
    assert!(tx[1].header.has(FLAG_ACK_REQ));
    let _ = feed(&mut b, t0, &tx, Room::ALL);
    b.hold_acks();
    assert!(drain(&mut b, t0).is_empty(), "held while a reply may come");
    assert!(
        b.poll_timeout().is_some(),
        "the acknowledgement timer stays armed"
    );
    // The reply carries the acknowledgement; released, nothing more goes.
    b.send(t0, P, 7).unwrap();
    let reply = drain(&mut b, t0);
    assert_eq!(reply.len(), 1);
    assert_eq!((reply[0].frag, reply[0].header.ack), (Some(7), SeqNum(2)));
    assert!(b.release_acks());
    assert!(drain(&mut b, t0).is_empty(), "the reply carried it");
    let _ = feed(&mut a, t0, &reply, Room::ALL);
    assert_eq!(acked(&events(&mut a)), [0, 1]);

    // No reply this time: released, the acknowledgement goes on its own.
    a.send(t0, P, 2).unwrap();
    let tx = drain(&mut a, t0);
    let _ = feed(&mut b, t0, &tx, Room::ALL);
    b.hold_acks();
    a.send(t0, P, 3).unwrap();
    let tx = drain(&mut a, t0);
    let _ = feed(&mut b, t0, &tx, Room::ALL);
    assert!(drain(&mut b, t0).is_empty());
    assert!(b.release_acks());
    let ack = drain(&mut b, t0);
    assert_eq!(ack.len(), 1, "one acknowledgement, not one per hold");
    assert!(ack[0].header.has(FLAG_ACK_ONLY));
    assert_eq!(ack[0].header.ack, SeqNum(4));
}

/// A message one datagram longer than the window: the last datagram leaves
/// alone, when the acknowledgement of the rest opens the window. It ends
/// the message's burst, so it asks for its acknowledgement at once instead
/// of waiting out the receiver's delayed acknowledgement (as a lone
/// request, whose reply carries it, does not).
#[test]
fn a_datagram_that_waited_for_the_window_asks_for_its_acknowledgement() {
    let config = Config {
        window: 4,
        initial_cwnd: 4,
        initial_credit: 4,
        ..Config::default()
    };
    let (mut a, mut b) = (core(&config), core(&config));
    let t0 = Instant::ZERO;
    for frag in 0..5 {
        a.send(t0, P, frag).unwrap();
    }
    let first = drain(&mut a, t0);
    assert_eq!(first.len(), 4, "the window holds four");
    let _ = feed(&mut b, t0, &first, Room::ALL);
    let ack = drain(&mut b, t0);
    let t1 = at(ms(1));
    let _ = feed(&mut a, t1, &ack, Room::ALL);
    let last = drain(&mut a, t1);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].frag, Some(4));
    assert!(last[0].header.has(FLAG_ACK_REQ), "it ends the burst");

    // A lone datagram sent as it is queued asks for nothing: a reply is
    // likely to carry its acknowledgement.
    let _ = feed(&mut b, t1, &last, Room::ALL);
    let ack = drain(&mut b, t1);
    let _ = feed(&mut a, t1, &ack, Room::ALL);
    assert_eq!(acked(&events(&mut a)), [0, 1, 2, 3, 4]);
    a.send(t1, P, 5).unwrap();
    let lone = drain(&mut a, t1);
    assert_eq!(lone.len(), 1);
    assert!(!lone[0].header.has(FLAG_ACK_REQ));
}
