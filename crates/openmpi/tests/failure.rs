//! A rank that dies or stops answering in the middle of large transfers over
//! udbtl must end the job with an error naming it, within the peer timeout
//! plus a margin, and leave no process behind.
//!
//! Killing a rank tests little of the component: mpirun sees its child die
//! and aborts the job by itself. Stopping it (SIGSTOP) is the real test:
//! nothing but the survivor's udbtl can notice a peer that is alive but
//! silent, and a transport without a peer timeout (the tcp BTL) waits
//! forever.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::Run;

/// Short, so that the test is fast; the component's default is 30 s.
const PEER_TIMEOUT_MS: u64 = 2000;
/// How long after the signal the job may take to end: the peer timeout,
/// one retransmission timeout, Open MPI's abort and a loaded machine.
const END_LIMIT: Duration = Duration::from_secs(60);
/// How long the job may take to start and move the first messages.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Rounds (of one message to each peer) to see before the signal, so that
/// it lands in the middle of a stream rather than during startup.
const ROUNDS_FIRST: u64 = 4;
/// How long processes may take to go away after mpirun has exited.
const GRACE: Duration = Duration::from_secs(5);
/// The rank usually killed or stopped: it only receives, so the sender
/// (rank 0) always has data waiting for it when it goes silent.
const RECEIVER: u32 = 1;
/// The rank that only sends.
const SENDER: u32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `kill -9`: mpirun sees the process die.
    Kill,
    /// `kill -STOP`: only the peers' transport can tell.
    Stop,
}

