//! No heap allocation per eager message, on the send path or the receive
//! path, once a module has warmed up.
//!
//! Two modules in this process talk over the real `udp` provider on
//! loopback (reliable, the default). A counting global allocator counts
//! every `alloc`, `alloc_zeroed` and `realloc` made by the measuring thread
//! while it is armed; each scenario warms up first (free lists, queues and
//! maps reach their steady capacity), then measures, and the count must be
//! zero:
//!
//! * ping-pong with `Module::alloc` + `send`, progress-driven (the receive
//!   callbacks run inside `Component::progress`), 8 B and 1 KiB;
//! * ping-pong with `Module::send_message` of a message within the eager
//!   limit (one datagram), 8 B and 1 KiB;
//! * streaming: windows of 64 eager sends, then every acknowledgement;
//! * the host-driven path: `Module::poll`, `next_event`, `finish`
//!   (ping-pong, and streaming).
//!
//! A second pair, with a window of 8 datagrams, streams far ahead of it, so
//! that most messages are coalesced (`coalesce`, on by default): packing on
//! the send side and splitting on both receive paths are measured as well.
//!
//! The progress helper thread is off, so that all of the module's work
//! happens on the measuring thread and is counted (and the run does not
//! depend on how the helper is scheduled).
//!
//! To see where an allocation comes from, run with
//! `UDBTL_ALLOC_TRACE=N cargo test -p udbtl-btl --test no_alloc -- --nocapture`:
//! the first N counted allocations print a backtrace.
//!
//! Everything runs in one `#[test]`, sequentially, so that no other test
//! thread of this binary runs while a window is measured (counting is per
//! thread anyway).

// A global allocator is an `unsafe impl GlobalAlloc`, and forwarding to
// `System` takes unsafe calls; the workspace denies unsafe code otherwise.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

// ----- the counting allocator --------------------------------------------------

/// `System`, counting the allocations of armed threads.
struct Counting;

/// Allocations counted so far (armed threads only).
static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Print a backtrace for the first counted allocations
/// (`UDBTL_ALLOC_TRACE`).
static TRACE: AtomicBool = AtomicBool::new(false);
/// Backtraces still to print.
static TRACES_LEFT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Whether this thread's allocations are counted. A const-initialized
    /// `Cell` needs no allocation and no destructor, so the allocator may
    /// read it.
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

fn armed() -> bool {
    ARMED.try_with(Cell::get).unwrap_or(false)
}

fn arm(on: bool) {
    // Outside thread teardown, where this test never is.
    let _ = ARMED.try_with(|a| a.set(on));
}

