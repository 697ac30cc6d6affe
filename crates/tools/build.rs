//! Probes what the crate's tests need from the machine (see udbtl-prereq):
//! each one missing sets `udbtl_missing = "<name>"`, which marks the tests
//! that need it ignored, with their reason. The tools themselves use none.

use udbtl_prereq::Prereq;

fn main() {
    udbtl_prereq::emit(&[
        // twohosts.rs, pmi_flood.rs.
        Prereq::Root,
        Prereq::SharedTools,
        // interop.rs.
        Prereq::Program("mpiexec.hydra"),
        Prereq::Program("mpicc.mpich"),
        Prereq::Slurm,
        // settings.rs.
        Prereq::Program("setpriv"),
    ]);
}