impl Fault {
    const fn signal(self) -> &'static str {
        match self {
            Self::Kill => "-KILL",
            Self::Stop => "-STOP",
        }
    }
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn killed_rank_ends_the_job() {
    require_openmpi!();
    let outcome = inject(Fault::Kill, 3, RECEIVER);
    // Either Open MPI's own notice ("process rank 1 ... exited on signal 9")
    // or the component's report names the victim.
    let line = naming_line(&outcome.text(), RECEIVER, outcome.victim_pid, false);
    assert!(line.is_some(), "the output does not name rank {RECEIVER}");
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn stopped_rank_is_declared_lost() {
    require_openmpi!();
    stopped(2, RECEIVER);
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn stopped_rank_among_three_is_declared_lost() {
    require_openmpi!();
    stopped(3, RECEIVER);
}

/// The survivor only waits to receive from the stopped rank, often with
/// nothing outstanding: only udbtl's keepalive watch on a recently active
/// peer notices it (without it the job hung in 2 of 3 runs).
#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn stopped_sender_is_declared_lost() {
    require_openmpi!();
    stopped(2, SENDER);
}

fn stopped(np: u32, victim: u32) {
    let outcome = inject(Fault::Stop, np, victim);
    let line = naming_line(&outcome.text(), victim, outcome.victim_pid, true);
    assert!(
        line.is_some(),
        "no udbtl message names the stopped rank {victim} (pid {})",
        outcome.victim_pid
    );
    // Declared lost before the timeout would mean a live peer can be lost
    // too; allow for coarse timers (a tenth of the timeout).
    assert!(
        outcome.after_signal >= Duration::from_millis(PEER_TIMEOUT_MS * 9 / 10),
        "the job ended {:?} after the stop, before the {PEER_TIMEOUT_MS} ms peer timeout",
        outcome.after_signal
    );
}

/// What a job did after the fault.
#[derive(Debug)]
struct Outcome {
    stdout: String,
    stderr: String,
    victim_pid: u32,
    after_signal: Duration,
}

impl Outcome {
    fn text(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Starts a streaming job of `np` ranks, waits until data flows, applies
/// `fault` to rank `victim`, and checks that the job ends non-zero within
/// [`END_LIMIT`] and leaves nothing running. Panics (after cleaning up) if
/// not.
fn inject(fault: Fault, np: u32, victim: u32) -> Outcome {
    // One job at a time: the tests find their processes by command line and
    // measure time, and two 8 MiB streams on two vCPUs would slow each other.
    let _serial = common::serial();
    let exe = common::program("failure_transfer");
    let tag = format!("{fault:?}-np{np}-r{victim}-{}", std::process::id()).to_lowercase();
    // The program streams for longer than the test waits: ending cleanly
    // would itself be a failure to notice.
    let mut run = Run::udbtl(np).mca("btl_udbtl_peer_timeout", &PEER_TIMEOUT_MS.to_string());
    run.limit = Duration::from_secs(600);
    let mut job = Job::start(&run, &exe, &tag);

    // Wait for every rank's pid and a few rounds of data.
    let started = Instant::now();
    let mut pids = vec![None; np as usize];
    let mut rounds = 0;
    while pids.iter().any(Option::is_none) || rounds < ROUNDS_FIRST {
        let Some(left) = START_LIMIT.checked_sub(started.elapsed()) else {
            job.fail(&format!("no {ROUNDS_FIRST} rounds within {START_LIMIT:?}"));
        };
        match job.lines.recv_timeout(left) {
            Ok(line) => {
                let mut words = line.split_whitespace();
                match (words.next(), words.next(), words.next()) {
                    (Some("PID"), Some(rank), Some(pid)) => {
                        let rank: usize = rank.parse().expect("rank after PID");
                        pids[rank] = Some(pid.parse::<u32>().expect("pid after the rank"));
                    }
                    (Some("ROUND"), Some(n), None) => rounds = n.parse().expect("round number"),
                    _ => {}
                }
                job.stdout.push(line);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => job.fail("the job ended before the fault"),
        }
    }
    let victim_pid = pids[victim as usize].expect("victim pid");
    job.victim = Some(victim_pid);
    eprintln!(
        "{tag}: {rounds} rounds after {:?}; kill {} rank {victim} (pid {victim_pid})",
        started.elapsed(),
        fault.signal()
    );
    signal(fault.signal(), victim_pid);
    let signalled = Instant::now();

    let Some(status) = job.wait_until(signalled + END_LIMIT) else {
        job.fail(&format!(
            "the job still ran {END_LIMIT:?} after the {fault:?}"
        ));
    };
    let after_signal = signalled.elapsed();
    let (stdout, stderr) = job.output();
    let left = job.leftovers();
    print_output(&stdout, &stderr);
    eprintln!("{tag}: mpirun exited ({status}) {after_signal:?} after the {fault:?}");
    assert!(
        left.is_empty(),
        "processes of the job were still running {GRACE:?} after mpirun exited: {left:?}"
    );
    assert!(
        !status.success(),
        "the job succeeded although rank {victim} was lost"
    );
    Outcome {
        stdout,
        stderr,
        victim_pid,
        after_signal,
    }
}

/// A running `mpirun` with its output read as it comes. Dropping it kills
/// whatever is left of the job.
struct Job {
    child: Child,
    /// The program and its first argument: on the command line of mpirun and
    /// of every rank of this job, and of no other process.
    pattern: String,
    /// mpirun's stdout, line by line.
    lines: Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<JoinHandle<String>>,
    /// The stopped rank, to let go of when cleaning up.
    victim: Option<u32>,
}

impl Job {
    fn start(run: &Run, exe: &Path, tag: &str) -> Self {
        let mut child = run
            .command(exe, &[tag, "3000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mpirun");
        let (send, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        let stderr = thread::spawn(move || {
            let mut text = Vec::new();
            let _ = stderr.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        });
        Self {
            child,
            pattern: format!("{} {tag}", exe.display()),
            lines,
            stdout: Vec::new(),
            stderr: Some(stderr),
            victim: None,
        }
    }

    /// Keeps the output flowing until mpirun exits or `deadline` passes.
    fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for mpirun") {
                return Some(status);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(line) => self.stdout.push(line),
                Err(RecvTimeoutError::Timeout) => {}
                // stdout closed: mpirun is about to exit; just poll.
                Err(RecvTimeoutError::Disconnected) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Everything mpirun printed; call after it exited.
    fn output(&mut self) -> (String, String) {
        self.stdout.extend(self.lines.iter());
        let stderr = self
            .stderr
            .take()
            .map(|h| h.join().expect("stderr reader"))
            .unwrap_or_default();
        (self.stdout.join("\n"), stderr)
    }

    /// Processes of this job still alive after [`GRACE`], killed (and
    /// returned) if there are any.
    fn leftovers(&self) -> Vec<(u32, String)> {
        let until = Instant::now() + GRACE;
        let mut left = self.processes();
        while !left.is_empty() && Instant::now() < until {
            thread::sleep(Duration::from_millis(100));
            left = self.processes();
        }
        self.kill_all();
        left
    }

    /// Pids and command lines of this job's processes.
    fn processes(&self) -> Vec<(u32, String)> {
        let out = Command::new("pgrep")
            .args(["-a", "-f", "--"])
            .arg(&self.pattern)
            .output()
            .expect("run pgrep");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (pid, cmd) = line.split_once(' ')?;
                Some((pid.parse().ok()?, cmd.to_owned()))
            })
            .collect()
    }

    /// Kills every process of the job, the stopped one too.
    fn kill_all(&self) {
        for (pid, _) in self.processes() {
            signal("-KILL", pid);
        }
        // A stopped process dies of SIGKILL too; SIGCONT is for the case it
        // was already gone from the list while still stopped.
        if let Some(pid) = self.victim {
            signal("-CONT", pid);
        }
    }

    /// Cleans up, prints what the job said, and fails the test.
    fn fail(&mut self, why: &str) -> ! {
        // timeout(1) passes SIGTERM on to mpirun, which ends its ranks.
        signal("-TERM", self.child.id());
        let _ = self.wait_until(Instant::now() + Duration::from_secs(10));
        self.kill_all();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (stdout, stderr) = self.output();
        print_output(&stdout, &stderr);
        panic!("{why}");
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if thread::panicking() {
            self.kill_all();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `kill SIGNAL pid`; a process already gone is not an error here.
fn signal(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Shows the job's output in the test log, one progress line in 100.
fn print_output(stdout: &str, stderr: &str) {
    let mut rounds = 0;
    println!("--- mpirun stdout");
    for line in stdout.lines() {
        if line.starts_with("ROUND ") {
            rounds += 1;
            if rounds % 100 != 1 {
                continue;
            }
        }
        println!("{line}");
    }
    println!("--- mpirun stderr\n{stderr}---");
}

/// The first line that names rank `victim` (or its `pid`) as the failed
/// peer. With `from_udbtl`, only a message of the component counts: a line
/// that mentions udbtl and a loss, naming the peer on that line or within the
/// next few (Open MPI's help messages span several lines).
fn naming_line(text: &str, victim: u32, pid: u32, from_udbtl: bool) -> Option<String> {
    let names = |line: &str| {
        let line = line.to_lowercase();
        let words = [
            format!("rank {victim}"),
            format!("rank={victim}"),
            format!("rank: {victim}"),
            format!("rank {victim}:"),
            format!("peer {victim}"),
            format!("peer={victim}"),
            format!("],{victim}]"),
            format!("pid {pid}"),
            format!("pid={pid}"),
            format!("pid: {pid}"),
        ];
        words.iter().any(|w| {
            line.match_indices(w.as_str()).any(|(at, _)| {
                // "rank 1" must not match "rank 12".
                !line[at + w.len()..].starts_with(|c: char| c.is_ascii_digit())
            })
        })
    };
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if from_udbtl {
            let lower = line.to_lowercase();
            let about_loss = [
                "lost",
                "unreachable",
                "timeout",
                "timed out",
                "not respond",
                "no answer",
            ]
            .iter()
            .any(|w| lower.contains(w));
            if lower.contains("udbtl") && about_loss {
                if let Some(hit) = lines[i..lines.len().min(i + 12)].iter().find(|l| names(l)) {
                    return Some(format!("{line} / {hit}"));
                }
            }
        } else if names(line) {
            return Some((*line).to_owned());
        }
    }
    None
}
