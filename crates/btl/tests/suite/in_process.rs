//! The bodies that run in one process: two components of a provider that
//! know each other through their modex blobs (`add_procs`), reliable tagged
//! sends of every size delivered once and in order, zero-copy sends from
//! lent and registered memory, sends queued behind a single send credit and
//! failed by `del_procs`, and a leaked descriptor reported by `finalize`.

use std::sync::Arc;

use udbtl_btl::*;
use udbtl_fabric::Provider;

use super::{
    BULK, Make, PING, Peer, completions, finalize_clean, pair, payload, progress_until, reliable,
    send_with, unreliable,
};

/// The modex blob carries a component's addresses; `add_procs` makes a
/// reachable endpoint of a good blob and marks a missing or malformed one
/// unreachable without failing.
pub(crate) fn modex_and_add_procs<P: Provider>(make: Make<'_, P>) {
    let mut a = make(reliable());
    let b = make(reliable());
    let blob = b.modex();
    assert!(!blob.is_empty());
    let addresses = udbtl_wire::modex::parse_blob(&blob).unwrap();
    assert_eq!(addresses.len(), b.modules().len());
    assert_eq!(addresses[0], b.modules()[0].address());
    let garbage = [0xde, 0xad];
    let added = a.add_procs(&[Some(&blob), None, Some(&garbage)]).unwrap();
    assert_eq!(added.len(), a.modules().len());
    assert_eq!(added[0].reachable, [true, false, false]);
    let ep = added[0].endpoints[0].expect("an endpoint for the good blob");
    assert!(added[0].endpoints[1..].iter().all(Option::is_none));
    let remote = a.modules()[0].endpoint_addr(ep).expect("remote address");
    assert!(
        addresses[0].qpns.contains(&remote.qpn),
        "the endpoint sends to one of the peer's queue pairs"
    );
    finalize_clean(a);
    finalize_clean(b);
}

