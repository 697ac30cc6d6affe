//! The job: setting it up, watching its ranks, ending it.
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

use std::collections::{HashMap, HashSet, VecDeque};
use std::env;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, IsTerminal};
use std::os::fd::OwnedFd;
use std::process::ChildStdin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Signal, WaitOptions, getpid};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;
use udbtl_pmi::{JobSecret, Server, ServerEvent, ServerStats};

use crate::cli::{BindTo, Cli};
use crate::hosts::{self, Placement};
use crate::output::{self, Errors, Sink};
use crate::spawn::{self, Binder, JobSpec, PortMode};
use crate::{Error, remote, say};

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
/// udrun's exit status when `--timeout` ends the job (as timeout(1)).
pub(crate) const TIMEOUT_EXIT: u8 = 124;

/// Something the main loop must handle.
#[derive(Debug)]
pub(crate) enum Event {
    /// From the PMI server.
    Pmi(ServerEvent),
    /// A local rank sent its first bytes on its PMI connection.
    Spoke { rank: u32 },
    /// A rank's process ended (it has been reaped).
    Exited { rank: u32, status: Status },
    /// udrun received this signal.
    Signal(i32),
    /// One forwarded output pipe reached its end.
    OutputClosed,
    /// udrun has no child left at all.
    NoChildren,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Code(i32),
    Signal(i32),
}

