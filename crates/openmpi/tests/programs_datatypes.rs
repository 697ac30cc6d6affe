//! Derived datatypes over `self,udbtl` (`datatypes.c`): vector, indexed and
//! struct-with-gaps layouts up to 1 MiB of data, derived to derived,
//! derived to contiguous and back, with 1, 2, 3, 4 and 8 ranks.

mod common;

use common::{Run, run_ok};

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_1_rank() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(1), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_2_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(2), &[]);
}

/// With `inplace` among `btl_udbtl_flags`, ob1 hands eager messages to
/// `prepare_src`, which packs a non-contiguous one whole (a 65 520-byte
/// vector went short when it was cut at `max_send_size`).
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_2_ranks_with_eager_messages_in_place() {
    require_openmpi!();
    run_ok(
        "datatypes",
        &Run::udbtl(2).mca("btl_udbtl_flags", "send,get,inplace"),
        &[],
    );
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_3_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(3), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_4_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(4), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_8_ranks() {
    require_openmpi!();
    run_ok("datatypes", &Run::udbtl(8), &[]);
}
