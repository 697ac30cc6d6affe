//! Ranks on two stand-in hosts (the network namespaces of
//! `scripts/standin/twohosts`, joined by a veth pair with an MTU of 1500),
//! every peer over udbtl, at Open MPI's defaults and with no interface
//! setting at all (not even for Open MPI's own out-of-band channel): the
//! component must find the network by itself, and first contact must work
//! in every direction (Open MPI adds remote processes lazily, so a receiver
//! has not added its sender when the first datagram comes).
//!
//! 2, 3 and 4 ranks (`localhost,udB`, `localhost:2,udB:1`,
//! `localhost:2,udB:2`): first contact from higher ranks to lower ones and
//! the reverse, point-to-point around the protocol thresholds, collectives
//! and a ring checked byte by byte, and point-to-point encrypted. The
//! counters show the traffic crossed the veth.
//!
//! Needs root and the stand-in host tools: ignored otherwise (`SKIPPED: ...`).
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../../tests/support/stand_in_hosts.rs"]
mod stand_in_hosts;

use std::process::Output;

use common::Run;
use stand_in_hosts::StandInHosts;

/// `--host` for `np` ranks, the first half (rounded up) in udA.
fn host_list(np: u32) -> String {
    let here = np.div_ceil(2);
    let there = np - here;
    if here == 1 && there == 1 {
        "localhost,udB".into()
    } else {
        format!("localhost:{here},udB:{there}")
    }
}

/// `np` ranks across the two hosts, every peer over udbtl, Open MPI's
/// defaults otherwise.
fn across(hosts: &StandInHosts, np: u32) -> Run {
    let mut run = Run::udbtl(np).mca("plm_rsh_agent", &hosts.nsssh().display().to_string());
    run.mpirun_args.extend(["--host".into(), host_list(np)]);
    run.oob_if = None;
    run
}

