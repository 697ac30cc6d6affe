//! A flood: one peer sends at full rate, over real UDP sockets on loopback,
//! to a receiver that is slow to make progress.
//!
//! The sender (this thread) sends 200 000 small messages, two thousand of
//! the eager limit and a few multi-datagram ones, as fast as `alloc` and
//! `send` let it: when `alloc` finds no free fragment it progresses and
//! tries again, so the test itself queues nothing. The receiver (another
//! thread) sleeps 5 to 20 ms between short bursts of `progress`; meanwhile
//! only its progress helper thread services its socket, keeping in-order
//! data in a receive pool of 32 buffers, whose free share is the credit it
//! advertises.
//!
//! Asserted: every message arrives exactly once, in order, with its bytes;
//! the sender's fragments in use never exceed the free list's bound, its
//! queue of sends waiting for a send credit stays within that bound, and
//! its unacknowledged datagrams within the window; the process's resident
//! memory grows by less than 96 MiB (on loopback a send fragment holds
//! 64 KiB: the free list is bounded by `send_mem`, not only by the count
//! `send_frags_max`); and the sender was throttled: `alloc` refused it while
//! the receiver, away, took in no more datagrams than its pool holds.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

type Btl = Component<UdpProvider>;

const TAG: Tag = Tag(Tag::PML.0 + 9);
/// Messages in all.
const N: usize = 200_000;
/// Every this many messages is one of the eager limit.
const LARGE_EVERY: usize = 100;
/// Every this many messages is a multi-datagram one (`send_message`).
const HUGE_EVERY: usize = 25_000;
/// Receive buffers of the receiver: a small pool, so that a receiver away
/// for a few milliseconds runs out of credit.
const RECV_POOL: u32 = 32;
/// The allowed growth of the resident set: the send fragments' `send_mem`
/// (64 MiB, once every fragment has held an eager message) and room for the
/// rest (receive buffers that datagrams touched, queues, the test's own).
const RSS_BOUND: u64 = 96 << 20;

/// How long message `i` is.
fn len_of(i: usize, eager: usize) -> usize {
    if i % HUGE_EVERY == HUGE_EVERY - 1 {
        4 * eager + i % 1000
    } else if i % LARGE_EVERY == LARGE_EVERY - 1 {
        eager
    } else {
        8 + i % 57
    }
}

/// Bytes the messages are cut from.
fn pattern() -> Vec<u8> {
    (0..1usize << 19)
        .map(|k| (k * 7 + (k >> 8)) as u8)
        .collect()
}

/// Fills `out` with message `i`'s bytes: its index, then bytes of `pattern`
/// from an offset that depends on the index, so a misplaced or mixed-up
/// message cannot pass for another.
fn fill(i: usize, pattern: &[u8], out: &mut [u8]) {
    let n = out.len();
    out[..4].copy_from_slice(&(i as u32).to_le_bytes());
    out[4..].copy_from_slice(&pattern[i % 4099..][..n - 4]);
}

