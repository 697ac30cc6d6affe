//! A module takes in only datagrams that carry its admission: the Q_Key it
//! drew for its queue pairs, and the job key XORed with the mask it drew.
//! Both reach its peers through the modex and no one else.
//!
//! A stranger C in the same job (same job key, same parameters) sends to a
//! module B using B's published entry with the admission changed as a
//! forger who knows everything but the admission would have it. Its
//! datagrams are dropped and counted where the admission is checked: by
//! the fabric for a wrong Q_Key, by the module for an unmasked job key.
//! With B's true entry, C's datagrams get past the admission and are
//! dropped one layer later, as from a peer B does not know. Meanwhile A's
//! messages to B all arrive.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::Context;
use udbtl_fabric::udp::UdpProvider;
use udbtl_wire::modex;

/// A component on UDP loopback; `ib_qkey` fixes the Q_Key when given.
fn component(ib_qkey: Option<&str>) -> Component<UdpProvider> {
    let params = Params::load_from(
        &BtlConfig {
            rd_num: Some(256),
            sd_num: Some(64),
            ..BtlConfig::default()
        },
        |name| {
            ib_qkey
                .filter(|_| name == "UDBTL_IB_QKEY")
                .map(String::from)
        },
    )
    .unwrap();
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

fn published(btl: &Component<UdpProvider>) -> modex::Address {
    modex::parse_blob(&btl.modex()).unwrap()[0]
}

/// B's drop counters: wrong Q_Key (fabric), wrong job key, unknown peer.
fn drops(b: &Component<UdpProvider>) -> [u64; 3] {
    let module = &b.modules()[0];
    let s = module.stats();
    [
        module.with_context(|c| c.stats()).rx_bad_qkey,
        s.recv_bad_job_key,
        s.recv_unknown_peer,
    ]
}

/// A sends `n` messages to B while C sends to B through an endpoint made
/// from `b_as_c_sees_it`, until B has heard A's messages and counted some
/// of C's datagrams at `counter` (an index into [`drops`]); then C stops,
/// and B reads on until it has counted every datagram C transmitted there.
/// Returns B's counts.
fn run(b_as_c_sees_it: impl FnOnce(modex::Address) -> modex::Address, counter: usize) -> [u64; 3] {
    let (mut a, mut b, mut c) = (component(None), component(None), component(None));
    let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
    b.add_procs(&[Some(&a.modex())]).unwrap();
    let seen_by_c = modex::emit_blob(&[b_as_c_sees_it(published(&b))]).unwrap();
    let cb = c.add_procs(&[Some(&seen_by_c)]).unwrap()[0].endpoints[0].unwrap();
    let heard: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let sink = heard.clone();
    b.modules_mut()[0].register(
        Tag::PML,
        Box::new(move |ev: &RecvEvent<'_>| sink.lock().unwrap().push(ev.payload.to_vec())),
    );
    let before = drops(&b);
    let counted = |b: &Component<UdpProvider>| drops(b)[counter] - before[counter];
    let n = 200usize;
    let mut sent = 0usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while heard.lock().unwrap().len() < n || counted(&b) == 0 {
        assert!(Instant::now() < deadline, "timed out");
        if sent < n
            && a.modules_mut()[0]
                .send_message(ab, Tag::PML, b"real")
                .is_ok()
        {
            sent += 1;
        }
        // C's sends are refused once its window to B is full: B never
        // acknowledges them.
        let _ = c.modules_mut()[0].send_message(cb, Tag::PML, b"forged");
        a.progress();
        b.progress();
        c.progress();
    }
    let transmitted = c.modules()[0].with_context(|ctx| ctx.stats()).tx_datagrams;
    c.finalize().unwrap();
    while counted(&b) < transmitted {
        assert!(
            Instant::now() < deadline,
            "timed out: {} of {transmitted}",
            counted(&b)
        );
        a.progress();
        b.progress();
    }
    let heard = heard.lock().unwrap();
    assert_eq!(heard.len(), n, "A's messages, once each");
    assert!(
        heard.iter().all(|m| m == b"real"),
        "nothing of C's delivered"
    );
    let after = drops(&b);
    core::array::from_fn(|i| after[i] - before[i])
}

#[test]
fn every_module_draws_its_own_admission_unless_the_qkey_is_fixed() {
    let (x, y) = (published(&component(None)), published(&component(None)));
    assert_ne!(x.admission, y.admission);
    assert!(x.admission.qkey <= modex::Admission::MAX_QKEY);
    let fixed = published(&component(Some("0x01330133")));
    assert_eq!(
        fixed.admission,
        modex::Admission {
            qkey: 0x0133_0133,
            job_key_mask: 0,
        }
    );
}

#[test]
fn a_datagram_with_the_wrong_qkey_dies_in_the_fabric() {
    let counts = run(
        |b| modex::Address {
            admission: modex::Admission {
                qkey: b.admission.qkey ^ 1,
                ..b.admission
            },
            ..b
        },
        0,
    );
    println!("wrong Q_Key: bad qkey, bad job key, unknown peer = {counts:?}");
    assert_eq!(counts[1..], [0, 0]);
}

#[test]
fn a_datagram_with_the_job_key_unmasked_is_dropped_as_another_jobs() {
    let counts = run(
        |b| modex::Address {
            admission: modex::Admission {
                job_key_mask: 0,
                ..b.admission
            },
            ..b
        },
        1,
    );
    println!("unmasked job key: bad qkey, bad job key, unknown peer = {counts:?}");
    assert_eq!([counts[0], counts[2]], [0, 0]);
}

#[test]
fn with_the_admission_a_stranger_gets_one_layer_further() {
    let counts = run(|b| b, 2);
    println!("true admission: bad qkey, bad job key, unknown peer = {counts:?}");
    assert_eq!(counts[..2], [0, 0]);
}
