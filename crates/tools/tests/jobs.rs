//! Real jobs under our own launcher: `udrun` starts real processes that wire
//! up through real PMI and talk over real UDP sockets.
//!
//! * `udhello` with 1, 2, 4 and 16 ranks: every pair exchanges a checked
//!   greeting.
//! * Reliability through injected loss (the fault-injecting provider at 5 %
//!   drops): 1 GiB from one rank to another, and 1000 messages from every
//!   rank to every other among 4 ranks (12 000 in all), every byte checked.
//! * A timed all-to-all (`--seconds`) delivers exactly the rounds each rank
//!   says it sent.

#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

/// A bounded test: the whole job is interrupted after three minutes.
fn udrun(args: &[&str], env: &[(&str, &str)]) -> Output {
    common::udrun(args, env, Duration::from_secs(180))
}

use common::text;

#[test]
fn udhello_with_1_2_4_and_16_ranks() {
    for n in [1u32, 2, 4, 16] {
        let output = udrun(&["-n", &n.to_string(), env!("CARGO_BIN_EXE_udhello")], &[]);
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "n={n}: {stdout}\n{stderr}");
        assert_eq!(
            stdout
                .matches(&format!("greeted and acknowledged by all {n} ranks"))
                .count(),
            n as usize,
            "{stdout}"
        );
    }
}

#[test]
fn a_gibibyte_through_five_percent_loss() {
    let output = udrun(
        &[
            "-n",
            "2",
            env!("CARGO_BIN_EXE_udstress"),
            "bulk",
            "--bytes",
            "1G",
        ],
        &[("UDBTL_FAULT_DROP", "0.05"), ("UDBTL_FAULT_SEED", "7")],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("udstress bulk: 1073741824 bytes"),
        "{stdout}"
    );
    assert!(stdout.contains("in order and intact"), "{stdout}");
}

#[test]
fn all_to_all_among_four_ranks_through_loss_duplication_and_reordering() {
    let output = udrun(
        &[
            "-n",
            "4",
            env!("CARGO_BIN_EXE_udstress"),
            "alltoall",
            "--messages",
            "1000",
        ],
        &[
            ("UDBTL_FAULT_DROP", "0.05"),
            ("UDBTL_FAULT_DUPLICATE", "0.02"),
            ("UDBTL_FAULT_REORDER", "0.02"),
        ],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout
            .matches("received 3000 messages from 3 ranks")
            .count(),
        4,
        "{stdout}"
    );
}

#[test]
fn lazily_fetched_addresses_still_receive_from_strangers() {
    // With UDBTL_MODEX=lazy a rank fetches a peer's address on first use,
    // so rank 1 of a bulk transfer first hears from rank 0 before it knows
    // it: it looks the sender up by the id its datagrams carry, connects,
    // and accepts the retransmissions.
    let output = udrun(
        &[
            "-n",
            "2",
            env!("CARGO_BIN_EXE_udstress"),
            "bulk",
            "--bytes",
            "16M",
        ],
        &[("UDBTL_MODEX", "lazy")],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("udstress bulk: 16777216 bytes"), "{stdout}");
    let output = udrun(
        &[
            "-n",
            "4",
            env!("CARGO_BIN_EXE_udstress"),
            "alltoall",
            "--messages",
            "200",
        ],
        &[("UDBTL_MODEX", "lazy"), ("UDBTL_FAULT_DROP", "0.05")],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("received 600 messages from 3 ranks").count(),
        4,
        "{stdout}"
    );
}

#[test]
fn a_timed_all_to_all_delivers_every_round_each_rank_sent() {
    // `--seconds`: each rank sends rounds for a second, then tells every
    // receiver how many to expect; `--verbose` says how many it sent.
    let output = udrun(
        &[
            "-n",
            "3",
            env!("CARGO_BIN_EXE_udstress"),
            "alltoall",
            "--seconds",
            "1",
            "--verbose",
        ],
        &[("UDBTL_FAULT_DROP", "0.02")],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let number_after = |line: &str, before: &str| -> u64 {
        let rest = &line[line.find(before).unwrap() + before.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut rounds = [0u64; 3];
    for line in stderr.lines().filter(|l| l.contains(" rounds")) {
        let rank = number_after(line, "udstress: rank ").min(2) as usize;
        rounds[rank] = number_after(line, ": sent ");
    }
    assert!(rounds.iter().all(|r| *r > 0), "{stderr}");
    for rank in 0..3 {
        let expected: u64 = (0..3).filter(|r| *r != rank).map(|r| rounds[r]).sum();
        assert!(
            stdout.contains(&format!(
                "rank {rank} received {expected} messages from 2 ranks"
            )),
            "rank {rank} expected {expected}: {stdout}\n{stderr}"
        );
    }
}
