//! A Rust program using rsmpi (the `mpi` crate, `tests/rsmpi/`) runs over
//! udbtl: point-to-point and collectives with every result checked, at 2
//! and 3 ranks.
//!
//! The program is its own Cargo project (rsmpi's build runs bindgen, which
//! needs libclang, and links libmpi: the workspace should need neither), built
//! here against Open MPI, offline; MPICH is installed beside it and must not
//! be picked. Without libclang the tests are ignored (`SKIPPED: ...`);
//! without its crates in cargo's cache, which only building it tells, they
//! say `SKIPPED: <reason>` and record it (see udbtl-prereq).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use common::Run;

#[test]
#[cfg_attr(
    any(udbtl_missing = "openmpi", udbtl_missing = "libclang"),
    ignore = "SKIPPED: needs Open MPI and libclang (apt-get install libclang-dev)"
)]
fn rsmpi_two_ranks() {
    require_openmpi!();
    check(2);
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "openmpi", udbtl_missing = "libclang"),
    ignore = "SKIPPED: needs Open MPI and libclang (apt-get install libclang-dev)"
)]
fn rsmpi_three_ranks() {
    require_openmpi!();
    check(3);
}

fn check(np: u32) {
    let exe = match program() {
        Ok(exe) => exe,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
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

/// Builds the rsmpi program once per test binary and returns it, or why it
/// cannot be built here: libclang missing (rsmpi's bindings are generated
/// by bindgen), or its crates not in cargo's cache. The build is offline:
/// a test fetches nothing. `.ci/run` fetches the crates beforehand with
/// `cargo fetch --manifest-path crates/openmpi/tests/rsmpi/Cargo.toml`.
fn program() -> Result<&'static Path, String> {
    static EXE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    EXE.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rsmpi/Cargo.toml");
        // Beside the harness's own build products (target/<profile>/rsmpi),
        // so that `cargo clean` removes it and reruns reuse it.
        let target = common::profile_dir().join("rsmpi");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let started = Instant::now();
        let out = Command::new(cargo)
            .args([
                "build",
                "--offline",
                "--release",
                "--locked",
                "--manifest-path",
            ])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &target)
            // mpi-sys asks MPI_PKG_CONFIG first, then MPICC, then `mpicc`
            // (MPICH's or Open MPI's, whichever the alternatives chose),
            // then pkg-config's mpich: name Open MPI both ways.
            .env("MPI_PKG_CONFIG", "ompi")
            .env("MPICC", common::MPICC)
            .output()
            .expect("run cargo build for tests/rsmpi");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(skip_reason(&stderr)
                .unwrap_or_else(|| panic!("building {} failed:\n{stderr}", manifest.display())));
        }
        println!("built the rsmpi program in {:?}", started.elapsed());
        Ok(target.join("release/udbtl-rsmpi-check"))
    })
    .as_deref()
    .map_err(Clone::clone)
}

/// Why a failed build of the rsmpi program is a missing prerequisite rather
/// than a fault, from what cargo printed; `None` for any other failure.
fn skip_reason(stderr: &str) -> Option<String> {
    if stderr.contains("Unable to find libclang") {
        return Some(
            "the rsmpi program needs libclang (its bindings are made by bindgen): \
             apt-get install libclang-dev"
                .into(),
        );
    }
    let offline = [
        "--offline",
        "no matching package",
        "failed to download",
        "not available offline",
    ];
    offline.iter().any(|sign| stderr.contains(sign)).then(|| {
        "the rsmpi program's crates are not in cargo's cache and tests fetch nothing: run \
         `cargo fetch --manifest-path crates/openmpi/tests/rsmpi/Cargo.toml` once (CI does)"
            .into()
    })
}

#[test]
fn missing_prerequisites_are_told_apart_from_faults() {
    assert!(skip_reason("  Unable to find libclang: \"couldn't find\"").is_some());
    assert!(skip_reason("error: no matching package named `mpi` found").is_some());
    assert!(skip_reason("error[E0308]: mismatched types").is_none());
}
