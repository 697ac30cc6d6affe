//! What a test needs from the machine it runs on, and how a test that
//! cannot have it shows as skipped.
//!
//! `cargo test` counts a test that returns early as passed, so a test
//! whose prerequisite is missing must instead be *ignored*, with its
//! reason, which the summary counts and the listing shows
//! (`test x ... ignored, SKIPPED: needs root`). Most prerequisites are
//! facts of the machine, known before the test runs, so the test crate's
//! build script probes them with [`emit`], which sets one cfg per missing
//! one, `udbtl_missing = "<name>"` (the names are [`Prereq::cfg_value`]),
//! and each such test carries
//!
//! ```text
//! #[test]
//! #[cfg_attr(
//!     any(udbtl_missing = "root", udbtl_missing = "nft"),
//!     ignore = "SKIPPED: needs root and nft (CI has them)"
//! )]
//! fn kernel_drops() {
//!     udbtl_prereq::require!(Prereq::Root, Prereq::Program("nft"));
//!     ...
//! ```
//!
//! The build script reruns when what it probed can have changed (see
//! [`emit`]), so a prerequisite installed after a build is picked up by
//! the next `cargo test` without `cargo clean`.
//!
//! The build-time answer can be wrong when the test runs: built as root
//! and run as another user, a Slurm that stopped since, a test binary run
//! by hand with another `PATH`. So the test also checks at run time
//! ([`require!`]); a test skipped there prints `SKIPPED: <reason>`, returns
//! (and so counts as passed), and appends `<test> (<binary>): <reason>` to
//! `<target dir>/udbtl-skipped.txt` ([`RECORD_FILE`]), which `.ci/run`
//! fails on. [`skipped!`] does the same for a reason only the test itself
//! can find out (a kernel that refuses a rule, a build that fails for want
//! of a crate).
//!
//! Std only: it is a build dependency of crates low in the workspace.

mod emit;
mod probe;
mod record;

pub use emit::{directives, emit};
pub use probe::{python_with_mpi4py, shared_tools_dir};
pub use record::{RECORD_FILE, record_path, record_skip};

/// One thing a test needs from the machine.
///
/// Each is probed the same way by [`emit`] (in a build script) and by
/// [`missing`] (in the test).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Prereq {
    /// The process runs as root (effective user id 0): network namespaces,
    /// nftables, raw and packet sockets, switching users.
    Root,
    /// An executable of this name on the `PATH` (or at this path, if it
    /// holds a `/`). Its cfg value is the name itself.
    Program(&'static str),
    /// Open MPI as the tests run it: `mpirun.openmpi` and `mpicc.openmpi`
    /// (Debian's names; MPICH may be installed beside it).
    OpenMpi,
    /// `twohosts` and `nsssh` of the stand-in host tools ([`shared_tools_dir`]),
    /// and the `ip` and `flock` they and the tests use.
    SharedTools,
    /// A Python 3 that imports `mpi4py` ([`python_with_mpi4py`]).
    Mpi4py,
    /// libclang, which bindgen loads (for the rsmpi test program).
    Libclang,
    /// A Slurm cluster that answers `sinfo` within a few seconds, and
    /// `srun`.
    Slurm,
    /// `UDBTL_TEST_VERBS_DEVICE` names an RDMA device (`dev` or
    /// `dev:port`) for the `verbs` provider's tests.
    VerbsDevice,
}

impl Prereq {
    /// The value of the `udbtl_missing` cfg that [`emit`] sets when this is
    /// missing: `root`, `openmpi`, `shared_tools`, `mpi4py`, `libclang`,
    /// `slurm`, `verbs_device`, or a program's name.
    pub fn cfg_value(self) -> &'static str {
        match self {
            Self::Root => "root",
            Self::Program(name) => name,
            Self::OpenMpi => "openmpi",
            Self::SharedTools => "shared_tools",
            Self::Mpi4py => "mpi4py",
            Self::Libclang => "libclang",
            Self::Slurm => "slurm",
            Self::VerbsDevice => "verbs_device",
        }
    }

    /// Why this is missing here and now (with how to get it), or `None`
    /// when it is present.
    pub fn missing(self) -> Option<String> {
        probe::probe(self).missing
    }
}

/// Why a test that needs all of `needs` cannot run here and now (each
/// missing one's reason, joined with `; `), or `None` when it can.
pub fn missing(needs: &[Prereq]) -> Option<String> {
    let reasons: Vec<String> = needs.iter().filter_map(|need| need.missing()).collect();
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Says that the calling test is skipped, for the reason given as
/// `format!` arguments: prints `SKIPPED: <reason>` and records the skip
/// in [`RECORD_FILE`] (see [`record_skip`]). The caller then returns.
///
/// Only for integration tests (it reads `CARGO_TARGET_TMPDIR`, which cargo
/// sets for them alone), on the test's own thread (whose name is the
/// test's).
#[macro_export]
macro_rules! skipped {
    ($($reason:tt)+) => {
        $crate::record_skip(
            ::std::path::Path::new(::std::env!("CARGO_TARGET_TMPDIR")),
            &::std::format!($($reason)+),
        )
    };
}

/// Returns early from the calling test (a function returning `()`), as
/// [`skipped!`], when any of the [`Prereq`]s given is missing at run time.
///
/// The test's `cfg_attr(..., ignore = ...)` normally keeps it from running
/// at all where they are missing; this catches a build-time answer that no
/// longer holds.
#[macro_export]
macro_rules! require {
    ($($need:expr),+ $(,)?) => {
        if let ::std::option::Option::Some(reason) = $crate::missing(&[$($need),+]) {
            $crate::skipped!("{reason}");
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_on_the_path_is_found_and_a_made_up_one_is_not() {
        assert_eq!(missing(&[Prereq::Program("sh")]), None);
        let reason = missing(&[Prereq::Program("sh"), Prereq::Program("udbtl-no-such-tool")]);
        assert!(
            reason
                .as_deref()
                .is_some_and(|r| r.contains("udbtl-no-such-tool")),
            "{reason:?}"
        );
    }

    #[test]
    fn cfg_values_are_distinct() {
        let all = [
            Prereq::Root,
            Prereq::OpenMpi,
            Prereq::SharedTools,
            Prereq::Mpi4py,
            Prereq::Libclang,
            Prereq::Slurm,
            Prereq::VerbsDevice,
        ];
        let values: std::collections::BTreeSet<_> = all.iter().map(|p| p.cfg_value()).collect();
        assert_eq!(values.len(), all.len());
    }
}
