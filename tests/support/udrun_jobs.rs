//! What the multi-process tests share: starting a job under `udrun` with a
//! clean `UDBTL_*` environment and a watchdog. For the tests of the tools
//! crate and of the test drivers (udbtl-testbins): included with `#[path]`,
//! since tests of different crates share no module otherwise.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
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
    clean_command(udrun_exe(), args, env)
        .spawn()
        .expect("udrun starts")
}

/// The `udrun` binary. The tools crate's tests have cargo's own build of
/// it; another crate's tests (the test drivers') have it built, once per
/// test binary, by the cargo that runs them, with the same profile and into
/// the same target folder, so never a stale one. That build is udrun as
/// `cargo build -p udbtl-tools` makes it: the first time, it may compile
/// some of udrun's dependencies again (features resolved for the tools
/// crate alone differ from those of a workspace test build); after that it
/// is a no-op.
pub(crate) fn udrun_exe() -> &'static str {
    static EXE: OnceLock<String> = OnceLock::new();
    EXE.get_or_init(|| match option_env!("CARGO_BIN_EXE_udrun") {
        Some(exe) => exe.to_owned(),
        None => build("udbtl-tools", "--bin", "udrun"),
    })
}

/// The example program `name` of the `udbtl` crate (`crates/udbtl/examples`),
/// built as [`udrun_exe`] builds udrun for other crates' tests: cargo builds
/// examples for `cargo test`, but tells no test where.
pub(crate) fn example_exe(name: &str) -> String {
    build("udbtl", "--example", name)
}

/// `cargo build --package PACKAGE KIND NAME` (`--bin` or `--example`),
/// offline (tests fetch nothing), with the profile of this test binary,
/// into its target folder; returns the executable cargo reports.
fn build(package: &str, kind: &str, name: &str) -> String {
    // target/<profile folder>/deps/<test binary>
    let test_exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test_exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(name) => name,
    };
    let target_dir: PathBuf = profile_dir.parent().expect("target folder").into();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let out = Command::new(cargo)
        .args(["build", "--offline", "--package", package])
        .args([kind, name, "--profile", profile])
        .args(["--message-format", "json-render-diagnostics"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build {kind} {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One JSON object a line; the target's artifact names its executable.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let target_name = format!(r#""name":"{name}""#);
    let exe = stdout
        .lines()
        .filter(|line| line.contains(r#""reason":"compiler-artifact""#))
        .filter(|line| line.contains(&target_name))
        .find_map(|line| {
            let rest = &line[line.find(r#""executable":""#)? + r#""executable":""#.len()..];
            Some(rest[..rest.find('"')?].to_owned())
        })
        .unwrap_or_else(|| panic!("cargo reported no {name} executable:\n{stdout}"));
    eprintln!("{name}: {exe} (cargo build: {:?})", started.elapsed());
    exe
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
