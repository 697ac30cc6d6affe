//! The BTL over the real `udp` provider, between two real processes: address
//! exchange through the modex blob, tagged sends both ways, the pending queue
//! with one send credit, and a zero-copy send of about 1 MiB cut into
//! datagrams.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::udp::UdpProvider;

type Btl = Component<UdpProvider>;

const PING: Tag = Tag(Tag::PML.0 + 1);
const PONG: Tag = Tag(Tag::PML.0 + 2);
const BULK: Tag = Tag(Tag::PML.0 + 3);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn component(config: BtlConfig) -> Btl {
    let params = Params::load_from(&config, |_| None).unwrap();
    Component::init(UdpProvider::new(udp_config(&params)), params).unwrap()
}

/// The seed's unreliable contract; `reliable.rs` tests the reliable path.
fn config() -> BtlConfig {
    BtlConfig {
        reliable: Some(false),
        rd_num: Some(256),
        sd_num: Some(1),
        job_key: Some(0x5eed),
        ..BtlConfig::default()
    }
}

type Inbox = Arc<Mutex<Vec<(Tag, Vec<u8>)>>>;

fn inbox(btl: &mut Btl, tags: &[Tag]) -> Inbox {
    let inbox: Inbox = Arc::default();
    for tag in tags {
        let sink = inbox.clone();
        btl.modules_mut()[0].register(
            *tag,
            Box::new(move |ev: &RecvEvent<'_>| {
                sink.lock().unwrap().push((ev.tag, ev.payload.to_vec()))
            }),
        );
    }
    inbox
}

fn send(btl: &mut Btl, ep: EndpointId, tag: Tag, bytes: &[u8]) {
    let module = &mut btl.modules_mut()[0];
    let des = module
        .alloc(NO_ORDER, bytes.len(), DesFlags::BTL_OWNERSHIP)
        .unwrap();
    module.segment_mut(des).unwrap().copy_from_slice(bytes);
    module.send(ep, des, tag).unwrap();
}

/// Sends a 1 MiB shared buffer zero-copy, `offset` in an 8-byte reserve.
fn send_bulk(btl: &mut Btl, ep: EndpointId, data: &Arc<[u8]>) -> usize {
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

#[test]
fn btl_between_two_processes_over_udp() {
    let mut parent = component(config());
    let got = inbox(&mut parent, &[PONG]);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "btl_child",
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
    let sizes = [1usize, 7, 8, 100, 1000, 4000, 20_000, eager];
    for (round, size) in sizes.iter().cycle().take(400).enumerate() {
        let payload: Vec<u8> = (0..*size).map(|i| (i + round) as u8).collect();
        let echoed = 'retry: loop {
            send(&mut parent, ep, PING, &payload);
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline {
                parent.progress();
                if let Some((tag, bytes)) = got.lock().unwrap().pop() {
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
    let data: Arc<[u8]> = (0..1u32 << 20)
        .map(|i| (i * 31 % 253) as u8)
        .collect::<Vec<u8>>()
        .into();
    let pieces = send_bulk(&mut parent, ep, &data);
    assert!(pieces > 10);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut echoes = 0;
    let mut verdict = None;
    while Instant::now() < deadline && verdict.is_none() {
        parent.progress();
        for (_, bytes) in got.lock().unwrap().drain(..) {
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
    for ctx in parent.finalize().unwrap() {
        assert!(udbtl_fabric::Context::resources(&ctx).is_empty());
    }
}

#[test]
#[ignore = "child process of btl_between_two_processes_over_udp"]
fn btl_child() {
    let peer = unhex(&std::env::var("UDBTL_TEST_PEER_MODEX").unwrap());
    let mut btl = component(config());
    let got = inbox(&mut btl, &[PING, BULK]);
    println!("MODEX {}", hex(&btl.modex()));
    std::io::stdout().flush().unwrap();
    let ep = btl.add_procs(&[Some(&peer)]).unwrap()[0].endpoints[0].unwrap();
    let mut bulk = vec![0u8; 1 << 20];
    let mut bulk_bytes = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        btl.progress();
        let batch: Vec<(Tag, Vec<u8>)> = got.lock().unwrap().drain(..).collect();
        for (tag, bytes) in batch {
            if tag == BULK {
                let offset = u64::from_be_bytes(bytes[..8].try_into().unwrap()) as usize;
                bulk[offset..offset + bytes.len() - 8].copy_from_slice(&bytes[8..]);
                bulk_bytes += bytes.len() - 8;
                if bulk_bytes == bulk.len() {
                    let ok = bulk
                        .iter()
                        .enumerate()
                        .all(|(i, b)| *b == (i as u32 * 31 % 253) as u8);
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
                btl.finalize().unwrap();
                return;
            } else {
                send(&mut btl, ep, PONG, &bytes);
            }
        }
    }
    panic!("child timed out");
}

#[test]
fn refused_posts_come_back_to_the_caller_or_the_callback() {
    let mut btl = component(config());
    let peer = component(config());
    // A peer address whose QP number is no UDP port: the provider refuses it
    // at post time, as verbs refuses a bad work request.
    let mut addrs = udbtl_wire::modex::parse_blob(&peer.modex()).unwrap();
    let good = btl.add_procs(&[Some(&peer.modex())]).unwrap()[0].endpoints[0].unwrap();
    addrs[0].qpns = [70_000; 4];
    let bad_blob = udbtl_wire::modex::emit_blob(&addrs).unwrap();
    let bad = btl.add_procs(&[Some(&bad_blob)]).unwrap()[0].endpoints[0].unwrap();
    let events: Arc<Mutex<Vec<SendEvent>>> = Arc::default();
    let sink = events.clone();
    let module = &mut btl.modules_mut()[0];
    module.set_send_callback(Box::new(move |ev: &SendEvent| {
        sink.lock().unwrap().push(ev.clone())
    }));

    // Posted directly: the error is returned and the credit kept.
    let des = module.alloc(NO_ORDER, 4, DesFlags::NONE).unwrap();
    let err = module.send(bad, des, PING).unwrap_err();
    assert!(matches!(err, BtlError::Post { .. }), "{err}");
    assert_eq!(module.send_credits(), 1);
    // The descriptor is the caller's again: it can go elsewhere.
    assert_eq!(module.send(good, des, PING).unwrap(), SendStatus::Posted);

    // Posted from the pending list: the error reaches the callback.
    let queued = module.alloc(NO_ORDER, 4, DesFlags::BTL_OWNERSHIP).unwrap();
    assert_eq!(module.send(bad, queued, PING).unwrap(), SendStatus::Queued);
    for _ in 0..50 {
        btl.progress();
    }
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].descriptor, events[0].status.is_ok()),
        (des, true)
    );
    assert_eq!(
        (events[1].descriptor, events[1].status.is_err()),
        (queued, true)
    );
    assert_eq!(btl.modules()[0].send_credits(), 1, "no credit is lost");
    assert_eq!(btl.modules()[0].stats().send_errors, 1);
    drop(events);
    btl.modules_mut()[0].free(des).unwrap();
    btl.finalize().unwrap();
    peer.finalize().unwrap();
}
