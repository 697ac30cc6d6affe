//! One rank on each of two stand-in hosts (the network namespaces of
//! `shared/tools/twohosts`, joined by a veth pair), every peer over udbtl:
//! point-to-point and collectives across a real interface with an MTU of
//! 1500, where loopback would hide datagram sizing and interface selection.
//!
//! Needs root and the shared tools; prints `SKIPPED: <reason>` otherwise.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::Run;

/// The subnet `twohosts` puts both namespaces on.
const SUBNET: &str = "10.77.0.0/24";

#[test]
fn p2p_and_collectives_across_two_hosts() {
    require_openmpi!();
    let tools = match shared_tools() {
        Ok(tools) => tools,
        Err(reason) => {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
    let _hosts = Hosts::up(&tools);
    let exe = common::program("failure_xhost");
    let mut run = Run::udbtl(2)
        .mca("plm_rsh_agent", &tools.join("nsssh").display().to_string())
        // The veth is vA in one namespace and vB in the other; the subnet
        // selects it in both.
        .mca("btl_udbtl_udp_if", SUBNET);
    run.mpirun_args
        .extend(["--host".into(), "localhost,udB".into()]);
    // The out-of-band channel and the tcp BTL on the veth subnet too.
    run.oob_if = SUBNET.into();

    let started = Instant::now();
    let out = in_host_a(&run.command(&exe, &["3"]))
        .output()
        .expect("run mpirun in udA");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- stdout\n{stdout}--- stderr\n{stderr}---\ntook {took:?}");
    assert!(
        out.status.success(),
        "mpirun failed ({}):\n{stderr}",
        out.status
    );
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("XHOST OK rank {rank} of 2")),
            "rank {rank} did not finish its checks"
        );
    }
    // The program prints each rank's network namespace: two different ones
    // prove that the traffic crossed the veth.
    let namespaces: Vec<&str> = (0..2)
        .map(|rank| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("rank {rank}: ")))
                .expect("each rank's namespace")
        })
        .collect();
    assert_ne!(
        namespaces[0], namespaces[1],
        "both ranks ran in one namespace"
    );
    common::assert_carried(&out, 2);
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
