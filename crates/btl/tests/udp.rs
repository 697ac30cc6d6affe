//! What only the `udp` provider shows of the BTL: a post refused for an
//! address no UDP socket can have. The behaviour every real provider shares
//! (modex, tagged sends, zero-copy sends, the pending queue, two processes)
//! is the generic suite in `suite/`, run on `udp` and `verbs` by
//! `providers.rs`.

#![allow(clippy::unwrap_used)]

mod suite;

use std::sync::{Arc, Mutex};

use suite::{PING, params, unreliable};
use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

fn component(config: BtlConfig) -> Component<UdpProvider> {
    let params = params(&config);
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

#[test]
fn refused_posts_come_back_to_the_caller_or_the_callback() {
    let mut btl = component(unreliable());
    let peer = component(unreliable());
    // A peer address whose QP number is no UDP port: the provider refuses it
    // at post time, as verbs refuses a bad work request.
    let mut addrs = udbtl_wire::modex::parse_blob(&peer.modex()).unwrap();
    let good = btl.add_procs(&[Some(&peer.modex())]).unwrap()[0].endpoints[0].unwrap();
    addrs[0].qpns = [70_000; 4];
    let bad_blob = udbtl_wire::modex::emit_blob(&addrs).unwrap();
    let bad = btl.add_procs(&[Some(&bad_blob)]).unwrap()[0].endpoints[0].unwrap();
    let events: Arc<Mutex<Vec<SendEvent>>> = Arc::default();
    let sink = events.clone();
    let module = &mut btl.modules_mut()[0];
    module.set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));

    // Posted directly: the error is returned and the credit kept.
    let des = module.alloc(NO_ORDER, 4, DesFlags::NONE).unwrap();
    let err = module.send(bad, des, PING).unwrap_err();
    assert!(matches!(err, BtlError::Post { .. }), "{err}");
    assert_eq!(module.send_credits(), 1);
    // The descriptor is the caller's again: it can go elsewhere.
    assert_eq!(module.send(good, des, PING).unwrap(), SendStatus::Posted);

    // Posted from the pending list: the error reaches the callback.
    let queued = module.alloc(NO_ORDER, 4, DesFlags::BTL_OWNERSHIP).unwrap();
    assert_eq!(module.send(bad, queued, PING).unwrap(), SendStatus::Queued);
    for _ in 0..50 {
        btl.progress();
    }
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].descriptor, events[0].status.is_ok()),
        (des, true)
    );
    assert_eq!(
        (events[1].descriptor, events[1].status.is_err()),
        (queued, true)
    );
    assert_eq!(btl.modules()[0].send_credits(), 1, "no credit is lost");
    assert_eq!(btl.modules()[0].stats().send_errors, 1);
    drop(events);
    btl.modules_mut()[0].free(des).unwrap();
    btl.finalize().unwrap();
    peer.finalize().unwrap();
}

/// A peer whose port takes smaller datagrams (a 1500-byte host on a network
/// of jumbo frames): adding it lowers this module's payload limits, so that
/// every message fits the peer's receive buffers. Before, the larger
/// datagrams were dropped at the peer (too long for its buffers) and resent
/// until the peer was declared lost.
#[test]
fn a_peer_with_smaller_datagrams_gets_messages_that_fit() {
    let mut big = component(BtlConfig {
        udp_mtu: Some(8000),
        ..suite::reliable()
    });
    let mut small = component(BtlConfig {
        udp_mtu: Some(1400),
        ..suite::reliable()
    });
    let jumbo = big.modules()[0].limits().eager_limit;
    let to_small = big.add_procs(&[Some(&small.modex())]).unwrap()[0].endpoints[0].unwrap();
    small.add_procs(&[Some(&big.modex())]).unwrap();
    let fitted = big.modules()[0].limits().eager_limit;
    assert!(jumbo > 7000, "{jumbo}");
    assert_eq!(fitted, small.modules()[0].limits().eager_limit);

    let received: Arc<Mutex<Vec<usize>>> = Arc::default();
    let sink = received.clone();
    small.modules_mut()[0].register(
        PING,
        Box::new(move |ev: &RecvEvent<'_>| sink.lock().unwrap().push(ev.payload.len())),
    );
    const MESSAGES: usize = 20;
    for _ in 0..MESSAGES {
        let module = &mut big.modules_mut()[0];
        // The largest message the module offers now.
        let des = module
            .alloc(NO_ORDER, fitted, DesFlags::BTL_OWNERSHIP)
            .unwrap();
        module.send(to_small, des, PING).unwrap();
    }
    let started = std::time::Instant::now();
    while received.lock().unwrap().len() < MESSAGES {
        big.progress();
        small.progress();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "only {} of {MESSAGES} messages arrived; lost peers: {:?}",
            received.lock().unwrap().len(),
            big.modules()[0].reliability_stats().map(|s| s.peers_lost)
        );
    }
    assert!(received.lock().unwrap().iter().all(|&len| len == fitted));
    assert_eq!(
        small.modules()[0].with_context(|ctx| udbtl_fabric::Context::stats(ctx).rx_too_long),
        0,
        "no datagram was too long for the small peer"
    );
    while big.modules()[0].unacknowledged() > 0 {
        big.progress();
        small.progress();
    }
    big.finalize().unwrap();
    small.finalize().unwrap();
}
