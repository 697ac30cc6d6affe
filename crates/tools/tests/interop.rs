//! udbtl programs under launchers we did not write: MPICH's `mpiexec.hydra`
//! (PMI_FD mode and `-pmi-port` mode) and Slurm's `srun --mpi=pmi2`.
//!
//! Each test runs the real `udhello` (an all-pairs greeting whose payloads
//! every rank checks), and is ignored (`SKIPPED: ...`) where the build
//! found its launcher missing, or no Slurm answering; one that finds it
//! missing when it runs says `SKIPPED` and records it (see udbtl-prereq).
//! The last test turns it around: an MPICH-built program, with MPICH's own
//! PMI client, under our `udrun`. `.ci/run` installs MPICH and starts a
//! one-node Slurm (`scripts/slurm-local.sh`) before it builds, so in CI
//! they all run.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

use udbtl_prereq::Prereq;

fn run(mut command: Command) -> Output {
    command.env_remove("UDBTL_JOB_KEY");
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Never hang the suite: a watchdog kills the launcher after a minute.
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    let output = child.wait_with_output().unwrap();
    drop(watchdog);
    output
}

fn check(output: &Output, ranks: u32) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    for rank in 0..ranks {
        let line = format!("rank {rank} of {ranks} ");
        assert!(
            stdout.contains(&line),
            "no report from rank {rank}:\n{stdout}\n{stderr}"
        );
    }
    assert_eq!(
        stdout.matches("greeted and acknowledged by all").count(),
        ranks as usize,
        "{stdout}"
    );
}

#[test]
#[cfg_attr(
    udbtl_missing = "mpiexec.hydra",
    ignore = "SKIPPED: needs mpiexec.hydra (apt-get install mpich)"
)]
fn udhello_under_mpiexec_hydra() {
    udbtl_prereq::require!(Prereq::Program("mpiexec.hydra"));
    for mode in [&[][..], &["-pmi-port"][..]] {
        let mut command = Command::new("mpiexec.hydra");
        command
            .args(mode)
            .args(["-n", "4", env!("CARGO_BIN_EXE_udhello")]);
        check(&run(command), 4);
    }
}

/// Slurm running is a state, not a file: the build's answer is checked
/// again here, and a Slurm that stopped since is a recorded skip.
#[test]
#[cfg_attr(
    udbtl_missing = "slurm",
    ignore = "SKIPPED: needs a running Slurm when the tests are built \
              (scripts/slurm-local.sh starts one)"
)]
fn udhello_under_slurm_srun_pmi2() {
    udbtl_prereq::require!(Prereq::Slurm);
    let mut command = Command::new("srun");
    command.args([
        "-n",
        "4",
        "--overcommit",
        "--mpi=pmi2",
        env!("CARGO_BIN_EXE_udhello"),
    ]);
    check(&run(command), 4);
}

/// An MPI program built with MPICH, whose PMI-1 client we did not write,
/// runs under udrun: MPI_Init wires up through udrun's PMI server, and an
/// Allreduce checks the ranks really found each other.
#[test]
#[cfg_attr(
    udbtl_missing = "mpicc.mpich",
    ignore = "SKIPPED: needs mpicc.mpich (apt-get install libmpich-dev)"
)]
fn an_mpich_program_under_udrun() {
    udbtl_prereq::require!(Prereq::Program("mpicc.mpich"));
    let dir = std::env::temp_dir().join(format!("udbtl-mpich-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("hello.c");
    std::fs::write(
        &source,
        r#"#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("mpich rank %d of %d: sum %d\n", rank, size, sum);
    MPI_Finalize();
    return sum == size * (size - 1) / 2 ? 0 : 1;
}
"#,
    )
    .unwrap();
    let binary = dir.join("hello");
    let built = Command::new("mpicc.mpich")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .status()
        .unwrap();
    assert!(built.success());
    let mut command = Command::new(env!("CARGO_BIN_EXE_udrun"));
    command
        .args(["-n", "4", "--oversubscribe"])
        .arg(&binary)
        .env("UCX_NET_DEVICES", "lo");
    let output = run(command);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.matches("of 4: sum 6").count(), 4, "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
