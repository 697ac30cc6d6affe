//! The BTL's contract on the deterministic `sim` fabric: initialisation and
//! port selection, addressing, every fragment operation, the pending queue,
//! zero-copy sends through the registration cache, progress and teardown.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use udbtl_btl::params::{PortSelector, Source};
use udbtl_btl::*;
use udbtl_fabric::sim::{SimContext, SimDeviceSpec, SimNetwork, SimProvider};
use udbtl_fabric::{Context, PortState};

type Btl = Component<SimProvider>;

fn params(config: BtlConfig) -> Params {
    Params::load_from(&config, |_| None).unwrap()
}

/// The seed's contract: unreliable, small pools. The reliable path has its
/// own tests (`reliable.rs`).
fn small() -> BtlConfig {
    BtlConfig {
        rd_num: Some(64),
        sd_num: Some(16),
        reliable: Some(false),
        ..BtlConfig::default()
    }
}

/// One host with one single-port device.
fn host(
    net: &SimNetwork,
    name: &str,
    spec: impl FnOnce(SimDeviceSpec) -> SimDeviceSpec,
) -> SimProvider {
    let provider = net.provider();
    provider
        .add_device(spec(SimDeviceSpec::new(name, 1)))
        .unwrap();
    provider
}

/// Two components that know each other; returns them with the endpoint each
/// has for the other.
fn pair(net: &SimNetwork, config: BtlConfig) -> (Btl, Btl, EndpointId, EndpointId) {
    let mut a = Component::init(host(net, "simA", |s| s), params(config.clone())).unwrap();
    let mut b = Component::init(host(net, "simB", |s| s), params(config)).unwrap();
    let (ma, mb) = (a.modex(), b.modex());
    let ab = a.add_procs(&[Some(&mb)]).unwrap()[0].endpoints[0].unwrap();
    let ba = b.add_procs(&[Some(&ma)]).unwrap()[0].endpoints[0].unwrap();
    (a, b, ab, ba)
}

/// Receives on `tag` into a shared list.
type Received = Arc<Mutex<Vec<(Option<EndpointId>, Vec<u8>)>>>;

fn collect(btl: &mut Btl, tag: Tag) -> Received {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    btl.modules_mut()[0].register(
        tag,
        Box::new(move |ev: &RecvEvent<'_>| {
            sink.lock()
                .unwrap()
                .push((ev.endpoint, ev.payload.to_vec()))
        }),
    );
    seen
}

fn sends(btl: &mut Btl) -> Arc<Mutex<Vec<SendEvent>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    seen
}

fn send_bytes(
    btl: &mut Btl,
    ep: EndpointId,
    tag: Tag,
    bytes: &[u8],
    flags: DesFlags,
) -> Result<SendStatus, BtlError> {
    let module = &mut btl.modules_mut()[0];
    let des = module
        .alloc(NO_ORDER, bytes.len(), flags)
        .expect("a free send fragment");
    module.segment_mut(des).unwrap().copy_from_slice(bytes);
    module.send(ep, des, tag)
}

fn drive(a: &mut Btl, b: &mut Btl, rounds: usize) {
    for _ in 0..rounds {
        a.progress();
        b.progress();
    }
}

fn finalize_clean(btl: Btl) {
    for ctx in btl.finalize().unwrap() {
        assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
    }
}

#[test]
fn one_module_per_active_port_up_to_max_btls() {
    let net = SimNetwork::new(1);
    let provider = net.provider();
    let a = provider.add_device(SimDeviceSpec::new("mlx0", 2)).unwrap();
    provider.add_device(SimDeviceSpec::new("mlx1", 2)).unwrap();
    net.set_port_state(a[1], PortState::Down).unwrap();
    let btl = Component::init(provider.clone(), params(small())).unwrap();
    let ports: Vec<(String, u8)> = btl
        .modules()
        .iter()
        .map(|m| (m.device().to_owned(), m.port().port_num))
        .collect();
    assert_eq!(
        ports,
        [("mlx0".into(), 1), ("mlx1".into(), 1), ("mlx1".into(), 2)]
    );
    finalize_clean(btl);

    let capped = Component::init(
        provider.clone(),
        params(BtlConfig {
            max_btls: Some(2),
            ..small()
        }),
    )
    .unwrap();
    assert_eq!(capped.modules().len(), 2);
    finalize_clean(capped);
}

