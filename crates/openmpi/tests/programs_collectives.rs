//! Collective operations over `self,udbtl` (`collectives.c`): barrier,
//! broadcast, reductions, (all)gather(v), scatter(v), alltoall(v) and the
//! same on the halves of an `MPI_Comm_split`, from 1-int to 1 MiB blocks,
//! with 1, 2, 3, 4 and 8 ranks.

mod common;

use common::{Run, run_ok};

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_1_rank() {
    require_openmpi!();
    run_ok("collectives", &Run::udbtl(1), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_2_ranks() {
    require_openmpi!();
    run_ok("collectives", &Run::udbtl(2), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_3_ranks() {
    require_openmpi!();
    run_ok("collectives", &Run::udbtl(3), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_4_ranks() {
    require_openmpi!();
    run_ok("collectives", &Run::udbtl(4), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn collectives_8_ranks() {
    require_openmpi!();
    run_ok("collectives", &Run::udbtl(8), &[]);
}
