//! The body that runs across two processes, a parent and a child that is
//! this test binary run again with one ignored test as its filter: modex
//! blobs passed through the environment and stdout, ping-pong, the pending
//! queue and a zero-copy megabyte, on the seed's unreliable contract.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use udbtl_btl::*;
use udbtl_fabric::Provider;

use super::{BULK, Make, PING, PONG, finalize_clean, inbox, send, unreliable};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
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
