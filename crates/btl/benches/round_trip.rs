//! What one round trip of an 8-byte message costs the process, on one
//! thread over UDP loopback, where a datagram is in the peer's socket by the
//! time `sendmsg` returns: no spinning, no wake-up, no second CPU. The raw
//! socket pair is the floor; the difference to it is what the BTL (fabric
//! model, reliability, checksums, callbacks) adds per round trip. Profile
//! with `perf record` on this bench to see where that goes.

mod common;

use std::hint::black_box;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use udbtl_btl::{Component, EndpointId, Tag};
use udbtl_fabric::udp::UdpProvider;

const LEN: usize = 8;

fn raw_udp(c: &mut Criterion) {
    // Unconnected, as a UD queue pair's socket is (one socket, any peer)
    // and as the ping-pong floor (crates/floors) is.
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let (to_a, to_b) = (a.local_addr().expect("addr"), b.local_addr().expect("addr"));
    let message = [7u8; LEN];
    let mut buf = [0u8; 2048];
    c.bench_function("round trip, 8 B, loopback: raw UDP sockets", |bench| {
        bench.iter(|| {
            a.send_to(&message, to_b).expect("send");
            black_box(b.recv_from(&mut buf).expect("recv"));
            b.send_to(&message, to_a).expect("send");
            black_box(a.recv_from(&mut buf).expect("recv"));
        });
    });
}

/// Sends one message from `from` over `ep` and progresses `to` until it
/// arrived.
fn one_way(
    from: &mut Component<UdpProvider>,
    ep: EndpointId,
    to: &mut Component<UdpProvider>,
    arrived: &AtomicU64,
    message: &[u8],
) {
    let before = arrived.load(Ordering::Relaxed);
    from.modules_mut()[0]
        .send_message(ep, Tag::PML, message)
        .expect("send");
    while arrived.load(Ordering::Relaxed) == before {
        to.progress();
    }
}

fn udbtl(c: &mut Criterion) {
    let (mut a, at_a) = common::component(|_| None);
    let (mut b, at_b) = common::component(|_| None);
    let ab = a.add_procs(&[Some(&b.modex())]).expect("add")[0].endpoints[0].expect("ep");
    let ba = b.add_procs(&[Some(&a.modex())]).expect("add")[0].endpoints[0].expect("ep");
    let message = [7u8; LEN];
    c.bench_function("round trip, 8 B, loopback: udbtl modules", |bench| {
        bench.iter(|| {
            one_way(&mut a, ab, &mut b, &at_b, &message);
            one_way(&mut b, ba, &mut a, &at_a, &message);
        });
    });
    // Leave nothing unacknowledged behind for finalize.
    while a.modules()[0].unacknowledged() + b.modules()[0].unacknowledged() > 0 {
        a.progress();
        b.progress();
    }
    a.finalize().expect("finalize");
    b.finalize().expect("finalize");
}

criterion_group!(benches, raw_udp, udbtl);
criterion_main!(benches);
