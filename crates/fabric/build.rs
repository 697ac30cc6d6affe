//! Builds the libibverbs shim of the `verbs` provider, only when the
//! `verbs` feature is on. Without it the crate has no native dependency.
//!
//! Also probes what the crate's tests need from the machine (see
//! udbtl-prereq): each one missing sets `udbtl_missing = "<name>"`, which
//! marks the tests that need it ignored, with their reason.

use udbtl_prereq::Prereq;

fn main() {
    // tests/udp_kernel.rs and tests/verbs_device.rs.
    udbtl_prereq::emit(&[
        Prereq::Root,
        Prereq::Program("nft"),
        Prereq::Program("unshare"),
        Prereq::VerbsDevice,
    ]);
    #[cfg(feature = "verbs")]
    verbs::build();
}

#[cfg(feature = "verbs")]
mod verbs {
    /// Compiles `src/ibv/shim.c` and links `libibverbs`.
    ///
    /// `UDBTL_IBVERBS_INCLUDE` and `UDBTL_IBVERBS_LIB` point at an rdma-core
    /// installed outside the system paths.
    pub(super) fn build() {
        const SHIM: &str = "src/ibv/shim.c";
        println!("cargo:rerun-if-changed={SHIM}");
        println!("cargo:rerun-if-env-changed=UDBTL_IBVERBS_INCLUDE");
        println!("cargo:rerun-if-env-changed=UDBTL_IBVERBS_LIB");
        let mut build = cc::Build::new();
        build.file(SHIM).warnings(true).extra_warnings(true);
        if let Ok(dir) = std::env::var("UDBTL_IBVERBS_INCLUDE") {
            build.include(dir);
        }
        build.compile("udbtl_ibv_shim");
        if let Ok(dir) = std::env::var("UDBTL_IBVERBS_LIB") {
            println!("cargo:rustc-link-search=native={dir}");
        }
        println!("cargo:rustc-link-lib=dylib=ibverbs");
    }
}
