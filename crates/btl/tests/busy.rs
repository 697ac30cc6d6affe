//! Busy and dead ranks at scale, on the seeded `sim` fabric and virtual
//! time.
//!
//! A busy rank computes and does not call `progress`; its progress helper
//! thread services the fabric meanwhile (`Module::service` here, since the
//! simulator has no thread): it acknowledges, answers probes and keeps
//! in-order data in the receive pool, but runs no callback. A dead rank's
//! port is down. A busy rank must never be declared lost, however long it
//! computes, and must get everything once it progresses again; a dead one
//! must be declared lost on time, by the ranks that wait for it, and only
//! it.
//!
//! Nothing here sleeps or reads the wall clock.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use udbtl_btl::*;
use udbtl_fabric::sim::{LinkConfig, SimNetwork};
use udbtl_fabric::{Context, PortState};

/// Ranks in the fan-out scenario.
const RANKS: usize = 24;
/// The busy rank.
const BUSY: usize = 1;
/// The dead rank.
const DEAD: usize = 2;
/// Messages rank 0 sends to every other rank.
const ROUNDS: usize = 12;

fn config() -> BtlConfig {
    BtlConfig {
        rd_num: Some(64),
        sd_num: Some(32),
        ..BtlConfig::default()
    }
}

fn light_faults(net: &SimNetwork) {
    net.set_default_link(LinkConfig {
        loss: 0.02,
        duplicate: 0.01,
        reorder: 0.02,
        reorder_delay: (Duration::from_micros(5), Duration::from_micros(100)),
        latency: Duration::from_micros(5),
        duplicate_delay: Duration::from_micros(7),
        ..LinkConfig::default()
    })
    .unwrap();
}

/// Length of message `index`: one, two or three datagrams.
fn length(index: usize, eager: usize) -> usize {
    [1, 100, eager + 1, 7, 3 * eager, 500][index % 6]
}

fn datagrams(len: usize, eager: usize) -> usize {
    len.div_ceil(eager).max(1)
}

fn port_down(net: &SimNetwork, btl: &Btl) {
    let port = btl.modules()[0].with_context(|c| c.port_id(1)).unwrap();
    net.set_port_state(port, PortState::Down).unwrap();
}

