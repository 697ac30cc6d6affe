//! Derived datatypes over `self,udbtl` (`datatypes.c`): vector, indexed and
//! struct-with-gaps layouts up to 1 MiB of data, derived to derived,
//! derived to contiguous and back, with 1, 2, 3, 4 and 8 ranks.

mod common;

use common::{Run, run_ok};

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
