//! The job's supervisor: every rank's state, and what each event does to
//! the job, on the main thread alone.
//!
//! Everything that happens arrives on one channel as an [`Event`] and is
//! handled by the main thread alone, in [`Job`]: exits (from the reaper
//! thread), PMI events (from the server, through a forwarding thread),
//! signals (from signal-hook's thread) and the ends of output pipes. Each
//! event costs O(1) except the few that kill the job (one pass over the
//! ranks each); deadlines are kept in FIFO order (they all have the same
//! length) so the loop never scans the ranks.
//!
//! # Reaping
//!
//! udrun makes itself a child subreaper, so that whatever a rank leaves
//! behind when it dies is re-parented to udrun instead of init. Once every
//! rank is spawned, one reaper thread waits for any child and reaps it at
//! once: ranks are reported, re-parented descendants are just reaped. (No
//! process may be reaped while `Command::spawn` runs, which is why the
//! reaper starts after the last spawn; a rank that exits earlier stays a
//! zombie until then.)
//!
//! When the job ends, every rank's process group is signalled, also those
//! whose leader was reaped long ago (what the rank started may live on).
//! The kernel does not reuse the number of a group that still has members;
//! once it is empty, the signal can only reach another process if that
//! number was reused by a process that leads a group of its own, the risk
//! every launcher that signals process groups accepts.
//!
//! # Last words before the verdict
//!
//! A failed rank's line (`rank 0 (pid 5) exited with code 1`) is printed
//! once everything the rank wrote is out: udrun waits for the end of its
//! output pipes (at most [`VERDICT_WAIT`], for pipes something it started
//! keeps open), then queues the line behind the stderr messages still
//! waiting to be merged (see [`crate::merge`]). The other ranks are killed
//! at once all the same.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::process::ChildStdin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use udbtl_pmi::ServerStats;

use crate::cli::Cli;
use crate::events::{Event, Status, exit_code_for_signal, signal_name};
use crate::hosts::Placement;
use crate::merge::Errors;
use crate::rank::Rank;
use crate::say;

mod pmi;

/// udrun's exit status when `--timeout` ends the job (as timeout(1)).
const TIMEOUT_EXIT: u8 = 124;

/// How long the ranks get between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long a rank's exit waits for the end of its PMI connection (to tell
/// an abort from a plain exit, and a finalized rank from one that was
/// not), and how long a rank may live on after losing that connection.
const PMI_WAIT: Duration = Duration::from_secs(1);
/// How long, once every rank is gone, udrun waits for the rest of their
/// output and for their left-over descendants to be reaped.
const DRAIN: Duration = Duration::from_secs(1);
/// How many refused PMI_PORT connections are named one by one; the rest
/// are counted in the summary at the end.
const REFUSALS_SHOWN: u64 = 3;
/// The longest a failed rank's verdict waits for the end of that rank's
/// output: its pipes stay open while something it started holds them, which
/// the SIGKILL at the end of the grace period ends.
const VERDICT_WAIT: Duration = Duration::from_secs(3);
/// SIGPIPE, whose 128 + N is udrun's status when its output is closed.
const SIGPIPE: i32 = 13;

/// Why the job is ending.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// A rank failed (or could not start, or `--timeout` passed): exit
    /// with this status.
    Failed(u8),
    /// udrun received this signal.
    Interrupted(i32),
    /// udrun's stdout (or stderr) was closed by its reader (`udrun ... |
    /// head`): like a writer in a shell pipeline, the job ends quietly,
    /// with the status of a death by SIGPIPE.
    OutputGone,
}

/// A failed rank's line, held back until that rank's output is all out.
#[derive(Debug)]
struct Verdict {
    rank: u32,
    line: String,
    /// When it is printed even if the output has not ended.
    by: Instant,
}

/// The main loop's state. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Job {
    size: u32,
    ranks: Vec<Rank>,
    /// Ranks spawned and not yet reaped.
    live: usize,
    /// Ranks whose exit waits to be judged.
    judging: usize,
    outputs_open: usize,
    no_children: bool,
    ending: Option<Ending>,
    /// When to send SIGKILL after SIGTERM.
    kill_at: Option<Instant>,
    killed: bool,
    /// (deadline, rank) of PMI waits, in deadline order.
    waits: VecDeque<(Instant, u32)>,
    /// When the first spawn started, with `--report-startup`.
    startup: Option<Instant>,
    reported: bool,
    /// The first rank known to use PMI: from then on, a rank that ends
    /// without PMI finalize fails the job.
    joined: Option<u32>,
    /// `--timeout`: when, and the option's value.
    deadline: Option<(Instant, Duration)>,
    /// `--startup-timeout`: when, and the option's value; `None` once
    /// checked.
    startup_check: Option<(Instant, Duration)>,
    /// PMI_PORT connections refused so far (events seen).
    refused: u64,
    /// `--launcher-exec`.
    launcher: OsString,
    /// The ranks' stderr messages waiting to be merged (none under
    /// `--tag-output`): a verdict is queued behind them.
    errors: Option<Arc<Errors>>,
    /// A failed rank's line, waiting for the end of its output.
    verdict: Option<Verdict>,
}