/// Rank 0 sends `ROUNDS` messages to each of the 23 other ranks; rank 1 is
/// busy for 3 × peer_timeout, then progresses; rank 2 is dead. With
/// `owing_ack`, rank 1 first takes one message while active and turns busy
/// right after its callback ran, before its delayed acknowledgement left.
fn fan_out(seed: u64, owing_ack: bool) {
    let peer_timeout = peer_timeout_default();
    assert_eq!(peer_timeout, Duration::from_secs(30));
    let rto_max = rto_max(peer_timeout);
    let net = SimNetwork::new(seed);
    light_faults(&net);
    let mut nodes: Vec<Btl> = (0..RANKS)
        .map(|i| node(&net, &format!("r{i}"), &config()))
        .collect();
    let eps = mesh(&mut nodes);
    let inboxes: Vec<Inbox> = nodes.iter_mut().map(|n| inbox(n, Tag::PML)).collect();
    let errs: Vec<Errors> = nodes.iter_mut().map(|n| errors(&net, n)).collect();
    let done = completions(&net, &mut nodes[0]);
    let eager = nodes[0].modules()[0].limits().eager_limit;
    let message = |to: usize, i: usize| payload(0, to, i, length(i, eager));
    let per_peer: usize = (0..ROUNDS)
        .map(|i| datagrams(length(i, eager), eager))
        .sum();
    // While rank 1 is away its pool keeps in-order data for it: at most
    // count - reserve = 64 - 16 buffers. Everything sent to it fits, so
    // everything is acknowledged while it is busy.
    assert!(per_peer < 48, "{per_peer} datagrams");
    let acked_by = |peer: usize| {
        done.lock()
            .unwrap()
            .iter()
            .filter(|(ev, _)| ev.endpoint == eps[0][peer].unwrap())
            .map(|(ev, at)| (ev.status.is_ok(), *at))
            .collect::<Vec<_>>()
    };
    port_down(&net, &nodes[DEAD]);
    let mut roles = vec![Role::Active; RANKS];
    roles[DEAD] = Role::Dead;

    let mut first = 0;
    if owing_ack {
        // Rank 1 takes message 0 while active; the driver stops right after
        // the progress call that ran its callback.
        let msg = message(BUSY, 0);
        assert_eq!(datagrams(msg.len(), eager), 1);
        nodes[0].modules_mut()[0]
            .send_message(eps[0][BUSY].unwrap(), Tag::PML, &msg)
            .unwrap();
        let stop = drive_roles(&net, &mut nodes, &roles, Duration::from_secs(1), |_| {
            inboxes[BUSY].lock().unwrap().len() == 1
        });
        assert_eq!(stop, Stop::Done, "{}", diagnostics(&net, &nodes));
        assert!(
            acked_by(BUSY).is_empty(),
            "rank 1 owes its delayed acknowledgement when it turns busy"
        );
        first = 1;
    }
    roles[BUSY] = Role::Busy;
    let busy_from = net.now();
    let busy_until = busy_from + 3 * peer_timeout;

    // Rank 0 sends round by round, a millisecond apart, rank 2 first.
    let mut first_to_dead = None;
    for i in first..ROUNDS {
        for to in [DEAD]
            .into_iter()
            .chain((1..RANKS).filter(|&to| to != DEAD))
        {
            nodes[0].modules_mut()[0]
                .send_message(eps[0][to].unwrap(), Tag::PML, &message(to, i))
                .unwrap();
            first_to_dead.get_or_insert(net.now());
        }
        drive_roles(&net, &mut nodes, &roles, Duration::from_millis(1), |_| {
            false
        });
    }
    let first_to_dead = first_to_dead.unwrap();
    // Datagrams rank 0 sent to each rank but rank 1.
    let others_per_peer: usize = (first..ROUNDS)
        .map(|i| datagrams(length(i, eager), eager))
        .sum();

    // Rank 1 computes for 3 × peer_timeout.
    let stop = drive_roles(
        &net,
        &mut nodes,
        &roles,
        busy_until.saturating_sub(net.now()),
        |_| false,
    );
    // Once everything settled, time may pass with nothing to do.
    assert_ne!(stop, Stop::Done);
    net.advance_to(busy_until);
    drive_roles(&net, &mut nodes, &roles, Duration::ZERO, |_| false);

    let diag = |nodes: &[Btl]| diagnostics(&net, nodes);
    // No callback ran on rank 1 while it was busy.
    assert_eq!(
        inboxes[BUSY].lock().unwrap().len(),
        first,
        "delivered while busy"
    );
    // Yet everything sent to it was acknowledged: its pool kept the data.
    let to_busy = acked_by(BUSY);
    assert_eq!(to_busy.len(), per_peer, "{}", diag(&nodes));
    assert!(to_busy.iter().all(|(ok, _)| *ok));
    if owing_ack {
        // The delayed acknowledgement left from the helper's service, before
        // rank 0's retransmission timer (rto_initial, 20 ms) could fire.
        let (_, at) = to_busy[0];
        assert!(
            at < busy_from + Duration::from_millis(20),
            "owed acknowledgement came only at {at:?} (busy from {busy_from:?})"
        );
    }
    // Rank 2 was declared lost by rank 0, on time, and nothing else went
    // wrong anywhere.
    let all_errors: Vec<(usize, ErrorEvent, Duration)> = errs
        .iter()
        .enumerate()
        .flat_map(|(i, e)| {
            e.lock()
                .unwrap()
                .iter()
                .map(|(ev, at)| (i, ev.clone(), *at))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(all_errors.len(), 1, "{all_errors:?}");
    let (reporter, event, at) = &all_errors[0];
    assert_eq!(*reporter, 0);
    assert_eq!(event.endpoint, eps[0][DEAD], "{event:?}");
    assert!(!event.fatal);
    let waited = *at - first_to_dead;
    assert!(
        waited >= peer_timeout,
        "declared lost after only {waited:?}"
    );
    // 1 ms covers the rounding of the fabric's Duration into the
    // reliability state's Instant, as in reliable.rs.
    assert!(
        waited <= peer_timeout + rto_max + Duration::from_millis(1),
        "declared lost only after {waited:?}"
    );
    // Its sends failed, every other send of rank 0 was acknowledged.
    let to_dead = acked_by(DEAD);
    assert_eq!(to_dead.len(), others_per_peer);
    assert!(to_dead.iter().all(|(ok, _)| !*ok));
    assert_eq!(
        done.lock().unwrap().len(),
        per_peer + others_per_peer * (RANKS - 2),
        "{}",
        diag(&nodes)
    );
    // The others got everything, once, in order.
    for to in (1..RANKS).filter(|&to| to != BUSY && to != DEAD) {
        let got = stream_from(&inboxes[to], eps[to][0]);
        assert_eq!(got.len(), ROUNDS - first, "rank {to}");
        for (bytes, i) in got.iter().zip(first..) {
            assert!(*bytes == message(to, i), "rank {to}, message {i}");
        }
        assert_eq!(inboxes[to].lock().unwrap().len(), ROUNDS - first);
    }
    assert!(inboxes[DEAD].lock().unwrap().is_empty());

    // Rank 1 progresses again: everything arrives, once, in order.
    roles[BUSY] = Role::Active;
    let stop = drive_roles(&net, &mut nodes, &roles, Duration::from_secs(5), |_| {
        inboxes[BUSY].lock().unwrap().len() >= ROUNDS
    });
    assert_eq!(stop, Stop::Done, "{}", diag(&nodes));
    drive_roles(&net, &mut nodes, &roles, Duration::from_secs(5), |_| false);
    let got = stream_from(&inboxes[BUSY], eps[BUSY][0]);
    assert_eq!(got.len(), ROUNDS);
    for (i, bytes) in got.iter().enumerate() {
        assert!(*bytes == message(BUSY, i), "message {i} to rank 1");
    }
    assert_eq!(inboxes[BUSY].lock().unwrap().len(), ROUNDS);
    let errors_now: usize = errs.iter().map(|e| e.lock().unwrap().len()).sum();
    assert_eq!(errors_now, 1, "nothing went wrong after rank 1 resumed");
    assert_eq!(nodes[0].modules()[0].unacknowledged(), 0);
}

#[test]
fn a_busy_rank_is_spared_and_a_dead_one_reported_among_24() {
    fan_out(31, false);
}

#[test]
fn a_rank_busy_right_after_receiving_still_acknowledges() {
    fan_out(32, true);
}

/// A receiver with a tiny pool is busy while its sender has many messages
/// for it: its pool fills, it refuses the rest and grants no credit, but it
/// answers the sender's probes, so across 3 × peer_timeout nobody is
/// declared lost; once it progresses, everything arrives.
fn busy_with_a_full_pool(seed: u64, rd_num: u32) {
    const MESSAGES: usize = 150;
    let peer_timeout = peer_timeout_default();
    let net = SimNetwork::new(seed);
    net.set_default_link(LinkConfig {
        latency: Duration::from_micros(5),
        ..LinkConfig::default()
    })
    .unwrap();
    let receiver = BtlConfig {
        rd_num: Some(rd_num),
        ..config()
    };
    let mut nodes = vec![node(&net, "rx", &receiver), node(&net, "tx", &config())];
    let eps = mesh(&mut nodes);
    let got = inbox(&mut nodes[0], Tag::PML);
    let errs: Vec<Errors> = nodes.iter_mut().map(|n| errors(&net, n)).collect();
    let done = completions(&net, &mut nodes[1]);
    let eager = nodes[1].modules()[0].limits().eager_limit;
    let message = |i: usize| payload(1, 0, i, length(i, eager));
    let total: usize = (0..MESSAGES)
        .map(|i| datagrams(length(i, eager), eager))
        .sum();
    let roles = [Role::Busy, Role::Active];
    for i in 0..MESSAGES {
        nodes[1].modules_mut()[0]
            .send_message(eps[1][0].unwrap(), Tag::PML, &message(i))
            .unwrap();
    }
    // Rank 0 computes for 3 × peer_timeout; the receiver's transmissions
    // (acknowledgements, answers to probes) are sampled each peer_timeout.
    let tx = |nodes: &[Btl]| {
        nodes[0].modules()[0]
            .with_context(Context::stats)
            .tx_datagrams
    };
    let mut answers = vec![tx(&nodes)];
    for _ in 0..3 {
        let stop = drive_roles(&net, &mut nodes, &roles, peer_timeout, |_| false);
        assert_eq!(stop, Stop::Limit, "the sender keeps probing");
        answers.push(tx(&nodes));
    }
    let diag = |nodes: &[Btl]| diagnostics(&net, nodes);
    assert!(
        answers.windows(2).all(|w| w[1] > w[0]),
        "the busy receiver answered in every period: {answers:?}\n{}",
        diag(&nodes)
    );
    for e in &errs {
        assert!(e.lock().unwrap().is_empty(), "{:?}", e.lock().unwrap());
    }
    assert!(got.lock().unwrap().is_empty(), "no callback while busy");
    let acked = done.lock().unwrap().len();
    assert!(
        acked <= rd_num as usize,
        "{acked} acknowledged while busy, beyond the pool"
    );
    assert!(nodes[1].modules()[0].unacknowledged() > 0);
    // Rank 0 progresses again.
    let roles = [Role::Active, Role::Active];
    let stop = drive_roles(&net, &mut nodes, &roles, peer_timeout, |nodes| {
        got.lock().unwrap().len() == MESSAGES && nodes[1].modules()[0].unacknowledged() == 0
    });
    assert_eq!(stop, Stop::Done, "{}", diag(&nodes));
    drive_roles(&net, &mut nodes, &roles, Duration::from_secs(5), |_| false);
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), MESSAGES);
    for (i, (from, bytes)) in got.iter().enumerate() {
        assert_eq!(*from, eps[0][1]);
        assert!(*bytes == message(i), "message {i}");
    }
    let done = done.lock().unwrap();
    assert_eq!(done.len(), total);
    assert!(done.iter().all(|(ev, _)| ev.status.is_ok()));
    for e in &errs {
        assert!(e.lock().unwrap().is_empty(), "{:?}", e.lock().unwrap());
    }
}

#[test]
fn a_busy_receiver_with_a_full_pool_keeps_its_sender_alive() {
    busy_with_a_full_pool(41, 8);
}

#[test]
fn a_busy_receiver_with_a_two_buffer_pool_keeps_its_sender_alive() {
    busy_with_a_full_pool(42, 2);
}
