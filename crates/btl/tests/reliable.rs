//! The reliable BTL on the seeded `sim` fabric: exactly-once, in-order,
//! intact delivery through loss, duplication, reordering and corruption;
//! multi-datagram messages; completion meaning "acknowledged"; and peer
//! failure reported on time, without touching other peers.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use udbtl_btl::*;
use udbtl_fabric::Context;
use udbtl_fabric::sim::{LinkConfig, SimDeviceSpec, SimNetwork, SimProvider};

type Btl = Component<SimProvider>;
type Inbox = Arc<Mutex<Vec<(Option<EndpointId>, Vec<u8>)>>>;

fn config() -> BtlConfig {
    BtlConfig {
        rd_num: Some(512),
        sd_num: Some(64),
        ..BtlConfig::default()
    }
}

fn node(net: &SimNetwork, name: &str, config: BtlConfig) -> Btl {
    let provider = net.provider();
    provider
        .add_device(SimDeviceSpec::new(name, 1).with_max_msg_size(2048))
        .unwrap();
    let params = Params::load_from(&config, |_| None).unwrap();
    Component::init(provider, params).unwrap()
}

/// Connects every node to every other; `eps[i][j]` is i's endpoint for j.
fn mesh(nodes: &mut [Btl]) -> Vec<Vec<Option<EndpointId>>> {
    let blobs: Vec<Vec<u8>> = nodes.iter().map(Component::modex).collect();
    let views: Vec<Option<&[u8]>> = blobs.iter().map(|b| Some(b.as_slice())).collect();
    nodes
        .iter_mut()
        .map(|n| n.add_procs(&views).unwrap()[0].endpoints.clone())
        .collect()
}

fn inbox(btl: &mut Btl, tag: Tag) -> Inbox {
    let inbox: Inbox = Arc::default();
    let sink = inbox.clone();
    btl.modules_mut()[0].register(
        tag,
        Box::new(move |ev: &RecvEvent<'_>| {
            sink.lock()
                .unwrap()
                .push((ev.endpoint, ev.payload.to_vec()))
        }),
    );
    inbox
}

fn completions(btl: &mut Btl) -> Arc<Mutex<Vec<SendEvent>>> {
    let seen: Arc<Mutex<Vec<SendEvent>>> = Arc::default();
    let sink = seen.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    seen
}

fn message(from: usize, index: usize) -> Vec<u8> {
    let len = 1 + index * 37 % 1500;
    (0..len)
        .map(|i| (i * 31 + index * 7 + from) as u8)
        .collect()
}

