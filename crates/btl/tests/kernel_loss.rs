//! Full delivery through real kernel drops: in a network namespace this test
//! creates (`unshare -n`), an nftables rule on the input hook drops 5 % of
//! UDP at random (`numgen random mod 100 < 5 drop`), and two reliable BTL
//! modules on real UDP sockets exchange 20 000 checked messages.
//!
//! Needs root, `unshare` and `nft`; CI has them. Elsewhere it is ignored
//! (`SKIPPED: ...`), or, when one went missing since the build, says it
//! is skipped and records it (see udbtl-prereq). Drops are on INPUT, never
//! OUTPUT: there `sendmsg` fails with EPERM instead of the datagram being
//! lost.

#![allow(clippy::unwrap_used)]

mod common;
use common::host::{run, run_in_new_netns};
use udbtl_prereq::Prereq;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "root",
        udbtl_missing = "nft",
        udbtl_missing = "unshare"
    ),
    ignore = "SKIPPED: needs root, nft and unshare (CI has them)"
)]
fn reliable_delivery_through_nftables_drops() {
    udbtl_prereq::require!(
        Prereq::Root,
        Prereq::Program("nft"),
        Prereq::Program("unshare")
    );
    run_in_new_netns("in_namespace");
}

#[test]
#[ignore = "runs inside the namespace of reliable_delivery_through_nftables_drops"]
fn in_namespace() {
    run("ip link set lo up");
    run("nft add table inet udbtl_loss");
    run("nft 'add chain inet udbtl_loss in { type filter hook input priority 0; }'");
    run(
        "nft add rule inet udbtl_loss in meta l4proto udp numgen random mod 100 '<' 5 counter drop",
    );
    let params = Params::load_from(
        &BtlConfig {
            rd_num: Some(1024),
            // One message per datagram, so that the kernel drops messages
            // (coalesced, the 20 000 fill about a hundred 64 KiB datagrams;
            // `coalesce.rs` covers that).
            coalesce: Some(false),
            ..BtlConfig::default()
        },
        |_| None,
    )
    .unwrap();
    let component =
        || Component::init(UdpProvider::new(udp_config(&params)), params.clone()).unwrap();
    let (mut a, mut b) = (component(), component());
    let (ma, mb) = (a.modex(), b.modex());
    let ab = a.add_procs(&[Some(&mb)]).unwrap()[0].endpoints[0].unwrap();
    b.add_procs(&[Some(&ma)]).unwrap();
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = got.clone();
    b.modules_mut()[0].register(
        Tag::PML,
        Box::new(move |ev: &RecvEvent<'_>| sink.lock().unwrap().push(ev.payload.to_vec())),
    );
    const N: u32 = 20_000;
    let message = |i: u32| -> Vec<u8> { (0..64 + i % 512).map(|j| (i ^ j) as u8).collect() };
    for i in 0..N {
        let bytes = message(i);
        let module = &mut a.modules_mut()[0];
        let des = loop {
            if let Some(des) = module.alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP) {
                break des;
            }
            module.progress();
            b.progress();
        };
        let module = &mut a.modules_mut()[0];
        module.segment_mut(des).unwrap().copy_from_slice(&bytes);
        module.send(ab, des, Tag::PML).unwrap();
        b.progress();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (got.lock().unwrap().len() < N as usize || a.modules()[0].unacknowledged() > 0)
        && Instant::now() < deadline
    {
        a.progress();
        b.progress();
    }
    let got = got.lock().unwrap();
    assert_eq!(got.len(), N as usize, "every message, exactly once");
    assert!(
        got.iter().enumerate().all(|(i, m)| *m == message(i as u32)),
        "in order and intact"
    );
    let counters = Command::new("nft")
        .args(["list", "chain", "inet", "udbtl_loss", "in"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&counters.stdout);
    let dropped: u64 = listing
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let sent = a.modules()[0].stats().sends_posted;
    eprintln!("kernel dropped {dropped} datagrams; {sent} data datagrams posted for {N} messages");
    assert!(dropped > 500, "the rule really dropped: {listing}");
    assert!(sent > u64::from(N), "losses were retransmitted");
    drop(got);
    a.finalize().unwrap();
    b.finalize().unwrap();
    run("nft delete table inet udbtl_loss");
}
