//! Deterministic scenarios on virtual time for flow control and liveness:
//! room for received data, acknowledgement requests, zero-window probes,
//! initial credit, resets, deferred failures and resuming after a pause.

#![allow(clippy::unwrap_used)]

mod harness;
mod pair;

use std::time::Duration;

use harness::{Net, payload};
use udbtl_reliability::{
    Config, Discard, Event, Instant, LossReason, PeerId, Receipt, Room, SendError, Transmit,
};
use udbtl_wire::SeqNum;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_RESET};

use pair::*;

// ----- 1. room for received data -------------------------------------------

#[test]
fn refused_early_datagram_is_delivered_once_room_returns() {
    let config = Config::default();
    let (mut a, mut b) = (core(&config), core(&config));
    let t0 = Instant::ZERO;
    for frag in 0..3 {
        a.send(t0, P, frag).unwrap();
    }
    let tx = drain(&mut a, t0);
    assert_eq!(tx.len(), 3);
    // Datagram 1 arrives first, and the receiver cannot keep an early one.
    let no_early = Room {
        in_order: true,
        early: false,
    };
    assert_eq!(
        b.on_datagram(t0, P, &tx[1].header, 1, no_early),
        Receipt::Discard(1, Discard::NoRoom)
    );
    assert_eq!(b.stats().refused_no_room, 1);
    assert_eq!(b.stats().out_of_order, 0);
    // It is not acknowledged, but an acknowledgement goes out at once.
    let ack = drain(&mut b, t0);
    assert_eq!(ack.len(), 1);
    assert!(ack[0].frag.is_none() && ack[0].header.has(FLAG_ACK_ONLY));
    assert_eq!((ack[0].header.ack, ack[0].header.sack), (SeqNum(0), 0));
    assert_eq!(ack[0].header.credit, config.window);
    // Room returns: 2 is kept early, 0 delivered, 1 is still missing.
    assert_eq!(
        b.on_datagram(t0, P, &tx[2].header, 2, Room::ALL),
        Receipt::Buffered
    );
    assert_eq!(
        b.on_datagram(t0, P, &tx[0].header, 0, Room::ALL),
        Receipt::Deliver(0)
    );
    assert_eq!(b.poll_deliver(), None);
    let acks = drain(&mut b, t0);
    let _ = feed(&mut a, t0, &acks, Room::ALL);
    let _ = feed(&mut a, t0, &ack, Room::ALL);
    assert_eq!(acked(&events(&mut a)), [0, 2]);
    // The sender's tail-loss probe shows 1 missing, which goes again; then
    // the early 2 follows it.
    let (t1, retx) = probe_and_answer(&mut a, &mut b);
    assert_eq!(retx.len(), 1);
    assert_eq!(retx[0].frag, Some(1));
    assert!(retx[0].retransmission);
    assert_eq!(feed(&mut b, t1, &retx, Room::ALL), [Receipt::Deliver(1)]);
    assert_eq!(b.poll_deliver(), Some((P, 2)));
    assert_eq!(b.poll_deliver(), None);
    let acks = drain(&mut b, t1);
    let _ = feed(&mut a, t1, &acks, Room::ALL);
    assert_eq!(acked(&events(&mut a)), [1]);
    assert_eq!(a.queued(P), Some((0, 0)));
}

#[test]
fn refused_in_order_datagram_is_retransmitted_and_then_delivered() {
    let config = Config::default();
    let (mut a, mut b) = (core(&config), core(&config));
    let t0 = Instant::ZERO;
    a.send(t0, P, 7).unwrap();
    let tx = drain(&mut a, t0);
    let no_in_order = Room {
        in_order: false,
        early: true,
    };
    assert_eq!(
        feed(&mut b, t0, &tx, no_in_order),
        [Receipt::Discard(7, Discard::NoRoom)]
    );
    let ack = drain(&mut b, t0);
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0].header.ack, SeqNum(0), "rcv_nxt did not advance");
    let _ = feed(&mut a, t0, &ack, Room::ALL);
    assert!(events(&mut a).is_empty(), "nothing acknowledged");
    let (t1, retx) = probe_and_answer(&mut a, &mut b);
    assert_eq!(retx.len(), 1);
    // Still no room: refused again, whatever the early room.
    assert_eq!(
        feed(&mut b, t1, &retx, no_in_order),
        [Receipt::Discard(7, Discard::NoRoom)]
    );
    assert_eq!(feed(&mut b, t1, &retx, Room::ALL), [Receipt::Deliver(7)]);
    // A duplicate is a duplicate, room or not.
    let none = Room {
        in_order: false,
        early: false,
    };
    assert_eq!(
        feed(&mut b, t1, &retx, none),
        [Receipt::Discard(7, Discard::Duplicate)]
    );
    assert_eq!(b.stats().refused_no_room, 2);
    assert_eq!(b.stats().received, 1);
    let acks = drain(&mut b, t1);
    let _ = feed(&mut a, t1, &acks, Room::ALL);
    assert_eq!(acked(&events(&mut a)), [7]);
}

// ----- 2. acknowledgement requests on acknowledgement-only datagrams --------

#[test]
fn ack_request_without_data_is_answered_and_plain_ack_is_not() {
    let mut b = core(&Config::default());
    let t = at(ms(1));
    assert_eq!(
        b.on_datagram(t, P, &control(FLAG_ACK_REQ, 0, 64), 1, Room::ALL),
        Receipt::Discard(1, Discard::AckOnly)
    );
    let answer = drain(&mut b, t);
    assert_eq!(answer.len(), 1);
    assert!(answer[0].frag.is_none());
    assert!(answer[0].header.has(FLAG_ACK_ONLY));
    assert!(
        !answer[0].header.has(FLAG_ACK_REQ),
        "an answer never asks back"
    );
    // A plain acknowledgement (such as that answer) is never answered.
    let _ = b.on_datagram(t, P, &answer[0].header, 2, Room::ALL);
    assert!(drain(&mut b, t).is_empty());
    assert_eq!(b.poll_timeout(), None);
}

// ----- 3. liveness, not progress --------------------------------------------

fn liveness_config() -> Config {
    Config {
        peer_timeout: Duration::from_secs(1),
        rto_max: ms(300),
        ..Config::default()
    }
}

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