#[test]
fn include_and_exclude_select_ports() {
    let net = SimNetwork::new(1);
    let provider = net.provider();
    provider.add_device(SimDeviceSpec::new("mlx0", 2)).unwrap();
    provider.add_device(SimDeviceSpec::new("mlx1", 1)).unwrap();
    let only = |include: &str| BtlConfig {
        if_include: Some(PortSelector::parse_list(include).unwrap()),
        ..small()
    };
    let btl = Component::init(provider.clone(), params(only("mlx0:2"))).unwrap();
    assert_eq!(btl.modules().len(), 1);
    assert_eq!(
        (btl.modules()[0].device(), btl.modules()[0].port().port_num),
        ("mlx0", 2)
    );
    finalize_clean(btl);

    let exclude = BtlConfig {
        if_exclude: Some(PortSelector::parse_list("mlx0").unwrap()),
        ..small()
    };
    let btl = Component::init(provider.clone(), params(exclude)).unwrap();
    assert_eq!(
        btl.modules().iter().map(Module::device).collect::<Vec<_>>(),
        ["mlx1"]
    );
    finalize_clean(btl);

    let both = BtlConfig {
        if_include: Some(PortSelector::parse_list("mlx0").unwrap()),
        if_exclude: Some(PortSelector::parse_list("mlx1").unwrap()),
        ..small()
    };
    let err = Params::load_from(&both, |_| None).unwrap_err().to_string();
    assert!(
        err.contains("if_include") && err.contains("if_exclude"),
        "{err}"
    );

    let none = Component::init(provider, params(only("nosuch")));
    assert!(matches!(none, Err(BtlError::NoPorts { .. })));
}

#[test]
fn parameters_come_from_defaults_config_and_environment() {
    let p = params(BtlConfig::default());
    assert_eq!(
        (
            p.max_btls,
            p.sd_num,
            p.rd_num,
            p.ib_qkey,
            p.exclusivity,
            p.bandwidth
        ),
        (4, 128, 6000, 0, 1024, 800)
    );
    assert_eq!(p.mpool, "rdma");
    assert_eq!(p.source("sd_num"), Some(Source::Default));
    let env = |name: &str| (name == "UDBTL_SD_NUM").then(|| "64".to_string());
    let p = Params::load_from(
        &BtlConfig {
            sd_num: Some(32),
            rd_num: Some(100),
            ..BtlConfig::default()
        },
        env,
    )
    .unwrap();
    assert_eq!(
        (p.sd_num, p.source("sd_num")),
        (64, Some(Source::Environment))
    );
    assert_eq!((p.rd_num, p.source("rd_num")), (100, Some(Source::Config)));
    let bad = Params::load_from(&BtlConfig::default(), |n| {
        (n == "UDBTL_RD_NUM").then(|| "lots".into())
    })
    .unwrap_err();
    assert!(bad.to_string().contains("rd_num"), "{bad}");
}

#[test]
fn a_failed_module_init_unwinds_everything_it_built() {
    let net = SimNetwork::new(17);
    let provider = host(&net, "a", |s| s);
    // The partition key table has one entry: moving the first queue pair to
    // INIT fails after the PD, CQ and that queue pair exist.
    let bad = params(BtlConfig {
        ib_pkey_index: Some(5),
        ..small()
    });
    let ctx = udbtl_fabric::Provider::open(&provider, "a").unwrap();
    let (ctx, err) = Module::new(ctx, 1, &bad).unwrap_err();
    assert!(err.to_string().contains("INIT"), "{err}");
    assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
    // The component skips the port, and says why when nothing is left.
    let err = Component::init(provider, bad).unwrap_err().to_string();
    assert!(
        err.contains("no active port") && err.contains("INIT"),
        "{err}"
    );
}

