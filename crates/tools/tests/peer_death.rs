//! Peer death (issue 11, item 6): one of 4 ranks of an all-to-all transfer
//! dies in the middle of it, and nothing hangs. Two paths, tested apart:
//!
//! * udrun's: rank 3 itself is killed with SIGKILL. udrun sees its child
//!   die, names it (`rank 3 (pid P) killed by signal 9 (SIGKILL)`), kills
//!   the others at once and exits 137, before the transport could notice.
//! * the transport's: rank 3's `udstress` runs under a shell that outlives
//!   it, so udrun sees no death and the rank's PMI connection stays open;
//!   the process is gone (SIGKILL) or silent (SIGSTOP). The survivors must
//!   declare it lost within `peer_timeout` and name it (`rank 3 lost`),
//!   after which udrun ends the job on their failure.
//!
//! Each run prints the time from the signal to udrun's report and to its
//! exit (or to the first survivor's error). `PEER_DEATH_RUNS=N` repeats
//! each case N times to measure them; the times are reported, never
//! asserted: only "nothing hangs" is (udrun ends within [`LIMIT`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::ExitStatus;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

#[path = "../../../tests/support/udrun_jobs.rs"]
mod common;

/// A run that takes longer than this hangs, and fails its test.
const LIMIT: Duration = Duration::from_secs(60);
/// The survivors' `UDBTL_PEER_TIMEOUT`, in ms.
const PEER_TIMEOUT_MS: u64 = 1000;
/// The rank that dies, unless a test says otherwise.
const VICTIM: u32 = 3;

/// How rank [`VICTIM`] dies, and who sees it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// The rank, udrun's child, gets SIGKILL: udrun's path.
    RankKilled,
    /// The rank's `udstress`, under a shell that stays, gets SIGKILL: the
    /// transport's path.
    ProgramKilled,
    /// The rank's `udstress`, under a shell that stays, gets SIGSTOP.
    ProgramStopped,
}

/// A line of udrun's output and when the test read it.
#[derive(Debug)]
struct Line {
    at: Instant,
    text: String,
}

/// What one run left.
#[derive(Debug)]
struct Run {
    status: ExitStatus,
    lines: Vec<Line>,
    signalled: Instant,
    ended: Instant,
}

impl Run {
    fn text(&self) -> String {
        self.lines.iter().map(|l| format!("{}\n", l.text)).collect()
    }

    /// The first line after the signal that holds `needle`.
    fn first(&self, needle: &str) -> Option<&Line> {
        self.lines
            .iter()
            .find(|l| l.at >= self.signalled && l.text.contains(needle))
    }

    fn since_signal(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.signalled)
    }
}

/// Reads `pipe` line by line onto `lines`, each stamped when read.
fn read_lines(pipe: impl Read + Send + 'static, lines: mpsc::Sender<Line>) {
    thread::spawn(move || {
        for text in BufReader::new(pipe).lines() {
            let Ok(text) = text else { return };
            if lines
                .send(Line {
                    at: Instant::now(),
                    text,
                })
                .is_err()
            {
                return;
            }
        }
    });
}

/// `udrun` and every process below it.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut next = vec![pid];
    while let Some(pid) = next.pop() {
        for child in common::children(pid) {
            all.push(child);
            next.push(child);
        }
    }
    all
}

/// The `udstress` process of `rank` below udrun `pid`, if it runs yet.
fn udstress_of_rank(pid: u32, rank: u32) -> Option<u32> {
    let needle = format!("PMI_RANK={rank}");
    descendants(pid).into_iter().find(|p| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "udstress")
            && std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
    })
}

/// Runs 4 ranks of an all-to-all far longer than the test (with `UDBTL_*`
/// variables `env` besides the peer timeout), kills rank `victim` as
/// `death` says once every rank is sending, and waits for udrun's end
/// (interrupting it after [`LIMIT`]).
fn run(death: Death, victim: u32, env: &[(&str, &str)]) -> Run {
    let udstress = env!("CARGO_BIN_EXE_udstress");
    let program = [
        udstress,
        "alltoall",
        "--messages",
        "100000000",
        "--timeout",
        "120",
        "--verbose",
    ];
    let mut args = vec!["-n", "4"];
    // A rank that dies of a signal stays, as a shell, until udrun kills
    // it: udrun sees no death, only the survivors' errors.
    let shell = r#""$@"; status=$?; [ $status -gt 128 ] && sleep 100; exit $status"#;
    if death != Death::RankKilled {
        args.extend(["bash", "-c", shell, "rank"]);
    }
    args.extend(program);
    let timeout = PEER_TIMEOUT_MS.to_string();
    let mut env = env.to_vec();
    env.push(("UDBTL_PEER_TIMEOUT", &timeout));
    let mut child = common::start(&args, &env);
    let udrun = child.id();
    let (tx, rx) = mpsc::channel();
    read_lines(child.stdout.take().unwrap(), tx.clone());
    read_lines(child.stderr.take().unwrap(), tx);

    let started = Instant::now();
    let mut lines = Vec::new();
    let mut sending = 0;
    // Every rank says "sending" after the first barrier; then the transfer
    // runs for a while before the victim dies.
    while sending < 4 {
        let line = rx
            .recv_timeout(LIMIT.saturating_sub(started.elapsed()))
            .unwrap_or_else(|_| panic!("the ranks did not all start sending: {lines:#?}"));
        if line.text.contains(": sending") {
            sending += 1;
        }
        lines.push(line);
    }
    thread::sleep(Duration::from_millis(500));
    let pid = match death {
        Death::RankKilled => udstress_of_rank(udrun, victim)
            .filter(|p| common::children(udrun).contains(p))
            .expect("the victim is udrun's child"),
        _ => udstress_of_rank(udrun, victim).expect("the victim's udstress runs"),
    };
    let signal = if death == Death::ProgramStopped {
        Signal::STOP
    } else {
        Signal::KILL
    };
    // Stamped before the signal goes: what follows it can be read at once.
    let signalled = Instant::now();
    kill_process(Pid::from_raw(pid.try_into().unwrap()).unwrap(), signal).unwrap();

    // Wait for udrun, interrupting the job (and continuing a stopped
    // victim) should it hang.
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > LIMIT {
            for pid in descendants(udrun) {
                common::signal(pid, "KILL");
            }
            common::signal(udrun, "KILL");
            let _ = child.wait();
            let lines: Vec<String> = lines
                .into_iter()
                .chain(rx.try_iter())
                .map(|l| l.text)
                .collect();
            panic!("udrun did not end within {LIMIT:?} after {death:?}: {lines:#?}");
        }
        thread::sleep(Duration::from_millis(5));
    };
    let ended = Instant::now();
    // The pipes close once udrun and its ranks are gone.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        lines.push(line);
    }
    Run {
        status,
        lines,
        signalled,
        ended,
    }
}