impl Job {
    /// A job as `cli` asks; `startup` is when the first spawn starts, with
    /// `--report-startup`; `errors` merges the ranks' stderr.
    pub(crate) fn new(cli: &Cli, startup: Option<Instant>, errors: Option<Arc<Errors>>) -> Self {
        let size = cli.ranks;
        Self {
            size,
            ranks: Vec::with_capacity(size as usize),
            live: 0,
            judging: 0,
            outputs_open: 0,
            no_children: false,
            ending: None,
            kill_at: None,
            killed: false,
            waits: VecDeque::new(),
            startup,
            reported: false,
            joined: None,
            deadline: cli.timeout.map(|t| (Instant::now() + t, t)),
            startup_check: Some((Instant::now() + cli.startup_timeout, cli.startup_timeout)),
            refused: 0,
            launcher: cli.launcher_exec.clone(),
            errors,
            verdict: None,
        }
    }

    pub(crate) fn add(
        &mut self,
        pid: u32,
        place: &Placement,
        spoke: Option<Arc<AtomicBool>>,
        stdin: Option<ChildStdin>,
    ) {
        self.ranks.push(Rank {
            pid,
            host: place.host.clone(),
            pmi_open: spoke.is_some(),
            connected: false,
            spoke,
            stdin,
            launcher: place.host.as_ref().map(|_| self.launcher.clone()),
            exit: None,
            finalized: false,
            disconnected: false,
            judging: false,
            outputs: 0,
        });
        self.live += 1;
    }

    /// One more output pipe of rank `r` is forwarded; the job waits for
    /// its end, and so does a verdict on the rank.
    pub(crate) fn output_opened(&mut self, r: u32) {
        self.outputs_open += 1;
        if let Some(rank) = self.ranks.get_mut(r as usize) {
            rank.outputs += 1;
        }
    }

    /// Whether the job is ending (a rank failed, a signal came).
    pub(crate) fn is_ending(&self) -> bool {
        self.ending.is_some()
    }

    /// Runs until every rank has ended and its output is drained.
    pub(crate) fn watch(&mut self, rx: &Receiver<Event>) {
        while self.live > 0 || self.judging > 0 {
            if !self.step(rx, None) {
                break;
            }
        }
        if self.ranks.is_empty() {
            self.say_verdict();
            return;
        }
        // Whatever is left in the ranks' process groups goes now, as at the
        // end of a Slurm job step.
        self.kill_groups(Signal::KILL);
        let deadline = Instant::now() + DRAIN;
        while self.outputs_open > 0 || !self.no_children {
            if Instant::now() >= deadline || !self.step(rx, Some(deadline)) {
                break;
            }
        }
        self.say_verdict();
    }

    /// Handles the next event or deadline, waiting at most until `until`.
    /// False when no event can come any more.
    fn step(&mut self, rx: &Receiver<Event>, until: Option<Instant>) -> bool {
        let next = [
            self.kill_at.filter(|_| !self.killed),
            self.waits.front().map(|w| w.0),
            self.deadline
                .filter(|_| self.ending.is_none())
                .map(|(at, _)| at),
            // Once passed, it is checked again when a rank first uses PMI.
            self.startup_check
                .map(|(at, _)| at)
                .filter(|&at| self.ending.is_none() && at > Instant::now()),
            self.verdict.as_ref().map(|v| v.by),
            until,
        ]
        .into_iter()
        .flatten()
        .min();
        let received = match next {
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(event) => self.handle(event),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return false,
        }
        self.tick(Instant::now());
        true
    }

    pub(crate) fn handle(&mut self, event: Event) {
        match event {
            Event::Exited { rank, status } => self.exited(rank, status),
            Event::Pmi(event) => self.pmi(event),
            Event::Spoke { rank } => self.joined_pmi(rank),
            Event::Signal(signal) => self.signal(signal),
            Event::OutputClosed { rank } => self.output_closed(rank),
            Event::OutputGone => self.output_gone(),
            Event::NoChildren => self.no_children = true,
        }
    }