/// Sets up the job, runs it to its end and returns udrun's exit status.
pub(crate) fn run(cli: &Cli) -> Result<u8, Error> {
    let hosts = match &cli.hostfile {
        Some(path) => hosts::read_hostfile(path)?,
        None => cli.host.clone(),
    };
    check_exports(cli)?;
    spawn::check_limits(cli.ranks).map_err(Error::Refused)?;
    let oversubscribe = cli.oversubscribe
        || env::var("UDRUN_OVERSUBSCRIBE").is_ok_and(|v| matches!(v.trim(), "1" | "yes" | "true"));
    let cpus = spawn::usable_cpus().map_err(|source| Error::Io {
        what: "reading the CPU affinity mask",
        source,
    })?;
    if !oversubscribe {
        check_slots(cli.ranks, &hosts, cpus)?;
    }
    let this_host = hostname();
    let placements = hosts::place(cli.ranks, &hosts, this_host.as_deref());
    let mut seen = HashSet::new();
    let remote_hosts: Vec<&str> = placements
        .iter()
        .filter_map(|p| p.host.as_deref())
        .filter(|h| seen.insert(*h))
        .collect();

    let (tx, rx) = mpsc::channel();
    let interrupted = Arc::new(AtomicI32::new(0));
    watch_signals(tx.clone(), Arc::clone(&interrupted))?;
    let interrupted_by = || interrupted.load(Ordering::Acquire);

    let pmi_host = if remote_hosts.is_empty() {
        None
    } else {
        let host = this_host.clone().ok_or(Error::NoHostname)?;
        let failed =
            remote::check_hosts(&cli.launcher_exec, &remote_hosts, || interrupted_by() != 0);
        if let Some(code) = interrupted_code(interrupted_by()) {
            return Ok(code);
        }
        if !failed.is_empty() {
            for f in failed {
                say(format_args!("cannot reach host {}: {}", f.host, f.reason));
            }
            return Ok(1);
        }
        Some(host)
    };

    let key = spawn::job_key().map_err(|source| Error::Io {
        what: "reading /dev/urandom",
        source,
    })?;
    let kvsname = format!("udrun-{}-{key:08x}", std::process::id());
    let (pmi_tx, pmi_rx) = mpsc::channel();
    let server = Server::new(cli.ranks, kvsname, pmi_tx)?;
    server.set_process_mapping(hosts::process_mapping(&placements));
    if cli.report_startup {
        server.report_barriers();
    }
    forward_pmi_events(pmi_rx, tx.clone())?;
    // The job's secret: remote ranks prove it to the PMI port, and every
    // rank keys authenticated datagrams from it.
    let secret = JobSecret::generate()?;
    let secret_hex = secret.to_hex();
    // Port mode: a listener on the address the remote ranks are told to use
    // (every address with --pmi-listen-any).
    let port_mode = match &pmi_host {
        Some(host) => {
            let listening = if cli.pmi_listen_any {
                server.listen_tcp_authenticated((std::net::Ipv4Addr::UNSPECIFIED, 0), secret)
            } else {
                server.listen_tcp_authenticated((host.as_str(), 0), secret)
            };
            let (port, _accepting) = listening.map_err(|e| {
                if cli.pmi_listen_any {
                    Error::Pmi(e)
                } else {
                    Error::Refused(format!(
                        "cannot serve PMI on {host}, this host's name, which remote ranks are \
                         told to connect to ({e}); --pmi-listen-any serves it on every address"
                    ))
                }
            })?;
            Some(format!("{host}:{port}"))
        }
        None => None,
    };
    let binder = match cli.bind_to {
        BindTo::Core => Some(Binder::new().map_err(|source| Error::Io {
            what: "reading the CPU affinity mask",
            source,
        })?),
        BindTo::None => None,
    };
    let local_size = placements
        .iter()
        .find(|p| p.host.is_none())
        .map_or(0, |p| p.local_size);
    if binder.is_some() && local_size as usize > cpus {
        say(format_args!(
            "--bind-to core: {local_size} local ranks on {cpus} CPUs, so they share CPUs \
             (local rank i on the CPU of local rank i mod {cpus})"
        ));
    }
    let errors = if cli.tag_output {
        None
    } else {
        Some(Errors::start().map_err(|source| Error::Io {
            what: "starting the stderr thread",
            source,
        })?)
    };
    let stdin_to_rank_0 = forward_stdin_wanted();
    // Best effort: without it, what a dying rank leaves behind goes to init.
    let _ = rustix::process::set_child_subreaper(Some(getpid()));
    let reaper = start_reaper(tx.clone())?;
    let dir = env::current_dir().ok();
    let spec = JobSpec {
        argv: &cli.command,
        size: cli.ranks,
        key,
        secret_hex: &secret_hex,
        exports: &cli.export,
    };

    let mut job = Job::new(cli, cli.report_startup.then(Instant::now));
    let mut pids = HashMap::with_capacity(placements.len());
    for (rank, place) in (0..).zip(&placements) {
        if interrupted_by() != 0 {
            break;
        }
        let spawned = match &place.host {
            None => spawn::local(
                &spec,
                rank,
                place,
                &server,
                binder.as_ref(),
                rank == 0 && stdin_to_rank_0,
                tx.clone(),
            )
            .map(|(child, spoke)| (child, Some(spoke))),
            Some(host) => spawn::remote(
                &spec,
                rank,
                place,
                host,
                &cli.launcher_exec,
                &PortMode {
                    addr: port_mode.as_deref().unwrap_or(""),
                },
                dir.as_deref(),
            )
            .map(|child| (child, None)),
        };
        let (mut child, spoke) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                job.fail(e.exit_code(), &e.to_string());
                break;
            }
        };
        let pid = child.id();
        pids.insert(pid, rank);
        if place.host.is_none() {
            if let Some(to) = child.stdin.take() {
                if let Err(e) = forward_stdin(to) {
                    job.fail(
                        1,
                        &format!(
                            "rank {rank}: cannot start the stdin thread: {}",
                            crate::os_message(&e)
                        ),
                    );
                }
            }
        }
        job.add(pid, place, spoke, child.stdin.take());
        let outputs = [
            child
                .stdout
                .take()
                .map(|out| (Sink::Stdout, OwnedFd::from(out))),
            child
                .stderr
                .take()
                .map(|err| (Sink::Stderr, OwnedFd::from(err))),
        ];
        for (sink, pipe) in outputs.into_iter().flatten() {
            let forwarded = output::forward(
                File::from(pipe),
                sink,
                rank,
                cli.tag_output,
                errors.clone(),
                tx.clone(),
            );
            match forwarded {
                Ok(()) => job.outputs_open += 1,
                Err(e) => job.fail(
                    1,
                    &format!(
                        "rank {rank}: cannot start its output thread: {}",
                        crate::os_message(&e)
                    ),
                ),
            }
        }
        if job.ending.is_some() {
            break;
        }
    }
    // The reaper ends only with udrun: the send cannot fail.
    let _ = reaper.send(pids);
    drop(tx);
    // Handle what already happened (a signal that stopped the spawning).
    while let Ok(event) = rx.try_recv() {
        job.handle(event);
    }
    job.watch(&rx);
    server.shutdown();
    if let Some(errors) = &errors {
        errors.flush();
    }
    Ok(job.finish(&server.stats()))
}

