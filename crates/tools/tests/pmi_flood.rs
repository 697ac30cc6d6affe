//! A host floods udrun's PMI port with idle connections while a remote
//! rank joins: udrun runs in udA (`scripts/standin/twohosts`), one rank on
//! udB. Before udB's rank is launched (the launcher waits for the test),
//! a flooder in udA holds 128 idle connections to udrun's port, opening a
//! new one as each closes. The remote rank, from another address, must
//! still join, and the job succeed. (Before, udrun closed every
//! connection beyond its 64 handshake slots, the flood took each freed
//! slot first, and the remote rank gave up after 30 s.)
//!
//! The flooder is this test binary again, run in udA: the test
//! `flooder`, ignored otherwise.
//! Needs root and the stand-in host tools: ignored otherwise (`SKIPPED: ...`).
#![allow(clippy::unwrap_used)]

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;
#[path = "../../../tests/support/idle_flood.rs"]
mod idle_flood;
#[path = "../../../tests/support/proc_net.rs"]
mod proc_net;
#[path = "../../../tests/support/stand_in_hosts.rs"]
mod stand_in_hosts;

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stand_in_hosts::StandInHosts;

const HOLDERS: usize = 128;

/// The flooder, when run by [`a_remote_rank_joins_through_a_flood_of_idle_connections`]:
/// holds `HOLDERS` idle connections to `UDBTL_TEST_FLOOD` (`ip:port`),
/// reopening each as it closes, says `holding` on stdout once every one
/// connected, and stops when the file `UDBTL_TEST_FLOOD_STOP` exists.
#[test]
#[ignore = "child process of a_remote_rank_joins_through_a_flood_of_idle_connections"]
fn flooder() {
    let (Ok(target), Ok(stop)) = (
        std::env::var("UDBTL_TEST_FLOOD"),
        std::env::var("UDBTL_TEST_FLOOD_STOP"),
    ) else {
        return;
    };
    let target: SocketAddrV4 = target.parse().unwrap();
    let stop = PathBuf::from(stop);
    let connected = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let holders: Vec<_> = (0..HOLDERS)
        .map(|_| {
            let (stop, connected) = (stop.clone(), connected.clone());
            std::thread::spawn(move || {
                idle_flood::hold(
                    || TcpStream::connect(target),
                    || stop.exists(),
                    |first| {
                        if first {
                            connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    },
                );
            })
        })
        .collect();
    while connected.load(std::sync::atomic::Ordering::Relaxed) < HOLDERS && !stop.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("holding");
    for holder in holders {
        holder.join().unwrap();
    }
}

fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "root", udbtl_missing = "shared_tools"),
    ignore = "SKIPPED: needs root and the stand-in host tools (twohosts, nsssh)"
)]
fn a_remote_rank_joins_through_a_flood_of_idle_connections() {
    let Some(hosts) = StandInHosts::up() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("udbtl-pmi-flood-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (go, stop) = (dir.join("go"), dir.join("stop"));
    // The launcher of udB's rank waits for the flood (its check that udB
    // answers does not).
    let launcher = dir.join("launcher");
    std::fs::write(
        &launcher,
        format!(
            "#!/bin/sh\n\
             # udrun's reachability check (HOST true) goes at once.\n\
             for last; do :; done\n\
             if [ \"$last\" != true ]; then\n\
             while [ ! -e '{}' ]; do sleep 0.02; done\n\
             fi\n\
             exec '{}' \"$@\"\n",
            go.display(),
            hosts.nsssh().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &launcher,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let launcher = launcher.display().to_string();
    let udrun = common::clean_command(
        env!("CARGO_BIN_EXE_udrun"),
        &[
            "-n",
            "2",
            "--host",
            "localhost:1,udB:1",
            "--launcher-exec",
            &launcher,
            env!("CARGO_BIN_EXE_udstress"),
            "alltoall",
            "--messages",
            "100",
        ],
        &[],
    );
    // `ip netns exec` runs udrun in its own process: the child is udrun.
    let child = hosts
        .in_a(&udrun)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("udrun starts in udA");
    let udrun_pid = child.id();
    let mut port = None;
    wait_for("udrun listening", Duration::from_secs(60), || {
        port = proc_net::sockets(udrun_pid, "tcp", Some(proc_net::TCP_LISTEN))
            .first()
            .map(|a| {
                // A listener on every address is reached on loopback.
                if a.ip().is_unspecified() {
                    SocketAddrV4::new(Ipv4Addr::LOCALHOST, a.port())
                } else {
                    *a
                }
            });
        port.is_some()
    });
    let port = port.unwrap();
    let mut flood = Command::new(std::env::current_exe().unwrap());
    flood
        .args([
            "--exact",
            "flooder",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("UDBTL_TEST_FLOOD", port.to_string())
        .env("UDBTL_TEST_FLOOD_STOP", &stop);
    let mut flooder = hosts
        .in_a(&flood)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the flooder starts in udA");
    let mut said = String::new();
    let mut out = flooder.stdout.take().unwrap();
    wait_for("the flood in place", Duration::from_secs(60), || {
        let mut byte = [0u8; 1];
        if out.read(&mut byte).unwrap_or(0) == 1 {
            said.push(char::from(byte[0]));
        }
        said.contains("holding")
    });
    std::fs::write(&go, b"").unwrap();
    let finished = common::finish(child, Duration::from_secs(180));
    std::fs::write(&stop, b"").unwrap();
    let _ = flooder.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = common::text(&finished.output);
    println!("{stdout}\n{stderr}");
    assert!(!finished.timed_out, "the job hung:\n{stdout}\n{stderr}");
    assert!(
        finished.output.status.success(),
        "the job failed ({}):\n{stdout}\n{stderr}",
        finished.output.status
    );
    assert_eq!(stdout.matches("in order and intact").count(), 2, "{stdout}");
}
