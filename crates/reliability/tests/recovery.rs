//! Loss recovery at the scale of real paths, deterministic on virtual time:
//!
//! * at the windows MTU-sized datagrams use (740 at MTU 1500, up to the
//!   largest, 1024), far past the selective acknowledgement's 64 datagrams,
//!   one lost datagram costs one resend: a stream of 5 000 datagrams
//!   through a link of one datagram per 1.2 µs with a 10 µs one-way delay,
//!   the path of the issue that found resends growing with the window (676
//!   for one loss at window 740);
//! * after a timeout, repairs go as the congestion window allows, never in
//!   one burst, and a timeout found spurious gives the window back and
//!   stretches the timeout to cover the delay it met;
//! * a lone datagram, which the receiver acknowledges only after its delayed
//!   acknowledgement, sets off no tail-loss probe;
//! * a peer descheduled now and then for a time slice costs tail-loss
//!   probes (acknowledgement requests), never a resend.

#![allow(clippy::unwrap_used)]

mod harness;

use std::time::Duration;

use harness::{Faults, Net, payload};
use udbtl_reliability::{Config, Stats};

const MESSAGES: u64 = 5000;

/// Two nodes whose whole `window` is open from the first datagram, joined
/// by the issue's path: a 10 µs one-way delay and a link of one datagram
/// per 1.2 µs each way.
fn path_of_the_issue(window: u16, seed: u64) -> Net {
    let config = Config {
        window,
        initial_cwnd: window,
        initial_credit: window,
        ..Config::default()
    };
    let mut net = Net::new(2, &config, seed);
    net.latency = Duration::from_micros(10);
    for (from, to) in [(0, 1), (1, 0)] {
        net.set_bottleneck(from, to, Duration::from_nanos(1200));
    }
    net
}

/// Streams [`MESSAGES`] at `window` with the data datagram of sequence
/// number `lost` dropped once; checks every message arrived once, in order;
/// returns the sender's counters.
fn stream_with_one_loss(window: u16, lost: u32) -> Stats {
    let mut net = path_of_the_issue(window, 40);
    net.set_faults(
        0,
        1,
        Faults {
            drop_seq: Some((lost, 1)),
            ..Faults::default()
        },
    );
    for i in 0..MESSAGES {
        net.send(0, 1, payload(0, i, 64));
    }
    net.run_until_idle(Duration::from_secs(10));
    let delivered = &net.nodes[1].delivered[&0];
    assert_eq!(delivered.len() as u64, MESSAGES, "window {window}");
    for (i, bytes) in delivered.iter().enumerate() {
        assert_eq!(
            bytes,
            &payload(0, i as u64, 64),
            "window {window}: message {i}"
        );
    }
    *net.nodes[0].rel.stats()
}

#[test]
fn one_loss_costs_one_resend_at_every_window() {
    for window in [64, 128, 256, 740, 1024] {
        let s = stream_with_one_loss(window, 1000);
        assert_eq!(
            (s.retransmitted, s.timeouts),
            (1, 0),
            "window {window}: {s:?}"
        );
    }
}

