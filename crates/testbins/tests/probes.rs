//! Jobs where ranks misbehave, under `udrun`, through `udprobe`: every
//! message arrives exactly once and intact, or the loss is reported loudly,
//! naming the ranks, and the job fails. (Jobs whose datagrams the kernel
//! drops or rewrites are in `kernel.rs`.)

#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

/// A bounded test: the whole job is interrupted after two minutes.
fn udrun(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::udrun(args, env, Duration::from_secs(120))
}

fn text(output: &Output) -> String {
    let (stdout, stderr) = common::text(output);
    format!("{stdout}\n{stderr}")
}

/// With addresses fetched lazily, rank 0 sends before anyone knows it,
/// while every other rank sits in a barrier or in finalize: both run
/// through the same progress as everything else, so the receivers connect
/// to rank 0 while they wait, and nothing is lost. (Before, a receiver in
/// finalize never connected, rank 0 gave up after 5 s, and both ranks
/// finalized "successfully" with nothing delivered.)
#[test]
fn receive_first_traffic_arrives_during_a_barrier() {
    let _serial = serial();
    for during in ["barrier", "finalize"] {
        let output = udrun(
            &[
                "-n",
                "4",
                env!("CARGO_BIN_EXE_udprobe"),
                "lazy-barrier",
                "--wait-in",
                during,
            ],
            &[("UDBTL_MODEX", "lazy")],
        );
        let all = text(&output);
        assert!(output.status.success(), "{all}");
        for rank in 1..4 {
            assert!(
                all.contains(&format!(
                    "rank {rank}: 100 messages from rank 0, received during {during}, in order and intact"
                )),
                "{all}"
            );
        }
    }
}

/// Sends to a lost peer fail at once and leak nothing: after 10 000 of them
/// a live peer still gets everything, and finalize names the lost rank
/// (and finds no leak); the job fails.
#[test]
fn sends_to_a_lost_peer_fail_without_leaking() {
    let _serial = serial();
    let output = udrun(
        &["-n", "3", env!("CARGO_BIN_EXE_udprobe"), "lost-peer"],
        &[("UDBTL_PEER_TIMEOUT", "500")],
    );
    let all = text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(
        all.contains("10000 of 10000 later sends to it refused"),
        "{all}"
    );
    assert!(
        all.contains("rank 1: 100 messages from rank 0 in order and intact"),
        "{all}"
    );
    assert!(
        all.contains("rank 0: finalize: messages were lost: rank 0: rank 2 lost"),
        "{all}"
    );
    assert!(
        !all.contains("still in use"),
        "finalize found a leak: {all}"
    );
    assert!(all.contains("udrun: rank 0"), "{all}");
}

// ----- failure scenarios: busy, killed, stopped ranks; pools; the kernel -----

/// The scenarios below measure timings against a 2 s peer timeout, and one
/// runs 16 ranks: they take turns, so that one job's load does not skew
/// another's figures on a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const PROBE: &str = env!("CARGO_BIN_EXE_udprobe");
/// The peer timeout of the scenarios, in milliseconds.
const PEER_TIMEOUT: &str = "2000";

/// Runs a bounded job, prints its output (the measured figures show with
/// `--nocapture`) and fails if the watchdog had to end it.
fn probe(args: &[&str], env: &[(&str, &str)], limit: Duration) -> (Output, String) {
    let job = common::finish(common::start(args, env), limit);
    let all = text(&job.output);
    println!(
        "udrun {} [{env:?}]: {} in {:.1} s\n{all}",
        args.join(" "),
        job.output.status,
        job.elapsed.as_secs_f64()
    );
    assert!(!job.timed_out, "the job hung: {all}");
    (job.output, all)
}

/// The number right after `marker` in the first line containing `line`.
fn number_after(all: &str, line: &str, marker: &str) -> Option<f64> {
    let found = all.lines().find(|l| l.contains(line))?;
    let rest = &found[found.find(marker)? + marker.len()..];
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    digits.parse().ok()
}

fn assert_no_error(all: &str) {
    for bad in ["error", "lost", "wrong", "udrun: rank"] {
        assert!(!all.contains(bad), "{bad:?} in: {all}");
    }
}

