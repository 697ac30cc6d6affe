//! The build-script side: turning the probes into cargo directives.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::Prereq;
use crate::probe::probe;

/// Probes each of `needs` and prints, for cargo (the build script's only
/// output), [`directives`]: call it from a test crate's `build.rs`.
pub fn emit(needs: &[Prereq]) {
    print!("{}", directives(needs));
}

/// The cargo directives for `needs`, one per line:
///
/// * `cargo::rustc-check-cfg` declaring `udbtl_missing` with the values of
///   `needs` only, so that a test naming another (a typo, or a prerequisite
///   this crate does not probe) is warned about (`unexpected_cfgs`);
/// * `cargo::rustc-cfg=udbtl_missing="<value>"` for each one missing;
/// * `cargo::rerun-if-changed` for `build.rs` and for what each probe
///   watches (every path exists: a missing one would rerun the script, and
///   rebuild the crate, at every build), and `cargo::rerun-if-env-changed`
///   for the variables it reads (such as `PATH`). A program, package or
///   tool that appears later thus reruns the probes at the next build.
pub fn directives(needs: &[Prereq]) -> String {
    let mut out = String::new();
    let values: BTreeSet<&str> = needs.iter().map(|n| n.cfg_value()).collect();
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "cargo::rustc-check-cfg=cfg(udbtl_missing, values({}))",
        quoted.join(", ")
    );
    let _ = writeln!(out, "cargo::rerun-if-changed=build.rs");
    let mut watch = BTreeSet::new();
    let mut env = BTreeSet::new();
    for need in needs {
        let finding = probe(*need);
        if finding.missing.is_some() {
            let _ = writeln!(out, "cargo::rustc-cfg=udbtl_missing={:?}", need.cfg_value());
        }
        watch.extend(finding.watch);
        env.extend(finding.env);
    }
    for path in watch {
        let _ = writeln!(out, "cargo::rerun-if-changed={}", path.display());
    }
    for var in env {
        let _ = writeln!(out, "cargo::rerun-if-env-changed={var}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_sets_its_cfg_and_a_present_one_does_not() {
        let out = directives(&[Prereq::Program("sh"), Prereq::Program("udbtl-no-such-tool")]);
        assert!(
            out.contains(
                "cargo::rustc-check-cfg=cfg(udbtl_missing, values(\"sh\", \"udbtl-no-such-tool\"))"
            ),
            "{out}"
        );
        assert!(
            out.contains("cargo::rustc-cfg=udbtl_missing=\"udbtl-no-such-tool\"\n"),
            "{out}"
        );
        assert!(!out.contains("udbtl_missing=\"sh\""), "{out}");
        assert!(out.contains("cargo::rerun-if-env-changed=PATH\n"), "{out}");
        // The missing one watches the PATH's folders for its arrival.
        assert!(out.contains("cargo::rerun-if-changed=/"), "{out}");
    }
}
