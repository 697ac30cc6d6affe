//! udbtl's counters are MPI_T performance variables: a program reads
//! btl_udbtl_sent and btl_udbtl_received around a ring exchange, and
//! btl_udbtl_eager_lent around a stream of eager messages.

mod common;

use common::{Run, run_ok};

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn an_mpi_t_program_reads_the_counters() {
    require_openmpi!();
    let out = run_ok("mpit", &Run::udbtl(3), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("OK mpit rank").count(), 3, "{stdout}");
}
