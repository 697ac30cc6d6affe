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

/// With `lend_after` 0, ob1's eager messages that `prepare_src` may lend
/// are lent whenever contiguous; a non-contiguous one is packed whole (a
/// 65 520-byte vector went short when it was cut at `max_send_size`).
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_2_ranks_lending_every_eager_message() {
    require_openmpi!();
    run_ok(
        "datatypes",
        &Run::udbtl(2).mca("btl_udbtl_lend_after", "0"),
        &[],
    );
}

/// Without `inplace`, ob1 packs every eager message itself.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn datatypes_2_ranks_with_ob1_copying_eager_messages() {
    require_openmpi!();
    run_ok(
        "datatypes",
        &Run::udbtl(2).mca("btl_udbtl_flags", "send,get"),
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