/// Reliable tagged sends from one component to another progressed by its
/// own thread: eager messages of every size up to the eager limit and
/// multi-datagram messages (`send_message`), interleaved on one tag, are
/// each delivered once, whole and in order; every send completes once,
/// successfully; the reliability counters show each datagram received
/// once and no peer lost.
pub(crate) fn tagged_sends_arrive_once_in_order<P: Provider>(make: Make<'_, P>)
where
    Component<P>: Send + 'static,
{
    const EAGER_SENDS: usize = 300;
    const CONTEXT: u64 = 0x1000;
    let (mut a, b, ab, ba) = pair(make, reliable());
    let done = completions(&mut a);
    let eager = a.modules()[0].limits().eager_limit;
    let sizes = [1usize, 7, 8, 100, 1000, eager / 2, eager - 1, eager];
    let large = [eager + 1, 3 * eager + 17, 256 << 10];
    let peer = Peer::spawn(b, &[PING]);

    let mut expected = Vec::new();
    for i in 0..EAGER_SENDS {
        if i % 50 == 25 {
            let message = payload(expected.len(), large[(i / 50) % large.len()]);
            a.modules_mut()[0].send_message(ab, PING, &message).unwrap();
            expected.push(message);
        }
        let message = payload(expected.len(), sizes[i % sizes.len()]);
        send_with(&mut a, ab, PING, &message, CONTEXT + i as u64);
        expected.push(message);
    }
    let all_acknowledged = progress_until(&mut a, |a| {
        peer.received() >= expected.len()
            && a.modules()[0].unacknowledged() == 0
            && done
                .lock()
                .unwrap()
                .iter()
                .filter(|ev| ev.context >= CONTEXT)
                .count()
                >= EAGER_SENDS
    });
    let inbox = peer.inbox.clone();
    let b = peer.join();
    assert!(
        all_acknowledged,
        "received {} of {}, unacknowledged {}",
        inbox.lock().unwrap().len(),
        expected.len(),
        a.modules()[0].unacknowledged()
    );

    let got = inbox.lock().unwrap();
    assert_eq!(got.len(), expected.len(), "each message delivered once");
    for (i, ((from, tag, bytes), want)) in got.iter().zip(&expected).enumerate() {
        assert_eq!((*from, *tag), (Some(ba), PING), "message {i}");
        assert!(
            bytes == want,
            "message {i}: {} bytes, want {}",
            bytes.len(),
            want.len()
        );
    }
    drop(got);

    let events = done.lock().unwrap();
    assert!(
        events
            .iter()
            .all(|ev| ev.status.is_ok() && ev.endpoint == ab),
        "{events:?}"
    );
    let mut contexts: Vec<u64> = events
        .iter()
        .map(|ev| ev.context)
        .filter(|c| *c >= CONTEXT)
        .collect();
    contexts.sort_unstable();
    let want: Vec<u64> = (0..EAGER_SENDS as u64).map(|i| CONTEXT + i).collect();
    assert_eq!(contexts, want, "every send completes exactly once");
    drop(events);

    let (sa, sb) = (a.modules()[0].stats(), b.modules()[0].stats());
    assert_eq!(sa.send_errors, 0);
    assert_eq!(sa.messages_aborted, 0);
    assert_eq!(sb.messages_reassembled, (EAGER_SENDS / 50) as u64);
    assert_eq!(
        (
            sb.recv_malformed,
            sb.recv_bad_checksum,
            sb.recv_bad_job_key,
            sb.recv_no_callback,
            sb.recv_orphan_pieces
        ),
        (0, 0, 0, 0, 0)
    );
    let ra = a.modules()[0].reliability_stats().unwrap();
    let rb = b.modules()[0].reliability_stats().unwrap();
    // Small messages may share a datagram (coalescing), so datagrams are
    // not messages; what matters is that each was received once.
    assert!(ra.sent > 0, "{ra:?}");
    assert_eq!(
        rb.received, ra.sent,
        "each datagram received once\n{ra:?}\n{rb:?}"
    );
    assert!(
        rb.duplicates <= ra.retransmitted + ra.tail_probes,
        "duplicates only of what was sent again\n{ra:?}\n{rb:?}"
    );
    assert_eq!((ra.peers_lost, rb.peers_lost), (0, 0));
    assert_eq!((rb.sent, ra.received), (0, 0), "no data flowed back");
    finalize_clean(a);
    finalize_clean(b);
}

/// Zero-copy sends from user memory: lent bytes behind the longest
/// reserve, and a registered buffer cut into datagrams by `prepare_src`,
/// arrive intact; the registration cache registers the buffer once.
pub(crate) fn zero_copy_sends_through_the_registration_cache<P: Provider>(make: Make<'_, P>)
where
    Component<P>: Send + 'static,
{
    struct Lent(Vec<u8>);
    impl LentBytes for Lent {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
    }
    let (mut a, b, ab, _) = pair(make, reliable());
    let done = completions(&mut a);
    let peer = Peer::spawn(b, &[PING, BULK]);
    let limits = a.modules()[0].limits();

    // Lent: one datagram of header room plus data.
    let lent_len = limits
        .max_send_size
        .saturating_sub(limits.header_len + USER_RESERVE_MAX)
        .min(3000);
    assert!(lent_len > 0, "{limits:?}");
    let lent = payload(1, lent_len);
    let module = &mut a.modules_mut()[0];
    let des = module
        .prepare_lent(
            Box::new(Lent(lent.clone())),
            NO_ORDER,
            USER_RESERVE_MAX,
            DesFlags::BTL_OWNERSHIP,
        )
        .map_err(|_| "prepare_lent refused")
        .unwrap();
    let header = vec![0xa5u8; USER_RESERVE_MAX];
    module.segment_mut(des).unwrap().copy_from_slice(&header);
    module.send(ab, des, PING).unwrap();

    // Registered: a buffer of many datagrams, each piece behind an 8-byte
    // offset.
    let data: Arc<[u8]> = payload(2, 256 << 10).into();
    let reg = a.modules_mut()[0].mpool_register(&data).unwrap();
    let mut convertor = Convertor::shared(data.clone());
    let mut pieces = 0usize;
    while convertor.remaining() > 0 {
        let offset = convertor.position() as u64;
        let mut size = convertor.remaining();
        let module = &mut a.modules_mut()[0];
        let Some(des) = module.prepare_src(
            Some(reg),
            &mut convertor,
            NO_ORDER,
            8,
            &mut size,
            DesFlags::BTL_OWNERSHIP,
        ) else {
            a.progress();
            continue;
        };
        assert!(size > 0);
        module.segment_mut(des).unwrap()[..8].copy_from_slice(&offset.to_be_bytes());
        module.send(ab, des, BULK).unwrap();
        pieces += 1;
        a.progress();
    }
    assert!(pieces > 1, "the buffer spans several datagrams");
    let finished = progress_until(&mut a, |a| {
        peer.received() == pieces + 1
            && a.modules()[0].unacknowledged() == 0
            && done.lock().unwrap().len() == pieces + 1
    });
    let inbox = peer.inbox.clone();
    let b = peer.join();
    assert!(
        finished,
        "received {} of {}",
        inbox.lock().unwrap().len(),
        pieces + 1
    );

    let got = inbox.lock().unwrap();
    let lent_got: Vec<&Vec<u8>> = got
        .iter()
        .filter(|(_, tag, _)| *tag == PING)
        .map(|(_, _, b)| b)
        .collect();
    assert_eq!(lent_got, [&[header, lent].concat()]);
    let mut assembled = vec![0u8; data.len()];
    let mut bytes = 0;
    for (_, _, piece) in got.iter().filter(|(_, tag, _)| *tag == BULK) {
        let offset = u64::from_be_bytes(piece[..8].try_into().unwrap()) as usize;
        assembled[offset..offset + piece.len() - 8].copy_from_slice(&piece[8..]);
        bytes += piece.len() - 8;
    }
    assert_eq!(bytes, data.len(), "each byte once");
    assert!(assembled[..] == data[..], "the buffer arrived intact");
    drop(got);
    assert!(done.lock().unwrap().iter().all(|ev| ev.status.is_ok()));

    let module = &mut a.modules_mut()[0];
    assert_eq!(
        module.rcache_stats().misses,
        1 + 1,
        "lent bytes and the buffer"
    );
    module.mpool_deregister(reg).unwrap();
    assert!(module.mpool_deregister(reg).is_err(), "released once");
    finalize_clean(a);
    finalize_clean(b);
}

/// With one send credit, sends queue behind the one posted; deleting the
/// peer fails the queued ones through the send callback, the endpoint is
/// refused afterwards, and the posted one still completes.
pub(crate) fn del_procs_fails_pending_sends<P: Provider>(make: Make<'_, P>) {
    let (mut a, b, ab, _) = pair(make, unreliable());
    let done = completions(&mut a);
    let statuses: Vec<SendStatus> = (0..5u8)
        .map(|i| send_with(&mut a, ab, PING, &[i; 4], u64::from(i) + 1))
        .collect();
    assert_eq!(statuses[0], SendStatus::Posted);
    assert!(statuses[1..].iter().all(|s| *s == SendStatus::Queued));
    assert!(a.modules()[0].pending_len() >= 3);
    a.modules_mut()[0].del_procs(&[ab]).unwrap();
    assert_eq!(a.modules()[0].pending_len(), 0);
    let failed: Vec<u64> = done
        .lock()
        .unwrap()
        .iter()
        .filter(|ev| ev.status.is_err())
        .map(|ev| ev.context)
        .collect();
    assert_eq!(failed.len(), 4, "the queued sends fail: {failed:?}");

    let module = &mut a.modules_mut()[0];
    let des = module.alloc(NO_ORDER, 1, DesFlags::BTL_OWNERSHIP).unwrap();
    assert!(matches!(
        module.send(ab, des, PING),
        Err(BtlError::BadEndpoint { .. })
    ));
    module.free(des).unwrap();
    assert!(
        progress_until(&mut a, |_| done.lock().unwrap().len() == 5),
        "the posted send completes"
    );
    let events = done.lock().unwrap();
    let mut contexts: Vec<u64> = events.iter().map(|ev| ev.context).collect();
    contexts.sort_unstable();
    assert_eq!(contexts, [1, 2, 3, 4, 5], "each send completes once");
    drop(events);
    assert_eq!(a.modules()[0].send_credits(), 1, "no credit is lost");
    finalize_clean(a);
    finalize_clean(b);
}

/// A descriptor the caller forgot is reported by `finalize`.
pub(crate) fn finalize_reports_leaked_descriptors<P: Provider>(make: Make<'_, P>) {
    let mut btl = make(reliable());
    let _forgotten = btl.modules_mut()[0]
        .alloc(NO_ORDER, 8, DesFlags::NONE)
        .unwrap();
    let Err(err) = btl.finalize() else {
        panic!("finalize accepted a leaked descriptor");
    };
    assert!(err.to_string().contains("descriptor"), "{err}");
}