#[test]
fn a_lone_datagram_every_millisecond_sets_off_no_tail_loss_probe() {
    let config = Config::default();
    let mut net = Net::new(2, &config, 41);
    net.latency = Duration::from_micros(5);
    // A burst first, acknowledged at once (its last datagram asks): the
    // smoothed round trip is the link's, about 10 µs, far below the
    // receiver's delayed acknowledgement.
    for i in 0..32 {
        net.send(0, 1, payload(0, i, 64));
    }
    net.run_until_idle(Duration::from_secs(1));
    for i in 32..132 {
        net.send(0, 1, payload(0, i, 64));
        let until = net.now + Duration::from_millis(1);
        net.run_while(Duration::from_secs(1), |n| n.now < until);
    }
    net.run_until_idle(Duration::from_secs(2));
    assert_eq!(net.nodes[1].delivered[&0].len(), 132);
    let s = net.nodes[0].rel.stats();
    assert_eq!(
        (s.tail_probes, s.retransmitted, s.timeouts),
        (0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn after_an_outage_no_step_sends_more_than_the_congestion_window() {
    let mut net = path_of_the_issue(740, 42);
    // Everything towards the receiver is lost for 2 ms, mid-stream.
    net.set_faults(
        0,
        1,
        Faults {
            outage: Some((Duration::from_millis(1), Duration::from_millis(3))),
            ..Faults::default()
        },
    );
    net.record = true;
    for i in 0..MESSAGES {
        net.send(0, 1, payload(0, i, 64));
    }
    let peer = net.nodes[0].node_peer[&1];
    let mut seen = net.log.len();
    let mut worst: Option<(usize, u32)> = None;
    net.run_while(Duration::from_secs(30), |n| {
        // What the sender put on the wire in the step just taken (one
        // instant), against its congestion window after it.
        let sent = n.log[seen..]
            .iter()
            .filter(|d| d.from == 0 && d.data)
            .count();
        seen = n.log.len();
        let cwnd = n.nodes[0].rel.cwnd(peer).unwrap();
        if n.nodes[0].rel.stats().timeouts > 0
            && worst.is_none_or(|(s, c)| sent as i64 - i64::from(cwnd) > s as i64 - i64::from(c))
        {
            worst = Some((sent, cwnd));
        }
        n.nodes[1].delivered.get(&0).map_or(0, Vec::len) < MESSAGES as usize
    });
    assert_eq!(net.nodes[1].delivered[&0].len() as u64, MESSAGES);
    let s = net.nodes[0].rel.stats();
    assert!(s.timeouts > 0, "the outage caused a timeout: {s:?}");
    // Each datagram lost in the outage went again about once, found lost
    // by RACK rather than by a timeout of its own (676 timeouts and 0.6 s
    // of virtual time when a repair's quick acknowledgement was taken for
    // a spurious one).
    assert!(s.timeouts <= 3 && s.retransmitted < 800, "{s:?}");
    let (sent, cwnd) = worst.unwrap();
    assert!(
        sent as u32 <= cwnd,
        "{sent} datagrams at once with a congestion window of {cwnd}: {s:?}"
    );
}

#[test]
fn a_timeout_found_spurious_gives_the_congestion_window_back() {
    // One way takes 0.8 of the first timeout: the timer fires before any
    // acknowledgement comes back, then the first transmissions' own
    // acknowledgements show its resend was not needed.
    let window = 512;
    let config = Config {
        window,
        initial_cwnd: window,
        initial_credit: window,
        ..Config::default()
    };
    let mut net = Net::new(2, &config, 43);
    net.latency = config.rto_initial.mul_f64(0.8);
    for i in 0..2000 {
        net.send(0, 1, payload(0, i, 64));
    }
    let peer = net.nodes[0].node_peer[&1];
    let mut after_spurious = None;
    net.run_while(Duration::from_secs(60), |n| {
        let s = n.nodes[0].rel.stats();
        if s.spurious_retransmits > 0 && after_spurious.is_none() {
            after_spurious = n.nodes[0].rel.cwnd(peer);
        }
        n.nodes[1].delivered.get(&0).map_or(0, Vec::len) < 2000
    });
    let s = net.nodes[0].rel.stats();
    assert!(s.timeouts >= 1 && s.spurious_retransmits >= 1, "{s:?}");
    let cwnd = after_spurious.unwrap();
    assert!(
        cwnd >= u32::from(window),
        "the window the timeout cut is restored: {cwnd} < {window}; {s:?}"
    );
    // The first transmissions' round trip (1.6 first timeouts) is what the
    // timeout covers now (RFC 4015): it does not fire for nothing again.
    let rto = net.nodes[0].rel.rto(peer).unwrap();
    assert!(rto >= config.rto_initial.mul_f64(1.6), "{rto:?}");
    assert_eq!(s.timeouts, 1, "{s:?}");
}

/// Two nodes exchange three datagrams each way every millisecond, as ranks
/// of a halo exchange do, and every third step one of them is descheduled
/// for 3 ms (4 ranks on 2 CPUs) right after sending. The tail-loss probes
/// that the silence sets off ask for an acknowledgement and resend nothing;
/// the timeout (`rto_min` 5 ms, the Open MPI component's) never fires.
#[test]
fn a_descheduled_peer_draws_probes_not_resends() {
    let config = Config {
        rto_min: Duration::from_millis(5),
        rto_initial: Duration::from_millis(5),
        ..Config::default()
    };
    let mut net = Net::new(2, &config, 43);
    net.latency = Duration::from_micros(5);
    let steps = 100;
    for step in 0..steps {
        for i in 0..3 {
            net.send(0, 1, payload(0, 3 * step + i, 64));
            net.send(1, 0, payload(1, 3 * step + i, 64));
        }
        if step % 3 == 1 {
            net.sleep((step as usize / 3) % 2, Duration::from_millis(3));
        }
        let until = net.now + Duration::from_millis(1);
        net.run_while(Duration::from_secs(1), |n| n.now < until);
    }
    net.run_until_idle(Duration::from_secs(2));
    let mut probes = 0;
    for (me, other) in [(0, 1), (1, 0)] {
        assert_eq!(net.nodes[other].delivered[&me].len(), 3 * steps as usize);
        let s = net.nodes[me].rel.stats();
        assert_eq!((s.retransmitted, s.timeouts), (0, 0), "node {me}: {s:?}");
        probes += s.tail_probes;
    }
    assert!(
        probes > 0,
        "no probe: the test no longer deschedules anyone"
    );
}
