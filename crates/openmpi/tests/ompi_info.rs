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
    // The seed's names and defaults.
    assert_eq!(value("sd_num").as_deref(), Some("128"), "{params}");
    assert_eq!(value("rd_num").as_deref(), Some("6000"));
    assert_eq!(value("ib_qkey").as_deref(), Some("0x01330133"));
    assert!(value("max_send_size").is_some());
    // udbtl's own, and the component's.
    for name in [
        "peer_timeout",
        "keepalive",
        "checksum",
        "udp_if",
        "print_stats",
        "latency",
    ] {
        assert!(value(name).is_some(), "btl_udbtl_{name} missing:\n{params}");
    }
}
