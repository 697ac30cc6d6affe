//! `udinfo` as a user runs it: the real binary, its stdout, stderr and exit
//! status. Every run starts from an environment without `UDBTL_*` variables
//! or `RUST_LOG`, so the host's settings cannot leak in.
//!
//! The module sizes come from a component built on the `udp` provider's
//! loopback device, so these tests need `lo` up with an IPv4 address.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

/// Runs `udinfo` with `args` and only the `UDBTL_*` variables in `env`.
fn udinfo(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udinfo"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("UDBTL_") {
            cmd.env_remove(key);
        }
    }
    cmd.env_remove("RUST_LOG")
        .args(args)
        .envs(env.iter().copied());
    cmd.output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

/// The table row of the human listing whose first column is `name`.
fn row<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|line| line.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{text}"))
}

/// Checks a failed run: `code`, nothing on stdout, one line on stderr
/// containing every word of `names`.
fn assert_fails(output: &Output, code: i32, names: &[&str]) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "stderr: {err}");
    assert!(output.stdout.is_empty(), "stdout: {}", stdout(output));
    assert_eq!(err.lines().count(), 1, "one line expected: {err}");
    assert!(err.starts_with("udinfo: "), "{err}");
    for name in names {
        assert!(err.contains(name), "{name} missing from: {err}");
    }
}

