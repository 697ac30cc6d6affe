//! Property test: random interleavings of sends, deliveries in any order
//! (each with a random [`Room`]: the receiver may refuse it), losses,
//! duplicates and timeouts, checked against a reference model of
//! exactly-once in-order delivery, with sequence numbers crossing the wrap.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;
use udbtl_reliability::{Config, Event, Instant, PeerId, Receipt, Reliability, Room};
use udbtl_wire::{SeqNum, rel};

#[derive(Debug, Clone)]
enum Op {
    /// Node `from` sends a new message.
    Send(usize),
    /// The datagram at this index (modulo what is in flight) arrives; the
    /// receiver has this room for it.
    Deliver(usize, Room),
    /// ... is lost.
    Drop(usize),
    /// ... arrives and stays in flight (a duplicate).
    Duplicate(usize, Room),
    /// Time passes (µs); timers fire.
    Tick(u64),
}

fn room() -> impl Strategy<Value = Room> {
    (any::<bool>(), any::<bool>()).prop_map(|(in_order, early)| Room { in_order, early })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..2).prop_map(Op::Send),
        4 => (any::<usize>(), room()).prop_map(|(i, room)| Op::Deliver(i, room)),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => (any::<usize>(), room()).prop_map(|(i, room)| Op::Duplicate(i, room)),
        1 => (1u64..5_000).prop_map(Op::Tick),
    ]
}

struct Side {
    rel: Reliability<u64, u64>,
    sent: Vec<u64>,
    delivered: Vec<u64>,
    acked: Vec<u64>,
    /// Payloads held by buffer id.
    held: std::collections::HashMap<u64, u64>,
    next_buf: u64,
}

struct World {
    now: Instant,
    sides: [Side; 2],
    /// (to, header, message id or None for an acknowledgement).
    wire: Vec<(usize, rel::Repr, Option<u64>)>,
    next_msg: u64,
}

impl World {
    fn new(config: &Config) -> Self {
        let side = || {
            let mut rel = Reliability::new(config.clone()).unwrap();
            rel.add_peer();
            Side {
                rel,
                sent: Vec::new(),
                delivered: Vec::new(),
                acked: Vec::new(),
                held: Default::default(),
                next_buf: 0,
            }
        };
        Self {
            now: Instant::ZERO,
            sides: [side(), side()],
            wire: Vec::new(),
            next_msg: 0,
        }
    }

    fn flush(&mut self) {
        for from in 0..2 {
            while let Some(tx) = self.sides[from].rel.poll_transmit(self.now) {
                self.wire.push((1 - from, tx.header, tx.frag));
            }
            while let Some(event) = self.sides[from].rel.poll_event() {
                match event {
                    Event::Acked { frag, .. } => self.sides[from].acked.push(frag),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }

    fn arrive(&mut self, index: usize, keep: bool, room: Room) {
        let (to, header, msg) = if keep {
            self.wire[index]
        } else {
            self.wire.remove(index)
        };
        let side = &mut self.sides[to];
        let buf = side.next_buf;
        side.next_buf += 1;
        if let Some(msg) = msg {
            side.held.insert(buf, msg);
        }
        match side
            .rel
            .on_datagram(self.now, PeerId(0), &header, buf, room)
        {
            Receipt::Deliver(buf) => {
                side.delivered.push(side.held.remove(&buf).unwrap());
                while let Some((_, buf)) = side.rel.poll_deliver() {
                    side.delivered.push(side.held.remove(&buf).unwrap());
                }
            }
            Receipt::Buffered => {}
            Receipt::Discard(buf, _) => {
                side.held.remove(&buf);
            }
        }
        self.flush();
    }

    fn tick(&mut self, micros: u64) {
        self.now = self.now + Duration::from_micros(micros);
        for side in &mut self.sides {
            side.rel.handle_timeout(self.now);
        }
        self.flush();
    }

    /// The model: what a side delivered is a prefix of what its peer sent,
    /// with nothing twice; what was acknowledged was sent, once.
    fn check(&self) {
        for to in 0..2 {
            let from = 1 - to;
            let delivered = &self.sides[to].delivered;
            assert!(delivered.len() <= self.sides[from].sent.len());
            assert_eq!(
                delivered[..],
                self.sides[from].sent[..delivered.len()],
                "in order, exactly once"
            );
            let acked: HashSet<u64> = self.sides[from].acked.iter().copied().collect();
            assert_eq!(
                acked.len(),
                self.sides[from].acked.len(),
                "acknowledged once"
            );
            assert!(acked.iter().all(|m| self.sides[from].sent.contains(m)));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn any_interleaving_delivers_exactly_once_in_order(
        ops in proptest::collection::vec(op(), 1..400),
        start in prop_oneof![Just(u32::MAX - 30), Just(0u32), any::<u32>()],
        window in 2u16..=20,
    ) {
        let config = Config {
            window,
            initial_cwnd: window.min(4),
            initial_credit: window.min(4),
            initial_seq: SeqNum(start),
            ..Config::default()
        };
        let mut world = World::new(&config);
        for op in ops {
            match op {
                Op::Send(from) => {
                    let msg = world.next_msg;
                    world.next_msg += 1;
                    world.sides[from].sent.push(msg);
                    world.sides[from].rel.send(world.now, PeerId(0), msg).unwrap();
                    world.flush();
                }
                Op::Deliver(i, room) if !world.wire.is_empty() => {
                    world.arrive(i % world.wire.len(), false, room);
                }
                Op::Duplicate(i, room) if !world.wire.is_empty() => {
                    world.arrive(i % world.wire.len(), true, room);
                }
                Op::Drop(i) if !world.wire.is_empty() => {
                    let len = world.wire.len();
                    world.wire.remove(i % len);
                }
                Op::Tick(micros) => world.tick(micros),
                _ => {}
            }
            world.check();
        }
        // Heal the network: deliver everything, in order, until quiet.
        for _ in 0..100_000 {
            if world.wire.is_empty() {
                let next = world.sides.iter_mut().filter_map(|s| s.rel.poll_timeout()).min();
                let Some(next) = next else { break };
                world.tick((next - world.now).as_micros() as u64 + 1);
            } else {
                world.arrive(0, false, Room::ALL);
            }
        }
        world.check();
        for to in 0..2 {
            prop_assert_eq!(&world.sides[to].delivered, &world.sides[1 - to].sent);
            prop_assert_eq!(world.sides[1 - to].acked.len(), world.sides[1 - to].sent.len());
        }
    }
}
