//! Every MPI thread level over udbtl: mpi4py at its defaults (it asks for
//! MPI_THREAD_MULTIPLE), and a C program with four threads per rank doing
//! point-to-point of every size class and collectives at once, each on its
//! own duplicate of MPI_COMM_WORLD, over a clean and a lossy fabric.
//!
//! The mpi4py tests need a Python with mpi4py: ignored where the build
//! found none (`SKIPPED: ...`).

mod common;

use common::{Run, assert_carried, assert_said_ok, run_ok};

fn mpi4py(np: u32) {
    let python = match common::python_with_mpi4py() {
        Ok(python) => python,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    let script = common::python_program("mpi4py_default");
    let _turn = common::serial();
    let run = Run::udbtl(np);
    let out = run.success(
        std::path::Path::new(python),
        &[&script.display().to_string()],
    );
    assert_said_ok("mpi4py", &out, &format!("{np} ranks"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .all(|l| !l.starts_with("OK mpi4py") || l.ends_with("thread=3")),
        "mpi4py must run at MPI_THREAD_MULTIPLE (3):\n{stdout}"
    );
    assert_carried(&out, np);
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "openmpi", udbtl_missing = "mpi4py"),
    ignore = "SKIPPED: needs Open MPI and mpi4py (apt-get install python3-mpi4py)"
)]
fn mpi4py_at_its_defaults_2_ranks() {
    require_openmpi!();
    mpi4py(2);
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "openmpi", udbtl_missing = "mpi4py"),
    ignore = "SKIPPED: needs Open MPI and mpi4py (apt-get install python3-mpi4py)"
)]
fn mpi4py_at_its_defaults_3_ranks() {
    require_openmpi!();
    mpi4py(3);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn four_threads_per_rank_2_ranks() {
    require_openmpi!();
    run_ok("threads", &Run::udbtl(2), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn four_threads_per_rank_3_ranks() {
    require_openmpi!();
    run_ok("threads", &Run::udbtl(3), &[]);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn four_threads_per_rank_with_drops() {
    require_openmpi!();
    let out = run_ok(
        "threads",
        &Run::udbtl(2).env("UDBTL_FAULT_DROP", "0.05"),
        &["10"],
    );
    assert!(
        common::stats(&out.stderr)
            .iter()
            .any(|s| s.retransmitted > 0),
        "5 % drops must have been repaired"
    );
}
