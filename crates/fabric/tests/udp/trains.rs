//! GRO trains split into datagrams, and batched sends.

use super::*;

#[test]
fn gro_trains_are_split_into_datagrams_in_order() {
    for (gso, gro) in [(true, true), (true, false), (false, true)] {
        let (mut a, mut b) = train_pair(gso, gro, 64);
        send_forty(&mut a, &b);
        let got = b.poll_for(40, WAIT);
        assert_eq!(got.len(), 40, "gso={gso} gro={gro}");
        // One sender, one socket: the datagrams come out in the order sent,
        // each whole, trains or not.
        for (i, wc) in got.iter().enumerate() {
            let len = if i == 39 { 100 } else { 1400 };
            assert_eq!(b.payload(wc), vec![i as u8; len], "datagram {i}");
        }
        let trains = b.ctx.stats().rx_gro_trains;
        if gso && gro {
            assert!(trains >= 1, "no train was received whole");
        } else {
            assert_eq!(trains, 0);
        }
        assert_eq!(b.ctx.stats().rx_datagrams, 40);
    }
}

/// A train arrives spread over the posted buffers at the port's longest
/// datagram each (the first one a socket gets over one buffer and the spill
/// space, later ones over as many buffers as it needed), and each datagram
/// ends in a buffer of its own: whole, in order, for lengths from just over
/// the UD header to the maximum.
#[test]
fn gro_trains_of_any_length_are_put_one_per_buffer() {
    for len in [1, 17, 100, 699, 1000, 1399, 1400] {
        let (mut a, mut b) = train_pair(true, true, 128);
        let ah = a.ah(node(&b));
        for round in 1..=3 {
            post_forty_of(&mut a, ah, b.qp.qp_num, QKEY, [len, len.div_ceil(2)], 40);
            assert_eq!(a.poll_for(40, WAIT).len(), 40);
            let got = b.poll_for(40, WAIT);
            assert_eq!(got.len(), 40, "length {len}, round {round}");
            for (i, wc) in got.iter().enumerate() {
                let want = if i == 39 { len.div_ceil(2) } else { len };
                let what = format!("length {len}, round {round}, datagram {i}");
                assert_eq!(b.payload(wc), vec![i as u8; want], "{what}");
            }
        }
        assert!(b.ctx.stats().rx_gro_trains >= 1, "length {len}: no train");
        assert_eq!(b.ctx.stats().rx_datagrams, 120);
    }
}

/// A train of datagrams longer than the port's own (a peer with a larger
/// MTU), which the posted buffers can still hold, arrives spread over the
/// buffers at the port's size and is put right, first datagram first.
#[test]
fn gro_trains_longer_than_the_ports_datagrams_are_put_one_per_buffer() {
    let (_a, mut b) = train_pair(true, true, 64);
    let stranger = Stranger::new();
    let dest = SocketAddr::new(b.ctx.ip(), b.qp.qp_num as u16);
    let header = udbtl_wire::ud::Repr {
        pkey: 0xffff,
        qkey: QKEY,
        imm: None,
    }
    .to_bytes();
    let segment = 1600;
    let mut contents = Vec::new();
    for i in 0..5u8 {
        contents.extend_from_slice(&header);
        contents.resize(contents.len() + segment - header.len(), i);
    }
    assert_eq!(stranger.send_train(dest, &contents, segment), 5);
    let got = b.poll_for(5, WAIT);
    assert_eq!(got.len(), 5, "{:?}", b.ctx.stats());
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            b.payload(wc),
            vec![i as u8; segment - header.len()],
            "datagram {i}"
        );
    }
}

#[test]
fn a_train_polled_one_completion_at_a_time_is_delivered_whole() {
    let (mut a, mut b) = train_pair(true, true, 64);
    send_forty(&mut a, &b);
    // A budget of one: the train completes more than asked for, and the
    // rest waits in the completion queue for the next polls.
    let mut got = Vec::new();
    let mut one = [WorkCompletion::EMPTY; 1];
    let deadline = std::time::Instant::now() + WAIT;
    while got.len() < 40 && std::time::Instant::now() < deadline {
        let n = b.ctx.poll_cq(b.cq, &mut one).unwrap();
        got.extend_from_slice(&one[..n]);
    }
    assert_eq!(got.len(), 40);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(b.payload(wc)[0], i as u8);
    }
}

#[test]
fn a_train_with_the_wrong_qkey_is_dropped_per_datagram_and_keeps_the_buffers() {
    let (mut a, mut b) = train_pair(true, true, 40);
    send_forty_with_qkey(&mut a, &b, QKEY ^ 1);
    assert!(b.poll_during(Duration::from_millis(200)).is_empty());
    assert_eq!(b.ctx.stats().rx_bad_qkey, 40);
    // Every posted buffer is still there for forty good datagrams.
    assert_forty_arrive(&mut a, &mut b);
}