    fn exited(&mut self, r: u32, status: Status) {
        let Some(rank) = self.ranks.get_mut(r as usize) else {
            return;
        };
        if rank.exit.is_some() {
            return;
        }
        rank.exit = Some(status);
        // Its abort, finalize or end of stream is probably on its way; but
        // a rank that exits 0 without having used PMI, in a job where no
        // rank has, is done (its socket may live on in a child it left
        // behind). A remote rank's finalize may still be on its way.
        let joined = self.joined.is_some();
        let wait = match rank.spoke {
            Some(_) => rank.pmi_open && (rank.spoke() || status != Status::Code(0) || joined),
            None => joined && status == Status::Code(0) && !rank.finalized,
        };
        rank.judging = wait;
        self.live -= 1;
        if wait {
            self.judging += 1;
            self.waits.push_back((Instant::now() + PMI_WAIT, r));
        } else {
            self.judge(r);
        }
    }

    /// Decides whether rank `r`'s exit fails the job.
    fn judge(&mut self, r: u32) {
        let rank = &mut self.ranks[r as usize];
        let was_judging = std::mem::take(&mut rank.judging);
        let (code, what) = match rank.exit {
            None => (0, String::new()),
            Some(Status::Code(0)) if rank.disconnected && !rank.finalized && rank.spoke() => {
                (1, "exited without calling PMI finalize".to_owned())
            }
            Some(Status::Code(0)) if !rank.finalized && self.joined.is_some() => {
                let what = if rank.spoke() {
                    "exited without calling PMI finalize".to_owned()
                } else {
                    format!(
                        "exited without calling PMI init, which rank {} did",
                        self.joined.unwrap_or_default()
                    )
                };
                (1, what)
            }
            Some(Status::Code(0)) => (0, String::new()),
            Some(Status::Code(code)) => {
                let code = u8::try_from(code).unwrap_or(1);
                (code, format!("exited with code {code}"))
            }
            Some(Status::Signal(signal)) => (
                exit_code_for_signal(signal),
                format!("killed by signal {signal} ({})", signal_name(signal)),
            ),
        };
        if was_judging {
            self.judging -= 1;
        }
        if code != 0 {
            self.fail_rank(r, code, &what);
        }
    }

    /// One output pipe of rank `r` reached its end: its verdict, if it
    /// waits for that, follows now.
    fn output_closed(&mut self, r: u32) {
        self.outputs_open = self.outputs_open.saturating_sub(1);
        let Some(rank) = self.ranks.get_mut(r as usize) else {
            return;
        };
        rank.outputs = rank.outputs.saturating_sub(1);
        if rank.outputs == 0 && self.verdict.as_ref().is_some_and(|v| v.rank == r) {
            self.say_verdict();
        }
    }

    /// udrun's output was closed by its reader: the job ends quietly (see
    /// [`Ending::OutputGone`]). The ranks' deaths that follow are its
    /// consequence, not failures to report.
    fn output_gone(&mut self) {
        if self.ending.is_none() {
            self.ending = Some(Ending::OutputGone);
            self.terminate();
        }
    }

    fn signal(&mut self, signal: i32) {
        if self.ending.is_none() {
            self.ending = Some(Ending::Interrupted(signal));
            self.terminate();
        } else if !self.killed {
            // Asked again (or while a failure ends the job): no more grace.
            self.kill_now();
        }
    }

    /// Handles the deadlines that have passed.
    fn tick(&mut self, now: Instant) {
        if self.kill_at.is_some_and(|at| at <= now) && !self.killed {
            self.kill_now();
        }
        if self.verdict.as_ref().is_some_and(|v| v.by <= now) {
            self.say_verdict();
        }
        if let Some((at, limit)) = self.deadline {
            if at <= now && self.ending.is_none() {
                self.fail(
                    TIMEOUT_EXIT,
                    &format!(
                        "the job ran longer than --timeout {} s",
                        limit.as_secs_f64()
                    ),
                );
            }
        }
        if let Some((at, limit)) = self.startup_check {
            if at <= now && self.joined.is_some() {
                self.startup_check = None;
                self.check_startup(limit);
            }
        }
        while let Some(&(at, r)) = self.waits.front() {
            if at > now {
                break;
            }
            self.waits.pop_front();
            let rank = &self.ranks[r as usize];
            if rank.judging {
                self.judge(r);
            } else if rank.exit.is_none() && rank.disconnected && !rank.finalized {
                self.fail_rank(r, 1, "closed its PMI connection without finalize");
            }
        }
    }

