//! The `udp` provider's long datagrams, cut into pieces of one packet each
//! ([`udbtl_wire::segment`]), over real loopback sockets standing in for
//! an MTU-1500 path (`segment_wire`): they arrive whole and in order with
//! GRO and without, pieces from several senders are put together apart,
//! and a datagram missing a piece, or garbage that looks like a piece, is
//! counted and never delivered.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::*;
use udbtl_fabric::udp::{UdpConfig, UdpContext, UdpProvider};
use udbtl_fabric::*;
use udbtl_wire::{segment, ud};

const WAIT: Duration = Duration::from_secs(5);
/// The UDP payload of one packet on an MTU-1500 IPv4 path.
const WIRE: usize = 1472;
/// Bytes of each receive buffer: the longest datagram and the GRH.
const BUFFER: usize = 65_536 + GRH_LEN;

/// The UDP payload of one packet on an MTU-9000 IPv4 path.
const JUMBO_WIRE: usize = 8972;

fn open(gro: bool) -> UdpContext {
    open_for(gro, WIRE)
}

fn open_for(gro: bool, wire: usize) -> UdpContext {
    let provider = UdpProvider::new(UdpConfig {
        gro,
        segment_wire: Some(wire),
        ..UdpConfig::default()
    });
    let device = provider.devices().unwrap()[0].name.clone();
    provider.open(&device).unwrap()
}

fn endpoint(gro: bool, slots: usize) -> Endpoint<UdpContext> {
    Endpoint::with_buffers(open(gro), slots, BUFFER, QKEY)
}

/// `len` bytes that differ from datagram to datagram (`seed`).
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + seed * 13) as u8).collect()
}

/// Sends `payload` from `a`'s send slab (one 64 KiB quarter per `wr_id`
/// modulo 4) and waits for the send to complete.
fn send(a: &mut Endpoint<UdpContext>, ah: AhHandle, qpn: u32, payload: &[u8], wr_id: u64) {
    let offset = (wr_id as usize % 4) << 16;
    a.send_from(offset, ah, qpn, QKEY, payload, wr_id).unwrap();
    let sent = a.poll_for(1, WAIT);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success);
}

#[test]
fn a_port_that_segments_takes_datagrams_of_one_gso_send() {
    let ctx = open(true);
    let pieces = 16;
    let expected = pieces * (WIRE - segment::HEADER_LEN) - ud::HEADER_LEN;
    assert_eq!(ctx.query_port(1).unwrap().max_msg_size, expected);
    // Off, a datagram is one packet at most.
    let off = UdpProvider::new(UdpConfig {
        segment: false,
        segment_wire: Some(WIRE),
        ..UdpConfig::default()
    });
    let device = off.devices().unwrap()[0].name.clone();
    let port = off.open(&device).unwrap().query_port(1).unwrap();
    assert_eq!(port.max_msg_size, 65_507 - ud::HEADER_LEN);
}

#[test]
fn long_datagrams_arrive_whole_and_in_order_with_gro_and_without() {
    // With GRO, pieces of jumbo frames are read in place; those of
    // 1500-byte packets go through the scratch space (`segment/in_place.rs`).
    for (gro, wire) in [(true, WIRE), (false, WIRE), (true, JUMBO_WIRE)] {
        let endpoint = |slots| Endpoint::with_buffers(open_for(gro, wire), slots, BUFFER, QKEY);
        let (mut a, mut b) = (endpoint(4), endpoint(64));
        let ah = a.ah(NodeAddr::Ip(b.ctx.ip()));
        let max = a.ctx.query_port(1).unwrap().max_msg_size;
        let one_packet = wire - ud::HEADER_LEN;
        let lens = [1, one_packet, one_packet + 1, 5000, 20_000, max - 1, max];
        let cut = lens.iter().filter(|&&len| len > one_packet).count() as u64;
        for round in 0..3 {
            for (i, &len) in lens.iter().enumerate() {
                send(&mut a, ah, b.qp.qp_num, &pattern(len, i + round), i as u64);
            }
            let got = b.poll_for(lens.len(), WAIT);
            assert_eq!(
                got.len(),
                lens.len(),
                "gro {gro}, wire {wire}, round {round}"
            );
            for (i, (wc, &len)) in got.iter().zip(&lens).enumerate() {
                assert_eq!(wc.status, WcStatus::Success);
                assert_eq!(
                    b.payload(wc),
                    pattern(len, i + round),
                    "gro {gro}, wire {wire}, length {len}"
                );
                b.post_slot(wc.wr_id as usize);
            }
        }
        let (sent, received) = (a.ctx.stats(), b.ctx.stats());
        assert_eq!(
            sent.tx_segmented,
            3 * cut,
            "gro {gro}, wire {wire}: {sent:?}"
        );
        assert_eq!(received.rx_datagrams, 3 * lens.len() as u64);
        assert_eq!(
            received.rx_dropped(),
            0,
            "gro {gro}, wire {wire}: {received:?}"
        );
        if gro {
            assert!(received.rx_gro_trains > 0, "no train formed: {received:?}");
        }
        if gro && wire == JUMBO_WIRE {
            // A datagram in pieces after one in pieces is read in place.
            assert!(received.rx_in_place > 0, "none read in place: {received:?}");
        } else {
            assert_eq!(received.rx_in_place, 0, "wire {wire}: {received:?}");
        }
    }
}