/// Junk that arrives as GRO trains (a stranger sending with UDP GSO), with
/// datagrams of every length around the UD header's, is counted as
/// malformed datagram by datagram, keeps the posted buffers, and lets a good
/// datagram through. Datagrams shorter than the header used to panic the
/// receive path (a slice copied into the fixed-size header).
#[test]
fn junk_trains_of_datagrams_shorter_than_the_header_are_counted_not_fatal() {
    let (mut a, mut b) = train_pair(true, true, 40);
    let stranger = Stranger::new();
    let dest = SocketAddr::new(b.ctx.ip(), b.qp.qp_num as u16);
    let mut junk = 0;
    let short = 1..=2 * udbtl_wire::ud::HEADER_LEN;
    for segment in short.chain([100, 700, 1399, 1400]) {
        // Four whole datagrams and a shorter last one.
        let contents = vec![0xA5; 4 * segment + segment.div_ceil(2)];
        junk += stranger.send_train(dest, &contents, segment);
    }
    assert!(b.poll_during(Duration::from_millis(200)).is_empty());
    let stats = b.ctx.stats();
    assert!(stats.rx_gro_trains > 0, "no train formed: {stats:?}");
    assert_eq!(stats.rx_malformed, junk, "{stats:?}");
    // Every posted buffer is still there for forty good datagrams.
    assert_forty_arrive(&mut a, &mut b);
}

/// With no receive posted, what arrives is read and dropped, each datagram
/// (each datagram of a GRO train too) counted by its own header: genuine
/// datagrams as dropped for want of a buffer, junk as malformed. A batch
/// used to be judged by its last datagram's header, and a train of junk
/// counted once.
#[test]
fn without_a_posted_receive_each_datagram_is_counted_by_its_own_header() {
    let (mut a, mut b) = train_pair(true, true, 1);
    // b's only buffer is consumed and not reposted.
    let ah = a.ah(node(&b));
    a.send(ah, b.qp.qp_num, QKEY, b"first", 0).unwrap();
    assert_eq!(a.poll_for(1, WAIT).len(), 1);
    assert_eq!(b.poll_for(1, WAIT).len(), 1);
    let stranger = Stranger::new();
    let dest = SocketAddr::new(b.ctx.ip(), b.qp.qp_num as u16);
    assert_eq!(stranger.send_train(dest, &[0x5A; 5 * 10], 10), 5);
    for junk in [&b""[..], b"short", &[0xAB; 300]] {
        stranger.socket.send_to(junk, dest).unwrap();
    }
    // Forty genuine datagrams, in trains, after the junk.
    post_forty(&mut a, ah, b.qp.qp_num, QKEY, 100, 40);
    assert_eq!(a.poll_for(40, WAIT).len(), 40);
    assert!(b.poll_during(Duration::from_millis(200)).is_empty());
    let stats = b.ctx.stats();
    assert_eq!(stats.rx_malformed, 5 + 3, "{stats:?}");
    assert_eq!(stats.rx_no_buffer, 40, "{stats:?}");
}

#[test]
fn a_train_longer_than_the_posted_buffers_loses_its_tail_counted() {
    let (mut a, mut b) = train_pair(true, true, 10);
    send_forty(&mut a, &b);
    let got = b.poll_for(40, Duration::from_millis(300));
    assert_eq!(got.len(), 10);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(b.payload(wc), vec![i as u8; 1400]);
    }
    let stats = b.ctx.stats();
    assert_eq!(stats.rx_datagrams, 10);
    assert_eq!(stats.rx_no_buffer, 30);
}

#[test]
fn batched_equal_sends_arrive_as_separate_datagrams() {
    for gso in [true, false] {
        let (mut a, mut b) = train_pair(gso, false, 64);
        send_forty(&mut a, &b);
        let got = b.poll_for(40, WAIT);
        assert_eq!(got.len(), 40, "gso={gso}");
        let mut seen: Vec<u8> = got.iter().map(|wc| b.payload(wc)[0]).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..40).collect::<Vec<u8>>());
        assert!(
            got.iter()
                .all(|wc| wc.payload_len() == if b.payload(wc)[0] == 39 { 100 } else { 1400 })
        );
        // A batch moves at most 32 datagrams: trains of 32 and of 8.
        assert_eq!(a.ctx.stats().tx_gso_trains, 2 * u64::from(gso));
    }
}
