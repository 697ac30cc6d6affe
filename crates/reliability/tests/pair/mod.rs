//! Two reliability states wired by hand, on virtual time: each datagram
//! one side sends is fed to the other by the test, which can drop, replay
//! or forge any of them.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::time::Duration;

use udbtl_reliability::{Config, Event, Instant, PeerId, Receipt, Reliability, Room, Transmit};
use udbtl_wire::SeqNum;
use udbtl_wire::rel::{self, FLAG_ACK_ONLY, FLAG_ACK_REQ};

pub type Core = Reliability<u32, u32>;

pub const P: PeerId = PeerId(0);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn at(d: Duration) -> Instant {
    Instant::ZERO + d
}

pub fn core(config: &Config) -> Core {
    let mut core = Reliability::new(config.clone()).unwrap();
    assert_eq!(core.add_peer(), P);
    core
}

pub fn drain(core: &mut Core, now: Instant) -> Vec<Transmit<u32>> {
    std::iter::from_fn(|| core.poll_transmit(now)).collect()
}

pub fn events(core: &mut Core) -> Vec<Event<u32>> {
    std::iter::from_fn(|| core.poll_event()).collect()
}

/// A header without data from the peer, acknowledging `ack`.
pub fn control(flags: u16, ack: u32, credit: u16) -> rel::Repr {
    rel::Repr {
        seq: SeqNum(0),
        ack: SeqNum(ack),
        credit,
        flags: FLAG_ACK_ONLY | flags,
        ..rel::Repr::default()
    }
}

/// Feeds every transmit to `to` with `room`; returns the receipts.
pub fn feed(to: &mut Core, now: Instant, txs: &[Transmit<u32>], room: Room) -> Vec<Receipt<u32>> {
    txs.iter()
        .map(|tx| to.on_datagram(now, P, &tx.header, tx.frag.unwrap_or(u32::MAX), room))
        .collect()
}

pub fn acked(events: &[Event<u32>]) -> Vec<u32> {
    let mut acked: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Event::Acked { frag, .. } => Some(*frag),
            _ => None,
        })
        .collect();
    acked.sort_unstable();
    acked
}

/// Moves time to `core`'s next deadline and fires it.
pub fn fire_next(core: &mut Core) -> Instant {
    let next = core.poll_timeout().unwrap();
    core.handle_timeout(next);
    next
}

/// Fires `from`'s next deadline, which must send its tail-loss probe (an
/// acknowledgement request without data), has `to` answer the probe, and
/// returns the time and what `from` sends once it has the answer.
pub fn probe_and_answer(from: &mut Core, to: &mut Core) -> (Instant, Vec<Transmit<u32>>) {
    let now = fire_next(from);
    let probe = drain(from, now);
    assert_eq!(probe.len(), 1, "one probe");
    assert!(probe[0].frag.is_none() && probe[0].header.has(FLAG_ACK_REQ));
    let _ = feed(to, now, &probe, Room::ALL);
    let answer = drain(to, now);
    let _ = feed(from, now, &answer, Room::ALL);
    (now, drain(from, now))
}