/// `-x VAR` (without a value) needs VAR set here, as in mpirun.
fn check_exports(cli: &Cli) -> Result<(), Error> {
    let unset: Vec<&str> = cli
        .export
        .iter()
        .filter(|e| e.value.is_none() && env::var_os(&e.name).is_none())
        .map(|e| e.name.as_str())
        .collect();
    match unset.as_slice() {
        [] => Ok(()),
        [name] => Err(Error::Usage(format!(
            "-x {name}: {name} is not set in udrun's environment (-x {name}=VALUE sets it)"
        ))),
        names => Err(Error::Usage(format!(
            "-x {}: not set in udrun's environment (-x VAR=VALUE sets one)",
            names.join(", -x ")
        ))),
    }
}

/// More ranks than slots needs `--oversubscribe`, as in mpirun: the slots
/// of the host list, or without one the CPUs udrun may use.
fn check_slots(ranks: u32, hosts: &[hosts::HostSpec], cpus: usize) -> Result<(), Error> {
    let (slots, what) = if hosts.is_empty() {
        (cpus as u64, format!("{cpus} CPUs here"))
    } else {
        let slots = hosts::total_slots(hosts);
        (slots, format!("{slots} slots in the host list"))
    };
    if u64::from(ranks) <= slots {
        return Ok(());
    }
    Err(Error::Refused(format!(
        "{ranks} ranks but {what}: add --oversubscribe to run more ranks than slots{}",
        if hosts.is_empty() {
            " (or give slots with --host localhost:N)"
        } else {
            ""
        }
    )))
}

/// Whether to forward udrun's stdin to rank 0: not when it is a terminal
/// that udrun does not own (udrun runs in the background), where reading
/// it would stop udrun.
fn forward_stdin_wanted() -> bool {
    let stdin = io::stdin();
    if !stdin.is_terminal() {
        return true;
    }
    rustix::termios::tcgetpgrp(&stdin).is_ok_and(|pgrp| pgrp == rustix::process::getpgrp())
}

/// Copies udrun's stdin to rank 0's until either ends; then rank 0 sees
/// the end of its input.
fn forward_stdin(mut to: ChildStdin) -> io::Result<()> {
    thread::Builder::new()
        .name("stdin".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            // EPIPE (rank 0 closed its stdin or ended) just stops it.
            let _ = io::copy(&mut io::stdin().lock(), &mut to);
        })
        .map(drop)
}

/// The exit status for an interruption by `signal` before any rank ran.
fn interrupted_code(signal: i32) -> Option<u8> {
    (signal != 0).then(|| {
        say(format_args!("interrupted by {}", signal_name(signal)));
        exit_code_for_signal(signal)
    })
}

/// This machine's name, as remote ranks are told to reach it.
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

/// Turns SIGINT, SIGTERM, SIGHUP and SIGQUIT into [`Event::Signal`]s (and
/// records the first in `interrupted`, which stops the spawning).
fn watch_signals(tx: Sender<Event>, interrupted: Arc<AtomicI32>) -> Result<(), Error> {
    let io = |what, source| Error::Io { what, source };
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT])
        .map_err(|e| io("installing the signal handlers", e))?;
    thread::Builder::new()
        .name("signals".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            for signal in signals.forever() {
                // Sent before it is recorded: whoever sees the record finds
                // the event queued.
                let _ = tx.send(Event::Signal(signal));
                let _ =
                    interrupted.compare_exchange(0, signal, Ordering::AcqRel, Ordering::Relaxed);
            }
        })
        .map_err(|e| io("starting the signal thread", e))?;
    Ok(())
}

