//! The MPI programs over a lossy `self,udbtl`: the component's fault
//! injector (`UDBTL_FAULT_*`) drops 5% of the datagrams, or duplicates and
//! reorders 5% each, and every program must still get every byte right.
//! Fewer sizes and ranks than the clean runs: repairs take time.

mod common;

use std::process::Output;

use common::{Run, parse_size, threshold_args};

/// The faults injected in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Faults {
    /// 5% of datagrams lost.
    Drop,
    /// 5% of datagrams sent twice, and 5% held back behind the next one.
    DuplicateReorder,
}

impl Faults {
    /// `run` with these faults, from a fixed seed per program so a failure
    /// can be replayed.
    fn apply(self, run: Run, seed: u64) -> Run {
        let run = run.env("UDBTL_FAULT_SEED", &seed.to_string());
        match self {
            Self::Drop => run.env("UDBTL_FAULT_DROP", "0.05"),
            Self::DuplicateReorder => run
                .env("UDBTL_FAULT_DUPLICATE", "0.05")
                .env("UDBTL_FAULT_REORDER", "0.05"),
        }
    }
}

/// Builds `name` and runs it on `np` ranks with `faults`; asserts success,
/// the `OK <name>` line, udbtl's traffic, and that the faults happened and
/// were repaired: with drops, some rank retransmitted.
fn run_faulty(name: &str, np: u32, faults: Faults, seed: u64, args: &[&str]) -> Output {
    let run = faults.apply(Run::udbtl(np), seed);
    let exe = common::program(name);
    let out = {
        let _turn = common::serial();
        run.success(&exe, args)
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    common::assert_said_ok(name, &out, &format!("{np} ranks and {faults:?}"));
    common::assert_carried(&out, np);
    let stats = common::stats(&out.stderr);
    assert!(
        stats.iter().all(|s| s.lost_peers == 0),
        "{name} with {faults:?}: a peer was given up for lost:\n{stderr}"
    );
    match faults {
        Faults::Drop => assert!(
            stats.iter().any(|s| s.retransmitted > 0),
            "{name} with {faults:?}: no rank retransmitted, so nothing was lost:\n{stderr}"
        ),
        Faults::DuplicateReorder => assert!(
            common::total(&out, "duplicates") > 0,
            "{name} with {faults:?}: no duplicate was seen:\n{stderr}"
        ),
    }
    out
}

fn p2p(faults: Faults) {
    // Sizes up to 1 MiB cover every protocol; beyond is more of the same.
    let mut args = vec!["--max", "1048576"];
    args.extend(threshold_args().iter().map(String::as_str));
    run_faulty("p2p", 2, faults, 11, &args);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_with_drops() {
    require_openmpi!();
    p2p(Faults::Drop);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn p2p_with_duplicates_and_reordering() {
    require_openmpi!();
    p2p(Faults::DuplicateReorder);
}

/// A stream of nonblocking sends, whose eager messages longer than a
/// datagram leave from the user's buffers: what is lost is resent from
/// them, and each completes only once acknowledged.
fn isend_flood(faults: Faults) {
    let out = run_faulty("isend_flood", 2, faults, 13, &["64"]);
    common::assert_counted(&out, "eager_lent");
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn isend_flood_with_drops() {
    require_openmpi!();
    isend_flood(Faults::Drop);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn isend_flood_with_duplicates_and_reordering() {
    require_openmpi!();
    isend_flood(Faults::DuplicateReorder);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn matching_with_drops() {
    require_openmpi!();
    run_faulty("matching", 3, Faults::Drop, 12, &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn matching_with_duplicates_and_reordering() {
    require_openmpi!();
    run_faulty("matching", 3, Faults::DuplicateReorder, 12, &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_with_drops() {
    require_openmpi!();
    run_faulty("datatypes", 3, Faults::Drop, 13, &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_with_duplicates_and_reordering() {
    require_openmpi!();
    run_faulty("datatypes", 3, Faults::DuplicateReorder, 13, &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_with_drops() {
    require_openmpi!();
    run_faulty("collectives", 4, Faults::Drop, 14, &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_with_duplicates_and_reordering() {
    require_openmpi!();
    run_faulty("collectives", 4, Faults::DuplicateReorder, 14, &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn connectivity_with_drops() {
    require_openmpi!();
    // Each rank sends only a dozen datagrams or so, and every rank draws
    // the same fault stream (one context each, seeded alike). Seed 15 first
    // dropped the 17th send, which a rank did not always reach (CI once
    // saw no drop at all); seed 14 drops the first send of every rank.
    run_faulty("connectivity", 8, Faults::Drop, 14, &[]);
}

#[test]
fn size_suffixes_parse() {
    assert_eq!(parse_size("65536"), Some(65536));
    assert_eq!(parse_size(" 64K\n"), Some(65536));
    assert_eq!(parse_size("unset"), None);
}
