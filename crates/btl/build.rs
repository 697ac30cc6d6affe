//! Probes what the crate's tests need from the machine (see udbtl-prereq):
//! each one missing sets `udbtl_missing = "<name>"`, which marks the tests
//! that need it ignored, with their reason. The library itself uses none.

use udbtl_prereq::Prereq;

fn main() {
    udbtl_prereq::emit(&[
        // tests/kernel_loss.rs and tests/exhaustion.rs.
        Prereq::Root,
        Prereq::Program("nft"),
        Prereq::Program("tc"),
        Prereq::Program("unshare"),
        // The verbs variants of tests/providers.rs.
        Prereq::VerbsDevice,
    ]);
}
