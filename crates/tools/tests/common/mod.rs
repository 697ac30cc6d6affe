//! What the multi-process tests share: starting a job under `udrun` with a
//! clean `UDBTL_*` environment and a watchdog.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `udrun args…` with only the `UDBTL_*` variables of `env` (none
/// inherited from the test's environment), and interrupts the whole job if
/// it runs longer than `limit`.
pub(crate) fn udrun(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_udrun"));
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (var, _) in std::env::vars() {
        if var.starts_with("UDBTL_") {
            command.env_remove(var);
        }
    }
    command.envs(env.iter().copied());
    let child = command.spawn().expect("udrun starts");
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
    });
    let output = child.wait_with_output().expect("udrun ends");
    drop(watchdog);
    output
}

/// A job's standard output and standard error.
pub(crate) fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
