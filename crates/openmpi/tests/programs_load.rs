//! ob1's flow control under load: many large and eager nonblocking sends
//! posted at once while the peer only receives, then the other way, with
//! few send fragments. A BTL whose sends complete at once without a later
//! callback, and whose fragments a large transfer can use up, leaves ob1
//! waiting for a completion that never comes (Open MPI issue #3845); the
//! previous component hung here.

mod common;

use common::{Run, run_ok};

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn a_flood_of_isends_completes_with_few_fragments() {
    require_openmpi!();
    run_ok(
        "isend_flood",
        &Run::udbtl(2).mca("btl_udbtl_send_frags_max", "64"),
        &["300"],
    );
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn a_flood_of_isends_completes_at_the_defaults() {
    require_openmpi!();
    run_ok("isend_flood", &Run::udbtl(4), &["64"]);
}
