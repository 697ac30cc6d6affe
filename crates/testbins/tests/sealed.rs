//! What an observer on the path sees of a job under `udrun` with
//! `UDBTL_AUTH`: rank 1 sends rank 0 checked messages (`udprobe
//! into-one`) while a packet socket reads every datagram on the host. With
//! `UDBTL_AUTH=1` the payloads go in clear under their tags; with
//! `UDBTL_AUTH=encrypt` no payload shows, and every datagram says it is
//! encrypted. Only the job's own datagrams count (by its job key, which
//! rank 0 writes out): other tests may run at the same time. Reading the
//! wire takes a packet socket: as root only, ignored otherwise (`SKIPPED:
//! ...`; one that finds no such socket when it runs says so and records it,
//! see udbtl-prereq).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use udbtl_wire::rel::{FLAG_ENCRYPTED, FLAG_SEALED};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

#[path = "../../../tests/support/forger.rs"]
mod forger;
#[path = "../../../tests/support/stranger_job.rs"]
mod stranger_job;

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

/// One sealed udbtl datagram seen on the wire.
#[derive(Debug, Clone, Copy)]
struct Seen {
    job_key: u32,
    encrypted: bool,
    in_clear: bool,
}

/// Runs the job with `UDBTL_AUTH=auth` while watching the wire.
fn observe(auth: &str, sniffer: forger::Sniffer) -> Observed {
    let dir = std::env::temp_dir().join(format!("udbtl-sealed-{}-{auth}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("job-key");
    let script = format!(
        "[ \"$PMI_RANK\" = 0 ] && echo \"$UDBTL_JOB_KEY\" > '{}'; exec \"$0\" \"$@\"",
        key_file.display()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let body = rank_one_body();
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Some(datagram) = sniffer.next() else {
                    continue;
                };
                let Some(header) = datagram.reliability_header().filter(|h| h.has(FLAG_SEALED))
                else {
                    continue;
                };
                let Some(job_key) = datagram.job_key() else {
                    continue;
                };
                seen.push(Seen {
                    job_key,
                    encrypted: header.has(FLAG_ENCRYPTED),
                    in_clear: datagram.payload.windows(body.len()).any(|w| w == body),
                });
            }
            seen
        })
    };
    let child = common::start(
        &[
            "-n",
            "2",
            "sh",
            "-c",
            &script,
            PROBE,
            "--messages",
            "2000",
            "into-one",
        ],
        // The seed's fixed Q_Key leaves the job key unmasked on the wire,
        // which tells this job's datagrams from other tests'.
        &[("UDBTL_AUTH", auth), forger::FIXED_QKEY],
    );
    let job = common::finish(child, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    let all_seen = watcher.join().unwrap();
    let job_key: u32 = std::fs::read_to_string(&key_file)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .expect("rank 0 wrote the job key");
    let _ = std::fs::remove_dir_all(&dir);
    let mut seen = Observed::default();
    for datagram in all_seen.iter().filter(|d| d.job_key == job_key) {
        seen.sealed += 1;
        seen.encrypted += u64::from(datagram.encrypted);
        seen.in_clear += u64::from(datagram.in_clear);
    }
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
#[cfg_attr(
    udbtl_missing = "root",
    ignore = "SKIPPED: needs root (a packet socket)"
)]
fn an_observer_reads_authenticated_payloads_and_not_encrypted_ones() {
    let open = || match forger::Sniffer::open() {
        Ok(sniffer) => Some(sniffer),
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
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

/// The numbers after "replayed" in each rank's last word, summed.
fn replayed(all: &str) -> u64 {
    all.lines()
        .filter(|line| line.contains("messages each way"))
        .filter_map(|line| line.split_once(" replayed "))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Datagrams captured before they are replayed.
const CAPTURED: usize = 32;
/// Sealed datagrams of the job that go by after the last capture before
/// the replays: far more than the replay window's 64 in each direction.
const GONE_BY: usize = 2048;

/// An observer on the path records genuine sealed datagrams of a job
/// under udrun (`udprobe stranger`, `UDBTL_AUTH=1`) and, once the streams
/// have moved on, sends each again from its own sender's address. Each
/// copy is refused by its packet number (`replayed` in the receiver's
/// dump), none is delivered twice (udprobe checks every message), and the
/// job completes. Needs a packet socket and a raw one: root only.
#[test]
#[cfg_attr(
    udbtl_missing = "root",
    ignore = "SKIPPED: needs root (a raw socket and a packet socket)"
)]
fn genuine_datagrams_replayed_from_their_senders_address_are_refused() {
    let (spoofer, sniffer) = match forger::spoofer_and_sniffer() {
        Ok(both) => both,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    // The seed's fixed Q_Key leaves the job key unmasked on the wire, which
    // tells this job's datagrams from other tests'. Replays carry whatever
    // admission the originals had, so it changes nothing for them.
    let mut job = stranger_job::StrangerJob::start(
        PROBE,
        "replay",
        &[("UDBTL_AUTH", "1"), forger::FIXED_QKEY],
    );
    let mut sent = 0u64;
    if let Some(job_key) = job.pids().and_then(|pids| forger::job_key_of(pids[0])) {
        let mut captured = Vec::new();
        let mut gone_by = 0;
        while gone_by < GONE_BY && job.running() {
            let Some(datagram) = sniffer.next() else {
                continue;
            };
            let ours = datagram.job_key() == Some(job_key)
                && datagram
                    .reliability_header()
                    .is_some_and(|h| h.has(FLAG_SEALED));
            if !ours {
                continue;
            }
            if captured.len() < CAPTURED {
                captured.push(datagram);
            } else {
                gone_by += 1;
            }
        }
        for datagram in &captured {
            if spoofer
                .send(datagram.from, datagram.to, &datagram.payload)
                .is_ok()
            {
                sent += 1;
            }
        }
    }
    let all = job.finish();
    println!("{sent} genuine datagrams replayed");
    assert_eq!(sent, CAPTURED as u64, "every capture was replayed: {all}");
    assert!(replayed(&all) >= sent, "every replay refused: {all}");
}
