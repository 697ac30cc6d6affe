//! Coalescing (the `coalesce` parameter): small messages to one peer that
//! wait behind a full window ride in the datagram of the one before them.
//! Whatever is packed, every message arrives once, in order, with its tag
//! and bytes, and every send callback runs once, in order, with the
//! datagram's fate: on `sim` (lossless, and with loss, duplication and
//! reordering), for a host that runs its own callbacks (`poll`,
//! `next_event`, `finish`), over real `udp` on loopback, and for a peer
//! lost while riders wait.

#![allow(clippy::unwrap_used, unsafe_code)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Btl, Stop, drive, errors, mesh, node};

use udbtl_btl::*;
use udbtl_fabric::sim::{LinkConfig, SimNetwork};
use udbtl_fabric::{Context, PortState, Provider};

/// The tags the messages cycle through.
const TAGS: [Tag; 3] = [Tag::PML, Tag(Tag::PML.0 + 1), Tag(Tag::PML.0 + 7)];

/// What a receiver heard, in order: tag, sender, bytes.
type Heard = Arc<Mutex<Vec<(Tag, Option<EndpointId>, Vec<u8>)>>>;
/// Send completions, in order: context (the message's index), status.
type Done = Arc<Mutex<Vec<(u64, Result<(), SendFailure>)>>>;

fn config(coalesce: bool) -> BtlConfig {
    BtlConfig {
        rd_num: Some(512),
        sd_num: Some(64),
        coalesce: Some(coalesce),
        ..BtlConfig::default()
    }
}

/// Message `i`: its tag and bytes (0 to 96 of them, every byte depending on
/// `i`, so that a misplaced or mixed-up message cannot pass for another).
fn message(i: usize) -> (Tag, Vec<u8>) {
    let len = i * 7 % 97;
    let bytes = (0..len).map(|k| (k * 31 + i * 7 + i / 251) as u8).collect();
    (TAGS[i % TAGS.len()], bytes)
}

fn listen<P: Provider>(btl: &mut Component<P>) -> Heard {
    let heard: Heard = Arc::default();
    for tag in TAGS {
        let sink = heard.clone();
        btl.modules_mut()[0].register(
            tag,
            Box::new(move |ev: &RecvEvent<'_>| {
                sink.lock()
                    .unwrap()
                    .push((ev.tag, ev.endpoint, ev.payload.to_vec()))
            }),
        );
    }
    heard
}

fn completions<P: Provider>(btl: &mut Component<P>) -> Done {
    let done: Done = Arc::default();
    let sink = done.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push((ev.context, ev.status.clone()))
    }));
    done
}

/// Sends message `i` from `btl` to `ep` in a BTL-owned descriptor whose
/// context is `i`; `None` when no fragment is free.
fn try_send<P: Provider>(btl: &mut Component<P>, ep: EndpointId, i: usize) -> Option<()> {
    let (tag, bytes) = message(i);
    let module = &mut btl.modules_mut()[0];
    let des = module.alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP)?;
    module.segment_mut(des).unwrap().copy_from_slice(&bytes);
    module.set_context(des, i as u64).unwrap();
    module.send(ep, des, tag).unwrap();
    Some(())
}

/// Every message arrived once, in order, intact, from `from`; every send
/// completed once, successfully, and in order if `ordered` (selective
/// acknowledgements complete later datagrams before a lost earlier one is
/// repaired, so under loss only a lossless run is in order; a datagram's
/// riders always complete right after it).
fn check_exactly_once(
    heard: &Heard,
    done: &Done,
    from: Option<EndpointId>,
    n: usize,
    ordered: bool,
) {
    let heard = heard.lock().unwrap();
    assert_eq!(heard.len(), n, "delivered exactly once");
    for (i, (tag, ep, bytes)) in heard.iter().enumerate() {
        let (want_tag, want) = message(i);
        assert_eq!((*tag, *ep), (want_tag, from), "message {i}");
        assert_eq!(bytes, &want, "message {i} in order and intact");
    }
    let done = done.lock().unwrap();
    assert_eq!(done.len(), n, "every send callback ran once");
    for (i, (context, status)) in done.iter().enumerate() {
        if ordered {
            assert_eq!(*context, i as u64, "send callbacks in order");
        }
        assert!(status.is_ok(), "message {i}: {status:?}");
    }
    let mut contexts: Vec<u64> = done.iter().map(|(c, _)| *c).collect();
    contexts.sort_unstable();
    assert!(
        contexts.iter().copied().eq(0..n as u64),
        "each exactly once"
    );
}

