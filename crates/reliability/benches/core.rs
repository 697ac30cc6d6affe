//! The cost the reliability core adds to one message, without I/O: the
//! sender's `send` and `poll_transmit`, the receiver's `on_datagram` with
//! in-order delivery, and the acknowledgement coming back on the next
//! datagram (a ping-pong's steady state), plus wire emit/parse of the header,
//! and the core's share of an idle progress call as the peers grow (100,
//! 1 000 and 10 000, one of them in a ping-pong): it must stay flat.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use udbtl_reliability::{Config, Instant, PeerId, Receipt, Reliability, Room};
use udbtl_wire::rel;

fn ping_pong(c: &mut Criterion) {
    let mut a: Reliability<u32, u32> = Reliability::new(Config::default()).expect("config");
    let mut b: Reliability<u32, u32> = Reliability::new(Config::default()).expect("config");
    let (pa, pb) = (a.add_peer(), b.add_peer());
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
/// ride on the datagram, or go before it when one was owed already.
fn one_way(
    from: &mut Reliability<u32, u32>,
    peer_from: PeerId,
    to: &mut Reliability<u32, u32>,
    peer_to: PeerId,
    t: Instant,
) {
    from.send(t, peer_from, 7).expect("send");
    // The fragment, and anything queued before it (an acknowledgement
    // owed, say).
    while let Some(tx) = from.poll_transmit(t) {
        if let Receipt::Deliver(buf) = to.on_datagram(t, peer_to, &tx.header, 1, Room::ALL) {
            black_box(buf);
        }
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

/// What a progress call asks of the core when nothing new arrived: the
/// credit, the next timeout and the transmit queue; and one message each
/// way with one peer among many.
fn progress_as_peers_grow(c: &mut Criterion) {
    let mut group = c.benchmark_group("reliability: progress among idle peers");
    for peers in [100u32, 1_000, 10_000] {
        let config = Config {
            window: 740,
            ..Config::default()
        };
        let mut a: Reliability<u32, u32> = Reliability::new(config.clone()).expect("config");
        let mut b: Reliability<u32, u32> = Reliability::new(config).expect("config");
        a.reserve_peers(peers as usize);
        for _ in 0..peers {
            a.add_peer();
        }
        let pb = b.add_peer();
        let pa = PeerId(peers / 2);
        let mut now = 0u64;
        group.bench_function(format!("{peers} peers, idle call"), |bench| {
            bench.iter(|| {
                now += 1_000;
                let t = Instant::from_nanos(now);
                a.share_credit(t, 5_744, 1);
                black_box(a.poll_timeout());
                black_box(a.poll_transmit(t).is_none())
            });
        });
        group.bench_function(format!("{peers} peers, one message each way"), |bench| {
            bench.iter(|| {
                now += 1_000;
                let t = Instant::from_nanos(now);
                a.share_credit(t, 5_744, 1);
                one_way(&mut a, pa, &mut b, pb, t);
                one_way(&mut b, pb, &mut a, pa, t);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, ping_pong, header, progress_as_peers_grow);
criterion_main!(benches);
