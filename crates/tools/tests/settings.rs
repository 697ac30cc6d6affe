//! Settings as a job sees them: real `udhello` jobs under `udrun`, each with
//! one `UDBTL_*` setting, checking that warnings reach the user (once per
//! job where every rank would give the same), that no setting is accepted
//! and then ignored or broken, and that errors name what is wrong.

#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::Duration;

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

use common::text;

const UDHELLO: &str = env!("CARGO_BIN_EXE_udhello");

/// `udrun -n <ranks> udhello` with exactly `env` as its `UDBTL_*`
/// environment and without `RUST_LOG` unless `env` sets it.
fn hello(ranks: u32, env: &[(&str, &str)]) -> Output {
    let n = ranks.to_string();
    let mut command = common::clean_command(env!("CARGO_BIN_EXE_udrun"), &["-n", &n, UDHELLO], env);
    if !env.iter().any(|(k, _)| *k == "RUST_LOG") {
        command.env_remove("RUST_LOG");
    }
    let finished = common::finish(command.spawn().unwrap(), Duration::from_secs(60));
    assert!(
        !finished.timed_out,
        "{env:?} hung: {:?}",
        text(&finished.output)
    );
    finished.output
}

/// A job that must succeed, every rank greeting every other; its stderr.
fn hello_succeeds(ranks: u32, env: &[(&str, &str)]) -> String {
    let output = hello(ranks, env);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{env:?}:\n{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("greeted and acknowledged").count(),
        ranks as usize,
        "{stdout}"
    );
    stderr
}

/// A job that must fail without a panic; its stderr.
fn hello_fails(ranks: u32, env: &[(&str, &str)]) -> String {
    let output = hello(ranks, env);
    let (stdout, stderr) = text(&output);
    assert!(
        !output.status.success(),
        "{env:?} succeeded:\n{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

// ----- 3. warnings reach the user ------------------------------------------------

/// A library warning reaches stderr without `RUST_LOG`; `RUST_LOG=error`
/// silences it, and `RUST_LOG=debug` shows more.
#[test]
fn library_warnings_reach_stderr_at_warn_by_default() {
    let stderr = hello_succeeds(2, &[("UDBTL_SD_NUMS", "4")]);
    assert!(stderr.contains("WARN"), "{stderr}");
    assert!(stderr.contains("UDBTL_SD_NUMS"), "{stderr}");
    assert!(!stderr.contains("DEBUG"), "{stderr}");

    let stderr = hello_succeeds(2, &[("UDBTL_SD_NUMS", "4"), ("RUST_LOG", "error")]);
    assert!(!stderr.contains("UDBTL_SD_NUMS"), "{stderr}");

    let stderr = hello_succeeds(1, &[("RUST_LOG", "debug")]);
    assert!(stderr.contains("DEBUG"), "{stderr}");
}

/// Fault injection warns once for the whole job, from rank 0, naming the
/// variables.
#[test]
fn fault_injection_warns_once_per_job() {
    let stderr = hello_succeeds(
        4,
        &[("UDBTL_FAULT_DROP", "0.01"), ("UDBTL_FAULT_SEED", "3")],
    );
    assert_eq!(
        stderr.matches("fault injection is on").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("UDBTL_FAULT_DROP=0.01"), "{stderr}");
    let stderr = hello_succeeds(2, &[]);
    assert!(!stderr.contains("fault injection"), "{stderr}");
}

/// Whether the kernel would cap a request of `bytes` for a process without
/// CAP_NET_ADMIN.
fn can_provoke_a_cap(bytes: u64) -> bool {
    let max = |name| {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    max("rmem_max").is_some_and(|m| m < bytes) && max("wmem_max").is_some_and(|m| m < bytes)
}

/// A socket buffer the kernel capped warns, once per process and
/// direction, naming the sysctl to raise (as the README promises).
///
/// Needs `setpriv` (ignored without it, `SKIPPED: ...`), and
/// `net.core.rmem_max` and `wmem_max` below 1 GiB (they are, unless raised
/// by hand): a sysctl is a state, so that is checked, and a skip recorded,
/// when the test runs.
#[test]
#[cfg_attr(
    udbtl_missing = "setpriv",
    ignore = "SKIPPED: needs setpriv (util-linux)"
)]
fn a_capped_socket_buffer_warns_naming_the_sysctl() {
    let bytes: u64 = 1 << 30;
    udbtl_prereq::require!(udbtl_prereq::Prereq::Program("setpriv"));
    if !can_provoke_a_cap(bytes) {
        udbtl_prereq::skipped!("net.core.rmem_max or wmem_max already allow 1 GiB");
        return;
    }
    // Without CAP_NET_ADMIN the process cannot force past the cap.
    let mut command = common::clean_command(
        "setpriv",
        &[
            "--bounding-set=-net_admin",
            "--inh-caps=-net_admin",
            env!("CARGO_BIN_EXE_udrun"),
            "-n",
            "2",
            UDHELLO,
        ],
        &[("UDBTL_UDP_SOCKBUF", "1g")],
    );
    command.env_remove("RUST_LOG");
    let finished = common::finish(command.spawn().unwrap(), Duration::from_secs(60));
    let (stdout, stderr) = text(&finished.output);
    assert!(finished.output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("net.core.rmem_max"), "{stderr}");
    assert!(stderr.contains("net.core.wmem_max"), "{stderr}");
    // One warning per rank and direction, however many sockets: udrun
    // prints the two ranks' identical lines once, as "[ranks 0-1] ...",
    // unless they came too far apart to be merged.
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("net.core.rmem_max to"))
        .collect();
    assert!(
        warnings.len() == 2 || (warnings.len() == 1 && warnings[0].starts_with("[ranks 0-1]")),
        "{stderr}"
    );
}