#[test]
fn limits_follow_the_port_mtu_unless_set() {
    let net = SimNetwork::new(1);
    let btl = Component::init(
        host(&net, "big", |s| s.with_max_msg_size(9000)),
        params(small()),
    )
    .unwrap();
    let limits = btl.modules()[0].limits();
    assert_eq!(limits.eager_limit, 9000 - 8);
    assert_eq!(limits.max_send_size, 9000 - 8);
    assert_eq!(limits.rndv_eager_limit, 9000 - 8);
    assert_eq!(limits.inline_max, 200);
    finalize_clean(btl);

    let seed = BtlConfig {
        max_send_size: Some(2048),
        min_send_size: Some(1024),
        ..small()
    };
    let btl = Component::init(
        host(&net, "ib", |s| s.with_max_msg_size(4096)),
        params(seed),
    )
    .unwrap();
    let limits = btl.modules()[0].limits();
    assert_eq!(
        (
            limits.eager_limit,
            limits.max_send_size,
            limits.rndv_eager_limit
        ),
        (2040, 2040, 1024)
    );
    finalize_clean(btl);
}

#[test]
fn tagged_sends_reach_their_callbacks() {
    let net = SimNetwork::new(2);
    let (mut a, mut b, ab, ba) = pair(&net, small());
    let pml = collect(&mut b, Tag::PML);
    let usr = collect(&mut b, Tag::USR);
    let done = sends(&mut a);
    send_bytes(&mut a, ab, Tag::PML, b"to the pml", DesFlags::BTL_OWNERSHIP).unwrap();
    send_bytes(
        &mut a,
        ab,
        Tag::USR,
        b"to the user",
        DesFlags::BTL_OWNERSHIP,
    )
    .unwrap();
    send_bytes(
        &mut a,
        ab,
        Tag(0x99),
        b"nobody listens",
        DesFlags::BTL_OWNERSHIP,
    )
    .unwrap();
    drive(&mut a, &mut b, 4);
    assert_eq!(*pml.lock().unwrap(), [(Some(ba), b"to the pml".to_vec())]);
    assert_eq!(*usr.lock().unwrap(), [(Some(ba), b"to the user".to_vec())]);
    assert_eq!(b.modules()[0].stats().recv_no_callback, 1);
    let done = done.lock().unwrap();
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|ev| ev.status.is_ok() && ev.endpoint == ab));
    // BTL-owned descriptors were freed after their callback.
    assert!(a.modules_mut()[0].free(done[0].descriptor).is_err());
    drop(done);
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn peers_are_striped_over_the_queue_pairs_and_each_hears_the_one_it_expects() {
    let net = SimNetwork::new(3);
    let mut a = Component::init(host(&net, "simA", |s| s), params(small())).unwrap();
    let qpns: std::collections::BTreeSet<u32> = a.modules()[0].address().qpns.into_iter().collect();
    assert_eq!(qpns.len(), NUM_QP);
    let ma = a.modex();
    let mut peers = Vec::new();
    for i in 0..8 {
        let mut b =
            Component::init(host(&net, &format!("simB{i}"), |s| s), params(small())).unwrap();
        let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
        let ba = b.add_procs(&[Some(&ma)]).unwrap()[0].endpoints[0].unwrap();
        let got = collect(&mut b, Tag::PML);
        peers.push((b, ab, ba, got));
    }
    // The sim numbers queue pairs in turn, NUM_QP to a module: every
    // module's first has the same remainder, and the hash still spreads them.
    let used: std::collections::BTreeSet<usize> = peers
        .iter()
        .map(|(b, ..)| sending_qp(b.modules()[0].address().qpns[0]))
        .collect();
    assert!(used.len() > 1, "8 peers all on queue pair {used:?}");
    for (_, ab, ..) in &peers {
        for i in 0..4u8 {
            send_bytes(&mut a, *ab, Tag::PML, &[i], DesFlags::BTL_OWNERSHIP).unwrap();
        }
    }
    for _ in 0..4 {
        a.progress();
        for (b, ..) in &mut peers {
            b.progress();
        }
    }
    for (b, _, ba, got) in peers {
        let got = got.lock().unwrap().clone();
        assert_eq!(got.len(), 4);
        assert!(
            got.iter().all(|(ep, _)| *ep == Some(ba)),
            "every datagram maps to the sender"
        );
        assert_eq!(b.modules()[0].stats().recv_unknown_peer, 0);
        finalize_clean(b);
    }
    finalize_clean(a);
}

