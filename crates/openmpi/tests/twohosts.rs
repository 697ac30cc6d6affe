//! Ranks on two stand-in hosts (the network namespaces of
//! `shared/tools/twohosts`, joined by a veth pair with an MTU of 1500),
//! every peer over udbtl, at Open MPI's defaults and with no interface
//! setting at all (not even for Open MPI's own out-of-band channel): the
//! component must find the network by itself, and first contact must work
//! in every direction (Open MPI adds remote processes lazily, so a receiver
//! has not added its sender when the first datagram comes).
//!
//! 2, 3 and 4 ranks (`localhost,udB`, `localhost:2,udB:1`,
//! `localhost:2,udB:2`): first contact from higher ranks to lower ones and
//! the reverse, point-to-point around the protocol thresholds, collectives
//! and a ring checked byte by byte. The counters show the traffic crossed
//! the veth.
//!
//! Needs root and the shared tools; prints `SKIPPED: <reason>` otherwise.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::Run;

/// `--host` for `np` ranks, the first half (rounded up) in udA.
fn hosts(np: u32) -> String {
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
fn across(tools: &Path, np: u32) -> Run {
    let mut run = Run::udbtl(np).mca("plm_rsh_agent", &tools.join("nsssh").display().to_string());
    run.mpirun_args.extend(["--host".into(), hosts(np)]);
    run.oob_if = None;
    run
}

/// Runs `name args` with `run` inside udA, one launch at a time.
fn run_in_a(run: &Run, name: &str, args: &[&str]) -> Output {
    let exe = common::program(name);
    let _turn = common::serial();
    let out = in_host_a(&run.command(&exe, args))
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
    let Some(tools) = tools() else { return };
    let _hosts = Hosts::up(&tools);
    let out = run_in_a(&across(&tools, np), "first_contact", &[direction]);
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
fn first_contact_downward_2_ranks() {
    first_contact(2, "down");
}

#[test]
fn first_contact_upward_2_ranks() {
    first_contact(2, "up");
}

#[test]
fn first_contact_downward_3_ranks() {
    first_contact(3, "down");
}

#[test]
fn first_contact_upward_3_ranks() {
    first_contact(3, "up");
}

#[test]
fn first_contact_downward_4_ranks() {
    first_contact(4, "down");
}

#[test]
fn first_contact_upward_4_ranks() {
    first_contact(4, "up");
}

fn programs(np: u32) {
    require_openmpi!();
    let Some(tools) = tools() else { return };
    let _hosts = Hosts::up(&tools);
    let run = across(&tools, np);
    let mut args = vec!["--max", "1048576"];
    args.extend(common::threshold_args().iter().map(String::as_str));
    let out = run_in_a(&run, "p2p", &args);
    common::assert_said_ok("p2p", &out, &format!("{np} ranks across hosts"));
    assert_crossed(&out, np);
    let out = run_in_a(&run, "collectives", &[]);
    common::assert_said_ok("collectives", &out, &format!("{np} ranks across hosts"));
    assert_crossed(&out, np);
}

#[test]
fn p2p_and_collectives_2_ranks() {
    programs(2);
}

#[test]
fn p2p_and_collectives_3_ranks() {
    programs(3);
}

#[test]
fn p2p_and_collectives_4_ranks() {
    programs(4);
}

#[test]
fn ring_and_collectives_checked_byte_by_byte() {
    require_openmpi!();
    let Some(tools) = tools() else { return };
    let _hosts = Hosts::up(&tools);
    let exe = common::program("failure_xhost");
    let out = {
        let _turn = common::serial();
        in_host_a(&across(&tools, 2).command(&exe, &["3"]))
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

/// The shared tools, or `None` after saying why the test is skipped.
fn tools() -> Option<PathBuf> {
    match shared_tools() {
        Ok(tools) => Some(tools),
        Err(reason) => {
            eprintln!("SKIPPED: {reason}");
            None
        }
    }
}

/// The folder of `twohosts` and `nsssh`, or why the test cannot run.
fn shared_tools() -> Result<PathBuf, String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("id -u: {e}"))?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("twohosts needs root (network namespaces)".into());
    }
    let tools = std::env::var_os("UDBTL_SHARED_TOOLS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools"),
        PathBuf::from,
    );
    for tool in ["twohosts", "nsssh"] {
        if !tools.join(tool).is_file() {
            return Err(format!(
                "{} not found (set UDBTL_SHARED_TOOLS to the folder holding twohosts and nsssh)",
                tools.join(tool).display()
            ));
        }
    }
    Ok(tools)
}

/// The two namespaces, brought up if they were not, and taken down again
/// only then: another user may be running in namespaces it brought up.
struct Hosts {
    tools: PathBuf,
    brought_up: bool,
}

impl Hosts {
    fn up(tools: &Path) -> Self {
        let list = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        let list = String::from_utf8_lossy(&list.stdout);
        let present = |name: &str| {
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(name))
        };
        let brought_up = !(present("udA") && present("udB"));
        if brought_up {
            let status = Command::new(tools.join("twohosts"))
                .arg("up")
                .status()
                .expect("run twohosts up");
            assert!(status.success(), "twohosts up failed: {status}");
        }
        Self {
            tools: tools.to_owned(),
            brought_up,
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if self.brought_up {
            let _ = Command::new(self.tools.join("twohosts"))
                .arg("down")
                .status();
        }
    }
}

/// `cmd` (the harness's `timeout … mpirun …`) run inside udA.
fn in_host_a(cmd: &Command) -> Command {
    let mut wrapped = Command::new("ip");
    wrapped
        .args(["netns", "exec", "udA"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    wrapped
}
