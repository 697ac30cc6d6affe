//! Unreachable and foreign peers, error completions, deleting a peer,
//! finalize, the dump, the error callback and thread safety.

use super::*;

#[test]
fn unreachable_peers_are_marked_not_fatal() {
    let net = SimNetwork::new(9);
    let mut a = Component::init(host(&net, "a", |s| s), params(small())).unwrap();
    let b = Component::init(host(&net, "b", |s| s), params(small())).unwrap();
    let other_net =
        Component::init(host(&net, "c", |s| s.with_network(7)), params(small())).unwrap();
    let (mb, mc) = (b.modex(), other_net.modex());
    let garbage = [0xde, 0xad];
    let result = a
        .add_procs(&[Some(&mb), None, Some(&garbage), Some(&mc)])
        .unwrap();
    assert_eq!(result[0].reachable, [true, false, false, false]);
    assert!(
        result[0].endpoints[0].is_some() && result[0].endpoints[1..].iter().all(Option::is_none)
    );
    finalize_clean(a);
    finalize_clean(b);
    finalize_clean(other_net);
}

#[test]
fn modules_pair_with_addresses_by_network_not_index() {
    let net = SimNetwork::new(10);
    let two_nets = |name: &str| {
        let p = net.provider();
        p.add_device(SimDeviceSpec::new(&format!("{name}0"), 1).with_network(1))
            .unwrap();
        p.add_device(SimDeviceSpec::new(&format!("{name}1"), 1).with_network(2))
            .unwrap();
        p
    };
    let mut a = Component::init(two_nets("a"), params(small())).unwrap();
    // b publishes its network-2 port first: pairing by index would cross them.
    let b = Component::init(two_nets("b"), params(small())).unwrap();
    let mut addrs = udbtl_wire::modex::parse_blob(&b.modex()).unwrap();
    addrs.reverse();
    let blob = udbtl_wire::modex::emit_blob(&addrs).unwrap();
    let result = a.add_procs(&[Some(&blob)]).unwrap();
    for (module, added) in a.modules().iter().zip(&result) {
        let ep = added.endpoints[0].unwrap();
        let remote = module.endpoint_addr(ep).unwrap();
        let expected = addrs
            .iter()
            .find(|x| x.network == module.address().network)
            .unwrap();
        assert_eq!(remote.qpn, expected.qpns[0]);
    }
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn error_completion_does_not_drop_the_rest_of_the_batch() {
    let net = SimNetwork::new(11);
    // b posts receive buffers for 1 KiB payloads; a may send 4 KiB.
    let mut a = Component::init(host(&net, "a", |s| s), params(small())).unwrap();
    let mut b = Component::init(
        host(&net, "b", |s| s),
        params(BtlConfig {
            max_send_size: Some(1024),
            ..small()
        }),
    )
    .unwrap();
    let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
    let got = collect(&mut b, Tag::PML);
    send_bytes(&mut a, ab, Tag::PML, b"before", DesFlags::BTL_OWNERSHIP).unwrap();
    send_bytes(&mut a, ab, Tag::PML, &[1u8; 3000], DesFlags::BTL_OWNERSHIP).unwrap();
    send_bytes(&mut a, ab, Tag::PML, b"after", DesFlags::BTL_OWNERSHIP).unwrap();
    a.progress();
    assert_eq!(b.progress(), 3, "all three completions in one batch");
    let got = got.lock().unwrap();
    assert_eq!(
        got.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
        [b"before".to_vec(), b"after".to_vec()]
    );
    assert_eq!(b.modules()[0].stats().recv_errors, 1);
    drop(got);
    // Every buffer was reposted: 64 more datagrams still find one each.
    for i in 0..64u8 {
        send_bytes(&mut a, ab, Tag::PML, &[i], DesFlags::BTL_OWNERSHIP).unwrap();
        drive(&mut a, &mut b, 1);
    }
    assert_eq!(b.modules()[0].with_context(Context::stats).rx_no_buffer, 0);
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn foreign_job_keys_and_garbage_are_counted_drops() {
    let net = SimNetwork::new(12);
    let mut a = Component::init(
        host(&net, "a", |s| s),
        params(BtlConfig {
            job_key: Some(1),
            ..small()
        }),
    )
    .unwrap();
    let mut b = Component::init(
        host(&net, "b", |s| s),
        params(BtlConfig {
            job_key: Some(2),
            ..small()
        }),
    )
    .unwrap();
    let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
    let got = collect(&mut b, Tag::PML);
    send_bytes(&mut a, ab, Tag::PML, b"stale job", DesFlags::BTL_OWNERSHIP).unwrap();
    drive(&mut a, &mut b, 2);
    assert!(got.lock().unwrap().is_empty());
    assert_eq!(b.modules()[0].stats().recv_bad_job_key, 1);
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn deleting_a_peer_fails_its_pending_sends_through_the_callback() {
    let net = SimNetwork::new(13);
    let (mut a, b, ab, _) = pair(
        &net,
        BtlConfig {
            sd_num: Some(1),
            ..small()
        },
    );
    let done = sends(&mut a);
    for i in 0..5u8 {
        send_bytes(&mut a, ab, Tag::PML, &[i], DesFlags::BTL_OWNERSHIP).unwrap();
    }
    a.modules_mut()[0].del_procs(&[ab]).unwrap();
    let failed = done
        .lock()
        .unwrap()
        .iter()
        .filter(|ev| ev.status.is_err())
        .count();
    assert_eq!(failed, 4);
    let module = &mut a.modules_mut()[0];
    let des = module.alloc(NO_ORDER, 1, DesFlags::BTL_OWNERSHIP).unwrap();
    assert!(matches!(
        module.send(ab, des, Tag::PML),
        Err(BtlError::BadEndpoint { .. })
    ));
    module.free(des).unwrap();
    a.progress();
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn finalize_reports_leaked_descriptors_but_releases_everything() {
    let net = SimNetwork::new(14);
    let mut btl = Component::init(host(&net, "a", |s| s), params(small())).unwrap();
    let _forgotten = btl.modules_mut()[0]
        .alloc(NO_ORDER, 8, DesFlags::NONE)
        .unwrap();
    assert_eq!(btl.modules().len(), 1);
    let err = Component::finalize(btl).unwrap_err();
    assert!(err.to_string().contains("descriptor"), "{err}");
}

#[test]
fn dump_shows_counters_and_occupancy() {
    let net = SimNetwork::new(15);
    let (mut a, b, ab, _) = pair(&net, small());
    send_bytes(&mut a, ab, Tag::PML, b"x", DesFlags::BTL_OWNERSHIP).unwrap();
    let dump = a.modules()[0].to_string();
    for needle in [
        "send credits",
        "send frags",
        "user frags",
        "receive buffers",
        "posted 1",
        "registration cache",
    ] {
        assert!(dump.contains(needle), "{needle} missing from\n{dump}");
    }
    a.modules_mut()[0].ft_event(1);
    a.progress();
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn error_callback_stays_quiet_on_a_healthy_fabric() {
    let net = SimNetwork::new(16);
    let (mut a, b, _, _) = pair(&net, small());
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    a.modules_mut()[0].register_error(Box::new(move |ev: &ErrorEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    // Nothing fails on a healthy fabric.
    drive(
        &mut a,
        &mut Component::init(host(&net, "c", |s| s), params(small())).unwrap(),
        2,
    );
    assert!(errors.lock().unwrap().is_empty());
    finalize_clean(a);
    finalize_clean(b);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Receive buffers are sized from the parameters so that a datagram of
    /// the largest size any peer with the same parameters sends always fits.
    #[test]
    fn receive_buffers_hold_the_largest_send(max_send in 64usize..=9000, mtu in 64usize..=9000) {
        let net = SimNetwork::new(max_send as u64);
        let config = BtlConfig { max_send_size: Some(max_send), rd_num: Some(8), sd_num: Some(4), reliable: Some(false), ..BtlConfig::default() };
        let spec = |s: SimDeviceSpec| s.with_max_msg_size(mtu);
        let mut a = Component::init(host(&net, "a", spec), params(config.clone())).unwrap();
        let mut b = Component::init(host(&net, "b", spec), params(config)).unwrap();
        let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
        let eager = a.modules()[0].limits().eager_limit;
        let stride = a.modules()[0].limits().recv_buffer_len;
        prop_assert_eq!(stride, recv_buffer_len(8 + eager));
        prop_assert!(stride >= udbtl_fabric::GRH_LEN + 8 + eager);
        let got = collect(&mut b, Tag::PML);
        let payload: Vec<u8> = (0..eager).map(|i| i as u8).collect();
        send_bytes(&mut a, ab, Tag::PML, &payload, DesFlags::BTL_OWNERSHIP).unwrap();
        drive(&mut a, &mut b, 2);
        prop_assert_eq!(b.modules()[0].stats().recv_errors, 0);
        prop_assert_eq!(&got.lock().unwrap()[0].1, &payload);
        finalize_clean(a);
        finalize_clean(b);
    }
}

#[allow(dead_code)]
fn assert_send<T: Send>() {}
#[allow(dead_code)]
fn modules_are_send() {
    assert_send::<Module<SimContext>>();
}

#[test]
fn receive_callbacks_get_the_endpoint_context_back() {
    let net = SimNetwork::new(18);
    let (mut a, mut b, ab, ba) = pair(&net, small());
    b.modules_mut()[0].set_endpoint_context(ba, 42).unwrap();
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let sink = seen.clone();
    b.modules_mut()[0].register(
        Tag::PML,
        Box::new(move |ev: &RecvEvent<'_>| sink.lock().unwrap().push(ev.endpoint_context)),
    );
    send_bytes(&mut a, ab, Tag::PML, b"x", DesFlags::BTL_OWNERSHIP).unwrap();
    drive(&mut a, &mut b, 4);
    assert_eq!(*seen.lock().unwrap(), [Some(42)]);
    b.modules_mut()[0].del_procs(&[ba]).unwrap();
    assert!(matches!(
        b.modules_mut()[0].set_endpoint_context(ba, 1),
        Err(BtlError::BadEndpoint { .. })
    ));
    finalize_clean(a);
    finalize_clean(b);
}