#[test]
fn datagrams_posted_together_share_gso_sends_and_arrive_apart() {
    // Two datagrams that fill all their pieces go in one GSO send of 32
    // packets (`segment::pieces_send_end`); one whose last piece is short
    // is padded to go before another where that costs at most an eighth,
    // else it ends a send.
    let max = open(false).query_port(1).unwrap().max_msg_size;
    let cases = [
        // [max, max] (a third would pass one UDP payload), [max, max - 1]
        // (1 byte short: no room for the trailer), [max, max, 5000].
        (vec![max, max, max, max - 1, max, max, 5000], 3),
        // 16 KiB messages, three to a send, the first two padded; 5000
        // bytes would need more padding than an eighth.
        (vec![16_400, 16_400, 16_400, 16_400, 5000, 5000, 16_400], 4),
    ];
    let runs = [true, false]
        .into_iter()
        .flat_map(|gro| cases.iter().map(move |case| (gro, WIRE, case)));
    // Jumbo frames: 16 KiB messages in two pieces, three to a send, which
    // a receiver that reads pieces in place takes apart through its
    // scratch space.
    let jumbo = (vec![16_400; 6], 2);
    for (gro, wire, (lens, expected_sends)) in runs.chain([(true, JUMBO_WIRE, &jumbo)]) {
        let endpoint = |slots| Endpoint::with_buffers(open_for(gro, wire), slots, BUFFER, QKEY);
        let (mut a, mut b) = (endpoint(4), endpoint(64));
        let ah = a.ah(NodeAddr::Ip(b.ctx.ip()));
        let (lens, expected_sends) = (lens.as_slice(), *expected_sends);
        let mut offsets = Vec::new();
        let mut at = 0;
        for (i, &len) in lens.iter().enumerate() {
            a.ctx.mr_bytes_mut(a.send_mr.handle).unwrap()[at..at + len]
                .copy_from_slice(&pattern(len, i));
            offsets.push(at);
            at += len;
        }
        let sges: Vec<[Gather<'_>; 1]> = offsets
            .iter()
            .zip(lens)
            .map(|(&offset, &len)| {
                [Gather::Registered(Sge {
                    lkey: a.send_mr.lkey,
                    offset,
                    len,
                })]
            })
            .collect();
        let wrs = signaled_sends(&sges, ah, b.qp.qp_num, QKEY);
        a.ctx.post_send(a.qp.handle, &wrs).unwrap();
        assert_eq!(a.poll_for(lens.len(), WAIT).len(), lens.len());
        let got = b.poll_for(lens.len(), WAIT);
        assert_eq!(got.len(), lens.len(), "gro {gro}");
        for (i, (wc, &len)) in got.iter().zip(lens).enumerate() {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(b.payload(wc), pattern(len, i), "gro {gro}, datagram {i}");
        }
        let (sent, received) = (a.ctx.stats(), b.ctx.stats());
        assert_eq!(sent.tx_segmented, lens.len() as u64, "{sent:?}");
        assert_eq!(sent.tx_gso_trains, expected_sends, "{sent:?}");
        assert_eq!(received.rx_dropped(), 0, "gro {gro}: {received:?}");
    }
}

/// A crafted piece: the UD header is in the first piece's bytes.
fn piece(count: u8, index: u8, unit: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0; segment::HEADER_LEN];
    segment::Repr {
        count,
        index,
        unit,
        padded: false,
    }
    .emit(&mut bytes);
    bytes.extend_from_slice(body);
    bytes
}

