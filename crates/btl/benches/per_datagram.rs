//! What the BTL adds per datagram at MTU 1500, both ends together: 1 MiB,
//! sent as 64 KiB messages between two modules on one thread over UDP
//! loopback, standing in for an MTU-1500 path (1472-byte UDP payloads),
//! against the same bytes in 1472-byte datagrams through two raw sockets
//! with GSO and GRO, the kernel's floor. Every line reports time per 1416
//! payload bytes, one MTU-1500 packet's worth; the difference from the
//! floor is the BTL's own work (fabric model, reliability, checksums,
//! reassembly, callbacks) per packet sent and received, which issue 27
//! budgets at 0.4 µs. Two udbtl lines:
//!
//! * one-packet datagrams (`udp_mtu` 1456, as with `udp_segment` off):
//!   every layer works once per 1416 bytes;
//! * 16-packet datagrams, as the udp provider sends at MTU 1500 by default
//!   (`udp_segment`): the layers above the fabric work once per 23 KB, and
//!   the provider cuts and joins the pieces.
//!
//! Profile with `perf record` on this bench to see where it goes.
//!
//! The floor sets UDP_SEGMENT and UDP_GRO, which neither std nor socket2
//! offers: `set_int` holds the one `unsafe` call.
#![allow(unsafe_code)]

mod common;

use std::hint::black_box;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use udbtl_btl::{Component, EndpointId, Tag};
use udbtl_fabric::udp::{UdpConfig, UdpProvider};

/// The parameters of an MTU-1500 path: 1416 bytes of payload per datagram.
fn mtu_1500(name: &str) -> Option<String> {
    (name == "UDBTL_UDP_MTU").then(|| UDP_MTU.to_string())
}

/// Payload per datagram once the UD and BTL headers are taken from 1472.
const PAYLOAD: usize = 1416;
/// `udp_mtu`, which counts the UD header in the payload it leaves.
const UDP_MTU: usize = 1456;
/// Bytes sent per iteration.
const TOTAL: usize = 1 << 20;
/// Bytes per `send_message`: less than it copies ahead of the wire, so it
/// never waits for the receiver's window, which on this one thread only
/// moves between the calls.
const MESSAGE: usize = 64 << 10;
const DATAGRAMS: u64 = (TOTAL / MESSAGE * MESSAGE.div_ceil(PAYLOAD)) as u64;
/// The UDP payload of one datagram at MTU 1500 (IPv4).
const UDP_PAYLOAD: usize = 1472;
/// Datagrams per GSO send: as many as one 64 KiB UDP send holds.
const TRAIN: usize = 65_507 / UDP_PAYLOAD;

/// Sets an integer socket option, which the bench cannot run without.
fn set_int(socket: &UdpSocket, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: the pointer and length describe `value`, alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(&value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt: {}", std::io::Error::last_os_error());
}

fn raw_gso_gro(c: &mut Criterion) {
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
    set_int(
        &a,
        libc::SOL_UDP,
        libc::UDP_SEGMENT,
        UDP_PAYLOAD as libc::c_int,
    );
    set_int(&b, libc::SOL_UDP, libc::UDP_GRO, 1);
    set_int(&b, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20);
    let to_b = b.local_addr().expect("addr");
    let total = DATAGRAMS as usize * UDP_PAYLOAD;
    let data = vec![7u8; TRAIN * UDP_PAYLOAD];
    let mut buf = vec![0u8; 1 << 16];
    let mut group = c.benchmark_group("per datagram, MTU 1500, loopback, one thread");
    group.throughput(Throughput::Elements(DATAGRAMS));
    group.bench_function("raw UDP sockets, GSO and GRO", |bench| {
        bench.iter(|| {
            let mut sent = 0;
            while sent < total {
                let len = (total - sent).min(data.len());
                sent += a.send_to(&data[..len], to_b).expect("send");
                let mut got = 0;
                while got < len {
                    got += black_box(b.recv(&mut buf).expect("recv"));
                }
            }
        });
    });
    group.finish();
}

/// Sends [`TOTAL`] bytes from `from` over `ep` as messages of [`MESSAGE`]
/// bytes, progressing both after each until it arrived, and at the end
/// until every datagram is acknowledged.
fn one_mebibyte(
    from: &mut Component<UdpProvider>,
    ep: EndpointId,
    to: &mut Component<UdpProvider>,
    arrived: &AtomicU64,
    message: &[u8],
) {
    for _ in 0..TOTAL / MESSAGE {
        let before = arrived.load(Ordering::Relaxed);
        from.modules_mut()[0]
            .send_message(ep, Tag::PML, message)
            .expect("send");
        while arrived.load(Ordering::Relaxed) == before {
            to.progress();
            from.progress();
        }
    }
    while from.modules()[0].unacknowledged() > 0 {
        to.progress();
        from.progress();
    }
}

/// Benchmarks [`one_mebibyte`] from `a` to `b`, two modules made alike,
/// as `name`, and finalizes both.
fn bench_modules(
    c: &mut Criterion,
    name: &str,
    (mut a, _): (Component<UdpProvider>, Arc<AtomicU64>),
    (mut b, at_b): (Component<UdpProvider>, Arc<AtomicU64>),
) {
    let ab = a.add_procs(&[Some(&b.modex())]).expect("add")[0].endpoints[0].expect("ep");
    b.add_procs(&[Some(&a.modex())]).expect("add");
    let message = vec![7u8; MESSAGE];
    let mut group = c.benchmark_group("per datagram, MTU 1500, loopback, one thread");
    group.throughput(Throughput::Elements(DATAGRAMS));
    group.bench_function(name, |bench| {
        bench.iter(|| one_mebibyte(&mut a, ab, &mut b, &at_b, &message));
    });
    group.finish();
    a.finalize().expect("finalize");
    b.finalize().expect("finalize");
}

fn udbtl(c: &mut Criterion) {
    let a = common::component(mtu_1500);
    assert_eq!(
        a.0.modules()[0].limits().eager_limit,
        PAYLOAD,
        "udp_mtu {UDP_MTU} should leave {PAYLOAD} bytes per datagram"
    );
    let b = common::component(mtu_1500);
    bench_modules(c, "udbtl modules, 64 KiB messages", a, b);
}

fn udbtl_segmented(c: &mut Criterion) {
    let mtu_path = |config: &mut UdpConfig| {
        config.segment_wire = Some(UDP_PAYLOAD);
    };
    let a = common::component_on(|_| None, mtu_path);
    assert!(
        a.0.modules()[0].limits().eager_limit > 10 * PAYLOAD,
        "the provider should carry datagrams of many packets"
    );
    let b = common::component_on(|_| None, mtu_path);
    bench_modules(
        c,
        "udbtl modules, 16-packet datagrams, 64 KiB messages",
        a,
        b,
    );
}

criterion_group!(benches, raw_gso_gro, udbtl, udbtl_segmented);
criterion_main!(benches);
