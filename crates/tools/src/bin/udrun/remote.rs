//! Ranks on other hosts, started the way hydra's ssh launcher does it.
//!
//! A remote rank is a local `ssh -o BatchMode=yes -o ConnectTimeout=5 HOST
//! COMMAND` process; COMMAND changes to udrun's working directory and runs
//! the program with `PMI_PORT=<this host>:<port>` and `PMI_ID=<rank>` (the
//! PMI-1 port mode: the rank connects back over TCP), the job variables and
//! the `-x` exports. It expects a POSIX shell as the remote login shell.
//!
//! # Secrets
//!
//! The job's PMI secret (see [`udbtl_pmi::auth`]) and the job key are not
//! on COMMAND, which every user of the remote host can read in
//! `/proc/PID/cmdline` of the remote shell and of the rank. udrun writes
//! them as one line, `<secret hex> <job key>`, into the launcher's standard
//! input right after starting it ([`secrets_line`]); COMMAND first reads
//! that line with the shell's `read` builtin (no process has it in its
//! arguments), exports `UDBTL_PMI_SECRET`, `UDBTL_JOB_KEY` and
//! `UDRUN_JOB_KEY`, and only then runs the rank, whose environment
//! (`/proc/PID/environ`: its user and root only) holds them. `read` takes
//! no byte beyond the newline from a pipe, so the rest of standard input is
//! the watcher's, as below. A launcher whose standard input ends before the
//! line (udrun died) makes COMMAND exit 1 with `udrun (remote side): no job
//! secret on standard input`, before the rank starts.
//!
//! There is no proxy on the remote side. So that a remote rank does not
//! outlive its job, COMMAND also watches its standard input, a pipe that
//! udrun holds open and never writes: when it closes (udrun kills the job,
//! or udrun itself dies), the remote shell sends SIGTERM to the rank's
//! process group and SIGKILL 2 s later. A remote rank killed by signal N
//! shows up as exit code 128+N (the remote shell's report of it).
//!
//! Before any rank starts, [`check_hosts`] runs `ssh ... HOST true` on every
//! remote host at once, so that an unreachable one fails the launch with
//! ssh's own reason instead of leaving the other ranks waiting for it.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::Signal;

/// How long [`check_hosts`] waits for every host to answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// The launcher's options, before the host and the command.
const LAUNCHER_OPTIONS: [&str; 4] = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"];

/// A launcher command for `host` running the shell command `command`, in
/// its own process group, with stdin, stdout and stderr as the caller sets.
pub(crate) fn launcher(program: &OsStr, host: &str, command: &OsStr) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(LAUNCHER_OPTIONS)
        .arg(host)
        .arg(command)
        .process_group(0);
    cmd
}

/// The line udrun writes into a remote launcher's standard input, which
/// [`command`] reads before it starts the rank (see the
/// [module docs](self#secrets)).
pub(crate) fn secrets_line(secret_hex: &str, job_key: u32) -> String {
    format!("{secret_hex} {job_key}\n")
}

/// The shell command that reads the [`secrets_line`] from its standard
/// input, then runs `argv` in `dir` with `env` (and the secrets) on a
/// remote host and kills it when its standard input closes (see the
/// [module docs](self)).
pub(crate) fn command(dir: Option<&Path>, env: &[(String, String)], argv: &[OsString]) -> OsString {
    let mut script = Vec::new();
    if let Some(dir) = dir {
        script.extend_from_slice(b"cd ");
        quote_into(&mut script, dir.as_os_str().as_bytes());
        script.extend_from_slice(b" || exit; ");
    }
    // The secrets, from the first line of stdin (a builtin: in no argv).
    script.extend_from_slice(
        b"IFS=' ' read -r UDBTL_PMI_SECRET UDBTL_JOB_KEY && [ -n \"$UDBTL_JOB_KEY\" ] || \
          { echo 'udrun (remote side): no job secret on standard input' >&2; exit 1; }; \
          UDRUN_JOB_KEY=$UDBTL_JOB_KEY; export UDBTL_PMI_SECRET UDBTL_JOB_KEY UDRUN_JOB_KEY; ",
    );
    // Keep the launcher's stdin as fd 3 for the watcher; the rank gets
    // /dev/null.
    script.extend_from_slice(b"exec 3<&0 </dev/null; env");
    for (name, value) in env {
        script.push(b' ');
        quote_into(&mut script, format!("{name}={value}").as_bytes());
    }
    for word in argv {
        script.push(b' ');
        quote_into(&mut script, word.as_bytes());
    }
    script.extend_from_slice(
        b" 3<&- & p=$!; \
          ( trap '' TERM; while read -r _; do :; done <&3; \
            kill -TERM 0; sleep 2; kill -KILL 0 ) >/dev/null 2>&1 & w=$!; \
          exec 3<&-; wait $p; s=$?; kill -KILL $w 2>/dev/null; exit $s",
    );
    OsString::from_vec(script)
}

