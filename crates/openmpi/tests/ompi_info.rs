//! `ompi_info` finds the component and lists its parameters, the seed's
//! names and defaults among them.

mod common;

use std::process::Command;

fn ompi_info(args: &[&str]) -> String {
    let out = Command::new("ompi_info")
        .args(args)
        .env("OMPI_MCA_mca_base_component_path", common::component_path())
        .output()
        .expect("run ompi_info");
    assert!(out.status.success(), "ompi_info {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn ompi_info_lists_the_component_and_its_parameters() {
    require_openmpi!();
    let components = ompi_info(&[]);
    assert!(
        components
            .lines()
            .any(|l| l.trim().starts_with("MCA btl: udbtl")),
        "{components}"
    );
    let params = ompi_info(&["--param", "btl", "udbtl", "--level", "9", "--parsable"]);
    let value = |name: &str| {
        let key = format!("mca:btl:udbtl:param:btl_udbtl_{name}:value:");
        params
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .map(str::to_owned)
    };
    let field = |name: &str, what: &str| {
        let key = format!("mca:btl:udbtl:param:btl_udbtl_{name}:{what}:");
        params
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .map(str::to_owned)
    };
    // The seed's names and defaults, typed as Open MPI types its own.
    assert_eq!(value("sd_num").as_deref(), Some("128"), "{params}");
    assert_eq!(field("sd_num", "type").as_deref(), Some("unsigned_int"));
    assert_eq!(value("rd_num").as_deref(), Some("6000"));
    // 0: each module draws its own Q_Key (the seed's was fixed, 0x01330133).
    assert_eq!(value("ib_qkey").as_deref(), Some("0"));
    assert_eq!(field("max_send_size", "type").as_deref(), Some("size_t"));
    assert_eq!(field("reliable", "type").as_deref(), Some("bool"));
    assert_eq!(
        field("checksum", "type").as_deref(),
        Some("int"),
        "an enumerator"
    );
    assert!(params.contains("mca:btl:udbtl:param:btl_udbtl_checksum:enumerator:value:1:on"));
    // What a cluster user must set is where tcp has it: level 1.
    for name in ["if_include", "if_exclude"] {
        assert_eq!(field(name, "level").as_deref(), Some("1"), "{name}");
    }
    // Open MPI's standard BTL names.
    for name in [
        "eager_limit",
        "rndv_eager_limit",
        "max_send_size",
        "flags",
        "exclusivity",
    ] {
        assert!(value(name).is_some(), "btl_udbtl_{name} missing:\n{params}");
    }
    // udbtl's own, and the component's.
    for name in [
        "peer_timeout",
        "keepalive",
        "checksum",
        "print_stats",
        "latency",
    ] {
        assert!(value(name).is_some(), "btl_udbtl_{name} missing:\n{params}");
    }
}

/// `eval "$(scripts/ompi-component)"` is what the README tells users to run:
/// it must work every time (a `grep -q` under `pipefail` once made it fail
/// at random), and then Open MPI must find the component through what it
/// printed.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn the_component_script_succeeds_fifty_times_in_a_row() {
    require_openmpi!();
    // The first run builds (or finds the build fresh); every run checks the
    // library, installs it and prints the path.
    let mut printed = Vec::new();
    for run in 1..=50 {
        let out = common::ompi_component_script()
            .output()
            .expect("run scripts/ompi-component");
        assert!(
            out.status.success(),
            "run {run} of scripts/ompi-component failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let path = common::component_path_from(&stdout)
            .unwrap_or_else(|| panic!("run {run} printed no component path:\n{stdout}"))
            .to_owned();
        printed.push(path);
    }
    printed.dedup();
    assert_eq!(
        printed.len(),
        1,
        "the runs printed different paths: {printed:?}"
    );
    let out = Command::new("ompi_info")
        .env("OMPI_MCA_mca_base_component_path", &printed[0])
        .output()
        .expect("run ompi_info");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.trim().starts_with("MCA btl: udbtl")),
        "ompi_info does not list the component with the printed path:\n{listed}"
    );
}

/// A failure prints nothing to eval and exits non-zero, saying why.
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn the_component_script_fails_loudly_with_nothing_to_eval() {
    require_openmpi!();
    let out = common::ompi_component_script()
        .arg("--no-such-option")
        .output()
        .expect("run scripts/ompi-component");
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ompi-component: unknown argument"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