/// A rank that computes for three peer timeouts without calling progress
/// is not declared lost: the progress helper acknowledges for it and keeps
/// what arrives, and everything is delivered once it progresses again.
#[test]
fn a_rank_computing_for_three_peer_timeouts_is_not_lost() {
    let _serial = serial();
    let (output, all) = probe(
        &[
            "-n",
            "2",
            PROBE,
            "--messages",
            "200",
            "busy",
            "--busy-ms",
            "6000",
        ],
        &[("UDBTL_PEER_TIMEOUT", PEER_TIMEOUT)],
        Duration::from_secs(60),
    );
    assert!(output.status.success(), "{all}");
    assert!(
        all.contains("rank 1: all 200 messages from rank 0, in order and intact"),
        "{all}"
    );
    assert!(
        all.contains("rank 0: all 200 messages acknowledged"),
        "{all}"
    );
    assert!(all.contains("rank 0: finalize OK"), "{all}");
    assert!(all.contains("rank 1: finalize OK"), "{all}");
    assert_no_error(&all);
}

/// Rank 1 stops progressing right after a burst arrived, before its
/// acknowledgement went out: the helper sends the acknowledgement it owes
/// (within milliseconds, not after the computation).
#[test]
fn a_rank_that_goes_busy_owing_an_acknowledgement_still_sends_it() {
    let _serial = serial();
    let (output, all) = probe(
        &[
            "-n",
            "2",
            PROBE,
            "--messages",
            "200",
            "busy",
            "--busy-ms",
            "6000",
            "--owe-ack",
        ],
        &[("UDBTL_PEER_TIMEOUT", PEER_TIMEOUT)],
        Duration::from_secs(60),
    );
    assert!(output.status.success(), "{all}");
    let acked = number_after(&all, "rank 0: a burst of 3 acknowledged", "after ")
        .unwrap_or_else(|| panic!("no burst acknowledged: {all}"));
    assert!(
        acked < 1000.0,
        "the burst was acknowledged only after {acked} ms: {all}"
    );
    assert!(
        all.contains("rank 1: all 200 messages from rank 0, in order and intact"),
        "{all}"
    );
    assert!(all.contains("rank 0: finalize OK"), "{all}");
    assert!(all.contains("rank 1: finalize OK"), "{all}");
    assert_no_error(&all);
}

/// The control of the two tests above: without the helper
/// (`UDBTL_PROGRESS_THREAD=0`) the same computing rank is declared lost,
/// loudly, on both sides, and the job fails. So those tests would catch a
/// helper that stopped working.
#[test]
fn without_the_helper_a_computing_rank_is_declared_lost_loudly() {
    let _serial = serial();
    for owe_ack in [false, true] {
        let mut args = vec![
            "-n",
            "2",
            PROBE,
            "--messages",
            "200",
            "busy",
            "--busy-ms",
            "6000",
            "--linger-ms",
            "8000",
        ];
        if owe_ack {
            args.push("--owe-ack");
        }
        let (output, all) = probe(
            &args,
            &[
                ("UDBTL_PEER_TIMEOUT", PEER_TIMEOUT),
                ("UDBTL_PROGRESS_THREAD", "0"),
            ],
            Duration::from_secs(60),
        );
        assert!(!output.status.success(), "{all}");
        let detected = number_after(&all, "rank 0: error after", "error after ")
            .unwrap_or_else(|| panic!("rank 0 reported nothing: {all}"));
        assert!(
            all.contains("rank 0: rank 1 lost (endpoint 1 was declared lost"),
            "{all}"
        );
        assert!(
            all.contains("rank 1: rank 0 lost (endpoint 0 broke the stream"),
            "{all}"
        );
        assert!(all.contains("udrun: rank "), "{all}");
        println!(
            "without the helper (owe-ack {owe_ack}): rank 1 declared lost after {detected} ms"
        );
        assert!(detected >= 2000.0, "declared lost too early: {all}");
    }
}