/// Appends `word` to `out` in single quotes, for any POSIX shell.
fn quote_into(out: &mut Vec<u8>, word: &[u8]) {
    out.push(b'\'');
    for &b in word {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
}

/// A host that [`check_hosts`] could not reach, and why.
#[derive(Debug)]
pub(crate) struct Unreachable {
    pub(crate) host: String,
    pub(crate) reason: String,
}

/// Runs `launcher ... HOST true` on every host in `hosts` in parallel and
/// returns those that failed (in `hosts` order), each with the launcher's
/// last line of complaint (or, when silent, its name and exit status). Gives up on a host after 10 s, or on all of them once
/// `stop()` (udrun was interrupted).
pub(crate) fn check_hosts(
    program: &OsStr,
    hosts: &[&str],
    stop: impl Fn() -> bool,
) -> Vec<Unreachable> {
    let started: Vec<(&str, io::Result<Child>)> = hosts
        .iter()
        .map(|&host| {
            let child = launcher(program, host, OsStr::new("true"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn();
            (host, child)
        })
        .collect();
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let mut failed = Vec::new();
    for (host, child) in started {
        let reason = match child {
            Ok(child) => wait_check(child, program, deadline, &stop).err(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(format!(
                "{} not found ({})",
                program.to_string_lossy(),
                crate::os_message(&e)
            )),
            Err(e) => Some(format!(
                "cannot run {}: {}",
                program.to_string_lossy(),
                crate::os_message(&e)
            )),
        };
        if let Some(reason) = reason {
            failed.push(Unreachable {
                host: host.to_owned(),
                reason,
            });
        }
    }
    failed
}

/// Waits for one check (a run of `program`) until `deadline`; the error is
/// why it failed.
fn wait_check(
    mut child: Child,
    program: &OsStr,
    deadline: Instant,
    stop: &impl Fn() -> bool,
) -> Result<(), String> {
    let program = program.to_string_lossy();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if stop() => break Err("interrupted".to_owned()),
            Ok(None) if Instant::now() >= deadline => {
                break Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs()));
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => break Err(format!("waiting for {program}: {}", crate::os_message(&e))),
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(reason) => {
            crate::kill_group(child.id(), Signal::KILL);
            let _ = child.wait();
            return Err(reason);
        }
    };
    if status.success() {
        return Ok(());
    }
    // ssh's complaint is short: it fits in the pipe, so reading after the
    // exit cannot block.
    let mut complaint = Vec::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_end(&mut complaint);
    }
    let complaint = String::from_utf8_lossy(&complaint);
    Err(
        match complaint.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => line.trim().to_owned(),
            None => match status.code() {
                Some(code) => format!("{program} exited with code {code}"),
                None => format!("{program} ended by {status}"),
            },
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_any_byte() {
        let mut out = Vec::new();
        quote_into(&mut out, b"it's $HOME `x` \\ \"q\"");
        assert_eq!(out, b"'it'\\''s $HOME `x` \\ \"q\"'");
    }

    const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    /// Runs `script` with `sh -c` in its own process group (the watcher's
    /// `kill 0` must not reach the test harness), its stdin a pipe that
    /// gets the secrets line (the job key 42) and stays open unless
    /// `close_stdin`.
    fn sh(script: &OsStr, close_stdin: bool) -> std::process::Output {
        sh_with(script, Some(&secrets_line(SECRET, 42)), close_stdin)
    }

    fn sh_with(script: &OsStr, line: Option<&str>, close_stdin: bool) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take();
        if let (Some(line), Some(pipe)) = (line, stdin.as_mut()) {
            pipe.write_all(line.as_bytes()).unwrap();
        }
        if close_stdin {
            drop(stdin);
            child.wait_with_output().unwrap()
        } else {
            let out = child.wait_with_output().unwrap();
            drop(stdin);
            out
        }
    }

    fn words(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn remote_command_runs_under_sh() {
        let env = [("PMI_ID".to_owned(), "1".to_owned())];
        let argv = words(&["printf", "%s|%s\\n", "a b", "it's"]);
        let out = sh(&command(Some(Path::new("/")), &env, &argv), false);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|it's\n");
        let argv = words(&["sh", "-c", "echo $PMI_ID; pwd; exit 3"]);
        let out = sh(&command(Some(Path::new("/")), &env, &argv), false);
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n/\n");
    }

    #[test]
    fn the_secrets_come_from_stdin_and_reach_the_rank_environment_only() {
        let argv = words(&[
            "sh",
            "-c",
            "echo \"$UDBTL_PMI_SECRET $UDBTL_JOB_KEY $UDRUN_JOB_KEY\"",
        ]);
        let script = command(None, &[], &argv);
        assert!(
            !script
                .as_bytes()
                .windows(8)
                .any(|w| w == &SECRET.as_bytes()[..8])
        );
        let out = sh(&script, false);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{SECRET} 42 42\n")
        );
        // No line (udrun gone before writing it): a clear failure, at once,
        // and the rank does not run.
        let started = Instant::now();
        let argv = words(&["echo", "ran"]);
        let out = sh_with(&command(None, &[], &argv), None, true);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "udrun (remote side): no job secret on standard input\n"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn closing_stdin_kills_the_remote_rank() {
        use std::os::unix::process::ExitStatusExt;
        let started = Instant::now();
        let out = sh(&command(None, &[], &words(&["sleep", "30"])), true);
        assert_eq!(out.status.signal(), Some(15), "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
