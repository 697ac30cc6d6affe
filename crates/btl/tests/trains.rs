//! Trains on the seeded `sim` fabric: a fragment prepared from the caller's
//! memory that is longer than one datagram (up to `frag_size`, what ob1
//! takes as the BTL's maximum send size) leaves as a train of datagrams and
//! arrives whole, once, in order with the messages around it, through loss,
//! duplication, reordering and corruption; its send completes once, after
//! the whole train is acknowledged; and the cars a train takes go back to
//! the free list whatever becomes of it (sent, freed unsent, or sent to a
//! peer that is lost). A send fragment from `alloc` longer than one datagram
//! (up to `eager_max`) is a bounce buffer that leaves the same way.
//!
//! Everything runs on virtual time.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Btl, Stop, completions, drive, inbox, mesh, node, payload, peer_timeout_default};

use udbtl_btl::*;
use udbtl_fabric::Context;
use udbtl_fabric::sim::{LinkConfig, SimNetwork};

/// The caller's bytes, lent as a C host lends its user buffer.
struct Lent(Vec<u8>);

impl LentBytes for Lent {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Bytes of the caller's header in front of each fragment, as ob1 reserves.
const RESERVE: usize = 24;

fn config() -> BtlConfig {
    BtlConfig {
        rd_num: Some(512),
        sd_num: Some(64),
        ..BtlConfig::default()
    }
}

/// Prepares `data` lent, behind a `RESERVE`-byte header naming `index`, and
/// sends it; `None` if the module refused to prepare it.
fn send_lent(btl: &mut Btl, ep: EndpointId, index: u8, data: Vec<u8>) -> Option<Descriptor> {
    let module = &mut btl.modules_mut()[0];
    let des = module
        .prepare_lent(
            Box::new(Lent(data)),
            NO_ORDER,
            RESERVE,
            DesFlags::BTL_OWNERSHIP,
        )
        .ok()?;
    module.segment_mut(des).unwrap().fill(index);
    module.send(ep, des, Tag::PML).unwrap();
    Some(des)
}

fn finalize_clean(nodes: Vec<Btl>) {
    for btl in nodes {
        for ctx in btl.finalize().unwrap() {
            assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
        }
    }
}

#[test]
fn fragments_longer_than_a_datagram_arrive_whole_in_order_through_faults() {
    let net = SimNetwork::new(27);
    net.set_default_link(LinkConfig {
        loss: 0.05,
        duplicate: 0.03,
        reorder: 0.05,
        reorder_delay: (Duration::from_micros(5), Duration::from_micros(200)),
        corrupt: 0.02,
        latency: Duration::from_micros(2),
        ..LinkConfig::default()
    })
    .unwrap();
    let mut nodes = vec![node(&net, "a", &config()), node(&net, "b", &config())];
    let eps = mesh(&mut nodes);
    let ab = eps[0][1].unwrap();
    let got = inbox(&mut nodes[1], Tag::PML);
    let done = completions(&net, &mut nodes[0]);
    let limits = nodes[0].modules()[0].limits();
    assert!(
        limits.frag_limit > 16 * limits.eager_limit,
        "a fragment spans many datagrams: {limits:?}"
    );
    // From one datagram's worth to the largest fragment, and small whole
    // messages between them, which must keep their place.
    let lens = [
        limits.eager_limit - RESERVE,
        limits.eager_limit - RESERVE + 1,
        3 * limits.eager_limit,
        limits.frag_limit - RESERVE,
        10_000,
    ];
    const ROUNDS: usize = 4;
    let mut expected = Vec::new();
    for (i, &len) in lens.iter().cycle().take(ROUNDS * lens.len()).enumerate() {
        let data = payload(0, 1, i, len);
        let index = i as u8;
        send_lent(&mut nodes[0], ab, index, data.clone()).expect("cars are free");
        expected.push([vec![index; RESERVE], data].concat());
        let small = payload(0, 1, 100 + i, 40);
        let des = nodes[0].modules_mut()[0]
            .alloc(NO_ORDER, small.len(), DesFlags::BTL_OWNERSHIP)
            .unwrap();
        nodes[0].modules_mut()[0]
            .segment_mut(des)
            .unwrap()
            .copy_from_slice(&small);
        nodes[0].modules_mut()[0].send(ab, des, Tag::PML).unwrap();
        expected.push(small);
    }
    let stop = drive(&net, &mut nodes, Duration::from_secs(30), |n| {
        done.lock().unwrap().len() == expected.len() && n[0].modules()[0].unacknowledged() == 0
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    let got = got.lock().unwrap();
    assert_eq!(got.len(), expected.len(), "each delivered exactly once");
    for (i, ((_, bytes), want)) in got.iter().zip(&expected).enumerate() {
        assert!(
            bytes == want,
            "message {i} ({} bytes) in order and intact",
            want.len()
        );
    }
    let done = done.lock().unwrap();
    assert!(done.iter().all(|(ev, _)| ev.status.is_ok()), "{done:?}");
    let sender = nodes[0].modules()[0].stats();
    // The first length fits the head's datagram; the others are trains.
    let trains = (ROUNDS * (lens.len() - 1)) as u64;
    assert_eq!(sender.trains_sent, trains, "{sender:?}");
    assert!(sender.train_cars_sent >= ROUNDS as u64 * 32, "{sender:?}");
    let receiver = nodes[1].modules()[0].stats();
    assert_eq!(receiver.messages_reassembled, trains);
    assert!(receiver.recv_bad_checksum > 0, "corruption was caught");
    drop((got, done));
    finalize_clean(nodes);
}

#[test]
fn a_train_completes_once_after_its_last_datagram_is_acknowledged() {
    let net = SimNetwork::new(28);
    let mut nodes = vec![node(&net, "a", &config()), node(&net, "b", &config())];
    let eps = mesh(&mut nodes);
    let got = inbox(&mut nodes[1], Tag::PML);
    let done = completions(&net, &mut nodes[0]);
    let len = nodes[0].modules()[0].limits().frag_limit - RESERVE;
    let des = send_lent(&mut nodes[0], eps[0][1].unwrap(), 1, payload(0, 1, 0, len)).unwrap();
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |_| {
        !done.lock().unwrap().is_empty()
    });
    assert_eq!(stop, Stop::Done);
    assert_eq!(
        nodes[0].modules()[0].unacknowledged(),
        0,
        "nothing of the train is still unacknowledged when it completes"
    );
    assert_eq!(got.lock().unwrap().len(), 1);
    drive(&net, &mut nodes, Duration::from_millis(100), |_| false);
    let done = done.lock().unwrap();
    assert_eq!(done.len(), 1, "one completion for the whole train");
    assert_eq!(done[0].0.descriptor, des);
    drop(done);
    finalize_clean(nodes);
}

#[test]
fn a_train_freed_unsent_gives_its_cars_back() {
    let net = SimNetwork::new(29);
    let mut nodes = vec![node(&net, "a", &config())];
    let module = &mut nodes[0].modules_mut()[0];
    let len = module.limits().frag_limit - RESERVE;
    for _ in 0..3 {
        let des = module
            .prepare_lent(
                Box::new(Lent(vec![5; len])),
                NO_ORDER,
                RESERVE,
                DesFlags::NONE,
            )
            .map_err(|_| "refused")
            .unwrap();
        module.free(des).unwrap();
    }
    finalize_clean(nodes);
}

#[test]
fn a_module_short_of_cars_refuses_to_prepare_a_train_and_takes_none() {
    let net = SimNetwork::new(30);
    // Fragment lists grow by sd_num / 2: one chunk of eight, and no more.
    let tight = BtlConfig {
        sd_num: Some(16),
        user_frags_max: Some(8),
        ..config()
    };
    let mut nodes = vec![node(&net, "a", &tight), node(&net, "b", &tight)];
    let eps = mesh(&mut nodes);
    let got = inbox(&mut nodes[1], Tag::PML);
    let eager = nodes[0].modules()[0].limits().eager_limit;
    // Eight fragments hold a head and seven cars, not twenty datagrams.
    let long = payload(0, 1, 0, 20 * eager);
    assert!(send_lent(&mut nodes[0], eps[0][1].unwrap(), 0, long).is_none());
    // What it refused left every fragment free: a train of eight fits.
    let fits = payload(0, 1, 1, 8 * eager - RESERVE);
    send_lent(&mut nodes[0], eps[0][1].unwrap(), 1, fits.clone()).expect("eight fit");
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |n| {
        got.lock().unwrap().len() == 1 && n[0].modules()[0].unacknowledged() == 0
    });
    assert_eq!(stop, Stop::Done);
    assert!(got.lock().unwrap()[0].1 == [vec![1; RESERVE], fits].concat());
    finalize_clean(nodes);
}

#[test]
fn a_train_to_a_lost_peer_fails_once_and_leaks_nothing() {
    let net = SimNetwork::new(31);
    let mut nodes = vec![node(&net, "a", &config()), node(&net, "b", &config())];
    let eps = mesh(&mut nodes);
    let done = completions(&net, &mut nodes[0]);
    // b never runs again: nothing it would acknowledge arrives.
    let b = nodes.pop().unwrap();
    let len = nodes[0].modules()[0].limits().frag_limit - RESERVE;
    send_lent(&mut nodes[0], eps[0][1].unwrap(), 1, payload(0, 1, 0, len)).unwrap();
    let stop = drive(&net, &mut nodes, 3 * peer_timeout_default(), |_| {
        !done.lock().unwrap().is_empty()
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    drive(&net, &mut nodes, Duration::from_secs(1), |_| false);
    let done = done.lock().unwrap();
    assert_eq!(done.len(), 1, "one completion for the whole train");
    assert!(done[0].0.status.is_err(), "{:?}", done[0].0);
    drop(done);
    assert_eq!(nodes[0].modules()[0].unacknowledged(), 0);
    finalize_clean(nodes);
    drop(b);
}

#[test]
fn an_alloc_longer_than_a_datagram_is_a_bounce_buffer_that_leaves_as_a_train() {
    let net = SimNetwork::new(32);
    let mut nodes = vec![node(&net, "a", &config()), node(&net, "b", &config())];
    let eps = mesh(&mut nodes);
    let ab = eps[0][1].unwrap();
    let got = inbox(&mut nodes[1], Tag::PML);
    let limits = nodes[0].modules()[0].limits();
    assert!(limits.alloc_limit > 8 * limits.eager_limit, "{limits:?}");
    let module = &mut nodes[0].modules_mut()[0];
    assert!(
        module
            .alloc(NO_ORDER, limits.alloc_limit + 1, DesFlags::NONE)
            .is_none(),
        "no alloc past the alloc limit"
    );
    // Freed unsent: its buffer and cars come back (finalize checks).
    let unsent = module
        .alloc(NO_ORDER, limits.alloc_limit, DesFlags::NONE)
        .unwrap();
    module.free(unsent).unwrap();
    let mut expected = Vec::new();
    for (i, len) in [limits.alloc_limit, 3 * limits.eager_limit + 5, 100]
        .into_iter()
        .enumerate()
    {
        let data = payload(0, 1, i, len);
        let module = &mut nodes[0].modules_mut()[0];
        // The largest, then written shorter: the segment length says how
        // much of the buffer is the message.
        let des = module
            .alloc(NO_ORDER, limits.alloc_limit, DesFlags::BTL_OWNERSHIP)
            .unwrap();
        module.set_segment_len(des, len).unwrap();
        module.segment_mut(des).unwrap().copy_from_slice(&data);
        module.send(ab, des, Tag::PML).unwrap();
        expected.push(data);
    }
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |n| {
        got.lock().unwrap().len() == expected.len() && n[0].modules()[0].unacknowledged() == 0
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    let got = got.lock().unwrap();
    for (i, ((_, bytes), want)) in got.iter().zip(&expected).enumerate() {
        assert!(bytes == want, "message {i} ({} bytes) intact", want.len());
    }
    // The last fits one datagram: its spare cars went back unused.
    assert_eq!(nodes[0].modules()[0].stats().trains_sent, 2);
    drop(got);
    finalize_clean(nodes);
}

#[test]
fn a_burst_of_trains_to_one_peer_leaves_in_threes_and_to_several_as_sent() {
    let net = SimNetwork::new(33);
    let mut nodes = vec![
        node(&net, "a", &config()),
        node(&net, "b", &config()),
        node(&net, "c", &config()),
    ];
    let eps = mesh(&mut nodes);
    let (to_b, to_c) = (eps[0][1].unwrap(), eps[0][2].unwrap());
    let got_b = inbox(&mut nodes[1], Tag::PML);
    let got_c = inbox(&mut nodes[2], Tag::PML);
    let done = completions(&net, &mut nodes[0]);
    // Two datagrams each, as 32 KiB is at MTU 1500.
    let len = nodes[0].modules()[0].limits().eager_limit + 100;
    let posted = |nodes: &[Btl]| nodes[0].modules()[0].stats().sends_posted;
    let mut sent = 0;
    let mut expected = [Vec::new(), Vec::new()];
    let mut send = |nodes: &mut [Btl], ep| {
        let data = payload(0, 1, sent.into(), len);
        expected[usize::from(ep == to_c)].push([vec![sent; RESERVE], data.clone()].concat());
        send_lent(&mut nodes[0], ep, sent, data).expect("cars are free");
        sent += 1;
    };
    // A train to each first, so that each peer has granted its credit.
    send(&mut nodes, to_b);
    send(&mut nodes, to_c);
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |n| {
        done.lock().unwrap().len() == 2 && n[0].modules()[0].unacknowledged() == 0
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    nodes[0].progress();
    let start = posted(&nodes);
    // The first leaves at once; the next two wait, each following one to
    // the same peer; the fourth releases three trains together.
    for want in [2, 2, 2, 8, 8, 8] {
        send(&mut nodes, to_b);
        assert_eq!(posted(&nodes) - start, want, "after train {}", sent - 1);
    }
    // A send to another peer releases what waits first, though it is
    // itself a small message held open for the next progress call.
    let des = nodes[0].modules_mut()[0]
        .alloc(NO_ORDER, 40, DesFlags::BTL_OWNERSHIP)
        .unwrap();
    nodes[0].modules_mut()[0].send(to_c, des, Tag::PML).unwrap();
    assert_eq!(posted(&nodes) - start, 12, "after the small message");
    // Alternating peers: every train leaves as it is sent.
    for i in 0..4 {
        send(&mut nodes, if i % 2 == 0 { to_b } else { to_c });
        assert_eq!(posted(&nodes) - start, 12 + 2 * (i + 1) + 1, "train {i}");
    }
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |n| {
        done.lock().unwrap().len() == 13 && n[0].modules()[0].unacknowledged() == 0
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    assert!(done.lock().unwrap().iter().all(|(ev, _)| ev.status.is_ok()));
    // Every train arrived once, whole and in order, and the small message
    // after the three to c's first.
    let small = got_c.lock().unwrap().remove(1);
    assert_eq!(small.1.len(), 40);
    for (got, expected) in [got_b, got_c].iter().zip(expected) {
        let got: Vec<_> = got.lock().unwrap().iter().map(|(_, b)| b.clone()).collect();
        assert!(
            got == expected,
            "{} trains in order and intact",
            expected.len()
        );
    }
    drop(done);
    finalize_clean(nodes);
}
