//! What the tests that change the host's network (in a namespace they
//! create) need to know about it, and how they run its commands.

use std::process::Command;

/// Whether `tool arg` runs and succeeds here.
pub(crate) fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Runs the shell command `cmd`; panics, naming it, if it fails.
pub(crate) fn run(cmd: &str) {
    let ok = Command::new("sh")
        .args(["-c", cmd])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{cmd}");
}

/// Runs this test binary's ignored test `test` again inside a new network
/// namespace (`unshare -n`), where it may change the network freely;
/// panics if it fails. The caller checked [`is_root`] and `unshare`.
pub(crate) fn run_in_new_netns(test: &str) {
    let status = Command::new("unshare")
        .arg("-n")
        .arg(std::env::current_exe().expect("the test binary's path"))
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .status()
        .expect("unshare runs");
    assert!(status.success(), "{test} failed in its namespace");
}
