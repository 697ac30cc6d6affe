//! The BTL test suite over real providers: every test body here is generic
//! over the fabric [`Provider`] and takes a function that builds a
//! [`Component`] from a [`BtlConfig`], so the same bodies run on `udp`
//! (always) and on `verbs` (when a device is named), from `providers.rs`.
//!
//! Real fabrics run on wall-clock time and may lose a datagram, so the tests
//! progress until what they wait for has happened, under a generous limit
//! that only bounds a hang: they assert behaviour, never timing.
//!
//! [`provider_suite!`] writes one `#[test]` per body for a provider.

// Each test crate uses part of this module.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::{Context, Provider};

/// Builds a component of one provider from a configuration.
pub(crate) type Make<'a, P> = &'a dyn Fn(BtlConfig) -> Component<P>;

pub(crate) const PING: Tag = Tag(Tag::PML.0 + 1);
pub(crate) const PONG: Tag = Tag(Tag::PML.0 + 2);
pub(crate) const BULK: Tag = Tag(Tag::PML.0 + 3);

/// Bounds every wait for something that should happen at once on an idle
/// fabric; only a hang or a lost peer reaches it.
const PATIENCE: Duration = Duration::from_secs(60);

/// The seed's unreliable contract, one send credit: the two-process test
/// and the pending-queue tests.
pub(crate) fn unreliable() -> BtlConfig {
    BtlConfig {
        reliable: Some(false),
        rd_num: Some(256),
        sd_num: Some(1),
        job_key: Some(0x5eed),
        ..BtlConfig::default()
    }
}

/// The default, reliable contract.
pub(crate) fn reliable() -> BtlConfig {
    BtlConfig {
        reliable: Some(true),
        job_key: Some(0x5eed),
        ..BtlConfig::default()
    }
}

/// Parameters from `config` alone: the environment is not read, so a
/// developer's `UDBTL_*` settings cannot change what the suite tests.
pub(crate) fn params(config: &BtlConfig) -> Params {
    Params::load_from(config, |_| None).unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// What a component received, in order: sender's endpoint, tag, payload.
pub(crate) type Inbox = Arc<Mutex<Vec<(Option<EndpointId>, Tag, Vec<u8>)>>>;

pub(crate) fn inbox<P: Provider>(btl: &mut Component<P>, tags: &[Tag]) -> Inbox {
    let inbox: Inbox = Arc::default();
    for tag in tags {
        let sink = inbox.clone();
        btl.modules_mut()[0].register(
            *tag,
            Box::new(move |ev: &RecvEvent<'_>| {
                sink.lock()
                    .unwrap()
                    .push((ev.endpoint, ev.tag, ev.payload.to_vec()))
            }),
        );
    }
    inbox
}

/// Every send completion, in the order reported.
pub(crate) type Completions = Arc<Mutex<Vec<SendEvent>>>;

pub(crate) fn completions<P: Provider>(btl: &mut Component<P>) -> Completions {
    let seen: Completions = Arc::default();
    let sink = seen.clone();
    btl.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));
    seen
}

/// Copies `bytes` into a send fragment (the BTL frees it after its
/// completion) marked with `context`, and sends it. While no fragment is
/// free (back-pressure), progresses until acknowledgements free one.
pub(crate) fn send_with<P: Provider>(
    btl: &mut Component<P>,
    ep: EndpointId,
    tag: Tag,
    bytes: &[u8],
    context: u64,
) -> SendStatus {
    let mut des = None;
    let freed = progress_until(btl, |btl| {
        des = btl.modules_mut()[0].alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP);
        des.is_some()
    });
    assert!(freed, "no send fragment became free");
    let des = des.unwrap();
    let module = &mut btl.modules_mut()[0];
    module.segment_mut(des).unwrap().copy_from_slice(bytes);
    module.set_context(des, context).unwrap();
    module.send(ep, des, tag).unwrap()
}

pub(crate) fn send<P: Provider>(btl: &mut Component<P>, ep: EndpointId, tag: Tag, bytes: &[u8]) {
    send_with(btl, ep, tag, bytes, 0);
}

/// Progresses `btl` until `done` holds; `false` if [`PATIENCE`] ran out.
pub(crate) fn progress_until<P: Provider>(
    btl: &mut Component<P>,
    mut done: impl FnMut(&mut Component<P>) -> bool,
) -> bool {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if done(btl) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        btl.progress();
    }
}

/// Finalizes `btl` and checks that every fabric resource was released.
pub(crate) fn finalize_clean<P: Provider>(btl: Component<P>) {
    for ctx in btl.finalize().unwrap() {
        assert!(ctx.resources().is_empty(), "leaked {:?}", ctx.resources());
    }
}

/// Two components that know each other through their modex blobs; returns
/// them with the endpoint each has for the other.
pub(crate) fn pair<P: Provider>(
    make: Make<'_, P>,
    config: BtlConfig,
) -> (Component<P>, Component<P>, EndpointId, EndpointId) {
    let mut a = make(config.clone());
    let mut b = make(config);
    let (ma, mb) = (a.modex(), b.modex());
    let ab = a.add_procs(&[Some(&mb)]).unwrap()[0].endpoints[0].unwrap();
    let ba = b.add_procs(&[Some(&ma)]).unwrap()[0].endpoints[0].unwrap();
    (a, b, ab, ba)
}