/// Passes the server's events on to the main loop.
fn forward_pmi_events(events: Receiver<ServerEvent>, tx: Sender<Event>) -> Result<(), Error> {
    thread::Builder::new()
        .name("pmi-events".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            for event in events {
                if tx.send(Event::Pmi(event)).is_err() {
                    return;
                }
            }
        })
        .map(drop)
        .map_err(|source| Error::Io {
            what: "starting the PMI event thread",
            source,
        })
}

/// Starts the reaper thread, which waits for the map of rank process IDs
/// to ranks on the returned channel (sent once every rank is spawned), then
/// reaps every child as it ends, reports the ranks' exits and, once udrun
/// has no child left, [`Event::NoChildren`]. It is started before the
/// ranks so that a failure to start it leaves nothing running.
fn start_reaper(tx: Sender<Event>) -> Result<Sender<HashMap<u32, u32>>, Error> {
    let (go, pid_map) = mpsc::channel::<HashMap<u32, u32>>();
    thread::Builder::new()
        .name("reaper".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            let Ok(pids) = pid_map.recv() else {
                return;
            };
            loop {
                let (pid, status) = match rustix::process::wait(WaitOptions::empty()) {
                    Ok(Some(reaped)) => reaped,
                    Ok(None) | Err(Errno::INTR) => continue,
                    Err(_) => break,
                };
                let Some(&rank) = pids.get(&pid.as_raw_nonzero().get().unsigned_abs()) else {
                    continue; // A re-parented descendant: reaped, that's all.
                };
                let status = match (status.exit_status(), status.terminating_signal()) {
                    (Some(code), _) => Status::Code(code),
                    (None, Some(signal)) => Status::Signal(signal),
                    (None, None) => continue, // Stopped or continued: not an end.
                };
                if tx.send(Event::Exited { rank, status }).is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::NoChildren);
        })
        .map(|_| go)
        .map_err(|source| Error::Io {
            what: "starting the reaper thread",
            source,
        })
}

/// One rank as the main loop sees it.
#[derive(Debug)]
struct Rank {
    pid: u32,
    /// The remote host, `None` when local.
    host: Option<String>,
    /// Whether a local rank ever sent anything on PMI; `None` for a remote
    /// rank, whose PMI connection exists only if it used PMI.
    spoke: Option<Arc<AtomicBool>>,
    /// A remote rank's ssh stdin: closing it kills the remote side.
    stdin: Option<ChildStdin>,
    /// The launcher program of a remote rank (ssh, or `--launcher-exec`).
    launcher: Option<OsString>,
    exit: Option<Status>,
    /// A local rank's PMI connection has not ended yet (as far as the main
    /// loop knows).
    pmi_open: bool,
    /// A remote rank completed its PMI handshake.
    connected: bool,
    finalized: bool,
    disconnected: bool,
    /// Its exit waits for the end of its PMI connection before it is judged.
    judging: bool,
}

impl Rank {
    fn spoke(&self) -> bool {
        self.spoke
            .as_ref()
            .is_none_or(|spoke| spoke.load(Ordering::Relaxed))
    }

    /// Whether it reached PMI: a local rank sent something on its socket,
    /// a remote one completed the handshake.
    fn reached_pmi(&self) -> bool {
        match &self.spoke {
            Some(spoke) => spoke.load(Ordering::Relaxed),
            None => self.connected,
        }
    }

    /// "pid 123" or "host h, ssh pid 123" (the launcher's name).
    fn who(&self) -> String {
        match (&self.host, &self.launcher) {
            (Some(host), Some(launcher)) => {
                let name = std::path::Path::new(launcher)
                    .file_name()
                    .unwrap_or(launcher)
                    .to_string_lossy();
                format!("host {host}, {name} pid {}", self.pid)
            }
            _ => format!("pid {}", self.pid),
        }
    }
}