#[test]
fn pending_queue_drains_with_one_send_credit() {
    let net = SimNetwork::new(4);
    let (mut a, mut b, ab, _) = pair(
        &net,
        BtlConfig {
            sd_num: Some(1),
            ..small()
        },
    );
    let got = collect(&mut b, Tag::PML);
    let done = sends(&mut a);
    let mut statuses = Vec::new();
    for i in 0..50u32 {
        statuses.push(
            send_bytes(
                &mut a,
                ab,
                Tag::PML,
                &i.to_be_bytes(),
                DesFlags::BTL_OWNERSHIP,
            )
            .unwrap(),
        );
    }
    assert_eq!(statuses[0], SendStatus::Posted);
    assert!(statuses[1..].iter().all(|s| *s == SendStatus::Queued));
    assert_eq!(a.modules()[0].pending_len(), 49);
    assert_eq!(a.modules()[0].send_credits(), 0);
    for _ in 0..200 {
        drive(&mut a, &mut b, 1);
        if got.lock().unwrap().len() == 50 {
            break;
        }
    }
    drive(&mut a, &mut b, 2);
    let order: Vec<u32> = got
        .lock()
        .unwrap()
        .iter()
        .map(|(_, p)| u32::from_be_bytes(p[..4].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..50).collect::<Vec<_>>());
    assert_eq!(done.lock().unwrap().len(), 50);
    let module = &a.modules()[0];
    assert_eq!((module.pending_len(), module.send_credits()), (0, 1));
    assert_eq!(module.stats().pending_high_water, 49);
    assert_eq!(module.stats().sends_queued, 49);
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn prepare_src_packs_after_the_reserve_from_any_layout() {
    let net = SimNetwork::new(5);
    let (mut a, mut b, ab, _) = pair(&net, small());
    let got = collect(&mut b, Tag::PML);
    let data: Vec<u8> = (0..=255).collect();
    let parts: [&[u8]; 3] = [&data[..10], &[], &data[10..100]];
    let layouts = [
        (Convertor::contiguous(&data[..100]), data[..100].to_vec()),
        (Convertor::iovec(&parts), data[..100].to_vec()),
        (
            Convertor::strided(&data, 4, 16, 10).unwrap(),
            (0..10)
                .flat_map(|i| data[i * 16..i * 16 + 4].to_vec())
                .collect(),
        ),
    ];
    let module = &mut a.modules_mut()[0];
    for (mut convertor, expected) in layouts {
        let mut size = usize::MAX;
        let des = module
            .prepare_src(
                None,
                &mut convertor,
                NO_ORDER,
                6,
                &mut size,
                DesFlags::BTL_OWNERSHIP,
            )
            .unwrap();
        assert_eq!(size, expected.len());
        module.segment_mut(des).unwrap()[..6].copy_from_slice(b"header");
        module.send(ab, des, Tag::PML).unwrap();
    }
    drive(&mut a, &mut b, 4);
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 3);
    for (_, payload) in got.iter() {
        assert_eq!(&payload[..6], b"header");
    }
    assert_eq!(
        got[2].1[6..],
        (0..10)
            .flat_map(|i| data[i * 16..i * 16 + 4].to_vec())
            .collect::<Vec<u8>>()[..]
    );
    drop(got);
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn alloc_and_free_respect_limits_and_ownership() {
    let net = SimNetwork::new(6);
    let (mut a, b, ab, _) = pair(
        &net,
        BtlConfig {
            send_frags_max: Some(16),
            ..small()
        },
    );
    let module = &mut a.modules_mut()[0];
    let eager = module.limits().eager_limit;
    assert!(module.alloc(NO_ORDER, eager + 1, DesFlags::NONE).is_none());
    let held: Vec<Descriptor> = (0..16)
        .map(|_| module.alloc(NO_ORDER, 8, DesFlags::NONE).unwrap())
        .collect();
    assert!(
        module.alloc(NO_ORDER, 8, DesFlags::NONE).is_none(),
        "the free list is bounded"
    );
    module.free(held[0]).unwrap();
    assert!(module.free(held[0]).is_err(), "double free is caught");
    assert!(
        module.segment_mut(held[0]).is_err(),
        "a freed handle is stale"
    );
    let again = module.alloc(NO_ORDER, 8, DesFlags::NONE).unwrap();
    module.send(ab, again, Tag::PML).unwrap();
    assert!(
        module.free(again).is_err(),
        "a posted descriptor belongs to the BTL"
    );
    assert!(
        module.send(ab, again, Tag::PML).is_err(),
        "a descriptor cannot be sent twice"
    );
    a.progress();
    let module = &mut a.modules_mut()[0];
    module.free(again).unwrap();
    for des in &held[1..] {
        module.free(*des).unwrap();
    }
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn zero_copy_send_of_a_mebibyte_through_the_registration_cache() {
    let net = SimNetwork::new(7);
    let (mut a, mut b, ab, _) = pair(
        &net,
        BtlConfig {
            rd_num: Some(512),
            ..small()
        },
    );
    let received = Arc::new(Mutex::new(vec![0u8; 1 << 20]));
    let pieces = Arc::new(Mutex::new(0usize));
    {
        let (received, pieces) = (received.clone(), pieces.clone());
        b.modules_mut()[0].register(
            Tag::PML,
            Box::new(move |ev: &RecvEvent<'_>| {
                let offset = u64::from_be_bytes(ev.payload[..8].try_into().unwrap()) as usize;
                received.lock().unwrap()[offset..offset + ev.payload.len() - 8]
                    .copy_from_slice(&ev.payload[8..]);
                *pieces.lock().unwrap() += 1;
            }),
        );
    }
    let data: Arc<[u8]> = (0..1u32 << 20)
        .map(|i| (i * 7 % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut convertor = Convertor::shared(data.clone());
    let max = a.modules()[0].limits().max_send_size;
    let mut sent = 0;
    while convertor.remaining() > 0 {
        let module = &mut a.modules_mut()[0];
        let offset = convertor.position() as u64;
        let mut size = convertor.remaining();
        let des = module
            .prepare_src(
                None,
                &mut convertor,
                NO_ORDER,
                8,
                &mut size,
                DesFlags::BTL_OWNERSHIP,
            )
            .unwrap();
        assert_eq!(
            size,
            (max - 8).min((1 << 20) - offset as usize),
            "each piece fills one datagram"
        );
        // The segment is the reserve, followed by the data when it was packed.
        module.segment_mut(des).unwrap()[..8].copy_from_slice(&offset.to_be_bytes());
        module.send(ab, des, Tag::PML).unwrap();
        sent += 1;
        drive(&mut a, &mut b, 1);
    }
    drive(&mut a, &mut b, 8);
    assert_eq!(*pieces.lock().unwrap(), sent);
    assert_eq!(&received.lock().unwrap()[..], &data[..]);
    let rc = a.modules()[0].rcache_stats();
    // Every full piece went zero-copy through the cache; the short tail was
    // below the eager limit and was packed instead.
    assert_eq!(rc.misses + rc.hits, sent as u64 - 1);
    assert!(
        rc.misses <= 2,
        "the first registration covers later pieces: {rc:?}"
    );
    finalize_clean(a);
    finalize_clean(b);
}

/// Memory lent for a zero-copy send, as a C host lends its user buffer.
struct Lent(Vec<u8>);

impl LentBytes for Lent {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

#[test]
fn lent_memory_is_sent_without_a_copy_behind_the_longest_reserve() {
    let net = SimNetwork::new(17);
    let reliable = BtlConfig {
        reliable: Some(true),
        ..small()
    };
    let (mut a, mut b, ab, _) = pair(&net, reliable);
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    {
        let got = got.clone();
        b.modules_mut()[0].register(
            Tag::PML,
            Box::new(move |ev: &RecvEvent<'_>| got.lock().unwrap().push(ev.payload.to_vec())),
        );
    }
    let module = &mut a.modules_mut()[0];
    assert!(
        module.limits().header_len > 8,
        "a reliable module's header is the long one"
    );
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    let des = module
        .prepare_lent(
            Box::new(Lent(data.clone())),
            NO_ORDER,
            USER_RESERVE_MAX,
            DesFlags::BTL_OWNERSHIP,
        )
        .map_err(|_| "refused")
        .unwrap();
    // The whole reserve is writable, behind the reliability extension (it
    // was not: the reserve assumed the short header and overlapped the next
    // fragment).
    let header = vec![0xa5u8; USER_RESERVE_MAX];
    module.segment_mut(des).unwrap().copy_from_slice(&header);
    module.send(ab, des, Tag::PML).unwrap();
    drive(&mut a, &mut b, 8);
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0], [header, data].concat());
    assert!(
        a.modules_mut()[0]
            .prepare_lent(
                Box::new(Lent(vec![0; 8])),
                NO_ORDER,
                USER_RESERVE_MAX + 1,
                DesFlags::NONE
            )
            .is_err(),
        "a longer reserve is refused"
    );
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn a_host_counts_what_its_callbacks_took_and_what_nobody_claimed() {
    let net = SimNetwork::new(18);
    let (mut a, mut b, ab, _) = pair(&net, small());
    let mut received = Vec::new();
    for i in 0..2u8 {
        let module = &mut a.modules_mut()[0];
        let des = module.alloc(NO_ORDER, 3, DesFlags::BTL_OWNERSHIP).unwrap();
        module.segment_mut(des).unwrap().copy_from_slice(&[i; 3]);
        module.send(ab, des, Tag::PML).unwrap();
    }
    for _ in 0..50 {
        a.progress();
        let host = &mut b.modules_mut()[0];
        host.poll();
        while let Some(event) = host.next_event() {
            match event {
                HostEvent::Received(ref message) => {
                    received.push(message.payload_len());
                    // The first is taken by a callback, the second by nobody.
                    if received.len() == 1 {
                        host.finish(event);
                    } else {
                        host.finish_unclaimed(event);
                    }
                }
                other => host.finish(other),
            }
        }
        if received.len() == 2 {
            break;
        }
    }
    assert_eq!(received, [3, 3]);
    let stats = b.modules()[0].stats();
    assert_eq!((stats.recvs_delivered, stats.recv_no_callback), (1, 1));
    finalize_clean(a);
    finalize_clean(b);
}

#[test]
fn registration_cache_hits_and_evicts_at_its_limit() {
    let net = SimNetwork::new(8);
    let config = BtlConfig {
        rcache_max_entries: Some(2),
        ..small()
    };
    let mut btl = Component::init(host(&net, "simA", |s| s), params(config)).unwrap();
    let module = &mut btl.modules_mut()[0];
    let buffers: Vec<Arc<[u8]>> = (0..3).map(|i| vec![i as u8; 4096].into()).collect();
    for buffer in &buffers {
        let reg = module.mpool_register(buffer).unwrap();
        module.mpool_deregister(reg).unwrap();
    }
    let reg = module.mpool_register(&buffers[2]).unwrap();
    module.mpool_deregister(reg).unwrap();
    let stats = module.rcache_stats();
    assert_eq!(
        (stats.misses, stats.hits, stats.evictions, stats.entries),
        (3, 1, 1, 2)
    );
    assert!(
        module.mpool_deregister(reg).is_err(),
        "a registration is released once"
    );
    finalize_clean(btl);
}

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
