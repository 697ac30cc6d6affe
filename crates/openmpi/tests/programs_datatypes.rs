//! Derived datatypes over `self,udbtl` (`datatypes.c`): vector, indexed and
//! struct-with-gaps layouts up to 1 MiB of data, derived to derived,
//! derived to contiguous and back, with 1, 2, 3, 4 and 8 ranks.

mod common;

use std::process::Output;
use std::sync::{Mutex, PoisonError};

use common::Run;

/// One `mpirun` at a time from this file: the machine may have 2 CPUs, and
/// several 8-rank jobs at once would starve each other into timeouts.
static LAUNCH: Mutex<()> = Mutex::new(());

/// Builds `name` and runs it on `run`, one launch at a time (building is in
/// the lock too: the harness builds into one temporary file per process).
/// Asserts success, the program's `OK <name>` line and udbtl's traffic.
fn run_ok(name: &str, run: &Run, args: &[&str]) -> Output {
    let _turn = LAUNCH.lock().unwrap_or_else(PoisonError::into_inner);
    let exe = common::program(name);
    let out = run.success(&exe, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!("OK {name}"))),
        "{name} with {} ranks did not say OK:\n{stdout}\nstderr:\n{}",
        run.np,
        String::from_utf8_lossy(&out.stderr)
    );
    common::assert_carried(&out, run.np);
    out
}

#[test]
fn datatypes_1_rank() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(1), &[]);
}

#[test]
fn datatypes_2_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(2), &[]);
}

#[test]
fn datatypes_3_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(3), &[]);
}

#[test]
fn datatypes_4_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(4), &[]);
}

#[test]
fn datatypes_8_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(8), &[]);
}
