//! What the multi-process tests share: starting a job under `udrun` with a
//! clean `UDBTL_*` environment and a watchdog.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `udrun args…` with only the `UDBTL_*` variables of `env` (none
/// inherited from the test's environment), and interrupts the whole job if
/// it runs longer than `limit`.
pub(crate) fn udrun(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    finish(start(args, env), limit).output
}

/// A command whose `UDBTL_*` environment is exactly `env`, its output
/// captured, and `UDRUN_OVERSUBSCRIBE=1` (for a udrun it runs).
pub(crate) fn clean_command(program: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (var, _) in std::env::vars() {
        if var.starts_with("UDBTL_") {
            command.env_remove(var);
        }
    }
    // These tests run more ranks than this machine may have CPUs (udrun's
    // own tests check the refusal).
    command.env("UDRUN_OVERSUBSCRIBE", "1");
    command.envs(env.iter().copied());
    command
}

/// Starts `udrun args…` as [`udrun`] does, without waiting for it.
pub(crate) fn start(args: &[&str], env: &[(&str, &str)]) -> Child {
    clean_command(env!("CARGO_BIN_EXE_udrun"), args, env)
        .spawn()
        .expect("udrun starts")
}

/// How a job ended.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) output: Output,
    /// The watchdog had to interrupt it.
    pub(crate) timed_out: bool,
    /// From [`finish`] to the job's end.
    pub(crate) elapsed: Duration,
}

/// Waits for `child` (udrun, or a shell that runs it) and collects its
/// output. If it runs longer than `limit`, the watchdog continues and
/// interrupts it and its children (SIGCONT, then SIGINT, which udrun turns
/// into the end of the job), and kills them 10 s later.
pub(crate) fn finish(child: Child, limit: Duration) -> Finished {
    let started = Instant::now();
    let pid = child.id();
    let (done, cancelled) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if cancelled.recv_timeout(limit) != Err(mpsc::RecvTimeoutError::Timeout) {
            return false;
        }
        eprintln!("watchdog: the job ran longer than {limit:?}; interrupting it");
        let mut targets = vec![pid];
        targets.extend(children(pid));
        for target in &targets {
            signal(*target, "CONT");
            signal(*target, "INT");
        }
        if cancelled.recv_timeout(Duration::from_secs(10)) == Err(mpsc::RecvTimeoutError::Timeout) {
            for target in &targets {
                signal(*target, "KILL");
            }
        }
        true
    });
    let output = child.wait_with_output().expect("the job ends");
    let elapsed = started.elapsed();
    drop(done);
    let timed_out = watchdog.join().expect("the watchdog ends");
    Finished {
        output,
        timed_out,
        elapsed,
    }
}

/// Sends SIG`name` to process `pid` (or, negative, to a process group).
pub(crate) fn signal(pid: impl std::fmt::Display, name: &str) {
    let _ = Command::new("kill")
        .args([format!("-{name}"), "--".into(), pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The processes whose parent is `pid` (from `/proc`).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let child: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // The command name, in parentheses, may hold spaces: the fields
            // after its closing parenthesis are state and parent.
            let after = &stat[stat.rfind(')')? + 1..];
            let parent: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (parent == pid).then_some(child)
        })
        .collect()
}

/// A job's standard output and standard error.
pub(crate) fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
