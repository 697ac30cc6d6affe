//! The classic MPI examples over `self,udbtl`, written for these tests
//! (Debian ships no example sources): `hello.c`, `ring.c` and
//! `connectivity.c`, with 1, 2, 3, 4 and 8 ranks.

mod common;

use common::{Run, run_ok};

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn hello_1_rank() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(1), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn hello_2_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(2), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn hello_3_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(3), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn hello_4_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(4), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn hello_8_ranks() {
    require_openmpi!();
    run_ok("hello", &Run::udbtl(8), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn ring_1_rank() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(1), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn ring_2_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(2), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn ring_3_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(3), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn ring_4_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(4), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn ring_8_ranks() {
    require_openmpi!();
    run_ok("ring", &Run::udbtl(8), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn connectivity_1_rank() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(1), &["-v"]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn connectivity_2_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(2), &["-v"]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn connectivity_3_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(3), &["-v"]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn connectivity_4_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(4), &["-v"]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn connectivity_8_ranks() {
    require_openmpi!();
    run_ok("connectivity", &Run::udbtl(8), &["-v"]);
}