    /// Once `--startup-timeout` has passed in a job that uses PMI: fails
    /// the job, in one line, if a rank still running has not reached PMI.
    fn check_startup(&mut self, limit: Duration) {
        if self.ending.is_some() {
            return;
        }
        let mut missing = (0..)
            .zip(&self.ranks)
            .filter(|(_, rank)| rank.exit.is_none() && !rank.reached_pmi())
            .map(|(r, _)| r);
        let Some(first) = missing.next() else {
            return;
        };
        let others = match missing.count() {
            0 => String::new(),
            1 => " (nor did 1 other rank)".to_owned(),
            n => format!(" (nor did {n} other ranks)"),
        };
        self.fail_rank(
            first,
            1,
            &format!(
                "did not connect to PMI within --startup-timeout {} s{others}",
                limit.as_secs_f64()
            ),
        );
    }

    /// Fails the job because of rank `r` (unless it already ends).
    fn fail_rank(&mut self, r: u32, code: u8, what: &str) {
        let who = self.ranks[r as usize].who();
        let line = format!("rank {r} ({who}) {what}{}", self.killing());
        self.end(code, Some(r), line);
    }

    /// As [`fail_rank`](Self::fail_rank), but the line ends with `what`.
    fn fail_rank_quietly(&mut self, r: u32, code: u8, what: &str) {
        let who = self.ranks[r as usize].who();
        self.end(code, Some(r), format!("rank {r} ({who}) {what}"));
    }

    /// Fails the job with exit status `code` (unless it already ends):
    /// prints `message`, then kills the ranks still running.
    pub(crate) fn fail(&mut self, code: u8, message: &str) {
        let line = format!("{message}{}", self.killing());
        self.end(code, None, line);
    }

    /// How a failure's line ends while ranks still run.
    fn killing(&self) -> &'static str {
        if self.live > 0 {
            "; killing the job"
        } else {
            ""
        }
    }

    /// Ends the job with exit status `code` (unless it already ends): kills
    /// the ranks still running, and prints `line`, once the output of rank
    /// `after` (the one that failed) is all out, so that its own last words
    /// come before udrun's verdict on it.
    fn end(&mut self, code: u8, after: Option<u32>, line: String) {
        if self.ending.is_some() {
            return;
        }
        self.ending = Some(Ending::Failed(code));
        match after.filter(|&r| self.ranks[r as usize].outputs > 0) {
            Some(rank) => {
                let by = Instant::now() + VERDICT_WAIT;
                self.verdict = Some(Verdict { rank, line, by });
            }
            None => self.announce(&line),
        }
        self.terminate();
    }

    /// Prints the verdict that waits, if any.
    fn say_verdict(&mut self) {
        if let Some(verdict) = self.verdict.take() {
            self.announce(&verdict.line);
        }
    }

    /// Prints one of udrun's lines after the ranks' stderr that waits to be
    /// merged, or at once under `--tag-output`.
    fn announce(&self, line: &str) {
        match &self.errors {
            Some(errors) => errors.say(line),
            None => say(format_args!("{line}")),
        }
    }

    /// SIGTERM to every rank now, SIGKILL after [`KILL_GRACE`].
    fn terminate(&mut self) {
        self.kill_groups(Signal::TERM);
        self.kill_at = Some(Instant::now() + KILL_GRACE);
    }

    fn kill_now(&mut self) {
        self.kill_groups(Signal::KILL);
        self.killed = true;
    }

    /// Sends `signal` to every rank's process group (ranks that ended too:
    /// what they started may live on) and closes the remote ranks' stdin.
    fn kill_groups(&mut self, signal: Signal) {
        for rank in &mut self.ranks {
            rank.stdin = None;
            crate::kill_group(rank.pid, signal);
        }
    }

    /// Prints the last words and returns udrun's exit status; `stats` are
    /// the PMI server's, for the count of refused connections.
    pub(crate) fn finish(&self, stats: &ServerStats) -> u8 {
        if let Some(line) = pmi::refusals_summary(stats, self.refused) {
            say(format_args!("{line}"));
        }
        if self.startup.is_some() && !self.reported {
            say(format_args!("{} ranks, no barrier", self.size));
        }
        match self.ending {
            None => 0,
            Some(Ending::Failed(code)) => code,
            Some(Ending::Interrupted(signal)) => {
                say(format_args!(
                    "interrupted by {}; job killed",
                    signal_name(signal)
                ));
                exit_code_for_signal(signal)
            }
            Some(Ending::OutputGone) => exit_code_for_signal(SIGPIPE),
        }
    }
}