/// Progresses every node, advancing virtual time to the next event when
/// nothing is ready, until `done` or `limit` virtual time.
fn drive(
    net: &SimNetwork,
    nodes: &mut [Btl],
    limit: Duration,
    mut done: impl FnMut(&[Btl]) -> bool,
) {
    let end = net.now() + limit;
    while !done(nodes) && net.now() < end {
        let handled: usize = nodes.iter_mut().map(Component::progress).sum();
        if handled == 0 {
            // Virtual time only moves when told: step to the next arrival, or
            // a little, so retransmission timers (real time) can fire too.
            match net.next_arrival() {
                Some(at) if at > net.now() => net.advance_to(at),
                Some(_) => {}
                None => {
                    net.advance(Duration::from_micros(200));
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }
}

fn lossy(net: &SimNetwork, loss: f64, duplicate: f64, reorder: f64, corrupt: f64) {
    net.set_default_link(LinkConfig {
        loss,
        duplicate,
        reorder,
        reorder_delay: (Duration::from_micros(5), Duration::from_micros(200)),
        corrupt,
        latency: Duration::from_micros(2),
        ..LinkConfig::default()
    })
    .unwrap();
}

fn exchange_under(loss: f64, duplicate: f64, reorder: f64, corrupt: f64, seed: u64) -> Vec<Btl> {
    let net = SimNetwork::new(seed);
    lossy(&net, loss, duplicate, reorder, corrupt);
    let mut nodes = vec![node(&net, "a", config()), node(&net, "b", config())];
    let eps = mesh(&mut nodes);
    let got = inbox(&mut nodes[1], Tag::PML);
    let done = completions(&mut nodes[0]);
    const N: usize = 600;
    for i in 0..N {
        let module = &mut nodes[0].modules_mut()[0];
        let bytes = message(0, i);
        let des = loop {
            if let Some(des) = module.alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP) {
                break des;
            }
            module.progress();
        };
        module.segment_mut(des).unwrap().copy_from_slice(&bytes);
        module.send(eps[0][1].unwrap(), des, Tag::PML).unwrap();
        if i % 8 == 0 {
            drive(&net, &mut nodes, Duration::from_micros(50), |_| false);
        }
    }
    drive(&net, &mut nodes, Duration::from_secs(30), |_| {
        done.lock().unwrap().len() == N
    });
    let got = got.lock().unwrap();
    assert_eq!(got.len(), N, "delivered exactly once");
    for (i, (from, bytes)) in got.iter().enumerate() {
        assert_eq!(*from, eps[1][0]);
        assert_eq!(bytes, &message(0, i), "message {i} in order and intact");
    }
    let done = done.lock().unwrap();
    assert_eq!(done.len(), N, "every send completed once acknowledged");
    assert!(done.iter().all(|ev| ev.status.is_ok()));
    drop((got, done));
    nodes
}

#[test]
fn lossless_exchange_retransmits_nothing() {
    let nodes = exchange_under(0.0, 0.0, 0.0, 0.0, 1);
    assert_eq!(nodes[0].modules()[0].stats().sends_posted, 600);
}

#[test]
fn five_percent_loss_duplication_and_reordering() {
    let nodes = exchange_under(0.05, 0.05, 0.05, 0.0, 2);
    assert!(
        nodes[0].modules()[0].stats().sends_posted > 600,
        "losses were retransmitted"
    );
}

#[test]
fn corruption_is_caught_by_the_checksum() {
    let nodes = exchange_under(0.0, 0.0, 0.0, 0.02, 3);
    let dropped: u64 = nodes
        .iter()
        .map(|n| n.modules()[0].stats().recv_bad_checksum)
        .sum();
    assert!(
        dropped > 0,
        "corrupt datagrams are dropped, then retransmitted"
    );
}

#[test]
fn large_messages_are_reassembled_exactly_once() {
    let net = SimNetwork::new(4);
    lossy(&net, 0.05, 0.02, 0.05, 0.0);
    let mut nodes = vec![node(&net, "a", config()), node(&net, "b", config())];
    let eps = mesh(&mut nodes);
    let got = inbox(&mut nodes[1], Tag::USR);
    let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let small = b"after".to_vec();
    nodes[0].modules_mut()[0]
        .send_message(eps[0][1].unwrap(), Tag::USR, &big)
        .unwrap();
    nodes[0].modules_mut()[0]
        .send_message(eps[0][1].unwrap(), Tag::USR, &small)
        .unwrap();
    drive(&net, &mut nodes, Duration::from_secs(30), |_| {
        got.lock().unwrap().len() == 2
    });
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 2);
    assert!(got[0].1 == big, "1 MiB arrives whole and intact");
    assert_eq!(got[1].1, small);
    assert_eq!(nodes[1].modules()[0].stats().messages_reassembled, 1);
}

#[test]
fn a_silent_peer_fails_its_sends_and_spares_the_others() {
    let net = SimNetwork::new(5);
    let cfg = BtlConfig {
        peer_timeout: Some(300),
        ..config()
    };
    let mut nodes = vec![
        node(&net, "a", cfg.clone()),
        node(&net, "b", cfg.clone()),
        node(&net, "c", cfg),
    ];
    let eps = mesh(&mut nodes);
    let at_b = inbox(&mut nodes[1], Tag::PML);
    let done = completions(&mut nodes[0]);
    let errors: Arc<Mutex<Vec<ErrorEvent>>> = Arc::default();
    let sink = errors.clone();
    nodes[0].modules_mut()[0].register_error(Box::new(move |ev: &ErrorEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    // c's port goes down: nothing reaches it any more.
    let c_port = nodes[2].modules()[0].context().port_id(1).unwrap();
    net.set_port_state(c_port, udbtl_fabric::PortState::Down)
        .unwrap();
    let started = std::time::Instant::now();
    for i in 0..10 {
        for to in [1, 2] {
            let module = &mut nodes[0].modules_mut()[0];
            let des = module.alloc(NO_ORDER, 4, DesFlags::BTL_OWNERSHIP).unwrap();
            module
                .segment_mut(des)
                .unwrap()
                .copy_from_slice(&(i as u32).to_be_bytes());
            module.send(eps[0][to].unwrap(), des, Tag::PML).unwrap();
        }
    }
    drive(&net, &mut nodes, Duration::from_secs(10), |_| {
        done.lock().unwrap().len() == 20
    });
    let elapsed = started.elapsed();
    let done = done.lock().unwrap();
    assert_eq!(done.len(), 20);
    let (failed, ok): (Vec<&SendEvent>, Vec<&SendEvent>) =
        done.iter().partition(|ev| ev.status.is_err());
    assert_eq!(failed.len(), 10);
    assert!(failed.iter().all(|ev| ev.endpoint == eps[0][2].unwrap()));
    assert!(ok.iter().all(|ev| ev.endpoint == eps[0][1].unwrap()));
    assert_eq!(
        at_b.lock().unwrap().len(),
        10,
        "the healthy peer got everything"
    );
    assert!(
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|ev| !ev.fatal && ev.message.contains("lost"))
    );
    // 300 ms timeout; reported within the timeout plus one RTO (100 ms max).
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    let module = &mut nodes[0].modules_mut()[0];
    let des = module.alloc(NO_ORDER, 1, DesFlags::NONE).unwrap();
    assert!(matches!(
        module.send(eps[0][2].unwrap(), des, Tag::PML),
        Err(BtlError::PeerUnavailable { .. })
    ));
    module.free(des).unwrap();
}

#[test]
fn reliable_modules_finalize_without_leaks() {
    let net = SimNetwork::new(6);
    let mut nodes = vec![node(&net, "a", config()), node(&net, "b", config())];
    let eps = mesh(&mut nodes);
    nodes[0].modules_mut()[0]
        .send_message(eps[0][1].unwrap(), Tag::PML, &[7u8; 5000])
        .unwrap();
    drive(&net, &mut nodes, Duration::from_secs(5), |n| {
        n[0].modules()[0].unacknowledged() == 0
    });
    assert_eq!(nodes[0].modules()[0].unacknowledged(), 0);
    for btl in nodes {
        for ctx in btl.finalize().unwrap() {
            assert!(ctx.resources().is_empty());
        }
    }
}
