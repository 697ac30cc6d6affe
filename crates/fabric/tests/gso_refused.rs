//! A kernel that refuses UDP GSO: the provider resends the refused train one
//! datagram at a time, turns GSO off for the context, and loses nothing.
//!
//! The kernel refuses a GSO send (EINVAL) on a socket with `SO_NO_CHECK`,
//! since segmentation needs the UDP checksum. This file holds one test, so
//! that it runs in a process of its own: no other test's sockets exist to be
//! touched by the option.

#![allow(clippy::unwrap_used, unsafe_code)]

mod common;

use std::collections::HashSet;
use std::os::fd::RawFd;
use std::time::Duration;

use common::*;
use udbtl_fabric::udp::{UdpConfig, UdpProvider};
use udbtl_fabric::*;

const WAIT: Duration = Duration::from_secs(5);

/// The socket descriptors this process holds.
fn sockets() -> HashSet<RawFd> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            target
                .to_string_lossy()
                .starts_with("socket:")
                .then(|| entry.file_name().to_string_lossy().parse().ok())
                .flatten()
        })
        .collect()
}

#[test]
fn a_refused_gso_train_is_resent_datagram_by_datagram() {
    let p = UdpProvider::new(UdpConfig {
        gso: true,
        gro: false,
        mtu: Some(1400),
        ..UdpConfig::default()
    });
    let dev = p.devices().unwrap()[0].name.clone();
    let mut b = Endpoint::new(p.open(&dev).unwrap(), 64, QKEY);
    let before = sockets();
    let mut a = Endpoint::new(p.open(&dev).unwrap(), 4, QKEY);
    let senders: Vec<RawFd> = sockets().difference(&before).copied().collect();
    assert!(!senders.is_empty(), "the sender's sockets are found");
    for fd in senders {
        let on: libc::c_int = 1;
        // SAFETY: `fd` is an open socket of this process (a's queue pair);
        // the option value is a live c_int of the length passed.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                (&raw const on).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_NO_CHECK on fd {fd}");
    }
    let ah = a.ah(NodeAddr::Ip(b.ctx.ip()));
    // Two batches: the first train is refused and resent singly; the second
    // batch no longer tries GSO.
    post_forty(&mut a, ah, b.qp.qp_num, QKEY, 1400, 20);
    let sent = a.poll_for(40, WAIT);
    assert_eq!(sent.len(), 40);
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = b.poll_for(40, WAIT);
    let seen: Vec<u8> = got.iter().map(|wc| b.payload(wc)[0]).collect();
    assert_eq!(
        seen,
        (0..40).collect::<Vec<u8>>(),
        "every datagram, in order"
    );
    let stats = a.ctx.stats();
    assert_eq!(stats.tx_gso_trains, 0, "no train was accepted");
    assert_eq!(stats.tx_datagrams, 40);
}
