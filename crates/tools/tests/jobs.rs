//! Real jobs under our own launcher: `udrun` starts real processes that wire
//! up through real PMI and talk over real UDP sockets.
//!
//! * `udhello` with 1, 2, 4 and 16 ranks: every pair exchanges a checked
//!   greeting.
//! * Reliability through injected loss (the fault-injecting provider at 5 %
//!   drops): 1 GiB from one rank to another, and 1000 messages from every
//!   rank to every other among 4 ranks (12 000 in all), every byte checked.

#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::Duration;

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
