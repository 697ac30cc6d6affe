//! udbtl's warnings reach the user under Open MPI, once per node: a
//! misspelled `UDBTL_*` variable, and, for a user without CAP_NET_ADMIN, a
//! socket buffer the kernel capped below what udbtl asked for (run as
//! `nobody`, so the tests, which run as root, see what users see; ignored,
//! `SKIPPED: ...`, without root or `runuser`).

mod common;

use common::Run;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn a_misspelled_variable_is_named_once_per_node() {
    require_openmpi!();
    let exe = common::program("hello");
    let _turn = common::serial();
    let out = Run::udbtl(3)
        .env("UDBTL_PEER_TIMOUT", "5000")
        .success(&exe, &[]);
    let all = text(&out);
    let warning = "UDBTL_PEER_TIMOUT is not a udbtl variable and is ignored; did you mean \
                   UDBTL_PEER_TIMEOUT?";
    assert_eq!(all.matches(warning).count(), 1, "{all}");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "runuser"
    ),
    ignore = "SKIPPED: needs Open MPI, root and runuser (util-linux)"
)]
fn a_capped_socket_buffer_is_told_to_a_user_without_privileges() {
    require_openmpi!();
    udbtl_prereq::require!(
        udbtl_prereq::Prereq::Root,
        udbtl_prereq::Prereq::Program("runuser")
    );
    let _turn = common::serial();
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(212_992);
    // More than the kernel lets an unprivileged process have (at most the
    // parameter's bound, 1 GiB).
    let asked = (rmem_max * 4).clamp(4 << 20, 1 << 30);
    let run = Run::udbtl(2).mca("btl_udbtl_udp_sockbuf", &asked.to_string());
    let out = match common::nobody::output("hello", &run, &[], 0o755) {
        Ok(out) => out,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    let all = text(&out);
    assert!(out.status.success(), "the job must run as nobody:\n{all}");
    let capped = all.matches("warning: the kernel capped SO_RCVBUF").count();
    assert_eq!(capped, 1, "one warning for the node:\n{all}");
    assert!(
        all.contains(&format!("below the {asked} asked for")),
        "{all}"
    );
}