/// Counts one allocation if this thread is armed; with tracing on, prints
/// where it came from (disarmed meanwhile, as printing allocates).
fn note(kind: &str, size: usize) {
    if !armed() {
        return;
    }
    let n = ALLOCS.fetch_add(1, Ordering::Relaxed) + 1;
    if TRACE.load(Ordering::Relaxed)
        && TRACES_LEFT
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    {
        arm(false);
        let trace = Backtrace::force_capture();
        eprintln!("counted allocation {n}: {kind} of {size} bytes at\n{trace}");
        arm(true);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; counting touches only an
// atomic and a const-initialized thread-local, and never allocates itself
// (the backtrace is taken with this thread disarmed, so its own
// allocations only reach `System`).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note("alloc", layout.size());
        // SAFETY: the caller's contract for `alloc` is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note("alloc_zeroed", layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed` is `System`'s.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note("realloc", new_size);
        // SAFETY: `ptr` was allocated by this allocator, that is by
        // `System`, with `layout`; the rest is the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, that is by
        // `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` with this thread armed; returns the allocations it made.
fn count_allocs(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    arm(true);
    f();
    arm(false);
    ALLOCS.load(Ordering::Relaxed) - before
}

#[test]
fn counting_allocator_counts() {
    // Not a scenario: the check that the counter sees what it must. It
    // runs on its own test thread, and counting is per thread.
    let n = count_allocs(|| drop(std::hint::black_box(vec![1u8; 100])));
    assert_eq!(n, 1);
    let n = count_allocs(|| {
        let mut v = Vec::<u64>::with_capacity(1);
        v.extend(0..100);
        std::hint::black_box(&v);
    });
    assert!(n >= 2, "alloc and at least one realloc, got {n}");
}

// ----- the transport -------------------------------------------------------

type Btl = Component<UdpProvider>;

const PING: Tag = Tag(Tag::PML.0 + 1);
const PONG: Tag = Tag(Tag::PML.0 + 2);
const STREAM: Tag = Tag(Tag::PML.0 + 3);

/// Messages per warm-up.
const WARMUP: usize = 2_000;
/// Round trips measured on the main path (`alloc` + `send`, 8 B), and on
/// each other path (fewer, to keep a debug build's run short).
const ROUND_TRIPS: usize = 10_000;
const ROUND_TRIPS_OTHER: usize = 2_500;
/// Streaming: sends per window, and windows measured.
const WINDOW: usize = 64;
const WINDOWS: usize = 200;
/// Eager sizes measured.
const SIZES: [usize; 2] = [8, 1024];

/// How long any one wait may take before the test gives up (a lost
/// loopback datagram is repaired by retransmission well within it).
const STUCK: Duration = Duration::from_secs(20);

/// A component; `rel_window`, when given, bounds the datagrams in flight.
fn component(rel_window: Option<u32>) -> Btl {
    let config = BtlConfig {
        rd_num: Some(512),
        rel_window,
        progress_thread: Some(false),
        job_key: Some(0xa110c),
        ..BtlConfig::default()
    };
    let params = Params::load_from(&config, |_| None).expect("parameters");
    Component::init(UdpProvider::new(udp_config(&params)), params).expect("udp component")
}

/// What one side has received: messages and the bytes they carried.
#[derive(Default)]
struct Tally {
    messages: AtomicUsize,
    bytes: AtomicUsize,
}

impl Tally {
    fn messages(&self) -> usize {
        self.messages.load(Ordering::Relaxed)
    }

    fn add(&self, payload: &[u8], expected_len: &AtomicUsize) {
        assert_eq!(payload.len(), expected_len.load(Ordering::Relaxed));
        assert!(payload.iter().all(|&b| b == 0xa5), "payload intact");
        self.bytes.fetch_add(payload.len(), Ordering::Relaxed);
        self.messages.fetch_add(1, Ordering::Relaxed);
    }
}

/// One side: its component, its endpoint for the other side, what it
/// received.
struct Side {
    btl: Btl,
    peer: EndpointId,
    got: Arc<Tally>,
}

impl Side {
    fn module(&mut self) -> &mut Module<udbtl_fabric::udp::UdpContext> {
        &mut self.btl.modules_mut()[0]
    }

    /// Sends `payload` to the peer in a fragment from `alloc`, if one is
    /// free; says whether it was.
    fn try_alloc_send(&mut self, tag: Tag, payload: &[u8]) -> bool {
        let peer = self.peer;
        let module = self.module();
        let Some(des) = module.alloc(NO_ORDER, payload.len(), DesFlags::BTL_OWNERSHIP) else {
            return false;
        };
        module
            .segment_mut(des)
            .expect("segment")
            .copy_from_slice(payload);
        module.send(peer, des, tag).expect("send");
        true
    }
}

/// Two connected sides whose receive callbacks, for every tag used here,
/// count into their tallies; `len` is the payload length they expect.
fn pair(len: &Arc<AtomicUsize>, rel_window: Option<u32>) -> (Side, Side) {
    let mut a = component(rel_window);
    let mut b = component(rel_window);
    assert_eq!(a.modules().len(), 1, "one loopback module");
    let (blob_a, blob_b) = (a.modex(), b.modex());
    let to_b = a.add_procs(&[Some(&blob_b)]).expect("add b")[0].endpoints[0].expect("b reachable");
    let to_a = b.add_procs(&[Some(&blob_a)]).expect("add a")[0].endpoints[0].expect("a reachable");
    let side = |mut btl: Btl, peer| {
        let got: Arc<Tally> = Arc::default();
        for tag in [PING, PONG, STREAM] {
            let (got, len) = (got.clone(), len.clone());
            btl.modules_mut()[0].register(
                tag,
                Box::new(move |ev: &RecvEvent<'_>| got.add(ev.payload, &len)),
            );
        }
        btl.modules_mut()[0]
            .register_error(Box::new(|ev: &ErrorEvent| panic!("error event: {ev:?}")));
        Side { btl, peer, got }
    };
    (side(a, to_b), side(b, to_a))
}

/// Progresses both sides until `done` holds.
fn drive(a: &mut Side, b: &mut Side, mut done: impl FnMut(&mut Side, &mut Side) -> bool) {
    let start = Instant::now();
    while !done(a, b) {
        a.btl.progress();
        b.btl.progress();
        assert!(start.elapsed() < STUCK, "stuck");
    }
}

/// How a side sends one eager message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    /// `Module::alloc`, `segment_mut`, `send`.
    Alloc,
    /// `Module::send_message`.
    Message,
}

/// Sends `payload` from `from` to its peer with `api`, progressing both
/// sides while no send fragment is free.
fn send(api: Api, from: &mut Side, other: &mut Side, tag: Tag, payload: &[u8]) {
    match api {
        Api::Alloc => {
            while !from.try_alloc_send(tag, payload) {
                from.btl.progress();
                other.btl.progress();
            }
        }
        Api::Message => {
            let peer = from.peer;
            from.module()
                .send_message(peer, tag, payload)
                .expect("send_message");
        }
    }
}

/// `count` round trips: `a` sends a ping, `b` answers each with a pong.
fn ping_pong(api: Api, a: &mut Side, b: &mut Side, payload: &[u8], count: usize) {
    for _ in 0..count {
        let (a_had, b_had) = (a.got.messages(), b.got.messages());
        send(api, a, b, PING, payload);
        drive(a, b, |_, b| b.got.messages() > b_had);
        send(api, b, a, PONG, payload);
        drive(a, b, |a, _| a.got.messages() > a_had);
    }
}

/// `windows` windows of [`WINDOW`] sends from `a`, each followed by every
/// acknowledgement.
fn stream(api: Api, a: &mut Side, b: &mut Side, payload: &[u8], windows: usize) {
    for _ in 0..windows {
        let b_had = b.got.messages();
        for _ in 0..WINDOW {
            send(api, a, b, STREAM, payload);
        }
        drive(a, b, |a, b| {
            b.got.messages() == b_had + WINDOW && a.module().unacknowledged() == 0
        });
    }
}

/// Host-driven progress of one side: `poll`, then every event through
/// `next_event` and `finish`, counting received messages as its callbacks
/// would.
fn host_progress(side: &mut Side, len: &AtomicUsize) {
    let module = &mut side.btl.modules_mut()[0];
    module.poll();
    while let Some(event) = module.next_event() {
        match &event {
            HostEvent::Received(received) => {
                // SAFETY: the payload stays valid until `finish`.
                let payload = unsafe {
                    std::slice::from_raw_parts(received.payload_ptr(), received.payload_len())
                };
                side.got.add(payload, len);
            }
            HostEvent::Sent { event, .. } => assert!(event.status.is_ok(), "{event:?}"),
            HostEvent::Error(event) => panic!("error event: {event:?}"),
            HostEvent::ReadDone(event) => panic!("no read was asked for: {event:?}"),
        }
        module.finish(event);
    }
}

/// Sends `payload` from `from` to its peer with `Module::alloc` + `send`,
/// progressing both host-driven sides while no fragment is free.
fn host_send(from: &mut Side, other: &mut Side, payload: &[u8], len: &AtomicUsize, tag: Tag) {
    let start = Instant::now();
    while !from.try_alloc_send(tag, payload) {
        host_progress(from, len);
        host_progress(other, len);
        assert!(start.elapsed() < STUCK, "stuck");
    }
}

/// [`ping_pong`] with `Module::alloc` + `send`, both sides host-driven.
fn host_ping_pong(a: &mut Side, b: &mut Side, payload: &[u8], len: &AtomicUsize, count: usize) {
    let host_drive = |a: &mut Side, b: &mut Side, done: &dyn Fn(&Side, &Side) -> bool| {
        let start = Instant::now();
        while !done(a, b) {
            host_progress(a, len);
            host_progress(b, len);
            assert!(start.elapsed() < STUCK, "stuck");
        }
    };
    for _ in 0..count {
        let (a_had, b_had) = (a.got.messages(), b.got.messages());
        host_send(a, b, payload, len, PING);
        host_drive(a, b, &|_, b| b.got.messages() > b_had);
        host_send(b, a, payload, len, PONG);
        host_drive(a, b, &|a, _| a.got.messages() > a_had);
    }
}

/// [`stream`] with both sides host-driven: windows of [`WINDOW`] sends from
/// `a` (most of which ride coalesced behind the congestion window), each
/// followed by every acknowledgement.
fn host_stream(a: &mut Side, b: &mut Side, payload: &[u8], len: &AtomicUsize, windows: usize) {
    for _ in 0..windows {
        let b_had = b.got.messages();
        for _ in 0..WINDOW {
            host_send(a, b, payload, len, STREAM);
        }
        let start = Instant::now();
        while b.got.messages() < b_had + WINDOW || a.module().unacknowledged() > 0 {
            host_progress(a, len);
            host_progress(b, len);
            assert!(start.elapsed() < STUCK, "stuck");
        }
    }
}

/// Runs `run(count)` once to warm up with [`WARMUP`], then measured with
/// `measured`; asserts the measured window allocated nothing.
fn check(name: &str, measured: usize, mut run: impl FnMut(usize)) {
    let start = Instant::now();
    run(WARMUP);
    let allocs = count_allocs(|| run(measured));
    assert_eq!(
        allocs, 0,
        "{name}: {allocs} heap allocations in {measured} measured iterations \
         (UDBTL_ALLOC_TRACE=<how many> with --nocapture shows where)"
    );
    eprintln!(
        "{name}: 0 allocations in {measured} measured iterations ({:?})",
        start.elapsed()
    );
}

#[test]
fn eager_messages_allocate_nothing_once_warm() {
    if let Some(traces) = std::env::var("UDBTL_ALLOC_TRACE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        TRACES_LEFT.store(traces, Ordering::Relaxed);
        TRACE.store(traces > 0, Ordering::Relaxed);
    }
    let len = Arc::new(AtomicUsize::new(0));
    let (mut a, mut b) = pair(&len, None);
    for size in SIZES {
        assert!(size <= a.btl.modules()[0].limits().eager_limit);
        let payload = vec![0xa5u8; size];
        len.store(size, Ordering::Relaxed);
        for api in [Api::Alloc, Api::Message] {
            let round_trips = if (api, size) == (Api::Alloc, SIZES[0]) {
                ROUND_TRIPS
            } else {
                ROUND_TRIPS_OTHER
            };
            check(&format!("ping-pong {api:?} {size} B"), round_trips, |n| {
                ping_pong(api, &mut a, &mut b, &payload, n)
            });
            check(&format!("stream {api:?} {size} B"), WINDOWS * WINDOW, |n| {
                stream(api, &mut a, &mut b, &payload, n.div_ceil(WINDOW))
            });
        }
        check(
            &format!("host-driven ping-pong {size} B"),
            ROUND_TRIPS_OTHER,
            |n| host_ping_pong(&mut a, &mut b, &payload, &len, n),
        );
        check(
            &format!("host-driven stream {size} B"),
            WINDOWS * WINDOW,
            |n| host_stream(&mut a, &mut b, &payload, &len, n.div_ceil(WINDOW)),
        );
    }
    for side in [a, b] {
        for ctx in side.btl.finalize().expect("finalize") {
            assert!(udbtl_fabric::Context::resources(&ctx).is_empty());
        }
    }
    // Coalescing: with a window of 8 datagrams, each window of 64 sends
    // runs ahead of it whatever the congestion window has grown to (with
    // the default window, whether a stream coalesces depends on how fast
    // acknowledgements come back), so packing on the send side and
    // splitting on both receive paths are measured.
    let (mut a, mut b) = pair(&len, Some(8));
    for size in SIZES {
        let payload = vec![0xa5u8; size];
        len.store(size, Ordering::Relaxed);
        check(
            &format!("coalesced stream {size} B"),
            WINDOWS * WINDOW,
            |n| stream(Api::Alloc, &mut a, &mut b, &payload, n.div_ceil(WINDOW)),
        );
        check(
            &format!("coalesced host-driven stream {size} B"),
            WINDOWS * WINDOW,
            |n| host_stream(&mut a, &mut b, &payload, &len, n.div_ceil(WINDOW)),
        );
    }
    assert!(a.btl.modules()[0].stats().messages_coalesced > 0);
    for side in [a, b] {
        for ctx in side.btl.finalize().expect("finalize") {
            assert!(udbtl_fabric::Context::resources(&ctx).is_empty());
        }
    }
}
