//! The classic MPI examples over `self,udbtl`, written for these tests
//! (Debian ships no example sources): `hello.c`, `ring.c` and
//! `connectivity.c`, with 1, 2, 3, 4 and 8 ranks.

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
fn hello_1_rank() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(1), &[]);
}

#[test]
fn hello_2_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(2), &[]);
}

#[test]
fn hello_3_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(3), &[]);
}

#[test]
fn hello_4_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(4), &[]);
}

#[test]
fn hello_8_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(8), &[]);
}

#[test]
fn ring_1_rank() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(1), &[]);
}

#[test]
fn ring_2_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(2), &[]);
}

#[test]
fn ring_3_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(3), &[]);
}

#[test]
fn ring_4_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(4), &[]);
}

#[test]
fn ring_8_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(8), &[]);
}

#[test]
fn connectivity_1_rank() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(1), &["-v"]);
}

#[test]
fn connectivity_2_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(2), &["-v"]);
}

#[test]
fn connectivity_3_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(3), &["-v"]);
}

#[test]
fn connectivity_4_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(4), &["-v"]);
}

#[test]
fn connectivity_8_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(8), &["-v"]);
}