/// A rank killed by SIGKILL while rank 0 sends to it (and to the others)
/// ends the job at once: udrun names it and fails; nothing hangs. udrun
/// usually kills rank 0 before its peer timeout expires; if not, rank 0's
/// error names the dead rank.
#[test]
fn a_killed_rank_ends_the_job_naming_it() {
    let _serial = serial();
    for (size, victim) in [("3", "2"), ("4", "2")] {
        let (output, all) = probe(
            &[
                "-n",
                size,
                PROBE,
                "--messages",
                "20000",
                "kill",
                "--victim",
                victim,
                "--after",
                "1000",
            ],
            &[("UDBTL_PEER_TIMEOUT", PEER_TIMEOUT)],
            Duration::from_secs(60),
        );
        assert!(!output.status.success(), "{all}");
        assert!(
            all.contains(&format!("rank {victim}: received")),
            "the victim died before receiving: {all}"
        );
        assert!(
            all.contains(&format!("udrun: rank {victim} (pid ")),
            "{all}"
        );
        assert!(all.contains("killed by signal 9 (SIGKILL)"), "{all}");
        let died = number_after(&all, "SIGKILL at", "SIGKILL at ");
        match number_after(&all, "rank 0: error after", "(at ") {
            Some(at) => {
                assert!(
                    all.contains(&format!("naming rank {victim}: true")),
                    "{all}"
                );
                println!(
                    "{size} ranks: rank 0's error named rank {victim} {:.0} ms after it died",
                    at - died.unwrap_or(at)
                );
            }
            None => {
                println!("{size} ranks: udrun ended the job before rank 0's peer timeout expired")
            }
        }
    }
}

/// A rank stopped (SIGSTOP) for longer than the peer timeout with data
/// waiting for it is declared lost by its peer; once continued, it hears
/// the peer's reset and reports that the peer broke the stream. Both sides
/// name the other, print what they received, and the job fails.
#[test]
fn a_stopped_rank_is_lost_and_both_sides_report_it() {
    let _serial = serial();
    let (output, all) = probe(
        &[
            "-n",
            "2",
            PROBE,
            "--messages",
            "2000",
            "stop-one",
            "--stop-ms",
            "5000",
            "--linger-ms",
            "10000",
        ],
        &[("UDBTL_PEER_TIMEOUT", PEER_TIMEOUT)],
        Duration::from_secs(60),
    );
    assert!(!output.status.success(), "{all}");
    assert!(
        all.contains("rank 0: rank 1 lost (endpoint 1 was declared lost"),
        "{all}"
    );
    assert!(
        all.contains("rank 1: rank 0 lost (endpoint 0 broke the stream"),
        "{all}"
    );
    assert!(all.contains("rank 1: continued at"), "{all}");
    assert!(all.contains("udrun: rank "), "{all}");
    let stopped = number_after(&all, "rank 1: received", "stopping at ").unwrap();
    let declared = number_after(&all, "rank 0: error after", "(at ").unwrap();
    let received = number_after(&all, "rank 1: error", "; received ").unwrap();
    let failed = number_after(&all, "rank 0: error after", "; ").unwrap();
    let handed = number_after(&all, "rank 0: the transport took", "took ").unwrap();
    let detection = declared - stopped;
    println!(
        "stop-one: rank 0 declared rank 1 lost {detection:.0} ms after it stopped; \
         rank 1 received {received} of the {handed} rank 0 handed over, in order and intact; \
         rank 0 reported {failed} sends failed"
    );
    assert!(
        (2000.0..5000.0).contains(&detection),
        "declared lost {detection} ms after the stop: {all}"
    );
    // Each message the transport took arrived or was reported failed; the
    // ones it never took were refused to the sender, who knows.
    assert!(
        received + failed >= handed,
        "messages unaccounted for: {all}"
    );
}

