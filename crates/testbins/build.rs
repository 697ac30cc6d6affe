//! Probes what the crate's tests need from the machine (see udbtl-prereq):
//! each one missing sets `udbtl_missing = "<name>"`, which marks the tests
//! that need it ignored, with their reason. udprobe itself uses none.

use udbtl_prereq::Prereq;

fn main() {
    udbtl_prereq::emit(&[
        // kernel.rs (root also for the raw and packet sockets of sealed.rs
        // and forgery.rs).
        Prereq::Root,
        Prereq::Program("nft"),
        Prereq::Program("unshare"),
        Prereq::Program("ip"),
    ]);
}
