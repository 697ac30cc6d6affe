//! ob1's flow control under load: many large and eager nonblocking sends
//! posted at once while the peer only receives, then the other way, with
//! few send fragments. A BTL whose sends complete at once without a later
//! callback, and whose fragments a large transfer can use up, leaves ob1
//! waiting for a completion that never comes (Open MPI issue #3845); the
//! previous component hung here.

mod common;

use common::{Run, assert_counted, assert_never_counted, run_ok};

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
    let out = run_ok("isend_flood", &Run::udbtl(4), &["64"]);
    // A stream: its eager messages longer than a datagram left from the
    // user's buffers (and arrived intact: the program checks every byte).
    assert_counted(&out, "eager_lent");
}

/// Eager messages sent one at a time are copied, never lent: a lent one
/// would complete only at its acknowledgement, which where ranks share CPUs
/// waits for the peer's time slice (a halo exchange took twice as long).
/// Each reply carries the acknowledgement of the message before it, so no
/// more than two sends to a peer are ever outstanding here, whatever the
/// speed.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn lone_eager_messages_are_copied() {
    require_openmpi!();
    let out = run_ok("isend_flood", &Run::udbtl(2), &["200", "pingpong"]);
    assert_never_counted(&out, "eager_lent");
}
