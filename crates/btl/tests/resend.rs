//! A resend asked for while the datagram it repeats has not left this host
//! (it waits for a send credit, sits in the batch being posted, or waits
//! in the send queue of a device that has not read it yet) leaves once
//! and never changes bytes a device may still read: the fragment's bytes
//! are sealed where they are, so posting them twice, or resealing them
//! before a device read the first post, would send one packet number
//! twice, which the peer counts as a replay. On the sim fabric's virtual
//! time, with authentication on.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Role, Stop, drive, drive_roles, inbox, mesh, node, node_device, node_on};
use udbtl_btl::*;
use udbtl_fabric::sim::SimNetwork;

#[test]
fn a_resend_of_a_datagram_still_waiting_for_a_send_credit_leaves_once() {
    let net = SimNetwork::new(31);
    let config = BtlConfig {
        rd_num: Some(512),
        sd_num: Some(2),
        auth: Some("on".into()),
        // Each message its own datagram.
        coalesce: Some(false),
        ..BtlConfig::default()
    };
    let mut nodes = vec![node(&net, "a", &config), node(&net, "b", &config)];
    let eps = mesh(&mut nodes);
    let got = inbox(&mut nodes[1], Tag::PML);
    let ab = eps[0][1].unwrap();
    // Three datagrams and two send credits: the third waits for one.
    for i in 0..3u8 {
        let module = &mut nodes[0].modules_mut()[0];
        let des = module.alloc(NO_ORDER, 8, DesFlags::BTL_OWNERSHIP).unwrap();
        module.segment_mut(des).unwrap().copy_from_slice(&[i; 8]);
        let status = module.send(ab, des, Tag::PML).unwrap();
        assert_eq!(
            status == SendStatus::Queued,
            i == 2,
            "datagram {i}: {status:?}"
        );
    }
    // The sender does not run for longer than its timers: when it does, its
    // credits come back, and its probe and retransmission timers ask for
    // the datagrams again, the waiting one among them.
    net.advance(Duration::from_secs(2));
    let stop = drive(&net, &mut nodes, Duration::from_secs(10), |_| {
        got.lock().unwrap().len() == 3
    });
    assert_eq!(stop, Stop::Done, "at {:?}", net.now());
    let got = got.lock().unwrap();
    let bytes: Vec<u8> = got.iter().map(|(_, b)| b[0]).collect();
    assert_eq!(bytes, [0, 1, 2], "each once, in order");
    let s = nodes[1].modules()[0].stats();
    assert_eq!(s.recv_replayed, 0, "a packet number came twice");
    assert_eq!(s.recv_unauthenticated, 0);
}

/// On a device that reads a send's bytes only when it sends them, as an
/// RDMA adapter does, a resend asked for while the first post of the same
/// datagram is still unread in its send queue goes from a copy and leaves
/// the fragment alone: resealing it in place would make the device read
/// the new packet number for both posts (and rewriting a plain header
/// could tear one it is reading).
#[test]
fn a_resend_leaves_a_datagram_the_device_has_not_read_yet_alone() {
    for auth in ["on", "off"] {
        let net = SimNetwork::new(32);
        let config = BtlConfig {
            rd_num: Some(512),
            auth: Some(auth.into()),
            coalesce: Some(false),
            ..BtlConfig::default()
        };
        let late = |name| node_device(name).with_late_send_reads();
        let mut nodes = vec![
            node_on(&net, late("a"), &config),
            node_on(&net, late("b"), &config),
        ];
        let eps = mesh(&mut nodes);
        let got = inbox(&mut nodes[1], Tag::PML);
        let ab = eps[0][1].unwrap();
        net.hold_sends(true);
        for i in 0..3u8 {
            let module = &mut nodes[0].modules_mut()[0];
            let des = module.alloc(NO_ORDER, 8, DesFlags::BTL_OWNERSHIP).unwrap();
            module.segment_mut(des).unwrap().copy_from_slice(&[i; 8]);
            module.send(ab, des, Tag::PML).unwrap();
        }
        // Nothing has left: the sender's probe and retransmission timers
        // ask for the datagrams again while the device holds the first
        // posts.
        let roles = [Role::Active, Role::Dead];
        let stop = drive_roles(&net, &mut nodes, &roles, Duration::from_millis(100), |_| {
            false
        });
        assert_eq!(stop, Stop::Limit);
        let resent = nodes[0].modules()[0]
            .reliability_stats()
            .map_or(0, |s| s.retransmitted);
        assert!(
            resent > 0,
            "auth {auth}: no resend while the device held the sends"
        );
        net.hold_sends(false);
        let stop = drive(&net, &mut nodes, Duration::from_secs(10), |_| {
            got.lock().unwrap().len() == 3
        });
        assert_eq!(stop, Stop::Done, "auth {auth}: at {:?}", net.now());
        let bytes: Vec<u8> = got.lock().unwrap().iter().map(|(_, b)| b[0]).collect();
        assert_eq!(bytes, [0, 1, 2], "auth {auth}: each once, in order");
        let s = nodes[1].modules()[0].stats();
        assert_eq!(
            s.recv_replayed, 0,
            "auth {auth}: a packet number came twice"
        );
        assert_eq!(s.recv_unauthenticated, 0, "auth {auth}");
        assert_eq!(
            s.recv_bad_checksum, 0,
            "auth {auth}: a copy's checksum is wrong"
        );
    }
}