fn matches(i: usize, eager: usize, pattern: &[u8], got: &[u8]) -> bool {
    got.len() == len_of(i, eager)
        && got[..4] == (i as u32).to_le_bytes()
        && got[4..] == pattern[i % 4099..][..got.len() - 4]
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

fn component(rd_num: Option<u32>) -> Btl {
    let params = Params::load_from(
        &BtlConfig {
            rd_num,
            ..BtlConfig::default()
        },
        |_| None,
    )
    .unwrap();
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

/// `in use`, `max` and `high water` of the `send frags` line of the dump.
fn send_frags(dump: &str) -> (usize, usize, usize) {
    let line = dump
        .lines()
        .find(|l| l.trim_start().starts_with("send frags"))
        .unwrap();
    let numbers: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    // "send frags N in use of LEN (max M, high water H)"
    (numbers[0], numbers[2], numbers[3])
}

#[test]
fn a_flood_into_a_slow_receiver_is_throttled_bounded_and_lossless() {
    let mut a = component(None);
    let mut b = component(Some(RECV_POOL));
    let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
    b.add_procs(&[Some(&a.modex())]).unwrap();
    let eager = a.modules()[0].limits().eager_limit;
    let pattern: Arc<[u8]> = pattern().into();
    assert!(pattern.len() >= 4099 + 4 * eager + 1000);
    assert_eq!(eager, b.modules()[0].limits().eager_limit);

    // The receiver checks each message as it comes and keeps none.
    let delivered = Arc::new(AtomicUsize::new(0));
    let wrong = Arc::new(AtomicUsize::new(0));
    {
        let (delivered, wrong, pattern) = (delivered.clone(), wrong.clone(), pattern.clone());
        b.modules_mut()[0].register(
            TAG,
            Box::new(move |ev: &RecvEvent<'_>| {
                let i = delivered.fetch_add(1, Ordering::Relaxed);
                if !matches(i, eager, &pattern, ev.payload)
                    && wrong.fetch_add(1, Ordering::Relaxed) == 0
                {
                    eprintln!("message {i} wrong: {} bytes", ev.payload.len());
                }
            }),
        );
    }
    let completed = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    {
        let (completed, failed) = (completed.clone(), failed.clone());
        a.modules_mut()[0].set_send_callback(Box::new(move |ev: &SendEvent| {
            completed.fetch_add(1, Ordering::Relaxed);
            if ev.status.is_err() {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let rss_before = rss_bytes();
    let deadline = Instant::now() + Duration::from_secs(60);
    let stop = Arc::new(AtomicBool::new(false));
    // Odd while the receiver naps: counts its naps and bursts.
    let nap = Arc::new(AtomicU64::new(0));
    let receiver = {
        let (delivered, stop, nap) = (delivered.clone(), stop.clone(), nap.clone());
        thread::spawn(move || {
            let naps = [5u64, 12, 20, 8, 15];
            let mut bursts = 0usize;
            while delivered.load(Ordering::Relaxed) < N && !stop.load(Ordering::Relaxed) {
                // Away: the helper thread stays asleep for naps this short,
                // so nothing acknowledges the sender or grants it credit.
                nap.fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(naps[bursts % naps.len()]));
                nap.fetch_add(1, Ordering::SeqCst);
                // A short burst: a few calls, each running the callbacks of
                // what they take in.
                for _ in 0..4 {
                    b.progress();
                }
                bursts += 1;
            }
            // The acknowledgements of the last deliveries.
            for _ in 0..100 {
                b.progress();
            }
            (b, bursts)
        })
    };

    let started = Instant::now();
    let mut refused = 0u64;
    let mut huge_sent = 0usize;
    // A multi-datagram message's pieces complete one by one.
    let mut huge_pieces = 0usize;
    let (mut posted, mut queued) = (0u64, 0u64);
    let (mut pending_max, mut unacked_max, mut rss_peak) = (0usize, 0usize, rss_before);
    let mut huge = Vec::new();
    // Datagrams sent for the first time during one nap of the receiver, at
    // most: (nap, sent when first seen in it, most since).
    let (mut this_nap, mut nap_start, mut nap_max) = (0u64, 0u64, 0u64);
    let mut watch_naps = |a: &Btl| {
        let seen = nap.load(Ordering::SeqCst);
        let sent = a.modules()[0].reliability_stats().unwrap().sent;
        if seen % 2 == 1 && nap.load(Ordering::SeqCst) == seen {
            if seen == this_nap {
                nap_max = nap_max.max(sent - nap_start);
            } else {
                (this_nap, nap_start) = (seen, sent);
            }
        }
    };
    let mut i = 0;
    while i < N {
        assert!(Instant::now() < deadline, "flood timed out at message {i}");
        let len = len_of(i, eager);
        let module = &mut a.modules_mut()[0];
        if len > eager {
            huge.resize(len, 0);
            fill(i, &pattern, &mut huge);
            module.send_message(ab, TAG, &huge).unwrap();
            huge_sent += 1;
            huge_pieces += len.div_ceil(eager);
            i += 1;
            continue;
        }
        let Some(des) = module.alloc(NO_ORDER, len, DesFlags::BTL_OWNERSHIP) else {
            // Back-pressure: no fragment is free until acknowledgements
            // return some.
            refused += 1;
            a.progress();
            watch_naps(&a);
            continue;
        };
        fill(i, &pattern, &mut module.segment_mut(des).unwrap());
        match module.send(ab, des, TAG).unwrap() {
            SendStatus::Posted => posted += 1,
            SendStatus::Queued => queued += 1,
        }
        i += 1;
        if i % 64 == 0 {
            watch_naps(&a);
        }
        if i % 2048 == 0 {
            let module = &a.modules()[0];
            pending_max = pending_max.max(module.pending_len());
            unacked_max = unacked_max.max(module.unacknowledged());
            rss_peak = rss_peak.max(rss_bytes());
        }
    }
    while (delivered.load(Ordering::Relaxed) < N || a.modules()[0].unacknowledged() > 0)
        && Instant::now() < deadline
    {
        a.progress();
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let (b, bursts) = receiver.join().unwrap();
    let rss_after = rss_bytes();
    rss_peak = rss_peak.max(rss_after);

    let sender = &a.modules()[0];
    let stats = sender.stats();
    let rel = sender.reliability_stats().unwrap();
    let brel = b.modules()[0].reliability_stats().unwrap();
    let fabric_a = sender.with_context(udbtl_fabric::Context::stats);
    let fabric_b = b.modules()[0].with_context(udbtl_fabric::Context::stats);
    let dump = sender.to_string();
    let (in_use, frags_max, high_water) = send_frags(&dump);
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    eprintln!(
        "flood: {N} messages ({huge_sent} multi-datagram, {} of {eager} bytes) in {elapsed:?}; \
         receiver bursts {bursts}, at most {nap_max} new datagrams sent during one of its naps",
        N / LARGE_EVERY - huge_sent
    );
    eprintln!(
        "flood: RSS before {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
        mib(rss_before),
        mib(rss_peak),
        mib(rss_after)
    );
    eprintln!(
        "flood: send frags high water {high_water} of max {frags_max}; pending high water {} \
         (sampled {pending_max}); unacknowledged sampled max {unacked_max}",
        stats.pending_high_water
    );
    eprintln!(
        "flood: alloc refused {refused} times; sends posted {posted} queued {queued}; \
         datagrams sent {} retransmitted {} (lost {}, tail probes {}, timeouts {}, spurious {}); \
         zero-window probes {}; coalesced {}",
        rel.sent,
        rel.retransmitted,
        rel.fast_retransmits,
        rel.tail_probes,
        rel.timeouts,
        rel.spurious_retransmits,
        rel.probes,
        stats.messages_coalesced
    );
    eprintln!(
        "flood: receiver: received {} duplicates {} out-of-order {} out-of-window {} refused \
         (no room) {}; fabric rx no buffer {}; sender fabric kernel drops {}",
        brel.received,
        brel.duplicates,
        brel.out_of_order,
        brel.out_of_window,
        brel.refused_no_room,
        fabric_b.rx_no_buffer,
        fabric_a.tx_kernel_drops
    );

    // Exactly once, in order, intact.
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "messages intact, in order"
    );
    assert_eq!(delivered.load(Ordering::Relaxed), N, "every message, once");
    assert_eq!(b.modules()[0].stats().recv_malformed, 0);
    assert_eq!(rel.peers_lost + brel.peers_lost, 0);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no send failed");
    assert_eq!(
        completed.load(Ordering::Relaxed) as usize,
        N - huge_sent + huge_pieces,
        "every send callback ran once"
    );
    assert_eq!(sender.unacknowledged(), 0);

    // Bounded: fragments, queues, memory.
    assert_eq!(in_use, 0, "every fragment came back");
    assert!(high_water <= frags_max, "{dump}");
    assert!(stats.pending_high_water <= frags_max, "{dump}");
    assert!(unacked_max <= frags_max, "{unacked_max} > {frags_max}");
    assert!(
        rss_peak - rss_before < RSS_BOUND,
        "resident memory grew by {:.1} MiB",
        mib(rss_peak - rss_before)
    );

    // Throttled: the sender ran out of fragments, and while the receiver
    // was away it sent no more new datagrams than the credit granted at
    // its last call, at most its pool less the reserve.
    assert!(refused > 0, "alloc never pushed back");
    assert!(nap_max > 0, "no nap was watched");
    assert!(
        nap_max <= u64::from(RECV_POOL),
        "{nap_max} datagrams sent during one nap"
    );
    // The default send_frags_max is lowered to fit send_mem on loopback.
    assert!(frags_max < 8192, "{dump}");
    drop(dump);
    a.finalize().unwrap();
    b.finalize().unwrap();
}
