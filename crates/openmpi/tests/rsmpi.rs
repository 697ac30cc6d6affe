//! A Rust program using rsmpi (the `mpi` crate, `tests/rsmpi/`) runs over
//! udbtl: point-to-point and collectives with every result checked, at 2
//! and 3 ranks.
//!
//! The program is its own Cargo project (rsmpi's build runs bindgen, which
//! needs libclang, and links libmpi: the workspace should need neither), built
//! here against Open MPI; MPICH is installed beside it and must not be picked.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use common::Run;

#[test]
fn rsmpi_two_ranks() {
    require_openmpi!();
    check(2);
}

#[test]
fn rsmpi_three_ranks() {
    require_openmpi!();
    check(3);
}

fn check(np: u32) {
    let exe = program();
    let _turn = common::serial();
    let started = Instant::now();
    let out = Run::udbtl(np).success(exe, &[]);
    println!("{np} ranks took {:?}", started.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for rank in 0..np {
        assert!(
            stdout.contains(&format!("RSMPI OK rank {rank} of {np}")),
            "rank {rank} did not finish its checks:\n{stdout}"
        );
    }
    common::assert_carried(&out, np);
}

/// Builds the rsmpi program once per test binary and returns it.
fn program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rsmpi/Cargo.toml");
        // Beside the harness's own build products (target/<profile>/rsmpi),
        // so that `cargo clean` removes it and reruns reuse it.
        let target = common::profile_dir().join("rsmpi");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let started = Instant::now();
        let out = Command::new(cargo)
            .args(["build", "--release", "--locked", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &target)
            // mpi-sys asks MPI_PKG_CONFIG first, then MPICC, then `mpicc`
            // (MPICH's or Open MPI's, whichever the alternatives chose),
            // then pkg-config's mpich: name Open MPI both ways.
            .env("MPI_PKG_CONFIG", "ompi")
            .env("MPICC", common::MPICC)
            .output()
            .expect("run cargo build for tests/rsmpi");
        assert!(
            out.status.success(),
            "building {} failed (rsmpi needs libclang-dev and libopenmpi-dev):\n{}",
            manifest.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("built the rsmpi program in {:?}", started.elapsed());
        target.join("release/udbtl-rsmpi-check")
    })
}
