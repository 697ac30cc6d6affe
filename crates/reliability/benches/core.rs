//! The cost the reliability core adds to one message, without I/O: the
//! sender's `send` and `poll_transmit`, the receiver's `on_datagram` with
//! in-order delivery, and the acknowledgement coming back on the next
//! datagram (a ping-pong's steady state), plus wire emit/parse of the header.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use udbtl_reliability::{Config, Instant, PeerId, Receipt, Reliability, Room};
use udbtl_wire::rel;

fn ping_pong(c: &mut Criterion) {
    let mut a: Reliability<u32, u32> = Reliability::new(Config::default()).expect("config");
    let mut b: Reliability<u32, u32> = Reliability::new(Config::default()).expect("config");
    let (pa, pb) = (a.add_peer(Instant::ZERO), b.add_peer(Instant::ZERO));
    let mut now = 0u64;
    c.bench_function("reliability: one message each way, acknowledged", |bench| {
        bench.iter(|| {
            now += 1_000;
            let t = Instant::from_nanos(now);
            one_way(&mut a, pa, &mut b, pb, t);
            one_way(&mut b, pb, &mut a, pa, t);
        });
    });
}

/// `from` sends one fragment to `to`, which delivers it; acknowledgements
/// ride on the datagram.
fn one_way(
    from: &mut Reliability<u32, u32>,
    peer_from: PeerId,
    to: &mut Reliability<u32, u32>,
    peer_to: PeerId,
    t: Instant,
) {
    from.send(t, peer_from, 7).expect("send");
    let tx = from.poll_transmit(t).expect("transmit");
    match to.on_datagram(t, peer_to, &tx.header, 1, Room::ALL) {
        Receipt::Deliver(buf) => {
            black_box(buf);
        }
        other => panic!("{other:?}"),
    }
    while let Some(event) = to.poll_event() {
        black_box(event);
    }
}

fn header(c: &mut Criterion) {
    let repr = rel::Repr {
        src: 7,
        seq: udbtl_wire::SeqNum(9),
        ack: udbtl_wire::SeqNum(3),
        sack: 5,
        credit: 64,
        flags: 0x18,
        checksum: 0,
    };
    let mut bytes = [0u8; rel::HEADER_LEN];
    c.bench_function("wire: emit + parse the reliability extension", |bench| {
        bench.iter(|| {
            black_box(&repr).emit(&mut rel::Packet::new_unchecked(&mut bytes[..]));
            let packet = rel::Packet::new_checked(black_box(&bytes[..])).expect("length");
            black_box(rel::Repr::parse(&packet).expect("valid"))
        });
    });
}

criterion_group!(benches, ping_pong, header);
criterion_main!(benches);
