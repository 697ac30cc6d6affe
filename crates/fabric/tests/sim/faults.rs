//! The fault model, measured over long seeded streams.

use super::*;

/// The bytes of datagram `seq`.
fn pattern(seq: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as usize * 131 + i * 7) as u8)
        .collect()
}

/// What a receiver saw of a stream.
#[derive(Debug, PartialEq)]
struct Stream {
    /// (imm = sequence number, payload), in arrival order.
    received: Vec<(u32, Vec<u8>)>,
    net: SimNetStats,
    rx: FabricStats,
}

/// Sends `n` datagrams from A to B, one every `interval`, datagram `i`
/// carrying `size(i)` bytes of `pattern(i)` and `imm = i`, over a link
/// configured as `link`. The receiver polls after every send and reposts
/// each buffer; at the end the clock runs until nothing is in flight.
fn run_stream(seed: u64, link: LinkConfig, n: u32, size: impl Fn(u32) -> usize) -> Stream {
    let interval = Duration::from_micros(1);
    let slots = 512;
    let (net, mut a, mut b) = pair_with(
        seed,
        Opts::default(),
        Opts {
            slots,
            cq_depth: slots as u32,
            ..Opts::default()
        },
    );
    net.set_link(a.port_id, b.port_id, link).unwrap();
    let ah = a.ah_to(b.port_id);
    let mut received = Vec::new();
    let drain = |b: &mut Node, received: &mut Vec<(u32, Vec<u8>)>| {
        for wc in b.poll() {
            assert_eq!(wc.status, WcStatus::Success);
            received.push((wc.imm.unwrap(), b.payload(&wc)));
            b.post_slot(wc.wr_id as usize);
        }
    };
    for seq in 0..n {
        a.send(
            ah,
            b.qp.qp_num,
            &pattern(seq, size(seq)),
            Some(seq),
            SendFlags::NONE,
        )
        .unwrap();
        net.advance(interval);
        drain(&mut b, &mut received);
    }
    while let Some(at) = net.next_arrival() {
        net.advance_to(at);
        drain(&mut b, &mut received);
    }
    assert_eq!(net.in_flight(), 0);
    assert_conserved(&net);
    assert_eq!(
        b.ctx.stats().rx_dropped(),
        0,
        "the receiver never ran out of buffers"
    );
    assert_eq!(net.stats().delivered, received.len() as u64);
    Stream {
        received,
        net: net.stats(),
        rx: b.ctx.stats(),
    }
}

const N: u32 = 20_000;