/// The pieces of a datagram carrying `payload`, in three.
fn three_pieces(unit: u32, payload: &[u8]) -> [Vec<u8>; 3] {
    let mut datagram = ud::Repr {
        pkey: 0xffff,
        qkey: QKEY,
        imm: None,
    }
    .to_bytes()
    .to_vec();
    datagram.extend_from_slice(payload);
    let third = datagram.len().div_ceil(3);
    let mut parts = datagram.chunks(third);
    [0, 1, 2].map(|index| piece(3, index, unit, parts.next().unwrap()))
}

#[test]
fn pieces_from_two_senders_are_put_together_apart() {
    let mut b = endpoint(false, 16);
    let to = (b.ctx.ip(), b.qp.qp_num as u16);
    let (one, two) = (
        UdpSocket::bind("127.0.0.1:0").unwrap(),
        UdpSocket::bind("127.0.0.1:0").unwrap(),
    );
    let (first, second) = (pattern(3000, 1), pattern(2000, 2));
    let (p1, p2) = (three_pieces(7, &first), three_pieces(7, &second));
    for index in 0..3 {
        one.send_to(&p1[index], to).unwrap();
        two.send_to(&p2[index], to).unwrap();
    }
    let got = b.poll_for(2, WAIT);
    assert_eq!(got.len(), 2);
    let mut payloads: Vec<Vec<u8>> = got.iter().map(|wc| b.payload(wc)).collect();
    payloads.sort_by_key(Vec::len);
    assert_eq!(payloads, [second, first]);
    assert_eq!(b.ctx.stats().rx_dropped(), 0);
}

#[test]
fn a_datagram_missing_a_piece_is_dropped_and_counted() {
    for gro in [true, false] {
        let mut b = endpoint(gro, 16);
        let to = (b.ctx.ip(), b.qp.qp_num as u16);
        let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
        let lost = three_pieces(1, &pattern(3000, 1));
        raw.send_to(&lost[0], to).unwrap();
        raw.send_to(&lost[2], to).unwrap();
        // A piece whose start never came, then a whole datagram.
        raw.send_to(&three_pieces(2, &pattern(3000, 2))[1], to)
            .unwrap();
        let whole = pattern(3000, 3);
        for bytes in three_pieces(3, &whole) {
            raw.send_to(&bytes, to).unwrap();
        }
        let got = b.poll_for(1, WAIT);
        assert_eq!(got.len(), 1, "gro {gro}");
        assert_eq!(b.payload(&got[0]), whole);
        assert!(b.poll_during(Duration::from_millis(50)).is_empty());
        let stats = b.ctx.stats();
        assert_eq!(
            (stats.rx_datagrams, stats.rx_incomplete),
            (1, 2),
            "gro {gro}: {stats:?}"
        );
    }
}

#[test]
fn garbage_that_looks_like_a_piece_is_counted_and_never_delivered() {
    let mut b = endpoint(true, 16);
    let to = (b.ctx.ip(), b.qp.qp_num as u16);
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    // The magic alone, a count of one, an index past the count, and a
    // datagram put together whose UD header is wrong.
    raw.send_to(&segment::MAGIC.to_be_bytes(), to).unwrap();
    raw.send_to(&piece(1, 0, 5, b"xyz"), to).unwrap();
    raw.send_to(&piece(2, 2, 5, b"xyz"), to).unwrap();
    raw.send_to(&piece(2, 0, 6, &[0xee; 40]), to).unwrap();
    raw.send_to(&piece(2, 1, 6, &[0xee; 40]), to).unwrap();
    let whole = pattern(3000, 4);
    for bytes in three_pieces(9, &whole) {
        raw.send_to(&bytes, to).unwrap();
    }
    let got = b.poll_for(1, WAIT);
    assert_eq!(got.len(), 1);
    assert_eq!(b.payload(&got[0]), whole);
    assert!(b.poll_during(Duration::from_millis(50)).is_empty());
    let stats = b.ctx.stats();
    assert_eq!(stats.rx_datagrams, 1);
    assert_eq!(stats.rx_malformed, 4, "{stats:?}");
}
