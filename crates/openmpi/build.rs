//! Compiles the Open MPI side of the component (`src/component.c`) against
//! the installed Open MPI headers, so that every struct layout comes from
//! them, and exports the component's struct from the shared object.
//!
//! Open MPI is found through `mpicc.openmpi --showme` (or `UDBTL_OMPI_MPICC`
//! naming another wrapper). Without it the crate builds as an empty library
//! and says so.

use std::env;
use std::path::PathBuf;
use std::process::Command;

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

fn main() {
    println!("cargo:rustc-check-cfg=cfg(udbtl_openmpi)");
    println!("cargo:rerun-if-changed=src/component.c");
    println!("cargo:rerun-if-changed=src/exports.map");
    println!("cargo:rerun-if-env-changed=UDBTL_OMPI_MPICC");
    let mpicc = env::var("UDBTL_OMPI_MPICC").unwrap_or_else(|_| "mpicc.openmpi".into());
    let (Some(incdirs), Some(libdirs)) = (showme(&mpicc, "incdirs"), showme(&mpicc, "libdirs"))
    else {
        println!(
            "cargo:warning=Open MPI not found ({mpicc} --showme failed): mca_btl_udbtl is \
             built empty. Install openmpi-bin and libopenmpi-dev to build the component."
        );
        return;
    };
    let headers_present = incdirs
        .iter()
        .any(|dir| PathBuf::from(dir).join("opal/mca/btl/btl.h").exists());
    if !headers_present {
        println!(
            "cargo:warning=Open MPI's internal headers (opal/mca/btl/btl.h) are missing under \
             {incdirs:?}: mca_btl_udbtl is built empty. Install libopenmpi-dev."
        );
        return;
    }
    let mut build = cc::Build::new();
    build
        .file("src/component.c")
        .warnings(true)
        .extra_warnings(true);
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