#[test]
fn loss_rate_matches_the_configuration() {
    let link = LinkConfig {
        loss: 0.05,
        ..LinkConfig::default()
    };
    let s = run_stream(11, link, N, |_| 32);
    let lost = u64::from(N) - s.received.len() as u64;
    assert_eq!(lost, s.net.dropped_loss);
    assert_rate("loss", lost, u64::from(N), 0.05);
    // What arrives is intact and in order.
    assert!(s.received.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(
        s.received
            .iter()
            .all(|(seq, bytes)| *bytes == pattern(*seq, 32))
    );
}

#[test]
fn duplication_rate_matches_the_configuration() {
    let link = LinkConfig {
        duplicate: 0.05,
        duplicate_delay: Duration::from_nanos(300),
        ..LinkConfig::default()
    };
    let s = run_stream(12, link, N, |_| 32);
    let mut seen = HashSet::new();
    let copies = s
        .received
        .iter()
        .filter(|(seq, _)| !seen.insert(*seq))
        .count() as u64;
    assert_eq!(seen.len(), N as usize, "nothing was lost");
    assert_eq!(copies, s.net.duplicated);
    assert_rate("duplication", copies, u64::from(N), 0.05);
}

#[test]
fn reorder_rate_matches_the_configuration() {
    let link = LinkConfig {
        reorder: 0.05,
        reorder_delay: (Duration::from_micros(5), Duration::from_micros(20)),
        latency: Duration::from_micros(2),
        ..LinkConfig::default()
    };
    let s = run_stream(13, link, N, |_| 32);
    assert_eq!(s.received.len(), N as usize);
    // A datagram is late if a later one arrived before it.
    let mut max_seen = None;
    let mut late = 0u64;
    for (seq, _) in &s.received {
        if max_seen.is_some_and(|m| *seq < m) {
            late += 1;
        }
        max_seen = max_seen.max(Some(*seq));
    }
    assert!(
        late <= s.net.reordered,
        "{late} late, {} delayed",
        s.net.reordered
    );
    assert_rate(
        "reordering (observed late arrivals)",
        late,
        u64::from(N),
        0.05,
    );
    assert_rate(
        "reordering (delayed by the link)",
        s.net.reordered,
        u64::from(N),
        0.05,
    );
}

#[test]
fn corruption_rate_matches_the_configuration_and_flips_one_bit() {
    let link = LinkConfig {
        corrupt: 0.05,
        ..LinkConfig::default()
    };
    let s = run_stream(14, link, N, |_| 48);
    assert_eq!(s.received.len(), N as usize);
    let mut corrupted = 0u64;
    for (seq, bytes) in &s.received {
        let expected = pattern(*seq, 48);
        let flipped: u32 = bytes
            .iter()
            .zip(&expected)
            .map(|(got, want)| (got ^ want).count_ones())
            .sum();
        assert!(flipped <= 1, "datagram {seq} has {flipped} flipped bits");
        corrupted += u64::from(flipped);
    }
    assert_eq!(corrupted, s.net.corrupted);
    assert_rate("corruption", corrupted, u64::from(N), 0.05);
}

#[test]
fn datagrams_above_the_link_mtu_are_dropped_and_counted() {
    let sizes = fastrand::Rng::with_seed(99);
    let sizes: Vec<usize> = {
        let mut rng = sizes;
        (0..10_000).map(|_| rng.usize(1..=200)).collect()
    };
    let link = LinkConfig {
        mtu: Some(150),
        ..LinkConfig::default()
    };
    let s = run_stream(15, link, sizes.len() as u32, |seq| sizes[seq as usize]);
    let oversize = sizes.iter().filter(|&&len| len > 150).count() as u64;
    assert_eq!(s.net.dropped_mtu, oversize);
    assert_eq!(s.received.len() as u64, sizes.len() as u64 - oversize);
    assert!(
        s.received
            .iter()
            .all(|(seq, bytes)| bytes.len() == sizes[*seq as usize])
    );
    assert!(s.received.iter().all(|(_, bytes)| bytes.len() <= 150));
    // Sizes are uniform in 1..=200, so a quarter is above 150.
    assert_rate("MTU drops", oversize, sizes.len() as u64, 0.25);
}

#[test]
fn nothing_crosses_a_link_during_its_blackout() {
    // Datagram i is sent at i µs; the window covers sends 2000..3000.
    let link = LinkConfig {
        blackout: Some((Duration::from_micros(2000), Duration::from_micros(3000))),
        ..LinkConfig::default()
    };
    let s = run_stream(16, link, 10_000, |_| 16);
    assert_eq!(s.net.dropped_blackout, 1000);
    let seqs: Vec<u32> = s.received.iter().map(|(seq, _)| *seq).collect();
    let expected: Vec<u32> = (0..2000).chain(3000..10_000).collect();
    assert_eq!(seqs, expected);
    eprintln!(
        "blackout: {}/10000 dropped (window of 1000 µs)",
        s.net.dropped_blackout
    );
}

fn everything() -> LinkConfig {
    LinkConfig {
        loss: 0.03,
        duplicate: 0.03,
        reorder: 0.05,
        reorder_delay: (Duration::from_micros(1), Duration::from_micros(30)),
        corrupt: 0.02,
        latency: Duration::from_micros(4),
        mtu: Some(100),
        blackout: Some((Duration::from_micros(500), Duration::from_micros(600))),
        duplicate_delay: Duration::from_micros(1),
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let size = |seq: u32| 1 + (seq as usize * 37) % 120;
    let first = run_stream(42, everything(), 5000, size);
    let second = run_stream(42, everything(), 5000, size);
    assert_eq!(first, second);
    assert!(first.net.dropped_loss > 0 && first.net.duplicated > 0 && first.net.corrupted > 0);
    assert!(first.net.dropped_mtu > 0 && first.net.dropped_blackout > 0);
    let other = run_stream(43, everything(), 5000, size);
    assert_ne!(first.received, other.received, "the seed drives the faults");
    assert_eq!(first.rx.rx_datagrams, first.received.len() as u64);
}

#[test]
fn the_context_clock_is_the_networks_virtual_time() {
    let net = SimNetwork::new(11);
    let ctx = net.add_device("clock0", 1).unwrap().open("clock0").unwrap();
    assert_eq!(ctx.now(), Duration::ZERO);
    net.advance(Duration::from_secs(30));
    assert_eq!(ctx.now(), Duration::from_secs(30));
}