/// Runs `name args` with `run` inside udA, one launch at a time.
fn run_in_a(hosts: &StandInHosts, run: &Run, name: &str, args: &[&str]) -> Output {
    let exe = common::program(name);
    let _turn = common::serial();
    let out = hosts
        .in_a(&run.command(&exe, args))
        .output()
        .expect("run mpirun in udA");
    assert!(
        out.status.success(),
        "{name} {args:?} with {run:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Asserts that every rank moved traffic over udbtl and that the ranks on
/// each host sent some of it over the veth (vA in udA, vB in udB).
fn assert_crossed(out: &Output, np: u32) {
    common::assert_carried(out, np);
    for device in ["vA", "vB"] {
        let sent: u64 = common::stats_fields(&out.stderr)
            .iter()
            .filter(|line| line.iter().any(|(k, v)| k == "device" && v == device))
            .filter_map(|line| line.iter().find(|(k, _)| k == "sent"))
            .filter_map(|(_, v)| v.parse::<u64>().ok())
            .sum();
        assert!(
            sent > 0,
            "nothing went over {device}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn first_contact(np: u32, direction: &str) {
    require_openmpi!();
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let out = run_in_a(&hosts, &across(&hosts, np), "first_contact", &[direction]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for rank in 0..np {
        assert!(
            stdout.contains(&format!("OK first_contact rank {rank} of {np} ")),
            "rank {rank} did not finish:\n{stdout}"
        );
    }
    let namespaces: std::collections::BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.split(" in ").nth(1))
        .collect();
    assert_eq!(namespaces.len(), 2, "ranks in both namespaces:\n{stdout}");
    assert_crossed(&out, np);
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn first_contact_downward_2_ranks() {
    first_contact(2, "down");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn first_contact_upward_2_ranks() {
    first_contact(2, "up");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn first_contact_downward_3_ranks() {
    first_contact(3, "down");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn first_contact_upward_3_ranks() {
    first_contact(3, "up");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn first_contact_downward_4_ranks() {
    first_contact(4, "down");
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn first_contact_upward_4_ranks() {
    first_contact(4, "up");
}

fn programs(np: u32) {
    require_openmpi!();
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let run = across(&hosts, np);
    let mut args = vec!["--max", "1048576"];
    args.extend(common::threshold_args().iter().map(String::as_str));
    let out = run_in_a(&hosts, &run, "p2p", &args);
    common::assert_said_ok("p2p", &out, &format!("{np} ranks across hosts"));
    assert_crossed(&out, np);
    if np == 2 {
        // One rank on each host: the hosts share a kernel and PID namespace
        // but not a network namespace, so every get goes over the network.
        assert_eq!(common::total(&out, "gets_local"), 0);
        assert!(common::total(&out, "gets") > 0);
    }
    let out = run_in_a(&hosts, &run, "collectives", &[]);
    common::assert_said_ok("collectives", &out, &format!("{np} ranks across hosts"));
    assert_crossed(&out, np);
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn p2p_and_collectives_2_ranks() {
    programs(2);
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn p2p_and_collectives_3_ranks() {
    programs(3);
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn p2p_and_collectives_4_ranks() {
    programs(4);
}

/// `p2p` with `--mca btl_udbtl_auth encrypt` on 3 ranks across the hosts,
/// as a user turns encryption on: the parameter reaches the remote rank,
/// every rank seals (`integrity=encrypted`), and nothing is refused.
#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn p2p_encrypted_3_ranks() {
    require_openmpi!();
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let run = across(&hosts, 3).mca("btl_udbtl_auth", "encrypt");
    let mut args = vec!["--max", "1048576"];
    args.extend(common::threshold_args().iter().map(String::as_str));
    let out = run_in_a(&hosts, &run, "p2p", &args);
    common::assert_said_ok("p2p", &out, "3 ranks across hosts, encrypted");
    assert_crossed(&out, 3);
    let ranks = common::stats_fields(&out.stderr);
    assert!(
        ranks.iter().all(|fields| fields
            .iter()
            .any(|(k, v)| k == "integrity" && v == "encrypted")),
        "every rank encrypts: {ranks:?}"
    );
    for refused in ["unauthenticated", "replayed"] {
        assert_eq!(common::total(&out, refused), 0, "{refused}");
    }
}

#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn ring_and_collectives_checked_byte_by_byte() {
    require_openmpi!();
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let exe = common::program("failure_xhost");
    let out = {
        let _turn = common::serial();
        hosts
            .in_a(&across(&hosts, 2).command(&exe, &["3"]))
            .output()
            .expect("run mpirun in udA")
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mpirun failed ({}):\n{stderr}",
        out.status
    );
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("XHOST OK rank {rank} of 2")),
            "rank {rank} did not finish its checks:\n{stdout}"
        );
    }
    common::assert_carried(&out, 2);
}

/// Processes told to use loopback across hosts cannot reach each other:
/// the job stops at start-up instead of timing out, and udbtl names the
/// peer's address, its own interface and the setting to change.
#[test]
#[cfg_attr(
    any(
        udbtl_missing = "openmpi",
        udbtl_missing = "root",
        udbtl_missing = "shared_tools"
    ),
    ignore = "SKIPPED: needs Open MPI, root and the stand-in host tools (twohosts, nsssh)"
)]
fn unreachable_peers_are_named_with_both_addresses() {
    require_openmpi!();
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let run = across(&hosts, 2).mca("btl_udbtl_if_include", "lo");
    let exe = common::program("p2p");
    let out = {
        let _turn = common::serial();
        hosts
            .in_a(&run.command(&exe, &[]))
            .output()
            .expect("run mpirun in udA")
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("is unreachable over udbtl"), "{stderr}");
    assert!(
        stderr.contains("this process uses lo 127.0.0.1"),
        "{stderr}"
    );
    assert!(stderr.contains("btl_udbtl_if_include"), "{stderr}");
}
