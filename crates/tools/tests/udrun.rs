//! `udrun` as a user runs it: the real binary, real rank processes and the
//! real PMI-1 exchange. The ranks are bash scripts that speak PMI-1 over
//! their `PMI_FD` (or, on a "remote" host, over TCP to `PMI_PORT`), made by
//! [`pmi_rank`]. Every run is bounded by [`LIMIT`]; a run that takes longer
//! is killed and fails its test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// No run may take longer than this: it keeps a hung run from hanging the
/// suite, far above what the slowest machine takes for any of these runs.
const LIMIT: Duration = Duration::from_secs(120);

/// The `udrun` command, with an environment free of PMI, udbtl and udrun
/// variables (the tests may themselves run under a launcher).
fn udrun(args: &[&str]) -> Command {
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
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    /// The lines udrun itself wrote to stderr.
    fn reports(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("udrun: "))
            .collect()
    }
}

/// Reads a pipe to its end on a thread.
fn collect(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        pipe.read_to_string(&mut text).unwrap();
        text
    })
}

/// A running udrun. Should a test fail or time out before it ends, it is
/// sent SIGTERM (so that it takes its ranks down), then SIGKILL.
struct Udrun {
    child: Child,
    started: Instant,
}

impl Udrun {
    fn start(mut cmd: Command) -> Self {
        let started = Instant::now();
        let child = cmd.spawn().unwrap();
        Self { child, started }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().try_into().unwrap()).unwrap()
    }

    /// Waits for the end at most [`LIMIT`] (else panics): the exit code and
    /// the time since the start.
    fn wait(&mut self) -> (Option<i32>, Duration) {
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
fn launch(args: &[&str]) -> Run {
    run_command(udrun(args))
}

/// Runs a [`udrun`] command to its end.
fn run_command(cmd: Command) -> Run {
    finish(Udrun::start(cmd))
}

/// Runs a [`udrun`] command to its end, with `input` on its stdin, which
/// is then closed.
fn run_with_stdin(mut cmd: Command, input: &[u8]) -> Run {
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
fn pmi_rank(before: &str, after: &str) -> String {
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
/// environment: this test binary, running [`proof_helper`] alone.
fn proof_command() -> String {
    let exe = std::env::current_exe().unwrap();
    format!(
        "'{}' --exact proof_helper --nocapture 2>/dev/null | sed -n 's/^PROOF //p'",
        exe.display()
    )
}

/// Not a test: the helper of [`proof_command`] (it does nothing unless
/// `UDRUN_TEST_NONCE` is set).
#[test]
fn proof_helper() {
    let Ok(nonce_hex) = std::env::var("UDRUN_TEST_NONCE") else {
        return;
    };
    let mut nonce = [0u8; udbtl_pmi::auth::NONCE_LEN];
    for (i, byte) in nonce.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&nonce_hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let secret =
        udbtl_pmi::JobSecret::from_hex(&std::env::var(udbtl_pmi::SECRET_ENV).unwrap()).unwrap();
    let proof = secret.proof(&nonce, &std::env::var("PMI_ID").unwrap());
    let hex: String = proof.iter().map(|b| format!("{b:02x}")).collect();
    println!("PROOF {hex}");
}

/// `udrun <udrun_args> bash -c <script>`.
fn run_script(udrun_args: &[&str], script: &str) -> Run {
    let mut args = udrun_args.to_vec();
    args.extend(["bash", "-c", script]);
    launch(&args)
}

/// udrun's arguments for 3 ranks, rank 0 here and ranks 1 and 2 on "node",
/// reached through the launcher script `ssh`; `extra` follows them.
fn remote_args<'a>(ssh: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
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

/// Checks that every one of `n` ranks printed `rank R saw n`.
fn assert_all_saw(run: &Run, n: u32) {
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
fn assert_fails(run: &Run, code: i32, words: &[&str]) {
    assert_eq!(run.code, Some(code), "{run:#?}");
    let reports = run.reports();
    assert_eq!(reports.len(), 1, "one line expected: {run:#?}");
    for word in words {
        assert!(reports[0].contains(word), "{word:?} missing: {run:#?}");
    }
}

/// A fresh directory for files a test needs.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("udrun-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an executable script.
fn script_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Whether process `pid` is gone for good (not even a zombie).
fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// PIDs of the processes whose environment holds `UDRUN_JOB_KEY=<key>`.
fn processes_with_key(key: &str) -> Vec<u32> {
    let needle = format!("UDRUN_JOB_KEY={key}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// Waits (briefly) until `check` holds.
fn eventually(what: &str, check: impl Fn() -> bool) {
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
const NOT_WAITED_OUT: Duration = Duration::from_secs(60);

#[test]
fn ranks_exchange_values_through_pmi() {
    let script = pmi_rank("", "");
    for n in [1, 2, 4, 16] {
        let run = run_script(&["-n", &n.to_string()], &script);
        assert_eq!(run.code, Some(0), "{run:#?}");
        assert_all_saw(&run, n);
        assert!(run.stderr.is_empty(), "{run:#?}");
    }
}

#[test]
fn a_non_zero_exit_ends_the_job_with_that_code() {
    let script = pmi_rank(r#"[ "$rank" = 2 ] && exit 3"#, "");
    let run = run_script(&["-n", "4"], &script);
    assert_fails(
        &run,
        3,
        &["rank 2 (pid ", "exited with code 3", "killing the job"],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
}

#[test]
fn a_death_by_signal_ends_the_job_with_128_plus_the_signal() {
    let segv = pmi_rank(r#"[ "$rank" = 1 ] && { ulimit -c 0; kill -SEGV $$; }"#, "");
    let run = run_script(&["-n", "3"], &segv);
    assert_fails(
        &run,
        139,
        &["rank 1 (pid ", "killed by signal 11 (SIGSEGV)"],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");

    let kill = pmi_rank(r#"[ "$rank" = 0 ] && kill -KILL $$"#, "");
    let run = run_script(&["-n", "2"], &kill);
    assert_fails(&run, 137, &["rank 0 (pid ", "killed by signal 9 (SIGKILL)"]);
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
}

#[test]
fn pmi_abort_ends_the_job_with_its_code() {
    let script = pmi_rank(
        r#"[ "$rank" = 1 ] && { echo "cmd=abort exitcode=7 message=it_broke" >&$fd; sleep 1000; }"#,
        "",
    );
    let run = run_script(&["-n", "3"], &script);
    assert_fails(
        &run,
        7,
        &["rank 1 (pid ", "called abort with code 7: it_broke"],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
}

#[test]
fn leaving_pmi_without_finalize_fails_the_job() {
    // Exit 0 after using PMI but without finalize: hydra's rule.
    let script = pmi_rank(r#"[ "$rank" = 1 ] && exit 0"#, "");
    let run = run_script(&["-n", "2"], &script);
    assert_fails(&run, 1, &["rank 1 (pid ", "without calling PMI finalize"]);
    // Closing the connection and living on.
    let script = pmi_rank(r#"[ "$rank" = 0 ] && { exec {fd}>&-; sleep 1000; }"#, "");
    let run = run_script(&["-n", "2"], &script);
    assert_fails(&run, 1, &["rank 0 (pid ", "closed its PMI connection"]);
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    // A program that never uses PMI is judged by its exit status only.
    let run = launch(&["-n", "2", "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stderr.is_empty(), "{run:#?}");
}

#[test]
fn sigint_kills_a_hung_job_and_leaves_nothing_behind() {
    const N: usize = 3;
    // After init, each rank prints its PID, its background child's PID and
    // the job key, then waits forever.
    let script = pmi_rank(
        r#"sleep 1000 & echo "pids $$ $! key $UDRUN_JOB_KEY"; wait"#,
        "",
    );
    let mut udrun = Udrun::start(udrun(&["-n", &N.to_string(), "bash", "-c", &script]));
    let (tx, lines) = mpsc::channel();
    let stdout = BufReader::new(udrun.child.stdout.take().unwrap());
    thread::spawn(move || {
        for line in stdout.lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let mut pids = Vec::new();
    let mut keys = HashSet::new();
    for _ in 0..N {
        let line = lines
            .recv_timeout(Duration::from_secs(5))
            .expect("rank output");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((words[0], words[3]), ("pids", "key"), "{line}");
        pids.extend([words[1].parse::<u32>().unwrap(), words[2].parse().unwrap()]);
        keys.insert(words[4].to_owned());
    }
    assert_eq!(keys.len(), 1);
    let key = keys.into_iter().next().unwrap();
    // (A process in the middle of an exec may briefly show no environment.)
    eventually("every rank and child carries the key", || {
        processes_with_key(&key).len() == 2 * N
    });

    kill_process(udrun.pid(), Signal::INT).unwrap();
    let (code, elapsed) = udrun.wait();
    let stderr = stderr.join().unwrap();
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(stderr, "udrun: interrupted by SIGINT; job killed\n");
    assert!(elapsed < NOT_WAITED_OUT, "{elapsed:?}");
    // Ranks and their children are gone and reaped (udrun is a subreaper).
    eventually(&format!("processes left: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid))
    });
    assert_eq!(processes_with_key(&key), Vec::<u32>::new());
}

#[test]
fn bad_command_lines_get_one_line_and_status_2() {
    for args in [
        &["-n", "2", "--bogus", "true"][..],
        &["-n", "0", "true"],
        &["-n", "two", "true"],
        &["-n", "2"],
        &["true"],
        &["-n", "2", "--bind-to", "socket", "true"],
        &["-n", "2", "-x", "1BAD", "true"],
        &["-n", "2", "--host", "a:0", "true"],
    ] {
        let run = launch(args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:#?}");
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {run:#?}");
        assert!(run.stderr.starts_with("udrun: "), "{args:?}: {run:#?}");
        assert!(run.stdout.is_empty(), "{args:?}: {run:#?}");
    }
    let run = launch(&["-n", "0", "true"]);
    assert!(run.stderr.contains("'0' for '-n <N>'"), "{run:#?}");
    let run = launch(&["-n", "2"]);
    assert!(run.stderr.contains("<PROGRAM>"), "{run:#?}");
}

#[test]
fn a_program_that_cannot_start_gets_127() {
    let run = launch(&["-n", "2", "/no/such/program"]);
    assert_eq!(run.code, Some(127), "{run:#?}");
    assert_eq!(
        run.stderr,
        "udrun: cannot start /no/such/program: No such file or directory\n"
    );
    // Found but not executable: 126, as in a shell.
    let run = launch(&["-n", "1", "/"]);
    assert_eq!(run.code, Some(126), "{run:#?}");
    assert_eq!(run.stderr, "udrun: cannot start /: Permission denied\n");
}

#[test]
fn an_unreachable_host_fails_fast() {
    let run = launch(&["-n", "2", "--host", "no-such-host.invalid", "true"]);
    assert_fails(&run, 1, &["cannot reach host no-such-host.invalid: "]);
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    // Without ssh.
    let run = launch(&[
        "-n",
        "2",
        "--host",
        "no-such-host.invalid",
        "--launcher-exec",
        "/no/such/ssh",
        "true",
    ]);
    assert_fails(
        &run,
        1,
        &["cannot reach host no-such-host.invalid: /no/such/ssh not found"],
    );
}

#[test]
fn tag_output_prefixes_every_line() {
    let run = launch(&[
        "-n",
        "2",
        "--tag-output",
        "sh",
        "-c",
        "echo one; echo two >&2; printf 'no newline'",
    ]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    for rank in 0..2 {
        for (text, stream) in [
            ("one", &run.stdout),
            ("no newline", &run.stdout),
            ("two", &run.stderr),
        ] {
            let line = format!("[{rank}] {text}");
            assert!(stream.lines().any(|l| l == line), "{line:?}: {run:#?}");
        }
    }
    assert_eq!(run.stdout.lines().count(), 4, "{run:#?}");
    // Untagged, output passes unchanged.
    let run = launch(&["-n", "1", "sh", "-c", "printf 'a\\nb'"]);
    assert_eq!(run.stdout, "a\nb");
}

#[test]
fn exports_and_job_variables_reach_the_ranks() {
    let print = r#"echo "$PMI_RANK $UDBTL_JOB_KEY $UDRUN_JOB_KEY $UDRUN_LOCAL_RANK $UDRUN_LOCAL_SIZE ${UDRUN_TEST_VAR-unset}""#;
    let launch = || {
        let run = launch(&[
            "-n",
            "3",
            "-x",
            "UDRUN_TEST_VAR=a b=c",
            "-x",
            "HOME",
            "sh",
            "-c",
            print,
        ]);
        assert_eq!(run.code, Some(0), "{run:#?}");
        let mut keys = HashSet::new();
        for line in run.stdout.lines() {
            let words: Vec<&str> = line.splitn(6, ' ').collect();
            assert_eq!(
                words[1], words[2],
                "UDBTL_JOB_KEY and UDRUN_JOB_KEY differ: {line}"
            );
            assert_ne!(words[1].parse::<u32>().unwrap(), 0, "{line}");
            assert_eq!(words[0], words[3], "local rank: {line}");
            assert_eq!(words[4], "3", "local size: {line}");
            assert_eq!(words[5], "a b=c", "-x: {line}");
            keys.insert(words[1].to_owned());
        }
        assert_eq!(run.stdout.lines().count(), 3, "{run:#?}");
        assert_eq!(keys.len(), 1, "one key per job: {run:#?}");
        keys.into_iter().next().unwrap()
    };
    assert_ne!(launch(), launch(), "two launches, one key");
}

/// The CPUs this process may use, from a `Cpus_allowed_list` value.
fn cpu_list(text: &str) -> Vec<usize> {
    text.trim()
        .split(',')
        .flat_map(|range| match range.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![range.parse().unwrap()],
        })
        .collect()
}

#[test]
fn bind_to_core_pins_each_local_rank() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    let cpus = cpu_list(ours);
    let show = r#"echo "$PMI_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)""#;
    let n = cpus.len() + 1;
    let run = launch(&["-n", &n.to_string(), "--bind-to", "core", "sh", "-c", show]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    // More ranks than CPUs: said once.
    assert_eq!(run.reports().len(), 1, "{run:#?}");
    let notice = format!("{n} local ranks on {} CPUs", cpus.len());
    assert!(run.reports()[0].contains(&notice), "{run:#?}");
    for line in run.stdout.lines() {
        let (rank, list) = line.split_once(' ').unwrap();
        let rank: usize = rank.parse().unwrap();
        assert_eq!(cpu_list(list), [cpus[rank % cpus.len()]], "{line}");
    }
    // --bind-to none (the default) leaves the mask alone.
    let run = launch(&["-n", "1", "sh", "-c", show]);
    assert_eq!(cpu_list(run.stdout.split_once(' ').unwrap().1), cpus);
}

#[test]
fn report_startup_times_the_first_barrier() {
    let run = run_script(&["-n", "4", "--report-startup"], &pmi_rank("", ""));
    assert_eq!(run.code, Some(0), "{run:#?}");
    let reports = run.reports();
    assert_eq!(reports.len(), 1, "{run:#?}");
    let ms = reports[0]
        .strip_prefix("udrun: 4 ranks, first barrier after ")
        .and_then(|rest| rest.strip_suffix(" ms"))
        .unwrap_or_else(|| panic!("{run:#?}"));
    assert!(ms.parse::<f64>().unwrap() > 0.0);
}

#[test]
fn hostfile_places_ranks_here_and_rejects_bad_lines() {
    let dir = scratch("hostfile");
    let good = dir.join("good");
    std::fs::write(&good, "# this machine\nlocalhost slots=2\n127.0.0.1\n").unwrap();
    let run = run_script(
        &["-n", "3", "--hostfile", good.to_str().unwrap()],
        &pmi_rank("", ""),
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_all_saw(&run, 3);
    let bad = dir.join("bad");
    std::fs::write(&bad, "localhost\nnode2 cpus=4\n").unwrap();
    let run = launch(&["-n", "2", "--hostfile", bad.to_str().unwrap(), "true"]);
    assert_fails(&run, 2, &["line 2", "cpus=4"]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A stand-in for ssh that runs COMMAND on this machine as sshd would: in
/// a session of its own (so udrun's kill of "ssh" does not reach it) and
/// with a fresh environment (so only what udrun passes gets there).
const FAKE_SSH: &str = r#"#!/bin/sh
# fake-ssh -o BatchMode=yes -o ConnectTimeout=5 HOST COMMAND
while [ $# -gt 2 ]; do shift; done
exec env -i PATH="$PATH" HOME="$HOME" setsid -w sh -c "$2"
"#;

/// With `UDBTL_AUTH`, every rank's datagram keys derive from the job secret
/// that udrun hands local ranks in their environment and remote ones on the
/// launcher's stdin, so no key travels through PMI: a job across both kinds
/// of rank greets all round, authenticated and encrypted, and every rank's
/// dump says how it seals and where its keys came from.
#[test]
fn sealed_datagrams_key_from_the_job_secret_on_local_and_remote_ranks() {
    let dir = scratch("auth-keys");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    for (auth, integrity) in [
        ("1", "integrity aes-256-gcm (keys from the job secret)"),
        (
            "encrypt",
            "integrity aes-256-gcm, encrypted (keys from the job secret)",
        ),
    ] {
        let setting = format!("UDBTL_AUTH={auth}");
        let mut cmd = udrun(&remote_args(&ssh, &["-x", &setting, "-x", "UDBTL_DUMP=1"]));
        cmd.arg(env!("CARGO_BIN_EXE_udhello"));
        let run = run_command(cmd);
        assert_eq!(run.code, Some(0), "{setting}: {run:#?}");
        assert_eq!(
            run.stdout.matches("greeted and acknowledged").count(),
            3,
            "{setting}: {run:#?}"
        );
        let sealed: usize = run
            .stderr
            .lines()
            .filter(|l| l.contains(integrity))
            .map(ranks_of_line)
            .sum();
        assert_eq!(sealed, 3, "{setting}: {run:#?}");
    }
}

#[test]
fn remote_ranks_use_pmi_port_and_die_with_the_job() {
    let dir = scratch("remote");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // Rank 0 here over PMI_FD; ranks 1 and 2 on "node" over PMI_PORT.
    let after = r#"echo "rank $rank ${PMI_PORT:+port} $UDRUN_LOCAL_RANK/$UDRUN_LOCAL_SIZE ${UDRUN_TEST_VAR-unset}""#;
    let script = pmi_rank("", after);
    let mut cmd = udrun(&remote_args(&ssh, &[]));
    cmd.env("UDRUN_TEST_VAR", "exported")
        .args(["-x", "UDRUN_TEST_VAR", "bash", "-c", &script]);
    let run = run_command(cmd);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_all_saw(&run, 3);
    for line in [
        "rank 0  0/1 exported",
        "rank 1 port 0/2 exported",
        "rank 2 port 1/2 exported",
    ] {
        assert!(run.stdout.lines().any(|l| l == line), "{line:?}: {run:#?}");
    }

    // A remote rank that hangs is killed when a local one fails, through
    // its ssh's stdin.
    let hang = pmi_rank(
        r#"echo "pid $$"; [ "$rank" = 0 ] && { sleep 0.5; exit 4; }; sleep 1000"#,
        "",
    );
    let run = run_script(
        &[
            "-n",
            "2",
            "--host",
            "localhost,node",
            "--launcher-exec",
            ssh.to_str().unwrap(),
        ],
        &hang,
    );
    assert_fails(&run, 4, &["rank 0 (pid ", "exited with code 4"]);
    let pids: Vec<u32> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("pid ")?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "{run:#?}");
    eventually(&format!("remote rank left: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid) || zombie(pid))
    });
    std::fs::remove_dir_all(dir).unwrap();
}

/// Whether `pid` is a zombie (a "remote" rank runs in a session of its own
/// that udrun does not reap; whoever adopted it does).
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
    })
}

#[test]
fn what_a_rank_leaves_behind_is_killed_and_reaped() {
    let run = launch(&["-n", "2", "sh", "-c", "sleep 1000 & echo $!"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    let pids: Vec<u32> = run.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{run:#?}");
    eventually(&format!("left behind: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid))
    });
}

#[test]
fn a_closed_stdout_stops_the_ranks_as_in_a_pipeline() {
    // `udrun -n 1 yes | head -c 10`: the rank gets SIGPIPE, and the job
    // ends quietly with the status a pipeline's writer gets.
    let mut udrun = Udrun::start(udrun(&["-n", "1", "yes"]));
    let mut stdout = udrun.child.stdout.take().unwrap();
    let mut head = [0; 10];
    stdout.read_exact(&mut head).unwrap();
    drop(stdout);
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let (code, elapsed) = udrun.wait();
    let stderr = stderr.join().unwrap();
    assert_eq!(code, Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(elapsed < NOT_WAITED_OUT, "{elapsed:?}");
}

#[test]
fn a_rank_that_never_joins_pmi_ends_the_job() {
    // Rank 1 exits 0 without touching PMI while rank 0 waits in the first
    // barrier: once rank 0 has called init, that ends the job.
    for exit_first in [
        r#"[ "$PMI_RANK" = 1 ] && exit 0; [ "$PMI_RANK" = 0 ] && sleep 0.5"#,
        r#"[ "$PMI_RANK" = 1 ] && { sleep 0.5; exit 0; }"#,
    ] {
        let script = format!("{exit_first}\n{}", pmi_rank("", ""));
        let run = run_script(&["-n", "2"], &script);
        assert_fails(
            &run,
            1,
            &[
                "rank 1 (pid ",
                "exited without calling PMI init, which rank 0 did",
            ],
        );
        assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    }
}

#[test]
fn timeout_ends_a_long_job_with_124() {
    let mut udrun = Udrun::start(udrun(&[
        "-n",
        "2",
        "--timeout",
        "1",
        "sh",
        "-c",
        "echo $$; exec sleep 1000",
    ]));
    let stdout = collect(udrun.child.stdout.take().unwrap());
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let (code, elapsed) = udrun.wait();
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert_eq!(code, Some(124), "{stderr}");
    assert_eq!(
        stderr,
        "udrun: the job ran longer than --timeout 1 s; killing the job\n"
    );
    assert!(elapsed < NOT_WAITED_OUT, "{elapsed:?}");
    let pids: Vec<u32> = stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{stdout}");
    eventually(&format!("ranks left: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid))
    });
    // A job that ends in time is not touched.
    let run = launch(&["-n", "2", "--timeout", "30", "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stderr.is_empty(), "{run:#?}");
    let run = launch(&["-n", "2", "--timeout", "0", "true"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
}

#[test]
fn local_ranks_die_with_a_killed_udrun() {
    let mut udrun = Udrun::start(udrun(&["-n", "2", "sh", "-c", "echo $$; exec sleep 1000"]));
    let mut stdout = BufReader::new(udrun.child.stdout.take().unwrap());
    let mut pids = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        pids.push(line.trim().parse::<u32>().unwrap());
    }
    kill_process(udrun.pid(), Signal::KILL).unwrap();
    udrun.wait();
    // Killed at once; whoever adopted them reaps them.
    eventually(&format!("ranks outlived udrun: {pids:?}"), || {
        pids.iter().all(|&pid| gone(pid) || zombie(pid))
    });
}

#[test]
fn mpirun_spellings_np_and_h_work_and_tips_survive() {
    let run = launch(&[
        "-np",
        "2",
        "-H",
        "localhost:2",
        "sh",
        "-c",
        "echo $PMI_SIZE",
    ]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.stdout, "2\n2\n");
    // A program's own -np is its own.
    let run = launch(&["-np", "1", "echo", "-np", "3"]);
    assert_eq!(run.stdout, "-np 3\n", "{run:#?}");
    let run = launch(&["-n", "1", "--tag-outptu", "true"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:#?}");
    assert!(
        run.stderr
            .contains("tip: a similar argument exists: '--tag-output'"),
        "{run:#?}"
    );
}

#[test]
fn more_ranks_than_slots_needs_oversubscribe() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|list| cpu_list(list).len())
        .unwrap();
    let strict = |args: &[&str]| {
        let mut cmd = udrun(args);
        cmd.env_remove("UDRUN_OVERSUBSCRIBE");
        run_command(cmd)
    };
    let over = (cpus + 1).to_string();
    let run = strict(&["-n", &over, "sh", "-c", "echo ran"]);
    assert_fails(
        &run,
        1,
        &[
            &format!(
                "{over} ranks but {cpus} CPU{} here",
                if cpus == 1 { "" } else { "s" }
            ),
            "--oversubscribe",
        ],
    );
    assert!(run.stdout.is_empty(), "{run:#?}");
    let run = strict(&["-n", &over, "--oversubscribe", "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    // slots= is a limit.
    let run = strict(&["-n", "3", "--host", "localhost:2", "sh", "-c", "echo ran"]);
    assert_fails(&run, 1, &["3 ranks but 2 slots", "--oversubscribe"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
    let dir = scratch("slots");
    let file = dir.join("hosts");
    std::fs::write(&file, "localhost slots=4\n").unwrap();
    let run = strict(&["-n", "5", "--hostfile", file.to_str().unwrap(), "true"]);
    assert_fails(&run, 1, &["5 ranks but 4 slots"]);
    let run = strict(&["-n", "4", "--hostfile", file.to_str().unwrap(), "true"]);
    assert_eq!(run.code, Some(0), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Runs udrun from bash after `setup` (ulimit, say).
fn udrun_after(setup: &str, args: &[&str]) -> Run {
    let cmd = udrun(&[]);
    let mut shell = Command::new("bash");
    shell
        .arg("-c")
        .arg(format!("{setup}\nexec \"$@\""))
        .arg("bash")
        .arg(cmd.get_program())
        .args(args)
        .envs(
            cmd.get_envs()
                .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in cmd.get_envs() {
        if value.is_none() {
            shell.env_remove(key);
        }
    }
    run_command(shell)
}

#[test]
fn a_huge_n_fails_before_forking_and_names_the_limit() {
    let run = launch(&["-n", "4000000000", "sh", "-c", "echo ran"]);
    assert_fails(&run, 1, &["-n 4000000000 needs about", "limit of"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
    let run = udrun_after("ulimit -n 100", &["-n", "20", "sh", "-c", "echo ran"]);
    assert_fails(&run, 1, &["file descriptors", "RLIMIT_NOFILE"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
    // A soft limit below the hard one is raised.
    let run = udrun_after(
        "ulimit -Sn 100; ulimit -Hn 4096",
        &["-n", "20", "sh", "-c", "ulimit -n"],
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(run.stdout.lines().all(|l| l == "4096"), "{run:#?}");
}

#[test]
fn resource_failures_while_starting_name_the_rank() {
    // udrun inherits fds 3..89 of 100: the ranks run out of descriptors.
    let run = udrun_after(
        "ulimit -n 100; for fd in $(seq 3 89); do eval \"exec $fd</dev/null\"; done",
        &["-n", "10", "sleep", "1"],
    );
    assert_eq!(run.code, Some(1), "{run:#?}");
    let reports = run.reports();
    assert_eq!(reports.len(), 1, "{run:#?}");
    assert!(reports[0].contains("rank "), "{run:#?}");
    assert!(reports[0].contains("Too many open files"), "{run:#?}");
}

#[test]
fn stdin_goes_to_rank_0_only() {
    let cmd = udrun(&[
        "-n",
        "2",
        "sh",
        "-c",
        r#"while read -r l; do echo "$PMI_RANK:$l"; done; echo "$PMI_RANK:eof""#,
    ]);
    let run = run_with_stdin(cmd, b"a\nb\n");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let stdout = &run.stdout;
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["0:a", "0:b", "0:eof", "1:eof"], "{stdout}");
}

#[test]
fn x_with_an_unset_variable_is_an_error() {
    let mut cmd = udrun(&["-n", "1", "-x", "UDRUN_TEST_UNSET", "sh", "-c", "echo ran"]);
    cmd.env_remove("UDRUN_TEST_UNSET");
    let run = run_command(cmd);
    assert_fails(&run, 2, &["-x UDRUN_TEST_UNSET", "is not set"]);
    assert!(run.stdout.is_empty(), "{run:#?}");
}

#[test]
fn a_launcher_failure_names_the_launcher_used() {
    let dir = scratch("launcher");
    let quiet = script_file(&dir, "quiet-launcher", "#!/bin/sh\nexit 255\n");
    let quiet = quiet.to_str().unwrap();
    let run = launch(&[
        "-n",
        "1",
        "--host",
        "node",
        "--launcher-exec",
        quiet,
        "true",
    ]);
    assert_fails(
        &run,
        1,
        &[&format!(
            "cannot reach host node: {quiet} exited with code 255"
        )],
    );
    assert!(!run.stderr.contains("ssh exited"), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_error_every_rank_prints_is_printed_once() {
    // After the barrier (so at about the same time), every rank prints the
    // same error and, as another message (after a pause: udrun merges
    // whole messages, what a rank writes in one burst), one of its own,
    // then fails.
    let script = pmi_rank(
        "",
        r#"echo "error: bad input" >&2; sleep 0.3; echo "rank $rank only" >&2; sleep 0.5; exit 3"#,
    );
    let run = run_script(&["-n", "4"], &script);
    assert_eq!(run.code, Some(3), "{run:#?}");
    let errors: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("error: bad input"))
        .collect();
    assert_eq!(errors, ["[ranks 0-3] error: bad input"], "{run:#?}");
    for rank in 0..4 {
        let line = format!("rank {rank} only");
        assert!(run.stderr.lines().any(|l| l == line), "{line}: {run:#?}");
    }
    assert_eq!(run.reports().len(), 1, "{run:#?}");
    // Under --tag-output, every rank's line is shown.
    let run = run_script(&["-n", "2", "--tag-output"], &script);
    for rank in 0..2 {
        let line = format!("[{rank}] error: bad input");
        assert!(run.stderr.lines().any(|l| l == line), "{line}: {run:#?}");
    }
}

// Authenticated PMI_PORT (issue 15): remote ranks prove the job secret,
// which reaches them on the launcher's stdin, never on a command line.

/// A fake ssh that, before it runs COMMAND, connects to the PMI port named
/// on COMMAND as an intruder: it claims the same rank without a proof, and
/// prints what it was told on stderr.
const INTRUDER_SSH: &str = r#"#!/bin/bash
while [ $# -gt 2 ]; do shift; done
port=$(printf '%s' "$2" | sed -n "s/.*'PMI_PORT=\([^']*\)'.*/\1/p")
id=$(printf '%s' "$2" | sed -n "s/.*'PMI_ID=\([^']*\)'.*/\1/p")
if [ -n "$port" ] && exec {fd}<>"/dev/tcp/${port%:*}/${port##*:}"; then
    IFS= read -r -t 5 line <&$fd
    echo "intruder got: $line" >&2
    echo "cmd=initack pmiid=$id" >&$fd
    IFS= read -r -t 5 line <&$fd
    echo "intruder got: $line" >&2
    exec {fd}>&-
fi
exec env -i PATH="$PATH" HOME="$HOME" setsid -w sh -c "$2"
"#;

/// The lines of udrun's stderr that name a refused connection.
fn refusal_lines(run: &Run) -> Vec<&str> {
    run.stderr
        .lines()
        .filter(|l| l.starts_with("udrun: ignored a PMI_PORT connection: "))
        .collect()
}

/// udrun's summary of refused connections.
fn refusal_summary(run: &Run) -> &str {
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("udrun: refused "))
        .collect();
    assert_eq!(lines.len(), 1, "{run:#?}");
    lines[0]
}

/// How many ranks wrote `line`: those of its "[ranks 0-1,3] " prefix when
/// udrun merged the same line from several ranks, else one.
fn ranks_of_line(line: &str) -> usize {
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

#[test]
fn an_intruder_without_the_secret_is_refused_and_the_real_ranks_join() {
    let dir = scratch("intruder");
    let ssh = script_file(&dir, "intruder-ssh", INTRUDER_SSH);
    let run = run_script(&remote_args(&ssh, &[]), &pmi_rank("", ""));
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_all_saw(&run, 3);
    // Each of the two intruders (one per remote rank, claiming its id) was
    // challenged and refused before the real rank connected.
    // udrun prints a line that several ranks wrote at once as one
    // "[ranks 1-2] ..." line: count it once per rank.
    let got: Vec<&str> = run
        .stderr
        .lines()
        .flat_map(|l| {
            let got = l.split_once("intruder got: ").map(|(_, got)| got);
            std::iter::repeat_n(got, ranks_of_line(l)).flatten()
        })
        .collect();
    assert_eq!(got.len(), 4, "{run:#?}");
    assert_eq!(
        got.iter()
            .filter(|l| l.starts_with("cmd=challenge nonce="))
            .count(),
        2,
        "{run:#?}"
    );
    assert_eq!(
        got.iter()
            .filter(|l| **l == "cmd=initack rc=-1 msg=authentication_failed")
            .count(),
        2,
        "{run:#?}"
    );
    let refusals = refusal_lines(&run);
    assert_eq!(refusals.len(), 2, "{run:#?}");
    assert!(
        refusals.iter().all(|l| l.contains("127.0.0.1:")),
        "{run:#?}"
    );
    assert_eq!(
        refusal_summary(&run),
        "udrun: refused 2 PMI_PORT connections: 2 failed the handshake",
        "{run:#?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_replayed_handshake_and_a_second_claim_are_refused() {
    let dir = scratch("replay");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // After the barrier, the remote rank replays its own initack on a new
    // connection, then claims its rank again with a valid proof.
    let after = format!(
        r#"if [ -n "${{PMI_PORT:-}}" ]; then
    exec {{r}}<>"/dev/tcp/${{PMI_PORT%:*}}/${{PMI_PORT##*:}}" || die "replay connect"
    IFS= read -r -t 5 l <&$r
    echo "$hello" >&$r
    IFS= read -r -t 5 l <&$r
    echo "replay: $l"
    exec {{r}}>&-
    exec {{c}}<>"/dev/tcp/${{PMI_PORT%:*}}/${{PMI_PORT##*:}}" || die "claim connect"
    IFS= read -r -t 5 l <&$c
    p=$(UDRUN_TEST_NONCE=${{l#cmd=challenge nonce=}} {proof})
    echo "cmd=initack pmiid=$PMI_ID proof=$p" >&$c
    IFS= read -r -t 5 l <&$c
    echo "claim: $l"
    exec {{c}}>&-
fi"#,
        proof = proof_command()
    );
    let run = run_script(
        &[
            "-n",
            "2",
            "--host",
            "localhost,node",
            "--launcher-exec",
            ssh.to_str().unwrap(),
        ],
        &pmi_rank("", &after),
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_all_saw(&run, 2);
    for line in [
        "replay: cmd=initack rc=-1 msg=authentication_failed",
        "claim: cmd=initack rc=-1 msg=pmiid_refused",
    ] {
        assert!(run.stdout.lines().any(|l| l == line), "{line}: {run:#?}");
    }
    assert_eq!(refusal_lines(&run).len(), 2, "{run:#?}");
    assert_eq!(
        refusal_summary(&run),
        "udrun: refused 2 PMI_PORT connections: 1 failed the handshake, \
         1 claimed a rank already connected",
        "{run:#?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `Threads` and `VmRSS` (KiB) of process `pid`.
fn threads_and_rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("Threads:"), field("VmRSS:"))
}

/// Every process's command line, as (pid, bytes).
fn command_lines() -> Vec<(u32, Vec<u8>)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, std::fs::read(format!("/proc/{pid}/cmdline")).ok()?)))
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn no_secret_on_any_command_line_and_junk_connections_leave_udrun_bounded() {
    let dir = scratch("flood");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    let flag = dir.join("go");
    // The remote rank tells where it is and what it holds, then waits
    // (outside the barrier) for the flood to be over.
    let before = format!(
        r#"if [ -n "${{PMI_PORT:-}}" ]; then
    echo "remote $$ $PMI_PORT $UDBTL_PMI_SECRET $UDBTL_JOB_KEY"
    while [ ! -e '{}' ]; do sleep 0.05; done
fi"#,
        flag.display()
    );
    let mut cmd = udrun(&[
        "-n",
        "2",
        "--host",
        "localhost,node",
        "--launcher-exec",
        ssh.to_str().unwrap(),
    ]);
    cmd.args(["bash", "-c", &pmi_rank(&before, "")]);
    let mut udrun = Udrun::start(cmd);
    let udrun_pid = udrun.child.id();
    let stderr = collect(udrun.child.stderr.take().unwrap());
    let (lines_tx, lines) = mpsc::channel();
    let stdout = BufReader::new(udrun.child.stdout.take().unwrap());
    thread::spawn(move || {
        for line in stdout.lines() {
            let _ = lines_tx.send(line.unwrap());
        }
    });
    let remote = loop {
        let line = lines
            .recv_timeout(LIMIT)
            .expect("no line from the remote rank");
        if let Some(rest) = line.strip_prefix("remote ") {
            break rest.to_owned();
        }
    };
    let words: Vec<&str> = remote.split(' ').collect();
    let [rank_pid, port, secret, key] = words[..] else {
        panic!("{remote}");
    };
    let rank_pid: u32 = rank_pid.parse().unwrap();
    assert_eq!(secret.len(), 64, "{remote}");
    assert!(key.parse::<u32>().is_ok_and(|k| k != 0), "{remote}");

    // The secret is in the rank's environment, and on no command line: not
    // the launcher's, not the remote shell's, not the rank's.
    let environ = std::fs::read(format!("/proc/{rank_pid}/environ")).unwrap();
    assert!(
        contains(&environ, format!("UDBTL_PMI_SECRET={secret}").as_bytes()),
        "the rank's environment lacks the secret"
    );
    let lines_now = command_lines();
    // The fake launcher has become `setsid -w sh -c COMMAND` and the shell
    // that runs COMMAND (ssh and the remote login shell).
    let remote_command = format!("PMI_PORT={port}");
    let launchers: Vec<&(u32, Vec<u8>)> = lines_now
        .iter()
        .filter(|(_, line)| contains(line, remote_command.as_bytes()))
        .collect();
    assert!(
        launchers.len() >= 2,
        "the remote command's processes not found"
    );
    for (pid, line) in launchers {
        assert!(
            !contains(line, format!("JOB_KEY={key}").as_bytes()),
            "job key on {pid}'s command line"
        );
        assert!(contains(line, b"read -r UDBTL_PMI_SECRET"));
    }
    assert!(lines_now.iter().any(|(pid, _)| *pid == rank_pid));
    for (pid, line) in &lines_now {
        assert!(
            !contains(line, secret.as_bytes()),
            "process {pid} has the secret on its command line"
        );
    }

    // 1000 junk connections: oversized lines, garbage, nothing, 100 at a
    // time held open together.
    let (threads_before, rss_before) = threads_and_rss(udrun_pid);
    let addr = port.replacen(&port[..port.rfind(':').unwrap()], "127.0.0.1", 1);
    let big = vec![b'x'; 100 * 1024];
    let mut connected = 0;
    let (mut threads_max, mut rss_max) = (threads_before, rss_before);
    for batch in 0..10 {
        let mut held = Vec::new();
        for i in 0..100 {
            let Ok(mut conn) = std::net::TcpStream::connect(&addr) else {
                continue;
            };
            connected += 1;
            conn.set_write_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let _ = match (batch + i) % 3 {
                0 => std::io::Write::write_all(&mut conn, &big),
                1 => std::io::Write::write_all(&mut conn, b"GET / HTTP/1.0\r\n\r\n"),
                _ => Ok(()),
            };
            held.push(conn);
        }
        let (threads, rss) = threads_and_rss(udrun_pid);
        threads_max = threads_max.max(threads);
        rss_max = rss_max.max(rss);
        drop(held);
    }
    eprintln!(
        "{connected} junk connections: udrun's threads {threads_before} -> at most \
         {threads_max}, RSS {rss_before} -> at most {rss_max} KiB"
    );
    assert!(connected >= 500, "only {connected} connections made it");
    let cap = 64; // udbtl_pmi::server::DEFAULT_MAX_HANDSHAKES
    // A handshake thread gives its slot back before it has exited, so on a
    // loaded machine a few finished ones are still counted beside the cap's
    // worth of live ones (83 from 12 seen with two runs at once). Twice the
    // cap still shows what matters: no thread per connection (1000).
    assert!(
        threads_max <= threads_before + 2 * cap,
        "udrun went from {threads_before} to {threads_max} threads"
    );
    assert!(
        rss_max <= rss_before + 64 * 1024,
        "udrun's RSS went from {rss_before} to {rss_max} KiB"
    );

    std::fs::write(&flag, b"").unwrap();
    let (code, _) = udrun.wait();
    let stderr = stderr.join().unwrap();
    let stdout: Vec<String> = lines.try_iter().collect();
    let run = Run {
        code,
        stdout: stdout.join("\n"),
        stderr,
        elapsed: Duration::ZERO,
    };
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert!(
        run.stdout.lines().any(|l| l == "rank 0 saw 2") && remote.len() > 64,
        "{run:#?}"
    );
    // A few are named, the rest counted.
    assert_eq!(refusal_lines(&run).len(), 3, "{run:#?}");
    let summary = refusal_summary(&run);
    assert!(summary.contains("not shown above"), "{run:#?}");
    let total: u64 = summary
        .strip_prefix("udrun: refused ")
        .and_then(|s| s.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(total >= 500, "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_remote_rank_that_never_connects_ends_the_job_at_the_startup_timeout() {
    let dir = scratch("startup");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    let script = format!(
        "[ -n \"${{PMI_PORT:-}}\" ] && exec sleep 1000\n{}",
        pmi_rank("", "")
    );
    let run = run_script(&remote_args(&ssh, &["--startup-timeout", "1"]), &script);
    assert_fails(
        &run,
        1,
        &[
            "rank 1 (host node, fake-ssh pid ",
            "did not connect to PMI within --startup-timeout 1 s (nor did 1 other rank); \
             killing the job",
        ],
    );
    assert!(run.elapsed < NOT_WAITED_OUT, "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn stdin_goes_to_local_rank_0_and_the_secrets_line_is_not_seen_as_stdin() {
    let dir = scratch("stdin-remote");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // Rank 0 here reads udrun's stdin; the remote ranks read /dev/null
    // (their launcher's stdin, after the secrets line, is the watcher's).
    let cmd = udrun(&remote_args(
        &ssh,
        &[
            "sh",
            "-c",
            r#"r=${PMI_RANK:-r$PMI_ID}; while read -r l; do echo "$r:$l"; done; echo "$r:eof:${#UDBTL_PMI_SECRET}""#,
        ],
    ));
    let run = run_with_stdin(cmd, b"a\nb\n");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let stdout = &run.stdout;
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    // Every rank has all 64 hex digits of the secret (authenticated
    // datagrams key from it): local rank 0 in its environment, the remote
    // ones from the secrets line.
    assert_eq!(
        lines,
        ["0:a", "0:b", "0:eof:64", "r1:eof:64", "r2:eof:64"],
        "{stdout}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn pmi_is_served_on_the_advertised_address_unless_pmi_listen_any() {
    let dir = scratch("listen");
    let ssh = script_file(&dir, "fake-ssh", FAKE_SSH);
    // The remote rank finds udrun's listening socket in /proc/net/tcp.
    let script = r#"p=$(printf '%04X' "${PMI_PORT##*:}")
awk -v p=":$p" '$4 == "0A" && substr($2, length($2) - 4) == p { print "listen " $2 }' /proc/net/tcp"#;
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let advertised = std::net::ToSocketAddrs::to_socket_addrs(&(this_host.trim(), 0))
        .unwrap()
        .find(std::net::SocketAddr::is_ipv4);
    for (any, expected) in [(false, advertised), (true, Some(([0, 0, 0, 0], 0).into()))] {
        let mut args = vec!["-n", "1", "--host", "node", "--launcher-exec"];
        args.push(ssh.to_str().unwrap());
        if any {
            args.push("--pmi-listen-any");
        }
        args.extend(["bash", "-c", script]);
        let run = launch(&args);
        assert_eq!(run.code, Some(0), "{run:#?}");
        let Some(std::net::SocketAddr::V4(expected)) = expected else {
            // This host's name resolves to IPv6 only: not checked here.
            continue;
        };
        // /proc/net/tcp shows the address as a little-endian u32 in hex.
        let hex = format!("{:08X}:", u32::from_le_bytes(expected.ip().octets()));
        let listen: Vec<&str> = run
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("listen "))
            .collect();
        assert_eq!(listen.len(), 1, "{run:#?}");
        assert!(listen[0].starts_with(&hex), "{hex}: {run:#?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
