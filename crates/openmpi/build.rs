//! Compiles the Open MPI side of the component (`src/*.c`) against
//! the installed Open MPI headers, so that every struct layout comes from
//! them, and exports the component's struct from the shared object.
//!
//! Open MPI is found through `mpicc.openmpi --showme` (or `UDBTL_OMPI_MPICC`
//! naming another wrapper). Without it the crate builds as an empty library
//! and says so; the script then reruns at every build until the wrapper and
//! headers appear, so installing Open MPI later needs no `cargo clean`.
//!
//! It also probes what the tests need (udbtl-prereq), so that a test that
//! cannot run here is ignored with its reason.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use udbtl_prereq::Prereq;

/// The C side of the component (see `src/udbtl.h`).
const C_FILES: &[&str] = &[
    "src/component.c",
    "src/module.c",
    "src/procs.c",
    "src/params.c",
    "src/rdma.c",
    "src/local_read.c",
];

fn showme(mpicc: &str, what: &str) -> Option<Vec<String>> {
    let out = Command::new(mpicc)
        .arg(format!("--showme:{what}"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// What to watch so that this script reruns once `mpicc` appears: the
/// wrapper when it is found, else every folder of `PATH` it could appear in.
/// (A folder's own time changes when a file is added to it; a file that a
/// package installs keeps the package's old time, so watching the missing
/// file itself would miss its arrival.)
fn wrapper_watch(mpicc: &str) -> Vec<PathBuf> {
    let wrapper = PathBuf::from(mpicc);
    if mpicc.contains('/') {
        let folder = wrapper.parent().map(PathBuf::from).unwrap_or_default();
        return vec![if wrapper.exists() { wrapper } else { folder }];
    }
    let dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|path| env::split_paths(&path).filter(|d| d.is_dir()).collect())
        .unwrap_or_default();
    match dirs.iter().map(|d| d.join(mpicc)).find(|p| p.exists()) {
        Some(found) => vec![found],
        None => dirs,
    }
}

fn main() {
    // What the crate's tests need from the machine (see udbtl-prereq): each
    // one missing sets `udbtl_missing = "<name>"`, which marks the tests
    // that need it ignored, with their reason.
    udbtl_prereq::emit(&[
        Prereq::OpenMpi,
        // forged.rs, twohosts.rs, warnings.rs.
        Prereq::Root,
        Prereq::Program("runuser"),
        Prereq::SharedTools,
        // programs_threads.rs, rsmpi.rs.
        Prereq::Mpi4py,
        Prereq::Libclang,
    ]);
    println!("cargo:rustc-check-cfg=cfg(udbtl_openmpi)");
    for file in C_FILES.iter().chain(&["src/udbtl.h"]) {
        println!("cargo:rerun-if-changed={file}");
    }
    println!("cargo:rerun-if-changed=src/exports.map");
    println!("cargo:rerun-if-env-changed=UDBTL_OMPI_MPICC");
    println!("cargo:rerun-if-env-changed=PATH");
    let mpicc = env::var("UDBTL_OMPI_MPICC").unwrap_or_else(|_| "mpicc.openmpi".into());
    for path in wrapper_watch(&mpicc) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let (Some(incdirs), Some(libdirs)) = (showme(&mpicc, "incdirs"), showme(&mpicc, "libdirs"))
    else {
        println!(
            "cargo:warning=Open MPI not found ({mpicc} --showme failed): mca_btl_udbtl is \
             built empty. Install openmpi-bin and libopenmpi-dev; the next build builds it."
        );
        return;
    };
    let header = incdirs
        .iter()
        .map(|dir| PathBuf::from(dir).join("opal/mca/btl/btl.h"))
        .find(|h| h.exists());
    let Some(header) = header else {
        // Installing the headers adds to the nearest folder that exists on
        // the way to each, which reruns this.
        for dir in &incdirs {
            if let Some(existing) = Path::new(dir).ancestors().find(|a| a.is_dir()) {
                println!("cargo:rerun-if-changed={}", existing.display());
            }
        }
        println!(
            "cargo:warning=Open MPI's internal headers (opal/mca/btl/btl.h) are missing under \
             {incdirs:?}: mca_btl_udbtl is built empty. Install libopenmpi-dev; the next build \
             builds it."
        );
        return;
    };
    // A new Open MPI (another ABI) rebuilds the component.
    println!("cargo:rerun-if-changed={}", header.display());
    let mut build = cc::Build::new();
    build.files(C_FILES).warnings(true).extra_warnings(true);
    // Open MPI's headers are not clean under -Wextra.
    build.flag_if_supported("-Wno-unused-parameter");
    build.flag_if_supported("-Wno-sign-compare");
    build.flag_if_supported("-Wno-missing-field-initializers");
    for dir in &incdirs {
        build.include(dir);
    }
    build.compile("udbtl_ompi_glue");
    for dir in &libdirs {
        println!("cargo:rustc-link-search=native={dir}");
    }
    println!("cargo:rustc-link-lib=dylib=open-pal");
    // rustc exports only Rust's own symbols from a cdylib; this second
    // version script adds the component struct Open MPI looks up by name.
    let manifest = env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={manifest}/src/exports.map");
    println!("cargo:rustc-cfg=udbtl_openmpi");
}
