//! Completion channels: a `udp` channel blocks until a datagram arrives for a
//! queue pair on its completion queue, a timeout passes or a waker is woken;
//! providers that cannot block a thread offer none.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;
use udbtl_fabric::faulty::{FaultConfig, FaultyContext};
use udbtl_fabric::sim::SimNetwork;
use udbtl_fabric::udp::{UdpConfig, UdpContext, UdpProvider};
use udbtl_fabric::*;

/// How long a wait that must time out waits.
const SHORT: Duration = Duration::from_millis(30);
/// The bound on a wait that must end for another reason; reaching it fails
/// the test rather than hanging it.
const LONG: Duration = Duration::from_secs(5);

fn open() -> UdpContext {
    let provider = UdpProvider::new(UdpConfig::default());
    let devices = provider.devices().unwrap();
    assert!(!devices.is_empty(), "no loopback device");
    provider.open(&devices[0].name).unwrap()
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_inline_data: 64,
    }
}

/// Sends one datagram to `qpn` from a fresh context on another thread.
fn send_from_another_thread(dest: NodeAddr, qpn: u32) {
    thread::spawn(move || {
        let mut a = Endpoint::new(open(), 1, QKEY);
        let ah = a.ah(dest);
        a.send(ah, qpn, QKEY, b"ping", 1).unwrap();
        assert_eq!(a.poll_for(1, LONG).len(), 1, "send completion");
    })
    .join()
    .unwrap();
}

#[test]
fn channels_and_wakers_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<CompletionChannel>();
    check::<Waker>();
}

#[test]
fn a_wait_times_out_when_nothing_arrives() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    assert_eq!(
        channel.wait(Some(Duration::ZERO)).unwrap(),
        Wakeup::TimedOut
    );
    b.teardown(&[]);
}

#[test]
fn a_datagram_for_a_queue_pair_on_the_cq_makes_the_channel_ready_until_polled() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    send_from_another_thread(NodeAddr::Ip(b.ctx.ip()), b.qp.qp_num);
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Ready);
    // Level-triggered: still ready while the datagram is unread.
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::Ready);
    let got = b.poll_for(1, LONG);
    assert_eq!(got.len(), 1);
    assert_eq!(b.payload(&got[0]), b"ping");
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    b.teardown(&[]);
}

#[test]
fn a_blocked_wait_sees_a_datagram_sent_while_it_waits() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    let waiter = thread::spawn(move || channel.wait(Some(LONG)).unwrap());
    thread::sleep(Duration::from_millis(10));
    send_from_another_thread(NodeAddr::Ip(b.ctx.ip()), b.qp.qp_num);
    assert_eq!(waiter.join().unwrap(), Wakeup::Ready);
    assert_eq!(b.poll_for(1, LONG).len(), 1);
    b.teardown(&[]);
}

#[test]
fn a_datagram_for_another_cq_does_not_make_the_channel_ready() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let other_cq = b.ctx.create_cq(16).unwrap();
    let other = ud_qp(&mut b.ctx, b.pd, other_cq, cap(), QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    send_from_another_thread(NodeAddr::Ip(b.ctx.ip()), other.qp_num);
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    b.ctx.destroy_qp(other.handle).unwrap();
    b.ctx.destroy_cq(other_cq).unwrap();
    b.teardown(&[]);
}

#[test]
fn a_waker_on_another_thread_wakes_a_blocked_wait_once() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = Arc::new(b.ctx.completion_channel(b.cq).unwrap().unwrap());
    let waker = channel.waker();
    let waiter = {
        let channel = Arc::clone(&channel);
        thread::spawn(move || channel.wait(Some(LONG)).unwrap())
    };
    thread::sleep(Duration::from_millis(10));
    thread::spawn(move || waker.wake()).join().unwrap();
    assert_eq!(waiter.join().unwrap(), Wakeup::Woken);
    // The wakeup was consumed.
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    b.teardown(&[]);
}

#[test]
fn a_wake_before_the_wait_is_kept_for_it_and_repeated_wakes_fold() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    let waker = channel.waker();
    waker.wake();
    waker.clone().wake();
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Woken);
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    b.teardown(&[]);
}

#[test]
fn a_queue_pair_created_after_the_channel_is_watched() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    let late = ud_qp(&mut b.ctx, b.pd, b.cq, cap(), QKEY);
    send_from_another_thread(NodeAddr::Ip(b.ctx.ip()), late.qp_num);
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Ready);
    b.ctx.destroy_qp(late.handle).unwrap();
    b.teardown(&[]);
}

