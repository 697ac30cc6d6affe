//! Sealed datagrams (`UDBTL_AUTH=on` and `encrypt`) between two components
//! on UDP loopback: messages of every size, from empty to a train of
//! datagrams of the largest payload, arrive intact, in order and once, with
//! nothing refused on the way; at a 1500-byte MTU and at loopback's 64 KiB.
//! Modules sealed differently take nothing from each other.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

type Heard = Arc<Mutex<Vec<Vec<u8>>>>;

/// A component on UDP loopback with `UDBTL_AUTH=auth`, datagrams of at
/// most `mtu` bytes if given.
fn component(auth: &str, mtu: Option<usize>) -> Component<UdpProvider> {
    let mtu = mtu.map(|m| m.to_string());
    let params = Params::load_from(
        &BtlConfig {
            rd_num: Some(512),
            sd_num: Some(64),
            ..BtlConfig::default()
        },
        |name| match name {
            "UDBTL_AUTH" => Some(auth.to_owned()),
            "UDBTL_UDP_MTU" => mtu.clone(),
            _ => None,
        },
    )
    .unwrap();
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

/// Connects `a` to `b` both ways; what `b` hears on [`Tag::PML`] is kept.
fn connect(a: &mut Component<UdpProvider>, b: &mut Component<UdpProvider>) -> (EndpointId, Heard) {
    let ab = a.add_procs(&[Some(&b.modex())]).unwrap()[0].endpoints[0].unwrap();
    b.add_procs(&[Some(&a.modex())]).unwrap()[0].endpoints[0].unwrap();
    let heard: Heard = Arc::default();
    let sink = heard.clone();
    b.modules_mut()[0].register(
        Tag::PML,
        Box::new(move |ev: &RecvEvent<'_>| sink.lock().unwrap().push(ev.payload.to_vec())),
    );
    (ab, heard)
}

/// A message of `len` bytes that differs with `seed` everywhere.
fn message(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + seed * 7 + i / 251) as u8)
        .collect()
}

/// Sends every message of `sizes` from `a` to `b`, in order (every other
/// one with `send_message_shared`), and waits
/// until `b` heard them all (or a minute passed). `b` progresses on a thread
/// of its own meanwhile: `send_message` waits for `b`'s window to take what
/// it copied before it copies more, so `b` must acknowledge while `a` sends.
fn exchange(
    a: &mut Component<UdpProvider>,
    b: Component<UdpProvider>,
    ab: EndpointId,
    heard: &Heard,
    sizes: &[usize],
) -> Component<UdpProvider> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let expected = sizes.len();
    let listening = heard.clone();
    let receiver = std::thread::spawn(move || {
        let mut b = b;
        while listening.lock().unwrap().len() < expected && Instant::now() < deadline {
            b.progress();
        }
        b
    });
    let mut buffers = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        // Every other message from a shared buffer, sent without a copy: the
        // seal must never be written into it.
        let shared: Arc<[u8]> = message(len, i).into();
        loop {
            let module = &mut a.modules_mut()[0];
            let sent = if i % 2 == 1 {
                module.send_message_shared(ab, Tag::PML, &shared)
            } else {
                module.send_message(ab, Tag::PML, &shared)
            };
            if sent.is_ok() || Instant::now() >= deadline {
                break;
            }
            a.progress();
        }
        buffers.push(shared);
    }
    while !receiver.is_finished() {
        a.progress();
    }
    for (i, (buffer, &len)) in buffers.iter().zip(sizes).enumerate() {
        assert!(
            **buffer == message(len, i)[..],
            "message {i} was written to"
        );
    }
    receiver.join().unwrap()
}

#[test]
fn messages_of_every_size_arrive_intact_authenticated_and_encrypted() {
    for auth in ["on", "encrypt"] {
        for mtu in [Some(1500), None] {
            let (mut a, mut b) = (component(auth, mtu), component(auth, mtu));
            let (ab, heard) = connect(&mut a, &mut b);
            let eager = a.modules()[0].limits().eager_limit;
            let sizes = [
                0,
                1,
                100,
                eager - 1,
                eager,
                eager + 1,
                5 * eager + 3,
                1 << 20,
                8,
            ];
            let b = exchange(&mut a, b, ab, &heard, &sizes);
            let heard = heard.lock().unwrap();
            let context = format!("auth {auth}, mtu {mtu:?}, eager {eager}");
            assert_eq!(heard.len(), sizes.len(), "{context}");
            for (i, (got, len)) in heard.iter().zip(sizes).enumerate() {
                assert!(
                    *got == message(len, i),
                    "{context}: message {i} of {len} bytes"
                );
            }
            for (side, btl) in [("a", &a), ("b", &b)] {
                let s = btl.modules()[0].stats();
                assert_eq!(s.transmit_failures, 0, "{context}: {side}");
                assert_eq!(s.recv_unauthenticated, 0, "{context}: {side}");
                assert_eq!(s.recv_replayed, 0, "{context}: {side}");
            }
            let dump = b.modules()[0].to_string();
            assert!(dump.contains("integrity aes-256-gcm"), "{dump}");
            drop(heard);
            a.finalize().unwrap();
            b.finalize().unwrap();
        }
    }
}

/// A module that encrypts and one that only authenticates take nothing
/// from each other (counted as unauthenticated): a job set up half one way
/// and half the other cannot leak in clear what the first half meant to
/// hide, and the protection is part of every key.
#[test]
fn modules_sealed_differently_take_nothing_from_each_other() {
    let (mut plain, mut secret) = (
        component("on", Some(1500)),
        component("encrypt", Some(1500)),
    );
    let (to_secret, heard_by_secret) = connect(&mut plain, &mut secret);
    let (to_plain, heard_by_plain) = connect(&mut secret, &mut plain);
    let _ = plain.modules_mut()[0].send_message(to_secret, Tag::PML, &message(8, 0));
    let _ = secret.modules_mut()[0].send_message(to_plain, Tag::PML, &message(8, 1));
    // Until each side has refused something (a minute at most): then
    // nothing may have been heard.
    let refused = |btl: &Component<UdpProvider>| btl.modules()[0].stats().recv_unauthenticated > 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(refused(&plain) && refused(&secret)) && Instant::now() < deadline {
        plain.progress();
        secret.progress();
    }
    assert!(heard_by_secret.lock().unwrap().is_empty());
    assert!(heard_by_plain.lock().unwrap().is_empty());
    assert!(secret.modules()[0].stats().recv_unauthenticated > 0);
    assert!(plain.modules()[0].stats().recv_unauthenticated > 0);
}