/// A component progressed by a thread of its own, as a peer process would
/// be, recording what arrives on some tags until stopped.
pub(crate) struct Peer<P: Provider> {
    thread: JoinHandle<Component<P>>,
    stop: Arc<AtomicBool>,
    pub(crate) inbox: Inbox,
}

impl<P: Provider> Peer<P>
where
    Component<P>: Send + 'static,
{
    pub(crate) fn spawn(mut btl: Component<P>, tags: &[Tag]) -> Self {
        let inbox = inbox(&mut btl, tags);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                btl.progress();
            }
            btl
        });
        Self {
            thread,
            stop,
            inbox,
        }
    }

    /// Messages received so far.
    pub(crate) fn received(&self) -> usize {
        self.inbox.lock().unwrap().len()
    }

    /// Stops the thread and returns the component.
    pub(crate) fn join(self) -> Component<P> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("peer thread")
    }
}

/// Message `index`, `len` bytes: every byte depends on both, so a
/// misplaced, truncated or mixed-up message cannot pass for another.
pub(crate) fn payload(index: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + index * 7 + i / 251) as u8)
        .collect()
}

// ----- the tests ---------------------------------------------------------

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

/// Sends a shared buffer zero-copy through `prepare_src` without a
/// registration (the cache registers it), `offset` in an 8-byte reserve.
fn send_bulk<P: Provider>(btl: &mut Component<P>, ep: EndpointId, data: &Arc<[u8]>) -> usize {
    let mut convertor = Convertor::shared(data.clone());
    let mut pieces = 0;
    while convertor.remaining() > 0 {
        let module = &mut btl.modules_mut()[0];
        let offset = convertor.position() as u64;
        let mut size = convertor.remaining();
        let Some(des) = module.prepare_src(
            None,
            &mut convertor,
            NO_ORDER,
            8,
            &mut size,
            DesFlags::BTL_OWNERSHIP,
        ) else {
            btl.progress();
            continue;
        };
        module.segment_mut(des).unwrap()[..8].copy_from_slice(&offset.to_be_bytes());
        module.send(ep, des, BULK).unwrap();
        pieces += 1;
        btl.progress();
    }
    pieces
}

fn bulk_byte(i: usize) -> u8 {
    (i as u32 * 31 % 253) as u8
}

