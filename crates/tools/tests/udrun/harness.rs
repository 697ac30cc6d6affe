//! What the tests of every group share: the [`udrun`] command with an
//! environment of its own, a finished run ([`Run`]) and a running udrun
//! ([`Udrun`], taken down should its test fail), every run bounded by
//! [`LIMIT`]; the bash PMI-1 rank ([`pmi_rank`]) and the proof it gives on
//! `PMI_PORT`; the fake ssh ([`FAKE_SSH`]) that makes a "remote" host of
//! this machine; scratch files and scripts; and the checks on a run's
//! output and on the processes it left.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// No run may take longer than this: it keeps a hung run from hanging the
/// suite, far above what the slowest machine takes for any of these runs.
pub(crate) const LIMIT: Duration = Duration::from_secs(120);

/// The `udrun` command, with an environment free of PMI, udbtl and udrun
/// variables (the tests may themselves run under a launcher).
pub(crate) fn udrun(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udrun"));
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if ["PMI_", "PMIX_", "UDBTL_", "UDRUN_"]
            .iter()
            .any(|p| key_text.starts_with(p))
        {
            cmd.env_remove(&key);
        }
    }
    // More ranks than CPUs are fine here, except where a test removes it.
    cmd.env_remove("RUST_LOG")
        .env("UDRUN_OVERSUBSCRIBE", "1")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// What a finished run left.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) elapsed: Duration,
}

impl Run {
    /// The lines udrun itself wrote to stderr.
    pub(crate) fn reports(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("udrun: "))
            .collect()
    }
}

/// Reads a pipe to its end on a thread.
pub(crate) fn collect(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        pipe.read_to_string(&mut text).unwrap();
        text
    })
}

/// A running udrun. Should a test fail or time out before it ends, it is
/// sent SIGTERM (so that it takes its ranks down), then SIGKILL.
pub(crate) struct Udrun {
    pub(crate) child: Child,
    started: Instant,
}

