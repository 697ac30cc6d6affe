//! What an observer on the path sees of a job under `udrun` with
//! `UDBTL_AUTH`: rank 1 sends rank 0 checked messages (`udprobe
//! into-one`) while a packet socket reads every datagram on the host. With
//! `UDBTL_AUTH=1` the payloads go in clear under their tags; with
//! `UDBTL_AUTH=encrypt` no payload shows, and every datagram says it is
//! encrypted. Reading the wire takes a packet socket: as root only,
//! SKIPPED otherwise.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use udbtl_wire::rel::{FLAG_ENCRYPTED, FLAG_MAC};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

#[path = "../../../tests/support/forger.rs"]
mod forger;

const PROBE: &str = env!("CARGO_BIN_EXE_udprobe");

/// Bytes 0..16 of the body of every message from rank 1 with at least 16
/// (udprobe's `payload`: byte `i` is `i ^ 1`).
fn rank_one_body() -> [u8; 16] {
    std::array::from_fn(|i| i as u8 ^ 1)
}

/// What the observer counted: sealed datagrams, those that said they were
/// encrypted, and those that showed a message body in clear.
#[derive(Debug, Default)]
struct Observed {
    sealed: u64,
    encrypted: u64,
    in_clear: u64,
}

/// Runs the job with `UDBTL_AUTH=auth` while watching the wire.
fn observe(auth: &str, sniffer: forger::Sniffer) -> Observed {
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let body = rank_one_body();
            let mut seen = Observed::default();
            while !stop.load(Ordering::Relaxed) {
                let Some(datagram) = sniffer.next() else {
                    continue;
                };
                let Some(header) = datagram.reliability_header() else {
                    continue;
                };
                if !header.has(FLAG_MAC) {
                    continue;
                }
                seen.sealed += 1;
                seen.encrypted += u64::from(header.has(FLAG_ENCRYPTED));
                seen.in_clear += u64::from(
                    datagram
                        .payload
                        .windows(body.len())
                        .any(|window| window == body),
                );
            }
            seen
        })
    };
    let child = common::start(
        &["-n", "2", PROBE, "--messages", "2000", "into-one"],
        &[("UDBTL_AUTH", auth)],
    );
    let job = common::finish(child, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().unwrap();
    let (stdout, stderr) = common::text(&job.output);
    let all = format!("{stdout}\n{stderr}");
    println!("UDBTL_AUTH={auth}: {seen:?}\n{all}");
    assert!(!job.timed_out, "the job hung: {all}");
    assert!(job.output.status.success(), "the job failed: {all}");
    assert!(
        all.contains("2000 messages from each of 1 ranks, in order and intact"),
        "{all}"
    );
    assert!(seen.sealed > 0, "no sealed datagram seen: {all}");
    seen
}

#[test]
fn an_observer_reads_authenticated_payloads_and_not_encrypted_ones() {
    let open = || match forger::Sniffer::open() {
        Ok(sniffer) => Some(sniffer),
        Err(reason) => {
            eprintln!("SKIPPED: {reason}");
            None
        }
    };
    let Some(sniffer) = open() else {
        return;
    };
    let authenticated = observe("1", sniffer);
    assert!(
        authenticated.in_clear > 0,
        "the observer reads payloads sent in clear: {authenticated:?}"
    );
    assert_eq!(authenticated.encrypted, 0, "{authenticated:?}");

    let encrypted = observe("encrypt", open().unwrap());
    assert_eq!(encrypted.in_clear, 0, "{encrypted:?}");
    assert_eq!(encrypted.encrypted, encrypted.sealed, "{encrypted:?}");
}