#[test]
fn default_listing_shows_every_section_and_the_defaults() {
    let output = udinfo(&[], &[]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    for heading in ["Providers", "Devices", "Parameters", "Modules"] {
        assert!(
            text.lines().any(|l| l.starts_with(heading)),
            "{heading}:\n{text}"
        );
    }
    let sd_num = row(&text, "sd_num");
    assert_eq!(
        sd_num.split_whitespace().collect::<Vec<_>>(),
        [
            "sd_num",
            "128",
            "128",
            "default",
            "btl_ofud",
            "UDBTL_SD_NUM"
        ]
    );
    assert!(row(&text, "ib_qkey").contains("0x00000000"));
    assert!(row(&text, "credit").contains("shared by need"), "{text}");
    assert!(
        row(&text, "bytes_per_idle_peer").contains("never sent to or heard from"),
        "{text}"
    );
    assert!(
        row(&text, "bytes_per_active_peer").contains("peer that talked"),
        "{text}"
    );
    assert!(row(&text, "job_key").contains("udbtl"));
    assert!(row(&text, "udp").contains("real"));
    assert!(row(&text, "sim").contains("simulated"));
    let lo = row(&text, "lo");
    assert!(lo.contains("active") && lo.contains("127.0.0.1"), "{lo}");
}

#[test]
fn an_environment_value_is_shown_with_its_source() {
    let output = udinfo(&[], &[("UDBTL_SD_NUM", "64")]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(
        row(&text, "sd_num")
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>(),
        ["sd_num", "64", "128", "environment"]
    );
    let output = udinfo(
        &["--parsable", "--param", "sd_num"],
        &[("UDBTL_SD_NUM", "64")],
    );
    let text = stdout(&output);
    assert!(text.lines().any(|l| l == "param:sd_num:value:64"), "{text}");
    assert!(
        text.lines().any(|l| l == "param:sd_num:source:environment"),
        "{text}"
    );
}

#[test]
fn a_bad_value_exits_1_naming_the_parameter_and_variable() {
    let output = udinfo(&[], &[("UDBTL_SD_NUM", "abc")]);
    assert_fails(&output, 1, &["sd_num", "UDBTL_SD_NUM", "abc"]);
}

#[test]
fn include_and_exclude_together_exit_1_naming_both() {
    let output = udinfo(
        &[],
        &[("UDBTL_IF_INCLUDE", "lo"), ("UDBTL_IF_EXCLUDE", "lo")],
    );
    assert_fails(&output, 1, &["UDBTL_IF_INCLUDE", "UDBTL_IF_EXCLUDE"]);
}

#[test]
fn param_shows_that_parameter_only() {
    let output = udinfo(&["--param", "rd_num"], &[]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(row(&text, "rd_num").contains("6000"), "{text}");
    for other in ["sd_num", "Devices", "Modules", "eager_limit"] {
        assert!(!text.contains(other), "{other} in:\n{text}");
    }
    // The variable and the seed's MCA name select it too.
    for alias in ["UDBTL_RD_NUM", "btl_ofud_rd_num"] {
        assert_eq!(stdout(&udinfo(&["--param", alias], &[])), text, "{alias}");
    }
}

#[test]
fn parsable_lines_are_prefixed_by_section_and_name() {
    let output = udinfo(&["--parsable", "--param", "ib_qkey"], &[]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.lines().all(|l| l.starts_with("param:ib_qkey:")),
        "{text}"
    );
    for line in [
        "param:ib_qkey:value:0x00000000",
        "param:ib_qkey:default:0x00000000",
        "param:ib_qkey:source:default",
        "param:ib_qkey:env:UDBTL_IB_QKEY",
        "param:ib_qkey:origin:btl_ofud",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    assert_fails(&udinfo(&["--bogus"], &[]), 2, &["--bogus"]);
    assert_fails(&udinfo(&["--param", "nope"], &[]), 2, &["nope", "--param"]);
    assert_fails(&udinfo(&["--param"], &[]), 2, &["--param"]);
    assert_fails(
        &udinfo(&["--dump", "--param", "sd_num"], &[]),
        2,
        &["--dump"],
    );
}

#[test]
fn help_and_version_succeed() {
    for arg in ["--help", "--version"] {
        let output = udinfo(&[arg], &[]);
        assert!(output.status.success(), "{arg}: {}", stderr(&output));
        assert!(stdout(&output).contains("udinfo"), "{arg}");
    }
}

#[test]
fn the_eager_limit_comes_from_the_loopback_mtu() {
    // Largest IPv4 UDP payload 65507, less the 16-byte UD encapsulation
    // header (the port's max_msg_size), less the 40-byte BTL header (8
    // bytes and the 32-byte reliability extension).
    let output = udinfo(&[], &[]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let eager = row(&text, "eager_limit");
    assert!(eager.contains("65451"), "{eager}");
    assert!(eager.contains("max_send_size unset"), "{eager}");
    assert!(row(&text, "lo").contains("65491"));
    let text = stdout(&udinfo(&["--parsable"], &[]));
    assert!(
        text.lines().any(|l| l == "module:lo:1:eager_limit:65451"),
        "{text}"
    );
}

#[test]
fn max_send_size_sets_the_eager_limit() {
    let env = [("UDBTL_MAX_SEND_SIZE", "2048")];
    let output = udinfo(&[], &env);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    let eager = row(&text, "eager_limit");
    assert!(eager.contains("2008"), "{eager}");
    assert!(eager.contains("(environment)"), "{eager}");
    let text = stdout(&udinfo(&["--parsable"], &env));
    for line in [
        "module:lo:1:eager_limit:2008",
        "module:lo:1:max_send_size:2008",
        "module:lo:1:rndv_eager_limit:2008",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }
}

#[test]
fn no_module_is_reported_on_stderr_and_the_listing_exits_1() {
    let output = udinfo(&[], &[("UDBTL_IF_EXCLUDE", "lo")]);
    assert_eq!(output.status.code(), Some(1), "stderr: {}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("UDBTL_IF_EXCLUDE=lo left out all of the interfaces"),
        "{err}"
    );
    assert!(err.contains("lo (127.0.0.1/8"), "{err}");
    let text = stdout(&output);
    assert!(row(&text, "sd_num").contains("128"));
    assert!(
        text.lines()
            .all(|l| l.split_whitespace().next() != Some("eager_limit")),
        "{text}"
    );
}

#[test]
fn dump_shows_each_modules_state() {
    let output = udinfo(&["--dump"], &[]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("module lo:1 (udp/ipv4)"), "{text}");
    // rd_num at its default is lowered so 64 KiB buffers fit rd_mem (64 MiB).
    assert!(
        text.contains("receive buffers    1024 x 65536 bytes"),
        "{text}"
    );
}

/// A missing interface exits 1 naming it, the variable, and the interfaces
/// that exist; the listing is still printed.
#[test]
fn a_missing_interface_exits_1_naming_it_and_those_that_exist() {
    for (var, value) in [
        ("UDBTL_UDP_IF", "nonexistent"),
        ("UDBTL_IF_INCLUDE", "eth9"),
    ] {
        let output = udinfo(&[], &[(var, value)]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains(&format!("{var}={value}")), "{err}");
        assert!(err.contains("lo (127.0.0.1/8"), "{err}");
        assert!(stdout(&output).contains("Modules"));
    }
}

/// `--param rd_num` shows the value asked for and the value in force (the
/// default 6000 is lowered to fit rd_mem with 64 KiB loopback buffers).
#[test]
fn param_shows_the_value_in_force_beside_the_one_asked_for() {
    let output = udinfo(&["--param", "rd_num"], &[]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(row(&text, "rd_num").contains("6000"), "{text}");
    assert!(text.contains("in force: 1024"), "{text}");
    assert!(text.contains("lowered to fit rd_mem"), "{text}");

    let output = udinfo(&["--param", "rd_num", "--parsable"], &[]);
    assert!(stdout(&output).contains("param:rd_num:in_force:1024"));

    // Set explicitly, it is used as given: nothing more to show.
    let output = udinfo(&["--param", "rd_num"], &[("UDBTL_RD_NUM", "512")]);
    assert!(!stdout(&output).contains("in force"), "{}", stdout(&output));

    // send_frags_max is lowered to fit send_mem in the same way.
    let output = udinfo(&["--param", "send_frags_max", "--parsable"], &[]);
    let text = stdout(&output);
    assert!(text.contains("param:send_frags_max:value:8192"), "{text}");
    assert!(text.contains("param:send_frags_max:in_force:"), "{text}");
}

/// Every variable the library reads is listed, the ones that are not
/// parameters with their values.
#[test]
fn the_variables_that_are_not_parameters_are_listed() {
    let output = udinfo(&[], &[("UDBTL_DUMP", "1")]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("Other variables"), "{text}");
    assert!(row(&text, "UDBTL_DUMP").contains('1'), "{text}");
    for var in [
        "UDBTL_MODEX",
        "UDBTL_FAULT_DROP",
        "UDBTL_FAULT_DUPLICATE",
        "UDBTL_FAULT_REORDER",
        "UDBTL_FAULT_SEED",
    ] {
        assert!(row(&text, var).contains("unset"), "{var}: {text}");
    }
    let output = udinfo(&["--parsable"], &[]);
    assert!(stdout(&output).contains("env:UDBTL_MODEX:value:unset"));
}

/// A misspelled variable is reported with the closest real name; the
/// listing still succeeds.
#[test]
fn a_misspelled_variable_is_reported_with_the_closest_name() {
    let output = udinfo(&["--param", "sd_num"], &[("UDBTL_SDNUM", "4")]);
    assert!(output.status.success(), "stderr: {}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("UDBTL_SDNUM is not a udbtl variable"), "{err}");
    assert!(err.contains("did you mean UDBTL_SD_NUM?"), "{err}");
}

/// `provider=sim` is shown as selected but refused, and nothing is built.
#[test]
fn the_simulated_provider_is_shown_refused() {
    let output = udinfo(&[], &[("UDBTL_PROVIDER", "sim")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(row(&stdout(&output), "sim").contains("refused"));
    assert!(stderr(&output).contains("UDBTL_PROVIDER=sim"));
}
