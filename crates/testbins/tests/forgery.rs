//! A stranger on the host forges resets and acknowledgements to a job under
//! `udrun` (`udprobe stranger`): reliable and checksummed, with the job's
//! key (read from a rank's environment, as its owner or root can), from
//! each rank's own address and port to the other's, at the sequence numbers
//! every stream used to start from. Sending from another process's address
//! takes a raw socket: as root only, ignored otherwise (`SKIPPED: ...`; one
//! that finds no such socket when it runs says so and records it, see
//! udbtl-prereq).
//!
//! At the defaults every forgery dies in the fabric: the stranger cannot
//! know the Q_Key each module drew. With the seed's fixed Q_Key (and so no
//! job key mask) they get through, and each must then be counted and
//! dropped as unacceptable (RFC 5961), where the first reset used to end
//! the job.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use udbtl_wire::rel::{FLAG_ACK_ONLY, FLAG_ACK_REQ, FLAG_RESET, FLAG_SEALED};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

#[path = "../../../tests/support/forger.rs"]
mod forger;
#[path = "../../../tests/support/proc_net.rs"]
mod proc_net;
#[path = "../../../tests/support/stranger_job.rs"]
mod stranger_job;

const PROBE: &str = env!("CARGO_BIN_EXE_udprobe");

/// The numbers after "acknowledgements" and "resets" in each rank's
/// "unacceptable" report, summed.
fn unacceptable(all: &str) -> u64 {
    all.lines()
        .filter_map(|line| line.split_once("unacceptable acknowledgements "))
        .filter_map(|(_, rest)| {
            let mut words = rest.split_whitespace();
            let acks: u64 = words.next()?.parse().ok()?;
            let resets: u64 = words.nth(1)?.parse().ok()?;
            Some(acks + resets)
        })
        .sum()
}

/// The numbers after "bad qkey" on each rank's fabric counters, summed.
fn bad_qkey(all: &str) -> u64 {
    all.lines()
        .filter_map(|line| line.split_once("bad qkey "))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Runs a stranger job with `env` while forging resets and
/// acknowledgements to it; returns what it printed, or `None` (skipped, and
/// recorded) without a raw socket.
fn forge_into_job(name: &str, env: &[(&str, &str)]) -> Option<String> {
    let spoofer = match forger::Spoofer::open() {
        Ok(spoofer) => spoofer,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return None;
        }
    };
    let mut job = stranger_job::StrangerJob::start(PROBE, name, env);
    let mut forged = None;
    if let Some(pids) = job.pids() {
        let job_key = forger::job_key_of(pids[0]).expect("UDBTL_JOB_KEY in rank 0's environment");
        let ranks: Vec<_> = pids
            .iter()
            .zip(0..)
            .map(|(pid, rank)| (rank, proc_net::sockets(*pid, "udp", None)))
            .collect();
        forged = Some(forger::forge_resets_and_acks(&spoofer, job_key, &ranks).unwrap());
    }
    let all = job.finish();
    let forged = forged.expect("both ranks wrote their process id");
    println!(
        "{} resets and {} acknowledgements forged: {} counted as unacceptable, {} as bad qkey",
        forged.resets,
        forged.acks,
        unacceptable(&all),
        bad_qkey(&all)
    );
    Some(all)
}

#[test]
#[cfg_attr(udbtl_missing = "root", ignore = "SKIPPED: needs root (a raw socket)")]
fn forged_resets_and_acknowledgements_are_counted_and_dropped_under_udrun() {
    let Some(all) = forge_into_job("forgery", &[forger::FIXED_QKEY]) else {
        return;
    };
    assert!(
        unacceptable(&all) > 0,
        "no forged datagram was counted: {all}"
    );
}

#[test]
#[cfg_attr(udbtl_missing = "root", ignore = "SKIPPED: needs root (a raw socket)")]
fn at_the_defaults_forged_datagrams_die_in_the_fabric_under_udrun() {
    let Some(all) = forge_into_job("forgery-defaults", &[]) else {
        return;
    };
    assert!(bad_qkey(&all) > 0, "no forged datagram was counted: {all}");
    assert_eq!(unacceptable(&all), 0, "forgeries got past the Q_Key: {all}");
}

/// With authentication a stranger on the path cannot forge, but it can
/// replay. Rank 2 is killed (SIGKILL; its shell stays, so udrun does not
/// end the job) while rank 0 sends to it; a sniffer keeps rank 2's latest
/// acknowledgement to rank 0 and replays it every 200 ms from rank 2's own
/// address. Rank 0 must still declare rank 2 lost and name it, not wait
/// for ever (before, each copy restarted its failure clock).
#[test]
#[cfg_attr(
    udbtl_missing = "root",
    ignore = "SKIPPED: needs root (a raw socket and a packet socket)"
)]
fn a_replayed_acknowledgement_does_not_hide_a_killed_rank_under_authentication() {
    let (spoofer, sniffer) = match forger::spoofer_and_sniffer() {
        Ok(both) => both,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    // The victim's shell outlives it: udrun sees no rank die.
    let script = r#""$0" "$@"; status=$?; [ "$status" -eq 137 ] && exec sleep 120; exit "$status""#;
    let child = common::start(
        &[
            "-n",
            "3",
            "sh",
            "-c",
            script,
            PROBE,
            "--messages",
            "20000",
            "kill",
            "--victim",
            "2",
            "--after",
            "1000",
        ],
        &[("UDBTL_AUTH", "1"), ("UDBTL_PEER_TIMEOUT", "2000")],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let replayer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut latest: Option<forger::Seen> = None;
            let mut replayed = 0u64;
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(seen) = sniffer.next() {
                    let ack_from_victim = seen.reliability_header().is_some_and(|h| {
                        h.src == 2
                            && h.has(FLAG_ACK_ONLY | FLAG_SEALED)
                            && !h.has(FLAG_RESET)
                            && !h.has(FLAG_ACK_REQ)
                    });
                    if ack_from_victim {
                        latest = Some(seen);
                    }
                }
                if let Some(ack) = latest.as_ref().filter(|_| last.elapsed() >= REPLAY_EVERY) {
                    if spoofer.send(ack.from, ack.to, &ack.payload).is_ok() {
                        replayed += 1;
                    }
                    last = Instant::now();
                }
            }
            replayed
        })
    };
    let job = common::finish(child, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    let replayed = replayer.join().unwrap();
    let (stdout, stderr) = common::text(&job.output);
    let all = format!("{stdout}\n{stderr}");
    println!("{all}\n{replayed} acknowledgements of rank 2's replayed");
    assert!(!job.timed_out, "the job hung: {all}");
    assert!(
        replayed > 0,
        "no acknowledgement of rank 2's was seen: {all}"
    );
    assert!(all.contains("rank 2: received"), "{all}");
    assert!(all.contains("naming rank 2: true"), "{all}");
}

const REPLAY_EVERY: Duration = Duration::from_millis(200);