// ----- 4. no setting accepted and then ignored or broken -------------------------

/// `UDBTL_PROVIDER=sim` names the in-process test fabric: refused, with the
/// reason, instead of running on udp.
#[test]
fn the_simulated_provider_is_refused_with_a_reason() {
    let stderr = hello_fails(2, &[("UDBTL_PROVIDER", "sim")]);
    assert!(stderr.contains("UDBTL_PROVIDER=sim"), "{stderr}");
    assert!(stderr.contains("cannot connect processes"), "{stderr}");
    hello_succeeds(2, &[("UDBTL_PROVIDER", "udp")]);
}

/// `UDBTL_UDP_MTU` below the bound is refused naming it; at the bound a job
/// runs (udhello's 264-byte greeting fits one datagram).
#[test]
fn udp_mtu_below_the_bound_is_refused_and_the_bound_works() {
    let stderr = hello_fails(2, &[("UDBTL_UDP_MTU", "64")]);
    assert!(stderr.contains("UDBTL_UDP_MTU"), "{stderr}");
    assert!(stderr.contains("outside 312..="), "{stderr}");
    hello_succeeds(2, &[("UDBTL_UDP_MTU", "312")]);
}

/// `UDBTL_RELIABLE=0` gives a working job for messages of one datagram.
#[test]
fn an_unreliable_transport_still_runs_a_job() {
    hello_succeeds(2, &[("UDBTL_RELIABLE", "0")]);
}

/// `UDBTL_DUMP` is a boolean: 0/no/off dump nothing, 1/yes dump, an empty
/// or other value is refused at start naming the variable.
#[test]
fn dump_is_read_as_a_boolean() {
    const DUMPED: &str = "transport state at finalize";
    for off in ["0", "no", "off", "false"] {
        let stderr = hello_succeeds(2, &[("UDBTL_DUMP", off)]);
        assert!(!stderr.contains(DUMPED), "UDBTL_DUMP={off}: {stderr}");
    }
    for on in ["1", "yes"] {
        let stderr = hello_succeeds(2, &[("UDBTL_DUMP", on)]);
        assert_eq!(
            stderr.matches(DUMPED).count(),
            2,
            "UDBTL_DUMP={on}: {stderr}"
        );
    }
    for bad in ["", "maybe"] {
        let stderr = hello_fails(2, &[("UDBTL_DUMP", bad)]);
        assert!(stderr.contains("UDBTL_DUMP="), "{bad:?}: {stderr}");
        assert!(stderr.contains("1/0, true/false"), "{bad:?}: {stderr}");
    }
}

/// A misspelled variable warns once per job with the closest real name;
/// the variables udrun and the tests set do not warn.
#[test]
fn a_misspelled_variable_warns_once_with_the_closest_name() {
    let stderr = hello_succeeds(3, &[("UDBTL_PEER_TIMOUT", "5000")]);
    assert_eq!(
        stderr
            .matches("UDBTL_PEER_TIMOUT is not a udbtl variable")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("did you mean UDBTL_PEER_TIMEOUT?"),
        "{stderr}"
    );

    // udrun sets UDBTL_JOB_KEY; tests pass UDBTL_TEST_*; the fault and
    // modex variables are read by the library.
    let stderr = hello_succeeds(
        2,
        &[
            ("UDBTL_TEST_ANYTHING", "1"),
            ("UDBTL_MODEX", "lazy"),
            ("UDBTL_FAULT_SEED", "1"),
            ("UDBTL_DUMP", "0"),
        ],
    );
    assert!(!stderr.contains("not a udbtl variable"), "{stderr}");
}

// ----- 5. errors name what is wrong ----------------------------------------------

/// An interface that does not exist is named, with the parameter that named
/// it and the interfaces the host has.
#[test]
fn a_missing_interface_is_named_with_those_that_exist() {
    let stderr = hello_fails(2, &[("UDBTL_UDP_IF", "nonexistent")]);
    assert!(stderr.contains("UDBTL_UDP_IF=nonexistent"), "{stderr}");
    assert!(
        stderr.contains("this host does not have: nonexistent"),
        "{stderr}"
    );
    assert!(stderr.contains("lo (127.0.0.1/8"), "{stderr}");
    assert!(!stderr.contains("devices: []"), "{stderr}");

    let stderr = hello_fails(2, &[("UDBTL_IF_INCLUDE", "eth9")]);
    assert!(stderr.contains("UDBTL_IF_INCLUDE=eth9"), "{stderr}");
    assert!(stderr.contains("lo (127.0.0.1/8"), "{stderr}");
}

/// Interfaces that exist but are all filtered out: the error names the
/// filter and the interfaces the host has.
#[test]
fn an_exclusion_of_every_interface_is_named_in_the_error() {
    let stderr = hello_fails(1, &[("UDBTL_IF_EXCLUDE", "lo")]);
    assert!(
        stderr.contains("UDBTL_IF_EXCLUDE=lo left out all of the interfaces"),
        "{stderr}"
    );
    assert!(stderr.contains("lo (127.0.0.1/8"), "{stderr}");
}