/// How many runs of each case: `PEER_DEATH_RUNS`, 1 by default.
fn runs() -> usize {
    std::env::var("PEER_DEATH_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

#[test]
fn udrun_reports_a_rank_killed_mid_transfer_and_ends_the_job() {
    for i in 0..runs() {
        let run = run(Death::RankKilled, VICTIM, &[]);
        let text = run.text();
        assert_eq!(run.status.code(), Some(137), "{text}");
        let report = run
            .first("udrun: rank 3 (pid ")
            .unwrap_or_else(|| panic!("udrun names rank 3: {text}"));
        assert!(
            report
                .text
                .contains("killed by signal 9 (SIGKILL); killing the job"),
            "{text}"
        );
        // Only the first failure is reported: the survivors udrun killed
        // are not.
        assert_eq!(text.matches("udrun: ").count(), 1, "{text}");
        eprintln!(
            "peer death, rank killed, run {}: udrun reported it after {}, exited after {}",
            i + 1,
            ms(run.since_signal(report.at)),
            ms(run.since_signal(run.ended))
        );
    }
}

/// Checks runs where the transport had to find the death of `victim`: a
/// survivor names it as lost, by its rank, and udrun ends the job on that
/// survivor's failure.
fn survivors_declare_lost(death: Death, victim: u32, env: &[(&str, &str)]) {
    for i in 0..runs() {
        let run = run(death, victim, env);
        let text = run.text();
        assert_eq!(run.status.code(), Some(1), "{text}");
        // "udstress: messages were lost: rank R: rank V lost (endpoint V
        // was declared lost: ...)", or "rank V (endpoint E) lost (...)"
        // when the transport numbers it otherwise.
        let named = [
            format!("rank {victim} lost ("),
            format!("rank {victim} (endpoint "),
        ];
        let lost = run
            .lines
            .iter()
            .find(|l| l.at >= run.signalled && named.iter().any(|n| l.text.contains(n.as_str())))
            .unwrap_or_else(|| panic!("a survivor names rank {victim} as lost: {text}"));
        let survivor = lost
            .text
            .strip_prefix("udstress: messages were lost: rank ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|r| r.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("a survivor's error: {text}"));
        assert_ne!(survivor, victim, "{text}");
        assert!(
            lost.text
                .contains("nothing heard from it within peer_timeout"),
            "{text}"
        );
        // No survivor declares another survivor lost.
        for other in (0..4).filter(|r| *r != victim) {
            assert!(!text.contains(&format!("rank {other} lost")), "{text}");
            assert!(!text.contains(&format!("rank {other} (endpoint")), "{text}");
        }
        let report = run
            .first("udrun: rank ")
            .unwrap_or_else(|| panic!("udrun reports the failure: {text}"));
        assert!(
            report.text.contains("exited with code 1; killing the job"),
            "{text}"
        );
        eprintln!(
            "peer death, {death:?} {env:?}, run {}: rank {survivor} declared rank {victim} lost \
             after {} (peer_timeout {PEER_TIMEOUT_MS} ms), udrun exited after {}",
            i + 1,
            ms(run.since_signal(lost.at)),
            ms(run.since_signal(run.ended))
        );
        eprintln!("    {}", lost.text);
    }
}

#[test]
fn survivors_declare_a_killed_peer_lost_naming_its_rank() {
    survivors_declare_lost(Death::ProgramKilled, VICTIM, &[]);
}

#[test]
fn survivors_declare_a_stopped_peer_lost_naming_its_rank() {
    survivors_declare_lost(Death::ProgramStopped, VICTIM, &[]);
}

/// With addresses fetched lazily, endpoints are numbered in order of first
/// use, not by rank: the survivors still name the rank.
#[test]
fn survivors_name_the_rank_of_a_lazily_connected_peer() {
    survivors_declare_lost(Death::ProgramKilled, 0, &[("UDBTL_MODEX", "lazy")]);
}