#[test]
fn a_destroyed_queue_pair_stops_being_watched_and_breaks_nothing() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let doomed = ud_qp(&mut b.ctx, b.pd, b.cq, cap(), QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    // A datagram left unread on the doomed queue pair makes the channel
    // ready; once the queue pair is destroyed it no longer does.
    send_from_another_thread(NodeAddr::Ip(b.ctx.ip()), doomed.qp_num);
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Ready);
    b.ctx.destroy_qp(doomed.handle).unwrap();
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    // A new queue pair may reuse the descriptor number; the channel watches
    // it because it is on the same CQ, and the surviving one still works.
    let fresh = ud_qp(&mut b.ctx, b.pd, b.cq, cap(), QKEY);
    send_from_another_thread(NodeAddr::Ip(b.ctx.ip()), b.qp.qp_num);
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Ready);
    assert_eq!(b.poll_for(1, LONG).len(), 1);
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    b.ctx.destroy_qp(fresh.handle).unwrap();
    b.teardown(&[]);
}

#[test]
fn a_channel_outlives_its_context() {
    let mut b = Endpoint::new(open(), 4, QKEY);
    let channel = b.ctx.completion_channel(b.cq).unwrap().unwrap();
    let waker = channel.waker();
    let ip = b.ctx.ip();
    let qpn = b.qp.qp_num;
    send_from_another_thread(NodeAddr::Ip(ip), qpn);
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Ready);
    drop(b);
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    waker.wake();
    assert_eq!(channel.wait(Some(LONG)).unwrap(), Wakeup::Woken);
}

#[test]
fn a_helper_waits_without_the_context_lock_while_the_owner_polls() {
    let b = Endpoint::new(open(), 4, QKEY);
    let (ip, qpn, cq) = (b.ctx.ip(), b.qp.qp_num, b.cq);
    let shared = Arc::new(Mutex::new(b));
    let channel = shared
        .lock()
        .unwrap()
        .ctx
        .completion_channel(cq)
        .unwrap()
        .unwrap();
    let helper = {
        let shared = Arc::clone(&shared);
        thread::spawn(move || {
            // Sleep unlocked; lock only to service what arrived.
            let wakeup = channel.wait(Some(LONG)).unwrap();
            let got = shared.lock().unwrap().poll_for(1, LONG);
            (wakeup, got.len())
        })
    };
    // The owner holds and uses the context meanwhile.
    {
        let mut owner = shared.lock().unwrap();
        let mut wcs = [WorkCompletion::EMPTY; 4];
        assert_eq!(owner.ctx.poll_cq(cq, &mut wcs).unwrap(), 0);
    }
    send_from_another_thread(NodeAddr::Ip(ip), qpn);
    assert_eq!(helper.join().unwrap(), (Wakeup::Ready, 1));
    let b = Arc::into_inner(shared).unwrap().into_inner().unwrap();
    b.teardown(&[]);
}

#[test]
fn a_channel_for_a_bad_cq_is_refused() {
    let mut ctx = open();
    let cq = ctx.create_cq(4).unwrap();
    ctx.destroy_cq(cq).unwrap();
    assert!(matches!(
        ctx.completion_channel(cq),
        Err(FabricError::InvalidHandle { .. })
    ));
}

#[test]
fn sim_offers_no_channel_and_faulty_answers_as_its_inner_provider() {
    let net = SimNetwork::new(7);
    let host = net.add_device("hca0", 1).unwrap();
    let mut sim = host.open("hca0").unwrap();
    let cq = sim.create_cq(4).unwrap();
    assert!(sim.completion_channel(cq).unwrap().is_none());

    let config = FaultConfig {
        drop: 0.1,
        ..FaultConfig::default()
    };
    let mut faulty_sim = FaultyContext::wrap(host.open("hca0").unwrap(), config, 1).unwrap();
    let cq = faulty_sim.create_cq(4).unwrap();
    assert!(faulty_sim.completion_channel(cq).unwrap().is_none());

    let mut faulty_udp = Endpoint::new(FaultyContext::wrap(open(), config, 1).unwrap(), 4, QKEY);
    let channel = faulty_udp
        .ctx
        .completion_channel(faulty_udp.cq)
        .unwrap()
        .unwrap();
    assert_eq!(channel.wait(Some(SHORT)).unwrap(), Wakeup::TimedOut);
    faulty_udp.teardown(&[]);
}
