//! Sends and their callbacks, striping, the pending queue, prepare_src,
//! alloc and free, zero-copy sends and the registration cache.

use super::*;

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