/// Why the job is ending.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// A rank failed (or could not start, or `--timeout` passed): exit
    /// with this status.
    Failed(u8),
    /// udrun received this signal.
    Interrupted(i32),
}

/// The main loop's state. See the [module docs](self).
#[derive(Debug)]
struct Job {
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
}

impl Job {
    fn new(cli: &Cli, startup: Option<Instant>) -> Self {
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
        }
    }

    fn add(
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
        });
        self.live += 1;
    }

    /// Runs until every rank has ended and its output is drained.
    fn watch(&mut self, rx: &Receiver<Event>) {
        while self.live > 0 || self.judging > 0 {
            if !self.step(rx, None) {
                break;
            }
        }
        if self.ranks.is_empty() {
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

    fn handle(&mut self, event: Event) {
        match event {
            Event::Exited { rank, status } => self.exited(rank, status),
            Event::Pmi(event) => self.pmi(event),
            Event::Spoke { rank } => self.joined_pmi(rank),
            Event::Signal(signal) => self.signal(signal),
            Event::OutputClosed => self.outputs_open = self.outputs_open.saturating_sub(1),
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

    fn pmi(&mut self, event: ServerEvent) {
        // A rank whose spawn failed was served too: its events do not count.
        let spawned = self.ranks.len();
        let rank_of = |rank: u32| ((rank as usize) < spawned).then_some(rank);
        match event {
            ServerEvent::Connected { rank } => {
                if let Some(r) = rank_of(rank) {
                    self.ranks[r as usize].connected = true;
                    self.joined_pmi(r);
                }
            }
            ServerEvent::Finalized { rank } => {
                if let Some(r) = rank_of(rank) {
                    self.joined_pmi(r);
                    self.ranks[r as usize].finalized = true;
                    self.pmi_closed(r);
                }
            }
            ServerEvent::Aborted {
                rank,
                code,
                message,
            } => {
                if let Some(r) = rank_of(rank) {
                    let what = if message.is_empty() {
                        format!("called abort with code {code}")
                    } else {
                        format!("called abort with code {code}: {message}")
                    };
                    // The message ends the line: no "; killing the job".
                    self.fail_rank_quietly(r, abort_exit_code(code), &what);
                    self.pmi_closed(r);
                }
            }
            ServerEvent::Disconnected { rank, .. } => {
                if let Some(r) = rank_of(rank) {
                    if self.ranks[r as usize].spoke() {
                        self.joined_pmi(r);
                    }
                    self.ranks[r as usize].disconnected = true;
                    self.pmi_closed(r);
                    let rank = &self.ranks[r as usize];
                    if rank.exit.is_none() && rank.spoke() {
                        self.waits.push_back((Instant::now() + PMI_WAIT, r));
                    }
                }
            }
            ServerEvent::ProtocolError {
                rank: Some(rank),
                detail,
            } => {
                if let Some(r) = rank_of(rank) {
                    let prefix = format!("rank {r}: ");
                    let detail = detail.strip_prefix(&prefix).unwrap_or(&detail);
                    self.fail_rank(r, 1, &format!("broke the PMI protocol ({detail})"));
                    self.pmi_closed(r);
                }
            }
            ServerEvent::ProtocolError { rank: None, detail } => {
                // Anyone who can reach the port can cause these: name a
                // few, count the rest (see finish).
                self.refused += 1;
                if self.refused <= REFUSALS_SHOWN {
                    say(format_args!("ignored a PMI_PORT connection: {detail}"));
                }
            }
            ServerEvent::BarrierReleased { epoch: 1 } => {
                if let Some(start) = self.startup {
                    self.reported = true;
                    say(format_args!(
                        "{} ranks, first barrier after {:.1} ms",
                        self.size,
                        start.elapsed().as_secs_f64() * 1e3
                    ));
                }
            }
            _ => {}
        }
    }

    /// Rank `r` is known to use PMI. The first time a rank is, the ranks
    /// that already ended with status 0 without finalize are judged again
    /// (at once, or once their PMI connection has ended).
    fn joined_pmi(&mut self, r: u32) {
        if self.joined.is_some() {
            return;
        }
        self.joined = Some(r);
        let now = Instant::now();
        let mut again = Vec::new();
        for (i, rank) in (0..).zip(&mut self.ranks) {
            if rank.exit == Some(Status::Code(0)) && !rank.finalized && !rank.judging {
                rank.judging = true;
                self.judging += 1;
                if rank.pmi_open || rank.spoke.is_none() {
                    self.waits.push_back((now + PMI_WAIT, i));
                } else {
                    again.push(i);
                }
            }
        }
        for i in again {
            self.judge(i);
        }
    }

    /// Rank `r`'s PMI connection has ended: judge its exit if it waits.
    fn pmi_closed(&mut self, r: u32) {
        let rank = &mut self.ranks[r as usize];
        rank.pmi_open = false;
        if rank.judging {
            self.judge(r);
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
        self.fail(code, &format!("rank {r} ({who}) {what}"));
    }

    /// As [`fail_rank`](Self::fail_rank), but the line ends with `what`.
    fn fail_rank_quietly(&mut self, r: u32, code: u8, what: &str) {
        if self.ending.is_none() {
            let who = self.ranks[r as usize].who();
            say(format_args!("rank {r} ({who}) {what}"));
            self.ending = Some(Ending::Failed(code));
            self.terminate();
        }
    }

    /// Fails the job with exit status `code` (unless it already ends):
    /// prints `message`, then kills the ranks still running.
    fn fail(&mut self, code: u8, message: &str) {
        if self.ending.is_some() {
            return;
        }
        let killing = if self.live > 0 {
            "; killing the job"
        } else {
            ""
        };
        say(format_args!("{message}{killing}"));
        self.ending = Some(Ending::Failed(code));
        self.terminate();
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
    fn finish(&self, stats: &ServerStats) -> u8 {
        if let Some(line) = refusals_summary(stats, self.refused) {
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
        }
    }
}

/// The summary of refused PMI_PORT connections, if there were any: the
/// server's counts, and how many of them `shown` named one by one.
fn refusals_summary(stats: &ServerStats, seen: u64) -> Option<String> {
    let parts = [
        (stats.handshake_failures, "failed the handshake"),
        (stats.claims_refused, "claimed a rank already connected"),
        (
            stats.connections_refused_over_cap,
            "came over the cap of handshakes at once",
        ),
    ];
    let total: u64 = parts.iter().map(|p| p.0).sum();
    if total == 0 {
        return None;
    }
    let detail: Vec<String> = parts
        .iter()
        .filter(|p| p.0 > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
    let shown = seen.min(REFUSALS_SHOWN);
    let not_shown = if total > shown {
        format!("; {} not shown above", total - shown)
    } else {
        String::new()
    };
    Some(format!(
        "refused {total} PMI_PORT connection{}: {}{not_shown}",
        if total == 1 { "" } else { "s" },
        detail.join(", ")
    ))
}

/// 128 + `signal`, as a shell reports a death by signal.
fn exit_code_for_signal(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(1, 127)).unwrap_or(u8::MAX)
}

/// The exit status for `PMI_Abort(code)`: the code modulo 256, but never 0
/// for a job that was killed.
fn abort_exit_code(code: i32) -> u8 {
    match u8::try_from(code.rem_euclid(256)) {
        Ok(0) | Err(_) => 1,
        Ok(code) => code,
    }
}

/// `SIGSEGV` for 11, and so on (Linux numbering).
fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2",
        "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG",
        "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS",
    ];
    match usize::try_from(signal - 1).ok().and_then(|i| NAMES.get(i)) {
        Some(name) => format!("SIG{name}"),
        None => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code_for_signal(2), 130);
        assert_eq!(exit_code_for_signal(11), 139);
        assert_eq!(abort_exit_code(7), 7);
        assert_eq!(abort_exit_code(0), 1);
        assert_eq!(abort_exit_code(256), 1);
        assert_eq!(abort_exit_code(-1), 255);
        assert_eq!(signal_name(11), "SIGSEGV");
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(40), "signal 40");
    }
}
