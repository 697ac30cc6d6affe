//! Room for received data, and acknowledgement requests on
//! acknowledgement-only datagrams.

use super::*;

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