/// Between two processes, on the seed's unreliable contract: address
/// exchange through the modex blob, tagged ping-pong both ways up to the
/// eager limit, the pending queue with one send credit, and a zero-copy
/// send of 1 MiB cut into datagrams through the registration cache. The
/// child is this test binary run with `child` (the full name of the
/// [`two_processes_child`] test) as its filter.
pub(crate) fn two_processes<P: Provider>(make: Make<'_, P>, child: &str) {
    let mut parent = make(unreliable());
    let got = inbox(&mut parent, &[PONG]);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            child,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("UDBTL_TEST_PEER_MODEX", hex(&parent.modex()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child_modex = loop {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some(blob) = line.strip_prefix("MODEX ") {
            break unhex(blob.trim());
        }
    };
    let added = parent.add_procs(&[Some(&child_modex)]).unwrap();
    assert_eq!(added[0].reachable, [true]);
    let ep = added[0].endpoints[0].unwrap();

    // Ping-pong with growing payloads, up to the eager limit; UD may lose a
    // datagram, so a round is retried after a quiet spell.
    let eager = parent.modules()[0].limits().eager_limit;
    let sizes = [1usize, 7, 8, 100, 1000, 4000, 20_000, eager].map(|s| s.min(eager));
    for (round, size) in sizes.iter().cycle().take(400).enumerate() {
        let payload: Vec<u8> = (0..*size).map(|i| (i + round) as u8).collect();
        let echoed = 'retry: loop {
            send(&mut parent, ep, PING, &payload);
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline {
                parent.progress();
                if let Some((_, tag, bytes)) = got.lock().unwrap().pop() {
                    break 'retry (tag, bytes);
                }
            }
        };
        assert_eq!(echoed, (PONG, payload), "round {round}");
    }
    // Queued sends: ten at once through a single send credit.
    for i in 0..10u8 {
        send(&mut parent, ep, PING, &[i; 3]);
    }
    assert!(parent.modules()[0].stats().sends_queued >= 9);

    // A zero-copy megabyte: the child answers with the bytes it assembled.
    let data: Arc<[u8]> = (0..1usize << 20).map(bulk_byte).collect::<Vec<u8>>().into();
    let pieces = send_bulk(&mut parent, ep, &data);
    assert!(pieces > 10);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut echoes = 0;
    let mut verdict = None;
    while Instant::now() < deadline && verdict.is_none() {
        parent.progress();
        for (_, _, bytes) in got.lock().unwrap().drain(..) {
            if bytes.starts_with(b"BULK ") {
                verdict = Some(String::from_utf8(bytes).unwrap());
            } else {
                echoes += 1;
            }
        }
    }
    assert!(echoes <= 10);
    assert_eq!(
        verdict.as_deref(),
        Some(format!("BULK {} bytes ok", data.len()).as_str())
    );
    let rc = parent.modules()[0].rcache_stats();
    assert_eq!(rc.misses, 1);
    assert!(rc.hits as usize >= pieces - 2);
    send(&mut parent, ep, PING, b"quit");
    for _ in 0..100 {
        parent.progress();
    }
    assert!(child.wait().unwrap().success());
    finalize_clean(parent);
}

/// The child process of [`two_processes`]: echoes every PING, reassembles
/// the bulk buffer and reports on it, and finalizes on `quit`.
pub(crate) fn two_processes_child<P: Provider>(make: Make<'_, P>) {
    let peer = unhex(&std::env::var("UDBTL_TEST_PEER_MODEX").unwrap());
    let mut btl = make(unreliable());
    let got = inbox(&mut btl, &[PING, BULK]);
    println!("MODEX {}", hex(&btl.modex()));
    std::io::stdout().flush().unwrap();
    let ep = btl.add_procs(&[Some(&peer)]).unwrap()[0].endpoints[0].unwrap();
    let mut bulk = vec![0u8; 1 << 20];
    let mut bulk_bytes = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        btl.progress();
        let batch: Vec<(Tag, Vec<u8>)> = got
            .lock()
            .unwrap()
            .drain(..)
            .map(|(_, tag, bytes)| (tag, bytes))
            .collect();
        for (tag, bytes) in batch {
            if tag == BULK {
                let offset = u64::from_be_bytes(bytes[..8].try_into().unwrap()) as usize;
                bulk[offset..offset + bytes.len() - 8].copy_from_slice(&bytes[8..]);
                bulk_bytes += bytes.len() - 8;
                if bulk_bytes == bulk.len() {
                    let ok = bulk.iter().enumerate().all(|(i, b)| *b == bulk_byte(i));
                    let verdict = format!(
                        "BULK {} bytes {}",
                        bulk.len(),
                        if ok { "ok" } else { "corrupt" }
                    );
                    send(&mut btl, ep, PONG, verdict.as_bytes());
                }
            } else if bytes == b"quit" {
                for _ in 0..100 {
                    btl.progress();
                }
                finalize_clean(btl);
                return;
            } else {
                send(&mut btl, ep, PONG, &bytes);
            }
        }
    }
    panic!("child timed out");
}

/// Writes the suite's `#[test]`s for one provider into the calling module.
///
/// * `provider_suite!(make $(, #[attr])*)`: `make` is an expression giving
///   `Option<impl Fn(BtlConfig) -> Component<P>>`; `None` skips every test
///   at run time (it has said why, see udbtl-prereq's `skipped!`). Each
///   attribute goes on every test, e.g. a `cfg_attr(..., ignore = ...)`
///   for a provider that needs a device.
/// * `provider_suite!(@absent "SKIPPED: <reason>")`: the same tests,
///   ignored with that reason, for a provider this build lacks, so that the
///   summary counts them.
// Not every test crate that uses this module writes a suite.
#[allow(unused_macros)]
macro_rules! provider_suite {
    (@absent $reason:literal) => {
        $crate::suite::provider_suite!(@absent $reason, modex_and_add_procs
            tagged_sends_arrive_once_in_order zero_copy_sends_through_the_registration_cache
            del_procs_fails_pending_sends finalize_reports_leaked_descriptors two_processes);
    };
    (@absent $reason:literal, $($test:ident)*) => {
        $(#[test] #[ignore = $reason] fn $test() {})*
    };
    ($make:expr $(, #[$attr:meta])* $(,)?) => {
        #[test]
        $(#[$attr])*
        fn modex_and_add_procs() {
            if let Some(make) = $make {
                $crate::suite::modex_and_add_procs(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn tagged_sends_arrive_once_in_order() {
            if let Some(make) = $make {
                $crate::suite::tagged_sends_arrive_once_in_order(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn zero_copy_sends_through_the_registration_cache() {
            if let Some(make) = $make {
                $crate::suite::zero_copy_sends_through_the_registration_cache(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn del_procs_fails_pending_sends() {
            if let Some(make) = $make {
                $crate::suite::del_procs_fails_pending_sends(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn finalize_reports_leaked_descriptors() {
            if let Some(make) = $make {
                $crate::suite::finalize_reports_leaked_descriptors(&make);
            }
        }

        #[test]
        $(#[$attr])*
        fn two_processes() {
            if let Some(make) = $make {
                // The child's test name, without the crate's own.
                let path = module_path!();
                let module = path.split_once("::").map_or(path, |(_, rest)| rest);
                $crate::suite::two_processes(&make, &format!("{module}::two_processes_child"));
            }
        }

        #[test]
        #[ignore = "child process of two_processes"]
        fn two_processes_child() {
            if let Some(make) = $make {
                $crate::suite::two_processes_child(&make);
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use provider_suite;
