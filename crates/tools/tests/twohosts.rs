//! udrun jobs across the two stand-in hosts (`scripts/standin/twohosts`: network
//! namespaces udA and udB joined by a veth pair, MTU 1500), launched from udA
//! with `nsssh` standing in for ssh, and with no interface setting at all:
//! the ranks learn from PMI_process_mapping that the job spans hosts and
//! open every interface but loopback, as a user expects. 2, 3 and 4 ranks,
//! addresses exchanged in bulk and lazily; each rank's transport state
//! shows its traffic went over the veth (vA in udA, vB in udB).
//!
//! Needs root and the stand-in host tools: ignored otherwise (`SKIPPED: ...`).
#![allow(clippy::unwrap_used)]

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;
#[path = "../../../tests/support/stand_in_hosts.rs"]
mod stand_in_hosts;

use std::process::Output;
use std::time::Duration;

use stand_in_hosts::StandInHosts;

/// A generous limit for a job that takes a second: the watchdog only keeps
/// a hung job from hanging the suite.
const LIMIT: Duration = Duration::from_secs(300);

/// `udrun -n np --host H` of `program args` from udA, with `env` and the
/// transport's state dumped at finalize.
fn across(hosts: &StandInHosts, np: u32, env: &[(&str, &str)], program: &[&str]) -> Output {
    let here = np.div_ceil(2);
    let host_list = format!("localhost:{here},udB:{}", np - here);
    let nsssh = hosts.nsssh().display().to_string();
    let np = np.to_string();
    let mut args = vec![
        "-n",
        &np,
        "--host",
        &host_list,
        "--launcher-exec",
        &nsssh,
        "-x",
        "UDBTL_DUMP=1",
    ];
    for (name, _) in env {
        args.extend(["-x", name]);
    }
    let udrun = common::clean_command(env!("CARGO_BIN_EXE_udrun"), &args, env);
    let mut command = hosts.in_a(&udrun);
    command.args(program);
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("udrun starts in udA");
    let finished = common::finish(child, LIMIT);
    let (stdout, stderr) = common::text(&finished.output);
    assert!(
        finished.output.status.success() && !finished.timed_out,
        "udrun {args:?} {program:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        finished.output.status
    );
    finished.output
}

/// How many ranks a udrun rank list names (`0-3,5,7-8` is 7).
fn ranks_in(list: &str) -> usize {
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.parse::<usize>(), b.parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum()
}

/// Every rank's module was on the veth: none on loopback.
fn assert_on_the_veth(out: &Output, np: u32) {
    let (_, stderr) = common::text(out);
    // udrun writes a line that several ranks wrote within its window once,
    // as `[ranks 2-3] LINE`: such a line stands for each of those ranks.
    let modules: Vec<&str> = stderr
        .lines()
        .flat_map(|line| {
            let (ranks, line) = match line
                .strip_prefix("[ranks ")
                .and_then(|rest| rest.split_once("] "))
            {
                Some((list, rest)) => (ranks_in(list), rest),
                None => (1, line),
            };
            std::iter::repeat_n(line.strip_prefix("module "), ranks).flatten()
        })
        .collect();
    assert_eq!(modules.len(), np as usize, "one module per rank:\n{stderr}");
    for device in ["vA:1", "vB:1"] {
        assert!(
            modules.iter().any(|m| m.starts_with(device)),
            "no rank used {device}:\n{stderr}"
        );
    }
    assert!(
        modules
            .iter()
            .all(|m| m.starts_with("vA:1") || m.starts_with("vB:1")),
        "a rank opened another interface:\n{stderr}"
    );
}

fn alltoall(np: u32, modex: &str) {
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let out = across(
        &hosts,
        np,
        &[("UDBTL_MODEX", modex)],
        &[
            env!("CARGO_BIN_EXE_udstress"),
            "alltoall",
            "--messages",
            "300",
        ],
    );
    let (stdout, _) = common::text(&out);
    for rank in 0..np {
        let line = format!(
            "rank {rank} received {} messages from {} ranks",
            300 * (np - 1),
            np - 1
        );
        assert!(stdout.contains(&line), "rank {rank}:\n{stdout}");
    }
    assert_eq!(stdout.matches("in order and intact").count(), np as usize);
    assert_on_the_veth(&out, np);
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn alltoall_2_ranks_bulk() {
    alltoall(2, "bulk");
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn alltoall_3_ranks_bulk() {
    alltoall(3, "bulk");
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn alltoall_3_ranks_lazy() {
    alltoall(3, "lazy");
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn alltoall_4_ranks_lazy() {
    alltoall(4, "lazy");
}

/// The README's main job, across hosts: latency and bandwidth up to 64 KiB.
#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn udbench_between_hosts() {
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let out = across(
        &hosts,
        2,
        &[],
        &[
            env!("CARGO_BIN_EXE_udbench"),
            "--max-size",
            "64k",
            "--iterations",
            "50",
        ],
    );
    let (stdout, _) = common::text(&out);
    for header in ["# udbench latency", "# udbench bw"] {
        assert!(stdout.contains(header), "no {header:?}:\n{stdout}");
    }
    assert!(
        stdout.lines().any(|l| l.starts_with("65536 ")),
        "no 64 KiB row:\n{stdout}"
    );
    assert_on_the_veth(&out, 2);
}

/// Ranks told to use loopback across hosts cannot reach each other: the
/// job fails at once, each rank naming the peer's address and its own
/// interface, and the setting to change (no wait for a timeout).
#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn unreachable_peers_are_named_with_both_addresses() {
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let nsssh = hosts.nsssh().display().to_string();
    let args = [
        "-n",
        "2",
        "--host",
        "localhost,udB",
        "--launcher-exec",
        &nsssh,
        "-x",
        "UDBTL_IF_INCLUDE",
    ];
    let udrun = common::clean_command(
        env!("CARGO_BIN_EXE_udrun"),
        &args,
        &[("UDBTL_IF_INCLUDE", "lo")],
    );
    let mut command = hosts.in_a(&udrun);
    command.arg(env!("CARGO_BIN_EXE_udhello"));
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("udrun starts in udA");
    let finished = common::finish(child, LIMIT);
    let (_, stderr) = common::text(&finished.output);
    assert!(!finished.output.status.success(), "{stderr}");
    assert!(stderr.contains("is unreachable"), "{stderr}");
    assert!(stderr.contains("no network in common"), "{stderr}");
    assert!(
        stderr.contains("this process uses lo 127.0.0.1"),
        "{stderr}"
    );
    assert!(stderr.contains("UDBTL_IF_INCLUDE"), "{stderr}");
}
