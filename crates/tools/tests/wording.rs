//! What a new user reads (issue 30): parameters found by any of their
//! names with a suggestion for a misspelt one, counts in the singular,
//! no Rust enum names or "(os error N)" in messages, and mpirun's options
//! udrun lacks refused plainly with what to do instead. Real binaries, no
//! timings.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};
use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

/// Runs `udinfo args` without any `UDBTL_*` variable or `RUST_LOG`.
fn udinfo(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udinfo"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("UDBTL_") {
            cmd.env_remove(key);
        }
    }
    cmd.env_remove("RUST_LOG").args(args).output().unwrap()
}

/// Runs `udrun args` (with [`common`]'s clean environment, without its
/// `UDRUN_OVERSUBSCRIBE`) and returns its exit status, stdout and stderr.
fn udrun(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = common::clean_command(common::udrun_exe(), args, env);
    cmd.env_remove("UDRUN_OVERSUBSCRIBE");
    let finished = common::finish(cmd.spawn().unwrap(), Duration::from_secs(60));
    assert!(!finished.timed_out, "udrun {args:?} hung");
    let (stdout, stderr) = common::text(&finished.output);
    (finished.output.status.code(), stdout, stderr)
}

#[test]
fn udinfo_finds_a_parameter_by_its_mca_and_environment_names() {
    let want = udinfo(&["--parsable", "--param", "sd_num"]);
    assert!(want.status.success(), "{want:?}");
    assert!(!want.stdout.is_empty());
    for name in [
        "btl_udbtl_sd_num",
        "UDBTL_SD_NUM",
        "OMPI_MCA_btl_udbtl_sd_num",
        "btl_ofud_sd_num",
    ] {
        let got = udinfo(&["--parsable", "--param", name]);
        assert!(got.status.success(), "{name}: {got:?}");
        assert_eq!(got.stdout, want.stdout, "{name}");
    }
}

#[test]
fn udinfo_suggests_the_parameter_a_misspelling_meant() {
    for (given, meant) in [
        ("sd_nmu", "did you mean sd_num?"),
        ("btl_udbtl_sd_nmu", "did you mean btl_udbtl_sd_num?"),
        ("UDBTL_RD_NUN", "did you mean UDBTL_RD_NUM?"),
    ] {
        let output = udinfo(&["--param", given]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{given}: {stderr}");
        assert!(output.stdout.is_empty(), "{given}");
        assert_eq!(stderr.lines().count(), 1, "{given}: {stderr}");
        assert!(stderr.contains(given), "{given}: {stderr}");
        assert!(stderr.contains(meant), "{given}: {stderr}");
    }
}

#[test]
fn one_slot_is_one_slot() {
    let (code, stdout, stderr) = udrun(&["-n", "2", "--host", "localhost:1", "true"], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("udrun: 2 ranks but 1 slot in the host list:"),
        "{stderr}"
    );
}

#[test]
fn a_missing_hostfile_is_named_in_words() {
    let missing = "/nonexistent/udrun-wording-hosts";
    let (code, _, stderr) = udrun(&["--hostfile", missing, "-n", "2", "true"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr,
        format!("udrun: cannot read hostfile {missing}: No such file or directory\n")
    );
    // mpirun's single-dash spelling is the same option (it used to print
    // udrun's help, taken for -h).
    let (code, _, stderr) = udrun(&["-hostfile", missing, "-n", "2", "true"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot read hostfile"), "{stderr}");
}

#[test]
fn mpirun_options_udrun_lacks_are_refused_plainly() {
    for (args, says) in [
        (
            &["--map-by", "core", "-n", "2", "true"][..],
            &["--map-by is not supported", "--host a:2,b:2"][..],
        ),
        (
            &["-n", "2", "--rank-by", "slot", "true"][..],
            &["--rank-by is not supported"][..],
        ),
        (
            &["-n", "2", "--bind-to", "socket", "true"][..],
            &["--bind-to socket is not supported", "--bind-to core"][..],
        ),
        (
            &["--mca", "btl_udbtl_sd_num", "256", "-n", "2", "true"][..],
            &["--mca is not supported", "-x UDBTL_SD_NUM=256"][..],
        ),
        (
            &["-mca", "btl", "self", "-n", "2", "true"][..],
            &["-mca is not supported", "-x UDBTL_<NAME>=VALUE"][..],
        ),
    ] {
        let (code, stdout, stderr) = udrun(args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(!stderr.contains("tip:"), "{args:?}: {stderr}");
        for say in says {
            assert!(stderr.contains(say), "{args:?}: {say} not in {stderr}");
        }
    }
    // --np and -host are mpirun's names for udrun's options.
    let (code, stdout, stderr) = udrun(
        &[
            "--np",
            "2",
            "-host",
            "localhost:2",
            "sh",
            "-c",
            "echo $PMI_SIZE",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout, "2\n2\n");
}

#[test]
fn udhello_names_the_modex_as_udbtl_modex_spells_it() {
    for (mode, want) in [(None, "modex bulk)"), (Some("lazy"), "modex lazy)")] {
        let env: Vec<(&str, &str)> = mode.map(|m| ("UDBTL_MODEX", m)).into_iter().collect();
        let (code, stdout, stderr) = udrun(
            &["-n", "2", "--oversubscribe", env!("CARGO_BIN_EXE_udhello")],
            &env,
        );
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        assert_eq!(
            stdout.lines().filter(|l| l.ends_with(want)).count(),
            2,
            "{stdout}"
        );
    }
}