/// Sends `n` messages from a to b on `net`, in bursts far larger than the
/// window, and drives until every send completed. Returns both nodes.
fn burst_on_sim(
    net: &SimNetwork,
    coalesce: bool,
    n: usize,
    lossless: bool,
) -> (Vec<Btl>, Heard, Done) {
    let mut nodes = vec![
        node(net, "a", &config(coalesce)),
        node(net, "b", &config(coalesce)),
    ];
    let eps = mesh(&mut nodes);
    let heard = listen(&mut nodes[1]);
    let done = completions(&mut nodes[0]);
    let ab = eps[0][1].unwrap();
    let mut i = 0;
    while i < n {
        if try_send(&mut nodes[0], ab, i).is_some() {
            i += 1;
            continue;
        }
        let stop = drive(net, &mut nodes, Duration::from_millis(1), |_| false);
        assert_ne!(stop, Stop::Idle, "no fragment can ever come free");
    }
    let stop = drive(net, &mut nodes, Duration::from_secs(60), |_| {
        done.lock().unwrap().len() == n
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    check_exactly_once(&heard, &done, eps[1][0], n, lossless);
    (nodes, heard, done)
}

fn finalize_clean(nodes: Vec<Btl>) {
    for n in nodes {
        for ctx in n.finalize().unwrap() {
            assert!(ctx.resources().is_empty());
        }
    }
}

#[test]
fn a_burst_is_coalesced_and_delivered_once_in_order() {
    let net = SimNetwork::new(21);
    let n = 3000;
    let (nodes, _, _) = burst_on_sim(&net, true, n, true);
    let a = nodes[0].modules()[0].stats();
    let b = nodes[1].modules()[0].stats();
    assert!(a.messages_coalesced > 0, "{a:?}");
    // Lossless: each message went in its own datagram or rode in another.
    assert_eq!(a.sends_posted + a.messages_coalesced, n as u64, "{a:?}");
    assert_eq!(b.recvs_delivered, n as u64);
    assert_eq!(b.recv_malformed, 0);
    assert!(
        nodes[0].modules()[0]
            .to_string()
            .contains("messages coalesced")
    );
    finalize_clean(nodes);
}

#[test]
fn coalesced_bursts_survive_loss_duplication_and_reordering() {
    for seed in [22, 23] {
        let net = SimNetwork::new(seed);
        net.set_default_link(LinkConfig {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            reorder_delay: (Duration::from_micros(5), Duration::from_micros(200)),
            latency: Duration::from_micros(2),
            ..LinkConfig::default()
        })
        .unwrap();
        let (nodes, _, _) = burst_on_sim(&net, true, 2000, false);
        let a = nodes[0].modules()[0].stats();
        assert!(a.messages_coalesced > 0, "{a:?}");
        assert_eq!(nodes[1].modules()[0].stats().recvs_delivered, 2000);
        finalize_clean(nodes);
    }
}

#[test]
fn coalesce_off_sends_every_message_in_its_own_datagram() {
    let net = SimNetwork::new(21);
    let n = 3000;
    let (nodes, _, _) = burst_on_sim(&net, false, n, true);
    let a = nodes[0].modules()[0].stats();
    assert_eq!(a.messages_coalesced, 0);
    assert_eq!(a.sends_posted, n as u64);
    finalize_clean(nodes);
}

#[test]
fn riders_of_a_lost_peer_fail_once_each_in_order() {
    let net = SimNetwork::new(24);
    let mut nodes = vec![
        node(&net, "a", &config(true)),
        node(&net, "c", &config(true)),
    ];
    let eps = mesh(&mut nodes);
    let to_c = eps[0][1].unwrap();
    let done = completions(&mut nodes[0]);
    let errors = errors(&net, &mut nodes[0]);
    let c_port = nodes[1].modules()[0]
        .with_context(|c| c.port_id(1))
        .unwrap();
    net.set_port_state(c_port, PortState::Down).unwrap();
    let n = 400;
    for i in 0..n {
        try_send(&mut nodes[0], to_c, i).unwrap();
    }
    let coalesced = nodes[0].modules()[0].stats().messages_coalesced;
    assert!(coalesced > 0, "riders wait behind the window");
    assert_eq!(
        nodes[0].modules()[0].unacknowledged(),
        n,
        "riders count as unacknowledged"
    );
    let stop = drive(&net, &mut nodes, Duration::from_secs(120), |_| {
        done.lock().unwrap().len() >= n && !errors.lock().unwrap().is_empty()
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    // A little longer: nothing more may come.
    drive(&net, &mut nodes, Duration::from_secs(1), |_| false);
    let done = done.lock().unwrap();
    assert_eq!(done.len(), n, "every send callback ran exactly once");
    for (i, (context, status)) in done.iter().enumerate() {
        assert_eq!(*context, i as u64, "failures in order");
        assert!(
            matches!(status, Err(SendFailure::PeerLost(_))),
            "message {i}: {status:?}"
        );
    }
    let a = nodes[0].modules()[0].stats();
    assert_eq!(a.send_errors, n as u64);
    assert_eq!(nodes[0].modules()[0].unacknowledged(), 0);
    drop(done);
    finalize_clean(nodes);
}

#[test]
fn a_host_gets_each_coalesced_message_as_its_own_event() {
    let net = SimNetwork::new(25);
    let mut nodes = vec![
        node(&net, "a", &config(true)),
        node(&net, "b", &config(true)),
    ];
    let eps = mesh(&mut nodes);
    let done = completions(&mut nodes[0]);
    let ab = eps[0][1].unwrap();
    let n = 1000;
    for i in 0..n {
        try_send(&mut nodes[0], ab, i).unwrap();
    }
    assert!(nodes[0].modules()[0].stats().messages_coalesced > 0);
    let mut heard = Vec::new();
    // Events are finished late, a batch at a time, as a host may: a shared
    // buffer must stay put until its last message is finished.
    let mut unfinished = Vec::new();
    for _ in 0..1_000_000 {
        if done.lock().unwrap().len() == n && heard.len() == n {
            break;
        }
        nodes[0].progress();
        let host = &mut nodes[1].modules_mut()[0];
        host.poll();
        while let Some(event) = host.next_event() {
            if let HostEvent::Received(received) = &event {
                // SAFETY: the payload stays valid until `finish`.
                let payload = unsafe {
                    std::slice::from_raw_parts(received.payload_ptr(), received.payload_len())
                };
                heard.push((received.tag, received.endpoint, payload.to_vec()));
                unfinished.push((heard.len() - 1, event));
                if unfinished.len() == 7 {
                    // The held bytes are unchanged until given back.
                    for (index, ev) in unfinished.drain(..) {
                        if let HostEvent::Received(r) = &ev {
                            // SAFETY: as above, not finished yet.
                            let payload = unsafe {
                                std::slice::from_raw_parts(r.payload_ptr(), r.payload_len())
                            };
                            assert_eq!(payload, heard[index].2.as_slice(), "message {index}");
                        }
                        host.finish(ev);
                    }
                }
            } else {
                host.finish(event);
            }
        }
        if let Some(at) = [nodes[0].next_deadline(), nodes[1].next_deadline()]
            .into_iter()
            .flatten()
            .chain(net.next_arrival())
            .min()
            .filter(|&at| at > net.now())
        {
            net.advance_to(at);
        }
    }
    for (_, ev) in unfinished.drain(..) {
        nodes[1].modules_mut()[0].finish(ev);
    }
    assert_eq!(heard.len(), n);
    for (i, (tag, ep, bytes)) in heard.iter().enumerate() {
        let (want_tag, want) = message(i);
        assert_eq!((*tag, *ep), (want_tag, eps[1][0]), "message {i}");
        assert_eq!(bytes, &want, "message {i}");
    }
    let b = nodes[1].modules()[0].stats();
    assert_eq!(b.recvs_delivered, n as u64);
    finalize_clean(nodes);
}

#[test]
fn a_burst_over_udp_loopback_is_coalesced_and_delivered_once_in_order() {
    use udbtl_fabric::udp::UdpProvider;
    let component = |coalesce: bool| {
        let params = Params::load_from(
            &BtlConfig {
                rd_num: Some(512),
                sd_num: Some(64),
                coalesce: Some(coalesce),
                ..BtlConfig::default()
            },
            |_| None,
        )
        .unwrap();
        Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
    };
    for coalesce in [true, false] {
        let mut a = component(coalesce);
        let mut b = component(coalesce);
        let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
        let ba = b.add_procs(&[Some(&a.modex())]).unwrap()[0].endpoints[0].unwrap();
        let heard = listen(&mut b);
        let done = completions(&mut a);
        let n = 5000;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut i = 0;
        while done.lock().unwrap().len() < n {
            assert!(std::time::Instant::now() < deadline, "timed out");
            while i < n && try_send(&mut a, ab, i).is_some() {
                i += 1;
            }
            a.progress();
            b.progress();
        }
        check_exactly_once(&heard, &done, Some(ba), n, true);
        let stats = a.modules()[0].stats();
        if coalesce {
            assert!(stats.messages_coalesced > 0, "{stats:?}");
        } else {
            assert_eq!(stats.messages_coalesced, 0);
        }
        a.finalize().unwrap();
        b.finalize().unwrap();
    }
}

/// With checksums off, bits flipped in coalesced datagrams reach the
/// receiver: record lists that no longer parse are counted as malformed
/// and dropped whole, and nothing panics (the bytes of lists that still
/// parse may be wrong: that is what the checksum is for).
#[test]
fn corrupt_record_lists_are_counted_and_dropped_never_a_panic() {
    let net = SimNetwork::new(26);
    net.set_default_link(LinkConfig {
        corrupt: 0.3,
        latency: Duration::from_micros(2),
        ..LinkConfig::default()
    })
    .unwrap();
    let config = BtlConfig {
        checksum: Some("off".into()),
        ..config(true)
    };
    let mut nodes = vec![node(&net, "a", &config), node(&net, "b", &config)];
    let eps = mesh(&mut nodes);
    let _heard = listen(&mut nodes[1]);
    let ab = eps[0][1].unwrap();
    // Many bursts of tiny messages ahead of the window: many coalesced
    // datagrams, mostly record headers.
    for round in 0..40 {
        for i in 0..100 {
            let module = &mut nodes[0].modules_mut()[0];
            match module.alloc(NO_ORDER, i % 4, DesFlags::BTL_OWNERSHIP) {
                Some(des) => {
                    module.segment_mut(des).unwrap().fill(round as u8);
                    module.send(ab, des, TAGS[i % TAGS.len()]).unwrap();
                }
                None => {
                    drive(&net, &mut nodes, Duration::from_millis(1), |_| false);
                }
            }
        }
        drive(&net, &mut nodes, Duration::from_millis(20), |_| false);
    }
    drive(&net, &mut nodes, Duration::from_secs(5), |_| false);
    assert!(nodes[0].modules()[0].stats().messages_coalesced > 0);
    let b = nodes[1].modules()[0].stats();
    // The counter also takes datagrams whose headers were hit; the seeded
    // run is reproducible, and two of its record lists were among them
    // (checked when this test was written).
    assert!(b.recv_malformed > 0, "{b:?}");
}

/// Sends posted so far by a's module, and messages that rode in another's
/// datagram.
fn posted_and_coalesced(btl: &Btl) -> (u64, u64) {
    let stats = btl.modules()[0].stats();
    (stats.sends_posted, stats.messages_coalesced)
}

#[test]
fn a_send_after_progress_leaves_at_once_and_a_burst_waits_for_the_next_progress() {
    let net = SimNetwork::new(27);
    let mut nodes = vec![
        node(&net, "a", &config(true)),
        node(&net, "b", &config(true)),
    ];
    let eps = mesh(&mut nodes);
    let heard = listen(&mut nodes[1]);
    let done = completions(&mut nodes[0]);
    let ab = eps[0][1].unwrap();
    nodes[0].progress();
    let before = posted_and_coalesced(&nodes[0]);
    // The first send since progress: on the wire before send returns.
    try_send(&mut nodes[0], ab, 0).unwrap();
    assert_eq!(posted_and_coalesced(&nodes[0]), (before.0 + 1, before.1));
    // The rest of the burst: held back, the later ones riding in the first.
    for i in 1..=5 {
        try_send(&mut nodes[0], ab, i).unwrap();
    }
    assert_eq!(
        posted_and_coalesced(&nodes[0]),
        (before.0 + 1, before.1 + 4)
    );
    assert_eq!(
        nodes[0].modules()[0].unacknowledged(),
        6,
        "held back counts"
    );
    // The next progress call sends them, in one datagram.
    nodes[0].progress();
    assert_eq!(
        posted_and_coalesced(&nodes[0]),
        (before.0 + 2, before.1 + 4)
    );
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |_| {
        done.lock().unwrap().len() == 6
    });
    assert_eq!(stop, Stop::Done);
    check_exactly_once(&heard, &done, eps[1][0], 6, true);
    finalize_clean(nodes);
}

#[test]
fn a_burst_to_several_peers_keeps_each_peers_order() {
    let net = SimNetwork::new(28);
    let mut nodes = vec![
        node(&net, "a", &config(true)),
        node(&net, "b", &config(true)),
        node(&net, "c", &config(true)),
    ];
    let eps = mesh(&mut nodes);
    let at_b = listen(&mut nodes[1]);
    let at_c = listen(&mut nodes[2]);
    let done = completions(&mut nodes[0]);
    let (to_b, to_c) = (eps[0][1].unwrap(), eps[0][2].unwrap());
    // Messages 0..n to each peer, in bursts whose runs to one peer are 1 to
    // 4 long, so that the held-back datagram changes peer often.
    let n = 300;
    let (mut next_b, mut next_c) = (0, 0);
    let mut run = 0;
    while next_b < n || next_c < n {
        let to_b_now = next_c >= n || (next_b < n && (run / 3) % 2 == 0);
        run += 1;
        let sent = if to_b_now {
            try_send(&mut nodes[0], to_b, next_b).map(|()| next_b += 1)
        } else {
            try_send(&mut nodes[0], to_c, next_c).map(|()| next_c += 1)
        };
        if sent.is_none() || run % 17 == 0 {
            drive(&net, &mut nodes, Duration::from_micros(50), |_| false);
        }
    }
    let stop = drive(&net, &mut nodes, Duration::from_secs(30), |_| {
        done.lock().unwrap().len() == 2 * n
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    assert!(nodes[0].modules()[0].stats().messages_coalesced > 0);
    for (heard, from) in [(&at_b, eps[1][0]), (&at_c, eps[2][0])] {
        let heard = heard.lock().unwrap();
        assert_eq!(heard.len(), n);
        for (i, (tag, ep, bytes)) in heard.iter().enumerate() {
            let (want_tag, want) = message(i);
            assert_eq!((*tag, *ep), (want_tag, from), "message {i}");
            assert_eq!(bytes, &want, "message {i} in order and intact");
        }
    }
    finalize_clean(nodes);
}

/// Sends a message too long for another to ride with it (more than half
/// the eager limit) from `btl` to `ep`, context `i`.
fn send_long<P: Provider>(btl: &mut Component<P>, ep: EndpointId, i: usize) {
    let module = &mut btl.modules_mut()[0];
    let len = module.limits().eager_limit / 2 + 1;
    let des = module
        .alloc(NO_ORDER, len, DesFlags::BTL_OWNERSHIP)
        .unwrap();
    module.segment_mut(des).unwrap().fill(i as u8);
    module.set_context(des, i as u64).unwrap();
    module.send(ep, des, Tag::PML).unwrap();
}

#[test]
fn a_burst_to_one_peer_leaves_in_threes_and_to_several_as_sent() {
    let net = SimNetwork::new(29);
    let mut nodes = vec![
        node(&net, "a", &config(true)),
        node(&net, "b", &config(true)),
        node(&net, "c", &config(true)),
    ];
    let eps = mesh(&mut nodes);
    let done = completions(&mut nodes[0]);
    let (to_b, to_c) = (eps[0][1].unwrap(), eps[0][2].unwrap());
    let posted = |nodes: &[Btl]| posted_and_coalesced(&nodes[0]).0;
    nodes[0].progress();
    let start = posted(&nodes);
    // The first leaves at once; the second is held open; the next two
    // close one each, which waits for the next to the same peer; the
    // fifth releases three, to share a send.
    let expected = [1, 1, 1, 1, 4, 4];
    for (i, want) in expected.iter().enumerate() {
        send_long(&mut nodes[0], to_b, i);
        assert_eq!(posted(&nodes) - start, *want, "after send {i}");
    }
    // The rest leave with the next progress calls, as the window allows.
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |_| {
        done.lock().unwrap().len() == 6
    });
    assert_eq!(stop, Stop::Done);
    assert_eq!(posted(&nodes) - start, 6);
    // Alternating peers: each closed carrier leaves as the next is sent.
    nodes[0].progress();
    let start = posted(&nodes);
    for i in 0..6 {
        send_long(&mut nodes[0], if i % 2 == 0 { to_b } else { to_c }, 6 + i);
        assert_eq!(posted(&nodes) - start, i.max(1) as u64, "after send {i}");
    }
    let stop = drive(&net, &mut nodes, Duration::from_secs(5), |_| {
        done.lock().unwrap().len() == 12
    });
    assert_eq!(stop, Stop::Done);
    assert!(
        done.lock()
            .unwrap()
            .iter()
            .all(|(_, status)| status.is_ok())
    );
    finalize_clean(nodes);
}
