//! How the tests that change the host's network (in a namespace they
//! create) run its commands. Whether the machine lets them (root,
//! `unshare`, `nft`, `tc`) is udbtl-prereq's to say.

use std::process::Command;

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
/// panics if it fails. The caller checked for root and `unshare`.
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
