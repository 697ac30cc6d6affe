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

use udbtl_wire::rel::{self, FLAG_ENCRYPTED, FLAG_SEALED};

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
/// the replays, both directions together: as many as the replay window
/// spans in one, so that a copy is refused as older than the window or,
/// if it is still inside, as taken.
const GONE_BY: usize = 2048;

/// Reads the job's sealed datagrams off the wire (the job's by `job_key`)
/// and keeps the first [`CAPTURED`] whose header `capture` picks; then
/// counts those `gone_by` picks, up to [`GONE_BY`]; then sends each capture
/// again from its own sender's address. Returns how many copies went out
/// and how many datagrams went by, which is less than [`GONE_BY`] only if
/// the job ended first.
fn capture_then_replay(
    job: &mut stranger_job::StrangerJob,
    (spoofer, sniffer): (&forger::Spoofer, &forger::Sniffer),
    job_key: u32,
    capture: impl Fn(&rel::Repr) -> bool,
    gone_by: impl Fn(&rel::Repr) -> bool,
) -> (u64, usize) {
    let mut captured = Vec::new();
    let mut went_by = 0;
    while went_by < GONE_BY && job.running() {
        let Some(datagram) = sniffer.next() else {
            continue;
        };
        if datagram.job_key() != Some(job_key) {
            continue;
        }
        let Some(header) = datagram.reliability_header().filter(|h| h.has(FLAG_SEALED)) else {
            continue;
        };
        if captured.len() < CAPTURED {
            if capture(&header) {
                captured.push(datagram);
            }
        } else if gone_by(&header) {
            went_by += 1;
        }
    }
    let sent = captured
        .iter()
        .filter(|d| spoofer.send(d.from, d.to, &d.payload).is_ok())
        .count();
    (sent as u64, went_by)
}

/// Opens the raw socket and the packet socket the replay tests need, or
/// says why they cannot be (`SKIPPED`).
fn spoofer_and_sniffer() -> Option<(forger::Spoofer, forger::Sniffer)> {
    match forger::spoofer_and_sniffer() {
        Ok(both) => Some(both),
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            None
        }
    }
}

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
    let Some(sockets) = spoofer_and_sniffer() else {
        return;
    };
    // The seed's fixed Q_Key leaves the job key unmasked on the wire, which
    // tells this job's datagrams from other tests'. Replays carry whatever
    // admission the originals had, so it changes nothing for them.
    let mut job = stranger_job::StrangerJob::start(
        PROBE,
        "replay",
        &[("UDBTL_AUTH", "1"), forger::FIXED_QKEY],
    );
    let mut sent = 0;
    if let Some(job_key) = job.pids().and_then(|pids| forger::job_key_of(pids[0])) {
        let every = |_: &rel::Repr| true;
        (sent, _) = capture_then_replay(&mut job, (&sockets.0, &sockets.1), job_key, every, every);
    }
    let all = job.finish();
    println!("{sent} genuine datagrams replayed");
    assert_eq!(sent, CAPTURED as u64, "every capture was replayed: {all}");
    assert!(replayed(&all) >= sent, "every replay refused: {all}");
}

/// Where the streams of [`data_from_before_a_sequence_wrap_is_refused_after_it`]
/// start: 256 datagrams before their 32-bit sequence numbers wrap.
const NEAR_WRAP: u32 = 0xffff_ff00;

/// A job whose streams start just before their sequence numbers wrap
/// (`UDBTL_REL_FIRST_SEQ`), with `UDBTL_AUTH=1`: an observer records data
/// datagrams from before the wrap and, once [`GONE_BY`] data datagrams
/// from after it went by, sends each again from its sender's address. The
/// streams go on through the wrap (the tag covers each sequence number's
/// epoch, which the wrap moves on), every copy is refused, none is
/// delivered twice (udprobe checks every message) and the job completes.
/// Root only, as the test above.
#[test]
#[cfg_attr(
    udbtl_missing = "root",
    ignore = "SKIPPED: needs root (a raw socket and a packet socket)"
)]
fn data_from_before_a_sequence_wrap_is_refused_after_it() {
    let Some(sockets) = spoofer_and_sniffer() else {
        return;
    };
    let first_seq = format!("{NEAR_WRAP:#x}");
    let mut job = stranger_job::StrangerJob::start(
        PROBE,
        "wrap",
        &[
            ("UDBTL_AUTH", "1"),
            ("UDBTL_REL_FIRST_SEQ", &first_seq),
            forger::FIXED_QKEY,
        ],
    );
    let data = |h: &rel::Repr| !h.has(rel::FLAG_ACK_ONLY);
    let (mut sent, mut after_wrap) = (0, 0);
    if let Some(job_key) = job.pids().and_then(|pids| forger::job_key_of(pids[0])) {
        (sent, after_wrap) = capture_then_replay(
            &mut job,
            (&sockets.0, &sockets.1),
            job_key,
            |h| data(h) && h.seq.0 >= NEAR_WRAP,
            |h| data(h) && h.seq.0 < 1 << 31,
        );
    }
    let all = job.finish();
    println!(
        "{sent} data datagrams from before the wrap replayed after {after_wrap} from after it"
    );
    assert_eq!(after_wrap, GONE_BY, "the streams went past the wrap: {all}");
    assert_eq!(sent, CAPTURED as u64, "every capture was replayed: {all}");
    assert!(replayed(&all) >= sent, "every replay refused: {all}");
}