impl Udrun {
    pub(crate) fn start(mut cmd: Command) -> Self {
        let started = Instant::now();
        let child = cmd.spawn().unwrap();
        Self { child, started }
    }

    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().try_into().unwrap()).unwrap()
    }

    /// Waits for the end at most [`LIMIT`] (else panics): the exit code and
    /// the time since the start.
    pub(crate) fn wait(&mut self) -> (Option<i32>, Duration) {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.code(), self.started.elapsed());
            }
            assert!(
                self.started.elapsed() < LIMIT,
                "udrun did not end within {LIMIT:?}"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Udrun {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = kill_process(self.pid(), Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `udrun args` to its end.
pub(crate) fn launch(args: &[&str]) -> Run {
    run_command(udrun(args))
}

/// Runs a [`udrun`] command to its end.
pub(crate) fn run_command(cmd: Command) -> Run {
    finish(Udrun::start(cmd))
}

/// Runs a [`udrun`] command to its end, with `input` on its stdin, which
/// is then closed.
pub(crate) fn run_with_stdin(mut cmd: Command, input: &[u8]) -> Run {
    cmd.stdin(Stdio::piped());
    let mut udrun = Udrun::start(cmd);
    let mut stdin = udrun.child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, input).unwrap();
    drop(stdin);
    finish(udrun)
}

/// Reads a started udrun's output to its end, and waits for it.
fn finish(mut udrun: Udrun) -> Run {
    let stdout = collect(udrun.child.stdout.take().unwrap());
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let (code, elapsed) = udrun.wait();
    Run {
        code,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        elapsed,
    }
}

/// A bash rank that speaks PMI-1: init, put `k<rank>`, barrier, get every
/// rank's key and check its value, print `rank R saw N`, finalize. `before`
/// runs after init (a rank that fails there leaves the others stuck in the
/// barrier), `after` before finalize. `$rank`, `$size`, `$fd` and `req`
/// (send a line, read the reply into `$reply`) are there for them.
pub(crate) fn pmi_rank(before: &str, after: &str) -> String {
    format!(
        r#"set -u
die() {{ echo "rank ${{rank:-?}}: $*" >&2; exit 90; }}
if [ -n "${{PMI_FD:-}}" ]; then
    fd=$PMI_FD rank=$PMI_RANK size=$PMI_SIZE
else
    exec {{fd}}<>"/dev/tcp/${{PMI_PORT%:*}}/${{PMI_PORT##*:}}" || die "cannot connect to $PMI_PORT"
    IFS= read -r -t 10 line <&$fd || die "no challenge"
    case $line in "cmd=challenge nonce="*) ;; *) die "challenge: $line" ;; esac
    proof=$(UDRUN_TEST_NONCE=${{line#cmd=challenge nonce=}} {proof})
    [ -n "$proof" ] || die "no proof"
    hello="cmd=initack pmiid=$PMI_ID proof=$proof"
    echo "$hello" >&$fd
    for _ in 1 2 3 4; do
        IFS= read -r -t 10 line <&$fd || die "no initack"
        case $line in
            "cmd=set size="*) size=${{line#cmd=set size=}} ;;
            "cmd=set rank="*) rank=${{line#cmd=set rank=}} ;;
        esac
    done
fi
req() {{ echo "$1" >&$fd; IFS= read -r -t 10 reply <&$fd || die "no reply to $1"; }}
req "cmd=init pmi_version=1 pmi_subversion=1"
case $reply in *rc=0*) ;; *) die "init: $reply" ;; esac
req "cmd=get_my_kvsname"
kvs=${{reply##*kvsname=}} kvs=${{kvs%% *}}
{before}
req "cmd=put kvsname=$kvs key=k$rank value=v$rank-$UDBTL_JOB_KEY"
req "cmd=barrier_in"
for ((i = 0; i < size; i++)); do
    req "cmd=get kvsname=$kvs key=k$i"
    case $reply in *" value=v$i-$UDBTL_JOB_KEY") ;; *) die "get k$i: $reply" ;; esac
done
echo "rank $rank saw $size"
{after}
req "cmd=finalize"
"#,
        proof = proof_command(),
    )
}

/// A shell pipeline that prints the PMI_PORT proof for the nonce (hex) in
/// `UDRUN_TEST_NONCE`, from `UDBTL_PMI_SECRET` and `PMI_ID` in its
/// environment: this test binary, running
/// [`proof_helper`](crate::proof_helper) alone.
pub(crate) fn proof_command() -> String {
    let exe = std::env::current_exe().unwrap();
    format!(
        "'{}' --exact proof_helper --nocapture 2>/dev/null | sed -n 's/^PROOF //p'",
        exe.display()
    )
}

/// `udrun <udrun_args> bash -c <script>`.
pub(crate) fn run_script(udrun_args: &[&str], script: &str) -> Run {
    let mut args = udrun_args.to_vec();
    args.extend(["bash", "-c", script]);
    launch(&args)
}

/// udrun's arguments for 3 ranks, rank 0 here and ranks 1 and 2 on "node",
/// reached through the launcher script `ssh`; `extra` follows them.
pub(crate) fn remote_args<'a>(ssh: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "-n",
        "3",
        "--host",
        "localhost,node:2",
        "--launcher-exec",
        ssh.to_str().unwrap(),
        // The fake node is this machine, which loopback reaches; a job
        // across hosts would use every other interface, and a machine (or a
        // test's network namespace) may have none.
        "-x",
        "UDBTL_IF_INCLUDE=lo",
    ];
    args.extend_from_slice(extra);
    args
}

/// `udrun` arguments for 2 ranks, rank 0 here and rank 1 on the fake
/// `node` reached through `ssh`: for tests of PMI and the launcher, whose
/// ranks send no datagrams (so no interface setting).
pub(crate) fn one_remote_rank_args(ssh: &Path) -> [&str; 6] {
    [
        "-n",
        "2",
        "--host",
        "localhost,node",
        "--launcher-exec",
        ssh.to_str().unwrap(),
    ]
}

/// Checks that every one of `n` ranks printed `rank R saw n`.
pub(crate) fn assert_all_saw(run: &Run, n: u32) {
    for rank in 0..n {
        let line = format!("rank {rank} saw {n}");
        assert!(
            run.stdout.lines().any(|l| l == line),
            "{line:?} missing: {run:#?}"
        );
    }
}

/// Checks a failed run: status `code`, and exactly one line from udrun,
/// containing every one of `words`.
pub(crate) fn assert_fails(run: &Run, code: i32, words: &[&str]) {
    assert_eq!(run.code, Some(code), "{run:#?}");
    let reports = run.reports();
    assert_eq!(reports.len(), 1, "one line expected: {run:#?}");
    for word in words {
        assert!(reports[0].contains(word), "{word:?} missing: {run:#?}");
    }
}

/// A fresh directory for files a test needs.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("udrun-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an executable script.
pub(crate) fn script_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Whether process `pid` is gone for good (not even a zombie).
pub(crate) fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Waits (briefly) until `check` holds.
pub(crate) fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// How long a job that must not wait for its ranks may take at most: the
/// ranks it must kill sleep for 1000 s, or hang, or wait in a barrier for
/// a peer that is gone, so only a udrun that waits them out (or for the
/// watchdog) takes this long. Far above any machine's slowness: these
/// tests check what ends a job, never how fast.
pub(crate) const NOT_WAITED_OUT: Duration = Duration::from_secs(60);

/// A stand-in for ssh that runs COMMAND on this machine as sshd would: in
/// a session of its own (so udrun's kill of "ssh" does not reach it) and
/// with a fresh environment (so only what udrun passes gets there).
pub(crate) const FAKE_SSH: &str = r#"#!/bin/sh
# fake-ssh -o BatchMode=yes -o ConnectTimeout=5 HOST COMMAND
while [ $# -gt 2 ]; do shift; done
exec env -i PATH="$PATH" HOME="$HOME" setsid -w sh -c "$2"
"#;

/// Whether `pid` is a zombie (a "remote" rank runs in a session of its own
/// that udrun does not reap; whoever adopted it does).
pub(crate) fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
    })
}

/// How many ranks wrote `line`: those of its "[ranks 0-1,3] " prefix when
/// udrun merged the same line from several ranks, else one.
pub(crate) fn ranks_of_line(line: &str) -> usize {
    let Some(list) = line
        .strip_prefix("[ranks ")
        .and_then(|rest| rest.split_once(']'))
        .map(|(list, _)| list)
    else {
        return 1;
    };
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((lo, hi)) => match (lo.parse::<usize>(), hi.parse::<usize>()) {
                (Ok(lo), Ok(hi)) if hi >= lo => hi - lo + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum()
}