/// Suspending the whole job (udrun and every rank, as Slurm's `scontrol
/// suspend` does) for longer than the peer timeout, with 5000 messages on
/// their way, is not a failure: every rank's clock jumps, no peer is
/// blamed, and every message arrives once, in order.
#[test]
fn suspending_the_whole_job_loses_nothing() {
    let _serial = serial();
    let env = [("UDBTL_PEER_TIMEOUT", PEER_TIMEOUT)];
    let args = [
        "-n",
        "2",
        PROBE,
        "--messages",
        "5000",
        "stop-all",
        "--pace-ms",
        "4000",
    ];
    let started = Instant::now();
    let child = common::start(&args, &env);
    let udrun = child.id();
    let waited = Instant::now();
    let ranks = loop {
        let ranks = common::children(udrun);
        if ranks.len() == 2 || waited.elapsed() > Duration::from_secs(10) {
            break ranks;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(ranks.len(), 2, "the ranks did not start");
    // Rank 0 spreads its sends over 4 s: 1.2 s in, it is mid-transfer.
    std::thread::sleep(Duration::from_millis(1200));
    common::signal(udrun, "STOP");
    for rank in &ranks {
        // Each rank leads its own process group.
        common::signal(format!("-{rank}"), "STOP");
    }
    let stopped = Instant::now();
    std::thread::sleep(Duration::from_millis(3000));
    for rank in &ranks {
        common::signal(format!("-{rank}"), "CONT");
    }
    common::signal(udrun, "CONT");
    let stop = stopped.elapsed();
    let job = common::finish(child, Duration::from_secs(60));
    let all = text(&job.output);
    println!(
        "stop-all: job stopped for {:.0} ms; {} in {:.1} s\n{all}",
        stop.as_secs_f64() * 1e3,
        job.output.status,
        started.elapsed().as_secs_f64()
    );
    assert!(!job.timed_out, "the job hung: {all}");
    assert!(job.output.status.success(), "{all}");
    assert!(
        all.contains("rank 1: all 5000 messages from rank 0, in order and intact"),
        "{all}"
    );
    assert!(
        all.contains("rank 0: all 5000 messages acknowledged"),
        "{all}"
    );
    assert!(all.contains("rank 0: finalize OK"), "{all}");
    assert!(all.contains("rank 1: finalize OK"), "{all}");
    for rank in 0..2 {
        let gap = number_after(&all, &format!("rank {rank}: all"), "longest gap ").unwrap();
        assert!(
            gap > 2500.0,
            "rank {rank} was not stopped mid-transfer (longest gap {gap} ms): {all}"
        );
    }
    assert_no_error(&all);
}

/// Rank 0 sends 4000 messages and finalizes at once while rank 1 computes
/// for 8 s without progress (default peer timeout): finalize waits, the
/// helper keeps rank 1 alive, everything arrives.
#[test]
fn finalize_waits_for_a_computing_receiver() {
    let _serial = serial();
    let (output, all) = probe(
        &[
            "-n",
            "2",
            PROBE,
            "--messages",
            "4000",
            "finalize-busy",
            "--busy-ms",
            "8000",
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(output.status.success(), "{all}");
    assert!(
        all.contains("all 4000 messages from rank 0, in order and intact"),
        "{all}"
    );
    assert!(all.contains("rank 0: finalize OK"), "{all}");
    assert!(all.contains("rank 1: finalize OK"), "{all}");
    assert_no_error(&all);
}

/// 15 ranks send to rank 0, whose receive pool holds 16 buffers: credit is
/// tight but nothing deadlocks, with and without 5 % injected drops.
#[test]
fn fifteen_senders_into_a_tiny_pool() {
    let _serial = serial();
    for (messages, drop) in [("1000", None), ("500", Some("0.05"))] {
        let mut env = vec![("UDBTL_RD_NUM", "16")];
        if let Some(rate) = drop {
            env.push(("UDBTL_FAULT_DROP", rate));
        }
        let (output, all) = probe(
            &["-n", "16", PROBE, "--messages", messages, "into-one"],
            &env,
            Duration::from_secs(90),
        );
        assert!(output.status.success(), "{all}");
        assert!(
            all.contains(&format!(
                "rank 0: {messages} messages from each of 15 ranks, in order and intact"
            )),
            "{all}"
        );
        assert_eq!(all.matches("finalize OK").count(), 16, "{all}");
        assert!(!all.contains("udrun: rank"), "{all}");
    }
}
